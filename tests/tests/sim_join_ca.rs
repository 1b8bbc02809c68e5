//! Joins that pin the cluster CA: the product renders joiners with k3s's full token form
//! `K10<sha256 of the CA>::<user>:<password>`, the hash computed from the kubeconfig as
//! bootstrap computes it. The simulated k3s refuses a hash that is not its CA's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::collections::BTreeMap;

use oxide_controller::domain::spec::K3sInstall;
use oxide_controller::render::cloud_init::{K3sRole, NodeUserData, ProviderId, full_token, render};
use sim_support::*;

const TOKEN: &str = "server-secret-0123456789";
/// The agent token `first_server` configures.
const AGENT_TOKEN: &str = "agent-secret-1";

fn joiner(name: &str, role: K3sRole) -> String {
    render(&NodeUserData {
        hostname: name.into(),
        role,
        node_labels: BTreeMap::new(),
        node_taints: vec![],
        provider_id: ProviderId::None,
        external_cloud_provider: false,
        kubelet_args: vec![],
        k3s_version: "v1.33.4+k3s1".into(),
        install: K3sInstall::Script,
        k3s_installer_url: oxide_controller::domain::spec::K3S_INSTALL_URL.into(),
        k3s_installer_sha256: None,
        k3s_binary: None,
        k3s_start_seconds: 3,
        ssh_user: "ubuntu".into(),
        authorized_keys: vec![
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb1M0Y4hl6YqVnZ8vQm7oFzX3xK1p4tq9w2nqkqzJ0A x"
                .into(),
        ],
        data_disk: None,
        tailscale: None,
        restore_serial: None,
        disable_agent: false,
        etcd_snapshot_schedule: None,
        secrets_encryption: false,
    })
    .unwrap()
}

#[tokio::test]
async fn a_joiner_with_a_wrong_ca_hash_never_joins_and_the_right_one_does() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let url = format!("https://{ip}:6443");
    let right = oxide_controller::adapters::kubeconfig::k3s_ca_hash(
        &sim.kube().admin_kubeconfig(&url).unwrap(),
    )
    .unwrap();
    let wrong = "0".repeat(64);

    for (suffix, hash) in [("wrong", wrong.as_str()), ("right", right.as_str())] {
        let server = format!("c1-cp-{suffix}");
        create_instance(
            &c,
            &server,
            &joiner(
                &server,
                K3sRole::Server {
                    cluster_init: false,
                    server_url: Some(url.clone()),
                    token: full_token(hash, "server", TOKEN),
                    agent_token: AGENT_TOKEN.into(),
                    tls_san: vec![],
                },
            ),
        )
        .await;
        let agent = format!("c1-workers-{suffix}");
        create_instance(
            &c,
            &agent,
            &joiner(
                &agent,
                K3sRole::Agent {
                    server_url: url.clone(),
                    agent_token: full_token(hash, "node", AGENT_TOKEN),
                },
            ),
        )
        .await;
    }
    wait_node_status(&sim, "c1-cp-right", "True").await;
    wait_node_status(&sim, "c1-workers-right", "True").await;
    // Each as its role does: a joining server exits (`shouldBootstrapLoad`) and systemd
    // starts it again; an agent logs the error and retries every 2 s
    // (`createProxyAndValidateToken`). Either way the product's `start_k3s` gives up after
    // its wait and names k3s's last error.
    for (name, unit, level, not) in [
        ("c1-cp-wrong", "k3s", "level=fatal", "level=error"),
        (
            "c1-workers-wrong",
            "k3s-agent",
            "level=error",
            "level=fatal",
        ),
    ] {
        let console = wait_console(&c, name, "node-setup failed").await;
        assert!(console.contains(level), "{name}: {console}");
        assert!(!console.contains(not), "{name}: {console}");
        let failure = oxide_controller::render::cloud_init::setup_failure(&console).unwrap();
        assert_eq!(failure.step, "k3s-start", "{name}");
        assert!(
            failure
                .reason
                .starts_with(&format!("{unit} is not up after 3 s: "))
                && failure.reason.contains("token CA hash does not match"),
            "{name}: {}",
            failure.reason
        );
        assert!(!console.contains(TOKEN) && !console.contains(AGENT_TOKEN));
        assert_eq!(node_ready(&sim, name).await, None, "{name} never joins");
    }
    let server = console(&c, "c1-cp-wrong").await;
    assert!(
        server.contains("k3s.service: Scheduled restart job"),
        "systemd restarts the server: {server}"
    );
}
