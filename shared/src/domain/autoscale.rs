//! Autoscaling: what a pool's worker count should be, given the pods the cluster holds.
//!
//! Pure: the caller observes the pods and nodes and passes them in with the clock, this
//! module decides, and the decision (with a reason for every change) goes back to the
//! planner and into `status.json`. Nothing here talks to a rack or a cluster.
//!
//! The rules follow cluster-autoscaler (see `tests/FIDELITY.md`, "Autoscaling inputs"):
//! - scale up when pods are Pending with `PodScheduled=False`/`Unschedulable` and a new node
//!   of some pool could host them; the pods are packed first-fit decreasing onto
//!   hypothetical nodes of each pool that could host them and the pool with the least waste
//!   wins (cluster-autoscaler's `least-waste` expander: least idle cpu, then memory); a pod no pool can host is a finding
//!   and causes no scale-up;
//! - a node is unneeded when the larger of its cpu and memory request fractions stays below
//!   the pool's utilisation threshold (`--scale-down-utilization-threshold`, default 0.5)
//!   and every pod that would have to move fits on the other nodes; after it has been
//!   unneeded for the pool's delay (`--scale-down-unneeded-time`, default 10 minutes) it is
//!   removed, at most one per pool per run, never below min;
//! - a node is kept when it is annotated `cluster-autoscaler.kubernetes.io/scale-down-disabled:
//!   "true"` or holds a pod annotated `cluster-autoscaler.kubernetes.io/safe-to-evict:
//!   "false"`, a pod whose PersistentVolume is pinned to it (k3s's default `local-path`), a pod
//!   with local storage (hostPath, emptyDir), a pod with no controller, a `kube-system` pod
//!   without a PodDisruptionBudget (the last three unless the pod is annotated `safe-to-evict:
//!   "true"`), or a pod whose budget allows fewer disruptions than the node would cause;
//! - removals are simulated one after another, across pools: a node whose pods would land on a
//!   node removed earlier in the same run waits (FAQ "one non-empty node at a time");
//! - no scale-down for `scale_down_delay_after_add_seconds` after a scale-up, nor for three
//!   minutes after a removal was given up; a removal the autoscaler started that has not
//!   finished after `removal_timeout_seconds` is given up (the node uncordoned, the annotation
//!   dropped) and that node is left alone for five minutes;
//! - left out of every judgement: DaemonSet and mirror pods on scale-up (a new node gets its
//!   own), pods waiting for preemption (`nominatedNodeName`), expendable pods (priority below
//!   -10), and oxide-controller's own reconcile pods (gone within minutes).
//!
//! Time-based bounds: a pool's `schedules` are cron windows (Kubernetes' cron dialect, see
//! [`crate::base::kcron`]) with a duration; while one is active its min/max replace the pool's.
//!
//! What does not live here: observing pods (the `Cluster` adapter), draining and deleting
//! the chosen node (the planner's existing removal path), status and events (the workflow).

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::base::kcron::Schedule;

pub mod observe;
use crate::domain::spec::{Taint, TaintEffect};

/// Pod annotation: `"false"` keeps the pod's node, `"true"` lets a bare or kube-system pod
/// move. Same name and meaning as cluster-autoscaler's.
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// Node annotation: `"true"` keeps the node. Same name and meaning as cluster-autoscaler's.
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// Kubelet's `maxPods` default; k3s does not change it.
pub const DEFAULT_MAX_PODS: u32 = 110;
/// Kubelet's default hard eviction threshold `memory.available<100Mi`, which is what node
/// allocatable memory is short of capacity when no kube/system reservation is set (k3s sets
/// none).
pub const EVICTION_HARD_MEMORY: u64 = 100 * 1024 * 1024;
/// How a kept node's reason ends when only a PodDisruptionBudget could free it.
pub const NO_PDB: &str = "is in kube-system without a PodDisruptionBudget";
/// Pod annotation naming local volumes whose loss is fine (comma-separated), as
/// cluster-autoscaler's.
pub const SAFE_TO_EVICT_LOCAL_VOLUMES: &str =
    "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";
/// Pods with a priority below this are expendable: they cause no scale-up and keep no node
/// (`--expendable-pods-priority-cutoff`, default -10).
pub const EXPENDABLE_PRIORITY_CUTOFF: i32 = -10;
/// A node whose removal was given up is not considered again for this long
/// (`--unremovable-node-recheck-timeout`, 5 minutes).
const UNREMOVABLE_RECHECK_SECONDS: i64 = 300;
/// No scale-down in a pool for this long after one of its removals was given up
/// (`--scale-down-delay-after-failure`, 3 minutes).
const DELAY_AFTER_FAILURE_SECONDS: i64 = 180;
/// At most this many unhostable pods and kept nodes are named in `status.json`; the rest are
/// counted (by owner), so status stays far below the ConfigMap's 1 MiB whatever the cluster
/// holds.
pub const MAX_LISTED: usize = 100;
/// Owners counted for the pods past [`MAX_LISTED`].
const MAX_OWNERS: usize = 200;

pub use crate::domain::spec::autoscale::{AutoscaleSpec, AutoscaleSpecError, ScheduleWindow};

/// Bounds in force at `now`, and the window that set them (None: the pool's own).
pub fn effective_bounds(
    pool_min: u32,
    pool_max: u32,
    spec: &AutoscaleSpec,
    now: DateTime<Utc>,
) -> (u32, u32, Option<String>) {
    for w in &spec.schedules {
        let (Ok(s), Ok(zone)) = (
            Schedule::parse(&w.start),
            crate::base::kcron::load_location(&w.time_zone),
        ) else {
            continue;
        };
        let s = s.in_zone(zone);
        let len = Duration::minutes(i64::from(w.duration_minutes));
        // Active when the window opened at some t with now - len < t <= now.
        let opened = s.next_after(now - len).is_some_and(|t| t <= now);
        if opened {
            return (
                w.min.unwrap_or(pool_min),
                w.max.unwrap_or(pool_max),
                Some(w.name.clone()),
            );
        }
    }
    (pool_min, pool_max, None)
}

