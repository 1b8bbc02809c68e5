//! The scale webhook as a function: `http::Request<Bytes>` in, `http::Response<Bytes>` out
//! (the shape `lambda_http` uses), over the injected [`StateStore`] and [`Cluster`]. No socket
//! code lives here; [`host`] serves it with hyper, tests call [`handle`] directly.
//!
//! Owns routing, authentication ([`auth`]), request validation, the one error type
//! ([`error::WebhookError`]) and its mapping to responses, and the metrics ([`metrics`]).
//! The read-change-write protocol on the ConfigMap belongs to [`crate::workflows::scale`],
//! which the `scale` CLI uses too.
//!
//! Endpoints (everything but `/healthz`, `/readyz` and `/metrics` needs
//! `Authorization: Bearer <token>`, Secret `oxide-controller-webhook-auth`'s `webhook-token`; its `webhook-read-token`,
//! where set, does for GETs and is 403 on anything else). `/metrics` is open as peers' are
//! (cert-manager, Flux, Karpenter, kube-state-metrics serve theirs without credentials, the
//! NetworkPolicy deciding who reaches the port): it carries counts, timestamps and the reasons
//! of conditions, never a token, a message or a name beyond the spec's pools, and a scraper
//! then needs no key of the Secret that holds the rack's credentials. What a change may do is bounded: the control plane is not
//! changeable here (403), and no worker pool's `max` or count is raised above the
//! administrator's `webhook.ceiling` or beyond the project's subnet (422); see
//! [`scale::webhook_may`].
//!
//!
//! | route | methods | does |
//! |---|---|---|
//! | `/nodes/workers` | GET, PUT `{"count":N}`, PATCH `{"delta":±N}` | the default worker pool's count (GET: plain text, JSON with `Accept: application/json`) |
//! | `/nodes/workers/modify` | POST, text body `N` | the ancestor's API: set the count, answer in text |
//! | `/pools/{pool}`, `/pools/{pool}/modify` | as above | the same for a named pool |
//! | `/pools/{pool}/autoscale` | GET, PUT `{"min":N,"max":N,"enabled":bool}` (each optional) | a worker pool's autoscaling bounds; while enabled, count changes on the pool are 409 pointing here |
//! | `/status` | GET | `status.json` as the last reconcile wrote it, plus `lastTrigger`: the last reconcile this webhook started and why |
//! | `/reconcile` | POST | start a reconcile Job now |
//! | `/metrics` | GET | Prometheus text: the webhook's requests and the cluster's status ([`metrics::cluster`]); no token |
//! | `/healthz`, `/readyz` | GET, HEAD | liveness (always 200); readiness (Secret and ConfigMap readable) |
//!
//! Between requests only the metrics, a few seconds' cache of the token digest, of the
//! cluster metrics' ConfigMap read and of the readiness check, and a memo of the last parsed `spec.yaml` (keyed by its
//! exact text, so never stale) survive.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde::Deserialize;

use crate::ports::cluster::Cluster;
use crate::ports::state::StateStore;
use crate::workflows::error::chain;
use crate::workflows::scale::{
    self, ChangeOutcome, CountChange, ReconcileOutcome, ScaleOptions, SpecOutcome,
};

mod auth;
pub use auth::TokenSource;
mod commit;
pub mod error;
pub mod host;
pub mod metrics;
pub mod pending;

use error::WebhookError;
use metrics::{ClusterCache, Metrics, TriggerResult};

/// Largest request body accepted (bytes); larger is a 413.
pub const MAX_BODY: usize = 1024;

/// Success status of the legacy `POST /nodes/workers/modify`: the ancestor (Go, gorilla/mux,
/// `pkg/server/server.go` `handleModifyNode`) answered `201 Created` with the text
/// `Worker count changed from X to Y`; callers written against it keep working.
pub const LEGACY_SUCCESS: StatusCode = StatusCode::CREATED;

