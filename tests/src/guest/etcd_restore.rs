//! A new server restored from a backup disk, as the product's setup script does it and k3s
//! answers (each rule cited in `tests/FIDELITY.md`, "k3s restore from a snapshot"):
//!
//! - k3s's bootstrap data: a new cluster's first server writes its certificates and keys to
//!   the datastore under `/bootstrap/<keyHash(token)>` (k3s `pkg/cluster` `Save`,
//!   `storageKey`), so they are in every etcd snapshot of the cluster.
//! - The `etcd-restore` step (`restore_etcd SERIAL DIR`): the NVMe disk with that serial
//!   (none: the step fails as `data_disk` does), `tar -xf` of its bytes into `DIR` (GNU tar's
//!   errors for a disk that is not an archive), `sha256sum -c etcd-snapshot.sha256` (its words
//!   on a mismatch), then `k3s server --cluster-reset --cluster-reset-restore-path=DIR/etcd-
//!   snapshot`: the server's etcd member is restored from the file (etcdutl's restore on real
//!   etcd, [`crate::control_plane::etcd::restore_member`]) and started alone; the bootstrap key
//!   of the configured token is read back from it (another token's key only: k3s's fatal
//!   "bootstrap data already found and encrypted with different token", exit 1); the
//!   certificates it holds are what the server's control plane will use; k3s exits 0 with its
//!   closing line and the reset-flag written.
//! - The next k3s start (`start_k3s`) of that server creates the cluster from the restored
//!   member and PKI: the old CA, the old ServiceAccount key, the old agent token; it then
//!   behaves as any cluster-init server (servers join it, snapshots of it work).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::cloud_init::UserData;
use super::cluster_api::RealCluster;
use super::k3s::token_secret;
use super::k3s_config::K3sConfig;
use super::setup_script::SetupStep;
use super::{Inner, K3sState};
use crate::control_plane::etcd;
use crate::control_plane::pki::Pki;
use crate::support::ustar;

/// k3s's etcd data directory (`${datadir}/server/db/etcd`).
pub const ETCD_DATA_DIR: &str = "/var/lib/rancher/k3s/server/db/etcd";

/// k3s's error when the datastore holds bootstrap data under another token's key
/// (`pkg/cluster/storage.go` `getBootstrapKeyFromStorage`).
pub const DIFFERENT_TOKEN: &str = "bootstrap data already found and encrypted with different token";

/// The prefix k3s's server start puts before a datastore error (`k3s server` exits with it).
const START_DB: &str = "starting kubernetes: preparing server: start managed database";

