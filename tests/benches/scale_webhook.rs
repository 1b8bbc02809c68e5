//! Benchmark of the scale webhook over a real kube-apiserver (behind the simulator's front
//! proxy, HTTPS, in this process), driven by 64 concurrent keep-alive connections. Prints a table: GET latency
//! p50/p90/p99/max and requests/s, PATCH throughput, a burst of 500 PATCHes sent at once over
//! two hosts (the ConfigMap writes it cost, and its latency), the same GET load against the in-memory
//! fakes (the host's own cost, without the Kubernetes round trip), and peak RSS (VmHWM).
//!
//! The apiserver-backed phases run against the real `scale serve` binary in its own process when
//! it has been built next to this bench (`cargo build -p scale`, same profile), so its peak RSS
//! is the webhook's alone; otherwise they run against the in-process host and the RSS shown
//! covers host, proxy and load generator together. The fakes phase always runs in-process.
//!
//! Not a test: it asserts only that every request succeeded and the count is exact.
//! `cargo bench -p oxide-controller-tests --bench scale_webhook` (release), or add
//! `--profile dev` for a debug build. `BENCH_SECONDS` sets each GET phase's length (default 5),
//! `BENCH_PATCHES` the number of PATCHes (default 2000), `BENCH_BURST` the burst's size (default 500).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxide_controller::adapters::kube_cluster::KubeCluster;
use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::secrets::webhook::WebhookTokens;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::fake::FakeWorld;
use oxide_controller::ports::cluster::{Cluster, JOBS_NAMESPACE, NAMESPACE, OBJECT_NAME};
use oxide_controller::ports::state::{StateStore, keys};
use oxide_controller::webhook::host::{self, HostOptions};
use oxide_controller::webhook::{Deps, WebhookConfig};
use serde_json::json;

const TOKEN: &str = "bench-webhook-token";
const CONCURRENCY: usize = 64;
const INITIAL: u32 = 2;

fn proc_status(field: &str) -> String {
    status_of("self", field)
}

fn status_of(pid: &str, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .map(|l| l[field.len()..].trim().to_owned())
        })
        .unwrap_or_else(|| "n/a".to_owned())
}

fn state_data(max: u32) -> (ClusterSecrets, WebhookTokens, BTreeMap<String, String>) {
    let mut spec = ClusterSpec::new("bench", "bench", "ubuntu-2404", 1, INITIAL);
    spec.worker_pools[0].max = max;
    (
        ClusterSecrets::default(),
        WebhookTokens {
            token: TOKEN.into(),
            read_token: None,
        },
        BTreeMap::from([(keys::SPEC.to_owned(), spec.to_yaml())]),
    )
}

async fn serve<S: StateStore + 'static, C: Cluster + 'static>(
    deps: Arc<Deps<S, C>>,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = host::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(host::serve(listener, deps, HostOptions::default(), async {
        let _ = stopped.await;
    }));
    (base, stop)
}

