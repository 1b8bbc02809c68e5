//! `KubeCluster` against a real control plane (kube-apiserver, controller-manager, scheduler,
//! etcd and KWOK at the k3s version the product installs): Node mapping, cordon and delete,
//! drain through the Eviction API against a PodDisruptionBudget the real disruption
//! controller keeps, the run Lease, Events, the on-demand reconcile Job run by the real Job
//! controller, and the real authorizer's refusals. The cluster is eventually consistent:
//! where a controller must act first, the tests wait for it with a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kube::api::DeleteParams;
use oxide_controller::adapters::kube_cluster::{INSTANTIATE_ANNOTATION, KubeCluster};
use oxide_controller::adapters::kubeclient;
use oxide_controller::domain::model::{NodeReadiness, PodRef};
use oxide_controller::domain::plan::REMOVING_ANNOTATION;
use oxide_controller::ports::cluster::{
    Cluster, ClusterError, EventType, Eviction, JobTrigger, LeaseOutcome, NAMESPACE, OBJECT_NAME,
    ON_DEMAND_JOB,
};
use oxide_sim::control_plane::{ControlPlane, ControlPlaneOptions, KWOK_LABEL, KWOK_LABEL_VALUE};
use serde_json::{Value, json};

/// How long a controller may take to act on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

struct Env {
    cp: ControlPlane,
    dir: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        let cp = ControlPlane::start(ControlPlaneOptions::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("admin.yaml"), cp.admin_kubeconfig()).unwrap();
        Env { cp, dir }
    }

    /// A fresh adapter with its own client, like a separate run.
    async fn cluster(&self) -> KubeCluster {
        let client = kubeclient::client(Some(&self.dir.path().join("admin.yaml")), None)
            .await
            .unwrap();
        // The CronJob and Jobs these tests make are in kube-system too (the adapter's jobs
        // namespace is a setting; the shipped one is exercised by the bootstrap and RBAC tests).
        KubeCluster::new(client, NAMESPACE).with_jobs_namespace(NAMESPACE)
    }

    async fn apply(&self, obj: Value) -> Value {
        self.cp.apply(obj).await.unwrap()
    }

    async fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        self.cp.get(api_version, kind, ns, name).await.unwrap()
    }

    async fn lease(&self) -> Value {
        self.get(
            "coordination.k8s.io/v1",
            "Lease",
            Some(NAMESPACE),
            OBJECT_NAME,
        )
        .await
        .unwrap()
    }
}

fn node(name: &str, ready: Option<(&str, &str)>) -> Value {
    let conditions: Vec<Value> = ready
        .map(|(status, since)| {
            vec![
                json!({"type": "Ready", "status": status, "reason": "KubeletReady",
                "lastHeartbeatTime": since, "lastTransitionTime": since}),
            ]
        })
        .into_iter()
        .flatten()
        .collect();
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"oxide-controller/pool": "workers"},
            "annotations": {"oxide-controller/delete-me": "true"}},
        "spec": {"providerID": format!("oxide://{name}-uuid")},
        "status": {"conditions": conditions}})
}

#[tokio::test]
async fn nodes_map_to_the_domain_with_readiness_since_the_last_transition() {
    let env = Env::start().await;
    let cluster = env.cluster().await;
    env.apply(node("ready", Some(("True", "2026-01-01T00:00:00Z"))))
        .await;
    env.apply(node("down", Some(("False", "2026-02-03T04:05:06Z"))))
        .await;
    env.apply(node("lost", Some(("Unknown", "2026-03-01T00:00:00Z"))))
        .await;
    env.apply(node("silent", None)).await;

    let mut nodes = cluster.list_nodes().await.unwrap();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["down", "lost", "ready", "silent"]);
    let by = |name: &str| nodes.iter().find(|n| n.name == name).unwrap().clone();

    let ready = by("ready");
    assert_eq!(ready.readiness, NodeReadiness::Ready);
    assert_eq!(ready.provider_id.as_deref(), Some("oxide://ready-uuid"));
    assert_eq!(ready.labels["oxide-controller/pool"], "workers");
    assert!(ready.marked_for_deletion());
    assert!(!ready.unschedulable);
    assert_eq!(
        by("down").readiness,
        NodeReadiness::NotReady {
            since: "2026-02-03T04:05:06Z".parse().unwrap()
        }
    );
    assert_eq!(
        by("lost").readiness,
        NodeReadiness::NotReady {
            since: "2026-03-01T00:00:00Z".parse().unwrap()
        }
    );
    // Never reported: not ready since it registered.
    let silent = by("silent");
    assert_eq!(
        silent.readiness,
        NodeReadiness::NotReady {
            since: silent.created
        }
    );
    let stored: chrono::DateTime<chrono::Utc> =
        env.get("v1", "Node", None, "silent").await.unwrap()["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    assert_eq!(silent.created, stored);

    // A kubelet's status that flips to Unknown moves `since` to the transition.
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    env.apply(node("ready", Some(("Unknown", &now)))).await;
    let after = cluster.list_nodes().await.unwrap();
    let flipped = after.iter().find(|n| n.name == "ready").unwrap();
    assert!(
        matches!(flipped.readiness, NodeReadiness::NotReady { since } if since > "2026-01-02T00:00:00Z".parse::<chrono::DateTime<chrono::Utc>>().unwrap())
    );
}

