//! A fake Tailscale for the simulator: the coordination side that admits simulated VMs into
//! one tailnet when their cloud-init runs `tailscale up` with a valid auth key, and the one
//! endpoint of the Tailscale API the product calls, `GET /api/v2/tailnet/{tailnet}/devices`
//! (bearer or basic auth with the API access token), served on its own loopback port.
//!
//! Tailnet addresses are loopback, never 100.64.0.0/10: each tailnet takes its own random
//! /24 in 127.228.0.0 – 127.254.255.0, apart from the external-IP pools (127.100 – 127.227),
//! so a VM's Kubernetes API and sshd can really listen on its tailnet address (the guest side,
//! `boot`, binds them). This module owns the tailnet's membership and the API's wire format;
//! reading the `tailscale up` step out of user-data is here too ([`parse_runcmd`]), so the
//! guest only asks "join with this" and "leave".
//!
//! Keys never reach a log, an error message, the console or a dump.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::oxide::AddressPool;

/// Name of the simulated tailnet unless configured otherwise.
pub const DEFAULT_TAILNET: &str = "oxide-sim.example";

/// How the fake Tailscale is set up. `Debug` hides the keys.
#[derive(Clone)]
pub struct TailscaleOptions {
    /// Auth keys VMs may join with. Empty: every `tailscale up` is refused.
    pub auth_keys: Vec<String>,
    /// The API access token the devices API accepts; random when None.
    pub api_key: Option<String>,
    /// The tailnet's name (the API also answers to `-`, "the key's own tailnet").
    pub tailnet: String,
    /// Device approval is on and the auth keys are not pre-approved: a VM with a valid key
    /// waits in `NeedsMachineAuth` for an admin who never comes (tailscale@de9ec7e
    /// `cmd/tailscale/cli/up.go:722-740`).
    pub approval_required: bool,
}

impl Default for TailscaleOptions {
    fn default() -> Self {
        Self {
            auth_keys: Vec::new(),
            api_key: None,
            tailnet: DEFAULT_TAILNET.to_owned(),
            approval_required: false,
        }
    }
}

impl std::fmt::Debug for TailscaleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailscaleOptions")
            .field("auth_keys", &self.auth_keys.len())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("tailnet", &self.tailnet)
            .field("approval_required", &self.approval_required)
            .finish()
    }
}

/// The `tailscale up` step of a VM's user-data, as cloud-init would run it. `Debug` hides
/// the key.
#[derive(Clone, Default, PartialEq)]
pub struct TailscaleUp {
    /// The auth key, with `file:PATH` already read from `write_files` (trimmed, as tailscale
    /// trims it). None: no key given, or [`TailscaleUp::key_problem`].
    pub auth_key: Option<String>,
    /// Why the key could not be read (`file:` naming a file cloud-init did not write).
    pub key_problem: Option<String>,
    /// `--hostname` (None: the VM's hostname).
    pub hostname: Option<String>,
    /// `--advertise-tags`.
    pub tags: Vec<String>,
    /// `--timeout` (a Go duration); None or zero: wait for ever (`up.go:134`).
    pub timeout: Option<std::time::Duration>,
    /// The script's reason when `up` exits non-zero (`|| fail "…"` on its line); None: the
    /// shell's `set -e` ends the script with the exit status.
    pub on_fail: Option<String>,
    /// A later step writes a k3s drop-in with `tls-san+` from `tailscale ip -4` before k3s
    /// starts, so the API certificate names the tailnet address.
    pub san_drop_in: bool,
}

impl std::fmt::Debug for TailscaleUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailscaleUp")
            .field("auth_key", &self.auth_key.as_ref().map(|_| "<redacted>"))
            .field("key_problem", &self.key_problem)
            .field("hostname", &self.hostname)
            .field("tags", &self.tags)
            .field("timeout", &self.timeout)
            .field("on_fail", &self.on_fail)
            .field("san_drop_in", &self.san_drop_in)
            .finish()
    }
}

fn unquote(s: &str) -> &str {
    s.trim_matches(|c| c == '\'' || c == '"')
}

/// Whether a runcmd line starts k3s (the install script or its systemd unit). Tailscale's
/// own `install.sh` is not k3s.
fn starts_k3s(cmd: &str) -> bool {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    cmd.contains("get.k3s.io")
        || cmd.contains("INSTALL_K3S_")
        || (cmd.contains("install.sh") && !cmd.contains("tailscale"))
        || (words.contains(&"systemctl")
            && words.iter().any(|w| {
                matches!(
                    *w,
                    "k3s" | "k3s.service" | "k3s-agent" | "k3s-agent.service"
                )
            }))
}

