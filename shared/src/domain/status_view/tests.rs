#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use chrono::TimeZone as _;

use super::*;
use crate::domain::autoscale::Outcome;
use crate::domain::model::Allocatable;
use crate::domain::plan::PoolCounts;

fn t(h: u32, m: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 25, h, m, s).unwrap()
}

fn node(name: &str, pool: Option<&str>, ready: bool, created: DateTime<Utc>) -> Node {
    Node {
        name: name.into(),
        provider_id: Some(format!("oxide://{name}-uuid")),
        labels: pool
            .map(|p| BTreeMap::from([(POOL_LABEL.to_owned(), p.to_owned())]))
            .unwrap_or_default(),
        annotations: BTreeMap::new(),
        readiness: if ready {
            NodeReadiness::Ready
        } else {
            NodeReadiness::NotReady { since: created }
        },
        unschedulable: false,
        created,
        taints: vec![],
        allocatable: Allocatable::default(),
        kubelet_version: Some(if name == "demo-control-plane-aaaaa" {
            "v1.34.1+k3s1".into()
        } else {
            "v1.33.4+k3s1".into()
        }),
        deleting_since: None,
    }
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: t(9, 0, 0),
    }
}

fn counts(pool: &str, desired: u32, ready: u32, joining: u32, broken: u32) -> PoolCounts {
    PoolCounts {
        pool: pool.into(),
        desired,
        ready,
        joining,
        not_ready: 0,
        broken,
        removing: 0,
        drifted: 0,
    }
}

fn status(degraded: bool) -> Status {
    Status {
        run_id: "run-7f3a".into(),
        started_at: t(9, 58, 0),
        finished_at: t(9, 58, 1),
        conditions: vec![
            cond(
                "Ready",
                if degraded { "False" } else { "True" },
                "Converged",
                "every pool at its count",
            ),
            cond(
                "Degraded",
                if degraded { "True" } else { "False" },
                if degraded {
                    "SetupFailed"
                } else {
                    "AsExpected"
                },
                if degraded {
                    "demo-workers-bbbbb: node setup failed at k3s-install"
                } else {
                    ""
                },
            ),
        ],
        pools: vec![
            counts("control-plane", 3, 3, 0, 0),
            counts("workers", 3, 2, 0, u32::from(degraded)),
        ],
        last_plan: vec![PlannedAction {
            action: "replace".into(),
            target: "demo-workers-bbbbb".into(),
            reason: "node setup failed at k3s-install".into(),
            outcome: "done".into(),
            detail: None,
        }],
        findings: vec![],
        last_error: None,
        last_converged_at: Some(t(9, 30, 0)),
        autoscale: Some(Outcome {
            decisions: vec![Decision {
                pool: "workers".into(),
                from: 2,
                to: 3,
                remove_node: None,
                reason: "1 pending pod fits a new worker".into(),
            }],
            unhostable: vec![Unhostable {
                pod: "default/huge-0".into(),
                reason: "requests 64 CPUs; the largest worker has 8".into(),
            }],
            ..Outcome::default()
        }),
        create_backoff: BTreeMap::new(),
        subnet_prefix: None,
        upgrade: Some(crate::domain::upgrade::UpgradeStatus {
            from: "v1.33.4+k3s1".into(),
            to: "v1.34.1+k3s1".into(),
            phase: crate::domain::upgrade::Phase::ControlPlane,
            started_at: t(9, 50, 0),
            blocked: Vec::new(),
        }),
        versions: vec![crate::domain::upgrade::PoolVersions {
            pool: "workers".into(),
            target: "v1.34.1+k3s1".into(),
            rolling_to: "v1.33.4+k3s1".into(),
            waiting_for: Some(
                "every Ready server runs v1.34.1+k3s1 (the oldest runs v1.33.4+k3s1)".into(),
            ),
            nodes: BTreeMap::new(),
        }],
        backup: Some(crate::domain::backup::BackupStatus {
            schedule: Some("0 * * * *".into()),
            report: crate::domain::backup::BackupReport {
                last_success: Some(crate::domain::backup::LastBackup {
                    name: "demo-etcd-20261127t090000z".into(),
                    time: t(9, 0, 0),
                    k3s_snapshot: "etcd-snapshot-demo-control-plane-aaaaa-1795770000".into(),
                    bytes: 4_096_000,
                    by: "schedule".into(),
                }),
                last_attempt_at: Some(t(9, 58, 0)),
                last_error: degraded.then(|| "the Oxide API: quota exceeded".to_owned()),
            },
            watching_since: t(8, 0, 0),
            stale: degraded,
            read_at: None,
            drill: Some(drill_under_way()),
        }),
        certificates: certificates(),
        certificates_read_at: None,
        control_plane_roll: None,
        channel: None,
        webhook_certificate: None,
        oxide_token: None,
    }
}

/// A scheduled restore drill under way.
fn drill_under_way() -> crate::domain::backup::drill::DrillStatus {
    crate::domain::backup::drill::DrillStatus {
        schedule: Some("30 3 * * 0".into()),
        report: crate::domain::backup::drill::DrillReport {
            last: None,
            last_success_at: None,
            running: Some(crate::domain::backup::drill::DrillRunning {
                server: "demo-drill-control-plane-ddddd".into(),
                backup: "demo-etcd-20261127t090000z".into(),
                backup_time: t(9, 0, 0),
                expected_objects: Some(60),
                started: t(9, 55, 0),
            }),
        },
        problem: None,
    }
}

