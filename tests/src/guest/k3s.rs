//! The simulated k3s: its config file and drop-ins, join tokens (bare and `K10<ca-hash>::`
//! form), and the decision to create, join, retry or refuse, judged against the one cluster.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::k3s_config::{K3sConfig, Role};
use super::kubelet::node_object;
use super::{Cluster, Inner, K3sState};
use crate::support::net::ListenerKind;

// ---------------------------------------------------------------------------------------------
// tokens

/// `K10<sha256 hex of the CA bundle>`, the prefix of k3s full-format tokens.
pub fn ca_hash(ca_pem: &str) -> String {
    let digest = Sha256::digest(ca_pem.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

enum TokenCheck {
    Ok,
    CaHashMismatch,
    Wrong,
}

/// Compares a presented token (bare secret or `K10<hash>::<user>:<secret>`) with the accepted
/// secrets in constant-ish time (the simulator is not an oracle worth timing, but why not).
fn check_token(given: &str, accepted: &[&str], ca_hash: &str) -> TokenCheck {
    let secret = match given
        .strip_prefix("K10")
        .and_then(|rest| rest.split_once("::"))
    {
        Some((hash, creds)) => {
            if hash != ca_hash {
                return TokenCheck::CaHashMismatch;
            }
            creds.split_once(':').map(|(_, pass)| pass).unwrap_or(creds)
        }
        None => given,
    };
    if accepted
        .iter()
        .any(|a| subtle_eq(a.as_bytes(), secret.as_bytes()))
    {
        TokenCheck::Ok
    } else {
        TokenCheck::Wrong
    }
}

/// The password of k3s's `server` user for a server token: the token itself, or the secret
/// after `K10<hash>::server:` in a full-format one.
pub(crate) fn token_secret(token: &str) -> &str {
    match token.strip_prefix("K10").and_then(|r| r.split_once("::")) {
        Some((_, creds)) => creds.split_once(':').map_or(creds, |(_, pass)| pass),
        None => token,
    }
}

fn subtle_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Host and port of a `https://HOST:PORT` server URL.
/// The loopback stand-in of `ip` when it is an address of the VPC subnet of a guest whose
/// NIC is `own` (rack view) on `own_loopback`.
fn in_own_vpc(ip: IpAddr, own: IpAddr, own_loopback: IpAddr) -> Option<IpAddr> {
    let (IpAddr::V4(ip), IpAddr::V4(own), IpAddr::V4(lo)) = (ip, own, own_loopback) else {
        return None;
    };
    crate::oxide::subnet::VpcSubnet::peer_loopback(ip, own, lo).map(IpAddr::V4)
}

fn parse_server_url(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, port) = v6.split_once("]:")?;
        return Some((host.to_string(), port.parse().ok()?));
    }
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "443"));
    Some((host.to_string(), port.parse().ok()?))
}

/// Prefixes of k3s's own messages, so the console reads like a real k3s log.
const PREPARING: &str = "starting kubernetes: preparing server";
const CA_MISMATCH: &str = "token CA hash does not match the Cluster CA certificate hash";

pub(super) enum Decision {
    /// Initialise a new cluster.
    Create,
    /// Join (or, restarting, rejoin) the cluster created by this VM.
    Join(Uuid),
    /// Log the error and try again in 2 s: an agent that cannot validate its token
    /// (k3s `pkg/agent/run.go` `createProxyAndValidateToken`).
    RetryError(String),
    /// k3s exits (systemd starts it again).
    Fatal(String),
    /// Logged already; try again after the retry interval (the node password refused).
    Wait,
}

impl Inner {
    pub(super) fn set_k3s(&self, id: Uuid, generation: u64, k3s: K3sState) {
        let mut st = self.state();
        if let Some(vm) = st.vms.get_mut(&id).filter(|v| v.generation == generation) {
            vm.k3s = k3s;
        }
    }

