//! `bootstrap backup` end to end: the real binary against `oxide-sim`, after a real `bootstrap`
//! of cluster `demo` (3 servers, 1 worker), whose servers run real etcd members.
//!
//! Checked: a backup is an Oxide snapshot of the cluster tagged as its backup, whose bytes (read
//! back through a disk made from it, as a guest would) are the archive: a manifest naming the
//! cluster, the server it was taken on, the servers' private addresses and the live spec, and a
//! real etcd snapshot whose sha256 is the tag's and holds the ConfigMap written before; the
//! token fingerprint is the resume file's token's. No Secret of the cluster holds an SSH
//! private key. `bootstrap delete` keeps the backups, listed; `--delete-backups` removes them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Output;
use std::time::Duration;

use common::{Env, env};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use oxide::prelude::*;
use oxide_controller::adapters::resume;
use oxide_controller::domain::backup::{self, BackupTag, Manifest};
use oxide_controller::ports::rack::Rack as _;
use sha2::{Digest as _, Sha256};

/// `bootstrap recover --cluster demo` with `extra`.
async fn recover_cmd(env: &Env, extra: &[&str]) -> Output {
    let mut with = vec!["--api-timeout", "180", "--wait", "300"];
    with.extend_from_slice(extra);
    let args = env.sub_args("recover", "demo", &with);
    tokio::time::timeout(Duration::from_secs(600), env.command(&args).output())
        .await
        .expect("recover finished within 600 s")
        .unwrap()
}

async fn backup_cmd(env: &Env) -> Output {
    let args = env.sub_args("backup", "demo", &[]);
    tokio::time::timeout(Duration::from_secs(300), env.command(&args).output())
        .await
        .expect("backup finished within 300 s")
        .unwrap()
}

/// The project's backups of `demo`, newest first.
async fn backups(env: &Env) -> Vec<backup::Backup> {
    let snaps = env.rack("demo").list_snapshots().await.unwrap();
    backup::of_cluster(
        "demo",
        snaps
            .iter()
            .map(|s| (s.name.as_str(), s.description.as_str())),
    )
}

/// The files of a ustar archive (name → bytes), read as tar does.
fn untar(a: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 512 <= a.len() && a[at] != 0 {
        let h = &a[at..at + 512];
        let name = String::from_utf8_lossy(&h[..100])
            .trim_end_matches('\0')
            .to_owned();
        let size = usize::from_str_radix(
            std::str::from_utf8(&h[124..135])
                .unwrap()
                .trim_matches('\0'),
            8,
        )
        .unwrap();
        out.push((name, a[at + 512..at + 512 + size].to_vec()));
        at += 512 + size.div_ceil(512) * 512;
    }
    out
}

/// The bytes of snapshot `name`, read the only way the rack allows: a disk made from it.
async fn snapshot_bytes(env: &Env, name: &str, len: usize) -> Vec<u8> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", env.sim.oxide_token).parse().unwrap(),
    );
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let client = oxide::Client::new_with_client(&env.sim.oxide_host, http);
    let snap = client
        .snapshot_view()
        .project("demo")
        .snapshot(name)
        .send()
        .await
        .unwrap()
        .into_inner();
    let disk = client
        .disk_create()
        .project("demo")
        .body(oxide::types::DiskCreate {
            description: "read back".into(),
            disk_backend: oxide::types::DiskBackend::Distributed(
                oxide::types::DiskSource::Snapshot {
                    read_only: false,
                    snapshot_id: snap.id,
                },
            ),
            name: "readback".parse().unwrap(),
            size: snap.size,
        })
        .send()
        .await
        .unwrap()
        .into_inner();
    let bytes = env.sim.oxide().read_disk(disk.id, 0, len).unwrap();
    client
        .disk_delete()
        .project("demo")
        .disk("readback")
        .send()
        .await
        .unwrap();
    bytes
}

/// The laptop's key stays on the laptop: no key of any Secret in the cluster is named like an
/// SSH private key.
async fn no_ssh_private_key_in_any_secret(client: &kube::Client) {
    let secrets: Api<Secret> = Api::all(client.clone());
    for s in secrets.list(&Default::default()).await.unwrap() {
        for key in s.data.unwrap_or_default().keys() {
            let k = key.to_ascii_lowercase();
            assert!(
                !((k.contains("ssh") && k.contains("priv"))
                    || k.starts_with("id_rsa")
                    || k.starts_with("id_ed25519")
                    || k.starts_with("id_ecdsa")
                    || k.ends_with(".pem") && k.contains("ssh")),
                "Secret {:?}/{:?} holds {key}",
                s.metadata.namespace,
                s.metadata.name
            );
        }
    }
}

