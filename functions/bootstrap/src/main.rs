//! `bootstrap`: one command from a laptop to a running, self-maintaining k3s cluster on an
//! Oxide rack. Safe to interrupt and re-run at any point: a re-run adopts what exists.
//!
//! `bootstrap [FLAGS]` creates (or resumes) a cluster; the subcommand `bootstrap delete
//! --cluster NAME` removes one again (see `oxide_controller::workflows::delete`).
//!
//! Exit codes: 0 done (or still converging when `--wait` ran out: the CronJob carries on),
//! 1 a step failed (re-run to continue), 2 bad input or a state a person must resolve
//! (nothing is created when the input is bad), 143 (SIGTERM) or 130 (SIGINT) stopped on
//! request: the reconcile step stops at a safe point and gives its Lease back, any other step
//! is abandoned after a short wait (at once on a second signal); re-run to continue.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use oxide_controller::adapters::credentials::{CredentialFlags, CredentialSources};
use oxide_controller::adapters::tailscale::SecretString;
use oxide_controller::base::secrets::{SecretFlag, literal_secret_warnings};
use oxide_controller::base::shutdown::{Shutdown, Signal};
use oxide_controller::base::size::ByteSize;
use oxide_controller::base::telemetry::{self, LogFormat};
use oxide_controller::domain::spec::{ExternalIpMode, K3sInstall};
use oxide_controller::render::manifests::DEFAULT_CONTROLLER_IMAGE;
use oxide_controller::workflows::bootstrap::backup::{self, BackupInput};
use oxide_controller::workflows::bootstrap::recover::{self, RecoverInput};
use oxide_controller::workflows::bootstrap::{self, BootstrapInput, PoolInput, TailscaleFlags};
use oxide_controller::workflows::delete::{self, Confirm, DeleteInput};
use oxide_controller::workflows::error::{WorkflowError, chain};
use oxide_controller::workflows::live::LiveConnect;

/// A secret given as a flag (the value or `file:PATH`): `Debug` never shows it.
#[derive(Clone)]
struct SecretArg(String);

impl std::str::FromStr for SecretArg {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(SecretArg(s.to_owned()))
    }
}

impl std::fmt::Debug for SecretArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The flags that take a secret, and the environment variable that is the safer form.
const SECRET_FLAGS: [SecretFlag; 3] = [
    SecretFlag {
        flag: "--oxide-token",
        env: "OXIDE_TOKEN",
    },
    SecretFlag {
        flag: "--tailscale-auth-key",
        env: "OXIDE_CONTROLLER_TAILSCALE_AUTH_KEY",
    },
    SecretFlag {
        flag: "--tailscale-api-key",
        env: "TAILSCALE_API_KEY",
    },
];

/// Oxide credentials, the same for creating and deleting.
#[derive(Debug, clap::Args)]
struct OxideArgs {
    /// Oxide API URL, e.g. https://oxide.example.com (env OXIDE_HOST is read as the oxide CLI does).
    #[arg(long, value_name = "URL")]
    oxide_host: Option<String>,
    /// Oxide API token, or file:PATH to read it from a file (env OXIDE_TOKEN is read as the oxide CLI does).
    #[arg(long, value_name = "TOKEN|file:PATH")]
    oxide_token: Option<SecretArg>,
    /// Profile from ~/.config/oxide/credentials.toml (env OXIDE_PROFILE is read as the oxide CLI does).
    #[arg(long, value_name = "NAME", conflicts_with = "oxide_host")]
    oxide_profile: Option<String>,
}

impl OxideArgs {
    fn sources(self) -> CredentialSources {
        CredentialSources::from_process_env(CredentialFlags {
            host: self.oxide_host,
            token: self.oxide_token.map(|t| t.0),
            profile: self.oxide_profile,
        })
    }
}

