//! The desired cluster: `spec.yaml` in ConfigMap `kube-system/oxide-controller`.
//!
//! Owns the spec's shape, its defaults, its validation (every error names the field it is
//! about) and the per-pool spec hash that detects drift. Pure: no I/O. Credentials and other
//! secrets never live here (they are in the Secret, see [`crate::base::secrets`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::base::names::{self, MAX_INSTANCE_NAME_LEN, SUFFIX_LEN};
use crate::domain::digests;

pub mod autoscale;
pub mod maintenance;
pub mod scale;
pub mod tailscale;
pub mod upgrade;
use crate::base::size::ByteSize;

/// Current `schema-version` of the ConfigMap.
pub const SCHEMA_VERSION: &str = "1";
/// Name of the control-plane pool unless the spec says otherwise.
pub const DEFAULT_CONTROL_PLANE_POOL: &str = "control-plane";
/// Name of the default worker pool.
pub const DEFAULT_WORKER_POOL: &str = "workers";
/// Label every node gets with its pool name.
pub const POOL_LABEL: &str = "oxide-controller/pool";
/// Annotation k3s writes on each Node with the arguments its process runs with (k3s
/// `pkg/nodeconfig` `NodeArgsAnnotation`, set at every start by `SetNodeConfigAnnotations`).
pub const NODE_ARGS_ANNOTATION: &str = "k3s.io/node-args";

/// The whole desired cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Cluster name: prefix of every instance name, and the kubeconfig context name.
    pub cluster: String,
    /// Oxide project holding the cluster.
    pub project: String,
    /// The control-plane pool (k3s servers, etcd members). Its count must be odd.
    pub control_plane: PoolSpec,
    /// Worker pools (k3s agents). The first is the default for `scale`.
    #[serde(default)]
    pub worker_pools: Vec<PoolSpec>,
    #[serde(default)]
    pub k3s: K3sSpec,
    #[serde(default)]
    pub nodes: NodeAccess,
    /// Reconcile schedule, five-field cron syntax as in a CronJob.
    #[serde(default = "default_schedule")]
    pub schedule: String,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Every VM joins a tailnet before k3s starts (auth key in the Secret). Absent: no
    /// Tailscale, and specs written before it existed read the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tailscale: Option<TailscaleSpec>,
    /// What the scale webhook may do (an administrator's setting: no webhook route writes
    /// it). Absent: the webhook moves counts within each pool's `max` and may lower bounds,
    /// never raise a `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSpec>,
    /// How a `k3s.version` change rolls out (see [`crate::domain::upgrade`]). Absent: the
    /// defaults, and specs written before it existed read the same.
    #[serde(default, skip_serializing_if = "upgrade::UpgradeSpec::is_default")]
    pub upgrade: upgrade::UpgradeSpec,
    /// When the cluster backs its datastore up and how many backups stay on the rack (see
    /// [`crate::domain::backup`]). Absent: hourly, 24 and one a day for 7 days, and specs
    /// written before it existed read the same.
    #[serde(
        default,
        skip_serializing_if = "crate::domain::backup::BackupSpec::is_default"
    )]
    pub backup: crate::domain::backup::BackupSpec,
    /// When a node is restarted so that k3s renews its certificates, and when their coming
    /// end makes the cluster Degraded (see [`crate::domain::certificates`]). Absent: 60 and
    /// 30 days, and specs written before it existed read the same.
    #[serde(
        default,
        skip_serializing_if = "crate::domain::certificates::CertificateSpec::is_default"
    )]
    pub certificates: crate::domain::certificates::CertificateSpec,
    /// When roll-outs that are not urgent may start (see [`crate::domain::maintenance`]).
    /// Absent: at any time, and specs written before it existed read the same.
    #[serde(
        default,
        skip_serializing_if = "maintenance::MaintenanceSpec::is_default"
    )]
    pub maintenance: maintenance::MaintenanceSpec,
}

/// The administrator's limits on the scale webhook (see [`ClusterSpec::webhook`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    /// No worker pool's `max` or count is raised above this through the webhook (the
    /// `scale` CLI, with an administrator's kubeconfig, is not bound by it).
    pub ceiling: u32,
}

/// The prefix length of the subnet nexus gives every new project's default VPC (omicron
/// `nexus/defaults/src/lib.rs:34` `DEFAULT_VPC_SUBNET_IPV4_BLOCK`, 172.30.0.0/22): what the
/// webhook checks against before a reconcile has recorded the project's own.
pub const DEFAULT_SUBNET_PREFIX: u8 = 22;

/// Tailscale settings of the nodes (the auth key is a secret and lives in the Secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailscaleSpec {
    /// ACL tag every node advertises, `tag:NAME`.
    #[serde(default = "default_tailscale_tag")]
    pub tag: String,
    /// Where nodes download the Tailscale installer (a mirror for racks without internet
    /// access). Unused with `k3s.install: preinstalled`. The default is Tailscale's
    /// `scripts/installer.sh` at a commit, checked against the digest the controller knows
    /// ([`digests::TAILSCALE_INSTALLER`]); any other URL needs `installer_sha256`.
    #[serde(
        default = "default_tailscale_installer_url",
        skip_serializing_if = "is_default_tailscale_installer_url"
    )]
    pub installer_url: String,
    /// How long a node's `tailscale up` waits to be Running before the setup fails
    /// (`--timeout`). Without it `tailscale up` waits for ever: for a device approval nobody
    /// gives, a control server it cannot reach, or an interactive login (tailscale@de9ec7e
    /// `cmd/tailscale/cli/up.go:134,805-830`), and the node shows no reason.
    #[serde(
        default = "default_tailscale_up_timeout",
        skip_serializing_if = "is_default_tailscale_up_timeout"
    )]
    pub up_timeout_seconds: u32,
    /// The installer's sha256 (hex): nodes refuse to run a download that does not match.
    /// Required for any `installer_url` but the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer_sha256: Option<String>,
}

impl TailscaleSpec {
    /// The Tailscale installer nodes download, and the sha256 they check it against before
    /// running it: `installer_sha256` if set, else the known digest when `installer_url` is
    /// the default. `sha256` is None only where [`ClusterSpec::validate`] refuses the spec.
    pub fn installer(&self) -> Installer {
        let known = digests::TAILSCALE_INSTALLER;
        let sha256 = self
            .installer_sha256
            .clone()
            .or_else(|| (self.installer_url == known.url()).then(|| known.sha256.to_owned()));
        Installer {
            url: self.installer_url.clone(),
            sha256,
        }
    }
}

impl Default for TailscaleSpec {
    fn default() -> Self {
        TailscaleSpec {
            tag: default_tailscale_tag(),
            installer_url: default_tailscale_installer_url(),
            up_timeout_seconds: default_tailscale_up_timeout(),
            installer_sha256: None,
        }
    }
}

/// `tailscale.up_timeout_seconds` unless set: five minutes, well inside the join deadline.
pub const DEFAULT_TAILSCALE_UP_TIMEOUT: u32 = 300;

fn default_tailscale_up_timeout() -> u32 {
    DEFAULT_TAILSCALE_UP_TIMEOUT
}

fn is_default_tailscale_up_timeout(v: &u32) -> bool {
    *v == DEFAULT_TAILSCALE_UP_TIMEOUT
}

/// API server port of k3s.
pub const API_PORT: u16 = 6443;

/// The k3s server URL for `ip` (joiners get a Ready server's private address, external
/// clients the floating IP).
pub fn server_url(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V6(v6) => format!("https://[{v6}]:{API_PORT}"),
        std::net::IpAddr::V4(v4) => format!("https://{v4}:{API_PORT}"),
    }
}

/// Node labels a member gets: the pool's, plus `oxide-controller/pool`.
pub fn node_labels(pool: &PoolSpec) -> std::collections::BTreeMap<String, String> {
    let mut labels = pool.labels.clone();
    labels.insert(POOL_LABEL.to_owned(), pool.name.clone());
    labels
}

/// Tailscale's documented installer (adds the package repository, installs, enables
/// `tailscaled`). It serves whatever installer is current, so no digest matches it for long:
/// the spec takes it only with `tailscale.installer_sha256`, and the default of
/// `tailscale.installer_url` is a copy named by its commit ([`digests::TAILSCALE_INSTALLER`]).
pub const TAILSCALE_INSTALL_URL: &str = "https://tailscale.com/install.sh";
/// k3s's documented installer. It serves whatever install.sh is current, so no digest
/// matches it for long: the spec takes it only with `k3s.installer_sha256`, and the default
/// is a copy named by its commit ([`crate::domain::digests`]).
pub const K3S_INSTALL_URL: &str = "https://get.k3s.io";

/// An installer's digest, if any, is 64 hex digits; an `http://` installer needs one (anyone
/// on the path could otherwise hand every new VM a script it runs as root), and so does any
/// installer other than the default (`unpinned_ok`): the URL is in the ConfigMap, which
/// more accounts may write than the Secret, and a URL alone would let such a writer point
/// every new VM at any script (audit security-2 N4). `Err` is the message for the digest's
/// field.
pub fn check_installer_digest(
    url: &str,
    sha256: Option<&str>,
    url_field: &str,
    unpinned_ok: bool,
) -> Result<(), String> {
    match sha256 {
        Some(d) if d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(()),
        Some(_) => Err("must be a sha256 digest: 64 hex digits".into()),
        None if url.starts_with("http://") => Err(format!(
            "{url_field} is http:// ({url:?}), so its download can be changed on the way; give the file's sha256 here, or use https://"
        )),
        None if !unpinned_ok => Err(format!(
            "{url_field} {url:?} is not the default installer, so nodes would run whatever it serves as root; give the file's sha256 here"
        )),
        None => Ok(()),
    }
}

/// An installer URL the setup script can single-quote and curl can fetch: `https://` (or
/// `http://` for a mirror inside the rack's network), a host, and no quotes, spaces or
/// control characters.
pub fn check_installer_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or("");
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let ok = !host.is_empty()
        && url.len() <= 2048
        && url
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '\'' | '"' | '\\' | '`' | '$'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{url:?} must be an http(s):// URL without quotes, spaces or $, like https://get.k3s.io or https://mirror.example/k3s/install.sh"
        ))
    }
}

/// Where install.sh downloads k3s releases by default (its `GITHUB_URL`).
pub const K3S_RELEASE_URL: &str = "https://github.com/k3s-io/k3s/releases";

fn default_k3s_release_url() -> String {
    K3S_RELEASE_URL.to_owned()
}

fn is_default_k3s_release_url(url: &str) -> bool {
    url == K3S_RELEASE_URL
}

fn default_tailscale_installer_url() -> String {
    digests::TAILSCALE_INSTALLER.url()
}

fn is_default_tailscale_installer_url(url: &str) -> bool {
    url == digests::TAILSCALE_INSTALLER.url()
}

fn default_tailscale_tag() -> String {
    tailscale::DEFAULT_TAG.to_owned()
}

/// One pool of identical VMs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    pub name: String,
    pub count: u32,
    #[serde(default)]
    pub min: u32,
    #[serde(default = "default_max")]
    pub max: u32,
    pub cpus: u16,
    pub memory: ByteSize,
    pub boot_disk: ByteSize,
    #[serde(default)]
    pub data_disk: Option<ByteSize>,
    /// Image name, looked up in the project first, then the silo.
    pub image: String,
    /// Overrides `k3s.version` for this pool.
    #[serde(default)]
    pub k3s_version: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// Oxide anti-affinity group the pool's instances join (created if missing).
    #[serde(default)]
    pub anti_affinity_group: Option<String>,
    /// Autoscaling within min/max; absent means the count is set by hand (spec or webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<autoscale::AutoscaleSpec>,
}

