//! The table of served routes, request plumbing (matching, query strings, auth, API version,
//! content type, body parsing) and the dispatch from a route to its handler. Project
//! handlers live here too, being three lines each.
//!
//! [`ROUTES`] is the single list of what the simulator serves; the conformance test walks it
//! against the official OpenAPI document.

use http::{HeaderMap, Method, StatusCode};
use oxide::types;

use super::error::ApiError;
use super::handler::{Ctx, Reply, body_name};
use super::pagination::{ListParams, Query};
use super::store::Project;
use super::{SERVER_API_VERSION, firewall, instances, network, storage, vpcs};

/// Operation behind a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    AccessTokenList,
    ProjectList,
    ProjectCreate,
    ProjectView,
    ImageList,
    ImageCreate,
    ImageView,
    ImageDelete,
    DiskList,
    DiskCreate,
    DiskView,
    DiskDelete,
    DiskBulkWrite,
    DiskBulkWriteStart,
    DiskBulkWriteStop,
    DiskFinalize,
    SnapshotList,
    SnapshotCreate,
    SnapshotView,
    SnapshotDelete,
    FloatingIpList,
    FloatingIpCreate,
    FloatingIpView,
    FloatingIpDelete,
    FloatingIpAttach,
    FloatingIpDetach,
    InstanceList,
    InstanceCreate,
    InstanceView,
    InstanceDelete,
    InstanceStart,
    InstanceStop,
    InstanceReboot,
    InstanceExternalIps,
    InstanceDisks,
    InstanceSerialConsole,
    GroupList,
    GroupCreate,
    GroupView,
    GroupDelete,
    GroupMemberList,
    GroupMemberAdd,
    ProjectDelete,
    VpcList,
    VpcDelete,
    VpcSubnetList,
    VpcSubnetCreate,
    VpcSubnetView,
    VpcSubnetDelete,
    AffinityGroupList,
    AffinityGroupCreate,
    AffinityGroupDelete,
    FirewallRulesView,
    NetworkInterfaceList,
    FirewallRulesUpdate,
}

/// One served route.
#[derive(Clone, Copy, Debug)]
pub struct RouteSpec {
    /// HTTP method.
    pub method: &'static str,
    /// Path template as in the OpenAPI document.
    pub template: &'static str,
    /// Success status.
    pub status: u16,
    /// `operationId` in the OpenAPI document.
    pub operation_id: &'static str,
    /// Whether the route takes a JSON request body.
    pub has_body: bool,
    op: Op,
    /// How nexus's query type takes the query string.
    pub query: QueryShape,
}

/// How nexus's query type for a route takes a query string (dropshot's `Query` extractor
/// deserialises serde_urlencoded's pairs into it): a plain struct refuses a repeated field it
/// has ("duplicate field `project`") and ignores any other key, repeated or not; dropshot's
/// `PaginationParams` has only `limit` as a field and reads every other key into a map, where
/// the last value wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryShape {
    /// A plain struct with these fields (the API document's query parameters).
    Fields(&'static [&'static str]),
    /// `PaginationParams` (the document's `x-dropshot-pagination`).
    Paginated,
}

const NO_QUERY: QueryShape = QueryShape::Fields(&[]);
const PROJECT: QueryShape = QueryShape::Fields(&["project"]);
const PAGINATED: QueryShape = QueryShape::Paginated;

impl RouteSpec {
    /// Counter / fault key: `"METHOD /v1/template"`.
    pub fn key(&self) -> String {
        format!("{} {}", self.method, self.template)
    }
}

const fn r(
    method: &'static str,
    template: &'static str,
    status: u16,
    operation_id: &'static str,
    has_body: bool,
    op: Op,
    query: QueryShape,
) -> RouteSpec {
    RouteSpec {
        method,
        template,
        status,
        operation_id,
        has_body,
        op,
        query,
    }
}

