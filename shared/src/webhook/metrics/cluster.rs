//! The cluster's own metrics at `/metrics`: what the last reconcile wrote to `status.json`
//! (conditions, the last run, pools, the backup, the upgrade, findings) as Prometheus gauges,
//! every series labelled `cluster`. Timestamps are gauges in seconds since the epoch (the
//! Prometheus convention: an alert computes `time() - x`).
//!
//! Two pure steps: [`Input::from_snapshot`] reads the ConfigMap's data as read (the clock
//! passed in), [`render`] writes the text exposition format (version 0.0.4) from an
//! [`Input`]. Reading the ConfigMap and caching it between scrapes is the webhook's
//! ([`super::super::cluster_metrics`]); the webhook's own request counters are
//! [`super::Metrics`]. The alerts and the dashboard built on these names are in
//! `charts/oxide-controller/files/` (a test there fails on a name this module does not render).
//!
//! Label values come from the spec and status the reconcile wrote (pool names, condition
//! types and reasons, versions, upgrade phases): never from a request, never a secret, and
//! never a free-text message (unbounded, and it may carry a host name or an error's detail).

use std::fmt::Write as _;

use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;

use crate::base::kcron::Schedule;
use crate::domain::plan::PoolCounts;
use crate::domain::status::Status;
use crate::domain::upgrade::Phase;
use crate::ports::state::ConfigSnapshot;

/// Everything the cluster metrics are rendered from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Input {
    /// The spec's cluster name; empty when no spec could be read.
    pub cluster: String,
    /// `status.json` was read and understood (false: no run has written it yet, it does not
    /// parse, or the ConfigMap could not be read).
    pub status_up: bool,
    /// The longest gap between two ticks of the spec's reconcile schedule (over the week
    /// ahead): an alert's unit for "the reconcile has not run".
    pub reconcile_interval: Option<Duration>,
    pub last_run_started: Option<DateTime<Utc>>,
    pub last_run_finished: Option<DateTime<Utc>>,
    pub last_converged: Option<DateTime<Utc>>,
    pub conditions: Vec<ConditionInput>,
    pub pools: Vec<PoolCounts>,
    /// Findings of the last plan (each a line of `scale status`).
    pub findings: usize,
    pub backup: Option<BackupInput>,
    /// The upgrade under way; None when none is.
    pub upgrade: Option<UpgradeInput>,
    /// Per pool (and `webhook` for the webhook's own), the earliest NotAfter of the
    /// certificates the reconcile read. None until status.json carries them.
    pub certificates: Option<Vec<CertificateExpiry>>,
    /// The newest restore drill. None until status.json carries it.
    pub drill: Option<DrillInput>,
    /// The maintenance windows and the release waiting for one. None until status.json
    /// carries them.
    pub maintenance: Option<MaintenanceInput>,
    /// When the cluster's Oxide token stops working. None when it never does or is not known.
    pub oxide_token_expiry: Option<DateTime<Utc>>,
}

/// One condition of `status.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionInput {
    /// `Ready`, `Progressing`, `Degraded`.
    pub type_: String,
    pub status: bool,
    /// A CamelCase word (`Converged`, `RunFailed`, ...): a bounded set, so a label.
    pub reason: String,
    pub last_transition: DateTime<Utc>,
}

/// The backup part of `status.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupInput {
    /// The spec has a backup schedule (the in-cluster backup is on).
    pub scheduled: bool,
    pub last_success: Option<DateTime<Utc>>,
    pub last_success_bytes: Option<u64>,
    pub last_attempt: Option<DateTime<Utc>>,
    /// The last attempt failed.
    pub last_attempt_failed: bool,
    /// The reconcile's verdict: the newest backup is older than two schedule periods.
    pub stale: bool,
}

/// The upgrade under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeInput {
    pub from: String,
    pub to: String,
    pub phase: Phase,
    pub started: DateTime<Utc>,
    /// What keeps it from going on (the pre-flight's blockers).
    pub blockers: usize,
}

/// The earliest certificate expiry of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateExpiry {
    pub pool: String,
    pub not_after: DateTime<Utc>,
}

/// The newest restore drill.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrillInput {
    /// When the newest drill finished; None: none has run.
    pub last: Option<DateTime<Utc>>,
    /// Whether it restored and checked out.
    pub last_success: Option<bool>,
    /// The reconcile's verdict: the drill schedule has passed without one.
    pub overdue: bool,
}

