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

/// The etcd each simulated k3s release bundles, and the binary (`tests/kube/etcd`, real etcd
/// built from the etcd module of that version) the simulator runs for it: `(release, etcd
/// the release bundles, etcd the simulator runs)`. Sources: the product's table
/// (`oxide_controller::domain::upgrade::etcd::K3S_ETCD`) and tests/FIDELITY.md "etcd
/// versions"; where the two etcd columns differ the bundled patch is not on the Go module
/// proxy and the nearest served patch of the same minor that has the same fixes runs instead.
pub const RELEASE_ETCD: &[(&str, &str, &str)] = &[
    ("v1.30.0+k3s1", "v3.5.9", "v3.5.21"),
    ("v1.33.1+k3s1", "v3.5.21", "v3.5.21"),
    ("v1.33.4+k3s1", "v3.5.21", "v3.5.21"),
    ("v1.33.7+k3s3", "v3.5.26", "v3.5.33"),
    ("v1.34.1+k3s1", "v3.6.5", "v3.6.5"),
];

/// The etcd version the simulator runs for k3s `release`: [`RELEASE_ETCD`]'s, else by minor
/// (1.34 and newer: etcd 3.6; a v1.33 release from v1.33.7+k3s3 on: the 3.5 with the
/// zombie-member fix; anything older: v3.5.21), a **guess** for releases no test installs.
pub fn etcd_version_for(release: &str) -> &'static str {
    if let Some((_, _, run)) = RELEASE_ETCD.iter().find(|(r, _, _)| *r == release) {
        return run;
    }
    let parse = |s: &str| -> Option<(u64, u64, u64, u64)> {
        let rest = s.strip_prefix('v')?;
        let (core, build) = rest.split_once("+k3s").unwrap_or((rest, "0"));
        let mut p = core.split('.').map(|x| x.parse::<u64>().ok());
        Some((p.next()??, p.next()??, p.next()??, build.parse().ok()?))
    };
    match parse(release) {
        Some((1, minor, ..)) if minor >= 34 => "v3.6.5",
        Some(v) if v >= (1, 33, 7, 3) => "v3.5.33",
        _ => "v3.5.21",
    }
}

/// The etcd member binary for k3s `release`, building every pinned etcd with
/// `tests/kube/etcd/build.sh` if needed (once per test process; the script caches across
/// processes under `$CARGO_TARGET_DIR/etcd`). Blocking: call from `spawn_blocking`.
pub fn etcd_binary(release: &str) -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(build_etcd).clone()?;
    let bin = dir.join(format!("etcd-{}", etcd_version_for(release)));
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "{} is missing: tests/kube/etcd/build.sh did not build it",
            bin.display()
        ))
    }
}

fn build_etcd() -> Result<PathBuf, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kube/etcd/build.sh");
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
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
