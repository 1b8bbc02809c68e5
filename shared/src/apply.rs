//! Carries out a [`Plan`] through the [`Rack`] and [`Cluster`] traits. Deliberately dumb: it
//! decides nothing the planner did not; it orders phases, bounds concurrency, retries what is
//! retryable, respects the run deadline and reports one outcome per action.
//!
//! Phases: the API floating IP first (joiners need it), then each pool's first create alone,
//! then the other creates (skipped for a pool whose first create the rack refused for a reason
//! that refuses them all) and starts, then removals, then orphan cleanup. A removal is an idempotent pipeline — mark (cordon +
//! annotate), drain, stop, delete the Node, delete the instance, delete its disks — that may
//! stop early (a PodDisruptionBudget, an instance still stopping) and resume in a later run.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::base::names;
use crate::base::retry::{self, Backoff};
use crate::base::shutdown::Shutdown;
use crate::domain::model::{InstanceState, PodRef};
use crate::domain::plan::backoff::{BlockCause, Blocked};
use crate::domain::plan::{Action, ActionResult, MemberFactory, Outcome, Plan};
use crate::ports::cluster::{Cluster, ClusterError, EventType, Eviction};
use crate::ports::rack::{Rack, RackError};

/// Knobs of one apply.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Most Oxide/Kubernetes operations in flight at once.
    pub concurrency: usize,
    /// Give up draining a Node after this long (the next run tries again).
    pub drain_timeout: Duration,
    /// Delete pods instead of evicting them (ignores PodDisruptionBudgets).
    pub force_drain: bool,
    /// How long a removal waits for its instance to stop before leaving it to a later run.
    pub stop_wait: Duration,
    /// Poll interval while waiting.
    pub poll: Duration,
    /// Retry policy for retryable Oxide errors (503s, 5xx, timeouts).
    pub backoff: Backoff,
    /// The whole run must be done by then.
    pub deadline: Instant,
    /// Set when the run lost its Lease: stop starting new work.
    pub cancelled: Arc<AtomicBool>,
    /// Triggered when the process is asked to stop (SIGTERM, SIGINT): start no new action,
    /// end waits (drain, stop) at once as "in progress", and give the action under way at
    /// most [`ApplyOptions::abandon_after`] more before abandoning it where it is (every
    /// action is resumable: the next run observes and picks up).
    pub shutdown: Shutdown,
    /// How long an action under way may go on after [`ApplyOptions::shutdown`] triggers.
    pub abandon_after: Duration,
    /// The pod this run executes in (`POD_NAMESPACE`/`POD_NAME`), never evicted by it.
    pub own_pod: Option<(String, String)>,
}

impl ApplyOptions {
    pub fn new(deadline: Instant) -> Self {
        ApplyOptions {
            concurrency: 8,
            drain_timeout: Duration::from_secs(120),
            force_drain: false,
            stop_wait: Duration::from_secs(60),
            poll: Duration::from_millis(500),
            backoff: Backoff::default(),
            deadline,
            cancelled: Arc::new(AtomicBool::new(false)),
            shutdown: Shutdown::new(),
            abandon_after: ABANDON_AFTER,
            own_pod: None,
        }
    }
}

