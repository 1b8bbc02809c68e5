//! Issue 32 item 2 acceptance: quorum from etcd, not from Nodes. The real `reconcile-once`
//! binary against `oxide-sim` (3 servers, 2 workers), whose servers each run a real etcd
//! member and whose supervisors serve the member list on `/db/info` as k3s does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::domain::status::Status;
use oxide_controller::ports::rack::Rack;
use oxide_controller::ports::state::{self, StateStore};
use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::Value;

#[path = "support/pending.rs"]
mod support;

const BIN: &str = env!("CARGO_BIN_EXE_reconcile-once");
const CP: &str = "sim-control-plane-";
const WK: &str = "sim-workers-";

struct Env {
    sim: SimHandle,
    kubeconfig: PathBuf,
    store: KubeStateStore,
}

async fn env() -> Env {
    env_with(None).await
}

/// With `job_binaries`, reconcile Jobs run in the cluster (the binaries of this build).
async fn env_with(job_binaries: Option<PathBuf>) -> Env {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 3,
            workers: 2,
        }),
        kubernetes: ControlPlaneOptions::default(),
        job_binaries,
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    let kubeconfig = sim
        .kubeconfig
        .clone()
        .unwrap_or_else(|| panic!("preset kubeconfig"));
    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Env {
        sim,
        kubeconfig,
        store: KubeStateStore::new(client, "kube-system"),
    }
}

