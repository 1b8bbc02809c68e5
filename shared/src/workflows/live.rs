//! The live ports the `bootstrap` binary hands to its workflows: [`LiveConnect`] builds the
//! Oxide SDK rack, the russh shell, the kube-rs state store, cluster and manifest applier
//! (for [`bootstrap::Connect`]) and the in-cluster side of a delete (for [`delete::Connect`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::adapters::kube_cluster::KubeCluster;
use crate::adapters::kube_store::KubeStateStore;
use crate::adapters::manifests::{self, Manifest, ManifestError};
use crate::adapters::oxide_rack::{OxideRack, RackOptions};
use crate::adapters::ssh::{HostKeyPins, SshKeyPair, SshTarget};
use crate::base::retry::Backoff;
use crate::ports::cluster::NAMESPACE;
use crate::ports::rack::RackError;
use crate::workflows::bootstrap::{self, ApiAnswer, ApplyManifests, ConnectError, InClusterPorts};
use crate::workflows::delete::{self, KubeInCluster};

/// The real adapters, built on demand.
#[derive(Debug, Default)]
pub struct LiveConnect {
    /// The `/readyz` probe's client, built once.
    probe: OnceLock<reqwest::Client>,
}

impl LiveConnect {
    pub fn new() -> LiveConnect {
        LiveConnect::default()
    }

    fn probe_client(&self) -> Result<reqwest::Client, String> {
        if let Some(c) = self.probe.get() {
            return Ok(c.clone());
        }
        let built = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(self.probe.get_or_init(|| built).clone())
    }
}

fn oxide_rack(host: &str, token: &str, project: &str) -> Result<OxideRack, RackError> {
    OxideRack::connect(host, token, project, RackOptions::default())
}

impl bootstrap::Connect for LiveConnect {
    type Rack = OxideRack;
    type Shell = SshTarget;
    type Store = KubeStateStore;
    type Cluster = KubeCluster;
    type Manifests = KubeManifests;

    fn rack(&self, host: &str, token: &str, project: &str) -> Result<OxideRack, RackError> {
        oxide_rack(host, token, project)
    }

    async fn probe_api(&self, url: &str) -> Result<ApiAnswer, String> {
        let http = self.probe_client()?;
        Ok(match http.get(url).send().await {
            Ok(r) => ApiAnswer::Status(r.status().as_u16()),
            // Before `is_connect`: a connection the VPC firewall drops times out while
            // connecting, which is not the same as nothing listening.
            Err(e) if e.is_timeout() => ApiAnswer::TimedOut,
            Err(e) if e.is_connect() => ApiAnswer::NotListening,
            Err(_) => ApiAnswer::NoAnswer,
        })
    }

    fn shell(&self, addr: SocketAddr, user: &str, key: SshKeyPair, pins: HostKeyPins) -> SshTarget {
        SshTarget::new(addr, user.to_owned(), key, pins)
    }

    async fn in_cluster(
        &self,
        kubeconfig: &Path,
        context: &str,
        holder: &str,
    ) -> Result<InClusterPorts<KubeStateStore, KubeCluster, KubeManifests>, ConnectError> {
        let client = crate::adapters::kubeclient::client(Some(kubeconfig), Some(context)).await?;
        Ok(InClusterPorts {
            store: KubeStateStore::new(client.clone(), NAMESPACE),
            cluster: KubeCluster::new(client.clone(), NAMESPACE).with_reporting_instance(holder),
            manifests: KubeManifests(client),
        })
    }
}

/// [`ApplyManifests`] over kube-rs: server-side apply, and a merge patch for the label.
#[derive(Clone)]
pub struct KubeManifests(kube::Client);

impl std::fmt::Debug for KubeManifests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeManifests").finish_non_exhaustive()
    }
}

impl ApplyManifests for KubeManifests {
    async fn apply_all(
        &self,
        to_apply: &[Manifest],
        retry: Backoff,
    ) -> Result<usize, ManifestError> {
        manifests::apply_all(&self.0, to_apply, retry).await
    }

    async fn label_node(&self, node: &str, label: &str, value: &str) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.0.clone());
        let patch = serde_json::json!({ "metadata": { "labels": { label: value } } });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| crate::adapters::kubeclient::api_message(&e))
    }
}

impl delete::Connect for LiveConnect {
    type Rack = OxideRack;
    type InCluster = KubeInCluster;

    fn rack(&self, host: &str, token: &str, project: &str) -> Result<OxideRack, RackError> {
        oxide_rack(host, token, project)
    }

    async fn in_cluster(&self, kubeconfig: &Path, cluster: &str) -> Result<KubeInCluster, String> {
        KubeInCluster::connect(kubeconfig, cluster).await
    }
}
