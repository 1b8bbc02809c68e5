//! Issue 7 acceptance, dev controller image: `bootstrap --controller-image dev:<this repo>`
//! builds the three binaries with cargo, copies them to every control-plane VM over SSH, and
//! leaves the CronJob and the webhook Deployment running them from the node (hostPath). The
//! simulator's job runner is given NO binaries of its own here, so a reconcile Job that
//! completes can only have run the copy uploaded to a control-plane VM.
//!
//! The build uses the `dev` profile and the target directory the tests run from, so it is a
//! no-op when the workspace is fresh. Bad `dev:` specs exit 2 naming the flag, before any
//! Oxide API call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::{BIN, Env, IMAGE, SSH_PORT};
use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::domain::status::Status;
use oxide_controller::ports::state::StateStore as _;
use oxide_controller::render::manifests::{
    NODE_BINARIES_BASE_IMAGE, NODE_BINARIES_LABEL, NODE_BINARIES_MOUNT,
};
use oxide_sim::{Sim, SimOptions};
use serde_json::{Value, json};

const CP: &str = "demo-control-plane-";
const BINARIES: [&str; 3] = ["bootstrap", "reconcile-once", "scale"];

/// The repository (the workspace the dev image is built from).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The target directory the tests were built in (`<target>/debug/bootstrap`).
fn target_dir() -> PathBuf {
    Path::new(BIN)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A simulator whose job runner runs Jobs but has no binaries of its own (an empty directory).
async fn env_without_job_binaries() -> (Env, tempfile::TempDir) {
    let empty = tempfile::tempdir().unwrap();
    let sim = Sim::start(SimOptions {
        ssh_port: SSH_PORT,
        job_binaries: Some(empty.path().to_path_buf()),
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    sim.oxide()
        .seed_silo_image(IMAGE, "ubuntu", "24.04", 2 << 30);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), format!("{}\n", sim.oxide_token)).unwrap();
    (Env { sim, dir }, empty)
}

/// bootstrap with `extra`, building into the tests' own target directory.
async fn run(env: &Env, extra: &[&str]) -> Output {
    tokio::time::timeout(
        Duration::from_secs(900),
        env.command(&env.args(extra))
            .env("CARGO_TARGET_DIR", target_dir())
            .output(),
    )
    .await
    .expect("bootstrap finished in time")
    .unwrap()
}

/// Runs with `args`, expects exit 2 with one human line containing `needles`, and no Oxide
/// API request at all.
async fn refused(env: &Env, extra: &[&str], needles: &[&str]) {
    env.sim.oxide().reset_counters();
    let out = run(env, extra).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{extra:?}\n{stderr}");
    let human: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('{'))
        .collect();
    assert_eq!(human.len(), 1, "one line for a person: {stderr}");
    for needle in needles {
        assert!(human[0].contains(needle), "{:?} lacks {needle:?}", human[0]);
    }
    let calls: u64 = env.sim.oxide().counters().values().sum();
    assert_eq!(calls, 0, "{extra:?}: {:?}", env.sim.oxide().counters());
    assert!(!env.state_dir().join("demo.json").exists());
}

fn instances(env: &Env, prefix: &str) -> Vec<(String, String)> {
    env.dump()["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|i| {
            let name = i["name"].as_str()?;
            name.starts_with(prefix)
                .then(|| (name.to_owned(), i["id"].as_str().unwrap().to_owned()))
        })
        .collect()
}

