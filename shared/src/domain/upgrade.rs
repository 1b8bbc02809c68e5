//! Kubernetes upgrades in the order Kubernetes supports (issue 33): the version gate a spec
//! must pass before anything rolls or writes it ([`gate`]), and the version each pool rolls
//! to in this run ([`progress`], [`effective_spec`]): the servers first, one minor at a time,
//! then the worker pools in spec order, `upgrade.worker_pool_concurrency` at a time.
//!
//! The rules are the Kubernetes version-skew policy (kubelet never newer than kube-apiserver
//! and at most three minors older; kube-apiserver never skips a minor; control-plane
//! downgrades unsupported) and k3s's upgrade order (servers one at a time, then agents; the
//! agents' `prepare` step waits for every server's `kubeletVersion`). Sources: docs/DESIGN-NOTES.md
//! "Upgrades".
//!
//! Pure: the inputs are the spec and the Nodes (pool label, readiness, `kubeletVersion`).
//! Reading the Nodes is the workflows'; what to create or remove is the planner's, which
//! plans the effective spec this module returns: a worker pool that must wait keeps its old
//! version there, so its members are not drifted and a scale-up gets the old version too.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::model::Node;
use crate::domain::spec::upgrade::K3sVersion;
use crate::domain::spec::{ClusterSpec, POOL_LABEL, PoolSpec, SpecError, SpecErrors};

/// Kubelets may be this many minors older than kube-apiserver (version-skew policy).
pub const MAX_KUBELET_SKEW: i64 = 3;

/// The upgrade under way, as `status.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// What the oldest server ran when the upgrade was first seen.
    pub from: String,
    /// `k3s.version`.
    pub to: String,
    pub phase: Phase,
    pub started_at: DateTime<Utc>,
    /// What keeps the upgrade from going on (the pre-flight's blockers), if anything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<String>,
}

/// Where an upgrade is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// The pre-flight checks ([`preflight`]) have not passed yet: nothing rolls.
    Preflight,
    /// Servers are rolled, one at a time; every worker pool keeps its version.
    ControlPlane,
    /// Every server runs the target; worker pools roll in spec order.
    Workers,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Preflight => "preflight",
            Phase::ControlPlane => "control-plane",
            Phase::Workers => "workers",
        })
    }
}

/// One pool's versions: what the spec asks, what it rolls to in this run, what each Node runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolVersions {
    pub pool: String,
    /// The spec's version for the pool.
    pub target: String,
    /// The version this run rolls the pool to and gives its new members.
    pub rolling_to: String,
    /// Why `rolling_to` is not `target` yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// Each of the pool's Nodes and its kubelet version (`?` when it reports none).
    pub nodes: BTreeMap<String, String>,
}

/// Versions in this run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// None while every Node runs its pool's version (or no server reports one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
    pub pools: Vec<PoolVersions>,
}

/// A pool's Nodes that are not being removed, with their parsed kubelet versions.
fn pool_nodes<'a>(nodes: &'a [Node], pool: &str) -> Vec<(&'a Node, Option<K3sVersion>)> {
    nodes
        .iter()
        .filter(|n| n.labels.get(POOL_LABEL).map(String::as_str) == Some(pool))
        .map(|n| (n, n.kubelet_version.as_deref().and_then(K3sVersion::parse)))
        .collect()
}

/// A Node's name and the version it reports.
type Named<'a> = (&'a str, &'a K3sVersion);

/// The Nodes of `pool` that report a version, oldest and newest with their names.
fn span<'a>(seen: &'a [(&Node, Option<K3sVersion>)]) -> Option<(Named<'a>, Named<'a>)> {
    let known = || {
        seen.iter()
            .filter_map(|(n, v)| v.as_ref().map(|v| (n.name.as_str(), v)))
    };
    Some((
        known().min_by(|a, b| a.1.cmp(b.1))?,
        known().max_by(|a, b| a.1.cmp(b.1))?,
    ))
}

