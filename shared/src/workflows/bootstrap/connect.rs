//! What bootstrap is handed instead of building adapters itself: a [`Connect`] factory that
//! the binary passes in (the live one is [`crate::workflows::live::LiveConnect`]; tests hand
//! in `fake::connect::FakeConnect`, feature `testing`). Each method opens one port the flow
//! reaches in order: a dev build of the controller, the rack from the validated credentials, the
//! Tailscale API, the reader of image sources, the API's `/readyz`, the first
//! server over SSH with pinned host keys, and, from the fetched kubeconfig, the in-cluster
//! pieces (state store, cluster, manifest applier) that the state, manifests and in-process
//! reconcile steps use.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use crate::adapters::client_csr::{ClientCsrError, ClientRequest};
use crate::adapters::dev_image::{Built, DevImage, DevImageError};
use crate::adapters::image::ImageStore;
use crate::adapters::ssh::{HostKeyPins, RemoteShell, SshKeyPair};
use crate::adapters::tailscale::{Device, SecretString, TailscaleError};
use crate::ports::cluster::Cluster;
pub use crate::ports::manifests::ApplyManifests;
use crate::ports::rack::{Rack, RackError};
use crate::ports::state::StateStore;

/// An error from building an in-cluster client, kept with its source chain.
pub type ConnectError = Box<dyn std::error::Error + Send + Sync>;

/// One look at `<server>/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiAnswer {
    /// An HTTP answer with this status.
    Status(u16),
    /// The connection or the answer timed out (a VPC firewall that drops packets looks so).
    TimedOut,
    /// Nothing accepted the connection.
    NotListening,
    /// Any other failure.
    NoAnswer,
}

/// The Tailscale API as bootstrap reads it (`--tailscale-*`): the devices of one tailnet, to
/// find the first control plane's tailnet address when it has no external one. Beside
/// [`Connect`] rather than in the ports layer because its error carries the HTTP client's.
pub trait Tailnet: Send + Sync {
    /// The tailnet's name (`-`: the API key's own).
    fn name(&self) -> &str;
    /// Every device of the tailnet.
    fn devices(&self) -> impl Future<Output = Result<Vec<Device>, TailscaleError>> + Send;
    /// The IPv4 tailnet address of the device called `hostname`, once it has joined.
    fn device_ipv4(
        &self,
        hostname: &str,
    ) -> impl Future<Output = Result<Option<Ipv4Addr>, TailscaleError>> + Send {
        async move {
            Ok(crate::adapters::tailscale::pick_ipv4(
                &self.devices().await?,
                hostname,
            ))
        }
    }
}

/// The in-cluster ports, all reached through the kubeconfig bootstrap wrote.
#[derive(Debug, Clone)]
pub struct InClusterPorts<S, C, M> {
    /// The Secret and ConfigMap.
    pub store: S,
    /// The cluster the in-process reconcile works on.
    pub cluster: C,
    pub manifests: M,
}

/// The factory of every port bootstrap uses. Building one does no I/O unless said so.
pub trait Connect: Send + Sync {
    type Rack: Rack + ImageStore;
    type Shell: RemoteShell;
    type Store: StateStore;
    type Cluster: Cluster;
    type Manifests: ApplyManifests;
    type Tailnet: Tailnet;

    /// The rack, for `project`, with these credentials (no I/O: a malformed host or token is
    /// an error here). Also what the in-process reconcile builds its rack with.
    fn rack(&self, host: &str, token: &str, project: &str) -> Result<Self::Rack, RackError>;

    /// The Tailscale API at `api_url` for `tailnet`, with `api_key` (no I/O: a malformed URL
    /// is an error here).
    fn tailnet(
        &self,
        api_url: &str,
        tailnet: &str,
        api_key: SecretString,
    ) -> Result<Self::Tailnet, TailscaleError>;

    /// Builds the controller binaries of a `--controller-image dev:PATH` source with cargo
    /// profile `profile`, on this machine.
    fn build_controller(
        &self,
        dev: &DevImage,
        profile: &str,
    ) -> impl Future<Output = Result<Built, DevImageError>> + Send;

    /// The HTTP client that reads an `http(s)` image source (`--image-source URL`): checked in
    /// `validate`, streamed in `image`.
    fn image_sources(&self) -> Result<reqwest::Client, ConnectError>;

    /// The address this machine sends from toward the rack's API at `host` (a URL): the
    /// operating system's route choice, found without sending anything. The default of
    /// `--ssh-allow`; behind NAT the rack sees another address (the README says so).
    fn source_address(
        &self,
        host: &str,
    ) -> impl Future<Output = Result<std::net::IpAddr, String>> + Send;

    /// One probe of `url` (the certificate is not checked: only whether the API serves is
    /// used). `Err` when the probe itself cannot be made.
    fn probe_api(&self, url: &str) -> impl Future<Output = Result<ApiAnswer, String>> + Send;

    /// Whether the cluster's API is ready, asked as its administrator through context
    /// `context` of the kubeconfig at `kubeconfig` (`GET /readyz`, etcd's check included,
    /// which [`Self::probe_api`] never reaches). `Err` says why it is not.
    fn api_ready(
        &self,
        kubeconfig: &Path,
        context: &str,
    ) -> impl Future<Output = Result<(), String>> + Send;

    /// How many objects the cluster holds of the kinds a backup counts
    /// ([`crate::adapters::kubeclient::COUNTED_KINDS`]), asked as its administrator through
    /// context `context` of `kubeconfig`; with `before`, only those created before it (a
    /// snapshot's time). The default cannot count.
    fn object_count(
        &self,
        _kubeconfig: &Path,
        _context: &str,
        _before: Option<chrono::DateTime<chrono::Utc>>,
    ) -> impl Future<Output = Result<u64, String>> + Send {
        std::future::ready(Err("this connection cannot count objects".to_owned()))
    }

    /// A client certificate for `user` from the cluster's own signer, asked for through
    /// context `context` of `kubeconfig` with the credential it holds: the ClusterRoleBinding
    /// for `user` ensured, CertificateSigningRequest `name` for `request` created, approved,
    /// waited for up to `wait`, deleted ([`crate::adapters::client_csr`]). The certificate,
    /// PEM. The default cannot.
    fn client_certificate(
        &self,
        _kubeconfig: &Path,
        _context: &str,
        _user: &str,
        _name: &str,
        _request: &ClientRequest,
        _wait: std::time::Duration,
    ) -> impl Future<Output = Result<String, ClientCsrError>> + Send {
        std::future::ready(Err(ClientCsrError::Api {
            step: "connect",
            code: None,
            message: "this connection cannot ask for certificates".to_owned(),
        }))
    }

    /// A shell on the VM at `addr`, logging in as `user` with `key`, refusing any host key
    /// outside `pins` (no I/O until used).
    fn shell(
        &self,
        addr: SocketAddr,
        user: &str,
        key: SshKeyPair,
        pins: HostKeyPins,
    ) -> Self::Shell;

    /// The in-cluster ports through context `context` of the kubeconfig at `kubeconfig`;
    /// `holder` names this process in the Events the cluster port records.
    #[allow(clippy::type_complexity)]
    fn in_cluster(
        &self,
        kubeconfig: &Path,
        context: &str,
        holder: &str,
    ) -> impl Future<
        Output = Result<InClusterPorts<Self::Store, Self::Cluster, Self::Manifests>, ConnectError>,
    > + Send;
}
