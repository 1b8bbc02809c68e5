//! SSH on server VMs: the host key pinned from the serial console, the kubeconfig and join
//! token read over SSH, and the kubeconfig working against the cluster through the floating IP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use russh::keys::{Algorithm, HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use sim_support::*;

const TOKEN: &str = "server-secret-ssh-test";

/// A russh client that accepts only the pinned fingerprint.
struct Pinned {
    fingerprint: String,
}

impl russh::client::Handler for Pinned {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            return Ok(false);
        };
        Ok(key.fingerprint(HashAlg::Sha256).to_string() == self.fingerprint)
    }
}

/// The fingerprint from cloud-init's block on the console.
/// The fingerprint in the console's last complete block, read the way bootstrap reads it
/// (the lines carry cloud-init's `<14>Mon DD HH:MM:SS cloud-init: ` logger prefix).
fn console_fingerprint(console: &str) -> String {
    oxide_controller::adapters::ssh::HostKeyPins::from_console(console)
        .expect("fingerprint block on the console")
        .fingerprints()
        .next()
        .expect("a fingerprint")
        .to_string()
}

async fn ssh_run(
    ip: IpAddr,
    fingerprint: &str,
    key: &PrivateKey,
    user: &str,
    cmd: &str,
) -> Result<(u32, Vec<u8>), String> {
    let config = Arc::new(russh::client::Config::default());
    let handler = Pinned {
        fingerprint: fingerprint.to_string(),
    };
    let mut session = russh::client::connect(config, (ip, SSH_PORT), handler)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let auth = session
        .authenticate_publickey(
            user,
            PrivateKeyWithHashAlg::new(Arc::new(key.clone()), None),
        )
        .await
        .map_err(|e| format!("auth: {e}"))?;
    if !auth.success() {
        return Err("authentication refused".into());
    }
    let mut channel = session
        .channel_open_session()
        .await
        .map_err(|e| e.to_string())?;
    channel.exec(true, cmd).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut status = None;
    while let Some(msg) = channel.wait().await {
        match msg {
            russh::ChannelMsg::Data { data } => out.extend_from_slice(&data),
            russh::ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
            _ => {}
        }
    }
    Ok((status.ok_or("no exit status")?, out))
}