#[tokio::test]
async fn cordon_and_mark_removing_make_unschedulable_and_delete_node_tolerates_absence() {
    let env = Env::start().await;
    let cluster = env.cluster().await;
    env.apply(node("w1", Some(("True", "2026-01-01T00:00:00Z"))))
        .await;
    env.apply(node("w2", Some(("True", "2026-01-01T00:00:00Z"))))
        .await;

    cluster.cordon("w1").await.unwrap();
    cluster.cordon("w1").await.unwrap();
    assert_eq!(
        env.get("v1", "Node", None, "w1").await.unwrap()["spec"]["unschedulable"],
        true
    );
    let nodes = cluster.list_nodes().await.unwrap();
    assert!(nodes.iter().find(|n| n.name == "w1").unwrap().unschedulable);
    assert!(!nodes.iter().find(|n| n.name == "w2").unwrap().unschedulable);
    match cluster.cordon("nope").await {
        Err(ClusterError::NotFound { what }) => assert_eq!(what, "node nope"),
        other => panic!("expected NotFound, got {other:?}"),
    }

    // Marking for removal cordons and says why, in one write.
    cluster.mark_removing("w2", "scale-down").await.unwrap();
    let w2 = cluster
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.name == "w2")
        .unwrap();
    assert!(w2.unschedulable);
    assert_eq!(
        w2.annotations.get(REMOVING_ANNOTATION).map(String::as_str),
        Some("scale-down")
    );
    assert_eq!(
        w2.annotations
            .get("oxide-controller/delete-me")
            .map(String::as_str),
        Some("true")
    );

    cluster.delete_node("w2").await.unwrap();
    cluster.delete_node("w2").await.unwrap();
    let names: Vec<String> = cluster
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, ["w1"]);
}

/// A Node KWOK keeps (Ready, heartbeats, pods Running and Ready as a kubelet reports them).
fn kwok_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {KWOK_LABEL: KWOK_LABEL_VALUE}},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                   "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})
}

fn pod(name: &str, node: &str, extra_meta: Value) -> Value {
    let mut meta = json!({"name": name, "namespace": "default", "labels": {"app": "web"}});
    if let (Some(m), Some(extra)) = (meta.as_object_mut(), extra_meta.as_object()) {
        m.extend(extra.clone());
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
}

fn pdb(min_available: u32) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "web"}}}})
}

impl Env {
    /// Applies a budget and waits until the disruption controller has computed its status
    /// for this generation (before that the Eviction API answers 429 "still processing").
    async fn settle_pdb(&self, budget: Value) -> Value {
        let name = budget["metadata"]["name"].as_str().unwrap().to_string();
        self.apply(budget).await;
        self.cp
            .wait_for(
                "the disruption controller to observe the budget",
                PATIENCE,
                || async {
                    let b = self
                        .get("policy/v1", "PodDisruptionBudget", Some("default"), &name)
                        .await?;
                    (b["status"]["observedGeneration"] == b["metadata"]["generation"]).then_some(b)
                },
            )
            .await
            .unwrap()
    }

    async fn wait_pod(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        self.cp
            .wait_for(what, PATIENCE, || async {
                self.get("v1", "Pod", Some("default"), name)
                    .await
                    .filter(|p| ok(p))
            })
            .await
            .unwrap()
    }
}

fn is_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

