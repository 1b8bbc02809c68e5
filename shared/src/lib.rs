//! oxide-controller: run k3s on an Oxide rack, kept healthy by short-lived jobs.
//!
//! The binaries in `functions/` are thin; everything they do lives here, in layers that only
//! import downwards (docs/DESIGN-NOTES.md "Layout"; `tests/tests/module_graph.rs` checks it):
//!
//! - [`base`]: names, sizes, cron, retry, secret material, logging;
//! - [`domain`]: the spec, the observed model, the planner, the autoscaler, status;
//! - [`render`]: cloud-init user-data and new-instance requests;
//! - [`ports`]: the `Rack`, `Cluster` and `StateStore` traits;
//! - [`adapters`]: those ports on the Oxide SDK, kube-rs and SSH, and the workflows' I/O;
//! - [`apply`]: the executor of a plan;
//! - [`workflows`]: bootstrap, reconcile, delete, scale;
//! - [`webhook`]: the scale webhook's HTTP function;
//! - `fake`: in-memory ports for tests (feature `testing`).

pub mod base;

pub mod domain;

pub mod render;

pub mod ports;

pub mod adapters;

pub mod apply;

pub mod workflows;

pub mod webhook;

#[cfg(any(test, feature = "testing"))]
pub mod fake;
