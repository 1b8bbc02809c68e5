//! The `scale` workflow: read or change one pool's desired count in `spec.yaml`, then start a
//! reconcile Job. The webhook ([`crate::webhook`]) and the `scale` CLI both call this, so an
//! HTTP `PATCH {"delta":1}` and `scale add 1` do exactly the same thing.
//!
//! Owns the write protocol on the ConfigMap: read (data + resourceVersion) →
//! [`ClusterSpec::set_count`] → replace carrying the resourceVersion read. A 409 means someone
//! else wrote in between: re-read and re-apply the *requested change* (for a relative change,
//! the delta on top of the fresh count), a bounded number of times with jittered backoff. A
//! blind retry of the old document would lose the other writer's change.
//!
//! What does not live here: HTTP (status codes, bodies, auth — [`crate::webhook`]), and the
//! decision of *what* the cluster should do about the new count (the planner).

use std::time::Duration;

use crate::base::retry::Backoff;
use crate::domain::spec::scale::{self as scale_overrides, ScaleOverrides};
use crate::domain::spec::{ClusterSpec, CountError, PoolSpec, Role, SpecLoadError};
use crate::ports::cluster::{Cluster, JOBS_NAMESPACE, JobTrigger, ON_DEMAND_JOB};
use crate::ports::state::{self as state, ConfigSnapshot, StateError, StateStore, keys};
use crate::workflows::error::{Kind, chain};

/// The change asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountChange {
    /// Set the count to this value.
    Set(i64),
    /// Add this (possibly negative) amount to the count as stored at write time.
    Add(i64),
}

/// One pool's desired count and bounds, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolCount {
    pub pool: String,
    pub count: u32,
    pub min: u32,
    pub max: u32,
}

/// What a successful change did to the ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeOutcome {
    pub pool: String,
    /// The count before this change (as seen by the read that won the write).
    pub previous: u32,
    /// The count now stored.
    pub count: u32,
    pub min: u32,
    pub max: u32,
    /// False when the count already had the requested value: nothing was written.
    pub written: bool,
    /// 409s met (and re-read) on the way.
    pub conflicts: u32,
}

/// What happened to the on-demand reconcile after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileOutcome {
    /// A reconcile Job was created from the CronJob's template.
    Triggered,
    /// The fixed-name Job already exists: a run is pending or under way and will see the change.
    Pending,
    /// No CronJob to copy the Job from; the change is saved but nothing was started.
    NoCronJob,
    /// Nothing changed, so nothing was started.
    NotNeeded,
    /// The Kubernetes API refused or failed; the change is saved. `message` is for the log.
    Failed { message: String },
}

impl ReconcileOutcome {
    /// Short machine-readable name (`triggered`, `pending`, `not-triggered`, `not-needed`, `failed`).
    pub fn as_str(&self) -> &'static str {
        match self {
            ReconcileOutcome::Triggered => "triggered",
            ReconcileOutcome::Pending => "pending",
            ReconcileOutcome::NoCronJob => "not-triggered",
            ReconcileOutcome::NotNeeded => "not-needed",
            ReconcileOutcome::Failed { .. } => "failed",
        }
    }

    /// One human sentence about the reconcile, safe to show to callers.
    pub fn public_message(&self) -> String {
        match self {
            ReconcileOutcome::Triggered => {
                format!("reconcile triggered (Job {JOBS_NAMESPACE}/{ON_DEMAND_JOB})")
            }
            ReconcileOutcome::Pending => {
                format!("reconcile pending (Job {JOBS_NAMESPACE}/{ON_DEMAND_JOB} already exists and will pick the change up)")
            }
            ReconcileOutcome::NoCronJob => format!(
                "the change is saved, but no reconcile was triggered: CronJob {JOBS_NAMESPACE}/oxide-controller does not exist; run reconcile-once to apply it"
            ),
            ReconcileOutcome::NotNeeded => "no change, so no reconcile was triggered".to_owned(),
            ReconcileOutcome::Failed { .. } => {
                "the change is saved, but starting a reconcile Job failed; the next scheduled run applies it".to_owned()
            }
        }
    }
}

/// The result of [`run`]: the change and the reconcile it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleOutcome {
    pub change: ChangeOutcome,
    pub reconcile: ReconcileOutcome,
}

/// Who asks for a change, which decides what it may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Caller {
    /// The `scale` CLI with a person's kubeconfig: any pool, any bounds the spec allows.
    #[default]
    Administrator,
    /// The webhook's bearer token: worker pools only, never above the administrator's
    /// ceiling ([`crate::domain::spec::WebhookSpec`]) nor beyond the project's subnet
    /// ([`webhook_may`]).
    Webhook,
}

/// How hard to try against write conflicts, and for whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleOptions {
    /// Attempts (read + write) before giving up with [`ScaleError::Busy`]; delays between
    /// them double from `first` to `max`, jittered ±25%.
    pub backoff: Backoff,
    /// Whose change this is. The webhook sets [`Caller::Webhook`] whatever its config says.
    pub caller: Caller,
}

impl Default for ScaleOptions {
    fn default() -> Self {
        ScaleOptions {
            backoff: Backoff {
                first: Duration::from_millis(5),
                max: Duration::from_millis(200),
                attempts: 20,
            },
            caller: Caller::Administrator,
        }
    }
}

