//! A minimal kube-scheduler: binds each Pending, unbound pod to a Node that passes the
//! default profile's filters the product and its tests rely on, in the scheduler's order
//! (NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit), scoring by least
//! allocated resources. A pod no Node admits gets `PodScheduled=False`, reason
//! `Unschedulable`, and the scheduler's `FitError` message ("0/3 nodes are available: 1
//! node(s) were unschedulable, 2 Insufficient cpu."). No preemption, no pod (anti-)affinity,
//! no topology spread, no ports, no volumes (see `tests/FIDELITY.md`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::controllers::{UNSCHEDULABLE_TAINT, meta, stamp, terminating};
use super::resources;
use super::store::Store;

/// `ErrReasonUnschedulable` (NodeUnschedulable).
const REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
/// `ErrReasonPod` (NodeAffinity).
const REASON_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";

/// A quantity in base units (cores for cpu, bytes for memory), as `resource.Quantity`.
pub(crate) fn quantity(s: &str) -> Option<f64> {
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

/// A pod's effective requests (`resourcehelper.PodRequests`): the sum over containers,
/// at least the largest init container; a limit stands in for a missing request (API
/// defaulting).
pub(crate) fn pod_requests(spec: &Value) -> BTreeMap<String, f64> {
    let of = |c: &Value| -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for field in ["limits", "requests"] {
            if let Some(m) = c["resources"][field].as_object() {
                for (k, v) in m {
                    let q = v
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string());
                    if let Some(q) = quantity(&q) {
                        out.insert(k.clone(), q);
                    }
                }
            }
        }
        out
    };
    let mut total: BTreeMap<String, f64> = BTreeMap::new();
    for c in spec["containers"].as_array().into_iter().flatten() {
        for (k, v) in of(c) {
            *total.entry(k).or_default() += v;
        }
    }
    for c in spec["initContainers"].as_array().into_iter().flatten() {
        for (k, v) in of(c) {
            let e = total.entry(k).or_default();
            *e = e.max(v);
        }
    }
    total
}

