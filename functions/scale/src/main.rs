//! `scale`: read or change the desired count of an oxide-controller pool.
//!
//! - `scale serve --listen ADDR` hosts the webhook (see `oxide_controller::webhook`) with
//!   hyper, in the cluster or anywhere with a kubeconfig; it prints one JSON line
//!   `{"listen":"ADDR","tls":BOOL}` on stdout once it accepts connections, and on SIGTERM or
//!   SIGINT stops accepting and finishes in-flight requests.
//! - `scale get | set N | add ±N [--pool P]` do the same as the webhook's routes, directly
//!   against the Kubernetes API (no HTTP), e.g. from a laptop with `--kubeconfig`.
//!
//! Exit codes: 0 success, 1 retryable failure (API unavailable, write conflicts), 2 something
//! to fix first (bounds, unknown pool, no cluster state, unusable kubeconfig or TLS files),
//! 143 (SIGTERM) or 130 (SIGINT) when a one-shot command was stopped before it finished: it
//! waits up to 5 s for the request under way (a command done by then exits as usual), at once
//! on a second signal; `serve` exits 0 after finishing in-flight requests.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use oxide_controller::adapters::kube_cluster::KubeCluster;
use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::base::shutdown::Shutdown;
use oxide_controller::base::telemetry::{self, LogFormat};
use oxide_controller::ports::cluster::{JOBS_NAMESPACE, NAMESPACE};
use oxide_controller::webhook::TokenSource;
use oxide_controller::webhook::host::{self, HostOptions};
use oxide_controller::webhook::pending::{self, PendingOptions};
use oxide_controller::webhook::{Deps, READY_TTL, WebhookConfig};
use oxide_controller::workflows::error::chain;
use oxide_controller::workflows::scale::{self, CountChange, ReconcileOutcome, ScaleOptions};

/// Read or change the desired worker count of an oxide-controller cluster.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    kube: KubeArgs,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Auto, env = "OXIDE_CONTROLLER_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// Where the cluster's state lives.
#[derive(Debug, clap::Args)]
struct KubeArgs {
    /// Kubeconfig to use instead of the in-cluster service account.
    #[arg(long, global = true, env = "OXIDE_CONTROLLER_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace of the oxide-controller Secret, ConfigMap and Lease.
    #[arg(long, global = true, default_value = NAMESPACE, env = "OXIDE_CONTROLLER_NAMESPACE")]
    namespace: String,
    /// Namespace of the reconcile CronJob and the Jobs a change starts.
    #[arg(long, global = true, default_value = JOBS_NAMESPACE, env = "OXIDE_CONTROLLER_JOBS_NAMESPACE")]
    jobs_namespace: String,
}

