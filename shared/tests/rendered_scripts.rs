//! The shell scripts the user-data installs, run for real with `sh` against stub commands on
//! `PATH` and a fake sysfs/etc tree. The absolute paths a script touches (`/sys/block`,
//! `/dev`, `/etc/fstab`, `/etc/ssh`, `/dev/console`) are moved under a temporary root by plain
//! text substitution; nothing else in the script changes. `.ci/run` runs shellcheck on the
//! same scripts (from the snapshots).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oxide_controller::cloud_init::{
    DATA_DISK_SCRIPT_PATH, DataDisk, HOST_KEYS_SCRIPT_PATH, K3sRole, NodeUserData, ProviderId,
    render,
};
use oxide_controller::spec::K3sInstall;
use oxide_controller::ssh::HostKeyPins;

fn agent_with_disk() -> NodeUserData {
    NodeUserData {
        hostname: "demo-workers-abcde".into(),
        role: K3sRole::Agent {
            server_url: "https://172.30.0.10:6443".into(),
            agent_token: "agent-token-example".into(),
        },
        node_labels: Default::default(),
        node_taints: vec![],
        provider_id: ProviderId::None,
        external_cloud_provider: false,
        kubelet_args: vec![],
        k3s_version: "v1.33.4+k3s1".into(),
        install: K3sInstall::Script,
        ssh_user: "ubuntu".into(),
        authorized_keys: vec![
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb1M0Y4hl6YqVnZ8vQm7oFzX3xK1p4tq9w2nqkqzJ0A x"
                .into(),
        ],
        data_disk: Some(DataDisk::for_disk_name("data-demo-workers-abcde")),
        tailscale: None,
    }
}

/// The content of `path` in the rendered user-data's `write_files`, and the runcmd argv
/// that runs it (if any).
fn script(input: &NodeUserData, path: &str) -> (String, Option<Vec<String>>) {
    let rendered = render(input).unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&rendered).unwrap();
    let content = doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .and_then(|f| f["content"].as_str())
        .unwrap_or_else(|| panic!("{path} is not in write_files"))
        .to_owned();
    let argv = doc["runcmd"].as_array().unwrap().iter().find_map(|c| {
        let argv: Vec<String> = c
            .as_array()?
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        (argv.first().map(String::as_str) == Some(path)).then_some(argv)
    });
    (content, argv)
}

/// A scratch root with a `bin/` of stubs that log their argv to `calls`.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let s = Sandbox {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in ["bin", "sys/block", "dev", "etc/ssh"] {
            std::fs::create_dir_all(s.root().join(d)).unwrap();
        }
        std::fs::write(s.root().join("etc/fstab"), "").unwrap();
        s
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    /// A stub command: logs `name args…` to `calls`, then runs `body`.
    fn stub(&self, name: &str, body: &str) {
        let path = self.root().join("bin").join(name);
        let calls = self.root().join("calls");
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"{name} $*\" >> '{}'\n{body}\n",
                calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    fn nvme(&self, dev: &str, serial: &str) {
        let d = self.root().join("sys/block").join(dev).join("device");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("serial"), format!("{serial}\n")).unwrap();
        std::fs::write(self.root().join("dev").join(dev), "").unwrap();
    }
    /// Runs `script` (paths moved under the root) with `args`, stubs first on PATH.
    fn run(&self, script: &str, args: &[String]) -> Output {
        let r = self.root().display().to_string();
        let moved = script
            .replace("/sys/block/", &format!("{r}/sys/block/"))
            .replace("\"/dev/", &format!("\"{r}/dev/"))
            .replace("/dev/console", &format!("{r}/console"))
            .replace("/etc/fstab", &format!("{r}/etc/fstab"))
            .replace("/etc/ssh/", &format!("{r}/etc/ssh/"));
        let file = self.root().join("script.sh");
        std::fs::write(&file, moved).unwrap();
        let path = format!(
            "{}:{}",
            self.root().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new("sh")
            .arg(&file)
            .args(args)
            .env("PATH", path)
            .output()
            .unwrap()
    }
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.root().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().next().unwrap_or("").to_owned())
            .collect()
    }
    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root().join(rel)).unwrap_or_default()
    }
}

fn path_of(p: PathBuf) -> String {
    p.display().to_string()
}

/// Stubs for the data-disk script: `blkid` finds a filesystem only after `mkfs.ext4` ran.
fn disk_stubs(s: &Sandbox) {
    let made = path_of(s.root().join("made-fs"));
    s.stub(
        "blkid",
        &format!(
            "[ -e '{made}' ] || exit 2\ncase \"$*\" in *UUID*) echo 0b6c5a8e-2f4d-4c59-9a43-3f1f2e0c9d11;; esac\nexit 0"
        ),
    );
    s.stub("mkfs.ext4", &format!("touch '{made}'"));
    // The mount point (/var/lib/rancher) is the real one in the fstab line; not created here.
    s.stub("mkdir", "exit 0");
    s.stub("mountpoint", "exit 1");
    s.stub("mount", "exit 0");
    s.stub("sleep", "exit 0");
}

