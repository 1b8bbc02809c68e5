//! The operator's own credential (issue 46 item 2): which way `bootstrap kubeconfig` renews the
//! laptop's client certificate, and the identity a renewed one carries. Pure: the clock is
//! passed in, the key and the API calls live in [`crate::adapters::client_csr`].
//!
//! **Two ways.** While the kubeconfig's certificate is still valid it can ask the cluster
//! itself: a `certificates.k8s.io/v1` CertificateSigningRequest for the signer
//! `kubernetes.io/kube-apiserver-client`, approved with that same credential and signed by
//! kube-controller-manager (k3s gives it the client CA for that signer). Once it has ended
//! the API refuses it, and only the pinned SSH path (`k3s.yaml` on the server holding the API
//! address) is left.
//!
//! **Another identity.** k3s's `k3s.yaml` names `system:admin` in group `system:masters`; the
//! apiserver's `CertificateSubjectRestriction` admission plugin (on by default) refuses a
//! request for that signer naming `system:masters`. A renewed certificate therefore names the
//! user [`operator_user`] and no group, and a ClusterRoleBinding [`OPERATOR_BINDING`] gives
//! that user `cluster-admin` (ensured with the still-valid credential before the request).

use chrono::{DateTime, Duration, Utc};

/// Which way the operator asked for (`--via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Via {
    /// The CSR API while the certificate is valid, SSH otherwise (or when the CSR way fails).
    #[default]
    Auto,
    /// Only the CSR API.
    Csr,
    /// Only the pinned SSH path.
    Ssh,
}

/// The way one run takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Csr,
    /// The SSH path, and why.
    Ssh {
        reason: String,
    },
}

/// Why `--via csr` cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViaError {
    #[error(
        "the kubeconfig has no client certificate for context {context} to ask the API with; run bootstrap kubeconfig --via ssh (it reads k3s.yaml over SSH)"
    )]
    NoCertificate { context: String },
    #[error(
        "the kubeconfig's client certificate for context {context} ended at {ended} (or ends within a minute), so the API will refuse it; run bootstrap kubeconfig --via ssh (it reads k3s.yaml over SSH)"
    )]
    Ended {
        context: String,
        ended: DateTime<Utc>,
    },
}

/// A certificate that ends sooner than this is treated as ended: the CSR way takes a few
/// requests and a wait for the signer, which it must finish with the old credential.
pub const MARGIN: Duration = Duration::seconds(60);

/// What the renewed certificate asks for: 365 days, what k3s's own client certificates last.
/// kube-controller-manager grants at most its `--cluster-signing-duration` (k3s passes none:
/// the default, 8760h) and at least 10 minutes.
pub const EXPIRATION_SECONDS: i32 = 365 * 86_400;

/// The signer: client certificates the apiserver's x509 authenticator accepts.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";

/// What the request asks the signer to allow (`validAPIServerClientUsages` requires
/// `client auth` and allows only it, `digital signature` and `key encipherment`).
pub const USAGES: [&str; 2] = ["digital signature", "client auth"];

/// The ClusterRoleBinding giving [`operator_user`] `cluster-admin`.
pub const OPERATOR_BINDING: &str = "oxide-controller-operator";

/// The ClusterRole it binds: what `system:masters` could do, as far as RBAC goes.
pub const OPERATOR_ROLE: &str = "cluster-admin";

/// The user a renewed certificate names (its CN); it names no group (O).
pub fn operator_user(cluster: &str) -> String {
    format!("oxide-controller:operator:{cluster}")
}

/// The CertificateSigningRequest's name for a request made at `now`: one per second, so a
/// run never meets one a crashed run left behind (those the command deletes; the
/// controller-manager's `csrcleaner` removes any other within hours).
pub fn request_name(cluster: &str, now: DateTime<Utc>) -> String {
    format!("oxide-controller-operator-{cluster}-{}", now.timestamp())
}

/// The way to take: `via`, given the end of the kubeconfig's certificate for `context`
/// (None: none there) at `now`.
pub fn choose(
    via: Via,
    context: &str,
    ends: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<Route, ViaError> {
    let usable = ends.map(|end| (end, end - MARGIN > now));
    match (via, usable) {
        (Via::Ssh, _) => Ok(Route::Ssh {
            reason: "--via ssh".to_owned(),
        }),
        (_, Some((_, true))) => Ok(Route::Csr),
        (Via::Csr, None) => Err(ViaError::NoCertificate {
            context: context.to_owned(),
        }),
        (Via::Csr, Some((ended, false))) => Err(ViaError::Ended {
            context: context.to_owned(),
            ended,
        }),
        (Via::Auto, None) => Ok(Route::Ssh {
            reason: format!("the kubeconfig has no client certificate for context {context}"),
        }),
        (Via::Auto, Some((ended, false))) => Ok(Route::Ssh {
            reason: format!("the kubeconfig's client certificate ended at {ended}"),
        }),
    }
}

/// Whether a failure of the CSR way is followed by the SSH path: only when the operator left
/// the choice to the command. Whatever the reason (the API refusing the credential as
/// unauthorized, no signer answering, the API down), k3s.yaml over SSH still renews it.
pub fn falls_back(via: Via) -> bool {
    via == Via::Auto
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_valid_certificate_renews_through_the_csr_api_unless_ssh_is_asked_for() {
        let now = at("2026-01-01T00:00:00Z");
        let later = Some(at("2026-06-01T00:00:00Z"));
        assert_eq!(choose(Via::Auto, "demo", later, now), Ok(Route::Csr));
        assert_eq!(choose(Via::Csr, "demo", later, now), Ok(Route::Csr));
        assert!(matches!(
            choose(Via::Ssh, "demo", later, now),
            Ok(Route::Ssh { .. })
        ));
    }

    #[test]
    fn an_ended_or_missing_certificate_takes_ssh_and_via_csr_says_to_use_ssh() {
        let now = at("2026-01-01T00:00:00Z");
        for ends in [
            None,
            Some(at("2025-12-31T00:00:00Z")),
            // Within the margin: it would end while the request waits for the signer.
            Some(now + Duration::seconds(30)),
        ] {
            let route = choose(Via::Auto, "demo", ends, now).unwrap();
            assert!(matches!(route, Route::Ssh { .. }), "{ends:?}: {route:?}");
            let e = choose(Via::Csr, "demo", ends, now).unwrap_err();
            assert!(e.to_string().contains("--via ssh"), "{e}");
        }
        assert!(
            choose(Via::Auto, "demo", Some(now - Duration::days(1)), now)
                .is_ok_and(|r| matches!(r, Route::Ssh { reason } if reason.contains("ended")))
        );
    }

    #[test]
    fn only_auto_falls_back_to_ssh_when_the_csr_way_fails() {
        assert!(falls_back(Via::Auto));
        assert!(!falls_back(Via::Csr));
        assert!(!falls_back(Via::Ssh));
    }

    #[test]
    fn the_renewed_identity_is_no_member_of_system_masters() {
        let user = operator_user("demo");
        assert_eq!(user, "oxide-controller:operator:demo");
        assert!(!user.contains("system:"));
        assert_eq!(
            request_name("demo", at("2026-01-01T00:00:00Z")),
            "oxide-controller-operator-demo-1767225600"
        );
    }
}
