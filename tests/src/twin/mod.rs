//! The cluster twin: a Kubernetes API server good enough for the real `kube` client,
//! standing in for the k3s apiserver of a simulated cluster. It owns its own CA, serves
//! HTTPS (HTTP/1.1, rustls with aws-lc-rs), authenticates admin client certificates and
//! ServiceAccount tokens, enforces RBAC from stored objects, and keeps every object in one
//! in-memory store with apiserver semantics (resourceVersion conflicts, server-side apply,
//! selectors, status subresources, Eviction against PodDisruptionBudgets).
//!
//! Beside the apiserver it runs what changes objects on its own in a cluster, to a fixed
//! point before each request ([`controllers`], [`scheduler`]): node NoSchedule taints,
//! Deployment/ReplicaSet/DaemonSet controllers, the scheduler, and a kubelet per Ready Node
//! that starts bound pods and ends gracefully deleted ones.
//!
//! What does NOT live here: booting VMs, deciding which Nodes exist or when kubelets
//! report (the simulator calls [`Twin::upsert`] and [`Twin::set_node_ready`] for that),
//! and running Jobs (see `crate::jobs`).
//!
//! Layout: [`resources`] (served types, discovery), [`store`] (data and write semantics),
//! [`patch`], [`select`], [`rbac`], [`status`] (errors), [`pki`], [`server`] (HTTP).

mod controllers;
mod patch;
mod pki;
mod protobuf;
mod rbac;
mod resources;
mod scheduler;
mod select;
mod server;
mod status;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use serde_json::{Value, json};

pub use pki::Identity;
use pki::{ClientCert, Pki};
use store::Store;
pub use store::{NOT_READY_MESSAGE, NodeCondition};

