//! The front proxy a simulated k3s server serves on `:6443` of each of its addresses: TLS with
//! that server's certificate (its SANs), then every request forwarded to the cluster's real
//! apiserver. A caller authenticated by a client certificate is named to the apiserver in
//! `X-Remote-User`/`X-Remote-Group` over the front-proxy client certificate (the apiserver's
//! request-header authenticator); bearer tokens pass through untouched, so the apiserver's
//! own authenticators and authorizer decide. Bodies stream both ways (watch works).
//!
//! Like the twin it replaces, the proxy injects faults per verb and resource
//! ([`crate::oxide::faults::FaultSpec::kube`], keyed `"<verb> <resource>[/<sub>]"`) and counts
//! requests per `"METHOD /path/template"`. Those faults answer *before* forwarding (the
//! request never reaches the apiserver: no side effect); the ones of
//! [`crate::oxide::faults::FaultSpec::kube_after`] answer *after* it (the apiserver accepted
//! and committed the request, the client is told it failed), as a real 504 can.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt as _;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::json;

use super::pki::{Identity, Pki};
use super::{ControlPlane, ControlPlaneError};
use crate::oxide::faults::Faults;

type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Largest request body the apiserver reads (apiserver `MaxRequestBodyBytes`, 3 MiB).
const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;

/// Forwards to one control plane; shared by every listener of the cluster's servers.
pub struct FrontProxy {
    upstream: String,
    pki: Arc<Pki>,
    /// Presents the front-proxy client certificate (for callers named in headers).
    as_proxy: reqwest::Client,
    /// Presents no certificate (for bearer tokens and anonymous callers).
    plain: reqwest::Client,
    faults: Faults,
    counters: Mutex<BTreeMap<String, u64>>,
    /// k3s's supervisor route `/db/info`, once the cluster's server token is known.
    db_info: std::sync::OnceLock<DbInfo>,
}

/// What `/db/info` needs: the members and the password of k3s's `server` user.
#[derive(Debug)]
struct DbInfo {
    members: super::etcd::MemberLister,
    server_secret: String,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontProxy")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl FrontProxy {
    /// A proxy to `cp`, injecting `faults`.
    pub fn new(cp: &ControlPlane, faults: Faults) -> Result<Arc<FrontProxy>, ControlPlaneError> {
        let tls = |e: reqwest::Error| ControlPlaneError::Tls(format!("proxy client: {e}"));
        let ca = reqwest::Certificate::from_pem(cp.ca_pem().as_bytes()).map_err(tls)?;
        let base = || {
            reqwest::Client::builder()
                .tls_certs_only([ca.clone()])
                .http1_only()
                .pool_idle_timeout(Duration::from_secs(30))
        };
        let fp = &cp.pki().front_proxy_client;
        let identity =
            reqwest::Identity::from_pem(format!("{}{}", fp.cert_pem, fp.key_pem).as_bytes())
                .map_err(tls)?;
        Ok(Arc::new(FrontProxy {
            upstream: cp.server_url(),
            pki: cp.pki().clone(),
            as_proxy: base().identity(identity).build().map_err(tls)?,
            plain: base().build().map_err(tls)?,
            faults,
            counters: Mutex::new(BTreeMap::new()),
            db_info: std::sync::OnceLock::new(),
        }))
    }

    /// Serves k3s's `GET /db/info` (the etcd member list) from `members`, to clients that
    /// present `server_secret` as the password of user `server` (the server token's secret).
    pub fn serve_db_info(&self, members: super::etcd::MemberLister, server_secret: &str) {
        let _ = self.db_info.set(DbInfo {
            members,
            server_secret: server_secret.to_owned(),
        });
    }

