//! The planner fed with pods as a real cluster shows them (built from Kubernetes objects by
//! [`observe`](super::observe)), against what cluster-autoscaler and the scheduler do. These
//! are the audit's probes (`audits/kubernetes-2.md`, findings 1-9) turned around.

use super::observe::pod_view;
use super::*;
use chrono::TimeZone;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};

const GI: u64 = 1 << 30;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap()
}

/// The table tests' pool, with no delay after a scale-up.
fn pool(name: &str, count: u32, min: u32, max: u32) -> PoolView {
    let mut p = super::tests::pool(name, count, min, max);
    if let Some(a) = p.autoscale.as_mut() {
        a.scale_down_delay_after_add_seconds = 0;
    }
    p
}

/// The table tests' node, with its own name as hostname, as a registered Node has.
fn node(name: &str, pool: &PoolView) -> NodeView {
    let mut n = super::tests::node(name, pool);
    n.labels.insert(HOSTNAME.into(), name.into());
    n
}

fn view_with(v: Value, pdbs: &[PodDisruptionBudget], pvs: &[PersistentVolume]) -> PodView {
    let pod: Pod = serde_json::from_value(v).expect("pod");
    pod_view(&pod, pdbs, pvs).expect("active pod")
}

fn view(v: Value) -> PodView {
    view_with(v, &[], &[])
}

/// A ReplicaSet's pod requesting `cpu`, running on `node` or Pending/Unschedulable with the
/// scheduler's `message`.
fn rs_pod(name: &str, cpu: &str, node: Option<&str>, message: &str) -> Value {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "u1", "controller": true}]},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]},
        "status": {"phase": "Running"}
    });
    match node {
        Some(n) => p["spec"]["nodeName"] = json!(n),
        None => {
            p["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable", "message": message}]})
        }
    }
    p
}

fn decision<'a>(out: &'a Outcome, pool: &str) -> Option<&'a Decision> {
    out.decisions.iter().find(|d| d.pool == pool)
}

fn unneeded_for_an_hour(nodes: &[&str]) -> AutoscaleState {
    AutoscaleState {
        unneeded_since: nodes
            .iter()
            .map(|n| ((*n).to_owned(), now() - Duration::hours(1)))
            .collect(),
        ..AutoscaleState::default()
    }
}

/// Finding 1: a DaemonSet pod pinned (matchFields metadata.name, as the DaemonSet controller
/// writes it) to a full node adds no worker, run after run, and is named once as unhostable.
#[test]
fn a_pending_daemonset_pod_adds_no_worker() {
    let ds = json!({
        "metadata": {"name": "agent-w1", "namespace": "monitoring",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                "uid": "ds", "controller": true}]},
        "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "128Mi"}}}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w1"]}]}]}}}},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node affinity/selector."}]}
    });
    let p = pool("workers", 1, 1, 6);
    let nodes = [node("w1", &p)];
    let pods = [view(rs_pod("busy", "1900m", Some("w1"), "")), view(ds)];
    let mut state = AutoscaleState::default();
    for run in 0..3 {
        let out = plan(std::slice::from_ref(&p), &nodes, &pods, &state, now());
        assert!(out.decisions.is_empty(), "run {run}: {out:?}");
        assert_eq!(out.unhostable.len(), 1, "{out:?}");
        assert!(out.unhostable[0].reason.contains("DaemonSet"), "{out:?}");
        state = out.state;
    }
}

/// `matchFields` selects on the node's name, and an empty term matches nothing
/// (component-helpers `nodeaffinity`): a pod pinned by name to an existing node is not one a
/// new node can take, whatever owns it.
#[test]
fn match_fields_pin_a_pod_to_a_named_node() {
    let p = pool("workers", 1, 1, 6);
    let nodes = [node("w1", &p)];
    let mut pinned = rs_pod(
        "pinned",
        "500m",
        None,
        "0/1 nodes are available: 1 Insufficient cpu.",
    );
    pinned["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w1"]}]}]}}});
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[view(pinned.clone())],
        &AutoscaleState::default(),
        now(),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    assert!(
        out.unhostable[0].reason.contains("node affinity"),
        "{out:?}"
    );

    // NotIn an existing name: any new node will do.
    pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchFields"][0]["operator"] = json!("NotIn");
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[view(pinned.clone())],
        &AutoscaleState::default(),
        now(),
    );
    assert_eq!(decision(&out, "workers").map(|d| d.to), Some(2), "{out:?}");

    // An empty term matches nothing.
    pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"] = json!([{}]);
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[view(pinned)],
        &AutoscaleState::default(),
        now(),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
}

