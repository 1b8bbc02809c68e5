//! The autoscaler inside a run: list the pods, let the pure [`crate::domain::autoscale::plan`]
//! decide, and hand the planner the counts and the members to remove.
//!
//! An autoscaling pool's desired count is what the autoscaler says, starting from the members
//! the pool has now (its `count` in the spec is not used while autoscaling is on: the bounds
//! are `min`/`max` and the schedule windows). The count is not written back: every run starts
//! from what exists, so a run that dies half-way leaves nothing to undo. The autoscaler's
//! memory (since when each node has been unneeded) lives in `status.json`.
//!
//! Requests: one pod listing (paged) per run while a pool autoscales; a PersistentVolume
//! listing only when some pod mounts a claim (the volume rules need the volumes' node
//! affinity); a PodDisruptionBudget listing only in a run where a node with pods to move could
//! be removed, or would be but for a `kube-system` pod. A spec without autoscaling makes none.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::ReconcileError;
use crate::domain::autoscale::{
    self, AutoscaleState, NodeView, Outcome, PodView, PoolView, observe,
};
use crate::domain::plan::{self, Finding, Observed};
use crate::domain::spec::{ClusterSpec, Role};
use crate::ports::cluster::{Cluster, ClusterError, EventType};

/// Some worker pool has autoscaling on.
pub fn active(spec: &ClusterSpec) -> bool {
    spec.worker_pools
        .iter()
        .any(|p| p.autoscale.as_ref().is_some_and(|a| a.enabled))
}

/// What the autoscaler made of this run.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The spec to plan with: autoscaling pools' counts replaced.
    pub spec: ClusterSpec,
    /// Instances the autoscaler removes (their nodes were unneeded long enough).
    pub victims: BTreeSet<String>,
    /// Instances whose autoscaler removal is given up (it did not finish in time).
    pub given_up: BTreeSet<String>,
    pub outcome: Outcome,
}

/// Observes the pods (and, when a removal depends on them, the budgets) and decides. `None`
/// when no pool autoscales: nothing is listed then.
pub async fn decide<C: Cluster>(
    cluster: &C,
    spec: &ClusterSpec,
    observed: &Observed,
    previous: Option<&AutoscaleState>,
    now: DateTime<Utc>,
) -> Result<Option<Decided>, ReconcileError> {
    if !active(spec) {
        return Ok(None);
    }
    let listing = |e: ClusterError| {
        ReconcileError::Retryable(crate::workflows::error::context("listing pods", e))
    };
    let pods = cluster.list_pods().await.map_err(listing)?;
    let pvs = if pods.iter().any(observe::mounts_claims) {
        cluster.list_pvs().await.map_err(listing)?
    } else {
        Vec::new()
    };
    let (pools, nodes) = views(spec, observed, now);
    let prev = previous.cloned().unwrap_or_default();
    let pod_views = |pdbs: &[_]| -> Vec<PodView> {
        pods.iter()
            .filter_map(|p| observe::pod_view(p, pdbs, &pvs))
            .collect()
    };
    let mut outcome = autoscale::plan(&pools, &nodes, &pod_views(&[]), &prev, now);
    if outcome.wants_budgets
        || outcome
            .kept
            .values()
            .any(|why| why.ends_with(autoscale::NO_PDB))
    {
        let pdbs = cluster.list_pdbs().await.map_err(listing)?;
        outcome = autoscale::plan(&pools, &nodes, &pod_views(&pdbs), &prev, now);
    }
    Ok(Some(apply_to_spec(spec, &pools, outcome)))
}