/// Maintenance windows and the release waiting for one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MaintenanceInput {
    /// The next window's start; None: no windows configured, or one is open now.
    pub next_window: Option<DateTime<Utc>>,
    /// A release the channel offers that waits for a window.
    pub waiting_release: Option<String>,
}

/// The two keys of `spec.yaml` the metrics need, read on their own so that a spec the
/// reconcile would refuse still names its cluster (when an alert matters most).
#[derive(Deserialize)]
struct SpecHead {
    cluster: String,
    #[serde(default)]
    schedule: Option<String>,
}

/// The spec's reconcile schedule when it has none (`domain::spec`'s default).
const DEFAULT_SCHEDULE: &str = "*/5 * * * *";

/// How far ahead [`longest_gap`] looks, and at most how many ticks it walks.
const GAP_HORIZON_DAYS: i64 = 7;
const GAP_MAX_TICKS: usize = 2016;

impl Input {
    /// The input from the ConfigMap's data as read at `now`.
    pub fn from_snapshot(snapshot: &ConfigSnapshot, now: DateTime<Utc>) -> Input {
        let head = snapshot
            .spec_yaml()
            .and_then(|y| serde_saphyr::from_str::<SpecHead>(y).ok());
        let reconcile_interval = head.as_ref().and_then(|h| {
            let schedule = h.schedule.as_deref().unwrap_or(DEFAULT_SCHEDULE);
            longest_gap(&Schedule::parse(schedule).ok()?, now)
        });
        let cluster = head.map(|h| h.cluster).unwrap_or_default();
        let Some(status) = snapshot.status_json().and_then(Status::from_json) else {
            return Input {
                cluster,
                reconcile_interval,
                ..Input::default()
            };
        };
        Input {
            cluster,
            reconcile_interval,
            ..Input::from_status(&status)
        }
    }

    /// Everything `status` says (not the cluster name or the schedule: those are the spec's).
    pub fn from_status(status: &Status) -> Input {
        Input {
            status_up: true,
            last_run_started: Some(status.started_at),
            last_run_finished: Some(status.finished_at),
            last_converged: status.last_converged_at,
            conditions: status
                .conditions
                .iter()
                .map(|c| ConditionInput {
                    type_: c.type_.clone(),
                    status: c.status == "True",
                    reason: c.reason.clone(),
                    last_transition: c.last_transition_time,
                })
                .collect(),
            pools: status.pools.clone(),
            findings: status.findings.len(),
            backup: status.backup.as_ref().map(|b| BackupInput {
                scheduled: b.schedule.is_some(),
                last_success: b.report.last_success.as_ref().map(|l| l.time),
                last_success_bytes: b.report.last_success.as_ref().map(|l| l.bytes),
                last_attempt: b.report.last_attempt_at,
                last_attempt_failed: b.report.last_error.is_some(),
                stale: b.stale,
            }),
            upgrade: status.upgrade.as_ref().map(|u| UpgradeInput {
                from: u.from.clone(),
                to: u.to.clone(),
                phase: u.phase,
                started: u.started_at,
                blockers: u.blocked.len(),
            }),
            // k3s's monitors name an end only within 90 days of it: a pool without one has
            // no series (nothing of it ends soon).
            certificates: (!status.certificates.is_empty() || status.webhook_certificate.is_some())
                .then(|| {
                    let webhook = status
                        .webhook_certificate
                        .as_ref()
                        .map(|w| CertificateExpiry {
                            pool: "webhook".to_owned(),
                            not_after: w.not_after,
                        });
                    status
                        .certificates
                        .iter()
                        .filter_map(|c| {
                            Some(CertificateExpiry {
                                pool: c.pool.clone(),
                                not_after: c.earliest_end?,
                            })
                        })
                        .chain(webhook)
                        .collect()
                }),
            drill: status
                .backup
                .as_ref()
                .and_then(|b| b.drill.as_ref())
                .map(|d| DrillInput {
                    last: d.report.last.as_ref().map(|l| l.at),
                    last_success: d.report.last.as_ref().map(|l| l.ok),
                    overdue: d.problem.as_deref() == Some(crate::domain::backup::drill::MISSING),
                }),
            // A release the channel offers that waits for a window, and when that opens.
            maintenance: status
                .channel
                .as_ref()
                .filter(|c| c.state == crate::domain::upgrade::channel::ChannelState::Waiting)
                .map(|c| MaintenanceInput {
                    next_window: c.next_window,
                    waiting_release: c.latest.clone(),
                }),
            oxide_token_expiry: status
                .oxide_token
                .as_ref()
                .filter(|t| t.error.is_none())
                .and_then(|t| t.expires_at),
            ..Input::default()
        }
    }