/// Errors from building the twin or from direct (non-HTTP) object access.
#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    /// Generating or signing a key or certificate failed.
    #[error("twin PKI: {what}")]
    Pki {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// Assembling the rustls configuration failed.
    #[error("twin TLS: {what}")]
    Tls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    /// Binding the loopback listener failed.
    #[error("twin: binding a loopback listener")]
    Bind(#[source] std::io::Error),
    /// The client-certificate verifier could not be built.
    #[error("twin TLS: building the client certificate verifier: {0}")]
    ClientVerifier(String),
    /// The object's apiVersion/kind is not a resource the twin serves.
    #[error("the twin does not serve kind {kind:?} in {api_version:?}")]
    UnknownKind { api_version: String, kind: String },
    /// The store refused the object, as the apiserver would (`code` is the HTTP status).
    #[error("the twin rejected the object ({code} {reason}): {message}")]
    Rejected {
        code: u16,
        reason: &'static str,
        message: String,
    },
}

impl From<status::ApiError> for TwinError {
    fn from(e: status::ApiError) -> Self {
        TwinError::Rejected {
            code: e.code,
            reason: e.reason,
            message: e.message,
        }
    }
}

/// Twin settings.
#[derive(Debug, Clone)]
pub struct TwinConfig {
    /// Reported by `/version` as `gitVersion` (e.g. `v1.33.4+k3s1`).
    pub k3s_version: String,
    /// Runtime faults; the twin reads [`crate::oxide::FaultSpec::kube`].
    pub faults: crate::oxide::Faults,
}

impl Default for TwinConfig {
    fn default() -> Self {
        Self {
            k3s_version: "v1.33.4+k3s1".to_string(),
            faults: crate::oxide::Faults::default(),
        }
    }
}

struct Inner {
    cfg: TwinConfig,
    pki: Pki,
    admin: ClientCert,
    store: Mutex<Store>,
    /// Bearer token → identity. Tokens are secrets: never logged, never in Debug.
    tokens: Mutex<HashMap<String, Identity>>,
    counters: Mutex<BTreeMap<String, u64>>,
}

/// A twin serving HTTPS on an ephemeral `127.0.0.1` port (for tests). Dropping it stops
/// the server and closes its connections.
#[derive(Debug)]
pub struct LocalTwin {
    /// The twin being served.
    pub twin: Twin,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl LocalTwin {
    /// The admin kubeconfig for this server.
    pub fn admin_kubeconfig(&self) -> String {
        self.twin.admin_kubeconfig(&self.url)
    }
}

impl Drop for LocalTwin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A handle on one cluster twin (cheap to clone; all clones share the same cluster).
#[derive(Clone)]
pub struct Twin {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Twin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Twin")
            .field("k3s_version", &self.inner.cfg.k3s_version)
            .finish_non_exhaustive()
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn kubeconfig(server_url: &str, ca_pem: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\n\
         clusters:\n\
         - cluster:\n    certificate-authority-data: {ca}\n    server: {server_url}\n  name: default\n\
         contexts:\n\
         - context:\n    cluster: default\n    user: default\n  name: default\n\
         current-context: default\n\
         kind: Config\n\
         preferences: {{}}\n\
         users:\n\
         - name: default\n  user:\n{user}",
        ca = b64(ca_pem),
    )
}

fn resource_id(api_version: &str, kind: &str) -> Result<usize, TwinError> {
    resources::by_kind(api_version, kind).ok_or_else(|| TwinError::UnknownKind {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
    })
}

impl Twin {
    /// A fresh, empty cluster (namespaces default, kube-system, kube-public,
    /// kube-node-lease) with its own CA and admin client certificate.
    pub fn new(cfg: TwinConfig) -> Result<Twin, TwinError> {
        let pki = Pki::new()?;
        let admin = pki.issue_client(&Identity::admin())?;
        Ok(Twin {
            inner: Arc::new(Inner {
                cfg,
                pki,
                admin,
                store: Mutex::new(Store::new()),
                tokens: Mutex::new(HashMap::new()),
                counters: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// The CA certificate (PEM) that signs the serving and client certificates.
    pub fn ca_pem(&self) -> String {
        self.inner.pki.ca_pem().to_string()
    }

    /// rustls server config with a serving certificate for `sans` (IP literals or DNS
    /// names; `127.0.0.1`, `localhost` and the in-cluster `kubernetes*` names are always
    /// added), signed by the CA. Client certificates signed by the CA are accepted but not
    /// required (bearer tokens need certificate-less connections).
    pub fn server_tls_config(
        &self,
        sans: &[String],
    ) -> Result<Arc<rustls::ServerConfig>, TwinError> {
        self.inner.pki.server_config(sans)
    }

    /// Accept loop: TLS + HTTP/1.1 on the listener until the task is aborted. Aborting
    /// also closes every open connection.
    pub async fn serve(self, listener: tokio::net::TcpListener, tls: Arc<rustls::ServerConfig>) {
        self.accept_loop(listener, tls).await;
    }

    /// Serves on a fresh `127.0.0.1:0` listener with a certificate for `127.0.0.1`
    /// (convenience for tests; the simulator wires listeners itself with [`Twin::serve`]).
    pub async fn serve_local(self) -> Result<LocalTwin, TwinError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(TwinError::Bind)?;
        let addr = listener.local_addr().map_err(TwinError::Bind)?;
        let tls = self.server_tls_config(&["127.0.0.1".to_string()])?;
        let task = tokio::spawn(self.clone().serve(listener, tls));
        Ok(LocalTwin {
            twin: self,
            url: format!("https://{addr}"),
            task,
        })
    }

    /// k3s-shaped kubeconfig (cluster, context and user all named `default`) with the
    /// admin client certificate (`system:admin`, `system:masters`) and the CA inline.
    pub fn admin_kubeconfig(&self, server_url: &str) -> String {
        // k3s puts the client certificate followed by its CA in client-certificate-data.
        let chain = format!("{}{}", self.inner.admin.cert_pem, self.inner.pki.ca_pem());
        let user = format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&chain),
            b64(&self.inner.admin.key_pem)
        );
        kubeconfig(server_url, self.inner.pki.ca_pem(), &user)
    }

    /// Kubeconfig authenticating as ServiceAccount `ns/name` with a fresh bearer token;
    /// RBAC applies to it.
    pub fn service_account_kubeconfig(&self, server_url: &str, ns: &str, name: &str) -> String {
        let token = self.service_account_token(ns, name);
        kubeconfig(
            server_url,
            self.inner.pki.ca_pem(),
            &format!("    token: {token}\n"),
        )
    }

    /// A fresh bearer token for ServiceAccount `ns/name` (what a projected token volume
    /// would hold in a pod).
    pub fn service_account_token(&self, ns: &str, name: &str) -> String {
        let token =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        self.inner
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), Identity::service_account(ns, name));
        token
    }

    /// Kubeconfig with a client certificate for an arbitrary user and groups (RBAC
    /// applies unless a group is `system:masters`).
    pub fn user_kubeconfig(
        &self,
        server_url: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<String, TwinError> {
        let mut all: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        all.push("system:authenticated".into());
        let cert = self.inner.pki.issue_client(&Identity {
            user: user.to_string(),
            groups: all,
        })?;
        let user = format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&cert.cert_pem),
            b64(&cert.key_pem)
        );
        Ok(kubeconfig(server_url, self.inner.pki.ca_pem(), &user))
    }

    pub(crate) fn token_identity(&self, token: &str) -> Option<Identity> {
        self.inner
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }

    /// The store, with the controllers, scheduler and kubelets caught up (see
    /// [`controllers`]): whoever looks sees a settled cluster.
    pub(crate) fn lock_store(&self) -> MutexGuard<'_, Store> {
        let mut store = self.inner.store.lock().unwrap_or_else(|e| e.into_inner());
        store.settle(chrono::Utc::now());
        store
    }

    pub(crate) fn count(&self, key: &str) {
        let mut counters = self
            .inner
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *counters.entry(key.to_string()).or_default() += 1;
    }

    /// Creates or fully replaces an object (by apiVersion + kind + metadata), bypassing
    /// authentication and keeping the given `status`. Namespaced objects need an existing
    /// namespace. Returns the stored object.
    pub fn upsert(&self, obj: Value) -> Result<Value, TwinError> {
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let rid = resource_id(av, kind)?;
        Ok(self.lock_store().upsert(rid, obj)?)
    }

    /// One object, or None. `ns` is ignored for cluster-scoped kinds.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let rid = resources::by_kind(api_version, kind)?;
        self.lock_store()
            .get(rid, ns.unwrap_or_default(), name)
            .ok()
    }

    /// All objects of a kind (in one namespace, or everywhere when `ns` is None), sorted by
    /// namespace and name. Unknown kinds list as empty.
    pub fn list(&self, api_version: &str, kind: &str, ns: Option<&str>) -> Vec<Value> {
        let Some(rid) = resources::by_kind(api_version, kind) else {
            return Vec::new();
        };
        self.lock_store().iter(rid, ns).cloned().collect()
    }

    /// Deletes an object (with the API's cascades: a Namespace's contents, a Node's pods).
    /// False if it did not exist.
    pub fn delete(&self, api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> bool {
        let Some(rid) = resources::by_kind(api_version, kind) else {
            return false;
        };
        self.lock_store().remove(rid, ns.unwrap_or_default(), name)
    }

    /// Sets the Node's Ready condition (see [`NodeCondition`]); `lastTransitionTime` moves
    /// only on a change. Does nothing if the Node does not exist.
    pub fn set_node_condition(&self, name: &str, condition: NodeCondition) {
        if !self.lock_store().set_node_condition(name, condition) {
            tracing::debug!(node = name, "twin: set_node_condition on a missing Node");
        }
    }

    /// Kubelet heartbeat: sets the Node's Ready condition to True (ready) or Unknown with
    /// reason NodeStatusUnknown (not ready); `lastTransitionTime` only moves on a change,
    /// `lastHeartbeatTime` always. Does nothing if the Node does not exist.
    pub fn set_node_ready(&self, name: &str, ready: bool) {
        let condition = if ready {
            NodeCondition::Ready
        } else {
            NodeCondition::Unknown
        };
        if !self.lock_store().set_node_condition(name, condition) {
            tracing::debug!(node = name, "twin: set_node_ready on a missing Node");
        }
    }

    /// Requests served, keyed by `METHOD /path/template` (e.g.
    /// `PUT /api/v1/namespaces/{namespace}/configmaps/{name}`, `GET /api/v1/nodes`).
    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.inner
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Zeroes the request counters.
    pub fn reset_counters(&self) {
        self.inner
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// A summary for admin endpoints and test failure messages:
    /// `{"resourceVersion", "nodes": [names], "ready_nodes": [names], "pods": n,
    /// "counts": {"<resource>[.<group>]": n}}`. Never includes Secret contents.
    pub fn dump(&self) -> Value {
        let store = self.lock_store();
        let mut counts = serde_json::Map::new();
        for (rid, rt) in resources::RESOURCES.iter().enumerate() {
            counts.insert(status::qualified(rt), json!(store.count(rid)));
        }
        let (mut nodes, mut ready) = (Vec::new(), Vec::new());
        let mut pods = 0;
        if let Some(rid) = resources::by_path("", "v1", "nodes") {
            for node in store.iter(rid, None) {
                let name = node
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let is_ready = node
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                if is_ready {
                    ready.push(name.clone());
                }
                nodes.push(name);
            }
        }
        if let Some(rid) = resources::by_path("", "v1", "pods") {
            pods = store.count(rid);
        }
        json!({
            "resourceVersion": store.resource_version(),
            "nodes": nodes,
            "ready_nodes": ready,
            "pods": pods,
            "counts": counts,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn direct_access_round_trip() {
        let twin = Twin::new(TwinConfig::default()).unwrap();
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1", "labels": {"a": "b"}}});
        let stored = twin.upsert(node).unwrap();
        assert!(stored["metadata"]["uid"].is_string());
        twin.set_node_ready("w1", true);
        assert_eq!(twin.dump()["ready_nodes"], json!(["w1"]));
        assert_eq!(twin.list("v1", "Node", None).len(), 1);
        assert!(twin.get("v1", "Node", None, "w1").is_some());
        let bad = twin.upsert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "missing"}}));
        assert!(matches!(bad, Err(TwinError::Rejected { code: 404, .. })));
        assert!(matches!(
            twin.upsert(json!({"apiVersion": "x/v1", "kind": "Widget"})),
            Err(TwinError::UnknownKind { .. })
        ));
        assert!(twin.delete("v1", "Node", None, "w1"));
        assert!(!twin.delete("v1", "Node", None, "w1"));
        assert_eq!(twin.list("v1", "Namespace", None).len(), 4);
    }

    #[test]
    fn kubeconfigs_do_not_leak_into_debug() {
        let twin = Twin::new(TwinConfig::default()).unwrap();
        let kc = twin.service_account_kubeconfig("https://127.0.0.1:6443", "kube-system", "ctl");
        let token = kc
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .unwrap()
            .to_string();
        assert!(!format!("{twin:?}").contains(&token));
        assert!(twin.token_identity(&token).is_some());
    }
}
