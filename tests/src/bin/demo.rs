//! The whole story on the embedded simulator, in one command (`scripts/demo`):
//! start `oxide-sim`, `bootstrap` a 3 control-plane + 2 worker cluster at k3s
//! [`FROM`], show the Ready nodes, scale to 4 workers through the webhook with its token, let
//! the reconcile Job run (the simulator runs Jobs as local processes of our binaries, under the
//! ServiceAccount's RBAC), show the nodes and the status, upgrade to the patch release [`TO`]
//! with `scale upgrade` (the simulator's release mirror serves both) and let the reconcile
//! Jobs roll it, show the nodes and the upgrade's phases, tear down. Needs no root; talks only
//! to loopback.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::{Sim, SimOptions};
use tokio::io::{AsyncBufReadExt, BufReader};

const CLUSTER: &str = "demo";
/// The k3s release bootstrap installs, and the newer patch release of the same minor the demo
/// upgrades to (the product's default); the simulator's release mirror serves both
/// (`oxide_sim::guest::K3S_RELEASES`).
const FROM: &str = "v1.33.1+k3s1";
const TO: &str = "v1.33.4+k3s1";

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("demo: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(demo()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(msg: &str) {
    use std::io::IsTerminal as _;
    if oxide_controller::base::telemetry::colour(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    ) {
        println!("\n\x1b[1m==> {msg}\x1b[0m");
    } else {
        println!("\n==> {msg}");
    }
    let _ = std::io::stdout().flush();
}

