//! Floating IP routes (create/list/view/delete/attach/detach), anti-affinity group routes
//! (create/list/view, member list/add) and affinity group routes (create/list/delete; the
//! simulator places no member in one): the placement and addressing side of the API.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use http::StatusCode;
use oxide::types;
use uuid::Uuid;

use super::error::ApiError;
use super::handler::{Ctx, Reply, body_name};
use super::instances::{self, MAX_GROUP_MEMBERS, MAX_GROUPS_PER_INSTANCE};
use super::lifecycle::Event;
use super::names::{self, Ref};
use super::pagination::ListParams;
use super::store::{
    self, AFFINITY_GROUP, ANTI_AFFINITY_GROUP, AffinityGroup, AntiAffinityGroup, FLOATING_IP,
    FloatingIp, Named, RunState, Store, Times,
};

const MAX_EXTERNAL_IPS: usize = 32;

fn select_fip(cx: &Ctx<'_>) -> Result<Uuid, ApiError> {
    store::select(
        cx.store,
        &cx.store.floating_ips,
        FLOATING_IP,
        cx.param(0),
        cx.project(),
    )
}

fn fip_reply(store: &Store, id: Uuid, status: StatusCode) -> Result<Reply, ApiError> {
    let fip = store.floating_ips.get(&id).ok_or_else(ApiError::internal)?;
    Reply::json(status, &fip.view(store.ip_pool_id))
}

pub fn fip_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("floating-ips", cx.query)?;
    let pid = cx.store.project_param(lp.required_project()?)?;
    let pool = cx.store.ip_pool_id;
    let items = cx
        .store
        .floating_ips
        .values()
        .filter(|f| f.project_id == pid)
        .map(|f| (f.name.to_string(), f.id, f.view(pool)))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

pub fn fip_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let project = cx.required_project()?.to_owned();
    let body: types::FloatingIpCreate = cx.create_body()?;
    body_name(&body.name)?;
    let pid = cx.store.project_param(&project)?;
    if store::find_by_name(&cx.store.floating_ips, Some(pid), body.name.as_str()).is_some() {
        return Err(ApiError::already_exists("floating-ip", body.name.as_str()));
    }
    let ip = match &body.address_allocator {
        types::AddressAllocator::Auto { pool_selector } => {
            instances::check_pool(cx.store, pool_selector)?;
            cx.pool.allocate().ok_or_else(|| {
                ApiError::insufficient_capacity("No external IP addresses available")
            })?
        }
        types::AddressAllocator::Explicit { ip } => {
            let v4 = match ip {
                IpAddr::V4(v4) if cx.pool.contains(*v4) => *v4,
                _ => {
                    return Err(ApiError::invalid_request(format!(
                        "IP address {ip} is not in any IP pool linked to this silo"
                    )));
                }
            };
            if Some(v4) == cx.store.snat_ip || !cx.pool.allocate_specific(v4) {
                return Err(ApiError::invalid_request(format!(
                    "Requested external IP address {ip} is not available"
                )));
            }
            v4
        }
    };
    let fip = FloatingIp {
        id: Uuid::new_v4(),
        project_id: pid,
        name: body.name,
        description: body.description,
        ip,
        instance_id: None,
        times: Times::now(),
    };
    let id = fip.id;
    cx.store.floating_ips.insert(id, fip);
    fip_reply(cx.store, id, StatusCode::CREATED)
}

pub fn fip_view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_fip(cx)?;
    fip_reply(cx.store, id, StatusCode::OK)
}

pub fn fip_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_fip(cx)?;
    let fip = cx
        .store
        .floating_ips
        .get(&id)
        .ok_or_else(ApiError::internal)?;
    if fip.instance_id.is_some() {
        return Err(ApiError::invalid_request(
            "Floating IP cannot be deleted while attached to an instance",
        ));
    }
    let ip = fip.ip;
    cx.store.floating_ips.remove(&id);
    cx.pool.release(ip);
    Reply::no_content()
}

/// Whether external IPs of an instance in `state` may change now (nexus's rules: transient
/// states are retryable 503s, creating/failed are refused).
fn check_ip_change_state(state: RunState) -> Result<(), ApiError> {
    match state {
        RunState::Running | RunState::Stopped => Ok(()),
        RunState::Starting | RunState::Stopping | RunState::Rebooting => {
            Err(ApiError::unavailable())
        }
        RunState::Creating | RunState::Failed => Err(ApiError::invalid_request(
            "cannot modify instance IPs, instance is in unhealthy state",
        )),
    }
}

