//! `KubeCluster` against the cluster twin over real HTTPS: Node mapping, cordon and delete,
//! drain through the Eviction API against a PodDisruptionBudget, the run Lease, Events, and
//! the on-demand reconcile Job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oxide_controller::cluster::kube_cluster::{INSTANTIATE_ANNOTATION, KubeCluster};
use oxide_controller::cluster::{
    Cluster, ClusterError, EventType, Eviction, JobTrigger, LeaseOutcome, NAMESPACE, OBJECT_NAME,
    ON_DEMAND_JOB,
};
use oxide_controller::kubeclient;
use oxide_controller::model::{NodeReadiness, PodRef};
use oxide_controller::plan::REMOVING_ANNOTATION;
use oxide_sim::twin::{LocalTwin, Twin, TwinConfig};
use serde_json::{Value, json};

struct Env {
    local: LocalTwin,
    dir: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        let local = Twin::new(TwinConfig::default())
            .unwrap()
            .serve_local()
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("admin.yaml"), local.admin_kubeconfig()).unwrap();
        Env { local, dir }
    }

    /// A fresh adapter with its own client, like a separate run.
    async fn cluster(&self) -> KubeCluster {
        let client = kubeclient::client(Some(&self.dir.path().join("admin.yaml")), None)
            .await
            .unwrap();
        KubeCluster::new(client, NAMESPACE)
    }

    fn twin(&self) -> &Twin {
        &self.local.twin
    }

    fn lease(&self) -> Value {
        self.twin()
            .get(
                "coordination.k8s.io/v1",
                "Lease",
                Some(NAMESPACE),
                OBJECT_NAME,
            )
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
    env.twin()
        .upsert(node("ready", Some(("True", "2026-01-01T00:00:00Z"))))
        .unwrap();
    env.twin()
        .upsert(node("down", Some(("False", "2026-02-03T04:05:06Z"))))
        .unwrap();
    env.twin()
        .upsert(node("lost", Some(("Unknown", "2026-03-01T00:00:00Z"))))
        .unwrap();
    env.twin().upsert(node("silent", None)).unwrap();

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
        env.twin().get("v1", "Node", None, "silent").unwrap()["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    assert_eq!(silent.created, stored);

    // A kubelet heartbeat that flips to Unknown moves `since` to the transition.
    env.twin().set_node_ready("ready", false);
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
    env.twin()
        .upsert(node("w1", Some(("True", "2026-01-01T00:00:00Z"))))
        .unwrap();
    env.twin()
        .upsert(node("w2", Some(("True", "2026-01-01T00:00:00Z"))))
        .unwrap();

    cluster.cordon("w1").await.unwrap();
    cluster.cordon("w1").await.unwrap();
    assert_eq!(
        env.twin().get("v1", "Node", None, "w1").unwrap()["spec"]["unschedulable"],
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

fn pod(name: &str, node: &str, extra_meta: Value, phase: &str) -> Value {
    let mut meta = json!({"name": name, "namespace": "default", "labels": {"app": "web"}});
    if let (Some(m), Some(extra)) = (meta.as_object_mut(), extra_meta.as_object()) {
        m.extend(extra.clone());
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn pdb(min_available: u32) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "web"}}}})
}

