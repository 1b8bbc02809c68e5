//! The real control plane the tests run on: it starts, reports the k3s version the product
//! installs, refuses unknown fields under strict validation, and KWOK keeps annotated Nodes
//! Ready while the real node lifecycle controller marks the others Unknown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oxide_sim::control_plane::{
    ControlPlane, ControlPlaneOptions, KUBERNETES_VERSION, KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE,
};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(60);

fn ready(node: &Value) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

#[tokio::test]
async fn starts_at_the_k3s_version_and_validates_strictly() {
    let cp = ControlPlane::start(ControlPlaneOptions {
        kwok: false,
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    let version = cp.client().apiserver_version().await.unwrap();
    assert_eq!(version.git_version, KUBERNETES_VERSION);

    // `kubectl apply --validate=strict` sends fieldValidation=Strict: an unknown field is
    // refused by the real schema, where the twin accepted anything.
    let bad = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bad"}, "data": {"a": "b"}, "dta": {"x": "y"}});
    let req = http::Request::post("/api/v1/namespaces/default/configmaps?fieldValidation=Strict")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&bad).unwrap())
        .unwrap();
    let err = cp.client().request_text(req).await.unwrap_err().to_string();
    assert!(err.contains("unknown field \"dta\""), "{err}");
}

#[tokio::test]
async fn kwok_keeps_its_nodes_ready_and_the_lifecycle_controller_marks_the_rest_unknown() {
    let cp = ControlPlane::start(ControlPlaneOptions {
        node_monitor_grace_period: Duration::from_secs(10),
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    let node = |name: &str, kwok: bool| {
        let mut n = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {}},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                       "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"}}});
        if kwok {
            n["metadata"]["annotations"][KWOK_ANNOTATION] = json!(KWOK_ANNOTATION_VALUE);
        }
        n
    };
    cp.apply(node("kept", true)).await.unwrap();
    // A Node that reported Ready once and then fell silent (a Node that never reported gets
    // the controller's 60 s node-startup grace instead).
    let mut silent = node("silent", false);
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    silent["status"]["conditions"] = json!([{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "lastHeartbeatTime": now, "lastTransitionTime": now}]);
    cp.apply(silent).await.unwrap();
    cp.wait_for("KWOK to make `kept` Ready", PATIENCE, || async {
        let n = cp.get("v1", "Node", None, "kept").await.unwrap()?;
        (ready(&n).as_deref() == Some("True")).then_some(())
    })
    .await
    .unwrap();
    // A Node nothing heartbeats for: after the grace period the node lifecycle controller
    // sets Ready=Unknown, and its NoExecute tainting pass (a separate loop, so a moment
    // later: kubernetes@v1.33.4:pkg/controller/nodelifecycle/node_lifecycle_controller.go
    // doNoExecuteTaintingPass) taints it unreachable.
    let unreachable = |n: &Value| {
        n["spec"]["taints"].as_array().is_some_and(|t| {
            t.iter()
                .any(|t| t["key"] == "node.kubernetes.io/unreachable" && t["effect"] == "NoExecute")
        })
    };
    cp.wait_for(
        "`silent` to go Unknown and be tainted unreachable",
        PATIENCE,
        || async {
            let n = cp.get("v1", "Node", None, "silent").await.unwrap()?;
            (ready(&n).as_deref() == Some("Unknown") && unreachable(&n)).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tail("kube-controller-manager")));
    let kept = cp.get("v1", "Node", None, "kept").await.unwrap().unwrap();
    assert_eq!(ready(&kept).as_deref(), Some("True"));
}

/// A kube client for `kubeconfig`.
async fn client_for(kubeconfig: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

#[tokio::test]
async fn the_front_proxy_names_certificate_callers_passes_tokens_and_injects_faults() {
    use oxide_sim::control_plane::proxy::FrontProxy;
    use oxide_sim::oxide::faults::{FaultSpec, Faults, RouteFault};

    let cp = ControlPlane::start(ControlPlaneOptions {
        kwok: false,
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    let faults = Faults::default();
    let proxy = FrontProxy::new(&cp, faults.clone()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let tls = proxy.tls_config(&["127.0.0.1".into()]).unwrap();
    let task = tokio::spawn(std::sync::Arc::clone(&proxy).serve(listener, tls));

    // A client certificate of the cluster's CA: the apiserver sees its user and groups.
    let admin = client_for(
        &cp.user_kubeconfig(&url, "system:admin", &["system:masters"])
            .unwrap(),
    )
    .await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin.clone());
    assert!(nodes.list(&Default::default()).await.is_ok());
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&review).unwrap())
        .unwrap();
    let me: Value = admin.request(req).await.unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "system:admin");
    assert!(
        me["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters"))
    );

    // A ServiceAccount token passes through: the real authorizer refuses what RBAC lacks.
    let sa = client_for(
        &cp.service_account_kubeconfig(&url, "kube-system", "nobody")
            .await
            .unwrap(),
    )
    .await;
    let err = kube::Api::<k8s_openapi::api::core::v1::Node>::all(sa)
        .list(&Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("system:serviceaccount:kube-system:nobody")
            && err.contains("cannot list resource \"nodes\""),
        "{err}"
    );

    // Faults per verb and resource; counters per method and path template.
    faults.set(FaultSpec {
        kube: [(
            "list nodes".to_string(),
            RouteFault {
                error_rate: 1.0,
                // 500: kube-rs retries 503 on its own, which would hide the count.
                error_status: 500,
                latency_ms: 0,
            },
        )]
        .into(),
        ..FaultSpec::default()
    });
    let err = nodes
        .list(&Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("injected fault"), "{err}");
    assert!(nodes.get_opt("absent").await.unwrap().is_none());
    let counters = proxy.counters();
    assert_eq!(counters.get("GET /api/v1/nodes"), Some(&3), "{counters:?}");
    assert_eq!(
        counters.get("GET /api/v1/nodes/{name}"),
        Some(&1),
        "{counters:?}"
    );
    task.abort();
}