/// Executes `plan`. Never fails as a whole: each action reports its own outcome.
pub async fn apply<R: Rack, C: Cluster, F: MemberFactory>(
    rack: &R,
    cluster: &C,
    factory: &F,
    plan: &Plan,
    opts: &ApplyOptions,
) -> Vec<ActionResult> {
    let ctx = Ctx {
        rack,
        cluster,
        factory,
        opts,
    };
    // Each pool's first create goes alone (phase 1) and the rest follow (phase 2) only if it
    // was not refused for a reason that refuses them all (a full rack, quota, subnet): a
    // refused pool costs the rack one failed create per run, not one per missing member.
    let mut first_creates = std::collections::BTreeSet::new();
    let phases: Vec<u8> = plan
        .actions
        .iter()
        .map(|a| match a {
            Action::CreateApiFloatingIp { .. } | Action::AttachApiFloatingIp { .. } => 0,
            Action::CreateMember { pool, .. } if first_creates.insert(pool.as_str()) => 1,
            Action::CreateMember { .. }
            | Action::StartMember { .. }
            | Action::CancelRemoval { .. }
            | Action::RestartForCertificates { .. }
            | Action::FinishCertificateRestart { .. } => 2,
            Action::RemoveMember { .. } => 3,
            Action::DeleteNode { .. } | Action::DeleteDisk { .. } => 4,
        })
        .collect();
    let mut results: Vec<(usize, ActionResult)> = Vec::with_capacity(plan.actions.len());
    for p in 0..=4 {
        let mut batch = Vec::new();
        for (i, a) in plan
            .actions
            .iter()
            .enumerate()
            .filter(|(i, _)| phases[*i] == p)
        {
            match not_to_try(a, &results) {
                Some(why) => results.push((
                    i,
                    ActionResult {
                        action: a.clone(),
                        outcome: Outcome::Skipped(why),
                        blocked: None,
                    },
                )),
                None => batch.push((i, a)),
            }
        }
        if batch.is_empty() {
            continue;
        }
        // The floating IP phase is sequential: create before attach.
        let width = if p == 0 { 1 } else { opts.concurrency.max(1) };
        let done: Vec<(usize, ActionResult)> = futures::stream::iter(batch)
            .map(|(i, a)| {
                let ctx = &ctx;
                async move { (i, ctx.run(a).await) }
            })
            .buffer_unordered(width)
            .collect()
            .await;
        results.extend(done);
    }
    // In the order they ran: by phase, then as planned.
    results.sort_by_key(|(i, _)| (phases[*i], *i));
    results.into_iter().map(|(_, r)| r).collect()
}

/// Why `a` is not tried after what ran before it in this run: a create of a pool whose first
/// create the rack refused for a reason that refuses them all; the removal of a server the API
/// floating IP could not leave (its move failed and the address went back to it: removing it
/// would leave the API without its address until a later run).
fn not_to_try(a: &Action, earlier: &[(usize, ActionResult)]) -> Option<String> {
    earlier.iter().find_map(|(_, r)| match (a, &r.action, &r.outcome, &r.blocked) {
        (Action::CreateMember { pool, .. }, Action::CreateMember { pool: refused, .. }, _, Some(b))
            if pool == refused =>
        {
            Some(format!(
                "not tried: the rack refused this pool's first create ({})",
                b.message
            ))
        }
        (
            Action::RemoveMember { name, .. },
            Action::AttachApiFloatingIp { from: Some(holder), .. },
            Outcome::Failed(why),
            _,
        ) if name == holder => Some(format!(
            "not tried: the API floating IP could not leave it ({why}); a later run moves the address first"
        )),
        _ => None,
    })
}

struct Ctx<'a, R, C, F> {
    rack: &'a R,
    cluster: &'a C,
    factory: &'a F,
    opts: &'a ApplyOptions,
}

