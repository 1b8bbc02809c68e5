//! A project's `default` VPC and its subnets, and the deletions that end a project: subnet,
//! then VPC, then the project, each with nexus's refusals.
//!
//! Sources (tests/FIDELITY.md, "Projects, VPCs and subnets"), omicron rel/v22:
//! - project delete refuses while the project holds an instance, disk, floating IP, project
//!   image, snapshot, VPC, affinity group or anti-affinity group, checked in that order:
//!   400 "project to be deleted contains a/an <kind>: <name>"
//!   (`nexus/db-queries/src/db/datastore/project.rs:55-86,221-249`);
//! - VPC delete refuses while any subnet exists: 400 "VPC cannot be deleted while VPC Subnets
//!   exist" (`…/datastore/vpc.rs:552-586`); once the VPC is gone its system router and every
//!   firewall rule go too (`nexus/src/app/vpc.rs:129-165`);
//! - subnet delete refuses while a NIC is in it: 400 "VPC Subnet cannot be deleted while
//!   network interfaces in the subnet exist" (`…/datastore/vpc.rs:1015-1031`);
//! - subnet create: the IPv4 block must be private and /8 to /26, and overlap no other subnet
//!   of the VPC (`nexus/src/app/vpc_subnet.rs:87-127`, `common/src/address.rs:286,297`,
//!   `nexus/db-queries/src/db/queries/vpc_subnet.rs:240-252`).
//!
//! Not here: VPC create (a project has only the `default` VPC its creation made), custom
//! routers, and NICs in an added subnet (instances are placed in `default` only).

use std::net::{Ipv4Addr, Ipv6Addr};

use http::StatusCode;
use oxide::types;
use uuid::Uuid;

use super::error::ApiError;
use super::firewall;
use super::firewall_rules::DEFAULT_VPC;
use super::handler::{Ctx, Reply, body_name};
use super::names::{self, Ref};
use super::pagination::ListParams;
use super::store::{self, ExtraSubnet, Project, Times};

/// The VPC prefix every simulated project's `default` VPC shows.
const VPC_IPV6_PREFIX: &str = "fd00:1122:3344::/48";
/// nexus's bounds on a subnet's IPv4 prefix length (`MIN_VPC_IPV4_SUBNET_PREFIX_LENGTH`,
/// `MAX_VPC_IPV4_SUBNET_PREFIX_LENGTH`).
const MIN_V4_PREFIX: u8 = 8;
const MAX_V4_PREFIX: u8 = 26;

fn project_mut<'s>(cx: &'s mut Ctx<'_>, pid: &Uuid) -> Result<&'s mut Project, ApiError> {
    cx.store
        .projects
        .get_mut(pid)
        .ok_or_else(ApiError::internal)
}

/// GET /v1/vpcs?project=: the project's VPCs: its `default`, created with it (omicron
/// `nexus/src/app/sagas/project_create.rs:136-143`), until someone deletes it.
pub fn vpc_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("vpcs", cx.query)?;
    let pid = cx.store.project_param(lp.required_project()?)?;
    let p = cx.store.projects.get(&pid).ok_or_else(ApiError::internal)?;
    let mut items = Vec::new();
    if !p.vpc_deleted {
        let name = types::Name::try_from(DEFAULT_VPC).map_err(|_| ApiError::internal())?;
        let vpc = types::Vpc {
            description: "Default VPC".to_owned(),
            dns_name: name.clone(),
            id: p.vpc_id,
            ipv6_prefix: VPC_IPV6_PREFIX.parse().map_err(|_| ApiError::internal())?,
            name,
            project_id: pid,
            system_router_id: p.vpc_id,
            time_created: p.times.created,
            time_modified: p.times.modified,
        };
        items.push((DEFAULT_VPC.to_owned(), p.vpc_id, vpc));
    }
    Reply::json(StatusCode::OK, &lp.page(items))
}

/// DELETE /v1/vpcs/{vpc}?project=: refused while the VPC holds a subnet; then the VPC, its
/// router and all its firewall rules go.
pub fn vpc_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let vpc = store::path_ref(cx.param(0))?;
    let pid = firewall::select_vpc_ref(cx.store, vpc, cx.project())?;
    let p = project_mut(cx, &pid)?;
    if !p.subnet_deleted || !p.extra_subnets.is_empty() {
        return Err(ApiError::invalid_request(
            "VPC cannot be deleted while VPC Subnets exist",
        ));
    }
    p.vpc_deleted = true;
    p.firewall_rules.clear();
    Reply::no_content()
}