/// The pure part of [`decide`]: the autoscaler's views of the pools and nodes.
pub fn views(
    spec: &ClusterSpec,
    observed: &Observed,
    now: DateTime<Utc>,
) -> (Vec<PoolView>, Vec<NodeView>) {
    let members = plan::classify(spec, observed, now);
    let pool_of: BTreeMap<&str, &str> = members
        .iter()
        .map(|m| (m.instance.name.as_str(), m.pool.as_str()))
        .collect();
    let pools = spec
        .worker_pools
        .iter()
        .filter(|p| p.autoscale.is_some())
        .map(|p| PoolView {
            name: p.name.clone(),
            // Members that are or will be: a broken one is replaced at the same count.
            count: members
                .iter()
                .filter(|m| m.pool == p.name && (m.health.counts() || m.health.is_broken()))
                .count() as u32,
            min: p.min,
            max: p.max,
            cpus: p.cpus,
            memory: p.memory.bytes(),
            labels: p.labels.clone(),
            taints: p.taints.clone(),
            autoscale: p.autoscale.clone(),
        })
        .collect();
    let nodes = observed
        .nodes
        .iter()
        .map(|n| {
            let pool = pool_of
                .get(n.name.as_str())
                .filter(|p| matches!(spec.pool(p), Some((Role::Worker, _))))
                .map(|p| (*p).to_owned());
            observe::node_view(n, pool)
        })
        .collect();
    (pools, nodes)
}

/// Puts the outcome into a spec to plan with.
fn apply_to_spec(spec: &ClusterSpec, pools: &[PoolView], outcome: Outcome) -> Decided {
    let mut spec = spec.clone();
    let mut victims = BTreeSet::new();
    let given_up = outcome.given_up.iter().cloned().collect();
    for view in pools
        .iter()
        .filter(|p| p.autoscale.as_ref().is_some_and(|a| a.enabled))
    {
        let decision = outcome.decisions.iter().find(|d| d.pool == view.name);
        let Some(pool) = spec.worker_pools.iter_mut().find(|p| p.name == view.name) else {
            continue;
        };
        pool.count = decision.map_or(view.count, |d| d.to);
        victims.extend(decision.and_then(|d| d.remove_node.clone()));
    }
    Decided {
        spec,
        victims,
        given_up,
        outcome,
    }
}

/// The outcome as plan findings (shown by `--dry-run` and kept in `status.json`).
pub fn findings(outcome: &Outcome) -> Vec<Finding> {
    let decisions = outcome.decisions.iter().map(|d| Finding {
        degraded: false,
        message: format!(
            "autoscale: pool {:?} {} -> {}: {}",
            d.pool, d.from, d.to, d.reason
        ),
    });
    let unhostable = outcome.unhostable.iter().map(|u| Finding {
        degraded: false,
        message: format!(
            "autoscale: pod {} cannot be hosted by any worker pool: {}",
            u.pod, u.reason
        ),
    });
    let more = (!outcome.unhostable_more.is_empty()).then(|| {
        let total: u32 = outcome.unhostable_more.values().sum();
        let mut owners: Vec<(&String, &u32)> = outcome.unhostable_more.iter().collect();
        owners.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let shown: Vec<String> = owners
            .iter()
            .take(3)
            .map(|(o, n)| format!("{n} of {o}"))
            .collect();
        Finding {
            degraded: false,
            message: format!(
                "autoscale: {total} more pod(s) cannot be hosted by any worker pool ({}{})",
                shown.join(", "),
                if owners.len() > 3 { ", ..." } else { "" }
            ),
        }
    });
    let given_up = outcome.given_up.iter().map(|n| Finding {
        degraded: false,
        message: format!(
            "autoscale: the removal of {n} did not finish in time; it is uncordoned and left \
             alone for five minutes"
        ),
    });
    decisions
        .chain(unhostable)
        .chain(more)
        .chain(given_up)
        .collect()
}