/// Checks `spec` against what the Nodes run. A refused spec names each field and what to
/// set; nothing may roll or be written with it. Rules: the control plane neither goes down
/// (semver, then the k3s build) nor skips a minor unless `upgrade.path` lists a release per
/// skipped minor; every worker pool stays within three minors below `k3s.version` and never
/// above, and its kubelets are not downgraded; a control-plane override equals
/// `k3s.version`.
pub fn gate(spec: &ClusterSpec, nodes: &[Node]) -> Result<(), SpecErrors> {
    let mut errs = Vec::new();
    let mut err = |field: String, message: String| errs.push(SpecError { field, message });
    if let Some(v) = spec
        .control_plane
        .k3s_version
        .as_ref()
        .filter(|v| **v != spec.k3s.version)
    {
        err(
            "control_plane.k3s_version".into(),
            format!(
                "{v} differs from k3s.version {}: the servers run k3s.version; remove control_plane.k3s_version (or set k3s.version to {v})",
                spec.k3s.version
            ),
        );
    }
    match K3sVersion::parse(&spec.k3s.version) {
        Some(target) => {
            gate_servers(spec, &target, nodes, &mut err);
            gate_path(spec, &target, nodes, &mut err);
            gate_etcd(spec, &target, nodes, &mut err);
            for pool in &spec.worker_pools {
                gate_worker_pool(spec, pool, &target, nodes, &mut err);
            }
        }
        None => err(
            "k3s.version".into(),
            format!(
                "{:?} is not a k3s release like v1.34.1+k3s1, so the upgrade order cannot compare it",
                spec.k3s.version
            ),
        ),
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SpecErrors(errs))
    }
}

/// No control-plane downgrade, no skipped minor (without `upgrade.path`), at most three
/// minors in one change while worker pools wait.
fn gate_servers(
    spec: &ClusterSpec,
    target: &K3sVersion,
    nodes: &[Node],
    err: &mut impl FnMut(String, String),
) {
    let servers = pool_nodes(nodes, &spec.control_plane.name);
    let Some(((_, oldest), (newest_name, newest))) = span(&servers) else {
        return;
    };
    if newest > target {
        err(
            "k3s.version".into(),
            format!(
                "{target} is older than {newest}, which server {newest_name} runs: Kubernetes does not support downgrading the control plane. Set k3s.version to {newest} (or newer); to roll back, restore the etcd snapshot taken before the upgrade (README \"Upgrading Kubernetes\")"
            ),
        );
        return;
    }
    let steps = oldest.minors_to(target);
    if oldest.major != target.major {
        err(
            "k3s.version".into(),
            format!("{target} is another major version than {oldest}, which the servers run"),
        );
        return;
    }
    let missing: Vec<String> = (oldest.minor + 1..target.minor)
        .filter(|m| {
            !spec
                .upgrade
                .path
                .iter()
                .filter_map(|p| K3sVersion::parse(p))
                .any(|p| p.major == target.major && p.minor == *m)
        })
        .map(|m| format!("v{}.{m}", target.major))
        .collect();
    if !missing.is_empty() {
        err(
            "k3s.version".into(),
            format!(
                "{target} is {steps} minors above {oldest}, which the servers run: the control plane upgrades one minor at a time. Set k3s.version to a v{}.{} release first, or list one release per skipped minor in upgrade.path (missing: {})",
                target.major,
                oldest.minor + 1,
                missing.join(", ")
            ),
        );
    } else if steps > MAX_KUBELET_SKEW && !spec.worker_pools.is_empty() {
        err(
            "k3s.version".into(),
            format!(
                "{target} is {steps} minors above {oldest}, which the servers run: workers keep their version until the servers are done and may be at most {MAX_KUBELET_SKEW} minors older; upgrade at most {MAX_KUBELET_SKEW} minors per change"
            ),
        );
    }
}

/// `upgrade.path`: ascending, and below `k3s.version`; entries the servers passed are done.
fn gate_path(
    spec: &ClusterSpec,
    target: &K3sVersion,
    nodes: &[Node],
    err: &mut impl FnMut(String, String),
) {
    let servers = pool_nodes(nodes, &spec.control_plane.name);
    let oldest = span(&servers).map(|((_, o), _)| o.clone());
    let mut previous: Option<K3sVersion> = None;
    for (i, v) in spec.upgrade.path.iter().enumerate() {
        let Some(v) = K3sVersion::parse(v) else {
            continue;
        };
        if v >= *target {
            err(
                format!("upgrade.path[{i}]"),
                format!("{v} is not below k3s.version {target}; list only the releases before it"),
            );
        } else if previous.as_ref().is_some_and(|p| v <= *p) {
            err(
                format!("upgrade.path[{i}]"),
                "the path must go up, oldest release first".into(),
            );
        } else if let Some(p) = previous
            .as_ref()
            .filter(|p| oldest.as_ref().is_none_or(|o| *p > o))
            .filter(|p| p.minors_to(&v) > 1)
        {
            err(
                format!("upgrade.path[{i}]"),
                format!("{v} is more than one minor above {p}, the release before it"),
            );
        }
        previous = Some(v);
    }
}

