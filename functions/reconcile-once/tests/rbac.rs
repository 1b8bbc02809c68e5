//! Issues 6 and 34 acceptance: the RBAC in `k8s-cronjobs/` is exactly what each function uses.
//! The real `reconcile-once` runs as `oxide-controller-jobs/oxide-controller-reconcile` and the
//! real `scale serve` as `kube-system/oxide-controller-webhook`, its tokens read from the
//! Secret's keys as its pod mounts them (the real RBAC authorizer decides); a scenario touching
//! every permission of both succeeds, and removing any single verb of either account makes
//! some step fail with the real authorizer's 403. What neither account may do is asked of the
//! real authorizer as `kubectl auth can-i` asks it (SubjectAccessReview), and Pod Security
//! `restricted` in the Jobs' namespace is the real admission plugin's.
//!
//! `scale` is found next to `reconcile-once` (both are built by `cargo test --workspace`).

use std::process::Stdio;
use std::time::Duration;

use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

const WK: &str = "sim-workers-";
/// The reconcile Jobs' namespace (k8s-cronjobs/00-namespace.yaml).
const JOBS_NS: &str = "oxide-controller-jobs";

#[path = "support/pending.rs"]
mod support;
use support::{RECONCILE, base64_decode, manifests, scale_bin};

/// The in-cluster backup's objects (k8s-cronjobs/backup.yaml).
fn backup_manifests() -> Vec<Value> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../k8s-cronjobs/backup.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(Value::is_object)
        .collect()
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

async fn put_pod(sim: &SimHandle, name: &str, node: &str) {
    sim.kube()
        .apply(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]}
        }))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Polls `check` until it holds, or fails naming `what` after a minute.
