//! After `recover --backup` (audit security-2 N6): the restored Secret `kube-system/oxide-controller`
//! is the backup's, so every rotation made after the backup was taken is undone. Once the
//! restored API is ready, and before the reconcile runs with what the Secret holds, what the
//! laptop knows better is written back:
//!
//! - the Oxide host, token, project and cluster: those this run reached the rack with, into the
//!   state Secret and the backup's Secret `oxide-controller-backup/oxide-controller-rack`;
//! - new webhook tokens (`webhook-token`, `webhook-read-token`, in Secret
//!   `oxide-controller-webhook-auth`, created if the backup predates it, and removed from the
//!   state Secret where an older controller kept them): whether the backup's were rotated
//!   since (or leaked: they sit in every backup) nobody but the person knows, so both are
//!   replaced, and the resume file gets the new ones. stdout says how to read the new write
//!   token, as bootstrap's does; no value is printed or logged;
//! - the retired keys ([`crate::base::secrets::keys::RETIRED`]: an older controller's SSH
//!   private key and webhook pair) removed, as bootstrap's `ensure_state` removes them.
//!
//! What the laptop does not know better is named, not changed: the Tailscale key (the laptop
//! keeps none) and a webhook CA that is not the resume file's (rotated after the backup).

use std::collections::BTreeMap;
use std::path::Path;

use tracing::{info, warn};

use super::Validated;
use crate::adapters::resume;
use crate::base::retry::{Backoff, retry};
use crate::base::secrets::webhook::{AUTH_SECRET, WebhookTokens};
use crate::base::secrets::{ClusterSecrets, keys, random_token};
use crate::ports::manifests::ApplyManifests;
use crate::ports::state::{SecretRewrite, StateError, StateStore};
use crate::workflows::bootstrap::BootstrapError;
use crate::workflows::error;

/// Bytes of randomness in each new webhook token (as bootstrap's).
const TOKEN_BYTES: usize = 32;

/// What the restored Secret held that a line of the report compares (names and facts, never a
/// value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rolled {
    /// The backup's Oxide token was not the one this run used.
    pub oxide_token: bool,
    /// The backup's Oxide host, when it was not this run's.
    pub oxide_host: Option<String>,
    /// The retired keys removed.
    pub removed: Vec<String>,
    /// The backup's Secret holds a Tailscale key.
    pub tailscale_key: bool,
    /// The restored webhook CA is not the resume file's.
    pub webhook_ca: bool,
    /// The restored state Secret held the webhook's tokens (a controller from before Secret
    /// `oxide-controller-webhook-auth`), now removed.
    pub tokens_moved: bool,
}

/// The lines stdout shows after a restore of `backup`: which rotations it predated and what
/// was done about each. `kubeconfig` and `cluster` make the command that reads the new token.
pub(super) fn report(r: &Rolled, kubeconfig: &Path, cluster: &str, backup: &str) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(host) = &r.oxide_host {
        lines.push(format!(
            "the backup's Oxide host ({host}) was not the one this run used: replaced"
        ));
    }
    lines.push(if r.oxide_token {
        "the backup's Oxide token differed from the one this run used: replaced (in the Secret and in oxide-controller-backup/oxide-controller-rack)".to_owned()
    } else {
        "the backup's Oxide token is the one this run used: kept".to_owned()
    });
    lines.push(format!(
        "webhook tokens replaced (webhook-token, webhook-read-token in Secret {AUTH_SECRET}; the backup's are refused once the webhook re-reads its files, about a minute); the resume file has the new ones; read the write token with: TOKEN=$(kubectl --kubeconfig {} --context {cluster} -n kube-system get secret {AUTH_SECRET} -o jsonpath='{{.data.webhook-token}}' | base64 -d)",
        kubeconfig.display()
    ));
    for key in &r.removed {
        lines.push(format!(
            "retired key {key} removed (an older controller wrote it)"
        ));
    }
    if r.tailscale_key {
        lines.push(format!(
            "the Tailscale key (tailscale-auth-key) is the backup's (the laptop keeps none): if it was replaced after backup {backup} was taken, set it in the Secret again"
        ));
    }
    if r.tokens_moved {
        lines.push(format!(
            "the backup's state Secret held the webhook's tokens (a controller from before Secret {AUTH_SECRET}): removed; if the restored webhook Deployment mounts them from Secret oxide-controller, it refuses every request until bootstrap applies this release's manifests (run it next)"
        ));
    }
    if r.webhook_ca {
        lines.push(
            "the webhook CA is the backup's, not the resume file's (rotated after the backup?): clients trusting the resume file's CA are refused until it is rotated again (README, \"Rotating the CA\")".to_owned(),
        );
    }
    lines
}

