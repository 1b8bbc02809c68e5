//! What runs beside a real apiserver and changes objects on its own, reduced to what the
//! product and its tests meet: the node lifecycle controller's NoSchedule taints, the
//! Deployment, ReplicaSet and DaemonSet controllers, the garbage collector for their pods,
//! the scheduler ([`super::scheduler`]) and the kubelet (pods bound to a Ready node start;
//! pods past their grace period and free of finalizers go away).
//!
//! They run synchronously, to a fixed point, before the twin serves each request
//! ([`Store::settle`]): a real cluster gets there within milliseconds to seconds; the twin
//! gets there before anyone can look. Sources are cited in `tests/FIDELITY.md` ("Kubernetes
//! twin"); simplifications are listed there too (no rolling update: a Deployment's old
//! ReplicaSets go to zero at once; no preemption; no PodGC quarantine).
//!
//! What does not live here: API semantics of single writes (store), HTTP (server).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::resources;
use super::scheduler;
use super::store::{Store, WriteCtx};

/// Taint the node lifecycle controller puts on a cordoned Node.
pub(crate) const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

fn rid(group: &str, resource: &str) -> usize {
    resources::by_path(group, "v1", resource).unwrap_or(resources::NAMESPACES)
}

pub(crate) fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

pub(crate) fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The controller owner reference's uid, if any.
fn controller_uid(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
}

