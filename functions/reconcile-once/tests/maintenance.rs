//! Issue 46 item 3 acceptance: the real `reconcile-once` and `scale` binaries against
//! `oxide-sim` (a preset 3 + 1 cluster on a real control plane, the upgrade tests' smallest that rolls its servers) and its k3s channel server. A
//! channel that moves to a new patch rolls the cluster only inside a maintenance window;
//! outside it status says which release waits and when the window opens; a channel that
//! moves to a new minor never rolls.
//!
//! The binaries read the real clock (they take no clock override), so the window is placed
//! relative to it: it opens at the first whole minute at least [`MARGIN`] away, and the test
//! waits for it (under a minute and a half).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::domain::maintenance::MaintenanceWindow;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::domain::status::Status;
use oxide_controller::domain::upgrade::channel::ChannelState;
use oxide_controller::ports::state::{self, StateStore};
use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::Value;

#[path = "support/pending.rs"]
mod support;

const BIN: &str = env!("CARGO_BIN_EXE_reconcile-once");
const RUNS: &str = "v1.33.4+k3s1";
const PATCH: &str = "v1.33.7+k3s3";
const MINOR: &str = "v1.34.1+k3s1";
/// How far ahead at least the window opens: room for the runs made before it.
const MARGIN: u64 = 25;
/// The window's zone: +05:30 all year (no daylight saving since 1945), so the cron's wall
/// clock differs from UTC by half an hour.
const ZONE: &str = "Asia/Kolkata";
const ZONE_OFFSET: u64 = 5 * 3600 + 30 * 60;

struct Env {
    sim: SimHandle,
    kubeconfig: PathBuf,
    store: KubeStateStore,
}

