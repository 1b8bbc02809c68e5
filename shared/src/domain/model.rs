//! Domain types shared by the planner, the adapters and the workflows: what the rack and the
//! cluster look like to us. SDK types (`oxide::types`, `k8s_openapi`) never leak past the
//! adapters; they convert into these.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::base::size::ByteSize;

pub mod workload;
pub use workload::{
    ClaimRef, DisruptionBudget, LabelOp, LabelRequirement, LabelSelector, Owner, PersistentVolume,
    Pod, Resources, Toleration,
};

/// Oxide instance states (`InstanceState` in the API), plus a catch-all for states newer than us.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Creating,
    Starting,
    Running,
    Stopping,
    Stopped,
    Rebooting,
    Migrating,
    Repairing,
    Failed,
    Destroyed,
    Other(String),
}

impl InstanceState {
    /// States that pass by themselves (the instance is on its way somewhere).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            InstanceState::Creating
                | InstanceState::Starting
                | InstanceState::Stopping
                | InstanceState::Rebooting
                | InstanceState::Migrating
                | InstanceState::Repairing
        )
    }

    /// Oxide deletes instances only in these states.
    pub fn is_deletable(&self) -> bool {
        matches!(self, InstanceState::Stopped | InstanceState::Failed)
    }
}

/// An Oxide instance, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub id: Uuid,
    pub name: String,
    pub description: String,
    pub hostname: String,
    pub state: InstanceState,
    pub ncpus: u16,
    pub memory: ByteSize,
    pub time_created: DateTime<Utc>,
    pub time_state_updated: DateTime<Utc>,
}

/// Oxide disk states that matter to us.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskState {
    Detached,
    Attached(Uuid),
    Faulted,
    /// creating, attaching, detaching, importing, finalizing, maintenance, ...
    Busy(String),
}

/// An Oxide disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Disk {
    pub id: Uuid,
    pub name: String,
    /// Member disks carry their instance's tag ([`crate::base::names::InstanceTag`]), which is how
    /// an orphaned disk is known to be ours.
    #[serde(default)]
    pub description: String,
    pub state: DiskState,
    pub size: ByteSize,
    pub time_created: DateTime<Utc>,
    /// The image it was created from, if any (a member's boot disk).
    #[serde(default)]
    pub image_id: Option<Uuid>,
}

/// An Oxide floating IP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloatingIp {
    pub id: Uuid,
    pub name: String,
    /// Ours say `oxide-controller cluster=<c> ...`; the Oxide CCM's say it manages them.
    #[serde(default)]
    pub description: String,
    pub ip: IpAddr,
    pub instance_id: Option<Uuid>,
}

/// An external IP of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalIp {
    pub ip: IpAddr,
    pub kind: ExternalIpKind,
}

/// Kinds of external IP. SNAT addresses are outbound-only: never connect to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExternalIpKind {
    Snat,
    Ephemeral,
    Floating,
}

/// An image, project- or silo-scoped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Image {
    pub id: Uuid,
    pub name: String,
    /// Images bootstrap uploaded say so, with the cluster ([`crate::base::names::uploaded_image_description`]).
    #[serde(default)]
    pub description: String,
    pub size: ByteSize,
    pub block_size: u64,
    pub silo_scoped: bool,
}

/// A snapshot in the project (left over by an interrupted image import, or anyone's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: Uuid,
    pub name: String,
    pub description: String,
    /// The disk it was taken of (it may be gone since).
    pub disk_id: Uuid,
}

/// An anti-affinity group in the project.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AntiAffinityGroup {
    pub id: Uuid,
    pub name: String,
    pub description: String,
}

/// A disk to create with a new instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewDisk {
    pub name: String,
    pub size: ByteSize,
    /// Boot disks come from an image; data disks are blank.
    pub image: Option<Uuid>,
}

/// A disk made from a snapshot with a new instance: the backup a restoring server reads its
/// datastore from (`bootstrap recover --backup`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotDisk {
    pub name: String,
    pub snapshot: Uuid,
    /// The snapshot's size (a disk from a snapshot is at least that large).
    pub size: ByteSize,
}

/// Everything needed to create one VM. Built by the planner's caller from the spec; the
/// adapter only translates it.
#[derive(Clone, PartialEq, Serialize)]
pub struct NewInstance {
    pub name: String,
    pub description: String,
    pub hostname: String,
    pub ncpus: u16,
    pub memory: ByteSize,
    pub boot_disk: NewDisk,
    pub data_disk: Option<NewDisk>,
    /// A disk made from a snapshot, attached after the data disk (restores only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_disk: Option<SnapshotDisk>,
    /// Rendered `#cloud-config`; holds join tokens, so it is skipped by Debug and Serialize.
    #[serde(skip)]
    pub user_data: Vec<u8>,
    pub ephemeral_ip: bool,
    pub ip_pool: Option<String>,
    pub anti_affinity_group: Option<String>,
    /// `auto_restart_policy`: `best_effort` (the rack restarts it when it fails) or `never`.
    pub rack_restarts: bool,
}

impl std::fmt::Debug for NewInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewInstance")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("ncpus", &self.ncpus)
            .field("memory", &self.memory)
            .field("boot_disk", &self.boot_disk)
            .field("data_disk", &self.data_disk)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .finish_non_exhaustive()
    }
}

/// Readiness of a Node, from its `Ready` condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum NodeReadiness {
    Ready,
    /// `False` or `Unknown` since the condition's last transition.
    NotReady {
        since: DateTime<Utc>,
    },
}