/// A node taint, `key=value:Effect`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: TaintEffect,
}

/// Kubernetes taint effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Taint {
    /// `CriticalAddonsOnly=true:NoExecute`: k3s's documented taint for servers that run only
    /// the control plane; k3s's packaged add-ons and our pods tolerate it, tenant pods do not.
    pub fn dedicated_server() -> Taint {
        Taint {
            key: "CriticalAddonsOnly".to_owned(),
            value: "true".to_owned(),
            effect: TaintEffect::NoExecute,
        }
    }
}

impl std::fmt::Display for Taint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}:{:?}", self.key, self.value, self.effect)
    }
}

/// An installer nodes download, and the sha256 they check it against before running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installer {
    pub url: String,
    pub sha256: Option<String>,
}

/// How k3s is installed and run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct K3sSpec {
    #[serde(default = "default_k3s_version")]
    pub version: String,
    #[serde(default)]
    pub install: K3sInstall,
    /// Where nodes download the k3s installer (a mirror for racks without internet access).
    /// The installer itself still fetches the k3s release; a mirror serves a copy of
    /// install.sh that points at it. Unused with `install: preinstalled`. Absent: the
    /// install.sh the controller knows by digest for `k3s.version`
    /// ([`crate::domain::digests`]), or, with `installer_sha256`, install.sh at the
    /// `k3s.version` tag ([`ClusterSpec::k3s_installer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer_url: Option<String>,
    /// The installer's sha256 (hex): nodes refuse to run a download that does not match
    /// (`sha256sum -c`). Required for an `http://` `installer_url`, for
    /// `https://get.k3s.io` (which serves whatever install.sh is current), and for a
    /// `k3s.version` newer than every installer the controller knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer_sha256: Option<String>,
    /// The sha256 (hex) of each k3s release's amd64 binary (Oxide VMs are x86_64), by release:
    /// `v1.34.1+k3s1: <64 hex>`. Set, a node downloads the binary of its release itself
    /// (`<release_url>/download/<release>/k3s`), checks it with `sha256sum -c` and runs
    /// install.sh with `INSTALL_K3S_SKIP_DOWNLOAD=true`, so the binary is checked against a
    /// digest that does not come from the release it is downloaded from (audit security-2 N12).
    /// Keyed by release, never one value: a member is checked only against its own release's
    /// digest, whatever version a roll gives it; once one is set, every release the spec asks
    /// for needs one ([`ClusterSpec::k3s_binary_sha256`]). Empty: install.sh downloads the
    /// binary and checks it against the release's `sha256sum-amd64.txt`. Unused with
    /// `install: preinstalled` (the binary is the image's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub binary_sha256: BTreeMap<String, String>,
    /// Where the installer downloads k3s releases (install.sh's `GITHUB_URL`): GitHub, unless
    /// `installer_url` is a mirror whose install.sh points elsewhere. The upgrade pre-flight
    /// checks that `<release_url>/download/<k3s.version>/sha256sum-amd64.txt` is there before
    /// the first member of a new version tries to install it; with `binary_sha256`, nodes
    /// download `<release_url>/download/<release>/k3s` from it themselves.
    #[serde(
        default = "default_k3s_release_url",
        skip_serializing_if = "is_default_k3s_release_url"
    )]
    pub release_url: String,
    /// Run with `--disable-cloud-controller` and leave cloud-provider duties to the Oxide CCM.
    #[serde(default)]
    pub oxide_ccm: bool,
    /// Servers run with k3s `secrets-encryption: true`: Secrets are stored in etcd encrypted
    /// with an AES-CBC key that travels only inside k3s's bootstrap data, itself encrypted with
    /// the server token, so an etcd snapshot (a backup) is ciphertext without the resume file
    /// (audit security-2 N1). Bootstrap sets it; absent (a cluster made before it existed) it
    /// is false, which is what those servers run. A critical k3s setting: it cannot change by
    /// editing the spec ([`ClusterSpec::check_server_settings`]).
    #[serde(default)]
    pub secrets_encryption: bool,
    /// Extra TLS SANs for the API server certificate (the floating IP is always added).
    #[serde(default)]
    pub tls_san: Vec<String>,
}

impl Default for K3sSpec {
    fn default() -> Self {
        K3sSpec {
            version: default_k3s_version(),
            install: K3sInstall::default(),
            installer_url: None,
            installer_sha256: None,
            binary_sha256: BTreeMap::new(),
            release_url: default_k3s_release_url(),
            oxide_ccm: false,
            secrets_encryption: false,
            tls_san: Vec::new(),
        }
    }
}

/// `script` downloads k3s at boot; `preinstalled` expects it in the image (air-gapped racks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum K3sInstall {
    #[default]
    Script,
    Preinstalled,
}

/// How the controller reaches nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeAccess {
    #[serde(default = "default_ssh_user")]
    pub ssh_user: String,
    /// The port the image's sshd listens on. Only used to connect: nothing in the user-data
    /// moves sshd, and the VPC's default firewall rules admit tcp/22 only.
    #[serde(default = "default_ssh_port")]
    pub ssh_port: u16,
    /// Which VMs get an ephemeral external IP. Absent: `servers`.
    #[serde(default)]
    pub external_ip: ExternalIpMode,
    /// IP pool for ephemeral and floating IPs; the silo default when absent.
    #[serde(default)]
    pub ip_pool: Option<String>,
}

impl Default for NodeAccess {
    fn default() -> Self {
        NodeAccess {
            ssh_user: default_ssh_user(),
            ssh_port: default_ssh_port(),
            external_ip: ExternalIpMode::default(),
            ip_pool: None,
        }
    }
}

/// Which VMs get an ephemeral external IP. Every instance reaches out without one: nexus
/// gives each a SNAT address (docs/DESIGN-NOTES.md "Network exposure").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExternalIpMode {
    /// The servers only: a laptop reaches each server's k3s for the upgrade pre-flight and
    /// copies `dev:` binaries over SSH to them; nothing reaches a worker from outside.
    #[default]
    Servers,
    /// Every VM, workers too (what specs written before `servers` existed say).
    Ephemeral,
    /// No VM (the API's floating IP, or a tailnet, is the way in).
    None,
}

impl ExternalIpMode {
    /// Whether a member of `role` gets an ephemeral IP.
    pub fn ephemeral_for(self, role: Role) -> bool {
        match self {
            ExternalIpMode::Servers => role == Role::ControlPlane,
            ExternalIpMode::Ephemeral => true,
            ExternalIpMode::None => false,
        }
    }
}

/// Deadlines the planner applies, in seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// A running VM that has not become a Ready Node after this long is replaced.
    #[serde(default = "d_join")]
    pub join_seconds: u64,
    /// A NotReady member is replaced after this long.
    #[serde(default = "d_not_ready")]
    pub not_ready_grace_seconds: u64,
    /// Drain gives up (and reports) after this long; the next run tries again.
    #[serde(default = "d_drain")]
    pub drain_seconds: u64,
    /// An instance stuck in `starting`/`stopping`/`creating` longer than this is treated as failed.
    #[serde(default = "d_transition")]
    pub transition_seconds: u64,
    /// Whole-run deadline of `reconcile-once`; must be shorter than the CronJob's activeDeadlineSeconds.
    #[serde(default = "d_run")]
    pub run_deadline_seconds: u64,
    /// After the rack refused a pool's creates in a way retrying does not fix (no capacity,
    /// quota, a full subnet), the next probe create waits this long, doubling with each
    /// further refusal up to 30 minutes. 0 probes on every run.
    #[serde(default = "d_create_retry")]
    pub create_retry_seconds: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            join_seconds: d_join(),
            not_ready_grace_seconds: d_not_ready(),
            drain_seconds: d_drain(),
            transition_seconds: d_transition(),
            run_deadline_seconds: d_run(),
            create_retry_seconds: d_create_retry(),
        }
    }
}

fn d_join() -> u64 {
    600
}
fn d_not_ready() -> u64 {
    300
}
fn d_drain() -> u64 {
    120
}
fn d_transition() -> u64 {
    600
}
fn d_run() -> u64 {
    240
}
fn d_create_retry() -> u64 {
    60
}
fn default_max() -> u32 {
    100
}
fn default_schedule() -> String {
    "*/5 * * * *".to_owned()
}
fn default_k3s_version() -> String {
    "v1.33.4+k3s1".to_owned()
}
fn default_ssh_user() -> String {
    "ubuntu".to_owned()
}
fn default_ssh_port() -> u16 {
    22
}

/// Whether a pool holds k3s servers or agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    ControlPlane,
    Worker,
}

/// One problem with a spec, naming the field (`worker_pools.workers.memory`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

/// All problems found in a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cluster spec: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct SpecErrors(pub Vec<SpecError>);

/// Errors loading `spec.yaml`.
#[derive(Debug, thiserror::Error)]
pub enum SpecLoadError {
    #[error("spec.yaml is not valid: {message}")]
    Parse { message: String },
    #[error(transparent)]
    Invalid(#[from] SpecErrors),
}

/// A count outside a pool's bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountError {
    #[error("pool {pool:?} does not exist; pools are: {known}")]
    UnknownPool { pool: String, known: String },
    #[error("count {count} for pool {pool:?} is outside its bounds [{min}, {max}]")]
    OutOfBounds {
        pool: String,
        count: i64,
        min: u32,
        max: u32,
    },
    #[error("the control-plane pool {pool:?} needs an odd count, not {count}")]
    EvenControlPlane { pool: String, count: i64 },
}

/// Members an Oxide anti-affinity group holds (omicron's `ANTI_AFFINITY_GROUP_MAX_MEMBERS`).
pub const MAX_ANTI_AFFINITY_MEMBERS: u32 = 32;

impl ClusterSpec {
    /// A spec with defaults: `control_planes` servers and one `workers` pool of `workers` agents.
    pub fn new(
        cluster: &str,
        project: &str,
        image: &str,
        control_planes: u32,
        workers: u32,
    ) -> Self {
        ClusterSpec {
            cluster: cluster.to_owned(),
            project: project.to_owned(),
            control_plane: PoolSpec {
                name: DEFAULT_CONTROL_PLANE_POOL.to_owned(),
                count: control_planes,
                min: 1,
                max: 7,
                cpus: 2,
                memory: ByteSize::gib(4),
                boot_disk: ByteSize::gib(20),
                data_disk: None,
                image: image.to_owned(),
                k3s_version: None,
                labels: BTreeMap::new(),
                taints: Vec::new(),
                anti_affinity_group: None,
                autoscale: None,
            },
            worker_pools: vec![PoolSpec {
                name: DEFAULT_WORKER_POOL.to_owned(),
                count: workers,
                min: 0,
                max: default_max(),
                cpus: 2,
                memory: ByteSize::gib(4),
                boot_disk: ByteSize::gib(20),
                data_disk: None,
                image: image.to_owned(),
                k3s_version: None,
                labels: BTreeMap::new(),
                taints: Vec::new(),
                anti_affinity_group: None,
                autoscale: None,
            }],
            // A new cluster encrypts its Secrets (audit security-2 N1).
            k3s: K3sSpec {
                secrets_encryption: true,
                ..K3sSpec::default()
            },
            nodes: NodeAccess::default(),
            schedule: default_schedule(),
            timeouts: Timeouts::default(),
            tailscale: None,
            webhook: None,
            upgrade: upgrade::UpgradeSpec::default(),
            backup: Default::default(),
            certificates: Default::default(),
            maintenance: Default::default(),
        }
    }

