//! The SSH server of a simulated control-plane VM.
//!
//! This module owns the russh server that stands in for a VM's OpenSSH: its own ed25519 host
//! key (printed on the serial console the way cloud-init prints it), public-key
//! authentication only (decided by [`SshBackend::authorized`]), and a tiny command
//! interpreter for exactly what the product runs:
//!
//! | command | effect |
//! |---|---|
//! | `cat PATH`, `sudo cat PATH`, `sudo -n cat PATH` | stdout = [`SshBackend::read_file`], or stderr + exit 1 |
//! | `true` | exit 0 |
//! | `hostname` | prints [`SshBackend::hostname`] |
//! | `sudo -n tee PATH [> /dev/null]`, `cat > PATH` | stdin until EOF → [`SshBackend::write_file`] |
//! | `sudo -n install -m MODE /dev/null PATH && sudo -n tee PATH > /dev/null` | the same upload, with MODE → [`SshBackend::write_file_mode`] |
//! | `mkdir -p PATH`, `sudo -n mkdir -p PATH` | [`SshBackend::make_dir`]: exit 0, or "Permission denied" + exit 1 |
//! | `mv -f FROM TO`, `sudo -n mv -f FROM TO` | [`SshBackend::rename`] (an upload moved into place in one step): exit 0, or "Permission denied" + exit 1 |
//! | `sudo -n systemctl stop k3s`, `sudo -n systemctl start k3s`, `sudo -n k3s server --cluster-reset`, `sudo -n k3s etcd-snapshot save`, `sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml`, `sudo -n rm -f /var/lib/rancher/k3s/server/db/reset-flag`, the local etcd member list ([`K3sCommand::EtcdMemberList`]) | [`SshBackend::k3s`] (exactly these words; the default: not found) |
//! | `sudo -n k3s etcd-snapshot delete NAME` (one NAME, a plain file name) | [`SshBackend::k3s_etcd_snapshot_delete`] (the default: not found) |
//!
//! Uploads and moves say whether they ran through `sudo` (root) or as the login user: who owns
//! the file, which sshd checks when it reads `authorized_keys`.
//!
//! Anything else gets stderr "command not found" and exit 127. What the files contain (the
//! kubeconfig, the node token) is the backend's business, not this module's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::{HashAlg, PrivateKey, PublicKey};
use russh::server::{
    self, Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Server as _, Session, VerifiedPublicKey,
};
use russh::{Channel, ChannelId, MethodKind, MethodSet};

/// Largest upload accepted on one channel; beyond it the upload fails (exit 1).
const MAX_UPLOAD: usize = 256 * 1024 * 1024;

/// What a simulated VM exposes over SSH.
pub trait SshBackend: Send + Sync + 'static {
    /// Whether `key` may log in as `user` (its cloud-init authorized keys + the API's).
    fn authorized(&self, user: &str, key: &PublicKey) -> bool;
    /// Contents of a file for `cat PATH` / `sudo cat PATH`; None → "No such file or directory", exit 1.
    fn read_file(&self, path: &str) -> Option<Vec<u8>>;
    /// Accept an upload (`cat > PATH` / `sudo -n tee PATH`); false → "Permission denied", exit 1.
    fn write_file(&self, _path: &str, _data: &[u8]) -> bool {
        false
    }
    /// An upload that says its file mode (`install -m MODE …`); the default ignores the mode.
    fn write_file_mode(&self, path: &str, data: &[u8], _mode: Option<u32>) -> bool {
        self.write_file(path, data)
    }
    /// An upload as root (`sudo`) or as the login user; the default ignores the owner.
    fn write_file_as(&self, path: &str, data: &[u8], mode: Option<u32>, _root: bool) -> bool {
        self.write_file_mode(path, data, mode)
    }
    /// `mv -f FROM TO` as root or as the login user; the default refuses it.
    fn rename(&self, _from: &str, _to: &str, _root: bool) -> bool {
        false
    }
    /// `mkdir -p PATH`; the default accepts it (files need no directories here).
    fn make_dir(&self, _path: &str) -> bool {
        true
    }
    /// What `hostname` prints.
    fn hostname(&self) -> String {
        String::from("localhost")
    }
    /// One of k3s's cluster-reset commands: exit status, stdout, stderr. The default: the
    /// program is not there (exit 127).
    fn k3s(&self, command: K3sCommand) -> BoxedRun<'_> {
        let program = match command {
            K3sCommand::ClusterReset | K3sCommand::EtcdSnapshotSave => "k3s",
            K3sCommand::Stop | K3sCommand::Start => "systemctl",
            K3sCommand::DropServerUrl => "sed",
            K3sCommand::RemoveResetFlag => "rm",
            K3sCommand::EtcdMemberList => "curl",
        };
        Box::pin(std::future::ready((
            127,
            String::new(),
            format!("sh: 1: {program}: command not found\n"),
        )))
    }

    /// `sudo -n k3s etcd-snapshot delete NAME`: exit status, stdout, stderr. The default: k3s is
    /// not there (exit 127).
    fn k3s_etcd_snapshot_delete(&self, _name: String) -> BoxedRun<'_> {
        Box::pin(std::future::ready((
            127,
            String::new(),
            "sh: 1: k3s: command not found\n".to_owned(),
        )))
    }
}

