//! A simulated cluster's Kubernetes API: a real control plane ([`crate::control_plane`])
//! started when the cluster's first server runs k3s `cluster-init`, reached through a
//! [`FrontProxy`] on each server's `:6443`.
//!
//! What k3s adds to Kubernetes stays in the guest simulator (the supervisor's join checks,
//! tokens, `/cacerts`); what a kubelet does to its Node is done here: the Node is
//! registered through the API and handed to KWOK (label), which keeps it Ready and plays its
//! pods; a halted VM's Node is relabelled, so KWOK lets go of it: its heartbeats stop (the
//! real node lifecycle controller marks it Unknown after its grace period) and its pods are
//! neither started nor confirmed gone, as on a dead machine.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::control_plane::proxy::FrontProxy;
use crate::control_plane::{
    ControlPlane, ControlPlaneError, ControlPlaneOptions, KWOK_HALTED, KWOK_LABEL, KWOK_LABEL_VALUE,
};
use crate::oxide::faults::Faults;

/// A real control plane and the proxy its servers' listeners share.
#[derive(Debug)]
pub struct RealCluster {
    pub control_plane: ControlPlane,
    pub proxy: Arc<FrontProxy>,
    /// `https://IP:6444`: the proxy as pods reach the API (the `kubernetes` Service, whose
    /// endpoints are the servers' `:6443`), so faults and counters see their requests too.
    pub service_url: String,
    service: tokio::task::JoinHandle<()>,
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        self.service.abort();
    }
}

impl RealCluster {
    /// Starts a control plane for a new cluster whose first etcd member is `member` on
    /// `member_ip` (the cluster-init server's own address); for a server restored from a
    /// snapshot, with the PKI and etcd data the restore left on its disk
    /// ([`ControlPlane::start_restored`]).
    pub async fn start(
        opts: ControlPlaneOptions,
        faults: Faults,
        member: &str,
        member_ip: Option<std::net::Ipv4Addr>,
        restored: Option<(Arc<crate::control_plane::pki::Pki>, std::path::PathBuf)>,
    ) -> Result<RealCluster, ControlPlaneError> {
        let control_plane = ControlPlane::start_restored(opts, member, member_ip, restored).await?;
        let proxy = FrontProxy::new(&control_plane, faults)?;
        let ip = control_plane.ip();
        let listener = tokio::net::TcpListener::bind((ip, 6444))
            .await
            .map_err(|source| ControlPlaneError::Io {
                path: format!("{ip}:6444").into(),
                source,
            })?;
        let tls = proxy.tls_config(&[
            ip.to_string(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
            "10.43.0.1".into(),
        ])?;
        let service = tokio::spawn(Arc::clone(&proxy).serve(listener, tls));
        Ok(RealCluster {
            control_plane,
            proxy,
            service_url: format!("https://{ip}:6444"),
            service,
        })
    }
}

impl RealCluster {
    /// The cluster CA (PEM): what `/cacerts` serves and the token's `K10<hash>` covers.
    pub fn ca_pem(&self) -> String {
        self.control_plane.ca_pem().to_string()
    }

    /// `/etc/rancher/k3s/k3s.yaml`: `system:admin` (group `system:masters`) at `server`.
    pub fn admin_kubeconfig(&self, server: &str) -> String {
        self.admin_kubeconfig_until(server, None)
    }

    /// [`Self::admin_kubeconfig`] whose client certificate is one of the node's leaf
    /// certificates, valid until `end` (see [`crate::guest::certs`]; None: for ever).
    pub fn admin_kubeconfig_until(
        &self,
        server: &str,
        end: Option<std::time::SystemTime>,
    ) -> String {
        self.control_plane
            .user_kubeconfig_until(server, "system:admin", &["system:masters"], end)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot issue the admin certificate");
                String::new()
            })
    }
}

