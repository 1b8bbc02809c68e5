//! The product's SSH client (`oxide_controller::adapters::ssh`) against the simulator's SSH server
//! (`oxide_sim::guest::sshd`) over loopback: host key pinning, authentication, file reads and
//! uploads, limits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxide_controller::adapters::ssh::{
    HostKeyPins, SshError, SshKeyPair, SshTarget, generate_ed25519,
};
use oxide_sim::guest::sshd::{SshBackend, SshHost};
use russh::keys::PublicKey;

const KUBECONFIG: &str = "/etc/rancher/k3s/k3s.yaml";
const KUBECONFIG_BODY: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: default\n";

/// A VM as far as SSH sees it: one login with its authorized keys, and some files.
struct Vm {
    user: String,
    authorized: Vec<PublicKey>,
    files: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl SshBackend for Vm {
    fn authorized(&self, user: &str, key: &PublicKey) -> bool {
        user == self.user
            && self
                .authorized
                .iter()
                .any(|k| k.key_data() == key.key_data())
    }
    fn read_file(&self, path: &str) -> Option<Vec<u8>> {
        self.files.lock().ok()?.get(path).cloned()
    }
    fn write_file(&self, path: &str, data: &[u8]) -> bool {
        self.files
            .lock()
            .map(|mut f| f.insert(path.to_string(), data.to_vec()))
            .is_ok()
    }
    fn hostname(&self) -> String {
        "demo-cp-abcde".into()
    }
}

struct Running {
    host: SshHost,
    addr: SocketAddr,
    vm: Arc<Vm>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start_vm(client: &SshKeyPair) -> Running {
    let vm = Arc::new(Vm {
        user: "oxide".into(),
        authorized: vec![client.public_key().clone()],
        files: Mutex::new(BTreeMap::from([(
            KUBECONFIG.to_string(),
            KUBECONFIG_BODY.as_bytes().to_vec(),
        )])),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let host = SshHost::generate();
    let serving = host.clone();
    let backend: Arc<dyn SshBackend> = vm.clone();
    let task = tokio::spawn(async move { serving.serve(listener, backend).await });
    Running {
        host,
        addr,
        vm,
        task,
    }
}

fn target(running: &Running, key: &SshKeyPair, pins: HostKeyPins) -> SshTarget {
    let mut t = SshTarget::new(running.addr, "oxide", key.clone(), pins);
    t.connect_timeout = Duration::from_secs(10);
    t.command_timeout = Duration::from_secs(10);
    t
}

fn pinned(running: &Running) -> HostKeyPins {
    HostKeyPins::new([running.host.fingerprint()]).unwrap()
}

#[tokio::test]
async fn right_pin_reads_the_kubeconfig() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    let body = target(&vm, &key, pinned(&vm))
        .read_file(KUBECONFIG)
        .await
        .unwrap();
    assert_eq!(body, KUBECONFIG_BODY.as_bytes());
}

#[tokio::test]
async fn wrong_pin_is_refused_with_a_host_key_mismatch_that_says_what_to_do() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    let other = SshHost::generate().fingerprint();
    let err = target(&vm, &key, HostKeyPins::new([&other]).unwrap())
        .read_file(KUBECONFIG)
        .await
        .unwrap_err();
    match &err {
        SshError::HostKeyMismatch {
            addr,
            presented,
            expected,
        } => {
            assert_eq!(*addr, vm.addr);
            assert_eq!(*presented, vm.host.fingerprint());
            assert_eq!(*expected, vec![other.clone()]);
        }
        other => panic!("expected HostKeyMismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("serial console") && msg.contains("rebuilt"),
        "{msg}"
    );
}

#[tokio::test]
async fn no_pins_means_no_connection() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    let err = target(&vm, &key, HostKeyPins::default())
        .exec("true")
        .await
        .unwrap_err();
    assert!(matches!(err, SshError::NoPins { .. }), "{err:?}");
}

#[tokio::test]
async fn unauthorized_client_key_is_rejected() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    let stranger = generate_ed25519();
    let err = target(&vm, &stranger, pinned(&vm))
        .read_file(KUBECONFIG)
        .await
        .unwrap_err();
    match &err {
        SshError::AuthRejected {
            user,
            key_fingerprint,
            ..
        } => {
            assert_eq!(user, "oxide");
            assert_eq!(*key_fingerprint, stranger.fingerprint());
        }
        other => panic!("expected AuthRejected, got {other:?}"),
    }
}

#[tokio::test]
async fn pins_parsed_from_the_console_block_work() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    // cloud-init's `write-ssh-key-fingerprints` lines, through `logger -s -t cloud-init`.
    let logged = |m: &str| format!("<14>Nov  2 20:13:34 cloud-init: {m}\n");
    let console = format!(
        "[    2.000000] systemd[1]: Starting cloud-init...\n{}{}{}Cloud-init v. 24.1 finished\n",
        logged("-----BEGIN SSH HOST KEY FINGERPRINTS-----"),
        logged(&format!(
            "256 {} root@demo-cp-abcde (ED25519)",
            vm.host.fingerprint()
        )),
        logged("-----END SSH HOST KEY FINGERPRINTS-----"),
    );
    let pins = HostKeyPins::from_console(&console).unwrap();
    let out = target(&vm, &key, pins).exec("hostname").await.unwrap();
    assert_eq!(out.exit_status, 0);
    assert_eq!(out.stdout, b"demo-cp-abcde\n");
}

