//! Behaviour of the simulated Oxide API, driven through `OxideSim::handle`: auth, error
//! bodies, name rules, selectors, pagination, instance lifecycle, floating IPs, disk import,
//! serial console, limits and fault injection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod oxide_common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use oxide_common::{Api, Seen, TOKEN};
use oxide_sim::oxide::{FaultSpec, RouteFault, Timings};
use serde_json::{Value, json};
use uuid::Uuid;

const GIB: u64 = 1 << 30;

fn assert_error(r: &oxide_common::Resp, status: StatusCode, code: Option<&str>) {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.code(), code, "{}", r.body);
    let rid = r.str("request_id");
    assert!(Uuid::parse_str(rid).is_ok(), "request_id {rid:?}");
    assert_eq!(
        r.headers.get("x-request-id").and_then(|v| v.to_str().ok()),
        Some(rid),
        "x-request-id header matches the body"
    );
}

#[tokio::test]
async fn requests_without_the_right_bearer_token_get_401() {
    let api = Api::new();
    let bare = Request::builder()
        .uri("/v1/projects")
        .body(Bytes::new())
        .unwrap();
    let r = api.raw(bare).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, Some("Unauthorized"));
    let wrong = Request::builder()
        .uri("/v1/projects")
        .header("authorization", "Bearer nope")
        .body(Bytes::new())
        .unwrap();
    assert_error(
        &api.raw(wrong).await,
        StatusCode::UNAUTHORIZED,
        Some("Unauthorized"),
    );
    let basic = Request::builder()
        .uri("/v1/projects")
        .header("authorization", format!("Basic {TOKEN}"))
        .body(Bytes::new())
        .unwrap();
    assert_eq!(api.raw(basic).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(api.get("/v1/projects").await.status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_paths_404_and_wrong_methods_405() {
    let api = Api::new();
    assert_error(&api.get("/v1/nothing").await, StatusCode::NOT_FOUND, None);
    let r = api.call(Method::PATCH, "/v1/instances", None).await;
    assert_error(&r, StatusCode::METHOD_NOT_ALLOWED, None);
    // dropshot appends one `Allow` header per method of the path, in method-name order.
    let allow: Vec<&str> = r
        .headers
        .get_all(http::header::ALLOW)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(allow, ["GET", "POST"]);
}

/// dropshot's `Allow` headers name every method of the path's router node: the methods nexus
/// registers for the path (the API document's), also those the simulator does not serve.
#[tokio::test]
async fn a_405_allows_every_method_nexus_registers_for_the_path() {
    let api = Api::new();
    api.project("p").await;
    for (method, uri, nexus) in [
        (
            Method::PATCH,
            "/v1/vpcs/default?project=p",
            &["DELETE", "GET", "PUT"][..],
        ),
        (Method::POST, "/v1/projects/p", &["DELETE", "GET", "PUT"]),
        (Method::DELETE, "/v1/network-interfaces", &["GET", "POST"]),
        (Method::POST, "/v1/vpc-firewall-rules", &["GET", "PUT"]),
        (
            Method::PUT,
            "/v1/anti-affinity-groups/g/members/instance/i",
            &["DELETE", "GET", "POST"],
        ),
    ] {
        let r = api.call(method.clone(), uri, None).await;
        assert_error(&r, StatusCode::METHOD_NOT_ALLOWED, None);
        let allow: Vec<&str> = r
            .headers
            .get_all(http::header::ALLOW)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(allow, nexus, "{method} {uri}");
    }
}

/// dropshot deserialises the query string's pairs into nexus's query type: a plain struct
/// ignores keys it does not have, repeated or not, and refuses a repeated field of its own;
/// `PaginationParams` reads every key but `limit` into a map, where the last value wins.
#[tokio::test]
async fn repeated_query_parameters_are_taken_as_nexus_takes_them() {
    let api = Api::new();
    api.project("p").await;
    let rules = "/v1/vpc-firewall-rules?project=p&vpc=default";
    let r = api.get(&format!("{rules}&extra=1&extra=2")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = api.get(&format!("{rules}&vpc=default")).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    assert_eq!(
        r.message(),
        "unable to parse query string: duplicate field `vpc`"
    );
    let r = api.get("/v1/projects/p?extra&extra").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    // Paginated: the last `project` is the one listed.
    assert_eq!(
        api.instance("p", "web", json!({})).await.status,
        StatusCode::CREATED
    );
    let r = api
        .get("/v1/instances?project=nowhere&extra=1&project=p&extra=2")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["items"][0]["name"], "web");
    let r = api.get("/v1/instances?project=p&limit=1&limit=2").await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    assert_eq!(
        r.message(),
        "unable to parse query string: duplicate field `limit`"
    );
}

#[tokio::test]
async fn api_version_newer_than_the_rack_is_refused() {
    let api = Api::new();
    let req = Request::builder()
        .uri("/v1/projects")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("api-version", "2099010100.0.0")
        .body(Bytes::new())
        .unwrap();
    let r = api.raw(req).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    assert!(r.message().contains("does not support this API version"));
}

#[tokio::test]
async fn uppercase_and_malformed_names_are_parse_errors_without_code() {
    let api = Api::new();
    for bad in ["Web", "wEb", "1web", "web-", "web_1"] {
        let r = api
            .post("/v1/projects", json!({"name": bad, "description": ""}))
            .await;
        assert_error(&r, StatusCode::BAD_REQUEST, None);
        assert!(
            r.message().starts_with("unable to parse JSON body"),
            "{bad}: {}",
            r.body
        );
    }
    api.project("p").await;
    let r = api.instance("p", "myInstance", json!({})).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    // Uppercase inside a nested disk name too.
    let r = api
        .instance(
            "p",
            "ok",
            json!({"disks": [{"type": "attach", "name": "dataDisk"}]}),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
}

/// Nexus's `Name` is parsed with the body (`#[serde(try_from = "String")]`): a bad name is
/// dropshot's 400 without code with nexus's own words, checked in nexus's order (length, first
/// character, each character, last character, not a UUID). A rule's name or target carries
/// the field's path and the string's position; a create body's name is in the flattened
/// identity, which serde reads at the end of the object: no path, the closing brace's position.
#[tokio::test]
async fn names_are_refused_in_nexus_words_at_their_place_in_the_body() {
    let api = Api::new();
    let send = |method: Method, uri: &str, body: String| {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Bytes::from(body))
            .unwrap();
        api.raw(req)
    };
    let invalid = "name contains invalid character: \"{c}\" (allowed characters are lowercase \
                   ASCII, digits, and \"-\")";
    let long = "W".repeat(64);
    for (bad, words) in [
        (
            "Web",
            "name must begin with an ASCII lowercase character".to_owned(),
        ),
        ("web-", "name cannot end with \"-\"".to_owned()),
        (
            "Web-",
            "name must begin with an ASCII lowercase character".to_owned(),
        ),
        ("web_1-", invalid.replace("{c}", "_")),
        // Passes the SDK's pattern, not nexus's rules.
        ("wEb", invalid.replace("{c}", "E")),
        (
            long.as_str(),
            "name may contain at most 63 characters".to_owned(),
        ),
        ("", "name requires at least one character".to_owned()),
    ] {
        let body = format!(r#"{{"name":"{bad}","description":""}}"#);
        let column = body.len();
        let r = send(Method::POST, "/v1/projects", body).await;
        assert_error(&r, StatusCode::BAD_REQUEST, None);
        assert_eq!(
            r.message(),
            format!("unable to parse JSON body: {words} at line 1 column {column}"),
            "{bad:?}"
        );
    }
    let r = send(
        Method::POST,
        "/v1/projects",
        "{\"name\": \"p-\",\n \"description\": \"\"\n}\n".to_owned(),
    )
    .await;
    assert_eq!(
        r.message(),
        "unable to parse JSON body: name cannot end with \"-\" at line 3 column 1"
    );

    // In a rule, the path and the string's closing quote.
    api.project("p").await;
    let rules = |name: &str, target: &str| {
        format!(
            r#"{{"rules":[{{"name":"{name}","description":"","status":"enabled","direction":"inbound","targets":[{{"type":"instance","value":"{target}"}}],"filters":{{}},"action":"allow","priority":1}}]}}"#
        )
    };
    let url = "/v1/vpc-firewall-rules?project=p&vpc=default";
    let body = rules("Allow-web", "web");
    let column = body.find("Allow-web").unwrap() + "Allow-web".len() + 1;
    let r = send(Method::PUT, url, body).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    assert_eq!(
        r.message(),
        format!(
            "unable to parse JSON body: rules[0].name: name must begin with an ASCII lowercase \
             character at line 1 column {column}"
        )
    );
    let body = rules("allow-web", "web-");
    // An adjacently tagged value's error is at the end of its object (the same serde derive
    // for nexus's `VpcFirewallRuleTarget`).
    let column = body.find("web-\"}").unwrap() + "web-\"}".len();
    let r = send(Method::PUT, url, body).await;
    assert_eq!(
        r.message(),
        format!(
            "unable to parse JSON body: rules[0].targets[0].value: name cannot end with \"-\" \
             at line 1 column {column}"
        )
    );
}

#[tokio::test]
async fn malformed_json_and_wrong_content_type_are_400() {
    let api = Api::new();
    let req = Request::builder()
        .method(Method::POST)
        .uri("/v1/projects")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Bytes::from_static(b"{\"name\":"))
        .unwrap();
    let r = api.raw(req).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    let req = Request::builder()
        .method(Method::POST)
        .uri("/v1/projects")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "text/plain")
        .body(Bytes::from_static(b"{\"name\":\"a\",\"description\":\"\"}"))
        .unwrap();
    assert_eq!(api.raw(req).await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn duplicate_names_are_object_already_exists_400() {
    let api = Api::new();
    api.project("p").await;
    let r = api
        .post("/v1/projects", json!({"name": "p", "description": ""}))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("ObjectAlreadyExists"));
    assert_eq!(r.message(), "already exists: project \"p\"");

    let disk = json!({"name": "d", "description": "", "size": GIB,
        "disk_backend": {"type": "distributed", "disk_source": {"type": "blank", "block_size": 4096}}});
    assert_eq!(
        api.post("/v1/disks?project=p", disk.clone()).await.status,
        StatusCode::CREATED
    );
    let r = api.post("/v1/disks?project=p", disk.clone()).await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("ObjectAlreadyExists"));
    // Names are per project: another project may reuse it.
    api.project("q").await;
    assert_eq!(
        api.post("/v1/disks?project=q", disk).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn selectors_need_id_alone_or_name_with_project() {
    let api = Api::new();
    api.project("p").await;
    let created = api.instance("p", "vm", json!({"start": false})).await;
    let id = created.str("id").to_owned();

    assert_eq!(
        api.get(&format!("/v1/instances/{id}")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        api.get("/v1/instances/vm?project=p").await.status,
        StatusCode::OK
    );
    let pid = api.get("/v1/projects/p").await.str("id").to_owned();
    assert_eq!(
        api.get(&format!("/v1/instances/vm?project={pid}"))
            .await
            .status,
        StatusCode::OK
    );

    let r = api.get(&format!("/v1/instances/{id}?project=p")).await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        r.message(),
        "when providing instance as an ID project should not be specified"
    );
    let r = api.get("/v1/instances/vm").await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        r.message(),
        "instance should either be UUID or project should be specified"
    );
    let r = api.get("/v1/instances/nope?project=p").await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));
    assert_eq!(r.message(), "not found: instance with name \"nope\"");
    let r = api.get("/v1/instances/vm?project=other").await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));
    assert_eq!(r.message(), "not found: project with name \"other\"");
    let missing = Uuid::new_v4();
    let r = api.get(&format!("/v1/floating-ips/{missing}")).await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));
    // Lists need their project.
    assert_error(
        &api.get("/v1/instances").await,
        StatusCode::BAD_REQUEST,
        None,
    );
}

