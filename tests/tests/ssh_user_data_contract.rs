//! The contract between the product's cloud-init renderer (`oxide_controller::render::cloud_init`)
//! and the simulated VM boot (`oxide_sim::guest::parse_user_data`): what the product renders
//! is read back as the right k3s role, config and SSH keys — so the controller's key is the
//! one the VM's SSH server will authorize.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use oxide_controller::adapters::ssh::generate_ed25519;
use oxide_controller::domain::spec::{K3sInstall, Taint, TaintEffect};
use oxide_controller::render::cloud_init::{
    DataDisk, K3sRole, NodeUserData, PROVIDER_ID_DROP_IN_PATH, ProviderId, render,
};
use oxide_sim::guest::{Role, parse_user_data};

fn server(key_line: &str) -> NodeUserData {
    NodeUserData {
        hostname: "demo-cp-a1b2c".into(),
        role: K3sRole::Server {
            cluster_init: true,
            server_url: None,
            token: "server-token".into(),
            agent_token: "agent-token".into(),
            tls_san: vec!["127.100.0.10".into()],
        },
        node_labels: BTreeMap::from([("oxide-controller/pool".into(), "cp".into())]),
        node_taints: vec![],
        provider_id: ProviderId::None,
        external_cloud_provider: false,
        kubelet_args: vec![],
        k3s_version: "v1.33.4+k3s1".into(),
        install: K3sInstall::Script,
        k3s_installer_url: oxide_controller::domain::spec::K3S_INSTALL_URL.into(),
        k3s_installer_sha256: None,
        k3s_binary: None,
        k3s_start_seconds: 300,
        ssh_user: "ubuntu".into(),
        authorized_keys: vec![key_line.to_string()],
        data_disk: None,
        tailscale: None,
        restore_serial: None,
        disable_agent: false,
        etcd_snapshot_schedule: None,
        secrets_encryption: false,
    }
}

#[test]
fn first_server_user_data_boots_as_a_cluster_init_server_with_our_ssh_key() {
    let key = generate_ed25519();
    let user_data = render(&server(
        &key.authorized_key_line("oxide-controller").unwrap(),
    ))
    .unwrap();
    let ud = parse_user_data(user_data.as_bytes()).unwrap();
    assert_eq!(ud.role, Some(Role::Server));
    assert_eq!(ud.install_version.as_deref(), Some("v1.33.4+k3s1"));
    let k3s = ud.k3s.unwrap();
    assert!(k3s.cluster_init);
    assert_eq!(k3s.token.as_deref(), Some("server-token"));
    assert_eq!(k3s.agent_token.as_deref(), Some("agent-token"));
    assert_eq!(k3s.node_name.as_deref(), Some("demo-cp-a1b2c"));
    assert_eq!(k3s.tls_san, vec!["127.100.0.10"]);
    assert_eq!(ud.authorized_keys.len(), 1);
    assert_eq!(ud.authorized_keys[0].user.as_deref(), Some("ubuntu"));
    // No `default` in `users`: cloud-init makes no default user, so the instance's API keys
    // would reach no usable account; the product's key is its own user's.
    assert!(!ud.default_user);
    assert_eq!(
        ud.authorized_keys[0].key.key_data(),
        key.public_key().key_data()
    );
}

#[test]
fn agent_user_data_boots_as_an_agent_with_the_smbios_provider_id_step() {
    let key = generate_ed25519();
    let input = NodeUserData {
        hostname: "demo-workers-x1y2z".into(),
        role: K3sRole::Agent {
            server_url: "https://127.100.0.10:6443".into(),
            agent_token: "agent-token".into(),
        },
        node_taints: vec![Taint {
            key: "dedicated".into(),
            value: "batch".into(),
            effect: TaintEffect::NoExecute,
        }],
        provider_id: ProviderId::FromSmbiosUuid,
        install: K3sInstall::Preinstalled,
        data_disk: Some(DataDisk::for_disk_name("data-demo-workers-x1y2z")),
        ..server(&key.authorized_key_line("").unwrap())
    };
    let ud = parse_user_data(render(&input).unwrap().as_bytes()).unwrap();
    assert_eq!(ud.role, Some(Role::Agent));
    let k3s = ud.k3s.unwrap();
    assert_eq!(k3s.server.as_deref(), Some("https://127.100.0.10:6443"));
    assert_eq!(k3s.token.as_deref(), Some("agent-token"));
    assert_eq!(k3s.node_taint, vec!["dedicated=batch:NoExecute"]);
    assert_eq!(ud.smbios_provider_id_prefix.as_deref(), Some("oxide://"));
    assert!(
        !ud.files.contains_key(PROVIDER_ID_DROP_IN_PATH),
        "written at boot, not in user-data"
    );
}
