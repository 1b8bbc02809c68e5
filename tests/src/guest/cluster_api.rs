//! A simulated cluster's Kubernetes API: the home-made twin (being retired), or a real
//! control plane ([`crate::control_plane`]) started when the cluster's first server runs
//! k3s `cluster-init`, reached through a [`FrontProxy`] on each server's `:6443`.
//!
//! What k3s adds to Kubernetes stays in the guest simulator (the supervisor's join checks,
//! tokens, `/cacerts`); what a kubelet does to its Node is done here: the Node is
//! registered through the API and handed to KWOK (annotation), which keeps it Ready and its
//! pods running; a halted VM's Node loses the annotation, so its heartbeats stop and the
//! real node lifecycle controller marks it Unknown after its grace period.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::control_plane::proxy::FrontProxy;
use crate::control_plane::{
    ControlPlane, ControlPlaneError, ControlPlaneOptions, KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE,
    KWOK_HALTED,
};
use crate::oxide::faults::Faults;
use crate::twin::Twin;

/// Which Kubernetes the simulated clusters run.
#[derive(Clone, Debug, Default)]
pub enum KubeBackend {
    /// The home-made twin (the default until every test has moved to the real one).
    #[default]
    Twin,
    /// A real control plane per cluster, with these options.
    Real(ControlPlaneOptions),
}

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
    /// Starts a control plane for a new cluster.
    pub async fn start(
        opts: ControlPlaneOptions,
        faults: Faults,
    ) -> Result<RealCluster, ControlPlaneError> {
        let control_plane = ControlPlane::start(opts).await?;
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

/// One cluster's API.
#[derive(Clone, Debug)]
pub enum ClusterApi {
    Twin(Twin),
    Real(Arc<RealCluster>),
}

impl ClusterApi {
    /// The cluster CA (PEM): what `/cacerts` serves and the token's `K10<hash>` covers.
    pub fn ca_pem(&self) -> String {
        match self {
            ClusterApi::Twin(t) => t.ca_pem(),
            ClusterApi::Real(r) => r.control_plane.ca_pem().to_string(),
        }
    }

    /// `/etc/rancher/k3s/k3s.yaml`: `system:admin` (group `system:masters`) at `server`.
    pub fn admin_kubeconfig(&self, server: &str) -> String {
        match self {
            ClusterApi::Twin(t) => t.admin_kubeconfig(server),
            ClusterApi::Real(r) => r
                .control_plane
                .user_kubeconfig(server, "system:admin", &["system:masters"])
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "cannot issue the admin certificate");
                    String::new()
                }),
        }
    }

    /// The real cluster, if this is one.
    pub fn real(&self) -> Option<&Arc<RealCluster>> {
        match self {
            ClusterApi::Real(r) => Some(r),
            ClusterApi::Twin(_) => None,
        }
    }
}