/// Response header on every change saying what happened to the reconcile
/// (`triggered`, `pending`, `not-triggered`, `not-needed`, `failed`).
pub const RECONCILE_HEADER: &str = "x-oxide-controller-reconcile";

/// Default of [`WebhookConfig::ready_ttl`]: well under the kubelet's default probe period
/// (10 s), so a pod's readiness is at most one probe late.
pub const READY_TTL: Duration = Duration::from_secs(5);

/// Settings of the webhook function.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// How long the webhook token's digest is cached; zero reads the tokens on every request.
    pub token_ttl: Duration,
    /// Where the tokens are read: the mounted Secret keys in the cluster, else the Secret.
    pub tokens: auth::TokenSource,
    /// Conflict retries of ConfigMap writes.
    pub scale: ScaleOptions,
    /// How long the ConfigMap read for the cluster metrics serves `/metrics` scrapes; zero
    /// reads it on every scrape.
    pub status_ttl: Duration,
    /// How long one readiness check (token and ConfigMap reads) answers `/readyz`; zero
    /// checks on every probe. `/readyz` is unauthenticated: without this a probe flood is
    /// apiserver load charged to the webhook's ServiceAccount.
    pub ready_ttl: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            token_ttl: Duration::from_secs(5),
            tokens: auth::TokenSource::Secret,
            scale: ScaleOptions::default(),
            status_ttl: Duration::from_secs(10),
            ready_ttl: READY_TTL,
        }
    }
}

/// What the function runs against. One per process; share it (`Arc`) between connections.
pub struct Deps<S, C> {
    pub state: S,
    pub cluster: C,
    pub metrics: Metrics,
    /// The cluster metrics' input between scrapes.
    pub cluster_metrics: ClusterCache,
    /// The last readiness check, between `/readyz` probes.
    ready: ReadyCache,
    config: WebhookConfig,
    tokens: auth::TokenCache,
    specs: scale::SpecCache,
    /// This process's spec changes: queued, and written together one batch at a time.
    /// Without it, N concurrent PATCHes turn into an N-way 409 storm where each round has one
    /// winner; serialised one by one they cost N writes. Batched, a burst costs about one
    /// write per write round-trip, and the bounded re-read-and-retry only has to cope with
    /// writers in *other* processes.
    commits: commit::GroupCommit,
    /// The last reconcile this process started, and why (`GET /status`).
    last_trigger: std::sync::Mutex<Option<pending::LastTrigger>>,
}

impl<S, C> std::fmt::Debug for Deps<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: StateStore, C: Cluster> Deps<S, C> {
    pub fn new(state: S, cluster: C, mut config: WebhookConfig) -> Self {
        // Whatever the config says: changes through here are the webhook's.
        config.scale.caller = scale::Caller::Webhook;
        Deps {
            state,
            cluster,
            metrics: Metrics::default(),
            cluster_metrics: ClusterCache::default(),
            ready: ReadyCache::default(),
            tokens: auth::TokenCache::new(config.token_ttl, config.tokens.clone()),
            specs: scale::SpecCache::default(),
            config,
            commits: commit::GroupCommit::default(),
            last_trigger: std::sync::Mutex::new(None),
        }
    }
}

/// Which pool a route names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PoolRef {
    /// `/nodes/workers`: the default worker pool.
    Default,
    Named(String),
}

impl PoolRef {
    fn as_option(&self) -> Option<&str> {
        match self {
            PoolRef::Default => None,
            PoolRef::Named(p) => Some(p),
        }
    }
}

/// A parsed path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Healthz,
    Readyz,
    Metrics,
    Status,
    Reconcile,
    Count(PoolRef),
    Modify(PoolRef),
    Autoscale(String),
    Unknown,
}

