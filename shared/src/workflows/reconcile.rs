//! `reconcile-once`: observe → plan → apply → write status, under the run Lease.
//!
//! Stateless: everything comes from the ConfigMap/Secret, the Oxide API and the Kubernetes
//! API on every run. Safe to kill at any instant; the next run picks up from what it sees.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tracing::{info, warn};

mod autoscale;
pub mod channel;
mod drill;
mod oxide_token;
pub mod preflight;
pub mod webhook_cert;
pub use autoscale::{Decided, active as autoscale_active, views as autoscale_views};

use crate::apply::{self, ApplyOptions};
use crate::base::names;
use crate::base::secrets::ClusterSecrets;
use crate::base::shutdown::{Shutdown, Signal};
use crate::domain::model::Node;
use crate::domain::plan::{self, Observed, Plan};
use crate::domain::plan::{ActionResult, Outcome};
use crate::domain::spec::ClusterSpec;
use crate::domain::status::{self, RunReport, Status};
use crate::ports::cluster::{Cluster, ClusterError, EventType, LeaseOutcome};
use crate::ports::rack::{Rack, RackError};
use crate::ports::state::{self, StateError, StateStore};
use crate::render::members::SpecMembers;
use crate::workflows::error::{self, BoxError, Kind, context, message};

/// How a run went; maps to the exit code.
#[derive(Debug)]
pub enum RunOutcome {
    /// Nothing left to do.
    Converged { plan: Plan },
    /// Actions were taken or are waiting on the world (joins, drains).
    Progressing {
        plan: Plan,
        results: Vec<ActionResult>,
    },
    /// Another run holds the Lease.
    LeaseHeld { holder: String },
    /// `--dry-run`: the plan, unapplied.
    DryRun { plan: Plan },
    /// Asked to stop (SIGTERM, SIGINT) before the run was done: no new action was started,
    /// the one under way finished or was abandoned at a resumable point, status was written
    /// (if the API allowed) and the Lease given back, so the next run starts at once.
    Stopped { signal: Signal },
}

/// Why a run failed, with the error that made it fail as its source (print it with
/// [`error::chain`]). Its own enum rather than [`error::WorkflowError`]: a run is unattended,
/// has no flags to name, and tells only these two apart (see [`crate::workflows::error`]).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Something a person must fix (exit 2).
    #[error("configuration error")]
    Config(#[source] BoxError),
    /// Try again later (exit 1).
    #[error(transparent)]
    Retryable(BoxError),
}

impl ReconcileError {
    /// What this failure asks for.
    pub fn kind(&self) -> Kind {
        match self {
            ReconcileError::Config(_) => Kind::NeedsPerson,
            ReconcileError::Retryable(_) => Kind::Retry,
        }
    }

    /// The process exit code ([`Kind::exit_code`]).
    pub fn exit_code(&self) -> u8 {
        self.kind().exit_code()
    }
}

/// Options of one run.
#[derive(Clone)]
pub struct ReconcileOptions {
    pub dry_run: bool,
    pub concurrency: usize,
    pub force_drain: bool,
    /// Lease holder identity (pod name, or host + pid).
    pub holder: String,
    /// The pod this run executes in (namespace, name): drain never evicts it.
    pub own_pod: Option<(String, String)>,
    /// Overrides the spec's run deadline.
    pub deadline: Option<Duration>,
    /// Poll interval for waits inside apply.
    pub poll: Duration,
    /// How long a removal waits for its instance to stop within this run.
    pub stop_wait: Duration,
    /// Backoff for retryable Oxide errors.
    pub backoff: crate::base::retry::Backoff,
    /// The clock (tests pass a fake one). The maintenance windows read it too.
    pub now: Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>,
    /// k3s's release channels (`upgrade.channel`), asked at most once a run.
    pub channels: Arc<dyn crate::ports::channel::ReleaseChannels>,
    /// Triggered when the process is asked to stop (see [`RunOutcome::Stopped`]).
    pub shutdown: Shutdown,
}

impl std::fmt::Debug for ReconcileOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconcileOptions")
            .field("dry_run", &self.dry_run)
            .field("concurrency", &self.concurrency)
            .field("force_drain", &self.force_drain)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl ReconcileOptions {
    pub fn new(holder: impl Into<String>) -> Self {
        ReconcileOptions {
            dry_run: false,
            concurrency: 8,
            force_drain: false,
            holder: holder.into(),
            own_pod: None,
            deadline: None,
            poll: Duration::from_millis(500),
            stop_wait: Duration::from_secs(60),
            backoff: crate::base::retry::Backoff::default(),
            now: Arc::new(Utc::now),
            channels: Arc::new(crate::adapters::k3s_channel::HttpChannels),
            shutdown: Shutdown::new(),
        }
    }
}

/// What [`load`] read: the spec to act on (`spec.yaml` with the webhook's counts), the
/// secrets, the ConfigMap, and why the webhook's counts were left out, when they were.
pub type LoadedSpec = (
    ClusterSpec,
    ClusterSecrets,
    state::ConfigSnapshot,
    Option<String>,
);

/// Reads and validates the spec and secrets. Config errors exit 2 and change nothing.
pub async fn load<S: StateStore>(state: &S) -> Result<LoadedSpec, ReconcileError> {
    let snapshot = state.read_config().await.map_err(state_err)?;
    let yaml = snapshot.spec_yaml().ok_or_else(|| {
        ReconcileError::Config(message(format!(
            "ConfigMap kube-system/oxide-controller has no {:?} key; re-run bootstrap",
            state::keys::SPEC
        )))
    })?;
    let base = ClusterSpec::from_yaml(yaml).map_err(|e| ReconcileError::Config(e.into()))?;
    if let Some(recorded) = recorded_server_settings(&snapshot)? {
        base.check_server_settings(&recorded)
            .map_err(|e| ReconcileError::Config(context("invalid cluster spec", e)))?;
    }
    let (secrets, scale) = tokio::join!(state.read_secrets(), state.read_scale());
    let (secrets, scale) = (secrets.map_err(state_err)?, scale.map_err(state_err)?);
    base.check_pinned(&secrets.oxide_project, &secrets.oxide_cluster)
        .map_err(|e| ReconcileError::Config(context("invalid cluster spec", e)))?;
    let effective = crate::workflows::scale::effective(base, scale.as_ref(), &snapshot);
    if let Some(why) = &effective.ignored {
        tracing::warn!(reason = %why, "the webhook's counts are not used");
    }
    Ok((effective.spec, secrets, snapshot, effective.ignored))
}

/// The k3s server settings the cluster's servers run, as recorded in the ConfigMap (absent in
/// clusters bootstrapped before the key existed: see [`running_server_settings`]).
fn recorded_server_settings(
    snapshot: &state::ConfigSnapshot,
) -> Result<Option<BTreeMap<String, String>>, ReconcileError> {
    snapshot
        .data
        .get(state::keys::K3S_SERVER_SETTINGS)
        .map(|text| {
            serde_json::from_str(text).map_err(|e| {
                ReconcileError::Config(context(
                    format!(
                        "ConfigMap kube-system/oxide-controller key {:?} is not a JSON object of strings; restore it or delete the key to record the spec's settings again",
                        state::keys::K3S_SERVER_SETTINGS
                    ),
                    e,
                ))
            })
        })
        .transpose()
}