/// Every route the simulator serves.
pub const ROUTES: &[RouteSpec] = &[
    r(
        "GET",
        "/v1/network-interfaces",
        200,
        "instance_network_interface_list",
        false,
        Op::NetworkInterfaceList,
        PAGINATED,
    ),
    r(
        "GET",
        "/v1/vpcs",
        200,
        "vpc_list",
        false,
        Op::VpcList,
        PAGINATED,
    ),
    r(
        "DELETE",
        "/v1/vpcs/{vpc}",
        204,
        "vpc_delete",
        false,
        Op::VpcDelete,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/vpc-subnets",
        200,
        "vpc_subnet_list",
        false,
        Op::VpcSubnetList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/vpc-subnets",
        201,
        "vpc_subnet_create",
        true,
        Op::VpcSubnetCreate,
        QueryShape::Fields(&["project", "vpc"]),
    ),
    r(
        "DELETE",
        "/v1/vpc-subnets/{subnet}",
        204,
        "vpc_subnet_delete",
        false,
        Op::VpcSubnetDelete,
        QueryShape::Fields(&["project", "vpc"]),
    ),
    r(
        "DELETE",
        "/v1/projects/{project}",
        204,
        "project_delete",
        false,
        Op::ProjectDelete,
        NO_QUERY,
    ),
    r(
        "GET",
        "/v1/affinity-groups",
        200,
        "affinity_group_list",
        false,
        Op::AffinityGroupList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/affinity-groups",
        201,
        "affinity_group_create",
        true,
        Op::AffinityGroupCreate,
        PROJECT,
    ),
    r(
        "DELETE",
        "/v1/affinity-groups/{affinity_group}",
        204,
        "affinity_group_delete",
        false,
        Op::AffinityGroupDelete,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/vpc-subnets/{subnet}",
        200,
        "vpc_subnet_view",
        false,
        Op::VpcSubnetView,
        QueryShape::Fields(&["project", "vpc"]),
    ),
    r(
        "GET",
        "/v1/vpc-firewall-rules",
        200,
        "vpc_firewall_rules_view",
        false,
        Op::FirewallRulesView,
        QueryShape::Fields(&["project", "vpc"]),
    ),
    r(
        "PUT",
        "/v1/vpc-firewall-rules",
        200,
        "vpc_firewall_rules_update",
        true,
        Op::FirewallRulesUpdate,
        QueryShape::Fields(&["project", "vpc"]),
    ),
    r(
        "GET",
        "/v1/me/access-tokens",
        200,
        "current_user_access_token_list",
        false,
        Op::AccessTokenList,
        PAGINATED,
    ),
    r(
        "GET",
        "/v1/projects",
        200,
        "project_list",
        false,
        Op::ProjectList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/projects",
        201,
        "project_create",
        true,
        Op::ProjectCreate,
        NO_QUERY,
    ),
    r(
        "GET",
        "/v1/projects/{project}",
        200,
        "project_view",
        false,
        Op::ProjectView,
        NO_QUERY,
    ),
    r(
        "GET",
        "/v1/images",
        200,
        "image_list",
        false,
        Op::ImageList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/images",
        201,
        "image_create",
        true,
        Op::ImageCreate,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/images/{image}",
        200,
        "image_view",
        false,
        Op::ImageView,
        PROJECT,
    ),
    r(
        "DELETE",
        "/v1/images/{image}",
        204,
        "image_delete",
        false,
        Op::ImageDelete,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/disks",
        200,
        "disk_list",
        false,
        Op::DiskList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/disks",
        201,
        "disk_create",
        true,
        Op::DiskCreate,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/disks/{disk}",
        200,
        "disk_view",
        false,
        Op::DiskView,
        PROJECT,
    ),
    r(
        "DELETE",
        "/v1/disks/{disk}",
        204,
        "disk_delete",
        false,
        Op::DiskDelete,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/disks/{disk}/bulk-write",
        204,
        "disk_bulk_write_import",
        true,
        Op::DiskBulkWrite,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/disks/{disk}/bulk-write-start",
        204,
        "disk_bulk_write_import_start",
        false,
        Op::DiskBulkWriteStart,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/disks/{disk}/bulk-write-stop",
        204,
        "disk_bulk_write_import_stop",
        false,
        Op::DiskBulkWriteStop,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/disks/{disk}/finalize",
        204,
        "disk_finalize_import",
        true,
        Op::DiskFinalize,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/snapshots",
        200,
        "snapshot_list",
        false,
        Op::SnapshotList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/snapshots",
        201,
        "snapshot_create",
        true,
        Op::SnapshotCreate,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/snapshots/{snapshot}",
        200,
        "snapshot_view",
        false,
        Op::SnapshotView,
        PROJECT,
    ),
    r(
        "DELETE",
        "/v1/snapshots/{snapshot}",
        204,
        "snapshot_delete",
        false,
        Op::SnapshotDelete,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/floating-ips",
        200,
        "floating_ip_list",
        false,
        Op::FloatingIpList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/floating-ips",
        201,
        "floating_ip_create",
        true,
        Op::FloatingIpCreate,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/floating-ips/{floating_ip}",
        200,
        "floating_ip_view",
        false,
        Op::FloatingIpView,
        PROJECT,
    ),
    r(
        "DELETE",
        "/v1/floating-ips/{floating_ip}",
        204,
        "floating_ip_delete",
        false,
        Op::FloatingIpDelete,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/floating-ips/{floating_ip}/attach",
        202,
        "floating_ip_attach",
        true,
        Op::FloatingIpAttach,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/floating-ips/{floating_ip}/detach",
        202,
        "floating_ip_detach",
        false,
        Op::FloatingIpDetach,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/instances",
        200,
        "instance_list",
        false,
        Op::InstanceList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/instances",
        201,
        "instance_create",
        true,
        Op::InstanceCreate,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/instances/{instance}",
        200,
        "instance_view",
        false,
        Op::InstanceView,
        PROJECT,
    ),
    r(
        "DELETE",
        "/v1/instances/{instance}",
        204,
        "instance_delete",
        false,
        Op::InstanceDelete,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/instances/{instance}/start",
        202,
        "instance_start",
        false,
        Op::InstanceStart,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/instances/{instance}/stop",
        202,
        "instance_stop",
        false,
        Op::InstanceStop,
        PROJECT,
    ),
    r(
        "POST",
        "/v1/instances/{instance}/reboot",
        202,
        "instance_reboot",
        false,
        Op::InstanceReboot,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/instances/{instance}/external-ips",
        200,
        "instance_external_ip_list",
        false,
        Op::InstanceExternalIps,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/instances/{instance}/disks",
        200,
        "instance_disk_list",
        false,
        Op::InstanceDisks,
        PAGINATED,
    ),
    r(
        "GET",
        "/v1/instances/{instance}/serial-console",
        200,
        "instance_serial_console",
        false,
        Op::InstanceSerialConsole,
        QueryShape::Fields(&["from_start", "max_bytes", "most_recent", "project"]),
    ),
    r(
        "GET",
        "/v1/anti-affinity-groups",
        200,
        "anti_affinity_group_list",
        false,
        Op::GroupList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/anti-affinity-groups",
        201,
        "anti_affinity_group_create",
        true,
        Op::GroupCreate,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/anti-affinity-groups/{anti_affinity_group}",
        200,
        "anti_affinity_group_view",
        false,
        Op::GroupView,
        PROJECT,
    ),
    r(
        "DELETE",
        "/v1/anti-affinity-groups/{anti_affinity_group}",
        204,
        "anti_affinity_group_delete",
        false,
        Op::GroupDelete,
        PROJECT,
    ),
    r(
        "GET",
        "/v1/anti-affinity-groups/{anti_affinity_group}/members",
        200,
        "anti_affinity_group_member_list",
        false,
        Op::GroupMemberList,
        PAGINATED,
    ),
    r(
        "POST",
        "/v1/anti-affinity-groups/{anti_affinity_group}/members/instance/{instance}",
        201,
        "anti_affinity_group_member_instance_add",
        false,
        Op::GroupMemberAdd,
        PROJECT,
    ),
];

