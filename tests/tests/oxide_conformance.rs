//! Conformance of the simulated Oxide API with the official OpenAPI document.
//!
//! Every route in `oxide::ROUTES` must exist in the document with the same operation id,
//! success status and request-body presence; a scenario then drives every route with bodies
//! built from the SDK's types and checks request bodies, query/path parameters and response
//! bodies (successes and errors) against the document's schemas.
//!
//! The document comes from `OXIDE_OPENAPI_DOC`. Unset: the tests pass after saying they were
//! skipped. Set but unreadable: they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod oxide_common;

use std::collections::BTreeSet;
use std::path::Path;

use bytes::Bytes;
use http::{Method, Request};
use oxide::types;
use oxide_common::{Api, TOKEN};
use oxide_sim::oxide::schema_check::OpenApiDoc;
use oxide_sim::oxide::{NEXUS_METHODS, QueryShape, ROUTES};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

fn load_doc() -> Option<OpenApiDoc> {
    let Some(path) = std::env::var_os("OXIDE_OPENAPI_DOC") else {
        println!("skipped: set OXIDE_OPENAPI_DOC=/path/to/oxide-nexus-openapi-*.json to run");
        return None;
    };
    match OpenApiDoc::from_path(Path::new(&path)) {
        Ok(doc) => Some(doc),
        Err(e) => panic!("OXIDE_OPENAPI_DOC is set but the document is unusable: {e}"),
    }
}

fn name(s: &str) -> types::Name {
    types::Name::try_from(s).unwrap()
}

