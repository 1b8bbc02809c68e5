//! The local resume file of `bootstrap`: `<state dir>/<cluster>.json`, mode 0600.
//!
//! It holds what bootstrap generates and must never lose between creating the first VM and
//! writing the Secret: the controller's SSH key pair, the k3s server and agent tokens, the
//! webhook token, and the name chosen for the first control-plane instance; and, once read,
//! the SSH host key fingerprints of the servers bootstrap connected to. It is written
//! (atomically: temporary file, fsync, rename) BEFORE the first VM exists, so a run killed at
//! any instant leaves either no VM, or a VM whose keys and tokens the next run reads back here.
//! Once the Secret exists it is the durable copy; the file stays as the laptop's record.
//!
//! Owns the file's format, location and permissions. Not here: deciding when to write it
//! (the bootstrap workflow) or the Secret (the state store). `Debug` never shows a secret.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::adapters::ssh::{self, SshKeyPair};
use crate::adapters::webhook_tls;
use crate::base::names;
use crate::base::secrets::{ClusterSecrets, random_token};

/// Format version of the file.
pub const RESUME_VERSION: u32 = 1;
/// Bytes of randomness in each generated token.
const TOKEN_BYTES: usize = 32;
/// Comment on the controller's public key (shows up in `authorized_keys`).
pub const CONTROLLER_KEY_COMMENT: &str = "oxide-controller";

/// The file's content.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ResumeState {
    pub version: u32,
    pub cluster: String,
    pub project: String,
    /// Oxide API the cluster was started on (informational; the token is never stored here).
    pub oxide_host: String,
    /// Name of the instance created with `cluster-init`.
    pub first_control_plane: String,
    /// The controller's private key, OpenSSH format.
    pub ssh_private_key: String,
    /// The controller's public key, `authorized_keys` format.
    pub ssh_public_key: String,
    pub k3s_token: String,
    pub k3s_agent_token: String,
    pub webhook_token: String,
    /// The webhook's read-only token (GETs and `/metrics`). Absent in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_read_token: Option<String>,
    pub created: DateTime<Utc>,
    /// The cluster spec (YAML) bootstrap started with, so `bootstrap delete` knows the
    /// anti-affinity groups when the cluster's API is gone. Absent in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
    /// `SHA256:…` SSH host key fingerprints per instance, as first read from its serial
    /// console. Later runs verify the server against these: cloud-init prints the keys on a
    /// VM's first boot only, and a changed key is refused, never trusted anew.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_key_pins: BTreeMap<String, Vec<String>>,
    /// The webhook's CA (certificate and key) and the serving pair it first signed
    /// ([`webhook_tls`]). Absent in older files, and the CA's key in files from before the
    /// reconcile re-issued the pair: bootstrap then makes a new CA
    /// ([`ResumeState::ensure_webhook_tls`]). The cluster's copy of the pair may be newer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_tls_ca: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_tls_ca_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_tls_cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_tls_key: Option<String>,
    /// The key pair `bootstrap rotate-ssh-key` is moving the nodes to, kept here (beside the
    /// old one, still [`Self::ssh_private_key`]) from before the first node sees it until the
    /// rotation finishes ([`Self::finish_ssh_key_rotation`]): a run cut short leaves both, and
    /// the next run goes on. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_next_private_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_next_public_key: Option<String>,
    /// The backup `bootstrap recover --backup` restored and whose Secret it has not yet
    /// rewritten with what the laptop knows better (audit security-2 N6): written before the
    /// restore starts, removed once the Secret is rewritten; a later `recover` that finds the
    /// API ready finishes it. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_pending: Option<String>,
}

impl std::fmt::Debug for ResumeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeState")
            .field("cluster", &self.cluster)
            .field("project", &self.project)
            .field("oxide_host", &self.oxide_host)
            .field("first_control_plane", &self.first_control_plane)
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

/// Resume file trouble. Messages name the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("cannot read the resume file {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("the resume file {} is not valid ({message}); move it away only if no VM of this cluster exists yet", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("the resume file {} belongs to {what}; pass the matching --cluster/--project or another --state-dir", path.display())]
    Mismatch { path: PathBuf, what: String },
    #[error("cannot write the resume file {}: {message}; pass a writable --state-dir", path.display())]
    Write { path: PathBuf, message: String },
    #[error("cannot generate the controller's SSH key: {0}")]
    Key(String),
    #[error(transparent)]
    Tls(#[from] webhook_tls::TlsError),
}