impl<R: Rack, C: Cluster, F: MemberFactory> Ctx<'_, R, C, F> {
    async fn run(&self, action: &Action) -> ActionResult {
        let mut blocked = None;
        let outcome = if self.opts.cancelled.load(Ordering::SeqCst) {
            Outcome::Skipped("the run lost its Lease".into())
        } else if let Some(signal) = self.opts.shutdown.signal() {
            Outcome::Skipped(format!(
                "not started: the run was asked to stop ({signal}); a later run does it"
            ))
        } else if Instant::now() >= self.opts.deadline {
            Outcome::Skipped("the run deadline was reached".into())
        } else {
            let abandon = async {
                let signal = self.opts.shutdown.triggered().await;
                tokio::time::sleep(self.opts.abandon_after).await;
                signal
            };
            tokio::select! {
                done = tokio::time::timeout_at(self.opts.deadline, self.execute(action, &mut blocked)) => match done {
                    Ok(o) => o,
                    Err(_) => Outcome::InProgress(
                        "the run deadline was reached; a later run continues".into(),
                    ),
                },
                signal = abandon => Outcome::InProgress(format!(
                    "abandoned under way: the run was asked to stop ({signal}); a later run continues from what it finds"
                )),
            }
        };
        let (kind, reason) = match &outcome {
            Outcome::Done => (EventType::Normal, "Applied"),
            Outcome::InProgress(_) => (EventType::Normal, "InProgress"),
            Outcome::Failed(_) => (EventType::Warning, "Failed"),
            Outcome::Skipped(_) => (EventType::Warning, "Skipped"),
        };
        let detail = match &outcome {
            Outcome::Done => String::new(),
            Outcome::InProgress(d) | Outcome::Failed(d) | Outcome::Skipped(d) => format!(" ({d})"),
        };
        let message = format!(
            "{} {}: {}{detail}",
            action.verb(),
            action.target(),
            action.reason()
        );
        match &outcome {
            Outcome::Failed(_) | Outcome::Skipped(_) => {
                warn!(action = action.verb(), target = action.target(), %message, "action did not complete")
            }
            _ => info!(action = action.verb(), target = action.target(), %message, "action"),
        }
        // A blocked create gets one Event per pool and streak from the run (see
        // `workflows::reconcile`), not one per refused create.
        if !matches!(outcome, Outcome::Skipped(_))
            && blocked.is_none()
            && let Err(e) = self.cluster.record_event(kind, reason, &message).await
        {
            warn!(error = %e, "could not record event");
        }
        ActionResult {
            action: action.clone(),
            outcome,
            blocked,
        }
    }

    async fn execute(&self, action: &Action, blocked: &mut Option<Blocked>) -> Outcome {
        match action {
            Action::CreateApiFloatingIp {
                name, description, ..
            } => {
                match self
                    .retry(|| self.rack.create_floating_ip(name, description, None))
                    .await
                {
                    Ok(_) | Err(RackError::AlreadyExists { .. }) => Outcome::Done,
                    Err(e) => failed(e),
                }
            }
            Action::AttachApiFloatingIp {
                fip,
                to,
                from,
                stop_from,
                ..
            } => self.attach_fip(fip, to, from.as_deref(), *stop_from).await,
            Action::CreateMember { pool, name, .. } => self.create(pool, name, blocked).await,
            Action::StartMember {
                name, mark_node, ..
            } => {
                // The mark first: a later run must know a start was made even if this run
                // ends right after it.
                if let Some(node) = mark_node
                    && let Err(e) = self
                        .retry_kube(|| self.cluster.mark_restarted(node, Utc::now()))
                        .await
                {
                    return Outcome::Failed(format!("{e:#}"));
                }
                match self.retry(|| self.rack.start_instance(name)).await {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Failed(start_failure(e)),
                }
            }
            Action::RemoveMember {
                name,
                node,
                drain,
                reason,
                ..
            } => match self.remove(name, node.as_deref(), *drain, reason).await {
                Ok(o) => o,
                Err(e) => Outcome::Failed(e),
            },
            Action::CancelRemoval { node, .. } => {
                match self.retry_kube(|| self.cluster.cancel_removal(node)).await {
                    Ok(()) | Err(ClusterError::NotFound { .. }) => Outcome::Done,
                    Err(e) => Outcome::Failed(format!("{e:#}")),
                }
            }
            Action::RestartForCertificates {
                name,
                node,
                drain,
                after_run,
                since,
                ..
            } => match self
                .restart_for_certificates(name, node, *drain, *after_run, *since)
                .await
            {
                Ok(o) => o,
                Err(e) => Outcome::Failed(e),
            },
            Action::FinishCertificateRestart {
                node,
                uncordon,
                since,
                ..
            } => {
                self.finish_certificate_restart(node, *uncordon, *since)
                    .await
            }
            Action::DeleteNode { node, .. } => {
                match self.retry_kube(|| self.cluster.delete_node(node)).await {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Failed(format!("{e:#}")),
                }
            }
            Action::DeleteDisk { disk, .. } => {
                match self.retry(|| self.rack.delete_disk(disk)).await {
                    Ok(()) | Err(RackError::NotFound { .. }) => Outcome::Done,
                    Err(e) => failed(e),
                }
            }
        }
    }

    /// Retries retryable rack errors with backoff, within the deadline.
    async fn retry<T, Fut, Op>(&self, op: Op) -> Result<T, RackError>
    where
        Op: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RackError>>,
    {
        retry::retry(self.opts.backoff, RackError::is_retryable, op).await
    }

    /// Retries idempotent Kubernetes calls (cordon/annotate patch, Node delete) that failed
    /// with a transient error.
    async fn retry_kube<T, Fut, Op>(&self, op: Op) -> Result<T, ClusterError>
    where
        Op: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClusterError>>,
    {
        retry::retry(
            crate::ports::cluster::KUBE_BACKOFF,
            ClusterError::is_retryable,
            op,
        )
        .await
    }

    async fn create(&self, pool: &str, name: &str, blocked: &mut Option<Blocked>) -> Outcome {
        let new = match self.factory.new_instance(pool, name) {
            Ok(n) => n,
            Err(e) => return Outcome::Failed(e),
        };
        if let Some(group) = self.factory.anti_affinity_group(pool)
            && let Err(e) = self
                .retry(|| self.rack.ensure_anti_affinity_group(&group))
                .await
        {
            return failed(e);
        }
        // A retry after a lost response finds the name taken: that instance is ours, adopt it.
        match self.retry(|| self.rack.create_instance(&new)).await {
            // The rack answers 201 with a `stopped` instance when its automatic start failed
            // (no sled has room, or the silo quota is spent). Only an explicit start says
            // which; ask once, report it, and leave the instance for the next run to start.
            Ok(i) if i.state == InstanceState::Stopped => {
                match self.retry(|| self.rack.start_instance(name)).await {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Failed(format!(
                        "created, but the rack did not start it: {}",
                        start_failure(e)
                    )),
                }
            }
            Ok(_) => Outcome::Done,
            Err(RackError::AlreadyExists { what }) if what.contains(name) => {
                match self.rack.get_instance(name).await {
                    Ok(Some(i)) if i.description == new.description => Outcome::Done,
                    Ok(Some(_)) => Outcome::Failed(format!(
                        "{what}, but it is not the member we asked for; leaving it alone"
                    )),
                    // Nexus answers ObjectAlreadyExists for any object of the create's saga,
                    // the disks too, and unwinds: the instance was never made (audit
                    // oxide-api-2 F8).
                    Ok(None) => Outcome::Failed(format!(
                        "the rack refused to create instance {name}: an object it creates already exists, but no instance {name} does, so it is one of its disks ({}); leaving it alone: delete it, or let the orphaned-disk clean-up take it if it carries this cluster's tag",
                        std::iter::once(&new.boot_disk)
                            .chain(new.data_disk.as_ref())
                            .map(|d| d.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    Err(e) => failed(e),
                }
            }
            Err(e) => {
                *blocked = block_cause(&e).map(|cause| Blocked {
                    cause,
                    message: rack_message(&e),
                });
                failed(e)
            }
        }
    }

    /// Moves (or attaches) the API floating IP to `to`.
    async fn attach_fip(
        &self,
        fip: &str,
        to: &str,
        from: Option<&str>,
        stop_from: bool,
    ) -> Outcome {
        // A failed holder refuses the detach until it is stopped (omicron
        // `nexus/db-queries/src/db/datastore/external_ip.rs`); a stop of a failed
        // instance only ends its VMM, so this is quick.
        if let (Some(holder), true) = (from, stop_from) {
            match self.retry(|| self.rack.stop_instance(holder)).await {
                Ok(()) | Err(RackError::NotFound { .. }) => {}
                Err(e) => return failed(e),
            }
        }
        if from.is_some()
            && let Err(e) = self.retry(|| self.rack.detach_floating_ip(fip)).await
        {
            return failed(e);
        }
        let Err(e) = self.retry(|| self.rack.attach_floating_ip(fip, to)).await else {
            return Outcome::Done;
        };
        // Detached and not attached: the API has no address. Back to the member it left,
        // unless that one was failed and stopped above (or is not a member: an id).
        let Some(holder) = from.filter(|h| !stop_from && h.parse::<uuid::Uuid>().is_err()) else {
            return failed(e);
        };
        let back = match self
            .retry(|| self.rack.attach_floating_ip(fip, holder))
            .await
        {
            Ok(()) => format!("the address is back on {holder}"),
            Err(again) => format!("putting it back on {holder} failed too: {again}"),
        };
        warn!(%fip, %to, %holder, error = %e, "{back}");
        Outcome::Failed(format!("{e:#}; {back}"))
    }

    /// A restart for certificates is over: the Node marked `done` (and uncordoned).
    async fn finish_certificate_restart(
        &self,
        node: &str,
        uncordon: bool,
        since: chrono::DateTime<Utc>,
    ) -> Outcome {
        let value = crate::domain::certificates::Restart::Done(since).value();
        let unschedulable = uncordon.then_some(false);
        match self
            .retry_kube(|| {
                self.cluster
                    .mark_certificate_restart(node, &value, unschedulable)
            })
            .await
        {
            Ok(()) | Err(ClusterError::NotFound { .. }) => Outcome::Done,
            Err(e) => Outcome::Failed(format!("{e:#}")),
        }
    }

    /// A restart for certificates: the Node's mark first (so a later run knows it was asked
    /// for, and keeps its time), cordon and drain with `drain`, then the reboot.
    async fn restart_for_certificates(
        &self,
        name: &str,
        node: &str,
        drain: bool,
        after_run: bool,
        since: chrono::DateTime<Utc>,
    ) -> Result<Outcome, String> {
        let value = crate::domain::certificates::Restart::Restarting(since).value();
        let cordon = drain.then_some(true);
        self.retry_kube(|| self.cluster.mark_certificate_restart(node, &value, cordon))
            .await
            .map_err(|e| format!("{e:#}"))?;
        if drain {
            let timeout = self.opts.drain_timeout.as_secs();
            match self.drain(node).await.map_err(|e| format!("{e:#}"))? {
                Drained::Done => {}
                Drained::Waiting(why) => {
                    return Ok(Outcome::InProgress(format!(
                        "drain of {node} before its restart not finished after {timeout}s ({why}); the next run carries on"
                    )));
                }
                Drained::Stuck(why) => {
                    return Ok(Outcome::Failed(format!(
                        "drain of {node} before its restart: {why}; the Node stays cordoned until that is resolved"
                    )));
                }
                Drained::OwnPod(pod) => {
                    return Ok(Outcome::InProgress(format!(
                        "{node} is drained but for this run's own pod {pod}; a later run, placed on another node, restarts it"
                    )));
                }
            }
        }
        if after_run {
            return Ok(Outcome::InProgress(format!(
                "{name} is rebooted once this run has written its status and given back its Lease (the API goes down with its only server)"
            )));
        }
        match self.retry(|| self.rack.reboot_instance(name)).await {
            Ok(()) => Ok(Outcome::Done),
            Err(e) => Ok(failed(e)),
        }
    }

    /// The removal pipeline. Each step is idempotent.
    async fn remove(
        &self,
        name: &str,
        node: Option<&str>,
        drain: bool,
        reason: &str,
    ) -> Result<Outcome, String> {
        let cluster_err = |e: ClusterError| format!("{e:#}");
        if let Some(node) = node {
            match self
                .retry_kube(|| self.cluster.mark_removing(node, reason))
                .await
            {
                Ok(()) | Err(ClusterError::NotFound { .. }) => {}
                Err(e) => return Err(cluster_err(e)),
            }
            if drain {
                let timeout = self.opts.drain_timeout.as_secs();
                match self.drain(node).await.map_err(cluster_err)? {
                    Drained::Done => {}
                    Drained::Waiting(why) if self.opts.shutdown.is_triggered() => {
                        return Ok(Outcome::InProgress(format!(
                            "drain of {node} interrupted ({why}); the next run carries on"
                        )));
                    }
                    Drained::Waiting(why) => {
                        return Ok(Outcome::InProgress(format!(
                            "drain of {node} not finished after {timeout}s ({why}); the next run tries again (or run reconcile-once --force-drain from a laptop with your own kubeconfig)"
                        )));
                    }
                    Drained::Stuck(why) => {
                        return Ok(Outcome::Failed(format!(
                            "drain of {node}: {why}; the Node stays cordoned and its VM running until that is resolved"
                        )));
                    }
                    Drained::OwnPod(pod) => {
                        return Ok(Outcome::InProgress(format!(
                            "{node} is drained but for this run's own pod {pod}; a later run, placed on another node, finishes the removal"
                        )));
                    }
                }
            }
        }
        // Stop before deleting the Node: a running kubelet would register it again. A
        // `failed` member is stopped too: the stop clears the rack's intent to run it, so an
        // automatic restart (instances created without `auto_restart_policy: never`) cannot
        // bring it back between our look and our delete.
        let instance = self
            .retry(|| self.rack.get_instance(name))
            .await
            .map_err(|e| format!("{e:#}"))?;
        if let Some(inst) = &instance
            && inst.state != InstanceState::Stopped
        {
            self.retry(|| self.rack.stop_instance(name))
                .await
                .map_err(|e| format!("{e:#}"))?;
            if !self
                .wait_stopped(name)
                .await
                .map_err(|e| format!("{e:#}"))?
            {
                return Ok(Outcome::InProgress(format!(
                    "{name} is still stopping; a later run deletes it"
                )));
            }
        }
        if let Some(node) = node {
            self.retry_kube(|| self.cluster.delete_node(node))
                .await
                .map_err(cluster_err)?;
            // k3s's servers keep a deleted Node (Terminating) until their handlers removed
            // its etcd member and hosts entry (finalizers `wrangler.cattle.io/*`): the member
            // counts as removed, and its replacement may be created, only once it is gone.
            if !self.wait_node_gone(node).await.map_err(cluster_err)? {
                return Ok(Outcome::InProgress(format!(
                    "Node {node} is deleted but still terminating: a running k3s server removes it (and its etcd member) first; a later run finishes the removal"
                )));
            }
        }
        if instance.is_some() {
            match self.retry(|| self.rack.delete_instance(name)).await {
                Ok(()) | Err(RackError::NotFound { .. }) => {}
                Err(e) => return Err(format!("{e:#}")),
            }
        }
        for disk in [names::boot_disk_name(name), names::data_disk_name(name)] {
            match self.retry(|| self.rack.delete_disk(&disk)).await {
                Ok(()) | Err(RackError::NotFound { .. }) => {}
                // Still detaching: orphan cleanup in a later run gets it.
                Err(e) => return Ok(Outcome::InProgress(format!("disk {disk}: {e}"))),
            }
        }
        Ok(Outcome::Done)
    }

    /// Waits (bounded like a stop) until the Node is gone.
    async fn wait_node_gone(&self, node: &str) -> Result<bool, ClusterError> {
        let until = Instant::now() + self.opts.stop_wait;
        loop {
            let nodes = self.retry_kube(|| self.cluster.list_nodes()).await?;
            if !nodes.iter().any(|n| n.name == node) {
                return Ok(true);
            }
            if Instant::now() + self.opts.poll > until.min(self.opts.deadline) {
                return Ok(false);
            }
            tokio::time::sleep(self.opts.poll).await;
        }
    }

    /// Waits (bounded) until the instance is stopped, failed or gone.
    async fn wait_stopped(&self, name: &str) -> Result<bool, RackError> {
        let until = Instant::now() + self.opts.stop_wait;
        loop {
            match self.retry(|| self.rack.get_instance(name)).await? {
                None => return Ok(true),
                Some(i) if i.state.is_deletable() => return Ok(true),
                Some(i) if i.state == InstanceState::Running => {
                    // A stop that did not take (known field trouble): ask again.
                    self.retry(|| self.rack.stop_instance(name)).await?;
                }
                Some(_) => {}
            }
            if Instant::now() + self.opts.poll > until.min(self.opts.deadline)
                || self.opts.shutdown.sleep(self.opts.poll).await
            {
                return Ok(false);
            }
        }
    }

    /// Drains `node` like `kubectl drain`: evicts (or with `force_drain` deletes) the pods it
    /// lists first — all but DaemonSet, mirror and finished ones, and never this run's own
    /// pod — and waits for exactly those to be gone, by uid (a replacement that lands on the
    /// cordoned node again, tolerating the cordon taint, is not waited for). A pod still
    /// there is evicted again at most every [`REEVICT`]; a pod whose eviction is refused
    /// (several budgets, 403) does not stop the others.
    async fn drain(&self, node: &str) -> Result<Drained, ClusterError> {
        let until = (Instant::now() + self.opts.drain_timeout).min(self.opts.deadline);
        // kubectl polls for deletion every second.
        let poll = self.opts.poll.min(Duration::from_secs(1));
        let is_own = |p: &PodRef| {
            self.opts
                .own_pod
                .as_ref()
                .is_some_and(|(ns, name)| *ns == p.namespace && *name == p.name)
        };
        let mut targets: Option<Vec<Target>> = None;
        let mut trouble: Option<String> = None;
        loop {
            let listed = match self.cluster.pods_on_node(node).await {
                Ok(pods) => pods,
                Err(e) if e.is_retryable() && Instant::now() + poll <= until => {
                    warn!(%node, error = %e, "listing the pods to drain; trying again");
                    trouble = Some(format!("{e:#}"));
                    tokio::time::sleep(poll).await;
                    continue;
                }
                Err(e) if e.is_retryable() && targets.is_some() => {
                    return Ok(Drained::Waiting(format!("{e:#}")));
                }
                Err(e) => return Err(e),
            };
            let own_here = listed.iter().find(|p| is_own(p)).map(PodRef::key);
            let targets = targets.get_or_insert_with(|| {
                listed
                    .iter()
                    .filter(|p| !p.daemonset && !p.mirror && !is_own(p))
                    // A finished pod that is being deleted still holds the node (finalizers).
                    .filter(|p| !p.finished || p.deleting_at.is_some())
                    .map(|p| Target::new(p.clone()))
                    .collect()
            });
            // Gone, or replaced by a new pod of the same name: done with it.
            targets.retain_mut(|t| match listed.iter().find(|p| same_pod(p, &t.pod)) {
                Some(p) => {
                    t.pod.deleting_at = p.deleting_at;
                    true
                }
                None => false,
            });
            if targets.is_empty() {
                return Ok(own_here.map_or(Drained::Done, Drained::OwnPod));
            }
            if self.opts.cancelled.load(Ordering::SeqCst) {
                return Ok(Drained::Waiting("the run lost its Lease".into()));
            }
            if let Some(signal) = self.opts.shutdown.signal() {
                return Ok(Drained::Waiting(format!(
                    "the run was asked to stop ({signal})"
                )));
            }
            for t in targets.iter_mut() {
                if t.last_try.is_some_and(|at| at.elapsed() < REEVICT) {
                    continue;
                }
                t.last_try = Some(Instant::now());
                let result = if self.opts.force_drain {
                    self.cluster
                        .delete_pod(&t.pod)
                        .await
                        .map(|()| Eviction::Evicted)
                } else {
                    self.cluster.evict(&t.pod).await
                };
                match result {
                    Ok(Eviction::Evicted | Eviction::Gone) => {
                        (t.blocked, t.refused) = (false, None);
                    }
                    Ok(Eviction::BlockedByBudget) => t.blocked = true,
                    Ok(Eviction::Refused(msg)) => {
                        warn!(%node, pod = %t.pod.key(), %msg, "eviction refused");
                        t.refusals += 1;
                        t.refused = Some(msg);
                    }
                    Err(e) if e.is_retryable() => {
                        warn!(%node, pod = %t.pod.key(), error = %e, "evicting; trying again");
                        trouble = Some(format!("{e:#}"));
                    }
                    Err(e) => return Err(e),
                }
            }
            // Only refusals left, each seen twice: waiting longer will not help.
            if targets.iter().all(|t| t.refusals >= 2) {
                return Ok(verdict(targets, trouble, Utc::now()));
            }
            if Instant::now() + poll > until {
                return Ok(verdict(targets, trouble, Utc::now()));
            }
            self.opts.shutdown.sleep(poll).await;
        }
    }
}

/// Why a start failed, naming the cause a person acts on: the silo quota or the rack's room.
fn start_failure(e: RackError) -> String {
    match &e {
        RackError::InsufficientCapacity { message, .. } if message.contains("Limit Exceeded") => {
            format!("the silo quota is exhausted: {e:#}")
        }
        RackError::InsufficientCapacity { .. } => {
            format!("insufficient capacity on the rack: {e:#}")
        }
        _ => format!("{e:#}"),
    }
}

/// Whether a refused create will be refused again if retried at once, and why.
fn block_cause(e: &RackError) -> Option<BlockCause> {
    match e {
        RackError::InsufficientCapacity { message, .. } if message.contains("Limit Exceeded") => {
            Some(BlockCause::Quota)
        }
        RackError::InsufficientCapacity { message, .. }
            if message.contains("No external IP addresses") =>
        {
            Some(BlockCause::ExternalAddresses)
        }
        RackError::InsufficientCapacity { .. } => Some(BlockCause::Capacity),
        // omicron `nexus/db-queries/src/db/queries/network_interface.rs`: "No available IPv4
        // addresses for interface in subnet '...' with ID '...'" (400 InvalidRequest).
        RackError::Invalid { message, .. } if message.starts_with("No available") => {
            Some(BlockCause::SubnetFull)
        }
        RackError::Invalid { .. } => Some(BlockCause::Rejected),
        _ => None,
    }
}

/// The rack's own words in an error.
fn rack_message(e: &RackError) -> String {
    match e {
        RackError::InsufficientCapacity { message, .. } | RackError::Invalid { message, .. } => {
            message.clone()
        }
        other => format!("{other:#}"),
    }
}

/// How long the action under way may go on once the process is asked to stop, before it is
/// abandoned where it is: long enough for one slow Oxide or Kubernetes request to answer (so a
/// create is usually seen through and reported), short enough that status and the Lease
/// release still fit in a kubelet's default 30 s grace period. **Guess** at the size.
pub const ABANDON_AFTER: Duration = Duration::from_secs(10);

/// kubectl drain retries an eviction a budget refused after 5 s; a terminating pod is evicted
/// again (which deletes it again) no more often.
pub const REEVICT: Duration = Duration::from_secs(5);

/// How far past its deletionTimestamp a pod may still be terminating before a drain calls it
/// stuck: the kubelet kills the containers when the grace period ends and only then reports
/// (its status sync runs every 10 s), on a clock that is not ours. A pod whose grace period
/// ends near the drain deadline is "still terminating", not a reason to report Degraded.
/// **Guess** at the size (no upstream constant; kubectl waits for its own timeout).
pub const TERMINATION_MARGIN: chrono::Duration = chrono::Duration::seconds(30);

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Drained {
    /// Every pod it set out to evict is gone.
    Done,
    /// Still waiting (a budget, a grace period, API trouble): the next run carries on.
    Waiting(String),
    /// A person must act: pods whose eviction is refused, or pods stuck terminating.
    Stuck(String),
    /// Drained but for the pod this run executes in (`namespace/name`).
    OwnPod(String),
}

/// One pod a drain waits for.
#[derive(Debug)]
struct Target {
    pod: PodRef,
    last_try: Option<Instant>,
    blocked: bool,
    refused: Option<String>,
    refusals: u32,
}

impl Target {
    fn new(pod: PodRef) -> Self {
        Target {
            pod,
            last_try: None,
            blocked: false,
            refused: None,
            refusals: 0,
        }
    }
}

fn same_pod(listed: &PodRef, target: &PodRef) -> bool {
    listed.namespace == target.namespace
        && listed.name == target.name
        && (target.uid.is_empty() || listed.uid == target.uid)
}

/// What the pods left at the end of a drain say: refusals and pods terminating past their
/// grace period need a person (stuck); budgets and running grace periods only time.
fn verdict(targets: &[Target], trouble: Option<String>, now: DateTime<Utc>) -> Drained {
    let mut stuck: Vec<String> = targets
        .iter()
        .filter_map(|t| {
            t.refused
                .as_ref()
                .map(|msg| format!("blocked by {}: {msg}", t.pod.key()))
        })
        .collect();
    stuck.extend(targets.iter().filter_map(|t| match t.pod.deleting_at {
        Some(at) if at + TERMINATION_MARGIN < now && t.refused.is_none() => Some(format!(
            "pod {} stuck terminating since {} (a finalizer or an unresponsive kubelet holds it)",
            t.pod.key(),
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )),
        _ => None,
    }));
    if !stuck.is_empty() {
        return Drained::Stuck(stuck.join("; "));
    }
    let first = |f: fn(&Target) -> bool| targets.iter().find(|t| f(t)).map(|t| t.pod.key());
    Drained::Waiting(if let Some(pod) = first(|t| t.blocked) {
        format!("blocked at {pod} by a PodDisruptionBudget")
    } else if let Some(pod) = first(|t| t.pod.deleting_at.is_some()) {
        format!("{pod} still terminating")
    } else if let Some(e) = trouble {
        e
    } else {
        format!(
            "{} still there",
            targets.first().map(|t| t.pod.key()).unwrap_or_default()
        )
    })
}

fn failed(e: RackError) -> Outcome {
    Outcome::Failed(format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terminating(since_deadline_secs: i64, now: DateTime<Utc>) -> Target {
        Target::new(PodRef {
            namespace: "app".into(),
            name: "web".into(),
            deleting_at: Some(now - chrono::Duration::seconds(since_deadline_secs)),
            ..PodRef::default()
        })
    }

    #[test]
    fn a_pod_just_past_its_grace_period_is_still_terminating_not_stuck() {
        let now = Utc::now();
        // The kubelet has not reported yet: 10 s past deletionTimestamp.
        assert_eq!(
            verdict(&[terminating(10, now)], None, now),
            Drained::Waiting("app/web still terminating".into())
        );
        // Well past the margin: something holds it.
        assert!(matches!(
            verdict(&[terminating(31, now)], None, now),
            Drained::Stuck(msg) if msg.contains("app/web stuck terminating")
        ));
    }
}
