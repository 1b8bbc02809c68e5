//! The simulated guests: cloud-init validation and k3s cluster formation, driven through the
//! Oxide API exactly as the product drives a rack.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::time::Duration;

use oxide::prelude::*;
use sim_support::*;

const TOKEN: &str = "server-secret-0123456789";

#[tokio::test]
async fn first_server_creates_the_cluster_and_becomes_a_ready_node() {
    let sim = start().await;
    let c = client(&sim);
    let node = first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;

    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["node-role.kubernetes.io/control-plane"], "true");
    assert_eq!(labels["node-role.kubernetes.io/etcd"], "true");
    assert_eq!(labels["kubernetes.io/hostname"], "c1-cp-aaaaa");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["oxide-controller/pool"], "control-plane");
    assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.33.4+k3s1");
    let ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let addresses = node["status"]["addresses"].as_array().unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == ip.to_string()),
        "InternalIP is the instance's external IP: {addresses:?}"
    );

    // cloud-init prints the host keys after runcmd, once the k3s install step returned.
    let console = wait_console(&c, "c1-cp-aaaaa", "-----END SSH HOST KEY FINGERPRINTS-----").await;
    assert!(console.contains("k3s is up and running"));
    assert!(console.contains("cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----"));
    assert!(console.contains("root@c1-cp-aaaaa (ED25519)"));
    assert!(
        !console.contains(TOKEN),
        "the console never shows the token"
    );
    let info = sim.boot().cluster_info();
    assert_eq!(info["creator"], "c1-cp-aaaaa");
}

