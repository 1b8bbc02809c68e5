//! `oxide-sim`: runs the rack + cluster simulator until SIGTERM/SIGINT.
//!
//! Prints exactly one JSON line on stdout once ready —
//! `{"oxide_host":…,"oxide_token":…,"admin_url":…,"project":…,"kubeconfig":…,"release_url":…,
//! "tailscale_api_url":…}`, plus `tailscale_api_key` and `tailscale_tailnet` once an auth key
//! is given — and nothing else on stdout; logs go to stderr (`RUST_LOG`, default `info`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use oxide_sim::harness::preset::Preset;
use oxide_sim::oxide::{FaultSpec, RouteFault, Timings};
use oxide_sim::{Sim, SimOptions};

/// Oxide rack + k3s cluster simulator.
#[derive(Debug, Parser)]
#[command(name = "oxide-sim", version, about)]
struct Args {
    /// Address of the Oxide API (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Start with a running cluster: `cluster:<control-plane count>:<worker count>`.
    #[arg(long)]
    preset: Option<Preset>,
    /// Port the simulated control-plane VMs answer SSH on (22 needs root).
    #[arg(long, default_value_t = 22)]
    ssh_port: u16,
    /// Bearer token the API accepts (random when absent).
    #[arg(long, env = "OXIDE_SIM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Directory for files the simulator writes (kubeconfig); kept on exit. Default: a
    /// temporary directory removed on exit.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Run the cluster's CronJobs and Jobs as local processes of the binaries in this
    /// directory (e.g. target/debug), authenticated as the pods' ServiceAccounts.
    #[arg(long, value_name = "BIN_DIR")]
    run_jobs: Option<PathBuf>,
    /// Run the cluster's CronJobs and Jobs inside this OCI runtime bundle of the product's
    /// image (`umoci unpack` of it: config.json and rootfs/) under `runc`, with the pods'
    /// commands, environment, user and ServiceAccount; host network. Needs root and runc.
    #[arg(long, value_name = "BUNDLE_DIR")]
    run_jobs_in_bundle: Option<PathBuf>,
    /// kube-controller-manager's --node-monitor-grace-period of the clusters' real control
    /// planes (kube-apiserver, controller-manager, scheduler, etcd built from tests/kube; KWOK
    /// for kubelets; needs Go the first time).
    #[arg(long, value_name = "SECONDS", default_value_t = 50)]
    node_monitor_grace_seconds: u64,
    /// Newest Oxide API version served, to act as an older rack (e.g. 2026061000.0.0 for
    /// rack release 21); newer requested versions get nexus's 400.
    #[arg(long, value_name = "VERSION", default_value = oxide_sim::oxide::SERVER_API_VERSION, value_parser = api_version)]
    api_version: String,

    /// Instance create → starting (ms).
    #[arg(long)]
    create_to_starting_ms: Option<u64>,
    /// Instance starting → running (ms).
    #[arg(long)]
    starting_ms: Option<u64>,
    /// Instance stopping → stopped (ms).
    #[arg(long)]
    stopping_ms: Option<u64>,
    /// Instance rebooting → running (ms).
    #[arg(long)]
    rebooting_ms: Option<u64>,
    /// How long k3s's leaf certificates are valid, in seconds (365 days when absent): a
    /// shorter lifetime scales k3s's renewal window and certificate monitor with it.
    #[arg(long)]
    cert_lifetime_secs: Option<u64>,
    /// Running → k3s starting (ms).
    #[arg(long)]
    k3s_boot_ms: Option<u64>,
    /// k3s starting → Ready Node (ms).
    #[arg(long)]
    k3s_join_ms: Option<u64>,
    /// Retry interval of k3s joins against an unreachable server (ms).
    #[arg(long)]
    join_retry_ms: Option<u64>,
    /// k3s version reported when the install step pins none.
    #[arg(long)]
    k3s_version: Option<String>,

