//! The webhook's one error type and its one mapping to an HTTP status and a short public
//! message. The type itself knows nothing about HTTP; [`WebhookError::public`] is the only
//! place a status is chosen. Detailed causes (Kubernetes errors, YAML problems) stay in the
//! variant for the log and never reach the caller; nothing here ever holds a token.

use crate::ports::state::StateError;
use crate::workflows::scale::ScaleError;

/// Why a credential was refused (for the log and for `WWW-Authenticate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header.
    Missing,
    /// `Authorization` present but not `Bearer <token>` (or the token is empty).
    Malformed,
    /// A well-formed bearer token that does not match.
    Wrong,
    /// A credential-looking query parameter: tokens in URLs end up in logs and histories.
    InQuery,
}

/// Everything that can go wrong in a webhook request.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("no route for this path")]
    NotFound,
    #[error("method not allowed here (allowed: {allow})")]
    MethodNotAllowed { allow: &'static str },
    #[error("unauthenticated request ({reason:?})")]
    Unauthenticated { reason: AuthFailure },
    /// The read-only token on a request that writes.
    #[error("the read-only token cannot change anything")]
    ReadOnlyToken,
    #[error("cannot read the webhook token from Secret kube-system/oxide-controller-webhook-auth")]
    AuthUnavailable(#[source] StateError),
    #[error(
        "Secret kube-system/oxide-controller-webhook-auth's webhook-token is empty, missing or not mounted; refusing every request until it is set (bootstrap creates it)"
    )]
    AuthNotConfigured,
    #[error("request body of {size} bytes is over the {limit}-byte limit")]
    PayloadTooLarge { size: u64, limit: usize },
    #[error("content type {got:?} is not accepted; expected {expected}")]
    UnsupportedMediaType { got: String, expected: &'static str },
    #[error("malformed request: expected {expected}")]
    BadRequest { expected: &'static str },
    #[error("this endpoint takes no query parameters")]
    QueryNotAllowed,
    #[error("the request could not be read")]
    BodyUnreadable,
    #[error("no status yet: no reconcile run has written status.json")]
    NoStatus,
    #[error("no CronJob to start a reconcile Job from")]
    NoCronJob,
    #[error("starting the reconcile Job failed: {message}")]
    TriggerFailed { message: String },
    #[error("the request took longer than {after:?}")]
    Timeout { after: std::time::Duration },
    #[error(transparent)]
    Scale(#[from] ScaleError),
}

/// What a caller is told: status, a stable code, a short message and the extra headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicError {
    pub status: u16,
    /// Stable, machine-readable (`out_of_bounds`, `unauthorized`, ...).
    pub code: &'static str,
    pub message: String,
    /// `Allow` header value for 405.
    pub allow: Option<&'static str>,
    /// `WWW-Authenticate` header value for 401.
    pub www_authenticate: Option<&'static str>,
    /// `Retry-After` seconds for 503s worth retrying.
    pub retry_after: Option<u32>,
    /// Further members of the JSON body (e.g. the bounds of an autoscaling pool).
    pub details: Option<serde_json::Map<String, serde_json::Value>>,
}

impl PublicError {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        PublicError {
            status,
            code,
            message: message.into(),
            allow: None,
            www_authenticate: None,
            retry_after: None,
            details: None,
        }
    }

    fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

/// Shows a pool name from a URL only if it looks like a pool name (no echoing of arbitrary input).
fn shown_pool(pool: &str) -> String {
    if !pool.is_empty()
        && pool.len() <= 63
        && pool
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        format!("pool {pool:?}")
    } else {
        "that pool".to_owned()
    }
}