/// Cpu (millicores) and memory (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: u64,
    pub memory: u64,
}

impl Resources {
    fn fits_in(&self, free: &Resources) -> bool {
        self.cpu_milli <= free.cpu_milli && self.memory <= free.memory
    }
    fn sub(&mut self, r: &Resources) {
        self.cpu_milli = self.cpu_milli.saturating_sub(r.cpu_milli);
        self.memory = self.memory.saturating_sub(r.memory);
    }
    fn add(&mut self, r: &Resources) {
        self.cpu_milli += r.cpu_milli;
        self.memory += r.memory;
    }
}

/// A toleration as in a pod spec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Toleration {
    /// None with `exists`: tolerates every taint.
    pub key: Option<String>,
    pub exists: bool,
    pub value: String,
    /// None: every effect.
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    fn tolerates(&self, t: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != t.effect) {
            return false;
        }
        match &self.key {
            None => self.exists,
            Some(k) => k == &t.key && (self.exists || self.value == t.value),
        }
    }
}

/// One requirement of a required node affinity term: a `matchExpressions` entry on a label,
/// or (`field`) a `matchFields` entry, which selects on `metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelRequirement {
    pub key: String,
    pub op: LabelOp,
    pub values: Vec<String>,
    pub field: bool,
}

/// The hostname label a node of a pool has before it exists: no name a pod or volume can
/// name, so `In` never matches it, `NotIn` and `Exists` do.
const NEW_NODE: &str = "<new node>";

