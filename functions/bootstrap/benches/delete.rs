//! Benchmark (prints, never asserts): wall time of deleting a 3+100 cluster through the
//! product's delete workflow against an in-process `oxide-sim` (preset `cluster:3:100`) with
//! 50 ms added to every Oxide request and a 2 s stop (`stopping` → `stopped`), next to the
//! critical path at the chosen concurrency: ⌈members / concurrency⌉ × (stop request + stop
//! time + delete request + disk delete request). Target: ≤ 1.5× that path.
//!
//! Run once: `cargo bench -p bootstrap --bench delete` (or `cargo test -p bootstrap --bench
//! delete` in the dev profile). `DELETE_BENCH_CONCURRENCY=8,16,32` picks the concurrencies,
//! `DELETE_BENCH_THREADS` the runtime threads shared by the simulator and the workflow (2).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_controller::workflows::delete::{
    self, Confirm, KubeInCluster, LocalFiles, Params, RemoveOptions,
};
use oxide_sim::oxide::{FaultSpec, RouteFault, Timings};
use oxide_sim::{Sim, SimOptions};

const LATENCY: Duration = Duration::from_millis(50);
const STOP: Duration = Duration::from_secs(2);
const CONTROL_PLANES: usize = 3;

/// The short mode CI runs (`OXIDE_BENCH_SHORT=1`): the same steps on smaller inputs, so a
/// benchmark that no longer runs fails the build.
fn short() -> bool {
    std::env::var_os("OXIDE_BENCH_SHORT").is_some()
}

/// Workers of the deleted cluster (10 in the short mode).
fn workers() -> usize {
    if short() { 10 } else { 100 }
}

fn main() {
    // `cargo test --benches` runs this too; keep that a smoke check.
    if std::env::args().any(|a| a == "--bench") || std::env::var_os("DELETE_BENCH").is_some() {
        bench();
    } else {
        println!("delete bench: pass --bench (cargo bench) to run it");
    }
}

fn bench() {
    let threads = std::env::var("DELETE_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let concurrencies: Vec<usize> = std::env::var("DELETE_BENCH_CONCURRENCY")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![delete::DEFAULT_CONCURRENCY]);
    println!(
        "delete {CONTROL_PLANES}+{} members, {} ms per Oxide request, stop takes {} s",
        workers(),
        LATENCY.as_millis(),
        STOP.as_secs()
    );
    println!(
        "{:>11} {:>9} {:>15} {:>7} {:>9} {:>9}",
        "concurrency", "wall s", "critical path s", "ratio", "requests", "mutating"
    );
    for c in concurrencies {
        rt.block_on(run(c));
    }
}

async fn run(concurrency: usize) {
    let preset = format!("cluster:{CONTROL_PLANES}:{}", workers())
        .parse()
        .unwrap();
    let sim = Sim::start(SimOptions {
        ssh_port: 0,
        preset: Some(preset),
        timings: Timings {
            stopping_to_stopped: STOP,
            ..Timings::default()
        },
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    let project = oxide_sim::harness::preset::PROJECT;
    let cluster = oxide_sim::harness::preset::CLUSTER;
    let members = sim.oxide().dump()["instances"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    let disks_per_member = sim.oxide().dump()["disks"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0)
        / members.max(1);
    sim.faults().set(FaultSpec {
        routes: BTreeMap::from([(
            "*".to_owned(),
            RouteFault {
                latency_ms: LATENCY.as_millis() as u64,
                ..RouteFault::default()
            },
        )]),
        ..FaultSpec::default()
    });
    let rack = OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        project,
        RackOptions::default(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let params = Params {
        cluster,
        project,
        dry_run: false,
        confirm: Confirm::Yes,
        delete_images: false,
        delete_backups: false,
        delete_project: false,
        holder: "bench",
        tty: false,
    };
    let opts = RemoveOptions {
        concurrency,
        ..RemoveOptions::default()
    };
    let local = LocalFiles {
        kubeconfig: dir.path().join("none.yaml"),
        resume: dir.path().join("none.json"),
    };
    sim.oxide().reset_counters();
    let started = Instant::now();
    // Oxide alone: the cluster's API plays no part in the time of the rack work.
    let summary = delete::run_with::<_, KubeInCluster>(&rack, None, None, &params, &opts, &local)
        .await
        .unwrap();
    let wall = started.elapsed();
    let left = sim.oxide().dump()["instances"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    assert_eq!(left, 0, "{}", summary.render());
    let counters = sim.oxide().counters();
    let requests: u64 = counters.values().sum();
    let mutating: u64 = counters
        .iter()
        .filter(|(k, _)| !k.starts_with("GET "))
        .map(|(_, n)| n)
        .sum();
    // Disks of one member are deleted together, so they cost one request time.
    let per_member = LATENCY
        + STOP
        + LATENCY
        + if disks_per_member > 0 {
            LATENCY
        } else {
            Duration::ZERO
        };
    let waves = members.div_ceil(concurrency) as u32;
    let critical = per_member * waves;
    println!(
        "{concurrency:>11} {:>9.2} {:>15.2} {:>7.2} {requests:>9} {mutating:>9}",
        wall.as_secs_f64(),
        critical.as_secs_f64(),
        wall.as_secs_f64() / critical.as_secs_f64()
    );
    sim.shutdown();
}