/// Audit sim-3 K5: a fault of `kube` answers before forwarding (nothing happens), one of
/// `kube_after` answers after the apiserver committed the request (the write is there; a retry
/// of the create gets 409 AlreadyExists, a retry of the update with the old resourceVersion
/// 409 Conflict), as a real 504 "may still be processing the request".
#[tokio::test]
async fn the_front_proxy_fails_writes_before_or_after_the_apiserver_commits_them() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;
    use oxide_sim::control_plane::proxy::LocalApi;
    use oxide_sim::oxide::faults::{AfterFault, FaultSpec, Faults, RouteFault};

    let faults = Faults::default();
    let local = LocalApi::start(
        ControlPlaneOptions {
            controller_manager: false,
            scheduler: false,
            kwok: false,
            ..ControlPlaneOptions::default()
        },
        faults.clone(),
    )
    .await
    .unwrap();
    // Without kube-rs's own retry of 503/504 (the product's client has none either), which
    // would turn the 504 into the retry's 409 before the test saw it.
    let kc = kube::config::Kubeconfig::from_yaml(&local.admin_kubeconfig()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).unwrap();
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    let cm = |name: &str, v: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": v}})).unwrap()
    };
    let status_of = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("{other}"),
    };

    // Before: refused, nothing written.
    faults.set(FaultSpec {
        kube: [(
            "create configmaps".to_string(),
            RouteFault {
                error_rate: 1.0,
                error_status: 500,
                latency_ms: 0,
            },
        )]
        .into(),
        ..FaultSpec::default()
    });
    let (code, _) = status_of(
        cms.create(&PostParams::default(), &cm("before", "1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(cms.get_opt("before").await.unwrap().is_none());

    // After: answered 504, yet committed.
    faults.set(FaultSpec {
        kube_after: [
            ("create configmaps".to_string(), AfterFault::default()),
            ("update configmaps".to_string(), AfterFault::default()),
        ]
        .into(),
        ..FaultSpec::default()
    });
    let (code, message) = status_of(
        cms.create(&PostParams::default(), &cm("after", "1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 504);
    assert!(message.contains("may still be processing"), "{message}");
    let stored = cms.get("after").await.unwrap();
    assert_eq!(stored.data.as_ref().unwrap()["k"], "1");
    let (code, _) = status_of(
        cms.create(&PostParams::default(), &cm("after", "1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 409, "the retried create finds it made");

    let mut changed = stored.clone();
    changed.data = Some([("k".to_string(), "2".to_string())].into());
    let (code, _) = status_of(
        cms.replace("after", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 504);
    let now = cms.get("after").await.unwrap();
    assert_eq!(now.data.as_ref().unwrap()["k"], "2", "the update landed");
    assert_ne!(
        now.metadata.resource_version,
        stored.metadata.resource_version
    );
    let (code, _) = status_of(
        cms.replace("after", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        code, 409,
        "the retried update holds a stale resourceVersion"
    );
    // Each fault was used once; the next writes go through.
    assert!(faults.get().kube_after.values().all(|f| f.times == 0));
    let mut again = now.clone();
    again.data = Some([("k".to_string(), "3".to_string())].into());
    cms.replace("after", &PostParams::default(), &again)
        .await
        .unwrap();
}

#[tokio::test]
async fn kwok_runs_workload_pods_but_leaves_ours_to_the_harness() {
    let cp = ControlPlane::start(ControlPlaneOptions {
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    cp.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "w1", "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE}}}))
        .await
        .unwrap();
    let pod = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels,
                "finalizers": ["example.com/keep"]},
            "spec": {"nodeName": "w1", "containers": [{"name": "c", "image": "i"}]}})
    };
    cp.apply(pod("web", json!({"app": "web"}))).await.unwrap();
    cp.apply(pod(
        "ours",
        json!({"app.kubernetes.io/name": "oxide-controller"}),
    ))
    .await
    .unwrap();
    let phase = |name: &'static str| {
        let cp = &cp;
        async move {
            cp.get("v1", "Pod", Some("default"), name)
                .await
                .unwrap()
                .and_then(|p| p["status"]["phase"].as_str().map(str::to_string))
        }
    };
    cp.wait_for("KWOK to run the workload pod", PATIENCE, || async {
        (phase("web").await.as_deref() == Some("Running")).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(
        phase("ours").await.as_deref(),
        Some("Pending"),
        "{}",
        cp.log_tail("kwok")
    );

    // Deleted: KWOK ends the workload pod's containers, but its finalizer keeps the object
    // (terminating) until its owner removes it, as with a kubelet.
    cp.delete("v1", "Pod", Some("default"), "web")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let web = cp
        .get("v1", "Pod", Some("default"), "web")
        .await
        .unwrap()
        .unwrap();
    assert!(web["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(web["metadata"]["finalizers"], json!(["example.com/keep"]));
}