/// Required node selector terms: ORed, requirements within a term ANDed, an empty term
/// matches nothing (component-helpers `nodeaffinity`).
fn terms_match(
    terms: &[Vec<LabelRequirement>],
    labels: &BTreeMap<String, String>,
    name: &str,
) -> bool {
    terms
        .iter()
        .any(|term| !term.is_empty() && term.iter().all(|r| r.matches(labels, name)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabelOp {
    #[default]
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

impl LabelRequirement {
    fn matches(&self, labels: &BTreeMap<String, String>, name: &str) -> bool {
        if self.field {
            // matchFields: only metadata.name, only In/NotIn (anything else matches nothing).
            let has = self.key == "metadata.name" && self.values.iter().any(|v| v == name);
            return match self.op {
                LabelOp::In => has,
                LabelOp::NotIn => self.key == "metadata.name" && !has,
                _ => false,
            };
        }
        let v = labels.get(&self.key);
        let num = |s: &String| s.parse::<i64>().ok();
        match self.op {
            LabelOp::In => v.is_some_and(|v| self.values.contains(v)),
            LabelOp::NotIn => !v.is_some_and(|v| self.values.contains(v)),
            LabelOp::Exists => v.is_some(),
            LabelOp::DoesNotExist => v.is_none(),
            LabelOp::Gt | LabelOp::Lt => {
                let (Some(have), Some(want)) = (v.and_then(num), self.values.first().and_then(num))
                else {
                    return false;
                };
                if self.op == LabelOp::Gt {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

/// A PodDisruptionBudget selecting a pod: `namespace/name` and `status.disruptionsAllowed`
/// (0 while the disruption controller has not computed it: the Eviction API refuses then too).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budget {
    pub key: String,
    pub allowed: u32,
}

/// A bound PersistentVolume a pod mounts that may only be used on some nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PinnedVolume {
    pub pv: String,
    /// Its required node selector terms (`spec.nodeAffinity.required`).
    pub terms: Vec<Vec<LabelRequirement>>,
}

/// A pod as the autoscaler needs it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    /// What the scheduler counts (`PodRequests`): containers and sidecars (init containers
    /// with `restartPolicy: Always`) summed, the larger of that and any init container's (with
    /// the sidecars started before it), plus the pod overhead.
    pub requests: Resources,
    /// Where it runs; None while Pending.
    pub node: Option<String>,
    /// Pending with `PodScheduled=False` reason `Unschedulable`.
    pub unschedulable: bool,
    /// Kind of the controlling owner reference (`ReplicaSet`, `DaemonSet`, ...), if any.
    pub controller_kind: Option<String>,
    /// `namespace/Kind/name` of the controlling owner, if any.
    pub owner: Option<String>,
    pub annotations: BTreeMap<String, String>,
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity: terms are ORed, requirements within a term ANDed. Empty: none.
    pub affinity_terms: Vec<Vec<LabelRequirement>>,
    pub tolerations: Vec<Toleration>,
    /// The budgets selecting it (only known when the caller listed them).
    pub budgets: Vec<Budget>,
    /// `spec.priority`.
    pub priority: Option<i32>,
    /// `status.nominatedNodeName` is set: it waits for a preemption to make room.
    pub nominated: bool,
    /// `protocol/port` of every container port with a `hostPort`.
    pub host_ports: Vec<String>,
    /// hostPath and (non-memory) emptyDir volumes not named in
    /// `safe-to-evict-local-volumes`: data that a removal of its node loses.
    pub local_volumes: Vec<String>,
    /// Bound PersistentVolumes with a node affinity.
    pub pinned: Vec<PinnedVolume>,
    /// The scheduler refused it for a reason no new node changes (its words).
    pub refusal: Option<String>,
    /// One of oxide-controller's own reconcile pods: it exits within minutes, so it neither
    /// keeps nor fills a node.
    pub ours: bool,
}

impl PodView {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
    fn is_daemon(&self) -> bool {
        self.controller_kind.as_deref() == Some("DaemonSet")
            || self.annotations.contains_key("kubernetes.io/config.mirror")
    }
    /// Below the expendable cutoff.
    fn expendable(&self) -> bool {
        self.priority
            .is_some_and(|p| p < EXPENDABLE_PRIORITY_CUTOFF)
    }
    /// Left out when judging a node: it will be gone soon, or may be killed.
    fn ignored_on_node(&self) -> bool {
        self.ours || self.expendable()
    }
    /// Why this pod keeps its node from being removed, if it does (budgets aside).
    fn blocks_removal(&self) -> Option<String> {
        let safe = self.annotations.get(SAFE_TO_EVICT).map(String::as_str);
        if safe == Some("false") {
            return Some(format!(
                "pod {} is annotated {SAFE_TO_EVICT}=false",
                self.key()
            ));
        }
        // A volume only this node can mount: evicting the pod strands it (and deleting the VM
        // deletes the data). No annotation lifts this: the pod could not run elsewhere.
        if let Some(v) = self.pinned.iter().find(|v| {
            v.terms
                .iter()
                .flatten()
                .any(|r| r.key == HOSTNAME || (r.field && r.key == "metadata.name"))
        }) {
            return Some(format!(
                "pod {} keeps its data on this node (PersistentVolume {} is pinned to it)",
                self.key(),
                v.pv
            ));
        }
        if safe == Some("true") || self.is_daemon() {
            return None;
        }
        if self.controller_kind.is_none() {
            return Some(format!("pod {} has no controller", self.key()));
        }
        if let Some(v) = self.local_volumes.first() {
            return Some(format!(
                "pod {} has local storage (volume {v}; {SAFE_TO_EVICT_LOCAL_VOLUMES} lifts this)",
                self.key()
            ));
        }
        if self.namespace == "kube-system" && self.budgets.is_empty() {
            return Some(format!("pod {} {NO_PDB}", self.key()));
        }
        None
    }
    /// Why it cannot run on a node with these properties (resources and host ports aside).
    fn misfit(
        &self,
        labels: &BTreeMap<String, String>,
        name: &str,
        taints: &[Taint],
    ) -> Option<String> {
        if let Some((k, v)) = self
            .node_selector
            .iter()
            .find(|(k, v)| labels.get(*k) != Some(*v))
        {
            return Some(format!("nodeSelector {k}={v} does not match"));
        }
        if !self.affinity_terms.is_empty() && !terms_match(&self.affinity_terms, labels, name) {
            return Some("required node affinity does not match".into());
        }
        if let Some(v) = self
            .pinned
            .iter()
            .find(|v| !v.terms.is_empty() && !terms_match(&v.terms, labels, name))
        {
            return Some(format!(
                "its PersistentVolume {} is pinned elsewhere (volume node affinity conflict)",
                v.pv
            ));
        }
        if let Some(t) = taints.iter().find(|t| {
            t.effect != TaintEffect::PreferNoSchedule
                && !self.tolerations.iter().any(|tol| tol.tolerates(t))
        }) {
            return Some(format!("taint {t} is not tolerated"));
        }
        None
    }
}

/// The well-known hostname label.
const HOSTNAME: &str = "kubernetes.io/hostname";

/// A node as the autoscaler needs it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeView {
    pub name: String,
    /// The worker pool it belongs to; None for control plane nodes.
    pub pool: Option<String>,
    pub allocatable: Resources,
    pub max_pods: u32,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub annotations: BTreeMap<String, String>,
    /// Cordoned (spec.unschedulable), e.g. already being drained.
    pub cordoned: bool,
    /// Registered but not Ready yet: still upcoming for the pods it was made for.
    pub not_ready: bool,
    /// Carries oxide-controller's removal annotation: a removal is under way.
    pub removing: bool,
}

/// A worker pool as the autoscaler needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    pub name: String,
    /// Workers the pool has or is creating now.
    pub count: u32,
    pub min: u32,
    pub max: u32,
    pub cpus: u16,
    pub memory: u64,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// None or disabled: the pool does not autoscale.
    pub autoscale: Option<AutoscaleSpec>,
}

impl PoolView {
    fn settings(&self) -> Option<&AutoscaleSpec> {
        self.autoscale.as_ref().filter(|a| a.enabled)
    }
    /// What a new worker of this pool offers pods: the instance's cpus and memory less what
    /// the kubelet keeps back (k3s sets no kube/system reservation; the default hard
    /// eviction threshold is 100Mi of memory).
    pub fn allocatable(&self) -> Resources {
        Resources {
            cpu_milli: u64::from(self.cpus) * 1000,
            memory: self.memory.saturating_sub(EVICTION_HARD_MEMORY),
        }
    }
    /// Labels a new worker of this pool carries (its hostname not known yet).
    fn node_labels(&self) -> BTreeMap<String, String> {
        let mut l = self.labels.clone();
        l.insert("kubernetes.io/os".into(), "linux".into());
        l.insert("kubernetes.io/arch".into(), "amd64".into());
        l.insert(HOSTNAME.into(), NEW_NODE.into());
        l
    }
    /// What a new worker offers, as the pool's registered workers show it: the smallest of
    /// them (a real worker reports less memory than the VM has), else [`Self::allocatable`]
    /// (cluster-autoscaler builds its templates from real nodes when it has them).
    fn template(&self, nodes: &[NodeView]) -> (Resources, u32) {
        let mine = nodes.iter().filter(|n| {
            n.pool.as_deref() == Some(self.name.as_str())
                && !n.not_ready
                && n.allocatable.cpu_milli > 0
        });
        let mut out: Option<(Resources, u32)> = None;
        for n in mine {
            let (r, pods) = out.get_or_insert((n.allocatable, n.max_pods));
            r.cpu_milli = r.cpu_milli.min(n.allocatable.cpu_milli);
            r.memory = r.memory.min(n.allocatable.memory);
            *pods = (*pods).min(n.max_pods);
        }
        out.unwrap_or((self.allocatable(), DEFAULT_MAX_PODS))
    }
}

/// State kept between runs in `status.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoscaleState {
    /// Node name → when it was first seen unneeded (continuously since).
    #[serde(default)]
    pub unneeded_since: BTreeMap<String, DateTime<Utc>>,
    /// When some pool last grew: scale-down waits `scale_down_delay_after_add_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_up: Option<DateTime<Utc>>,
    /// Node name → when the autoscaler chose to remove it, while that removal goes on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub removing: BTreeMap<String, DateTime<Utc>>,
    /// Node name → when its removal was given up.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub given_up: BTreeMap<String, DateTime<Utc>>,
}

/// A change to one pool, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub pool: String,
    pub from: u32,
    pub to: u32,
    /// The node to drain and delete when scaling down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_node: Option<String>,
    pub reason: String,
}

/// A pod no pool can host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unhostable {
    pub pod: String,
    pub reason: String,
}

/// Everything one run decides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    /// The first [`MAX_LISTED`] pods no pool can host, by name.
    pub unhostable: Vec<Unhostable>,
    /// The unhostable pods past those, counted by controlling owner (`namespace/Kind/name`;
    /// `namespace/-` for pods without one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unhostable_more: BTreeMap<String, u32>,
    /// Nodes kept although unneeded-looking, and why (for status and dry-run); the first
    /// [`MAX_LISTED`] by name.
    pub kept: BTreeMap<String, String>,
    /// Kept nodes past those.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kept_more: u32,
    /// Nodes whose removal (started by the autoscaler) is given up in this run: the caller
    /// uncordons them and drops the removal annotation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub given_up: Vec<String>,
    pub state: AutoscaleState,
    /// Some node's judgement depends on PodDisruptionBudgets: when the pods were viewed
    /// without them, list them and plan again.
    #[serde(skip)]
    pub wants_budgets: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Decides every autoscaling pool's count for this run.
pub fn plan(
    pools: &[PoolView],
    nodes: &[NodeView],
    pods: &[PodView],
    prev: &AutoscaleState,
    now: DateTime<Utc>,
) -> Outcome {
    let mut out = Outcome::default();
    let mut target: BTreeMap<&str, (u32, Option<String>)> = BTreeMap::new();
    let mut grew: Vec<&str> = Vec::new();

    // 1. Bounds (schedule windows included).
    let mut bounds: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for p in pools {
        let Some(a) = p.settings() else { continue };
        let (min, max, window) = effective_bounds(p.min, p.max, a, now);
        bounds.insert(&p.name, (min, max));
        let why = |edge: &str, v: u32| match &window {
            Some(w) => format!("schedule window {w:?} sets {edge} {v}"),
            None => format!("pool {edge} is {v}"),
        };
        let (to, reason) = if p.count < min {
            (min, Some(why("min", min)))
        } else if p.count > max {
            (max, Some(why("max", max)))
        } else {
            (p.count, None)
        };
        if to > p.count {
            grew.push(&p.name);
        }
        target.insert(&p.name, (to, reason));
    }

    // 2. Scale up for unschedulable pods; not for pods waiting for a preemption or expendable
    // ones (cluster-autoscaler `FilterOutExpendableAndSplit`).
    let pending: Vec<&PodView> = pods
        .iter()
        .filter(|p| p.unschedulable && !p.nominated && !p.expendable())
        .collect();
    if !pending.is_empty() {
        scale_up(
            pools,
            nodes,
            &pending,
            &bounds,
            &mut target,
            &mut grew,
            &mut out,
        );
    }
    out.state.last_scale_up = if grew.is_empty() {
        prev.last_scale_up
    } else {
        Some(now)
    };

    // 3. Removals started earlier: carried on, or given up after their time.
    removals_under_way(pools, nodes, prev, now, &mut out);

    // 4. Scale down unneeded nodes.
    scale_down(
        pools,
        nodes,
        pods,
        prev,
        now,
        &bounds,
        &mut target,
        &grew,
        &mut out,
    );

    for p in pools {
        let Some((to, reason)) = target.remove(p.name.as_str()) else {
            continue;
        };
        if let Some(reason) = reason {
            let remove_node = out
                .decisions
                .iter()
                .position(|d| d.pool == p.name)
                .map(|i| out.decisions.remove(i))
                .and_then(|d| d.remove_node);
            out.decisions.push(Decision {
                pool: p.name.clone(),
                from: p.count,
                to,
                remove_node,
                reason,
            });
        }
    }
    for n in out.decisions.iter().filter_map(|d| d.remove_node.as_ref()) {
        out.state.removing.insert(n.clone(), now);
    }
    cap(&mut out, pods);
    out
}

/// Removals the autoscaler started: remembered while the node is still being removed, given
/// up after the pool's `removal_timeout_seconds` (cluster-autoscaler saves a node whose
/// eviction keeps failing). Given-up nodes are remembered long enough for the back-offs.
fn removals_under_way(
    pools: &[PoolView],
    nodes: &[NodeView],
    prev: &AutoscaleState,
    now: DateTime<Utc>,
    out: &mut Outcome,
) {
    let node = |name: &str| nodes.iter().find(|n| n.name == name);
    for (name, since) in &prev.removing {
        // Gone (done), or no longer being removed (someone uncordoned it): forget it.
        let Some(n) = node(name).filter(|n| n.removing) else {
            continue;
        };
        let timeout = n
            .pool
            .as_deref()
            .and_then(|p| pools.iter().find(|v| v.name == p))
            .and_then(PoolView::settings)
            .map_or(AutoscaleSpec::default().removal_timeout_seconds, |a| {
                a.removal_timeout_seconds
            });
        if now - *since >= Duration::seconds(secs(timeout)) {
            out.given_up.push(name.clone());
            out.state.given_up.insert(name.clone(), now);
        } else {
            out.state.removing.insert(name.clone(), *since);
        }
    }
    let keep = Duration::seconds(UNREMOVABLE_RECHECK_SECONDS.max(DELAY_AFTER_FAILURE_SECONDS));
    for (name, at) in &prev.given_up {
        if now - *at < keep && node(name).is_some() {
            out.state.given_up.entry(name.clone()).or_insert(*at);
        }
    }
}

fn secs(s: u64) -> i64 {
    i64::try_from(s).unwrap_or(i64::MAX / 1000)
}

/// Keeps what status carries bounded: the first [`MAX_LISTED`] unhostable pods and kept
/// nodes by name, the rest counted.
fn cap(out: &mut Outcome, pods: &[PodView]) {
    out.unhostable.sort_by(|a, b| a.pod.cmp(&b.pod));
    out.unhostable.dedup_by(|a, b| a.pod == b.pod);
    if out.unhostable.len() > MAX_LISTED {
        let owner: BTreeMap<String, String> = pods
            .iter()
            .map(|p| {
                let o = p
                    .owner
                    .clone()
                    .unwrap_or_else(|| format!("{}/-", p.namespace));
                (p.key(), o)
            })
            .collect();
        for u in out.unhostable.drain(MAX_LISTED..) {
            let o = owner.get(&u.pod).cloned().unwrap_or_default();
            let o =
                if out.unhostable_more.len() < MAX_OWNERS || out.unhostable_more.contains_key(&o) {
                    o
                } else {
                    "(other owners)".to_owned()
                };
            *out.unhostable_more.entry(o).or_default() += 1;
        }
    }
    if out.kept.len() > MAX_LISTED {
        let extra: Vec<String> = out.kept.keys().skip(MAX_LISTED).cloned().collect();
        out.kept_more = extra.len() as u32;
        for k in extra {
            out.kept.remove(&k);
        }
    }
}

/// A bin with what is left of it.
#[derive(Clone)]
struct Bin {
    free: Resources,
    pods_left: u32,
    /// Host ports taken (`protocol/port`).
    ports: Vec<String>,
}

impl Bin {
    fn new(free: Resources, pods_left: u32) -> Bin {
        Bin {
            free,
            pods_left,
            ports: Vec::new(),
        }
    }
    fn fits(&self, pod: &PodView) -> bool {
        self.pods_left > 0
            && pod.requests.fits_in(&self.free)
            && !pod.host_ports.iter().any(|p| self.ports.contains(p))
    }
    fn take(&mut self, pod: &PodView) -> bool {
        if !self.fits(pod) {
            return false;
        }
        self.free.sub(&pod.requests);
        self.pods_left -= 1;
        self.ports.extend(pod.host_ports.iter().cloned());
        true
    }
}

/// Pods sorted for first-fit decreasing: by the larger of their cpu and memory fractions of
/// `of`, biggest first, then by name so the result does not depend on listing order.
fn ffd_order(pods: &mut [&PodView], of: Resources) {
    let size = |p: &PodView| {
        let c = p.requests.cpu_milli as f64 / of.cpu_milli.max(1) as f64;
        let m = p.requests.memory as f64 / of.memory.max(1) as f64;
        c.max(m)
    };
    pods.sort_by(|a, b| {
        size(b)
            .total_cmp(&size(a))
            .then_with(|| a.namespace.cmp(&b.namespace))
            .then_with(|| a.name.cmp(&b.name))
    });
}

/// How one pool would host a set of pods: nodes added, pods placed, and the fractions of its
/// cpu and memory left idle.
struct Option_ {
    nodes: u32,
    placed: Vec<String>,
    waste: f64,
    waste_memory: f64,
}

#[allow(clippy::too_many_arguments)]
fn scale_up<'a>(
    pools: &'a [PoolView],
    nodes: &[NodeView],
    pending: &[&PodView],
    bounds: &BTreeMap<&str, (u32, u32)>,
    target: &mut BTreeMap<&'a str, (u32, Option<String>)>,
    grew: &mut Vec<&'a str>,
    out: &mut Outcome,
) {
    // What a new worker of each pool offers: its registered workers' smallest allocatable.
    let templates: Vec<(Resources, u32)> = pools.iter().map(|p| p.template(nodes)).collect();
    let mut remaining = hostable_pools(pools, &templates, pending, out);
    let mut pool_bins = upcoming_bins(pools, nodes, &templates);
    loop {
        if remaining.is_empty() {
            break;
        }
        let Some((i, choice, bins)) =
            best_pool(pools, &templates, bounds, target, &remaining, &pool_bins)
        else {
            break;
        };
        pool_bins[i] = bins;
        remaining.retain(|(pod, _)| !choice.placed.contains(&pod.key()));
        if choice.nodes == 0 {
            // Upcoming workers already cover them.
            continue;
        }
        grow(&pools[i], &choice, target, grew);
    }
    for (pod, _) in remaining {
        out.unhostable.push(Unhostable {
            pod: pod.key(),
            reason: "every pool that could host it is at its max or its per-run limit".into(),
        });
    }
}

