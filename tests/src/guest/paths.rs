//! The files k3s reads and writes on a guest.

/// Where k3s reads its configuration.
pub const K3S_CONFIG_PATH: &str = "/etc/rancher/k3s/config.yaml";
/// The admin kubeconfig k3s writes on servers.
pub const K3S_KUBECONFIG_PATH: &str = "/etc/rancher/k3s/k3s.yaml";
/// The server join token file (full `K10<ca-hash>::server:<token>` form).
pub const K3S_NODE_TOKEN_PATH: &str = "/var/lib/rancher/k3s/server/node-token";
pub const K3S_TOKEN_PATH: &str = "/var/lib/rancher/k3s/server/token";
pub const K3S_AGENT_TOKEN_PATH: &str = "/var/lib/rancher/k3s/server/agent-token";
/// Directory of k3s config drop-ins, read after `config.yaml` in lexical order.
pub const K3S_CONFIG_DROPIN_DIR: &str = "/etc/rancher/k3s/config.yaml.d/";
/// Where k3s saves etcd snapshots, on demand and scheduled, with the default
/// `etcd-snapshot-dir` (`${datadir}/server/db/snapshots`).
pub const SNAPSHOT_DIR: &str = "/var/lib/rancher/k3s/server/db/snapshots";