/// Why a scale call failed. Nothing was written unless the variant says so.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    #[error("cannot read or write the cluster state")]
    State(#[source] StateError),
    #[error("the ConfigMap has no {key}; run bootstrap first", key = keys::SPEC)]
    NoSpec,
    /// The webhook writes counts only into ConfigMap [`state::SCALE_OBJECT`], which bootstrap
    /// creates; a cluster bootstrapped before it has none until bootstrap runs again.
    #[error(
        "ConfigMap kube-system/{name} does not exist, and the webhook may write counts nowhere else; re-run bootstrap to create it (or change counts with the scale CLI)",
        name = state::SCALE_OBJECT
    )]
    NoScaleObject,
    #[error("the ConfigMap's spec.yaml is unusable; fix it with kubectl edit or re-run bootstrap")]
    Spec(#[source] SpecLoadError),
    #[error("spec.yaml has no worker pool; name one with --pool or /pools/{{pool}}")]
    NoWorkerPool,
    #[error(transparent)]
    Count(#[from] CountError),
    #[error(
        "the ConfigMap kept changing while we wrote it: {attempts} attempts met a conflict; try again"
    )]
    Busy { attempts: u32 },
    /// A count change on a pool whose autoscaler owns the count. Nothing was written.
    #[error(
        "pool {pool:?} autoscales between min {min} and max {max}, so the autoscaler sets its count; change the bounds (PUT /pools/{pool}/autoscale, `scale autoscale`) or set enabled false to set the count by hand"
    )]
    Autoscaling { pool: String, min: u32, max: u32 },
    /// A bounds change the spec refuses; `field` is the request's (`min`, `max`, `enabled`)
    /// or the spec field it broke. Nothing was written.
    #[error("{field}: {message}")]
    InvalidAutoscale { field: String, message: String },
    /// The webhook asked to change the control plane. Nothing was written.
    #[error(
        "pool {pool:?} is the control plane, which the webhook cannot change; an administrator changes it with `scale set N --pool {pool}`"
    )]
    ControlPlaneLocked { pool: String },
    /// The webhook asked to raise a worker pool's `field` (`max` or `count`) above the
    /// administrator's ceiling. Nothing was written.
    #[error(
        "{field} {value} for pool {pool:?} is above the administrator's ceiling of {ceiling} ({why}); an administrator raises it in spec.yaml webhook.ceiling"
    )]
    AboveCeiling {
        pool: String,
        field: &'static str,
        value: u32,
        ceiling: u32,
        /// Where the ceiling comes from.
        why: &'static str,
    },
    /// The webhook asked for more members than the project's subnet has addresses for (the
    /// check every reconcile run makes, which would otherwise refuse every later run).
    /// Nothing was written.
    #[error("{field}: {message}")]
    SubnetTooSmall { field: String, message: String },
    /// The spec names another project or cluster than the one the cluster is pinned to (the
    /// Secret's `oxide-project`, `oxide-cluster`). Nothing was written.
    #[error("invalid cluster spec")]
    Project(#[source] crate::domain::spec::SpecError),
    /// The stored spec's versions fail the version gate against what the Nodes run
    /// ([`crate::domain::upgrade::gate`]): every run refuses it, so no change is written into
    /// it either. Nothing was written.
    #[error("the stored spec's Kubernetes versions are refused; fix them first")]
    VersionGate(#[source] crate::domain::spec::SpecErrors),
    /// The Nodes could not be listed for the version gate. Nothing was written.
    #[error("cannot list the Nodes to check the spec's versions: {0}")]
    Nodes(String),
}

impl ScaleError {
    /// What the failure asks for: a fix by the user, or a retry.
    pub fn kind(&self) -> Kind {
        match self {
            ScaleError::State(StateError::NotFound { .. } | StateError::Forbidden { .. }) => {
                Kind::NeedsPerson
            }
            ScaleError::State(_) | ScaleError::Busy { .. } => Kind::Retry,
            ScaleError::NoSpec | ScaleError::NoScaleObject | ScaleError::Spec(_) => {
                Kind::NeedsPerson
            }
            ScaleError::NoWorkerPool
            | ScaleError::Count(_)
            | ScaleError::Autoscaling { .. }
            | ScaleError::InvalidAutoscale { .. }
            | ScaleError::ControlPlaneLocked { .. }
            | ScaleError::AboveCeiling { .. }
            | ScaleError::SubnetTooSmall { .. } => Kind::Input,
            ScaleError::Project(_) | ScaleError::VersionGate(_) => Kind::NeedsPerson,
            ScaleError::Nodes(_) => Kind::Retry,
        }
    }

    /// Process exit code ([`Kind::exit_code`]): 2 for what the user must fix, 1 for what a
    /// retry may fix.
    pub fn exit_code(&self) -> u8 {
        self.kind().exit_code()
    }
}

/// The pool named `pool`, or the default worker pool.
fn resolve_pool<'a>(
    spec: &'a ClusterSpec,
    pool: Option<&str>,
) -> Result<(Role, &'a PoolSpec), ScaleError> {
    match pool {
        None => spec
            .default_worker_pool()
            .map(|p| (Role::Worker, p))
            .ok_or(ScaleError::NoWorkerPool),
        Some(name) => spec.pool(name).ok_or_else(|| {
            ScaleError::Count(CountError::UnknownPool {
                pool: name.to_owned(),
                known: spec
                    .pools()
                    .map(|(_, p)| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }),
    }
}

/// The spec a reader acts on: `spec.yaml` with the webhook's overrides from ConfigMap
/// [`state::SCALE_OBJECT`] that still hold ([`ScaleOverrides::apply`]) and that the webhook
/// may make ([`webhook_may`]: whoever holds the webhook's account can write the object
/// directly, so the limits are checked where it is read, not only where the webhook writes).
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// `spec.yaml` as stored.
    pub base: ClusterSpec,
    /// What to act on.
    pub spec: ClusterSpec,
    /// Why the overrides were left out, when they were (for the run's findings).
    pub ignored: Option<String>,
}

/// [`Effective`] from `spec.yaml` (`base`), the scale object as read (`None`: there is none)
/// and the ConfigMap (for the subnet prefix the last run recorded).
pub fn effective(
    base: ClusterSpec,
    scale: Option<&ConfigSnapshot>,
    snapshot: &ConfigSnapshot,
) -> Effective {
    let text = scale.and_then(|s| s.data.get(scale_overrides::KEY));
    let overrides = match text.map(|t| ScaleOverrides::from_json(t)) {
        None => return Effective::of(base),
        Some(Ok(o)) => o,
        Some(Err(e)) => {
            let pools: Vec<String> = base.worker_pools.iter().map(|p| p.name.clone()).collect();
            return Effective::ignoring(base, &pools, e.to_string(), snapshot);
        }
    };
    let mut spec = base.clone();
    let applied = overrides.apply(&mut spec);
    if applied.is_empty() {
        return Effective::of(base);
    }
    let refused = match spec.validate() {
        Err(e) => Some(format!("the counts it sets make an invalid spec: {e}")),
        Ok(()) => webhook_may(&base, &spec, snapshot).err().map(|e| chain(&e)),
    };
    match refused {
        Some(why) => Effective::ignoring(
            base,
            &applied,
            format!("ConfigMap {}: {why}", state::SCALE_OBJECT),
            snapshot,
        ),
        None => Effective {
            base,
            spec,
            ignored: None,
        },
    }
}

impl Effective {
    fn of(base: ClusterSpec) -> Effective {
        Effective {
            spec: base.clone(),
            base,
            ignored: None,
        }
    }

    /// The overrides left out: each pool they would have changed keeps the count the last
    /// run planned for it (within `spec.yaml`'s bounds), so a refused write moves nothing
    /// (falling back to `spec.yaml`'s count could shrink a pool the webhook had grown).
    fn ignoring(
        base: ClusterSpec,
        pools: &[String],
        why: String,
        snapshot: &ConfigSnapshot,
    ) -> Effective {
        let last = crate::domain::status::Status::from_json(snapshot.status_json().unwrap_or(""));
        let mut spec = base.clone();
        for p in spec
            .worker_pools
            .iter_mut()
            .filter(|p| pools.contains(&p.name))
        {
            let planned = last
                .as_ref()
                .and_then(|s| s.pools.iter().find(|c| c.pool == p.name))
                .map(|c| c.desired);
            if let Some(n) = planned {
                p.count = n.clamp(p.min, p.max);
            }
        }
        Effective {
            base,
            spec,
            ignored: Some(format!(
                "{why}; its counts are ignored: the pools keep the counts the last run planned"
            )),
        }
    }
}

/// Reads the ConfigMap and the scale object together.
pub async fn read_both<S: StateStore + ?Sized>(
    state: &S,
) -> Result<(ConfigSnapshot, Option<ConfigSnapshot>), StateError> {
    let (config, scale) = tokio::join!(state.read_config(), state.read_scale());
    Ok((config?, scale?))
}

/// Memo of the last `spec.yaml` parsed, keyed by its exact text. Parsing and validating the
/// spec is most of what a GET costs, and the text rarely changes between requests; a hit is
/// indistinguishable from parsing again, so the memo never serves anything stale. The
/// webhook's counts are applied to it on every call ([`effective`]: they depend on the scale
/// object and on the last run's status too). The webhook keeps one per process; the CLI uses
/// a fresh one.
#[derive(Debug, Default)]
pub struct SpecCache(std::sync::Mutex<Option<(String, ClusterSpec)>>);

impl SpecCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(String, ClusterSpec)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The spec in `snapshot` with the overrides in `scale`, parsed and validated.
    fn parse(
        &self,
        snapshot: &ConfigSnapshot,
        scale: Option<&ConfigSnapshot>,
    ) -> Result<Effective, ScaleError> {
        let yaml = snapshot.spec_yaml().ok_or(ScaleError::NoSpec)?;
        let cached = self
            .lock()
            .as_ref()
            .filter(|(text, _)| text == yaml)
            .map(|(_, spec)| spec.clone());
        let base = match cached {
            Some(spec) => spec,
            None => {
                let spec = ClusterSpec::from_yaml(yaml).map_err(ScaleError::Spec)?;
                *self.lock() = Some((yaml.to_owned(), spec.clone()));
                spec
            }
        };
        Ok(effective(base, scale, snapshot))
    }
}

fn pool_count(pool: &PoolSpec) -> PoolCount {
    PoolCount {
        pool: pool.name.clone(),
        count: pool.count,
        min: pool.min,
        max: pool.max,
    }
}

/// The stored spec, parsed and validated. Read-only.
pub(crate) async fn read_spec<S: StateStore>(
    state: &S,
    cache: &SpecCache,
) -> Result<ClusterSpec, ScaleError> {
    let (snapshot, scale) = read_both(state).await.map_err(ScaleError::State)?;
    Ok(cache.parse(&snapshot, scale.as_ref())?.spec)
}

/// The stored count of `pool` (default: the first worker pool). Read-only.
pub async fn observe_count<S: StateStore>(
    state: &S,
    pool: Option<&str>,
    cache: &SpecCache,
) -> Result<PoolCount, ScaleError> {
    let spec = read_spec(state, cache).await?;
    let (_, p) = resolve_pool(&spec, pool)?;
    Ok(pool_count(p))
}

/// Applies `change` to `pool` (default: the first worker pool) in `spec.yaml`, re-reading
/// and re-applying on each 409 up to `opts.backoff.attempts` times. Starts no reconcile.
///
/// A change that leaves the count as it is writes nothing and reports `written: false`.
pub async fn apply_change<S: StateStore>(
    state: &S,
    pool: Option<&str>,
    change: CountChange,
    opts: &ScaleOptions,
    cache: &SpecCache,
) -> Result<ChangeOutcome, ScaleError> {
    let (mut outcome, written, conflicts) = edit_spec(state, opts, cache, |spec, snapshot| {
        as_caller(opts.caller, spec, snapshot, Some(pool), |spec| {
            edit_count(spec, pool, change)
        })
    })
    .await?;
    (outcome.written, outcome.conflicts) = (written, conflicts);
    Ok(outcome)
}

/// [`apply_change`]'s edit: the outcome (not yet written) and whether the count changed.
fn edit_count(
    spec: &mut ClusterSpec,
    pool: Option<&str>,
    change: CountChange,
) -> Result<(ChangeOutcome, bool), ScaleError> {
    let (_, p) = resolve_pool(spec, pool)?;
    refuse_if_autoscaling(p)?;
    let name = p.name.clone();
    let previous = p.count;
    let target = match change {
        CountChange::Set(n) => n,
        CountChange::Add(delta) => i64::from(previous)
            .checked_add(delta)
            .unwrap_or(if delta > 0 { i64::MAX } else { i64::MIN }),
    };
    spec.set_count(&name, target)?;
    let (_, p) = resolve_pool(spec, Some(&name))?;
    let changed = p.count != previous;
    let outcome = ChangeOutcome {
        pool: name,
        previous,
        count: p.count,
        min: p.min,
        max: p.max,
        written: false,
        conflicts: 0,
    };
    Ok((outcome, changed))
}

/// One change to `spec.yaml` as a caller asked for it; the webhook queues these and writes
/// the changes queued behind a write together in the next one ([`apply_batch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecChange {
    /// [`apply_change`]'s change.
    Count {
        pool: Option<String>,
        change: CountChange,
    },
    /// [`apply_autoscale`]'s change.
    Autoscale {
        pool: Option<String>,
        change: AutoscaleChange,
    },
}