/// Which pools could host each pending pod at all (on an empty new node, `templates` by
/// pool); the pods none can host go to `out.unhostable` with the reason.
fn hostable_pools<'p>(
    pools: &[PoolView],
    templates: &[(Resources, u32)],
    pending: &[&'p PodView],
    out: &mut Outcome,
) -> Vec<(&'p PodView, Vec<usize>)> {
    let mut hostable: Vec<(&PodView, Vec<usize>)> = Vec::new();
    for pod in pending {
        // A DaemonSet pod is bound to the node it was made for; a new node gets its own
        // (cluster-autoscaler `filter_out_daemon_sets.go`).
        if pod.is_daemon() {
            out.unhostable.push(Unhostable {
                pod: pod.key(),
                reason: "a DaemonSet pod runs only on the node it was made for (a new worker \
                         gets its own); make room on that node"
                    .into(),
            });
            continue;
        }
        if let Some(r) = &pod.refusal {
            out.unhostable.push(Unhostable {
                pod: pod.key(),
                reason: format!("the scheduler refused it for a reason no new node changes: {r}"),
            });
            continue;
        }
        let mut why_not = Vec::new();
        let mut ok = Vec::new();
        for (i, p) in pools.iter().enumerate() {
            if p.settings().is_none() {
                continue;
            }
            let (alloc, _) = templates[i];
            if !pod.requests.fits_in(&alloc) {
                why_not.push(format!(
                    "pool {}: requests cpu {}m memory {}Mi exceed a worker's allocatable cpu {}m \
                     memory {}Mi",
                    p.name,
                    pod.requests.cpu_milli,
                    pod.requests.memory >> 20,
                    alloc.cpu_milli,
                    alloc.memory >> 20
                ));
            } else if let Some(m) = pod.misfit(&p.node_labels(), NEW_NODE, &p.taints) {
                why_not.push(format!("pool {}: {m}", p.name));
            } else {
                ok.push(i);
            }
        }
        if ok.is_empty() {
            let reason = if why_not.is_empty() {
                "no worker pool autoscales".to_owned()
            } else {
                why_not.join("; ")
            };
            out.unhostable.push(Unhostable {
                pod: pod.key(),
                reason,
            });
        } else {
            hostable.push((pod, ok));
        }
    }
    hostable
}

