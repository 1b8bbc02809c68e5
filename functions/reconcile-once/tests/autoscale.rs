//! Issue 14 acceptance: the real `reconcile-once` binary against `oxide-sim` on a real
//! control plane (the real scheduler marks pods Unschedulable, the real Deployment,
//! ReplicaSet and garbage collector controllers make and remove them, KWOK runs them), a
//! preset cluster of 3 control-plane + 1 worker, workers autoscaling 1..=6.
//!
//! Between runs the tests wait for the simulated VMs to boot and join, as the CronJob's
//! interval does on a cluster; "runs" below counts `reconcile-once` invocations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::domain::autoscale::{AutoscaleSpec, ScheduleWindow};
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::domain::status::Status;
use oxide_controller::ports::state::{self, StateStore};
use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::{Value, json};

#[path = "support/pending.rs"]
mod support;

const BIN: &str = env!("CARGO_BIN_EXE_reconcile-once");
const WK: &str = "sim-workers-";

struct Env {
    sim: SimHandle,
    kubeconfig: PathBuf,
    store: KubeStateStore,
}

/// 3 servers + 1 worker (2 vCPU, 4 GiB), workers autoscaling with bounds 1..=6, a short
/// scale-down delay, and `edit` applied on top.
async fn env(edit: impl Fn(&mut AutoscaleSpec)) -> Env {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 3,
            workers: 1,
        }),
        kubernetes: ControlPlaneOptions::default(),
        // The reconcile Jobs' pods run (as the harness's kubelet for them) when a test starts
        // one; nothing else does.
        job_binaries: Some(Path::new(BIN).parent().expect("bin dir").to_path_buf()),
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    let kubeconfig = sim.kubeconfig.clone().expect("preset kubeconfig");
    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let env = Env {
        sim,
        kubeconfig,
        store: KubeStateStore::new(client, "kube-system"),
    };
    env.edit_spec(|s| {
        let w = &mut s.worker_pools[0];
        assert_eq!(
            (w.cpus, w.memory.bytes()),
            (2, 4 << 30),
            "the preset's workers"
        );
        (w.min, w.max, w.count) = (1, 6, 1);
        let mut a = AutoscaleSpec {
            scale_down_unneeded_seconds: 2,
            scale_down_delay_after_add_seconds: 2,
            ..AutoscaleSpec::default()
        };
        edit(&mut a);
        w.autoscale = Some(a);
        s.timeouts.drain_seconds = 10;
    })
    .await;
    env
}

impl Env {
    async fn edit_spec(&self, f: impl Fn(&mut ClusterSpec)) {
        let snap = self.store.read_config().await.expect("config");
        let mut spec = ClusterSpec::from_yaml(snap.spec_yaml().unwrap_or_default()).expect("spec");
        f(&mut spec);
        let mut data = snap.data.clone();
        data.insert(state::keys::SPEC.into(), spec.to_yaml());
        self.store
            .replace_config(&snap.resource_version, data)
            .await
            .expect("write spec");
    }

    async fn status(&self) -> Status {
        let snap = self.store.read_config().await.expect("config");
        snap.status_json()
            .and_then(Status::from_json)
            .expect("status.json")
    }

