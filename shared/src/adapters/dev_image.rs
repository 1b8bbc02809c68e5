//! `--controller-image dev:<path>[:<os>/<arch>]`: run the in-cluster controller from binaries
//! built on this machine instead of a published image, for trying changes without a registry.
//!
//! This module owns the flag's grammar ([`DevImage::parse`]), the checks bootstrap makes
//! before any Oxide API call (the platform is one this machine builds for; the path is a cargo
//! workspace with the `bootstrap`, `reconcile-once` and `scale` binaries), the build itself
//! (`cargo build --locked --bins -p bootstrap -p reconcile-once -p scale`, binaries located
//! through cargo's JSON messages, so any target directory or profile works), and copying the
//! result to a VM over SSH into a directory named by the build's hash ([`install`]).
//!
//! Not here: which VMs get the binaries and the Node labels (the bootstrap workflow), and how
//! the manifests run them ([`crate::render::manifests::run_from_node`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use sha2::{Digest, Sha256};

use crate::adapters::ssh::{RemoteShell, SshError, shell_quote};

/// Prefix of the flag value that selects a dev build.
pub const PREFIX: &str = "dev:";
/// The binaries built and copied, by cargo package = binary name.
pub const BINARIES: [&str; 3] = ["bootstrap", "reconcile-once", "scale"];
/// Parent of the per-build directories on the control-plane VMs.
pub const REMOTE_ROOT: &str = "/var/lib/oxide-controller/bin";
/// The checksum file written last into a build's directory (`sha256sum` format); its presence
/// with the right content means the directory is complete.
pub const SUMS_FILE: &str = "SHA256SUMS";
/// The cargo profile bootstrap builds with unless told otherwise.
pub const DEFAULT_PROFILE: &str = "release";

/// Why a dev image cannot be used. Every message names the flag.
#[derive(Debug, thiserror::Error)]
pub enum DevImageError {
    #[error("--controller-image: {0}")]
    Malformed(String),
    #[error("--controller-image: unknown platform {0:?} (expected <os>/<arch>, e.g. linux/amd64)")]
    UnknownPlatform(String),
    #[error(
        "--controller-image: unsupported platform {wanted}: binaries are built with this machine's toolchain, which builds {host} (cross-building is not supported)"
    )]
    UnsupportedPlatform { wanted: String, host: String },
    #[error("--controller-image: {path} is not a cargo workspace: {reason}")]
    NotAWorkspace { path: String, reason: String },
    #[error(
        "--controller-image: the workspace at {path} has no binary {binary} in package {binary}"
    )]
    MissingBinary { path: String, binary: &'static str },
    #[error("--dev-build-profile: {0:?} is not a cargo profile name")]
    BadProfile(String),
    #[error("building the controller binaries in {path} failed: {message}")]
    Build { path: String, message: String },
    #[error("cannot read the built binary {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("copying the controller binaries to {addr} failed")]
    Ssh {
        addr: std::net::SocketAddr,
        #[source]
        source: Box<SshError>,
    },
}

impl DevImageError {
    /// Bad input (exit 2) as opposed to a failed build or copy (exit 1).
    pub fn is_config(&self) -> bool {
        !matches!(
            self,
            DevImageError::Build { .. } | DevImageError::Read { .. } | DevImageError::Ssh { .. }
        )
    }
}

/// A platform `<os>/<arch>` in the container-image spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub arch: String,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.arch)
    }
}

impl Platform {
    /// The platform of the nodes unless told otherwise: Oxide VMs are x86-64 Linux.
    pub fn default_node() -> Platform {
        Platform {
            os: "linux".into(),
            arch: "amd64".into(),
        }
    }

    /// What this machine's toolchain builds (Rust's names mapped to the image spelling).
    pub fn host() -> Platform {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Platform {
            os: std::env::consts::OS.to_owned(),
            arch: arch.to_owned(),
        }
    }

    fn parse(text: &str) -> Result<Platform, DevImageError> {
        const OSES: [&str; 3] = ["linux", "darwin", "windows"];
        const ARCHES: [&str; 6] = ["amd64", "arm64", "386", "arm", "ppc64le", "s390x"];
        let unknown = || DevImageError::UnknownPlatform(text.to_owned());
        let (os, arch) = text.split_once('/').ok_or_else(unknown)?;
        if !OSES.contains(&os) || !ARCHES.contains(&arch) {
            return Err(unknown());
        }
        Ok(Platform {
            os: os.to_owned(),
            arch: arch.to_owned(),
        })
    }
}

