#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Issue 3 figures for the real `reconcile-once` binary against `oxide-sim` (benchmark code
//! may panic on setup failure). Prints a table with the targets; asserts nothing.
//!
//! - no-op reconcile of 3 control-plane + 1,000 workers, 5 ms latency on every Oxide request:
//!   total API requests (Oxide + Kubernetes; target ≤ 12), wall time (≤ 1 s), peak RSS (≤ 64 MB);
//! - scale 0 → 100 workers with 50 ms create latency: time to issue all creates
//!   (≤ 1.3 × ⌈100/concurrency⌉ × 50 ms);
//! - process start to first request (≤ 15 ms).
//!
//! Run: `cargo bench -p reconcile-once --bench reconcile`; with `OXIDE_BENCH_SHORT=1` (CI) it
//! runs the same steps at 30 workers and a scale-up of 24, so a benchmark that no longer runs
//! fails the build (its figures then say nothing about the targets).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::domain::spec::{ClusterSpec, ExternalIpMode};
use oxide_controller::ports::state::{self, StateStore};
use oxide_sim::harness::preset::Preset;
use oxide_sim::oxide::RouteFault;
use oxide_sim::{Sim, SimHandle, SimOptions};

const BIN: &str = env!("CARGO_BIN_EXE_reconcile-once");

/// The short mode CI runs (`OXIDE_BENCH_SHORT=1`).
fn short() -> bool {
    std::env::var_os("OXIDE_BENCH_SHORT").is_some()
}

async fn start_sim(workers: u32) -> (SimHandle, KubeStateStore) {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 3,
            workers,
        }),
        ..SimOptions::default()
    })
    .await
    .expect("sim");
    let kc = sim.kubeconfig.clone().expect("kubeconfig");
    let client = oxide_controller::adapters::kubeclient::client(Some(&kc), None)
        .await
        .expect("client");
    (sim, KubeStateStore::new(client, "kube-system"))
}

async fn edit(store: &KubeStateStore, f: impl Fn(&mut ClusterSpec)) {
    let snap = store.read_config().await.expect("read");
    let mut spec = ClusterSpec::from_yaml(snap.spec_yaml().expect("spec")).expect("spec");
    f(&mut spec);
    let mut data = snap.data.clone();
    data.insert(state::keys::SPEC.into(), spec.to_yaml());
    store
        .replace_config(&snap.resource_version, data)
        .await
        .expect("replace");
}

