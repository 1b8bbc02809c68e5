//! [`KubeStateStore`]: the [`StateStore`] trait over Secret and ConfigMap
//! `<namespace>/oxide-controller` with kube-rs. It owns the optimistic-concurrency protocol on
//! the wire (read returns the `resourceVersion`, write is a PUT carrying it, 409 becomes
//! [`StateError::Conflict`]) and the "fill in, never overwrite" rule of `ensure_state` (whose
//! one exception: keys an older version wrote that no version may keep, such as the SSH private
//! key, are removed).
//! What to write — merging specs, status documents — is the workflows' business, not this
//! module's.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::adapters::kubeclient::{api_message, api_status};
use crate::base::secrets::webhook::{self, WebhookCa, WebhookTls, WebhookTokens};
use crate::base::secrets::{ClusterSecrets, keys as secret_keys};
use crate::domain::backup::retired;
use crate::ports::cluster::OBJECT_NAME;
use crate::ports::state::{
    BACKUP_OBJECT, ConfigSnapshot, NAME_LABEL, SCALE_OBJECT, SecretRewrite, StateError, StateStore,
    keys as state_keys,
};

/// Read-fill-write rounds `ensure_state` makes per object before giving up with `Conflict`.
const ENSURE_ATTEMPTS: usize = 5;

/// The real [`StateStore`].
pub struct KubeStateStore {
    client: kube::Client,
    namespace: String,
    /// Metadata of the ConfigMap as last read or written. A replace against that
    /// resourceVersion keeps its annotations, owner references and finalizers (a PUT replaces
    /// all of metadata); against any other version only name and labels are sent.
    last_config_meta: Mutex<Option<ObjectMeta>>,
}

impl std::fmt::Debug for KubeStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStateStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Classifies a kube error for the object `what`.
pub fn state_error(what: impl Into<String>, err: kube::Error) -> StateError {
    let what = what.into();
    match api_status(&err) {
        Some(404) => StateError::NotFound { what },
        Some(409) => StateError::Conflict { what },
        Some(403) => StateError::Forbidden {
            what,
            message: api_message(&err),
        },
        _ => StateError::Api {
            what,
            source: Box::new(err),
        },
    }
}

fn name_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(NAME_LABEL.0.to_owned(), NAME_LABEL.1.to_owned())])
}

/// Adds our name label if it is missing; true if it did.
fn ensure_label(meta: &mut ObjectMeta) -> bool {
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    if labels.get(NAME_LABEL.0).map(String::as_str) == Some(NAME_LABEL.1) {
        return false;
    }
    labels.insert(NAME_LABEL.0.to_owned(), NAME_LABEL.1.to_owned());
    true
}

