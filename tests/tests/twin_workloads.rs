//! The cluster twin runs workloads like a cluster: the scheduler binds pods by taints,
//! affinity and requests (and says why it cannot), kubelets start them, deletion is graceful
//! and finalizers hold it, ReplicaSets/Deployments replace evicted pods and DaemonSets put one
//! pod on each matching Node; cordoned and not-ready Nodes carry their NoSchedule taints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Named `twin` so `cargo test -p oxide-controller-tests twin` selects these tests.
mod twin {
    use oxide_sim::twin::{Twin, TwinConfig};
    use serde_json::{Value, json};

    fn node(twin: &Twin, name: &str, cpu: &str, ready: &str) {
        twin.upsert(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": "workers"}},
            "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": ready}]}}))
        .unwrap();
    }

    fn deployment(twin: &Twin, name: &str, replicas: u32, cpu: &str, tolerations: Value) {
        twin.upsert(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"terminationGracePeriodSeconds": 0, "tolerations": tolerations,
                        "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}}}}))
        .unwrap();
    }

    fn pods(twin: &Twin, app: &str) -> Vec<Value> {
        twin.list("v1", "Pod", Some("default"))
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["app"] == app)
            .collect()
    }

    fn on(pods: &[Value], node: &str) -> usize {
        pods.iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            .count()
    }

    fn cordon(twin: &Twin, name: &str) {
        let mut n = twin.get("v1", "Node", None, name).unwrap();
        n["spec"]["unschedulable"] = json!(true);
        twin.upsert(n).unwrap();
    }

    #[test]
    fn pods_are_scheduled_by_requests_and_started_by_the_kubelet() {
        let twin = Twin::new(TwinConfig::default()).unwrap();
        node(&twin, "w1", "1", "True");
        node(&twin, "w2", "1", "True");
        deployment(&twin, "web", 3, "500m", json!([]));
        let web = pods(&twin, "web");
        assert_eq!(web.len(), 3);
        for p in &web {
            assert_eq!(p["status"]["phase"], "Running", "{p}");
            assert!(p["spec"]["nodeName"].is_string());
        }
        // Least allocated: spread 2 + 1.
        assert_eq!(on(&web, "w1") + on(&web, "w2"), 3);
        assert!(on(&web, "w1") >= 1 && on(&web, "w2") >= 1);
        let d = twin
            .get("apps/v1", "Deployment", Some("default"), "web")
            .unwrap();
        assert_eq!(d["status"]["readyReplicas"], 3);

        // A fourth and fifth replica: one fits, the other has no cpu left anywhere.
        deployment(&twin, "web", 5, "500m", json!([]));
        let web = pods(&twin, "web");
        let pending: Vec<&Value> = web
            .iter()
            .filter(|p| p["status"]["phase"] == "Pending")
            .collect();
        assert_eq!(pending.len(), 1, "{web:#?}");
        let cond = pending[0]["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "PodScheduled")
            .unwrap()
            .clone();
        assert_eq!(cond["status"], "False");
        assert_eq!(cond["reason"], "Unschedulable");
        assert_eq!(
            cond["message"],
            "0/2 nodes are available: 2 Insufficient cpu."
        );
    }

    #[test]
    fn cordon_taints_the_node_and_evicted_pods_come_back_elsewhere() {
        let twin = Twin::new(TwinConfig::default()).unwrap();
        node(&twin, "w1", "2", "True");
        node(&twin, "w2", "2", "True");
        deployment(&twin, "web", 2, "100m", json!([]));
        let on_w1: Vec<Value> = pods(&twin, "web")
            .into_iter()
            .filter(|p| p["spec"]["nodeName"] == "w1")
            .collect();
        assert!(!on_w1.is_empty());
        cordon(&twin, "w1");
        let taints = twin.get("v1", "Node", None, "w1").unwrap()["spec"]["taints"].clone();
        assert_eq!(taints[0]["key"], "node.kubernetes.io/unschedulable");
        assert_eq!(taints[0]["effect"], "NoSchedule");
        for p in &on_w1 {
            // Grace 0: gone at once; the ReplicaSet makes a new pod, which lands on w2.
            assert!(twin.delete(
                "v1",
                "Pod",
                Some("default"),
                p["metadata"]["name"].as_str().unwrap()
            ));
        }
        let web = pods(&twin, "web");
        assert_eq!(web.len(), 2);
        assert_eq!(on(&web, "w2"), 2, "{web:#?}");

        // With nowhere else to go and no toleration, a new pod says why.
        cordon(&twin, "w2");
        deployment(&twin, "other", 1, "100m", json!([]));
        let other = pods(&twin, "other");
        let msg = other[0]["status"]["conditions"][0]["message"].clone();
        assert_eq!(
            msg,
            "0/2 nodes are available: 2 node(s) were unschedulable."
        );

        // A pod that tolerates everything may land on a cordoned node.
        deployment(
            &twin,
            "anywhere",
            1,
            "100m",
            json!([{"operator": "Exists"}]),
        );
        let anywhere = pods(&twin, "anywhere");
        assert_eq!(anywhere[0]["status"]["phase"], "Running");
    }

    #[test]
    fn not_ready_nodes_are_tainted_and_daemonsets_cover_every_matching_node() {
        let twin = Twin::new(TwinConfig::default()).unwrap();
        node(&twin, "w1", "1", "True");
        node(&twin, "w2", "1", "True");
        node(&twin, "w3", "1", "False");
        let mut tainted = twin.get("v1", "Node", None, "w2").unwrap();
        tainted["spec"]["taints"] =
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]);
        twin.upsert(tainted).unwrap();
        let w3 = twin.get("v1", "Node", None, "w3").unwrap();
        assert_eq!(
            w3["spec"]["taints"][0]["key"],
            "node.kubernetes.io/not-ready"
        );
        let daemonset = |name: &str, tolerations: Value| {
            twin.upsert(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                        "spec": {"tolerations": tolerations, "containers": [{"name": "c", "image": "i"}]}}}}))
            .unwrap();
        };
        daemonset("agent", json!([]));
        let agents = pods(&twin, "agent");
        // w1 only: w2 has an untolerated taint, w3 the not-ready NoSchedule taint (the
        // controller's own tolerations cover not-ready NoExecute only).
        assert_eq!(agents.len(), 1, "{agents:#?}");
        assert_eq!(on(&agents, "w1"), 1);
        let ds = twin
            .get("apps/v1", "DaemonSet", Some("default"), "agent")
            .unwrap();
        assert_eq!(ds["status"]["desiredNumberScheduled"], 1);
        assert_eq!(ds["status"]["numberReady"], 1);
        // A CNI-style DaemonSet tolerating everything covers every Node; on w3 (no ready
        // kubelet) its pod is bound but not started.
        daemonset("cni", json!([{"operator": "Exists"}]));
        let cni = pods(&twin, "cni");
        assert_eq!(cni.len(), 3, "{cni:#?}");
        let on_w3 = cni.iter().find(|p| p["spec"]["nodeName"] == "w3").unwrap();
        assert_eq!(on_w3["status"]["phase"], "Pending");
        // Cordoning does not move DaemonSet pods.
        cordon(&twin, "w1");
        assert_eq!(on(&pods(&twin, "agent"), "w1"), 1);
    }

    #[test]
    fn deletion_is_graceful_and_finalizers_hold_it() {
        let twin = Twin::new(TwinConfig::default()).unwrap();
        node(&twin, "w1", "1", "True");
        let pod = |name: &str, grace: i64, finalizers: Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "finalizers": finalizers},
                "spec": {"nodeName": "w1", "terminationGracePeriodSeconds": grace,
                    "containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": "Running"}})
        };
        twin.upsert(pod("held", 0, json!(["example.com/hold"])))
            .unwrap();
        assert!(twin.delete("v1", "Pod", Some("default"), "held"));
        let held = twin.get("v1", "Pod", Some("default"), "held").unwrap();
        assert!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
        // Releasing the finalizer completes the delete.
        let mut released = held.clone();
        released["metadata"]["finalizers"] = json!([]);
        twin.upsert(released).unwrap();
        assert!(twin.get("v1", "Pod", Some("default"), "held").is_none());
    }

    #[tokio::test]
    async fn a_deleted_pod_goes_when_its_grace_period_ends_on_a_ready_node() {
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, DeleteParams};
        let local = Twin::new(TwinConfig::default())
            .unwrap()
            .serve_local()
            .await
            .unwrap();
        let twin = &local.twin;
        node(twin, "w1", "1", "True");
        node(twin, "w2", "1", "Unknown");
        for (name, node) in [("on-ready", "w1"), ("on-lost", "w2")] {
            twin.upsert(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": "Running"}}))
                .unwrap();
        }
        let kc = kube::config::Kubeconfig::from_yaml(&local.admin_kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
        for name in ["on-ready", "on-lost"] {
            pods.delete(name, &DeleteParams::default()).await.unwrap();
            let p = pods.get(name).await.unwrap();
            assert_eq!(p.metadata.deletion_grace_period_seconds, Some(1));
        }
        tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
        assert!(pods.get_opt("on-ready").await.unwrap().is_none());
        // No kubelet confirms on a lost node: Terminating it stays.
        assert!(pods.get_opt("on-lost").await.unwrap().is_some());
    }
}
