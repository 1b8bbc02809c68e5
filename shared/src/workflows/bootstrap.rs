//! `bootstrap`: from nothing to a running, self-maintaining cluster, safe to kill and re-run.
//!
//! The flow (DESIGN.md "Bootstrap flow"), each step idempotent and logged with a stable
//! `step=<name>` field ([`STEPS`]):
//!
//! 1. `validate` — all input, before any API call ([`validate`]);
//! 2. `resume` — read the resume file, or generate the controller key pair, the k3s server and
//!    agent tokens, the webhook token and the first server's name and write them (0600)
//!    BEFORE any VM exists ([`crate::adapters::resume`]);
//! 3. `project`, with the VPC firewall rules ([`crate::domain::firewall`]): `<cluster>-k8s-api`
//!    admits `--api-allow` to tcp/6443, the SSH rules `--ssh-allow` to tcp/22, the member rules
//!    the cluster's internal ports to its members only; 4. `image` — find by name, else upload ([`crate::adapters::image`]);
//! 5. `floating-ip` `<cluster>-apiserver`, created or adopted;
//! 6. `first-control-plane` — the `cluster-init` server under the resume file's name, created
//!    only while the cluster has no control-plane VM at all (an existing one is adopted);
//! 7. `attach-floating-ip` (503 retried); 8. `wait-api` — `https://<fip>:6443/readyz`;
//! 9. `host-key` — fingerprints from the serial console; 10. `fetch-kubeconfig` over SSH with
//!    those pins; 11. `write-kubeconfig`; 12. `state` — Secret and ConfigMap;
//! 13. `manifests` — server-side apply of the in-cluster pieces;
//! 14. `reconcile` — the reconcile workflow in a loop until converged or `--wait` runs out;
//! 15. `summary`.
//!
//! Re-running adopts whatever exists and creates only what is missing. A killed run leaves at
//! most an import disk/snapshot (removed by the next run that uploads) or instances reconcile
//! owns anyway (`shared/tests/bootstrap_fakes.rs` kills it after each step and re-runs).
//!
//! The flow builds no adapter: every port comes from the [`Connect`] the binary hands in
//! ([`crate::workflows::live::LiveConnect`]).

pub mod backup;
mod connect;
mod dev;
mod progress;
pub mod recover;
pub mod renew_kubeconfig;
pub mod rotate_oxide_token;
pub mod rotate_ssh_key;
mod tailnet;
mod validate;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::adapters::credentials::CredentialSources;
use crate::adapters::image::{self, EnsuredImage};
use crate::adapters::kubeconfig::{self, WriteOutcome};
use crate::adapters::resume::{self, ResumeState};
use crate::adapters::ssh::{HostKeyPins, KeyError, RemoteShell, SshError};
use crate::base::names::{self, InstanceTag};
use crate::base::retry::Backoff;
use crate::base::size::ByteSize;
use crate::domain::model::{FloatingIp, Image, Instance, InstanceState};
use crate::domain::plan::Plan;
use crate::domain::spec::{ExternalIpMode, K3sInstall, Role, SCHEMA_VERSION};
use crate::ports::cluster::NAMESPACE;
use crate::ports::rack::{Rack, RackError};
use crate::ports::state::{self, StateError, StateStore};
use crate::render::cloud_init::MemberInput;
use crate::render::manifests;
use crate::render::members;
use crate::workflows::error::{self, message};
use crate::workflows::reconcile::{self, ReconcileOptions, RunOutcome};

pub use crate::workflows::error::WorkflowError as BootstrapError;
pub use connect::{ApiAnswer, ApplyManifests, Connect, ConnectError, InClusterPorts, Tailnet};
pub use tailnet::TailscaleFlags;

/// Step names, in order (the `step` field of every log line bootstrap writes).
pub const STEPS: [&str; 15] = [
    STEP_VALIDATE,
    "resume",
    "project",
    "image",
    "floating-ip",
    "first-control-plane",
    "attach-floating-ip",
    "wait-api",
    "host-key",
    "fetch-kubeconfig",
    "write-kubeconfig",
    "state",
    "manifests",
    "reconcile",
    "summary",
];
const STEP_VALIDATE: &str = "validate";

/// Where k3s writes its admin kubeconfig on a server.
pub const K3S_KUBECONFIG_PATH: &str = "/etc/rancher/k3s/k3s.yaml";

/// Sizes of one pool, from the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInput {
    pub cpus: u16,
    pub memory: ByteSize,
    pub boot_disk: ByteSize,
    pub data_disk: Option<ByteSize>,
}

/// Everything bootstrap is told, unchecked (the binary fills it from flags and environment).
#[derive(Debug, Clone)]
pub struct BootstrapInput {
    /// Flags, environment and config directory for the Oxide credentials.
    pub credential_sources: CredentialSources,
    pub cluster: String,
    /// Defaults to the cluster name.
    pub project: Option<String>,
    pub control_planes: u32,
    pub workers: u32,
    /// Servers tainted [`crate::domain::spec::Taint::dedicated_server`], so tenant pods stay
    /// off them: `Some` as the operator chose (`--dedicated-servers`, `--shared-servers`),
    /// `None` for the default, [`dedicated_by_default`].
    pub dedicated_servers: Option<bool>,
    pub control_plane: PoolInput,
    pub worker: PoolInput,
    pub image: String,
    pub image_source: Option<String>,
    /// sha256 the `image_source` bytes must have (hex); checked before the image is made.
    pub image_source_sha256: Option<String>,
    pub worker_image: Option<String>,
    pub worker_image_source: Option<String>,
    pub worker_image_source_sha256: Option<String>,
    pub external_ip: ExternalIpMode,
    pub ip_pool: Option<String>,
    /// The key itself or `file:PATH`.
    pub user_ssh_public_key: Option<String>,
    pub k3s_version: String,
    pub k3s_install: K3sInstall,
    /// `k3s.installer_url` (None: the installer the controller knows by digest).
    pub k3s_installer_url: Option<String>,
    /// `k3s.installer_sha256`.
    pub k3s_installer_sha256: Option<String>,
    /// `k3s.binary_sha256` of `k3s_version`: nodes download the k3s binary and check it.
    pub k3s_binary_sha256: Option<String>,
    /// Default `~/.kube/<cluster>.yaml`.
    pub kubeconfig: Option<PathBuf>,
    pub kubeconfig_overwrite: bool,
    pub kubeconfig_merge: bool,
    pub schedule: String,
    /// The spec's `backup.schedule` (None: the in-cluster backup is off).
    pub backup_schedule: Option<String>,
    /// An image reference, or `dev:<path>[:<os>/<arch>]` ([`crate::adapters::dev_image`]).
    pub controller_image: String,
    /// Cargo profile of a `dev:` build (only with one); default
    /// [`crate::adapters::dev_image::DEFAULT_PROFILE`].
    pub dev_build_profile: Option<String>,
    /// Oxide CCM mode: external cloud provider in k3s, the CCM installed.
    pub oxide_ccm: bool,
    /// Image of the Oxide CCM (only with `oxide_ccm`); default
    /// [`crate::render::manifests::DEFAULT_OXIDE_CCM_IMAGE`].
    pub oxide_ccm_image: Option<String>,
    pub ssh_user: String,
    pub ssh_port: u16,
    pub upload_parallelism: usize,
    /// Default `~/.config/oxide-controller`.
    pub state_dir: Option<PathBuf>,
    /// Deadline of the final reconcile loop (zero: one pass).
    pub wait: Duration,
    /// Deadline for the API server, the console fingerprints and SSH to come up.
    pub api_timeout: Duration,
    /// `--api-allow`: comma-separated CIDRs the VPC firewall admits to the Kubernetes API
    /// (tcp/6443); [`crate::domain::firewall::DEFAULT_API_ALLOW`] is anywhere.
    pub api_allow: String,
    /// `--ssh-allow`: comma-separated CIDRs the VPC firewall admits to SSH (tcp/22). `None`:
    /// the address this machine sends from toward the rack's API ([`Connect::source_address`]).
    pub ssh_allow: Option<String>,
    /// Lease holder identity of the in-process reconcile (stable per machine, so a re-run
    /// after a kill takes over its own Lease at once).
    pub holder: String,
    /// Triggered when the process is asked to stop: the reconcile step stops its pass at a
    /// resumable point and gives its Lease back (the other steps are abandoned by the caller;
    /// every step is resumable, a re-run adopts what exists).
    pub shutdown: crate::base::shutdown::Shutdown,
    pub home: Option<PathBuf>,
    /// Logs are JSON: no in-place progress drawing.
    pub json_logs: bool,
    /// `--tailscale-*`: nodes join a tailnet; without external IPs bootstrap reaches the
    /// first control plane over it.
    pub tailscale: TailscaleFlags,
}

