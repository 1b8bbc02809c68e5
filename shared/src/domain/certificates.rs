//! Certificates renewed with nobody at the keyboard (issue 46 item 1).
//!
//! **What is read.** k3s's certificate monitor (`pkg/certmonitor`) checks every leaf
//! certificate of its node — the serving certificates of the supervisor and the kubelet and
//! the client certificates of every component — every 30 minutes, and records on the Node a
//! Warning Event `CertificateExpirationWarning` naming each one within 90 days of its end
//! (`... will expire within 90 days at <RFC 3339>`, `... expired at <RFC 3339>`), and on its
//! first check after a start with nothing to say, a Normal `CertificateExpirationOK`. One
//! list of those Events (namespace `default`, source `k3s-cert-monitor`) tells a run about
//! every certificate of every node — client certificates too, which no TLS handshake shows
//! — at one request whatever the cluster's size.
//!
//! **How it is renewed.** k3s renews a node's leaf certificates when it starts within 90 days
//! of their end (docs.k3s.io/cli/certificate), and the Event itself says "restart k3s on this
//! node to trigger automatic rotation". The run restarts the node by rebooting its instance
//! (the reconcile has no shell on nodes, and a reboot is what the rack offers): a worker is
//! cordoned and drained first and uncordoned once its monitor reports after the restart; a
//! server is restarted only while every other member is Ready and etcd's members match, one
//! node at a time in the whole cluster, and only when the plan has nothing else to do. A
//! restart, not a roll: it keeps the etcd member and the VM, and needs no spare capacity.
//!
//! **Told.** `status.json` carries per pool the earliest end the monitors report; a node
//! whose certificates end within `degraded_before_days` makes the cluster Degraded with
//! reason `CertificatesExpiring` (its renewal should have happened at `renew_before_days`).

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// The monitor's Event source component (`version.Program + "-cert-monitor"`).
pub const MONITOR_SOURCE: &str = "k3s-cert-monitor";
/// The namespace its recorder writes to (`metav1.NamespaceDefault`).
pub const MONITOR_NAMESPACE: &str = "default";
/// A certificate within the window, or past its end.
pub const WARNING_REASON: &str = "CertificateExpirationWarning";
/// The first check after a start found nothing to say.
pub const OK_REASON: &str = "CertificateExpirationOK";
/// k3s's `CertificateRenewDays`: a start renews only certificates this close to their end,
/// and the monitor warns only then.
pub const K3S_RENEW_DAYS: f64 = 90.0;
/// The Degraded condition's reason when a certificate ends within `degraded_before_days`.
pub const DEGRADED_REASON: &str = "CertificatesExpiring";
/// The Node annotation of a restart for certificates: `restarting <RFC 3339>` from the run
/// that asked for it until the monitor reports after it, then `done <RFC 3339>`.
pub const RESTART_ANNOTATION: &str = "oxide-controller/certificates-restart";

/// `certificates` in the cluster spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateSpec {
    /// Restart a node whose certificates end within this many days (default 60; at most
    /// k3s's 90, the only window in which a start renews and the monitor reports).
    #[serde(default = "default_renew")]
    pub renew_before_days: f64,
    /// Degraded (reason `CertificatesExpiring`) when one ends within this many days: its
    /// renewal did not happen (default 30; below `renew_before_days`).
    #[serde(default = "default_degraded")]
    pub degraded_before_days: f64,
}

fn default_renew() -> f64 {
    60.0
}

fn default_degraded() -> f64 {
    30.0
}

impl Default for CertificateSpec {
    fn default() -> Self {
        CertificateSpec {
            renew_before_days: default_renew(),
            degraded_before_days: default_degraded(),
        }
    }
}

impl CertificateSpec {
    pub fn is_default(&self) -> bool {
        *self == CertificateSpec::default()
    }

    /// Errors, each saying what to change.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        let r = self.renew_before_days;
        let d = self.degraded_before_days;
        if !(r > 0.0 && r <= K3S_RENEW_DAYS) {
            errs.push((
                "certificates.renew_before_days".into(),
                format!(
                    "{r} is not in (0, {K3S_RENEW_DAYS}]: k3s renews a node's certificates on a start only within {K3S_RENEW_DAYS} days of their end"
                ),
            ));
        }
        if !(d > 0.0 && d < r) {
            errs.push((
                "certificates.degraded_before_days".into(),
                format!("{d} must be above 0 and below renew_before_days ({r})"),
            ));
        }
        errs
    }

    pub fn renew_before(&self) -> Duration {
        days(self.renew_before_days)
    }

    pub fn degraded_before(&self) -> Duration {
        days(self.degraded_before_days)
    }
}

