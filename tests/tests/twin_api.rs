//! The cluster twin behaves like the Kubernetes apiserver for the real `kube` client, over
//! real HTTPS on loopback: CRUD, selectors, optimistic concurrency, patches, server-side
//! apply, status subresources, Eviction against PodDisruptionBudgets, Leases, discovery.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Named `twin` so `cargo test -p oxide-controller-tests twin` selects these tests.
mod twin {

    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use kube::{Client, Config, Discovery};
    use oxide_sim::twin::{LocalTwin, Twin, TwinConfig};
    use serde_json::json;

    async fn start() -> (LocalTwin, Client) {
        start_with_retries(true).await
    }

    /// `default_retry` is kube's own retry of 429/503/504 (15 attempts, minutes of backoff);
    /// clients that evict must turn it off, because a PDB refusal is a 429.
    async fn start_with_retries(default_retry: bool) -> (LocalTwin, Client) {
        let local = Twin::new(TwinConfig::default())
            .unwrap()
            .serve_local()
            .await
            .unwrap();
        let kc = Kubeconfig::from_yaml(&local.admin_kubeconfig()).unwrap();
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        config.default_retry = default_retry;
        let client = Client::try_from(config).unwrap();
        (local, client)
    }

    fn api_error(err: kube::Error) -> (u16, String, String) {
        match err {
            kube::Error::Api(status) => {
                (status.code, status.reason.clone(), status.message.clone())
            }
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    fn cm(name: &str, labels: serde_json::Value, data: serde_json::Value) -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": data}))
            .unwrap()
    }

    #[tokio::test]
    async fn create_get_list_with_label_and_field_selectors() {
        let (_twin, client) = start().await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        for (name, app, tier) in [
            ("a", "web", "front"),
            ("b", "web", "back"),
            ("c", "db", "back"),
        ] {
            let created = cms
                .create(
                    &PostParams::default(),
                    &cm(name, json!({"app": app, "tier": tier}), json!({})),
                )
                .await
                .unwrap();
            assert!(created.metadata.uid.is_some());
            assert!(created.metadata.resource_version.is_some());
            assert!(created.metadata.creation_timestamp.is_some());
        }
        let got = cms.get("b").await.unwrap();
        assert_eq!(got.metadata.labels.unwrap()["tier"], "back");

        let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
            list.items
                .into_iter()
                .map(|c| c.metadata.name.unwrap())
                .collect()
        };
        assert_eq!(
            names(
                cms.list(&ListParams::default().labels("app=web"))
                    .await
                    .unwrap()
            ),
            ["a", "b"]
        );
        assert_eq!(
            names(
                cms.list(&ListParams::default().labels("app in (web,db),tier!=front"))
                    .await
                    .unwrap()
            ),
            ["b", "c"]
        );
        assert_eq!(
            names(
                cms.list(&ListParams::default().labels("!tier"))
                    .await
                    .unwrap()
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            names(
                cms.list(&ListParams::default().fields("metadata.name=c"))
                    .await
                    .unwrap()
            ),
            ["c"]
        );
        assert_eq!(
            names(
                cms.list(&ListParams::default().fields("metadata.name!=c"))
                    .await
                    .unwrap()
            ),
            ["a", "b"]
        );

        // Pagination with limit + continue visits everything exactly once.
        let mut seen = Vec::new();
        let mut lp = ListParams::default().limit(2);
        loop {
            let page = cms.list(&lp).await.unwrap();
            let token = page.metadata.continue_.clone().filter(|c| !c.is_empty());
            seen.extend(names(page));
            match token {
                Some(t) => lp = lp.continue_token(&t),
                None => break,
            }
        }
        assert_eq!(seen, ["a", "b", "c"]);

        // Missing objects and namespaces.
        let (code, reason, _) = api_error(cms.get("nope").await.unwrap_err());
        assert_eq!((code, reason.as_str()), (404, "NotFound"));
        assert!(cms.get_opt("nope").await.unwrap().is_none());
        let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "no-such-ns");
        let (code, _, message) = api_error(
            elsewhere
                .create(&PostParams::default(), &cm("x", json!({}), json!({})))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (code, message.as_str()),
            (404, "namespaces \"no-such-ns\" not found")
        );
    }