/// Every method nexus registers for each path the simulator serves, as the API document lists
/// them (`oxide_conformance` checks the table against the document). A 405 names these in its
/// `Allow` headers, not only the methods served here: dropshot lists every method of the
/// path's router node.
pub const NEXUS_METHODS: &[(&str, &[&str])] = &[
    ("/v1/affinity-groups", &["GET", "POST"]),
    (
        "/v1/affinity-groups/{affinity_group}",
        &["DELETE", "GET", "PUT"],
    ),
    ("/v1/anti-affinity-groups", &["GET", "POST"]),
    (
        "/v1/anti-affinity-groups/{anti_affinity_group}",
        &["DELETE", "GET", "PUT"],
    ),
    (
        "/v1/anti-affinity-groups/{anti_affinity_group}/members",
        &["GET"],
    ),
    (
        "/v1/anti-affinity-groups/{anti_affinity_group}/members/instance/{instance}",
        &["DELETE", "GET", "POST"],
    ),
    ("/v1/disks", &["GET", "POST"]),
    ("/v1/disks/{disk}", &["DELETE", "GET"]),
    ("/v1/disks/{disk}/bulk-write", &["POST"]),
    ("/v1/disks/{disk}/bulk-write-start", &["POST"]),
    ("/v1/disks/{disk}/bulk-write-stop", &["POST"]),
    ("/v1/disks/{disk}/finalize", &["POST"]),
    ("/v1/floating-ips", &["GET", "POST"]),
    ("/v1/floating-ips/{floating_ip}", &["DELETE", "GET", "PUT"]),
    ("/v1/floating-ips/{floating_ip}/attach", &["POST"]),
    ("/v1/floating-ips/{floating_ip}/detach", &["POST"]),
    ("/v1/images", &["GET", "POST"]),
    ("/v1/images/{image}", &["DELETE", "GET"]),
    ("/v1/instances", &["GET", "POST"]),
    ("/v1/instances/{instance}", &["DELETE", "GET", "PUT"]),
    ("/v1/instances/{instance}/disks", &["GET"]),
    ("/v1/instances/{instance}/external-ips", &["GET"]),
    ("/v1/instances/{instance}/reboot", &["POST"]),
    ("/v1/instances/{instance}/serial-console", &["GET"]),
    ("/v1/instances/{instance}/start", &["POST"]),
    ("/v1/instances/{instance}/stop", &["POST"]),
    ("/v1/network-interfaces", &["GET", "POST"]),
    ("/v1/me/access-tokens", &["GET"]),
    ("/v1/projects", &["GET", "POST"]),
    ("/v1/projects/{project}", &["DELETE", "GET", "PUT"]),
    ("/v1/snapshots", &["GET", "POST"]),
    ("/v1/snapshots/{snapshot}", &["DELETE", "GET"]),
    ("/v1/vpc-firewall-rules", &["GET", "PUT"]),
    ("/v1/vpc-subnets", &["GET", "POST"]),
    ("/v1/vpc-subnets/{subnet}", &["DELETE", "GET", "PUT"]),
    ("/v1/vpcs", &["GET", "POST"]),
    ("/v1/vpcs/{vpc}", &["DELETE", "GET", "PUT"]),
];

