//! Kubernetes API errors as the apiserver reports them: a `meta/v1 Status` body with the
//! exact reasons, codes and message shapes clients (kube's `Error::Api`) match on.

use serde_json::{Value, json};

use super::resources::ResourceType;

/// A failed API request: becomes a `Status` body with `code` as the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `(name, group, kind)` for `details`, when the error is about one object.
    pub details: Option<Box<(String, String, String)>>,
    /// `details.causes` as `(reason, message)` pairs.
    pub causes: Vec<(String, String)>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            causes: Vec::new(),
        }
    }

    fn with_details(mut self, name: &str, group: &str, kind: &str) -> Self {
        self.details = Some(Box::new((
            name.to_string(),
            group.to_string(),
            kind.to_string(),
        )));
        self
    }

    /// 404: `configmaps "x" not found`.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(rt)),
        )
        .with_details(name, rt.group, rt.resource)
    }

    /// 404 for a path the twin does not serve.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409: `configmaps "x" already exists`.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(rt)),
        )
        .with_details(name, rt.group, rt.resource)
    }

    /// 409: optimistic-concurrency failure, worded exactly like the apiserver.
    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                qualified(rt)
            ),
        )
        .with_details(name, rt.group, rt.resource)
    }

    /// 409 for a failed delete precondition.
    pub fn precondition(rt: &ResourceType, name: &str, what: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {what}",
                qualified(rt)
            ),
        )
        .with_details(name, rt.group, rt.resource)
    }

    /// 422: `ConfigMap "X" is invalid: metadata.name: Invalid value: ...`.
    pub fn invalid(rt: &ResourceType, name: &str, cause: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {cause}", qualified_kind(rt)),
        )
        .with_details(name, rt.group, rt.kind)
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden with the RBAC authorizer's message.
    pub fn forbidden(message: String, name: &str, group: &str, resource: &str) -> Self {
        let mut err = Self::new(403, "Forbidden", message);
        if !name.is_empty() || !resource.is_empty() {
            err = err.with_details(name, group, resource);
        }
        err
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 429 TooManyRequests (eviction blocked by a disruption budget). Like the
    /// apiserver, no `retryAfterSeconds` (so no Retry-After header), one cause.
    pub fn too_many_requests(message: impl Into<String>, cause: (&str, String)) -> Self {
        let mut err = Self::new(429, "TooManyRequests", message);
        err.causes.push((cause.0.to_string(), cause.1));
        err
    }

    /// A bare failure `Status` a REST handler returns itself (no reason), e.g. eviction's
    /// 500 for a pod under several disruption budgets.
    pub fn failure(code: u16, message: impl Into<String>) -> Self {
        Self::new(code, "", message)
    }

    /// An injected fault (admin API): the Status the apiserver sends for `code`.
    pub fn injected(code: u16) -> Self {
        let (reason, message) = match code {
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            ),
            500 => ("InternalError", "Internal error occurred: injected fault"),
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
        Self::new(code, reason, message)
    }

    /// 410 Expired: a list `continue` token older than the compaction window.
    pub fn expired_continue() -> Self {
        Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
        )
    }

    /// 409 Conflict of a server-side apply with fields other managers own
    /// (`(manager, apiVersion, path)` each), as the field manager words it.
    pub fn apply_conflicts(
        rt: &ResourceType,
        name: &str,
        conflicts: &[(String, String, Vec<String>)],
    ) -> Self {
        let path = |p: &[String]| format!(".{}", p.join("."));
        let message = if let [(m, v, p)] = conflicts {
            format!(
                "Apply failed with 1 conflict: conflict with \"{m}\" using {v}: {}",
                path(p)
            )
        } else {
            let lines: Vec<String> = conflicts
                .iter()
                .map(|(m, v, p)| format!("* {m} using {v}: {}", path(p)))
                .collect();
            format!(
                "Apply failed with {} conflicts: conflicts with {}",
                conflicts.len(),
                lines.join("\n")
            )
        };
        let mut err = Self::new(409, "Conflict", message).with_details(name, rt.group, rt.resource);
        for (m, v, _) in conflicts {
            err.causes.push((
                "FieldManagerConflict".into(),
                format!("conflict with \"{m}\" using {v}"),
            ));
        }
        err
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty()
            && let Some(map) = status.as_object_mut()
        {
            map.remove("reason");
        }
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            let (name, group, kind) = details.as_ref();
            let mut details = serde_json::Map::new();
            if !name.is_empty() {
                details.insert("name".into(), json!(name));
            }
            if !group.is_empty() {
                details.insert("group".into(), json!(group));
            }
            details.insert("kind".into(), json!(kind));
            map.insert("details".into(), Value::Object(details));
        }
        if !self.causes.is_empty()
            && let Some(map) = status.as_object_mut()
        {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|(reason, message)| json!({"reason": reason, "message": message}))
                .collect();
            let details = map.entry("details").or_insert_with(|| json!({}));
            if let Some(d) = details.as_object_mut() {
                d.insert("causes".into(), Value::Array(causes));
            }
        }
        status
    }
}

/// `Kind.group` the way the apiserver names a GroupKind in validation messages.
pub(crate) fn qualified_kind(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        rt.kind.to_string()
    } else {
        format!("{}.{}", rt.kind, rt.group)
    }
}

/// `resource.group` the way the apiserver names a GroupResource in messages.
pub(crate) fn qualified(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        rt.resource.to_string()
    } else {
        format!("{}.{}", rt.resource, rt.group)
    }
}

/// A `Status` reporting success (deletes of non-graceful resources, evictions).
pub(crate) fn success(code: u16, details: Option<(&str, &str, &str, &str)>) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    });
    if let (Some((name, group, kind, uid)), Some(map)) = (details, status.as_object_mut()) {
        let mut d = serde_json::Map::new();
        d.insert("name".into(), json!(name));
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        d.insert("kind".into(), json!(kind));
        if !uid.is_empty() {
            d.insert("uid".into(), json!(uid));
        }
        map.insert("details".into(), Value::Object(d));
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::resources::{RESOURCES, by_path};

    #[test]
    fn conflict_status_matches_the_apiserver_wording() {
        let cm = &RESOURCES[by_path("", "v1", "configmaps").unwrap_or_default()];
        let status = ApiError::conflict(cm, "state").to_status();
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["code"], 409);
        assert_eq!(
            status["message"],
            "Operation cannot be fulfilled on configmaps \"state\": the object has been modified; \
             please apply your changes to the latest version and try again"
        );
        assert_eq!(status["details"]["kind"], "configmaps");
        assert_eq!(status["details"]["name"], "state");
    }

    #[test]
    fn group_qualified_names_in_messages() {
        let lease = &RESOURCES[by_path("coordination.k8s.io", "v1", "leases").unwrap_or_default()];
        let status = ApiError::not_found(lease, "l").to_status();
        assert_eq!(
            status["message"],
            "leases.coordination.k8s.io \"l\" not found"
        );
        assert_eq!(status["details"]["group"], "coordination.k8s.io");
    }
}
