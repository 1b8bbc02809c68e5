//! The scale webhook as a function, without sockets: requests go straight into
//! `webhook::handle` over the in-memory fakes (`FakeWorld`), axum-`oneshot` style. Every route,
//! every error status, the auth rules and the write protocol under conflicts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use oxide_controller::base::retry::Backoff;
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::secrets::webhook::WebhookTokens;
use oxide_controller::domain::model::{Node, PodRef};
use oxide_controller::domain::spec::{ClusterSpec, PoolSpec};
use oxide_controller::fake::{FakeCluster, FakeState, FakeWorld};
use oxide_controller::ports::cluster::{
    Cluster, ClusterError, EventType, Eviction, JobTrigger, LeaseOutcome, ON_DEMAND_JOB,
};
use oxide_controller::ports::state::{ConfigSnapshot, StateError, StateStore, keys};
use oxide_controller::webhook::{self, Deps, MAX_BODY, RECONCILE_HEADER, WebhookConfig};
use oxide_controller::workflows::scale::ScaleOptions;
use serde_json::Value;

const TOKEN: &str = "hook-token-5f3a9c1e7b";

fn secrets() -> ClusterSecrets {
    ClusterSecrets {
        oxide_host: "https://rack.example".into(),
        oxide_token: "oxide-token".into(),
        oxide_project: "demo".into(),
        oxide_cluster: "demo".into(),
        k3s_token: "k3s".into(),
        k3s_agent_token: "agent".into(),
        ssh_public_key: "ssh-ed25519 AAAA".into(),
        user_ssh_public_key: None,
        tailscale_auth_key: None,
        oxide_token_id: None,
    }
}

/// Secret `oxide-controller-webhook-auth` with write token `token` and no read-only one.
fn tokens(token: &str) -> WebhookTokens {
    WebhookTokens {
        token: token.into(),
        read_token: None,
    }
}

/// Workers: count 2 in [0, 10]; a `gpu` pool: count 1 in [1, 4]; control plane 3 in [1, 7].
fn spec() -> ClusterSpec {
    let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 2);
    spec.worker_pools[0].max = 10;
    let gpu = PoolSpec {
        name: "gpu".into(),
        count: 1,
        min: 1,
        max: 4,
        ..spec.worker_pools[0].clone()
    };
    spec.worker_pools.push(gpu);
    spec
}

/// The state bootstrap leaves behind (written through the fake store, so resourceVersions
/// move the way they do on a real API server).
async fn world() -> FakeWorld {
    let w = FakeWorld::new(chrono::Utc::now());
    let config = BTreeMap::from([
        (keys::SPEC.to_owned(), spec().to_yaml()),
        (keys::SCHEMA_VERSION.to_owned(), "1".to_owned()),
    ]);
    w.state().ensure_state(&secrets(), config).await.unwrap();
    w.state()
        .ensure_webhook_tokens(&tokens(TOKEN))
        .await
        .unwrap();
    assert_eq!(rv(&w), "1");
    w
}

fn config() -> WebhookConfig {
    WebhookConfig {
        // Read the Secret on every request, so tests see changes to it at once.
        token_ttl: Duration::ZERO,
        tokens: oxide_controller::webhook::TokenSource::Secret,
        scale: ScaleOptions {
            backoff: Backoff {
                first: Duration::from_millis(1),
                max: Duration::from_millis(2),
                attempts: 20,
            },
            ..ScaleOptions::default()
        },
        // Read the ConfigMap on every scrape, so tests see each status written.
        status_ttl: Duration::ZERO,
        // Check readiness on every probe, so tests see each change.
        ready_ttl: Duration::ZERO,
    }
}

fn deps(w: &FakeWorld) -> Deps<FakeState, FakeCluster> {
    Deps::new(w.state(), w.cluster(), config())
}

fn request(method: Method, path: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
}

fn json_request(method: Method, path: &str, body: &str) -> Request<Bytes> {
    request(method, path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Bytes::from(body.to_owned()))
        .unwrap()
}

fn empty(method: Method, path: &str) -> Request<Bytes> {
    request(method, path).body(Bytes::new()).unwrap()
}

async fn send<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
    req: Request<Bytes>,
) -> Response<Bytes> {
    webhook::handle(deps, req).await
}

fn body(r: &Response<Bytes>) -> String {
    String::from_utf8(r.body().to_vec()).unwrap()
}

fn body_json(r: &Response<Bytes>) -> Value {
    serde_json::from_slice(r.body()).unwrap_or_else(|e| panic!("not JSON ({e}): {}", body(r)))
}

fn header_of(r: &Response<Bytes>, name: impl header::AsHeaderName) -> &str {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or("")
}

/// The count a run acts on: `spec.yaml` with the webhook's counts (ConfigMap
/// `oxide-controller-scale`, the only object the webhook writes: audit security-2 N4).
fn stored_count(w: &FakeWorld, pool: &str) -> u32 {
    let (config, scale) = w.with(|s| (s.config.clone(), s.scale.clone()));
    let base = ClusterSpec::from_yaml(config.spec_yaml().unwrap()).unwrap();
    oxide_controller::workflows::scale::effective(base, scale.as_ref(), &config)
        .spec
        .pool(pool)
        .unwrap()
        .1
        .count
}

/// "1" while neither object the webhook reads was written since bootstrap made them (the
/// ConfigMap at resourceVersion 1, the scale object at 2); something else after a write.
fn rv(w: &FakeWorld) -> String {
    w.with(|s| {
        let config: u64 = s.config.resource_version.parse().unwrap();
        let scale: u64 = s
            .scale
            .as_ref()
            .map_or(Ok(2), |c| c.resource_version.parse())
            .unwrap();
        (config + scale - 2).to_string()
    })
}

fn jobs(w: &FakeWorld) -> usize {
    w.with(|s| s.jobs.len())
}

// ---------------------------------------------------------------- health

#[tokio::test]
async fn healthz_is_200_without_a_token_even_when_nothing_is_readable() {
    let w = FakeWorld::new(chrono::Utc::now());
    let d = deps(&w);
    let r = send(&d, Request::get("/healthz").body(Bytes::new()).unwrap()).await;
    assert_eq!((r.status(), body(&r).as_str()), (StatusCode::OK, "ok\n"));
    let r = send(&d, Request::head("/healthz").body(Bytes::new()).unwrap()).await;
    assert_eq!((r.status(), r.body().len()), (StatusCode::OK, 0));
}

#[tokio::test]
async fn readyz_is_200_only_when_the_token_and_the_configmap_can_be_read() {
    let w = world().await;
    let d = deps(&w);
    let ready = || Request::get("/readyz").body(Bytes::new()).unwrap();
    assert_eq!(send(&d, ready()).await.status(), StatusCode::OK);

    w.with(|s| s.webhook_tokens = None);
    let r = send(&d, ready()).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(body(&r).contains("webhook token"), "{}", body(&r));

    w.with(|s| {
        s.webhook_tokens = Some(tokens(TOKEN));
        s.config = ConfigSnapshot::default();
    });
    let r = send(&d, ready()).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(body(&r).contains("ConfigMap"), "{}", body(&r));
}

// ---------------------------------------------------------------- reading

#[tokio::test]
async fn get_workers_is_the_bare_count_in_text_like_the_ancestor() {
    let w = world().await;
    let r = send(&deps(&w), empty(Method::GET, "/nodes/workers")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(body(&r), "2");
    assert!(header_of(&r, header::CONTENT_TYPE).starts_with("text/plain"));
}

#[tokio::test]
async fn get_workers_with_accept_json_gives_pool_count_and_bounds() {
    let w = world().await;
    let req = request(Method::GET, "/nodes/workers")
        .header(header::ACCEPT, "application/json")
        .body(Bytes::new())
        .unwrap();
    let r = send(&deps(&w), req).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header_of(&r, header::CONTENT_TYPE), "application/json");
    assert_eq!(
        body_json(&r),
        serde_json::json!({"pool": "workers", "count": 2, "min": 0, "max": 10})
    );
}

