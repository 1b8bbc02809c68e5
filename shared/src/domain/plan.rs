//! The planner: `plan(&spec, &observed, now, fresh_suffixes) -> Plan`.
//!
//! Pure and synchronous: no I/O, no clock (the caller passes `now`), no RNG (the caller passes
//! pre-drawn name suffixes). Every decision about *what* to do lives here, where table tests
//! reach it; `apply` only carries actions out. Each action carries a human reason.
//!
//! Rules (DESIGN.md "Reconcile rules"), per pool:
//! - members are classified ([`Health`]); capacity = Ready + Joining + NotReady within grace;
//! - removals already under way (Node annotated `removing`, instance stopping/stopped) go on;
//! - broken members (Failed, join timed out, NotReady past grace) are removed; workers are
//!   replaced in the same run, the control plane removes first and replaces in a later run,
//!   because adding an etcd member while another is dead can cost quorum;
//! - start before replace: a server whose instance is `failed` or `stopped` while its Node is
//!   registered, and whose boot disk is there, is started again once (its Node annotated
//!   [`RESTARTED_ANNOTATION`] first) and replaced only when it goes down again after that
//!   start or is not a Ready Node one join deadline after it (see [`Health::Down`]);
//! - scale up creates the shortfall, never letting a pool exceed desired+1 instances;
//! - scale down picks victims: `delete-me` > never joined > NotReady > drifted > newest;
//! - drift rolls one member at a time per pool: a surge member first, then, once it is Ready,
//!   one drifted member goes; scale-downs wait while a surge member is joining; with
//!   `maintenance.windows`, a surge member is created only while a window is open;
//! - the control plane changes one member at a time and never below etcd quorum;
//! - the API floating IP sits on a Ready control-plane member;
//! - Nodes without an instance and disks without an instance are deleted.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::base::names::{self, InstanceTag};
use crate::domain::maintenance::{Gate, Windows};
use crate::domain::model::{
    Disk, DiskState, EtcdMember, EtcdMembership, FloatingIp, Image, Instance, InstanceState,
    NewInstance, Node, NodeReadiness,
};
use crate::domain::spec::{ClusterSpec, PoolSpec, Role};

pub mod backoff;
mod certs;

pub use crate::domain::model::{REMOVING_ANNOTATION, RESTARTED_ANNOTATION};

/// What happened to one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Done,
    /// Made progress; a later run finishes it.
    InProgress(String),
    Failed(String),
    /// Not started: deadline reached or Lease lost.
    Skipped(String),
}

/// An action and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionResult {
    #[serde(flatten)]
    pub action: Action,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// A failed create whose cause retrying at once does not fix (see
    /// [`crate::domain::plan::backoff`]).
    #[serde(skip)]
    pub blocked: Option<backoff::Blocked>,
}

/// Builds the instance for a `CreateMember` action (spec + secrets + images + cloud-init).
pub trait MemberFactory: Send + Sync {
    fn new_instance(&self, pool: &str, name: &str) -> Result<NewInstance, String>;
    /// Anti-affinity group of a pool, if any.
    fn anti_affinity_group(&self, pool: &str) -> Option<String>;
}
/// Label k3s puts on server Nodes.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// What a run observed. Instances and disks are complete listings (all pages).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Instances whose name starts with `<cluster>-`.
    pub instances: Vec<Instance>,
    pub nodes: Vec<Node>,
    pub disks: Vec<Disk>,
    /// The API floating IP, looked up by exact name.
    pub api_floating_ip: Option<FloatingIp>,
    /// The private (VPC) address of a Ready server that new members join through (looked up
    /// only when the plan creates members; see [`crate::render::members::join_server`]).
    pub join_address: Option<std::net::IpAddr>,
    /// Images the spec names, resolved (None: not found in project or silo). A name that is
    /// not a key was not looked up: the caller resolves images only when a plan creates.
    pub images: BTreeMap<String, Option<Image>>,
    /// Members without a Node whose serial console shows the node setup script's failure
    /// marker (the caller reads the consoles of running members that have no Node yet).
    pub setup_failures: BTreeMap<String, crate::domain::model::SetupFailure>,
    /// Members the autoscaler chose to remove (instance names): they go first on scale-down,
    /// like a `delete-me` Node (see [`crate::domain::autoscale`]).
    pub autoscale_victims: BTreeSet<String>,
    /// Members whose autoscaler removal did not finish in time (instance names): while still
    /// running, they are kept and their Nodes uncordoned instead.
    pub autoscale_given_up: BTreeSet<String>,
    /// Pools whose creates the rack kept refusing, as the last run left them (see
    /// [`backoff`]).
    pub create_backoff: backoff::Backoffs,
    /// The prefix length of the project's default VPC subnet (None: no such subnet yet).
    /// Not planned on; recorded in the status for the webhook's subnet check.
    pub subnet_prefix: Option<u8>,
    /// The etcd member list a Ready server's k3s supervisor serves on `/db/info`: while it
    /// and the servers disagree, has a learner, or cannot be read, no control-plane change
    /// is made (see [`etcd_members_match`]).
    pub etcd: EtcdMembership,
    /// What each node's k3s certificate monitor last reported, by Node name. None: not
    /// asked (planner tests that are not about certificates; a run always asks); an error:
    /// its Events could not be read, and no restart for certificates is planned.
    pub certificates: Option<Result<BTreeMap<String, crate::domain::certificates::Report>, String>>,
    /// Why a roll of the control plane must not take its next step yet: no backup was taken
    /// after it was decided ([`crate::domain::backup::before_roll`]). The workflow decides;
    /// the planner holds the roll's surge create (a dead server's replacement is no roll and
    /// does not wait).
    pub roll_hold: Option<Finding>,
}

/// How a member is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Ready,
    /// Running or on its way, not yet a Ready Node, within the join deadline.
    Joining,
    /// Was Ready, is not, within the grace period.
    NotReady,
    JoinTimedOut,
    /// Never a Node, and its console says the node setup failed: it will never join, so it
    /// is replaced now rather than at the join deadline.
    SetupFailed,
    NotReadyTooLong,
    Failed,
    /// Stopped with its Node still registered and not being removed: someone stopped it (a
    /// worker; a server is [`Health::Down`]).
    StoppedUnexpectedly,
    /// A server that is `failed` (a sled fault: nexus marks the VMMs of a sled that is
    /// expunged, powered off or restarted `failed`) or `stopped` while its Node is registered,
    /// with its boot disk there: its etcd data survives, so it is started again, once per
    /// outage, and counts as a member meanwhile.
    Down,
    /// A server that went down and is not coming back: replaced (see [`Lost`]).
    Lost(Lost),
    /// Stopped, never a Node, younger than the join deadline: the rack did not start it (a
    /// full rack or an exhausted silo quota makes create answer 201 with a `stopped`
    /// instance). It is started again (once per run, which also tells why it cannot run) and
    /// is the first to go when the pool has too many.
    NotStarted,
    /// A removal we started (Node annotated, instance stopping, or stopped without a Node past
    /// the join deadline).
    Removing,
}

