//! SSH to the cluster's VMs: a russh client that only talks to pinned host keys.
//!
//! This module owns:
//! - [`HostKeyPins`]: the set of host key fingerprints we trust for one VM, parsed from the
//!   cloud-init block on the instance's serial console (trust rooted in the Oxide API, never
//!   trust-on-first-use);
//! - [`SshTarget`]: connect, authenticate with the controller's key, run one command with
//!   timeouts and bounded output, read or upload a file with `sudo -n`;
//! - [`RemoteShell`]: the narrow trait workflows use, with the in-memory [`fake::FakeShell`];
//! - [`SshKeyPair`]: ed25519 key generation and OpenSSH encodings, with a redacting `Debug`.
//!
//! What must not live here: deciding *which* VM to talk to or what to do with the files
//! (workflows), and reading the console (the rack adapter hands us its text).

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use futures::future::BoxFuture;
use russh::keys::ssh_key::LineEnding;
use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::{HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use russh::{ChannelMsg, Disconnect, client};

/// Default limit on the bytes a command may write to stdout (and, separately, stderr).
pub const DEFAULT_MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// Default time allowed for TCP connect + key exchange + authentication.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Default time allowed for one command, from opening the channel to its close.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a failed command's stderr is quoted in an error.
const STDERR_EXCERPT: usize = 512;

const BEGIN_FINGERPRINTS: &str = "-----BEGIN SSH HOST KEY FINGERPRINTS-----";
const END_FINGERPRINTS: &str = "-----END SSH HOST KEY FINGERPRINTS-----";
/// The `logger` tags whose host key blocks on the serial console are trusted: cloud-init's
/// `write-ssh-key-fingerprints` (`-t cloud-init` since cloud-init 21.2) and the per-boot
/// script of the product's user-data (`-t oxide-controller`).
pub const TRUSTED_CONSOLE_TAGS: [&str; 2] = ["cloud-init", "oxide-controller"];

/// Everything that can go wrong talking SSH to a VM. Each variant names the address.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// The server presented a host key that is not pinned.
    #[error(
        "host key of {addr} is {presented}, but the pinned fingerprints are {}: refusing to \
         connect. Either someone is intercepting the connection or the VM now has other host \
         keys (rebuilt); compare with the fingerprints on the instance's serial console",
        expected.join(", ")
    )]
    HostKeyMismatch {
        /// Address we connected to.
        addr: SocketAddr,
        /// `SHA256:…` fingerprint of the key the server presented.
        presented: String,
        /// The pinned fingerprints.
        expected: Vec<String>,
    },
    /// No pins were given; we never trust on first use.
    #[error(
        "no pinned host key for {addr}: read the fingerprints from the instance's serial console first"
    )]
    NoPins {
        /// Address we would have connected to.
        addr: SocketAddr,
    },
    /// TCP connect, key exchange or the SSH transport failed.
    #[error("SSH connection to {addr} failed")]
    Connect {
        /// Address we connected to.
        addr: SocketAddr,
        /// Underlying transport error.
        #[source]
        source: russh::Error,
    },
    /// Connecting and authenticating took longer than allowed.
    #[error("SSH connection to {addr} did not complete within {timeout:?}")]
    ConnectTimeout {
        /// Address we connected to.
        addr: SocketAddr,
        /// The limit.
        timeout: Duration,
    },
    /// The server refused our public key.
    #[error(
        "{addr} refused public key {key_fingerprint} for user {user}: the key must be in that \
         user's authorized_keys (cloud-init `users[].ssh_authorized_keys`)"
    )]
    AuthRejected {
        /// Address we connected to.
        addr: SocketAddr,
        /// Remote user.
        user: String,
        /// Fingerprint of the key we offered (public information).
        key_fingerprint: String,
    },
    /// The session failed after authentication (channel open, exec, transfer).
    #[error("SSH session with {addr} failed")]
    Session {
        /// Address we connected to.
        addr: SocketAddr,
        /// Underlying protocol error.
        #[source]
        source: russh::Error,
    },
    /// The server refused to run the command (exec request failed).
    #[error("{addr} refused to run the command")]
    ExecRefused {
        /// Address we connected to.
        addr: SocketAddr,
    },
    /// The command ran longer than allowed.
    #[error("command on {addr} did not finish within {timeout:?}")]
    CommandTimeout {
        /// Address we connected to.
        addr: SocketAddr,
        /// The limit.
        timeout: Duration,
    },
    /// The command wrote more than the output limit.
    #[error("command on {addr} wrote more than {limit} bytes of output; aborted")]
    OutputTooLarge {
        /// Address we connected to.
        addr: SocketAddr,
        /// The limit in bytes.
        limit: usize,
    },
    /// The channel closed without an exit status (killed by a signal or dropped).
    #[error("command on {addr} ended without an exit status{}", signal.as_ref().map(|s| format!(" (signal {s})")).unwrap_or_default())]
    NoExitStatus {
        /// Address we connected to.
        addr: SocketAddr,
        /// Signal name, when the server reported one.
        signal: Option<String>,
    },
    /// `sudo -n cat PATH` exited non-zero.
    #[error("reading {path} on {addr} failed with exit status {exit_status}: {stderr}")]
    ReadFile {
        /// Address we connected to.
        addr: SocketAddr,
        /// Remote path.
        path: String,
        /// Exit status of the remote command.
        exit_status: u32,
        /// Start of stderr, lossily decoded.
        stderr: String,
    },
    /// The upload command exited non-zero.
    #[error("writing {path} on {addr} failed with exit status {exit_status}: {stderr}")]
    Upload {
        /// Address we connected to.
        addr: SocketAddr,
        /// Remote path.
        path: String,
        /// Exit status of the remote command.
        exit_status: u32,
        /// Start of stderr, lossily decoded.
        stderr: String,
    },
}