#[test]
fn the_data_disk_script_formats_once_and_orders_the_mount_before_k3s() {
    let input = agent_with_disk();
    let (script, argv) = script(&input, DATA_DISK_SCRIPT_PATH);
    let args = argv.expect("runcmd runs the data disk script")[1..].to_vec();
    assert_eq!(args[2], "k3s-agent.service");
    let s = Sandbox::new();
    disk_stubs(&s);
    s.nvme("nvme0n1", "boot-demo-workers-ab");
    s.nvme("nvme1n1", "data-demo-workers-ab");

    let out = s.run(&script, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        s.calls(),
        [
            "blkid",
            "mkfs.ext4",
            "blkid",
            "mkdir",
            "mountpoint",
            "mount"
        ],
        "format, then mount"
    );
    let fstab = s.read("etc/fstab");
    assert_eq!(
        fstab,
        "UUID=0b6c5a8e-2f4d-4c59-9a43-3f1f2e0c9d11 /var/lib/rancher ext4 defaults,nofail,x-systemd.before=k3s-agent.service,x-systemd.required-by=k3s-agent.service 0 2\n"
    );
    assert!(
        s.read("calls").contains("nvme1n1"),
        "the data disk, not the boot disk"
    );

    // A second run (or a reboot) keeps the filesystem and the one fstab line.
    std::fs::remove_file(s.root().join("calls")).unwrap();
    let out = s.run(&script, &args);
    assert!(out.status.success());
    assert!(!s.calls().contains(&"mkfs.ext4".to_owned()));
    assert_eq!(s.read("etc/fstab").lines().count(), 1);
}

#[test]
fn a_missing_data_disk_stops_the_script_before_anything_is_formatted_or_mounted() {
    let input = agent_with_disk();
    let (script, argv) = script(&input, DATA_DISK_SCRIPT_PATH);
    let s = Sandbox::new();
    disk_stubs(&s);
    s.nvme("nvme0n1", "boot-demo-workers-ab");
    let out = s.run(&script, &argv.unwrap()[1..]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no NVMe disk with serial data-demo-workers-ab")
    );
    let calls = s.calls();
    assert!(calls.iter().all(|c| c == "sleep"), "{calls:?}");
    assert_eq!(s.read("etc/fstab"), "");
}

#[test]
fn the_per_boot_script_prints_fingerprints_bootstrap_can_read() {
    let (script, _) = script(&agent_with_disk(), HOST_KEYS_SCRIPT_PATH);
    let s = Sandbox::new();
    const FP_ED: &str = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU";
    const FP_RSA: &str = "SHA256:PiPoFgA5WUoziU9lZOGxNIu9egCI1CxKy3PurtWcAJ0";
    std::fs::write(
        s.root().join("etc/ssh/ssh_host_ed25519_key.pub"),
        "ssh-ed25519 AAAA root@x\n",
    )
    .unwrap();
    std::fs::write(
        s.root().join("etc/ssh/ssh_host_rsa_key.pub"),
        "ssh-rsa AAAA root@x\n",
    )
    .unwrap();
    s.stub(
        "ssh-keygen",
        &format!(
            "case \"$3\" in *ed25519*) echo \"256 {FP_ED} root@x (ED25519)\";; *) echo \"3072 {FP_RSA} root@x (RSA)\";; esac"
        ),
    );
    // util-linux logger -s: each stdin line to stderr as `<14>Mon DD HH:MM:SS TAG: line`.
    s.stub(
        "logger",
        "tag=logger\nwhile [ $# -gt 0 ]; do [ \"$1\" = -t ] && tag=\"$2\"; shift; done\nwhile IFS= read -r l; do printf '<14>Nov  2 20:13:34 %s: %s\\n' \"$tag\" \"$l\" >&2; done",
    );
    let out = s.run(&script, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let console = s.read("console");
    assert!(
        console.contains("oxide-controller: -----BEGIN SSH HOST KEY FINGERPRINTS-----"),
        "{console}"
    );
    let pins = HostKeyPins::from_console(&console).unwrap();
    assert_eq!(pins.fingerprints().collect::<Vec<_>>(), [FP_ED, FP_RSA]);
    // The two ends of the pipe run concurrently: compare without order.
    let mut calls = s.calls();
    calls.sort();
    assert_eq!(calls, ["logger", "ssh-keygen", "ssh-keygen"]);
}