impl Health {
    /// Counts towards the pool's capacity (a member stopped by someone else is being started
    /// again, so it is not replaced meanwhile).
    /// Counts toward the pool's capacity (is, or is becoming, a member).
    pub fn counts(&self) -> bool {
        matches!(
            self,
            Health::Ready
                | Health::Joining
                | Health::NotReady
                | Health::StoppedUnexpectedly
                | Health::NotStarted
                | Health::Down
        )
    }
    /// About to be replaced.
    pub fn is_broken(&self) -> bool {
        matches!(
            self,
            Health::JoinTimedOut
                | Health::SetupFailed
                | Health::NotReadyTooLong
                | Health::Failed
                | Health::Lost(_)
        )
    }
}

/// Why a server that went down is replaced rather than started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lost {
    /// Its boot disk is gone or faulted: nothing to start.
    BootDisk,
    /// It went down again after we started it, before it was a Ready Node again.
    DownAgain,
    /// Not a Ready Node one join deadline after it was started again.
    NotBack,
}

/// One VM of the cluster with its Node, classified.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    pub instance: &'a Instance,
    pub node: Option<&'a Node>,
    pub pool: String,
    pub drifted: bool,
    pub health: Health,
    /// The failure marker its console shows (with [`Health::SetupFailed`]).
    pub setup_failure: Option<&'a crate::domain::model::SetupFailure>,
    /// The autoscaler chose it for removal.
    pub autoscale_victim: bool,
}

impl Member<'_> {
    fn name(&self) -> &str {
        &self.instance.name
    }
}

/// One step of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Create and start a new member.
    CreateMember {
        pool: String,
        role: Role,
        name: String,
        reason: String,
    },
    /// Take a member out: cordon + annotate, drain (if asked and the Node is Ready), stop,
    /// delete the Node, delete the instance and its disks. Each step is idempotent; the
    /// pipeline may stop early (PDB, still stopping) and resume in a later run.
    RemoveMember {
        pool: String,
        name: String,
        node: Option<String>,
        drain: bool,
        reason: String,
    },
    /// Give up a removal the autoscaler started and that did not finish in time: uncordon
    /// the Node and drop the removal annotation; the member stays.
    CancelRemoval {
        pool: String,
        name: String,
        node: String,
        reason: String,
    },
    /// Start a member that is stopped (or failed). With `mark_node`, that Node is annotated
    /// [`RESTARTED_ANNOTATION`] with the time first, so later runs know the start was made.
    StartMember {
        pool: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mark_node: Option<String>,
        reason: String,
    },
    /// Restart a member so k3s renews its certificates (see
    /// [`crate::domain::certificates`]): annotate its Node `restarting <since>` (and cordon
    /// it, with `drain`), drain it, reboot the instance.
    RestartForCertificates {
        pool: String,
        name: String,
        node: String,
        drain: bool,
        /// The only Ready server: the run's own API goes down with it, so it is rebooted
        /// once the run has written its status and given back its Lease.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        after_run: bool,
        since: DateTime<Utc>,
        reason: String,
    },
    /// A restart for certificates is over: annotate the Node `done <since>` (and uncordon
    /// it, with `uncordon`).
    FinishCertificateRestart {
        pool: String,
        name: String,
        node: String,
        uncordon: bool,
        since: DateTime<Utc>,
        reason: String,
    },
    /// Delete a Node whose instance is gone.
    DeleteNode { node: String, reason: String },
    /// Delete a detached disk whose instance is gone.
    DeleteDisk { disk: String, reason: String },
    /// Create the API floating IP (repair; bootstrap normally made it).
    CreateApiFloatingIp {
        name: String,
        /// Bootstrap's description, so `bootstrap delete` owns a re-created address too.
        description: String,
        reason: String,
    },
    /// Move (or attach) the API floating IP to a Ready control-plane member.
    AttachApiFloatingIp {
        fip: String,
        to: String,
        from: Option<String>,
        /// The holder is `failed`: nexus refuses to detach from a failed instance, and a stop
        /// (which only ends its VMM) makes the detach legal, so stop it first.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stop_from: bool,
        reason: String,
    },
}

impl Action {
    pub fn reason(&self) -> &str {
        match self {
            Action::CreateMember { reason, .. }
            | Action::RemoveMember { reason, .. }
            | Action::CancelRemoval { reason, .. }
            | Action::StartMember { reason, .. }
            | Action::RestartForCertificates { reason, .. }
            | Action::FinishCertificateRestart { reason, .. }
            | Action::DeleteNode { reason, .. }
            | Action::DeleteDisk { reason, .. }
            | Action::CreateApiFloatingIp { reason, .. }
            | Action::AttachApiFloatingIp { reason, .. } => reason,
        }
    }

    /// Short verb for tables and events.
    pub fn verb(&self) -> &'static str {
        match self {
            Action::CreateMember { .. } => "create",
            Action::RemoveMember { .. } => "remove",
            Action::CancelRemoval { .. } => "keep",
            Action::StartMember { .. } => "start",
            Action::RestartForCertificates { .. } => "restart",
            Action::FinishCertificateRestart { .. } => "restarted",
            Action::DeleteNode { .. } => "delete-node",
            Action::DeleteDisk { .. } => "delete-disk",
            Action::CreateApiFloatingIp { .. } => "create-fip",
            Action::AttachApiFloatingIp { .. } => "attach-fip",
        }
    }

    /// The object the action is about.
    pub fn target(&self) -> &str {
        match self {
            Action::CreateMember { name, .. }
            | Action::RemoveMember { name, .. }
            | Action::CancelRemoval { name, .. }
            | Action::StartMember { name, .. }
            | Action::RestartForCertificates { name, .. }
            | Action::FinishCertificateRestart { name, .. } => name,
            Action::DeleteNode { node, .. } => node,
            Action::DeleteDisk { disk, .. } => disk,
            Action::CreateApiFloatingIp { name, .. } => name,
            Action::AttachApiFloatingIp { fip, .. } => fip,
        }
    }
}

/// Something the run noticed that needs no action from it, or that blocks one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Makes the cluster Degraded (vs. just informative).
    pub degraded: bool,
    pub message: String,
}

/// Per-pool counts, for status and the summary line. Keys are camelCase like the rest of
/// `status.json`; `not_ready`, written by earlier releases, is still read.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolCounts {
    pub pool: String,
    pub desired: u32,
    pub ready: u32,
    pub joining: u32,
    #[serde(alias = "not_ready")]
    pub not_ready: u32,
    pub broken: u32,
    pub removing: u32,
    pub drifted: u32,
}

/// The plan for one run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub findings: Vec<Finding>,
    pub pools: Vec<PoolCounts>,
    /// Blocked pools that are still short of members (the others' blocks are dropped); the
    /// run adds what its creates met (see [`backoff::after_run`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub create_backoff: backoff::Backoffs,
    /// The versions this run rolls each pool to and the upgrade under way (set by the
    /// workflow, which plans the effective spec: see [`crate::domain::upgrade`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<crate::domain::upgrade::Progress>,
    /// The certificates the nodes' monitors report, per pool (see
    /// [`crate::domain::certificates`]).
    #[serde(skip)]
    pub certificates: crate::domain::certificates::Outcome,
    /// The roll of the control plane under way and when it was decided (set by the
    /// workflow: see [`crate::domain::backup::roll`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roll: Option<crate::domain::backup::RollDecision>,
}

