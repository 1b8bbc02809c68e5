//! The harness: [`sim::Sim::start`] wires the rack API, the control planes, the guests and the
//! admin API (and the stand-ins for k3s's release downloads and channel server) together; [`handle::SimHandle`] is what tests hold; presets start with a cluster.

pub mod admin;
pub mod channels;
pub mod handle;
pub mod preset;
pub mod releases;
pub mod sim;
