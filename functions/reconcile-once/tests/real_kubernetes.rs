//! The real `reconcile-once` against `oxide-sim` whose cluster runs a real Kubernetes control
//! plane (kube-apiserver, controller-manager, scheduler, etcd at the k3s version the product
//! installs, KWOK for kubelets; see `oxide_sim::control_plane`). Nodes are registered by the
//! simulated k3s, kept Ready by KWOK, marked Unknown by the real node lifecycle controller
//! when their VM stops; pods come from real Deployments, are placed by the real scheduler and
//! re-created elsewhere by the real ReplicaSet controller after an eviction.
//!
//! The cluster is eventually consistent: every expectation waits with a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::domain::status::Status;
use oxide_controller::ports::state::{self, StateStore};
use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::guest::cluster_api::KubeView;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_reconcile-once");
const WK: &str = "sim-workers-";
/// kube-controller-manager's `--node-monitor-grace-period` in these tests (50 s upstream).
// 20 s, not less: KWOK heartbeats every fifth of it, and on a loaded 2-core machine (CI runs
// two of these clusters at once) a 2 s heartbeat can be late by more than a 10 s grace.
const GRACE: Duration = Duration::from_secs(20);
/// How long a controller, a VM boot or a run may take on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(120);

struct Env {
    sim: SimHandle,
    kubeconfig: PathBuf,
    store: KubeStateStore,
}

async fn env(control_plane: u32, workers: u32) -> Env {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane,
            workers,
        }),
        kubernetes: ControlPlaneOptions {
            node_monitor_grace_period: GRACE,
            ..ControlPlaneOptions::default()
        },
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    let kubeconfig = sim.kubeconfig.clone().expect("preset kubeconfig");
    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
        .await
        .unwrap();
    Env {
        store: KubeStateStore::new(client, "kube-system"),
        sim,
        kubeconfig,
    }
}

impl Env {
    fn kube(&self) -> KubeView {
        let view = self.sim.kube();
        assert!(
            matches!(view, KubeView::Real(_)),
            "a real control plane runs"
        );
        view
    }

    async fn edit(&self, f: impl Fn(&mut ClusterSpec)) {
        let snap = self.store.read_config().await.unwrap();
        let mut spec = ClusterSpec::from_yaml(snap.spec_yaml().unwrap_or_default()).unwrap();
        f(&mut spec);
        let mut data = snap.data.clone();
        data.insert(state::keys::SPEC.into(), spec.to_yaml());
        self.store
            .replace_config(&snap.resource_version, data)
            .await
            .unwrap();
    }

    async fn status(&self) -> Option<Status> {
        let snap = self.store.read_config().await.ok()?;
        snap.status_json().and_then(Status::from_json)
    }

    async fn reconcile(&self) -> Output {
        tokio::process::Command::new(BIN)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--log-format", "json"])
            .kill_on_drop(true)
            .output()
            .await
            .unwrap()
    }