/// A parsed `dev:<path>[:<os>/<arch>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevImage {
    /// The cargo workspace to build (as given; relative to the working directory).
    pub path: PathBuf,
    pub platform: Platform,
}

impl DevImage {
    /// `None` when `value` is an ordinary image reference. Paths containing `:` are not
    /// supported (the grammar would be ambiguous). Only the host's Linux platform can be built:
    /// the binaries come from this machine's toolchain, without cross-compilation.
    pub fn parse(value: &str) -> Result<Option<DevImage>, DevImageError> {
        let Some(rest) = value.strip_prefix(PREFIX) else {
            return Ok(None);
        };
        let mut parts = rest.split(':');
        let path = parts.next().unwrap_or_default();
        let platform = parts.next();
        if parts.next().is_some() {
            return Err(DevImageError::Malformed(format!(
                "{value:?} has more than one ':' after dev: (expected dev:<path>[:<os>/<arch>]; paths containing ':' are not supported)"
            )));
        }
        if path.trim().is_empty() {
            return Err(DevImageError::Malformed(format!(
                "{value:?} names no source path (expected dev:<path>[:<os>/<arch>])"
            )));
        }
        let platform = match platform {
            None => Platform::default_node(),
            Some("") => {
                return Err(DevImageError::Malformed(format!(
                    "{value:?} ends with ':' but names no platform (expected dev:<path>[:<os>/<arch>])"
                )));
            }
            Some(p) => Platform::parse(p)?,
        };
        let host = Platform::host();
        if platform.os != "linux" || platform != host {
            return Err(DevImageError::UnsupportedPlatform {
                wanted: platform.to_string(),
                host: host.to_string(),
            });
        }
        Ok(Some(DevImage {
            path: PathBuf::from(path),
            platform,
        }))
    }

    fn manifest_path(&self) -> PathBuf {
        self.path.join("Cargo.toml")
    }

    /// Checks that the path is a cargo workspace whose packages `bootstrap`, `reconcile-once`
    /// and `scale` each have the binary of that name (`cargo metadata --no-deps`, local only).
    pub async fn check_workspace(&self) -> Result<(), DevImageError> {
        let shown = self.path.display().to_string();
        let not_ws = |reason: String| DevImageError::NotAWorkspace {
            path: shown.clone(),
            reason,
        };
        if !self.path.is_dir() {
            return Err(not_ws("no such directory".into()));
        }
        if !self.manifest_path().is_file() {
            return Err(not_ws("it has no Cargo.toml".into()));
        }
        let out = tokio::process::Command::new(cargo())
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .arg("--manifest-path")
            .arg(self.manifest_path())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| not_ws(format!("cannot run cargo: {e}")))?;
        if !out.status.success() {
            return Err(not_ws(format!(
                "cargo metadata failed: {}",
                last_lines(&out.stderr, 3)
            )));
        }
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| not_ws(format!("cargo metadata answered unreadable JSON: {e}")))?;
        for binary in BINARIES {
            if !has_binary(&meta, binary) {
                return Err(DevImageError::MissingBinary {
                    path: shown.clone(),
                    binary,
                });
            }
        }
        Ok(())
    }

    /// `cargo build --locked --bins -p bootstrap -p reconcile-once -p scale --profile
    /// <profile>` in the workspace (CARGO_TARGET_DIR and the rest of the environment apply as
    /// usual); returns where the binaries are and their digests.
    pub async fn build(&self, profile: &str) -> Result<Built, DevImageError> {
        check_profile(profile)?;
        let shown = self.path.display().to_string();
        let fail = |message: String| DevImageError::Build {
            path: shown.clone(),
            message,
        };
        // Absolute: cargo runs inside the workspace (so its .cargo/config.toml applies), and a
        // relative --manifest-path would then be resolved against the wrong directory.
        let dir = self
            .path
            .canonicalize()
            .map_err(|e| fail(format!("cannot resolve the path: {e}")))?;
        let mut cmd = tokio::process::Command::new(cargo());
        cmd.args(["build", "--locked", "--bins"]);
        for b in BINARIES {
            cmd.args(["-p", b]);
        }
        cmd.args([
            "--profile",
            profile,
            "--message-format",
            "json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .current_dir(&dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
        let out = cmd
            .output()
            .await
            .map_err(|e| fail(format!("cannot run cargo: {e}")))?;
        if !out.status.success() {
            return Err(fail(last_lines(&out.stderr, 8)));
        }
        let mut paths: Vec<(&'static str, PathBuf)> = Vec::new();
        for line in out.stdout.split(|b| *b == b'\n') {
            let Ok(msg) = serde_json::from_slice::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] != "compiler-artifact" {
                continue;
            }
            let (Some(name), Some(exe)) =
                (msg["target"]["name"].as_str(), msg["executable"].as_str())
            else {
                continue;
            };
            if let Some(b) = BINARIES.iter().find(|b| **b == name) {
                paths.retain(|(n, _)| n != b);
                paths.push((b, PathBuf::from(exe)));
            }
        }
        let mut binaries = Vec::new();
        for b in BINARIES {
            let path = paths
                .iter()
                .find(|(n, _)| *n == b)
                .map(|(_, p)| p.clone())
                .ok_or_else(|| fail(format!("cargo reported no executable for {b}")))?;
            let sha256 = sha256_file(&path).await?;
            binaries.push(Binary {
                name: b,
                path,
                sha256,
            });
        }
        Ok(Built { binaries })
    }
}

/// One built binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    pub name: &'static str,
    /// Where cargo put it.
    pub path: PathBuf,
    /// Lowercase hex SHA-256 of its bytes.
    pub sha256: String,
}