impl Route {
    fn parse(path: &str) -> Route {
        match path {
            "/healthz" => Route::Healthz,
            "/readyz" => Route::Readyz,
            "/metrics" => Route::Metrics,
            "/status" => Route::Status,
            "/reconcile" => Route::Reconcile,
            "/nodes/workers" => Route::Count(PoolRef::Default),
            "/nodes/workers/modify" => Route::Modify(PoolRef::Default),
            _ => {
                let Some(rest) = path.strip_prefix("/pools/") else {
                    return Route::Unknown;
                };
                match rest.split_once('/') {
                    None if !rest.is_empty() => Route::Count(PoolRef::Named(rest.to_owned())),
                    Some((pool, "modify")) if !pool.is_empty() => {
                        Route::Modify(PoolRef::Named(pool.to_owned()))
                    }
                    Some((pool, "autoscale")) if !pool.is_empty() => {
                        Route::Autoscale(pool.to_owned())
                    }
                    _ => Route::Unknown,
                }
            }
        }
    }

    /// Index into [`metrics::ROUTES`].
    fn label(&self) -> usize {
        match self {
            Route::Healthz => 0,
            Route::Readyz => 1,
            Route::Metrics => 2,
            Route::Status => 3,
            Route::Reconcile => 4,
            Route::Count(PoolRef::Default) => 5,
            Route::Modify(PoolRef::Default) => 6,
            Route::Count(PoolRef::Named(_)) => 7,
            Route::Modify(PoolRef::Named(_)) => 8,
            Route::Autoscale(_) => 9,
            Route::Unknown => 10,
        }
    }

    fn allow(&self) -> &'static str {
        match self {
            Route::Healthz | Route::Readyz => "GET, HEAD",
            Route::Metrics | Route::Status => "GET",
            Route::Reconcile | Route::Modify(_) => "POST",
            Route::Count(_) => "GET, PUT, PATCH",
            Route::Autoscale(_) => "GET, PUT",
            Route::Unknown => "",
        }
    }

    /// Answered without a token: the probes, and `/metrics` (see the module's docs).
    fn is_public(&self) -> bool {
        matches!(self, Route::Healthz | Route::Readyz | Route::Metrics)
    }

    /// The legacy route answers in plain text, like the ancestor.
    fn is_legacy(&self) -> bool {
        matches!(self, Route::Modify(_))
    }
}