fn nodes() -> Vec<Node> {
    let mut removing = node("demo-workers-ccccc", Some("workers"), true, t(8, 0, 0));
    removing.unschedulable = true;
    removing
        .annotations
        .insert(REMOVING_ANNOTATION.into(), "scale-down".into());
    vec![
        node(
            "demo-control-plane-aaaaa",
            Some("control-plane"),
            true,
            t(7, 0, 0),
        ),
        node(
            "demo-control-plane-bbbbb",
            Some("control-plane"),
            true,
            t(7, 1, 0),
        ),
        node(
            "demo-control-plane-ccccc",
            Some("control-plane"),
            true,
            t(7, 2, 0),
        ),
        node("demo-workers-aaaaa", Some("workers"), true, t(9, 59, 30)),
        node("demo-workers-bbbbb", Some("workers"), false, t(9, 40, 0)),
        removing,
        node("laptop-joined-by-hand", None, true, t(6, 0, 0)),
    ]
}

fn events() -> Vec<EventSummary> {
    (0..12)
        .map(|i| EventSummary {
            time: t(9, 40 + i, 0),
            type_: if i % 4 == 0 { "Warning" } else { "Normal" }.into(),
            reason: format!("Reason{i}"),
            note: format!("note {i}"),
        })
        .collect()
}

#[test]
fn the_table_shows_pools_members_conditions_the_last_run_autoscaler_and_events() {
    let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 3);
    spec.k3s.version = "v1.34.1+k3s1".into();
    spec.worker_pools[0].autoscale = Some(crate::domain::autoscale::AutoscaleSpec::default());
    spec.worker_pools[0].min = 1;
    spec.worker_pools[0].max = 6;
    let s = status(true);
    let view = build(&spec, Some(&s), &nodes(), events());
    expectorate::assert_contents(
        "tests/snapshots/status_view_table.txt",
        &render_table(&view, t(10, 0, 0)),
    );
    assert!(view.degraded());
    assert_eq!(view.events.len(), MAX_EVENTS);
    assert_eq!(view.events[0].reason, "Reason11", "newest first");
    assert_eq!(view.other_nodes, ["laptop-joined-by-hand"]);
    assert_eq!(view.pools[1].autoscale, Some([1, 6]));
    assert_eq!(view.pools[1].members.len(), 3);
    assert_eq!(
        view.pools[1].members[2].removing.as_deref(),
        Some("scale-down")
    );
    assert!(!build(&spec, Some(&status(false)), &nodes(), vec![]).degraded());
    // Issue 33: each Node's kubelet version, and the upgrade with the pools that wait.
    assert_eq!(
        view.pools[0].members[0].version.as_deref(),
        Some("v1.34.1+k3s1")
    );
    assert_eq!(
        view.upgrade.as_ref().map(|u| u.to.as_str()),
        Some("v1.34.1+k3s1")
    );
    assert_eq!(
        view.pools[1]
            .waiting
            .as_ref()
            .map(|w| w.rolling_to.as_str()),
        Some("v1.33.4+k3s1")
    );
}

#[test]
fn json_keys_are_camel_case_like_status_json() {
    let spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 3);
    let view = build(&spec, Some(&status(true)), &nodes(), events());
    let v = serde_json::to_value(&view).unwrap();
    assert!(v["lastRun"]["runId"].is_string(), "{v}");
    assert!(v["pools"][0]["members"][0]["providerId"].is_string(), "{v}");
    assert!(v["otherNodes"].is_array());
    fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    out.push(k.clone());
                    keys(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| keys(x, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    keys(&v, &mut all);
    assert!(all.iter().all(|k| !k.contains('_')), "{all:?}");
}

#[test]
fn before_the_first_run_the_view_says_so() {
    let spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 1, 0);
    let view = build(&spec, None, &[], vec![]);
    assert!(!view.degraded());
    let text = render_table(&view, t(10, 0, 0));
    assert!(
        text.starts_with("cluster demo (project demo): no run yet\n"),
        "{text}"
    );
    assert!(
        text.contains("no reconcile run has written a status yet"),
        "{text}"
    );
    assert!(text.contains("(no Nodes)"), "{text}");
}

#[test]
fn ages_read_like_kubectls() {
    let now = t(10, 0, 0);
    assert_eq!(age(t(9, 59, 48), now), "12s");
    assert_eq!(age(t(9, 55, 50), now), "4m10s");
    assert_eq!(age(t(7, 55, 0), now), "2h5m");
    assert_eq!(
        age(Utc.with_ymd_and_hms(2026, 11, 21, 6, 0, 0).unwrap(), now),
        "4d4h"
    );
    assert_eq!(age(t(10, 0, 5), now), "0s", "clock skew is not negative");
}

fn certificates() -> Vec<crate::domain::certificates::PoolCertificates> {
    vec![
        crate::domain::certificates::PoolCertificates {
            pool: "control-plane".into(),
            earliest_end: None,
            node: None,
            unreported: Vec::new(),
            restarting: None,
        },
        crate::domain::certificates::PoolCertificates {
            pool: "workers".into(),
            earliest_end: Some(t(9, 0, 0) + chrono::Duration::days(55)),
            node: Some("demo-workers-aaaaa".into()),
            unreported: vec!["demo-workers-ccccc".into()],
            restarting: Some("demo-workers-aaaaa".into()),
        },
    ]
}