/// The etcd key k3s keeps its bootstrap data under for `token` (`storageKey`): `/bootstrap/`
/// and the first 12 hex digits of the sha256 of the token's password part (`normalizeToken`).
pub fn bootstrap_key(token: &str) -> String {
    let digest = Sha256::digest(token_secret(token).as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("/bootstrap/{}", &hex[..12])
}

/// k3s's bootstrap data as JSON (`bootstrap.ReadFromDisk`: file name → `{Timestamp,
/// Content}`, Content base64 as Go marshals bytes): the PKI's files and the password file
/// holding the server and agent tokens (`PasswdFile`).
pub fn bootstrap_data(pki: &Pki, token: &str, agent_token: &str) -> Vec<u8> {
    use base64::Engine as _;
    let now = chrono::Utc::now().to_rfc3339();
    let file = |content: &str| {
        json!({"Timestamp": now,
            "Content": base64::engine::general_purpose::STANDARD.encode(content)})
    };
    let mut out = serde_json::Map::new();
    for (name, pem) in pki.bootstrap_files() {
        out.insert(name, file(&pem));
    }
    let passwd = format!(
        "{},node,node,k3s:agent\n{},server,server,k3s:server\n",
        token_secret(agent_token),
        token_secret(token)
    );
    out.insert("PasswdFile".into(), file(&passwd));
    serde_json::to_vec(&Value::Object(out)).unwrap_or_default()
}

impl Inner {
    /// cluster-init: a new cluster's control plane, started while k3s starts. A server a
    /// restore left data on starts it from that member and PKI (k3s: "Starting etcd for
    /// existing cluster member", the certificates on disk); any other writes its bootstrap
    /// data under its token's key. Returns the control plane and the configuration the
    /// cluster keeps (the token filled in when the config had none, the restored agent
    /// token when the config names none). Err is what k3s exits with.
    pub(super) async fn start_cluster(
        self: &Arc<Self>,
        id: Uuid,
        k3s: &K3sConfig,
    ) -> Result<(Arc<RealCluster>, K3sConfig), String> {
        let (restored, member) = {
            let st = self.state();
            let vm = st.vms.get(&id);
            (
                vm.and_then(|v| v.restored.clone()),
                vm.and_then(|v| v.etcd_member.clone()),
            )
        };
        let (member, member_ip) = match (&restored, member) {
            (Some(_), Some((name, ip))) => (name, Some(ip)),
            _ => self.new_etcd_member(id),
        };
        // k3s `secrets-encryption`: the apiserver encrypts Secrets with the bootstrap data's
        // key (a restored server's, decrypted with its token), or a new one.
        let mut opts = crate::control_plane::ControlPlaneOptions {
            secrets_encryption: k3s.secrets_encryption,
            ..self.cfg.kubernetes.clone()
        };
        if let Some(vm) = self.state().vms.get(&id) {
            opts.etcd_release = super::etcd_member::installed_release(vm, &self.cfg.k3s_version);
        }
        let cp = RealCluster::start(
            opts,
            self.faults.clone(),
            &member,
            member_ip,
            restored
                .as_ref()
                .map(|r| (Arc::clone(&r.pki), r.data.clone())),
        )
        .await
        .map_err(|err| format!("starting the control plane: {err}"))?;
        let mut filled = k3s.clone();
        let token = filled
            .token
            .get_or_insert_with(super::k3s::random_token)
            .clone();
        match &restored {
            Some(r) => {
                if filled.agent_token.is_none() {
                    filled.agent_token.clone_from(&r.agent_token);
                }
                // The Nodes come back as the snapshot had them, Ready included, but no kubelet
                // has reached this control plane: none heartbeats until its node's k3s joins
                // it (then it registers again), so the node lifecycle controller marks the
                // others NotReady after its grace, as for kubelets that stopped reporting.
                silence_restored_nodes(&cp).await;
                // Started without `--cluster-reset`: k3s removes the reset-flag.
                if let Some(vm) = self.state().vms.get_mut(&id) {
                    vm.reset_flag = false;
                }
            }
            None => {
                let agent = filled.agent_token.clone().unwrap_or_else(|| token.clone());
                let data = encrypt(
                    token_secret(&token),
                    &bootstrap_data(cp.control_plane.pki(), &token, &agent),
                );
                cp.control_plane
                    .etcd()
                    .put(&bootstrap_key(&token), &data)
                    .await
                    .map_err(|e| format!("{START_DB}: failed to save bootstrap data: {e}"))?;
            }
        }
        Ok((Arc::new(cp), filled))
    }
}

/// Every Node of a restored cluster loses its stand-in kubelet (KWOK lets go of it).
async fn silence_restored_nodes(cp: &RealCluster) {
    let nodes = match cp.control_plane.list("v1", "Node", None).await {
        Ok(n) => n,
        Err(err) => {
            tracing::warn!(error = %err, "cannot list the restored Nodes");
            return;
        }
    };
    for node in nodes {
        if let Some(name) = node["metadata"]["name"].as_str()
            && let Err(err) = super::cluster_api::silence_real_node(&cp.control_plane, name).await
        {
            tracing::warn!(%name, error = %err, "cannot stop a restored Node's heartbeats");
        }
    }
}

/// k3s's `encrypt`: a PBKDF2-HMAC-SHA1 key (4096 rounds, 32 bytes) of `passphrase` (the
/// token's password) with a salt of 8 random bytes in hex, AES-256-GCM with a random 12-byte
/// nonce prepended to the sealed text, written as `salt:base64(nonce ‖ sealed)`.
pub fn encrypt(passphrase: &str, plaintext: &[u8]) -> Vec<u8> {
    use aes_gcm::aead::{Aead, KeyInit};
    use base64::Engine as _;
    use rand::RngExt as _;
    let mut rng = rand::rng();
    let salt: String = (0..8)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect();
    let mut key = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<sha1::Sha1>(passphrase.as_bytes(), salt.as_bytes(), 4096, &mut key);
    let nonce_bytes: [u8; 12] = rng.random();
    let (Ok(cipher), Ok(nonce)) = (
        aes_gcm::Aes256Gcm::new_from_slice(&key),
        aes_gcm::aead::Nonce::<aes_gcm::Aes256Gcm>::try_from(&nonce_bytes[..]),
    ) else {
        return Vec::new();
    };
    let sealed = cipher.encrypt(&nonce, plaintext).unwrap_or_default();
    let mut out = nonce_bytes.to_vec();
    out.extend_from_slice(&sealed);
    format!(
        "{salt}:{}",
        base64::engine::general_purpose::STANDARD.encode(out)
    )
    .into_bytes()
}

/// k3s's `decrypt` of [`encrypt`]'s output; `None` when it is not `salt:base64` or the
/// passphrase does not open it (k3s: "cipher: message authentication failed").
pub fn decrypt(passphrase: &str, data: &[u8]) -> Option<Vec<u8>> {
    use aes_gcm::aead::{Aead, KeyInit};
    use base64::Engine as _;
    let text = std::str::from_utf8(data).ok()?;
    let (salt, sealed) = text.split_once(':')?;
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(sealed)
        .ok()?;
    let mut key = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<sha1::Sha1>(passphrase.as_bytes(), salt.as_bytes(), 4096, &mut key);
    let cipher = aes_gcm::Aes256Gcm::new_from_slice(&key).ok()?;
    let nonce = aes_gcm::aead::Nonce::<aes_gcm::Aes256Gcm>::try_from(sealed.get(..12)?).ok()?;
    cipher.decrypt(&nonce, &sealed[12..]).ok()
}

/// The files of bootstrap data (name → content); `None` if it is not k3s's JSON.
fn bootstrap_files(data: &[u8]) -> Option<BTreeMap<String, String>> {
    use base64::Engine as _;
    let v: Value = serde_json::from_slice(data).ok()?;
    v.as_object()?
        .iter()
        .map(|(name, f)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(f["Content"].as_str()?)
                .ok()?;
            Some((name.clone(), String::from_utf8(bytes).ok()?))
        })
        .collect()
}