impl Plan {
    /// Nothing to do and every pool at its desired shape.
    pub fn is_converged(&self) -> bool {
        self.actions.is_empty()
            && self.pools.iter().all(|p| {
                p.ready == p.desired
                    && p.joining == 0
                    && p.not_ready == 0
                    && p.broken == 0
                    && p.removing == 0
                    && p.drifted == 0
            })
    }

    pub fn is_degraded(&self) -> bool {
        self.findings.iter().any(|f| f.degraded)
    }

    /// The plan as a text table (for `--dry-run`).
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let pw = self
            .pools
            .iter()
            .map(|p| p.pool.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:<pw$} {:>7} {:>5} {:>7} {:>9} {:>6} {:>8} {:>7}",
            "POOL", "DESIRED", "READY", "JOINING", "NOT-READY", "BROKEN", "REMOVING", "DRIFTED"
        );
        for p in &self.pools {
            let _ = writeln!(
                out,
                "{:<pw$} {:>7} {:>5} {:>7} {:>9} {:>6} {:>8} {:>7}",
                p.pool, p.desired, p.ready, p.joining, p.not_ready, p.broken, p.removing, p.drifted
            );
        }
        out.push('\n');
        if self.actions.is_empty() {
            out.push_str("No actions: ");
            out.push_str(if self.is_converged() {
                "the cluster is converged.\n"
            } else {
                "waiting on the cluster.\n"
            });
        } else {
            let w = self
                .actions
                .iter()
                .map(|a| a.target().len())
                .max()
                .unwrap_or(6)
                .max(6);
            let _ = writeln!(out, "{:<12} {:<w$} REASON", "ACTION", "TARGET");
            for a in &self.actions {
                let _ = writeln!(out, "{:<12} {:<w$} {}", a.verb(), a.target(), a.reason());
            }
        }
        for f in &self.findings {
            let _ = writeln!(
                out,
                "{}: {}",
                if f.degraded { "DEGRADED" } else { "note" },
                f.message
            );
        }
        out
    }
}

/// etcd quorum for `members` voting members.
pub fn quorum(members: usize) -> usize {
    members / 2 + 1
}

/// Classifies the cluster's instances into members, keyed by pool name. Instances without our
/// tag, or tagged for another cluster, are not members and are left alone.
pub fn classify<'a>(
    spec: &ClusterSpec,
    observed: &'a Observed,
    now: DateTime<Utc>,
) -> Vec<Member<'a>> {
    let nodes: BTreeMap<&str, &Node> = observed
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n))
        .collect();
    let join = Duration::seconds(secs(spec.timeouts.join_seconds));
    let grace = Duration::seconds(secs(spec.timeouts.not_ready_grace_seconds));
    let transition = Duration::seconds(secs(spec.timeouts.transition_seconds));
    let mut members = Vec::new();
    for inst in &observed.instances {
        let Some(tag) = InstanceTag::parse(&inst.description) else {
            continue;
        };
        if tag.cluster != spec.cluster || inst.state == InstanceState::Destroyed {
            continue;
        }
        let node = nodes.get(inst.name.as_str()).copied();
        let drifted = match spec.pool(&tag.pool) {
            Some((role, pool)) => spec.pool_hash(role, pool) != tag.spec_hash,
            None => false,
        };
        let removing = node.is_some_and(|n| n.being_removed());
        let is_server = spec
            .pool(&tag.pool)
            .is_some_and(|(role, _)| role == Role::ControlPlane);
        let health = match &inst.state {
            _ if removing => Health::Removing,
            InstanceState::Failed | InstanceState::Stopped if is_server && node.is_some() => {
                down_health(inst, node, boot_disk_usable(observed, inst), now, join)
            }
            InstanceState::Failed => Health::Failed,
            InstanceState::Stopping => Health::Removing,
            // Within the join deadline a stopped member without a Node is one the rack did not
            // start. Later it is indistinguishable from a removal that stopped a never-joined
            // member and was cut short, and starting that again would loop (start, time out,
            // stop, start): finish the removal. On a rack that stays full this replaces the
            // member once per join deadline, never once per run.
            InstanceState::Stopped if node.is_none() && now - inst.time_created <= join => {
                Health::NotStarted
            }
            InstanceState::Stopped if node.is_none() => Health::Removing,
            InstanceState::Stopped => Health::StoppedUnexpectedly,
            state => match node.map(|n| &n.readiness) {
                Some(NodeReadiness::Ready) if *state == InstanceState::Running => Health::Ready,
                Some(NodeReadiness::Ready) => Health::NotReady,
                // Started again (by us or by the rack) after its Node went down: it gets one
                // join deadline from that start to be Ready again, not the NotReady grace,
                // which ran out while it was down.
                Some(NodeReadiness::NotReady { since }) if inst.time_state_updated > *since => {
                    if now - inst.time_state_updated > join {
                        Health::Lost(Lost::NotBack)
                    } else {
                        Health::Joining
                    }
                }
                Some(NodeReadiness::NotReady { since }) => {
                    if now - *since > grace {
                        Health::NotReadyTooLong
                    } else {
                        Health::NotReady
                    }
                }
                None if observed.setup_failures.contains_key(&inst.name) => Health::SetupFailed,
                None => {
                    let limit = if state.is_transient() && *state != InstanceState::Starting {
                        transition.max(join)
                    } else {
                        join
                    };
                    if now - inst.time_created > limit {
                        Health::JoinTimedOut
                    } else {
                        Health::Joining
                    }
                }
            },
        };
        members.push(Member {
            instance: inst,
            node,
            pool: tag.pool,
            drifted,
            health,
            setup_failure: observed.setup_failures.get(&inst.name),
            autoscale_victim: observed.autoscale_victims.contains(&inst.name),
        });
    }
    members
}

/// Whether `inst`'s boot disk is there and not faulted (a start needs it).
fn boot_disk_usable(observed: &Observed, inst: &Instance) -> bool {
    let boot = names::boot_disk_name(&inst.name);
    observed
        .disks
        .iter()
        .any(|d| d.name == boot && d.state != DiskState::Faulted)
}

/// When we last started this member again, if that was within the last join deadline (the
/// Node's `restarted-at`, T).
fn restarted_within(
    node: Option<&Node>,
    now: DateTime<Utc>,
    join: Duration,
) -> Option<DateTime<Utc>> {
    node?.restarted_at().filter(|t| now - *t <= join)
}

