//! From `k8s_openapi` objects to the domain's views of the cluster's workloads
//! ([`crate::domain::model::Pod`], [`crate::domain::model::PersistentVolume`],
//! [`crate::domain::model::DisruptionBudget`]) and the parts of a Node the autoscaler reads (taints,
//! allocatable). Pure; what the views mean is the autoscaler's business
//! ([`crate::domain::autoscale::observe`]).
//!
//! Requests follow `PodRequests` (component-helpers `resource/helpers.go`): containers and
//! sidecars (init containers with `restartPolicy: Always`) summed, the larger of that and any
//! init container's (with the sidecars started before it), plus the pod overhead.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node as KubeNode, NodeSelectorTerm, PersistentVolume as KubePersistentVolume, Pod as KubePod,
    PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as KubeLabelSelector;

use crate::domain::model::{
    Allocatable, ClaimRef, DisruptionBudget, LabelOp, LabelRequirement, LabelSelector, Owner,
    PersistentVolume, Pod, Resources, Toleration,
};
use crate::domain::spec::{Taint, TaintEffect};

/// A Kubernetes quantity (`500m`, `2`, `1.5Gi`, `1e3`) as a number; None if malformed.
pub fn quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * mult)
}

fn resources(map: Option<&BTreeMap<String, Quantity>>) -> Resources {
    let get = |k: &str| {
        map.and_then(|m| m.get(k))
            .and_then(|q| quantity(&q.0))
            .unwrap_or(0.0)
    };
    Resources {
        cpu_milli: (get("cpu") * 1000.0).ceil() as u64,
        memory: get("memory").ceil() as u64,
    }
}

fn requests(r: Option<&ResourceRequirements>) -> Resources {
    resources(r.and_then(|r| r.requests.as_ref()))
}

/// A `matchExpressions`/`matchFields` entry; an operator we do not know becomes a requirement
/// nothing meets (`In` no value), as in the scheduler.
fn requirement(key: &str, op: &str, values: Option<&Vec<String>>, field: bool) -> LabelRequirement {
    let op = match op {
        "In" => Some(LabelOp::In),
        "NotIn" => Some(LabelOp::NotIn),
        "Exists" => Some(LabelOp::Exists),
        "DoesNotExist" => Some(LabelOp::DoesNotExist),
        "Gt" => Some(LabelOp::Gt),
        "Lt" => Some(LabelOp::Lt),
        _ => None,
    };
    LabelRequirement {
        key: key.to_owned(),
        op: op.unwrap_or(LabelOp::In),
        values: op.and(values.cloned()).unwrap_or_default(),
        field,
    }
}

/// Required node selector terms (`matchExpressions` and `matchFields`) as requirements.
fn node_terms(terms: &[NodeSelectorTerm]) -> Vec<Vec<LabelRequirement>> {
    terms
        .iter()
        .map(|t| {
            let exprs = t.match_expressions.iter().flatten().map(|e| (e, false));
            let fields = t.match_fields.iter().flatten().map(|e| (e, true));
            exprs
                .chain(fields)
                .map(|(e, field)| requirement(&e.key, &e.operator, e.values.as_ref(), field))
                .collect()
        })
        .collect()
}

fn label_selector(sel: &KubeLabelSelector) -> LabelSelector {
    LabelSelector {
        match_labels: sel.match_labels.clone().unwrap_or_default(),
        match_expressions: sel
            .match_expressions
            .iter()
            .flatten()
            .map(|e| requirement(&e.key, &e.operator, e.values.as_ref(), false))
            .collect(),
    }
}

fn effect(s: &str) -> Option<TaintEffect> {
    match s {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

/// A pod as the autoscaler reads it. A pod without a spec (the API never sends one) reads as
/// one with no containers.
pub fn pod_from_kube(pod: &KubePod) -> Pod {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let name = meta.name.clone().unwrap_or_default();
    let (unschedulable, scheduler_message) = scheduling(status, spec);
    let (local_volumes, claims) = volumes(spec, &name);
    Pod {
        namespace: meta.namespace.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        controller: meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| Owner {
                kind: o.kind.clone(),
                name: o.name.clone(),
            }),
        finished: matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ),
        requests: pod_requests(spec),
        node: spec.node_name.clone(),
        unschedulable,
        scheduler_message,
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        affinity_terms: spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|ns| node_terms(&ns.node_selector_terms))
            .unwrap_or_default(),
        tolerations: tolerations(spec),
        priority: spec.priority,
        nominated: status
            .and_then(|s| s.nominated_node_name.as_deref())
            .is_some_and(|n| !n.is_empty()),
        host_ports: host_ports(spec),
        local_volumes,
        claims,
        name,
    }
}

