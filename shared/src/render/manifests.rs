//! The in-cluster pieces — ServiceAccount, RBAC, the reconcile CronJob, the scale webhook
//! Deployment and Service — exactly the manifests in `k8s-cronjobs/`, embedded in the binary,
//! rendered for a server-side apply.
//!
//! Owns the embedding, the two substitutions bootstrap makes in the parsed objects (the
//! controller image of every container, the CronJob schedule), and a static [`Resource`] per
//! kind so the apply needs no discovery round trips. The apply itself is a port
//! ([`crate::ports::manifests::ApplyManifests`]) with a kube-rs adapter
//! (`crate::adapters::kube_manifests`).
//! Also owns the two optional variants bootstrap asks for: the Oxide cloud controller
//! manager's published manifest (`--oxide-ccm`, [`render_oxide_ccm`]) and running the
//! controller from binaries on the nodes (`--controller-image dev:PATH`, [`run_from_node`]).
//! Not here: what the manifests say (they are the packaging's, kept in step with the Helm
//! chart by `tests/tests/manifests_drift.rs`).

use serde_json::Value;

/// The embedded files, in apply order (the Jobs' namespace, then identity and permissions
/// before their users; the admission policy after the CronJob it reads and before the webhook
/// whose creates it checks).
pub const FILES: [(&str, &str); 7] = [
    (
        "00-namespace.yaml",
        include_str!("../../../k8s-cronjobs/00-namespace.yaml"),
    ),
    (
        "serviceaccount.yaml",
        include_str!("../../../k8s-cronjobs/serviceaccount.yaml"),
    ),
    ("rbac.yaml", include_str!("../../../k8s-cronjobs/rbac.yaml")),
    (
        "cronjob.yaml",
        include_str!("../../../k8s-cronjobs/cronjob.yaml"),
    ),
    (
        "admission.yaml",
        include_str!("../../../k8s-cronjobs/admission.yaml"),
    ),
    (
        "webhook.yaml",
        include_str!("../../../k8s-cronjobs/webhook.yaml"),
    ),
    (
        "backup.yaml",
        include_str!("../../../k8s-cronjobs/backup.yaml"),
    ),
];

/// The in-cluster backup's CronJob (`backup.yaml`), in its own namespace.
pub const BACKUP_CRONJOB: &str = "oxide-controller-backup";

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
    /// The backup CronJob's schedule (the spec's `backup.schedule`, already validated); None
    /// suspends it.
    pub backup_schedule: Option<String>,
}

/// The API resource of a kind: where its objects live in the API (what kube-rs calls an
/// `ApiResource`), known statically for every kind the manifests use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    /// `group/version`, or `version` for the core group.
    pub api_version: String,
    pub kind: String,
    pub plural: String,
}

/// One object to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub file: &'static str,
    pub resource: Resource,
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
fn resource(api_version: &str, kind: &str) -> Option<(Resource, bool)> {
    let (plural, namespaced) = match (api_version, kind) {
        ("v1", "Namespace") => ("namespaces", false),
        ("v1", "ServiceAccount") => ("serviceaccounts", true),
        ("v1", "Service") => ("services", true),
        ("v1", "ConfigMap") => ("configmaps", true),
        ("v1", "Secret") => ("secrets", true),
        ("apps/v1", "Deployment") => ("deployments", true),
        ("batch/v1", "CronJob") => ("cronjobs", true),
        ("batch/v1", "Job") => ("jobs", true),
        ("rbac.authorization.k8s.io/v1", "Role") => ("roles", true),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => ("rolebindings", true),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => ("clusterroles", false),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => ("clusterrolebindings", false),
        ("policy/v1", "PodDisruptionBudget") => ("poddisruptionbudgets", true),
        ("networking.k8s.io/v1", "NetworkPolicy") => ("networkpolicies", true),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            ("validatingadmissionpolicies", false)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            ("validatingadmissionpolicybindings", false)
        }
        _ => return None,
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Some((
        Resource {
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
        out.extend(parse_file(file, text, |kind, object| match kind {
            "Deployment" => set_images(
                &mut object["spec"]["template"]["spec"],
                &settings.controller_image,
            ),
            "CronJob" if object["metadata"]["name"] == BACKUP_CRONJOB => {
                match &settings.backup_schedule {
                    Some(s) => object["spec"]["schedule"] = Value::from(s.as_str()),
                    None => object["spec"]["suspend"] = Value::from(true),
                }
                set_images(
                    &mut object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                    &settings.controller_image,
                );
            }
            "CronJob" => {
                object["spec"]["schedule"] = Value::from(settings.schedule.as_str());
                set_images(
                    &mut object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                    &settings.controller_image,
                );
            }
            _ => {}
        })?);
    }
    Ok(out)
}

/// An object an earlier release installed and this one no longer has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    pub resource: Resource,
    pub namespace: Option<&'static str>,
    pub name: &'static str,
}

impl Retired {
    /// `Kind namespace/name`, for messages.
    pub fn describe(&self) -> String {
        match self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.resource.kind, self.name),
            None => format!("{} {}", self.resource.kind, self.name),
        }
    }
}

