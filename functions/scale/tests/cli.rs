//! The `scale` binary as an operator uses it, against a real kube-apiserver (behind the
//! simulator's front proxy) over HTTPS: `get`/`set`/`add` with `--kubeconfig` and their exit codes, and `serve` printing
//! its ready line, answering over HTTP and exiting cleanly on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::secrets::webhook::WebhookTokens;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::ports::cluster::{JOBS_NAMESPACE, NAMESPACE, OBJECT_NAME, ON_DEMAND_JOB};
use oxide_controller::ports::state::{StateStore, keys};
use oxide_sim::control_plane::proxy::LocalApi;
use oxide_sim::guest::cluster_api::{BlockingKube, KubeView};
use oxide_sim::oxide::{AfterFault, FaultSpec, Faults};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const TOKEN: &str = "cli-test-webhook-token";

struct Env {
    kube: BlockingKube,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

/// An apiserver holding the state bootstrap writes (2 workers in [0, 10]) and a CronJob.
async fn env() -> Env {
    env_with(Faults::default()).await
}

/// [`env`] behind a front proxy injecting `faults`.
async fn env_with(faults: Faults) -> Env {
    let local = std::sync::Arc::new(
        LocalApi::start(
            oxide_sim::control_plane::ControlPlaneOptions {
                controller_manager: false,
                scheduler: false,
                kwok: false,
                ..Default::default()
            },
            faults,
        )
        .await
        .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, local.admin_kubeconfig()).unwrap();
    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
        .await
        .unwrap();
    let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 1, 2);
    spec.worker_pools[0].max = 10;
    let secrets = ClusterSecrets {
        oxide_project: "demo".into(),
        oxide_cluster: "demo".into(),
        ..ClusterSecrets::default()
    };
    let store = KubeStateStore::new(client, NAMESPACE);
    store
        .ensure_state(
            &secrets,
            BTreeMap::from([(keys::SPEC.to_owned(), spec.to_yaml())]),
        )
        .await
        .unwrap();
    store
        .ensure_webhook_tokens(&WebhookTokens {
            token: TOKEN.into(),
            read_token: None,
        })
        .await
        .unwrap();
    let kube = BlockingKube(KubeView::Local(local));
    kube.apply(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBS_NAMESPACE}}),
    )
    .unwrap();
    kube.apply(json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": OBJECT_NAME, "namespace": JOBS_NAMESPACE},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "reconcile", "image": "oxide-controller:test", "args": ["reconcile-once"]}]}}}}}}))
        .unwrap();
    Env {
        kube,
        _dir: dir,
        kubeconfig,
    }
}