/// Handles one request. Never panics on any input; every outcome is a response.
pub async fn handle<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
    req: Request<Bytes>,
) -> Response<Bytes> {
    let started = Instant::now();
    let route = Route::parse(req.uri().path());
    let method = metrics::method_label(req.method());
    let response = match dispatch(deps, &route, &req).await {
        Ok(r) => r,
        Err(e) => {
            log_error(&route, method, &e);
            error_response(&e, route.is_legacy())
        }
    };
    deps.metrics.observe(
        route.label(),
        method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// The response for a request the host could not hand to [`handle`] (its body could not be
/// read, or it ran past its deadline), logged and counted in the metrics like any other.
pub fn host_error_response<S, C>(
    deps: &Deps<S, C>,
    method: &Method,
    path: &str,
    e: &WebhookError,
    elapsed: Duration,
) -> Response<Bytes> {
    let route = Route::parse(path);
    let method = metrics::method_label(method);
    log_error(&route, method, e);
    let r = error_response(e, route.is_legacy());
    deps.metrics
        .observe(route.label(), method, r.status().as_u16(), elapsed);
    r
}

fn log_error(route: &Route, method: &'static str, e: &WebhookError) {
    let public = e.public();
    let route = metrics::ROUTES[route.label()];
    if public.status >= 500 {
        tracing::warn!(route, method, status = public.status, error = %chain(e), "webhook request failed");
    } else {
        tracing::info!(route, method, status = public.status, error = %chain(e), "webhook request refused");
    }
}

/// Builds the error response: short JSON `{"error": code, "message": ...}`, or `message\n` as
/// text for the legacy route.
pub fn error_response(e: &WebhookError, legacy: bool) -> Response<Bytes> {
    let p = e.public();
    let mut r = if legacy {
        text(p.status, format!("{}\n", p.message))
    } else {
        let mut body = p.details.clone().unwrap_or_default();
        body.insert("error".into(), p.code.into());
        body.insert("message".into(), p.message.clone().into());
        json(p.status, &serde_json::Value::Object(body))
    };
    let h = r.headers_mut();
    if let Some(allow) = p.allow {
        h.insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    if let Some(www) = p.www_authenticate {
        h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(www));
    }
    if let Some(secs) = p.retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    r
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn respond(code: u16, content_type: &'static str, body: impl Into<Bytes>) -> Response<Bytes> {
    let mut r = Response::new(body.into());
    *r.status_mut() = status(code);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn text(code: u16, body: String) -> Response<Bytes> {
    respond(code, "text/plain; charset=utf-8", body)
}

fn json(code: u16, value: &serde_json::Value) -> Response<Bytes> {
    respond(code, "application/json", value.to_string())
}

async fn dispatch<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
    route: &Route,
    req: &Request<Bytes>,
) -> Result<Response<Bytes>, WebhookError> {
    let method = req.method();
    if *route == Route::Metrics {
        return match *method {
            Method::GET => Ok(metrics_response(deps).await),
            _ => Err(WebhookError::MethodNotAllowed {
                allow: route.allow(),
            }),
        };
    }
    if route.is_public() {
        let head = *method == Method::HEAD;
        if !(head || *method == Method::GET) {
            return Err(WebhookError::MethodNotAllowed {
                allow: route.allow(),
            });
        }
        let mut r = match route {
            Route::Readyz => readyz(deps).await,
            _ => text(200, "ok\n".to_owned()),
        };
        if head {
            *r.body_mut() = Bytes::new();
        }
        return Ok(r);
    }

    // Everything else: credentials first, so unauthenticated callers learn nothing else.
    // A credential in the URL is refused outright; any other query string is a 400, but only
    // once the caller has proved who they are.
    let query = auth::check_query(req.uri().query());
    if let Err(e @ WebhookError::Unauthenticated { .. }) = query {
        return Err(e);
    }
    let access = auth::authenticate(&deps.tokens, &deps.state, req.headers()).await?;
    query?;
    if access == auth::Access::Read && *method != Method::GET {
        return Err(WebhookError::ReadOnlyToken);
    }
    if *route == Route::Unknown {
        return Err(WebhookError::NotFound);
    }
    check_size(req)?;

    match (route, method) {
        (Route::Status, &Method::GET) => status_json(deps).await,
        (Route::Reconcile, &Method::POST) => reconcile_now(deps).await,
        (Route::Count(pool), &Method::GET) => get_count(deps, pool, req.headers()).await,
        (Route::Autoscale(pool), &Method::GET) => {
            let b = scale::observe_autoscale(&deps.state, Some(pool), &deps.specs).await?;
            Ok(json(200, &serde_json::json!(b)))
        }
        (Route::Count(_) | Route::Autoscale(_) | Route::Modify(_), _) => {
            match spec_change(route, method, req)? {
                Some((change, legacy)) => commit_change(deps, change, legacy).await,
                None => Err(WebhookError::MethodNotAllowed {
                    allow: route.allow(),
                }),
            }
        }
        _ => Err(WebhookError::MethodNotAllowed {
            allow: route.allow(),
        }),
    }
}

/// The spec change a write request asks for, and whether it is the ancestor's legacy route
/// (answered in text); `None` for a method the route does not write with.
fn spec_change(
    route: &Route,
    method: &Method,
    req: &Request<Bytes>,
) -> Result<Option<(scale::SpecChange, bool)>, WebhookError> {
    Ok(Some(match (route, method) {
        (Route::Count(pool), &Method::PUT) => {
            require_content_type(req.headers(), &["application/json"], "application/json")?;
            let body: SetBody = parse_json(
                req.body(),
                r#"a JSON object {"count": N} with a whole number N"#,
            )?;
            (count_change(pool, CountChange::Set(body.count)), false)
        }
        (Route::Count(pool), &Method::PATCH) => {
            require_content_type(
                req.headers(),
                &["application/json", "application/merge-patch+json"],
                "application/json",
            )?;
            let body: AddBody = parse_json(
                req.body(),
                r#"a JSON object {"delta": N} with a whole number N, e.g. {"delta": -1}"#,
            )?;
            (count_change(pool, CountChange::Add(body.delta)), false)
        }
        (Route::Autoscale(pool), &Method::PUT) => {
            require_content_type(req.headers(), &["application/json"], "application/json")?;
            let change = scale::SpecChange::Autoscale {
                pool: Some(pool.clone()),
                change: parse_autoscale_body(req.body())?,
            };
            (change, false)
        }
        (Route::Modify(pool), &Method::POST) => {
            // What the ancestor's callers send: no type, text, its documented `application/text`,
            // or curl -d's form type.
            require_content_type(
                req.headers(),
                &[
                    "",
                    "text/plain",
                    "application/text",
                    "application/x-www-form-urlencoded",
                ],
                "text/plain",
            )?;
            let count = parse_count_text(req.body())?;
            (count_change(pool, CountChange::Set(count)), true)
        }
        _ => return Ok(None),
    }))
}

fn check_size(req: &Request<Bytes>) -> Result<(), WebhookError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let size = declared.max(req.body().len() as u64);
    if size > MAX_BODY as u64 {
        return Err(WebhookError::PayloadTooLarge {
            size,
            limit: MAX_BODY,
        });
    }
    Ok(())
}

/// The media type of the request without parameters, lowercased ("" when absent).
fn media_type(headers: &http::HeaderMap) -> Result<String, WebhookError> {
    match headers.get(header::CONTENT_TYPE) {
        None => Ok(String::new()),
        Some(v) => {
            let s = v.to_str().map_err(|_| WebhookError::UnsupportedMediaType {
                got: "<not ASCII>".into(),
                expected: "a valid Content-Type",
            })?;
            Ok(s.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase())
        }
    }
}

fn require_content_type(
    headers: &http::HeaderMap,
    accepted: &[&str],
    expected: &'static str,
) -> Result<(), WebhookError> {
    let got = media_type(headers)?;
    if accepted.contains(&got.as_str()) {
        Ok(())
    } else {
        Err(WebhookError::UnsupportedMediaType { got, expected })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetBody {
    count: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    delta: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AutoscaleBody {
    #[serde(default)]
    min: Option<serde_json::Value>,
    #[serde(default)]
    max: Option<serde_json::Value>,
    #[serde(default)]
    enabled: Option<serde_json::Value>,
}

/// `{"min": N, "max": N, "enabled": bool}`, each optional; a bad member is a 400 naming it.
fn parse_autoscale_body(body: &[u8]) -> Result<scale::AutoscaleChange, WebhookError> {
    let b: AutoscaleBody = parse_json(
        body,
        r#"a JSON object with any of "min" (whole number), "max" (whole number), "enabled" (true or false)"#,
    )?;
    let bad = |field: &str, message: &str| {
        WebhookError::Scale(scale::ScaleError::InvalidAutoscale {
            field: field.into(),
            message: message.into(),
        })
    };
    let count = |field: &str, v: Option<serde_json::Value>| match v {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(field, "must be a whole number from 0 to 4294967295")),
    };
    let enabled = match b.enabled {
        None => None,
        Some(serde_json::Value::Bool(on)) => Some(on),
        Some(_) => return Err(bad("enabled", "must be true or false")),
    };
    Ok(scale::AutoscaleChange {
        min: count("min", b.min)?,
        max: count("max", b.max)?,
        enabled,
    })
}

fn parse_json<T: serde::de::DeserializeOwned>(
    body: &[u8],
    expected: &'static str,
) -> Result<T, WebhookError> {
    serde_json::from_slice(body).map_err(|_| WebhookError::BadRequest { expected })
}

/// The legacy body: the count as decimal text. Surrounding whitespace (a trailing newline from
/// `echo`) is tolerated; anything else is a 400.
fn parse_count_text(body: &[u8]) -> Result<i64, WebhookError> {
    let bad = || WebhookError::BadRequest {
        expected: "the new worker count as a whole number, e.g. 3",
    };
    let s = std::str::from_utf8(body).map_err(|_| bad())?.trim();
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    s.parse::<i64>().map_err(|_| bad())
}

fn wants_json(headers: &http::HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',').any(|range| {
                range
                    .split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
            })
        })
    })
}

