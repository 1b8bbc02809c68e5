//! Input validation: everything bootstrap can check before its first Oxide API call — the
//! spec (names, odd control plane, whole-GiB sizes, the cron schedule), credentials, the
//! user's SSH key, the image sources (a file that opens, a URL that answers 2xx with a size),
//! the kubeconfig target and the state directory. Every failure is one line naming the flag.

use std::path::{Path, PathBuf};

use crate::adapters::credentials;
use crate::adapters::image::{ImageRequest, ImageSource, UploadOptions};
use crate::adapters::kubeconfig::{self, WriteMode};
use crate::adapters::resume;
use crate::domain::spec::{ClusterSpec, SpecErrors};
use crate::render::manifests::{self, Manifest, Settings};
use crate::workflows::error::{self, message};

use super::{BootstrapError, BootstrapInput};

/// Everything `run` needs, checked.
pub(super) struct Validated {
    pub spec: ClusterSpec,
    pub credentials: credentials::OxideCredentials,
    pub user_ssh_public_key: Option<String>,
    /// One request per distinct image name, control plane first.
    pub images: Vec<ImageRequest>,
    pub kubeconfig: PathBuf,
    pub kubeconfig_mode: WriteMode,
    pub resume_path: PathBuf,
    pub manifests: Vec<Manifest>,
    pub upload: UploadOptions,
    /// The `--tailscale-*` flags, checked (None: no Tailscale).
    pub tailscale: Option<super::tailnet::TailscaleAccess>,
    /// `--controller-image dev:…`: the workspace to build (checked), else None.
    pub dev_image: Option<crate::adapters::dev_image::DevImage>,
    /// The VPC firewall rule that opens the Kubernetes API to `--api-allow`.
    pub api_rule: crate::domain::firewall::OwnedRule,
    /// The VPC firewall rules that admit SSH from `--ssh-allow` only.
    pub ssh_rules: [crate::domain::firewall::OwnedRule; 2],
}

/// The flag a spec field comes from, for messages.
fn flag_for(field: &str) -> String {
    let (pool_flag, rest) = if let Some(rest) = field.strip_prefix("control_plane.") {
        ("control-plane", rest)
    } else if let Some(rest) = field.strip_prefix("worker_pools.") {
        ("worker", rest.split_once('.').map_or("", |(_, r)| r))
    } else {
        ("", field)
    };
    match (pool_flag, rest) {
        ("", "cluster") => "--cluster".to_owned(),
        ("", "project") => "--project".to_owned(),
        ("", "schedule") => "--schedule".to_owned(),
        ("", "backup.schedule") => "--backup-schedule".to_owned(),
        ("", "k3s.version") => "--k3s-version".to_owned(),
        ("", "k3s.installer_url") => "--k3s-installer-url".to_owned(),
        ("", "k3s.installer_sha256") => "--k3s-installer-sha256".to_owned(),
        ("", "k3s.binary_sha256") => "--k3s-binary-sha256".to_owned(),
        ("", "nodes.ssh_user") => "--ssh-user".to_owned(),
        ("", "nodes.ssh_port") => "--ssh-port".to_owned(),
        ("", "nodes.ip_pool") => "--ip-pool".to_owned(),
        ("", "tailscale.tag") => "--tailscale-tag".to_owned(),
        ("", "tailscale.up_timeout_seconds") => "--tailscale-up-timeout".to_owned(),
        ("control-plane", "count") => "--control-planes".to_owned(),
        ("worker", "count") => "--workers".to_owned(),
        ("control-plane", "image") => "--image".to_owned(),
        ("worker", "image") => "--worker-image".to_owned(),
        ("control-plane" | "worker", "name") => "--cluster".to_owned(),
        (pool, field) if !pool.is_empty() && !field.contains('.') => {
            format!("--{pool}-{}", field.replace('_', "-"))
        }
        _ => field.to_owned(),
    }
}

/// A spec's problems as one line, each named by its flag.
pub(super) fn spec_message(errors: &SpecErrors) -> String {
    errors
        .0
        .iter()
        .map(|e| format!("{}: {}", flag_for(&e.field), e.message))
        .collect::<Vec<_>>()
        .join("; ")
}

