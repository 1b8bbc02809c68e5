//! The real control plane the tests run on: it starts, reports the k3s version the product
//! installs, refuses unknown fields under strict validation, KWOK keeps labelled Nodes Ready
//! while the real node lifecycle controller marks the others Unknown, and KWOK plays pods as
//! its "general" stages do: they take time to start and to go, readiness gates are left to
//! their owners, and a halted VM's Node and its pods are let go.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oxide_sim::control_plane::{
    ControlPlane, ControlPlaneOptions, KUBERNETES_VERSION, KWOK_LABEL, KWOK_LABEL_VALUE,
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
            "metadata": {"name": name, "labels": {}},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                       "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"}}});
        if kwok {
            n["metadata"]["labels"][KWOK_LABEL] = json!(KWOK_LABEL_VALUE);
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

/// Issue 46 item 2, as k3s runs it: kube-controller-manager signs `kube-apiserver-client`
/// requests with the client CA (k3s `controllerManager`'s `cluster-signing-*` flags), for the
/// year it signs by default; the apiserver's default `CertificateSubjectRestriction` refuses
/// such a request naming `system:masters` (k3s.yaml's group); the signed certificate is
/// accepted, as the user it names, through a server's front proxy.
#[tokio::test]
async fn the_controller_manager_signs_api_client_requests_but_never_for_system_masters() {
    use oxide_controller::adapters::client_csr::{self, ClientCsrError};
    use oxide_controller::domain::operator_credential as op;
    use oxide_sim::control_plane::proxy::FrontProxy;
    use oxide_sim::oxide::faults::Faults;

    let cp = ControlPlane::start(ControlPlaneOptions {
        kwok: false,
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    let proxy = FrontProxy::new(&cp, Faults::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let tls = proxy.tls_config(&["127.0.0.1".into()]).unwrap();
    let task = tokio::spawn(std::sync::Arc::clone(&proxy).serve(listener, tls));
    let k3s_yaml = cp
        .user_kubeconfig(&url, "system:admin", &["system:masters"])
        .unwrap();
    let admin = client_for(&k3s_yaml).await;
    let wait = Duration::from_secs(30);

    // k3s.yaml's own subject: refused at admission, nothing created.
    let masters = client_csr::new_request("system:admin", Some("system:masters")).unwrap();
    let err = client_csr::sign(&admin, "masters", &masters, wait)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientCsrError::Api { code: Some(403), message, .. }
            if message.contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed")),
        "{err}"
    );

    // The operator's: signed for 365 days, the request deleted afterwards.
    let user = op::operator_user("demo");
    client_csr::ensure_operator_binding(&admin, &user)
        .await
        .unwrap();
    let req = client_csr::new_request(&user, None).unwrap();
    let started = chrono::Utc::now();
    let cert = client_csr::sign(&admin, "operator", &req, wait)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tail("kube-controller-manager")));
    let end = oxide_controller::adapters::kubeconfig::certificate_end(&cert).unwrap();
    // NotAfter = NotBefore + TTL, NotBefore backdated 5 minutes (`signer.sign`'s `Backdate`).
    let year = chrono::Duration::seconds(i64::from(op::EXPIRATION_SECONDS));
    assert!(
        end >= started + year - chrono::Duration::minutes(6) && end <= chrono::Utc::now() + year,
        "NotAfter {end}"
    );
    let csrs: kube::Api<k8s_openapi::api::certificates::v1::CertificateSigningRequest> =
        kube::Api::all(admin.clone());
    assert!(csrs.get_opt("operator").await.unwrap().is_none());

    // The new certificate and key work, as that user, with cluster-admin's rights.
    let renewed = oxide_controller::adapters::kubeconfig::with_client_credential(
        &k3s_yaml,
        "default",
        &cert,
        &req.key_pem,
    )
    .unwrap();
    let operator = client_for(&renewed).await;
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let post = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&review).unwrap())
        .unwrap();
    let me: Value = operator.request(post).await.unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], user.as_str());
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(operator, "kube-system")
        .list(&Default::default())
        .await
        .unwrap();
    task.abort();
}

/// A Node KWOK plays.
fn kwok_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {KWOK_LABEL: KWOK_LABEL_VALUE}}})
}

/// A pod bound to `node` with `meta` merged into its metadata.
fn bound_pod(name: &str, node: &str, meta: Value) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}});
    if let (Some(m), Some(extra)) = (pod["metadata"].as_object_mut(), meta.as_object()) {
        m.extend(extra.clone());
    }
    pod
}