    /// Parses and validates `spec.yaml`.
    pub fn from_yaml(text: &str) -> Result<ClusterSpec, SpecLoadError> {
        let spec: ClusterSpec = serde_saphyr::from_str(text).map_err(|e| SpecLoadError::Parse {
            message: e.to_string(),
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Renders `spec.yaml`.
    pub fn to_yaml(&self) -> String {
        // Serializing plain data structs cannot fail; fall back to JSON (valid YAML) just in case.
        serde_saphyr::to_string(self)
            .unwrap_or_else(|_| serde_json::to_string_pretty(self).unwrap_or_default())
    }

    /// All pools, control plane first.
    pub fn pools(&self) -> impl Iterator<Item = (Role, &PoolSpec)> {
        std::iter::once((Role::ControlPlane, &self.control_plane))
            .chain(self.worker_pools.iter().map(|p| (Role::Worker, p)))
    }

    /// A pool by name.
    pub fn pool(&self, name: &str) -> Option<(Role, &PoolSpec)> {
        self.pools().find(|(_, p)| p.name == name)
    }

    /// The pool `scale` changes when none is named.
    pub fn default_worker_pool(&self) -> Option<&PoolSpec> {
        self.worker_pools.first()
    }

    /// The anti-affinity group a pool's instances join: the one the pool names; for the
    /// control plane, when it names none, `<cluster>-<control-plane pool>` (failure domain
    /// sled, policy allow), so that one sled does not hold two etcd members when the rack has
    /// room elsewhere (audit day2 D6).
    pub fn anti_affinity_group(&self, role: Role, pool: &PoolSpec) -> Option<String> {
        match (role, &pool.anti_affinity_group) {
            (_, Some(g)) => Some(g.clone()),
            (Role::ControlPlane, None) => Some(names::default_control_plane_group(
                &self.cluster,
                &pool.name,
            )),
            (Role::Worker, None) => None,
        }
    }

    /// Every anti-affinity group the spec's pools join.
    pub fn anti_affinity_groups(&self) -> std::collections::BTreeSet<String> {
        self.pools()
            .filter_map(|(role, pool)| self.anti_affinity_group(role, pool))
            .collect()
    }

    /// k3s version of a pool.
    pub fn k3s_version<'a>(&'a self, pool: &'a PoolSpec) -> &'a str {
        pool.k3s_version.as_deref().unwrap_or(&self.k3s.version)
    }

    /// Sets a pool's count, enforcing its bounds (and oddness for the control plane).
    pub fn set_count(&mut self, pool: &str, count: i64) -> Result<(), CountError> {
        let known = self
            .pools()
            .map(|(_, p)| p.name.clone())
            .collect::<Vec<_>>()
            .join(", ");
        let is_cp = self.control_plane.name == pool;
        let p = if is_cp {
            &mut self.control_plane
        } else {
            self.worker_pools
                .iter_mut()
                .find(|p| p.name == pool)
                .ok_or_else(|| CountError::UnknownPool {
                    pool: pool.to_owned(),
                    known,
                })?
        };
        if count < i64::from(p.min) || count > i64::from(p.max) {
            return Err(CountError::OutOfBounds {
                pool: pool.to_owned(),
                count,
                min: p.min,
                max: p.max,
            });
        }
        if is_cp && count % 2 == 0 {
            return Err(CountError::EvenControlPlane {
                pool: pool.to_owned(),
                count,
            });
        }
        p.count = u32::try_from(count).map_err(|_| CountError::OutOfBounds {
            pool: pool.to_owned(),
            count,
            min: p.min,
            max: p.max,
        })?;
        Ok(())
    }

    /// The hash of everything about a pool that needs a new VM to change. Stored in each
    /// instance's description; a mismatch is drift and the member gets rolled.
    pub fn pool_hash(&self, role: Role, pool: &PoolSpec) -> String {
        #[derive(Serialize)]
        struct Hashed<'a> {
            role: Role,
            image: &'a str,
            cpus: u16,
            memory: u64,
            boot_disk: u64,
            data_disk: Option<u64>,
            k3s_version: &'a str,
            install: K3sInstall,
            oxide_ccm: bool,
            labels: &'a BTreeMap<String, String>,
            taints: &'a [Taint],
            // Left out when absent so that clusters without Tailscale keep their hashes.
            #[serde(skip_serializing_if = "Option::is_none")]
            tailscale_tag: Option<&'a str>,
        }
        let h = Hashed {
            role,
            image: &pool.image,
            cpus: pool.cpus,
            memory: pool.memory.bytes(),
            boot_disk: pool.boot_disk.bytes(),
            data_disk: pool.data_disk.map(ByteSize::bytes),
            k3s_version: self.k3s_version(pool),
            install: self.k3s.install,
            oxide_ccm: self.k3s.oxide_ccm,
            labels: &pool.labels,
            taints: &pool.taints,
            // Only servers join the tailnet (`render::cloud_init::NodeUserData::for_member`).
            tailscale_tag: self
                .tailscale
                .as_ref()
                .filter(|_| role == Role::ControlPlane)
                .map(|t| t.tag.as_str()),
        };
        let bytes = serde_json::to_vec(&h).unwrap_or_default();
        let digest = Sha256::digest(&bytes);
        digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
    }

    /// Checks every rule and reports all problems at once.
    /// Whether every member the pools can reach has an address in a VPC subnet of prefix
    /// length `prefix`: nexus hands out all but the first five and the last address of a
    /// subnet (omicron `common/src/address.rs` `NUM_INITIAL_RESERVED_IP_ADDRESSES`,
    /// `nexus/db-model/src/ipv4net.rs`), so the default /22 holds 1,018 NICs. Worker pools
    /// count at their `max` (the webhook and the autoscaler move counts up to it), the control
    /// plane at its `count`; each pool plus one surge member while it rolls. The error names the
    /// largest worker pool's `max` (the control plane's `count` without workers).
    pub fn check_subnet(&self, prefix: u8) -> Result<(), SpecError> {
        let size = 1u64 << (32 - u32::from(prefix.min(32)));
        let usable = size.saturating_sub(6);
        let reach = |role: Role, p: &PoolSpec| match role {
            Role::ControlPlane => u64::from(p.count) + 1,
            Role::Worker => u64::from(p.max.max(p.count)) + 1,
        };
        let total: u64 = self.pools().map(|(r, p)| reach(r, p)).sum();
        if total <= usable {
            return Ok(());
        }
        let field = self
            .worker_pools
            .iter()
            .max_by_key(|p| p.max)
            .map_or("control_plane.count".to_owned(), |p| {
                format!("worker_pools.{}.max", p.name)
            });
        let parts = self
            .pools()
            .map(|(r, p)| format!("{} {}", p.name, reach(r, p)))
            .collect::<Vec<_>>()
            .join(", ");
        Err(SpecError {
            field,
            message: format!(
                "the pools can reach {total} members with one surge member each ({parts}), but the \
                 project's VPC subnet (a /{prefix}) has addresses for {usable}; lower the max, or \
                 use a project whose default subnet is larger"
            ),
        })
    }

    /// Refuses a spec whose `project` is not the one the cluster is pinned to: the Secret's
    /// `oxide-project`, written by bootstrap with the token it holds. The ConfigMap can be
    /// rewritten by whoever may scale the cluster; the project the Oxide identity acts on
    /// must not move with it.
    pub fn check_project(&self, pinned: &str) -> Result<(), SpecError> {
        if pinned.is_empty() {
            return Err(SpecError {
                field: "project".into(),
                message: "Secret kube-system/oxide-controller has an empty oxide-project, so the \
                          project this cluster acts on is unknown; set it to the cluster's project \
                          (kubectl patch secret, see README \"Security\") or re-run bootstrap"
                    .into(),
            });
        }
        if self.project == pinned {
            return Ok(());
        }
        Err(SpecError {
            field: "project".into(),
            message: format!(
                "spec.yaml names project {:?}, but this cluster is pinned to project {pinned:?} \
                 (Secret kube-system/oxide-controller, key oxide-project); the controller acts \
                 only on {pinned:?}: set project: {pinned} again (a cluster does not move \
                 between projects)",
                self.project
            ),
        })
    }

    /// Refuses a spec whose `cluster` is not the name the cluster is pinned to (the Secret's
    /// `oxide-cluster`, written by bootstrap): instances, firewall rules and backups are found
    /// by that name, so a ConfigMap writer who renamed it would aim this cluster's reconcile
    /// and backup Job at another cluster of the same project (audit security-2 N4).
    pub fn check_cluster(&self, pinned: &str) -> Result<(), SpecError> {
        if pinned.is_empty() {
            return Err(SpecError {
                field: "cluster".into(),
                message: "Secret kube-system/oxide-controller has no oxide-cluster, so the \
                          cluster name this controller may act on is unknown; re-run bootstrap \
                          (it pins the name), or set it with kubectl patch secret (README \
                          \"Security\")"
                    .into(),
            });
        }
        if self.cluster == pinned {
            return Ok(());
        }
        Err(SpecError {
            field: "cluster".into(),
            message: format!(
                "spec.yaml names cluster {:?}, but this cluster is pinned to {pinned:?} (Secret \
                 kube-system/oxide-controller, key oxide-cluster); the controller acts only on \
                 {pinned:?}'s instances and backups: set cluster: {pinned} again (a cluster \
                 is not renamed)",
                self.cluster
            ),
        })
    }

    /// [`Self::check_project`] and [`Self::check_cluster`]: what the Secret pins.
    pub fn check_pinned(&self, project: &str, cluster: &str) -> Result<(), SpecError> {
        self.check_project(project)?;
        self.check_cluster(cluster)
    }

    /// The k3s server settings this spec renders that every server of a cluster must share,
    /// by k3s flag. k3s lists them as "Critical Configuration Values" (docs.k3s.io/cli/server):
    /// a joining server whose value differs from the cluster's is refused ("critical
    /// configuration value mismatch") and exits. Of those, the product renders only
    /// `disable-cloud-controller` (from `k3s.oxide_ccm`) and `secrets-encryption` (from
    /// `k3s.secrets_encryption`); the agent token never changes.
    pub fn server_settings(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "disable-cloud-controller".to_owned(),
                self.k3s.oxide_ccm.to_string(),
            ),
            (
                "secrets-encryption".to_owned(),
                self.k3s.secrets_encryption.to_string(),
            ),
        ])
    }

    /// The [`Self::server_settings`] a k3s server runs with, read from the arguments it
    /// writes on its Node (`k3s.io/node-args`, [`NODE_ARGS_ANNOTATION`]): a JSON list of its
    /// command line with the config file's keys spliced in as `--key`, `value` pairs (a
    /// `--flag=value` argument split in two), tokens redacted (k3s `pkg/nodeconfig`
    /// `getNodeArgs`, `pkg/configfilearg` `readConfigFile`). A boolean flag given last wins;
    /// one followed by no `true`/`false` is set; one never given has k3s's default, false.
    /// `None` when the annotation is not such a list.
    pub fn server_settings_from_node_args(node_args: &str) -> Option<BTreeMap<String, String>> {
        let args: Vec<String> = serde_json::from_str(node_args).ok()?;
        let value_of = |flag: &str| {
            let dashed = format!("--{flag}");
            let at = args.iter().rposition(|a| *a == dashed);
            match at.and_then(|i| args.get(i + 1)).map(String::as_str) {
                Some(v @ ("true" | "false")) => v.to_owned(),
                _ if at.is_some() => "true".to_owned(),
                _ => "false".to_owned(),
            }
        };
        Some(BTreeMap::from([
            (
                "disable-cloud-controller".to_owned(),
                value_of("disable-cloud-controller"),
            ),
            (
                "secrets-encryption".to_owned(),
                value_of("secrets-encryption"),
            ),
        ]))
    }

    /// Refuses a spec whose server settings differ from those the cluster's servers run
    /// (`recorded`, see [`Self::server_settings`]): new servers would fail to join, be replaced,
    /// and fail again, forever.
    pub fn check_server_settings(
        &self,
        recorded: &BTreeMap<String, String>,
    ) -> Result<(), SpecError> {
        let field_of = |flag: &str| match flag {
            "disable-cloud-controller" => "k3s.oxide_ccm",
            "secrets-encryption" => "k3s.secrets_encryption",
            _ => "k3s",
        };
        for (flag, want) in self.server_settings() {
            // A record written before a flag was rendered lacks it: those servers run k3s's
            // default, false (every flag here is a boolean the product did not render then).
            let default = (!recorded.is_empty()).then(|| "false".to_owned());
            match recorded.get(&flag).or(default.as_ref()) {
                Some(have) if *have != want => {
                    let field = field_of(&flag);
                    let back = if field != "k3s" {
                        format!("{field}: {have}")
                    } else {
                        format!("{flag}: {have}")
                    };
                    return Err(SpecError {
                        field: field.to_owned(),
                        message: format!(
                            "the cluster's k3s servers run with {flag}={have}, and k3s requires every \
                             server to have the same value (a new server with {want} fails to join: \
                             \"critical configuration value mismatch\"), so it cannot change on a \
                             running cluster; set {back} again, or build a new cluster"
                        ),
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The newest k3s version the spec asks for (`k3s.version` or a pool's `k3s_version`):
    /// the installer is chosen for it, and installs every older one as well.
    pub fn newest_k3s_version(&self) -> &str {
        std::iter::once(&self.control_plane)
            .chain(&self.worker_pools)
            .filter_map(|p| p.k3s_version.as_deref())
            .fold(self.k3s.version.as_str(), |newest, v| {
                match (
                    upgrade::K3sVersion::parse(newest),
                    upgrade::K3sVersion::parse(v),
                ) {
                    (Some(a), Some(b)) if b > a => v,
                    _ => newest,
                }
            })
    }

    /// The k3s installer every member downloads, and the sha256 it is checked against
    /// before it runs (issue 34 §7): `k3s.installer_url` if set; else, with
    /// `k3s.installer_sha256`, install.sh at the tag of [`Self::newest_k3s_version`]; else the
    /// installer the controller knows for that version. `sha256` is None only where
    /// [`Self::validate`] refuses the spec.
    pub fn k3s_installer(&self) -> Installer {
        let version = self.newest_k3s_version();
        let sha256 = self.k3s.installer_sha256.clone();
        match (&self.k3s.installer_url, sha256) {
            (Some(url), sha256) => Installer {
                url: url.clone(),
                sha256,
            },
            (None, Some(sha256)) => Installer {
                url: digests::k3s_tag_installer_url(version),
                sha256: Some(sha256),
            },
            (None, None) => match digests::k3s_installer(version) {
                Some(k) => Installer {
                    url: k.url(),
                    sha256: Some(k.sha256.to_owned()),
                },
                None => Installer {
                    url: digests::k3s_tag_installer_url(version),
                    sha256: None,
                },
            },
        }
    }

    /// The sha256 a member of k3s `version` checks the binary it downloads against
    /// (`k3s.binary_sha256`): None when the spec pins no binary (install.sh then checks it
    /// against the release's own hash file) or k3s is preinstalled. `Err` (what to add) when
    /// the spec pins binaries but not this release's: a release an upgrade roll keeps a pool at
    /// that the spec no longer names. Such a member is not created; a binary is never checked
    /// against another release's digest, nor left unchecked because one is missing.
    pub fn k3s_binary_sha256(&self, version: &str) -> Result<Option<&str>, String> {
        if self.k3s.install == K3sInstall::Preinstalled || self.k3s.binary_sha256.is_empty() {
            return Ok(None);
        }
        match self.k3s.binary_sha256.get(version) {
            Some(d) => Ok(Some(d.as_str())),
            None => Err(self.missing_binary_digest(version)),
        }
    }

    /// What to add for a release `k3s.binary_sha256` lacks.
    fn missing_binary_digest(&self, version: &str) -> String {
        format!(
            "has digests for other releases but not for {version}, so its nodes would run a binary nothing here checks; \
             add `{version}: <sha256>`: the `k3s` line of {}/download/{version}/sha256sum-amd64.txt, compared with a second source \
             (README \"Node software\"), or remove k3s.binary_sha256",
            self.k3s.release_url.trim_end_matches('/')
        )
    }

    /// `k3s.binary_sha256`: release names and 64-hex digests, and one for every release the
    /// spec asks for (`k3s.version`, each pool's `k3s_version`, each `upgrade.path` step) once
    /// any is set.
    fn validate_k3s_binary(&self, err: &mut impl FnMut(String, String)) {
        if self.k3s.install == K3sInstall::Preinstalled || self.k3s.binary_sha256.is_empty() {
            return;
        }
        for (version, digest) in &self.k3s.binary_sha256 {
            check_k3s_version(err, "k3s.binary_sha256".into(), version);
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                err(
                    "k3s.binary_sha256".into(),
                    format!(
                        "{version}: must be a sha256 digest, 64 hex digits (the `k3s` line of the release's sha256sum-amd64.txt)"
                    ),
                );
            }
        }
        let asked = std::iter::once(self.k3s.version.as_str())
            .chain(self.pools().filter_map(|(_, p)| p.k3s_version.as_deref()))
            .chain(self.upgrade.path.iter().map(String::as_str));
        let mut seen = std::collections::BTreeSet::new();
        for version in asked {
            if seen.insert(version) && !self.k3s.binary_sha256.contains_key(version) {
                err(
                    "k3s.binary_sha256".into(),
                    self.missing_binary_digest(version),
                );
            }
        }
    }

    /// `k3s.installer_url` / `k3s.installer_sha256`: a URL the script can quote, a digest
    /// of 64 hex digits, and a digest wherever the download is not otherwise pinned.
    fn validate_k3s_installer(&self, err: &mut impl FnMut(String, String)) {
        if self.k3s.install == K3sInstall::Preinstalled {
            return;
        }
        let sha256 = self.k3s.installer_sha256.as_deref();
        let Some(url) = &self.k3s.installer_url else {
            let version = self.newest_k3s_version();
            let tag_url = digests::k3s_tag_installer_url(version);
            if sha256.is_some() {
                // Which file it is the digest of must not depend on the version a run rolls
                // members to (an upgrade renders old and new versions side by side).
                err(
                    "k3s.installer_url".into(),
                    format!(
                        "k3s.installer_sha256 is the digest of the file at k3s.installer_url; set that too, e.g. {tag_url}"
                    ),
                );
            } else if digests::k3s_installer(version).is_none() {
                let (major, minor) = digests::newest_known_minor();
                err(
                    "k3s.installer_sha256".into(),
                    format!(
                        "this controller knows the k3s installer by digest up to v{major}.{minor}, not for {version}; \
                         set k3s.installer_url to {tag_url} and k3s.installer_sha256 to that file's sha256, \
                         so nodes check what they run as root"
                    ),
                );
            }
            return;
        };
        if let Err(e) = check_installer_url(url) {
            err("k3s.installer_url".into(), e);
        } else if sha256.is_none() && url.trim_end_matches('/') == K3S_INSTALL_URL {
            err(
                "k3s.installer_sha256".into(),
                format!(
                    "k3s.installer_url {K3S_INSTALL_URL} serves whatever install.sh is current, so nodes could not check it; \
                     remove k3s.installer_url to use the installer this controller knows by digest, or give its sha256 here"
                ),
            );
        } else if let Err(e) = check_installer_digest(url, sha256, "k3s.installer_url", false) {
            err("k3s.installer_sha256".into(), e);
        }
    }

    pub fn validate(&self) -> Result<(), SpecErrors> {
        let mut errs = Vec::new();
        let mut err = |field: String, message: String| errs.push(SpecError { field, message });
        self.validate_names(&mut err);
        self.validate_anti_affinity_sizes(&mut err);
        self.validate_pools(&mut err);
        check_k3s_version(&mut err, "k3s.version".into(), &self.k3s.version);
        if let Err(e) = parse_schedule(&self.schedule) {
            err("schedule".into(), e);
        }
        if let Some(Err(e)) = self.backup.schedule.as_deref().map(parse_schedule) {
            err("backup.schedule".into(), e);
        }
        for (field, e) in self.certificates.validate() {
            err(field, e);
        }
        if let Some(Err(e)) = self.backup.drill_schedule.as_deref().map(parse_schedule) {
            err("backup.drill_schedule".into(), e);
        }
        if self.backup.keep == 0 {
            err(
                "backup.keep".into(),
                "must be at least 1: the newest backup always stays".into(),
            );
        }
        self.validate_nodes(&mut err);
        self.validate_tailscale(&mut err);
        self.validate_k3s_installer(&mut err);
        self.validate_k3s_binary(&mut err);
        if let Err(e) = check_installer_url(&self.k3s.release_url) {
            err("k3s.release_url".into(), e);
        }
        self.validate_timeouts(&mut err);
        self.upgrade.validate(&mut err);
        self.maintenance.validate(&mut err);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(SpecErrors(errs))
        }
    }

    /// The cluster's and the project's names.
    fn validate_names(&self, err: &mut impl FnMut(String, String)) {
        if let Err(e) = names::validate_name("cluster name", &self.cluster) {
            err("cluster".into(), e.to_string());
        }
        if let Err(e) = names::validate_name("project name", &self.project) {
            err("project".into(), e.to_string());
        }
    }

    /// A rack refuses the 33rd member of an anti-affinity group inside the create saga
    /// (omicron `ANTI_AFFINITY_GROUP_MAX_MEMBERS`, see tests/FIDELITY.md): every pool in a
    /// group may reach its max plus one surge member while it rolls.
    fn validate_anti_affinity_sizes(&self, err: &mut impl FnMut(String, String)) {
        let mut groups: BTreeMap<String, (u32, Vec<String>)> = BTreeMap::new();
        for (role, pool) in self.pools() {
            if let Some(g) = self.anti_affinity_group(role, pool) {
                let field = match role {
                    Role::ControlPlane => "control_plane.max".to_owned(),
                    Role::Worker => format!("worker_pools.{}.max", pool.name),
                };
                let entry = groups.entry(g).or_default();
                entry.0 = entry.0.saturating_add(pool.max).saturating_add(1);
                entry.1.push(field);
            }
        }
        for (group, (members, fields)) in &groups {
            if *members > MAX_ANTI_AFFINITY_MEMBERS {
                err(
                    fields.join(", "),
                    format!(
                        "anti-affinity group {group:?} could need {members} members (max plus one surge member per pool), more than the {MAX_ANTI_AFFINITY_MEMBERS} an Oxide group holds; lower the max or use another group"
                    ),
                );
            }
        }
    }

    /// Every pool, one after the other, and at least one worker pool.
    fn validate_pools(&self, err: &mut impl FnMut(String, String)) {
        let mut seen = std::collections::BTreeSet::new();
        for (role, pool) in self.pools() {
            let base = match role {
                Role::ControlPlane => "control_plane".to_owned(),
                Role::Worker => format!("worker_pools.{}", pool.name),
            };
            if !seen.insert(pool.name.clone()) {
                err(
                    format!("{base}.name"),
                    format!("pool name {:?} is used twice", pool.name),
                );
            }
            self.validate_pool_sizes(role, pool, &base, err);
            validate_pool_resources(pool, &base, err);
            validate_pool_node_settings(pool, &base, err);
        }
        if self.worker_pools.is_empty() {
            err(
                "worker_pools".into(),
                "at least one worker pool is needed".into(),
            );
        }
    }

    /// A pool's name length, its min/count/max, autoscaling and (control plane) quorum.
    fn validate_pool_sizes(
        &self,
        role: Role,
        pool: &PoolSpec,
        base: &str,
        err: &mut impl FnMut(String, String),
    ) {
        // Instance names are <cluster>-<pool>-<suffix> and must leave room for `boot-`.
        let max_pool = MAX_INSTANCE_NAME_LEN
            .saturating_sub(self.cluster.len() + SUFFIX_LEN + 2)
            .max(1);
        if let Err(e) = names::validate_name_max("pool name", &pool.name, max_pool) {
            err(
                format!("{base}.name"),
                format!(
                    "{e} (instance names are <cluster>-<pool>-xxxxx and must stay within {MAX_INSTANCE_NAME_LEN} characters)"
                ),
            );
        }
        if pool.min > pool.max {
            err(
                format!("{base}.min"),
                format!("min {} is greater than max {}", pool.min, pool.max),
            );
        }
        if pool.count < pool.min || pool.count > pool.max {
            err(
                format!("{base}.count"),
                format!(
                    "count {} is outside [min {}, max {}]",
                    pool.count, pool.min, pool.max
                ),
            );
        }
        if let Some(a) = &pool.autoscale {
            if role == Role::ControlPlane {
                err(
                    format!("{base}.autoscale"),
                    "control plane pools do not autoscale; move the block to a worker pool".into(),
                );
            }
            for e in a.validate(pool.min, pool.max) {
                err(format!("{base}.autoscale.{}", e.field), e.message);
            }
        }
        if role == Role::ControlPlane && pool.count.is_multiple_of(2) {
            err(
                format!("{base}.count"),
                format!(
                    "the control plane needs an odd number of servers for etcd quorum, not {}",
                    pool.count
                ),
            );
        }
    }

    /// `nodes`: SSH port and user, IP pool.
    fn validate_nodes(&self, err: &mut impl FnMut(String, String)) {
        if self.nodes.ssh_port == 0 {
            err("nodes.ssh_port".into(), "port 0 is not a port".into());
        }
        if self.nodes.ssh_user.is_empty()
            || !self
                .nodes
                .ssh_user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            err(
                "nodes.ssh_user".into(),
                format!("{:?} is not a valid user name", self.nodes.ssh_user),
            );
        }
        if let Some(p) = &self.nodes.ip_pool
            && let Err(e) = names::validate_name("IP pool name", p)
        {
            err("nodes.ip_pool".into(), e.to_string());
        }
    }

    /// `tailscale`, when present: tag, installer URL, `up` timeout.
    fn validate_tailscale(&self, err: &mut impl FnMut(String, String)) {
        let Some(ts) = &self.tailscale else {
            return;
        };
        if let Err(e) = tailscale::check_tag(&ts.tag) {
            err("tailscale.tag".into(), e);
        }
        let sha256 = ts.installer().sha256;
        if let Err(e) = check_installer_url(&ts.installer_url) {
            err("tailscale.installer_url".into(), e);
        } else if sha256.is_none()
            && ts.installer_url.trim_end_matches('/') == TAILSCALE_INSTALL_URL
        {
            err(
                "tailscale.installer_sha256".into(),
                format!(
                    "tailscale.installer_url {TAILSCALE_INSTALL_URL} serves whatever installer is current, so nodes could not check it; \
                     remove tailscale.installer_url to use the installer this controller knows by digest ({}), or give its sha256 here",
                    digests::TAILSCALE_INSTALLER.url()
                ),
            );
        } else if let Err(e) = check_installer_digest(
            &ts.installer_url,
            sha256.as_deref(),
            "tailscale.installer_url",
            false,
        ) {
            err("tailscale.installer_sha256".into(), e);
        }
        if !(1..=3600).contains(&ts.up_timeout_seconds) {
            err(
                "tailscale.up_timeout_seconds".into(),
                format!(
                    "{} is out of range: between 1 and 3600 seconds (tailscale up waits that long to join before the node's setup fails)",
                    ts.up_timeout_seconds
                ),
            );
        }
    }

    /// `timeouts`: none of them zero.
    fn validate_timeouts(&self, err: &mut impl FnMut(String, String)) {
        let t = &self.timeouts;
        for (name, v) in [
            ("join_seconds", t.join_seconds),
            ("not_ready_grace_seconds", t.not_ready_grace_seconds),
            ("drain_seconds", t.drain_seconds),
            ("transition_seconds", t.transition_seconds),
            ("run_deadline_seconds", t.run_deadline_seconds),
        ] {
            if v == 0 {
                err(format!("timeouts.{name}"), "must be greater than 0".into());
            }
        }
    }
}

/// A pool's CPUs, memory, disks, image and anti-affinity group name.
fn validate_pool_resources(pool: &PoolSpec, base: &str, err: &mut impl FnMut(String, String)) {
    if pool.cpus == 0 || pool.cpus > 254 {
        err(
            format!("{base}.cpus"),
            format!("{} is outside 1..=254", pool.cpus),
        );
    }
    match pool.memory.whole_gib() {
        None => err(
            format!("{base}.memory"),
            format!(
                "{} is not a whole number of GiB (Oxide needs multiples of 1 GiB)",
                pool.memory
            ),
        ),
        Some(g) if !(1..=1536).contains(&g) => err(
            format!("{base}.memory"),
            format!("{} is outside 1GiB..=1536GiB", pool.memory),
        ),
        Some(_) => {}
    }
    check_disk(err, format!("{base}.boot_disk"), pool.boot_disk);
    if let Some(d) = pool.data_disk {
        check_disk(err, format!("{base}.data_disk"), d);
    }
    if let Err(e) = names::validate_name("image name", &pool.image) {
        err(format!("{base}.image"), e.to_string());
    }
    if let Some(g) = &pool.anti_affinity_group
        && let Err(e) = names::validate_name("anti-affinity group name", g)
    {
        err(format!("{base}.anti_affinity_group"), e.to_string());
    }
}

/// A pool's node labels, taints and k3s version.
fn validate_pool_node_settings(pool: &PoolSpec, base: &str, err: &mut impl FnMut(String, String)) {
    for (k, v) in &pool.labels {
        if !valid_label_key(k) {
            err(
                format!("{base}.labels"),
                format!("{k:?} is not a valid Kubernetes label key"),
            );
        }
        if !valid_label_value(v) {
            err(
                format!("{base}.labels.{k}"),
                format!("{v:?} is not a valid Kubernetes label value"),
            );
        }
        if valid_label_key(k) && kubelet_refuses_label(k) {
            err(
                format!("{base}.labels.{k}"),
                format!(
                    "the kubelet refuses {k:?} in --node-labels and k3s would not start: \
                     in the kubernetes.io and k8s.io namespaces only kubelet.kubernetes.io/, \
                     node.kubernetes.io/ and {} are allowed; use your own prefix \
                     (e.g. example.com/role) or set it with `kubectl label node` once the \
                     node joined",
                    KUBELET_LABELS.join(", ")
                ),
            );
        }
    }
    for t in &pool.taints {
        if !valid_label_key(&t.key) || !valid_label_value(&t.value) {
            err(
                format!("{base}.taints"),
                format!("{t} is not a valid taint"),
            );
        }
    }
    if let Some(v) = &pool.k3s_version {
        check_k3s_version(err, format!("{base}.k3s_version"), v);
    }
}

fn check_disk(err: &mut impl FnMut(String, String), field: String, size: ByteSize) {
    match size.whole_gib() {
        None => err(field, format!("{size} is not a whole number of GiB")),
        Some(g) if !(1..=1023).contains(&g) => {
            err(field, format!("{size} is outside 1GiB..=1023GiB"))
        }
        Some(_) => {}
    }
}

fn check_k3s_version(err: &mut impl FnMut(String, String), field: String, v: &str) {
    let ok = v.starts_with('v')
        && v.len() <= 64
        && v[1..].chars().next().is_some_and(|c| c.is_ascii_digit())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-'));
    if !ok {
        err(
            field,
            format!("{v:?} is not a k3s version like v1.33.4+k3s1"),
        );
    }
}

/// Parses a CronJob schedule in Kubernetes' cron dialect (see [`crate::base::kcron`]), refusing
/// what the apiserver refuses on create (a `TZ`/`CRON_TZ` prefix included).
pub fn parse_schedule(s: &str) -> Result<crate::base::kcron::Schedule, String> {
    crate::base::kcron::validate_cronjob_schedule(s).map_err(|e| {
        format!(
            "{s:?} is not a valid CronJob schedule: {e} (five fields: minute hour day-of-month month day-of-week, day of week 0-6 with Sunday 0, e.g. \"*/5 * * * *\"; or @hourly, @daily, ...)"
        )
    })
}

fn valid_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Labels a kubelet may set on its own Node in the `kubernetes.io`/`k8s.io` namespaces
/// (k8s.io/kubelet `pkg/apis/well_known_labels.go`, `kubeletLabels`).
const KUBELET_LABELS: [&str; 11] = [
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// True for a key the kubelet refuses in `--node-labels` (k3s passes `node-label` there):
/// its namespace is `kubernetes.io`/`k8s.io` or a subdomain, and it is neither one of
/// [`KUBELET_LABELS`] nor in `kubelet.kubernetes.io`/`node.kubernetes.io` or their subdomains
/// (kubelet `ValidateKubeletFlags`, `isKubernetesLabel`, `IsKubeletLabel`).
pub fn kubelet_refuses_label(key: &str) -> bool {
    let Some((namespace, _)) = key.split_once('/') else {
        return false;
    };
    let within = |ns: &str| namespace == ns || namespace.ends_with(&format!(".{ns}"));
    (within("kubernetes.io") || within("k8s.io"))
        && !KUBELET_LABELS.contains(&key)
        && !within("kubelet.kubernetes.io")
        && !within("node.kubernetes.io")
}

fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && valid_label_value(name)
}

/// The control-plane pool a restore (or a drill) of `tag` creates its server with, and a
/// note for the person when the backup records no image.
///
/// The release is the backup's, not the resume file's: the resume file keeps the spec
/// bootstrap started with, and after an upgrade that is older than the datastore. k3s rolls
/// back only by restoring "a datastore snapshot taken on the Kubernetes minor version you wish
/// to roll back to" (<https://docs.k3s.io/upgrades/roll-back>), and no Kubernetes control
/// plane runs older than the data its newer self wrote. Installing the backup's own release is
/// always that pairing; the restored spec then rolls the servers forward through the usual
/// upgrade, however old the backup is. The image is the one recorded with the release (the
/// resume file's may be deleted since, or carry another preinstalled k3s); a backup taken
/// before images were recorded keeps the pool's, said in the note.
pub fn restore_pool(
    backup: &str,
    tag: &crate::domain::backup::BackupTag,
    pool: &PoolSpec,
) -> Result<(PoolSpec, Option<String>), String> {
    let v = &tag.k3s_version;
    let release = v.strip_prefix('v').is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-'))
    });
    if !release {
        return Err(format!(
            "backup {backup} does not say which k3s release wrote it (k3s={v} in its description): a restore must install that release, never an older one. Restore another backup of the cluster. Nothing was changed"
        ));
    }
    let mut out = pool.clone();
    out.k3s_version = Some(v.clone());
    let note = match &tag.image {
        Some(image) => {
            out.image.clone_from(image);
            None
        }
        None => Some(format!(
            "backup {backup} records no control-plane image (taken before backups recorded it): the restoring server runs k3s {v} on image {}, the resume file's; if that image has gone or preinstalls another k3s, restore a newer backup",
            pool.image
        )),
    };
    Ok((out, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ClusterSpec {
        ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 2)
    }

    fn fields(s: &ClusterSpec) -> Vec<String> {
        s.validate()
            .err()
            .map(|e| e.0.into_iter().map(|e| e.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn default_spec_is_valid_and_round_trips_through_yaml() {
        let s = spec();
        assert_eq!(s.validate(), Ok(()));
        let yaml = s.to_yaml();
        assert_eq!(ClusterSpec::from_yaml(&yaml).expect("parses"), s);
    }

    /// Issue 32 item 6: the servers join `<cluster>-<control-plane pool>` unless the spec
    /// names another group; worker pools join one only when they name it.
    #[test]
    fn the_control_plane_spreads_over_sleds_by_default() {
        let mut s = spec();
        let (cp, wk) = (s.control_plane.clone(), s.worker_pools[0].clone());
        assert_eq!(
            s.anti_affinity_group(Role::ControlPlane, &cp).as_deref(),
            Some("demo-control-plane")
        );
        assert_eq!(s.anti_affinity_group(Role::Worker, &wk), None);
        assert_eq!(
            s.anti_affinity_groups().into_iter().collect::<Vec<_>>(),
            ["demo-control-plane"]
        );
        // Not written into spec.yaml: a stored spec reads and writes back the same.
        assert!(
            !s.to_yaml().contains("demo-control-plane"),
            "{}",
            s.to_yaml()
        );
        s.control_plane.anti_affinity_group = Some("servers".into());
        s.worker_pools[0].anti_affinity_group = Some("spread".into());
        let cp = s.control_plane.clone();
        assert_eq!(
            s.anti_affinity_group(Role::ControlPlane, &cp).as_deref(),
            Some("servers")
        );
        assert_eq!(
            s.anti_affinity_groups().into_iter().collect::<Vec<_>>(),
            ["servers", "spread"]
        );
        // The default group counts towards the 32 members: a worker pool naming it too.
        let mut s = spec();
        s.worker_pools[0].anti_affinity_group = Some("demo-control-plane".into());
        s.worker_pools[0].max = 24;
        assert_eq!(fields(&s), ["control_plane.max, worker_pools.workers.max"]);
    }

    #[test]
    fn anti_affinity_groups_hold_32_members_counting_a_surge_member_per_pool() {
        let mut s = spec();
        s.worker_pools[0].anti_affinity_group = Some("spread".into());
        s.worker_pools[0].max = 31;
        assert_eq!(s.validate(), Ok(()));
        s.worker_pools[0].max = 32;
        assert_eq!(fields(&s), ["worker_pools.workers.max"]);
        // Two pools sharing a group: 15 + 1 + 16 + 1 = 33.
        s.worker_pools[0].max = 15;
        s.control_plane.anti_affinity_group = Some("spread".into());
        s.control_plane.max = 16;
        assert_eq!(fields(&s), ["control_plane.max, worker_pools.workers.max"]);
        s.control_plane.max = 15;
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn autoscale_block_parses_round_trips_and_names_bad_fields() {
        let mut s = spec();
        let mut yaml = s.to_yaml();
        assert!(
            !yaml.contains("autoscale"),
            "absent block stays absent: {yaml}"
        );
        s.worker_pools[0].min = 1;
        s.worker_pools[0].max = 6;
        s.worker_pools[0].count = 1;
        s.worker_pools[0].autoscale = Some(crate::domain::autoscale::AutoscaleSpec {
            schedules: vec![crate::domain::autoscale::ScheduleWindow {
                name: "office".into(),
                start: "0 8 * * 1-5".into(),
                duration_minutes: 720,
                time_zone: "UTC".into(),
                min: Some(3),
                max: None,
            }],
            ..Default::default()
        });
        assert_eq!(s.validate(), Ok(()));
        yaml = s.to_yaml();
        assert_eq!(ClusterSpec::from_yaml(&yaml).expect("parses"), s);
        let a = s.worker_pools[0].autoscale.as_mut().expect("set");
        a.utilization_threshold = 2.0;
        a.schedules[0].min = Some(7);
        assert_eq!(
            fields(&s),
            [
                "worker_pools.workers.autoscale.utilization_threshold",
                "worker_pools.workers.autoscale.schedules[0].min"
            ]
        );
    }

    #[test]
    fn even_control_plane_is_refused() {
        let mut s = spec();
        s.control_plane.count = 2;
        assert_eq!(fields(&s), ["control_plane.count"]);
    }

    #[test]
    fn min_above_max_is_refused() {
        let mut s = spec();
        s.worker_pools[0].min = 10;
        s.worker_pools[0].max = 5;
        s.worker_pools[0].count = 7;
        let f = fields(&s);
        assert!(f.contains(&"worker_pools.workers.min".to_owned()), "{f:?}");
    }

    #[test]
    fn memory_must_be_whole_gib() {
        let mut s = spec();
        s.worker_pools[0].memory = "1536MiB".parse().expect("size");
        let e = s.validate().expect_err("invalid").to_string();
        assert!(
            e.contains("worker_pools.workers.memory") && e.contains("whole number of GiB"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let yaml = spec()
            .to_yaml()
            .replace("worker_pools:", "wokrer_pools: []\nworker_pools:");
        let e = ClusterSpec::from_yaml(&yaml)
            .expect_err("unknown field")
            .to_string();
        assert!(e.contains("wokrer_pools"), "{e}");
    }

    #[test]
    fn long_pool_names_leave_room_for_disk_names() {
        let mut s = spec();
        s.worker_pools[0].name = "w".repeat(60);
        assert_eq!(
            fields(&s),
            ["worker_pools.wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww.name"]
        );
    }

    #[test]
    fn schedule_needs_five_valid_fields() {
        assert!(parse_schedule("*/5 * * * *").is_ok());
        assert!(
            parse_schedule("0 3 * * 0").is_ok(),
            "Sunday is 0 in Kubernetes"
        );
        assert!(parse_schedule("@hourly").is_ok());
        let e = parse_schedule("0 3 * * 7").unwrap_err();
        assert!(e.contains("above maximum (6)"), "{e}");
        assert!(parse_schedule("CRON_TZ=UTC 0 3 * * *").is_err());
        let mut s = spec();
        s.schedule = "0 3 * * 7".into();
        assert_eq!(fields(&s), ["schedule"]);
        assert!(parse_schedule("* * * *").is_err());
        assert!(parse_schedule("99 * * * *").is_err());
        let mut s = spec();
        s.schedule = "every five minutes".into();
        assert_eq!(fields(&s), ["schedule"]);
        // The restore drill's schedule: the same dialect, weekly by default, null for off.
        let mut s = spec();
        assert_eq!(
            s.backup.drill_schedule.as_deref(),
            Some(crate::domain::backup::DEFAULT_DRILL_SCHEDULE)
        );
        s.backup.drill_schedule = Some("weekly-ish".into());
        assert_eq!(fields(&s), ["backup.drill_schedule"]);
        s.backup.drill_schedule = None;
        assert!(fields(&s).is_empty());
        let yaml = s.to_yaml();
        assert!(yaml.contains("drill_schedule: null"), "{yaml}");
        assert_eq!(
            ClusterSpec::from_yaml(&yaml).unwrap().backup.drill_schedule,
            None
        );
    }

    #[test]
    fn set_count_enforces_bounds_and_names_them() {
        let mut s = spec();
        s.worker_pools[0].max = 10;
        assert_eq!(s.set_count("workers", 4), Ok(()));
        assert_eq!(s.worker_pools[0].count, 4);
        let e = s.set_count("workers", 11).expect_err("bounds").to_string();
        assert!(e.contains("[0, 10]"), "{e}");
        assert!(matches!(
            s.set_count("gpu", 1),
            Err(CountError::UnknownPool { .. })
        ));
        assert!(matches!(
            s.set_count("control-plane", 2),
            Err(CountError::EvenControlPlane { .. })
        ));
    }

    #[test]
    fn pool_hash_changes_with_what_needs_a_new_vm_only() {
        let s = spec();
        let p = &s.worker_pools[0];
        let h = s.pool_hash(Role::Worker, p);
        let mut q = p.clone();
        q.count = 9;
        q.max = 200;
        assert_eq!(
            s.pool_hash(Role::Worker, &q),
            h,
            "count/bounds are not drift"
        );
        q.cpus = 4;
        assert_ne!(s.pool_hash(Role::Worker, &q), h, "cpus are drift");
        let mut s2 = s.clone();
        s2.k3s.version = "v1.34.1+k3s1".into();
        assert_ne!(s2.pool_hash(Role::Worker, p), h, "k3s version is drift");
    }

    #[test]
    fn tailscale_is_optional_defaulted_checked_and_drift_when_it_changes() {
        // A spec written before Tailscale existed parses, and writes back without it.
        let plain = spec();
        let yaml = plain.to_yaml();
        assert!(!yaml.contains("tailscale"), "{yaml}");
        assert_eq!(ClusterSpec::from_yaml(&yaml).expect("parses"), plain);
        // `tailscale: {}` takes the default tag.
        let with = ClusterSpec::from_yaml(&format!("{yaml}tailscale: {{}}\n")).expect("parses");
        assert_eq!(
            with.tailscale.as_ref().map(|t| t.tag.as_str()),
            Some(tailscale::DEFAULT_TAG)
        );
        // Without Tailscale the hash is what it always was; with it, a new server is needed.
        // Workers never join the tailnet, so theirs does not move.
        let cp = &plain.control_plane;
        assert_ne!(
            with.pool_hash(Role::ControlPlane, cp),
            plain.pool_hash(Role::ControlPlane, cp)
        );
        let p = &plain.worker_pools[0];
        assert_eq!(
            with.pool_hash(Role::Worker, p),
            plain.pool_hash(Role::Worker, p)
        );
        let mut bad = with.clone();
        bad.tailscale = Some(TailscaleSpec {
            tag: "tag:no_underscores".into(),
            ..TailscaleSpec::default()
        });
        assert_eq!(fields(&bad), ["tailscale.tag"]);
        // Installer mirrors: http(s) URLs the setup script can quote.
        let mut bad = spec();
        bad.k3s.installer_url = Some("ftp://mirror/install.sh".into());
        bad.tailscale = Some(TailscaleSpec {
            installer_url: "https://mirror/x'; reboot '".into(),
            ..TailscaleSpec::default()
        });
        assert_eq!(
            fields(&bad),
            ["tailscale.installer_url", "k3s.installer_url"]
        );
        // Audit security-2 N4: a mirror other than Tailscale's own installer needs its digest.
        let mut mirror = spec();
        mirror.tailscale = Some(TailscaleSpec {
            installer_url: "https://mirror.example/tailscale/install.sh".into(),
            ..TailscaleSpec::default()
        });
        assert_eq!(fields(&mirror), ["tailscale.installer_sha256"]);
        if let Some(ts) = mirror.tailscale.as_mut() {
            ts.installer_sha256 = Some("cd".repeat(32));
        }
        assert!(mirror.validate().is_ok());
        // Audit security-2 N12: the default installer is Tailscale's file at a commit, with the
        // digest the controller knows; Tailscale's own URL serves whatever is current, so it
        // is refused without a digest, naming the field to set.
        let known = digests::TAILSCALE_INSTALLER;
        let default = TailscaleSpec::default();
        assert_eq!(
            default.installer(),
            Installer {
                url: format!(
                    "https://raw.githubusercontent.com/tailscale/tailscale/{}/scripts/installer.sh",
                    known.commit
                ),
                sha256: Some(known.sha256.to_owned()),
            }
        );
        let mut current = spec();
        current.tailscale = Some(TailscaleSpec {
            installer_url: TAILSCALE_INSTALL_URL.into(),
            ..TailscaleSpec::default()
        });
        let errs = current.validate().unwrap_err();
        assert_eq!(
            errs.0.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            ["tailscale.installer_sha256"]
        );
        assert!(
            errs.0[0].message.contains("remove tailscale.installer_url")
                && errs.0[0].message.contains(&known.url()),
            "{errs}"
        );
        if let Some(ts) = current.tailscale.as_mut() {
            ts.installer_sha256 = Some("ef".repeat(32));
        }
        assert!(current.validate().is_ok());
        assert_eq!(
            current.tailscale.as_ref().map(|t| t.installer().sha256),
            Some(Some("ef".repeat(32)))
        );
        // The pinned URL with the spec's own digest: the spec's digest is checked.
        let mut own = spec();
        own.tailscale = Some(TailscaleSpec {
            installer_sha256: Some("01".repeat(32)),
            ..TailscaleSpec::default()
        });
        assert!(own.validate().is_ok());
        assert_eq!(
            own.tailscale.as_ref().and_then(|t| t.installer().sha256),
            Some("01".repeat(32))
        );
        // Issue 34 §7: an http:// installer needs a digest, named in the error.
        let mut good = spec();
        good.k3s.installer_url = Some("http://10.0.0.5/k3s/install.sh".into());
        let errs = good.validate().unwrap_err();
        assert_eq!(
            errs.0.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            ["k3s.installer_sha256"]
        );
        assert!(
            errs.0[0].message.contains("k3s.installer_url is http://"),
            "{errs}"
        );
        good.k3s.installer_sha256 = Some("ab".repeat(32));
        assert!(good.validate().is_ok());
        good.k3s.installer_sha256 = Some("not-a-digest".into());
        assert!(good.validate().is_err());
        let mut ts = spec();
        ts.tailscale = Some(TailscaleSpec {
            installer_url: "http://10.0.0.5/tailscale/install.sh".into(),
            ..TailscaleSpec::default()
        });
        assert_eq!(
            ts.validate().unwrap_err().0[0].field,
            "tailscale.installer_sha256"
        );
        // `tailscale up --timeout`: defaulted, written back only when set, bounded.
        assert_eq!(
            with.tailscale.as_ref().map(|t| t.up_timeout_seconds),
            Some(DEFAULT_TAILSCALE_UP_TIMEOUT)
        );
        assert!(!with.to_yaml().contains("up_timeout_seconds"));
        let mut short = with.clone();
        if let Some(ts) = short.tailscale.as_mut() {
            ts.up_timeout_seconds = 20;
        }
        assert!(short.to_yaml().contains("up_timeout_seconds: 20"));
        assert_eq!(
            short.pool_hash(Role::Worker, p),
            with.pool_hash(Role::Worker, p),
            "the timeout only bounds a join; running nodes need not be replaced"
        );
        for bad_timeout in [0, 3601] {
            let mut bad = with.clone();
            if let Some(ts) = bad.tailscale.as_mut() {
                ts.up_timeout_seconds = bad_timeout;
            }
            assert_eq!(fields(&bad), ["tailscale.up_timeout_seconds"]);
        }
    }

    /// Audit security-2 N12: `k3s.binary_sha256` pins each release's binary by its own digest.
    /// Once one is set, a spec asking for a release without one (a new `k3s.version`, a pool's
    /// `k3s_version`, an `upgrade.path` step) is refused naming the field and saying what to
    /// add, and a member is never checked against another release's digest.
    #[test]
    fn a_pinned_k3s_binary_needs_a_digest_for_every_release_the_spec_asks_for() {
        const V33: &str = "v1.33.4+k3s1";
        const V337: &str = "v1.33.7+k3s3";
        let d33 = "ab".repeat(32);
        let d337 = "cd".repeat(32);
        let errors = |s: &ClusterSpec| -> Vec<(String, String)> {
            s.validate()
                .err()
                .map(|e| e.0.into_iter().map(|e| (e.field, e.message)).collect())
                .unwrap_or_default()
        };
        // None set: install.sh checks the binary against the release's hash file, as before.
        let plain = spec();
        assert_eq!(errors(&plain), []);
        assert_eq!(plain.k3s_binary_sha256(V33), Ok(None));

        let mut pinned = spec();
        pinned.k3s.binary_sha256.insert(V33.into(), d33.clone());
        assert_eq!(errors(&pinned), []);
        assert_eq!(pinned.k3s_binary_sha256(V33), Ok(Some(d33.as_str())));

        // An upgrade: the new release without its digest is refused, saying what to add...
        let mut upgraded = pinned.clone();
        upgraded.k3s.version = V337.into();
        let want = format!(
            "has digests for other releases but not for {V337}, so its nodes would run a binary nothing here checks; \
             add `{V337}: <sha256>`: the `k3s` line of https://github.com/k3s-io/k3s/releases/download/{V337}/sha256sum-amd64.txt, \
             compared with a second source (README \"Node software\"), or remove k3s.binary_sha256"
        );
        assert_eq!(errors(&upgraded), [("k3s.binary_sha256".to_owned(), want)]);
        // ...and a member of it is never checked against the old release's digest.
        assert!(upgraded.k3s_binary_sha256(V337).is_err());
        upgraded.k3s.binary_sha256.insert(V337.into(), d337.clone());
        assert_eq!(errors(&upgraded), []);
        assert_eq!(upgraded.k3s_binary_sha256(V337), Ok(Some(d337.as_str())));
        assert_eq!(upgraded.k3s_binary_sha256(V33), Ok(Some(d33.as_str())));
        // A release a roll keeps a pool at, once its digest is gone: no member of it.
        let mut dropped = upgraded.clone();
        dropped.k3s.binary_sha256.remove(V33);
        assert_eq!(errors(&dropped), []);
        let e = dropped.k3s_binary_sha256(V33).unwrap_err();
        assert!(e.contains(&format!("add `{V33}: <sha256>`")), "{e}");

        // A pool's own release and an upgrade.path step need theirs too.
        let mut pools = pinned.clone();
        pools.worker_pools[0].k3s_version = Some("v1.33.1+k3s1".into());
        pools.k3s.version = "v1.35.0+k3s1".into();
        pools.k3s.installer_url = Some("https://mirror.example/install.sh".into());
        pools.k3s.installer_sha256 = Some("ef".repeat(32));
        pools.upgrade.path = vec!["v1.34.1+k3s1".into()];
        let missing: Vec<String> = errors(&pools)
            .into_iter()
            .map(|(f, m)| {
                assert_eq!(f, "k3s.binary_sha256");
                m.split(" so its nodes")
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            missing,
            [
                "has digests for other releases but not for v1.35.0+k3s1,",
                "has digests for other releases but not for v1.33.1+k3s1,",
                "has digests for other releases but not for v1.34.1+k3s1,",
            ]
        );

        // Malformed entries, each named.
        let mut bad = pinned.clone();
        bad.k3s.binary_sha256.insert("latest".into(), d33.clone());
        bad.k3s.binary_sha256.insert(V33.into(), "ab".repeat(31));
        let errs = errors(&bad);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs.iter().all(|(f, _)| f == "k3s.binary_sha256"),
            "{errs:?}"
        );
        assert!(
            errs[0].1.contains("\"latest\" is not a k3s version"),
            "{errs:?}"
        );
        assert!(
            errs[1]
                .1
                .starts_with("v1.33.4+k3s1: must be a sha256 digest"),
            "{errs:?}"
        );

        // Pre-installed: the image's binary runs, nothing is downloaded.
        let mut pre = dropped.clone();
        pre.k3s.install = K3sInstall::Preinstalled;
        assert_eq!(pre.k3s_binary_sha256(V33), Ok(None));

        // The spec's YAML form round-trips, and an empty table is left out.
        let yaml = serde_saphyr::to_string(&upgraded).unwrap();
        assert!(yaml.contains("binary_sha256:"), "{yaml}");
        let back: ClusterSpec = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, upgraded);
        assert!(
            !serde_saphyr::to_string(&plain)
                .unwrap()
                .contains("binary_sha256")
        );
    }

    /// Issue 34 §7: which installer a spec's nodes run, with which digest, and which specs are
    /// refused (the field named) because nothing would pin what nodes run as root.
    #[test]
    fn the_k3s_installer_is_pinned_by_a_digest_or_the_spec_is_refused() {
        const KNOWN: &str = "40b487f0d8ef4f5d1bf422e7bb6228cc7789c40ecc66c5ab067d396bbee9816e";
        const PINNED: &str = "https://raw.githubusercontent.com/k3s-io/k3s/0136cf258954a458da1404858396342724b93d24/install.sh";
        let mine = "ab".repeat(32);
        type Case = (
            &'static str,
            Option<&'static str>,
            bool,
            Result<(String, Option<String>), (&'static str, &'static str)>,
        );
        let cases: Vec<Case> = vec![
            // The default spec: the installer the controller knows, by commit and digest.
            (
                "v1.33.4+k3s1",
                None,
                false,
                Ok((PINNED.into(), Some(KNOWN.into()))),
            ),
            (
                "v1.34.11+k3s1",
                None,
                false,
                Ok((PINNED.into(), Some(KNOWN.into()))),
            ),
            // A version newer than every known installer: refused without a digest...
            (
                "v1.35.0+k3s1",
                None,
                false,
                Err((
                    "k3s.installer_sha256",
                    "not for v1.35.0+k3s1; set k3s.installer_url to https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh and k3s.installer_sha256 to that file's sha256",
                )),
            ),
            // ...and a digest needs the URL it is the digest of...
            (
                "v1.35.0+k3s1",
                None,
                true,
                Err((
                    "k3s.installer_url",
                    "k3s.installer_sha256 is the digest of the file at k3s.installer_url; set that too, e.g. https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh",
                )),
            ),
            // ...with which the version's own install.sh is checked against it.
            (
                "v1.35.0+k3s1",
                Some("https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh"),
                true,
                Ok((
                    "https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh".into(),
                    Some(mine.clone()),
                )),
            ),
            (
                "v1.33.4+k3s1",
                None,
                true,
                Err(("k3s.installer_url", "set that too")),
            ),
            // The floating get.k3s.io only with a digest.
            (
                "v1.33.4+k3s1",
                Some("https://get.k3s.io"),
                false,
                Err((
                    "k3s.installer_sha256",
                    "serves whatever install.sh is current",
                )),
            ),
            (
                "v1.33.4+k3s1",
                Some("https://get.k3s.io"),
                true,
                Ok(("https://get.k3s.io".into(), Some(mine.clone()))),
            ),
            // http:// only with a digest: the message says to give one or use https.
            (
                "v1.33.4+k3s1",
                Some("http://10.0.0.5/k3s/install.sh"),
                false,
                Err((
                    "k3s.installer_sha256",
                    "k3s.installer_url is http:// (\"http://10.0.0.5/k3s/install.sh\"), so its download can be changed on the way; give the file's sha256 here, or use https://",
                )),
            ),
            (
                "v1.33.4+k3s1",
                Some("http://10.0.0.5/k3s/install.sh"),
                true,
                Ok(("http://10.0.0.5/k3s/install.sh".into(), Some(mine.clone()))),
            ),
            // An https:// mirror too (audit security-2 N4): the URL is in the ConfigMap, so a
            // writer of it must not be able to hand every new VM any script.
            (
                "v1.33.4+k3s1",
                Some("https://mirror.example/k3s/install.sh"),
                false,
                Err((
                    "k3s.installer_sha256",
                    "k3s.installer_url \"https://mirror.example/k3s/install.sh\" is not the default installer, so nodes would run whatever it serves as root; give the file's sha256 here",
                )),
            ),
            (
                "v1.33.4+k3s1",
                Some("https://mirror.example/k3s/install.sh"),
                true,
                Ok((
                    "https://mirror.example/k3s/install.sh".into(),
                    Some(mine.clone()),
                )),
            ),
        ];
        for (version, url, digest, want) in cases {
            let mut s = spec();
            s.k3s.version = version.into();
            s.k3s.installer_url = url.map(str::to_owned);
            s.k3s.installer_sha256 = digest.then(|| mine.clone());
            let got = s.validate();
            match want {
                Ok((url, sha256)) => {
                    assert!(got.is_ok(), "{version} {url}: {got:?}");
                    assert_eq!(s.k3s_installer(), Installer { url, sha256 }, "{version}");
                }
                Err((field, message)) => {
                    let errs = got.expect_err(version);
                    assert_eq!(errs.0.len(), 1, "{errs}");
                    assert_eq!(errs.0[0].field, field, "{errs}");
                    assert!(
                        errs.0[0].message.contains(message),
                        "{version} {url:?}: {errs}"
                    );
                }
            }
        }
        // The newest version any pool asks for chooses the installer.
        let mut pools = spec();
        pools.worker_pools[0].k3s_version = Some("v1.35.0+k3s1".into());
        assert_eq!(pools.newest_k3s_version(), "v1.35.0+k3s1");
        assert_eq!(fields(&pools), ["k3s.installer_sha256"]);
        // Preinstalled k3s downloads no installer.
        pools.k3s.install = K3sInstall::Preinstalled;
        assert!(pools.validate().is_ok());
        // A spec stored before the pin (no installer_url) reads as the pinned installer and
        // writes back without one.
        let stored = spec().to_yaml();
        assert!(!stored.contains("installer_url"), "{stored}");
        assert_eq!(
            ClusterSpec::from_yaml(&stored).unwrap().k3s_installer().url,
            PINNED
        );
    }

    #[test]
    fn labels_the_kubelet_refuses_are_refused_naming_pool_and_label() {
        for refused in [
            "node-role.kubernetes.io/worker",
            "kubernetes.io/role",
            "example.k8s.io/x",
            "k8s.io/x",
        ] {
            assert!(kubelet_refuses_label(refused), "{refused}");
        }
        for allowed in [
            "node.kubernetes.io/pool",
            "kubelet.kubernetes.io/x",
            "foo.node.kubernetes.io/x",
            "topology.kubernetes.io/zone",
            "kubernetes.io/hostname",
            "example.com/role",
            "role",
            "notkubernetes.io/x",
        ] {
            assert!(!kubelet_refuses_label(allowed), "{allowed}");
        }
        let mut s = spec();
        s.worker_pools[0]
            .labels
            .insert("node-role.kubernetes.io/worker".into(), "true".into());
        let pool = s.worker_pools[0].name.clone();
        assert_eq!(
            fields(&s),
            [format!(
                "worker_pools.{pool}.labels.node-role.kubernetes.io/worker"
            )]
        );
        let msg = s.validate().unwrap_err().to_string();
        assert!(msg.contains("kubectl label"), "{msg}");
    }

    #[test]
    fn pools_must_fit_the_subnet_with_a_surge_member_each() {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 3, 10);
        // 3 servers + 1 surge, workers at max + 1 surge: 1,018 is all a /22 holds.
        spec.worker_pools[0].max = 1013;
        assert_eq!(spec.check_subnet(22), Ok(()));
        spec.worker_pools[0].max = 1014;
        let e = spec.check_subnet(22).unwrap_err();
        assert_eq!(e.field, "worker_pools.workers.max");
        assert!(
            e.message.contains("1019 members")
                && e.message.contains("control-plane 4, workers 1015")
                && e.message.contains("addresses for 1018"),
            "{e}"
        );
        // A larger subnet takes them.
        assert_eq!(spec.check_subnet(21), Ok(()));
    }

    #[test]
    fn critical_k3s_server_settings_cannot_change_once_recorded() {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 3, 2);
        let recorded = spec.server_settings();
        assert_eq!(recorded["disable-cloud-controller"], "false");
        assert_eq!(recorded["secrets-encryption"], "true");
        assert_eq!(spec.check_server_settings(&recorded), Ok(()));
        // A cluster recorded before a setting existed accepts whatever the spec says.
        assert_eq!(spec.check_server_settings(&BTreeMap::new()), Ok(()));
        spec.k3s.oxide_ccm = true;
        let e = spec.check_server_settings(&recorded).unwrap_err();
        assert_eq!(e.field, "k3s.oxide_ccm");
        assert!(
            e.message.contains("disable-cloud-controller=false")
                && e.message.contains("set k3s.oxide_ccm: false again"),
            "{e}"
        );
        // A record from before secrets-encryption was rendered: its servers run without it.
        let before = BTreeMap::from([("disable-cloud-controller".into(), "false".into())]);
        spec.k3s.oxide_ccm = false;
        let e = spec.check_server_settings(&before).unwrap_err();
        assert_eq!(e.field, "k3s.secrets_encryption");
        spec.k3s.secrets_encryption = false;
        assert_eq!(spec.check_server_settings(&before), Ok(()));
        spec.k3s.secrets_encryption = true;
        // Secrets encryption is a critical value too (audit security-2 N1).
        spec.k3s.secrets_encryption = false;
        let e = spec.check_server_settings(&recorded).unwrap_err();
        assert_eq!(e.field, "k3s.secrets_encryption");
        assert!(
            e.message.contains("secrets-encryption=true")
                && e.message.contains("set k3s.secrets_encryption: true again"),
            "{e}"
        );
    }

    #[test]
    fn server_settings_are_read_from_the_node_args_k3s_writes() {
        let read = |args: &str| {
            ClusterSpec::server_settings_from_node_args(args)
                .map(|s| s["disable-cloud-controller"].clone())
        };
        // The config file's keys as `--key`, `value` (k3s `configfilearg`), tokens redacted.
        assert_eq!(
            read(
                r#"["server","--token","********","--disable-cloud-controller","true","--cluster-init","true"]"#
            ),
            Some("true".into())
        );
        assert_eq!(
            read(r#"["server","--disable-cloud-controller","false"]"#),
            Some("false".into())
        );
        // A bare flag on the command line is set; the last one given wins.
        assert_eq!(
            read(r#"["server","--disable-cloud-controller","--cluster-init"]"#),
            Some("true".into())
        );
        assert_eq!(
            read(
                r#"["server","--disable-cloud-controller","true","--disable-cloud-controller","false"]"#
            ),
            Some("false".into())
        );
        // Never given: k3s's default.
        assert_eq!(
            read(r#"["server","--cluster-init","true"]"#),
            Some("false".into())
        );
        assert_eq!(read("not json"), None);
        assert_eq!(read(r#"{"server": true}"#), None);
        let encryption = |args: &str| {
            ClusterSpec::server_settings_from_node_args(args)
                .map(|s| s["secrets-encryption"].clone())
        };
        assert_eq!(
            encryption(r#"["server","--secrets-encryption","true"]"#),
            Some("true".into())
        );
        assert_eq!(encryption(r#"["server"]"#), Some("false".into()));
    }

    #[test]
    fn a_restore_installs_the_backups_release_and_image_not_the_pools() {
        let pool = ClusterSpec::new("c", "p", "old-image", 3, 2).control_plane;
        let mut t = crate::domain::backup::BackupTag::parse(
            "oxide-controller backup cluster=c k3s=v1.33.4+k3s1 time=2026-11-27T01:00:00Z sha256=ab token=cd bytes=7 image=ubuntu-2404-k3s",
        )
        .unwrap();
        t.k3s_version = "v1.34.1+k3s1".into();
        let (p, note) = restore_pool("b", &t, &pool).unwrap();
        assert_eq!(p.k3s_version.as_deref(), Some("v1.34.1+k3s1"));
        assert_eq!(p.image, "ubuntu-2404-k3s");
        assert_eq!(
            (p.count, p.cpus, &p.name),
            (pool.count, pool.cpus, &pool.name)
        );
        assert_eq!(note, None);
        // An older backup: its own older release (the restored spec upgrades afterwards).
        t.k3s_version = "v1.30.0+k3s1".into();
        t.image = None;
        let (p, note) = restore_pool("b", &t, &pool).unwrap();
        assert_eq!(p.k3s_version.as_deref(), Some("v1.30.0+k3s1"));
        assert_eq!(p.image, pool.image);
        let note = note.unwrap();
        assert!(
            note.contains("records no control-plane image") && note.contains(&pool.image),
            "{note}"
        );
        // No release recorded (bootstrap backup without a readable spec): refused.
        t.k3s_version = "unknown".into();
        let e = restore_pool("b", &t, &pool).unwrap_err();
        assert!(
            e.contains("Restore another backup") && e.contains("Nothing was changed"),
            "{e}"
        );
        t.k3s_version = "v1.33.4';reboot".into();
        assert!(restore_pool("b", &t, &pool).is_err());
    }
}