/// Whether servers keep tenant pods off by default (audit security-2 N3): yes as soon as the
/// cluster has workers to run them. The servers hold what every credential reaches (the
/// reconcile Job, the webhook, the backup Job, k3s's own files and etcd snapshots), so a
/// tenant pod next to them is a container escape away from all of it; kubeadm and Cluster API
/// taint control planes by default for the same reason. A cluster without workers keeps its
/// servers schedulable, or nothing but system pods could run.
pub fn dedicated_by_default(workers: u32) -> bool {
    workers > 0
}

/// `step` failed because of `e`; a re-run continues (exit 1).
pub(super) fn failed(step: &'static str, e: impl Into<error::BoxError>) -> BootstrapError {
    BootstrapError::step(step, e)
}

/// The prefix length of the subnet nexus gives every new project's default VPC (omicron
/// `nexus/defaults/src/lib.rs` `DEFAULT_VPC_SUBNET_IPV4_BLOCK`, 172.30.0.0/22).
const DEFAULT_SUBNET_PREFIX: u8 = 22;

/// Rack errors: bad credentials are the person's to fix (exit 2); the rest is worth a re-run
/// (exit 1).
fn rack_failed(step: &'static str, e: RackError) -> BootstrapError {
    match e {
        RackError::Unauthorized { .. } => BootstrapError::needs_person(step, e),
        _ => failed(step, e),
    }
}

