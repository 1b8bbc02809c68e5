//! The in-cluster pieces — ServiceAccount, RBAC, the reconcile CronJob, the scale webhook
//! Deployment and Service — exactly the manifests in `k8s-cronjobs/`, embedded in the binary,
//! and their server-side apply.
//!
//! Owns the embedding, the two substitutions bootstrap makes in the parsed objects (the
//! controller image of every container, the CronJob schedule) and the apply with a fixed
//! field manager through a static [`ApiResource`] per kind (no discovery round trips).
//! Not here: what the manifests say (they are the packaging's, kept in step with the Helm
//! chart by `tests/tests/manifests_drift.rs`).

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use serde_json::Value;

use crate::kubeclient::{api_message, api_status};

/// The embedded files, in apply order (identity and permissions before their users).
pub const FILES: [(&str, &str); 4] = [
    (
        "serviceaccount.yaml",
        include_str!("../../k8s-cronjobs/serviceaccount.yaml"),
    ),
    ("rbac.yaml", include_str!("../../k8s-cronjobs/rbac.yaml")),
    (
        "cronjob.yaml",
        include_str!("../../k8s-cronjobs/cronjob.yaml"),
    ),
    (
        "webhook.yaml",
        include_str!("../../k8s-cronjobs/webhook.yaml"),
    ),
];

/// Repository of the controller image.
pub const IMAGE_REPOSITORY: &str = "ghcr.io/aifoundry-org/oxide-controller";
/// The image of this release (what the embedded manifests name).
pub const DEFAULT_CONTROLLER_IMAGE: &str = concat!(
    "ghcr.io/aifoundry-org/oxide-controller:",
    env!("CARGO_PKG_VERSION")
);
/// Field manager of bootstrap's server-side applies.
pub const FIELD_MANAGER: &str = "oxide-controller-bootstrap";

/// Manifest trouble.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("embedded manifest {file} does not parse: {message}")]
    Parse { file: &'static str, message: String },
    #[error(
        "embedded manifest {file} has a {kind} object, which bootstrap does not know how to apply"
    )]
    UnknownKind { file: &'static str, kind: String },
    #[error("embedded manifest {file} has an object without metadata.name")]
    Unnamed { file: &'static str },
    #[error("applying {what} failed (HTTP {status}): {message}")]
    Rejected {
        what: String,
        status: u16,
        message: String,
    },
    #[error("applying {what} failed: {message}")]
    Api { what: String, message: String },
}

impl ManifestError {
    /// Worth another try (transport trouble, 5xx, 409/429).
    pub fn is_retryable(&self) -> bool {
        match self {
            ManifestError::Api { .. } => true,
            ManifestError::Rejected { status, .. } => matches!(status, 409 | 429 | 500..=599),
            _ => false,
        }
    }
}

/// The two values bootstrap puts into the manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Image of every container (`reconcile-once` and `scale` live in the same image).
    pub controller_image: String,
    /// The CronJob's schedule (five-field cron, already validated).
    pub schedule: String,
}

/// One object to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub file: &'static str,
    pub resource: ApiResource,
    pub namespaced: bool,
    pub namespace: Option<String>,
    pub name: String,
    pub object: Value,
}

impl Manifest {
    /// `Kind namespace/name`, for messages.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.resource.kind, self.name),
            None => format!("{} {}", self.resource.kind, self.name),
        }
    }
}

/// Static resource table: every kind the manifests use. `(apiVersion, kind) → (plural, namespaced)`.
fn resource(api_version: &str, kind: &str) -> Option<(ApiResource, bool)> {
    let (plural, namespaced) = match (api_version, kind) {
        ("v1", "ServiceAccount") => ("serviceaccounts", true),
        ("v1", "Service") => ("services", true),
        ("v1", "ConfigMap") => ("configmaps", true),
        ("v1", "Secret") => ("secrets", true),
        ("apps/v1", "Deployment") => ("deployments", true),
        ("batch/v1", "CronJob") => ("cronjobs", true),
        ("rbac.authorization.k8s.io/v1", "Role") => ("roles", true),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => ("rolebindings", true),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => ("clusterroles", false),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => ("clusterrolebindings", false),
        ("policy/v1", "PodDisruptionBudget") => ("poddisruptionbudgets", true),
        _ => return None,
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Some((
        ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        },
        namespaced,
    ))
}

/// Sets `image` on every container of a pod template.
fn set_images(pod_spec: &mut Value, image: &str) {
    for list in ["containers", "initContainers"] {
        // `get_mut`, not indexing: `value[key]` on a map inserts a null for a missing key.
        if let Some(containers) = pod_spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in containers {
                c["image"] = Value::from(image);
            }
        }
    }
}