/// Which subnet a selector names: `None` for `default`, else the index of an added one.
fn select_subnet(cx: &Ctx<'_>) -> Result<(Uuid, Option<usize>), ApiError> {
    match store::path_ref(cx.param(0))? {
        Ref::Id(id) => {
            if cx.query.contains_key("vpc") || cx.project().is_some() {
                return Err(ApiError::invalid_request(
                    "when providing subnet as an ID, vpc and project should not be specified",
                ));
            }
            cx.store
                .projects
                .values()
                .filter(|p| !p.vpc_deleted)
                .find_map(|p| {
                    if p.subnet_id == id && !p.subnet_deleted {
                        return Some((p.id, None));
                    }
                    let i = p.extra_subnets.iter().position(|s| s.id == id)?;
                    Some((p.id, Some(i)))
                })
                .ok_or_else(|| ApiError::not_found_by_id("vpc-subnet", &id))
        }
        Ref::Name(n) => {
            if !cx.query.contains_key("vpc") {
                return Err(ApiError::invalid_request(
                    "subnet should either be an ID or vpc should be specified",
                ));
            }
            let pid = firewall::select_vpc(cx.store, cx)?;
            let p = cx.store.projects.get(&pid).ok_or_else(ApiError::internal)?;
            if n == DEFAULT_VPC && !p.subnet_deleted {
                return Ok((pid, None));
            }
            p.extra_subnets
                .iter()
                .position(|s| s.name.as_str() == n)
                .map(|i| (pid, Some(i)))
                .ok_or_else(|| ApiError::not_found_by_name("vpc-subnet", &n))
        }
    }
}

/// Subnet `default` as the VPC create saga makes it (omicron
/// `nexus/src/app/sagas/vpc_create.rs`: `DEFAULT_VPC_SUBNET_IPV4_BLOCK`, the /22, and the VPC
/// prefix's first /64).
fn default_subnet_view(p: &Project) -> Result<types::VpcSubnet, ApiError> {
    Ok(types::VpcSubnet {
        custom_router_id: None,
        description: "The default subnet for default".to_owned(),
        id: p.subnet_id,
        ipv4_block: format!(
            "{}/{}",
            super::subnet::RACK_BLOCK,
            super::subnet::PREFIX_LEN
        )
        .parse()
        .map_err(|_| ApiError::internal())?,
        ipv6_block: "fd00:1122:3344::/64"
            .parse()
            .map_err(|_| ApiError::internal())?,
        name: types::Name::try_from(DEFAULT_VPC).map_err(|_| ApiError::internal())?,
        time_created: p.times.created,
        time_modified: p.times.modified,
        vpc_id: p.vpc_id,
    })
}

fn extra_subnet_view(p: &Project, s: &ExtraSubnet) -> types::VpcSubnet {
    types::VpcSubnet {
        custom_router_id: None,
        description: s.description.clone(),
        id: s.id,
        ipv4_block: s.ipv4_block.clone(),
        ipv6_block: s.ipv6_block.clone(),
        name: s.name.clone(),
        time_created: s.times.created,
        time_modified: s.times.modified,
        vpc_id: p.vpc_id,
    }
}

/// GET /v1/vpc-subnets/{subnet}?project=&vpc= (by id, no project or VPC may be given).
pub fn subnet_view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let (pid, which) = select_subnet(cx)?;
    let p = cx.store.projects.get(&pid).ok_or_else(ApiError::internal)?;
    let view = match which {
        None => default_subnet_view(p)?,
        Some(i) => extra_subnet_view(p, &p.extra_subnets[i]),
    };
    Reply::json(StatusCode::OK, &view)
}

/// GET /v1/vpc-subnets?project=&vpc=: the VPC's subnets.
pub fn subnet_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("vpc-subnets", cx.query)?;
    let pid = firewall::select_vpc(cx.store, cx)?;
    let p = cx.store.projects.get(&pid).ok_or_else(ApiError::internal)?;
    let mut items = Vec::new();
    if !p.subnet_deleted {
        items.push((DEFAULT_VPC.to_owned(), p.subnet_id, default_subnet_view(p)?));
    }
    for s in &p.extra_subnets {
        items.push((s.name.to_string(), s.id, extra_subnet_view(p, s)));
    }
    Reply::json(StatusCode::OK, &lp.page(items))
}