/// Finds the route for `method` + `path`; returns it with the decoded path parameters.
pub fn match_route(
    method: &Method,
    path: &str,
) -> Result<(&'static RouteSpec, Vec<String>), ApiError> {
    let segments: Vec<&str> = path.split('/').collect();
    let mut served = Vec::new();
    let mut template = None;
    for spec in ROUTES {
        let Some(params) = match_template(spec.template, &segments) else {
            continue;
        };
        if spec.method == method.as_str() {
            return Ok((spec, params?));
        }
        served.push(spec.method);
        template = Some(spec.template);
    }
    let Some(template) = template else {
        return Err(ApiError::route_not_found());
    };
    let allow = NEXUS_METHODS
        .iter()
        .find(|(path, _)| *path == template)
        .map_or(served, |(_, methods)| methods.to_vec());
    Err(ApiError::method_not_allowed(allow))
}

/// `Some(Ok(params))` when `segments` fit `template`; `Some(Err)` when they fit but a
/// parameter does not decode.
fn match_template(template: &str, segments: &[&str]) -> Option<Result<Vec<String>, ApiError>> {
    let tpl: Vec<&str> = template.split('/').collect();
    if tpl.len() != segments.len() {
        return None;
    }
    let mut params = Vec::new();
    for (t, s) in tpl.iter().zip(segments) {
        if t.starts_with('{') {
            if s.is_empty() {
                return None;
            }
            params.push(s);
        } else if t != s {
            return None;
        }
    }
    Some(
        params
            .into_iter()
            .map(|p| {
                percent_decode(p, false)
                    .ok_or_else(|| ApiError::bad_path(format!("invalid percent-encoding in '{p}'")))
            })
            .collect(),
    )
}

