//! Table tests of the autoscaling planner with an injected clock.

use super::*;
use chrono::TimeZone;

const GI: u64 = 1 << 30;

fn at(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 23, h, m, 0).unwrap()
}

pub(super) fn pool(name: &str, count: u32, min: u32, max: u32) -> PoolView {
    PoolView {
        name: name.into(),
        count,
        min,
        max,
        cpus: 2,
        memory: 4 * GI,
        labels: BTreeMap::new(),
        taints: Vec::new(),
        autoscale: Some(AutoscaleSpec {
            scale_down_unneeded_seconds: 120,
            ..AutoscaleSpec::default()
        }),
    }
}

pub(super) fn node(name: &str, pool: &PoolView) -> NodeView {
    NodeView {
        name: name.into(),
        pool: Some(pool.name.clone()),
        allocatable: pool.allocatable(),
        max_pods: DEFAULT_MAX_PODS,
        labels: pool.node_labels(),
        taints: pool.taints.clone(),
        annotations: BTreeMap::new(),
        cordoned: false,
        not_ready: false,
        removing: false,
    }
}

fn pod(name: &str, cpu_milli: u64, node: Option<&str>) -> PodView {
    PodView {
        namespace: "default".into(),
        name: name.into(),
        requests: Resources {
            cpu_milli,
            memory: 64 << 20,
        },
        node: node.map(Into::into),
        unschedulable: node.is_none(),
        controller_kind: Some("ReplicaSet".into()),
        ..PodView::default()
    }
}

fn window(min: u32) -> ScheduleWindow {
    ScheduleWindow {
        name: "office-hours".into(),
        start: "0 8 * * *".into(),
        duration_minutes: 12 * 60,
        time_zone: "UTC".into(),
        min: Some(min),
        max: None,
    }
}

#[test]
fn schedule_window_raises_min_inside_and_not_outside() {
    let mut p = pool("workers", 1, 1, 6);
    p.autoscale.as_mut().unwrap().schedules.push(window(3));
    let nodes = [node("w1", &p)];
    for (now, want) in [
        (at(7, 59), None),
        (at(8, 0), Some(3)),
        (at(12, 0), Some(3)),
        (at(19, 59), Some(3)),
        (at(20, 0), None),
        (at(23, 0), None),
    ] {
        let out = plan(
            std::slice::from_ref(&p),
            &nodes,
            &[],
            &AutoscaleState::default(),
            now,
        );
        let got = out.decisions.first().map(|d| d.to);
        assert_eq!(got, want, "at {now}: {out:?}");
        if let Some(d) = out.decisions.first() {
            assert!(d.reason.contains("office-hours"), "{d:?}");
        }
    }
    // Outside the window the usual bounds hold: 3 workers with nothing to do come down one
    // per run after the delay, not to zero.
    let p3 = PoolView {
        count: 3,
        ..p.clone()
    };
    let nodes3 = [node("w1", &p3), node("w2", &p3), node("w3", &p3)];
    let first = plan(
        std::slice::from_ref(&p3),
        &nodes3,
        &[],
        &AutoscaleState::default(),
        at(20, 0),
    );
    assert!(first.decisions.is_empty(), "{first:?}");
    let later = plan(
        std::slice::from_ref(&p3),
        &nodes3,
        &[],
        &first.state,
        at(20, 3),
    );
    assert_eq!(later.decisions.len(), 1, "{later:?}");
    assert_eq!((later.decisions[0].from, later.decisions[0].to), (3, 2));
    // Inside the window the same nodes are kept at 3.
    let inside = plan(
        std::slice::from_ref(&p3),
        &nodes3,
        &[],
        &first.state,
        at(12, 0),
    );
    assert!(inside.decisions.is_empty(), "{inside:?}");
}

/// 10 pods × 900m on 2-vCPU workers: allocatable 2000m holds two (1800m), so 10 pods need
/// 5 workers. One worker already runs two; the 8 unschedulable ones need 4 more.
#[test]
fn deployment_of_ten_900m_pods_needs_five_workers() {
    let p = pool("workers", 1, 1, 6);
    let nodes = [node("w1", &p)];
    let mut pods = vec![pod("web-0", 900, Some("w1")), pod("web-1", 900, Some("w1"))];
    pods.extend((2..10).map(|i| pod(&format!("web-{i}"), 900, None)));
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert_eq!(out.decisions.len(), 1, "{out:?}");
    assert_eq!((out.decisions[0].from, out.decisions[0].to), (1, 5));
    assert!(
        out.decisions[0].reason.contains("8 unschedulable"),
        "{out:?}"
    );

    // Next run: the 4 workers are created but not registered; the pods are still pending.
    // They are provided for, so nothing more is added.
    let p5 = PoolView {
        count: 5,
        ..p.clone()
    };
    let again = plan(
        std::slice::from_ref(&p5),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        at(12, 1),
    );
    assert!(again.decisions.is_empty(), "{again:?}");
}

