//! The static table of Kubernetes resources the twin serves, and the discovery documents
//! (`/api`, `/api/v1`, `/apis`, `/apis/{group}`, `/apis/{group}/{version}`, plain and
//! aggregated v2) derived from it. Nothing here touches stored objects.

use serde_json::{Value, json};

/// One served resource type (a row of the apiserver's REST storage map).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural resource name as it appears in paths and RBAC rules.
    pub resource: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Subresources served (`status`, `eviction`).
    pub subresources: &'static [&'static str],
    pub short_names: &'static [&'static str],
}

impl ResourceType {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether writes to the main resource must leave `status` alone (the apiserver's
    /// behaviour for every resource with a `status` subresource).
    pub fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }
}

const fn rt(
    group: &'static str,
    resource: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
    short_names: &'static [&'static str],
) -> ResourceType {
    let version = "v1";
    ResourceType {
        group,
        version,
        resource,
        singular,
        kind,
        namespaced,
        subresources,
        short_names,
    }
}

/// Every resource the twin serves. Index into this table is the store's resource id.
pub(crate) static RESOURCES: &[ResourceType] = &[
    rt(
        "",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &[],
        &["ns"],
    ),
    rt("", "nodes", "node", "Node", false, &["status"], &["no"]),
    rt("", "secrets", "secret", "Secret", true, &[], &[]),
    rt(
        "",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &[],
        &["cm"],
    ),
    rt(
        "",
        "pods",
        "pod",
        "Pod",
        true,
        &["status", "eviction"],
        &["po"],
    ),
    rt(
        "",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &[],
        &["sa"],
    ),
    rt(
        "",
        "services",
        "service",
        "Service",
        true,
        &["status"],
        &["svc"],
    ),
    rt("", "events", "event", "Event", true, &[], &["ev"]),
    rt(
        "apps",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["status"],
        &["deploy"],
    ),
    rt(
        "apps",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        &["status"],
        &["rs"],
    ),
    rt(
        "apps",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["status"],
        &["ds"],
    ),
    rt(
        "batch",
        "cronjobs",
        "cronjob",
        "CronJob",
        true,
        &["status"],
        &["cj"],
    ),
    rt("batch", "jobs", "job", "Job", true, &["status"], &[]),
    rt(
        "coordination.k8s.io",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "roles",
        "role",
        "Role",
        true,
        &[],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        &[],
    ),
    rt(
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        &[],
    ),
    rt(
        "policy",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["status"],
        &["pdb"],
    ),
    rt(
        "events.k8s.io",
        "events",
        "event",
        "Event",
        true,
        &[],
        &["ev"],
    ),
];

/// Store id of the `namespaces` resource.
pub(crate) const NAMESPACES: usize = 0;

/// Looks a resource up by its URL coordinates.
pub(crate) fn by_path(group: &str, version: &str, resource: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.resource == resource)
}

/// Looks a resource up by `apiVersion` + `kind` (as carried in object bodies).
pub(crate) fn by_kind(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.api_version() == api_version && r.kind == kind)
}

/// Looks a resource up by group + plural name (any version), for RBAC-style lookups.
pub(crate) fn by_group_resource(group: &str, resource: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.resource == resource)
}

/// Resource type by store id. Ids come from this table, so out-of-range is a bug; the
/// namespaces row is returned rather than panicking.
pub(crate) fn get(id: usize) -> &'static ResourceType {
    RESOURCES.get(id).unwrap_or(&RESOURCES[NAMESPACES])
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

fn subresource_verbs(sub: &str) -> Vec<&'static str> {
    match sub {
        "eviction" => vec!["create"],
        _ => vec!["get", "patch", "update"],
    }
}

/// `GET /api`: APIVersions.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_doc(group: &str) -> Value {
    let gv = format!("{group}/v1");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": "v1"}],
        "preferredVersion": {"groupVersion": gv, "version": "v1"}
    })
}