/// Finds the `tailscale up` step in `runcmd` (each entry as one line; argv entries joined
/// with spaces) and resolves its key from `write_files`. None: the user-data runs no
/// `tailscale up`.
pub fn parse_runcmd(commands: &[String], files: &BTreeMap<String, Vec<u8>>) -> Option<TailscaleUp> {
    let (up_index, words) = commands.iter().enumerate().find_map(|(i, cmd)| {
        let words: Vec<&str> = cmd.split_whitespace().map(unquote).collect();
        let pos = words
            .windows(2)
            .position(|w| w[0].ends_with("tailscale") && w[1] == "up")?;
        Some((
            i,
            words[pos + 2..]
                .iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>(),
        ))
    })?;
    let mut up = TailscaleUp {
        on_fail: commands[up_index]
            .split_once("|| fail \"")
            .and_then(|(_, rest)| rest.split_once('"').map(|(text, _)| text.to_owned())),
        ..TailscaleUp::default()
    };
    let mut key_arg = None;
    let mut it = words.iter();
    while let Some(w) = it.next() {
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) => (f, Some(unquote(v).to_string())),
            None => (w.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().map(|v| unquote(v).to_string()))
        };
        match flag {
            "--auth-key" | "--authkey" => key_arg = value(),
            "--hostname" => up.hostname = value(),
            "--timeout" => {
                up.timeout = value()
                    .and_then(|v| go_duration(&v))
                    .filter(|d| !d.is_zero());
            }
            "--advertise-tags" => {
                up.tags = value()
                    .unwrap_or_default()
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect();
            }
            _ => {}
        }
    }
    if let Some(arg) = key_arg {
        match arg.strip_prefix("file:") {
            Some(path) => match files.get(path) {
                Some(content) => {
                    up.auth_key = Some(String::from_utf8_lossy(content).trim().to_string());
                }
                None => {
                    up.key_problem = Some(format!(
                        "reading auth key: open {path}: no such file or directory"
                    ));
                }
            },
            None => up.auth_key = Some(arg),
        }
    }
    let k3s_index = commands.iter().position(|c| starts_k3s(c));
    up.san_drop_in = commands.iter().enumerate().any(|(i, cmd)| {
        i > up_index
            && k3s_index.is_none_or(|k| i < k)
            && (cmd.contains("tailscale ip -4") || cmd.contains("tailscale ip --4"))
            && cmd.contains("tls-san")
    });
    Some(up)
}

/// A Go `time.ParseDuration` value made of `h`, `m`, `s` and `ms` parts (`300s`, `5m`,
/// `1m30s`); None for anything else.
fn go_duration(v: &str) -> Option<std::time::Duration> {
    let mut total = std::time::Duration::ZERO;
    let mut rest = v.trim();
    if rest == "0" {
        return Some(total);
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (std::time::Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (std::time::Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (std::time::Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (std::time::Duration::from_secs(1), 1)
        } else {
            return None;
        };
        total += unit * u32::try_from(n).ok()?;
        rest = &rest[len..];
    }
    Some(total)
}

/// What `tailscale up` prints when its `--timeout` ends the wait (`up.go:828-829`).
pub const UP_TIMEOUT_MESSAGE: &str = "timeout waiting for Tailscale service to enter a Running state; check health with \"tailscale status\"";

/// Why a VM could not join; the text is what `tailscale up` prints (never the key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// No key: `tailscale up` prints a login URL nobody on a headless VM visits, and waits.
    #[error("To authenticate, visit: https://login.tailscale.com/a/0123456789ab")]
    NoKey,
    /// Device approval is on and the key is not pre-approved: it prints the admin page and
    /// waits in `NeedsMachineAuth` (`up.go:722-740,843-844`).
    #[error(
        "To approve your machine, visit (as admin): https://login.tailscale.com/admin/machines"
    )]
    NeedsApproval,
    /// The key file could not be read.
    #[error("{0}")]
    KeyFile(String),
    /// The key is not one of the tailnet's.
    #[error("backend error: invalid key: API key does not exist")]
    InvalidKey,
    /// A tag that is malformed.
    #[error("requested tags {0:?} are invalid or not permitted")]
    BadTags(Vec<String>),
    /// The simulated tailnet has no address left.
    #[error("backend error: no tailnet address available")]
    Exhausted,
}