/// What a run starts from: [`load`] (retried while transient), and the server settings to
/// record ([`settings_to_record`]).
/// What a run reads before it takes the Lease: the spec, secrets and ConfigMap, the version
/// gate passed on the Nodes (returned, so that observing need not list them again), and the
/// server settings to record.
struct Loaded {
    spec: ClusterSpec,
    secrets: ClusterSecrets,
    snapshot: state::ConfigSnapshot,
    nodes: Vec<Node>,
    server_settings: Option<BTreeMap<String, String>>,
    /// Why the webhook's counts were left out ([`crate::workflows::scale::Effective`]).
    scale_note: Option<String>,
}

async fn load_for_run<S: StateStore, C: Cluster>(
    state: &S,
    cluster: &C,
) -> Result<Loaded, ReconcileError> {
    let transient = |e: &ReconcileError| matches!(e, ReconcileError::Retryable(_));
    let (spec, secrets, snapshot, scale_note) =
        crate::base::retry::retry(crate::ports::cluster::KUBE_BACKOFF, transient, || {
            load(state)
        })
        .await?;
    let nodes = crate::base::retry::retry(crate::ports::cluster::KUBE_BACKOFF, transient, || {
        check_versions(cluster, &spec)
    })
    .await?;
    let server_settings = settings_to_record(&spec, &snapshot, &nodes)?;
    Ok(Loaded {
        spec,
        secrets,
        snapshot,
        nodes,
        server_settings,
        scale_note,
    })
}

/// The version gate ([`crate::domain::upgrade::gate`]) against what the Nodes run, before
/// the run takes its Lease: a refused spec exits 2 with nothing changed. Returns the Nodes.
pub async fn check_versions<C: Cluster>(
    cluster: &C,
    spec: &ClusterSpec,
) -> Result<Vec<Node>, ReconcileError> {
    let nodes = cluster.list_nodes().await.map_err(|e: ClusterError| {
        ReconcileError::Retryable(context("observing the cluster", e))
    })?;
    crate::domain::upgrade::gate(spec, &nodes)
        .map_err(|e| ReconcileError::Config(context("invalid cluster spec", e)))?;
    Ok(nodes)
}

/// The server settings to record: the ConfigMap's (checked against the spec by [`load`]), else
/// what the servers run ([`running_server_settings`]).
fn settings_to_record(
    spec: &ClusterSpec,
    snapshot: &state::ConfigSnapshot,
    nodes: &[Node],
) -> Result<Option<BTreeMap<String, String>>, ReconcileError> {
    if let Some(recorded) = recorded_server_settings(snapshot)? {
        return Ok(Some(recorded));
    }
    running_server_settings(spec, nodes)
}

/// For a cluster with no recorded server settings (bootstrapped before the record existed):
/// the settings its servers run, read from the arguments k3s writes on a Ready server's Node
/// ([`crate::domain::spec::NODE_ARGS_ANNOTATION`]), never from the spec, which may have been
/// edited since. A spec that differs is refused as [`load`] refuses one that differs from the
/// record. `None` (nothing to record yet) when no Ready server Node carries the annotation.
fn running_server_settings(
    spec: &ClusterSpec,
    nodes: &[Node],
) -> Result<Option<BTreeMap<String, String>>, ReconcileError> {
    let mut servers: Vec<_> = nodes
        .iter()
        .filter(|n| n.is_ready() && n.labels.contains_key(plan::CONTROL_PLANE_LABEL))
        .collect();
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    let Some(running) = servers.iter().find_map(|n| {
        n.annotations
            .get(crate::domain::spec::NODE_ARGS_ANNOTATION)
            .and_then(|a| ClusterSpec::server_settings_from_node_args(a))
    }) else {
        return Ok(None);
    };
    spec.check_server_settings(&running)
        .map_err(|e| ReconcileError::Config(context("invalid cluster spec", e)))?;
    Ok(Some(running))
}

fn state_err(e: StateError) -> ReconcileError {
    match e {
        StateError::NotFound { .. }
        | StateError::Malformed { .. }
        | StateError::Forbidden { .. } => ReconcileError::Config(e.into()),
        other => ReconcileError::Retryable(other.into()),
    }
}

/// What a run already knows when it observes, so that observing does not ask again.
#[derive(Debug, Default)]
pub struct Known {
    /// The Nodes the version gate listed a moment before, just before the run took its
    /// Lease. Observing takes them instead of listing again (once: a retried observation
    /// lists afresh). Between that list and the Lease, a run that held the Lease can only
    /// have been writing its status and giving the Lease back: its Node changes are made
    /// while it applies, before it wraps up.
    pub nodes: Option<Vec<Node>>,
    /// The default VPC subnet's prefix length as the previous run recorded it. A subnet's
    /// IPv4 block cannot change (nexus's `VpcSubnetUpdate` has only `name`, `description`
    /// and `custom_router`), so it is read from the rack only while no run has recorded it.
    pub subnet_prefix: Option<u8>,
    /// Whether to list k3s's certificate monitor Events this run
    /// ([`crate::domain::certificates::monitor_read_due`]); when not, the last run's view
    /// stands and no restart for certificates starts.
    pub certificate_events: bool,
}

/// Observes the rack and the cluster for `spec`; `server_token` (the Secret's k3s token) is
/// what k3s's supervisor asks for its etcd member list ([`etcd_membership`]).
pub async fn observe<R: Rack, C: Cluster>(
    rack: &R,
    cluster: &C,
    spec: &ClusterSpec,
    server_token: &str,
    known: Known,
) -> Result<Observed, ReconcileError> {
    let prefix = names::cluster_prefix(&spec.cluster);
    let fip_name = names::api_floating_ip_name(&spec.cluster);
    let nodes = async {
        match known.nodes {
            Some(nodes) => Ok(nodes),
            None => cluster.list_nodes().await,
        }
    };
    let subnet = async {
        match known.subnet_prefix {
            Some(prefix) => Ok(Some(prefix)),
            None => rack.default_subnet_prefix().await,
        }
    };
    let (instances, nodes, disks, fip, subnet, etcd, certificates) = tokio::join!(
        rack.list_instances(&prefix),
        nodes,
        rack.list_disks(),
        rack.get_floating_ip(&fip_name),
        subnet,
        etcd_membership(cluster, server_token),
        async {
            if known.certificate_events {
                certificate_reports(cluster).await
            } else {
                None
            }
        },
    );
    // Before anything else: a spec whose pools cannot all have an address is a config error.
    let subnet_prefix = subnet.map_err(rack_err)?;
    if let Some(prefix) = subnet_prefix {
        spec.check_subnet(prefix)
            .map_err(|e| ReconcileError::Config(context("invalid cluster spec", e)))?;
    }
    let mut observed = Observed {
        instances: instances.map_err(rack_err)?,
        nodes: nodes.map_err(|e: ClusterError| {
            ReconcileError::Retryable(context("observing the cluster", e))
        })?,
        disks: disks.map_err(rack_err)?,
        api_floating_ip: fip.map_err(rack_err)?,
        join_address: None,
        images: BTreeMap::new(),
        setup_failures: BTreeMap::new(),
        autoscale_victims: std::collections::BTreeSet::new(),
        autoscale_given_up: std::collections::BTreeSet::new(),
        create_backoff: plan::backoff::Backoffs::new(),
        subnet_prefix,
        etcd,
        certificates,
        roll_hold: None,
    };
    observed.setup_failures = setup_failures(rack, &observed).await;
    Ok(observed)
}