/// `$HOME/.config/oxide-controller`, or `None` without a home directory.
pub fn default_state_dir(home: Option<PathBuf>) -> Option<PathBuf> {
    home.map(|h| h.join(".config").join("oxide-controller"))
}

/// `<dir of the resume file>/<cluster>-webhook-ca.pem`: the webhook's CA certificate.
pub fn webhook_ca_path(resume_path: &Path, cluster: &str) -> PathBuf {
    resume_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("{cluster}-webhook-ca.pem"))
}

/// `<dir>/<cluster>.json`.
pub fn resume_path(dir: &Path, cluster: &str) -> PathBuf {
    dir.join(format!("{cluster}.json"))
}

impl ResumeState {
    /// Fresh keys and tokens, and a name for the first control-plane instance.
    pub fn generate(
        cluster: &str,
        project: &str,
        oxide_host: &str,
        control_plane_pool: &str,
    ) -> Result<ResumeState, ResumeError> {
        let key = ssh::generate_ed25519();
        let private = key
            .to_openssh()
            .map_err(|e| ResumeError::Key(e.to_string()))?;
        let public = key
            .authorized_key_line(CONTROLLER_KEY_COMMENT)
            .map_err(|e| ResumeError::Key(e.to_string()))?;
        let mut rng = rand::rng();
        let suffix = names::random_suffix(&mut rng);
        ResumeState {
            version: RESUME_VERSION,
            cluster: cluster.to_owned(),
            project: project.to_owned(),
            oxide_host: oxide_host.to_owned(),
            first_control_plane: names::instance_name(cluster, control_plane_pool, &suffix),
            ssh_private_key: private.expose().to_owned(),
            ssh_public_key: public,
            k3s_token: random_token(&mut rng, TOKEN_BYTES),
            k3s_agent_token: random_token(&mut rng, TOKEN_BYTES),
            webhook_token: random_token(&mut rng, TOKEN_BYTES),
            webhook_read_token: Some(random_token(&mut rng, TOKEN_BYTES)),
            created: Utc::now(),
            spec: None,
            host_key_pins: BTreeMap::new(),
            webhook_tls_ca: None,
            webhook_tls_ca_key: None,
            webhook_tls_cert: None,
            webhook_tls_key: None,
            ssh_next_private_key: None,
            ssh_next_public_key: None,
            restore_pending: None,
        }
        .with_webhook_tls()
    }

    /// Generates the webhook's CA and serving pair unless the file has them all (a file
    /// whose CA's key was discarded gets a new CA: without it nothing can be re-issued); true
    /// when it did (the caller saves the file).
    pub fn ensure_webhook_tls(&mut self) -> Result<bool, ResumeError> {
        if self.webhook_tls().is_some() {
            return Ok(false);
        }
        let (tls, ca) = webhook_tls::generate(&self.cluster, crate::base::names::NAMESPACE)?;
        self.webhook_tls_ca = Some(ca.ca_pem);
        self.webhook_tls_ca_key = Some(ca.ca_key_pem);
        self.webhook_tls_cert = Some(tls.cert_pem);
        self.webhook_tls_key = Some(tls.key_pem);
        Ok(true)
    }

    /// The webhook's serving pair and CA, when the file has all four.
    pub fn webhook_tls(&self) -> Option<(webhook_tls::WebhookTls, webhook_tls::WebhookCa)> {
        let ca_pem = self.webhook_tls_ca.clone()?;
        Some((
            webhook_tls::WebhookTls {
                ca_pem: ca_pem.clone(),
                cert_pem: self.webhook_tls_cert.clone()?,
                key_pem: self.webhook_tls_key.clone()?,
            },
            webhook_tls::WebhookCa {
                ca_pem,
                ca_key_pem: self.webhook_tls_ca_key.clone()?,
            },
        ))
    }

    fn with_webhook_tls(mut self) -> Result<ResumeState, ResumeError> {
        self.ensure_webhook_tls()?;
        Ok(self)
    }

