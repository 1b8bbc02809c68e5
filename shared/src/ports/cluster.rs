//! The `Cluster` trait: everything oxide-controller asks of the Kubernetes API besides its own
//! state objects — Nodes, the pods, volumes and budgets the autoscaler reads, drain through the
//! Eviction API, the run Lease, Events and reconcile Jobs — in domain types ([`crate::domain::model`]:
//! `Node`, `PodRef` for drain, `Pod`, `PersistentVolume` and `DisruptionBudget` for the
//! autoscaler); no `k8s_openapi` type crosses it. The kube implementation is
//! [`crate::adapters::kube_cluster::KubeCluster`], which converts its objects in
//! [`crate::adapters::kube_cluster::views`]; workflow tests use `fake::FakeCluster` (feature `testing`).

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::model::{DisruptionBudget, EtcdMember, Node, PersistentVolume, Pod, PodRef};

/// Where everything we own in the cluster lives, and its name (defined with the other names
/// in [`crate::base::names`]; the manifests below the ports use them too).
pub use crate::base::names::{JOBS_NAMESPACE, NAMESPACE, OBJECT_NAME, ON_DEMAND_JOB};

/// Retries of Kubernetes calls that failed with a transient error (5xx, 429, timeouts) at the
/// start and end of a run: reads, and writes guarded by a resourceVersion or create-only
/// semantics (a retried write whose first try landed meets a 409 and re-reads).
pub const KUBE_BACKOFF: crate::base::retry::Backoff = crate::base::retry::Backoff {
    first: Duration::from_millis(200),
    max: Duration::from_secs(2),
    attempts: 4,
};

/// Kubernetes API trouble, classified.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("{what} was changed by someone else (HTTP 409); re-read and decide again")]
    Conflict { what: String },
    #[error("not allowed to {what}: {message}; check the ServiceAccount's RBAC")]
    Forbidden { what: String, message: String },
    #[error("the Kubernetes API is unavailable for {what}: {message}")]
    Unavailable { what: String, message: String },
    #[error("Kubernetes API call {what} failed")]
    Api {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ClusterError {
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClusterError::Unavailable { .. } | ClusterError::Api { .. }
        )
    }
}

/// Result of one eviction attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    Evicted,
    /// A PodDisruptionBudget said no (HTTP 429); try again later.
    BlockedByBudget,
    /// The pod is already gone.
    Gone,
    /// The API refused this pod's eviction for a reason a retry will not fix soon: HTTP 500
    /// for a pod under more than one PodDisruptionBudget, 403 (e.g. a budget whose allowed
    /// disruptions are negative, or RBAC). The message is the API's. Drain carries on with
    /// the other pods and reports this one.
    Refused(String),
}

/// Result of trying to take the run Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    Acquired,
    HeldBy {
        holder: String,
        until: Option<DateTime<Utc>>,
    },
}

/// Result of starting an on-demand reconcile Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobTrigger {
    Created,
    /// A Job with the fixed name exists: a run is pending or under way.
    AlreadyPending,
    /// No CronJob to copy the template from (e.g. running outside the cluster).
    NoCronJob,
}

