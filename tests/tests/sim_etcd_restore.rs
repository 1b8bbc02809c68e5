//! A cluster restored from nothing in the simulator, as the product's restore does it: a k3s
//! etcd snapshot taken over SSH, every server deleted (the datastore gone with them), the
//! snapshot stored on the rack as an Oxide snapshot holding a ustar archive, and a new server
//! created with a disk made from it and a setup whose `etcd-restore` step extracts the
//! archive, checks its sha256 and runs k3s's `--cluster-reset-restore-path` on real etcd.
//! The restored cluster has the snapshot's objects and the old CA (the old admin kubeconfig
//! works), and takes a joining server; another token, or an archive whose checksum does not
//! match, fails the step and no API answers. Rules: `tests/FIDELITY.md`, "k3s restore from a
//! snapshot".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use oxide::prelude::*;
use oxide::types;
use oxide_controller::adapters::ssh::{self, CommandOutput, HostKeyPins, SshTarget};
use oxide_sim::SimHandle;
use oxide_sim::support::ustar;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sim_support::*;

const TOKEN: &str = "server-secret-restore-0123";
const AGENT_TOKEN: &str = "agent-secret-restore-0123";
const LOST: &str = "c1-cp-aaaaa";
const GIB: u64 = 1 << 30;

async fn run(target: &SshTarget, cmd: &str) -> (u32, Vec<u8>, String) {
    let CommandOutput {
        exit_status,
        stdout,
        stderr,
    } = target.exec(cmd).await.unwrap();
    (
        exit_status,
        stdout,
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// `POST {path}` on the simulator's Oxide API with a JSON body (or none); panics unless 2xx.
async fn oxide_post(sim: &SimHandle, path: &str, body: Option<Value>) -> Value {
    let http = reqwest::Client::new();
    let mut req = http
        .post(format!("{}{path}", sim.oxide_host))
        .bearer_auth(&sim.oxide_token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "POST {path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// The backup as the product stores it: `bytes` bulk-imported into a disk from offset 0 and
/// finalized into Oxide snapshot `name`. Returns the snapshot's id.
async fn store_backup(sim: &SimHandle, name: &str, bytes: &[u8]) -> String {
    let disk = format!("{name}-import");
    let p = format!("project={PROJECT}");
    oxide_post(
        sim,
        &format!("/v1/disks?{p}"),
        Some(
            json!({"name": disk, "description": "backup import", "size": GIB,
            "disk_backend": {"type": "distributed",
                "disk_source": {"type": "importing_blocks", "block_size": 512}}}),
        ),
    )
    .await;
    oxide_post(sim, &format!("/v1/disks/{disk}/bulk-write-start?{p}"), None).await;
    for (i, chunk) in bytes.chunks(512 * 1024).enumerate() {
        let mut chunk = chunk.to_vec();
        chunk.resize(chunk.len().next_multiple_of(512), 0);
        oxide_post(
            sim,
            &format!("/v1/disks/{disk}/bulk-write?{p}"),
            Some(json!({"offset": i * 512 * 1024,
                "base64_encoded_data": base64::engine::general_purpose::STANDARD.encode(&chunk)})),
        )
        .await;
    }
    oxide_post(sim, &format!("/v1/disks/{disk}/bulk-write-stop?{p}"), None).await;
    oxide_post(
        sim,
        &format!("/v1/disks/{disk}/finalize?{p}"),
        Some(json!({"snapshot_name": name})),
    )
    .await;
    let http = reqwest::Client::new();
    let snap: Value = http
        .get(format!("{}/v1/snapshots/{name}?{p}", sim.oxide_host))
        .bearer_auth(&sim.oxide_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    snap["id"].as_str().unwrap().to_owned()
}

/// The archive the product writes: manifest, snapshot, and the snapshot's `sha256sum` line.
fn backup_archive(snapshot: &[u8], sha_of: &[u8]) -> Vec<u8> {
    let sum: String = Sha256::digest(sha_of)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let sha_line = format!("{sum}  etcd-snapshot\n");
    ustar::archive(&[
        ("manifest.json", br#"{"cluster":"c1"}"#),
        ("etcd-snapshot", snapshot),
        ("etcd-snapshot.sha256", sha_line.as_bytes()),
    ])
}

/// A restore server's user-data: cluster-init with `token` and the API address in
/// `tls-san` (as the first server's), and the product's setup: the installer without start,
/// the restore from the disk with serial `serial`, then `start_k3s`.
fn restore_user_data(token: &str, serial: &str, fip: IpAddr, ssh_keys: &[String]) -> String {
    restore_user_data_at("v1.33.4+k3s1", token, serial, fip, ssh_keys)
}

/// [`restore_user_data`] installing k3s `release`.
fn restore_user_data_at(
    release: &str,
    token: &str,
    serial: &str,
    fip: IpAddr,
    ssh_keys: &[String],
) -> String {
    let config = format!(
        "cluster-init: true\ntoken: {token}\ntls-san: [\"{fip}\"]\nnode-label:\n  - oxide-controller/pool=control-plane\n"
    );
    let mut out = String::from("#cloud-config\n");
    if !ssh_keys.is_empty() {
        out.push_str("users:\n  - default\n  - name: ubuntu\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    ssh_authorized_keys:\n");
        for key in ssh_keys {
            out.push_str(&format!("      - {key}\n"));
        }
    }
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let script = format!(
        "#!/bin/sh\nset -eu\nstep k3s-install\ndownload /run/oxide-controller/k3s-install.sh 'https://get.k3s.io'\nINSTALL_K3S_SKIP_START=true INSTALL_K3S_VERSION='{release}' INSTALL_K3S_EXEC='server' sh /run/oxide-controller/k3s-install.sh\nstep etcd-restore\nrestore_etcd '{serial}' '/var/lib/rancher/k3s/server/db/restore'\nstep k3s-start\nstart_k3s 'k3s' 120\n"
    );
    out.push_str(&format!(
        "write_files:\n  - path: /etc/rancher/k3s/config.yaml\n    permissions: '0600'\n    encoding: b64\n    content: {}\n  - path: /usr/local/sbin/oxide-node-setup\n    permissions: '0755'\n    encoding: b64\n    content: {}\nruncmd:\n  - [/usr/local/sbin/oxide-node-setup]\n",
        b64(&config),
        b64(&script)
    ));
    out
}

/// Creates instance `name` with a new disk `disk` made from snapshot `snapshot_id`.
async fn create_with_backup(sim: &SimHandle, name: &str, disk: &str, snapshot_id: &str, ud: &str) {
    oxide_post(
        sim,
        &format!("/v1/instances?project={PROJECT}"),
        Some(json!({
            "name": name, "description": "restore", "hostname": name,
            "ncpus": 2, "memory": 4u64 << 30,
            "external_ips": [{"type": "ephemeral"}],
            "user_data": base64::engine::general_purpose::STANDARD.encode(ud),
            "disks": [{"type": "create", "name": disk, "description": "backup",
                "size": GIB, "disk_backend": {"type": "distributed",
                    "disk_source": {"type": "snapshot", "snapshot_id": snapshot_id}}}],
        })),
    )
    .await;
}

/// A kube client for `kubeconfig`, with short timeouts.
async fn kube_client(kubeconfig: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.connect_timeout = Some(Duration::from_secs(5));
    cfg.read_timeout = Some(Duration::from_secs(10));
    kube::Client::try_from(cfg).unwrap()
}

async fn get_json(client: &kube::Client, path: &str) -> Option<Value> {
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    client.request::<Value>(req).await.ok()
}

/// A cluster of one server `LOST` with a ConfigMap, its etcd snapshot taken over SSH, then
/// the server deleted (its datastore with it). Returns the simulator, the snapshot's bytes,
/// the floating IP (`c1-apiserver`, now unattached), the SSH key, and the admin kubeconfig
/// and a ServiceAccount token kubeconfig at the floating IP made before the loss.
async fn lost_cluster() -> (SimHandle, Vec<u8>, IpAddr, ssh::SshKeyPair, [String; 2]) {
    let sim = start().await;
    let c = client(&sim);
    let key = ssh::generate_ed25519();
    let public = key.authorized_key_line("test").unwrap();
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    let ud = user_data(
        "server",
        &first_server_config(TOKEN, AGENT_TOKEN, &[fip]),
        std::slice::from_ref(&public),
    );
    create_instance(&c, LOST, &ud).await;
    wait_node_status(&sim, LOST, "True").await;
    attach_floating_ip(&c, "c1-apiserver", LOST).await;
    sim.kube()
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kept-in-the-backup", "namespace": "default"},
            "data": {"written": "before the loss"}}))
        .await
        .unwrap();
    let real = sim.boot().real_clusters()[0].clone();
    let old_admin = real.admin_kubeconfig(&format!("https://{fip}:6443"));
    let old_sa = real
        .control_plane
        .service_account_kubeconfig(&format!("https://{fip}:6443"), "default", "backup-reader")
        .await
        .unwrap();

    let pins = HostKeyPins::from_console(&console(&c, LOST).await).unwrap();
    let target = SshTarget::new(SocketAddr::new(fip, SSH_PORT), "ubuntu", key.clone(), pins);
    let (status, _, log) = run(&target, "sudo -n k3s etcd-snapshot save").await;
    assert_eq!(status, 0, "{log}");
    let name = log
        .lines()
        .find_map(|l| {
            l.split_once("msg=\"Snapshot ")
                .and_then(|(_, rest)| rest.strip_suffix(" saved.\""))
        })
        .unwrap_or_else(|| panic!("no 'Snapshot … saved.' line: {log}"))
        .to_owned();
    let path = format!("/var/lib/rancher/k3s/server/db/snapshots/{name}");
    let (status, snapshot, err) = run(&target, &format!("sudo -n cat {path}")).await;
    assert_eq!(status, 0, "{err}");
    // The snapshot holds k3s's bootstrap data under the token's key, sealed with the token:
    // no private key in the clear.
    let has = |needle: &[u8]| snapshot.windows(needle.len()).any(|w| w == needle);
    assert!(has(oxide_sim::guest::bootstrap_key(TOKEN).as_bytes()));
    assert!(
        !has(b"PRIVATE KEY"),
        "a private key in the clear in the snapshot"
    );
    drop(real);

    // Every server gone with its disks: the datastore and the API with them.
    stop_instance(&c, LOST).await;
    wait_for("the lost server stopped", || async {
        let inst = c
            .instance_view()
            .project(PROJECT)
            .instance(LOST)
            .send()
            .await
            .ok()?
            .into_inner();
        (inst.run_state == types::InstanceState::Stopped).then_some(())
    })
    .await;
    c.instance_delete()
        .project(PROJECT)
        .instance(LOST)
        .send()
        .await
        .unwrap();
    wait_for("no cluster left", || async {
        sim.boot().real_clusters().is_empty().then_some(())
    })
    .await;
    assert!(
        get_json(&kube_client(&old_admin).await, "/readyz")
            .await
            .is_none(),
        "no API answers after the loss"
    );
    (sim, snapshot, fip, key, [old_admin, old_sa])
}

#[tokio::test]
async fn a_new_server_restored_from_a_backup_disk_serves_the_old_objects_to_the_old_admin_and_takes_a_joining_server()
 {
    let (sim, snapshot, fip, key, [old_admin, old_sa]) = lost_cluster().await;
    let c = client(&sim);
    let public = key.authorized_key_line("test").unwrap();
    let snap_id = store_backup(&sim, "c1-backup-1", &backup_archive(&snapshot, &snapshot)).await;
    let restore = "c1-cp-rrrrr";
    let disk = "c1-cp-rrrrr-backup";
    create_with_backup(
        &sim,
        restore,
        disk,
        &snap_id,
        &restore_user_data(TOKEN, disk, fip, std::slice::from_ref(&public)),
    )
    .await;
    // The step's tools print their words; k3s's restore ends with its closing line.
    let text = wait_console(&c, restore, "etcd-snapshot: OK").await;
    assert!(!text.contains("node-setup failed"), "{text}");
    wait_console(&c, restore, "restart without --cluster-reset flag now").await;
    wait_node_status(&sim, restore, "True").await;
    attach_floating_ip(&c, "c1-apiserver", restore).await;

    // The admin kubeconfig made before the loss: the same CA, the same objects.
    let admin = kube_client(&old_admin).await;
    let cm = wait_for("the ConfigMap through the old admin kubeconfig", || async {
        get_json(
            &admin,
            "/api/v1/namespaces/default/configmaps/kept-in-the-backup",
        )
        .await
    })
    .await;
    assert_eq!(cm["data"]["written"], "before the loss");
    let ready = http::Request::get("/readyz").body(Vec::new()).unwrap();
    assert_eq!(admin.request_text(ready).await.unwrap().trim(), "ok");
    // A ServiceAccount token issued before the loss: the same signing key, the same account.
    let sa = kube_client(&old_sa).await;
    let whoami = sa
        .request::<Value>(
            http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
                .header("content-type", "application/json")
                .body(
                    serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1",
                        "kind": "SelfSubjectReview"}))
                    .unwrap(),
                )
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        whoami["status"]["userInfo"]["username"],
        "system:serviceaccount:default:backup-reader"
    );
    // The lost server's Node came back with the data (reconcile deletes it); the restored
    // server registered its own.
    assert!(
        get_json(&admin, &format!("/api/v1/nodes/{LOST}"))
            .await
            .is_some()
    );

    // The restored server is a cluster-init server like any other: a server joins it as a
    // learner and is promoted, and it takes snapshots.
    let join = format!("server: https://{fip}:6443\ntoken: {TOKEN}\n");
    create_instance(&c, "c1-cp-bbbbb", &user_data("server", &join, &[])).await;
    wait_node_status(&sim, "c1-cp-bbbbb", "True").await;
    let real = sim.boot().real_clusters()[0].clone();
    wait_for("2 voting members", || async {
        let m = real.control_plane.etcd().members().await.ok()?;
        (m.len() == 2 && m.iter().all(|m| !m.is_learner)).then_some(())
    })
    .await;
    // An agent joins with the agent token the backup's bootstrap data held.
    let agent = format!("server: https://{fip}:6443\ntoken: {AGENT_TOKEN}\n");
    create_instance(&c, "c1-wk-aaaaa", &user_data("agent", &agent, &[])).await;
    wait_node_status(&sim, "c1-wk-aaaaa", "True").await;

    let pins = HostKeyPins::from_console(&console(&c, restore).await).unwrap();
    let target = SshTarget::new(SocketAddr::new(fip, SSH_PORT), "ubuntu", key, pins);
    let (status, _, log) = run(&target, "sudo -n k3s etcd-snapshot save").await;
    assert_eq!(status, 0, "{log}");
    assert!(log.contains(" saved."), "{log}");
}

