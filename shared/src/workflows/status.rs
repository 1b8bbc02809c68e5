//! `scale status`: reads what an operator may read (the ConfigMap, the Nodes, the Events) and
//! assembles the view ([`crate::domain::status_view`]). Read-only: nothing is written.

use crate::adapters::kube_cluster::KubeCluster;
use crate::domain::spec::ClusterSpec;
use crate::domain::status::Status;
use crate::domain::status_view::{self, View};
use crate::ports::cluster::{Cluster as _, ClusterError, OBJECT_NAME};
use crate::ports::state::{StateError, StateStore};

/// Why the view could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("reading the cluster's state")]
    State(#[from] StateError),
    #[error("ConfigMap {namespace}/{OBJECT_NAME} holds no spec: is this cluster bootstrapped?")]
    NoSpec { namespace: String },
    #[error("the stored spec does not parse: {0}")]
    Spec(String),
    #[error("reading the cluster")]
    Cluster(#[from] ClusterError),
}

impl StatusError {
    /// 2 when the state cannot be read or makes no sense (the wrong kubeconfig, namespace or
    /// cluster), 1 when the cluster's own API failed.
    pub fn exit_code(&self) -> i32 {
        match self {
            StatusError::State(_) | StatusError::NoSpec { .. } | StatusError::Spec(_) => 2,
            StatusError::Cluster(_) => 1,
        }
    }
}

/// The view of the cluster whose state `state` holds. Without `list` on Events the rest is
/// still shown, and the view says what it left out.
pub async fn observe(
    state: &impl StateStore,
    cluster: &KubeCluster,
    namespace: &str,
) -> Result<View, StatusError> {
    let (snapshot, nodes, events) = tokio::join!(
        state.read_config(),
        cluster.list_nodes(),
        cluster.recent_events(status_view::MAX_EVENTS),
    );
    let snapshot = snapshot?;
    let nodes = nodes?;
    let (events, unreadable) = match events {
        Ok(events) => (events, None),
        Err(e @ ClusterError::Forbidden { .. }) => (Vec::new(), Some(format!("events ({e})"))),
        Err(e) => return Err(e.into()),
    };
    let spec = match snapshot.spec_yaml().map(ClusterSpec::from_yaml) {
        Some(Ok(spec)) => spec,
        Some(Err(e)) => return Err(StatusError::Spec(e.to_string())),
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