async fn get_count<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
    pool: &PoolRef,
    headers: &http::HeaderMap,
) -> Result<Response<Bytes>, WebhookError> {
    let c = scale::observe_count(&deps.state, pool.as_option(), &deps.specs).await?;
    if wants_json(headers) {
        Ok(json(
            200,
            &serde_json::json!({"pool": c.pool, "count": c.count, "min": c.min, "max": c.max}),
        ))
    } else {
        // The ancestor's format: the number, nothing else.
        Ok(text(200, c.count.to_string()))
    }
}

/// A count or bounds change through the group commit ([`commit`]): the response says what
/// this caller's change did and the reconcile it led to.
async fn commit_change<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
    change: scale::SpecChange,
    legacy: bool,
) -> Result<Response<Bytes>, WebhookError> {
    let commit::Committed { outcome, reconcile } = commit::submit(deps, change).await?;
    let mut r = match &outcome {
        SpecOutcome::Count(o) => count_response(o, &reconcile, legacy),
        SpecOutcome::Autoscale(o) => autoscale_response(o, &reconcile),
    };
    r.headers_mut().insert(
        RECONCILE_HEADER,
        HeaderValue::from_static(reconcile.as_str()),
    );
    Ok(r)
}

fn count_change(pool: &PoolRef, change: CountChange) -> scale::SpecChange {
    scale::SpecChange::Count {
        pool: pool.as_option().map(str::to_owned),
        change,
    }
}