/// A server that is `failed` or `stopped` with its Node registered. It is started again at
/// most once per join deadline (T = our last start, F = its last state change): with no start
/// in the last join deadline, start it; after one, it is replaced if it changed state since
/// (it went down again after the start took); otherwise the start has not taken yet (the rack
/// refused it, say, for capacity) and is made again. A start older than the join deadline
/// that never took (F before T) means it did not come back in time: replace it.
fn down_health(
    inst: &Instance,
    node: Option<&Node>,
    boot_disk: bool,
    now: DateTime<Utc>,
    join: Duration,
) -> Health {
    if !boot_disk {
        return Health::Lost(Lost::BootDisk);
    }
    let changed_since = |t: DateTime<Utc>| inst.time_state_updated > t;
    match (
        restarted_within(node, now, join),
        node.and_then(Node::restarted_at),
    ) {
        (Some(t), _) if changed_since(t) => Health::Lost(Lost::DownAgain),
        (Some(_), _) => Health::Down,
        (None, Some(t)) if !changed_since(t) => Health::Lost(Lost::NotBack),
        (None, _) => Health::Down,
    }
}

fn secs(s: u64) -> i64 {
    i64::try_from(s).unwrap_or(i64::MAX / 1000)
}

/// Plans one run. `fresh_suffixes` are random name suffixes drawn by the caller; the planner
/// uses them in order, skipping any that would collide with an existing instance or Node.
pub fn plan(
    spec: &ClusterSpec,
    observed: &Observed,
    now: DateTime<Utc>,
    fresh_suffixes: &[String],
) -> Plan {
    let members = classify(spec, observed, now);
    let mut p = Plan::default();
    // A name is taken while its instance or its Node exists: a deleted Node waits (Terminating)
    // for k3s's finalizers, and k3s refuses a new VM registering under the name of an existing
    // Node (its node password differs: 403 from `pkg/nodepassword`).
    let taken: BTreeSet<&str> = observed
        .instances
        .iter()
        .map(|i| i.name.as_str())
        .chain(observed.nodes.iter().map(|n| n.name.as_str()))
        .collect();
    let mut suffixes = fresh_suffixes.iter();
    let mut new_name = |pool: &str| -> Option<String> {
        suffixes
            .by_ref()
            .map(|s| names::instance_name(&spec.cluster, pool, s))
            .find(|n| !taken.contains(n.as_str()))
    };

    // The API floating IP first: joiners need its address.
    let fip_name = names::api_floating_ip_name(&spec.cluster);
    let fip_ready = plan_floating_ip(spec, observed, &members, &fip_name, &mut p);
    let etcd_hold = check_etcd(spec, observed, &members).err();

    for (role, pool) in spec.pools() {
        let pool_members: Vec<&Member> = members.iter().filter(|m| m.pool == pool.name).collect();
        let base = Duration::seconds(secs(spec.timeouts.create_retry_seconds));
        let hash = spec.pool_hash(role, pool);
        let carried = observed
            .create_backoff
            .get(&pool.name)
            .filter(|b| b.spec_hash == hash);
        let failed_roll = install_block(&pool_members, carried, &hash, now);
        let blocked = failed_roll.as_ref().or(carried);
        let mut gate = CreateGate {
            limit: blocked.map(|b| usize::from(now >= b.next_probe(base))),
            made: 0,
            wanted: 0,
        };
        plan_pool(
            spec,
            observed,
            role,
            pool,
            &pool_members,
            fip_ready,
            etcd_hold.as_ref(),
            &mut gate,
            &mut new_name,
            now,
            &mut p,
        );
        carry_block(&pool.name, &pool_members, blocked, &gate, base, &mut p);
    }

    // Members of pools the spec no longer has: remove them, except anything that looks like a
    // control-plane server (renaming the control-plane pool must not tear the cluster down).
    let known: BTreeSet<&str> = spec.pools().map(|(_, p)| p.name.as_str()).collect();
    for m in members.iter().filter(|m| !known.contains(m.pool.as_str())) {
        let is_server = m
            .node
            .is_some_and(|n| n.labels.contains_key(CONTROL_PLANE_LABEL));
        if is_server {
            p.findings.push(Finding {
                degraded: true,
                message: format!(
                    "{} is a control-plane server in pool {:?}, which the spec does not have; leaving it alone (fix control_plane.name)",
                    m.name(),
                    m.pool
                ),
            });
        } else {
            p.actions.push(remove(
                m,
                true,
                format!("pool {:?} is no longer in the spec", m.pool),
            ));
        }
    }

    plan_orphans(spec, observed, &mut p);
    certs::plan(spec, observed, &members, etcd_hold.is_some(), now, &mut p);
    p
}

/// Keeps a pool's block for the next run (with its finding) while the pool still wants
/// creates, or, for a roll blocked by a failed new member, until a member of the new spec is
/// Ready, whether or not this run wanted a create.
fn carry_block(
    pool: &str,
    members: &[&Member],
    blocked: Option<&backoff::CreateBackoff>,
    gate: &CreateGate,
    base: Duration,
    p: &mut Plan,
) {
    let roll_blocked = |b: &backoff::CreateBackoff| {
        b.cause == backoff::BlockCause::SetupFailed
            && !members
                .iter()
                .any(|m| !m.drifted && m.health == Health::Ready)
    };
    let Some(b) = blocked.filter(|b| gate.wanted > 0 || roll_blocked(b)) else {
        return;
    };
    p.create_backoff.insert(pool.to_owned(), b.clone());
    let next = if gate.made > 0 {
        "trying one create this run".to_owned()
    } else {
        format!(
            "next try after {}",
            b.next_probe(base).format("%Y-%m-%dT%H:%M:%SZ")
        )
    };
    p.findings.push(Finding {
        degraded: true,
        message: format!("{}; {next}", b.describe(pool)),
    });
}

/// The setup steps whose failure means the version does not install ([`install_block`]):
/// install.sh or the image's k3s. Any other failed step (a missing data disk, say) is the
/// member's own trouble: it is replaced, and the roll goes on.
const INSTALL_STEPS: [&str; 2] = ["k3s-install", "k3s-version"];

/// The block of a pool whose roll met a new member whose k3s did not install (issue 33
/// item 3): a member of the current spec with [`Health::SetupFailed`] at one of
/// [`INSTALL_STEPS`] while members of the old spec still serve. Each failed member is counted
/// once (the carried block names the last one); the probe delay counts from when it was seen.
fn install_block(
    members: &[&Member],
    carried: Option<&backoff::CreateBackoff>,
    hash: &str,
    now: DateTime<Utc>,
) -> Option<backoff::CreateBackoff> {
    let rolling = members.iter().any(|m| m.drifted && m.health.counts());
    let failed = members
        .iter()
        .filter(|m| !m.drifted && m.health == Health::SetupFailed)
        .filter(|m| {
            m.setup_failure
                .is_some_and(|f| INSTALL_STEPS.contains(&f.step.as_str()))
        })
        .max_by_key(|m| m.instance.time_created)
        .filter(|_| rolling)?;
    let prev = carried.filter(|b| b.cause == backoff::BlockCause::SetupFailed);
    if prev.is_some_and(|b| b.member.as_deref() == Some(failed.name())) {
        return None;
    }
    Some(backoff::CreateBackoff {
        cause: backoff::BlockCause::SetupFailed,
        message: setup_failed_why(failed),
        since: prev.map_or(now, |p| p.since),
        last_attempt: now,
        failures: prev.map_or(0, |p| p.failures).saturating_add(1),
        spec_hash: hash.to_owned(),
        member: Some(failed.name().to_owned()),
    })
}