impl JoinError {
    /// `tailscale up` does not exit on this: it waits until `--timeout`, or for ever without
    /// one (`up.go:805-830`). The others are `fatalf("backend error: …")` (`up.go:733-735`)
    /// or a flag error, and exit 1 at once.
    pub fn waits(&self) -> bool {
        matches!(self, JoinError::NoKey | JoinError::NeedsApproval)
    }
}

#[derive(Clone, Debug)]
struct Device {
    id: u64,
    hostname: String,
    addr: Ipv4Addr,
    tags: Vec<String>,
    created: chrono::DateTime<chrono::Utc>,
    last_seen: chrono::DateTime<chrono::Utc>,
    online: bool,
}

impl Device {
    /// The device as `GET /api/v2/tailnet/{tailnet}/devices` lists it.
    fn to_json(&self, tailnet: &str) -> Value {
        let ts = |t: &chrono::DateTime<chrono::Utc>| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        };
        let [_, _, c, d] = self.addr.octets();
        json!({
            "addresses": [self.addr.to_string(), format!("fd7a:115c:a1e0::{c:x}:{d:x}")],
            "id": self.id.to_string(),
            "nodeId": format!("n{:x}CNTRL", self.id),
            "user": "tagged-devices",
            "name": format!("{}.{tailnet}", self.hostname),
            "hostname": self.hostname,
            "clientVersion": "1.84.0-sim",
            "updateAvailable": false,
            "os": "linux",
            "created": ts(&self.created),
            "lastSeen": ts(&self.last_seen),
            "connectedToControl": self.online,
            "keyExpiryDisabled": true,
            "authorized": true,
            "isExternal": false,
            "blocksIncomingConnections": false,
            "tags": self.tags,
        })
    }
}

struct Inner {
    auth_keys: Vec<String>,
    approval_required: bool,
    api_key: String,
    tailnet: String,
    pool: AddressPool,
    /// Devices by instance: a VM keeps its node (and address) across reboots, as tailscaled
    /// keeps its state on disk.
    devices: Mutex<BTreeMap<Uuid, Device>>,
    next_id: AtomicU64,
    requests: Mutex<BTreeMap<String, u64>>,
}

/// The simulated tailnet and its devices API. Clones share state.
#[derive(Clone)]
pub struct Tailnet {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Tailnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tailnet")
            .field("tailnet", &self.inner.tailnet)
            .field("addresses", &self.inner.pool.first_last())
            .finish_non_exhaustive()
    }
}