fn controller_ref(owner: &Value) -> Value {
    json!([{
        "apiVersion": owner["apiVersion"].clone(),
        "kind": owner["kind"].clone(),
        "name": meta(owner, "name"),
        "uid": meta(owner, "uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

pub(crate) fn terminating(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
}

fn terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

pub(crate) fn condition_true(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

/// Counts as "active" for a ReplicaSet or DaemonSet (`controller.FilterActivePods`).
fn active(pod: &Value) -> bool {
    !terminating(pod) && !terminal(pod)
}

impl Store {
    /// Runs the controllers, the scheduler and the kubelet until nothing changes (bounded).
    pub fn settle(&mut self, now: DateTime<Utc>) {
        for _ in 0..8 {
            let before = self.resource_version();
            self.node_taints();
            self.garbage_collect();
            self.deployments();
            self.replica_sets();
            self.daemon_sets();
            scheduler::schedule(self, now);
            self.kubelet(now);
            if self.resource_version() == before {
                break;
            }
        }
    }

    fn write(&mut self, rid: usize, obj: Value) {
        if let Err(e) = self.upsert(rid, obj) {
            tracing::debug!(error = %e.message, "twin controller: write refused");
        }
    }

    /// `doNoScheduleTaintingPass`: Ready=False → not-ready, Ready=Unknown (or no condition)
    /// → unreachable, `spec.unschedulable` → unschedulable; all NoSchedule.
    fn node_taints(&mut self) {
        let nodes = rid("", "nodes");
        let all: Vec<Value> = self.iter(nodes, None).cloned().collect();
        for node in all {
            let ready = node["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .and_then(|c| c["status"].as_str())
                .unwrap_or("Unknown")
                .to_owned();
            let mut want: Vec<&str> = Vec::new();
            match ready.as_str() {
                "True" => {}
                "False" => want.push(NOT_READY_TAINT),
                _ => want.push(UNREACHABLE_TAINT),
            }
            if node["spec"]["unschedulable"] == true {
                want.push(UNSCHEDULABLE_TAINT);
            }
            let managed = [NOT_READY_TAINT, UNREACHABLE_TAINT, UNSCHEDULABLE_TAINT];
            let taints: Vec<Value> = node["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut next: Vec<Value> = taints
                .iter()
                .filter(|t| {
                    let key = t["key"].as_str().unwrap_or_default();
                    !(managed.contains(&key) && t["effect"] == "NoSchedule") || want.contains(&key)
                })
                .cloned()
                .collect();
            for key in &want {
                if !next
                    .iter()
                    .any(|t| t["key"] == *key && t["effect"] == "NoSchedule")
                {
                    next.push(
                        json!({"key": key, "effect": "NoSchedule", "timeAdded": stamp(Utc::now())}),
                    );
                }
            }
            if next != taints {
                let mut node = node;
                if next.is_empty() {
                    if let Some(spec) = node["spec"].as_object_mut() {
                        spec.remove("taints");
                    }
                } else {
                    node["spec"]["taints"] = json!(next);
                }
                self.write(nodes, node);
            }
        }
    }

    /// The garbage collector, for what these controllers own: pods of a vanished
    /// ReplicaSet/DaemonSet, ReplicaSets of a vanished Deployment (background propagation).
    fn garbage_collect(&mut self) {
        let (pods, rss, dss, deps) = (
            rid("", "pods"),
            rid("apps", "replicasets"),
            rid("apps", "daemonsets"),
            rid("apps", "deployments"),
        );
        let uids = |store: &Store, r: usize| -> Vec<String> {
            store
                .iter(r, None)
                .map(|o| meta(o, "uid").to_owned())
                .collect()
        };
        let owners: Vec<String> = [rss, dss, deps]
            .into_iter()
            .flat_map(|r| uids(self, r))
            .collect();
        for (r, kinds) in [
            (pods, &["ReplicaSet", "DaemonSet"][..]),
            (rss, &["Deployment"][..]),
        ] {
            let orphans: Vec<(String, String)> = self
                .iter(r, None)
                .filter(|o| !terminating(o))
                .filter(|o| {
                    o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| {
                            refs.iter().any(|r| {
                                r["controller"] == true
                                    && kinds.iter().any(|k| r["kind"] == *k)
                                    && !owners.iter().any(|u| r["uid"] == *u)
                            })
                        })
                })
                .map(|o| (meta(o, "namespace").to_owned(), meta(o, "name").to_owned()))
                .collect();
            for (ns, name) in orphans {
                let _ = self.delete(r, &ns, &name, &Value::Null, false);
            }
        }
    }

    /// The Deployment controller without rolling updates: one ReplicaSet per pod template
    /// (named `<deployment>-<pod-template-hash>`) at `spec.replicas`, the others at zero.
    fn deployments(&mut self) {
        let (deps, rss, pods) = (
            rid("apps", "deployments"),
            rid("apps", "replicasets"),
            rid("", "pods"),
        );
        let all: Vec<Value> = self.iter(deps, None).cloned().collect();
        for d in all {
            if terminating(&d) {
                continue;
            }
            let ns = meta(&d, "namespace").to_owned();
            let replicas = d["spec"]["replicas"].as_i64().unwrap_or(1);
            let template = d["spec"]["template"].clone();
            let hash = template_hash(&template);
            let name = format!("{}-{hash}", meta(&d, "name"));
            let owned: Vec<Value> = self
                .iter(rss, Some(&ns))
                .filter(|rs| controller_uid(rs) == Some(meta(&d, "uid")))
                .cloned()
                .collect();
            for rs in &owned {
                if meta(rs, "name") != name && rs["spec"]["replicas"].as_i64() != Some(0) {
                    let mut rs = rs.clone();
                    rs["spec"]["replicas"] = json!(0);
                    self.write(rss, rs);
                }
            }
            let mut rs = match owned.iter().find(|rs| meta(rs, "name") == name) {
                Some(rs) => rs.clone(),
                None => {
                    let mut template = template.clone();
                    template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                    let mut selector = d["spec"]["selector"].clone();
                    selector["matchLabels"]["pod-template-hash"] = json!(hash);
                    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "metadata": {"name": name, "namespace": ns,
                            "labels": template["metadata"]["labels"].clone(),
                            "ownerReferences": controller_ref(&d)},
                        "spec": {"replicas": replicas, "selector": selector, "template": template},
                        "status": {"replicas": 0}})
                }
            };
            if rs["spec"]["replicas"].as_i64() != Some(replicas) || rs["metadata"]["uid"].is_null()
            {
                rs["spec"]["replicas"] = json!(replicas);
                self.write(rss, rs);
            }
            // Status from the pods of every ReplicaSet it owns.
            let rs_uids: Vec<String> = self
                .iter(rss, Some(&ns))
                .filter(|rs| controller_uid(rs) == Some(meta(&d, "uid")))
                .map(|rs| meta(rs, "uid").to_owned())
                .collect();
            let current = self
                .iter(rss, Some(&ns))
                .find(|rs| meta(rs, "name") == name)
                .map(|rs| meta(rs, "uid").to_owned());
            let (mut total, mut ready, mut updated) = (0, 0, 0);
            for p in self.iter(pods, Some(&ns)).filter(|p| active(p)) {
                let Some(owner) = controller_uid(p) else {
                    continue;
                };
                if rs_uids.iter().any(|u| u == owner) {
                    total += 1;
                    if condition_true(p, "Ready") {
                        ready += 1;
                    }
                    if current.as_deref() == Some(owner) {
                        updated += 1;
                    }
                }
            }
            let mut status = json!({
                "observedGeneration": d["metadata"]["generation"].clone(),
                "replicas": total, "updatedReplicas": updated,
                "readyReplicas": ready, "availableReplicas": ready,
                "unavailableReplicas": (replicas - ready).max(0),
            });
            let available = if ready >= replicas { "True" } else { "False" };
            status["conditions"] = json!([{"type": "Available", "status": available,
                "reason": if available == "True" { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }}]);
            if d["status"] != status {
                let mut d = d;
                d["status"] = status;
                self.write(deps, d);
            }
        }
    }

    /// The ReplicaSet controller: as many active pods as `spec.replicas` (new ones from
    /// the template, Pending and unbound; excess ones deleted, unscheduled and not-ready
    /// first), and the status counts.
    fn replica_sets(&mut self) {
        let (rss, pods) = (rid("apps", "replicasets"), rid("", "pods"));
        let all: Vec<Value> = self.iter(rss, None).cloned().collect();
        for rs in all {
            if terminating(&rs) {
                continue;
            }
            let ns = meta(&rs, "namespace").to_owned();
            let want = rs["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
            let mut mine: Vec<Value> = self
                .iter(pods, Some(&ns))
                .filter(|p| controller_uid(p) == Some(meta(&rs, "uid")) && active(p))
                .cloned()
                .collect();
            if mine.len() < want {
                for _ in mine.len()..want {
                    let pod = pod_from_template(&rs, &rs["spec"]["template"], &ns);
                    if let Ok(p) = self.create(pods, &ns, pod, &WriteCtx::default(), true) {
                        mine.push(p);
                    }
                }
            } else if mine.len() > want {
                // `getPodsToDelete`: unassigned before assigned, not-ready before ready.
                mine.sort_by_key(|p| {
                    (
                        !p["spec"]["nodeName"].is_null(),
                        condition_true(p, "Ready"),
                        std::cmp::Reverse(meta(p, "creationTimestamp").to_owned()),
                    )
                });
                for p in mine.drain(..mine.len() - want) {
                    let _ = self.delete(pods, &ns, meta(&p, "name"), &Value::Null, false);
                }
            }
            let ready = mine.iter().filter(|p| condition_true(p, "Ready")).count();
            let status = json!({"replicas": mine.len(), "fullyLabeledReplicas": mine.len(),
                "readyReplicas": ready, "availableReplicas": ready,
                "observedGeneration": rs["metadata"]["generation"].clone()});
            if rs["status"] != status {
                let mut rs = rs;
                rs["status"] = status;
                self.write(rss, rs);
            }
        }
    }

    /// The DaemonSet controller: one pod per Node that the template's node selector and
    /// affinity admit and whose NoSchedule/NoExecute taints it tolerates (with the
    /// tolerations the controller adds itself); placed through the scheduler by a required
    /// node affinity on `metadata.name`, as `ReplaceDaemonSetPodNodeNameNodeAffinity` does.
    fn daemon_sets(&mut self) {
        let (dss, pods, nodes) = (rid("apps", "daemonsets"), rid("", "pods"), rid("", "nodes"));
        let all: Vec<Value> = self.iter(dss, None).cloned().collect();
        let node_list: Vec<Value> = self.iter(nodes, None).cloned().collect();
        for ds in all {
            if terminating(&ds) {
                continue;
            }
            let ns = meta(&ds, "namespace").to_owned();
            let mut template = ds["spec"]["template"].clone();
            add_daemon_tolerations(&mut template["spec"]);
            let should_run: Vec<&str> = node_list
                .iter()
                .filter(|n| {
                    scheduler::matches_node_affinity(&template["spec"], n)
                        && scheduler::untolerated_taint(&template["spec"], n, true).is_none()
                })
                .map(|n| meta(n, "name"))
                .collect();
            let mine: Vec<Value> = self
                .iter(pods, Some(&ns))
                .filter(|p| controller_uid(p) == Some(meta(&ds, "uid")) && active(p))
                .cloned()
                .collect();
            let mut by_node: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for p in &mine {
                by_node
                    .entry(daemon_pod_node(p))
                    .or_default()
                    .push(p.clone());
            }
            for node in &should_run {
                if !by_node.contains_key(*node) {
                    let mut t = template.clone();
                    t["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]});
                    let pod = pod_from_template(&ds, &t, &ns);
                    let _ = self.create(pods, &ns, pod, &WriteCtx::default(), true);
                }
            }
            for (node, ps) in &by_node {
                let keep = usize::from(should_run.contains(&node.as_str()));
                for p in ps.iter().skip(keep) {
                    let _ = self.delete(pods, &ns, meta(p, "name"), &Value::Null, false);
                }
            }
            let scheduled = mine
                .iter()
                .filter(|p| !p["spec"]["nodeName"].is_null())
                .count();
            let ready = mine.iter().filter(|p| condition_true(p, "Ready")).count();
            let status = json!({"desiredNumberScheduled": should_run.len(),
                "currentNumberScheduled": scheduled, "updatedNumberScheduled": scheduled,
                "numberReady": ready, "numberAvailable": ready,
                "numberMisscheduled": 0,
                "observedGeneration": ds["metadata"]["generation"].clone()});
            if ds["status"] != status {
                let mut ds = ds;
                ds["status"] = status;
                self.write(dss, ds);
            }
        }
    }

    /// The kubelet of every Ready Node: a pod bound to it starts (Running, Ready); a pod
    /// being deleted is gone once its grace period is over and no finalizer holds it. A
    /// Node that is not Ready has no kubelet to do either.
    fn kubelet(&mut self, now: DateTime<Utc>) {
        let (pods, nodes) = (rid("", "pods"), rid("", "nodes"));
        let ready: Vec<String> = self
            .iter(nodes, None)
            .filter(|n| condition_true(n, "Ready"))
            .map(|n| meta(n, "name").to_owned())
            .collect();
        let all: Vec<Value> = self.iter(pods, None).cloned().collect();
        for pod in all {
            let node = pod["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if !ready.contains(&node) {
                continue;
            }
            if terminating(&pod) {
                let due = pod["metadata"]["deletionTimestamp"]
                    .as_str()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|t| t <= now);
                let held = pod["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if due && !held {
                    self.remove_now(pods, meta(&pod, "namespace"), meta(&pod, "name"));
                }
                continue;
            }
            if pod["status"]["phase"] == "Pending" {
                let t = stamp(now);
                let cond =
                    |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": t});
                let mut pod = pod;
                let host_ip = self
                    .iter(nodes, None)
                    .find(|n| meta(n, "name") == node)
                    .and_then(|n| n["status"]["addresses"].as_array().cloned())
                    .and_then(|a| {
                        a.iter()
                            .find(|a| a["type"] == "InternalIP")
                            .map(|a| a["address"].clone())
                    });
                pod["status"]["phase"] = json!("Running");
                pod["status"]["startTime"] = json!(t);
                pod["status"]["conditions"] = json!([
                    cond("Initialized"),
                    cond("Ready"),
                    cond("ContainersReady"),
                    cond("PodScheduled")
                ]);
                if let Some(ip) = host_ip {
                    pod["status"]["hostIP"] = ip;
                }
                self.write(pods, pod);
            }
        }
    }
}

/// The node a DaemonSet pod is for: its binding, or the `metadata.name` its affinity pins.
fn daemon_pod_node(pod: &Value) -> String {
    if let Some(n) = pod["spec"]["nodeName"].as_str() {
        return n.to_owned();
    }
    pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// `AddOrUpdateDaemonPodTolerations`: DaemonSet pods tolerate not-ready, unreachable
/// (NoExecute), the pressure taints, unschedulable (NoSchedule) and network-unavailable.
fn add_daemon_tolerations(spec: &mut Value) {
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for (key, effect) in [
        (NOT_READY_TAINT, "NoExecute"),
        (UNREACHABLE_TAINT, "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        (UNSCHEDULABLE_TAINT, "NoSchedule"),
        ("node.kubernetes.io/network-unavailable", "NoSchedule"),
    ] {
        if !tolerations
            .iter()
            .any(|t| t["key"] == key && t["effect"] == effect)
        {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": effect}));
        }
    }
    spec["tolerations"] = json!(tolerations);
}

/// A new pod of `owner` from `template`: generated name, template labels and annotations,
/// controller owner reference, Pending and unbound.
fn pod_from_template(owner: &Value, template: &Value, ns: &str) -> Value {
    let mut metadata = json!({
        "generateName": format!("{}-", meta(owner, "name")),
        "namespace": ns,
        "ownerReferences": controller_ref(owner),
    });
    for field in ["labels", "annotations"] {
        if template["metadata"][field].is_object() {
            metadata[field] = template["metadata"][field].clone();
        }
    }
    let mut spec = template["spec"].clone();
    if spec["terminationGracePeriodSeconds"].is_null() {
        spec["terminationGracePeriodSeconds"] = json!(30);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
        "status": {"phase": "Pending"}})
}

/// `pod-template-hash`: a stable short hash of the template, in the apiserver's
/// generateName alphabet (no vowels), so equal templates share a ReplicaSet.
fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    // FNV-1a over the canonical JSON: stable across runs (serde_json maps are sorted).
    let mut h: u64 = 0xcbf29ce484222325;
    for b in template.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    (0..10)
        .map(|i| ALPHABET[((h >> (i * 6)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}
