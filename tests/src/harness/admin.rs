//! The admin API (HTTP JSON on its own loopback port, no auth): request counters, a state dump
//! for leak checks, runtime faults, and forcing an instance into `failed`. Tests and
//! benchmarks use it; the product never does.
//!
//! Routes:
//! - `GET /counters` → `{"oxide": {route: n}, "kube": {route: n}, "tailscale": {route: n},
//!   "bulk_write": {"writes", "max_decoded_bytes", "over_limit", "bytes"}}`
//! - `POST /counters/reset` → 204
//! - `GET /state` → `{"oxide": <OxideSim::dump>, "kube": {"nodes": [...], "pods": [...]}, "cluster": <Boot::cluster_info>,
//!   "tailscale": <Tailnet::dump>}`
//! - `GET /faults` → FaultSpec; `PUT /faults` (FaultSpec JSON) → the new FaultSpec
//! - `POST /instances/{name}/fail[?project=P]` → 204, or 404 / 409 (ambiguous name)

use bytes::Bytes;
use serde_json::{Value, json};

use crate::guest::Boot;
use crate::oxide::{FaultSpec, Faults, OxideSim};

/// What the admin routes act on.
#[derive(Clone)]
pub struct AdminState {
    /// The Oxide side.
    pub oxide: OxideSim,
    /// The guests.
    pub boot: Boot,
    /// Runtime faults.
    pub faults: Faults,
    /// The simulated tailnet.
    pub tailnet: crate::tailscale::Tailnet,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState").finish_non_exhaustive()
    }
}

fn respond(status: http::StatusCode, body: Option<Value>) -> http::Response<Bytes> {
    let mut response = match body {
        Some(body) => {
            let mut r = http::Response::new(Bytes::from(body.to_string()));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        None => http::Response::new(Bytes::new()),
    };
    *response.status_mut() = status;
    response
}

fn error(status: http::StatusCode, message: impl Into<String>) -> http::Response<Bytes> {
    respond(status, Some(json!({ "message": message.into() })))
}

/// Handles one admin request.
pub async fn handle(state: &AdminState, req: http::Request<Bytes>) -> http::Response<Bytes> {
    use http::{Method, StatusCode};
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["counters"]) => {
            let oxide: serde_json::Map<String, Value> = state
                .oxide
                .counters()
                .into_iter()
                .map(|(k, v)| (k, json!(v)))
                .collect();
            let kube: serde_json::Map<String, Value> = state
                .boot
                .kube_view()
                .counters()
                .into_iter()
                .map(|(k, v)| (k, json!(v)))
                .collect();
            respond(
                StatusCode::OK,
                Some(json!({
                    "oxide": oxide,
                    "kube": kube,
                    "tailscale": state.tailnet.counters(),
                    "bulk_write": state.oxide.bulk_write_stats(),
                })),
            )
        }
        (&Method::POST, ["counters", "reset"]) => {
            state.oxide.reset_counters();
            state.boot.kube_view().reset_counters();
            state.tailnet.reset_counters();
            respond(StatusCode::NO_CONTENT, None)
        }
        (&Method::GET, ["state"]) => respond(
            StatusCode::OK,
            Some(json!({
                "oxide": state.oxide.dump(),
                "kube": kube_summary(&state.boot.kube_view()).await,
                "cluster": state.boot.cluster_info(),
                "tailscale": state.tailnet.dump(),
            })),
        ),
        (&Method::GET, ["faults"]) => respond(StatusCode::OK, Some(json!(state.faults.get()))),
        (&Method::PUT, ["faults"]) => match serde_json::from_slice::<FaultSpec>(req.body()) {
            Ok(spec) => {
                tracing::info!(?spec, "faults replaced");
                state.faults.set(spec);
                respond(StatusCode::OK, Some(json!(state.faults.get())))
            }
            Err(err) => error(StatusCode::BAD_REQUEST, format!("invalid FaultSpec: {err}")),
        },
        (&Method::POST, ["instances", name, "fail"]) => {
            let project = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("project="))
                .map(str::to_string);
            fail_instance(state, name, project.as_deref())
        }
        (
            _,
            ["counters"]
            | ["counters", "reset"]
            | ["state"]
            | ["faults"]
            | ["instances", _, "fail"],
        ) => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        _ => error(StatusCode::NOT_FOUND, format!("no admin route {path}")),
    }
}

fn fail_instance(state: &AdminState, name: &str, project: Option<&str>) -> http::Response<Bytes> {
    use http::StatusCode;
    let dump = state.oxide.dump();
    let matches: Vec<&Value> = dump["instances"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter(|i| i["name"].as_str() == Some(name))
                .filter(|i| project.is_none_or(|p| i["project"].as_str() == Some(p)))
                .collect()
        })
        .unwrap_or_default();
    match matches.as_slice() {
        [] => error(StatusCode::NOT_FOUND, format!("no instance named {name}")),
        [one] => match one["id"]
            .as_str()
            .and_then(|id| id.parse::<uuid::Uuid>().ok())
        {
            Some(id) => {
                tracing::info!(instance = %name, "forcing instance to failed");
                state.oxide.set_instance_failed(id);
                respond(StatusCode::NO_CONTENT, None)
            }
            None => error(StatusCode::INTERNAL_SERVER_ERROR, "instance dump has no id"),
        },
        _ => error(
            StatusCode::CONFLICT,
            format!("{name} exists in several projects; add ?project=NAME"),
        ),
    }
}

/// The first cluster's Nodes (name, Ready) and pods (namespace/name, node, phase).
async fn kube_summary(kube: &crate::guest::cluster_api::KubeView) -> Value {
    let nodes: Vec<Value> = kube
        .list("v1", "Node", None)
        .await
        .iter()
        .map(|n| {
            let ready = n["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"].clone())
                .unwrap_or(Value::Null);
            json!({"name": n["metadata"]["name"], "ready": ready})
        })
        .collect();
    let pods: Vec<Value> = kube
        .list("v1", "Pod", None)
        .await
        .iter()
        .map(|p| {
            json!({"pod": format!("{}/{}", p["metadata"]["namespace"].as_str().unwrap_or(""),
                p["metadata"]["name"].as_str().unwrap_or("")),
                "node": p["spec"]["nodeName"], "phase": p["status"]["phase"]})
        })
        .collect();
    json!({"nodes": nodes, "pods": pods})
}