fn v4(net: &str) -> Result<(Ipv4Addr, u8), ApiError> {
    let (a, l) = net.split_once('/').ok_or_else(ApiError::internal)?;
    Ok((
        a.parse().map_err(|_| ApiError::internal())?,
        l.parse().map_err(|_| ApiError::internal())?,
    ))
}

fn v6(net: &str) -> Result<(Ipv6Addr, u8), ApiError> {
    let (a, l) = net.split_once('/').ok_or_else(ApiError::internal)?;
    Ok((
        a.parse().map_err(|_| ApiError::internal())?,
        l.parse().map_err(|_| ApiError::internal())?,
    ))
}

/// Whether two networks (address bits as u128, prefix lengths) share an address.
fn overlap(a: u128, al: u8, b: u128, bl: u8, width: u8) -> bool {
    let l = al.min(bl);
    let shift = u32::from(width - l);
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

/// POST /v1/vpc-subnets?project=&vpc=.
pub fn subnet_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let pid = firewall::select_vpc(cx.store, cx)?;
    let body: types::VpcSubnetCreate = cx.create_body()?;
    body_name(&body.name)?;
    if let Some(router) = &body.custom_router {
        custom_router(cx.store, pid, router)?;
    }
    let (addr, len) = v4(&body.ipv4_block)?;
    if !addr.is_private() {
        return Err(ApiError::invalid_request(
            "VPC Subnet IPv4 address ranges must be from a private range",
        ));
    }
    if !(MIN_V4_PREFIX..=MAX_V4_PREFIX).contains(&len) {
        return Err(ApiError::invalid_request(format!(
            "VPC Subnet IPv4 address ranges must have prefix length between {MIN_V4_PREFIX} and {MAX_V4_PREFIX}, inclusive"
        )));
    }
    let p = cx.store.projects.get(&pid).ok_or_else(ApiError::internal)?;
    let (prefix, _) = v6(VPC_IPV6_PREFIX)?;
    let ipv6_block: types::Ipv6Net = match &body.ipv6_block {
        Some(b) => {
            let (a, l) = v6(b)?;
            if l != 64 || !overlap(u128::from(a), l, u128::from(prefix), 48, 128) {
                return Err(ApiError::invalid_request(format!(
                    "VPC Subnet IPv6 address range '{}' is not valid for VPC with IPv6 prefix '{VPC_IPV6_PREFIX}'",
                    b.as_str()
                )));
            }
            b.clone()
        }
        // nexus picks a random free /64 of the VPC's prefix; the next one does here.
        None => {
            let n = u128::try_from(p.extra_subnets.len() + 1).map_err(|_| ApiError::internal())?;
            let a = Ipv6Addr::from(u128::from(prefix) | (n << 64));
            format!("{a}/64")
                .parse()
                .map_err(|_| ApiError::internal())?
        }
    };
    let mut taken = Vec::new();
    if !p.subnet_deleted {
        taken.push((
            default_subnet_view(p)?.ipv4_block,
            "fd00:1122:3344::/64".to_owned(),
        ));
    }
    for s in &p.extra_subnets {
        if s.name == body.name {
            return Err(ApiError::already_exists("vpc-subnet", body.name.as_str()));
        }
        taken.push((s.ipv4_block.clone(), s.ipv6_block.to_string()));
    }
    if !p.subnet_deleted && body.name.as_str() == DEFAULT_VPC {
        return Err(ApiError::already_exists("vpc-subnet", DEFAULT_VPC));
    }
    let (a6, _) = v6(&ipv6_block)?;
    for (t4, t6) in &taken {
        let (b, bl) = v4(t4)?;
        if overlap(
            u128::from(u32::from(addr)),
            len,
            u128::from(u32::from(b)),
            bl,
            32,
        ) {
            return Err(ApiError::invalid_request(format!(
                "IP address range '{}' conflicts with an existing subnet",
                body.ipv4_block.as_str()
            )));
        }
        let (b6, l6) = v6(t6)?;
        if overlap(u128::from(a6), 64, u128::from(b6), l6, 128) {
            return Err(ApiError::invalid_request(format!(
                "IP address range '{}' conflicts with an existing subnet",
                ipv6_block.as_str()
            )));
        }
    }
    let subnet = ExtraSubnet {
        id: Uuid::new_v4(),
        name: body.name,
        description: body.description,
        ipv4_block: body.ipv4_block,
        ipv6_block,
        times: Times::now(),
    };
    let p = project_mut(cx, &pid)?;
    let view = extra_subnet_view(p, &subnet);
    p.extra_subnets.push(subnet);
    Reply::json(StatusCode::CREATED, &view)
}