/// What releases before the two accounts (issue 34 §2) installed, deleted once the new
/// objects are applied: the one ServiceAccount `kube-system/oxide-controller` that could read
/// the whole Secret and create Jobs in kube-system, its roles and bindings, and the CronJob
/// and on-demand Job that ran as it. Deleting them is how an existing cluster loses those
/// rights when its controller is updated; a re-run finds them gone (404) and deletes nothing.
pub fn retired() -> Vec<Retired> {
    const NS: Option<&str> = Some(crate::base::names::NAMESPACE);
    const OLD: &str = crate::base::names::OBJECT_NAME;
    [
        ("batch/v1", "CronJob", NS, OLD),
        ("batch/v1", "Job", NS, crate::base::names::ON_DEMAND_JOB),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", NS, OLD),
        ("rbac.authorization.k8s.io/v1", "Role", NS, OLD),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            None,
            OLD,
        ),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", None, OLD),
        ("v1", "ServiceAccount", NS, OLD),
    ]
    .into_iter()
    .filter_map(|(api_version, kind, namespace, name)| {
        resource(api_version, kind).map(|(resource, _)| Retired {
            resource,
            namespace,
            name,
        })
    })
    .collect()
}

/// The objects of one embedded file, each passed through `patch(kind, object)` first.
fn parse_file(
    file: &'static str,
    text: &str,
    mut patch: impl FnMut(&str, &mut Value),
) -> Result<Vec<Manifest>, ManifestError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ManifestError::Parse {
        file,
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    for mut object in docs.into_iter().filter(|d| !d.is_null()) {
        let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        let (resource, namespaced) =
            self::resource(&api_version, &kind).ok_or(ManifestError::UnknownKind {
                file,
                kind: kind.clone(),
            })?;
        patch(&kind, &mut object);
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or(ManifestError::Unnamed { file })?
            .to_owned();
        let namespace = if namespaced {
            Some(
                object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(crate::base::names::NAMESPACE)
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
    Ok(out)
}

// ---- the Oxide cloud controller manager (--oxide-ccm) -------------------------------------

/// The Oxide CCM's published manifest, a verbatim copy (source and version in its header).
/// Applied only in CCM mode.
pub const OXIDE_CCM_FILE: (&str, &str) = (
    "oxide-cloud-controller-manager.yaml",
    include_str!("../../manifests/oxide-cloud-controller-manager.yaml"),
);
/// The CCM image the embedded manifest names (release 0.8.0). By tag: no public source gives
/// its digest (the upstream release workflow, oxidecomputer/oxide-cloud-controller-manager
/// `.github/workflows/release.yaml`, pushes by tag and records none), and a digest is never
/// made up here; `--oxide-ccm-image NAME@sha256:…` pins it (audit security-2 N12).
pub const DEFAULT_OXIDE_CCM_IMAGE: &str =
    "ghcr.io/oxidecomputer/oxide-cloud-controller-manager:0.8.0";
/// The node label k3s gives every server (and only servers): our pods select it.
pub const SERVERS_ONLY: (&str, &str) = ("node-role.kubernetes.io/control-plane", "true");
/// The Secret the published manifest reads `oxide-host`, `oxide-token` and `oxide-project`
/// from; ours ([`crate::base::names::OBJECT_NAME`]) holds the same keys and is used instead.
const OXIDE_CCM_UPSTREAM_SECRET: &str = "oxide-cloud-controller-manager";

/// What bootstrap puts into the CCM manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CcmSettings {
    /// Image of the CCM container.
    pub image: String,
    /// Our cluster name, passed as the CCM's `--cluster-name`: the CCM names the floating IP
    /// of a LoadBalancer Service `<cluster-name>-<namespace>-<service>` (truncated to 63), so
    /// with our name as prefix its floating IPs never take `<cluster>-apiserver` (a Service
    /// suffix `<namespace>-<service>` always contains a `-`; `apiserver` does not).
    pub cluster: String,
}

/// The CCM's objects with `settings` substituted: image, the Secret name of its three env
/// vars (ours), `--cluster-name`, and a nodeSelector for servers ([`SERVERS_ONLY`]: it holds
/// the rack token, and workers run tenant pods). Everything else is the published manifest's
/// (whose tolerations already let it run on servers).
pub fn render_oxide_ccm(settings: &CcmSettings) -> Result<Vec<Manifest>, ManifestError> {
    let (file, text) = OXIDE_CCM_FILE;
    parse_file(file, text, |kind, object| {
        if kind != "Deployment" {
            return;
        }
        let pod = &mut object["spec"]["template"]["spec"];
        set_images(pod, &settings.image);
        if let Some(selector) = pod
            .as_object_mut()
            .map(|p| {
                p.entry("nodeSelector")
                    .or_insert_with(|| serde_json::json!({}))
            })
            .and_then(Value::as_object_mut)
        {
            let (key, value) = SERVERS_ONLY;
            selector.insert(key.to_owned(), Value::from(value));
        }
        let Some(containers) = pod.get_mut("containers").and_then(Value::as_array_mut) else {
            return;
        };
        for c in containers {
            if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
                for e in env {
                    if let Some(secret) = e
                        .get_mut("valueFrom")
                        .and_then(|v| v.get_mut("secretKeyRef"))
                        .filter(|r| r["name"] == OXIDE_CCM_UPSTREAM_SECRET)
                    {
                        secret["name"] = Value::from(crate::base::names::OBJECT_NAME);
                    }
                }
            }
            if let Some(command) = c.get_mut("command").and_then(Value::as_array_mut)
                && !command
                    .iter()
                    .any(|a| a.as_str().is_some_and(|a| a.starts_with("--cluster-name")))
            {
                command.push(Value::from(format!("--cluster-name={}", settings.cluster)));
            }
        }
    })
}

// ---- controller binaries from the nodes (--controller-image dev:PATH) ----------------------

/// Node label bootstrap puts on each control-plane Node once the dev binaries are on it; the
/// in-cluster pods select it, so they only land where their binaries are.
pub const NODE_BINARIES_LABEL: &str = "oxide-controller/dev-binaries";
/// Where the node's binary directory is mounted in the containers (read-only).
pub const NODE_BINARIES_MOUNT: &str = "/opt/oxide-controller/bin";
/// Image the containers run in when their binaries come from the node: the release image's
/// base (glibc, libgcc, CA certificates, user 65532, no shell), so a binary built on a glibc
/// 2.36-or-older Linux runs as it would in the release image.
pub const NODE_BINARIES_BASE_IMAGE: &str = "gcr.io/distroless/cc-debian12:nonroot";
const NODE_BINARIES_VOLUME: &str = "oxide-controller-bin";

/// Binaries on the control-plane nodes to run instead of the image's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBinaries {
    /// Directory on the nodes holding `reconcile-once`, `scale` and `bootstrap`.
    pub host_dir: String,
    /// Value of [`NODE_BINARIES_LABEL`] on the Nodes that have them (identifies the build).
    pub label_value: String,
}