fn count_response(
    outcome: &ChangeOutcome,
    reconcile: &ReconcileOutcome,
    legacy: bool,
) -> Response<Bytes> {
    if outcome.written {
        tracing::info!(
            pool = %outcome.pool,
            previous = outcome.previous,
            count = outcome.count,
            conflicts = outcome.conflicts,
            reconcile = reconcile.as_str(),
            "desired count changed"
        );
    }
    if legacy {
        text(
            LEGACY_SUCCESS.as_u16(),
            format!(
                "Worker count changed from {} to {}",
                outcome.previous, outcome.count
            ),
        )
    } else {
        json(200, &change_body(outcome, reconcile))
    }
}

fn autoscale_response(
    outcome: &scale::AutoscaleOutcome,
    reconcile: &ReconcileOutcome,
) -> Response<Bytes> {
    let (a, b) = (&outcome.previous, &outcome.now);
    if outcome.written {
        tracing::info!(
            pool = %b.pool,
            min = b.min,
            max = b.max,
            enabled = b.enabled,
            count = b.count,
            conflicts = outcome.conflicts,
            reconcile = reconcile.as_str(),
            "autoscaling bounds changed"
        );
    }
    let what = if outcome.written {
        format!(
            "pool {} autoscaling {} with bounds [{}, {}] (was {} [{}, {}])",
            b.pool,
            if b.enabled { "on" } else { "off" },
            b.min,
            b.max,
            if a.enabled { "on" } else { "off" },
            a.min,
            a.max
        )
    } else {
        format!("pool {} already has these settings", b.pool)
    };
    json(
        200,
        &serde_json::json!({
            "pool": b.pool,
            "count": b.count,
            "min": b.min,
            "max": b.max,
            "enabled": b.enabled,
            "changed": outcome.written,
            "reconcile": reconcile.as_str(),
            "message": format!("{what}; {}", reconcile.public_message()),
        }),
    )
}