fn valid_tag(tag: &str) -> bool {
    tag.strip_prefix("tag:").is_some_and(|name| {
        let mut chars = name.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

fn subtle_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tailnet {
    /// A tailnet with its own random loopback /24.
    pub fn new(opts: &TailscaleOptions) -> Self {
        let pool = AddressPool::new(rand::random_range(228u8..=254u8), rand::random::<u8>());
        let api_key = opts.api_key.clone().unwrap_or_else(|| {
            let body: String = (0..24)
                .map(|_| format!("{:x}", rand::random_range(0..16u8)))
                .collect();
            format!("tskey-api-sim-{body}")
        });
        Self {
            inner: Arc::new(Inner {
                auth_keys: opts.auth_keys.clone(),
                approval_required: opts.approval_required,
                api_key,
                tailnet: opts.tailnet.clone(),
                pool,
                devices: Mutex::new(BTreeMap::new()),
                next_id: AtomicU64::new(1_000_001),
                requests: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    fn devices(&self) -> MutexGuard<'_, BTreeMap<Uuid, Device>> {
        self.inner
            .devices
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The API access token the devices API accepts.
    pub fn api_key(&self) -> &str {
        &self.inner.api_key
    }

    /// The tailnet's name.
    pub fn name(&self) -> &str {
        &self.inner.tailnet
    }

    /// Admits `instance` (hostname `default_hostname` unless `up` names one) when its key is
    /// valid, and returns its tailnet address — the same one on every boot of the instance.
    pub fn join(
        &self,
        instance: Uuid,
        up: &TailscaleUp,
        default_hostname: &str,
    ) -> Result<Ipv4Addr, JoinError> {
        if let Some(problem) = &up.key_problem {
            return Err(JoinError::KeyFile(problem.clone()));
        }
        let key = up.auth_key.as_deref().ok_or(JoinError::NoKey)?;
        if !self
            .inner
            .auth_keys
            .iter()
            .any(|k| subtle_eq(k.as_bytes(), key.as_bytes()))
        {
            return Err(JoinError::InvalidKey);
        }
        let bad: Vec<String> = up.tags.iter().filter(|t| !valid_tag(t)).cloned().collect();
        if !bad.is_empty() {
            return Err(JoinError::BadTags(bad));
        }
        if self.inner.approval_required {
            return Err(JoinError::NeedsApproval);
        }
        let hostname = up
            .hostname
            .clone()
            .unwrap_or_else(|| default_hostname.to_owned());
        let now = chrono::Utc::now();
        let mut devices = self.devices();
        if let Some(d) = devices.get_mut(&instance) {
            d.hostname = hostname;
            d.tags = up.tags.clone();
            d.last_seen = now;
            d.online = true;
            return Ok(d.addr);
        }
        let addr = self.inner.pool.allocate().ok_or(JoinError::Exhausted)?;
        devices.insert(
            instance,
            Device {
                id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
                hostname,
                addr,
                tags: up.tags.clone(),
                created: now,
                last_seen: now,
                online: true,
            },
        );
        Ok(addr)
    }

    /// The VM stopped: its device stays in the tailnet, offline.
    pub fn disconnect(&self, instance: Uuid) {
        if let Some(d) = self.devices().get_mut(&instance) {
            d.online = false;
            d.last_seen = chrono::Utc::now();
        }
    }

    /// A later boot of a VM that joined before: tailscaled starts from its state on disk and
    /// the device comes back online with its address, without `tailscale up`. None: the
    /// instance never joined.
    pub fn reconnect(&self, instance: Uuid) -> Option<Ipv4Addr> {
        let mut devices = self.devices();
        let d = devices.get_mut(&instance)?;
        d.online = true;
        d.last_seen = chrono::Utc::now();
        Some(d.addr)
    }

    /// The VM was deleted: its device goes (as an ephemeral node's does) with its address.
    pub fn remove(&self, instance: Uuid) {
        if let Some(d) = self.devices().remove(&instance) {
            self.inner.pool.release(d.addr);
        }
    }

    /// The tailnet address of `instance`, if it ever joined.
    pub fn address_of(&self, instance: Uuid) -> Option<Ipv4Addr> {
        self.devices().get(&instance).map(|d| d.addr)
    }

    /// Devices and request counters, for the admin state dump (no keys).
    pub fn dump(&self) -> Value {
        let devices: Vec<Value> = self
            .devices()
            .iter()
            .map(|(instance, d)| {
                let mut v = d.to_json(&self.inner.tailnet);
                v["instance"] = json!(instance);
                v["online"] = json!(d.online);
                v
            })
            .collect();
        json!({
            "tailnet": self.inner.tailnet,
            "addresses": self.inner.pool.first_last(),
            "devices": devices,
        })
    }

    /// Requests served per route (`"GET /api/v2/tailnet/{tailnet}/devices"`, ...).
    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Zeroes the request counters.
    pub fn reset_counters(&self) {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn count(&self, route: &str) {
        *self
            .inner
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(route.to_owned())
            .or_default() += 1;
    }

    /// Whether the request carries the API key, as `Authorization: Bearer KEY` or as the
    /// basic-auth user name (both are documented for Tailscale API access tokens).
    fn authorized(&self, req: &http::Request<Bytes>) -> bool {
        let Some(value) = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let given = if let Some(token) = value.strip_prefix("Bearer ") {
            token.trim().to_owned()
        } else if let Some(basic) = value.strip_prefix("Basic ") {
            base64::engine::general_purpose::STANDARD
                .decode(basic.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.split_once(':').map(|(user, _)| user.to_owned()))
                .unwrap_or_default()
        } else {
            return false;
        };
        subtle_eq(given.as_bytes(), self.inner.api_key.as_bytes())
    }

    /// Serves the devices API: `GET /api/v2/tailnet/{tailnet}/devices`, everything else 404.
    pub async fn handle(&self, req: http::Request<Bytes>) -> http::Response<Bytes> {
        use http::StatusCode;
        let path = req.uri().path().to_string();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let route = match segments.as_slice() {
            ["api", "v2", "tailnet", _, "devices"] => "/api/v2/tailnet/{tailnet}/devices",
            _ => "other",
        };
        self.count(&format!("{} {route}", req.method()));
        if !self.authorized(&req) {
            return respond(
                StatusCode::UNAUTHORIZED,
                json!({"message": "API token invalid"}),
            );
        }
        match (req.method(), segments.as_slice()) {
            (&http::Method::GET, ["api", "v2", "tailnet", tailnet, "devices"]) => {
                let tailnet = percent_decode(tailnet);
                if tailnet != "-" && tailnet != self.inner.tailnet {
                    return respond(StatusCode::NOT_FOUND, json!({"message": "not found"}));
                }
                let devices: Vec<Value> = self
                    .devices()
                    .values()
                    .map(|d| d.to_json(&self.inner.tailnet))
                    .collect();
                respond(StatusCode::OK, json!({ "devices": devices }))
            }
            (_, ["api", "v2", "tailnet", _, "devices"]) => respond(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"message": "method not allowed"}),
            ),
            _ => respond(StatusCode::NOT_FOUND, json!({"message": "not found"})),
        }
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn respond(status: http::StatusCode, body: Value) -> http::Response<Bytes> {
    let mut r = http::Response::new(Bytes::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const KEY_PATH: &str = "/etc/oxide-controller/tailscale-auth-key";

    fn files(key: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(KEY_PATH.to_string(), format!("{key}\n").into_bytes())])
    }

    fn lines(cmds: &[&str]) -> Vec<String> {
        cmds.iter().map(|s| s.to_string()).collect()
    }

    fn tailnet() -> Tailnet {
        Tailnet::new(&TailscaleOptions {
            auth_keys: vec!["tskey-auth-good".into()],
            api_key: Some("tskey-api-good".into()),
            ..TailscaleOptions::default()
        })
    }

    #[test]
    fn the_up_step_is_read_with_its_key_file_tags_and_the_san_drop_in_before_k3s() {
        let cmds = lines(&[
            "curl -fsSL https://tailscale.com/install.sh | sh",
            "tailscale up --auth-key=file:/etc/oxide-controller/tailscale-auth-key --advertise-tags=tag:k8s --hostname=demo-cp-abcde",
            "sh -c 'ip=\"$(tailscale ip -4)\" && printf \"tls-san+:\\n  - %s\\n\" \"$ip\" > /etc/rancher/k3s/config.yaml.d/60-tailscale-san.yaml'",
            "curl -sfL https://get.k3s.io | INSTALL_K3S_EXEC='server' sh -",
        ]);
        let up = parse_runcmd(&cmds, &files("tskey-auth-good")).unwrap();
        assert_eq!(up.auth_key.as_deref(), Some("tskey-auth-good"));
        assert_eq!(up.hostname.as_deref(), Some("demo-cp-abcde"));
        assert_eq!(up.tags, ["tag:k8s"]);
        assert!(up.san_drop_in);
        assert!(!format!("{up:?}").contains("tskey-auth-good"));
        // After k3s started, the drop-in comes too late.
        let late = lines(&[
            cmds[0].as_str(),
            cmds[1].as_str(),
            cmds[3].as_str(),
            cmds[2].as_str(),
        ]);
        assert!(!parse_runcmd(&late, &files("k")).unwrap().san_drop_in);
        // A key file cloud-init never wrote.
        let up = parse_runcmd(&cmds, &BTreeMap::new()).unwrap();
        assert_eq!(up.auth_key, None);
        assert!(up.key_problem.unwrap().contains("no such file"));
        // Inline keys and space-separated values work as the CLI takes them.
        let up = parse_runcmd(
            &lines(&["sudo tailscale up --authkey 'tskey-x' --advertise-tags tag:a,tag:b"]),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(up.auth_key.as_deref(), Some("tskey-x"));
        assert_eq!(up.tags, ["tag:a", "tag:b"]);
        assert_eq!(up.timeout, None, "no --timeout: waits for ever");
        assert_eq!(up.on_fail, None);
        // `--timeout` as a Go duration, and the script's reason from `|| fail "…"`.
        let up = parse_runcmd(
            &lines(&["tailscale up --timeout=1m30s --authkey=k || fail \"did not join\""]),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(up.timeout, Some(std::time::Duration::from_secs(90)));
        assert_eq!(up.on_fail.as_deref(), Some("did not join"));
        for (v, want) in [
            ("300s", Some(300_000)),
            ("5m", Some(300_000)),
            ("250ms", Some(250)),
            ("0", Some(0)),
            ("1h2m3s", Some(3_723_000)),
            ("5", None),
            ("1.5s", None),
            ("", Some(0)),
        ] {
            assert_eq!(go_duration(v).map(|d| d.as_millis()), want, "{v}");
        }
        let up = parse_runcmd(&lines(&["tailscale up --timeout 0s"]), &BTreeMap::new()).unwrap();
        assert_eq!(up.timeout, None, "0s is tailscale's default: for ever");
        assert_eq!(
            parse_runcmd(&lines(&["echo tailscale"]), &BTreeMap::new()),
            None
        );
    }

    #[test]
    fn only_valid_keys_join_and_an_instance_keeps_its_loopback_address() {
        let t = tailnet();
        let id = Uuid::new_v4();
        let up = TailscaleUp {
            auth_key: Some("tskey-auth-good".into()),
            tags: vec!["tag:k8s".into()],
            ..TailscaleUp::default()
        };
        let ip = t.join(id, &up, "demo-cp-abcde").unwrap();
        assert!(ip.is_loopback(), "{ip}");
        assert!(
            ip.octets()[1] >= 228,
            "apart from the external-IP pools: {ip}"
        );
        t.disconnect(id);
        assert_eq!(t.join(id, &up, "demo-cp-abcde").unwrap(), ip);
        let wrong = TailscaleUp {
            auth_key: Some("tskey-auth-wrong".into()),
            ..up.clone()
        };
        let e = t.join(Uuid::new_v4(), &wrong, "x").unwrap_err();
        assert_eq!(e, JoinError::InvalidKey);
        assert!(!e.to_string().contains("wrong"));
        let bad_tag = TailscaleUp {
            tags: vec!["k8s".into()],
            ..up.clone()
        };
        assert!(matches!(
            t.join(Uuid::new_v4(), &bad_tag, "x"),
            Err(JoinError::BadTags(_))
        ));
        t.remove(id);
        assert_eq!(t.address_of(id), None);
        // No key, or device approval nobody gives: `tailscale up` waits instead of exiting.
        let no_key = TailscaleUp {
            auth_key: None,
            ..up.clone()
        };
        let e = t.join(Uuid::new_v4(), &no_key, "x").unwrap_err();
        assert!(e.waits(), "{e}");
        assert!(!JoinError::InvalidKey.waits());
        let approval = Tailnet::new(&TailscaleOptions {
            auth_keys: vec!["tskey-auth-good".into()],
            approval_required: true,
            ..TailscaleOptions::default()
        });
        let other = Uuid::new_v4();
        let e = approval.join(other, &up, "x").unwrap_err();
        assert_eq!(e, JoinError::NeedsApproval);
        assert!(e.waits());
        assert_eq!(approval.address_of(other), None);
        // A wrong key is still refused at once, approval or not.
        assert_eq!(
            approval.join(other, &wrong, "x").unwrap_err(),
            JoinError::InvalidKey
        );
    }

    fn get(path: &str, auth: Option<&str>) -> http::Request<Bytes> {
        let mut b = http::Request::get(path);
        if let Some(a) = auth {
            b = b.header(http::header::AUTHORIZATION, a);
        }
        b.body(Bytes::new()).unwrap()
    }

    #[tokio::test]
    async fn the_devices_api_lists_joined_vms_to_the_api_key_only() {
        let t = tailnet();
        let up = TailscaleUp {
            auth_key: Some("tskey-auth-good".into()),
            tags: vec!["tag:k8s".into()],
            ..TailscaleUp::default()
        };
        let ip = t.join(Uuid::new_v4(), &up, "demo-cp-abcde").unwrap();
        let path = format!("/api/v2/tailnet/{DEFAULT_TAILNET}/devices");
        let r = t.handle(get(&path, Some("Bearer tskey-api-good"))).await;
        assert_eq!(r.status(), 200);
        let body: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["devices"][0]["hostname"], "demo-cp-abcde");
        assert_eq!(body["devices"][0]["addresses"][0], ip.to_string());
        assert_eq!(body["devices"][0]["tags"], json!(["tag:k8s"]));
        let basic = base64::engine::general_purpose::STANDARD.encode("tskey-api-good:");
        let r = t
            .handle(get(
                "/api/v2/tailnet/-/devices",
                Some(&format!("Basic {basic}")),
            ))
            .await;
        assert_eq!(r.status(), 200, "- is the key's own tailnet");
        let r = t.handle(get(&path, Some("Bearer tskey-api-bad"))).await;
        assert_eq!(r.status(), 401);
        let r = t.handle(get(&path, None)).await;
        assert_eq!(r.status(), 401);
        let r = t
            .handle(get(
                "/api/v2/tailnet/other.example/devices",
                Some("Bearer tskey-api-good"),
            ))
            .await;
        assert_eq!(r.status(), 404);
        assert_eq!(t.counters()["GET /api/v2/tailnet/{tailnet}/devices"], 5);
    }
}
