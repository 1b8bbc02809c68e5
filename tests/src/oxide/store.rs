//! The simulated rack's state: projects, instances, disks, snapshots, images, floating IPs,
//! anti-affinity groups and the user's SSH keys, plus the lookups (selectors) and the
//! conversions to the SDK's view types.
//!
//! Everything here is synchronous and runs under the simulator's single lock; no I/O, no
//! timers and no callbacks live in this module.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use oxide::types;
use serde_json::{Value, json};
use uuid::Uuid;

use super::error::ApiError;
use super::names::{Ref, parse_ref};

/// Sparse disk contents: offset → non-zero chunk written there. Shared (copy-on-write) between
/// a disk, its snapshots and images made from them.
pub type Blocks = Arc<BTreeMap<u64, Vec<u8>>>;

/// Instance run state (the subset of nexus states the simulator produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Being created (only with a non-zero `create_to_starting`).
    Creating,
    /// Booting.
    Starting,
    /// Running.
    Running,
    /// Shutting down.
    Stopping,
    /// Stopped (no VMM).
    Stopped,
    /// Rebooting.
    Rebooting,
    /// Failed.
    Failed,
}

impl RunState {
    /// Wire name.
    pub fn label(self) -> &'static str {
        match self {
            RunState::Creating => "creating",
            RunState::Starting => "starting",
            RunState::Running => "running",
            RunState::Stopping => "stopping",
            RunState::Stopped => "stopped",
            RunState::Rebooting => "rebooting",
            RunState::Failed => "failed",
        }
    }

    fn view(self) -> types::InstanceState {
        match self {
            RunState::Creating => types::InstanceState::Creating,
            RunState::Starting => types::InstanceState::Starting,
            RunState::Running => types::InstanceState::Running,
            RunState::Stopping => types::InstanceState::Stopping,
            RunState::Stopped => types::InstanceState::Stopped,
            RunState::Rebooting => types::InstanceState::Rebooting,
            RunState::Failed => types::InstanceState::Failed,
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Disk state (the subset the simulator produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskState {
    /// Created for import, waiting for `bulk-write-start` or `finalize`.
    ImportReady,
    /// Accepting bulk writes.
    ImportingFromBulkWrites,
    /// Usable, not attached.
    Detached,
    /// Attached to an instance.
    Attached(Uuid),
    /// Unavailable (settable only by seeding).
    Faulted,
}

impl DiskState {
    /// Wire name.
    pub fn label(self) -> &'static str {
        match self {
            DiskState::ImportReady => "import_ready",
            DiskState::ImportingFromBulkWrites => "importing_from_bulk_writes",
            DiskState::Detached => "detached",
            DiskState::Attached(_) => "attached",
            DiskState::Faulted => "faulted",
        }
    }

    /// omicron's `Debug` rendering, which appears in some of its messages.
    pub fn debug_name(self) -> &'static str {
        match self {
            DiskState::ImportReady => "ImportReady",
            DiskState::ImportingFromBulkWrites => "ImportingFromBulkWrites",
            DiskState::Detached => "Detached",
            DiskState::Attached(_) => "Attached",
            DiskState::Faulted => "Faulted",
        }
    }

    fn view(self) -> types::DiskState {
        match self {
            DiskState::ImportReady => types::DiskState::ImportReady,
            DiskState::ImportingFromBulkWrites => types::DiskState::ImportingFromBulkWrites,
            DiskState::Detached => types::DiskState::Detached,
            DiskState::Attached(i) => types::DiskState::Attached(i),
            DiskState::Faulted => types::DiskState::Faulted,
        }
    }
}

/// Creation/modification timestamps shared by every resource.
#[derive(Clone, Copy, Debug)]
pub struct Times {
    pub created: DateTime<Utc>,
    pub modified: DateTime<Utc>,
}

impl Times {
    pub fn now() -> Self {
        let t = Utc::now();
        Self {
            created: t,
            modified: t,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Project {
    pub id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub times: Times,
    /// Id of the project's only VPC, `default`.
    pub vpc_id: Uuid,
    /// Id of that VPC's only subnet, `default`.
    pub subnet_id: Uuid,
    /// That VPC's firewall rules (a new project gets nexus's three defaults).
    pub firewall_rules: Vec<types::VpcFirewallRule>,
    /// The addresses of that subnet and which are in use.
    pub subnet: super::subnet::VpcSubnet,
    /// VPC `default` was deleted (its rules and router went with it); the project keeps
    /// living without it, as on a rack.
    pub vpc_deleted: bool,
    /// Subnet `default` was deleted.
    pub subnet_deleted: bool,
    /// Subnets a user added to VPC `default` (never holding a NIC here).
    pub extra_subnets: Vec<ExtraSubnet>,
}

/// A subnet made with `POST /v1/vpc-subnets` in VPC `default`.
#[derive(Clone, Debug)]
pub struct ExtraSubnet {
    pub id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub ipv4_block: types::Ipv4Net,
    pub ipv6_block: types::Ipv6Net,
    pub times: Times,
}

impl Project {
    /// A new project with its `default` VPC, that VPC's default firewall rules and its
    /// `default` subnet laid onto `subnet`.
    pub fn new(name: types::Name, description: String, subnet: super::subnet::VpcSubnet) -> Self {
        let vpc_id = Uuid::new_v4();
        Self {
            id: Uuid::new_v4(),
            name,
            description,
            times: Times::now(),
            vpc_id,
            subnet_id: Uuid::new_v4(),
            firewall_rules: super::firewall_rules::materialize(
                vpc_id,
                super::firewall_rules::default_rules(),
            ),
            subnet,
            vpc_deleted: false,
            subnet_deleted: false,
            extra_subnets: Vec::new(),
        }
    }
}

pub use super::console::Console;

/// One NIC of an instance, in subnet `default` of VPC `default`.
#[derive(Clone, Debug)]
pub struct Nic {
    pub id: Uuid,
    pub name: types::Name,
    pub description: String,
    /// Private IPv4 address (a loopback stand-in, see `subnet.rs`).
    pub ipv4: Option<Ipv4Addr>,
    pub ipv4_transit: Vec<types::Ipv4Net>,
    /// Private IPv6 address in the subnet's /64.
    pub ipv6: Option<std::net::Ipv6Addr>,
    pub ipv6_transit: Vec<types::Ipv6Net>,
    pub primary: bool,
}

impl Instance {
    /// The primary NIC's IPv4 address, if it has one.
    pub fn private_ip(&self) -> Option<Ipv4Addr> {
        self.nics.iter().find(|n| n.primary).and_then(|n| n.ipv4)
    }
}

#[derive(Clone, Debug)]
pub struct Instance {
    pub id: Uuid,
    pub project_id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub hostname: String,
    pub ncpus: u16,
    pub memory: u64,
    pub state: RunState,
    /// Bumped on every state change; a timer only fires if the generation it was armed with
    /// is still current, which cancels stale transitions.
    pub generation: u64,
    pub times: Times,
    pub time_run_state_updated: DateTime<Utc>,
    pub user_data: Vec<u8>,
    /// Public key material resolved from `ssh_public_keys` at create time.
    pub ssh_keys: Vec<String>,
    pub boot_disk_id: Option<Uuid>,
    pub ephemeral_ips: Vec<Ipv4Addr>,
    /// The instance's NICs, the primary first (none for `network_interfaces: none`).
    pub nics: Vec<Nic>,
    pub snat_first_port: u16,
    pub auto_restart_policy: Option<types::InstanceAutoRestartPolicy>,
    /// Nexus's `intended_state == Running`: set by a create with `start` and by a start,
    /// cleared by a stop. Only such instances are restarted automatically.
    pub intended_running: bool,
    /// When nexus last restarted the instance by itself.
    pub time_last_auto_restarted: Option<DateTime<Utc>>,
    pub cpu_platform: Option<types::InstanceCpuPlatform>,
    pub console: Console,
}

#[derive(Clone, Debug)]
pub struct Disk {
    pub id: Uuid,
    pub project_id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub size: u64,
    pub block_size: types::BlockSize,
    pub state: DiskState,
    pub image_id: Option<Uuid>,
    pub snapshot_id: Option<Uuid>,
    pub read_only: bool,
    pub data: Blocks,
    pub times: Times,
    /// Local storage (`disk_type: local`).
    pub local: bool,
}

#[derive(Clone, Debug)]
pub struct Snapshot {
    pub id: Uuid,
    pub project_id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub disk_id: Uuid,
    pub size: u64,
    pub block_size: types::BlockSize,
    pub data: Blocks,
    pub times: Times,
}

#[derive(Clone, Debug)]
pub struct Image {
    pub id: Uuid,
    /// `None` for silo images.
    pub project_id: Option<Uuid>,
    pub name: types::Name,
    pub description: String,
    pub os: String,
    pub version: String,
    pub size: u64,
    pub block_size: types::BlockSize,
    pub data: Blocks,
    pub times: Times,
}

#[derive(Clone, Debug)]
pub struct FloatingIp {
    pub id: Uuid,
    pub project_id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub ip: Ipv4Addr,
    pub instance_id: Option<Uuid>,
    pub times: Times,
}

#[derive(Clone, Debug)]
pub struct AntiAffinityGroup {
    pub id: Uuid,
    pub project_id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub policy: types::AffinityPolicy,
    pub failure_domain: types::FailureDomain,
    /// Member instance ids, in insertion order.
    pub members: Vec<Uuid>,
    pub times: Times,
}

/// An affinity group: created, listed and deleted; the simulator places no member in one
/// (the product never asks for affinity, only anti-affinity).
#[derive(Clone, Debug)]
pub struct AffinityGroup {
    pub id: Uuid,
    pub project_id: Uuid,
    pub name: types::Name,
    pub description: String,
    pub policy: types::AffinityPolicy,
    pub failure_domain: types::FailureDomain,
    pub times: Times,
}

#[derive(Clone, Debug)]
pub struct SshKey {
    pub id: Uuid,
    pub name: String,
    pub public_key: String,
}

/// A resource that lives in a project under a unique name.
pub trait Named {
    fn name(&self) -> &str;
    fn project(&self) -> Option<Uuid>;
}

macro_rules! named {
    ($t:ty) => {
        impl Named for $t {
            fn name(&self) -> &str {
                self.name.as_str()
            }
            fn project(&self) -> Option<Uuid> {
                Some(self.project_id)
            }
        }
    };
}
named!(Instance);
named!(Disk);
named!(Snapshot);
named!(FloatingIp);
named!(AntiAffinityGroup);
named!(AffinityGroup);

impl Named for Image {
    fn name(&self) -> &str {
        self.name.as_str()
    }
    fn project(&self) -> Option<Uuid> {
        self.project_id
    }
}

/// Kind of resource, for messages: its not-found name and nexus's two selector refusals
/// (each `*_lookup` in omicron `nexus/src/app/*.rs` words them its own way).
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// omicron `ResourceType` display name (`floating-ip`).
    pub resource: &'static str,
    /// The refusal of an id given with a project.
    pub id_with_project: &'static str,
    /// The refusal of a name given without a project.
    pub name_without_project: &'static str,
}

/// omicron `nexus/src/app/instance.rs:384-387`.
pub const INSTANCE: Kind = Kind {
    resource: "instance",
    id_with_project: "when providing instance as an ID project should not be specified",
    name_without_project: "instance should either be UUID or project should be specified",
};
/// omicron `nexus/src/app/disk.rs:62-66`.
pub const DISK: Kind = Kind {
    resource: "disk",
    id_with_project: "when providing disk as an ID project should not be specified",
    name_without_project: "disk should either be UUID or project should be specified",
};
/// omicron `nexus/src/app/snapshot.rs:60-66`.
pub const SNAPSHOT: Kind = Kind {
    resource: "snapshot",
    id_with_project: "when providing snapshot as an ID, project should not be specified",
    name_without_project: "snapshot should either be an ID or project should be specified",
};
/// omicron `nexus/src/app/image.rs:76-78 (a name alone is a silo image there, looked up by the image routes themselves)`.
pub const IMAGE: Kind = Kind {
    resource: "image",
    id_with_project: "when providing image as an ID, project should not be specified",
    name_without_project: "image should either be an ID or project should be specified",
};
/// omicron `nexus/src/app/external_ip.rs:88-91`.
pub const FLOATING_IP: Kind = Kind {
    resource: "floating-ip",
    id_with_project: "when providing Floating IP as an ID project should not be specified",
    name_without_project: "Floating IP should either be UUID or project should be specified",
};
/// omicron `nexus/src/app/affinity.rs:98-101`.
pub const ANTI_AFFINITY_GROUP: Kind = Kind {
    resource: "anti-affinity-group",
    id_with_project: "when providing anti_affinity_group as an ID, project should not be specified",
    name_without_project: "anti_affinity_group should either be UUID or project should be specified",
};
/// omicron `nexus/src/app/affinity.rs:59-62`.
pub const AFFINITY_GROUP: Kind = Kind {
    resource: "affinity-group",
    id_with_project: "when providing affinity_group as an ID, project should not be specified",
    name_without_project: "affinity_group should either be UUID or project should be specified",
};

/// All state of one simulated rack (one silo).
#[derive(Debug)]
pub struct Store {
    pub projects: BTreeMap<Uuid, Project>,
    pub instances: BTreeMap<Uuid, Instance>,
    pub disks: BTreeMap<Uuid, Disk>,
    pub snapshots: BTreeMap<Uuid, Snapshot>,
    pub images: BTreeMap<Uuid, Image>,
    pub floating_ips: BTreeMap<Uuid, FloatingIp>,
    pub groups: BTreeMap<Uuid, AntiAffinityGroup>,
    pub affinity_groups: BTreeMap<Uuid, AffinityGroup>,
    pub ssh_keys: BTreeMap<Uuid, SshKey>,
    /// Id of the single IP pool (`default`).
    pub ip_pool_id: Uuid,
    /// Address shared by all instances for outbound NAT.
    pub snat_ip: Option<Ipv4Addr>,
    /// Round-robin counter for SNAT port ranges.
    pub snat_next: u16,
    /// Which loopback /22 the next project's subnet takes (a random start, then one after
    /// another, so the projects of one simulator and of simulators side by side stay apart).
    pub next_subnet: u32,
    /// Sizes of the bulk writes received (admin counters; not rack state).
    pub bulk_writes: BulkWriteStats,
    /// The device token the API accepts, as `GET /v1/me/access-tokens` shows it (the one
    /// user's only token; the bearer value lives beside the store).
    pub device_token: DeviceToken,
}

/// A device access token's view: id, creation, end (None: it never expires). Nexus lists a
/// user's tokens without the expired ones and refuses an expired one with 401
/// (omicron@065b4d7b `nexus/db-queries/src/db/datastore/device_auth.rs`,
/// `current_user_token_list`; omicron@14861487 `nexus/tests/integration_tests/device_auth.rs`,
/// `test_device_token_expiration`).
#[derive(Debug, Clone)]
pub struct DeviceToken {
    pub id: Uuid,
    pub time_created: DateTime<Utc>,
    pub time_expires: Option<DateTime<Utc>>,
}

impl DeviceToken {
    /// A new token that never expires (a silo without `device_token_max_ttl_seconds`).
    pub fn fresh() -> DeviceToken {
        DeviceToken {
            id: Uuid::new_v4(),
            time_created: Utc::now(),
            time_expires: None,
        }
    }

    /// Whether it has expired at `now` (it is then refused, and no longer listed).
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.time_expires.is_some_and(|end| end <= now)
    }
}

/// What the bulk writes since start (or the last counter reset) carried, so tests can show
/// that an upload never sent a write over the pantry's limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BulkWriteStats {
    /// Writes whose data decoded (accepted or refused).
    pub writes: u64,
    /// Largest decoded write seen, in bytes.
    pub max_decoded_bytes: u64,
    /// Writes refused for carrying more than the limit.
    pub over_limit: u64,
    /// Decoded bytes of all those writes, summed (what a benchmark reports as written).
    pub bytes: u64,
}

impl BulkWriteStats {
    /// Counts one decoded write of `len` bytes against `limit`.
    pub fn record(&mut self, len: usize, limit: usize) {
        let len64 = u64::try_from(len).unwrap_or(u64::MAX);
        self.writes += 1;
        self.bytes = self.bytes.saturating_add(len64);
        self.max_decoded_bytes = self.max_decoded_bytes.max(len64);
        if len > limit {
            self.over_limit += 1;
        }
    }
}

/// Parses a path parameter selector.
pub fn path_ref(raw: &str) -> Result<Ref, ApiError> {
    parse_ref(raw).map_err(|e| ApiError::bad_path(format!("unable to parse '{raw}': {e}")))
}

/// Parses a query parameter selector.
pub fn query_ref(raw: &str) -> Result<Ref, ApiError> {
    parse_ref(raw).map_err(ApiError::bad_query)
}

impl Store {
    pub fn new(snat_ip: Option<Ipv4Addr>) -> Self {
        Self {
            projects: BTreeMap::new(),
            instances: BTreeMap::new(),
            disks: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            images: BTreeMap::new(),
            floating_ips: BTreeMap::new(),
            groups: BTreeMap::new(),
            affinity_groups: BTreeMap::new(),
            ssh_keys: BTreeMap::new(),
            ip_pool_id: Uuid::new_v4(),
            snat_ip,
            snat_next: 0,
            next_subnet: rand::random_range(0..super::subnet::VpcSubnet::slots()),
            bulk_writes: BulkWriteStats::default(),
            device_token: DeviceToken::fresh(),
        }
    }

    /// A new project, with the next loopback /22 for its subnet.
    pub fn new_project(&mut self, name: types::Name, description: String) -> Project {
        let subnet = super::subnet::VpcSubnet::nth(self.next_subnet);
        self.next_subnet = self.next_subnet.wrapping_add(1);
        Project::new(name, description, subnet)
    }

    /// Resolves a project selector.
    pub fn project_id(&self, r: &Ref) -> Result<Uuid, ApiError> {
        match r {
            Ref::Id(id) => self
                .projects
                .contains_key(id)
                .then_some(*id)
                .ok_or_else(|| ApiError::not_found_by_id("project", id)),
            Ref::Name(n) => self
                .projects
                .values()
                .find(|p| p.name.as_str() == n)
                .map(|p| p.id)
                .ok_or_else(|| ApiError::not_found_by_name("project", n)),
        }
    }

    /// Resolves a raw `project` query parameter.
    pub fn project_param(&self, raw: &str) -> Result<Uuid, ApiError> {
        self.project_id(&query_ref(raw)?)
    }

    /// Bytes of virtual storage the silo has provisioned: every disk and every snapshot at its
    /// full size, whatever was written (omicron charges a disk in `disk_create`'s
    /// `sdc_account_space` and a snapshot in `snapshot_create`'s `ssc_account_space`, both at
    /// their `size`).
    pub fn storage_provisioned(&self) -> u64 {
        let disks = self.disks.values().map(|d| d.size);
        let snapshots = self.snapshots.values().map(|s| s.size);
        disks.chain(snapshots).fold(0, u64::saturating_add)
    }

    pub fn project_name(&self, id: Uuid) -> String {
        self.projects
            .get(&id)
            .map(|p| p.name.to_string())
            .unwrap_or_default()
    }
}

/// Finds a named resource by name inside `project` (`None` = silo scope).
pub fn find_by_name<T: Named>(
    map: &BTreeMap<Uuid, T>,
    project: Option<Uuid>,
    name: &str,
) -> Option<Uuid> {
    map.iter()
        .find(|(_, v)| v.project() == project && v.name() == name)
        .map(|(id, _)| *id)
}

/// Resolves a resource selector the way nexus does: an id alone, or a name with a project.
pub fn select<T: Named>(
    store: &Store,
    map: &BTreeMap<Uuid, T>,
    kind: Kind,
    raw: &str,
    project: Option<&str>,
) -> Result<Uuid, ApiError> {
    let r = path_ref(raw)?;
    let project = project.map(query_ref).transpose()?;
    select_ref(store, map, kind, &r, project.as_ref())
}

/// [`select`] on already-parsed selectors.
pub fn select_ref<T: Named>(
    store: &Store,
    map: &BTreeMap<Uuid, T>,
    kind: Kind,
    r: &Ref,
    project: Option<&Ref>,
) -> Result<Uuid, ApiError> {
    match (r, project) {
        (Ref::Id(id), None) => map
            .contains_key(id)
            .then_some(*id)
            .ok_or_else(|| ApiError::not_found_by_id(kind.resource, id)),
        (Ref::Name(name), Some(p)) => {
            let pid = store.project_id(p)?;
            find_by_name(map, Some(pid), name)
                .ok_or_else(|| ApiError::not_found_by_name(kind.resource, name))
        }
        (Ref::Id(_), Some(_)) => Err(ApiError::invalid_request(kind.id_with_project)),
        (Ref::Name(_), None) => Err(ApiError::invalid_request(kind.name_without_project)),
    }
}

// ---- views -------------------------------------------------------------------------------

impl Project {
    pub fn view(&self) -> types::Project {
        types::Project {
            description: self.description.clone(),
            id: self.id,
            name: self.name.clone(),
            time_created: self.times.created,
            time_modified: self.times.modified,
        }
    }
}

impl Instance {
    /// An unset policy means `best_effort` (omicron db-model `InstanceAutoRestart::DEFAULT_POLICY`).
    pub fn auto_restart_enabled(&self) -> bool {
        !matches!(
            self.auto_restart_policy,
            Some(types::InstanceAutoRestartPolicy::Never)
        )
    }

    pub fn view(&self) -> types::Instance {
        types::Instance {
            auto_restart_cooldown_expiration: None,
            auto_restart_enabled: self.auto_restart_enabled(),
            auto_restart_policy: self.auto_restart_policy,
            boot_disk_id: self.boot_disk_id,
            cpu_platform: self.cpu_platform,
            description: self.description.clone(),
            enable_jumbo_frames: false,
            hostname: self.hostname.clone(),
            id: self.id,
            memory: types::ByteCount(self.memory),
            name: self.name.clone(),
            ncpus: types::InstanceCpuCount(self.ncpus),
            project_id: self.project_id,
            run_state: self.state.view(),
            time_created: self.times.created,
            time_last_auto_restarted: self.time_last_auto_restarted,
            time_modified: self.times.modified,
            time_run_state_updated: self.time_run_state_updated,
        }
    }
}

impl Disk {
    pub fn view(&self) -> types::Disk {
        types::Disk {
            block_size: self.block_size.clone(),
            description: self.description.clone(),
            device_path: format!("/mnt/{}", self.name.as_str()),
            disk_type: if self.local {
                types::DiskType::Local
            } else {
                types::DiskType::Distributed
            },
            id: self.id,
            image_id: self.image_id,
            name: self.name.clone(),
            project_id: self.project_id,
            read_only: self.read_only,
            size: types::ByteCount(self.size),
            snapshot_id: self.snapshot_id,
            state: self.state.view(),
            time_created: self.times.created,
            time_modified: self.times.modified,
        }
    }
}

impl Snapshot {
    pub fn view(&self) -> types::Snapshot {
        types::Snapshot {
            description: self.description.clone(),
            disk_id: self.disk_id,
            id: self.id,
            name: self.name.clone(),
            project_id: self.project_id,
            size: types::ByteCount(self.size),
            state: types::SnapshotState::Ready,
            time_created: self.times.created,
            time_modified: self.times.modified,
        }
    }
}

impl Image {
    pub fn view(&self) -> types::Image {
        types::Image {
            block_size: self.block_size.clone(),
            description: self.description.clone(),
            digest: None,
            id: self.id,
            name: self.name.clone(),
            os: self.os.clone(),
            project_id: self.project_id,
            size: types::ByteCount(self.size),
            time_created: self.times.created,
            time_modified: self.times.modified,
            version: self.version.clone(),
        }
    }
}

impl FloatingIp {
    pub fn view(&self, pool: Uuid) -> types::FloatingIp {
        types::FloatingIp {
            description: self.description.clone(),
            id: self.id,
            instance_id: self.instance_id,
            ip: IpAddr::V4(self.ip),
            ip_pool_id: pool,
            name: self.name.clone(),
            project_id: self.project_id,
            time_created: self.times.created,
            time_modified: self.times.modified,
        }
    }

    pub fn external_view(&self, pool: Uuid) -> types::ExternalIp {
        types::ExternalIp::Floating {
            description: self.description.clone(),
            id: self.id,
            instance_id: self.instance_id,
            ip: IpAddr::V4(self.ip),
            ip_pool_id: pool,
            name: self.name.clone(),
            project_id: self.project_id,
            time_created: self.times.created,
            time_modified: self.times.modified,
        }
    }
}

impl AffinityGroup {
    pub fn view(&self) -> types::AffinityGroup {
        types::AffinityGroup {
            description: self.description.clone(),
            failure_domain: self.failure_domain,
            id: self.id,
            name: self.name.clone(),
            policy: self.policy,
            project_id: self.project_id,
            time_created: self.times.created,
            time_modified: self.times.modified,
        }
    }
}

impl Project {
    /// Names of the subnets of VPC `default` (none once the VPC is gone).
    pub fn subnet_names(&self) -> Vec<String> {
        let default = (!self.subnet_deleted).then(|| "default".to_owned());
        default
            .into_iter()
            .chain(self.extra_subnets.iter().map(|s| s.name.to_string()))
            .collect()
    }
}

impl AntiAffinityGroup {
    pub fn view(&self) -> types::AntiAffinityGroup {
        types::AntiAffinityGroup {
            description: self.description.clone(),
            failure_domain: self.failure_domain,
            id: self.id,
            name: self.name.clone(),
            policy: self.policy,
            project_id: self.project_id,
            time_created: self.times.created,
            time_modified: self.times.modified,
        }
    }
}

impl Store {
    /// Member view of instance `id` (for anti-affinity group member lists).
    pub fn member_view(&self, id: Uuid) -> Option<types::AntiAffinityGroupMember> {
        self.instances
            .get(&id)
            .map(|i| types::AntiAffinityGroupMember::Instance {
                id: i.id,
                name: i.name.clone(),
                run_state: i.state.view(),
            })
    }

    /// Floating IPs attached to instance `id`.
    pub fn floating_of(&self, id: Uuid) -> impl Iterator<Item = &FloatingIp> {
        self.floating_ips
            .values()
            .filter(move |f| f.instance_id == Some(id))
    }

    /// Ephemeral and attached floating addresses of instance `id` (what is reachable).
    pub fn reachable_ips(&self, id: Uuid) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .instances
            .get(&id)
            .map(|i| i.ephemeral_ips.iter().map(|ip| IpAddr::V4(*ip)).collect())
            .unwrap_or_default();
        ips.extend(self.floating_of(id).map(|f| IpAddr::V4(f.ip)));
        ips
    }

    /// Everything, for leak checks and debugging.
    pub fn dump(&self) -> Value {
        let projects: Vec<Value> = self
            .projects
            .values()
            .map(|p| {
                let vpcs: Vec<&str> = if p.vpc_deleted {
                    Vec::new()
                } else {
                    vec!["default"]
                };
                let rules: Vec<String> = p
                    .firewall_rules
                    .iter()
                    .map(|r| r.name.to_string())
                    .collect();
                json!({"id": p.id, "name": p.name, "vpcs": vpcs, "subnets": p.subnet_names(),
                    "firewall_rules": rules})
            })
            .collect();
        let instances: Vec<Value> = self
            .instances
            .values()
            .map(|i| {
                let disks: Vec<String> = self
                    .disks
                    .values()
                    .filter(|d| d.state == DiskState::Attached(i.id))
                    .map(|d| d.name.to_string())
                    .collect();
                json!({
                    "id": i.id,
                    "name": i.name,
                    "project": self.project_name(i.project_id),
                    "state": i.state.label(),
                    "description": i.description,
                    "hostname": i.hostname,
                    "external_ips": self.reachable_ips(i.id),
                    "disks": disks,
                    "auto_restart_policy": i.auto_restart_policy,
                })
            })
            .collect();
        let disks: Vec<Value> = self
            .disks
            .values()
            .map(|d| {
                json!({
                    "id": d.id,
                    "name": d.name,
                    "project": self.project_name(d.project_id),
                    "state": d.state.label(),
                    "instance": match d.state { DiskState::Attached(i) => Some(i), _ => None },
                    "size": d.size,
                    "bytes_written": written(&d.data),
                })
            })
            .collect();
        let snapshots: Vec<Value> = self
            .snapshots
            .values()
            .map(|s| {
                json!({
                    "id": s.id,
                    "name": s.name,
                    "project": self.project_name(s.project_id),
                    "disk_id": s.disk_id,
                    "size": s.size,
                })
            })
            .collect();
        let images: Vec<Value> = self
            .images
            .values()
            .map(|i| {
                json!({
                    "id": i.id,
                    "name": i.name,
                    "project": i.project_id.map(|p| self.project_name(p)),
                    "os": i.os,
                    "version": i.version,
                    "size": i.size,
                    "bytes_written": written(&i.data),
                })
            })
            .collect();
        let floating_ips: Vec<Value> = self
            .floating_ips
            .values()
            .map(|f| {
                json!({
                    "id": f.id,
                    "name": f.name,
                    "project": self.project_name(f.project_id),
                    "ip": f.ip,
                    "instance": f.instance_id,
                })
            })
            .collect();
        let groups: Vec<Value> = self
            .groups
            .values()
            .map(|g| {
                json!({
                    "id": g.id,
                    "name": g.name,
                    "project": self.project_name(g.project_id),
                    "members": g.members,
                })
            })
            .collect();
        let affinity_groups: Vec<Value> = self
            .affinity_groups
            .values()
            .map(
                |g| json!({"id": g.id, "name": g.name, "project": self.project_name(g.project_id)}),
            )
            .collect();
        json!({
            "affinity_groups": affinity_groups,
            "projects": projects,
            "instances": instances,
            "disks": disks,
            "snapshots": snapshots,
            "images": images,
            "floating_ips": floating_ips,
            "anti_affinity_groups": groups,
        })
    }
}

/// `len` bytes of sparse contents from `offset` (zeros where nothing was written).
pub fn read_blocks(b: &Blocks, page: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let end = offset.saturating_add(len as u64);
    let first = offset - offset % page;
    for (start, buf) in b.range(first..end) {
        let buf_end = start + buf.len() as u64;
        let from = offset.max(*start);
        let to = end.min(buf_end);
        if from >= to {
            continue;
        }
        let (src, dst) = ((from - start) as usize, (from - offset) as usize);
        let n = (to - from) as usize;
        out[dst..dst + n].copy_from_slice(&buf[src..src + n]);
    }
    out
}

fn written(b: &Blocks) -> usize {
    b.values().map(Vec::len).sum()
}
