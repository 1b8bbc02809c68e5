//! Bearer-token authentication of webhook requests against Secret
//! `oxide-controller-webhook-auth`'s `webhook-token` (reads and writes) and its optional
//! `webhook-read-token` (reads only: [`Access`]), read from the Secret's keys as the pod mounts
//! them ([`TokenSource::Files`], in the cluster: the webhook's account may not read the Secret)
//! or through the API ([`TokenSource::Secret`], a `scale serve` run with a person's
//! kubeconfig).
//!
//! Owns: parsing `Authorization`, refusing credentials in the query string, the constant-time
//! comparison and the short-lived cache of the expected token. Fails closed: if the tokens
//! cannot be read (or the write token is empty) nothing is accepted. Only a SHA-256 digest of the
//! expected token is kept in memory, and no token ever reaches a log or an error message.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::{AuthFailure, WebhookError};
use crate::base::secrets::keys;
use crate::ports::state::{StateError, StateStore};

/// Where the expected tokens come from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TokenSource {
    /// Secret `oxide-controller-webhook-auth`, read through the API (needs `get` on it).
    #[default]
    Secret,
    /// Files named as the Secret's keys (`webhook-token`, `webhook-read-token`) in this
    /// directory: a Secret volume. The kubelet replaces them when the Secret changes, so a
    /// rotated token is picked up after the cache's TTL, with no restart.
    Files(PathBuf),
}

impl TokenSource {
    /// The write token and the read-only token, if any (an empty file counts as none).
    async fn read<S: StateStore>(
        &self,
        state: &S,
    ) -> Result<(String, Option<String>), WebhookError> {
        match self {
            TokenSource::Secret => {
                let t = state
                    .read_webhook_tokens()
                    .await
                    .map_err(WebhookError::AuthUnavailable)?
                    .unwrap_or_default();
                Ok((t.token, t.read_token))
            }
            TokenSource::Files(dir) => {
                let read = |key: &str| {
                    let path = dir.join(key);
                    async move {
                        match tokio::fs::read(&path).await {
                            Ok(b) => Ok(Some(String::from_utf8(b).map_err(|_| {
                                WebhookError::AuthUnavailable(StateError::Malformed {
                                    what: path.display().to_string(),
                                    message: "not UTF-8".into(),
                                })
                            })?)),
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                            Err(e) => Err(WebhookError::AuthUnavailable(StateError::Api {
                                what: format!("read {}", path.display()),
                                source: Box::new(e),
                            })),
                        }
                    }
                };
                let write = read(keys::WEBHOOK_TOKEN).await?.unwrap_or_default();
                let read_only = read(keys::WEBHOOK_READ_TOKEN)
                    .await?
                    .filter(|t| !t.is_empty());
                Ok((write, read_only))
            }
        }
    }
}

type TokenDigest = [u8; 32];

/// What a presented token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// The write token: everything.
    Write,
    /// The read-only token: GETs (`/metrics`, `/status`, counts, bounds), no change.
    Read,
}

/// The expected tokens' digests: the write token's, and the read-only token's if set.
#[derive(Clone, Copy)]
pub(crate) struct Expected {
    write: TokenDigest,
    read: Option<TokenDigest>,
}

fn digest(token: &[u8]) -> TokenDigest {
    Sha256::digest(token).into()
}

/// The expected token's digest, cached for `ttl` (zero: read the tokens on every request).
pub(crate) struct TokenCache {
    ttl: Duration,
    source: TokenSource,
    slot: std::sync::Mutex<Option<(Instant, Expected)>>,
    /// Held while refreshing, so an expiry under load costs one Secret read, not one per request.
    refresh: tokio::sync::Mutex<()>,
}

impl TokenCache {
    pub(crate) fn new(ttl: Duration, source: TokenSource) -> Self {
        TokenCache {
            ttl,
            source,
            slot: std::sync::Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    fn fresh(&self) -> Option<Expected> {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        slot.filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, d)| d)
    }

    /// The expected tokens' digests, from the cache or the source.
    pub(crate) async fn expected<S: StateStore>(
        &self,
        state: &S,
    ) -> Result<Expected, WebhookError> {
        if let Some(d) = self.fresh() {
            return Ok(d);
        }
        let _gate = self.refresh.lock().await;
        if let Some(d) = self.fresh() {
            return Ok(d);
        }
        let (write, read) = self.source.read(state).await?;
        if write.is_empty() {
            return Err(WebhookError::AuthNotConfigured);
        }
        let d = Expected {
            write: digest(write.as_bytes()),
            read: read.as_deref().map(|t| digest(t.as_bytes())),
        };
        if !self.ttl.is_zero() {
            *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), d));
        }
        Ok(d)
    }
}

