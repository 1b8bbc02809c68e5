//! Nexus-shaped API errors: status, `error_code` and message, rendered as the body
//! `{"request_id", "error_code"?, "message"}` with an `x-request-id` header.
//!
//! Message texts follow omicron's `Error` → `HttpError` mapping (e.g. `not found: instance
//! with name "x"`, `already exists: disk "d"`), so products that match on them behave the
//! same against the simulator as against a rack.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use uuid::Uuid;

/// One failed API request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Nexus error code (`ObjectNotFound`, ...); `None` for framework-level errors such as
    /// an unparseable body, exactly like dropshot.
    pub code: Option<&'static str>,
    /// Public message.
    pub message: String,
    /// Methods for the `Allow` headers of a 405, one header each, in dropshot's order
    /// (its router keeps a node's methods in a `BTreeMap`).
    pub allow: Vec<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, code: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            allow: Vec::new(),
        }
    }

    /// 404 `ObjectNotFound` for a lookup by name.
    pub fn not_found_by_name(kind: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            Some("ObjectNotFound"),
            format!("not found: {kind} with name \"{name}\""),
        )
    }

    /// 404 `ObjectNotFound` for a lookup by id.
    pub fn not_found_by_id(kind: &str, id: &Uuid) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            Some("ObjectNotFound"),
            format!("not found: {kind} with id \"{id}\""),
        )
    }

    /// 400 `ObjectAlreadyExists` (nexus answers 400, not 409, for name conflicts).
    pub fn already_exists(kind: &str, name: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            Some("ObjectAlreadyExists"),
            format!("already exists: {kind} \"{name}\""),
        )
    }

    /// 400 `InvalidRequest`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Some("InvalidRequest"), message)
    }

    /// 400 `InvalidValue` for the parameter `label`.
    pub fn invalid_value(label: &str, message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            Some("InvalidValue"),
            format!("unsupported value for \"{label}\": {message}"),
        )
    }

    /// 401 for missing or wrong credentials.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            Some("Unauthorized"),
            "credentials missing or invalid",
        )
    }

    /// 409 `Conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, Some("Conflict"), message)
    }

    /// 503 `ServiceNotAvailable`. Nexus hides the internal reason behind a fixed message.
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Some("ServiceNotAvailable"),
            "Service Unavailable",
        )
    }

    /// 507 `InsufficientCapacity`.
    pub fn insufficient_capacity(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INSUFFICIENT_STORAGE,
            Some("InsufficientCapacity"),
            message,
        )
    }

    /// 500 `Internal`; the detail never leaves the server.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("Internal"),
            "Internal Server Error",
        )
    }

    /// 400 without an error code: the JSON body could not be parsed (dropshot).
    pub fn bad_body(detail: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            None,
            format!("unable to parse JSON body: {detail}"),
        )
    }

    /// 400 without an error code: the query string could not be parsed (dropshot).
    pub fn bad_query(detail: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            None,
            format!("unable to parse query string: {detail}"),
        )
    }

    /// 400 without an error code: a path parameter could not be parsed (dropshot).
    pub fn bad_path(detail: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            None,
            format!("bad parameter in URL path: {detail}"),
        )
    }

    /// 400 without an error code for a framework-level header problem.
    pub fn bad_header(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, None, detail)
    }

    /// 404 for a path no route matches.
    pub fn route_not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, None, "Not Found")
    }

    /// 405 for a path that exists with another method, with one `Allow` header per method
    /// the path has (dropshot appends them, sorted by method name).
    pub fn method_not_allowed(allow: Vec<&'static str>) -> Self {
        let mut allow = allow;
        allow.sort_unstable();
        allow.dedup();
        Self {
            allow,
            ..Self::new(StatusCode::METHOD_NOT_ALLOWED, None, "Method Not Allowed")
        }
    }

    /// An injected failure with an arbitrary status, shaped like the real error of that status.
    pub fn injected(status: u16) -> Self {
        match status {
            503 => Self::unavailable(),
            507 => Self::insufficient_capacity("Insufficient capacity"),
            409 => Self::conflict("Conflict"),
            401 => Self::unauthorized(),
            404 => Self::route_not_found(),
            _ => {
                let status = StatusCode::from_u16(status)
                    .ok()
                    .filter(|s| s.is_client_error() || s.is_server_error())
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                if status == StatusCode::INTERNAL_SERVER_ERROR {
                    Self::internal()
                } else {
                    let reason = status.canonical_reason().unwrap_or("Error");
                    Self::new(status, None, reason)
                }
            }
        }
    }

    /// Renders the error as a response carrying `request_id`.
    pub fn into_response(self, request_id: &Uuid) -> Response<Bytes> {
        let body = oxide::types::Error {
            error_code: self.code.map(str::to_owned),
            message: self.message,
            request_id: request_id.to_string(),
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
        let mut resp = json_response(self.status, Bytes::from(bytes), request_id);
        for method in self.allow {
            resp.headers_mut()
                .append(http::header::ALLOW, HeaderValue::from_static(method));
        }
        resp
    }
}

/// A JSON response (or an empty one for 204) with the `x-request-id` header set.
pub fn json_response(status: StatusCode, body: Bytes, request_id: &Uuid) -> Response<Bytes> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    if status != StatusCode::NO_CONTENT {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    if let Ok(v) = HeaderValue::from_str(&request_id.to_string()) {
        headers.insert("x-request-id", v);
    }
    resp
}
