//! `reconcile-once`: one reconcile run, then exit. Run by a CronJob in the cluster, or from a
//! laptop with `--kubeconfig` when the CronJob cannot run.
//!
//! `reconcile-once backup` is the in-cluster backup instead (the CronJob
//! `oxide-controller-backup/oxide-controller-backup`): it uploads the etcd snapshot k3s took at
//! this tick of `backup.schedule` on the server it runs on, read from a read-only hostPath of
//! k3s's snapshot directory, to the rack as a backup, applies the retention and records the
//! outcome in the ConfigMap's `backup.json` (exit 0 done or off, 1 failed, 2 configuration).
//!
//! Exit codes: 0 converged or progressing (or another run holds the Lease), 1 retryable
//! failure, 2 configuration error, 143 (SIGTERM) or 130 (SIGINT) stopped early on request.
//!
//! SIGTERM (the kubelet ending the pod: eviction, a Job deletion, `activeDeadlineSeconds`)
//! and SIGINT are handled, which matters most as PID 1 of the image, where an unhandled
//! SIGTERM is ignored and the pod would act on until SIGKILL: the run starts no new action,
//! lets the one under way finish (or abandons it after
//! [`oxide_controller::apply::ABANDON_AFTER`]; every action is resumable), writes status,
//! gives the Lease back, logs `reconcile stopped early` with the signal, and exits 128 + the
//! signal's number — well inside the default 30 s grace period.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use oxide_controller::adapters::kube_cluster::KubeCluster;
use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_controller::base::shutdown::Shutdown;
use oxide_controller::base::telemetry::{self, LogFormat};
use oxide_controller::ports::cluster::{JOBS_NAMESPACE, NAMESPACE};
use oxide_controller::workflows::error::chain;
use oxide_controller::workflows::reconcile::{self, ReconcileOptions, RunOutcome};

/// Keep the oxide-controller cluster at its desired shape: one run, then exit.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Kubeconfig to use instead of the in-cluster service account (the laptop escape hatch).
    #[arg(long, env = "OXIDE_CONTROLLER_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig (default: its current context).
    #[arg(long)]
    context: Option<String>,
    /// Namespace of the oxide-controller Secret, ConfigMap and Lease.
    #[arg(long, default_value = NAMESPACE, env = "OXIDE_CONTROLLER_NAMESPACE")]
    namespace: String,
    /// Print the plan and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Output of --dry-run.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Most Oxide/Kubernetes operations in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    /// Delete pods instead of evicting them when draining (ignores PodDisruptionBudgets).
    #[arg(long)]
    force_drain: bool,
    /// Whole-run deadline in seconds (default: the spec's timeouts.run_deadline_seconds).
    #[arg(long)]
    deadline_seconds: Option<u64>,
    /// Identity in the Lease (default: pod name or host name, plus pid).
    #[arg(long, env = "POD_NAME")]
    holder: Option<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto, env = "OXIDE_CONTROLLER_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The in-cluster backup: upload k3s's scheduled etcd snapshot of this tick to the rack.
    Backup {
        /// k3s's snapshot directory as this pod sees it (a read-only hostPath).
        #[arg(long, default_value = oxide_controller::workflows::backup::K3S_SNAPSHOT_DIR)]
        snapshot_dir: PathBuf,
        /// How long to wait for k3s's snapshot of this tick.
        #[arg(long, default_value_t = 300)]
        wait_seconds: u64,
        /// The Node this pod runs on (the downward API's spec.nodeName), for the manifest.
        #[arg(long, env = "NODE_NAME")]
        node: Option<String>,
        /// Where the pod mounts its rack credentials (Secret
        /// oxide-controller-backup/oxide-controller-rack); its account reads no Secret.
        #[arg(long, default_value = oxide_controller::render::manifests::BACKUP_RACK_SECRET_DIR)]
        rack_dir: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let args = Args::parse();
    telemetry::init(args.log_format);
    telemetry::block_on(run(args))
}