#[tokio::test]
async fn a_restore_with_another_token_fails_the_step_and_no_api_answers() {
    let (sim, snapshot, fip, _key, [old_admin, _]) = lost_cluster().await;
    let c = client(&sim);
    let snap_id = store_backup(&sim, "c1-backup-1", &backup_archive(&snapshot, &snapshot)).await;
    let restore = "c1-cp-rrrrr";
    let disk = "c1-cp-rrrrr-backup";
    create_with_backup(
        &sim,
        restore,
        disk,
        &snap_id,
        &restore_user_data("another-token-entirely", disk, fip, &[]),
    )
    .await;
    let text = wait_console(
        &c,
        restore,
        "node-setup failed: etcd-restore: exit status 1",
    )
    .await;
    assert!(text.contains("etcd-snapshot: OK"), "{text}");
    assert!(
        text.contains(
            "level=fatal msg=\"bootstrap data already found and encrypted with different token\""
        ),
        "{text}"
    );
    assert!(
        !text.contains("restart without --cluster-reset flag now"),
        "{text}"
    );
    // k3s never started: no cluster, no API, even with the address moved.
    attach_floating_ip(&c, "c1-apiserver", restore).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sim.boot().real_clusters().is_empty());
    assert!(
        get_json(&kube_client(&old_admin).await, "/readyz")
            .await
            .is_none(),
        "no API answers"
    );
    assert!(!console(&c, restore).await.contains("k3s is up and running"));
}

