//! What happens inside a simulated VM once the rack says it is `running`: cloud-init reads and
//! validates the user-data, prints the SSH host key fingerprints on the serial console and
//! starts sshd, and a simulated k3s (configured from `/etc/rancher/k3s/config.yaml` written by
//! `write_files`) creates or joins the simulator's one cluster, the twin. Joined VMs become
//! Nodes; halted VMs' Nodes turn `Ready=Unknown` like a vanished kubelet.
//!
//! This module owns the boot/k3s contract in SIM_CONTRACTS.md and the per-VM listeners
//! (Kubernetes API at :6443 on joined servers, SSH on server VMs). It does not own the Oxide
//! API (lifecycle, addresses: `oxide`), the Kubernetes API itself (`twin`) or the SSH protocol
//! (`sshd`). It never prints tokens or user-data anywhere, console included.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::net::{ListenerKind, Listeners, ListenersGuard};
use crate::oxide::{Faults, OxideSim, RackEvents, RunningInstance};
use crate::sshd::{SshBackend, SshHost};
use crate::twin::Twin;

/// Largest user-data cloud-init accepts here (the Oxide API limit, decoded).
pub const MAX_USER_DATA: usize = 32 * 1024;
/// Port of the Kubernetes API on server VMs.
pub const KUBE_API_PORT: u16 = 6443;
/// Where k3s reads its configuration.
pub const K3S_CONFIG_PATH: &str = "/etc/rancher/k3s/config.yaml";
/// The admin kubeconfig k3s writes on servers.
pub const K3S_KUBECONFIG_PATH: &str = "/etc/rancher/k3s/k3s.yaml";
/// The server join token file (full `K10<ca-hash>::server:<token>` form).
pub const K3S_NODE_TOKEN_PATH: &str = "/var/lib/rancher/k3s/server/node-token";
const K3S_TOKEN_PATH: &str = "/var/lib/rancher/k3s/server/token";
const K3S_AGENT_TOKEN_PATH: &str = "/var/lib/rancher/k3s/server/agent-token";

/// Timing and port knobs of the simulated guest.
#[derive(Clone, Debug)]
pub struct BootConfig {
    /// Port sshd listens on (22 on a real VM; tests pass a high port).
    pub ssh_port: u16,
    /// From cloud-init start to k3s trying to start/join.
    pub k3s_boot: Duration,
    /// From k3s deciding it can start/join to its Node being registered and Ready.
    pub k3s_join: Duration,
    /// How often k3s retries an unreachable server URL.
    pub join_retry: Duration,
    /// k3s version when the install step does not pin one.
    pub k3s_version: String,
}

impl Default for BootConfig {
    fn default() -> Self {
        Self {
            ssh_port: 22,
            k3s_boot: Duration::from_millis(100),
            k3s_join: Duration::from_millis(200),
            join_retry: Duration::from_millis(200),
            k3s_version: "v1.33.4+k3s1".to_string(),
        }
    }
}

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
            .finish()
    }
}

/// An SSH key cloud-init installs, with the user it is installed for (`None`: the image's
/// default user, whose name the simulator cannot know, so any user name matches).
#[derive(Clone, Debug)]
pub struct AuthorizedKey {
    /// Account the key is installed for.
    pub user: Option<String>,
    /// The key.
    pub key: russh::keys::PublicKey,
}

/// What cloud-init made of the user-data. Debug leaves file contents out.
#[derive(Clone, Default)]
pub struct UserData {
    /// Role selected by `runcmd` (None: no k3s install step).
    pub role: Option<Role>,
    /// `INSTALL_K3S_VERSION` from the install step.
    pub install_version: Option<String>,
    /// The k3s config file, when written.
    pub k3s: Option<K3sConfig>,
    /// SSH keys from `users[].ssh_authorized_keys` and top-level `ssh_authorized_keys`.
    pub authorized_keys: Vec<AuthorizedKey>,
    /// Files from `write_files` (decoded), by path.
    pub files: BTreeMap<String, Vec<u8>>,
    /// A `runcmd` step writes a k3s drop-in `kubelet-arg+: [provider-id=<prefix><uuid>]` from
    /// the SMBIOS system UUID (`/sys/class/dmi/id/product_uuid`), which Oxide sets to the
    /// instance ID. The simulator cannot run shell, so it recognises that step and applies
    /// its effect with the instance ID.
    pub smbios_provider_id_prefix: Option<String>,
    /// The `tailscale up` step (and whether a k3s SAN drop-in follows it), if any.
    pub tailscale: Option<crate::tailscale::TailscaleUp>,
}

impl std::fmt::Debug for UserData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserData")
            .field("role", &self.role)
            .field("install_version", &self.install_version)
            .field("k3s", &self.k3s)
            .field("authorized_keys", &self.authorized_keys.len())
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field("smbios_provider_id_prefix", &self.smbios_provider_id_prefix)
            .field("tailscale", &self.tailscale)
            .finish()
    }
}

/// Why cloud-init (or k3s reading its config) rejected the user-data. Messages are printed on
/// the serial console, so they never quote the user-data itself.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UserDataError {
    /// More than 32 KiB.
    #[error("user-data is {0} bytes, over the 32768-byte limit; ignoring it")]
    TooLarge(usize),
    /// Not valid UTF-8.
    #[error("user-data is not valid UTF-8 text; ignoring it")]
    NotUtf8,
    /// Does not start with the `#cloud-config` header.
    #[error(
        "Unhandled non-multipart (text/x-not-multipart) userdata: user-data does not start with '#cloud-config'; ignoring it"
    )]
    NoHeader,
    /// Not parseable YAML.
    #[error("Failed loading yaml blob. Invalid format at line {line} column {column}")]
    Yaml {
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
    },
    /// YAML, but not a mapping at the top level.
    #[error("cloud-config was not a dictionary; ignoring it")]
    NotMapping,
    /// `write_files` malformed.
    #[error("Invalid cloud-config provided: write_files: {0}")]
    WriteFiles(String),
    /// `users` or `ssh_authorized_keys` malformed.
    #[error("Invalid cloud-config provided: {0}")]
    Schema(String),
    /// The k3s config file malformed (k3s refuses to start).
    #[error("level=fatal msg=\"Error: failed to parse {path}: {reason}\"", path = K3S_CONFIG_PATH)]
    K3sConfig {
        /// What is wrong (never quotes values).
        reason: String,
    },
}