fn build_spec(input: &BootstrapInput) -> ClusterSpec {
    let project = input
        .project
        .clone()
        .unwrap_or_else(|| input.cluster.clone());
    let mut spec = ClusterSpec::new(
        &input.cluster,
        &project,
        &input.image,
        input.control_planes,
        input.workers,
    );
    let cp = &mut spec.control_plane;
    cp.cpus = input.control_plane.cpus;
    cp.memory = input.control_plane.memory;
    cp.boot_disk = input.control_plane.boot_disk;
    cp.data_disk = input.control_plane.data_disk;
    cp.max = cp.max.max(input.control_planes);
    if input
        .dedicated_servers
        .unwrap_or_else(|| super::dedicated_by_default(input.workers))
    {
        cp.taints
            .push(crate::domain::spec::Taint::dedicated_server());
    }
    if let Some(w) = spec.worker_pools.first_mut() {
        w.cpus = input.worker.cpus;
        w.memory = input.worker.memory;
        w.boot_disk = input.worker.boot_disk;
        w.data_disk = input.worker.data_disk;
        w.image = input
            .worker_image
            .clone()
            .unwrap_or_else(|| input.image.clone());
        w.max = w.max.max(input.workers);
    }
    spec.k3s.version = input.k3s_version.clone();
    spec.k3s.install = input.k3s_install;
    spec.k3s.installer_url.clone_from(&input.k3s_installer_url);
    spec.k3s
        .installer_sha256
        .clone_from(&input.k3s_installer_sha256);
    if let Some(d) = &input.k3s_binary_sha256 {
        spec.k3s
            .binary_sha256
            .insert(input.k3s_version.clone(), d.clone());
    }
    spec.k3s.oxide_ccm = input.oxide_ccm;
    spec.nodes.ssh_user = input.ssh_user.clone();
    spec.nodes.ssh_port = input.ssh_port;
    spec.nodes.external_ip = input.external_ip;
    spec.nodes.ip_pool = input.ip_pool.clone();
    spec.tailscale = super::tailnet::spec_for(&input.tailscale);
    spec.schedule = input.schedule.trim().to_owned();
    spec.backup.schedule = input
        .backup_schedule
        .as_deref()
        .map(|s| s.trim().to_owned());
    spec
}

/// A directory we can create files in (probed by creating and removing one).
fn check_writable_dir(flag: &'static str, dir: &Path) -> Result<(), BootstrapError> {
    let probe = dir.join(format!(".oxide-controller-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| {
            BootstrapError::input(
                flag,
                error::context(format!("cannot write to {}", dir.display()), e),
            )
        })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The nearest existing ancestor of `dir` (where a `create_dir_all` would start).
fn existing_ancestor(dir: &Path) -> Option<&Path> {
    dir.ancestors()
        .find(|a| !a.as_os_str().is_empty() && a.exists())
}

async fn check_images<C: super::Connect>(
    input: &BootstrapInput,
    spec: &ClusterSpec,
    connect: &C,
) -> Result<Vec<ImageRequest>, BootstrapError> {
    let mut wanted: Vec<(String, Option<String>, Option<String>, &'static str)> = vec![(
        spec.control_plane.image.clone(),
        input.image_source.clone(),
        input.image_source_sha256.clone(),
        "--image-source",
    )];
    let worker_image = spec
        .worker_pools
        .first()
        .map(|w| w.image.clone())
        .unwrap_or_default();
    if worker_image == spec.control_plane.image {
        if let Some(src) = &input.worker_image_source
            && input.image_source.as_deref() != Some(src.as_str())
        {
            return Err(BootstrapError::input(
                "--worker-image-source",
                message(format!(
                    "the workers use the same image {worker_image:?} as the control plane; give its source once, with --image-source"
                )),
            ));
        }
    } else {
        wanted.push((
            worker_image,
            input.worker_image_source.clone(),
            input.worker_image_source_sha256.clone(),
            "--worker-image-source",
        ));
    }
    let http = connect
        .image_sources()
        .map_err(|e| BootstrapError::step(super::STEP_VALIDATE, e))?;
    let mut out = Vec::new();
    for (name, source, sha256, flag) in wanted {
        check_image_digest(source.as_deref(), sha256.as_deref(), flag)?;
        let source = match source {
            Some(text) => {
                let src = ImageSource::parse(&text).map_err(|e| BootstrapError::input(flag, e))?;
                src.probe(&http).await.map_err(|e| {
                    if e.is_config() {
                        BootstrapError::input(flag, e)
                    } else {
                        BootstrapError::step(super::STEP_VALIDATE, error::context(flag, e))
                    }
                })?;
                Some(src)
            }
            None => None,
        };
        let version = source
            .as_ref()
            .map(|s| match s {
                ImageSource::File(p) => p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                ImageSource::Url(u) => u
                    .path_segments()
                    .and_then(|mut s| s.next_back().map(str::to_owned))
                    .unwrap_or_default(),
            })
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "uploaded".to_owned());
        out.push(ImageRequest {
            name,
            source,
            sha256: sha256.map(|d| d.to_ascii_lowercase()),
            os: "linux".to_owned(),
            version: version.chars().take(60).collect(),
            cluster: Some(spec.cluster.clone()),
        });
    }
    Ok(out)
}

