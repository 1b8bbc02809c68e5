//! The k3s configuration a guest is given: the file paths, the role an install selects, the
//! config file and its drop-ins as k3s layers them, and the node labels and taints in it.
//! Parsing only; what k3s does with it is `k3s` and `kubelet`.

use serde::Serialize;
use serde_json::{Value, json};

pub use super::paths::{
    K3S_AGENT_TOKEN_PATH, K3S_CONFIG_DROPIN_DIR, K3S_CONFIG_PATH, K3S_KUBECONFIG_PATH,
    K3S_NODE_TOKEN_PATH, K3S_TOKEN_PATH,
};
use super::yaml::{UserDataError, parse_yaml};

// ---------------------------------------------------------------------------------------------
// user-data

/// The k3s role a VM's install step selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `k3s server` (control plane + etcd).
    Server,
    /// `k3s agent` (worker).
    Agent,
}

impl Role {
    /// The systemd unit install.sh writes for the role.
    pub fn unit(self) -> &'static str {
        match self {
            Role::Server => "k3s",
            Role::Agent => "k3s-agent",
        }
    }
}

/// The parsed k3s config file. Debug redacts the tokens.
#[derive(Clone, Default, PartialEq)]
pub struct K3sConfig {
    /// `server`: URL of an existing server to join.
    pub server: Option<String>,
    /// `token`: cluster token (servers) or join token (agents).
    pub token: Option<String>,
    /// `agent-token`: the token agents join with (servers only).
    pub agent_token: Option<String>,
    /// `cluster-init`: start a new embedded-etcd cluster.
    pub cluster_init: bool,
    /// `disable-agent` (servers): no local agent, so no kubelet and no Node of its own.
    pub disable_agent: bool,
    /// `tls-san`: extra names/IPs in the API serving certificate.
    pub tls_san: Vec<String>,
    /// `node-name`.
    pub node_name: Option<String>,
    /// `node-label`: `k=v` entries.
    pub node_label: Vec<String>,
    /// `node-taint`: `k=v:Effect` entries.
    pub node_taint: Vec<String>,
    /// `kubelet-arg`: `name=value` entries (e.g. `provider-id=oxide://<uuid>`).
    pub kubelet_arg: Vec<String>,
    /// `disable-cloud-controller`.
    pub disable_cloud_controller: bool,
    /// `secrets-encryption` (servers): Secrets encrypted in etcd with the key of k3s's
    /// EncryptionConfig (see `control_plane::pki::encryption_config`).
    pub secrets_encryption: bool,
    /// `etcd-disable-snapshots`: no scheduled etcd snapshots.
    pub etcd_disable_snapshots: bool,
    /// `etcd-snapshot-schedule-cron` (k3s's default `0 */12 * * *` when None).
    pub etcd_snapshot_cron: Option<String>,
    /// `etcd-snapshot-retention` (k3s's default 5 when None; below 1 keeps every snapshot).
    pub etcd_snapshot_retention: Option<i64>,
    /// `etcd-snapshot-name` (k3s's default `etcd-snapshot` when None).
    pub etcd_snapshot_name: Option<String>,
    /// Every key of the config files with its values as k3s splices them into its command
    /// line (see [`K3sConfig::node_args`]); in key order within a file, where k3s keeps the
    /// file's order (the simulator's YAML reader sorts keys).
    pub config_args: Vec<(String, Vec<String>)>,
    /// The critical configuration values this config sets (key → value as written, lists
    /// joined with `,`; `disable` only as whether it names `servicelb`), for comparison
    /// with the cluster's: see [`CRITICAL_KEYS`].
    pub critical: std::collections::BTreeMap<String, String>,
}

/// k3s's critical configuration values, which "must be set to the same value on all servers
/// in the cluster" (new servers fail to join otherwise), with k3s's default for each
/// (`k3s-io/docs@428ec4c:docs/cli/server.md:14-31`, defaults from the same page's tables).
/// `disable=servicelb` is tracked as `disable` (`"servicelb"` when named); `agent-token` has
/// no default (the cluster's own agent token is compared instead).
pub const CRITICAL_KEYS: [(&str, &str); 14] = [
    ("agent-token", ""),
    ("cluster-cidr", "10.42.0.0/16"),
    ("cluster-dns", "10.43.0.10"),
    ("cluster-domain", "cluster.local"),
    ("disable-cloud-controller", "false"),
    ("disable-helm-controller", "false"),
    ("disable-network-policy", "false"),
    ("disable", ""),
    ("egress-selector-mode", "agent"),
    ("flannel-backend", "vxlan"),
    ("flannel-external-ip", "false"),
    ("flannel-ipv6-masq", "false"),
    ("secrets-encryption", "false"),
    ("service-cidr", "10.43.0.0/16"),
];

impl K3sConfig {
    /// The value of critical key `key` this server runs with: what its config says, else
    /// k3s's default.
    pub fn critical_value(&self, key: &str) -> String {
        self.critical.get(key).cloned().unwrap_or_else(|| {
            CRITICAL_KEYS
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, d)| (*d).to_string())
                .unwrap_or_default()
        })
    }
}