/// What bootstrap made and where things are.
#[derive(Debug, Clone)]
pub struct Summary {
    pub cluster: String,
    pub project: String,
    pub api_server: String,
    pub floating_ip: IpAddr,
    pub kubeconfig: PathBuf,
    pub kubeconfig_outcome: WriteOutcome,
    pub resume_file: PathBuf,
    /// The webhook's CA certificate (trust it to reach the webhook over HTTPS).
    pub webhook_ca: PathBuf,
    pub images: Vec<(String, &'static str)>,
    /// `(pool, ready, desired)`.
    pub pools: Vec<(String, u32, u32)>,
    pub converged: bool,
    pub schedule: String,
    pub elapsed: Duration,
}

impl Summary {
    /// The text printed on stdout at the end.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let k = self.kubeconfig.display();
        let c = &self.cluster;
        let mut s = String::new();
        let state = if self.converged {
            "is up"
        } else {
            "is coming up"
        };
        let _ = writeln!(
            s,
            "Cluster {c} {state} at {} (Oxide project {}), after {}s.",
            self.api_server,
            self.project,
            self.elapsed.as_secs()
        );
        for (pool, ready, desired) in &self.pools {
            let _ = writeln!(s, "  {pool:<14} {ready}/{desired} Ready");
        }
        for (image, how) in &self.images {
            let _ = writeln!(s, "  image          {image} ({how})");
        }
        let _ = writeln!(
            s,
            "  API address    floating IP {}-apiserver = {}",
            c, self.floating_ip
        );
        let written = match self.kubeconfig_outcome {
            WriteOutcome::Created => "written",
            WriteOutcome::Replaced => "replaced",
            WriteOutcome::Merged => "merged",
            WriteOutcome::Unchanged => "already there",
        };
        let _ = writeln!(s, "  kubeconfig     {k} ({written}; context {c})");
        let _ = writeln!(
            s,
            "  resume file    {} (keys and tokens; keep it private)",
            self.resume_file.display()
        );
        let _ = writeln!(
            s,
            "  webhook CA     {} (the webhook serves HTTPS under it)",
            self.webhook_ca.display()
        );
        let _ = writeln!(
            s,
            "  in-cluster     CronJob oxide-controller-jobs/oxide-controller reconciles on \"{}\"; webhook Service kube-system/oxide-controller-webhook",
            self.schedule
        );
        if !self.converged {
            let _ = writeln!(
                s,
                "Not every member is Ready yet; the CronJob carries on (or run reconcile-once below)."
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "Use it:");
        let _ = writeln!(s, "  kubectl --kubeconfig {k} --context {c} get nodes");
        let _ = writeln!(s, "Scale the workers (either way):");
        let _ = writeln!(s, "  scale set 5 --kubeconfig {k} --context {c}");
        let _ = writeln!(
            s,
            "  kubectl --kubeconfig {k} --context {c} -n kube-system port-forward svc/oxide-controller-webhook 8443:443 &"
        );
        let _ = writeln!(
            s,
            "  TOKEN=$(kubectl --kubeconfig {k} --context {c} -n kube-system get secret oxide-controller-webhook-auth -o jsonpath='{{.data.webhook-token}}' | base64 -d)"
        );
        let _ = writeln!(
            s,
            "  curl --cacert {} -X PUT -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' -d '{{\"count\":5}}' https://127.0.0.1:8443/nodes/workers",
            self.webhook_ca.display()
        );
        let _ = writeln!(s, "Reconcile now instead of waiting for the CronJob:");
        let _ = writeln!(s, "  reconcile-once --kubeconfig {k} --context {c}");
        s
    }
}

/// The in-cluster ports `connect` opens.
type Ports<C> =
    InClusterPorts<<C as Connect>::Store, <C as Connect>::Cluster, <C as Connect>::Manifests>;

/// Runs the whole flow on the ports `connect` opens: the steps of [`STEPS`], in order. See
/// the module docs.
pub async fn run<C: Connect>(
    input: BootstrapInput,
    connect: &C,
) -> Result<Summary, BootstrapError> {
    let started = Instant::now();
    let tty = progress::interactive(input.json_logs);
    let (v, dev_build) = step_validate(&input, connect).await?;
    let spec = &v.spec;
    let rack = connect_and_check_subnet(connect, &v).await?;
    let (mut resume, secrets, key) = step_resume(&rack, &v).await?;
    refuse_second_datastore(&rack, spec).await?;
    step_project(&rack, &v, &resume.first_control_plane).await?;
    let (cp_image, image_notes) = step_image(connect, &rack, &v, tty).await?;
    let (fip_name, fip) = step_floating_ip(&rack, spec).await?;
    info!(step = "first-control-plane", name = %resume.first_control_plane, "ensuring the first control-plane VM");
    ensure_first_server(&rack, &v, &resume, &secrets, &cp_image, fip.ip).await?;
    let api_member = step_attach_floating_ip(&rack, spec, &fip_name, &resume, fip.ip).await?;
    let api = ApiMember {
        name: api_member,
        deadline: Instant::now() + input.api_timeout,
    };
    let (access_ip, server) = step_wait_api(connect, &rack, &v, &api, fip.ip, tty).await?;
    let (pins, pinned_before) = step_host_key(&rack, &v, &mut resume, &api, tty).await?;
    let (first, k3s_yaml) =
        step_fetch_kubeconfig(connect, &v, access_ip, key, pins, pinned_before, &api, tty).await?;
    let outcome = step_write_kubeconfig(&v, &k3s_yaml, &server)?;
    let (ports, rack_secret) =
        step_state(connect, &v, &secrets, &mut resume, &k3s_yaml, &input.holder).await?;
    step_manifests(
        &v,
        dev_build.as_ref(),
        &first,
        &api.name,
        &ports.manifests,
        rack_secret,
    )
    .await?;
    let (plan, converged) = step_reconcile(connect, &input, &ports).await?;
    if let Some(built) = &dev_build {
        let key = resume
            .key_pair()
            .map_err(|e| BootstrapError::needs_person("resume", e))?;
        let servers = dev::Servers {
            connect,
            rack: &rack,
            ports: &ports,
        };
        dev::install_on_servers(&servers, spec, &key, built, input.api_timeout, tty).await?;
    }

    info!(step = "summary", converged, "bootstrap finished");
    Ok(Summary {
        cluster: spec.cluster.clone(),
        project: spec.project.clone(),
        api_server: server,
        floating_ip: fip.ip,
        kubeconfig: v.kubeconfig.clone(),
        kubeconfig_outcome: outcome,
        webhook_ca: resume::webhook_ca_path(&v.resume_path, &spec.cluster),
        resume_file: v.resume_path.clone(),
        images: image_notes,
        pools: plan
            .map(|p| {
                p.pools
                    .iter()
                    .map(|c| (c.pool.clone(), c.ready, c.desired))
                    .collect()
            })
            .unwrap_or_default(),
        converged,
        schedule: spec.schedule.clone(),
        elapsed: started.elapsed(),
    })
}

/// The control plane bootstrap talks to (the one the API floating IP is attached to), and
/// until when it waits for it.
struct ApiMember {
    name: String,
    deadline: Instant,
}

/// A VM reached over SSH, and its address.
struct Reached<S> {
    addr: SocketAddr,
    shell: S,
}

/// Step `validate`: all input, and a dev source built, before any API call (a dev source
/// that does not build creates nothing).
async fn step_validate<C: Connect>(
    input: &BootstrapInput,
    connect: &C,
) -> Result<
    (
        validate::Validated,
        Option<crate::adapters::dev_image::Built>,
    ),
    BootstrapError,
> {
    info!(step = STEP_VALIDATE, cluster = %input.cluster, "validating the input");
    let v = validate::validate(input, connect).await?;
    let dev_build = match &v.dev_image {
        Some(d) => {
            let profile = input
                .dev_build_profile
                .as_deref()
                .unwrap_or(crate::adapters::dev_image::DEFAULT_PROFILE);
            Some(dev::build(connect, d, profile).await?)
        }
        None => None,
    };
    Ok((v, dev_build))
}

/// Connects to the rack. Every member the pools can reach needs an address in the project's
/// subnet: checked before anything is made (a project that does not exist yet gets nexus's
/// default /22).
async fn connect_and_check_subnet<C: Connect>(
    connect: &C,
    v: &validate::Validated,
) -> Result<C::Rack, BootstrapError> {
    let spec = &v.spec;
    let token = v.credentials.token.expose();
    let rack = connect
        .rack(&v.credentials.host, token, &spec.project)
        .map_err(BootstrapError::inputs)?;
    let prefix = rack
        .default_subnet_prefix()
        .await
        .map_err(|e| rack_failed("project", e))?
        .unwrap_or(DEFAULT_SUBNET_PREFIX);
    spec.check_subnet(prefix)
        .map_err(|e| BootstrapError::inputs(error::context("invalid cluster spec", e)))?;
    Ok(rack)
}

/// Step `resume`: keys and tokens exist on disk before any VM does.
async fn step_resume<R: Rack>(
    rack: &R,
    v: &validate::Validated,
) -> Result<
    (
        ResumeState,
        crate::base::secrets::ClusterSecrets,
        crate::adapters::ssh::SshKeyPair,
    ),
    BootstrapError,
> {
    info!(step = "resume", path = %v.resume_path.display(), "reading the resume file");
    let resume = ensure_resume(rack, v).await?;
    let token = v.credentials.token.expose();
    let mut secrets = resume.secrets(&v.credentials.host, token, v.user_ssh_public_key.as_deref());
    // The auth key goes to the Secret (reconcile's new members join with it); the API key never.
    secrets.tailscale_auth_key = v.tailscale.as_ref().map(|t| t.auth_key.expose().to_owned());
    secrets.oxide_token_id = oxide_token_id(rack, v).await;
    let key = resume
        .key_pair()
        .map_err(|e| BootstrapError::needs_person("resume", e))?;
    Ok((resume, secrets, key))
}

/// Part of the resume step: which of the Oxide user's tokens the cluster is given (the
/// profile's `token_id`, else the user's only token), so its runs can watch its end; and a
/// warning for a token that never expires or ends within `certificates.renew_before_days`.
async fn oxide_token_id<R: Rack>(rack: &R, v: &validate::Validated) -> Option<String> {
    use crate::domain::oxide_token;
    let now = chrono::Utc::now();
    let configured = v.credentials.token_id.as_deref();
    match rack.my_access_tokens().await {
        Ok(listed) => {
            let record = oxide_token::identify(&listed, configured, now);
            if let Some(w) = oxide_token::bootstrap_warning(&record, &v.spec.certificates, now) {
                warn!(step = "resume", "{w}");
            }
            record.id.filter(|_| record.error.is_none())
        }
        Err(e) => {
            warn!(step = "resume", error = %e, "cannot list the Oxide user's tokens: the cluster cannot tell when its token ends");
            configured.map(str::to_owned)
        }
    }
}

/// Step `project`: the project, and the VPC firewall rules: the Kubernetes API from
/// `--api-allow`, SSH from `--ssh-allow` only, and the cluster's internal ports from its
/// members only (its instances so far and the first server about to be made).
async fn step_project<R: Rack>(
    rack: &R,
    v: &validate::Validated,
    first_server: &str,
) -> Result<(), BootstrapError> {
    let project = v.spec.project.as_str();
    info!(step = "project", project, "ensuring the project");
    rack.ensure_project()
        .await
        .map_err(|e| rack_failed("project", e))?;
    let listed = rack
        .list_instances(&names::cluster_prefix(&v.spec.cluster))
        .await
        .map_err(|e| rack_failed("project", e))?;
    let mut members: Vec<String> = listed
        .iter()
        .filter(|i| InstanceTag::parse(&i.description).is_some_and(|t| t.cluster == v.spec.cluster))
        .map(|i| i.name.clone())
        .collect();
    members.push(first_server.to_owned());
    // Part of the project step: the VPC drops the API port until this rule admits it, on the
    // cluster's servers (those there are, and the first one about to be made) only.
    let mut servers = crate::domain::firewall::api_servers(
        &v.spec.cluster,
        &v.spec.control_plane.name,
        listed
            .iter()
            .map(|i| (i.name.as_str(), i.description.as_str())),
    );
    servers.push(first_server.to_owned());
    let mut api_rule = v.api_rule.clone();
    api_rule.targets =
        crate::domain::firewall::api_rule(&v.spec.cluster, Vec::new(), &servers).targets;
    let mut rules = vec![api_rule];
    rules.extend(v.ssh_rules.iter().cloned());
    rules.extend(
        crate::domain::firewall::member_rules(&v.spec.cluster, &members)
            .into_iter()
            .flatten(),
    );
    let change = rack
        .ensure_firewall_rules(&rules)
        .await
        .map_err(|e| rack_failed("project", e))?;
    let shown = |r: &crate::domain::firewall::OwnedRule| match &r.hosts {
        crate::domain::firewall::RuleHosts::Cidrs(c) => c
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        _ => String::new(),
    };
    info!(
        step = "project",
        api_rule = %v.api_rule.name,
        api_sources = %shown(&v.api_rule),
        ssh_sources = %v.ssh_rules.first().map(shown).unwrap_or_default(),
        members = members.len(),
        ?change,
        "VPC firewall rules ensured"
    );
    Ok(())
}

/// Step `image`: every image found or uploaded. Returns the control plane's image and, per
/// image, how it was got (for the summary).
async fn step_image<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &validate::Validated,
    tty: bool,
) -> Result<(Image, Vec<(String, &'static str)>), BootstrapError> {
    info!(
        step = "image",
        images = v.images.len(),
        "ensuring the images"
    );
    let http = connect.image_sources().map_err(|e| failed("image", e))?;
    let mut images: BTreeMap<String, Image> = BTreeMap::new();
    let mut image_notes = Vec::new();
    for req in &v.images {
        let bar = progress::UploadBar::new(&req.name, tty);
        let got = image::ensure_image(rack, req, &http, &v.upload, &bar)
            .await
            .map_err(|e| {
                if e.is_config() {
                    BootstrapError::needs_person("image", e)
                } else {
                    failed("image", e)
                }
            })?;
        let how = match &got {
            EnsuredImage::Found(i) if i.silo_scoped => "found in the silo",
            EnsuredImage::Found(_) => "found in the project",
            EnsuredImage::Uploaded { stats, sizes, .. } => {
                info!(
                    step = "image",
                    image = %req.name,
                    source_bytes = stats.source_bytes,
                    written_bytes = stats.written_bytes,
                    skipped_bytes = stats.skipped_bytes,
                    disk_bytes = sizes.disk_size,
                    seconds = stats.elapsed.as_secs_f64(),
                    "image uploaded"
                );
                "uploaded"
            }
        };
        info!(step = "image", image = %req.name, how, "image ready");
        image_notes.push((req.name.clone(), how));
        images.insert(req.name.clone(), got.image().clone());
    }
    let cp_image = images
        .get(&v.spec.control_plane.image)
        .cloned()
        .ok_or_else(|| {
            failed(
                "image",
                message(format!("image {} vanished", v.spec.control_plane.image)),
            )
        })?;
    Ok((cp_image, image_notes))
}

/// Step `floating-ip`: `<cluster>-apiserver`, created or adopted. Returns its name and it.
async fn step_floating_ip<R: Rack>(
    rack: &R,
    spec: &crate::domain::spec::ClusterSpec,
) -> Result<(String, FloatingIp), BootstrapError> {
    let cluster = spec.cluster.as_str();
    let fip_name = names::api_floating_ip_name(cluster);
    info!(step = "floating-ip", name = %fip_name, "ensuring the API floating IP");
    let fip = ensure_floating_ip(rack, cluster, &fip_name, spec.nodes.ip_pool.as_deref()).await?;
    info!(step = "floating-ip", name = %fip_name, ip = %fip.ip, "API floating IP ready");
    Ok((fip_name, fip))
}

/// Step `attach-floating-ip`. Returns the control plane it is attached to.
async fn step_attach_floating_ip<R: Rack>(
    rack: &R,
    spec: &crate::domain::spec::ClusterSpec,
    fip_name: &str,
    resume: &ResumeState,
    ip: IpAddr,
) -> Result<String, BootstrapError> {
    info!(step = "attach-floating-ip", name = %fip_name, "attaching the API floating IP");
    let api_member = ensure_attached(
        rack,
        &spec.cluster,
        &spec.control_plane.name,
        fip_name,
        &resume.first_control_plane,
    )
    .await?;
    info!(step = "attach-floating-ip", instance = %api_member, ip = %ip, "API floating IP attached");
    Ok(api_member)
}

/// Step `wait-api`. Returns the address bootstrap reaches the control plane at and the API
/// server's URL.
async fn step_wait_api<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &validate::Validated,
    api: &ApiMember,
    fip_ip: IpAddr,
    tty: bool,
) -> Result<(IpAddr, String), BootstrapError> {
    let api_member = &api.name;
    // The address bootstrap reaches the first control plane at (see `tailnet` for the rule).
    let access_ip = match v.tailscale.as_ref() {
        Some(ts) if tailnet::reach_over_tailnet(&v.spec, Some(ts)) => {
            info!(step = "wait-api", instance = %api_member, "no external address: looking up the tailnet address");
            tailnet::tailnet_address(&ts.open(connect)?, rack, api_member, api.deadline, tty)
                .await?
        }
        _ => fip_ip,
    };
    let server = crate::domain::spec::server_url(access_ip);
    info!(step = "wait-api", url = %format!("{server}/readyz"), "waiting for the Kubernetes API");
    wait_for_api(
        connect,
        &server,
        api.deadline,
        tty,
        Some((rack, api_member.as_str())),
    )
    .await?;
    Ok((access_ip, server))
}