#[tokio::test]
async fn a_server_joins_through_the_floating_ip_once_it_is_attached() {
    let sim = start().await;
    let c = client(&sim);
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[fip]).await;

    let join = format!("server: https://{fip}:6443\ntoken: {TOKEN}\n");
    create_instance(&c, "c1-cp-bbbbb", &user_data("server", &join, &[])).await;
    // The product's user-data: `start_k3s` waits for the unit instead of its start job.
    let product =
        oxide_controller::render::cloud_init::render(&oxide_controller::render::cloud_init::NodeUserData {
            hostname: "c1-cp-ccccc".into(),
            role: oxide_controller::render::cloud_init::K3sRole::Server {
                cluster_init: false,
                server_url: Some(format!("https://{fip}:6443")),
                token: TOKEN.into(),
                agent_token: "agent-secret-1".into(),
                tls_san: vec![],
            },
            node_labels: Default::default(),
            node_taints: vec![],
            provider_id: oxide_controller::render::cloud_init::ProviderId::None,
            external_cloud_provider: false,
            kubelet_args: vec![],
            k3s_version: "v1.33.4+k3s1".into(),
            install: oxide_controller::domain::spec::K3sInstall::Script,
            k3s_installer_url: oxide_controller::domain::spec::K3S_INSTALL_URL.into(),
            k3s_start_seconds: 120,
            ssh_user: "ubuntu".into(),
            authorized_keys: vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb1M0Y4hl6YqVnZ8vQm7oFzX3xK1p4tq9w2nqkqzJ0A x".into()],
            data_disk: None,
            tailscale: None,
        })
        .unwrap();
    create_instance(&c, "c1-cp-ccccc", &product).await;
    // Nothing serves the floating IP yet: a joining server exits on it (k3s
    // `shouldBootstrapLoad`: `getCACerts` fails inside token validation) and systemd starts
    // it again every RestartSec.
    for name in ["c1-cp-bbbbb", "c1-cp-ccccc"] {
        let console = wait_console(&c, name, "connection refused").await;
        assert!(console.contains("level=fatal"), "{name}: {console}");
        wait_console(&c, name, "k3s.service: Scheduled restart job").await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in ["c1-cp-bbbbb", "c1-cp-ccccc"] {
        assert_eq!(
            node_ready(&sim, name).await,
            None,
            "cannot join before the IP is attached"
        );
    }
    // install.sh waits on the start job, which failed with k3s's first exit: the setup
    // reports a failure (a controller would replace the VM) although k3s may still join.
    let old = console(&c, "c1-cp-bbbbb").await;
    let failure = oxide_controller::render::cloud_init::setup_failure(&old).unwrap();
    assert_eq!(failure.step, "k3s-install");
    // `start_k3s` is still waiting: no failure.
    let ours = console(&c, "c1-cp-ccccc").await;
    assert!(
        oxide_controller::render::cloud_init::setup_failure(&ours).is_none(),
        "{ours}"
    );

    attach_floating_ip(&c, "c1-apiserver", "c1-cp-aaaaa").await;
    wait_node_status(&sim, "c1-cp-ccccc", "True").await;
    let ours = wait_console(&c, "c1-cp-ccccc", "finished at").await;
    assert!(
        oxide_controller::render::cloud_init::setup_failure(&ours).is_none(),
        "{ours}"
    );
    let node = wait_node_status(&sim, "c1-cp-bbbbb", "True").await;
    assert_eq!(
        node["metadata"]["labels"]["node-role.kubernetes.io/control-plane"],
        "true"
    );
    let joined = sim.boot().cluster_info()["joined"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(joined, 3);
}

#[tokio::test]
async fn an_agent_joins_with_the_agent_token_carrying_labels_taints_and_provider_id() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;

    let provider = "oxide://6e4b3f7c-3f43-4a4e-9d0e-111111111111";
    let agent = format!(
        "server: https://{server_ip}:6443\ntoken: agent-secret-1\nnode-name: worker-one\nnode-label:\n  - oxide-controller/pool=workers\nnode-taint:\n  - dedicated=db:NoSchedule\nkubelet-arg:\n  - provider-id={provider}\n"
    );
    create_instance(&c, "c1-workers-ccccc", &user_data("agent", &agent, &[])).await;
    let node = wait_node_status(&sim, "worker-one", "True").await;

    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["oxide-controller/pool"], "workers");
    assert_eq!(labels["kubernetes.io/hostname"], "worker-one");
    assert!(
        labels
            .get("node-role.kubernetes.io/control-plane")
            .is_none(),
        "agents are workers"
    );
    assert_eq!(node["spec"]["providerID"], provider);
    // The registration taints from the k3s config; the node lifecycle controller's own
    // (`node.kubernetes.io/not-ready` until KWOK reports Ready) come and go beside them.
    let taints: Vec<&serde_json::Value> = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            !t["key"]
                .as_str()
                .unwrap_or("")
                .starts_with("node.kubernetes.io/")
        })
        .collect();
    assert_eq!(
        taints,
        [&serde_json::json!({"key": "dedicated", "value": "db", "effect": "NoSchedule"})]
    );
}

