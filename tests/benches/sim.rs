//! (Benchmarks may panic on setup failure: there is nobody to report a Result to.)
#![allow(clippy::expect_used, clippy::unwrap_used)]

//! Simulator and adapter figures (issue 2): instance listing of 1,000 instances with pages of
//! 100 and 1,000 (requests, wall time), ConfigMap replace-with-version throughput, and
//! `oxide-sim` start-up time. Prints a table; asserts nothing.
//!
//! Run: `cargo bench -p oxide-controller-tests --bench sim`

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::size::ByteSize;
use oxide_controller::domain::model::{NewDisk, NewInstance};
use oxide_controller::ports::rack::Rack;
use oxide_controller::ports::state::StateStore;
use oxide_sim::{Sim, SimOptions};

/// The short mode CI runs (`OXIDE_BENCH_SHORT=1`): the same steps on smaller inputs, so a
/// benchmark that no longer runs fails the build.
fn short() -> bool {
    std::env::var_os("OXIDE_BENCH_SHORT").is_some()
}

/// Start-ups timed per figure (the median is shown).
const STARTS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn startup(preset: Option<&str>) -> Duration {
    let runs = (0..STARTS)
        .map(|_| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxide-sim"));
            cmd.args(["--listen", "127.0.0.1:0", "--ssh-port", "2222"]);
            if let Some(p) = preset {
                cmd.args(["--preset", p]);
            }
            let start = Instant::now();
            let mut child = cmd
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn oxide-sim");
            let mut line = String::new();
            let out = child.stdout.take().expect("stdout");
            BufReader::new(out)
                .read_line(&mut line)
                .expect("ready line");
            let took = start.elapsed();
            assert!(line.contains("oxide_host"), "{line}");
            // SIGTERM: oxide-sim shuts down and removes its scratch directories (a killed
            // one leaves its control plane's etcd data behind).
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
            took
        })
        .collect();
    median(runs)
}

async fn listing(rows: &mut Vec<(String, String)>) {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        ..SimOptions::default()
    })
    .await
    .expect("sim");
    sim.oxide().seed_project("bench");
    let image = sim.oxide().seed_silo_image("img", "linux", "1", 1 << 30);
    let rack = OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        "bench",
        RackOptions::default(),
    )
    .expect("rack");
    let make = |i: usize| NewInstance {
        name: format!("bench-workers-{i:05}"),
        description: "bench".into(),
        hostname: format!("bench-workers-{i:05}"),
        ncpus: 1,
        memory: ByteSize::gib(1),
        boot_disk: NewDisk {
            name: format!("boot-bench-workers-{i:05}"),
            size: ByteSize::gib(1),
            image: Some(image),
        },
        data_disk: None,
        restore_disk: None,
        user_data: b"#cloud-config\n{}\n".to_vec(),
        ephemeral_ip: false,
        ip_pool: None,
        anti_affinity_group: None,
        rack_restarts: false,
    };
    let start = Instant::now();
    let total = if short() { 100 } else { 1000 };
    let creates: Vec<_> = (0..total).map(make).collect();
    futures::stream::iter(creates.iter().map(|n| rack.create_instance(n)))
        .buffer_unordered(16)
        .for_each(|r| async move {
            r.expect("create");
        })
        .await;
    rows.push((
        format!("create {total} instances (16 in flight)"),
        format!("{:.2?}", start.elapsed()),
    ));
    for page in [100u32, 1000] {
        let rack = OxideRack::connect(
            &sim.oxide_host,
            &sim.oxide_token,
            "bench",
            RackOptions {
                page_size: page,
                ..RackOptions::default()
            },
        )
        .expect("rack");
        sim.oxide().reset_counters();
        let start = Instant::now();
        let all = rack.list_instances("bench-").await.expect("list");
        let took = start.elapsed();
        let requests = sim
            .oxide()
            .counters()
            .get("GET /v1/instances")
            .copied()
            .unwrap_or(0);
        assert_eq!(all.len(), total);
        rows.push((
            format!("list {total} instances, pages of {page}"),
            format!("{requests} requests, {took:.2?}"),
        ));
    }
}

async fn configmap(rows: &mut Vec<(String, String)>) {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some("cluster:1:0".parse().expect("preset")),
        ..SimOptions::default()
    })
    .await
    .expect("sim");
    let kubeconfig = sim.kubeconfig.clone().expect("kubeconfig");
    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
        .await
        .expect("client");
    let store = KubeStateStore::new(client.clone(), "kube-system");
    let _ = store
        .ensure_state(&ClusterSecrets::default(), BTreeMap::new())
        .await;
    let n = if short() { 50 } else { 500 };
    let start = Instant::now();
    for i in 0..n {
        let snap = store.read_config().await.expect("read");
        let mut data = snap.data.clone();
        data.insert("bench".into(), i.to_string());
        store
            .replace_config(&snap.resource_version, data)
            .await
            .expect("replace");
    }
    let took = start.elapsed();
    rows.push((
        "ConfigMap read + replace-with-version, sequential".into(),
        format!(
            "{:.0} writes/s ({n} in {took:.2?})",
            f64::from(n) / took.as_secs_f64()
        ),
    ));
    // Concurrent increments with re-read on 409.
    let start = Instant::now();
    let conflicts = std::sync::atomic::AtomicU64::new(0);
    futures::stream::iter(0..n)
        .for_each_concurrent(8, |_| {
            let store = &store;
            let conflicts = &conflicts;
            async move {
                loop {
                    let snap = store.read_config().await.expect("read");
                    let mut data = snap.data.clone();
                    let v: u64 = data
                        .get("counter")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    data.insert("counter".into(), (v + 1).to_string());
                    match store.replace_config(&snap.resource_version, data).await {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => {
                            conflicts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        })
        .await;
    let took = start.elapsed();
    rows.push((
        "ConfigMap increments, 8 writers, re-read on 409".into(),
        format!(
            "{:.0} increments/s ({n} in {took:.2?}, {} conflicts)",
            f64::from(n) / took.as_secs_f64(),
            conflicts.load(std::sync::atomic::Ordering::Relaxed)
        ),
    ));
}

use futures::StreamExt;

fn main() {
    let mut rows = Vec::new();
    rows.push((
        format!("oxide-sim start-up to ready line (median of {STARTS})"),
        format!("{:.2?}", startup(None)),
    ));
    rows.push((
        format!("oxide-sim start-up with --preset cluster:3:2 (median of {STARTS})"),
        format!("{:.2?}", startup(Some("cluster:3:2"))),
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(listing(&mut rows));
    rt.block_on(configmap(&mut rows));
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(10);
    println!("\n{:<w$}  RESULT", "BENCHMARK");
    for (k, v) in rows {
        println!("{k:<w$}  {v}");
    }
}
