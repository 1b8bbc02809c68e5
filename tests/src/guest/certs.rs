//! k3s's leaf certificates on a node and its certificate monitor (each rule cited in
//! `tests/FIDELITY.md`, "k3s certificates"):
//!
//! - k3s issues a node's leaf certificates (the supervisor's serving certificate on `:6443`,
//!   the kubelet's, the client certificates of its components and of `k3s.yaml`) valid for
//!   365 days, and on every start renews those that are expired or expire within
//!   `CertificateRenewDays` (90); a certificate further from its end is kept, so only a
//!   start inside that window renews (docs.k3s.io/cli/certificate; `dynamiclistener.Config`
//!   `ExpirationDaysCheck: config.CertificateRenewDays`).
//! - Its certificate monitor (k3s `pkg/certmonitor`) checks the node's certificates every
//!   30 minutes once the apiserver is up and records, on the Node, a Warning Event
//!   `CertificateExpirationWarning` naming each certificate within `CertificateRenewDays` of
//!   its end ("... will expire within 90 days at <RFC 3339>") or past it ("... expired at
//!   <RFC 3339>"); on the first check after start, with nothing to say, one Normal Event
//!   `CertificateExpirationOK`. The recorder's source component is `k3s-cert-monitor`, its
//!   namespace `default`.
//!
//! The simulator scales time: with a lifetime `L` (365 days on a real node) the renewal
//! window is `L·90/365` and the monitor's period `L·30min/365d` (at least one second), so a
//! year passes in minutes. All of a node's leaf certificates share one end, as k3s issues
//! and renews them together; the CA's are not modelled (ten years).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde_json::json;
use uuid::Uuid;

use super::{Inner, K3sState};

/// A real node's certificate lifetime (k3s: 365 days).
pub const REAL_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// k3s's `CertificateRenewDays`.
const RENEW_DAYS: u32 = 90;
/// k3s's `certCheckInterval`.
const CHECK_INTERVAL: Duration = Duration::from_secs(30 * 60);
/// The monitor's recorder (`version.Program + "-cert-monitor"`).
pub const MONITOR_COMPONENT: &str = "k3s-cert-monitor";

/// The renewal window for certificates of `lifetime` (k3s: 90 of 365 days).
pub fn renew_window(lifetime: Duration) -> Duration {
    lifetime.mul_f64(f64::from(RENEW_DAYS) / 365.0)
}

/// How often the certificate monitor checks, scaled as the lifetime is.
pub fn check_interval(lifetime: Duration) -> Duration {
    CHECK_INTERVAL
        .mul_f64(lifetime.as_secs_f64() / REAL_LIFETIME.as_secs_f64())
        .max(Duration::from_secs(1))
}

/// What a k3s start does with the node's certificates ending at `current` (None: none yet):
/// the end they have afterwards, and whether they were issued afresh.
pub fn on_start(
    current: Option<SystemTime>,
    now: SystemTime,
    lifetime: Duration,
) -> (SystemTime, bool) {
    match current {
        Some(end) if end > now + renew_window(lifetime) => (end, false),
        _ => (now + lifetime, true),
    }
}

fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The monitor's Event for a node whose certificates end at `end`, checked at `now`:
/// (type, reason, message), or None when there is nothing to say after the first check.
fn event(
    node: &str,
    end: SystemTime,
    now: SystemTime,
    lifetime: Duration,
    first: bool,
) -> Option<(&'static str, &'static str, String)> {
    // `checkCerts`: "<service>/<file>: certificate <subject> ..." for each certificate.
    let what = format!("kubelet/serving-kubelet.crt: certificate CN={node}");
    if end <= now {
        Some((
            "Warning",
            "CertificateExpirationWarning",
            format!(
                "Node certificates require attention - restart k3s on this node to trigger automatic rotation: {what} expired at {}",
                rfc3339(end)
            ),
        ))
    } else if end <= now + renew_window(lifetime) {
        Some((
            "Warning",
            "CertificateExpirationWarning",
            format!(
                "Node certificates require attention - restart k3s on this node to trigger automatic rotation: {what} will expire within {RENEW_DAYS} days at {}",
                rfc3339(end)
            ),
        ))
    } else if first {
        Some((
            "Normal",
            "CertificateExpirationOK",
            "Node and Certificate Authority certificates managed by k3s are OK".to_owned(),
        ))
    } else {
        None
    }
}