/// A Kubernetes Node, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub provider_id: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub readiness: NodeReadiness,
    pub unschedulable: bool,
    pub created: DateTime<Utc>,
    /// `spec.taints` (the autoscaler checks pods' tolerations against them).
    #[serde(default)]
    pub taints: Vec<crate::domain::spec::Taint>,
    /// `status.allocatable` (the autoscaler packs pods against it).
    #[serde(default)]
    pub allocatable: Allocatable,
    /// `status.nodeInfo.kubeletVersion` (k3s reports its release, `v1.33.4+k3s1`): what the
    /// upgrade order trusts, as k3s-upgrade's agent `prepare` step does.
    #[serde(default)]
    pub kubelet_version: Option<String>,
    /// `metadata.deletionTimestamp`: the Node is being deleted and waits on a finalizer (k3s's
    /// etcd member controller keeps one on a server's Node until its member is removed).
    #[serde(default)]
    pub deleting_since: Option<DateTime<Utc>>,
}

/// A Node's `status.allocatable`, the part the autoscaler uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocatable {
    pub cpu_milli: u64,
    pub memory: u64,
    /// 0: not reported (the kubelet's default of 110 applies).
    pub pods: u32,
}

/// Annotation a person puts on a Node to have it removed first on scale-down.
pub const DELETE_ME_ANNOTATION: &str = "oxide-controller/delete-me";
/// Annotation we put on a Node when we start removing its member; later runs carry on.
pub const REMOVING_ANNOTATION: &str = "oxide-controller/removing";
/// Annotation we put on a server's Node (RFC 3339 time) just before we start its failed or
/// stopped instance again: the planner starts a member once per outage and gives it one join
/// deadline from then (see [`crate::domain::plan`] "start before replace").
pub const RESTARTED_ANNOTATION: &str = "oxide-controller/restarted-at";

impl Node {
    /// Marked `oxide-controller/delete-me` (any value but "false").
    pub fn marked_for_deletion(&self) -> bool {
        self.annotations
            .get(DELETE_ME_ANNOTATION)
            .is_some_and(|v| v != "false")
    }

    pub fn is_ready(&self) -> bool {
        self.readiness == NodeReadiness::Ready
    }

    /// Carries [`REMOVING_ANNOTATION`]: a removal of ours is under way.
    pub fn being_removed(&self) -> bool {
        self.annotations.contains_key(REMOVING_ANNOTATION)
    }

    /// When we last started its instance again ([`RESTARTED_ANNOTATION`]); an unreadable
    /// value counts as never.
    pub fn restarted_at(&self) -> Option<DateTime<Utc>> {
        self.annotations
            .get(RESTARTED_ANNOTATION)
            .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
            .map(|t| t.with_timezone(&Utc))
    }
}

/// A pod as drain sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// A pod re-created under the same name is another pod: drain waits for uids.
    #[serde(default)]
    pub uid: String,
    /// DaemonSet pods are left alone by drain, as `kubectl drain --ignore-daemonsets` does.
    pub daemonset: bool,
    /// Static (mirror) pods cannot be evicted.
    pub mirror: bool,
    /// Already finished (Succeeded/Failed): nothing to evict.
    pub finished: bool,
    /// Being deleted: its `deletionTimestamp`, the end of its grace period. A pod still
    /// there well after it is held by finalizers or an unresponsive kubelet.
    #[serde(default)]
    pub deleting_at: Option<DateTime<Utc>>,
}

impl PodRef {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A failed node setup, as the failure marker on the console says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupFailure {
    /// The step that failed (as the script names it).
    pub step: String,
    /// Why (the script's message, or `exit status N`).
    pub reason: String,
}

impl fmt::Display for SetupFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node setup failed at {}: {}", self.step, self.reason)
    }
}

/// One etcd member as k3s's supervisor lists it on `/db/info` (etcd's `Member` message,
/// marshalled by Go's `encoding/json`: `ID` a number, `name`, `peerURLs`, `clientURLs`,
/// `isLearner`, each left out when empty or false).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdMember {
    #[serde(rename = "ID", default)]
    pub id: u64,
    /// Empty while an added member has not started yet.
    #[serde(default)]
    pub name: String,
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

impl EtcdMember {
    /// The Node name k3s made the member's name from: k3s names a member
    /// `<node-name>-<8 hex chars of a UUID>` and reads the node name back as everything
    /// before the last hyphen (when that hyphen is past the second character; else the whole
    /// name). `None` for an unnamed (not yet started) member.
    pub fn node_name(&self) -> Option<&str> {
        if self.name.is_empty() {
            return None;
        }
        Some(match self.name.rfind('-') {
            Some(i) if i > 1 => &self.name[..i],
            _ => &self.name,
        })
    }

    /// How a finding names it: its name and ID as `etcdctl member list` prints them, or its
    /// peer URL while it has no name.
    pub fn describe(&self) -> String {
        let peer = self.peer_urls.first().map_or("", String::as_str);
        if self.name.is_empty() {
            format!("an unstarted member at {peer} (ID {:x})", self.id)
        } else {
            format!("{} (ID {:x}, {peer})", self.name, self.id)
        }
    }
}

/// The cluster's etcd member list as a run observed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum EtcdMembership {
    /// Not asked (planner tests that are not about etcd; a run always asks).
    #[default]
    NotRead,
    Read(Vec<EtcdMember>),
    /// Asked and not answered: why.
    Unreadable(String),
}
