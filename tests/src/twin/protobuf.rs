//! Just enough of the Kubernetes protobuf encoding to read the request bodies kubectl's typed
//! clients send as `application/vnd.kubernetes.protobuf`: the `k8s\0` envelope
//! (`runtime.Unknown`: typeMeta, raw), and inside it SelfSubjectAccessReview
//! (`kubectl auth can-i`), Eviction (`kubectl drain`) and DeleteOptions. Field numbers are
//! those of the `generated.proto` files of k8s.io/api and apimachinery. Anything else is
//! refused with 415, so a client that sends it finds out instead of being misread.

use serde_json::{Map, Value, json};

use super::status::ApiError;

const MAGIC: &[u8] = b"k8s\0";

/// One decoded field: number and value (varint or bytes).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

fn fields(buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (num, wire) = (key >> 3, key & 7);
        let field = match wire {
            0 => Field::Varint(varint(buf, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let bytes = buf.get(pos..pos.checked_add(len)?)?;
                pos += len;
                Field::Bytes(bytes)
            }
            1 => {
                pos += 8;
                continue;
            }
            5 => {
                pos += 4;
                continue;
            }
            _ => return None,
        };
        out.push((num, field));
    }
    Some(out)
}

fn string_fields(buf: &[u8], names: &[(u64, &str)]) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    for (num, f) in fields(buf)? {
        if let (Some((_, name)), Field::Bytes(b)) = (names.iter().find(|(n, _)| *n == num), f) {
            out.insert((*name).to_owned(), json!(String::from_utf8_lossy(b)));
        }
    }
    Some(out)
}

fn delete_options(buf: &[u8]) -> Option<Value> {
    let mut out = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Varint(v)) => {
                out.insert("gracePeriodSeconds".into(), json!(v as i64));
            }
            (2, Field::Bytes(b)) => {
                out.insert(
                    "preconditions".into(),
                    Value::Object(string_fields(b, &[(1, "uid"), (2, "resourceVersion")])?),
                );
            }
            (4, Field::Bytes(b)) => {
                out.insert(
                    "propagationPolicy".into(),
                    json!(String::from_utf8_lossy(b)),
                );
            }
            (5, Field::Bytes(b)) => {
                let dry = out.entry("dryRun").or_insert_with(|| json!([]));
                if let Some(a) = dry.as_array_mut() {
                    a.push(json!(String::from_utf8_lossy(b)));
                }
            }
            _ => {}
        }
    }
    Some(Value::Object(out))
}

/// Decodes a protobuf request body into the JSON the twin works with.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let bad = || ApiError::bad_request("the protobuf body could not be decoded");
    let inner = body.strip_prefix(MAGIC).ok_or_else(bad)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (num, f) in fields(inner).ok_or_else(bad)? {
        match (num, f) {
            (1, Field::Bytes(tm)) => {
                let m = string_fields(tm, &[(1, "apiVersion"), (2, "kind")]).ok_or_else(bad)?;
                api_version = m["apiVersion"].as_str().unwrap_or_default().to_owned();
                kind = m
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let mut obj = json!({"apiVersion": api_version, "kind": kind});
    let top = fields(raw).ok_or_else(bad)?;
    match kind.as_str() {
        "SelfSubjectAccessReview" => {
            for (num, f) in top {
                let (2, Field::Bytes(spec)) = (num, f) else {
                    continue;
                };
                for (n, f) in fields(spec).ok_or_else(bad)? {
                    match (n, f) {
                        (1, Field::Bytes(ra)) => {
                            let names = [
                                (1, "namespace"),
                                (2, "verb"),
                                (3, "group"),
                                (4, "version"),
                                (5, "resource"),
                                (6, "subresource"),
                                (7, "name"),
                            ];
                            obj["spec"]["resourceAttributes"] =
                                Value::Object(string_fields(ra, &names).ok_or_else(bad)?);
                        }
                        (2, Field::Bytes(nra)) => {
                            obj["spec"]["nonResourceAttributes"] = Value::Object(
                                string_fields(nra, &[(1, "path"), (2, "verb")]).ok_or_else(bad)?,
                            );
                        }
                        _ => {}
                    }
                }
            }
        }
        "Eviction" => {
            for (num, f) in top {
                match (num, f) {
                    (1, Field::Bytes(m)) => {
                        obj["metadata"] = Value::Object(
                            string_fields(m, &[(1, "name"), (3, "namespace")]).ok_or_else(bad)?,
                        );
                    }
                    (2, Field::Bytes(d)) => {
                        obj["deleteOptions"] = delete_options(d).ok_or_else(bad)?;
                    }
                    _ => {}
                }
            }
        }
        "DeleteOptions" => {
            let mut d = delete_options(raw).ok_or_else(bad)?;
            d["apiVersion"] = json!(api_version);
            d["kind"] = json!(kind);
            obj = d;
        }
        other => {
            return Err(ApiError::unsupported_media_type(&format!(
                "application/vnd.kubernetes.protobuf (for {other}; the twin reads protobuf only for SelfSubjectAccessReview, Eviction and DeleteOptions)"
            )));
        }
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn len_field(num: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn decodes_an_access_review_like_kubectl_sends_it() {
        let ra = [
            len_field(1, b"kube-system"),
            len_field(2, b"get"),
            len_field(5, b"secrets"),
            len_field(7, b"oxide-controller"),
        ]
        .concat();
        let spec = len_field(1, &ra);
        let raw = len_field(2, &spec);
        let tm = [
            len_field(1, b"authorization.k8s.io/v1"),
            len_field(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), len_field(1, &tm), len_field(2, &raw)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(v["kind"], "SelfSubjectAccessReview");
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "kube-system", "verb": "get", "resource": "secrets", "name": "oxide-controller"})
        );
        assert!(decode(b"not protobuf").is_err());
    }
}