impl Inner {
    /// k3s came up on `id` (boot `generation`, unit run `run`): its certificate monitor runs
    /// as long as this k3s does.
    pub(super) fn start_cert_monitor(self: &Arc<Self>, id: Uuid, generation: u64, run: u64) {
        let inner = Arc::clone(self);
        let period = check_interval(self.cfg.cert_lifetime);
        self.runtime.spawn(async move {
            let mut first = true;
            loop {
                if !inner.unit_current(id, generation, run) {
                    return;
                }
                inner.cert_check(id, first).await;
                first = false;
                tokio::time::sleep(period).await;
            }
        });
    }

    /// One check: records the Event, if any, on the node's Node.
    async fn cert_check(self: &Arc<Self>, id: Uuid, first: bool) {
        let (api, node, end) = {
            let st = self.state();
            let Some(vm) = st.vms.get(&id) else { return };
            if vm.k3s != K3sState::Joined {
                return;
            }
            (self.api_of(&st, id), vm.node_name.clone(), vm.certs_end)
        };
        let (Some(api), Some(node), Some(end)) = (api, node, end) else {
            return;
        };
        let now = SystemTime::now();
        let Some((type_, reason, message)) = event(&node, end, now, self.cfg.cert_lifetime, first)
        else {
            return;
        };
        // The recorder aggregates repeats of one event into one object (count, last time).
        let name = format!("{node}.{}", reason.to_lowercase());
        let count = api
            .control_plane
            .get("v1", "Event", Some("default"), &name)
            .await
            .ok()
            .flatten()
            .filter(|e| e["message"] == json!(message))
            .and_then(|e| e["count"].as_i64())
            .unwrap_or(0);
        let stamp = rfc3339(now);
        let first_stamp = if count == 0 {
            stamp.clone()
        } else {
            String::new()
        };
        let mut ev = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": node, "uid": node},
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": MONITOR_COMPONENT, "host": node},
            "count": count + 1,
            "lastTimestamp": stamp,
        });
        if !first_stamp.is_empty() {
            ev["firstTimestamp"] = json!(first_stamp);
        }
        if let Err(e) = api.control_plane.apply(ev).await {
            tracing::debug!(instance = %id, error = %e, "the certificate monitor's event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_renews_only_inside_the_window() {
        let l = Duration::from_secs(365);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        assert_eq!(on_start(None, now, l), (now + l, true));
        let far = now + Duration::from_secs(200);
        assert_eq!(on_start(Some(far), now, l), (far, false));
        let near = now + Duration::from_secs(89);
        assert_eq!(on_start(Some(near), now, l), (now + l, true));
        let gone = now - Duration::from_secs(1);
        assert_eq!(on_start(Some(gone), now, l), (now + l, true));
    }

    #[test]
    fn the_monitor_warns_inside_the_window_and_says_ok_once() {
        let l = Duration::from_secs(365);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let ok = event("n", now + Duration::from_secs(300), now, l, true).unwrap();
        assert_eq!(ok.1, "CertificateExpirationOK");
        assert!(event("n", now + Duration::from_secs(300), now, l, false).is_none());
        let warn = event("n", now + Duration::from_secs(60), now, l, false).unwrap();
        assert_eq!(warn.1, "CertificateExpirationWarning");
        assert!(
            warn.2
                .contains("will expire within 90 days at 1970-01-01T02:47:40Z"),
            "{}",
            warn.2
        );
        let expired = event("n", now - Duration::from_secs(1), now, l, false).unwrap();
        assert!(
            expired.2.contains("expired at 1970-01-01T02:46:39Z"),
            "{}",
            expired.2
        );
    }
}