/// A local-path PersistentVolume (k3s's default class) pinned to `node`, bound to
/// `default/<claim>`.
fn local_pv(name: &str, claim: &str, node: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": format!("/var/lib/rancher/k3s/storage/{name}")},
            "storageClassName": "local-path",
            "claimRef": {"namespace": "default", "name": claim},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
        "status": {"phase": "Bound"}
    }))
    .expect("pv")
}

fn with_claim(mut pod: Value, claim: &str) -> Value {
    pod["spec"]["volumes"] =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    pod
}

/// Finding 2: a pod whose volume is pinned to a node that is gone ("volume node affinity
/// conflict") adds no worker; neither does one the scheduler refused for an unbound
/// immediate claim. Both are named, with the reason.
#[test]
fn a_pod_stuck_on_its_volume_adds_no_worker() {
    let p = pool("workers", 1, 1, 6);
    let nodes = [node("w1", &p)];
    let pvs = [local_pv("pvc-1", "data-db-0", "w-gone")];
    let stuck = view_with(
        with_claim(
            rs_pod(
                "db-0",
                "250m",
                None,
                "0/2 nodes are available: 2 node(s) had volume node affinity conflict.",
            ),
            "data-db-0",
        ),
        &[],
        &pvs,
    );
    let unbound = view(rs_pod(
        "queue-0",
        "250m",
        None,
        "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.",
    ));
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[stuck, unbound],
        &AutoscaleState::default(),
        now(),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    assert_eq!(out.unhostable.len(), 2, "{out:?}");
    assert!(
        out.unhostable[0]
            .reason
            .contains("PersistentVolume pvc-1 is pinned elsewhere"),
        "{out:?}"
    );
    assert!(
        out.unhostable[1].reason.contains("unbound immediate"),
        "{out:?}"
    );
}

/// Finding 3: once a worker has registered, a new one is taken to be like it: a pod between
/// the real allocatable and the spec's size brings no worker (it would never fit).
#[test]
fn the_template_is_the_pools_smallest_registered_worker() {
    let p = pool("workers", 1, 1, 6);
    let mut w1 = node("w1", &p);
    w1.allocatable = Resources {
        cpu_milli: 2000,
        memory: 4 * GI - (150 << 20),
    };
    let mut big = view(rs_pod(
        "big",
        "500m",
        None,
        "0/1 nodes are available: 1 Insufficient memory.",
    ));
    big.requests.memory = 4 * GI - (120 << 20);
    let out = plan(
        std::slice::from_ref(&p),
        std::slice::from_ref(&w1),
        std::slice::from_ref(&big),
        &AutoscaleState::default(),
        now(),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    assert!(
        out.unhostable[0].reason.contains("memory 3946Mi"),
        "the registered worker's allocatable is quoted: {out:?}"
    );
    // With no worker registered yet, the spec's size is all there is.
    let empty = pool("workers", 0, 0, 6);
    let out = plan(
        std::slice::from_ref(&empty),
        &[],
        &[big],
        &AutoscaleState::default(),
        now(),
    );
    assert_eq!(decision(&out, "workers").map(|d| d.to), Some(1), "{out:?}");
}

fn pdb(allowed: i32) -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db-0"}}},
        "status": {"currentHealthy": 1, "desiredHealthy": 1, "disruptionsAllowed": allowed, "expectedPods": 1}
    }))
    .expect("pdb")
}

/// Finding 4 (budgets): a node whose pod's budget allows no disruption is kept, named with
/// the budget; with one disruption allowed it goes. Without the budgets listed, the planner
/// asks for them.
#[test]
fn a_node_held_by_a_budget_is_kept() {
    let p = pool("workers", 2, 1, 6);
    let nodes = [node("w1", &p), node("w2", &p)];
    let pods_with = |budgets: &[PodDisruptionBudget]| -> Vec<PodView> {
        let mut db = rs_pod("db-0", "100m", Some("w2"), "");
        db["metadata"]["ownerReferences"][0]["kind"] = json!("StatefulSet");
        vec![
            view_with(rs_pod("web", "1200m", Some("w1"), ""), budgets, &[]),
            view_with(db, budgets, &[]),
        ]
    };
    let prev = unneeded_for_an_hour(&["w2"]);
    let blind = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods_with(&[]),
        &prev,
        now(),
    );
    assert!(blind.wants_budgets, "{blind:?}");

    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods_with(&[pdb(0)]),
        &prev,
        now(),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    assert!(
        out.kept["w2"].contains("PodDisruptionBudget default/db allows 0"),
        "{out:?}"
    );
    assert!(!out.state.unneeded_since.contains_key("w2"));

    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods_with(&[pdb(1)]),
        &prev,
        now(),
    );
    assert_eq!(
        decision(&out, "workers").and_then(|d| d.remove_node.as_deref()),
        Some("w2"),
        "{out:?}"
    );
}