#[test]
fn scale_up_never_exceeds_max_and_reports_the_rest() {
    let p = pool("workers", 1, 1, 3);
    let nodes = [node("w1", &p)];
    let pods: Vec<_> = (0..10)
        .map(|i| pod(&format!("web-{i}"), 900, None))
        .collect();
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert_eq!(out.decisions[0].to, 3, "{out:?}");
    assert_eq!(out.unhostable.len(), 6, "{out:?}");
}

#[test]
fn deleted_deployment_scales_down_one_per_run_after_the_delay_to_min() {
    let mut p = pool("workers", 5, 1, 6);
    let mut state = AutoscaleState::default();
    let mut now = at(12, 0);
    let mut removed = Vec::new();
    for run in 0..12 {
        let nodes: Vec<_> = (1..=p.count).map(|i| node(&format!("w{i}"), &p)).collect();
        let out = plan(std::slice::from_ref(&p), &nodes, &[], &state, now);
        if run == 0 {
            assert!(out.decisions.is_empty(), "within the delay: {out:?}");
        }
        assert!(out.decisions.len() <= 1, "{out:?}");
        if let Some(d) = out.decisions.first() {
            assert_eq!(d.to, d.from - 1, "one node per run: {d:?}");
            let n = d.remove_node.clone().expect("names the node to drain");
            assert!(
                d.reason.contains(&n) && d.reason.contains("unneeded"),
                "{d:?}"
            );
            // The planner removes the named node; keep the names of the rest.
            removed.push(n);
            p.count = d.to;
        }
        state = out.state;
        now += Duration::minutes(3);
    }
    assert_eq!(p.count, 1, "back to min, never below: {removed:?}");
    assert_eq!(removed.len(), 4);
}

#[test]
fn busy_node_is_not_unneeded() {
    let p = pool("workers", 2, 1, 6);
    let nodes = [node("w1", &p), node("w2", &p)];
    let pods = [pod("a", 1500, Some("w1")), pod("b", 1500, Some("w2"))];
    let prev = AutoscaleState {
        unneeded_since: [("w1".to_owned(), at(0, 0))].into(),
        ..AutoscaleState::default()
    };
    let out = plan(std::slice::from_ref(&p), &nodes, &pods, &prev, at(12, 0));
    assert!(out.decisions.is_empty(), "{out:?}");
    assert!(
        out.state.unneeded_since.is_empty(),
        "busy again resets the clock"
    );
}

#[test]
fn node_whose_pods_fit_nowhere_else_is_kept() {
    let p = pool("workers", 2, 1, 6);
    let nodes = [node("w1", &p), node("w2", &p)];
    // 900m is below half of 2000m, but w2 has only 200m left.
    let pods = [pod("a", 900, Some("w1")), pod("b", 1800, Some("w2"))];
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert!(
        out.kept["w1"].contains("default/a fits on no other node"),
        "{out:?}"
    );
    assert!(!out.state.unneeded_since.contains_key("w1"));
}

#[test]
fn pod_no_pool_can_host_is_named_and_causes_no_scale_up() {
    let p = pool("workers", 1, 1, 6);
    let nodes = [node("w1", &p)];
    let pods = [pod("huge", 64_000, None)];
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    assert_eq!(out.unhostable.len(), 1);
    assert_eq!(out.unhostable[0].pod, "default/huge");
    assert!(
        out.unhostable[0].reason.contains("cpu 64000m")
            && out.unhostable[0].reason.contains("2000m"),
        "{out:?}"
    );
}

fn blocked(annotate: impl Fn(&mut PodView, &mut NodeView)) -> Outcome {
    let p = pool("workers", 2, 1, 6);
    let mut nodes = [node("w1", &p), node("w2", &p)];
    let mut pods = [pod("a", 100, Some("w1"))];
    annotate(&mut pods[0], &mut nodes[0]);
    let prev = AutoscaleState {
        unneeded_since: [("w1".to_owned(), at(0, 0)), ("w2".to_owned(), at(11, 59))].into(),
        ..AutoscaleState::default()
    };
    plan(std::slice::from_ref(&p), &nodes, &pods, &prev, at(12, 0))
}

#[test]
fn unblocked_node_is_the_one_removed() {
    let out = blocked(|_, _| {});
    assert_eq!(
        out.decisions[0].remove_node.as_deref(),
        Some("w1"),
        "{out:?}"
    );
}

