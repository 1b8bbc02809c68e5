//! The release channel inside a run (`upgrade.channel`): ask the channel server once, let the
//! pure [`crate::domain::upgrade::channel::decide`] judge the answer against the maintenance
//! windows, and, when it says so, set `k3s.version` to the channel's patch with the scale
//! workflow's conflict-safe write (what `scale upgrade --to` writes); the run then plans with
//! that spec, so the existing upgrade path (pre-flight, servers first) rolls it.
//!
//! Requests: one `GET` of the channel server per run with a channel (none without one), and
//! the ConfigMap write when a patch is adopted. A channel server that does not answer is a
//! finding, never a failed run.

use tracing::{info, warn};

use crate::domain::maintenance::Windows;
use crate::domain::model::Node;
use crate::domain::spec::{ClusterSpec, SpecLoadError};
use crate::domain::upgrade::channel::{self, ChannelState, ChannelStatus};
use crate::ports::cluster::{Cluster, EventType};
use crate::ports::state::StateStore;
use crate::workflows::scale::{self, ScaleError, ScaleOptions, SpecCache};

/// Follows `spec`'s channel (asked through `opts.channels`, at `opts.now`): returns the spec the run goes on with (the adopted
/// patch's, once written) and the channel's status (None without a channel).
pub async fn follow<S: StateStore, C: Cluster>(
    state: &S,
    cluster: &C,
    opts: &super::ReconcileOptions,
    spec: ClusterSpec,
    nodes: &[Node],
) -> (ClusterSpec, Option<ChannelStatus>) {
    let Some(name) = spec.upgrade.channel.clone() else {
        return (spec, None);
    };
    let now = (opts.now)();
    let asked = opts.channels.latest(&spec.upgrade.channel_url, &name).await;
    let resolved = asked.as_deref().map_err(ToString::to_string);
    let gate = Windows::new(&spec.maintenance).allows(now);
    let mut status = channel::decide(
        &spec,
        nodes,
        resolved.as_deref().map_err(String::as_str),
        gate,
        now,
    );
    match status.state {
        ChannelState::Adopting => {}
        ChannelState::Unresolved => {
            warn!(channel = %name, message = %status.message, "k3s channel not resolved");
            return (spec, Some(status));
        }
        _ => return (spec, Some(status)),
    }
    let Some(latest) = status.latest.clone() else {
        return (spec, Some(status));
    };
    match adopt(state, &spec, &latest, nodes).await {
        Ok(adopted) => {
            status.state = ChannelState::Adopted;
            status.message = format!(
                "k3s channel {name:?} names {latest}: k3s.version set to it (was {}) inside a maintenance window; the cluster rolls to it",
                spec.k3s.version
            );
            info!(channel = %name, from = %spec.k3s.version, to = %latest, "patch release adopted from the channel");
            if let Err(e) = cluster
                .record_event(EventType::Normal, "PatchReleaseAdopted", &status.message)
                .await
            {
                warn!(error = %e, "could not record event");
            }
            (adopted, Some(status))
        }
        Err(why) => {
            status.state = ChannelState::Held;
            status.message = format!("k3s {latest} (channel {name:?}) was not adopted: {why}");
            warn!(channel = %name, message = %status.message, "patch release not adopted");
            (spec, Some(status))
        }
    }
}

/// Writes `k3s.version = latest` into the stored spec, if that spec still names the version
/// this run decided from, and passes the version gate and the spec's checks against `nodes`.
/// Returns the spec written, or why nothing was.
async fn adopt<S: StateStore>(
    state: &S,
    decided_from: &ClusterSpec,
    latest: &str,
    nodes: &[Node],
) -> Result<ClusterSpec, String> {
    let from = decided_from.k3s.version.clone();
    let written = scale::edit_spec(
        state,
        &ScaleOptions::default(),
        &SpecCache::default(),
        |stored, _| {
            if stored.k3s.version != from {
                return Ok((None, false));
            }
            stored.k3s.version = latest.to_owned();
            let mut errors = crate::domain::upgrade::gate(stored, nodes)
                .err()
                .map_or_else(Vec::new, |e| e.0);
            errors.extend(stored.validate().err().map_or_else(Vec::new, |e| e.0));
            if !errors.is_empty() {
                return Err(ScaleError::Spec(SpecLoadError::Invalid(
                    crate::domain::spec::SpecErrors(errors),
                )));
            }
            Ok((Some(stored.clone()), true))
        },
    )
    .await;
    match written {
        Ok((Some(spec), true, _)) => Ok(spec),
        Ok(_) => Err(format!(
            "k3s.version changed from {from} while the run decided; the next run decides again"
        )),
        Err(ScaleError::Spec(SpecLoadError::Invalid(e))) => Err(e
            .0
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; ")),
        Err(e) => Err(crate::workflows::error::chain(&e)),
    }
}