    /// k3s's etcd `handler`: `/db/info` behind `IsLocalOrHasRole(k3s:server)`, then
    /// `infoHandler`. Every client of the simulator counts as remote (a pod or a laptop is
    /// never on a server's own loopback). The authenticator: no basic credentials find no
    /// user (403 "forbidden"), a wrong password or user is an authentication error (401 "not
    /// authorized"), `server` with the token's secret is in group `k3s:server`.
    async fn db_info(&self, parts: &http::request::Parts) -> http::Response<Body> {
        let Some(info) = self.db_info.get() else {
            return status(503, "ServiceUnavailable", "apiserver not ready");
        };
        let basic = parts
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok());
        let Some(creds) = basic else {
            return status(403, "Forbidden", "forbidden");
        };
        let (user, pass) = creds.split_once(':').unwrap_or((creds.as_str(), ""));
        let secret = info.server_secret.as_bytes();
        let same = pass.len() == secret.len()
            && pass
                .bytes()
                .zip(secret)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if user != "server" || !same {
            return status(401, "Unauthorized", "not authorized");
        }
        if parts.method != http::Method::GET {
            return status(405, "MethodNotAllowed", "method not allowed");
        }
        match info.members.db_info().await {
            Ok(list) => http::Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(
                    Full::new(Bytes::from(format!("{list}\n")))
                        .map_err(|never| match never {})
                        .boxed(),
                )
                .unwrap_or_else(|_| http::Response::new(BoxBody::default())),
            Err(e) => status(
                500,
                "InternalError",
                &format!("Internal error occurred: failed to get etcd MemberList: {e}"),
            ),
        }
    }

    /// Requests seen, per `"METHOD /path/template"`.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Zeroes the request counters.
    pub fn reset_counters(&self) {
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// A TLS config for a listener whose certificate names `sans`.
    pub fn tls_config(
        &self,
        sans: &[String],
    ) -> Result<Arc<rustls::ServerConfig>, ControlPlaneError> {
        self.pki.server_config(sans, None)
    }

    /// [`Self::tls_config`] with a certificate valid until `end` (a k3s node's leaf
    /// certificates, see `crate::guest::certs`); None: valid for ever, as a fixture's.
    pub fn tls_config_until(
        &self,
        sans: &[String],
        end: Option<std::time::SystemTime>,
    ) -> Result<Arc<rustls::ServerConfig>, ControlPlaneError> {
        self.pki.server_config(sans, end)
    }

    /// Accept loop: TLS + HTTP/1.1 until the task is aborted (which closes every connection).
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: Arc<rustls::ServerConfig>,
    ) {
        self.serve_as(listener, tls, None).await;
    }

    /// [`Self::serve`] on a listener of one k3s server: what that server's own apiserver
    /// process answers itself (`/version`, its `/metrics` samples) is that server's (see
    /// [`ServerFacts`]).
    pub async fn serve_as(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: Arc<rustls::ServerConfig>,
        server: Option<Arc<ServerFacts>>,
    ) {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let mut connections = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => {
                        let _ = tcp.set_nodelay(true);
                        connections.spawn(Arc::clone(&self).connection(
                            tcp,
                            acceptor.clone(),
                            server.clone(),
                        ));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "front proxy: accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    }

    async fn connection(
        self: Arc<Self>,
        tcp: tokio::net::TcpStream,
        acceptor: tokio_rustls::TlsAcceptor,
        server: Option<Arc<ServerFacts>>,
    ) {
        let Ok(stream) = acceptor.accept(tcp).await else {
            return;
        };
        let identity = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|der| self.pki.identify(der));
        let service = hyper::service::service_fn(move |req| {
            let proxy = Arc::clone(&self);
            let identity = identity.clone();
            let server = server.clone();
            async move { Ok::<_, std::convert::Infallible>(proxy.handle(req, identity, server).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    }

    fn count(&self, key: String) {
        *self
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default() += 1;
    }

    async fn handle(
        &self,
        req: http::Request<Incoming>,
        identity: Option<Identity>,
        server: Option<Arc<ServerFacts>>,
    ) -> http::Response<Body> {
        let (parts, body) = req.into_parts();
        let info = RequestInfo::parse(
            &parts.method,
            parts.uri.path(),
            parts.uri.query().unwrap_or_default(),
        );
        self.count(format!("{} {}", parts.method, info.template));
        if parts.uri.path() == "/db/info" {
            return self.db_info(&parts).await;
        }
        if let Some(resource) = &info.resource
            && let Some(fault) = self.faults.kube_route(&info.verb, resource)
        {
            if fault.latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(fault.latency_ms)).await;
            }
            if fault.error_rate > 0.0 && rand::random::<f64>() < fault.error_rate {
                return injected(fault.error_status);
            }
        }
        let body = match http_body_util::Limited::new(body, MAX_REQUEST_BODY)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return status(
                    413,
                    "RequestEntityTooLarge",
                    "the request body is too large",
                );
            }
        };
        let client = if identity.is_some() {
            &self.as_proxy
        } else {
            &self.plain
        };
        let path_and_query = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let mut out = client.request(
            parts.method.clone(),
            format!("{}{path_and_query}", self.upstream),
        );
        for (name, value) in &parts.headers {
            let n = name.as_str();
            if matches!(
                n,
                "host"
                    | "connection"
                    | "content-length"
                    | "transfer-encoding"
                    | "keep-alive"
                    | "upgrade"
            ) || n.starts_with("x-remote-")
            {
                continue;
            }
            out = out.header(name, value);
        }
        if let Some((user, groups)) = &identity {
            out = out.header("X-Remote-User", user);
            for g in groups {
                out = out.header("X-Remote-Group", g);
            }
        }
        let answer = match out.body(body).send().await {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "front proxy: upstream failed");
                return status(
                    503,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                );
            }
        };
        // Committed, but the client hears it failed.
        if answer.status().is_success()
            && let Some(resource) = &info.resource
            && let Some(code) = self.faults.take_kube_after(&info.verb, resource)
        {
            let _ = answer.bytes().await;
            tracing::debug!(verb = %info.verb, %resource, code, "front proxy: committed request answered as failed");
            return injected(code);
        }
        // The apiserver authorized the request (RBAC's `nonResourceURLs`): this server's own.
        if let Some(server) = &server
            && parts.method == http::Method::GET
            && answer.status().is_success()
            && matches!(parts.uri.path(), "/version" | "/metrics")
        {
            return self.server_own(server, parts.uri.path(), answer).await;
        }
        let mut resp = http::Response::builder().status(answer.status());
        for (name, value) in answer.headers() {
            if matches!(
                name.as_str(),
                "connection" | "transfer-encoding" | "keep-alive" | "content-length"
            ) {
                continue;
            }
            resp = resp.header(name, value);
        }
        let stream = answer
            .bytes_stream()
            .map_ok(Frame::data)
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
        resp.body(StreamBody::new(stream).boxed())
            .unwrap_or_else(|_| status(500, "InternalError", "front proxy: bad response"))
    }
}

