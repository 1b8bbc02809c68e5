//! Manual and automatic scaling together on the webhook: a count change on a pool whose
//! autoscaler is enabled is a 409 pointing to the bounds endpoint, and
//! `GET`/`PUT /pools/{pool}/autoscale` read and change the bounds with the same auth, body
//! rules, resourceVersion-safe writes and reconcile trigger as the count routes. Requests go
//! straight into `webhook::handle` over the in-memory fakes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use oxide_controller::base::retry::Backoff;
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::secrets::webhook::WebhookTokens;
use oxide_controller::domain::autoscale::AutoscaleSpec;
use oxide_controller::domain::spec::{ClusterSpec, PoolSpec};
use oxide_controller::fake::{FakeCluster, FakeState, FakeWorld};
use oxide_controller::ports::state::{ConfigSnapshot, StateError, StateStore, keys};
use oxide_controller::webhook::{self, Deps, RECONCILE_HEADER, WebhookConfig};
use oxide_controller::workflows::scale::ScaleOptions;
use serde_json::{Value, json};

const TOKEN: &str = "hook-token-autoscale-77";

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

/// `workers` autoscales, count 2 in [1, 6], in anti-affinity group `spread`; `gpu` is manual,
/// count 1 in [1, 4]. The administrator lets the webhook raise bounds up to 50.
fn spec() -> ClusterSpec {
    let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 2);
    spec.webhook = Some(oxide_controller::domain::spec::WebhookSpec { ceiling: 50 });
    let w = &mut spec.worker_pools[0];
    (w.min, w.max) = (1, 6);
    w.anti_affinity_group = Some("spread".into());
    w.autoscale = Some(AutoscaleSpec::default());
    let gpu = PoolSpec {
        name: "gpu".into(),
        count: 1,
        min: 1,
        max: 4,
        autoscale: None,
        anti_affinity_group: None,
        ..spec.worker_pools[0].clone()
    };
    spec.worker_pools.push(gpu);
    spec
}

async fn world() -> FakeWorld {
    let w = FakeWorld::new(chrono::Utc::now());
    let config = BTreeMap::from([(keys::SPEC.to_owned(), spec().to_yaml())]);
    w.state().ensure_state(&secrets(), config).await.unwrap();
    w.state()
        .ensure_webhook_tokens(&WebhookTokens {
            token: TOKEN.into(),
            read_token: None,
        })
        .await
        .unwrap();
    w
}

fn config() -> WebhookConfig {
    WebhookConfig {
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
        status_ttl: Duration::ZERO,
        ready_ttl: Duration::ZERO,
    }
}

fn deps(w: &FakeWorld) -> Deps<FakeState, FakeCluster> {
    Deps::new(w.state(), w.cluster(), config())
}

fn req(method: Method, path: &str, body: &str) -> Request<Bytes> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Bytes::from(body.to_owned()))
        .unwrap()
}

fn body_json(r: &Response<Bytes>) -> Value {
    serde_json::from_slice(r.body()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}",
            String::from_utf8_lossy(r.body().as_ref())
        )
    })
}

/// The spec a run acts on: `spec.yaml` with the webhook's counts (ConfigMap
/// `oxide-controller-scale`, the only object the webhook writes).
fn stored(w: &FakeWorld) -> ClusterSpec {
    let (config, scale) = w.with(|s| (s.config.clone(), s.scale.clone()));
    let base = ClusterSpec::from_yaml(config.spec_yaml().unwrap()).unwrap();
    oxide_controller::workflows::scale::effective(base, scale.as_ref(), &config).spec
}

/// The versions of both objects the webhook reads: unchanged means nothing was written.
fn rv(w: &FakeWorld) -> String {
    w.with(|s| {
        let scale = s.scale.as_ref().map(|c| c.resource_version.clone());
        format!("{}/{scale:?}", s.config.resource_version)
    })
}

fn jobs(w: &FakeWorld) -> usize {
    w.with(|s| s.jobs.len())
}

