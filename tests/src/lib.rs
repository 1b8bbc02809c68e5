//! `oxide-sim`: a stand-in for an Oxide rack (the Oxide HTTP API) and the k3s cluster running
//! on it (a real Kubernetes control plane per cluster, see [`control_plane`], SSH on
//! control-plane VMs), for tests,
//! benchmarks and demos. Product code never knows it exists: it talks to the simulator over
//! HTTP and SSH exactly as to a real rack.
//!
//! Start one in-process with [`sim::Sim::start`], or run the `oxide-sim` binary.

#![forbid(unsafe_code)]

pub mod admin;
pub mod control_plane;
pub mod guest;
pub mod handle;
/// The guest module's former name, kept so code written against `boot::` still builds.
pub use guest as boot;
pub mod net;
pub mod oci_bundle;
pub mod oxide;
pub mod pod_runner;
pub mod preset;
pub mod scratch;
pub mod sim;
pub mod sshd;
pub mod tailscale;

pub use sim::{Sim, SimError, SimHandle, SimOptions};
pub use tailscale::TailscaleOptions;