/// What a restore left on the server's disk: its etcd data directory (host path) and the PKI
/// written back from the bootstrap data (a fresh one when the snapshot held none, as k3s then
/// keeps the certificates it generated), and the agent token of the password file.
#[derive(Clone)]
pub(super) struct Restored {
    pub pki: Arc<Pki>,
    pub data: PathBuf,
    pub agent_token: Option<String>,
}

/// How the step ended: the reason the script's failure marker names.
type StepResult = Result<(), String>;

impl Inner {
    /// The `etcd-restore` step of server `id`.
    pub(super) async fn etcd_restore_step(
        self: &Arc<Self>,
        id: Uuid,
        ud: &UserData,
        (serial, dir): (&str, &str),
        started: Instant,
    ) -> StepResult {
        let oxide = self.oxide.get().cloned().ok_or("no rack")?;
        let attached = self
            .state()
            .vms
            .get(&id)
            .is_some_and(|vm| vm.disk_serials.iter().any(|s| s == serial));
        if !attached {
            return Err(format!("no NVMe disk with serial {serial}"));
        }
        // tar -xf "$dev" -C "$DIR"
        let files =
            match ustar::read_files(|off, len| oxide.read_attached_disk(id, serial, off, len)) {
                Ok(files) => files,
                Err(tar) => {
                    self.console(id, &tar);
                    return Err("exit status 2".into());
                }
            };
        for (name, data) in &files {
            self.put_vm_file(id, &format!("{dir}/{name}"), data, Some(0o600))
                .map_err(|e| format!("tar: {name}: {e}"))?;
        }
        // cd "$DIR" && sha256sum -c etcd-snapshot.sha256
        let (ok, out) = sha256sum_check(&files, "etcd-snapshot.sha256");
        self.console(id, &out);
        if !ok {
            return Err("exit status 1".into());
        }
        self.k3s_restore(id, ud, &format!("{dir}/etcd-snapshot"), started)
            .await
    }