/// What one [`SpecChange`] of a batch did, exactly as if it had been applied alone at its
/// place in the batch's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecOutcome {
    Count(ChangeOutcome),
    Autoscale(AutoscaleOutcome),
}

impl SpecOutcome {
    /// True when this change altered the spec and the batch was written.
    pub fn written(&self) -> bool {
        match self {
            SpecOutcome::Count(o) => o.written,
            SpecOutcome::Autoscale(o) => o.written,
        }
    }

    /// 409s met (and re-read) by the write that carried this change.
    pub fn conflicts(&self) -> u32 {
        match self {
            SpecOutcome::Count(o) => o.conflicts,
            SpecOutcome::Autoscale(o) => o.conflicts,
        }
    }

    fn set_written(&mut self, written: bool, conflicts: u32) {
        let (w, c) = match self {
            SpecOutcome::Count(o) => (&mut o.written, &mut o.conflicts),
            SpecOutcome::Autoscale(o) => (&mut o.written, &mut o.conflicts),
        };
        (*w, *c) = (written, conflicts);
    }
}

impl SpecChange {
    /// Applies the change to `spec`, as `caller` may ([`as_caller`]).
    fn edit(
        &self,
        spec: &mut ClusterSpec,
        snapshot: &ConfigSnapshot,
        caller: Caller,
    ) -> Result<(SpecOutcome, bool), ScaleError> {
        match self {
            SpecChange::Count { pool, change } => {
                as_caller(caller, spec, snapshot, Some(pool.as_deref()), |spec| {
                    edit_count(spec, pool.as_deref(), *change)
                })
                .map(|(o, changed)| (SpecOutcome::Count(o), changed))
            }
            SpecChange::Autoscale { pool, change } => {
                as_caller(caller, spec, snapshot, None, |spec| {
                    edit_autoscale(spec, snapshot, pool.as_deref(), *change)
                })
                .map(|(o, changed)| (SpecOutcome::Autoscale(o), changed))
            }
        }
    }
}

