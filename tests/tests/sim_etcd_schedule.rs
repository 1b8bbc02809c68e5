//! k3s's scheduled etcd snapshots in the simulator: a server with
//! `etcd-snapshot-schedule-cron` takes real etcd snapshots of its member on that schedule into
//! `${datadir}/server/db/snapshots/etcd-snapshot-<node>-<unix seconds>` (mode 0600, written
//! as `.part` and renamed), `etcd-snapshot-retention` keeps the newest of them, and the
//! schedule ends with k3s (`systemctl stop k3s`); `etcd-disable-snapshots` takes none.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use oxide_controller::adapters::ssh::{self, HostKeyPins, SshTarget};
use serde_json::json;
use sha2::{Digest, Sha256};
use sim_support::*;

const SNAPSHOT_DIR: &str = "/var/lib/rancher/k3s/server/db/snapshots";
const SCHEDULED: &str = "c1-cp-sched";
const DISABLED: &str = "c2-cp-nosnap";

/// The files of `dir` (none when it does not exist).
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A file as etcd's snapshot stream makes it: a bbolt database (meta page magic 0xED0CDAED
/// after the 16-byte page header) followed by the sha256 of those bytes.
fn assert_etcd_snapshot(snap: &[u8], what: &str) {
    assert!(snap.len() > 4096, "{what}: {} bytes", snap.len());
    assert_eq!(snap.len() % 512, 32, "{what}: {} bytes", snap.len());
    let (db, sum) = snap.split_at(snap.len() - 32);
    assert_eq!(Sha256::digest(db).as_slice(), sum, "{what}: the sha256");
    assert_eq!(&db[16..20], &0xED0C_DAEDu32.to_le_bytes(), "{what}: magic");
    assert!(
        db.windows(b"written-before-the-schedule".len())
            .any(|w| w == b"written-before-the-schedule"),
        "{what}: the ConfigMap is in it"
    );
}

#[tokio::test]
async fn a_scheduled_server_keeps_its_newest_real_snapshots_and_a_disabled_one_takes_none() {
    let sim = start().await;
    let c = client(&sim);
    let scheduled = format!(
        "{}etcd-snapshot-schedule-cron: \"@every 1s\"\netcd-snapshot-retention: 2\n",
        first_server_config("server-secret-sched-1", "agent-secret-1", &[])
    );
    let key = ssh::generate_ed25519();
    let public = key.authorized_key_line("test").unwrap();
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    let id = create_instance(
        &c,
        SCHEDULED,
        &user_data("server", &scheduled, std::slice::from_ref(&public)),
    )
    .await;
    // Its cluster first: `sim.kube()` is the first cluster created.
    wait_node_status(&sim, SCHEDULED, "True").await;
    attach_floating_ip(&c, "c1-apiserver", SCHEDULED).await;
    // A cluster of its own: the schedule would fire every second, but snapshots are off.
    let disabled = format!(
        "{}etcd-snapshot-schedule-cron: \"@every 1s\"\netcd-disable-snapshots: true\n",
        first_server_config("server-secret-sched-2", "agent-secret-2", &[])
    );
    let off = create_instance(&c, DISABLED, &user_data("server", &disabled, &[])).await;
    sim.kube()
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "written-before-the-schedule", "namespace": "default"}}))
        .await
        .unwrap();
    let dir = sim.boot().node_dir(SCHEDULED, SNAPSHOT_DIR).unwrap();

    // Watch the directory until a third scheduled snapshot exists and retention has pruned
    // to two: every name seen is k3s's, and no reader ever sees a partial snapshot file.
    let ours = format!("etcd-snapshot-{SCHEDULED}-");
    let seen = std::cell::RefCell::new(BTreeSet::new());
    let kept = wait_for("three scheduled snapshots, two kept", || {
        let (dir, seen, ours) = (&dir, &seen, &ours);
        async move {
            let mut seen = seen.borrow_mut();
            let now = names(dir);
            for name in &now {
                let base = name.strip_suffix(".part").unwrap_or(name);
                let ts: i64 = base
                    .strip_prefix(ours.as_str())
                    .unwrap_or_else(|| panic!("{name} is not a scheduled snapshot of {SCHEDULED}"))
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}"));
                assert!((chrono::Utc::now().timestamp() - ts).abs() < 60, "{name}");
                if !name.ends_with(".part") {
                    seen.insert(name.clone());
                }
            }
            let done: BTreeSet<String> =
                now.into_iter().filter(|n| !n.ends_with(".part")).collect();
            (seen.len() >= 3 && done.len() == 2).then_some(done)
        }
    })
    .await;
    let seen = seen.into_inner();
    // The two kept are the newest two ever taken.
    let newest: BTreeSet<String> = seen.iter().rev().take(2).cloned().collect();
    assert_eq!(kept, newest, "seen: {seen:?}");
    for name in &kept {
        let file = dir.join(name);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
        assert_etcd_snapshot(&std::fs::read(&file).unwrap(), name);
        // What `cat` over SSH reads: the same file.
        let path = format!("{SNAPSHOT_DIR}/{name}");
        assert_eq!(sim.boot().uploaded_file(id, &path), Some(file));
    }
    for pruned in seen.difference(&kept) {
        let path = format!("{SNAPSHOT_DIR}/{pruned}");
        assert_eq!(sim.boot().uploaded_file(id, &path), None, "{pruned}");
    }
    let log = console(&c, SCHEDULED).await;
    let newest_name = kept.iter().next_back().unwrap();
    assert!(
        log.contains(&format!(
            "Saving etcd snapshot to {SNAPSHOT_DIR}/{newest_name}"
        )),
        "{log}"
    );
    let oldest_pruned = seen.iter().next().unwrap();
    assert!(
        log.contains(&format!(
            "Removing local snapshot {SNAPSHOT_DIR}/{oldest_pruned}"
        )),
        "{log}"
    );
    assert!(log.contains(&format!(
        "Applying snapshot retention=2 to local snapshots with prefix etcd-snapshot in {SNAPSHOT_DIR}"
    )));

    // The disabled server, up all this time, took none.
    wait_for("the second server to join", || async {
        sim.boot().joined_node(off)
    })
    .await;
    let off_dir = sim.boot().node_dir(DISABLED, SNAPSHOT_DIR).unwrap();
    assert_eq!(names(&off_dir), BTreeSet::new());

    // The schedule lives in the k3s process: once `systemctl stop k3s` returned, it neither
    // writes nor tries again (a schedule left running would log a failed snapshot).
    let pins = HostKeyPins::from_console(&console(&c, SCHEDULED).await).unwrap();
    let target = SshTarget::new(SocketAddr::new(fip, SSH_PORT), "ubuntu", key, pins);
    let stopped = target.exec("sudo -n systemctl stop k3s").await.unwrap();
    assert_eq!(stopped.exit_status, 0);
    let tries = |log: &str| {
        log.matches("Saving etcd snapshot to").count()
            + log.matches("Failed to take scheduled snapshot").count()
    };
    let before = tries(&console(&c, SCHEDULED).await);
    let at_stop = names(&dir);
    // Longer than a period plus k3s's largest jitter (5 s).
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(names(&dir), at_stop);
    assert_eq!(tries(&console(&c, SCHEDULED).await), before);
    assert_eq!(names(&off_dir), BTreeSet::new());
}
