//! The state store: Secret and ConfigMap `kube-system/oxide-controller`, the only durable state.
//!
//! Reads return the `resourceVersion` they saw; writes are replaces carrying it, and a 409
//! comes back as [`StateError::Conflict`] so the caller re-reads and decides again (never a
//! blind retry, never an unconditional update). The kube implementation is
//! [`crate::adapters::kube_store::KubeStateStore`]; tests use `fake::FakeState` (feature `testing`).

use std::collections::BTreeMap;
use std::future::Future;

use crate::base::secrets::ClusterSecrets;
use crate::base::secrets::webhook::{self as webhook_tls, WebhookCa, WebhookTls, WebhookTokens};

/// ConfigMap keys.
pub mod keys {
    pub const SPEC: &str = "spec.yaml";
    pub const STATUS: &str = "status.json";
    /// The last backup made and the last attempt's error (JSON
    /// [`crate::domain::backup::BackupReport`]), written by the in-cluster backup Job and by
    /// `bootstrap backup`; reconcile copies it into `status.json`.
    pub const BACKUP: &str = "backup.json";
    /// What the last restore drill found ([`crate::domain::backup::drill::DrillReport`]), left by
    /// the drill's runner (the in-cluster drill, `bootstrap recover --verify`).
    pub const DRILL: &str = "drill.json";
    pub const SCHEMA_VERSION: &str = "schema-version";
    /// sha256 of the cluster CA (not secret): joiners get `K10<hash>::` tokens with it.
    pub const K3S_CA_HASH: &str = "k3s-ca-hash";
    /// In the Secret: the SSH host key fingerprints read from each server's console when it
    /// was first reached, JSON `{"<instance>": ["SHA256:…", …]}`. Kept so that a server that
    /// was restarted (its console no longer holds the first boot) can still be verified from
    /// another machine, without trusting whatever its console shows later.
    pub const HOST_KEY_PINS: &str = "host-key-pins";
    /// The k3s server settings every server must share, as the cluster's servers run them
    /// (JSON `{"<k3s flag>": "<value>"}`): written by bootstrap, or by the first reconcile of a
    /// cluster bootstrapped before this key; a spec that differs is refused
    /// ([`crate::domain::spec::ClusterSpec::check_server_settings`]).
    pub const K3S_SERVER_SETTINGS: &str = "k3s-server-settings";
    /// [`crate::domain::backup::token_fingerprint`] of the server token (not secret: it is in
    /// every backup's description), written by bootstrap: the in-cluster backup tags its
    /// backups with it without reading the token (audit security-2 N1).
    pub const K3S_TOKEN_FINGERPRINT: &str = "k3s-token-fingerprint";
    /// When bootstrap removed the retired keys (the SSH private key an older controller kept)
    /// from the Secret, RFC 3339, or `removing` while it does: no backup uploads an etcd
    /// snapshot taken before ([`crate::domain::backup::retired`], audit security-2 N1).
    pub const RETIRED_KEYS_REMOVED_AT: &str = crate::domain::backup::retired::CONFIG_KEY;
}

/// ConfigMap holding the webhook's counts and bounds ([`crate::domain::spec::scale`]): the
/// only object the webhook's account may update (audit security-2 N4).
pub const SCALE_OBJECT: &str = "oxide-controller-scale";

/// ConfigMap holding `backup.json` ([`keys::BACKUP`]): the only object the backup account may
/// update (audit security-2 N4). Clusters bootstrapped before it keep `backup.json` in the
/// ConfigMap, which is still read when this object has none.
pub const BACKUP_OBJECT: &str = "oxide-controller-backup";

/// Label on both objects.
pub const NAME_LABEL: (&str, &str) = ("app.kubernetes.io/name", "oxide-controller");