    /// `k3s server --cluster-reset --cluster-reset-restore-path=PATH` with the unit stopped:
    /// k3s's log goes to the console; Err is the step's reason when it exits non-zero.
    async fn k3s_restore(
        self: &Arc<Self>,
        id: Uuid,
        ud: &UserData,
        path: &str,
        started: Instant,
    ) -> StepResult {
        let installed = ud.setup.iter().any(|(s, _)| {
            matches!(
                s,
                SetupStep::K3sInstall { .. } | SetupStep::K3sVersion { .. }
            )
        });
        if !installed {
            self.console(id, "sh: 1: k3s: not found\n");
            return Err("exit status 127".into());
        }
        let fatal = |msg: String| {
            self.k3s_log(id, started, "fatal", &msg);
            Err("exit status 1".to_owned())
        };
        let k3s = ud.k3s.clone().unwrap_or_default();
        let (snapshot, node, state, private, host_dir) = {
            let st = self.state();
            let Some(vm) = st.vms.get(&id) else {
                return Err("instance vanished".into());
            };
            (
                vm.uploads.get(path).cloned(),
                k3s.node_name
                    .clone()
                    .unwrap_or_else(|| vm.hostname.to_lowercase()),
                vm.k3s,
                vm.private_loopback,
                self.vm_upload_dir(id),
            )
        };
        if state != K3sState::Off {
            return fatal(format!(
                "{START_DB}: listen tcp :2380: bind: address already in use"
            ));
        }
        let Some(snapshot) = snapshot else {
            return fatal(format!(
                "{START_DB}: etcd: snapshot path does not exist: {path}"
            ));
        };
        let Some(host_dir) = host_dir else {
            return fatal("no disk".into());
        };
        let data = host_dir.join(ETCD_DATA_DIR.trim_start_matches('/'));
        if data.exists() {
            // k3s `Restore`: "Pre-restore etcd database moved to …-old-<unix seconds>".
            let old = data.with_file_name(format!("etcd-old-{}", chrono::Utc::now().timestamp()));
            let _ = std::fs::rename(&data, &old);
        }
        let log = host_dir.with_file_name(format!("{id}-etcd-restore.log"));
        let name = super::etcd_member::member_name(&node);
        let ip = etcd::member_ip(private);
        let release = {
            let st = self.state();
            st.vms.get(&id).map_or_else(
                || self.cfg.k3s_version.clone(),
                |vm| super::etcd_member::installed_release(vm, &self.cfg.k3s_version),
            )
        };
        let read = etcd::restore_member(
            &release,
            (&snapshot, &data, &log),
            &name,
            ip,
            |h, u| async move {
                let keys = etcd::read_prefix(h.clone(), u.clone(), "/bootstrap").await?;
                let nodes = etcd::read_prefix(h, u, NODES_PREFIX).await?;
                Ok((keys, nodes))
            },
        )
        .await;
        let (keys, nodes) = match read {
            Ok(read) => read,
            Err(e) => return fatal(format!("{START_DB}: {e}")),
        };
        let installing = ud
            .install_version
            .clone()
            .unwrap_or_else(|| self.cfg.k3s_version.clone());
        if let Some(refused) = downgrade_refusal(&installing, &nodes) {
            return fatal(format!("{START_DB}: {refused}"));
        }
        let restored = match restored_pki(&keys, &k3s) {
            Ok(r) => r,
            Err(msg) => return fatal(msg),
        };
        {
            let mut st = self.state();
            let Some(vm) = st.vms.get_mut(&id) else {
                return Err("instance vanished".into());
            };
            vm.etcd_member = Some((name, ip));
            vm.reset_flag = true;
            vm.restored = Some(Restored {
                pki: Arc::new(restored.0),
                data,
                agent_token: restored.1,
            });
        }
        self.k3s_log(id, started, "info", super::k3s_service::RESET_DONE);
        Ok(())
    }
}