async fn env() -> Env {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 3,
            workers: 1,
        }),
        kubernetes: ControlPlaneOptions::default(),
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
    async fn spec(&self) -> ClusterSpec {
        let snap = self
            .store
            .read_config()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ClusterSpec::from_yaml(snap.spec_yaml().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"))
    }

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

    async fn status(&self) -> Status {
        self.try_status()
            .await
            .unwrap_or_else(|e| panic!("status.json: {e}"))
    }

    /// status.json, or why it cannot be read (while the server holding the API's floating IP
    /// is replaced, the address moves and the API does not answer for a moment).
    async fn try_status(&self) -> Result<Status, String> {
        let snap = self.store.read_config().await.map_err(|e| e.to_string())?;
        snap.status_json()
            .and_then(Status::from_json)
            .ok_or_else(|| "no status.json".to_owned())
    }

    /// One run; exit 0 or 1 (1: work still in progress) or the test fails.
    async fn run(&self) -> Output {
        let out = tokio::process::Command::new(BIN)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--log-format", "json"])
            .kill_on_drop(true)
            .output()
            .await
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "exit {:?}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn instances(&self) -> BTreeSet<String> {
        self.sim.oxide().dump()["instances"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// Each Node's kubelet version.
    async fn versions(&self) -> Vec<(String, String)> {
        let nodes = self.sim.kube().list("v1", "Node", None).await;
        nodes
            .iter()
            .map(|n| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                (
                    s(&n["metadata"]["name"]),
                    s(&n["status"]["nodeInfo"]["kubeletVersion"]),
                )
            })
            .collect()
    }

    /// Runs until a run exits 0 with the cluster Ready; returns the number of runs. One that
    /// never gets there says where the rack's instances and floating IPs are and what the
    /// runs warned about and did (a run from here reaches the API only through its floating
    /// IP: the last run's error alone says only that it is gone).
    async fn converge(&self, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        let mut history = std::collections::VecDeque::new();
        for i in 1.. {
            let out = self.run().await;
            for line in String::from_utf8_lossy(&out.stderr).lines().filter(|l| {
                l.contains("\"WARN\"") || l.contains("\"ERROR\"") || l.contains("\"action\"")
            }) {
                history.push_back(format!("run {i}: {line}"));
                if history.len() > 80 {
                    history.pop_front();
                }
            }
            let status = self.try_status().await;
            let ready = status
                .as_ref()
                .is_ok_and(|s| s.condition("Ready").is_some_and(|c| c.status == "True"));
            if out.status.code() == Some(0) && ready {
                return i;
            }
            if tokio::time::Instant::now() >= deadline {
                let dump = self.sim.oxide().dump();
                let rack: Vec<String> = ["instances", "floating_ips"]
                    .iter()
                    .flat_map(|k| dump[k].as_array().cloned().unwrap_or_default())
                    .map(|v| format!("{} {} {} {}", v["name"], v["state"], v["id"], v["instance"]))
                    .collect();
                panic!(
                    "not converged after {i} runs: {}\nrack:\n{}\nthe runs' warnings, errors and actions, newest last:\n{}",
                    status.map_or_else(|e| e, |s| s.to_json()),
                    rack.join("\n"),
                    history.iter().cloned().collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        unreachable!()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// The first whole minute at least [`MARGIN`] seconds from now (Unix seconds), and a daily
/// cron that fires then on [`ZONE`]'s wall clock.
fn window_soon() -> (u64, String) {
    let open_at = (unix_now() + MARGIN).div_ceil(60) * 60;
    let local = (open_at + ZONE_OFFSET) % 86_400;
    (
        open_at,
        format!("{} {} * * *", local / 60 % 60, local / 3600),
    )
}

/// `scale status` as an operator runs it.
async fn scale_status(kubeconfig: &Path) -> String {
    let out = tokio::process::Command::new(support::scale_bin())
        .arg("status")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("OXIDE_CONTROLLER_LOG_FORMAT", "text")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channels_new_patch_rolls_only_inside_a_window_and_a_new_minor_never() {
    let env = env().await;
    env.converge(Duration::from_secs(120)).await;
    assert_eq!(env.spec().await.k3s.version, RUNS);
    let channels = env.sim.channels().clone();
    let (open_at, cron) = window_soon();
    let channel_url = env.sim.channel_url.clone();
    env.edit(|s| {
        s.upgrade.channel = Some("v1.33".into());
        s.upgrade.channel_url.clone_from(&channel_url);
        s.maintenance.windows = vec![MaintenanceWindow {
            cron: cron.clone(),
            duration: "30m".into(),
            time_zone: ZONE.into(),
        }];
    })
    .await;

    // The channel names what runs: nothing to say.
    channels.set("v1.33", RUNS);
    env.run().await;
    let c = env
        .status()
        .await
        .channel
        .unwrap_or_else(|| panic!("channel status"));
    assert_eq!(
        (c.state, c.latest.as_deref()),
        (ChannelState::Current, Some(RUNS))
    );

    // The channel moves to a new patch; the window has not opened: nothing rolls, and status
    // names the release and the window.
    channels.set("v1.33", PATCH);
    let members = env.instances();
    let asked = channels.asked();
    env.run().await;
    assert!(
        unix_now() < open_at,
        "the run outside the window took past its opening; raise MARGIN"
    );
    assert_eq!(
        channels.asked() - asked,
        1,
        "one request to the channel server a run"
    );
    let status = env.status().await;
    let c = status
        .channel
        .clone()
        .unwrap_or_else(|| panic!("channel status"));
    assert_eq!(
        (c.state, c.latest.as_deref()),
        (ChannelState::Waiting, Some(PATCH)),
        "{c:?}"
    );
    let next = c.next_window.unwrap_or_else(|| panic!("nextWindow: {c:?}"));
    assert_eq!(
        next.timestamp(),
        i64::try_from(open_at).unwrap_or_default(),
        "{c:?}"
    );
    let opening = next.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let waiting = format!(
        "k3s {PATCH} (channel \"v1.33\"; the cluster runs {RUNS}) waits for the maintenance window opening at {opening}"
    );
    assert!(status.findings.contains(&waiting), "{:?}", status.findings);
    assert_eq!(
        status.condition("Ready").map(|c| c.status.as_str()),
        Some("True"),
        "a patch that waits leaves the cluster Ready"
    );
    assert_eq!(env.spec().await.k3s.version, RUNS);
    assert_eq!(env.instances(), members, "nothing created or removed");
    let shown = scale_status(&env.kubeconfig).await;
    assert!(shown.contains(&waiting), "{shown}");

    // Inside the window: the first run adopts the patch, the upgrade path rolls it.
    let wait = Duration::from_secs(open_at.saturating_sub(unix_now()) + 1);
    tokio::time::sleep(wait).await;
    env.run().await;
    let c = env
        .status()
        .await
        .channel
        .unwrap_or_else(|| panic!("channel status"));
    assert_eq!(c.state, ChannelState::Adopted, "{c:?}");
    assert_eq!(env.spec().await.k3s.version, PATCH);
    env.converge(Duration::from_secs(900)).await;
    let versions = env.versions().await;
    assert_eq!(versions.len(), 4, "{versions:?}");
    assert!(
        versions.iter().all(|(_, v)| v == PATCH),
        "every Node on the patch: {versions:?}"
    );
    assert!(
        env.instances().is_disjoint(&members),
        "every member was replaced: {:?} then {:?}",
        members,
        env.instances()
    );

    // A channel that moves to a new minor never rolls, even inside the window.
    channels.set("stable", MINOR);
    env.edit(|s| s.upgrade.channel = Some("stable".into()))
        .await;
    let members = env.instances();
    env.run().await;
    let status = env.status().await;
    let c = status
        .channel
        .clone()
        .unwrap_or_else(|| panic!("channel status"));
    assert_eq!(
        (c.state, c.latest.as_deref()),
        (ChannelState::NewerMinor, Some(MINOR)),
        "{c:?}"
    );
    let available = format!(
        "k3s {MINOR} available on channel \"stable\" (a new minor; the cluster runs {PATCH}); run scale upgrade --to {MINOR}"
    );
    assert!(
        status.findings.contains(&available),
        "{:?}",
        status.findings
    );
    assert_eq!(env.spec().await.k3s.version, PATCH);
    assert_eq!(env.instances(), members, "nothing created or removed");
}