/// sshd reads the login user's `authorized_keys` at each authentication, as the user: the
/// product's key rotation (`bootstrap rotate-ssh-key`: the new key added by the user, the old
/// one removed, each a temporary file moved into place) counts from the next login; a file
/// root owns that the user cannot read authorizes nothing
/// (openssh-portable@0ef0f5a8 `auth2-pubkey.c:625-647`, `misc.c:2319-2344`).
async fn authorized_keys_are_read_at_each_login(ip: IpAddr, fingerprint: &str, key: &PrivateKey) {
    use oxide_controller::adapters::ssh::{
        HostKeyPins, RemoteShell as _, SshError, SshKeyPair, SshTarget,
    };
    use oxide_controller::domain::authorized_keys::{self, path, with_key, without_key};
    let pins = HostKeyPins::new([fingerprint]).unwrap();
    let login = |k: &PrivateKey| {
        SshTarget::new(
            (ip, SSH_PORT).into(),
            "ubuntu",
            SshKeyPair::new(k.clone()),
            pins.clone(),
        )
    };
    let refused = |r: Result<_, SshError>| matches!(r, Err(SshError::AuthRejected { .. }));
    let file = path("ubuntu");
    let old_line = key.public_key().to_openssh().unwrap();
    let next = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    let next_line = next.public_key().to_openssh().unwrap();
    // cloud-init's file holds the user-data's key.
    let read = |k: &PrivateKey| {
        let t = login(k);
        let file = file.clone();
        async move {
            let out = t.exec(&format!("cat {file}")).await.unwrap();
            assert!(out.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let text = read(key).await;
    assert!(authorized_keys::holds(&text, &old_line), "{text}");
    assert!(refused(login(&next).exec("true").await));
    login(key)
        .replace_own_file(&file, with_key(&text, &next_line).as_bytes(), 0o600)
        .await
        .unwrap();
    assert!(login(&next).exec("true").await.unwrap().success());
    let text = read(&next).await;
    login(&next)
        .replace_own_file(&file, without_key(&text, &old_line).as_bytes(), 0o600)
        .await
        .unwrap();
    assert!(
        refused(login(key).exec("true").await),
        "the old key is refused at once"
    );
    assert!(login(&next).exec("true").await.unwrap().success());
    let only_next = read(&next).await;
    // Written through sudo, the file is root's: world-readable, sshd reads it; 0600, the
    // user sshd opens it as cannot, and no key logs in (the last step: it locks the user out).
    login(&next)
        .upload(&file, only_next.as_bytes(), 0o644)
        .await
        .unwrap();
    assert!(login(&next).exec("true").await.unwrap().success());
    login(&next)
        .upload(&file, only_next.as_bytes(), 0o600)
        .await
        .unwrap();
    assert!(refused(login(&next).exec("true").await));
}

#[tokio::test]
async fn ssh_to_a_server_reads_a_kubeconfig_that_works_through_the_floating_ip() {
    let sim = start().await;
    let c = client(&sim);
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    let stranger = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    let fip = create_floating_ip(&c, "c1-apiserver").await;

    let config = first_server_config(TOKEN, "agent-secret", &[fip]);
    let ud = user_data("server", &config, &[key.public_key().to_openssh().unwrap()]);
    create_instance(&c, "c1-cp-aaaaa", &ud).await;
    wait_node_status(&sim, "c1-cp-aaaaa", "True").await;
    attach_floating_ip(&c, "c1-apiserver", "c1-cp-aaaaa").await;

    // cloud-init prints the block after runcmd, i.e. once the k3s install step returned.
    let console = wait_console(&c, "c1-cp-aaaaa", "-----END SSH HOST KEY FINGERPRINTS-----").await;
    assert!(console.contains("k3s is up and running"));
    let fingerprint = console_fingerprint(&console);
    let ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;

    // Keys not in the cloud-config are refused; a different pinned key is refused.
    assert!(
        ssh_run(ip, &fingerprint, &stranger, "ubuntu", "true")
            .await
            .is_err()
    );
    assert!(
        ssh_run(ip, "SHA256:not-this-one", &key, "ubuntu", "true")
            .await
            .is_err()
    );

    let (status, token) = ssh_run(
        ip,
        &fingerprint,
        &key,
        "ubuntu",
        "sudo cat /var/lib/rancher/k3s/server/node-token",
    )
    .await
    .unwrap();
    assert_eq!(status, 0);
    let token = String::from_utf8(token).unwrap();
    assert!(
        token.starts_with("K10") && token.trim_end().ends_with(&format!("::server:{TOKEN}")),
        "{token}"
    );

    // The floating IP answers SSH too.
    let (status, kubeconfig) = ssh_run(
        fip,
        &fingerprint,
        &key,
        "ubuntu",
        "sudo cat /etc/rancher/k3s/k3s.yaml",
    )
    .await
    .unwrap();
    assert_eq!(status, 0);
    let kubeconfig = String::from_utf8(kubeconfig).unwrap();
    assert!(
        kubeconfig.contains("server: https://127.0.0.1:6443"),
        "k3s-shaped: {kubeconfig}"
    );

    // Rewrite the server to the floating IP, as the product does, and use it.
    let rewritten = kubeconfig.replace("https://127.0.0.1:6443", &format!("https://{fip}:6443"));
    let kc = kube::config::Kubeconfig::from_yaml(&rewritten).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    let kube_client = kube::Client::try_from(cfg).unwrap();
    let nodes: kube::Api<Node> = kube::Api::all(kube_client);
    let list = nodes.list(&Default::default()).await.unwrap();
    let names: Vec<String> = list
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(names, ["c1-cp-aaaaa"]);

    authorized_keys_are_read_at_each_login(ip, &fingerprint, &key).await;
}

#[tokio::test]
async fn wrong_console_host_key_fault_prints_a_key_the_server_does_not_have() {
    let sim = start_with(|o| o.faults.wrong_console_host_key = vec!["c1-cp-bad".into()]).await;
    let c = client(&sim);
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    let ud = user_data(
        "server",
        &first_server_config(TOKEN, "a", &[]),
        &[key.public_key().to_openssh().unwrap()],
    );
    create_instance(&c, "c1-cp-bad01", &ud).await;
    let console = wait_console(&c, "c1-cp-bad01", "-----END SSH HOST KEY FINGERPRINTS-----").await;
    let printed = console_fingerprint(&console);
    let ip = ephemeral_ip(&c, "c1-cp-bad01").await;
    let err = ssh_run(ip, &printed, &key, "ubuntu", "true")
        .await
        .unwrap_err();
    assert!(
        err.starts_with("connect"),
        "the pinned key must not match: {err}"
    );
}
