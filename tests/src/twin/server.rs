//! The twin's HTTP face: TLS accept loop, authentication (client certificate or
//! ServiceAccount bearer token), routing of apiserver paths to store operations with RBAC,
//! discovery, health and version endpoints, request counters.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::Twin;
use super::pki::Identity;
use super::rbac::{self, Attributes};
use super::resources::{self, AGGREGATED_CONTENT_TYPE, ResourceType};
use super::select::{FieldSelector, LabelSelector};
use super::status::{self, ApiError};
use super::store::{ListQuery, PatchKind, WriteCtx};

/// The apiserver's request body limit.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Decodes `application/x-www-form-urlencoded` query strings (`+` is a space, `%XX` bytes).
pub(crate) fn parse_query(q: &str) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok());
                    match hex {
                        Some(b) => {
                            out.push(b);
                            i += 2;
                        }
                        None => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(kv), String::new()),
        })
        .collect()
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Health,
    Version,
    Discovery(Value, bool),
    /// `/openapi/v2` (Swagger 2.0 JSON).
    OpenApiV2,
    /// `/openapi/v3` root or one group-version document.
    OpenApiV3(Option<Value>),
    /// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`.
    SelfSubjectAccessReview,
    Resource(ResourceRoute),
    Watch,
    NotFound,
}

/// A request on a resource: collection (no name), object, or subresource.
#[derive(Debug, PartialEq, Eq)]
struct ResourceRoute {
    rid: usize,
    /// Request namespace; empty for cluster-scoped and all-namespace requests.
    ns: String,
    name: String,
    sub: String,
    /// Path template for counters, e.g. `/api/v1/namespaces/{namespace}/pods/{name}/eviction`.
    template: String,
}

fn route(path: &str, aggregated: bool) -> Route {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["version"] => return Route::Version,
        ["openapi", "v2"] => return Route::OpenApiV2,
        ["openapi", "v3"] => return Route::OpenApiV3(Some(resources::openapi_v3_root())),
        ["openapi", "v3", key @ ..] => {
            return Route::OpenApiV3(resources::openapi_v3(&key.join("/")));
        }
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
        ] => {
            return Route::SelfSubjectAccessReview;
        }
        ["api"] => {
            return Route::Discovery(
                if aggregated {
                    resources::aggregated(true)
                } else {
                    resources::core_versions("")
                },
                aggregated,
            );
        }
        ["api", "v1"] => {
            return resources::resource_list("", "v1")
                .map_or(Route::NotFound, |d| Route::Discovery(d, false));
        }
        ["apis"] => {
            return Route::Discovery(
                if aggregated {
                    resources::aggregated(false)
                } else {
                    resources::group_list()
                },
                aggregated,
            );
        }
        ["apis", g] => {
            return resources::group(g).map_or(Route::NotFound, |d| Route::Discovery(d, false));
        }
        ["apis", g, v] => {
            return resources::resource_list(g, v)
                .map_or(Route::NotFound, |d| Route::Discovery(d, false));
        }
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    if rest.first() == Some(&"watch") {
        return Route::Watch;
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let namespaced = |res: &str| {
        resources::by_path(group, version, res).filter(|rid| resources::get(*rid).namespaced)
    };
    let (rid, ns, tail, ns_template) = match rest {
        ["namespaces", ns, res, tail @ ..] if namespaced(res).is_some() => (
            namespaced(res),
            ns.to_string(),
            tail,
            "/namespaces/{namespace}",
        ),
        [res, tail @ ..] => (
            resources::by_path(group, version, res),
            String::new(),
            tail,
            "",
        ),
        _ => return Route::NotFound,
    };
    let Some(rid) = rid else {
        return Route::NotFound;
    };
    let rt = resources::get(rid);
    // A namespaced resource without a namespace only supports the all-namespaces list.
    if rt.namespaced && ns.is_empty() && !tail.is_empty() {
        return Route::NotFound;
    }
    let (name, sub) = match tail {
        [] => ("", ""),
        [name] => (*name, ""),
        [name, sub] if rt.subresources.contains(sub) => (*name, *sub),
        _ => return Route::NotFound,
    };
    let mut template = format!("{prefix}{ns_template}/{}", rt.resource);
    if !name.is_empty() {
        template.push_str("/{name}");
    }
    if !sub.is_empty() {
        template.push('/');
        template.push_str(sub);
    }
    Route::Resource(ResourceRoute {
        rid,
        ns,
        name: name.to_string(),
        sub: sub.to_string(),
        template,
    })
}