impl Env {
    async fn scale(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_scale"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env_remove("OXIDE_CONTROLLER_POOL")
            .env("OXIDE_CONTROLLER_LOG_FORMAT", "text")
            .output()
            .await
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The count in effect: `spec.yaml` with the webhook's counts from ConfigMap
    /// `oxide-controller-scale` (audit security-2 N4).
    fn stored_count(&self) -> u32 {
        let get = |name: &str| {
            self.kube
                .get("v1", "ConfigMap", Some(NAMESPACE), name)
                .unwrap()
        };
        let snapshot = |cm: &serde_json::Value| oxide_controller::ports::state::ConfigSnapshot {
            resource_version: String::new(),
            data: serde_json::from_value(cm["data"].clone()).unwrap_or_default(),
        };
        let config = snapshot(&get(OBJECT_NAME));
        let scale = snapshot(&get(oxide_controller::ports::state::SCALE_OBJECT));
        let base = ClusterSpec::from_yaml(config.spec_yaml().unwrap()).unwrap();
        oxide_controller::workflows::scale::effective(base, Some(&scale), &config)
            .spec
            .worker_pools[0]
            .count
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_set_and_add_change_the_configmap_and_exit_with_the_documented_codes() {
    let env = env().await;
    assert_eq!(env.scale(&["get"]).await.0, 0);
    assert_eq!(env.scale(&["get"]).await.1, "2\n");
    let (code, out, _) = env.scale(&["get", "--output", "json"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        json!({"pool":"workers","count":2,"min":0,"max":10})
    );

    let (code, out, err) = env.scale(&["add", "3"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("workers: 2 → 5; reconcile triggered"),
        "{out}"
    );
    assert_eq!(env.stored_count(), 5);
    assert!(
        env.kube
            .get("batch/v1", "Job", Some(JOBS_NAMESPACE), ON_DEMAND_JOB)
            .is_some()
    );

    let (code, out, err) = env.scale(&["add", "-1"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("5 → 4; reconcile pending"), "{out}");
    let (code, out, _) = env.scale(&["set", "4"]).await;
    assert_eq!((code, out.as_str()), (0, "workers: already 4\n"));

    // Things to fix first exit 2 and say what is wrong; nothing is written.
    let (code, _, err) = env.scale(&["set", "11"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("[0, 10]"), "{err}");
    let (code, _, err) = env.scale(&["add", "1", "--pool", "gpu"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("pools are: control-plane, workers"), "{err}");
    let (code, _, err) = env.scale(&["get", "--namespace", "elsewhere"]).await;
    assert_eq!(code, 2, "no state there: {err}");
    assert!(err.contains("run bootstrap"), "{err}");
    assert_eq!(env.stored_count(), 4);

    let out = Command::new(env!("CARGO_BIN_EXE_scale"))
        .args(["get", "--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Audit sim-3 K5: the count write and the reconcile Job create are committed but answered
/// 504 ("may still be processing the request"). `scale` looks instead of failing: the change
/// is reported saved and the run triggered, and nothing is applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_answered_504_after_they_landed_are_reported_done_and_not_applied_twice() {
    let faults = Faults::default();
    let env = env_with(faults.clone()).await;
    let after = |key: &str| {
        faults.set(FaultSpec {
            kube_after: [(key.to_string(), AfterFault::default())].into(),
            ..FaultSpec::default()
        });
    };
    // The count write.
    after("update configmaps");
    let (code, out, err) = env.scale(&["add", "1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("workers: 2 → 3; reconcile triggered"),
        "{out}{err}"
    );
    assert!(faults.get().kube_after.values().all(|f| f.times == 0));
    assert_eq!(env.stored_count(), 3);

    // The reconcile Job create (the last one cleaned up first, as its TTL would; with no
    // garbage collector here, its orphan finalizer is taken off by hand).
    assert!(
        env.kube
            .delete("batch/v1", "Job", Some(JOBS_NAMESPACE), ON_DEMAND_JOB)
    );
    let _ = env.kube.merge_patch(
        "batch/v1",
        "Job",
        Some(JOBS_NAMESPACE),
        ON_DEMAND_JOB,
        &json!({"metadata": {"finalizers": null}}),
    );
    assert!(
        env.kube
            .get("batch/v1", "Job", Some(JOBS_NAMESPACE), ON_DEMAND_JOB)
            .is_none()
    );
    after("create jobs");
    let (code, out, err) = env.scale(&["add", "1"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("workers: 3 → 4; reconcile triggered"),
        "{out}{err}"
    );
    assert!(faults.get().kube_after.values().all(|f| f.times == 0));
    assert_eq!(env.stored_count(), 4);
    assert!(
        env.kube
            .get("batch/v1", "Job", Some(JOBS_NAMESPACE), ON_DEMAND_JOB)
            .is_some()
    );
}

/// SIGTERM while the count write is under way lets it finish (exit as usual, change saved);
/// SIGINT twice gives up at once with 130 and says the change may or may not be saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_command_finishes_its_write_on_sigterm_and_stops_on_a_second_sigint() {
    let faults = Faults::default();
    let env = env_with(faults.clone()).await;
    let slow = |ms: u64| {
        faults.set(FaultSpec {
            kube: [(
                "update configmaps".to_string(),
                oxide_sim::oxide::RouteFault {
                    latency_ms: ms,
                    error_rate: 0.0,
                    error_status: 503,
                },
            )]
            .into(),
            ..FaultSpec::default()
        });
    };
    let start = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_scale"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&env.kubeconfig)
            .env_remove("OXIDE_CONTROLLER_POOL")
            .env("OXIDE_CONTROLLER_LOG_FORMAT", "text")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let kill = |signal: &str, pid: u32| {
        assert!(
            std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
    };

    slow(2500);
    let child = start(&["add", "1"]);
    let pid = child.id().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    kill("-TERM", pid);
    let out = child.wait_with_output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("workers: 2 → 3"), "{text}");
    assert_eq!(env.stored_count(), 3);

    slow(30_000);
    let child = start(&["add", "1"]);
    let pid = child.id().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let asked = std::time::Instant::now();
    kill("-INT", pid);
    tokio::time::sleep(Duration::from_millis(200)).await;
    kill("-INT", pid);
    let out = child.wait_with_output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "{:?}",
        asked.elapsed()
    );
    assert!(err.contains("scale stopped by SIGINT"), "{err}");
}

/// `scale serve` on a free loopback port against `env`'s cluster: the child and its ready line.
async fn serve(env: &Env) -> (tokio::process::Child, serde_json::Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_scale"))
        .args(["serve", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&env.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("ready line within 30 s")
        .unwrap()
        .unwrap();
    (child, serde_json::from_str(&line).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prints_its_address_answers_and_exits_zero_on_sigterm() {
    let env = env().await;
    let (mut child, ready) = serve(&env).await;
    assert_eq!(ready["tls"], false);
    let base = format!("http://{}", ready["listen"].as_str().unwrap());

    let http = reqwest::Client::new();
    let r = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .get(format!("{base}/nodes/workers"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .post(format!("{base}/nodes/workers/modify"))
        .bearer_auth(TOKEN)
        .body("6")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.text().await.unwrap(), "Worker count changed from 2 to 6");
    assert_eq!(env.stored_count(), 6);
    let r = http
        .get(format!("{base}/nodes/workers"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "6");

    let pid = child.id().unwrap();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits within 20 s of SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        http.get(format!("{base}/healthz")).send().await.is_err(),
        "no longer listening"
    );
}

/// `scale status`: the cluster at a glance from the ConfigMap, the Nodes and the Events
/// (read-only); `-o json` for scripts; exit 1 while the last run said Degraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_cluster_and_exits_1_while_it_is_degraded() {
    use oxide_controller::ports::cluster::Cluster as _;
    let env = env().await;
    let (code, out, err) = env.scale(&["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("cluster demo (project demo): no run yet\n"),
        "{out}"
    );

    for (name, pool) in [
        ("demo-control-plane-aaaaa", "control-plane"),
        ("demo-workers-aaaaa", "workers"),
        ("demo-workers-bbbbb", "workers"),
    ] {
        env.kube
            .apply(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"oxide-controller/pool": pool}},
                "spec": {"providerID": format!("oxide://{name}")}}))
            .unwrap();
    }
    let client = oxide_controller::adapters::kubeclient::client(Some(&env.kubeconfig), None)
        .await
        .unwrap();
    let store = KubeStateStore::new(client.clone(), NAMESPACE);
    let write_status = async |degraded: bool| {
        let now = chrono::Utc::now();
        let cond = |t: &str, s: &str, r: &str| json!({"type": t, "status": s, "reason": r, "message": "", "lastTransitionTime": now});
        let status = json!({
            "runId": "run-1", "startedAt": now, "finishedAt": now,
            "conditions": [
                cond("Ready", if degraded { "False" } else { "True" }, "Converged"),
                cond("Degraded", if degraded { "True" } else { "False" }, if degraded { "SetupFailed" } else { "AsExpected" }),
            ],
            "pools": [{"pool": "workers", "desired": 2, "ready": 1, "joining": 0, "notReady": 0,
                       "broken": u32::from(degraded), "removing": 0, "drifted": 0}],
            "lastPlan": [],
        });
        let snap = store.read_config().await.unwrap();
        let mut data = snap.data.clone();
        data.insert(keys::STATUS.to_owned(), status.to_string());
        store
            .replace_config(&snap.resource_version, data)
            .await
            .unwrap();
    };
    write_status(false).await;
    oxide_controller::adapters::kube_cluster::KubeCluster::new(client, NAMESPACE)
        .record_event(
            oxide_controller::ports::cluster::EventType::Warning,
            "SetupFailed",
            "demo-workers-bbbbb: node setup failed at k3s-install: download failed",
        )
        .await
        .unwrap();

    let (code, out, err) = env.scale(&["status"]).await;
    assert_eq!(code, 0, "Ready: {err}");
    assert!(
        out.starts_with("cluster demo (project demo): Ready\n"),
        "{out}"
    );
    for needle in [
        "pool control-plane (control plane): desired 1",
        "pool workers (workers): desired 2, k3s v1.33.4+k3s1 — last run: 1 ready",
        "demo-workers-bbbbb",
        "oxide://demo-workers-aaaaa",
        "SetupFailed",
        "download failed",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let (code, out, _) = env.scale(&["status", "-o", "json"]).await;
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pools"][1]["members"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["events"][0]["reason"], "SetupFailed", "{v}");
    assert_eq!(v["lastRun"]["runId"], "run-1");
    let (code, out, _) = env.scale(&["status", "-o", "yaml"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("runId: run-1"), "{out}");

    write_status(true).await;
    let (code, out, _) = env.scale(&["status"]).await;
    assert_eq!(code, 1, "Degraded: {out}");
    assert!(
        out.starts_with("cluster demo (project demo): Degraded\n"),
        "{out}"
    );
    // Nothing was written: status only reads.
    assert_eq!(env.stored_count(), 2);
}

/// From a laptop, a cluster whose API does not answer: `scale status` fails and its last line
/// names `bootstrap recover` for the kubeconfig's context (issue 32).
#[tokio::test]
async fn status_of_a_cluster_whose_api_does_not_answer_names_bootstrap_recover() {
    let dir = tempfile::tempdir().unwrap();
    let path = oxide_sim::support::kubeconfig_without_api(dir.path(), "lost");
    let out = Command::new(env!("CARGO_BIN_EXE_scale"))
        .arg("--kubeconfig")
        .arg(&path)
        .args(["status"])
        .env_remove("KUBECONFIG")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("bootstrap recover --cluster lost --dry-run"),
        "{stderr}"
    );
}

/// Audit M1: the webhook's token may only scale workers, within the administrator's bounds;
/// an administrator with a kubeconfig changes the rest with this CLI. The same changes are
/// refused over HTTP (403 for the control plane, 422 above the ceiling, nothing written) and
/// made by `scale set` / `scale autoscale`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_changes_what_the_webhook_may_not() {
    let env = env().await;
    let (mut child, ready) = serve(&env).await;
    let base = format!("http://{}", ready["listen"].as_str().unwrap());
    let http = reqwest::Client::new();
    let put = |path: &str, body: &'static str| {
        http.put(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body)
    };
    let r = put("/pools/control-plane", r#"{"count":3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = put("/pools/workers/autoscale", r#"{"max":20}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let stored = |env: &Env| {
        let cm = env
            .kube
            .get("v1", "ConfigMap", Some(NAMESPACE), OBJECT_NAME)
            .unwrap();
        let spec = ClusterSpec::from_yaml(cm["data"][keys::SPEC].as_str().unwrap()).unwrap();
        (spec.control_plane.count, spec.worker_pools[0].max)
    };
    assert_eq!(stored(&env), (1, 10), "nothing written over HTTP");
    child.kill().await.unwrap();

    let (code, _, err) = env.scale(&["set", "3", "--pool", "control-plane"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = env.scale(&["autoscale", "--max", "20"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        stored(&env),
        (3, 20),
        "the administrator's CLI changed both"
    );
}

/// Issue 33: `scale upgrade --to VERSION` checks the version against what the Nodes run
/// before it writes: a skipped minor and a downgrade exit 2 naming `k3s.version` and what to
/// set, with no mutating request; an allowed version whose pre-flight cannot run (no rack)
/// is not written either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_checks_the_version_and_writes_nothing_without_its_pre_flight() {
    let env = env().await;
    for (name, pool) in [
        ("demo-control-plane-aaaaa", "control-plane"),
        ("demo-workers-aaaaa", "workers"),
    ] {
        env.kube
            .apply(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"oxide-controller/pool": pool}},
                "status": {"nodeInfo": {"kubeletVersion": "v1.33.4+k3s1",
                    "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                    "osImage": "", "containerRuntimeVersion": "", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64"}}}))
            .unwrap();
    }
    let version = || {
        let cm = env
            .kube
            .get("v1", "ConfigMap", Some(NAMESPACE), OBJECT_NAME)
            .unwrap();
        ClusterSpec::from_yaml(cm["data"][keys::SPEC].as_str().unwrap())
            .unwrap()
            .k3s
            .version
    };
    let mutating = || -> u64 {
        env.kube
            .0
            .counters()
            .iter()
            .filter(|(k, _)| !k.starts_with("GET "))
            .map(|(_, n)| n)
            .sum()
    };
    for (to, words) in [
        ("v1.35.0+k3s1", "Set k3s.version to a v1.34 release first"),
        (
            "v1.32.9+k3s1",
            "restore the etcd snapshot taken before the upgrade",
        ),
        ("v1.33.4+k3s0", "does not support downgrading"),
        // etcd 3.6 over etcd 3.5.21 (audit day2-fidelity-4 finding 2).
        (
            "v1.34.1+k3s1",
            "Roll the servers to v1.33.7+k3s3 (etcd v3.5.26) or a later v1.33 release first",
        ),
    ] {
        let before = mutating();
        let (code, out, err) = env.scale(&["upgrade", "--to", to]).await;
        assert_eq!(code, 2, "{to}: {out}{err}");
        assert!(
            err.contains("k3s.version") && err.contains(words),
            "{to}: {err}"
        );
        assert_eq!(mutating(), before, "{to}: no mutating request");
    }
    assert_eq!(version(), "v1.33.4+k3s1");

    // An allowed version still needs the pre-flight, which reads each server's address from
    // the rack: without one (this cluster's Secret names none) nothing is written, dry run or
    // not (the pre-flight against a simulated rack: reconcile-once `e2e.rs`
    // `an_api_the_target_removes_still_requested_on_one_server_blocks_the_upgrade_until_allowed`).
    for args in [
        &["upgrade", "--to", "v1.33.7+k3s3", "--dry-run"][..],
        &["upgrade", "--to", "v1.33.7+k3s3"][..],
    ] {
        let before = mutating();
        let (code, out, err) = env.scale(args).await;
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert!(
            err.contains("observing the cluster for the pre-flight"),
            "{err}"
        );
        assert_eq!(mutating(), before, "{args:?}: no mutating request");
    }
    assert_eq!(version(), "v1.33.4+k3s1");
    // `scale status` shows each Node's kubelet version and the pool's target.
    let (_, out, _) = env.scale(&["status", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pools"][1]["version"], "v1.33.4+k3s1", "{v}");
    assert_eq!(
        v["pools"][1]["members"][0]["version"], "v1.33.4+k3s1",
        "{v}"
    );
}