/// Step `host-key`: the fingerprints from the serial console. Returns the pins and whether
/// they were pinned before this run.
async fn step_host_key<R: Rack>(
    rack: &R,
    v: &validate::Validated,
    resume: &mut ResumeState,
    api: &ApiMember,
    tty: bool,
) -> Result<(HostKeyPins, bool), BootstrapError> {
    let api_member = &api.name;
    info!(step = "host-key", instance = %api_member, "reading the SSH host keys from the serial console");
    let (pins, pinned_before) =
        host_key_pins(rack, &v.resume_path, resume, api_member, api.deadline, tty).await?;
    info!(step = "host-key", instance = %api_member, fingerprints = %pins.fingerprints().collect::<Vec<_>>().join(","), pinned_before, "host keys pinned");
    Ok((pins, pinned_before))
}

/// Step `fetch-kubeconfig`: k3s.yaml over SSH with the pins. Returns the SSH target (the
/// manifests step uses it again) and the file.
#[allow(clippy::too_many_arguments)]
async fn step_fetch_kubeconfig<C: Connect>(
    connect: &C,
    v: &validate::Validated,
    access_ip: IpAddr,
    key: crate::adapters::ssh::SshKeyPair,
    pins: HostKeyPins,
    pinned_before: bool,
    api: &ApiMember,
    tty: bool,
) -> Result<(Reached<C::Shell>, String), BootstrapError> {
    let spec = &v.spec;
    info!(step = "fetch-kubeconfig", user = %spec.nodes.ssh_user, port = spec.nodes.ssh_port, "reading k3s.yaml over SSH");
    let addr = SocketAddr::new(access_ip, spec.nodes.ssh_port);
    let shell = connect.shell(addr, &spec.nodes.ssh_user, key, pins);
    let k3s_yaml = fetch_kubeconfig(&shell, addr, api.deadline, tty)
        .await
        .map_err(|e| mismatch_hint(e, &api.name, pinned_before, &v.resume_path))?;
    Ok((Reached { addr, shell }, k3s_yaml))
}

/// Step `write-kubeconfig`.
fn step_write_kubeconfig(
    v: &validate::Validated,
    k3s_yaml: &str,
    server: &str,
) -> Result<WriteOutcome, BootstrapError> {
    let cluster = v.spec.cluster.as_str();
    info!(step = "write-kubeconfig", path = %v.kubeconfig.display(), "writing the kubeconfig");
    let ours = kubeconfig::rewrite_k3s(k3s_yaml, cluster, server)
        .map_err(|e| failed("write-kubeconfig", e))?;
    let outcome = kubeconfig::write(&v.kubeconfig, &ours, cluster, server, v.kubeconfig_mode)
        .map_err(|e| match e {
            kubeconfig::KubeconfigError::Exists { .. }
            | kubeconfig::KubeconfigError::OtherServer { .. } => {
                BootstrapError::needs_person("write-kubeconfig", e)
            }
            other => failed("write-kubeconfig", other),
        })?;
    info!(step = "write-kubeconfig", path = %v.kubeconfig.display(), ?outcome, "kubeconfig ready");
    Ok(outcome)
}

/// Step `state`: the Secret and ConfigMap, and the host-key pins both ways. Returns the
/// in-cluster ports the later steps use, and the backup's rack Secret
/// ([`manifests::backup_rack_secret`]) made from the state Secret's values in force.
async fn step_state<C: Connect>(
    connect: &C,
    v: &validate::Validated,
    secrets: &crate::base::secrets::ClusterSecrets,
    resume: &mut ResumeState,
    k3s_yaml: &str,
    holder: &str,
) -> Result<(Ports<C>, manifests::Manifest), BootstrapError> {
    let spec = &v.spec;
    info!(
        step = "state",
        namespace = NAMESPACE,
        "writing the Secret and ConfigMap"
    );
    let ports = connect
        .in_cluster(&v.kubeconfig, &spec.cluster, holder)
        .await
        .map_err(|e| failed("state", e))?;
    let store = &ports.store;
    let mut config = BTreeMap::from([
        (state::keys::SPEC.to_owned(), spec.to_yaml()),
        (
            state::keys::SCHEMA_VERSION.to_owned(),
            SCHEMA_VERSION.to_owned(),
        ),
    ]);
    // Joiners pin the cluster CA with it (`K10<hash>::` tokens); k3s.yaml came over the
    // pinned SSH connection, so its CA is the cluster's.
    let ca_hash = kubeconfig::k3s_ca_hash(k3s_yaml).map_err(|e| failed("state", e))?;
    config.insert(state::keys::K3S_CA_HASH.to_owned(), ca_hash);
    // What the first server was started with; every later server must match it.
    config.insert(
        state::keys::K3S_SERVER_SETTINGS.to_owned(),
        serde_json::to_string(&spec.server_settings()).map_err(|e| failed("state", e))?,
    );
    // The in-cluster backup tags its backups with it and reads no Secret (audit security-2 N1).
    config.insert(
        state::keys::K3S_TOKEN_FINGERPRINT.to_owned(),
        crate::domain::backup::token_fingerprint(&secrets.k3s_token),
    );
    // The Secret keeps its token (ensure_state fills in missing keys only): the laptop's
    // token's id is its id only when the two tokens are the same.
    let mut secrets = secrets.clone();
    if secrets.oxide_token_id.is_some()
        && let Ok(stored) = store.read_secrets().await
        && stored.oxide_token != secrets.oxide_token
    {
        secrets.oxide_token_id = None;
    }
    let secrets = &secrets;
    crate::base::retry::retry(
        Backoff::default(),
        |e: &StateError| matches!(e, StateError::Api { .. } | StateError::Conflict { .. }),
        || store.ensure_state(secrets, config.clone()),
    )
    .await
    .map_err(|e| failed("state", e))?;
    let stored = check_stored_tokens(store, secrets).await;
    ensure_webhook_tokens(store, resume).await?;
    ensure_webhook_tls(store, resume).await?;
    merge_host_key_pins(v, store, resume).await?;
    let rack_secret =
        manifests::backup_rack_secret(stored.as_ref().unwrap_or(secrets), spec.backup.retention());
    Ok((ports, rack_secret))
}

