//! Carries out a [`Plan`] through the [`Rack`] and [`Cluster`] traits. Deliberately dumb: it
//! decides nothing the planner did not; it orders phases, bounds concurrency, retries what is
//! retryable, respects the run deadline and reports one outcome per action.
//!
//! Phases: the API floating IP first (joiners need it), then creates and starts, then
//! removals, then orphan cleanup. A removal is an idempotent pipeline — mark (cordon +
//! annotate), drain, stop, delete the Node, delete the instance, delete its disks — that may
//! stop early (a PodDisruptionBudget, an instance still stopping) and resume in a later run.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::cluster::{Cluster, ClusterError, EventType, Eviction};
use crate::model::{InstanceState, NewInstance};
use crate::names;
use crate::plan::{Action, Plan};
use crate::rack::{Rack, RackError};
use crate::retry::{self, Backoff};

/// Builds the instance for a `CreateMember` action (spec + secrets + images + cloud-init).
pub trait MemberFactory: Send + Sync {
    fn new_instance(&self, pool: &str, name: &str) -> Result<NewInstance, String>;
    /// Anti-affinity group of a pool, if any.
    fn anti_affinity_group(&self, pool: &str) -> Option<String>;
}

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
        }
    }
}

/// What happened to one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Done,
    /// Made progress; a later run finishes it.
    InProgress(String),
    Failed(String),
    /// Not started: deadline reached or Lease lost.
    Skipped(String),
}

/// An action and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionResult {
    #[serde(flatten)]
    pub action: Action,
    #[serde(flatten)]
    pub outcome: Outcome,
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
    let phase = |a: &Action| match a {
        Action::CreateApiFloatingIp { .. } | Action::AttachApiFloatingIp { .. } => 0,
        Action::CreateMember { .. } | Action::StartMember { .. } => 1,
        Action::RemoveMember { .. } => 2,
        Action::DeleteNode { .. } | Action::DeleteDisk { .. } => 3,
    };
    let mut results = Vec::with_capacity(plan.actions.len());
    for p in 0..=3 {
        let batch: Vec<&Action> = plan.actions.iter().filter(|a| phase(a) == p).collect();
        if batch.is_empty() {
            continue;
        }
        // The floating IP phase is sequential: create before attach.
        let width = if p == 0 { 1 } else { opts.concurrency.max(1) };
        let mut done: Vec<(usize, ActionResult)> =
            futures::stream::iter(batch.into_iter().enumerate())
                .map(|(i, a)| {
                    let ctx = &ctx;
                    async move { (i, ctx.run(a).await) }
                })
                .buffer_unordered(width)
                .collect()
                .await;
        done.sort_by_key(|(i, _)| *i);
        results.extend(done.into_iter().map(|(_, r)| r));
    }
    results
}

struct Ctx<'a, R, C, F> {
    rack: &'a R,
    cluster: &'a C,
    factory: &'a F,
    opts: &'a ApplyOptions,
}

impl<R: Rack, C: Cluster, F: MemberFactory> Ctx<'_, R, C, F> {
    async fn run(&self, action: &Action) -> ActionResult {
        let outcome = if self.opts.cancelled.load(Ordering::SeqCst) {
            Outcome::Skipped("the run lost its Lease".into())
        } else if Instant::now() >= self.opts.deadline {
            Outcome::Skipped("the run deadline was reached".into())
        } else {
            match tokio::time::timeout_at(self.opts.deadline, self.execute(action)).await {
                Ok(o) => o,
                Err(_) => Outcome::InProgress(
                    "the run deadline was reached; a later run continues".into(),
                ),
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
        if !matches!(outcome, Outcome::Skipped(_))
            && let Err(e) = self.cluster.record_event(kind, reason, &message).await
        {
            warn!(error = %e, "could not record event");
        }
        ActionResult {
            action: action.clone(),
            outcome,
        }
    }

    async fn execute(&self, action: &Action) -> Outcome {
        match action {
            Action::CreateApiFloatingIp { name, .. } => {
                match self
                    .retry(|| {
                        self.rack
                            .create_floating_ip(name, "oxide-controller API address", None)
                    })
                    .await
                {
                    Ok(_) | Err(RackError::AlreadyExists { .. }) => Outcome::Done,
                    Err(e) => failed(e),
                }
            }
            Action::AttachApiFloatingIp { fip, to, from, .. } => {
                if from.is_some()
                    && let Err(e) = self.retry(|| self.rack.detach_floating_ip(fip)).await
                {
                    return failed(e);
                }
                match self.retry(|| self.rack.attach_floating_ip(fip, to)).await {
                    Ok(()) => Outcome::Done,
                    Err(e) => failed(e),
                }
            }
            Action::CreateMember { pool, name, .. } => self.create(pool, name).await,
            Action::StartMember { name, .. } => {
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
            Action::DeleteNode { node, .. } => match self.cluster.delete_node(node).await {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::Failed(format!("{e:#}")),
            },
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

    async fn create(&self, pool: &str, name: &str) -> Outcome {
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
                    Ok(_) => Outcome::Failed(format!(
                        "{what}, but it is not the member we asked for; leaving it alone"
                    )),
                    Err(e) => failed(e),
                }
            }
            Err(e) => failed(e),
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
            match self.cluster.mark_removing(node, reason).await {
                Ok(()) | Err(ClusterError::NotFound { .. }) => {}
                Err(e) => return Err(cluster_err(e)),
            }
            if drain && let Some(blocker) = self.drain(node).await.map_err(cluster_err)? {
                return Ok(Outcome::InProgress(format!(
                    "drain of {node} not finished after {}s (blocked at {blocker}, a PodDisruptionBudget or a slow pod); the next run tries again (or use --force-drain)",
                    self.opts.drain_timeout.as_secs()
                )));
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
            self.cluster.delete_node(node).await.map_err(cluster_err)?;
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
            if Instant::now() + self.opts.poll > until.min(self.opts.deadline) {
                return Ok(false);
            }
            tokio::time::sleep(self.opts.poll).await;
        }
    }

    /// Evicts (or with `force_drain` deletes) every pod but DaemonSet, mirror and finished
    /// ones. Returns the pod a PodDisruptionBudget kept there past the drain timeout, if any.
    async fn drain(&self, node: &str) -> Result<Option<String>, ClusterError> {
        let until = Instant::now() + self.opts.drain_timeout;
        loop {
            let pods: Vec<_> = self
                .cluster
                .pods_on_node(node)
                .await?
                .into_iter()
                .filter(|p| !p.daemonset && !p.mirror && !p.finished)
                .collect();
            if pods.is_empty() {
                return Ok(None);
            }
            let mut blocked = None;
            for pod in &pods {
                if self.opts.force_drain {
                    self.cluster.delete_pod(pod).await?;
                } else if self.cluster.evict(pod).await? == Eviction::BlockedByBudget {
                    blocked.get_or_insert_with(|| format!("{}/{}", pod.namespace, pod.name));
                }
            }
            // Out of time: report the budget that blocked us, or a pod still terminating.
            if Instant::now() + self.opts.poll > until.min(self.opts.deadline) {
                return Ok(Some(blocked.unwrap_or_else(|| {
                    format!("{}/{} (still terminating)", pods[0].namespace, pods[0].name)
                })));
            }
            tokio::time::sleep(self.opts.poll.min(Duration::from_millis(200))).await;
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

fn failed(e: RackError) -> Outcome {
    Outcome::Failed(format!("{e:#}"))
}