#[tokio::test]
async fn pagination_walks_three_pages_with_opaque_stable_tokens() {
    let api = Api::new();
    for i in 0..7 {
        api.project(&format!("proj-{i}")).await;
    }
    let first = api.get("/v1/projects?limit=3").await;
    assert_eq!(first.status, StatusCode::OK);
    let token = first.str("next_page").to_owned();
    assert!(!token.is_empty());
    assert!(!token.contains("proj"), "token is opaque: {token}");
    // Stable: the same request yields the same token.
    assert_eq!(
        api.get("/v1/projects?limit=3").await.str("next_page"),
        token
    );

    let mut names = Vec::new();
    let mut pages = 0;
    let mut uri = "/v1/projects?limit=3".to_owned();
    loop {
        let r = api.get(&uri).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let items = r.body["items"].as_array().unwrap().clone();
        if items.is_empty() {
            assert!(r.body["next_page"].is_null(), "empty page ends the walk");
            break;
        }
        pages += 1;
        names.extend(items.iter().map(|p| p["name"].as_str().unwrap().to_owned()));
        uri = format!("/v1/projects?limit=3&page_token={}", r.str("next_page"));
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..7).map(|i| format!("proj-{i}")).collect();
    assert_eq!(names, expected);

    let desc = api
        .get("/v1/projects?sort_by=name_descending&limit=2")
        .await;
    assert_eq!(desc.body["items"][0]["name"], "proj-6");
    let by_id = api
        .get("/v1/projects?sort_by=id_ascending&limit=10000")
        .await;
    let ids: Vec<&str> = by_id.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);

    assert_error(
        &api.get("/v1/projects?limit=0").await,
        StatusCode::BAD_REQUEST,
        None,
    );
    assert_error(
        &api.get("/v1/projects?sort_by=newest").await,
        StatusCode::BAD_REQUEST,
        None,
    );
    assert_error(
        &api.get("/v1/projects?page_token=garbage").await,
        StatusCode::BAD_REQUEST,
        None,
    );
    // A huge limit is clamped, not refused.
    assert_eq!(
        api.get("/v1/projects?limit=4000000000").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn follow_up_pages_need_only_the_token_like_the_sdk_stream() {
    let api = Api::new();
    api.project("p").await;
    for i in 0..5 {
        let r = api
            .instance("p", &format!("vm-{i}"), json!({"start": false}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let first = api
        .get("/v1/instances?project=p&limit=2&sort_by=name_descending")
        .await;
    assert_eq!(first.body["items"][0]["name"], "vm-4");
    // The SDK's stream() drops `project` and `sort_by` after the first page.
    let second = api
        .get(&format!(
            "/v1/instances?limit=2&page_token={}",
            first.str("next_page")
        ))
        .await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(second.body["items"][0]["name"], "vm-2");
    // A token from one list is refused by another.
    let r = api
        .get(&format!("/v1/disks?page_token={}", first.str("next_page")))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn instance_lifecycle_follows_nexus_rules_and_fires_events() {
    let api = Api::new();
    api.project("p").await;
    let r = api
        .instance("p", "vm", json!({"external_ips": [{"type": "ephemeral"}]}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.str("run_state"), "starting");
    let id: Uuid = r.str("id").parse().unwrap();

    // Deleting a starting/running instance is refused with nexus's body.
    let r = api.delete("/v1/instances/vm?project=p").await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        r.message(),
        "cannot delete instance: instance is running or has not yet fully stopped"
    );

    api.wait_state("p", "vm", "running").await;
    assert_eq!(api.seen(), vec![Seen::Running("vm".into())]);
    let r = api.delete("/v1/instances/vm?project=p").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    // Start is idempotent while running; stop goes through stopping.
    let r = api.post_empty("/v1/instances/vm/start?project=p").await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.str("run_state"), "running");
    let r = api.post_empty(&format!("/v1/instances/{id}/stop")).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.str("run_state"), "stopping");
    let r = api.post_empty("/v1/instances/vm/start?project=p").await;
    assert_error(&r, StatusCode::CONFLICT, Some("Conflict"));
    api.wait_state("p", "vm", "stopped").await;
    assert_eq!(
        api.post_empty("/v1/instances/vm/stop?project=p")
            .await
            .status,
        StatusCode::ACCEPTED,
        "stop is idempotent when stopped"
    );
    let r = api.post_empty("/v1/instances/vm/reboot?project=p").await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));

    // Reboot: running → rebooting → running, halting and resuming.
    api.post_empty("/v1/instances/vm/start?project=p").await;
    api.wait_state("p", "vm", "running").await;
    let r = api.post_empty("/v1/instances/vm/reboot?project=p").await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.str("run_state"), "rebooting");
    api.wait_state("p", "vm", "running").await;

    api.post_empty("/v1/instances/vm/stop?project=p").await;
    api.wait_state("p", "vm", "stopped").await;
    assert_eq!(
        api.delete("/v1/instances/vm?project=p").await.status,
        StatusCode::NO_CONTENT
    );
    assert_error(
        &api.get(&format!("/v1/instances/{id}")).await,
        StatusCode::NOT_FOUND,
        Some("ObjectNotFound"),
    );
    assert_eq!(
        api.seen(),
        vec![
            Seen::Running("vm".into()),
            Seen::Halted(id),
            Seen::Running("vm".into()),
            Seen::Halted(id),
            Seen::Running("vm".into()),
            Seen::Halted(id),
            Seen::Deleted(id),
        ]
    );
    // The ephemeral address went back to the pool.
    assert_eq!(api.sim.dump()["instances"], json!([]));
}

#[tokio::test]
async fn create_with_start_false_is_stopped_and_can_be_started() {
    let api = Api::new();
    api.project("p").await;
    let r = api.instance("p", "vm", json!({"start": false})).await;
    assert_eq!(r.str("run_state"), "stopped");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(api.state("p", "vm").await, "stopped");
    let r = api.post_empty("/v1/instances/vm/start?project=p").await;
    assert_eq!(r.str("run_state"), "starting");
    api.wait_state("p", "vm", "running").await;
}

#[tokio::test]
async fn a_delayed_create_answers_creating_and_refuses_stop() {
    let api = Api::with_timings(Timings {
        create_to_starting: Duration::from_millis(150),
        ..oxide_common::timings()
    });
    api.project("p").await;
    let r = api.instance("p", "vm", json!({})).await;
    assert_eq!(r.str("run_state"), "creating");
    let r = api.post_empty("/v1/instances/vm/stop?project=p").await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    api.wait_state("p", "vm", "running").await;
}

