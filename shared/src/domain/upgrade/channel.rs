//! Following a k3s release channel (`upgrade.channel`): what the channel's release means for
//! the cluster this run.
//!
//! The channel server names one release per channel (k3s's channels: `stable`, `latest`, one
//! per minor). A newer *patch* of the minor `k3s.version` names becomes `k3s.version` inside a
//! maintenance window, as `scale upgrade --to` would set it (the version gate and the spec's
//! checks pass first; the existing upgrade path rolls it, pre-flight included); outside every
//! window it waits, and status says until when. A newer *minor* is never adopted: it needs the
//! pre-flight's deprecated-API review and perhaps `upgrade.path`, a person's decision, so
//! status says to run `scale upgrade`. While an upgrade is under way the channel waits for it.
//!
//! Pure: the workflow asks the channel server (at most once a run) and writes the spec.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::maintenance::Gate;
use crate::domain::model::Node;
use crate::domain::spec::ClusterSpec;
use crate::domain::spec::upgrade::K3sVersion;

/// What the last run made of the channel, as `status.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelStatus {
    /// `upgrade.channel`.
    pub channel: String,
    /// The release the channel server named (absent when it could not be asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest: Option<String>,
    pub state: ChannelState,
    /// One sentence for people (also a finding, except when the cluster is current).
    pub message: String,
    /// With [`ChannelState::Waiting`]: when the next maintenance window opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<DateTime<Utc>>,
    pub checked_at: DateTime<Utc>,
}

/// Where the channel's release stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChannelState {
    /// `k3s.version` is the channel's release, or newer.
    Current,
    /// A newer patch waits for a maintenance window.
    Waiting,
    /// A newer patch, inside a window: the run sets `k3s.version` to it ([`Adopted`] once
    /// written).
    ///
    /// [`Adopted`]: ChannelState::Adopted
    Adopting,
    /// This run set `k3s.version` to the channel's patch; the upgrade path rolls it.
    Adopted,
    /// A newer patch that cannot be adopted now: an upgrade is under way, or the version
    /// gate refuses it (the message says which).
    Held,
    /// A newer minor (or major): only `scale upgrade` moves to it.
    NewerMinor,
    /// The channel server did not answer with a release this controller follows.
    Unresolved,
}

impl ChannelStatus {
    /// The finding this status makes (none while the cluster is current).
    pub fn finding(&self) -> Option<String> {
        (self.state != ChannelState::Current).then(|| self.message.clone())
    }
}

/// What the channel's answer (`resolved`: the release, or why there is none) means for
/// `spec` at `now`, with the maintenance windows' verdict `windows` and the Nodes.
pub fn decide(
    spec: &ClusterSpec,
    nodes: &[Node],
    resolved: Result<&str, &str>,
    windows: Gate,
    now: DateTime<Utc>,
) -> ChannelStatus {
    let channel = spec.upgrade.channel.clone().unwrap_or_default();
    let status = |latest: Option<&str>, state, message: String| ChannelStatus {
        channel: channel.clone(),
        latest: latest.map(str::to_owned),
        state,
        message,
        next_window: None,
        checked_at: now,
    };
    let latest = match resolved {
        Ok(l) => l,
        Err(e) => {
            return status(
                None,
                ChannelState::Unresolved,
                format!(
                    "could not resolve k3s channel {channel:?} at {}: {e}; the next run asks again",
                    spec.upgrade.channel_url
                ),
            );
        }
    };
    let Some(offered) = K3sVersion::parse(latest).filter(|v| v.pre.is_none()) else {
        return status(
            Some(latest),
            ChannelState::Unresolved,
            format!(
                "k3s channel {channel:?} names {latest:?}, which is not a k3s release (vX.Y.Z+k3sN, no pre-release); not followed"
            ),
        );
    };
    let Some(target) = K3sVersion::parse(&spec.k3s.version) else {
        // The spec's checks refuse such a spec before a run gets here.
        return status(
            Some(latest),
            ChannelState::Held,
            format!("k3s.version {:?} is not a k3s release", spec.k3s.version),
        );
    };
    if offered <= target {
        return status(
            Some(latest),
            ChannelState::Current,
            format!(
                "k3s channel {channel:?} names {latest}; k3s.version is {}",
                spec.k3s.version
            ),
        );
    }
    if (offered.major, offered.minor) != (target.major, target.minor) {
        return status(
            Some(latest),
            ChannelState::NewerMinor,
            format!(
                "k3s {latest} available on channel {channel:?} (a new minor; the cluster runs {}); run scale upgrade --to {latest}",
                spec.k3s.version
            ),
        );
    }
    let patch = status(Some(latest), ChannelState::Adopting, String::new());
    patch_of_the_running_minor(spec, nodes, windows, now, patch)
}

