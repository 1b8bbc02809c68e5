//! `scale status`: reads what an operator may read (the ConfigMap, the Nodes, the Events) and
//! assembles the view ([`crate::domain::status_view`]). Read-only: nothing is written.

use crate::adapters::kube_cluster::KubeCluster;
use crate::domain::spec::{ClusterSpec, SpecLoadError};
use crate::domain::status::Status;
use crate::domain::status_view::{self, View};
use crate::ports::cluster::{Cluster as _, ClusterError, OBJECT_NAME};
use crate::ports::state::{StateError, StateStore};
use crate::workflows::error::Kind;

/// Why the view could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("reading the cluster's state")]
    State(#[from] StateError),
    #[error("ConfigMap {namespace}/{OBJECT_NAME} holds no spec: is this cluster bootstrapped?")]
    NoSpec { namespace: String },
    #[error("the stored spec does not parse")]
    Spec(#[source] SpecLoadError),
    #[error("reading the cluster")]
    Cluster(#[from] ClusterError),
}

impl StatusError {
    /// A person must look when the state cannot be read or makes no sense (the wrong
    /// kubeconfig, namespace or cluster); a retry may help when the cluster's own API failed.
    pub fn kind(&self) -> Kind {
        match self {
            StatusError::State(_) | StatusError::NoSpec { .. } | StatusError::Spec(_) => {
                Kind::NeedsPerson
            }
            StatusError::Cluster(_) => Kind::Retry,
        }
    }

    /// The process exit code ([`Kind::exit_code`]): 2 or 1, as [`StatusError::kind`] says.
    pub fn exit_code(&self) -> u8 {
        self.kind().exit_code()
    }
}

/// The view of the cluster whose state `state` holds. Without `list` on Events the rest is
/// still shown, and the view says what it left out.
pub async fn observe(
    state: &impl StateStore,
    cluster: &KubeCluster,
    namespace: &str,
) -> Result<View, StatusError> {
    let (both, nodes, events) = tokio::join!(
        crate::workflows::scale::read_both(state),
        cluster.list_nodes(),
        cluster.recent_events(status_view::MAX_EVENTS),
    );
    let (snapshot, scale) = both?;
    let nodes = nodes?;
    let (events, unreadable) = match events {
        Ok(events) => (events, None),
        Err(e @ ClusterError::Forbidden { .. }) => (Vec::new(), Some(format!("events ({e})"))),
        Err(e) => return Err(e.into()),
    };
    let spec = match snapshot.spec_yaml().map(ClusterSpec::from_yaml) {
        Some(Ok(base)) => crate::workflows::scale::effective(base, scale.as_ref(), &snapshot).spec,
        Some(Err(e)) => return Err(StatusError::Spec(e)),
        None => {
            return Err(StatusError::NoSpec {
                namespace: namespace.to_owned(),
            });
        }
    };
    let last = snapshot.status_json().and_then(Status::from_json);
    let mut view = status_view::build(&spec, last.as_ref(), &nodes, events);
    view.unreadable.extend(unreadable);
    Ok(view)
}