/// The etcd member list, as k3s's supervisor serves it on `/db/info` to holders of the
/// server token (retried while transient). A list that cannot be had is no error of the run:
/// it is observed as unreadable, and the planner holds control-plane changes while it is.
async fn etcd_membership<C: Cluster>(
    cluster: &C,
    server_token: &str,
) -> crate::domain::model::EtcdMembership {
    use crate::domain::model::EtcdMembership;
    let read = crate::base::retry::retry(
        crate::ports::cluster::KUBE_BACKOFF,
        ClusterError::is_retryable,
        || cluster.etcd_members(server_token),
    )
    .await;
    match read {
        Ok(list) => EtcdMembership::Read(list),
        Err(e) => {
            warn!(error = %error::chain(&e), "cannot read the etcd member list");
            EtcdMembership::Unreadable(error::chain(&e))
        }
    }
}

/// What each node's k3s certificate monitor last reported (see
/// [`crate::domain::certificates`]). Events that cannot be read are no error of the run: no
/// restart for certificates is planned while they cannot.
async fn certificate_reports<C: Cluster>(
    cluster: &C,
) -> Option<Result<BTreeMap<String, crate::domain::certificates::Report>, String>> {
    let read = crate::base::retry::retry(
        crate::ports::cluster::KUBE_BACKOFF,
        ClusterError::is_retryable,
        || cluster.certificate_events(),
    )
    .await;
    match read {
        Ok(events) => Some(Ok(crate::domain::certificates::latest(&events))),
        Err(e) => {
            warn!(error = %error::chain(&e), "cannot read k3s's certificate monitor events");
            Some(Err(error::chain(&e)))
        }
    }
}

/// The node setup failures on the consoles of running members that have no Node yet: the
/// setup script prints one marker line when a step fails (see
/// [`crate::render::cloud_init::SETUP_FAILED_MARKER`]), and such a member never joins. A console that
/// cannot be read is skipped (the join deadline still applies to that member).
async fn setup_failures<R: Rack>(
    rack: &R,
    observed: &Observed,
) -> BTreeMap<String, crate::domain::model::SetupFailure> {
    let nodes: std::collections::BTreeSet<&str> =
        observed.nodes.iter().map(|n| n.name.as_str()).collect();
    let waiting: Vec<&str> = observed
        .instances
        .iter()
        .filter(|i| {
            i.state == crate::domain::model::InstanceState::Running
                && !nodes.contains(i.name.as_str())
        })
        .map(|i| i.name.as_str())
        .collect();
    let consoles = futures::future::join_all(waiting.iter().map(|n| rack.serial_console(n))).await;
    let mut out = BTreeMap::new();
    for (name, console) in waiting.into_iter().zip(consoles) {
        match console {
            Ok(bytes) => {
                if let Some(f) =
                    crate::render::cloud_init::setup_failure(&String::from_utf8_lossy(&bytes))
                {
                    tracing::warn!(instance = name, step = %f.step, reason = %f.reason, "node setup failed");
                    out.insert(name.to_owned(), f);
                }
            }
            Err(e) => tracing::debug!(instance = name, error = %e, "serial console not readable"),
        }
    }
    out
}

fn rack_err(e: RackError) -> ReconcileError {
    ReconcileError::Retryable(context("observing the rack", e))
}

/// Looks up the images of the pools that `plan` creates members in.
pub async fn resolve_images<R: Rack>(
    rack: &R,
    spec: &ClusterSpec,
    plan: &Plan,
    observed: &mut Observed,
) -> Result<(), ReconcileError> {
    let wanted: std::collections::BTreeSet<String> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            plan::Action::CreateMember { pool, .. } => {
                spec.pool(pool).map(|(_, p)| p.image.clone())
            }
            _ => None,
        })
        .collect();
    let found = futures::future::join_all(wanted.iter().map(|n| rack.find_image(n))).await;
    for (name, img) in wanted.into_iter().zip(found) {
        observed.images.insert(name, img.map_err(rack_err)?);
    }
    Ok(())
}

/// What a run knows from before it observes: the last run's status (the autoscaler's
/// unneeded-since times, the pools whose creates the rack refused, the upgrade and the roll
/// under way) and what the backup writers reported (`backup.json`), which a roll of the
/// control plane waits on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory<'a> {
    pub previous: Option<&'a Status>,
    pub backups: Option<&'a crate::domain::backup::BackupReport>,
}