impl std::fmt::Debug for K3sConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("K3sConfig")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "agent_token",
                &self.agent_token.as_ref().map(|_| "<redacted>"),
            )
            .field("cluster_init", &self.cluster_init)
            .field("tls_san", &self.tls_san)
            .field("node_name", &self.node_name)
            .field("node_label", &self.node_label)
            .field("node_taint", &self.node_taint)
            .field("kubelet_arg", &self.kubelet_arg)
            .field("disable_cloud_controller", &self.disable_cloud_controller)
            .field("secrets_encryption", &self.secrets_encryption)
            .field("etcd_disable_snapshots", &self.etcd_disable_snapshots)
            .field("etcd_snapshot_cron", &self.etcd_snapshot_cron)
            .field("etcd_snapshot_retention", &self.etcd_snapshot_retention)
            .field("etcd_snapshot_name", &self.etcd_snapshot_name)
            .field(
                "critical",
                &self
                    .critical
                    .keys()
                    .filter(|k| *k != "agent-token")
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Reads one k3s config value as a string; k3s (Go YAML into string flags) takes scalars.
fn scalar_string(key: &str, v: &Value) -> Result<String, UserDataError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(UserDataError::K3sConfig {
            reason: format!("{key}: expected a string"),
        }),
    }
}

fn scalar_bool(key: &str, v: &Value) -> Result<bool, UserDataError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" => Ok(true),
        Value::String(s) if s == "false" => Ok(false),
        _ => Err(UserDataError::K3sConfig {
            reason: format!("{key}: expected a boolean"),
        }),
    }
}

fn string_list(key: &str, v: &Value) -> Result<Vec<String>, UserDataError> {
    match v {
        Value::Array(items) => items.iter().map(|i| scalar_string(key, i)).collect(),
        Value::Null => Ok(Vec::new()),
        other => Ok(vec![scalar_string(key, other)?]),
    }
}

/// Parses `/etc/rancher/k3s/config.yaml` alone.
pub fn parse_k3s_config(content: &[u8]) -> Result<K3sConfig, UserDataError> {
    let mut cfg = K3sConfig::default();
    merge_k3s_config(&mut cfg, content)?;
    validate_k3s_config(&cfg)?;
    Ok(cfg)
}

/// Applies one k3s config file on top of `cfg`, as k3s layers `config.yaml` and its
/// drop-ins: a list key replaces what came before, the same key with a `+` suffix appends.
pub(super) fn merge_k3s_config(cfg: &mut K3sConfig, content: &[u8]) -> Result<(), UserDataError> {
    let text = std::str::from_utf8(content).map_err(|_| UserDataError::K3sConfig {
        reason: "not UTF-8".into(),
    })?;
    if text.trim().is_empty() {
        return Ok(());
    }
    let doc = parse_yaml(text).map_err(|(line, column)| UserDataError::K3sConfig {
        reason: format!("invalid YAML at line {line} column {column}"),
    })?;
    let map = match doc {
        Value::Object(map) => map,
        Value::Null => return Ok(()),
        _ => {
            return Err(UserDataError::K3sConfig {
                reason: "not a YAML mapping".into(),
            });
        }
    };
    for (raw_key, v) in &map {
        let append = raw_key.ends_with('+');
        let key = raw_key.trim_end_matches('+');
        let list = |target: &mut Vec<String>| -> Result<(), UserDataError> {
            let items = string_list(key, v)?;
            if !append {
                target.clear();
            }
            target.extend(items);
            Ok(())
        };
        // k3s's `configfilearg` turns each key into `--key value` (a list into one pair per
        // item, an empty value into the bare flag); a later file's plain key replaces it.
        // (No values: the bare flag.)
        let values: Vec<String> = match v {
            Value::Array(items) => items.iter().map(arg_string).collect(),
            other => Some(arg_string(other))
                .filter(|s| !s.is_empty())
                .into_iter()
                .collect(),
        };
        if !append {
            cfg.config_args.retain(|(k, _)| k != key);
        }
        match cfg.config_args.iter_mut().find(|(k, _)| k == key) {
            Some((_, have)) => have.extend(values),
            None if matches!(v, Value::Array(a) if a.is_empty()) => {}
            None => cfg.config_args.push((key.to_owned(), values)),
        }
        if CRITICAL_KEYS.iter().any(|(k, _)| *k == key) {
            let value = if key == "disable" {
                // Only servicelb must match; other packaged components may differ per server.
                let mut names = string_list(key, v)?
                    .into_iter()
                    .flat_map(|e| {
                        e.split(',')
                            .map(|n| n.trim().to_string())
                            .collect::<Vec<_>>()
                    })
                    .collect::<Vec<_>>();
                if append {
                    names.extend(
                        cfg.critical
                            .get("disable")
                            .filter(|d| !d.is_empty())
                            .cloned(),
                    );
                }
                if names.iter().any(|n| n == "servicelb") {
                    "servicelb".to_string()
                } else {
                    String::new()
                }
            } else {
                let items = string_list(key, v)?;
                let mut joined = items.join(",");
                if append && let Some(before) = cfg.critical.get(key).filter(|b| !b.is_empty()) {
                    joined = format!("{before},{joined}");
                }
                joined
            };
            cfg.critical.insert(key.to_string(), value);
        }
        match key {
            "server" => cfg.server = Some(scalar_string(key, v)?),
            "token" => cfg.token = Some(scalar_string(key, v)?),
            "agent-token" => cfg.agent_token = Some(scalar_string(key, v)?),
            "node-name" => cfg.node_name = Some(scalar_string(key, v)?),
            "cluster-init" => cfg.cluster_init = scalar_bool(key, v)?,
            "disable-agent" => cfg.disable_agent = scalar_bool(key, v)?,
            "disable-cloud-controller" => cfg.disable_cloud_controller = scalar_bool(key, v)?,
            "secrets-encryption" => cfg.secrets_encryption = scalar_bool(key, v)?,
            "etcd-disable-snapshots" => cfg.etcd_disable_snapshots = scalar_bool(key, v)?,
            "etcd-snapshot-schedule-cron" => {
                cfg.etcd_snapshot_cron = Some(scalar_string(key, v)?);
            }
            "etcd-snapshot-name" => cfg.etcd_snapshot_name = Some(scalar_string(key, v)?),
            // An int flag (urfave/cli `IntFlag`): a value that is no integer stops k3s.
            "etcd-snapshot-retention" => {
                let text = scalar_string(key, v)?;
                cfg.etcd_snapshot_retention =
                    Some(text.parse().map_err(|_| UserDataError::K3sConfig {
                        reason: format!("{key}: invalid value \"{text}\": not an integer"),
                    })?);
            }
            "tls-san" => list(&mut cfg.tls_san)?,
            "node-label" => list(&mut cfg.node_label)?,
            "node-taint" => list(&mut cfg.node_taint)?,
            "kubelet-arg" => list(&mut cfg.kubelet_arg)?,
            // Everything else k3s knows (write-kubeconfig-mode, disable, node-ip, ...) does not
            // change what the simulator models.
            _ => {}
        }
    }
    Ok(())
}