/// Finding 4 (local storage): a pod on local-path storage, hostPath or a disk-backed emptyDir
/// keeps its node; `safe-to-evict-local-volumes` naming the volume, or a memory-backed
/// emptyDir, does not. No annotation lifts a PersistentVolume pinned to the node.
#[test]
fn node_local_storage_keeps_its_node() {
    let p = pool("workers", 2, 1, 6);
    let nodes = [node("w1", &p), node("w2", &p)];
    let prev = unneeded_for_an_hour(&["w2"]);
    let run = |pod: PodView| {
        let pods = [view(rs_pod("web", "1200m", Some("w1"), "")), pod];
        plan(std::slice::from_ref(&p), &nodes, &pods, &prev, now())
    };
    let on_w2 = || rs_pod("db-0", "100m", Some("w2"), "");

    let pvs = [local_pv("pvc-9", "data-db-0", "w2")];
    let mut lp = with_claim(on_w2(), "data-db-0");
    lp["metadata"]["annotations"] = json!({SAFE_TO_EVICT: "true"});
    let out = run(view_with(lp, &[], &pvs));
    assert!(out.decisions.is_empty(), "{out:?}");
    assert!(
        out.kept["w2"].contains("PersistentVolume pvc-9 is pinned to it"),
        "{out:?}"
    );

    let mut host = on_w2();
    host["spec"]["volumes"] = json!([{"name": "logs", "hostPath": {"path": "/var/log"}}]);
    let out = run(view(host));
    assert!(
        out.kept["w2"].contains("local storage (volume logs"),
        "{out:?}"
    );

    let mut scratch = on_w2();
    scratch["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    let out = run(view(scratch.clone()));
    assert!(out.kept["w2"].contains("volume scratch"), "{out:?}");

    scratch["metadata"]["annotations"] = json!({SAFE_TO_EVICT_LOCAL_VOLUMES: "scratch"});
    let out = run(view(scratch.clone()));
    assert_eq!(
        decision(&out, "workers").and_then(|d| d.remove_node.as_deref()),
        Some("w2"),
        "{out:?}"
    );

    let mut tmpfs = on_w2();
    tmpfs["spec"]["volumes"] = json!([{"name": "tmp", "emptyDir": {"medium": "Memory"}}]);
    let out = run(view(tmpfs));
    assert!(decision(&out, "workers").is_some(), "{out:?}");
}

/// Finding 5: two pools, each with one idle node whose pod fits only on the other's node:
/// removals are simulated one after another, so only one goes in a run.
#[test]
fn removals_are_simulated_one_after_another_across_pools() {
    let a = pool("a", 1, 0, 3);
    let b = pool("b", 1, 0, 3);
    let nodes = [node("a1", &a), node("b1", &b)];
    let pods = [
        view(rs_pod("pa", "400m", Some("a1"), "")),
        view(rs_pod("pb", "400m", Some("b1"), "")),
    ];
    let out = plan(
        &[a, b],
        &nodes,
        &pods,
        &unneeded_for_an_hour(&["a1", "b1"]),
        now(),
    );
    let removed: Vec<_> = out
        .decisions
        .iter()
        .filter_map(|d| d.remove_node.clone())
        .collect();
    assert_eq!(removed, ["a1"], "{out:?}");
    assert!(out.kept["b1"].contains("removals"), "{out:?}");
    assert!(
        out.state.unneeded_since.contains_key("b1"),
        "its timer runs on for the next run"
    );
}

/// Finding 6: a registered worker that is not Ready yet is still upcoming: the pods it was
/// made for bring no further worker.
#[test]
fn a_registered_not_ready_worker_is_upcoming() {
    let p = pool("workers", 2, 1, 6);
    let mut w2 = node("w2", &p);
    w2.not_ready = true;
    let nodes = [node("w1", &p), w2];
    let pods = [
        view(rs_pod("busy", "1900m", Some("w1"), "")),
        view(rs_pod("p1", "900m", None, "0/2 nodes are available")),
        view(rs_pod("p2", "900m", None, "0/2 nodes are available")),
    ];
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        now(),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    assert!(out.unhostable.is_empty(), "{out:?}");
}

/// Finding 7: native sidecars add to the pod's requests (PodRequests); an init container
/// after a sidecar needs its own requests plus the sidecar's.
#[test]
fn sidecar_requests_add_up() {
    let v = view(json!({
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "500m"}}}],
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                {"name": "migrate", "resources": {"requests": {"cpu": "1200m"}}}]},
        "status": {"phase": "Pending"}
    }));
    // Running: app + proxy = 1000m; while migrating: proxy + migrate = 1700m.
    assert_eq!(v.requests.cpu_milli, 1700);
    let v = view(json!({
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "500m"}}}],
            "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "500m"}}}]},
        "status": {"phase": "Pending"}
    }));
    assert_eq!(v.requests.cpu_milli, 1000);
}