/// The kubelet's registration on a real control plane: creates the Node if missing (with its
/// registration taints, which a kubelet sets only at creation, and k3s's finalizers), else adds the kubelet's
/// labels and the provider ID without touching spec changes others made (cordon, taints);
/// then sets capacity and allocatable, and hands the Node to KWOK.
pub async fn register_real_node(cp: &ControlPlane, fresh: Value) -> Result<(), ControlPlaneError> {
    let name = fresh["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut node = fresh.clone();
    node["metadata"]["labels"][KWOK_LABEL] = json!(KWOK_LABEL_VALUE);
    if let Some(status) = node.as_object_mut().and_then(|o| o.remove("status")) {
        node["status"] = json!({
            "capacity": status["capacity"],
            "allocatable": status["allocatable"],
            "nodeInfo": status["nodeInfo"],
            "addresses": status["addresses"],
        });
    }
    match cp.get("v1", "Node", None, &name).await? {
        None => {
            // A server's wrangler handlers add their finalizers as soon as they see the Node.
            node["metadata"]["finalizers"] = json!(K3S_NODE_FINALIZERS);
            cp.create(node.clone()).await?;
        }
        Some(existing) => {
            let mut patch = json!({"metadata": {
                "labels": node["metadata"]["labels"],
                "annotations": {},
            }});
            // k3s sets its config annotations again at every start.
            for key in NODE_CONFIG_ANNOTATIONS {
                patch["metadata"]["annotations"][key] =
                    node["metadata"]["annotations"][key].clone();
            }
            if existing["spec"]["providerID"].is_null() && !node["spec"]["providerID"].is_null() {
                patch["spec"] = json!({"providerID": node["spec"]["providerID"]});
            }
            cp.merge_patch("v1", "Node", None, &name, &patch).await?;
        }
    }
    if !node["status"].is_null() {
        cp.merge_patch_status(
            "v1",
            "Node",
            None,
            &name,
            &json!({"status": node["status"]}),
        )
        .await?;
    }
    Ok(())
}

/// The annotation k3s writes its arguments in (k3s `pkg/nodeconfig` `NodeArgsAnnotation`).
pub const NODE_ARGS_ANNOTATION: &str = "k3s.io/node-args";

/// The k3s Node annotations a (re-)starting k3s sets again (`SetNodeConfigAnnotations`).
const NODE_CONFIG_ANNOTATIONS: [&str; 3] = [
    NODE_ARGS_ANNOTATION,
    "k3s.io/node-env",
    "k3s.io/node-config-hash",
];

/// The finalizers k3s's servers put on every Node: wrangler's `OnRemove` adds
/// `wrangler.cattle.io/<handler>` to each object its handler sees, and k3s registers two on
/// Nodes, `node` (the CoreDNS `NodeHosts` entry, `pkg/node/controller.go` `Register`) and
/// `managed-etcd-controller` (the etcd member, `pkg/etcd/member_controller.go`
/// `RegisterMemberHandlers`). A deleted Node stays (Terminating) until a running server's
/// handlers have run and dropped them.
pub const K3S_NODE_FINALIZERS: [&str; 2] = [
    "wrangler.cattle.io/node",
    "wrangler.cattle.io/managed-etcd-controller",
];

/// What a running k3s server's `OnRemove` handlers do for Nodes being deleted: the etcd
/// member controller removes the member named in the Node's etcd annotations (k3s
/// `removePeer`) and keeps its finalizer while etcd refuses (wrangler retries a handler that
/// fails); the other handler's work (the hosts entry) is not modelled and its finalizer goes.
pub async fn finish_node_removals(cp: &ControlPlane) -> Result<(), ControlPlaneError> {
    for node in cp.list("v1", "Node", None).await? {
        if node["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let finalizers: Vec<Value> = node["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let etcd_done = !finalizers.iter().any(|f| *f == K3S_NODE_FINALIZERS[1])
            || remove_etcd_member(cp, &node).await;
        let kept: Vec<Value> = finalizers
            .iter()
            .filter(|f| {
                !K3S_NODE_FINALIZERS.iter().any(|k| *f == k)
                    || (!etcd_done && **f == K3S_NODE_FINALIZERS[1])
            })
            .cloned()
            .collect();
        if kept.len() == finalizers.len() {
            continue;
        }
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        cp.merge_patch(
            "v1",
            "Node",
            None,
            name,
            &json!({"metadata": {"finalizers": kept}}),
        )
        .await?;
    }
    Ok(())
}

/// Set on a Node whose member k3s removed on request (`sync`); `onRemove` then skips it.
const REMOVED_NODE_NAME_ANNOTATION: &str = "etcd.k3s.cattle.io/removed-node-name";

/// k3s's member controller `onRemove`: a Node without the etcd role label, or one already
/// marked removed (`etcd.k3s.cattle.io/removed-node-name`), is done; a labelled Node without
/// the member's name or address annotation is an error ("node name annotation for node N not
/// found"), so wrangler keeps the finalizer and the Node stays Terminating; otherwise the
/// member of that name and address is removed. False while it errs or etcd refuses (no
/// quorum), so the finalizer stays.
async fn remove_etcd_member(cp: &ControlPlane, node: &Value) -> bool {
    use super::etcd_member::{NODE_ADDRESS_ANNOTATION, NODE_NAME_ANNOTATION};
    if node["metadata"]["labels"]["node-role.kubernetes.io/etcd"].is_null() {
        return true;
    }
    let annotations = &node["metadata"]["annotations"];
    if annotations[REMOVED_NODE_NAME_ANNOTATION]
        .as_str()
        .is_some_and(|n| !n.is_empty())
    {
        return true;
    }
    let key = node["metadata"]["name"].as_str().unwrap_or_default();
    let (Some(name), Some(address)) = (
        annotations[NODE_NAME_ANNOTATION].as_str(),
        annotations[NODE_ADDRESS_ANNOTATION].as_str(),
    ) else {
        let which = if annotations[NODE_NAME_ANNOTATION].is_null() {
            "name"
        } else {
            "address"
        };
        tracing::debug!(
            node = key,
            "node {which} annotation for node {key} not found"
        );
        return false;
    };
    match cp.etcd().remove(name, address).await {
        Ok(removed) => {
            if removed {
                tracing::info!(member = name, address, "Removing etcd member from cluster");
            }
            true
        }
        Err(err) => {
            tracing::debug!(member = name, error = %err, "etcd member removal");
            false
        }
    }
}

/// The VM under `name` stopped: its kubelet is gone. The Node's [`KWOK_LABEL`] becomes
/// [`KWOK_HALTED`], so KWOK (label selector, server-side) sees it leave and stops playing it:
/// no heartbeats, no pod started or confirmed gone there.
pub async fn silence_real_node(cp: &ControlPlane, name: &str) -> Result<(), ControlPlaneError> {
    if cp.get("v1", "Node", None, name).await?.is_none() {
        return Ok(());
    }
    cp.merge_patch(
        "v1",
        "Node",
        None,
        name,
        &json!({"metadata": {"labels": {KWOK_LABEL: KWOK_HALTED}}}),
    )
    .await?;
    Ok(())
}

/// What tests see of the simulator's Kubernetes: the first cluster's real control plane, or a
/// bare one behind its proxy; read and written as `system:admin`, directly (not through the
/// proxy, so faults and counters are untouched).
#[derive(Clone, Debug)]
pub enum KubeView {
    Real(Arc<RealCluster>),
    /// A bare control plane behind its proxy (tests of Kubernetes clients).
    Local(Arc<crate::control_plane::proxy::LocalApi>),
    /// Before any cluster ran `cluster-init`.
    NoClusterYet,
}

impl KubeView {
    fn control_plane(&self) -> Option<&ControlPlane> {
        match self {
            KubeView::Real(r) => Some(&r.control_plane),
            KubeView::Local(l) => Some(&l.control_plane),
            KubeView::NoClusterYet => None,
        }
    }

    fn proxy(&self) -> Option<&Arc<FrontProxy>> {
        match self {
            KubeView::Real(r) => Some(&r.proxy),
            KubeView::Local(l) => Some(&l.proxy),
            KubeView::NoClusterYet => None,
        }
    }

    /// The object, if it exists. A failed read is tried twice more, 500 ms apart: the
    /// cluster's one apiserver loses a request in flight when the etcd member it was using
    /// dies (a simplification of the simulator, see FIDELITY "k3s etcd membership"), which a
    /// server's own apiserver on a rack would not. Still failing, it is logged and reads as
    /// absent.
    pub async fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let cp = self.control_plane()?;
        let mut tries = 0;
        loop {
            match cp.get(api_version, kind, ns, name).await {
                Ok(found) => return found,
                Err(e) if tries >= 2 => {
                    tracing::warn!(error = %e, "test read failed");
                    return None;
                }
                Err(_) => tries += 1,
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }

    /// Names of the Nodes whose `Ready` condition is `True`, starting with `prefix`, sorted.
    pub async fn ready_nodes(&self, prefix: &str) -> std::collections::BTreeSet<String> {
        self.list("v1", "Node", None)
            .await
            .into_iter()
            .filter(|n| {
                n["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
            .filter(|n| n.starts_with(prefix))
            .collect()
    }

    /// Every object of a kind (in `ns`, or everywhere).
    pub async fn list(&self, api_version: &str, kind: &str, ns: Option<&str>) -> Vec<Value> {
        self.try_list(api_version, kind, ns)
            .await
            .unwrap_or_default()
    }

    /// [`Self::list`], failing when the API does not answer (e.g. etcd has no leader while
    /// it elects one, or has lost quorum) instead of answering an empty list.
    pub async fn try_list(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
    ) -> Result<Vec<Value>, String> {
        match self.control_plane() {
            Some(cp) => cp
                .list(api_version, kind, ns)
                .await
                .map_err(|e| e.to_string()),
            None => Ok(Vec::new()),
        }
    }

    /// Creates or updates by server-side apply, status included.
    pub async fn apply(&self, obj: Value) -> Result<Value, String> {
        let cp = self.control_plane().ok_or("no cluster has started yet")?;
        cp.apply(obj).await.map_err(|e| e.to_string())
    }

    /// A JSON merge patch (RFC 7386) of an existing object.
    pub async fn merge_patch(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, String> {
        let cp = self.control_plane().ok_or("no cluster has started yet")?;
        cp.merge_patch(api_version, kind, ns, name, patch)
            .await
            .map_err(|e| e.to_string())
    }

    /// Deletes; `false` when it was not there.
    pub async fn delete(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> bool {
        match self.control_plane() {
            Some(cp) => cp
                .delete(api_version, kind, ns, name)
                .await
                .unwrap_or(false),
            None => false,
        }
    }

    /// Requests the front proxy served to clients, per `"METHOD /path/template"`.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        self.proxy().map(|p| p.counters()).unwrap_or_default()
    }

    /// Zeroes the request counters.
    pub fn reset_counters(&self) {
        if let Some(p) = self.proxy() {
            p.reset_counters();
        }
    }

    /// An admin kubeconfig for `server` (a client certificate of the cluster's CA).
    pub fn admin_kubeconfig(&self, server: &str) -> Option<String> {
        self.control_plane()?
            .user_kubeconfig(server, "system:admin", &["system:masters"])
            .ok()
    }

    /// The cluster CA (PEM).
    pub fn ca_pem(&self) -> Option<String> {
        Some(self.control_plane()?.ca_pem().to_string())
    }

    /// Whether Node `name` reports Ready=True.
    pub async fn node_ready(&self, name: &str) -> bool {
        self.get("v1", "Node", None, name)
            .await
            .and_then(|n| {
                n["status"]["conditions"].as_array().map(|conds| {
                    conds
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .unwrap_or(false)
    }
}

/// [`KubeView`] for synchronous test helpers: each call blocks the current worker thread
/// (`block_in_place`), so it needs a multi-threaded tokio runtime
/// (`#[tokio::test(flavor = "multi_thread")]`) and panics on a current-thread one.
#[derive(Clone, Debug)]
pub struct BlockingKube(pub KubeView);

impl BlockingKube {
    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
    }

    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        Self::block(self.0.get(api_version, kind, ns, name))
    }

    pub fn list(&self, api_version: &str, kind: &str, ns: Option<&str>) -> Vec<Value> {
        Self::block(self.0.list(api_version, kind, ns))
    }

    pub fn apply(&self, obj: Value) -> Result<Value, String> {
        Self::block(self.0.apply(obj))
    }

    pub fn merge_patch(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, String> {
        Self::block(self.0.merge_patch(api_version, kind, ns, name, patch))
    }

    pub fn delete(&self, api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> bool {
        Self::block(self.0.delete(api_version, kind, ns, name))
    }
}
