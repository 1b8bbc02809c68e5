//! [`KubeCluster`]: the [`Cluster`] trait over the Kubernetes API with kube-rs. It owns the
//! translation between `k8s_openapi` objects and the domain types in [`crate::domain::model`], the
//! Lease protocol, the Event shape and the on-demand Job; decisions about *when* to cordon,
//! evict or take the Lease belong to the planner and the workflows, not here.
//!
//! Every write that depends on what was read (Lease, Job re-creation) carries the read
//! `resourceVersion` or relies on create-only semantics, so two runs racing each other get a
//! 409 instead of silently overwriting one another.
//!
//! Events are `events.k8s.io/v1` Events (RBAC: `create` on `events` in group `events.k8s.io`).

use std::fmt::Debug;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node as KubeNode, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rand::RngExt;
use serde::de::DeserializeOwned;

use crate::adapters::kubeclient::{api_message, api_status};
use crate::domain::model::{Node, NodeReadiness, PodRef};
use crate::domain::plan::REMOVING_ANNOTATION;
use crate::ports::cluster::{
    Cluster, ClusterError, EventType, Eviction, JOBS_NAMESPACE, JobTrigger, LeaseOutcome,
    OBJECT_NAME, ON_DEMAND_JOB,
};

pub mod supervisor;
pub mod views;

/// Annotation the kubelet puts on mirror pods of static pods (they cannot be evicted).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Annotation `kubectl create job --from=cronjob/...` puts on the Job it makes.
pub const INSTANTIATE_ANNOTATION: &str = "cronjob.kubernetes.io/instantiate";
/// Longest Event note the API accepts (bytes).
pub const EVENT_NOTE_MAX: usize = 1024;
/// Longest Event reason/action the API accepts (bytes).
const EVENT_FIELD_MAX: usize = 128;
/// Page size for list calls; pages are followed until the server has no more.
const LIST_PAGE: u32 = 5000;
/// Read-decide-write rounds for the Lease before giving up with `Conflict`.
const LEASE_ATTEMPTS: usize = 3;