/// The three binaries of one build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub binaries: Vec<Binary>,
}

impl Built {
    /// The `SHA256SUMS` text (`sha256sum` format, one line per binary).
    pub fn sums(&self) -> String {
        self.binaries
            .iter()
            .map(|b| format!("{}  {}\n", b.sha256, b.name))
            .collect()
    }

    /// Identifies the build: the first 16 hex digits of the SHA-256 of [`Built::sums`] (a
    /// valid label value).
    pub fn id(&self) -> String {
        hex(&Sha256::digest(self.sums().as_bytes()))[..16].to_owned()
    }

    /// The build's directory on the VMs: `/var/lib/oxide-controller/bin/<id>`. A new build
    /// gets a new directory, so a running binary is never overwritten and the manifests only
    /// point at a directory once it is complete.
    pub fn remote_dir(&self) -> String {
        format!("{REMOTE_ROOT}/{}", self.id())
    }
}

/// What [`install`] did on one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The binaries were copied.
    Copied,
    /// The VM had this build already (its `SHA256SUMS` matched).
    AlreadyThere,
}

/// Copies the build to the VM behind `target` (at `addr`, host key pinned by the caller)
/// unless it is there already: `mkdir -p`, each binary with mode 0755, then `SHA256SUMS` last.
pub async fn install<S: RemoteShell + ?Sized>(
    target: &S,
    addr: std::net::SocketAddr,
    built: &Built,
) -> Result<Installed, DevImageError> {
    let ssh = |source| DevImageError::Ssh {
        addr,
        source: Box::new(source),
    };
    let dir = built.remote_dir();
    let sums_path = format!("{dir}/{SUMS_FILE}");
    let sums = built.sums();
    if let Ok(existing) = target.read_file(&sums_path).await
        && existing == sums.as_bytes()
    {
        return Ok(Installed::AlreadyThere);
    }
    let out = target
        .exec(&format!("sudo -n mkdir -p {}", shell_quote(&dir)))
        .await
        .map_err(ssh)?;
    if !out.success() {
        return Err(ssh(SshError::Upload {
            addr,
            path: dir,
            exit_status: out.exit_status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }));
    }
    for b in &built.binaries {
        let bytes = tokio::fs::read(&b.path)
            .await
            .map_err(|source| DevImageError::Read {
                path: b.path.display().to_string(),
                source,
            })?;
        target
            .upload(&format!("{dir}/{}", b.name), &bytes, 0o755)
            .await
            .map_err(ssh)?;
    }
    target
        .upload(&sums_path, sums.as_bytes(), 0o644)
        .await
        .map_err(ssh)?;
    Ok(Installed::Copied)
}

/// Cargo as the environment names it (`$CARGO` when run under cargo), else from `PATH`.
fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Profile names as cargo accepts them: a letter, then letters, digits, `-` and `_`.
fn check_profile(profile: &str) -> Result<(), DevImageError> {
    let ok = profile.starts_with(|c: char| c.is_ascii_alphabetic())
        && profile
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(DevImageError::BadProfile(profile.to_owned()))
    }
}

/// Validates `--dev-build-profile` on its own (before any build).
pub fn validate_profile(profile: &str) -> Result<(), DevImageError> {
    check_profile(profile)
}

