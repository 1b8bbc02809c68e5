//! What the cluster's workloads look like to us: the pods, PersistentVolumes and
//! PodDisruptionBudgets the [`Cluster`](crate::cluster::Cluster) port lists, in plain data the
//! autoscaler reads. The Kubernetes adapter converts its objects into these.

use std::collections::BTreeMap;

use crate::spec::{Taint, TaintEffect};

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

/// One requirement of a required node affinity term: a `matchExpressions` entry on a label,
/// or (`field`) a `matchFields` entry, which selects on `metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelRequirement {
    pub key: String,
    pub op: LabelOp,
    pub values: Vec<String>,
    pub field: bool,
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