/// What one simulated k3s server's own apiserver process answers itself: the cluster's shared
/// real apiserver stands in for every server's, so `/version` (the k3s release the server
/// installed) and the per-process `/metrics` gauge `apiserver_requested_deprecated_apis` are
/// answered per listener, after the real apiserver authenticated and authorized the request.
#[derive(Clone, Debug)]
pub struct ServerFacts {
    /// The server's instance name (the key of [`crate::oxide::faults::FaultSpec::deprecated_apis`]).
    pub instance: String,
    /// The k3s release it installed (`v1.34.1+k3s1`).
    pub version: String,
    /// When its k3s process (which runs the apiserver in-process) started: its
    /// `process_start_time_seconds`, and the start of its deprecated-API gauge.
    pub started: std::time::SystemTime,
}

/// The metric family one apiserver process keeps of the deprecated APIs it served
/// (`k8s.io/apiserver` `pkg/endpoints/metrics/metrics.go` `deprecatedRequestGauge`).
pub const DEPRECATED_APIS_METRIC: &str = "apiserver_requested_deprecated_apis";

impl FrontProxy {
    /// `/version` with the server's own release, or `/metrics` with the server's own
    /// deprecated-API samples in place of the shared apiserver's.
    async fn server_own(
        &self,
        server: &ServerFacts,
        path: &str,
        answer: reqwest::Response,
    ) -> http::Response<Body> {
        let content_type = answer
            .headers()
            .get("content-type")
            .cloned()
            .unwrap_or(http::HeaderValue::from_static("text/plain"));
        let Ok(body) = answer.bytes().await else {
            return status(503, "ServiceUnavailable", "front proxy: upstream body lost");
        };
        let out = if path == "/version" {
            own_version(&body, &server.version)
        } else {
            let samples = self
                .faults
                .deprecated_apis_of(&server.instance, server.started);
            own_metrics(&String::from_utf8_lossy(&body), &samples, server.started).into_bytes()
        };
        http::Response::builder()
            .status(200)
            .header("content-type", content_type)
            .body(
                Full::new(Bytes::from(out))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap_or_else(|_| status(500, "InternalError", "front proxy: bad response"))
    }
}

/// The apiserver's `/version` JSON with `version`'s gitVersion, major and minor (and the
/// emulation version, which defaults to the binary's).
fn own_version(real: &[u8], version: &str) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(real) else {
        return real.to_vec();
    };
    let mut parts = version.trim_start_matches('v').split(['.', '+', '-']);
    let (major, minor) = (
        parts.next().unwrap_or_default().to_owned(),
        parts.next().unwrap_or_default().to_owned(),
    );
    if let Some(o) = v.as_object_mut() {
        o.insert("gitVersion".into(), json!(version));
        for (key, value) in [
            ("major", &major),
            ("minor", &minor),
            ("emulationMajor", &major),
            ("emulationMinor", &minor),
        ] {
            if key == "major" || key == "minor" || o.contains_key(key) {
                o.insert(key.into(), json!(value));
            }
        }
    }
    serde_json::to_vec_pretty(&v).unwrap_or_else(|_| real.to_vec())
}