    /// What k3s does next, judged against the cluster and what is listening right now.
    pub(super) fn decide(&self, id: Uuid, role: Role, k3s: &K3sConfig) -> Decision {
        let guard = self.listeners.lock();
        let st = self.state();
        let Some(vm) = st.vms.get(&id) else {
            return Decision::Fatal("instance vanished".into());
        };
        if role == Role::Server {
            if let Some(cluster) = st.cluster_of(id).filter(|_| vm.member) {
                // Restart with the datastore on disk: no join needed, only the same token.
                let check = k3s
                    .token
                    .as_deref()
                    .map(|t| check_token(t, &[&cluster.token], &cluster.ca_hash));
                return match check {
                    None | Some(TokenCheck::Ok) => Decision::Join(cluster.creator),
                    Some(_) => Decision::Fatal(format!(
                        "{PREPARING}: bootstrap data already found and encrypted with different token"
                    )),
                };
            }
            // A server told no other server initialises a cluster of its own (etcd with
            // `cluster-init`), whatever other clusters exist on the rack.
            if k3s.server.is_none() {
                return Decision::Create;
            }
        }
        let Some(url) = k3s.server.as_deref() else {
            return Decision::Fatal("Error: --server is required".into());
        };
        let Some((host, port)) = parse_server_url(url) else {
            return Decision::Fatal(format!(
                "Error: invalid server url {url}: must be https://host:port"
            ));
        };
        // The join URL cannot be reached: `getCACerts` fails inside `ParseAndValidateToken`.
        // A joining server exits (`shouldBootstrapLoad`); an agent logs it and retries.
        let unreachable = |why: String| {
            let err = format!("failed to get CA certs: Get \\\"{url}/cacerts\\\": {why}");
            match role {
                Role::Server => {
                    Decision::Fatal(format!("{PREPARING}: failed to validate token: {err}"))
                }
                Role::Agent => Decision::RetryError(format!(
                    "Failed to validate connection to cluster at {url}: {err}"
                )),
            }
        };
        let Ok(ip) = host.parse::<IpAddr>() else {
            return unreachable(format!("dial tcp: lookup {host}: no such host"));
        };
        // A private address names a NIC in the joiner's own VPC (every project's subnet is
        // 172.30.0.0/22); the connection goes to that NIC's loopback stand-in.
        let ip = st
            .vms
            .get(&id)
            .and_then(|vm| in_own_vpc(ip, vm.private_ip?, vm.private_loopback?))
            .unwrap_or(ip);
        // The cluster whose API answers at the server URL: that of the server serving it.
        let target = guard
            .serving_owner(SocketAddr::new(ip, port), ListenerKind::KubeApi)
            .and_then(|owner| st.cluster_of(owner));
        // The rack's VPC firewall judges the joiner's connection like any other.
        let admitted = self.oxide.get().is_none_or(|o| {
            o.tcp_admitted(crate::oxide::Peer::Instance(id), SocketAddr::new(ip, port))
                .unwrap_or(true)
        });
        if target.is_some() && !admitted {
            return unreachable(format!("dial tcp {ip}:{port}: i/o timeout"));
        }
        let Some(cluster) = target else {
            return unreachable(format!("dial tcp {ip}:{port}: connect: connection refused"));
        };
        let accepted: Vec<&str> = match role {
            Role::Server => vec![cluster.token.as_str()],
            Role::Agent => vec![cluster.agent_token.as_str(), cluster.token.as_str()],
        };
        let Some(token) = k3s.token.as_deref() else {
            return Decision::Fatal("Error: --token is required".into());
        };
        match (check_token(token, &accepted, &cluster.ca_hash), role) {
            // A joining server fetches the cluster's critical configuration values and exits
            // when one differs from its own (see FIDELITY: k3s `compareConfig`).
            (TokenCheck::Ok, Role::Server) if critical_mismatch(k3s, cluster) => {
                Decision::Fatal(format!(
                    "{PREPARING}: failed to bootstrap cluster data: failed to validate server configuration: critical configuration value mismatch between servers"
                ))
            }
            (TokenCheck::Ok, Role::Server) => match self.etcd_blocked(&st, id, cluster.creator) {
                Some(peer) => Decision::Fatal(format!(
                    "{PREPARING}: failed to get etcd status: dial tcp {peer}: i/o timeout"
                )),
                None => Decision::Join(cluster.creator),
            },
            (TokenCheck::Ok, Role::Agent) => Decision::Join(cluster.creator),
            (TokenCheck::CaHashMismatch, Role::Server) => Decision::Fatal(format!(
                "{PREPARING}: failed to validate token: {CA_MISMATCH}"
            )),
            (TokenCheck::CaHashMismatch, Role::Agent) => Decision::RetryError(format!(
                "Failed to validate connection to cluster at {url}: {CA_MISMATCH} served at {url}/cacerts"
            )),
            (TokenCheck::Wrong, Role::Server) => Decision::Fatal(format!(
                "{PREPARING}: failed to validate token: {url}/v1-k3s/server-bootstrap: 401 Unauthorized"
            )),
            (TokenCheck::Wrong, Role::Agent) => Decision::RetryError(format!(
                "Failed to validate connection to cluster at {url}: {url}/v1-k3s/client-ca.crt: 401 Unauthorized"
            )),
        }
    }

