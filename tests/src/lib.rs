//! `oxide-sim`: a stand-in for an Oxide rack (the Oxide HTTP API) and the k3s cluster running
//! on it (a real Kubernetes control plane per cluster, see [`control_plane`], SSH on
//! control-plane VMs), for tests,
//! benchmarks and demos. Product code never knows it exists: it talks to the simulator over
//! HTTP and SSH exactly as to a real rack.
//!
//! Start one in-process with [`sim::Sim::start`], or run the `oxide-sim` binary.

#![forbid(unsafe_code)]

// What the simulator stands in for, lowest first (tests/tests/module_graph.rs `SIM_LAYERS`):

/// Loopback plumbing and scratch directories.
pub mod support;

/// The rack: the Oxide HTTP API.
pub mod oxide;

/// Kubernetes itself: the real control plane.
pub mod control_plane;

/// Tailscale: the coordination side and the one API endpoint the product calls.
pub mod tailscale;

/// The VM: cloud-init, k3s's start-up, the serial console, sshd.
pub mod guest;

/// The part of a k3s node that stays ours: running the product's own Job pods.
pub mod pods;

/// The harness: starting a simulator, its handle, presets, the admin API.
pub mod harness;

pub use harness::sim::{Sim, SimError, SimHandle, SimOptions};
pub use tailscale::TailscaleOptions;