/// Where kube-apiserver keeps Nodes in etcd (`/registry/minions/<name>`: the `minions` prefix in
/// `pkg/kubeapiserver/default_storage_factory_builder.go` `SpecialDefaultResourcePrefixes`).
const NODES_PREFIX: &str = "/registry/minions/";

/// A k3s release (`vMAJOR.MINOR.PATCH+k3sN`) read from `text` at its start: ((major, minor),
/// its length).
fn k3s_release(text: &[u8]) -> Option<((u32, u32), usize)> {
    let digits = |s: &[u8]| -> Option<(u32, usize)> {
        let n = s.iter().take_while(|c| c.is_ascii_digit()).count();
        (n > 0)
            .then(|| std::str::from_utf8(&s[..n]).ok()?.parse().ok())
            .flatten()
            .map(|v| (v, n))
    };
    let rest = text.strip_prefix(b"v")?;
    let (major, a) = digits(rest)?;
    let rest = rest[a..].strip_prefix(b".")?;
    let (minor, b) = digits(rest)?;
    let rest = rest[b..].strip_prefix(b".")?;
    let (_, c) = digits(rest)?;
    let (_, d) = digits(rest[c..].strip_prefix(b"+k3s")?)?;
    Some(((major, minor), 1 + a + 1 + b + 1 + c + 4 + d))
}

/// The (major, minor) of k3s release `text`.
fn k3s_minor(text: &[u8]) -> Option<(u32, u32)> {
    k3s_release(text).map(|(m, _)| m)
}

/// The newest k3s minor among the restored datastore's control-plane Nodes (a k3s server is
/// one binary: its kubelet's `status.nodeInfo.kubeletVersion` is its apiserver's release).
/// The values are what kube-apiserver stored (protobuf here, JSON elsewhere): both keep the
/// label key and the version as plain bytes, which is all this reads.
fn newest_server_minor(nodes: &[(String, Vec<u8>)]) -> Option<((u32, u32), String)> {
    let role = b"node-role.kubernetes.io/control-plane";
    nodes
        .iter()
        .filter(|(_, v)| v.windows(role.len()).any(|w| w == role))
        .flat_map(|(_, v)| {
            (0..v.len()).filter_map(|i| {
                let (m, len) = k3s_release(&v[i..])?;
                Some((m, String::from_utf8_lossy(&v[i..i + len]).into_owned()))
            })
        })
        .max_by(|a, b| a.0.cmp(&b.0))
}

/// The refusal of a restore by `installing` of a datastore its servers wrote at a newer k3s
/// minor (tests/FIDELITY.md, "k3s restore from a snapshot"): k3s rolls back only with "a
/// datastore snapshot taken on the Kubernetes minor version you wish to roll back to"
/// (docs.k3s.io/upgrades/roll-back); the words are etcd's own refusal of a member older than
/// the cluster's version (etcd 3.5.21 `membership/downgrade.go` `mustDetectDowngrade`).
/// Patch releases of one minor restore each other's data.
fn downgrade_refusal(installing: &str, nodes: &[(String, Vec<u8>)]) -> Option<String> {
    let mine = k3s_minor(installing.as_bytes())?;
    let (theirs, written_by) = newest_server_minor(nodes)?;
    (theirs > mine).then(|| {
        format!(
            "invalid downgrade; server version is lower than determined cluster version: the datastore was written by k3s {written_by}, this is k3s {installing}"
        )
    })
}