impl KubeStateStore {
    /// A store for the objects named `oxide-controller` in `namespace` (normally
    /// [`crate::ports::cluster::NAMESPACE`]).
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        KubeStateStore {
            client,
            namespace: namespace.to_owned(),
            last_config_meta: Mutex::new(None),
        }
    }

    /// The Kubernetes client this store uses.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    fn config_what(&self) -> String {
        format!("ConfigMap {}/{OBJECT_NAME}", self.namespace)
    }

    fn secret_what(&self) -> String {
        format!("Secret {}/{OBJECT_NAME}", self.namespace)
    }

    /// Adds `pins` (instance → fingerprints) to the Secret's [`crate::ports::state::keys::HOST_KEY_PINS`]
    /// and returns everything it holds afterwards. Pins already stored for an instance are
    /// never replaced: a key that changed is for the person to check, not to overwrite.
    pub async fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> Result<BTreeMap<String, Vec<String>>, StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = self.secret_what();
        for _ in 0..ENSURE_ATTEMPTS {
            let mut secret = api
                .get_opt(OBJECT_NAME)
                .await
                .map_err(|e| state_error(&what, e))?
                .ok_or_else(|| StateError::NotFound { what: what.clone() })?;
            let data = secret.data.get_or_insert_with(BTreeMap::new);
            let mut stored: BTreeMap<String, Vec<String>> =
                match data.get(crate::ports::state::keys::HOST_KEY_PINS) {
                    Some(v) => serde_json::from_slice(&v.0).map_err(|e| StateError::Malformed {
                        what: format!("{what} key {}", crate::ports::state::keys::HOST_KEY_PINS),
                        message: e.to_string(),
                    })?,
                    None => BTreeMap::new(),
                };
            let before = stored.len();
            for (instance, fps) in pins {
                stored
                    .entry(instance.clone())
                    .or_insert_with(|| fps.clone());
            }
            if stored.len() == before && data.contains_key(crate::ports::state::keys::HOST_KEY_PINS)
            {
                return Ok(stored);
            }
            let json = serde_json::to_vec(&stored).map_err(|e| StateError::Malformed {
                what: what.clone(),
                message: e.to_string(),
            })?;
            data.insert(
                crate::ports::state::keys::HOST_KEY_PINS.to_owned(),
                ByteString(json),
            );
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &secret)
                .await
            {
                Ok(_) => return Ok(stored),
                Err(e) if api_status(&e) == Some(409) => continue,
                Err(e) => return Err(state_error(&what, e)),
            }
        }
        Err(StateError::Conflict { what })
    }

    fn fresh_meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(OBJECT_NAME.to_owned()),
            namespace: Some(self.namespace.clone()),
            labels: Some(name_labels()),
            ..ObjectMeta::default()
        }
    }

    fn remember_config_meta(&self, meta: &ObjectMeta) {
        let kept = ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            resource_version: meta.resource_version.clone(),
            labels: meta.labels.clone(),
            annotations: meta.annotations.clone(),
            owner_references: meta.owner_references.clone(),
            finalizers: meta.finalizers.clone(),
            ..ObjectMeta::default()
        };
        *self
            .last_config_meta
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(kept);
    }

    /// Metadata for a replace against `resource_version`.
    fn config_meta_for(&self, resource_version: &str) -> ObjectMeta {
        let cached = self
            .last_config_meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut meta = cached
            .filter(|m| m.resource_version.as_deref() == Some(resource_version))
            .unwrap_or_else(|| self.fresh_meta());
        meta.resource_version = Some(resource_version.to_owned());
        ensure_label(&mut meta);
        meta
    }

    /// Creates the Secret with `wanted`, or fills in the keys it lacks (with `overwrite`, sets
    /// those whose value differs too), and removes the retired keys. Returns what it changed.
    async fn ensure_secret(
        &self,
        wanted: BTreeMap<String, Vec<u8>>,
        overwrite: bool,
    ) -> Result<SecretRewrite, StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = self.secret_what();
        for _ in 0..ENSURE_ATTEMPTS {
            let Some(mut secret) = api
                .get_opt(OBJECT_NAME)
                .await
                .map_err(|e| state_error(&what, e))?
            else {
                let secret = Secret {
                    metadata: self.fresh_meta(),
                    type_: Some("Opaque".to_owned()),
                    data: Some(
                        wanted
                            .iter()
                            .map(|(k, v)| (k.clone(), ByteString(v.clone())))
                            .collect(),
                    ),
                    ..Secret::default()
                };
                match api.create(&PostParams::default(), &secret).await {
                    Ok(_) => {
                        return Ok(SecretRewrite {
                            changed: wanted.into_keys().collect(),
                            removed: Vec::new(),
                        });
                    }
                    // Someone else created it first: fill in what theirs lacks.
                    Err(e) if api_status(&e) == Some(409) => continue,
                    Err(e) => return Err(state_error(&what, e)),
                }
            };
            let mut changed = ensure_label(&mut secret.metadata);
            let mut done = SecretRewrite::default();
            let data = secret.data.get_or_insert_with(BTreeMap::new);
            for (key, value) in &wanted {
                let set = match data.get(key) {
                    None => true,
                    Some(had) => overwrite && had.0 != *value,
                };
                if set {
                    data.insert(key.clone(), ByteString(value.clone()));
                    done.changed.push(key.clone());
                }
            }
            for key in secret_keys::RETIRED {
                if data.remove(*key).is_some() {
                    done.removed.push((*key).to_owned());
                }
            }
            changed |= !done.changed.is_empty() || !done.removed.is_empty();
            if !changed {
                return Ok(done);
            }
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &secret)
                .await
            {
                Ok(_) => return Ok(done),
                Err(e) if api_status(&e) == Some(409) => continue,
                Err(e) => return Err(state_error(&what, e)),
            }
        }
        Err(StateError::Conflict { what })
    }

    /// Creates ConfigMap `name` with `data` unless it exists (its data is its writer's: never
    /// replaced here).
    async fn ensure_object(
        &self,
        name: &str,
        data: BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = format!("ConfigMap {}/{name}", self.namespace);
        if api
            .get_opt(name)
            .await
            .map_err(|e| state_error(&what, e))?
            .is_some()
        {
            return Ok(());
        }
        let mut metadata = self.fresh_meta();
        metadata.name = Some(name.to_owned());
        let config = ConfigMap {
            metadata,
            data: Some(data),
            ..ConfigMap::default()
        };
        match api.create(&PostParams::default(), &config).await {
            Ok(_) => Ok(()),
            Err(e) if api_status(&e) == Some(409) => Ok(()),
            Err(e) => Err(state_error(&what, e)),
        }
    }

    /// ConfigMap `name` with its resourceVersion, `None` when it does not exist.
    async fn read_object(&self, name: &str) -> Result<Option<ConfigSnapshot>, StateError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = format!("ConfigMap {}/{name}", self.namespace);
        let Some(config) = api.get_opt(name).await.map_err(|e| state_error(&what, e))? else {
            return Ok(None);
        };
        let resource_version =
            config
                .metadata
                .resource_version
                .ok_or_else(|| StateError::Malformed {
                    what,
                    message: "the API returned it without a resourceVersion".to_owned(),
                })?;
        Ok(Some(ConfigSnapshot {
            resource_version,
            data: config.data.unwrap_or_default(),
        }))
    }

    /// Replaces ConfigMap `name`'s data against `resource_version`.
    async fn replace_object(
        &self,
        name: &str,
        resource_version: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = format!("ConfigMap {}/{name}", self.namespace);
        let mut metadata = self.fresh_meta();
        metadata.name = Some(name.to_owned());
        metadata.resource_version = Some(resource_version.to_owned());
        let config = ConfigMap {
            metadata,
            data: Some(data),
            ..ConfigMap::default()
        };
        let written = match api.replace(name, &PostParams::default(), &config).await {
            Ok(w) => w,
            // As for the ConfigMap (`replace_config`): an answer lost after the write landed
            // must not make the caller apply a relative change twice.
            Err(e) if crate::adapters::kubeclient::outcome_unknown(&e) => {
                match api.get_opt(name).await {
                    Ok(Some(now))
                        if now.data == config.data
                            && now.metadata.resource_version.as_deref()
                                != Some(resource_version) =>
                    {
                        now
                    }
                    _ => return Err(state_error(&what, e)),
                }
            }
            Err(e) => return Err(state_error(&what, e)),
        };
        written
            .metadata
            .resource_version
            .ok_or_else(|| StateError::Malformed {
                what,
                message: "the API answered the replace without a resourceVersion".to_owned(),
            })
    }

    async fn ensure_config(&self, wanted: BTreeMap<String, String>) -> Result<(), StateError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = self.config_what();
        for _ in 0..ENSURE_ATTEMPTS {
            let Some(mut config) = api
                .get_opt(OBJECT_NAME)
                .await
                .map_err(|e| state_error(&what, e))?
            else {
                let config = ConfigMap {
                    metadata: self.fresh_meta(),
                    data: Some(wanted.clone()),
                    ..ConfigMap::default()
                };
                match api.create(&PostParams::default(), &config).await {
                    Ok(_) => return Ok(()),
                    Err(e) if api_status(&e) == Some(409) => continue,
                    Err(e) => return Err(state_error(&what, e)),
                }
            };
            let mut changed = ensure_label(&mut config.metadata);
            let data = config.data.get_or_insert_with(BTreeMap::new);
            for (key, value) in &wanted {
                if !data.contains_key(key) {
                    data.insert(key.clone(), value.clone());
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &config)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if api_status(&e) == Some(409) => continue,
                Err(e) => return Err(state_error(&what, e)),
            }
        }
        Err(StateError::Conflict { what })
    }
}