impl KubeArgs {
    /// The cluster adapter for these namespaces.
    fn cluster(&self, client: kube::Client) -> KubeCluster {
        KubeCluster::new(client, &self.namespace).with_jobs_namespace(&self.jobs_namespace)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the scale webhook until SIGTERM or SIGINT.
    Serve(ServeArgs),
    /// Print a pool's desired count.
    Get {
        #[command(flatten)]
        pool: PoolArg,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Set a pool's desired count and start a reconcile.
    Set {
        /// The new count.
        count: i64,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Show a worker pool's autoscaling bounds, or change them (then start a reconcile).
    /// While autoscaling is enabled, `set` and `add` on the pool are refused.
    Autoscale {
        #[command(flatten)]
        pool: PoolArg,
        /// New lower bound.
        #[arg(long)]
        min: Option<u32>,
        /// New upper bound.
        #[arg(long)]
        max: Option<u32>,
        /// Turn autoscaling on (`true`) or off (`false`: the count is set by hand again).
        #[arg(long)]
        enabled: Option<bool>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Show the cluster at a glance: pools and their Nodes, conditions, the last run, the
    /// autoscaler's decisions and the recent Events. Exits 1 while the cluster is Degraded.
    Status {
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = StatusOutput::Table)]
        output: StatusOutput,
    },
    /// Upgrade Kubernetes: check VERSION against what the servers and workers run (no skipped
    /// minor, no downgrade, workers within three minors below), print the order of the roll
    /// (servers first, then worker pools one after the other), write `k3s.version` and start a
    /// reconcile. A refused version exits 2 and writes nothing.
    Upgrade {
        /// The k3s release to run, e.g. v1.34.1+k3s1.
        #[arg(long)]
        to: String,
        /// Check and print the phases only; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Add to a pool's desired count (negative removes) and start a reconcile.
    Add {
        /// How many to add, e.g. 2 or -1.
        #[arg(allow_negative_numbers = true)]
        delta: i64,
        #[command(flatten)]
        pool: PoolArg,
    },
}

#[derive(Debug, clap::Args)]
struct PoolArg {
    /// Pool to act on (default: the first worker pool).
    #[arg(long, env = "OXIDE_CONTROLLER_POOL")]
    pool: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StatusOutput {
    Table,
    Json,
    Yaml,
}

/// Plain HTTP asked for beyond loopback without saying so.
#[derive(Debug)]
struct PlainHttpRefused(SocketAddr);

impl std::fmt::Display for PlainHttpRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refusing to serve plain HTTP on {}: bearer tokens would cross the network in clear; give --tls-from-secret (the pair bootstrap made) or --tls-cert/--tls-key, listen on 127.0.0.1, or pass --insecure-plain-http behind a TLS-terminating proxy",
            self.0
        )
    }
}

impl std::error::Error for PlainHttpRefused {}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on. Beyond loopback the webhook serves HTTPS only (the bearer token
    /// must not cross a network in clear) unless --insecure-plain-http.
    #[arg(long, env = "OXIDE_CONTROLLER_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Serve plain HTTP on a non-loopback address (behind a TLS-terminating proxy, say).
    #[arg(long, env = "OXIDE_CONTROLLER_INSECURE_PLAIN_HTTP")]
    insecure_plain_http: bool,
    /// PEM certificate chain for HTTPS (with --tls-key); re-read every 10 s, so a renewed
    /// pair (a mounted Secret the kubelet updates) is served without a restart.
    #[arg(
        long,
        env = "OXIDE_CONTROLLER_TLS_CERT",
        requires = "tls_key",
        conflicts_with = "tls_from_secret"
    )]
    tls_cert: Option<PathBuf>,
    /// PEM private key for HTTPS (with --tls-cert).
    #[arg(long, env = "OXIDE_CONTROLLER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve HTTPS with Secret oxide-controller-webhook-tls's pair, read once through the API
    /// (needs `get` on the Secret: for a person's kubeconfig, not the webhook's account).
    #[arg(long, env = "OXIDE_CONTROLLER_TLS_FROM_SECRET")]
    tls_from_secret: bool,
    /// Read the tokens from this directory of Secret oxide-controller-webhook-auth's keys
    /// (`webhook-token`, `webhook-read-token`), as the pod mounts them, instead of through the
    /// API: the webhook's account may not read the Secret. Re-read after --token-cache-seconds, so a
    /// rotated token needs no restart.
    #[arg(long, env = "OXIDE_CONTROLLER_SECRETS_DIR")]
    secrets_dir: Option<PathBuf>,
    /// Deadline for reading and answering one request, in seconds.
    #[arg(long, env = "OXIDE_CONTROLLER_REQUEST_TIMEOUT", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=300))]
    request_timeout: u64,
    /// How long the webhook tokens read are trusted, in seconds (0: read on every request).
    #[arg(long, env = "OXIDE_CONTROLLER_TOKEN_CACHE_SECONDS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    token_cache_seconds: u64,
    /// How long one read of the ConfigMap serves `/metrics` scrapes, in seconds (0: read on
    /// every scrape).
    #[arg(long, env = "OXIDE_CONTROLLER_STATUS_CACHE_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    status_cache_seconds: u64,
    /// On shutdown, how long in-flight requests get to finish, in seconds.
    #[arg(long, default_value_t = 15)]
    shutdown_grace_seconds: u64,
    /// How often the spec is read to see whether a pool autoscales (and so whether to watch
    /// for unschedulable pods), in seconds.
    #[arg(long, env = "OXIDE_CONTROLLER_PENDING_RECHECK_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pending_recheck_seconds: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    telemetry::init(args.log_format);
    if matches!(args.command, Command::Serve(_)) {
        return telemetry::block_on(run(args));
    }
    telemetry::block_on(async move {
        // One-shot commands: a signal lets the request under way answer (bounded), then stops.
        let shutdown = Shutdown::on_signals();
        tokio::select! {
            code = run(args) => code,
            signal = shutdown.abandon_after(STOP_WAIT) => {
                eprintln!(
                    "scale stopped by {signal} before it finished: a change under way may or may not be saved; check with `scale get`"
                );
                ExitCode::from(signal.exit_code())
            }
        }
    })
}