/// KWOK's own per-pod overrides (`<stage>.stage.kwok.x-k8s.io/{delay,jitter-delay}`,
/// kwok@v0.7.0 kustomize/stage/pod/general/pod-create.yaml:18-24, pod-ready.yaml:22-28) that
/// make a pod start at once: for tests where the start's duration is not the point.
fn starts_at_once() -> Value {
    json!({
        "pod-create.stage.kwok.x-k8s.io/delay": "0s",
        "pod-create.stage.kwok.x-k8s.io/jitter-delay": "0s",
        "pod-ready.stage.kwok.x-k8s.io/delay": "0s",
        "pod-ready.stage.kwok.x-k8s.io/jitter-delay": "0s",
    })
}

fn condition<'a>(pod: &'a Value, kind: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn time_of(v: &Value) -> chrono::DateTime<chrono::Utc> {
    v.as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("not a timestamp: {v}"))
        .to_utc()
}

async fn pod(cp: &ControlPlane, name: &str) -> Option<Value> {
    cp.get("v1", "Pod", Some("default"), name).await.unwrap()
}

async fn delete_pod(cp: &ControlPlane, name: &str, grace: u32) {
    let dp = kube::api::DeleteParams::default().grace_period(grace);
    assert!(
        cp.delete_with("v1", "Pod", Some("default"), name, &dp)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn kwok_runs_workload_pods_but_leaves_ours_to_the_harness() {
    let cp = ControlPlane::start(ControlPlaneOptions {
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    cp.apply(kwok_node("w1")).await.unwrap();
    let with = |labels: Value| {
        json!({"labels": labels, "finalizers": ["example.com/keep"],
        "annotations": starts_at_once()})
    };
    // Ours first: when the workload pod created after it runs, KWOK has had its turn at ours.
    cp.apply(bound_pod(
        "ours",
        "w1",
        with(json!({"app.kubernetes.io/name": "oxide-controller"})),
    ))
    .await
    .unwrap();
    cp.apply(bound_pod("web", "w1", with(json!({"app": "web"}))))
        .await
        .unwrap();
    let phase = |name: &'static str| {
        let cp = &cp;
        async move {
            pod(cp, name)
                .await
                .and_then(|p| p["status"]["phase"].as_str().map(str::to_string))
        }
    };
    cp.wait_for("KWOK to run the workload pod", PATIENCE, || async {
        (phase("web").await.as_deref() == Some("Running")).then_some(())
    })
    .await
    .unwrap();
    let ours = pod(&cp, "ours").await.unwrap();
    assert_eq!(
        ours["status"]["phase"],
        "Pending",
        "{}",
        cp.log_tail("kwok")
    );
    assert!(ours["status"]["podIP"].is_null(), "{ours}");

    // Deleted with a grace period: the pod is Terminating until KWOK, as a kubelet whose
    // containers stopped, confirms with a grace-0 delete (KWOK's pod-delete: 1 s at the
    // earliest, at the deletionTimestamp at the latest, kwok@v0.7.0
    // kustomize/stage/pod/general/pod-delete.yaml:18-25). Its finalizer then keeps the object
    // until its owner removes it, as with a kubelet.
    let asked = chrono::Utc::now();
    delete_pod(&cp, "web", 5).await;
    let confirmed = cp
        .wait_for("KWOK to confirm the termination", PATIENCE, || async {
            let web = pod(&cp, "web").await?;
            (web["metadata"]["deletionGracePeriodSeconds"] == 0).then_some(chrono::Utc::now())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tail("kwok")));
    assert!(
        confirmed - asked >= chrono::Duration::seconds(1),
        "confirmed {} after the delete: no grace at all",
        confirmed - asked
    );
    let web = pod(&cp, "web").await.unwrap();
    assert!(web["metadata"]["deletionTimestamp"].is_string(), "{web}");
    assert_eq!(web["metadata"]["finalizers"], json!(["example.com/keep"]));
}

#[tokio::test]
async fn kwok_starts_pods_in_steps_and_leaves_readiness_gates_to_their_owner() {
    let cp = ControlPlane::start(ControlPlaneOptions {
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    cp.apply(kwok_node("w1")).await.unwrap();
    cp.apply(bound_pod("web", "w1", json!({}))).await.unwrap();
    let gate = "example.com/load-balancer";
    let mut gated = bound_pod("gated", "w1", json!({}));
    gated["spec"]["readinessGates"] = json!([{"conditionType": gate}]);
    cp.apply(gated).await.unwrap();

    // KWOK's general stages: Pending with ContainerCreating (and a pod IP) 1 s + up to 5 s
    // after the pod appears, Running and Ready 1 s + up to 5 s after that
    // (kwok@v0.7.0 kustomize/stage/pod/general/pod-create.yaml:18-24,
    // pod-ready.yaml:22-28). The apiserver keeps whole seconds, so a step of at least 1 s
    // shows as at least 1 s between the stored times.
    let web = cp
        .wait_for("KWOK to make web Ready", PATIENCE, || async {
            let p = pod(&cp, "web").await?;
            (condition(&p, "Ready")?["status"] == "True").then_some(p)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tail("kwok")));
    let created = time_of(&web["metadata"]["creationTimestamp"]);
    let initialized = time_of(&condition(&web, "Initialized").unwrap()["lastTransitionTime"]);
    let ready = time_of(&condition(&web, "Ready").unwrap()["lastTransitionTime"]);
    assert!(
        initialized - created >= chrono::Duration::seconds(1),
        "started at once: {web}"
    );
    assert!(
        ready - initialized >= chrono::Duration::seconds(1),
        "Ready with no time to start: {web}"
    );
    assert_eq!(web["status"]["phase"], "Running");

    // A readiness gate is its controller's: KWOK runs the containers, but the pod stays
    // unready, with the kubelet's reason and message (kubernetes pkg/kubelet/status/
    // generate.go GeneratePodReadyCondition), until the gate's condition is True.
    let p = cp
        .wait_for(
            "KWOK to run the gated pod's containers",
            PATIENCE,
            || async {
                let p = pod(&cp, "gated").await?;
                (condition(&p, "ContainersReady")?["status"] == "True").then_some(p)
            },
        )
        .await
        .unwrap();
    assert_eq!(p["status"]["phase"], "Running", "{p}");
    assert!(condition(&p, gate).is_none(), "a kubelet set the gate: {p}");
    let r = condition(&p, "Ready").unwrap();
    assert_eq!(r["status"], "False", "{p}");
    assert_eq!(r["reason"], "ReadinessGatesNotReady", "{p}");
    assert_eq!(
        r["message"],
        format!("corresponding condition of pod readiness gate \"{gate}\" does not exist.")
    );
    // Its owner reports the gate False, then True.
    let set_gate = |status: &'static str| {
        cp.apply_status(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "gated", "namespace": "default"},
            "status": {"conditions": [{"type": gate, "status": status}]}}))
    };
    set_gate("False").await.unwrap();
    let message = format!("the status of pod readiness gate \"{gate}\" is not \"True\", but False");
    cp.wait_for("the kubelet to name the False gate", PATIENCE, || async {
        let p = pod(&cp, "gated").await?;
        (condition(&p, "Ready")?["message"] == message.as_str()).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tail("kwok")));
    set_gate("True").await.unwrap();
    cp.wait_for("the gated pod to become Ready", PATIENCE, || async {
        let p = pod(&cp, "gated").await?;
        (condition(&p, "Ready")?["status"] == "True").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tail("kwok")));
}

#[tokio::test]
async fn a_halted_vms_node_is_let_go_its_pods_neither_start_nor_go() {
    let cp = ControlPlane::start(ControlPlaneOptions {
        scheduler: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap();
    for n in ["alive", "dead"] {
        cp.apply(kwok_node(n)).await.unwrap();
    }
    let fast = json!({"annotations": starts_at_once()});
    for (name, node) in [("old-alive", "alive"), ("old-dead", "dead")] {
        cp.apply(bound_pod(name, node, fast.clone())).await.unwrap();
    }
    for name in ["old-alive", "old-dead"] {
        cp.wait_for("KWOK to run the pods", PATIENCE, || async {
            (pod(&cp, name).await?["status"]["phase"] == "Running").then_some(())
        })
        .await
        .unwrap();
    }

    // The VM behind `dead` stops: the simulator takes its kubelet away.
    oxide_sim::guest::cluster_api::silence_real_node(&cp, "dead")
        .await
        .unwrap();
    // A pod bound there afterwards is never started, and a deletion there is never confirmed
    // (a real cluster keeps such a pod Terminating until the Node goes and PodGC collects it).
    // Each has a twin on the live Node, made or deleted after it: once the twin is done, KWOK
    // has had its turn at the pod on `dead`.
    cp.apply(bound_pod("new-dead", "dead", fast.clone()))
        .await
        .unwrap();
    cp.apply(bound_pod("new-alive", "alive", fast.clone()))
        .await
        .unwrap();
    delete_pod(&cp, "old-dead", 1).await;
    delete_pod(&cp, "old-alive", 1).await;
    cp.wait_for("KWOK to play the live Node's pods", PATIENCE, || async {
        let started = pod(&cp, "new-alive").await?["status"]["phase"] == "Running";
        let gone = pod(&cp, "old-alive").await.is_none();
        (started && gone).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tail("kwok")));
    let new_dead = pod(&cp, "new-dead").await.unwrap();
    assert_eq!(new_dead["status"]["phase"], "Pending", "{new_dead}");
    assert!(new_dead["status"]["podIP"].is_null(), "{new_dead}");
    let old_dead = pod(&cp, "old-dead").await.unwrap_or_else(|| {
        panic!(
            "the halted Node's pod was confirmed gone\n{}",
            cp.log_tail("kwok")
        )
    });
    assert!(old_dead["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(old_dead["metadata"]["deletionGracePeriodSeconds"], 1);
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