    /// The controller's key pair.
    pub fn key_pair(&self) -> Result<SshKeyPair, ResumeError> {
        SshKeyPair::from_openssh(&self.ssh_private_key).map_err(|e| ResumeError::Key(e.to_string()))
    }

    /// The key pair a rotation moves to: the one a run cut short left, else a new one (true:
    /// new, the caller saves the file before any node sees it).
    pub fn begin_ssh_key_rotation(&mut self) -> Result<(SshKeyPair, bool), ResumeError> {
        if let Some(private) = &self.ssh_next_private_key {
            let key =
                SshKeyPair::from_openssh(private).map_err(|e| ResumeError::Key(e.to_string()))?;
            return Ok((key, false));
        }
        let key = ssh::generate_ed25519();
        let private = key
            .to_openssh()
            .map_err(|e| ResumeError::Key(e.to_string()))?;
        self.ssh_next_public_key = Some(
            key.authorized_key_line(CONTROLLER_KEY_COMMENT)
                .map_err(|e| ResumeError::Key(e.to_string()))?,
        );
        self.ssh_next_private_key = Some(private.expose().to_owned());
        Ok((key, true))
    }

    /// The rotation's key becomes the controller's; the old one is dropped. False when no
    /// rotation was under way.
    pub fn finish_ssh_key_rotation(&mut self) -> bool {
        match (
            self.ssh_next_private_key.take(),
            self.ssh_next_public_key.take(),
        ) {
            (Some(private), Some(public)) => {
                self.ssh_private_key = private;
                self.ssh_public_key = public;
                true
            }
            _ => false,
        }
    }

    /// The cluster Secret's values: these keys and tokens plus the Oxide credentials (the
    /// webhook's tokens are [`Self::webhook_tokens`], a Secret of their own).
    pub fn secrets(
        &self,
        oxide_host: &str,
        oxide_token: &str,
        user_ssh_public_key: Option<&str>,
    ) -> ClusterSecrets {
        ClusterSecrets {
            oxide_host: oxide_host.to_owned(),
            oxide_token: oxide_token.to_owned(),
            oxide_project: self.project.clone(),
            oxide_cluster: self.cluster.clone(),
            k3s_token: self.k3s_token.clone(),
            k3s_agent_token: self.k3s_agent_token.clone(),
            ssh_public_key: self.ssh_public_key.clone(),
            user_ssh_public_key: user_ssh_public_key.map(str::to_owned),
            tailscale_auth_key: None,
            oxide_token_id: None,
        }
    }

    /// The webhook's tokens (Secret `oxide-controller-webhook-auth`'s values when bootstrap
    /// creates it).
    pub fn webhook_tokens(&self) -> crate::base::secrets::webhook::WebhookTokens {
        crate::base::secrets::webhook::WebhookTokens {
            token: self.webhook_token.clone(),
            read_token: self.webhook_read_token.clone(),
        }
    }

    fn check(&self, path: &Path, cluster: &str, project: &str) -> Result<(), ResumeError> {
        if self.version != RESUME_VERSION {
            return Err(ResumeError::Parse {
                path: path.to_owned(),
                message: format!("version {} is not {RESUME_VERSION}", self.version),
            });
        }
        if self.cluster != cluster || self.project != project {
            return Err(ResumeError::Mismatch {
                path: path.to_owned(),
                what: format!("cluster {} in project {}", self.cluster, self.project),
            });
        }
        self.key_pair().map(drop).map_err(|e| ResumeError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

/// Reads the resume file of `cluster`, `Ok(None)` if there is none. A file for another
/// cluster or project is refused rather than reused.
pub fn load(path: &Path, cluster: &str, project: &str) -> Result<Option<ResumeState>, ResumeError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ResumeError::Read {
                path: path.to_owned(),
                message: e.to_string(),
            });
        }
    };
    let state: ResumeState = serde_json::from_str(&text).map_err(|e| ResumeError::Parse {
        path: path.to_owned(),
        // serde_json's message names the line and column, never the content.
        message: e.to_string(),
    })?;
    state.check(path, cluster, project)?;
    tighten(path);
    Ok(Some(state))
}

