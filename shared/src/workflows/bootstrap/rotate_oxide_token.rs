//! `bootstrap rotate-oxide-token`: the cluster's Oxide token replaced by the one this laptop
//! holds now (its profile after `oxide auth login`, or `--oxide-token file:PATH`), proven
//! first (audit security-2, H2's rest: the reconcile reports the token's end; this is what the
//! person does about it).
//!
//! 1. `validate` — the resume file and the new credentials;
//! 2. `prove` — the new token reaches the cluster's project (a refused or unscoped token
//!    changes nothing), and which of the user's tokens it is
//!    ([`crate::domain::oxide_token::identify`]);
//! 3. `secret` — Secret `kube-system/oxide-controller`'s `oxide-token` and `oxide-token-id` (and
//!    `oxide-host`) rewritten in one replace; an id that cannot be told is written empty, so
//!    the old token's id never stays beside the new token;
//! 4. `backup` — the backup pod's copy, `oxide-controller-backup/oxide-controller-rack`.
//!
//! The next reconcile run reads the Secret afresh and lists the tokens at once (the id
//! changed): nothing restarts but the Oxide CCM, which reads its token at start (the summary
//! says how). The old token is not deleted: stdout names its id; delete it once the next run
//! has succeeded.

use std::collections::BTreeMap;

use serde::Serialize;
use tracing::info;

use super::backup::BackupInput;
use super::recover::{self, Local};
use super::{BootstrapError, Connect};
use crate::base::retry::{Backoff, retry};
use crate::base::secrets::keys;
use crate::domain::oxide_token;
use crate::ports::manifests::ApplyManifests as _;
use crate::ports::rack::Rack;
use crate::ports::state::{StateError, StateStore as _};
use crate::workflows::error::{self, message};

/// What a rotation did (ids and facts, never a token).
#[derive(Debug, Clone, Serialize)]
pub struct TokenSummary {
    pub cluster: String,
    /// The new token's id, when it could be told apart from the user's others.
    pub new_id: Option<String>,
    /// When it expires (None: never).
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The id the Secret held before, when it held one other than the new.
    pub old_id: Option<String>,
    /// The Secret already held the new token.
    pub unchanged: bool,
    /// Why the backup pod's copy was not written, when it was not.
    pub backup_copy_error: Option<String>,
}

impl TokenSummary {
    /// What the person reads on stdout.
    pub fn render(&self) -> String {
        let mut s = if self.unchanged {
            format!(
                "Cluster {} already held this Oxide token; its id and the backup's copy are in place.\n",
                self.cluster
            )
        } else {
            format!(
                "Cluster {} now acts with the new Oxide token; the next reconcile run uses it.\n",
                self.cluster
            )
        };
        s.push_str(&match (&self.new_id, self.expires_at) {
            (Some(id), Some(end)) => format!("Its id is {id}; it expires at {end}.\n"),
            (Some(id), None) => format!("Its id is {id}; it never expires.\n"),
            (None, _) => "Its id could not be told (the user has several tokens and the profile records none): the cluster cannot watch its end; bootstrap with a profile from `oxide auth login`.\n".to_owned(),
        });
        match &self.backup_copy_error {
            None => s.push_str(
                "The backup pod's copy (oxide-controller-backup/oxide-controller-rack) holds it too.\n",
            ),
            Some(why) => s.push_str(&format!(
                "NOT WRITTEN: the backup pod's copy (oxide-controller-backup/oxide-controller-rack): {why}; run this command again.\n"
            )),
        }
        s.push_str("With the Oxide CCM: restart it to read the new token (kubectl -n kube-system rollout restart deployment oxide-cloud-controller-manager).\n");
        if let Some(old) = &self.old_id {
            s.push_str(&format!(
                "Once a reconcile run has succeeded with it, delete the old token: DELETE /v1/me/access-tokens/{old}.\n"
            ));
        }
        s
    }
}

