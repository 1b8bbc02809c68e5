//! [`SimHandle`]: a running simulator, what tests and the harness hold: its addresses and
//! token, and the parts of it they drive (the Oxide API state, the guests, the faults, the
//! tailnet). [`crate::harness::sim::Sim::start`] makes one; dropping it stops everything it started.

use std::path::PathBuf;

use serde::Serialize;
use tokio::task::JoinHandle;

use crate::guest::Boot;
use crate::oxide::{AddressPool, Faults, OxideSim};
use crate::tailscale::Tailnet;

/// A running simulator. Dropping it stops every task it started; [`SimHandle::shutdown`]
/// does the same and also removes the files it created.
pub struct SimHandle {
    /// Base URL of the Oxide API, `http://127.0.0.1:PORT`.
    pub oxide_host: String,
    /// Bearer token the Oxide API accepts.
    pub oxide_token: String,
    /// Base URL of the admin API, `http://127.0.0.1:PORT`.
    pub admin_url: String,
    /// Project of the preset cluster.
    pub project: Option<String>,
    /// Kubeconfig file of the preset cluster (server = the API floating IP).
    pub kubeconfig: Option<PathBuf>,
    /// Base URL of the simulated Tailscale API (`--tailscale-api-url`), `http://127.0.0.1:PORT`.
    pub tailscale_api_url: String,
    /// Base URL of the simulated k3s release downloads (GitHub's
    /// `https://github.com/k3s-io/k3s/releases`), `http://127.0.0.1:PORT/k3s-io/k3s/releases`:
    /// see [`crate::harness::releases`]. The preset cluster's spec names it in
    /// `k3s.release_url`.
    pub release_url: String,
    /// Base URL of the simulated k3s channel server (`https://update.k3s.io/v1-release/
    /// channels`), `http://127.0.0.1:PORT/v1-release/channels` (a spec's
    /// `upgrade.channel_url`): see [`crate::harness::channels`].
    pub channel_url: String,
    pub(crate) channels: crate::harness::channels::Channels,
    pub(crate) oxide: OxideSim,
    pub(crate) tailnet: Tailnet,
    pub(crate) tailscale_configured: bool,
    pub(crate) boot: Boot,
    pub(crate) addresses: AddressPool,
    pub(crate) faults: Faults,
    pub(crate) tasks: Vec<JoinHandle<()>>,
    pub(crate) temp_dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHandle")
            .field("oxide_host", &self.oxide_host)
            .field("oxide_token", &"<redacted>")
            .field("admin_url", &self.admin_url)
            .field("project", &self.project)
            .field("kubeconfig", &self.kubeconfig)
            .field("tailscale_api_url", &self.tailscale_api_url)
            .finish_non_exhaustive()
    }
}

impl SimHandle {
    /// The Oxide side (direct access: seeding, console, dump).
    pub fn oxide(&self) -> &OxideSim {
        &self.oxide
    }

    /// The real control planes of the clusters created so far, oldest first.
    pub fn control_planes(&self) -> Vec<std::sync::Arc<crate::guest::cluster_api::RealCluster>> {
        self.boot.real_clusters()
    }

    /// The Kubernetes of the simulator's (first) cluster.
    pub fn kube(&self) -> crate::guest::cluster_api::KubeView {
        self.boot.kube_view()
    }

    /// The guest simulation (cluster membership).
    pub fn boot(&self) -> &Boot {
        &self.boot
    }

    /// The runtime-mutable faults.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The simulated k3s channel server's channels (a test moves one with `set`).
    pub fn channels(&self) -> &crate::harness::channels::Channels {
        &self.channels
    }

    /// The simulated tailnet (devices, their addresses, the API key).
    pub fn tailnet(&self) -> &Tailnet {
        &self.tailnet
    }

    /// The loopback address pool floating and ephemeral IPs come from.
    pub fn addresses(&self) -> &AddressPool {
        &self.addresses
    }

    /// The JSON line `oxide-sim` prints once ready (no trailing newline).
    pub fn ready_line(&self) -> String {
        let line = ReadyLine {
            oxide_host: &self.oxide_host,
            oxide_token: &self.oxide_token,
            admin_url: &self.admin_url,
            project: self.project.as_deref(),
            kubeconfig: self.kubeconfig.as_ref().map(|p| p.display().to_string()),
            release_url: &self.release_url,
            tailscale_api_url: &self.tailscale_api_url,
            tailscale_api_key: self.tailscale_configured.then_some(self.tailnet.api_key()),
            tailscale_tailnet: self.tailscale_configured.then_some(self.tailnet.name()),
        };
        serde_json::to_string(&line).unwrap_or_default()
    }

    /// Stops every listener and task and removes the temporary files it created.
    pub fn shutdown(mut self) {
        self.stop();
        if let Some(temp) = self.temp_dir.take()
            && let Err(err) = temp.close()
        {
            tracing::warn!(error = %err, "cannot remove the temporary directory");
        }
    }

    fn stop(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        self.boot.shutdown();
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The one JSON line `oxide-sim` prints when ready.
#[derive(Clone, Debug, Serialize)]
struct ReadyLine<'a> {
    oxide_host: &'a str,
    oxide_token: &'a str,
    admin_url: &'a str,
    project: Option<&'a str>,
    kubeconfig: Option<String>,
    /// Base URL of the k3s release mirror (a spec's `k3s.release_url`).
    release_url: &'a str,
    /// Base URL of the Tailscale API (`--tailscale-api-url`).
    tailscale_api_url: &'a str,
    /// Present when auth keys were configured (a tailnet VMs can join).
    #[serde(skip_serializing_if = "Option::is_none")]
    tailscale_api_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tailscale_tailnet: Option<&'a str>,
}