#[tokio::test]
async fn missing_file_is_a_read_error_with_stderr() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    let err = target(&vm, &key, pinned(&vm))
        .read_file("/var/lib/rancher/k3s/server/node-token")
        .await
        .unwrap_err();
    match &err {
        SshError::ReadFile {
            exit_status,
            stderr,
            ..
        } => {
            assert_eq!(*exit_status, 1);
            assert!(stderr.contains("No such file or directory"), "{stderr}");
        }
        other => panic!("expected ReadFile, got {other:?}"),
    }
}

#[tokio::test]
async fn unknown_command_exits_127() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    let out = target(&vm, &key, pinned(&vm)).exec("reboot").await.unwrap();
    assert_eq!(out.exit_status, 127);
    assert!(String::from_utf8_lossy(&out.stderr).contains("command not found"));
}

#[tokio::test]
async fn upload_writes_the_file_through_the_backend() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    // Larger than one SSH packet and one channel window, to exercise flow control.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let t = target(&vm, &key, pinned(&vm));
    t.upload("/opt/images/dev image.raw", &data, 0o600)
        .await
        .unwrap();
    assert_eq!(
        vm.vm.read_file("/opt/images/dev image.raw").as_deref(),
        Some(&data[..])
    );
    // And it reads back through `sudo -n cat` with a quoted path.
    assert_eq!(
        t.read_file("/opt/images/dev image.raw").await.unwrap(),
        data
    );
}

#[tokio::test]
async fn output_beyond_the_limit_is_an_error_not_a_truncation() {
    let key = generate_ed25519();
    let vm = start_vm(&key).await;
    let mut t = target(&vm, &key, pinned(&vm));
    t.max_output = 16;
    let err = t.read_file(KUBECONFIG).await.unwrap_err();
    assert!(
        matches!(err, SshError::OutputTooLarge { limit: 16, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accept and hold the socket without ever sending an SSH banner.
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let key = generate_ed25519();
    let pins = HostKeyPins::new([SshHost::generate().fingerprint()]).unwrap();
    let mut t = SshTarget::new(addr, "oxide", key, pins);
    t.connect_timeout = Duration::from_millis(300);
    let err = t.exec("true").await.unwrap_err();
    task.abort();
    assert!(matches!(err, SshError::ConnectTimeout { .. }), "{err:?}");
}