pub fn fip_attach(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let body: types::FloatingIpAttach = cx.body()?;
    let parent = names::body_ref(&body.parent).map_err(ApiError::bad_body)?;
    let types::FloatingIpParentKind::Instance = body.kind;
    let fid = select_fip(cx)?;
    let fip = cx
        .store
        .floating_ips
        .get(&fid)
        .ok_or_else(ApiError::internal)?;
    // An instance named without a project is looked up in the floating IP's project.
    let project_ref = Ref::Id(fip.project_id);
    let project = matches!(parent, Ref::Name(_)).then_some(&project_ref);
    let iid = store::select_ref(
        cx.store,
        &cx.store.instances,
        store::INSTANCE,
        &parent,
        project,
    )?;
    let inst = cx
        .store
        .instances
        .get(&iid)
        .ok_or_else(ApiError::internal)?;
    if inst.project_id != fip.project_id {
        return Err(ApiError::invalid_request(
            "floating IP must be in the same project as the instance",
        ));
    }
    check_ip_change_state(inst.state)?;
    match fip.instance_id {
        Some(current) if current == iid => return fip_reply(cx.store, fid, StatusCode::ACCEPTED),
        Some(_) => {
            return Err(ApiError::invalid_request(
                "floating IP cannot be attached to one instance while still attached to another",
            ));
        }
        None => {}
    }
    let count = inst.ephemeral_ips.len() + cx.store.floating_of(iid).count();
    if count >= MAX_EXTERNAL_IPS {
        return Err(ApiError::invalid_request(format!(
            "an instance may not have more than {MAX_EXTERNAL_IPS} external IP addresses"
        )));
    }
    let fip = cx
        .store
        .floating_ips
        .get_mut(&fid)
        .ok_or_else(ApiError::internal)?;
    fip.instance_id = Some(iid);
    fip.times.modified = chrono::Utc::now();
    let ip: Ipv4Addr = fip.ip;
    cx.fx
        .events
        .push(Event::FloatingIp(IpAddr::V4(ip), Some(iid)));
    fip_reply(cx.store, fid, StatusCode::ACCEPTED)
}

pub fn fip_detach(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let fid = select_fip(cx)?;
    let fip = cx
        .store
        .floating_ips
        .get(&fid)
        .ok_or_else(ApiError::internal)?;
    let Some(iid) = fip.instance_id else {
        return fip_reply(cx.store, fid, StatusCode::ACCEPTED);
    };
    if let Some(inst) = cx.store.instances.get(&iid) {
        check_ip_change_state(inst.state)?;
    }
    let fip = cx
        .store
        .floating_ips
        .get_mut(&fid)
        .ok_or_else(ApiError::internal)?;
    fip.instance_id = None;
    fip.times.modified = chrono::Utc::now();
    let ip = fip.ip;
    cx.fx.events.push(Event::FloatingIp(IpAddr::V4(ip), None));
    fip_reply(cx.store, fid, StatusCode::ACCEPTED)
}

// ---- anti-affinity groups ----------------------------------------------------------------

fn select_group(cx: &Ctx<'_>, project: Option<&str>) -> Result<Uuid, ApiError> {
    store::select(
        cx.store,
        &cx.store.groups,
        ANTI_AFFINITY_GROUP,
        cx.param(0),
        project,
    )
}

/// One page of the project's groups of one kind (`?project=` required).
fn group_page<T: Named, V: serde::Serialize>(
    cx: &Ctx<'_>,
    what: &'static str,
    groups: &BTreeMap<Uuid, T>,
    view: impl Fn(&T) -> V,
) -> Result<Reply, ApiError> {
    let lp = ListParams::parse(what, cx.query)?;
    let pid = cx.store.project_param(lp.required_project()?)?;
    let items = groups
        .iter()
        .filter(|(_, g)| g.project() == Some(pid))
        .map(|(id, g)| (g.name().to_owned(), *id, view(g)))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

/// The project a group is created in (`project`, already required by the caller), once the
/// body's name is valid and free among that project's groups of the kind.
fn new_group_project<T: Named>(
    cx: &Ctx<'_>,
    project: &str,
    groups: &BTreeMap<Uuid, T>,
    kind: &str,
    name: &types::Name,
) -> Result<Uuid, ApiError> {
    body_name(name)?;
    let pid = cx.store.project_param(project)?;
    if store::find_by_name(groups, Some(pid), name.as_str()).is_some() {
        return Err(ApiError::already_exists(kind, name.as_str()));
    }
    Ok(pid)
}

pub fn group_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    group_page(
        cx,
        "anti-affinity-groups",
        &cx.store.groups,
        AntiAffinityGroup::view,
    )
}

