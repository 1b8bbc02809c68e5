//! The Oxide HTTP API of the simulated rack (`/v1/...`): routing, bearer auth, the store of
//! projects/instances/disks/images/snapshots/floating IPs/anti-affinity groups, nexus's
//! validation rules and error bodies, pagination, the timed instance lifecycle, per-route
//! fault injection and request counters.
//!
//! Bodies use `oxide::types`, so the wire format is exactly the SDK's. The simulator aims to
//! be *at least as strict* as a real rack: whatever it accepts must also work there.
//!
//! Not here: listeners and TLS (`net`), what happens inside a booted VM (`boot`), the
//! Kubernetes control plane (`control_plane`). Those learn about lifecycle edges through [`RackEvents`].

pub mod addresses;
mod body;
mod console;
mod error;
pub mod faults;
mod firewall;
mod firewall_rules;
mod handler;
mod instances;
mod lifecycle;
mod names;
mod network;
mod pagination;
mod routes;
pub mod schema_check;
mod storage;
mod store;
pub mod subnet;
mod vpcs;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use uuid::Uuid;

pub use addresses::AddressPool;
pub use error::ApiError;
pub use faults::{AfterFault, FaultSpec, Faults, RouteFault};
pub use firewall::Proto;
pub use store::BulkWriteStats;

pub use routes::{NEXUS_METHODS, QueryShape, ROUTES, RouteSpec};

use error::json_response;
use firewall::Source;
use lifecycle::{Effects, Env, Event, Timer};
use store::{Image, RunState, SshKey, Store, Times};

/// The API version this simulated rack implements by default: the newest nexus in omicron
/// (`openapi/nexus/nexus-2026081901`, the official document the simulator is checked
/// against). Requests asking for a newer version get dropshot's 400; `--api-version` makes
/// the simulator an older rack.
pub const SERVER_API_VERSION: &str = "2026081901.0.0";

/// Durations of the timed lifecycle transitions.
#[derive(Clone, Debug)]
pub struct Timings {
    /// `creating` → `starting` (0: create answers `starting` at once).
    pub create_to_starting: Duration,
    /// `starting` → `running`.
    pub starting_to_running: Duration,
    /// `stopping` → `stopped`.
    pub stopping_to_stopped: Duration,
    /// `rebooting` → `running`.
    pub rebooting: Duration,
    /// `failed` → `starting` by nexus's `instance_reincarnation` task, for instances whose
    /// `auto_restart_policy` is not `never` and whose intended state is running. On a rack
    /// the task runs every 60 s.
    pub reincarnation_delay: Duration,
    /// Minimum time between two automatic restarts of one instance (nexus: 5 minutes).
    pub reincarnation_cooldown: Duration,
}

impl Default for Timings {
    /// Fast transitions for tests.
    fn default() -> Self {
        Self {
            create_to_starting: Duration::ZERO,
            starting_to_running: Duration::from_millis(100),
            stopping_to_stopped: Duration::from_millis(100),
            rebooting: Duration::from_millis(100),
            reincarnation_delay: Duration::from_millis(300),
            reincarnation_cooldown: Duration::from_secs(5),
        }
    }
}

impl Timings {
    /// Durations in the range a real rack shows (seconds), for demos.
    pub fn realistic() -> Self {
        Self {
            create_to_starting: Duration::from_secs(2),
            starting_to_running: Duration::from_secs(10),
            stopping_to_stopped: Duration::from_secs(5),
            rebooting: Duration::from_secs(8),
            reincarnation_delay: Duration::from_secs(60),
            reincarnation_cooldown: Duration::from_secs(300),
        }
    }
}

/// Configuration of one simulated rack.
pub struct OxideSimConfig {
    /// The bearer token the API accepts.
    pub token: String,
    /// Lifecycle durations.
    pub timings: Timings,
    /// Shared, runtime-mutable fault specification.
    pub faults: Faults,
    /// Where floating, ephemeral and SNAT addresses come from.
    pub addresses: AddressPool,
    /// The newest `api-version` this rack serves ([`SERVER_API_VERSION`] unless it acts as
    /// an older rack).
    pub api_version: String,
}