/// `bootstrap rotate-ssh-key` after a run cut short (its new pair saved in the resume file
/// beside the old one, the first server already moved to it): the next run takes the same
/// pair and finishes. The three servers (each has an address this machine reaches) then
/// trust the new key only, proven by logging in with each key; the worker (no external
/// address) is named as not reached; the resume file holds the new pair only and the Secret's
/// `ssh-public-key` is the new key, for the VMs made from now on.
async fn rotate_ssh_key(env: &Env, client: &kube::Client) {
    use oxide_controller::adapters::ssh::{
        HostKeyPins, RemoteShell as _, SshError, SshKeyPair, SshTarget,
    };
    use oxide_controller::domain::authorized_keys;
    let path = env.state_dir().join("demo.json");
    let before = resume::load_for_cluster(&path, "demo").unwrap().unwrap();
    let rack = env.rack("demo");
    let login = async |server: &str, pins: &[String], key: SshKeyPair| {
        let ips = rack.instance_external_ips(server).await.unwrap();
        let ip = oxide_controller::ports::rack::reachable_address(&ips).unwrap();
        SshTarget::new(
            (ip, 2222).into(),
            "ubuntu",
            key,
            HostKeyPins::new(pins).unwrap(),
        )
    };
    let mut cut = before.clone();
    cut.begin_ssh_key_rotation().unwrap();
    resume::save(&path, &cut).unwrap();
    let pending = cut.ssh_next_public_key.clone().unwrap();
    let (first, pins) = before.host_key_pins.iter().next().unwrap();
    let old = login(first, pins, before.key_pair().unwrap()).await;
    let file = authorized_keys::path("ubuntu");
    let text = old.exec(&format!("cat {file}")).await.unwrap().stdout;
    let moved = authorized_keys::without_key(
        &authorized_keys::with_key(&String::from_utf8(text).unwrap(), &pending),
        &before.ssh_public_key,
    );
    old.replace_own_file(&file, moved.as_bytes(), 0o600)
        .await
        .unwrap();

    let args = env.sub_args("rotate-ssh-key", "demo", &[]);
    let out = tokio::time::timeout(Duration::from_secs(300), env.command(&args).output())
        .await
        .expect("rotate-ssh-key finished within 300 s")
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Rotated (3): demo-control-plane-")
            && stdout.contains("Not reached: demo-workers-"),
        "{stdout}"
    );
    let after = resume::load_for_cluster(&path, "demo").unwrap().unwrap();
    assert_eq!(after.ssh_public_key, pending, "the cut-short run's pair");
    assert!(after.ssh_next_private_key.is_none() && after.ssh_next_public_key.is_none());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let data = secrets.get("oxide-controller").await.unwrap().data.unwrap();
    assert_eq!(data["ssh-public-key"].0, after.ssh_public_key.as_bytes());
    let servers: Vec<&String> = after
        .host_key_pins
        .keys()
        .filter(|n| n.starts_with("demo-control-plane-"))
        .collect();
    assert_eq!(servers.len(), 3, "{servers:?}");
    for server in servers {
        let pins = &after.host_key_pins[server];
        let new = login(server, pins, after.key_pair().unwrap()).await;
        let new = new.exec("true").await.unwrap();
        assert!(new.success(), "{server}: {new:?}");
        let old = login(server, pins, before.key_pair().unwrap()).await;
        match old.exec("true").await {
            Err(SshError::AuthRejected { .. }) => {}
            other => panic!("{server}: the old key: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_is_a_tagged_snapshot_holding_the_etcd_snapshot_and_delete_keeps_it() {
    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("written-before-the-backup".into());
    cm.data = Some([("k".to_owned(), "in the backup".to_owned())].into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    // Audit security-2 N1: the controller's key rotated first; the backup below reaches the
    // server with the new one.
    rotate_ssh_key(&env, &client).await;
    // A bootstrap cut short while it removed the retired keys (the record says `removing`):
    // the Secret may still hold them, so `bootstrap backup` uploads nothing and says why.
    let state: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let mark = |v: serde_json::Value| {
        let state = state.clone();
        async move {
            let patch = serde_json::json!({"data": {"retired-keys-removed-at": v}});
            let pp = kube::api::PatchParams::default();
            state
                .patch("oxide-controller", &pp, &kube::api::Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    mark("removing".into()).await;
    let out = backup_cmd(&env).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("retired-keys-removed-at"), "{stderr}");
    assert!(backups(&env).await.is_empty());
    mark(serde_json::Value::Null).await;

    let out = backup_cmd(&env).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Backup demo-etcd-"), "{stdout}");

    let listed = backups(&env).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let b = &listed[0];
    // Recorded for status.json.
    let report = backup_report(&client).await;
    assert_eq!(
        report
            .last_success
            .as_ref()
            .map(|l| (&l.name, l.by.as_str())),
        Some((&b.name, "bootstrap backup")),
        "{report:?}"
    );
    let saved = resume::load_for_cluster(&env.state_dir().join("demo.json"), "demo")
        .unwrap()
        .unwrap();
    let tag: &BackupTag = &b.tag;
    assert_eq!(tag.token, backup::token_fingerprint(&saved.k3s_token));
    assert!(tag.bytes > 0);

    // The bytes, as a guest reads them off a disk made from the backup.
    let len = (tag.bytes as usize + 64 * 1024).div_ceil(512) * 512;
    let files = untar(&snapshot_bytes(&env, &b.name, len).await);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            backup::ARCHIVE_MANIFEST,
            backup::ARCHIVE_SNAPSHOT,
            backup::ARCHIVE_SHA256
        ]
    );
    let manifest: Manifest = serde_json::from_slice(&files[0].1).unwrap();
    let snapshot = &files[1].1;
    assert_eq!(snapshot.len() as u64, tag.bytes);
    let digest = backup::hex(&Sha256::digest(snapshot));
    assert_eq!(digest, tag.sha256);
    assert_eq!(
        String::from_utf8_lossy(&files[2].1),
        format!("{digest}  etcd-snapshot\n")
    );
    assert_eq!(manifest.tag(), *tag);
    assert_eq!(manifest.servers.len(), 3, "{:?}", manifest.servers);
    assert!(manifest.servers.iter().all(|s| s.private_ip.is_some()));
    assert!(manifest.servers.iter().any(|s| s.name == manifest.taken_on));
    assert!(manifest.spec.contains("cluster: demo"), "{}", manifest.spec);
    // A real etcd snapshot (bbolt file) holding the ConfigMap written before.
    let needle = b"written-before-the-backup";
    assert!(
        snapshot.windows(needle.len()).any(|w| w == needle),
        "the etcd snapshot lacks the ConfigMap"
    );

    no_ssh_private_key_in_any_secret(&client).await;

    // Audit security-2 N1 (fix 5): k3s keeps on-demand snapshots until someone deletes them,
    // and each is a plaintext copy of the datastore: the one read for the backup is deleted
    // from the server's snapshot directory (k3s's scheduled ones, if any, are k3s's).
    assert!(!stdout.contains("Left on"), "{stdout}");
    let dir = env
        .sim
        .boot()
        .node_dir(
            &manifest.taken_on,
            oxide_controller::workflows::backup::K3S_SNAPSHOT_DIR,
        )
        .unwrap();
    let on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    assert!(
        manifest.k3s_snapshot.starts_with("on-demand-")
            && !on_disk.iter().any(|f| f.starts_with("on-demand-")),
        "{} on {}: {on_disk:?}",
        manifest.k3s_snapshot,
        manifest.taken_on
    );

    // The spec's retention (in the live ConfigMap): the newest one only. A second backup
    // deletes the first.
    let state: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let mut live = state.get("oxide-controller").await.unwrap();
    let data = live.data.as_mut().unwrap();
    let spec = data.get_mut("spec.yaml").unwrap();
    let mut parsed = oxide_controller::domain::spec::ClusterSpec::from_yaml(spec).unwrap();
    parsed.backup.keep = 1;
    parsed.backup.keep_daily = 0;
    *spec = parsed.to_yaml();
    state
        .replace("oxide-controller", &PostParams::default(), &live)
        .await
        .unwrap();
    // A backup cut short left its temporary disk mid-import: the next one removes it.
    let leftover = backup::import_disk_name("demo-etcd-20261127-000000");
    let rack = env.rack("demo");
    {
        use oxide_controller::adapters::image::{self, ImageStore as _};
        rack.create_import_disk(
            &leftover,
            &image::import_disk_description("demo-etcd-20261127-000000", Some("demo")),
            1 << 30,
            512,
        )
        .await
        .unwrap();
        rack.bulk_write_start(&leftover).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = listed[0].name.clone();
    let out = backup_cmd(&env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("Retention deleted: {first}")),
        "{stdout}"
    );
    let listed = backups(&env).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_ne!(listed[0].name, first);
    let disks: Vec<String> = rack
        .list_disks()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert!(!disks.contains(&leftover), "{disks:?}");
    assert!(!disks.iter().any(|d| d.starts_with("import-")), "{disks:?}");

    // Delete keeps them, and says so; --delete-backups removes them.
    let out = env.delete("demo", &["--yes"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("--delete-backups"), "{stdout}");
    assert_eq!(backups(&env).await.len(), 1);
    let out = env.delete("demo", &["--yes", "--delete-backups"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(backups(&env).await.len(), 0);
}

/// Issue 45 (audit security-2 N1): a backup opened without the resume file. New clusters run
/// k3s `secrets-encryption`, so the archive a project collaborator can read off the rack holds
/// every Secret only as aescbc ciphertext (the key is in k3s's bootstrap data, sealed with the
/// server token, which is in the resume file and, encrypted, in the Secret): none of the
/// controller Secret's credentials and no tenant Secret value is in it, while the API serves
/// them all. (A restore with the resume file's token: the restore tests below, whose clusters
/// now encrypt, e.g. `every_server_lost_is_restored_from_the_in_cluster_schedules_backup_with_the_old_kubeconfig`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_read_off_the_rack_without_the_resume_file_holds_no_secret_value() {
    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let tenant: Api<Secret> = Api::namespaced(client.clone(), "default");
    let mut s = Secret::default();
    s.metadata.name = Some("tenant-db".into());
    s.string_data = Some([("password".to_owned(), "tenant-db-pass-5f0c9e".to_owned())].into());
    tenant.create(&PostParams::default(), &s).await.unwrap();

    let out = backup_cmd(&env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = backups(&env).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let len = (listed[0].tag.bytes as usize + 64 * 1024).div_ceil(512) * 512;
    let archive = snapshot_bytes(&env, &listed[0].name, len).await;
    let has = |needle: &[u8]| archive.windows(needle.len()).any(|w| w == needle);
    assert!(
        has(b"k8s:enc:aescbc:v1:aescbckey:"),
        "the backup holds no encrypted Secret"
    );

    // Every credential the API serves (so the same cluster reads them), absent from the bytes.
    let system: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let controller = system.get("oxide-controller").await.unwrap();
    let data = controller.data.unwrap_or_default();
    let credentials = [
        "oxide-token",
        "k3s-token",
        "k3s-agent-token",
        "tailscale-auth-key",
    ];
    let mut checked = Vec::new();
    for key in credentials {
        let Some(value) = data.get(key) else { continue };
        assert!(value.0.len() >= 8, "{key} is too short to search for");
        assert!(!has(&value.0), "{key} is in the backup in the clear");
        checked.push(key);
    }
    assert!(
        checked.contains(&"oxide-token") && checked.contains(&"k3s-token"),
        "{checked:?}"
    );
    // The webhook's serving key and its CA's key (issue 46), and its tokens (audit H1), in
    // their own Secrets.
    for (secret, key) in [
        ("oxide-controller-webhook-tls", "tls.key"),
        ("oxide-controller-webhook-ca", "ca.key"),
        ("oxide-controller-webhook-auth", "webhook-token"),
        ("oxide-controller-webhook-auth", "webhook-read-token"),
    ] {
        let data = system.get(secret).await.unwrap().data.unwrap_or_default();
        let value = &data[key].0;
        assert!(
            value.len() >= 8,
            "{secret} {key} is too short to search for"
        );
        assert!(!has(value), "{secret} {key} is in the backup in the clear");
    }
    let tenant_value = tenant.get("tenant-db").await.unwrap().data.unwrap()["password"]
        .0
        .clone();
    assert_eq!(tenant_value, b"tenant-db-pass-5f0c9e");
    assert!(
        !has(&tenant_value),
        "a tenant Secret is in the backup in the clear"
    );
    // What is not secret stays readable: the Secret's name, a ConfigMap's content.
    assert!(has(b"oxide-controller"));
}

/// Issue 36 §2: the checks a restore makes before it changes anything, each refusing with exit 2
/// and no mutating request: a cluster that still has servers, a backup that does not exist, and
/// a backup taken with another server token than the resume file's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_refuses_with_servers_left_an_unknown_backup_or_another_token_touching_nothing() {
    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let out = backup_cmd(&env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let refused = |out: &Output, words: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(words), "{words:?} not in: {stderr}");
    };
    let (out, made) = env
        .mutating_during(recover_cmd(&env, &["--backup", "latest", "--yes"]))
        .await;
    refused(&out, "still has servers");
    assert_eq!(made, vec![], "a refused restore changed the rack");

    let (out, made) = env
        .mutating_during(recover_cmd(
            &env,
            &["--backup", "demo-etcd-19990101-000000", "--yes"],
        ))
        .await;
    refused(&out, "no backup");
    assert_eq!(made, vec![]);

    // The resume file of another cluster's token (the backup is this cluster's).
    let path = env.state_dir().join("demo.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    doc["k3s-token"] = serde_json::Value::String("another-clusters-server-token".into());
    std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let (out, made) = env
        .mutating_during(recover_cmd(&env, &["--backup", "latest", "--yes"]))
        .await;
    refused(&out, "another server token");
    assert_eq!(
        made,
        vec![],
        "a restore with the wrong token changed the rack"
    );
}

/// The names of the project's instances, disks and floating IPs, each sorted.
async fn project_objects(env: &Env) -> [Vec<String>; 3] {
    let rack = env.rack("demo");
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let instances = rack.list_instances("").await.unwrap();
    let disks = rack.list_disks().await.unwrap();
    let fips = rack.list_floating_ips().await.unwrap();
    [
        sorted(instances.into_iter().map(|i| i.name).collect()),
        sorted(disks.into_iter().map(|d| d.name).collect()),
        sorted(fips.into_iter().map(|f| f.name).collect()),
    ]
}

/// Nodes through the kubeconfig bootstrap wrote: (name, Ready).
async fn nodes(env: &Env) -> Vec<(String, bool)> {
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    match tokio::time::timeout(Duration::from_secs(10), api.list(&Default::default())).await {
        Ok(Ok(list)) => list
            .into_iter()
            .map(|n| {
                let ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (n.metadata.name.unwrap_or_default(), ready)
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Issue 36's acceptance: every server lost with its disks; `recover --backup latest --yes`
/// brings back what the backup held (not what was written after it) with the old kubeconfig,
/// three Ready servers and a Ready worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_lost_is_restored_from_the_in_cluster_schedules_backup_with_the_old_kubeconfig()
 {
    // The simulator's kubelet runs the cluster's Job pods from the workspace's binaries: the
    // backup CronJob's too, on a server, reading k3s's snapshot directory through its hostPath.
    let env = common::env_with(oxide_sim::SimOptions {
        job_binaries: Some(common::workspace_binaries()),
        ..Default::default()
    })
    .await;
    env.run_ok(&["--workers", "1", "--backup-schedule", "@every 15s"])
        .await;
    // `bootstrap backup` from the laptop works beside the schedule (taken before the write).
    let out = backup_cmd(&env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("in-the-backup".into());
    cm.data = Some([("k".to_owned(), "v".to_owned())].into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let written = chrono::Utc::now();

    // k3s's scheduled snapshot after the write, uploaded by the in-cluster backup (no SSH).
    let scheduled = scheduled_backup_after(&env, &client, written).await;
    eprintln!("scheduled backup: {scheduled:?}");
    // Audit 4 finding 9: the schedule's backup counts the objects `bootstrap backup` counts,
    // and a drill of it compares them (the cluster itself untouched).
    let n = scheduled
        .tag
        .objects
        .unwrap_or_else(|| panic!("the scheduled backup counted no objects: {scheduled:?}"));
    let out = recover_cmd(&env, &["--verify", "--backup", &scheduled.name]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("objects: {n} restored, {n} in the backup")),
        "{stdout}"
    );
    no_ssh_private_key_in_any_secret(&client).await;
    // status.json shows it after a reconcile.
    let status = reconcile_status(&env).await;
    assert!(
        status["backup"]["lastSuccess"]["by"] == "schedule"
            && status["backup"]["lastSuccess"]["time"].as_str()
                >= Some(
                    &*scheduled
                        .tag
                        .time
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
        "{status}"
    );
    assert_eq!(status["backup"]["stale"], false, "{status}");
    assert_eq!(status["backup"]["schedule"], "@every 15s", "{status}");
    // The schedule stopped (a backup Job under way finishes first): the newest backup on the
    // rack, what `latest` takes, is the schedule's, taken after the write and before the next.
    suspend_backups(&client).await;
    let newest = backups(&env).await.remove(0);
    let report = backup_report(&client).await;
    assert_eq!(
        report
            .last_success
            .as_ref()
            .map(|l| (&l.name, l.by.as_str())),
        Some((&newest.name, "schedule")),
        "{report:?}"
    );
    assert!(newest.tag.time >= scheduled.tag.time);
    cm.metadata.name = Some("after-the-backup".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let chosen = "latest";

    let old_workers: Vec<String> = nodes(&env)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("demo-workers-"))
        .collect();
    assert_eq!(old_workers.len(), 1);
    // Every server and its disks gone.
    let rack = env.rack("demo");
    let servers = lose_every_server(&env).await;
    assert_eq!(servers.len(), 3, "{servers:?}");

    let (out, made) = env
        .mutating_during(recover_cmd(&env, &["--backup", chosen, "--dry-run"]))
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("rung 3") && stdout.contains("demo-etcd-"),
        "{stdout}"
    );
    assert_eq!(made, vec![], "--dry-run changed the rack");

    let started = std::time::Instant::now();
    let out = recover_cmd(&env, &["--backup", chosen, "--yes"]).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!(
        "restore took {:.1}s: {stdout}",
        started.elapsed().as_secs_f64()
    );
    assert!(stdout.contains("Reconcile: converged"), "{stdout}");
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    assert_eq!(
        cms.get("in-the-backup").await.unwrap().data.unwrap()["k"],
        "v"
    );
    assert!(cms.get_opt("after-the-backup").await.unwrap().is_none());
    // Past the node lifecycle controller's grace (20 s here): a Ready Node heartbeats, it is
    // not the snapshot's stale status.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let now = nodes(&env).await;
    let ready_servers = now
        .iter()
        .filter(|(n, r)| *r && n.starts_with("demo-control-plane-"))
        .count();
    let ready_workers = now
        .iter()
        .filter(|(n, r)| *r && n.starts_with("demo-workers-"))
        .count();
    assert_eq!((ready_servers, ready_workers), (3, 1), "{now:?}");
    // None of the lost servers' Nodes is left; the worker whose servers were all gone was
    // replaced (its agent could reach none of the new ones).
    assert!(
        now.iter()
            .all(|(n, _)| !servers.contains(n) && !old_workers.contains(n)),
        "{now:?}"
    );
    assert!(rack.get_instance(&old_workers[0]).await.unwrap().is_none());
}

/// The first backup of `demo` taken by the in-cluster schedule with a snapshot time after
/// `after`, once `backup.json` in the ConfigMap names it (waited for up to 180 s).
async fn scheduled_backup_after(
    env: &Env,
    client: &kube::Client,
    after: chrono::DateTime<chrono::Utc>,
) -> backup::Backup {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let report = backup_report(client).await;
        if let Some(last) = report.last_success.clone()
            && last.by == "schedule"
            && last.time > after
        {
            let listed = backups(env).await;
            let b = listed
                .into_iter()
                .find(|b| b.name == last.name)
                .unwrap_or_else(|| {
                    panic!(
                        "backup.json names {} but the rack has no such backup",
                        last.name
                    )
                });
            assert!(
                last.k3s_snapshot
                    .starts_with("etcd-snapshot-demo-control-plane-"),
                "{last:?}"
            );
            assert_eq!(b.tag.time, last.time);
            return b;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no scheduled backup after {after} within 180 s; backup.json: {report:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// `backup.json`, in ConfigMap `oxide-controller-backup` (the one object the backup account
/// writes: audit security-2 N4); the cluster's ConfigMap holds none.
async fn backup_report(client: &kube::Client) -> backup::BackupReport {
    let state: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let data = |name: &'static str| {
        let state = state.clone();
        async move { state.get(name).await.unwrap().data.unwrap_or_default() }
    };
    assert!(
        !data("oxide-controller").await.contains_key("backup.json"),
        "backup.json written into the cluster's ConfigMap"
    );
    data("oxide-controller-backup")
        .await
        .get("backup.json")
        .and_then(|j| backup::BackupReport::from_json(j))
        .unwrap_or_default()
}

/// Suspends the backup CronJob and waits until every Job it started has finished.
async fn suspend_backups(client: &kube::Client) {
    use k8s_openapi::api::batch::v1::{CronJob, Job};
    let ns = "oxide-controller-backup";
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), ns);
    cronjobs
        .patch(
            "oxide-controller-backup",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        // A Job the controller made just before the suspension shows up here too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let running: Vec<String> = jobs
            .list(&Default::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|j| {
                !j.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"
                        })
                    })
            })
            .filter_map(|j| j.metadata.name)
            .collect();
        if running.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "backup Jobs still running after 120 s: {running:?}"
        );
    }
}

/// One `reconcile-once` run from the laptop's kubeconfig; the status.json it wrote.
async fn reconcile_status(env: &Env) -> serde_json::Value {
    let bin = common::workspace_binaries().join("reconcile-once");
    let out = tokio::process::Command::new(bin)
        .args(["--kubeconfig", &env.kubeconfig().display().to_string()])
        .args(["--context", "demo", "--log-format", "json"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let state: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    let data = state.get("oxide-controller").await.unwrap().data.unwrap();
    serde_json::from_str(&data["status.json"]).unwrap()
}

/// Issue 36 §3: `recover --verify` restores the newest backup into a throw-away server while the
/// cluster runs, finds its API ready with the objects the backup counted, and leaves no
/// instance, disk or address behind; the cluster's own servers and API are untouched.
///
/// Issue 46 item 4, on the same cluster: the drill's result reaches `status.json` (a pass is
/// shown and is not Degraded); a drill of a corrupt backup (bits flipped in the rack's stored
/// snapshot) fails at once with the drill server's reason, leaves nothing behind, and the next
/// run makes the cluster Degraded with reason `DrillFailed`. Then a roll of the control plane
/// (a spec drift of the servers) waits for a backup taken after it was decided, and says so;
/// once `bootstrap backup` takes one, the roll makes its surge server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_drill_proves_the_backup_and_leaves_nothing_behind() {
    let env = env().await;
    // In-cluster backups on, on a schedule that never fires during the test: a roll waits for
    // a backup only when the cluster takes backups.
    env.run_ok(&["--workers", "1", "--backup-schedule", "0 0 1 1 *"])
        .await;
    let out = backup_cmd(&env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tag = backups(&env).await[0].tag.clone();
    assert!(tag.objects.is_some_and(|n| n > 10), "{tag:?}");

    let before = project_objects(&env).await;

    let out = recover_cmd(&env, &["--verify"]).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!("{stdout}");
    let n = tag.objects.unwrap();
    assert!(
        stdout.contains(&format!("objects: {n} restored, {n} in the backup")),
        "{stdout}"
    );
    assert!(
        stdout.contains("Everything the drill made is deleted"),
        "{stdout}"
    );
    // Nothing left behind; the cluster's own objects as they were.
    assert_eq!(project_objects(&env).await, before);
    // The drill server ran no kubelet: no Node of it ever joined the live cluster either.
    assert!(nodes(&env).await.iter().all(|(n, _)| !n.contains("drill")));
    assert_eq!(
        nodes(&env).await.iter().filter(|(_, r)| *r).count(),
        4,
        "the cluster's three servers and its worker are Ready"
    );
    // The pass is in status.json, and the cluster is not Degraded for it.
    let status = reconcile_status(&env).await;
    let drill = &status["backup"]["drill"];
    assert_eq!(drill["last"]["ok"], true, "{drill:#}");
    assert_eq!(drill["last"]["restoredObjects"], n, "{drill:#}");
    assert!(drill["lastSuccessAt"].is_string(), "{drill:#}");
    assert!(drill["problem"].is_null(), "{drill:#}");
    assert_eq!(
        degraded(&status),
        ("False".to_owned(), "AsExpected".to_owned())
    );

    // Bit rot in the backup's etcd snapshot, as the rack stores it.
    let newest = backups(&env).await[0].clone();
    corrupt_etcd_snapshot(&env, &newest).await;
    let out = recover_cmd(&env, &["--verify"]).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("etcd-restore"), "{stderr}");
    assert_eq!(
        project_objects(&env).await,
        before,
        "a failed drill leaves nothing behind"
    );
    let status = reconcile_status(&env).await;
    let drill = &status["backup"]["drill"];
    assert_eq!(drill["problem"], "DrillFailed", "{drill:#}");
    assert_eq!(drill["last"]["ok"], false, "{drill:#}");
    assert_eq!(drill["last"]["backup"], newest.name.as_str(), "{drill:#}");
    assert_eq!(drill["last"]["cleanedUp"], true, "{drill:#}");
    let (on, reason) = degraded(&status);
    assert_eq!((on.as_str(), reason.as_str()), ("True", "DrillFailed"));
    let message = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(&newest.name) && message.contains("etcd-restore"),
        "{message}"
    );

    // A roll of the control plane: the servers' spec drifts. The newest backup is from before
    // the roll was decided, so the roll waits and says why; no server is made.
    edit_spec(&env, |s| s.control_plane.cpus += 1).await;
    let status = reconcile_status(&env).await;
    let roll = &status["controlPlaneRoll"];
    let decided = roll["decidedAt"].as_str().unwrap().to_owned();
    let waiting = roll["waitingForBackup"].as_str().unwrap_or_default();
    assert!(waiting.starts_with("RollWaitsForBackup: "), "{roll:#}");
    assert!(
        waiting.contains("bootstrap backup --cluster demo"),
        "{waiting}"
    );
    assert!(
        status["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str() == Some(waiting)),
        "{status:#}"
    );
    assert_eq!(project_objects(&env).await, before, "no surge server yet");
    // A backup taken after the decision: the roll goes on with its surge server. Backup times
    // are whole seconds (k3s's snapshot names), so one taken in the decision's own second
    // does not count: the backup starts once the clock has passed that second (< 1 s).
    let decided_at = chrono::DateTime::parse_from_rfc3339(&decided).unwrap();
    let next_second_ms = (decided_at.timestamp() + 1) * 1000;
    let left = next_second_ms - chrono::Utc::now().timestamp_millis();
    if let Ok(left) = u64::try_from(left) {
        tokio::time::sleep(Duration::from_millis(left)).await;
    }
    let out = backup_cmd(&env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let taken = backup_report(&client).await.last_success.unwrap().time;
    assert!(
        taken > decided_at,
        "the backup {taken} is after the decision {decided}"
    );
    let status = reconcile_status(&env).await;
    let roll = &status["controlPlaneRoll"];
    assert_eq!(roll["decidedAt"], decided.as_str(), "{roll:#}");
    assert!(roll["waitingForBackup"].is_null(), "{roll:#}");
    let servers = |objects: &[Vec<String>; 3]| {
        objects[0]
            .iter()
            .filter(|n| n.starts_with("demo-control-plane-"))
            .count()
    };
    assert_eq!(
        servers(&project_objects(&env).await),
        servers(&before) + 1,
        "the surge server of the roll"
    );
}

/// Edits the live `spec.yaml` as a person would.
async fn edit_spec(env: &Env, f: impl Fn(&mut oxide_controller::domain::spec::ClusterSpec)) {
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let state: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    let mut cm = state.get("oxide-controller").await.unwrap();
    let data = cm.data.as_mut().unwrap();
    let mut spec =
        oxide_controller::domain::spec::ClusterSpec::from_yaml(&data["spec.yaml"]).unwrap();
    f(&mut spec);
    data.insert("spec.yaml".into(), spec.to_yaml());
    state
        .replace("oxide-controller", &PostParams::default(), &cm)
        .await
        .unwrap();
}

/// The Degraded condition's status and reason.
fn degraded(status: &serde_json::Value) -> (String, String) {
    let c = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap();
    (
        c["status"].as_str().unwrap().to_owned(),
        c["reason"].as_str().unwrap().to_owned(),
    )
}

/// Flips bytes in the middle of the etcd snapshot inside backup `b`'s archive, in the rack's
/// stored snapshot (the description, digest included, stays as it was).
async fn corrupt_etcd_snapshot(env: &Env, b: &backup::Backup) {
    let len = usize::try_from(b.tag.bytes).unwrap() + 64 * 1024;
    let archive = snapshot_bytes(env, &b.name, len).await;
    let mut at = 0;
    while archive[at] != 0 {
        let h = &archive[at..at + 512];
        let name = String::from_utf8_lossy(&h[..100])
            .trim_end_matches('\0')
            .to_owned();
        let size = usize::from_str_radix(
            std::str::from_utf8(&h[124..135])
                .unwrap()
                .trim_matches('\0'),
            8,
        )
        .unwrap();
        if name == backup::ARCHIVE_SNAPSHOT {
            let middle = (at + 512 + size / 2) as u64;
            assert!(env.sim.oxide().corrupt_snapshot(&b.name, middle, 64));
            return;
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    panic!("no {} in backup {}", backup::ARCHIVE_SNAPSHOT, b.name);
}

/// Server Nodes through the kubeconfig bootstrap wrote: (name, Ready, kubelet version).
async fn server_versions(env: &Env) -> Vec<(String, bool, String)> {
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    match tokio::time::timeout(Duration::from_secs(10), api.list(&Default::default())).await {
        Ok(Ok(list)) => list
            .into_iter()
            .filter(|n| {
                n.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("demo-control-plane-"))
            })
            .map(|n| {
                let status = n.status.unwrap_or_default();
                let ready = status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let version = status
                    .node_info
                    .map(|i| i.kubelet_version)
                    .unwrap_or_default();
                (n.metadata.name.unwrap_or_default(), ready, version)
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Every server of `demo` stopped and deleted with its disks; their names.
async fn lose_every_server(env: &Env) -> Vec<String> {
    let rack = env.rack("demo");
    let servers: Vec<String> = nodes(env)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("demo-control-plane-"))
        .collect();
    for n in &servers {
        rack.stop_instance(n).await.unwrap();
    }
    for n in &servers {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let i = rack.get_instance(n).await.unwrap().unwrap();
            if i.state == oxide_controller::domain::model::InstanceState::Stopped {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{n} never stopped");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        rack.delete_instance(n).await.unwrap();
    }
    for d in rack.list_disks().await.unwrap() {
        if servers.iter().any(|s| d.name.ends_with(s.as_str())) {
            rack.delete_disk(&d.name).await.unwrap();
        }
    }
    assert!(nodes(env).await.is_empty(), "the API still answers");
    servers
}

/// Audit 4 finding 3 (P3): bootstrap at v1.33 (the resume file's spec keeps it), `scale
/// upgrade` to v1.34, a backup, every server lost: the restore installs the backup's v1.34 (its
/// description records the control plane's release and image), not the resume file's v1.33,
/// which the simulator refuses as k3s's roll-back rules do (a v1.33 server under a datastore
/// v1.34 servers wrote). The cluster comes back converged at v1.34. Three servers, bootstrapped
/// at the first v1.33 whose etcd may take a 3.6 member (finding 2's gate), so one roll suffices.
///
/// Audit security-2 N6, on the same restore: the backup holds a retired key (an older
/// controller's `ssh-private-key`); after it was taken the Oxide token is rotated at the rack
/// and on the laptop and the webhook token in the Secret, as the README's rotation says. The
/// restore brings the backup's Secret back; recover writes the laptop's Oxide token into it and
/// the backup's rack Secret, replaces both webhook tokens (neither the backup's nor the rotated
/// one is left; the resume file has the new ones), removes the retired key, and says so on
/// stdout without printing any of those values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_after_an_upgrade_installs_the_backups_release() {
    const FROM: &str = "v1.33.7+k3s3";
    const TO: &str = "v1.34.1+k3s1";
    let env = env().await;
    env.run_ok(&[
        "--control-planes",
        "3",
        "--workers",
        "0",
        "--k3s-version",
        FROM,
    ])
    .await;
    // The simulator's release mirror, which the upgrade pre-flight checks (test traffic stays
    // on loopback), set in the live spec as a person would with `scale`'s config edit.
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let state: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let mut cm = state.get("oxide-controller").await.unwrap();
    let data = cm.data.as_mut().unwrap();
    let mut spec =
        oxide_controller::domain::spec::ClusterSpec::from_yaml(&data["spec.yaml"]).unwrap();
    spec.k3s.release_url.clone_from(&env.sim.release_url);
    // A minutes-old apiserver: the history window of the pre-flight is another test's subject.
    spec.upgrade.api_history_seconds = 0;
    data.insert("spec.yaml".into(), spec.to_yaml());
    state
        .replace("oxide-controller", &PostParams::default(), &cm)
        .await
        .unwrap();
    let scale = common::workspace_binaries().join("scale");
    let out = tokio::process::Command::new(&scale)
        .args(["--kubeconfig", &env.kubeconfig().display().to_string()])
        .args(["--context", "demo", "upgrade", "--to", TO])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "scale upgrade: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // reconcile-once runs from the laptop until the three servers are replaced by ones at TO.
    let bin = common::workspace_binaries().join("reconcile-once");
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    // What the runs did, for the message of a roll that never ends (the last run's stderr
    // alone says only that the API is gone, not how it went).
    let mut history = std::collections::VecDeque::new();
    for run in 1.. {
        let out = tokio::process::Command::new(&bin)
            .args(["--kubeconfig", &env.kubeconfig().display().to_string()])
            .args(["--context", "demo", "--log-format", "json"])
            .output()
            .await
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in common::notable_lines(&out.stderr) {
            history.push_back(format!("run {run}: {line}"));
            if history.len() > 80 {
                history.pop_front();
            }
        }
        let servers = server_versions(&env).await;
        if out.status.code() == Some(0)
            && servers.len() == 3
            && servers.iter().all(|(_, r, v)| *r && v == TO)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not upgraded to {TO} in 600 s: {servers:?}\n{}\nthe runs' warnings, errors and actions, newest last:\n{}",
            common::rack_summary(&env),
            history.iter().cloned().collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The resume file still says FROM: what the old restore installed.
    let resume: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.state_dir().join("demo.json")).unwrap())
            .unwrap();
    assert!(
        resume["spec"].as_str().is_some_and(|s| s.contains(FROM)),
        "{resume}"
    );

    // What a controller before issue 34 left in the Secret, and so in its backups; and one
    // before audit H1's fix, its webhook token.
    set_secret_keys(
        &client,
        "oxide-controller",
        &[
            ("ssh-private-key", "an older controller's key"),
            ("webhook-token", "an older controller's webhook token"),
        ],
    )
    .await;
    let out = backup_cmd(&env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tag = backups(&env).await[0].tag.clone();
    assert_eq!(
        (tag.k3s_version.as_str(), tag.image.as_deref()),
        (TO, Some(common::IMAGE)),
        "{tag:?}"
    );
    // Rotations after the backup, as the README does them.
    let mut backed_up = secret_data(&client, "kube-system", "oxide-controller").await;
    backed_up.extend(secret_data(&client, "kube-system", "oxide-controller-webhook-auth").await);
    const OXIDE_TOKEN: &str = "oxide-token-rotated-after-the-backup";
    const WEBHOOK_TOKEN: &str = "webhook-token-rotated-after-the-backup";
    env.rotate_oxide_token(OXIDE_TOKEN);
    set_secret_keys(&client, "oxide-controller", &[("oxide-token", OXIDE_TOKEN)]).await;
    set_secret_keys(
        &client,
        "oxide-controller-webhook-auth",
        &[("webhook-token", WEBHOOK_TOKEN)],
    )
    .await;
    lose_every_server(&env).await;

    let out = recover_cmd(&env, &["--backup", "latest", "--dry-run"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "k3s {TO} (the backup's release) on image {}",
            common::IMAGE
        )),
        "{stdout}"
    );
    let out = recover_cmd(&env, &["--backup", "latest", "--yes"]).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("recover: {stdout}");
    rotations_survive_the_restore(&env, &backed_up, WEBHOOK_TOKEN, &stdout, &stderr).await;
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Reconcile: converged"), "{stdout}");
    let servers = server_versions(&env).await;
    assert!(
        servers.len() == 3 && servers.iter().all(|(_, r, v)| *r && v == TO),
        "{servers:?}"
    );
}

/// Sets `pairs` in Secret `kube-system/<name>` (a merge patch, as `kubectl patch`).
async fn set_secret_keys(client: &kube::Client, name: &str, pairs: &[(&str, &str)]) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let data: serde_json::Map<String, serde_json::Value> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::json!(v)))
        .collect();
    secrets
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "stringData": data })),
        )
        .await
        .unwrap();
}

/// Secret `namespace/name`'s data as text.
async fn secret_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> std::collections::BTreeMap<String, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    secrets
        .get(name)
        .await
        .unwrap()
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

/// Audit security-2 N6: after `recover --backup` (whose output is `stdout`, `stderr`), the
/// restored Secret holds the laptop's Oxide token (the backup's rack Secret too), no retired
/// key and no webhook token (audit H1: the backup's, from an older controller, removed); Secret
/// `oxide-controller-webhook-auth` holds tokens that are neither the backup's (`backed_up`)
/// nor `rotated`; the resume file has the new tokens; stdout names each rotation; no value is
/// printed.
async fn rotations_survive_the_restore(
    env: &Env,
    backed_up: &std::collections::BTreeMap<String, String>,
    rotated: &str,
    stdout: &str,
    stderr: &str,
) {
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let now = secret_data(&client, "kube-system", "oxide-controller").await;
    assert!(
        !now.contains_key("webhook-token") && !now.contains_key("webhook-read-token"),
        "the backup's webhook token is back in the state Secret"
    );
    let now_auth = secret_data(&client, "kube-system", "oxide-controller-webhook-auth").await;
    let token = env.oxide_token().trim().to_owned();
    assert_ne!(backed_up["oxide-token"], token);
    assert_eq!(
        now["oxide-token"], token,
        "the backup's Oxide token is back\n{stdout}"
    );
    let rack = secret_data(&client, "oxide-controller-backup", "oxide-controller-rack").await;
    assert_eq!(
        rack["oxide-token"], token,
        "the backup pod's copy is the backup's"
    );
    assert!(
        !now.contains_key("ssh-private-key"),
        "the backup's retired key is back"
    );
    let resume: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.state_dir().join("demo.json")).unwrap())
            .unwrap();
    assert!(
        resume.get("restore-pending").is_none(),
        "the restore is still marked pending: {:?}",
        resume.get("restore-pending")
    );
    for key in ["webhook-token", "webhook-read-token"] {
        let new = &now_auth[key];
        assert!(
            new != &backed_up[key] && new != rotated,
            "{key} is an old one"
        );
        assert!(
            new.len() == 64 && new.bytes().all(|b| b.is_ascii_hexdigit()),
            "{key} is not a fresh token"
        );
        assert_eq!(
            resume[key].as_str(),
            Some(new.as_str()),
            "the resume file's {key}"
        );
    }
    for needle in [
        "the backup's Oxide token differed from the one this run used: replaced",
        "webhook tokens replaced",
        "retired key ssh-private-key removed",
        "the backup's state Secret held the webhook's tokens",
    ] {
        assert!(stdout.contains(needle), "{needle:?}: {stdout}");
    }
    let values = [
        &token,
        &backed_up["oxide-token"],
        &backed_up["webhook-token"],
        &backed_up["webhook-read-token"],
        &now_auth["webhook-token"],
        &now_auth["webhook-read-token"],
    ];
    for v in values {
        assert!(
            !stdout.contains(v.as_str()) && !stderr.contains(v.as_str()),
            "a secret value was printed"
        );
    }
}

/// Moves `status.json`'s `backup.watchingSince` an hour back: the state of a cluster whose runs
/// have watched its backups for an hour (no drill schedule's tick is an hour away).
async fn watched_for_an_hour(env: &Env) {
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let state: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    let mut cm = state.get("oxide-controller").await.unwrap();
    let data = cm.data.as_mut().unwrap();
    let mut status: serde_json::Value = serde_json::from_str(&data["status.json"]).unwrap();
    let since = chrono::Utc::now() - chrono::Duration::hours(1);
    status["backup"]["watchingSince"] = serde_json::json!(since.to_rfc3339());
    data.insert("status.json".into(), status.to_string());
    state
        .replace("oxide-controller", &PostParams::default(), &cm)
        .await
        .unwrap();
}

/// `reconcile-once` runs, one after the other, until `done` holds for the drill part of the
/// status one wrote (or `limit` passes). Returns that status and whether a run showed a drill
/// under way (`status.backup.drill.running`) before.
async fn reconcile_until(
    env: &Env,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> (serde_json::Value, Option<serde_json::Value>) {
    let deadline = std::time::Instant::now() + limit;
    let mut running = None;
    loop {
        let status = reconcile_status(env).await;
        let drill = &status["backup"]["drill"];
        if !drill["running"].is_null() {
            running = Some(drill["running"].clone());
        }
        if done(drill) {
            return (status, running);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no drill result within {limit:?}: {drill:#}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Issue 46 item 4: the scheduled drill with nobody at the keyboard. A one-server cluster with
/// a backup (`bootstrap backup`) and a drill schedule that is due, left to `reconcile-once`
/// runs: one run starts the drill (recorded running: server, backup, start) and returns; later
/// runs read the drill server's verdict off its serial console, record it passed with the
/// object count the backup recorded, and delete the server, its disks and its address. Then the
/// backup's stored snapshot rots: the drill at the schedule's next tick fails at the drill
/// server's `etcd-restore` step, the cluster is Degraded `DrillFailed` with that reason, and the
/// drill's things are gone again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_drills_the_newest_backup_on_schedule_and_leaves_nothing_behind() {
    let env = env().await;
    env.run_ok(&["--control-planes", "1", "--workers", "0"])
        .await;
    let out = backup_cmd(&env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let newest = backups(&env).await[0].clone();
    let n = newest.tag.objects.expect("the backup counted objects");
    let before = project_objects(&env).await;
    // Every minute; the runs have watched for an hour, so a tick came since: a drill is due.
    edit_spec(&env, |s| s.backup.drill_schedule = Some("* * * * *".into())).await;
    watched_for_an_hour(&env).await;

    let (status, running) =
        reconcile_until(&env, Duration::from_secs(120), |d| !d["last"].is_null()).await;
    let drill = &status["backup"]["drill"];
    let running = running.expect("a run showed the drill under way");
    let server = running["server"].as_str().unwrap();
    assert!(server.starts_with("demo-drill-"), "{running:#}");
    assert_eq!(running["backup"], newest.name.as_str(), "{running:#}");
    assert_eq!(drill["last"]["ok"], true, "{drill:#}");
    assert_eq!(drill["last"]["by"], "schedule", "{drill:#}");
    assert_eq!(drill["last"]["restoredObjects"], n, "{drill:#}");
    assert_eq!(drill["last"]["expectedObjects"], n, "{drill:#}");
    assert_eq!(drill["last"]["cleanedUp"], true, "{drill:#}");
    assert!(drill["running"].is_null(), "{drill:#}");
    assert!(drill["problem"].is_null(), "{drill:#}");
    assert_eq!(
        project_objects(&env).await,
        before,
        "nothing of the drill is left"
    );
    let first_started = drill["last"]["started"].as_str().unwrap().to_owned();

    // Bit rot in the backup; the next tick's drill restores it and fails.
    corrupt_etcd_snapshot(&env, &newest).await;
    let (status, _) = reconcile_until(&env, Duration::from_secs(120), |d| {
        d["last"]["started"].as_str() != Some(first_started.as_str())
    })
    .await;
    let drill = &status["backup"]["drill"];
    assert_eq!(drill["last"]["ok"], false, "{drill:#}");
    assert_eq!(drill["last"]["backup"], newest.name.as_str(), "{drill:#}");
    let reason = drill["last"]["reason"].as_str().unwrap();
    assert!(reason.contains("etcd-restore"), "{reason}");
    assert_eq!(drill["last"]["cleanedUp"], true, "{drill:#}");
    assert_eq!(drill["problem"], "DrillFailed", "{drill:#}");
    let (on, why) = degraded(&status);
    assert_eq!((on.as_str(), why.as_str()), ("True", "DrillFailed"));
    let message = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(&newest.name) && message.contains("etcd-restore"),
        "{message}"
    );
    assert_eq!(
        project_objects(&env).await,
        before,
        "nothing of the drill is left"
    );
}