/// k3s's `storageBootstrap` on the restored datastore: no bootstrap key at all keeps fresh
/// certificates; the key of the configured token gives the old ones (and the agent token of
/// its password file); only other keys is k3s's fatal error.
fn restored_pki(
    keys: &[(String, Vec<u8>)],
    k3s: &K3sConfig,
) -> Result<(Pki, Option<String>), String> {
    let fresh = || Pki::new().map_err(|e| e.to_string());
    if keys.is_empty() {
        return Ok((fresh()?, None));
    }
    // A server without a token generates one, which no stored key matches.
    let want = k3s.token.as_deref().map(bootstrap_key);
    let Some((_, data)) = keys.iter().find(|(k, _)| Some(k) == want.as_ref()) else {
        return Err(DIFFERENT_TOKEN.to_owned());
    };
    let token = k3s.token.as_deref().map(token_secret).unwrap_or_default();
    let plain = decrypt(token, data).ok_or("cipher: message authentication failed")?;
    let files = bootstrap_files(&plain).ok_or("failed to decode bootstrap data")?;
    let pki = Pki::from_bootstrap(&files).map_err(|e| e.to_string())?;
    let agent = files.get("PasswdFile").and_then(|p| {
        p.lines().find_map(|l| {
            let mut f = l.split(',');
            let pass = f.next()?;
            (f.next() == Some("node")).then(|| pass.to_owned())
        })
    });
    Ok((pki, agent))
}