/// `v1helper.ToleratesTaint`.
fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let effect = toleration["effect"].as_str().unwrap_or_default();
    if !effect.is_empty() && taint["effect"] != effect {
        return false;
    }
    let key = toleration["key"].as_str().unwrap_or_default();
    if !key.is_empty() && taint["key"] != key {
        return false;
    }
    match toleration["operator"].as_str().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            toleration["value"].as_str().unwrap_or_default()
                == taint["value"].as_str().unwrap_or_default()
        }
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint of `node` the pod does not tolerate (the
/// TaintToleration filter; `skip_unschedulable` leaves the cordon taint to
/// NodeUnschedulable, which runs first).
pub(crate) fn untolerated_taint(spec: &Value, node: &Value, all: bool) -> Option<Value> {
    let tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    node["spec"]["taints"]
        .as_array()?
        .iter()
        .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")))
        .filter(|t| all || t["key"] != UNSCHEDULABLE_TAINT)
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .cloned()
}

fn requirement_matches(req: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = req["values"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let num = |s: &str| s.parse::<i64>().ok();
    match req["operator"].as_str().unwrap_or_default() {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(num), values.first().and_then(|v| num(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(num), values.first().and_then(|v| num(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// NodeAffinity's filter: every `nodeSelector` label, and one of the required
/// `nodeSelectorTerms` (matchExpressions on labels, matchFields on `metadata.name`).
pub(crate) fn matches_node_affinity(spec: &Value, node: &Value) -> bool {
    let labels = node["metadata"]["labels"].as_object();
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    if let Some(sel) = spec["nodeSelector"].as_object()
        && !sel.iter().all(|(k, v)| label(k) == v.as_str())
    {
        return false;
    }
    let Some(terms) = spec
        .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return true;
    };
    terms.iter().any(|term| {
        let exprs = term["matchExpressions"].as_array();
        let fields = term["matchFields"].as_array();
        if exprs.is_none_or(Vec::is_empty) && fields.is_none_or(Vec::is_empty) {
            return false;
        }
        exprs
            .into_iter()
            .flatten()
            .all(|r| requirement_matches(r, r["key"].as_str().and_then(label)))
            && fields.into_iter().flatten().all(|r| {
                r["key"] == "metadata.name" && requirement_matches(r, Some(meta(node, "name")))
            })
    })
}

/// Why `node` cannot take a pod asking for `want`, with `used` already requested and
/// `count` pods bound there (first failing filter, in the default profile's order).
fn filter(
    spec: &Value,
    node: &Value,
    want: &BTreeMap<String, f64>,
    used: &BTreeMap<String, f64>,
    count: usize,
) -> Vec<String> {
    let unschedulable_tolerated = spec["tolerations"].as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            tolerates(
                t,
                &json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}),
            )
        })
    });
    if node["spec"]["unschedulable"] == true && !unschedulable_tolerated {
        return vec![REASON_UNSCHEDULABLE.into()];
    }
    if let Some(t) = untolerated_taint(spec, node, false) {
        return vec![format!(
            "node(s) had untolerated taint {{{}: {}}}",
            t["key"].as_str().unwrap_or_default(),
            t["value"].as_str().unwrap_or_default()
        )];
    }
    if !matches_node_affinity(spec, node) {
        return vec![REASON_AFFINITY.into()];
    }
    let alloc = |k: &str| {
        node["status"]["allocatable"][k]
            .as_str()
            .and_then(quantity)
            .unwrap_or(0.0)
    };
    let mut reasons = Vec::new();
    if (count + 1) as f64 > alloc("pods") {
        reasons.push("Too many pods".to_owned());
    }
    for (k, v) in want {
        if *v > 0.0 && k != "pods" && *v > alloc(k) - used.get(k).copied().unwrap_or(0.0) {
            reasons.push(format!("Insufficient {k}"));
        }
    }
    reasons
}

/// One scheduling pass over every Pending, unbound pod (oldest first).
pub(crate) fn schedule(store: &mut Store, now: DateTime<Utc>) {
    let (pods, nodes) = (
        resources::by_path("", "v1", "pods").unwrap_or(0),
        resources::by_path("", "v1", "nodes").unwrap_or(0),
    );
    let node_list: Vec<Value> = store.iter(nodes, None).cloned().collect();
    let mut pending: Vec<Value> = store
        .iter(pods, None)
        .filter(|p| p["spec"]["nodeName"].as_str().is_none_or(str::is_empty))
        .filter(|p| !terminating(p) && p["status"]["phase"] == "Pending")
        .cloned()
        .collect();
    if pending.is_empty() {
        return;
    }
    pending.sort_by_key(|p| meta(p, "creationTimestamp").to_owned());
    for pod in pending {
        // Requests and pod counts of what is bound now (terminating pods still hold theirs).
        let mut used: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for p in store.iter(pods, None) {
            let Some(n) = p["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
                continue;
            };
            if matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) {
                continue;
            }
            *counts.entry(n.to_owned()).or_default() += 1;
            let u = used.entry(n.to_owned()).or_default();
            for (k, v) in pod_requests(&p["spec"]) {
                *u.entry(k).or_default() += v;
            }
        }
        let want = pod_requests(&pod["spec"]);
        let empty = BTreeMap::new();
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut best: Option<(f64, String)> = None;
        for node in &node_list {
            let name = meta(node, "name").to_owned();
            let u = used.get(&name).unwrap_or(&empty);
            let why = filter(
                &pod["spec"],
                node,
                &want,
                u,
                counts.get(&name).copied().unwrap_or(0),
            );
            if why.is_empty() {
                let score = allocated_fraction(node, u, &want);
                if best
                    .as_ref()
                    .is_none_or(|(s, n)| score < *s || (score == *s && name < *n))
                {
                    best = Some((score, name));
                }
            } else {
                for r in why {
                    *reasons.entry(r).or_default() += 1;
                }
            }
        }
        let mut pod = pod;
        let t = stamp(now);
        match best {
            Some((_, node)) => {
                pod["spec"]["nodeName"] = json!(node);
                set_condition(
                    &mut pod,
                    json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": t}),
                );
            }
            None => {
                let mut histogram: Vec<String> =
                    reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
                histogram.sort();
                let message = format!(
                    "0/{} nodes are available: {}.",
                    node_list.len(),
                    histogram.join(", ")
                );
                let cond = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": message, "lastTransitionTime": t});
                let same = pod["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "PodScheduled" && c["message"] == cond["message"])
                });
                if same {
                    continue;
                }
                set_condition(&mut pod, cond);
            }
        }
        if let Err(e) = store.upsert(pods, pod) {
            tracing::debug!(error = %e.message, "twin scheduler: binding refused");
        }
    }
}

/// LeastAllocated: the mean fraction of cpu and memory requested after placing the pod.
fn allocated_fraction(
    node: &Value,
    used: &BTreeMap<String, f64>,
    want: &BTreeMap<String, f64>,
) -> f64 {
    let mut sum = 0.0;
    for k in ["cpu", "memory"] {
        let alloc = node["status"]["allocatable"][k]
            .as_str()
            .and_then(quantity)
            .unwrap_or(0.0);
        if alloc > 0.0 {
            sum +=
                (used.get(k).copied().unwrap_or(0.0) + want.get(k).copied().unwrap_or(0.0)) / alloc;
        }
    }
    sum / 2.0
}

fn set_condition(pod: &mut Value, cond: Value) {
    let mut conditions = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c["type"] != cond["type"]);
    conditions.push(cond);
    pod["status"]["conditions"] = json!(conditions);
}