/// Returns whether the floating IP exists (so joiners can be configured with its address).
fn plan_floating_ip(
    spec: &ClusterSpec,
    observed: &Observed,
    members: &[Member],
    fip_name: &str,
    p: &mut Plan,
) -> bool {
    let Some(fip) = &observed.api_floating_ip else {
        p.actions.push(Action::CreateApiFloatingIp {
            name: fip_name.to_owned(),
            description: names::api_floating_ip_description(&spec.cluster),
            reason: "the API floating IP is missing; new members need its address to join".into(),
        });
        return false;
    };
    let cp: Vec<&Member> = members
        .iter()
        .filter(|m| m.pool == spec.control_plane.name)
        .collect();
    let holder = fip
        .instance_id
        .and_then(|id| members.iter().find(|m| m.instance.id == id));
    // A drifted holder is rolled, and a removal stops the VM while it still holds the address:
    // the address leaves it for an up-to-date Ready server as soon as there is one.
    let current_ready = cp.iter().any(|m| m.health == Health::Ready && !m.drifted);
    if holder.is_some_and(|h| {
        h.pool == spec.control_plane.name
            && h.health == Health::Ready
            && !(h.drifted && current_ready)
    }) {
        return true;
    }
    // Oldest up-to-date Ready server: the most likely to stay.
    let target = cp
        .iter()
        .filter(|m| m.health == Health::Ready)
        .min_by_key(|m| (m.drifted, m.instance.time_created, m.instance.name.clone()));
    match target {
        Some(t) => {
            let stop_from = holder.is_some_and(|h| h.instance.state == InstanceState::Failed);
            let (from, why) = match (fip.instance_id, holder) {
                (None, _) => (None, "it is not attached".to_owned()),
                (Some(_), Some(h)) if h.health == Health::Ready => (
                    Some(h.instance.name.clone()),
                    format!(
                        "its holder {} is drifted and will be rolled",
                        h.instance.name
                    ),
                ),
                (Some(_), Some(h)) => (
                    Some(h.instance.name.clone()),
                    format!("its holder {} is {:?}", h.instance.name, h.health),
                ),
                (Some(id), None) => (
                    Some(id.to_string()),
                    "it is attached to an instance that is not a member".to_owned(),
                ),
            };
            p.actions.push(Action::AttachApiFloatingIp {
                fip: fip.name.clone(),
                to: t.instance.name.clone(),
                from,
                stop_from,
                reason: format!(
                    "the API floating IP must sit on a Ready control-plane member; {why}"
                ),
            });
        }
        None => p.findings.push(Finding {
            degraded: true,
            message: "no Ready control-plane member to hold the API floating IP".into(),
        }),
    }
    true
}

fn remove(m: &Member, drain: bool, reason: String) -> Action {
    Action::RemoveMember {
        pool: m.pool.clone(),
        name: m.instance.name.clone(),
        node: m.node.map(|n| n.name.clone()),
        // Draining a dead Node only leaves pods stuck terminating.
        drain: drain && m.node.is_some_and(Node::is_ready),
        reason,
    }
}

/// Scale-down victim order: `delete-me` > never started > never joined > NotReady > drifted >
/// newest; the
/// floating-IP holder last among equals (moving the API address costs a blip).
fn victim_rank(
    m: &Member,
    fip_holder: Option<uuid::Uuid>,
) -> (u8, bool, std::cmp::Reverse<DateTime<Utc>>) {
    let rank = if m.node.is_some_and(Node::marked_for_deletion) || m.autoscale_victim {
        0
    } else if m.health == Health::NotStarted {
        1
    } else if m.node.is_none() {
        2
    } else if m.health != Health::Ready {
        3
    } else if m.drifted {
        4
    } else {
        5
    };
    (
        rank,
        Some(m.instance.id) == fip_holder,
        std::cmp::Reverse(m.instance.time_created),
    )
}

/// How many members a pool may create this run: all it needs, or (while the rack keeps
/// refusing its creates) one probe or none.
struct CreateGate {
    limit: Option<usize>,
    made: usize,
    /// Creates the pool asked for, held back or not.
    wanted: usize,
}

#[allow(clippy::too_many_arguments)]
fn plan_pool(
    spec: &ClusterSpec,
    observed: &Observed,
    role: Role,
    pool: &PoolSpec,
    members: &[&Member],
    fip_ready: bool,
    etcd_hold: Option<&Finding>,
    gate: &mut CreateGate,
    new_name: &mut impl FnMut(&str) -> Option<String>,
    now: DateTime<Utc>,
    p: &mut Plan,
) {
    let fip_holder = observed
        .api_floating_ip
        .as_ref()
        .and_then(|f| f.instance_id);
    let count = |f: &dyn Fn(&Member) -> bool| members.iter().filter(|m| f(m)).count();
    let t = Tally {
        desired: pool.count as usize,
        ready: count(&|m| m.health == Health::Ready),
        joining: count(&|m| m.health == Health::Joining),
        capacity: count(&|m| m.health.counts()),
        rolls: Windows::new(&spec.maintenance).allows(now),
    };
    p.pools.push(pool_counts(pool, members));
    let is_cp = role == Role::ControlPlane;
    let can_create = image_found(spec, observed, pool, p) && fip_ready;
    let mut create = |p: &mut Plan, reason: String| {
        gate.wanted += 1;
        if !can_create || gate.limit.is_some_and(|l| gate.made >= l) {
            return;
        }
        let reason = if gate.limit.is_some() {
            format!("{reason}; one probe: the rack refused this pool's last creates")
        } else {
            reason
        };
        if let Some(name) = new_name(&pool.name) {
            gate.made += 1;
            p.actions.push(Action::CreateMember {
                pool: pool.name.clone(),
                role,
                name,
                reason,
            });
        }
    };

    finish_removals(observed, pool, members, p);
    start_stopped(spec, pool, members, now, p);
    // Removals under way finish (a half-done one leaves a stopped voter) and servers that
    // went down start again (their members are listed): neither changes the membership.
    // Everything else that would is held while etcd and the servers disagree.
    if is_cp && let Some(hold) = etcd_hold {
        p.findings.push(hold.clone());
        return;
    }
    // Members the rack never started: start each once (no new create for them, no delete
    // and re-create either: on a full rack that only churns). Surplus ones are removed instead,
    // below (they rank first as never joined).
    let surplus = t.capacity.saturating_sub(t.desired);
    start_not_started(
        pool,
        members,
        fip_holder,
        if is_cp { 0 } else { surplus },
        p,
    );

    if is_cp {
        plan_control_plane(pool, members, t, observed, fip_holder, p, &mut create);
    } else {
        plan_workers(spec, pool, members, t, fip_holder, p, &mut create);
    }
}

