//! Label selectors (string syntax from `?labelSelector=` and `meta/v1 LabelSelector`
//! objects as PDBs carry them) and field selectors (`?fieldSelector=`).

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: all requirements must hold (an empty selector matches all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(pub Vec<LabelReq>);

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

impl LabelSelector {
    /// Parses the `labelSelector` query syntax (`a=b,c!=d,e in (f,g),!h`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for raw in split_terms(s) {
            let t = raw.trim();
            let bad = || format!("unable to parse requirement: {t:?}");
            let req = if let Some(k) = t.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some(open) = t.find('(') {
                let inner = t[open + 1..].strip_suffix(')').ok_or_else(bad)?;
                let head: Vec<&str> = t[..open].split_whitespace().collect();
                let [key, op] = head.as_slice() else {
                    return Err(bad());
                };
                let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
                if values.iter().any(|v| !valid_value(v)) {
                    return Err(bad());
                }
                match *op {
                    "in" => LabelReq::In(key.to_string(), values),
                    "notin" => LabelReq::NotIn(key.to_string(), values),
                    _ => return Err(bad()),
                }
            } else if let Some(i) = t.find("!=") {
                LabelReq::NotEq(t[..i].trim().to_string(), t[i + 2..].trim().to_string())
            } else if let Some(i) = t.find("==") {
                LabelReq::Eq(t[..i].trim().to_string(), t[i + 2..].trim().to_string())
            } else if let Some(i) = t.find('=') {
                LabelReq::Eq(t[..i].trim().to_string(), t[i + 1..].trim().to_string())
            } else {
                LabelReq::Exists(t.to_string())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => (k, None),
            };
            if !valid_key(key) || value.is_some_and(|v| !valid_value(v)) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Converts a `meta/v1 LabelSelector` object. `None` for a null selector (matches
    /// nothing, as for PDBs); an empty object matches everything.
    pub fn from_object(sel: &Value) -> Result<Option<Self>, String> {
        if sel.is_null() {
            return Ok(None);
        }
        let mut reqs = Vec::new();
        if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                reqs.push(LabelReq::Eq(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                let req = match e.get("operator").and_then(Value::as_str) {
                    Some("In") => LabelReq::In(key, values),
                    Some("NotIn") => LabelReq::NotIn(key, values),
                    Some("Exists") => LabelReq::Exists(key),
                    Some("DoesNotExist") => LabelReq::NotExists(key),
                    other => {
                        return Err(format!("{other:?} is not a valid label selector operator"));
                    }
                };
                reqs.push(req);
            }
        }
        Ok(Some(Self(reqs)))
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: `path=value`, `path==value`, `path!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses the `fieldSelector` query syntax.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for raw in s.split(',') {
            let t = raw.trim();
            let (path, eq, value) = if let Some(i) = t.find("!=") {
                (&t[..i], false, &t[i + 2..])
            } else if let Some(i) = t.find("==") {
                (&t[..i], true, &t[i + 2..])
            } else if let Some(i) = t.find('=') {
                (&t[..i], true, &t[i + 1..])
            } else {
                return Err(format!("invalid selector: '{s}'; can't understand '{t}'"));
            };
            let path = path.trim();
            if path.is_empty() || path.split('.').any(str::is_empty) {
                return Err(format!("invalid selector: '{s}'; can't understand '{t}'"));
            }
            reqs.push((path.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    /// Whether the object's fields satisfy every requirement. A missing field reads as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(path, eq, value)| (field_value(obj, path) == *value) == *eq)
    }
}

/// The fields the apiserver lets a field selector use for `resource`: the conversion
/// functions registered per kind (`pkg/apis/*/v1/conversion.go`), `None` for kinds that
/// have none and get the generic `metadata.name`/`metadata.namespace` only.
fn selectable(group: &str, resource: &str) -> Option<&'static [&'static str]> {
    Some(match (group, resource) {
        ("", "pods") => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ],
        ("", "nodes") => &["metadata.name", "spec.unschedulable"],
        ("", "secrets") => &["metadata.name", "metadata.namespace", "type"],
        ("", "namespaces") => &["metadata.name", "status.phase"],
        ("", "events") => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("apps", "replicasets") => &["metadata.name", "metadata.namespace", "status.replicas"],
        ("batch", "jobs") => &["metadata.name", "metadata.namespace", "status.successful"],
        _ => return None,
    })
}

impl FieldSelector {
    /// Refuses fields the apiserver does not support for this resource, with its message
    /// (HTTP 400).
    pub fn check(&self, group: &str, resource: &str) -> Result<(), String> {
        for (path, _, _) in &self.0 {
            match selectable(group, resource) {
                Some(fields) if fields.contains(&path.as_str()) => {}
                Some(_) => return Err(format!("field label not supported: {path}")),
                None if matches!(path.as_str(), "metadata.name" | "metadata.namespace") => {}
                None => {
                    return Err(format!(
                        "\"{path}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The string form of a dotted field path, as field selectors compare it.
pub(crate) fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(next) => cur = next,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "w1", "unschedulable": true}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web, db)",
            "tier notin (back)",
            "app",
            "!missing",
            "app=web,tier",
        ];
        for s in yes {
            assert!(
                LabelSelector::parse(s).map(|sel| sel.matches(&o)) == Ok(true),
                "{s} should match"
            );
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "tier notin (front,back)",
            "missing",
            "!app",
            "app=web,x=y",
        ];
        for s in no {
            assert!(
                LabelSelector::parse(s).map(|sel| sel.matches(&o)) == Ok(false),
                "{s} should not match"
            );
        }
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
        assert_eq!(LabelSelector::parse("").map(|s| s.matches(&o)), Ok(true));
    }

    #[test]
    fn label_selector_objects() {
        let o = obj(json!({"app": "web"}));
        let sel = LabelSelector::from_object(
            &json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}),
        );
        assert_eq!(sel.map(|s| s.map(|s| s.matches(&o))), Ok(Some(true)));
        assert_eq!(LabelSelector::from_object(&Value::Null), Ok(None));
        let empty = LabelSelector::from_object(&json!({}));
        assert_eq!(empty.map(|s| s.map(|s| s.matches(&o))), Ok(Some(true)));
    }

    #[test]
    fn field_selectors_on_known_and_generic_paths() {
        let o = obj(json!({}));
        for (s, want) in [
            ("metadata.name=n1", true),
            ("metadata.namespace==ns", true),
            ("spec.nodeName=w1,status.phase!=Pending", true),
            ("spec.unschedulable=true", true),
            ("spec.nodeName=w2", false),
            ("spec.missing=", true),
        ] {
            assert_eq!(
                FieldSelector::parse(s).map(|f| f.matches(&o)),
                Ok(want),
                "{s}"
            );
        }
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