/// Validates and parses user-data the way cloud-init and k3s read it.
pub fn parse_user_data(bytes: &[u8]) -> Result<UserData, UserDataError> {
    if bytes.len() > MAX_USER_DATA {
        return Err(UserDataError::TooLarge(bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| UserDataError::NotUtf8)?;
    let first_line = text.lines().next().unwrap_or("");
    if first_line.trim_end() != "#cloud-config" {
        return Err(UserDataError::NoHeader);
    }
    let doc = parse_yaml(text).map_err(|(line, column)| UserDataError::Yaml { line, column })?;
    let Value::Object(map) = doc else {
        return Err(UserDataError::NotMapping);
    };

    let mut out = UserData::default();
    if let Some(files) = map.get("write_files") {
        out.files = parse_write_files(files)?;
    }
    let dropins: Vec<&Vec<u8>> = out
        .files
        .iter()
        .filter(|(path, _)| {
            path.strip_prefix(K3S_CONFIG_DROPIN_DIR)
                .is_some_and(|f| !f.contains('/') && (f.ends_with(".yaml") || f.ends_with(".yml")))
        })
        .map(|(_, content)| content)
        .collect();
    if out.files.contains_key(K3S_CONFIG_PATH) || !dropins.is_empty() {
        let mut cfg = K3sConfig::default();
        if let Some(content) = out.files.get(K3S_CONFIG_PATH) {
            merge_k3s_config(&mut cfg, content)?;
        }
        for content in dropins {
            merge_k3s_config(&mut cfg, content)?;
        }
        validate_k3s_config(&cfg)?;
        out.k3s = Some(cfg);
    }
    out.authorized_keys = parse_authorized_keys(&map)?;
    if let Some(runcmd) = map.get("runcmd") {
        let commands = runcmd_lines(runcmd)?;
        out.role = detect_role(&commands);
        out.install_version = detect_install_version(&commands);
        out.smbios_provider_id_prefix = detect_smbios_provider_id(&commands);
        out.tailscale = crate::tailscale::parse_runcmd(&commands, &out.files);
    }
    Ok(out)
}

/// Parses YAML into JSON values; errors carry only a position (the snippet would quote secrets).
fn parse_yaml(text: &str) -> Result<Value, (u64, u64)> {
    match serde_saphyr::from_str::<Value>(text) {
        Ok(value) => Ok(value),
        Err(err) => {
            let loc = err.location();
            Err(loc.map(|l| (l.line(), l.column())).unwrap_or((0, 0)))
        }
    }
}

fn parse_write_files(value: &Value) -> Result<BTreeMap<String, Vec<u8>>, UserDataError> {
    let bad = |msg: String| UserDataError::WriteFiles(msg);
    let Value::Array(entries) = value else {
        return Err(bad("must be a list".into()));
    };
    let mut files = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let Value::Object(entry) = entry else {
            return Err(bad(format!("entry {i} is not a mapping")));
        };
        let path = match entry.get("path") {
            Some(Value::String(p)) if p.starts_with('/') => p.clone(),
            Some(Value::String(_)) => return Err(bad(format!("entry {i}: path is not absolute"))),
            Some(_) => return Err(bad(format!("entry {i}: path is not a string"))),
            None => return Err(bad(format!("entry {i}: 'path' is a required property"))),
        };
        let content = match entry.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(format!("entry {i} ({path}): content is not a string"))),
        };
        let encoding = match entry.get("encoding") {
            None | Some(Value::Null) => "text/plain".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(format!("entry {i} ({path}): encoding is not a string"))),
        };
        let data = match encoding.as_str() {
            "text/plain" => content.into_bytes(),
            "b64" | "base64" => {
                let compact: String = content.split_whitespace().collect();
                base64::engine::general_purpose::STANDARD
                    .decode(compact.as_bytes())
                    .map_err(|_| bad(format!("entry {i} ({path}): content is not valid base64")))?
            }
            "gz" | "gzip" | "gz+b64" | "gz+base64" | "gzip+b64" | "gzip+base64" => {
                return Err(bad(format!(
                    "entry {i} ({path}): gzip encoding is not supported by the simulator"
                )));
            }
            other => {
                return Err(bad(format!(
                    "entry {i} ({path}): unknown encoding '{other}'"
                )));
            }
        };
        match entry.get("permissions") {
            None | Some(Value::Null) => {}
            Some(Value::String(p))
                if !p.is_empty() && p.len() <= 5 && p.chars().all(|c| c.is_digit(8)) => {}
            Some(Value::Number(_)) => {}
            Some(_) => {
                return Err(bad(format!(
                    "entry {i} ({path}): permissions must be an octal string like '0600'"
                )));
            }
        }
        for key in ["owner"] {
            if let Some(v) = entry.get(key)
                && !v.is_string()
            {
                return Err(bad(format!("entry {i} ({path}): {key} is not a string")));
            }
        }
        for key in ["append", "defer"] {
            if let Some(v) = entry.get(key)
                && !v.is_boolean()
            {
                return Err(bad(format!("entry {i} ({path}): {key} is not a boolean")));
            }
        }
        let append = entry
            .get("append")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if append {
            files.entry(path).or_insert_with(Vec::new).extend(data);
        } else {
            files.insert(path, data);
        }
    }
    Ok(files)
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

/// Directory of k3s config drop-ins, read after `config.yaml` in lexical order.
pub const K3S_CONFIG_DROPIN_DIR: &str = "/etc/rancher/k3s/config.yaml.d/";

/// Parses `/etc/rancher/k3s/config.yaml` alone.
pub fn parse_k3s_config(content: &[u8]) -> Result<K3sConfig, UserDataError> {
    let mut cfg = K3sConfig::default();
    merge_k3s_config(&mut cfg, content)?;
    validate_k3s_config(&cfg)?;
    Ok(cfg)
}

