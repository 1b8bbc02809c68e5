//! From Kubernetes objects to the autoscaler's views. Pure: the `Cluster` adapter lists the
//! objects, this turns them into [`PodView`]/[`NodeView`].
//!
//! Requests follow `PodRequests` (component-helpers `resource/helpers.go`): containers and
//! sidecars (init containers with `restartPolicy: Always`) summed, the larger of that and any
//! init container's (with the sidecars started before it), plus the pod overhead.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorTerm, PersistentVolume, Pod, ResourceRequirements,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{
    Budget, DEFAULT_MAX_PODS, LabelOp, LabelRequirement, NodeView, PinnedVolume, PodView,
    Resources, SAFE_TO_EVICT_LOCAL_VOLUMES, Toleration,
};
use crate::domain::model::{self, Allocatable};
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

fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && sel.match_expressions.iter().flatten().all(|e| {
            requirement(&e.key, &e.operator, e.values.clone().unwrap_or_default())
                .is_some_and(|r| r.matches(labels, ""))
        })
}

fn requirement(key: &str, op: &str, values: Vec<String>) -> Option<LabelRequirement> {
    let op = match op {
        "In" => LabelOp::In,
        "NotIn" => LabelOp::NotIn,
        "Exists" => LabelOp::Exists,
        "DoesNotExist" => LabelOp::DoesNotExist,
        "Gt" => LabelOp::Gt,
        "Lt" => LabelOp::Lt,
        _ => return None,
    };
    Some(LabelRequirement {
        key: key.to_owned(),
        op,
        values,
        field: false,
    })
}

/// Required node selector terms (`matchExpressions` and `matchFields`) as requirements; an
/// operator we do not know matches nothing, as in the scheduler.
fn node_terms(terms: &[NodeSelectorTerm]) -> Vec<Vec<LabelRequirement>> {
    terms
        .iter()
        .map(|t| {
            let exprs = t.match_expressions.iter().flatten().map(|e| (e, false));
            let fields = t.match_fields.iter().flatten().map(|e| (e, true));
            exprs
                .chain(fields)
                .map(|(e, field)| {
                    let values = e.values.clone().unwrap_or_default();
                    let mut r =
                        requirement(&e.key, &e.operator, values).unwrap_or(LabelRequirement {
                            key: e.key.clone(),
                            op: LabelOp::In,
                            values: Vec::new(),
                            field: false,
                        });
                    r.field = field;
                    r
                })
                .collect()
        })
        .collect()
}

/// Words of the scheduler (volumebinding plugin) for refusals that hold on every node,
/// however new: no added worker helps a pod refused for one of these.
const NODE_INDEPENDENT_REFUSALS: &[&str] = &[
    "pod has unbound immediate PersistentVolumeClaims",
    "bound to non-existent pv",
    "persistentvolumeclaim \"",
];

/// The scheduler's message, when it names only a refusal no new node changes.
fn refusal(message: &str) -> Option<String> {
    NODE_INDEPENDENT_REFUSALS
        .iter()
        .any(|w| message.contains(w))
        .then(|| message.to_owned())
}