/// Audit 4 finding 3 (M1): a release of an older minor than the servers that wrote the
/// datastore (here v1.30 under the lost v1.33 server's data) does not restore it: k3s rolls
/// back only with a snapshot of the minor it rolls back to. The step fails, no API answers.
#[tokio::test]
async fn a_restore_by_an_older_minor_than_the_datastores_servers_fails_the_step() {
    let (sim, snapshot, fip, _key, [old_admin, _]) = lost_cluster().await;
    let c = client(&sim);
    let snap_id = store_backup(&sim, "c1-backup-1", &backup_archive(&snapshot, &snapshot)).await;
    let restore = "c1-cp-rrrrr";
    let disk = "c1-cp-rrrrr-backup";
    create_with_backup(
        &sim,
        restore,
        disk,
        &snap_id,
        &restore_user_data_at("v1.30.0+k3s1", TOKEN, disk, fip, &[]),
    )
    .await;
    let text = wait_console(
        &c,
        restore,
        "node-setup failed: etcd-restore: exit status 1",
    )
    .await;
    assert!(text.contains("etcd-snapshot: OK"), "{text}");
    assert!(
        text.contains("invalid downgrade; server version is lower than determined cluster version: the datastore was written by k3s v1.33.4+k3s1, this is k3s v1.30.0+k3s1"),
        "{text}"
    );
    assert!(
        !text.contains("restart without --cluster-reset flag now"),
        "{text}"
    );
    attach_floating_ip(&c, "c1-apiserver", restore).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sim.boot().real_clusters().is_empty());
    assert!(
        get_json(&kube_client(&old_admin).await, "/readyz")
            .await
            .is_none(),
        "no API answers"
    );
}