    /// One run; fails the test on anything but exit 0 or 1 (1: work still in progress).
    async fn run(&self) -> Output {
        let out = tokio::process::Command::new(BIN)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--log-format", "json"])
            .kill_on_drop(true)
            .output()
            .await
            .expect("spawn reconcile-once");
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "exit {:?}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs once, then waits (up to 30 s) until every worker VM is a Ready Node or gone, as
    /// the time between two CronJob runs would.
    async fn run_and_settle(&self) -> Output {
        let out = self.run().await;
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until && self.workers().len() != self.ready_workers().await.len() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        out
    }

    fn workers(&self) -> Vec<String> {
        let dump = self.sim.oxide().dump();
        dump["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["name"].as_str())
            .filter(|n| n.starts_with(WK))
            .map(str::to_owned)
            .collect()
    }

    async fn ready_workers(&self) -> Vec<String> {
        self.sim.kube().ready_nodes(WK).await.into_iter().collect()
    }

    async fn nodes(&self) -> Vec<Value> {
        self.sim.kube().list("v1", "Node", None).await
    }

    async fn pods(&self, app: &str) -> Vec<Value> {
        self.sim
            .kube()
            .list("v1", "Pod", Some("default"))
            .await
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["app"] == app)
            .collect()
    }

    /// Polls `check` until it holds, or fails naming `what` after two minutes.
    async fn wait_until(&self, what: &str, check: impl AsyncFn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !check().await {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Pods of `app` the scheduler found no Node for (PodScheduled=False, Unschedulable).
    async fn unschedulable(&self, app: &str) -> usize {
        self.pods(app)
            .await
            .iter()
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter().any(|c| {
                        c["type"] == "PodScheduled"
                            && c["status"] == "False"
                            && c["reason"] == "Unschedulable"
                    })
                })
            })
            .count()
    }

    async fn running(&self, app: &str) -> usize {
        self.pods(app)
            .await
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
    }

    async fn events(&self, reason: &str) -> Vec<String> {
        self.sim
            .kube()
            .list("events.k8s.io/v1", "Event", Some("kube-system"))
            .await
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .filter_map(|e| e["note"].as_str().map(str::to_owned))
            .collect()
    }

    /// A Deployment whose pods each request `cpu` and stay off the servers (k3s servers are
    /// schedulable, so without this the servers would host some of them).
    async fn deploy(&self, app: &str, replicas: u32, cpu: &str, annotations: Value) {
        self.sim
            .kube()
            .apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": app, "namespace": "default"},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
                    "template": {"metadata": {"labels": {"app": app}, "annotations": annotations},
                        "spec": {"terminationGracePeriodSeconds": 1,
                            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [
                                    {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}]}}},
                            "containers": [{"name": "c", "image": "nginx",
                                "resources": {"requests": {"cpu": cpu}}}]}}}}))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Runs until `done` holds or `max` runs are spent; returns the runs used.
    async fn runs_until(&self, max: usize, done: impl AsyncFn(&Env) -> bool) -> usize {
        for i in 1..=max {
            self.run_and_settle().await;
            // Before the next run (a CronJob's minute apart): the scheduler binds pending pods
            // onto new Nodes within a moment, and their kubelets (KWOK's general stages)
            // start them within 12 s (kwok@v0.7.0 kustomize/stage/pod/general/
            // pod-create.yaml:18-24, pod-ready.yaml:22-28: 1 s + up to 5 s each).
            let until = Instant::now() + Duration::from_secs(15);
            loop {
                if done(self).await {
                    return i;
                }
                if Instant::now() >= until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        panic!(
            "not done after {max} runs; workers {:?}, status {}",
            self.workers(),
            self.status().await.to_json()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_bring_workers_and_idle_workers_go_one_per_run() {
    let env = env(|_| {}).await;
    env.run_and_settle().await;
    assert_eq!(env.workers().len(), 1, "converged at min before any load");

    // 10 pods of 900m. A 2-vCPU worker's allocatable cpu is 2000m (k3s reserves no cpu; the
    // kubelet keeps only 100Mi of memory back), so it holds two of them (1800m) and not a
    // third: 10 pods need 5 workers, the one there plus 4 new.
    env.deploy("web", 10, "900m", json!({})).await;
    env.wait_until("the scheduler to find no Node for 8 of them", async || {
        env.unschedulable("web").await == 8
    })
    .await;
    // The single worker holds two, which its kubelet starts.
    env.wait_until("the two placed pods Running", async || {
        env.running("web").await == 2
    })
    .await;
    let dry = tokio::process::Command::new(BIN)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .arg("--dry-run")
        .output()
        .await
        .expect("dry run");
    let table = String::from_utf8_lossy(&dry.stdout);
    assert!(
        table.contains("autoscale: pool \"workers\" 1 -> 5: 8 unschedulable pod(s)"),
        "--dry-run says what the autoscaler would do and why:\n{table}"
    );
    assert_eq!(env.workers().len(), 1, "--dry-run changed nothing");
    let runs = env
        .runs_until(4, async |e| e.running("web").await == 10)
        .await;
    assert!(runs <= 4);
    assert_eq!(env.workers().len(), 5, "exactly what the packing needs");
    let status = env.status().await;
    let a = status.autoscale.clone().expect("autoscale status");
    assert!(a.unhostable.is_empty(), "{a:?}");
    let ups = env.events("AutoscaleUp").await;
    assert!(
        ups.iter()
            .any(|e| e.contains("1 -> 5") && e.contains("unschedulable pod")),
        "an Event says why: {ups:?}"
    );

    // Load gone: one worker per run goes (after the 2 s delay), drained, down to min 1.
    // `kubectl delete deployment web`: the real garbage collector removes its ReplicaSet and
    // pods, KWOK ends them.
    assert!(
        env.sim
            .kube()
            .delete("apps/v1", "Deployment", Some("default"), "web")
            .await
    );
    env.wait_until("the garbage collector to remove the pods", async || {
        env.pods("web").await.is_empty()
    })
    .await;
    let mut counts = vec![env.workers().len()];
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(2100)).await;
        env.run_and_settle().await;
        counts.push(env.workers().len());
        if counts.last() == Some(&1) {
            break;
        }
    }
    assert_eq!(counts.last(), Some(&1), "back to min: {counts:?}");
    assert!(
        counts.windows(2).all(|w| w[0] - w[1] <= 1),
        "at most one worker per run: {counts:?}"
    );
    let downs = env.events("AutoscaleDown").await;
    assert!(downs.len() >= 4, "{downs:?}");
    assert!(
        downs.iter().all(|e| e.contains("unneeded since")),
        "{downs:?}"
    );
    assert_eq!(env.ready_workers().await.len(), 1);
    for n in env.nodes().await {
        assert!(
            n["spec"]["unschedulable"] != true,
            "nothing left cordoned: {n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_no_pool_can_host_is_named_and_scales_nothing() {
    let env = env(|_| {}).await;
    env.run_and_settle().await;
    env.deploy("huge", 1, "64", json!({})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.run_and_settle().await;
    env.run_and_settle().await;
    assert_eq!(
        env.workers().len(),
        1,
        "no scale-up for a pod nothing can host"
    );
    let status = env.status().await;
    let a = status.autoscale.expect("autoscale status");
    let pod = env.pods("huge").await[0]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(a.unhostable.len(), 1, "{a:?}");
    assert_eq!(a.unhostable[0].pod, format!("default/{pod}"));
    assert!(
        a.unhostable[0].reason.contains("requests cpu 64000m"),
        "{}",
        a.unhostable[0].reason
    );
    assert!(
        status.findings.iter().any(|f| f.contains(&pod)),
        "{:?}",
        status.findings
    );
    let events = env.events("AutoscaleUnhostable").await;
    assert_eq!(events.len(), 1, "one Event, not one per run: {events:?}");
    assert!(events[0].contains(&pod) && events[0].contains("64000m"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safe_to_evict_false_and_scale_down_disabled_keep_their_nodes() {
    let env = env(|_| {}).await;
    env.run_and_settle().await;
    // Three workers: one holds a pod that must not be evicted, one is annotated, one is free.
    env.deploy("web", 6, "900m", json!({})).await;
    env.runs_until(4, async |e| e.running("web").await == 6)
        .await;
    assert_eq!(env.workers().len(), 3);
    let node_of = async |app: &str| -> String {
        env.pods(app)
            .await
            .iter()
            .find_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    env.deploy("web", 0, "900m", json!({})).await;
    env.deploy(
        "keep",
        1,
        "100m",
        json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
    )
    .await;
    // Bound by the real scheduler: wait for it (a fixed sleep was too short on a loaded machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let pinned = loop {
        let node = node_of("keep").await;
        if !node.is_empty() || std::time::Instant::now() > deadline {
            break node;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(pinned.starts_with(WK), "{pinned}");
    let disabled = env
        .ready_workers()
        .await
        .into_iter()
        .find(|n| *n != pinned)
        .expect("another worker");
    env.sim
        .kube()
        .merge_patch(
            "v1",
            "Node",
            None,
            &disabled,
            &json!({"metadata": {"annotations": {
                "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}}),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(2100)).await;
        env.run_and_settle().await;
    }
    let mut left = env.workers();
    left.sort();
    let mut want = vec![pinned.clone(), disabled.clone()];
    want.sort();
    assert_eq!(left, want, "only the free worker went");
    let kept = env.status().await.autoscale.expect("status").kept;
    assert!(kept[&pinned].contains("safe-to-evict=false"), "{kept:?}");
    assert!(
        kept[&disabled].contains("scale-down-disabled=true"),
        "{kept:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_schedule_window_raises_min() {
    // A window opened every minute and lasting an hour is active whenever the test runs.
    let env = env(|a| {
        a.schedules = vec![ScheduleWindow {
            name: "business-hours".into(),
            start: "* * * * *".into(),
            duration_minutes: 60,
            time_zone: "UTC".into(),
            min: Some(3),
            max: None,
        }];
    })
    .await;
    env.runs_until(3, async |e| e.ready_workers().await.len() == 3)
        .await;
    assert_eq!(env.workers().len(), 3);
    let a = env.status().await.autoscale.expect("status");
    assert!(
        env.events("AutoscaleUp")
            .await
            .iter()
            .any(|e| e.contains("schedule window \"business-hours\" sets min 3")),
        "{a:?}"
    );
    // The window closes (removed): idle workers above the pool's own min go, one per run.
    env.edit_spec(|s| {
        if let Some(a) = s.worker_pools[0].autoscale.as_mut() {
            a.schedules.clear();
        }
    })
    .await;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(2100)).await;
        env.run_and_settle().await;
        if env.workers().len() == 1 {
            break;
        }
    }
    assert_eq!(env.workers().len(), 1);
}

/// Requests of one run, by `METHOD /path` on each API (Oxide and Kubernetes).
async fn requests_of_one_run(env: &Env) -> std::collections::BTreeMap<String, u64> {
    env.sim.oxide().reset_counters();
    env.sim.kube().reset_counters();
    env.run().await;
    let mut all: std::collections::BTreeMap<String, u64> = env
        .sim
        .oxide()
        .counters()
        .into_iter()
        .map(|(k, v)| (format!("oxide {k}"), v))
        .collect();
    all.extend(
        env.sim
            .kube()
            .counters()
            .into_iter()
            .map(|(k, v)| (format!("kube {k}"), v)),
    );
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_op_run_with_autoscaling_adds_only_the_pod_listing() {
    let env = env(|_| {}).await;
    env.run_and_settle().await;
    env.run_and_settle().await;
    let on = requests_of_one_run(&env).await;
    env.edit_spec(|s| s.worker_pools[0].autoscale = None).await;
    env.run_and_settle().await;
    let off = requests_of_one_run(&env).await;
    let mut added = std::collections::BTreeMap::new();
    for (k, v) in &on {
        let before = off.get(k).copied().unwrap_or(0);
        if *v != before {
            added.insert(k.clone(), *v as i64 - before as i64);
        }
    }
    for (k, v) in &off {
        if !on.contains_key(k) {
            added.insert(k.clone(), -(*v as i64));
        }
    }
    println!(
        "no-op run: {} requests with autoscaling off, {} with it on; added: {added:?}",
        off.values().sum::<u64>(),
        on.values().sum::<u64>()
    );
    // One page: the preset's pods are far fewer than the adapter's page size.
    assert_eq!(
        added,
        std::collections::BTreeMap::from([("kube GET /api/v1/pods".to_owned(), 1)]),
        "on: {on:?}\noff: {off:?}"
    );
}

impl Env {
    /// A local PersistentVolume (as k3s's local-path provisioner makes them) pinned to
    /// `node`, and the claim `default/<claim>` bound to it.
    async fn local_volume(&self, pv: &str, claim: &str, node: &str) {
        let kube = self.sim.kube();
        kube.apply(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "local-path",
                "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": format!("/var/lib/rancher/k3s/storage/{pv}"), "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": "default", "name": claim},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        kube.apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}}}))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        self.wait_until("the PV controller to bind the claim", async || {
            kube.get("v1", "PersistentVolumeClaim", Some("default"), claim)
                .await
                .is_some_and(|c| c["status"]["phase"] == "Bound")
        })
        .await;
    }

    /// A one-replica Deployment `app` (100m) with extra pod `spec` fields, off the servers.
    async fn deploy_one(&self, app: &str, extra: Value) {
        let mut spec = json!({"terminationGracePeriodSeconds": 1,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}]}}},
            "containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "100m"}}}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        self.sim
            .kube()
            .apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": app, "namespace": "default"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                    "template": {"metadata": {"labels": {"app": app}}, "spec": spec}}}))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Issue 20: an idle worker holding a local-path volume's pod is never removed, and one whose
/// pod a `minAvailable: 1` budget guards is not picked; the free one goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_data_and_a_budget_keep_their_workers() {
    let env = env(|_| {}).await;
    env.run_and_settle().await;
    env.deploy("web", 6, "900m", json!({})).await;
    env.runs_until(4, async |e| e.running("web").await == 6)
        .await;
    assert_eq!(env.workers().len(), 3);
    env.deploy("web", 0, "900m", json!({})).await;
    let workers = env.ready_workers().await;
    let (data, guarded) = (workers[0].clone(), workers[1].clone());

    // A database on k3s's default storage: its volume lives on `data`.
    env.local_volume("pvc-db", "data-db", &data).await;
    env.deploy_one(
        "db",
        json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db"}}]}),
    )
    .await;
    // A service whose budget allows no disruption, on `guarded`.
    env.deploy_one(
        "api",
        json!({"nodeSelector": {"kubernetes.io/hostname": guarded}}),
    )
    .await;
    env.sim
        .kube()
        .apply(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "api", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "api"}}}}),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    env.wait_until("db and api to run", async || {
        env.running("db").await == 1 && env.running("api").await == 1
    })
    .await;
    let db_node = env.pods("db").await[0]["spec"]["nodeName"].clone();
    assert_eq!(db_node, data.as_str(), "the scheduler follows the volume");
    env.wait_until(
        "the disruption controller to count the budget",
        async || {
            env.sim
                .kube()
                .get("policy/v1", "PodDisruptionBudget", Some("default"), "api")
                .await
                .is_some_and(|b| b["status"]["currentHealthy"] == 1)
        },
    )
    .await;

    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(2100)).await;
        env.run_and_settle().await;
    }
    let mut left = env.workers();
    left.sort();
    let mut want = vec![data.clone(), guarded.clone()];
    want.sort();
    assert_eq!(left, want, "only the free worker went");
    let kept = env.status().await.autoscale.expect("status").kept;
    assert!(
        kept[&data].contains("PersistentVolume pvc-db is pinned to it"),
        "{kept:?}"
    );
    assert!(
        kept[&guarded].contains("PodDisruptionBudget default/api allows 0"),
        "{kept:?}"
    );
    for n in env.nodes().await {
        assert!(n["spec"]["unschedulable"] != true, "nothing cordoned: {n}");
    }
    assert_eq!(env.running("db").await, 1, "the data's pod never moved");
}

/// Issue 20: a DaemonSet pod pending on a full worker and a pod whose volume is pinned to a
/// node that is gone bring no worker over 5 runs; each is named once in status and Events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_a_new_worker_cannot_help_add_none() {
    let env = env(|_| {}).await;
    env.run_and_settle().await;
    assert_eq!(env.workers().len(), 1);
    // Fill the one worker, then a DaemonSet its pod there cannot fit beside.
    env.deploy("busy", 1, "1900m", json!({})).await;
    env.wait_until("busy to run", async || env.running("busy").await == 1)
        .await;
    env.sim
        .kube()
        .apply(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                    "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [
                                {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}]}}},
                        "containers": [{"name": "a", "image": "agent",
                            "resources": {"requests": {"cpu": "500m"}}}]}}}}))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // A database whose local volume was on a worker that no longer exists.
    env.local_volume("pvc-gone", "data-old", "sim-workers-gone")
        .await;
    env.deploy_one(
        "old",
        json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-old"}}]}),
    )
    .await;
    env.wait_until("both to be refused by the scheduler", async || {
        env.unschedulable("agent").await == 1 && env.unschedulable("old").await == 1
    })
    .await;

    let mut counts = Vec::new();
    for _ in 0..5 {
        env.run_and_settle().await;
        counts.push(env.workers().len());
    }
    assert_eq!(counts, [1; 5], "no worker added");
    let a = env.status().await.autoscale.expect("status");
    let agent = env.pods("agent").await[0]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let old = env.pods("old").await[0]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let reason = |pod: &str| {
        a.unhostable
            .iter()
            .find(|u| u.pod == format!("default/{pod}"))
            .map(|u| u.reason.clone())
            .unwrap_or_else(|| panic!("{pod} not named: {a:?}"))
    };
    assert!(reason(&agent).contains("DaemonSet"), "{a:?}");
    assert!(
        reason(&old).contains("PersistentVolume pvc-gone is pinned elsewhere"),
        "{a:?}"
    );
    let events = env.events("AutoscaleUnhostable").await;
    for pod in [&agent, &old] {
        assert_eq!(
            events.iter().filter(|e| e.contains(pod.as_str())).count(),
            1,
            "one Event for {pod}, not one per run: {events:?}"
        );
    }
}