impl KubeStateStore {
    /// Whether the Secret holds a key of [`secret_keys::RETIRED`] (false when there is none).
    async fn secret_holds_retired(&self) -> Result<bool, StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = api
            .get_opt(OBJECT_NAME)
            .await
            .map_err(|e| state_error(self.secret_what(), e))?;
        Ok(secret
            .and_then(|s| s.data)
            .is_some_and(|d| secret_keys::RETIRED.iter().any(|k| d.contains_key(*k))))
    }

    /// The Secret holds no retired key now: a record that does not say when (`removing`, left
    /// by this run or one cut short, or unreadable) becomes the time.
    async fn finish_retired_removal(&self) -> Result<(), StateError> {
        let key = state_keys::RETIRED_KEYS_REMOVED_AT;
        let read = self.read_config().await?;
        let unfinished = read.data.get(key).is_some_and(|v| {
            !matches!(
                retired::RetiredKeys::parse(v),
                Some(retired::RetiredKeys::RemovedAt(_))
            )
        });
        if !unfinished {
            return Ok(());
        }
        let now = chrono::Utc::now();
        crate::ports::state::edit_config(self, Some(&read), |data| {
            if let Some(v) = retired::finished(data.get(key).map(String::as_str), now) {
                data.insert(key.to_owned(), v);
            }
        })
        .await
    }
}