/// Runs `edit` on `spec` as `caller` may: for the webhook, a count change of the control
/// plane (`count_of`: the pool a count change names) is refused before anything else, and
/// an edit that changed the spec must pass [`webhook_may`]; a refused edit leaves `spec` as
/// it was.
fn as_caller<T>(
    caller: Caller,
    spec: &mut ClusterSpec,
    snapshot: &ConfigSnapshot,
    count_of: Option<Option<&str>>,
    edit: impl FnOnce(&mut ClusterSpec) -> Result<(T, bool), ScaleError>,
) -> Result<(T, bool), ScaleError> {
    if caller == Caller::Administrator {
        return edit(spec);
    }
    if let Some(pool) = count_of
        && let (Role::ControlPlane, p) = resolve_pool(spec, pool)?
    {
        return Err(ScaleError::ControlPlaneLocked {
            pool: p.name.clone(),
        });
    }
    let before = spec.clone();
    let edited = edit(spec)?;
    if edited.1
        && let Err(e) = webhook_may(&before, spec, snapshot)
    {
        *spec = before;
        return Err(e);
    }
    Ok(edited)
}

/// Whether the webhook may turn `before` into `after`. It may lower anything and move counts
/// within the bounds, but it may not change the control plane, raise a worker pool's `max`
/// or count above the administrator's ceiling (`webhook.ceiling`; without one, the pool's
/// `max` as it stood), nor make the pools reach more members than the project's subnet holds
/// (the prefix the last reconcile run recorded in `status.json`, else nexus's default /22):
/// every reconcile run refuses such a spec, so nothing would be repaired until a person
/// fixed it. Lowering stays possible even when the stored spec is already beyond a limit.
pub fn webhook_may(
    before: &ClusterSpec,
    after: &ClusterSpec,
    snapshot: &ConfigSnapshot,
) -> Result<(), ScaleError> {
    if after.control_plane != before.control_plane {
        return Err(ScaleError::ControlPlaneLocked {
            pool: before.control_plane.name.clone(),
        });
    }
    let ceiling = after.webhook.as_ref().map(|w| w.ceiling);
    for p in &after.worker_pools {
        let Some(was) = before.worker_pools.iter().find(|b| b.name == p.name) else {
            continue;
        };
        let (limit, why) = match ceiling {
            Some(c) => (c, "spec.yaml webhook.ceiling"),
            None => (
                was.max,
                "no webhook.ceiling is set, so the pool's max is the ceiling",
            ),
        };
        for (field, value, old) in [("max", p.max, was.max), ("count", p.count, was.count)] {
            if value > old && value > limit {
                return Err(ScaleError::AboveCeiling {
                    pool: p.name.clone(),
                    field,
                    value,
                    ceiling: limit,
                    why,
                });
            }
        }
    }
    let reach = |s: &ClusterSpec| -> u64 {
        s.worker_pools
            .iter()
            .map(|p| u64::from(p.max.max(p.count)))
            .sum()
    };
    if reach(after) > reach(before) {
        let prefix = crate::domain::status::Status::from_json(snapshot.status_json().unwrap_or(""))
            .and_then(|s| s.subnet_prefix)
            .unwrap_or(crate::domain::spec::DEFAULT_SUBNET_PREFIX);
        after
            .check_subnet(prefix)
            .map_err(|e| ScaleError::SubnetTooSmall {
                field: e.field,
                message: e.message,
            })?;
    }
    Ok(())
}

/// Applies one [`SpecChange`] alone ([`apply_change`] or [`apply_autoscale`]).
pub async fn apply_one<S: StateStore>(
    state: &S,
    change: &SpecChange,
    opts: &ScaleOptions,
    cache: &SpecCache,
) -> Result<SpecOutcome, ScaleError> {
    match change {
        SpecChange::Count { pool, change } => {
            apply_change(state, pool.as_deref(), *change, opts, cache)
                .await
                .map(SpecOutcome::Count)
        }
        SpecChange::Autoscale { pool, change } => {
            apply_autoscale(state, pool.as_deref(), *change, opts, cache)
                .await
                .map(SpecOutcome::Autoscale)
        }
    }
}

/// What [`apply_batch`] did: one result per change, in order, and what the one write met.
#[derive(Debug)]
pub struct BatchOutcome {
    /// Each change's own answer; a refused change (bad input) left the spec as the changes
    /// before it made it, and the changes after it were applied on top of that.
    pub results: Vec<Result<SpecOutcome, ScaleError>>,
    /// True when the batch wrote the ConfigMap (at least one change altered the spec).
    pub written: bool,
    /// 409s met (and re-read) on the way; on each, every change was applied again in order
    /// to the fresh spec.
    pub conflicts: u32,
}

/// Applies `changes` in order to one read of `spec.yaml` and writes the result once, with
/// the same replace-with-resourceVersion protocol (and re-read on 409) as [`apply_change`].
/// Each change's answer is what it would have been alone at its place in the order: a
/// relative change adds to the count the change before it left. Starts no reconcile.
///
/// A failure of the batch as a whole (the ConfigMap unreadable or unusable, a write refused,
/// every attempt conflicting) is returned as such: nothing was written.
pub async fn apply_batch<S: StateStore>(
    state: &S,
    changes: &[SpecChange],
    opts: &ScaleOptions,
    cache: &SpecCache,
) -> Result<BatchOutcome, ScaleError> {
    let (edits, written, conflicts) = edit_spec(state, opts, cache, |spec, snapshot| {
        let mut any = false;
        let edits: Vec<_> = changes
            .iter()
            .map(|change| {
                let mut next = spec.clone();
                let (outcome, changed) = change.edit(&mut next, snapshot, opts.caller)?;
                if changed {
                    *spec = next;
                    any = true;
                }
                Ok((outcome, changed))
            })
            .collect();
        Ok((edits, any))
    })
    .await?;
    let results = edits
        .into_iter()
        .map(|r: Result<(SpecOutcome, bool), ScaleError>| {
            r.map(|(mut outcome, changed)| {
                outcome.set_written(changed && written, conflicts);
                outcome
            })
        })
        .collect();
    Ok(BatchOutcome {
        results,
        written,
        conflicts,
    })
}

