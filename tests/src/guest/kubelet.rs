//! The kubelet k3s runs: node labels and taints from the k3s config, the Node object it
//! registers, and re-registration after a restart.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::Digest as _;
use uuid::Uuid;

use super::Inner;
use super::cluster_api::NODE_ARGS_ANNOTATION;
use super::k3s_config::{K3sConfig, Role, parse_label, parse_taint};

/// The kubelet's Ready=False message before the CNI is up (kubelet
/// `pkg/kubelet/nodestatus/setters.go` `ReadyCondition` with the runtime's network error).
const NOT_READY_MESSAGE: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

/// The taint a kubelet started with `--cloud-provider=external` registers its Node with
/// (k8s.io/cloud-provider `api/well_known_taints.go` `TaintExternalCloudProvider`).
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// Labels a kubelet may set on its own Node in the `kubernetes.io`/`k8s.io` namespaces
/// (k8s.io/kubelet `pkg/apis/well_known_labels.go`: `kubeletLabels`).
const KUBELET_LABELS: [&str; 11] = [
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// The kubelet's `ValidateKubeletFlags` on `--node-labels` (k3s passes `node-label` there):
/// a key in the `kubernetes.io`/`k8s.io` namespaces (or subdomains) must be one of
/// [`KUBELET_LABELS`] or in `kubelet.kubernetes.io`/`node.kubernetes.io`. `Some(message)`,
/// the kubelet's own, when it refuses to start.
pub(super) fn refused_node_labels(k3s: &K3sConfig) -> Option<String> {
    let mut unknown: Vec<String> = k3s
        .node_label
        .iter()
        .filter_map(|l| parse_label(l))
        .map(|(k, _)| k)
        .filter(|k| {
            let Some((ns, _)) = k.split_once('/') else {
                return false;
            };
            let within = |n: &str| ns == n || ns.ends_with(&format!(".{n}"));
            (within("kubernetes.io") || within("k8s.io"))
                && !KUBELET_LABELS.contains(&k.as_str())
                && !within("kubelet.kubernetes.io")
                && !within("node.kubernetes.io")
        })
        .collect();
    if unknown.is_empty() {
        return None;
    }
    unknown.sort();
    unknown.dedup();
    Some(format!(
        "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{}]\\n--node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix (kubelet.kubernetes.io, node.kubernetes.io) or be in the specifically allowed set ({})",
        unknown.join(" "),
        KUBELET_LABELS.join(", ")
    ))
}

impl Inner {
    /// Registers (or re-registers) the Node like a starting kubelet, in the VM's cluster's
    /// real API: a missing Node is created; an existing one keeps its spec (cordon, taints)
    /// and annotations and gets the kubelet-managed labels and a fresh status; KWOK then
    /// reports it Ready and heartbeats it (see [`super::cluster_api::register_real_node`]).
    pub(super) fn register_node(self: &Arc<Self>, fresh: Value, id: Uuid, generation: u64) {
        let Some(real) = self.api_of(&self.state(), id) else {
            return;
        };
        let inner = Arc::clone(self);
        self.runtime.spawn(async move {
            if !inner.current(id, generation) {
                return;
            }
            let name = fresh["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if let Err(err) =
                super::cluster_api::register_real_node(&real.control_plane, fresh).await
            {
                tracing::warn!(instance = %id, error = %err, "cannot register node");
            }
            // Halted while registering: the halt found no Node to silence, so do it here.
            if !inner.current(id, generation)
                && let Err(err) =
                    super::cluster_api::silence_real_node(&real.control_plane, &name).await
            {
                tracing::warn!(instance = %id, error = %err, "cannot stop the node's heartbeats");
            }
        });
    }
}

impl Inner {
    /// The Node `OnRemove` handlers of cluster `cluster`'s k3s servers: while at least one
    /// server of the cluster runs k3s, Nodes being deleted lose k3s's finalizers
    /// ([`super::cluster_api::finish_node_removals`]); with none running, they stay
    /// Terminating. Runs until the simulator closes.
    pub(super) fn run_node_removal_handlers(self: &Arc<Self>, cluster: Uuid) {
        let inner = Arc::clone(self);
        self.runtime.spawn(async move {
            while !inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
                let serving = {
                    let st = inner.state();
                    let running = st.vms.values().any(|v| {
                        v.cluster == Some(cluster)
                            && v.running
                            && v.k3s == super::K3sState::Joined
                            && v.user_data.as_ref().and_then(|u| u.role) == Some(Role::Server)
                    });
                    st.clusters
                        .get(&cluster)
                        .filter(|_| running)
                        .map(|c| Arc::clone(&c.api))
                };
                if let Some(api) = serving
                    && let Err(err) =
                        super::cluster_api::finish_node_removals(&api.control_plane).await
                {
                    tracing::debug!(error = %err, "k3s node removal handlers");
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        });
    }
}

/// What k3s's supervisor answers (403) when a node name's password does not match
/// (k3s `pkg/nodepassword` `ErrVerifyFailed`, as the agent logs it).
pub(super) const NODE_PASSWORD_REJECTED: &str = "Node password rejected, duplicate hostname or contents of '/etc/rancher/node/password' may not match server node-passwd entry, try enabling a unique node name with the --with-node-id flag";

impl Inner {
    /// k3s's node password check, before the kubelet may register: each VM has its own
    /// password (`/etc/rancher/node/password`), recorded for its node name in a Secret owned
    /// by the Node, so a VM registering the name of a Node another VM registered — still
    /// there, Terminating or not — is refused with a 403. `Some(k3s's log line)` then.
    /// "Another VM": the Node's `systemUUID` (the instance id the kubelet reported).
    pub(super) async fn node_password_refused(
        self: &Arc<Self>,
        id: Uuid,
        cluster: Uuid,
        k3s: &K3sConfig,
    ) -> Option<String> {
        let (api, name) = {
            let st = self.state();
            let vm = st.vms.get(&id)?;
            let name = k3s
                .node_name
                .clone()
                .unwrap_or_else(|| vm.hostname.to_lowercase());
            (Arc::clone(&st.clusters.get(&cluster)?.api), name)
        };
        let node = api
            .control_plane
            .get("v1", "Node", None, &name)
            .await
            .ok()??;
        let owner = node["status"]["nodeInfo"]["systemUUID"].as_str()?;
        (owner != id.to_string()).then(|| {
            format!(
                "Waiting to retrieve agent configuration; server is not ready: /var/lib/rancher/k3s/agent/serving-kubelet.crt: {NODE_PASSWORD_REJECTED}"
            )
        })
    }
}

/// The Node object a k3s kubelet registers. `capacity` is the VM's vCPUs and memory
/// (bytes); allocatable keeps the kubelet's default eviction threshold of memory back
/// (`memory.available<100Mi`), and 110 pods.
#[allow(clippy::too_many_arguments)]
pub(super) fn node_object(
    name: &str,
    hostname: &str,
    instance: Uuid,
    role: Role,
    k3s: &K3sConfig,
    version: &str,
    ip: Option<IpAddr>,
    capacity: (u16, u64),
) -> Value {
    let (cpus, memory) = capacity;
    let memory_ki = memory / 1024;
    let allocatable_ki = memory_ki.saturating_sub(100 * 1024);
    let mut labels = serde_json::Map::new();
    for (k, v) in [
        ("beta.kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/instance-type", "k3s"),
        ("beta.kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("node.kubernetes.io/instance-type", "k3s"),
    ] {
        labels.insert(k.into(), json!(v));
    }
    if role == Role::Server {
        labels.insert(
            "node-role.kubernetes.io/control-plane".into(),
            json!("true"),
        );
        labels.insert("node-role.kubernetes.io/etcd".into(), json!("true"));
    }
    for (k, v) in k3s.node_label.iter().filter_map(|l| parse_label(l)) {
        labels.insert(k, json!(v));
    }
    let mut taints: Vec<Value> = k3s
        .node_taint
        .iter()
        .filter_map(|t| parse_taint(t))
        .collect();
    // The kubelet takes the last of repeated flags.
    let kubelet_flag = |flag: &str| {
        let prefix = format!("{flag}=");
        k3s.kubelet_arg.iter().rev().find_map(|a| {
            a.trim_start_matches("--")
                .strip_prefix(prefix.as_str())
                .map(str::to_string)
        })
    };
    // A kubelet with an external cloud provider registers its Node tainted until a cloud
    // controller manager initialises it (kubelet `initialNode`; k8s.io/cloud-provider
    // `api.TaintExternalCloudProvider`). Nothing in the simulator plays the CCM, so the
    // taint stays, as with a CCM that never runs.
    if kubelet_flag("cloud-provider").as_deref() == Some("external") {
        taints.push(json!({"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"}));
    }
    let provider_id = kubelet_flag("provider-id")
        .or_else(|| (!k3s.disable_cloud_controller).then(|| format!("k3s://{name}")));
    let mut addresses = Vec::new();
    if let Some(ip) = ip {
        addresses.push(json!({"type": "InternalIP", "address": ip.to_string()}));
    }
    addresses.push(json!({"type": "Hostname", "address": hostname}));
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut annotations = serde_json::Map::new();
    annotations.insert("k3s.io/hostname".into(), json!(hostname));
    if let Some(ip) = ip {
        annotations.insert("k3s.io/internal-ip".into(), json!(ip.to_string()));
    }
    annotations.insert("node.alpha.kubernetes.io/ttl".into(), json!("0"));
    // k3s `pkg/nodeconfig` `SetNodeConfigAnnotations`: the arguments, the `K3S_*`
    // environment (none: the product configures k3s by file) and base32(sha256(both)).
    let (args, env) = (k3s.node_args(role), "{}");
    let hash = sha2::Sha256::digest(format!("{args}{env}").as_bytes());
    annotations.insert(NODE_ARGS_ANNOTATION.into(), json!(args));
    annotations.insert("k3s.io/node-env".into(), json!(env));
    annotations.insert("k3s.io/node-config-hash".into(), json!(base32(&hash)));
    let mut spec = json!({"podCIDR": "10.42.0.0/24", "podCIDRs": ["10.42.0.0/24"]});
    if let Some(pid) = provider_id {
        spec["providerID"] = json!(pid);
    }
    if !taints.is_empty() {
        spec["taints"] = json!(taints);
    }
    let pressure = |kind: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": "False", "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": {
            "addresses": addresses,
            "capacity": {"pods": "110", "ephemeral-storage": "20Gi", "cpu": cpus.to_string(), "memory": format!("{memory_ki}Ki")},
            "allocatable": {"pods": "110", "ephemeral-storage": "19Gi", "cpu": cpus.to_string(), "memory": format!("{allocatable_ki}Ki")},
            "conditions": [
                pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                 "message": NOT_READY_MESSAGE, "lastHeartbeatTime": now,
                 "lastTransitionTime": now},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": Uuid::new_v4().to_string(),
                "containerRuntimeVersion": "containerd://2.0.5-k3s1",
                "kernelVersion": "6.8.0-oxide",
                "kubeProxyVersion": version,
                "kubeletVersion": version,
                "machineID": instance.simple().to_string(),
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.2 LTS",
                "systemUUID": instance.to_string(),
            },
        },
    })
}