/// How long a one-shot command, once asked to stop, waits for its request under way (a read,
/// the ConfigMap write, the Job create) before it gives up on it; a second signal gives up at
/// once. A command that finishes meanwhile exits as it would have.
const STOP_WAIT: Duration = Duration::from_secs(5);

async fn run(args: Args) -> ExitCode {
    let built = match oxide_controller::adapters::kubeclient::config(
        args.kube.kubeconfig.as_deref(),
        args.kube.context.as_deref(),
    )
    .await
    {
        Ok(config) => oxide_controller::adapters::kubeclient::client_from_config(config.clone())
            .map(|c| (c, config)),
        Err(e) => Err(e),
    };
    let (client, config) = match built {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{}", chain(&e));
            return ExitCode::from(2);
        }
    };
    let ns = &args.kube.namespace;
    let state = KubeStateStore::new(client.clone(), ns);
    match args.command {
        Command::Serve(serve) => serve_webhook(serve, client, state, &args.kube).await,
        Command::Get { pool, output } => {
            match scale::observe_count(&state, pool.pool.as_deref(), &scale::SpecCache::default())
                .await
            {
                Ok(c) => {
                    match output {
                        Output::Text => println!("{}", c.count),
                        Output::Json => {
                            println!("{}", serde_json::to_string(&c).unwrap_or_default())
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e, e.exit_code()),
            }
        }
        Command::Set { count, pool } => {
            change(
                &state,
                client,
                &args.kube,
                pool.pool.as_deref(),
                CountChange::Set(count),
            )
            .await
        }
        Command::Autoscale {
            pool,
            min,
            max,
            enabled,
            output,
        } => {
            let change = scale::AutoscaleChange { min, max, enabled };
            autoscale(
                &state,
                client,
                &args.kube,
                pool.pool.as_deref(),
                change,
                output,
            )
            .await
        }
        Command::Status { output } => status(&state, client, ns, output, &args.kube).await,
        Command::Upgrade { to, dry_run } => {
            upgrade(&state, client, config, &args.kube, &to, dry_run).await
        }
        Command::Add { delta, pool } => {
            change(
                &state,
                client,
                &args.kube,
                pool.pool.as_deref(),
                CountChange::Add(delta),
            )
            .await
        }
    }
}

fn fail(e: &(dyn std::error::Error + 'static), code: u8) -> ExitCode {
    tracing::error!("{}", chain(e));
    ExitCode::from(code)
}

async fn change(
    state: &KubeStateStore,
    client: kube::Client,
    kube: &KubeArgs,
    pool: Option<&str>,
    change: CountChange,
) -> ExitCode {
    let cluster = kube.cluster(client);
    match scale::run(state, &cluster, pool, change, &ScaleOptions::default()).await {
        Ok(out) => {
            let c = &out.change;
            if c.written {
                println!(
                    "{}: {} → {}; {}",
                    c.pool,
                    c.previous,
                    c.count,
                    out.reconcile.public_message()
                );
            } else {
                println!("{}: already {}", c.pool, c.count);
            }
            if matches!(
                out.reconcile,
                ReconcileOutcome::Failed { .. } | ReconcileOutcome::NoCronJob
            ) {
                tracing::warn!(
                    reconcile = out.reconcile.as_str(),
                    "the change is saved but no reconcile Job was started"
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, e.exit_code()),
    }
}

/// `scale upgrade`: the gate, the phases, then (unless `--dry-run`) the spec write.
async fn upgrade(
    state: &KubeStateStore,
    client: kube::Client,
    config: kube::Config,
    kube: &KubeArgs,
    to: &str,
    dry_run: bool,
) -> ExitCode {
    // The pre-flight reads etcd's member list (k3s's supervisor) and each server's /metrics.
    let cluster = kube
        .cluster(client)
        .with_supervisor(&config)
        .with_server_config(config);
    let now = chrono::Utc::now();
    // The pre-flight reads each server's address from the rack, as the Secret's project.
    let make_rack = |s: &oxide_controller::base::secrets::ClusterSecrets| {
        oxide_controller::adapters::oxide_rack::OxideRack::connect(
            &s.oxide_host,
            &s.oxide_token,
            &s.oxide_project,
            oxide_controller::adapters::oxide_rack::RackOptions::default(),
        )
    };
    match oxide_controller::workflows::upgrade::run(state, &cluster, make_rack, to, dry_run, now)
        .await
    {
        Ok(out) => {
            print!("{}", out.phases);
            if dry_run {
                println!("dry run: k3s.version {to} passes the version checks; nothing written");
            } else if out.written {
                println!(
                    "k3s.version set to {to}; {}",
                    out.reconcile.public_message()
                );
            } else {
                println!("k3s.version already is {to}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, e.exit_code()),
    }
}

/// `scale status`: reads only (the ConfigMap, Nodes and Events).
async fn status(
    state: &KubeStateStore,
    client: kube::Client,
    ns: &str,
    output: StatusOutput,
    kube_args: &KubeArgs,
) -> ExitCode {
    let cluster = kube_args.cluster(client);
    let view = match oxide_controller::workflows::status::observe(state, &cluster, ns).await {
        Ok(v) => v,
        Err(e) => {
            let code = fail(&e, e.exit_code());
            let hint = oxide_controller::adapters::kubeclient::recover_hint(
                kube_args.kubeconfig.as_deref(),
                kube_args.context.as_deref(),
            );
            if let Some(line) = hint.await {
                tracing::error!("{line}");
            }
            return code;
        }
    };
    match output {
        StatusOutput::Table => print!(
            "{}",
            oxide_controller::domain::status_view::render_table(&view, chrono::Utc::now())
        ),
        StatusOutput::Json => println!(
            "{}",
            serde_json::to_string_pretty(&view).unwrap_or_default()
        ),
        StatusOutput::Yaml => print!("{}", serde_saphyr::to_string(&view).unwrap_or_default()),
    }
    if view.degraded() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn autoscale(
    state: &KubeStateStore,
    client: kube::Client,
    kube: &KubeArgs,
    pool: Option<&str>,
    change: scale::AutoscaleChange,
    output: Output,
) -> ExitCode {
    let result = if change == scale::AutoscaleChange::default() {
        scale::observe_autoscale(state, pool, &scale::SpecCache::default())
            .await
            .map(|b| (b, None))
    } else {
        let cluster = kube.cluster(client);
        scale::run_autoscale(state, &cluster, pool, change, &ScaleOptions::default())
            .await
            .map(|(out, reconcile)| (out.now, Some(reconcile)))
    };
    match result {
        Ok((b, reconcile)) => {
            match output {
                Output::Json => println!("{}", serde_json::to_string(&b).unwrap_or_default()),
                Output::Text => println!(
                    "{}: autoscaling {}, bounds [{}, {}], count {}{}",
                    b.pool,
                    if b.enabled { "on" } else { "off" },
                    b.min,
                    b.max,
                    b.count,
                    reconcile
                        .map(|r| format!("; {}", r.public_message()))
                        .unwrap_or_default()
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, e.exit_code()),
    }
}

async fn serve_webhook(
    args: ServeArgs,
    client: kube::Client,
    state: KubeStateStore,
    kube: &KubeArgs,
) -> ExitCode {
    let ns = &kube.namespace;
    let tls = match (&args.tls_cert, &args.tls_key, args.tls_from_secret) {
        (Some(cert), Some(key), _) => host::tls_from_files(cert, key, host::RELOAD_EVERY).map(Some),
        (_, _, true) => host::tls_from_secret(client.clone(), ns).await.map(Some),
        _ => Ok(None),
    };
    let tls = match tls {
        Ok(t) => t,
        Err(e) => return fail(&e, 2),
    };
    if tls.is_none() && !args.listen.ip().is_loopback() && !args.insecure_plain_http {
        return fail(&PlainHttpRefused(args.listen), 2);
    }
    let listener = match host::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => return fail(&e, 2),
    };
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| args.listen.to_string());
    let deps = Arc::new(Deps::new(
        state,
        kube.cluster(client.clone()),
        WebhookConfig {
            token_ttl: Duration::from_secs(args.token_cache_seconds),
            tokens: args
                .secrets_dir
                .clone()
                .map_or(TokenSource::Secret, TokenSource::Files),
            scale: ScaleOptions::default(),
            status_ttl: Duration::from_secs(args.status_cache_seconds),
            ready_ttl: READY_TTL,
        },
    ));
    let opts = HostOptions {
        request_timeout: Duration::from_secs(args.request_timeout),
        shutdown_grace: Duration::from_secs(args.shutdown_grace_seconds),
        tls,
        ..HostOptions::default()
    };
    tracing::info!(listen = %local, tls = opts.tls.is_some(), namespace = %ns, "scale webhook listening");
    println!(
        "{}",
        serde_json::json!({"listen": local, "tls": opts.tls.is_some()})
    );
    // Pending pods start a reconcile within seconds (only while some pool autoscales).
    let pending = tokio::spawn(pending::run(
        client,
        deps.clone(),
        PendingOptions {
            recheck: Duration::from_secs(args.pending_recheck_seconds),
            ..PendingOptions::default()
        },
        std::future::pending::<()>(),
    ));
    host::serve(listener, deps, opts, shutdown_signal()).await;
    pending.abort();
    tracing::info!("scale webhook stopped");
    ExitCode::SUCCESS
}

/// Completes on SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the server");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn add_takes_negative_and_signed_deltas_after_the_subcommand_and_global_flags_anywhere() {
        let a = Args::try_parse_from(["scale", "add", "-2", "--pool", "gpu", "--kubeconfig", "/k"])
            .unwrap();
        assert!(
            matches!(a.command, Command::Add { delta: -2, ref pool } if pool.pool.as_deref() == Some("gpu"))
        );
        assert_eq!(
            a.kube.kubeconfig.as_deref(),
            Some(std::path::Path::new("/k"))
        );
        let a = Args::try_parse_from(["scale", "--namespace", "ops", "add", "+3"]).unwrap();
        assert!(matches!(a.command, Command::Add { delta: 3, .. }));
        assert_eq!(a.kube.namespace, "ops");
        let a = Args::try_parse_from([
            "scale",
            "autoscale",
            "--pool",
            "gpu",
            "--min",
            "2",
            "--max",
            "5",
            "--enabled",
            "false",
        ])
        .unwrap();
        assert!(matches!(
            a.command,
            Command::Autoscale {
                min: Some(2),
                max: Some(5),
                enabled: Some(false),
                ..
            }
        ));
        assert!(Args::try_parse_from(["scale", "autoscale", "--min", "-1"]).is_err());
    }

    #[test]
    fn tls_files_come_in_pairs_and_exclude_the_secret() {
        assert!(Args::try_parse_from(["scale", "serve", "--tls-cert", "c.pem"]).is_err());
        assert!(
            Args::try_parse_from([
                "scale",
                "serve",
                "--tls-cert",
                "c",
                "--tls-key",
                "k",
                "--tls-from-secret"
            ])
            .is_err()
        );
        let a = Args::try_parse_from([
            "scale",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
        ])
        .unwrap();
        assert!(matches!(
            a.command,
            Command::Serve(ServeArgs {
                tls_cert: Some(_),
                tls_key: Some(_),
                ..
            })
        ));
    }
}