/// The real [`Cluster`]: one kube client and the namespace of our objects.
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
    namespace: String,
    reporting_instance: String,
    /// The configuration `client` was built from, for clients of one server's apiserver
    /// ([`Cluster::server_get`]); None: not available.
    server_config: Option<kube::Config>,
    /// The Lease as we last wrote it: renew and release replace it directly (one request);
    /// only a 409 sends them back to read the current one.
    held: std::sync::Arc<std::sync::Mutex<Option<Lease>>>,
    /// k3s's supervisor at the API address (the etcd member list); `None` until
    /// [`KubeCluster::with_supervisor`].
    supervisor: Option<supervisor::Supervisor>,
    /// Where the reconcile CronJob and its Jobs live ([`JOBS_NAMESPACE`]).
    jobs_namespace: String,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster")
            .field("namespace", &self.namespace)
            .field("jobs_namespace", &self.jobs_namespace)
            .field("reporting_instance", &self.reporting_instance)
            .finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// An adapter for the Lease and Events in `namespace` (normally
    /// [`crate::ports::cluster::NAMESPACE`]) and the CronJob and Jobs in [`JOBS_NAMESPACE`]
    /// (see [`KubeCluster::with_jobs_namespace`]); Nodes and pods are cluster-wide.
    ///
    /// Build `client` with [`crate::adapters::kubeclient::client`]: kube's default retry layer would
    /// retry the 429 of a budget-blocked eviction for minutes.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        KubeCluster {
            client,
            namespace: namespace.to_owned(),
            reporting_instance: OBJECT_NAME.to_owned(),
            server_config: None,
            held: std::sync::Arc::default(),
            supervisor: None,
            jobs_namespace: JOBS_NAMESPACE.to_owned(),
        }
    }

    /// The reconcile CronJob and its Jobs are in `namespace` instead of [`JOBS_NAMESPACE`].
    pub fn with_jobs_namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.jobs_namespace);
        self
    }

    /// Reads the etcd member list from k3s's supervisor at `config`'s API address (the
    /// configuration `client` was built from). Without it, [`Cluster::etcd_members`] fails,
    /// and a run holds every control-plane change.
    pub fn with_supervisor(mut self, config: &kube::Config) -> Self {
        match supervisor::Supervisor::from_config(config) {
            Ok(s) => self.supervisor = Some(s),
            Err(e) => tracing::warn!(error = %e, "no access to k3s's supervisor"),
        }
        self
    }

    /// Lets [`Cluster::server_get`] reach each server's own apiserver with the credentials
    /// and CA of `config` (what `client` was built from).
    pub fn with_server_config(mut self, config: kube::Config) -> Self {
        self.server_config = Some(config);
        self
    }

    /// `GET path` from the apiserver at `address`:6443.
    async fn get_from(
        &self,
        address: std::net::IpAddr,
        path: &str,
    ) -> Result<String, ClusterError> {
        let what = format!("GET {path} from {address}");
        let unavailable = |message: String| ClusterError::Unavailable {
            what: what.clone(),
            message,
        };
        let mut config = self
            .server_config
            .clone()
            .ok_or_else(|| unavailable("no client configuration to reach one server".into()))?;
        config.cluster_url = format!("https://{}", std::net::SocketAddr::new(address, 6443))
            .parse()
            .map_err(|e| unavailable(format!("{e}")))?;
        config.tls_server_name = Some("kubernetes.default.svc".into());
        let client = crate::adapters::kubeclient::client_from_config(config)
            .map_err(|e| unavailable(e.to_string()))?;
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| unavailable(e.to_string()))?;
        client
            .request_text(req)
            .await
            .map_err(|e| match api_status(&e) {
                Some(403) => ClusterError::Forbidden {
                    what: what.clone(),
                    message: api_message(&e),
                },
                Some(code) => unavailable(format!("HTTP {code}: {}", api_message(&e))),
                None => unavailable(e.to_string()),
            })
    }

    fn remember(&self, lease: Option<Lease>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = lease;
    }

    /// Our last write of the Lease, if it was for `holder`.
    fn remembered(&self, holder: &str) -> Option<Lease> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|l| lease_holder(l).0.as_deref() == Some(holder))
    }

    /// Sets `reportingInstance` of recorded Events (e.g. the pod or host name); defaults to
    /// `oxide-controller`.
    pub fn with_reporting_instance(mut self, instance: &str) -> Self {
        self.reporting_instance = truncate_utf8(instance, EVENT_FIELD_MAX).to_owned();
        self
    }

    /// The Events recorded about the cluster (those regarding the ConfigMap), newest first,
    /// at most `limit`: what `scale status` shows.
    pub async fn recent_events(
        &self,
        limit: usize,
    ) -> Result<Vec<crate::domain::status_view::EventSummary>, ClusterError> {
        let api: Api<Event> = self.namespaced();
        let what = format!("events in {}", self.namespace);
        let list = api
            .list(&ListParams::default().fields(&format!(
                "regarding.kind=ConfigMap,regarding.name={OBJECT_NAME}"
            )))
            .await
            .map_err(|e| cluster_error(&what, e))?;
        let mut out: Vec<crate::domain::status_view::EventSummary> = list
            .items
            .into_iter()
            .map(|e| crate::domain::status_view::EventSummary {
                time: e
                    .event_time
                    .as_ref()
                    .map(|t| from_jiff(&t.0))
                    .or_else(|| e.deprecated_last_timestamp.as_ref().map(from_time))
                    .or_else(|| e.metadata.creation_timestamp.as_ref().map(from_time))
                    .unwrap_or(DateTime::UNIX_EPOCH),
                type_: e.type_.unwrap_or_default(),
                reason: e.reason.unwrap_or_default(),
                note: e.note.unwrap_or_default(),
            })
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse(e.time));
        out.truncate(limit);
        Ok(out)
    }

    fn namespaced<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn lease_what(&self) -> String {
        format!("lease {}/{OBJECT_NAME}", self.namespace)
    }

    /// The on-demand Job as `kubectl create job --from=cronjob/oxide-controller` makes it: the
    /// template's labels and annotations, `cronjob.kubernetes.io/instantiate: manual`, and a
    /// controller owner reference *without* `blockOwnerDeletion` (kubectl leaves it unset on
    /// purpose: under `OwnerReferencesPermissionEnforcement` it needs `update` on
    /// `cronjobs/finalizers`, which our RBAC does not grant).
    fn job_from_cronjob(&self, cron: &CronJob) -> Job {
        let template = cron
            .spec
            .as_ref()
            .map(|s| s.job_template.clone())
            .unwrap_or_default();
        let template_meta = template.metadata.unwrap_or_default();
        let mut annotations = template_meta.annotations.unwrap_or_default();
        annotations.insert(INSTANTIATE_ANNOTATION.to_owned(), "manual".to_owned());
        // Without the CronJob's uid an owner reference would be rejected; leave it out then.
        let owner = cron.metadata.uid.as_ref().map(|uid| OwnerReference {
            api_version: "batch/v1".to_owned(),
            kind: "CronJob".to_owned(),
            name: cron
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| OBJECT_NAME.to_owned()),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        });
        Job {
            metadata: ObjectMeta {
                name: Some(ON_DEMAND_JOB.to_owned()),
                namespace: Some(self.jobs_namespace.clone()),
                labels: template_meta.labels,
                annotations: Some(annotations),
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: template.spec,
            status: None,
        }
    }
}