/// Errors about keys and pins (no network involved).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The console text has no complete fingerprint block.
    #[error(
        "the serial console shows no complete SSH host key fingerprint block yet \
         (cloud-init prints it late in the first boot); wait and read it again"
    )]
    NoFingerprintBlock,
    /// The first fingerprint block lists no SHA256 fingerprints.
    #[error(
        "the first SSH host key fingerprint block on the serial console lists no SHA256 fingerprints"
    )]
    EmptyFingerprintBlock,
    /// A fingerprint string is not `SHA256:<43 base64 characters>`.
    #[error("{0:?} is not an OpenSSH SHA256 fingerprint (expected SHA256:<base64>)")]
    BadFingerprint(String),
    /// The private key text could not be parsed.
    #[error("cannot parse the OpenSSH private key")]
    ParsePrivate(#[source] russh::keys::ssh_key::Error),
    /// The public key text could not be parsed.
    #[error("cannot parse the OpenSSH public key")]
    ParsePublic(#[source] russh::keys::ssh_key::Error),
    /// Encoding a key failed.
    #[error("cannot encode the key in OpenSSH format")]
    Encode(#[source] russh::keys::ssh_key::Error),
}

/// The `SHA256:<base64, no padding>` fingerprint of a public key, exactly as OpenSSH prints it.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// The set of host key fingerprints we accept for one VM.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostKeyPins {
    fingerprints: BTreeSet<String>,
}

impl HostKeyPins {
    /// Pins from explicit `SHA256:…` strings (e.g. saved in a resume file).
    pub fn new<I, S>(fingerprints: I) -> Result<HostKeyPins, KeyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut set = BTreeSet::new();
        for fp in fingerprints {
            let fp = fp.as_ref();
            if !is_sha256_fingerprint(fp) {
                return Err(KeyError::BadFingerprint(fp.to_string()));
            }
            set.insert(fp.to_string());
        }
        Ok(HostKeyPins { fingerprints: set })
    }

    /// Pins from an instance's serial console text.
    ///
    /// cloud-init prints the host keys between `-----BEGIN SSH HOST KEY FINGERPRINTS-----` and
    /// `-----END SSH HOST KEY FINGERPRINTS-----`, one `<bits> SHA256:<b64> <comment> (<TYPE>)`
    /// per line, each through util-linux `logger -s -t cloud-init`, so a real line reads
    /// `<14>Nov 22 20:13:34 cloud-init: 256 SHA256:… (ED25519)`; the per-boot script the
    /// user-data installs prints the same block with the tag `oxide-controller`.
    ///
    /// Only logger lines tagged by one of these writers ([`TRUSTED_CONSOLE_TAGS`]) count, and
    /// a block is read from its own writer's lines only: plain text and other tags are
    /// ignored. The FIRST complete block wins: both writers print before k3s starts, so the
    /// first block of a console history was written before any workload ran on the VM, and
    /// the keys do not change on later boots (cloud-init makes them once per instance). A
    /// block printed later (a privileged pod can write to `/dev/console`) never replaces it.
    /// An unterminated block (boot still running) is ignored, as are lines in the block
    /// without a SHA256 fingerprint.
    pub fn from_console(console: &str) -> Result<HostKeyPins, KeyError> {
        // One open block per writer, so two writers' interleaved lines do not mix.
        let mut open: Vec<(&str, BTreeSet<String>)> = Vec::new();
        for line in console.lines() {
            let Some((tag, message)) = logger_line(line) else {
                continue;
            };
            if !TRUSTED_CONSOLE_TAGS.contains(&tag) {
                continue;
            }
            let block = open.iter().position(|(t, _)| *t == tag);
            if message == BEGIN_FINGERPRINTS {
                // A new BEGIN discards an unterminated earlier block (that boot was cut short).
                match block {
                    Some(i) => open[i].1.clear(),
                    None => open.push((tag, BTreeSet::new())),
                }
            } else if message == END_FINGERPRINTS {
                if let Some(i) = block {
                    let (_, fingerprints) = open.swap_remove(i);
                    if fingerprints.is_empty() {
                        return Err(KeyError::EmptyFingerprintBlock);
                    }
                    return Ok(HostKeyPins { fingerprints });
                }
            } else if let Some(i) = block
                && let Some(fp) = fingerprint_in_line(message)
            {
                open[i].1.insert(fp);
            }
        }
        Err(KeyError::NoFingerprintBlock)
    }

    /// Whether `key`'s SHA256 fingerprint is pinned.
    pub fn accepts(&self, key: &PublicKey) -> bool {
        self.fingerprints.contains(&fingerprint(key))
    }

    /// The pinned fingerprints, sorted.
    pub fn fingerprints(&self) -> impl Iterator<Item = &str> {
        self.fingerprints.iter().map(String::as_str)
    }

    /// True when nothing is pinned (connecting is then refused).
    pub fn is_empty(&self) -> bool {
        self.fingerprints.is_empty()
    }
}