impl StateStore for KubeStateStore {
    async fn read_config(&self) -> Result<ConfigSnapshot, StateError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = api
            .get(OBJECT_NAME)
            .await
            .map_err(|e| state_error(self.config_what(), e))?;
        self.remember_config_meta(&config.metadata);
        let resource_version =
            config
                .metadata
                .resource_version
                .clone()
                .ok_or_else(|| StateError::Malformed {
                    what: self.config_what(),
                    message: "the API returned it without a resourceVersion".to_owned(),
                })?;
        Ok(ConfigSnapshot {
            resource_version,
            data: config.data.unwrap_or_default(),
        })
    }

    async fn replace_config(
        &self,
        resource_version: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = ConfigMap {
            metadata: self.config_meta_for(resource_version),
            data: Some(data),
            ..ConfigMap::default()
        };
        let written = match api
            .replace(OBJECT_NAME, &PostParams::default(), &config)
            .await
        {
            Ok(w) => w,
            // A 5xx or a lost answer says nothing about whether the write landed (a 504 "may
            // still be processing the request"); a retry with the same resourceVersion would
            // then get 409 and re-apply its edit to what it already wrote. Look instead: the
            // ConfigMap holding exactly this data under a newer resourceVersion means it did.
            Err(e) if crate::adapters::kubeclient::outcome_unknown(&e) => {
                match api.get_opt(OBJECT_NAME).await {
                    Ok(Some(now))
                        if now.data == config.data
                            && now.metadata.resource_version.as_deref()
                                != Some(resource_version) =>
                    {
                        tracing::debug!(
                            error = %e,
                            "the ConfigMap replace was answered with an error but had landed"
                        );
                        now
                    }
                    _ => return Err(state_error(self.config_what(), e)),
                }
            }
            Err(e) => return Err(state_error(self.config_what(), e)),
        };
        self.remember_config_meta(&written.metadata);
        written
            .metadata
            .resource_version
            .ok_or_else(|| StateError::Malformed {
                what: self.config_what(),
                message: "the API answered the replace without a resourceVersion".to_owned(),
            })
    }

    async fn read_secrets(&self) -> Result<ClusterSecrets, StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = api
            .get(OBJECT_NAME)
            .await
            .map_err(|e| state_error(self.secret_what(), e))?;
        let map = plain(secret.data.unwrap_or_default());
        ClusterSecrets::from_map(&map).map_err(|e| StateError::Malformed {
            what: self.secret_what(),
            message: format!(
                "key {:?} is missing or not UTF-8; re-run bootstrap to repair it",
                e.key
            ),
        })
    }

    async fn ensure_state(
        &self,
        secrets: &ClusterSecrets,
        config: BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        // Audit security-2 N1: a removal of retired keys is recorded for the backups, first as
        // `removing`, then as its time ([`crate::domain::backup::retired`]).
        let retiring = self.secret_holds_retired().await?;
        if retiring {
            self.ensure_config(config.clone()).await?;
            crate::ports::state::edit_config(self, None, |data| {
                data.insert(
                    state_keys::RETIRED_KEYS_REMOVED_AT.to_owned(),
                    retired::REMOVING.to_owned(),
                );
            })
            .await?;
        }
        self.ensure_secret(secrets.to_map(), false).await?;
        self.ensure_config(config).await?;
        self.finish_retired_removal().await?;
        let scale = BTreeMap::from([(
            crate::domain::spec::scale::KEY.to_owned(),
            crate::domain::spec::scale::ScaleOverrides::default().to_json(),
        )]);
        self.ensure_object(SCALE_OBJECT, scale).await?;
        self.ensure_object(BACKUP_OBJECT, BTreeMap::new()).await
    }

    async fn read_scale(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        self.read_object(SCALE_OBJECT).await
    }

    async fn replace_scale(
        &self,
        resource_version: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.replace_object(SCALE_OBJECT, resource_version, data)
            .await
    }

    async fn read_backups(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        self.read_object(BACKUP_OBJECT).await
    }

    async fn replace_backups(
        &self,
        resource_version: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.replace_object(BACKUP_OBJECT, resource_version, data)
            .await
    }

    async fn rewrite_secret_keys(
        &self,
        set: &BTreeMap<String, Vec<u8>>,
    ) -> Result<SecretRewrite, StateError> {
        self.ensure_secret(set.clone(), true).await
    }

    async fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> Result<BTreeMap<String, Vec<String>>, StateError> {
        KubeStateStore::merge_host_key_pins(self, pins).await
    }

    async fn set_ssh_public_key(&self, line: &str) -> Result<(), StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = self.secret_what();
        for _ in 0..ENSURE_ATTEMPTS {
            let mut secret = api
                .get_opt(OBJECT_NAME)
                .await
                .map_err(|e| state_error(&what, e))?
                .ok_or_else(|| StateError::NotFound { what: what.clone() })?;
            let data = secret.data.get_or_insert_with(BTreeMap::new);
            let value = ByteString(line.as_bytes().to_vec());
            if data.get(secret_keys::SSH_PUBLIC_KEY) == Some(&value) {
                return Ok(());
            }
            data.insert(secret_keys::SSH_PUBLIC_KEY.to_owned(), value);
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &secret)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if api_status(&e) == Some(409) => continue,
                Err(e) => return Err(state_error(&what, e)),
            }
        }
        Err(StateError::Conflict { what })
    }

    async fn read_webhook_tls(&self) -> Result<Option<(String, WebhookTls)>, StateError> {
        let Some((rv, data)) = self.read_named(webhook::TLS_SECRET).await? else {
            return Ok(None);
        };
        let what = self.named_what(webhook::TLS_SECRET);
        Ok(Some((
            rv,
            WebhookTls {
                ca_pem: text(&data, webhook::keys::CA_CERT, &what)?,
                cert_pem: text(&data, webhook::keys::CERT, &what)?,
                key_pem: text(&data, webhook::keys::KEY, &what)?,
            },
        )))
    }

    async fn read_webhook_ca(&self) -> Result<Option<WebhookCa>, StateError> {
        let Some((_, data)) = self.read_named(webhook::CA_SECRET).await? else {
            return Ok(None);
        };
        let what = self.named_what(webhook::CA_SECRET);
        Ok(Some(WebhookCa {
            ca_pem: text(&data, webhook::keys::CA_CERT, &what)?,
            ca_key_pem: text(&data, webhook::keys::CA_KEY, &what)?,
        }))
    }

    async fn replace_webhook_tls(
        &self,
        resource_version: &str,
        tls: &WebhookTls,
    ) -> Result<(), StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut secret = webhook_tls_secret(&self.namespace, tls);
        secret.metadata.resource_version = Some(resource_version.to_owned());
        api.replace(webhook::TLS_SECRET, &PostParams::default(), &secret)
            .await
            .map(drop)
            .map_err(|e| state_error(self.named_what(webhook::TLS_SECRET), e))
    }

    async fn ensure_webhook_tls(&self, tls: &WebhookTls, ca: &WebhookCa) -> Result<(), StateError> {
        let ca_secret = Secret {
            metadata: named_meta(webhook::CA_SECRET, &self.namespace),
            type_: Some("Opaque".to_owned()),
            data: Some(bytes(&[
                (webhook::keys::CA_CERT, &ca.ca_pem),
                (webhook::keys::CA_KEY, &ca.ca_key_pem),
            ])),
            ..Secret::default()
        };
        for secret in [webhook_tls_secret(&self.namespace, tls), ca_secret] {
            self.create_if_missing(secret).await?;
        }
        Ok(())
    }

    async fn read_webhook_tokens(&self) -> Result<Option<WebhookTokens>, StateError> {
        Ok(self
            .read_named(webhook::AUTH_SECRET)
            .await?
            .and_then(|(_, data)| WebhookTokens::from_map(&plain(data))))
    }

    async fn ensure_webhook_tokens(
        &self,
        tokens: &WebhookTokens,
    ) -> Result<WebhookTokens, StateError> {
        if self.read_named(webhook::AUTH_SECRET).await?.is_none() {
            // Audit H1's migration: an older controller kept the tokens in the cluster's
            // Secret; those are the ones clients hold (perhaps rotated by hand since).
            let moved = self
                .read_named(OBJECT_NAME)
                .await?
                .and_then(|(_, data)| WebhookTokens::from_map(&plain(data)));
            let wanted = moved.as_ref().unwrap_or(tokens);
            self.create_if_missing(webhook_auth_secret(&self.namespace, wanted))
                .await?;
        }
        // Created here or before (or by a run racing this one): what it holds is in force.
        let in_force = self
            .read_named(webhook::AUTH_SECRET)
            .await?
            .and_then(|(_, data)| WebhookTokens::from_map(&plain(data)))
            .unwrap_or_default();
        self.remove_moved_keys().await?;
        Ok(in_force)
    }

    async fn replace_webhook_tokens(&self, tokens: &WebhookTokens) -> Result<bool, StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = self.named_what(webhook::AUTH_SECRET);
        let mut written = false;
        for _ in 0..ENSURE_ATTEMPTS {
            let mut secret = webhook_auth_secret(&self.namespace, tokens);
            let result = match api
                .get_opt(webhook::AUTH_SECRET)
                .await
                .map_err(|e| state_error(&what, e))?
            {
                None => api.create(&PostParams::default(), &secret).await,
                Some(now) => {
                    secret.metadata.resource_version = now.metadata.resource_version;
                    api.replace(webhook::AUTH_SECRET, &PostParams::default(), &secret)
                        .await
                }
            };
            match result {
                Ok(_) => {
                    written = true;
                    break;
                }
                Err(e) if api_status(&e) == Some(409) => continue,
                Err(e) => return Err(state_error(&what, e)),
            }
        }
        if !written {
            return Err(StateError::Conflict { what });
        }
        self.remove_moved_keys().await
    }
}