/// Marks the restore of `backup` as not re-asserted yet in the resume file, before anything
/// changes: a run that dies between the restore and [`reassert`] leaves the mark, and the next
/// `recover` that finds the API ready finishes it ([`super::run`]).
pub(super) fn mark_pending(v: &mut Validated, backup: &str) -> Result<(), BootstrapError> {
    v.resume.restore_pending = Some(backup.to_owned());
    resume::save(&v.resume_path, &v.resume).map_err(|e| BootstrapError::step("rotations", e))
}

/// Writes back what the laptop knows better after the restore of `backup` (see the module
/// docs), then clears the resume file's mark; returns the report's lines.
pub(super) async fn reassert<S: StateStore, M: ApplyManifests>(
    store: &S,
    applier: &M,
    v: &mut Validated,
    cluster: &str,
    backup: &str,
) -> Result<Vec<String>, BootstrapError> {
    let step = "rotations";
    let failed =
        |e: StateError| BootstrapError::step(step, error::context("the restored Secret", e));
    let transient =
        |e: &StateError| matches!(e, StateError::Api { .. } | StateError::Conflict { .. });
    let restored = retry(Backoff::default(), transient, || store.read_secrets())
        .await
        .map_err(failed)?;
    let now = ClusterSecrets {
        oxide_host: v.host.clone(),
        oxide_token: v.token.clone(),
        oxide_project: v.project.clone(),
        oxide_cluster: cluster.to_owned(),
        ..restored.clone()
    };
    let mut set: BTreeMap<String, Vec<u8>> = now
        .to_map()
        .into_iter()
        .filter(|(k, _)| {
            [
                keys::OXIDE_HOST,
                keys::OXIDE_TOKEN,
                keys::OXIDE_PROJECT,
                keys::OXIDE_CLUSTER,
            ]
            .contains(&k.as_str())
        })
        .collect();
    set.insert(
        keys::OXIDE_TOKEN_ID.to_owned(),
        token_id(&restored, v).unwrap_or_default().into_bytes(),
    );
    let SecretRewrite { changed, removed } = retry(Backoff::default(), transient, || {
        store.rewrite_secret_keys(&set)
    })
    .await
    .map_err(failed)?;
    info!(step, changed = %changed.join(","), removed = %removed.join(","), "the restored Secret rewritten");
    let mut rng = rand::rng();
    let mut tokens = WebhookTokens {
        token: random_token(&mut rng, TOKEN_BYTES),
        read_token: Some(random_token(&mut rng, TOKEN_BYTES)),
    };
    let tokens_moved = retry(Backoff::default(), transient, || {
        store.replace_webhook_tokens(&tokens)
    })
    .await
    .map_err(|e| BootstrapError::step(step, error::context("the webhook's tokens", e)))?;
    // The backup pod's own copy of the rack credentials came back from the backup too.
    // With the restored spec's retention as the floor, as bootstrap writes it.
    let floor = store
        .read_config()
        .await
        .ok()
        .and_then(|c| {
            c.spec_yaml()
                .map(crate::domain::spec::ClusterSpec::from_yaml)
        })
        .and_then(Result::ok)
        .map(|s| s.backup.retention())
        .unwrap_or_default();
    let rack = crate::render::manifests::backup_rack_secret(&now, floor);
    let rack_written = applier
        .apply_all(std::slice::from_ref(&rack), Backoff::default())
        .await
        .map_err(|e| error::chain(&e));
    v.resume.webhook_token = std::mem::take(&mut tokens.token);
    v.resume.webhook_read_token = tokens.read_token.take();
    v.resume.restore_pending = None;
    if let Err(e) = resume::save(&v.resume_path, &v.resume) {
        warn!(step, error = %e, "cannot write the new webhook tokens to the resume file; Secret oxide-controller-webhook-auth has them");
    }
    let webhook_ca = match (&v.resume.webhook_tls_ca, store.read_webhook_ca().await) {
        (Some(ours), Ok(Some(ca))) => ca.ca_pem.trim() != ours.trim(),
        _ => false,
    };
    let rolled = Rolled {
        oxide_token: restored.oxide_token != v.token,
        oxide_host: Some(restored.oxide_host).filter(|h| *h != v.host),
        removed,
        tailscale_key: restored.tailscale_auth_key.is_some(),
        webhook_ca,
        tokens_moved,
    };
    let mut lines = report(&rolled, &v.kubeconfig, cluster, backup);
    if let Err(why) = rack_written {
        warn!(step, error = %why, "cannot write the backup's rack Secret");
        lines.push(format!(
            "NOT WRITTEN: Secret oxide-controller-backup/oxide-controller-rack ({why}); run bootstrap again to copy the Oxide credentials into it"
        ));
    }
    Ok(lines)
}