/// The write protocol both changes use: read the ConfigMap and the scale object, `edit` the
/// effective spec (which says whether it changed anything), write it back with the
/// resourceVersion read, and on a 409 re-read and edit again, up to `opts.backoff.attempts`
/// times. Nothing changed: nothing written. The webhook writes only the scale object (the
/// overrides that turn `spec.yaml` into the edited spec); an administrator writes
/// `spec.yaml` itself, which leaves any older override behind (it no longer holds). Returns
/// `edit`'s value from the attempt that counted, whether it was written, and the conflicts
/// met.
pub(crate) async fn edit_spec<S: StateStore, T>(
    state: &S,
    opts: &ScaleOptions,
    cache: &SpecCache,
    mut edit: impl FnMut(&mut ClusterSpec, &ConfigSnapshot) -> Result<(T, bool), ScaleError>,
) -> Result<(T, bool, u32), ScaleError> {
    let attempts = opts.backoff.attempts.max(1);
    let mut conflicts = 0;
    for attempt in 1..=attempts {
        if attempt > 1 {
            tokio::time::sleep(opts.backoff.delay(attempt)).await;
        }
        let (snapshot, scale) = read_both(state).await.map_err(ScaleError::State)?;
        let effective = cache.parse(&snapshot, scale.as_ref())?;
        let mut spec = effective.spec.clone();
        let (value, changed) = edit(&mut spec, &snapshot)?;
        if !changed {
            return Ok((value, false, conflicts));
        }
        let written = match opts.caller {
            Caller::Administrator => {
                let mut data = snapshot.data.clone();
                data.insert(keys::SPEC.to_owned(), spec.to_yaml());
                let written = state.replace_config(&snapshot.resource_version, data).await;
                if written.is_ok() {
                    clear_overrides(state, scale.as_ref()).await;
                }
                written
            }
            Caller::Webhook => {
                let scale = scale.ok_or(ScaleError::NoScaleObject)?;
                let overrides = ScaleOverrides::between(&effective.base, &spec);
                let mut data = scale.data.clone();
                data.insert(scale_overrides::KEY.to_owned(), overrides.to_json());
                state.replace_scale(&scale.resource_version, data).await
            }
        };
        match written {
            Ok(_) => return Ok((value, true, conflicts)),
            Err(e) if e.is_conflict() => {
                conflicts += 1;
                tracing::debug!(attempt, "the spec changed since it was read; re-reading");
            }
            Err(e) => return Err(ScaleError::State(e)),
        }
    }
    Err(ScaleError::Busy { attempts })
}

/// After an administrator wrote `spec.yaml` (which now holds what the webhook's overrides
/// made): empties the scale object, so that an override can never come back when a later
/// edit puts a field back to the value it was set over. Best effort: a failure leaves
/// overrides that no longer hold but for that case, and is logged.
async fn clear_overrides<S: StateStore>(state: &S, scale: Option<&ConfigSnapshot>) {
    let Some(scale) = scale else { return };
    let empty = ScaleOverrides::default().to_json();
    if scale
        .data
        .get(scale_overrides::KEY)
        .is_none_or(|t| *t == empty)
    {
        return;
    }
    let mut data = scale.data.clone();
    data.insert(scale_overrides::KEY.to_owned(), empty);
    if let Err(e) = state.replace_scale(&scale.resource_version, data).await {
        tracing::warn!(error = %chain(&e), "spec.yaml is written, but the webhook's older counts could not be cleared");
    }
}

/// The version gate (issue 33 item 1) for a scale change: the stored spec's versions against
/// what the Nodes run. A count or bounds change never touches a version, so the spec about
/// to be written passes exactly when the stored one does; checked once before the change
/// (the reconcile run's own gate remains the backstop against a concurrent edit).
pub async fn check_versions<S: StateStore, C: Cluster>(
    state: &S,
    cluster: &C,
    cache: &SpecCache,
) -> Result<(), ScaleError> {
    let spec = read_spec(state, cache).await?;
    let nodes = cluster
        .list_nodes()
        .await
        .map_err(|e| ScaleError::Nodes(crate::workflows::error::chain(&e)))?;
    crate::domain::upgrade::gate(&spec, &nodes).map_err(ScaleError::VersionGate)
}

/// Manual and automatic together: while a pool's autoscaler is enabled it owns the count,
/// so a manual count is refused (409 on the webhook) rather than silently undone by the next
/// run. The caller changes the bounds instead, or disables autoscaling.
fn refuse_if_autoscaling(p: &PoolSpec) -> Result<(), ScaleError> {
    match &p.autoscale {
        Some(a) if a.enabled => Err(ScaleError::Autoscaling {
            pool: p.name.clone(),
            min: p.min,
            max: p.max,
        }),
        _ => Ok(()),
    }
}

/// A change to a worker pool's autoscaling bounds; `None` keeps what is stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AutoscaleChange {
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub enabled: Option<bool>,
}

/// A pool's autoscaling settings as stored (`GET /pools/{pool}/autoscale`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AutoscaleBounds {
    pub pool: String,
    pub count: u32,
    pub min: u32,
    pub max: u32,
    /// True when the pool has an `autoscale` block with `enabled: true`.
    pub enabled: bool,
}

/// What [`apply_autoscale`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoscaleOutcome {
    pub previous: AutoscaleBounds,
    pub now: AutoscaleBounds,
    /// False when nothing changed: nothing was written.
    pub written: bool,
    pub conflicts: u32,
}

/// `planned`: the count the last reconcile run planned for the pool (see [`planned_count`]),
/// which is the autoscaler's while it is enabled; the spec's own count is not used then.
fn autoscale_bounds(p: &PoolSpec, planned: Option<u32>) -> AutoscaleBounds {
    let enabled = p.autoscale.as_ref().is_some_and(|a| a.enabled);
    AutoscaleBounds {
        pool: p.name.clone(),
        count: match planned {
            Some(n) if enabled => n,
            _ => p.count,
        },
        min: p.min,
        max: p.max,
        enabled,
    }
}

/// The desired count of `pool` in the last run's `status.json`.
fn planned_count(snapshot: &ConfigSnapshot, pool: &str) -> Option<u32> {
    let status = crate::domain::status::Status::from_json(snapshot.status_json()?)?;
    status
        .pools
        .iter()
        .find(|p| p.pool == pool)
        .map(|p| p.desired)
}

/// The worker pool `pool` names (default: the first); the control plane does not autoscale.
fn resolve_worker<'a>(
    spec: &'a ClusterSpec,
    pool: Option<&str>,
) -> Result<&'a PoolSpec, ScaleError> {
    match resolve_pool(spec, pool)? {
        (Role::Worker, p) => Ok(p),
        (Role::ControlPlane, p) => Err(ScaleError::InvalidAutoscale {
            field: "pool".into(),
            message: format!(
                "{:?} is the control plane, which does not autoscale; name a worker pool",
                p.name
            ),
        }),
    }
}