/// Decodes `%XX` escapes (and `+` as space in query strings); `None` for malformed escapes
/// or invalid UTF-8.
fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Parses the query string as nexus's query type of `shape` takes it: a repeated field of a
/// plain struct, or a repeated `limit`, is refused; another repeated key of a paginated route
/// keeps its last value; a key the struct does not have is ignored (the simulator keeps its
/// first value, which no handler reads).
pub fn parse_query(raw: Option<&str>, shape: QueryShape) -> Result<Query, ApiError> {
    let mut q = Query::new();
    let Some(raw) = raw else {
        return Ok(q);
    };
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k, true)
            .ok_or_else(|| ApiError::bad_query("invalid percent-encoding"))?;
        let v = percent_decode(v, true)
            .ok_or_else(|| ApiError::bad_query("invalid percent-encoding"))?;
        let field = match shape {
            QueryShape::Fields(fields) => fields.contains(&k.as_str()),
            QueryShape::Paginated => k == "limit",
        };
        if field {
            if q.contains_key(&k) {
                return Err(ApiError::bad_query(format!("duplicate field `{k}`")));
            }
            q.insert(k, v);
        } else if shape == QueryShape::Paginated {
            q.insert(k, v);
        } else {
            q.entry(k).or_insert(v);
        }
    }
    Ok(q)
}

/// Checks `Authorization: Bearer <token>`.
pub fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, given)) = value.split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && given.trim() == token
}

/// Checks the `api-version` header like nexus: absent means "latest"; newer than `server`
/// (the rack's newest version) is refused with dropshot's 400.
pub fn check_api_version(headers: &HeaderMap, server: &str) -> Result<(), ApiError> {
    let Some(value) = headers.get("api-version") else {
        return Ok(());
    };
    let bad = || {
        ApiError::bad_header(format!(
            "bad value for header \"api-version\": expected a semantic version like {SERVER_API_VERSION}"
        ))
    };
    let requested = value.to_str().ok().and_then(parse_semver).ok_or_else(bad)?;
    let server = parse_semver(server).ok_or_else(bad)?;
    if requested > server {
        return Err(ApiError::bad_header(format!(
            "server does not support this API version: {}",
            value.to_str().unwrap_or_default()
        )));
    }
    Ok(())
}

fn parse_semver(s: &str) -> Option<(u64, u64, u64)> {
    let mut it = s.trim().split('.');
    let v = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    it.next().is_none().then_some(v)
}

/// Bodies must be JSON (a missing content type is taken as JSON, like dropshot).
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(http::header::CONTENT_TYPE) {
        None => Ok(()),
        Some(v) => {
            let ct = v.to_str().unwrap_or_default();
            let mime = ct.split(';').next().unwrap_or_default().trim();
            if mime.eq_ignore_ascii_case("application/json") {
                Ok(())
            } else {
                Err(ApiError::bad_header(format!(
                    "expected content type \"application/json\", got \"{ct}\""
                )))
            }
        }
    }
}