/// Makes the CronJob and the webhook Deployment of [`FILES`] run their command from
/// `binaries`: a read-only hostPath volume at [`NODE_BINARIES_MOUNT`], the command's program
/// taken from there, [`NODE_BINARIES_BASE_IMAGE`] as image, and a nodeSelector for
/// [`NODE_BINARIES_LABEL`] (their existing control-plane tolerations let them run there).
/// The Jobs' namespace then admits `privileged` pods: a development build only.
pub fn run_from_node(manifests: &mut [Manifest], binaries: &NodeBinaries) {
    for m in manifests
        .iter_mut()
        .filter(|m| FILES.iter().any(|(f, _)| *f == m.file))
    {
        let pod = match m.resource.kind.as_str() {
            // A hostPath volume is what Pod Security `restricted` (and `baseline`) forbids:
            // a development build's Jobs need the namespace `privileged`.
            "Namespace" => {
                for mode in ["enforce", "warn", "audit"] {
                    m.object["metadata"]["labels"][format!("pod-security.kubernetes.io/{mode}")] =
                        Value::from("privileged");
                }
                continue;
            }
            "Deployment" => &mut m.object["spec"]["template"]["spec"],
            "CronJob" => &mut m.object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            _ => continue,
        };
        node_binaries_pod(pod, binaries);
    }
}