/// `--image-source-sha256` / `--worker-image-source-sha256`: 64 hex digits; and an http://
/// source needs one (anyone on the path could change the nodes' root file system).
fn check_image_digest(
    source: Option<&str>,
    sha256: Option<&str>,
    flag: &'static str,
) -> Result<(), BootstrapError> {
    let digest_flag = if flag == "--image-source" {
        "--image-source-sha256"
    } else {
        "--worker-image-source-sha256"
    };
    match (source, sha256) {
        (_, Some(d)) if d.len() != 64 || !d.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Err(BootstrapError::input(
                digest_flag,
                message("must be a sha256 digest: 64 hex digits"),
            ))
        }
        (Some(src), None) if src.trim().to_ascii_lowercase().starts_with("http://") => {
            Err(BootstrapError::input(
                flag,
                message(format!(
                    "{src} is http://, so the image can be changed on the way; give its sha256 with {digest_flag}, or use https://"
                )),
            ))
        }
        _ => Ok(()),
    }
}

/// Checks everything, in the order a person would fix it; the first problem is returned.
pub(super) async fn validate<C: super::Connect>(
    input: &BootstrapInput,
    connect: &C,
) -> Result<Validated, BootstrapError> {
    let spec = validate_spec(input)?;
    let dev_image = validate_controller_image(input).await?;
    let ccm_image = validate_ccm_image(input)?;
    // Before anything that reads files or talks to a server: the flags must make sense together.
    let tailscale = super::tailnet::validate_flags(&input.tailscale, input.home.as_deref())?;
    if !(1..=64).contains(&input.upload_parallelism) {
        return Err(BootstrapError::input(
            "--upload-parallelism",
            message(format!("{} is outside 1..=64", input.upload_parallelism)),
        ));
    }
    let credentials = validate_credentials(input, &spec, connect)?;
    let user_ssh_public_key = validate_user_ssh_public_key(input)?;
    let (kubeconfig_path, mode) = validate_kubeconfig(input, &spec)?;
    let api_sources = crate::domain::firewall::parse_sources(&input.api_allow)
        .map_err(|e| BootstrapError::input("--api-allow", message(e)))?;
    // Aimed at the cluster's servers in the project step, once they are known.
    let api_rule = crate::domain::firewall::api_rule(&spec.cluster, api_sources, &[]);
    let ssh_rules = validate_ssh_allow(input, &spec, &credentials, connect).await?;
    let resume_path = validate_state_dir(input, &spec)?;
    let manifests = render_manifests(input, &spec, ccm_image)?;

    // Last: the only checks that talk to other machines (the image source's server, the
    // Tailscale API).
    let images = check_images(input, &spec, connect).await?;
    if let Some(ts) = &tailscale {
        super::tailnet::probe(&ts.open(connect)?).await?;
    }

    Ok(Validated {
        spec,
        credentials,
        user_ssh_public_key,
        images,
        kubeconfig: kubeconfig_path,
        kubeconfig_mode: mode,
        resume_path,
        manifests,
        upload: UploadOptions {
            parallelism: input.upload_parallelism,
            ..UploadOptions::default()
        },
        tailscale,
        dev_image,
        api_rule,
        ssh_rules,
    })
}

/// `--ssh-allow`, or else the address this machine sends from toward the rack's API: the
/// SSH rules of the cluster.
async fn validate_ssh_allow<C: super::Connect>(
    input: &BootstrapInput,
    spec: &ClusterSpec,
    credentials: &credentials::OxideCredentials,
    connect: &C,
) -> Result<[crate::domain::firewall::OwnedRule; 2], BootstrapError> {
    let sources = match &input.ssh_allow {
        Some(given) => crate::domain::firewall::parse_sources(given)
            .map_err(|e| BootstrapError::input("--ssh-allow", message(e)))?,
        None => {
            let ip = connect
                .source_address(&credentials.host)
                .await
                .map_err(|e| {
                    BootstrapError::input(
                        "--ssh-allow",
                        message(format!(
                            "not given, and this machine's address toward {} is unknown ({e}); give the addresses SSH may come from",
                            credentials.host
                        )),
                    )
                })?;
            vec![crate::domain::firewall::Cidr {
                addr: ip,
                prefix: if ip.is_ipv4() { 32 } else { 128 },
            }]
        }
    };
    Ok(crate::domain::firewall::ssh_rules(&spec.cluster, sources))
}