/// Applies one k3s config file on top of `cfg`, as k3s layers `config.yaml` and its
/// drop-ins: a list key replaces what came before, the same key with a `+` suffix appends.
fn merge_k3s_config(cfg: &mut K3sConfig, content: &[u8]) -> Result<(), UserDataError> {
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
        match key {
            "server" => cfg.server = Some(scalar_string(key, v)?),
            "token" => cfg.token = Some(scalar_string(key, v)?),
            "agent-token" => cfg.agent_token = Some(scalar_string(key, v)?),
            "node-name" => cfg.node_name = Some(scalar_string(key, v)?),
            "cluster-init" => cfg.cluster_init = scalar_bool(key, v)?,
            "disable-cloud-controller" => cfg.disable_cloud_controller = scalar_bool(key, v)?,
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

fn validate_k3s_config(cfg: &K3sConfig) -> Result<(), UserDataError> {
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

fn parse_label(s: &str) -> Option<(String, String)> {
    let (k, v) = s.split_once('=')?;
    (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
}

fn parse_taint(s: &str) -> Option<Value> {
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

fn parse_authorized_keys(
    map: &serde_json::Map<String, Value>,
) -> Result<Vec<AuthorizedKey>, UserDataError> {
    let mut keys = Vec::new();
    let mut add = |user: Option<String>, list: &Value, ctx: &str| -> Result<(), UserDataError> {
        let Value::Array(items) = list else {
            return Err(UserDataError::Schema(format!(
                "{ctx}: ssh_authorized_keys must be a list"
            )));
        };
        for item in items {
            let Value::String(line) = item else {
                return Err(UserDataError::Schema(format!(
                    "{ctx}: ssh_authorized_keys entries must be strings"
                )));
            };
            // sshd skips lines it cannot parse; so does the simulator.
            if let Some(key) = parse_public_key(line) {
                keys.push(AuthorizedKey {
                    user: user.clone(),
                    key,
                });
            }
        }
        Ok(())
    };
    if let Some(list) = map.get("ssh_authorized_keys") {
        add(None, list, "ssh_authorized_keys")?;
    }
    match map.get("users") {
        None | Some(Value::Null) => {}
        Some(Value::Array(users)) => {
            for user in users {
                match user {
                    Value::String(_) => {} // "default"
                    Value::Object(u) => {
                        let name = match u.get("name") {
                            Some(Value::String(n)) => n.clone(),
                            _ => {
                                return Err(UserDataError::Schema(
                                    "users: every user needs a string 'name'".into(),
                                ));
                            }
                        };
                        if let Some(list) = u.get("ssh_authorized_keys") {
                            add(Some(name), list, "users")?;
                        }
                    }
                    _ => {
                        return Err(UserDataError::Schema(
                            "users: entries must be mappings or 'default'".into(),
                        ));
                    }
                }
            }
        }
        Some(_) => return Err(UserDataError::Schema("users must be a list".into())),
    }
    Ok(keys)
}

/// Parses an OpenSSH public key line, skipping leading authorized_keys options.
pub fn parse_public_key(line: &str) -> Option<russh::keys::PublicKey> {
    let line = line.trim();
    if let Ok(key) = russh::keys::PublicKey::from_openssh(line) {
        return Some(key);
    }
    let start = line.find("ssh-").or_else(|| line.find("ecdsa-"))?;
    russh::keys::PublicKey::from_openssh(&line[start..]).ok()
}

fn runcmd_lines(value: &Value) -> Result<Vec<String>, UserDataError> {
    let Value::Array(items) = value else {
        return Err(UserDataError::Schema("runcmd must be a list".into()));
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Ok(s.clone()),
            Value::Array(argv) => Ok(argv
                .iter()
                .map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" ")),
            _ => Err(UserDataError::Schema(
                "runcmd entries must be strings or lists".into(),
            )),
        })
        .collect()
}

/// The first word of an env assignment's value (`INSTALL_K3S_EXEC='server --foo'` → server).
fn env_value<'a>(cmd: &'a str, var: &str) -> Option<&'a str> {
    let idx = cmd.find(&format!("{var}="))?;
    let rest = &cmd[idx + var.len() + 1..];
    let rest = rest.trim_start_matches(['\'', '"']);
    rest.split(|c: char| c.is_whitespace() || c == '\'' || c == '"')
        .next()
}

fn detect_role(commands: &[String]) -> Option<Role> {
    let word_role = |w: &str| match w {
        "server" => Some(Role::Server),
        "agent" => Some(Role::Agent),
        _ => None,
    };
    for cmd in commands {
        if let Some(role) = env_value(cmd, "INSTALL_K3S_EXEC").and_then(word_role) {
            return Some(role);
        }
        if let Some(idx) = cmd.find("sh -s -") {
            let after = cmd[idx + "sh -s -".len()..].split_whitespace().next();
            if let Some(role) = after.and_then(word_role) {
                return Some(role);
            }
        }
        let words: Vec<&str> = cmd.split_whitespace().collect();
        if let Some(pos) = words.iter().position(|w| *w == "systemctl") {
            let rest = &words[pos + 1..];
            if rest
                .iter()
                .any(|w| matches!(*w, "enable" | "start" | "restart"))
            {
                if rest
                    .iter()
                    .any(|w| matches!(*w, "k3s-agent" | "k3s-agent.service"))
                {
                    return Some(Role::Agent);
                }
                if rest.iter().any(|w| matches!(*w, "k3s" | "k3s.service")) {
                    return Some(Role::Server);
                }
            }
        }
        // The install script without INSTALL_K3S_EXEC: agent when K3S_URL is set.
        if cmd.contains("get.k3s.io") || (cmd.contains("install.sh") && !cmd.contains("tailscale"))
        {
            return Some(if cmd.contains("K3S_URL=") {
                Role::Agent
            } else {
                Role::Server
            });
        }
    }
    None
}

fn detect_smbios_provider_id(commands: &[String]) -> Option<String> {
    commands.iter().find_map(|cmd| {
        if !cmd.contains("product_uuid") {
            return None;
        }
        let idx = cmd.find("provider-id=")?;
        let rest = &cmd[idx + "provider-id=".len()..];
        let end = rest
            .find(|c: char| matches!(c, '%' | '$' | '"' | '\'' | '\\') || c.is_whitespace())
            .unwrap_or(rest.len());
        Some(rest[..end].to_string())
    })
}

fn detect_install_version(commands: &[String]) -> Option<String> {
    commands
        .iter()
        .find_map(|c| env_value(c, "INSTALL_K3S_VERSION"))
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

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

fn subtle_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Host and port of a `https://HOST:PORT` server URL.
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

// ---------------------------------------------------------------------------------------------
// state

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum K3sState {
    /// No k3s (yet): not booted that far, invalid user-data, or no install step.
    Off,
    /// Started, waiting to create/join.
    Waiting,
    /// Refused to start (wrong token, bad config, ...); never joins this boot.
    Refused,
    /// Part of the cluster; Node registered.
    Joined,
}

struct Vm {
    /// Tailnet address once `tailscale up` succeeded this boot (listeners bind it too).
    tailnet_ip: Option<IpAddr>,
    /// k3s added the tailnet address to its `tls-san` (a drop-in written before k3s started).
    tailnet_san: bool,
    /// Local addresses of successful SSH logins, oldest first (the last 32).
    ssh_logins: Vec<SocketAddr>,
    name: String,
    hostname: String,
    ssh_host: Arc<SshHost>,
    /// The "other" key printed under the `wrong_console_host_key` fault.
    decoy_host: Option<Arc<SshHost>>,
    /// Bumped on every boot and halt; a boot task whose generation is stale stops.
    generation: u64,
    running: bool,
    boot_started: Instant,
    /// External IPs at boot that are not floating IPs (the VM's "own" addresses).
    ephemeral_ips: Vec<IpAddr>,
    /// All external IPs at boot (ephemeral first, as the API lists them).
    external_ips: Vec<IpAddr>,
    /// The NIC's VPC address (the guest's own address; k3s's node IP).
    private_ip: Option<IpAddr>,
    api_ssh_keys: Vec<String>,
    user_data: Option<Arc<UserData>>,
    sshd_up: bool,
    k3s: K3sState,
    /// Has been a member of the cluster (its datastore/agent state survives reboots).
    member: bool,
    node_name: Option<String>,
    /// Files uploaded over SSH: guest path → the host file holding them (they live on the
    /// VM's disk, so they survive reboots and go with the instance).
    uploads: BTreeMap<String, std::path::PathBuf>,
}

struct Cluster {
    token: String,
    agent_token: String,
    creator: Uuid,
}

#[derive(Default)]
struct State {
    vms: HashMap<Uuid, Vm>,
    /// Attached floating IPs → instance.
    floating: HashMap<IpAddr, Uuid>,
    cluster: Option<Cluster>,
}

struct Inner {
    /// The simulated tailnet VMs join with `tailscale up` (see [`Boot::attach_tailnet`]).
    tailnet: OnceLock<crate::tailscale::Tailnet>,
    cfg: BootConfig,
    twin: Twin,
    faults: Faults,
    listeners: Listeners,
    ca_hash: String,
    oxide: OnceLock<OxideSim>,
    runtime: tokio::runtime::Handle,
    /// Set on simulator shutdown: boot tasks stop at their next step.
    closed: AtomicBool,
    state: Mutex<State>,
    /// Host directory of the files uploaded to VMs (`<dir>/<instance id>/<guest path>`),
    /// created on the first upload and removed with the simulator.
    upload_dir: OnceLock<Option<tempfile::TempDir>>,
}

/// The guest side of every simulated VM; implements [`RackEvents`] for [`OxideSim`].
#[derive(Clone)]
pub struct Boot {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Boot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Boot")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

/// Prefixes of k3s's own messages, so the console reads like a real k3s log.
const PREPARING: &str = "starting kubernetes: preparing server";
const NOT_READY: &str = "Waiting to retrieve agent configuration; server is not ready";
const CA_MISMATCH: &str = "token CA hash does not match the Cluster CA certificate hash";

enum Decision {
    Create,
    Join,
    Retry(String),
    Fatal(String),
}

impl Boot {
    /// Builds the guest simulation. Must be called inside a tokio runtime; call
    /// [`Boot::attach`] with the `OxideSim` built from it before any instance runs.
    pub fn new(cfg: BootConfig, twin: Twin, faults: Faults, listeners: Listeners) -> Self {
        let ca_hash = ca_hash(&twin.ca_pem());
        Self {
            inner: Arc::new(Inner {
                tailnet: OnceLock::new(),
                cfg,
                twin,
                faults,
                listeners,
                ca_hash,
                oxide: OnceLock::new(),
                runtime: tokio::runtime::Handle::current(),
                closed: AtomicBool::new(false),
                state: Mutex::new(State::default()),
                upload_dir: OnceLock::new(),
            }),
        }
    }

    /// Connects the console sink. OxideSim needs the events object at construction, so this
    /// closes the loop afterwards.
    pub fn attach(&self, oxide: OxideSim) {
        let _ = self.inner.oxide.set(oxide);
    }

    /// Connects the tailnet `tailscale up` joins. Without one, every join is refused.
    pub fn attach_tailnet(&self, tailnet: crate::tailscale::Tailnet) {
        let _ = self.inner.tailnet.set(tailnet);
    }

    /// Stops every boot in progress and closes every listener (simulator shutdown).
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.listeners.close_all();
    }

    /// The listener registry (for shutdown and the admin dump).
    pub fn listeners(&self) -> &Listeners {
        &self.inner.listeners
    }

    /// Cluster summary for the admin state dump: who created the cluster, which VMs joined
    /// with which role and Node name, and the open listeners.
    pub fn cluster_info(&self) -> Value {
        let st = self.inner.state();
        let mut vms: Vec<Value> = st
            .vms
            .iter()
            .map(|(id, vm)| {
                json!({
                    "instance": vm.name,
                    "id": id,
                    "running": vm.running,
                    "role": vm.user_data.as_ref().and_then(|u| u.role),
                    "k3s": vm.k3s,
                    "joined": vm.k3s == K3sState::Joined,
                    "node": vm.node_name,
                    "ssh_host_key": vm.ssh_host.fingerprint(),
                    "tailnet_ip": vm.tailnet_ip,
                    "ssh_logins": vm.ssh_logins,
                })
            })
            .collect();
        vms.sort_by(|a, b| a["instance"].as_str().cmp(&b["instance"].as_str()));
        let creator = st.cluster.as_ref().map(|c| {
            st.vms
                .get(&c.creator)
                .map(|v| v.name.clone())
                .unwrap_or_default()
        });
        let mut joined: Vec<String> = st
            .vms
            .values()
            .filter(|v| v.k3s == K3sState::Joined)
            .map(|v| v.name.clone())
            .collect();
        joined.sort();
        drop(st);
        json!({
            "created": creator.is_some(),
            "creator": creator,
            "joined": joined,
            "vms": vms,
            "listeners": self.inner.listeners.snapshot(),
        })
    }

    /// The host file holding what was uploaded over SSH to `path` on `instance` (mode as the
    /// upload set it), if anything was.
    pub fn uploaded_file(&self, instance: Uuid, path: &str) -> Option<std::path::PathBuf> {
        self.inner
            .state()
            .vms
            .get(&instance)?
            .uploads
            .get(path)
            .cloned()
    }

    /// [`Boot::uploaded_file`] of the running VM whose Node is `node` (what a hostPath volume
    /// on that Node sees).
    pub fn node_file(&self, node: &str, path: &str) -> Option<std::path::PathBuf> {
        let st = self.inner.state();
        let vm = st
            .vms
            .values()
            .find(|v| v.running && v.node_name.as_deref() == Some(node))?;
        vm.uploads.get(path).cloned()
    }

    /// Node name of a joined instance (None when it has not joined).
    pub fn joined_node(&self, instance: Uuid) -> Option<String> {
        let st = self.inner.state();
        st.vms
            .get(&instance)
            .filter(|v| v.k3s == K3sState::Joined)
            .and_then(|v| v.node_name.clone())
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn console(&self, id: Uuid, text: &str) {
        if let Some(oxide) = self.oxide.get() {
            oxide.append_console(id, text.as_bytes());
        }
    }

    /// Console line with a kernel-style timestamp since boot.
    fn log(&self, id: Uuid, started: Instant, line: &str) {
        let t = started.elapsed();
        self.console(
            id,
            &format!("[{:>5}.{:06}] {line}\n", t.as_secs(), t.subsec_micros()),
        );
    }

    fn k3s_log(&self, id: Uuid, started: Instant, level: &str, msg: &str) {
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ");
        self.log(
            id,
            started,
            &format!("k3s[1402]: time=\"{now}\" level={level} msg=\"{msg}\""),
        );
    }

    /// True while the boot of generation `gen` is current.
    fn current(&self, id: Uuid, generation: u64) -> bool {
        !self.closed.load(Ordering::SeqCst)
            && self
                .state()
                .vms
                .get(&id)
                .is_some_and(|v| v.running && v.generation == generation)
    }

    /// `<upload dir>/<instance id>`, creating the upload directory on first use.
    fn vm_upload_dir(&self, id: Uuid) -> Option<std::path::PathBuf> {
        self.upload_dir
            .get_or_init(|| {
                tempfile::Builder::new()
                    .prefix("oxide-sim-vm-files-")
                    .tempdir()
                    .map_err(
                        |err| tracing::warn!(error = %err, "cannot create the upload directory"),
                    )
                    .ok()
            })
            .as_ref()
            .map(|d| d.path().join(id.to_string()))
    }

    fn name_matches(prefixes: &[String], name: &str) -> bool {
        prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }

    // ---- listeners ----------------------------------------------------------------------

    /// Brings the VM's listeners in line with its state: SSH on every address of a running
    /// server VM once sshd is up, the Kubernetes API on every address once it joined.
    fn sync_listeners(self: &Arc<Self>, id: Uuid) {
        let _rt = self.runtime.enter();
        let mut guard = self.listeners.lock();
        let desired = self.desired_listeners(id);
        for (addr, kind) in guard.owned_by(id) {
            if !desired.iter().any(|(a, k, _)| *a == addr && *k == kind) {
                guard.close(addr);
            }
        }
        for (addr, kind, sans) in desired {
            if guard.owned_by(id).contains(&(addr, kind)) && guard.is_serving(addr, kind) {
                continue;
            }
            self.open_listener(&mut guard, id, addr, kind, sans);
        }
    }

    fn desired_listeners(&self, id: Uuid) -> Vec<(SocketAddr, ListenerKind, Vec<String>)> {
        if self.closed.load(Ordering::SeqCst) {
            return Vec::new();
        }
        let st = self.state();
        let Some(vm) = st.vms.get(&id) else {
            return Vec::new();
        };
        let is_server = vm.user_data.as_ref().and_then(|u| u.role) == Some(Role::Server);
        if !vm.running || !is_server {
            return Vec::new();
        }
        let mut ips: Vec<IpAddr> = vm.ephemeral_ips.clone();
        ips.extend(vm.private_ip);
        let mut floating: Vec<IpAddr> = st
            .floating
            .iter()
            .filter(|(_, owner)| **owner == id)
            .map(|(ip, _)| *ip)
            .collect();
        floating.sort();
        ips.extend(floating);
        ips.extend(vm.tailnet_ip);
        let mut out = Vec::new();
        if vm.sshd_up {
            for ip in &ips {
                out.push((
                    SocketAddr::new(*ip, self.cfg.ssh_port),
                    ListenerKind::Ssh,
                    Vec::new(),
                ));
            }
        }
        if vm.k3s == K3sState::Joined {
            let sans = self.serving_sans(&st, vm);
            for ip in &ips {
                out.push((
                    SocketAddr::new(*ip, KUBE_API_PORT),
                    ListenerKind::KubeApi,
                    sans.clone(),
                ));
            }
        }
        out
    }

    /// SANs of the API serving certificate, as k3s builds them: loopback and in-cluster names,
    /// the node's own addresses, and every `tls-san` of the cluster's servers. A floating IP is
    /// NAT in front of the VM (the guest never sees it), so it is in the certificate only when
    /// some server lists it in `tls-san` — exactly as on a real rack.
    fn serving_sans(&self, st: &State, vm: &Vm) -> Vec<String> {
        let mut sans: BTreeSet<String> = [
            "127.0.0.1",
            "::1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.43.0.1",
        ]
        .into_iter()
        .map(str::to_string)
        .collect();
        sans.insert(vm.hostname.clone());
        sans.extend(vm.ephemeral_ips.iter().map(|ip| ip.to_string()));
        // k3s puts the node's own address (the NIC's private IP) in the certificate too.
        sans.extend(vm.private_ip.map(|ip| ip.to_string()));
        for other in st.vms.values() {
            if (other.member || std::ptr::eq(other, vm))
                && let Some(k3s) = other.user_data.as_ref().and_then(|u| u.k3s.as_ref())
            {
                sans.extend(k3s.tls_san.iter().cloned());
            }
            // The `tls-san+` drop-in written from `tailscale ip -4` at boot.
            if (other.member || std::ptr::eq(other, vm))
                && other.tailnet_san
                && let Some(ip) = other.tailnet_ip
            {
                sans.insert(ip.to_string());
            }
        }
        sans.into_iter().collect()
    }

    fn open_listener(
        self: &Arc<Self>,
        guard: &mut ListenersGuard<'_>,
        id: Uuid,
        addr: SocketAddr,
        kind: ListenerKind,
        sans: Vec<String>,
    ) {
        let result = match kind {
            ListenerKind::KubeApi => match self.twin.server_tls_config(&sans) {
                Ok(tls) => {
                    let twin = self.twin.clone();
                    guard.open(addr, kind, id, move |listener| twin.serve(listener, tls))
                }
                Err(err) => {
                    tracing::warn!(%addr, error = %err, "cannot build the API serving certificate");
                    return;
                }
            },
            ListenerKind::Ssh => {
                let Some((host, backend)) = self.ssh_parts(id, addr) else {
                    return;
                };
                guard.open(addr, kind, id, move |listener| async move {
                    host.serve(listener, backend).await;
                })
            }
        };
        if let Err(err) = result {
            tracing::warn!(%addr, ?kind, instance = %id, error = %err, "cannot listen");
        }
    }

    fn ssh_parts(
        self: &Arc<Self>,
        id: Uuid,
        via: SocketAddr,
    ) -> Option<(Arc<SshHost>, Arc<dyn SshBackend>)> {
        let st = self.state();
        let vm = st.vms.get(&id)?;
        let mut keys: Vec<AuthorizedKey> = vm
            .user_data
            .as_ref()
            .map(|u| u.authorized_keys.clone())
            .unwrap_or_default();
        keys.extend(
            vm.api_ssh_keys
                .iter()
                .filter_map(|k| parse_public_key(k))
                .map(|key| AuthorizedKey { user: None, key }),
        );
        let files = vm
            .user_data
            .as_ref()
            .map(|u| u.files.clone())
            .unwrap_or_default();
        let backend = VmBackend {
            via,
            boot: Arc::downgrade(self),
            id,
            generation: vm.generation,
            hostname: vm.hostname.clone(),
            keys,
            files,
        };
        Some((vm.ssh_host.clone(), Arc::new(backend)))
    }

    // ---- boot ---------------------------------------------------------------------------

    async fn run_boot(self: Arc<Self>, id: Uuid, generation: u64, user_data: Vec<u8>) {
        let (started, name, hostname, host, decoy) = {
            let st = self.state();
            let Some(vm) = st.vms.get(&id) else { return };
            (
                vm.boot_started,
                vm.name.clone(),
                vm.hostname.clone(),
                vm.ssh_host.clone(),
                vm.decoy_host.clone(),
            )
        };
        self.log(
            id,
            started,
            "Linux version 6.8.0-oxide (buildd@oxide) #1 SMP PREEMPT_DYNAMIC",
        );
        self.log(
            id,
            started,
            "Command line: BOOT_IMAGE=/vmlinuz root=LABEL=cloudimg-rootfs ro console=ttyS0",
        );
        self.log(
            id,
            started,
            &format!(
                "cloud-init[721]: Cloud-init v. 24.4.1 running 'init' at {}. Up 3.12 seconds.",
                chrono::Utc::now().to_rfc2822()
            ),
        );

        let parsed = parse_user_data(&user_data);
        let user_data = match parsed {
            Ok(ud) => Some(Arc::new(ud)),
            Err(err) => {
                self.log(id, started, &format!("cloud-init[721]: {err}"));
                tracing::info!(instance = %name, reason = %err, "user-data refused");
                None
            }
        };

        if let Some(ud) = &user_data {
            for path in ud.files.keys() {
                self.log(
                    id,
                    started,
                    &format!("cloud-init[812]: write_files: wrote {path}"),
                );
            }
        }
        {
            let mut st = self.state();
            let Some(vm) = st.vms.get_mut(&id).filter(|v| v.generation == generation) else {
                return;
            };
            vm.user_data = user_data.clone();
            vm.sshd_up = true;
        }
        // cloud-init's keys-to-console module prints the host key fingerprints.
        let wrong_key = Self::name_matches(&self.faults.get().wrong_console_host_key, &name);
        let printed = if wrong_key {
            decoy.unwrap_or(host)
        } else {
            host
        };
        // sshd is up before cloud-init prints the keys, so a client that read the console
        // can connect at once.
        self.sync_listeners(id);
        if !self.current(id, generation) {
            return;
        }
        self.console(id, &printed.console_fingerprints(&hostname));
        self.log(
            id,
            started,
            &format!(
                "cloud-init[901]: Cloud-init v. 24.4.1 finished at {}. Up 6.40 seconds",
                chrono::Utc::now().to_rfc2822()
            ),
        );

        let Some(ud) = user_data else { return };
        self.tailscale_up(id, generation, &ud, &hostname, started);
        let Some(role) = ud.role else { return };
        let Some(mut k3s) = ud.k3s.clone() else {
            // k3s without a config file: a fresh server would create its own cluster with a
            // random token, an agent would have no server. Model what the product renders.
            let msg = format!(
                "oxide-sim: cloud-init wrote no {K3S_CONFIG_PATH}; k3s has no configuration"
            );
            self.k3s_log(id, started, "fatal", &msg);
            self.set_k3s(id, generation, K3sState::Refused);
            return;
        };
        if let Some(prefix) = &ud.smbios_provider_id_prefix {
            k3s.kubelet_arg.push(format!("provider-id={prefix}{id}"));
        }

        tokio::time::sleep(self.cfg.k3s_boot).await;
        if !self.current(id, generation) {
            return;
        }
        let version = ud
            .install_version
            .clone()
            .unwrap_or_else(|| self.cfg.k3s_version.clone());
        self.log(
            id,
            started,
            &format!("cloud-init[1187]: [INFO]  Using {version} as release"),
        );
        let unit = if role == Role::Server {
            "k3s"
        } else {
            "k3s-agent"
        };
        self.log(
            id,
            started,
            &format!("cloud-init[1187]: [INFO]  systemd: Starting {unit}"),
        );
        self.k3s_log(
            id,
            started,
            "info",
            &format!(
                "Starting k3s {} {version}",
                if role == Role::Server {
                    "server"
                } else {
                    "agent"
                }
            ),
        );
        self.set_k3s(id, generation, K3sState::Waiting);

        if Self::name_matches(&self.faults.get().never_join, &name) {
            // Fault: k3s hangs before it ever registers (e.g. a broken network path).
            self.k3s_log(
                id,
                started,
                "info",
                "Waiting for control-plane node to start: etcd not ready",
            );
            return;
        }

        let mut attempt: u64 = 0;
        let mut last_retry = String::new();
        loop {
            if !self.current(id, generation) {
                return;
            }
            match self.decide(id, role, &k3s) {
                Decision::Retry(msg) => {
                    if msg != last_retry || attempt.is_multiple_of(25) {
                        self.k3s_log(id, started, "info", &msg);
                        last_retry = msg;
                    }
                    attempt += 1;
                    tokio::time::sleep(self.cfg.join_retry).await;
                }
                Decision::Fatal(msg) => {
                    self.k3s_log(id, started, "fatal", &msg);
                    tracing::info!(instance = %name, "k3s refused to start");
                    self.set_k3s(id, generation, K3sState::Refused);
                    return;
                }
                decision @ (Decision::Create | Decision::Join) => {
                    tokio::time::sleep(self.cfg.k3s_join).await;
                    if !self.current(id, generation) {
                        return;
                    }
                    self.finish_join(
                        id,
                        generation,
                        role,
                        &k3s,
                        &version,
                        matches!(decision, Decision::Create),
                        started,
                    );
                    return;
                }
            }
        }
    }

    /// Runs the user-data's `tailscale up` against the simulated tailnet: on success the VM
    /// gets its tailnet address (and listeners there); on failure the console says why, the
    /// way tailscale prints it, and the VM stays off the tailnet.
    fn tailscale_up(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        ud: &UserData,
        hostname: &str,
        started: Instant,
    ) {
        let Some(up) = &ud.tailscale else { return };
        let joined = match self.tailnet.get() {
            Some(tailnet) => tailnet.join(id, up, hostname),
            None => Err(crate::tailscale::JoinError::InvalidKey),
        };
        match joined {
            Ok(ip) => {
                {
                    let mut st = self.state();
                    let Some(vm) = st.vms.get_mut(&id).filter(|v| v.generation == generation)
                    else {
                        return;
                    };
                    vm.tailnet_ip = Some(IpAddr::V4(ip));
                    vm.tailnet_san = up.san_drop_in;
                }
                self.log(
                    id,
                    started,
                    &format!("tailscaled[1240]: Switching ipn state Starting -> Running; tailnet address {ip}"),
                );
                self.sync_listeners(id);
            }
            Err(err) => {
                self.log(id, started, &format!("cloud-init[1250]: {err}"));
                tracing::info!(instance = %id, reason = %err, "tailscale up refused");
            }
        }
    }

    fn set_k3s(&self, id: Uuid, generation: u64, k3s: K3sState) {
        let mut st = self.state();
        if let Some(vm) = st.vms.get_mut(&id).filter(|v| v.generation == generation) {
            vm.k3s = k3s;
        }
    }

    /// What k3s does next, judged against the cluster and what is listening right now.
    fn decide(&self, id: Uuid, role: Role, k3s: &K3sConfig) -> Decision {
        let guard = self.listeners.lock();
        let st = self.state();
        let Some(vm) = st.vms.get(&id) else {
            return Decision::Fatal("instance vanished".into());
        };
        let accepted_server: Vec<&str> = match (&st.cluster, role) {
            (None, Role::Server) if k3s.server.is_none() => return Decision::Create,
            (Some(cluster), Role::Server) if vm.member || cluster.creator == id => {
                // Restart with the datastore on disk: no join needed, only the same token.
                let check = k3s
                    .token
                    .as_deref()
                    .map(|t| check_token(t, &[&cluster.token], &self.ca_hash));
                return match check {
                    None | Some(TokenCheck::Ok) => Decision::Join,
                    Some(_) => Decision::Fatal(format!(
                        "{PREPARING}: bootstrap data already found and encrypted with different token"
                    )),
                };
            }
            (Some(cluster), Role::Server) if k3s.server.is_none() => {
                let same = k3s
                    .token
                    .as_deref()
                    .map(|t| check_token(t, &[&cluster.token], &self.ca_hash));
                return Decision::Fatal(match same {
                    Some(TokenCheck::Ok) => format!(
                        "{PREPARING}: oxide-sim runs one cluster and it already exists; a server \
                         without 'server:' would bootstrap a second one; set server: \
                         https://<existing server>:6443 to join"
                    ),
                    _ => format!(
                        "{PREPARING}: failed to validate token: cluster-init with a token that \
                         does not match the existing cluster's; refusing to bootstrap a second \
                         cluster"
                    ),
                });
            }
            (Some(cluster), Role::Server) => vec![cluster.token.as_str()],
            (Some(cluster), Role::Agent) => {
                vec![cluster.agent_token.as_str(), cluster.token.as_str()]
            }
            (None, _) => Vec::new(),
        };
        let Some(url) = k3s.server.as_deref() else {
            return Decision::Fatal("Error: --server is required".into());
        };
        let Some((host, port)) = parse_server_url(url) else {
            return Decision::Fatal(format!(
                "Error: invalid server url {url}: must be https://host:port"
            ));
        };
        let Ok(ip) = host.parse::<IpAddr>() else {
            return Decision::Retry(format!(
                "{NOT_READY}: Get \\\"{url}/cacerts\\\": dial tcp: lookup {host}: no such host"
            ));
        };
        let serving = guard.is_serving(SocketAddr::new(ip, port), ListenerKind::KubeApi);
        // The rack's VPC firewall judges the joiner's connection like any other.
        let admitted = self.oxide.get().is_none_or(|o| {
            o.tcp_admitted(crate::oxide::Peer::Instance(id), SocketAddr::new(ip, port))
                .unwrap_or(true)
        });
        if serving && !admitted {
            return Decision::Retry(format!(
                "{NOT_READY}: Get \\\"{url}/cacerts\\\": dial tcp {ip}:{port}: i/o timeout"
            ));
        }
        if !serving || st.cluster.is_none() {
            return Decision::Retry(format!(
                "{NOT_READY}: Get \\\"{url}/cacerts\\\": dial tcp {ip}:{port}: connect: connection refused"
            ));
        }
        let Some(token) = k3s.token.as_deref() else {
            return Decision::Fatal("Error: --token is required".into());
        };
        match (check_token(token, &accepted_server, &self.ca_hash), role) {
            (TokenCheck::Ok, _) => Decision::Join,
            (TokenCheck::CaHashMismatch, Role::Server) => Decision::Fatal(format!(
                "{PREPARING}: failed to validate token: {CA_MISMATCH}"
            )),
            (TokenCheck::CaHashMismatch, Role::Agent) => Decision::Fatal(format!(
                "failed to validate token: {CA_MISMATCH} served at {url}/cacerts"
            )),
            (TokenCheck::Wrong, Role::Server) => Decision::Fatal(format!(
                "{PREPARING}: failed to validate token: {url}/v1-k3s/server-bootstrap: 401 Unauthorized"
            )),
            (TokenCheck::Wrong, Role::Agent) => Decision::Fatal(format!(
                "failed to get CA certs: {url}/cacerts: 401 Unauthorized (the join token is wrong)"
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_join(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        role: Role,
        k3s: &K3sConfig,
        version: &str,
        create: bool,
        started: Instant,
    ) {
        let node = {
            let mut st = self.state();
            if create {
                if st.cluster.is_some() {
                    // Another server created the cluster between decide and now; loop again
                    // next boot. Rare enough to simply refuse this round.
                    drop(st);
                    self.k3s_log(
                        id,
                        started,
                        "fatal",
                        "starting kubernetes: preparing server: bootstrap data already found",
                    );
                    self.set_k3s(id, generation, K3sState::Refused);
                    return;
                }
                let token = k3s.token.clone().unwrap_or_else(random_token);
                let agent_token = k3s.agent_token.clone().unwrap_or_else(|| token.clone());
                st.cluster = Some(Cluster {
                    token,
                    agent_token,
                    creator: id,
                });
            }
            let Some(vm) = st
                .vms
                .get_mut(&id)
                .filter(|v| v.generation == generation && v.running)
            else {
                return;
            };
            vm.k3s = K3sState::Joined;
            vm.member = true;
            let name = k3s
                .node_name
                .clone()
                .unwrap_or_else(|| vm.hostname.to_lowercase());
            vm.node_name = Some(name.clone());
            let ip = vm
                .ephemeral_ips
                .first()
                .or(vm.external_ips.first())
                .copied();
            node_object(&name, &vm.hostname, id, role, k3s, version, ip)
        };
        self.register_node(node);
        if role == Role::Server {
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

    /// Registers (or re-registers) the Node like a starting kubelet: a missing Node is
    /// created; an existing one keeps its spec (cordon, taints) and annotations, gets the
    /// kubelet-managed labels and a fresh status, and turns Ready.
    fn register_node(&self, fresh: Value) {
        let name = fresh["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let object = match self.twin.get("v1", "Node", None, &name) {
            None => fresh,
            Some(mut existing) => {
                if let (Some(labels), Some(new)) = (
                    existing["metadata"]
                        .as_object_mut()
                        .map(|m| m.entry("labels").or_insert_with(|| json!({})))
                        .and_then(Value::as_object_mut),
                    fresh["metadata"]["labels"].as_object(),
                ) {
                    for (k, v) in new {
                        labels.insert(k.clone(), v.clone());
                    }
                }
                if existing["spec"]["providerID"].is_null()
                    && !fresh["spec"]["providerID"].is_null()
                {
                    existing["spec"]["providerID"] = fresh["spec"]["providerID"].clone();
                }
                let conditions = existing["status"]["conditions"].clone();
                existing["status"] = fresh["status"].clone();
                if conditions.is_array() {
                    existing["status"]["conditions"] = conditions;
                }
                existing
            }
        };
        if let Err(err) = self.twin.upsert(object) {
            tracing::warn!(node = %name, error = %err, "cannot register node");
            return;
        }
        self.twin.set_node_ready(&name, true);
    }

    /// The VM stopped running: its boot stops, listeners close, its kubelet stops reporting.
    fn halt(self: &Arc<Self>, id: Uuid) {
        let node = {
            let mut st = self.state();
            let Some(vm) = st.vms.get_mut(&id) else {
                return;
            };
            vm.generation += 1;
            vm.running = false;
            vm.sshd_up = false;
            vm.k3s = K3sState::Off;
            vm.tailnet_ip = None;
            vm.node_name.clone()
        };
        if let Some(tailnet) = self.tailnet.get() {
            tailnet.disconnect(id);
        }
        self.sync_listeners(id);
        if let Some(node) = node
            && self.twin.get("v1", "Node", None, &node).is_some()
        {
            self.twin.set_node_ready(&node, false);
        }
    }
}

fn random_token() -> String {
    use rand::RngExt as _;
    let mut rng = rand::rng();
    (0..32)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

/// The Node object a k3s kubelet registers.
fn node_object(
    name: &str,
    hostname: &str,
    instance: Uuid,
    role: Role,
    k3s: &K3sConfig,
    version: &str,
    ip: Option<IpAddr>,
) -> Value {
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
    let taints: Vec<Value> = k3s
        .node_taint
        .iter()
        .filter_map(|t| parse_taint(t))
        .collect();
    // The kubelet takes the last of repeated flags.
    let provider_id = k3s
        .kubelet_arg
        .iter()
        .rev()
        .find_map(|a| {
            a.trim_start_matches("--")
                .strip_prefix("provider-id=")
                .map(str::to_string)
        })
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
            "capacity": {"pods": "110", "ephemeral-storage": "20Gi"},
            "allocatable": {"pods": "110", "ephemeral-storage": "19Gi"},
            "conditions": [
                pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
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

// ---------------------------------------------------------------------------------------------
// events

impl RackEvents for Boot {
    fn instance_running(&self, inst: &RunningInstance) {
        let inner = &self.inner;
        let generation = {
            let mut st = inner.state();
            let floating: BTreeSet<IpAddr> = st.floating.keys().copied().collect();
            let wrong_key =
                Inner::name_matches(&inner.faults.get().wrong_console_host_key, &inst.name);
            let vm = st.vms.entry(inst.id).or_insert_with(|| Vm {
                tailnet_ip: None,
                tailnet_san: false,
                ssh_logins: Vec::new(),
                name: inst.name.clone(),
                hostname: inst.hostname.clone(),
                ssh_host: Arc::new(SshHost::generate()),
                decoy_host: None,
                generation: 0,
                running: false,
                boot_started: Instant::now(),
                ephemeral_ips: Vec::new(),
                external_ips: Vec::new(),
                private_ip: None,
                api_ssh_keys: Vec::new(),
                user_data: None,
                sshd_up: false,
                k3s: K3sState::Off,
                member: false,
                node_name: None,
                uploads: BTreeMap::new(),
            });
            if wrong_key && vm.decoy_host.is_none() {
                vm.decoy_host = Some(Arc::new(SshHost::generate()));
            }
            vm.generation += 1;
            vm.running = true;
            vm.boot_started = Instant::now();
            vm.name = inst.name.clone();
            vm.hostname = inst.hostname.clone();
            vm.external_ips = inst.external_ips.clone();
            vm.private_ip = Some(inst.private_ip);
            vm.ephemeral_ips = inst
                .external_ips
                .iter()
                .filter(|ip| !floating.contains(ip))
                .copied()
                .collect();
            vm.api_ssh_keys = inst.ssh_public_keys.clone();
            vm.user_data = None;
            vm.sshd_up = false;
            vm.k3s = K3sState::Off;
            vm.tailnet_ip = None;
            vm.tailnet_san = false;
            vm.generation
        };
        let task = inner
            .clone()
            .run_boot(inst.id, generation, inst.user_data.clone());
        inner.runtime.spawn(task);
    }

    fn instance_halted(&self, id: Uuid) {
        self.inner.halt(id);
    }

    fn instance_deleted(&self, id: Uuid) {
        self.inner.halt(id);
        if let Some(tailnet) = self.inner.tailnet.get() {
            tailnet.remove(id);
        }
        let mut st = self.inner.state();
        if let Some(vm) = st.vms.remove(&id)
            && !vm.uploads.is_empty()
            && let Some(dir) = self.inner.vm_upload_dir(id)
        {
            let _ = std::fs::remove_dir_all(dir);
        }
        st.floating.retain(|_, owner| *owner != id);
        // A cluster whose every member is gone is gone (its datastore lived on their disks).
        if st.cluster.is_some() && !st.vms.values().any(|v| v.member) {
            st.cluster = None;
        }
        drop(st);
        self.inner.listeners.lock().close_owner(id);
    }

    fn floating_ip_changed(&self, ip: IpAddr, instance: Option<Uuid>) {
        let previous = {
            let mut st = self.inner.state();
            let previous = match instance {
                Some(owner) => st.floating.insert(ip, owner),
                None => st.floating.remove(&ip),
            };
            // A floating IP is never one of the VM's own addresses.
            if let Some(owner) = instance
                && let Some(vm) = st.vms.get_mut(&owner)
            {
                vm.ephemeral_ips.retain(|e| *e != ip);
            }
            previous
        };
        if let Some(prev) = previous
            && Some(prev) != instance
        {
            self.inner.sync_listeners(prev);
        }
        if let Some(owner) = instance {
            self.inner.sync_listeners(owner);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ssh backend

/// What a server VM's sshd sees: the keys cloud-init installed (plus the instance's API keys)
/// and the files on its disk.
struct VmBackend {
    /// The address this sshd listens on (external, floating or tailnet).
    via: SocketAddr,
    boot: Weak<Inner>,
    id: Uuid,
    generation: u64,
    hostname: String,
    keys: Vec<AuthorizedKey>,
    files: BTreeMap<String, Vec<u8>>,
}

impl SshBackend for VmBackend {
    fn authorized(&self, user: &str, key: &russh::keys::PublicKey) -> bool {
        let ok = self.keys.iter().any(|k| {
            k.user.as_deref().is_none_or(|u| u == user) && k.key.key_data() == key.key_data()
        });
        if ok && let Some(inner) = self.boot.upgrade() {
            let mut st = inner.state();
            if let Some(vm) = st.vms.get_mut(&self.id) {
                if vm.ssh_logins.len() >= 32 {
                    vm.ssh_logins.remove(0);
                }
                vm.ssh_logins.push(self.via);
            }
        }
        ok
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn write_file(&self, path: &str, data: &[u8]) -> bool {
        self.write_file_mode(path, data, None)
    }

    /// Stores the file on the host under the simulator's upload directory, with the mode the
    /// upload asked for (0644 otherwise), so a hostPath volume can run it.
    fn write_file_mode(&self, path: &str, data: &[u8], mode: Option<u32>) -> bool {
        use std::os::unix::fs::PermissionsExt as _;
        let Some(inner) = self.boot.upgrade() else {
            return false;
        };
        // Absolute, no `..`: the guest path maps into the VM's directory and nowhere else.
        let rel = match path.strip_prefix('/') {
            Some(rel) if !rel.is_empty() && !rel.split('/').any(|c| c == ".." || c.is_empty()) => {
                rel
            }
            _ => return false,
        };
        let Some(dir) = inner.vm_upload_dir(self.id) else {
            return false;
        };
        let host = dir.join(rel);
        let written = host
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&host, data))
            .and_then(|()| {
                std::fs::set_permissions(
                    &host,
                    std::fs::Permissions::from_mode(mode.unwrap_or(0o644) & 0o7777),
                )
            });
        if let Err(err) = written {
            tracing::warn!(instance = %self.id, error = %err, "cannot store an uploaded file");
            return false;
        }
        let mut st = inner.state();
        match st.vms.get_mut(&self.id) {
            Some(vm) => {
                vm.uploads.insert(path.to_owned(), host);
                true
            }
            None => false,
        }
    }

    fn read_file(&self, path: &str) -> Option<Vec<u8>> {
        if let Some(inner) = self.boot.upgrade() {
            let host = inner
                .state()
                .vms
                .get(&self.id)
                .and_then(|vm| vm.uploads.get(path).cloned());
            if let Some(host) = host {
                return std::fs::read(host).ok();
            }
        }
        if path == "/etc/hostname" {
            return Some(format!("{}\n", self.hostname).into_bytes());
        }
        if matches!(
            path,
            K3S_KUBECONFIG_PATH | K3S_NODE_TOKEN_PATH | K3S_TOKEN_PATH | K3S_AGENT_TOKEN_PATH
        ) {
            let inner = self.boot.upgrade()?;
            let (token, agent_token) = {
                let st = inner.state();
                let vm = st.vms.get(&self.id)?;
                // k3s writes these once the server has started.
                if vm.generation != self.generation || vm.k3s != K3sState::Joined {
                    return None;
                }
                let cluster = st.cluster.as_ref()?;
                (cluster.token.clone(), cluster.agent_token.clone())
            };
            return Some(match path {
                K3S_KUBECONFIG_PATH => inner
                    .twin
                    .admin_kubeconfig("https://127.0.0.1:6443")
                    .into_bytes(),
                K3S_AGENT_TOKEN_PATH => {
                    format!("K10{}::node:{agent_token}\n", inner.ca_hash).into_bytes()
                }
                _ => format!("K10{}::server:{token}\n", inner.ca_hash).into_bytes(),
            });
        }
        self.files.get(path).cloned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ud(body: &str) -> Result<UserData, UserDataError> {
        parse_user_data(format!("#cloud-config\n{body}").as_bytes())
    }

    #[test]
    fn user_data_without_the_cloud_config_header_is_refused() {
        assert_eq!(
            parse_user_data(b"#!/bin/sh\necho hi\n").unwrap_err(),
            UserDataError::NoHeader
        );
    }

    #[test]
    fn user_data_over_32_kib_is_refused() {
        let big = format!("#cloud-config\n# {}\n", "x".repeat(MAX_USER_DATA));
        assert!(matches!(
            parse_user_data(big.as_bytes()),
            Err(UserDataError::TooLarge(_))
        ));
    }

    #[test]
    fn user_data_must_be_a_mapping() {
        assert_eq!(ud("- a\n- b\n").unwrap_err(), UserDataError::NotMapping);
    }

    #[test]
    fn k3s_config_is_read_from_write_files_plain_and_base64() {
        let config = "token: s3cret\ncluster-init: true\ntls-san: [10.0.0.1]\nnode-label: [\"a=b\"]\nnode-taint: [\"k=v:NoSchedule\"]\nkubelet-arg: [\"provider-id=oxide://x\"]\n";
        let b64 = base64::engine::general_purpose::STANDARD.encode(config);
        for entry in [
            format!(
                "  - path: /etc/rancher/k3s/config.yaml\n    content: |\n{}",
                config
                    .lines()
                    .map(|l| format!("      {l}\n"))
                    .collect::<String>()
            ),
            format!(
                "  - path: /etc/rancher/k3s/config.yaml\n    encoding: b64\n    content: {b64}\n"
            ),
        ] {
            let parsed = ud(&format!("write_files:\n{entry}runcmd:\n  - curl -sfL https://get.k3s.io | INSTALL_K3S_EXEC='server' INSTALL_K3S_VERSION=v1.33.1+k3s1 sh -\n")).unwrap();
            let k3s = parsed.k3s.unwrap();
            assert_eq!(k3s.token.as_deref(), Some("s3cret"));
            assert!(k3s.cluster_init);
            assert_eq!(k3s.tls_san, ["10.0.0.1"]);
            assert_eq!(parsed.role, Some(Role::Server));
            assert_eq!(parsed.install_version.as_deref(), Some("v1.33.1+k3s1"));
        }
    }

    #[test]
    fn malformed_taints_and_write_files_are_refused() {
        let err = ud("write_files:\n  - content: x\n").unwrap_err();
        assert!(matches!(err, UserDataError::WriteFiles(_)));
        let err = ud("write_files:\n  - path: /etc/rancher/k3s/config.yaml\n    content: \"node-taint: [\\\"k=v:Sometimes\\\"]\"\n").unwrap_err();
        assert!(matches!(err, UserDataError::K3sConfig { .. }));
    }

    #[test]
    fn config_drop_ins_layer_on_config_yaml_and_the_smbios_provider_id_step_is_recognised() {
        let ud = ud(concat!(
            "write_files:\n",
            "  - path: /etc/rancher/k3s/config.yaml\n",
            "    content: \"node-label: [a=1]\\nkubelet-arg: [v=2]\\n\"\n",
            "  - path: /etc/rancher/k3s/config.yaml.d/10-extra.yaml\n",
            "    content: \"node-label+: [b=2]\\nkubelet-arg: [v=3]\\n\"\n",
            "runcmd:\n",
            "  - sh -c 'printf \"kubelet-arg+:\\n  - provider-id=oxide://%s\\n\" ",
            "\"$(tr A-Z a-z < /sys/class/dmi/id/product_uuid)\" > /etc/rancher/k3s/config.yaml.d/50-p.yaml'\n",
        ))
        .unwrap();
        let k3s = ud.k3s.unwrap();
        assert_eq!(k3s.node_label, ["a=1", "b=2"], "+ appends");
        assert_eq!(k3s.kubelet_arg, ["v=3"], "a plain key replaces");
        assert_eq!(ud.smbios_provider_id_prefix.as_deref(), Some("oxide://"));
    }

    #[test]
    fn role_comes_from_the_install_step() {
        let cases = [
            (
                "INSTALL_K3S_EXEC=\"agent\" sh /opt/install.sh",
                Some(Role::Agent),
            ),
            (
                "INSTALL_K3S_EXEC=server sh /opt/install.sh",
                Some(Role::Server),
            ),
            (
                "curl -sfL https://get.k3s.io | sh -s - agent",
                Some(Role::Agent),
            ),
            ("systemctl enable --now k3s-agent", Some(Role::Agent)),
            ("systemctl enable --now k3s", Some(Role::Server)),
            ("echo hello", None),
            // Tailscale's installer is not k3s's.
            ("curl -fsSL https://tailscale.com/install.sh | sh", None),
        ];
        for (cmd, role) in cases {
            assert_eq!(detect_role(&[cmd.to_string()]), role, "{cmd}");
        }
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