/// A pool's desired size and its members counted by health: what its plan decides from.
#[derive(Clone, Copy)]
struct Tally {
    desired: usize,
    ready: usize,
    joining: usize,
    /// Members that count towards the pool's size.
    capacity: usize,
    /// Whether a roll of drifted members may start a new replacement now (the maintenance
    /// windows: [`crate::domain::maintenance`]).
    rolls: Gate,
}

/// A pool whose members drifted and whose roll waits for a maintenance window: a finding
/// instead of the surge member. A replacement already under way is not held (its old member
/// goes once the new one is Ready); broken members are replaced whatever the windows say.
fn roll_waits(pool: &PoolSpec, t: Tally, p: &mut Plan) -> bool {
    if t.rolls.is_allowed() {
        return false;
    }
    p.findings.push(Finding {
        degraded: false,
        message: format!(
            "pool {:?}: its spec changed; the roll waits for {}",
            pool.name,
            t.rolls.describe_wait()
        ),
    });
    true
}

/// The pool's line in the plan's counts.
fn pool_counts(pool: &PoolSpec, members: &[&Member]) -> PoolCounts {
    let count = |f: &dyn Fn(&Member) -> bool| members.iter().filter(|m| f(m)).count() as u32;
    PoolCounts {
        pool: pool.name.clone(),
        desired: pool.count,
        ready: count(&|m| m.health == Health::Ready),
        joining: count(&|m| m.health == Health::Joining),
        not_ready: count(&|m| m.health == Health::NotReady),
        broken: count(&|m| {
            m.health.is_broken() || matches!(m.health, Health::NotStarted | Health::Down)
        }),
        removing: count(&|m| m.health == Health::Removing),
        drifted: count(&|m| m.drifted && m.health.counts()),
    }
}

/// Whether the pool's image is there (or was not looked up); a finding when it is missing.
/// Images are looked up only when a plan creates members: absent means "not looked up".
fn image_found(spec: &ClusterSpec, observed: &Observed, pool: &PoolSpec, p: &mut Plan) -> bool {
    match observed.images.get(&pool.image) {
        Some(Some(_)) | None => true,
        Some(None) => {
            p.findings.push(Finding {
                degraded: true,
                message: format!(
                    "image {:?} of pool {:?} is not in project {:?} or the silo; no new members until it exists",
                    pool.image, pool.name, spec.project
                ),
            });
            false
        }
    }
}

/// Removals already under way carry on, whatever else happens; one the autoscaler gave up
/// on is called off while its VM still runs.
fn finish_removals(observed: &Observed, pool: &PoolSpec, members: &[&Member], p: &mut Plan) {
    for m in members.iter().filter(|m| m.health == Health::Removing) {
        if let Some(node) = m.node.filter(|_| {
            observed.autoscale_given_up.contains(&m.instance.name)
                && m.instance.state == InstanceState::Running
        }) {
            p.actions.push(Action::CancelRemoval {
                pool: pool.name.clone(),
                name: m.instance.name.clone(),
                node: node.name.clone(),
                reason: "the autoscaler's removal did not finish in time (a pod could not be \
                         evicted); uncordoning and keeping it"
                    .into(),
            });
            continue;
        }
        p.actions.push(remove(
            m,
            true,
            "finishing a removal started earlier".into(),
        ));
    }
}

/// Members stopped outside oxide-controller are started again, and so are servers that went
/// down (failed or stopped) with their disks intact: once per outage, recorded on the Node.
fn start_stopped(
    spec: &ClusterSpec,
    pool: &PoolSpec,
    members: &[&Member],
    now: DateTime<Utc>,
    p: &mut Plan,
) {
    for m in members.iter() {
        let (mark_node, reason) = match m.health {
            Health::StoppedUnexpectedly => (
                None,
                "it was stopped outside oxide-controller while still a member".to_owned(),
            ),
            Health::Down => {
                let join = Duration::seconds(secs(spec.timeouts.join_seconds));
                let first = restarted_within(m.node, now, join).is_none();
                let state = format!("{:?}", m.instance.state).to_lowercase();
                let why = format!(
                    "server is {state} with its Node and boot disk intact; starting it again (once) instead of replacing it: it is replaced if it is not a Ready Node within {}s",
                    spec.timeouts.join_seconds
                );
                if first {
                    (m.node.map(|n| n.name.clone()), why)
                } else {
                    (None, format!("{why} (the last start has not taken yet)"))
                }
            }
            _ => continue,
        };
        p.actions.push(Action::StartMember {
            pool: pool.name.clone(),
            name: m.instance.name.clone(),
            mark_node,
            reason,
        });
    }
}

/// Members the rack never started are started again, but for the first `removed_first` of
/// them in victim order (those are removed instead).
fn start_not_started(
    pool: &PoolSpec,
    members: &[&Member],
    fip_holder: Option<uuid::Uuid>,
    removed_first: usize,
    p: &mut Plan,
) {
    let mut not_started: Vec<&&Member> = members
        .iter()
        .filter(|m| m.health == Health::NotStarted)
        .collect();
    not_started.sort_by_key(|m| victim_rank(m, fip_holder));
    for m in not_started.into_iter().skip(removed_first) {
        p.actions.push(Action::StartMember {
            pool: pool.name.clone(),
            name: m.instance.name.clone(),
            mark_node: None,
            reason: "the rack left it stopped after create (no capacity or quota, or an earlier removal was cut short); starting it again".into(),
        });
    }
}

/// Workers. Broken members go now (they serve nothing); replacements come from the
/// shortfall below, created before the removals are carried out.
fn plan_workers(
    spec: &ClusterSpec,
    pool: &PoolSpec,
    members: &[&Member],
    t: Tally,
    fip_holder: Option<uuid::Uuid>,
    p: &mut Plan,
    create: &mut impl FnMut(&mut Plan, String),
) {
    let Tally {
        desired,
        ready,
        capacity,
        ..
    } = t;
    for m in members.iter().filter(|m| m.health.is_broken()) {
        p.actions.push(remove(m, false, broken_reason(m, spec)));
    }
    let budget = (desired + 1).saturating_sub(members.len());
    let drifted_live = members.iter().any(|m| m.drifted && m.health.counts());
    let surge_joining = members
        .iter()
        .any(|m| !m.drifted && matches!(m.health, Health::Joining | Health::NotReady));
    if capacity < desired {
        for _ in 0..(desired - capacity).min(budget) {
            create(
                p,
                format!("pool {:?} has {capacity} of {desired} members", pool.name),
            );
        }
    } else if capacity > desired {
        if drifted_live && surge_joining {
            p.findings.push(Finding {
                degraded: false,
                message: format!(
                    "pool {:?}: waiting for the new member to join before removing a drifted one",
                    pool.name
                ),
            });
            return;
        }
        shrink_workers(pool, members, t, fip_holder, p);
    } else if drifted_live
        && ready == desired
        && budget > 0
        && members.iter().all(|m| m.health == Health::Ready)
        && !roll_waits(pool, t, p)
    {
        create(
            p,
            format!(
                "rolling pool {:?}: its spec changed; surge member first",
                pool.name
            ),
        );
    }
}