/// Create a k3s cluster on an Oxide rack, with the CronJob and webhook that keep it healthy.
///
/// Oxide credentials are resolved like the `oxide` CLI does: --oxide-profile, or --oxide-host
/// with --oxide-token; else OXIDE_PROFILE, or OXIDE_HOST + OXIDE_TOKEN; else the
/// default-profile of ~/.config/oxide/config.toml (OXIDE_CONFIG_DIR moves that directory).
///
/// Without a subcommand, the flags create (or resume) a cluster; `delete` removes one.
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    args_override_self = true,
    propagate_version = true,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    disable_help_subcommand = true,
    after_help = "To delete a cluster again: bootstrap delete --cluster NAME (see bootstrap delete --help).\nWhen its API stops answering: bootstrap recover --cluster NAME --dry-run (see bootstrap recover --help)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Credentials for creating (`delete` has its own).
    #[command(flatten)]
    oxide: OxideArgs,
    /// The create flags, present when there is no subcommand. (Not nested in [`Args`] with
    /// the credentials: clap finds an `Option` of flattened flags only when they hold no
    /// flattened group themselves.)
    #[command(flatten)]
    create: Option<Args>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Delete a cluster, with everything of it on the rack and the local files bootstrap wrote.
    ///
    /// Its VMs, disks, addresses, groups and leftovers on the rack go, then the kubeconfig
    /// context and resume file bootstrap wrote. Only what is provably the cluster's
    /// (description tags, exact names) is touched; --dry-run lists it, with the reason for each.
    #[command(args_override_self = true)]
    Delete(DeleteArgs),
    /// Bring back a cluster whose API stopped answering, from this machine.
    ///
    /// Needs only the rack, the resume file and the kubeconfig bootstrap wrote. Takes the first
    /// rung that applies: 0, the API is ready (nothing to do); 1, a majority of the servers
    /// exist: start the stopped or failed ones and wait for /readyz (no data lost), then
    /// reconcile; 2, fewer than a majority: k3s's cluster reset on a survivor (with --yes);
    /// 3, no server left: restore from a backup (with --backup latest|NAME --yes).
    #[command(args_override_self = true)]
    Recover(RecoverArgs),
    /// Take a backup of the cluster's datastore now and keep it on the rack.
    ///
    /// Runs k3s's on-demand etcd snapshot on the server holding the API address (over SSH,
    /// with the resume file's key and pinned host keys), reads it back, and stores it with a
    /// manifest as an Oxide snapshot named <cluster>-etcd-<time>; then deletes the backups the
    /// spec's `backup` retention does not keep (default: the newest 24, and one a day for 7
    /// days). `bootstrap recover --backup` restores one; `bootstrap delete` keeps them unless
    /// given --delete-backups.
    #[command(args_override_self = true)]
    Backup(BackupArgs),
    /// Renew this cluster's entry in your kubeconfig: a new client certificate.
    ///
    /// While the kubeconfig's certificate is valid: a new key and a CertificateSigningRequest
    /// (signer kubernetes.io/kube-apiserver-client) approved with that certificate, for the
    /// user oxide-controller:operator:<cluster>, bound to cluster-admin (the API refuses such
    /// requests for k3s's system:masters). Once it has ended (or when that fails): the current
    /// k3s.yaml read on the server holding the API address over SSH, with the resume file's
    /// key and pinned host keys. Either way this cluster's context, cluster and user in the
    /// kubeconfig are replaced and the rest kept. Every laptop command warns 30 days before
    /// the kubeconfig's certificate ends.
    #[command(args_override_self = true)]
    Kubeconfig(KubeconfigArgs),
    /// Replace the controller's SSH key on the cluster's nodes with a new one.
    ///
    /// An older controller kept the private key in the cluster's Secret, so it is in etcd
    /// snapshots and may be in backups: rotate it once after upgrading. Saves a new key pair in
    /// the resume file beside the old one, sets the Secret's ssh-public-key (new VMs authorize
    /// the new key), then on every running node this machine reaches (host keys pinned): adds
    /// the new key to the login user's authorized_keys, proves a login with it, removes the old
    /// key and proves it refused. Then the resume file keeps the new key only. Nodes it cannot
    /// reach are listed: they still accept the old key (replace them). A run cut short is
    /// finished by running it again.
    #[command(args_override_self = true)]
    RotateSshKey(BackupArgs),
    /// Replace the cluster's Oxide token with the one given now (a new login's profile, or
    /// --oxide-token file:PATH).
    ///
    /// Proves the new token first (it must reach the cluster's project; nothing changes
    /// otherwise), then writes it and its id into Secret kube-system/oxide-controller
    /// (oxide-token, oxide-token-id) and into the backup pod's copy. The next reconcile run
    /// uses it; the Oxide CCM needs a restart. Prints the old token's id to delete afterwards.
    #[command(args_override_self = true)]
    RotateOxideToken(BackupArgs),
}

/// The flags of `bootstrap` without a subcommand: create a cluster.
#[derive(Debug, clap::Args)]
struct Args {
    /// Cluster name: prefix of every VM name and the kubeconfig context name.
    #[arg(long, env = "OXIDE_CONTROLLER_CLUSTER")]
    cluster: String,
    /// Oxide project to create the cluster in (created if missing). Default: the cluster name.
    #[arg(long, env = "OXIDE_CONTROLLER_PROJECT")]
    project: Option<String>,