/// Stored autoscaling bounds of a worker pool. Read-only.
pub async fn observe_autoscale<S: StateStore>(
    state: &S,
    pool: Option<&str>,
    cache: &SpecCache,
) -> Result<AutoscaleBounds, ScaleError> {
    let (snapshot, scale) = read_both(state).await.map_err(ScaleError::State)?;
    let spec = cache.parse(&snapshot, scale.as_ref())?.spec;
    let p = resolve_worker(&spec, pool)?;
    Ok(autoscale_bounds(p, planned_count(&snapshot, &p.name)))
}

/// Applies `change` to `spec`: min/max are the pool's bounds (which the autoscaler keeps to),
/// `enabled` switches the `autoscale` block (created with defaults when first enabled).
/// Switching it off hands the count back to the caller at what the autoscaler last planned
/// (`planned`), so the next run keeps the workers there instead of going back to a count the
/// spec held before autoscaling. The count is clamped into the new bounds. Every spec rule (min ≤ max, the anti-affinity
/// group's size, schedule windows within the bounds) is checked; the first problem is
/// returned naming the request field it comes from.
fn change_autoscale(
    spec: &mut ClusterSpec,
    name: &str,
    change: AutoscaleChange,
    planned: Option<u32>,
) -> Result<(), ScaleError> {
    let Some(p) = spec.worker_pools.iter_mut().find(|p| p.name == name) else {
        return Ok(());
    };
    let was_enabled = p.autoscale.as_ref().is_some_and(|a| a.enabled);
    if let Some(min) = change.min {
        p.min = min;
    }
    if let Some(max) = change.max {
        p.max = max;
    }
    if p.min > p.max {
        let field = if change.min.is_some() { "min" } else { "max" };
        return Err(ScaleError::InvalidAutoscale {
            field: field.into(),
            message: format!("min {} is greater than max {}", p.min, p.max),
        });
    }
    match (change.enabled, p.autoscale.as_mut()) {
        (Some(on), Some(a)) => a.enabled = on,
        (Some(true), None) => {
            p.autoscale = Some(crate::domain::autoscale::AutoscaleSpec::default())
        }
        (Some(false), None) | (None, _) => {}
    }
    if was_enabled
        && change.enabled == Some(false)
        && let Some(n) = planned
    {
        p.count = n;
    }
    p.count = p.count.clamp(p.min, p.max);
    let prefix = format!("worker_pools.{name}.");
    spec.validate().map_err(|errs| {
        let e = errs
            .0
            .into_iter()
            .next()
            .unwrap_or_else(|| crate::domain::spec::SpecError {
                field: String::new(),
                message: "invalid".into(),
            });
        // The group-size rule names every pool's max; ours is the one the caller changed.
        let field = if e.field.contains(&format!("{prefix}max")) {
            "max".to_owned()
        } else {
            e.field.strip_prefix(&prefix).unwrap_or(&e.field).to_owned()
        };
        ScaleError::InvalidAutoscale {
            field,
            message: e.message,
        }
    })
}

/// Applies `change` to a worker pool's autoscaling settings in `spec.yaml`, with the same
/// read → change → replace-with-resourceVersion protocol (and re-read on 409) as
/// [`apply_change`]. Starts no reconcile.
pub async fn apply_autoscale<S: StateStore>(
    state: &S,
    pool: Option<&str>,
    change: AutoscaleChange,
    opts: &ScaleOptions,
    cache: &SpecCache,
) -> Result<AutoscaleOutcome, ScaleError> {
    let (mut outcome, written, conflicts) = edit_spec(state, opts, cache, |spec, snapshot| {
        as_caller(opts.caller, spec, snapshot, None, |spec| {
            edit_autoscale(spec, snapshot, pool, change)
        })
    })
    .await?;
    (outcome.written, outcome.conflicts) = (written, conflicts);
    Ok(outcome)
}

/// [`apply_autoscale`]'s edit: the outcome (not yet written) and whether the bounds changed.
fn edit_autoscale(
    spec: &mut ClusterSpec,
    snapshot: &ConfigSnapshot,
    pool: Option<&str>,
    change: AutoscaleChange,
) -> Result<(AutoscaleOutcome, bool), ScaleError> {
    let p = resolve_worker(spec, pool)?;
    let planned = planned_count(snapshot, &p.name);
    let previous = autoscale_bounds(p, planned);
    change_autoscale(spec, &previous.pool, change, planned)?;
    let now = autoscale_bounds(resolve_worker(spec, Some(&previous.pool))?, planned);
    let changed = now != previous;
    Ok((
        AutoscaleOutcome {
            written: false,
            conflicts: 0,
            previous,
            now,
        },
        changed,
    ))
}

/// Starts the on-demand reconcile Job. Failures are reported, not returned: by the time this
/// runs the change is saved, and the scheduled CronJob run will apply it anyway.
pub async fn trigger_reconcile<C: Cluster>(cluster: &C) -> ReconcileOutcome {
    match cluster.trigger_reconcile_job().await {
        Ok(JobTrigger::Created) => ReconcileOutcome::Triggered,
        Ok(JobTrigger::AlreadyPending) => ReconcileOutcome::Pending,
        Ok(JobTrigger::NoCronJob) => ReconcileOutcome::NoCronJob,
        Err(e) => ReconcileOutcome::Failed { message: chain(&e) },
    }
}

/// Refuses to act on a spec whose `project` or `cluster` is not the one the cluster is pinned
/// to (the Secret's `oxide-project` and `oxide-cluster`): a reconcile started for it would
/// refuse it anyway, and the change would be written for a cluster the spec no longer
/// describes.
pub(crate) async fn check_pinned<S: StateStore>(state: &S) -> Result<(), ScaleError> {
    let snapshot = state.read_config().await.map_err(ScaleError::State)?;
    let spec = SpecCache::default().parse(&snapshot, None)?.base;
    let secrets = state.read_secrets().await.map_err(ScaleError::State)?;
    spec.check_pinned(&secrets.oxide_project, &secrets.oxide_cluster)
        .map_err(ScaleError::Project)
}

/// The whole workflow for the CLI: check the project ([`check_pinned`]), apply the
/// change, then (if something was written) start a reconcile Job.
pub async fn run<S: StateStore, C: Cluster>(
    state: &S,
    cluster: &C,
    pool: Option<&str>,
    change: CountChange,
    opts: &ScaleOptions,
) -> Result<ScaleOutcome, ScaleError> {
    check_pinned(state).await?;
    let cache = SpecCache::default();
    check_versions(state, cluster, &cache).await?;
    let change = apply_change(state, pool, change, opts, &cache).await?;
    let reconcile = if change.written {
        trigger_reconcile(cluster).await
    } else {
        ReconcileOutcome::NotNeeded
    };
    if let ReconcileOutcome::Failed { message } = &reconcile {
        tracing::warn!(pool = %change.pool, error = %message, "count saved, but the reconcile Job could not be started");
    }
    Ok(ScaleOutcome { change, reconcile })
}