/// Part of the state step: the webhook's tokens, in Secret `oxide-controller-webhook-auth`
/// (audit H1: no account reads them and the webhook's pod mounts no other credential). Made
/// when missing, from the state Secret's keys where an older controller kept them (the values
/// clients hold) or else the resume file's, and those keys removed; never replaced, so a token
/// rotated by hand stays.
async fn ensure_webhook_tokens<S: StateStore>(
    store: &S,
    resume: &ResumeState,
) -> Result<(), BootstrapError> {
    let ours = resume.webhook_tokens();
    let in_force = crate::base::retry::retry(
        Backoff::default(),
        |e: &StateError| matches!(e, StateError::Api { .. } | StateError::Conflict { .. }),
        || store.ensure_webhook_tokens(&ours),
    )
    .await
    .map_err(|e| failed("state", e))?;
    if in_force.token != ours.token {
        info!(
            step = "state",
            "Secret oxide-controller-webhook-auth holds another webhook token than the resume file (rotated, or moved from Secret oxide-controller); it is the one in force"
        );
    }
    Ok(())
}

/// Part of the state step: the webhook's Secrets (its serving pair, and its CA with the key
/// the reconcile re-issues the pair with), made when missing; never replaced, so a pair the
/// reconcile renewed stays.
async fn ensure_webhook_tls<S: StateStore>(
    store: &S,
    resume: &ResumeState,
) -> Result<(), BootstrapError> {
    let Some((tls, ca)) = resume.webhook_tls() else {
        return Ok(());
    };
    crate::base::retry::retry(
        Backoff::default(),
        |e: &StateError| matches!(e, StateError::Api { .. } | StateError::Conflict { .. }),
        || store.ensure_webhook_tls(&tls, &ca),
    )
    .await
    .map_err(|e| failed("state", e))
}

/// Part of the state step: the pins go into the Secret too (never replacing stored ones),
/// and pins stored there by a run on another machine come back into the resume file.
async fn merge_host_key_pins<S: StateStore>(
    v: &validate::Validated,
    store: &S,
    resume: &mut ResumeState,
) -> Result<(), BootstrapError> {
    let pins = crate::base::retry::retry(
        Backoff::default(),
        |e: &StateError| matches!(e, StateError::Api { .. } | StateError::Conflict { .. }),
        || store.merge_host_key_pins(&resume.host_key_pins),
    )
    .await
    .map_err(|e| failed("state", e))?;
    if pins.keys().any(|k| !resume.host_key_pins.contains_key(k)) {
        for (instance, fps) in pins {
            resume.host_key_pins.entry(instance).or_insert(fps);
        }
        resume::save(&v.resume_path, resume).map_err(|e| failed("state", e))?;
    }
    Ok(())
}

/// Step `manifests`: server-side apply of the in-cluster pieces (with a dev build, its
/// binaries are on a labelled Node before anything is told to run them).
async fn step_manifests<S: RemoteShell, M: ApplyManifests>(
    v: &validate::Validated,
    dev_build: Option<&crate::adapters::dev_image::Built>,
    first: &Reached<S>,
    api_member: &str,
    applier: &M,
    rack_secret: manifests::Manifest,
) -> Result<(), BootstrapError> {
    info!(
        step = "manifests",
        objects = v.manifests.len(),
        "applying the in-cluster pieces"
    );
    let mut to_apply = v.manifests.clone();
    // After its namespace (the embedded files come first); the backup pod mounts it.
    to_apply.push(rack_secret);
    if let Some(built) = dev_build {
        // The binaries are on a labelled Node before anything is told to run them.
        dev::install_on(
            "manifests",
            &first.shell,
            first.addr,
            api_member,
            built,
            applier,
        )
        .await?;
        manifests::run_from_node(&mut to_apply, &dev::node_binaries(built));
    }
    let applied = applier
        .apply_all(&to_apply, Backoff::default())
        .await
        .map_err(|e| failed("manifests", e))?;
    // What an earlier release installed in their place goes only now, so a run cut short
    // before this point leaves the old pieces working.
    let retired = applier
        .delete_retired(&manifests::retired(), Backoff::default())
        .await
        .map_err(|e| failed("manifests", e))?;
    info!(
        step = "manifests",
        objects = applied,
        retired,
        "in-cluster pieces applied"
    );
    Ok(())
}

/// Step `reconcile`: the reconcile workflow in a loop until converged or `--wait` runs out.
async fn step_reconcile<C: Connect>(
    connect: &C,
    input: &BootstrapInput,
    ports: &Ports<C>,
) -> Result<(Option<Plan>, bool), BootstrapError> {
    info!(
        step = "reconcile",
        wait_s = input.wait.as_secs(),
        "running the first reconcile"
    );
    reconcile_loop(connect, ports, &input.holder, input.wait, &input.shutdown).await
}

