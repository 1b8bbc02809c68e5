//! `reconcile-once` asked to stop (audit sim-3 K4): a reconcile Job's pod deleted mid-run gets
//! SIGTERM from the simulated kubelet (the pod runner) and must stop well inside its grace
//! period, leave nothing half-done that the next run cannot pick up, and give the Lease back
//! so the next run starts at once; from a terminal, SIGTERM/SIGINT end a run the same way
//! with exit 128 + the signal's number.

use std::path::Path;
use std::time::Duration;

use oxide_controller::domain::spec::ClusterSpec;
use oxide_sim::SimHandle;
use oxide_sim::oxide::RouteFault;
use serde_json::{Value, json};
use tokio::time::Instant;

#[path = "support/pending.rs"]
mod support;

const WK: &str = "sim-workers-";
const CREATE: &str = "POST /v1/instances";

fn workers(sim: &SimHandle) -> Vec<String> {
    sim.oxide().dump()["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i["name"].as_str().map(str::to_owned))
        .filter(|n| n.starts_with(WK))
        .collect()
}

async fn lease_holder(sim: &SimHandle) -> Option<String> {
    support::lease(sim)
        .await
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

/// `count` workers wanted, and every instance create takes `latency_ms` (a slow rack, but
/// quicker than the run gives a create under way once asked to stop).
async fn slow_scale_up(sim: &SimHandle, count: u32, latency_ms: u64) {
    let kube = sim.kube();
    let cm = kube
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await
        .unwrap_or_else(|| panic!("no ConfigMap"));
    let mut spec = ClusterSpec::from_yaml(cm["data"]["spec.yaml"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    spec.worker_pools[0].count = count;
    spec.worker_pools[0].max = spec.worker_pools[0].max.max(count);
    kube.merge_patch(
        "v1",
        "ConfigMap",
        Some("kube-system"),
        "oxide-controller",
        &json!({"data": {"spec.yaml": spec.to_yaml()}}),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    sim.faults().update(|f| {
        f.routes.insert(
            CREATE.into(),
            RouteFault {
                latency_ms,
                error_rate: 0.0,
                error_status: 503,
            },
        );
    });
}

async fn wait_until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn reconcile(kubeconfig: &Path) -> std::process::Output {
    tokio::process::Command::new(support::RECONCILE)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--log-format", "json"])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// After an interrupted run: the next one starts at once (the Lease is free), adopts or
/// finishes what the interrupted one began, and the pool ends with exactly the members asked
/// for (nothing created twice, nothing left half-made).
async fn next_run_takes_over(sim: &SimHandle, count: usize) {
    let kubeconfig = sim
        .kubeconfig
        .clone()
        .unwrap_or_else(|| panic!("kubeconfig"));
    sim.faults().update(|f| f.routes.clear());
    let out = reconcile(&kubeconfig).await;
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(
        !log.contains("holds the Lease"),
        "the interrupted run left the Lease held:\n{log}"
    );
    assert!(log.contains("reconcile finished"), "{log}");
    assert_eq!(workers(sim).len(), count, "{:?}", workers(sim));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pod_deleted_mid_create_stops_within_its_grace_and_releases_the_lease() {
    let (sim, _) = support::cluster(false, 3).await;
    let kube = sim.kube();
    slow_scale_up(&sim, 2, 6000).await;
    sim.oxide().reset_counters();

    // The CronJob's own Job template: the manifest sets no terminationGracePeriodSeconds, so
    // the apiserver's default of 30 s.
    let cron = kube
        .get(
            "batch/v1",
            "CronJob",
            Some("oxide-controller-jobs"),
            "oxide-controller",
        )
        .await
        .unwrap_or_else(|| panic!("cronjob"));
    let spec = cron["spec"]["jobTemplate"]["spec"].clone();
    assert_eq!(
        spec["template"]["spec"]["terminationGracePeriodSeconds"],
        30
    );
    kube.apply(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "interrupted", "namespace": "oxide-controller-jobs"}, "spec": spec}))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut pod = String::new();
    wait_until(
        "the Job's pod to hold the Lease and create",
        Duration::from_secs(120),
        async || {
            let found: Option<Value> = kube
                .list("v1", "Pod", Some("oxide-controller-jobs"))
                .await
                .into_iter()
                .find(|p| p["metadata"]["labels"]["job-name"] == "interrupted");
            let Some(p) = found else { return false };
            pod = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            lease_holder(&sim).await.as_deref() == Some(pod.as_str())
                && sim.oxide().counters().get(CREATE).copied().unwrap_or(0) >= 1
        },
    )
    .await;

    // Evicted, or deleted by a person: the kubelet sends SIGTERM and waits up to 30 s.
    let asked = Instant::now();
    assert!(
        kube.delete("v1", "Pod", Some("oxide-controller-jobs"), &pod)
            .await
    );
    wait_until("the pod to go", Duration::from_secs(60), async || {
        kube.get("v1", "Pod", Some("oxide-controller-jobs"), &pod)
            .await
            .is_none()
    })
    .await;
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(25),
        "the run went on for {took:?} after SIGTERM: it ran into SIGKILL at the end of its grace period"
    );
    assert_eq!(
        lease_holder(&sim).await,
        None,
        "the stopped run must give the Lease back"
    );
    // The create under way was seen through (quicker than the abandon bound) and reported.
    let cm = kube
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await
        .unwrap_or_else(|| panic!("no ConfigMap"));
    let text = cm["data"]["status.json"].as_str().unwrap_or_default();
    let status = oxide_controller::domain::status::Status::from_json(text)
        .unwrap_or_else(|| panic!("no status: {text}"));
    assert!(
        status
            .last_plan
            .iter()
            .any(|a| a.action == "create" && a.outcome == "done"),
        "the stopped run's status: {text}"
    );
    assert_eq!(workers(&sim).len(), 2);
    next_run_takes_over(&sim, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_end_a_run_with_128_plus_the_signal_and_the_lease_free() {
    let (sim, _) = support::cluster(false, 3).await;
    let kubeconfig = sim
        .kubeconfig
        .clone()
        .unwrap_or_else(|| panic!("kubeconfig"));
    for (signal, code, count) in [("-TERM", 143, 2), ("-INT", 130, 3)] {
        slow_scale_up(&sim, count, 6000).await;
        sim.oxide().reset_counters();
        let child = tokio::process::Command::new(support::RECONCILE)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--log-format", "json", "--holder", "terminal-run"])
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let pid = child.id().unwrap_or_else(|| panic!("pid"));
        wait_until("the run to create", Duration::from_secs(60), async || {
            lease_holder(&sim).await.as_deref() == Some("terminal-run")
                && sim.oxide().counters().get(CREATE).copied().unwrap_or(0) >= 1
        })
        .await;
        let asked = Instant::now();
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(sent.success());
        let out = tokio::time::timeout(Duration::from_secs(40), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("the run did not stop"))
            .unwrap_or_else(|e| panic!("{e}"));
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{signal}: {log}");
        assert!(asked.elapsed() < Duration::from_secs(20), "{signal}: {log}");
        assert!(log.contains("reconcile stopped early"), "{log}");
        assert_eq!(lease_holder(&sim).await, None, "{signal}: {log}");
    }
    next_run_takes_over(&sim, 3).await;
}
