//! `status.json` in the ConfigMap: what the last reconcile saw and did. Written by
//! `reconcile-once` only. Conditions follow the Kubernetes convention (type, status, reason,
//! message, lastTransitionTime), and a condition keeps its transition time while its status
//! does not change.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::domain::plan::backoff::{self, Backoffs, Blocked};
use crate::domain::plan::{Action, Plan, PoolCounts};
use crate::domain::plan::{ActionResult, Outcome};

/// One condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True" or "False".
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: DateTime<Utc>,
}

/// One planned action and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedAction {
    pub action: String,
    pub target: String,
    pub reason: String,
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Observed counts of one pool: the planner's own counts, stored as they are.
pub type PoolStatus = PoolCounts;

/// The whole `status.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub run_id: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub conditions: Vec<Condition>,
    pub pools: Vec<PoolStatus>,
    pub last_plan: Vec<PlannedAction>,
    #[serde(default)]
    pub findings: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the cluster was last seen converged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_converged_at: Option<DateTime<Utc>>,
    /// What the autoscaler decided and why, and since when each node has been unneeded (the
    /// next run's memory). Absent while no pool autoscales.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<crate::domain::autoscale::Outcome>,
    /// Pools whose creates the rack keeps refusing, and since when (the next run's memory:
    /// see [`crate::domain::plan::backoff`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub create_backoff: Backoffs,
    /// The prefix length of the project's default VPC subnet as last observed: the webhook,
    /// which has no rack credentials, checks a raised `max` or count against it
    /// ([`crate::domain::spec::ClusterSpec::check_subnet`]). Absent until a run has seen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_prefix: Option<u8>,
    /// The Kubernetes upgrade under way: from, to, phase, since when (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<crate::domain::upgrade::UpgradeStatus>,
    /// Per pool: its target version, what this run rolled it to, each Node's kubelet version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<crate::domain::upgrade::PoolVersions>,
    /// The last backup, the last attempt's error, and whether the newest is stale (then the
    /// cluster is Degraded). Set by the run from the ConfigMap's `backup.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<crate::domain::backup::BackupStatus>,
    /// Per pool, the earliest end k3s's certificate monitors report and the node being
    /// restarted for its certificates (see [`crate::domain::certificates`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<crate::domain::certificates::PoolCertificates>,
    /// When a run last listed the monitors' Events (`certificates` is what it found); runs
    /// in between list them only when due ([`crate::domain::certificates::monitor_read_due`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates_read_at: Option<DateTime<Utc>>,
    /// The roll of the control plane under way: what it rolls to, when it was decided, and
    /// why its next step waits for a backup, while it does (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_roll: Option<crate::domain::backup::RollDecision>,
    /// The k3s release channel as the run found it (`upgrade.channel`): the release it names,
    /// whether it was adopted or waits, and for which window. Absent without a channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<crate::domain::upgrade::channel::ChannelStatus>,
    /// The webhook's serving certificate: its end, when it was last read and re-issued
    /// ([`crate::domain::certificates::WebhookCertificate`]). Absent in clusters without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_certificate: Option<crate::domain::certificates::WebhookCertificate>,
    /// The cluster's Oxide token: its id, its end, when the run last listed the user's tokens
    /// ([`crate::domain::oxide_token::OxideTokenRecord`]). Absent until a run has listed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oxide_token: Option<crate::domain::oxide_token::OxideTokenRecord>,
}