/// Bins each pool has this run: its upcoming workers, then any added later. Kept across
/// rounds so a pool chosen twice does not reuse the room it already gave away.
fn upcoming_bins(
    pools: &[PoolView],
    nodes: &[NodeView],
    templates: &[(Resources, u32)],
) -> Vec<Vec<Bin>> {
    // Upcoming workers (created and not registered yet, or registered and not Ready yet) are
    // empty bins pods will land on: count them first so a run does not add nodes for pods the
    // last run already provided for (cluster-autoscaler `GetUpcomingNodes`).
    let ready = |pool: &str| {
        nodes
            .iter()
            .filter(|n| n.pool.as_deref() == Some(pool) && !n.not_ready && !n.removing)
            .count()
    };
    pools
        .iter()
        .zip(templates)
        .map(|(p, (alloc, max_pods))| {
            let upcoming = p.count.saturating_sub(ready(&p.name) as u32);
            vec![Bin::new(*alloc, *max_pods); upcoming as usize]
        })
        .collect()
}

/// The pool that hosts the `remaining` pods best this round (see [`better_option`]), how,
/// and its bins after.
fn best_pool(
    pools: &[PoolView],
    templates: &[(Resources, u32)],
    bounds: &BTreeMap<&str, (u32, u32)>,
    target: &BTreeMap<&str, (u32, Option<String>)>,
    remaining: &[(&PodView, Vec<usize>)],
    pool_bins: &[Vec<Bin>],
) -> Option<(usize, Option_, Vec<Bin>)> {
    let mut best: Option<(usize, Option_, Vec<Bin>)> = None;
    for (i, p) in pools.iter().enumerate() {
        let Some(a) = p.settings() else { continue };
        let (_, max) = bounds[p.name.as_str()];
        let current = target[p.name.as_str()].0;
        let room = max.saturating_sub(current).min(
            a.max_nodes_per_run
                .saturating_sub(current.saturating_sub(p.count)),
        );
        let Some((cand, bins)) = pack(i, templates[i], room, remaining, &pool_bins[i]) else {
            continue;
        };
        if better_option(&cand, best.as_ref().map(|(_, b, _)| b)) {
            best = Some((i, cand, bins));
        }
    }
    best
}