/// etcd 3.5 → 3.6 only from etcd v3.5.26 ([`etcd`]): the servers walk `upgrade.path`, then
/// `k3s.version`; the first step whose release bundles etcd 3.6 must come after releases whose
/// etcd is v3.5.26 or newer (the servers' own releases for the first step, else the path
/// entry before it). Only that first 3.6 step is checked: after it every member is 3.6.
fn gate_etcd(
    spec: &ClusterSpec,
    target: &K3sVersion,
    nodes: &[Node],
    err: &mut impl FnMut(String, String),
) {
    let servers = pool_nodes(nodes, &spec.control_plane.name);
    let Some(((_, oldest), _)) = span(&servers) else {
        return;
    };
    let oldest = oldest.clone();
    let mut steps: Vec<(String, K3sVersion)> = spec
        .upgrade
        .path
        .iter()
        .enumerate()
        .filter_map(|(i, p)| K3sVersion::parse(p).map(|v| (format!("upgrade.path[{i}]"), v)))
        .filter(|(_, v)| *v > oldest && v < target)
        .collect();
    steps.push(("k3s.version".into(), target.clone()));
    // Who runs what before the step: the servers, then the path entry the servers reached.
    let mut before: Vec<(String, K3sVersion)> = servers
        .iter()
        .filter_map(|(n, v)| {
            v.clone()
                .map(|v| (format!("server {} runs {v}", n.name), v))
        })
        .collect();
    before.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    for (field, step) in steps {
        let bundled = etcd::bundled_etcd(&step);
        if !bundled.is_36() {
            before = vec![(
                format!("the servers come to it from upgrade.path's {step}"),
                step,
            )];
            continue;
        }
        if let Some((who, v)) = before
            .iter()
            .find(|(_, v)| *v < step && !etcd::bundled_etcd(v).may_take_36())
        {
            err(
                field,
                format!(
                    "{step} bundles {bundled}, and {who}, which bundles {}: a new etcd 3.6 member joins only a cluster on etcd v3.5.26 or newer (etcd's zombie-member fix, etcd-io/etcd#20995; k3s-io/k3s#13271: the new server sees an unhealthy cluster and fails to join). Roll the servers to {} first: set k3s.version to it, or list it in upgrade.path before {step} (README \"Upgrading Kubernetes\")",
                    etcd::bundled_etcd(v),
                    etcd::safe_step_hint(v),
                ),
            );
        }
        return;
    }
}

/// A worker pool's version: within three minors below `k3s.version`, never above, and not
/// below what its kubelets run.
fn gate_worker_pool(
    spec: &ClusterSpec,
    pool: &PoolSpec,
    target: &K3sVersion,
    nodes: &[Node],
    err: &mut impl FnMut(String, String),
) {
    let field = match &pool.k3s_version {
        Some(_) => format!("worker_pools.{}.k3s_version", pool.name),
        None => "k3s.version".to_owned(),
    };
    let version = spec.k3s_version(pool);
    let Some(v) = K3sVersion::parse(version) else {
        err(
            field,
            format!("{version:?} is not a k3s release like v1.34.1+k3s1"),
        );
        return;
    };
    if v > *target {
        err(
            field,
            format!(
                "{v} is newer than the control plane's k3s.version {target}: a kubelet must not be newer than kube-apiserver; set it to {target} or older, or remove it"
            ),
        );
        return;
    }
    if v.minors_to(target) > MAX_KUBELET_SKEW {
        err(
            field,
            format!(
                "{v} is more than {MAX_KUBELET_SKEW} minors below the control plane's k3s.version {target}; set it to v{}.{} or newer",
                target.major,
                target.minor.saturating_sub(3)
            ),
        );
        return;
    }
    let seen = pool_nodes(nodes, &pool.name);
    if let Some((_, (name, newest))) = span(&seen)
        && *newest > v
    {
        err(
            field,
            format!(
                "{v} is older than {newest}, which {name} of pool {:?} runs: kubelets are not downgraded; set it to {newest} or newer",
                pool.name
            ),
        );
    }
}