impl Status {
    pub fn from_json(s: &str) -> Option<Status> {
        serde_json::from_str(s).ok()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// Everything a run knows at its end.
#[derive(Debug)]
pub struct RunReport<'a> {
    pub run_id: &'a str,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub plan: Option<&'a Plan>,
    pub results: &'a [ActionResult],
    pub error: Option<String>,
    pub previous: Option<&'a Status>,
    /// This run's autoscaler outcome; None when it did not get that far (the previous one is
    /// kept, so a failed run does not reset the unneeded timers) or no pool autoscales.
    pub autoscale: Option<&'a crate::domain::autoscale::Outcome>,
    /// Each pool's spec hash (a create block remembers the spec it was seen with).
    pub pool_hashes: &'a BTreeMap<String, String>,
}

/// The create blocks after a run: what the plan carried, updated by the creates it tried. A
/// run that did not get to plan keeps the previous ones.
pub fn create_backoff(r: &RunReport) -> Backoffs {
    let Some(plan) = r.plan else {
        return r
            .previous
            .map(|p| p.create_backoff.clone())
            .unwrap_or_default();
    };
    let mut attempts: BTreeMap<String, Result<(), Blocked>> = BTreeMap::new();
    for x in r.results {
        let Action::CreateMember { pool, .. } = &x.action else {
            continue;
        };
        let succeeded = matches!(x.outcome, Outcome::Done | Outcome::InProgress(_));
        match (attempts.get(pool), succeeded, &x.blocked) {
            (Some(Ok(())), _, _) => {}
            (_, true, _) => {
                attempts.insert(pool.clone(), Ok(()));
            }
            (None, false, Some(b)) => {
                attempts.insert(pool.clone(), Err(b.clone()));
            }
            _ => {}
        }
    }
    backoff::after_run(
        &plan.create_backoff,
        &attempts,
        r.pool_hashes,
        r.finished_at,
    )
}

/// Builds the status for a run.
pub fn build(r: &RunReport) -> Status {
    let failures = r
        .results
        .iter()
        .filter(|x| matches!(x.outcome, Outcome::Failed(_)))
        .count();
    let converged = r.error.is_none() && failures == 0 && r.plan.is_some_and(Plan::is_converged);
    let degraded = r.error.is_some() || failures > 0 || r.plan.is_some_and(Plan::is_degraded);
    let progressing =
        r.plan.is_some_and(|p| !p.actions.is_empty()) || r.plan.is_some_and(|p| !p.is_converged());

    let create_backoff = create_backoff(r);
    let degraded = degraded || !create_backoff.is_empty();
    let degraded_msg = degraded_reason(r, failures, &create_backoff);
    let summary = pools_summary(r.plan);
    let cond = |t: &str, on: bool, reason: String, message: String| {
        let status = if on { "True" } else { "False" }.to_owned();
        let last_transition_time = r
            .previous
            .and_then(|p| p.condition(t))
            .filter(|c| c.status == status)
            .map_or(r.finished_at, |c| c.last_transition_time);
        Condition {
            type_: t.to_owned(),
            status,
            reason,
            message,
            last_transition_time,
        }
    };
    let n_actions = r.plan.map_or(0, |p| p.actions.len());
    let conditions = vec![
        cond(
            "Ready",
            converged,
            if converged {
                "Converged".into()
            } else {
                "NotConverged".into()
            },
            summary.clone(),
        ),
        cond(
            "Progressing",
            progressing && r.error.is_none(),
            if n_actions > 0 {
                "ActionsApplied".into()
            } else {
                "Waiting".into()
            },
            format!("{n_actions} action(s) this run; {summary}"),
        ),
        cond("Degraded", degraded, degraded_msg.0, degraded_msg.1),
    ];
    Status {
        run_id: r.run_id.to_owned(),
        started_at: r.started_at,
        finished_at: r.finished_at,
        conditions,
        pools: r.plan.map(|p| p.pools.clone()).unwrap_or_default(),
        last_plan: last_plan(r.results),
        findings: r
            .plan
            .map(|p| p.findings.iter().map(|f| f.message.clone()).collect())
            .unwrap_or_default(),
        last_error: last_error(r, converged),
        last_converged_at: if converged {
            Some(r.finished_at)
        } else {
            r.previous.and_then(|p| p.last_converged_at)
        },
        autoscale: match (r.autoscale, &r.error) {
            (Some(a), _) => Some(a.clone()),
            (None, Some(_)) => r.previous.and_then(|p| p.autoscale.clone()),
            (None, None) => None,
        },
        create_backoff,
        // The run sets this run's observation; until then the last one known holds.
        subnet_prefix: r.previous.and_then(|p| p.subnet_prefix),
        upgrade: match (r.plan, &r.error) {
            (Some(p), _) => p.upgrade.as_ref().and_then(|u| u.upgrade.clone()),
            (None, _) => r.previous.and_then(|p| p.upgrade.clone()),
        },
        versions: match r.plan.and_then(|p| p.upgrade.as_ref()) {
            Some(u) => u.pools.clone(),
            None => r.previous.map(|p| p.versions.clone()).unwrap_or_default(),
        },
        backup: r.previous.and_then(|p| p.backup.clone()),
        certificates: certificates(r),
        certificates_read_at: certificates_read_at(r),
        control_plane_roll: match r.plan {
            Some(p) => p.roll.clone(),
            None => r.previous.and_then(|p| p.control_plane_roll.clone()),
        },
        // Set by the run (it asks the channel before it plans); the last one holds till then.
        channel: r.previous.and_then(|p| p.channel.clone()),
        webhook_certificate: r.previous.and_then(|p| p.webhook_certificate.clone()),
        oxide_token: r.previous.and_then(|p| p.oxide_token.clone()),
    }
}

/// This run's error, else the last one while the cluster has not converged since.
fn last_error(r: &RunReport, converged: bool) -> Option<String> {
    r.error.clone().or_else(|| {
        r.previous
            .and_then(|p| p.last_error.clone())
            .filter(|_| !converged)
    })
}

/// Per pool, the certificates this run's plan reports; the last run's without a plan.
fn certificates(r: &RunReport) -> Vec<crate::domain::certificates::PoolCertificates> {
    match r.plan {
        Some(p) if p.certificates.read_at.is_some() => p.certificates.pools.clone(),
        _ => r
            .previous
            .map(|p| p.certificates.clone())
            .unwrap_or_default(),
    }
}

/// When the monitors' Events were last listed: this run, else as the last run recorded.
fn certificates_read_at(r: &RunReport) -> Option<DateTime<Utc>> {
    r.plan
        .and_then(|p| p.certificates.read_at)
        .or_else(|| r.previous.and_then(|p| p.certificates_read_at))
}

/// The Degraded condition's reason and message: the run's error, else the first pool whose
/// creates are refused, else the first failed action, else the first degrading finding.
fn degraded_reason(r: &RunReport, failures: usize, create_backoff: &Backoffs) -> (String, String) {
    let blocked = r
        .plan
        .and_then(|p| p.upgrade.as_ref())
        .and_then(crate::domain::upgrade::blocked_finding);
    if let Some(e) = &r.error {
        ("RunFailed".to_owned(), e.clone())
    } else if let Some(f) = blocked {
        (
            crate::domain::upgrade::preflight::FAILED_REASON.to_owned(),
            f,
        )
    } else if let Some((pool, b)) = create_backoff
        .iter()
        .find(|(_, b)| b.cause == backoff::BlockCause::SetupFailed)
    {
        ("UpgradeBlocked".to_owned(), b.describe(pool))
    } else if let Some((pool, b)) = create_backoff.iter().next() {
        ("CreatesRefused".to_owned(), b.describe(pool))
    } else if let Some(first) = r.results.iter().find_map(|x| match &x.outcome {
        Outcome::Failed(d) => Some((x, d)),
        _ => None,
    }) {
        // The first failure's own words: "insufficient capacity", "quota", ...
        (
            "ActionsFailed".to_owned(),
            format!(
                "{failures} action(s) failed; first: {} {}: {}",
                first.0.action.verb(),
                first.0.action.target(),
                first.1
            ),
        )
    } else if let Some(m) = r.plan.and_then(|p| p.certificates.degraded.as_ref()) {
        (
            crate::domain::certificates::DEGRADED_REASON.to_owned(),
            m.clone(),
        )
    } else if let Some(f) = r.plan.and_then(|p| p.findings.iter().find(|f| f.degraded)) {
        (finding_reason(&f.message).to_owned(), f.message.clone())
    } else {
        ("AsExpected".to_owned(), "no problems".to_owned())
    }
}

/// Degraded findings whose first word is their reason (`DrillFailed: the restore drill ...`).
const FINDING_REASONS: [&str; 5] = [
    crate::domain::certificates::DEGRADED_REASON,
    crate::domain::oxide_token::REASON,
    crate::domain::backup::drill::FAILED,
    crate::domain::backup::drill::MISSING,
    crate::domain::backup::roll::WAIT_REASON,
];

/// The Degraded reason of a finding: its first word when that is one of [`FINDING_REASONS`],
/// else `Problem`.
fn finding_reason(message: &str) -> &'static str {
    FINDING_REASONS
        .into_iter()
        .find(|r| {
            message
                .strip_prefix(r)
                .is_some_and(|rest| rest.starts_with(": "))
        })
        .unwrap_or("Problem")
}