/// Finding 8: status stays under 256 KiB whatever is pending: 10,000 pods at max are counted
/// (by owner) past the first hundred.
#[test]
fn status_stays_small_with_ten_thousand_pending_pods() {
    let p = pool("workers", 3, 1, 3);
    let nodes: Vec<NodeView> = (1..=3).map(|i| node(&format!("w{i}"), &p)).collect();
    let mut pods: Vec<PodView> = (1..=3)
        .map(|i| {
            view(rs_pod(
                &format!("busy-{i}"),
                "1900m",
                Some(&format!("w{i}")),
                "",
            ))
        })
        .collect();
    let template = view(rs_pod(
        "x",
        "500m",
        None,
        "0/6 nodes are available: 3 Insufficient cpu.",
    ));
    for i in 0..10_000 {
        let mut v = template.clone();
        v.name = format!("job-worker-{i:05}-abcde");
        v.namespace = "batch".into();
        v.owner = Some(format!("batch/Job/job-{}", i % 3));
        pods.push(v);
    }
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        now(),
    );
    assert_eq!(out.unhostable.len(), MAX_LISTED);
    assert_eq!(out.unhostable_more.values().sum::<u32>(), 10_000 - 100);
    assert_eq!(out.unhostable_more.len(), 3, "{:?}", out.unhostable_more);
    // What status carries of it (the outcome and one finding per listed pod, as the run
    // writes them) stays small; `workflows::reconcile::autoscale` checks the findings too.
    let size = serde_json::to_string_pretty(&out)
        .map(|j| j.len())
        .unwrap_or(usize::MAX);
    assert!(size < 64 << 10, "the outcome is {size} bytes");
}

/// Finding 9: the run's own pod (a reconcile Job's, in kube-system, no budget) does not keep
/// the idle worker it runs on.
#[test]
fn the_runs_own_pod_does_not_keep_its_worker() {
    let p = pool("workers", 2, 1, 6);
    let nodes = [node("w1", &p), node("w2", &p)];
    let own = view(json!({
        "metadata": {"name": "oxide-controller-29433120-abcde", "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "oxide-controller",
                "app.kubernetes.io/component": "reconcile"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                "name": "oxide-controller-29433120", "uid": "j", "controller": true}]},
        "spec": {"nodeName": "w2", "priorityClassName": "system-cluster-critical",
            "containers": [{"name": "reconcile-once", "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]},
        "status": {"phase": "Running"}
    }));
    assert!(own.ours);
    let pods = [view(rs_pod("web", "1200m", Some("w1"), "")), own];
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &unneeded_for_an_hour(&["w2"]),
        now(),
    );
    assert_eq!(
        decision(&out, "workers").and_then(|d| d.remove_node.as_deref()),
        Some("w2"),
        "{out:?}"
    );
}

/// Preempting pods (nominatedNodeName) and expendable ones (priority below -10) bring no
/// worker; an expendable pod keeps no node either.
#[test]
fn preempting_and_expendable_pods_are_left_out() {
    let p = pool("workers", 1, 1, 6);
    let nodes = [node("w1", &p)];
    let mut nominated = rs_pod(
        "n",
        "900m",
        None,
        "0/1 nodes are available: 1 Insufficient cpu.",
    );
    nominated["status"]["nominatedNodeName"] = json!("w1");
    let mut cheap = rs_pod(
        "c",
        "900m",
        None,
        "0/1 nodes are available: 1 Insufficient cpu.",
    );
    cheap["spec"]["priority"] = json!(-100);
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[view(nominated), view(cheap)],
        &AutoscaleState::default(),
        now(),
    );
    assert!(out.decisions.is_empty(), "{out:?}");
    assert!(out.unhostable.is_empty(), "{out:?}");

    let p2 = pool("workers", 2, 1, 6);
    let nodes = [node("w1", &p2), node("w2", &p2)];
    let mut bare_cheap = rs_pod("bare", "100m", Some("w2"), "");
    bare_cheap["metadata"]["ownerReferences"] = json!([]);
    bare_cheap["spec"]["priority"] = json!(-100);
    let out = plan(
        std::slice::from_ref(&p2),
        &nodes,
        &[view(bare_cheap)],
        &unneeded_for_an_hour(&["w2"]),
        now(),
    );
    assert!(decision(&out, "workers").is_some(), "{out:?}");
}