/// The versions this run rolls each pool to, and where the upgrade is. `previous` is the
/// last run's record (its `from` and `startedAt` stay while the target does). Without any
/// server reporting a version, every pool rolls to its target (nothing to order by).
pub fn progress(
    spec: &ClusterSpec,
    nodes: &[Node],
    now: DateTime<Utc>,
    previous: Option<&UpgradeStatus>,
) -> Progress {
    let servers = pool_nodes(nodes, &spec.control_plane.name);
    let target = K3sVersion::parse(&spec.k3s.version);
    let oldest = span(&servers).map(|((_, o), _)| o.clone());
    // The servers walk `upgrade.path`: the first step above the oldest server.
    let cp_to = match (&target, &oldest) {
        (Some(t), Some(o)) => {
            let mut steps: Vec<K3sVersion> = spec
                .upgrade
                .path
                .iter()
                .filter_map(|p| K3sVersion::parse(p))
                .filter(|p| p < t)
                .collect();
            steps.push(t.clone());
            steps.sort();
            steps
                .into_iter()
                .find(|s| s > o)
                .map_or_else(|| spec.k3s.version.clone(), |s| s.to_string())
        }
        _ => spec.k3s.version.clone(),
    };
    let cp_waiting = (cp_to != spec.k3s.version)
        .then(|| "the servers walk upgrade.path, one minor at a time".to_owned());
    let mut pools = vec![versions(
        &spec.control_plane,
        &spec.k3s.version,
        &servers,
        cp_to,
        cp_waiting,
    )];
    // The oldest Ready server: workers may run up to it.
    let floor = servers
        .iter()
        .filter(|(n, _)| n.is_ready())
        .filter_map(|(_, v)| v.clone())
        .min()
        .or(oldest.clone());
    let mut slots = spec.upgrade.worker_pool_concurrency.max(1);
    let mut workers_pending = false;
    for pool in &spec.worker_pools {
        let seen = pool_nodes(nodes, &pool.name);
        let (to, waiting, done) = worker_rolls_to(spec, pool, &seen, floor.as_ref(), &mut slots);
        workers_pending |= !done;
        pools.push(versions(pool, spec.k3s_version(pool), &seen, to, waiting));
    }
    let phase = match (&target, &oldest) {
        (Some(t), Some(o)) if o < t => Some(Phase::ControlPlane),
        (Some(_), Some(_)) if workers_pending => Some(Phase::Workers),
        _ => None,
    };
    let upgrade = phase.map(|phase| {
        let kept = previous.filter(|p| p.to == spec.k3s.version);
        let from = match (kept, &oldest) {
            (Some(p), _) => p.from.clone(),
            (None, Some(o)) if phase == Phase::ControlPlane => o.to_string(),
            _ => oldest_worker(&pools).unwrap_or_else(|| spec.k3s.version.clone()),
        };
        UpgradeStatus {
            from,
            to: spec.k3s.version.clone(),
            phase,
            started_at: kept.map_or(now, |p| p.started_at),
            blocked: Vec::new(),
        }
    });
    Progress { upgrade, pools }
}

/// The oldest version a worker Node reports.
fn oldest_worker(pools: &[PoolVersions]) -> Option<String> {
    pools
        .iter()
        .skip(1)
        .flat_map(|p| p.nodes.values())
        .filter_map(|v| K3sVersion::parse(v))
        .min()
        .map(|v| v.to_string())
}

/// A worker pool's version this run: its target once the oldest Ready server runs at least
/// that and one of the `slots` is free (pools in spec order); else the version it keeps.
/// Returns (version, why it waits, whether the pool is already at its target).
fn worker_rolls_to(
    spec: &ClusterSpec,
    pool: &PoolSpec,
    seen: &[(&Node, Option<K3sVersion>)],
    floor: Option<&K3sVersion>,
    slots: &mut u32,
) -> (String, Option<String>, bool) {
    let version = spec.k3s_version(pool).to_owned();
    let (Some(target), Some(floor)) = (K3sVersion::parse(&version), floor) else {
        return (version, None, true);
    };
    let live = || seen.iter().filter(|(n, _)| !n.being_removed());
    let done = live().all(|(_, v)| v.as_ref() == Some(&target));
    if *floor >= target && (done || *slots > 0) {
        if !done {
            *slots -= 1;
        }
        return (version, None, done);
    }
    // What it keeps: its oldest Node's version, never above the oldest Ready server.
    let kept = live()
        .filter_map(|(_, v)| v.clone())
        .min()
        .map_or_else(|| floor.clone(), |v| v.min(floor.clone()))
        .min(target.clone());
    let why = if *floor < target {
        format!("every Ready server runs {version} (the oldest runs {floor})")
    } else {
        format!(
            "the worker pools before it are done (upgrade.worker_pool_concurrency {})",
            spec.upgrade.worker_pool_concurrency
        )
    };
    (kept.to_string(), Some(why), done)
}

