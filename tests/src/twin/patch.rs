//! Patch mechanics on JSON values: RFC 7386 merge patch (also used for strategic merge
//! patch), the RFC 6902 JSON patch subset, and the field-set bookkeeping behind server-side
//! apply (which fields a manager set, merging an applied configuration, dropping fields a
//! manager stopped applying).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// RFC 7386 JSON merge patch: objects merge recursively, `null` deletes, anything else
/// replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target_map) = target {
        for (k, v) in patch_map {
            if v.is_null() {
                target_map.remove(k);
            } else {
                merge_patch(target_map.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Splits a JSON pointer into unescaped tokens.
fn pointer_tokens(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {pointer:?}"))?;
    Ok(rest.split('/').map(unescape).collect())
}

fn parent_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(t)
                .ok_or_else(|| format!("path element {t:?} not found"))?,
            Value::Array(a) => {
                let i: usize = t
                    .parse()
                    .map_err(|_| format!("invalid array index {t:?}"))?;
                a.get_mut(i)
                    .ok_or_else(|| format!("array index {i} out of range"))?
            }
            _ => return Err(format!("path element {t:?} is not a container")),
        };
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, parents)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i > a.len() {
                return Err(format!("array index {i} out of range"));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!("cannot add at {path:?}")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        return Err("cannot remove the whole document".to_string());
    };
    match parent_mut(doc, parents)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("unable to remove nonexistent key: {last}")),
        Value::Array(a) => {
            let i: usize = last
                .parse()
                .map_err(|_| format!("invalid array index {last:?}"))?;
            if i >= a.len() {
                return Err(format!("array index {i} out of range"));
            }
            Ok(a.remove(i))
        }
        _ => Err(format!("cannot remove at {path:?}")),
    }
}

/// Applies an RFC 6902 JSON patch (add, remove, replace, test, move, copy).
pub(crate) fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for op in ops {
        let kind = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("operation has no \"op\"")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("operation has no \"path\"")?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("{kind} operation has no \"value\""))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{kind} operation has no \"from\""))
        };
        match kind {
            "add" => add(doc, path, value()?)?,
            "remove" => {
                remove(doc, path)?;
            }
            "replace" => {
                remove(doc, path)?;
                add(doc, path, value()?)?;
            }
            "test" => {
                let found = doc.pointer(&json_pointer_escaped(path)?).cloned();
                if found.as_ref() != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            "move" => {
                let v = remove(doc, from()?)?;
                add(doc, path, v)?;
            }
            "copy" => {
                let v = doc
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| format!("copy from {:?}: not found", from()))?;
                add(doc, path, v)?;
            }
            other => return Err(format!("unsupported JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

/// serde_json's `pointer` expects escaped tokens already; validate the syntax only.
fn json_pointer_escaped(path: &str) -> Result<String, String> {
    pointer_tokens(path)?;
    Ok(path.to_string())
}

/// A field path inside an object (map keys only; lists are owned atomically).
pub(crate) type FieldPath = Vec<String>;

/// The leaf fields an applied configuration sets. `apiVersion`, `kind` and identity
/// metadata are not owned by anyone; labels, annotations and other metadata are. With
/// `skip_status`, `status` is excluded (it belongs to the status subresource).
pub(crate) fn applied_fields(applied: &Value, skip_status: bool) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    let Some(map) = applied.as_object() else {
        return out;
    };
    for (k, v) in map {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "status" if skip_status => {}
            "metadata" => {
                if let Some(meta) = v.as_object() {
                    for (mk, mv) in meta {
                        if matches!(
                            mk.as_str(),
                            "name"
                                | "namespace"
                                | "uid"
                                | "resourceVersion"
                                | "generation"
                                | "creationTimestamp"
                                | "deletionTimestamp"
                                | "managedFields"
                                | "generateName"
                                | "selfLink"
                        ) {
                            continue;
                        }
                        collect(mv, &mut vec!["metadata".to_string(), mk.clone()], &mut out);
                    }
                }
            }
            _ => collect(v, &mut vec![k.clone()], &mut out),
        }
    }
    out
}

fn collect(v: &Value, path: &mut Vec<String>, out: &mut BTreeSet<FieldPath>) {
    match v {
        Value::Null => {}
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(k.clone());
                collect(child, path, out);
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Deep-merges an applied configuration into the live object: maps merge, every other
/// value (lists included) replaces; `null` in the applied configuration is ignored.
pub(crate) fn apply_merge(live: &mut Value, applied: &Value) {
    let Value::Object(applied_map) = applied else {
        if !applied.is_null() {
            *live = applied.clone();
        }
        return;
    };
    if !live.is_object() {
        *live = Value::Object(Map::new());
    }
    if let Value::Object(live_map) = live {
        for (k, v) in applied_map {
            if v.is_null() {
                continue;
            }
            apply_merge(live_map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Removes one field path, pruning maps that the removal left empty.
pub(crate) fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    if rest.is_empty() {
        map.remove(first);
        return;
    }
    if let Some(child) = map.get_mut(first) {
        remove_path(child, rest);
        if child.as_object().is_some_and(Map::is_empty) {
            map.remove(first);
        }
    }
}

/// True if `a` is a prefix of `b` or `b` of `a` (the two paths overlap).
pub(crate) fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// The `fieldsV1` rendering of a field set (`{"f:data":{"f:key":{}}}`), as stored in
/// `metadata.managedFields`.
pub(crate) fn fields_v1(fields: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut cur = &mut root;
        for part in path {
            let entry = cur
                .entry(format!("f:{part}"))
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(next) = entry else { break };
            cur = next;
        }
    }
    Value::Object(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(
            &mut doc,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            doc,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut doc = json!({"spec": {"unschedulable": false, "taints": []}, "metadata": {"labels": {"a/b": "1"}}});
        let ops = json!([
            {"op": "test", "path": "/spec/unschedulable", "value": false},
            {"op": "replace", "path": "/spec/unschedulable", "value": true},
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "k"}},
            {"op": "remove", "path": "/metadata/labels/a~1b"},
        ]);
        assert_eq!(json_patch(&mut doc, &ops), Ok(()));
        assert_eq!(
            doc,
            json!({"spec": {"unschedulable": true, "taints": [{"key": "k"}]}, "metadata": {"labels": {}}})
        );
        let failing = json!([{"op": "test", "path": "/spec/unschedulable", "value": false}]);
        assert!(json_patch(&mut doc, &failing).is_err());
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).is_err());
    }

    #[test]
    fn applied_fields_and_fields_v1() {
        let applied = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "y", "labels": {"app": "a"}},
            "data": {"k1": "v1", "k2": "v2"},
            "status": {"phase": "x"}
        });
        let fields = applied_fields(&applied, true);
        let want: BTreeSet<FieldPath> = [
            vec!["metadata", "labels", "app"],
            vec!["data", "k1"],
            vec!["data", "k2"],
        ]
        .into_iter()
        .map(|p| p.into_iter().map(str::to_string).collect())
        .collect();
        assert_eq!(fields, want);
        assert_eq!(
            fields_v1(&fields),
            json!({"f:data": {"f:k1": {}, "f:k2": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})
        );
    }

    #[test]
    fn remove_path_prunes_empty_parents() {
        let mut doc = json!({"data": {"k": "v"}, "x": 1});
        remove_path(&mut doc, &["data".to_string(), "k".to_string()]);
        assert_eq!(doc, json!({"x": 1}));
    }
}