/// Observes and plans. Images are resolved (and the plan redone) only when it creates members,
/// so a run with nothing to create makes no image lookups. When a pool autoscales, the
/// autoscaler decides its count first; its outcome comes back for status and Events.
pub async fn observe_and_plan<R: Rack, C: Cluster>(
    rack: &R,
    cluster: &C,
    spec: &ClusterSpec,
    now: DateTime<Utc>,
    memory: Memory<'_>,
    server_token: &str,
    nodes: Option<Vec<Node>>,
) -> Result<(Observed, Plan, Option<crate::domain::autoscale::Outcome>), ReconcileError> {
    let previous = memory.previous;
    let known = Known {
        nodes,
        subnet_prefix: previous.and_then(|p| p.subnet_prefix),
        certificate_events: crate::domain::certificates::monitor_read_due(
            previous.map_or(&[][..], |p| p.certificates.as_slice()),
            previous.and_then(|p| p.certificates_read_at),
            &spec.certificates,
            now,
        ),
    };
    let mut observed = observe(rack, cluster, spec, server_token, known).await?;
    if let Some(p) = previous {
        observed.create_backoff = p.create_backoff.clone();
    }
    let previous_autoscale = previous
        .and_then(|s| s.autoscale.as_ref())
        .map(|a| &a.state);
    let decided = autoscale::decide(cluster, spec, &observed, previous_autoscale, now).await?;
    let spec = match &decided {
        Some(d) => {
            observed.autoscale_victims = d.victims.clone();
            observed.autoscale_given_up = d.given_up.clone();
            &d.spec
        }
        None => spec,
    };
    // Servers first, then worker pools in order: the planner plans each pool at the version
    // it may roll to now (issue 33).
    let previous_upgrade = previous.and_then(|s| s.upgrade.as_ref());
    let mut versions =
        crate::domain::upgrade::progress(spec, &observed.nodes, now, previous_upgrade);
    // Once per target, before the first member of the new version: the pre-flight.
    if crate::domain::upgrade::needs_preflight(spec, &observed.nodes, &versions, previous_upgrade) {
        let blockers = preflight::run(rack, cluster, spec, &observed, now).await;
        if !blockers.is_empty() {
            crate::domain::upgrade::hold_for_preflight(
                spec,
                &observed.nodes,
                &mut versions,
                blockers,
            );
        }
    }
    let effective = crate::domain::upgrade::effective_spec(spec, &versions);
    let spec = &effective;
    let (roll, roll_note) = roll_gate(spec, &mut observed, now, memory);
    let suffixes = fresh_suffixes(spec);
    let mut plan = plan::plan(spec, &observed, now, &suffixes);
    if plan
        .actions
        .iter()
        .any(|a| matches!(a, plan::Action::CreateMember { .. }))
    {
        resolve_images(rack, spec, &plan, &mut observed).await?;
        resolve_join_address(rack, spec, &mut observed, now).await?;
        plan = plan::plan(spec, &observed, now, &suffixes);
    }
    plan.findings.extend(
        crate::domain::upgrade::findings(&versions)
            .into_iter()
            .map(|message| plan::Finding {
                degraded: false,
                message,
            }),
    );
    plan.findings.extend(
        crate::domain::upgrade::blocked_finding(&versions).map(|message| plan::Finding {
            degraded: true,
            message,
        }),
    );
    plan.upgrade = Some(versions);
    plan.roll = roll;
    plan.findings.extend(roll_note.map(|message| plan::Finding {
        degraded: false,
        message,
    }));
    let outcome = decided.map(|d| {
        plan.findings.extend(autoscale::findings(&d.outcome));
        d.outcome
    });
    Ok((observed, plan, outcome))
}

/// The roll of the control plane this run is in (see [`crate::domain::backup::roll`]): kept
/// from the last run while it rolls to the same spec, and its next step held
/// (`observed.roll_hold`) until a backup taken after its decision exists. `spec` is the
/// effective spec (an upgrade step is a roll to that step's release). Returns the roll and
/// the note of one that goes on without a backup (in-cluster backups off).
fn roll_gate(
    spec: &ClusterSpec,
    observed: &mut Observed,
    now: DateTime<Utc>,
    memory: Memory<'_>,
) -> (Option<crate::domain::backup::RollDecision>, Option<String>) {
    use crate::domain::backup::{self, BeforeRoll};
    let rolling_to = plan::control_plane_rolling_to(spec, observed, now);
    let previous = memory.previous.and_then(|p| p.control_plane_roll.as_ref());
    let Some(mut roll) = backup::roll::decide(previous, rolling_to.as_deref(), now) else {
        return (None, None);
    };
    let report = memory.backups.cloned().unwrap_or_default();
    match backup::before_roll(
        roll.decided_at,
        &report,
        spec.backup.schedule.as_deref(),
        &spec.cluster,
    ) {
        BeforeRoll::Proceed { note } => (Some(roll), note),
        BeforeRoll::Wait { message, failed } => {
            info!(decided_at = %roll.decided_at, "{message}");
            roll.waiting_for_backup = Some(message.clone());
            observed.roll_hold = Some(plan::Finding {
                degraded: failed,
                message,
            });
            (Some(roll), None)
        }
    }
}

/// Looks up the private address of the server new members join through.
pub async fn resolve_join_address<R: Rack>(
    rack: &R,
    spec: &ClusterSpec,
    observed: &mut Observed,
    now: DateTime<Utc>,
) -> Result<(), ReconcileError> {
    if let Some(server) = crate::render::members::join_server(spec, observed, now) {
        observed.join_address = rack.instance_private_ip(&server).await.map_err(rack_err)?;
    }
    Ok(())
}

/// Draws fresh name suffixes for the planner (enough for any plan of this spec).
pub fn fresh_suffixes(spec: &ClusterSpec) -> Vec<String> {
    let n: u32 = spec.pools().map(|(_, p)| p.count + 1).sum::<u32>() + 8;
    let mut rng = rand::rng();
    (0..n).map(|_| names::random_suffix(&mut rng)).collect()
}

/// One reconcile run. `make_rack` builds the Oxide adapter from the Secret's credentials and
/// project (the spec's `project` is checked to be the same by [`load`]).
pub async fn run<R, C, S, M>(
    cluster: &C,
    state: &S,
    make_rack: M,
    opts: &ReconcileOptions,
) -> Result<RunOutcome, ReconcileError>
where
    R: Rack + crate::adapters::image::ImageStore,
    C: Cluster,
    S: StateStore,
    M: FnOnce(&ClusterSecrets, &ClusterSpec) -> Result<R, RackError>,
{
    let started = Instant::now();
    let started_at = (opts.now)();
    let run_id = new_run_id(started_at);
    let Loaded {
        spec,
        secrets,
        snapshot,
        nodes,
        server_settings,
        scale_note,
    } = load_for_run(state, cluster).await?;
    let deadline_len = opts
        .deadline
        .unwrap_or(Duration::from_secs(spec.timeouts.run_deadline_seconds));
    let deadline = started + deadline_len;
    let rack = make_rack(&secrets, &spec)
        .map_err(|e| ReconcileError::Config(context("building the Oxide client", e)))?;

    let previous = snapshot.status_json().and_then(Status::from_json);
    let (backups, backup_read_at) =
        backups_for_run(state, &spec, &snapshot, previous.as_ref(), started_at).await;
    if opts.dry_run {
        let memory = (previous.as_ref(), &backups);
        return dry_run(&rack, cluster, &spec, memory, &secrets, nodes, opts).await;
    }

    // Asked to stop before holding anything: nothing to give back.
    if let Some(signal) = opts.shutdown.signal() {
        return Ok(RunOutcome::Stopped { signal });
    }
    // The Lease outlives the run's deadline by a margin, so a run killed mid-way (SIGKILL,
    // node loss) blocks the next ones only briefly.
    let lease_len = deadline_len + (deadline_len / 4).min(Duration::from_secs(30));
    let (taken, asked) = take_lease(cluster, &opts.holder, lease_len).await?;
    if let LeaseOutcome::HeldBy { holder, .. } = taken {
        return Ok(RunOutcome::LeaseHeld { holder });
    }
    // Under the Lease, before planning: the channel's patch may become k3s.version.
    let (spec, channel) = channel::follow(state, cluster, opts, spec, &nodes).await;
    let apply_opts = apply_options(opts, &spec, deadline);

    // Keep the Lease while we work. A failed renew is retried while the Lease we hold is
    // still valid (client-go retries until its RenewDeadline); only when it is taken by
    // someone else or can no longer be trusted does the run stop *starting* work. Actions
    // under way finish (each is resumable, but half of one helps nobody): `renew` never
    // ends the run, `work` does.
    let cancelled = apply_opts.cancelled.clone();
    let renew = hold_lease(cluster, &opts.holder, lease_len, asked, cancelled);

    let ran = Ran {
        spec: &spec,
        snapshot: &snapshot,
        previous: previous.as_ref(),
        run_id: &run_id,
        started_at,
        server_settings: server_settings.as_ref(),
        subnet_prefix: std::sync::OnceLock::new(),
        channel,
        webhook_certificate: webhook_cert::keep(state, &spec, previous.as_ref(), started_at).await,
        oxide_token: oxide_token::keep(&rack, &secrets, previous.as_ref(), started_at).await,
        drill: std::sync::OnceLock::new(),
        scale_note: scale_note.as_deref(),
        backups,
        backup_read_at,
    };
    let outcome = tokio::select! {
        r = work(&rack, cluster, state, &secrets, &ran, nodes, opts, &apply_opts) => r,
        () = renew => unreachable!("renew never completes"),
        signal = abandoned(&apply_opts) => Err(ReconcileError::Retryable(message(format!(
            "abandoned under way: the run was asked to stop ({signal})"
        )))),
    };
    let stopped = opts.shutdown.signal();
    let status = wrap_up(cluster, state, opts, &ran, &outcome).await;
    if let Some(signal) = stopped {
        return Ok(stopped_early(
            &run_id,
            signal,
            &outcome,
            &status,
            started.elapsed(),
        ));
    }
    reboot_after_run(&rack, &apply_opts, &outcome).await;
    let (plan, results, autoscaled) = outcome?;
    let took = started.elapsed();
    finish(&run_id, plan, results, autoscaled, &status, took)
}