async fn wait_until(what: &str, check: impl AsyncFn() -> bool) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check().await {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Runs the scenario with `objs` as the in-cluster RBAC. Ok(()) when every step worked, else
/// the first step that did not.
async fn scenario(objs: &[Value]) -> Result<(), String> {
    // The reconcile Jobs the webhook starts really run (the pod runner), as a program that
    // finishes at once: the Job then completes under the real Job controller, so the next
    // trigger must replace it, and the scenario's own runs below are the only real ones.
    let bins = tempfile::tempdir().map_err(|e| e.to_string())?;
    let stub = bins.path().join("reconcile-once");
    std::fs::write(&stub, "#!/bin/sh\nexit 0\n").map_err(|e| e.to_string())?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 2,
        }),
        kubernetes: ControlPlaneOptions::default(),
        job_binaries: Some(bins.path().to_path_buf()),
        ..SimOptions::default()
    })
    .await
    .map_err(|e| format!("sim: {e:#}"))?;
    let kube = sim.kube();
    for o in objs {
        let mut o = o.clone();
        if o["kind"] == "CronJob" {
            // No scheduled runs during the scenario.
            o["spec"]["suspend"] = json!(true);
        }
        kube.apply(o.clone())
            .await
            .map_err(|e| format!("applying {}: {e}", o["kind"]))?;
    }
    let workers: Vec<String> = kube
        .list("v1", "Node", None)
        .await
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .filter(|n| n.starts_with(WK))
        .collect();
    for (i, n) in workers.iter().enumerate() {
        put_pod(&sim, &format!("web-{i}"), n).await;
    }
    let kc_text = std::fs::read_to_string(sim.kubeconfig.as_ref().ok_or("no kubeconfig")?)
        .map_err(|e| e.to_string())?;
    let server = kc_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .ok_or("no server")?
        .to_owned();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let real = sim
        .control_planes()
        .into_iter()
        .next()
        .ok_or("no control plane")?;
    let account_kubeconfig = async |ns: &str, account: &str| {
        let path = dir.path().join(format!("{account}.kubeconfig"));
        let text = real
            .control_plane
            .service_account_kubeconfig(&server, ns, account)
            .await
            .map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        Ok::<_, String>(path)
    };
    // reconcile-once's account (the Jobs'); the webhook's.
    let sa = account_kubeconfig(JOBS_NS, "oxide-controller-reconcile").await?;
    let webhook_sa = account_kubeconfig("kube-system", "oxide-controller-webhook").await?;
    // The webhook's Secret, written as the kubelet writes its pod's Secret volume (the account
    // itself may not read it).
    let secret = kube
        .get(
            "v1",
            "Secret",
            Some("kube-system"),
            "oxide-controller-webhook-auth",
        )
        .await
        .ok_or("no Secret oxide-controller-webhook-auth")?;
    let mounted = dir.path().join("webhook-secrets");
    std::fs::create_dir_all(&mounted).map_err(|e| e.to_string())?;
    for key in ["webhook-token", "webhook-read-token"] {
        if let Some(v) = secret["data"][key].as_str().and_then(base64_decode) {
            std::fs::write(mounted.join(key), v).map_err(|e| e.to_string())?;
        }
    }
    let token = secret["data"]["webhook-token"]
        .as_str()
        .and_then(base64_decode)
        .ok_or("no webhook token")?;

    // The webhook, as its ServiceAccount, with its mounted keys.
    let mut webhook = tokio::process::Command::new(scale_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-cache-seconds",
            "0",
            "--pending-recheck-seconds",
            "1",
            "--secrets-dir",
        ])
        .arg(&mounted)
        .env("KUBECONFIG", &webhook_sa)
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
    // The webhook's serving pair 20 days from its end: the first run re-issues it (reads both
    // webhook Secrets, replaces the pair's).
    let secret = |name: &'static str| {
        let kube = kube.clone();
        async move {
            kube.get("v1", "Secret", Some("kube-system"), name)
                .await
                .ok_or(format!("no Secret {name}"))
        }
    };
    let field = |s: &Value, k: &str| {
        s["data"][k]
            .as_str()
            .and_then(base64_decode)
            .unwrap_or_default()
    };
    let ca_secret = secret("oxide-controller-webhook-ca").await?;
    let ca = oxide_controller::adapters::webhook_tls::WebhookCa {
        ca_pem: field(&ca_secret, "ca.crt"),
        ca_key_pem: field(&ca_secret, "ca.key"),
    };
    let due = oxide_controller::adapters::webhook_tls::reissue(
        &ca,
        "sim",
        "kube-system",
        chrono::Utc::now() - chrono::Duration::days(345),
    )
    .map_err(|e| e.to_string())?;
    kube.apply(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "oxide-controller-webhook-tls", "namespace": "kube-system"},
        "stringData": {"tls.crt": due.cert_pem, "tls.key": due.key_pem},
    }))
    .await
    .map_err(|e| format!("making the webhook's pair due: {e}"))?;
    // B: scale down with eviction; the first run creates the Lease.
    reconcile(&[]).await?;
    if ready_workers(&sim) != 1 {
        return Err(format!("B: {} workers left, want 1", ready_workers(&sim)));
    }
    if !kube
        .list("events.k8s.io/v1", "Event", Some("kube-system"))
        .await
        .iter()
        .any(|e| e["reportingController"] == "oxide-controller")
    {
        return Err("B: no Events recorded".into());
    }
    // The run read k3s's certificate monitor Events (in `default`): the status has a
    // certificates section per pool.
    let status = kube
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await
        .and_then(|cm| cm["data"]["status.json"].as_str().map(str::to_owned))
        .ok_or("B: no status.json")?;
    if !status.contains("\"certificates\"") {
        return Err(format!(
            "B: the status has no certificates (the monitor's Events were not read): {status}"
        ));
    }
    // The webhook's pair was re-issued by the run (issue 46 item 1).
    let parsed: Value = serde_json::from_str(&status).map_err(|e| e.to_string())?;
    let kept = &parsed["webhookCertificate"];
    if !kept["renewedAt"].is_string() || !kept["error"].is_null() {
        return Err(format!(
            "B: the webhook's certificate was not re-issued: {kept}"
        ));
    }
    if field(&secret("oxide-controller-webhook-tls").await?, "tls.crt") == due.cert_pem {
        return Err("B: the webhook's Secret still holds the old pair".into());
    }
    // E: the autoscaler would remove the idle worker but for a kube-system pod: it lists
    // the PodDisruptionBudgets (and all pods, as it does on every run while a pool
    // autoscales, and the PersistentVolumes, as some pod mounts a claim). Autoscaling goes off again before the webhook changes the count.
    let worker = kube
        .list("v1", "Node", None)
        .await
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .find(|n| n.starts_with(WK))
        .ok_or("E: no worker")?;
    for p in kube.list("v1", "Pod", Some("default")).await {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        kube.delete("v1", "Pod", Some("default"), &name).await;
    }
    // Gone, not only Terminating: their kubelet (KWOK) confirms the end within their grace.
    wait_until("E: the deleted pods gone", async || {
        kube.list("v1", "Pod", Some("default")).await.is_empty()
    })
    .await?;
    // A kube-system pod of a real ReplicaSet on the worker.
    kube.apply(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "system", "namespace": "kube-system"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "system"}},
            "template": {"metadata": {"labels": {"app": "system"}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": worker},
                    "containers": [{"name": "c", "image": "nginx",
                        "resources": {"requests": {"cpu": "10m"}}}]}}}
    }))
    .await
    .map_err(|e| e.to_string())?;
    wait_until(
        "E: the ReplicaSet's pod Running on the worker",
        async || {
            kube.list("v1", "Pod", Some("kube-system"))
                .await
                .iter()
                .any(|p| {
                    p["metadata"]["labels"]["app"] == "system" && p["status"]["phase"] == "Running"
                })
        },
    )
    .await?;
    // A pod mounting a claim: the run lists the PersistentVolumes to see where volumes are
    // pinned (its claim does not exist, so the scheduler refuses it for good).
    kube.apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "claimer", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    }))
    .await
    .map_err(|e| e.to_string())?;
    set_autoscale(&sim, true).await?;
    reconcile(&[]).await?;
    let kept = kube
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await
        .and_then(|c| c["data"]["status.json"].as_str().map(str::to_owned))
        .unwrap_or_default();
    if !kept.contains("without a PodDisruptionBudget") {
        return Err(format!(
            "E: the kube-system pod did not keep the node: {kept}"
        ));
    }
    // F: while a pool autoscales the webhook watches for pods the scheduler cannot place and
    // starts a run for them (a pod no worker can hold: the run changes nothing).
    kube.apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "huge", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx",
            "resources": {"requests": {"cpu": "64"}}}]}
    }))
    .await
    .map_err(|e| e.to_string())?;
    wait_until(
        "F: the webhook to start a run for the pending pod",
        async || {
            let metrics = http
                .get(format!("{base}/metrics"))
                .bearer_auth(&token)
                .send()
                .await;
            match metrics {
                Ok(r) => r
                    .text()
                    .await
                    .unwrap_or_default()
                    .contains("oxide_controller_triggers_total{reason=\"pending_pods\"} 1"),
                Err(_) => false,
            }
        },
    )
    .await?;
    kube.delete("v1", "Pod", Some("default"), "huge").await;
    set_autoscale(&sim, false).await?;
    // C: the Job finished (its pod ran and exited 0; the real Job controller completed it);
    // the next change replaces it.
    wait_until("C: the on-demand Job to complete", async || {
        kube.get("batch/v1", "Job", Some(JOBS_NS), "oxide-controller-now")
            .await
            .and_then(|j| j["status"]["conditions"].as_array().cloned())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Complete" && c["status"] == "True")
            })
    })
    .await?;
    patch(-1).await?;
    // D: scale down again; the Lease exists now and is updated. (No forced drain: deleting
    // pods is a person's right, not the in-cluster account's.)
    reconcile(&[]).await?;
    if ready_workers(&sim) != 0 {
        return Err(format!("D: {} workers left, want 0", ready_workers(&sim)));
    }
    // G: the upgrade pre-flight reads the server's own /metrics (a non-resource URL), as
    // `scale upgrade --dry-run` runs it: it passes (no deprecated API in use; the cluster is
    // minutes old, so the apiserver-history window is turned off, as an admin may).
    edit_spec(&sim, |s| s.upgrade.api_history_seconds = 0).await?;
    let out = tokio::process::Command::new(scale_bin())
        .args(["upgrade", "--to", "v1.33.7+k3s3", "--dry-run"])
        .env("KUBECONFIG", &sa)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains("pre-flight: passed") {
        return Err(format!(
            "G: scale upgrade --dry-run: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let _ = webhook.kill().await;
    Ok(())
}

/// Turns autoscaling of the workers on (min 0, max 2, no delay) or off, as an admin would.
async fn set_autoscale(sim: &SimHandle, on: bool) -> Result<(), String> {
    edit_spec(sim, |spec| {
        let w = &mut spec.worker_pools[0];
        w.min = 0;
        w.autoscale = on.then(|| oxide_controller::domain::autoscale::AutoscaleSpec {
            scale_down_unneeded_seconds: 0,
            ..Default::default()
        });
    })
    .await
}

/// Edits spec.yaml in the ConfigMap, as an admin would.
async fn edit_spec(
    sim: &SimHandle,
    f: impl FnOnce(&mut oxide_controller::domain::spec::ClusterSpec),
) -> Result<(), String> {
    let kube = sim.kube();
    let cm = kube
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await
        .ok_or("no ConfigMap")?;
    let yaml = cm["data"]["spec.yaml"].as_str().ok_or("no spec.yaml")?;
    let mut spec =
        oxide_controller::domain::spec::ClusterSpec::from_yaml(yaml).map_err(|e| e.to_string())?;
    f(&mut spec);
    kube.merge_patch(
        "v1",
        "ConfigMap",
        Some("kube-system"),
        "oxide-controller",
        &json!({"data": {"spec.yaml": spec.to_yaml()}}),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_rbac_is_enough_and_every_verb_is_needed() {
    let objs = manifests();
    scenario(&objs)
        .await
        .unwrap_or_else(|e| panic!("with the manifests' RBAC: {e}"));
    let cases = verbs(&objs);
    assert!(cases.len() >= 15, "{cases:?}");
    // Three at a time: each scenario runs its own control plane (~0.6 GB, a few seconds of
    // CPU to start) on this 2-core machine.
    use futures::StreamExt as _;
    let results: Vec<_> = futures::stream::iter(cases.iter().map(|c| {
        let objs = without(&objs, c);
        async move { (c.clone(), scenario(&objs).await) }
    }))
    .buffer_unordered(3)
    .collect()
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

/// `kubectl auth can-i VERB RESOURCE [-n NS] --as=USER`, asked of the real authorizer.
async fn can_i(
    client: &kube::Client,
    user: &str,
    verb: &str,
    (group, resource): (&str, &str),
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                namespace: namespace.map(str::to_owned),
                name: name.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    let answer = api
        .create(&kube::api::PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SubjectAccessReview: {e}"));
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_account_may_do_what_it_does_not_need_and_the_jobs_namespace_is_restricted() {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 1,
        }),
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("sim: {e:#}"));
    let kube = sim.kube();
    for o in manifests().into_iter().chain(backup_manifests()) {
        kube.apply(o).await.unwrap_or_else(|e| panic!("{e}"));
    }
    let client = oxide_controller::adapters::kubeclient::client(sim.kubeconfig.as_deref(), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let webhook = "system:serviceaccount:kube-system:oxide-controller-webhook";
    let reconcile = "system:serviceaccount:oxide-controller-jobs:oxide-controller-reconcile";
    let (core, batch) = ("", "batch");
    let ks = Some("kube-system");
    // What each needs, as a sanity check of the question itself.
    assert!(
        can_i(
            &client,
            reconcile,
            "get",
            (core, "secrets"),
            ks,
            Some("oxide-controller")
        )
        .await
    );
    assert!(
        can_i(
            &client,
            webhook,
            "create",
            (batch, "jobs"),
            Some(JOBS_NS),
            None
        )
        .await
    );
    // The issue's acceptance: the webhook cannot get the rack or join Secret, and creates pods
    // or Jobs nowhere but the Jobs' namespace (and there only Jobs). It writes its counts in
    // their own ConfigMap, never the spec (audit security-2 N4).
    assert!(
        can_i(
            &client,
            webhook,
            "update",
            (core, "configmaps"),
            ks,
            Some("oxide-controller-scale")
        )
        .await
    );
    for (verb, what, ns, name) in [
        ("update", (core, "configmaps"), ks, Some("oxide-controller")),
        ("patch", (core, "configmaps"), ks, Some("oxide-controller")),
        ("create", (core, "configmaps"), ks, None),
        ("get", (core, "secrets"), ks, Some("oxide-controller")),
        ("list", (core, "secrets"), ks, None),
        ("create", (core, "pods"), ks, None),
        ("create", (batch, "jobs"), ks, None),
        ("create", (core, "pods"), Some(JOBS_NS), None),
        ("create", (core, "pods"), Some("default"), None),
        ("create", (batch, "jobs"), Some("default"), None),
        ("delete", (core, "pods"), Some("default"), None),
    ] {
        assert!(
            !can_i(&client, webhook, verb, what, ns, name).await,
            "the webhook may {verb} {what:?} in {ns:?}"
        );
    }
    // The reconcile account: no pod created anywhere, none deleted (a forced drain is a
    // person's), no Job started.
    for (verb, what, ns) in [
        ("create", (core, "pods"), ks),
        ("create", (core, "pods"), Some(JOBS_NS)),
        ("delete", (core, "pods"), Some("default")),
        ("create", (batch, "jobs"), Some(JOBS_NS)),
        ("create", (batch, "jobs"), ks),
    ] {
        assert!(
            !can_i(&client, reconcile, verb, what, ns, None).await,
            "the reconcile account may {verb} {what:?} in {ns:?}"
        );
    }
    // The backup account (issue 36): the ConfigMap by name, nothing else; no Secret at all (audit
    // security-2 N1, N8: the server token that decrypts a snapshot's Secrets stays out of the
    // pod; its rack credentials are a Secret of its namespace the kubelet mounts). Its
    // namespace admits host paths, so no account of ours may put a pod or Job there.
    let backup = "system:serviceaccount:oxide-controller-backup:oxide-controller-backup";
    let backup_ns = Some("oxide-controller-backup");
    for (verb, what, ns, name) in [
        ("get", (core, "configmaps"), ks, Some("oxide-controller")),
        (
            "get",
            (core, "configmaps"),
            ks,
            Some("oxide-controller-backup"),
        ),
        (
            "update",
            (core, "configmaps"),
            ks,
            Some("oxide-controller-backup"),
        ),
    ] {
        assert!(
            can_i(&client, backup, verb, what, ns, name).await,
            "{verb} {what:?}"
        );
    }
    // backup.json is the only object it writes: not the spec, not the webhook's counts
    // (audit security-2 N4).
    for (verb, name) in [
        ("update", "oxide-controller"),
        ("patch", "oxide-controller"),
        ("update", "oxide-controller-scale"),
    ] {
        assert!(
            !can_i(&client, backup, verb, (core, "configmaps"), ks, Some(name)).await,
            "the backup account may {verb} ConfigMap {name}"
        );
    }
    for (user, verb, what, ns, name) in [
        (
            backup,
            "get",
            (core, "secrets"),
            ks,
            Some("oxide-controller"),
        ),
        (
            backup,
            "get",
            (core, "secrets"),
            backup_ns,
            Some("oxide-controller-rack"),
        ),
        (backup, "list", (core, "secrets"), ks, None),
        (backup, "get", (core, "secrets"), ks, Some("k3s-serving")),
        (
            backup,
            "update",
            (core, "secrets"),
            ks,
            Some("oxide-controller"),
        ),
        (backup, "create", (core, "pods"), backup_ns, None),
        (backup, "create", (batch, "jobs"), backup_ns, None),
        (backup, "create", (core, "pods"), ks, None),
        (backup, "list", (core, "nodes"), None, None),
        (webhook, "create", (core, "pods"), backup_ns, None),
        (webhook, "create", (batch, "jobs"), backup_ns, None),
        (reconcile, "create", (core, "pods"), backup_ns, None),
        (reconcile, "create", (batch, "jobs"), backup_ns, None),
    ] {
        assert!(
            !can_i(&client, user, verb, what, ns, name).await,
            "{user} may {verb} {what:?} {name:?} in {ns:?}"
        );
    }
    // Audit H1: the webhook's tokens are in no Secret that any of our accounts may read: the
    // reconcile account reads the state Secret whole, so they are not in it, and their own
    // Secret is the webhook pod's volume only (the webhook reads files, never the API). Every
    // Secret of kube-system holding a token, asked of the real authorizer.
    let holding: Vec<String> = kube
        .list("v1", "Secret", ks)
        .await
        .iter()
        .filter(|s| {
            ["webhook-token", "webhook-read-token"]
                .iter()
                .any(|k| s["data"].get(k).is_some())
        })
        .filter_map(|s| s["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(holding, ["oxide-controller-webhook-auth"]);
    for name in holding
        .iter()
        .map(String::as_str)
        .chain(["oxide-controller-webhook-auth"])
    {
        for user in [reconcile, webhook, backup] {
            for verb in ["get", "list", "watch"] {
                assert!(
                    !can_i(&client, user, verb, (core, "secrets"), ks, Some(name)).await,
                    "{user} may {verb} Secret {name}, which holds the webhook's tokens"
                );
            }
        }
    }

    // Nothing of the single account of earlier releases is left to bind to.
    assert!(
        !can_i(
            &client,
            "system:serviceaccount:kube-system:oxide-controller",
            "get",
            (core, "secrets"),
            ks,
            Some("oxide-controller")
        )
        .await
    );

    // Pod Security `restricted` in the Jobs' namespace: the CronJob's own pod is admitted, a
    // pod with a host path (root on the node) is not.
    let cron = kube
        .get("batch/v1", "CronJob", Some(JOBS_NS), "oxide-controller")
        .await
        .unwrap_or_else(|| panic!("CronJob"));
    let template = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone();
    let mut ours = template.clone();
    ours["nodeSelector"] = json!({"nowhere": "true"});
    kube.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "like-a-run", "namespace": JOBS_NS}, "spec": ours}))
        .await
        .unwrap_or_else(|e| panic!("the CronJob's pod is refused: {e}"));
    let mut rooted = template;
    rooted["nodeSelector"] = json!({"nowhere": "true"});
    rooted["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}]);
    rooted["containers"][0]["volumeMounts"] = json!([{"name": "root", "mountPath": "/host"}]);
    let refused = kube
        .apply(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "host-root", "namespace": JOBS_NS}, "spec": rooted}))
        .await
        .expect_err("a hostPath pod was admitted in the Jobs' namespace");
    assert!(
        refused.contains("violates PodSecurity \"restricted:latest\"")
            && refused.contains("hostPath"),
        "{refused}"
    );
}

/// The Job `kube_cluster.rs`'s `job_from_cronjob` makes from `cron` (name, template labels,
/// `instantiate: manual`, a trigger id, the controller reference), with `spec` as its spec.
fn on_demand_job(cron: &Value, spec: &Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "oxide-controller-now",
            "namespace": JOBS_NS,
            "labels": cron["spec"]["jobTemplate"]["metadata"]["labels"],
            "annotations": {
                "cronjob.kubernetes.io/instantiate": "manual",
                "oxide-controller/trigger-id": "0123456789abcdef",
            },
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob",
                "name": cron["metadata"]["name"], "uid": cron["metadata"]["uid"],
                "controller": true,
            }],
        },
        "spec": spec,
    })
}