#[tokio::test]
async fn an_archive_whose_checksum_does_not_match_fails_the_restore_before_k3s_runs() {
    let sim = start().await;
    let c = client(&sim);
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    // Bytes that are not what the checksum line was taken of.
    let snapshot = vec![0x5au8; 40 * 1024];
    let snap_id = store_backup(
        &sim,
        "c1-backup-1",
        &backup_archive(&snapshot, b"other bytes"),
    )
    .await;
    let restore = "c1-cp-rrrrr";
    let disk = "c1-cp-rrrrr-backup";
    create_with_backup(
        &sim,
        restore,
        disk,
        &snap_id,
        &restore_user_data(TOKEN, disk, fip, &[]),
    )
    .await;
    let text = wait_console(
        &c,
        restore,
        "node-setup failed: etcd-restore: exit status 1",
    )
    .await;
    assert!(
        text.contains(
            "etcd-snapshot: FAILED\nsha256sum: WARNING: 1 computed checksum did NOT match\n"
        ),
        "{text}"
    );
    // Nothing of k3s ran: no restore line, no fatal line, no cluster.
    assert!(!text.contains("level=fatal"), "{text}");
    assert!(!text.contains("--cluster-reset"), "{text}");
    assert!(sim.boot().real_clusters().is_empty());

    // A disk that is not an archive at all: tar's words, exit 2.
    let snap_id = store_backup(&sim, "c1-backup-2", &[0x42u8; 4096]).await;
    let other = "c1-cp-sssss";
    let disk = "c1-cp-sssss-backup";
    create_with_backup(
        &sim,
        other,
        disk,
        &snap_id,
        &restore_user_data(TOKEN, disk, fip, &[]),
    )
    .await;
    let text = wait_console(&c, other, "node-setup failed: etcd-restore: exit status 2").await;
    assert!(
        text.contains("tar: This does not look like a tar archive"),
        "{text}"
    );
    // No disk with the serial the step names: the step fails as data_disk does.
    create_with_backup(
        &sim,
        "c1-cp-ttttt",
        "c1-cp-ttttt-backup",
        &snap_id,
        &restore_user_data(TOKEN, "c1-cp-ttttt-other", fip, &[]),
    )
    .await;
    wait_console(
        &c,
        "c1-cp-ttttt",
        "node-setup failed: etcd-restore: no NVMe disk with serial c1-cp-ttttt-other",
    )
    .await;
}