/// A kubelet started with `cloud-provider=external` (the product's `k3s.oxide_ccm`) registers
/// its Node with the `uninitialized` taint; nothing in the simulator initialises Nodes as a
/// cloud controller manager would, so it stays, Ready or not, as with a CCM that never works.
#[tokio::test]
async fn an_external_cloud_provider_leaves_the_node_uninitialized_and_tainted() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let agent = format!(
        "server: https://{server_ip}:6443\ntoken: agent-secret-1\nkubelet-arg:\n  - cloud-provider=external\n"
    );
    create_instance(&c, "c1-workers-ccccc", &user_data("agent", &agent, &[])).await;
    let node = wait_node_status(&sim, "c1-workers-ccccc", "True").await;
    let uninitialized = serde_json::json!({
        "key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"
    });
    assert!(
        node["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.contains(&uninitialized)),
        "{node}"
    );
    // The server, without the flag, has no such taint.
    let server = sim
        .kube()
        .get("v1", "Node", None, "c1-cp-aaaaa")
        .await
        .unwrap();
    assert!(
        !server["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.contains(&uninitialized)),
        "{server}"
    );
}

/// A second VM registering a node name whose Node another VM registered is refused by the
/// node password check (403) and retries; k3s's finalizers keep a deleted Node until a
/// server of the cluster has processed it, and then the second VM's kubelet registers it.
#[tokio::test]
async fn a_node_name_taken_by_another_vm_is_refused_until_its_node_is_gone() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let agent =
        format!("server: https://{server_ip}:6443\ntoken: agent-secret-1\nnode-name: worker-one\n");
    let first = create_instance(&c, "c1-workers-ccccc", &user_data("agent", &agent, &[])).await;
    let node = wait_node_status(&sim, "worker-one", "True").await;
    assert_eq!(node["status"]["nodeInfo"]["systemUUID"], first.to_string());
    assert_eq!(
        node["metadata"]["finalizers"],
        serde_json::json!([
            "wrangler.cattle.io/node",
            "wrangler.cattle.io/managed-etcd-controller"
        ])
    );

    let second = create_instance(&c, "c1-workers-ddddd", &user_data("agent", &agent, &[])).await;
    let console = wait_console(&c, "c1-workers-ddddd", "Node password rejected").await;
    assert!(console.contains("level=info"), "{console}");
    let node = sim
        .kube()
        .get("v1", "Node", None, "worker-one")
        .await
        .unwrap();
    assert_eq!(
        node["status"]["nodeInfo"]["systemUUID"],
        first.to_string(),
        "the Node stays the first VM's"
    );

    // Deleted, the Node goes once the running server's handlers dropped their finalizers
    // (the Secret with it), and the second VM registers the name as its own.
    assert!(sim.kube().delete("v1", "Node", None, "worker-one").await);
    wait_for("worker-one registered by the second VM", || async {
        sim.kube()
            .get("v1", "Node", None, "worker-one")
            .await
            .filter(|n| n["status"]["nodeInfo"]["systemUUID"] == second.to_string())
    })
    .await;
}

/// k3s writes the arguments it runs with on its Node (`k3s.io/node-args`, the config file
/// spliced in as `--key value`, tokens redacted) with their hash.
#[tokio::test]
async fn a_node_carries_the_k3s_arguments_it_runs_with() {
    let sim = start().await;
    let c = client(&sim);
    let node = first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let args: Vec<String> = serde_json::from_str(
        node["metadata"]["annotations"]["k3s.io/node-args"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args[0], "server", "{args:?}");
    let token = args.iter().position(|a| a == "--token").unwrap();
    assert_eq!(args[token + 1], "********");
    assert!(
        !node["metadata"]["annotations"].to_string().contains(TOKEN),
        "the token is redacted"
    );
    assert!(
        args.windows(2).any(|w| w == ["--cluster-init", "true"]),
        "{args:?}"
    );
    let hash = node["metadata"]["annotations"]["k3s.io/node-config-hash"]
        .as_str()
        .unwrap();
    assert_eq!(hash.len(), 56, "base32 of a sha256: {hash}");
}

#[tokio::test]
async fn a_wrong_token_never_joins_and_the_console_says_so_without_printing_it() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;

    let wrong = "not-the-token-987654";
    let server = format!("server: https://{server_ip}:6443\ntoken: {wrong}\n");
    create_instance(&c, "c1-cp-bbbbb", &user_data("server", &server, &[])).await;
    let agent = format!("server: https://{server_ip}:6443\ntoken: {wrong}\n");
    create_instance(&c, "c1-workers-ddddd", &user_data("agent", &agent, &[])).await;

    // A joining server exits on it (and, started by install.sh, its start job fails); an
    // agent logs it at error level and retries for ever.
    for (name, level) in [
        ("c1-cp-bbbbb", "level=fatal"),
        ("c1-workers-ddddd", "level=error"),
    ] {
        let console = wait_console(&c, name, "401 Unauthorized").await;
        assert!(console.contains(level), "{name}: {console}");
        assert!(
            !console.contains(wrong),
            "{name} printed the token it was given"
        );
        assert!(!console.contains(TOKEN), "{name} printed the cluster token");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(node_ready(&sim, "c1-cp-bbbbb").await, None);
    assert_eq!(node_ready(&sim, "c1-workers-ddddd").await, None);
    let server = console(&c, "c1-cp-bbbbb").await;
    let failure = oxide_controller::render::cloud_init::setup_failure(&server).unwrap();
    assert_eq!(
        (failure.step.as_str(), failure.reason.as_str()),
        ("k3s-install", "exit status 1")
    );
    let agent = console(&c, "c1-workers-ddddd").await;
    assert!(
        oxide_controller::render::cloud_init::setup_failure(&agent).is_none()
            && !agent.contains("level=fatal"),
        "the agent's install.sh never returns: {agent}"
    );
}

#[tokio::test]
async fn stopping_a_vm_makes_its_node_not_ready_and_restarting_reregisters_it() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let agent = format!("server: https://{server_ip}:6443\ntoken: {TOKEN}\n");
    create_instance(&c, "c1-workers-eeeee", &user_data("agent", &agent, &[])).await;
    wait_node_status(&sim, "c1-workers-eeeee", "True").await;

    stop_instance(&c, "c1-workers-eeeee").await;
    wait_node_status(&sim, "c1-workers-eeeee", "Unknown").await;

    // The Node stays until someone deletes it; a restarted kubelet registers it again.
    assert!(
        sim.kube()
            .delete("v1", "Node", None, "c1-workers-eeeee")
            .await
    );
    wait_for("instance stopped", || async {
        let state = c
            .instance_view()
            .project(PROJECT)
            .instance("c1-workers-eeeee")
            .send()
            .await
            .ok()?
            .into_inner()
            .run_state;
        (state == oxide::types::InstanceState::Stopped).then_some(())
    })
    .await;
    start_instance(&c, "c1-workers-eeeee").await;
    wait_node_status(&sim, "c1-workers-eeeee", "True").await;
}