/// Reads the resume file of `cluster` whatever project it names (`bootstrap delete` learns
/// the project from it); `Ok(None)` if there is none.
pub fn load_for_cluster(path: &Path, cluster: &str) -> Result<Option<ResumeState>, ResumeError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ResumeError::Read {
                path: path.to_owned(),
                message: e.to_string(),
            });
        }
    };
    let state: ResumeState = serde_json::from_str(&text).map_err(|e| ResumeError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let project = state.project.clone();
    state.check(path, cluster, &project)?;
    tighten(path);
    Ok(Some(state))
}

/// Writes the file atomically with mode 0600 (its directory 0700 when created).
pub fn save(path: &Path, state: &ResumeState) -> Result<(), ResumeError> {
    let err = |e: std::io::Error| ResumeError::Write {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let text = serde_json::to_string_pretty(state).map_err(|e| ResumeError::Write {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    write_state_file(path, text.as_bytes(), 0o600).map_err(err)
}

/// Writes `bytes` to `path` through a temporary file in the same directory (mode 0600,
/// fsynced, renamed over the target), creating missing directories with mode 0700. For
/// files outside the state directory (kubeconfigs): an existing directory's mode is left to
/// the user (`~/.kube` is often 0775 under a per-user group). See [`write_state_file`].
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic(path, bytes, 0o600, false)
}

/// Writes a file of the state directory (the resume file, the webhook CA) with `mode`, as
/// [`write_private_atomic`] does, after refusing a directory writable by group or others:
/// another local user could plant or swap files beside the keys.
pub fn write_state_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomic(path, bytes, mode, true)
}

/// Writes `bytes` to `path` with `mode` through a temporary file in the same directory,
/// fsynced and renamed over the target; missing directories are created with mode 0700,
/// and with `private_dir` an existing one writable by group or others is refused.
///
/// The temporary file has an unpredictable name and is opened with `O_CREAT|O_EXCL`
/// (`create_new`), so nothing already at that name, a symlink included, is followed or
/// reused (POSIX open(2): with `O_CREAT` and `O_EXCL` set, a symbolic link at the path
/// fails with `EEXIST`); it is removed if anything fails.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32, private_dir: bool) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    if private_dir {
        check_private_dir(dir)?;
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        random_token(&mut rand::rng(), 8)
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    let result = (|| {
        // The mode given to open(2) is masked by the umask; set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename is durable once the directory is synced.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Refuses a directory that group or others may write to (what to do: `chmod 700`).
fn check_private_dir(dir: &Path) -> std::io::Result<()> {
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the directory {} is writable by {} (mode {:o}): another local user could \
                 replace the keys kept there; run `chmod 700 {}` or choose another --state-dir",
                dir.display(),
                if mode & 0o002 != 0 {
                    "everyone"
                } else {
                    "its group"
                },
                mode & 0o7777,
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// Tightens a resume file others may read to 0600, saying so.
fn tighten(path: &Path) {
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(path = %path.display(), "the resume file is readable by others; tightening it to 0600");
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn generated_state_round_trips_with_mode_0600_and_hides_secrets_from_debug() {
        let dir = tempfile::tempdir().unwrap();
        let path = resume_path(&dir.path().join("nested"), "demo");
        let state = ResumeState::generate("demo", "proj", "https://rack", "control-plane").unwrap();
        assert!(state.first_control_plane.starts_with("demo-control-plane-"));
        assert_ne!(state.k3s_token, state.k3s_agent_token);
        save(&path, &state).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert_eq!(load(&path, "demo", "proj").unwrap(), Some(state.clone()));
        let dbg = format!("{state:?}");
        for secret in [
            &state.k3s_token,
            &state.k3s_agent_token,
            &state.webhook_token,
            &state.ssh_private_key,
        ] {
            assert!(!dbg.contains(secret.as_str()));
        }
        // The key pair parses back and matches the public line.
        let key = state.key_pair().unwrap();
        assert!(state.ssh_public_key.starts_with("ssh-ed25519 "));
        assert_eq!(
            key.authorized_key_line(CONTROLLER_KEY_COMMENT).unwrap(),
            state.ssh_public_key
        );
    }

    /// A rotation's pair is saved beside the old one (which stays the controller's), read back
    /// by the next run unchanged, hidden from `Debug`, and becomes the controller's only at
    /// the finish.
    #[test]
    fn a_rotations_pair_waits_beside_the_old_one_until_the_finish() {
        let dir = tempfile::tempdir().unwrap();
        let path = resume_path(dir.path(), "demo");
        let mut state = ResumeState::generate("demo", "proj", "https://rack", "cp").unwrap();
        let old = state.ssh_public_key.clone();
        assert!(!state.finish_ssh_key_rotation(), "nothing under way");
        let (key, made) = state.begin_ssh_key_rotation().unwrap();
        assert!(made);
        save(&path, &state).unwrap();
        let mut again = load(&path, "demo", "proj").unwrap().unwrap();
        assert_eq!(
            again.ssh_public_key, old,
            "the old key stays the controller's"
        );
        let (same, made) = again.begin_ssh_key_rotation().unwrap();
        assert!(!made);
        assert_eq!(same.fingerprint(), key.fingerprint());
        let next = again.ssh_next_private_key.clone().unwrap();
        assert!(!format!("{again:?}").contains(&next));
        assert!(again.finish_ssh_key_rotation());
        assert_eq!(again.key_pair().unwrap().fingerprint(), key.fingerprint());
        assert_ne!(again.ssh_public_key, old);
        assert!(again.ssh_next_private_key.is_none() && again.ssh_next_public_key.is_none());
    }

    #[test]
    fn a_missing_file_is_none_and_a_foreign_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = resume_path(dir.path(), "demo");
        assert_eq!(load(&path, "demo", "proj").unwrap(), None);
        let state = ResumeState::generate("demo", "proj", "https://rack", "control-plane").unwrap();
        save(&path, &state).unwrap();
        assert!(matches!(
            load(&path, "demo", "other"),
            Err(ResumeError::Mismatch { .. })
        ));
        std::fs::write(&path, "{not json").unwrap();
        let e = load(&path, "demo", "proj").unwrap_err().to_string();
        assert!(e.contains("not valid"), "{e}");
    }

    #[test]
    fn loose_permissions_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let path = resume_path(dir.path(), "demo");
        save(
            &path,
            &ResumeState::generate("demo", "p", "h", "cp").unwrap(),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        load(&path, "demo", "p").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// Audit L4: `bootstrap delete` and the other commands that read the file for any
    /// project tighten it too.
    #[test]
    fn load_for_cluster_tightens_loose_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = resume_path(dir.path(), "demo");
        save(
            &path,
            &ResumeState::generate("demo", "p", "h", "cp").unwrap(),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        load_for_cluster(&path, "demo").unwrap().unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// Audit L4: a symlink planted at any name the temporary file could take is not
    /// followed: its target is untouched, and no temporary file is left behind.
    #[test]
    fn a_symlink_planted_at_the_temp_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.json");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        // The name the old code used, and the pid prefix of the new one.
        let planted = dir
            .path()
            .join(format!(".demo.json.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        write_private_atomic(&path, b"secret").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "secret");
        assert!(
            std::fs::symlink_metadata(&planted)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }

    /// Audit L4: an existing state directory others may write to is refused, with what to
    /// do; nothing is written into it.
    #[test]
    fn a_group_or_world_writable_state_dir_is_refused() {
        for mode in [0o777, 0o775, 0o1777] {
            let dir = tempfile::tempdir().unwrap();
            let state = dir.path().join("state");
            std::fs::create_dir(&state).unwrap();
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode)).unwrap();
            let path = resume_path(&state, "demo");
            let e = save(
                &path,
                &ResumeState::generate("demo", "p", "h", "cp").unwrap(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(&format!("chmod 700 {}", state.display())), "{e}");
            assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0, "{mode:o}");
            // A kubeconfig's directory is the user's to choose (see write_private_atomic).
            if mode == 0o775 {
                write_private_atomic(&state.join("demo.yaml"), b"kubeconfig").unwrap();
            }
        }
        // A private one is fine, as is a created one (0700).
        let dir = tempfile::tempdir().unwrap();
        write_state_file(&dir.path().join("new").join("ca.pem"), b"cert", 0o644).unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join("new"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        assert_eq!(
            std::fs::metadata(dir.path().join("new").join("ca.pem"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o644
        );
    }
}
