//! Rendering layer: documents that leave the process and are read by something else —
//! cloud-init user-data for a member, and the new-instance request built from it. Pure;
//! imports the domain and base layers.

pub mod cloud_init;
pub mod members;