/// The pod spec of the CronJob's Jobs and of the webhook's pods, from the cluster.
async fn pod_specs(env: &Env) -> [(Value, &'static str); 2] {
    let kube = env.sim.kube();
    let cron = kube
        .get(
            "batch/v1",
            "CronJob",
            Some("oxide-controller-jobs"),
            "oxide-controller",
        )
        .await
        .unwrap();
    let hook = kube
        .get(
            "apps/v1",
            "Deployment",
            Some("kube-system"),
            "oxide-controller-webhook",
        )
        .await
        .unwrap();
    [
        (
            cron["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone(),
            "reconcile-once",
        ),
        (hook["spec"]["template"]["spec"].clone(), "scale"),
    ]
}

/// A Job made from the CronJob's template (what `kubectl create job --from=cronjob/…` does).
async fn trigger_job(env: &Env, name: &str) {
    let cron = env
        .sim
        .kube()
        .get(
            "batch/v1",
            "CronJob",
            Some("oxide-controller-jobs"),
            "oxide-controller",
        )
        .await
        .unwrap();
    env.sim
        .kube()
        .apply(json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": "oxide-controller-jobs",
                "labels": cron["spec"]["jobTemplate"]["metadata"]["labels"].clone(),
            },
            "spec": cron["spec"]["jobTemplate"]["spec"].clone(),
        }))
        .await
        .unwrap();
}

