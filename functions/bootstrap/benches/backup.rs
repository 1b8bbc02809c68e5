//! Benchmark: backup and restore of a cluster whose etcd holds ~100 MB of objects, with the real
//! `bootstrap` binary against an in-process `oxide-sim` whose servers run a real control plane
//! (issue 36's acceptance). Bootstraps `demo` (1 server, 1 worker), writes ConfigMaps of
//! 900 KiB of random bytes each through the kube API, then:
//!
//! - `bootstrap backup`: wall seconds, the etcd snapshot's bytes (the backup's tag), the Oxide
//!   requests it made (all, and mutating), the bulk writes and the bytes they carried (the
//!   simulator's counters before and after);
//! - every server stopped and deleted with its disks, then `bootstrap recover --backup latest
//!   --yes`: the seconds to `/readyz` the command reports, and its wall seconds.
//!
//! It fails loudly when the flow is broken: every command must exit 0, and after the restore
//! the first and the last ConfigMap written before the backup must be back byte for byte, and
//! all of them listed.
//!
//! Run: `cargo bench -p bootstrap --bench backup` (CI: `OXIDE_BENCH_SHORT=1`, 8x fewer
//! objects, dev profile). The control plane binary is `$OXIDE_CONTROLLER_KCP`, or built as for
//! the end-to-end tests. `cargo test --benches` only prints how to run it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, Instant};

use common::Env;
use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use oxide_controller::domain::backup;
use oxide_controller::domain::model::InstanceState;
use oxide_controller::ports::rack::Rack as _;

/// Random bytes per ConfigMap: under the apiserver's 1 MiB limit on a ConfigMap's data.
const OBJECT_BYTES: usize = 900 * 1024;
/// ConfigMaps of the full run (~100 MB); the short mode writes 8x fewer.
const OBJECTS: usize = 110;
const LABEL: &str = "bench=backup";

fn short() -> bool {
    std::env::var_os("OXIDE_BENCH_SHORT").is_some()
}

fn main() {
    // `cargo test --benches` runs this too; keep that a smoke check.
    if std::env::args().any(|a| a == "--bench") || std::env::var_os("BACKUP_BENCH").is_some() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(bench());
    } else {
        println!("backup bench: pass --bench (cargo bench) to run it");
    }
}

/// Incompressible bytes (xorshift), different per `seed`.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn object(i: usize) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(format!("bench-{i:04}"));
    cm.metadata.labels = Some(BTreeMap::from([("bench".to_owned(), "backup".to_owned())]));
    cm.binary_data = Some(BTreeMap::from([(
        "data".to_owned(),
        ByteString(pseudo_random(OBJECT_BYTES, i as u64 + 1)),
    )]));
    cm
}

