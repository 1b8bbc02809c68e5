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
    // k3s's node IP is the address of the default route's interface: the NIC's private
    // address in 172.30.0.0/22, as the rack reports it (the external addresses are NAT).
    let ip = private_ip(&c, "c1-cp-aaaaa").await;
    assert!(
        ip.to_string().starts_with("172.30."),
        "the NIC's address is the subnet's: {ip}"
    );
    let addresses = node["status"]["addresses"].as_array().unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == ip.to_string()),
        "InternalIP is the NIC's private address {ip}: {addresses:?}"
    );
    assert_eq!(
        node["metadata"]["annotations"]["k3s.io/internal-ip"],
        ip.to_string()
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
            k3s_installer_sha256: None,
            k3s_binary: None,
            k3s_start_seconds: 120,
            ssh_user: "ubuntu".into(),
            authorized_keys: vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb1M0Y4hl6YqVnZ8vQm7oFzX3xK1p4tq9w2nqkqzJ0A x".into()],
            data_disk: None,
            tailscale: None,
            restore_serial: None,
            disable_agent: false,
            etcd_snapshot_schedule: None,
            secrets_encryption: false,
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
async fn a_shell_script_user_data_is_run_by_cloud_init_not_refused_and_joins_no_cluster() {
    let sim = start().await;
    let c = client(&sim);
    // A cluster exists, so a Node the script's VM wrongly registered would be visible.
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    create_instance(
        &c,
        "c1-cp-fffff",
        "#!/bin/sh\ncurl -sfL https://get.k3s.io | sh -\n",
    )
    .await;
    // cloud-init classifies it as text/x-shellscript and runs it; it does not warn that it
    // ignores the user-data. Read the console
    // once the boot is over (cloud-final's "finished" line comes after everything else).
    wait_console(&c, "c1-cp-fffff", "-----END SSH HOST KEY FINGERPRINTS-----").await;
    let console = wait_console(&c, "c1-cp-fffff", "Cloud-init v. 24.4.1 finished at").await;
    assert!(
        console.contains("text/x-shellscript"),
        "the script is classified as cloud-init does: {console}"
    );
    assert!(
        !console.contains("ignoring it") && !console.contains("does not start with"),
        "cloud-init does not ignore a script: {console}"
    );
    // The script has no token and no server URL: whatever it installs is no member of c1.
    assert_eq!(node_ready(&sim, "c1-cp-fffff").await, None);
    assert_eq!(
        node_ready(&sim, "c1-cp-aaaaa").await.as_deref(),
        Some("True")
    );
}

#[tokio::test]
async fn user_data_without_a_known_header_is_ignored_with_cloud_inits_warning() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    create_instance(
        &c,
        "c1-cp-eeeee",
        "token: x\nserver: https://127.0.0.1:6443\n",
    )
    .await;
    wait_console(&c, "c1-cp-eeeee", "-----END SSH HOST KEY FINGERPRINTS-----").await;
    let console = wait_console(&c, "c1-cp-eeeee", "Cloud-init v. 24.4.1 finished at").await;
    assert!(
        console.contains("Unhandled non-multipart (text/x-not-multipart) userdata"),
        "{console}"
    );
    assert!(!console.contains("k3s"), "no k3s step ran: {console}");
    assert_eq!(node_ready(&sim, "c1-cp-eeeee").await, None);
}