/// Secret [`webhook::AUTH_SECRET`] holding `tokens`.
fn webhook_auth_secret(namespace: &str, tokens: &WebhookTokens) -> Secret {
    Secret {
        metadata: named_meta(webhook::AUTH_SECRET, namespace),
        type_: Some("Opaque".to_owned()),
        data: Some(
            tokens
                .to_map()
                .into_iter()
                .map(|(k, v)| (k, ByteString(v)))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// A Secret's data as plain bytes.
fn plain(data: BTreeMap<String, ByteString>) -> BTreeMap<String, Vec<u8>> {
    data.into_iter().map(|(k, v)| (k, v.0)).collect()
}

/// Secret [`webhook::TLS_SECRET`] holding `tls` (type `kubernetes.io/tls`).
fn webhook_tls_secret(namespace: &str, tls: &WebhookTls) -> Secret {
    Secret {
        metadata: named_meta(webhook::TLS_SECRET, namespace),
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(bytes(&[
            (webhook::keys::CERT, &tls.cert_pem),
            (webhook::keys::KEY, &tls.key_pem),
            (webhook::keys::CA_CERT, &tls.ca_pem),
        ])),
        ..Secret::default()
    }
}

fn named_meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(name_labels()),
        ..ObjectMeta::default()
    }
}

fn bytes(pairs: &[(&str, &String)]) -> BTreeMap<String, ByteString> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

/// Key `key` of a Secret's data as UTF-8 text, or a Malformed error naming the key.
fn text(data: &BTreeMap<String, ByteString>, key: &str, what: &str) -> Result<String, StateError> {
    data.get(key)
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| StateError::Malformed {
            what: what.to_owned(),
            message: format!("key {key:?} is missing or not UTF-8; re-run bootstrap to repair it"),
        })
}

