//! Issue 6 acceptance: the RBAC in `k8s-cronjobs/` is exactly what the functions use. The real
//! `reconcile-once` and `scale serve` run against the cluster twin as ServiceAccount
//! `kube-system/oxide-controller` (the twin authorises by the stored Roles), and a scenario
//! touching every permission succeeds; removing any single verb makes some step fail.
//!
//! `scale` is found next to `reconcile-once` (both are built by `cargo test --workspace`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use oxide_sim::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

const RECONCILE: &str = env!("CARGO_BIN_EXE_reconcile-once");
const WK: &str = "sim-workers-";

fn scale_bin() -> PathBuf {
    let p = Path::new(RECONCILE).with_file_name("scale");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p scale` (cargo test --workspace builds it)",
        p.display()
    );
    p
}

/// The manifests, one object per document.
fn manifests() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../k8s-cronjobs");
    let mut out = Vec::new();
    for f in ["serviceaccount.yaml", "rbac.yaml", "cronjob.yaml"] {
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

/// Every (object index, rule index, verb) of the Role and ClusterRole.
fn verbs(objs: &[Value]) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (i, o) in objs.iter().enumerate() {
        if o["kind"] == "Role" || o["kind"] == "ClusterRole" {
            for (r, rule) in o["rules"].as_array().into_iter().flatten().enumerate() {
                for v in rule["verbs"].as_array().into_iter().flatten() {
                    out.push((i, r, v.as_str().unwrap_or_default().to_owned()));
                }
            }
        }
    }
    out
}

fn without(objs: &[Value], (i, r, verb): &(usize, usize, String)) -> Vec<Value> {
    let mut objs = objs.to_vec();
    let rules = objs[*i]["rules"]
        .as_array_mut()
        .unwrap_or_else(|| unreachable!());
    let verbs = rules[*r]["verbs"]
        .as_array_mut()
        .unwrap_or_else(|| unreachable!());
    verbs.retain(|v| v != verb.as_str());
    if verbs.is_empty() {
        rules.remove(*r);
    }
    objs
}

fn ready_workers(sim: &SimHandle) -> usize {
    sim.oxide().dump()["instances"].as_array().map_or(0, |a| {
        a.iter()
            .filter(|i| i["name"].as_str().is_some_and(|n| n.starts_with(WK)))
            .count()
    })
}

fn put_pod(sim: &SimHandle, name: &str, node: &str) {
    sim.twin()
        .upsert(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Runs the scenario with `objs` as the in-cluster RBAC. Ok(()) when every step worked, else
/// the first step that did not.
async fn scenario(objs: &[Value]) -> Result<(), String> {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 2,
        }),
        ..SimOptions::default()
    })
    .await
    .map_err(|e| format!("sim: {e:#}"))?;
    for o in objs {
        sim.twin()
            .upsert(o.clone())
            .map_err(|e| format!("applying {}: {e}", o["kind"]))?;
    }
    for (i, n) in sim
        .twin()
        .list("v1", "Node", None)
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .filter(|n| n.starts_with(WK))
        .enumerate()
    {
        put_pod(&sim, &format!("web-{i}"), &n);
    }
    let kc_text = std::fs::read_to_string(sim.kubeconfig.as_ref().ok_or("no kubeconfig")?)
        .map_err(|e| e.to_string())?;
    let server = kc_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .ok_or("no server")?
        .to_owned();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let sa = dir.path().join("sa.kubeconfig");
    std::fs::write(
        &sa,
        sim.twin()
            .service_account_kubeconfig(&server, "kube-system", "oxide-controller"),
    )
    .map_err(|e| e.to_string())?;
    let token = sim
        .twin()
        .get("v1", "Secret", Some("kube-system"), "oxide-controller")
        .and_then(|s| s["data"]["webhook-token"].as_str().map(str::to_owned))
        .and_then(|b| base64_decode(&b))
        .ok_or("no webhook token")?;

    // The webhook, as the ServiceAccount.
    let mut webhook = tokio::process::Command::new(scale_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-cache-seconds",
            "0",
        ])
        .env("KUBECONFIG", &sa)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    let stdout = webhook.stdout.take().ok_or("no stdout")?;
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .map_err(|_| "webhook did not start")?
    .map_err(|e| e.to_string())?;
    let listen: Value =
        serde_json::from_str(&line).map_err(|e| format!("webhook start line {line:?}: {e}"))?;
    let base = format!("http://{}", listen["listen"].as_str().ok_or("listen")?);
    let http = reqwest::Client::new();
    let patch = |delta: i32| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let r = http
                .patch(format!("{base}/nodes/workers"))
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(format!(r#"{{"delta":{delta}}}"#))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let reconcile = r
                .headers()
                .get("x-oxide-controller-reconcile")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            if !status.is_success() || !matches!(reconcile.as_str(), "triggered" | "pending") {
                return Err(format!(
                    "PATCH {delta}: {status} reconcile={reconcile} {body}"
                ));
            }
            Ok::<_, String>(())
        }
    };
    let reconcile = |extra: &'static [&'static str]| {
        let sa = sa.clone();
        async move {
            let out = tokio::process::Command::new(RECONCILE)
                .args(["--log-format", "json"])
                .args(extra)
                .env("KUBECONFIG", &sa)
                .kill_on_drop(true)
                .output()
                .await
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!(
                    "reconcile-once {extra:?}: {}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok::<_, String>(())
        }
    };

    // A: change the count, start a Job.
    patch(-1).await?;
    // B: scale down with eviction; the first run creates the Lease.
    reconcile(&[]).await?;
    if ready_workers(&sim) != 1 {
        return Err(format!("B: {} workers left, want 1", ready_workers(&sim)));
    }
    if sim
        .twin()
        .list("events.k8s.io/v1", "Event", Some("kube-system"))
        .is_empty()
    {
        return Err("B: no Events recorded".into());
    }
    // E: the autoscaler would remove the idle worker but for a kube-system pod: it lists
    // the PodDisruptionBudgets (and all pods, as it does on every run while a pool
    // autoscales). Autoscaling goes off again before the webhook changes the count.
    let worker = sim
        .twin()
        .list("v1", "Node", None)
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .find(|n| n.starts_with(WK))
        .ok_or("E: no worker")?;
    for p in sim.twin().list("v1", "Pod", Some("default")) {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        sim.twin().delete("v1", "Pod", Some("default"), &name);
    }
    sim.twin()
        .upsert(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "system-0", "namespace": "kube-system",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "system",
                    "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]},
            "spec": {"nodeName": worker, "containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "10m"}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .map_err(|e| e.to_string())?;
    set_autoscale(&sim, true)?;
    reconcile(&[]).await?;
    let kept = sim
        .twin()
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .and_then(|c| c["data"]["status.json"].as_str().map(str::to_owned))
        .unwrap_or_default();
    if !kept.contains("without a PodDisruptionBudget") {
        return Err(format!(
            "E: the kube-system pod did not keep the node: {kept}"
        ));
    }
    set_autoscale(&sim, false)?;
    // C: the Job finished; the next change replaces it.
    let mut job = sim
        .twin()
        .get(
            "batch/v1",
            "Job",
            Some("kube-system"),
            "oxide-controller-now",
        )
        .ok_or("C: no Job")?;
    job["status"] = json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]});
    sim.twin().upsert(job).map_err(|e| e.to_string())?;
    patch(-1).await?;
    // D: scale down deleting pods (--force-drain); the Lease exists now and is updated.
    reconcile(&["--force-drain"]).await?;
    if ready_workers(&sim) != 0 {
        return Err(format!("D: {} workers left, want 0", ready_workers(&sim)));
    }
    let _ = webhook.kill().await;
    Ok(())
}

/// Turns autoscaling of the workers on (min 0, max 2, no delay) or off, as an admin would.
fn set_autoscale(sim: &SimHandle, on: bool) -> Result<(), String> {
    let mut cm = sim
        .twin()
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .ok_or("no ConfigMap")?;
    let yaml = cm["data"]["spec.yaml"].as_str().ok_or("no spec.yaml")?;
    let mut spec =
        oxide_controller::spec::ClusterSpec::from_yaml(yaml).map_err(|e| e.to_string())?;
    let w = &mut spec.worker_pools[0];
    w.min = 0;
    w.autoscale = on.then(|| oxide_controller::autoscale::AutoscaleSpec {
        scale_down_unneeded_seconds: 0,
        ..Default::default()
    });
    cm["data"]["spec.yaml"] = json!(spec.to_yaml());
    sim.twin().upsert(cm).map_err(|e| e.to_string())?;
    Ok(())
}

fn base64_decode(s: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    String::from_utf8(bytes).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_rbac_is_enough_and_every_verb_is_needed() {
    let objs = manifests();
    scenario(&objs)
        .await
        .unwrap_or_else(|e| panic!("with the manifests' RBAC: {e}"));
    let cases = verbs(&objs);
    assert!(cases.len() >= 15, "{cases:?}");
    let results = futures::future::join_all(cases.iter().map(|c| {
        let objs = without(&objs, c);
        async move { (c.clone(), scenario(&objs).await) }
    }))
    .await;
    for ((i, r, verb), res) in results {
        let rule = &objs[i]["rules"][r];
        assert!(
            res.is_err(),
            "removing {verb:?} from {} rule {} ({}) broke nothing",
            objs[i]["kind"],
            r,
            rule["resources"]
        );
    }
}