/// The kubelet's registration on a real control plane: creates the Node if missing (with its
/// registration taints, which a kubelet sets only at creation), else adds the kubelet's
/// labels and the provider ID without touching spec changes others made (cordon, taints);
/// then sets capacity and allocatable, and hands the Node to KWOK.
pub async fn register_real_node(cp: &ControlPlane, fresh: Value) -> Result<(), ControlPlaneError> {
    let name = fresh["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut node = fresh.clone();
    node["metadata"]["annotations"][KWOK_ANNOTATION] = json!(KWOK_ANNOTATION_VALUE);
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
            cp.create(node.clone()).await?;
        }
        Some(existing) => {
            let mut patch = json!({"metadata": {
                "labels": node["metadata"]["labels"],
                "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
            }});
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

/// The VM under `name` stopped: its kubelet no longer heartbeats (KWOK lets go of the Node).
pub async fn silence_real_node(cp: &ControlPlane, name: &str) -> Result<(), ControlPlaneError> {
    if cp.get("v1", "Node", None, name).await?.is_none() {
        return Ok(());
    }
    cp.merge_patch(
        "v1",
        "Node",
        None,
        name,
        &json!({"metadata": {"annotations": {KWOK_ANNOTATION: KWOK_HALTED}}}),
    )
    .await?;
    Ok(())
}

/// What tests see of the simulator's Kubernetes, whichever backend runs it: the twin, or the
/// first cluster's real control plane (read and written as `system:admin`, directly, not
/// through the proxy, so faults and counters are untouched). Every call is async because the
/// real one is a real API; with the twin they answer at once.
#[derive(Clone, Debug)]
pub enum KubeView {
    Twin(Twin),
    Real(Arc<RealCluster>),
    /// A real backend before any cluster ran `cluster-init`.
    NoClusterYet,
}

impl KubeView {
    /// The object, if it exists.
    pub async fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        match self {
            KubeView::Twin(t) => t.get(api_version, kind, ns, name),
            KubeView::Real(r) => r
                .control_plane
                .get(api_version, kind, ns, name)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "test read failed");
                    None
                }),
            KubeView::NoClusterYet => None,
        }
    }

    /// Every object of a kind (in `ns`, or everywhere).
    pub async fn list(&self, api_version: &str, kind: &str, ns: Option<&str>) -> Vec<Value> {
        match self {
            KubeView::Twin(t) => t.list(api_version, kind, ns),
            KubeView::Real(r) => r
                .control_plane
                .list(api_version, kind, ns)
                .await
                .unwrap_or_default(),
            KubeView::NoClusterYet => Vec::new(),
        }
    }

    /// Creates or updates (server-side apply with the real one), status included.
    pub async fn apply(&self, obj: Value) -> Result<Value, String> {
        match self {
            KubeView::Twin(t) => t.upsert(obj).map_err(|e| e.to_string()),
            KubeView::Real(r) => r.control_plane.apply(obj).await.map_err(|e| e.to_string()),
            KubeView::NoClusterYet => Err("no cluster has started yet".into()),
        }
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
        match self {
            KubeView::Twin(t) => {
                let mut obj = t
                    .get(api_version, kind, ns, name)
                    .ok_or_else(|| format!("{kind} {name} not found"))?;
                merge(&mut obj, patch);
                t.upsert(obj).map_err(|e| e.to_string())
            }
            KubeView::Real(r) => r
                .control_plane
                .merge_patch(api_version, kind, ns, name, patch)
                .await
                .map_err(|e| e.to_string()),
            KubeView::NoClusterYet => Err("no cluster has started yet".into()),
        }
    }

    /// Deletes; `false` when it was not there.
    pub async fn delete(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> bool {
        match self {
            KubeView::Twin(t) => t.delete(api_version, kind, ns, name),
            KubeView::Real(r) => r
                .control_plane
                .delete(api_version, kind, ns, name)
                .await
                .unwrap_or(false),
            KubeView::NoClusterYet => false,
        }
    }

    /// Requests served to clients (the twin's, or the front proxy's), per
    /// `"METHOD /path/template"`.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        match self {
            KubeView::Twin(t) => t.counters(),
            KubeView::Real(r) => r.proxy.counters(),
            KubeView::NoClusterYet => Default::default(),
        }
    }

    /// Zeroes the request counters.
    pub fn reset_counters(&self) {
        match self {
            KubeView::Twin(t) => t.reset_counters(),
            KubeView::Real(r) => r.proxy.reset_counters(),
            KubeView::NoClusterYet => {}
        }
    }

    /// An admin kubeconfig for `server` (a client certificate of the cluster's CA).
    pub fn admin_kubeconfig(&self, server: &str) -> Option<String> {
        match self {
            KubeView::Twin(t) => Some(t.admin_kubeconfig(server)),
            KubeView::Real(r) => Some(ClusterApi::Real(r.clone()).admin_kubeconfig(server)),
            KubeView::NoClusterYet => None,
        }
    }

    /// The cluster CA (PEM).
    pub fn ca_pem(&self) -> Option<String> {
        match self {
            KubeView::Twin(t) => Some(t.ca_pem()),
            KubeView::Real(r) => Some(r.control_plane.ca_pem().to_string()),
            KubeView::NoClusterYet => None,
        }
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

/// RFC 7386 merge of `patch` into `target`.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}
