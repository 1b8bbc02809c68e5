//! The end of the cluster's Oxide token, watched by the reconcile (audit security-2, the rest
//! of H2: "no check or warning about scope or expiry"). A cluster nobody looks at for years
//! must say, well before it happens, that its rack credential is about to stop working: after
//! that no run replaces a VM, no backup uploads.
//!
//! **What the rack tells.** `GET /v1/me/access-tokens` lists the calling user's own device
//! tokens (id, `time_created`, `time_expires`, null for one that never expires) and leaves out
//! expired ones; an expired token is refused with 401
//! (omicron@065b4d7b `nexus/db-queries/src/db/datastore/device_auth.rs`,
//! `current_user_token_list`: `time_expires.is_null().or(time_expires.gt(now))`;
//! omicron@14861487 `nexus/tests/integration_tests/device_auth.rs`,
//! `test_device_token_expiration`: the expired token's `project_list` answers 401 and the list
//! shrinks by it). The list never shows the bearer value, so which entry is the cluster's comes
//! from Secret key `oxide-token-id` (bootstrap writes it: the profile's `token_id`, or the
//! user's only token), and without it from the list itself when it holds one token: the list
//! has only unexpired tokens of the caller, and the caller authenticated with this one.
//!
//! **What the run does.** Nobody but a person can renew a device token (a new login as the
//! cluster's user), so the run tells: a finding within `certificates.renew_before_days` of the
//! end, Degraded (reason [`REASON`]) within `degraded_before_days`; `status.json`'s
//! `oxideToken`; the metric `oxide_controller_oxide_token_expiry_timestamp_seconds`; and the
//! alert rules on it. It lists the tokens at most once a day ([`RECHECK`]) or when the Secret
//! names another token than the record: a no-op run costs no request for it.

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::certificates::CertificateSpec;

/// The Degraded condition's reason, and the findings' prefix.
pub const REASON: &str = "OxideTokenExpiring";
/// The prefix of the finding when the run cannot tell which token is the cluster's.
pub const UNKNOWN_REASON: &str = "OxideTokenUnknown";
/// How long a record is trusted before the list is read again (someone may have rotated).
pub const RECHECK: Duration = Duration::hours(24);

/// One entry of `GET /v1/me/access-tokens` (never the bearer value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessToken {
    pub id: String,
    /// None: it never expires.
    pub expires_at: Option<DateTime<Utc>>,
}

/// `status.json`'s `oxideToken`: what the run last learnt about the cluster's Oxide token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OxideTokenRecord {
    /// The token's id (an identifier, not the token). None when it could not be told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When it stops working; None for a token that never expires (or, with `error`, unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    pub checked_at: DateTime<Utc>,
    /// Why the token could not be told apart from the user's others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Whether this run lists the tokens: nothing recorded, a record a day old, or a Secret that
/// names another token than the one recorded (a rotation).
pub fn needs_read(
    recorded: Option<&OxideTokenRecord>,
    configured_id: Option<&str>,
    now: DateTime<Utc>,
) -> bool {
    recorded.is_none_or(|r| {
        now - r.checked_at >= RECHECK || configured_id.is_some_and(|c| r.id.as_deref() != Some(c))
    })
}

/// Which of the listed tokens is the cluster's: the one `configured_id` names, else the only
/// one listed.
pub fn identify(
    listed: &[AccessToken],
    configured_id: Option<&str>,
    now: DateTime<Utc>,
) -> OxideTokenRecord {
    let found = match configured_id {
        Some(id) => listed.iter().find(|t| t.id == id).ok_or_else(|| {
            format!(
                "Secret kube-system/oxide-controller's oxide-token-id names {id}, which is not one of this user's {} unexpired tokens (GET /v1/me/access-tokens): after replacing oxide-token, set oxide-token-id to the new token's id",
                listed.len()
            )
        }),
        None => match listed {
            [only] => Ok(only),
            _ => Err(format!(
                "cannot tell which of this user's {} tokens the cluster uses, so its end is not watched: set key oxide-token-id of Secret kube-system/oxide-controller to its id (GET /v1/me/access-tokens), or give the cluster a user of its own",
                listed.len()
            )),
        },
    };
    match found {
        Ok(t) => OxideTokenRecord {
            id: Some(t.id.clone()),
            expires_at: t.expires_at,
            checked_at: now,
            error: None,
        },
        Err(why) => OxideTokenRecord {
            id: configured_id.map(str::to_owned),
            expires_at: None,
            checked_at: now,
            error: Some(why),
        },
    }
}

/// The run's finding about the token, with whether it makes the cluster Degraded: within
/// `renew_before_days` of the end a finding, within `degraded_before_days` Degraded; a token
/// that cannot be told apart, a finding.
pub fn finding(
    record: &OxideTokenRecord,
    spec: &CertificateSpec,
    now: DateTime<Utc>,
) -> Option<(bool, String)> {
    if let Some(why) = &record.error {
        return Some((false, format!("{UNKNOWN_REASON}: {why}")));
    }
    let end = record.expires_at?;
    if now < end - spec.renew_before() {
        return None;
    }
    let degraded = now >= end - spec.degraded_before();
    let verb = if now >= end { "expired" } else { "expires" };
    Some((
        degraded,
        format!(
            "{REASON}: the cluster's Oxide token{} {verb} at {}; no run can act on the rack after that. Log in again as the cluster's Oxide user and put the new token and its id into Secret kube-system/oxide-controller (oxide-token, oxide-token-id) and oxide-controller-backup/oxide-controller-rack (README: The Oxide identity)",
            record
                .id
                .as_deref()
                .map(|id| format!(" ({id})"))
                .unwrap_or_default(),
            end.to_rfc3339_opts(SecondsFormat::Secs, true)
        ),
    ))
}