/// Runs the whole flow (see the module docs).
pub async fn run<C: Connect>(
    input: BackupInput,
    connect: &C,
) -> Result<TokenSummary, BootstrapError> {
    let v = recover::validate_local(&Local {
        credential_sources: &input.credential_sources,
        cluster: &input.cluster,
        project: input.project.as_deref(),
        kubeconfig: input.kubeconfig.as_deref(),
        state_dir: input.state_dir.as_deref(),
        home: input.home.as_deref(),
    })?;
    let record = prove(connect, &v).await?;
    let ports = connect
        .in_cluster(
            &v.kubeconfig,
            &input.cluster,
            "bootstrap-rotate-oxide-token",
        )
        .await
        .map_err(|e| {
            BootstrapError::step(
                "secret",
                message(format!(
                    "cannot reach the cluster's API ({}); nothing changed",
                    error::chain(e.as_ref())
                )),
            )
        })?;
    let transient =
        |e: &StateError| matches!(e, StateError::Api { .. } | StateError::Conflict { .. });
    let failed = |e: StateError| BootstrapError::step("secret", e);
    let before = retry(Backoff::default(), transient, || ports.store.read_secrets())
        .await
        .map_err(failed)?;
    let set = BTreeMap::from([
        (keys::OXIDE_HOST.to_owned(), v.host.clone().into_bytes()),
        (keys::OXIDE_TOKEN.to_owned(), v.token.clone().into_bytes()),
        (
            keys::OXIDE_TOKEN_ID.to_owned(),
            record.id.clone().unwrap_or_default().into_bytes(),
        ),
    ]);
    retry(Backoff::default(), transient, || {
        ports.store.rewrite_secret_keys(&set)
    })
    .await
    .map_err(failed)?;
    info!(step = "secret", id = ?record.id, "the Secret holds the new Oxide token");
    let after = crate::base::secrets::ClusterSecrets {
        oxide_host: v.host.clone(),
        oxide_token: v.token.clone(),
        oxide_token_id: record.id.clone(),
        ..before.clone()
    };
    let floor = v
        .spec
        .as_ref()
        .map(|s| s.backup.retention())
        .unwrap_or_default();
    let copy = crate::render::manifests::backup_rack_secret(&after, floor);
    let backup_copy_error = ports
        .manifests
        .apply_all(std::slice::from_ref(&copy), Backoff::default())
        .await
        .err()
        .map(|e| error::chain(&e));
    Ok(TokenSummary {
        cluster: input.cluster,
        new_id: record.id.clone(),
        expires_at: record.expires_at,
        old_id: before
            .oxide_token_id
            .filter(|old| Some(old) != record.id.as_ref()),
        unchanged: before.oxide_token == v.token,
        backup_copy_error,
    })
}

/// Step `prove`: the new token reaches the project; its record (id and end).
async fn prove<C: Connect>(
    connect: &C,
    v: &recover::Validated,
) -> Result<oxide_token::OxideTokenRecord, BootstrapError> {
    let step = "prove";
    let rack = connect
        .rack(&v.host, &v.token, &v.project)
        .map_err(BootstrapError::inputs)?;
    let reaches = rack
        .project_exists()
        .await
        .map_err(|e| recover::rack_failed(step, e))?;
    if !reaches {
        return Err(BootstrapError::needs_person(
            step,
            message(format!(
                "the new token does not see project {}: its user needs the collaborator role on it (README: The Oxide identity); nothing changed",
                v.project
            )),
        ));
    }
    let listed = rack
        .my_access_tokens()
        .await
        .map_err(|e| recover::rack_failed(step, e))?;
    let now = chrono::Utc::now();
    let record = oxide_token::identify(&listed, v.token_id.as_deref(), now);
    info!(step, id = ?record.id, expires_at = ?record.expires_at, "the new token reaches the project");
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_ids_and_what_is_left_to_do() {
        let mut s = TokenSummary {
            cluster: "demo".into(),
            new_id: Some("new-id".into()),
            expires_at: None,
            old_id: Some("old-id".into()),
            unchanged: false,
            backup_copy_error: None,
        };
        let text = s.render();
        for needle in [
            "Cluster demo now acts with the new Oxide token",
            "Its id is new-id; it never expires",
            "holds it too",
            "rollout restart deployment oxide-cloud-controller-manager",
            "DELETE /v1/me/access-tokens/old-id",
        ] {
            assert!(text.contains(needle), "{needle:?}: {text}");
        }
        s.new_id = None;
        s.old_id = None;
        s.backup_copy_error = Some("namespace not found".into());
        let text = s.render();
        assert!(text.contains("could not be told"), "{text}");
        assert!(
            text.contains("NOT WRITTEN: the backup pod's copy"),
            "{text}"
        );
        assert!(!text.contains("DELETE"), "{text}");
    }
}