/// Go's `base32.StdEncoding` (RFC 4648, padded).
fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    for chunk in bytes.chunks(5) {
        let mut block = [0u8; 5];
        block[..chunk.len()].copy_from_slice(chunk);
        let bits = block.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        let chars = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < chars {
                out.push(char::from(ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&str]) -> K3sConfig {
        K3sConfig {
            node_label: l.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_kubelet_refuses_kubernetes_io_labels_outside_its_allowed_set() {
        let msg = refused_node_labels(&labels(&[
            "node-role.kubernetes.io/worker=true",
            "example.com/a=b",
        ]))
        .expect("refused");
        assert!(msg.contains("[node-role.kubernetes.io/worker]"), "{msg}");
        for ok in [
            "node.kubernetes.io/pool=a",
            "kubelet.kubernetes.io/x=y",
            "topology.kubernetes.io/zone=z",
            "oxide-controller/pool=workers",
        ] {
            assert_eq!(refused_node_labels(&labels(&[ok])), None, "{ok}");
        }
        assert!(refused_node_labels(&labels(&["sub.k8s.io/x=1"])).is_some());
    }

    #[test]
    fn node_config_annotations_are_what_k3s_writes() {
        // Go: base32.StdEncoding.EncodeToString (RFC 4648 test vectors).
        assert_eq!(base32(b""), "");
        assert_eq!(base32(b"f"), "MY======");
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI======");
        // k3s's own test: `k3s server --no-flannel`, no K3S_ environment but K3S_NODE_NAME.
        let hash = sha2::Sha256::digest(
            br#"["server","--no-flannel"]{"K3S_NODE_NAME":"fakeNode-with-annotation"}"#,
        );
        assert_eq!(
            base32(&hash),
            "LNQOAOIMOQIBRMEMACW7LYHXUNPZADF6RFGOSPIHJCOS47UVUJAA===="
        );
        let mut k3s = K3sConfig::default();
        super::super::k3s_config::merge_k3s_config(
            &mut k3s,
            b"token: secret\ndisable-cloud-controller: true\nnode-label:\n  - a=b\n  - c=d\nwrite-kubeconfig-mode: \"\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            k3s.node_args(Role::Server),
            r#"["server","--disable-cloud-controller","true","--node-label","a=b","--node-label","c=d","--token","********","--write-kubeconfig-mode"]"#
        );
    }
}