/// A worker pool above its size: its surplus members go, in victim order.
fn shrink_workers(
    pool: &PoolSpec,
    members: &[&Member],
    t: Tally,
    fip_holder: Option<uuid::Uuid>,
    p: &mut Plan,
) {
    let Tally {
        desired, capacity, ..
    } = t;
    let mut victims: Vec<&&Member> = members.iter().filter(|m| m.health.counts()).collect();
    victims.sort_by_key(|m| victim_rank(m, fip_holder));
    for m in victims.into_iter().take(capacity - desired) {
        let why = if m.drifted
            && m.node.is_some_and(|n| !n.marked_for_deletion())
            && m.health == Health::Ready
        {
            format!(
                "rolling pool {:?}: its spec changed and the replacement is Ready",
                pool.name
            )
        } else {
            format!(
                "pool {:?} has {capacity} of {desired} members; {}",
                pool.name,
                victim_why(m)
            )
        };
        p.actions.push(remove(m, true, why));
    }
}

fn plan_control_plane(
    pool: &PoolSpec,
    members: &[&Member],
    t: Tally,
    observed: &Observed,
    fip_holder: Option<uuid::Uuid>,
    p: &mut Plan,
    create: &mut impl FnMut(&mut Plan, String),
) {
    let etcd_voters = match &observed.etcd {
        EtcdMembership::Read(list) => list.iter().filter(|m| !m.is_learner).count(),
        _ => 0,
    };
    let Tally {
        desired,
        ready,
        joining,
        capacity,
        ..
    } = t;
    // Voting etcd members: servers that joined and are not yet removed, or the voters etcd
    // lists when it lists more (a member whose removal is under way still votes).
    let voting = members
        .iter()
        .filter(|m| m.node.is_some() && m.health != Health::Removing)
        .count()
        .max(etcd_voters);
    if voting > 0 && ready < quorum(voting) {
        p.findings.push(Finding {
            degraded: true,
            message: format!(
                "etcd quorum lost: {ready} of {voting} control-plane members Ready (need {}); not touching the control plane — restore members by hand",
                quorum(voting)
            ),
        });
        return;
    }
    // One control-plane change at a time (a member the rack has not started counts as one).
    if members
        .iter()
        .any(|m| matches!(m.health, Health::Removing | Health::NotStarted))
        || joining > 0
    {
        if joining > 0 {
            p.findings.push(Finding {
                degraded: false,
                message: "control plane: waiting for the joining member before the next change"
                    .into(),
            });
        }
        return;
    }
    // Dead members first: remove, then replace in a later run. Removing a dead member never
    // lowers the Ready count; adding one while another is dead raises the quorum needed.
    if let Some(m) = members
        .iter()
        .filter(|m| m.health.is_broken())
        .min_by_key(|m| m.instance.time_created)
    {
        if ready >= quorum(voting.saturating_sub(1).max(1)) {
            let why = match m.health {
                Health::SetupFailed => setup_failed_why(m),
                Health::Lost(lost) => format!("control-plane member {}", lost_why(m, lost)),
                _ => format!("control-plane member is {:?}", m.health),
            };
            p.actions.push(remove(
                m,
                false,
                format!("{why}; removing it before adding a replacement keeps etcd quorum"),
            ));
        }
        return;
    }
    if capacity < desired {
        create(
            p,
            format!("control plane has {capacity} of {desired} members; adding one at a time"),
        );
        return;
    }
    let all_ready = members
        .iter()
        .filter(|m| m.health.counts())
        .all(|m| m.health == Health::Ready);
    if capacity > desired {
        if all_ready {
            shrink_control_plane(members, t, voting, fip_holder, p);
        }
        return;
    }
    if members.iter().any(|m| m.drifted && m.health.counts())
        && all_ready
        && !roll_waits(pool, t, p)
    {
        roll_control_plane(pool, observed, p, create);
    }
}

/// The next step of a roll of the control plane, every member Ready: a surge server, once a
/// backup taken after the roll was decided exists (issue 46 item 4; else the hold's finding).
fn roll_control_plane(
    pool: &PoolSpec,
    observed: &Observed,
    p: &mut Plan,
    create: &mut impl FnMut(&mut Plan, String),
) {
    if let Some(hold) = &observed.roll_hold {
        p.findings.push(hold.clone());
        return;
    }
    create(
        p,
        format!(
            "rolling pool {:?}: its spec changed; surge member first",
            pool.name
        ),
    );
}

/// The control-plane pool's spec hash when any of its members is drifted from it (the servers
/// are to be rolled to it), for the roll's decision ([`crate::domain::backup::roll::decide`]).
pub fn control_plane_rolling_to(
    spec: &ClusterSpec,
    observed: &Observed,
    now: DateTime<Utc>,
) -> Option<String> {
    let cp = &spec.control_plane;
    classify(spec, observed, now)
        .iter()
        .any(|m| m.pool == cp.name && m.drifted && m.health.counts())
        .then(|| spec.pool_hash(Role::ControlPlane, cp))
}

/// A control plane above its size, every member Ready: one member goes, when etcd keeps its
/// quorum without it.
fn shrink_control_plane(
    members: &[&Member],
    t: Tally,
    voting: usize,
    fip_holder: Option<uuid::Uuid>,
    p: &mut Plan,
) {
    let Tally {
        desired,
        ready,
        capacity,
        ..
    } = t;
    let mut victims: Vec<&&Member> = members.iter().filter(|m| m.health.counts()).collect();
    victims.sort_by_key(|m| victim_rank(m, fip_holder));
    if let Some(m) = victims.first()
        && ready.saturating_sub(1) >= quorum(voting.saturating_sub(1).max(1))
    {
        let why = if m.drifted {
            "rolling the control plane: its spec changed and the replacement is Ready".to_owned()
        } else {
            format!(
                "control plane has {capacity} of {desired} members; {}",
                victim_why(m)
            )
        };
        p.actions.push(remove(m, true, why));
    }
}

fn victim_why(m: &Member) -> String {
    match victim_rank(m, None).0 {
        0 if m.autoscale_victim => {
            "the autoscaler found its node unneeded (see status.json autoscale)".into()
        }
        0 => "it is annotated oxide-controller/delete-me".into(),
        1 => "the rack never started it".into(),
        2 => "it never joined".into(),
        3 => "it is not Ready".into(),
        4 => "its spec is out of date".into(),
        _ => "it is the newest".into(),
    }
}

/// What a member's console said about its failed node setup.
fn setup_failed_why(m: &Member) -> String {
    match m.setup_failure {
        Some(f) => format!("its console says: {f}"),
        None => "its node setup failed".into(),
    }
}

/// Why a server that went down is replaced, not started again.
fn lost_why(m: &Member, lost: Lost) -> String {
    let state = format!("{:?}", m.instance.state).to_lowercase();
    match lost {
        Lost::BootDisk => format!("is {state} and its boot disk is gone or faulted"),
        Lost::DownAgain => format!("is {state} again after it was started again"),
        Lost::NotBack => {
            "was started again and is not a Ready Node within the join deadline".to_owned()
        }
    }
}