async fn job_outcome(env: &Env, name: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let job = env
            .sim
            .kube()
            .get("batch/v1", "Job", Some("oxide-controller-jobs"), name)
            .await
            .unwrap();
        if let Some(c) = job["status"]["conditions"].as_array().and_then(|c| {
            c.iter().find(|c| {
                c["status"] == "True" && (c["type"] == "Complete" || c["type"] == "Failed")
            })
        }) {
            return c["type"].as_str().unwrap().to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Job {name} did not finish: {job}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn status_run_id(store: &KubeStateStore) -> Option<String> {
    let snap = store.read_config().await.ok()?;
    snap.status_json()
        .and_then(Status::from_json)
        .map(|s| s.run_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dev_image_run_leaves_the_cronjob_and_webhook_running_the_freshly_built_binaries() {
    let (env, _empty) = env_without_job_binaries().await;
    let spec = format!("dev:{}", repo().display());
    let out = run(
        &env,
        &[
            "--controller-image",
            &spec,
            "--dev-build-profile",
            "dev",
            "--workers",
            "1",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    // The freshly built binaries: where `cargo build --profile dev` put them.
    let fresh: Vec<(&str, Vec<u8>)> = BINARIES
        .iter()
        .map(|b| {
            (
                *b,
                std::fs::read(target_dir().join("debug").join(b)).unwrap(),
            )
        })
        .collect();

    // The manifests run them from the node.
    let [(cron_pod, _), _] = pod_specs(&env).await;
    let host_dir = cron_pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["hostPath"]["path"].as_str())
        .expect("a hostPath volume")
        .to_owned();
    assert!(
        host_dir.starts_with("/var/lib/oxide-controller/bin/"),
        "{host_dir}"
    );
    let build_id = host_dir.rsplit('/').next().unwrap().to_owned();
    for (pod, program) in pod_specs(&env).await {
        let c = &pod["containers"][0];
        assert_eq!(c["image"], NODE_BINARIES_BASE_IMAGE);
        assert_eq!(c["command"][0], format!("{NODE_BINARIES_MOUNT}/{program}"));
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["hostPath"]["path"] == host_dir.as_str())
            .expect("the binaries' hostPath volume");
        assert_eq!(volume["hostPath"]["type"], "Directory");
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume["name"])
            .expect("mounted");
        assert_eq!(mount["mountPath"], NODE_BINARIES_MOUNT);
        assert_eq!(mount["readOnly"], true);
        assert_eq!(pod["nodeSelector"][NODE_BINARIES_LABEL], build_id.as_str());
        assert!(
            pod["tolerations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["key"] == "node-role.kubernetes.io/control-plane"),
            "runs on control-plane nodes"
        );
    }

    // Every control-plane VM has the very bytes cargo built, executable, and its Node says so;
    // the worker has neither.
    let servers = instances(&env, CP);
    assert_eq!(servers.len(), 3);
    for (name, id) in &servers {
        for (binary, bytes) in &fresh {
            let file = env
                .sim
                .boot()
                .uploaded_file(id.parse().unwrap(), &format!("{host_dir}/{binary}"))
                .unwrap_or_else(|| panic!("{binary} is not on {name}"));
            assert!(
                std::fs::read(&file).unwrap() == *bytes,
                "{binary} on {name} is not the fresh build"
            );
            assert_eq!(
                std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
                0o755,
                "{binary} on {name}"
            );
        }
        assert!(
            env.sim
                .boot()
                .uploaded_file(id.parse().unwrap(), &format!("{host_dir}/SHA256SUMS"))
                .is_some()
        );
    }
    let nodes = env.sim.kube().list("v1", "Node", None).await;
    for n in &nodes {
        let name = n["metadata"]["name"].as_str().unwrap();
        let label = &n["metadata"]["labels"][NODE_BINARIES_LABEL];
        if name.starts_with(CP) {
            assert_eq!(*label, build_id.as_str(), "{name}");
        } else {
            assert!(label.is_null(), "{name} has no binaries and no label");
        }
    }

    // A reconcile Job from the CronJob runs — and can only run the uploaded copy.
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let store = KubeStateStore::new(client, "kube-system");
    let before = status_run_id(&store).await;
    trigger_job(&env, "oxide-controller-now").await;
    assert_eq!(job_outcome(&env, "oxide-controller-now").await, "Complete");
    let after = status_run_id(&store).await;
    assert!(
        after.is_some() && after != before,
        "the Job's reconcile run wrote its status ({before:?} → {after:?})"
    );

    // A second run finds the binaries in place (nothing to copy) and changes nothing.
    let out = run(
        &env,
        &[
            "--controller-image",
            &spec,
            "--dev-build-profile",
            "dev",
            "--workers",
            "1",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = common::log_lines(&out.stderr);
    let hows: Vec<&str> = lines
        .iter()
        .filter(|l| l["message"] == "controller binaries on the node")
        .filter_map(|l| l["how"].as_str())
        .collect();
    assert_eq!(
        hows.len(),
        3 + 1,
        "the first server twice, then the others: {hows:?}"
    );
    assert!(hows.iter().all(|h| *h == "already there"), "{hows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_dev_specs_exit_2_naming_the_flag_before_any_api_call() {
    let (env, _empty) = env_without_job_binaries().await;
    let repo = repo().display().to_string();
    let not_a_workspace = tempfile::tempdir().unwrap();
    // A workspace without the controller's binaries.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(
        other.path().join("Cargo.toml"),
        "[package]\nname = \"other\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::create_dir(other.path().join("src")).unwrap();
    std::fs::write(other.path().join("src/main.rs"), "fn main() {}\n").unwrap();
    let other_arch = if cfg!(target_arch = "aarch64") {
        "linux/amd64"
    } else {
        "linux/arm64"
    };
    let cases: Vec<(String, Vec<&str>)> = vec![
        ("dev:".into(), vec!["--controller-image", "no source path"]),
        (
            format!("dev:{repo}:"),
            vec!["--controller-image", "no platform"],
        ),
        (
            format!("dev:{repo}:linux/amd64:x"),
            vec!["--controller-image", "more than one ':'"],
        ),
        (
            format!("dev:{repo}:plan9/amd64"),
            vec!["--controller-image", "unknown platform", "plan9/amd64"],
        ),
        (
            format!("dev:{repo}:linux"),
            vec!["--controller-image", "unknown platform"],
        ),
        (
            format!("dev:{repo}:{other_arch}"),
            vec!["--controller-image", "unsupported platform", other_arch],
        ),
        (
            format!("dev:{}", not_a_workspace.path().display()),
            vec![
                "--controller-image",
                "not a cargo workspace",
                "no Cargo.toml",
            ],
        ),
        (
            "dev:/nonexistent/src".into(),
            vec![
                "--controller-image",
                "/nonexistent/src",
                "no such directory",
            ],
        ),
        (
            format!("dev:{}", other.path().display()),
            vec!["--controller-image", "no binary bootstrap"],
        ),
    ];
    for (spec, needles) in &cases {
        refused(&env, &["--controller-image", spec], needles).await;
    }
    refused(
        &env,
        &[
            "--controller-image",
            &format!("dev:{repo}"),
            "--dev-build-profile",
            "a b",
        ],
        &["--dev-build-profile", "a b"],
    )
    .await;
    refused(
        &env,
        &["--dev-build-profile", "dev"],
        &["--dev-build-profile", "dev:PATH"],
    )
    .await;
}