fn effect(s: &str) -> Option<TaintEffect> {
    match s {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

/// The pod as the autoscaler sees it; None for pods that have finished (Succeeded/Failed)
/// and hold no resources. `pdbs` and `pvs` may be empty when they were not listed.
pub fn pod_view(
    pod: &Pod,
    pdbs: &[PodDisruptionBudget],
    pvs: &[PersistentVolume],
) -> Option<PodView> {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if matches!(phase, "Succeeded" | "Failed") {
        return None;
    }
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref()?;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let req = pod_requests(spec);
    let (unschedulable, refused) = scheduling(status, spec);
    let labels = meta.labels.clone().unwrap_or_default();
    let budgets = pod_budgets(pdbs, &namespace, &labels);
    let affinity_terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|ns| node_terms(&ns.node_selector_terms))
        .unwrap_or_default();
    let tolerations = pod_tolerations(spec);
    let annotations = meta.annotations.clone().unwrap_or_default();
    let (local_volumes, pinned) = pod_volumes(spec, &namespace, &name, &annotations, pvs);
    let host_ports = pod_host_ports(spec);
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let controller_kind = controller.map(|o| o.kind.clone());
    let ours = reconcile_pod(controller_kind.as_deref(), &labels);
    Some(PodView {
        owner: controller_key(pod),
        namespace,
        name,
        requests: req,
        node: spec.node_name.clone(),
        unschedulable,
        controller_kind,
        annotations,
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        affinity_terms,
        tolerations,
        budgets,
        priority: spec.priority,
        nominated: status
            .and_then(|s| s.nominated_node_name.as_deref())
            .is_some_and(|n| !n.is_empty()),
        host_ports,
        local_volumes,
        pinned,
        refusal: refused,
        ours,
    })
}

/// PodRequests: sidecars add to the containers' sum, each init container needs its own
/// requests plus the sidecars started before it.
fn pod_requests(spec: &k8s_openapi::api::core::v1::PodSpec) -> Resources {
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

/// Whether the scheduler found the pod unschedulable, and its refusal that no new node
/// changes, if it gave one.
fn scheduling(
    status: Option<&k8s_openapi::api::core::v1::PodStatus>,
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> (bool, Option<String>) {
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let unschedulable = spec.node_name.is_none()
        && scheduled.is_some_and(|c| c.reason.as_deref() == Some("Unschedulable"));
    let refused = scheduled
        .and_then(|c| c.message.as_deref())
        .filter(|_| unschedulable)
        .and_then(refusal);
    (unschedulable, refused)
}

/// The disruption budgets of the pod's namespace that select it.
fn pod_budgets(
    pdbs: &[PodDisruptionBudget],
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<Budget> {
    pdbs.iter()
        .filter(|b| {
            b.metadata.namespace.as_deref() == Some(namespace)
                && b.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .is_some_and(|sel| selector_matches(sel, labels))
        })
        .map(|b| Budget {
            key: format!(
                "{}/{}",
                namespace,
                b.metadata.name.as_deref().unwrap_or_default()
            ),
            allowed: b
                .status
                .as_ref()
                .map_or(0, |s| u32::try_from(s.disruptions_allowed).unwrap_or(0)),
        })
        .collect()
}

fn pod_tolerations(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<Toleration> {
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

/// The pod's node-local volumes (those not annotated safe to evict), and the volumes whose
/// bound PersistentVolume pins it to some nodes.
fn pod_volumes(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    namespace: &str,
    name: &str,
    annotations: &BTreeMap<String, String>,
    pvs: &[PersistentVolume],
) -> (Vec<String>, Vec<PinnedVolume>) {
    let lossless: Vec<&str> = annotations
        .get(SAFE_TO_EVICT_LOCAL_VOLUMES)
        .map(|v| v.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let mut local_volumes = Vec::new();
    let mut pinned = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let local = v.host_path.is_some()
            || v.empty_dir
                .as_ref()
                .is_some_and(|e| e.medium.as_deref() != Some("Memory"));
        if local && !lossless.contains(&v.name.as_str()) {
            local_volumes.push(v.name.clone());
        }
        let claim = match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            // A generic ephemeral volume's claim is named after the pod and the volume.
            (None, Some(_)) => Some(format!("{name}-{}", v.name)),
            (None, None) => None,
        };
        let Some(claim) = claim else { continue };
        let bound = pvs.iter().find(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|r| {
                    r.namespace.as_deref() == Some(namespace)
                        && r.name.as_deref() == Some(claim.as_str())
                })
        });
        if let Some(terms) = bound
            .and_then(|pv| pv.spec.as_ref())
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(|r| node_terms(&r.node_selector_terms))
        {
            pinned.push(PinnedVolume {
                pv: bound
                    .and_then(|pv| pv.metadata.name.clone())
                    .unwrap_or_default(),
                terms,
            });
        }
    }
    (local_volumes, pinned)
}

/// `protocol/port` of every host port the pod's containers ask for.
fn pod_host_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<String> {
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

/// The reconcile Jobs' pods (k8s-cronjobs/cronjob.yaml's pod template labels).
fn reconcile_pod(controller_kind: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
    controller_kind == Some("Job")
        && labels.get("app.kubernetes.io/name").map(String::as_str) == Some("oxide-controller")
        && labels
            .get("app.kubernetes.io/component")
            .map(String::as_str)
            == Some("reconcile")
}

/// `namespace/Kind/name` of the pod's controlling owner, if it has one.
pub fn controller_key(pod: &Pod) -> Option<String> {
    let o = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    Some(format!(
        "{}/{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        o.kind,
        o.name
    ))
}

/// Whether some pod mounts a PersistentVolumeClaim (then the volumes are worth listing).
pub fn mounts_claims(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
}

/// A Node's `spec.taints` (effects we do not know are dropped).
pub fn taints(node: &Node) -> Vec<Taint> {
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
pub fn allocatable(node: &Node) -> Allocatable {
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

/// The node as the autoscaler sees it; `pool` is the worker pool it belongs to, if any.
pub fn node_view(node: &model::Node, pool: Option<String>) -> NodeView {
    NodeView {
        name: node.name.clone(),
        pool,
        allocatable: Resources {
            cpu_milli: node.allocatable.cpu_milli,
            memory: node.allocatable.memory,
        },
        max_pods: if node.allocatable.pods == 0 {
            DEFAULT_MAX_PODS
        } else {
            node.allocatable.pods
        },
        labels: node.labels.clone(),
        taints: node.taints.clone(),
        annotations: node.annotations.clone(),
        cordoned: node.unschedulable,
        not_ready: !node.is_ready(),
        removing: node.being_removed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
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
        let p = pod(serde_json::json!({
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
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }));
        let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "dns", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"app": "dns"}}}
        }))
        .expect("pdb");
        let v = pod_view(&p, &[pdb], &[]).expect("active");
        assert!(v.unschedulable);
        assert_eq!(
            v.requests.cpu_milli, 2000,
            "init container is larger than the sum"
        );
        assert_eq!(v.requests.memory, 64 << 20);
        assert_eq!(v.controller_kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(v.budgets.len(), 1);
        assert_eq!(v.node_selector["disk"], "ssd");
        assert_eq!(v.affinity_terms[0][0].op, LabelOp::In);
        assert_eq!(v.tolerations[0].key.as_deref(), Some("accel"));
        assert!(v.tolerations[0].exists);
        let v = pod_view(&p, &[], &[]).expect("active");
        assert!(v.budgets.is_empty());
    }

    #[test]
    fn finished_pods_are_skipped_and_running_ones_are_not_unschedulable() {
        let done = pod(serde_json::json!({"metadata": {"name": "j"},
            "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Succeeded"}}));
        assert!(pod_view(&done, &[], &[]).is_none());
        let run = pod(
            serde_json::json!({"metadata": {"name": "r", "namespace": "default"},
            "spec": {"containers": [{"name": "a"}], "nodeName": "w1"},
            "status": {"phase": "Running"}}),
        );
        let v = pod_view(&run, &[], &[]).expect("active");
        assert!(!v.unschedulable);
        assert_eq!(v.node.as_deref(), Some("w1"));
        assert_eq!(v.controller_kind, None);
    }

    #[test]
    fn node_from_kube() {
        let n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w1", "labels": {"a": "b"},
                "annotations": {super::super::SCALE_DOWN_DISABLED: "true"}},
            "spec": {"unschedulable": true,
                "taints": [{"key": "k", "value": "v", "effect": "NoExecute"}]},
            "status": {"allocatable": {"cpu": "2", "memory": "3996Mi", "pods": "110"}}
        }))
        .expect("node");
        let v = node_view(
            &crate::adapters::kube_cluster::node_from_kube(&n),
            Some("workers".into()),
        );
        assert_eq!(v.allocatable.cpu_milli, 2000);
        assert_eq!(v.allocatable.memory, 3996 << 20);
        assert_eq!(v.max_pods, 110);
        assert!(v.cordoned);
        assert_eq!(v.taints[0].effect, TaintEffect::NoExecute);
        assert_eq!(v.annotations[super::super::SCALE_DOWN_DISABLED], "true");
    }
}