fn broken_reason(m: &Member, spec: &ClusterSpec) -> String {
    match m.health {
        Health::Lost(lost) => format!("it {}; replacing it", lost_why(m, lost)),
        Health::SetupFailed => format!("{}; replacing it", setup_failed_why(m)),
        Health::Failed => "the instance failed; replacing it".into(),
        Health::JoinTimedOut => format!(
            "it did not become a Ready Node within {}s of creation; replacing it",
            spec.timeouts.join_seconds
        ),
        Health::NotReadyTooLong => format!(
            "its Node has been NotReady for over {}s; replacing it",
            spec.timeouts.not_ready_grace_seconds
        ),
        _ => "replacing it".into(),
    }
}

/// Whether etcd's member list and the cluster's servers agree, for every control-plane
/// change (the planner's, the upgrade pre-flight's): `Err` is the finding that holds them.
///
/// They disagree when a member's node name (k3s names members `<node-name>-<8 hex>`)
/// matches no server Node and no control-plane instance (a member k3s failed to remove), or
/// a server Node that is not being removed has no member; a learner (a member not yet
/// promoted to voter) holds changes too. A list that could not be read holds them as well:
/// the check cannot say the change is safe. Not read at all (planner tests that are not
/// about etcd) is no hold.
pub fn etcd_members_match(
    spec: &ClusterSpec,
    observed: &Observed,
    now: DateTime<Utc>,
) -> Result<(), Finding> {
    check_etcd(spec, observed, &classify(spec, observed, now))
}

fn check_etcd(spec: &ClusterSpec, observed: &Observed, members: &[Member]) -> Result<(), Finding> {
    const HELD: &str = "no control-plane change (create, removal, roll or replacement of a server) until they agree";
    let list = match &observed.etcd {
        EtcdMembership::NotRead => return Ok(()),
        EtcdMembership::Read(list) => list,
        EtcdMembership::Unreadable(why) => {
            return Err(Finding {
                degraded: true,
                message: format!(
                    "cannot read the etcd member list from a server's /db/info ({why}); no control-plane change (create, removal, roll or replacement of a server) until it can be read"
                ),
            });
        }
    };
    let cp: Vec<&Member> = members
        .iter()
        .filter(|m| m.pool == spec.control_plane.name)
        .collect();
    let server_nodes = || {
        observed
            .nodes
            .iter()
            .filter(|n| n.labels.contains_key(CONTROL_PLANE_LABEL))
    };
    let instances: BTreeSet<&str> = cp.iter().map(|m| m.name()).collect();
    // A server Node being deleted whose instance is gone is not a server any more: k3s's
    // member controller holds its finalizer until it removed the member, so a member still
    // listed beside such a Node is one k3s could not remove (its etcd annotations are
    // missing, or etcd refused). While the instance exists, the removal is under way.
    let deleting: BTreeMap<&str, DateTime<Utc>> = server_nodes()
        .filter(|n| !instances.contains(n.name.as_str()))
        .filter_map(|n| Some((n.name.as_str(), n.deleting_since?)))
        .collect();
    let known: BTreeSet<&str> = instances
        .iter()
        .copied()
        .chain(server_nodes().map(|n| n.name.as_str()))
        .filter(|n| !deleting.contains_key(n))
        .collect();
    let listed: BTreeSet<&str> = list.iter().filter_map(EtcdMember::node_name).collect();
    let mut wrong: Vec<String> = list
        .iter()
        .filter(|m| !(m.is_learner && m.name.is_empty()))
        .filter(|m| m.node_name().is_none_or(|n| !known.contains(n)))
        .map(|m| match m.node_name().and_then(|n| Some((n, deleting.get(n)?))) {
            Some((node, since)) => format!(
                "etcd member {} outlives its server: Node {node} has been deleting since {} and k3s has not removed the member (remove it on a server: etcdctl member remove {:x}; the Node then goes)",
                m.describe(),
                since.format("%Y-%m-%d %H:%M:%S UTC"),
                m.id
            ),
            None => format!(
                "etcd member {} matches no server Node or instance (remove it on a server: etcdctl member remove {:x})",
                m.describe(),
                m.id
            ),
        })
        .collect();
    wrong.extend(
        cp.iter()
            .filter(|m| m.health != Health::Removing)
            .filter_map(|m| m.node)
            .filter(|n| !listed.contains(n.name.as_str()))
            .map(|n| format!("server {} has no etcd member", n.name)),
    );
    if !wrong.is_empty() {
        return Err(Finding {
            degraded: true,
            message: format!(
                "etcd members and servers disagree: {}; {HELD}",
                wrong.join("; ")
            ),
        });
    }
    let learners: Vec<String> = list
        .iter()
        .filter(|m| m.is_learner)
        .map(EtcdMember::describe)
        .collect();
    if learners.is_empty() {
        return Ok(());
    }
    Err(Finding {
        // A learner while a server joins is that join; one without is stuck.
        degraded: !cp.iter().any(|m| m.health == Health::Joining),
        message: format!(
            "etcd has a learner not yet promoted to voter: {}; no other control-plane change until it is a voter",
            learners.join(", ")
        ),
    })
}

fn plan_orphans(spec: &ClusterSpec, observed: &Observed, p: &mut Plan) {
    let instances: BTreeSet<&str> = observed.instances.iter().map(|i| i.name.as_str()).collect();
    let prefix = names::cluster_prefix(&spec.cluster);
    let pool_names: BTreeSet<&str> = spec.pools().map(|(_, p)| p.name.as_str()).collect();
    let ours = |name: &str| looks_like_member_name(name, &prefix);
    for n in &observed.nodes {
        if instances.contains(n.name.as_str()) {
            continue;
        }
        let labelled = n
            .labels
            .get(crate::domain::spec::POOL_LABEL)
            .is_some_and(|p| pool_names.contains(p.as_str()));
        if ours(&n.name) || labelled {
            p.actions.push(Action::DeleteNode {
                node: n.name.clone(),
                reason: "its instance no longer exists".into(),
            });
        }
    }
    for d in &observed.disks {
        let Some(owner) = names::disk_owner(&d.name) else {
            continue;
        };
        if !ours(owner) || instances.contains(owner) {
            continue;
        }
        if matches!(d.state, DiskState::Detached | DiskState::Faulted) {
            p.actions.push(Action::DeleteDisk {
                disk: d.name.clone(),
                reason: format!("its instance {owner} no longer exists"),
            });
        }
    }
}

/// `<cluster>-<something>-<5 x [a-z0-9]>`: the shape of our instance names.
fn looks_like_member_name(name: &str, cluster_prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(cluster_prefix) else {
        return false;
    };
    let Some((pool, suffix)) = rest.rsplit_once('-') else {
        return false;
    };
    !pool.is_empty()
        && suffix.len() == names::SUFFIX_LEN
        && suffix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

#[cfg(test)]
mod tests;