/// A dry run: observe and plan, nothing applied, nothing written.
async fn dry_run<R: Rack, C: Cluster>(
    rack: &R,
    cluster: &C,
    spec: &ClusterSpec,
    (previous, backups): (Option<&Status>, &crate::domain::backup::BackupReport),
    secrets: &ClusterSecrets,
    nodes: Vec<Node>,
    opts: &ReconcileOptions,
) -> Result<RunOutcome, ReconcileError> {
    let memory = Memory {
        previous,
        backups: Some(backups),
    };
    let (_, plan, _) = observe_and_plan(
        rack,
        cluster,
        spec,
        (opts.now)(),
        memory,
        &secrets.k3s_token,
        Some(nodes),
    )
    .await?;
    Ok(RunOutcome::DryRun { plan })
}

/// The run's work under the Lease: observe and plan (retried), the autoscaler's Events, apply,
/// the scheduled restore drill's step.
#[allow(clippy::too_many_arguments)]
async fn work<R: Rack + crate::adapters::image::ImageStore, C: Cluster, S: StateStore>(
    rack: &R,
    cluster: &C,
    state: &S,
    secrets: &ClusterSecrets,
    ran: &Ran<'_>,
    gate_nodes: Vec<Node>,
    opts: &ReconcileOptions,
    apply_opts: &ApplyOptions,
) -> Result<Applied, ReconcileError> {
    let transient = |e: &ReconcileError| matches!(e, ReconcileError::Retryable(_));
    // The version gate's Nodes serve the first attempt; a retry lists them again.
    let mut gate_nodes = Some(gate_nodes);
    let backups = ran.backups.clone();
    let memory = Memory {
        previous: ran.previous,
        backups: Some(&backups),
    };
    let (observed, plan, autoscaled) =
        crate::base::retry::retry(crate::ports::cluster::KUBE_BACKOFF, transient, || {
            observe_and_plan(
                rack,
                cluster,
                ran.spec,
                (opts.now)(),
                memory,
                &secrets.k3s_token,
                gate_nodes.take(),
            )
        })
        .await?;
    let mut plan = plan;
    // Before the backups' own findings: a failed or missing drill does not keep the next
    // drill from starting (nor does the webhook's certificate).
    let quiet = drill::quiet(&plan);
    if let Some(message) = ran.webhook_certificate.as_ref().and_then(|w| {
        crate::domain::certificates::webhook_finding(w, &ran.spec.certificates, (opts.now)())
    }) {
        plan.findings.push(plan::Finding {
            degraded: true,
            message,
        });
    }
    if let Some((degraded, message)) = ran
        .oxide_token
        .as_ref()
        .and_then(|t| crate::domain::oxide_token::finding(t, &ran.spec.certificates, (opts.now)()))
    {
        plan.findings.push(plan::Finding { degraded, message });
    }
    if let Some(message) = ran.channel.as_ref().and_then(|c| c.finding()) {
        plan.findings.push(plan::Finding {
            degraded: false,
            message,
        });
    }
    if let Some(prefix) = observed.subnet_prefix {
        let _ = ran.subnet_prefix.set(prefix);
    }
    if let Some(a) = &autoscaled {
        autoscale::record_events(cluster, a, ran.previous.and_then(|s| s.autoscale.as_ref())).await;
    }
    // New members get the version their pool rolls to this run (the plan's effective spec).
    let effective = effective_spec(ran.spec, &plan);
    let factory = SpecMembers::new(&effective, secrets, &observed).with_ca_hash(
        ran.snapshot
            .data
            .get(state::keys::K3S_CA_HASH)
            .map(String::as_str),
    );
    ensure_member_rules(rack, ran.spec, &observed, &plan).await;
    let results = apply::apply(rack, cluster, &factory, &plan, apply_opts).await;
    if opts.shutdown.signal().is_none() {
        let input = drill::DrillInput {
            spec: ran.spec,
            secrets,
            observed: &observed,
            report: drill_report(ran.snapshot),
            backups: &backups,
            watching_since: watching_since(ran),
            now: (opts.now)(),
            stop_wait: opts.stop_wait,
        };
        if let Some(report) = drill::step(rack, state, input, quiet).await {
            let _ = ran.drill.set(report);
        }
    }
    plan.findings.extend(backup_findings(ran, (opts.now)()));
    plan.findings
        .extend(ran.scale_note.map(|why| plan::Finding {
            degraded: false,
            message: why.to_owned(),
        }));
    Ok((plan, results, autoscaled))
}