#[test]
fn safe_to_evict_false_keeps_its_node() {
    let out = blocked(|p, _| {
        p.annotations.insert(SAFE_TO_EVICT.into(), "false".into());
    });
    assert!(out.kept["w1"].contains(SAFE_TO_EVICT), "{out:?}");
    assert!(
        out.decisions.is_empty(),
        "w2 has not waited its delay yet: {out:?}"
    );
}

#[test]
fn scale_down_disabled_node_is_kept() {
    let out = blocked(|_, n| {
        n.annotations
            .insert(SCALE_DOWN_DISABLED.into(), "true".into());
    });
    assert!(out.kept["w1"].contains(SCALE_DOWN_DISABLED), "{out:?}");
    assert!(out.decisions.is_empty(), "{out:?}");
}

#[test]
fn bare_and_kube_system_pods_block_unless_safe_to_evict_true() {
    let bare = blocked(|p, _| p.controller_kind = None);
    assert!(bare.kept["w1"].contains("no controller"), "{bare:?}");
    let sys = blocked(|p, _| p.namespace = "kube-system".into());
    assert!(sys.kept["w1"].contains("PodDisruptionBudget"), "{sys:?}");
    let sys_pdb = blocked(|p, _| {
        p.namespace = "kube-system".into();
        p.budgets = vec![Budget {
            key: "kube-system/dns".into(),
            allowed: 1,
        }];
    });
    assert_eq!(sys_pdb.decisions[0].remove_node.as_deref(), Some("w1"));
    let bare_ok = blocked(|p, _| {
        p.controller_kind = None;
        p.annotations.insert(SAFE_TO_EVICT.into(), "true".into());
    });
    assert_eq!(bare_ok.decisions[0].remove_node.as_deref(), Some("w1"));
    let ds = blocked(|p, _| p.controller_kind = Some("DaemonSet".into()));
    assert_eq!(ds.decisions[0].remove_node.as_deref(), Some("w1"));
}

#[test]
fn selector_affinity_and_taints_pick_the_pool_that_can_host() {
    let small = pool("small", 1, 1, 6);
    let mut gpu = pool("gpu", 0, 0, 2);
    gpu.labels.insert("accel".into(), "yes".into());
    gpu.taints.push(Taint {
        key: "accel".into(),
        value: "yes".into(),
        effect: TaintEffect::NoSchedule,
    });
    let pools = [small.clone(), gpu];
    let nodes = [node("s1", &small)];

    let mut sel = pod("wants-accel", 500, None);
    sel.node_selector.insert("accel".into(), "yes".into());
    let out = plan(
        &pools,
        &nodes,
        &[sel.clone()],
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert!(out.decisions.is_empty(), "taint not tolerated: {out:?}");
    assert!(
        out.unhostable[0]
            .reason
            .contains("taint accel=yes:NoSchedule"),
        "{out:?}"
    );
    assert!(
        out.unhostable[0].reason.contains("nodeSelector accel=yes"),
        "{out:?}"
    );

    sel.tolerations.push(Toleration {
        key: Some("accel".into()),
        exists: true,
        ..Toleration::default()
    });
    let out = plan(
        &pools,
        &nodes,
        &[sel.clone()],
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert_eq!(out.decisions[0].pool, "gpu", "{out:?}");

    let mut aff = pod("not-accel", 500, None);
    aff.tolerations = sel.tolerations.clone();
    aff.affinity_terms = vec![vec![LabelRequirement {
        key: "accel".into(),
        op: LabelOp::DoesNotExist,
        values: vec![],
        field: false,
    }]];
    let out = plan(
        &pools,
        &nodes,
        &[aff],
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert_eq!(out.decisions[0].pool, "small", "{out:?}");
}

#[test]
fn least_waste_pool_wins() {
    let two = pool("two", 0, 0, 6);
    let mut eight = pool("eight", 0, 0, 6);
    eight.cpus = 8;
    eight.memory = 16 * GI;
    let pools = [two, eight];
    // One 1900m pod: a 2-vCPU worker wastes 5% of its cpu, an 8-vCPU one 76%.
    let pods = [pod("a", 1900, None)];
    let out = plan(&pools, &[], &pods, &AutoscaleState::default(), at(12, 0));
    assert_eq!(out.decisions[0].pool, "two", "{out:?}");
    // Seven 1100m pods: one per 2-vCPU worker (45% cpu waste, and only 6 fit under max) vs
    // all seven on one 8-vCPU worker (7700m of 8000m, 4% cpu waste).
    let pods: Vec<_> = (0..7).map(|i| pod(&format!("b{i}"), 1100, None)).collect();
    let out = plan(&pools, &[], &pods, &AutoscaleState::default(), at(12, 0));
    assert_eq!(out.decisions[0].pool, "eight", "{out:?}");
    assert_eq!(out.decisions[0].to, 1, "{out:?}");
}

#[test]
fn pools_without_autoscale_are_untouched() {
    let mut p = pool("workers", 1, 1, 6);
    p.autoscale = None;
    let nodes = [node("w1", &p)];
    let pods = [pod("x", 900, None)];
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    p.autoscale = Some(AutoscaleSpec {
        enabled: false,
        ..AutoscaleSpec::default()
    });
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        at(12, 0),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
}

#[test]
fn validation_names_each_bad_field() {
    let a = AutoscaleSpec {
        utilization_threshold: 1.5,
        max_nodes_per_run: 0,
        schedules: vec![ScheduleWindow {
            start: "61 * * * *".into(),
            time_zone: "Europe/Olso".into(),
            duration_minutes: 0,
            min: Some(9),
            ..window(3)
        }],
        ..AutoscaleSpec::default()
    };
    let fields: Vec<_> = a.validate(1, 6).into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        [
            "utilization_threshold",
            "max_nodes_per_run",
            "schedules[0].start",
            "schedules[0].time_zone",
            "schedules[0].duration_minutes",
            "schedules[0].min"
        ]
    );
    assert!(AutoscaleSpec::default().validate(1, 6).is_empty());
    // As a CronJob: the zone goes in time_zone, never in the schedule.
    let a = AutoscaleSpec {
        schedules: vec![ScheduleWindow {
            start: "CRON_TZ=Europe/Berlin 0 8 * * 1-5".into(),
            ..window(3)
        }],
        ..AutoscaleSpec::default()
    };
    let errs = a.validate(1, 6);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].to_string(),
        "schedules[0].start: cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
    );
}