    /// Runs reconcile (as the CronJob would, a few seconds apart) until status is Ready with
    /// `workers` Ready worker Nodes; returns the number of runs.
    async fn converge(&self, workers: usize, max_runs: usize) -> usize {
        let mut logs = Vec::new();
        for run in 1..=max_runs {
            let out = self.reconcile().await;
            let code = out.status.code();
            assert!(matches!(code, Some(0 | 1)), "run {run}: {out:?}");
            logs.push(format!(
                "run {run}: exit {code:?}\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
            let ready = self
                .status()
                .await
                .and_then(|s| s.condition("Ready").map(|c| c.status == "True"))
                == Some(true);
            if code == Some(0) && ready && self.ready_nodes(WK).await.len() == workers {
                return run;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        panic!(
            "not converged to {workers} workers in {max_runs} runs; status {}\n{}",
            self.status().await.map(|s| s.to_json()).unwrap_or_default(),
            logs.join("\n")
        );
    }

    async fn ready_nodes(&self, prefix: &str) -> Vec<String> {
        self.kube().ready_nodes(prefix).await.into_iter().collect()
    }

    fn instances(&self, prefix: &str) -> Vec<Value> {
        self.sim.oxide().dump()["instances"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|i| i["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .collect()
    }

    async fn wait_for<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn pods(&self, app: &str) -> Vec<Value> {
        self.kube()
            .list("v1", "Pod", Some("default"))
            .await
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["app"] == app)
            .collect()
    }
}

fn readiness(node: &Value) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["status"]
        .as_str()
        .map(str::to_string)
}

fn deployment(name: &str, replicas: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preset_cluster_converges_and_its_nodes_are_k3s_nodes_on_real_kubernetes() {
    let env = env(1, 2).await;
    env.converge(2, 5).await;
    // What `kubectl get nodes` shows: Ready, roles, the k3s version.
    let nodes = env.kube().list("v1", "Node", None).await;
    assert_eq!(nodes.len(), 3);
    for n in &nodes {
        assert_eq!(readiness(n).as_deref(), Some("True"), "{n}");
        let version = n["status"]["nodeInfo"]["kubeletVersion"]
            .as_str()
            .unwrap_or_default();
        assert!(version.starts_with("v1.33."), "{version}");
    }
    assert!(
        nodes.iter().any(|n| {
            n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] == "true"
        })
    );
    // A run with nothing to do changes nothing on the rack.
    let before = env.sim.oxide().counters();
    let out = env.reconcile().await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mutations: u64 = env
        .sim
        .oxide()
        .counters()
        .iter()
        .filter(|(k, _)| !k.starts_with("GET "))
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
        .sum();
    assert_eq!(mutations, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_drains_through_the_real_eviction_api_and_the_pods_come_back_elsewhere() {
    let env = env(1, 1).await;
    env.edit(|s| {
        s.worker_pools[0].count = 3;
        s.timeouts.drain_seconds = 60;
    })
    .await;
    env.converge(3, 15).await;
    // Six pods spread by the real scheduler over the three workers, kept by a budget.
    env.kube().apply(deployment("web", 6)).await.unwrap();
    env.kube()
        .apply(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .await
        .unwrap();
    env.wait_for("six web pods Running", || async {
        let running = env
            .pods("web")
            .await
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        (running == 6).then_some(())
    })
    .await;

    env.edit(|s| s.worker_pools[0].count = 1).await;
    env.converge(1, 15).await;
    let survivor = env.ready_nodes(WK).await;
    assert_eq!(survivor.len(), 1);
    assert_eq!(env.instances(WK).len(), 1);
    // The ReplicaSet controller re-created every evicted pod; the scheduler put them on the
    // one worker left (or the server), and KWOK runs them.
    env.wait_for("six web pods Running on the remaining nodes", || async {
        let pods = env.pods("web").await;
        let gone = env.kube().list("v1", "Node", None).await;
        let nodes: Vec<&str> = gone
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str())
            .collect();
        let ok = pods.len() == 6
            && pods.iter().all(|p| {
                p["status"]["phase"] == "Running"
                    && nodes.contains(&p["spec"]["nodeName"].as_str().unwrap_or_default())
            });
        ok.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_goes_unknown_through_the_node_lifecycle_controller_and_is_replaced() {
    let env = env(1, 2).await;
    env.edit(|s| s.timeouts.not_ready_grace_seconds = 5).await;
    env.converge(2, 5).await;
    let victim = env.ready_nodes(WK).await[0].clone();
    // Stop the VM through the Oxide API, as an operator (or a sled failure) would.
    let http = reqwest::Client::new();
    let stopped = http
        .post(format!(
            "{}/v1/instances/{victim}/stop?project=sim",
            env.sim.oxide_host
        ))
        .bearer_auth(&env.sim.oxide_token)
        .send()
        .await
        .unwrap();
    assert!(stopped.status().is_success(), "{stopped:?}");
    // Nothing marks the Node at once: its heartbeats stop, and after the grace period the
    // real node lifecycle controller sets Ready=Unknown and taints it unreachable.
    let started = Instant::now();
    env.wait_for(
        "the node lifecycle controller to mark the Node Unknown",
        || async {
            let n = env.kube().get("v1", "Node", None, &victim).await?;
            (readiness(&n).as_deref() == Some("Unknown")).then_some(n)
        },
    )
    .await;
    assert!(
        started.elapsed() >= GRACE / 2,
        "Unknown after {:?}, before the grace period",
        started.elapsed()
    );
    // The controller sets the condition, then taints in its own pass (NoExecute tainting runs
    // after the status update): wait for the taint as well.
    let node = env
        .wait_for(
            "the node lifecycle controller to taint it unreachable",
            || async {
                let n = env.kube().get("v1", "Node", None, &victim).await?;
                n["spec"]["taints"]
                    .to_string()
                    .contains("node.kubernetes.io/unreachable")
                    .then_some(n)
            },
        )
        .await;
    let taints = node["spec"]["taints"].to_string();
    assert!(
        taints.contains("node.kubernetes.io/unreachable"),
        "{taints}"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    env.converge(2, 15).await;
    let workers = env.ready_nodes(WK).await;
    assert_eq!(workers.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cronjob_runs_reconcile_once_on_its_schedule_under_the_shipped_rbac() {
    // The shipped manifests with a one-minute schedule: the real CronJob controller starts a
    // Job at the next minute, the real Job controller its pod, the scheduler binds it, and
    // the pod runner executes the real `reconcile-once` as the manifests' ServiceAccount.
    let bin_dir = std::path::Path::new(BIN).parent().unwrap().to_path_buf();
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 1,
        }),
        job_binaries: Some(bin_dir),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let kube = sim.kube();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../k8s-cronjobs");
    for f in [
        "00-namespace.yaml",
        "serviceaccount.yaml",
        "rbac.yaml",
        "cronjob.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        for doc in text.split("\n---") {
            let mut v: Value = serde_saphyr::from_str(doc).unwrap_or(Value::Null);
            if v["kind"] == "CronJob" {
                v["spec"]["schedule"] = json!("* * * * *");
            }
            if v.is_object() {
                kube.apply(v).await.unwrap();
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(150);
    let job = loop {
        let done = kube
            .list("batch/v1", "Job", Some("oxide-controller-jobs"))
            .await
            .into_iter()
            .find(|j| {
                j["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
                    && j["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Complete" && c["status"] == "True")
                    })
            });
        if let Some(job) = done {
            break job;
        }
        assert!(
            Instant::now() < deadline,
            "no scheduled Job completed: {:?}",
            kube.list("batch/v1", "Job", Some("oxide-controller-jobs"))
                .await
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let name = job["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("oxide-controller-"), "{name}");
    // The run wrote its status: a Ready cluster, with the run id of a real run.
    let client = oxide_controller::adapters::kubeclient::client(sim.kubeconfig.as_deref(), None)
        .await
        .unwrap();
    let store = KubeStateStore::new(client, "kube-system");
    let status = store
        .read_config()
        .await
        .unwrap()
        .status_json()
        .and_then(Status::from_json)
        .expect("status.json written by the scheduled run");
    assert_eq!(
        status.condition("Ready").map(|c| c.status.as_str()),
        Some("True")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_replacements_become_ready_slower_than_its_timeout_goes_on_in_later_runs() {
    // The drain timeout, and how long the Deployment's pods take from ContainerCreating to
    // Ready: KWOK's own per-pod delay of its pod-ready stage (kwok@v0.7.0
    // kustomize/stage/pod/general/pod-ready.yaml:22-28), well above the timeout, as with
    // images to pull and readiness probes to pass.
    const DRAIN_SECS: u64 = 10;
    const READY_AFTER: &str = "25s";
    let env = env(1, 2).await;
    env.edit(|s| s.timeouts.drain_seconds = DRAIN_SECS).await;
    env.converge(2, 5).await;
    let kube = env.kube();
    let victim = env.ready_nodes(WK).await[0].clone();
    let others: Vec<String> = kube
        .list("v1", "Node", None)
        .await
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .filter(|n| *n != victim)
        .collect();
    // Both replicas on the victim: the others are cordoned while the scheduler places them.
    let cordon = |on: bool| {
        let (kube, others) = (kube.clone(), others.clone());
        async move {
            for n in &others {
                kube.merge_patch(
                    "v1",
                    "Node",
                    None,
                    n,
                    &json!({"spec": {"unschedulable": on}}),
                )
                .await
                .unwrap();
            }
        }
    };
    cordon(true).await;
    let mut slow = deployment("slow", 2);
    slow["spec"]["template"]["metadata"]["annotations"] = json!({
        "pod-ready.stage.kwok.x-k8s.io/delay": READY_AFTER,
        "pod-ready.stage.kwok.x-k8s.io/jitter-delay": READY_AFTER,
    });
    slow["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(1);
    kube.apply(slow).await.unwrap();
    kube.apply(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "slow", "namespace": "default"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "slow"}}}}),
    )
    .await
    .unwrap();
    let ready = |p: &Value| {
        p["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    };
    env.wait_for("both replicas Ready on the victim", || async {
        let pods = env.pods("slow").await;
        let ok = pods.len() == 2
            && pods
                .iter()
                .all(|p| ready(p) && p["spec"]["nodeName"] == victim.as_str());
        ok.then_some(())
    })
    .await;
    env.wait_for("the budget to allow one disruption", || async {
        let b = kube
            .get("policy/v1", "PodDisruptionBudget", Some("default"), "slow")
            .await?;
        (b["status"]["observedGeneration"] == b["metadata"]["generation"]
            && b["status"]["disruptionsAllowed"] == 1)
            .then_some(())
    })
    .await;
    cordon(false).await;
    kube.merge_patch(
        "v1",
        "Node",
        None,
        &victim,
        &json!({"metadata": {"annotations": {"oxide-controller/delete-me": "true"}}}),
    )
    .await
    .unwrap();
    env.edit(|s| s.worker_pools[0].count = 1).await;

    // The first run evicts one replica; the budget refuses the other until the first one's
    // replacement is Ready, which takes longer than the drain may: the removal is reported
    // in progress, the Node stays (cordoned) and its VM runs.
    let out = env.reconcile().await;
    assert!(matches!(out.status.code(), Some(0 | 1)), "{out:?}");
    let status = env.status().await.expect("status written");
    let drain = status
        .last_plan
        .iter()
        .find(|a| {
            a.detail
                .as_deref()
                .is_some_and(|d| d.contains(&format!("drain of {victim} not finished")))
        })
        .unwrap_or_else(|| panic!("no unfinished drain of {victim}: {:?}", status.last_plan));
    assert_eq!(drain.outcome, "in_progress", "{drain:?}");
    let detail = drain.detail.as_deref().unwrap_or_default();
    assert!(
        detail.contains(&format!("after {DRAIN_SECS}s")) && detail.contains("PodDisruptionBudget"),
        "{detail}"
    );
    let node = kube
        .get("v1", "Node", None, &victim)
        .await
        .expect("Node kept");
    assert_eq!(node["spec"]["unschedulable"], true, "{node}");
    let vm = env
        .instances(WK)
        .into_iter()
        .find(|i| i["name"] == victim.as_str())
        .expect("VM kept");
    assert_eq!(vm["state"], "running", "{vm}");
    let pods = env.pods("slow").await;
    assert!(
        pods.iter()
            .any(|p| p["spec"]["nodeName"] != victim.as_str() && !ready(p)),
        "no replacement still becoming Ready: {pods:#?}"
    );

    // Later runs, once the replacements are Ready, finish the drain and the removal.
    env.converge(1, 15).await;
    assert!(kube.get("v1", "Node", None, &victim).await.is_none());
    env.wait_for("both replicas Ready elsewhere", || async {
        let pods = env.pods("slow").await;
        let ok = pods.len() == 2
            && pods
                .iter()
                .all(|p| ready(p) && p["spec"]["nodeName"] != victim.as_str());
        ok.then_some(())
    })
    .await;
}