/// The cluster's member rules (its internal ports from its members only) name the members
/// there are and the ones this run creates, before they are created: a new member's join
/// must not meet a rule that does not know it yet. The API rule likewise names its servers
/// (the API floating IP may move to any of them; audit security-2 N11), its sources left as
/// bootstrap wrote them. Writes nothing when the names are the same. A failure is logged and
/// the run goes on: the members already named keep working, and the next run writes the
/// rules again.
async fn ensure_member_rules<R: Rack>(
    rack: &R,
    spec: &ClusterSpec,
    observed: &Observed,
    plan: &Plan,
) {
    let mut members: Vec<(String, String)> = observed
        .instances
        .iter()
        .filter_map(|i| {
            names::InstanceTag::parse(&i.description)
                .filter(|t| t.cluster == spec.cluster)
                .map(|t| (i.name.clone(), t.pool))
        })
        .collect();
    members.extend(plan.actions.iter().filter_map(|a| match a {
        plan::Action::CreateMember { name, pool, .. } => Some((name.clone(), pool.clone())),
        _ => None,
    }));
    // The servers, the ones this run creates and the drill servers (a laptop's drill reaches
    // its server through its own address).
    let mut servers = crate::domain::firewall::api_servers(
        &spec.cluster,
        &spec.control_plane.name,
        observed
            .instances
            .iter()
            .map(|i| (i.name.as_str(), i.description.as_str())),
    );
    servers.extend(plan.actions.iter().filter_map(|a| match a {
        plan::Action::CreateMember { name, pool, .. } if *pool == spec.control_plane.name => {
            Some(name.clone())
        }
        _ => None,
    }));
    let members: Vec<String> = members.into_iter().map(|(n, _)| n).collect();
    if members.len() > crate::domain::firewall::MAX_RULE_PARTS {
        warn!(
            members = members.len(),
            "more members than a VPC firewall rule can name; the member rules are left as they are"
        );
    }
    let rules: Vec<_> = crate::domain::firewall::member_rules(&spec.cluster, &members)
        .into_iter()
        .flatten()
        .chain(crate::domain::firewall::api_rule_servers(
            &spec.cluster,
            &servers,
        ))
        .collect();
    if rules.is_empty() {
        return;
    }
    match rack.ensure_firewall_rules(&rules).await {
        Ok(change) => info!(
            ?change,
            members = members.len(),
            "VPC firewall member rules ensured"
        ),
        Err(e) => {
            warn!(error = %e, "could not write the VPC firewall member rules; the next run tries again")
        }
    }
}

/// What a run read and when it began, for [`work`] and [`wrap_up`].
struct Ran<'a> {
    spec: &'a ClusterSpec,
    snapshot: &'a state::ConfigSnapshot,
    previous: Option<&'a Status>,
    run_id: &'a str,
    started_at: DateTime<Utc>,
    /// The k3s server settings to record when the ConfigMap has none yet (see
    /// [`settings_to_record`]).
    server_settings: Option<&'a BTreeMap<String, String>>,
    /// The project's subnet prefix as this run observed it, for the status (the webhook's
    /// subnet check reads it there).
    subnet_prefix: std::sync::OnceLock<u8>,
    /// The release channel as this run found it (None without `upgrade.channel`).
    channel: Option<crate::domain::upgrade::channel::ChannelStatus>,
    /// The webhook's serving certificate as this run kept it ([`webhook_cert::keep`]).
    webhook_certificate: Option<crate::domain::certificates::WebhookCertificate>,
    /// The Oxide token's end as this run knows it ([`oxide_token::keep`]).
    oxide_token: Option<crate::domain::oxide_token::OxideTokenRecord>,
    /// `drill.json` as this run's drill step left it, when it changed it.
    drill: std::sync::OnceLock<crate::domain::backup::drill::DrillReport>,
    /// Why the webhook's counts were left out, when they were.
    scale_note: Option<&'a str>,
    /// `backup.json` as this run knows it ([`backups_for_run`]) and when it was read.
    backups: crate::domain::backup::BackupReport,
    backup_read_at: Option<DateTime<Utc>>,
}

/// After the work, whatever its outcome: the status it leaves (written, with the backoff
/// Events of a run that got through), and the Lease given back. Returns the status.
async fn wrap_up<C: Cluster, S: StateStore>(
    cluster: &C,
    state: &S,
    opts: &ReconcileOptions,
    ran: &Ran<'_>,
    outcome: &Result<Applied, ReconcileError>,
) -> Status {
    let finished_at = (opts.now)();
    let mut status = run_status(
        ran.spec,
        ran.run_id,
        ran.started_at,
        finished_at,
        outcome,
        ran.previous,
    );
    if let Some(prefix) = ran.subnet_prefix.get() {
        status.subnet_prefix = Some(*prefix);
    }
    status.backup = Some(crate::domain::backup::BackupStatus {
        read_at: ran.backup_read_at,
        ..backup_status(ran, finished_at)
    });
    status.channel = ran.channel.clone();
    status.webhook_certificate = ran.webhook_certificate.clone();
    status.oxide_token = ran.oxide_token.clone();
    if outcome.is_ok() {
        record_backoff_events(cluster, ran.previous, &status).await;
    }
    if let Err(e) = write_status(state, Some(ran.snapshot), &status, ran.server_settings).await {
        warn!(error = %e, "could not write status.json");
    }
    release_lease(cluster, &opts.holder).await;
    status
}

/// The restart for certificates of a cluster's only server, asked for by this run: made now
/// that its status is written and its Lease given back, as the API goes down with the server
/// (see [`crate::domain::certificates`]).
async fn reboot_after_run<R: Rack>(
    rack: &R,
    apply_opts: &ApplyOptions,
    outcome: &Result<Applied, ReconcileError>,
) {
    let Ok((_, results, _)) = outcome else {
        return;
    };
    for r in results {
        let (
            plan::Action::RestartForCertificates {
                name,
                after_run: true,
                ..
            },
            Outcome::InProgress(_),
        ) = (&r.action, &r.outcome)
        else {
            continue;
        };
        let reboot = crate::base::retry::retry(apply_opts.backoff, RackError::is_retryable, || {
            rack.reboot_instance(name)
        })
        .await;
        match reboot {
            Ok(()) => info!(instance = %name, "rebooted for its certificates after the run"),
            Err(e) => {
                warn!(instance = %name, error = %e, "could not reboot for its certificates; the next run asks again")
            }
        }
    }
}

/// Completes a little after apply gives up on the action under way once the run is asked to
/// stop (see [`ApplyOptions::abandon_after`]): the bound on the rest (an observe still
/// retrying). Returns the signal.
async fn abandoned(apply_opts: &ApplyOptions) -> Signal {
    let signal = apply_opts.shutdown.triggered().await;
    tokio::time::sleep(apply_opts.abandon_after + Duration::from_secs(2)).await;
    signal
}

/// A run asked to stop before it was done: logs what it did, and says so.
fn stopped_early(
    run_id: &str,
    signal: Signal,
    outcome: &Result<Applied, ReconcileError>,
    status: &Status,
    took: Duration,
) -> RunOutcome {
    match outcome {
        Ok((plan, results, autoscaled)) => {
            summary(run_id, plan, results, autoscaled.as_ref(), status, took);
        }
        Err(e) => warn!(run_id, error = %error::chain(e), "the run stopped early"),
    }
    RunOutcome::Stopped { signal }
}

/// What apply did: the plan, one result per action, and the autoscaler's outcome.
type Applied = (
    Plan,
    Vec<ActionResult>,
    Option<crate::domain::autoscale::Outcome>,
);

