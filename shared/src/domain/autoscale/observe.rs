//! From the cluster's pods, budgets and volumes to the autoscaler's views. Pure: the `Cluster`
//! adapter lists them (already in domain types, [`crate::domain::model::Pod`] and friends), this joins
//! them into [`PodView`]/[`NodeView`]: which budgets select a pod, which of its volumes are
//! pinned to some nodes, which of its local volumes count, and whether the scheduler's refusal
//! is one no new node changes.

use std::collections::BTreeMap;

use super::{
    Budget, DEFAULT_MAX_PODS, NodeView, PinnedVolume, PodView, Resources,
    SAFE_TO_EVICT_LOCAL_VOLUMES,
};
use crate::domain::model::{self, DisruptionBudget, PersistentVolume, Pod};

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

/// The pod as the autoscaler sees it; None for pods that have finished (Succeeded/Failed)
/// and hold no resources. `pdbs` and `pvs` may be empty when they were not listed.
pub fn pod_view(pod: &Pod, pdbs: &[DisruptionBudget], pvs: &[PersistentVolume]) -> Option<PodView> {
    if pod.finished {
        return None;
    }
    let controller_kind = pod.controller.as_ref().map(|o| o.kind.clone());
    let ours = reconcile_pod(controller_kind.as_deref(), &pod.labels);
    Some(PodView {
        owner: pod.owner_key(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        requests: pod.requests,
        node: pod.node.clone(),
        unschedulable: pod.unschedulable,
        controller_kind,
        annotations: pod.annotations.clone(),
        node_selector: pod.node_selector.clone(),
        affinity_terms: pod.affinity_terms.clone(),
        tolerations: pod.tolerations.clone(),
        budgets: pod_budgets(pdbs, &pod.namespace, &pod.labels),
        priority: pod.priority,
        nominated: pod.nominated,
        host_ports: pod.host_ports.clone(),
        local_volumes: local_volumes(pod),
        pinned: pinned(pod, pvs),
        refusal: pod
            .scheduler_message
            .as_deref()
            .filter(|_| pod.unschedulable)
            .and_then(refusal),
        ours,
    })
}

/// The disruption budgets of the pod's namespace that select it.
fn pod_budgets(
    pdbs: &[DisruptionBudget],
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<Budget> {
    pdbs.iter()
        .filter(|b| {
            b.namespace == namespace && b.selector.as_ref().is_some_and(|s| s.matches(labels))
        })
        .map(|b| Budget {
            key: format!("{namespace}/{}", b.name),
            allowed: b.allowed,
        })
        .collect()
}

/// The pod's node-local volumes not annotated safe to evict.
fn local_volumes(pod: &Pod) -> Vec<String> {
    let lossless: Vec<&str> = pod
        .annotations
        .get(SAFE_TO_EVICT_LOCAL_VOLUMES)
        .map(|v| v.split(',').map(str::trim).collect())
        .unwrap_or_default();
    pod.local_volumes
        .iter()
        .filter(|v| !lossless.contains(&v.as_str()))
        .cloned()
        .collect()
}

/// The volumes whose bound PersistentVolume pins the pod to some nodes.
fn pinned(pod: &Pod, pvs: &[PersistentVolume]) -> Vec<PinnedVolume> {
    pod.claims
        .iter()
        .filter_map(|claim| {
            let bound = pvs.iter().find(|pv| {
                pv.claim
                    .as_ref()
                    .is_some_and(|c| c.namespace == pod.namespace && &c.name == claim)
            })?;
            Some(PinnedVolume {
                pv: bound.name.clone(),
                terms: bound.node_affinity.clone()?,
            })
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

/// Whether some pod mounts a PersistentVolumeClaim (then the volumes are worth listing).
pub fn mounts_claims(pod: &Pod) -> bool {
    !pod.claims.is_empty()
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
    use crate::domain::model::{ClaimRef, LabelOp, LabelRequirement, LabelSelector, Owner};

    fn pod(namespace: &str, name: &str) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            labels: BTreeMap::from([("app".to_owned(), "db".to_owned())]),
            controller: Some(Owner {
                kind: "StatefulSet".into(),
                name: "db".into(),
            }),
            ..Pod::default()
        }
    }

    fn budget(namespace: &str, name: &str, selector: Option<LabelSelector>) -> DisruptionBudget {
        DisruptionBudget {
            namespace: namespace.into(),
            name: name.into(),
            selector,
            allowed: 1,
        }
    }

    fn app(v: &str) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: BTreeMap::from([("app".to_owned(), v.to_owned())]),
            ..LabelSelector::default()
        })
    }

    #[test]
    fn the_budgets_of_its_namespace_that_select_it() {
        let pdbs = [
            budget("data", "db", app("db")),
            budget("other", "db", app("db")),
            budget("data", "web", app("web")),
            budget("data", "nothing", None),
            budget("data", "all", Some(LabelSelector::default())),
        ];
        let v = pod_view(&pod("data", "db-0"), &pdbs, &[]).expect("active");
        let keys: Vec<(&str, u32)> = v
            .budgets
            .iter()
            .map(|b| (b.key.as_str(), b.allowed))
            .collect();
        assert_eq!(keys, [("data/db", 1), ("data/all", 1)]);
        assert!(
            pod_view(&pod("data", "db-0"), &[], &[])
                .expect("active")
                .budgets
                .is_empty()
        );
    }

    #[test]
    fn local_volumes_named_safe_to_evict_do_not_count() {
        let mut p = pod("data", "db-0");
        p.local_volumes = vec!["cache".into(), "logs".into(), "scratch".into()];
        p.annotations
            .insert(SAFE_TO_EVICT_LOCAL_VOLUMES.into(), "cache, scratch".into());
        let v = pod_view(&p, &[], &[]).expect("active");
        assert_eq!(v.local_volumes, ["logs"]);
    }

    #[test]
    fn a_claim_bound_to_a_volume_with_node_affinity_pins_the_pod() {
        let here = vec![vec![LabelRequirement {
            key: "kubernetes.io/hostname".into(),
            op: LabelOp::In,
            values: vec!["w2".into()],
            field: false,
        }]];
        let pv = |name: &str, ns: &str, claim: &str, affinity: bool| PersistentVolume {
            name: name.into(),
            claim: Some(ClaimRef {
                namespace: ns.into(),
                name: claim.into(),
            }),
            node_affinity: affinity.then(|| here.clone()),
        };
        let pvs = [
            pv("elsewhere", "other", "data-db-0", true),
            pv("nfs", "data", "shared", false),
            pv("pvc-1", "data", "data-db-0", true),
            PersistentVolume {
                name: "unbound".into(),
                ..PersistentVolume::default()
            },
        ];
        let mut p = pod("data", "db-0");
        p.claims = vec!["shared".into(), "data-db-0".into(), "missing".into()];
        assert!(mounts_claims(&p));
        let v = pod_view(&p, &[], &pvs).expect("active");
        assert_eq!(
            v.pinned,
            [PinnedVolume {
                pv: "pvc-1".into(),
                terms: here.clone()
            }]
        );
        assert!(pod_view(&p, &[], &[]).expect("active").pinned.is_empty());
        assert!(!mounts_claims(&pod("data", "web")));
    }

    #[test]
    fn only_refusals_no_new_node_changes_are_kept_and_only_for_unschedulable_pods() {
        let mut p = pod("data", "db-0");
        p.unschedulable = true;
        p.scheduler_message = Some("0/2 nodes are available: 2 Insufficient cpu.".into());
        assert_eq!(pod_view(&p, &[], &[]).expect("active").refusal, None);
        let words = "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims.";
        p.scheduler_message = Some(words.into());
        let v = pod_view(&p, &[], &[]).expect("active");
        assert!(v.unschedulable);
        assert_eq!(v.refusal.as_deref(), Some(words));
        p.scheduler_message = Some("persistentvolumeclaim \"data\" not found".into());
        assert!(pod_view(&p, &[], &[]).expect("active").refusal.is_some());
        p.unschedulable = false;
        assert_eq!(pod_view(&p, &[], &[]).expect("active").refusal, None);
    }

    #[test]
    fn finished_pods_are_skipped_and_the_runs_own_pods_are_known() {
        let mut p = pod("kube-system", "oxide-controller-now-abcde");
        p.finished = true;
        assert!(pod_view(&p, &[], &[]).is_none());
        p.finished = false;
        let v = pod_view(&p, &[], &[]).expect("active");
        assert_eq!(v.controller_kind.as_deref(), Some("StatefulSet"));
        assert_eq!(v.owner.as_deref(), Some("kube-system/StatefulSet/db"));
        assert!(!v.ours);
        p.controller = Some(Owner {
            kind: "Job".into(),
            name: "oxide-controller-now".into(),
        });
        p.labels = BTreeMap::from([
            (
                "app.kubernetes.io/name".to_owned(),
                "oxide-controller".to_owned(),
            ),
            (
                "app.kubernetes.io/component".to_owned(),
                "reconcile".to_owned(),
            ),
        ]);
        assert!(pod_view(&p, &[], &[]).expect("active").ours);
        p.controller = None;
        let v = pod_view(&p, &[], &[]).expect("active");
        assert!(!v.ours, "a bare pod with our labels is not a run's");
        assert_eq!((v.controller_kind, v.owner), (None, None));
    }
}