/// DELETE /v1/vpc-subnets/{subnet}?project=&vpc=: refused while a NIC is in it (every
/// instance of the project has its NIC in `default`).
pub fn subnet_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let (pid, which) = select_subnet(cx)?;
    if which.is_none() && cx.store.instances.values().any(|i| i.project_id == pid) {
        return Err(ApiError::invalid_request(
            "VPC Subnet cannot be deleted while network interfaces in the subnet exist",
        ));
    }
    let p = project_mut(cx, &pid)?;
    match which {
        None => p.subnet_deleted = true,
        Some(i) => {
            p.extra_subnets.remove(i);
        }
    }
    Reply::no_content()
}

/// DELETE /v1/projects/{project}: refused with the first kind of child found, in nexus's
/// order; nexus takes any one row of that kind (`LIMIT 1`), the simulator the first by name.
pub fn project_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let r = store::path_ref(cx.param(0))?;
    let pid = cx.store.project_id(&r)?;
    let s = &*cx.store;
    let first = |names: Vec<String>| names.into_iter().min();
    let vpc = s
        .projects
        .get(&pid)
        .filter(|p| !p.vpc_deleted)
        .map(|_| DEFAULT_VPC.to_owned());
    let children: [(&str, Option<String>); 8] = [
        (
            "instance",
            first(
                s.instances
                    .values()
                    .filter(|i| i.project_id == pid)
                    .map(|i| i.name.to_string())
                    .collect(),
            ),
        ),
        (
            "disk",
            first(
                s.disks
                    .values()
                    .filter(|d| d.project_id == pid)
                    .map(|d| d.name.to_string())
                    .collect(),
            ),
        ),
        (
            "floating ip",
            first(
                s.floating_ips
                    .values()
                    .filter(|f| f.project_id == pid)
                    .map(|f| f.name.to_string())
                    .collect(),
            ),
        ),
        (
            "project image",
            first(
                s.images
                    .values()
                    .filter(|i| i.project_id == Some(pid))
                    .map(|i| i.name.to_string())
                    .collect(),
            ),
        ),
        (
            "snapshot",
            first(
                s.snapshots
                    .values()
                    .filter(|x| x.project_id == pid)
                    .map(|x| x.name.to_string())
                    .collect(),
            ),
        ),
        ("vpc", vpc),
        (
            "affinity group",
            first(
                s.affinity_groups
                    .values()
                    .filter(|g| g.project_id == pid)
                    .map(|g| g.name.to_string())
                    .collect(),
            ),
        ),
        (
            "anti affinity group",
            first(
                s.groups
                    .values()
                    .filter(|g| g.project_id == pid)
                    .map(|g| g.name.to_string())
                    .collect(),
            ),
        ),
    ];
    for (object, label) in children {
        if let Some(label) = label {
            let article = if object.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            };
            return Err(ApiError::invalid_request(format!(
                "project to be deleted contains {article} {object}: {label}"
            )));
        }
    }
    cx.store.projects.remove(&pid);
    Reply::no_content()
}

/// A subnet's `custom_router`, looked up in the subnet's VPC (omicron
/// `nexus/src/app/vpc_router.rs` `vpc_router_lookup_for_attach`). This rack has no custom
/// routers: the VPC's system router (named `system`; the simulator gives it the VPC's id) is
/// refused as the datastore refuses it, anything else is not found.
fn custom_router(
    store: &store::Store,
    pid: Uuid,
    router: &types::NameOrId,
) -> Result<(), ApiError> {
    let p = store.projects.get(&pid).ok_or_else(ApiError::internal)?;
    match names::body_ref(router).map_err(ApiError::bad_body)? {
        Ref::Name(n) if n == "system" => Err(system_router_refused()),
        Ref::Id(id) if id == p.vpc_id => Err(system_router_refused()),
        Ref::Name(n) => Err(ApiError::not_found_by_name("vpc-router", &n)),
        Ref::Id(id) => Err(ApiError::not_found_by_id("vpc-router", &id)),
    }
}

/// omicron `nexus/db-queries/src/db/datastore/vpc.rs` `SubnetAttachRouterIsSystem`.
fn system_router_refused() -> ApiError {
    ApiError::invalid_request("cannot attach a system router to a VPC subnet")
}
