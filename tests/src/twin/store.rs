//! The twin's object store: every object as JSON keyed by (resource, namespace, name), one
//! global resourceVersion counter, and the apiserver's write semantics (metadata
//! defaulting, name validation, optimistic concurrency, status subresources, patches,
//! server-side apply field ownership, cascades, eviction against disruption budgets).
//! Authentication, authorization and HTTP live elsewhere; this module only answers
//! "what happens to the data".

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::patch::{self, FieldPath};
use super::resources::{self, NAMESPACES, ResourceType};
use super::select::{FieldSelector, LabelSelector};
use super::status::ApiError;

/// (resource id, namespace or "" for cluster-scoped, name).
pub(crate) type Key = (usize, String, String);

/// Namespaces every cluster starts with (and that cannot be deleted, except kube-node-lease).
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];
const UNDELETABLE_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// A Node's Ready condition as its kubelet (True/False) or the node lifecycle controller
/// (Unknown, once the kubelet stopped posting) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCondition {
    Ready,
    /// The kubelet runs but the node is not ready yet (the CNI is not up at registration).
    NotReady,
    /// The kubelet stopped posting status.
    Unknown,
}

/// What a kubelet reports until the container network is up.
pub const NOT_READY_MESSAGE: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

/// How long a `continue` token stays usable: etcd's compaction interval in a default
/// apiserver (`--etcd-compaction-interval=5m`); older tokens get 410 Expired.
pub(crate) const CONTINUE_TTL_SECONDS: i64 = 300;

/// Options shared by writes.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteCtx {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    /// Server-side apply `force=true`: take fields other managers own instead of a 409.
    pub force: bool,
    /// `Some("status")` for writes through the status subresource.
    pub subresource: Option<String>,
}

impl WriteCtx {
    fn status(&self) -> bool {
        self.subresource.as_deref() == Some("status")
    }
}

/// The patch flavours the apiserver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Merge,
    Strategic,
    Json,
    Apply,
}

/// List options (`labelSelector`, `fieldSelector`, `limit`, `continue`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ListQuery {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// What one server-side-apply manager last applied to one object.
#[derive(Debug, Clone)]
struct Applied {
    fields: BTreeSet<FieldPath>,
    time: String,
    api_version: String,
}

/// The in-memory object store. Callers hold it behind one mutex and never across awaits.
#[derive(Debug)]
pub(crate) struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Per object, per (manager, subresource): fields applied last time.
    applied: HashMap<Key, BTreeMap<(String, String), Applied>>,
}

pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Runs `f` on the object's metadata map (created if absent or not a map). Total: never
/// panics, whatever shape the value has.
fn with_meta<R>(obj: &mut Value, f: impl FnOnce(&mut Map<String, Value>) -> R) -> R {
    let mut meta = match obj.get_mut("metadata").map(Value::take) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let out = f(&mut meta);
    if let Some(map) = obj.as_object_mut() {
        map.insert("metadata".into(), Value::Object(meta));
    }
    out
}

/// Sets a top-level field of an object value (no-op on non-objects).
fn set_field(obj: &mut Value, field: &str, value: Value) {
    if let Some(map) = obj.as_object_mut() {
        map.insert(field.into(), value);
    }
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label)
}