/// A weekday 08:00-20:00 window on Berlin's wall clock holds on both sides of the March
/// and October daylight-saving changes (2026-03-29, 2026-10-25).
#[test]
fn berlin_office_hours_window_follows_daylight_saving() {
    let mut p = pool("workers", 1, 1, 6);
    p.autoscale
        .as_mut()
        .unwrap()
        .schedules
        .push(ScheduleWindow {
            start: "0 8 * * 1-5".into(),
            time_zone: "Europe/Berlin".into(),
            ..window(3)
        });
    let utc = |s: &str| {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    let a = p.autoscale.as_ref().unwrap();
    for (now, active) in [
        // Friday 2026-03-27, CET (UTC+1): 08:00-20:00 is 07:00Z-19:00Z.
        ("2026-03-27T06:59:00Z", false),
        ("2026-03-27T07:00:00Z", true),
        ("2026-03-27T18:59:00Z", true),
        ("2026-03-27T19:00:00Z", false),
        // Saturday: no window.
        ("2026-03-28T10:00:00Z", false),
        // Monday 2026-03-30, CEST (UTC+2): 06:00Z-18:00Z.
        ("2026-03-30T05:59:00Z", false),
        ("2026-03-30T06:00:00Z", true),
        ("2026-03-30T17:59:00Z", true),
        ("2026-03-30T18:00:00Z", false),
        // Friday 2026-10-23, CEST: 06:00Z-18:00Z.
        ("2026-10-23T05:59:00Z", false),
        ("2026-10-23T06:00:00Z", true),
        ("2026-10-23T18:00:00Z", false),
        // Monday 2026-10-26, CET: 07:00Z-19:00Z.
        ("2026-10-26T06:30:00Z", false),
        ("2026-10-26T07:00:00Z", true),
        ("2026-10-26T18:30:00Z", true),
        ("2026-10-26T19:00:00Z", false),
    ] {
        let (min, max, window) = effective_bounds(1, 6, a, utc(now));
        let want = if active {
            (3, 6, Some("office-hours".to_owned()))
        } else {
            (1, 6, None)
        };
        assert_eq!((min, max, window), want, "at {now}");
    }
}

#[test]
fn no_scale_down_while_created_workers_have_not_joined() {
    let p = pool("workers", 3, 1, 6);
    let nodes = [node("w1", &p), node("w2", &p)];
    let prev = AutoscaleState {
        unneeded_since: [("w1".to_owned(), at(0, 0))].into(),
        ..AutoscaleState::default()
    };
    let out = plan(std::slice::from_ref(&p), &nodes, &[], &prev, at(12, 0));
    assert!(out.decisions.is_empty(), "{out:?}");
    let joined = [node("w1", &p), node("w2", &p), node("w3", &p)];
    let out = plan(std::slice::from_ref(&p), &joined, &[], &prev, at(12, 0));
    assert_eq!(
        out.decisions[0].remove_node.as_deref(),
        Some("w1"),
        "{out:?}"
    );
}
