//! Group commit of spec changes: one ConfigMap write for every change queued behind the
//! write in progress.
//!
//! Each change is a read-modify-write of one ConfigMap on the API server. Serialised one by
//! one, a burst of N changes costs N reads and N writes, and the last caller waits for all of
//! them (on a loaded machine, past the request deadline). Here a caller queues its change and
//! waits for the writer slot; whoever gets the slot while changes are queued takes them all,
//! applies them in arrival order to one read ([`scale::apply_batch`]), writes once, starts
//! one reconcile when something was written, and hands every caller its own answer. While
//! that write is in flight the next changes queue up for the next one, so a burst costs about
//! one write per write round-trip, not one per caller.
//!
//! Exactness: each answer is what the change would have got alone at its place in the order
//! (a `delta` adds to the count the change before it left); a refused change leaves the spec
//! to the others. A caller that gave up (its request deadline passed) before its change was
//! taken is dropped from the queue and never written. If the batch as a whole fails (the
//! ConfigMap unreadable, a write refused, every attempt conflicting), nothing was written and
//! each caller applies its change alone, as before group commit, so each gets the error its
//! own change meets.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;

use crate::ports::cluster::Cluster;
use crate::ports::state::StateStore;
use crate::workflows::scale::{self, ReconcileOutcome, ScaleError, SpecChange, SpecOutcome};

/// A change and the reconcile it led to.
#[derive(Debug)]
pub(super) struct Committed {
    pub outcome: SpecOutcome,
    pub reconcile: ReconcileOutcome,
}

/// What the writer hands a queued caller.
enum Reply {
    /// The batch was written (or had nothing to write): this caller's own answer.
    Done(Result<Committed, ScaleError>),
    /// The batch failed as a whole; apply the change alone.
    Alone,
}

struct Waiter {
    change: SpecChange,
    reply: oneshot::Sender<Reply>,
}

/// The queue and the writer slot; one per process ([`super::Deps`]).
#[derive(Default)]
pub(super) struct GroupCommit {
    queue: std::sync::Mutex<Vec<Waiter>>,
    writer: tokio::sync::Mutex<()>,
    batches: AtomicU64,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("batches", &self.batches())
            .finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// Batches run so far (each at most one ConfigMap write, plus its conflict retries).
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Applies `change` together with the changes queued with it, starts the reconcile once for
/// the batch, and returns this change's answer.
pub(super) async fn submit<S: StateStore, C: Cluster>(
    deps: &super::Deps<S, C>,
    change: SpecChange,
) -> Result<Committed, ScaleError> {
    let commits = &deps.commits;
    let (tx, mut rx) = oneshot::channel();
    commits.queue().push(Waiter {
        change: change.clone(),
        reply: tx,
    });
    let slot = commits.writer.lock().await;
    // A writer that took this change sent its answer before giving the slot up.
    if let Ok(reply) = rx.try_recv() {
        drop(slot);
        return finish(deps, change, reply).await;
    }
    let batch: Vec<Waiter> = std::mem::take(&mut *commits.queue())
        .into_iter()
        .filter(|w| !w.reply.is_closed())
        .collect();
    run_batch(deps, batch).await;
    drop(slot);
    match rx.await {
        Ok(reply) => finish(deps, change, reply).await,
        // Unreachable: this change was queued before the slot was taken, so it was in the
        // batch just run, which answers every waiter. Apply it alone rather than lose it.
        Err(_) => finish(deps, change, Reply::Alone).await,
    }
}

async fn run_batch<S: StateStore, C: Cluster>(deps: &super::Deps<S, C>, batch: Vec<Waiter>) {
    if batch.is_empty() {
        return;
    }
    deps.commits.batches.fetch_add(1, Ordering::Relaxed);
    // The version gate, once per batch: a refusal (or no Node list to judge by) answers
    // every change of it. An unreadable state or spec is left to the batch, which reports it.
    if let Err(e @ (ScaleError::VersionGate(_) | ScaleError::Nodes(_))) =
        scale::check_versions(&deps.state, &deps.cluster, &deps.specs).await
    {
        for w in batch {
            let _ = w.reply.send(Reply::Done(Err(same_error(&e))));
        }
        return;
    }
    let changes: Vec<SpecChange> = batch.iter().map(|w| w.change.clone()).collect();
    match scale::apply_batch(&deps.state, &changes, &deps.config.scale, &deps.specs).await {
        Ok(outcome) => {
            deps.metrics.conflicts(outcome.conflicts);
            let reconcile = if outcome.written {
                deps.metrics.write();
                super::trigger(
                    deps,
                    super::pending::TriggerReason::ScaleChange,
                    format!(
                        "{} count or autoscaling change(s) through the webhook",
                        changes.len()
                    ),
                )
                .await
            } else {
                ReconcileOutcome::NotNeeded
            };
            tracing::debug!(
                changes = changes.len(),
                written = outcome.written,
                conflicts = outcome.conflicts,
                "spec changes committed together"
            );
            for (w, result) in batch.into_iter().zip(outcome.results) {
                let result = result.map(|outcome| Committed {
                    reconcile: if outcome.written() {
                        reconcile.clone()
                    } else {
                        ReconcileOutcome::NotNeeded
                    },
                    outcome,
                });
                let _ = w.reply.send(Reply::Done(result));
            }
        }
        Err(e) => {
            tracing::debug!(changes = changes.len(), error = %crate::workflows::error::chain(&e), "a batch of spec changes failed; each is applied alone");
            for w in batch {
                let _ = w.reply.send(Reply::Alone);
            }
        }
    }
}

/// A caller's answer: the batch's, or its change applied alone under the writer slot.
async fn finish<S: StateStore, C: Cluster>(
    deps: &super::Deps<S, C>,
    change: SpecChange,
    reply: Reply,
) -> Result<Committed, ScaleError> {
    match reply {
        Reply::Done(result) => result,
        Reply::Alone => {
            let result = {
                let _slot = deps.commits.writer.lock().await;
                match scale::check_versions(&deps.state, &deps.cluster, &deps.specs).await {
                    Ok(()) => {
                        scale::apply_one(&deps.state, &change, &deps.config.scale, &deps.specs)
                            .await
                    }
                    Err(e) => Err(e),
                }
            };
            let outcome = result.inspect_err(|e| {
                if let ScaleError::Busy { attempts } = e {
                    deps.metrics.conflicts(*attempts);
                }
            })?;
            deps.metrics.conflicts(outcome.conflicts());
            let reconcile = if outcome.written() {
                deps.metrics.write();
                super::trigger(
                    deps,
                    super::pending::TriggerReason::ScaleChange,
                    "a count or autoscaling change through the webhook".to_owned(),
                )
                .await
            } else {
                ReconcileOutcome::NotNeeded
            };
            Ok(Committed { outcome, reconcile })
        }
    }
}

/// A copy of a version-gate refusal for each waiter of a batch (the error owns its parts).
fn same_error(e: &ScaleError) -> ScaleError {
    match e {
        ScaleError::VersionGate(errs) => ScaleError::VersionGate(errs.clone()),
        ScaleError::Nodes(m) => ScaleError::Nodes(m.clone()),
        other => ScaleError::Nodes(crate::workflows::error::chain(other)),
    }
}
