//! The cluster's side of a delete, while its API still answers: stop every in-cluster piece
//! that could create a VM behind our back, and read what only the cluster knows (the spec,
//! the LoadBalancer Services whose floating IPs the Oxide CCM made).
//!
//! Quiescing takes the reconcile Lease for the rest of the run first (a reconcile already
//! under way finishes before we proceed; one started later exits at once, "held by"), then
//! suspends the CronJob and scales the webhook Deployment to zero so nothing new is even
//! scheduled. Every step is idempotent; a re-run after a kill repeats them harmlessly.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, Patch, PatchParams};
use tokio::time::Instant;
use tracing::info;

use crate::adapters::kube_cluster::KubeCluster;
use crate::adapters::kube_store::KubeStateStore;
use crate::adapters::kubeclient;
use crate::domain::spec::ClusterSpec;
use crate::ports::cluster::{Cluster as _, JOBS_NAMESPACE, LeaseOutcome, NAMESPACE, OBJECT_NAME};
use crate::ports::state::{StateStore as _, keys};

/// Name of the webhook Deployment (k8s-cronjobs/webhook.yaml).
pub const WEBHOOK_DEPLOYMENT: &str = "oxide-controller-webhook";
/// How long the delete run holds the reconcile Lease: longer than any delete takes; the
/// cluster is gone before it runs out.
const LEASE_HOLD: Duration = Duration::from_secs(3600);

/// What a delete needs from the cluster's API. Tests use an in-memory stand-in.
pub trait InCluster: Send + Sync {
    /// Takes the reconcile Lease (waiting up to `wait` for a run that holds it), suspends the
    /// CronJob, scales the webhook to zero. Returns what it did, one line each.
    fn quiesce(
        &self,
        holder: &str,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<String>, String>> + Send;
    /// The spec in the ConfigMap, `None` when there is none.
    fn spec(&self) -> impl Future<Output = Result<Option<ClusterSpec>, String>> + Send;
    /// `(namespace, name)` of every Service of type LoadBalancer.
    fn load_balancers(&self) -> impl Future<Output = Result<Vec<(String, String)>, String>> + Send;
}

/// [`InCluster`] over kube-rs with the admin kubeconfig bootstrap wrote.
#[derive(Clone)]
pub struct KubeInCluster {
    client: kube::Client,
}

impl std::fmt::Debug for KubeInCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeInCluster").finish_non_exhaustive()
    }
}

impl KubeInCluster {
    /// A client for context `cluster` of the kubeconfig at `path` when the file has one and
    /// the API answers within a few seconds; `Err` says why not (the delete then works from
    /// Oxide alone).
    pub async fn connect(path: &std::path::Path, cluster: &str) -> Result<KubeInCluster, String> {
        match crate::adapters::kubeconfig::inspect(path, cluster) {
            Ok(crate::adapters::kubeconfig::Existing::Ours { .. }) => {}
            Ok(_) => {
                return Err(format!("{} has no context {cluster}", path.display()));
            }
            Err(e) => return Err(e.to_string()),
        }
        let client = kubeclient::client(Some(path), Some(cluster))
            .await
            .map_err(|e| crate::workflows::error::chain(&e))?;
        let probe = KubeStateStore::new(client.clone(), NAMESPACE);
        match tokio::time::timeout(Duration::from_secs(10), probe.read_config()).await {
            Ok(Ok(_)) | Ok(Err(crate::ports::state::StateError::NotFound { .. })) => {
                Ok(KubeInCluster { client })
            }
            Ok(Err(e)) => Err(crate::workflows::error::chain(&e)),
            Err(_) => Err("the Kubernetes API did not answer within 10s".into()),
        }
    }
}

fn gone_ok<T>(r: Result<T, kube::Error>, what: &str) -> Result<bool, String> {
    match r {
        Ok(_) => Ok(true),
        Err(e) if kubeclient::api_status(&e) == Some(404) => Ok(false),
        Err(e) => Err(format!("{what}: {}", kubeclient::api_message(&e))),
    }
}