/// Issue 34 item 8: an instance created without `external_ips` has no ephemeral address,
/// only the SNAT address nexus allocates for an IPv4 primary NIC (its way out); one without
/// an IPv4 NIC gets none at all.
#[tokio::test]
async fn without_external_ips_an_instance_has_only_the_snat_address_of_its_ipv4_nic() {
    let api = Api::new();
    api.project("p").await;
    let kinds = async |name: &str| -> Vec<String> {
        let ips = api
            .get(&format!("/v1/instances/{name}/external-ips?project=p"))
            .await;
        ips.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["kind"].as_str().unwrap().to_owned())
            .collect()
    };
    let free_before = api.pool.free();
    let r = api.instance("p", "plain", json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(kinds("plain").await, ["snat"]);
    assert_eq!(
        api.pool.free(),
        free_before,
        "no address taken from the pool"
    );
    let r = api
        .instance(
            "p",
            "no-nic",
            json!({"network_interfaces": {"type": "none"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(kinds("no-nic").await, Vec::<String>::new());
}

#[tokio::test]
async fn deleting_an_instance_detaches_disks_and_floating_ips_and_frees_addresses() {
    let api = Api::new();
    api.project("p").await;
    let fip = api
        .post(
            "/v1/floating-ips?project=p",
            json!({"name": "fip", "description": ""}),
        )
        .await;
    assert_eq!(fip.status, StatusCode::CREATED, "{}", fip.body);
    let free_before = api.pool.free();
    let r = api
        .instance(
            "p",
            "vm",
            json!({
                "boot_disk": {"type": "create", "name": "vm-boot", "description": "", "size": 10 * GIB,
                    "disk_backend": {"type": "distributed", "disk_source": {"type": "blank", "block_size": 512}}},
                "external_ips": [{"type": "ephemeral"}, {"type": "floating", "floating_ip": "fip"}],
                "start": false,
            }),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id: Uuid = r.str("id").parse().unwrap();
    let boot = api.get("/v1/disks/vm-boot?project=p").await;
    assert_eq!(
        boot.body["state"],
        json!({"state": "attached", "instance": id.to_string()})
    );
    assert_eq!(r.str("boot_disk_id"), boot.str("id"));
    assert_eq!(api.pool.free(), free_before - 1);

    let ips = api.get("/v1/instances/vm/external-ips?project=p").await;
    let kinds: Vec<&str> = ips.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, vec!["snat", "ephemeral", "floating"]);
    assert!(ips.body["next_page"].is_null());

    let r = api.delete("/v1/disks/vm-boot?project=p").await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));

    assert_eq!(
        api.delete("/v1/instances/vm?project=p").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        api.get("/v1/disks/vm-boot?project=p").await.body["state"]["state"],
        "detached"
    );
    assert!(api.get("/v1/floating-ips/fip?project=p").await.body["instance_id"].is_null());
    assert_eq!(api.pool.free(), free_before);
    let fip_ip: IpAddr = fip.str("ip").parse().unwrap();
    let seen = api.seen();
    assert!(seen.contains(&Seen::Fip(fip_ip, Some(id))));
    assert!(seen.contains(&Seen::Fip(fip_ip, None)));
    assert_eq!(
        api.delete("/v1/disks/vm-boot?project=p").await.status,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn floating_ip_attach_is_503_while_starting_then_202_once_running() {
    let api = Api::new();
    api.project("p").await;
    api.post(
        "/v1/floating-ips?project=p",
        json!({"name": "fip", "description": ""}),
    )
    .await;
    api.instance("p", "a", json!({})).await;
    api.instance("p", "b", json!({"start": false})).await;
    let attach_a = json!({"kind": "instance", "parent": "a"});

    let r = api
        .post("/v1/floating-ips/fip/attach?project=p", attach_a.clone())
        .await;
    assert_error(
        &r,
        StatusCode::SERVICE_UNAVAILABLE,
        Some("ServiceNotAvailable"),
    );
    api.wait_state("p", "a", "running").await;
    let r = api
        .post("/v1/floating-ips/fip/attach?project=p", attach_a.clone())
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    let a_id = api
        .get("/v1/instances/a?project=p")
        .await
        .str("id")
        .to_owned();
    assert_eq!(r.str("instance_id"), a_id);
    // Again to the same instance: idempotent.
    let r = api
        .post("/v1/floating-ips/fip/attach?project=p", attach_a)
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    // Elsewhere: refused.
    let r = api
        .post(
            "/v1/floating-ips/fip/attach?project=p",
            json!({"kind": "instance", "parent": "b"}),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    // Delete while attached: refused.
    let r = api.delete("/v1/floating-ips/fip?project=p").await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    // The running instance now reaches the floating address.
    let running = api.sim.running_instance(a_id.parse().unwrap()).unwrap();
    assert_eq!(running.external_ips.len(), 1);

    let r = api
        .post_empty("/v1/floating-ips/fip/detach?project=p")
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert!(r.body["instance_id"].is_null());
    let r = api
        .post_empty("/v1/floating-ips/fip/detach?project=p")
        .await;
    assert_eq!(
        r.status,
        StatusCode::ACCEPTED,
        "detach when not attached is fine"
    );
    assert_eq!(
        api.delete("/v1/floating-ips/fip?project=p").await.status,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn floating_ip_attach_to_a_failed_instance_is_400() {
    let api = Api::new();
    api.project("p").await;
    api.post(
        "/v1/floating-ips?project=p",
        json!({"name": "fip", "description": ""}),
    )
    .await;
    let r = api.instance("p", "vm", json!({"start": false})).await;
    api.sim.set_instance_failed(r.str("id").parse().unwrap());
    let r = api
        .post(
            "/v1/floating-ips/fip/attach?project=p",
            json!({"kind": "instance", "parent": "vm"}),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    // Failed instances can be stopped (→ stopped) and deleted.
    let r = api.post_empty("/v1/instances/vm/stop?project=p").await;
    assert_eq!(r.str("run_state"), "stopped");
}

async fn import_disk(api: &Api) {
    let r = api
        .post(
            "/v1/disks?project=p",
            json!({"name": "img", "description": "", "size": GIB,
                "disk_backend": {"type": "distributed", "disk_source": {"type": "importing_blocks", "block_size": 512}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["state"]["state"], "import_ready");
}

fn chunk(offset: u64, len: usize, byte: u8) -> Value {
    json!({"offset": offset, "base64_encoded_data": STANDARD.encode(vec![byte; len])})
}

#[tokio::test]
async fn bulk_import_happy_path_ends_in_a_snapshot_and_an_image() {
    let api = Api::new();
    api.project("p").await;
    import_disk(&api).await;
    assert_eq!(
        api.post_empty("/v1/disks/img/bulk-write-start?project=p")
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        api.get("/v1/disks/img?project=p").await.body["state"]["state"],
        "importing_from_bulk_writes"
    );
    for (i, byte) in [1u8, 0, 2].into_iter().enumerate() {
        let r = api
            .post(
                "/v1/disks/img/bulk-write?project=p",
                chunk(i as u64 * 524_288, 524_288, byte),
            )
            .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    }
    // The last block of the disk is writable; only non-zero data is stored.
    let r = api
        .post(
            "/v1/disks/img/bulk-write?project=p",
            chunk(GIB - 512, 512, 9),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert_eq!(
        api.post_empty("/v1/disks/img/bulk-write-stop?project=p")
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let r = api
        .post(
            "/v1/disks/img/finalize?project=p",
            json!({"snapshot_name": "img-snap"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let disk = api.get("/v1/disks/img?project=p").await;
    assert_eq!(disk.body["state"]["state"], "detached");
    let dump = api.sim.dump();
    assert_eq!(
        dump["disks"][0]["bytes_written"],
        json!(2 * 524_288 + 65_536)
    );

    let snap = api.get("/v1/snapshots/img-snap?project=p").await;
    assert_eq!(snap.status, StatusCode::OK);
    assert_eq!(snap.str("disk_id"), disk.str("id"));
    let image = api
        .post(
            "/v1/images?project=p",
            json!({"name": "ubuntu", "description": "", "os": "ubuntu", "version": "24.04",
                "source": {"type": "snapshot", "id": snap.str("id")}}),
        )
        .await;
    assert_eq!(image.status, StatusCode::CREATED, "{}", image.body);
    assert_eq!(image.body["size"], json!(GIB));

    // image_list with project: project images only; without: silo images only.
    api.sim.seed_silo_image("silo-img", "debian", "12", GIB);
    let project_images = api.get("/v1/images?project=p").await;
    assert_eq!(project_images.body["items"].as_array().unwrap().len(), 1);
    assert_eq!(project_images.body["items"][0]["name"], "ubuntu");
    let silo_images = api.get("/v1/images").await;
    assert_eq!(silo_images.body["items"].as_array().unwrap().len(), 1);
    assert_eq!(silo_images.body["items"][0]["name"], "silo-img");
    assert_eq!(api.get("/v1/images/silo-img").await.status, StatusCode::OK);
    assert_eq!(
        api.get("/v1/images/ubuntu?project=p").await.status,
        StatusCode::OK
    );
    assert_eq!(
        api.get("/v1/images/ubuntu").await.status,
        StatusCode::NOT_FOUND
    );

    // A disk (and an instance boot disk) from the image.
    let r = api
        .instance(
            "p",
            "vm",
            json!({"boot_disk": {"type": "create", "name": "vm-boot", "description": "", "size": 2 * GIB,
                "disk_backend": {"type": "distributed", "disk_source": {"type": "image", "image_id": image.str("id")}}},
                "start": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let boot = api.get("/v1/disks/vm-boot?project=p").await;
    assert_eq!(boot.str("image_id"), image.str("id"));
    assert_eq!(boot.body["block_size"], 512);
}

#[tokio::test]
async fn bulk_import_steps_out_of_order_are_400() {
    let api = Api::new();
    api.project("p").await;
    import_disk(&api).await;
    let write = chunk(0, 512, 1);
    let r = api
        .post("/v1/disks/img/bulk-write?project=p", write.clone())
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    let r = api
        .post_empty("/v1/disks/img/bulk-write-stop?project=p")
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    api.post_empty("/v1/disks/img/bulk-write-start?project=p")
        .await;
    let r = api
        .post_empty("/v1/disks/img/bulk-write-start?project=p")
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    let r = api
        .post("/v1/disks/img/finalize?project=p", json!({}))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    // Misaligned offset, ragged length, past the end, bad base64, too large.
    for body in [
        chunk(100, 512, 1),
        chunk(0, 700, 1),
        chunk(GIB, 512, 1),
        json!({"offset": 0, "base64_encoded_data": "***"}),
        chunk(0, 512 * 1024 + 512, 1),
    ] {
        let r = api.post("/v1/disks/img/bulk-write?project=p", body).await;
        assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    }
    assert_eq!(
        api.post("/v1/disks/img/bulk-write?project=p", write)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    api.post_empty("/v1/disks/img/bulk-write-stop?project=p")
        .await;
    // An import-ready disk cannot be deleted; a finalized one can.
    let r = api.delete("/v1/disks/img?project=p").await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        api.post("/v1/disks/img/finalize?project=p", json!({}))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let r = api
        .post("/v1/disks/img/finalize?project=p", json!({}))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        api.delete("/v1/disks/img?project=p").await.status,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn bulk_writes_over_the_pantry_chunk_of_512_kib_are_refused_and_counted() {
    let api = Api::new();
    api.project("p").await;
    import_disk(&api).await;
    api.post_empty("/v1/disks/img/bulk-write-start?project=p")
        .await;
    let r = api
        .post(
            "/v1/disks/img/bulk-write?project=p",
            chunk(0, 512 * 1024, 1),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    // One byte over: the size check comes before any alignment check, as in the pantry.
    let r = api
        .post(
            "/v1/disks/img/bulk-write?project=p",
            chunk(0, 512 * 1024 + 1, 1),
        )
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        r.message(),
        "Invalid number of blocks: data len 524289 over max chunk size 524288!"
    );
    let stats = api.sim.bulk_write_stats();
    assert_eq!(
        (
            stats.writes,
            stats.max_decoded_bytes,
            stats.over_limit,
            stats.bytes
        ),
        (2, 512 * 1024 + 1, 1, 2 * 512 * 1024 + 1)
    );
    api.sim.reset_counters();
    assert_eq!(api.sim.bulk_write_stats().writes, 0);
}

#[tokio::test]
async fn disk_sizes_follow_nexus_rules() {
    let api = Api::new();
    api.project("p").await;
    let disk = |size: u64, bs: u64| {
        json!({"name": "d", "description": "", "size": size,
            "disk_backend": {"type": "distributed", "disk_source": {"type": "blank", "block_size": bs}}})
    };
    for (size, bs) in [
        (GIB / 2, 512),
        (GIB + 4096, 4096),
        (1024 * GIB, 512),
        (GIB + 512, 4096),
    ] {
        let r = api.post("/v1/disks?project=p", disk(size, bs)).await;
        assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidValue"));
    }
    let r = api.post("/v1/disks?project=p", disk(GIB, 1024)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    let r = api
        .post("/v1/disks?project=p", disk(1023 * GIB, 4096))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn instance_create_limits_are_enforced() {
    let api = Api::new();
    api.project("p").await;
    let blank = |name: &str| {
        json!({"type": "create", "name": name, "description": "", "size": GIB,
            "disk_backend": {"type": "distributed", "disk_source": {"type": "blank", "block_size": 4096}}})
    };
    let cases: Vec<(Value, Option<&str>)> = vec![
        (json!({"ncpus": 255}), Some("InvalidRequest")),
        (json!({"memory": GIB / 2}), Some("InvalidValue")),
        (json!({"memory": GIB + 1}), Some("InvalidValue")),
        (json!({"memory": 1537 * GIB}), Some("InvalidValue")),
        (json!({"hostname": ""}), None),
        (json!({"hostname": "bad_host"}), None),
        (
            json!({"disks": (0..13).map(|i| blank(&format!("d{i}"))).collect::<Vec<_>>()}),
            Some("InvalidRequest"),
        ),
        (
            json!({"external_ips": [{"type": "ephemeral"}, {"type": "ephemeral"}, {"type": "ephemeral"}]}),
            Some("InvalidRequest"),
        ),
        (
            json!({"external_ips": (0..33).map(|i| json!({"type": "floating", "floating_ip": format!("f{i}")})).collect::<Vec<_>>()}),
            Some("InvalidRequest"),
        ),
        (json!({"user_data": "not base64!"}), None),
        (
            json!({"user_data": STANDARD.encode(vec![b'a'; 32 * 1024 + 1])}),
            None,
        ),
        // nexus looks the keys up before it counts them: 101 unknown keys are a 404.
        (
            json!({"ssh_public_keys": (0..101).map(|i| format!("k{i}")).collect::<Vec<_>>()}),
            Some("ObjectNotFound"),
        ),
        (
            json!({"ssh_public_keys": ["missing-key"]}),
            Some("ObjectNotFound"),
        ),
        (
            json!({"network_interfaces": {"type": "create", "params": (0..9).map(|i| json!({
                "name": format!("n{i}"), "description": "", "vpc_name": "default", "subnet_name": "default"
            })).collect::<Vec<_>>()}}),
            Some("InvalidRequest"),
        ),
        (
            json!({"disks": [{"type": "attach", "name": "absent"}]}),
            Some("ObjectNotFound"),
        ),
        (
            json!({"anti_affinity_groups": ["absent"]}),
            Some("ObjectNotFound"),
        ),
    ];
    for (extra, code) in cases {
        let r = api.instance("p", "vm", extra.clone()).await;
        assert!(r.status.is_client_error(), "{extra}: {}", r.body);
        assert_eq!(r.code(), code, "{extra}: {}", r.body);
    }
    // Nothing leaked from the refused creates.
    let dump = api.sim.dump();
    assert_eq!(dump["instances"], json!([]));
    assert_eq!(dump["disks"], json!([]));
    // Exactly at the limits is fine (one ephemeral IP: two need an IPv6 pool this rack lacks).
    let max_user_data = STANDARD.encode(vec![b'a'; 32 * 1024]);
    let r = api
        .instance(
            "p",
            "vm",
            json!({"ncpus": 254, "memory": 1536 * GIB, "user_data": max_user_data, "start": false,
                "disks": (0..12).map(|i| blank(&format!("d{i}"))).collect::<Vec<_>>(),
                "external_ips": [{"type": "ephemeral"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let ips = api.get("/v1/instances/vm/external-ips?project=p").await;
    assert_eq!(ips.body["items"].as_array().unwrap().len(), 2);
    let disks = api.get("/v1/instances/vm/disks?project=p&limit=5").await;
    assert_eq!(disks.body["items"].as_array().unwrap().len(), 5);
}

/// nexus's own checks and words for sizes, ephemeral IPs and SSH keys (omicron
/// `nexus/src/app/instance.rs` `project_create_instance`, `validate_ephemeral_ip_pair`,
/// `normalize_ssh_keys`).
#[tokio::test]
async fn instance_create_checks_what_nexus_checks_in_its_words() {
    let api = Api::new();
    api.project("p").await;
    // nexus does not check for zero vCPUs.
    let r = api
        .instance("p", "zero", json!({"ncpus": 0, "start": false}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let refused = |extra: Value| {
        let api = &api;
        async move {
            let r = api.instance("p", "vm", extra.clone()).await;
            assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
            r.message().to_owned()
        }
    };
    let eph = json!({"type": "ephemeral"});
    assert_eq!(
        refused(json!({"external_ips": [eph, eph]})).await,
        "when requesting two ephemeral IPs, IP version or explicit pool name must be specified on each"
    );
    assert_eq!(
        refused(json!({"external_ips": [eph, eph, eph]})).await,
        "An instance may not have more than 2 ephemeral IP addresses"
    );
    let v4 = json!({"type": "ephemeral", "pool_selector": {"type": "auto", "ip_version": "v4"}});
    assert_eq!(
        refused(json!({"external_ips": [v4, v4]})).await,
        "cannot request two ephemeral IPs of the same version (v4)"
    );
    let default =
        json!({"type": "ephemeral", "pool_selector": {"type": "explicit", "pool": "default"}});
    assert_eq!(
        refused(json!({"external_ips": [default, default]})).await,
        "cannot request two ephemeral IPs from the same pool"
    );
    assert_eq!(
        refused(json!({"external_ips": [default, v4]})).await,
        "cannot request two ephemeral IPs of the same version (v4): explicit pool and auto selection both specify v4"
    );
    assert_eq!(
        refused(json!({"enable_jumbo_frames": true})).await,
        "enable_jumbo_frames may only be set on an instance when the fleet-wide jumbo-frames opt-in is enabled by a fleet administrator"
    );
    assert_eq!(
        refused(json!({"network_interfaces": {"type": "create", "params": []}})).await,
        "All interfaces must be in the same VPC"
    );
    // SSH keys: looked up first (the first missing one is the 404), then the found ones counted.
    for i in 0..101 {
        api.sim
            .seed_ssh_key(&format!("k{i}"), &format!("ssh-ed25519 AAAA{i} k{i}@host"));
    }
    let mut keys: Vec<String> = (0..101).map(|i| format!("k{i}")).collect();
    keys.insert(3, "absent".into());
    let r = api
        .instance("p", "vm", json!({"ssh_public_keys": keys}))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));
    assert_eq!(r.message(), "not found: ssh-key with name \"absent\"");
    keys.remove(3);
    assert_eq!(
        refused(json!({"ssh_public_keys": keys})).await,
        "cannot attach more than 100 ssh keys to the instance"
    );
    // 100 distinct keys, one named twice: 100 found.
    keys.pop();
    keys.push("k0".into());
    let r = api
        .instance("p", "vm", json!({"ssh_public_keys": keys, "start": false}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn user_data_and_ssh_keys_reach_the_running_instance() {
    let api = Api::new();
    api.project("p").await;
    api.sim.seed_ssh_key("me", "ssh-ed25519 AAAA me@host");
    api.sim.seed_ssh_key("other", "ssh-ed25519 BBBB other@host");
    let cloud_init = b"#cloud-config\nhostname: vm\n";
    let r = api
        .instance(
            "p",
            "vm",
            json!({"user_data": STANDARD.encode(cloud_init), "ssh_public_keys": ["me"]}),
        )
        .await;
    api.wait_state("p", "vm", "running").await;
    let ri = api
        .sim
        .running_instance(r.str("id").parse().unwrap())
        .unwrap();
    assert_eq!(ri.user_data, cloud_init);
    assert_eq!(ri.ssh_public_keys, vec!["ssh-ed25519 AAAA me@host"]);
    assert_eq!(ri.project, "p");
    assert!(
        !format!("{ri:?}").contains("cloud-config"),
        "Debug hides user data"
    );
    // Omitted: all of the user's keys.
    let r = api.instance("p", "vm2", json!({"start": false})).await;
    let ri = api
        .sim
        .running_instance(r.str("id").parse().unwrap())
        .unwrap();
    assert_eq!(ri.ssh_public_keys.len(), 2);
}

#[tokio::test]
async fn serial_console_serves_recent_bytes_of_a_running_instance() {
    let api = Api::new();
    api.project("p").await;
    let r = api.instance("p", "vm", json!({})).await;
    let id: Uuid = r.str("id").parse().unwrap();
    let r = api
        .get("/v1/instances/vm/serial-console?project=p&most_recent=100")
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    api.wait_state("p", "vm", "running").await;
    api.sim.append_console(id, b"hello ");
    api.sim.append_console(id, b"world");

    let r = api
        .get("/v1/instances/vm/serial-console?project=p&from_start=0")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let data: Vec<u8> = serde_json::from_value(r.body["data"].clone()).unwrap();
    assert_eq!(data, b"hello world");
    assert_eq!(r.body["last_byte_offset"], 11);
    let r = api
        .get(&format!("/v1/instances/{id}/serial-console?most_recent=5"))
        .await;
    let data: Vec<u8> = serde_json::from_value(r.body["data"].clone()).unwrap();
    assert_eq!(data, b"world");
    let r = api
        .get("/v1/instances/vm/serial-console?project=p&from_start=6&max_bytes=3")
        .await;
    let data: Vec<u8> = serde_json::from_value(r.body["data"].clone()).unwrap();
    assert_eq!(data, b"wor");
    assert_eq!(r.body["last_byte_offset"], 9);
    for q in ["", "&from_start=0&most_recent=1"] {
        let r = api
            .get(&format!("/v1/instances/vm/serial-console?project=p{q}"))
            .await;
        assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    }
    // Without max_bytes propolis returns 16 KiB, read forward from the requested offset.
    api.sim.append_console(id, &vec![b'x'; 2 * 1024 * 1024]);
    let r = api
        .get("/v1/instances/vm/serial-console?project=p&most_recent=4000000")
        .await;
    let data: Vec<u8> = serde_json::from_value(r.body["data"].clone()).unwrap();
    assert_eq!(data.len(), 16 * 1024);
    assert!(data.starts_with(b"hello world"));
    // The first MiB and the last MiB are kept; the middle is gone (nexus answers 500).
    let r = api
        .get("/v1/instances/vm/serial-console?project=p&from_start=0&max_bytes=11")
        .await;
    let data: Vec<u8> = serde_json::from_value(r.body["data"].clone()).unwrap();
    assert_eq!(data, b"hello world");
    let r = api
        .get("/v1/instances/vm/serial-console?project=p&most_recent=1048576&max_bytes=2000000")
        .await;
    assert_eq!(r.body["data"].as_array().unwrap().len(), 1024 * 1024);
    assert_eq!(r.body["last_byte_offset"], 2 * 1024 * 1024 + 11);
    let r = api
        .get("/v1/instances/vm/serial-console?project=p&from_start=1048580")
        .await;
    assert_eq!(
        r.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "bytes between the first and the last MiB are gone"
    );
}

#[tokio::test]
async fn anti_affinity_groups_take_stopped_instances_only() {
    let api = Api::new();
    api.project("p").await;
    let g = api
        .post(
            "/v1/anti-affinity-groups?project=p",
            json!({"name": "cp", "description": "", "policy": "allow", "failure_domain": "sled"}),
        )
        .await;
    assert_eq!(g.status, StatusCode::CREATED, "{}", g.body);
    api.instance("p", "a", json!({"start": false})).await;
    api.instance("p", "b", json!({})).await;
    let r = api
        .post_empty("/v1/anti-affinity-groups/cp/members/instance/a?project=p")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["type"], "instance");
    assert_eq!(r.body["value"]["name"], "a");
    // Adding again is idempotent.
    let r = api
        .post_empty("/v1/anti-affinity-groups/cp/members/instance/a?project=p")
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = api
        .post_empty("/v1/anti-affinity-groups/cp/members/instance/b?project=p")
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    // Created straight into the group.
    let r = api
        .instance(
            "p",
            "c",
            json!({"anti_affinity_groups": ["cp"], "start": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let members = api
        .get(&format!("/v1/anti-affinity-groups/{}/members", g.str("id")))
        .await;
    let names: Vec<&str> = members.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["value"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a", "c"]);
    assert_eq!(
        api.get("/v1/anti-affinity-groups?project=p").await.body["items"][0]["name"],
        "cp"
    );
}

#[tokio::test]
async fn route_faults_fail_with_real_error_bodies_and_counters_use_templates() {
    let api = Api::new();
    api.project("p").await;
    api.faults.update(|f| {
        f.routes.insert(
            "GET /v1/projects/{project}".into(),
            RouteFault {
                error_rate: 1.0,
                ..RouteFault::default()
            },
        );
        f.routes.insert(
            "GET /v1/projects".into(),
            RouteFault {
                error_rate: 1.0,
                error_status: 500,
                latency_ms: 20,
            },
        );
    });
    let r = api.get("/v1/projects/p").await;
    assert_error(
        &r,
        StatusCode::SERVICE_UNAVAILABLE,
        Some("ServiceNotAvailable"),
    );
    let started = std::time::Instant::now();
    let r = api.get("/v1/projects").await;
    assert_error(&r, StatusCode::INTERNAL_SERVER_ERROR, Some("Internal"));
    assert!(started.elapsed() >= Duration::from_millis(20));
    api.faults.set(FaultSpec::default());
    assert_eq!(api.get("/v1/projects/p").await.status, StatusCode::OK);

    let counters = api.sim.counters();
    assert_eq!(counters["GET /v1/projects/{project}"], 2);
    assert_eq!(counters["GET /v1/projects"], 1);
    assert_eq!(counters["POST /v1/projects"], 1);
    api.sim.reset_counters();
    assert!(api.sim.counters().is_empty());
}

#[tokio::test]
async fn fail_at_boot_and_hang_stopping_faults_act_by_name_prefix() {
    let api = Api::new();
    api.project("p").await;
    api.faults.update(|f| {
        f.fail_at_boot.push("bad-".into());
        f.hang_stopping.push("stuck-".into());
    });
    api.instance("p", "bad-1", json!({})).await;
    api.wait_state("p", "bad-1", "failed").await;
    api.instance("p", "stuck-1", json!({})).await;
    api.wait_state("p", "stuck-1", "running").await;
    api.post_empty("/v1/instances/stuck-1/stop?project=p").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(api.state("p", "stuck-1").await, "stopping");
    assert_eq!(
        api.delete("/v1/instances/stuck-1?project=p").await.status,
        StatusCode::BAD_REQUEST
    );
    // An admin can still fail it, after which it can be deleted.
    let id = api
        .get("/v1/instances/stuck-1?project=p")
        .await
        .str("id")
        .to_owned();
    api.sim.set_instance_failed(id.parse().unwrap());
    assert_eq!(
        api.delete("/v1/instances/stuck-1?project=p").await.status,
        StatusCode::NO_CONTENT
    );
    assert!(!api.seen().contains(&Seen::Running("bad-1".into())));
}

/// omicron: an unset `auto_restart_policy` is `best_effort`, and the reincarnation task
/// restarts `failed` instances whose intended state is running; `never` and a stop turn it off.
#[tokio::test]
async fn failed_instances_restart_themselves_unless_the_policy_is_never_or_they_were_stopped() {
    let api = Api::new();
    api.project("p").await;
    for name in ["default-1", "never-1", "stopped-1"] {
        let extra = if name == "never-1" {
            json!({"auto_restart_policy": "never"})
        } else {
            json!({})
        };
        api.instance("p", name, extra).await;
        api.wait_state("p", name, "running").await;
    }
    let fail = |name: &str| {
        let api = &api;
        let name = name.to_owned();
        async move {
            let id = api
                .get(&format!("/v1/instances/{name}?project=p"))
                .await
                .str("id")
                .to_owned();
            api.sim.set_instance_failed(id.parse().unwrap());
        }
    };
    fail("default-1").await;
    fail("never-1").await;
    fail("stopped-1").await;
    // A stop on a failed instance moves it to stopped and clears the intent to run.
    api.post_empty("/v1/instances/stopped-1/stop?project=p")
        .await;
    let view = api.get("/v1/instances/default-1?project=p").await;
    assert_eq!(view.body["auto_restart_enabled"], json!(true));
    api.wait_state("p", "default-1", "running").await;
    assert!(
        api.get("/v1/instances/default-1?project=p").await.body["time_last_auto_restarted"]
            .is_string()
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(api.state("p", "never-1").await, "failed");
    assert_eq!(api.state("p", "stopped-1").await, "stopped");
    let never = api.get("/v1/instances/never-1?project=p").await;
    assert_eq!(never.body["auto_restart_enabled"], json!(false));
}

/// omicron: a create whose automatic start fails (no sled, no quota) still answers 201, with
/// the instance `stopped`; only an explicit start shows the 507.
#[tokio::test]
async fn a_create_on_a_full_rack_comes_back_stopped_and_only_a_start_says_why() {
    let api = Api::new();
    api.project("p").await;
    api.faults.update(|f| {
        f.no_capacity.push("full-".into());
        f.quota_exceeded.push("quota-".into());
    });
    let created = api.instance("p", "full-1", json!({})).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.str("run_state"), "stopped");
    let refused = api.post_empty("/v1/instances/full-1/start?project=p").await;
    assert_eq!(refused.status, StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(refused.code(), Some("InsufficientCapacity"));
    assert!(
        refused
            .str("message")
            .starts_with("Insufficient capacity: Failed to place instance"),
        "{:?}",
        refused.body
    );
    api.instance("p", "quota-1", json!({})).await;
    let quota = api
        .post_empty("/v1/instances/quota-1/start?project=p")
        .await;
    assert!(
        quota.str("message").contains("vCPU Limit Exceeded"),
        "{:?}",
        quota.body
    );
    assert_eq!(api.state("p", "full-1").await, "stopped");
    // Room again: the same instance starts.
    api.faults.update(|f| f.no_capacity.clear());
    let started = api.post_empty("/v1/instances/full-1/start?project=p").await;
    assert_eq!(started.status, StatusCode::ACCEPTED);
    api.wait_state("p", "full-1", "running").await;
}

#[tokio::test]
async fn garbage_requests_never_panic_and_always_get_error_bodies() {
    let api = Api::new();
    api.project("p").await;
    let paths = [
        "/v1/instances/%ff?project=p",
        "/v1/instances/x?project=%zz",
        "/v1/disks/a/bulk-write?project=p&project=q",
        "/v1/instances?project=p&limit=-1",
        "/v1/instances/00000000-0000-0000-0000-000000000000/serial-console?from_start=1e9",
        "/v1/images?page_token=%00",
        "//v1//projects",
        "/v1/anti-affinity-groups/g/members/instance/",
    ];
    let bodies: [&[u8]; 5] = [b"", b"null", b"[]", b"{\"name\":1}", &[0xff, 0xfe, 0x00]];
    let mut statuses = BTreeSet::new();
    for path in paths {
        for method in [Method::GET, Method::POST, Method::DELETE, Method::PUT] {
            for body in bodies {
                let req = Request::builder()
                    .method(method.clone())
                    .uri(path)
                    .header("authorization", format!("Bearer {TOKEN}"))
                    .body(Bytes::copy_from_slice(body))
                    .unwrap();
                let r = api.raw(req).await;
                assert!(r.status.is_client_error(), "{method} {path}: {}", r.status);
                assert!(r.body.get("request_id").is_some());
                statuses.insert(r.status.as_u16());
            }
        }
    }
    assert!(statuses.contains(&400) && statuses.contains(&404) && statuses.contains(&405));
}

#[tokio::test]
async fn an_exhausted_address_pool_is_507_insufficient_capacity() {
    let api = Api::new();
    api.project("p").await;
    let mut created = 0;
    loop {
        let r = api
            .post(
                "/v1/floating-ips?project=p",
                json!({"name": format!("f{created}"), "description": ""}),
            )
            .await;
        if r.status != StatusCode::CREATED {
            assert_error(
                &r,
                StatusCode::INSUFFICIENT_STORAGE,
                Some("InsufficientCapacity"),
            );
            break;
        }
        created += 1;
        assert!(created < 300, "the pool never ran out");
    }
    // 254 hosts in the /24, one of them the shared SNAT address.
    assert_eq!(created, 253);
    let r = api
        .instance("p", "vm", json!({"external_ips": [{"type": "ephemeral"}]}))
        .await;
    assert_error(
        &r,
        StatusCode::INSUFFICIENT_STORAGE,
        Some("InsufficientCapacity"),
    );
    assert_eq!(
        api.delete("/v1/floating-ips/f0?project=p").await.status,
        StatusCode::NO_CONTENT
    );
    let r = api
        .instance("p", "vm", json!({"external_ips": [{"type": "ephemeral"}]}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn a_faulted_disk_can_be_deleted_even_while_recorded_as_attached_elsewhere() {
    let api = Api::new();
    api.project("p").await;
    let r = api
        .instance(
            "p",
            "vm",
            json!({"disks": [{"type": "create", "name": "d", "description": "", "size": GIB,
                "disk_backend": {"type": "distributed", "disk_source": {"type": "blank", "block_size": 512}}}],
                "start": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let disk = api.get("/v1/disks/d?project=p").await;
    assert_eq!(
        api.delete("/v1/disks/d?project=p").await.status,
        StatusCode::BAD_REQUEST
    );
    api.sim.set_disk_faulted(disk.str("id").parse().unwrap());
    assert_eq!(
        api.get("/v1/disks/d?project=p").await.body["state"]["state"],
        "faulted"
    );
    assert_eq!(
        api.delete("/v1/disks/d?project=p").await.status,
        StatusCode::NO_CONTENT
    );
}

/// The project's default subnet is nexus's /22: 1,018 NICs (the first five addresses and the
/// broadcast address are reserved). A create whose NIC finds no address is nexus's 400
/// `InvalidRequest` naming the subnet; deleting an instance gives its address back.
#[tokio::test]
async fn a_full_subnet_refuses_the_nic_with_nexus_400_and_a_delete_frees_its_address() {
    let api = Api::new();
    api.project("p").await;
    let subnet = api
        .get("/v1/vpc-subnets/default?project=p&vpc=default")
        .await;
    assert_eq!(subnet.status, StatusCode::OK, "{}", subnet.body);
    assert_eq!(subnet.str("ipv4_block"), "172.30.0.0/22");
    let by_id = api
        .get(&format!("/v1/vpc-subnets/{}", subnet.str("id")))
        .await;
    assert_eq!(by_id.str("name"), "default");
    let r = api
        .get(&format!("/v1/vpc-subnets/{}?project=p", subnet.str("id")))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));

    let taken = api.sim.occupy_subnet("p", 5000);
    assert_eq!(
        taken.len(),
        1018,
        "all a /22 holds after nexus's reserved addresses"
    );
    api.sim.release_subnet("p", &taken[..1]);
    let r = api.instance("p", "vm0", json!({"start": false})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = api.instance("p", "vm1", json!({"start": false})).await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        r.message(),
        format!(
            "No available IPv4 addresses for interface in subnet 'default' with ID '{}'",
            subnet.str("id")
        )
    );
    assert_eq!(api.sim.subnet_free("p"), Some(0));
    assert_eq!(
        api.delete("/v1/instances/vm0?project=p").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(api.sim.subnet_free("p"), Some(1));
    let r = api.instance("p", "vm1", json!({"start": false})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

/// omicron rel/v22: a project goes only when empty of every child kind nexus checks (its
/// VPC included), a VPC only without subnets (its rules go with it), a subnet only without
/// NICs; a project without its VPC refuses a default-NIC instance.
#[tokio::test]
async fn projects_vpcs_and_subnets_are_deleted_bottom_up_with_nexus_refusals() {
    let api = Api::new();
    api.project("p").await;
    let refused = |r: &oxide_common::Resp, message: &str| {
        assert_error(r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
        assert_eq!(r.message(), message);
    };
    // Children, in nexus's order of checks.
    api.instance("p", "vm", json!({"start": false})).await;
    let r = api.delete("/v1/projects/p").await;
    refused(&r, "project to be deleted contains an instance: vm");
    let r = api
        .delete("/v1/vpc-subnets/default?project=p&vpc=default")
        .await;
    refused(
        &r,
        "VPC Subnet cannot be deleted while network interfaces in the subnet exist",
    );
    let r = api.delete("/v1/instances/vm?project=p").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let r = api.delete("/v1/projects/p").await;
    refused(&r, "project to be deleted contains a vpc: default");

    // Subnets: nexus's checks on create, and a second one keeps the VPC.
    for (block, message) in [
        (
            "8.8.8.0/24",
            "VPC Subnet IPv4 address ranges must be from a private range",
        ),
        (
            "10.0.0.0/28",
            "VPC Subnet IPv4 address ranges must have prefix length between 8 and 26, inclusive",
        ),
        (
            "172.30.1.0/24",
            "IP address range '172.30.1.0/24' conflicts with an existing subnet",
        ),
    ] {
        let r = api
            .post(
                "/v1/vpc-subnets?project=p&vpc=default",
                json!({"name": "lab", "description": "", "ipv4_block": block}),
            )
            .await;
        refused(&r, message);
    }
    let r = api
        .post(
            "/v1/vpc-subnets?project=p&vpc=default",
            json!({"name": "lab", "description": "", "ipv4_block": "10.1.0.0/24"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let names = |r: &oxide_common::Resp| -> Vec<String> {
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let list = api.get("/v1/vpc-subnets?project=p&vpc=default").await;
    assert_eq!(names(&list), ["default", "lab"]);
    let r = api
        .delete("/v1/vpc-subnets/default?project=p&vpc=default")
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let r = api.delete("/v1/vpcs/default?project=p").await;
    refused(&r, "VPC cannot be deleted while VPC Subnets exist");
    let rules = api
        .get("/v1/vpc-firewall-rules?project=p&vpc=default")
        .await;
    assert_eq!(rules.body["rules"].as_array().unwrap().len(), 3);
    let r = api
        .delete("/v1/vpc-subnets/lab?project=p&vpc=default")
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);

    // The VPC goes with its rules; the project lives on without them.
    let r = api.delete("/v1/vpcs/default?project=p").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert_eq!(
        names(&api.get("/v1/vpcs?project=p").await),
        Vec::<String>::new()
    );
    let r = api
        .get("/v1/vpc-firewall-rules?project=p&vpc=default")
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));
    let r = api.instance("p", "late", json!({"start": false})).await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));

    // Affinity groups hold the project too.
    let r = api
        .post(
            "/v1/affinity-groups?project=p",
            json!({"name": "pair", "description": "", "policy": "allow", "failure_domain": "sled"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        names(&api.get("/v1/affinity-groups?project=p").await),
        ["pair"]
    );
    let r = api.delete("/v1/projects/p").await;
    refused(&r, "project to be deleted contains an affinity group: pair");
    let r = api.delete("/v1/affinity-groups/pair?project=p").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let r = api.delete("/v1/projects/p").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let r = api.get("/v1/projects/p").await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));
}

/// Ports are `NonZeroU16` (a zero fails the body's parse), a reversed port range is
/// `l4_port_range` in nexus's words, a reversed ICMP code range is refused as `code`
/// (omicron `common/src/api/external/mod.rs` `L4PortRange`, `nexus/db-model/src/vpc_firewall_rule.rs`).
#[tokio::test]
async fn firewall_ports_and_icmp_codes_are_checked_as_nexus_checks_them() {
    let api = Api::new();
    api.project("p").await;
    let put = |filters: Value| {
        let api = &api;
        async move {
            let rules = json!({"rules": [{
                "name": "r", "description": "", "status": "enabled", "direction": "inbound",
                "action": "allow", "priority": 100,
                "targets": [{"type": "vpc", "value": "default"}], "filters": filters,
            }]});
            api.call(
                Method::PUT,
                "/v1/vpc-firewall-rules?project=p&vpc=default",
                Some(rules),
            )
            .await
        }
    };
    let r = put(json!({"ports": ["0"]})).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    assert!(
        r.message()
            .contains("\"0\" unparsable for type: number would be zero for non-zero type"),
        "{}",
        r.body
    );
    let r = put(json!({"ports": ["0-80"]})).await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    let r = put(json!({"ports": ["9-3"]})).await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidValue"));
    assert_eq!(
        r.message(),
        "unsupported value for \"l4_port_range\": range has larger start value than end value"
    );
    let r =
        put(json!({"protocols": [{"type": "icmp", "value": {"icmp_type": 3, "code": "10-5"}}]}))
            .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidValue"));
    assert_eq!(
        r.message(),
        "unsupported value for \"code\": range has larger start value than end value"
    );
    // Nothing of the refused lists was stored; good ranges still go through.
    let r = put(json!({"ports": ["1-65535"], "protocols": [{"type": "icmp", "value": {"icmp_type": 3, "code": "5-10"}}]}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// A rule naming another VPC is refused before anything is written (omicron
/// `nexus/src/app/vpc.rs` `vpc_update_firewall_rules` → `ensure_no_cross_vpc_references`;
/// nexus's `test_firewall_rules_cross_vpc_rejected_before_write`): only `vpc` targets and
/// `vpc` host filters are checked, targets first, rule by rule.
#[tokio::test]
async fn firewall_rules_naming_another_vpc_are_refused_before_the_write() {
    let api = Api::new();
    api.project("p").await;
    let url = "/v1/vpc-firewall-rules?project=p&vpc=default";
    let before = api.get(url).await;
    assert_eq!(before.status, StatusCode::OK, "{}", before.body);
    let rule = |name: &str, target: Value, hosts: Value| {
        json!({
            "name": name, "description": "", "status": "enabled", "direction": "inbound",
            "action": "allow", "priority": 100, "targets": [target],
            "filters": {"hosts": hosts},
        })
    };
    let vpc = |name: &str| json!({"type": "vpc", "value": name});
    let put = |rules: Vec<Value>| api.call(Method::PUT, url, Some(json!({ "rules": rules })));

    let r = put(vec![rule(
        "cross-vpc",
        vpc("default"),
        json!([vpc("some-other-vpc")]),
    )])
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(r.message(), "cross-VPC firewall host filter unsupported");
    // Targets are looked at before host filters, rule by rule.
    let r = put(vec![
        rule("ok", vpc("default"), json!([vpc("default")])),
        rule("both", vpc("other"), json!([vpc("other")])),
    ])
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(r.message(), "cross-VPC firewall target unsupported");
    let r = put(vec![
        rule("host", vpc("default"), json!([vpc("other")])),
        rule("target", vpc("other"), Value::Null),
    ])
    .await;
    assert_eq!(r.message(), "cross-VPC firewall host filter unsupported");
    // The rule checks of `vec_from_params` come first.
    let r = put(vec![
        rule("same", vpc("other"), Value::Null),
        rule("same", vpc("default"), Value::Null),
    ])
    .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidValue"));
    // Nothing was written.
    assert_eq!(api.get(url).await.body, before.body);

    // Subnet and instance names are not checked: they are looked up in this VPC.
    let subnet = json!({"type": "subnet", "value": "not-here"});
    let instance = json!({"type": "instance", "value": "nobody"});
    let r = put(vec![rule(
        "inside",
        subnet.clone(),
        json!([subnet, instance]),
    )])
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// `filters` is nexus's `VpcFirewallRuleFilter`, a serde struct without defaults whose fields
/// are hosts, protocols, ports (omicron `common/src/api/external/mod.rs`): as a JSON array it
/// needs all three, in that order. The SDK's type has defaults and another order.
#[tokio::test]
async fn firewall_filters_as_an_array_are_read_as_nexus_reads_them() {
    let api = Api::new();
    api.project("p").await;
    let put = |filters: &str| {
        let body = format!(
            r#"{{"rules":[{{"name":"r","description":"","status":"enabled","direction":"inbound","targets":[],"filters":{filters},"action":"allow","priority":1}}]}}"#
        );
        let req = Request::builder()
            .method(Method::PUT)
            .uri("/v1/vpc-firewall-rules?project=p&vpc=default")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Bytes::from(body.clone()))
            .unwrap();
        // serde_json reports the column of the array's closing bracket.
        let column = body.find(filters).unwrap() + filters.len();
        (api.raw(req), column)
    };
    let (r, column) = put("[null,null]");
    let r = r.await;
    assert_error(&r, StatusCode::BAD_REQUEST, None);
    assert_eq!(
        r.message(),
        format!(
            "unable to parse JSON body: rules[0].filters: invalid length 2, expected struct \
             VpcFirewallRuleFilter with 3 elements at line 1 column {column}"
        )
    );
    let (r, _) = put("[]");
    assert!(
        r.await
            .message()
            .contains("invalid length 0, expected struct VpcFirewallRuleFilter with 3 elements"),
    );
    // Three elements are hosts, protocols, ports.
    let (r, _) = put(r#"[null,[{"type":"tcp"}],["6443"]]"#);
    let r = r.await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.body["rules"][0]["filters"],
        json!({"protocols": [{"type": "tcp"}], "ports": ["6443"]})
    );
}

/// Local disks as nexus takes them (omicron `nexus/src/app/disk.rs`
/// `validate_disk_create_params`, `disk_manual_import_start`): 4096-byte blocks, up to 10 PiB,
/// no bulk import; a read-only disk from an image or snapshot is exactly its size.
#[tokio::test]
async fn local_disks_and_read_only_disks_follow_nexus() {
    let api = Api::new();
    api.project("p").await;
    let local = |name: &str, size: u64| json!({"name": name, "description": "", "size": size, "disk_backend": {"type": "local"}});
    let r = api
        .post("/v1/disks?project=p", local("big", 2048 * GIB))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["disk_type"], "local");
    assert_eq!(r.body["block_size"], json!(4096));
    let r = api
        .post("/v1/disks?project=p", local("huge", 11 * (1 << 50)))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidValue"));
    assert_eq!(
        r.message(),
        "unsupported value for \"size\": requested size over 10 PiB"
    );
    let r = api
        .post_empty("/v1/disks/big/bulk-write-start?project=p")
        .await;
    assert_error(&r, StatusCode::INTERNAL_SERVER_ERROR, Some("Internal"));

    api.sim.seed_silo_image("silo-img", "debian", "12", GIB);
    let image = api.get("/v1/images/silo-img").await;
    let from_image = |name: &str, size: u64, read_only: bool| {
        json!({"name": name, "description": "", "size": size, "disk_backend": {"type": "distributed",
            "disk_source": {"type": "image", "image_id": image.str("id"), "read_only": read_only}}})
    };
    let r = api
        .post("/v1/disks?project=p", from_image("ro", 2 * GIB, true))
        .await;
    assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
    assert_eq!(
        r.message(),
        format!(
            "read-only disk size {} must be equal to source image size {GIB}",
            2 * GIB
        )
    );
    let r = api
        .post("/v1/disks?project=p", from_image("ro", GIB, true))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = api
        .post("/v1/disks?project=p", from_image("rw", 2 * GIB, false))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

/// Selector refusals in each lookup's own words (omicron `nexus/src/app/{affinity,snapshot,
/// image,vpc_subnet}.rs`), and a subnet's `custom_router` looked up in its VPC
/// (`nexus/src/app/vpc_router.rs` `vpc_router_lookup_for_attach`).
#[tokio::test]
async fn selectors_and_custom_routers_are_refused_in_nexus_words() {
    let api = Api::new();
    api.project("p").await;
    let refused = |r: oxide_common::Resp, message: &str| {
        assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
        assert_eq!(r.message(), message);
    };
    refused(
        api.delete("/v1/affinity-groups/g").await,
        "affinity_group should either be UUID or project should be specified",
    );
    refused(
        api.delete("/v1/anti-affinity-groups/g").await,
        "anti_affinity_group should either be UUID or project should be specified",
    );
    refused(
        api.get("/v1/snapshots/s").await,
        "snapshot should either be an ID or project should be specified",
    );
    let id = Uuid::new_v4();
    refused(
        api.get(&format!("/v1/snapshots/{id}?project=p")).await,
        "when providing snapshot as an ID, project should not be specified",
    );
    refused(
        api.get(&format!("/v1/images/{id}?project=p")).await,
        "when providing image as an ID, project should not be specified",
    );
    refused(
        api.get("/v1/vpc-subnets/default?project=p").await,
        "subnet should either be an ID or vpc should be specified",
    );
    let subnet = |router: &str| json!({"name": "lab", "description": "", "ipv4_block": "10.1.0.0/24", "custom_router": router});
    let r = api
        .post("/v1/vpc-subnets?project=p&vpc=default", subnet("edge"))
        .await;
    assert_error(&r, StatusCode::NOT_FOUND, Some("ObjectNotFound"));
    assert_eq!(r.message(), "not found: vpc-router with name \"edge\"");
    refused(
        api.post("/v1/vpc-subnets?project=p&vpc=default", subnet("system"))
            .await,
        "cannot attach a system router to a VPC subnet",
    );
    let list = api.get("/v1/vpc-subnets?project=p&vpc=default").await;
    assert_eq!(
        list.body["items"].as_array().unwrap().len(),
        1,
        "{}",
        list.body
    );
}

/// `network_interfaces` honoured as the instance-create saga does (omicron
/// `nexus/src/app/sagas/instance_create.rs:243-258,746-757`): `none` makes no NIC, `create`
/// the named ones (explicit addresses checked by `check_requestable_addr`), the defaults one
/// `net0` "default primary interface for <instance>"; MACs in nexus's guest range.
#[tokio::test]
async fn network_interfaces_are_made_as_asked() {
    let api = Api::new();
    api.project("p").await;
    let nics = |name: &str| {
        let api = &api;
        let uri = format!("/v1/network-interfaces?project=p&instance={name}");
        async move {
            let r = api.get(&uri).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            r.body["items"].as_array().unwrap().clone()
        }
    };
    let r = api
        .instance(
            "p",
            "bare",
            json!({"network_interfaces": {"type": "none"}, "start": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(nics("bare").await, Vec::<Value>::new());

    // Without `network_interfaces` nexus's default is `default_dual_stack`.
    let r = api.instance("p", "plain", json!({"start": false})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let plain = nics("plain").await;
    assert_eq!(plain.len(), 1);
    assert_eq!(plain[0]["name"], "net0");
    assert_eq!(
        plain[0]["description"],
        "default primary interface for plain"
    );
    assert_eq!(plain[0]["primary"], true);
    assert_eq!(plain[0]["ip_stack"]["type"], "dual_stack", "{}", plain[0]);
    assert_eq!(
        plain[0]["ip_stack"]["value"]["v6"]["ip"],
        "fd00:1122:3344::5"
    );
    let mac: Vec<u8> = plain[0]["mac"]
        .as_str()
        .unwrap()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    assert_eq!(mac[..3], [0xa8, 0x40, 0x25], "{mac:?}");
    assert!(
        (0xf0..=0xfe).contains(&mac[3]),
        "{mac:?} outside the guest range"
    );

    let r = api
        .instance(
            "p",
            "four",
            json!({"network_interfaces": {"type": "default_ipv4"}, "start": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(nics("four").await[0]["ip_stack"]["type"], "v4");
    let r = api
        .instance(
            "p",
            "six",
            json!({"network_interfaces": {"type": "default_ipv6"}, "start": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let six = nics("six").await;
    assert_eq!(six[0]["ip_stack"]["type"], "v6", "{}", six[0]);
    assert_eq!(six[0]["ip_stack"]["value"]["ip"], "fd00:1122:3344::6");

    let nic = |name: &str, ip: &str| {
        json!({"name": name, "description": format!("{name} nic"), "vpc_name": "default",
            "subnet_name": "default", "ip_config": {"type": "v4", "value": {"ip": {"type": "explicit", "value": ip}}}})
    };
    let auto = json!({"name": "eth1", "description": "second", "vpc_name": "default",
        "subnet_name": "default", "ip_config": {"type": "v4", "value": {"ip": {"type": "auto"}}}});
    let refused = |ip: &'static str, message: &'static str| {
        let api = &api;
        let nic = nic("eth0", ip);
        async move {
            let r = api
                .instance(
                    "p",
                    "other",
                    json!({"network_interfaces": {"type": "create", "params": [nic]}}),
                )
                .await;
            assert_error(&r, StatusCode::BAD_REQUEST, Some("InvalidRequest"));
            assert_eq!(r.message(), message);
        }
    };
    refused("10.9.9.9", "10.9.9.9 is outside subnet 172.30.0.0/22").await;
    refused(
        "172.30.0.3",
        "The first 5 addresses of a subnet are reserved",
    )
    .await;
    refused("172.30.3.255", "Cannot request a broadcast address").await;
    let r = api
        .instance(
            "p",
            "vm",
            json!({"network_interfaces": {"type": "create", "params": [nic("eth0", "172.30.0.10"), auto]},
                "start": false}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let vm = nics("vm").await;
    let names: Vec<(&str, &str, bool)> = vm
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap(),
                n["description"].as_str().unwrap(),
                n["primary"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [("eth0", "eth0 nic", true), ("eth1", "second", false)]
    );
    // Addresses are reported in the subnet's range, 172.30.0.0/22 (audit sim-3 O2): the
    // explicit one as asked, the others the lowest free past the five reserved.
    let ip = |n: &Value| -> std::net::Ipv4Addr {
        n["ip_stack"]["value"]["ip"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let plain_ip: std::net::Ipv4Addr = plain[0]["ip_stack"]["value"]["v4"]["ip"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(plain_ip, std::net::Ipv4Addr::new(172, 30, 0, 5));
    assert_eq!(ip(&vm[0]), std::net::Ipv4Addr::new(172, 30, 0, 10));
    // eth1 took the next free address after `plain` (.5) and `four` (.6).
    assert_eq!(ip(&vm[1]), std::net::Ipv4Addr::new(172, 30, 0, 7));
    refused(
        "172.30.0.10",
        "The IP address '172.30.0.10' is not available",
    )
    .await;
}