/// `<pool> <ready>/<desired> ready, ...`, or "not observed" without a plan.
fn pools_summary(plan: Option<&Plan>) -> String {
    plan.map(|p| {
        p.pools
            .iter()
            .map(|c| format!("{} {}/{} ready", c.pool, c.ready, c.desired))
            .collect::<Vec<_>>()
            .join(", ")
    })
    .unwrap_or_else(|| "not observed".to_owned())
}

/// What each action of the run did, for `lastPlan`.
fn last_plan(results: &[ActionResult]) -> Vec<PlannedAction> {
    results
        .iter()
        .map(|x| {
            let (outcome, detail) = match &x.outcome {
                Outcome::Done => ("done", None),
                Outcome::InProgress(d) => ("in_progress", Some(d.clone())),
                Outcome::Failed(d) => ("failed", Some(d.clone())),
                Outcome::Skipped(d) => ("skipped", Some(d.clone())),
            };
            PlannedAction {
                action: x.action.verb().to_owned(),
                target: x.action.target().to_owned(),
                reason: x.action.reason().to_owned(),
                outcome: outcome.to_owned(),
                detail,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::plan::{Finding, PoolCounts};

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    fn converged_plan() -> Plan {
        Plan {
            actions: vec![],
            findings: vec![],
            pools: vec![PoolCounts {
                pool: "workers".into(),
                desired: 2,
                ready: 2,
                ..Default::default()
            }],
            ..Plan::default()
        }
    }

    #[test]
    fn converged_run_is_ready_and_keeps_transition_times() {
        let plan = converged_plan();
        let r = RunReport {
            run_id: "a",
            started_at: at(0),
            finished_at: at(1),
            plan: Some(&plan),
            results: &[],
            error: None,
            previous: None,
            autoscale: None,
            pool_hashes: &BTreeMap::new(),
        };
        let s1 = build(&r);
        assert_eq!(
            s1.condition("Ready").map(|c| c.status.as_str()),
            Some("True")
        );
        assert_eq!(
            s1.condition("Degraded").map(|c| c.status.as_str()),
            Some("False")
        );
        let r2 = RunReport {
            run_id: "b",
            finished_at: at(100),
            previous: Some(&s1),
            autoscale: None,
            ..r
        };
        let s2 = build(&r2);
        assert_eq!(
            s2.condition("Ready").map(|c| c.last_transition_time),
            Some(at(1))
        );
        assert_eq!(s2.last_converged_at, Some(at(100)));
        assert_eq!(Status::from_json(&s2.to_json()), Some(s2));
    }

    #[test]
    fn errors_and_degraded_findings_show() {
        let mut plan = converged_plan();
        plan.findings.push(Finding {
            degraded: true,
            message: "etcd quorum lost".into(),
        });
        let r = RunReport {
            run_id: "a",
            started_at: at(0),
            finished_at: at(1),
            plan: Some(&plan),
            results: &[],
            error: None,
            previous: None,
            autoscale: None,
            pool_hashes: &BTreeMap::new(),
        };
        let s = build(&r);
        let d = s
            .condition("Degraded")
            .cloned()
            .unwrap_or_else(|| unreachable!());
        assert_eq!(
            (d.status.as_str(), d.reason.as_str(), d.message.as_str()),
            ("True", "Problem", "etcd quorum lost")
        );
        // A finding that names its reason first gives the condition that reason.
        let mut drill = converged_plan();
        drill.findings.push(Finding {
            degraded: true,
            message: "DrillFailed: the restore drill of backup b failed: sha256".into(),
        });
        let d = build(&RunReport {
            plan: Some(&drill),
            ..r
        })
        .condition("Degraded")
        .cloned()
        .unwrap_or_else(|| unreachable!());
        assert_eq!(d.reason, "DrillFailed");
        assert_eq!(finding_reason("DrillFailedX: y"), "Problem");
        let r = RunReport {
            plan: None,
            error: Some("rack unreachable".into()),
            ..r
        };
        let s = build(&r);
        assert_eq!(s.last_error.as_deref(), Some("rack unreachable"));
        assert_eq!(
            s.condition("Ready").map(|c| c.status.as_str()),
            Some("False")
        );
    }

    #[test]
    fn keys_are_camel_case_and_a_status_from_an_older_release_still_reads() {
        let s = build(&RunReport {
            run_id: "a",
            started_at: at(0),
            finished_at: at(1),
            plan: Some(&converged_plan()),
            results: &[],
            error: None,
            previous: None,
            autoscale: None,
            pool_hashes: &BTreeMap::new(),
        });
        let json = s.to_json();
        assert!(
            json.contains("\"notReady\": 0") && !json.contains("not_ready"),
            "{json}"
        );
        let old = json.replace("\"notReady\"", "\"not_ready\"");
        assert_eq!(Status::from_json(&old), Some(s));
    }

    /// Issue 33: the upgrade under way and each pool's versions are recorded, read back by
    /// the next run, and kept by a run that failed before planning.
    #[test]
    fn the_upgrade_and_the_versions_are_recorded_and_read_back() {
        use crate::domain::upgrade::{Phase, PoolVersions, Progress, UpgradeStatus};
        let upgrade = UpgradeStatus {
            from: "v1.33.4+k3s1".into(),
            to: "v1.34.1+k3s1".into(),
            phase: Phase::ControlPlane,
            started_at: at(0),
            blocked: Vec::new(),
        };
        let versions = vec![PoolVersions {
            pool: "workers".into(),
            target: "v1.34.1+k3s1".into(),
            rolling_to: "v1.33.4+k3s1".into(),
            waiting_for: Some("every Ready server runs v1.34.1+k3s1".into()),
            nodes: BTreeMap::from([("demo-workers-a".into(), "v1.33.4+k3s1".into())]),
        }];
        let plan = Plan {
            upgrade: Some(Progress {
                upgrade: Some(upgrade.clone()),
                pools: versions.clone(),
            }),
            ..converged_plan()
        };
        let r = RunReport {
            run_id: "a",
            started_at: at(0),
            finished_at: at(1),
            plan: Some(&plan),
            results: &[],
            error: None,
            previous: None,
            autoscale: None,
            pool_hashes: &BTreeMap::new(),
        };
        let s = build(&r);
        let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(json["upgrade"]["phase"], "control-plane");
        assert_eq!(json["upgrade"]["startedAt"], "2027-01-15T08:00:00Z");
        assert_eq!(json["versions"][0]["rollingTo"], "v1.33.4+k3s1");
        assert_eq!(
            json["versions"][0]["nodes"]["demo-workers-a"],
            "v1.33.4+k3s1"
        );
        let back = Status::from_json(&s.to_json()).unwrap();
        assert_eq!(
            (back.upgrade.as_ref(), &back.versions),
            (Some(&upgrade), &versions)
        );
        let failed = build(&RunReport {
            plan: None,
            error: Some("rack unreachable".into()),
            previous: Some(&back),
            ..r
        });
        assert_eq!((failed.upgrade, failed.versions), (Some(upgrade), versions));
    }
}
