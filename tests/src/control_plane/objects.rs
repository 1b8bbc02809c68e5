//! Object access for tests, by `apiVersion` and `kind` over JSON (the shape test fixtures
//! are written in): server-side apply for create-or-update, get, list, delete. Kinds are
//! resolved through the apiserver's discovery, once per control plane.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::{Value, json};

use super::{ControlPlane, ControlPlaneError};

impl From<ObjectError> for ControlPlaneError {
    fn from(e: ObjectError) -> Self {
        ControlPlaneError::Object(Box::new(e))
    }
}

/// The field manager test fixtures apply as.
const FIELD_MANAGER: &str = "oxide-sim";

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The object has no `apiVersion`, `kind` or `metadata.name`.
    #[error("object is missing {0}")]
    Malformed(&'static str),
    /// Discovery does not know the kind.
    #[error("unknown kind {api_version}/{kind}: {source}")]
    UnknownKind {
        api_version: String,
        kind: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The apiserver refused or failed.
    #[error("{op} {kind} {name}: {source}")]
    Api {
        op: &'static str,
        kind: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// Resolved kinds: (apiVersion, kind) → resource and whether it is namespaced.
#[derive(Debug, Default)]
pub(super) struct KindCache(Mutex<HashMap<(String, String), (ApiResource, bool)>>);

/// `apiVersion`, `kind` and `metadata.name` of a fixture object.
fn ident(obj: &Value) -> Result<(&str, &str, &str), ObjectError> {
    let api_version = obj["apiVersion"]
        .as_str()
        .ok_or(ObjectError::Malformed("apiVersion"))?;
    let kind = obj["kind"].as_str().ok_or(ObjectError::Malformed("kind"))?;
    let name = obj["metadata"]["name"]
        .as_str()
        .ok_or(ObjectError::Malformed("metadata.name"))?;
    Ok((api_version, kind, name))
}

fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    match api_version.split_once('/') {
        Some((group, version)) => GroupVersionKind::gvk(group, version, kind),
        None => GroupVersionKind::gvk("", api_version, kind),
    }
}

impl ControlPlane {
    async fn api(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
    ) -> Result<Api<DynamicObject>, ObjectError> {
        let key = (api_version.to_string(), kind.to_string());
        let cached = self
            .kinds
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let (ar, namespaced) = match cached {
            Some(hit) => hit,
            None => {
                let (ar, caps) =
                    kube::discovery::pinned_kind(&self.client, &gvk(api_version, kind))
                        .await
                        .map_err(|source| ObjectError::UnknownKind {
                            api_version: api_version.into(),
                            kind: kind.into(),
                            source: Box::new(source),
                        })?;
                let hit = (ar, caps.scope == Scope::Namespaced);
                self.kinds
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, hit.clone());
                hit
            }
        };
        Ok(match (namespaced, ns) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        })
    }

    /// Creates or updates `obj` by server-side apply (forcing conflicts, as a test fixture
    /// owns what it writes), then applies its `status`, if any, through the status
    /// subresource (the main resource ignores it). Returns the stored object.
    pub async fn apply(&self, obj: Value) -> Result<Value, ObjectError> {
        let (api_version, kind, name) = ident(&obj)?;
        let ns = obj["metadata"]["namespace"].as_str();
        let api = self.api(api_version, kind, ns).await?;
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let err = |op| {
            move |source| ObjectError::Api {
                op,
                kind: kind.to_string(),
                name: name.to_string(),
                source: Box::new(source),
            }
        };
        let mut stored = api
            .patch(name, &pp, &Patch::Apply(&obj))
            .await
            .map_err(err("apply"))?;
        if let Some(status) = obj.get("status") {
            let body = json!({"apiVersion": api_version, "kind": kind, "status": status});
            stored = api
                .patch_status(name, &pp, &Patch::Apply(&body))
                .await
                .map_err(err("apply status of"))?;
        }
        serde_json::to_value(stored).map_err(|_| ObjectError::Malformed("serialisable object"))
    }

    /// Applies only `obj`'s `status` through the status subresource (what a kubelet or a
    /// controller writes), leaving the rest of the object alone.
    pub async fn apply_status(&self, obj: Value) -> Result<Value, ObjectError> {
        let (api_version, kind, name) = ident(&obj)?;
        let api = self
            .api(api_version, kind, obj["metadata"]["namespace"].as_str())
            .await?;
        let body = json!({"apiVersion": api_version, "kind": kind, "status": obj["status"]});
        let stored = api
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|source| ObjectError::Api {
                op: "apply status of",
                kind: kind.into(),
                name: name.into(),
                source: Box::new(source),
            })?;
        serde_json::to_value(stored).map_err(|_| ObjectError::Malformed("serialisable object"))
    }

    /// Creates `obj` (POST): fails with 409 if it exists.
    pub async fn create(&self, obj: Value) -> Result<Value, ObjectError> {
        let (api_version, kind, name) = ident(&obj)?;
        let api = self
            .api(api_version, kind, obj["metadata"]["namespace"].as_str())
            .await?;
        let dynamic: DynamicObject =
            serde_json::from_value(obj.clone()).map_err(|_| ObjectError::Malformed("object"))?;
        let stored = api
            .create(&kube::api::PostParams::default(), &dynamic)
            .await
            .map_err(|source| ObjectError::Api {
                op: "create",
                kind: kind.into(),
                name: name.into(),
                source: Box::new(source),
            })?;
        serde_json::to_value(stored).map_err(|_| ObjectError::Malformed("serialisable object"))
    }

    /// A JSON merge patch (RFC 7386) of the object.
    pub async fn merge_patch(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, ObjectError> {
        self.patch_impl(api_version, kind, ns, name, patch, false)
            .await
    }

    /// A JSON merge patch of the object's status subresource.
    pub async fn merge_patch_status(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, ObjectError> {
        self.patch_impl(api_version, kind, ns, name, patch, true)
            .await
    }

    async fn patch_impl(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> Result<Value, ObjectError> {
        let api = self.api(api_version, kind, ns).await?;
        let pp = PatchParams::default();
        let p = Patch::Merge(patch);
        let result = if status {
            api.patch_status(name, &pp, &p).await
        } else {
            api.patch(name, &pp, &p).await
        };
        let stored = result.map_err(|source| ObjectError::Api {
            op: "patch",
            kind: kind.into(),
            name: name.into(),
            source: Box::new(source),
        })?;
        serde_json::to_value(stored).map_err(|_| ObjectError::Malformed("serialisable object"))
    }

    /// The object, or `None` when it does not exist.
    pub async fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, ObjectError> {
        let api = self.api(api_version, kind, ns).await?;
        let obj = api.get_opt(name).await.map_err(|source| ObjectError::Api {
            op: "get",
            kind: kind.into(),
            name: name.into(),
            source: Box::new(source),
        })?;
        Ok(obj.and_then(|o| serde_json::to_value(o).ok()))
    }

    /// Every object of the kind (in `ns`, or everywhere).
    pub async fn list(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
    ) -> Result<Vec<Value>, ObjectError> {
        let api = self.api(api_version, kind, ns).await?;
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|source| ObjectError::Api {
                op: "list",
                kind: kind.into(),
                name: String::new(),
                source: Box::new(source),
            })?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect())
    }

    /// Deletes the object (default propagation, default grace); `false` when it was not there.
    pub async fn delete(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<bool, ObjectError> {
        self.delete_with(api_version, kind, ns, name, &DeleteParams::default())
            .await
    }

    /// Deletes with explicit options (grace period 0 to remove a pod at once, as
    /// `kubectl delete --force --grace-period=0` does).
    pub async fn delete_with(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<bool, ObjectError> {
        let api = self.api(api_version, kind, ns).await?;
        match api.delete(name, dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(source) => Err(ObjectError::Api {
                op: "delete",
                kind: kind.into(),
                name: name.into(),
                source: Box::new(source),
            }),
        }
    }
}