/// What [`SshBackend::k3s`] returns: exit status, stdout, stderr.
pub type BoxedRun<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = (u32, String, String)> + Send + 'a>>;

/// The commands of k3s's cluster-reset procedure the product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum K3sCommand {
    /// `sudo -n systemctl stop k3s`.
    Stop,
    /// `sudo -n systemctl start k3s`.
    Start,
    /// `sudo -n k3s server --cluster-reset`.
    ClusterReset,
    /// `sudo -n k3s etcd-snapshot save`: an on-demand etcd snapshot on the server's disk.
    EtcdSnapshotSave,
    /// `sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml`: the join URL out of the
    /// k3s config, which a cluster reset needs.
    DropServerUrl,
    /// `sudo -n rm -f /var/lib/rancher/k3s/server/db/reset-flag`: k3s's reset-flag deleted.
    RemoveResetFlag,
    /// `sudo -n curl … https://127.0.0.1:2382/v3/cluster/member/list` with k3s's etcd client
    /// certificate and `{"linearizable":false}`: the local member's own member list.
    EtcdMemberList,
}

impl K3sCommand {
    /// The command line, exactly as the simulator accepts it.
    pub fn line(self) -> &'static str {
        match self {
            K3sCommand::Stop => "sudo -n systemctl stop k3s",
            K3sCommand::Start => "sudo -n systemctl start k3s",
            K3sCommand::ClusterReset => "sudo -n k3s server --cluster-reset",
            K3sCommand::EtcdSnapshotSave => "sudo -n k3s etcd-snapshot save",
            K3sCommand::DropServerUrl => {
                "sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml"
            }
            K3sCommand::RemoveResetFlag => {
                "sudo -n rm -f /var/lib/rancher/k3s/server/db/reset-flag"
            }
            K3sCommand::EtcdMemberList => {
                "sudo -n curl -sS --max-time 10 --cacert /var/lib/rancher/k3s/server/tls/etcd/server-ca.crt --cert /var/lib/rancher/k3s/server/tls/etcd/client.crt --key /var/lib/rancher/k3s/server/tls/etcd/client.key -X POST -d '{\"linearizable\":false}' https://127.0.0.1:2382/v3/cluster/member/list"
            }
        }
    }

    /// Every command.
    pub const ALL: [K3sCommand; 7] = [
        K3sCommand::Stop,
        K3sCommand::Start,
        K3sCommand::ClusterReset,
        K3sCommand::EtcdSnapshotSave,
        K3sCommand::DropServerUrl,
        K3sCommand::RemoveResetFlag,
        K3sCommand::EtcdMemberList,
    ];
}

/// One VM's SSH identity (its host key) and server.
#[derive(Clone)]
pub struct SshHost {
    key: Arc<PrivateKey>,
}

impl std::fmt::Debug for SshHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshHost")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

impl SshHost {
    /// A fresh ed25519 host key.
    pub fn generate() -> SshHost {
        let seed: [u8; 32] = rand::random();
        SshHost::from_key(PrivateKey::from(Ed25519Keypair::from_seed(&seed)))
    }

    /// A host with a given key (to keep the identity across a simulated reboot).
    pub fn from_key(key: PrivateKey) -> SshHost {
        SshHost { key: Arc::new(key) }
    }

    /// The public host key.
    pub fn public_key(&self) -> &PublicKey {
        self.key.public_key()
    }

    /// `SHA256:<base64 no padding>`, as OpenSSH prints it.
    pub fn fingerprint(&self) -> String {
        self.key
            .public_key()
            .fingerprint(HashAlg::Sha256)
            .to_string()
    }