/// The CLI's `scale autoscale`: change the bounds, then (if something was written) start a
/// reconcile Job.
pub async fn run_autoscale<S: StateStore, C: Cluster>(
    state: &S,
    cluster: &C,
    pool: Option<&str>,
    change: AutoscaleChange,
    opts: &ScaleOptions,
) -> Result<(AutoscaleOutcome, ReconcileOutcome), ScaleError> {
    check_pinned(state).await?;
    let cache = SpecCache::default();
    check_versions(state, cluster, &cache).await?;
    let out = apply_autoscale(state, pool, change, opts, &cache).await?;
    let reconcile = if out.written {
        trigger_reconcile(cluster).await
    } else {
        ReconcileOutcome::NotNeeded
    };
    Ok((out, reconcile))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fake::FakeWorld;

    fn world(workers: u32, max: u32) -> FakeWorld {
        let w = FakeWorld::new(chrono::Utc::now());
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, workers);
        spec.worker_pools[0].max = max;
        let config = BTreeMap::from([(keys::SPEC.to_owned(), spec.to_yaml())]);
        w.with(|s| {
            s.config = ConfigSnapshot {
                resource_version: "1".into(),
                data: config,
            };
            s.secrets = Some(crate::base::secrets::ClusterSecrets {
                oxide_project: "demo".into(),
                oxide_cluster: "demo".into(),
                ..Default::default()
            });
        });
        w
    }

    /// Audit security-2 N4: the webhook's change lands in the scale object; an
    /// administrator's later `scale set` writes `spec.yaml` and empties the scale object, so
    /// setting the count back to exactly what the webhook changed it from is not undone by
    /// the webhook's older value.
    #[tokio::test]
    async fn an_administrators_change_after_the_webhooks_clears_its_overrides() {
        let w = world(2, 10);
        w.with(|s| s.scale = Some(crate::fake::empty_scale(2)));
        let webhook = ScaleOptions {
            caller: Caller::Webhook,
            ..ScaleOptions::default()
        };
        let cache = SpecCache::default();
        apply_change(&w.state(), None, CountChange::Set(5), &webhook, &cache)
            .await
            .unwrap();
        let spec_yaml = || w.with(|s| s.config.data[keys::SPEC].clone());
        assert!(spec_yaml().contains("count: 2"), "{}", spec_yaml());
        let count = || async {
            observe_count(&w.state(), None, &SpecCache::default())
                .await
                .unwrap()
                .count
        };
        assert_eq!(count().await, 5);
        let admin = ScaleOptions::default();
        apply_change(&w.state(), None, CountChange::Set(2), &admin, &cache)
            .await
            .unwrap();
        assert_eq!(
            count().await,
            2,
            "the administrator's count, not the webhook's"
        );
        let scale = w.with(|s| s.scale.clone()).unwrap();
        assert_eq!(
            ScaleOverrides::from_json(&scale.data[scale_overrides::KEY]).unwrap(),
            ScaleOverrides::default()
        );
    }

    /// The memo keeps the parsed `spec.yaml` only: what the webhook's counts make of it is
    /// worked out on every call, as it depends on the last run's status too (ignored counts
    /// keep the count the last run planned).
    #[test]
    fn the_memo_never_serves_counts_from_an_older_status() {
        let spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 2);
        let pool = spec.worker_pools[0].clone();
        let over = scale_overrides::PoolScale::of(&pool);
        let bad = ScaleOverrides {
            pools: std::collections::BTreeMap::from([(
                pool.name.clone(),
                scale_overrides::PoolOverride {
                    set: scale_overrides::PoolScale {
                        count: pool.max + 1,
                        ..over
                    },
                    over,
                },
            )]),
        };
        let scale = ConfigSnapshot {
            resource_version: "2".into(),
            data: BTreeMap::from([(scale_overrides::KEY.to_owned(), bad.to_json())]),
        };
        let with_status = |desired: u32| {
            let status = serde_json::json!({
                "runId": "r", "startedAt": "2026-11-29T10:00:00Z",
                "finishedAt": "2026-11-29T10:00:01Z", "conditions": [], "lastPlan": [],
                "pools": [{"pool": pool.name, "desired": desired, "ready": desired,
                    "joining": 0, "notReady": 0, "broken": 0, "removing": 0, "drifted": 0}],
            })
            .to_string();
            assert!(crate::domain::status::Status::from_json(&status).is_some());
            ConfigSnapshot {
                resource_version: "1".into(),
                data: BTreeMap::from([
                    (keys::SPEC.to_owned(), spec.to_yaml()),
                    (keys::STATUS.to_owned(), status),
                ]),
            }
        };
        let cache = SpecCache::default();
        let counts = |snapshot: &ConfigSnapshot| {
            let e = cache.parse(snapshot, Some(&scale)).unwrap();
            assert!(e.ignored.is_some(), "{e:?}");
            e.spec.worker_pools[0].count
        };
        assert_eq!(counts(&with_status(3)), 3);
        assert_eq!(
            counts(&with_status(4)),
            4,
            "the status changed, the texts did not"
        );
    }

    /// Stores `spec` and asks for a count and a bounds change as the CLI does: both must be
    /// refused, nothing written and no run started. Returns the two errors.
    async fn refused_both_ways(spec: &ClusterSpec) -> (ScaleError, ScaleError) {
        let w = world(2, 10);
        w.with(|s| s.config.data.insert(keys::SPEC.to_owned(), spec.to_yaml()));
        let opts = ScaleOptions::default();
        let count = run(&w.state(), &w.cluster(), None, CountChange::Add(1), &opts)
            .await
            .unwrap_err();
        let change = AutoscaleChange {
            max: Some(5),
            ..AutoscaleChange::default()
        };
        let bounds = run_autoscale(&w.state(), &w.cluster(), None, change, &opts)
            .await
            .unwrap_err();
        assert_eq!(w.with(|s| s.config.resource_version.clone()), "1");
        assert!(w.with(|s| s.jobs.is_empty()), "no reconcile started");
        (count, bounds)
    }

    /// Issue 34 §4: the CLI does not write, nor start a run for, a spec naming another
    /// project than the Secret's: exit 2 naming both.
    #[tokio::test]
    async fn a_spec_naming_another_project_than_the_secrets_is_refused_and_nothing_written() {
        let mut spec = ClusterSpec::new("demo", "elsewhere", "ubuntu-2404", 3, 2);
        spec.worker_pools[0].max = 10;
        let (count, bounds) = refused_both_ways(&spec).await;
        let text = chain(&count);
        assert!(
            text.contains("\"elsewhere\"") && text.contains("pinned to project \"demo\""),
            "{text}"
        );
        assert_eq!(count.exit_code(), 2);
        assert_eq!(bounds.exit_code(), 2, "{bounds:?}");
    }

    /// Audit security-2 N4: nor for a spec naming another cluster than the Secret's
    /// `oxide-cluster` (a ConfigMap writer aiming this cluster's controller at a neighbour
    /// in the same project), nor while the Secret pins no cluster at all.
    #[tokio::test]
    async fn a_spec_naming_another_cluster_than_the_secrets_is_refused_and_nothing_written() {
        let mut spec = ClusterSpec::new("prod-2", "demo", "ubuntu-2404", 3, 2);
        spec.worker_pools[0].max = 10;
        let (count, bounds) = refused_both_ways(&spec).await;
        let text = chain(&count);
        assert!(
            text.contains("names cluster \"prod-2\"") && text.contains("pinned to \"demo\""),
            "{text}"
        );
        assert_eq!((count.exit_code(), bounds.exit_code()), (2, 2));

        let w = world(2, 10);
        w.with(|s| {
            if let Some(secrets) = s.secrets.as_mut() {
                secrets.oxide_cluster.clear();
            }
        });
        let err = run(
            &w.state(),
            &w.cluster(),
            None,
            CountChange::Add(1),
            &ScaleOptions::default(),
        )
        .await
        .unwrap_err();
        assert!(chain(&err).contains("has no oxide-cluster"), "{err:?}");
        assert_eq!(w.with(|s| s.config.resource_version.clone()), "1");
    }

    /// Issue 33 item 1: the CLI writes no count or bounds into a spec the version gate
    /// refuses (here a worker pool newer than the control plane): exit 2 naming the field,
    /// nothing written, no run started.
    #[tokio::test]
    async fn a_spec_the_version_gate_refuses_takes_no_count_or_bounds_change() {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 2);
        spec.worker_pools[0].max = 10;
        spec.worker_pools[0].k3s_version = Some("v1.35.0+k3s1".into());
        // A v1.35 spec names its installer (issue 34 §7), so the gate is what refuses it.
        spec.k3s.installer_url =
            Some("https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh".into());
        spec.k3s.installer_sha256 = Some("ab".repeat(32));
        let (count, bounds) = refused_both_ways(&spec).await;
        let text = chain(&count);
        assert!(
            matches!(count, ScaleError::VersionGate(_)) && text.contains("worker_pools.workers"),
            "{text}"
        );
        assert_eq!(count.exit_code(), 2);
        assert!(matches!(bounds, ScaleError::VersionGate(_)), "{bounds:?}");
    }

    fn stored(w: &FakeWorld, pool: &str) -> u32 {
        let yaml = w.with(|s| s.config.data[keys::SPEC].clone());
        ClusterSpec::from_yaml(&yaml)
            .unwrap()
            .pool(pool)
            .unwrap()
            .1
            .count
    }

    #[tokio::test]
    async fn add_is_relative_to_the_stored_count_and_set_is_absolute() {
        let w = world(2, 10);
        let opts = ScaleOptions::default();
        let out = apply_change(
            &w.state(),
            None,
            CountChange::Add(3),
            &opts,
            &SpecCache::default(),
        )
        .await
        .unwrap();
        assert_eq!((out.previous, out.count, out.written), (2, 5, true));
        let out = apply_change(
            &w.state(),
            None,
            CountChange::Set(1),
            &opts,
            &SpecCache::default(),
        )
        .await
        .unwrap();
        assert_eq!((out.previous, out.count), (5, 1));
        assert_eq!(stored(&w, "workers"), 1);
    }

    #[tokio::test]
    async fn a_change_to_the_same_count_writes_nothing_and_triggers_nothing() {
        let w = world(2, 10);
        let out = run(
            &w.state(),
            &w.cluster(),
            None,
            CountChange::Set(2),
            &ScaleOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            (out.change.written, out.reconcile),
            (false, ReconcileOutcome::NotNeeded)
        );
        assert_eq!(w.with(|s| s.config.resource_version.clone()), "1");
        assert!(w.with(|s| s.jobs.is_empty()));
    }

    #[tokio::test]
    async fn overflowing_deltas_are_out_of_bounds_not_wrapped() {
        let w = world(2, 10);
        let e = apply_change(
            &w.state(),
            None,
            CountChange::Add(i64::MAX),
            &ScaleOptions::default(),
            &SpecCache::default(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                e,
                ScaleError::Count(CountError::OutOfBounds {
                    min: 0,
                    max: 10,
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(e.exit_code(), 2);
    }

    #[tokio::test]
    async fn the_spec_memo_never_serves_a_stale_spec() {
        let w = world(2, 10);
        let cache = SpecCache::default();
        assert_eq!(
            observe_count(&w.state(), None, &cache).await.unwrap().count,
            2
        );
        // Someone else rewrites spec.yaml behind the memo's back.
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 7);
        spec.worker_pools[0].max = 10;
        w.with(|s| s.config.data.insert(keys::SPEC.to_owned(), spec.to_yaml()));
        assert_eq!(
            observe_count(&w.state(), None, &cache).await.unwrap().count,
            7
        );
        let opts = ScaleOptions::default();
        apply_change(&w.state(), None, CountChange::Add(1), &opts, &cache)
            .await
            .unwrap();
        assert_eq!(
            observe_count(&w.state(), None, &cache).await.unwrap().count,
            8
        );
    }

    #[tokio::test]
    async fn autoscaling_pools_refuse_counts_and_take_bounds() {
        let w = world(2, 10);
        let mut spec =
            ClusterSpec::from_yaml(&w.with(|s| s.config.data[keys::SPEC].clone())).unwrap();
        spec.worker_pools[0].autoscale = Some(crate::domain::autoscale::AutoscaleSpec::default());
        w.with(|s| s.config.data.insert(keys::SPEC.to_owned(), spec.to_yaml()));
        let opts = ScaleOptions::default();
        let e = run(&w.state(), &w.cluster(), None, CountChange::Add(1), &opts)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                ScaleError::Autoscaling {
                    min: 0,
                    max: 10,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.exit_code(), 2);
        let change = AutoscaleChange {
            min: Some(3),
            ..AutoscaleChange::default()
        };
        let (out, reconcile) = run_autoscale(&w.state(), &w.cluster(), None, change, &opts)
            .await
            .unwrap();
        assert_eq!((out.now.min, out.now.count, out.written), (3, 3, true));
        assert_eq!(reconcile, ReconcileOutcome::Triggered);
        assert_eq!(stored(&w, "workers"), 3);
    }

    #[tokio::test]
    async fn unknown_pools_are_named_with_the_known_ones() {
        let w = world(2, 10);
        let e = observe_count(&w.state(), Some("gpu"), &SpecCache::default())
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "pool \"gpu\" does not exist; pools are: control-plane, workers"
        );
    }

    #[tokio::test]
    async fn a_missing_configmap_is_a_configuration_error() {
        let w = FakeWorld::new(chrono::Utc::now());
        let e = observe_count(&w.state(), None, &SpecCache::default())
            .await
            .unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e:?}");
    }
}