fn run(kc: &Path, extra: &[&str]) -> (std::process::ExitStatus, Duration, u64) {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .arg("--kubeconfig")
        .arg(kc)
        .args(["--log-format", "json"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    loop {
        if let Ok(s) = std::fs::read_to_string(&status_path)
            && let Some(kb) = s
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(status) = child.try_wait().expect("wait") {
            return (status, start.elapsed(), peak_kb);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn total_requests(sim: &SimHandle) -> u64 {
    sim.oxide().counters().values().sum::<u64>() + sim.kube().counters().values().sum::<u64>()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let (workers, samples_n, scale_to, starts) = if short() {
        (30u32, 2usize, 24u32, 3usize)
    } else {
        (1000, 5, 100, 10)
    };

    // --- no-op reconcile of 3 + 1,000 -------------------------------------------------------
    let (sim, store) = rt.block_on(start_sim(0));
    let kc = sim.kubeconfig.clone().expect("kubeconfig");
    rt.block_on(edit(&store, |s| {
        s.worker_pools[0].max = workers;
        s.worker_pools[0].count = workers;
        // A /24 of loopback addresses holds 253 ephemeral IPs: workers go without.
        s.nodes.external_ip = ExternalIpMode::None;
    }));
    let setup = Instant::now();
    let mut converged = false;
    for _ in 0..60 {
        let (status, _, _) = run(&kc, &["--concurrency", "64"]);
        assert!(status.success() || status.code() == Some(1));
        let (status, _, _) = run(&kc, &["--dry-run"]);
        assert!(status.success());
        let out = Command::new(BIN)
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["--dry-run", "--output", "json"])
            .output()
            .expect("dry run");
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let ready = plan["pools"].as_array().map_or(0, |p| {
            p.iter()
                .map(|p| p["ready"].as_u64().unwrap_or(0))
                .sum::<u64>()
        });
        if plan["actions"].as_array().is_some_and(Vec::is_empty) && ready == u64::from(workers) + 3
        {
            converged = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(converged, "the 3 + {workers} cluster did not converge");
    eprintln!("set up 3 + {workers} in {:.1?}", setup.elapsed());
    sim.faults().update(|f| {
        f.routes.insert(
            "*".into(),
            RouteFault {
                latency_ms: 5,
                error_rate: 0.0,
                error_status: 503,
            },
        );
    });
    let mut samples = Vec::new();
    for _ in 0..samples_n {
        sim.oxide().reset_counters();
        sim.kube().reset_counters();
        let (status, took, peak) = run(&kc, &[]);
        assert!(status.success());
        samples.push((
            total_requests(&sim),
            took,
            peak,
            sim.oxide().counters().values().sum::<u64>(),
        ));
    }
    // What the last sample asked, route by route: where a new request comes from.
    for (route, n) in sim
        .oxide()
        .counters()
        .into_iter()
        .chain(sim.kube().counters())
        .filter(|(_, n)| *n > 0)
    {
        eprintln!("  no-op run: {n} × {route}");
    }
    samples.sort_by_key(|s| s.1);
    let (req, took, peak, oxide_req) = samples[samples.len() / 2];
    rows.push((
        format!("no-op reconcile 3+{workers}: API requests"),
        format!("{req} ({oxide_req} Oxide + {} Kubernetes)", req - oxide_req),
        "≤ 12".into(),
    ));
    rows.push((
        format!("no-op reconcile 3+{workers}: wall time (median of {samples_n})"),
        format!("{took:.0?}"),
        "≤ 1 s".into(),
    ));
    rows.push((
        format!("no-op reconcile 3+{workers}: peak RSS"),
        format!("{:.1} MB", peak as f64 / 1024.0),
        "≤ 64 MB".into(),
    ));
    drop(sim);

    // --- scale 0 → 100 with 50 ms create latency ----------------------------------------------
    let (sim, store) = rt.block_on(start_sim(0));
    let kc = sim.kubeconfig.clone().expect("kubeconfig");
    rt.block_on(edit(&store, |s| {
        s.worker_pools[0].count = scale_to;
        s.nodes.external_ip = ExternalIpMode::None;
    }));
    sim.faults().update(|f| {
        f.routes.insert(
            "POST /v1/instances".into(),
            RouteFault {
                latency_ms: 50,
                error_rate: 0.0,
                error_status: 503,
            },
        );
    });
    sim.oxide().reset_counters();
    let oxide = sim.oxide().clone();
    let start = Instant::now();
    let watcher = std::thread::spawn(move || {
        let (mut first, mut last) = (None, None);
        while start.elapsed() < Duration::from_secs(30) {
            let n = oxide
                .counters()
                .get("POST /v1/instances")
                .copied()
                .unwrap_or(0);
            if n >= 1 && first.is_none() {
                first = Some(start.elapsed());
            }
            if n >= u64::from(scale_to) {
                last = Some(start.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        (first, last)
    });
    let (status, took, _) = run(&kc, &["--concurrency", "8"]);
    let (first, last) = watcher.join().expect("watcher");
    assert!(status.success());
    let (first, last) = (first.expect("a create"), last.expect("every create"));
    let target = Duration::from_millis(50).mul_f64(1.3 * (f64::from(scale_to) / 8.0).ceil());
    rows.push((
        format!("scale 0→{scale_to}, 50 ms creates, concurrency 8: first to last create done"),
        format!(
            "{:.0?} (+{:.0?} before the first; whole run {:.0?})",
            last - first + Duration::from_millis(50),
            first,
            took
        ),
        format!("≤ {target:.0?}"),
    ));
    drop(sim);

    // --- process start to first request -----------------------------------------------------
    let (sim, _store) = rt.block_on(start_sim(1));
    let kc = sim.kubeconfig.clone().expect("kubeconfig");
    let mut firsts = Vec::new();
    for _ in 0..starts {
        sim.kube().reset_counters();
        let kube = sim.kube();
        let start = Instant::now();
        let mut child = Command::new(BIN)
            .arg("--kubeconfig")
            .arg(&kc)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let first = loop {
            if kube.counters().values().sum::<u64>() > 0 {
                break start.elapsed();
            }
            if start.elapsed() > Duration::from_secs(5) {
                break Duration::MAX;
            }
            std::hint::spin_loop();
        };
        let _ = child.wait();
        firsts.push(first);
    }
    firsts.sort();
    rows.push((
        format!("process start to first request (median of {starts})"),
        format!("{:.1?} (min {:.1?})", firsts[firsts.len() / 2], firsts[0]),
        "≤ 15 ms".into(),
    ));

    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(10);
    let v = rows.iter().map(|r| r.1.len()).max().unwrap_or(10);
    println!("\n{:<w$}  {:<v$}  TARGET", "BENCHMARK", "RESULT");
    for (k, r, t) in rows {
        println!("{k:<w$}  {r:<v$}  {t}");
    }
}