    /// Number of control-plane VMs (k3s servers, etcd members); must be odd.
    #[arg(long, default_value_t = 3)]
    control_planes: u32,
    /// Number of worker VMs.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// vCPUs of each control-plane VM.
    #[arg(long, default_value_t = 2)]
    control_plane_cpus: u16,
    /// Memory of each control-plane VM, whole GiB (e.g. 8GiB).
    #[arg(long, default_value = "4GiB", value_name = "SIZE")]
    control_plane_memory: ByteSize,
    /// Boot disk of each control-plane VM, whole GiB.
    #[arg(long, default_value = "20GiB", value_name = "SIZE")]
    control_plane_boot_disk: ByteSize,
    /// Data disk of each control-plane VM (mounted at /var/lib/rancher), whole GiB. Default: none.
    #[arg(long, value_name = "SIZE")]
    control_plane_data_disk: Option<ByteSize>,
    /// Keep tenant pods off the servers: they register tainted CriticalAddonsOnly=true:NoExecute
    /// (k3s's documented dedicated control plane). k3s's packaged add-ons and our own pods
    /// tolerate it; a cluster then needs workers for everything else. The default whenever
    /// --workers is above 0.
    #[arg(long, conflicts_with = "shared_servers")]
    dedicated_servers: bool,
    /// Let tenant pods run on the servers too, beside the controller's pods and k3s's files
    /// (the default only without workers): for small labs.
    #[arg(long)]
    shared_servers: bool,
    /// vCPUs of each worker VM.
    #[arg(long, default_value_t = 2)]
    worker_cpus: u16,
    /// Memory of each worker VM, whole GiB.
    #[arg(long, default_value = "4GiB", value_name = "SIZE")]
    worker_memory: ByteSize,
    /// Boot disk of each worker VM, whole GiB.
    #[arg(long, default_value = "20GiB", value_name = "SIZE")]
    worker_boot_disk: ByteSize,
    /// Data disk of each worker VM, whole GiB. Default: none.
    #[arg(long, value_name = "SIZE")]
    worker_data_disk: Option<ByteSize>,

    /// Boot image name, looked up in the project, then the silo.
    #[arg(long, env = "OXIDE_CONTROLLER_IMAGE")]
    image: String,
    /// Where to upload --image from when it does not exist: a local raw disk image, or an http(s) URL.
    #[arg(long, value_name = "FILE|URL")]
    image_source: Option<String>,
    /// sha256 (hex) the --image-source must have: checked as it uploads, before the image is
    /// made; a mismatch exits 2 and imports nothing. Required for an http:// source.
    #[arg(long, value_name = "HEX", requires = "image_source")]
    image_source_sha256: Option<String>,
    /// Boot image of the workers. Default: --image.
    #[arg(long)]
    worker_image: Option<String>,
    /// Where to upload --worker-image from when it does not exist.
    #[arg(long, value_name = "FILE|URL")]
    worker_image_source: Option<String>,
    /// sha256 (hex) the --worker-image-source must have, as for --image-source-sha256.
    #[arg(long, value_name = "HEX", requires = "worker_image_source")]
    worker_image_source_sha256: Option<String>,
    /// Bulk writes in flight while uploading an image.
    #[arg(long, default_value_t = 8)]
    upload_parallelism: usize,

