//! Wiring: one simulator = the Oxide API ([`OxideSim`]) served over HTTP/1.1 on the listen
//! address, a real Kubernetes control plane per cluster, the simulated guests ([`Boot`]), the admin API on a second
//! loopback port, and optionally a preset cluster. [`Sim::start`] builds it in-process (tests);
//! the `oxide-sim` binary is a thin CLI over the same call.
//!
//! Owns start-up and shutdown order and the handle tests hold; the behaviour of each part lives
//! in its own module.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::guest::{Boot, BootConfig};
use crate::harness::admin::{self, AdminState};
pub use crate::harness::handle::SimHandle;
use crate::harness::preset::{self, Preset, PresetError};
use crate::oxide::{AddressPool, FaultSpec, Faults, OxideSim, OxideSimConfig, Timings};
use crate::support::net::{Listeners, spawn_http};
use crate::tailscale::{Tailnet, TailscaleOptions};

/// Everything a simulator is started with. `Default` gives fast timings, a random token, no
/// faults, SSH on port 22 (needs root; tests pass a high port) and no preset.
#[derive(Clone)]
pub struct SimOptions {
    /// Where the Oxide API listens (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Bearer token the API accepts; random when None.
    pub token: Option<String>,
    /// Instance lifecycle durations.
    pub timings: Timings,
    /// Faults active from the start (changeable at runtime through the admin API).
    pub faults: FaultSpec,
    /// Port the server VMs' sshd listens on.
    pub ssh_port: u16,
    /// From `running` to k3s starting.
    pub k3s_boot: Duration,
    /// From k3s starting (with a reachable server and the right token) to a Ready Node.
    pub k3s_join: Duration,
    /// Interval between k3s join attempts against an unreachable server URL.
    pub join_retry: Duration,
    /// k3s version reported when the install step does not pin one.
    pub k3s_version: String,
    /// Start with a running cluster.
    pub preset: Option<Preset>,
    /// Directory for files the simulator writes (the preset kubeconfig). None: a temporary
    /// directory removed on shutdown.
    pub state_dir: Option<PathBuf>,
    /// Run the cluster's CronJobs and Jobs as local processes of the binaries in this
    /// directory (see [`crate::jobs`]). None: Jobs are only stored, as without a kubelet.
    pub job_binaries: Option<PathBuf>,
    /// Run the Job pods inside this OCI runtime bundle of the product's image under `runc`
    /// instead (see [`crate::pods::oci_bundle`]). None: as `job_binaries` says.
    pub job_bundle: Option<PathBuf>,
    /// The simulated tailnet and its devices API (valid auth keys, API key, tailnet name).
    pub tailscale: TailscaleOptions,
    /// The newest Oxide `api-version` the rack serves (an older one makes it an older rack).
    pub api_version: String,
    /// How each cluster's real control plane runs ([`crate::control_plane`]): timings such as
    /// the node lifecycle controller's grace period.
    pub kubernetes: crate::control_plane::ControlPlaneOptions,
    /// How long k3s's leaf certificates are valid (365 days; shorter scales a year down).
    pub cert_lifetime: Duration,
}

impl std::fmt::Debug for SimOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimOptions")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("timings", &self.timings)
            .field("faults", &self.faults)
            .field("ssh_port", &self.ssh_port)
            .field("k3s_boot", &self.k3s_boot)
            .field("k3s_join", &self.k3s_join)
            .field("join_retry", &self.join_retry)
            .field("k3s_version", &self.k3s_version)
            .field("preset", &self.preset)
            .field("state_dir", &self.state_dir)
            .field("job_binaries", &self.job_binaries)
            .field("job_bundle", &self.job_bundle)
            .field("tailscale", &self.tailscale)
            .field("kubernetes", &self.kubernetes)
            .field("cert_lifetime", &self.cert_lifetime)
            .finish()
    }
}