#[tokio::test]
async fn drain_sees_pod_kinds_and_eviction_respects_the_disruption_budget() {
    let env = Env::start().await;
    let cluster = env.cluster().await;
    let twin = env.twin();
    twin.upsert(pod("web-1", "w1", json!({}), "Running"))
        .unwrap();
    twin.upsert(pod("web-2", "w2", json!({}), "Running"))
        .unwrap();
    twin.upsert(pod(
        "agent-x",
        "w1",
        json!({"labels": {"app": "agent"}, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u1"}]}),
        "Running",
    ))
    .unwrap();
    twin.upsert(pod(
        "static-w1",
        "w1",
        json!({"labels": {"app": "static"}, "annotations": {"kubernetes.io/config.mirror": "abc"}}),
        "Running",
    ))
    .unwrap();
    twin.upsert(pod(
        "job-done",
        "w1",
        json!({"labels": {"app": "batch"}}),
        "Succeeded",
    ))
    .unwrap();
    twin.upsert(pdb(2)).unwrap();

    let mut pods = cluster.pods_on_node("w1").await.unwrap();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    for p in &mut pods {
        let stored = twin.get("v1", "Pod", Some("default"), &p.name).unwrap();
        assert_eq!(p.uid, stored["metadata"]["uid"].as_str().unwrap());
        p.uid.clear();
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
    assert!(twin.get("v1", "Pod", Some("default"), "web-1").is_some());

    twin.upsert(pdb(1)).unwrap();
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Evicted);
    // Graceful: the pod is Terminating (deletionTimestamp = now + 30 s) until its kubelet
    // confirms; w1 has none here, so it stays, as on a real cluster.
    let terminating = twin.get("v1", "Pod", Some("default"), "web-1").unwrap();
    assert!(terminating["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 30);
    let listed = cluster.pods_on_node("w1").await.unwrap();
    assert!(
        listed
            .iter()
            .any(|p| p.name == "web-1" && p.deleting_at.is_some())
    );
    // Evicting a terminating pod ignores budgets (canIgnorePDB) and deletes it again.
    twin.upsert(pdb(5)).unwrap();
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Evicted);
    twin.upsert(pdb(1)).unwrap();
    assert!(twin.delete("v1", "Pod", Some("default"), "web-1"));
    assert_eq!(cluster.evict(&web1).await.unwrap(), Eviction::Gone);

    // A second budget over the same pods: the apiserver refuses with a bare 500, which is
    // this pod's refusal (drain goes on with the others), not "API unavailable".
    let mut second = pdb(0);
    second["metadata"]["name"] = json!("web-too");
    twin.upsert(second).unwrap();
    let web2 = r("web-2", false, false, false);
    assert_eq!(
        cluster.evict(&web2).await.unwrap(),
        Eviction::Refused(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into()
        )
    );
    assert!(twin.delete(
        "policy/v1",
        "PodDisruptionBudget",
        Some("default"),
        "web-too"
    ));

    // Forced drain deletes without budgets (gracefully); a second delete is fine.
    cluster.delete_pod(&web2).await.unwrap();
    cluster.delete_pod(&web2).await.unwrap();
    let deleted = twin.get("v1", "Pod", Some("default"), "web-2").unwrap();
    assert!(deleted["metadata"]["deletionTimestamp"].is_string());
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
    let spec = &env.lease()["spec"];
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
    assert_eq!(env.lease()["spec"]["leaseTransitions"], 0);

    match b.renew_lease("run-b", ten).await {
        Err(ClusterError::Conflict { what }) => {
            assert_eq!(what, "lease kube-system/oxide-controller")
        }
        other => panic!("a non-holder's renew must conflict, got {other:?}"),
    }
    let before = env.lease()["spec"]["renewTime"].clone();
    tokio::time::sleep(Duration::from_millis(20)).await;
    a.renew_lease("run-a", ten).await.unwrap();
    assert_ne!(env.lease()["spec"]["renewTime"], before);

    // A non-holder's release changes nothing; the holder's frees the Lease.
    b.release_lease("run-b").await.unwrap();
    assert_eq!(env.lease()["spec"]["holderIdentity"], "run-a");
    a.release_lease("run-a").await.unwrap();
    assert!(
        env.lease()["spec"]
            .get("holderIdentity")
            .is_none_or(Value::is_null)
    );
    assert_eq!(
        b.acquire_lease("run-b", ten).await.unwrap(),
        LeaseOutcome::Acquired
    );
    assert_eq!(env.lease()["spec"]["leaseTransitions"], 1);
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
    assert_eq!(env.lease()["spec"]["holderIdentity"], "run-b");
    assert_eq!(env.lease()["spec"]["leaseTransitions"], 1);
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
            env.twin().delete(
                "coordination.k8s.io/v1",
                "Lease",
                Some(NAMESPACE),
                OBJECT_NAME,
            );
        }
        let (ra, rb) = tokio::join!(a.acquire_lease("run-a", ten), b.acquire_lease("run-b", ten));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let holder = env.lease()["spec"]["holderIdentity"]
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
        .twin()
        .list("events.k8s.io/v1", "Event", Some(NAMESPACE));
    assert_eq!(events.len(), 2, "{events:?}");
    let names: std::collections::BTreeSet<&str> = events
        .iter()
        .map(|e| e["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(
        names.iter().all(|n| n.starts_with("oxide-controller.")),
        "{names:?}"
    );
    let warning = events
        .iter()
        .find(|e| e["reason"] == "DrainBlocked")
        .unwrap();
    assert_eq!(warning["type"], "Warning");
    let note = warning["note"].as_str().unwrap();
    assert!(note.len() <= 1024 && note.len() > 1000, "{}", note.len());
    assert_eq!(warning["regarding"]["kind"], "ConfigMap");
    assert_eq!(warning["regarding"]["name"], OBJECT_NAME);
    assert_eq!(warning["regarding"]["namespace"], NAMESPACE);
    assert_eq!(warning["reportingController"], OBJECT_NAME);
    assert_eq!(warning["reportingInstance"], "reconcile-abc12");
    assert!(warning["eventTime"].is_string());
    let normal = events.iter().find(|e| e["reason"] == "Converged").unwrap();
    assert_eq!(
        (normal["type"].as_str(), normal["note"].as_str()),
        (Some("Normal"), Some("3 of 3 workers ready"))
    );
}

fn cronjob() -> Value {
    json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": OBJECT_NAME, "namespace": NAMESPACE},
        "spec": {"schedule": "*/5 * * * *", "concurrencyPolicy": "Forbid",
            "jobTemplate": {
                "metadata": {"labels": {"app.kubernetes.io/name": "oxide-controller"},
                    "annotations": {"example.com/team": "platform"}},
                "spec": {"backoffLimit": 0, "activeDeadlineSeconds": 600, "template": {"spec": {
                    "serviceAccountName": "oxide-controller", "restartPolicy": "Never",
                    "containers": [{"name": "reconcile", "image": "oxide-controller:test", "args": ["reconcile-once"]}]}}}}}})
}

fn job(env: &Env) -> Option<Value> {
    env.twin()
        .get("batch/v1", "Job", Some(NAMESPACE), ON_DEMAND_JOB)
}

fn finish_job(env: &Env, condition: &str) {
    let mut j = job(env).unwrap();
    j["status"] = json!({"conditions": [{"type": condition, "status": "True"}]});
    env.twin().upsert(j).unwrap();
}

#[tokio::test]
async fn reconcile_jobs_come_from_the_cronjob_and_bursts_collapse_into_one() {
    let env = Env::start().await;
    let cluster = env.cluster().await;
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::NoCronJob
    );
    assert!(job(&env).is_none());

    let cron = env.twin().upsert(cronjob()).unwrap();
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::Created
    );
    let first = job(&env).unwrap();
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

    // A burst while the Job is pending or running collapses into it.
    for _ in 0..3 {
        assert_eq!(
            cluster.trigger_reconcile_job().await.unwrap(),
            JobTrigger::AlreadyPending
        );
    }
    assert_eq!(
        job(&env).unwrap()["metadata"]["uid"],
        first["metadata"]["uid"]
    );

    // Once it completed, the next trigger replaces it with a fresh Job.
    finish_job(&env, "Complete");
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::Created
    );
    let second = job(&env).unwrap();
    assert_ne!(second["metadata"]["uid"], first["metadata"]["uid"]);
    assert!(
        second["status"]
            .get("conditions")
            .is_none_or(|c| c.as_array().is_some_and(Vec::is_empty))
    );
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::AlreadyPending
    );

    // A failed run is replaced too.
    finish_job(&env, "Failed");
    assert_eq!(
        cluster.trigger_reconcile_job().await.unwrap(),
        JobTrigger::Created
    );
    assert_ne!(
        job(&env).unwrap()["metadata"]["uid"],
        second["metadata"]["uid"]
    );
}

#[tokio::test]
async fn without_rbac_calls_are_forbidden_and_say_what() {
    let env = Env::start().await;
    let path = env.dir.path().join("sa.yaml");
    std::fs::write(
        &path,
        env.twin()
            .service_account_kubeconfig(&env.local.url, NAMESPACE, "nobody"),
    )
    .unwrap();
    let cluster = KubeCluster::new(
        kubeclient::client(Some(&path), None).await.unwrap(),
        NAMESPACE,
    );
    match cluster.list_nodes().await {
        Err(ClusterError::Forbidden { what, message }) => {
            assert_eq!(what, "list nodes");
            assert!(message.contains("nodes"), "{message}");
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
    match cluster.acquire_lease("run-a", Duration::from_secs(5)).await {
        Err(e @ ClusterError::Forbidden { .. }) => assert!(!e.is_retryable()),
        other => panic!("expected Forbidden, got {other:?}"),
    }
}