/// Annotation on an on-demand reconcile Job: a random id per create request, so a create
/// answered with a 5xx after it was committed is recognised as ours.
pub const TRIGGER_ANNOTATION: &str = "oxide-controller/trigger-id";

/// Classifies a kube error for the object `what`.
pub fn cluster_error(what: impl Into<String>, err: kube::Error) -> ClusterError {
    let what = what.into();
    match api_status(&err) {
        Some(404) => ClusterError::NotFound { what },
        Some(409) => ClusterError::Conflict { what },
        Some(403) => ClusterError::Forbidden {
            what,
            message: api_message(&err),
        },
        Some(code) if code == 429 || code >= 500 => ClusterError::Unavailable {
            what,
            message: api_message(&err),
        },
        _ => ClusterError::Api {
            what,
            source: Box::new(err),
        },
    }
}

/// The `reason` of a failed API call's Status ("" when it has none or was no API answer).
fn api_reason(err: &kube::Error) -> &str {
    match err {
        kube::Error::Api(status) => &status.reason,
        _ => "",
    }
}

/// All items of a list, following `continue` tokens.
async fn list_all<K>(api: &Api<K>, lp: ListParams, what: &str) -> Result<Vec<K>, ClusterError>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut lp = lp.limit(LIST_PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await.map_err(|e| cluster_error(what, e))?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        out.extend(page.items);
        match next {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(out),
        }
    }
}

fn from_jiff(t: &jiff::Timestamp) -> DateTime<Utc> {
    i64::try_from(t.as_nanosecond())
        .map(DateTime::from_timestamp_nanos)
        .unwrap_or(DateTime::UNIX_EPOCH)
}

fn to_micro(t: DateTime<Utc>) -> MicroTime {
    // Microsecond precision is all MicroTime carries on the wire anyway.
    let ts = jiff::Timestamp::from_microsecond(t.timestamp_micros())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    MicroTime(ts)
}

fn from_time(t: &Time) -> DateTime<Utc> {
    from_jiff(&t.0)
}

/// The domain view of a Node.
pub fn node_from_kube(node: &KubeNode) -> Node {
    let meta = &node.metadata;
    let created = meta
        .creation_timestamp
        .as_ref()
        .map(from_time)
        .unwrap_or(DateTime::UNIX_EPOCH);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let readiness = match ready {
        Some(c) if c.status == "True" => NodeReadiness::Ready,
        Some(c) => NodeReadiness::NotReady {
            since: c
                .last_transition_time
                .as_ref()
                .map(from_time)
                .unwrap_or(created),
        },
        // A Node whose kubelet never reported is not ready since it was registered.
        None => NodeReadiness::NotReady { since: created },
    };
    let spec = node.spec.as_ref();
    Node {
        name: meta.name.clone().unwrap_or_default(),
        provider_id: spec
            .and_then(|s| s.provider_id.clone())
            .filter(|p| !p.is_empty()),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        readiness,
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        created,
        taints: views::taints(node),
        allocatable: views::allocatable(node),
        kubelet_version: node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.kubelet_version.clone())
            .filter(|v| !v.is_empty()),
        deleting_since: meta.deletion_timestamp.as_ref().map(from_time),
    }
}