/// `sha256sum -c LIST` in the directory holding `files`: (all OK, what it printed). Its
/// words: `NAME: OK` per good line; `NAME: FAILED` and `WARNING: 1 computed checksum did NOT
/// match`; a list without a checksum line, or missing, is an error too.
fn sha256sum_check(files: &[(String, Vec<u8>)], list: &str) -> (bool, String) {
    let get = |name: &str| files.iter().find(|(n, _)| n == name).map(|(_, d)| d);
    let Some(text) = get(list) else {
        return (
            false,
            format!("sha256sum: {list}: No such file or directory\n"),
        );
    };
    let text = String::from_utf8_lossy(text);
    let lines: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let (hex, name) = l.split_once("  ").or_else(|| l.split_once(" *"))?;
            (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then_some((hex, name))
        })
        .collect();
    if lines.is_empty() {
        return (
            false,
            format!("sha256sum: {list}: no properly formatted checksum lines found\n"),
        );
    }
    let mut out = String::new();
    let (mut failed, mut unread) = (0, 0);
    for (hex, name) in lines {
        match get(name) {
            None => {
                unread += 1;
                out.push_str(&format!(
                    "sha256sum: {name}: No such file or directory\n{name}: FAILED open or read\n"
                ));
            }
            Some(data) => {
                let have: String = Sha256::digest(data)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                if have.eq_ignore_ascii_case(hex) {
                    out.push_str(&format!("{name}: OK\n"));
                } else {
                    failed += 1;
                    out.push_str(&format!("{name}: FAILED\n"));
                }
            }
        }
    }
    if unread > 0 {
        let s = if unread == 1 { "" } else { "s" };
        out.push_str(&format!(
            "sha256sum: WARNING: {unread} listed file{s} could not be read\n"
        ));
    }
    if failed > 0 {
        let s = if failed == 1 { "" } else { "s" };
        out.push_str(&format!(
            "sha256sum: WARNING: {failed} computed checksum{s} did NOT match\n"
        ));
    }
    (failed == 0 && unread == 0, out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_datastore_a_newer_minor_wrote_is_refused_and_a_patch_or_newer_release_is_not() {
        let node = |role: bool, version: &str| {
            let mut v = b"k8s\0\n\x0b\n\x02v1\x12\x04Node".to_vec();
            if role {
                v.extend_from_slice(b"\n%node-role.kubernetes.io/control-plane\x12\x04true");
            }
            v.extend_from_slice(b"\x3a\x0c");
            v.extend_from_slice(version.as_bytes());
            v.extend_from_slice(b"J\x00");
            ("/registry/minions/n".to_owned(), v)
        };
        let nodes = [node(true, "v1.34.1+k3s1"), node(true, "v1.33.4+k3s1")];
        let refused = downgrade_refusal("v1.33.4+k3s1", &nodes).unwrap();
        assert!(
            refused.contains("lower than determined cluster version")
                && refused.contains("v1.34.1+k3s1"),
            "{refused}"
        );
        assert_eq!(downgrade_refusal("v1.34.1+k3s1", &nodes), None);
        assert_eq!(downgrade_refusal("v1.34.0+k3s1", &nodes), None, "a patch");
        // Newer than the data: an upgrade, as the restored spec's roll would do anyway.
        assert_eq!(downgrade_refusal("v1.35.0+k3s1", &nodes), None);
        // Only servers count: an agent's version says nothing of the apiserver.
        let agents = [node(false, "v1.34.1+k3s1"), node(true, "v1.33.1+k3s1")];
        assert_eq!(downgrade_refusal("v1.33.4+k3s1", &agents), None);
        assert_eq!(downgrade_refusal("v1.33.4+k3s1", &[]), None);
        assert_eq!(k3s_minor(b"v1.30.0+k3s1"), Some((1, 30)));
        assert_eq!(k3s_minor(b"v1.30+k3s1"), None);
        assert_eq!(k3s_release(b"v1.33.4+k3s1J\x00"), Some(((1, 33), 12)));
    }

    #[test]
    fn the_bootstrap_key_is_the_token_passwords_sha256_prefix() {
        // sha256("abc") = ba7816bf8f01…
        assert_eq!(bootstrap_key("abc"), "/bootstrap/ba7816bf8f01");
        assert_eq!(
            bootstrap_key("K10aaaa::server:abc"),
            "/bootstrap/ba7816bf8f01"
        );
    }

    #[test]
    fn bootstrap_data_is_sealed_with_the_token_and_opens_only_with_it() {
        let sealed = encrypt("tok", b"{\"ServerCA\":{}}");
        let text = String::from_utf8(sealed.clone()).unwrap();
        let (salt, _) = text.split_once(':').unwrap();
        assert_eq!(salt.len(), 16, "8 random bytes in hex");
        assert!(!text.contains("ServerCA"));
        assert_eq!(decrypt("tok", &sealed).unwrap(), b"{\"ServerCA\":{}}");
        assert!(decrypt("other", &sealed).is_none());
    }

    #[test]
    fn sha256sum_says_ok_or_failed_in_its_words() {
        let data = b"snapshot".to_vec();
        let sum: String = Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let files = vec![
            ("etcd-snapshot".to_owned(), data),
            (
                "etcd-snapshot.sha256".to_owned(),
                format!("{sum}  etcd-snapshot\n").into_bytes(),
            ),
        ];
        assert_eq!(
            sha256sum_check(&files, "etcd-snapshot.sha256"),
            (true, "etcd-snapshot: OK\n".to_owned())
        );
        let mut bad = files.clone();
        bad[0].1.push(b'!');
        let (ok, out) = sha256sum_check(&bad, "etcd-snapshot.sha256");
        assert!(!ok);
        assert_eq!(
            out,
            "etcd-snapshot: FAILED\nsha256sum: WARNING: 1 computed checksum did NOT match\n"
        );
        assert!(!sha256sum_check(&files[..1], "etcd-snapshot.sha256").0);
    }

    #[test]
    fn only_the_configured_tokens_key_restores_the_pki() {
        let pki = Pki::new().unwrap();
        let keys = vec![(
            bootstrap_key("tok"),
            encrypt("tok", &bootstrap_data(&pki, "tok", "agent-tok")),
        )];
        let k3s = |t: &str| K3sConfig {
            token: Some(t.into()),
            ..Default::default()
        };
        let (restored, agent) = restored_pki(&keys, &k3s("tok")).unwrap();
        assert_eq!(restored.ca_pem(), pki.ca_pem());
        assert_eq!(agent.as_deref(), Some("agent-tok"));
        assert_eq!(
            restored_pki(&keys, &k3s("other")).err().as_deref(),
            Some(DIFFERENT_TOKEN)
        );
        let (fresh, _) = restored_pki(&[], &k3s("other")).unwrap();
        assert_ne!(fresh.ca_pem(), pki.ca_pem());
    }
}
