//! A real Kubernetes control plane for the tests: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler built from their official Go modules at the
//! version of the k3s the product installs (`tests/kube`, one multicall binary `kcp`), with
//! KWOK standing in for kubelets, as cluster-autoscaler's and Karpenter's tests do.
//!
//! Each [`ControlPlane`] is its own set of processes on its own loopback address with its
//! own PKI, so clusters live side by side; dropping it kills the processes (and `kcp` exits
//! by itself if the test process dies, see `KCP_PARENT_PID`). It is eventually consistent,
//! as a real cluster is: tests wait on conditions with deadlines ([`ControlPlane::wait_for`]).
//!
//! What the flags are and why is listed in `tests/FIDELITY.md` ("Kubernetes: real").

mod binary;
pub mod etcd;
mod objects;
pub mod pki;
pub mod proxy;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt as _;
use tokio::process::{Child, Command};

pub use binary::{KCP_ENV, RELEASE_ETCD, etcd_binary, etcd_version_for, kcp};
pub use objects::ObjectError;

/// KWOK's pod stages (see the file's header).
const KWOK_STAGES: &str = include_str!("kwok-stages.yaml");

/// The Kubernetes version the control plane reports (the product's default k3s).
pub const KUBERNETES_VERSION: &str = "v1.33.4+k3s1";
/// The apiserver's port, as on a k3s server.
pub const API_PORT: u16 = 6443;
/// The in-cluster Service CIDR k3s uses by default (`--service-cidr`).
pub const SERVICE_CIDR: &str = "10.43.0.0/16";
/// KWOK manages only Nodes with this label (`--manage-nodes-with-label-selector`), so a test
/// decides which Nodes have a "kubelet" (and takes it away: the VM stopped). A label, not an
/// annotation: KWOK filters annotation selectors itself and never lets go of a Node that
/// stops matching (kwok@v0.7.0 pkg/utils/informer/event.go:87-111, informer.go:152-158),
/// while a label selector goes to the apiserver, whose watch reports a Node that stops
/// matching as deleted (event.go:69-72), so KWOK drops it and its pods (node_controller.go
/// :201-216, pod_controller.go:397-399).
pub const KWOK_LABEL: &str = "kwok.x-k8s.io/node";
/// The value of [`KWOK_LABEL`] KWOK selects and keeps heartbeating.
pub const KWOK_LABEL_VALUE: &str = "fake";
/// The value of [`KWOK_LABEL`] for a Node whose VM stopped: KWOK lets go of it, so its
/// heartbeats stop (the node lifecycle controller takes over) and nothing plays its pods.
pub const KWOK_HALTED: &str = "halted";

/// Why a control plane could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// The `kcp` binary is missing and could not be built.
    #[error("the Kubernetes control plane binary: {0}")]
    Binary(String),
    /// A TLS configuration could not be built.
    #[error("TLS: {0}")]
    Tls(String),
    /// Certificate generation failed.
    #[error("control plane PKI: {what}")]
    Pki {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// A file in the control plane's directory could not be written.
    #[error("writing {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A component exited or never became ready; `log` is the tail of its output.
    #[error("{component} did not start: {why}\n--- last lines of {component}'s log ---\n{log}")]
    Component {
        component: &'static str,
        why: String,
        log: String,
    },
    /// The admin client could not be built from the kubeconfig.
    #[error("admin client: {0}")]
    Client(String),
    /// A condition a caller waited for did not hold in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// An object operation failed.
    #[error(transparent)]
    Object(Box<ObjectError>),
}

/// What to run and with which timings.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// kube-controller-manager's `--node-monitor-grace-period` (upstream default 50 s:
    /// kubernetes@v1.33.4 pkg/controller/nodelifecycle/config/v1alpha1/defaults.go:46).
    pub node_monitor_grace_period: Duration,
    /// Run kube-controller-manager.
    pub controller_manager: bool,
    /// Run kube-scheduler.
    pub scheduler: bool,
    /// Run KWOK for Nodes labelled [`KWOK_LABEL`].
    pub kwok: bool,
    /// The k3s release of the server whose etcd member starts the cluster: its member runs
    /// that release's etcd ([`binary::etcd_binary`]).
    pub etcd_release: String,
    /// k3s `secrets-encryption` (`cfg.EncryptSecrets`): kube-apiserver runs with
    /// `--encryption-provider-config` naming the PKI's EncryptionConfiguration (one is
    /// generated, as k3s's `genEncryptionConfigAndState` does, when the PKI has none).
    pub secrets_encryption: bool,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            node_monitor_grace_period: Duration::from_secs(50),
            controller_manager: true,
            scheduler: true,
            kwok: true,
            etcd_release: KUBERNETES_VERSION.to_owned(),
            secrets_encryption: false,
        }
    }
}