/// Keeps the Lease taken by the request sent at `asked` (see [`keep_lease`]); once it is
/// lost, tells apply to start no more work (`cancelled`). Never completes.
async fn hold_lease<C: Cluster>(
    cluster: &C,
    holder: &str,
    lease_len: Duration,
    asked: Instant,
    cancelled: Arc<std::sync::atomic::AtomicBool>,
) {
    keep_lease(cluster, holder, lease_len, asked + lease_len).await;
    cancelled.store(true, Ordering::SeqCst);
    std::future::pending::<()>().await;
}

/// `<start time>-<6 hex digits>`: the run's id in status.json and its log.
fn new_run_id(started_at: DateTime<Utc>) -> String {
    format!(
        "{}-{}",
        started_at.format("%Y%m%dT%H%M%SZ"),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    )
}

/// Takes the run Lease for `lease_len` (retried). Returns what the API said and when the
/// request that said it was sent: validity counts from before the request (the server's
/// renewTime is no earlier).
async fn take_lease<C: Cluster>(
    cluster: &C,
    holder: &str,
    lease_len: Duration,
) -> Result<(LeaseOutcome, Instant), ReconcileError> {
    let mut asked = Instant::now();
    let taken = crate::base::retry::retry(
        crate::ports::cluster::KUBE_BACKOFF,
        ClusterError::is_retryable,
        || {
            asked = Instant::now();
            cluster.acquire_lease(holder, lease_len)
        },
    )
    .await;
    match taken {
        Ok(taken) => Ok((taken, asked)),
        Err(e) => Err(ReconcileError::Retryable(context("taking the Lease", e))),
    }
}

/// How apply works this run: until `deadline`, with the run's options and the spec's drain
/// timeout.
fn apply_options(opts: &ReconcileOptions, spec: &ClusterSpec, deadline: Instant) -> ApplyOptions {
    let mut apply_opts = ApplyOptions::new(deadline);
    apply_opts.concurrency = opts.concurrency.max(1);
    apply_opts.force_drain = opts.force_drain;
    apply_opts.drain_timeout = Duration::from_secs(spec.timeouts.drain_seconds);
    apply_opts.poll = opts.poll;
    apply_opts.stop_wait = opts.stop_wait;
    apply_opts.backoff = opts.backoff;
    apply_opts.own_pod = opts.own_pod.clone();
    apply_opts.shutdown = opts.shutdown.clone();
    apply_opts
}

/// What the backup writers last reported (`backup.json`) as this run knows it, and when it
/// was read: read now when [`crate::domain::backup::report::read_due`], else the last run's
/// view. A read that fails keeps the last view (the run goes on; the status is not the
/// run's business to fail on).
async fn backups_for_run<S: StateStore>(
    state: &S,
    spec: &ClusterSpec,
    snapshot: &state::ConfigSnapshot,
    previous: Option<&Status>,
    now: DateTime<Utc>,
) -> (crate::domain::backup::BackupReport, Option<DateTime<Utc>>) {
    use crate::domain::backup::{BackupReport, report};
    let last = previous.and_then(|p| p.backup.as_ref());
    let kept = || {
        (
            last.map(|b| b.report.clone()).unwrap_or_default(),
            last.and_then(|b| b.read_at),
        )
    };
    let roll_waiting = previous.is_some_and(|p| p.control_plane_roll.is_some());
    let schedules = [
        spec.backup.schedule.as_deref(),
        spec.backup.drill_schedule.as_deref(),
    ];
    if !report::read_due(last, &schedules, roll_waiting, now) {
        return kept();
    }
    match state::read_backup_report(state, snapshot).await {
        Ok(text) => (
            text.and_then(|t| BackupReport::from_json(&t))
                .unwrap_or_default(),
            Some(now),
        ),
        Err(e) => {
            warn!(error = %crate::workflows::error::chain(&e), "cannot read backup.json; the last run's view stands");
            kept()
        }
    }
}

/// The backups as the writers last reported them (`backup.json`) and the restore drills as
/// their runners did (`drill.json`), judged at `now` against the spec's schedules; watched
/// since the first run that looked (kept in `status.json`).
fn backup_status(ran: &Ran<'_>, now: DateTime<Utc>) -> crate::domain::backup::BackupStatus {
    use crate::domain::backup::drill;
    let since = watching_since(ran);
    let mut status = crate::domain::backup::report::status(
        ran.spec.backup.schedule.as_deref(),
        &ran.backups,
        since,
        now,
    );
    let drills = ran
        .drill
        .get()
        .cloned()
        .unwrap_or_else(|| drill_report(ran.snapshot));
    status.drill = Some(drill::status(
        ran.spec.backup.drill_schedule.as_deref(),
        &drills,
        since,
        now,
    ));
    status
}

/// Since when the runs watch the backups and drills (the first run that looked, kept in
/// `status.json`; this run's start for the first).
fn watching_since(ran: &Ran<'_>) -> DateTime<Utc> {
    ran.previous
        .and_then(|p| p.backup.as_ref())
        .map_or(ran.started_at, |b| b.watching_since)
}

/// The restore drills as their runners left them (`drill.json`).
fn drill_report(snapshot: &state::ConfigSnapshot) -> crate::domain::backup::drill::DrillReport {
    snapshot
        .data
        .get(state::keys::DRILL)
        .and_then(|j| crate::domain::backup::drill::DrillReport::from_json(j))
        .unwrap_or_default()
}

/// The Degraded findings of the backups and drills: a stale backup, a failed or missing drill.
fn backup_findings(ran: &Ran<'_>, now: DateTime<Utc>) -> Vec<plan::Finding> {
    let status = backup_status(ran, now);
    let drill = status
        .drill
        .as_ref()
        .and_then(|d| d.finding(status.watching_since));
    status
        .finding()
        .into_iter()
        .chain(drill)
        .map(|message| plan::Finding {
            degraded: true,
            message,
        })
        .collect()
}

/// The status.json this run leaves, from its outcome (a failed run keeps what it can of the
/// previous one).
fn run_status(
    spec: &ClusterSpec,
    run_id: &str,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    outcome: &Result<
        (
            Plan,
            Vec<ActionResult>,
            Option<crate::domain::autoscale::Outcome>,
        ),
        ReconcileError,
    >,
    previous: Option<&Status>,
) -> Status {
    let (plan, results, autoscaled, error) = match outcome {
        Ok((p, r, a)) => (Some(p), r.as_slice(), a.as_ref(), None),
        Err(e) => (None, &[][..], None, Some(error::chain(e))),
    };
    let spec = &match outcome {
        Ok((p, _, _)) => effective_spec(spec, p),
        Err(_) => spec.clone(),
    };
    let pool_hashes: BTreeMap<String, String> = spec
        .pools()
        .map(|(role, p)| (p.name.clone(), spec.pool_hash(role, p)))
        .collect();
    status::build(&RunReport {
        run_id,
        started_at,
        finished_at,
        plan,
        results,
        error,
        previous,
        autoscale: autoscaled,
        pool_hashes: &pool_hashes,
    })
}