/// The RBAC verb of a request on a resource route ("" when the method is not served there).
fn verb_of(method: &Method, r: &ResourceRoute, query: &BTreeMap<String, String>) -> &'static str {
    let truthy = |k: &str| query.get(k).is_some_and(|v| v == "true" || v == "1");
    match (method, !r.name.is_empty()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if truthy("watch") => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::POST, true) if r.sub == "eviction" => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => "",
    }
}

fn json_response(code: u16, body: &Value) -> Response<Full<Bytes>> {
    json_response_typed(code, body, "application/json")
}

fn json_response_typed(code: u16, body: &Value, content_type: &str) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn error_response(err: &ApiError) -> Response<Full<Bytes>> {
    json_response(err.code, &err.to_status())
}

fn text_response(code: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(text.to_string())));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Parses a JSON body, or YAML when the content type says so.
fn parse_body(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        return super::protobuf::decode(body);
    }
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(json_err) => {
            if content_type.contains("yaml") {
                let text = std::str::from_utf8(body)
                    .map_err(|e| ApiError::bad_request(format!("body is not UTF-8: {e}")))?;
                serde_saphyr::from_str::<Value>(text)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
            } else {
                Err(ApiError::bad_request(format!(
                    "couldn't get version/kind; json parse error: {json_err}"
                )))
            }
        }
    }
}