/// Two pending pods asking for the same host port need two nodes, however small they are.
#[test]
fn host_ports_are_one_per_node() {
    let p = pool("workers", 1, 1, 6);
    let nodes = [node("w1", &p)];
    let mut pods = Vec::new();
    for name in ["a", "b"] {
        let mut v = rs_pod(
            name,
            "100m",
            None,
            "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports.",
        );
        v["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 8080}]);
        pods.push(view(v));
    }
    let out = plan(
        std::slice::from_ref(&p),
        &nodes,
        &pods,
        &AutoscaleState::default(),
        now(),
    );
    assert_eq!(decision(&out, "workers").map(|d| d.to), Some(3), "{out:?}");
}

/// No scale-down until `scale_down_delay_after_add_seconds` after a scale-up.
#[test]
fn scale_down_waits_after_a_scale_up() {
    let mut p = pool("workers", 2, 1, 6);
    if let Some(a) = p.autoscale.as_mut() {
        a.scale_down_delay_after_add_seconds = 600;
    }
    let nodes = [node("w1", &p), node("w2", &p)];
    let mut prev = unneeded_for_an_hour(&["w1", "w2"]);
    prev.last_scale_up = Some(now() - Duration::minutes(5));
    let out = plan(std::slice::from_ref(&p), &nodes, &[], &prev, now());
    assert!(out.decisions.is_empty(), "{out:?}");
    assert_eq!(out.state.last_scale_up, prev.last_scale_up, "remembered");
    prev.last_scale_up = Some(now() - Duration::minutes(10));
    let out = plan(std::slice::from_ref(&p), &nodes, &[], &prev, now());
    assert_eq!(out.decisions.len(), 1, "{out:?}");
}

/// A removal the autoscaler started that does not finish within `removal_timeout_seconds`
/// is given up; the node is then left alone for five minutes, and the pool's scale-down
/// waits three.
#[test]
fn a_removal_that_does_not_finish_is_given_up_and_backed_off() {
    let p = pool("workers", 3, 1, 6);
    let mut w3 = node("w3", &p);
    w3.cordoned = true;
    w3.removing = true;
    let nodes = [node("w1", &p), node("w2", &p), w3];
    let mut prev = unneeded_for_an_hour(&["w1", "w2"]);
    prev.removing
        .insert("w3".into(), now() - Duration::minutes(5));
    let out = plan(std::slice::from_ref(&p), &nodes, &[], &prev, now());
    assert!(out.given_up.is_empty(), "within its time: {out:?}");
    assert!(out.state.removing.contains_key("w3"));

    let later = now() + Duration::minutes(6);
    let out = plan(std::slice::from_ref(&p), &nodes, &[], &out.state, later);
    assert_eq!(out.given_up, ["w3"], "{out:?}");
    assert!(
        out.decisions.is_empty(),
        "the pool's scale-down waits after a failure: {out:?}"
    );

    // Next run: uncordoned, the node is kept for five minutes, then judged again.
    let nodes = [node("w1", &p), node("w2", &p), node("w3", &p)];
    let out2 = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[],
        &out.state,
        later + Duration::minutes(1),
    );
    assert!(out2.kept["w3"].contains("given up"), "{out2:?}");
    assert!(out2.decisions.is_empty(), "{out2:?}");
    let out3 = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[],
        &out2.state,
        later + Duration::minutes(4),
    );
    assert!(out3.kept["w3"].contains("given up"), "{out3:?}");
    assert_eq!(
        out3.decisions.len(),
        1,
        "three minutes after the failure: {out3:?}"
    );
    assert_ne!(out3.decisions[0].remove_node.as_deref(), Some("w3"));
    let out4 = plan(
        std::slice::from_ref(&p),
        &nodes,
        &[],
        &out2.state,
        later + Duration::minutes(6),
    );
    assert!(!out4.kept.contains_key("w3"), "judged again: {out4:?}");
}
