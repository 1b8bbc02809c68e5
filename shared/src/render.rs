//! Rendering layer: documents that leave the process and are read by something else —
//! cloud-init user-data for a member, the new-instance request built from it, and the
//! in-cluster manifests bootstrap applies. Pure; imports the domain and base layers.

pub mod cloud_init;
pub mod manifests;
pub mod members;
