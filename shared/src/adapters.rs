//! Adapters: the ports implemented against the real systems (the Oxide SDK, kube-rs, SSH,
//! the Tailscale API, k3s's channel server), plus what does I/O for the workflows: credentials, image upload,
//! resume and kubeconfig files, manifests applied to the cluster (`kube_manifests`), dev builds.

pub mod client_csr;
pub mod credentials;
pub mod dev_image;
pub mod image;
pub mod k3s_channel;
pub mod kube_cluster;
pub mod kube_manifests;
pub mod kube_store;
pub mod kubeclient;
pub mod kubeconfig;
pub mod oxide_rack;
pub mod releases;
pub mod resume;
pub mod ssh;
pub mod tailscale;
pub mod webhook_tls;