#[tokio::test]
async fn drain_sees_pod_kinds_and_eviction_respects_the_disruption_budget() {
    let env = Env::start().await;
    let cluster = env.cluster().await;
    env.apply(kwok_node("w2")).await;
    env.apply(pod("web-1", "w1", json!({}))).await;
    env.apply(pod("web-2", "w2", json!({}))).await;
    // A DaemonSet on w1: the real DaemonSet controller makes its pod (owned, controller).
    let mut w1 = kwok_node("w1");
    w1["metadata"]["labels"]["pool"] = json!("a");
    env.apply(w1).await;
    env.apply(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"nodeSelector": {"pool": "a"},
                    "containers": [{"name": "c", "image": "i"}]}}}}))
        .await;
    env.apply(pod(
        "static-w1",
        "w1",
        json!({"labels": {"app": "static"}, "annotations": {"kubernetes.io/config.mirror": "abc"}}),
    ))
    .await;
    // A finished pod, as a kubelet reports it (KWOK's pod-complete stage only finishes
    // pods owned by a Job).
    env.apply(pod("job-done", "w1", json!({"labels": {"app": "batch"}})))
        .await;
    env.wait_pod("job-done", "KWOK to run job-done", |p| {
        p["status"]["phase"] == "Running"
    })
    .await;
    env.cp
        .apply_status(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "job-done", "namespace": "default"},
            "status": {"phase": "Succeeded"}}))
        .await
        .unwrap();
    for name in ["web-1", "web-2"] {
        env.wait_pod(name, "KWOK to make the web pods Ready", is_ready)
            .await;
    }
    env.cp
        .wait_for("the DaemonSet's pod on w1", PATIENCE, || async {
            let pods = env.cp.list("v1", "Pod", Some("default")).await.ok()?;
            pods.iter()
                .any(|p| p["metadata"]["labels"]["app"] == "agent" && p["spec"]["nodeName"] == "w1")
                .then_some(())
        })
        .await
        .unwrap();
    let budget = env.settle_pdb(pdb(2)).await;
    assert_eq!(budget["status"]["disruptionsAllowed"], 0, "{budget}");

    let mut pods = cluster.pods_on_node("w1").await.unwrap();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    for p in &mut pods {
        let stored = env
            .get("v1", "Pod", Some("default"), &p.name)
            .await
            .unwrap();
        assert_eq!(p.uid, stored["metadata"]["uid"].as_str().unwrap());
        p.uid.clear();
        if p.name.starts_with("agent-") {
            p.name = "agent-x".into(); // the DaemonSet controller's generated name
        }
    }
    let r = |name: &str, daemonset, mirror, finished| PodRef {
        namespace: "default".into(),
        name: name.into(),
        daemonset,
        mirror,
        finished,
        ..PodRef::default()
    };
    assert_eq!(
        pods,
        [
            r("agent-x", true, false, false),
            r("job-done", false, false, true),
            r("static-w1", false, true, false),
            r("web-1", false, false, false),
        ]
    );

    // Two healthy web pods and minAvailable 2: the budget refuses (HTTP 429).
    let web1 = r("web-1", false, false, false);
    assert_eq!(
        cluster.evict(&web1).await.unwrap(),
        Eviction::BlockedByBudget
    );
    assert!(
        env.get("v1", "Pod", Some("default"), "web-1")
            .await
            .is_some()
    );

    env.settle_pdb(pdb(1)).await;
    let evicted_at = chrono::Utc::now();
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Evicted);
    // Graceful: the pod is Terminating (deletionTimestamp = now + its 30 s default grace) and
    // stays listed until KWOK, as a kubelet whose containers stopped, confirms the
    // termination: 1 s at the earliest, by the deletionTimestamp at the latest (kwok@v0.7.0
    // kustomize/stage/pod/general/pod-delete.yaml:18-25).
    let listed = cluster.pods_on_node("w1").await.unwrap();
    let terminating = listed
        .iter()
        .find(|p| p.name == "web-1")
        .unwrap_or_else(|| panic!("the evicted pod went at once: {listed:?}"));
    let deadline = terminating
        .deleting_at
        .unwrap_or_else(|| panic!("not terminating: {terminating:?}"));
    let grace = deadline - evicted_at;
    assert!(
        grace > chrono::Duration::seconds(25) && grace <= chrono::Duration::seconds(31),
        "deletionTimestamp {deadline}, evicted at {evicted_at}"
    );
    let stored = env
        .get("v1", "Pod", Some("default"), "web-1")
        .await
        .unwrap();
    assert_eq!(
        stored["metadata"]["deletionGracePeriodSeconds"], 30,
        "{stored}"
    );
    env.cp
        .wait_for("KWOK to finish the evicted pod", PATIENCE, || async {
            env.get("v1", "Pod", Some("default"), "web-1")
                .await
                .is_none()
                .then_some(())
        })
        .await
        .unwrap();
    let gone_after = chrono::Utc::now() - evicted_at;
    assert!(
        gone_after >= chrono::Duration::seconds(1),
        "gone {gone_after} after the eviction: no grace at all"
    );
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Gone);

    // A second budget over the same pods: the apiserver refuses with a bare 500, which is
    // this pod's refusal (drain goes on with the others), not "API unavailable".
    let mut second = pdb(0);
    second["metadata"]["name"] = json!("web-too");
    env.settle_pdb(second).await;
    let web2 = r("web-2", false, false, false);
    assert_eq!(
        cluster.evict(&web2).await.unwrap(),
        Eviction::Refused(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into()
        )
    );
    assert!(
        env.cp
            .delete(
                "policy/v1",
                "PodDisruptionBudget",
                Some("default"),
                "web-too"
            )
            .await
            .unwrap()
    );

    // Forced drain deletes without budgets (gracefully); a second delete is fine.
    cluster.delete_pod(&web2).await.unwrap();
    cluster.delete_pod(&web2).await.unwrap();
    env.cp
        .wait_for("the deleted pod to go", PATIENCE, || async {
            env.get("v1", "Pod", Some("default"), "web-2")
                .await
                .is_none()
                .then_some(())
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn evicting_a_terminating_pod_ignores_the_budget() {
    // A pod whose kubelet is gone (no KWOK on its Node) stays Terminating, as on a real
    // cluster; evicting it again ignores the budget (canIgnorePDB) and deletes it again.
    let env = Env::start().await;
    let cluster = env.cluster().await;
    env.apply(node("w1", Some(("True", "2026-01-01T00:00:00Z"))))
        .await;
    env.apply(pod("web-1", "w1", json!({}))).await;
    env.cp
        .apply_status(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "default"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}))
        .await
        .unwrap();
    env.settle_pdb(pdb(0)).await;
    let web1 = PodRef {
        namespace: "default".into(),
        name: "web-1".into(),
        ..PodRef::default()
    };
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Evicted);
    let terminating = env
        .get("v1", "Pod", Some("default"), "web-1")
        .await
        .unwrap();
    assert!(terminating["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 30);
    env.settle_pdb(pdb(5)).await;
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Evicted);
    // Removed for good (as `kubectl delete --force --grace-period=0`): the next eviction
    // finds nothing.
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    assert!(
        env.cp
            .delete_with("v1", "Pod", Some("default"), "web-1", &force)
            .await
            .unwrap()
    );
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Gone);
}

