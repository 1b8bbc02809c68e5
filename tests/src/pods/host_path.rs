//! A pod's `hostPath` volumes as the kubelet sets them up, on the simulated Node: the Node's
//! directory is the host directory mirroring the Node VM's disk (`Boot::node_dir`; files k3s
//! writes there later are seen, as through a bind mount).
//!
//! - SetUp (kubernetes `pkg/volume/hostpath/host_path.go` `SetUp`, `checkType`): a path with
//!   `..` is refused; `type` unset checks nothing; `DirectoryOrCreate` makes a missing
//!   directory (0755) and `FileOrCreate` an empty file (0644); then the path must be of its
//!   kind (`Directory`, `File`, `Socket`, `CharDevice`, `BlockDevice`): "hostPath PATH doesn't
//!   exist" or "hostPath type check failed: PATH is not a directory, it's a File"; another
//!   `type` "is an invalid volume type". With `type` unset a missing directory is made too:
//!   the container runtime creates a missing bind-mount source (containerd's CRI; **guess**,
//!   not read in source).
//! - As a local process (no mount namespace) the container cannot see a mount, so every
//!   argument of its `command`/`args` naming a path at or inside a mount's `mountPath` (also as
//!   the value of `--flag=PATH`) is rewritten to the same path under the Node's directory (the
//!   longest `mountPath` wins, as nested mounts do). `readOnly` is not enforced there.
//! - In a runtime bundle the directory is bind-mounted at `mountPath`, read-only when the
//!   mount says `readOnly: true` ([`crate::pods::oci_bundle::container_config`]).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// One of the container's `volumeMounts` whose volume is a `hostPath`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPathMount {
    /// The volume's name.
    pub volume: String,
    /// `hostPath.path`, on the Node.
    pub path: String,
    /// `hostPath.type` ("" when unset).
    pub kind: String,
    /// Where the container sees it.
    pub mount_path: String,
    pub read_only: bool,
}

