//! Instance routes: list/create/view/delete, start/stop/reboot, external IPs, attached disks
//! and the serial console, with nexus's limits and state rules.
//!
//! Create validates everything before it changes anything, so a refused request leaves no
//! half-created disks, addresses or memberships behind.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::StatusCode;
use oxide::types;
use uuid::Uuid;

use super::console;
use super::error::ApiError;
use super::handler::{Ctx, Reply, body_name};
use super::lifecycle::{self, Event};
use super::names::{self, Ref};
use super::pagination::{ListParams, Page};
use super::storage::{self, DiskPlan};
use super::store::{
    self, ANTI_AFFINITY_GROUP, Console, DiskState, FLOATING_IP, INSTANCE, Instance, RunState,
    Store, Times,
};

const GIB: u64 = 1 << 30;
const MAX_VCPUS: u16 = 254;
const MAX_MEMORY: u64 = 1536 * GIB;
const MAX_DISKS: usize = 12;
const MAX_EXTERNAL_IPS: usize = 32;
const MAX_EPHEMERAL_IPS: usize = 2;
const MAX_NICS: usize = 8;
const MAX_SSH_KEYS: usize = 100;
const MAX_USER_DATA: usize = 32 * 1024;
/// Anti-affinity limits (members per group, groups per instance).
pub const MAX_GROUP_MEMBERS: usize = 32;
pub const MAX_GROUPS_PER_INSTANCE: usize = 16;
/// SNAT port block size: four instances share one address.
const SNAT_PORTS: u16 = 16384;

/// Resolves the `{instance}` path parameter with the `project` selector.
pub fn select(store: &Store, raw: &str, project: Option<&str>) -> Result<Uuid, ApiError> {
    store::select(store, &store.instances, INSTANCE, raw, project)
}

fn instance<'s>(store: &'s Store, id: &Uuid) -> Result<&'s Instance, ApiError> {
    store.instances.get(id).ok_or_else(ApiError::internal)
}

fn view_reply(store: &Store, id: Uuid, status: StatusCode) -> Result<Reply, ApiError> {
    Reply::json(status, &instance(store, &id)?.view())
}

pub fn list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("instances", cx.query)?;
    let pid = cx.store.project_param(lp.required_project()?)?;
    let items = cx
        .store
        .instances
        .values()
        .filter(|i| i.project_id == pid)
        .map(|i| (i.name.to_string(), i.id, i.view()))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

pub fn view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select(cx.store, cx.param(0), cx.project())?;
    view_reply(cx.store, id, StatusCode::OK)
}

fn check_cpu_memory(ncpus: u16, memory: u64) -> Result<(), ApiError> {
    if ncpus > MAX_VCPUS {
        return Err(ApiError::invalid_request(format!(
            "cannot have more than {MAX_VCPUS} vCPUs per instance"
        )));
    }
    if memory < GIB {
        return Err(ApiError::invalid_value(
            "size",
            "memory must be at least 1 GiB",
        ));
    }
    if !memory.is_multiple_of(GIB) {
        return Err(ApiError::invalid_value(
            "size",
            "memory must be divisible by 1 GiB",
        ));
    }
    if memory > MAX_MEMORY {
        return Err(ApiError::invalid_value(
            "size",
            "memory must be less than or equal to 1536 GiB",
        ));
    }
    Ok(())
}

/// Parse-level checks nexus performs while deserializing the body (400 without a code).
fn check_create_body(body: &types::InstanceCreate) -> Result<Vec<u8>, ApiError> {
    body_name(&body.name)?;
    names::check_hostname(body.hostname.as_str()).map_err(ApiError::bad_body)?;
    for d in body.boot_disk.iter().chain(&body.disks) {
        match d {
            types::InstanceDiskAttachment::Create { name, .. }
            | types::InstanceDiskAttachment::Attach { name } => body_name(name)?,
        }
    }
    for ip in &body.external_ips {
        if let types::ExternalIpCreate::Floating { floating_ip } = ip {
            names::body_ref(floating_ip).map_err(ApiError::bad_body)?;
        }
    }
    for r in body
        .anti_affinity_groups
        .iter()
        .chain(body.ssh_public_keys.iter().flatten())
    {
        names::body_ref(r).map_err(ApiError::bad_body)?;
    }
    if let types::InstanceNetworkInterfaceAttachment::Create(nics) = &body.network_interfaces {
        for nic in nics {
            body_name(&nic.name)?;
            body_name(&nic.vpc_name)?;
            body_name(&nic.subnet_name)?;
        }
    }
    let user_data = STANDARD
        .decode(body.user_data.as_bytes())
        .map_err(|e| ApiError::bad_body(format!("invalid base64 in user_data: {e}")))?;
    if user_data.len() > MAX_USER_DATA {
        return Err(ApiError::bad_body(format!(
            "invalid length {}, expected less than 32 KiB",
            user_data.len()
        )));
    }
    Ok(user_data)
}

/// One planned external IP of a new instance.
enum IpPlan {
    Ephemeral,
    Floating(Uuid),
}