    /// The input when the ConfigMap could not be read: only `status_up 0`, under the cluster
    /// name last known.
    pub fn unreadable(cluster: String) -> Input {
        Input {
            cluster,
            ..Input::default()
        }
    }
}

/// The longest gap between consecutive ticks of `schedule` over the week after `from` (the
/// gap that crosses the horizon included, so a monthly schedule gets its month).
fn longest_gap(schedule: &Schedule, from: DateTime<Utc>) -> Option<Duration> {
    let mut ticks = schedule.upcoming(from).take(GAP_MAX_TICKS);
    let first = ticks.next()?;
    let horizon = first + Duration::days(GAP_HORIZON_DAYS);
    let (mut prev, mut longest) = (first, None::<Duration>);
    for t in ticks {
        let gap = t - prev;
        longest = Some(longest.map_or(gap, |l| l.max(gap)));
        if t > horizon {
            break;
        }
        prev = t;
    }
    longest
}

/// Phases in the order the upgrade goes through them, as their `status.json` names.
const PHASES: [Phase; 3] = [Phase::Preflight, Phase::ControlPlane, Phase::Workers];

/// The Prometheus text of `input`. A metric with no sample is left out, HELP and TYPE too.
pub fn render(input: &Input) -> String {
    let mut out = Out {
        text: String::with_capacity(4096),
        cluster: escape(&input.cluster),
    };
    out.one(
        "oxide_controller_status_up",
        "1 when status.json was read and understood; 0 before the first run wrote it, when it does not parse or when the ConfigMap cannot be read.",
        &[],
        Some(f64::from(u8::from(input.status_up))),
    );
    render_run(&mut out, input);
    render_pools(&mut out, input);
    if let Some(b) = &input.backup {
        render_backup(&mut out, b);
    }
    render_upgrade(&mut out, input);
    render_later(&mut out, input);
    render_oxide_token(&mut out, input);
    out.text
}

fn render_run(out: &mut Out, input: &Input) {
    out.one(
        "oxide_controller_reconcile_interval_seconds",
        "The longest gap between two ticks of the spec's reconcile schedule over the week ahead.",
        &[],
        input.reconcile_interval.map(|d| d.num_seconds() as f64),
    );
    out.one(
        "oxide_controller_reconcile_last_started_timestamp_seconds",
        "When the last reconcile run that wrote status.json started.",
        &[],
        input.last_run_started.map(seconds),
    );
    out.one(
        "oxide_controller_reconcile_last_finished_timestamp_seconds",
        "When the last reconcile run that wrote status.json finished.",
        &[],
        input.last_run_finished.map(seconds),
    );
    out.one(
        "oxide_controller_reconcile_last_converged_timestamp_seconds",
        "When a run last saw the cluster converged (every pool at its desired shape, nothing to do).",
        &[],
        input.last_converged.map(seconds),
    );
    out.many(
        "oxide_controller_condition",
        "A condition of status.json: 1 when True, 0 when False, with its reason.",
        input.conditions.iter().map(|c| {
            (
                vec![
                    ("condition", c.type_.as_str()),
                    ("reason", c.reason.as_str()),
                ],
                f64::from(u8::from(c.status)),
            )
        }),
    );
    out.many(
        "oxide_controller_condition_last_transition_timestamp_seconds",
        "When a condition last changed status.",
        input.conditions.iter().map(|c| {
            (
                vec![("condition", c.type_.as_str())],
                seconds(c.last_transition),
            )
        }),
    );
    out.one(
        "oxide_controller_findings",
        "Findings of the last plan (what `scale status` lists under findings).",
        &[],
        input.status_up.then_some(input.findings as f64),
    );
}

fn render_pools(out: &mut Out, input: &Input) {
    out.many(
        "oxide_controller_pool_members",
        "Members of a pool as the last run counted them, by state (desired is the spec's count).",
        input.pools.iter().flat_map(|p| {
            [
                ("desired", p.desired),
                ("ready", p.ready),
                ("joining", p.joining),
                ("not_ready", p.not_ready),
                ("broken", p.broken),
                ("removing", p.removing),
                ("drifted", p.drifted),
            ]
            .map(|(state, n)| {
                (
                    vec![("pool", p.pool.as_str()), ("state", state)],
                    f64::from(n),
                )
            })
        }),
    );
}