impl WebhookError {
    /// The one mapping to what the caller sees.
    pub fn public(&self) -> PublicError {
        match self {
            WebhookError::NotFound => PublicError::new(404, "not_found", "no such endpoint"),
            WebhookError::MethodNotAllowed { allow } => PublicError {
                allow: Some(allow),
                ..PublicError::new(
                    405,
                    "method_not_allowed",
                    format!("method not allowed; use {allow}"),
                )
            },
            WebhookError::Unauthenticated { reason } => unauthenticated(reason),
            WebhookError::ReadOnlyToken => PublicError::new(
                403,
                "read_only_token",
                "this token may only read (GET); changes need the webhook's write token",
            ),
            WebhookError::AuthUnavailable(_) => PublicError::new(
                503,
                "auth_unavailable",
                "cannot verify credentials right now",
            )
            .retry_after(5),
            WebhookError::AuthNotConfigured => PublicError::new(
                503,
                "auth_not_configured",
                "the webhook token is not configured",
            ),
            WebhookError::PayloadTooLarge { limit, .. } => PublicError::new(
                413,
                "payload_too_large",
                format!("request body is larger than {limit} bytes"),
            ),
            WebhookError::UnsupportedMediaType { expected, .. } => PublicError::new(
                415,
                "unsupported_media_type",
                format!("unsupported content type; expected {expected}"),
            ),
            WebhookError::BadRequest { expected } => PublicError::new(
                400,
                "bad_request",
                format!("malformed request: expected {expected}"),
            ),
            WebhookError::QueryNotAllowed => PublicError::new(
                400,
                "bad_request",
                "this endpoint takes no query parameters",
            ),
            WebhookError::BodyUnreadable => {
                PublicError::new(400, "bad_request", "the request body could not be read")
            }
            WebhookError::NoStatus => PublicError::new(
                404,
                "no_status",
                "no status yet: no reconcile run has written status.json",
            ),
            WebhookError::NoCronJob => PublicError::new(
                409,
                "no_cronjob",
                "no reconcile was triggered: CronJob oxide-controller-jobs/oxide-controller does not exist; run reconcile-once",
            ),
            WebhookError::TriggerFailed { .. } => PublicError::new(
                503,
                "trigger_failed",
                "starting a reconcile Job failed; try again",
            )
            .retry_after(5),
            WebhookError::Timeout { .. } => {
                PublicError::new(503, "timeout", "the request timed out; try again").retry_after(1)
            }
            WebhookError::Scale(e) => scale_public(e),
        }
    }
}