impl OxideSimConfig {
    /// Fast timings, no faults, a random address pool.
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            timings: Timings::default(),
            faults: Faults::default(),
            addresses: AddressPool::random(),
            api_version: SERVER_API_VERSION.to_owned(),
        }
    }
}

impl std::fmt::Debug for OxideSimConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OxideSimConfig")
            .field("token", &"<redacted>")
            .field("timings", &self.timings)
            .field("addresses", &self.addresses)
            .finish_non_exhaustive()
    }
}

/// Receives lifecycle edges of the simulated rack.
///
/// Implementations must not block (spawn if needed). The simulator calls them after
/// releasing its own lock, so calling back into [`OxideSim`] is allowed.
pub trait RackEvents: Send + Sync + 'static {
    /// The instance reached `running` (boot starts now).
    fn instance_running(&self, inst: &RunningInstance);
    /// The instance left `running` (stopping, rebooting, failed): its kubelet stops reporting.
    fn instance_halted(&self, id: Uuid);
    /// The instance was deleted (it answers 404 from now on).
    fn instance_deleted(&self, id: Uuid);
    /// A floating IP was attached (`Some(instance)`) or detached (`None`).
    fn floating_ip_changed(&self, ip: IpAddr, instance: Option<Uuid>);
}

/// [`RackEvents`] that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEvents;

impl RackEvents for NoEvents {
    fn instance_running(&self, _inst: &RunningInstance) {}
    fn instance_halted(&self, _id: Uuid) {}
    fn instance_deleted(&self, _id: Uuid) {}
    fn floating_ip_changed(&self, _ip: IpAddr, _instance: Option<Uuid>) {}
}

/// An instance that just reached `running`, with what its boot needs.
#[derive(Clone)]
pub struct RunningInstance {
    pub id: Uuid,
    pub name: String,
    pub hostname: String,
    /// Project name.
    pub project: String,
    /// Decoded user data (cloud-init). Never logged.
    pub user_data: Vec<u8>,
    /// Ephemeral and attached floating addresses (not the SNAT address).
    pub external_ips: Vec<IpAddr>,
    /// The primary NIC's IPv4 address in the project's VPC as the rack shows it and the guest
    /// sees it on its NIC (`172.30.0.0/22`; none without a NIC or IPv4).
    pub private_ip: Option<IpAddr>,
    /// Where that address lives on this machine: its loopback stand-in (see `subnet.rs`),
    /// which the guest's listeners bind and connections to the private address reach.
    pub private_loopback: Option<IpAddr>,
    /// Public keys resolved from the create request's `ssh_public_keys`.
    pub ssh_public_keys: Vec<String>,
    /// vCPUs and memory (bytes): the guest's kubelet reports them as Node capacity.
    pub ncpus: u16,
    pub memory: u64,
    /// NVMe serials of the attached disks: the first 20 bytes of each disk's name, as
    /// omicron hands them to propolis (see tests/FIDELITY.md, issue 11).
    pub disk_serials: Vec<String>,
}

impl std::fmt::Debug for RunningInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningInstance")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("hostname", &self.hostname)
            .field("project", &self.project)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .field("external_ips", &self.external_ips)
            .field("private_ip", &self.private_ip)
            .field("private_loopback", &self.private_loopback)
            .field("ssh_public_keys", &self.ssh_public_keys.len())
            .finish()
    }
}

/// Who opens a connection the VPC firewall judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A client outside the rack (the host running the tests) with this source address.
    Host(IpAddr),
    /// An instance of the rack (e.g. a k3s joiner).
    Instance(Uuid),
}

/// The simulated Oxide API. Cheap to clone; clones share one rack.
#[derive(Clone)]
pub struct OxideSim {
    inner: Arc<Inner>,
}

