//! Plumbing the rest of the simulator stands on: the loopback HTTP accept loop and listener
//! registry, and per-process scratch directories.

pub mod net;
pub mod scratch;
