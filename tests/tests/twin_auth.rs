//! The cluster twin authenticates like k3s (admin client certificate from a k3s-shaped
//! kubeconfig, ServiceAccount bearer tokens) and authorizes with RBAC from stored objects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Named `twin` so `cargo test -p oxide-controller-tests twin` selects these tests.
mod twin {

    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube::api::{Api, ListParams, PostParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use kube::{Client, Config};
    use oxide_sim::twin::{LocalTwin, Twin, TwinConfig};
    use serde_json::json;

    async fn client_from(yaml: &str) -> Client {
        let kc = Kubeconfig::from_yaml(yaml).unwrap();
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        Client::try_from(config).unwrap()
    }

    async fn start() -> LocalTwin {
        Twin::new(TwinConfig::default())
            .unwrap()
            .serve_local()
            .await
            .unwrap()
    }

    fn code(err: kube::Error) -> (u16, String, String) {
        match err {
            kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn k3s_shaped_admin_kubeconfig_loads_and_verifies_tls() {
        let local = start().await;
        let yaml = local.admin_kubeconfig();
        let kc = Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("default"));
        assert_eq!(kc.clusters[0].name, "default");
        assert_eq!(kc.auth_infos[0].name, "default");
        let auth = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(auth.client_certificate_data.is_some() && auth.client_key_data.is_some());
        assert!(
            kc.clusters[0]
                .cluster
                .as_ref()
                .unwrap()
                .certificate_authority_data
                .is_some()
        );

        let client = client_from(&yaml).await;
        let nodes: Api<Node> = Api::all(client.clone());
        assert!(
            nodes
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        let namespaces = client.list_core_api_versions().await.unwrap();
        assert_eq!(namespaces.versions, ["v1"]);

        // A kubeconfig trusting a different CA must fail the TLS handshake.
        let other = Twin::new(TwinConfig::default()).unwrap();
        let foreign = other.admin_kubeconfig(&local.url);
        let err = Api::<Node>::all(client_from(&foreign).await)
            .list(&ListParams::default())
            .await
            .unwrap_err();
        assert!(
            !matches!(err, kube::Error::Api(_)),
            "TLS with the wrong CA must not reach the API: {err:?}"
        );
    }

    #[tokio::test]
    async fn requests_without_valid_credentials_are_unauthorized() {
        let local = start().await;
        let sa = local
            .twin
            .service_account_kubeconfig(&local.url, "kube-system", "ctl");
        let token_line = sa
            .lines()
            .find(|l| l.trim_start().starts_with("token:"))
            .unwrap();

        let bad_token = sa.replace(token_line, "    token: not-a-real-token");
        let (status, reason, _) = code(
            Api::<Node>::all(client_from(&bad_token).await)
                .list(&ListParams::default())
                .await
                .unwrap_err(),
        );
        assert_eq!((status, reason.as_str()), (401, "Unauthorized"));

        let anonymous = sa.replace(token_line, "    username: nobody");
        let (status, _, _) = code(
            Api::<Node>::all(client_from(&anonymous).await)
                .list(&ListParams::default())
                .await
                .unwrap_err(),
        );
        assert_eq!(status, 401);

        // Health needs no credentials; version does.
        let client = client_from(&anonymous).await;
        let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
        assert_eq!(client.request_text(req).await.unwrap(), "ok");
        assert_eq!(code(client.apiserver_version().await.unwrap_err()).0, 401);
    }

    #[tokio::test]
    async fn service_account_rbac_with_resource_names() {
        let local = start().await;
        let admin = client_from(&local.admin_kubeconfig()).await;
        let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
        for name in ["oxide-controller", "other"] {
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}}))
                    .unwrap();
            cms.create(&PostParams::default(), &cm).await.unwrap();
        }
        let roles: Api<k8s_openapi::api::rbac::v1::Role> =
            Api::namespaced(admin.clone(), "kube-system");
        roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "oxide-controller"}, "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["oxide-controller"], "verbs": ["get", "update"]},
            ]}))
            .unwrap(),
        )
        .await
        .unwrap();
        let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
            Api::namespaced(admin.clone(), "kube-system");
        bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "oxide-controller"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "oxide-controller"},
                "subjects": [{"kind": "ServiceAccount", "name": "oxide-controller", "namespace": "kube-system"}]}))
            .unwrap(),
        )
        .await
        .unwrap();

        let sa = client_from(&local.twin.service_account_kubeconfig(
            &local.url,
            "kube-system",
            "oxide-controller",
        ))
        .await;
        let sa_cms: Api<ConfigMap> = Api::namespaced(sa.clone(), "kube-system");
        let mine = sa_cms.get("oxide-controller").await.unwrap();
        sa_cms
            .replace("oxide-controller", &PostParams::default(), &mine)
            .await
            .unwrap();

        let (status, reason, message) = code(sa_cms.get("other").await.unwrap_err());
        assert_eq!((status, reason.as_str()), (403, "Forbidden"));
        assert_eq!(
            message,
            "configmaps \"other\" is forbidden: User \"system:serviceaccount:kube-system:oxide-controller\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"kube-system\""
        );
        // resourceNames cannot grant list.
        assert_eq!(
            code(sa_cms.list(&ListParams::default()).await.unwrap_err()).0,
            403
        );
        // Nor anything cluster-scoped.
        let (status, _, message) = code(
            Api::<Node>::all(sa.clone())
                .list(&ListParams::default())
                .await
                .unwrap_err(),
        );
        assert_eq!(status, 403);
        assert!(message.ends_with("at the cluster scope"), "{message}");
        // Discovery is open to any authenticated user.
        sa.list_core_api_versions().await.unwrap();
        // A different ServiceAccount gets nothing.
        let stranger = client_from(&local.twin.service_account_kubeconfig(
            &local.url,
            "kube-system",
            "stranger",
        ))
        .await;
        assert_eq!(
            code(
                Api::<ConfigMap>::namespaced(stranger, "kube-system")
                    .get("oxide-controller")
                    .await
                    .unwrap_err()
            )
            .0,
            403
        );
    }
}
