//! Finding the control plane binary (`kcp`, built from `tests/kube`): `$OXIDE_CONTROLLER_KCP`
//! when set, else `tests/kube/build.sh` builds it (once per test process; the script caches
//! across processes and waits on a lock, so parallel test binaries build it once).

use std::path::PathBuf;
use std::sync::OnceLock;

use super::ControlPlaneError;

/// The variable naming a prebuilt `kcp` binary (skips the build script).
pub const KCP_ENV: &str = "OXIDE_CONTROLLER_KCP";

/// Path of the `kcp` binary, building it if needed. Blocking: call from `spawn_blocking`.
pub fn kcp() -> Result<PathBuf, ControlPlaneError> {
    static KCP: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    KCP.get_or_init(locate)
        .clone()
        .map_err(ControlPlaneError::Binary)
}

fn locate() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(KCP_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{KCP_ENV}={} is not a file; unset it to build the control plane with tests/kube/build.sh",
                path.display()
            ))
        };
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kube/build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}); see its output above",
            script.display(),
            out.status
        ));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} printed {:?}, which is not a file",
            script.display(),
            path.display()
        ))
    }
}
