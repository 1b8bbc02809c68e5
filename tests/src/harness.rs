//! The harness: [`sim::Sim::start`] wires the rack API, the control planes, the guests and the
//! admin API together; [`handle::SimHandle`] is what tests hold; presets start with a cluster.

pub mod admin;
pub mod handle;
pub mod preset;
pub mod releases;
pub mod sim;