/// State store trouble.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{what} does not exist; run bootstrap first (or check --kubeconfig / the namespace)")]
    NotFound { what: String },
    #[error("{what} changed since it was read (HTTP 409)")]
    Conflict { what: String },
    #[error("not allowed to {what}: {message}")]
    Forbidden { what: String, message: String },
    #[error("{what} is malformed: {message}")]
    Malformed { what: String, message: String },
    #[error("Kubernetes API call {what} failed")]
    Api {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StateError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, StateError::Conflict { .. })
    }
}

/// The ConfigMap's data as read, with the version to write back against.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigSnapshot {
    pub resource_version: String,
    pub data: BTreeMap<String, String>,
}

impl ConfigSnapshot {
    pub fn spec_yaml(&self) -> Option<&str> {
        self.data.get(keys::SPEC).map(String::as_str)
    }
    pub fn status_json(&self) -> Option<&str> {
        self.data.get(keys::STATUS).map(String::as_str)
    }
}

/// What [`StateStore::rewrite_secret_keys`] did to the Secret, by key name (never a value): the
/// keys it set to another value than they held (or added), and the retired keys
/// ([`crate::base::secrets::keys::RETIRED`]) it removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRewrite {
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// Reads and writes the two state objects.
pub trait StateStore: Send + Sync {
    fn read_config(&self) -> impl Future<Output = Result<ConfigSnapshot, StateError>> + Send;
    /// Replaces the ConfigMap's data with `data` if its resourceVersion is still
    /// `resource_version`; returns the new resourceVersion.
    fn replace_config(
        &self,
        resource_version: &str,
        data: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<String, StateError>> + Send;
    fn read_secrets(&self) -> impl Future<Output = Result<ClusterSecrets, StateError>> + Send;
    /// Bootstrap only: creates both objects if missing; fills in missing Secret keys and
    /// missing ConfigMap keys of existing objects (never overwrites a present value); creates
    /// an empty [`SCALE_OBJECT`] and [`BACKUP_OBJECT`] if missing.
    fn ensure_state(
        &self,
        secrets: &ClusterSecrets,
        config: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), StateError>> + Send;
    /// Adds `pins` (instance → SSH host key fingerprints) to the Secret's
    /// [`keys::HOST_KEY_PINS`] and returns everything it holds afterwards. Pins already stored
    /// for an instance are never replaced: a key that changed is for a person to check.
    fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> impl Future<Output = Result<BTreeMap<String, Vec<String>>, StateError>> + Send;

    /// ConfigMap [`SCALE_OBJECT`] with its resourceVersion; `None` when it does not exist (a
    /// cluster bootstrapped before it, or a store that keeps none: the default, for test
    /// doubles of the other methods). Then `spec.yaml` alone is the spec.
    fn read_scale(
        &self,
    ) -> impl Future<Output = Result<Option<ConfigSnapshot>, StateError>> + Send {
        std::future::ready(Ok(None))
    }
    /// Replaces [`SCALE_OBJECT`]'s data if its resourceVersion is still `resource_version`
    /// (409 → [`StateError::Conflict`]); returns the new resourceVersion.
    fn replace_scale(
        &self,
        resource_version: &str,
        data: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<String, StateError>> + Send {
        let _ = (resource_version, data);
        std::future::ready(Err(StateError::NotFound {
            what: format!("ConfigMap {SCALE_OBJECT}"),
        }))
    }

    /// ConfigMap [`BACKUP_OBJECT`] with its resourceVersion; `None` when it does not exist
    /// (as [`StateStore::read_scale`]).
    fn read_backups(
        &self,
    ) -> impl Future<Output = Result<Option<ConfigSnapshot>, StateError>> + Send {
        std::future::ready(Ok(None))
    }
    /// Replaces [`BACKUP_OBJECT`]'s data if its resourceVersion is still `resource_version`.
    fn replace_backups(
        &self,
        resource_version: &str,
        data: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<String, StateError>> + Send {
        let _ = (resource_version, data);
        std::future::ready(Err(StateError::NotFound {
            what: format!("ConfigMap {BACKUP_OBJECT}"),
        }))
    }

    /// `bootstrap rotate-ssh-key` only: sets the Secret's `ssh-public-key` (what new VMs'
    /// user-data authorizes) to `line`, read and written back against the version read (a
    /// 409 re-reads); nothing else changes.
    fn set_ssh_public_key(
        &self,
        line: &str,
    ) -> impl Future<Output = Result<(), StateError>> + Send {
        let _ = line;
        std::future::ready(Err(StateError::Malformed {
            what: "Secret kube-system/oxide-controller".to_owned(),
            message: "this store cannot set the SSH public key".to_owned(),
        }))
    }

    /// After a restore (`bootstrap recover --backup`, audit security-2 N6) and for `bootstrap
    /// rotate-oxide-token`: sets each key of `set` in the Secret, overwriting what it held, and
    /// removes the retired keys as [`Self::ensure_state`] does; one replace against the
    /// version read.
    fn rewrite_secret_keys(
        &self,
        set: &BTreeMap<String, Vec<u8>>,
    ) -> impl Future<Output = Result<SecretRewrite, StateError>> + Send {
        let _ = set;
        std::future::ready(Err(StateError::Malformed {
            what: "Secret kube-system/oxide-controller".to_owned(),
            message: "this store cannot rewrite the Secret".to_owned(),
        }))
    }

    /// The webhook's serving pair (Secret [`webhook_tls::TLS_SECRET`]) with its
    /// resourceVersion; `None` when there is no such Secret (a cluster bootstrapped before it,
    /// or a store that keeps none: the default, for test doubles of the other methods).
    fn read_webhook_tls(
        &self,
    ) -> impl Future<Output = Result<Option<(String, WebhookTls)>, StateError>> + Send {
        std::future::ready(Ok(None))
    }
    /// The webhook CA's certificate and key (Secret [`webhook_tls::CA_SECRET`]); `None` when
    /// there is none.
    fn read_webhook_ca(
        &self,
    ) -> impl Future<Output = Result<Option<WebhookCa>, StateError>> + Send {
        std::future::ready(Ok(None))
    }
    /// Replaces the serving pair if the Secret is still at `resource_version` (409 →
    /// [`StateError::Conflict`]).
    fn replace_webhook_tls(
        &self,
        resource_version: &str,
        tls: &WebhookTls,
    ) -> impl Future<Output = Result<(), StateError>> + Send {
        let _ = (resource_version, tls);
        std::future::ready(Err(StateError::Malformed {
            what: format!("Secret {}", webhook_tls::TLS_SECRET),
            message: "this store keeps no webhook certificate".to_owned(),
        }))
    }
    /// Bootstrap only: creates either webhook Secret that is missing (never replaces one: a
    /// pair the reconcile re-issued stays).
    fn ensure_webhook_tls(
        &self,
        tls: &WebhookTls,
        ca: &WebhookCa,
    ) -> impl Future<Output = Result<(), StateError>> + Send {
        let _ = (tls, ca);
        std::future::ready(Ok(()))
    }

    /// The webhook's bearer tokens (Secret [`webhook_tls::AUTH_SECRET`]); `None` when there is
    /// no such Secret or it holds no write token (a store that keeps none: the default).
    fn read_webhook_tokens(
        &self,
    ) -> impl Future<Output = Result<Option<WebhookTokens>, StateError>> + Send {
        std::future::ready(Ok(None))
    }
    /// Bootstrap only: creates Secret [`webhook_tls::AUTH_SECRET`] when it is missing (never
    /// replaces one: a token rotated by hand stays), with the cluster Secret's
    /// [`crate::base::secrets::keys::MOVED_TO_WEBHOOK_AUTH`] when an older controller left
    /// them there (the values in force) or else `tokens`; then removes those keys from the
    /// cluster Secret. Returns the tokens in force.
    fn ensure_webhook_tokens(
        &self,
        tokens: &WebhookTokens,
    ) -> impl Future<Output = Result<WebhookTokens, StateError>> + Send {
        std::future::ready(Ok(tokens.clone()))
    }
    /// After a restore only (`bootstrap recover --backup`, audit security-2 N6): sets
    /// [`webhook_tls::AUTH_SECRET`] to `tokens` (created if the backup predates it) and
    /// removes the moved keys from the cluster Secret, as [`Self::ensure_webhook_tokens`] does.
    /// True if the cluster Secret held them (a backup from before the move).
    fn replace_webhook_tokens(
        &self,
        tokens: &WebhookTokens,
    ) -> impl Future<Output = Result<bool, StateError>> + Send {
        let _ = tokens;
        std::future::ready(Err(StateError::Malformed {
            what: format!("Secret {}", webhook_tls::AUTH_SECRET),
            message: "this store keeps no webhook tokens".to_owned(),
        }))
    }
}

/// Changes `backup.json` with `edit`: in [`BACKUP_OBJECT`] (re-read and edited again on a
/// 409, five tries), or, in a cluster bootstrapped before that object, in the ConfigMap
/// ([`edit_config`]). `edit` gets the report's text as last written (from the ConfigMap
/// when the object has none yet) and returns the new text.
pub async fn edit_backups<S: StateStore + ?Sized>(
    state: &S,
    mut edit: impl FnMut(Option<&str>) -> String + Send,
) -> Result<(), StateError> {
    for _ in 0..5 {
        let Some(object) = state.read_backups().await? else {
            return edit_config(state, None, |data| {
                let text = edit(data.get(keys::BACKUP).map(String::as_str));
                data.insert(keys::BACKUP.to_owned(), text);
            })
            .await;
        };
        let legacy = match object.data.get(keys::BACKUP) {
            Some(_) => None,
            None => state.read_config().await?.data.remove(keys::BACKUP),
        };
        let was = object.data.get(keys::BACKUP).or(legacy.as_ref());
        let mut data = object.data.clone();
        data.insert(keys::BACKUP.to_owned(), edit(was.map(String::as_str)));
        match state.replace_backups(&object.resource_version, data).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StateError::Conflict {
        what: format!("ConfigMap {BACKUP_OBJECT}"),
    })
}

/// `backup.json` as last written: [`BACKUP_OBJECT`]'s, else (a cluster bootstrapped before it,
/// or no backup since) the ConfigMap's `snapshot`.
pub async fn read_backup_report<S: StateStore + ?Sized>(
    state: &S,
    snapshot: &ConfigSnapshot,
) -> Result<Option<String>, StateError> {
    let object = state.read_backups().await?;
    Ok(object
        .and_then(|o| o.data.get(keys::BACKUP).cloned())
        .or_else(|| snapshot.data.get(keys::BACKUP).cloned()))
}

/// Changes the ConfigMap's data with `edit` and writes it back against the version read: the
/// first time against `read` when given (usually still current: one request), then re-read. A
/// 409 (someone wrote meanwhile: the webhook's spec, a backup's report) re-reads and edits
/// again; a 5xx or timeout too, after a pause (the write may or may not have landed). Five
/// tries. Never a blind write: each edit sees what it replaces.
pub async fn edit_config<S: StateStore + ?Sized>(
    state: &S,
    read: Option<&ConfigSnapshot>,
    mut edit: impl FnMut(&mut BTreeMap<String, String>) + Send,
) -> Result<(), StateError> {
    let mut last = None;
    let mut known = read.cloned();
    for _ in 0..5 {
        let snap = match known.take() {
            Some(s) => s,
            None => state.read_config().await?,
        };
        let mut data = snap.data;
        edit(&mut data);
        match state.replace_config(&snap.resource_version, data).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_conflict() => last = Some(e),
            Err(e @ StateError::Api { .. }) => {
                last = Some(e);
                tokio::time::sleep(crate::ports::cluster::KUBE_BACKOFF.first).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(StateError::Conflict {
        what: "ConfigMap".into(),
    }))
}