fn node_binaries_pod(pod: &mut Value, binaries: &NodeBinaries) {
    let Some(spec) = pod.as_object_mut() else {
        return;
    };
    let volumes = spec
        .entry("volumes")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Some(list) = volumes.as_array_mut() {
        list.retain(|v| v["name"] != NODE_BINARIES_VOLUME);
        list.push(serde_json::json!({
            "name": NODE_BINARIES_VOLUME,
            "hostPath": {"path": binaries.host_dir, "type": "Directory"},
        }));
    }
    let selector = spec
        .entry("nodeSelector")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(map) = selector.as_object_mut() {
        map.insert(
            NODE_BINARIES_LABEL.to_owned(),
            Value::from(binaries.label_value.as_str()),
        );
    }
    for list in ["containers", "initContainers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in containers {
            c["image"] = Value::from(NODE_BINARIES_BASE_IMAGE);
            if let Some(program) = c
                .get_mut("command")
                .and_then(Value::as_array_mut)
                .and_then(|cmd| cmd.first_mut())
            {
                let base = program
                    .as_str()
                    .and_then(|p| p.rsplit('/').next())
                    .unwrap_or_default()
                    .to_owned();
                *program = Value::from(format!("{NODE_BINARIES_MOUNT}/{base}"));
            }
            let mounts = c
                .as_object_mut()
                .map(|o| {
                    o.entry("volumeMounts")
                        .or_insert_with(|| Value::Array(Vec::new()))
                })
                .and_then(Value::as_array_mut);
            if let Some(mounts) = mounts {
                mounts.retain(|v| v["name"] != NODE_BINARIES_VOLUME);
                mounts.push(serde_json::json!({
                    "name": NODE_BINARIES_VOLUME,
                    "mountPath": NODE_BINARIES_MOUNT,
                    "readOnly": true,
                }));
            }
        }
    }
}

/// The backup's own Secret (namespace `oxide-controller-backup`): the rack credentials the
/// in-cluster backup needs, copied from the state Secret by bootstrap and mounted into the
/// backup pod, so that its account reads no Secret and never holds the server token (audit
/// security-2 N1, N8). Rendered from `secrets` at apply time; never logged (its `Debug` is
/// the [`Manifest`]'s, so callers keep it out of logs).
pub const BACKUP_RACK_SECRET: &str = "oxide-controller-rack";
/// Where the backup pod mounts [`BACKUP_RACK_SECRET`].
pub const BACKUP_RACK_SECRET_DIR: &str = "/var/run/secrets/oxide-controller-rack";

