//! What the pending-pod trigger's tests and benchmark share: a simulated 1 + 1 cluster whose
//! Jobs run the real binaries, `scale serve` as a process, and readings of both.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use oxide_controller::domain::spec::ClusterSpec;
use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::time::Instant;

pub const RECONCILE: &str = env!("CARGO_BIN_EXE_reconcile-once");

pub fn scale_bin() -> PathBuf {
    let p = Path::new(RECONCILE).with_file_name("scale");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p scale` (cargo test --workspace builds it)",
        p.display()
    );
    p
}

/// The in-cluster manifests of `k8s-cronjobs/` (namespace, accounts, RBAC, CronJob), one object
/// per document.
pub fn manifests() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../k8s-cronjobs");
    let mut out = Vec::new();
    for f in [
        "00-namespace.yaml",
        "serviceaccount.yaml",
        "rbac.yaml",
        "cronjob.yaml",
        "admission.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        for doc in text.split("\n---") {
            let v: Value = serde_saphyr::from_str(doc).unwrap_or(Value::Null);
            if v.is_object() {
                out.push(v);
            }
        }
    }
    out
}

/// Standard base64 decoded to text (Secret data).
pub fn base64_decode(s: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    String::from_utf8(bytes).ok()
}

/// A 1 + 1 cluster whose Jobs run the real binaries, with the manifests' CronJob suspended,
/// and the workers autoscaling (min 1, `max`) when `autoscale`.
pub async fn cluster(autoscale: bool, max: u32) -> (SimHandle, String) {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 1,
        }),
        kubernetes: ControlPlaneOptions::default(),
        job_binaries: Some(
            Path::new(RECONCILE)
                .parent()
                .unwrap_or(Path::new("."))
                .to_path_buf(),
        ),
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    for mut v in manifests() {
        if v["kind"] == "CronJob" {
            // Only the webhook starts runs here.
            v["spec"]["suspend"] = json!(true);
        }
        sim.kube()
            .apply(v)
            .await
            .unwrap_or_else(|e| panic!("manifests: {e}"));
    }
    let kube = sim.kube();
    let cm = kube
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await
        .unwrap_or_else(|| panic!("no ConfigMap"));
    let mut spec = ClusterSpec::from_yaml(cm["data"]["spec.yaml"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    let w = &mut spec.worker_pools[0];
    w.min = 1;
    w.max = max;
    w.autoscale = autoscale.then(oxide_controller::domain::autoscale::AutoscaleSpec::default);
    kube.merge_patch(
        "v1",
        "ConfigMap",
        Some("kube-system"),
        "oxide-controller",
        &json!({"data": {"spec.yaml": spec.to_yaml()}}),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let token = kube
        .get(
            "v1",
            "Secret",
            Some("kube-system"),
            "oxide-controller-webhook-auth",
        )
        .await
        .and_then(|s| s["data"]["webhook-token"].as_str().map(str::to_owned))
        .and_then(|b| base64_decode(&b))
        .unwrap_or_else(|| panic!("no webhook token"));
    (sim, token)
}

/// `scale serve` for the simulator's cluster, re-reading the spec every second.
pub struct Webhook {
    pub child: tokio::process::Child,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Webhook {
    pub async fn start(sim: &SimHandle, token: &str) -> Webhook {
        let kc = sim
            .kubeconfig
            .clone()
            .unwrap_or_else(|| panic!("kubeconfig"));
        let mut child = tokio::process::Command::new(scale_bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--pending-recheck-seconds",
                "1",
            ])
            .env("KUBECONFIG", &kc)
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("WEBHOOK_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
        tokio::time::timeout(
            Duration::from_secs(20),
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .unwrap_or_else(|_| panic!("webhook did not start"))
        .unwrap_or_else(|e| panic!("{e}"));
        let listen: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        Webhook {
            child,
            base: format!("http://{}", listen["listen"].as_str().unwrap_or_default()),
            token: token.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    pub async fn metrics(&self) -> String {
        match self
            .http
            .get(format!("{}/metrics", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// `oxide_controller_triggers_total{reason=...}`.
    pub async fn triggers(&self, reason: &str) -> u64 {
        let prefix = format!("oxide_controller_triggers_total{{reason=\"{reason}\"}} ");
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    }

    /// Waits (at most 30 s) until the webhook says it watches pods.
    pub async fn wait_watching(&self) {
        wait_until(
            "the webhook to watch pods",
            Duration::from_secs(30),
            async || self.watching().await,
        )
        .await;
    }

    pub async fn watching(&self) -> bool {
        self.metrics()
            .await
            .lines()
            .any(|l| l == "oxide_controller_webhook_pending_watch 1")
    }

    pub async fn status(&self) -> Value {
        let r = self
            .http
            .get(format!("{}/status", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or(Value::Null)
    }
}

pub async fn wait_until(what: &str, limit: Duration, check: impl AsyncFn() -> bool) -> Duration {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed()
}

pub fn creates(sim: &SimHandle) -> u64 {
    sim.oxide()
        .counters()
        .get("POST /v1/instances")
        .copied()
        .unwrap_or(0)
}

/// Pods of `cpu` each (a Deployment, as a user would make them).
pub async fn deployment(sim: &SimHandle, name: &str, replicas: u32, cpu: &str) {
    sim.kube()
        .apply(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "nginx",
                        "resources": {"requests": {"cpu": cpu}}}]}}}
        }))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Applies the in-cluster manifests ([`manifests`]) with the CronJob suspended, so the only
/// reconcile runs are the Jobs a test starts.
/// The reconcile Lease `kube-system/oxide-controller`, if any.
pub async fn lease(sim: &SimHandle) -> Option<Value> {
    sim.kube()
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-system"),
            "oxide-controller",
        )
        .await
}

pub async fn install_suspended(kube: &oxide_sim::guest::cluster_api::KubeView) {
    for mut v in manifests() {
        if v["kind"] == "CronJob" {
            v["spec"]["suspend"] = json!(true);
        }
        kube.apply(v).await.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Starts Job `name` from the CronJob's template (as `kubectl create job --from`), its pod
/// held to `node`, and waits (two minutes at most) until it finished; returns `Complete` or
/// `Failed`. The template selects servers only (issue 34 §3); an operator may override that
/// (the chart's `reconcile.nodeSelector`), and a run placed on a worker must still behave, so
/// the pin replaces the servers-only selector.
pub async fn run_job_on(
    kube: &oxide_sim::guest::cluster_api::KubeView,
    name: &str,
    node: &str,
) -> String {
    let cron = kube
        .get(
            "batch/v1",
            "CronJob",
            Some("oxide-controller-jobs"),
            "oxide-controller",
        )
        .await
        .unwrap_or_else(|| panic!("cronjob"));
    let mut spec = cron["spec"]["jobTemplate"]["spec"].clone();
    let selector = &mut spec["template"]["spec"]["nodeSelector"];
    if let Some(map) = selector.as_object_mut() {
        map.remove("node-role.kubernetes.io/control-plane");
    }
    selector["kubernetes.io/hostname"] = json!(node);
    kube.apply(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "oxide-controller-jobs"}, "spec": spec}))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let job = kube
            .get("batch/v1", "Job", Some("oxide-controller-jobs"), name)
            .await
            .unwrap_or_else(|| panic!("job {name}"));
        let done = job["status"]["conditions"].as_array().and_then(|c| {
            c.iter()
                .filter(|c| c["type"] == "Complete" || c["type"] == "Failed")
                .find(|c| c["status"] == "True")
                .and_then(|c| c["type"].as_str().map(str::to_owned))
        });
        if let Some(done) = done {
            return done;
        }
        assert!(Instant::now() < deadline, "the Job did not finish: {job}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