impl KubeStateStore {
    fn named_what(&self, name: &str) -> String {
        format!("Secret {}/{name}", self.namespace)
    }

    /// Secret `name`'s resourceVersion and data, `None` when it does not exist.
    async fn read_named(
        &self,
        name: &str,
    ) -> Result<Option<(String, BTreeMap<String, ByteString>)>, StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(secret) = api
            .get_opt(name)
            .await
            .map_err(|e| state_error(self.named_what(name), e))?
        else {
            return Ok(None);
        };
        Ok(Some((
            secret.metadata.resource_version.unwrap_or_default(),
            secret.data.unwrap_or_default(),
        )))
    }

    /// Removes [`secret_keys::MOVED_TO_WEBHOOK_AUTH`] from the cluster's Secret (once
    /// [`webhook::AUTH_SECRET`] holds the tokens), against the version read; a 409 re-reads.
    /// True if it held any.
    async fn remove_moved_keys(&self) -> Result<bool, StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = self.secret_what();
        for _ in 0..ENSURE_ATTEMPTS {
            let Some(mut secret) = api
                .get_opt(OBJECT_NAME)
                .await
                .map_err(|e| state_error(&what, e))?
            else {
                return Ok(false);
            };
            let data = secret.data.get_or_insert_with(BTreeMap::new);
            let mut removed = false;
            for key in secret_keys::MOVED_TO_WEBHOOK_AUTH {
                removed |= data.remove(*key).is_some();
            }
            if !removed {
                return Ok(false);
            }
            match api
                .replace(OBJECT_NAME, &PostParams::default(), &secret)
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if api_status(&e) == Some(409) => continue,
                Err(e) => return Err(state_error(&what, e)),
            }
        }
        Err(StateError::Conflict { what })
    }

    /// Creates `secret` unless one of its name exists (whatever it holds: never replaced).
    async fn create_if_missing(&self, secret: Secret) -> Result<(), StateError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let name = secret.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(()),
            Err(e) if api_status(&e) == Some(409) => Ok(()),
            Err(e) => Err(state_error(self.named_what(&name), e)),
        }
    }
}