/// The id to write beside the laptop's token after a restore: the restored one names the
/// backup's token, so it is kept only when that is still the token in force; else the
/// profile's id; else none (the reconcile then tells the user's only token, or says it
/// cannot). Never an id beside another token.
fn token_id(restored: &ClusterSecrets, v: &Validated) -> Option<String> {
    if restored.oxide_token == v.token {
        restored.oxide_token_id.clone()
    } else {
        v.token_id.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_each_rotation_the_backup_predates_and_no_value() {
        let rolled = Rolled {
            oxide_token: true,
            oxide_host: None,
            removed: vec![keys::RETIRED_SSH_PRIVATE_KEY.to_owned()],
            tailscale_key: true,
            webhook_ca: false,
            tokens_moved: true,
        };
        let lines = report(
            &rolled,
            Path::new("/k.yaml"),
            "demo",
            "demo-etcd-20260101-000000",
        );
        let text = lines.join("\n");
        for needle in [
            "the backup's Oxide token differed from the one this run used: replaced",
            "webhook tokens replaced",
            "--kubeconfig /k.yaml --context demo",
            "get secret oxide-controller-webhook-auth -o jsonpath='{.data.webhook-token}'",
            "retired key ssh-private-key removed",
            "replaced after backup demo-etcd-20260101-000000 was taken",
            "the backup's state Secret held the webhook's tokens",
        ] {
            assert!(text.contains(needle), "{needle:?}: {text}");
        }
        assert!(!text.contains("webhook CA"), "{text}");
        let kept = report(
            &Rolled {
                oxide_token: false,
                oxide_host: Some("https://old.example".into()),
                removed: vec![],
                tailscale_key: false,
                webhook_ca: true,
                tokens_moved: false,
            },
            Path::new("/k.yaml"),
            "demo",
            "then",
        )
        .join("\n");
        assert!(
            kept.contains("Oxide token is the one this run used: kept"),
            "{kept}"
        );
        assert!(kept.contains("Oxide host (https://old.example)"), "{kept}");
        assert!(kept.contains("webhook CA is the backup's"), "{kept}");
        assert!(
            !kept.contains("retired key")
                && !kept.contains("Tailscale")
                && !kept.contains("held the webhook's tokens"),
            "{kept}"
        );
    }
}