/// `GET /apis`: APIGroupList.
pub(crate) fn group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().map(group_doc).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`: APIGroup, or None when the group is not served.
pub(crate) fn group(group: &str) -> Option<Value> {
    if !groups().contains(&group) {
        return None;
    }
    let mut doc = group_doc(group);
    if let Some(map) = doc.as_object_mut() {
        map.insert("kind".into(), json!("APIGroup"));
        map.insert("apiVersion".into(), json!("v1"));
    }
    Some(doc)
}

/// `GET /api/v1` or `/apis/{group}/{version}`: APIResourceList, or None when not served.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let rows: Vec<&ResourceType> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rows.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in &rows {
        resources.push(json!({
            "name": r.resource,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
            "shortNames": r.short_names,
            "storageVersionHash": "",
        }));
        for sub in r.subresources {
            let (kind, group, version) = if *sub == "eviction" {
                ("Eviction", "policy", "v1")
            } else {
                (r.kind, r.group, r.version)
            };
            let mut entry = json!({
                "name": format!("{}/{}", r.resource, sub),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": subresource_verbs(sub),
            });
            if *sub == "eviction"
                && let Some(map) = entry.as_object_mut()
            {
                map.insert("group".into(), json!(group));
                map.insert("version".into(), json!(version));
            }
            resources.push(entry);
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": rows[0].api_version(),
        "resources": resources,
    }))
}

/// Content type of aggregated discovery answers.
pub(crate) const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

fn aggregated_group(group: &str) -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group)
        .map(|r| {
            let subs: Vec<Value> = r
                .subresources
                .iter()
                .map(|sub| {
                    let (kind, g) = if *sub == "eviction" {
                        ("Eviction", "policy")
                    } else {
                        (r.kind, r.group)
                    };
                    json!({
                        "subresource": sub,
                        "responseKind": {"group": g, "version": "v1", "kind": kind},
                        "verbs": subresource_verbs(sub),
                    })
                })
                .collect();
            json!({
                "resource": r.resource,
                "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": VERBS,
                "shortNames": r.short_names,
                "subresources": subs,
            })
        })
        .collect();
    let mut doc = json!({
        "metadata": {"creationTimestamp": null},
        "versions": [{"version": "v1", "resources": resources, "freshness": "Current"}],
    });
    if !group.is_empty()
        && let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("name".into(), json!(group));
    }
    doc
}

/// Aggregated discovery (apidiscovery.k8s.io/v2) for `/api` (core) or `/apis` (all groups).
pub(crate) fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group("")]
    } else {
        groups().into_iter().map(aggregated_group).collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// `group/version` path key of the OpenAPI v3 root (`api/v1`, `apis/apps/v1`).
fn openapi_key(group: &str) -> String {
    if group.is_empty() {
        "api/v1".into()
    } else {
        format!("apis/{group}/v1")
    }
}

/// A stable hash of a document, for the `?hash=` the v3 root hands out.
fn doc_hash(doc: &Value) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in doc.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016X}")
}

/// `GET /openapi/v3`: the discovery root, one entry per served group-version.
pub(crate) fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    for group in std::iter::once("").chain(groups()) {
        if let Some(doc) = openapi_v3(&openapi_key(group)) {
            let key = openapi_key(group);
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", doc_hash(&doc))}),
            );
        }
    }
    json!({"paths": paths})
}

/// `GET /openapi/v2`: the same operations in Swagger 2.0 form (JSON only).
pub(crate) fn openapi_v2() -> Value {
    let mut paths = serde_json::Map::new();
    for group in std::iter::once("").chain(groups()) {
        let Some(doc) = openapi_v3(&openapi_key(group)) else {
            continue;
        };
        if let Some(p) = doc["paths"].as_object() {
            for (k, v) in p {
                let mut v = v.clone();
                // Swagger 2 parameters carry `type` where OpenAPI 3 has `schema`.
                swagger2_params(&mut v);
                paths.insert(k.clone(), v);
            }
        }
    }
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.4+k3s1"},
        "paths": paths, "definitions": {}})
}

fn swagger2_params(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(schema) = m.remove("schema")
                && m.contains_key("in")
            {
                m.insert("type".into(), schema["type"].clone());
            }
            for child in m.values_mut() {
                swagger2_params(child);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(swagger2_params),
        _ => {}
    }
}

/// `GET /openapi/v3/<key>`: the operations of one group-version as the apiserver
/// publishes them (paths, actions, `x-kubernetes-group-version-kind`, the query parameters
/// writes take — `fieldValidation` is what kubectl looks for to validate on the server).
/// Schemas are left out: the twin does not check objects against them.
pub(crate) fn openapi_v3(key: &str) -> Option<Value> {
    let group = match key {
        "api/v1" => "",
        k => k.strip_prefix("apis/")?.strip_suffix("/v1")?,
    };
    let rows: Vec<&ResourceType> = RESOURCES.iter().filter(|r| r.group == group).collect();
    if rows.is_empty() {
        return None;
    }
    let prefix = format!("/{key}");
    let q = |name: &str, desc: &str| json!({"name": name, "in": "query", "description": desc, "schema": {"type": "string"}, "uniqueItems": true});
    let write_params = || {
        vec![
            q(
                "dryRun",
                "When present, indicates that modifications should not be persisted.",
            ),
            q(
                "fieldManager",
                "fieldManager is a name associated with the actor or entity that is making these changes.",
            ),
            q(
                "fieldValidation",
                "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
            ),
        ]
    };
    let path_param = |name: &str| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}, "uniqueItems": true});
    let mut paths = serde_json::Map::new();
    for r in rows {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let kind = r.kind;
        let op = |action: &str, verb: &str, extra: Vec<Value>, gvk: &Value| {
            json!({
                "operationId": format!("{verb}{kind}"),
                "parameters": extra,
                "responses": {"200": {"description": "OK"}, "401": {"description": "Unauthorized"}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
            })
        };
        let ns = if r.namespaced {
            "/namespaces/{namespace}"
        } else {
            ""
        };
        let scope_params: Vec<Value> = if r.namespaced {
            vec![path_param("namespace")]
        } else {
            vec![]
        };
        let collection = format!("{prefix}{ns}/{}", r.resource);
        paths.insert(
            collection.clone(),
            json!({
                "get": op("list", "list", vec![q("labelSelector", ""), q("fieldSelector", ""), q("limit", ""), q("continue", "")], &gvk),
                "post": op("post", "create", write_params(), &gvk),
                "delete": op("deletecollection", "deletecollection", vec![], &gvk),
                "parameters": scope_params,
            }),
        );
        if r.namespaced {
            paths.insert(
                format!("{prefix}/{}", r.resource),
                json!({"get": op("list", "listAllNamespaces", vec![], &gvk)}),
            );
        }
        let mut item_params = scope_params.clone();
        item_params.push(path_param("name"));
        let mut patch_params = write_params();
        patch_params.push(q("force", "Force is going to \"force\" Apply requests."));
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({
                "get": op("get", "read", vec![], &gvk),
                "put": op("put", "replace", write_params(), &gvk),
                "patch": op("patch", "patch", patch_params.clone(), &gvk),
                "delete": op("delete", "delete", vec![q("gracePeriodSeconds", ""), q("propagationPolicy", "")], &gvk),
                "parameters": item_params.clone(),
            }),
        );
        for sub in r.subresources {
            let path = format!("{collection}/{{name}}/{sub}");
            let entry = if *sub == "eviction" {
                let gvk = json!({"group": "policy", "version": "v1", "kind": "Eviction"});
                json!({"post": op("post", "createEviction", write_params(), &gvk), "parameters": item_params.clone()})
            } else {
                json!({
                    "get": op("get", "readStatus", vec![], &gvk),
                    "put": op("put", "replaceStatus", write_params(), &gvk),
                    "patch": op("patch", "patchStatus", patch_params.clone(), &gvk),
                    "parameters": item_params.clone(),
                })
            };
            paths.insert(path, entry);
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.4+k3s1"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree_with_the_table() {
        let cm = by_path("", "v1", "configmaps").map(get);
        assert_eq!(cm.map(|r| r.kind), Some("ConfigMap"));
        assert_eq!(by_kind("v1", "Event"), by_path("", "v1", "events"));
        assert_eq!(
            by_kind("events.k8s.io/v1", "Event"),
            by_path("events.k8s.io", "v1", "events")
        );
        assert_ne!(by_kind("v1", "Event"), by_kind("events.k8s.io/v1", "Event"));
        assert_eq!(
            by_kind("apps/v1", "Deployment").map(|i| get(i).resource),
            Some("deployments")
        );
        assert!(by_path("", "v1", "widgets").is_none());
        assert_eq!(get(NAMESPACES).resource, "namespaces");
    }

    #[test]
    fn discovery_lists_subresources() {
        let core = resource_list("", "v1").unwrap_or_default();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(names.contains(&"pods/eviction"));
        assert!(names.contains(&"nodes/status"));
        assert!(resource_list("apps", "v2").is_none());
        assert!(group("apps").is_some());
        assert!(group("example.com").is_none());
    }
}
