//! `scale upgrade --to VERSION [--dry-run]`: checks a new `k3s.version` against what the
//! Nodes run ([`crate::domain::upgrade::gate`]), says in which order the cluster will roll,
//! and writes `spec.yaml` with the scale workflow's conflict-safe protocol (re-read and
//! re-check on each 409), then starts a reconcile. The roll itself is the reconcile's.
//!
//! What does not live here: the rules ([`crate::domain::upgrade`]) and the write protocol
//! ([`crate::workflows::scale`]).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use crate::domain::model::Node;
use crate::domain::spec::{ClusterSpec, SpecError, SpecErrors, SpecLoadError};
use crate::domain::upgrade::{self, Progress};
use crate::ports::cluster::{Cluster, ClusterError};
use crate::ports::rack::Rack;
use crate::ports::state::StateStore;
use crate::workflows::error::Kind;
use crate::workflows::scale::{self, ReconcileOutcome, ScaleError, ScaleOptions, SpecCache};

/// Why `scale upgrade` changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The version gate (or the spec's checks) refused the version. Nothing was written.
    #[error("k3s.version {to} is refused:\n{}", describe(.errors))]
    Refused { to: String, errors: SpecErrors },
    #[error(transparent)]
    Scale(#[from] ScaleError),
    #[error("reading the Nodes")]
    Nodes(#[source] ClusterError),
    /// The upgrade pre-flight found what blocks it. Nothing was written.
    #[error("the upgrade pre-flight for k3s.version {to} failed:\n{}", .blockers.join("\n"))]
    Preflight { to: String, blockers: Vec<String> },
    /// The rack or the cluster could not be observed for the pre-flight.
    #[error("observing the cluster for the pre-flight")]
    Observe(#[source] crate::workflows::error::BoxError),
}

impl UpgradeError {
    /// A refused version is the user's to fix (exit 2); a failed read may pass (exit 1).
    pub fn kind(&self) -> Kind {
        match self {
            UpgradeError::Refused { .. }
            | UpgradeError::Preflight { .. }
            | UpgradeError::Scale(ScaleError::Spec(_)) => Kind::NeedsPerson,
            UpgradeError::Scale(e) => e.kind(),
            UpgradeError::Nodes(_) | UpgradeError::Observe(_) => Kind::Retry,
        }
    }

    pub fn exit_code(&self) -> u8 {
        self.kind().exit_code()
    }
}

/// What `scale upgrade` did.
#[derive(Debug)]
pub struct UpgradeOutcome {
    /// The order of the roll, one line per phase.
    pub phases: String,
    /// False with `--dry-run`, or when `k3s.version` already was the target.
    pub written: bool,
    pub reconcile: ReconcileOutcome,
}

/// Sets `k3s.version` to `to` when the gate and the pre-flight allow it (with `dry_run`, only
/// checks and describes). A refused version writes nothing and names the field and what to
/// set; a failed pre-flight writes nothing and names what blocks.
pub async fn run<S: StateStore, C: Cluster, R: Rack, M>(
    state: &S,
    cluster: &C,
    make_rack: M,
    to: &str,
    dry_run: bool,
    now: DateTime<Utc>,
) -> Result<UpgradeOutcome, UpgradeError>
where
    M: FnOnce(&crate::base::secrets::ClusterSecrets) -> Result<R, crate::ports::rack::RackError>,
{
    scale::check_pinned(state).await?;
    let nodes = cluster.list_nodes().await.map_err(UpgradeError::Nodes)?;
    let cache = SpecCache::default();
    let set = |spec: &mut ClusterSpec| -> Result<bool, SpecErrors> {
        let changed = spec.k3s.version != to;
        spec.k3s.version = to.to_owned();
        // Everything wrong with the version at once, the gate's refusal first: a skipped
        // minor is also one this controller may know no installer for (issue 34 §7).
        let mut errors = upgrade::gate(spec, &nodes)
            .err()
            .map_or_else(Vec::new, |e| e.0);
        errors.extend(spec.validate().err().map_or_else(Vec::new, |e| e.0));
        if !errors.is_empty() {
            return Err(SpecErrors(errors));
        }
        Ok(changed)
    };
    let mut spec = scale::read_spec(state, &cache).await?;
    set(&mut spec).map_err(|errors| UpgradeError::Refused {
        to: to.to_owned(),
        errors,
    })?;
    let checked = preflight(state, make_rack, cluster, &spec, &nodes, now).await?;
    if dry_run {
        return Ok(UpgradeOutcome {
            phases: format!("{}{checked}", phases(&spec, &nodes, now)),
            written: false,
            reconcile: ReconcileOutcome::NotNeeded,
        });
    }
    // Each attempt re-checks the spec it read (another writer may have changed it).
    let (spec, written, _) =
        scale::edit_spec(state, &ScaleOptions::default(), &cache, |spec, _| {
            let changed = set(spec).map_err(|e| ScaleError::Spec(SpecLoadError::Invalid(e)))?;
            Ok((spec.clone(), changed))
        })
        .await?;
    let reconcile = if written {
        scale::trigger_reconcile(cluster).await
    } else {
        ReconcileOutcome::NotNeeded
    };
    Ok(UpgradeOutcome {
        phases: format!("{}{checked}", phases(&spec, &nodes, now)),
        written,
        reconcile,
    })
}

/// The pre-flight as a run would make it before its first new member (when this target
/// needs one): a line saying it passed, or the blockers as an error.
async fn preflight<S: StateStore, C: Cluster, R: Rack, M>(
    state: &S,
    make_rack: M,
    cluster: &C,
    spec: &ClusterSpec,
    nodes: &[Node],
    now: DateTime<Utc>,
) -> Result<String, UpgradeError>
where
    M: FnOnce(&crate::base::secrets::ClusterSecrets) -> Result<R, crate::ports::rack::RackError>,
{
    let p = upgrade::progress(spec, nodes, now, None);
    if !upgrade::needs_preflight(spec, nodes, &p, None) {
        return Ok("pre-flight: not needed (no server to upgrade, or the roll has begun)\n".into());
    }
    // The rack (each server's address) as the Secret's credentials and project reach it.
    let secrets = state
        .read_secrets()
        .await
        .map_err(|e| UpgradeError::Observe(Box::new(e)))?;
    let rack = make_rack(&secrets).map_err(|e| UpgradeError::Observe(Box::new(e)))?;
    let rack = &rack;
    let known = crate::workflows::reconcile::Known::default();
    let observed =
        crate::workflows::reconcile::observe(rack, cluster, spec, &secrets.k3s_token, known)
            .await
            .map_err(|e| UpgradeError::Observe(Box::new(e)))?;
    let blockers =
        crate::workflows::reconcile::preflight::run(rack, cluster, spec, &observed, now).await;
    if blockers.is_empty() {
        Ok(format!(
            "pre-flight: passed (every server Ready; no API that {} removes requested on any server)\n",
            spec.k3s.version
        ))
    } else {
        Err(UpgradeError::Preflight {
            to: spec.k3s.version.clone(),
            blockers,
        })
    }
}

/// The roll in order: the servers, then each worker pool, with what its Nodes run now.
pub fn phases(spec: &ClusterSpec, nodes: &[Node], now: DateTime<Utc>) -> String {
    let p: Progress = upgrade::progress(spec, nodes, now, None);
    let mut out = String::new();
    let running = |pool: &str| {
        let mut v: Vec<&str> = p
            .pools
            .iter()
            .filter(|x| x.pool == pool)
            .flat_map(|x| x.nodes.values().map(String::as_str))
            .collect();
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            "no Nodes".to_owned()
        } else {
            format!("runs {}", v.join(", "))
        }
    };
    let cp = &spec.control_plane.name;
    let mut steps: Vec<String> = spec.upgrade.path.clone();
    steps.push(spec.k3s.version.clone());
    let _ = writeln!(
        out,
        "1. control plane {cp:?} ({}): one server at a time, surge first, through {}",
        running(cp),
        steps.join(" -> ")
    );
    for (i, pool) in spec.worker_pools.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. worker pool {:?} ({}): to {} once every Ready server runs it{}",
            i + 2,
            pool.name,
            running(&pool.name),
            spec.k3s_version(pool),
            if spec.upgrade.worker_pool_concurrency > 1 {
                format!("; {} pools at a time", spec.upgrade.worker_pool_concurrency)
            } else if i > 0 {
                "; after the pool before it".to_owned()
            } else {
                String::new()
            }
        );
    }
    out
}

/// A refused version's errors, one per line, for the terminal.
pub fn describe(e: &SpecErrors) -> String {
    e.0.iter()
        .map(|SpecError { field, message }| format!("{field}: {message}"))
        .collect::<Vec<_>>()
        .join("\n")
}
