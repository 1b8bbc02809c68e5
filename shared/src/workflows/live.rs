//! The live ports the `bootstrap` binary hands to its workflows: [`LiveConnect`] builds the
//! Oxide SDK rack, the russh shell, the Tailscale API client, the cargo dev build, the kube-rs state store, cluster
//! and manifest applier (for [`bootstrap::Connect`]) and the in-cluster side of a delete (for
//! [`delete::Connect`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::adapters::client_csr::{ClientCsrError, ClientRequest};
use crate::adapters::dev_image::{Built, DevImage, DevImageError};
use crate::adapters::kube_cluster::KubeCluster;
use crate::adapters::kube_manifests::KubeManifests;
use crate::adapters::kube_store::KubeStateStore;
use crate::adapters::oxide_rack::{OxideRack, RackOptions};
use crate::adapters::ssh::{HostKeyPins, SshKeyPair, SshTarget};
use crate::adapters::tailscale::{Device, SecretString, TailscaleApi, TailscaleError};
use crate::ports::cluster::NAMESPACE;
use crate::ports::rack::RackError;
use crate::workflows::bootstrap::{self, ApiAnswer, ConnectError, InClusterPorts, Tailnet};
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

/// The HTTP client for image sources: connect/read timeouts, no cookies.
pub(crate) fn image_source_client() -> Result<reqwest::Client, ConnectError> {
    Ok(reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("oxide-controller/", env!("CARGO_PKG_VERSION")))
        .build()?)
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
    type Tailnet = TailscaleApi;

    fn rack(&self, host: &str, token: &str, project: &str) -> Result<OxideRack, RackError> {
        oxide_rack(host, token, project)
    }

    fn tailnet(
        &self,
        api_url: &str,
        tailnet: &str,
        api_key: SecretString,
    ) -> Result<TailscaleApi, TailscaleError> {
        TailscaleApi::new(api_url, tailnet, api_key)
    }

    async fn build_controller(
        &self,
        dev: &DevImage,
        profile: &str,
    ) -> Result<Built, DevImageError> {
        dev.build(profile).await
    }

    fn image_sources(&self) -> Result<reqwest::Client, ConnectError> {
        image_source_client()
    }

    async fn source_address(&self, host: &str) -> Result<std::net::IpAddr, String> {
        crate::adapters::oxide_rack::source_address_toward(host).await
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

    async fn api_ready(&self, kubeconfig: &Path, context: &str) -> Result<(), String> {
        crate::adapters::kubeclient::readyz(kubeconfig, context).await
    }

    async fn object_count(
        &self,
        kubeconfig: &Path,
        context: &str,
        before: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<u64, String> {
        crate::adapters::kubeclient::object_count(kubeconfig, context, before).await
    }

    async fn client_certificate(
        &self,
        kubeconfig: &Path,
        context: &str,
        user: &str,
        name: &str,
        request: &ClientRequest,
        wait: Duration,
    ) -> Result<String, ClientCsrError> {
        crate::adapters::client_csr::renew(kubeconfig, context, user, name, request, wait).await
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
        let config = crate::adapters::kubeclient::config(Some(kubeconfig), Some(context)).await?;
        let client = crate::adapters::kubeclient::client_from_config(config.clone())?;
        Ok(InClusterPorts {
            store: KubeStateStore::new(client.clone(), NAMESPACE),
            cluster: KubeCluster::new(client.clone(), NAMESPACE)
                .with_reporting_instance(holder)
                .with_supervisor(&config),
            manifests: KubeManifests::new(client),
        })
    }
}

impl Tailnet for TailscaleApi {
    fn name(&self) -> &str {
        self.tailnet()
    }

    async fn devices(&self) -> Result<Vec<Device>, TailscaleError> {
        TailscaleApi::devices(self).await
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