/// The tag and message of a line util-linux `logger -s -t TAG` wrote to stderr:
/// `<PRI>Mmm dd hh:mm:ss TAG: message` (`syslog_local_header`: `"<%d>%s %s%s: "` with the
/// RFC 3164 time and no `[pid]` without `--id`). Anything else (plain text, a line with
/// something before the header) is `None`.
fn logger_line(line: &str) -> Option<(&str, &str)> {
    let line = line.trim_end_matches(['\r', ' ']);
    let rest = line.strip_prefix('<')?;
    let (pri, rest) = rest.split_once('>')?;
    if pri.is_empty() || pri.len() > 3 || !pri.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // `%b %e %H:%M:%S`: "Nov  2 20:13:34" (15 bytes), then a space.
    let (time, rest) = (rest.get(..15)?, rest.get(15..)?);
    let t = time.as_bytes();
    let shape = t[..3].iter().all(u8::is_ascii_alphabetic)
        && t[3] == b' '
        && (t[4] == b' ' || t[4].is_ascii_digit())
        && t[5].is_ascii_digit()
        && t[6] == b' '
        && [7, 8, 10, 11, 13, 14]
            .iter()
            .all(|&i| t[i].is_ascii_digit())
        && t[9] == b':'
        && t[12] == b':';
    if !shape {
        return None;
    }
    let (tag, message) = rest.strip_prefix(' ')?.split_once(": ")?;
    (!tag.is_empty() && !tag.contains(char::is_whitespace)).then_some((tag, message))
}

/// The SHA256 fingerprint on one console line, if it carries one.
fn fingerprint_in_line(line: &str) -> Option<String> {
    // The bit count precedes the fingerprint; requiring it keeps stray text from being
    // taken for a key.
    let tokens: Vec<&str> = line.split_whitespace().collect();
    tokens.windows(2).find_map(|pair| {
        let (bits, fp) = (pair[0], pair[1]);
        (!bits.is_empty() && bits.chars().all(|c| c.is_ascii_digit()) && is_sha256_fingerprint(fp))
            .then(|| fp.to_string())
    })
}

fn is_sha256_fingerprint(s: &str) -> bool {
    s.strip_prefix("SHA256:").is_some_and(|b64| {
        base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b64)
            .is_ok_and(|digest| digest.len() == 32)
    })
}

/// An SSH key pair whose private half never reaches `Debug`, `Display` or logs.
#[derive(Clone)]
pub struct SshKeyPair(Arc<PrivateKey>);

impl fmt::Debug for SshKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshKeyPair")
            .field("public", &self.fingerprint())
            .field("private", &"<redacted>")
            .finish()
    }
}

/// A fresh ed25519 key pair (for the controller's own SSH identity).
pub fn generate_ed25519() -> SshKeyPair {
    let seed: [u8; 32] = rand::random();
    SshKeyPair(Arc::new(PrivateKey::from(Ed25519Keypair::from_seed(&seed))))
}

impl SshKeyPair {
    /// Wrap an existing key.
    pub fn new(key: PrivateKey) -> SshKeyPair {
        SshKeyPair(Arc::new(key))
    }

    /// Parse an unencrypted OpenSSH private key (`-----BEGIN OPENSSH PRIVATE KEY-----`).
    pub fn from_openssh(text: &str) -> Result<SshKeyPair, KeyError> {
        PrivateKey::from_openssh(text.trim().as_bytes())
            .map(SshKeyPair::new)
            .map_err(KeyError::ParsePrivate)
    }

    /// The private key in OpenSSH format (LF line endings), for the state Secret.
    pub fn to_openssh(&self) -> Result<SecretText, KeyError> {
        self.0
            .to_openssh(LineEnding::LF)
            .map(|z| SecretText(z.to_string()))
            .map_err(KeyError::Encode)
    }

    /// The public key as one `authorized_keys` line: `ssh-ed25519 AAAA… comment`.
    pub fn authorized_key_line(&self, comment: &str) -> Result<String, KeyError> {
        authorized_key_line(self.0.public_key(), comment)
    }

    /// The public half.
    pub fn public_key(&self) -> &PublicKey {
        self.0.public_key()
    }

    /// `SHA256:…` fingerprint of the public half.
    pub fn fingerprint(&self) -> String {
        fingerprint(self.0.public_key())
    }

    /// The key for russh (shared, no copy of the secret).
    pub fn private_key(&self) -> Arc<PrivateKey> {
        Arc::clone(&self.0)
    }
}

/// `authorized_keys` line for a public key, with `comment` (may be empty).
pub fn authorized_key_line(key: &PublicKey, comment: &str) -> Result<String, KeyError> {
    let mut key = key.clone();
    key.set_comment(comment);
    key.to_openssh().map_err(KeyError::Encode)
}

/// Parse one `authorized_keys`-style public key line.
pub fn parse_public_key(line: &str) -> Result<PublicKey, KeyError> {
    PublicKey::from_openssh(line.trim()).map_err(KeyError::ParsePublic)
}

/// Secret text (a private key in OpenSSH format). `Debug` redacts it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(String);

impl SecretText {
    /// The secret itself; only for writing it to its destination.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretText(<redacted>)")
    }
}

/// What a remote command produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// The command's exit status.
    pub exit_status: u32,
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
}