struct Figures {
    requests: usize,
    errors: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Figures {
    fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// `CONCURRENCY` workers sending `make()` requests until `until` says stop.
async fn load(
    make: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder + Send + Sync + 'static,
    expect: u16,
    until: impl Fn(usize, Instant) -> bool + Send + Sync + 'static,
) -> Figures {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()
        .unwrap();
    let make = Arc::new(make);
    let until = Arc::new(until);
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let workers = (0..CONCURRENCY).map(|_| {
        let (client, make, until, sent) =
            (client.clone(), make.clone(), until.clone(), sent.clone());
        tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0;
            let mut first_error = None;
            loop {
                let n = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if until(n, started) {
                    break;
                }
                let t = Instant::now();
                match make(&client).send().await {
                    Ok(r) if r.status().as_u16() == expect => {
                        let _ = r.bytes().await;
                        lat.push(t.elapsed());
                    }
                    Ok(r) => {
                        errors += 1;
                        let status = r.status();
                        let body = r.text().await.unwrap_or_default();
                        first_error.get_or_insert(format!("HTTP {status}: {body}"));
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e.to_string());
                    }
                }
            }
            (lat, errors, first_error)
        })
    });
    let mut latencies = Vec::new();
    let mut errors = 0;
    for w in futures::future::join_all(workers).await {
        let (l, e, first) = w.unwrap();
        latencies.extend(l);
        errors += e;
        if let Some(first) = first {
            eprintln!("first failed request of a worker: {first}");
        }
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Figures {
        requests: latencies.len() + errors,
        errors,
        elapsed,
        latencies,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn row(name: &str, f: &Figures) {
    println!(
        "| {name:<34} | {:>7} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>9.0} |",
        f.requests,
        f.errors,
        ms(f.pct(0.50)),
        ms(f.pct(0.90)),
        ms(f.pct(0.99)),
        ms(f.latencies.last().copied().unwrap_or_default()),
        f.rps()
    );
}

/// `scale` built next to this bench (`target/<profile>/scale`), if any.
fn scale_binary() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    // cargo does not build another package's binary for this benchmark, and an old one may
    // not read the spec this build writes: build it (a no-op when it is up to date).
    if let Some(cargo) = std::env::var_os("CARGO") {
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => "release",
        };
        let built = std::process::Command::new(cargo)
            .args(["build", "--quiet", "-p", "scale", "--profile", profile])
            .status()
            .unwrap();
        assert!(built.success(), "cargo build -p scale failed");
    }
    let bin = dir.join("scale");
    bin.is_file().then_some(bin)
}

/// A `scale serve` process and its base URL.
async fn spawn_scale(
    bin: &std::path::Path,
    kubeconfig: &std::path::Path,
) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next_line().await.unwrap().unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    let base = format!("http://{}", ready["listen"].as_str().unwrap());
    (child, base)
}

/// What a burst cost: latencies of every PATCH (sent at once, split over the hosts), the
/// ConfigMap writes and 409s the hosts made, and the count before and after.
struct Burst {
    figures: Figures,
    writes: u64,
    conflicts: u64,
    before: u32,
    after: u32,
}

/// The first worker pool's count in effect: `spec.yaml` with the webhook's counts, which it
/// writes into ConfigMap `oxide-controller-scale` (audit security-2 N4).
async fn stored_count(store: &KubeStateStore) -> u32 {
    let (config, scale) = oxide_controller::workflows::scale::read_both(store)
        .await
        .unwrap();
    let base = ClusterSpec::from_yaml(config.spec_yaml().unwrap()).unwrap();
    oxide_controller::workflows::scale::effective(base, scale.as_ref(), &config)
        .spec
        .worker_pools[0]
        .count
}