/// The process collector's start-time gauge (client_golang `process_collector.go`, registered
/// by `k8s.io/component-base@v0.33.4` `metrics/legacyregistry/registry.go:54`).
pub const PROCESS_START_METRIC: &str = "process_start_time_seconds";

/// The Prometheus text `real` with the family [`DEPRECATED_APIS_METRIC`] replaced by
/// `samples` (labels in the order client_golang writes them: sorted by name), and
/// [`PROCESS_START_METRIC`] by the server's own process start.
fn own_metrics(
    real: &str,
    samples: &[crate::oxide::faults::DeprecatedApi],
    started: std::time::SystemTime,
) -> String {
    let of = |l: &str, family: &str| {
        l.strip_prefix("# HELP ")
            .or_else(|| l.strip_prefix("# TYPE "))
            .unwrap_or(l)
            .strip_prefix(family)
            .is_some_and(|rest| rest.starts_with([' ', '{']))
    };
    let start = started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let mut out: String = real
        .lines()
        .filter(|l| !of(l, DEPRECATED_APIS_METRIC))
        .map(|l| {
            if l.starts_with(PROCESS_START_METRIC) && of(l, PROCESS_START_METRIC) {
                format!("{PROCESS_START_METRIC} {start:e}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    if !samples.is_empty() {
        out.push_str(&format!(
            "# HELP {DEPRECATED_APIS_METRIC} [STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.\n# TYPE {DEPRECATED_APIS_METRIC} gauge\n"
        ));
        for s in samples {
            out.push_str(&format!(
                "{DEPRECATED_APIS_METRIC}{{group=\"{}\",removed_release=\"{}\",resource=\"{}\",subresource=\"{}\",version=\"{}\"}} 1\n",
                s.group, s.removed_release, s.resource, s.subresource, s.version
            ));
        }
    }
    out
}

fn status(code: u16, reason: &str, message: &str) -> http::Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code});
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(serde_json::to_vec(&body).unwrap_or_default()))
                .map_err(|never| match never {})
                .boxed(),
        )
        .unwrap_or_else(|_| http::Response::new(BoxBody::default()))
}

/// The apiserver's answers for the statuses faults inject (apimachinery's
/// `NewTooManyRequests`, `NewInternalError`, `NewServiceUnavailable`, `NewTimeoutError`).
fn injected(code: u16) -> http::Response<Body> {
    let (reason, message) = match code {
        429 => (
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        ),
        503 => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        504 => (
            "Timeout",
            "the server was unable to return a response in the time allotted, but may still be processing the request",
        ),
        _ => ("InternalError", "Internal error occurred: injected fault"),
    };
    status(code, reason, message)
}

