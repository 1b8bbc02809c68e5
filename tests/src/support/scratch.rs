//! Scratch directories under the system temp directory that belong to this process:
//! `<prefix><pid>-<random>`. A process that is killed (SIGKILL, a crashed test) never runs
//! the destructor that removes its directories, and a control plane's etcd data or a VM's
//! uploaded binaries are hundreds of MB each; so the first directory a process makes with a
//! prefix also removes that prefix's directories whose process is gone.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

/// Prefixes already swept by this process.
static SWEPT: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

/// A new directory `<temp>/<prefix><pid>-XXXXXX`, removed when the returned value drops.
pub fn tempdir(prefix: &'static str) -> std::io::Result<tempfile::TempDir> {
    let temp = std::env::temp_dir();
    let first = SWEPT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(prefix);
    if first {
        sweep(&temp, prefix);
    }
    tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir_in(&temp)
}

/// Removes `<dir>/<prefix><pid>-*` whose process no longer runs. Directories of other
/// shapes (older names, someone else's) are left alone.
fn sweep(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !alive(pid) {
            let path = entry.path();
            if let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::debug!(path = %path.display(), error = %err, "cannot remove a stale scratch directory");
            }
        }
    }
}

fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_dead_processes_go_and_live_ones_stay() {
        let root = tempfile::tempdir().unwrap();
        // pid 1 always runs; a pid above the kernel's maximum never does.
        let live = root.path().join("scratch-test-1-abc");
        let dead = root.path().join("scratch-test-4194305-abc");
        let other = root.path().join("scratch-test-xyz");
        for d in [&live, &dead, &other] {
            std::fs::create_dir_all(d.join("etcd")).unwrap();
        }
        sweep(root.path(), "scratch-test-");
        assert!(live.exists());
        assert!(!dead.exists());
        assert!(other.exists(), "not ours to judge");
        let mine = tempdir("scratch-test-own-").unwrap();
        let name = mine
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            name.starts_with(&format!("scratch-test-own-{}-", std::process::id())),
            "{name}"
        );
    }
}