struct Inner {
    /// The one bearer token accepted; replaced by [`OxideSim::rotate_token`].
    token: Mutex<String>,
    timings: Timings,
    faults: Faults,
    addresses: AddressPool,
    api_version: String,
    events: Arc<dyn RackEvents>,
    store: Mutex<Store>,
    counters: Mutex<BTreeMap<String, u64>>,
    /// Oxide API requests since start or the last `reset_counters` (for crash faults).
    requests: AtomicU64,
}

impl std::fmt::Debug for OxideSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OxideSim")
            .field("timings", &self.inner.timings)
            .field("addresses", &self.inner.addresses)
            .finish_non_exhaustive()
    }
}

impl OxideSim {
    /// A rack with no projects, answering to `cfg.token`.
    pub fn new(cfg: OxideSimConfig, events: Arc<dyn RackEvents>) -> Self {
        // One address of the pool is the SNAT address all instances share, like a rack's
        // SNAT IP shared with port ranges.
        let snat = cfg.addresses.allocate();
        Self {
            inner: Arc::new(Inner {
                token: Mutex::new(cfg.token),
                timings: cfg.timings,
                faults: cfg.faults,
                addresses: cfg.addresses,
                api_version: cfg.api_version,
                events,
                store: Mutex::new(Store::new(snat)),
                counters: Mutex::new(BTreeMap::new()),
                requests: AtomicU64::new(0),
            }),
        }
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // Handlers mutate the store only after all their checks pass, so a panic (a bug) in
        // one request cannot leave half-applied state behind; keep serving after poisoning.
        self.inner.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn counters_lock(&self) -> MutexGuard<'_, BTreeMap<String, u64>> {
        self.inner
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The fault handle this rack reads.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// The address pool external IPs come from.
    pub fn addresses(&self) -> &AddressPool {
        &self.inner.addresses
    }

    /// The whole Oxide API (paths `/v1/...`). Never panics on any input.
    pub async fn handle(&self, req: Request<Bytes>) -> Response<Bytes> {
        let request_id = Uuid::new_v4();
        let n = self.inner.requests.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(limit) = self.inner.faults.get().crash_after_requests
            && n > limit
        {
            tracing::error!(
                requests = n - 1,
                "crash_after_requests fault: exiting with 137"
            );
            std::process::exit(137);
        }
        let (parts, body) = req.into_parts();
        let (spec, params) = match routes::match_route(&parts.method, parts.uri.path()) {
            Ok(found) => found,
            Err(e) => return e.into_response(&request_id),
        };
        let key = spec.key();
        *self.counters_lock().entry(key.clone()).or_insert(0) += 1;

        if let Some(fault) = self.inner.faults.route(&key) {
            if fault.latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(fault.latency_ms)).await;
            }
            if fault.error_rate > 0.0 && rand::random::<f64>() < fault.error_rate {
                return ApiError::injected(fault.error_status).into_response(&request_id);
            }
        }

        let result = match self.preflight(&parts, spec) {
            Ok(query) => {
                let faults = self.inner.faults.get();
                let env = Env {
                    timings: &self.inner.timings,
                    faults: &faults,
                };
                let mut fx = Effects::default();
                let result = {
                    let mut store = self.store();
                    let mut cx = handler::Ctx {
                        store: &mut store,
                        fx: &mut fx,
                        env: &env,
                        pool: &self.inner.addresses,
                        query: &query,
                        params: &params,
                        body: &body,
                    };
                    routes::dispatch(spec, &mut cx)
                };
                self.apply(fx);
                result
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(reply) => json_response(reply.status, reply.body, &request_id),
            Err(e) => e.into_response(&request_id),
        }
    }