/// The cluster spec the flags describe, checked.
fn validate_spec(input: &BootstrapInput) -> Result<ClusterSpec, BootstrapError> {
    let spec = build_spec(input);
    spec.validate().map_err(|mut e| {
        // The project defaults to the cluster name: one complaint about that name is enough.
        if input.project.is_none() && e.0.iter().any(|f| f.field == "cluster") {
            e.0.retain(|f| f.field != "project");
        }
        BootstrapError::inputs(message(spec_message(&e)))
    })?;
    Ok(spec)
}

/// `--controller-image` (an image reference, or a `dev:PATH` workspace that exists) and
/// `--dev-build-profile`. Returns the dev workspace, if one is named.
async fn validate_controller_image(
    input: &BootstrapInput,
) -> Result<Option<crate::adapters::dev_image::DevImage>, BootstrapError> {
    let dev_image = crate::adapters::dev_image::DevImage::parse(&input.controller_image)
        .map_err(BootstrapError::inputs)?;
    if dev_image.is_none()
        && let Err(e) = crate::domain::digests::check_image_reference(&input.controller_image)
    {
        return Err(BootstrapError::input("--controller-image", message(e)));
    }
    match (&dev_image, &input.dev_build_profile) {
        (None, Some(_)) => {
            return Err(BootstrapError::input(
                "--dev-build-profile",
                message("only a --controller-image dev:PATH build has a profile"),
            ));
        }
        (Some(_), Some(profile)) => {
            crate::adapters::dev_image::validate_profile(profile).map_err(BootstrapError::inputs)?
        }
        _ => {}
    }
    if let Some(dev) = &dev_image {
        dev.check_workspace()
            .await
            .map_err(BootstrapError::inputs)?;
    }
    Ok(dev_image)
}

/// `--oxide-ccm-image`, only with `--oxide-ccm`; the default image otherwise.
fn validate_ccm_image(input: &BootstrapInput) -> Result<String, BootstrapError> {
    match (&input.oxide_ccm_image, input.oxide_ccm) {
        (Some(_), false) => Err(BootstrapError::input(
            "--oxide-ccm-image",
            message("the CCM is only installed with --oxide-ccm; add it or drop --oxide-ccm-image"),
        )),
        (Some(i), true) => crate::domain::digests::check_image_reference(i)
            .map(|()| i.clone())
            .map_err(|e| BootstrapError::input("--oxide-ccm-image", message(e))),
        (None, _) => Ok(manifests::DEFAULT_OXIDE_CCM_IMAGE.to_owned()),
    }
}

/// The Oxide credentials, resolved, and a client built from them without I/O: catches a
/// malformed host or token now.
fn validate_credentials<C: super::Connect>(
    input: &BootstrapInput,
    spec: &ClusterSpec,
    connect: &C,
) -> Result<credentials::OxideCredentials, BootstrapError> {
    let credentials =
        credentials::resolve(&input.credential_sources).map_err(BootstrapError::inputs)?;
    connect
        .rack(&credentials.host, credentials.token.expose(), &spec.project)
        .map_err(BootstrapError::inputs)?;
    Ok(credentials)
}

/// `--user-ssh-public-key` (the key or `file:PATH`), parsed.
fn validate_user_ssh_public_key(input: &BootstrapInput) -> Result<Option<String>, BootstrapError> {
    match &input.user_ssh_public_key {
        Some(v) => {
            let key = super::value_or_file("--user-ssh-public-key", v, input.home.as_deref())?;
            crate::adapters::ssh::parse_public_key(&key)
                .map_err(|e| BootstrapError::input("--user-ssh-public-key", e))?;
            Ok(Some(key))
        }
        None => Ok(None),
    }
}

