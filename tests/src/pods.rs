//! The part of a k3s node that stays ours: the runner that executes the product's own Job pods
//! that the real CronJob and Job controllers make (in-process, or as an OCI bundle under runc).

pub mod host_path;
pub mod oci_bundle;
pub mod runner;