#[tokio::test]
async fn the_lease_admits_one_holder_at_a_time() {
    let env = Env::start().await;
    let (a, b) = (env.cluster().await, env.cluster().await);
    let ten = Duration::from_secs(10);

    assert_eq!(
        a.acquire_lease("run-a", ten).await.unwrap(),
        LeaseOutcome::Acquired
    );
    let spec = &env.lease().await["spec"];
    assert_eq!(
        (
            spec["holderIdentity"].as_str(),
            spec["leaseDurationSeconds"].as_i64()
        ),
        (Some("run-a"), Some(10))
    );

    match b.acquire_lease("run-b", ten).await.unwrap() {
        LeaseOutcome::HeldBy { holder, until } => {
            assert_eq!(holder, "run-a");
            let until = until.unwrap();
            let left = until - chrono::Utc::now();
            assert!(
                left > chrono::Duration::seconds(8) && left <= chrono::Duration::seconds(10),
                "{left}"
            );
        }
        other => panic!("expected HeldBy, got {other:?}"),
    }
    // Re-acquiring our own Lease is fine and is not a transition.
    assert_eq!(
        a.acquire_lease("run-a", ten).await.unwrap(),
        LeaseOutcome::Acquired
    );
    assert_eq!(env.lease().await["spec"]["leaseTransitions"], 0);

    match b.renew_lease("run-b", ten).await {
        Err(ClusterError::Conflict { what }) => {
            assert_eq!(what, "lease kube-system/oxide-controller")
        }
        other => panic!("a non-holder's renew must conflict, got {other:?}"),
    }
    let before = env.lease().await["spec"]["renewTime"].clone();
    tokio::time::sleep(Duration::from_millis(20)).await;
    a.renew_lease("run-a", ten).await.unwrap();
    assert_ne!(env.lease().await["spec"]["renewTime"], before);

    // A non-holder's release changes nothing; the holder's frees the Lease.
    b.release_lease("run-b").await.unwrap();
    assert_eq!(env.lease().await["spec"]["holderIdentity"], "run-a");
    a.release_lease("run-a").await.unwrap();
    assert!(
        env.lease().await["spec"]
            .get("holderIdentity")
            .is_none_or(Value::is_null)
    );
    assert_eq!(
        b.acquire_lease("run-b", ten).await.unwrap(),
        LeaseOutcome::Acquired
    );
    assert_eq!(env.lease().await["spec"]["leaseTransitions"], 1);
    assert!(matches!(
        a.renew_lease("run-a", ten).await,
        Err(ClusterError::Conflict { .. })
    ));
}