pub fn create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let project_raw = cx.required_project()?.to_owned();
    let body: types::InstanceCreate = cx.create_body()?;
    let user_data = check_create_body(&body)?;
    let store = &*cx.store;
    let pid = store.project_param(&project_raw)?;

    check_cpu_memory(body.ncpus.0, body.memory.0)?;
    let attachments: Vec<(bool, &types::InstanceDiskAttachment)> = body
        .boot_disk
        .iter()
        .map(|d| (true, d))
        .chain(body.disks.iter().map(|d| (false, d)))
        .collect();
    if attachments.len() > MAX_DISKS {
        return Err(ApiError::invalid_request(format!(
            "cannot attach more than {MAX_DISKS} disks to instance"
        )));
    }
    let mut disk_plans: Vec<(bool, DiskPlan)> = Vec::new();
    for (boot, d) in &attachments {
        if let types::InstanceDiskAttachment::Create {
            description,
            disk_backend,
            name,
            size,
        } = d
        {
            let plan = storage::plan_disk(store, pid, name, description, size.0, disk_backend)?;
            if matches!(plan.state, DiskState::ImportReady) {
                return Err(ApiError::invalid_request(
                    "disks created with an instance cannot import blocks",
                ));
            }
            disk_plans.push((*boot, plan));
        }
    }
    if body.external_ips.len() > MAX_EXTERNAL_IPS {
        return Err(ApiError::invalid_request(format!(
            "An instance may not have more than {MAX_EXTERNAL_IPS} external IP addresses"
        )));
    }
    if body.enable_jumbo_frames {
        return Err(ApiError::invalid_request(
            "enable_jumbo_frames may only be set on an instance when the fleet-wide \
             jumbo-frames opt-in is enabled by a fleet administrator",
        ));
    }
    let selectors: Vec<&types::PoolSelector> = body
        .external_ips
        .iter()
        .filter_map(|ip| match ip {
            types::ExternalIpCreate::Ephemeral { pool_selector } => Some(pool_selector),
            types::ExternalIpCreate::Floating { .. } => None,
        })
        .collect();
    let ephemeral = selectors.len();
    if ephemeral > MAX_EPHEMERAL_IPS {
        return Err(ApiError::invalid_request(format!(
            "An instance may not have more than {MAX_EPHEMERAL_IPS} ephemeral IP addresses"
        )));
    }
    if let [first, second] = selectors[..] {
        check_ephemeral_pair(store, first, second)?;
    }
    if let types::InstanceNetworkInterfaceAttachment::Create(nics) = &body.network_interfaces {
        if nics.len() > MAX_NICS {
            return Err(ApiError::invalid_request(format!(
                "An instance may not have more than {MAX_NICS} network interfaces"
            )));
        }
        // `!= 1`: an empty list is refused with the same words.
        let vpcs: BTreeSet<&str> = nics.iter().map(|n| n.vpc_name.as_str()).collect();
        if vpcs.len() != 1 {
            return Err(ApiError::invalid_request(
                "All interfaces must be in the same VPC",
            ));
        }
        // Every project has one VPC, `default`; NICs go into its subnet `default`.
        for nic in nics {
            if nic.vpc_name.as_str() != "default" {
                return Err(ApiError::not_found_by_name("vpc", nic.vpc_name.as_str()));
            }
            if nic.subnet_name.as_str() != "default" {
                let extra = store.projects.get(&pid).is_some_and(|p| {
                    p.extra_subnets
                        .iter()
                        .any(|s| s.name.as_str() == nic.subnet_name.as_str())
                });
                if extra {
                    // Simulator limit (ledgered): added subnets have no address space here.
                    return Err(ApiError::invalid_request(format!(
                        "the simulator places NICs only in subnet default, not in '{}'",
                        nic.subnet_name.as_str()
                    )));
                }
                return Err(ApiError::not_found_by_name(
                    "vpc-subnet",
                    nic.subnet_name.as_str(),
                ));
            }
        }
    }
    let nic_plans = plan_nics(&body)?;
    let ssh_keys = resolve_ssh_keys(store, body.ssh_public_keys.as_deref())?;
    if !body.multicast_groups.is_empty() {
        return Err(ApiError::invalid_request(
            "multicast is not enabled for this fleet",
        ));
    }
    if store::find_by_name(&store.instances, Some(pid), body.name.as_str()).is_some() {
        return Err(ApiError::already_exists("instance", body.name.as_str()));
    }

    // Anti-affinity groups, by name in this project or by id.
    let mut groups = Vec::new();
    let project_ref = Ref::Id(pid);
    for g in &body.anti_affinity_groups {
        let r = names::body_ref(g).map_err(ApiError::bad_body)?;
        let project = matches!(r, Ref::Name(_)).then_some(&project_ref);
        let gid = store::select_ref(store, &store.groups, ANTI_AFFINITY_GROUP, &r, project)?;
        if !groups.contains(&gid) {
            groups.push(gid);
        }
    }
    if groups.len() > MAX_GROUPS_PER_INSTANCE {
        return Err(ApiError::invalid_request(format!(
            "an instance may belong to at most {MAX_GROUPS_PER_INSTANCE} anti-affinity groups"
        )));
    }
    for gid in &groups {
        if store
            .groups
            .get(gid)
            .is_some_and(|g| g.members.len() >= MAX_GROUP_MEMBERS)
        {
            return Err(ApiError::invalid_request(format!(
                "anti-affinity group already has maximum allowed members ({MAX_GROUP_MEMBERS})"
            )));
        }
    }

    // Disks: names are unique among new disks and existing ones; attached disks must exist
    // here and be detached.
    let mut seen_names = BTreeSet::new();
    let mut attach_ids: Vec<(bool, Uuid)> = Vec::new();
    for (boot, d) in &attachments {
        let name = match d {
            types::InstanceDiskAttachment::Create { name, .. }
            | types::InstanceDiskAttachment::Attach { name } => name.as_str(),
        };
        if !seen_names.insert(name) {
            return Err(ApiError::invalid_request(format!(
                "disk \"{name}\" is listed more than once"
            )));
        }
        if let types::InstanceDiskAttachment::Attach { name } = d {
            let id = store::find_by_name(&store.disks, Some(pid), name.as_str())
                .ok_or_else(|| ApiError::not_found_by_name("disk", name.as_str()))?;
            let state = store.disks.get(&id).map(|d| d.state);
            if state != Some(DiskState::Detached) {
                return Err(ApiError::invalid_request(format!(
                    "cannot attach disk \"{}\": disk is {}",
                    name.as_str(),
                    state.map(DiskState::label).unwrap_or("missing")
                )));
            }
            attach_ids.push((*boot, id));
        }
    }

    // External IPs.
    let mut ip_plans = Vec::new();
    for ip in &body.external_ips {
        match ip {
            types::ExternalIpCreate::Ephemeral { pool_selector } => {
                check_pool(store, pool_selector)?;
                ip_plans.push(IpPlan::Ephemeral);
            }
            types::ExternalIpCreate::Floating { floating_ip } => {
                let r = names::body_ref(floating_ip).map_err(ApiError::bad_body)?;
                let project = matches!(r, Ref::Name(_)).then_some(&project_ref);
                let fid = store::select_ref(store, &store.floating_ips, FLOATING_IP, &r, project)?;
                let fip = store
                    .floating_ips
                    .get(&fid)
                    .ok_or_else(ApiError::internal)?;
                if fip.project_id != pid {
                    return Err(ApiError::invalid_request(
                        "floating IP must be in the same project as the instance",
                    ));
                }
                let dup = ip_plans
                    .iter()
                    .any(|p| matches!(p, IpPlan::Floating(f) if *f == fid));
                if fip.instance_id.is_some() || dup {
                    return Err(ApiError::invalid_request(
                        "floating IP cannot be attached to one instance while still attached to another",
                    ));
                }
                ip_plans.push(IpPlan::Floating(fid));
            }
        }
    }
    // nexus creates the NIC before it allocates external addresses (omicron
    // `nexus/src/app/sagas/instance_create.rs`), so a full subnet is the answer even when the
    // external pool is empty too.
    let project = cx.store.projects.get(&pid).ok_or_else(ApiError::internal)?;
    // NICs go into VPC `default`'s subnet `default`, looked up by name (omicron
    // `nexus/src/app/sagas/instance_create.rs:743-772`): gone, the create fails. No NIC, no
    // lookup.
    if !nic_plans.is_empty() {
        if project.vpc_deleted {
            return Err(ApiError::not_found_by_name("vpc", "default"));
        }
        if project.subnet_deleted {
            return Err(ApiError::not_found_by_name("vpc-subnet", "default"));
        }
    }
    let auto_v4 = nic_plans
        .iter()
        .filter(|n| matches!(n.v4, Some(None)))
        .count();
    if project.subnet.free() < auto_v4 {
        return Err(subnet_full(project));
    }
    let used_v6 = used_ipv6(cx.store, pid);
    let mut probe = project.subnet.clone();
    let mut planned_v6 = BTreeSet::new();
    for n in &nic_plans {
        if let Some(Some(off)) = n.v4
            && probe.take(off).is_none()
        {
            return Err(ApiError::invalid_request(format!(
                "The IP address '{}' is not available",
                Ipv4Addr::from(u32::from(super::subnet::RACK_BLOCK) + off)
            )));
        }
        if let Some(Some(ip)) = n.v6
            && (used_v6.contains(&ip) || !planned_v6.insert(ip))
        {
            return Err(ApiError::invalid_request(format!(
                "The IP address '{ip}' is not available"
            )));
        }
    }
    if ephemeral > cx.pool.free() {
        return Err(ApiError::insufficient_capacity(
            "No external IP addresses available",
        ));
    }

    // Each new disk's disk-create subsaga charges its size to the silo's storage quota.
    let new_storage = disk_plans
        .iter()
        .map(|(_, p)| p.size)
        .fold(0, u64::saturating_add);
    if !disk_plans.is_empty() {
        storage::check_storage_quota(cx, new_storage)?;
    }

    // ---- everything checked: apply ----
    let mut ephemeral_ips: Vec<Ipv4Addr> = Vec::new();
    for _ in 0..ephemeral {
        match cx.pool.allocate() {
            Some(ip) => ephemeral_ips.push(ip),
            None => {
                for ip in ephemeral_ips {
                    cx.pool.release(ip);
                }
                return Err(ApiError::insufficient_capacity(
                    "No external IP addresses available",
                ));
            }
        }
    }
    let mut used_v6 = used_v6;
    used_v6.extend(planned_v6);
    let project = cx
        .store
        .projects
        .get_mut(&pid)
        .ok_or_else(ApiError::internal)?;
    let mut nics = Vec::new();
    for (i, plan) in nic_plans.into_iter().enumerate() {
        let ipv4 = match plan.v4 {
            None => None,
            Some(None) => project.subnet.allocate(),
            Some(Some(off)) => project.subnet.take(off),
        };
        let ipv6 = match plan.v6 {
            None => None,
            Some(Some(ip)) => Some(ip),
            Some(None) => {
                let ip = next_ipv6(&used_v6);
                used_v6.insert(ip);
                Some(ip)
            }
        };
        nics.push(store::Nic {
            id: Uuid::new_v4(),
            name: plan.name,
            description: plan.description,
            ipv4,
            ipv4_transit: plan.v4_transit,
            ipv6,
            ipv6_transit: plan.v6_transit,
            primary: i == 0,
        });
    }
    let id = Uuid::new_v4();
    let delayed = !cx.env.timings.create_to_starting.is_zero();
    // nexus runs the start saga after the create saga and only logs its failure, so a start
    // that finds no room still answers 201, with the instance `stopped`.
    let start_refused = body.start && cx.env.faults.start_refusal(body.name.as_str()).is_some();
    let initial = match (delayed, body.start && !start_refused) {
        _ if start_refused => RunState::Stopped,
        (true, _) => RunState::Creating,
        (false, true) => RunState::Starting,
        (false, false) => RunState::Stopped,
    };
    let times = Times::now();
    let snat_first_port = (cx.store.snat_next % 4) * SNAT_PORTS;
    cx.store.snat_next = cx.store.snat_next.wrapping_add(1);
    let mut boot_disk_id = None;
    for (boot, plan) in disk_plans {
        let disk_id = storage::insert_disk(cx.store, pid, plan, DiskState::Attached(id));
        if boot {
            boot_disk_id = Some(disk_id);
        }
    }
    for (boot, disk_id) in attach_ids {
        if let Some(d) = cx.store.disks.get_mut(&disk_id) {
            d.state = DiskState::Attached(id);
            d.times.modified = times.modified;
        }
        if boot {
            boot_disk_id = Some(disk_id);
        }
    }
    cx.store.instances.insert(
        id,
        Instance {
            id,
            project_id: pid,
            name: body.name.clone(),
            description: body.description.clone(),
            hostname: body.hostname.to_string(),
            ncpus: body.ncpus.0,
            memory: body.memory.0,
            state: initial,
            generation: 0,
            times,
            time_run_state_updated: times.created,
            user_data,
            ssh_keys,
            boot_disk_id,
            ephemeral_ips,
            nics,
            snat_first_port,
            auto_restart_policy: body.auto_restart_policy,
            intended_running: body.start,
            time_last_auto_restarted: None,
            cpu_platform: body.cpu_platform,
            console: Console::default(),
        },
    );
    for plan in ip_plans {
        if let IpPlan::Floating(fid) = plan
            && let Some(f) = cx.store.floating_ips.get_mut(&fid)
        {
            f.instance_id = Some(id);
            f.times.modified = times.modified;
            cx.fx
                .events
                .push(Event::FloatingIp(IpAddr::V4(f.ip), Some(id)));
        }
    }
    for gid in groups {
        if let Some(g) = cx.store.groups.get_mut(&gid) {
            g.members.push(id);
        }
    }
    if start_refused {
        // Created and left stopped: no timers.
    } else if delayed {
        lifecycle::arm_create(cx.store, id, body.start, cx.fx, cx.env);
    } else if initial == RunState::Starting {
        // `enter` arms the boot timer; the state is already Starting.
        lifecycle::enter(cx.store, id, RunState::Starting, cx.fx, cx.env);
    }
    view_reply(cx.store, id, StatusCode::CREATED)
}