    /// Which VMs get an ephemeral external IP (the API always gets a floating IP):
    /// `servers` (the default: the servers, which this machine reaches for upgrades and
    /// `dev:` copies; workers reach out through the rack's SNAT address), `ephemeral` (every
    /// VM, workers too) or `none`.
    #[arg(long, value_enum, default_value_t = ExternalIp::Servers)]
    external_ip: ExternalIp,
    /// IP pool for the floating and ephemeral IPs. Default: the silo's default pool.
    #[arg(long)]
    ip_pool: Option<String>,
    /// Your SSH public key for the nodes' login user, or file:PATH (e.g. file:~/.ssh/id_ed25519.pub).
    #[arg(
        long,
        value_name = "KEY|file:PATH",
        env = "OXIDE_CONTROLLER_USER_SSH_PUBLIC_KEY"
    )]
    user_ssh_public_key: Option<String>,
    /// Node login user (with passwordless sudo) the controller uses over SSH.
    #[arg(long, default_value = "ubuntu")]
    ssh_user: String,
    /// Port sshd listens on in the VMs. Nothing configures sshd or the firewall for it: the
    /// image's sshd must already listen there, and the VPC's default rules admit only 22.
    #[arg(long, default_value_t = 22)]
    ssh_port: u16,

    /// k3s version to install.
    #[arg(long, default_value = "v1.33.4+k3s1")]
    k3s_version: String,
    /// `script`: download k3s at first boot; `preinstalled`: the image has k3s (air-gapped racks).
    #[arg(long, value_enum, default_value_t = Install::Script)]
    k3s_install: Install,
    /// Where nodes download k3s's install.sh (k3s.installer_url). Default: the install.sh this
    /// controller knows by digest for --k3s-version, fetched by its k3s-io/k3s commit.
    #[arg(long, value_name = "URL")]
    k3s_installer_url: Option<String>,
    /// sha256 (hex) of the file at --k3s-installer-url (k3s.installer_sha256); nodes check it
    /// before running it. Required for an http:// URL, and for a --k3s-version newer than
    /// every installer this controller knows.
    #[arg(long, value_name = "HEX", requires = "k3s_installer_url")]
    k3s_installer_sha256: Option<String>,
    /// sha256 (hex) of --k3s-version's amd64 k3s binary (k3s.binary_sha256): nodes download
    /// the binary themselves, check it and run install.sh with INSTALL_K3S_SKIP_DOWNLOAD=true.
    /// The `k3s` line of the release's sha256sum-amd64.txt, compared with a second source.
    #[arg(long, value_name = "HEX")]
    k3s_binary_sha256: Option<String>,

    /// Where to write the kubeconfig. Default: ~/.kube/<cluster>.yaml.
    #[arg(long, env = "OXIDE_CONTROLLER_KUBECONFIG", value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Replace an existing file at --kubeconfig.
    #[arg(long, conflicts_with = "kubeconfig_merge")]
    kubeconfig_overwrite: bool,
    /// Add the cluster to an existing kubeconfig at --kubeconfig as context <cluster>.
    #[arg(long)]
    kubeconfig_merge: bool,

    /// Reconcile CronJob schedule (five-field cron).
    #[arg(long, default_value = "*/5 * * * *")]
    schedule: String,
    /// When the cluster backs its datastore up onto the rack from inside (the spec's
    /// backup.schedule: k3s's snapshot schedule on the servers and the backup CronJob's),
    /// five-field cron; `off` for none (`bootstrap backup` still works).
    #[arg(long, default_value = oxide_controller::domain::backup::DEFAULT_SCHEDULE)]
    backup_schedule: String,
    /// Image of the in-cluster CronJob and webhook (NAME:TAG, or NAME@sha256:<64 hex> to pin
    /// it by digest), or dev:PATH[:linux/amd64] to build the binaries from the cargo workspace
    /// at PATH, copy them to the control-plane VMs over SSH and run them from there (hostPath)
    /// instead of pulling an image.
    #[arg(long, env = "OXIDE_CONTROLLER_CONTROLLER_IMAGE", default_value = DEFAULT_CONTROLLER_IMAGE)]
    controller_image: String,
    /// Cargo profile of a --controller-image dev:PATH build (`dev` builds much faster).
    /// Default: release.
    #[arg(long, value_name = "PROFILE")]
    dev_build_profile: Option<String>,
    /// Leave cloud-provider duties to the Oxide cloud controller manager: k3s runs with
    /// disable-cloud-controller and kubelet cloud-provider=external, and bootstrap installs the
    /// CCM from its published manifest (it reads the oxide-host/-token/-project Secret keys).
    #[arg(long)]
    oxide_ccm: bool,
    /// Image of the Oxide cloud controller manager (with --oxide-ccm; NAME@sha256:<64 hex> pins
    /// it by digest). Default: the release the embedded manifest names, by tag.
    #[arg(long, value_name = "IMAGE")]
    oxide_ccm_image: Option<String>,

    /// Directory of the resume file <cluster>.json (keys and tokens). Default: ~/.config/oxide-controller.
    #[arg(long, env = "OXIDE_CONTROLLER_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Seconds to wait for every requested VM to be a Ready node (0: one reconcile pass).
    #[arg(long, default_value_t = 900, value_name = "SECONDS")]
    wait: u64,
    /// Seconds to wait for the first server's API, host keys and SSH.
    #[arg(long, default_value_t = 900, value_name = "SECONDS")]
    api_timeout: u64,
    /// Who may reach the Kubernetes API (tcp/6443) through the VPC firewall: comma-separated
    /// CIDRs or addresses, kept in the rule <cluster>-k8s-api of the project's VPC. The
    /// default 0.0.0.0/0 exposes the API (TLS, client certificates and tokens required) to
    /// every address that can reach the floating IP; give your own network to narrow it.
    /// Nodes join over the VPC and need no entry here.
    #[arg(long, env = "OXIDE_CONTROLLER_API_ALLOW", value_name = "CIDR,...", default_value = oxide_controller::domain::firewall::DEFAULT_API_ALLOW)]
    api_allow: String,
    /// Who may reach SSH (tcp/22) of the project's VMs through the VPC firewall:
    /// comma-separated CIDRs or addresses, kept in the rules <cluster>-ssh and
    /// <cluster>-ssh-deny (the VPC's default allow-ssh admits anywhere; ours come first).
    /// Default: the address this machine sends from toward the rack's API, which is what the
    /// rack sees unless a NAT lies between; behind one, give the NAT's public address.
    #[arg(long, env = "OXIDE_CONTROLLER_SSH_ALLOW", value_name = "CIDR,...")]
    ssh_allow: Option<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto, env = "OXIDE_CONTROLLER_LOG_FORMAT")]
    log_format: LogFormat,

    /// Tailscale auth key the VMs join the tailnet with (before k3s starts), or file:PATH.
    /// Stored in the cluster Secret. Needs --tailscale-api-key and --tailscale-tailnet.
    #[arg(
        long,
        value_name = "KEY|file:PATH",
        env = "OXIDE_CONTROLLER_TAILSCALE_AUTH_KEY",
        hide_env_values = true
    )]
    tailscale_auth_key: Option<SecretArg>,
    /// Tailscale API access token (allowed to list devices), or file:PATH; bootstrap finds the
    /// first control plane's tailnet address with it. Never stored. Default: $TAILSCALE_API_KEY.
    #[arg(long, value_name = "KEY|file:PATH")]
    tailscale_api_key: Option<SecretArg>,
    /// Tailnet to look the VMs up in (e.g. example.com, or - for the API key's own).
    /// Default: $TAILSCALE_TAILNET.
    #[arg(long, value_name = "TAILNET")]
    tailscale_tailnet: Option<String>,
    /// ACL tag the VMs advertise, NAME or tag:NAME. Default: tag:ainekko-k8s-node.
    #[arg(long, value_name = "TAG")]
    tailscale_tag: Option<String>,
    /// Base URL of the Tailscale API. Default: https://api.tailscale.com.
    #[arg(long, value_name = "URL")]
    tailscale_api_url: Option<String>,
    /// Seconds a VM's `tailscale up` waits to join before its setup fails with the reason
    /// (a key that needs device approval, an unreachable control server). Default: 300.
    #[arg(long, value_name = "SECONDS")]
    tailscale_up_timeout: Option<u32>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExternalIp {
    Servers,
    Ephemeral,
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Install {
    Script,
    Preinstalled,
}

/// Which cluster a laptop command acts on, and the local files bootstrap wrote for it.
#[derive(Debug, clap::Args)]
struct ClusterFiles {
    /// The cluster.
    #[arg(long, env = "OXIDE_CONTROLLER_CLUSTER")]
    cluster: String,
    /// Its Oxide project. Default: the one in the resume file, else the cluster name.
    #[arg(long, env = "OXIDE_CONTROLLER_PROJECT")]
    project: Option<String>,
    /// The kubeconfig bootstrap wrote (context <cluster>). Default: ~/.kube/<cluster>.yaml.
    #[arg(long, env = "OXIDE_CONTROLLER_KUBECONFIG", value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Directory of the resume file. Default: ~/.config/oxide-controller.
    #[arg(long, env = "OXIDE_CONTROLLER_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

/// The flags of `bootstrap delete`.
#[derive(Debug, clap::Args)]
struct DeleteArgs {
    #[command(flatten)]
    oxide: OxideArgs,
    #[command(flatten)]
    local: ClusterFiles,
    /// List what would be deleted and why, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Do not ask for the cluster name to be typed (needed without a terminal).
    #[arg(long)]
    yes: bool,
    /// Also delete the images bootstrap uploaded for this cluster.
    #[arg(long)]
    delete_images: bool,
    /// Also delete the cluster's backups (`bootstrap backup`); without it they stay on the
    /// rack, listed, so `bootstrap recover --backup` can bring the cluster back.
    #[arg(long)]
    delete_backups: bool,
    /// Also delete the project, when nothing else is left in it.
    #[arg(long)]
    delete_project: bool,
    /// Instances removed at once.
    #[arg(long, default_value_t = delete::DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Seconds to wait for instances to stop and disks to detach before giving up (re-run to continue).
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    timeout: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto, env = "OXIDE_CONTROLLER_LOG_FORMAT")]
    log_format: LogFormat,
}