/// Creates `job` through `client` (a dry run when `dry_run`: admission runs all the same).
async fn create_job(client: &kube::Client, job: &Value, dry_run: bool) -> Result<(), kube::Error> {
    use k8s_openapi::api::batch::v1::Job;
    let job: Job = serde_json::from_value(job.clone()).unwrap_or_else(|e| panic!("{e}"));
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let api: kube::Api<Job> = kube::Api::namespaced(client.clone(), &ns);
    let params = kube::api::PostParams {
        dry_run,
        ..kube::api::PostParams::default()
    };
    api.create(&params, &job).await.map(drop)
}

/// Audit security-2 N2: the webhook's account may create only the on-demand Job made from the
/// reconcile CronJob's template (k8s-cronjobs/admission.yaml), decided by the real API
/// server's ValidatingAdmissionPolicy plugin. As that account (its token from the TokenRequest
/// API, as its pod's): the Job the webhook makes is admitted, through `scale serve`'s
/// POST /reconcile too, and so is one built from the manifest's undefaulted template (the
/// API server defaults the Job before the policy compares it with the stored CronJob); the same
/// Job with another image, account, command, volume, placement, name, pod label, parallelism or
/// owner is refused with the policy's message and nothing is created. An administrator is not
/// bound by the policy; without the CronJob the webhook's creates are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_account_may_create_only_the_job_the_cronjob_makes() {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 1,
        }),
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("sim: {e:#}"));
    let kube = sim.kube();
    let raw_cron = manifests()
        .into_iter()
        .find(|o| o["kind"] == "CronJob")
        .unwrap_or_else(|| panic!("no CronJob in the manifests"));
    for mut o in manifests() {
        if o["kind"] == "CronJob" {
            // Only the webhook starts Jobs here.
            o["spec"]["suspend"] = json!(true);
        }
        kube.apply(o).await.unwrap_or_else(|e| panic!("{e}"));
    }
    let admin = oxide_controller::adapters::kubeclient::client(sim.kubeconfig.as_deref(), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let kc_text = std::fs::read_to_string(sim.kubeconfig.as_ref().unwrap_or_else(|| panic!("kc")))
        .unwrap_or_else(|e| panic!("{e}"));
    let server = kc_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap_or_else(|| panic!("no server"))
        .to_owned();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let real = sim
        .control_planes()
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no control plane"));
    let webhook_kc = dir.path().join("webhook.kubeconfig");
    std::fs::write(
        &webhook_kc,
        real.control_plane
            .service_account_kubeconfig(&server, "kube-system", "oxide-controller-webhook")
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let webhook = oxide_controller::adapters::kubeclient::client(Some(&webhook_kc), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The binding's parameter, as the API server stores it (defaulted).
    let cron = kube
        .get("batch/v1", "CronJob", Some(JOBS_NS), "oxide-controller")
        .await
        .unwrap_or_else(|| panic!("CronJob"));
    let spec = cron["spec"]["jobTemplate"]["spec"].clone();
    let ours = on_demand_job(&cron, &spec);
    // The crux: the Job built from the manifest's own template, never defaulted by anyone but
    // the API server on this create, equals the stored CronJob's defaulted template.
    let raw = on_demand_job(&cron, &raw_cron["spec"]["jobTemplate"]["spec"]);
    assert_ne!(
        raw["spec"]["template"]["spec"], spec["template"]["spec"],
        "the stored CronJob is defaulted, the manifest is not"
    );

    let pod = |f: &dyn Fn(&mut Value)| {
        let mut job = ours.clone();
        f(&mut job["spec"]["template"]["spec"]);
        job
    };
    let whole = |f: &dyn Fn(&mut Value)| {
        let mut job = ours.clone();
        f(&mut job);
        job
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "another image",
            pod(&|p| p["containers"][0]["image"] = json!("registry.example/anything:1")),
            "pod spec is not the reconcile CronJob's",
        ),
        (
            "another account",
            pod(&|p| p["serviceAccountName"] = json!("default")),
            "pod spec is not the reconcile CronJob's",
        ),
        (
            "another command",
            pod(&|p| p["containers"][0]["command"] = json!(["/bin/sh", "-c", "id"])),
            "pod spec is not the reconcile CronJob's",
        ),
        (
            "an extra volume",
            pod(&|p| p["volumes"] = json!([{"name": "scratch", "emptyDir": {}}])),
            "pod spec is not the reconcile CronJob's",
        ),
        (
            "another node",
            pod(&|p| p["nodeName"] = json!("sim-workers-0")),
            "pod spec is not the reconcile CronJob's",
        ),
        (
            "another name",
            whole(&|j| j["metadata"]["name"] = json!("oxide-controller-other")),
            "may only create the on-demand Job oxide-controller-now",
        ),
        (
            "another pod label",
            whole(&|j| j["spec"]["template"]["metadata"]["labels"]["extra"] = json!("x")),
            "pod labels or annotations are not the reconcile CronJob's",
        ),
        (
            "ten pods at once",
            whole(&|j| j["spec"]["parallelism"] = json!(10)),
            "parallelism or selector are not the reconcile CronJob's",
        ),
        (
            "no owner",
            whole(&|j| j["metadata"]["ownerReferences"] = json!([])),
            "not owned by the reconcile CronJob",
        ),
    ];
    // The API server loads policies, bindings and parameters from informers: wait until it
    // enforces this one.
    if let Err(e) = wait_until("the policy to refuse another image", async || {
        create_job(&webhook, &cases[0].1, true).await.is_err()
    })
    .await
    {
        panic!("{e}");
    }
    // Every expression type-checks against the Job and CronJob schemas (the API server's
    // type checker reports in the policy's status).
    let policy = async || {
        kube.get(
            "admissionregistration.k8s.io/v1",
            "ValidatingAdmissionPolicy",
            None,
            "oxide-controller-webhook-jobs",
        )
        .await
        .unwrap_or_else(|| panic!("no policy"))
    };
    if let Err(e) = wait_until("the policy to be type-checked", async || {
        let p = policy().await;
        p["status"]["observedGeneration"].is_number()
            && p["status"]["observedGeneration"] == p["metadata"]["generation"]
    })
    .await
    {
        panic!("{e}: {}", policy().await);
    }
    let policy = policy().await;
    assert!(
        policy["status"]["typeChecking"]["expressionWarnings"].is_null(),
        "{}",
        policy["status"]
    );
    create_job(&webhook, &ours, true)
        .await
        .unwrap_or_else(|e| panic!("the webhook's Job is refused: {e}"));
    create_job(&webhook, &raw, true)
        .await
        .unwrap_or_else(|e| panic!("the undefaulted template is refused: {e}"));
    for (what, job, message) in &cases {
        for dry_run in [true, false] {
            let err = create_job(&webhook, job, dry_run)
                .await
                .err()
                .unwrap_or_else(|| panic!("{what}: admitted"));
            let kube::Error::Api(status) = &err else {
                panic!("{what}: {err}");
            };
            assert_eq!(status.code, 403, "{what}: {status:?}");
            assert!(
                status.message.contains(
                    "ValidatingAdmissionPolicy 'oxide-controller-webhook-jobs' with binding 'oxide-controller-webhook-jobs' denied request"
                ) && status.message.contains(message),
                "{what}: {}",
                status.message
            );
        }
    }
    assert!(
        kube.list("batch/v1", "Job", Some(JOBS_NS)).await.is_empty(),
        "nothing refused was created"
    );
    // The policy binds the webhook's account only: an administrator's Job of any image is
    // admitted (a dry run).
    create_job(&admin, &cases[0].1, true)
        .await
        .unwrap_or_else(|e| panic!("the administrator is refused: {e}"));

    // The product path: `scale serve` as the webhook's account, its Secret mounted as the
    // kubelet writes it, starts the run on POST /reconcile.
    let secret = kube
        .get(
            "v1",
            "Secret",
            Some("kube-system"),
            "oxide-controller-webhook-auth",
        )
        .await
        .unwrap_or_else(|| panic!("no Secret oxide-controller-webhook-auth"));
    let mounted = dir.path().join("webhook-secrets");
    std::fs::create_dir_all(&mounted).unwrap_or_else(|e| panic!("{e}"));
    let token = secret["data"]["webhook-token"]
        .as_str()
        .and_then(base64_decode)
        .unwrap_or_else(|| panic!("no webhook token"));
    std::fs::write(mounted.join("webhook-token"), &token).unwrap_or_else(|e| panic!("{e}"));
    let mut serve = tokio::process::Command::new(scale_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--secrets-dir"])
        .arg(&mounted)
        .env("KUBECONFIG", &webhook_kc)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut line = String::new();
    let stdout = serve.stdout.take().unwrap_or_else(|| panic!("stdout"));
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .unwrap_or_else(|_| panic!("webhook did not start"))
    .unwrap_or_else(|e| panic!("{e}"));
    let listen: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let r = reqwest::Client::new()
        .post(format!(
            "http://{}/reconcile",
            listen["listen"].as_str().unwrap_or_default()
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or_default();
    assert_eq!(
        (status, &body["reconcile"]),
        (202, &json!("triggered")),
        "{body}"
    );
    let _ = serve.kill().await;
    let jobs = kube.list("batch/v1", "Job", Some(JOBS_NS)).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        jobs[0]["spec"]["template"]["spec"], spec["template"]["spec"],
        "the run is the CronJob's"
    );

    // Without its parameter the policy refuses every create of the webhook's account.
    assert!(
        kube.delete("batch/v1", "CronJob", Some(JOBS_NS), "oxide-controller")
            .await
    );
    wait_until("the policy to miss its CronJob", async || {
        create_job(&webhook, &ours, true).await.is_err()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let err = create_job(&webhook, &ours, true)
        .await
        .err()
        .unwrap_or_else(|| unreachable!());
    assert!(
        err.to_string().contains("no params found"),
        "without the CronJob: {err}"
    );
}

/// Audit security-2 N9, on the real API server's server-side apply: bootstrap's NetworkPolicy
/// has no `spec.ingress`, so a re-run drops the label rule an earlier release applied (its
/// field manager owned it) and keeps the rule an administrator wrote naming namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_drops_the_label_rule_and_keeps_the_namespaces_an_administrator_names() {
    use oxide_controller::render::manifests::{self, Settings};
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 0,
        }),
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("sim: {e:#}"));
    let kube = sim.kube();
    let admin = oxide_controller::adapters::kubeclient::client(sim.kubeconfig.as_deref(), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut policy = manifests::render(&Settings {
        controller_image: manifests::DEFAULT_CONTROLLER_IMAGE.into(),
        schedule: "*/5 * * * *".into(),
        backup_schedule: None,
    })
    .unwrap_or_else(|e| panic!("{e}"))
    .into_iter()
    .find(|m| m.resource.kind == "NetworkPolicy")
    .unwrap_or_else(|| panic!("no NetworkPolicy"));
    let apply = async |m: &manifests::Manifest| {
        oxide_controller::adapters::kube_manifests::apply_one(&admin, m)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        kube.get(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            Some("kube-system"),
            "oxide-controller-webhook",
        )
        .await
        .unwrap_or_else(|| panic!("no NetworkPolicy"))["spec"]["ingress"]
            .clone()
    };
    // An earlier release's object, applied by bootstrap's field manager.
    let new = policy.clone();
    policy.object["spec"]["ingress"] = json!([{
        "from": [{"namespaceSelector": {"matchLabels": {"oxide-controller/webhook-client": "true"}}}],
        "ports": [{"protocol": "TCP", "port": "https"}]}]);
    assert!(apply(&policy).await.is_array());
    // This release's: no namespace admitted.
    assert!(apply(&new).await.is_null(), "the label rule is dropped");
    // The administrator names `ci` (webhook.yaml's `kubectl patch`).
    let rule = json!([{
        "from": [{"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ci"]}]}}],
        "ports": [{"protocol": "TCP", "port": "https"}]}]);
    kube.merge_patch(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        Some("kube-system"),
        "oxide-controller-webhook",
        &json!({"spec": {"ingress": rule}}),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(apply(&new).await, rule, "a bootstrap re-run keeps it");
}
