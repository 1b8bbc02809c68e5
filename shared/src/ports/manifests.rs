//! The `ApplyManifests` trait: putting the rendered in-cluster pieces
//! ([`crate::render::manifests`]) into the cluster, and the one Node label a dev build needs.
//! The kube-rs implementation is [`crate::adapters::kube_manifests::KubeManifests`]; tests use
//! `fake::connect` (feature `testing`).

use std::future::Future;

use crate::base::retry::Backoff;
use crate::render::manifests::{Manifest, ManifestError, Retired};

/// Server-side apply of the in-cluster pieces, and the one Node label a dev build needs.
pub trait ApplyManifests: Send + Sync {
    /// Applies every object in order (each retried with `retry` while the error is
    /// retryable); returns how many.
    fn apply_all(
        &self,
        manifests: &[Manifest],
        retry: Backoff,
    ) -> impl Future<Output = Result<usize, ManifestError>> + Send;
    /// Deletes each object that still exists (a missing one is fine: deleted before), each
    /// retried with `retry` while the error is retryable; returns how many were deleted.
    fn delete_retired(
        &self,
        objects: &[Retired],
        retry: Backoff,
    ) -> impl Future<Output = Result<usize, ManifestError>> + Send;
    /// Sets label `label=value` on Node `node` (one attempt); the error is the API's message.
    fn label_node(
        &self,
        node: &str,
        label: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), String>> + Send;
}