/// Checks an ephemeral IP's pool selector against the rack's single IPv4 pool `default`.
pub fn check_pool(store: &Store, sel: &types::PoolSelector) -> Result<(), ApiError> {
    match sel {
        types::PoolSelector::Auto { ip_version } => match ip_version {
            Some(types::IpVersion::V6) => Err(ApiError::invalid_request(
                "no default IPv6 IP pool is linked to this silo",
            )),
            _ => Ok(()),
        },
        types::PoolSelector::Explicit { pool } => {
            match names::body_ref(pool).map_err(ApiError::bad_body)? {
                Ref::Id(id) if id == store.ip_pool_id => Ok(()),
                Ref::Name(n) if n == "default" => Ok(()),
                Ref::Id(id) => Err(ApiError::not_found_by_id("ip-pool", &id)),
                Ref::Name(n) => Err(ApiError::not_found_by_name("ip-pool", &n)),
            }
        }
    }
}

/// `None`: all of the user's keys; `Some(list)`: exactly those (each must exist).
fn resolve_ssh_keys(
    store: &Store,
    keys: Option<&[types::NameOrId]>,
) -> Result<Vec<String>, ApiError> {
    let Some(keys) = keys else {
        return Ok(store
            .ssh_keys
            .values()
            .map(|k| k.public_key.clone())
            .collect());
    };
    // nexus looks every key up first (the first missing one is the 404) and then counts the
    // distinct keys it found.
    let mut found_ids = BTreeSet::new();
    let found = keys
        .iter()
        .map(|k| {
            let found = match names::body_ref(k).map_err(ApiError::bad_body)? {
                Ref::Id(id) => store
                    .ssh_keys
                    .get(&id)
                    .ok_or_else(|| ApiError::not_found_by_id("ssh-key", &id))?,
                Ref::Name(n) => store
                    .ssh_keys
                    .values()
                    .find(|k| k.name == n)
                    .ok_or_else(|| ApiError::not_found_by_name("ssh-key", &n))?,
            };
            Ok((found.id, found.public_key.clone()))
        })
        .collect::<Result<Vec<_>, ApiError>>()?
        .into_iter()
        .filter(|(id, _)| found_ids.insert(*id))
        .map(|(_, key)| key)
        .collect::<Vec<_>>();
    if found.len() > MAX_SSH_KEYS {
        return Err(ApiError::invalid_request(format!(
            "cannot attach more than {MAX_SSH_KEYS} ssh keys to the instance"
        )));
    }
    Ok(found)
}