/// wrangler's `convert.ToString` of a YAML value, as k3s's config file reader applies it.
fn arg_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The flags k3s redacts in `k3s.io/node-args` (k3s `pkg/nodeconfig` `isSecret`).
const SECRET_FLAGS: [&str; 7] = [
    "--token",
    "-t",
    "--agent-token",
    "--datastore-endpoint",
    "--cluster-secret",
    "--etcd-s3-access-key",
    "--etcd-s3-secret-key",
];

impl K3sConfig {
    /// What k3s writes in the `k3s.io/node-args` annotation of its Node: `k3s <role>`'s
    /// arguments with the config file spliced in after the role (`configfilearg`
    /// `readConfigFile`: `--key value`, once per item of a list, the bare `--key` for an empty
    /// scalar; one-letter keys take one dash),
    /// the value after a secret flag replaced by `********`, as a JSON list (k3s
    /// `pkg/nodeconfig` `getNodeArgs`). The install passes no flags of its own here.
    pub fn node_args(&self, role: Role) -> String {
        let mut args = vec![
            match role {
                Role::Server => "server",
                Role::Agent => "agent",
            }
            .to_owned(),
        ];
        for (key, values) in &self.config_args {
            let flag = if key.chars().count() == 1 {
                format!("-{key}")
            } else {
                format!("--{key}")
            };
            if values.is_empty() {
                args.push(flag.clone());
            }
            for value in values {
                args.push(flag.clone());
                args.push(value.clone());
            }
        }
        for i in 0..args.len() {
            if SECRET_FLAGS.contains(&args[i].as_str()) && i + 1 < args.len() {
                args[i + 1] = "********".to_owned();
            }
        }
        serde_json::to_string(&args).unwrap_or_default()
    }
}

pub(super) fn validate_k3s_config(cfg: &K3sConfig) -> Result<(), UserDataError> {
    for label in &cfg.node_label {
        if parse_label(label).is_none() {
            return Err(UserDataError::K3sConfig {
                reason: format!("node-label: '{label}' is not key=value"),
            });
        }
    }
    for taint in &cfg.node_taint {
        if parse_taint(taint).is_none() {
            return Err(UserDataError::K3sConfig {
                reason: format!(
                    "node-taint: '{taint}' is not key[=value]:NoSchedule|PreferNoSchedule|NoExecute"
                ),
            });
        }
    }
    Ok(())
}

/// `KEY=VALUE` of a `node-label` entry.
pub(super) fn parse_label(s: &str) -> Option<(String, String)> {
    let (k, v) = s.split_once('=')?;
    (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
}

/// `KEY[=VALUE]:EFFECT` of a `node-taint` entry, as a Node taint.
pub(super) fn parse_taint(s: &str) -> Option<Value> {
    let (kv, effect) = s.rsplit_once(':')?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return None;
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (kv, None),
    };
    if key.is_empty() {
        return None;
    }
    let mut taint = json!({"key": key, "effect": effect});
    if let Some(v) = value {
        taint["value"] = json!(v);
    }
    Some(taint)
}
