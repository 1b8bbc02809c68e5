//! The webhook's serving certificate inside a run (issue 46 item 1, audit security-2 N10):
//! its end read from Secret `oxide-controller-webhook-tls` when the last record says so
//! ([`certificates::webhook_needs_read`]: never on a no-op run), and inside
//! `certificates.renew_before_days` of it a new pair signed with the webhook CA's key
//! (Secret `oxide-controller-webhook-ca`) written back against the read resourceVersion.
//! The webhook's pod mounts the Secret and serves the new pair once the kubelet has updated
//! the files ([`crate::webhook::host::tls_from_files`]), without a restart; clients trust the
//! CA, which stays.
//!
//! Nothing here fails the run: what went wrong is kept in the record's `error`, and the
//! record makes the cluster Degraded (`CertificatesExpiring`) within `degraded_before_days`.

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use crate::adapters::webhook_tls;
use crate::domain::certificates::{self, WebhookCertificate};
use crate::domain::spec::ClusterSpec;
use crate::domain::status::Status;
use crate::ports::cluster::NAMESPACE;
use crate::ports::state::StateStore;
use crate::workflows::error;

/// The record the run leaves: the last run's (in `previous`) as it is when nothing needs
/// reading, else what the Secret holds now, re-issued first when due. None for a cluster
/// without the Secret.
pub async fn keep<S: StateStore>(
    state: &S,
    spec: &ClusterSpec,
    previous: Option<&Status>,
    now: DateTime<Utc>,
) -> Option<WebhookCertificate> {
    let recorded = previous.and_then(|p| p.webhook_certificate.as_ref());
    if !certificates::webhook_needs_read(recorded, &spec.certificates, now) {
        return recorded.cloned();
    }
    let failed = |why: String| {
        warn!(error = %why, "cannot keep the webhook's TLS certificate");
        recorded.cloned().map(|r| WebhookCertificate {
            error: Some(why),
            ..r
        })
    };
    let (rv, tls) = match state.read_webhook_tls().await {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(e) => return failed(error::chain(&e)),
    };
    let Some(end) = webhook_tls::end(&tls.cert_pem) else {
        return failed(format!(
            "the certificate in Secret {} cannot be read; re-run bootstrap after deleting it",
            webhook_tls::TLS_SECRET
        ));
    };
    let mut record = WebhookCertificate {
        not_after: end,
        checked_at: now,
        renewed_at: recorded.and_then(|r| r.renewed_at),
        error: None,
    };
    if certificates::webhook_due(end, &spec.certificates, now) {
        match reissue(state, spec, &rv, now).await {
            Ok(new_end) => {
                info!(old_end = %end, new_end = %new_end, "re-issued the webhook's TLS certificate");
                record.not_after = new_end;
                record.renewed_at = Some(now);
            }
            Err(why) => {
                warn!(error = %why, end = %end, "cannot re-issue the webhook's TLS certificate");
                record.error = Some(why);
            }
        }
    }
    Some(record)
}

/// Signs a new pair with the CA's key and writes it; its end.
async fn reissue<S: StateStore>(
    state: &S,
    spec: &ClusterSpec,
    resource_version: &str,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, String> {
    let ca = state
        .read_webhook_ca()
        .await
        .map_err(|e| error::chain(&e))?
        .ok_or_else(|| {
            format!(
                "there is no Secret kube-system/{}: the cluster was bootstrapped before the webhook's CA key was kept; re-run bootstrap to make one",
                webhook_tls::CA_SECRET
            )
        })?;
    let tls =
        webhook_tls::reissue(&ca, &spec.cluster, NAMESPACE, now).map_err(|e| e.to_string())?;
    let end = webhook_tls::end(&tls.cert_pem).ok_or("the re-issued certificate has no end")?;
    state
        .replace_webhook_tls(resource_version, &tls)
        .await
        .map_err(|e| error::chain(&e))?;
    Ok(end)
}