fn change_body(o: &ChangeOutcome, reconcile: &ReconcileOutcome) -> serde_json::Value {
    let what = if o.written {
        format!("pool {} changed from {} to {}", o.pool, o.previous, o.count)
    } else {
        format!("pool {} already has count {}", o.pool, o.count)
    };
    serde_json::json!({
        "pool": o.pool,
        "previous": o.previous,
        "count": o.count,
        "min": o.min,
        "max": o.max,
        "changed": o.written,
        "reconcile": reconcile.as_str(),
        "message": format!("{what}; {}", reconcile.public_message()),
    })
}

/// Starts the reconcile Job (or joins the one pending), counts it by result and reason, logs
/// it and remembers it for `GET /status`.
async fn trigger<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
    reason: pending::TriggerReason,
    detail: String,
) -> ReconcileOutcome {
    let outcome = scale::trigger_reconcile(&deps.cluster).await;
    let result = match &outcome {
        ReconcileOutcome::Triggered => TriggerResult::Created,
        ReconcileOutcome::Pending => TriggerResult::Pending,
        ReconcileOutcome::NoCronJob => TriggerResult::NoCronJob,
        ReconcileOutcome::NotNeeded | ReconcileOutcome::Failed { .. } => TriggerResult::Error,
    };
    deps.metrics.trigger(result);
    deps.metrics.trigger_reason(reason);
    match &outcome {
        ReconcileOutcome::Failed { message } => {
            tracing::warn!(reason = reason.as_str(), %detail, error = %message, "starting the reconcile Job failed");
        }
        o => {
            tracing::info!(reason = reason.as_str(), %detail, reconcile = o.as_str(), "reconcile triggered");
        }
    }
    *deps
        .last_trigger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(pending::LastTrigger {
        at: chrono::Utc::now(),
        reason: reason.as_str().to_owned(),
        detail,
        outcome: outcome.as_str().to_owned(),
    });
    outcome
}

async fn reconcile_now<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
) -> Result<Response<Bytes>, WebhookError> {
    match trigger(
        deps,
        pending::TriggerReason::Manual,
        "POST /reconcile".to_owned(),
    )
    .await
    {
        o @ (ReconcileOutcome::Triggered | ReconcileOutcome::Pending) => Ok(json(
            202,
            &serde_json::json!({"reconcile": o.as_str(), "message": o.public_message()}),
        )),
        ReconcileOutcome::NoCronJob => Err(WebhookError::NoCronJob),
        ReconcileOutcome::Failed { message } => Err(WebhookError::TriggerFailed { message }),
        ReconcileOutcome::NotNeeded => Err(WebhookError::TriggerFailed {
            message: "unexpected trigger outcome".into(),
        }),
    }
}

async fn status_json<S: StateStore, C: Cluster>(
    deps: &Deps<S, C>,
) -> Result<Response<Bytes>, WebhookError> {
    let snapshot = deps
        .state
        .read_config()
        .await
        .map_err(|e| WebhookError::Scale(scale::ScaleError::State(e)))?;
    let last = deps
        .last_trigger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    match snapshot.status_json() {
        Some(s) if !s.trim().is_empty() => {
            // What the last run wrote, plus what this webhook last started and why.
            let body = match (serde_json::from_str::<serde_json::Value>(s), last) {
                (Ok(mut v), Some(last)) if v.is_object() => {
                    v["lastTrigger"] = serde_json::to_value(last).unwrap_or_default();
                    serde_json::to_string_pretty(&v).unwrap_or_else(|_| s.to_owned())
                }
                _ => s.to_owned(),
            };
            Ok(respond(200, "application/json", body))
        }
        _ => Err(WebhookError::NoStatus),
    }
}

/// `/metrics`: the webhook's own counters, then the cluster's (from the ConfigMap, cached).
async fn metrics_response<S: StateStore, C: Cluster>(deps: &Deps<S, C>) -> Response<Bytes> {
    let input = deps
        .cluster_metrics
        .input(&deps.state, deps.config.status_ttl)
        .await;
    let mut body = deps.metrics.render();
    body.push_str(&metrics::cluster::render(&input));
    respond(200, "text/plain; version=0.0.4; charset=utf-8", body)
}