fn has_binary(meta: &serde_json::Value, binary: &str) -> bool {
    meta["packages"].as_array().is_some_and(|pkgs| {
        pkgs.iter().any(|p| {
            p["name"] == binary
                && p["targets"].as_array().is_some_and(|ts| {
                    ts.iter().any(|t| {
                        t["name"] == binary
                            && t["kind"]
                                .as_array()
                                .is_some_and(|k| k.iter().any(|k| k == "bin"))
                    })
                })
        })
    })
}

async fn sha256_file(path: &Path) -> Result<String, DevImageError> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|source| DevImageError::Read {
            path: path.display().to_string(),
            source,
        })?;
    Ok(hex(&Sha256::digest(&bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The last `n` non-empty lines of a process's output, joined with ` | ` (one-line errors).
fn last_lines(output: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(output);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    let joined = lines[start..].join(" | ");
    if joined.is_empty() {
        "no output".to_owned()
    } else {
        joined
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn host() -> String {
        Platform::host().to_string()
    }

    #[test]
    fn ordinary_image_references_are_not_dev_images() {
        for v in ["ghcr.io/x/y:1.0", "registry:5000/x", "devx:1", "dev"] {
            assert_eq!(DevImage::parse(v).unwrap(), None, "{v}");
        }
    }

    #[test]
    fn path_with_and_without_the_host_platform() {
        if host() != "linux/amd64" {
            return; // The default platform is only buildable on x86-64 Linux.
        }
        let d = DevImage::parse("dev:../src").unwrap().unwrap();
        assert_eq!(d.path, PathBuf::from("../src"));
        assert_eq!(d.platform, Platform::default_node());
        let d = DevImage::parse("dev:/a/b:linux/amd64").unwrap().unwrap();
        assert_eq!(d.path, PathBuf::from("/a/b"));
    }

    #[test]
    fn malformed_specs_name_the_flag() {
        for v in [
            "dev:",
            "dev::linux/amd64",
            "dev:/a:",
            "dev:/a:b:linux/amd64",
            "dev:  ",
        ] {
            let e = DevImage::parse(v).unwrap_err();
            assert!(matches!(e, DevImageError::Malformed(_)), "{v}: {e}");
            assert!(e.to_string().starts_with("--controller-image: "), "{e}");
            assert!(e.is_config());
        }
    }

    #[test]
    fn unknown_and_unsupported_platforms_are_refused() {
        for v in [
            "dev:/a:linux",
            "dev:/a:plan9/amd64",
            "dev:/a:linux/mips",
            "dev:/a:Linux/AMD64",
        ] {
            let e = DevImage::parse(v).unwrap_err();
            assert!(matches!(e, DevImageError::UnknownPlatform(_)), "{v}: {e}");
            assert!(e.to_string().contains("unknown platform"), "{e}");
        }
        let other = if host() == "linux/arm64" {
            "linux/amd64"
        } else {
            "linux/arm64"
        };
        for v in [format!("dev:/a:{other}"), "dev:/a:windows/amd64".to_owned()] {
            let e = DevImage::parse(&v).unwrap_err();
            assert!(
                matches!(e, DevImageError::UnsupportedPlatform { .. }),
                "{v}: {e}"
            );
            assert!(e.to_string().contains("unsupported platform"), "{e}");
        }
    }

    #[test]
    fn build_id_and_remote_dir_follow_the_digests() {
        let b = |sha: &str| Built {
            binaries: BINARIES
                .iter()
                .map(|n| Binary {
                    name: n,
                    path: PathBuf::from(n),
                    sha256: sha.repeat(64),
                })
                .collect(),
        };
        let (one, two) = (b("a"), b("b"));
        assert_eq!(one.id().len(), 16);
        assert_ne!(one.id(), two.id());
        assert_eq!(one.remote_dir(), format!("{REMOTE_ROOT}/{}", one.id()));
        assert_eq!(
            one.sums().lines().next().unwrap(),
            format!("{}  bootstrap", "a".repeat(64))
        );
    }

    #[test]
    fn profiles_are_plain_names() {
        for p in ["release", "dev", "release-lto", "my_prof"] {
            validate_profile(p).unwrap();
        }
        for p in ["", "a b", "../x", "--locked"] {
            let e = validate_profile(p).unwrap_err();
            assert!(e.to_string().starts_with("--dev-build-profile"), "{e}");
        }
    }

    #[test]
    fn last_lines_keeps_the_end_on_one_line() {
        assert_eq!(last_lines(b"a\n\nb\nc\n", 2), "b | c");
        assert_eq!(last_lines(b"", 2), "no output");
    }
}