/// PodRequests: sidecars add to the containers' sum, each init container needs its own
/// requests plus the sidecars started before it.
fn pod_requests(spec: &PodSpec) -> Resources {
    let mut req = Resources::default();
    for c in &spec.containers {
        req.add(&requests(c.resources.as_ref()));
    }
    let mut sidecars = Resources::default();
    let mut init = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = requests(c.resources.as_ref());
        let need = if c.restart_policy.as_deref() == Some("Always") {
            req.add(&r);
            sidecars.add(&r);
            sidecars
        } else {
            let mut n = r;
            n.add(&sidecars);
            n
        };
        init.cpu_milli = init.cpu_milli.max(need.cpu_milli);
        init.memory = init.memory.max(need.memory);
    }
    req.cpu_milli = req.cpu_milli.max(init.cpu_milli);
    req.memory = req.memory.max(init.memory);
    req.add(&resources(spec.overhead.as_ref()));
    req
}

/// Whether the scheduler found the pod unschedulable (not bound, `PodScheduled=False` reason
/// `Unschedulable`), and that condition's message then.
fn scheduling(status: Option<&PodStatus>, spec: &PodSpec) -> (bool, Option<String>) {
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let unschedulable = spec.node_name.is_none()
        && scheduled.is_some_and(|c| c.reason.as_deref() == Some("Unschedulable"));
    let message = scheduled
        .and_then(|c| c.message.clone())
        .filter(|_| unschedulable);
    (unschedulable, message)
}

fn tolerations(spec: &PodSpec) -> Vec<Toleration> {
    spec.tolerations
        .iter()
        .flatten()
        .map(|t| Toleration {
            key: t.key.clone().filter(|k| !k.is_empty()),
            exists: t.operator.as_deref() == Some("Exists"),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.as_deref().and_then(effect),
        })
        .collect()
}

/// The names of the pod's node-local volumes (hostPath, emptyDir not in memory), and the
/// claims its volumes mount.
fn volumes(spec: &PodSpec, pod: &str) -> (Vec<String>, Vec<String>) {
    let mut local = Vec::new();
    let mut claims = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if v.host_path.is_some()
            || v.empty_dir
                .as_ref()
                .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
        {
            local.push(v.name.clone());
        }
        match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => claims.push(c.claim_name.clone()),
            // A generic ephemeral volume's claim is named after the pod and the volume.
            (None, Some(_)) => claims.push(format!("{pod}-{}", v.name)),
            (None, None) => {}
        }
    }
    (local, claims)
}

/// `protocol/port` of every host port the pod's containers ask for.
fn host_ports(spec: &PodSpec) -> Vec<String> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|h| *h > 0)?;
            Some(format!("{}/{port}", p.protocol.as_deref().unwrap_or("TCP")))
        })
        .collect()
}

/// A PersistentVolume as the autoscaler's volume rules read it.
pub fn pv_from_kube(pv: &KubePersistentVolume) -> PersistentVolume {
    let spec = pv.spec.as_ref();
    PersistentVolume {
        name: pv.metadata.name.clone().unwrap_or_default(),
        claim: spec.and_then(|s| s.claim_ref.as_ref()).and_then(|r| {
            Some(ClaimRef {
                namespace: r.namespace.clone()?,
                name: r.name.clone()?,
            })
        }),
        node_affinity: spec
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(|r| node_terms(&r.node_selector_terms)),
    }
}

/// A PodDisruptionBudget as the autoscaler's budget rules read it.
pub fn pdb_from_kube(pdb: &PodDisruptionBudget) -> DisruptionBudget {
    DisruptionBudget {
        namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
        name: pdb.metadata.name.clone().unwrap_or_default(),
        selector: pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .map(label_selector),
        allowed: pdb
            .status
            .as_ref()
            .map_or(0, |s| u32::try_from(s.disruptions_allowed).unwrap_or(0)),
    }
}

/// A Node's `spec.taints` (effects we do not know are dropped).
pub fn taints(node: &KubeNode) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some(Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: effect(&t.effect)?,
            })
        })
        .collect()
}