/// The spec a plan was made for: `spec` with each pool at the version the plan rolls it to.
fn effective_spec(spec: &ClusterSpec, plan: &Plan) -> ClusterSpec {
    match &plan.upgrade {
        Some(v) => crate::domain::upgrade::effective_spec(spec, v),
        None => spec.clone(),
    }
}

/// Gives the Lease back. Retried like every other Kubernetes call: a Lease left held makes
/// the next runs step aside until it expires (the run's deadline plus a margin).
async fn release_lease<C: Cluster>(cluster: &C, holder: &str) {
    let released = crate::base::retry::retry(
        crate::ports::cluster::KUBE_BACKOFF,
        ClusterError::is_retryable,
        || cluster.release_lease(holder),
    )
    .await;
    if let Err(e) = released {
        warn!(error = %e, "could not release the Lease; it expires by itself");
    }
}

/// Logs the run's summary line, then returns its result from what apply did: an error when
/// an action failed, else converged or progressing.
fn finish(
    run_id: &str,
    plan: Plan,
    results: Vec<ActionResult>,
    autoscaled: Option<crate::domain::autoscale::Outcome>,
    status: &Status,
    took: Duration,
) -> Result<RunOutcome, ReconcileError> {
    summary(run_id, &plan, &results, autoscaled.as_ref(), status, took);
    let failed = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
        .count();
    if failed > 0 {
        return Err(ReconcileError::Retryable(message(format!(
            "{failed} action(s) failed; see status.json lastPlan"
        ))));
    }
    if plan.is_converged() {
        Ok(RunOutcome::Converged { plan })
    } else {
        Ok(RunOutcome::Progressing { plan, results })
    }
}

/// Renews the Lease every third of its length until it is lost: returns when someone else
/// holds it (`Conflict`) or when renewals kept failing until less than [`LEASE_MARGIN`] of
/// its validity (`valid_until`) was left, so the run can stop starting new work in time.
pub async fn keep_lease<C: Cluster>(
    cluster: &C,
    holder: &str,
    lease_len: Duration,
    mut valid_until: Instant,
) {
    let margin = LEASE_MARGIN.min(lease_len / 4);
    loop {
        tokio::time::sleep(lease_len / 3).await;
        loop {
            let asked = Instant::now();
            match cluster.renew_lease(holder, lease_len).await {
                Ok(()) => {
                    valid_until = asked + lease_len;
                    break;
                }
                Err(e @ ClusterError::Conflict { .. }) => {
                    warn!(error = %e, "lost the Lease; finishing what is under way, starting nothing new");
                    return;
                }
                Err(e) => {
                    let left = valid_until.saturating_duration_since(Instant::now());
                    if left <= margin {
                        warn!(error = %e, "could not renew the Lease before it ran out; finishing what is under way, starting nothing new");
                        return;
                    }
                    warn!(error = %e, left_s = left.as_secs(), "renewing the Lease failed; trying again");
                    tokio::time::sleep((left - margin).min(LEASE_RETRY)).await;
                }
            }
        }
    }
}

/// Stop trusting the Lease when less than this of its validity is left unrenewed.
pub const LEASE_MARGIN: Duration = Duration::from_secs(15);
/// Pause between failed renewals.
const LEASE_RETRY: Duration = Duration::from_secs(2);

/// Writes `status.json` (and records `server_settings`, when known, if the ConfigMap has none
/// yet): re-read,
/// set our keys, replace with the version read. A 409 means the
/// webhook changed the spec meanwhile: re-read and write again (we never touch the spec).
pub async fn write_status<S: StateStore>(
    state: &S,
    read: Option<&state::ConfigSnapshot>,
    status: &Status,
    server_settings: Option<&BTreeMap<String, String>>,
) -> Result<(), StateError> {
    state::edit_config(state, read, |data| {
        data.insert(state::keys::STATUS.to_owned(), status.to_json());
        // Recorded once (bootstrap, or the first run of an older cluster); never replaced.
        if let Some(settings) = server_settings {
            data.entry(state::keys::K3S_SERVER_SETTINGS.to_owned())
                .or_insert_with(|| serde_json::to_string(settings).unwrap_or_default());
        }
    })
    .await
}

/// One Event per pool when the rack starts refusing its creates (or refuses them for another
/// reason), and one when a create succeeds again; never one per run or per refused create.
async fn record_backoff_events<C: Cluster>(cluster: &C, previous: Option<&Status>, now: &Status) {
    let before = previous.map(|p| &p.create_backoff);
    let mut events = Vec::new();
    for (pool, b) in &now.create_backoff {
        if before
            .and_then(|m| m.get(pool))
            .is_none_or(|p| p.cause != b.cause)
        {
            let reason = if b.cause == plan::backoff::BlockCause::SetupFailed {
                "UpgradeBlocked"
            } else {
                "CreatesRefused"
            };
            events.push((EventType::Warning, reason, b.describe(pool)));
        }
    }
    for pool in before.into_iter().flat_map(|m| m.keys()) {
        if !now.create_backoff.contains_key(pool) {
            events.push((
                EventType::Normal,
                "CreatesResumed",
                format!("pool {pool:?}: the rack accepts creates again, or the pool needs none"),
            ));
        }
    }
    for (kind, reason, message) in events {
        if let Err(e) = cluster.record_event(kind, reason, &message).await {
            warn!(error = %e, "could not record event");
        }
    }
}

fn summary(
    run_id: &str,
    plan: &Plan,
    results: &[ActionResult],
    autoscaled: Option<&crate::domain::autoscale::Outcome>,
    status: &Status,
    took: Duration,
) {
    let autoscale = autoscaled.map(autoscale::summary).unwrap_or_default();
    let refused = status
        .create_backoff
        .iter()
        .map(|(pool, b)| b.describe(pool))
        .collect::<Vec<_>>()
        .join("; ");
    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
    let pools = plan
        .pools
        .iter()
        .map(|p| format!("{}={}/{}", p.pool, p.ready, p.desired))
        .collect::<Vec<_>>()
        .join(" ");
    // What makes the cluster Degraded, in the run's last line too (status.json has it all).
    let findings = plan
        .findings
        .iter()
        .filter(|f| f.degraded)
        .map(|f| f.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    info!(
        run_id,
        converged = plan.is_converged(),
        degraded = plan.is_degraded(),
        actions = plan.actions.len(),
        done = count(|o| matches!(o, Outcome::Done)),
        in_progress = count(|o| matches!(o, Outcome::InProgress(_))),
        failed = count(|o| matches!(o, Outcome::Failed(_))),
        skipped = count(|o| matches!(o, Outcome::Skipped(_))),
        took_ms = took.as_millis() as u64,
        %pools,
        %autoscale,
        %refused,
        %findings,
        "reconcile finished"
    );
}