impl CommandOutput {
    /// True when the command exited 0.
    pub fn success(&self) -> bool {
        self.exit_status == 0
    }
}

/// The side effects workflows need on a VM. Dyn-compatible so a workflow can hold
/// `&dyn RemoteShell`; [`SshTarget`] is the real one, [`fake::FakeShell`] the in-memory one.
pub trait RemoteShell: Send + Sync {
    /// Run one command (no stdin) and collect its output.
    fn exec<'a>(&'a self, cmd: &'a str) -> BoxFuture<'a, Result<CommandOutput, SshError>>;
    /// Read a file as root (`sudo -n cat PATH`). A non-zero exit is [`SshError::ReadFile`].
    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, SshError>>;
    /// [`Self::read_file`] of a file that may pass the shell's output limit (a backup's etcd
    /// snapshot): up to `max` bytes, with as long as `timeout` to read it.
    fn read_large_file<'a>(
        &'a self,
        path: &'a str,
        _max: usize,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, SshError>> {
        self.read_file(path)
    }
    /// Write a file as root with the given mode (e.g. `0o600`), replacing it.
    fn upload<'a>(
        &'a self,
        path: &'a str,
        bytes: &'a [u8],
        mode: u32,
    ) -> BoxFuture<'a, Result<(), SshError>>;
    /// Replace `path` as the login user, no `sudo` (the file stays the user's, which sshd
    /// wants of `authorized_keys`): `bytes` into [`own_file_temp`]`(path)` created with `mode`,
    /// then moved over `path` in one rename, so no reader ever sees it half-written. The
    /// default is [`Self::upload`] (test doubles without owners).
    fn replace_own_file<'a>(
        &'a self,
        path: &'a str,
        bytes: &'a [u8],
        mode: u32,
    ) -> BoxFuture<'a, Result<(), SshError>> {
        self.upload(path, bytes, mode)
    }
}

/// Where [`RemoteShell::replace_own_file`] writes before the rename (same directory: one file
/// system, so the rename is atomic).
pub fn own_file_temp(path: &str) -> String {
    format!("{path}.oxide-controller-new")
}

/// The commands [`RemoteShell::replace_own_file`] runs: the upload as the login user (content
/// on stdin), then the rename.
pub fn replace_own_file_commands(path: &str, mode: u32) -> (String, String) {
    let temp = shell_quote(&own_file_temp(path));
    (
        format!("install -m {mode:04o} /dev/null {temp} && tee {temp} > /dev/null"),
        format!("mv -f {temp} {}", shell_quote(path)),
    )
}

/// One VM to talk to: address, login, identity and the pins its host key must match.
#[derive(Clone, Debug)]
pub struct SshTarget {
    /// `IP:22` (or wherever sshd listens).
    pub addr: SocketAddr,
    /// Remote login (the cloud-init user with passwordless sudo).
    pub user: String,
    /// The controller's key pair.
    pub key: SshKeyPair,
    /// Accepted host key fingerprints (from the serial console).
    pub pins: HostKeyPins,
    /// Limit for TCP connect + key exchange + authentication.
    pub connect_timeout: Duration,
    /// Limit for one command, channel open to close.
    pub command_timeout: Duration,
    /// Limit on stdout bytes (and, separately, stderr bytes) of one command.
    pub max_output: usize,
}

impl SshTarget {
    /// A target with the default timeouts and output limit.
    pub fn new(
        addr: SocketAddr,
        user: impl Into<String>,
        key: SshKeyPair,
        pins: HostKeyPins,
    ) -> Self {
        SshTarget {
            addr,
            user: user.into(),
            key,
            pins,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            max_output: DEFAULT_MAX_OUTPUT,
        }
    }

    /// Connect, check the host key against the pins, authenticate.
    pub async fn connect(&self) -> Result<SshSession, SshError> {
        let addr = self.addr;
        if self.pins.is_empty() {
            return Err(SshError::NoPins { addr });
        }
        match tokio::time::timeout(self.connect_timeout, self.connect_inner()).await {
            Ok(result) => result,
            Err(_) => Err(SshError::ConnectTimeout {
                addr,
                timeout: self.connect_timeout,
            }),
        }
    }

    async fn connect_inner(&self) -> Result<SshSession, SshError> {
        let addr = self.addr;
        let config = Arc::new(client::Config {
            // Belt and braces: the session dies on its own if a caller forgets a timeout.
            inactivity_timeout: Some(self.command_timeout + self.connect_timeout),
            nodelay: true,
            ..Default::default()
        });
        let presented = Arc::new(Mutex::new(None));
        let handler = PinnedHostKey {
            pins: self.pins.clone(),
            presented: Arc::clone(&presented),
        };
        let mut handle = match client::connect(config, addr, handler).await {
            Ok(handle) => handle,
            Err(source) => {
                // When our check rejected the key, say so instead of "unknown key".
                let seen = presented.lock().ok().and_then(|p| p.clone());
                if let Some(presented) = seen
                    && !self.pins.fingerprints.contains(&presented)
                {
                    return Err(SshError::HostKeyMismatch {
                        addr,
                        presented,
                        expected: self.pins.fingerprints().map(str::to_string).collect(),
                    });
                }
                return Err(SshError::Connect { addr, source });
            }
        };
        let auth = handle
            .authenticate_publickey(
                self.user.clone(),
                PrivateKeyWithHashAlg::new(self.key.private_key(), None),
            )
            .await
            .map_err(|source| SshError::Connect { addr, source })?;
        if !auth.success() {
            return Err(SshError::AuthRejected {
                addr,
                user: self.user.clone(),
                key_fingerprint: self.key.fingerprint(),
            });
        }
        Ok(SshSession {
            handle,
            addr,
            command_timeout: self.command_timeout,
            max_output: self.max_output,
        })
    }