/// The drain view of a Pod.
pub fn pod_ref_from_kube(pod: &Pod) -> PodRef {
    let meta = &pod.metadata;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    PodRef {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        deleting_at: meta.deletion_timestamp.as_ref().map(from_time),
        daemonset: meta
            .owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|r| r.kind == "DaemonSet")),
        mirror: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
    }
}

/// Whether a Job has a `Complete` or `Failed` condition that is `True`.
pub fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn lease_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs()).unwrap_or(i32::MAX).max(1)
}

/// Who holds `lease` and until when (`None` holder: released or never taken).
fn lease_holder(lease: &Lease) -> (Option<String>, Option<DateTime<Utc>>) {
    let Some(spec) = lease.spec.as_ref() else {
        return (None, None);
    };
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let until = spec.renew_time.as_ref().map(|t| {
        from_jiff(&t.0)
            + chrono::Duration::seconds(i64::from(spec.lease_duration_seconds.unwrap_or(0)))
    });
    (holder, until)
}

/// `Some(HeldBy)` if someone other than `me` holds an unexpired `lease` at `now`.
fn held_by_other(lease: &Lease, me: &str, now: DateTime<Utc>) -> Option<LeaseOutcome> {
    let (holder, until) = lease_holder(lease);
    let holder = holder.filter(|h| h != me)?;
    // No renewTime means the holder never renewed: treat as expired, as client-go does.
    let until = until.filter(|u| *u >= now)?;
    Some(LeaseOutcome::HeldBy {
        holder,
        until: Some(until),
    })
}

impl Cluster for KubeCluster {
    async fn etcd_members(
        &self,
        server_token: &str,
    ) -> Result<Vec<crate::domain::model::EtcdMember>, ClusterError> {
        match &self.supervisor {
            Some(s) => s.db_info(server_token).await,
            None => Err(ClusterError::Unavailable {
                what: "the etcd member list (GET /db/info)".into(),
                message: "this run has no address and CA for k3s's supervisor".into(),
            }),
        }
    }

    async fn server_get(
        &self,
        addresses: &[std::net::IpAddr],
        path: &str,
    ) -> Result<String, ClusterError> {
        let mut last = ClusterError::Unavailable {
            what: format!("GET {path}"),
            message: "the server has no address".into(),
        };
        for a in addresses {
            match self.get_from(*a, path).await {
                Ok(text) => return Ok(text),
                // An answer (a refusal) is the server's word; another address says the same.
                Err(e @ ClusterError::Forbidden { .. }) => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn lease_holder(&self) -> Result<Option<String>, ClusterError> {
        let api: Api<Lease> = self.namespaced();
        let lease = api
            .get_opt(OBJECT_NAME)
            .await
            .map_err(|e| cluster_error(self.lease_what(), e))?;
        Ok(lease.and_then(|l| match held_by_other(&l, "", Utc::now()) {
            Some(LeaseOutcome::HeldBy { holder, .. }) => Some(holder),
            _ => None,
        }))
    }

    async fn list_nodes(&self) -> Result<Vec<Node>, ClusterError> {
        let api: Api<KubeNode> = Api::all(self.client.clone());
        let nodes = list_all(&api, ListParams::default(), "list nodes").await?;
        Ok(nodes.iter().map(node_from_kube).collect())
    }

    async fn cordon(&self, node: &str) -> Result<(), ClusterError> {
        let api: Api<KubeNode> = Api::all(self.client.clone());
        let patch = serde_json::json!({ "spec": { "unschedulable": true } });
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| cluster_error(format!("node {node}"), e))?;
        Ok(())
    }

    async fn mark_removing(&self, node: &str, reason: &str) -> Result<(), ClusterError> {
        // One merge patch, so a Node is never annotated without being cordoned.
        let api: Api<KubeNode> = Api::all(self.client.clone());
        let patch = serde_json::json!({
            "metadata": { "annotations": { REMOVING_ANNOTATION: reason } },
            "spec": { "unschedulable": true },
        });
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| cluster_error(format!("node {node}"), e))?;
        Ok(())
    }

    async fn mark_restarted(
        &self,
        node: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), ClusterError> {
        let api: Api<KubeNode> = Api::all(self.client.clone());
        let patch = serde_json::json!({
            "metadata": { "annotations": {
                crate::domain::model::RESTARTED_ANNOTATION:
                    at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            } },
        });
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| cluster_error(format!("node {node}"), e))?;
        Ok(())
    }