/// `bootstrap <sub> --cluster demo` with this user's files, plus `extra`, within 900 s.
async fn sub(env: &Env, sub: &str, extra: &[&str]) -> Output {
    let args = env.sub_args(sub, "demo", extra);
    let out = tokio::time::timeout(Duration::from_secs(900), env.command(&args).output())
        .await
        .unwrap_or_else(|_| panic!("bootstrap {sub} ran for 900 s"))
        .unwrap();
    assert!(
        out.status.success(),
        "bootstrap {sub} exited {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The simulator's counters: (all requests, mutating requests, bulk writes, bytes written).
fn counted(env: &Env) -> (u64, u64, u64, u64) {
    let c = env.sim.oxide().counters();
    let bulk = env.sim.oxide().bulk_write_stats();
    (
        c.values().sum(),
        c.iter()
            .filter(|(k, _)| !k.starts_with("GET "))
            .map(|(_, n)| n)
            .sum(),
        bulk.writes,
        bulk.bytes,
    )
}

fn since(before: (u64, u64, u64, u64), after: (u64, u64, u64, u64)) -> (u64, u64, u64, u64) {
    (
        after.0 - before.0,
        after.1 - before.1,
        after.2 - before.2,
        after.3 - before.3,
    )
}

/// Stops, deletes and removes the disks of every server of `demo` (as losing them all would).
async fn lose_every_server(env: &Env) {
    let rack = env.rack("demo");
    let servers: Vec<String> = rack
        .list_instances("demo-control-plane-")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert!(!servers.is_empty(), "no server to lose");
    for n in &servers {
        rack.stop_instance(n).await.unwrap();
    }
    for n in &servers {
        let deadline = Instant::now() + Duration::from_secs(300);
        while rack.get_instance(n).await.unwrap().unwrap().state != InstanceState::Stopped {
            assert!(Instant::now() < deadline, "{n} never stopped");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        rack.delete_instance(n).await.unwrap();
    }
    for d in rack.list_disks().await.unwrap() {
        if servers.iter().any(|s| d.name.ends_with(s.as_str())) {
            rack.delete_disk(&d.name).await.unwrap();
        }
    }
}

/// The seconds in recover's "The API was ready N s after the first call." line.
fn ready_after(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("The API was ready ")?
                .split_once("s after the first call")?
                .0
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("recover did not say when the API was ready:\n{stdout}"))
}

async fn bench() {
    let objects = if short() { OBJECTS / 8 } else { OBJECTS };
    let env = common::env().await;
    let started = Instant::now();
    env.run_ok(&["--control-planes", "1", "--workers", "1"])
        .await;
    let bootstrap_s = started.elapsed().as_secs_f64();

    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let started = Instant::now();
    futures::stream::iter(0..objects)
        .for_each_concurrent(4, |i| {
            let cms = cms.clone();
            async move {
                cms.create(&PostParams::default(), &object(i))
                    .await
                    .unwrap_or_else(|e| panic!("ConfigMap {i}: {e}"));
            }
        })
        .await;
    let fill_s = started.elapsed().as_secs_f64();
    let payload = (objects * OBJECT_BYTES) as u64;

    let before = counted(&env);
    let started = Instant::now();
    let out = sub(&env, "backup", &[]).await;
    let backup_s = started.elapsed().as_secs_f64();
    let (requests, mutating, writes, written) = since(before, counted(&env));
    let backup_out = String::from_utf8_lossy(&out.stdout).into_owned();
    let snaps = env.rack("demo").list_snapshots().await.unwrap();
    let backups = backup::of_cluster(
        "demo",
        snaps
            .iter()
            .map(|s| (s.name.as_str(), s.description.as_str())),
    );
    assert_eq!(backups.len(), 1, "{backups:?}\n{backup_out}");
    let snapshot_bytes = backups[0].tag.bytes;
    // The etcd snapshot holds every object, and the archive holding it was written in full.
    assert!(
        snapshot_bytes >= payload,
        "an etcd snapshot of {snapshot_bytes} bytes cannot hold {payload} bytes of objects"
    );
    assert!(
        written >= snapshot_bytes,
        "{written} bytes written for a {snapshot_bytes}-byte snapshot"
    );

    lose_every_server(&env).await;
    let before = counted(&env);
    let started = Instant::now();
    let out = sub(
        &env,
        "recover",
        &[
            "--backup",
            "latest",
            "--yes",
            "--api-timeout",
            "300",
            "--wait",
            "600",
        ],
    )
    .await;
    let recover_s = started.elapsed().as_secs_f64();
    let (r_requests, r_mutating, _, _) = since(before, counted(&env));
    let recover_out = String::from_utf8_lossy(&out.stdout).into_owned();
    let readyz_s = ready_after(&recover_out);
    assert!(
        recover_out.contains("Reconcile: converged"),
        "{recover_out}"
    );

    // What the backup held is back.
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in [0, objects - 1] {
        let got = cms.get(&format!("bench-{i:04}")).await.unwrap();
        assert!(
            got.binary_data.unwrap()["data"].0 == pseudo_random(OBJECT_BYTES, i as u64 + 1),
            "ConfigMap bench-{i:04} came back with other bytes"
        );
    }
    let listed = cms
        .list_metadata(&ListParams::default().labels(LABEL))
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(listed, objects, "ConfigMaps after the restore");

    let mb = |b: u64| b as f64 / 1e6;
    println!();
    println!(
        "backup and restore, 1 server + 1 worker, oxide-sim in-process, {} build{}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        if short() { ", short mode" } else { "" }
    );
    println!("  bootstrap                  {bootstrap_s:>8.1} s");
    println!(
        "  fill etcd                  {fill_s:>8.1} s   {objects} ConfigMaps x {} KiB random = {:.1} MB",
        OBJECT_BYTES / 1024,
        mb(payload)
    );
    println!("  backup                     {backup_s:>8.1} s wall");
    println!(
        "    etcd snapshot            {:>8.1} MB ({snapshot_bytes} bytes)",
        mb(snapshot_bytes)
    );
    println!("    Oxide requests           {requests:>8} ({mutating} mutating)");
    println!(
        "    bulk writes              {writes:>8} ({written} bytes written, {:.1} MB/s over the backup)",
        mb(written) / backup_s
    );
    for line in backup_out.lines().filter(|l| l.starts_with("Written:")) {
        println!("    product says             {line}");
    }
    println!("  restore to /readyz         {readyz_s:>8.1} s");
    println!(
        "  recover, whole command     {recover_s:>8.1} s wall ({r_requests} Oxide requests, {r_mutating} mutating)"
    );
    println!(
        "  checked: exit codes 0, bench-0000 and bench-{:04} byte-identical, {listed} ConfigMaps back",
        objects - 1
    );
    env.sim.shutdown();
}