    /// Connect, run one command, disconnect.
    pub async fn exec(&self, cmd: &str) -> Result<CommandOutput, SshError> {
        let session = self.connect().await?;
        let result = session.exec(cmd).await;
        session.close().await;
        result
    }

    /// Connect, run one command with `stdin` as its input, disconnect.
    pub async fn exec_with_stdin(
        &self,
        cmd: &str,
        stdin: &[u8],
    ) -> Result<CommandOutput, SshError> {
        let session = self.connect().await?;
        let result = session.exec_with_stdin(cmd, stdin).await;
        session.close().await;
        result
    }

    /// `sudo -n cat PATH`; a non-zero exit is [`SshError::ReadFile`] with stderr's start.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, SshError> {
        let out = self.exec(&read_file_command(path)).await?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(SshError::ReadFile {
                addr: self.addr,
                path: path.to_string(),
                exit_status: out.exit_status,
                stderr: stderr_excerpt(&out.stderr),
            })
        }
    }

    /// Write `bytes` to `path` as root with `mode` (the file is created with that mode
    /// before any content is written, so a secret never sits in a world-readable file).
    pub async fn upload(&self, path: &str, bytes: &[u8], mode: u32) -> Result<(), SshError> {
        let out = self
            .exec_with_stdin(&upload_command(path, mode), bytes)
            .await?;
        upload_outcome(self.addr, path, out)
    }
}

/// A write of `path` on `addr` as its command ended: done, or [`SshError::Upload`] with the
/// exit status and the start of stderr.
fn upload_outcome(addr: SocketAddr, path: &str, out: CommandOutput) -> Result<(), SshError> {
    if out.success() {
        Ok(())
    } else {
        Err(SshError::Upload {
            addr,
            path: path.to_string(),
            exit_status: out.exit_status,
            stderr: stderr_excerpt(&out.stderr),
        })
    }
}

impl RemoteShell for SshTarget {
    fn exec<'a>(&'a self, cmd: &'a str) -> BoxFuture<'a, Result<CommandOutput, SshError>> {
        Box::pin(SshTarget::exec(self, cmd))
    }
    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, SshError>> {
        Box::pin(SshTarget::read_file(self, path))
    }
    fn read_large_file<'a>(
        &'a self,
        path: &'a str,
        max: usize,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, SshError>> {
        let wider = SshTarget {
            max_output: max,
            command_timeout: timeout,
            ..self.clone()
        };
        Box::pin(async move { wider.read_file(path).await })
    }
    fn upload<'a>(
        &'a self,
        path: &'a str,
        bytes: &'a [u8],
        mode: u32,
    ) -> BoxFuture<'a, Result<(), SshError>> {
        Box::pin(SshTarget::upload(self, path, bytes, mode))
    }
    fn replace_own_file<'a>(
        &'a self,
        path: &'a str,
        bytes: &'a [u8],
        mode: u32,
    ) -> BoxFuture<'a, Result<(), SshError>> {
        Box::pin(async move {
            let (write, rename) = replace_own_file_commands(path, mode);
            let session = self.connect().await?;
            let wrote = session.exec_with_stdin(&write, bytes).await;
            let result = match wrote {
                Ok(out) if out.success() => session.exec(&rename).await,
                other => other,
            };
            session.close().await;
            upload_outcome(self.addr, path, result?)
        })
    }
}

/// The command [`SshTarget::read_file`] runs.
pub fn read_file_command(path: &str) -> String {
    format!("sudo -n cat {}", shell_quote(path))
}

/// The command [`SshTarget::upload`] runs (content on stdin).
pub fn upload_command(path: &str, mode: u32) -> String {
    let path = shell_quote(path);
    format!("sudo -n install -m {mode:04o} /dev/null {path} && sudo -n tee {path} > /dev/null")
}

/// Quote `s` for a POSIX shell: plain when it is only safe characters, else single-quoted.
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+' | ':' | '=' | ',')
        });
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn stderr_excerpt(stderr: &[u8]) -> String {
    let cut = &stderr[..stderr.len().min(STDERR_EXCERPT)];
    let text = String::from_utf8_lossy(cut).trim().to_string();
    if stderr.len() > STDERR_EXCERPT {
        format!("{text}…")
    } else {
        text
    }
}

/// An authenticated connection; run several commands over it, then [`SshSession::close`].
pub struct SshSession {
    handle: client::Handle<PinnedHostKey>,
    addr: SocketAddr,
    command_timeout: Duration,
    max_output: usize,
}