/// Issue 20: the reconcile Job's own pod, placed on the idle worker, does not keep that
/// worker: the run picks it, leaves its own pod alone, and a later run finishes the removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_a_reconcile_pod_runs_on_goes_when_idle() {
    let env = env(|_| {}).await;
    let kube = env.sim.kube();
    support::install_suspended(&kube).await;
    env.run_and_settle().await;
    // Two workers: one busy (above the threshold), one idle.
    env.deploy("web", 3, "900m", json!({})).await;
    env.runs_until(3, async |e| e.running("web").await == 3)
        .await;
    assert_eq!(env.workers().len(), 2);
    env.deploy("web", 1, "1200m", json!({})).await;
    env.wait_until("one web pod left", async || {
        env.pods("web").await.len() == 1
    })
    .await;
    let busy = env.pods("web").await[0]["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let idle = env
        .ready_workers()
        .await
        .into_iter()
        .find(|n| *n != busy)
        .expect("an idle worker");
    // Start the unneeded timer, then wait out the delay.
    env.run().await;
    tokio::time::sleep(Duration::from_millis(2100)).await;

    // The run as a Job, its pod on the idle worker.
    support::run_job_on(&kube, "on-the-idle-worker", &idle).await;
    let downs = env.events("AutoscaleDown").await;
    assert!(
        downs
            .iter()
            .any(|e| e.contains(&format!("node {idle} unneeded"))),
        "the Job's run picked the worker its own pod runs on: {downs:?}"
    );
    // A run elsewhere finishes the removal.
    for _ in 0..4 {
        env.run_and_settle().await;
        if !env.workers().contains(&idle) {
            break;
        }
    }
    assert_eq!(env.workers(), [busy], "the idle worker went");
}

/// The harness's kubelet for the product's pods: a deleted webhook pod (a Deployment's, which
/// the harness does not run) goes as a kubelet would let it go, so draining its node finishes
/// (without this, a scale-down that picked the webhook's node drained for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_webhook_pod_bound_to_a_worker_goes() {
    let env = env(|_| {}).await;
    env.run_and_settle().await;
    let worker = env.ready_workers().await[0].clone();
    let kube = env.sim.kube();
    kube.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "webhook-like", "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "oxide-controller",
                "app.kubernetes.io/component": "webhook"}},
        "spec": {"nodeName": worker, "containers": [{"name": "scale", "image": "scale"}]}}))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        kube.delete("v1", "Pod", Some("kube-system"), "webhook-like")
            .await
    );
    env.wait_until("the deleted pod to go", async || {
        kube.get("v1", "Pod", Some("kube-system"), "webhook-like")
            .await
            .is_none()
    })
    .await;
}