/// Validates an object name the way the resource's REST strategy does.
fn validate_name(rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(ApiError::invalid(
            rt,
            name,
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    let problem = match rt.resource {
        "namespaces" if !is_label(name) => Some(LABEL_MSG),
        "services" if !(is_label(name) && name.starts_with(|c: char| c.is_ascii_lowercase())) => {
            Some(DNS1035_MSG)
        }
        "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings" => {
            if name == "." || name == ".." || name.contains('/') || name.contains('%') {
                Some("may not contain '/' or '%' and may not be '.' or '..'")
            } else {
                None
            }
        }
        "namespaces" | "services" => None,
        _ if !is_subdomain(name) => Some(SUBDOMAIN_MSG),
        _ => None,
    };
    match problem {
        Some(msg) => Err(ApiError::invalid(
            rt,
            name,
            &format!("metadata.name: Invalid value: \"{name}\": {msg}"),
        )),
        None => Ok(()),
    }
}

fn random_suffix() -> String {
    // The apiserver's generateName alphabet (no vowels, no look-alikes), 5 characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Folds Secret `stringData` into base64 `data`, as the apiserver does on every write.
fn fold_string_data(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let Some(Value::Object(string_data)) = map.remove("stringData") else {
        return;
    };
    let data = map
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if !data.is_object() {
        *data = Value::Object(Map::new());
    }
    if let Value::Object(data) = data {
        for (k, v) in string_data {
            let text = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            data.insert(
                k,
                json!(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

/// ConfigMap and Secret payloads are limited to 1 MiB in total.
const MAX_DATA_BYTES: usize = 1024 * 1024;

fn valid_config_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k != "."
        && k != ".."
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The per-type validation the apiserver does that clients can trip over: config keys and
/// the 1 MiB limit of ConfigMaps/Secrets, and the required fields and lengths of
/// `events.k8s.io/v1` Events. All problems are reported at once, like field.ErrorList.
fn validate_object(rt: &ResourceType, name: &str, obj: &Value) -> Result<(), ApiError> {
    let mut problems: Vec<String> = Vec::new();
    let str_field = |f: &str| obj.get(f).and_then(Value::as_str).unwrap_or_default();
    match rt.resource {
        "configmaps" | "secrets" => {
            let mut total = 0usize;
            for field in ["data", "binaryData"] {
                if let Some(map) = obj.get(field).and_then(Value::as_object) {
                    for (k, v) in map {
                        if !valid_config_key(k) {
                            problems.push(format!(
                                "{field}[{k}]: Invalid value: \"{k}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
                            ));
                        }
                        let text = v.as_str().unwrap_or_default();
                        total += if rt.resource == "secrets" || field == "binaryData" {
                            // Base64 on the wire; the limit applies to the decoded bytes.
                            text.len() / 4 * 3
                        } else {
                            text.len()
                        };
                    }
                }
            }
            if total > MAX_DATA_BYTES {
                let path = if rt.resource == "secrets" {
                    "data"
                } else {
                    "[]"
                };
                problems.push(format!(
                    "{path}: Too long: must have at most {MAX_DATA_BYTES} bytes"
                ));
            }
        }
        "events" if rt.group == "events.k8s.io" => {
            if obj.get("eventTime").is_none_or(Value::is_null) {
                problems.push("eventTime: Required value".into());
            }
            for (field, max) in [
                ("reportingController", 253),
                ("reportingInstance", 128),
                ("action", 128),
                ("reason", 128),
            ] {
                let v = str_field(field);
                if v.is_empty() {
                    problems.push(format!("{field}: Required value"));
                } else if v.len() > max {
                    problems.push(format!(
                        "{field}: Too long: may not be more than {max} bytes"
                    ));
                }
            }
            if str_field("note").len() > 1024 {
                problems.push("note: Too long: may not be more than 1024 bytes".into());
            }
            let kind = str_field("type");
            if kind != "Normal" && kind != "Warning" {
                problems.push(format!(
                    "type: Unsupported value: \"{kind}\": supported values: \"Normal\", \"Warning\""
                ));
            }
        }
        _ => {}
    }
    match problems.len() {
        0 => Ok(()),
        1 => Err(ApiError::invalid(rt, name, &problems[0])),
        _ => Err(ApiError::invalid(
            rt,
            name,
            &format!("[{}]", problems.join(", ")),
        )),
    }
}

/// Whether the resource's REST strategy maintains `metadata.generation` (ConfigMaps,
/// Secrets, Nodes, Leases... have none in a real cluster).
fn tracks_generation(rt: &ResourceType) -> bool {
    matches!(
        rt.resource,
        "deployments" | "replicasets" | "daemonsets" | "jobs" | "cronjobs" | "poddisruptionbudgets"
    )
}

/// Everything but metadata and status: a change here bumps `metadata.generation`.
fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(map) = v.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    v
}

/// Whether a pod counts as healthy for disruption budgets: Running with Ready=True.
fn pod_healthy(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp")
        .is_none_or(Value::is_null)
        && pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
}

/// `intstr` int-or-percent scaled against `total`, rounding up like the disruption controller.
fn scaled(v: &Value, total: usize) -> Result<usize, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("invalid value {n}")),
        Value::String(s) => {
            let pct: usize = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            Ok((pct * total).div_ceil(100))
        }
        other => Err(format!("invalid value {other}")),
    }
}

impl Store {
    /// A store holding the initial namespaces.
    pub fn new() -> Self {
        let mut store = Self {
            rv: 1,
            objects: BTreeMap::new(),
            applied: HashMap::new(),
        };
        for ns in INITIAL_NAMESPACES {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            // Fresh store, valid names: creation cannot fail; ignore the impossible error.
            let _ = store.create(NAMESPACES, "", obj, &WriteCtx::default(), true);
        }
        store
    }

    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> String {
        self.rv.to_string()
    }

    fn key(rid: usize, ns: &str, name: &str) -> Key {
        let ns = if resources::get(rid).namespaced {
            ns
        } else {
            ""
        };
        (rid, ns.to_string(), name.to_string())
    }

    /// Whether a namespace exists.
    pub fn namespace_exists(&self, ns: &str) -> bool {
        self.objects
            .contains_key(&(NAMESPACES, String::new(), ns.to_string()))
    }

    /// Objects of one resource (one namespace, or all when `ns` is None), in key order.
    pub fn iter<'a>(
        &'a self,
        rid: usize,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        let start = (rid, String::new(), String::new());
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.0 == rid)
            .filter(move |(k, _)| ns.is_none_or(|ns| k.1 == ns))
            .map(|(_, v)| v)
    }

    /// Number of stored objects of one resource.
    pub fn count(&self, rid: usize) -> usize {
        self.iter(rid, None).count()
    }

    pub fn get(&self, rid: usize, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&Self::key(rid, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(resources::get(rid), name))
    }

    pub fn list(&self, rid: usize, ns: Option<&str>, q: &ListQuery) -> Result<Value, ApiError> {
        let rt = resources::get(rid);
        let after: Option<(String, String)> = match &q.continue_token {
            Some(token) => {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(token)
                    .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
                let (ns, name, issued): (String, String, i64) = serde_json::from_slice(&bytes)
                    .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
                if chrono::Utc::now().timestamp() - issued > CONTINUE_TTL_SECONDS {
                    return Err(ApiError::expired_continue());
                }
                Some((ns, name))
            }
            None => None,
        };
        let matching: Vec<&Value> = self
            .iter(rid, ns)
            .filter(|o| {
                after.as_ref().is_none_or(|(ans, aname)| {
                    (meta_str(o, "namespace"), meta_str(o, "name")) > (ans.as_str(), aname.as_str())
                })
            })
            .filter(|o| q.labels.matches(o) && q.fields.matches(o))
            .collect();
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let page: Vec<Value> = matching
            .iter()
            .take(limit)
            .map(|o| {
                let mut item = (*o).clone();
                if let Some(map) = item.as_object_mut() {
                    // Typed lists carry kind/apiVersion once, on the list.
                    map.remove("kind");
                    map.remove("apiVersion");
                }
                item
            })
            .collect();
        let mut metadata = json!({"resourceVersion": self.resource_version()});
        if matching.len() > page.len()
            && let Some(last) = page.last()
        {
            let token = serde_json::to_vec(&(
                meta_str(last, "namespace"),
                meta_str(last, "name"),
                chrono::Utc::now().timestamp(),
            ))
            .map_err(|e| ApiError::internal(e.to_string()))?;
            metadata["continue"] =
                json!(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token));
            metadata["remainingItemCount"] = json!(matching.len() - page.len());
        }
        Ok(json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(),
            "metadata": metadata,
            "items": page,
        }))
    }

    fn check_type(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
        let Some(map) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(format!(
                "the body of the request must be a {} object",
                rt.kind
            )));
        };
        let want = rt.api_version();
        if let Some(av) = map.get("apiVersion").and_then(Value::as_str)
            && av != want
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want})"
            )));
        }
        if let Some(kind) = map.get("kind").and_then(Value::as_str)
            && !kind.is_empty()
            && kind != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                rt.kind
            )));
        }
        if map
            .get("metadata")
            .is_some_and(|m| !m.is_object() && !m.is_null())
        {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        map.insert("apiVersion".into(), json!(want));
        map.insert("kind".into(), json!(rt.kind));
        Ok(())
    }

    fn check_namespace(rt: &ResourceType, obj: &mut Value, ns: &str) -> Result<(), ApiError> {
        with_meta(obj, |meta| {
            if rt.namespaced {
                match meta.get("namespace").and_then(Value::as_str) {
                    Some(body_ns) if !body_ns.is_empty() && body_ns != ns => {
                        return Err(ApiError::bad_request(
                            "the namespace of the provided object does not match the namespace sent on the request",
                        ));
                    }
                    _ => {
                        meta.insert("namespace".into(), json!(ns));
                    }
                }
            } else {
                meta.remove("namespace");
            }
            Ok(())
        })
    }

    /// POST: creates an object. `trusted` (direct simulator access) keeps the given status.
    pub fn create(
        &mut self,
        rid: usize,
        ns: &str,
        mut obj: Value,
        ctx: &WriteCtx,
        trusted: bool,
    ) -> Result<Value, ApiError> {
        let rt = resources::get(rid);
        Self::check_type(rt, &mut obj)?;
        Self::check_namespace(rt, &mut obj, ns)?;
        let (has_rv, mut name, prefix) = with_meta(&mut obj, |m| {
            let get = |f: &str| {
                m.get(f)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            (
                !get("resourceVersion").is_empty(),
                get("name"),
                get("generateName"),
            )
        });
        if has_rv && !trusted {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if name.is_empty() && !prefix.is_empty() {
            name = format!("{prefix}{}", random_suffix());
        }
        validate_name(rt, &name)?;
        if rt.namespaced && !self.namespace_exists(ns) {
            return Err(ApiError::not_found(resources::get(NAMESPACES), ns));
        }
        let key = Self::key(rid, ns, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(rt, &name));
        }
        with_meta(&mut obj, |meta| {
            meta.insert("name".into(), json!(name));
            meta.remove("resourceVersion");
            meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            meta.insert("creationTimestamp".into(), json!(now()));
            if tracks_generation(rt) {
                meta.insert("generation".into(), json!(1));
            }
            meta.remove("deletionTimestamp");
            meta.remove("selfLink");
            if !trusted {
                meta.remove("managedFields");
            }
        });
        Self::default_on_create(rt, &name, &mut obj, trusted);
        validate_object(rt, &name, &obj)?;
        if !ctx.dry_run {
            let rv = self.next_rv();
            with_meta(&mut obj, |m| m.insert("resourceVersion".into(), json!(rv)));
            self.objects.insert(key, obj.clone());
        }
        Ok(obj)
    }

    /// Per-type defaulting the REST strategies do on create.
    fn default_on_create(rt: &ResourceType, name: &str, obj: &mut Value, trusted: bool) {
        match rt.resource {
            "secrets" => {
                fold_string_data(obj);
                if obj.get("type").is_none() {
                    set_field(obj, "type", json!("Opaque"));
                }
            }
            "namespaces" => {
                with_meta(obj, |meta| {
                    if let Value::Object(labels) = meta.entry("labels").or_insert_with(|| json!({}))
                    {
                        labels.insert("kubernetes.io/metadata.name".into(), json!(name));
                    }
                });
                set_field(obj, "spec", json!({"finalizers": ["kubernetes"]}));
                set_field(obj, "status", json!({"phase": "Active"}));
            }
            "pods" if !trusted => {
                set_field(obj, "status", json!({"phase": "Pending"}));
            }
            "deployments"
            | "replicasets"
            | "daemonsets"
            | "jobs"
            | "cronjobs"
            | "poddisruptionbudgets"
            | "services"
                if !trusted =>
            {
                set_field(obj, "status", json!({}));
            }
            _ => {}
        }
    }

    /// Optimistic concurrency: a non-empty `metadata.resourceVersion` in the request must
    /// equal the stored one.
    fn check_rv(
        rt: &ResourceType,
        name: &str,
        requested: &str,
        stored: &Value,
    ) -> Result<(), ApiError> {
        if !requested.is_empty() && requested != meta_str(stored, "resourceVersion") {
            return Err(ApiError::conflict(rt, name));
        }
        Ok(())
    }

    /// PUT (main resource or `status`).
    pub fn replace(
        &mut self,
        rid: usize,
        ns: &str,
        name: &str,
        mut body: Value,
        ctx: &WriteCtx,
    ) -> Result<Value, ApiError> {
        let rt = resources::get(rid);
        let key = Self::key(rid, ns, name);
        let existing = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        Self::check_type(rt, &mut body)?;
        Self::check_namespace(rt, &mut body, ns)?;
        let body_name = meta_str(&body, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        Self::check_rv(rt, name, meta_str(&body, "resourceVersion"), &existing)?;
        let new = if ctx.status() {
            let mut new = existing.clone();
            set_field(
                &mut new,
                "status",
                body.get("status").cloned().unwrap_or(Value::Null),
            );
            new
        } else {
            let mut new = body;
            if rt.has_status() {
                match existing.get("status") {
                    Some(s) => set_field(&mut new, "status", s.clone()),
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            new
        };
        self.finish_update(rid, key, &existing, new, ctx, None)
    }

    /// PATCH (main resource or `status`). Returns the object and whether it was created
    /// (server-side apply creates absent objects).
    pub fn patch(
        &mut self,
        rid: usize,
        ns: &str,
        name: &str,
        kind: PatchKind,
        body: Value,
        ctx: &WriteCtx,
    ) -> Result<(Value, bool), ApiError> {
        let rt = resources::get(rid);
        let key = Self::key(rid, ns, name);
        if kind == PatchKind::Apply {
            return self.apply(rid, ns, name, body, ctx);
        }
        let existing = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        let mut patched = existing.clone();
        match kind {
            PatchKind::Merge | PatchKind::Strategic => {
                if !body.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut patched, &body);
            }
            PatchKind::Json => {
                patch::json_patch(&mut patched, &body).map_err(|e| {
                    ApiError::invalid(
                        rt,
                        name,
                        &format!("the JSON patch could not be applied: {e}"),
                    )
                })?;
            }
            PatchKind::Apply => {}
        }
        Self::check_rv(rt, name, meta_str(&patched, "resourceVersion"), &existing)?;
        let new = if ctx.status() {
            let mut new = existing.clone();
            set_field(
                &mut new,
                "status",
                patched.get("status").cloned().unwrap_or(Value::Null),
            );
            new
        } else {
            if rt.has_status()
                && let Some(map) = patched.as_object_mut()
            {
                match existing.get("status") {
                    Some(s) => {
                        map.insert("status".into(), s.clone());
                    }
                    None => {
                        map.remove("status");
                    }
                }
            }
            patched
        };
        Ok((
            self.finish_update(rid, key, &existing, new, ctx, None)?,
            false,
        ))
    }

    /// Server-side apply (treated as force: conflicts with other managers never fail).
    fn apply(
        &mut self,
        rid: usize,
        ns: &str,
        name: &str,
        mut applied: Value,
        ctx: &WriteCtx,
    ) -> Result<(Value, bool), ApiError> {
        let rt = resources::get(rid);
        let manager = ctx
            .field_manager
            .clone()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "PATCH, application/apply-patch+yaml requires fieldManager to be specified",
                )
            })?;
        if !applied.is_object() {
            return Err(ApiError::bad_request(
                "the applied configuration must be an object",
            ));
        }
        let (av, kind) = (
            applied
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            applied
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        if av != rt.api_version() || kind != rt.kind {
            return Err(ApiError::bad_request(format!(
                "invalid object type: {av}, Kind={kind}; expected {}, Kind={}",
                rt.api_version(),
                rt.kind
            )));
        }
        let applied_name = meta_str(&applied, "name");
        if applied_name.is_empty() {
            with_meta(&mut applied, |m| m.insert("name".into(), json!(name)));
        } else if applied_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({applied_name}) does not match the name on the URL ({name})"
            )));
        }
        Self::check_namespace(rt, &mut applied, ns)?;
        let sub = ctx.subresource.clone().unwrap_or_default();
        let mut fields = patch::applied_fields(&applied, rt.has_status() && !ctx.status());
        if ctx.status() {
            fields.retain(|p| p.first().is_some_and(|f| f == "status"));
        }
        let key = Self::key(rid, ns, name);
        let stamp = Applied {
            fields,
            time: now(),
            api_version: rt.api_version(),
        };
        let Some(existing) = self.objects.get(&key).cloned() else {
            if ctx.status() {
                return Err(ApiError::not_found(rt, name));
            }
            let mut obj = applied;
            with_meta(&mut obj, |m| {
                m.remove("resourceVersion");
                m.remove("managedFields");
            });
            let mut created = self.create(
                rid,
                ns,
                obj,
                &WriteCtx {
                    dry_run: true,
                    ..ctx.clone()
                },
                false,
            )?;
            let mut managers = BTreeMap::new();
            managers.insert((manager, sub), stamp);
            with_meta(&mut created, |m| {
                m.insert("managedFields".into(), render_managed(&managers))
            });
            if !ctx.dry_run {
                let rv = self.next_rv();
                with_meta(&mut created, |m| {
                    m.insert("resourceVersion".into(), json!(rv))
                });
                self.objects.insert(key.clone(), created.clone());
                self.applied.insert(key, managers);
            }
            return Ok((created, true));
        };
        Self::check_rv(rt, name, meta_str(&applied, "resourceVersion"), &existing)?;

        let mut managers = self.applied.get(&key).cloned().unwrap_or_default();
        let previous = managers.remove(&(manager.clone(), sub.clone()));
        // Fields another manager owns, set here to a different value: a conflict, unless
        // forced, which moves their ownership to this manager.
        let mut conflicts: Vec<(String, String, FieldPath)> = Vec::new();
        for ((other, _), theirs) in managers.iter_mut() {
            let clashing: Vec<FieldPath> = stamp
                .fields
                .iter()
                .filter(|p| theirs.fields.contains(*p))
                .filter(|p| value_at(&existing, p) != value_at(&applied, p))
                .cloned()
                .collect();
            if ctx.force {
                for p in &clashing {
                    theirs.fields.remove(p);
                }
            } else {
                conflicts.extend(
                    clashing
                        .into_iter()
                        .map(|p| (other.clone(), theirs.api_version.clone(), p)),
                );
            }
        }
        if !conflicts.is_empty() {
            return Err(ApiError::apply_conflicts(rt, name, &conflicts));
        }
        let mut content = applied.clone();
        if let Some(map) = content.as_object_mut() {
            if let Some(Value::Object(meta)) = map.get_mut("metadata") {
                meta.retain(|k, _| {
                    !matches!(
                        k.as_str(),
                        "name"
                            | "namespace"
                            | "resourceVersion"
                            | "uid"
                            | "managedFields"
                            | "creationTimestamp"
                            | "generation"
                    )
                });
            }
            if ctx.status() {
                map.retain(|k, _| k == "status");
            } else if rt.has_status() {
                map.remove("status");
            }
        }
        let mut new = existing.clone();
        patch::apply_merge(&mut new, &content);
        let previous_stamp = previous.clone();
        if let Some(prev) = previous {
            for path in prev.fields.difference(&stamp.fields) {
                let owned_elsewhere = managers
                    .values()
                    .any(|other| other.fields.iter().any(|p| patch::overlaps(p, path)));
                if !owned_elsewhere {
                    patch::remove_path(&mut new, path);
                }
            }
        }
        let mut stamp = stamp;
        if let Some(prev) = &previous_stamp
            && prev.fields == stamp.fields
        {
            // Re-applying the same field set is not a change (keeps no-op applies no-ops).
            stamp.time = prev.time.clone();
        }
        managers.insert((manager, sub), stamp);
        let managed = render_managed(&managers);
        let result = self.finish_update(rid, key.clone(), &existing, new, ctx, Some(managed))?;
        if !ctx.dry_run {
            self.applied.insert(key, managers);
        }
        Ok((result, false))
    }

    /// Common tail of every update: identity metadata from the stored object, Secret
    /// folding, generation, managedFields, no-op detection, new resourceVersion, commit.
    fn finish_update(
        &mut self,
        rid: usize,
        key: Key,
        existing: &Value,
        mut new: Value,
        ctx: &WriteCtx,
        managed_fields: Option<Value>,
    ) -> Result<Value, ApiError> {
        let rt = resources::get(rid);
        if let Some(map) = new.as_object_mut() {
            map.insert("apiVersion".into(), json!(rt.api_version()));
            map.insert("kind".into(), json!(rt.kind));
        }
        if rt.resource == "secrets" {
            fold_string_data(&mut new);
        }
        let old_meta = existing.get("metadata").cloned().unwrap_or_default();
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let bump = spec_part(existing) != spec_part(&new);
        with_meta(&mut new, |meta| {
            for field in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "generateName",
                "resourceVersion",
                "managedFields",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ] {
                match old_meta.get(field) {
                    Some(v) => {
                        meta.insert(field.into(), v.clone());
                    }
                    None => {
                        meta.remove(field);
                    }
                }
            }
            if let Some(managed) = managed_fields {
                meta.insert("managedFields".into(), managed);
            }
            if tracks_generation(rt) {
                meta.insert(
                    "generation".into(),
                    json!(if bump { generation + 1 } else { generation }),
                );
            }
        });
        validate_object(rt, meta_str(existing, "name"), &new)?;
        if new == *existing {
            return Ok(new);
        }
        // The last finalizer of an object being deleted is gone: the delete completes (a
        // pod still in its grace period waits for its kubelet).
        let grace_over = rt.resource != "pods"
            || new
                .pointer("/metadata/deletionTimestamp")
                .and_then(Value::as_str)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t <= chrono::Utc::now());
        if !ctx.dry_run && deletion_due(&new) && grace_over {
            self.remove_key(&key);
            self.rv += 1;
            return Ok(new);
        }
        if !ctx.dry_run {
            let rv = self.next_rv();
            with_meta(&mut new, |m| m.insert("resourceVersion".into(), json!(rv)));
            self.objects.insert(key, new.clone());
        }
        Ok(new)
    }

    /// DELETE one object (with `preconditions` from DeleteOptions). Returns the deleted
    /// object. Deleting a Namespace deletes its contents; deleting a Node deletes the pods
    /// bound to it (the pod garbage collector, without the wait).
    pub fn delete(
        &mut self,
        rid: usize,
        ns: &str,
        name: &str,
        options: &Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let rt = resources::get(rid);
        let key = Self::key(rid, ns, name);
        let existing = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        if rid == NAMESPACES && UNDELETABLE_NAMESPACES.contains(&name) {
            return Err(ApiError::forbidden(
                format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
                name,
                "",
                "namespaces",
            ));
        }
        if let Some(pre) = options.get("preconditions") {
            let stored_rv = meta_str(&existing, "resourceVersion");
            if let Some(rv) = pre.get("resourceVersion").and_then(Value::as_str)
                && rv != stored_rv
            {
                return Err(ApiError::precondition(
                    rt,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {stored_rv}"
                    ),
                ));
            }
            let stored_uid = meta_str(&existing, "uid");
            if let Some(uid) = pre.get("uid").and_then(Value::as_str)
                && uid != stored_uid
            {
                return Err(ApiError::precondition(
                    rt,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {stored_uid}"
                    ),
                ));
            }
        }
        // Graceful deletion (`BeforeDelete`): a pod bound to a node and not finished gets
        // its grace period (`CheckGracefulDelete`), and any object with finalizers waits
        // for them; both only get `deletionTimestamp` now.
        let grace = if rt.resource == "pods" {
            pod_grace_seconds(&existing, options)
        } else {
            0
        };
        let finalizers = existing
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if grace > 0 || finalizers {
            let at = chrono::Utc::now() + chrono::Duration::seconds(grace);
            let mut marked = existing.clone();
            let earlier = marked
                .pointer("/metadata/deletionTimestamp")
                .and_then(Value::as_str)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t <= at);
            if earlier {
                // Already being deleted at least as soon: nothing changes.
                return Ok(existing);
            }
            with_meta(&mut marked, |m| {
                m.insert(
                    "deletionTimestamp".into(),
                    json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                );
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            });
            if !dry_run {
                let rv = self.next_rv();
                with_meta(&mut marked, |m| {
                    m.insert("resourceVersion".into(), json!(rv))
                });
                self.objects.insert(key, marked.clone());
            }
            return Ok(marked);
        }
        if dry_run {
            return Ok(existing);
        }
        self.remove_key(&key);
        if rid == NAMESPACES {
            let doomed: Vec<Key> = self
                .objects
                .keys()
                .filter(|k| resources::get(k.0).namespaced && k.1 == name)
                .cloned()
                .collect();
            for k in doomed {
                self.remove_key(&k);
            }
        } else if rt.resource == "nodes"
            && let Some(pods) = resources::by_path("", "v1", "pods")
        {
            let doomed: Vec<Key> = self
                .objects
                .iter()
                .filter(|(k, v)| {
                    k.0 == pods && v.pointer("/spec/nodeName").and_then(Value::as_str) == Some(name)
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                self.remove_key(&k);
            }
        }
        self.rv += 1;
        Ok(existing)
    }

    fn remove_key(&mut self, key: &Key) {
        self.objects.remove(key);
        self.applied.remove(key);
    }

    /// Removes an object outright (a kubelet's final delete); no cascades.
    pub fn remove_now(&mut self, rid: usize, ns: &str, name: &str) {
        let key = Self::key(rid, ns, name);
        if self.objects.contains_key(&key) {
            self.remove_key(&key);
            self.rv += 1;
        }
    }

    /// DELETE on a collection: deletes every object matching the query; returns the list.
    pub fn delete_collection(
        &mut self,
        rid: usize,
        ns: Option<&str>,
        q: &ListQuery,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let listed = self.list(
            rid,
            ns,
            &ListQuery {
                limit: None,
                continue_token: None,
                ..q.clone()
            },
        )?;
        if !dry_run {
            let names: Vec<(String, String)> = listed["items"]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|o| {
                            (
                                meta_str(o, "namespace").to_string(),
                                meta_str(o, "name").to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            for (ns, name) in names {
                self.delete(rid, &ns, &name, &Value::Null, false)?;
            }
        }
        Ok(listed)
    }

    /// `POST pods/{name}/eviction`: deletes the pod unless a PodDisruptionBudget forbids it.
    pub fn evict(
        &mut self,
        ns: &str,
        name: &str,
        body: &Value,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let (Some(pods), Some(pdbs)) = (
            resources::by_path("", "v1", "pods"),
            resources::by_path("policy", "v1", "poddisruptionbudgets"),
        ) else {
            return Err(ApiError::internal(
                "pods or poddisruptionbudgets missing from the resource table",
            ));
        };
        let body_name = meta_str(body, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "name in URL does not match name in Eviction object: {name} vs {body_name}"
            )));
        }
        let pod = self.get(pods, ns, name)?;
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let options = body.get("deleteOptions").cloned().unwrap_or(Value::Null);
        // `canIgnorePDB`: finished, Pending and already-terminating pods are deleted
        // (again) without consulting budgets.
        let terminating = pod
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null());
        if terminating || matches!(phase, "Succeeded" | "Failed" | "Pending") {
            self.delete(pods, ns, name, &options, dry_run)?;
            return Ok(());
        }
        let mut budgets = Vec::new();
        for pdb in self.iter(pdbs, Some(ns)) {
            let selector =
                LabelSelector::from_object(pdb.pointer("/spec/selector").unwrap_or(&Value::Null))
                    .map_err(ApiError::internal)?;
            if selector.as_ref().is_some_and(|s| s.matches(&pod)) {
                budgets.push((pdb.clone(), selector.unwrap_or_default()));
            }
        }
        if budgets.len() > 1 {
            // eviction.go returns this Status itself: HTTP 500 with no reason.
            return Err(ApiError::failure(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        if let Some((pdb, selector)) = budgets.first() {
            let matching: Vec<&Value> = self
                .iter(pods, Some(ns))
                .filter(|p| selector.matches(p))
                .collect();
            let expected = matching.len();
            let healthy = matching.iter().filter(|p| pod_healthy(p)).count();
            let spec = pdb.get("spec").cloned().unwrap_or_default();
            let desired = if let Some(max) = spec.get("maxUnavailable").filter(|v| !v.is_null()) {
                expected.saturating_sub(scaled(max, expected).map_err(ApiError::internal)?)
            } else if let Some(min) = spec.get("minAvailable").filter(|v| !v.is_null()) {
                scaled(min, expected).map_err(ApiError::internal)?
            } else {
                0
            };
            let allowed = if pod_healthy(&pod) {
                healthy > desired
            } else {
                spec.get("unhealthyPodEvictionPolicy")
                    .and_then(Value::as_str)
                    == Some("AlwaysAllow")
                    || healthy >= desired
            };
            if !allowed {
                return Err(ApiError::too_many_requests(
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    (
                        "DisruptionBudget",
                        format!(
                            "The disruption budget {} needs {desired} healthy pods and has {healthy} currently",
                            meta_str(pdb, "name")
                        ),
                    ),
                ));
            }
        }
        self.delete(pods, ns, name, &options, dry_run)?;
        Ok(())
    }

    /// Direct write for the simulator: create or fully replace, keeping the given status.
    pub fn upsert(&mut self, rid: usize, mut obj: Value) -> Result<Value, ApiError> {
        let rt = resources::get(rid);
        let name = meta_str(&obj, "name").to_string();
        let ns = if rt.namespaced {
            meta_str(&obj, "namespace").to_string()
        } else {
            String::new()
        };
        if rt.namespaced && ns.is_empty() {
            return Err(ApiError::bad_request(format!(
                "{} {name:?} needs metadata.namespace",
                rt.kind
            )));
        }
        let key = Self::key(rid, &ns, &name);
        match self.objects.get(&key).cloned() {
            None => self.create(rid, &ns, obj, &WriteCtx::default(), true),
            Some(existing) => {
                with_meta(&mut obj, |m| m.remove("resourceVersion"));
                Self::check_type(rt, &mut obj)?;
                self.finish_update(rid, key, &existing, obj, &WriteCtx::default(), None)
            }
        }
    }

    /// Kubelet heartbeat: maintain the Node's Ready condition. Returns false if no such Node.
    #[cfg(test)]
    pub fn set_node_ready(&mut self, name: &str, ready: bool) -> bool {
        self.set_node_condition(
            name,
            if ready {
                NodeCondition::Ready
            } else {
                NodeCondition::Unknown
            },
        )
    }

    /// Sets the Node's Ready condition. Returns false if no such Node.
    pub fn set_node_condition(&mut self, name: &str, condition: NodeCondition) -> bool {
        let Some(nodes) = resources::by_path("", "v1", "nodes") else {
            return false;
        };
        let key = Self::key(nodes, "", name);
        let Some(existing) = self.objects.get(&key).cloned() else {
            return false;
        };
        let stamp = now();
        let (status, reason, message) = match condition {
            NodeCondition::Ready => ("True", "KubeletReady", "kubelet is posting ready status"),
            NodeCondition::NotReady => ("False", "KubeletNotReady", NOT_READY_MESSAGE),
            NodeCondition::Unknown => (
                "Unknown",
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
            ),
        };
        let mut node = existing.clone();
        let mut conditions: Vec<Value> = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let previous = conditions.iter().position(|c| c["type"] == "Ready");
        let transition = match previous.and_then(|i| conditions.get(i)) {
            Some(c) if c["status"] == status => {
                c.get("lastTransitionTime").cloned().unwrap_or(json!(stamp))
            }
            _ => json!(stamp),
        };
        let cond = json!({
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": transition,
        });
        match previous {
            Some(i) => conditions[i] = cond,
            None => conditions.push(cond),
        }
        let mut status = node
            .get("status")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        status.insert("conditions".into(), Value::Array(conditions));
        set_field(&mut node, "status", Value::Object(status));
        self.finish_update(nodes, key, &existing, node, &WriteCtx::default(), None)
            .is_ok()
    }

    /// Direct delete for the simulator (same cascades as the API). False if absent.
    pub fn remove(&mut self, rid: usize, ns: &str, name: &str) -> bool {
        if !self.objects.contains_key(&Self::key(rid, ns, name)) {
            return false;
        }
        if rid == NAMESPACES && UNDELETABLE_NAMESPACES.contains(&name) {
            self.remove_key(&Self::key(rid, ns, name));
            return true;
        }
        // Like a force delete (grace 0): finalizers still hold the object.
        self.delete(rid, ns, name, &json!({"gracePeriodSeconds": 0}), false)
            .is_ok()
    }
}

/// The value at a field path (maps only), if any.
fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |cur, part| cur.get(part))
}