async fn run(args: Args) -> ExitCode {
    // First: from here on SIGTERM/SIGINT no longer kill the process mid-step.
    let shutdown = Shutdown::on_signals();
    let config = oxide_controller::adapters::kubeclient::config(
        args.kubeconfig.as_deref(),
        args.context.as_deref(),
    )
    .await;
    let (config, client) = match config.and_then(|c| {
        oxide_controller::adapters::kubeclient::client_from_config(c.clone()).map(|k| (c, k))
    }) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{}", chain(&e));
            return ExitCode::from(2);
        }
    };
    if let Some(command) = &args.command {
        let counter = client.clone();
        let count = move |snapshot| async move {
            oxide_controller::adapters::kubeclient::count_objects(&counter, Some(snapshot)).await
        };
        return backup(command, count, KubeStateStore::new(client, &args.namespace)).await;
    }
    let holder = args.holder.clone().unwrap_or_else(default_holder);
    // k3s's supervisor (the etcd member list) and, for the upgrade pre-flight, each server's
    // own /metrics: both with this configuration's address, CA and credentials.
    let cluster = KubeCluster::new(client.clone(), &args.namespace)
        .with_reporting_instance(&holder)
        .with_supervisor(&config)
        .with_server_config(config);
    let state = KubeStateStore::new(client, &args.namespace);
    let mut opts = ReconcileOptions::new(holder);
    // In a Job's pod, POD_NAME and POD_NAMESPACE come from the downward API: drain must not
    // evict it. The pod runs in the Jobs' namespace, not the state's.
    let pod_namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| JOBS_NAMESPACE.to_owned());
    opts.own_pod = std::env::var("POD_NAME")
        .ok()
        .filter(|p| !p.is_empty())
        .map(|p| (pod_namespace, p));
    opts.dry_run = args.dry_run;
    opts.concurrency = usize::from(args.concurrency);
    opts.force_drain = args.force_drain;
    opts.deadline = args.deadline_seconds.map(Duration::from_secs);
    opts.shutdown = shutdown;
    // The project is the Secret's, never the ConfigMap's (a spec naming another one is
    // refused before this is called).
    let make_rack = |secrets: &oxide_controller::base::secrets::ClusterSecrets,
                     _: &oxide_controller::domain::spec::ClusterSpec| {
        OxideRack::connect(
            &secrets.oxide_host,
            &secrets.oxide_token,
            &secrets.oxide_project,
            RackOptions::default(),
        )
    };
    match reconcile::run(&cluster, &state, make_rack, &opts).await {
        Ok(RunOutcome::DryRun { plan }) => {
            match args.output {
                Output::Table => print!("{}", plan.table()),
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&plan).unwrap_or_default()
                ),
            }
            ExitCode::SUCCESS
        }
        Ok(RunOutcome::LeaseHeld { holder }) => {
            tracing::info!(%holder, "another reconcile run holds the Lease; exiting");
            ExitCode::SUCCESS
        }
        Ok(RunOutcome::Converged { .. } | RunOutcome::Progressing { .. }) => ExitCode::SUCCESS,
        Ok(RunOutcome::Stopped { signal }) => {
            tracing::warn!(
                signal = signal.name(),
                exit_code = signal.exit_code(),
                "reconcile stopped early: no Lease held, a later run continues"
            );
            ExitCode::from(signal.exit_code())
        }
        Err(e) => {
            tracing::error!("{}", chain(&e));
            let hint = oxide_controller::adapters::kubeclient::recover_hint(
                args.kubeconfig.as_deref(),
                args.context.as_deref(),
            );
            if let Some(line) = hint.await {
                tracing::error!("{line}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// `reconcile-once backup`.
async fn backup<C, F>(command: &Command, count: C, state: KubeStateStore) -> ExitCode
where
    C: FnOnce(chrono::DateTime<chrono::Utc>) -> F,
    F: std::future::Future<Output = Result<u64, String>>,
{
    use oxide_controller::workflows::backup::{ScheduledOptions, ScheduledOutcome, run_scheduled};
    let Command::Backup {
        snapshot_dir,
        wait_seconds,
        node,
        rack_dir,
    } = command;
    let mut opts = ScheduledOptions::new(snapshot_dir.clone());
    opts.wait = Duration::from_secs(*wait_seconds);
    opts.node = node.clone().filter(|n| !n.is_empty());
    match oxide_controller::workflows::backup::read_retention_floor(rack_dir) {
        Ok(floor) => opts.retention_floor = floor,
        Err(e) => {
            tracing::error!("{}", chain(&e));
            return ExitCode::from(e.exit_code());
        }
    }
    let opts = &opts;
    let secrets = match oxide_controller::workflows::backup::read_rack_credentials(rack_dir) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{}", chain(&e));
            return ExitCode::from(e.exit_code());
        }
    };
    let make_rack = || {
        OxideRack::connect(
            &secrets.oxide_host,
            &secrets.oxide_token,
            &secrets.oxide_project,
            RackOptions::default(),
        )
    };
    match run_scheduled(&state, make_rack, count, opts).await {
        Ok(ScheduledOutcome::Off) => ExitCode::SUCCESS,
        Ok(ScheduledOutcome::Done { name, .. }) => {
            tracing::info!(backup = %name, "backup done");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{}", chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

fn default_holder() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "reconcile-once".to_owned());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Args::command().debug_assert();
    }
}