impl Twin {
    /// Serves one request from a peer whose TLS client certificate identified it (if any).
    pub(crate) async fn respond<B>(
        &self,
        req: Request<B>,
        cert_identity: Option<Identity>,
    ) -> Response<Full<Bytes>>
    where
        B: hyper::body::Body + Send,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    return error_response(&ApiError::too_large());
                }
                return error_response(&ApiError::bad_request(format!(
                    "reading the request body: {e}"
                )));
            }
        };
        let path = parts.uri.path().to_string();
        let query = parse_query(parts.uri.query().unwrap_or_default());
        let header_str = |name: header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let accept = header_str(header::ACCEPT);
        let aggregated = accept.contains("as=APIGroupDiscoveryList");
        let route = route(&path, aggregated);

        let template = match &route {
            Route::Resource(r) => r.template.clone(),
            Route::NotFound => "{unknown}".to_string(),
            _ => path.trim_end_matches('/').to_string(),
        };
        self.count(&format!("{} {template}", parts.method));

        if route == Route::Health {
            return text_response(StatusCode::OK, "ok");
        }
        let identity = match cert_identity {
            Some(id) => id,
            None => {
                let auth = header_str(header::AUTHORIZATION);
                match auth
                    .strip_prefix("Bearer ")
                    .and_then(|t| self.token_identity(t.trim()))
                {
                    Some(id) => id,
                    None => return error_response(&ApiError::unauthorized()),
                }
            }
        };
        // Impersonation (`kubectl --as`): the requester needs `impersonate` on the user (or
        // the ServiceAccount); the request then runs as that identity.
        let impersonate = header_str(header::HeaderName::from_static("impersonate-user"));
        let identity = if impersonate.is_empty() {
            identity
        } else {
            match self.impersonate(&identity, &impersonate, &parts.headers) {
                Ok(id) => id,
                Err(e) => return error_response(&e),
            }
        };
        match route {
            Route::Health => text_response(StatusCode::OK, "ok"),
            Route::Version => json_response(200, &self.version_doc()),
            Route::Discovery(doc, true) => json_response_typed(200, &doc, AGGREGATED_CONTENT_TYPE),
            Route::Discovery(doc, false) => json_response(200, &doc),
            Route::OpenApiV3(Some(doc)) => json_response(200, &doc),
            Route::OpenApiV3(None) => error_response(&ApiError::no_route()),
            Route::OpenApiV2
                if accept.is_empty() || accept.contains("json") || accept.contains("*/*") =>
            {
                json_response(200, &resources::openapi_v2())
            }
            Route::OpenApiV2 => text_response(
                StatusCode::NOT_ACCEPTABLE,
                "the twin serves /openapi/v2 as application/json only",
            ),
            Route::SelfSubjectAccessReview if parts.method == Method::POST => {
                match parse_body(&body, &header_str(header::CONTENT_TYPE)) {
                    Ok(review) => json_response(201, &self.access_review(review, &identity)),
                    Err(e) => error_response(&e),
                }
            }
            Route::SelfSubjectAccessReview => error_response(&ApiError::method_not_allowed(
                "only POST (create) is served on selfsubjectaccessreviews",
            )),
            Route::Watch => error_response(&ApiError::method_not_allowed(
                "watch is not supported by the cluster twin; poll with list instead",
            )),
            Route::NotFound => error_response(&ApiError::no_route()),
            Route::Resource(r) => {
                let verb = verb_of(&parts.method, &r, &query);
                let resource = if r.sub.is_empty() {
                    resources::get(r.rid).resource.to_string()
                } else {
                    format!("{}/{}", resources::get(r.rid).resource, r.sub)
                };
                if let Some(fault) = self.inner.cfg.faults.kube_route(verb, &resource) {
                    if fault.latency_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(fault.latency_ms)).await;
                    }
                    if fault.error_rate > 0.0 && rand::random::<f64>() < fault.error_rate {
                        return error_response(&ApiError::injected(fault.error_status));
                    }
                }
                let content_type = header_str(header::CONTENT_TYPE);
                match self.resource_request(
                    &parts.method,
                    &r,
                    &query,
                    &content_type,
                    &body,
                    &identity,
                ) {
                    Ok((code, value)) => json_response(code, &value),
                    Err(err) => error_response(&err),
                }
            }
        }
    }

    /// Maps method + route to a verb, authorizes, runs the store operation.
    fn resource_request(
        &self,
        method: &Method,
        r: &ResourceRoute,
        query: &BTreeMap<String, String>,
        content_type: &str,
        body: &[u8],
        who: &Identity,
    ) -> Result<(u16, Value), ApiError> {
        let rt: &ResourceType = resources::get(r.rid);
        let verb = verb_of(method, r, query);
        if verb.is_empty() {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} {})",
                r.template
            )));
        }
        if verb == "watch" {
            return Err(ApiError::method_not_allowed(
                "watch is not supported by the cluster twin; poll with list instead",
            ));
        }
        if r.sub == "eviction" && verb != "create" {
            return Err(ApiError::method_not_allowed(
                "only POST is supported on pods/eviction",
            ));
        }
        let ctx = WriteCtx {
            dry_run: query.get("dryRun").is_some_and(|v| v == "All"),
            force: query.get("force").is_some_and(|v| v == "true"),
            field_manager: query.get("fieldManager").cloned(),
            subresource: if r.sub.is_empty() {
                None
            } else {
                Some(r.sub.clone())
            },
        };
        let list_query = || -> Result<ListQuery, ApiError> {
            let fields = FieldSelector::parse(
                query
                    .get("fieldSelector")
                    .map(String::as_str)
                    .unwrap_or_default(),
            )
            .map_err(ApiError::bad_request)?;
            fields
                .check(rt.group, rt.resource)
                .map_err(ApiError::bad_request)?;
            Ok(ListQuery {
                labels: LabelSelector::parse(
                    query
                        .get("labelSelector")
                        .map(String::as_str)
                        .unwrap_or_default(),
                )
                .map_err(ApiError::bad_request)?,
                fields,
                limit: match query.get("limit") {
                    Some(l) => Some(
                        l.parse()
                            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
                    ),
                    None => None,
                },
                continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
            })
        };
        let patch_kind = if verb == "patch" {
            let base = content_type.split(';').next().unwrap_or_default().trim();
            Some(match base {
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/json-patch+json" => PatchKind::Json,
                "application/apply-patch+yaml" | "application/apply-patch+cbor" => PatchKind::Apply,
                other => return Err(ApiError::unsupported_media_type(other)),
            })
        } else {
            None
        };
        // Parse before taking the lock: bodies can be large.
        let parsed = parse_body(body, content_type)?;

        let mut store = self.lock_store();
        let attrs = Attributes {
            verb,
            group: rt.group,
            resource: rt.resource,
            subresource: &r.sub,
            namespace: &r.ns,
            name: &r.name,
        };
        rbac::authorize(&store, who, &attrs)?;
        let ns_filter = if r.ns.is_empty() {
            None
        } else {
            Some(r.ns.as_str())
        };
        match verb {
            "get" => Ok((200, store.get(r.rid, &r.ns, &r.name)?)),
            "list" => Ok((200, store.list(r.rid, ns_filter, &list_query()?)?)),
            "create" if r.sub == "eviction" => {
                store.evict(&r.ns, &r.name, &parsed, ctx.dry_run)?;
                Ok((201, status::success(201, None)))
            }
            "create" => Ok((201, store.create(r.rid, &r.ns, parsed, &ctx, false)?)),
            "update" => Ok((200, store.replace(r.rid, &r.ns, &r.name, parsed, &ctx)?)),
            "patch" => {
                let kind = patch_kind.unwrap_or(PatchKind::Merge);
                let (obj, created) = store.patch(r.rid, &r.ns, &r.name, kind, parsed, &ctx)?;
                Ok((if created { 201 } else { 200 }, obj))
            }
            "delete" => {
                let deleted = store.delete(r.rid, &r.ns, &r.name, &parsed, ctx.dry_run)?;
                if matches!(rt.resource, "pods" | "namespaces") {
                    Ok((200, deleted))
                } else {
                    let uid = deleted
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    Ok((
                        200,
                        status::success(200, Some((&r.name, rt.group, rt.resource, uid))),
                    ))
                }
            }
            "deletecollection" => Ok((
                200,
                store.delete_collection(r.rid, ns_filter, &list_query()?, ctx.dry_run)?,
            )),
            _ => Err(ApiError::internal(format!("unhandled verb {verb}"))),
        }
    }

    /// Checks that `who` may impersonate `user` and builds the impersonated identity
    /// (a ServiceAccount gets its groups; `Impersonate-Group` headers add more).
    fn impersonate(
        &self,
        who: &Identity,
        user: &str,
        headers: &http::HeaderMap,
    ) -> Result<Identity, ApiError> {
        let sa = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'));
        let attrs = match sa {
            Some((ns, name)) => Attributes {
                verb: "impersonate",
                group: "",
                resource: "serviceaccounts",
                subresource: "",
                namespace: ns,
                name,
            },
            None => Attributes {
                verb: "impersonate",
                group: "",
                resource: "users",
                subresource: "",
                namespace: "",
                name: user,
            },
        };
        let store = self.lock_store();
        if !rbac::allowed(&store, who, &attrs) {
            return Err(ApiError::forbidden(
                format!(
                    "{} \"{user}\" is forbidden: User \"{}\" cannot impersonate resource \"{}\" in API group \"\"{}",
                    attrs.resource,
                    who.user,
                    attrs.resource,
                    if attrs.namespace.is_empty() {
                        " at the cluster scope".to_owned()
                    } else {
                        format!(" in the namespace \"{}\"", attrs.namespace)
                    }
                ),
                user,
                "",
                attrs.resource,
            ));
        }
        let mut identity = match sa {
            Some((ns, name)) => Identity::service_account(ns, name),
            None => Identity {
                user: user.to_owned(),
                groups: vec!["system:authenticated".into()],
            },
        };
        for g in headers.get_all("impersonate-group") {
            if let Ok(g) = g.to_str() {
                identity.groups.push(g.to_owned());
            }
        }
        Ok(identity)
    }

    /// A SelfSubjectAccessReview: whether the requester may do what `spec` describes.
    fn access_review(&self, mut review: Value, who: &Identity) -> Value {
        let ra = review["spec"]["resourceAttributes"].clone();
        let s = |k: &str| ra[k].as_str().unwrap_or_default().to_owned();
        let (verb, group, resource, sub, ns, name) = (
            s("verb"),
            s("group"),
            s("resource"),
            s("subresource"),
            s("namespace"),
            s("name"),
        );
        let allowed = if ra.is_object() {
            let store = self.lock_store();
            rbac::allowed(
                &store,
                who,
                &Attributes {
                    verb: &verb,
                    group: &group,
                    resource: &resource,
                    subresource: &sub,
                    namespace: &ns,
                    name: &name,
                },
            )
        } else {
            // Non-resource URLs: only cluster admins here.
            who.groups.iter().any(|g| g == "system:masters")
        };
        review["apiVersion"] = json!("authorization.k8s.io/v1");
        review["kind"] = json!("SelfSubjectAccessReview");
        review["metadata"] = json!({"creationTimestamp": null});
        review["status"] = json!({"allowed": allowed});
        review
    }

    fn version_doc(&self) -> Value {
        let v = &self.inner.cfg.k3s_version;
        let mut parts = v.trim_start_matches('v').split(['.', '+', '-']);
        let major = parts.next().unwrap_or("1").to_string();
        let minor = parts.next().unwrap_or("0").to_string();
        json!({
            "major": major,
            "minor": minor,
            "emulationMajor": major,
            "emulationMinor": minor,
            "gitVersion": v,
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2025-08-01T00:00:00Z",
            "goVersion": "go1.24.5",
            "compiler": "gc",
            "platform": "linux/amd64",
        })
    }

    /// TLS + HTTP/1.1 on one accepted connection.
    async fn serve_connection(
        self,
        tcp: tokio::net::TcpStream,
        acceptor: tokio_rustls::TlsAcceptor,
    ) {
        let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "twin: TLS handshake failed");
                return;
            }
            Err(_) => return,
        };
        let identity = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|der| self.inner.pki.identify(der));
        let twin = self.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let twin = twin.clone();
            let identity = identity.clone();
            async move { Ok::<_, Infallible>(twin.respond(req, identity).await) }
        });
        if let Err(e) = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tls), service)
            .await
        {
            tracing::debug!(error = %e, "twin: connection ended with an error");
        }
    }

    /// Accept loop; connections live in a JoinSet owned by this future, so aborting the
    /// task that runs `serve` also drops every open connection (like killing k3s).
    pub(crate) async fn accept_loop(
        self,
        listener: tokio::net::TcpListener,
        tls: Arc<rustls::ServerConfig>,
    ) {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let mut connections = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _peer)) => {
                        let _ = tcp.set_nodelay(true);
                        connections.spawn(self.clone().serve_connection(tcp, acceptor.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "twin: accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(path: &str) -> Option<ResourceRoute> {
        match route(path, false) {
            Route::Resource(r) => Some(r),
            _ => None,
        }
    }

    #[test]
    fn routes_and_templates() {
        let r = resource("/api/v1/namespaces/kube-system/configmaps/state");
        assert_eq!(
            r.as_ref().map(|r| (r.ns.as_str(), r.name.as_str())),
            Some(("kube-system", "state"))
        );
        assert_eq!(
            r.map(|r| r.template),
            Some("/api/v1/namespaces/{namespace}/configmaps/{name}".to_string())
        );
        let r = resource("/api/v1/namespaces/default/pods/p/eviction");
        assert_eq!(
            r.map(|r| r.template),
            Some("/api/v1/namespaces/{namespace}/pods/{name}/eviction".to_string())
        );
        let r = resource("/api/v1/namespaces/kube-system");
        assert_eq!(
            r.map(|r| (r.template, r.name)),
            Some((
                "/api/v1/namespaces/{name}".to_string(),
                "kube-system".to_string()
            ))
        );
        let r = resource("/api/v1/pods");
        assert_eq!(r.map(|r| r.template), Some("/api/v1/pods".to_string()));
        let r = resource("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x");
        assert!(r.is_some());
        let r = resource("/api/v1/nodes/n1/status");
        assert_eq!(r.map(|r| r.sub), Some("status".to_string()));
        assert!(resource("/api/v1/configmaps/x").is_none());
        assert!(resource("/api/v1/namespaces/default/configmaps/x/status").is_none());
        assert!(resource("/api/v1/widgets").is_none());
        assert_eq!(route("/api/v1/watch/pods", false), Route::Watch);
        assert_eq!(route("/readyz", false), Route::Health);
    }

    #[test]
    fn query_decoding() {
        let q = parse_query("labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29&limit=5&watch");
        assert_eq!(
            q.get("labelSelector").map(String::as_str),
            Some("app=web,tier in (a,b)")
        );
        assert_eq!(q.get("limit").map(String::as_str), Some("5"));
        assert_eq!(q.get("watch").map(String::as_str), Some(""));
        assert_eq!(parse_query("a=%").get("a").map(String::as_str), Some("%"));
        assert_eq!(parse_query("a=%4").get("a").map(String::as_str), Some("%4"));
    }
}