/// Key of [`BACKUP_RACK_SECRET`] holding the retention floor (JSON
/// [`crate::domain::backup::Retention`]): the spec's retention when bootstrap last ran. Not a
/// secret; kept there because no in-cluster account may write that Secret (audit security-2
/// N4).
pub const BACKUP_RETENTION_FLOOR: &str = "backup-retention-floor";

/// [`BACKUP_RACK_SECRET`] holding `secrets`' `oxide-host`, `oxide-token`, `oxide-project` and
/// `oxide-cluster`, and the retention `floor` ([`BACKUP_RETENTION_FLOOR`]); nothing else.
pub fn backup_rack_secret(
    secrets: &crate::base::secrets::ClusterSecrets,
    floor: crate::domain::backup::Retention,
) -> Manifest {
    use crate::base::secrets::keys;
    use base64::Engine as _;
    let b64 = |v: &str| Value::from(base64::engine::general_purpose::STANDARD.encode(v));
    Manifest {
        file: "backup.yaml",
        resource: Resource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Secret".into(),
            plural: "secrets".into(),
        },
        namespaced: true,
        namespace: Some(BACKUP_CRONJOB.to_owned()),
        name: BACKUP_RACK_SECRET.to_owned(),
        object: serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": BACKUP_RACK_SECRET,
                "namespace": BACKUP_CRONJOB,
                "labels": {"app.kubernetes.io/name": "oxide-controller"},
            },
            "type": "Opaque",
            "data": {
                (keys::OXIDE_HOST): b64(&secrets.oxide_host),
                (keys::OXIDE_TOKEN): b64(&secrets.oxide_token),
                (keys::OXIDE_PROJECT): b64(&secrets.oxide_project),
                (keys::OXIDE_CLUSTER): b64(&secrets.oxide_cluster),
                (BACKUP_RETENTION_FLOOR): b64(&serde_json::to_string(&floor).unwrap_or_default()),
            },
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            controller_image: "registry.example/oxide-controller:dev".into(),
            schedule: "*/2 * * * *".into(),
            backup_schedule: Some("@every 30s".into()),
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
                "ClusterRole oxide-controller-backup-count",
                "ClusterRole oxide-controller-reconcile",
                "ClusterRole oxide-controller-webhook",
                "ClusterRoleBinding oxide-controller-backup-count",
                "ClusterRoleBinding oxide-controller-reconcile",
                "ClusterRoleBinding oxide-controller-webhook",
                "CronJob oxide-controller-backup/oxide-controller-backup",
                "CronJob oxide-controller-jobs/oxide-controller",
                "Deployment kube-system/oxide-controller-webhook",
                "Namespace oxide-controller-backup",
                "Namespace oxide-controller-jobs",
                "NetworkPolicy kube-system/oxide-controller-webhook",
                "Role default/oxide-controller-reconcile-certificates",
                "Role kube-system/oxide-controller-backup",
                "Role kube-system/oxide-controller-reconcile",
                "Role kube-system/oxide-controller-webhook",
                "Role oxide-controller-jobs/oxide-controller-webhook",
                "RoleBinding default/oxide-controller-reconcile-certificates",
                "RoleBinding kube-system/oxide-controller-backup",
                "RoleBinding kube-system/oxide-controller-reconcile",
                "RoleBinding kube-system/oxide-controller-webhook",
                "RoleBinding oxide-controller-jobs/oxide-controller-webhook",
                "Service kube-system/oxide-controller-webhook",
                "ServiceAccount kube-system/oxide-controller-webhook",
                "ServiceAccount oxide-controller-backup/oxide-controller-backup",
                "ServiceAccount oxide-controller-jobs/oxide-controller-reconcile",
                "ValidatingAdmissionPolicy oxide-controller-webhook-jobs",
                "ValidatingAdmissionPolicyBinding oxide-controller-webhook-jobs",
            ]
        );
        assert_eq!(all[0].resource.kind, "Namespace", "the namespaces first");
        let position = |kind: &str| all.iter().position(|m| m.resource.kind == kind).unwrap();
        assert!(
            position("CronJob") < position("ValidatingAdmissionPolicyBinding")
                && position("ValidatingAdmissionPolicyBinding") < position("Deployment"),
            "the policy after the CronJob it reads, before the webhook whose creates it checks"
        );
        assert_eq!(all[1].resource.kind, "Namespace", "the namespaces first");
        assert_eq!(all[2].resource.kind, "ServiceAccount", "then identity");
        // What an earlier release installed is never among what this one applies.
        for r in retired() {
            assert!(!keys.contains(&r.describe()), "{}", r.describe());
        }
        assert_eq!(
            retired().len(),
            7,
            "every retired kind is in the resource table"
        );
    }

    #[test]
    fn image_and_schedule_are_substituted_and_nothing_else_changes() {
        let all = render(&settings()).unwrap();
        let cron = all.iter().find(|m| m.resource.kind == "CronJob").unwrap();
        assert_eq!(cron.object["spec"]["schedule"], "*/2 * * * *");
        let backup = all
            .iter()
            .find(|m| m.resource.kind == "CronJob" && m.name == BACKUP_CRONJOB)
            .unwrap();
        assert_eq!(backup.object["spec"]["schedule"], "@every 30s");
        assert_eq!(backup.object["spec"]["suspend"], false);
        assert_eq!(
            backup.object["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example/oxide-controller:dev"
        );
        let off = render(&Settings {
            backup_schedule: None,
            ..settings()
        })
        .unwrap();
        let off = off
            .iter()
            .find(|m| m.resource.kind == "CronJob" && m.name == BACKUP_CRONJOB)
            .unwrap();
        assert_eq!(
            off.object["spec"]["suspend"], true,
            "schedule null: suspended"
        );
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
            backup_schedule: Some(crate::domain::backup::DEFAULT_SCHEDULE.into()),
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

    fn ccm() -> CcmSettings {
        CcmSettings {
            image: "registry.example/ccm:test".into(),
            cluster: "demo".into(),
        }
    }

    #[test]
    fn the_ccm_is_its_published_manifest_but_for_image_secret_cluster_name_and_servers_only() {
        let all = render_oxide_ccm(&ccm()).unwrap();
        let keys: Vec<String> = all.iter().map(Manifest::describe).collect();
        assert_eq!(
            keys,
            [
                "ServiceAccount kube-system/oxide-cloud-controller-manager",
                "ClusterRole system:oxide-cloud-controller-manager",
                "ClusterRoleBinding system:oxide-cloud-controller-manager",
                "Deployment kube-system/oxide-cloud-controller-manager",
            ]
        );
        // The published objects with exactly the three documented changes applied.
        let mut want: Vec<Value> = serde_saphyr::from_multiple(OXIDE_CCM_FILE.1).unwrap();
        want.retain(|d| !d.is_null());
        let c = &mut want[3]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            c["image"], DEFAULT_OXIDE_CCM_IMAGE,
            "the default is the manifest's"
        );
        c["image"] = Value::from("registry.example/ccm:test");
        for e in c["env"].as_array_mut().unwrap() {
            assert_eq!(
                e["valueFrom"]["secretKeyRef"]["name"],
                OXIDE_CCM_UPSTREAM_SECRET
            );
            e["valueFrom"]["secretKeyRef"]["name"] = Value::from("oxide-controller");
        }
        c["command"]
            .as_array_mut()
            .unwrap()
            .push(Value::from("--cluster-name=demo"));
        want[3]["spec"]["template"]["spec"]["nodeSelector"]["node-role.kubernetes.io/control-plane"] =
            Value::from("true");
        let got: Vec<Value> = all.into_iter().map(|m| m.object).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_ccm_reads_exactly_the_secret_keys_we_write() {
        let all = render_oxide_ccm(&ccm()).unwrap();
        let deploy = all
            .iter()
            .find(|m| m.resource.kind == "Deployment")
            .unwrap();
        let keys: Vec<&str> = deploy.object["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["valueFrom"]["secretKeyRef"]["key"].as_str().unwrap())
            .collect();
        let secret = crate::base::secrets::ClusterSecrets::default().to_map();
        for key in &keys {
            assert!(secret.contains_key(*key), "our Secret lacks {key}");
        }
        assert_eq!(keys, ["oxide-host", "oxide-token", "oxide-project"]);
    }

    /// The CCM's `GetLoadBalancerName`: `<cluster-name>-<namespace>-<service>`, cut to 63
    /// characters, trailing `-` trimmed.
    fn ccm_floating_ip_name(cluster: &str, namespace: &str, service: &str) -> String {
        let mut name = format!("{cluster}-{namespace}-{service}");
        name.truncate(63);
        name.trim_end_matches('-').to_owned()
    }

    #[test]
    fn ccm_floating_ips_never_take_the_api_floating_ip_name() {
        let long = "n".repeat(40);
        for cluster in ["demo", "a", "prod-eu-1", &"c".repeat(38)] {
            let api = crate::base::names::api_floating_ip_name(cluster);
            for (ns, svc) in [
                ("default", "apiserver"),
                ("apiserver", "x"),
                ("kube-system", "traefik"),
                (long.as_str(), long.as_str()),
                ("apiserver", long.as_str()),
            ] {
                assert_ne!(ccm_floating_ip_name(cluster, ns, svc), api, "{ns}/{svc}");
            }
        }
    }

    #[test]
    fn node_binaries_run_the_cronjob_and_webhook_from_a_hostpath() {
        let mut all = render(&settings()).unwrap();
        let untouched = all.clone();
        let b = NodeBinaries {
            host_dir: "/var/lib/oxide-controller/bin/0123456789abcdef".into(),
            label_value: "0123456789abcdef".into(),
        };
        run_from_node(&mut all, &b);
        let twice = {
            let mut again = all.clone();
            run_from_node(&mut again, &b);
            again
        };
        assert_eq!(twice, all, "idempotent");
        for (m, before) in all.iter().zip(&untouched) {
            let (pod, program) = match m.resource.kind.as_str() {
                "CronJob" => (
                    &m.object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                    "reconcile-once",
                ),
                "Deployment" => (&m.object["spec"]["template"]["spec"], "scale"),
                "Namespace" => {
                    let labels = &m.object["metadata"]["labels"];
                    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "privileged");
                    // The backup's namespace admits its hostPath already.
                    let was = if m.name == BACKUP_CRONJOB {
                        "privileged"
                    } else {
                        "restricted"
                    };
                    assert_eq!(
                        before.object["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
                        was
                    );
                    continue;
                }
                _ => {
                    assert_eq!(m, before, "{} is not touched", m.describe());
                    continue;
                }
            };
            let c = &pod["containers"][0];
            assert_eq!(c["image"], NODE_BINARIES_BASE_IMAGE);
            assert_eq!(
                c["command"][0],
                format!("/opt/oxide-controller/bin/{program}")
            );
            // Added after what the pod mounts already (the webhook's Secret keys).
            let before_pod = match m.resource.kind.as_str() {
                "CronJob" => &before.object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                _ => &before.object["spec"]["template"]["spec"],
            };
            let mut mounts = before_pod["containers"][0]["volumeMounts"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            mounts.push(serde_json::json!({"name": "oxide-controller-bin", "mountPath": NODE_BINARIES_MOUNT, "readOnly": true}));
            assert_eq!(c["volumeMounts"], serde_json::Value::Array(mounts));
            let mut volumes = before_pod["volumes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            volumes.push(serde_json::json!({"name": "oxide-controller-bin", "hostPath": {"path": b.host_dir, "type": "Directory"}}));
            assert_eq!(pod["volumes"], serde_json::Value::Array(volumes));
            assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux", "kept");
            assert_eq!(pod["nodeSelector"][NODE_BINARIES_LABEL], "0123456789abcdef");
        }
        // The CCM's objects are never given the controller's binaries.
        let mut ccm_objects = render_oxide_ccm(&ccm()).unwrap();
        let before = ccm_objects.clone();
        run_from_node(&mut ccm_objects, &b);
        assert_eq!(ccm_objects, before);
    }
}