async fn demo() -> Result<()> {
    let started = Instant::now();
    let bin_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .context("locating the binaries")?;
    for b in ["bootstrap", "reconcile-once", "scale"] {
        if !bin_dir.join(b).exists() {
            bail!(
                "{} is missing; build the workspace first (scripts/demo does)",
                bin_dir.join(b).display()
            );
        }
    }
    let work = tempfile::Builder::new()
        .prefix("oxide-controller-demo-")
        .tempdir()?;
    let dir = work.path();

    say("starting oxide-sim (a simulated Oxide rack; its VMs run a simulated k3s)");
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        job_binaries: Some(bin_dir.clone()),
        state_dir: Some(dir.join("sim")),
        // Each cluster runs a real Kubernetes control plane (built from tests/kube).
        kubernetes: ControlPlaneOptions::default(),
        ..SimOptions::default()
    })
    .await
    .context("starting the simulator")?;
    println!(
        "Oxide API at {} (project and images do not exist yet)",
        sim.oxide_host
    );

    // A small disk image to upload, so bootstrap exercises its image import too.
    let image = dir.join("ubuntu-demo.raw");
    write_image(&image)?;

    say(&format!(
        "bootstrap: 3 control-plane + 2 worker VMs at k3s {FROM}"
    ));
    let kubeconfig = dir.join("demo.kubeconfig");
    run(
        &bin_dir.join("bootstrap"),
        &[
            "--oxide-host",
            &sim.oxide_host,
            "--cluster",
            CLUSTER,
            "--control-planes",
            "3",
            "--workers",
            "2",
            "--k3s-version",
            FROM,
            "--image",
            "ubuntu-demo",
            "--image-source",
            &image.display().to_string(),
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--ssh-port",
            "2222",
            "--state-dir",
            &dir.join("state").display().to_string(),
            "--schedule",
            "* * * * *",
            // No in-cluster backups: a roll of the servers waits for a backup taken after it
            // was decided (issue 46), which the hourly schedule would make the demo's upgrade
            // wait for; without a schedule the roll goes on and the findings say so.
            "--backup-schedule",
            "off",
            "--log-format",
            "text",
        ],
        &[
            ("OXIDE_TOKEN", sim.oxide_token.as_str()),
            ("HOME", &dir.display().to_string()),
        ],
        "bootstrap",
        Duration::from_secs(90),
    )
    .await?;

    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None).await?;
    say("nodes after bootstrap");
    show_nodes(&client).await?;

    say("the scale webhook, running as its ServiceAccount oxide-controller-webhook");
    let sa_kubeconfig = dir.join("webhook.kubeconfig");
    let cluster = sim
        .control_planes()
        .into_iter()
        .next()
        .context("the cluster's control plane is not running")?;
    // What a pod reaches the API at: the cluster's Service address (kubernetes.default).
    let server = cluster.service_url.clone();
    std::fs::write(
        &sa_kubeconfig,
        cluster
            .control_plane
            .service_account_kubeconfig(&server, "kube-system", "oxide-controller-webhook")
            .await?,
    )?;
    // The token, as an operator reads it: kubectl -n kube-system get secret
    // oxide-controller-webhook-auth ...
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), "kube-system");
    let secret = secrets.get("oxide-controller-webhook-auth").await?;
    let key = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let token = key("webhook-token")
        .context("Secret oxide-controller-webhook-auth has no webhook-token")?;
    // The webhook's account may not read the Secret: its pod mounts the token keys (written
    // here as the kubelet writes a Secret volume).
    let mounted = dir.join("webhook-secrets");
    std::fs::create_dir_all(&mounted)?;
    std::fs::write(mounted.join("webhook-token"), &token)?;
    if let Some(read) = key("webhook-read-token") {
        std::fs::write(mounted.join("webhook-read-token"), read)?;
    }
    let port = free_port()?;
    let mut webhook = tokio::process::Command::new(bin_dir.join("scale"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--secrets-dir",
        ])
        .arg(&mounted)
        .env("KUBECONFIG", &sa_kubeconfig)
        .env("OXIDE_CONTROLLER_LOG_FORMAT", "text")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting scale serve")?;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    wait_for(Duration::from_secs(20), || {
        let http = http.clone();
        let url = format!("{base}/readyz");
        async move {
            http.get(url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    })
    .await
    .context("the webhook did not become ready")?;
    println!("webhook listening on {base}");

    say("PUT /nodes/workers {\"count\":4}   (curl -H \"Authorization: Bearer $TOKEN\" ...)");
    let resp = http
        .put(format!("{base}/nodes/workers"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(r#"{"count":4}"#)
        .send()
        .await?;
    println!("{} {}", resp.status(), resp.text().await?);
    let unauth = http
        .put(format!("{base}/nodes/workers"))
        .body(r#"{"count":9}"#)
        .send()
        .await?;
    println!("(without the token: {})", unauth.status());

    say("the webhook started Job oxide-controller-now; the simulator runs it (reconcile-once)");
    wait_for(Duration::from_secs(60), || {
        let client = client.clone();
        async move { ready_workers(&client).await.unwrap_or(0) >= 4 }
    })
    .await
    .context("workers did not reach 4 Ready")?;
    // One more run to record the converged state in status.json.
    let r = http
        .post(format!("{base}/reconcile"))
        .bearer_auth(&token)
        .send()
        .await?;
    println!("POST /reconcile: {} {}", r.status(), r.text().await?);
    // That POST answers "pending" while the previous Job still exists, whose run may have
    // observed the cluster before the new workers were Ready; then the next scheduled run
    // would record them a minute later. Ask again until a run has.
    wait_for(Duration::from_secs(60), || {
        let http = http.clone();
        let (url, token) = (format!("{base}/status"), token.clone());
        let reconcile_url = format!("{base}/reconcile");
        async move {
            let status = get_status(&http, &url, &token).await;
            let done = is_ready(&status)
                && status["pools"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["pool"] == "workers" && p["ready"] == 4));
            if !done {
                let _ = http.post(reconcile_url).bearer_auth(token).send().await;
            }
            done
        }
    })
    .await
    .context("status.json did not report the cluster Ready with 4 workers")?;

    say("nodes after scaling");
    show_nodes(&client).await?;

    say("status.json (kubectl -n kube-system get configmap oxide-controller -o yaml)");
    let status = http
        .get(format!("{base}/status"))
        .bearer_auth(&token)
        .send()
        .await?
        .text()
        .await?;
    println!("{status}");

    say(&format!(
        "scale upgrade --to {TO}   (a newer k3s patch release; servers first, then the workers)"
    ));
    // Where the upgrade pre-flight finds the release: the simulator's stand-in for GitHub's
    // k3s releases, set in the spec as an operator would (kubectl -n kube-system edit configmap
    // oxide-controller). Only the pre-flight reads it; no member changes.
    set_release_url(&client, &sim.release_url).await?;
    println!(
        "k3s.release_url: {} (the simulator's release mirror)",
        sim.release_url
    );
    run(
        &bin_dir.join("scale"),
        &[
            "upgrade",
            "--to",
            TO,
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ],
        &[("OXIDE_CONTROLLER_LOG_FORMAT", "text")],
        "scale upgrade",
        Duration::from_secs(60),
    )
    .await?;

    say("the reconcile Jobs roll every member to the new release (POST /reconcile after each run)");
    // The CronJob runs every minute; a run started through the webhook as soon as the last
    // one ends rolls the next step at once. Each phase status.json reports is printed once.
    let phase = std::sync::Mutex::new(String::new());
    let status_url = format!("{base}/status");
    wait_for(Duration::from_secs(240), || {
        let (http, client, token) = (http.clone(), client.clone(), token.clone());
        let (status_url, reconcile_url, phase) =
            (status_url.clone(), format!("{base}/reconcile"), &phase);
        async move {
            let status = get_status(&http, &status_url, &token).await;
            let upgrade = &status["upgrade"];
            if let Some(p) = upgrade["phase"].as_str() {
                let mut last = phase.lock().unwrap_or_else(|e| e.into_inner());
                if *last != p {
                    println!(
                        "status.json upgrade: phase {p} ({} → {}, started {})",
                        upgrade["from"].as_str().unwrap_or("?"),
                        upgrade["to"].as_str().unwrap_or("?"),
                        upgrade["startedAt"].as_str().unwrap_or("?"),
                    );
                    p.clone_into(&mut last);
                }
            }
            // Done: every Node at the new release (3 + 4 of them), and a run recorded it
            // with no upgrade under way and the cluster Ready.
            let nodes = node_versions(&client).await.unwrap_or_default();
            let done = nodes.len() == 7
                && nodes.iter().all(|v| v == TO)
                && upgrade.is_null()
                && is_ready(&status)
                && status["versions"].as_array().is_some_and(|pools| {
                    pools.iter().all(|p| {
                        p["nodes"]
                            .as_object()
                            .is_some_and(|n| n.values().all(|v| v == TO))
                    })
                });
            if !done {
                // "pending" while a run is under way; a new run once it has ended.
                let _ = http.post(reconcile_url).bearer_auth(token).send().await;
            }
            done
        }
    })
    .await
    .with_context(|| {
        format!(
            "the upgrade to {TO} did not finish (last status.json upgrade phase: {:?})",
            phase.lock().map(|p| p.clone()).unwrap_or_default()
        )
    })?;
    let status = get_status(&http, &status_url, &token).await;
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready");
    println!(
        "status.json: no upgrade under way (no `upgrade` entry); Ready {} ({}: {})",
        ready.map_or("?", |c| c["status"].as_str().unwrap_or("?")),
        ready.map_or("?", |c| c["reason"].as_str().unwrap_or("?")),
        ready.map_or("?", |c| c["message"].as_str().unwrap_or("?")),
    );
    for pool in status["versions"].as_array().into_iter().flatten() {
        println!(
            "status.json versions: pool {} target {}, {} Nodes at it",
            pool["pool"].as_str().unwrap_or("?"),
            pool["target"].as_str().unwrap_or("?"),
            pool["nodes"]
                .as_object()
                .map_or(0, |n| n.values().filter(|v| **v == pool["target"]).count()),
        );
    }

    say(&format!("nodes after the upgrade to {TO}"));
    show_nodes(&client).await?;

    say("tearing down");
    let _ = webhook.kill().await;
    sim.shutdown();
    println!("done in {:.0?}", started.elapsed());
    Ok(())
}

/// Runs a binary to completion, streaming its output with a prefix.
async fn run(
    bin: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    tag: &str,
    limit: Duration,
) -> Result<()> {
    let mut child = tokio::process::Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut pumps = Vec::new();
    for out in [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child.stderr.take().map(|e| Box::new(e) as _),
    ]
    .into_iter()
    .flatten()
    {
        let tag = tag.to_owned();
        pumps.push(tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                println!("  [{tag}] {line}");
            }
        }));
    }
    let status = tokio::time::timeout(limit, child.wait())
        .await
        .with_context(|| format!("{tag} took longer than {limit:?}"))??;
    for p in pumps {
        let _ = p.await;
    }
    if !status.success() {
        bail!("{tag} exited with {status}");
    }
    Ok(())
}