fn days(d: f64) -> Duration {
    // Whole milliseconds: a fraction of a day is allowed (a scaled clock in tests).
    #[allow(clippy::cast_possible_truncation)]
    Duration::milliseconds((d * 86_400_000.0).round() as i64)
}

/// One Event of a node's certificate monitor, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorEvent {
    pub node: String,
    pub reason: String,
    pub message: String,
    /// `lastTimestamp` (or `eventTime`): when the monitor last said it.
    pub last_seen: DateTime<Utc>,
}

/// What a node's monitor said last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub at: DateTime<Utc>,
    /// The earliest end it named (None: all fine, or nothing it named could be read).
    pub ends: Option<DateTime<Utc>>,
}

/// The earliest end named in a monitor message: each certificate's line ends
/// `will expire within <n> days at <RFC 3339>` or `expired at <RFC 3339>`.
pub fn earliest_end(message: &str) -> Option<DateTime<Utc>> {
    message
        .match_indices(" at ")
        .filter_map(|(i, _)| {
            let rest = &message[i + 4..];
            let token = rest.split_whitespace().next()?;
            DateTime::parse_from_rfc3339(token.trim_end_matches([',', ';']))
                .ok()
                .map(|t| t.with_timezone(&Utc))
        })
        .min()
}

/// Each node's latest report: its newest monitor Event (a warning names the earliest end).
pub fn latest(events: &[MonitorEvent]) -> BTreeMap<String, Report> {
    let mut out: BTreeMap<String, Report> = BTreeMap::new();
    for e in events {
        let ends = if e.reason == WARNING_REASON {
            earliest_end(&e.message)
        } else if e.reason == OK_REASON {
            None
        } else {
            continue;
        };
        let newer = out.get(&e.node).is_none_or(|r| e.last_seen > r.at);
        if newer {
            out.insert(
                e.node.clone(),
                Report {
                    at: e.last_seen,
                    ends,
                },
            );
        }
    }
    out
}

/// A restart for certificates, as the Node's [`RESTART_ANNOTATION`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// Asked for at this time; not yet reported on by the node's monitor.
    Restarting(DateTime<Utc>),
    /// Reported on after the restart asked for at this time.
    Done(DateTime<Utc>),
}

impl Restart {
    pub fn parse(value: &str) -> Option<Restart> {
        let (state, at) = value.split_once(' ')?;
        let at = DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc);
        match state {
            "restarting" => Some(Restart::Restarting(at)),
            "done" => Some(Restart::Done(at)),
            _ => None,
        }
    }

    pub fn value(&self) -> String {
        let (state, at) = match self {
            Restart::Restarting(at) => ("restarting", at),
            Restart::Done(at) => ("done", at),
        };
        format!(
            "{state} {}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    }
}

/// Per pool, the earliest end its nodes' monitors report (`status.json`'s `certificates`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolCertificates {
    pub pool: String,
    /// The earliest end reported, and by which node; absent when every node's monitor says
    /// nothing ends within k3s's 90 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_end: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Nodes whose monitor has not reported (yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreported: Vec<String>,
    /// The node being restarted for its certificates, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarting: Option<String>,
}

/// What the planner made of the certificates this run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub pools: Vec<PoolCertificates>,
    /// Set when one ends within `degraded_before_days`: the condition's message.
    pub degraded: Option<String>,
    /// When this run read the monitors' Events (None: it did not, see [`monitor_read_due`];
    /// the last run's `pools` stand).
    pub read_at: Option<DateTime<Utc>>,
}

/// The longest a run goes without listing the monitors' Events while nothing is near its
/// end: k3s's monitor itself checks every 30 minutes (`pkg/certmonitor`), so a fresher look
/// tells nothing new, and a list a run is one more request on every no-op run.
pub const MONITOR_READ_MAX_EVERY: Duration = Duration::minutes(10);

/// How often a run lists the monitors' Events while nothing is near: [`MONITOR_READ_MAX_EVERY`],
/// or a sixteenth of the time between `renew_before` and `degraded_before` when that is
/// shorter (scaled-down settings in tests), so a renewal missed is seen long before Degraded.
pub fn monitor_read_every(spec: &CertificateSpec) -> Duration {
    ((spec.renew_before() - spec.degraded_before()) / 16)
        .clamp(Duration::zero(), MONITOR_READ_MAX_EVERY)
}

