//! What bootstrap is handed instead of building adapters itself: a [`Connect`] factory that
//! the binary passes in (the live one is [`crate::workflows::live::LiveConnect`]; tests hand
//! in `fake::connect::FakeConnect`, feature `testing`). Each method opens one port the flow
//! reaches in order: the rack from the validated credentials, the API's `/readyz`, the first
//! server over SSH with pinned host keys, and, from the fetched kubeconfig, the in-cluster
//! pieces (state store, cluster, manifest applier) that the state, manifests and in-process
//! reconcile steps use.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;

use crate::adapters::image::ImageStore;
use crate::adapters::ssh::{HostKeyPins, RemoteShell, SshKeyPair};
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

    /// The rack, for `project`, with these credentials (no I/O: a malformed host or token is
    /// an error here). Also what the in-process reconcile builds its rack with.
    fn rack(&self, host: &str, token: &str, project: &str) -> Result<Self::Rack, RackError>;

    /// One probe of `url` (the certificate is not checked: only whether the API serves is
    /// used). `Err` when the probe itself cannot be made.
    fn probe_api(&self, url: &str) -> impl Future<Output = Result<ApiAnswer, String>> + Send;

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