    /// The first etcd address the VPC firewall keeps a joining server `id` from: servers of an
    /// embedded-etcd cluster talk on 2379-2380 between each other (k3s docs, "Inbound Rules
    /// for K3s Nodes"). The joiner reaches every running member server's private address on
    /// 2379 (client, member add) and 2380 (peer), and each of them reaches its own on 2380.
    fn etcd_blocked(&self, st: &super::State, id: Uuid, cluster: Uuid) -> Option<SocketAddr> {
        let oxide = self.oxide.get()?;
        let me = st.vms.get(&id)?;
        let (joiner, joiner_lo) = (me.private_ip?, me.private_loopback?);
        // Judged where the connection goes (the loopback stand-in), named as k3s logs it
        // (the private address).
        let blocked = |from: Uuid, to: IpAddr, port: u16| {
            oxide.tcp_admitted(
                crate::oxide::Peer::Instance(from),
                SocketAddr::new(to, port),
            ) == Some(false)
        };
        st.vms.iter().find_map(|(peer, vm)| {
            let member_server = *peer != id
                && vm.member
                && vm.running
                && vm.cluster == Some(cluster)
                && vm.user_data.as_ref().and_then(|u| u.role) == Some(Role::Server);
            let lo = vm.private_loopback.filter(|_| member_server)?;
            let ip = vm.private_ip?;
            [2379, 2380]
                .into_iter()
                .find(|port| blocked(id, lo, *port))
                .map(|port| SocketAddr::new(ip, port))
                .or_else(|| {
                    let back = SocketAddr::new(joiner, 2380);
                    blocked(*peer, joiner_lo, 2380).then_some(back)
                })
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_join(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        role: Role,
        k3s: &K3sConfig,
        version: &str,
        join: Option<Uuid>,
        started: Instant,
        prepared: Option<Arc<super::cluster_api::RealCluster>>,
    ) {
        let create = join.is_none();
        let renew_listeners;
        let node = {
            let mut st = self.state();
            let cluster = match join {
                Some(cluster) => cluster,
                None => {
                    let Some(api) = prepared else {
                        drop(st);
                        tracing::warn!(instance = %id, "a new cluster without a control plane");
                        self.set_k3s(id, generation, K3sState::Refused);
                        return;
                    };
                    let ca_hash = ca_hash(&api.ca_pem());
                    let token = k3s.token.clone().unwrap_or_else(random_token);
                    let agent_token = k3s.agent_token.clone().unwrap_or_else(|| token.clone());
                    let seq = st.clusters.values().map(|c| c.seq + 1).max().unwrap_or(0);
                    // k3s's supervisor serves the etcd member list to the `server` user.
                    api.proxy
                        .serve_db_info(api.control_plane.etcd().lister(), token_secret(&token));
                    st.clusters.insert(
                        id,
                        Cluster {
                            token,
                            agent_token,
                            creator: id,
                            api,
                            ca_hash,
                            seq,
                            critical: super::k3s_config::CRITICAL_KEYS
                                .iter()
                                .filter(|(key, _)| *key != "agent-token")
                                .map(|(key, _)| (key.to_string(), k3s.critical_value(key)))
                                .collect(),
                        },
                    );
                    self.run_node_removal_handlers(id);
                    id
                }
            };
            let Some(vm) = st
                .vms
                .get_mut(&id)
                .filter(|v| v.generation == generation && v.running)
            else {
                return;
            };
            vm.k3s = K3sState::Joined;
            // The process came up moments before it joined; the start is what its metrics say.
            vm.k3s_started = std::time::SystemTime::now();
            // k3s renews the node's leaf certificates on start when they are inside the
            // renewal window (see [`super::certs`]).
            let (end, renewed) =
                super::certs::on_start(vm.certs_end, vm.k3s_started, self.cfg.cert_lifetime);
            vm.certs_end = Some(end);
            renew_listeners = renewed;
            vm.member = true;
            // What a restore left on the disk is the member's data now.
            vm.restored = None;
            vm.cluster = Some(cluster);
            let name = k3s
                .node_name
                .clone()
                .unwrap_or_else(|| vm.hostname.to_lowercase());
            vm.node_name = Some(name.clone());
            // k3s's node IP without `node-ip`: the address of the interface holding the
            // default route (`GetHostnameAndIPs`, `ChooseHostInterface`) — the NIC's private
            // address; external addresses are NAT the guest never sees.
            let ip = vm.private_ip;
            let capacity = (vm.ncpus, vm.memory);
            let mut node = node_object(&name, &vm.hostname, id, role, k3s, version, ip, capacity);
            // k3s's etcd metadata controller names the server's member on its own Node.
            if let Some((member, address)) =
                vm.etcd_member.as_ref().filter(|_| role == Role::Server)
            {
                node["metadata"]["annotations"][super::etcd_member::NODE_NAME_ANNOTATION] =
                    serde_json::json!(member);
                node["metadata"]["annotations"][super::etcd_member::NODE_ADDRESS_ANNOTATION] =
                    serde_json::json!(address.to_string());
            }
            node
        };
        // `--disable-agent`: the server runs no kubelet, so nothing registers its Node and no
        // pod can run on it.
        if !(role == Role::Server && k3s.disable_agent) {
            self.register_node(node, id, generation);
        }
        if role == Role::Server {
            // Renewed certificates: the listeners serve the new ones from now on.
            if renew_listeners {
                self.close_api_listeners(id);
            }
            self.sync_listeners(id);
            if create {
                self.k3s_log(
                    id,
                    started,
                    "info",
                    "Cluster-Http-Server created; etcd cluster initialized",
                );
            }
            self.k3s_log(id, started, "info", "k3s is up and running");
        } else {
            self.k3s_log(
                id,
                started,
                "info",
                "Connected to proxy; k3s agent is running",
            );
        }
        tracing::info!(instance = %id, ?role, created = create, "k3s joined");
    }
}

/// Whether a joining server's critical configuration values differ from its cluster's: every
/// critical key either side sets, defaults filled in; `agent-token` only when the joiner sets
/// it (compared with the cluster's agent token).
fn critical_mismatch(k3s: &K3sConfig, cluster: &super::Cluster) -> bool {
    let agent_token = k3s
        .critical
        .get("agent-token")
        .is_some_and(|t| *t != cluster.agent_token);
    agent_token
        || cluster
            .critical
            .iter()
            .any(|(key, value)| k3s.critical_value(key) != *value)
}

pub(super) fn random_token() -> String {
    use rand::RngExt as _;
    let mut rng = rand::rng();
    (0..32)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::guest::cloud_init::tests::ud;

    #[test]
    fn config_drop_ins_layer_on_config_yaml_and_the_smbios_provider_id_step_is_recognised() {
        let ud = ud(concat!(
            "write_files:\n",
            "  - path: /etc/rancher/k3s/config.yaml\n",
            "    content: \"node-label: [a=1]\\nkubelet-arg: [v=2]\\n\"\n",
            "  - path: /etc/rancher/k3s/config.yaml.d/10-extra.yaml\n",
            "    content: \"node-label+: [b=2]\\nkubelet-arg: [v=3]\\n\"\n",
            "  - path: /usr/local/sbin/oxide-node-setup\n",
            "    content: |\n",
            "      #!/bin/sh\n",
            "      step provider-id\n",
            "      uuid=\"$(tr '[:upper:]' '[:lower:]' < /sys/class/dmi/id/product_uuid)\"\n",
            "      printf 'kubelet-arg+:\\n  - provider-id=oxide://%s\\n' \"$uuid\" > /etc/rancher/k3s/config.yaml.d/50-p.yaml\n",
            "runcmd:\n",
            "  - [/usr/local/sbin/oxide-node-setup]\n",
        ))
        .unwrap();
        let k3s = ud.k3s.unwrap();
        assert_eq!(k3s.node_label, ["a=1", "b=2"], "+ appends");
        assert_eq!(k3s.kubelet_arg, ["v=3"], "a plain key replaces");
        assert_eq!(ud.smbios_provider_id_prefix.as_deref(), Some("oxide://"));
    }

    #[test]
    fn tokens_match_bare_or_in_full_format_and_check_the_ca_hash() {
        assert!(matches!(check_token("abc", &["abc"], "h"), TokenCheck::Ok));
        assert!(matches!(
            check_token("K10h::server:abc", &["abc"], "h"),
            TokenCheck::Ok
        ));
        assert!(matches!(
            check_token("K10x::server:abc", &["abc"], "h"),
            TokenCheck::CaHashMismatch
        ));
        assert!(matches!(
            check_token("abd", &["abc"], "h"),
            TokenCheck::Wrong
        ));
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let cfg = K3sConfig {
            token: Some("s3cret".into()),
            ..Default::default()
        };
        assert!(!format!("{cfg:?}").contains("s3cret"));
    }
}