/// Type of a Kubernetes Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// The Kubernetes side of the product.
pub trait Cluster: Send + Sync {
    fn list_nodes(&self) -> impl Future<Output = Result<Vec<Node>, ClusterError>> + Send;
    /// Marks a Node unschedulable (idempotent).
    fn cordon(&self, node: &str) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Cordons the Node and annotates it `oxide-controller/removing=<reason>`, so later runs
    /// know the removal is ours and carry it on (idempotent).
    fn mark_removing(
        &self,
        node: &str,
        reason: &str,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send {
        let _ = reason;
        self.cordon(node)
    }
    /// Annotates the Node `oxide-controller/restarted-at=<at>` (RFC 3339): its instance is
    /// being started again (idempotent; a missing Node is an error).
    fn mark_restarted(
        &self,
        node: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// The Events of k3s's certificate monitors (namespace `default`, source
    /// `k3s-cert-monitor`; see [`crate::domain::certificates`]).
    fn certificate_events(
        &self,
    ) -> impl Future<Output = Result<Vec<crate::domain::certificates::MonitorEvent>, ClusterError>> + Send;
    /// Sets the Node's [`crate::domain::certificates::RESTART_ANNOTATION`] to `value` and, with
    /// `unschedulable`, cordons (`Some(true)`) or uncordons (`Some(false)`) it in the same
    /// patch (idempotent).
    fn mark_certificate_restart(
        &self,
        node: &str,
        value: &str,
        unschedulable: Option<bool>,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Uncordons the Node and drops `oxide-controller/removing`: a removal called off.
    fn cancel_removal(&self, node: &str) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Deletes a Node object; missing is fine.
    fn delete_node(&self, node: &str) -> impl Future<Output = Result<(), ClusterError>> + Send;
    fn pods_on_node(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<PodRef>, ClusterError>> + Send;
    /// Every pod in every namespace (paged), as the autoscaler reads it. Asked only when a
    /// pool autoscales.
    fn list_pods(&self) -> impl Future<Output = Result<Vec<Pod>, ClusterError>> + Send;
    /// Every PersistentVolume, for the autoscaler's volume rules. Asked only when some pod
    /// mounts a claim.
    fn list_pvs(&self) -> impl Future<Output = Result<Vec<PersistentVolume>, ClusterError>> + Send;
    /// Every PodDisruptionBudget, for the autoscaler's budget rules. Asked only when a node
    /// with pods to move could be removed.
    fn list_pdbs(&self)
    -> impl Future<Output = Result<Vec<DisruptionBudget>, ClusterError>> + Send;
    /// Evicts through the Eviction API, honouring PodDisruptionBudgets.
    fn evict(&self, pod: &PodRef) -> impl Future<Output = Result<Eviction, ClusterError>> + Send;
    /// Deletes a pod outright (`--force-drain`).
    fn delete_pod(&self, pod: &PodRef) -> impl Future<Output = Result<(), ClusterError>> + Send;

    /// Takes the Lease for `duration` if it is free, expired or already ours.
    fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> impl Future<Output = Result<LeaseOutcome, ClusterError>> + Send;
    /// Extends our Lease; `Conflict` if someone else took it.
    fn renew_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Releases our Lease (best effort).
    fn release_lease(&self, holder: &str) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Who holds the Lease now (a run under way), if anyone; an expired Lease is free.
    fn lease_holder(&self) -> impl Future<Output = Result<Option<String>, ClusterError>> + Send;

    /// Records a Kubernetes Event on the ConfigMap.
    fn record_event(
        &self,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;

    /// Starts the on-demand reconcile Job from the CronJob's jobTemplate.
    fn trigger_reconcile_job(
        &self,
    ) -> impl Future<Output = Result<JobTrigger, ClusterError>> + Send;

    /// The cluster's etcd member list as a k3s server's supervisor serves it (`GET /db/info`
    /// on `:6443`, the API's own port, to holders of the server token `server_token`): what
    /// joining servers read. A server whose etcd has no quorum answers 500.
    fn etcd_members(
        &self,
        server_token: &str,
    ) -> impl Future<Output = Result<Vec<EtcdMember>, ClusterError>> + Send;

    /// `GET path` (a non-resource URL such as `/metrics`) from one server's own apiserver,
    /// the first of `addresses` that answers (port 6443, its certificate checked for
    /// `kubernetes.default.svc`, which every k3s server's certificate names), with this
    /// cluster's credentials: what that apiserver process alone knows.
    fn server_get(
        &self,
        addresses: &[std::net::IpAddr],
        path: &str,
    ) -> impl Future<Output = Result<String, ClusterError>> + Send {
        let what = format!("GET {path} from {addresses:?}");
        async move {
            Err(ClusterError::Unavailable {
                what,
                message: "this adapter cannot reach one server's apiserver".into(),
            })
        }
    }
}