/// The `hostPath` mounts of `container` in pod spec `spec`.
pub fn host_path_mounts(spec: &Value, container: &Value) -> Vec<HostPathMount> {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let volume = spec["volumes"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == m["name"] && v["hostPath"].is_object())?;
            Some(HostPathMount {
                volume: m["name"].as_str()?.to_owned(),
                path: volume["hostPath"]["path"].as_str()?.to_owned(),
                kind: volume["hostPath"]["type"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                mount_path: m["mountPath"].as_str()?.to_owned(),
                read_only: m["readOnly"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}

/// The kubelet's SetUp of `mount` whose path is `host` on this machine (the Node's file):
/// creates what `type` says to create, checks the kind. Errors in the kubelet's words, with
/// the Node's path.
pub fn set_up(mount: &HostPathMount, host: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, OpenOptionsExt as _};
    let path = &mount.path;
    if path.split('/').any(|c| c == "..") {
        return Err(format!("invalid HostPath `{path}`: must not contain '..'"));
    }
    let kind = mount.kind.as_str();
    match kind {
        "" | "DirectoryOrCreate" if !host.exists() => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(host)
                .map_err(|e| format!("mkdir {path}: {e}"))?;
        }
        "FileOrCreate" if !host.exists() => {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(host)
                .map_err(|e| format!("open {path}: {e}"))?;
        }
        _ => {}
    }
    let (expected, description) = match kind {
        "" => return Ok(()),
        "DirectoryOrCreate" | "Directory" => ("Directory", "directory"),
        "FileOrCreate" | "File" => ("File", "file"),
        "Socket" => ("Socket", "socket file"),
        "CharDevice" => ("CharDevice", "character device"),
        "BlockDevice" => ("BlockDevice", "block device"),
        other => return Err(format!("{other} is an invalid volume type")),
    };
    let Ok(meta) = std::fs::metadata(host) else {
        return Err(format!("hostPath {path} doesn't exist"));
    };
    let t = meta.file_type();
    let actual = if t.is_dir() {
        "Directory"
    } else if t.is_file() {
        "File"
    } else if t.is_socket() {
        "Socket"
    } else if t.is_char_device() {
        "CharDevice"
    } else if t.is_block_device() {
        "BlockDevice"
    } else {
        return Err(format!(
            "hostPath type check failed, {path} is not a {description}, unable to determine its type"
        ));
    };
    if actual != expected {
        return Err(format!(
            "hostPath type check failed: {path} is not a {description}, it's a {actual}"
        ));
    }
    Ok(())
}

/// `arg` with a path at or inside one of `mounts`' `mountPath` (the whole argument, or the
/// value of `--flag=PATH`) rewritten to that path under the mount's host directory.
pub fn map_arg(arg: &str, mounts: &[(PathBuf, HostPathMount)]) -> String {
    if let Some(mapped) = map_path(arg, mounts) {
        return mapped;
    }
    if arg.starts_with('-')
        && let Some((flag, value)) = arg.split_once('=')
        && let Some(mapped) = map_path(value, mounts)
    {
        return format!("{flag}={mapped}");
    }
    arg.to_owned()
}

fn map_path(path: &str, mounts: &[(PathBuf, HostPathMount)]) -> Option<String> {
    mounts
        .iter()
        .filter_map(|(host, m)| {
            let mount = m.mount_path.trim_end_matches('/');
            let rest = path.strip_prefix(mount)?;
            if !(rest.is_empty() || rest.starts_with('/')) || mount.is_empty() {
                return None;
            }
            let rest = rest.trim_start_matches('/');
            let mapped = if rest.is_empty() {
                host.clone()
            } else {
                host.join(rest)
            };
            Some((mount.len(), mapped.display().to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SNAPSHOTS: &str = "/var/lib/rancher/k3s/server/db/snapshots";

    fn mount(path: &str, kind: &str, mount_path: &str) -> HostPathMount {
        HostPathMount {
            volume: "v".into(),
            path: path.into(),
            kind: kind.into(),
            mount_path: mount_path.into(),
            read_only: true,
        }
    }

    #[test]
    fn the_containers_hostpath_mounts_are_found_with_type_and_read_only() {
        let spec = json!({"volumes": [
            {"name": "snapshots", "hostPath": {"path": SNAPSHOTS, "type": "DirectoryOrCreate"}},
            {"name": "token", "secret": {"secretName": "s"}},
            {"name": "scratch", "hostPath": {"path": "/tmp/x"}},
        ]});
        let container = json!({"volumeMounts": [
            {"name": "snapshots", "mountPath": SNAPSHOTS, "readOnly": true},
            {"name": "token", "mountPath": "/etc/token"},
            {"name": "scratch", "mountPath": "/scratch"},
        ]});
        assert_eq!(
            host_path_mounts(&spec, &container),
            vec![
                HostPathMount {
                    volume: "snapshots".into(),
                    path: SNAPSHOTS.into(),
                    kind: "DirectoryOrCreate".into(),
                    mount_path: SNAPSHOTS.into(),
                    read_only: true,
                },
                HostPathMount {
                    volume: "scratch".into(),
                    path: "/tmp/x".into(),
                    kind: String::new(),
                    mount_path: "/scratch".into(),
                    read_only: false,
                },
            ]
        );
    }

    #[test]
    fn arguments_inside_a_mount_path_map_to_the_nodes_directory() {
        let node = PathBuf::from("/sim/vm-1/var/lib/rancher/k3s/server/db/snapshots");
        let mounts = [
            (node.clone(), mount(SNAPSHOTS, "Directory", SNAPSHOTS)),
            (PathBuf::from("/sim/vm-1/data"), mount("/data", "", "/mnt/")),
            (
                PathBuf::from("/sim/vm-1/other"),
                mount("/other", "", "/mnt/sub"),
            ),
        ];
        let map = |a: &str| map_arg(a, &mounts);
        assert_eq!(map(SNAPSHOTS), node.display().to_string());
        assert_eq!(
            map(&format!("{SNAPSHOTS}/etcd-snapshot-n-1")),
            node.join("etcd-snapshot-n-1").display().to_string()
        );
        assert_eq!(
            map(&format!("--snapshot-dir={SNAPSHOTS}")),
            format!("--snapshot-dir={}", node.display())
        );
        assert_eq!(map("/mnt/a/b"), "/sim/vm-1/data/a/b");
        // The longer mountPath wins.
        assert_eq!(map("/mnt/sub/c"), "/sim/vm-1/other/c");
        for untouched in [
            "backup",
            "--snapshot-dir",
            "/var/lib/rancher/k3s/server/db/snapshotsx",
            "/mntx",
            "snapshots=/mnt/a",
        ] {
            assert_eq!(map(untouched), untouched);
        }
    }

    #[test]
    fn set_up_creates_or_checks_as_the_type_says() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("a/b");
        // Directory: must exist, as a directory.
        let err = set_up(&mount(SNAPSHOTS, "Directory", SNAPSHOTS), &missing).unwrap_err();
        assert_eq!(err, format!("hostPath {SNAPSHOTS} doesn't exist"));
        assert!(!missing.exists());
        // DirectoryOrCreate: made (0755), then fine.
        set_up(&mount(SNAPSHOTS, "DirectoryOrCreate", SNAPSHOTS), &missing).unwrap();
        assert!(missing.is_dir());
        set_up(&mount(SNAPSHOTS, "Directory", SNAPSHOTS), &missing).unwrap();
        // A directory is not a file.
        let err = set_up(&mount(SNAPSHOTS, "File", SNAPSHOTS), &missing).unwrap_err();
        assert_eq!(
            err,
            format!("hostPath type check failed: {SNAPSHOTS} is not a file, it's a Directory")
        );
        // FileOrCreate: an empty file.
        let file = missing.join("f");
        set_up(&mount("/f", "FileOrCreate", "/f"), &file).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"");
        let err = set_up(&mount("/f", "Directory", "/f"), &file).unwrap_err();
        assert_eq!(
            err,
            "hostPath type check failed: /f is not a directory, it's a File"
        );
        // Unset: nothing checked; a missing directory is made for the bind mount.
        let unset = root.path().join("c");
        set_up(&mount("/c", "", "/c"), &unset).unwrap();
        assert!(unset.is_dir());
        assert_eq!(
            set_up(&mount("/c", "Folder", "/c"), &unset).unwrap_err(),
            "Folder is an invalid volume type"
        );
        assert!(set_up(&mount("/a/../etc", "", "/c"), &unset).is_err());
    }
}