/// What bootstrap says about the token it is about to copy into the cluster, if anything: one
/// that never expires (the README asks for one that does), or one that ends within
/// `renew_before_days` (the cluster would report it from its first runs).
pub fn bootstrap_warning(
    record: &OxideTokenRecord,
    spec: &CertificateSpec,
    now: DateTime<Utc>,
) -> Option<String> {
    if let Some(why) = &record.error {
        return Some(why.replace(
            "set key oxide-token-id of Secret kube-system/oxide-controller to its id (GET /v1/me/access-tokens)",
            "bootstrap with a profile (`oxide auth login`, its credentials.toml has the token's id)",
        ));
    }
    match record.expires_at {
        None => Some(
            "the Oxide token never expires: a leaked copy works for ever; give the cluster a user of its own and a token with an expiry (README: The Oxide identity)".to_owned(),
        ),
        Some(end) if now >= end - spec.renew_before() => Some(format!(
            "the Oxide token expires at {}: the cluster reports it from its first run, and stops acting on the rack then unless it is replaced (README: The Oxide identity)",
            end.to_rfc3339_opts(SecondsFormat::Secs, true)
        )),
        Some(_) => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn token(id: &str, end: Option<&str>) -> AccessToken {
        AccessToken {
            id: id.to_owned(),
            expires_at: end.map(at),
        }
    }

    #[test]
    fn the_configured_id_wins_and_one_listed_token_is_the_callers() {
        let now = at("2026-01-01T00:00:00Z");
        let list = [token("a", Some("2026-03-01T00:00:00Z")), token("b", None)];
        let r = identify(&list, Some("b"), now);
        assert_eq!(
            (r.id.as_deref(), r.expires_at, r.error),
            (Some("b"), None, None)
        );
        let r = identify(&list, None, now);
        assert!(r.id.is_none());
        assert!(r.error.unwrap().contains("which of this user's 2 tokens"));
        let r = identify(&list[..1], None, now);
        assert_eq!(r.expires_at, Some(at("2026-03-01T00:00:00Z")));
        assert_eq!(r.id.as_deref(), Some("a"));
        // A rotation without the id: the old id is not listed any more.
        let r = identify(&list[1..], Some("a"), now);
        let why = r.error.unwrap();
        assert!(
            why.contains("names a, which is not one of this user's 1"),
            "{why}"
        );
    }

    #[test]
    fn the_list_is_read_daily_or_when_the_secret_names_another_token() {
        let now = at("2026-01-02T00:00:00Z");
        let r = OxideTokenRecord {
            id: Some("a".into()),
            expires_at: None,
            checked_at: at("2026-01-01T01:00:00Z"),
            error: None,
        };
        assert!(needs_read(None, None, now));
        assert!(!needs_read(Some(&r), None, now));
        assert!(!needs_read(Some(&r), Some("a"), now));
        assert!(needs_read(Some(&r), Some("b"), now));
        assert!(needs_read(Some(&r), None, now + Duration::hours(1)));
    }

    #[test]
    fn a_finding_within_renew_before_and_degraded_within_degraded_before() {
        let spec = CertificateSpec::default(); // 60 and 30 days
        let end = at("2026-06-01T00:00:00Z");
        let r = OxideTokenRecord {
            id: Some("a".into()),
            expires_at: Some(end),
            checked_at: end - Duration::days(90),
            error: None,
        };
        assert_eq!(finding(&r, &spec, end - Duration::days(61)), None);
        let (degraded, m) = finding(&r, &spec, end - Duration::days(59)).unwrap();
        assert!(!degraded);
        assert!(
            m.starts_with(
                "OxideTokenExpiring: the cluster's Oxide token (a) expires at 2026-06-01T00:00:00Z"
            ),
            "{m}"
        );
        assert!(m.contains("oxide-token-id"), "{m}");
        let (degraded, _) = finding(&r, &spec, end - Duration::days(29)).unwrap();
        assert!(degraded);
        let (degraded, m) = finding(&r, &spec, end + Duration::days(1)).unwrap();
        assert!(degraded && m.contains("expired at"), "{m}");
        // Never expires: nothing to say every run.
        let never = OxideTokenRecord {
            expires_at: None,
            ..r.clone()
        };
        assert_eq!(finding(&never, &spec, end), None);
        // Cannot tell which: a finding, not Degraded.
        let unknown = OxideTokenRecord {
            error: Some("cannot tell".into()),
            ..never
        };
        assert_eq!(
            finding(&unknown, &spec, end),
            Some((false, "OxideTokenUnknown: cannot tell".into()))
        );
    }

    #[test]
    fn bootstrap_warns_of_a_token_that_never_ends_or_ends_soon() {
        let spec = CertificateSpec::default();
        let now = at("2026-01-01T00:00:00Z");
        let mut r = OxideTokenRecord {
            id: Some("a".into()),
            expires_at: None,
            checked_at: now,
            error: None,
        };
        assert!(
            bootstrap_warning(&r, &spec, now)
                .unwrap()
                .contains("never expires")
        );
        r.expires_at = Some(now + Duration::days(10));
        assert!(
            bootstrap_warning(&r, &spec, now)
                .unwrap()
                .contains("expires at 2026-01-11")
        );
        r.expires_at = Some(now + Duration::days(365));
        assert_eq!(bootstrap_warning(&r, &spec, now), None);
        let unknown = identify(&[token("a", None), token("b", None)], None, now);
        let w = bootstrap_warning(&unknown, &spec, now).unwrap();
        assert!(w.contains("bootstrap with a profile"), "{w}");
    }
}