#[tokio::test]
async fn the_server_api_listener_closes_when_its_vm_stops() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    tokio::net::TcpStream::connect((ip, 6443))
        .await
        .expect("API answers while running");
    tokio::net::TcpStream::connect((ip, SSH_PORT))
        .await
        .expect("sshd answers while running");

    stop_instance(&c, "c1-cp-aaaaa").await;
    wait_for("listeners closed", || async {
        let api = tokio::net::TcpStream::connect((ip, 6443)).await.is_err();
        let ssh = tokio::net::TcpStream::connect((ip, SSH_PORT))
            .await
            .is_err();
        (api && ssh).then_some(())
    })
    .await;
}

#[tokio::test]
async fn user_data_without_the_cloud_config_header_is_refused_on_the_console() {
    let sim = start().await;
    let c = client(&sim);
    create_instance(
        &c,
        "c1-cp-fffff",
        "#!/bin/sh\ncurl -sfL https://get.k3s.io | sh -\n",
    )
    .await;
    // cloud-init still prints the host keys; k3s never starts.
    let console = wait_console(&c, "c1-cp-fffff", "-----END SSH HOST KEY FINGERPRINTS-----").await;
    assert!(console.contains("does not start with '#cloud-config'"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !console.contains("k3s"),
        "no k3s without a valid cloud-config: {console}"
    );
    assert_eq!(node_ready(&sim, "c1-cp-fffff").await, None);
}

#[tokio::test]
async fn user_data_over_32_kib_never_boots_a_node() {
    let sim = start().await;
    let c = client(&sim);
    let mut ud = user_data("server", &first_server_config(TOKEN, "a", &[]), &[]);
    ud.push_str(&format!("# {}\n", "x".repeat(32 * 1024)));
    let body = oxide::types::InstanceCreate::builder()
        .name("c1-cp-ggggg")
        .description("too big")
        .hostname("c1-cp-ggggg")
        .ncpus(oxide::types::InstanceCpuCount(2))
        .memory(oxide::types::ByteCount(4 << 30))
        .user_data(base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            &ud,
        ));

    match c.instance_create().project(PROJECT).body(body).send().await {
        // The API refuses it up front (a real rack does)...
        Err(oxide::Error::ErrorResponse(resp)) => assert_eq!(resp.status(), 400),
        // ...and were it ever accepted, cloud-init would refuse it on the console.
        Ok(_) => {
            wait_console(&c, "c1-cp-ggggg", "over the 32768-byte limit").await;
        }
        Err(other) => panic!("unexpected error {other}"),
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(node_ready(&sim, "c1-cp-ggggg").await, None);
}

#[tokio::test]
async fn a_second_cluster_init_server_starts_a_second_cluster_with_its_own_api() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let other = first_server_config("another-token-5555", "x", &[]);
    create_instance(&c, "c2-cp-hhhhh", &user_data("server", &other, &[])).await;
    let console = wait_console(&c, "c2-cp-hhhhh", "k3s is up and running").await;
    assert!(!console.contains("another-token-5555"));
    // Its Node lives in its own cluster, not in the first one's.
    assert_eq!(node_ready(&sim, "c2-cp-hhhhh").await, None);
    let info = sim.boot().cluster_info();
    assert_eq!(info["creator"], "c1-cp-aaaaa");
    let clusters = info["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 2, "{info}");
    let second = clusters
        .iter()
        .find(|c| c["creator"] == "c2-cp-hhhhh")
        .expect("second cluster");
    assert_eq!(second["joined"], serde_json::json!(["c2-cp-hhhhh"]));
    assert_eq!(second["primary"], false);
}

#[tokio::test]
async fn never_join_fault_keeps_a_vm_out_of_the_cluster() {
    let sim = start_with(|o| o.faults.never_join = vec!["c1-workers-bad".into()]).await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let agent = format!("server: https://{ip}:6443\ntoken: {TOKEN}\n");
    create_instance(&c, "c1-workers-bad01", &user_data("agent", &agent, &[])).await;
    create_instance(&c, "c1-workers-good1", &user_data("agent", &agent, &[])).await;
    wait_node_status(&sim, "c1-workers-good1", "True").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(node_ready(&sim, "c1-workers-bad01").await, None);
}

/// `disable-cloud-controller` is one of k3s's critical configuration values: a joining server
/// with another value than the cluster's is refused and k3s exits; an agent is not compared.
#[tokio::test]
async fn a_server_with_another_cloud_controller_setting_is_refused() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let join = format!("server: https://{server_ip}:6443\ntoken: {TOKEN}\n");
    let other = format!("{join}disable-cloud-controller: true\n");
    create_instance(&c, "c1-cp-bbbbb", &user_data("server", &other, &[])).await;
    let console = wait_console(&c, "c1-cp-bbbbb", "critical configuration value mismatch").await;
    assert!(console.contains("level=fatal"), "{console}");
    create_instance(&c, "c1-cp-ccccc", &user_data("server", &join, &[])).await;
    wait_node_status(&sim, "c1-cp-ccccc", "True").await;
    assert_eq!(node_ready(&sim, "c1-cp-bbbbb").await, None);
}

/// KWOK leaves the product's pods alone (the harness runs them), so the simulator plays the
/// kubelet's part of a deletion for them even when it runs no Job pods: a deleted, bound pod
/// of ours (the webhook's) goes. Without that, a drain of its node waits for ever (the CCM
/// bootstrap test hung in CI when the scheduler put the webhook on the worker scaled away).
#[tokio::test]
async fn a_deleted_pod_of_ours_goes_even_when_no_job_pods_are_run() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let kube = sim.kube();
    kube.apply(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "webhook-like", "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "oxide-controller"}},
        "spec": {"nodeName": "c1-cp-aaaaa", "containers": [{"name": "scale", "image": "scale"}]}}))
        .await
        .unwrap();
    assert!(
        kube.delete("v1", "Pod", Some("kube-system"), "webhook-like")
            .await
    );
    wait_for("the deleted pod to go", || async {
        kube.get("v1", "Pod", Some("kube-system"), "webhook-like")
            .await
            .is_none()
            .then_some(())
    })
    .await;
}