/// Whether an object marked for deletion has no finalizers left.
fn deletion_due(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
        && obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

/// `podStrategy.CheckGracefulDelete`: the request's `gracePeriodSeconds`, else the pod's
/// `terminationGracePeriodSeconds` (API default 30); 0 for a pod not bound to a node or
/// already finished.
fn pod_grace_seconds(pod: &Value, options: &Value) -> i64 {
    let mut period = options
        .get("gracePeriodSeconds")
        .and_then(Value::as_i64)
        .or_else(|| {
            pod.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30);
    if pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        period = 0;
    }
    if matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    ) {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    period
}

fn render_managed(managers: &BTreeMap<(String, String), Applied>) -> Value {
    Value::Array(
        managers
            .iter()
            .map(|((manager, sub), a)| {
                let mut entry = json!({
                    "manager": manager,
                    "operation": "Apply",
                    "apiVersion": a.api_version,
                    "time": a.time,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": patch::fields_v1(&a.fields),
                });
                if !sub.is_empty() {
                    entry["subresource"] = json!(sub);
                }
                entry
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn cm() -> usize {
        resources::by_path("", "v1", "configmaps").unwrap()
    }

    fn ctx() -> WriteCtx {
        WriteCtx::default()
    }

    #[test]
    fn create_fills_metadata_and_rejects_duplicates() {
        let mut s = Store::new();
        let obj = s
            .create(
                cm(),
                "default",
                json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
                &ctx(),
                false,
            )
            .unwrap();
        assert_eq!(obj["kind"], "ConfigMap");
        assert_eq!(obj["metadata"]["namespace"], "default");
        assert!(!meta_str(&obj, "uid").is_empty());
        assert!(!meta_str(&obj, "resourceVersion").is_empty());
        let dup = s.create(
            cm(),
            "default",
            json!({"metadata": {"name": "a"}}),
            &ctx(),
            false,
        );
        assert_eq!(dup.unwrap_err().reason, "AlreadyExists");
        let bad = s.create(
            cm(),
            "default",
            json!({"metadata": {"name": "Bad_Name"}}),
            &ctx(),
            false,
        );
        assert_eq!(bad.unwrap_err().code, 422);
        let nons = s.create(
            cm(),
            "nope",
            json!({"metadata": {"name": "a"}}),
            &ctx(),
            false,
        );
        assert_eq!(nons.unwrap_err().message, "namespaces \"nope\" not found");
        let generated = s
            .create(
                cm(),
                "default",
                json!({"metadata": {"generateName": "x-"}}),
                &ctx(),
                false,
            )
            .unwrap();
        assert!(meta_str(&generated, "name").starts_with("x-"));
        assert_eq!(meta_str(&generated, "name").len(), 7);
    }

    #[test]
    fn replace_checks_resource_version_and_noop_keeps_it() {
        let mut s = Store::new();
        let obj = s
            .create(
                cm(),
                "default",
                json!({"metadata": {"name": "a"}, "data": {"n": "0"}}),
                &ctx(),
                false,
            )
            .unwrap();
        let mut next = obj.clone();
        next["data"]["n"] = json!("1");
        let updated = s
            .replace(cm(), "default", "a", next.clone(), &ctx())
            .unwrap();
        assert_ne!(
            meta_str(&updated, "resourceVersion"),
            meta_str(&obj, "resourceVersion")
        );
        let stale = s.replace(cm(), "default", "a", next, &ctx()).unwrap_err();
        assert_eq!((stale.code, stale.reason), (409, "Conflict"));
        let same = s
            .replace(cm(), "default", "a", updated.clone(), &ctx())
            .unwrap();
        assert_eq!(
            meta_str(&same, "resourceVersion"),
            meta_str(&updated, "resourceVersion")
        );
    }

    #[test]
    fn generation_tracks_spec_changes_only_where_the_apiserver_keeps_it() {
        let mut s = Store::new();
        let deploys = resources::by_path("apps", "v1", "deployments").unwrap();
        let d = s
            .create(
                deploys,
                "default",
                json!({"metadata": {"name": "d"}, "spec": {"replicas": 1}}),
                &ctx(),
                false,
            )
            .unwrap();
        assert_eq!(d["metadata"]["generation"], 1);
        let merge = |s: &mut Store, p: Value| {
            s.patch(deploys, "default", "d", PatchKind::Merge, p, &ctx())
                .unwrap()
                .0
        };
        let d = merge(&mut s, json!({"metadata": {"labels": {"a": "b"}}}));
        assert_eq!(d["metadata"]["generation"], 1);
        let d = merge(&mut s, json!({"spec": {"replicas": 3}}));
        assert_eq!(d["metadata"]["generation"], 2);
        let c = s
            .create(
                cm(),
                "default",
                json!({"metadata": {"name": "c"}}),
                &ctx(),
                false,
            )
            .unwrap();
        assert!(c["metadata"].get("generation").is_none());
    }

    #[test]
    fn validation_of_config_keys_sizes_and_events() {
        let mut s = Store::new();
        let bad_key = s.create(
            cm(),
            "default",
            json!({"metadata": {"name": "k"}, "data": {"a/b": "x"}}),
            &ctx(),
            false,
        );
        assert!(
            bad_key
                .unwrap_err()
                .message
                .starts_with("ConfigMap \"k\" is invalid: data[a/b]: Invalid value")
        );
        let big = "x".repeat(MAX_DATA_BYTES + 1);
        let too_big = s.create(
            cm(),
            "default",
            json!({"metadata": {"name": "big"}, "data": {"a": big}}),
            &ctx(),
            false,
        );
        assert_eq!(
            too_big.unwrap_err().message,
            "ConfigMap \"big\" is invalid: []: Too long: must have at most 1048576 bytes"
        );
        let events = resources::by_kind("events.k8s.io/v1", "Event").unwrap();
        let err = s
            .create(
                events,
                "default",
                json!({"metadata": {"name": "e"}, "type": "Normal", "note": "n"}),
                &ctx(),
                false,
            )
            .unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.starts_with("Event.events.k8s.io \"e\" is invalid: [eventTime: Required value, reportingController: Required value"), "{}", err.message);
        let ok = json!({"metadata": {"name": "e"}, "type": "Warning", "note": "n", "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "oxide-controller", "reportingInstance": "run-1", "action": "Scale", "reason": "ScaledUp"});
        s.create(events, "default", ok, &ctx(), false).unwrap();
    }

    #[test]
    fn secret_string_data_folds_into_data() {
        let mut s = Store::new();
        let secrets = resources::by_path("", "v1", "secrets").unwrap();
        let obj = s
            .create(
                secrets,
                "kube-system",
                json!({"metadata": {"name": "s"}, "stringData": {"token": "abc"}}),
                &ctx(),
                false,
            )
            .unwrap();
        assert_eq!(obj["data"]["token"], "YWJj");
        assert!(obj.get("stringData").is_none());
        assert_eq!(obj["type"], "Opaque");
    }

    #[test]
    fn status_is_only_written_through_the_subresource() {
        let mut s = Store::new();
        let pods = resources::by_path("", "v1", "pods").unwrap();
        let pod = s
            .create(
                pods,
                "default",
                json!({"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Running"}}),
                &ctx(),
                false,
            )
            .unwrap();
        assert_eq!(pod["status"]["phase"], "Pending");
        let (p, _) = s
            .patch(
                pods,
                "default",
                "p",
                PatchKind::Merge,
                json!({"status": {"phase": "Running"}}),
                &ctx(),
            )
            .unwrap();
        assert_eq!(p["status"]["phase"], "Pending");
        let status_ctx = WriteCtx {
            subresource: Some("status".into()),
            ..ctx()
        };
        let (p, _) = s
            .patch(
                pods,
                "default",
                "p",
                PatchKind::Merge,
                json!({"status": {"phase": "Running"}, "spec": {"nodeName": "x"}}),
                &status_ctx,
            )
            .unwrap();
        assert_eq!(p["status"]["phase"], "Running");
        assert!(p.pointer("/spec/nodeName").is_none());
    }

    #[test]
    fn apply_removes_fields_the_manager_stopped_setting() {
        let mut s = Store::new();
        let apply = |s: &mut Store, mgr: &str, data: Value| {
            let c = WriteCtx {
                field_manager: Some(mgr.into()),
                ..ctx()
            };
            s.patch(cm(), "default", "a", PatchKind::Apply, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": data}), &c)
        };
        let (obj, created) = apply(&mut s, "one", json!({"a": "1", "b": "2"})).unwrap();
        assert!(created);
        assert_eq!(obj["data"], json!({"a": "1", "b": "2"}));
        apply(&mut s, "two", json!({"c": "3", "b": "2"})).unwrap();
        let (obj, created) = apply(&mut s, "one", json!({"a": "1"})).unwrap();
        assert!(!created);
        // b is still applied by "two", so it stays; "one" never owned c.
        assert_eq!(obj["data"], json!({"a": "1", "b": "2", "c": "3"}));
        let (obj, _) = apply(&mut s, "two", json!({})).unwrap();
        assert_eq!(obj["data"], json!({"a": "1"}));
        assert_eq!(
            obj["metadata"]["managedFields"].as_array().map(Vec::len),
            Some(2)
        );
        let missing = s.patch(
            cm(),
            "default",
            "a",
            PatchKind::Apply,
            json!({"apiVersion": "v1", "kind": "ConfigMap"}),
            &ctx(),
        );
        assert_eq!(missing.unwrap_err().code, 400);
    }

    #[test]
    fn node_ready_keeps_transition_time_without_a_change() {
        let mut s = Store::new();
        let nodes = resources::by_path("", "v1", "nodes").unwrap();
        s.upsert(
            nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        )
        .unwrap();
        assert!(s.set_node_ready("n1", true));
        let first = s.get(nodes, "", "n1").unwrap();
        let t0 = first
            .pointer("/status/conditions/0/lastTransitionTime")
            .cloned();
        assert!(s.set_node_ready("n1", true));
        let again = s.get(nodes, "", "n1").unwrap();
        assert_eq!(
            again
                .pointer("/status/conditions/0/lastTransitionTime")
                .cloned(),
            t0
        );
        assert!(s.set_node_ready("n1", false));
        let down = s.get(nodes, "", "n1").unwrap();
        assert_eq!(
            down.pointer("/status/conditions/0/status"),
            Some(&json!("Unknown"))
        );
        assert_eq!(
            down.pointer("/status/conditions/0/reason"),
            Some(&json!("NodeStatusUnknown"))
        );
        assert!(!s.set_node_ready("nope", true));
    }

    #[test]
    fn deleting_a_node_deletes_its_pods_and_namespace_its_contents() {
        let mut s = Store::new();
        let nodes = resources::by_path("", "v1", "nodes").unwrap();
        let pods = resources::by_path("", "v1", "pods").unwrap();
        s.upsert(
            nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        )
        .unwrap();
        for (p, node) in [("a", "n1"), ("b", "n2")] {
            s.upsert(pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": p, "namespace": "default"}, "spec": {"nodeName": node}})).unwrap();
        }
        s.delete(nodes, "", "n1", &Value::Null, false).unwrap();
        assert_eq!(s.count(pods), 1);
        s.upsert(
            NAMESPACES,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}),
        )
        .unwrap();
        s.create(cm(), "x", json!({"metadata": {"name": "c"}}), &ctx(), false)
            .unwrap();
        s.delete(NAMESPACES, "", "x", &Value::Null, false).unwrap();
        assert!(s.get(cm(), "x", "c").is_err());
        assert_eq!(
            s.delete(NAMESPACES, "", "kube-system", &Value::Null, false)
                .unwrap_err()
                .code,
            403
        );
    }

    #[test]
    fn list_pages_with_continue() {
        let mut s = Store::new();
        for i in 0..5 {
            s.create(
                cm(),
                "default",
                json!({"metadata": {"name": format!("c{i}"), "labels": {"i": i.to_string()}}}),
                &ctx(),
                false,
            )
            .unwrap();
        }
        let mut q = ListQuery {
            limit: Some(2),
            ..Default::default()
        };
        let mut names = Vec::new();
        loop {
            let page = s.list(cm(), Some("default"), &q).unwrap();
            for item in page["items"].as_array().unwrap() {
                assert!(item.get("kind").is_none());
                names.push(meta_str(item, "name").to_string());
            }
            match page["metadata"]["continue"].as_str() {
                Some(c) => q.continue_token = Some(c.to_string()),
                None => break,
            }
        }
        assert_eq!(names, ["c0", "c1", "c2", "c3", "c4"]);
    }
}
