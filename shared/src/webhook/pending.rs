//! Reconcile runs triggered by pending pods: `scale serve` watches for pods the scheduler
//! marks unschedulable and starts the on-demand reconcile Job for them, so the autoscaler
//! acts within seconds instead of at the next CronJob tick.
//!
//! - **Only while a pool autoscales.** The spec is read every [`PendingOptions::recheck`];
//!   with no pool autoscaling no watch is open.
//! - **One watch, resumed.** A list of the cluster's unscheduled pending pods
//!   (`status.phase=Pending,spec.nodeName=`), then a watch from its resourceVersion with
//!   bookmarks; an expired resourceVersion (410) relists, a watch that ends resumes from the
//!   last version seen.
//! - **New pods only.** A pod counts once, when it is first seen with `PodScheduled=False`,
//!   reason `Unschedulable` (the scheduler's mark); pods the last run called unhostable
//!   (`status.json` `autoscale.unhostable`, or a pod of an owner counted in
//!   `autoscale.unhostableMore`) do not count at all.
//! - **Batched like Karpenter.** A trigger fires [`PendingOptions::quiet`] after the last new
//!   pending pod, or [`PendingOptions::max_wait`] after the first, whichever is sooner
//!   (Karpenter's `BATCH_IDLE_DURATION` and `BATCH_MAX_DURATION` defaults, 1 s and 10 s:
//!   karpenter.sh/docs/reference/settings), into the one on-demand Job that
//!   REST triggers use, so a burst becomes one run.
//! - **Never over a run.** While a reconcile run holds the Lease the batch waits; when the
//!   Lease is free the trigger fires for the pods still pending.
//!
//! Scale-down stays on the CronJob's schedule: it needs the unneeded delay anyway.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde::Serialize;
use tokio::time::Instant;

use super::Deps;
use crate::domain::spec::ClusterSpec;
use crate::domain::status::Status;
use crate::ports::cluster::Cluster;
use crate::ports::state::StateStore;
use crate::workflows::scale::ReconcileOutcome;

/// Pods no node has been chosen for yet, still pending.
pub const FIELD_SELECTOR: &str = "status.phase=Pending,spec.nodeName=";

/// Knobs of the pending-pod trigger.
#[derive(Debug, Clone, Copy)]
pub struct PendingOptions {
    /// Fire this long after the last new pending pod...
    pub quiet: Duration,
    /// ...or this long after the first, whichever comes first.
    pub max_wait: Duration,
    /// How often the spec is read again (autoscaling switched on or off).
    pub recheck: Duration,
    /// How often a due batch looks at the Lease again while a run holds it.
    pub lease_poll: Duration,
}

impl Default for PendingOptions {
    fn default() -> Self {
        PendingOptions {
            quiet: Duration::from_secs(1),
            max_wait: Duration::from_secs(10),
            recheck: Duration::from_secs(30),
            lease_poll: Duration::from_secs(2),
        }
    }
}

/// New pending pods waiting for their trigger.
#[derive(Debug, Default)]
pub struct Batch {
    first: Option<Instant>,
    last: Option<Instant>,
    pods: BTreeSet<String>,
}

impl Batch {
    /// Adds a newly seen pending pod (`namespace/name`).
    pub fn add(&mut self, pod: String, now: Instant) {
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.pods.insert(pod);
    }

    /// Forgets a pod that went away (scheduled, deleted) before the trigger.
    pub fn remove(&mut self, pod: &str) {
        self.pods.remove(pod);
        if self.pods.is_empty() {
            *self = Batch::default();
        }
    }

    /// Whether the batch should fire now.
    pub fn due(&self, now: Instant, opts: &PendingOptions) -> bool {
        match (self.first, self.last) {
            (Some(first), Some(last)) => {
                now.duration_since(last) >= opts.quiet || now.duration_since(first) >= opts.max_wait
            }
            _ => false,
        }
    }

