//! What happens inside a simulated VM once the rack says it is `running`: cloud-init reads and
//! validates the user-data, prints the SSH host key fingerprints on the serial console and
//! starts sshd, and a simulated k3s (configured from `/etc/rancher/k3s/config.yaml` written by
//! `write_files`) creates a cluster (a server without `server:`) or joins the cluster whose
//! API answers at its `server:` URL. Each cluster runs its own real control plane
//! ([`cluster_api`]), so several clusters live side by side as on a real rack.
//! Joined VMs become Nodes of their cluster; halted VMs' Nodes turn `Ready=Unknown` like a
//! vanished kubelet.
//!
//! This module owns the boot/k3s contract in SIM_CONTRACTS.md and the per-VM listeners
//! (Kubernetes API at :6443 on joined servers, SSH on server VMs). It does not own the Oxide
//! API (lifecycle, addresses: `oxide`), the Kubernetes API itself (`control_plane`) or the SSH protocol
//! (`sshd`). It never prints tokens or user-data anywhere, console included.
//!
//! One file per concern, so each guest rule has one obvious home:
//! - [`console`]: the serial console text the guest writes;
//! - [`cloud_init`]: user-data parsing and validation, `write_files`, `runcmd`;
//! - [`setup_script`]: the node setup script runcmd runs, step by step (data disk, provider
//!   ID, Tailscale, k3s) and its failure marker;
//! - [`k3s`]: its config, tokens, the create/join decision and the cluster state;
//! - [`k3s_service`]: `systemctl stop|start k3s` and `k3s server --cluster-reset` run over
//!   SSH (k3s's documented cluster reset);
//! - [`etcd_schedule`]: k3s's scheduled etcd snapshots (`etcd-snapshot-schedule-cron`) and
//!   their retention;
//! - [`etcd_restore`]: the setup's restore from a backup disk (tar, sha256sum, k3s's
//!   `--cluster-reset-restore-path`) and k3s's bootstrap data in the datastore;
//! - [`kubelet`]: node labels and taints, Node registration;
//! - [`listeners`] and [`ssh`]: what the VM serves (Kubernetes API, sshd and its files);
//! - [`lifecycle`]: the rack's events and the boot sequence gluing the rest together.

pub mod certs;
mod cloud_init;
pub mod cluster_api;
mod console;
mod etcd_member;
mod etcd_restore;
mod etcd_schedule;
mod k3s;
mod k3s_config;
mod k3s_service;
mod kubelet;
mod lifecycle;
mod listeners;
mod paths;
mod setup_script;
mod ssh;
pub mod sshd;
mod tailscale_up;
mod yaml;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

pub use cloud_init::{AuthorizedKey, MAX_USER_DATA, UserData, parse_public_key, parse_user_data};
pub use etcd_restore::{DIFFERENT_TOKEN, ETCD_DATA_DIR, bootstrap_key};
pub use k3s::ca_hash;
pub use k3s_config::{
    K3S_CONFIG_DROPIN_DIR, K3S_CONFIG_PATH, K3S_KUBECONFIG_PATH, K3S_NODE_TOKEN_PATH, K3sConfig,
    Role, parse_k3s_config,
};
pub use setup_script::{K3S_RELEASES, k3s_binary_sha256, k3s_release_exists};
pub use yaml::UserDataError;

use crate::guest::sshd::SshHost;
use crate::oxide::{Faults, OxideSim};
use crate::support::net::Listeners;

/// Port of the Kubernetes API on server VMs.
pub const KUBE_API_PORT: u16 = 6443;