/// A pool's [`PoolVersions`].
fn versions(
    pool: &PoolSpec,
    target: &str,
    seen: &[(&Node, Option<K3sVersion>)],
    rolling_to: String,
    waiting_for: Option<String>,
) -> PoolVersions {
    PoolVersions {
        pool: pool.name.clone(),
        target: target.to_owned(),
        rolling_to,
        waiting_for,
        nodes: seen
            .iter()
            .map(|(n, _)| {
                (
                    n.name.clone(),
                    n.kubelet_version.clone().unwrap_or_else(|| "?".into()),
                )
            })
            .collect(),
    }
}

/// The spec the planner plans this run: every pool at the version it rolls to now (its
/// members at that version are not drifted, and its new members get it).
pub fn effective_spec(spec: &ClusterSpec, progress: &Progress) -> ClusterSpec {
    let mut out = spec.clone();
    for pv in &progress.pools {
        if pv.pool == spec.control_plane.name {
            out.k3s.version.clone_from(&pv.rolling_to);
            out.control_plane.k3s_version = None;
        } else if let Some(p) = out.worker_pools.iter_mut().find(|p| p.name == pv.pool) {
            // Pinned explicitly: the control plane's version may differ from `k3s.version`.
            p.k3s_version = Some(pv.rolling_to.clone());
        }
    }
    out
}

/// The degraded finding of a blocked upgrade: `UpgradeBlocked: pre-flight: <blockers>`.
pub fn blocked_finding(progress: &Progress) -> Option<String> {
    let u = progress
        .upgrade
        .as_ref()
        .filter(|u| !u.blocked.is_empty())?;
    Some(format!(
        "{}: pre-flight: {} (upgrade {} -> {}; nothing rolls until it passes)",
        preflight::FAILED_REASON,
        u.blocked.join("; "),
        u.from,
        u.to
    ))
}

/// What the run notices about the upgrade: which pools wait, and for what.
pub fn findings(progress: &Progress) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(u) = &progress.upgrade {
        out.push(format!(
            "upgrading {} -> {}: phase {}",
            u.from, u.to, u.phase
        ));
    }
    // The blockers are the Degraded finding's (see `blocked_finding`).
    for (i, p) in progress.pools.iter().enumerate() {
        match &p.waiting_for {
            // The control plane comes first in `pools`.
            Some(why) if i == 0 => out.push(format!(
                "pool {:?} rolls to {} first: {why}",
                p.pool, p.rolling_to
            )),
            Some(why) => out.push(format!(
                "pool {:?} stays at {} (also for new members) until {why}",
                p.pool, p.rolling_to
            )),
            None => {}
        }
    }
    out
}

/// Whether this run must pass the pre-flight before the roll goes on: the servers are to be
/// upgraded, none runs the version they roll to yet (no new-version member joined), and no
/// earlier run passed the pre-flight for this `k3s.version` (`previous`). Once per target.
pub fn needs_preflight(
    spec: &ClusterSpec,
    nodes: &[Node],
    progress: &Progress,
    previous: Option<&UpgradeStatus>,
) -> bool {
    let Some(u) = &progress.upgrade else {
        return false;
    };
    let passed = previous.is_some_and(|p| p.to == spec.k3s.version && p.phase != Phase::Preflight);
    let cp_to = progress
        .pools
        .first()
        .and_then(|p| K3sVersion::parse(&p.rolling_to));
    let servers = pool_nodes(nodes, &spec.control_plane.name);
    let started = servers
        .iter()
        .any(|(_, v)| v.is_some() && v.as_ref() >= cp_to.as_ref());
    u.phase == Phase::ControlPlane && !passed && !started
}

/// A failed pre-flight: nothing rolls. The servers stay at the newest version they run (no
/// member of the target is created; a broken member is replaced at that version), every
/// worker pool keeps its version as it does while the servers are behind, and the upgrade
/// is recorded in phase `preflight` with its `blockers`.
pub fn hold_for_preflight(
    spec: &ClusterSpec,
    nodes: &[Node],
    progress: &mut Progress,
    blockers: Vec<String>,
) {
    let servers = pool_nodes(nodes, &spec.control_plane.name);
    let held = span(&servers).map(|(_, (_, newest))| newest.to_string());
    if let (Some(cp), Some(held)) = (progress.pools.first_mut(), held) {
        cp.rolling_to = held;
        cp.waiting_for = Some(format!(
            "the upgrade pre-flight for {} to pass",
            spec.k3s.version
        ));
    }
    if let Some(u) = progress.upgrade.as_mut() {
        u.phase = Phase::Preflight;
        u.blocked = blockers;
    }
}

pub mod channel;
pub mod etcd;
pub mod preflight;

#[cfg(test)]
mod tests;