    /// The pods, emptying the batch.
    pub fn take(&mut self) -> BTreeSet<String> {
        let pods = std::mem::take(&mut self.pods);
        *self = Batch::default();
        pods
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// `namespace/name` of a pod.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The scheduler tried and found no node: `PodScheduled=False`, reason `Unschedulable`
/// (kubernetes `pkg/scheduler/schedule_one.go` `handleSchedulingFailure`), not yet bound
/// and not being deleted.
pub fn unschedulable(pod: &Pod) -> bool {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    !bound
        && pod.metadata.deletion_timestamp.is_none()
        && scheduled
            .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
}

/// What the trigger last did, for `GET /status` and the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastTrigger {
    pub at: DateTime<Utc>,
    /// `pending_pods`, `scale_change` or `manual`.
    pub reason: String,
    /// Why, in words (for pending pods: how many and the first few).
    pub detail: String,
    /// `triggered`, `pending` (a run was already waiting or under way), `failed`, ...
    pub outcome: String,
}

/// Whether the spec has a pool that autoscales.
fn autoscaling(spec: &ClusterSpec) -> bool {
    crate::workflows::reconcile::autoscale_active(spec)
}

/// The watch loop; runs until `shutdown` completes. Errors are logged and retried with a
/// pause: the webhook keeps serving whatever happens here.
pub async fn run<S, C, F>(
    client: kube::Client,
    deps: Arc<Deps<S, C>>,
    opts: PendingOptions,
    shutdown: F,
) where
    S: StateStore + 'static,
    C: Cluster + 'static,
    F: std::future::Future<Output = ()>,
{
    tokio::pin!(shutdown);
    let mut w = Watcher {
        api: Api::all(client),
        deps,
        opts,
        rv: None,
        seen: BTreeSet::new(),
        owners: BTreeMap::new(),
        batch: Batch::default(),
        watching: false,
        hold_until: None,
    };
    tokio::select! {
        () = &mut shutdown => {}
        () = w.forever() => {}
    }
}

struct Watcher<S, C> {
    api: Api<Pod>,
    deps: Arc<Deps<S, C>>,
    opts: PendingOptions,
    /// Where the watch resumes; `None` relists.
    rv: Option<String>,
    /// Pending pods already counted (a pod triggers once).
    seen: BTreeSet<String>,
    /// Controlling owner of each seen pod (`namespace/Kind/name`).
    owners: BTreeMap<String, String>,
    batch: Batch,
    watching: bool,
    /// A run held the Lease when the batch was due: look again then.
    hold_until: Option<Instant>,
}

/// How long to wait after the API failed us.
const PAUSE: Duration = Duration::from_secs(2);

impl<S: StateStore, C: Cluster> Watcher<S, C> {
    async fn forever(&mut self) {
        loop {
            let active = match crate::workflows::scale::read_both(&self.deps.state).await {
                Ok((snap, scale)) => snap
                    .spec_yaml()
                    .and_then(|y| ClusterSpec::from_yaml(y).ok())
                    .map(|base| crate::workflows::scale::effective(base, scale.as_ref(), &snap))
                    .is_some_and(|e| autoscaling(&e.spec)),
                Err(e) => {
                    tracing::warn!(error = %e, "pending-pod trigger: cannot read the spec");
                    self.watching
                }
            };
            if active != self.watching {
                tracing::info!(
                    watching = active,
                    "pending-pod trigger: {}",
                    if active {
                        "a pool autoscales; watching for unschedulable pods"
                    } else {
                        "no pool autoscales; not watching pods"
                    }
                );
                self.watching = active;
                self.metrics_watching();
            }
            if !active {
                self.rv = None;
                self.seen.clear();
                self.batch = Batch::default();
                tokio::time::sleep(self.opts.recheck).await;
                continue;
            }
            let until = Instant::now() + self.opts.recheck;
            if let Err(e) = self.watch_until(until).await {
                tracing::warn!(error = %e, "pending-pod trigger: watching pods failed; trying again");
                tokio::time::sleep(PAUSE).await;
            }
        }
    }

    fn metrics_watching(&self) {
        self.deps.metrics.set_watching(self.watching);
    }