    #[tokio::test]
    async fn all_namespace_lists_and_pod_field_selectors() {
        let (twin, client) = start().await;
        let nss: Api<Namespace> = Api::all(client.clone());
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "apps"}})).unwrap(),
        )
        .await
        .unwrap();
        for (ns, name, node) in [
            ("default", "p1", "w1"),
            ("apps", "p2", "w2"),
            ("apps", "p3", "w1"),
        ] {
            twin.twin
            .upsert(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}}))
            .unwrap();
        }
        let pods: Api<Pod> = Api::all(client.clone());
        let on_w1 = pods
            .list(&ListParams::default().fields("spec.nodeName=w1,status.phase=Running"))
            .await
            .unwrap();
        let mut names: Vec<String> = on_w1
            .items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["p1", "p3"]);
        let in_apps: Api<Pod> = Api::namespaced(client.clone(), "apps");
        assert_eq!(
            in_apps
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            2
        );
        assert!(twin.twin.counters().contains_key("GET /api/v1/pods"));
        assert!(
            twin.twin
                .counters()
                .contains_key("GET /api/v1/namespaces/{namespace}/pods")
        );
    }

    #[tokio::test]
    async fn stale_replace_conflicts_and_double_create_already_exists() {
        let (_twin, client) = start().await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "kube-system");
        let first = cms
            .create(
                &PostParams::default(),
                &cm("state", json!({}), json!({"n": "0"})),
            )
            .await
            .unwrap();
        let (code, reason, _) = api_error(
            cms.create(&PostParams::default(), &cm("state", json!({}), json!({})))
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

        let mut update = first.clone();
        update.data = Some([("n".to_string(), "1".to_string())].into());
        let second = cms
            .replace("state", &PostParams::default(), &update)
            .await
            .unwrap();
        assert_ne!(
            second.metadata.resource_version,
            first.metadata.resource_version
        );

        // Replaying the replace with the old resourceVersion is a conflict.
        let (code, reason, message) = api_error(
            cms.replace("state", &PostParams::default(), &update)
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (409, "Conflict"));
        assert!(message.contains("the object has been modified; please apply your changes to the latest version and try again"));

        // Without a resourceVersion the replace is unconditional.
        let mut blind = update.clone();
        blind.metadata.resource_version = None;
        blind.data = Some([("n".to_string(), "2".to_string())].into());
        assert_eq!(
            cms.replace("state", &PostParams::default(), &blind)
                .await
                .unwrap()
                .data
                .unwrap()["n"],
            "2"
        );

        // Invalid names are rejected like the apiserver does.
        let (code, reason, _) = api_error(
            cms.create(
                &PostParams::default(),
                &cm("Bad_Name", json!({}), json!({})),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (422, "Invalid"));
    }

    #[tokio::test]
    async fn server_side_apply_creates_updates_and_removes_fields() {
        let (_twin, client) = start().await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "kube-system");
        let pp = PatchParams::apply("oxide-controller");
        let applied = |data: serde_json::Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied", "labels": {"app.kubernetes.io/name": "oxide-controller"}}, "data": data});
        let created = cms
            .patch(
                "applied",
                &pp,
                &Patch::Apply(applied(json!({"a": "1", "b": "2"}))),
            )
            .await
            .unwrap();
        assert_eq!(created.data.clone().unwrap().len(), 2);
        let managed = created.metadata.managed_fields.clone().unwrap();
        assert_eq!(managed[0].manager.as_deref(), Some("oxide-controller"));
        assert_eq!(managed[0].operation.as_deref(), Some("Apply"));

        // Someone else's field survives; a field this manager stops applying is removed.
        cms.patch(
            "applied",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"other": "x"}})),
        )
        .await
        .unwrap();
        let updated = cms
            .patch("applied", &pp, &Patch::Apply(applied(json!({"a": "10"}))))
            .await
            .unwrap();
        let data = updated.data.unwrap();
        assert_eq!(data.get("a").map(String::as_str), Some("10"));
        assert_eq!(data.get("b"), None);
        assert_eq!(data.get("other").map(String::as_str), Some("x"));

        // Re-applying the same configuration changes nothing, not even resourceVersion.
        let again = cms
            .patch("applied", &pp, &Patch::Apply(applied(json!({"a": "10"}))))
            .await
            .unwrap();
        assert_eq!(
            again.metadata.resource_version,
            updated.metadata.resource_version
        );

        // Apply without a field manager is a bad request.
        let no_manager = PatchParams {
            field_manager: None,
            ..PatchParams::default()
        };
        let (code, _, _) = api_error(
            cms.patch("applied", &no_manager, &Patch::Apply(applied(json!({}))))
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 400);
    }

    #[tokio::test]
    async fn merge_json_and_status_patches() {
        let (twin, client) = start().await;
        twin.twin
            .upsert(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1"}, "spec": {}}),
            )
            .unwrap();
        twin.twin.set_node_ready("w1", true);
        let nodes: Api<Node> = Api::all(client.clone());
        let cordoned = nodes
            .patch(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await
            .unwrap();
        assert_eq!(cordoned.spec.unwrap().unschedulable, Some(true));
        // The main resource cannot change status...
        let same = nodes
            .patch(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": []}})),
            )
            .await
            .unwrap();
        assert_eq!(same.status.unwrap().conditions.unwrap().len(), 1);
        // ...the status subresource can, and nothing else.
        let patched = nodes
            .patch_status(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"capacity": {"cpu": "4"}}, "spec": {"unschedulable": false}}),
                ),
            )
            .await
            .unwrap();
        assert_eq!(patched.status.unwrap().capacity.unwrap()["cpu"].0, "4");
        assert_eq!(patched.spec.unwrap().unschedulable, Some(true));

        // A merge patch that carries a stale resourceVersion conflicts.
        let (code, reason, _) = api_error(
            nodes
                .patch(
                    "w1",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}}),
                    ),
                )
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (409, "Conflict"));

        let secrets: Api<Secret> = Api::namespaced(client, "kube-system");
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "oxide-controller"}, "stringData": {"oxide-token": "sekret"}})).unwrap();
        let stored = secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        assert_eq!(stored.data.unwrap()["oxide-token"].0, b"sekret");
        assert!(stored.string_data.is_none());
    }

    async fn healthy_pod(client: &Client, name: &str) {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": "w1", "containers": [{"name": "c", "image": "i"}]}}))
            .unwrap();
        let created = pods.create(&PostParams::default(), &pod).await.unwrap();
        assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn eviction_respects_pod_disruption_budgets() {
        let (twin, client) = start_with_retries(false).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        for name in ["web-1", "web-2"] {
            healthy_pod(&client, name).await;
        }
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
        let pdb: PodDisruptionBudget =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})).unwrap();
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();

        let refused = pods
            .evict("web-1", &EvictParams::default())
            .await
            .unwrap_err();
        let kube::Error::Api(status) = &refused else {
            panic!("expected an API error, got {refused:?}")
        };
        let cause = &status.details.as_ref().unwrap().causes[0];
        assert_eq!(
            (cause.reason.as_str(), cause.message.as_str()),
            (
                "DisruptionBudget",
                "The disruption budget web needs 2 healthy pods and has 2 currently"
            )
        );
        let (code, reason, message) = api_error(refused);
        assert_eq!((code, reason.as_str()), (429, "TooManyRequests"));
        assert_eq!(
            message,
            "Cannot evict pod as it would violate the pod's disruption budget."
        );
        assert!(pods.get_opt("web-1").await.unwrap().is_some());

        // With a third healthy pod the budget allows one disruption.
        healthy_pod(&client, "web-3").await;
        let status = pods.evict("web-1", &EvictParams::default()).await.unwrap();
        assert_eq!(status.code, 201);
        // Gracefully: Terminating, no longer healthy for the budget.
        let gone = pods.get_opt("web-1").await.unwrap().unwrap();
        assert!(gone.metadata.deletion_timestamp.is_some());
        // And now the budget is exhausted again.
        let (code, _, _) = api_error(
            pods.evict("web-2", &EvictParams::default())
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 429);

        // Pods not covered by any budget evict freely; missing pods are 404.
        let lonely: Pod = serde_json::from_value(json!({"metadata": {"name": "lonely"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})).unwrap();
        pods.create(&PostParams::default(), &lonely).await.unwrap();
        pods.evict("lonely", &EvictParams::default()).await.unwrap();
        let (code, _, _) = api_error(
            pods.evict("lonely", &EvictParams::default())
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 404);

        // Deleting the Node takes its pods with it.
        twin.twin
            .upsert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1"}}))
            .unwrap();
        let nodes: Api<Node> = Api::all(client.clone());
        nodes.delete("w1", &DeleteParams::default()).await.unwrap();
        assert!(
            pods.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }

    #[tokio::test]
    async fn lease_create_and_replace() {
        let (_twin, client) = start().await;
        let leases: Api<Lease> = Api::namespaced(client, "kube-system");
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "oxide-controller"},
        "spec": {"holderIdentity": "run-1", "leaseDurationSeconds": 60, "acquireTime": "2026-01-01T00:00:00.000000Z"}}))
    .unwrap();
        let held = leases.create(&PostParams::default(), &lease).await.unwrap();
        let mut renewed = held.clone();
        renewed.spec.as_mut().unwrap().holder_identity = Some("run-2".into());
        let replaced = leases
            .replace("oxide-controller", &PostParams::default(), &renewed)
            .await
            .unwrap();
        assert_eq!(
            replaced.spec.unwrap().holder_identity.as_deref(),
            Some("run-2")
        );
        assert_ne!(
            replaced.metadata.resource_version,
            held.metadata.resource_version
        );
        // A second contender working from the stale copy loses.
        let mut stale = held.clone();
        stale.spec.as_mut().unwrap().holder_identity = Some("run-3".into());
        let (code, _, _) = api_error(
            leases
                .replace("oxide-controller", &PostParams::default(), &stale)
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 409);
        let deleted = leases
            .delete("oxide-controller", &DeleteParams::default())
            .await
            .unwrap();
        assert!(deleted.is_right());
    }

    #[tokio::test]
    async fn discovery_version_and_watch() {
        let (twin, client) = start().await;
        let discovery = Discovery::new(client.clone()).run().await.unwrap();
        let (lease, caps) = discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .find(|(ar, _)| ar.kind == "Lease")
            .unwrap();
        assert_eq!(lease.plural, "leases");
        assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
        let aggregated = Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap();
        assert!(aggregated.groups().any(|g| g.name() == "batch"));
        assert!(
            aggregated
                .groups()
                .flat_map(|g| g.recommended_resources())
                .any(|(ar, _)| ar.kind == "Pod")
        );

        let version = client.apiserver_version().await.unwrap();
        assert_eq!(version.git_version, "v1.33.4+k3s1");
        assert_eq!(
            (version.major.as_str(), version.minor.as_str()),
            ("1", "33")
        );

        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        let err = cms
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .err()
            .unwrap();
        assert_eq!(api_error(err).0, 405);
        assert!(
            twin.twin
                .counters()
                .keys()
                .any(|k| k.starts_with("GET /apis"))
        );
    }

    #[tokio::test]
    async fn field_selectors_are_limited_per_kind_and_continue_tokens_expire() {
        let (_twin, client) = start().await;
        let pods: Api<Pod> = Api::all(client.clone());
        pods.list(&ListParams::default().fields("spec.nodeName=w1,status.phase=Running"))
            .await
            .unwrap();
        let (code, reason, message) = api_error(
            pods.list(&ListParams::default().fields("spec.containers=x"))
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (400, "BadRequest"));
        assert_eq!(message, "field label not supported: spec.containers");
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let (code, _, message) = api_error(
            cms.list(&ListParams::default().fields("data.k=v"))
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 400);
        assert_eq!(
            message,
            "\"data.k\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
        cms.list(&ListParams::default().fields("metadata.name=x"))
            .await
            .unwrap();

        // A continue token from more than five minutes ago: 410 Expired.
        use base64::Engine as _;
        let old = chrono::Utc::now().timestamp() - 301;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&("default", "a", old)).unwrap());
        let (code, reason, _) = api_error(
            cms.list(&ListParams::default().limit(1).continue_token(&token))
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (410, "Expired"));
    }

    #[tokio::test]
    async fn server_side_apply_conflicts_with_other_managers_unless_forced() {
        let (_twin, client) = start().await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let doc = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": {"k": v}});
        cms.patch(
            "shared",
            &PatchParams::apply("helm"),
            &Patch::Apply(doc("1")),
        )
        .await
        .unwrap();
        // Same value: shared ownership, no conflict.
        cms.patch(
            "shared",
            &PatchParams::apply("ours"),
            &Patch::Apply(doc("1")),
        )
        .await
        .unwrap();
        cms.patch(
            "shared",
            &PatchParams::apply("helm"),
            &Patch::Apply(doc("1")),
        )
        .await
        .unwrap();
        // A different value owned by someone else: 409 naming the manager and field.
        let (code, reason, message) = api_error(
            cms.patch(
                "shared",
                &PatchParams::apply("ours"),
                &Patch::Apply(doc("2")),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (409, "Conflict"));
        assert_eq!(
            message,
            "Apply failed with 1 conflict: conflict with \"helm\" using v1: .data.k"
        );
        // Forced: it takes the field.
        let forced = cms
            .patch(
                "shared",
                &PatchParams::apply("ours").force(),
                &Patch::Apply(doc("2")),
            )
            .await
            .unwrap();
        assert_eq!(forced.data.unwrap()["k"], "2");
    }

    #[tokio::test]
    async fn openapi_v3_says_writes_validate_on_the_server() {
        let (_twin, client) = start().await;
        let get = |path: &str| {
            let client = client.clone();
            let path = path.to_owned();
            async move {
                let req = http::Request::get(path).body(Vec::new()).unwrap();
                client.request::<serde_json::Value>(req).await.unwrap()
            }
        };
        let root = get("/openapi/v3").await;
        let url = root["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(url.starts_with("/openapi/v3/api/v1?hash="), "{url}");
        assert!(root["paths"]["apis/apps/v1"].is_object());
        let doc = get(&url).await;
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "", "version": "v1", "kind": "ConfigMap"})
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        let v2 = get("/openapi/v2").await;
        assert_eq!(v2["swagger"], "2.0");
    }
}