#[tokio::test]
async fn an_expired_lease_lets_a_new_holder_in() {
    let env = Env::start().await;
    let (a, b) = (env.cluster().await, env.cluster().await);
    assert_eq!(
        a.acquire_lease("run-a", Duration::from_secs(1))
            .await
            .unwrap(),
        LeaseOutcome::Acquired
    );
    assert!(matches!(
        b.acquire_lease("run-b", Duration::from_secs(30)).await.unwrap(),
        LeaseOutcome::HeldBy { ref holder, .. } if holder == "run-a"
    ));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        b.acquire_lease("run-b", Duration::from_secs(30))
            .await
            .unwrap(),
        LeaseOutcome::Acquired
    );
    assert_eq!(env.lease().await["spec"]["holderIdentity"], "run-b");
    assert_eq!(env.lease().await["spec"]["leaseTransitions"], 1);
    // The old holder finds out when it tries to renew.
    assert!(matches!(
        a.renew_lease("run-a", Duration::from_secs(1)).await,
        Err(ClusterError::Conflict { .. })
    ));
}

#[tokio::test]
async fn racing_runs_never_both_get_the_lease() {
    let env = Env::start().await;
    let (a, b) = (env.cluster().await, env.cluster().await);
    let ten = Duration::from_secs(10);
    for round in 0..20 {
        // Alternate between racing on a missing Lease (create) and a released one (replace).
        if round % 2 == 0 {
            env.cp
                .delete(
                    "coordination.k8s.io/v1",
                    "Lease",
                    Some(NAMESPACE),
                    OBJECT_NAME,
                )
                .await
                .unwrap();
        }
        let (ra, rb) = tokio::join!(a.acquire_lease("run-a", ten), b.acquire_lease("run-b", ten));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let holder = env.lease().await["spec"]["holderIdentity"]
            .as_str()
            .unwrap()
            .to_owned();
        match (&ra, &rb) {
            (LeaseOutcome::Acquired, LeaseOutcome::HeldBy { holder: h, .. }) => {
                assert_eq!(
                    (h.as_str(), holder.as_str()),
                    ("run-a", "run-a"),
                    "round {round}"
                )
            }
            (LeaseOutcome::HeldBy { holder: h, .. }, LeaseOutcome::Acquired) => {
                assert_eq!(
                    (h.as_str(), holder.as_str()),
                    ("run-b", "run-b"),
                    "round {round}"
                )
            }
            other => panic!("round {round}: expected exactly one holder, got {other:?}"),
        }
        a.release_lease("run-a").await.unwrap();
        b.release_lease("run-b").await.unwrap();
    }
}

