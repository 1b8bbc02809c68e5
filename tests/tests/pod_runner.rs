//! The pod runner plays the kubelet for the product's Job pods (`oxide_sim::pods::runner`):
//! a deleted pod gets SIGTERM, its grace period, then SIGKILL, and only then leaves the API;
//! a pod bound to a Node whose VM is down is neither started nor confirmed deleted; a
//! `hostPath` volume is the Node VM's directory, live, set up as its `type` says.

use std::path::Path;
use std::time::{Duration, Instant};

use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::{Value, json};

const WK: &str = "sim-workers-";

/// Programs the Job pods run (`<bin dir>/<command's file name>`).
fn write_programs(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let programs = [
        // Leaves a mark when SIGTERM arrives, then exits 0 a moment later.
        (
            "term-trap",
            "#!/bin/sh\ntrap 'echo term > \"$MARK\"; exit 0' TERM\nwhile :; do sleep 0.1; done\n",
        ),
        // Ignores SIGTERM: only SIGKILL ends it.
        (
            "term-ignore",
            "#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.1; done\n",
        ),
        // Waits for `$1/marker` (a directory it is given), copies it to $MARK and exits 0.
        (
            "wait-marker",
            "#!/bin/sh\nwhile [ ! -f \"$1/marker\" ]; do sleep 0.1; done\ncp \"$1/marker\" \"$MARK\"\n",
        ),
    ];
    for (name, text) in programs {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

async fn sim(bin_dir: &Path) -> SimHandle {
    Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 1,
        }),
        kubernetes: ControlPlaneOptions::default(),
        job_binaries: Some(bin_dir.to_path_buf()),
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"))
}

/// A Job of ours (the runner's label) running `program` with `grace` seconds.
fn job(name: &str, program: &str, grace: u64, env: &[(&str, String)], node: Option<&str>) -> Value {
    let env: Vec<Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mut spec = json!({
        "terminationGracePeriodSeconds": grace,
        "restartPolicy": "Never",
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "main", "image": "oxide-controller:test",
            "command": [format!("/usr/local/bin/{program}")], "env": env}],
    });
    if let Some(node) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "oxide-controller"}},
            "spec": spec}}})
}

async fn job_pod(sim: &SimHandle, job: &str) -> Option<Value> {
    sim.kube()
        .list("v1", "Pod", Some("default"))
        .await
        .into_iter()
        .find(|p| p["metadata"]["labels"]["job-name"] == job)
}