/// Runs the handler of `spec`.
pub fn dispatch(spec: &RouteSpec, cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    match spec.op {
        Op::AccessTokenList => access_token_list(cx),
        Op::ProjectList => project_list(cx),
        Op::ProjectCreate => project_create(cx),
        Op::ProjectView => project_view(cx),
        Op::ImageList => storage::image_list(cx),
        Op::ImageCreate => storage::image_create(cx),
        Op::ImageView => storage::image_view(cx),
        Op::ImageDelete => storage::image_delete(cx),
        Op::DiskList => storage::disk_list(cx),
        Op::DiskCreate => storage::disk_create(cx),
        Op::DiskView => storage::disk_view(cx),
        Op::DiskDelete => storage::disk_delete(cx),
        Op::DiskBulkWrite => storage::bulk_write(cx),
        Op::DiskBulkWriteStart => storage::bulk_write_start(cx),
        Op::DiskBulkWriteStop => storage::bulk_write_stop(cx),
        Op::DiskFinalize => storage::finalize(cx),
        Op::SnapshotList => storage::snapshot_list(cx),
        Op::SnapshotCreate => storage::snapshot_create(cx),
        Op::SnapshotView => storage::snapshot_view(cx),
        Op::SnapshotDelete => storage::snapshot_delete(cx),
        Op::FloatingIpList => network::fip_list(cx),
        Op::FloatingIpCreate => network::fip_create(cx),
        Op::FloatingIpView => network::fip_view(cx),
        Op::FloatingIpDelete => network::fip_delete(cx),
        Op::FloatingIpAttach => network::fip_attach(cx),
        Op::FloatingIpDetach => network::fip_detach(cx),
        Op::InstanceList => instances::list(cx),
        Op::InstanceCreate => instances::create(cx),
        Op::InstanceView => instances::view(cx),
        Op::InstanceDelete => instances::delete(cx),
        Op::InstanceStart => instances::start(cx),
        Op::InstanceStop => instances::stop(cx),
        Op::InstanceReboot => instances::reboot(cx),
        Op::InstanceExternalIps => instances::external_ips(cx),
        Op::InstanceDisks => instances::disks(cx),
        Op::InstanceSerialConsole => instances::serial_console(cx),
        Op::GroupList => network::group_list(cx),
        Op::GroupCreate => network::group_create(cx),
        Op::GroupView => network::group_view(cx),
        Op::GroupDelete => network::group_delete(cx),
        Op::GroupMemberList => network::group_member_list(cx),
        Op::GroupMemberAdd => network::group_member_add(cx),
        Op::FirewallRulesView => firewall::view(cx),
        Op::ProjectDelete => vpcs::project_delete(cx),
        Op::VpcList => vpcs::vpc_list(cx),
        Op::VpcDelete => vpcs::vpc_delete(cx),
        Op::VpcSubnetList => vpcs::subnet_list(cx),
        Op::VpcSubnetCreate => vpcs::subnet_create(cx),
        Op::VpcSubnetView => vpcs::subnet_view(cx),
        Op::VpcSubnetDelete => vpcs::subnet_delete(cx),
        Op::AffinityGroupList => network::affinity_group_list(cx),
        Op::AffinityGroupCreate => network::affinity_group_create(cx),
        Op::AffinityGroupDelete => network::affinity_group_delete(cx),
        Op::NetworkInterfaceList => instances::network_interfaces(cx),
        Op::FirewallRulesUpdate => firewall::update(cx),
    }
}

/// The caller's unexpired device tokens (the simulator has one user with one token).
fn access_token_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("access-tokens", cx.query)?;
    let t = &cx.store.device_token;
    let items = if t.expired(chrono::Utc::now()) {
        Vec::new()
    } else {
        let view = serde_json::json!({
            "id": t.id,
            "time_created": t.time_created,
            "time_expires": t.time_expires,
        });
        vec![(t.id.to_string(), t.id, view)]
    };
    Reply::json(StatusCode::OK, &lp.page(items))
}

fn project_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("projects", cx.query)?;
    let items = cx
        .store
        .projects
        .values()
        .map(|p| (p.name.to_string(), p.id, p.view()))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