    /// Serve SSH on `listener` until the task is aborted.
    pub async fn serve(&self, listener: tokio::net::TcpListener, backend: Arc<dyn SshBackend>) {
        let config = Arc::new(server::Config {
            keys: vec![(*self.key).clone()],
            methods: MethodSet::from(&[MethodKind::PublicKey][..]),
            // Constant-time rejection matters on a real host, not here; keep tests quick.
            auth_rejection_time: Duration::from_millis(20),
            auth_rejection_time_initial: Some(Duration::ZERO),
            inactivity_timeout: Some(Duration::from_secs(300)),
            nodelay: true,
            ..Default::default()
        });
        let mut server = SimServer { backend };
        loop {
            // run_on_socket returns only on an accept error (e.g. out of file descriptors);
            // a real sshd keeps going, so do we.
            if let Err(err) = server.run_on_socket(Arc::clone(&config), &listener).await {
                tracing::warn!(error = %err, "ssh accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            } else {
                return;
            }
        }
    }
}

struct SimServer {
    backend: Arc<dyn SshBackend>,
}

impl server::Server for SimServer {
    type Handler = Connection;

    fn new_client(&mut self, _peer: Option<std::net::SocketAddr>) -> Connection {
        Connection {
            backend: Arc::clone(&self.backend),
            uploads: HashMap::new(),
        }
    }

    fn handle_session_error(&mut self, error: russh::Error) {
        tracing::debug!(error = %error, "ssh session ended with an error");
    }
}

/// Per-connection state: uploads in progress, by channel.
struct Connection {
    backend: Arc<dyn SshBackend>,
    uploads: HashMap<ChannelId, Upload>,
}

struct Upload {
    path: String,
    mode: Option<u32>,
    root: bool,
    data: Vec<u8>,
    overflowed: bool,
}

impl Connection {
    fn finish(session: &mut Session, channel: ChannelId, status: u32) -> Result<(), russh::Error> {
        session.exit_status_request(channel, status)?;
        session.eof(channel)?;
        session.close(channel)
    }