/// `kubectl get nodes`: the apiserver's own table (server-side printing), as kubectl asks.
async fn show_nodes(client: &kube::Client) -> Result<()> {
    let req = http::Request::get("/api/v1/nodes")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())?;
    let table: serde_json::Value = client.request(req).await?;
    let columns: Vec<String> = table["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["priority"].as_i64().unwrap_or(0) == 0)
        .filter_map(|c| c["name"].as_str().map(str::to_uppercase))
        .collect();
    let mut rows: Vec<Vec<String>> = table["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            r["cells"]
                .as_array()
                .into_iter()
                .flatten()
                .take(columns.len())
                .map(|c| match c {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .collect();
    rows.sort();
    let width = |i: usize| {
        rows.iter()
            .map(|r| r.get(i).map_or(0, String::len))
            .chain([columns[i].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..columns.len()).map(width).collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("   ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(&columns));
    for r in &rows {
        println!("{}", line(r));
    }
    Ok(())
}

/// status.json as the webhook's `GET /status` serves it (the object itself, or under `status`).
async fn get_status(http: &reqwest::Client, url: &str, token: &str) -> serde_json::Value {
    let Ok(r) = http.get(url).bearer_auth(token).send().await else {
        return serde_json::Value::Null;
    };
    let v: serde_json::Value =
        serde_json::from_slice(&r.bytes().await.unwrap_or_default()).unwrap_or_default();
    if v["conditions"].is_array() {
        v
    } else {
        v["status"].clone()
    }
}

/// Whether status.json's `Ready` condition is `True`.
fn is_ready(status: &serde_json::Value) -> bool {
    status["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The k3s release each Node runs (`status.nodeInfo.kubeletVersion`), as `kubectl get nodes`
/// shows it in VERSION.
async fn node_versions(client: &kube::Client) -> Result<Vec<String>> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    Ok(nodes
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            n.status
                .and_then(|s| s.node_info)
                .map(|i| i.kubelet_version)
                .unwrap_or_default()
        })
        .collect())
}

/// Sets the spec's `k3s.release_url` in ConfigMap `kube-system/oxide-controller`, as
/// `kubectl edit` would: read, change, write back under the read's resourceVersion (again
/// on a conflict, e.g. with a run writing status.json).
async fn set_release_url(client: &kube::Client, url: &str) -> Result<()> {
    use oxide_controller::domain::spec::ClusterSpec;
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), "kube-system");
    for _ in 0..5 {
        let mut cm = maps.get("oxide-controller").await?;
        let data = cm.data.get_or_insert_default();
        let text = data
            .get(oxide_controller::ports::state::keys::SPEC)
            .context("ConfigMap oxide-controller has no spec.yaml")?;
        let mut spec = ClusterSpec::from_yaml(text)?;
        url.clone_into(&mut spec.k3s.release_url);
        data.insert(
            oxide_controller::ports::state::keys::SPEC.to_owned(),
            spec.to_yaml(),
        );
        match maps
            .replace("oxide-controller", &Default::default(), &cm)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    bail!("ConfigMap oxide-controller kept changing; k3s.release_url not set")
}

async fn ready_workers(client: &kube::Client) -> Result<usize> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let list = nodes.list(&Default::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|x| x.starts_with("demo-workers-"))
        })
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True")
        })
        .count())
}

async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("gave up after {limit:?}")
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A 64 MiB raw image, mostly zeros (sparse), with some data at the start and the end.
fn write_image(path: &PathBuf) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::create(path)?;
    let mut block = vec![0u8; 1 << 20];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    f.write_all(&block)?;
    f.seek(SeekFrom::Start((64 << 20) - (1 << 20)))?;
    f.write_all(&block)?;
    Ok(())
}