/// One running component.
#[derive(Debug)]
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// A running control plane. Dropping it kills every component.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    ip: Ipv4Addr,
    pki: Arc<pki::Pki>,
    components: Vec<Component>,
    /// The datastore: real etcd members behind a forwarder (see [`etcd`]).
    etcd: etcd::Etcd,
    admin_kubeconfig: String,
    client: kube::Client,
    kinds: objects::KindCache,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("ip", &self.ip)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Reverse start order: clients of etcd before etcd.
        for c in self.components.iter_mut().rev() {
            let _ = c.child.start_kill();
        }
    }
}

/// How long each component may take to become ready on a loaded 2-core machine.
const START_PATIENCE: Duration = Duration::from_secs(90);

impl ControlPlane {
    /// Starts etcd and kube-apiserver, waits until the apiserver is ready, then starts the
    /// controller manager, scheduler and KWOK as asked and waits until the ServiceAccount
    /// controller has made `default` ServiceAccounts (pods can be created).
    pub async fn start(opts: ControlPlaneOptions) -> Result<ControlPlane, ControlPlaneError> {
        Self::start_with_member(opts, "default", None).await
    }

    /// [`ControlPlane::start`] with the datastore's first etcd member named `member` on
    /// `member_ip` (a server VM's own address; a random loopback address when `None`).
    pub async fn start_with_member(
        opts: ControlPlaneOptions,
        member: &str,
        member_ip: Option<Ipv4Addr>,
    ) -> Result<ControlPlane, ControlPlaneError> {
        Self::start_restored(opts, member, member_ip, None).await
    }