/// The embedded objects with `settings` substituted, in apply order.
pub fn render(settings: &Settings) -> Result<Vec<Manifest>, ManifestError> {
    let mut out = Vec::new();
    for (file, text) in FILES {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| ManifestError::Parse {
                file,
                message: e.to_string(),
            })?;
        for mut object in docs.into_iter().filter(|d| !d.is_null()) {
            let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let (resource, namespaced) =
                self::resource(&api_version, &kind).ok_or(ManifestError::UnknownKind {
                    file,
                    kind: kind.clone(),
                })?;
            match kind.as_str() {
                "Deployment" => set_images(
                    &mut object["spec"]["template"]["spec"],
                    &settings.controller_image,
                ),
                "CronJob" => {
                    object["spec"]["schedule"] = Value::from(settings.schedule.as_str());
                    set_images(
                        &mut object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                        &settings.controller_image,
                    );
                }
                _ => {}
            }
            let name = object["metadata"]["name"]
                .as_str()
                .ok_or(ManifestError::Unnamed { file })?
                .to_owned();
            let namespace = if namespaced {
                Some(
                    object["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or(crate::cluster::NAMESPACE)
                        .to_owned(),
                )
            } else {
                None
            };
            out.push(Manifest {
                file,
                resource,
                namespaced,
                namespace,
                name,
                object,
            });
        }
    }
    Ok(out)
}

/// Server-side applies one object (forcing ownership of the fields bootstrap sets).
pub async fn apply_one(client: &kube::Client, m: &Manifest) -> Result<(), ManifestError> {
    let api: Api<DynamicObject> = match &m.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &m.resource),
        None => Api::all_with(client.clone(), &m.resource),
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

/// Applies every object in order; returns how many.
pub async fn apply_all(
    client: &kube::Client,
    manifests: &[Manifest],
    retry: crate::retry::Backoff,
) -> Result<usize, ManifestError> {
    for m in manifests {
        crate::retry::retry(retry, ManifestError::is_retryable, || apply_one(client, m)).await?;
        tracing::debug!(object = %m.describe(), "applied");
    }
    Ok(manifests.len())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            controller_image: "registry.example/oxide-controller:dev".into(),
            schedule: "*/2 * * * *".into(),
        }
    }

    #[test]
    fn every_embedded_object_is_known_and_named() {
        let all = render(&settings()).unwrap();
        let mut keys: Vec<String> = all.iter().map(Manifest::describe).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "ClusterRole oxide-controller",
                "ClusterRoleBinding oxide-controller",
                "CronJob kube-system/oxide-controller",
                "Deployment kube-system/oxide-controller-webhook",
                "Role kube-system/oxide-controller",
                "RoleBinding kube-system/oxide-controller",
                "Service kube-system/oxide-controller-webhook",
                "ServiceAccount kube-system/oxide-controller",
            ]
        );
        assert_eq!(all[0].resource.kind, "ServiceAccount", "identity first");
    }

    #[test]
    fn image_and_schedule_are_substituted_and_nothing_else_changes() {
        let all = render(&settings()).unwrap();
        let cron = all.iter().find(|m| m.resource.kind == "CronJob").unwrap();
        assert_eq!(cron.object["spec"]["schedule"], "*/2 * * * *");
        let c = &cron.object["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "registry.example/oxide-controller:dev");
        assert_eq!(c["command"][0], "/usr/local/bin/reconcile-once");
        let deploy = all
            .iter()
            .find(|m| m.resource.kind == "Deployment")
            .unwrap();
        assert_eq!(
            deploy.object["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example/oxide-controller:dev"
        );
        // Untouched elsewhere: the default render names this release's image.
        let default = render(&Settings {
            controller_image: DEFAULT_CONTROLLER_IMAGE.into(),
            schedule: "*/5 * * * *".into(),
        })
        .unwrap();
        for (file, text) in FILES {
            let original: Vec<Value> = serde_saphyr::from_multiple(text).unwrap();
            let rendered: Vec<&Value> = default
                .iter()
                .filter(|m| m.file == file)
                .map(|m| &m.object)
                .collect();
            assert_eq!(
                rendered,
                original.iter().filter(|d| !d.is_null()).collect::<Vec<_>>(),
                "{file}"
            );
        }
    }

    #[test]
    fn cluster_scoped_objects_have_no_namespace() {
        for m in render(&settings()).unwrap() {
            assert_eq!(m.namespace.is_some(), m.namespaced, "{}", m.describe());
            if m.resource.kind.starts_with("Cluster") {
                assert!(!m.namespaced);
            }
        }
    }
}