/// How pool `i` would host the `remaining` pods it can host, first fit decreasing on its
/// `bins` and at most `room` new ones of its `template`; None when it places none.
fn pack(
    i: usize,
    template: (Resources, u32),
    room: u32,
    remaining: &[(&PodView, Vec<usize>)],
    bins: &[Bin],
) -> Option<(Option_, Vec<Bin>)> {
    let mut mine: Vec<&PodView> = remaining
        .iter()
        .filter(|(_, ok)| ok.contains(&i))
        .map(|(pod, _)| *pod)
        .collect();
    if mine.is_empty() {
        return None;
    }
    let (alloc, max_pods) = template;
    ffd_order(&mut mine, alloc);
    let fresh = Bin::new(alloc, max_pods);
    let mut bins = bins.to_vec();
    let had = bins.len() as u32;
    let mut placed = Vec::new();
    for pod in mine {
        if bins.iter_mut().any(|b| b.take(pod)) {
            placed.push(pod.key());
        } else if (bins.len() as u32) < had + room {
            let mut b = fresh.clone();
            if b.take(pod) {
                bins.push(b);
                placed.push(pod.key());
            }
        }
    }
    if placed.is_empty() {
        return None;
    }
    let added = bins.len() as u32 - had;
    let total = alloc.cpu_milli as f64 * bins.len() as f64;
    let totm = alloc.memory as f64 * bins.len() as f64;
    let freec: f64 = bins.iter().map(|b| b.free.cpu_milli as f64).sum();
    let freem: f64 = bins.iter().map(|b| b.free.memory as f64).sum();
    let cand = Option_ {
        nodes: added,
        placed,
        waste: freec / total.max(1.0),
        waste_memory: freem / totm.max(1.0),
    };
    Some((cand, bins))
}

/// Whether `cand` beats the best option so far.
fn better_option(cand: &Option_, best: Option<&Option_>) -> bool {
    match best {
        None => true,
        // Pods the pool's upcoming workers already hold cost nothing new.
        Some(b) if (cand.nodes == 0) != (b.nodes == 0) => cand.nodes == 0,
        Some(b) => {
            // least-waste: idle cpu first, then unused memory, then more pods.
            let (c, m) = (cand.waste - b.waste, cand.waste_memory - b.waste_memory);
            c < -1e-9
                || c.abs() <= 1e-9
                    && (m < -1e-9 || m.abs() <= 1e-9 && cand.placed.len() > b.placed.len())
        }
    }
}

/// Adds the chosen new workers to pool `p`'s target, with the reason.
fn grow<'a>(
    p: &'a PoolView,
    choice: &Option_,
    target: &mut BTreeMap<&'a str, (u32, Option<String>)>,
    grew: &mut Vec<&'a str>,
) {
    let Some(entry) = target.get_mut(p.name.as_str()) else {
        return;
    };
    entry.0 += choice.nodes;
    let why = format!(
        "{} unschedulable pod(s) ({}) fit on {} new worker(s) of pool {} ({:.0}% of their cpu idle)",
        choice.placed.len(),
        abbreviate(&choice.placed),
        choice.nodes,
        p.name,
        choice.waste * 100.0
    );
    entry.1 = Some(match entry.1.take() {
        Some(prev) => format!("{prev}; {why}"),
        None => why,
    });
    if !grew.contains(&p.name.as_str()) {
        grew.push(&p.name);
    }
}