impl InCluster for KubeInCluster {
    async fn quiesce(&self, holder: &str, wait: Duration) -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        let lease = KubeCluster::new(self.client.clone(), NAMESPACE);
        let deadline = Instant::now() + wait;
        loop {
            match lease.acquire_lease(holder, LEASE_HOLD).await {
                Ok(LeaseOutcome::Acquired) => break,
                Ok(LeaseOutcome::HeldBy { holder: other, .. }) => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "a reconcile run ({other}) still holds the Lease after {}s; re-run delete when it is done",
                            wait.as_secs()
                        ));
                    }
                    info!(step = "quiesce", %other, "a reconcile run holds the Lease; waiting for it to finish");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Err(e) => return Err(format!("taking the reconcile Lease: {e}")),
            }
        }
        done.push(format!(
            "took the reconcile Lease {NAMESPACE}/{OBJECT_NAME} (runs starting now exit at once)"
        ));
        let pp = PatchParams::default();
        let suspend = serde_json::json!({"spec": {"suspend": true}});
        // The Jobs' namespace; kube-system where a release before the two accounts put it.
        for ns in [JOBS_NAMESPACE, NAMESPACE] {
            let cronjobs: Api<CronJob> = Api::namespaced(self.client.clone(), ns);
            if gone_ok(
                cronjobs
                    .patch(OBJECT_NAME, &pp, &Patch::Merge(&suspend))
                    .await,
                "suspending the CronJob",
            )? {
                done.push(format!("suspended CronJob {ns}/{OBJECT_NAME}"));
            }
        }
        // The in-cluster backup too (audit security-2 N1): one started during the delete
        // could upload a backup after the backups were listed, and outlive --delete-backups.
        let backup_ns = crate::render::manifests::BACKUP_CRONJOB;
        let cronjobs: Api<CronJob> = Api::namespaced(self.client.clone(), backup_ns);
        if gone_ok(
            cronjobs
                .patch(
                    crate::render::manifests::BACKUP_CRONJOB,
                    &pp,
                    &Patch::Merge(&suspend),
                )
                .await,
            "suspending the backup CronJob",
        )? {
            done.push(format!(
                "suspended CronJob {backup_ns}/{}",
                crate::render::manifests::BACKUP_CRONJOB
            ));
        }
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
        let zero = serde_json::json!({"spec": {"replicas": 0}});
        if gone_ok(
            deployments
                .patch(WEBHOOK_DEPLOYMENT, &pp, &Patch::Merge(&zero))
                .await,
            "scaling the webhook to zero",
        )? {
            done.push(format!(
                "scaled Deployment {NAMESPACE}/{WEBHOOK_DEPLOYMENT} to zero"
            ));
        }
        Ok(done)
    }

    async fn spec(&self) -> Result<Option<ClusterSpec>, String> {
        let store = KubeStateStore::new(self.client.clone(), NAMESPACE);
        let snap = match store.read_config().await {
            Ok(s) => s,
            Err(crate::ports::state::StateError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(crate::workflows::error::chain(&e)),
        };
        match snap.data.get(keys::SPEC) {
            Some(text) => ClusterSpec::from_yaml(text)
                .map(Some)
                .map_err(|e| format!("the ConfigMap's spec: {e}")),
            None => Ok(None),
        }
    }

    async fn load_balancers(&self) -> Result<Vec<(String, String)>, String> {
        let services: Api<Service> = Api::all(self.client.clone());
        let list = services
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing Services: {}", kubeclient::api_message(&e)))?;
        Ok(list
            .items
            .into_iter()
            .filter(|s| {
                s.spec
                    .as_ref()
                    .and_then(|sp| sp.type_.as_deref())
                    .is_some_and(|t| t == "LoadBalancer")
            })
            .map(|s| {
                (
                    s.metadata.namespace.unwrap_or_default(),
                    s.metadata.name.unwrap_or_default(),
                )
            })
            .collect())
    }
}
