//! Ports: the traits the executor and the workflows talk through, in domain types —
//! [`rack::Rack`] (Oxide), [`cluster::Cluster`] (Kubernetes), [`state::StateStore`] (the
//! Secret and ConfigMap), [`manifests::ApplyManifests`] (bootstrap's server-side apply), [`channel::ReleaseChannels`] (k3s's release channels). Their implementations are in [`crate::adapters`]; in-memory ones
//! in `crate::fake` (feature `testing`).

pub mod channel;
pub mod cluster;
pub mod manifests;
pub mod rack;
pub mod state;
