//! The cluster's Oxide token inside a run (see [`crate::domain::oxide_token`]): the user's
//! tokens listed when the last record says so (never on a no-op run), the cluster's told apart
//! by the Secret's `oxide-token-id`, and its end kept in `status.json` for the findings, the
//! metric and `scale status`. Nothing here fails the run: a list that fails keeps the last
//! record (and the next run lists again).

use chrono::{DateTime, Utc};
use tracing::warn;

use crate::base::secrets::ClusterSecrets;
use crate::domain::oxide_token::{self, OxideTokenRecord};
use crate::domain::status::Status;
use crate::ports::rack::Rack;

/// The record the run leaves: the last run's while it is fresh, else what the list says now.
pub async fn keep<R: Rack>(
    rack: &R,
    secrets: &ClusterSecrets,
    previous: Option<&Status>,
    now: DateTime<Utc>,
) -> Option<OxideTokenRecord> {
    let recorded = previous.and_then(|p| p.oxide_token.as_ref());
    let configured = secrets.oxide_token_id.as_deref();
    if !oxide_token::needs_read(recorded, configured, now) {
        return recorded.cloned();
    }
    match rack.my_access_tokens().await {
        Ok(listed) => Some(oxide_token::identify(&listed, configured, now)),
        Err(e) => {
            warn!(error = %e, "cannot list the Oxide user's tokens; their ends stay as last read");
            recorded.cloned()
        }
    }
}