    async fn certificate_events(
        &self,
    ) -> Result<Vec<crate::domain::certificates::MonitorEvent>, ClusterError> {
        use crate::domain::certificates::{MONITOR_NAMESPACE, MONITOR_SOURCE, MonitorEvent};
        let api: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), MONITOR_NAMESPACE);
        // `source` is one of core/v1 Event's selectable fields (it matches
        // `source.component`).
        let lp = ListParams::default().fields(&format!("source={MONITOR_SOURCE}"));
        let events = list_all(&api, lp, "list k3s certificate monitor events").await?;
        Ok(events
            .into_iter()
            .filter_map(|e| {
                let last_seen = e
                    .last_timestamp
                    .map(|t| from_jiff(&t.0))
                    .or(e.event_time.map(|t| from_jiff(&t.0)))
                    .or(e.metadata.creation_timestamp.map(|t| from_jiff(&t.0)))?;
                Some(MonitorEvent {
                    node: e.involved_object.name?,
                    reason: e.reason?,
                    message: e.message.unwrap_or_default(),
                    last_seen,
                })
            })
            .collect())
    }

    async fn mark_certificate_restart(
        &self,
        node: &str,
        value: &str,
        unschedulable: Option<bool>,
    ) -> Result<(), ClusterError> {
        let api: Api<KubeNode> = Api::all(self.client.clone());
        let mut patch = serde_json::json!({
            "metadata": { "annotations": {
                crate::domain::certificates::RESTART_ANNOTATION: value,
            } },
        });
        match unschedulable {
            Some(true) => patch["spec"] = serde_json::json!({ "unschedulable": true }),
            Some(false) => patch["spec"] = serde_json::json!({ "unschedulable": null }),
            None => {}
        }
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| cluster_error(format!("node {node}"), e))?;
        Ok(())
    }

    async fn cancel_removal(&self, node: &str) -> Result<(), ClusterError> {
        let api: Api<KubeNode> = Api::all(self.client.clone());
        let patch = serde_json::json!({
            "metadata": { "annotations": { REMOVING_ANNOTATION: null } },
            "spec": { "unschedulable": null },
        });
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| cluster_error(format!("node {node}"), e))?;
        Ok(())
    }

    async fn delete_node(&self, node: &str) -> Result<(), ClusterError> {
        let api: Api<KubeNode> = Api::all(self.client.clone());
        match api.delete(node, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if api_status(&e) == Some(404) => Ok(()),
            Err(e) => Err(cluster_error(format!("node {node}"), e)),
        }
    }

    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodRef>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = list_all(&api, lp, &format!("list pods on node {node}")).await?;
        Ok(pods.iter().map(pod_ref_from_kube).collect())
    }

    async fn list_pods(&self) -> Result<Vec<crate::domain::model::Pod>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let pods = list_all(&api, ListParams::default(), "list pods").await?;
        // The API always sends a spec; a pod without one would hold nothing.
        Ok(pods
            .iter()
            .filter(|p| p.spec.is_some())
            .map(views::pod_from_kube)
            .collect())
    }

    async fn list_pvs(&self) -> Result<Vec<crate::domain::model::PersistentVolume>, ClusterError> {
        let api: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(self.client.clone());
        let pvs = list_all(&api, ListParams::default(), "list persistentvolumes").await?;
        Ok(pvs.iter().map(views::pv_from_kube).collect())
    }

    async fn list_pdbs(&self) -> Result<Vec<crate::domain::model::DisruptionBudget>, ClusterError> {
        let api: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
            Api::all(self.client.clone());
        let pdbs = list_all(&api, ListParams::default(), "list poddisruptionbudgets").await?;
        Ok(pdbs.iter().map(views::pdb_from_kube).collect())
    }

    async fn evict(&self, pod: &PodRef) -> Result<Eviction, ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        // The Eviction body by hand: kube-rs's `EvictParams` serialises its delete options
        // under `delete_options`, which the apiserver ignores (kube-core subresource.rs), and
        // the uid precondition is what keeps a re-eviction off a same-named replacement pod
        // (a StatefulSet's) — the apiserver then answers 409.
        let mut body = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        });
        if !pod.uid.is_empty() {
            body["deleteOptions"] = serde_json::json!({"preconditions": {"uid": pod.uid}});
        }
        match api
            .create_subresource::<serde_json::Value, serde_json::Value>(
                "eviction",
                &pod.name,
                &PostParams::default(),
                &body,
            )
            .await
        {
            Ok(_) => Ok(Eviction::Evicted),
            Err(e) => match api_status(&e) {
                Some(429) => Ok(Eviction::BlockedByBudget),
                // 409: the uid precondition failed, the name belongs to another pod now.
                Some(404 | 409) => Ok(Eviction::Gone),
                // eviction.go answers a pod under several budgets with a bare 500 Status
                // (no reason; a generic server error says InternalError), and refuses with
                // 403 when a budget's allowed disruptions are negative: this pod's refusal.
                Some(403) => Ok(Eviction::Refused(api_message(&e))),
                Some(500) if api_reason(&e).is_empty() => Ok(Eviction::Refused(api_message(&e))),
                _ => Err(cluster_error(
                    format!("evict pod {}/{}", pod.namespace, pod.name),
                    e,
                )),
            },
        }
    }

    async fn delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match api.delete(&pod.name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if api_status(&e) == Some(404) => Ok(()),
            Err(e) => Err(cluster_error(
                format!("pod {}/{}", pod.namespace, pod.name),
                e,
            )),
        }
    }

    async fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> Result<LeaseOutcome, ClusterError> {
        let api: Api<Lease> = self.namespaced();
        let what = self.lease_what();
        for _ in 0..LEASE_ATTEMPTS {
            let now = Utc::now();
            let current = api
                .get_opt(OBJECT_NAME)
                .await
                .map_err(|e| cluster_error(&what, e))?;
            let Some(mut lease) = current else {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(OBJECT_NAME.to_owned()),
                        namespace: Some(self.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(holder.to_owned()),
                        acquire_time: Some(to_micro(now)),
                        renew_time: Some(to_micro(now)),
                        lease_duration_seconds: Some(lease_seconds(duration)),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(written) => {
                        self.remember(Some(written));
                        return Ok(LeaseOutcome::Acquired);
                    }
                    // Someone created it first: read it and decide again.
                    Err(e) if api_status(&e) == Some(409) => continue,
                    Err(e) => return Err(cluster_error(&what, e)),
                }
            };
            if let Some(held) = held_by_other(&lease, holder, now) {
                return Ok(held);
            }
            // Free, expired or ours: take it with the resourceVersion we read.
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(holder) {
                spec.lease_transitions =
                    Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                spec.acquire_time = Some(to_micro(now));
                spec.holder_identity = Some(holder.to_owned());
            }
            spec.renew_time = Some(to_micro(now));
            spec.lease_duration_seconds = Some(lease_seconds(duration));
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => {
                    self.remember(Some(written));
                    return Ok(LeaseOutcome::Acquired);
                }
                Err(e) if api_status(&e) == Some(409) => {
                    // Someone wrote the Lease between our read and our write: most likely
                    // another run took it. Say who; if it is somehow free again, go round.
                    let again = api
                        .get_opt(OBJECT_NAME)
                        .await
                        .map_err(|e| cluster_error(&what, e))?;
                    if let Some(held) = again.and_then(|l| held_by_other(&l, holder, Utc::now())) {
                        return Ok(held);
                    }
                }
                Err(e) => return Err(cluster_error(&what, e)),
            }
        }
        Err(ClusterError::Conflict { what })
    }

    async fn renew_lease(&self, holder: &str, duration: Duration) -> Result<(), ClusterError> {
        let api: Api<Lease> = self.namespaced();
        let what = self.lease_what();
        // Our last write first; read the current Lease only if that is stale.
        let mut lease = match self.remembered(holder) {
            Some(l) => l,
            None => match api.get(OBJECT_NAME).await {
                Ok(l) => l,
                // Deleted under us: we no longer hold it, which is what Conflict tells the caller.
                Err(e) if api_status(&e) == Some(404) => {
                    return Err(ClusterError::Conflict { what });
                }
                Err(e) => return Err(cluster_error(&what, e)),
            },
        };
        for attempt in 0..2 {
            if lease_holder(&lease).0.as_deref() != Some(holder) {
                return Err(ClusterError::Conflict { what });
            }
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.renew_time = Some(to_micro(Utc::now()));
            spec.lease_duration_seconds = Some(lease_seconds(duration));
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => {
                    self.remember(Some(written));
                    return Ok(());
                }
                Err(e) if attempt == 0 && api_status(&e) == Some(409) => {
                    lease = match api.get(OBJECT_NAME).await {
                        Ok(l) => l,
                        Err(e) if api_status(&e) == Some(404) => {
                            return Err(ClusterError::Conflict { what });
                        }
                        Err(e) => return Err(cluster_error(&what, e)),
                    };
                }
                Err(e) if api_status(&e) == Some(409) => {
                    return Err(ClusterError::Conflict { what });
                }
                Err(e) => return Err(cluster_error(&what, e)),
            }
        }
        Err(ClusterError::Conflict { what })
    }

    async fn release_lease(&self, holder: &str) -> Result<(), ClusterError> {
        let api: Api<Lease> = self.namespaced();
        let what = self.lease_what();
        // Our last write first (one request); if that is stale, read and try once more.
        let cached = self.remembered(holder);
        let fresh = cached.is_none();
        let mut next = match cached {
            Some(l) => Some(l),
            None => api
                .get_opt(OBJECT_NAME)
                .await
                .map_err(|e| cluster_error(&what, e))?,
        };
        let mut may_reread = !fresh;
        while let Some(mut lease) = next.take() {
            if lease_holder(&lease).0.as_deref() != Some(holder) {
                break;
            }
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(to_micro(Utc::now()));
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => break,
                Err(e) if api_status(&e) == Some(409) && may_reread => {
                    may_reread = false;
                    next = api
                        .get_opt(OBJECT_NAME)
                        .await
                        .map_err(|e| cluster_error(&what, e))?;
                }
                // Changed or deleted since we read it: it is not ours to release any more.
                Err(e) if matches!(api_status(&e), Some(404 | 409)) => break,
                Err(e) => return Err(cluster_error(&what, e)),
            }
        }
        self.remember(None);
        Ok(())
    }

    async fn record_event(
        &self,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        let api: Api<Event> = self.namespaced();
        let suffix: u64 = rand::rng().random();
        let name = format!("{OBJECT_NAME}.{suffix:016x}");
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(to_micro(Utc::now())),
            action: Some("Reconcile".to_owned()),
            reason: Some(truncate_utf8(reason, EVENT_FIELD_MAX).to_owned()),
            note: Some(truncate_utf8(message, EVENT_NOTE_MAX).to_owned()),
            type_: Some(match kind {
                EventType::Normal => "Normal".to_owned(),
                EventType::Warning => "Warning".to_owned(),
            }),
            regarding: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("ConfigMap".to_owned()),
                name: Some(OBJECT_NAME.to_owned()),
                namespace: Some(self.namespace.clone()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(OBJECT_NAME.to_owned()),
            reporting_instance: Some(self.reporting_instance.clone()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &event)
            .await
            .map_err(|e| cluster_error(format!("event {}/{name}", self.namespace), e))?;
        Ok(())
    }

    async fn trigger_reconcile_job(&self) -> Result<JobTrigger, ClusterError> {
        let cronjobs: Api<CronJob> = Api::namespaced(self.client.clone(), &self.jobs_namespace);
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.jobs_namespace);
        let cron_what = format!("cronjob {}/{OBJECT_NAME}", self.jobs_namespace);
        let job_what = format!("job {}/{ON_DEMAND_JOB}", self.jobs_namespace);
        let Some(cron) = cronjobs
            .get_opt(OBJECT_NAME)
            .await
            .map_err(|e| cluster_error(&cron_what, e))?
        else {
            return Ok(JobTrigger::NoCronJob);
        };
        let mut job = self.job_from_cronjob(&cron);
        // Marks this create, so a create whose answer was lost can be recognised.
        let attempt = uuid::Uuid::new_v4().simple().to_string();
        job.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TRIGGER_ANNOTATION.to_owned(), attempt.clone());
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => return Ok(JobTrigger::Created),
            Err(e) if api_status(&e) == Some(409) => {}
            // A 5xx or a lost answer says nothing about whether the Job was made (a 504 "may
            // still be processing the request"): look for this very create.
            Err(e) if crate::adapters::kubeclient::outcome_unknown(&e) => {
                let made = jobs.get_opt(ON_DEMAND_JOB).await.ok().flatten();
                if made.is_some_and(|j| {
                    j.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(TRIGGER_ANNOTATION))
                        == Some(&attempt)
                }) {
                    return Ok(JobTrigger::Created);
                }
                return Err(cluster_error(&job_what, e));
            }
            Err(e) => return Err(cluster_error(&job_what, e)),
        }
        // The fixed name is taken: a run is pending or under way, or the last one finished
        // and its Job was not cleaned up yet.
        match jobs
            .get_opt(ON_DEMAND_JOB)
            .await
            .map_err(|e| cluster_error(&job_what, e))?
        {
            // Gone between our create and our read: try once more below.
            None => {}
            // Finished and already being deleted (TTL, or a person, with a finalizer still
            // on it): not a pending run. Wait a moment for it to go, then start ours.
            Some(existing)
                if job_finished(&existing) && existing.metadata.deletion_timestamp.is_some() =>
            {
                let deadline = std::time::Instant::now() + JOB_GONE_PATIENCE;
                loop {
                    let still = jobs
                        .get_opt(ON_DEMAND_JOB)
                        .await
                        .map_err(|e| cluster_error(&job_what, e))?;
                    if still.is_none() {
                        break;
                    }
                    if std::time::Instant::now() >= deadline {
                        return Err(ClusterError::Conflict {
                            what: format!(
                                "{job_what}, finished and still being deleted (a finalizer holds it), so no new run could start; the change is saved and the next scheduled run applies it"
                            ),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Some(existing)
                if job_finished(&existing) && existing.metadata.deletion_timestamp.is_none() =>
            {
                match jobs
                    .delete(ON_DEMAND_JOB, &DeleteParams::background())
                    .await
                {
                    Ok(_) => {}
                    Err(e) if api_status(&e) == Some(404) => {}
                    Err(e) => return Err(cluster_error(&job_what, e)),
                }
            }
            Some(_) => return Ok(JobTrigger::AlreadyPending),
        }
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => Ok(JobTrigger::Created),
            // Someone else triggered in between (or the old Job is still being deleted).
            Err(e) if api_status(&e) == Some(409) => Ok(JobTrigger::AlreadyPending),
            Err(e) => Err(cluster_error(&job_what, e)),
        }
    }
}

/// How long a trigger waits for the previous on-demand Job, finished and being deleted, to go.
const JOB_GONE_PATIENCE: Duration = Duration::from_secs(5);

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("héllo", 3), "hé");
        assert_eq!(truncate_utf8("abc", 10), "abc");
        let long = "é".repeat(1000);
        assert!(truncate_utf8(&long, EVENT_NOTE_MAX).len() <= EVENT_NOTE_MAX);
    }

    #[test]
    fn a_lease_held_by_someone_else_expires_after_its_duration() {
        let now = Utc::now();
        let lease = Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some("other".into()),
                renew_time: Some(to_micro(now)),
                lease_duration_seconds: Some(10),
                ..LeaseSpec::default()
            }),
        };
        assert!(
            matches!(held_by_other(&lease, "me", now), Some(LeaseOutcome::HeldBy { ref holder, .. }) if holder == "other")
        );
        assert_eq!(held_by_other(&lease, "other", now), None);
        assert_eq!(
            held_by_other(&lease, "me", now + chrono::Duration::seconds(11)),
            None
        );
    }

    #[test]
    fn micro_time_round_trips_to_the_microsecond() {
        let t = DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap_or_default();
        let back = from_jiff(&to_micro(t).0);
        assert_eq!(back.timestamp_micros(), t.timestamp_micros());
    }
}