/// The flags of `bootstrap recover`.
#[derive(Debug, clap::Args)]
struct RecoverArgs {
    #[command(flatten)]
    oxide: OxideArgs,
    #[command(flatten)]
    local: ClusterFiles,
    /// Print the rung and every call it would make, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take rung 2 (fewer than a majority of the servers left): k3s's cluster reset on the
    /// survivor, which deletes the other servers with their disks; or, with --backup, the
    /// restore. Without it, both exit 2 saying what they would do.
    #[arg(long)]
    yes: bool,
    /// Rung 3, no server left: restore the cluster from a backup (`latest`, or a backup's name
    /// as `bootstrap backup` and `bootstrap delete` list them). Checks first, changing nothing,
    /// that the backup was taken with the resume file's server token (exit 2 if not) and that
    /// no server of the cluster is left; then a new first server restores the datastore from
    /// it, the API address moves to it, and reconcile brings the other servers and the workers
    /// back. Whatever was written after the backup is lost.
    #[arg(long, value_name = "latest|NAME")]
    backup: Option<String>,
    /// A restore drill, touching nothing of the cluster: restore the newest backup (or the
    /// --backup given) into a throw-away server with no agent, under a temporary name and
    /// address, wait for its /readyz, compare its object count with the backup's, print how
    /// long the restore took, and delete everything it made. Exit 1 when the backup does not
    /// restore.
    #[arg(long)]
    verify: bool,
    /// Seconds the started servers get to make the API ready.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    api_timeout: u64,
    /// Seconds the reconcile passes afterwards may take in all.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    wait: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto, env = "OXIDE_CONTROLLER_LOG_FORMAT")]
    log_format: LogFormat,
}

/// The flags of `bootstrap backup`.
#[derive(Debug, clap::Args)]
struct BackupArgs {
    #[command(flatten)]
    oxide: OxideArgs,
    #[command(flatten)]
    local: ClusterFiles,
    /// Seconds the whole command may take.
    #[arg(long, default_value_t = 900, value_name = "SECONDS")]
    timeout: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto, env = "OXIDE_CONTROLLER_LOG_FORMAT")]
    log_format: LogFormat,
}