#[tokio::test]
async fn status_is_404_before_the_first_reconcile_and_then_the_stored_document() {
    let w = world().await;
    let d = deps(&w);
    let r = send(&d, empty(Method::GET, "/status")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(body_json(&r)["error"], "no_status");

    let doc = r#"{"runId":"r1","conditions":[]}"#;
    w.with(|s| {
        s.config
            .data
            .insert(keys::STATUS.to_owned(), doc.to_owned())
    });
    let r = send(&d, empty(Method::GET, "/status")).await;
    assert_eq!((r.status(), body(&r).as_str()), (StatusCode::OK, doc));
    assert_eq!(header_of(&r, header::CONTENT_TYPE), "application/json");

    // Once this webhook started a run, status says which and why.
    send(&d, empty(Method::POST, "/reconcile")).await;
    let r = send(&d, empty(Method::GET, "/status")).await;
    let v = body_json(&r);
    assert_eq!(v["runId"], "r1");
    assert_eq!(
        (
            &v["lastTrigger"]["reason"],
            &v["lastTrigger"]["detail"],
            &v["lastTrigger"]["outcome"]
        ),
        (
            &serde_json::json!("manual"),
            &serde_json::json!("POST /reconcile"),
            &serde_json::json!("triggered")
        ),
        "{v}"
    );
}

// ---------------------------------------------------------------- writing

#[tokio::test]
async fn put_sets_the_count_saves_it_and_triggers_a_reconcile() {
    let w = world().await;
    let r = send(
        &deps(&w),
        json_request(Method::PUT, "/nodes/workers", r#"{"count": 5}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    let b = body_json(&r);
    assert_eq!(
        (
            b["previous"].as_u64(),
            b["count"].as_u64(),
            b["changed"].as_bool()
        ),
        (Some(2), Some(5), Some(true))
    );
    assert_eq!(b["reconcile"], "triggered");
    assert_eq!(header_of(&r, RECONCILE_HEADER), "triggered");
    assert_eq!(stored_count(&w, "workers"), 5);
    assert_ne!(rv(&w), "1");
    assert!(w.with(|s| s.jobs.contains(ON_DEMAND_JOB)));
}

/// Audit security-2 N4: the webhook writes its counts into ConfigMap
/// `oxide-controller-scale` only, never `spec.yaml` (its account may not update the
/// ConfigMap); without that object (a cluster bootstrapped before it) a change is 503 saying
/// to re-run bootstrap, and nothing is written.
#[tokio::test]
async fn the_webhook_writes_only_the_scale_object_and_without_one_changes_nothing() {
    let w = world().await;
    let spec_before = w.with(|s| s.config.clone());
    let r = send(
        &deps(&w),
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta": 2}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    assert_eq!(
        w.with(|s| s.config.clone()),
        spec_before,
        "spec.yaml untouched"
    );
    assert_eq!(stored_count(&w, "workers"), 4);
    let scale = w.with(|s| s.scale.clone()).unwrap();
    let o = oxide_controller::domain::spec::scale::ScaleOverrides::from_json(
        &scale.data[oxide_controller::domain::spec::scale::KEY],
    )
    .unwrap();
    assert_eq!(o.pools["workers"].set.count, 4);
    assert_eq!(o.pools["workers"].over.count, 2);

    w.with(|s| s.scale = None);
    let before = rv(&w);
    let r = send(
        &deps(&w),
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta": 1}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{}", body(&r));
    assert!(body(&r).contains("re-runs bootstrap"), "{}", body(&r));
    assert_eq!(
        (rv(&w), w.with(|s| s.config.clone())),
        (before, spec_before)
    );
}

#[tokio::test]
async fn patch_adds_a_delta_to_the_stored_count_in_either_direction() {
    let w = world().await;
    let d = deps(&w);
    let r = send(
        &d,
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta": 3}"#),
    )
    .await;
    assert_eq!(
        (r.status(), body_json(&r)["count"].as_u64()),
        (StatusCode::OK, Some(5))
    );
    let r = send(
        &d,
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta": -4}"#),
    )
    .await;
    assert_eq!(
        (r.status(), body_json(&r)["count"].as_u64()),
        (StatusCode::OK, Some(1))
    );
    assert_eq!(stored_count(&w, "workers"), 1);
    // The second trigger found the first Job still there: one pending run, not two.
    assert_eq!(body_json(&r)["reconcile"], "pending");
    assert_eq!(jobs(&w), 1);
}

#[tokio::test]
async fn patch_accepts_merge_patch_json_too() {
    let w = world().await;
    let req = request(Method::PATCH, "/nodes/workers")
        .header(
            header::CONTENT_TYPE,
            "application/merge-patch+json; charset=utf-8",
        )
        .body(Bytes::from_static(br#"{"delta":1}"#))
        .unwrap();
    assert_eq!(send(&deps(&w), req).await.status(), StatusCode::OK);
    assert_eq!(stored_count(&w, "workers"), 3);
}

#[tokio::test]
async fn a_change_to_the_current_count_succeeds_without_writing_or_triggering() {
    let w = world().await;
    let r = send(
        &deps(&w),
        json_request(Method::PUT, "/nodes/workers", r#"{"count": 2}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let b = body_json(&r);
    assert_eq!(
        (b["changed"].as_bool(), b["reconcile"].as_str()),
        (Some(false), Some("not-needed"))
    );
    assert_eq!((rv(&w).as_str(), jobs(&w)), ("1", 0));
}

#[tokio::test]
async fn legacy_modify_sets_the_count_and_answers_like_the_ancestor() {
    let w = world().await;
    let d = deps(&w);
    // The ancestor's callers: no content type, its documented application/text, text/plain,
    // and what `curl -d` sends.
    let cases = [
        (None, "4", 2, 4),
        (Some("application/text"), "5", 4, 5),
        (Some("text/plain; charset=utf-8"), "6\n", 5, 6),
        (Some("application/x-www-form-urlencoded"), "7", 6, 7),
    ];
    for (ct, text, from, to) in cases {
        let mut b = request(Method::POST, "/nodes/workers/modify");
        if let Some(ct) = ct {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        let r = send(&d, b.body(Bytes::from(text)).unwrap()).await;
        assert_eq!(r.status(), webhook::LEGACY_SUCCESS, "{ct:?}: {}", body(&r));
        assert_eq!(
            r.status(),
            StatusCode::CREATED,
            "the ancestor answered 201 Created"
        );
        assert_eq!(
            body(&r),
            format!("Worker count changed from {from} to {to}")
        );
        assert!(header_of(&r, header::CONTENT_TYPE).starts_with("text/plain"));
        assert_eq!(stored_count(&w, "workers"), to);
    }
    assert_eq!(
        jobs(&w),
        1,
        "a burst of changes collapses into one pending Job"
    );
}

#[tokio::test]
async fn legacy_modify_errors_are_short_text_not_json() {
    let w = world().await;
    let d = deps(&w);
    let r = send(
        &d,
        request(Method::POST, "/nodes/workers/modify")
            .body(Bytes::from("three"))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        body(&r),
        "malformed request: expected the new worker count as a whole number, e.g. 3\n"
    );
    let r = send(
        &d,
        request(Method::POST, "/nodes/workers/modify")
            .body(Bytes::from("11"))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body(&r).contains("[0, 10]"), "{}", body(&r));
    let r = send(
        &d,
        request(Method::POST, "/nodes/workers/modify")
            .body(Bytes::new())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(stored_count(&w, "workers"), 2);
}

#[tokio::test]
async fn named_pools_have_the_same_routes() {
    let w = world().await;
    let d = deps(&w);
    let r = send(&d, empty(Method::GET, "/pools/gpu")).await;
    assert_eq!(body(&r), "1");
    let r = send(
        &d,
        json_request(Method::PUT, "/pools/gpu", r#"{"count":3}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    let r = send(
        &d,
        json_request(Method::PATCH, "/pools/gpu", r#"{"delta":1}"#),
    )
    .await;
    assert_eq!(body_json(&r)["count"], 4);
    let r = send(
        &d,
        request(Method::POST, "/pools/gpu/modify")
            .body(Bytes::from("2"))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status(), body(&r).as_str()),
        (StatusCode::CREATED, "Worker count changed from 4 to 2")
    );
    assert_eq!(
        (stored_count(&w, "gpu"), stored_count(&w, "workers")),
        (2, 2)
    );

    // The control plane can be read here, not changed (see
    // the_control_plane_is_not_changeable_through_the_webhook).
    let r = send(&d, empty(Method::GET, "/pools/control-plane")).await;
    assert_eq!((r.status(), body(&r).as_str()), (StatusCode::OK, "3"));
}

// ---------------------------------------------------------------- what a change may do

/// Audit M1: the webhook's token could shrink the control plane to 1 (HA gone on the next
/// run). Every write route on it is refused, whatever the count, and nothing is written.
#[tokio::test]
async fn the_control_plane_is_not_changeable_through_the_webhook() {
    let w = world().await;
    let d = deps(&w);
    for req in [
        json_request(Method::PUT, "/pools/control-plane", r#"{"count":1}"#),
        json_request(Method::PUT, "/pools/control-plane", r#"{"count":3}"#),
        json_request(Method::PATCH, "/pools/control-plane", r#"{"delta":2}"#),
        json_request(Method::PATCH, "/pools/control-plane", r#"{"delta":-2}"#),
    ] {
        let r = send(&d, req).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{}", body(&r));
        assert_eq!(body_json(&r)["error"], "control_plane");
        assert!(
            body_json(&r)["message"]
                .as_str()
                .unwrap()
                .contains("cannot be changed through the webhook"),
            "{}",
            body(&r)
        );
    }
    let r = send(
        &d,
        request(Method::POST, "/pools/control-plane/modify")
            .body(Bytes::from("1"))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "{}", body(&r));
    assert!(body(&r).contains("cannot be changed through the webhook"));
    assert_eq!(stored_count(&w, "control-plane"), 3);
    assert_eq!(rv(&w), "1", "nothing written");
    assert_eq!(jobs(&w), 0, "no reconcile started");
}

/// Stores `spec` as the ConfigMap's spec.yaml (as an administrator would), and `status`.
fn store_spec(w: &FakeWorld, spec: &ClusterSpec, status: Option<&str>) {
    w.with(|s| {
        s.config.data.insert(keys::SPEC.to_owned(), spec.to_yaml());
        if let Some(st) = status {
            s.config.data.insert(keys::STATUS.to_owned(), st.to_owned());
        }
    });
}

fn autoscale_put(body: &str) -> Request<Bytes> {
    json_request(Method::PUT, "/pools/workers/autoscale", body)
}

/// Issue 33 item 1: a spec whose versions the gate refuses (a worker pool newer than the
/// control plane, written by an administrator) takes no count or bounds change through the
/// webhook: 409 naming the field, nothing written, no run started; fixed, it takes them.
#[tokio::test]
async fn a_spec_the_version_gate_refuses_takes_no_change_through_the_webhook() {
    let w = world().await;
    let d = deps(&w);
    let mut bad = spec();
    bad.worker_pools[0].k3s_version = Some("v1.35.0+k3s1".into());
    // A v1.35 spec names its installer (issue 34 §7), so the gate is what refuses it.
    bad.k3s.installer_url =
        Some("https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh".into());
    bad.k3s.installer_sha256 = Some("ab".repeat(32));
    store_spec(&w, &bad, None);
    let before = rv(&w);
    for req in [
        json_request(Method::PUT, "/nodes/workers", r#"{"count":3}"#),
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
        autoscale_put(r#"{"max":8}"#),
    ] {
        let r = send(&d, req).await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "{}", body(&r));
        assert_eq!(body_json(&r)["error"], "version_refused", "{}", body(&r));
        assert!(
            body(&r).contains("worker_pools.workers.k3s_version"),
            "{}",
            body(&r)
        );
    }
    assert_eq!(rv(&w), before, "nothing written");
    assert_eq!(jobs(&w), 0, "no run started");
    store_spec(&w, &spec(), None);
    let r = send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":3}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
}

/// Audit M1: `max` could be set to any u32. Without `webhook.ceiling` the webhook lowers
/// bounds and moves counts within them, never raises a `max`; with it, neither a `max` nor a
/// count goes above the ceiling. Refusals are 422 naming the ceiling, and write nothing.
#[tokio::test]
async fn a_max_or_count_above_the_administrators_ceiling_is_refused_and_nothing_written() {
    let w = world().await;
    let d = deps(&w);
    // No ceiling: the pool's max (10) is the ceiling.
    let r = send(&d, autoscale_put(r#"{"max":11}"#)).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{}", body(&r));
    assert_eq!(
        (&body_json(&r)["error"], &body_json(&r)["ceiling"]),
        (&Value::from("above_ceiling"), &Value::from(10))
    );
    assert_eq!(rv(&w), "1", "nothing written");
    let r = send(&d, autoscale_put(r#"{"max":8}"#)).await;
    assert_eq!(r.status(), StatusCode::OK, "lowering is fine: {}", body(&r));
    let r = send(&d, autoscale_put(r#"{"max":10}"#)).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{}", body(&r));

    // The administrator sets a ceiling of 12 and a max of 20 (above it) in spec.yaml.
    let mut spec = spec();
    spec.webhook = Some(oxide_controller::domain::spec::WebhookSpec { ceiling: 12 });
    spec.worker_pools[0].max = 20;
    store_spec(&w, &spec, None);
    let r = send(&d, autoscale_put(r#"{"max":30}"#)).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{}", body(&r));
    assert!(
        body_json(&r)["message"]
            .as_str()
            .unwrap()
            .contains("above the administrator's ceiling of 12"),
        "{}",
        body(&r)
    );
    let before = rv(&w);
    for req in [
        json_request(Method::PUT, "/nodes/workers", r#"{"count":13}"#),
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta":11}"#),
        request(Method::POST, "/nodes/workers/modify")
            .body(Bytes::from("20"))
            .unwrap(),
    ] {
        let r = send(&d, req).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{}", body(&r));
    }
    assert_eq!((rv(&w), stored_count(&w, "workers")), (before, 2));
    let r = send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":12}"#),
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "up to the ceiling: {}",
        body(&r)
    );
    // Lowering the max from above the ceiling is fine, raising it back is not.
    let r = send(&d, autoscale_put(r#"{"max":15}"#)).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    let r = send(&d, autoscale_put(r#"{"max":16}"#)).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{}", body(&r));
    assert_eq!(stored_count(&w, "workers"), 12);
}

/// Audit M1: `max` 4294967295 was written, and every later reconcile run exited 2. The
/// webhook now checks the subnet as the runs do: against the prefix the last run recorded in
/// status.json, else nexus's default /22 (1,018 addresses).
#[tokio::test]
async fn a_max_beyond_the_projects_subnet_is_refused_before_it_is_written() {
    let w = world().await;
    let d = deps(&w);
    let mut spec = spec();
    spec.webhook = Some(oxide_controller::domain::spec::WebhookSpec { ceiling: u32::MAX });
    store_spec(&w, &spec, None);
    let before = rv(&w);
    // Servers 3+1, gpu 4+1: a /22 has room for 1,009 more workers with their surge member.
    for max in ["4294967295", "1013", "1009"] {
        let r = send(&d, autoscale_put(&format!(r#"{{"max":{max}}}"#))).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{}", body(&r));
        assert_eq!(body_json(&r)["error"], "subnet_too_small");
        assert_eq!(body_json(&r)["field"], "worker_pools.workers.max");
    }
    assert_eq!(rv(&w), before, "nothing written");
    let r = send(&d, autoscale_put(r#"{"max":1008}"#)).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    // A run recorded a /21 for the project: twice the room.
    let status = r#"{"runId":"r","startedAt":"2026-01-01T00:00:00Z","finishedAt":"2026-01-01T00:00:00Z","conditions":[],"pools":[],"lastPlan":[],"subnetPrefix":21}"#;
    store_spec(&w, &spec, Some(status));
    let r = send(&d, autoscale_put(r#"{"max":2000}"#)).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    let r = send(&d, autoscale_put(r#"{"max":2100}"#)).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{}", body(&r));
}

#[tokio::test]
async fn unknown_pools_are_404_naming_the_known_ones() {
    let w = world().await;
    let d = deps(&w);
    for req in [
        empty(Method::GET, "/pools/tpu"),
        json_request(Method::PUT, "/pools/tpu", r#"{"count":1}"#),
        request(Method::POST, "/pools/tpu/modify")
            .body(Bytes::from("1"))
            .unwrap(),
    ] {
        let r = send(&d, req).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(
            body(&r)
                .contains(r#"pool \"tpu\" does not exist; pools are: control-plane, workers, gpu"#)
                || body(&r).contains(
                    r#"pool "tpu" does not exist; pools are: control-plane, workers, gpu"#
                ),
            "{}",
            body(&r)
        );
    }
    assert_eq!(rv(&w), "1");
}

// ---------------------------------------------------------------- validation

#[tokio::test]
async fn counts_outside_the_pool_bounds_are_422_naming_the_bounds() {
    let w = world().await;
    let d = deps(&w);
    for req in [
        json_request(Method::PUT, "/nodes/workers", r#"{"count": 11}"#),
        json_request(Method::PUT, "/nodes/workers", r#"{"count": -1}"#),
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta": -3}"#),
        json_request(
            Method::PATCH,
            "/nodes/workers",
            r#"{"delta": 9223372036854775807}"#,
        ),
        json_request(Method::PUT, "/pools/gpu", r#"{"count": 0}"#),
    ] {
        let path = req.uri().path().to_owned();
        let r = send(&d, req).await;
        assert_eq!(
            r.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path}: {}",
            body(&r)
        );
        let b = body_json(&r);
        assert_eq!(b["error"], "out_of_bounds");
        let bounds = if path == "/pools/gpu" {
            "[1, 4]"
        } else {
            "[0, 10]"
        };
        assert!(b["message"].as_str().unwrap().contains(bounds), "{b}");
    }
    assert_eq!(
        (rv(&w).as_str(), jobs(&w)),
        ("1", 0),
        "nothing written, nothing triggered"
    );
}

#[tokio::test]
async fn bodies_over_one_kib_are_413() {
    let w = world().await;
    let d = deps(&w);
    let padded = format!(r#"{{"count": 3{}}}"#, " ".repeat(MAX_BODY));
    let r = send(&d, json_request(Method::PUT, "/nodes/workers", &padded)).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        body_json(&r)["message"]
            .as_str()
            .unwrap()
            .contains("1024 bytes")
    );
    // A declared length over the limit is enough (the host does not read such bodies).
    let req = request(Method::POST, "/nodes/workers/modify")
        .header(header::CONTENT_LENGTH, "1000000")
        .body(Bytes::new())
        .unwrap();
    assert_eq!(send(&d, req).await.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Exactly the limit is fine.
    let exact = format!(r#"{{"count":3}}{}"#, " ".repeat(MAX_BODY - 11));
    assert_eq!(exact.len(), MAX_BODY);
    assert_eq!(
        send(&d, json_request(Method::PUT, "/nodes/workers", &exact))
            .await
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn wrong_content_types_are_415_saying_what_is_expected() {
    let w = world().await;
    let d = deps(&w);
    let with_type = |m: Method, path: &str, ct: Option<&str>, body: &'static str| {
        let mut b = request(m, path);
        if let Some(ct) = ct {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        b.body(Bytes::from_static(body.as_bytes())).unwrap()
    };
    for (req, expected) in [
        (
            with_type(
                Method::PUT,
                "/nodes/workers",
                Some("text/plain"),
                r#"{"count":3}"#,
            ),
            "application/json",
        ),
        (
            with_type(Method::PUT, "/nodes/workers", None, r#"{"count":3}"#),
            "application/json",
        ),
        (
            with_type(
                Method::PATCH,
                "/pools/gpu",
                Some("application/x-www-form-urlencoded"),
                r#"{"delta":1}"#,
            ),
            "application/json",
        ),
        (
            with_type(
                Method::POST,
                "/nodes/workers/modify",
                Some("application/json"),
                "3",
            ),
            "text/plain",
        ),
    ] {
        let r = send(&d, req).await;
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(body(&r).contains(expected), "{}", body(&r));
    }
    assert_eq!(rv(&w), "1");
}

#[tokio::test]
async fn wrong_methods_are_405_with_allow() {
    let w = world().await;
    let d = deps(&w);
    for (method, path, allow) in [
        (Method::DELETE, "/nodes/workers", "GET, PUT, PATCH"),
        (Method::POST, "/nodes/workers", "GET, PUT, PATCH"),
        (Method::GET, "/nodes/workers/modify", "POST"),
        (Method::PUT, "/pools/gpu/modify", "POST"),
        (Method::DELETE, "/pools/gpu", "GET, PUT, PATCH"),
        (Method::GET, "/reconcile", "POST"),
        (Method::POST, "/status", "GET"),
        (Method::POST, "/metrics", "GET"),
        (Method::POST, "/healthz", "GET, HEAD"),
        (Method::DELETE, "/readyz", "GET, HEAD"),
    ] {
        let r = send(&d, empty(method.clone(), path)).await;
        assert_eq!(
            r.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(header_of(&r, header::ALLOW), allow, "{method} {path}");
    }
}

#[tokio::test]
async fn malformed_numbers_are_400_saying_what_was_expected() {
    let w = world().await;
    let d = deps(&w);
    for (method, body_text, expected) in [
        (Method::PUT, r#"{"count": "3"}"#, r#"{"count": N}"#),
        (Method::PUT, r#"{"count": 1.5}"#, r#"{"count": N}"#),
        (Method::PUT, r#"{"cnt": 3}"#, r#"{"count": N}"#),
        (
            Method::PUT,
            r#"{"count": 3, "extra": 1}"#,
            r#"{"count": N}"#,
        ),
        (Method::PUT, "3", r#"{"count": N}"#),
        (Method::PUT, "", r#"{"count": N}"#),
        (Method::PATCH, r#"{"delta": "+1"}"#, r#"{"delta": N}"#),
        (
            Method::PATCH,
            r#"{"delta": 99999999999999999999999}"#,
            r#"{"delta": N}"#,
        ),
        (Method::PATCH, "not json", r#"{"delta": N}"#),
    ] {
        let r = send(
            &d,
            json_request(method.clone(), "/nodes/workers", body_text),
        )
        .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{method} {body_text}");
        let b = body_json(&r);
        assert!(b["message"].as_str().unwrap().contains(expected), "{b}");
    }
    assert_eq!(rv(&w), "1");
}

#[tokio::test]
async fn unknown_paths_are_404_for_authenticated_callers_and_401_for_others() {
    let w = world().await;
    let d = deps(&w);
    assert_eq!(
        send(&d, empty(Method::GET, "/nodes")).await.status(),
        StatusCode::NOT_FOUND
    );
    let anon = Request::get("/nodes").body(Bytes::new()).unwrap();
    assert_eq!(send(&d, anon).await.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn query_strings_without_credentials_are_400_after_authentication() {
    let w = world().await;
    let r = send(&deps(&w), empty(Method::GET, "/nodes/workers?pool=gpu")).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_unusable_stored_spec_is_500_without_details_and_a_missing_configmap_503() {
    let w = world().await;
    let d = deps(&w);
    w.with(|s| {
        s.config
            .data
            .insert(keys::SPEC.to_owned(), "cluster: [unclosed".to_owned())
    });
    for req in [
        empty(Method::GET, "/nodes/workers"),
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
    ] {
        let r = send(&d, req).await;
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let b = body_json(&r);
        assert_eq!(b["error"], "spec_invalid");
        assert!(!b["message"].as_str().unwrap().contains("unclosed"), "{b}");
    }
    w.with(|s| s.config = ConfigSnapshot::default());
    let r = send(&d, empty(Method::GET, "/nodes/workers")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body_json(&r)["error"], "state_missing");
}

// ---------------------------------------------------------------- authentication

/// Every protected request: those that would change something, and the reads that want a
/// token (`/metrics` does not: `metrics_need_no_token_and_carry_the_cluster_status_but_no_secret`).
fn writes(auth: Option<&str>, query: &str) -> Vec<Request<Bytes>> {
    let build = |m: Method, path: &str, ct: &str, body: &'static str| {
        let mut b = Request::builder()
            .method(m)
            .uri(format!("{path}{query}"))
            .header(header::CONTENT_TYPE, ct);
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(Bytes::from_static(body.as_bytes())).unwrap()
    };
    vec![
        build(
            Method::PUT,
            "/nodes/workers",
            "application/json",
            r#"{"count":5}"#,
        ),
        build(
            Method::PATCH,
            "/nodes/workers",
            "application/json",
            r#"{"delta":1}"#,
        ),
        build(Method::POST, "/nodes/workers/modify", "text/plain", "5"),
        build(
            Method::PUT,
            "/pools/gpu",
            "application/json",
            r#"{"count":2}"#,
        ),
        build(
            Method::PATCH,
            "/pools/gpu",
            "application/json",
            r#"{"delta":1}"#,
        ),
        build(Method::POST, "/pools/gpu/modify", "text/plain", "2"),
        build(Method::POST, "/reconcile", "text/plain", ""),
        build(Method::GET, "/nodes/workers", "text/plain", ""),
        build(Method::GET, "/status", "text/plain", ""),
    ]
}

#[tokio::test]
async fn missing_empty_wrong_or_malformed_tokens_are_401_and_change_nothing() {
    let w = world().await;
    let d = deps(&w);
    let wrong = format!("Bearer {TOKEN}x");
    let prefix = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let cases: [(Option<&str>, &str); 7] = [
        (None, "missing"),
        (Some(""), "empty header"),
        (Some("Bearer "), "empty token"),
        (Some(&wrong), "wrong token"),
        (Some(&prefix), "a prefix of the token"),
        (Some(TOKEN), "no scheme"),
        (Some("Basic aG9vazp0b2tlbg=="), "basic auth"),
    ];
    for (auth, what) in cases {
        for req in writes(auth, "") {
            let target = format!("{} {}", req.method(), req.uri());
            let r = send(&d, req).await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{what}: {target}");
            assert!(
                header_of(&r, header::WWW_AUTHENTICATE).starts_with("Bearer"),
                "{what}: {target}"
            );
            assert!(!body(&r).contains(TOKEN), "a 401 never echoes the token");
        }
    }
    assert_eq!((rv(&w).as_str(), jobs(&w)), ("1", 0));
}

#[tokio::test]
async fn a_token_in_the_query_string_is_401_even_with_a_valid_header() {
    let w = world().await;
    let d = deps(&w);
    let header_value = format!("Bearer {TOKEN}");
    for (auth, query) in [
        (None, format!("?token={TOKEN}")),
        (None, format!("?access_token={TOKEN}")),
        (
            Some(header_value.as_str()),
            format!("?access_token={TOKEN}"),
        ),
    ] {
        for req in writes(auth, &query) {
            let target = req.uri().path().to_owned();
            let r = send(&d, req).await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{target}{query}");
            assert!(header_of(&r, header::WWW_AUTHENTICATE).starts_with("Bearer"));
            assert!(!body(&r).contains(TOKEN));
        }
    }
    assert_eq!((rv(&w).as_str(), jobs(&w)), ("1", 0));
}

#[tokio::test]
async fn an_unreadable_secret_fails_closed_with_503() {
    let w = world().await;
    w.with(|s| s.webhook_tokens_forbidden = true);
    let d = deps(&w);
    for req in writes(Some(&format!("Bearer {TOKEN}")), "") {
        let r = send(&d, req).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body(&r).contains("cannot verify credentials"),
            "{}",
            body(&r)
        );
        assert!(r.headers().contains_key(header::RETRY_AFTER));
    }
    assert_eq!((rv(&w).as_str(), jobs(&w)), ("1", 0));
}

#[tokio::test]
async fn an_empty_webhook_token_in_the_secret_accepts_nobody() {
    let w = world().await;
    w.with(|s| s.webhook_tokens = Some(tokens("")));
    let d = deps(&w);
    let req = Request::put("/nodes/workers")
        .header(header::AUTHORIZATION, "Bearer ")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Bytes::from_static(br#"{"count":5}"#))
        .unwrap();
    assert_eq!(send(&d, req).await.status(), StatusCode::UNAUTHORIZED);
    let r = send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":5}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    // No Secret oxide-controller-webhook-auth at all (a cluster not bootstrapped by this
    // release): the same.
    w.with(|s| s.webhook_tokens = None);
    let r = send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":5}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(body(&r).contains("not configured"), "{}", body(&r));
    assert_eq!(rv(&w), "1");
}

#[tokio::test]
async fn the_token_is_cached_for_its_ttl_and_rotation_applies_after_it() {
    let w = world().await;
    let cached = Deps::new(
        w.state(),
        w.cluster(),
        WebhookConfig {
            token_ttl: Duration::from_secs(3600),
            tokens: oxide_controller::webhook::TokenSource::Secret,
            ..config()
        },
    );
    let uncached = deps(&w);
    assert_eq!(
        send(&cached, empty(Method::GET, "/nodes/workers"))
            .await
            .status(),
        StatusCode::OK
    );
    w.with(|s| s.webhook_tokens = Some(tokens("rotated-token")));
    assert_eq!(
        send(&cached, empty(Method::GET, "/nodes/workers"))
            .await
            .status(),
        StatusCode::OK,
        "cached"
    );
    assert_eq!(
        send(&uncached, empty(Method::GET, "/nodes/workers"))
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn tokens_from_mounted_keys_need_no_secret_read_and_a_rotation_applies_without_restart() {
    // In the cluster the webhook's account may not read the Secret: its pod mounts the two
    // token keys, which the kubelet replaces when the Secret changes.
    let w = world().await;
    // The Secret through the API is out of reach (as for the webhook's account).
    w.with(|s| s.secrets = None);
    let dir = tempfile::tempdir().unwrap();
    let deps = Deps::new(
        w.state(),
        w.cluster(),
        WebhookConfig {
            token_ttl: Duration::ZERO,
            tokens: oxide_controller::webhook::TokenSource::Files(dir.path().to_path_buf()),
            ..config()
        },
    );
    let get = |token: &str| {
        Request::get("/nodes/workers")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Bytes::new())
            .unwrap()
    };
    let ready = || Request::get("/readyz").body(Bytes::new()).unwrap();
    // Nothing mounted yet (an older cluster's Secret lacks the keys): closed, not ready.
    assert_eq!(
        send(&deps, get(TOKEN)).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        send(&deps, ready()).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );

    std::fs::write(dir.path().join("webhook-token"), TOKEN).unwrap();
    assert_eq!(send(&deps, get(TOKEN)).await.status(), StatusCode::OK);
    assert_eq!(send(&deps, ready()).await.status(), StatusCode::OK);
    assert_eq!(
        send(&deps, get(READ_TOKEN)).await.status(),
        StatusCode::UNAUTHORIZED
    );
    std::fs::write(dir.path().join("webhook-read-token"), READ_TOKEN).unwrap();
    assert_eq!(send(&deps, get(READ_TOKEN)).await.status(), StatusCode::OK);
    let put = |token: &str| {
        Request::put("/nodes/workers")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Bytes::from_static(br#"{"count":4}"#))
            .unwrap()
    };
    assert_eq!(
        send(&deps, put(READ_TOKEN)).await.status(),
        StatusCode::FORBIDDEN
    );

    // Rotation: the kubelet swaps the file; the old token stops working, the new one works.
    std::fs::write(dir.path().join("webhook-token"), "rotated-token").unwrap();
    assert_eq!(
        send(&deps, get(TOKEN)).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&deps, put("rotated-token")).await.status(),
        StatusCode::OK
    );
    assert_eq!(stored_count(&w, "workers"), 4);
    // An empty write token (a key cleared) closes it again.
    std::fs::write(dir.path().join("webhook-token"), "").unwrap();
    assert_eq!(
        send(&deps, get("rotated-token")).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

const READ_TOKEN: &str = "read-token-0c1d2e3f";

fn with_read_token(write: &str, read: &str) -> WebhookTokens {
    WebhookTokens {
        read_token: Some(read.into()),
        ..tokens(write)
    }
}

fn as_reader(mut req: Request<Bytes>, token: &str) -> Request<Bytes> {
    req.headers_mut().insert(
        header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    req
}

/// Audit M1: a Prometheus scraper held a write token. The Secret's `webhook-read-token` reads
/// (GETs) and is 403 on every write; the write token still does both. (`/metrics` needs no
/// token at all now: `metrics_need_no_token_and_carry_the_cluster_status_but_no_secret`.)
#[tokio::test]
async fn the_read_only_token_reads_and_gets_403_on_writes() {
    let w = world().await;
    w.with(|s| s.webhook_tokens = Some(with_read_token(TOKEN, READ_TOKEN)));
    let d = deps(&w);
    for path in [
        "/nodes/workers",
        "/pools/gpu",
        "/pools/workers/autoscale",
        "/metrics",
    ] {
        let r = send(&d, as_reader(empty(Method::GET, path), READ_TOKEN)).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}: {}", body(&r));
    }
    let writes = [
        json_request(Method::PUT, "/nodes/workers", r#"{"count":3}"#),
        json_request(Method::PATCH, "/pools/gpu", r#"{"delta":1}"#),
        json_request(Method::PUT, "/pools/workers/autoscale", r#"{"min":1}"#),
        request(Method::POST, "/nodes/workers/modify")
            .body(Bytes::from("3"))
            .unwrap(),
        empty(Method::POST, "/reconcile"),
    ];
    for req in writes {
        let what = format!("{} {}", req.method(), req.uri());
        let r = send(&d, as_reader(req, READ_TOKEN)).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{what}: {}", body(&r));
        assert!(body(&r).contains("may only read"), "{what}: {}", body(&r));
    }
    assert_eq!(
        (rv(&w), jobs(&w)),
        ("1".to_owned(), 0),
        "nothing written or started"
    );
    let r = send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":3}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "the write token writes");
    let r = send(&d, as_reader(empty(Method::GET, "/status"), "guess")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

/// Rotation (README, "Security"): replace `webhook-read-token` (or `webhook-token`) in the
/// Secret; the old value stops working once the token cache (5 s by default) expires.
#[tokio::test]
async fn a_rotated_read_token_replaces_the_old_one_after_the_cache() {
    let w = world().await;
    w.with(|s| s.webhook_tokens = Some(with_read_token(TOKEN, READ_TOKEN)));
    let d = deps(&w);
    let get = |t: &str| as_reader(empty(Method::GET, "/nodes/workers"), t);
    assert_eq!(send(&d, get(READ_TOKEN)).await.status(), StatusCode::OK);
    w.with(|s| s.webhook_tokens = Some(with_read_token(TOKEN, "read-token-rotated")));
    assert_eq!(
        send(&d, get(READ_TOKEN)).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&d, get("read-token-rotated")).await.status(),
        StatusCode::OK
    );
    // Without the key, only the write token is accepted (clusters bootstrapped before it).
    w.with(|s| s.webhook_tokens = Some(tokens(TOKEN)));
    assert_eq!(
        send(&d, get("read-token-rotated")).await.status(),
        StatusCode::UNAUTHORIZED
    );
}

// ---------------------------------------------------------------- reconcile

#[tokio::test]
async fn post_reconcile_creates_the_job_then_reports_it_pending() {
    let w = world().await;
    let d = deps(&w);
    let r = send(&d, empty(Method::POST, "/reconcile")).await;
    assert_eq!(
        (r.status(), body_json(&r)["reconcile"].as_str()),
        (StatusCode::ACCEPTED, Some("triggered"))
    );
    let r = send(&d, empty(Method::POST, "/reconcile")).await;
    assert_eq!(
        (r.status(), body_json(&r)["reconcile"].as_str()),
        (StatusCode::ACCEPTED, Some("pending"))
    );
    assert_eq!(jobs(&w), 1);
    assert_eq!(rv(&w), "1", "triggering changes no state");
}

#[tokio::test]
async fn without_a_cronjob_the_change_is_saved_and_the_response_says_no_reconcile_ran() {
    let w = world().await;
    w.with(|s| s.cronjob = false);
    let d = deps(&w);
    let r = send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":4}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let b = body_json(&r);
    assert_eq!(b["reconcile"], "not-triggered");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("no reconcile was triggered"),
        "{b}"
    );
    assert_eq!(stored_count(&w, "workers"), 4);

    let r = send(
        &d,
        request(Method::POST, "/nodes/workers/modify")
            .body(Bytes::from("5"))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status(), header_of(&r, RECONCILE_HEADER)),
        (StatusCode::CREATED, "not-triggered")
    );

    let r = send(&d, empty(Method::POST, "/reconcile")).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(body_json(&r)["error"], "no_cronjob");
}

#[tokio::test]
async fn a_failing_job_api_still_saves_the_change_and_post_reconcile_is_503() {
    let w = world().await;
    let d = Deps::new(w.state(), BrokenJobs(w.cluster()), config());
    let r = send(
        &d,
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(body_json(&r)["reconcile"], "failed");
    assert_eq!(stored_count(&w, "workers"), 3);
    let r = send(&d, empty(Method::POST, "/reconcile")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        !body(&r).contains("forbidden"),
        "the cause stays in the log: {}",
        body(&r)
    );
}

// ---------------------------------------------------------------- conflicts

#[tokio::test]
async fn a_409_is_answered_by_re_reading_and_re_applying_the_delta() {
    let w = world().await;
    // Another writer adds one worker just before each of our first three writes.
    let state = Racing::new(&w, 3, true);
    let d = Deps::new(state, w.cluster(), config());
    let r = send(
        &d,
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    let b = body_json(&r);
    assert_eq!(
        (b["previous"].as_u64(), b["count"].as_u64()),
        (Some(5), Some(6))
    );
    assert_eq!(
        stored_count(&w, "workers"),
        6,
        "2 + 3 by the other writer + 1 by us: nothing lost"
    );
    assert!(
        d.metrics
            .render()
            .contains("oxide_controller_webhook_state_conflicts_total 3")
    );
}

#[tokio::test]
async fn conflicts_that_never_end_give_up_with_503_and_retry_after() {
    let w = world().await;
    let state = Racing::new(&w, u32::MAX, false);
    let d = Deps::new(state, w.cluster(), config());
    let r = send(
        &d,
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body_json(&r)["error"], "busy");
    assert_eq!(header_of(&r, header::RETRY_AFTER), "1");
    assert_eq!(jobs(&w), 0);
}

#[tokio::test]
async fn concurrent_patches_on_one_process_are_all_applied() {
    let w = world().await;
    // Every write races with nobody, but every read yields, so requests interleave.
    let state = Racing::new(&w, 0, false);
    let mut spec = spec();
    spec.worker_pools[0].max = 1000;
    w.with(|s| s.config.data.insert(keys::SPEC.to_owned(), spec.to_yaml()));
    let d = Arc::new(Deps::new(state, w.cluster(), config()));
    let calls = (0..300).map(|_| {
        let d = d.clone();
        tokio::spawn(async move {
            send(
                &d,
                json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
            )
            .await
            .status()
        })
    });
    let statuses = futures::future::join_all(calls).await;
    assert!(
        statuses
            .iter()
            .all(|s| *s.as_ref().unwrap() == StatusCode::OK)
    );
    assert_eq!(stored_count(&w, "workers"), 302);
}

/// Group commit: the changes queued behind a write go together in the next one. 300
/// concurrent PATCHes against a store whose writes take 20 ms cost a handful of writes, not
/// 300; each caller still gets its own exact answer (the `previous` counts are 2..=301, each
/// once), nothing is lost or counted twice, and one reconcile Job is started per write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_patches_is_written_in_a_few_writes_each_caller_with_its_own_answer() {
    let w = world().await;
    let mut spec = spec();
    spec.worker_pools[0].max = 1000;
    w.with(|s| s.config.data.insert(keys::SPEC.to_owned(), spec.to_yaml()));
    let state = Racing::slow(&w, Duration::from_millis(20));
    let writes = state.writes.clone();
    let d = Arc::new(Deps::new(state, w.cluster(), config()));
    let calls = (0..300).map(|_| {
        let d = d.clone();
        tokio::spawn(async move {
            let r = send(
                &d,
                json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
            )
            .await;
            (r.status(), body_json(&r))
        })
    });
    let answers: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        answers.iter().all(|(s, _)| *s == StatusCode::OK),
        "{answers:?}"
    );
    let mut previous: Vec<u64> = answers
        .iter()
        .map(|(_, b)| {
            assert_eq!(b["count"].as_u64(), b["previous"].as_u64().map(|p| p + 1));
            assert_eq!(b["changed"], true);
            b["previous"].as_u64().unwrap()
        })
        .collect();
    previous.sort_unstable();
    assert_eq!(previous, (2..=301).collect::<Vec<u64>>());
    assert_eq!(stored_count(&w, "workers"), 302);
    let writes = writes.load(Ordering::SeqCst);
    assert!(
        writes <= 10,
        "300 queued changes took {writes} ConfigMap writes"
    );
    assert!(d.metrics.render().contains(&format!(
        "oxide_controller_webhook_state_writes_total {writes}"
    )));
    assert_eq!(jobs(&w), 1, "one pending reconcile Job");
}

/// `method /nodes/workers` with a JSON `body`, sent from a task of its own.
fn spawn_send<S: StateStore + 'static, C: Cluster + 'static>(
    d: &Arc<Deps<S, C>>,
    method: Method,
    body: &'static str,
) -> tokio::task::JoinHandle<Response<Bytes>> {
    let d = d.clone();
    tokio::spawn(async move { send(&d, json_request(method, "/nodes/workers", body)).await })
}

/// In one batch, a refused change gets its own 4xx and leaves the spec to the changes queued
/// with it; a no-op change is answered `changed: false` and starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_change_in_a_batch_gets_its_own_error_and_the_others_are_written() {
    let w = world().await;
    let state = Racing::slow(&w, Duration::from_millis(200));
    let writes = state.writes.clone();
    let d = Arc::new(Deps::new(state, w.cluster(), config()));
    // The first change takes the writer slot; the four behind it queue for one batch.
    let first = spawn_send(&d, Method::PUT, r#"{"count":3}"#);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut queued = Vec::new();
    for body in [
        r#"{"delta":1}"#,
        r#"{"delta":100}"#,
        r#"{"delta":0}"#,
        r#"{"delta":1}"#,
    ] {
        queued.push(spawn_send(&d, Method::PATCH, body));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    let mut answers = Vec::new();
    for q in queued {
        let r = q.await.unwrap();
        answers.push((r.status(), body_json(&r)));
    }
    assert_eq!(answers[0].0, StatusCode::OK);
    assert_eq!(
        (
            answers[0].1["previous"].as_u64(),
            answers[0].1["count"].as_u64()
        ),
        (Some(3), Some(4))
    );
    assert!(answers[1].0.is_client_error(), "{answers:?}");
    assert_eq!(answers[2].0, StatusCode::OK);
    assert_eq!(answers[2].1["changed"], false);
    assert_eq!(answers[2].1["count"].as_u64(), Some(4));
    assert_eq!(answers[3].0, StatusCode::OK);
    assert_eq!(
        (
            answers[3].1["previous"].as_u64(),
            answers[3].1["count"].as_u64()
        ),
        (Some(4), Some(5))
    );
    assert_eq!(stored_count(&w, "workers"), 5);
    assert_eq!(
        writes.load(Ordering::SeqCst),
        2,
        "the first change's write, then one for the batch behind it"
    );
}

/// A caller that gave up (its request deadline passed) while its change was still queued is
/// never written: nothing is applied that its caller was told failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_caller_gave_up_while_queued_is_not_written() {
    let w = world().await;
    let state = Racing::slow(&w, Duration::from_millis(300));
    let d = Arc::new(Deps::new(state, w.cluster(), config()));
    let first = spawn_send(&d, Method::PATCH, r#"{"delta":1}"#);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let given_up = tokio::time::timeout(
        Duration::from_millis(100),
        send(
            &d,
            json_request(Method::PATCH, "/nodes/workers", r#"{"delta":5}"#),
        ),
    )
    .await;
    assert!(
        given_up.is_err(),
        "the second change waited behind the first"
    );
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    // A later change runs a batch of its own; the abandoned one is not in it.
    let r = send(
        &d,
        json_request(Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
    )
    .await;
    assert_eq!(body_json(&r)["previous"].as_u64(), Some(3));
    assert_eq!(stored_count(&w, "workers"), 4);
}

// ---------------------------------------------------------------- metrics

#[tokio::test]
async fn metrics_count_requests_latency_triggers_and_conflicts() {
    let w = world().await;
    let d = deps(&w);
    send(&d, empty(Method::GET, "/nodes/workers")).await;
    send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":3}"#),
    )
    .await;
    send(
        &d,
        json_request(Method::PUT, "/nodes/workers", r#"{"count":4}"#),
    )
    .await;
    send(
        &d,
        Request::get("/nodes/workers").body(Bytes::new()).unwrap(),
    )
    .await;
    send(&d, empty(Method::GET, "/pools/whatever")).await;
    let r = send(&d, empty(Method::GET, "/metrics")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header_of(&r, header::CONTENT_TYPE).starts_with("text/plain; version=0.0.4"));
    let text = body(&r);
    for line in [
        r#"oxide_controller_webhook_requests_total{route="/nodes/workers",method="GET",status="200"} 1"#,
        r#"oxide_controller_webhook_requests_total{route="/nodes/workers",method="GET",status="401"} 1"#,
        r#"oxide_controller_webhook_requests_total{route="/nodes/workers",method="PUT",status="200"} 2"#,
        r#"oxide_controller_webhook_requests_total{route="/pools/{pool}",method="GET",status="404"} 1"#,
        r#"oxide_controller_webhook_request_duration_seconds_count{route="/nodes/workers"} 4"#,
        r#"oxide_controller_webhook_request_duration_seconds_bucket{route="/nodes/workers",le="+Inf"} 4"#,
        r#"oxide_controller_webhook_reconcile_triggers_total{result="created"} 1"#,
        r#"oxide_controller_webhook_reconcile_triggers_total{result="pending"} 1"#,
        r#"oxide_controller_triggers_total{reason="scale_change"} 2"#,
        r#"oxide_controller_triggers_total{reason="pending_pods"} 0"#,
        "oxide_controller_webhook_pending_watch 0",
        "oxide_controller_webhook_state_conflicts_total 0",
        "# TYPE oxide_controller_webhook_request_duration_seconds histogram",
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    assert!(
        !text.contains("whatever"),
        "labels never carry request input"
    );
}

// ---------------------------------------------------------------- test doubles

/// A state store where another writer gets in before each of our next `races` writes: it
/// adds one worker, so our write meets a 409 and must re-read. Reads yield to the scheduler so
/// concurrent requests interleave.
struct Racing {
    inner: FakeState,
    world: FakeWorld,
    races: AtomicU32,
    /// Whether the other writer adds a worker (else it rewrites the same data: a pure 409).
    adds: bool,
    /// How long each of our writes takes.
    delay: Duration,
    /// Our writes so far.
    writes: Arc<AtomicU32>,
}

impl Racing {
    fn new(world: &FakeWorld, races: u32, adds: bool) -> Self {
        Racing {
            inner: world.state(),
            world: world.clone(),
            races: AtomicU32::new(races),
            adds,
            delay: Duration::ZERO,
            writes: Arc::new(AtomicU32::new(0)),
        }
    }

    /// No other writer; each of our writes takes `delay`.
    fn slow(world: &FakeWorld, delay: Duration) -> Self {
        Racing {
            delay,
            ..Racing::new(world, 0, false)
        }
    }
}

impl StateStore for Racing {
    async fn read_config(&self) -> Result<ConfigSnapshot, StateError> {
        tokio::task::yield_now().await;
        self.inner.read_config().await
    }

    async fn replace_config(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.inner.replace_config(rv, data).await
    }

    async fn read_scale(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        tokio::task::yield_now().await;
        self.inner.read_scale().await
    }

    /// The webhook's write: first, while races are left, another webhook process writes the
    /// scale object (adding one worker when `adds`), so this write meets a 409.
    async fn replace_scale(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        let race = self
            .races
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if race {
            let config = self.inner.read_config().await?;
            let scale = self.inner.read_scale().await?.unwrap();
            let base = ClusterSpec::from_yaml(config.spec_yaml().unwrap()).unwrap();
            let mut spec =
                oxide_controller::workflows::scale::effective(base.clone(), Some(&scale), &config)
                    .spec;
            if self.adds {
                spec.worker_pools[0].count += 1;
            }
            let o = oxide_controller::domain::spec::scale::ScaleOverrides::between(&base, &spec);
            let theirs = BTreeMap::from([(
                oxide_controller::domain::spec::scale::KEY.to_owned(),
                o.to_json(),
            )]);
            self.world
                .state()
                .replace_scale(&scale.resource_version, theirs)
                .await?;
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        tokio::task::yield_now().await;
        self.inner.replace_scale(rv, data).await
    }

    async fn read_secrets(&self) -> Result<ClusterSecrets, StateError> {
        self.inner.read_secrets().await
    }
    async fn read_webhook_tokens(&self) -> Result<Option<WebhookTokens>, StateError> {
        self.inner.read_webhook_tokens().await
    }

    async fn ensure_state(
        &self,
        s: &ClusterSecrets,
        c: BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        self.inner.ensure_state(s, c).await
    }

    async fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> Result<BTreeMap<String, Vec<String>>, StateError> {
        self.inner.merge_host_key_pins(pins).await
    }
}

/// The fake cluster, except that starting Jobs is forbidden.
struct BrokenJobs(FakeCluster);

impl Cluster for BrokenJobs {
    async fn list_nodes(&self) -> Result<Vec<Node>, ClusterError> {
        self.0.list_nodes().await
    }
    async fn cordon(&self, node: &str) -> Result<(), ClusterError> {
        self.0.cordon(node).await
    }
    async fn cancel_removal(&self, node: &str) -> Result<(), ClusterError> {
        self.0.cancel_removal(node).await
    }
    async fn mark_restarted(
        &self,
        node: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), ClusterError> {
        self.0.mark_restarted(node, at).await
    }
    async fn certificate_events(
        &self,
    ) -> Result<Vec<oxide_controller::domain::certificates::MonitorEvent>, ClusterError> {
        self.0.certificate_events().await
    }
    async fn mark_certificate_restart(
        &self,
        node: &str,
        value: &str,
        unschedulable: Option<bool>,
    ) -> Result<(), ClusterError> {
        self.0
            .mark_certificate_restart(node, value, unschedulable)
            .await
    }
    async fn delete_node(&self, node: &str) -> Result<(), ClusterError> {
        self.0.delete_node(node).await
    }
    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodRef>, ClusterError> {
        self.0.pods_on_node(node).await
    }
    async fn list_pods(&self) -> Result<Vec<oxide_controller::domain::model::Pod>, ClusterError> {
        self.0.list_pods().await
    }
    async fn list_pvs(
        &self,
    ) -> Result<Vec<oxide_controller::domain::model::PersistentVolume>, ClusterError> {
        self.0.list_pvs().await
    }
    async fn list_pdbs(
        &self,
    ) -> Result<Vec<oxide_controller::domain::model::DisruptionBudget>, ClusterError> {
        self.0.list_pdbs().await
    }
    async fn evict(&self, pod: &PodRef) -> Result<Eviction, ClusterError> {
        self.0.evict(pod).await
    }
    async fn delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        self.0.delete_pod(pod).await
    }
    async fn acquire_lease(&self, holder: &str, d: Duration) -> Result<LeaseOutcome, ClusterError> {
        self.0.acquire_lease(holder, d).await
    }
    async fn renew_lease(&self, holder: &str, d: Duration) -> Result<(), ClusterError> {
        self.0.renew_lease(holder, d).await
    }
    async fn release_lease(&self, holder: &str) -> Result<(), ClusterError> {
        self.0.release_lease(holder).await
    }
    async fn lease_holder(&self) -> Result<Option<String>, ClusterError> {
        self.0.lease_holder().await
    }
    async fn record_event(
        &self,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        self.0.record_event(kind, reason, message).await
    }
    async fn trigger_reconcile_job(&self) -> Result<JobTrigger, ClusterError> {
        Err(ClusterError::Forbidden {
            what: "create jobs".into(),
            message: "jobs.batch is forbidden".into(),
        })
    }
    async fn etcd_members(
        &self,
        server_token: &str,
    ) -> Result<Vec<oxide_controller::domain::model::EtcdMember>, ClusterError> {
        self.0.etcd_members(server_token).await
    }
}

/// A `status.json` as a reconcile run writes it: Degraded for a stale backup, an upgrade in
/// its control-plane phase, and messages that must not reach `/metrics`.
fn degraded_status() -> String {
    serde_json::json!({
        "runId": "run-7",
        "startedAt": "2027-01-15T08:00:00Z",
        "finishedAt": "2027-01-15T08:00:42Z",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Converged", "message": "workers 2/2 ready", "lastTransitionTime": "2027-01-15T07:00:00Z"},
            {"type": "Degraded", "status": "True", "reason": "BackupStale", "message": "the newest backup (snap-secretive-name) is 3h old", "lastTransitionTime": "2027-01-15T07:30:00Z"}
        ],
        "pools": [{"pool": "workers", "desired": 2, "ready": 2, "joining": 0, "notReady": 0, "broken": 0, "removing": 0, "drifted": 0}],
        "lastPlan": [],
        "lastConvergedAt": "2027-01-15T08:00:42Z",
        "upgrade": {"from": "v1.33.4+k3s1", "to": "v1.34.1+k3s1", "phase": "control-plane", "startedAt": "2027-01-15T06:00:00Z"},
        "backup": {"schedule": "0 * * * *", "lastSuccess": {"name": "snap-secretive-name", "time": "2027-01-15T05:00:00Z", "k3sSnapshot": "etcd-snapshot-demo-cp-a-1800000000", "bytes": 1048576, "by": "schedule"}, "watchingSince": "2027-01-01T00:00:00Z", "stale": true}
    })
    .to_string()
}

/// Issue 46 item 5: `/metrics` answers a scraper without a token (as `/healthz` does), with
/// the cluster's status from `status.json` under its `cluster` label, and nothing of the
/// Secret, of a condition's message or of a backup's name. Anything but GET is 405.
#[tokio::test]
async fn metrics_need_no_token_and_carry_the_cluster_status_but_no_secret() {
    let w = world().await;
    w.with(|s| s.webhook_tokens = Some(with_read_token(TOKEN, READ_TOKEN)));
    w.with(|s| {
        s.config
            .data
            .insert(keys::STATUS.to_owned(), degraded_status())
    });
    let d = deps(&w);
    let r = send(&d, Request::get("/metrics").body(Bytes::new()).unwrap()).await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body(&r));
    assert!(header_of(&r, header::CONTENT_TYPE).starts_with("text/plain; version=0.0.4"));
    let text = body(&r);
    for line in [
        r#"oxide_controller_status_up{cluster="demo"} 1"#,
        r#"oxide_controller_reconcile_interval_seconds{cluster="demo"} 300"#,
        r#"oxide_controller_reconcile_last_finished_timestamp_seconds{cluster="demo"} 1800000042"#,
        r#"oxide_controller_condition{cluster="demo",condition="Ready",reason="Converged"} 1"#,
        r#"oxide_controller_condition{cluster="demo",condition="Degraded",reason="BackupStale"} 1"#,
        r#"oxide_controller_pool_members{cluster="demo",pool="workers",state="ready"} 2"#,
        r#"oxide_controller_backup_stale{cluster="demo"} 1"#,
        r#"oxide_controller_backup_last_success_timestamp_seconds{cluster="demo"} 1799989200"#,
        r#"oxide_controller_upgrade_phase{cluster="demo",phase="control-plane"} 1"#,
        // The webhook's own counters are still there (this request is counted after it).
        "# TYPE oxide_controller_webhook_requests_total counter",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    // (The fixture's k3s tokens, "k3s" and "agent", are words a version or a help text holds.)
    let secrets = secrets();
    for secret in [
        TOKEN,
        READ_TOKEN,
        &secrets.oxide_token,
        &secrets.ssh_public_key,
        "snap-secretive-name",
        "3h old",
    ] {
        assert!(!text.contains(secret), "{secret:?} in /metrics:\n{text}");
    }
    // A wrong token does not turn the public route into a 401, and no write method exists.
    let r = send(&d, as_reader(empty(Method::GET, "/metrics"), "guess")).await;
    assert_eq!(r.status(), StatusCode::OK);
    for m in [Method::POST, Method::PUT, Method::DELETE, Method::HEAD] {
        let r = send(
            &d,
            Request::builder()
                .method(m.clone())
                .uri("/metrics")
                .body(Bytes::new())
                .unwrap(),
        )
        .await;
        assert_eq!(
            (r.status(), header_of(&r, header::ALLOW)),
            (StatusCode::METHOD_NOT_ALLOWED, "GET"),
            "{m}"
        );
    }
    // Everything else still wants the token.
    let r = send(&d, Request::get("/status").body(Bytes::new()).unwrap()).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

/// The state store with reads that count and, when asked, fail.
struct CountingState {
    inner: FakeState,
    reads: AtomicU32,
    failing: std::sync::atomic::AtomicBool,
}

impl StateStore for CountingState {
    async fn read_config(&self) -> Result<ConfigSnapshot, StateError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        // Long enough for concurrent scrapes to arrive while one read is under way.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if self.failing.load(Ordering::SeqCst) {
            return Err(StateError::Forbidden {
                what: "get configmaps".into(),
                message: "denied".into(),
            });
        }
        self.inner.read_config().await
    }
    async fn replace_config(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.inner.replace_config(rv, data).await
    }
    async fn read_scale(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        self.inner.read_scale().await
    }
    async fn replace_scale(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.inner.replace_scale(rv, data).await
    }
    async fn read_secrets(&self) -> Result<ClusterSecrets, StateError> {
        self.inner.read_secrets().await
    }
    async fn read_webhook_tokens(&self) -> Result<Option<WebhookTokens>, StateError> {
        self.inner.read_webhook_tokens().await
    }
    async fn ensure_state(
        &self,
        s: &ClusterSecrets,
        c: BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        self.inner.ensure_state(s, c).await
    }
    async fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> Result<BTreeMap<String, Vec<String>>, StateError> {
        self.inner.merge_host_key_pins(pins).await
    }
}

/// Issue 46 item 5: a scrape storm does not become apiserver reads. 50 concurrent scrapes
/// and 50 more within the cache's life cost one ConfigMap read; after the cache expires the
/// next scrape reads again. A ConfigMap that cannot be read is `status_up 0` under the
/// cluster name last seen, cached the same way.
#[tokio::test]
async fn a_scrape_storm_reads_the_configmap_once_per_cache_period() {
    let w = world().await;
    w.with(|s| {
        s.config
            .data
            .insert(keys::STATUS.to_owned(), degraded_status())
    });
    let state = CountingState {
        inner: w.state(),
        reads: AtomicU32::new(0),
        failing: false.into(),
    };
    let d = Arc::new(Deps::new(
        state,
        w.cluster(),
        WebhookConfig {
            status_ttl: Duration::from_millis(500),
            ..config()
        },
    ));
    let scrape = |d: Arc<Deps<CountingState, FakeCluster>>| async move {
        let r = send(&d, Request::get("/metrics").body(Bytes::new()).unwrap()).await;
        assert_eq!(r.status(), StatusCode::OK);
        body(&r)
    };
    let storm: Vec<_> = (0..50).map(|_| tokio::spawn(scrape(d.clone()))).collect();
    for s in storm {
        assert!(
            s.await
                .unwrap()
                .contains(r#"oxide_controller_status_up{cluster="demo"} 1"#)
        );
    }
    for _ in 0..50 {
        scrape(d.clone()).await;
    }
    assert_eq!(
        d.state.reads.load(Ordering::SeqCst),
        1,
        "one read for 100 scrapes"
    );

    tokio::time::sleep(Duration::from_millis(600)).await;
    d.state.failing.store(true, Ordering::SeqCst);
    let text = scrape(d.clone()).await;
    assert_eq!(
        d.state.reads.load(Ordering::SeqCst),
        2,
        "read again after the cache"
    );
    assert!(
        text.contains(r#"oxide_controller_status_up{cluster="demo"} 0"#)
            && !text.contains("oxide_controller_condition{"),
        "{text}"
    );
    scrape(d.clone()).await;
    assert_eq!(d.cluster_metrics.reads(), 2, "the failure is cached too");
}

/// Audit L2: a `/readyz` storm does not become apiserver reads. `/readyz` is
/// unauthenticated; 50 concurrent probes and 50 more within the cache's life cost one
/// ConfigMap read; after it expires the next probe checks again, and a failed check (503)
/// is cached the same way.
#[tokio::test]
async fn a_readyz_storm_reads_the_configmap_once_per_cache_period() {
    let w = world().await;
    let state = CountingState {
        inner: w.state(),
        reads: AtomicU32::new(0),
        failing: false.into(),
    };
    let d = Arc::new(Deps::new(
        state,
        w.cluster(),
        WebhookConfig {
            ready_ttl: Duration::from_millis(500),
            ..config()
        },
    ));
    let probe = |d: Arc<Deps<CountingState, FakeCluster>>| async move {
        send(&d, Request::get("/readyz").body(Bytes::new()).unwrap())
            .await
            .status()
    };
    let storm: Vec<_> = (0..50).map(|_| tokio::spawn(probe(d.clone()))).collect();
    for p in storm {
        assert_eq!(p.await.unwrap(), StatusCode::OK);
    }
    for _ in 0..50 {
        assert_eq!(probe(d.clone()).await, StatusCode::OK);
    }
    assert_eq!(
        d.state.reads.load(Ordering::SeqCst),
        1,
        "one read for 100 probes"
    );

    tokio::time::sleep(Duration::from_millis(600)).await;
    d.state.failing.store(true, Ordering::SeqCst);
    assert_eq!(probe(d.clone()).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(probe(d.clone()).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        d.state.reads.load(Ordering::SeqCst),
        2,
        "read again after the cache, and the failure is cached too"
    );
}