impl fmt::Debug for SshSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshSession")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl SshSession {
    /// Run one command without stdin.
    pub async fn exec(&self, cmd: &str) -> Result<CommandOutput, SshError> {
        self.run(cmd, None).await
    }

    /// Run one command, sending `stdin` and then EOF.
    pub async fn exec_with_stdin(
        &self,
        cmd: &str,
        stdin: &[u8],
    ) -> Result<CommandOutput, SshError> {
        self.run(cmd, Some(stdin)).await
    }

    async fn run(&self, cmd: &str, stdin: Option<&[u8]>) -> Result<CommandOutput, SshError> {
        match tokio::time::timeout(self.command_timeout, self.run_inner(cmd, stdin)).await {
            Ok(result) => result,
            Err(_) => Err(SshError::CommandTimeout {
                addr: self.addr,
                timeout: self.command_timeout,
            }),
        }
    }

    async fn run_inner(&self, cmd: &str, stdin: Option<&[u8]>) -> Result<CommandOutput, SshError> {
        let addr = self.addr;
        let session_err = |source| SshError::Session { addr, source };
        let mut channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(session_err)?;
        channel.exec(true, cmd).await.map_err(session_err)?;
        if let Some(stdin) = stdin {
            channel.data(stdin).await.map_err(session_err)?;
            channel.eof().await.map_err(session_err)?;
        }
        let mut out = CommandOutput::default();
        let mut exit_status = None;
        let mut signal = None;
        while let Some(msg) = channel.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    append_bounded(&mut out.stdout, &data, self.max_output, addr)?
                }
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    append_bounded(&mut out.stderr, &data, self.max_output, addr)?
                }
                ChannelMsg::ExitStatus { exit_status: code } => exit_status = Some(code),
                ChannelMsg::ExitSignal { signal_name, .. } => {
                    signal = Some(format!("{signal_name:?}"))
                }
                ChannelMsg::Failure => return Err(SshError::ExecRefused { addr }),
                // Keep reading after Eof: the exit status may still follow before Close.
                _ => {}
            }
        }
        match exit_status {
            Some(code) => {
                out.exit_status = code;
                Ok(out)
            }
            None => Err(SshError::NoExitStatus { addr, signal }),
        }
    }

    /// Say goodbye; errors are irrelevant at this point (the server may already be gone).
    pub async fn close(self) {
        let _ = self
            .handle
            .disconnect(Disconnect::ByApplication, "", "en")
            .await;
    }
}

fn append_bounded(
    buf: &mut Vec<u8>,
    data: &[u8],
    limit: usize,
    addr: SocketAddr,
) -> Result<(), SshError> {
    if buf.len() + data.len() > limit {
        return Err(SshError::OutputTooLarge { addr, limit });
    }
    buf.extend_from_slice(data);
    Ok(())
}

/// russh client handler that accepts exactly the pinned host keys.
struct PinnedHostKey {
    pins: HostKeyPins,
    /// Fingerprint the server presented, so a rejection can be reported precisely.
    presented: Arc<Mutex<Option<String>>>,
}

impl client::Handler for PinnedHostKey {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let fp = match server_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => fingerprint(key),
            // A host certificate is judged by the key it certifies; the CA is not trusted.
            PublicKeyOrCertificate::Certificate(cert) => {
                cert.public_key().fingerprint(HashAlg::Sha256).to_string()
            }
        };
        let accepted = self.pins.fingerprints.contains(&fp);
        if let Ok(mut slot) = self.presented.lock() {
            *slot = Some(fp);
        }
        Ok(accepted)
    }
}

/// In-memory [`RemoteShell`] for workflow tests.
pub mod fake {
    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::Mutex;

    use futures::future::BoxFuture;

    use super::{CommandOutput, RemoteShell, SshError};

    /// A VM reduced to a map of files; records every command it was asked to run.
    #[derive(Debug, Default)]
    pub struct FakeShell {
        files: Mutex<BTreeMap<String, (Vec<u8>, u32)>>,
        commands: Mutex<Vec<String>>,
    }

    impl FakeShell {
        /// An empty VM.
        pub fn new() -> FakeShell {
            FakeShell::default()
        }

        /// Put a file on the VM (mode 0644).
        pub fn with_file(self, path: &str, contents: impl Into<Vec<u8>>) -> FakeShell {
            if let Ok(mut files) = self.files.lock() {
                files.insert(path.to_string(), (contents.into(), 0o644));
            }
            self
        }

        /// A file's contents and mode, if present.
        pub fn file(&self, path: &str) -> Option<(Vec<u8>, u32)> {
            self.files.lock().ok()?.get(path).cloned()
        }

        /// Every command run through `exec`, in order.
        pub fn commands(&self) -> Vec<String> {
            self.commands.lock().map(|c| c.clone()).unwrap_or_default()
        }

        fn addr() -> SocketAddr {
            SocketAddr::from((Ipv4Addr::LOCALHOST, 22))
        }
    }

    impl RemoteShell for FakeShell {
        fn exec<'a>(&'a self, cmd: &'a str) -> BoxFuture<'a, Result<CommandOutput, SshError>> {
            Box::pin(async move {
                if let Ok(mut commands) = self.commands.lock() {
                    commands.push(cmd.to_string());
                }
                Ok(match cmd {
                    "true" => CommandOutput::default(),
                    _ => CommandOutput {
                        exit_status: 127,
                        stdout: Vec::new(),
                        stderr: b"command not found\n".to_vec(),
                    },
                })
            })
        }

        fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, SshError>> {
            Box::pin(async move {
                self.file(path)
                    .map(|(bytes, _)| bytes)
                    .ok_or_else(|| SshError::ReadFile {
                        addr: Self::addr(),
                        path: path.to_string(),
                        exit_status: 1,
                        stderr: format!("cat: {path}: No such file or directory"),
                    })
            })
        }