/// Two ephemeral IPs must name their IP versions or pools and differ in version (omicron
/// `nexus/src/app/instance.rs` `validate_ephemeral_ip_pair`). This rack has one pool,
/// `default` (IPv4).
fn check_ephemeral_pair(
    store: &Store,
    first: &types::PoolSelector,
    second: &types::PoolSelector,
) -> Result<(), ApiError> {
    use types::PoolSelector::{Auto, Explicit};
    let version = |v: &types::IpVersion| match v {
        types::IpVersion::V4 => "v4",
        types::IpVersion::V6 => "v6",
    };
    match (first, second) {
        (Auto { ip_version: None }, _) | (_, Auto { ip_version: None }) => {
            Err(ApiError::invalid_request(
                "when requesting two ephemeral IPs, IP version or explicit pool name must be \
                 specified on each",
            ))
        }
        (
            Auto {
                ip_version: Some(a),
            },
            Auto {
                ip_version: Some(b),
            },
        ) => {
            if a == b {
                Err(ApiError::invalid_request(format!(
                    "cannot request two ephemeral IPs of the same version ({})",
                    version(a)
                )))
            } else {
                Ok(())
            }
        }
        (Explicit { pool: a }, Explicit { pool: b }) => {
            if a.to_string() == b.to_string() {
                return Err(ApiError::invalid_request(
                    "cannot request two ephemeral IPs from the same pool",
                ));
            }
            // Both must exist; the only pool there is is IPv4, so two of them are the same
            // version.
            check_pool(store, first)?;
            check_pool(store, second)?;
            Err(ApiError::invalid_request(
                "cannot request two ephemeral IPs of the same version (v4): both pools are v4",
            ))
        }
        (
            Explicit { .. },
            Auto {
                ip_version: Some(v),
            },
        )
        | (
            Auto {
                ip_version: Some(v),
            },
            Explicit { .. },
        ) => {
            let explicit = if matches!(first, Explicit { .. }) {
                first
            } else {
                second
            };
            check_pool(store, explicit)?;
            if matches!(v, types::IpVersion::V4) {
                Err(ApiError::invalid_request(
                    "cannot request two ephemeral IPs of the same version (v4): explicit pool \
                     and auto selection both specify v4",
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// nexus's answer when the subnet has no address left for the new NIC: 400 `InvalidRequest`
/// (omicron `nexus/db-queries/src/db/queries/network_interface.rs` `InsertError::into_external`,
/// `NoAvailableIpAddresses`; the instance saga passes it through unchanged).
fn subnet_full(project: &store::Project) -> ApiError {
    ApiError::invalid_request(format!(
        "No available IPv4 addresses for interface in subnet 'default' with ID '{}'",
        project.subnet_id
    ))
}

pub fn delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select(cx.store, cx.param(0), cx.project())?;
    let state = instance(cx.store, &id)?.state;
    if !matches!(state, RunState::Stopped | RunState::Failed) {
        return Err(ApiError::invalid_request(
            "cannot delete instance: instance is running or has not yet fully stopped",
        ));
    }
    let Some(inst) = cx.store.instances.remove(&id) else {
        return Err(ApiError::internal());
    };
    for ip in inst.ephemeral_ips {
        cx.pool.release(ip);
    }
    if let Some(p) = cx.store.projects.get_mut(&inst.project_id) {
        for ip in inst.nics.iter().filter_map(|n| n.ipv4) {
            p.subnet.release(ip);
        }
    }
    for d in cx.store.disks.values_mut() {
        if d.state == DiskState::Attached(id) {
            d.state = DiskState::Detached;
        }
    }
    for f in cx.store.floating_ips.values_mut() {
        if f.instance_id == Some(id) {
            f.instance_id = None;
            cx.fx.events.push(Event::FloatingIp(IpAddr::V4(f.ip), None));
        }
    }
    for g in cx.store.groups.values_mut() {
        g.members.retain(|m| *m != id);
    }
    cx.fx.events.push(Event::Deleted(id));
    Reply::no_content()
}

pub fn start(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select(cx.store, cx.param(0), cx.project())?;
    let inst = instance(cx.store, &id)?;
    let state = inst.state;
    if matches!(state, RunState::Stopped | RunState::Failed)
        && let Some(message) = cx.env.faults.start_refusal(inst.name.as_str())
    {
        return Err(ApiError::insufficient_capacity(message));
    }
    if !matches!(state, RunState::Stopping | RunState::Creating)
        && let Some(inst) = cx.store.instances.get_mut(&id)
    {
        inst.intended_running = true;
    }
    match state {
        RunState::Stopped | RunState::Failed => {
            lifecycle::enter(cx.store, id, RunState::Starting, cx.fx, cx.env);
        }
        RunState::Starting | RunState::Running | RunState::Rebooting => {}
        RunState::Stopping => {
            return Err(ApiError::conflict(
                "instance must finish stopping before it can be started",
            ));
        }
        RunState::Creating => {
            return Err(ApiError::conflict(
                "instance is in state creating but it must be stopped to be started",
            ));
        }
    }
    view_reply(cx.store, id, StatusCode::ACCEPTED)
}

pub fn stop(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select(cx.store, cx.param(0), cx.project())?;
    let state = instance(cx.store, &id)?.state;
    // Nexus records the intent before asking the sled (`instance_stop` sets intended state
    // Stopped first), which is what turns automatic restarts off.
    if state != RunState::Creating
        && let Some(inst) = cx.store.instances.get_mut(&id)
    {
        inst.intended_running = false;
    }
    match state {
        RunState::Stopped | RunState::Stopping => {}
        RunState::Failed => lifecycle::enter(cx.store, id, RunState::Stopped, cx.fx, cx.env),
        RunState::Starting | RunState::Running | RunState::Rebooting => {
            lifecycle::enter(cx.store, id, RunState::Stopping, cx.fx, cx.env);
        }
        RunState::Creating => {
            return Err(ApiError::invalid_request(
                "cannot change instance state while it is still being created",
            ));
        }
    }
    view_reply(cx.store, id, StatusCode::ACCEPTED)
}

pub fn reboot(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select(cx.store, cx.param(0), cx.project())?;
    match instance(cx.store, &id)?.state {
        RunState::Running => lifecycle::enter(cx.store, id, RunState::Rebooting, cx.fx, cx.env),
        RunState::Starting | RunState::Rebooting => {}
        RunState::Stopped => {
            return Err(ApiError::invalid_request(
                "cannot reboot an instance in state stopped with no VMM",
            ));
        }
        RunState::Stopping => {
            return Err(ApiError::conflict(
                "instance is stopping and cannot be rebooted",
            ));
        }
        RunState::Failed => {
            return Err(ApiError::invalid_request(
                "instance state cannot be changed from failed",
            ));
        }
        RunState::Creating => {
            return Err(ApiError::invalid_request(
                "cannot change instance state while it is still being created",
            ));
        }
    }
    view_reply(cx.store, id, StatusCode::ACCEPTED)
}

pub fn external_ips(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select(cx.store, cx.param(0), cx.project())?;
    let inst = instance(cx.store, &id)?;
    let pool = cx.store.ip_pool_id;
    let mut items = Vec::new();
    // SNAT first: a client taking `items[0]` as "the" external IP gets an address nothing
    // listens on, as it would on a rack where ordering is not guaranteed. nexus allocates
    // one for every instance whose primary NIC has an IPv4 stack, with or without other
    // external IPs (omicron `nexus/src/app/sagas/instance_create.rs` `create_snat_ipv4`).
    if let (Some(snat), Some(_)) = (cx.store.snat_ip, inst.private_ip()) {
        items.push(types::ExternalIp::Snat {
            first_port: inst.snat_first_port,
            ip: IpAddr::V4(snat),
            ip_pool_id: pool,
            last_port: inst.snat_first_port.saturating_add(SNAT_PORTS - 1),
        });
    }
    for ip in &inst.ephemeral_ips {
        items.push(types::ExternalIp::Ephemeral {
            ip: IpAddr::V4(*ip),
            ip_pool_id: pool,
        });
    }
    items.extend(cx.store.floating_of(id).map(|f| f.external_view(pool)));
    Reply::json(
        StatusCode::OK,
        &Page {
            items,
            next_page: None,
        },
    )
}

/// `GET /v1/network-interfaces?instance=`: the instance's NICs, in the `default` VPC.
pub fn network_interfaces(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("network-interfaces", cx.query)?;
    let raw = cx
        .query
        .get("instance")
        .ok_or_else(|| ApiError::bad_query("missing field `instance`"))?;
    let id = select(cx.store, raw, lp.project.as_deref())?;
    let inst = instance(cx.store, &id)?;
    let project = cx
        .store
        .projects
        .get(&inst.project_id)
        .ok_or_else(ApiError::internal)?;
    let mut items = Vec::new();
    for nic in &inst.nics {
        // The rack's address (172.30.x), not the loopback stand-in it lives on here.
        let v4 = nic.ipv4.map(|ip| types::PrivateIpv4Stack {
            ip: project.subnet.rack_addr(ip).unwrap_or(ip),
            transit_ips: nic.ipv4_transit.clone(),
        });
        let v6 = nic.ipv6.map(|ip| types::PrivateIpv6Stack {
            ip,
            transit_ips: nic.ipv6_transit.clone(),
        });
        let ip_stack = match (v4, v6) {
            (Some(v4), Some(v6)) => types::PrivateIpStack::DualStack { v4, v6 },
            (Some(v4), None) => types::PrivateIpStack::V4(v4),
            (None, Some(v6)) => types::PrivateIpStack::V6(v6),
            (None, None) => return Err(ApiError::internal()),
        };
        let view = types::InstanceNetworkInterface {
            description: nic.description.clone(),
            id: nic.id,
            instance_id: inst.id,
            ip_stack,
            mac: guest_mac(&nic.id)?,
            name: nic.name.clone(),
            primary: nic.primary,
            subnet_id: project.subnet_id,
            time_created: inst.times.created,
            time_modified: inst.times.created,
            vpc_id: project.vpc_id,
        };
        items.push((nic.name.to_string(), nic.id, view));
    }
    Reply::json(StatusCode::OK, &lp.page(items))
}

/// A MAC address in nexus's guest range `A8:40:25:F0:00:00`–`A8:40:25:FE:FF:FF` (omicron
/// `common/src/api/external/mod.rs` `MacAddr::MIN_GUEST_ADDR`/`MAX_GUEST_ADDR`), drawn from
/// the NIC's id.
fn guest_mac(nic_id: &Uuid) -> Result<types::MacAddr, ApiError> {
    let o = nic_id.as_bytes();
    let mac = format!(
        "a8:40:25:{:02x}:{:02x}:{:02x}",
        0xf0 + o[0] % 15,
        o[1],
        o[2]
    );
    types::MacAddr::try_from(mac).map_err(|_| ApiError::internal())
}

/// One NIC a create asks for: `v4`/`v6` are `None` for no address of that family,
/// `Some(None)` for one nexus picks, `Some(Some(_))` for an explicit one (IPv4 as the offset
/// into the subnet).
struct NicPlan {
    name: types::Name,
    description: String,
    v4: Option<Option<u32>>,
    v4_transit: Vec<types::Ipv4Net>,
    v6: Option<Option<Ipv6Addr>>,
    v6_transit: Vec<types::Ipv6Net>,
}

/// The NICs a create makes (omicron `nexus/src/app/sagas/instance_create.rs:243-258`): none
/// for `none`, the default `net0` ("default primary interface for <instance>",
/// `:746-757`) for the `default_*` kinds, the named ones for `create`; explicit addresses
/// checked as `IncompleteNetworkInterface::new` checks them.
fn plan_nics(body: &types::InstanceCreate) -> Result<Vec<NicPlan>, ApiError> {
    use types::InstanceNetworkInterfaceAttachment as A;
    let default = |v4: bool, v6: bool| -> Result<Vec<NicPlan>, ApiError> {
        Ok(vec![NicPlan {
            name: "net0".parse().map_err(|_| ApiError::internal())?,
            description: format!("default primary interface for {}", body.name.as_str()),
            v4: v4.then_some(None),
            v4_transit: Vec::new(),
            v6: v6.then_some(None),
            v6_transit: Vec::new(),
        }])
    };
    match &body.network_interfaces {
        A::None => Ok(Vec::new()),
        A::DefaultIpv4 => default(true, false),
        A::DefaultIpv6 => default(false, true),
        A::DefaultDualStack => default(true, true),
        A::Create(nics) => nics
            .iter()
            .map(|n| {
                let (v4, v6) = match &n.ip_config {
                    types::PrivateIpStackCreate::V4(v4) => (Some(v4), None),
                    types::PrivateIpStackCreate::V6(v6) => (None, Some(v6)),
                    types::PrivateIpStackCreate::DualStack { v4, v6 } => (Some(v4), Some(v6)),
                };
                let v4_addr = v4
                    .map(|c| match c.ip {
                        types::Ipv4Assignment::Auto => Ok(None),
                        types::Ipv4Assignment::Explicit(ip) => {
                            super::subnet::VpcSubnet::check_requestable(ip)
                                .map(Some)
                                .map_err(ApiError::invalid_request)
                        }
                    })
                    .transpose()?;
                let v6_addr = v6
                    .map(|c| match c.ip {
                        types::Ipv6Assignment::Auto => Ok(None),
                        types::Ipv6Assignment::Explicit(ip) => check_requestable_v6(ip).map(Some),
                    })
                    .transpose()?;
                Ok(NicPlan {
                    name: n.name.clone(),
                    description: n.description.clone(),
                    v4: v4_addr,
                    v4_transit: v4.map(|c| c.transit_ips.clone()).unwrap_or_default(),
                    v6: v6_addr,
                    v6_transit: v6.map(|c| c.transit_ips.clone()).unwrap_or_default(),
                })
            })
            .collect(),
    }
}

/// Subnet `default`'s IPv6 block as the API shows it (`vpcs.rs` `default_subnet_view`).
const SUBNET_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x1122, 0x3344, 0, 0, 0, 0, 0);

/// nexus's `Ipv6Net::check_requestable_addr` on the /64 (omicron
/// `nexus/db-model/src/ipv6net.rs:88-108`): inside, and not one of the first five.
fn check_requestable_v6(ip: Ipv6Addr) -> Result<Ipv6Addr, ApiError> {
    let off = u128::from(ip).wrapping_sub(u128::from(SUBNET_V6));
    if off >> 64 != 0 {
        return Err(ApiError::invalid_request(format!(
            "{ip} is outside subnet {SUBNET_V6}/64"
        )));
    }
    if off < u128::from(super::subnet::RESERVED_FRONT) {
        return Err(ApiError::invalid_request(format!(
            "The first {} addresses of a subnet are reserved",
            super::subnet::RESERVED_FRONT
        )));
    }
    Ok(ip)
}

/// IPv6 addresses the project's NICs hold.
fn used_ipv6(store: &Store, pid: Uuid) -> BTreeSet<Ipv6Addr> {
    store
        .instances
        .values()
        .filter(|i| i.project_id == pid)
        .flat_map(|i| i.nics.iter().filter_map(|n| n.ipv6))
        .collect()
}

/// The lowest free IPv6 address past the reserved ones (nexus picks one at random from the
/// /64; which one is a guess that does not matter here).
fn next_ipv6(used: &BTreeSet<Ipv6Addr>) -> Ipv6Addr {
    (u128::from(super::subnet::RESERVED_FRONT)..)
        .map(|o| Ipv6Addr::from(u128::from(SUBNET_V6) + o))
        .find(|ip| !used.contains(ip))
        .unwrap_or(SUBNET_V6)
}

pub fn disks(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("instance-disks", cx.query)?;
    let id = select(cx.store, cx.param(0), lp.project.as_deref())?;
    let items = cx
        .store
        .disks
        .values()
        .filter(|d| d.state == DiskState::Attached(id))
        .map(|d| (d.name.to_string(), d.id, d.view()))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

fn query_u64(cx: &Ctx<'_>, key: &str) -> Result<Option<u64>, ApiError> {
    cx.query
        .get(key)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|e| ApiError::bad_query(format!("{key}: {e}")))
        })
        .transpose()
}

pub fn serial_console(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let from_start = query_u64(cx, "from_start")?;
    let most_recent = query_u64(cx, "most_recent")?;
    let max_bytes = query_u64(cx, "max_bytes")?;
    let id = select(cx.store, cx.param(0), cx.project())?;
    let inst = instance(cx.store, &id)?;
    match inst.state {
        RunState::Running | RunState::Rebooting => {}
        RunState::Stopped => {
            return Err(ApiError::invalid_request(
                "instance is stopped and has no active serial console server",
            ));
        }
        other => {
            return Err(ApiError::invalid_request(format!(
                "cannot connect to serial console of instance in state \"{other}\""
            )));
        }
    }
    let offset = match (from_start, most_recent) {
        (Some(s), None) => console::Offset::FromStart(s),
        (None, Some(back)) => console::Offset::MostRecent(back),
        _ => {
            return Err(ApiError::invalid_request(
                "Exactly one of 'from_start' or 'most_recent' must be specified.",
            ));
        }
    };
    // Nexus wraps every propolis error (an expired range included) in a 500.
    let (data, end) = inst.console.read(offset, max_bytes).map_err(|e| {
        tracing::info!(instance = %id, reason = %e, "serial console range expired");
        ApiError::internal()
    })?;
    Reply::json(
        StatusCode::OK,
        &types::InstanceSerialConsoleData {
            data,
            last_byte_offset: end,
        },
    )
}