fn abbreviate(names: &[String]) -> String {
    if names.len() <= 3 {
        names.join(", ")
    } else {
        format!(
            "{}, ... and {} more",
            names[..2].join(", "),
            names.len() - 2
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn scale_down<'a>(
    pools: &'a [PoolView],
    nodes: &[NodeView],
    pods: &[PodView],
    prev: &AutoscaleState,
    now: DateTime<Utc>,
    bounds: &BTreeMap<&str, (u32, u32)>,
    target: &mut BTreeMap<&'a str, (u32, Option<String>)>,
    grew: &[&str],
    out: &mut Outcome,
) {
    let index: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let on = pods_that_matter(nodes, pods, &index);
    let mut free = free_room(nodes, &on);
    let mut budgets: BTreeMap<&str, u32> = pods
        .iter()
        .flat_map(|p| &p.budgets)
        .map(|b| (b.key.as_str(), b.allowed))
        .collect();
    let down = ScaleDown {
        pool_of: pools.iter().map(|p| (p.name.as_str(), p)).collect(),
        nodes,
        index,
        on,
        now,
        bounds,
    };
    let ready = down.unneeded(prev, &free, &budgets, target, out);
    down.remove(ready, &mut free, &mut budgets, target, grew, out);
}

/// The pods that matter on each node (by index): not our own reconcile pods (gone in
/// minutes) nor expendable ones (cluster-autoscaler kills those without a second thought).
fn pods_that_matter<'p>(
    nodes: &[NodeView],
    pods: &'p [PodView],
    index: &BTreeMap<&str, usize>,
) -> Vec<Vec<&'p PodView>> {
    let mut on: Vec<Vec<&PodView>> = vec![Vec::new(); nodes.len()];
    for p in pods.iter().filter(|p| !p.ignored_on_node()) {
        if let Some(i) = p.node.as_deref().and_then(|n| index.get(n)) {
            on[*i].push(p);
        }
    }
    on
}

/// Free room on every node, shared by the move simulations of scale-down.
fn free_room(nodes: &[NodeView], on: &[Vec<&PodView>]) -> Vec<Bin> {
    nodes
        .iter()
        .zip(on)
        .map(|(n, ps)| {
            let mut b = Bin::new(n.allocatable, n.max_pods.saturating_sub(ps.len() as u32));
            for p in ps {
                b.free.sub(&p.requests);
                b.ports.extend(p.host_ports.iter().cloned());
            }
            b
        })
        .collect()
}

/// What scale-down reads: the pools by name, the nodes (and their index by name), the pods
/// that matter on each node, the time and each pool's bounds.
struct ScaleDown<'v> {
    pool_of: BTreeMap<&'v str, &'v PoolView>,
    nodes: &'v [NodeView],
    index: BTreeMap<&'v str, usize>,
    on: Vec<Vec<&'v PodView>>,
    now: DateTime<Utc>,
    bounds: &'v BTreeMap<&'v str, (u32, u32)>,
}

impl ScaleDown<'_> {
    /// (unneeded since, node) of the nodes unneeded long enough; records in `out` since when
    /// each unneeded node is, and why the others that might go stay.
    fn unneeded(
        &self,
        prev: &AutoscaleState,
        free: &[Bin],
        budgets: &BTreeMap<&str, u32>,
        target: &BTreeMap<&str, (u32, Option<String>)>,
        out: &mut Outcome,
    ) -> Vec<(DateTime<Utc>, usize)> {
        let now = self.now;
        let mut ready: Vec<(DateTime<Utc>, usize)> = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(pool) = n.pool.as_deref().and_then(|p| self.pool_of.get(p)) else {
                continue;
            };
            let Some(a) = pool.settings() else { continue };
            if n.cordoned || n.not_ready {
                continue;
            }
            if let Some(why) = held_back(n, prev, now) {
                out.kept.insert(n.name.clone(), why);
                continue;
            }
            let on = &self.on[i];
            if !underused(n, a, on) {
                continue;
            }
            if let Some(why) = on.iter().find_map(|p| p.blocks_removal()) {
                out.kept.insert(n.name.clone(), why);
                continue;
            }
            // From here budgets decide: a node with pods to move in a pool that may shrink.
            let movers = on.iter().any(|p| !p.is_daemon());
            if movers && target[pool.name.as_str()].0 > self.bounds[pool.name.as_str()].0 {
                out.wants_budgets = true;
            }
            if let Some(why) = budget_block(on, budgets) {
                out.kept.insert(n.name.clone(), why);
                continue;
            }
            if let Err(why) = place_elsewhere(i, self.nodes, on, free, &[]) {
                out.kept.insert(n.name.clone(), why);
                continue;
            }
            let since = prev.unneeded_since.get(&n.name).copied().unwrap_or(now);
            out.state.unneeded_since.insert(n.name.clone(), since);
            let delay = Duration::seconds(secs(a.scale_down_unneeded_seconds));
            if now - since >= delay {
                ready.push((since, i));
            }
        }
        ready
    }

    /// Removals, one after another across pools, longest unneeded first: each later one is
    /// simulated without the nodes removed before it and with their pods placed
    /// (cluster-autoscaler FAQ "How does scale-down work?").
    fn remove(
        &self,
        mut ready: Vec<(DateTime<Utc>, usize)>,
        free: &mut [Bin],
        budgets: &mut BTreeMap<&str, u32>,
        target: &mut BTreeMap<&str, (u32, Option<String>)>,
        grew: &[&str],
        out: &mut Outcome,
    ) {
        ready.sort();
        let mut removed: Vec<usize> = Vec::new();
        for (since, i) in ready {
            let n = &self.nodes[i];
            let Some(pool) = n.pool.as_deref() else {
                continue;
            };
            let p = self.pool_of[pool];
            let Some(a) = p.settings() else { continue };
            if self.pool_busy(pool, p, a, grew, &out.state) {
                continue;
            }
            let (min, _) = self.bounds[pool];
            let Some(entry) = target.get_mut(pool) else {
                continue;
            };
            if entry.0 <= min || entry.0 < p.count {
                // At min, or already shrinking this run (one node per pool per run).
                continue;
            }
            let on = &self.on[i];
            if let Some(why) = budget_block(on, budgets) {
                out.kept
                    .insert(n.name.clone(), format!("{why} (after this run's removals)"));
                continue;
            }
            let places = match place_elsewhere(i, self.nodes, on, free, &removed) {
                Ok(places) => places,
                Err(why) => {
                    out.kept.insert(
                        n.name.clone(),
                        format!("{why} once this run's other removals are done; next run"),
                    );
                    continue;
                }
            };
            for (j, pod) in places {
                free[j].take(pod);
            }
            spend_budgets(on, budgets);
            removed.push(i);
            entry.0 -= 1;
            entry.1 = Some(format!(
                "node {} unneeded since {} (requests below {:.0}% of allocatable, its pods fit \
                 elsewhere)",
                n.name,
                since.format("%Y-%m-%dT%H:%M:%SZ"),
                a.utilization_threshold * 100.0
            ));
            out.decisions.push(Decision {
                pool: pool.to_owned(),
                from: p.count,
                to: entry.0,
                remove_node: Some(n.name.clone()),
                reason: String::new(),
            });
        }
    }

    /// Whether pool `pool` may not shrink now: not while it grows (this run, or workers an
    /// earlier run created have not joined yet: cluster-autoscaler likewise holds scale-down
    /// during a scale-up), nor soon after a scale-up or a failed removal.
    fn pool_busy(
        &self,
        pool: &str,
        p: &PoolView,
        a: &AutoscaleSpec,
        grew: &[&str],
        state: &AutoscaleState,
    ) -> bool {
        let now = self.now;
        let registered = self
            .nodes
            .iter()
            .filter(|n| n.pool.as_deref() == Some(pool))
            .count() as u32;
        if grew.contains(&pool) || p.count > registered {
            return true;
        }
        // `--scale-down-delay-after-add`.
        let after_add = Duration::seconds(secs(a.scale_down_delay_after_add_seconds));
        if state.last_scale_up.is_some_and(|t| now - t < after_add) {
            return true;
        }
        // `--scale-down-delay-after-failure`, per pool.
        state.given_up.iter().any(|(name, at)| {
            now - *at < Duration::seconds(DELAY_AFTER_FAILURE_SECONDS)
                && self
                    .index
                    .get(name.as_str())
                    .is_some_and(|j| self.nodes[*j].pool.as_deref() == Some(pool))
        })
    }
}