/// What a readiness check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    Ready,
    NoToken,
    NoConfigMap,
}

/// The last readiness check and when it was made. An async lock held across the check:
/// probes that arrive while one is under way wait for it instead of reading too (the
/// pattern of [`ClusterCache::input`]).
#[derive(Debug, Default)]
struct ReadyCache {
    slot: tokio::sync::Mutex<Option<(Instant, Readiness)>>,
}

impl ReadyCache {
    /// The check made within the last `ttl`, or made now; a failed check is cached too (an
    /// apiserver in trouble is not asked more often).
    async fn check<S: StateStore>(
        &self,
        tokens: &auth::TokenCache,
        state: &S,
        ttl: Duration,
    ) -> Readiness {
        let mut slot = self.slot.lock().await;
        if let Some((at, r)) = *slot
            && at.elapsed() < ttl
        {
            return r;
        }
        let (token, config) = tokio::join!(tokens.expected(state), state.read_config());
        let r = match (token, config) {
            (Err(e), _) => {
                tracing::warn!(error = %chain(&e), "not ready: no webhook token");
                Readiness::NoToken
            }
            (_, Err(e)) => {
                tracing::warn!(error = %chain(&e), "not ready: cannot read the ConfigMap");
                Readiness::NoConfigMap
            }
            (Ok(_), Ok(_)) => Readiness::Ready,
        };
        *slot = Some((Instant::now(), r));
        r
    }
}

/// Ready when the tokens (the mounted keys, or the Secret) and the ConfigMap can be read;
/// checked at most once per [`WebhookConfig::ready_ttl`].
async fn readyz<S: StateStore, C: Cluster>(deps: &Deps<S, C>) -> Response<Bytes> {
    match deps
        .ready
        .check(&deps.tokens, &deps.state, deps.config.ready_ttl)
        .await
    {
        Readiness::NoToken => text(503, "not ready: cannot read the webhook token\n".to_owned()),
        Readiness::NoConfigMap => text(503, "not ready: cannot read the ConfigMap\n".to_owned()),
        Readiness::Ready => text(200, "ready\n".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_into_routes_and_nothing_else_matches() {
        assert_eq!(
            Route::parse("/nodes/workers"),
            Route::Count(PoolRef::Default)
        );
        assert_eq!(
            Route::parse("/pools/gpu"),
            Route::Count(PoolRef::Named("gpu".into()))
        );
        assert_eq!(
            Route::parse("/pools/gpu/modify"),
            Route::Modify(PoolRef::Named("gpu".into()))
        );
        assert_eq!(
            Route::parse("/pools/gpu/autoscale"),
            Route::Autoscale("gpu".into())
        );
        for p in [
            "/",
            "",
            "/pools/",
            "/pools//modify",
            "/pools//autoscale",
            "/pools/gpu/autoscale/x",
            "/pools/a/b",
            "/nodes/workers/",
            "/healthz/x",
        ] {
            assert_eq!(Route::parse(p), Route::Unknown, "{p:?}");
        }
    }

    #[test]
    fn legacy_counts_are_decimal_text_only() {
        assert_eq!(parse_count_text(b"3").ok(), Some(3));
        assert_eq!(parse_count_text(b" 12\n").ok(), Some(12));
        assert_eq!(parse_count_text(b"-1").ok(), Some(-1));
        for bad in [
            &b""[..],
            b"3.0",
            b"0x3",
            b"three",
            b"+",
            b"1e3",
            b"\xff",
            b"99999999999999999999",
        ] {
            assert!(parse_count_text(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn json_is_chosen_only_when_accepted_explicitly() {
        let mut h = http::HeaderMap::new();
        assert!(!wants_json(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html, application/json;q=0.9"),
        );
        assert!(wants_json(&h));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert!(!wants_json(&h));
    }
}
