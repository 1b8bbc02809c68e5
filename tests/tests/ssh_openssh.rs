//! Interop: the product's SSH client against a real OpenSSH `sshd` on loopback.
//!
//! Runs only when `OXIDE_CONTROLLER_SSHD` names the sshd binary (CI sets it, e.g.
//! `/usr/sbin/sshd`); otherwise each test prints why it skipped and passes. Host keys are made
//! by `ssh-keygen`, and the pins are parsed from `ssh-keygen -l` output, which is the same
//! line cloud-init prints on the console — so this also checks our fingerprint format
//! against OpenSSH's own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oxide_controller::adapters::ssh::{
    HostKeyPins, SshError, SshKeyPair, SshTarget, generate_ed25519,
};

const SKIP: &str = "skipped: set OXIDE_CONTROLLER_SSHD=/usr/sbin/sshd to run";

/// A running sshd; killed on drop.
struct Sshd {
    child: Child,
    addr: SocketAddr,
    user: String,
    dir: tempfile::TempDir,
    /// `ssh-keygen -lf` output for the host key: `256 SHA256:… comment (ED25519)`.
    host_fingerprint_line: String,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // sshd forks a child per connection; it runs in its own process group (see
        // start_sshd), so signal the whole group, then reap the listener.
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    fn target(&self, key: &SshKeyPair, pins: HostKeyPins) -> SshTarget {
        let mut t = SshTarget::new(self.addr, self.user.clone(), key.clone(), pins);
        t.connect_timeout = Duration::from_secs(10);
        t.command_timeout = Duration::from_secs(10);
        t
    }

    fn console_pins(&self) -> HostKeyPins {
        let console = format!(
            "<14>Nov  2 20:13:34 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n\
             <14>Nov  2 20:13:34 cloud-init: {}\n\
             <14>Nov  2 20:13:34 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----\n",
            self.host_fingerprint_line.trim()
        );
        HostKeyPins::from_console(&console).unwrap()
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ssh_keygen(sshd: &Path) -> PathBuf {
    // ssh-keygen usually lives in /usr/bin next to /usr/sbin/sshd's package; try a sibling
    // first, then PATH.
    let sibling = sshd.with_file_name("ssh-keygen");
    if sibling.exists() {
        sibling
    } else {
        PathBuf::from("ssh-keygen")
    }
}

/// Start sshd with one authorized client key, or None when the env var is unset.
fn start_sshd(client: &SshKeyPair) -> Option<Sshd> {
    let Some(sshd) = std::env::var_os("OXIDE_CONTROLLER_SSHD") else {
        println!("{SKIP}");
        return None;
    };
    // sshd re-executes itself and insists on an absolute path.
    let sshd = std::fs::canonicalize(PathBuf::from(&sshd))
        .unwrap_or_else(|e| panic!("OXIDE_CONTROLLER_SSHD={sshd:?}: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);

    let keygen = ssh_keygen(&sshd);
    run(Command::new(&keygen)
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "root@sshd-interop",
            "-f",
        ])
        .arg(p("host_ed25519")));
    let host_fingerprint_line = run(Command::new(&keygen).arg("-lf").arg(p("host_ed25519.pub")));

    std::fs::write(
        p("authorized_keys"),
        format!("{}\n", client.authorized_key_line("client").unwrap()),
    )
    .unwrap();

    let user = run(Command::new("id").arg("-un")).trim().to_string();
    if user == "root" {
        // Privilege separation directory; sshd refuses to start without it when root.
        let _ = std::fs::create_dir_all("/run/sshd");
    }

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nAuthorizedKeysFile {ak}\nPidFile {pid}\n\
         StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
         PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nLogLevel VERBOSE\n",
        host = p("host_ed25519").display(),
        ak = p("authorized_keys").display(),
        pid = p("sshd.pid").display(),
    );
    std::fs::File::create(p("sshd_config"))
        .unwrap()
        .write_all(config.as_bytes())
        .unwrap();

    let log = std::fs::File::create(p("sshd.log")).unwrap();
    let child = Command::new(&sshd)
        .args(["-D", "-e", "-f"])
        .arg(p("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", sshd.display()));
    let mut running = Sshd {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        user,
        dir,
        host_fingerprint_line,
    };

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::net::TcpStream::connect(running.addr).is_ok() {
            return Some(running);
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            panic!("sshd exited with {status}:\n{}", running.log());
        }
        assert!(
            Instant::now() < deadline,
            "sshd did not listen within 10s:\n{}",
            running.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn right_pin_reads_a_file_from_openssh() {
    let key = generate_ed25519();
    let Some(sshd) = start_sshd(&key) else { return };
    let file = sshd.dir.path().join("k3s.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: Config\n").unwrap();

    let t = sshd.target(&key, sshd.console_pins());
    let out = t
        .exec(&format!(
            "cat {}",
            oxide_controller::adapters::ssh::shell_quote(&file.display().to_string())
        ))
        .await
        .unwrap_or_else(|e| panic!("{e:#?}\n{}", sshd.log()));
    assert_eq!(
        out.exit_status,
        0,
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"apiVersion: v1\nkind: Config\n");

    // stdin reaches the remote command and the exit status comes back.
    let upload = sshd.dir.path().join("uploaded");
    let cmd = format!("cat > {}", upload.display());
    let out = t.exec_with_stdin(&cmd, b"payload").await.unwrap();
    assert_eq!(out.exit_status, 0);
    assert_eq!(std::fs::read(&upload).unwrap(), b"payload");
    assert_eq!(t.exec("exit 3").await.unwrap().exit_status, 3);
}

#[tokio::test]
async fn wrong_pin_is_refused_by_the_client_before_authenticating() {
    let key = generate_ed25519();
    let Some(sshd) = start_sshd(&key) else { return };
    let wrong = HostKeyPins::new([generate_ed25519().fingerprint()]).unwrap();
    let err = sshd.target(&key, wrong).exec("true").await.unwrap_err();
    let expected_presented = sshd
        .console_pins()
        .fingerprints()
        .next()
        .unwrap_or_default()
        .to_string();
    match err {
        SshError::HostKeyMismatch { presented, .. } => assert_eq!(presented, expected_presented),
        other => panic!("expected HostKeyMismatch, got {other:?}\n{}", sshd.log()),
    }
    assert!(!sshd.log().contains("Accepted publickey"), "{}", sshd.log());
}

#[tokio::test]
async fn openssh_rejects_a_key_that_is_not_authorized() {
    let key = generate_ed25519();
    let Some(sshd) = start_sshd(&key) else { return };
    let stranger = generate_ed25519();
    let err = sshd
        .target(&stranger, sshd.console_pins())
        .exec("true")
        .await
        .unwrap_err();
    assert!(
        matches!(err, SshError::AuthRejected { .. }),
        "{err:?}\n{}",
        sshd.log()
    );
}