/// Whether this run lists the monitors' Events: never read (or the last read failed), read
/// [`monitor_read_every`] ago, a restart for certificates under way (its end is the monitor's
/// report after it), or an end within `renew_before` (a restart may start: every run looks).
/// `pools` and `read_at` are the last run's.
pub fn monitor_read_due(
    pools: &[PoolCertificates],
    read_at: Option<DateTime<Utc>>,
    spec: &CertificateSpec,
    now: DateTime<Utc>,
) -> bool {
    let Some(at) = read_at else { return true };
    now - at >= monitor_read_every(spec)
        || pools.iter().any(|p| {
            p.restarting.is_some()
                || p.earliest_end
                    .is_some_and(|end| end - now <= spec.renew_before())
        })
}

/// The webhook's serving certificate as the reconcile keeps it (`status.json`'s
/// `webhookCertificate`): its end, when the run last read it, when it was last re-issued, and
/// why it could not be, if it could not.
///
/// The pair lives in Secret `oxide-controller-webhook-tls`, signed by the cluster's webhook CA
/// whose key is in `oxide-controller-webhook-ca` (see
/// [`crate::adapters::webhook_tls`]). A run reads the pair only when this record says it
/// must ([`webhook_needs_read`]): a no-op run costs no request for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookCertificate {
    pub not_after: DateTime<Utc>,
    pub checked_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<DateTime<Utc>>,
    /// Why a due re-issue did not happen (no CA key, a refused write); cleared by one that did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How long a recorded end is trusted before the Secret is read again (someone may have
/// replaced the pair by hand).
pub const WEBHOOK_RECHECK: Duration = Duration::hours(24);

/// Whether this run reads the webhook's pair: nothing recorded, a record older than
/// [`WEBHOOK_RECHECK`], or an end within `renew_before` (then it is re-issued).
pub fn webhook_needs_read(
    recorded: Option<&WebhookCertificate>,
    spec: &CertificateSpec,
    now: DateTime<Utc>,
) -> bool {
    recorded.is_none_or(|r| {
        now - r.checked_at >= WEBHOOK_RECHECK || webhook_due(r.not_after, spec, now)
    })
}

/// Whether a serving certificate ending at `end` is re-issued now.
pub fn webhook_due(end: DateTime<Utc>, spec: &CertificateSpec, now: DateTime<Utc>) -> bool {
    now >= end - spec.renew_before()
}