#[tokio::test]
async fn count_changes_on_an_autoscaling_pool_are_409_naming_the_bounds_and_write_nothing() {
    let w = world().await;
    let d = deps(&w);
    let before = rv(&w);
    for (method, path, body) in [
        (Method::PUT, "/nodes/workers", r#"{"count":3}"#),
        (Method::PATCH, "/nodes/workers", r#"{"delta":1}"#),
        (Method::PUT, "/pools/workers", r#"{"count":3}"#),
    ] {
        let r = webhook::handle(&d, req(method.clone(), path, body)).await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "{method} {path}");
        let b = body_json(&r);
        assert_eq!(
            (&b["error"], &b["pool"], &b["min"], &b["max"], &b["bounds"]),
            (
                &json!("autoscaling"),
                &json!("workers"),
                &json!(1),
                &json!(6),
                &json!("/pools/workers/autoscale")
            ),
            "{b}"
        );
        assert!(
            b["message"]
                .as_str()
                .unwrap()
                .contains("PUT /pools/workers/autoscale"),
            "{b}"
        );
    }
    // The legacy text route says the same in text.
    let legacy = Request::post("/nodes/workers/modify")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Bytes::from_static(b"3"))
        .unwrap();
    let r = webhook::handle(&d, legacy).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(String::from_utf8_lossy(r.body()).contains("/pools/workers/autoscale"));
    assert_eq!(rv(&w), before, "nothing written");
    assert_eq!(jobs(&w), 0, "nothing triggered");
    assert_eq!(stored(&w).worker_pools[0].count, 2);

    // A manual pool still takes counts.
    let r = webhook::handle(&d, req(Method::PUT, "/pools/gpu", r#"{"count":3}"#)).await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn get_autoscale_shows_the_stored_bounds() {
    let w = world().await;
    let d = deps(&w);
    let r = webhook::handle(&d, req(Method::GET, "/pools/workers/autoscale", "")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        body_json(&r),
        json!({"pool": "workers", "count": 2, "min": 1, "max": 6, "enabled": true})
    );
    let r = webhook::handle(&d, req(Method::GET, "/pools/gpu/autoscale", "")).await;
    assert_eq!(body_json(&r)["enabled"], false);
}

#[tokio::test]
async fn put_autoscale_changes_the_spec_and_triggers_a_reconcile() {
    let w = world().await;
    let d = deps(&w);
    let r = webhook::handle(
        &d,
        req(
            Method::PUT,
            "/pools/workers/autoscale",
            r#"{"min":3,"max":8}"#,
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body_json(&r));
    assert_eq!(r.headers()[RECONCILE_HEADER], "triggered");
    let b = body_json(&r);
    assert_eq!(
        (&b["min"], &b["max"], &b["count"], &b["changed"]),
        (&json!(3), &json!(8), &json!(3), &json!(true)),
        "the count is clamped into the new bounds: {b}"
    );
    let p = &stored(&w).worker_pools[0];
    assert_eq!((p.min, p.max, p.count), (3, 8, 3));
    assert_eq!(jobs(&w), 1);

    // The same again: nothing written, nothing started.
    let before = rv(&w);
    let r = webhook::handle(
        &d,
        req(Method::PUT, "/pools/workers/autoscale", r#"{"min":3}"#),
    )
    .await;
    assert_eq!(r.headers()[RECONCILE_HEADER], "not-needed");
    assert_eq!(rv(&w), before);

    // enabled false hands the count back to the caller; enabling a manual pool adds the block.
    let r = webhook::handle(
        &d,
        req(
            Method::PUT,
            "/pools/workers/autoscale",
            r#"{"enabled":false}"#,
        ),
    )
    .await;
    assert_eq!(body_json(&r)["enabled"], false);
    let r = webhook::handle(&d, req(Method::PUT, "/pools/workers", r#"{"count":5}"#)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = webhook::handle(
        &d,
        req(Method::PUT, "/pools/gpu/autoscale", r#"{"enabled":true}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        stored(&w).worker_pools[1].autoscale,
        Some(AutoscaleSpec::default())
    );
}

#[tokio::test]
async fn bad_bounds_are_400_naming_the_field_and_write_nothing() {
    let w = world().await;
    let d = deps(&w);
    let before = rv(&w);
    for (path, body, status, field) in [
        (
            "/pools/workers/autoscale",
            r#"{"min":5,"max":2}"#,
            400,
            "min",
        ),
        ("/pools/workers/autoscale", r#"{"max":0}"#, 400, "max"),
        ("/pools/workers/autoscale", r#"{"min":-1}"#, 400, "min"),
        ("/pools/workers/autoscale", r#"{"max":"6"}"#, 400, "max"),
        (
            "/pools/workers/autoscale",
            r#"{"enabled":"yes"}"#,
            400,
            "enabled",
        ),
        // Group `spread` holds 32 members: max 40 (plus a surge member) cannot fit.
        ("/pools/workers/autoscale", r#"{"max":40}"#, 400, "max"),
        (
            "/pools/control-plane/autoscale",
            r#"{"max":5}"#,
            400,
            "pool",
        ),
    ] {
        let r = webhook::handle(&d, req(Method::PUT, path, body)).await;
        assert_eq!(r.status().as_u16(), status, "{body}");
        let b = body_json(&r);
        assert_eq!(b["field"], field, "{body}: {b}");
        assert!(
            b["message"].as_str().unwrap().starts_with(field),
            "{body}: {b}"
        );
    }
    let r = webhook::handle(&d, req(Method::PUT, "/pools/nope/autoscale", "{}")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = webhook::handle(
        &d,
        req(Method::PUT, "/pools/workers/autoscale", r#"{"mn":1}"#),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = webhook::handle(&d, req(Method::PATCH, "/pools/workers/autoscale", "{}")).await;
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers()[header::ALLOW], "GET, PUT");
    assert_eq!(rv(&w), before);
    assert_eq!(jobs(&w), 0);
}

#[tokio::test]
async fn the_bounds_endpoint_needs_the_token() {
    let w = world().await;
    let d = deps(&w);
    let before = rv(&w);
    for auth in [None, Some("Bearer wrong"), Some("Basic x")] {
        let mut b = Request::put("/pools/workers/autoscale")
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        let r = webhook::handle(&d, b.body(Bytes::from_static(br#"{"max":5}"#)).unwrap()).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        let r = webhook::handle(
            &d,
            Request::get("/pools/workers/autoscale")
                .body(Bytes::new())
                .unwrap(),
        )
        .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(rv(&w), before);
    assert_eq!(jobs(&w), 0);
    // Counted under its own route template.
    assert!(
        d.metrics
            .render()
            .contains(r#"route="/pools/{pool}/autoscale""#)
    );
}

/// The fake store, with every read followed by a pause so that two writers read the same
/// resourceVersion and one of them meets a 409.
struct Slow(FakeState);

impl StateStore for Slow {
    async fn read_config(&self) -> Result<ConfigSnapshot, StateError> {
        let r = self.0.read_config().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        r
    }
    async fn replace_config(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.0.replace_config(rv, data).await
    }
    async fn read_scale(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        let r = self.0.read_scale().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        r
    }
    async fn replace_scale(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.0.replace_scale(rv, data).await
    }
    async fn read_secrets(&self) -> Result<ClusterSecrets, StateError> {
        self.0.read_secrets().await
    }
    async fn read_webhook_tokens(&self) -> Result<Option<WebhookTokens>, StateError> {
        self.0.read_webhook_tokens().await
    }
    async fn ensure_state(
        &self,
        s: &ClusterSecrets,
        c: BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        self.0.ensure_state(s, c).await
    }

    async fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> Result<BTreeMap<String, Vec<String>>, StateError> {
        self.0.merge_host_key_pins(pins).await
    }
}

#[tokio::test]
async fn concurrent_puts_from_two_webhook_processes_lose_no_update() {
    let w = world().await;
    // Two processes: their in-process write queues do not see each other.
    let a = Arc::new(Deps::new(Slow(w.state()), w.cluster(), config()));
    let b = Arc::new(Deps::new(Slow(w.state()), w.cluster(), config()));
    let (ra, rb) = tokio::join!(
        webhook::handle(
            &a,
            req(Method::PUT, "/pools/workers/autoscale", r#"{"min":2}"#)
        ),
        webhook::handle(
            &b,
            req(Method::PUT, "/pools/workers/autoscale", r#"{"max":9}"#)
        ),
    );
    assert_eq!((ra.status(), rb.status()), (StatusCode::OK, StatusCode::OK));
    let p = &stored(&w).worker_pools[0];
    assert_eq!((p.min, p.max), (2, 9), "both changes kept");
    let conflicts = |d: &Deps<Slow, FakeCluster>| {
        d.metrics.render().lines().any(|l| {
            l.starts_with("oxide_controller_webhook_state_conflicts_total ") && !l.ends_with(" 0")
        })
    };
    assert!(
        conflicts(&a) || conflicts(&b),
        "one writer met a 409 and re-applied its change"
    );
}

#[tokio::test]
async fn switching_autoscaling_off_keeps_the_count_the_autoscaler_reached() {
    let w = world().await;
    // The last run planned 5 workers (the autoscaler's count); the spec still says 2.
    let status = json!({
        "runId": "r1", "startedAt": "2026-11-23T03:00:00Z", "finishedAt": "2026-11-23T03:00:05Z",
        "conditions": [], "lastPlan": [],
        "pools": [{"pool": "workers", "desired": 5, "ready": 5, "joining": 0, "not_ready": 0,
                   "broken": 0, "removing": 0, "drifted": 0}]
    });
    w.with(|s| {
        s.config
            .data
            .insert(keys::STATUS.to_owned(), status.to_string())
    });
    let d = deps(&w);
    let r = webhook::handle(&d, req(Method::GET, "/pools/workers/autoscale", "")).await;
    assert_eq!(
        body_json(&r)["count"],
        5,
        "while enabled, the count is the autoscaler's"
    );
    let r = webhook::handle(
        &d,
        req(
            Method::PUT,
            "/pools/workers/autoscale",
            r#"{"enabled":false}"#,
        ),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", body_json(&r));
    let p = &stored(&w).worker_pools[0];
    assert_eq!(
        (p.count, p.autoscale.as_ref().map(|a| a.enabled)),
        (5, Some(false)),
        "the next run keeps the 5 workers instead of going back to 2"
    );
}
