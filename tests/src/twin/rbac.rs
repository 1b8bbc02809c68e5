//! RBAC authorization over the stored Role/ClusterRole/RoleBinding/ClusterRoleBinding
//! objects, with the apiserver's matching rules (subresources, resourceNames, `*`) and its
//! Forbidden message. `system:masters` bypasses RBAC, as in a real cluster.

use serde_json::Value;

use super::pki::Identity;
use super::resources;
use super::status::{ApiError, qualified};
use super::store::Store;

/// What a request wants to do, in RBAC terms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    /// Empty when the request is on the resource itself.
    pub subresource: &'a str,
    /// Empty for cluster-scoped requests (and all-namespace lists).
    pub namespace: &'a str,
    /// Empty for collection requests and creates.
    pub name: &'a str,
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn subject_matches(subject: &Value, binding_ns: &str, who: &Identity) -> bool {
    let name = subject
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match subject.get("kind").and_then(Value::as_str) {
        Some("User") => who.user == name,
        Some("Group") => who.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or(binding_ns);
            who.user == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn rule_allows(rule: &Value, a: &Attributes<'_>) -> bool {
    let groups = strings(rule.get("apiGroups"));
    let res = strings(rule.get("resources"));
    let verbs = strings(rule.get("verbs"));
    let names = strings(rule.get("resourceNames"));
    let combined = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let star_sub = format!("*/{}", a.subresource);
    groups.iter().any(|g| *g == "*" || *g == a.group)
        && res
            .iter()
            .any(|r| *r == "*" || *r == combined || (!a.subresource.is_empty() && *r == star_sub))
        && verbs.iter().any(|v| *v == "*" || *v == a.verb)
        && (names.is_empty() || (!a.name.is_empty() && names.contains(&a.name)))
}

fn role_rules<'a>(store: &'a Store, role_ref: &Value, binding_ns: &'a str) -> Vec<&'a Value> {
    let name = role_ref
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (resource, ns) = match role_ref.get("kind").and_then(Value::as_str) {
        Some("ClusterRole") => ("clusterroles", ""),
        Some("Role") => ("roles", binding_ns),
        _ => return Vec::new(),
    };
    let Some(rid) = resources::by_group_resource("rbac.authorization.k8s.io", resource) else {
        return Vec::new();
    };
    store
        .iter(rid, if ns.is_empty() { None } else { Some(ns) })
        .filter(|r| r.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
        .flat_map(|r| {
            r.get("rules")
                .and_then(Value::as_array)
                .map(|v| v.iter().collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .collect()
}

/// Whether `who` may do `a`.
pub(crate) fn allowed(store: &Store, who: &Identity, a: &Attributes<'_>) -> bool {
    if who.groups.iter().any(|g| g == "system:masters") {
        return true;
    }
    let bindings = |resource: &str, ns: Option<&str>| -> Vec<(String, Value)> {
        resources::by_group_resource("rbac.authorization.k8s.io", resource)
            .map(|rid| {
                store
                    .iter(rid, ns)
                    .map(|b| {
                        let bns = b
                            .pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        (bns.to_string(), b.clone())
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut candidates = bindings("clusterrolebindings", None);
    if !a.namespace.is_empty() {
        candidates.extend(bindings("rolebindings", Some(a.namespace)));
    }
    candidates.iter().any(|(bns, binding)| {
        let subjects = binding
            .get("subjects")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        subjects.iter().any(|s| subject_matches(s, bns, who))
            && binding.get("roleRef").is_some_and(|role_ref| {
                role_rules(store, role_ref, bns)
                    .into_iter()
                    .any(|rule| rule_allows(rule, a))
            })
    })
}

/// `Ok` if allowed, else the apiserver's 403.
pub(crate) fn authorize(store: &Store, who: &Identity, a: &Attributes<'_>) -> Result<(), ApiError> {
    if allowed(store, who, a) {
        return Ok(());
    }
    let rt_name = resources::by_group_resource(a.group, a.resource)
        .map(|rid| qualified(resources::get(rid)))
        .unwrap_or_else(|| a.resource.to_string());
    let subject = if a.name.is_empty() {
        rt_name
    } else {
        format!("{rt_name} \"{}\"", a.name)
    };
    let combined = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    Err(ApiError::forbidden(
        format!(
            "{subject} is forbidden: User \"{}\" cannot {} resource \"{combined}\" in API group \"{}\" {scope}",
            who.user, a.verb, a.group
        ),
        a.name,
        a.group,
        a.resource,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn attrs<'a>(
        verb: &'a str,
        resource: &'a str,
        sub: &'a str,
        ns: &'a str,
        name: &'a str,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group: "",
            resource,
            subresource: sub,
            namespace: ns,
            name,
        }
    }

    fn store_with_role() -> Store {
        let mut s = Store::new();
        let role = resources::by_kind("rbac.authorization.k8s.io/v1", "Role").unwrap();
        let binding = resources::by_kind("rbac.authorization.k8s.io/v1", "RoleBinding").unwrap();
        s.upsert(role, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r", "namespace": "kube-system"},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["state"], "verbs": ["get", "update", "list", "create"]},
                {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
            ]}))
            .unwrap();
        s.upsert(
            binding,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "rb", "namespace": "kube-system"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": "kube-system"}]}),
        )
        .unwrap();
        s
    }

    #[test]
    fn resource_names_restrict_named_verbs_only() {
        let s = store_with_role();
        let sa = Identity::service_account("kube-system", "ctl");
        assert!(allowed(
            &s,
            &sa,
            &attrs("get", "configmaps", "", "kube-system", "state")
        ));
        assert!(allowed(
            &s,
            &sa,
            &attrs("update", "configmaps", "", "kube-system", "state")
        ));
        assert!(!allowed(
            &s,
            &sa,
            &attrs("get", "configmaps", "", "kube-system", "other")
        ));
        // list and create carry no name, so a resourceNames rule can never grant them.
        assert!(!allowed(
            &s,
            &sa,
            &attrs("list", "configmaps", "", "kube-system", "")
        ));
        assert!(!allowed(
            &s,
            &sa,
            &attrs("create", "configmaps", "", "kube-system", "")
        ));
        assert!(!allowed(
            &s,
            &sa,
            &attrs("get", "configmaps", "", "default", "state")
        ));
        let other = Identity::service_account("kube-system", "someone");
        assert!(!allowed(
            &s,
            &other,
            &attrs("get", "configmaps", "", "kube-system", "state")
        ));
        assert!(allowed(
            &s,
            &Identity::admin(),
            &attrs("delete", "nodes", "", "", "n")
        ));
    }

    #[test]
    fn subresources_are_separate_resources() {
        let s = store_with_role();
        let sa = Identity::service_account("kube-system", "ctl");
        assert!(allowed(
            &s,
            &sa,
            &attrs("create", "pods", "eviction", "kube-system", "p")
        ));
        assert!(!allowed(
            &s,
            &sa,
            &attrs("delete", "pods", "", "kube-system", "p")
        ));
        assert!(!allowed(
            &s,
            &sa,
            &attrs("update", "pods", "status", "kube-system", "p")
        ));
    }

    #[test]
    fn forbidden_message_matches_the_apiserver() {
        let s = store_with_role();
        let sa = Identity::service_account("kube-system", "ctl");
        let err = authorize(
            &s,
            &sa,
            &attrs("get", "configmaps", "", "kube-system", "other"),
        )
        .unwrap_err();
        assert_eq!(err.code, 403);
        assert_eq!(
            err.message,
            "configmaps \"other\" is forbidden: User \"system:serviceaccount:kube-system:ctl\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"kube-system\""
        );
        let err = authorize(&s, &sa, &attrs("list", "nodes", "", "", "")).unwrap_err();
        assert!(
            err.message
                .ends_with("cannot list resource \"nodes\" in API group \"\" at the cluster scope")
        );
    }
}