    /// A command's stdout, stderr and exit status sent back on `channel`.
    fn reply(
        session: &mut Session,
        channel: ChannelId,
        (status, out, err): (u32, String, String),
    ) -> Result<(), russh::Error> {
        if !out.is_empty() {
            session.data(channel, out.into_bytes())?;
        }
        if !err.is_empty() {
            session.extended_data(channel, 1, err.into_bytes())?;
        }
        Self::finish(session, channel, status)
    }
}

impl server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(if self.backend.authorized(user, offer.public_key) {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(if self.backend.authorized(user, key.public_key) {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }

    async fn channel_open_session(
        &mut self,
        _channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Everything is driven through the handler callbacks; the Channel object is dropped
        // so russh never blocks on forwarding messages to an unread receiver.
        reply.accept().await;
        Ok(())
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_failure(channel)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        _name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_failure(channel)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)?;
        let command = String::from_utf8_lossy(data);
        match parse_command(&command) {
            Command::True => Self::finish(session, channel, 0),
            Command::Hostname => {
                session.data(
                    channel,
                    format!("{}\n", self.backend.hostname()).into_bytes(),
                )?;
                Self::finish(session, channel, 0)
            }
            Command::Cat(path) => match self.backend.read_file(&path) {
                Some(bytes) => {
                    session.data(channel, bytes)?;
                    Self::finish(session, channel, 0)
                }
                None => {
                    session.extended_data(
                        channel,
                        1,
                        format!("cat: {path}: No such file or directory\n").into_bytes(),
                    )?;
                    Self::finish(session, channel, 1)
                }
            },
            Command::MkdirP(path) => {
                if self.backend.make_dir(&path) {
                    Self::finish(session, channel, 0)
                } else {
                    session.extended_data(
                        channel,
                        1,
                        format!("mkdir: cannot create directory '{path}': Permission denied\n")
                            .into_bytes(),
                    )?;
                    Self::finish(session, channel, 1)
                }
            }
            Command::Move { from, to, root } => {
                if self.backend.rename(&from, &to, root) {
                    Self::finish(session, channel, 0)
                } else {
                    session.extended_data(
                        channel,
                        1,
                        format!("mv: cannot move '{from}' to '{to}': Permission denied\n")
                            .into_bytes(),
                    )?;
                    Self::finish(session, channel, 1)
                }
            }
            Command::Upload(path, mode, root) => {
                self.uploads.insert(
                    channel,
                    Upload {
                        path,
                        mode,
                        root,
                        data: Vec::new(),
                        overflowed: false,
                    },
                );
                Ok(())
            }
            Command::K3s(command) => {
                let ran = self.backend.k3s(command).await;
                Self::reply(session, channel, ran)
            }
            Command::K3sSnapshotDelete(name) => {
                let ran = self.backend.k3s_etcd_snapshot_delete(name).await;
                Self::reply(session, channel, ran)
            }
            Command::NotFound(program) => {
                session.extended_data(
                    channel,
                    1,
                    format!("sh: 1: {program}: command not found\n").into_bytes(),
                )?;
                Self::finish(session, channel, 127)
            }
        }
    }

    async fn data(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(upload) = self.uploads.get_mut(&channel) {
            if upload.data.len() + data.len() > MAX_UPLOAD {
                upload.overflowed = true;
                upload.data = Vec::new();
            } else if !upload.overflowed {
                upload.data.extend_from_slice(data);
            }
        }
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(upload) = self.uploads.remove(&channel) else {
            return Ok(());
        };
        if upload.overflowed {
            session.extended_data(
                channel,
                1,
                format!("tee: {}: No space left on device\n", upload.path).into_bytes(),
            )?;
            return Self::finish(session, channel, 1);
        }
        if self
            .backend
            .write_file_as(&upload.path, &upload.data, upload.mode, upload.root)
        {
            Self::finish(session, channel, 0)
        } else {
            session.extended_data(
                channel,
                1,
                format!("tee: {}: Permission denied\n", upload.path).into_bytes(),
            )?;
            Self::finish(session, channel, 1)
        }
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.uploads.remove(&channel);
        Ok(())
    }
}

/// What an exec request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    True,
    Hostname,
    Cat(String),
    /// `mkdir -p PATH`.
    MkdirP(String),
    /// Path, the mode of an `install -m MODE /dev/null PATH && tee PATH` upload, and whether
    /// it ran through `sudo`.
    Upload(String, Option<u32>, bool),
    /// `mv -f FROM TO`, through `sudo` or not.
    Move {
        from: String,
        to: String,
        root: bool,
    },
    /// One of k3s's cluster-reset commands.
    K3s(K3sCommand),
    /// `sudo -n k3s etcd-snapshot delete NAME`.
    K3sSnapshotDelete(String),
    /// Unsupported; carries the program name for the error message.
    NotFound(String),
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    /// An unquoted shell operator: `&&`, `>`, `|`, `;`, `<`, `&`.
    Op(String),
}

/// Split a command line like a POSIX shell would (quotes, backslashes, operators); `None`
/// for unterminated quotes.
fn tokenize(line: &str) -> Option<Vec<Token>> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\' | '$' | '`') => word.push(c),
                            '\n' => {}
                            c => {
                                word.push('\\');
                                word.push(c);
                            }
                        },
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') | None => {}
                    Some(c) => word.push(c),
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    tokens.push(Token::Word(std::mem::take(&mut word)));
                    in_word = false;
                }
            }
            '&' | '|' | ';' | '<' | '>' => {
                if in_word {
                    tokens.push(Token::Word(std::mem::take(&mut word)));
                    in_word = false;
                }
                let mut op = c.to_string();
                if let Some(&next) = chars.peek()
                    && ((c == '&' && next == '&')
                        || (c == '|' && next == '|')
                        || (c == '>' && next == '>'))
                {
                    op.push(next);
                    chars.next();
                }
                tokens.push(Token::Op(op));
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        tokens.push(Token::Word(word));
    }
    Some(tokens)
}

fn parse_command(line: &str) -> Command {
    let not_found = || {
        let program = line.split_whitespace().next().unwrap_or("").to_string();
        Command::NotFound(program)
    };
    let Some(tokens) = tokenize(line) else {
        return not_found();
    };
    for command in K3sCommand::ALL {
        // As a shell reads the line: quoting does not matter, the words do.
        if tokenize(command.line()).is_some_and(|words| tokens == words) {
            return Command::K3s(command);
        }
    }
    if let Some(name) = snapshot_delete_name(&tokens) {
        return Command::K3sSnapshotDelete(name);
    }
    let mut parts = tokens.split(|t| *t == Token::Op("&&".into()));
    let (Some(first), second, None) = (parts.next(), parts.next(), parts.next()) else {
        return not_found();
    };
    let root = first.first() == Some(&Token::Word("sudo".into()));
    let first = strip_sudo(first);
    match second {
        None => match first {
            [
                Token::Word(mv),
                Token::Word(f),
                Token::Word(from),
                Token::Word(to),
            ] if mv == "mv" && f == "-f" => Command::Move {
                from: from.clone(),
                to: to.clone(),
                root,
            },
            [Token::Word(w)] if w == "true" => Command::True,
            [Token::Word(w)] if w == "hostname" => Command::Hostname,
            [Token::Word(cat), Token::Word(path)] if cat == "cat" => Command::Cat(path.clone()),
            [Token::Word(mkdir), Token::Word(p), Token::Word(path)]
                if mkdir == "mkdir" && p == "-p" =>
            {
                Command::MkdirP(path.clone())
            }
            _ => upload_target(first)
                .map(|path| Command::Upload(path, None, root))
                .unwrap_or_else(not_found),
        },
        // `install -m MODE /dev/null PATH && tee PATH > /dev/null`: create with the mode,
        // then fill. The simulator has no modes; only the paths must agree.
        Some(second) => match (first, upload_target(strip_sudo(second))) {
            (
                [
                    Token::Word(install),
                    Token::Word(m),
                    Token::Word(mode),
                    Token::Word(null),
                    Token::Word(path),
                ],
                Some(target),
            ) if install == "install" && m == "-m" && null == "/dev/null" && *path == target => {
                Command::Upload(target, u32::from_str_radix(mode, 8).ok(), root)
            }
            _ => not_found(),
        },
    }
}

/// The NAME of `sudo -n k3s etcd-snapshot delete NAME`: one name, a plain file name (k3s's
/// own check, `validSnapshotName`: not empty, `.` or `..`, no directory part) that is no
/// flag. Several names, flags and paths are not modelled.
fn snapshot_delete_name(tokens: &[Token]) -> Option<String> {
    let words = ["sudo", "-n", "k3s", "etcd-snapshot", "delete"];
    let (head, [Token::Word(name)]) = tokens.split_at_checked(words.len())? else {
        return None;
    };
    let plain =
        !matches!(name.as_str(), "" | "." | "..") && !name.contains('/') && !name.starts_with('-');
    (plain
        && head
            .iter()
            .zip(words)
            .all(|(t, w)| *t == Token::Word(w.into())))
    .then(|| name.clone())
}

/// The path of `tee PATH [> /dev/null]` or `cat > PATH`.
fn upload_target(tokens: &[Token]) -> Option<String> {
    match tokens {
        [Token::Word(tee), Token::Word(path)] if tee == "tee" => Some(path.clone()),
        [
            Token::Word(tee),
            Token::Word(path),
            Token::Op(gt),
            Token::Word(null),
        ] if tee == "tee" && gt == ">" && null == "/dev/null" => Some(path.clone()),
        [Token::Word(cat), Token::Op(gt), Token::Word(path)] if cat == "cat" && gt == ">" => {
            Some(path.clone())
        }
        _ => None,
    }
}

/// Drop a leading `sudo` / `sudo -n` (the simulated user has passwordless sudo).
fn strip_sudo(tokens: &[Token]) -> &[Token] {
    match tokens {
        [Token::Word(sudo), Token::Word(n), rest @ ..] if sudo == "sudo" && n == "-n" => rest,
        [Token::Word(sudo), rest @ ..] if sudo == "sudo" => rest,
        _ => tokens,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_commands_the_product_runs() {
        assert_eq!(parse_command("true"), Command::True);
        assert_eq!(parse_command("hostname"), Command::Hostname);
        for line in [
            "cat /etc/rancher/k3s/k3s.yaml",
            "sudo cat /etc/rancher/k3s/k3s.yaml",
            "sudo -n cat /etc/rancher/k3s/k3s.yaml",
            "sudo -n cat '/etc/rancher/k3s/k3s.yaml'",
        ] {
            assert_eq!(
                parse_command(line),
                Command::Cat("/etc/rancher/k3s/k3s.yaml".into()),
                "{line}"
            );
        }
        assert_eq!(
            parse_command("sudo -n cat '/a b/it'\\''s'"),
            Command::Cat("/a b/it's".into())
        );
        for (line, root) in [
            ("sudo -n tee /opt/x", true),
            ("sudo -n tee /opt/x > /dev/null", true),
            ("cat > /opt/x", false),
        ] {
            assert_eq!(
                parse_command(line),
                Command::Upload("/opt/x".into(), None, root),
                "{line}"
            );
        }
        assert_eq!(
            parse_command(
                "sudo -n install -m 0755 /dev/null /opt/x && sudo -n tee /opt/x > /dev/null"
            ),
            Command::Upload("/opt/x".into(), Some(0o755), true)
        );
        assert_eq!(
            parse_command("install -m 0600 /dev/null /opt/x && tee /opt/x > /dev/null"),
            Command::Upload("/opt/x".into(), Some(0o600), false)
        );
        assert_eq!(
            parse_command("mv -f /h/.ssh/k.new /h/.ssh/k"),
            Command::Move {
                from: "/h/.ssh/k.new".into(),
                to: "/h/.ssh/k".into(),
                root: false
            }
        );
        assert_eq!(
            parse_command("sudo -n systemctl stop k3s"),
            Command::K3s(K3sCommand::Stop)
        );
        assert_eq!(
            parse_command("sudo -n systemctl start k3s"),
            Command::K3s(K3sCommand::Start)
        );
        assert_eq!(
            parse_command("sudo -n k3s server --cluster-reset"),
            Command::K3s(K3sCommand::ClusterReset)
        );
        assert_eq!(
            parse_command("sudo -n k3s etcd-snapshot save"),
            Command::K3s(K3sCommand::EtcdSnapshotSave)
        );
        for line in [
            "sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml",
            "sudo -n sed -i /^server:/d /etc/rancher/k3s/config.yaml",
        ] {
            assert_eq!(
                parse_command(line),
                Command::K3s(K3sCommand::DropServerUrl),
                "{line}"
            );
        }
        assert_eq!(
            parse_command("sudo -n rm -f /var/lib/rancher/k3s/server/db/reset-flag"),
            Command::K3s(K3sCommand::RemoveResetFlag)
        );
        assert_eq!(
            parse_command(K3sCommand::EtcdMemberList.line()),
            Command::K3s(K3sCommand::EtcdMemberList)
        );
        for line in [
            "sudo -n k3s etcd-snapshot delete on-demand-c1-cp-abcde-1795000000",
            "sudo -n k3s etcd-snapshot delete 'on-demand-c1-cp-abcde-1795000000'",
        ] {
            assert_eq!(
                parse_command(line),
                Command::K3sSnapshotDelete("on-demand-c1-cp-abcde-1795000000".into()),
                "{line}"
            );
        }
        for line in ["mkdir -p /opt/a/b", "sudo -n mkdir -p /opt/a/b"] {
            assert_eq!(
                parse_command(line),
                Command::MkdirP("/opt/a/b".into()),
                "{line}"
            );
        }
    }

    #[test]
    fn anything_else_is_not_found() {
        for line in [
            "rm -rf /",
            "cat /a; reboot",
            "cat /a | sh",
            "sudo -n install -m 0600 /dev/null /a && sudo -n tee /b",
            "cat 'unterminated",
            "",
            "true && true && true",
            "systemctl stop k3s",
            "sudo systemctl stop k3s",
            "sudo -n systemctl stop k3s-agent",
            "sudo -n systemctl restart k3s",
            "sudo -n k3s server --cluster-reset --cluster-reset-restore-path=/x",
            "sudo -n k3s server --cluster-reset; reboot",
            "sudo -n k3s etcd-snapshot save --s3",
            "sudo -n k3s etcd-snapshot",
            "sudo -n k3s etcd-snapshot delete",
            "sudo -n k3s etcd-snapshot delete a b",
            "sudo -n k3s etcd-snapshot delete ../../etc/shadow",
            "sudo -n k3s etcd-snapshot delete /var/lib/rancher/k3s/server/db/snapshots/a",
            "sudo -n k3s etcd-snapshot delete ..",
            "sudo -n k3s etcd-snapshot delete --s3",
            "sudo -n k3s etcd-snapshot delete a; reboot",
            "k3s etcd-snapshot delete a",
            "sudo -n sed -i '/^token:/d' /etc/rancher/k3s/config.yaml",
            "sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml.d/x.yaml",
            "sudo -n sed '/^server:/d' /etc/rancher/k3s/config.yaml",
            "sudo -n rm -f /etc/rancher/k3s/config.yaml",
            "sudo -n rm -rf /var/lib/rancher/k3s/server/db",
        ] {
            assert!(
                matches!(parse_command(line), Command::NotFound(_)),
                "{line}"
            );
        }
    }
}