    /// Lists (when there is no version to resume from), then watches until `until`.
    async fn watch_until(&mut self, until: Instant) -> Result<(), kube::Error> {
        if self.rv.is_none() {
            self.relist().await?;
        }
        while Instant::now() < until {
            let rv = self.rv.clone().unwrap_or_else(|| "0".to_owned());
            let left = until.saturating_duration_since(Instant::now()).as_secs();
            let wp = WatchParams::default()
                .fields(FIELD_SELECTOR)
                .timeout(u32::try_from(left.clamp(1, 290)).unwrap_or(290));
            let stream = self.api.watch(&wp, &rv).await?;
            futures::pin_mut!(stream);
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    ev = stream.try_next() => match ev? {
                        Some(ev) => {
                            if !self.event(ev) {
                                // 410 Gone: the version expired; list again.
                                self.relist().await?;
                                break;
                            }
                        }
                        // The server ended the watch (its timeout): resume.
                        None => break,
                    },
                    _ = tick.tick() => {
                        self.maybe_fire().await;
                        if Instant::now() >= until {
                            return Ok(());
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn relist(&mut self) -> Result<(), kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().fields(FIELD_SELECTOR))
            .await?;
        let now = Instant::now();
        let present: BTreeSet<String> = list.items.iter().map(key).collect();
        // Pods that left while we were not watching are forgotten.
        self.seen.retain(|k| present.contains(k));
        for pod in list.items.iter().filter(|p| unschedulable(p)) {
            let k = key(pod);
            if self.seen.insert(k.clone()) {
                self.note_owner(&k, pod);
                self.batch.add(k, now);
            }
        }
        self.owners.retain(|k, _| self.seen.contains(k));
        self.rv = list.metadata.resource_version;
        Ok(())
    }

    /// Applies one watch event; false when the watch must relist.
    fn event(&mut self, ev: WatchEvent<Pod>) -> bool {
        let now = Instant::now();
        match ev {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                self.rv.clone_from(&pod.metadata.resource_version);
                let k = key(&pod);
                if unschedulable(&pod) {
                    if self.seen.insert(k.clone()) {
                        self.note_owner(&k, &pod);
                        self.batch.add(k, now);
                    }
                } else if pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| !n.is_empty())
                {
                    // Placed after all: it needs no run any more.
                    self.batch.remove(&k);
                }
            }
            WatchEvent::Deleted(pod) => {
                self.rv.clone_from(&pod.metadata.resource_version);
                let k = key(&pod);
                self.seen.remove(&k);
                self.owners.remove(&k);
                self.batch.remove(&k);
            }
            WatchEvent::Bookmark(b) => self.rv = Some(b.metadata.resource_version),
            WatchEvent::Error(status) if status.code == 410 => {
                self.rv = None;
                return false;
            }
            WatchEvent::Error(status) => {
                tracing::warn!(code = status.code, message = %status.message, "pending-pod trigger: watch error");
                self.rv = None;
                return false;
            }
        }
        true
    }

    /// Fires the batch when it is due, the Lease is free and some pod in it is hostable.
    async fn maybe_fire(&mut self) {
        let now = Instant::now();
        if !self.batch.due(now, &self.opts) || self.hold_until.is_some_and(|t| now < t) {
            return;
        }
        match self.deps.cluster.lease_holder().await {
            Ok(Some(holder)) => {
                tracing::debug!(%holder, pods = self.batch.pods.len(), "pending-pod trigger: a run holds the Lease; waiting");
                self.hold_until = Some(now + self.opts.lease_poll);
                return;
            }
            Ok(None) => self.hold_until = None,
            Err(e) => {
                tracing::warn!(error = %e, "pending-pod trigger: cannot read the Lease; trying again");
                self.hold_until = Some(now + self.opts.lease_poll);
                return;
            }
        }
        let (unhostable, owners) = self.unhostable().await;
        let pods: Vec<String> = self
            .batch
            .take()
            .into_iter()
            .filter(|p| {
                !unhostable.contains(p) && !self.owners.get(p).is_some_and(|o| owners.contains(o))
            })
            .collect();
        if pods.is_empty() {
            tracing::debug!("pending-pod trigger: only pods the last run found unhostable; no run");
            return;
        }
        let shown: Vec<&str> = pods.iter().take(3).map(String::as_str).collect();
        let detail = format!(
            "{} new unschedulable pod(s): {}{}",
            pods.len(),
            shown.join(", "),
            if pods.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        );
        let outcome = super::trigger(&self.deps, TriggerReason::PendingPods, detail).await;
        if let ReconcileOutcome::Failed { .. } | ReconcileOutcome::NoCronJob = outcome {
            // Keep them for the next try.
            let now = Instant::now();
            for p in pods {
                self.batch.add(p, now);
            }
        }
    }