#[test]
fn every_served_route_exists_in_the_document_with_its_status() {
    let Some(doc) = load_doc() else { return };
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for r in ROUTES {
        assert!(
            seen.insert((r.method, r.template)),
            "duplicate route {}",
            r.key()
        );
        let Some(op) = doc.operation(r.method, r.template) else {
            problems.push(format!("{}: not in the document", r.key()));
            continue;
        };
        let op_id = op.get("operationId").and_then(Value::as_str);
        if op_id != Some(r.operation_id) {
            problems.push(format!(
                "{}: operationId {op_id:?} != {}",
                r.key(),
                r.operation_id
            ));
        }
        let status = doc.success_status(r.method, r.template);
        if status != Some(r.status) {
            problems.push(format!(
                "{}: document says {status:?}, sim says {}",
                r.key(),
                r.status
            ));
        }
        let doc_body = doc.request_schema(r.method, r.template).is_some();
        if doc_body != r.has_body {
            problems.push(format!(
                "{}: request body {doc_body} in the document",
                r.key()
            ));
        }
        let doc_path_params: BTreeSet<String> = doc
            .parameters(r.method, r.template)
            .into_iter()
            .filter(|p| p.location == "path")
            .map(|p| p.name)
            .collect();
        let tpl_params: BTreeSet<String> = r
            .template
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(str::to_owned)
            .collect();
        if doc_path_params != tpl_params {
            problems.push(format!("{}: path params {doc_path_params:?}", r.key()));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The methods behind a 405's `Allow` headers are the document's, path by path.
#[test]
fn the_allow_table_lists_every_method_the_document_has_for_a_served_path() {
    let Some(doc) = load_doc() else { return };
    let served: BTreeSet<&str> = ROUTES.iter().map(|r| r.template).collect();
    let table: BTreeSet<&str> = NEXUS_METHODS.iter().map(|(path, _)| *path).collect();
    assert_eq!(table, served, "one entry per served path");
    for (path, methods) in NEXUS_METHODS {
        assert_eq!(doc.methods(path), *methods, "{path}");
    }
}

/// How a route takes repeated query parameters follows from the document: paginated
/// operations (`x-dropshot-pagination`) or the struct's fields, the query parameters.
#[test]
fn every_route_takes_the_query_parameters_the_document_lists() {
    let Some(doc) = load_doc() else { return };
    for r in ROUTES {
        let paginated = doc
            .operation(r.method, r.template)
            .is_some_and(|op| op.get("x-dropshot-pagination").is_some());
        let mut params: Vec<String> = doc
            .parameters(r.method, r.template)
            .into_iter()
            .filter(|p| p.location == "query")
            .map(|p| p.name)
            .collect();
        params.sort();
        match r.query {
            QueryShape::Paginated => assert!(paginated, "{} is not paginated", r.key()),
            QueryShape::Fields(fields) => {
                assert!(!paginated, "{} is paginated", r.key());
                assert_eq!(params, fields, "{}", r.key());
            }
        }
    }
}

/// Sends requests, checking each against the document.
struct Checker<'a> {
    doc: &'a OpenApiDoc,
    api: Api,
    covered: BTreeSet<String>,
    problems: Vec<String>,
}

impl Checker<'_> {
    /// Calls `method template` with `args` substituted; `ok` says whether success is expected.
    async fn call(
        &mut self,
        method: &str,
        template: &str,
        args: &[&str],
        query: &[(&str, &str)],
        body: Option<Value>,
        ok: bool,
    ) -> Value {
        let key = format!("{method} {template}");
        let params = self.doc.parameters(method, template);
        let mut args_iter = args.iter();
        let mut path = String::new();
        for seg in template.split('/').skip(1) {
            path.push('/');
            match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(pname) => {
                    let arg = args_iter.next().expect("enough path args");
                    path.push_str(arg);
                    // Error cases may send deliberately invalid parameters.
                    if let Some(p) = params
                        .iter()
                        .find(|p| ok && p.location == "path" && p.name == pname)
                    {
                        for e in self.doc.validate_param(&p.schema, arg) {
                            self.problems
                                .push(format!("{key}: path {pname}={arg}: {e}"));
                        }
                    }
                }
                None => path.push_str(seg),
            }
        }
        let mut uri = path;
        for (i, (k, v)) in query.iter().enumerate() {
            uri.push(if i == 0 { '?' } else { '&' });
            uri.push_str(&format!("{k}={v}"));
            match params
                .iter()
                .find(|p| p.location == "query" && p.name == *k)
            {
                Some(_) if !ok => {}
                Some(p) => {
                    for e in self.doc.validate_param(&p.schema, v) {
                        self.problems.push(format!("{key}: query {k}={v}: {e}"));
                    }
                }
                None => self
                    .problems
                    .push(format!("{key}: query parameter {k} not in document")),
            }
        }
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(&uri)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("api-version", "2026073100.0.0");
        let bytes = match &body {
            Some(b) => {
                match self.doc.request_schema(method, template) {
                    Some(schema) => {
                        for e in self.doc.validate(schema, b) {
                            self.problems.push(format!("{key}: request body: {e}"));
                        }
                    }
                    None => self
                        .problems
                        .push(format!("{key}: document has no request body")),
                }
                req = req.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(b).unwrap())
            }
            None => Bytes::new(),
        };
        let resp = self.api.raw(req.body(bytes).unwrap()).await;
        let status = resp.status.as_u16();
        if ok {
            let want = self.doc.success_status(method, template);
            if want != Some(status) {
                self.problems.push(format!(
                    "{key} ({uri}): status {status}, document says {want:?}: {}",
                    resp.body
                ));
                return resp.body;
            }
            self.covered.insert(key.clone());
        } else if !(400..600).contains(&status) {
            self.problems
                .push(format!("{key} ({uri}): expected an error, got {status}"));
            return resp.body;
        }
        match self.doc.response_schema(method, template, status) {
            Some(schema) => {
                for e in self.doc.validate(schema, &resp.body) {
                    self.problems.push(format!("{key}: response {status}: {e}"));
                }
            }
            None if resp.body.is_null() => {}
            None => self.problems.push(format!(
                "{key}: response {status} has a body the document lacks"
            )),
        }
        if resp.headers.get("x-request-id").is_none() {
            self.problems.push(format!("{key}: no x-request-id header"));
        }
        resp.body
    }

    async fn ok(
        &mut self,
        method: &str,
        template: &str,
        args: &[&str],
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Value {
        self.call(method, template, args, query, body, true).await
    }

    async fn err(
        &mut self,
        method: &str,
        template: &str,
        args: &[&str],
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Value {
        self.call(method, template, args, query, body, false).await
    }

    async fn wait_state(&self, instance: &str, state: &str) {
        self.api.wait_state("conf", instance, state).await;
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Option<Value> {
    Some(serde_json::to_value(v).unwrap())
}

fn s(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn every_route_answers_with_document_shaped_bodies() {
    let Some(doc) = load_doc() else { return };
    let mut c = Checker {
        doc: &doc,
        api: Api::new(),
        covered: BTreeSet::new(),
        problems: Vec::new(),
    };
    let p: &[(&str, &str)] = &[("project", "conf")];

    // Projects.
    let project = types::ProjectCreate {
        description: "conformance".into(),
        name: name("conf"),
    };
    c.ok("POST", "/v1/projects", &[], &[], to_json(&project))
        .await;
    c.ok(
        "POST",
        "/v1/projects",
        &[],
        &[],
        Some(json!({"name": "conf-2", "description": ""})),
    )
    .await;
    let page = c
        .ok("GET", "/v1/projects", &[], &[("limit", "1")], None)
        .await;
    let token = s(&page, "next_page");
    c.ok(
        "GET",
        "/v1/projects",
        &[],
        &[("limit", "1"), ("page_token", &token)],
        None,
    )
    .await;
    c.ok(
        "GET",
        "/v1/projects",
        &[],
        &[("sort_by", "id_ascending")],
        None,
    )
    .await;
    c.ok("GET", "/v1/projects/{project}", &["conf"], &[], None)
        .await;

    // Disk import → snapshot → image.
    let import = types::DiskCreate {
        description: "upload".into(),
        disk_backend: types::DiskBackend::Distributed(types::DiskSource::ImportingBlocks {
            block_size: types::BlockSize::try_from(512i64).unwrap(),
        }),
        name: name("upload"),
        size: types::ByteCount(GIB),
    };
    c.ok("POST", "/v1/disks", &[], p, to_json(&import)).await;
    c.ok(
        "POST",
        "/v1/disks/{disk}/bulk-write-start",
        &["upload"],
        p,
        None,
    )
    .await;
    let write = types::ImportBlocksBulkWrite {
        base64_encoded_data: base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            [7u8; 4096],
        ),
        offset: 0,
    };
    c.ok(
        "POST",
        "/v1/disks/{disk}/bulk-write",
        &["upload"],
        p,
        to_json(&write),
    )
    .await;
    c.ok(
        "POST",
        "/v1/disks/{disk}/bulk-write-stop",
        &["upload"],
        p,
        None,
    )
    .await;
    let finalize = types::FinalizeDisk {
        snapshot_name: Some(name("upload-snap")),
    };
    c.ok(
        "POST",
        "/v1/disks/{disk}/finalize",
        &["upload"],
        p,
        to_json(&finalize),
    )
    .await;
    let snapshot = types::SnapshotCreate {
        description: "of the upload".into(),
        disk: types::NameOrId::Name(name("upload")),
        name: name("upload-snap-2"),
    };
    c.ok("POST", "/v1/snapshots", &[], p, to_json(&snapshot))
        .await;
    c.err("POST", "/v1/snapshots", &[], p, to_json(&snapshot))
        .await;
    c.ok("GET", "/v1/snapshots", &[], p, None).await;
    let snap = c
        .ok("GET", "/v1/snapshots/{snapshot}", &["upload-snap"], p, None)
        .await;
    let snap_id: uuid::Uuid = s(&snap, "id").parse().unwrap();
    let image = types::ImageCreate {
        description: "from upload".into(),
        name: name("node-image"),
        os: "ubuntu".into(),
        source: types::ImageSource::Snapshot(snap_id),
        version: "24.04".into(),
    };
    let image = c.ok("POST", "/v1/images", &[], p, to_json(&image)).await;
    let image_id: uuid::Uuid = s(&image, "id").parse().unwrap();
    c.api.sim.seed_silo_image("silo-image", "debian", "12", GIB);
    c.ok("GET", "/v1/images", &[], p, None).await;
    c.ok("GET", "/v1/images", &[], &[], None).await;
    c.ok("GET", "/v1/images/{image}", &["node-image"], p, None)
        .await;
    c.ok("GET", "/v1/images/{image}", &["silo-image"], &[], None)
        .await;

    // A blank disk to attach, a floating IP, an anti-affinity group.
    let blank = types::DiskCreate {
        description: "data".into(),
        disk_backend: types::DiskBackend::Distributed(types::DiskSource::Blank {
            block_size: types::BlockSize::try_from(4096i64).unwrap(),
        }),
        name: name("data"),
        size: types::ByteCount(2 * GIB),
    };
    c.ok("POST", "/v1/disks", &[], p, to_json(&blank)).await;
    c.ok("GET", "/v1/disks", &[], p, None).await;
    c.ok("GET", "/v1/disks/{disk}", &["data"], p, None).await;
    let fip = types::FloatingIpCreate {
        address_allocator: types::AddressAllocator::Auto {
            pool_selector: types::PoolSelector::Auto { ip_version: None },
        },
        description: "ingress".into(),
        name: name("ingress"),
    };
    c.ok("POST", "/v1/floating-ips", &[], p, to_json(&fip))
        .await;
    c.ok("GET", "/v1/floating-ips", &[], p, None).await;
    let fip_view = c
        .ok(
            "GET",
            "/v1/floating-ips/{floating_ip}",
            &["ingress"],
            p,
            None,
        )
        .await;
    let group = types::AntiAffinityGroupCreate {
        description: "spread".into(),
        failure_domain: types::FailureDomain::Sled,
        name: name("spread"),
        policy: types::AffinityPolicy::Allow,
    };
    let group = c
        .ok("POST", "/v1/anti-affinity-groups", &[], p, to_json(&group))
        .await;
    c.ok("GET", "/v1/anti-affinity-groups", &[], p, None).await;
    c.ok(
        "GET",
        "/v1/anti-affinity-groups/{anti_affinity_group}",
        &["spread"],
        p,
        None,
    )
    .await;

    // An instance using all of it.
    let create = types::InstanceCreate {
        anti_affinity_groups: vec![types::NameOrId::Name(name("spread"))],
        auto_restart_policy: Some(types::InstanceAutoRestartPolicy::BestEffort),
        boot_disk: Some(types::InstanceDiskAttachment::Create {
            description: "boot".into(),
            disk_backend: types::DiskBackend::Distributed(types::DiskSource::Image {
                image_id,
                read_only: false,
            }),
            name: name("cp-0-boot"),
            size: types::ByteCount(20 * GIB),
        }),
        cpu_platform: None,
        description: "control plane".into(),
        disks: vec![types::InstanceDiskAttachment::Attach { name: name("data") }],
        enable_jumbo_frames: false,
        external_ips: vec![types::ExternalIpCreate::Ephemeral {
            pool_selector: types::PoolSelector::Auto { ip_version: None },
        }],
        hostname: types::Hostname::try_from("cp-0").unwrap(),
        memory: types::ByteCount(8 * GIB),
        multicast_groups: vec![],
        name: name("cp-0"),
        ncpus: types::InstanceCpuCount(4),
        network_interfaces: types::InstanceNetworkInterfaceAttachment::DefaultIpv4,
        ssh_public_keys: Some(vec![]),
        start: true,
        user_data: base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            b"#cloud-config\n",
        ),
    };
    let inst = c
        .ok("POST", "/v1/instances", &[], p, to_json(&create))
        .await;
    let inst_id = s(&inst, "id");
    // The checker can fail: a view missing a required field is reported.
    let mut broken = inst.clone();
    broken.as_object_mut().unwrap().remove("run_state");
    let schema = doc.response_schema("POST", "/v1/instances", 201).unwrap();
    assert!(!doc.validate(schema, &broken).is_empty());
    c.ok("GET", "/v1/instances", &[], p, None).await;
    c.ok("GET", "/v1/instances/{instance}", &[&inst_id], &[], None)
        .await;
    // Attaching during `starting` is a retryable 503 with an error body.
    c.err(
        "POST",
        "/v1/floating-ips/{floating_ip}/attach",
        &["ingress"],
        p,
        to_json(&types::FloatingIpAttach {
            kind: types::FloatingIpParentKind::Instance,
            parent: types::NameOrId::Name(name("cp-0")),
        }),
    )
    .await;
    c.wait_state("cp-0", "running").await;
    c.ok(
        "POST",
        "/v1/floating-ips/{floating_ip}/attach",
        &["ingress"],
        p,
        to_json(&types::FloatingIpAttach {
            kind: types::FloatingIpParentKind::Instance,
            parent: types::NameOrId::Id(inst_id.parse().unwrap()),
        }),
    )
    .await;
    c.ok(
        "GET",
        "/v1/instances/{instance}/external-ips",
        &["cp-0"],
        p,
        None,
    )
    .await;
    let nics = c
        .ok(
            "GET",
            "/v1/network-interfaces",
            &[],
            &[("project", "conf"), ("instance", "cp-0")],
            None,
        )
        .await;
    assert_eq!(nics["items"][0]["name"], "net0", "{nics}");
    assert_eq!(nics["items"][0]["primary"], true, "{nics}");
    c.err(
        "GET",
        "/v1/network-interfaces",
        &[],
        &[("project", "conf"), ("instance", "nope")],
        None,
    )
    .await;
    c.ok("GET", "/v1/instances/{instance}/disks", &["cp-0"], p, None)
        .await;
    c.api.sim.append_console(
        inst_id.parse().unwrap(),
        b"-----BEGIN SSH HOST KEY FINGERPRINTS-----\n",
    );
    c.ok(
        "GET",
        "/v1/instances/{instance}/serial-console",
        &["cp-0"],
        &[
            ("project", "conf"),
            ("most_recent", "65536"),
            ("max_bytes", "1024"),
        ],
        None,
    )
    .await;
    c.ok(
        "GET",
        "/v1/instances/{instance}/serial-console",
        &[&inst_id],
        &[("from_start", "0")],
        None,
    )
    .await;
    c.ok(
        "POST",
        "/v1/instances/{instance}/reboot",
        &["cp-0"],
        p,
        None,
    )
    .await;
    c.wait_state("cp-0", "running").await;
    c.ok("POST", "/v1/instances/{instance}/start", &["cp-0"], p, None)
        .await;
    c.ok(
        "POST",
        "/v1/floating-ips/{floating_ip}/detach",
        &[&s(&fip_view, "id")],
        &[],
        None,
    )
    .await;
    c.ok("POST", "/v1/instances/{instance}/stop", &["cp-0"], p, None)
        .await;
    c.wait_state("cp-0", "stopped").await;
    c.ok(
        "POST",
        "/v1/anti-affinity-groups/{anti_affinity_group}/members/instance/{instance}",
        &[&s(&group, "id"), &inst_id],
        &[],
        None,
    )
    .await;
    c.ok(
        "GET",
        "/v1/anti-affinity-groups/{anti_affinity_group}/members",
        &["spread"],
        &[("project", "conf"), ("sort_by", "name_descending")],
        None,
    )
    .await;

    // Errors are document-shaped too.
    c.err("GET", "/v1/instances/{instance}", &["nope"], p, None)
        .await;
    c.err("GET", "/v1/instances/{instance}", &[&inst_id], p, None)
        .await;
    c.err("DELETE", "/v1/disks/{disk}", &["data"], p, None)
        .await;
    c.err(
        "POST",
        "/v1/projects",
        &[],
        &[],
        Some(json!({"name": "conf", "description": ""})),
    )
    .await;
    c.err(
        "GET",
        "/v1/instances",
        &[],
        &[("project", "conf"), ("limit", "0")],
        None,
    )
    .await;
    let unauth = c
        .api
        .raw(
            Request::builder()
                .uri("/v1/projects")
                .body(Bytes::new())
                .unwrap(),
        )
        .await;
    let error_schema = doc.response_schema("GET", "/v1/projects", 401).unwrap();
    assert!(
        doc.validate(error_schema, &unauth.body).is_empty(),
        "{}",
        unauth.body
    );

    // VPC firewall: a new project's three default rules, a read-modify-write that keeps them,
    // and nexus's refusals.
    let fw: &[(&str, &str)] = &[("project", "conf"), ("vpc", "default")];
    let rules = c.ok("GET", "/v1/vpc-firewall-rules", &[], fw, None).await;
    let names: Vec<String> = rules["rules"]
        .as_array()
        .map(|r| r.iter().map(|r| s(r, "name")).collect())
        .unwrap_or_default();
    assert_eq!(names, ["allow-internal-inbound", "allow-ssh", "allow-icmp"]);
    let mut update: Vec<Value> = rules["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut r| {
            if let Some(o) = r.as_object_mut() {
                for k in ["id", "time_created", "time_modified", "vpc_id"] {
                    o.remove(k);
                }
            }
            r
        })
        .collect();
    let api = json!({
        "name": "conf-k8s-api", "description": "Kubernetes API",
        "action": "allow", "direction": "inbound", "status": "enabled", "priority": 65534,
        "targets": [{"type": "vpc", "value": "default"}],
        "filters": {"hosts": [{"type": "ip_net", "value": "0.0.0.0/0"}],
                    "protocols": [{"type": "tcp"}], "ports": ["6443"]}
    });
    update.push(api.clone());
    let replaced = c
        .ok(
            "PUT",
            "/v1/vpc-firewall-rules",
            &[],
            fw,
            Some(json!({ "rules": update })),
        )
        .await;
    assert_eq!(replaced["rules"].as_array().map(Vec::len), Some(4));
    c.err(
        "PUT",
        "/v1/vpc-firewall-rules",
        &[],
        fw,
        Some(json!({ "rules": [api.clone(), api] })),
    )
    .await;
    c.err(
        "GET",
        "/v1/vpc-firewall-rules",
        &[],
        &[("project", "conf"), ("vpc", "other")],
        None,
    )
    .await;

    // Teardown through the delete routes.
    c.ok("DELETE", "/v1/instances/{instance}", &["cp-0"], p, None)
        .await;
    c.ok("DELETE", "/v1/disks/{disk}", &["data"], p, None).await;
    c.ok(
        "DELETE",
        "/v1/floating-ips/{floating_ip}",
        &["ingress"],
        p,
        None,
    )
    .await;
    c.ok(
        "DELETE",
        "/v1/snapshots/{snapshot}",
        &["upload-snap"],
        p,
        None,
    )
    .await;
    c.ok("GET", "/v1/vpcs", &[], p, None).await;
    let subnet = c
        .ok("GET", "/v1/vpc-subnets/{subnet}", &["default"], fw, None)
        .await;
    assert_eq!(s(&subnet, "ipv4_block"), "172.30.0.0/22");
    c.err("GET", "/v1/vpc-subnets/{subnet}", &["other"], fw, None)
        .await;
    let pair = json!({"name": "pair", "description": "", "policy": "allow",
        "failure_domain": "sled"});
    c.ok("POST", "/v1/affinity-groups", &[], p, Some(pair.clone()))
        .await;
    c.err("POST", "/v1/affinity-groups", &[], p, Some(pair))
        .await;
    c.ok("GET", "/v1/affinity-groups", &[], p, None).await;
    c.err("DELETE", "/v1/projects/{project}", &["conf"], &[], None)
        .await;
    c.ok(
        "DELETE",
        "/v1/affinity-groups/{affinity_group}",
        &["pair"],
        p,
        None,
    )
    .await;
    let lab = json!({"name": "lab", "description": "", "ipv4_block": "10.1.0.0/24"});
    c.ok("POST", "/v1/vpc-subnets", &[], fw, Some(lab.clone()))
        .await;
    c.err("POST", "/v1/vpc-subnets", &[], fw, Some(lab)).await;
    c.ok("GET", "/v1/vpc-subnets", &[], fw, None).await;
    c.ok("GET", "/v1/me/access-tokens", &[], &[], None).await;
    c.err("DELETE", "/v1/vpcs/{vpc}", &["default"], p, None)
        .await;
    c.ok("DELETE", "/v1/vpc-subnets/{subnet}", &["lab"], fw, None)
        .await;
    // A second, empty project goes bottom up: subnet, VPC, project.
    let gone = types::ProjectCreate {
        name: name("gone"),
        description: String::new(),
    };
    c.ok("POST", "/v1/projects", &[], &[], to_json(&gone)).await;
    let g: &[(&str, &str)] = &[("project", "gone")];
    let gfw: &[(&str, &str)] = &[("project", "gone"), ("vpc", "default")];
    c.ok(
        "DELETE",
        "/v1/vpc-subnets/{subnet}",
        &["default"],
        gfw,
        None,
    )
    .await;
    c.ok("DELETE", "/v1/vpcs/{vpc}", &["default"], g, None)
        .await;
    c.ok("DELETE", "/v1/projects/{project}", &["gone"], &[], None)
        .await;
    c.err("DELETE", "/v1/projects/{project}", &["gone"], &[], None)
        .await;
    c.ok(
        "DELETE",
        "/v1/anti-affinity-groups/{anti_affinity_group}",
        &["spread"],
        p,
        None,
    )
    .await;
    c.ok("DELETE", "/v1/images/{image}", &["node-image"], p, None)
        .await;
    c.err("DELETE", "/v1/images/{image}", &["node-image"], p, None)
        .await;

    let all: BTreeSet<String> = ROUTES.iter().map(|r| r.key()).collect();
    let missing: Vec<&String> = all.difference(&c.covered).collect();
    assert!(missing.is_empty(), "routes not exercised: {missing:#?}");
    assert!(c.problems.is_empty(), "{:#?}", c.problems);
}

#[test]
fn a_set_but_missing_document_fails() {
    // Exercise the loader's failure path without touching the process environment.
    let err = OpenApiDoc::from_path(Path::new("/nonexistent/oxide-openapi.json")).unwrap_err();
    assert!(err.contains("/nonexistent/oxide-openapi.json"));
}