#[tokio::test]
async fn user_data_over_32_kib_never_boots_a_node() {
    let sim = start().await;
    let c = client(&sim);
    // A cluster exists, so a Node of the refused instance would be visible.
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
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

    // The API refuses it up front, as a rack does (cloud-init's own refusal of an oversized
    // user-data is `cloud_init`'s unit test).
    match c.instance_create().project(PROJECT).body(body).send().await {
        Err(oxide::Error::ErrorResponse(resp)) => assert_eq!(resp.status(), 400),
        other => panic!("expected a 400, got {other:?}"),
    }
    let names: Vec<String> = c
        .instance_list()
        .project(PROJECT)
        .send()
        .await
        .unwrap()
        .into_inner()
        .items
        .into_iter()
        .map(|i| i.name.to_string())
        .collect();
    assert_eq!(names, ["c1-cp-aaaaa"]);
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

/// A russh client that trusts any host key (these tests are about user keys).
struct AnyHost;

impl russh::client::Handler for AnyHost {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// Whether `key` gets an SSH login as `user` on `ip`.
async fn ssh_login(ip: std::net::IpAddr, key: &russh::keys::PrivateKey, user: &str) -> bool {
    let config = std::sync::Arc::new(russh::client::Config::default());
    let mut session = russh::client::connect(config, (ip, SSH_PORT), AnyHost)
        .await
        .expect("connect");
    session
        .authenticate_publickey(
            user,
            russh::keys::PrivateKeyWithHashAlg::new(std::sync::Arc::new(key.clone()), None),
        )
        .await
        .expect("auth exchange")
        .success()
}

/// A server instance like `create_instance`'s, with the project's SSH key `api-key` attached.
async fn create_instance_with_api_key(c: &oxide::Client, name: &str, user_data: &str) {
    let body = oxide::types::InstanceCreate::builder()
        .name(name)
        .description("api ssh key")
        .hostname(name)
        .ncpus(oxide::types::InstanceCpuCount(2))
        .memory(oxide::types::ByteCount(4 << 30))
        .external_ips(vec![oxide::types::ExternalIpCreate::Ephemeral {
            pool_selector: oxide::types::PoolSelector::Auto { ip_version: None },
        }])
        .ssh_public_keys(vec![oxide::types::NameOrId::Name(
            "api-key".parse().unwrap(),
        )])
        .user_data(base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            user_data,
        ));
    c.instance_create()
        .project(PROJECT)
        .body(body)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn api_ssh_keys_belong_to_the_default_user_and_without_one_log_in_nowhere() {
    use russh::keys::{Algorithm, PrivateKey};
    let sim = start().await;
    let c = client(&sim);
    let api_key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    let ours = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    sim.oxide()
        .seed_ssh_key("api-key", &api_key.public_key().to_openssh().unwrap());
    let ours_line = ours.public_key().to_openssh().unwrap();
    let config = first_server_config(TOKEN, "agent-secret", &[]);
    // `users:` with `default` (sim_support's user-data): the API key is the default user's.
    let with_default = user_data("server", &config, std::slice::from_ref(&ours_line));
    assert!(with_default.contains("  - default\n"));
    // The product's shape: `users:` names only its own user, so there is no default user.
    let without_default = with_default.replace("  - default\n", "");
    create_instance_with_api_key(&c, "c1-cp-aaaaa", &with_default).await;
    create_instance_with_api_key(&c, "c2-cp-bbbbb", &without_default).await;
    for name in ["c1-cp-aaaaa", "c2-cp-bbbbb"] {
        wait_console(&c, name, "Cloud-init v. 24.4.1 finished at").await;
    }
    let with = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let without = ephemeral_ip(&c, "c2-cp-bbbbb").await;

    // The user-data's own user logs in with its key either way.
    assert!(ssh_login(with, &ours, "ubuntu").await);
    assert!(ssh_login(without, &ours, "ubuntu").await);
    // The API key: the default user (whose name the simulator does not know) on the first...
    assert!(ssh_login(with, &api_key, "debian").await);
    // Root gets it only behind the `disable_root` forced command: no usable login.
    assert!(!ssh_login(with, &api_key, "root").await);
    // ...and on the second only root's forced "Please login as the user NONE" command: no
    // usable login as anyone.
    for user in ["ubuntu", "debian", "root"] {
        assert!(
            !ssh_login(without, &api_key, user).await,
            "the API key must not log in as {user} without a default user"
        );
    }
}

/// Whether the API at `server` answers a client that verifies its certificate for `name`
/// (the connection's own address when `None`).
async fn api_verifies(
    sim: &oxide_sim::SimHandle,
    server: std::net::IpAddr,
    name: Option<String>,
) -> bool {
    let url = format!("https://{server}:6443");
    let text = sim.kube().admin_kubeconfig(&url).unwrap();
    let mut file = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    for named in &mut file.clusters {
        named.cluster.as_mut().unwrap().tls_server_name = name.clone();
    }
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap();
    let client = oxide_controller::adapters::kubeclient::client_from_config(config).unwrap();
    client.apiserver_version().await.is_ok()
}

#[tokio::test]
async fn the_api_certificate_lists_tls_san_and_the_nodes_own_ip_but_no_nat_address() {
    let sim = start().await;
    let c = client(&sim);
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[fip]).await;
    let ephemeral = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let private = private_ip(&c, "c1-cp-aaaaa").await;

    // The node's own address (what the guest sees on its NIC) is in the certificate; the
    // connection goes where that address lives here (its loopback stand-in).
    let std::net::IpAddr::V4(rack) = private else {
        panic!("{private} is not IPv4")
    };
    let reach = sim.oxide().private_loopback(PROJECT, rack).unwrap();
    assert!(api_verifies(&sim, reach.into(), Some(private.to_string())).await);
    assert!(!api_verifies(&sim, reach.into(), Some("172.30.0.99".into())).await);
    // The ephemeral IP is NAT the guest never sees: k3s (tls-san-security) does not add it...
    assert!(!api_verifies(&sim, ephemeral, None).await);
    // ...though the listener is there and the certificate holds for a tls-san entry.
    assert!(api_verifies(&sim, ephemeral, Some(fip.to_string())).await);
    assert!(api_verifies(&sim, ephemeral, Some("kubernetes.default.svc".into())).await);
}

/// Every critical configuration value a joining server's config carries is compared with the
/// cluster's (its first server's, defaults filled in): a different `agent-token`, or a
/// `cluster-cidr` the first server left at its default, refuses the join; the same values
/// written out explicitly (defaults included) do not.
#[tokio::test]
async fn a_server_with_any_other_critical_value_is_refused() {
    let sim = start().await;
    let c = client(&sim);
    // first_server_config's agent-token is "agent-secret".
    create_instance(
        &c,
        "c1-cp-aaaaa",
        &user_data(
            "server",
            &first_server_config(TOKEN, "agent-secret", &[]),
            &[],
        ),
    )
    .await;
    wait_node_status(&sim, "c1-cp-aaaaa", "True").await;
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let join = format!("server: https://{server_ip}:6443\ntoken: {TOKEN}\n");
    for (name, extra) in [
        ("c1-cp-bbbbb", "agent-token: another-agent-secret\n"),
        ("c1-cp-ccccc", "cluster-cidr: 10.52.0.0/16\n"),
    ] {
        create_instance(
            &c,
            name,
            &user_data("server", &format!("{join}{extra}"), &[]),
        )
        .await;
    }
    let same = format!(
        "{join}agent-token: agent-secret\ncluster-cidr: 10.42.0.0/16\nflannel-backend: vxlan\ndisable: [traefik]\n"
    );
    create_instance(&c, "c1-cp-ddddd", &user_data("server", &same, &[])).await;
    wait_node_status(&sim, "c1-cp-ddddd", "True").await;
    for name in ["c1-cp-bbbbb", "c1-cp-ccccc"] {
        let console = wait_console(&c, name, "critical configuration value mismatch").await;
        assert!(console.contains("level=fatal"), "{console}");
        assert!(!console.contains("another-agent-secret"), "{console}");
        assert_eq!(node_ready(&sim, name).await, None);
    }
}

/// A joining server needs the etcd ports (2379-2380) between its private address and the
/// member servers'; the default `allow-internal-inbound` admits them, a VPC firewall that
/// admits only the API does not — then k3s exits and systemd retries until a rule admits them.
/// An agent needs only the API port.
#[tokio::test]
async fn a_server_joins_only_once_the_vpc_firewall_admits_etcd_between_servers() {
    let sim = start_default_firewall(|_| {}).await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let private = private_ip(&c, "c1-cp-aaaaa").await;
    let rule = |name: &str, ports: &str| oxide::types::VpcFirewallRuleUpdate {
        action: oxide::types::VpcFirewallRuleAction::Allow,
        description: String::new(),
        direction: oxide::types::VpcFirewallRuleDirection::Inbound,
        filters: oxide::types::VpcFirewallRuleFilter {
            hosts: Some(vec![oxide::types::VpcFirewallRuleHostFilter::Vpc(
                "default".parse().unwrap(),
            )]),
            ports: Some(vec![ports.parse().unwrap()]),
            protocols: Some(vec![oxide::types::VpcFirewallRuleProtocol::Tcp]),
        },
        name: name.parse().unwrap(),
        priority: 100,
        status: oxide::types::VpcFirewallRuleStatus::Enabled,
        targets: vec![oxide::types::VpcFirewallRuleTarget::Vpc(
            "default".parse().unwrap(),
        )],
    };
    let set_rules = |rules: Vec<oxide::types::VpcFirewallRuleUpdate>| {
        c.vpc_firewall_rules_update()
            .project(PROJECT)
            .vpc("default")
            .body(oxide::types::VpcFirewallRuleUpdateParams { rules })
            .send()
    };
    // Only the API inside the VPC (SSH too, for the harness's own probes).
    set_rules(vec![rule("api", "6443"), rule("ssh", "22")])
        .await
        .unwrap();

    let join = format!("server: https://{private}:6443\ntoken: {TOKEN}\n");
    create_instance(&c, "c1-cp-bbbbb", &user_data("server", &join, &[])).await;
    let agent = format!("server: https://{private}:6443\ntoken: agent-secret-1\n");
    create_instance(&c, "c1-workers-aaaaa", &user_data("agent", &agent, &[])).await;
    wait_node_status(&sim, "c1-workers-aaaaa", "True").await;
    let console = wait_console(&c, "c1-cp-bbbbb", ":2379: i/o timeout").await;
    assert!(console.contains("level=fatal"), "{console}");
    assert!(console.contains(&format!("{private}:2379")), "{console}");
    assert_eq!(node_ready(&sim, "c1-cp-bbbbb").await, None);

    set_rules(vec![
        rule("api", "6443"),
        rule("ssh", "22"),
        rule("etcd", "2379-2380"),
    ])
    .await
    .unwrap();
    wait_node_status(&sim, "c1-cp-bbbbb", "True").await;
}