fn render_backup(out: &mut Out, b: &BackupInput) {
    out.one(
        "oxide_controller_backup_scheduled",
        "1 when the spec has a backup schedule (the in-cluster backup CronJob runs).",
        &[],
        Some(f64::from(u8::from(b.scheduled))),
    );
    out.one(
        "oxide_controller_backup_last_success_timestamp_seconds",
        "When k3s took the etcd snapshot of the newest backup.",
        &[],
        b.last_success.map(seconds),
    );
    out.one(
        "oxide_controller_backup_last_success_bytes",
        "Size of the newest backup.",
        &[],
        b.last_success_bytes.map(|n| n as f64),
    );
    out.one(
        "oxide_controller_backup_last_attempt_timestamp_seconds",
        "When a backup writer (the backup Job, bootstrap backup) last tried, whatever came of it.",
        &[],
        b.last_attempt.map(seconds),
    );
    out.one(
        "oxide_controller_backup_last_attempt_failed",
        "1 when the last backup attempt failed (status.json's backup.lastError).",
        &[],
        Some(f64::from(u8::from(b.last_attempt_failed))),
    );
    out.one(
        "oxide_controller_backup_stale",
        "1 when the newest backup is older than two schedule periods (the cluster is Degraded).",
        &[],
        Some(f64::from(u8::from(b.stale))),
    );
}

fn render_upgrade(out: &mut Out, input: &Input) {
    let u = input.upgrade.as_ref();
    out.one(
        "oxide_controller_upgrade_in_progress",
        "1 while a Kubernetes upgrade is under way.",
        &[],
        input.status_up.then_some(f64::from(u8::from(u.is_some()))),
    );
    let Some(u) = u else {
        return;
    };
    let phases: Vec<String> = PHASES.iter().map(ToString::to_string).collect();
    out.many(
        "oxide_controller_upgrade_phase",
        "The phase of the upgrade under way: 1 for the current one, 0 for the others.",
        PHASES.iter().zip(&phases).map(|(p, name)| {
            (
                vec![("phase", name.as_str())],
                f64::from(u8::from(*p == u.phase)),
            )
        }),
    );
    out.one(
        "oxide_controller_upgrade_info",
        "The upgrade under way: from what the oldest server ran to k3s.version.",
        &[("from", &u.from), ("to", &u.to)],
        Some(1.0),
    );
    out.one(
        "oxide_controller_upgrade_started_timestamp_seconds",
        "When the upgrade under way was first seen.",
        &[],
        Some(seconds(u.started)),
    );
    out.one(
        "oxide_controller_upgrade_blockers",
        "What keeps the upgrade from going on (the pre-flight's blockers).",
        &[],
        Some(u.blockers as f64),
    );
}

/// Certificates, the drill and the maintenance windows (issue 46 items 1, 3, 4).
fn render_later(out: &mut Out, input: &Input) {
    if let Some(certs) = &input.certificates {
        out.many(
            "oxide_controller_certificate_expiry_timestamp_seconds",
            "The earliest NotAfter among a pool's certificates (pool \"webhook\": the webhook's own).",
            certs
                .iter()
                .map(|c| (vec![("pool", c.pool.as_str())], seconds(c.not_after))),
        );
    }
    if let Some(d) = &input.drill {
        out.one(
            "oxide_controller_drill_last_timestamp_seconds",
            "When the newest restore drill finished.",
            &[],
            d.last.map(seconds),
        );
        out.one(
            "oxide_controller_drill_last_success",
            "1 when the newest restore drill restored the backup and it checked out, 0 when it failed.",
            &[],
            d.last_success.map(|ok| f64::from(u8::from(ok))),
        );
        out.one(
            "oxide_controller_drill_overdue",
            "1 when the drill schedule passed without a drill (the cluster is Degraded).",
            &[],
            Some(f64::from(u8::from(d.overdue))),
        );
    }
    if let Some(m) = &input.maintenance {
        out.one(
            "oxide_controller_maintenance_next_window_timestamp_seconds",
            "When the next maintenance window opens.",
            &[],
            m.next_window.map(seconds),
        );
        if let Some(v) = &m.waiting_release {
            out.one(
                "oxide_controller_release_waiting_info",
                "A release the upgrade channel offers, waiting for a maintenance window.",
                &[("version", v)],
                Some(1.0),
            );
        }
    }
}