    /// [`ControlPlane::start_with_member`] for a restored server when `restored` is given:
    /// the control plane uses that PKI (the bootstrap data the restore wrote back) and the
    /// first member starts from that etcd data directory (see [`etcd::restore_member`]), so
    /// it serves the snapshot's objects to certificates and tokens issued before.
    pub async fn start_restored(
        opts: ControlPlaneOptions,
        member: &str,
        member_ip: Option<Ipv4Addr>,
        restored: Option<(Arc<pki::Pki>, PathBuf)>,
    ) -> Result<ControlPlane, ControlPlaneError> {
        let kcp = tokio::task::spawn_blocking(binary::kcp)
            .await
            .map_err(|e| ControlPlaneError::Binary(e.to_string()))??;
        let mut last = None;
        // A random loopback address per control plane; another test process may hold the
        // same one (1 in ~25,000), so a clash at bind time picks another.
        for _ in 0..3 {
            let first = (member, member_ip.unwrap_or_else(random_ip));
            match Self::start_at(&kcp, random_ip(), first, &opts, restored.clone()).await {
                Ok(cp) => return Ok(cp),
                Err(e @ ControlPlaneError::Component { .. })
                    if e.to_string()
                        .to_lowercase()
                        .contains("address already in use") =>
                {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ControlPlaneError::Binary("no start attempt".into())))
    }

    async fn start_at(
        kcp: &Path,
        ip: Ipv4Addr,
        (member, member_ip): (&str, Ipv4Addr),
        opts: &ControlPlaneOptions,
        restored: Option<(Arc<pki::Pki>, PathBuf)>,
    ) -> Result<ControlPlane, ControlPlaneError> {
        let dir =
            crate::support::scratch::tempdir("kcp-").map_err(|source| ControlPlaneError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let (pki, seed) = match restored {
            Some((pki, data)) => (pki, Some(data)),
            None => (Arc::new(pki::Pki::new()?), None),
        };
        // k3s `genEncryptionConfigAndState`: with secrets encryption, an existing
        // EncryptionConfig (the bootstrap data's, for a restored or joined server) is kept;
        // none is made with a new key.
        let pki = if opts.secrets_encryption && pki.encryption_config.is_none() {
            Arc::new(pki.with_new_encryption_key()?)
        } else {
            pki
        };
        let files = Files::write(dir.path(), ip, &pki, opts)?;
        let mut cp_components = Vec::new();
        let etcd = etcd::Etcd::start_from(
            &opts.etcd_release,
            dir.path(),
            ip,
            member,
            member_ip,
            seed.as_deref(),
        )
        .await
        .map_err(|why| ControlPlaneError::Component {
            component: "etcd",
            log: String::new(),
            why,
        })?;

        let apiserver = spawn(kcp, dir.path(), "kube-apiserver", &files.apiserver_args(ip))?;
        cp_components.push(apiserver);

        let admin_kubeconfig = files.admin_kubeconfig.clone();
        let client = client_from(&admin_kubeconfig).await?;
        let mut cp = ControlPlane {
            dir,
            ip,
            pki,
            components: cp_components,
            etcd,
            admin_kubeconfig,
            client,
            kinds: objects::KindCache::default(),
        };
        cp.wait_ready("kube-apiserver").await?;

        if opts.controller_manager {
            let args = files.controller_manager_args(opts);
            let c = spawn(kcp, cp.dir.path(), "kube-controller-manager", &args)?;
            cp.components.push(c);
        }
        if opts.scheduler {
            let args = files.scheduler_args();
            let c = spawn(kcp, cp.dir.path(), "kube-scheduler", &args)?;
            cp.components.push(c);
        }
        if opts.kwok {
            let args = files.kwok_args(ip);
            let c = spawn(kcp, cp.dir.path(), "kwok", &args)?;
            cp.components.push(c);
        }
        if opts.controller_manager {
            cp.wait_service_accounts().await?;
        }
        Ok(cp)
    }

    /// `https://IP:6443`, the apiserver's own address.
    pub fn server_url(&self) -> String {
        format!("https://{}:{API_PORT}", self.ip)
    }

    /// The loopback address the control plane's components listen on.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The cluster CA, PEM (what `/cacerts` and kubeconfigs carry).
    pub fn ca_pem(&self) -> &str {
        self.pki.ca_pem()
    }

    /// A kubeconfig for `system:admin` (group `system:masters`) at [`Self::server_url`],
    /// with an embedded client certificate, as k3s writes `/etc/rancher/k3s/k3s.yaml`.
    pub fn admin_kubeconfig(&self) -> &str {
        &self.admin_kubeconfig
    }

    /// A kubeconfig for `user` in `groups` against `server` (another URL in front of this
    /// apiserver, e.g. a floating IP), authenticated by a client certificate.
    pub fn user_kubeconfig(
        &self,
        server: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<String, ControlPlaneError> {
        self.user_kubeconfig_until(server, user, groups, None)
    }

    /// [`Self::user_kubeconfig`] with a client certificate valid until `end` (None: for ever).
    pub fn user_kubeconfig_until(
        &self,
        server: &str,
        user: &str,
        groups: &[&str],
        end: Option<std::time::SystemTime>,
    ) -> Result<String, ControlPlaneError> {
        let cert = self.pki.client_until(user, groups, end)?;
        Ok(kubeconfig(server, self.ca_pem(), user, &cert))
    }

    /// A kubeconfig for ServiceAccount `ns/name` at `server` (created if missing) with a
    /// one-hour token from the TokenRequest API, as a pod's projected token is.
    pub async fn service_account_kubeconfig(
        &self,
        server: &str,
        ns: &str,
        name: &str,
    ) -> Result<String, ControlPlaneError> {
        let token = self.service_account_token(ns, name).await?;
        Ok(format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: default\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: default\n  context:\n    cluster: default\n    user: {ns}-{name}\ncurrent-context: default\nusers:\n- name: {ns}-{name}\n  user:\n    token: {token}\n",
            ca = b64(self.ca_pem()),
        ))
    }

    /// A one-hour token for ServiceAccount `ns/name` (created if missing).
    pub async fn service_account_token(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<String, ControlPlaneError> {
        if self
            .get("v1", "ServiceAccount", Some(ns), name)
            .await?
            .is_none()
        {
            self.apply(
                serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": ns}}),
            )
            .await?;
        }
        let body = serde_json::json!({"apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}});
        let req = http::Request::post(format!(
            "/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"
        ))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap_or_default())
        .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
        let answer: serde_json::Value =
            self.client.request(req).await.map_err(|e| {
                ControlPlaneError::Client(format!("TokenRequest for {ns}/{name}: {e}"))
            })?;
        answer["status"]["token"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ControlPlaneError::Client("TokenRequest answered no token".into()))
    }

    /// The datastore's etcd members (membership, stop and start with their VMs).
    pub fn etcd(&self) -> &etcd::Etcd {
        &self.etcd
    }

    /// The PKI (serving certificates for front proxies, client identities).
    pub fn pki(&self) -> &Arc<pki::Pki> {
        &self.pki
    }

    /// The admin client (kube-rs), for direct object access in tests.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The last lines of a component's log (`kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`, `kwok`, `etcd-<member>`), for failure messages.
    pub fn log_tail(&self, component: &str) -> String {
        log_tail(&self.dir.path().join(format!("{component}.log")))
    }

    /// The directory holding the components' logs (`<name>.log`) and files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Polls `check` every 100 ms until it returns `Some`, or fails after `patience` naming
    /// `what`. The way tests wait on an eventually consistent cluster.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        patience: Duration,
        mut check: F,
    ) -> Result<T, ControlPlaneError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(v) = check().await {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(ControlPlaneError::Timeout {
                    what: what.to_string(),
                    after: patience,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails with the component's log tail if it has exited.
    fn check_alive(&mut self) -> Result<(), ControlPlaneError> {
        for c in &mut self.components {
            if let Ok(Some(status)) = c.child.try_wait() {
                return Err(ControlPlaneError::Component {
                    component: c.name,
                    why: format!("exited with {status}"),
                    log: log_tail(&c.log),
                });
            }
        }
        Ok(())
    }

    async fn wait_ready(&mut self, component: &'static str) -> Result<(), ControlPlaneError> {
        let deadline = Instant::now() + START_PATIENCE;
        let mut why = String::new();
        while Instant::now() < deadline {
            self.check_alive()?;
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
            match self.client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => why = body,
                Err(e) => why = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(self.component_error(
            component,
            format!("not ready after {START_PATIENCE:?}: {why}"),
        ))
    }

    /// Waits until the ServiceAccount controller made `default` in `default` and
    /// `kube-system` (the ServiceAccount admission plugin refuses pods before that).
    async fn wait_service_accounts(&mut self) -> Result<(), ControlPlaneError> {
        let deadline = Instant::now() + START_PATIENCE;
        while Instant::now() < deadline {
            self.check_alive()?;
            let mut all = true;
            for ns in ["default", "kube-system"] {
                let sa = self
                    .get("v1", "ServiceAccount", Some(ns), "default")
                    .await
                    .ok()
                    .flatten();
                all &= sa.is_some();
            }
            if all {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(self.component_error(
            "kube-controller-manager",
            "no default ServiceAccount after 90 s".into(),
        ))
    }

    fn component_error(&self, component: &'static str, why: String) -> ControlPlaneError {
        let log = self
            .components
            .iter()
            .find(|c| c.name == component)
            .map(|c| log_tail(&c.log))
            .unwrap_or_default();
        ControlPlaneError::Component {
            component,
            why,
            log,
        }
    }
}

/// A random address in 127.1.0.0 – 127.15.255.255: clear of 127.0.0.0/16 (everyday
/// loopback), the simulated projects' VPC subnets (127.16 – 127.99), the external-IP pools
/// (127.100 – 127.227) and the tailnet (127.228 – 127.254).
pub(crate) fn random_ip() -> Ipv4Addr {
    let mut rng = rand::rng();
    Ipv4Addr::new(
        127,
        rng.random_range(1..16),
        rng.random_range(0..=255),
        rng.random_range(1..255),
    )
}

fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn spawn(
    kcp: &Path,
    dir: &Path,
    name: &'static str,
    args: &[String],
) -> Result<Component, ControlPlaneError> {
    let log = dir.join(format!("{name}.log"));
    let io_err = |source| ControlPlaneError::Io {
        path: log.clone(),
        source,
    };
    let out = std::fs::File::create(&log).map_err(io_err)?;
    let err = out.try_clone().map_err(io_err)?;
    let child = Command::new(kcp)
        .arg(name)
        .args(args)
        .env("KCP_PARENT_PID", std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ControlPlaneError::Component {
            component: name,
            why: format!("cannot run {}: {e}", kcp.display()),
            log: String::new(),
        })?;
    Ok(Component { name, child, log })
}

/// The last 40 lines of a component's log.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

async fn client_from(kubeconfig: &str) -> Result<kube::Client, ControlPlaneError> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| ControlPlaneError::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| ControlPlaneError::Client(e.to_string()))
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn kubeconfig(server: &str, ca_pem: &str, user: &str, cert: &pki::KeyedCert) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: default\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: default\n  context:\n    cluster: default\n    user: {user}\ncurrent-context: default\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {crt}\n    client-key-data: {key}\n",
        ca = b64(ca_pem),
        crt = b64(&cert.cert_pem),
        key = b64(&cert.key_pem),
    )
}

/// The files the components read, written once into the control plane's directory.
struct Files {
    dir: PathBuf,
    admin_kubeconfig: String,
    /// The apiserver encrypts Secrets with `encryption-config.json`.
    secrets_encryption: bool,
}

impl Files {
    fn write(
        dir: &Path,
        ip: Ipv4Addr,
        pki: &pki::Pki,
        opts: &ControlPlaneOptions,
    ) -> Result<Files, ControlPlaneError> {
        let put = |name: &str, text: &str| -> Result<(), ControlPlaneError> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|source| ControlPlaneError::Io { path, source })
        };
        let sans: Vec<String> = [
            ip.to_string(),
            "127.0.0.1".into(),
            "localhost".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
            "10.43.0.1".into(),
        ]
        .into();
        let serving = pki.serving(&sans)?;
        put("ca.crt", pki.ca_pem())?;
        put("ca.key", pki.ca_key_pem())?;
        put("apiserver.crt", &serving.cert_pem)?;
        put("apiserver.key", &serving.key_pem)?;
        put("sa.key", &pki.service_account_key_pem)?;
        put("sa.pub", &pki.service_account_pub_pem)?;
        put("front-proxy-ca.crt", &pki.front_proxy_ca_pem)?;
        if let Some(config) = pki
            .encryption_config
            .as_deref()
            .filter(|_| opts.secrets_encryption)
        {
            put("encryption-config.json", config)?;
        }
        // KWOK_STAGES's jitter is an upper bound of the delay (kwok's `Delay` type).
        let grace_ms = opts.node_monitor_grace_period.as_millis().max(1000);
        put(
            "kwok.yaml",
            &KWOK_STAGES
                .replace("HEARTBEAT_JITTER_MS", &(grace_ms / 4).to_string())
                .replace("HEARTBEAT_MS", &(grace_ms / 5).to_string()),
        )?;
        let server = format!("https://{ip}:{API_PORT}");
        // The identities k3s gives its own components (k3s-io/k3s pkg/daemons/control/deps).
        let admin = kubeconfig(
            &server,
            pki.ca_pem(),
            "system:admin",
            &pki.client("system:admin", &["system:masters"])?,
        );
        put("admin.kubeconfig", &admin)?;
        put(
            "controller-manager.kubeconfig",
            &kubeconfig(
                &server,
                pki.ca_pem(),
                "system:kube-controller-manager",
                &pki.client("system:kube-controller-manager", &[])?,
            ),
        )?;
        put(
            "scheduler.kubeconfig",
            &kubeconfig(
                &server,
                pki.ca_pem(),
                "system:kube-scheduler",
                &pki.client("system:kube-scheduler", &[])?,
            ),
        )?;
        Ok(Files {
            dir: dir.to_path_buf(),
            admin_kubeconfig: admin,
            secrets_encryption: opts.secrets_encryption,
        })
    }

    fn file(&self, name: &str) -> String {
        path_arg(&self.dir.join(name))
    }

    /// kube-apiserver as k3s runs it (k3s-io/k3s pkg/daemons/control/server.go `apiServer`),
    /// minus what needs a kubelet or a network (konnectivity, the kubelet client).
    fn apiserver_args(&self, ip: Ipv4Addr) -> Vec<String> {
        let issuer = "https://kubernetes.default.svc.cluster.local";
        let mut args = vec![
            format!("--etcd-servers=http://{ip}:2379"),
            format!("--bind-address={ip}"),
            format!("--advertise-address={ip}"),
            format!("--secure-port={API_PORT}"),
            format!("--tls-cert-file={}", self.file("apiserver.crt")),
            format!("--tls-private-key-file={}", self.file("apiserver.key")),
            format!("--client-ca-file={}", self.file("ca.crt")),
            format!("--service-account-issuer={issuer}"),
            format!("--api-audiences={issuer},k3s"),
            format!("--service-account-key-file={}", self.file("sa.pub")),
            format!("--service-account-signing-key-file={}", self.file("sa.key")),
            "--authorization-mode=Node,RBAC".into(),
            "--anonymous-auth=false".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            // No Endpoints for `kubernetes` pointing at this loopback address.
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", self.file("apiserver-certs")),
            "--profiling=false".into(),
            // The front proxy on each server's :6443 names TLS-authenticated callers in
            // these headers (k3s sets the same for its request-header CA).
            format!(
                "--requestheader-client-ca-file={}",
                self.file("front-proxy-ca.crt")
            ),
            "--requestheader-allowed-names=system:auth-proxy".into(),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        ];
        // k3s `apiServer`: `if cfg.EncryptSecrets` (see tests/FIDELITY.md).
        if self.secrets_encryption {
            args.push(format!(
                "--encryption-provider-config={}",
                self.file("encryption-config.json")
            ));
            args.push("--encryption-provider-config-automatic-reload=true".into());
        }
        args
    }

    /// kube-controller-manager as k3s runs it (`controllerManager` in the same file): every
    /// controller but the cloud ones, which need a cloud provider; the CSR signers with
    /// k3s's CAs (client CA for the two client signers, server CA for kubelet serving and
    /// legacy-unknown — one CA here, see [`pki`]), and no `--cluster-signing-duration` (the
    /// default, a year), as k3s passes them.
    fn controller_manager_args(&self, opts: &ControlPlaneOptions) -> Vec<String> {
        let kc = self.file("controller-manager.kubeconfig");
        let (ca, key) = (self.file("ca.crt"), self.file("ca.key"));
        let mut args = vec![
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--leader-elect=false".into(),
            format!("--service-account-private-key-file={}", self.file("sa.key")),
            format!("--root-ca-file={}", self.file("ca.crt")),
            "--use-service-account-credentials=true".into(),
            "--controllers=*,tokencleaner,-service,-route,-cloud-node-lifecycle".into(),
            format!(
                "--node-monitor-grace-period={}s",
                opts.node_monitor_grace_period.as_secs().max(1)
            ),
            "--secure-port=0".into(),
        ];
        for signer in [
            "kube-apiserver-client",
            "kubelet-client",
            "kubelet-serving",
            "legacy-unknown",
        ] {
            args.push(format!("--cluster-signing-{signer}-cert-file={ca}"));
            args.push(format!("--cluster-signing-{signer}-key-file={key}"));
        }
        args
    }

    fn scheduler_args(&self) -> Vec<String> {
        let kc = self.file("scheduler.kubeconfig");
        vec![
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ]
    }

    /// KWOK with the stages of `kwok-stages.yaml` (KWOK's general pod stages, minus our pods,
    /// readiness gates left to their owners, and KWOK's Node stages), managing only Nodes
    /// labelled [`KWOK_LABEL`]=[`KWOK_LABEL_VALUE`].
    fn kwok_args(&self, ip: Ipv4Addr) -> Vec<String> {
        vec![
            format!("--kubeconfig={}", self.file("admin.kubeconfig")),
            format!("--config={}", self.file("kwok.yaml")),
            format!("--manage-nodes-with-label-selector={KWOK_LABEL}={KWOK_LABEL_VALUE}"),
            format!("--server-address={ip}:10247"),
            format!("--node-ip={ip}"),
            "--cidr=10.42.0.1/16".into(),
            "--node-lease-duration-seconds=0".into(),
        ]
    }
}