/// Reads the resume file, or creates it. Without one, a project that already holds VMs of
/// this cluster is refused: fresh keys and tokens could never reach those VMs.
async fn ensure_resume<R: Rack>(
    rack: &R,
    v: &validate::Validated,
) -> Result<ResumeState, BootstrapError> {
    let spec = &v.spec;
    let config = |e: resume::ResumeError| BootstrapError::needs_person("resume", e);
    if let Some(mut r) =
        resume::load(&v.resume_path, &spec.cluster, &spec.project).map_err(config)?
    {
        info!(step = "resume", first = %r.first_control_plane, "resuming with the saved keys and tokens");
        // A file from before the webhook had a certificate gains one (the Secret gets it too:
        // ensure_state fills in missing keys).
        if r.ensure_webhook_tls().map_err(config)? {
            resume::save(&v.resume_path, &r).map_err(config)?;
        }
        write_webhook_ca(&v.resume_path, &r)?;
        return Ok(r);
    }
    let existing = match rack
        .list_instances(&names::cluster_prefix(&spec.cluster))
        .await
    {
        Ok(list) => list,
        // No project yet: certainly no VMs.
        Err(RackError::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(rack_failed("resume", e)),
    };
    let ours = existing
        .iter()
        .filter(|i| InstanceTag::parse(&i.description).is_some_and(|t| t.cluster == spec.cluster))
        .count();
    if ours > 0 {
        return Err(BootstrapError::needs_person(
            "resume",
            message(format!(
                "project {} already has {ours} VM(s) of cluster {} but there is no resume file {}: copy it from the machine that bootstrapped the cluster (or point --state-dir at it)",
                spec.project,
                spec.cluster,
                v.resume_path.display()
            )),
        ));
    }
    let mut r = ResumeState::generate(
        &spec.cluster,
        &spec.project,
        &v.credentials.host,
        &spec.control_plane.name,
    )
    .map_err(config)?;
    // `bootstrap delete` reads the spec here when the cluster's API is gone.
    r.spec = Some(spec.to_yaml());
    resume::save(&v.resume_path, &r).map_err(config)?;
    info!(step = "resume", first = %r.first_control_plane, path = %v.resume_path.display(), "generated keys and tokens and saved them");
    write_webhook_ca(&v.resume_path, &r)?;
    Ok(r)
}

/// Writes the webhook's CA beside the resume file, for `curl --cacert` and the like: mode
/// 0644, as it is a public certificate (no key), through the same atomic writer as the
/// resume file, so a swapped file or a symlink in the state directory is not followed.
fn write_webhook_ca(resume_path: &Path, r: &ResumeState) -> Result<(), BootstrapError> {
    let Some(ca) = &r.webhook_tls_ca else {
        return Ok(());
    };
    let path = resume::webhook_ca_path(resume_path, &r.cluster);
    resume::write_state_file(&path, ca.as_bytes(), 0o644).map_err(|e| {
        BootstrapError::needs_person(
            "resume",
            message(format!(
                "cannot write the webhook CA {}: {e}; pass a writable --state-dir",
                path.display()
            )),
        )
    })
}

async fn ensure_floating_ip<R: Rack>(
    rack: &R,
    cluster: &str,
    name: &str,
    pool: Option<&str>,
) -> Result<FloatingIp, BootstrapError> {
    let step = "floating-ip";
    let description = crate::base::names::api_floating_ip_description(cluster);
    if let Some(f) = rack
        .get_floating_ip(name)
        .await
        .map_err(|e| rack_failed(step, e))?
    {
        // Ours (an earlier run, or reconcile's repair before it wrote our text), or someone
        // else's address that happens to have the name: never adopt that one, since
        // `bootstrap delete` would later leave it (or worse, take it).
        if f.description == description
            || f.description == crate::base::names::LEGACY_RECONCILE_API_FIP_DESCRIPTION
        {
            return Ok(f);
        }
        return Err(BootstrapError::needs_person(
            step,
            message(format!(
                "floating IP {name} already exists in the project and is not this cluster's API address (its description is {:?}); delete or rename it, or choose another cluster name",
                f.description
            )),
        ));
    }
    match rack.create_floating_ip(name, &description, pool).await {
        Ok(f) => Ok(f),
        // A lost answer to our own earlier try.
        Err(RackError::AlreadyExists { .. }) => rack
            .get_floating_ip(name)
            .await
            .map_err(|e| rack_failed(step, e))?
            .ok_or_else(|| {
                failed(
                    step,
                    message(format!("floating IP {name} exists but cannot be read")),
                )
            }),
        Err(e) => Err(rack_failed(step, e)),
    }
}

/// Refuses, before anything is made, a run that would create a new `cluster-init` server (a
/// new, empty datastore: no control-plane VM of the cluster exists) while the project still
/// holds members of the cluster: workers, or disks of its servers. Those belong to a cluster
/// whose servers were lost; a new first server would start a second cluster under the same
/// name beside them (audit day2 D4). Bringing it back is `bootstrap recover`'s job.
async fn refuse_second_datastore<R: Rack>(
    rack: &R,
    spec: &crate::domain::spec::ClusterSpec,
) -> Result<(), BootstrapError> {
    let step = "first-control-plane";
    let instances = match rack
        .list_instances(&names::cluster_prefix(&spec.cluster))
        .await
    {
        Ok(list) => list,
        // No project yet: nothing of the cluster either.
        Err(RackError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(rack_failed(step, e)),
    };
    let servers = names::instance_prefix(&spec.cluster, &spec.control_plane.name);
    if instances.iter().any(|i| i.name.starts_with(&servers)) {
        return Ok(());
    }
    let disks = rack.list_disks().await.map_err(|e| rack_failed(step, e))?;
    let ours = |description: &str| {
        InstanceTag::parse(description).is_some_and(|t| t.cluster == spec.cluster)
    };
    let left: Vec<String> = instances
        .iter()
        .filter(|i| ours(&i.description))
        .map(|i| format!("instance {}", i.name))
        .chain(
            disks
                .iter()
                .filter(|d| ours(&d.description))
                .map(|d| format!("disk {}", d.name)),
        )
        .collect();
    if left.is_empty() {
        return Ok(());
    }
    let shown = left.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    let more = left.len().saturating_sub(5);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Err(BootstrapError::needs_person(
        step,
        message(format!(
            "project {} still holds members of cluster {} ({shown}{more}) but no control-plane server: a new first server would start a new, empty datastore beside them. To bring the cluster back, run `bootstrap recover --cluster {}`; to start over, `bootstrap delete --cluster {}` first. Nothing was changed",
            spec.project, spec.cluster, spec.cluster, spec.cluster
        )),
    ))
}

/// Creates the `cluster-init` server unless the cluster has any control-plane VM already
/// (then the cluster exists: a second `cluster-init` would start a second cluster).
async fn ensure_first_server<R: Rack>(
    rack: &R,
    v: &validate::Validated,
    resume: &ResumeState,
    secrets: &crate::base::secrets::ClusterSecrets,
    image: &Image,
    api_address: IpAddr,
) -> Result<(), BootstrapError> {
    let step = "first-control-plane";
    let spec = &v.spec;
    let prefix = names::instance_prefix(&spec.cluster, &spec.control_plane.name);
    let servers = rack
        .list_instances(&prefix)
        .await
        .map_err(|e| rack_failed(step, e))?;
    let first = &resume.first_control_plane;
    if let Some(existing) = servers.iter().find(|i| &i.name == first) {
        info!(step, name = %first, state = ?existing.state, "adopting the first control-plane VM");
        if existing.state == InstanceState::Stopped {
            rack.start_instance(first)
                .await
                .map_err(|e| rack_failed(step, e))?;
        }
        return Ok(());
    }
    if !servers.is_empty() {
        info!(
            step,
            others = servers.len(),
            "the cluster was initialised already; not creating another cluster-init server"
        );
        return Ok(());
    }
    let new = members::new_instance(&MemberInput {
        spec,
        secrets,
        role: Role::ControlPlane,
        pool: &spec.control_plane,
        name: first,
        image_id: image.id,
        api_address,
        // Unused: the cluster-init server joins nobody.
        join_address: api_address,
        cluster_init: true,
        ca_hash: None,
        restore: None,
        drill: false,
    })
    .map_err(|m| failed(step, message(m)))?;
    // The servers' anti-affinity group (a default one unless the spec names another) must
    // exist before an instance can join it.
    if let Some(group) = &new.anti_affinity_group {
        rack.ensure_anti_affinity_group(group)
            .await
            .map_err(|e| rack_failed(step, e))?;
    }
    match rack.create_instance(&new).await {
        // 201 with a `stopped` instance: the rack's automatic start failed (no sled has room,
        // or the silo quota is spent) and only an explicit start says which. Fail now with
        // that answer instead of waiting for an API that will never come up.
        Ok(i) if i.state == InstanceState::Stopped => {
            rack.start_instance(first).await.map_err(|e| {
                failed(
                    step,
                    error::context(format!("the rack created {first} but cannot start it"), e),
                )
            })?;
            info!(step, name = %i.name, id = %i.id, "created the first control-plane VM (started on the second try)");
        }
        Ok(i) => info!(step, name = %i.name, id = %i.id, "created the first control-plane VM"),
        Err(RackError::AlreadyExists { .. }) => {
            info!(step, name = %first, "the first control-plane VM exists (an earlier try); adopting it")
        }
        Err(e) => return Err(rack_failed(step, e)),
    }
    Ok(())
}

/// Makes sure the API floating IP sits on a control-plane VM of the cluster and returns that
/// VM's name: where it is if it is on one, else on the first server (or the oldest running
/// control-plane VM when the first is gone).
async fn ensure_attached<R: Rack>(
    rack: &R,
    cluster: &str,
    cp_pool: &str,
    fip_name: &str,
    first: &str,
) -> Result<String, BootstrapError> {
    let step = "attach-floating-ip";
    let fip = rack
        .get_floating_ip(fip_name)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| failed(step, message(format!("floating IP {fip_name} vanished"))))?;
    let mut servers: Vec<Instance> = rack
        .list_instances(&names::instance_prefix(cluster, cp_pool))
        .await
        .map_err(|e| rack_failed(step, e))?;
    if let Some(id) = fip.instance_id {
        if let Some(holder) = servers.iter().find(|i| i.id == id) {
            return Ok(holder.name.clone());
        }
        // On something that is not one of our servers: the API address belongs on one.
        warn!(step, instance = %id, "the API floating IP is attached to a VM that is not a control-plane member; moving it");
        rack.detach_floating_ip(fip_name)
            .await
            .map_err(|e| rack_failed(step, e))?;
    }
    servers.sort_by_key(|i| i.time_created);
    let target = servers
        .iter()
        .find(|i| i.name == first)
        .or_else(|| servers.iter().find(|i| i.state == InstanceState::Running))
        .ok_or_else(|| {
            failed(
                step,
                message("no control-plane VM to attach the API floating IP to"),
            )
        })?
        .name
        .clone();
    // The instance is `starting` right after create: the rack answers 503 until it runs.
    let backoff = Backoff {
        first: Duration::from_millis(200),
        max: Duration::from_secs(3),
        attempts: 120,
    };
    crate::base::retry::retry(backoff, RackError::is_retryable, || {
        rack.attach_floating_ip(fip_name, &target)
    })
    .await
    .map_err(|e| rack_failed(step, e))?;
    Ok(target)
}

/// Polls `<server>/readyz` until any HTTP answer below 500 (200, or 401/403 without
/// credentials: the API is serving). The certificate is not checked here — there is nothing
/// to check it against before the kubeconfig is fetched, and only the answer's existence is
/// used; the kubeconfig's CA pins everything afterwards.
///
/// With `console`, the first server's serial console is read every few seconds too: when its
/// node setup printed the failure marker, k3s will never start, so this fails at once with
/// the marker's step and reason instead of waiting out the deadline.
async fn wait_for_api<C: Connect>(
    connect: &C,
    server: &str,
    deadline: Instant,
    tty: bool,
    console: Option<(&C::Rack, &str)>,
) -> Result<(), BootstrapError> {
    let step = "wait-api";
    let url = format!("{server}/readyz");
    let mut spinner = progress::Spinner::new(step, format!("waiting for {url}"), tty);
    let mut polls: u64 = 0;
    loop {
        let answer = match connect.probe_api(&url).await {
            Ok(a) => a,
            Err(e) => {
                spinner.done();
                return Err(failed(
                    step,
                    error::context("cannot build the probe client", message(e)),
                ));
            }
        };
        let detail = match answer {
            ApiAnswer::Status(status) if status < 500 => {
                spinner.done();
                info!(step, status, "the Kubernetes API answers");
                return Ok(());
            }
            ApiAnswer::Status(status) => format!("HTTP {status}"),
            ApiAnswer::TimedOut => "timed out".to_owned(),
            ApiAnswer::NotListening => "not listening yet".to_owned(),
            ApiAnswer::NoAnswer => "no answer".to_owned(),
        };
        spinner.tick(&detail);
        polls += 1;
        if let Some((rack, instance)) = console
            && polls % 16 == 1
            && let Err(e) = setup_not_failed(rack, instance, step).await
        {
            spinner.done();
            return Err(e);
        }
        if Instant::now() >= deadline {
            spinner.done();
            // A dropped packet looks like this; the usual cause is an address outside the rule.
            let hint = if detail == "timed out" {
                "; if this machine's address is not in --api-allow, the VPC firewall drops it"
            } else {
                ""
            };
            return Err(failed(
                step,
                message(format!(
                    "{url} did not answer in time (last: {detail}{hint}); re-run bootstrap to keep waiting"
                )),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Fails `step` when `instance`'s console shows the node setup failure marker: k3s will never
/// start there, so waiting for it is pointless. A console that cannot be read says nothing
/// here (the caller's deadline still applies).
async fn setup_not_failed<R: Rack>(
    rack: &R,
    instance: &str,
    step: &'static str,
) -> Result<(), BootstrapError> {
    let console = match rack.serial_console(instance).await {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::debug!(instance, error = %e, "serial console not readable");
            return Ok(());
        }
    };
    match crate::render::cloud_init::setup_failure(&String::from_utf8_lossy(&console)) {
        None => Ok(()),
        Some(f) => Err(failed(
            step,
            message(format!(
                "{instance}'s serial console says: {f}; k3s will not start there. Fix the cause (the installer URL or mirror, the data disk, the Tailscale key), delete instance {instance}, and re-run bootstrap"
            )),
        )),
    }
}

/// The host key pins of `instance`: those saved in the resume file when its console was
/// first read (`true`), else read from the console now and saved before any connection uses
/// them (`false`). Saved pins are never replaced by what a console shows later: a VM whose
/// key changed is refused (see [`mismatch_hint`]).
async fn host_key_pins<R: Rack>(
    rack: &R,
    resume_path: &std::path::Path,
    resume: &mut ResumeState,
    instance: &str,
    deadline: Instant,
    tty: bool,
) -> Result<(HostKeyPins, bool), BootstrapError> {
    if let Some(saved) = resume.host_key_pins.get(instance) {
        let pins = HostKeyPins::new(saved).map_err(|e| {
            BootstrapError::needs_person(
                "host-key",
                error::context(
                    format!(
                        "the resume file {} holds a malformed pin for {instance}",
                        resume_path.display()
                    ),
                    e,
                ),
            )
        })?;
        return Ok((pins, true));
    }
    let pins = read_pins(rack, instance, deadline, tty).await?;
    resume.host_key_pins.insert(
        instance.to_owned(),
        pins.fingerprints().map(str::to_owned).collect(),
    );
    resume::save(resume_path, resume).map_err(|e| failed("host-key", e))?;
    Ok((pins, false))
}

/// A host key mismatch, with what to check: pins from an earlier run mean the server's key
/// changed since it was first read (or someone answers in its place).
fn mismatch_hint(
    e: BootstrapError,
    instance: &str,
    pinned_before: bool,
    resume_path: &std::path::Path,
) -> BootstrapError {
    match e {
        BootstrapError::Step { step, source }
            if pinned_before
                && source
                    .downcast_ref::<SshError>()
                    .is_some_and(|s| matches!(s, SshError::HostKeyMismatch { .. })) =>
        {
            let hint = format!(
                "the pins of {instance} were saved in {} when its console was first read; \
                 check the fingerprints on its serial console (`oxide instance \
                 serial-console`), and only if {instance} was really recreated with new keys, \
                 delete its entry under host-key-pins in that file and re-run",
                resume_path.display()
            );
            BootstrapError::step(step, error::context(hint, source))
        }
        other => other,
    }
}

/// The host key pins from the serial console, waiting for cloud-init to print them.
async fn read_pins<R: Rack>(
    rack: &R,
    instance: &str,
    deadline: Instant,
    tty: bool,
) -> Result<HostKeyPins, BootstrapError> {
    let step = "host-key";
    let mut spinner = progress::Spinner::new(
        step,
        format!("waiting for the host keys on {instance}'s serial console"),
        tty,
    );
    loop {
        let console = rack
            .serial_console(instance)
            .await
            .map_err(|e| rack_failed(step, e))?;
        let mut parsed = HostKeyPins::from_console(&String::from_utf8_lossy(&console));
        if console.len() as u64 >= crate::adapters::oxide_rack::SERIAL_CONSOLE_BYTES {
            // The tail does not reach back to the first boot: the start of the history,
            // which propolis keeps, has the first block, and the first block wins over any
            // printed later (audit L3: a block in the tail may be a pod's).
            let head = rack
                .serial_console_head(instance)
                .await
                .map_err(|e| rack_failed(step, e))?;
            if let Ok(pins) = HostKeyPins::from_console(&String::from_utf8_lossy(&head)) {
                parsed = Ok(pins);
            }
        }
        match parsed {
            Ok(pins) => {
                spinner.done();
                return Ok(pins);
            }
            Err(e @ (KeyError::NoFingerprintBlock | KeyError::EmptyFingerprintBlock)) => {
                spinner.tick("no fingerprints yet");
                if Instant::now() >= deadline {
                    spinner.done();
                    return Err(failed(step, e));
                }
            }
            Err(e) => {
                spinner.done();
                return Err(failed(step, e));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads k3s.yaml over SSH. Connection trouble, a key not yet authorized and a file not yet
/// written are waited out; a host key that does not match the pins is refused at once.
async fn fetch_kubeconfig<S: RemoteShell>(
    target: &S,
    addr: SocketAddr,
    deadline: Instant,
    tty: bool,
) -> Result<String, BootstrapError> {
    let step = "fetch-kubeconfig";
    let mut spinner = progress::Spinner::new(
        step,
        format!("reading {K3S_KUBECONFIG_PATH} on {addr}"),
        tty,
    );
    loop {
        let err = match target.read_file(K3S_KUBECONFIG_PATH).await {
            Ok(bytes) => {
                spinner.done();
                return String::from_utf8(bytes).map_err(|e| {
                    failed(
                        step,
                        error::context(format!("{K3S_KUBECONFIG_PATH} is not UTF-8"), e),
                    )
                });
            }
            Err(e @ (SshError::HostKeyMismatch { .. } | SshError::NoPins { .. })) => {
                spinner.done();
                return Err(failed(step, e));
            }
            Err(e) => e,
        };
        spinner.tick(&err.to_string());
        if Instant::now() >= deadline {
            spinner.done();
            // A dropped SYN is the usual cause: an address outside the SSH rule (behind NAT
            // the rack sees another address than the default --ssh-allow).
            return Err(failed(
                step,
                error::context(
                    format!(
                        "SSH to {addr} did not succeed in time; if the rack sees this machine at an address outside --ssh-allow (behind NAT, say), the VPC firewall drops it"
                    ),
                    err,
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The Secret keeps the values it had (ensure_state never overwrites); warn when they are
/// not the resume file's, which means the resume file is from another incarnation. Returns
/// the Secret's values (those in force), when it could be read.
async fn check_stored_tokens<S: StateStore>(
    store: &S,
    ours: &crate::base::secrets::ClusterSecrets,
) -> Option<crate::base::secrets::ClusterSecrets> {
    match store.read_secrets().await {
        Ok(stored) => {
            if stored.k3s_token != ours.k3s_token || stored.ssh_public_key != ours.ssh_public_key {
                warn!(
                    step = "state",
                    "the Secret holds other tokens or keys than the resume file; the Secret's are in force"
                );
            }
            Some(stored)
        }
        Err(e) => {
            warn!(step = "state", error = %e, "cannot read the Secret back");
            None
        }
    }
}

/// Runs reconcile until it converges or `wait` is over (one pass when `wait` is zero).
async fn reconcile_loop<C: Connect>(
    connect: &C,
    ports: &Ports<C>,
    holder: &str,
    wait: Duration,
    shutdown: &crate::base::shutdown::Shutdown,
) -> Result<(Option<Plan>, bool), BootstrapError> {
    let step = "reconcile";
    let deadline = Instant::now() + wait;
    let mut last: Option<Plan> = None;
    let mut pass = 0u32;
    loop {
        pass += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut opts = ReconcileOptions::new(holder);
        opts.shutdown = shutdown.clone();
        opts.deadline = Some(remaining.clamp(Duration::from_secs(15), Duration::from_secs(240)));
        opts.poll = Duration::from_millis(250);
        let make_rack = |s: &crate::base::secrets::ClusterSecrets,
                         _: &crate::domain::spec::ClusterSpec| {
            connect.rack(&s.oxide_host, &s.oxide_token, &s.oxide_project)
        };
        match reconcile::run(&ports.cluster, &ports.store, make_rack, &opts).await {
            Ok(RunOutcome::Converged { plan }) => {
                info!(step, pass, pools = %pools_line(&plan), "the cluster has converged");
                return Ok((Some(plan), true));
            }
            Ok(RunOutcome::Progressing { plan, .. }) => {
                info!(step, pass, pools = %pools_line(&plan), "members are coming up");
                last = Some(plan);
            }
            Ok(RunOutcome::LeaseHeld { holder }) => {
                info!(step, pass, %holder, "another reconcile run holds the Lease; waiting")
            }
            Ok(RunOutcome::DryRun { plan }) => return Ok((Some(plan), false)),
            Ok(RunOutcome::Stopped { signal }) => {
                return Err(BootstrapError::step(
                    step,
                    error::message(format!(
                        "stopped by {signal}; the Lease is released, re-run to continue"
                    )),
                ));
            }
            Err(e) if e.kind() == error::Kind::NeedsPerson => {
                return Err(BootstrapError::needs_person(step, e));
            }
            Err(e) => {
                warn!(step, pass, error = %error::chain(&e), "reconcile pass failed; trying again")
            }
        }
        if Instant::now() >= deadline {
            return Ok((last, false));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn pools_line(plan: &Plan) -> String {
    plan.pools
        .iter()
        .map(|p| format!("{}={}/{}", p.pool, p.ready, p.desired))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `value`, or the contents of `PATH` for `file:PATH` (a leading `~/` is the home directory).
fn value_or_file(
    flag: &'static str,
    value: &str,
    home: Option<&Path>,
) -> Result<String, BootstrapError> {
    match value.strip_prefix("file:") {
        Some(path) => {
            let path = match (path.strip_prefix("~/"), home) {
                (Some(rest), Some(home)) => home.join(rest),
                _ => PathBuf::from(path),
            };
            let shown = path.display().to_string();
            std::fs::read_to_string(&path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| {
                    BootstrapError::input(flag, error::context(format!("cannot read {shown}"), e))
                })
        }
        None => Ok(value.trim().to_owned()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// The first error of type `T` in `e`'s causes.
    fn cause<T: std::error::Error + 'static>(e: &BootstrapError) -> Option<&T> {
        let mut cur = e.source();
        while let Some(s) = cur {
            if let Some(t) = s.downcast_ref::<T>() {
                return Some(t);
            }
            cur = s.source();
        }
        None
    }

    #[test]
    fn a_rack_failure_keeps_the_rack_error_and_only_bad_credentials_need_a_person() {
        let timeout = RackError::Timeout {
            what: "project demo".into(),
            seconds: 30,
        };
        let e = rack_failed("project", timeout);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(e.step_name(), Some("project"));
        let kept = e.source().and_then(|s| s.downcast_ref::<RackError>());
        assert!(
            matches!(kept, Some(RackError::Timeout { seconds: 30, .. })),
            "{kept:?}"
        );
        assert_eq!(
            error::chain(&e),
            "project: request for project demo timed out after 30s"
        );
        let refused = RackError::Unauthorized {
            status: 401,
            message: "no such token".into(),
        };
        let e = rack_failed("project", refused);
        assert_eq!(e.kind(), error::Kind::NeedsPerson);
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn a_changed_pinned_host_key_keeps_the_ssh_error_under_what_to_check() {
        let mismatch = SshError::HostKeyMismatch {
            addr: "192.0.2.1:22".parse().unwrap(),
            presented: "SHA256:new".into(),
            expected: vec!["SHA256:old".into()],
        };
        let e = mismatch_hint(
            failed("fetch-kubeconfig", mismatch),
            "demo-cp-1",
            true,
            Path::new("/state/demo.json"),
        );
        assert_eq!(e.exit_code(), 1);
        let printed = error::chain(&e);
        for needle in [
            "fetch-kubeconfig: the pins of demo-cp-1",
            "host-key-pins",
            "refusing to connect",
            "SHA256:old",
        ] {
            assert!(printed.contains(needle), "{needle:?}: {printed}");
        }
        assert!(matches!(
            cause::<SshError>(&e),
            Some(SshError::HostKeyMismatch { .. })
        ));
        // Pins read in this very run: no hint, the error as it was.
        let fresh = SshError::NoPins {
            addr: "192.0.2.1:22".parse().unwrap(),
        };
        let e = mismatch_hint(
            failed("fetch-kubeconfig", fresh),
            "demo-cp-1",
            true,
            Path::new("/state/demo.json"),
        );
        assert!(!error::chain(&e).contains("host-key-pins"));
    }

    #[test]
    fn an_unreadable_file_value_names_its_flag_and_keeps_the_io_error() {
        let e =
            value_or_file("--user-ssh-public-key", "file:/nonexistent/key.pub", None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(matches!(
            e,
            BootstrapError::Input {
                flag: "--user-ssh-public-key",
                ..
            }
        ));
        let printed = error::chain(&e);
        assert!(
            printed.starts_with("--user-ssh-public-key: cannot read /nonexistent/key.pub: "),
            "{printed}"
        );
        assert_eq!(
            cause::<std::io::Error>(&e).map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );
    }

    /// Audit L4: the webhook CA goes through the atomic writer: a symlink planted at its
    /// path is replaced, not followed, and the file is a public 0644 certificate.
    #[test]
    fn the_webhook_ca_file_does_not_follow_a_planted_symlink() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let resume_path = resume::resume_path(dir.path(), "demo");
        let r = ResumeState::generate("demo", "p", "h", "cp").unwrap();
        let ca_path = resume::webhook_ca_path(&resume_path, "demo");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        std::os::unix::fs::symlink(&victim, &ca_path).unwrap();
        write_webhook_ca(&resume_path, &r).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        let meta = std::fs::symlink_metadata(&ca_path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert_eq!(
            std::fs::read_to_string(&ca_path).unwrap(),
            r.webhook_tls_ca.clone().unwrap()
        );
    }
}