fn project_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let body: types::ProjectCreate = cx.create_body()?;
    body_name(&body.name)?;
    if cx.store.projects.values().any(|p| p.name == body.name) {
        return Err(ApiError::already_exists("project", body.name.as_str()));
    }
    let project = cx.store.new_project(body.name, body.description);
    let id = project.id;
    let view = project.view();
    cx.store.projects.insert(id, project);
    Reply::json(StatusCode::CREATED, &view)
}

fn project_view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let r = super::store::path_ref(cx.param(0))?;
    let id = cx.store.project_id(&r)?;
    let view = cx
        .store
        .projects
        .get(&id)
        .map(Project::view)
        .ok_or_else(ApiError::internal)?;
    Reply::json(StatusCode::OK, &view)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn every_route_matches_itself_and_only_itself() {
        for spec in ROUTES {
            let path = spec
                .template
                .split('/')
                .map(|s| if s.starts_with('{') { "x1" } else { s })
                .collect::<Vec<_>>()
                .join("/");
            let method = Method::from_bytes(spec.method.as_bytes()).unwrap();
            let (found, params) = match_route(&method, &path).unwrap();
            assert_eq!(found.template, spec.template);
            assert_eq!(params.len(), spec.template.matches('{').count());
        }
        assert_eq!(
            match_route(&Method::PATCH, "/v1/projects")
                .unwrap_err()
                .status,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            match_route(&Method::GET, "/v1/nope").unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            match_route(&Method::GET, "/v1/projects/")
                .unwrap_err()
                .status,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn every_served_route_has_its_nexus_methods() {
        for spec in ROUTES {
            let methods = NEXUS_METHODS
                .iter()
                .find(|(path, _)| *path == spec.template)
                .map(|(_, m)| *m)
                .unwrap_or_else(|| panic!("{} has no NEXUS_METHODS entry", spec.template));
            assert!(methods.contains(&spec.method), "{}", spec.key());
            assert!(
                methods.is_sorted(),
                "{}: in method-name order",
                spec.template
            );
        }
    }

    #[test]
    fn query_strings_decode_and_take_repeats_as_nexus_takes_them() {
        let q = parse_query(Some("project=my%2Dproj&limit=5&x"), PAGINATED).unwrap();
        assert_eq!(q["project"], "my-proj");
        assert_eq!(q["x"], "");
        assert!(parse_query(Some("project=a&project=b"), PROJECT).is_err());
        assert!(parse_query(Some("limit=1&limit=2"), PAGINATED).is_err());
        let q = parse_query(Some("project=a&x=1&project=b&x=2"), PAGINATED).unwrap();
        assert_eq!((q["project"].as_str(), q["x"].as_str()), ("b", "2"));
        let q = parse_query(Some("project=a&x=1&x=2"), PROJECT).unwrap();
        assert_eq!(q["project"], "a");
        for bad in ["a=%zz", "a=%ff", "a=%"] {
            assert!(parse_query(Some(bad), NO_QUERY).is_err(), "{bad}");
        }
    }

    #[test]
    fn api_version_newer_than_the_server_is_refused() {
        let mut h = HeaderMap::new();
        assert!(check_api_version(&h, SERVER_API_VERSION).is_ok());
        h.insert("api-version", SERVER_API_VERSION.parse().unwrap());
        assert!(check_api_version(&h, SERVER_API_VERSION).is_ok());
        h.insert("api-version", "2026081901.0.0".parse().unwrap());
        assert!(check_api_version(&h, SERVER_API_VERSION).is_ok());
        h.insert("api-version", "2099010100.0.0".parse().unwrap());
        let e = check_api_version(&h, SERVER_API_VERSION).unwrap_err();
        assert!(
            e.message
                .contains("server does not support this API version")
        );
        // Acting as rack release 21: release 22's version is too new.
        h.insert("api-version", "2026073100.0.0".parse().unwrap());
        assert!(check_api_version(&h, "2026061000.0.0").is_err());
        h.insert("api-version", "2026061000.0.0".parse().unwrap());
        assert!(check_api_version(&h, "2026061000.0.0").is_ok());
        h.insert("api-version", "latest".parse().unwrap());
        assert!(check_api_version(&h, SERVER_API_VERSION).is_err());
    }
}