    /// Latency per route, `ROUTE=MS` (ROUTE like "POST /v1/instances" or "*"); repeatable.
    #[arg(long = "latency-ms", value_name = "ROUTE=MS")]
    latency_ms: Vec<String>,
    /// Error rate per route, `ROUTE=FRACTION[:STATUS]` (status default 503); repeatable.
    #[arg(long = "error-rate", value_name = "ROUTE=FRACTION[:STATUS]")]
    error_rate: Vec<String>,
    /// Instances whose name starts with PREFIX go `failed` shortly after starting.
    #[arg(long, value_name = "PREFIX")]
    fail_at_boot: Vec<String>,
    /// Instances whose name starts with PREFIX never join the cluster.
    #[arg(long, value_name = "PREFIX")]
    never_join: Vec<String>,
    /// Instances whose name starts with PREFIX hang in `stopping`.
    #[arg(long, value_name = "PREFIX")]
    hang_stopping: Vec<String>,
    /// Exit (status 137) after N Oxide API requests.
    #[arg(long, value_name = "N")]
    crash_after_requests: Option<u64>,
    /// Instances whose name starts with PREFIX have no data disk when the node setup script
    /// looks for it: the script prints its failure marker and k3s never starts.
    #[arg(long, value_name = "PREFIX")]
    missing_data_disk: Vec<String>,
    /// Instances whose name starts with PREFIX fail every installer download.
    #[arg(long, value_name = "PREFIX")]
    download_fails: Vec<String>,
    /// Instances whose name starts with PREFIX print another key's fingerprints on the console.
    #[arg(long, value_name = "PREFIX")]
    wrong_console_host_key: Vec<String>,
    /// A full rack for instances whose name starts with PREFIX ("" for all): create answers
    /// 201 `stopped`, start answers 507 "Insufficient capacity: ...".
    #[arg(long, value_name = "PREFIX")]
    no_capacity: Vec<String>,
    /// An exhausted silo vCPU quota for instances whose name starts with PREFIX: create
    /// answers 201 `stopped`, start answers 507 "...vCPU Limit Exceeded...".
    #[arg(long, value_name = "PREFIX")]
    quota_exceeded: Vec<String>,
    /// An auth key VMs may join the simulated tailnet with (repeatable). The fake Tailscale
    /// API's key and tailnet are printed in the ready line once one is given (its URL always).
    #[arg(
        long,
        value_name = "KEY",
        hide_env_values = true,
        env = "OXIDE_SIM_TAILSCALE_AUTH_KEY"
    )]
    tailscale_auth_key: Vec<String>,
    /// API access token of the fake Tailscale API. Default: random.
    #[arg(long, value_name = "KEY")]
    tailscale_api_key: Option<String>,
    /// Name of the simulated tailnet.
    #[arg(long, value_name = "TAILNET", default_value = oxide_sim::tailscale::DEFAULT_TAILNET)]
    tailscale_tailnet: String,
    /// Device approval is on in the tailnet and the auth keys are not pre-approved: VMs
    /// wait in `tailscale up` for an admin (until its `--timeout`).
    #[arg(long)]
    tailscale_approval_required: bool,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn split_route(spec: &str) -> anyhow::Result<(String, &str)> {
    let (route, value) = spec
        .rsplit_once('=')
        .with_context(|| format!("'{spec}' is not ROUTE=VALUE"))?;
    let route = route.trim();
    if route != "*" && !route.contains(" /v1/") {
        bail!("route '{route}' must be \"*\" or \"METHOD /v1/...\"");
    }
    Ok((route.to_string(), value.trim()))
}

fn faults(args: &Args) -> anyhow::Result<FaultSpec> {
    let mut spec = FaultSpec::default();
    for item in &args.latency_ms {
        let (route, value) = split_route(item)?;
        let latency: u64 = value
            .parse()
            .with_context(|| format!("latency in '{item}'"))?;
        spec.routes
            .entry(route)
            .or_insert_with(default_route_fault)
            .latency_ms = latency;
    }
    for item in &args.error_rate {
        let (route, value) = split_route(item)?;
        let (rate, status) = match value.split_once(':') {
            Some((rate, status)) => (
                rate,
                status
                    .parse::<u16>()
                    .with_context(|| format!("status in '{item}'"))?,
            ),
            None => (value, 503),
        };
        let rate: f64 = rate
            .parse()
            .with_context(|| format!("fraction in '{item}'"))?;
        if !(0.0..=1.0).contains(&rate) {
            bail!("error rate in '{item}' must be between 0 and 1");
        }
        if !(400..=599).contains(&status) {
            bail!("error status in '{item}' must be 4xx or 5xx");
        }
        let fault = spec.routes.entry(route).or_insert_with(default_route_fault);
        fault.error_rate = rate;
        fault.error_status = status;
    }
    spec.fail_at_boot = args.fail_at_boot.clone();
    spec.never_join = args.never_join.clone();
    spec.hang_stopping = args.hang_stopping.clone();
    spec.crash_after_requests = args.crash_after_requests;
    spec.wrong_console_host_key = args.wrong_console_host_key.clone();
    spec.missing_data_disk = args.missing_data_disk.clone();
    spec.download_fails = args.download_fails.clone();
    spec.no_capacity = args.no_capacity.clone();
    spec.quota_exceeded = args.quota_exceeded.clone();
    Ok(spec)
}