        fn upload<'a>(
            &'a self,
            path: &'a str,
            bytes: &'a [u8],
            mode: u32,
        ) -> BoxFuture<'a, Result<(), SshError>> {
            Box::pin(async move {
                if let Ok(mut files) = self.files.lock() {
                    files.insert(path.to_string(), (bytes.to_vec(), mode));
                }
                Ok(())
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const FP_A: &str = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU";
    const FP_B: &str = "SHA256:PiPoFgA5WUoziU9lZOGxNIu9egCI1CxKy3PurtWcAJ0";

    /// One line as util-linux `logger -s -p user.info -t TAG` writes it.
    fn logged(tag: &str, message: &str) -> String {
        format!("<14>Nov  2 20:13:34 {tag}: {message}\r\n")
    }

    fn block(tag: &str, lines: &[String]) -> String {
        let mut out = logged(tag, BEGIN_FINGERPRINTS);
        for line in lines {
            out.push_str(&logged(tag, line));
        }
        out.push_str(&logged(tag, END_FINGERPRINTS));
        out
    }

    /// Audit L3: a block printed after the first boot's (a privileged pod writing to
    /// `/dev/console`, even with a trusted tag) does not replace the first boot's pins.
    #[test]
    fn a_block_printed_after_the_first_boots_does_not_win() {
        let console = format!(
            "[    1.0] Linux version 6.8.0\n{}{}Cloud-init v. 24.4.1 finished\n\
             [ 3600.2] tenant pod says hello\n{}",
            block("cloud-init", &[format!("256 {FP_A} root@cp (ED25519)")]),
            block(
                "oxide-controller",
                &[format!("256 {FP_A} root@cp (ED25519)")]
            ),
            block(
                "oxide-controller",
                &[format!("256 {FP_B} root@forged (ED25519)")]
            ),
        );
        let pins = HostKeyPins::from_console(&console).unwrap();
        assert_eq!(pins.fingerprints().collect::<Vec<_>>(), vec![FP_A]);
    }

    /// Audit L3: lines without a trusted writer's logger tag are no pins: not inside the
    /// genuine block, not as a block of their own, and another writer's BEGIN inside the
    /// genuine block does not restart it.
    #[test]
    fn only_lines_tagged_by_a_trusted_writer_are_pins() {
        let console = format!(
            "{}{}\
             256 {FP_B} root@plain (ED25519)\n\
             ec2: 256 {FP_B} root@ec2 (ED25519)\n\
             [   10.1] cloud-init[512]: 256 {FP_B} root@prefixed (ED25519)\n\
             {}{}{}{}\
             {BEGIN_FINGERPRINTS}\n256 {FP_B} root@plain (ED25519)\n{END_FINGERPRINTS}\n",
            logged("cloud-init", BEGIN_FINGERPRINTS),
            logged("cloud-init", &format!("256 {FP_A} root@cp (ED25519)")),
            logged("pod", BEGIN_FINGERPRINTS),
            logged("pod", &format!("256 {FP_B} root@pod (ED25519)")),
            logged("pod", END_FINGERPRINTS),
            logged("cloud-init", END_FINGERPRINTS),
        );
        let pins = HostKeyPins::from_console(&console).unwrap();
        assert_eq!(pins.fingerprints().collect::<Vec<_>>(), vec![FP_A]);
        // Untagged blocks alone pin nothing.
        let plain =
            format!("{BEGIN_FINGERPRINTS}\n256 {FP_B} root@plain (ED25519)\n{END_FINGERPRINTS}\n");
        assert!(matches!(
            HostKeyPins::from_console(&plain),
            Err(KeyError::NoFingerprintBlock)
        ));
    }

    /// A boot cut short inside its block: the next BEGIN of that writer starts over, and
    /// only fingerprint lines count.
    #[test]
    fn an_unterminated_block_is_dropped_and_noise_in_a_block_ignored() {
        let console = format!(
            "{}{}rebooting\n{}{}",
            logged("oxide-controller", BEGIN_FINGERPRINTS),
            logged(
                "oxide-controller",
                &format!("256 {FP_B} root@half (ED25519)")
            ),
            block(
                "oxide-controller",
                &[
                    format!("256 {FP_A} root@new (ED25519)"),
                    "256 MD5:aa:bb:cc root@new (ED25519)".to_owned(),
                    "some noise SHA256:notafingerprint".to_owned(),
                ]
            ),
            logged("oxide-controller", BEGIN_FINGERPRINTS),
        );
        let pins = HostKeyPins::from_console(&console).unwrap();
        assert_eq!(pins.fingerprints().collect::<Vec<_>>(), vec![FP_A]);
    }

    /// The block exactly as cloud-init's `write-ssh-key-fingerprints` prints it through
    /// util-linux `logger -s -p user.info -t cloud-init --` (day numbers and times included).
    #[test]
    fn pins_come_from_cloud_inits_logger_lines() {
        let console = format!(
            "<14>Nov  2 20:13:34 cloud-init: #############################################################\n\
             <14>Nov  2 20:13:34 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n\
             <14>Nov  2 20:13:34 cloud-init: 256 {FP_A} root@demo-cp-abcde (ED25519)\n\
             <14>Nov  2 20:13:34 cloud-init: 3072 {FP_B} root@demo-cp-abcde (RSA)\n\
             <14>Nov  2 20:13:34 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----\n\
             <14>Nov  2 20:13:34 cloud-init: #############################################################\n\
             -----BEGIN SSH HOST KEY KEYS-----\n\
             ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb1M0Y4hl6YqVnZ8vQm7oFzX3xK1p4tq9w2nqkqzJ0A root@demo-cp-abcde\n\
             -----END SSH HOST KEY KEYS-----\n"
        );
        let pins = HostKeyPins::from_console(&console).unwrap();
        assert_eq!(pins.fingerprints().collect::<Vec<_>>(), vec![FP_A, FP_B]);
    }

    #[test]
    fn console_without_a_complete_block_is_an_error() {
        let err = HostKeyPins::from_console(&format!(
            "booting\n{}",
            logged("cloud-init", BEGIN_FINGERPRINTS)
        ))
        .unwrap_err();
        assert!(matches!(err, KeyError::NoFingerprintBlock), "{err}");
        let err = HostKeyPins::from_console(&block("cloud-init", &[])).unwrap_err();
        assert!(matches!(err, KeyError::EmptyFingerprintBlock), "{err}");
    }

    #[test]
    fn explicit_pins_reject_malformed_fingerprints() {
        assert!(HostKeyPins::new([FP_A, FP_B]).is_ok());
        assert!(matches!(
            HostKeyPins::new(["SHA256:short"]),
            Err(KeyError::BadFingerprint(_))
        ));
        assert!(matches!(
            HostKeyPins::new(["MD5:aa:bb"]),
            Err(KeyError::BadFingerprint(_))
        ));
    }

    #[test]
    fn generated_key_round_trips_through_openssh_text_and_stays_out_of_debug() {
        let key = generate_ed25519();
        let text = key.to_openssh().unwrap();
        assert!(
            text.expose()
                .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
        );
        let parsed = SshKeyPair::from_openssh(text.expose()).unwrap();
        assert_eq!(parsed.fingerprint(), key.fingerprint());

        let line = key.authorized_key_line("oxide-controller").unwrap();
        assert!(line.starts_with("ssh-ed25519 AAAA"), "{line}");
        assert!(line.ends_with(" oxide-controller"), "{line}");
        assert_eq!(
            fingerprint(&parse_public_key(&line).unwrap()),
            key.fingerprint()
        );

        let debug = format!("{key:?} {text:?}");
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        let body: String = text.expose().lines().nth(1).unwrap_or_default().to_string();
        assert!(!debug.contains(&body), "{debug}");
        assert!(debug.contains(&key.fingerprint()));
    }

    #[test]
    fn fingerprint_matches_openssh_format() {
        let key = generate_ed25519();
        let fp = key.fingerprint();
        assert!(fp.starts_with("SHA256:") && !fp.ends_with('='), "{fp}");
        assert!(is_sha256_fingerprint(&fp));
        assert!(HostKeyPins::new([&fp]).unwrap().accepts(key.public_key()));
        assert!(!HostKeyPins::new([FP_A]).unwrap().accepts(key.public_key()));
    }

    #[test]
    fn shell_quote_handles_spaces_and_quotes() {
        assert_eq!(
            shell_quote("/etc/rancher/k3s/k3s.yaml"),
            "/etc/rancher/k3s/k3s.yaml"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$(reboot)"), "'$(reboot)'");
        assert_eq!(read_file_command("/x y"), "sudo -n cat '/x y'");
        assert_eq!(
            upload_command("/opt/img", 0o600),
            "sudo -n install -m 0600 /dev/null /opt/img && sudo -n tee /opt/img > /dev/null"
        );
    }

    #[test]
    fn host_key_mismatch_says_what_to_do_and_lists_both_sides() {
        let err = SshError::HostKeyMismatch {
            addr: "127.0.0.1:22".parse().unwrap(),
            presented: FP_B.into(),
            expected: vec![FP_A.into()],
        };
        let msg = err.to_string();
        assert!(msg.contains(FP_A) && msg.contains(FP_B), "{msg}");
        assert!(msg.contains("serial console"), "{msg}");
    }

    #[tokio::test]
    async fn fake_shell_reads_uploads_and_reports_missing_files() {
        let shell =
            fake::FakeShell::new().with_file("/etc/rancher/k3s/k3s.yaml", "apiVersion: v1\n");
        let dyn_shell: &dyn RemoteShell = &shell;
        assert_eq!(
            dyn_shell
                .read_file("/etc/rancher/k3s/k3s.yaml")
                .await
                .unwrap(),
            b"apiVersion: v1\n"
        );
        let err = dyn_shell.read_file("/nope").await.unwrap_err();
        assert!(
            matches!(err, SshError::ReadFile { exit_status: 1, .. }),
            "{err}"
        );
        dyn_shell.upload("/opt/x", b"data", 0o600).await.unwrap();
        assert_eq!(shell.file("/opt/x"), Some((b"data".to_vec(), 0o600)));
        assert_eq!(dyn_shell.exec("true").await.unwrap().exit_status, 0);
        assert_eq!(dyn_shell.exec("rm -rf /").await.unwrap().exit_status, 127);
        assert_eq!(shell.commands(), vec!["true", "rm -rf /"]);
    }
}