/// What a request is to the apiserver (`k8s.io/apiserver/pkg/endpoints/request`
/// `RequestInfoFactory.NewRequestInfo`): verb and `resource[/subresource]`, plus the path
/// template the counters use.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub verb: String,
    pub resource: Option<String>,
    pub template: String,
}

impl RequestInfo {
    pub fn parse(method: &http::Method, path: &str, query: &str) -> RequestInfo {
        let segs: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let (prefix_len, prefix) = match segs.as_slice() {
            ["api", v, ..] => (2, format!("/api/{v}")),
            ["apis", g, v, ..] => (3, format!("/apis/{g}/{v}")),
            _ => {
                return RequestInfo {
                    verb: method.as_str().to_lowercase(),
                    resource: None,
                    template: format!("/{}", segs.join("/")),
                };
            }
        };
        let rest = &segs[prefix_len..];
        let (ns_part, rest) = match rest {
            ["namespaces", _ns, more @ ..] if !more.is_empty() => ("/namespaces/{namespace}", more),
            _ => ("", rest),
        };
        let (resource, name, sub) = match rest {
            [] => {
                return RequestInfo {
                    verb: method.as_str().to_lowercase(),
                    resource: None,
                    template: prefix,
                };
            }
            [r] => (*r, None, None),
            [r, n] => (*r, Some(*n), None),
            [r, n, s, ..] => (*r, Some(*n), Some(*s)),
        };
        let watch = query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        let verb = match (method.as_str(), name.is_some()) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            (other, _) => {
                return RequestInfo {
                    verb: other.to_lowercase(),
                    resource: Some(resource.to_string()),
                    template: format!("{prefix}{ns_part}/{resource}"),
                };
            }
        };
        let mut template = format!("{prefix}{ns_part}/{resource}");
        if name.is_some() {
            template.push_str("/{name}");
        }
        if let Some(s) = sub {
            template.push('/');
            template.push_str(s);
        }
        RequestInfo {
            verb: verb.to_string(),
            resource: Some(match sub {
                Some(s) => format!("{resource}/{s}"),
                None => resource.to_string(),
            }),
            template,
        }
    }
}