fn default_route_fault() -> RouteFault {
    RouteFault {
        error_status: 503,
        ..RouteFault::default()
    }
}

fn options(args: &Args) -> anyhow::Result<SimOptions> {
    let mut opts = SimOptions {
        listen: args.listen,
        token: args.token.clone(),
        faults: faults(args)?,
        ssh_port: args.ssh_port,
        preset: args.preset.clone(),
        state_dir: args.state_dir.clone(),
        job_binaries: args.run_jobs.clone(),
        job_bundle: args.run_jobs_in_bundle.clone(),
        kubernetes: oxide_sim::control_plane::ControlPlaneOptions {
            node_monitor_grace_period: std::time::Duration::from_secs(
                args.node_monitor_grace_seconds,
            ),
            ..Default::default()
        },
        api_version: args.api_version.clone(),
        tailscale: oxide_sim::TailscaleOptions {
            auth_keys: args.tailscale_auth_key.clone(),
            api_key: args.tailscale_api_key.clone(),
            tailnet: args.tailscale_tailnet.clone(),
            approval_required: args.tailscale_approval_required,
        },
        ..SimOptions::default()
    };
    let mut timings = Timings::default();
    if let Some(v) = args.create_to_starting_ms {
        timings.create_to_starting = ms(v);
    }
    if let Some(v) = args.starting_ms {
        timings.starting_to_running = ms(v);
    }
    if let Some(v) = args.stopping_ms {
        timings.stopping_to_stopped = ms(v);
    }
    if let Some(v) = args.rebooting_ms {
        timings.rebooting = ms(v);
    }
    opts.timings = timings;
    if let Some(v) = args.k3s_boot_ms {
        opts.k3s_boot = ms(v);
    }
    if let Some(v) = args.k3s_join_ms {
        opts.k3s_join = ms(v);
    }
    if let Some(v) = args.join_retry_ms {
        opts.join_retry = ms(v);
    }
    if let Some(v) = args.cert_lifetime_secs {
        opts.cert_lifetime = std::time::Duration::from_secs(v);
    }
    if let Some(v) = &args.k3s_version {
        opts.k3s_version = v.clone();
    }
    Ok(opts)
}

/// Installs the SIGTERM/SIGINT handlers. Done before the ready line is printed: a signal that
/// arrives right after it must still shut down cleanly (and remove temporary files).
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let opts = options(&args)?;
    let signal = shutdown_signal()?;
    let started = std::time::Instant::now();
    let sim = Sim::start(opts).await.context("starting oxide-sim")?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "oxide-sim ready"
    );
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", sim.ready_line()).context("writing the ready line")?;
        stdout.flush().context("flushing stdout")?;
    }
    let signal = signal.await;
    tracing::info!(signal, "shutting down");
    sim.shutdown();
    Ok(())
}

/// An API version is three dot-separated numbers, as nexus's `api-version` header.
fn api_version(s: &str) -> Result<String, String> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok()) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a version like {}",
            oxide_sim::oxide::SERVER_API_VERSION
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn cli_definition_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn route_faults_parse_from_flags() {
        let args = Args::parse_from([
            "oxide-sim",
            "--latency-ms",
            "POST /v1/instances=250",
            "--error-rate",
            "*=0.5:500",
            "--error-rate",
            "POST /v1/instances=0.1",
        ]);
        let spec = faults(&args).unwrap();
        let create = &spec.routes["POST /v1/instances"];
        assert_eq!(
            (create.latency_ms, create.error_rate, create.error_status),
            (250, 0.1, 503)
        );
        let all = &spec.routes["*"];
        assert_eq!(
            (all.latency_ms, all.error_rate, all.error_status),
            (0, 0.5, 500)
        );
    }

    #[test]
    fn malformed_fault_flags_are_refused() {
        for bad in [
            ["--error-rate", "*=2"],
            ["--latency-ms", "instances=5"],
            ["--error-rate", "*=0.5:200"],
        ] {
            let args = Args::parse_from(["oxide-sim", bad[0], bad[1]]);
            assert!(faults(&args).is_err(), "{bad:?}");
        }
    }
}