impl Default for SimOptions {
    fn default() -> Self {
        let boot = BootConfig::default();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: None,
            timings: Timings::default(),
            faults: FaultSpec::default(),
            ssh_port: boot.ssh_port,
            k3s_boot: boot.k3s_boot,
            k3s_join: boot.k3s_join,
            join_retry: boot.join_retry,
            k3s_version: boot.k3s_version,
            preset: None,
            state_dir: None,
            job_binaries: None,
            job_bundle: None,
            tailscale: TailscaleOptions::default(),
            api_version: crate::oxide::SERVER_API_VERSION.to_owned(),
            kubernetes: Default::default(),
            cert_lifetime: boot.cert_lifetime,
        }
    }
}

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The state directory could not be prepared.
    #[error("cannot prepare the state directory {path}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The preset cluster could not be built.
    #[error("cannot build the preset cluster")]
    Preset(#[source] PresetError),
}

/// Entry point; see [`Sim::start`].
#[derive(Debug)]
pub struct Sim;

impl Sim {
    /// Starts a simulator on the current tokio runtime and returns once every listener is
    /// up (and, with a preset, once the preset cluster is Ready).
    pub async fn start(opts: SimOptions) -> Result<SimHandle, SimError> {
        // Every cluster's control plane runs `kcp` (tests/kube). Build it (or wait for another
        // process's build) now, before a caller starts any deadline: a cold build takes
        // minutes, and build.sh says so on stderr. A failure is only logged here; it is
        // reported with its cause when a cluster first needs the control plane.
        match tokio::task::spawn_blocking(crate::control_plane::kcp).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "no Kubernetes control plane binary"),
            Err(e) => tracing::warn!(error = %e, "locating the control plane binary panicked"),
        }
        let token = opts.token.clone().unwrap_or_else(random_token);
        let faults = Faults::default();
        faults.set(opts.faults.clone());
        let addresses = AddressPool::random();
        let listeners = Listeners::new();
        let boot = Boot::new(
            BootConfig {
                ssh_port: opts.ssh_port,
                k3s_boot: opts.k3s_boot,
                k3s_join: opts.k3s_join,
                join_retry: opts.join_retry,
                k3s_version: opts.k3s_version.clone(),
                kubernetes: opts.kubernetes.clone(),
                cert_lifetime: opts.cert_lifetime,
            },
            faults.clone(),
            listeners,
        );
        let oxide = OxideSim::new(
            OxideSimConfig {
                token: token.clone(),
                timings: opts.timings.clone(),
                faults: faults.clone(),
                addresses: addresses.clone(),
                api_version: opts.api_version.clone(),
            },
            Arc::new(boot.clone()),
        );
        boot.attach(oxide.clone());
        // The rack's VPC firewall judges every connection from the host to a VM's address.
        // The simulated sshd listens on `ssh_port` (unprivileged in tests) in place of the
        // guest's port 22, so the rules see 22 there, as they would on a rack.
        let judge = oxide.clone();
        let ssh_port = opts.ssh_port;
        boot.listeners().set_gate(Arc::new(move |peer, local| {
            let port = if local.port() == ssh_port {
                22
            } else {
                local.port()
            };
            judge
                .tcp_admitted(
                    crate::oxide::Peer::Host(peer),
                    SocketAddr::new(local.ip(), port),
                )
                .unwrap_or(true)
        }));
        let tailnet = Tailnet::new(&opts.tailscale);
        boot.attach_tailnet(tailnet.clone());

        let bind = |addr: SocketAddr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| SimError::Bind { addr, source })
        };
        let api_listener = bind(opts.listen).await?;
        let api_addr = api_listener.local_addr().map_err(|source| SimError::Bind {
            addr: opts.listen,
            source,
        })?;
        let admin_bind = SocketAddr::from(([127, 0, 0, 1], 0));
        let admin_listener = bind(admin_bind).await?;
        let admin_addr = admin_listener
            .local_addr()
            .map_err(|source| SimError::Bind {
                addr: admin_bind,
                source,
            })?;

        let tailscale_bind = SocketAddr::from(([127, 0, 0, 1], 0));
        let tailscale_listener = bind(tailscale_bind).await?;
        let tailscale_addr = tailscale_listener
            .local_addr()
            .map_err(|source| SimError::Bind {
                addr: tailscale_bind,
                source,
            })?;

        let releases_bind = SocketAddr::from(([127, 0, 0, 1], 0));
        let releases_listener = bind(releases_bind).await?;
        let releases_addr = releases_listener
            .local_addr()
            .map_err(|source| SimError::Bind {
                addr: releases_bind,
                source,
            })?;

        let mut tasks = Vec::new();
        let configured = opts.k3s_version.clone();
        let channels = crate::harness::channels::Channels::new();
        let release_url = format!("http://{releases_addr}{}", crate::harness::releases::PREFIX);
        let (served, base) = (channels.clone(), release_url.clone());
        tasks.push(spawn_http(releases_listener, move |req| {
            let (configured, channels, base) = (configured.clone(), served.clone(), base.clone());
            async move {
                if req
                    .uri()
                    .path()
                    .starts_with(crate::harness::channels::PREFIX)
                {
                    channels.handle(&req, &base)
                } else {
                    crate::harness::releases::handle(&req, &configured)
                }
            }
        }));
        let api_tailnet = tailnet.clone();
        tasks.push(spawn_http(tailscale_listener, move |req| {
            let tailnet = api_tailnet.clone();
            async move { tailnet.handle(req).await }
        }));
        let api = oxide.clone();
        tasks.push(spawn_http(api_listener, move |req| {
            let api = api.clone();
            async move { api.handle(req).await }
        }));
        let admin_state = Arc::new(AdminState {
            oxide: oxide.clone(),
            boot: boot.clone(),
            faults: faults.clone(),
            tailnet: tailnet.clone(),
        });
        tasks.push(spawn_http(admin_listener, move |req| {
            let state = admin_state.clone();
            async move { admin::handle(&state, req).await }
        }));
        tracing::info!(oxide = %api_addr, admin = %admin_addr, "oxide-sim listening");

        let mut handle = SimHandle {
            oxide_host: format!("http://{api_addr}"),
            oxide_token: token,
            admin_url: format!("http://{admin_addr}"),
            project: None,
            kubeconfig: None,
            tailscale_api_url: format!("http://{tailscale_addr}"),
            release_url,
            channel_url: format!("http://{releases_addr}{}", crate::harness::channels::PREFIX),
            channels,
            oxide,
            tailnet,
            tailscale_configured: !opts.tailscale.auth_keys.is_empty(),
            boot,
            addresses,
            faults,
            tasks,
            temp_dir: None,
        };

        if opts.preset.is_some() || opts.job_binaries.is_some() || opts.job_bundle.is_some() {
            let dir = match &opts.state_dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir).map_err(|source| SimError::StateDir {
                        path: dir.clone(),
                        source,
                    })?;
                    dir.clone()
                }
                None => {
                    let temp =
                        crate::support::scratch::tempdir("oxide-sim-").map_err(|source| {
                            SimError::StateDir {
                                path: std::env::temp_dir(),
                                source,
                            }
                        })?;
                    let path = temp.path().to_path_buf();
                    handle.temp_dir = Some(temp);
                    path
                }
            };
            // The real CronJob and Job controllers make the pods; only running them is ours
            // (with `job_binaries`). KWOK leaves our pods alone, so even without them the
            // runner plays the kubelet's part of a deletion: a deleted pod of ours that nothing
            // runs (the webhook's) goes, or a drain of its node never finishes.
            let runner = crate::pods::runner::PodRunner::new(
                handle.boot.clone(),
                opts.job_binaries.clone(),
                dir.clone(),
            )
            .with_bundle(opts.job_bundle.clone());
            handle.tasks.push(runner.spawn(Duration::from_millis(250)));
            if let Some(preset) = &opts.preset {
                let built = preset::build(&handle, preset, &dir)
                    .await
                    .map_err(SimError::Preset)?;
                handle.project = Some(built.project);
                handle.kubeconfig = Some(built.kubeconfig);
            }
        } else {
            // No Job pods to run (and so no work directory), but deletions still complete.
            let runner = crate::pods::runner::PodRunner::new(
                handle.boot.clone(),
                None,
                std::env::temp_dir(),
            );
            handle.tasks.push(runner.spawn(Duration::from_millis(250)));
        }
        Ok(handle)
    }
}

fn random_token() -> String {
    use rand::RngExt as _;
    let mut rng = rand::rng();
    let chars: Vec<char> = ('a'..='z').chain('0'..='9').collect();
    let body: String = (0..40)
        .map(|_| chars[rng.random_range(0..chars.len())])
        .collect();
    format!("oxide-token-{body}")
}