/// A Node's `status.allocatable`.
pub fn allocatable(node: &KubeNode) -> Allocatable {
    let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let r = resources(alloc);
    Allocatable {
        cpu_milli: r.cpu_milli,
        memory: r.memory,
        pods: alloc
            .and_then(|a| a.get("pods"))
            .and_then(|q| quantity(&q.0))
            .map_or(0, |n| n as u32),
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(v: Value) -> Pod {
        pod_from_kube(&serde_json::from_value::<KubePod>(v).expect("pod"))
    }

    fn containers(spec: Value) -> Pod {
        pod(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}))
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("900m"), Some(0.9));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("1Gi"), Some(1073741824.0));
        assert_eq!(quantity("1e3"), Some(1000.0));
        assert_eq!(quantity("12Q"), None);
    }

    #[test]
    fn pending_unschedulable_pod_with_constraints() {
        let p = pod(json!({
            "metadata": {"name": "web-1", "namespace": "kube-system", "labels": {"app": "dns"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                    "uid": "u", "controller": true}]},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "900m", "memory": "64Mi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "100m"}}}],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
                "nodeSelector": {"disk": "ssd"},
                "tolerations": [{"key": "accel", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/1 nodes are available: 1 Insufficient cpu."}]}
        }));
        assert!(p.unschedulable && !p.finished);
        assert_eq!(
            p.scheduler_message.as_deref(),
            Some("0/1 nodes are available: 1 Insufficient cpu.")
        );
        assert_eq!(p.key(), "kube-system/web-1");
        assert_eq!(
            p.requests.cpu_milli, 2000,
            "init container is larger than the sum"
        );
        assert_eq!(p.requests.memory, 64 << 20);
        assert_eq!(p.owner_key().as_deref(), Some("kube-system/ReplicaSet/rs"));
        assert_eq!(p.node_selector["disk"], "ssd");
        assert_eq!(
            p.affinity_terms,
            vec![vec![LabelRequirement {
                key: "zone".into(),
                op: LabelOp::In,
                values: vec!["a".into()],
                field: false,
            }]]
        );
        assert_eq!(p.tolerations[0].key.as_deref(), Some("accel"));
        assert!(p.tolerations[0].exists);
        assert_eq!(p.tolerations[0].effect, Some(TaintEffect::NoSchedule));
        assert_eq!(p.labels["app"], "dns");
    }

    #[test]
    fn finished_pods_say_so_and_bound_ones_are_not_unschedulable() {
        let done = pod(json!({"metadata": {"name": "j"},
            "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Succeeded"}}));
        assert!(done.finished);
        let failed = pod(json!({"metadata": {"name": "j"},
            "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Failed"}}));
        assert!(failed.finished);
        // Bound already: the stale condition does not make it unschedulable, nor its message
        // a refusal to judge.
        let run = pod(json!({"metadata": {"name": "r", "namespace": "default"},
            "spec": {"containers": [{"name": "a"}], "nodeName": "w1"},
            "status": {"phase": "Running", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable", "message": "old"}]}}));
        assert!(!run.finished && !run.unschedulable);
        assert_eq!(run.scheduler_message, None);
        assert_eq!(run.node.as_deref(), Some("w1"));
        assert_eq!(run.controller, None);
        // Another reason than Unschedulable (e.g. SchedulerError) is not the scheduler's "no".
        let err = pod(
            json!({"metadata": {"name": "e"}, "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "SchedulerError", "message": "boom"}]}}),
        );
        assert!(!err.unschedulable);
        assert_eq!(err.scheduler_message, None);
    }

    /// PodRequests: containers and sidecars summed; an init container counts with the sidecars
    /// started before it; the larger wins per resource; overhead on top.
    #[test]
    fn requests_of_init_containers_sidecars_and_overhead() {
        let p = containers(json!({
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "100Mi"}}}],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "250m", "memory": "50Mi"}}},
                {"name": "migrate", "resources": {"requests": {"cpu": "600m", "memory": "10Mi"}}}],
            "overhead": {"cpu": "10m", "memory": "1Mi"}
        }));
        // Containers + sidecar = 750m/150Mi; migrate + sidecar = 850m/60Mi; max per
        // resource = 850m/150Mi; plus overhead.
        assert_eq!(p.requests.cpu_milli, 860);
        assert_eq!(p.requests.memory, 151 << 20);
        // A sidecar started after an init container does not add to that one's need.
        let p = containers(json!({
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}}}],
            "initContainers": [
                {"name": "first", "resources": {"requests": {"cpu": "1"}}},
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}}]
        }));
        assert_eq!(p.requests.cpu_milli, 1000);
        // No requests at all: nothing.
        let p = containers(json!({"containers": [{"name": "a"}]}));
        assert_eq!(p.requests, Resources::default());
        // Fractions of a millicore and of a byte round up.
        let p = containers(json!({"containers": [{"name": "a",
            "resources": {"requests": {"cpu": "100u", "memory": "1.5"}}}]}));
        assert_eq!(p.requests.cpu_milli, 1);
        assert_eq!(p.requests.memory, 2);
    }

    #[test]
    fn affinity_terms_keep_match_fields_and_unknown_operators_meet_nothing() {
        let p = containers(json!({"containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [
                        {"key": "cores", "operator": "Gt", "values": ["4"]},
                        {"key": "gpu", "operator": "DoesNotExist"}],
                     "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w1"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference":
                    {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}]}}}));
        let [first, second] = p.affinity_terms.as_slice() else {
            panic!("two terms: {:?}", p.affinity_terms)
        };
        let ops: Vec<(LabelOp, bool)> = first.iter().map(|r| (r.op, r.field)).collect();
        assert_eq!(
            ops,
            [
                (LabelOp::Gt, false),
                (LabelOp::DoesNotExist, false),
                (LabelOp::In, true)
            ]
        );
        assert_eq!(first[0].values, ["4"]);
        assert_eq!(first[2].key, "metadata.name");
        let labels = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
        assert_eq!(second[0].op, LabelOp::In);
        assert!(second[0].values.is_empty());
        assert!(!second[0].matches(&labels, "w1"), "unknown operator");
        // Preferred terms are not requirements.
        let none = containers(json!({"containers": [], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference":
                {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}]}}}));
        assert!(none.affinity_terms.is_empty());
    }

    #[test]
    fn tolerations_as_written() {
        let p = containers(json!({"containers": [], "tolerations": [
            {"operator": "Exists"},
            {"key": "", "operator": "Exists", "effect": "NoExecute"},
            {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
            {"key": "k", "value": "v"},
            {"key": "odd", "effect": "Sometimes"}]}));
        let t = &p.tolerations;
        assert_eq!(t.len(), 5);
        assert_eq!(
            (t[0].key.as_deref(), t[0].exists, t[0].effect),
            (None, true, None)
        );
        assert_eq!(
            (t[1].key.as_deref(), t[1].effect),
            (None, Some(TaintEffect::NoExecute)),
            "an empty key is no key"
        );
        assert_eq!(
            (t[2].key.as_deref(), t[2].exists, t[2].value.as_str()),
            (Some("dedicated"), false, "gpu")
        );
        assert_eq!(
            (t[3].exists, t[3].effect),
            (false, None),
            "Equal by default"
        );
        assert_eq!(t[4].effect, None, "an effect we do not know: every effect");
    }

    #[test]
    fn volumes_local_ones_and_claims() {
        let p = pod(json!({"metadata": {"name": "db-0", "namespace": "data"},
            "spec": {"containers": [], "volumes": [
                {"name": "host", "hostPath": {"path": "/var/log"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}},
                {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "conf", "configMap": {"name": "c"}}]}}));
        assert_eq!(p.local_volumes, ["host", "scratch"]);
        assert_eq!(p.claims, ["data-db-0", "db-0-tmp"]);
        assert!(containers(json!({"containers": []})).claims.is_empty());
    }

    #[test]
    fn host_ports_of_containers_and_init_containers() {
        let p = containers(json!({
            "containers": [{"name": "a", "ports": [
                {"containerPort": 80, "hostPort": 8080},
                {"containerPort": 53, "hostPort": 53, "protocol": "UDP"},
                {"containerPort": 9000},
                {"containerPort": 9001, "hostPort": 0}]}],
            "initContainers": [{"name": "i", "ports": [{"containerPort": 1, "hostPort": 7000}]}]}));
        assert_eq!(p.host_ports, ["TCP/8080", "UDP/53", "TCP/7000"]);
    }

    #[test]
    fn only_the_controlling_owner_counts_and_annotations_are_kept() {
        let p = pod(json!({"metadata": {"name": "agent-x", "namespace": "mon",
            "annotations": {"kubernetes.io/config.mirror": "abc"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "w1", "uid": "n"},
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d",
                    "controller": true}]},
            "spec": {"containers": []},
            "status": {"nominatedNodeName": "w2", "phase": "Pending"}}));
        assert_eq!(
            p.controller,
            Some(Owner {
                kind: "DaemonSet".into(),
                name: "agent".into()
            })
        );
        assert_eq!(p.owner_key().as_deref(), Some("mon/DaemonSet/agent"));
        assert!(p.annotations.contains_key("kubernetes.io/config.mirror"));
        assert!(p.nominated);
        let bare = pod(json!({"metadata": {"name": "b", "namespace": "mon",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "w1", "uid": "n"}]},
            "spec": {"containers": [], "priority": -20},
            "status": {"nominatedNodeName": ""}}));
        assert_eq!(bare.controller, None);
        assert_eq!(bare.owner_key(), None);
        assert!(!bare.nominated, "an empty nomination is none");
        assert_eq!(bare.priority, Some(-20));
    }

    #[test]
    fn persistent_volumes_their_claim_and_node_affinity() {
        let pv = |v: Value| pv_from_kube(&serde_json::from_value(v).expect("pv"));
        let local = pv(json!({"metadata": {"name": "pvc-1"}, "spec": {
            "claimRef": {"namespace": "data", "name": "data-db-0"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["w2"]}]}]}}}}));
        assert_eq!(local.name, "pvc-1");
        assert_eq!(
            local.claim,
            Some(ClaimRef {
                namespace: "data".into(),
                name: "data-db-0".into()
            })
        );
        let terms = local.node_affinity.expect("pinned");
        assert_eq!(terms[0][0].key, "kubernetes.io/hostname");
        assert_eq!(terms[0][0].values, ["w2"]);
        let free = pv(json!({"metadata": {"name": "nfs"}, "spec": {
            "claimRef": {"name": "no-namespace"}}}));
        assert_eq!(
            free.claim, None,
            "a reference without a namespace binds nothing"
        );
        assert_eq!(free.node_affinity, None);
    }

    #[test]
    fn budgets_their_selector_and_allowed_disruptions() {
        let pdb = |v: Value| pdb_from_kube(&serde_json::from_value(v).expect("pdb"));
        let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let b = pdb(json!({"metadata": {"name": "db", "namespace": "data"},
            "spec": {"selector": {"matchLabels": {"app": "db"}, "matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["canary"]}]}},
            "status": {"disruptionsAllowed": 2, "currentHealthy": 3, "desiredHealthy": 1,
                "expectedPods": 3}}));
        assert_eq!(
            (b.namespace.as_str(), b.name.as_str(), b.allowed),
            ("data", "db", 2)
        );
        let sel = b.selector.expect("selector");
        assert!(sel.matches(&labels(&[("app", "db")])));
        assert!(!sel.matches(&labels(&[("app", "db"), ("tier", "canary")])));
        assert!(!sel.matches(&labels(&[("app", "web")])));
        // Not computed yet, or negative: none allowed.
        let fresh = pdb(json!({"metadata": {"name": "x", "namespace": "n"}, "spec": {}}));
        assert_eq!((fresh.allowed, fresh.selector), (0, None));
        let negative = pdb(json!({"metadata": {"name": "x", "namespace": "n"},
            "spec": {"selector": {}}, "status": {"disruptionsAllowed": -1, "currentHealthy": 0,
                "desiredHealthy": 1, "expectedPods": 1}}));
        assert_eq!(negative.allowed, 0);
        assert!(
            negative.selector.expect("empty").matches(&labels(&[])),
            "an empty selector selects every pod"
        );
        let odd = pdb(json!({"metadata": {"name": "x", "namespace": "n"},
            "spec": {"selector": {"matchExpressions": [
                {"key": "app", "operator": "Like", "values": ["db"]}]}}}));
        assert!(
            !odd.selector
                .expect("selector")
                .matches(&labels(&[("app", "db")])),
            "an operator we do not know selects nothing"
        );
    }

    #[test]
    fn node_taints_and_allocatable() {
        let n: KubeNode = serde_json::from_value(json!({
            "metadata": {"name": "w1", "labels": {"a": "b"},
                "annotations": {crate::domain::autoscale::SCALE_DOWN_DISABLED: "true"}},
            "spec": {"unschedulable": true,
                "taints": [{"key": "k", "value": "v", "effect": "NoExecute"},
                    {"key": "odd", "effect": "Sometimes"}]},
            "status": {"allocatable": {"cpu": "2", "memory": "3996Mi", "pods": "110"}}
        }))
        .expect("node");
        let v = crate::domain::autoscale::observe::node_view(
            &crate::adapters::kube_cluster::node_from_kube(&n),
            Some("workers".into()),
        );
        assert_eq!(v.allocatable.cpu_milli, 2000);
        assert_eq!(v.allocatable.memory, 3996 << 20);
        assert_eq!(v.max_pods, 110);
        assert!(v.cordoned);
        assert_eq!(v.taints.len(), 1, "an effect we do not know is dropped");
        assert_eq!(v.taints[0].effect, TaintEffect::NoExecute);
        assert_eq!(
            v.annotations[crate::domain::autoscale::SCALE_DOWN_DISABLED],
            "true"
        );
    }
}