pub fn group_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let project = cx.required_project()?.to_owned();
    let body: types::AntiAffinityGroupCreate = cx.create_body()?;
    let pid = new_group_project(
        cx,
        &project,
        &cx.store.groups,
        "anti-affinity-group",
        &body.name,
    )?;
    let group = AntiAffinityGroup {
        id: Uuid::new_v4(),
        project_id: pid,
        name: body.name,
        description: body.description,
        policy: body.policy,
        failure_domain: body.failure_domain,
        members: Vec::new(),
        times: Times::now(),
    };
    let view = group.view();
    cx.store.groups.insert(group.id, group);
    Reply::json(StatusCode::CREATED, &view)
}

pub fn group_view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_group(cx, cx.project())?;
    let view = cx
        .store
        .groups
        .get(&id)
        .map(AntiAffinityGroup::view)
        .ok_or_else(ApiError::internal)?;
    Reply::json(StatusCode::OK, &view)
}

/// DELETE /v1/anti-affinity-groups/{g}: the group goes with its memberships, members or not
/// (omicron `nexus/db-queries/src/db/datastore/affinity.rs` anti_affinity_group_delete
/// deletes the membership rows in the same transaction).
pub fn group_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_group(cx, cx.project())?;
    cx.store.groups.remove(&id);
    Reply::no_content()
}

pub fn group_member_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("anti-affinity-group-members", cx.query)?;
    let gid = select_group(cx, lp.project.as_deref())?;
    let group = cx.store.groups.get(&gid).ok_or_else(ApiError::internal)?;
    let items = group
        .members
        .iter()
        .filter_map(|m| {
            let inst = cx.store.instances.get(m)?;
            Some((inst.name.to_string(), inst.id, cx.store.member_view(*m)?))
        })
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

pub fn group_member_add(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let gid = select_group(cx, cx.project())?;
    // nexus applies the one `project` parameter to both selectors.
    let iid = instances::select(cx.store, cx.param(1), cx.project())?;
    let group = cx.store.groups.get(&gid).ok_or_else(ApiError::internal)?;
    let inst = cx
        .store
        .instances
        .get(&iid)
        .ok_or_else(ApiError::internal)?;
    if inst.state != RunState::Stopped {
        // nexus only adds instances without a VMM; its message names the DB state.
        let db_state = match inst.state {
            RunState::Creating => "creating",
            RunState::Failed => "failed",
            _ => "vmm",
        };
        return Err(ApiError::invalid_request(format!(
            "Instance cannot be added to anti-affinity group in state: {db_state}"
        )));
    }
    if !group.members.contains(&iid) {
        if group.members.len() >= MAX_GROUP_MEMBERS {
            return Err(ApiError::invalid_request(format!(
                "anti-affinity group already has maximum allowed members ({MAX_GROUP_MEMBERS})"
            )));
        }
        let memberships = cx
            .store
            .groups
            .values()
            .filter(|g| g.members.contains(&iid))
            .count();
        if memberships >= MAX_GROUPS_PER_INSTANCE {
            return Err(ApiError::invalid_request(format!(
                "an instance may belong to at most {MAX_GROUPS_PER_INSTANCE} anti-affinity groups"
            )));
        }
        if let Some(g) = cx.store.groups.get_mut(&gid) {
            g.members.push(iid);
        }
    }
    let member = cx.store.member_view(iid).ok_or_else(ApiError::internal)?;
    Reply::json(StatusCode::CREATED, &member)
}

fn select_affinity_group(cx: &Ctx<'_>) -> Result<Uuid, ApiError> {
    store::select(
        cx.store,
        &cx.store.affinity_groups,
        AFFINITY_GROUP,
        cx.param(0),
        cx.project(),
    )
}

/// GET /v1/affinity-groups?project=.
pub fn affinity_group_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    group_page(
        cx,
        "affinity-groups",
        &cx.store.affinity_groups,
        AffinityGroup::view,
    )
}

/// POST /v1/affinity-groups?project=.
pub fn affinity_group_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let project = cx.required_project()?.to_owned();
    let body: types::AffinityGroupCreate = cx.create_body()?;
    let pid = new_group_project(
        cx,
        &project,
        &cx.store.affinity_groups,
        "affinity-group",
        &body.name,
    )?;
    let group = AffinityGroup {
        id: Uuid::new_v4(),
        project_id: pid,
        name: body.name,
        description: body.description,
        policy: body.policy,
        failure_domain: body.failure_domain,
        times: Times::now(),
    };
    let view = group.view();
    cx.store.affinity_groups.insert(group.id, group);
    Reply::json(StatusCode::CREATED, &view)
}

/// DELETE /v1/affinity-groups/{affinity_group}?project=.
pub fn affinity_group_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_affinity_group(cx)?;
    cx.store.affinity_groups.remove(&id);
    Reply::no_content()
}