/// A control plane behind a front proxy on an ephemeral `127.0.0.1` port: what a test of a
/// Kubernetes client needs (a URL, an admin kubeconfig, request counters, faults). Dropping it
/// stops the proxy and the control plane.
pub struct LocalApi {
    pub control_plane: ControlPlane,
    pub proxy: Arc<FrontProxy>,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for LocalApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalApi")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for LocalApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LocalApi {
    /// Starts a control plane with `opts` and a proxy injecting `faults` in front of it.
    pub async fn start(
        opts: super::ControlPlaneOptions,
        faults: Faults,
    ) -> Result<LocalApi, ControlPlaneError> {
        let control_plane = ControlPlane::start(opts).await?;
        let proxy = FrontProxy::new(&control_plane, faults)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|source| ControlPlaneError::Io {
                path: "127.0.0.1:0".into(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ControlPlaneError::Io {
                path: "127.0.0.1:0".into(),
                source,
            })?;
        let tls = proxy.tls_config(&["127.0.0.1".into()])?;
        let task = tokio::spawn(Arc::clone(&proxy).serve(listener, tls));
        Ok(LocalApi {
            control_plane,
            proxy,
            url: format!("https://{addr}"),
            task,
        })
    }

    /// Just the apiserver (no controllers, scheduler or KWOK): starts in a few seconds.
    pub async fn apiserver_only() -> Result<LocalApi, ControlPlaneError> {
        Self::start(
            super::ControlPlaneOptions {
                controller_manager: false,
                scheduler: false,
                kwok: false,
                ..Default::default()
            },
            Faults::default(),
        )
        .await
    }

    /// A kubeconfig for `system:admin` at [`Self::url`].
    pub fn admin_kubeconfig(&self) -> String {
        self.control_plane
            .user_kubeconfig(&self.url, "system:admin", &["system:masters"])
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_info_names_verb_resource_and_template_as_the_apiserver_does() {
        let p = |m: &str, path: &str, q: &str| {
            let r = RequestInfo::parse(&m.parse().unwrap_or(http::Method::GET), path, q);
            (r.verb, r.resource.unwrap_or_default(), r.template)
        };
        let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            p("POST", "/api/v1/namespaces/default/pods/p/eviction", ""),
            s(
                "create",
                "pods/eviction",
                "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
            )
        );
        assert_eq!(
            p("GET", "/api/v1/nodes", "labelSelector=a"),
            s("list", "nodes", "/api/v1/nodes")
        );
        assert_eq!(
            p("GET", "/api/v1/pods", "watch=true&resourceVersion=5"),
            s("watch", "pods", "/api/v1/pods")
        );
        assert_eq!(
            p("GET", "/api/v1/namespaces/kube-system", ""),
            s("get", "namespaces", "/api/v1/namespaces/{name}")
        );
        assert_eq!(
            p(
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x",
                ""
            ),
            s(
                "update",
                "leases",
                "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
            )
        );
        assert_eq!(
            p("DELETE", "/apis/batch/v1/namespaces/ns/jobs", ""),
            s(
                "deletecollection",
                "jobs",
                "/apis/batch/v1/namespaces/{namespace}/jobs"
            )
        );
        assert_eq!(p("GET", "/version", ""), s("get", "", "/version"));
    }

    /// A server's `/version` is its own k3s; its `/metrics` carries its own deprecated-API
    /// samples in place of the shared apiserver's, everything else untouched.
    #[test]
    fn a_servers_own_version_and_deprecated_api_samples_replace_the_shared_apiservers() {
        let real = br#"{"major": "1", "minor": "33", "emulationMajor": "1", "emulationMinor": "33", "gitVersion": "v1.33.4+k3s1", "platform": "linux/amd64"}"#;
        let v: serde_json::Value =
            serde_json::from_slice(&own_version(real, "v1.34.1+k3s1")).unwrap_or_default();
        assert_eq!(
            (
                &v["gitVersion"],
                &v["major"],
                &v["minor"],
                &v["emulationMinor"]
            ),
            (
                &json!("v1.34.1+k3s1"),
                &json!("1"),
                &json!("34"),
                &json!("34")
            )
        );
        assert_eq!(v["platform"], "linux/amd64");

        let shared = "# HELP apiserver_request_total x\n# TYPE apiserver_request_total counter\napiserver_request_total{code=\"200\"} 3\n# HELP apiserver_requested_deprecated_apis [STABLE] x\n# TYPE apiserver_requested_deprecated_apis gauge\napiserver_requested_deprecated_apis{group=\"\",removed_release=\"\",resource=\"componentstatuses\",subresource=\"\",version=\"v1\"} 1\n";
        let started = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let shared = format!(
            "{shared}# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.76e+09\n"
        );
        let shared = shared.as_str();
        let none = own_metrics(shared, &[], started);
        assert!(
            none.contains(
                "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e9\n"
            ),
            "{none}"
        );
        assert!(
            none.contains("apiserver_request_total{code=\"200\"} 3"),
            "{none}"
        );
        assert!(!none.contains(DEPRECATED_APIS_METRIC), "{none}");
        let one = own_metrics(
            shared,
            &[crate::oxide::faults::DeprecatedApi {
                group: "apps".into(),
                version: "v1beta1".into(),
                resource: "deployments".into(),
                subresource: String::new(),
                removed_release: "1.34".into(),
            }],
            started,
        );
        assert!(
            one.ends_with("# TYPE apiserver_requested_deprecated_apis gauge\napiserver_requested_deprecated_apis{group=\"apps\",removed_release=\"1.34\",resource=\"deployments\",subresource=\"\",version=\"v1beta1\"} 1\n"),
            "{one}"
        );
        assert!(!one.contains("componentstatuses"), "{one}");
    }
}