/// Query parameter names that look like credentials.
fn credential_like(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("token")
        || n.contains("auth")
        || n.contains("bearer")
        || n.contains("key")
        || n == "secret"
        || n == "password"
}

/// Checks the query string: a credential-looking parameter is a 401 (the token may be
/// compromised by now, so it is never accepted from there); anything else is a 400, as no
/// protected endpoint takes parameters.
pub(crate) fn check_query(query: Option<&str>) -> Result<(), WebhookError> {
    let Some(q) = query else { return Ok(()) };
    if q.is_empty() {
        return Ok(());
    }
    let names = q
        .split('&')
        .map(|pair| pair.split_once('=').map_or(pair, |(k, _)| k));
    // Percent-encoded names (`%74oken`) are decoded crudely by ignoring anything not a letter,
    // which errs on the side of calling them credentials.
    let looks_like_credential = names.clone().any(credential_like)
        || names
            .clone()
            .any(|n| credential_like(&n.replace(|c: char| !c.is_ascii_alphabetic(), "")))
        || q.to_ascii_lowercase().contains("%");
    if looks_like_credential {
        Err(WebhookError::Unauthenticated {
            reason: AuthFailure::InQuery,
        })
    } else {
        Err(WebhookError::QueryNotAllowed)
    }
}

/// The bearer token of a request, or why there is none.
fn presented(headers: &http::HeaderMap) -> Result<&[u8], AuthFailure> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthFailure::Missing)?;
    if values.next().is_some() {
        return Err(AuthFailure::Malformed);
    }
    let bytes = value.as_bytes();
    let (scheme, rest) = match bytes.iter().position(|b| *b == b' ') {
        Some(i) => (&bytes[..i], &bytes[i..]),
        None => return Err(AuthFailure::Malformed),
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(AuthFailure::Malformed);
    }
    let token = rest.trim_ascii();
    if token.is_empty() || token.iter().any(|b| b.is_ascii_whitespace()) {
        return Err(AuthFailure::Malformed);
    }
    Ok(token)
}

/// Authenticates a request: header present and well-formed, then compared (in constant time,
/// over fixed-length digests so the length does not leak either) with the Secret's tokens.
/// Says what the token may do.
pub(crate) async fn authenticate<S: StateStore>(
    cache: &TokenCache,
    state: &S,
    headers: &http::HeaderMap,
) -> Result<Access, WebhookError> {
    // Refuse obviously bad requests before touching the Secret, so anonymous noise costs nothing.
    let token = presented(headers).map_err(|reason| WebhookError::Unauthenticated { reason })?;
    let expected = cache.expected(state).await?;
    let given = digest(token);
    // Both compared, always, so the time taken does not tell which one matched.
    let write = bool::from(given.ct_eq(&expected.write));
    let read = expected.read.is_some_and(|r| bool::from(given.ct_eq(&r)));
    if write {
        Ok(Access::Write)
    } else if read {
        Ok(Access::Read)
    } else {
        Err(WebhookError::Unauthenticated {
            reason: AuthFailure::Wrong,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for v in values {
            h.append(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_the_token_is_trimmed() {
        assert_eq!(presented(&headers(&["Bearer abc"])), Ok(&b"abc"[..]));
        assert_eq!(presented(&headers(&["bearer   abc "])), Ok(&b"abc"[..]));
    }

    #[test]
    fn malformed_and_duplicate_headers_are_refused() {
        for h in [
            &["Basic abc"][..],
            &["Bearer"],
            &["Bearer "],
            &["Bearer a b"],
            &["Bearer a", "Bearer a"],
        ] {
            assert_eq!(presented(&headers(h)), Err(AuthFailure::Malformed), "{h:?}");
        }
        assert_eq!(presented(&headers(&[])), Err(AuthFailure::Missing));
    }

    #[test]
    fn credential_looking_query_parameters_are_401_and_others_400() {
        for q in [
            "token=x",
            "access_token=x",
            "a=1&Authorization=x",
            "api_key",
            "%74oken=x",
            "t-o-k-e-n=1",
        ] {
            assert!(
                matches!(
                    check_query(Some(q)),
                    Err(WebhookError::Unauthenticated {
                        reason: AuthFailure::InQuery
                    })
                ),
                "{q}"
            );
        }
        assert!(matches!(
            check_query(Some("pool=x")),
            Err(WebhookError::QueryNotAllowed)
        ));
        assert!(check_query(None).is_ok() && check_query(Some("")).is_ok());
    }
}