/// The flags of `bootstrap kubeconfig`.
#[derive(Debug, clap::Args)]
struct KubeconfigArgs {
    #[command(flatten)]
    common: BackupArgs,
    /// How to renew: `csr` through the API with the current certificate (it must still be
    /// valid), `ssh` from k3s.yaml over SSH (needs the rack and the resume file), `auto` the
    /// first while the certificate is valid and the second otherwise or when it fails.
    #[arg(long, value_enum, default_value_t = ViaArg::Auto)]
    via: ViaArg,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ViaArg {
    Auto,
    Csr,
    Ssh,
}

impl From<ViaArg> for oxide_controller::domain::operator_credential::Via {
    fn from(v: ViaArg) -> Self {
        match v {
            ViaArg::Auto => Self::Auto,
            ViaArg::Csr => Self::Csr,
            ViaArg::Ssh => Self::Ssh,
        }
    }
}

/// `Ok(args)`, or the exit code for help/version (0) and bad arguments (2, one line).
fn parse(argv: Vec<std::ffi::OsString>) -> Result<Cli, ExitCode> {
    match Cli::try_parse_from(argv) {
        Ok(a) => Ok(a),
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            // One line naming the problem; clap's own text adds usage and a hint.
            let text = e.render().to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
            eprintln!("{line}");
            Err(ExitCode::from(2))
        }
    }
}

fn json_logs(format: LogFormat) -> bool {
    match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::IsTerminal::is_terminal(&std::io::stderr()),
    }
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    for warning in literal_secret_warnings(&argv, &SECRET_FLAGS) {
        eprintln!("{warning}");
    }
    let cli = match parse(argv) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match (cli.command, cli.create) {
        (Some(Command::Delete(a)), _) => run_delete(a),
        (Some(Command::Recover(a)), _) => run_recover(a),
        (Some(Command::Backup(a)), _) => run_backup(a),
        (Some(Command::Kubeconfig(a)), _) => run_kubeconfig(a),
        (Some(Command::RotateSshKey(a)), _) => run_rotate_ssh_key(a),
        (Some(Command::RotateOxideToken(a)), _) => run_rotate_oxide_token(a),
        (None, Some(a)) => run_create(a, cli.oxide),
        // clap requires --cluster and --image without a subcommand; not reached.
        (None, None) => ExitCode::from(2),
    }
}

fn run_create(args: Args, oxide: OxideArgs) -> ExitCode {
    telemetry::init(args.log_format);
    let json_logs = json_logs(args.log_format);
    let input = input(args, oxide, json_logs);
    oxide_controller::base::telemetry::block_on(finish(input, json_logs))
}

async fn finish(mut input: BootstrapInput, json_logs: bool) -> ExitCode {
    let shutdown = Shutdown::on_signals();
    input.shutdown = shutdown.clone();
    let connect = LiveConnect::new();
    tokio::select! {
        done = bootstrap::run(input, &connect) => match done {
            Ok(summary) => {
                print!("{}", summary.render());
                ExitCode::SUCCESS
            }
            Err(e) => match shutdown.signal() {
                Some(signal) => stopped(signal, json_logs),
                None => report(&e, json_logs),
            },
        },
        signal = shutdown.abandon_after(STOP_WAIT) => stopped(signal, json_logs),
    }
}

/// How long bootstrap waits, once asked to stop, for the step under way to reach a safe point
/// (the reconcile step finishes or abandons its action and gives its Lease back) before it
/// abandons the step where it is; a second signal abandons at once.
const STOP_WAIT: Duration =
    oxide_controller::apply::ABANDON_AFTER.saturating_add(Duration::from_secs(5));

/// Reports a stop on request; exit 128 + the signal's number.
fn stopped(signal: Signal, json_logs: bool) -> ExitCode {
    let text = format!(
        "bootstrap stopped by {signal}; run it again with the same flags to continue (it adopts what exists)"
    );
    if json_logs {
        tracing::warn!(exit_code = signal.exit_code(), "{text}");
    }
    eprintln!("{text}");
    ExitCode::from(signal.exit_code())
}

/// Prints why the workflow stopped, once: `error: <chain>` for a person, and in JSON log mode
/// a log line for the collector too. Returns the exit code its kind asks for.
fn report(e: &WorkflowError, json_logs: bool) -> ExitCode {
    let text = chain(e);
    if json_logs {
        tracing::error!(exit_code = e.exit_code(), step = e.step_name(), "{text}");
    }
    eprintln!("error: {text}");
    ExitCode::from(e.exit_code())
}