impl Env {
    async fn edit(&self, f: impl Fn(&mut ClusterSpec)) {
        let snap = self
            .store
            .read_config()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut spec = ClusterSpec::from_yaml(snap.spec_yaml().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        f(&mut spec);
        let mut data = snap.data.clone();
        data.insert(state::keys::SPEC.into(), spec.to_yaml());
        self.store
            .replace_config(&snap.resource_version, data)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn status(&self) -> Option<Status> {
        let snap = self.store.read_config().await.ok()?;
        snap.status_json().and_then(Status::from_json)
    }

    async fn reconcile(&self) -> Output {
        reconcile_with(&self.kubeconfig).await
    }

    /// Runs reconcile until status says Ready; returns the number of runs.
    async fn converge(&self, max_runs: usize) -> usize {
        for i in 1..=max_runs {
            let out = self.reconcile().await;
            let code = out.status.code();
            assert!(
                matches!(code, Some(0 | 1)),
                "run {i}: exit {code:?}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            if code == Some(0)
                && self
                    .status()
                    .await
                    .and_then(|s| s.condition("Ready").map(|c| c.status == "True"))
                    == Some(true)
            {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let status = self.status().await.map(|s| s.to_json()).unwrap_or_default();
        panic!("not converged after {max_runs} runs; status: {status}");
    }

    fn instance_names(&self, prefix: &str) -> BTreeSet<String> {
        let dump = self.sim.oxide().dump();
        dump["instances"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i["name"].as_str().map(str::to_owned))
            .filter(|n| n.starts_with(prefix))
            .collect()
    }

    fn instance_id(&self, name: &str) -> uuid::Uuid {
        let dump = self.sim.oxide().dump();
        dump["instances"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .find(|i| i["name"] == name)
            .and_then(|i| i["id"].as_str())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no instance {name}"))
    }

    fn fip_holder(&self) -> Option<String> {
        let dump = self.sim.oxide().dump();
        let fip = dump["floating_ips"]
            .as_array()?
            .iter()
            .find(|f| f["name"] == "sim-apiserver")?
            .clone();
        let id = fip["instance"]
            .as_str()
            .or_else(|| fip["instance_id"].as_str())?
            .to_owned();
        dump["instances"]
            .as_array()?
            .iter()
            .find(|i| i["id"] == id.as_str())
            .and_then(|i| i["name"].as_str().map(str::to_owned))
    }

    async fn ready_servers(&self) -> BTreeSet<String> {
        self.ready_nodes_with(CP).await
    }

    async fn ready_nodes_with(&self, prefix: &str) -> BTreeSet<String> {
        self.sim.kube().ready_nodes(prefix).await
    }

    /// What a joining server (and the product) reads: `GET /db/info` at the kubeconfig's
    /// API address, as user `server` with the Secret's k3s token, verified against the CA.
    async fn supervisor(&self) -> Supervisor {
        let secrets = self
            .store
            .read_secrets()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let kc =
            kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap_or_else(|e| panic!("{e}"));
        let server = kc.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone())
            .unwrap_or_else(|| panic!("no server in the kubeconfig"));
        let ca = self.sim.kube().ca_pem().unwrap_or_else(|| panic!("no CA"));
        let http = reqwest::Client::builder()
            .tls_certs_only([
                reqwest::Certificate::from_pem(ca.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
            ])
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        Supervisor {
            http,
            url: format!("{server}/db/info"),
            token: secrets.k3s_token,
        }
    }
}

#[derive(Clone)]
struct Supervisor {
    http: reqwest::Client,
    url: String,
    token: String,
}

/// One member as `/db/info` lists it.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    learner: bool,
}

impl Supervisor {
    /// The member list, or why there is none (the status and body).
    async fn members(&self) -> Result<Vec<Member>, String> {
        let resp = self
            .http
            .get(&self.url)
            .basic_auth("server", Some(&self.token))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let code = resp.status().as_u16();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("HTTP {code}: {body}"));
        }
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        Ok(v["members"]
            .as_array()
            .ok_or_else(|| format!("no members: {body}"))?
            .iter()
            .map(|m| Member {
                name: m["name"].as_str().unwrap_or_default().to_owned(),
                learner: m["isLearner"].as_bool().unwrap_or(false),
            })
            .collect())
    }
}

async fn reconcile_with(kubeconfig: &Path) -> Output {
    tokio::process::Command::new(BIN)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--log-format", "json"])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"))
}

/// One reading of `/db/info`: the members, or why there were none.
type Sample = Result<Vec<Member>, String>;

/// The member list sampled every 0.5 s until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

fn sample(sup: Supervisor) -> Sampler {
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let (s2, samples2) = (stop.clone(), samples.clone());
    let task = tokio::spawn(async move {
        while !s2.load(Ordering::SeqCst) {
            let got = sup.members().await;
            samples2.lock().unwrap_or_else(|p| p.into_inner()).push(got);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    Sampler {
        stop,
        samples,
        task,
    }
}

impl Sampler {
    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Every answered sample: at least quorum of the expected 3 voters (2) and at most one
/// learner. An unanswered one (etcd electing a new leader after its leader's server stopped:
/// the linearizable list waits for one) counts as no sample, but never for long: a cluster
/// that lost quorum answers nothing for good.
fn assert_quorum_kept(what: &str, samples: &[Sample]) {
    let answered: Vec<&Vec<Member>> = samples.iter().filter_map(|s| s.as_ref().ok()).collect();
    assert!(
        answered.len() * 2 > samples.len(),
        "{what}: most samples answered ({} of {}): {:?}",
        answered.len(),
        samples.len(),
        samples
            .iter()
            .filter_map(|s| s.as_ref().err())
            .collect::<Vec<_>>()
    );
    let mut gap = 0;
    for s in samples {
        gap = if s.is_ok() { 0 } else { gap + 1 };
        assert!(
            gap < 20,
            "{what}: /db/info unanswered for 10 s in a row: {s:?}"
        );
    }
    for (i, m) in answered.iter().enumerate() {
        let voters = m.iter().filter(|m| !m.learner).count();
        let learners = m.len() - voters;
        assert!(voters >= 2, "{what}: sample {i}: {voters} voters: {m:?}");
        assert!(
            learners <= 1,
            "{what}: sample {i}: {learners} learners: {m:?}"
        );
    }
}

/// A control-plane roll (a server setting changed: every server drifts) and the replacement
/// of a failed server, with the member list read from `/db/info` every 0.5 s throughout:
/// never fewer than 2 voters, never more than one learner, and at the end 3 voters that are
/// the 3 Ready servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_and_a_replacement_keep_etcd_quorum_and_one_learner_at_most() {
    let env = env().await;
    let sup = env.supervisor().await;
    let first = sup
        .members()
        .await
        .unwrap_or_else(|e| panic!("the supervisor serves the member list: {e}"));
    assert_eq!(first.iter().filter(|m| !m.learner).count(), 3, "{first:?}");

    let roll = sample(sup.clone());
    env.edit(|s| s.control_plane.cpus += 2).await;
    env.converge(40).await;
    let rolled = roll.finish().await;
    assert_quorum_kept("the roll", &rolled);
    // The sampling saw the roll: a surge server beside the three (four members).
    assert!(
        rolled
            .iter()
            .filter_map(|s| s.as_ref().ok())
            .any(|m| m.len() == 4),
        "the roll's surge members were sampled: {rolled:?}"
    );

    // A server fails and does not come back when started again: it is replaced.
    let holder = env.fip_holder().unwrap_or_default();
    let victim = env
        .instance_names(CP)
        .into_iter()
        .find(|n| *n != holder)
        .unwrap_or_default();
    let replace = sample(sup.clone());
    env.sim
        .faults()
        .update(|f| f.fail_at_boot = vec![victim.clone()]);
    env.sim
        .oxide()
        .set_instance_failed(env.instance_id(&victim));
    env.converge(40).await;
    let replaced = replace.finish().await;
    assert_quorum_kept("the replacement", &replaced);
    assert!(
        !env.instance_names(CP).contains(&victim),
        "{victim} replaced"
    );

    let members = sup.members().await.unwrap_or_else(|e| panic!("{e}"));
    let servers = env.ready_servers().await;
    assert_eq!(servers.len(), 3, "{servers:?}");
    assert!(members.iter().all(|m| !m.learner), "{members:?}");
    let named: BTreeSet<String> = members
        .iter()
        .filter_map(|m| m.name.rsplit_once('-').map(|(n, _)| n.to_owned()))
        .collect();
    assert_eq!(named, servers, "3 voters, the 3 servers: {members:?}");
    assert_eq!(members.len(), 3, "{members:?}");
}

/// Deletes a server by hand (stop, delete the instance, delete its Node) after taking k3s's
/// etcd annotations off its Node, as on a server whose metadata controller never wrote them:
/// k3s's member controller then cannot remove the member and keeps the Node Terminating
/// (audit day2-fidelity-4 F3). Returns the member.
async fn leave_a_stale_member(env: &Env) -> String {
    let holder = env.fip_holder().unwrap_or_default();
    let victim = env
        .instance_names(CP)
        .into_iter()
        .find(|n| *n != holder)
        .unwrap_or_default();
    let kube = env.sim.kube();
    let node = kube
        .get("v1", "Node", None, &victim)
        .await
        .unwrap_or_else(|| panic!("{victim}'s Node"));
    let member = node["metadata"]["annotations"]["etcd.k3s.cattle.io/node-name"]
        .as_str()
        .unwrap_or_else(|| panic!("k3s names the member on the Node: {node}"))
        .to_owned();
    // The Node loses k3s's etcd annotations (as on a server whose metadata controller never
    // wrote them): k3s's member controller skips such a Node when it is deleted.
    kube.merge_patch(
        "v1",
        "Node",
        None,
        &victim,
        &serde_json::json!({"metadata": {"annotations": {
            "etcd.k3s.cattle.io/node-name": null,
            "etcd.k3s.cattle.io/node-address": null,
        }}}),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Deleted by hand: the instance, then its Node.
    let rack = OxideRack::connect(
        &env.sim.oxide_host,
        &env.sim.oxide_token,
        "sim",
        RackOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    rack.stop_instance(&victim)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let state = rack
            .get_instance(&victim)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .map(|i| i.state);
        if state == Some(oxide_controller::domain::model::InstanceState::Stopped) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{victim}: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    rack.delete_instance(&victim)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(kube.delete("v1", "Node", None, &victim).await);
    // k3s's member controller errs on a labelled Node without the annotations ("node name
    // annotation for node N not found") and keeps its finalizer: the Node stays Terminating.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let node = kube
            .get("v1", "Node", None, &victim)
            .await
            .unwrap_or_else(|| panic!("{victim}'s Node went although its member was not removed"));
        if !node["metadata"]["deletionTimestamp"].is_null() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{victim}: {node}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let node = kube
        .get("v1", "Node", None, &victim)
        .await
        .unwrap_or_else(|| panic!("{victim}'s Node went although its member was not removed"));
    assert!(
        node["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty()),
        "the member controller's finalizer stays: {node}"
    );
    let listed = env
        .supervisor()
        .await
        .members()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        listed.iter().any(|m| m.name == member),
        "the member outlives its server: {listed:?}"
    );

    member
}

/// A server deleted by hand whose Node lacked k3s's etcd annotations (so k3s's member
/// controller could not remove it, and the Node stays Terminating) leaves its member in the list. Every control-plane
/// change is then held, with a finding naming that member, while a worker scale goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_left_after_its_server_is_gone_holds_control_plane_changes() {
    let env = env().await;
    let member = leave_a_stale_member(&env).await;
    // The control plane is short a server, and the spec asks for a third worker.
    env.edit(|s| s.worker_pools[0].count = 3).await;
    let servers_before = env.instance_names(CP);
    assert_eq!(servers_before.len(), 2);
    env.sim.oxide().reset_counters();
    for run in 1..=3 {
        let out = env.reconcile().await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            env.instance_names(CP),
            servers_before,
            "run {run}: no server created or deleted"
        );
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            log.lines()
                .any(|l| l.contains("reconcile finished") && l.contains(&member)),
            "run {run}: its last line names {member}:\n{log}"
        );
        let status = env.status().await.unwrap_or_else(|| panic!("status"));
        assert!(
            status
                .findings
                .iter()
                .any(|f| f.contains(&member) && f.contains("no control-plane change")),
            "run {run}: a finding names {member}: {:?}",
            status.findings
        );
        let degraded = status.condition("Degraded").map(|c| c.status.clone());
        assert_eq!(degraded.as_deref(), Some("True"), "{:?}", status.conditions);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The worker scale went on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while env.instance_names(WK).len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no third worker");
        let _ = env.reconcile().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(env.instance_names(CP), servers_before, "servers untouched");
}

/// The same from inside the cluster: the CronJob's Job reads the member list through the
/// `kubernetes` Service with its ServiceAccount's CA, and its run holds the control plane
/// with the finding naming the stale member (an unreadable list would say so instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_cluster_run_reads_the_member_list_and_names_the_stale_member() {
    let bin_dir = Path::new(BIN)
        .parent()
        .unwrap_or_else(|| panic!("bin dir"))
        .to_path_buf();
    let env = env_with(Some(bin_dir)).await;
    let kube = env.sim.kube();
    support::install_suspended(&kube).await;
    let member = leave_a_stale_member(&env).await;
    env.edit(|s| s.worker_pools[0].count = 3).await;
    let servers_before = env.instance_names(CP);
    let worker = env
        .ready_nodes_with(WK)
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("a worker"));
    let outcome = support::run_job_on(&kube, "etcd-check", &worker).await;
    assert_eq!(outcome, "Complete");
    assert_eq!(env.instance_names(CP), servers_before, "no server created");
    let status = env.status().await.unwrap_or_else(|| panic!("status"));
    assert!(
        status
            .findings
            .iter()
            .any(|f| f.contains(&member) && f.contains("no control-plane change")),
        "{:?}",
        status.findings
    );
    assert!(
        !status
            .findings
            .iter()
            .any(|f| f.contains("cannot read the etcd member list")),
        "{:?}",
        status.findings
    );
}