async fn wait_for(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn running_pod(sim: &SimHandle, job_name: &str) -> String {
    let mut name = String::new();
    wait_for(
        &format!("{job_name}'s pod to run"),
        Duration::from_secs(90),
        async || match job_pod(sim, job_name).await {
            Some(p) if p["status"]["phase"] == "Running" => {
                name = p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                true
            }
            _ => false,
        },
    )
    .await;
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_gets_sigterm_then_sigkill_after_its_grace_period_and_only_then_leaves() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_programs(dir.path());
    let mark = dir.path().join("term-seen");
    let sim = sim(dir.path()).await;
    let kube = sim.kube();

    // A program that ignores SIGTERM stays Terminating for its whole grace period.
    kube.apply(job("ignores", "term-ignore", 4, &[], None))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = running_pod(&sim, "ignores").await;
    let asked = Instant::now();
    assert!(kube.delete("v1", "Pod", Some("default"), &pod).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = kube.get("v1", "Pod", Some("default"), &pod).await;
    assert!(
        still
            .as_ref()
            .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string()),
        "the pod must stay Terminating during its 4 s grace period: {still:?}"
    );
    wait_for("the pod to go", Duration::from_secs(30), async || {
        kube.get("v1", "Pod", Some("default"), &pod).await.is_none()
    })
    .await;
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_secs(4),
        "gone after {took:?}, before its grace period ended"
    );

    // A program that handles SIGTERM gets it, and its pod goes once it exits (well within
    // its 60 s grace period).
    kube.apply(job(
        "traps",
        "term-trap",
        60,
        &[("MARK", mark.display().to_string())],
        None,
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let pod = running_pod(&sim, "traps").await;
    let asked = Instant::now();
    assert!(kube.delete("v1", "Pod", Some("default"), &pod).await);
    wait_for("the pod to go", Duration::from_secs(30), async || {
        kube.get("v1", "Pod", Some("default"), &pod).await.is_none()
    })
    .await;
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(&mark).ok().as_deref(),
        Some("term\n"),
        "the program never saw SIGTERM"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_a_halted_vms_node_is_neither_started_nor_confirmed_deleted() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_programs(dir.path());
    let sim = sim(dir.path()).await;
    let kube = sim.kube();
    let worker = sim.oxide().dump()["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .find(|i| i["name"].as_str().is_some_and(|n| n.starts_with(WK)))
        .unwrap_or_else(|| panic!("no worker"));
    let name = worker["name"].as_str().unwrap_or_default().to_owned();
    assert!(
        kube.get("v1", "Node", None, &name).await.is_some(),
        "the worker's Node is named after its instance"
    );
    let id = worker["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("id"));
    sim.oxide().set_instance_failed(id);

    // The Node is still Ready for the API (the node controller waits 50 s): the scheduler
    // binds there, but no kubelet starts the pod.
    kube.apply(job("stranded", "term-trap", 1, &[], Some(&name)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut pod = Value::Null;
    wait_for(
        "the pod to be bound",
        Duration::from_secs(60),
        async || match job_pod(&sim, "stranded").await {
            Some(p) if p["spec"]["nodeName"] == name.as_str() => {
                pod = p;
                true
            }
            _ => false,
        },
    )
    .await;
    let pod_name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // The runner looks every 250 ms: a dozen looks.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = kube
        .get("v1", "Pod", Some("default"), &pod_name)
        .await
        .unwrap_or_else(|| panic!("pod"));
    assert_eq!(now["status"]["phase"], "Pending", "{now}");

    // Deleted: nothing confirms it, so it stays Terminating.
    assert!(kube.delete("v1", "Pod", Some("default"), &pod_name).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = kube.get("v1", "Pod", Some("default"), &pod_name).await;
    assert!(
        now.as_ref()
            .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string()),
        "a pod on a dead VM's Node was confirmed deleted: {now:?}"
    );
}

/// A Job of ours pinned to `node` running `program DIR` with `DIR` a hostPath volume of
/// `host_dir` (`kind`) mounted read-only at the same path.
fn host_path_job(name: &str, node: &str, host_dir: &str, kind: &str, mark: &Path) -> Value {
    let mut job = job(
        name,
        "wait-marker",
        1,
        &[("MARK", mark.display().to_string())],
        Some(node),
    );
    let spec = &mut job["spec"]["template"]["spec"];
    spec["volumes"] = json!([{"name": "snapshots", "hostPath": {"path": host_dir, "type": kind}}]);
    spec["containers"][0]["args"] = json!([host_dir]);
    spec["containers"][0]["volumeMounts"] =
        json!([{"name": "snapshots", "mountPath": host_dir, "readOnly": true}]);
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostpath_volume_is_the_nodes_directory_live_and_a_missing_directory_fails_the_pod() {
    const SNAPSHOTS: &str = "/var/lib/rancher/k3s/server/db/snapshots";
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    write_programs(dir.path());
    let mark = dir.path().join("copied");
    let sim = sim(dir.path()).await;
    let kube = sim.kube();
    let node = kube
        .list("v1", "Node", None)
        .await
        .into_iter()
        .find(|n| n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] == "true")
        .and_then(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no control-plane Node"));

    // `type: Directory` of a directory the Node does not have: the kubelet's SetUp fails.
    kube.apply(host_path_job(
        "missing",
        &node,
        "/var/lib/nothing-here",
        "Directory",
        &mark,
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut failed = Value::Null;
    wait_for(
        "the pod to fail",
        Duration::from_secs(90),
        async || match job_pod(&sim, "missing").await {
            Some(p) if p["status"]["phase"] == "Failed" => {
                failed = p;
                true
            }
            _ => false,
        },
    )
    .await;
    assert_eq!(
        failed["status"]["message"],
        "MountVolume.SetUp failed for volume \"snapshots\" : hostPath /var/lib/nothing-here doesn't exist",
        "{failed}"
    );

    // `DirectoryOrCreate`: made empty on the Node; the program, given the mount's path,
    // sees a file written into the Node's directory after it started.
    kube.apply(host_path_job(
        "live",
        &node,
        SNAPSHOTS,
        "DirectoryOrCreate",
        &mark,
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    running_pod(&sim, "live").await;
    let on_node = sim
        .boot()
        .node_dir(&node, SNAPSHOTS)
        .unwrap_or_else(|| panic!("the Node's VM runs"));
    assert!(
        on_node.is_dir(),
        "DirectoryOrCreate made {}",
        on_node.display()
    );
    std::fs::write(on_node.join("marker"), "written by k3s later\n")
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("the pod to succeed", Duration::from_secs(30), async || {
        job_pod(&sim, "live")
            .await
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&mark).ok().as_deref(),
        Some("written by k3s later\n")
    );
}