/// Records an Event per scale decision, and per pod newly found unhostable (not again on
/// every run while it stays so). Best effort, like the apply Events.
pub async fn record_events<C: Cluster>(cluster: &C, outcome: &Outcome, previous: Option<&Outcome>) {
    for d in &outcome.decisions {
        let reason = if d.to > d.from {
            "AutoscaleUp"
        } else {
            "AutoscaleDown"
        };
        let message = format!(
            "pool {}: {} -> {} workers: {}",
            d.pool, d.from, d.to, d.reason
        );
        if let Err(e) = cluster
            .record_event(EventType::Normal, reason, &message)
            .await
        {
            tracing::warn!(error = %e, "could not record event");
        }
    }
    let known: BTreeSet<&str> = previous
        .into_iter()
        .flat_map(|p| p.unhostable.iter().map(|u| u.pod.as_str()))
        .collect();
    for u in outcome
        .unhostable
        .iter()
        .filter(|u| !known.contains(u.pod.as_str()))
    {
        let message = format!(
            "pod {} cannot be hosted by any worker pool: {}",
            u.pod, u.reason
        );
        if let Err(e) = cluster
            .record_event(EventType::Warning, "AutoscaleUnhostable", &message)
            .await
        {
            tracing::warn!(error = %e, "could not record event");
        }
    }
}

/// One line for the run summary: `workers 1->5 (reason); ...`, or empty.
pub fn summary(outcome: &Outcome) -> String {
    outcome
        .decisions
        .iter()
        .map(|d| format!("{} {}->{} ({})", d.pool, d.from, d.to, d.reason))
        .chain((!outcome.unhostable.is_empty()).then(|| {
            let more: u32 = outcome.unhostable_more.values().sum();
            format!(
                "{} unhostable pod(s)",
                outcome.unhostable.len() + more as usize
            )
        }))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::autoscale::{AutoscaleSpec, Resources};
    use chrono::TimeZone;

    /// 10,000 pods pending on a pool at max: what status carries of the outcome (the outcome
    /// and its findings) stays under 256 KiB, far below the ConfigMap's 1 MiB.
    #[test]
    fn status_stays_small_with_ten_thousand_pending_pods() {
        let pool = PoolView {
            name: "workers".into(),
            count: 3,
            min: 1,
            max: 3,
            cpus: 2,
            memory: 4 << 30,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            autoscale: Some(AutoscaleSpec::default()),
        };
        let nodes: Vec<NodeView> = (1..=3)
            .map(|i| NodeView {
                name: format!("w{i}"),
                pool: Some("workers".into()),
                allocatable: pool.allocatable(),
                max_pods: 110,
                ..NodeView::default()
            })
            .collect();
        let mut pods: Vec<PodView> = (1..=3)
            .map(|i| PodView {
                namespace: "default".into(),
                name: format!("busy-{i}"),
                requests: Resources {
                    cpu_milli: 1900,
                    memory: 64 << 20,
                },
                node: Some(format!("w{i}")),
                controller_kind: Some("ReplicaSet".into()),
                ..PodView::default()
            })
            .collect();
        pods.extend((0..10_000).map(|i| PodView {
            namespace: "batch".into(),
            name: format!("job-worker-{i:05}-abcde"),
            requests: Resources {
                cpu_milli: 500,
                memory: 64 << 20,
            },
            unschedulable: true,
            controller_kind: Some("Job".into()),
            owner: Some(format!("batch/Job/job-{}", i % 3)),
            ..PodView::default()
        }));
        let now = Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap();
        let out = autoscale::plan(&[pool], &nodes, &pods, &AutoscaleState::default(), now);
        let found: Vec<String> = findings(&out).into_iter().map(|f| f.message).collect();
        let size = serde_json::to_string_pretty(&out).map_or(usize::MAX, |j| j.len())
            + serde_json::to_string_pretty(&found).map_or(usize::MAX, |j| j.len());
        println!("10,000 pending pods -> {size} bytes of status.json");
        assert!(size < 256 << 10, "{size} bytes");
        assert!(
            found
                .iter()
                .any(|f| f.contains("9900 more pod(s)") && f.contains("of batch/Job/job-")),
            "{found:?}"
        );
        assert_eq!(summary(&out), "10000 unhostable pod(s)");
    }
}