fn input(a: Args, oxide: OxideArgs, json_logs: bool) -> BootstrapInput {
    BootstrapInput {
        credential_sources: oxide.sources(),
        cluster: a.cluster,
        project: a.project,
        control_planes: a.control_planes,
        workers: a.workers,
        dedicated_servers: match (a.dedicated_servers, a.shared_servers) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        control_plane: PoolInput {
            cpus: a.control_plane_cpus,
            memory: a.control_plane_memory,
            boot_disk: a.control_plane_boot_disk,
            data_disk: a.control_plane_data_disk,
        },
        worker: PoolInput {
            cpus: a.worker_cpus,
            memory: a.worker_memory,
            boot_disk: a.worker_boot_disk,
            data_disk: a.worker_data_disk,
        },
        image: a.image,
        image_source: a.image_source,
        image_source_sha256: a.image_source_sha256,
        worker_image: a.worker_image,
        worker_image_source: a.worker_image_source,
        worker_image_source_sha256: a.worker_image_source_sha256,
        external_ip: match a.external_ip {
            ExternalIp::Servers => ExternalIpMode::Servers,
            ExternalIp::Ephemeral => ExternalIpMode::Ephemeral,
            ExternalIp::None => ExternalIpMode::None,
        },
        ip_pool: a.ip_pool,
        user_ssh_public_key: a.user_ssh_public_key,
        k3s_version: a.k3s_version,
        k3s_installer_url: a.k3s_installer_url,
        k3s_installer_sha256: a.k3s_installer_sha256,
        k3s_binary_sha256: a.k3s_binary_sha256,
        k3s_install: match a.k3s_install {
            Install::Script => K3sInstall::Script,
            Install::Preinstalled => K3sInstall::Preinstalled,
        },
        kubeconfig: a.kubeconfig,
        kubeconfig_overwrite: a.kubeconfig_overwrite,
        kubeconfig_merge: a.kubeconfig_merge,
        schedule: a.schedule,
        backup_schedule: Some(a.backup_schedule).filter(|s| s.trim() != "off"),
        controller_image: a.controller_image,
        dev_build_profile: a.dev_build_profile,
        oxide_ccm: a.oxide_ccm,
        oxide_ccm_image: a.oxide_ccm_image,
        ssh_user: a.ssh_user,
        ssh_port: a.ssh_port,
        upload_parallelism: a.upload_parallelism,
        state_dir: a.state_dir,
        wait: Duration::from_secs(a.wait),
        api_timeout: Duration::from_secs(a.api_timeout),
        api_allow: a.api_allow,
        ssh_allow: a.ssh_allow,
        holder: holder("bootstrap"),
        shutdown: Shutdown::new(),
        home: std::env::home_dir(),
        json_logs,
        tailscale: TailscaleFlags {
            auth_key: a.tailscale_auth_key.map(|k| SecretString::new(k.0)),
            api_key: a.tailscale_api_key.map(|k| SecretString::new(k.0)),
            tailnet: a.tailscale_tailnet,
            tag: a.tailscale_tag,
            api_url: a.tailscale_api_url,
            up_timeout_seconds: a.tailscale_up_timeout,
            ..TailscaleFlags::default()
        }
        .with_process_env(),
    }
}

fn run_delete(a: DeleteArgs) -> ExitCode {
    telemetry::init(a.log_format);
    let json_logs = json_logs(a.log_format);
    let input = DeleteInput {
        credential_sources: a.oxide.sources(),
        cluster: a.local.cluster,
        project: a.local.project,
        kubeconfig: a.local.kubeconfig,
        state_dir: a.local.state_dir,
        home: std::env::home_dir(),
        dry_run: a.dry_run,
        confirm: if a.yes { Confirm::Yes } else { Confirm::Ask },
        delete_images: a.delete_images,
        delete_backups: a.delete_backups,
        delete_project: a.delete_project,
        concurrency: a.concurrency,
        timeout: Duration::from_secs(a.timeout),
        holder: holder("bootstrap-delete"),
        json_logs,
    };
    oxide_controller::base::telemetry::block_on(async move {
        match delete::run(input, &LiveConnect::new()).await {
            Ok(summary) => {
                print!("{}", summary.render());
                ExitCode::SUCCESS
            }
            Err(e) => report(&e, json_logs),
        }
    })
}

fn run_recover(a: RecoverArgs) -> ExitCode {
    telemetry::init(a.log_format);
    let json_logs = json_logs(a.log_format);
    oxide_controller::base::telemetry::block_on(async move {
        let shutdown = Shutdown::on_signals();
        let input = RecoverInput {
            credential_sources: a.oxide.sources(),
            cluster: a.local.cluster,
            project: a.local.project,
            kubeconfig: a.local.kubeconfig,
            state_dir: a.local.state_dir,
            home: std::env::home_dir(),
            dry_run: a.dry_run,
            yes: a.yes,
            backup: a.backup,
            verify: a.verify,
            api_timeout: Duration::from_secs(a.api_timeout),
            wait: Duration::from_secs(a.wait),
            holder: holder("bootstrap-recover"),
            shutdown: shutdown.clone(),
        };
        match recover::run(input, &LiveConnect::new()).await {
            Ok(summary) => {
                print!("{}", summary.render());
                ExitCode::SUCCESS
            }
            Err(e) => match shutdown.signal() {
                Some(signal) => stopped(signal, json_logs),
                None => report(&e, json_logs),
            },
        }
    })
}

fn run_backup(a: BackupArgs) -> ExitCode {
    laptop(a, |input| async move {
        backup::run(input, &LiveConnect::new())
            .await
            .map(|s| s.render())
    })
}

fn run_kubeconfig(a: KubeconfigArgs) -> ExitCode {
    use oxide_controller::workflows::bootstrap::renew_kubeconfig::{self, KubeconfigInput};
    let via = a.via.into();
    laptop(a.common, |files| async move {
        renew_kubeconfig::run(KubeconfigInput { files, via }, &LiveConnect::new())
            .await
            .map(|s| s.render())
    })
}