/// `n` PATCHes `{"delta":1}` sent at once over two webhook hosts on one ConfigMap (as two
/// replicas would be), in this process so their metrics can be read.
async fn burst(kubeconfig: &std::path::Path, n: usize) -> Burst {
    let client = oxide_controller::adapters::kubeclient::client(Some(kubeconfig), None)
        .await
        .unwrap();
    let store = || KubeStateStore::new(client.clone(), NAMESPACE);
    let read_count = || async { stored_count(&store()).await };
    let before = read_count().await;
    let mut hosts = Vec::new();
    for _ in 0..2 {
        let deps = Arc::new(Deps::new(
            store(),
            KubeCluster::new(client.clone(), NAMESPACE),
            WebhookConfig::default(),
        ));
        let (base, stop) = serve(deps.clone()).await;
        hosts.push((deps, base, stop));
    }
    let http = reqwest::Client::new();
    let started = Instant::now();
    let calls = (0..n).map(|i| {
        let req = http
            .patch(format!("{}/nodes/workers", hosts[i % 2].1))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(r#"{"delta":1}"#);
        async move {
            let t = Instant::now();
            let ok = matches!(req.send().await, Ok(r) if r.status() == 200);
            (ok, t.elapsed())
        }
    });
    let results = futures::future::join_all(calls).await;
    let elapsed = started.elapsed();
    let errors = results.iter().filter(|(ok, _)| !ok).count();
    let mut latencies: Vec<Duration> = results.into_iter().map(|(_, l)| l).collect();
    latencies.sort();
    let writes = hosts.iter().map(|h| h.0.metrics.writes()).sum();
    let conflicts = hosts.iter().map(|h| h.0.metrics.conflicts_seen()).sum();
    for (_, _, stop) in hosts {
        let _ = stop.send(());
    }
    Burst {
        figures: Figures {
            requests: n,
            errors,
            elapsed,
            latencies,
        },
        writes,
        conflicts,
        before,
        after: read_count().await,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    // `OXIDE_BENCH_SHORT=1` (CI): 1 s phases and 200 PATCHes.
    let short = std::env::var_os("OXIDE_BENCH_SHORT").is_some();
    let seconds: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if short { 1 } else { 5 });
    let patches: usize = std::env::var("BENCH_PATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if short { 200 } else { 2000 });
    let phase = Duration::from_secs(seconds);

    // A real kube-apiserver with the state bootstrap writes, and a CronJob for reconcile Jobs.
    let local = oxide_sim::control_plane::proxy::LocalApi::apiserver_only()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, local.admin_kubeconfig()).unwrap();
    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
        .await
        .unwrap();
    let (secrets, tokens, config) = state_data(1_000_000);
    let store = KubeStateStore::new(client.clone(), NAMESPACE);
    store.ensure_state(&secrets, config).await.unwrap();
    store.ensure_webhook_tokens(&tokens).await.unwrap();
    local
        .control_plane
        .apply(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBS_NAMESPACE}}),
        )
        .await
        .unwrap();
    local
        .control_plane
        .apply(json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": OBJECT_NAME, "namespace": JOBS_NAMESPACE},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "r", "image": "oxide-controller:bench"}]}}}}}}))
        .await
        .unwrap();
    let scale = scale_binary();
    let (child, base, _stop) = match &scale {
        Some(bin) => {
            let (child, base) = spawn_scale(bin, &kubeconfig).await;
            (Some(child), base, None)
        }
        None => {
            let (base, stop) = serve(Arc::new(Deps::new(
                KubeStateStore::new(client.clone(), NAMESPACE),
                KubeCluster::new(client, NAMESPACE),
                WebhookConfig::default(),
            )))
            .await;
            (None, base, Some(stop))
        }
    };
    let child_pid = child.as_ref().and_then(|c| c.id()).map(|p| p.to_string());
    // Let the child finish starting up (it answers /healthz) before reading its idle RSS.
    let _ = reqwest::get(format!("{base}/healthz")).await;
    let child_hwm_idle = child_pid
        .as_deref()
        .map(|pid| status_of(pid, "VmHWM:"))
        .unwrap_or_default();

    // The same host over the in-memory fakes: what the host and handler cost by themselves.
    let world = FakeWorld::new(chrono::Utc::now());
    let (secrets, tokens, config) = state_data(1_000_000);
    world.state().ensure_state(&secrets, config).await.unwrap();
    world.state().ensure_webhook_tokens(&tokens).await.unwrap();
    let (fake_base, _stop_fake) = serve(Arc::new(Deps::new(
        world.state(),
        world.cluster(),
        WebhookConfig::default(),
    )))
    .await;

    let hwm_idle = proc_status("VmHWM:");
    let get = |base: String| {
        move |c: &reqwest::Client| c.get(format!("{base}/nodes/workers")).bearer_auth(TOKEN)
    };
    // Warm-up: connections, token cache, allocator.
    load(get(base.clone()), 200, |n, _| n >= 1000).await;
    load(get(fake_base.clone()), 200, |n, _| n >= 1000).await;

    let get_api = load(get(base.clone()), 200, move |_, t| t.elapsed() >= phase).await;
    let get_fake = load(get(fake_base.clone()), 200, move |_, t| {
        t.elapsed() >= phase
    })
    .await;
    let patch_base = base.clone();
    let patch = load(
        move |c| {
            c.patch(format!("{patch_base}/nodes/workers"))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(r#"{"delta":1}"#)
        },
        200,
        move |n, _| n >= patches,
    )
    .await;

    let count = stored_count(&KubeStateStore::new(
        oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
            .await
            .unwrap(),
        NAMESPACE,
    ))
    .await;
    let burst_size: usize = std::env::var("BENCH_BURST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let burst = burst(&kubeconfig, burst_size).await;

    println!();
    println!(
        "scale webhook benchmark: {CONCURRENCY} concurrent keep-alive connections; apiserver phases against {}",
        if child_pid.is_some() {
            "`scale serve` in its own process"
        } else {
            "the in-process host"
        }
    );
    println!(
        "build: {}",
        if cfg!(debug_assertions) {
            "debug (unoptimised)"
        } else {
            "release"
        }
    );
    println!();
    println!(
        "| phase                              | requests | errors | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | req/s     |"
    );
    println!(
        "|------------------------------------|---------:|-------:|---------:|---------:|---------:|---------:|----------:|"
    );
    row("GET /nodes/workers (kube-apiserver, HTTPS)", &get_api);
    row("GET /nodes/workers (in-memory fakes)", &get_fake);
    row("PATCH {\"delta\":1} (kube-apiserver)", &patch);
    row("PATCH burst, two hosts (kube-apiserver)", &burst.figures);
    println!();
    println!(
        "PATCH burst: {burst_size} sent at once over two hosts: {} ConfigMap writes and {} 409s re-read (one write per batch of changes queued behind a write), stored count {} → {} ({})",
        burst.writes,
        burst.conflicts,
        burst.before,
        burst.after,
        if burst.after as usize == burst.before as usize + burst_size - burst.figures.errors {
            "exact"
        } else {
            "MISMATCH"
        }
    );
    println!(
        "PATCH: {} applied, stored count {} → {} ({})",
        patch.latencies.len(),
        INITIAL,
        count,
        if count as usize == INITIAL as usize + patch.latencies.len() {
            "exact"
        } else {
            "MISMATCH"
        }
    );
    match &child_pid {
        Some(pid) => println!(
            "webhook process (`scale serve`, pid {pid}): peak RSS (VmHWM) {child_hwm_idle} idle, {} under load; VmRSS now {}",
            status_of(pid, "VmHWM:"),
            status_of(pid, "VmRSS:")
        ),
        None => println!(
            "(no `scale` binary next to the bench: the apiserver phases ran on the in-process host)"
        ),
    }
    println!(
        "this process (load generator + in-process host{}): VmHWM {} after setup, {} after load",
        if child_pid.is_some() {
            " for the fakes phase"
        } else {
            ""
        },
        hwm_idle,
        proc_status("VmHWM:")
    );
    if let Some(mut child) = child {
        let pid = child.id().unwrap_or_default().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let exit = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        println!(
            "`scale serve` after SIGTERM: {}",
            match exit {
                Ok(Ok(status)) => format!("exited with {status}"),
                other => format!("did not exit cleanly: {other:?}"),
            }
        );
    }
    assert_eq!(
        count as usize,
        INITIAL as usize + patch.latencies.len(),
        "every acknowledged PATCH is stored"
    );
    assert_eq!(
        get_api.errors + get_fake.errors + patch.errors + burst.figures.errors,
        0,
        "no request failed"
    );
    assert_eq!(
        burst.after as usize,
        burst.before as usize + burst_size,
        "every PATCH of the burst is stored once"
    );
}
