//! k3s `secrets-encryption` in the simulator (rules: `tests/FIDELITY.md`, "k3s secrets
//! encryption"): a first server with it makes the cluster's real kube-apiserver encrypt
//! Secrets with k3s's generated EncryptionConfiguration (one aescbc key, `aescbckey`), so real
//! etcd and every etcd snapshot hold `k8s:enc:aescbc:v1:aescbckey:` ciphertext where a
//! cluster without it holds the values in the clear; the key itself travels only inside the
//! bootstrap data sealed with the server token.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::SocketAddr;

use base64::Engine as _;
use oxide_controller::adapters::ssh::{self, CommandOutput, HostKeyPins, SshTarget};
use serde_json::json;
use sim_support::*;

const TOKEN: &str = "server-secret-encrypt-0123";
const VALUE: &str = "tenant-password-in-the-clear-8c1f";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A one-server cluster (with `extra` in its k3s config) holding Secret `default/tenant`
/// and ConfigMap `default/plain`. Returns the simulator, the raw etcd values of both, and the
/// bytes of an etcd snapshot taken over SSH with `k3s etcd-snapshot save`.
async fn cluster_with_a_secret(extra: &str) -> (oxide_sim::SimHandle, Vec<u8>, Vec<u8>, Vec<u8>) {
    let sim = start().await;
    let c = client(&sim);
    let key = ssh::generate_ed25519();
    let public = key.authorized_key_line("test").unwrap();
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    let config = format!(
        "{}{extra}",
        first_server_config(TOKEN, "agent-secret-encrypt", &[fip])
    );
    create_instance(
        &c,
        "c1-cp-aaaaa",
        &user_data("server", &config, std::slice::from_ref(&public)),
    )
    .await;
    wait_node_status(&sim, "c1-cp-aaaaa", "True").await;
    attach_floating_ip(&c, "c1-apiserver", "c1-cp-aaaaa").await;
    let kube = sim.kube();
    kube.apply(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "tenant", "namespace": "default"},
        "stringData": {"password": VALUE}}))
        .await
        .unwrap();
    kube.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "plain", "namespace": "default"},
        "data": {"note": "not-a-secret-5e2a"}}))
        .await
        .unwrap();
    // Read back through the API: the apiserver decrypts what it stored.
    let secret = kube
        .get("v1", "Secret", Some("default"), "tenant")
        .await
        .unwrap();
    assert_eq!(
        secret["data"]["password"],
        base64::engine::general_purpose::STANDARD.encode(VALUE)
    );
    let real = sim.boot().real_clusters()[0].clone();
    let raw = |key: &'static str| {
        let etcd = real.control_plane.etcd();
        async move {
            let mut got = etcd.get_prefix(key).await.unwrap();
            assert_eq!(got.len(), 1, "{key}");
            got.remove(0).1
        }
    };
    let secret_raw = raw("/registry/secrets/default/tenant").await;
    let configmap_raw = raw("/registry/configmaps/default/plain").await;

    let pins = HostKeyPins::from_console(&console(&c, "c1-cp-aaaaa").await).unwrap();
    let target = SshTarget::new(SocketAddr::new(fip, SSH_PORT), "ubuntu", key, pins);
    let exec = async |cmd: &str| {
        let CommandOutput {
            exit_status,
            stdout,
            stderr,
        } = target.exec(cmd).await.unwrap();
        let log = String::from_utf8_lossy(&stderr).into_owned();
        assert_eq!(exit_status, 0, "{cmd}: {log}");
        (stdout, log)
    };
    let (_, log) = exec("sudo -n k3s etcd-snapshot save").await;
    let name = log
        .lines()
        .find_map(|l| {
            l.split_once("msg=\"Snapshot ")
                .and_then(|(_, rest)| rest.strip_suffix(" saved.\""))
        })
        .unwrap_or_else(|| panic!("no 'Snapshot … saved.' line: {log}"))
        .to_owned();
    let (snapshot, _) = exec(&format!(
        "sudo -n cat /var/lib/rancher/k3s/server/db/snapshots/{name}"
    ))
    .await;
    (sim, secret_raw, configmap_raw, snapshot)
}

#[tokio::test]
async fn with_secrets_encryption_etcd_and_its_snapshots_hold_secrets_only_as_aescbc_ciphertext() {
    let (sim, secret_raw, configmap_raw, snapshot) =
        cluster_with_a_secret("secrets-encryption: true\n").await;
    assert!(
        secret_raw.starts_with(b"k8s:enc:aescbc:v1:aescbckey:"),
        "{:?}",
        String::from_utf8_lossy(&secret_raw[..secret_raw.len().min(40)])
    );
    assert!(!contains(&secret_raw, VALUE.as_bytes()));
    // Only Secrets are encrypted (k3s's config names `secrets` alone).
    assert!(contains(&configmap_raw, b"not-a-secret-5e2a"));
    // The snapshot: the ciphertext, never the value, and never the key itself (it is only in
    // the bootstrap data, sealed with the server token).
    assert!(contains(&snapshot, b"k8s:enc:aescbc:v1:aescbckey:"));
    assert!(!contains(&snapshot, VALUE.as_bytes()));
    let real = sim.boot().real_clusters()[0].clone();
    let config: serde_json::Value = serde_json::from_str(
        real.control_plane
            .pki()
            .encryption_config
            .as_deref()
            .expect("an EncryptionConfiguration"),
    )
    .unwrap();
    let providers = &config["resources"][0]["providers"];
    assert_eq!(config["resources"][0]["resources"], json!(["secrets"]));
    assert_eq!(providers[0]["aescbc"]["keys"][0]["name"], "aescbckey");
    assert_eq!(providers[1], json!({"identity": {}}));
    let key = providers[0]["aescbc"]["keys"][0]["secret"]
        .as_str()
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(key)
            .unwrap()
            .len(),
        32
    );
    assert!(!contains(&snapshot, key.as_bytes()));
    assert!(!contains(&snapshot, b"EncryptionConfiguration"));
}

/// Without the flag (k3s's default), the value is in etcd and the snapshot in the clear:
/// what every backup of a cluster made before N1's fix holds.
#[tokio::test]
async fn without_secrets_encryption_etcd_and_its_snapshots_hold_secrets_in_the_clear() {
    let (sim, secret_raw, _, snapshot) = cluster_with_a_secret("").await;
    assert!(!secret_raw.starts_with(b"k8s:enc:"));
    assert!(contains(&secret_raw, VALUE.as_bytes()));
    assert!(contains(&snapshot, VALUE.as_bytes()));
    let real = sim.boot().real_clusters()[0].clone();
    assert!(real.control_plane.pki().encryption_config.is_none());
}