fn run_rotate_ssh_key(a: BackupArgs) -> ExitCode {
    use oxide_controller::workflows::bootstrap::rotate_ssh_key;
    laptop(a, |input| async move {
        rotate_ssh_key::run(input, &LiveConnect::new())
            .await
            .map(|s| s.render())
    })
}

fn run_rotate_oxide_token(a: BackupArgs) -> ExitCode {
    use oxide_controller::workflows::bootstrap::rotate_oxide_token;
    laptop(a, |input| async move {
        rotate_oxide_token::run(input, &LiveConnect::new())
            .await
            .map(|s| s.render())
    })
}

/// A laptop command on one cluster's local files (`backup`, `kubeconfig`, `rotate-ssh-key`,
/// `rotate-oxide-token`): its summary on
/// stdout, or the error reported.
fn laptop<F, Fut>(a: BackupArgs, run: F) -> ExitCode
where
    F: FnOnce(BackupInput) -> Fut,
    Fut: std::future::Future<
            Output = Result<String, oxide_controller::workflows::bootstrap::BootstrapError>,
        >,
{
    telemetry::init(a.log_format);
    let json_logs = json_logs(a.log_format);
    let input = BackupInput {
        credential_sources: a.oxide.sources(),
        cluster: a.local.cluster,
        project: a.local.project,
        kubeconfig: a.local.kubeconfig,
        state_dir: a.local.state_dir,
        home: std::env::home_dir(),
        timeout: Duration::from_secs(a.timeout),
    };
    oxide_controller::base::telemetry::block_on(async move {
        match run(input).await {
            Ok(summary) => {
                print!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => report(&e, json_logs),
        }
    })
}

/// Stable per machine (no pid): a re-run after a kill takes over its own reconcile Lease.
fn holder(what: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "laptop".to_owned());
    format!("{what}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    fn parsed(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("bootstrap").chain(args.iter().copied()))
    }

    /// Audit L4: the parsed arguments' `Debug` never shows a secret flag's value.
    #[test]
    fn debug_of_the_parsed_flags_hides_the_secrets() {
        let c = parsed(&[
            "--cluster",
            "demo",
            "--image",
            "noble",
            "--oxide-token",
            "oxide-token-s3cr3t",
            "--tailscale-auth-key",
            "tskey-auth-s3cr3t",
            "--tailscale-api-key",
            "tskey-api-s3cr3t",
        ])
        .unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn no_subcommand_creates_and_delete_is_a_subcommand() {
        let c = parsed(&["--cluster", "demo", "--image", "noble"]).unwrap();
        assert!(c.command.is_none());
        assert_eq!(c.create.map(|a| a.cluster).as_deref(), Some("demo"));
        let c = parsed(&["delete", "--cluster", "demo", "--yes"]).unwrap();
        match c.command {
            Some(Command::Delete(d)) => assert!(d.yes && d.local.cluster == "demo"),
            other => panic!("not the delete subcommand: {other:?}"),
        }
        let c = parsed(&["recover", "--cluster", "demo", "--dry-run"]).unwrap();
        match c.command {
            Some(Command::Recover(r)) => {
                assert!(r.dry_run && !r.yes && r.local.cluster == "demo")
            }
            other => panic!("not the recover subcommand: {other:?}"),
        }
        // Create flags do not mix with the subcommand, nor delete flags with create.
        assert!(parsed(&["--image", "noble", "delete", "--cluster", "demo"]).is_err());
        assert!(parsed(&["--cluster", "demo", "--image", "noble", "--yes"]).is_err());
        // Without a subcommand the create flags are required.
        let e = parsed(&[]).err().unwrap();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn kubeconfig_takes_via_auto_by_default_and_csr_or_ssh_when_asked() {
        use oxide_controller::domain::operator_credential::Via;
        let via = |args: &[&str]| match parsed(args).map(|c| c.command) {
            Ok(Some(Command::Kubeconfig(k))) => Ok(Via::from(k.via)),
            Ok(other) => panic!("not the kubeconfig subcommand: {other:?}"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(via(&["kubeconfig", "--cluster", "demo"]), Ok(Via::Auto));
        assert_eq!(
            via(&["kubeconfig", "--cluster", "demo", "--via", "csr"]),
            Ok(Via::Csr)
        );
        assert_eq!(
            via(&["kubeconfig", "--cluster", "demo", "--via", "ssh"]),
            Ok(Via::Ssh)
        );
        assert_eq!(
            via(&["kubeconfig", "--cluster", "demo", "--via", "scp"]),
            Err(clap::error::ErrorKind::InvalidValue)
        );
        // Only `kubeconfig` has it.
        assert!(parsed(&["backup", "--cluster", "demo", "--via", "csr"]).is_err());
    }

    #[test]
    fn help_lists_the_delete_subcommand_and_its_own_flags() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("delete"), "{help}");
        let e = parsed(&["delete", "--help"]).err().unwrap();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = e.render().to_string();
        for flag in ["--dry-run", "--delete-images", "--concurrency"] {
            assert!(text.contains(flag), "{flag}: {text}");
        }
        assert!(!text.contains("--control-planes"), "{text}");
    }
}