/// A newer patch (`status.latest`) of the minor `k3s.version` names: held while
/// an upgrade is under way or the version gate refuses it, else adopted inside a window and
/// waiting outside.
fn patch_of_the_running_minor(
    spec: &ClusterSpec,
    nodes: &[Node],
    windows: Gate,
    now: DateTime<Utc>,
    status: ChannelStatus,
) -> ChannelStatus {
    let latest = status.latest.clone().unwrap_or_default();
    let channel = status.channel.clone();
    let say = |state, message| ChannelStatus {
        state,
        message,
        ..status.clone()
    };
    if let Some(u) = super::progress(spec, nodes, now, None).upgrade {
        return say(
            ChannelState::Held,
            format!(
                "k3s {latest} (channel {channel:?}) waits for the upgrade under way to {} to finish (phase {})",
                u.to, u.phase
            ),
        );
    }
    let mut next = spec.clone();
    next.k3s.version.clone_from(&latest);
    let mut refused: Vec<String> = super::gate(&next, nodes)
        .err()
        .map(|e| e.0)
        .unwrap_or_default()
        .into_iter()
        .chain(next.validate().err().map(|e| e.0).unwrap_or_default())
        .map(|e| format!("{}: {}", e.field, e.message))
        .collect();
    refused.dedup();
    if !refused.is_empty() {
        return say(
            ChannelState::Held,
            format!(
                "k3s {latest} (channel {channel:?}) is refused: {}",
                refused.join("; ")
            ),
        );
    }
    match windows {
        Gate::Allowed => say(
            ChannelState::Adopting,
            format!(
                "k3s channel {channel:?} names {latest}: setting k3s.version (was {}) inside a maintenance window",
                spec.k3s.version
            ),
        ),
        Gate::Wait { next_open } => ChannelStatus {
            next_window: next_open,
            ..say(
                ChannelState::Waiting,
                format!(
                    "k3s {latest} (channel {channel:?}; the cluster runs {}) waits for {}",
                    spec.k3s.version,
                    windows.describe_wait()
                ),
            )
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::TimeZone;

    use super::*;
    use crate::domain::model::NodeReadiness;
    use crate::domain::spec::POOL_LABEL;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 27, 0, 0, 0).unwrap()
    }

    fn spec(version: &str) -> ClusterSpec {
        let mut s = ClusterSpec::new("demo", "demo", "ubuntu", 3, 1);
        s.k3s.version = version.into();
        s.upgrade.channel = Some("v1.33".into());
        s
    }

    fn nodes(cp: &str, workers: &str) -> Vec<Node> {
        let node = |name: &str, pool: &str, v: &str| Node {
            name: name.into(),
            provider_id: None,
            labels: BTreeMap::from([(POOL_LABEL.to_owned(), pool.to_owned())]),
            annotations: BTreeMap::new(),
            readiness: NodeReadiness::Ready,
            unschedulable: false,
            created: now(),
            taints: Vec::new(),
            allocatable: Default::default(),
            kubelet_version: Some(v.into()),
            deleting_since: None,
        };
        vec![
            node("cp0", "control-plane", cp),
            node("cp1", "control-plane", cp),
            node("cp2", "control-plane", cp),
            node("wk0", "workers", workers),
        ]
    }

    const RUNS: &str = "v1.33.4+k3s1";
    const PATCH: &str = "v1.33.7+k3s3";
    const NEXT_WINDOW: Gate = Gate::Wait {
        next_open: Some(DateTime::from_timestamp(1_796_000_000, 0).unwrap()),
    };

    #[test]
    fn a_newer_patch_is_adopted_inside_a_window_and_waits_outside_naming_the_next() {
        let s = spec(RUNS);
        let n = nodes(RUNS, RUNS);
        let inside = decide(&s, &n, Ok(PATCH), Gate::Allowed, now());
        assert_eq!(inside.state, ChannelState::Adopting);
        assert_eq!(inside.latest.as_deref(), Some(PATCH));
        let outside = decide(&s, &n, Ok(PATCH), NEXT_WINDOW, now());
        assert_eq!(outside.state, ChannelState::Waiting);
        assert_eq!(
            outside.next_window,
            Some(DateTime::from_timestamp(1_796_000_000, 0).unwrap())
        );
        assert_eq!(
            outside.finding().unwrap(),
            "k3s v1.33.7+k3s3 (channel \"v1.33\"; the cluster runs v1.33.4+k3s1) waits for the maintenance window opening at 2026-11-30T00:53:20Z"
        );
        // A newer k3s build of the same patch is a patch too.
        let build = decide(&s, &n, Ok("v1.33.4+k3s2"), Gate::Allowed, now());
        assert_eq!(build.state, ChannelState::Adopting);
    }

    #[test]
    fn a_newer_minor_is_never_adopted_even_inside_a_window() {
        let mut s = spec(RUNS);
        s.upgrade.channel = Some("stable".into());
        let st = decide(
            &s,
            &nodes(RUNS, RUNS),
            Ok("v1.34.1+k3s1"),
            Gate::Allowed,
            now(),
        );
        assert_eq!(st.state, ChannelState::NewerMinor);
        assert_eq!(
            st.message,
            "k3s v1.34.1+k3s1 available on channel \"stable\" (a new minor; the cluster runs v1.33.4+k3s1); run scale upgrade --to v1.34.1+k3s1"
        );
        let major = decide(
            &s,
            &nodes(RUNS, RUNS),
            Ok("v2.0.0+k3s1"),
            Gate::Allowed,
            now(),
        );
        assert_eq!(major.state, ChannelState::NewerMinor);
    }

    #[test]
    fn the_same_or_an_older_release_is_current_and_no_finding() {
        let s = spec(PATCH);
        let n = nodes(PATCH, PATCH);
        for offered in [PATCH, RUNS, "v1.32.9+k3s1"] {
            let st = decide(&s, &n, Ok(offered), Gate::Allowed, now());
            assert_eq!(st.state, ChannelState::Current, "{offered}");
            assert_eq!(st.finding(), None);
        }
    }

    #[test]
    fn a_patch_waits_while_an_upgrade_is_under_way() {
        // k3s.version was raised; the workers still run the old release.
        let s = spec(RUNS);
        let st = decide(
            &s,
            &nodes(RUNS, "v1.33.1+k3s1"),
            Ok(PATCH),
            Gate::Allowed,
            now(),
        );
        assert_eq!(st.state, ChannelState::Held, "{st:?}");
        assert!(
            st.message
                .contains("waits for the upgrade under way to v1.33.4+k3s1"),
            "{st:?}"
        );
    }

    #[test]
    fn a_patch_the_version_gate_refuses_is_held_with_the_gates_words() {
        // The control plane's own k3s_version must equal k3s.version.
        let mut s = spec(RUNS);
        s.control_plane.k3s_version = Some(RUNS.into());
        let st = decide(&s, &nodes(RUNS, RUNS), Ok(PATCH), Gate::Allowed, now());
        assert_eq!(st.state, ChannelState::Held, "{st:?}");
        assert!(
            st.message
                .starts_with("k3s v1.33.7+k3s3 (channel \"v1.33\") is refused: "),
            "{st:?}"
        );
    }

    #[test]
    fn an_unanswered_channel_or_a_pre_release_is_unresolved_not_an_error() {
        let s = spec(RUNS);
        let n = nodes(RUNS, RUNS);
        let st = decide(&s, &n, Err("HTTP 503"), Gate::Allowed, now());
        assert_eq!(st.state, ChannelState::Unresolved);
        assert_eq!(
            st.message,
            "could not resolve k3s channel \"v1.33\" at https://update.k3s.io/v1-release/channels: HTTP 503; the next run asks again"
        );
        for bad in ["v1.33.8-rc1+k3s1", "stable", ""] {
            let st = decide(&s, &n, Ok(bad), Gate::Allowed, now());
            assert_eq!(st.state, ChannelState::Unresolved, "{bad}");
            assert!(st.message.contains("not followed"), "{st:?}");
        }
    }
}
