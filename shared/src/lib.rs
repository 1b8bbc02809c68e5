//! oxide-controller: run k3s on an Oxide rack, kept healthy by short-lived jobs.
//!
//! The binaries in `functions/` are thin; everything they do lives here. Pure modules:
//! `names`, `size`, `spec`, `model`, `secrets`, `cloud_init`, `plan`. Adapters behind narrow
//! traits: `rack` (Oxide), `cluster` (Kubernetes), `state` (Secret/ConfigMap), `ssh`.

pub mod apply;
pub mod autoscale;
pub mod cloud_init;
pub mod cluster;
pub mod credentials;
pub mod dev_image;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod firewall;
pub mod image;
pub mod kcron;
pub mod kube_cluster;
pub mod kube_store;
pub mod kubeclient;
pub mod kubeconfig;
pub mod manifests;
pub mod members;
pub mod model;
pub mod names;
pub mod oxide_rack;
pub mod plan;
pub mod rack;
pub mod resume;
pub mod retry;
pub mod secrets;
pub mod size;
pub mod spec;
pub mod ssh;
pub mod state;
pub mod status;
pub mod status_view;
pub mod tailscale;
pub mod telemetry;
pub mod webhook;
pub mod workflows;