/// A 401 and its `WWW-Authenticate` challenge, by why authentication failed.
fn unauthenticated(reason: &AuthFailure) -> PublicError {
    let (message, header) = match reason {
        AuthFailure::Missing => ("missing bearer token", r#"Bearer realm="oxide-controller""#),
        AuthFailure::Malformed => (
            "expected an Authorization header of the form: Bearer <token>",
            r#"Bearer realm="oxide-controller", error="invalid_request""#,
        ),
        AuthFailure::Wrong => (
            "invalid bearer token",
            r#"Bearer realm="oxide-controller", error="invalid_token""#,
        ),
        AuthFailure::InQuery => (
            "tokens are not accepted in the URL; send Authorization: Bearer <token>",
            r#"Bearer realm="oxide-controller", error="invalid_request""#,
        ),
    };
    PublicError {
        www_authenticate: Some(header),
        ..PublicError::new(401, "unauthorized", message)
    }
}

/// What a refused scale request tells the caller.
fn scale_public(e: &ScaleError) -> PublicError {
    use crate::domain::spec::CountError;
    match e {
        ScaleError::Count(CountError::UnknownPool { pool, known }) => PublicError::new(
            404,
            "unknown_pool",
            format!("{} does not exist; pools are: {known}", shown_pool(pool)),
        ),
        ScaleError::Count(CountError::OutOfBounds {
            pool,
            count,
            min,
            max,
        }) => PublicError::new(
            422,
            "out_of_bounds",
            format!("count {count} for pool {pool:?} is outside its bounds [{min}, {max}]"),
        ),
        ScaleError::Count(CountError::EvenControlPlane { pool, count }) => PublicError::new(
            422,
            "even_control_plane",
            format!("the control-plane pool {pool:?} needs an odd count, not {count}"),
        ),
        ScaleError::Autoscaling { pool, min, max } => {
            let bounds = format!("/pools/{pool}/autoscale");
            let mut details = serde_json::Map::new();
            details.insert("pool".into(), pool.as_str().into());
            details.insert("min".into(), (*min).into());
            details.insert("max".into(), (*max).into());
            details.insert("bounds".into(), bounds.as_str().into());
            PublicError {
                details: Some(details),
                ..PublicError::new(
                    409,
                    "autoscaling",
                    format!(
                        "pool {pool:?} autoscales between min {min} and max {max}, so the autoscaler sets its count; change the bounds with PUT {bounds}, or send {{\"enabled\": false}} there to set the count by hand"
                    ),
                )
            }
        }
        ScaleError::InvalidAutoscale { field, message } => {
            let mut details = serde_json::Map::new();
            details.insert("field".into(), field.as_str().into());
            PublicError {
                details: Some(details),
                ..PublicError::new(400, "invalid_field", format!("{field}: {message}"))
            }
        }
        ScaleError::ControlPlaneLocked { .. }
        | ScaleError::AboveCeiling { .. }
        | ScaleError::SubnetTooSmall { .. } => limit_public(e),
        ScaleError::NoWorkerPool => PublicError::new(
            404,
            "no_worker_pool",
            "the cluster has no worker pool; use /pools/{pool}",
        ),
        ScaleError::Busy { .. } => PublicError::new(
            503,
            "busy",
            "the cluster state kept changing while writing; try again",
        )
        .retry_after(1),
        ScaleError::State(StateError::NotFound { .. }) | ScaleError::NoScaleObject => {
            missing_public(e)
        }
        ScaleError::State(_) => PublicError::new(
            503,
            "state_unavailable",
            "cannot read or write the cluster state right now",
        )
        .retry_after(5),
        ScaleError::NoSpec | ScaleError::Spec(_) | ScaleError::Project(_) => PublicError::new(
            500,
            "spec_invalid",
            "the stored cluster spec is unusable; see the webhook's log",
        ),
        // The fields and what to set are the administrator's, not secrets: name them.
        ScaleError::VersionGate(errs) => PublicError::new(
            409,
            "version_refused",
            format!(
                "the stored spec's Kubernetes versions are refused, so nothing is written into it until an administrator fixes them: {}",
                errs.0
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
        ScaleError::Nodes(_) => PublicError::new(
            503,
            "nodes_unavailable",
            "cannot list the Nodes to check the spec's versions right now",
        )
        .retry_after(5),
    }
}

/// What a change tells the caller when the state it needs is not there.
fn missing_public(e: &ScaleError) -> PublicError {
    let message = match e {
        ScaleError::NoScaleObject => {
            "this cluster has no place for the webhook's counts yet; an administrator re-runs bootstrap to create it"
        }
        _ => "the cluster state does not exist yet (bootstrap not run?)",
    };
    PublicError::new(503, "state_missing", message)
}

/// What a change beyond the webhook's limits tells the caller (see
/// [`crate::workflows::scale::webhook_may`]).
fn limit_public(e: &ScaleError) -> PublicError {
    match e {
        ScaleError::ControlPlaneLocked { .. } => PublicError::new(
            403,
            "control_plane",
            "the control plane cannot be changed through the webhook; an administrator changes it with the scale CLI",
        ),
        ScaleError::AboveCeiling {
            pool,
            field,
            value,
            ceiling,
            ..
        } => {
            let mut details = serde_json::Map::new();
            details.insert("field".into(), (*field).into());
            details.insert("ceiling".into(), (*ceiling).into());
            PublicError {
                details: Some(details),
                ..PublicError::new(
                    422,
                    "above_ceiling",
                    format!(
                        "{field} {value} for pool {pool:?} is above the administrator's ceiling of {ceiling}; only an administrator can raise it (spec.yaml webhook.ceiling)"
                    ),
                )
            }
        }
        ScaleError::SubnetTooSmall { field, message } => {
            let mut details = serde_json::Map::new();
            details.insert("field".into(), field.as_str().into());
            PublicError {
                details: Some(details),
                ..PublicError::new(422, "subnet_too_small", format!("{field}: {message}"))
            }
        }
        _ => PublicError::new(422, "not_allowed", "this change is not allowed here"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_names_from_urls_are_shown_only_when_they_look_like_pool_names() {
        assert_eq!(shown_pool("gpu"), "pool \"gpu\"");
        assert_eq!(shown_pool("<script>"), "that pool");
        assert_eq!(shown_pool(&"a".repeat(64)), "that pool");
    }

    #[test]
    fn detailed_causes_stay_out_of_public_messages() {
        let e = WebhookError::TriggerFailed {
            message: "jobs.batch is forbidden: User system:serviceaccount:kube-system:x".into(),
        };
        assert!(!e.public().message.contains("forbidden"));
        assert!(
            e.to_string().contains("forbidden"),
            "the log keeps the detail"
        );
    }
}