    /// The pods the last run found no pool could host, and the owners of those it only
    /// counted (past the first hundred): a new pod of such an owner is one more of the same.
    async fn unhostable(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let Ok(snap) = self.deps.state.read_config().await else {
            return Default::default();
        };
        snap.status_json()
            .and_then(Status::from_json)
            .and_then(|s| s.autoscale)
            .map(|a| {
                (
                    a.unhostable.into_iter().map(|u| u.pod).collect(),
                    a.unhostable_more.into_keys().collect(),
                )
            })
            .unwrap_or_default()
    }

    fn note_owner(&mut self, key: &str, pod: &Pod) {
        if let Some(o) = crate::adapters::kube_cluster::views::pod_from_kube(pod).owner_key() {
            self.owners.insert(key.to_owned(), o);
        }
    }
}

/// Why a reconcile Job was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerReason {
    /// A count or autoscaling change through the webhook.
    ScaleChange,
    /// `POST /reconcile`.
    Manual,
    /// New unschedulable pods.
    PendingPods,
}

impl TriggerReason {
    pub const ALL: [TriggerReason; 3] = [
        TriggerReason::ScaleChange,
        TriggerReason::Manual,
        TriggerReason::PendingPods,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TriggerReason::ScaleChange => "scale_change",
            TriggerReason::Manual => "manual",
            TriggerReason::PendingPods => "pending_pods",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> PendingOptions {
        PendingOptions::default()
    }

    #[test]
    fn a_batch_fires_after_a_quiet_second_or_ten_seconds_after_its_first_pod() {
        let t0 = Instant::now();
        let mut b = Batch::default();
        assert!(!b.due(t0, &opts()));
        b.add("a/p0".into(), t0);
        assert!(!b.due(t0 + Duration::from_millis(900), &opts()));
        assert!(b.due(t0 + Duration::from_millis(1000), &opts()));
        // A steady trickle (one pod every half second) still fires at ten seconds.
        let mut b = Batch::default();
        for i in 0..40u64 {
            let at = t0 + Duration::from_millis(500 * i);
            b.add(format!("a/p{i}"), at);
            let due = b.due(at, &opts());
            assert_eq!(due, i >= 20, "at {} ms", 500 * i);
        }
        assert_eq!(b.take().len(), 40);
        assert!(b.is_empty() && !b.due(t0 + Duration::from_secs(60), &opts()));
    }

    #[test]
    fn only_pods_the_scheduler_refused_count() {
        let pod = |node: Option<&str>, cond: Option<(&str, &str)>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"nodeName": node, "containers": []},
                "status": {"phase": "Pending", "conditions": cond.map(|(s, r)| vec![
                    serde_json::json!({"type": "PodScheduled", "status": s, "reason": r})
                ]).unwrap_or_default()},
            }))
            .unwrap_or_default()
        };
        assert!(unschedulable(&pod(None, Some(("False", "Unschedulable")))));
        assert!(!unschedulable(&pod(None, None)), "not looked at yet");
        assert!(!unschedulable(&pod(
            None,
            Some(("False", "SchedulerError"))
        )));
        assert!(!unschedulable(&pod(
            Some("n1"),
            Some(("False", "Unschedulable"))
        )));
        assert_eq!(key(&pod(None, None)), "ns/p");
    }
}