/// Timing and port knobs of the simulated guest.
#[derive(Clone, Debug)]
pub struct BootConfig {
    /// Port sshd listens on (22 on a real VM; tests pass a high port).
    pub ssh_port: u16,
    /// From cloud-init start to k3s trying to start/join.
    pub k3s_boot: Duration,
    /// From k3s deciding it can start/join to its Node being registered and Ready.
    pub k3s_join: Duration,
    /// How often k3s retries an unreachable server URL.
    pub join_retry: Duration,
    /// k3s version when the install step does not pin one.
    pub k3s_version: String,
    /// Which Kubernetes a new cluster runs.
    pub kubernetes: crate::control_plane::ControlPlaneOptions,
    /// How long k3s's leaf certificates are valid (365 days on a real node; shorter scales
    /// k3s's renewal window and certificate monitor with it, see [`certs`]).
    pub cert_lifetime: Duration,
}

impl Default for BootConfig {
    fn default() -> Self {
        Self {
            ssh_port: 22,
            k3s_boot: Duration::from_millis(100),
            k3s_join: Duration::from_millis(200),
            join_retry: Duration::from_millis(200),
            k3s_version: "v1.33.4+k3s1".to_string(),
            kubernetes: crate::control_plane::ControlPlaneOptions::default(),
            cert_lifetime: certs::REAL_LIFETIME,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// state

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum K3sState {
    /// No k3s (yet): not booted that far, invalid user-data, or no install step.
    Off,
    /// Started, waiting to create/join.
    Waiting,
    /// Refused to start (wrong token, bad config, ...); never joins this boot.
    Refused,
    /// Part of the cluster; Node registered.
    Joined,
}

struct Vm {
    /// Tailnet address once `tailscale up` succeeded this boot (listeners bind it too).
    tailnet_ip: Option<IpAddr>,
    /// k3s added the tailnet address to its `tls-san` (a drop-in written before k3s started).
    tailnet_san: bool,
    /// Local addresses of successful SSH logins, oldest first (the last 32).
    ssh_logins: Vec<SocketAddr>,
    name: String,
    hostname: String,
    ssh_host: Arc<SshHost>,
    /// The "other" key printed under the `wrong_console_host_key` fault.
    decoy_host: Option<Arc<SshHost>>,
    /// Bumped on every boot and halt; a boot task whose generation is stale stops.
    generation: u64,
    running: bool,
    boot_started: Instant,
    /// External IPs at boot that are not floating IPs (the VM's "own" addresses).
    ephemeral_ips: Vec<IpAddr>,
    /// All external IPs at boot (ephemeral first, as the API lists them).
    external_ips: Vec<IpAddr>,
    /// The NIC's VPC address as the guest sees it (`172.30.0.0/22`; k3s's node IP).
    private_ip: Option<IpAddr>,
    /// Its loopback stand-in: where the guest's listeners on that address bind, and what a
    /// connection to it reaches (see `crate::oxide::subnet`).
    private_loopback: Option<IpAddr>,
    api_ssh_keys: Vec<String>,
    user_data: Option<Arc<UserData>>,
    sshd_up: bool,
    k3s: K3sState,
    /// When the running k3s process came up (its apiserver's `process_start_time_seconds`).
    k3s_started: std::time::SystemTime,
    /// When the node's leaf certificates end (None: k3s never started here); on its disk,
    /// so kept across restarts (see [`certs`]).
    certs_end: Option<std::time::SystemTime>,
    /// Has been a member of its cluster (its datastore/agent state survives reboots).
    member: bool,
    /// The cluster it joined or created (key of [`State::clusters`]).
    cluster: Option<Uuid>,
    /// cloud-init's keys_to_console ran (once per instance: never again after a restart).
    keys_printed: bool,
    /// cloud-init ran its per-instance modules (write_files, runcmd): a first boot happened.
    /// Their semaphores are written before the module runs and kept after a failure, so no
    /// later boot runs them again (cloud-init@04eacd0 `cloudinit/helpers.py:64-71,83-97`).
    instance_booted: bool,
    /// What the setup script's state file holds: the step it last started, or `done`.
    setup_state: Option<String>,
    /// The k3s unit is installed and enabled: systemd starts it on every later boot.
    k3s_enabled: bool,
    /// How often k3s exited since it was last started this boot (systemd restarts it).
    k3s_exits: u32,
    /// The last error k3s logged this boot (`level=fatal` or `level=error`).
    k3s_last_error: Option<String>,
    node_name: Option<String>,
    /// The server's etcd member (k3s's member name and the address it listens on), kept
    /// across restarts as k3s keeps it on disk.
    etcd_member: Option<(String, std::net::Ipv4Addr)>,
    /// Bumped by `systemctl stop|start k3s` over SSH: a k3s unit task of another run stops.
    k3s_unit: u64,
    /// k3s's `server/db/reset-flag` on the VM's disk (see [`k3s_service`]).
    reset_flag: bool,
    /// k3s's `snapshotMu` is held: a snapshot of this server's member is being saved.
    snapshot_busy: bool,
    /// vCPUs and memory (bytes) of the instance: the Node's capacity.
    ncpus: u16,
    memory: u64,
    /// Files uploaded over SSH: guest path → the host file holding them (they live on the
    /// VM's disk, so they survive reboots and go with the instance).
    uploads: BTreeMap<String, std::path::PathBuf>,
    /// Those of [`Vm::uploads`] written as root (through `sudo`); the others belong to the
    /// login user. sshd opens `authorized_keys` as the user ([`ssh`]).
    root_owned: std::collections::BTreeSet<String>,
    /// NVMe serials of the disks attached at this boot.
    disk_serials: Vec<String>,
    /// What `k3s server --cluster-reset --cluster-reset-restore-path` left on the disk for
    /// the next start of k3s (see [`etcd_restore`]).
    restored: Option<etcd_restore::Restored>,
}

struct Cluster {
    token: String,
    agent_token: String,
    creator: Uuid,
    /// This cluster's Kubernetes API: its own real control plane (own CA, own objects).
    api: Arc<cluster_api::RealCluster>,
    /// Hash of the API's CA, part of the full-format tokens.
    ca_hash: String,
    /// Order of creation (the first cluster is the simulator's primary one).
    seq: u64,
    /// The first server's critical configuration values (every key of
    /// [`k3s_config::CRITICAL_KEYS`] but `agent-token`, defaults filled in), which every
    /// joining server must match.
    critical: std::collections::BTreeMap<String, String>,
}

#[derive(Default)]
struct State {
    vms: HashMap<Uuid, Vm>,
    /// Attached floating IPs → instance.
    floating: HashMap<IpAddr, Uuid>,
    /// Clusters, keyed by the id of the VM that created them.
    clusters: BTreeMap<Uuid, Cluster>,
    /// Node names of deleted VMs (their Node objects may outlive them).
    departed_nodes: BTreeSet<String>,
}

impl State {
    /// The cluster `id` belongs to.
    fn cluster_of(&self, id: Uuid) -> Option<&Cluster> {
        self.vms
            .get(&id)
            .and_then(|v| v.cluster)
            .and_then(|c| self.clusters.get(&c))
    }
}

struct Inner {
    /// The simulated tailnet VMs join with `tailscale up` (see [`Boot::attach_tailnet`]).
    tailnet: OnceLock<crate::tailscale::Tailnet>,
    cfg: BootConfig,
    faults: Faults,
    listeners: Listeners,
    oxide: OnceLock<OxideSim>,
    runtime: tokio::runtime::Handle,
    /// Set on simulator shutdown: boot tasks stop at their next step.
    closed: AtomicBool,
    state: Mutex<State>,
    /// Host directory of the files uploaded to VMs (`<dir>/<instance id>/<guest path>`),
    /// created on the first upload and removed with the simulator.
    upload_dir: OnceLock<Option<tempfile::TempDir>>,
}

/// The guest side of every simulated VM; implements [`RackEvents`] for [`OxideSim`].
#[derive(Clone)]
pub struct Boot {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Boot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Boot")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl Boot {
    /// Builds the guest simulation. Must be called inside a tokio runtime; call
    /// [`Boot::attach`] with the `OxideSim` built from it before any instance runs.
    pub fn new(cfg: BootConfig, faults: Faults, listeners: Listeners) -> Self {
        Self {
            inner: Arc::new(Inner {
                tailnet: OnceLock::new(),
                cfg,
                faults,
                listeners,
                oxide: OnceLock::new(),
                runtime: tokio::runtime::Handle::current(),
                closed: AtomicBool::new(false),
                state: Mutex::new(State::default()),
                upload_dir: OnceLock::new(),
            }),
        }
    }

    /// Connects the console sink. OxideSim needs the events object at construction, so this
    /// closes the loop afterwards.
    pub fn attach(&self, oxide: OxideSim) {
        let _ = self.inner.oxide.set(oxide);
    }

    /// Connects the tailnet `tailscale up` joins. Without one, every join is refused.
    pub fn attach_tailnet(&self, tailnet: crate::tailscale::Tailnet) {
        let _ = self.inner.tailnet.set(tailnet);
    }

    /// Stops every boot in progress and closes every listener (simulator shutdown); real
    /// control planes stop once nothing else holds them.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.listeners.close_all();
        self.inner.state().clusters.clear();
    }

    /// What tests see of the (first) cluster's Kubernetes, whichever backend runs it.
    pub fn kube_view(&self) -> cluster_api::KubeView {
        self.real_clusters().into_iter().next().map_or(
            cluster_api::KubeView::NoClusterYet,
            cluster_api::KubeView::Real,
        )
    }

    /// Which Kubernetes new clusters run.
    pub fn backend(&self) -> &crate::control_plane::ControlPlaneOptions {
        &self.inner.cfg.kubernetes
    }

    /// The real control planes of the clusters, oldest first.
    pub fn real_clusters(&self) -> Vec<Arc<cluster_api::RealCluster>> {
        let st = self.inner.state();
        let mut clusters: Vec<_> = st
            .clusters
            .values()
            .map(|c| (c.seq, Arc::clone(&c.api)))
            .collect();
        clusters.sort_by_key(|(seq, _)| *seq);
        clusters.into_iter().map(|(_, c)| c).collect()
    }

    /// The listener registry (for shutdown and the admin dump).
    pub fn listeners(&self) -> &Listeners {
        &self.inner.listeners
    }

    /// Cluster summary for the admin state dump: who created the first cluster and which VMs
    /// joined it, every cluster with its members, each VM's role and Node
    /// name, and the open listeners.
    pub fn cluster_info(&self) -> Value {
        let st = self.inner.state();
        let mut vms: Vec<Value> = st
            .vms
            .iter()
            .map(|(id, vm)| {
                json!({
                    "instance": vm.name,
                    "id": id,
                    "running": vm.running,
                    "role": vm.user_data.as_ref().and_then(|u| u.role),
                    "k3s": vm.k3s,
                    "joined": vm.k3s == K3sState::Joined,
                    "node": vm.node_name,
                    "ssh_host_key": vm.ssh_host.fingerprint(),
                    "tailnet_ip": vm.tailnet_ip,
                    "ssh_logins": vm.ssh_logins,
                })
            })
            .collect();
        vms.sort_by(|a, b| a["instance"].as_str().cmp(&b["instance"].as_str()));
        let name_of = |id: &Uuid| st.vms.get(id).map(|v| v.name.clone()).unwrap_or_default();
        let joined_to = |cluster: &Uuid| {
            let mut joined: Vec<String> = st
                .vms
                .values()
                .filter(|v| v.k3s == K3sState::Joined && v.cluster.as_ref() == Some(cluster))
                .map(|v| v.name.clone())
                .collect();
            joined.sort();
            joined
        };
        // The primary cluster: the first one created.
        let primary = st
            .clusters
            .iter()
            .min_by_key(|(_, c)| c.seq)
            .map(|(id, _)| *id);
        let clusters: Vec<Value> = st
            .clusters
            .iter()
            .map(|(id, c)| {
                json!({
                    "creator": name_of(&c.creator),
                    "primary": Some(*id) == primary,
                    "joined": joined_to(id),
                })
            })
            .collect();
        let creator = primary.map(|id| name_of(&id));
        let joined = primary.map(|id| joined_to(&id)).unwrap_or_default();
        drop(st);
        json!({
            "created": creator.is_some(),
            "creator": creator,
            "joined": joined,
            "clusters": clusters,
            "vms": vms,
            "listeners": self.inner.listeners.snapshot(),
        })
    }

    /// The host file holding what was uploaded over SSH to `path` on `instance` (mode as the
    /// upload set it), if anything was.
    pub fn uploaded_file(&self, instance: Uuid, path: &str) -> Option<std::path::PathBuf> {
        self.inner
            .state()
            .vms
            .get(&instance)?
            .uploads
            .get(path)
            .cloned()
    }

    /// [`Boot::uploaded_file`] of the running VM whose Node is `node` (what a hostPath volume
    /// on that Node sees).
    pub fn node_file(&self, node: &str, path: &str) -> Option<std::path::PathBuf> {
        let st = self.inner.state();
        let vm = st
            .vms
            .values()
            .find(|v| v.running && v.node_name.as_deref() == Some(node))?;
        vm.uploads.get(path).cloned()
    }

    /// The host directory holding guest directory `path` (absolute, no `..`) of the running
    /// VM whose Node is `node`: what a `hostPath` volume of that directory on that Node sees,
    /// live (files k3s writes there later appear in it). It need not exist yet.
    pub fn node_dir(&self, node: &str, path: &str) -> Option<std::path::PathBuf> {
        let id = {
            let st = self.inner.state();
            st.vms
                .iter()
                .find(|(_, v)| v.running && v.node_name.as_deref() == Some(node))
                .map(|(id, _)| *id)?
        };
        self.inner.guest_dir(id, path)
    }

    /// Whether the VM behind Node `node` runs: `Some(true)` when a running VM registered
    /// that Node, `Some(false)` when only stopped (halted, failed, deleted) VMs did, `None`
    /// when no VM of the simulator ever did (a Node a test made by hand). The pod runner asks
    /// this, as only a running VM has a kubelet to start or stop its pods.
    pub fn node_vm_running(&self, node: &str) -> Option<bool> {
        let st = self.inner.state();
        let mut seen = false;
        for v in st.vms.values() {
            if v.node_name.as_deref() == Some(node) {
                if v.running {
                    return Some(true);
                }
                seen = true;
            }
        }
        (seen || st.departed_nodes.contains(node)).then_some(false)
    }

    /// Node name of a joined instance (None when it has not joined).
    pub fn joined_node(&self, instance: Uuid) -> Option<String> {
        let st = self.inner.state();
        st.vms
            .get(&instance)
            .filter(|v| v.k3s == K3sState::Joined)
            .and_then(|v| v.node_name.clone())
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// True while the boot of generation `gen` is current.
    fn current(&self, id: Uuid, generation: u64) -> bool {
        !self.closed.load(Ordering::SeqCst)
            && self
                .state()
                .vms
                .get(&id)
                .is_some_and(|v| v.running && v.generation == generation)
    }

    /// `<upload dir>/<instance id>`, creating the upload directory on first use.
    fn vm_upload_dir(&self, id: Uuid) -> Option<std::path::PathBuf> {
        self.upload_dir
            .get_or_init(|| {
                crate::support::scratch::tempdir("oxide-sim-vm-files-")
                    .map_err(
                        |err| tracing::warn!(error = %err, "cannot create the upload directory"),
                    )
                    .ok()
            })
            .as_ref()
            .map(|d| d.path().join(id.to_string()))
    }

    /// The API of `id`'s cluster, if it is in one.
    fn api_of(&self, st: &State, id: Uuid) -> Option<Arc<cluster_api::RealCluster>> {
        st.cluster_of(id).map(|c| Arc::clone(&c.api))
    }

    fn name_matches(prefixes: &[String], name: &str) -> bool {
        prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}