#[tokio::test]
async fn events_are_recorded_about_the_configmap_with_bounded_notes() {
    let env = Env::start().await;
    let cluster = env
        .cluster()
        .await
        .with_reporting_instance("reconcile-abc12");
    let long = "ü".repeat(700); // 1,400 bytes
    cluster
        .record_event(EventType::Warning, "DrainBlocked", &long)
        .await
        .unwrap();
    cluster
        .record_event(EventType::Normal, "Converged", "3 of 3 workers ready")
        .await
        .unwrap();

    let events = env
        .cp
        .list("events.k8s.io/v1", "Event", Some(NAMESPACE))
        .await
        .unwrap();
    let ours: Vec<&Value> = events
        .iter()
        .filter(|e| e["reportingController"] == OBJECT_NAME)
        .collect();
    assert_eq!(ours.len(), 2, "{events:?}");
    let names: std::collections::BTreeSet<&str> = ours
        .iter()
        .map(|e| e["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(
        names.iter().all(|n| n.starts_with("oxide-controller.")),
        "{names:?}"
    );
    let warning = ours.iter().find(|e| e["reason"] == "DrainBlocked").unwrap();
    assert_eq!(warning["type"], "Warning");
    let note = warning["note"].as_str().unwrap();
    assert!(note.len() <= 1024 && note.len() > 1000, "{}", note.len());
    assert_eq!(warning["regarding"]["kind"], "ConfigMap");
    assert_eq!(warning["regarding"]["name"], OBJECT_NAME);
    assert_eq!(warning["regarding"]["namespace"], NAMESPACE);
    assert_eq!(warning["reportingController"], OBJECT_NAME);
    assert_eq!(warning["reportingInstance"], "reconcile-abc12");
    assert!(warning["eventTime"].is_string());
    let normal = ours.iter().find(|e| e["reason"] == "Converged").unwrap();
    assert_eq!(
        (normal["type"].as_str(), normal["note"].as_str()),
        (Some("Normal"), Some("3 of 3 workers ready"))
    );
}

/// The chart's CronJob, reduced; `node_selector` keeps its Jobs' pods off every Node (so a
/// Job stays pending) until a test lets them run.
fn cronjob(node_selector: Value, deadline: u32) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": OBJECT_NAME, "namespace": NAMESPACE},
        "spec": {"schedule": "*/5 * * * *", "concurrencyPolicy": "Forbid",
            "jobTemplate": {
                "metadata": {"labels": {"app.kubernetes.io/name": "oxide-controller"},
                    "annotations": {"example.com/team": "platform"}},
                "spec": {"backoffLimit": 0, "activeDeadlineSeconds": deadline, "template": {"spec": {
                    "serviceAccountName": "oxide-controller", "restartPolicy": "Never",
                    "nodeSelector": node_selector,
                    "containers": [{"name": "reconcile", "image": "oxide-controller:test", "args": ["reconcile-once"]}]}}}}}})
}

async fn job(env: &Env) -> Option<Value> {
    env.get("batch/v1", "Job", Some(NAMESPACE), ON_DEMAND_JOB)
        .await
}