/// Why node `n` is not considered for removal this run at all (its removal was given up
/// recently, or it is annotated so), if it is not.
fn held_back(n: &NodeView, prev: &AutoscaleState, now: DateTime<Utc>) -> Option<String> {
    let recheck = Duration::seconds(UNREMOVABLE_RECHECK_SECONDS);
    if let Some(at) = prev.given_up.get(&n.name).filter(|at| now - **at < recheck) {
        return Some(format!(
            "its removal was given up at {}; considered again from {}",
            at.format("%Y-%m-%dT%H:%M:%SZ"),
            (*at + recheck).format("%Y-%m-%dT%H:%M:%SZ")
        ));
    }
    if n.annotations.get(SCALE_DOWN_DISABLED).map(String::as_str) == Some("true") {
        return Some(format!("node is annotated {SCALE_DOWN_DISABLED}=true"));
    }
    None
}

/// Whether the pods on node `n` (DaemonSet pods aside) request less than the pool's
/// utilization threshold of its allocatable.
fn underused(n: &NodeView, a: &AutoscaleSpec, on: &[&PodView]) -> bool {
    let mut used = Resources::default();
    on.iter()
        .filter(|p| !p.is_daemon())
        .for_each(|p| used.add(&p.requests));
    let util = (used.cpu_milli as f64 / n.allocatable.cpu_milli.max(1) as f64)
        .max(used.memory as f64 / n.allocatable.memory.max(1) as f64);
    let busy = util >= a.utilization_threshold
        && !(a.utilization_threshold == 0.0 && used == Resources::default());
    !busy
}

/// One disruption less for every budget that selects a pod moved off a removed node.
fn spend_budgets(on: &[&PodView], budgets: &mut BTreeMap<&str, u32>) {
    for b in on
        .iter()
        .filter(|p| !p.is_daemon())
        .flat_map(|p| &p.budgets)
    {
        if let Some(left) = budgets.get_mut(b.key.as_str()) {
            *left = left.saturating_sub(1);
        }
    }
}

/// Why the node's pods may not all be evicted now: some budget allows fewer disruptions than
/// the pods it selects here (cluster-autoscaler's `pdb` drainability rule).
fn budget_block(pods: &[&PodView], left: &BTreeMap<&str, u32>) -> Option<String> {
    let mut here: BTreeMap<&str, (u32, &PodView)> = BTreeMap::new();
    for p in pods.iter().filter(|p| !p.is_daemon()) {
        for b in &p.budgets {
            here.entry(b.key.as_str()).or_insert((0, p)).0 += 1;
        }
    }
    here.into_iter().find_map(|(key, (n, pod))| {
        let allowed = left.get(key).copied().unwrap_or(0);
        (n > allowed).then(|| {
            format!(
                "pod {}: PodDisruptionBudget {key} allows {allowed} disruption(s), {n} of its pods run here",
                pod.key()
            )
        })
    })
}

/// Where the pods of node `me` would go on the other schedulable nodes (not those in
/// `removed`), or why they could not all be placed.
fn place_elsewhere<'p>(
    me: usize,
    nodes: &[NodeView],
    pods: &[&'p PodView],
    free: &[Bin],
    removed: &[usize],
) -> Result<Vec<(usize, &'p PodView)>, String> {
    let mut movers: Vec<&PodView> = pods.iter().copied().filter(|p| !p.is_daemon()).collect();
    ffd_order(&mut movers, nodes[me].allocatable);
    let mut taken: BTreeMap<usize, Bin> = BTreeMap::new();
    let mut places = Vec::new();
    'pods: for pod in movers {
        for (j, n) in nodes.iter().enumerate() {
            if j == me || n.cordoned || n.not_ready || removed.contains(&j) {
                continue;
            }
            let bin = taken.entry(j).or_insert_with(|| free[j].clone());
            if !bin.fits(pod) || pod.misfit(&n.labels, &n.name, &n.taints).is_some() {
                continue;
            }
            bin.take(pod);
            places.push((j, pod));
            continue 'pods;
        }
        return Err(format!("pod {} fits on no other node", pod.key()));
    }
    Ok(places)
}

#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;