/// `--kubeconfig` and how to write it: a file bootstrap may write, in a writable directory.
fn validate_kubeconfig(
    input: &BootstrapInput,
    spec: &ClusterSpec,
) -> Result<(PathBuf, WriteMode), BootstrapError> {
    let kubeconfig_path = match &input.kubeconfig {
        Some(p) => p.clone(),
        None => input
            .home
            .as_ref()
            .map(|h| h.join(".kube").join(format!("{}.yaml", spec.cluster)))
            .ok_or_else(|| {
                BootstrapError::input(
                    "--kubeconfig",
                    message("there is no home directory for the default ~/.kube/<cluster>.yaml; pass --kubeconfig"),
                )
            })?,
    };
    let mode = match (input.kubeconfig_overwrite, input.kubeconfig_merge) {
        (true, true) => {
            return Err(BootstrapError::inputs(message(
                "--kubeconfig-overwrite and --kubeconfig-merge exclude each other",
            )));
        }
        (true, false) => WriteMode::Overwrite,
        (false, true) => WriteMode::Merge,
        (false, false) => WriteMode::Create,
    };
    if kubeconfig_path.is_dir() {
        return Err(BootstrapError::input(
            "--kubeconfig",
            message(format!("{} is a directory", kubeconfig_path.display())),
        ));
    }
    kubeconfig::check_target(&kubeconfig_path, &spec.cluster, mode)
        .map_err(|e| BootstrapError::input("--kubeconfig", e))?;
    let kube_dir = kubeconfig_path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if input.kubeconfig.is_some() && !kube_dir.exists() {
        return Err(BootstrapError::input(
            "--kubeconfig",
            message(format!("directory {} does not exist", kube_dir.display())),
        ));
    }
    if let Some(dir) = existing_ancestor(kube_dir) {
        check_writable_dir("--kubeconfig", dir)?;
    }
    Ok((kubeconfig_path, mode))
}

/// `--state-dir`, writable, and the resume file in it readable when it exists. Returns the
/// resume file's path.
fn validate_state_dir(
    input: &BootstrapInput,
    spec: &ClusterSpec,
) -> Result<PathBuf, BootstrapError> {
    let state_dir = match &input.state_dir {
        Some(d) => d.clone(),
        None => resume::default_state_dir(input.home.clone())
            .ok_or_else(|| {
                BootstrapError::input(
                    "--state-dir",
                    message("there is no home directory for the default ~/.config/oxide-controller; pass --state-dir"),
                )
            })?,
    };
    if state_dir.exists() && !state_dir.is_dir() {
        return Err(BootstrapError::input(
            "--state-dir",
            message(format!("{} is not a directory", state_dir.display())),
        ));
    }
    if let Some(dir) = existing_ancestor(&state_dir) {
        check_writable_dir("--state-dir", dir)?;
    }
    let resume_path = resume::resume_path(&state_dir, &spec.cluster);
    if resume_path.exists() {
        resume::load(&resume_path, &spec.cluster, &spec.project).map_err(BootstrapError::inputs)?;
    }
    Ok(resume_path)
}

/// The in-cluster pieces (and the Oxide CCM's with `--oxide-ccm`), rendered.
fn render_manifests(
    input: &BootstrapInput,
    spec: &ClusterSpec,
    ccm_image: String,
) -> Result<Vec<Manifest>, BootstrapError> {
    let mut manifests = manifests::render(&Settings {
        controller_image: input.controller_image.clone(),
        schedule: spec.schedule.clone(),
        backup_schedule: spec.backup.schedule.clone(),
    })
    .map_err(BootstrapError::inputs)?;
    if input.oxide_ccm {
        manifests.extend(
            manifests::render_oxide_ccm(&manifests::CcmSettings {
                image: ccm_image,
                cluster: spec.cluster.clone(),
            })
            .map_err(BootstrapError::inputs)?,
        );
    }
    Ok(manifests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_fields_are_reported_as_flags() {
        assert_eq!(flag_for("control_plane.count"), "--control-planes");
        assert_eq!(flag_for("worker_pools.workers.memory"), "--worker-memory");
        assert_eq!(
            flag_for("control_plane.boot_disk"),
            "--control-plane-boot-disk"
        );
        assert_eq!(flag_for("worker_pools.workers.image"), "--worker-image");
        assert_eq!(flag_for("cluster"), "--cluster");
        assert_eq!(flag_for("k3s.version"), "--k3s-version");
        assert_eq!(flag_for("k3s.binary_sha256"), "--k3s-binary-sha256");
        assert_eq!(flag_for("timeouts.join_seconds"), "timeouts.join_seconds");
    }
}