/// Waits until the real Job controller gives the on-demand Job `condition`.
async fn wait_job(env: &Env, condition: &str) {
    env.cp
        .wait_for(
            &format!("the Job controller to mark the Job {condition}"),
            PATIENCE,
            || async {
                let j = job(env).await?;
                j["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == condition && c["status"] == "True")
                    .then_some(())
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn reconcile_jobs_come_from_the_cronjob_and_bursts_collapse_into_one() {
    let env = Env::start().await;
    env.cp
        .service_account_token(NAMESPACE, "oxide-controller")
        .await
        .unwrap();
    let cluster = env.cluster().await;
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::NoCronJob
    );
    assert!(job(&env).await.is_none());

    let runnable = json!({"pool": "system"});
    let cron = env.apply(cronjob(runnable.clone(), 600)).await;
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::Created
    );
    let first = job(&env).await.unwrap();
    let meta = &first["metadata"];
    assert_eq!(meta["labels"]["app.kubernetes.io/name"], "oxide-controller");
    assert_eq!(meta["annotations"]["example.com/team"], "platform");
    assert_eq!(meta["annotations"][INSTANTIATE_ANNOTATION], "manual");
    let owner = &meta["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("CronJob"), Some(OBJECT_NAME))
    );
    assert_eq!(owner["uid"], cron["metadata"]["uid"]);
    assert_eq!(owner["controller"], true);
    // As kubectl create job --from: no blockOwnerDeletion, which would need update on
    // cronjobs/finalizers under OwnerReferencesPermissionEnforcement.
    assert!(owner.get("blockOwnerDeletion").is_none(), "{owner}");
    assert_eq!(
        first["spec"]["template"]["spec"]["containers"][0]["args"][0],
        "reconcile-once"
    );
    assert_eq!(first["spec"]["activeDeadlineSeconds"], 600);

    // A burst while the Job is pending (no Node matches its pod yet) collapses into it.
    for _ in 0..3 {
        assert_eq!(
            cluster.trigger_reconcile_job().await.unwrap(),
            JobTrigger::AlreadyPending
        );
    }
    assert_eq!(
        job(&env).await.unwrap()["metadata"]["uid"],
        first["metadata"]["uid"]
    );

    // A Node for it: the scheduler binds the pod, KWOK runs and completes it, the Job
    // controller marks the Job Complete; the next trigger replaces it with a fresh Job.
    let mut n = kwok_node("system-1");
    n["metadata"]["labels"]["pool"] = json!("system");
    env.apply(n).await;
    wait_job(&env, "Complete").await;
    // The next Job may not run (no Node matches) and fails at its deadline.
    env.apply(cronjob(json!({"pool": "nowhere"}), 3)).await;
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::Created
    );
    let second = job(&env).await.unwrap();
    assert_ne!(second["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::AlreadyPending
    );

    // A failed run is replaced too.
    wait_job(&env, "Failed").await;
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::Created
    );
    assert_ne!(
        job(&env).await.unwrap()["metadata"]["uid"],
        second["metadata"]["uid"]
    );
}

#[tokio::test]
async fn without_rbac_calls_are_forbidden_and_say_what() {
    let env = Env::start().await;
    let path = env.dir.path().join("sa.yaml");
    let kubeconfig = env
        .cp
        .service_account_kubeconfig(&env.cp.server_url(), NAMESPACE, "nobody")
        .await
        .unwrap();
    std::fs::write(&path, kubeconfig).unwrap();
    let cluster = KubeCluster::new(
        kubeclient::client(Some(&path), None).await.unwrap(),
        NAMESPACE,
    );
    // The real authorizer's message names the user, verb and resource.
    match cluster.list_nodes().await {
        Err(ClusterError::Forbidden { what, message }) => {
            assert_eq!(what, "list nodes");
            assert!(
                message.contains("cannot list resource \"nodes\"")
                    && message.contains("system:serviceaccount:kube-system:nobody"),
                "{message}"
            );
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
    match cluster.acquire_lease("run-a", Duration::from_secs(5)).await {
        Err(e @ ClusterError::Forbidden { .. }) => assert!(!e.is_retryable()),
        other => panic!("expected Forbidden, got {other:?}"),
    }
}

#[tokio::test]
async fn re_eviction_never_touches_a_same_named_replacement_pod() {
    // Audit kubernetes-2 finding 11: the eviction carries the uid it meant.
    let env = Env::start().await;
    let cluster = env.cluster().await;
    env.apply(node("w1", Some(("True", "2026-01-01T00:00:00Z"))))
        .await;
    env.apply(pod("web-0", "w1", json!({}))).await;
    let first = env
        .get("v1", "Pod", Some("default"), "web-0")
        .await
        .unwrap();
    let stale = PodRef {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: first["metadata"]["uid"].as_str().unwrap().into(),
        ..PodRef::default()
    };
    // The pod goes and a StatefulSet-like controller makes a new one with the same name.
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    env.cp
        .delete_with("v1", "Pod", Some("default"), "web-0", &force)
        .await
        .unwrap();
    env.apply(pod("web-0", "w1", json!({}))).await;
    let second = env
        .get("v1", "Pod", Some("default"), "web-0")
        .await
        .unwrap();
    assert_ne!(second["metadata"]["uid"], first["metadata"]["uid"]);

    assert_eq!(cluster.evict(&stale).await.unwrap(), Eviction::Gone);
    let still = env
        .get("v1", "Pod", Some("default"), "web-0")
        .await
        .unwrap();
    assert!(
        still["metadata"]["deletionTimestamp"].is_null(),
        "the replacement was evicted: {still}"
    );
    let current = PodRef {
        uid: second["metadata"]["uid"].as_str().unwrap().into(),
        ..stale
    };
    assert_eq!(cluster.evict(&current).await.unwrap(), Eviction::Evicted);
}

#[tokio::test]
async fn a_finished_job_still_being_deleted_is_not_reported_as_a_pending_run() {
    // Audit kubernetes-2 finding 11: a finished on-demand Job held by a finalizer while it
    // is deleted is no run; the trigger waits for it to go, and says so when it does not.
    let env = Env::start().await;
    env.cp
        .service_account_token(NAMESPACE, "oxide-controller")
        .await
        .unwrap();
    let cluster = env.cluster().await;
    env.apply(cronjob(json!({"pool": "system"}), 600)).await;
    let mut n = kwok_node("system-1");
    n["metadata"]["labels"]["pool"] = json!("system");
    env.apply(n).await;
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::Created
    );
    wait_job(&env, "Complete").await;
    env.cp
        .merge_patch(
            "batch/v1",
            "Job",
            Some(NAMESPACE),
            ON_DEMAND_JOB,
            &json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        )
        .await
        .unwrap();
    env.cp
        .delete("batch/v1", "Job", Some(NAMESPACE), ON_DEMAND_JOB)
        .await
        .unwrap();
    match cluster.trigger_reconcile_job().await {
        Err(e @ ClusterError::Conflict { .. }) => {
            assert!(e.to_string().contains("still being deleted"), "{e}")
        }
        other => panic!("expected the truth about the deleting Job, got {other:?}"),
    }
    // The finalizer goes while a trigger waits: it then starts the new run.
    let release = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        env.cp
            .merge_patch(
                "batch/v1",
                "Job",
                Some(NAMESPACE),
                ON_DEMAND_JOB,
                &json!({"metadata": {"finalizers": null}}),
            )
            .await
            .unwrap();
    };
    let (outcome, ()) = tokio::join!(cluster.trigger_reconcile_job(), release);
    assert_eq!(outcome.unwrap(), JobTrigger::Created);
}

#[tokio::test]
async fn the_reconcile_pod_is_never_placed_on_an_unreachable_node() {
    // Audit kubernetes-2 finding 10: the shipped CronJob's tolerations keep the repair run
    // on a live node (they tolerate not-ready/unreachable only as NoExecute).
    let env = Env::start().await;
    // The template's account (placed in kube-system here: only scheduling is tested).
    env.cp
        .service_account_token(NAMESPACE, "oxide-controller-reconcile")
        .await
        .unwrap();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s-cronjobs/cronjob.yaml"),
    )
    .unwrap();
    let cron: Value = serde_saphyr::from_str(&text).unwrap();
    let template = &cron["spec"]["jobTemplate"]["spec"]["template"];
    // A node whose kubelet went silent: Ready=Unknown, and the node lifecycle controller's
    // unreachable:NoSchedule taint (it keeps the taint in step with the condition; a taint
    // without the condition would be removed).
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    env.apply(json!({"apiVersion": "v1", "kind": "Node",
        // A server (the run selects servers only): only its taint keeps the run off it.
        "metadata": {"name": "dead", "labels": {"kubernetes.io/os": "linux",
            "node-role.kubernetes.io/control-plane": "true"}},
        "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                   "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "Unknown",
                       "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status.",
                       "lastHeartbeatTime": now, "lastTransitionTime": now}]}}))
    .await;
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "reconcile-x", "namespace": NAMESPACE,
            "labels": template["metadata"]["labels"]},
        "spec": template["spec"]});
    pod["spec"]["restartPolicy"] = json!("Never");
    env.apply(pod).await;
    let unschedulable = env
        .cp
        .wait_for("the scheduler to consider the pod", PATIENCE, || async {
            let p = env.get("v1", "Pod", Some(NAMESPACE), "reconcile-x").await?;
            if p["spec"]["nodeName"].is_string() {
                return Some(Err(p["spec"]["nodeName"].clone()));
            }
            p["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
                .then_some(Ok(()))
        })
        .await
        .unwrap();
    assert_eq!(
        unschedulable,
        Ok(()),
        "the repair run was bound to the unreachable node"
    );
    // A live node appears: the run goes there.
    let mut live = kwok_node("live");
    live["metadata"]["labels"]["kubernetes.io/os"] = json!("linux");
    live["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = json!("true");
    env.apply(live).await;
    let bound = env
        .cp
        .wait_for("the pod to be bound", PATIENCE, || async {
            let p = env.get("v1", "Pod", Some(NAMESPACE), "reconcile-x").await?;
            p["spec"]["nodeName"].as_str().map(str::to_string)
        })
        .await
        .unwrap();
    assert_eq!(bound, "live");
}