/// The Oxide token's end (only for a token that has one).
fn render_oxide_token(out: &mut Out, input: &Input) {
    out.one(
        "oxide_controller_oxide_token_expiry_timestamp_seconds",
        "When the cluster's Oxide token expires (no series: it never does, or is not known).",
        &[],
        input.oxide_token_expiry.map(seconds),
    );
}

/// Seconds since the epoch, to the millisecond.
fn seconds(t: DateTime<Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

/// A label value as the exposition format wants it: backslash, double quote and newline
/// escaped.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

/// The text being written, and the `cluster` label every sample carries.
struct Out {
    text: String,
    cluster: String,
}

impl Out {
    /// HELP and TYPE (every metric here is a gauge).
    fn header(&mut self, name: &str, help: &str) {
        let help = help.replace('\\', r"\\").replace('\n', r"\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} gauge");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.text, "{name}{{cluster=\"{}\"", self.cluster);
        for (k, v) in labels {
            let _ = write!(self.text, ",{k}=\"{}\"", escape(v));
        }
        let _ = writeln!(self.text, "}} {value}");
    }

    /// A metric with one sample, or nothing when `value` is None.
    fn one(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: Option<f64>) {
        if let Some(v) = value {
            self.header(name, help);
            self.sample(name, labels, v);
        }
    }

    /// A metric with a sample per label set, or nothing when there is none.
    fn many<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl Iterator<Item = (Vec<(&'a str, &'a str)>, f64)>,
    ) {
        let mut samples = samples.peekable();
        if samples.peek().is_none() {
            return;
        }
        self.header(name, help);
        for (labels, v) in samples {
            self.sample(name, &labels, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    /// A cluster mid-upgrade with one condition, one pool, a backup, and the parts other
    /// items of issue 46 fill in.
    fn full() -> Input {
        Input {
            cluster: "demo".into(),
            status_up: true,
            reconcile_interval: Some(Duration::minutes(5)),
            last_run_started: Some(at(0)),
            last_run_finished: Some(at(42)),
            last_converged: None,
            conditions: vec![ConditionInput {
                type_: "Degraded".into(),
                status: true,
                reason: "BackupStale".into(),
                last_transition: at(-600),
            }],
            pools: vec![PoolCounts {
                pool: "workers".into(),
                desired: 3,
                ready: 2,
                joining: 1,
                ..PoolCounts::default()
            }],
            findings: 2,
            backup: Some(BackupInput {
                scheduled: true,
                last_success: Some(at(-7200)),
                last_success_bytes: Some(4096),
                last_attempt: Some(at(-60)),
                last_attempt_failed: true,
                stale: true,
            }),
            upgrade: Some(UpgradeInput {
                from: "v1.33.4+k3s1".into(),
                to: "v1.34.1+k3s1".into(),
                phase: Phase::ControlPlane,
                started: at(-3600),
                blockers: 0,
            }),
            certificates: Some(vec![CertificateExpiry {
                pool: "control-plane".into(),
                not_after: at(86_400),
            }]),
            drill: Some(DrillInput {
                last: Some(at(-86_400)),
                last_success: Some(false),
                overdue: false,
            }),
            maintenance: Some(MaintenanceInput {
                next_window: Some(at(3600)),
                waiting_release: Some("v1.34.2+k3s1".into()),
            }),
            oxide_token_expiry: Some(at(86_400 * 40)),
        }
    }

    #[test]
    fn an_unreadable_configmap_renders_only_status_up_0() {
        assert_eq!(
            render(&Input::unreadable("demo".into())),
            "# HELP oxide_controller_status_up 1 when status.json was read and understood; 0 before the first run wrote it, when it does not parse or when the ConfigMap cannot be read.\n\
             # TYPE oxide_controller_status_up gauge\n\
             oxide_controller_status_up{cluster=\"demo\"} 0\n"
        );
    }

    #[test]
    fn every_part_of_the_status_renders_as_gauges_labelled_with_the_cluster() {
        let text = render(&full());
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                r#"oxide_controller_status_up{cluster="demo"} 1"#,
                r#"oxide_controller_reconcile_interval_seconds{cluster="demo"} 300"#,
                r#"oxide_controller_reconcile_last_started_timestamp_seconds{cluster="demo"} 1800000000"#,
                r#"oxide_controller_reconcile_last_finished_timestamp_seconds{cluster="demo"} 1800000042"#,
                r#"oxide_controller_condition{cluster="demo",condition="Degraded",reason="BackupStale"} 1"#,
                r#"oxide_controller_condition_last_transition_timestamp_seconds{cluster="demo",condition="Degraded"} 1799999400"#,
                r#"oxide_controller_findings{cluster="demo"} 2"#,
                r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="desired"} 3"#,
                r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="ready"} 2"#,
                r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="joining"} 1"#,
                r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="not_ready"} 0"#,
                r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="broken"} 0"#,
                r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="removing"} 0"#,
                r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="drifted"} 0"#,
                r#"oxide_controller_backup_scheduled{cluster="demo"} 1"#,
                r#"oxide_controller_backup_last_success_timestamp_seconds{cluster="demo"} 1799992800"#,
                r#"oxide_controller_backup_last_success_bytes{cluster="demo"} 4096"#,
                r#"oxide_controller_backup_last_attempt_timestamp_seconds{cluster="demo"} 1799999940"#,
                r#"oxide_controller_backup_last_attempt_failed{cluster="demo"} 1"#,
                r#"oxide_controller_backup_stale{cluster="demo"} 1"#,
                r#"oxide_controller_upgrade_in_progress{cluster="demo"} 1"#,
                r#"oxide_controller_upgrade_phase{cluster="demo",phase="preflight"} 0"#,
                r#"oxide_controller_upgrade_phase{cluster="demo",phase="control-plane"} 1"#,
                r#"oxide_controller_upgrade_phase{cluster="demo",phase="workers"} 0"#,
                r#"oxide_controller_upgrade_info{cluster="demo",from="v1.33.4+k3s1",to="v1.34.1+k3s1"} 1"#,
                r#"oxide_controller_upgrade_started_timestamp_seconds{cluster="demo"} 1799996400"#,
                r#"oxide_controller_upgrade_blockers{cluster="demo"} 0"#,
                r#"oxide_controller_certificate_expiry_timestamp_seconds{cluster="demo",pool="control-plane"} 1800086400"#,
                r#"oxide_controller_drill_last_timestamp_seconds{cluster="demo"} 1799913600"#,
                r#"oxide_controller_drill_last_success{cluster="demo"} 0"#,
                r#"oxide_controller_drill_overdue{cluster="demo"} 0"#,
                r#"oxide_controller_maintenance_next_window_timestamp_seconds{cluster="demo"} 1800003600"#,
                r#"oxide_controller_release_waiting_info{cluster="demo",version="v1.34.2+k3s1"} 1"#,
                r#"oxide_controller_oxide_token_expiry_timestamp_seconds{cluster="demo"} 1803456000"#,
            ]
        );
        // Each metric once, with its HELP and TYPE right before its first sample.
        let mut seen = std::collections::BTreeSet::new();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.starts_with('#'))
        {
            let name = l.split(['{', ' ']).next().unwrap_or_default();
            if seen.insert(name) {
                assert_eq!(
                    (
                        lines[i - 2].split(' ').take(3).collect::<Vec<_>>(),
                        lines[i - 1]
                    ),
                    (
                        vec!["#", "HELP", name],
                        format!("# TYPE {name} gauge").as_str()
                    ),
                    "{name}"
                );
            }
        }
        expectorate::assert_contents("tests/snapshots/cluster-metrics.prom", &text);
    }

    #[test]
    fn a_whole_status_renders_the_exact_text() {
        let mut input = full();
        input.certificates = None;
        input.drill = None;
        input.maintenance = None;
        input.oxide_token_expiry = None;
        input.upgrade = None;
        input.backup = None;
        input.pools.clear();
        input.conditions.truncate(0);
        input.reconcile_interval = None;
        input.last_converged = Some(at(30));
        assert_eq!(
            render(&input),
            "# HELP oxide_controller_status_up 1 when status.json was read and understood; 0 before the first run wrote it, when it does not parse or when the ConfigMap cannot be read.
# TYPE oxide_controller_status_up gauge
oxide_controller_status_up{cluster=\"demo\"} 1
# HELP oxide_controller_reconcile_last_started_timestamp_seconds When the last reconcile run that wrote status.json started.
# TYPE oxide_controller_reconcile_last_started_timestamp_seconds gauge
oxide_controller_reconcile_last_started_timestamp_seconds{cluster=\"demo\"} 1800000000
# HELP oxide_controller_reconcile_last_finished_timestamp_seconds When the last reconcile run that wrote status.json finished.
# TYPE oxide_controller_reconcile_last_finished_timestamp_seconds gauge
oxide_controller_reconcile_last_finished_timestamp_seconds{cluster=\"demo\"} 1800000042
# HELP oxide_controller_reconcile_last_converged_timestamp_seconds When a run last saw the cluster converged (every pool at its desired shape, nothing to do).
# TYPE oxide_controller_reconcile_last_converged_timestamp_seconds gauge
oxide_controller_reconcile_last_converged_timestamp_seconds{cluster=\"demo\"} 1800000030
# HELP oxide_controller_findings Findings of the last plan (what `scale status` lists under findings).
# TYPE oxide_controller_findings gauge
oxide_controller_findings{cluster=\"demo\"} 2
# HELP oxide_controller_upgrade_in_progress 1 while a Kubernetes upgrade is under way.
# TYPE oxide_controller_upgrade_in_progress gauge
oxide_controller_upgrade_in_progress{cluster=\"demo\"} 0
"
        );
    }

    #[test]
    fn label_values_are_escaped_and_timestamps_keep_milliseconds() {
        let input = Input {
            cluster: "a\"b\\c\nd".into(),
            status_up: true,
            last_run_started: DateTime::from_timestamp(1_800_000_000, 250_000_000),
            ..Input::default()
        };
        let text = render(&input);
        assert!(
            text.contains(r#"oxide_controller_status_up{cluster="a\"b\\c\nd"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"oxide_controller_reconcile_last_started_timestamp_seconds{cluster="a\"b\\c\nd"} 1800000000.25"#
            ),
            "{text}"
        );
    }

    fn snapshot(spec: Option<&str>, status: Option<&str>) -> ConfigSnapshot {
        let mut data = BTreeMap::new();
        if let Some(s) = spec {
            data.insert(crate::ports::state::keys::SPEC.to_owned(), s.to_owned());
        }
        if let Some(s) = status {
            data.insert(crate::ports::state::keys::STATUS.to_owned(), s.to_owned());
        }
        ConfigSnapshot {
            resource_version: "1".into(),
            data,
        }
    }

    #[test]
    fn the_input_comes_from_the_spec_and_status_json() {
        let spec = crate::domain::spec::ClusterSpec::new("demo", "p", "img", 3, 2).to_yaml();
        let status = serde_json::json!({
            "runId": "r1",
            "startedAt": "2027-01-15T08:00:00Z",
            "finishedAt": "2027-01-15T08:00:42Z",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "NotConverged", "message": "workers 1/2 ready", "lastTransitionTime": "2027-01-15T07:00:00Z"},
                {"type": "Degraded", "status": "True", "reason": "BackupStale", "message": "the newest backup is 3h old", "lastTransitionTime": "2027-01-15T07:30:00Z"}
            ],
            "pools": [{"pool": "workers", "desired": 2, "ready": 1, "joining": 0, "notReady": 1, "broken": 0, "removing": 0, "drifted": 0}],
            "lastPlan": [],
            "findings": ["node demo-workers-b is NotReady"],
            "upgrade": {"from": "v1.33.4+k3s1", "to": "v1.34.1+k3s1", "phase": "workers", "startedAt": "2027-01-15T06:00:00Z", "blocked": ["x", "y"]},
            "backup": {"schedule": "0 * * * *", "lastAttemptAt": "2027-01-15T07:59:00Z", "lastError": "upload failed", "watchingSince": "2027-01-01T00:00:00Z", "stale": true,
                "drill": {"schedule": "30 3 * * 0", "last": {"at": "2027-01-14T03:40:00Z", "ok": false, "reason": "the restored API holds 12 objects, the backup 60", "cleanedUp": true, "by": "schedule"}, "problem": "DrillFailed"}},
            "certificates": [
                {"pool": "control-plane"},
                {"pool": "workers", "earliestEnd": "2027-03-01T00:00:00Z", "node": "demo-workers-b"}
            ],
            "webhookCertificate": {"notAfter": "2028-01-10T00:00:00Z", "checkedAt": "2027-01-15T08:00:00Z"}
        })
        .to_string();
        let input = Input::from_snapshot(&snapshot(Some(&spec), Some(&status)), at(0));
        assert_eq!(input.cluster, "demo");
        assert!(input.status_up);
        assert_eq!(input.reconcile_interval, Some(Duration::minutes(5)));
        assert_eq!(
            input
                .conditions
                .iter()
                .map(|c| (c.type_.as_str(), c.status, c.reason.as_str()))
                .collect::<Vec<_>>(),
            [
                ("Ready", false, "NotConverged"),
                ("Degraded", true, "BackupStale")
            ]
        );
        assert_eq!((input.pools[0].not_ready, input.findings), (1, 1));
        assert_eq!(
            input.upgrade.as_ref().map(|u| (u.phase, u.blockers)),
            Some((Phase::Workers, 2))
        );
        assert_eq!(
            input.backup,
            Some(BackupInput {
                scheduled: true,
                last_success: None,
                last_success_bytes: None,
                last_attempt: "2027-01-15T07:59:00Z".parse().ok(),
                last_attempt_failed: true,
                stale: true,
            })
        );
        // Only a pool whose monitors name an end has a series; the webhook's own always.
        assert_eq!(
            input.certificates,
            Some(vec![
                CertificateExpiry {
                    pool: "workers".into(),
                    not_after: "2027-03-01T00:00:00Z".parse().unwrap_or_default(),
                },
                CertificateExpiry {
                    pool: "webhook".into(),
                    not_after: "2028-01-10T00:00:00Z".parse().unwrap_or_default(),
                }
            ])
        );
        // The newest drill: when, whether it passed; failed is not overdue.
        assert_eq!(
            input.drill,
            Some(DrillInput {
                last: "2027-01-14T03:40:00Z".parse().ok(),
                last_success: Some(false),
                overdue: false,
            })
        );
        assert!(!render(&input).contains("12 objects"));
        assert_eq!(input.maintenance, None, "no channel");
        // A channel's patch waiting for a window: the release and when the window opens.
        let mut waiting: serde_json::Value = serde_json::from_str(&status).unwrap();
        waiting["channel"] = serde_json::json!({
            "channel": "stable", "latest": "v1.33.9+k3s1", "state": "waiting",
            "message": "v1.33.9+k3s1 waits for the window", "nextWindow": "2027-01-17T22:00:00Z",
            "checkedAt": "2027-01-15T08:00:00Z"
        });
        let with = Input::from_snapshot(&snapshot(Some(&spec), Some(&waiting.to_string())), at(0));
        assert_eq!(
            with.maintenance,
            Some(MaintenanceInput {
                next_window: "2027-01-17T22:00:00Z".parse().ok(),
                waiting_release: Some("v1.33.9+k3s1".into()),
            })
        );
        // The messages never become labels.
        assert!(!render(&input).contains("upload failed"));
        assert!(!render(&input).contains("3h old"));

        // No status yet: the cluster and the schedule, and status_up 0.
        let input = Input::from_snapshot(&snapshot(Some(&spec), None), at(0));
        assert_eq!(
            (
                input.cluster.as_str(),
                input.status_up,
                input.reconcile_interval
            ),
            ("demo", false, Some(Duration::minutes(5)))
        );
        // A status that does not parse counts as none.
        let input = Input::from_snapshot(&snapshot(Some(&spec), Some("{")), at(0));
        assert!(!input.status_up);
        // A spec the reconcile would refuse still names the cluster.
        let input = Input::from_snapshot(
            &snapshot(
                Some("cluster: broken\nproject: 7\nschedule: \"0 9 * * 1-5\"\n"),
                None,
            ),
            at(0),
        );
        assert_eq!(
            (input.cluster.as_str(), input.reconcile_interval),
            ("broken", Some(Duration::hours(72)))
        );
    }

    #[test]
    fn the_reconcile_interval_is_the_longest_gap_of_the_week_ahead() {
        let gap = |s: &str| longest_gap(&Schedule::parse(s).unwrap(), at(0));
        assert_eq!(gap("*/5 * * * *"), Some(Duration::minutes(5)));
        assert_eq!(gap("0,10 * * * *"), Some(Duration::minutes(50)));
        assert_eq!(gap("@every 90s"), Some(Duration::seconds(90)));
        assert_eq!(gap("0 9 * * 1-5"), Some(Duration::hours(72)));
        // Monthly: the gap that crosses the week's horizon counts.
        assert!(gap("0 0 1 * *") >= Some(Duration::days(28)));
        // A schedule that never fires (30 February): no interval.
        assert_eq!(gap("0 0 30 2 *"), None);
    }
}