    /// Version header, credentials, content type and query string, in dropshot/nexus order.
    fn preflight(
        &self,
        parts: &http::request::Parts,
        spec: &RouteSpec,
    ) -> Result<pagination::Query, ApiError> {
        routes::check_api_version(&parts.headers, &self.inner.api_version)?;
        let token = self
            .inner
            .token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if !routes::authorized(&parts.headers, &token)
            || self.store().device_token.expired(chrono::Utc::now())
        {
            return Err(ApiError::unauthorized());
        }
        if spec.has_body {
            routes::check_content_type(&parts.headers)?;
        }
        routes::parse_query(parts.uri.query(), spec.query)
    }

    /// Delivers events and arms timers recorded while the lock was held.
    fn apply(&self, fx: Effects) {
        if fx.firewall_write_overwritten {
            self.inner.faults.update(|f| {
                f.overwritten_firewall_writes = f.overwritten_firewall_writes.saturating_sub(1);
            });
        }
        for event in fx.events {
            let ev = &self.inner.events;
            match event {
                Event::Running(ri) => ev.instance_running(&ri),
                Event::Halted(id) => ev.instance_halted(id),
                Event::Deleted(id) => ev.instance_deleted(id),
                Event::FloatingIp(ip, inst) => ev.floating_ip_changed(ip, inst),
            }
        }
        if fx.timers.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                timers = fx.timers.len(),
                "no tokio runtime: lifecycle timers dropped"
            );
            return;
        };
        for timer in fx.timers {
            let sim = self.clone();
            rt.spawn(async move {
                tokio::time::sleep(timer.after).await;
                sim.fire(timer);
            });
        }
    }

    fn fire(&self, timer: Timer) {
        let faults = self.inner.faults.get();
        let env = Env {
            timings: &self.inner.timings,
            faults: &faults,
        };
        let mut fx = Effects::default();
        lifecycle::fire(&mut self.store(), timer, &mut fx, &env);
        self.apply(fx);
    }

    /// Appends to an instance's serial console (the first and the last MiB are kept).
    pub fn append_console(&self, instance: Uuid, bytes: &[u8]) {
        if let Some(inst) = self.store().instances.get_mut(&instance) {
            inst.console.append(bytes);
        }
    }

    /// Puts an instance into `failed` at once (boot faults, admin). No-op for unknown ids.
    pub fn set_instance_failed(&self, instance: Uuid) {
        let faults = self.inner.faults.get();
        let env = Env {
            timings: &self.inner.timings,
            faults: &faults,
        };
        let mut fx = Effects::default();
        {
            let mut store = self.store();
            if store.instances.contains_key(&instance) {
                lifecycle::enter(&mut store, instance, RunState::Failed, &mut fx, &env);
            }
        }
        self.apply(fx);
    }

    /// Sets an instance's `auto_restart_policy` as if it had been created with it (e.g. an
    /// instance made by an older controller that left the policy unset). No-op for unknown ids.
    pub fn set_auto_restart_policy(
        &self,
        instance: Uuid,
        policy: Option<oxide::types::InstanceAutoRestartPolicy>,
    ) {
        if let Some(inst) = self.store().instances.get_mut(&instance) {
            inst.auto_restart_policy = policy;
        }
    }

    /// Whether the VPC firewall lets a TCP connection from `from` reach `to` (see
    /// [`Self::admitted`]).
    pub fn tcp_admitted(&self, from: Peer, to: SocketAddr) -> Option<bool> {
        self.admitted(firewall::Proto::Tcp, from, to)
    }

    /// Whether the VPC firewall lets `proto` traffic from `from` reach `to`: `None` when
    /// `to` is no address of an instance of this rack (the firewall has no say), `Some(false)`
    /// when it is dropped. An instance sending to an external (ephemeral or floating) address
    /// leaves through NAT and arrives as external traffic from its own external address; to
    /// a private address it arrives over the VPC, and only inside the same project's VPC.
    /// The simulator has no UDP path between VMs: VXLAN (udp/8472) is judged here only.
    pub fn admitted(&self, proto: firewall::Proto, from: Peer, to: SocketAddr) -> Option<bool> {
        let store = self.store();
        let dest = to.ip();
        let (target, via_vpc) = store.instances.values().find_map(|i| {
            if i.private_ip().map(IpAddr::V4) == Some(dest) {
                Some((i, true))
            } else if store.reachable_ips(i.id).contains(&dest) {
                Some((i, false))
            } else {
                None
            }
        })?;
        let project = store.projects.get(&target.project_id)?;
        // A NIC without IPv4 matches no address target.
        let target_addr = target
            .private_ip()
            .and_then(|ip| project.subnet.rack_addr(ip))
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
        let source = match (from, via_vpc) {
            // On a rack nothing outside the VPC reaches a private address. The simulator's
            // in-cluster Jobs run on the host and reach a member there as pods would: from
            // a node of the cluster, over the VPC. Which node is not known here, so the
            // connection is judged as coming from the target itself (a pod on that node).
            (Peer::Host(_), true) => Source::Vpc(IpAddr::V4(target_addr)),
            (Peer::Host(ip), false) => Source::External(ip),
            (Peer::Instance(id), via_vpc) => {
                let src = store.instances.get(&id)?;
                if via_vpc {
                    if src.project_id != target.project_id {
                        return Some(false);
                    }
                    // Inside the VPC the source is the NIC's rack address (172.30.x), which
                    // is what `ip`/`ip_net` filters name.
                    Source::Vpc(IpAddr::V4(project.subnet.rack_addr(src.private_ip()?)?))
                } else {
                    // Outbound NAT: its first external address, else the shared SNAT address.
                    let ext = store
                        .reachable_ips(id)
                        .first()
                        .copied()
                        .or(store.snat_ip.map(IpAddr::V4))?;
                    Source::External(ext)
                }
            }
        };
        let resolve = |name: &str| {
            store
                .instances
                .values()
                .find(|i| i.project_id == target.project_id && i.name.as_str() == name)
                .and_then(|i| i.private_ip())
                .and_then(|ip| project.subnet.rack_addr(ip))
        };
        Some(firewall::allows(
            &project.firewall_rules,
            firewall::Target {
                name: target.name.as_str(),
                private_ip: target_addr,
            },
            source,
            proto,
            to.port(),
            &resolve,
        ))
    }

    /// Marks a disk `faulted` (storage fault injection). No-op for unknown ids.
    pub fn set_disk_faulted(&self, disk: Uuid) {
        if let Some(d) = self.store().disks.get_mut(&disk) {
            d.state = store::DiskState::Faulted;
        }
    }

    /// Flips every bit of `len` bytes of snapshot `name`'s contents from `offset` (storage
    /// fault injection: bit rot in the stored object, which nexus never reads back, so nothing
    /// on the API changes). Returns whether such a snapshot exists and the range is in it.
    pub fn corrupt_snapshot(&self, name: &str, offset: u64, len: usize) -> bool {
        let mut store = self.store();
        let Some(s) = store
            .snapshots
            .values_mut()
            .find(|s| s.name.as_str() == name)
        else {
            return false;
        };
        let Some(end) = u64::try_from(len).ok().and_then(|l| offset.checked_add(l)) else {
            return false;
        };
        if end > s.size {
            return false;
        }
        let flipped: Vec<u8> = storage::read(&s.data, offset, len)
            .into_iter()
            .map(|b| !b)
            .collect();
        storage::write_at(Arc::make_mut(&mut s.data), offset, &flipped);
        true
    }

    /// Bytes of virtual storage the silo has provisioned (every disk and snapshot at its full
    /// size), what `silo_storage_quota` is checked against.
    pub fn storage_provisioned(&self) -> u64 {
        self.store().storage_provisioned()
    }

    /// `len` bytes of disk `disk`'s contents from `offset` (zeros where nothing was written);
    /// `None` for an unknown disk or a range past its end.
    pub fn read_disk(&self, disk: Uuid, offset: u64, len: usize) -> Option<Vec<u8>> {
        let store = self.store();
        let d = store.disks.get(&disk)?;
        let end = offset.checked_add(u64::try_from(len).ok()?)?;
        (end <= d.size).then(|| storage::read(&d.data, offset, len))
    }

    /// What a guest reads from the NVMe disk with serial `serial` attached to `instance` (the
    /// disk the setup script finds by serial): `len` bytes from `offset`. `None` when no such
    /// disk is attached or the range passes its end.
    pub fn read_attached_disk(
        &self,
        instance: Uuid,
        serial: &str,
        offset: u64,
        len: usize,
    ) -> Option<Vec<u8>> {
        let id = {
            let store = self.store();
            store
                .disks
                .values()
                .find(|d| {
                    d.state == store::DiskState::Attached(instance)
                        && lifecycle::nvme_serial(d.name.as_str()) == serial
                })?
                .id
        };
        self.read_disk(id, offset, len)
    }

    /// The instance as `RackEvents::instance_running` would describe it now.
    pub fn running_instance(&self, instance: Uuid) -> Option<RunningInstance> {
        lifecycle::running_instance(&self.store(), instance)
    }

    /// Everything in the rack, for leak checks:
    /// `{"projects","instances","disks","snapshots","images","floating_ips","anti_affinity_groups"}`.
    pub fn dump(&self) -> serde_json::Value {
        self.store().dump()
    }

    /// Requests per route, keyed `"METHOD /v1/template"`.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.counters_lock().clone()
    }

    /// Sizes of the bulk writes received since start or the last `reset_counters`.
    pub fn bulk_write_stats(&self) -> store::BulkWriteStats {
        self.store().bulk_writes
    }

    /// Zeroes the per-route counters, the bulk-write sizes and the request count
    /// `crash_after_requests` uses.
    /// Issues `token` in place of the accepted one, as deleting a device token and logging in
    /// again does on a rack (`DELETE /v1/me/access-tokens/{id}`, then a new device token):
    /// from now on the old token is 401 and only `token` works.
    pub fn rotate_token(&self, token: &str) {
        *self.inner.token.lock().unwrap_or_else(|e| e.into_inner()) = token.to_owned();
        self.store().device_token = store::DeviceToken::fresh();
    }

    /// The id of the accepted token, as `GET /v1/me/access-tokens` lists it.
    pub fn token_id(&self) -> Uuid {
        self.store().device_token.id
    }

    /// Gives the accepted token an end, as a login with `ttl_seconds` (or a silo's
    /// `device_token_max_ttl_seconds`) does; from then on it is refused (401) and no longer
    /// listed.
    pub fn set_token_expiry(&self, end: Option<chrono::DateTime<chrono::Utc>>) {
        self.store().device_token.time_expires = end;
    }

    pub fn reset_counters(&self) {
        self.counters_lock().clear();
        self.store().bulk_writes = store::BulkWriteStats::default();
        self.inner.requests.store(0, Ordering::SeqCst);
    }

    /// Creates a project (no HTTP, auth or faults). Returns the existing id if the name is
    /// taken, and the nil id (with an error log) for an invalid name.
    pub fn seed_project(&self, name: &str) -> Uuid {
        let Some(name) = seed_name(name) else {
            return Uuid::nil();
        };
        let mut store = self.store();
        if let Some(p) = store.projects.values().find(|p| p.name == name) {
            return p.id;
        }
        let project = store.new_project(name, "seeded by oxide-sim".into());
        let id = project.id;
        store.projects.insert(id, project);
        id
    }

    /// Where a private address of `project`'s VPC (`172.30.0.0/22`, as the API reports NICs)
    /// lives on this machine: its loopback stand-in, for a test that connects to it as a
    /// member of the VPC would. `None` for an unknown project or an address outside the subnet.
    pub fn private_loopback(
        &self,
        project: &str,
        ip: std::net::Ipv4Addr,
    ) -> Option<std::net::Ipv4Addr> {
        let store = self.store();
        let p = store
            .projects
            .values()
            .find(|p| p.name.as_str() == project)?;
        p.subnet.loopback_for(ip)
    }

    /// Takes `n` free addresses of `project`'s default subnet (at most what is free), as the
    /// NICs of instances outside the cluster would: what is left is what a create can get.
    /// Returns the addresses taken, for [`Self::release_subnet`].
    pub fn occupy_subnet(&self, project: &str, n: usize) -> Vec<std::net::Ipv4Addr> {
        let mut store = self.store();
        let Some(p) = store
            .projects
            .values_mut()
            .find(|p| p.name.as_str() == project)
        else {
            return Vec::new();
        };
        std::iter::from_fn(|| p.subnet.allocate()).take(n).collect()
    }

    /// Gives back addresses taken by [`Self::occupy_subnet`].
    pub fn release_subnet(&self, project: &str, ips: &[std::net::Ipv4Addr]) {
        let mut store = self.store();
        if let Some(p) = store
            .projects
            .values_mut()
            .find(|p| p.name.as_str() == project)
        {
            for ip in ips {
                p.subnet.release(*ip);
            }
        }
    }

    /// Free addresses in `project`'s default subnet (`None`: no such project).
    pub fn subnet_free(&self, project: &str) -> Option<usize> {
        let store = self.store();
        store
            .projects
            .values()
            .find(|p| p.name.as_str() == project)
            .map(|p| p.subnet.free())
    }

    /// Creates a silo image (512-byte blocks, no content).
    pub fn seed_silo_image(&self, name: &str, os: &str, version: &str, size_bytes: u64) -> Uuid {
        self.seed_image(None, name, os, version, size_bytes)
    }

    /// Creates a project image (creating the project if needed).
    pub fn seed_project_image(&self, project: &str, name: &str, size_bytes: u64) -> Uuid {
        let pid = self.seed_project(project);
        if pid.is_nil() {
            return pid;
        }
        self.seed_image(Some(pid), name, "linux", "seeded", size_bytes)
    }

    fn seed_image(
        &self,
        project: Option<Uuid>,
        name: &str,
        os: &str,
        version: &str,
        size: u64,
    ) -> Uuid {
        let Some(name) = seed_name(name) else {
            return Uuid::nil();
        };
        let mut store = self.store();
        if let Some(id) = store::find_by_name(&store.images, project, name.as_str()) {
            return id;
        }
        let id = Uuid::new_v4();
        store.images.insert(
            id,
            Image {
                id,
                project_id: project,
                name,
                description: "seeded by oxide-sim".into(),
                os: os.into(),
                version: version.into(),
                size,
                block_size: storage::block_size_512(),
                data: Arc::default(),
                times: Times::now(),
            },
        );
        id
    }

    /// Adds an SSH public key to the (single) user's profile, so instance creates can refer
    /// to it by name in `ssh_public_keys` (and get it by default when that is omitted).
    pub fn seed_ssh_key(&self, name: &str, public_key: &str) -> Uuid {
        let mut store = self.store();
        if let Some(k) = store.ssh_keys.values().find(|k| k.name == name) {
            return k.id;
        }
        let id = Uuid::new_v4();
        store.ssh_keys.insert(
            id,
            SshKey {
                id,
                name: name.into(),
                public_key: public_key.into(),
            },
        );
        id
    }
}

fn seed_name(name: &str) -> Option<oxide::types::Name> {
    let valid = names::check_name(name)
        .map_err(|e| e.to_string())
        .and_then(|()| oxide::types::Name::try_from(name).map_err(|e| e.to_string()));
    match valid {
        Ok(n) => Some(n),
        Err(e) => {
            tracing::error!(name, error = %e, "refusing to seed an invalid name");
            None
        }
    }
}