/// The Degraded finding for the webhook's certificate: within `degraded_before` of its end
/// (it was not re-issued at `renew_before`), with the reason it could not be.
pub fn webhook_finding(
    recorded: &WebhookCertificate,
    spec: &CertificateSpec,
    now: DateTime<Utc>,
) -> Option<String> {
    if now < recorded.not_after - spec.degraded_before() {
        return None;
    }
    let verb = if now >= recorded.not_after {
        "ended"
    } else {
        "ends"
    };
    Some(format!(
        "{DEGRADED_REASON}: the webhook's TLS certificate (Secret kube-system/oxide-controller-webhook-tls) {verb} at {} and was not re-issued: {}",
        recorded
            .not_after
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        recorded.error.as_deref().unwrap_or("no run has tried yet")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn the_earliest_end_is_read_from_every_line_of_a_monitor_message() {
        // k3s `checkCerts` joins one error per certificate (errors.Join: newline-separated).
        let m = "Node certificates require attention - restart k3s on this node to trigger automatic rotation: kubelet/serving-kubelet.crt: certificate CN=w1 will expire within 90 days at 2027-02-01T10:00:00Z\nk3s-controller/client-k3s-controller.crt: certificate CN=system:k3s-controller expired at 2027-01-15T00:00:00Z";
        assert_eq!(earliest_end(m), Some(t("2027-01-15T00:00:00Z")));
        assert_eq!(
            earliest_end("Node and Certificate Authority certificates managed by k3s are OK"),
            None
        );
    }

    #[test]
    fn a_nodes_newest_event_is_its_report() {
        let ev = |reason: &str, msg: &str, at: &str| MonitorEvent {
            node: "n".into(),
            reason: reason.into(),
            message: msg.into(),
            last_seen: t(at),
        };
        let warn = ev(
            WARNING_REASON,
            "x: certificate CN=n will expire within 90 days at 2027-02-01T10:00:00Z",
            "2026-12-01T00:00:00Z",
        );
        let ok = ev(OK_REASON, "fine", "2026-12-02T00:00:00Z");
        let r = latest(&[warn.clone(), ok.clone()]);
        assert_eq!(r["n"].ends, None);
        let r = latest(&[ok, warn]);
        assert_eq!(r["n"].ends, None, "order of listing does not matter");
        let later = ev(
            WARNING_REASON,
            "x: certificate CN=n expired at 2027-02-01T10:00:00Z",
            "2026-12-03T00:00:00Z",
        );
        assert_eq!(latest(&[later])["n"].ends, Some(t("2027-02-01T10:00:00Z")));
    }

    #[test]
    fn settings_are_bounded_by_k3s_renewal_window() {
        assert!(CertificateSpec::default().validate().is_empty());
        let too_early = CertificateSpec {
            renew_before_days: 120.0,
            degraded_before_days: 30.0,
        };
        assert_eq!(too_early.validate()[0].0, "certificates.renew_before_days");
        let inverted = CertificateSpec {
            renew_before_days: 20.0,
            degraded_before_days: 30.0,
        };
        assert_eq!(
            inverted.validate()[0].0,
            "certificates.degraded_before_days"
        );
        let scaled = CertificateSpec {
            renew_before_days: 0.001,
            degraded_before_days: 0.0004,
        };
        assert!(scaled.validate().is_empty());
        assert_eq!(scaled.renew_before(), Duration::milliseconds(86_400));
    }

    #[test]
    fn a_restart_annotation_round_trips() {
        let r = Restart::Restarting(t("2026-12-01T00:00:00Z"));
        assert_eq!(Restart::parse(&r.value()), Some(r));
        let d = Restart::Done(t("2026-12-01T00:00:00Z"));
        assert_eq!(d.value(), "done 2026-12-01T00:00:00Z");
        assert_eq!(Restart::parse("soon"), None);
    }

    #[test]
    fn the_webhook_pair_is_read_only_when_unknown_stale_or_due() {
        let spec = CertificateSpec::default();
        let now = t("2027-01-01T00:00:00Z");
        assert!(webhook_needs_read(None, &spec, now));
        let r = WebhookCertificate {
            not_after: now + Duration::days(200),
            checked_at: now - Duration::hours(1),
            renewed_at: None,
            error: None,
        };
        assert!(
            !webhook_needs_read(Some(&r), &spec, now),
            "a no-op run reads nothing"
        );
        let stale = WebhookCertificate {
            checked_at: now - Duration::hours(25),
            ..r.clone()
        };
        assert!(webhook_needs_read(Some(&stale), &spec, now));
        let due = WebhookCertificate {
            not_after: now + Duration::days(59),
            ..r.clone()
        };
        assert!(webhook_needs_read(Some(&due), &spec, now));
        assert!(webhook_due(due.not_after, &spec, now));
        assert!(!webhook_due(r.not_after, &spec, now));
        assert_eq!(webhook_finding(&due, &spec, now), None, "not yet Degraded");
        let late = WebhookCertificate {
            not_after: now + Duration::days(10),
            error: Some("no CA key".into()),
            ..r
        };
        let m = webhook_finding(&late, &spec, now).unwrap();
        assert!(m.starts_with("CertificatesExpiring: "), "{m}");
        assert!(
            m.contains("no CA key") && m.contains("2027-01-11T00:00:00Z"),
            "{m}"
        );
    }

    #[test]
    fn the_monitors_events_are_listed_when_due_not_on_every_run() {
        let spec = CertificateSpec::default();
        let now = t("2027-01-01T00:00:00Z");
        assert_eq!(monitor_read_every(&spec), MONITOR_READ_MAX_EVERY);
        let quiet = PoolCertificates {
            pool: "workers".into(),
            earliest_end: None,
            node: None,
            unreported: vec!["w9".into()],
            restarting: None,
        };
        let pools = vec![quiet.clone()];
        assert!(monitor_read_due(&pools, None, &spec, now), "never read");
        let just = Some(now - Duration::minutes(1));
        assert!(
            !monitor_read_due(&pools, just, &spec, now),
            "a no-op run lists nothing"
        );
        assert!(monitor_read_due(
            &pools,
            Some(now - Duration::minutes(10)),
            &spec,
            now
        ));
        let near = vec![PoolCertificates {
            earliest_end: Some(now + Duration::days(59)),
            node: Some("w1".into()),
            ..quiet.clone()
        }];
        assert!(
            monitor_read_due(&near, just, &spec, now),
            "within renew_before"
        );
        let far = vec![PoolCertificates {
            earliest_end: Some(now + Duration::days(80)),
            node: Some("w1".into()),
            ..quiet.clone()
        }];
        assert!(!monitor_read_due(&far, just, &spec, now));
        let restarting = vec![PoolCertificates {
            restarting: Some("w1".into()),
            ..quiet
        }];
        assert!(
            monitor_read_due(&restarting, just, &spec, now),
            "a restart under way"
        );
        // Scaled settings (tests): a sixteenth of the renew-to-degraded span.
        let scaled = CertificateSpec {
            renew_before_days: 0.001,
            degraded_before_days: 0.0002,
        };
        assert_eq!(monitor_read_every(&scaled), Duration::milliseconds(4320));
    }
}
