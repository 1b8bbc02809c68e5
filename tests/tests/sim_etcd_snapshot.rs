//! k3s's on-demand etcd snapshot in the simulator: `k3s etcd-snapshot save` over SSH on a
//! server writes a real etcd snapshot of the cluster's etcd (etcd's own snapshot stream: the
//! member's bbolt database followed by its sha256) to k3s's default path on the VM's disk,
//! where `cat` reads it back; `k3s etcd-snapshot delete NAME` removes it. With k3s stopped
//! there is no etcd to snapshot and no server to delete one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::SocketAddr;
use std::time::Duration;

use oxide_controller::adapters::ssh::{self, CommandOutput, HostKeyPins, SshTarget};
use serde_json::json;
use sha2::{Digest, Sha256};

use sim_support::*;

const TOKEN: &str = "server-secret-snapshot-01";
const SERVER: &str = "c1-cp-aaaaa";

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

#[tokio::test]
async fn etcd_snapshot_save_writes_a_real_etcd_snapshot_at_k3s_default_path() {
    let sim = start().await;
    let c = client(&sim);
    let key = ssh::generate_ed25519();
    let public = key.authorized_key_line("test").unwrap();
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    let ud = user_data(
        "server",
        &first_server_config(TOKEN, "agent-secret-1", &[fip]),
        std::slice::from_ref(&public),
    );
    create_instance(&c, SERVER, &ud).await;
    wait_node_status(&sim, SERVER, "True").await;
    attach_floating_ip(&c, "c1-apiserver", SERVER).await;
    sim.kube()
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kept-in-the-snapshot", "namespace": "default"},
            "data": {"written": "before the snapshot"}}))
        .await
        .unwrap();

    let pins = HostKeyPins::from_console(&console(&c, SERVER).await).unwrap();
    let target = SshTarget::new(SocketAddr::new(fip, SSH_PORT), "ubuntu", key, pins);
    let (status, _, log) = run(&target, "sudo -n k3s etcd-snapshot save").await;
    assert_eq!(status, 0, "{log}");
    // The CLI names the snapshot it saved; k3s writes it under `${datadir}/server/db/snapshots`
    // as `<name>-<node name>-<unix seconds>`, name `on-demand`.
    let name = log
        .lines()
        .find_map(|l| {
            l.split_once("msg=\"Snapshot ")
                .and_then(|(_, rest)| rest.strip_suffix(" saved.\""))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no 'Snapshot … saved.' line: {log}"));
    let path = format!("/var/lib/rancher/k3s/server/db/snapshots/{name}");
    let file = name
        .strip_prefix("on-demand-")
        .unwrap_or_else(|| panic!("{name}"));
    let (node, ts) = file.rsplit_once('-').unwrap();
    assert_eq!(node, SERVER);
    let ts: i64 = ts.parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - ts).abs() < 120, "{ts}");
    // The server logs where it saved it.
    wait_console(&c, SERVER, &format!("Saving etcd snapshot to {path}")).await;

    let (status, snap, err) = run(&target, &format!("sudo -n cat {path}")).await;
    assert_eq!(status, 0, "{err}");
    // etcd's snapshot stream: a bbolt file (pages of 4 KiB here, the meta page's magic
    // 0xED0CDAED after the 16-byte page header) followed by the sha256 of those bytes, which
    // is what etcdutl's restore checks (`hasChecksum`: size % 512 == 32).
    assert!(snap.len() > 4096, "{} bytes", snap.len());
    assert_eq!(snap.len() % 512, 32, "{} bytes", snap.len());
    let (db, sum) = snap.split_at(snap.len() - 32);
    assert_eq!(Sha256::digest(db).as_slice(), sum, "the appended sha256");
    assert_eq!(&db[16..20], &0xED0C_DAEDu32.to_le_bytes(), "bbolt magic");
    // The ConfigMap written before is in the database.
    assert!(
        db.windows(b"kept-in-the-snapshot".len())
            .any(|w| w == b"kept-in-the-snapshot"),
        "the ConfigMap's key is in the snapshot"
    );

    // No schedule in its config: k3s's default (`0 */12 * * *`) took no snapshot meanwhile, and
    // etcd's `.part` file was renamed away.
    let dir = sim
        .boot()
        .node_dir(SERVER, "/var/lib/rancher/k3s/server/db/snapshots")
        .unwrap();
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    assert_eq!(files, std::slice::from_ref(&name));

    // One snapshot at a time (audit day2-fidelity-4 M6): while a slow save holds k3s's
    // snapshot lock, a second one fails as k3s's `Snapshot` refuses it, and the first ends well.
    sim.faults().update(|f| {
        f.slow_snapshots.insert(SERVER.into(), 2000);
    });
    let first = {
        let target = target.clone();
        tokio::spawn(async move { run(&target, "sudo -n k3s etcd-snapshot save").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _, log) = run(&target, "sudo -n k3s etcd-snapshot save").await;
    assert_eq!(status, 1, "{log}");
    assert!(
        log.contains("level=fatal") && log.contains("snapshot save already in progress"),
        "{log}"
    );
    let (status, _, log) = first.await.unwrap();
    assert_eq!(status, 0, "{log}");
    assert!(log.contains(" saved."), "{log}");
    sim.faults().update(|f| f.slow_snapshots.clear());

    // `k3s etcd-snapshot delete NAME` (audit security-2 N1 fix 5): the server removes the file
    // and logs it; the CLI says "Snapshot NAME deleted.". A name with no file: exit 0 all the
    // same, with k3s's warning "Snapshot NAME not found.".
    let delete = format!("sudo -n k3s etcd-snapshot delete {name}");
    let (status, _, log) = run(&target, &delete).await;
    assert_eq!(status, 0, "{log}");
    assert!(
        log.contains(&format!("level=info msg=\"Snapshot {name} deleted.\"")),
        "{log}"
    );
    assert!(!dir.join(&name).exists(), "{name} is still on the disk");
    let (status, _, err) = run(&target, &format!("sudo -n cat {path}")).await;
    assert_eq!(status, 1, "{err}");
    wait_console(&c, SERVER, &format!("Snapshot {name} deleted locally")).await;
    let (status, _, log) = run(&target, &delete).await;
    assert_eq!(status, 0, "{log}");
    assert!(
        log.contains(&format!("level=warning msg=\"Snapshot {name} not found.\"")),
        "{log}"
    );
    wait_console(&c, SERVER, &format!("Snapshot {name} not found locally")).await;

    // Without k3s running there is no etcd to snapshot, and nothing is written.
    assert_eq!(run(&target, "sudo -n systemctl stop k3s").await.0, 0);
    let (status, _, log) = run(&target, "sudo -n k3s etcd-snapshot save").await;
    assert_eq!(status, 1, "{log}");
    assert!(log.contains("level=fatal"), "{log}");
    assert!(!log.contains(" saved."), "{log}");
    let (status, _, log) = run(&target, &delete).await;
    assert_eq!(status, 1, "{log}");
    assert!(log.contains("level=fatal"), "{log}");
}
