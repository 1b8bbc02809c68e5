//! [`ApplyManifests`] over kube-rs: server-side apply with bootstrap's field manager through
//! the static resource of each kind (no discovery), and a merge patch for the Node label.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};

use crate::adapters::kubeclient::{api_message, api_status};
use crate::base::retry::{self, Backoff};
use crate::ports::manifests::ApplyManifests;
use crate::render::manifests::{FIELD_MANAGER, Manifest, ManifestError, Resource, Retired};

/// The cluster's API, for applying manifests.
#[derive(Clone)]
pub struct KubeManifests(kube::Client);

impl KubeManifests {
    pub fn new(client: kube::Client) -> KubeManifests {
        KubeManifests(client)
    }
}

impl std::fmt::Debug for KubeManifests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeManifests").finish_non_exhaustive()
    }
}

impl ApplyManifests for KubeManifests {
    async fn apply_all(
        &self,
        manifests: &[Manifest],
        backoff: Backoff,
    ) -> Result<usize, ManifestError> {
        apply_all(&self.0, manifests, backoff).await
    }

    async fn delete_retired(
        &self,
        objects: &[Retired],
        backoff: Backoff,
    ) -> Result<usize, ManifestError> {
        let mut deleted = 0;
        for r in objects {
            let gone = retry::retry(backoff, ManifestError::is_retryable, || {
                delete_one(&self.0, r)
            })
            .await?;
            if gone {
                tracing::info!(object = %r.describe(), "deleted what an earlier release installed");
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    async fn label_node(&self, node: &str, label: &str, value: &str) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.0.clone());
        let patch = serde_json::json!({ "metadata": { "labels": { label: value } } });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| api_message(&e))
    }
}

fn api_resource(r: &Resource) -> ApiResource {
    ApiResource {
        group: r.group.clone(),
        version: r.version.clone(),
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        plural: r.plural.clone(),
    }
}

/// Server-side applies one object (forcing ownership of the fields bootstrap sets).
pub async fn apply_one(client: &kube::Client, m: &Manifest) -> Result<(), ManifestError> {
    let resource = api_resource(&m.resource);
    let api: Api<DynamicObject> = match &m.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&m.name, &params, &Patch::Apply(&m.object))
        .await
        .map(drop)
        .map_err(|e| match api_status(&e) {
            Some(status) => ManifestError::Rejected {
                what: m.describe(),
                status,
                message: api_message(&e),
            },
            None => ManifestError::Api {
                what: m.describe(),
                message: api_message(&e),
            },
        })
}

/// Deletes one object (its dependents in the background: a Job's pods); false if it was not
/// there.
async fn delete_one(client: &kube::Client, r: &Retired) -> Result<bool, ManifestError> {
    let resource = api_resource(&r.resource);
    let api: Api<DynamicObject> = match r.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    match api
        .delete(r.name, &kube::api::DeleteParams::background())
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if api_status(&e) == Some(404) => Ok(false),
        Err(e) => Err(match api_status(&e) {
            Some(status) => ManifestError::Rejected {
                what: format!("deleting {}", r.describe()),
                status,
                message: api_message(&e),
            },
            None => ManifestError::Api {
                what: format!("deleting {}", r.describe()),
                message: api_message(&e),
            },
        }),
    }
}

/// Applies every object in order; returns how many.
pub async fn apply_all(
    client: &kube::Client,
    manifests: &[Manifest],
    backoff: Backoff,
) -> Result<usize, ManifestError> {
    for m in manifests {
        retry::retry(backoff, ManifestError::is_retryable, || {
            apply_one(client, m)
        })
        .await?;
        tracing::debug!(object = %m.describe(), "applied");
    }
    Ok(manifests.len())
}
