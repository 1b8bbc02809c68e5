//! What the cluster's workloads look like to us: the pods, PersistentVolumes and
//! PodDisruptionBudgets the [`Cluster`](crate::ports::cluster::Cluster) port lists, in plain data the
//! autoscaler reads. The Kubernetes adapter converts its objects into these.

use std::collections::BTreeMap;

use crate::domain::spec::{Taint, TaintEffect};

/// Cpu (millicores) and memory (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: u64,
    pub memory: u64,
}

impl Resources {
    pub fn fits_in(&self, free: &Resources) -> bool {
        self.cpu_milli <= free.cpu_milli && self.memory <= free.memory
    }
    pub fn sub(&mut self, r: &Resources) {
        self.cpu_milli = self.cpu_milli.saturating_sub(r.cpu_milli);
        self.memory = self.memory.saturating_sub(r.memory);
    }
    pub fn add(&mut self, r: &Resources) {
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
    pub fn tolerates(&self, t: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != t.effect) {
            return false;
        }
        match &self.key {
            None => self.exists,
            Some(k) => k == &t.key && (self.exists || self.value == t.value),
        }
    }
}

/// One requirement of a required node affinity term or of a label selector: a
/// `matchExpressions` entry on a label, or (`field`) a `matchFields` entry, which selects on
/// `metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelRequirement {
    pub key: String,
    pub op: LabelOp,
    pub values: Vec<String>,
    pub field: bool,
}

/// The operator of a [`LabelRequirement`].
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
    pub fn matches(&self, labels: &BTreeMap<String, String>, name: &str) -> bool {
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

/// A `LabelSelector` (`matchLabels` and `matchExpressions`, all ANDed), as a
/// PodDisruptionBudget selects its pods. An empty selector selects every pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on labels (never `field`); an operator we do not know is a requirement
    /// nothing meets.
    pub match_expressions: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels, ""))
    }
}

/// A pod's controlling owner reference (`controller: true`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owner {
    /// `ReplicaSet`, `DaemonSet`, `Job`, ...
    pub kind: String,
    pub name: String,
}

/// A pod as the cluster lists it for the autoscaler (the [`Cluster`](crate::ports::cluster::Cluster)
/// port's `list_pods`): what the scheduler and cluster-autoscaler look at, already parsed.
/// The autoscaler joins it with the budgets and volumes into its
/// [`PodView`](crate::domain::autoscale::PodView).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The controlling owner reference, if any.
    pub controller: Option<Owner>,
    /// Phase `Succeeded` or `Failed`: it holds no resources any more.
    pub finished: bool,
    /// What the scheduler counts (`PodRequests`, component-helpers `resource/helpers.go`):
    /// containers and sidecars (init containers with `restartPolicy: Always`) summed, the
    /// larger of that and any init container's (with the sidecars started before it), plus
    /// the pod overhead.
    pub requests: Resources,
    /// `spec.nodeName`: where it runs; None while Pending.
    pub node: Option<String>,
    /// Not bound, with `PodScheduled=False` reason `Unschedulable`: the scheduler tried and
    /// found no node.
    pub unschedulable: bool,
    /// The message of that `PodScheduled=False` condition (the scheduler's words), when
    /// `unschedulable`.
    pub scheduler_message: Option<String>,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity (`requiredDuringSchedulingIgnoredDuringExecution`): terms ORed,
    /// requirements within a term ANDed (`matchFields` ones have `field` set); an operator we
    /// do not know is a requirement nothing meets, as in the scheduler. Empty: none.
    pub affinity_terms: Vec<Vec<LabelRequirement>>,
    pub tolerations: Vec<Toleration>,
    /// `spec.priority`.
    pub priority: Option<i32>,
    /// `status.nominatedNodeName` is set: it waits for a preemption to make room.
    pub nominated: bool,
    /// `protocol/port` of every container (and init container) port with a `hostPort`.
    pub host_ports: Vec<String>,
    /// Names of its hostPath and (not memory-backed) emptyDir volumes: data on the node.
    pub local_volumes: Vec<String>,
    /// The PersistentVolumeClaims its volumes mount, in volume order (a generic ephemeral
    /// volume's claim is named `<pod>-<volume>`).
    pub claims: Vec<String>,
}

impl Pod {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `namespace/Kind/name` of the controlling owner, if it has one.
    pub fn owner_key(&self) -> Option<String> {
        let o = self.controller.as_ref()?;
        Some(format!("{}/{}/{}", self.namespace, o.kind, o.name))
    }
}

/// The claim a PersistentVolume is bound to (`spec.claimRef`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
}

/// A PersistentVolume, as the autoscaler's volume rules need it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PersistentVolume {
    pub name: String,
    /// The claim bound to it; None when it is not bound (or the reference lacks a namespace
    /// or name).
    pub claim: Option<ClaimRef>,
    /// `spec.nodeAffinity.required`'s node selector terms, if set: the only nodes that can
    /// mount it (as [`Pod::affinity_terms`]).
    pub node_affinity: Option<Vec<Vec<LabelRequirement>>>,
}

/// A PodDisruptionBudget, as the autoscaler's budget rules need it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DisruptionBudget {
    pub namespace: String,
    pub name: String,
    /// `spec.selector`; None selects no pod.
    pub selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`; 0 while the disruption controller has not computed it
    /// (the Eviction API refuses then too) or when it is negative.
    pub allowed: u32,
}
