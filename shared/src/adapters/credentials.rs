//! Oxide credential resolution, the way the `oxide` CLI and SDK (0.18) do it, without
//! panicking when there is no home directory (a container has none).
//!
//! Sources, highest precedence first:
//! 1. flags `--oxide-profile`, or `--oxide-host` with `--oxide-token` (or `OXIDE_TOKEN`);
//! 2. environment `OXIDE_PROFILE`, or `OXIDE_HOST` + `OXIDE_TOKEN`;
//! 3. `default-profile` from `config.toml`.
//!
//! Profiles come from `credentials.toml` (`[profile.NAME] host, token, user, token_id?,
//! time_expires?`) in the config directory (`$OXIDE_CONFIG_DIR`, else `~/.config/oxide`).
//! As in the SDK: a host and a profile from the same layer conflict; a host without a token
//! selects the profile whose `host` matches; a token without a host is an error. A token may
//! be given as `file:PATH` (flag or env) so it never has to sit in a process listing.
//!
//! This module only reads; it never writes credentials and never builds the HTTP client.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// An Oxide API token. `Debug` redacts it and there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct OxideToken(String);

impl OxideToken {
    /// Wrap a token.
    pub fn new(token: impl Into<String>) -> OxideToken {
        OxideToken(token.into())
    }

    /// The token itself; only for the `Authorization` header or the state Secret.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for OxideToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OxideToken(<redacted>)")
    }
}

/// Where the resolved credentials came from (for a log line; no secret in it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialOrigin {
    /// `--oxide-host` (token from `--oxide-token` or `OXIDE_TOKEN`).
    Flags,
    /// `OXIDE_HOST` + `OXIDE_TOKEN`.
    Environment,
    /// A profile in `credentials.toml`, with how it was selected.
    Profile {
        /// Profile name.
        name: String,
        /// `--oxide-profile`, `OXIDE_PROFILE`, `default-profile`, or the host it matched.
        selected_by: &'static str,
    },
}

/// Resolved credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OxideCredentials {
    /// API base URL, e.g. `https://oxide.example.com` (no trailing slash).
    pub host: String,
    /// API token.
    pub token: OxideToken,
    /// Where they came from.
    pub origin: CredentialOrigin,
    /// The token's id (not the token), when a profile records it (`token_id`, which `oxide
    /// auth login` writes): which of the user's tokens it is ([`crate::domain::oxide_token`]).
    pub token_id: Option<String>,
}

/// The command-line flags.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CredentialFlags {
    /// `--oxide-host`
    pub host: Option<String>,
    /// `--oxide-token`: the token, or `file:PATH`.
    pub token: Option<String>,
    /// `--oxide-profile`
    pub profile: Option<String>,
}

impl fmt::Debug for CredentialFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialFlags")
            .field("host", &self.host)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("profile", &self.profile)
            .finish()
    }
}

/// Every input of [`resolve`], explicit so tests never touch the process environment.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CredentialSources {
    /// Flags.
    pub flags: CredentialFlags,
    /// `OXIDE_HOST`
    pub env_host: Option<String>,
    /// `OXIDE_TOKEN` (the token, or `file:PATH`).
    pub env_token: Option<String>,
    /// `OXIDE_PROFILE`
    pub env_profile: Option<String>,
    /// Directory holding `credentials.toml` and `config.toml`; `None` when there is no home
    /// directory and no `OXIDE_CONFIG_DIR` (then only flags and env can work).
    pub config_dir: Option<PathBuf>,
}

impl fmt::Debug for CredentialSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialSources")
            .field("flags", &self.flags)
            .field("env_host", &self.env_host)
            .field("env_token", &self.env_token.as_ref().map(|_| "<redacted>"))
            .field("env_profile", &self.env_profile)
            .field("config_dir", &self.config_dir)
            .finish()
    }
}

impl CredentialSources {
    /// The flags plus this process's environment (`OXIDE_HOST`, `OXIDE_TOKEN`,
    /// `OXIDE_PROFILE`, `OXIDE_CONFIG_DIR`, and the home directory). Empty variables count
    /// as unset.
    pub fn from_process_env(flags: CredentialFlags) -> CredentialSources {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        CredentialSources {
            flags,
            env_host: var("OXIDE_HOST"),
            env_token: var("OXIDE_TOKEN"),
            env_profile: var("OXIDE_PROFILE"),
            config_dir: default_config_dir(
                std::env::var_os("OXIDE_CONFIG_DIR"),
                std::env::home_dir(),
            ),
        }
    }
}

/// `$OXIDE_CONFIG_DIR` if set and non-empty, else `<home>/.config/oxide`, else `None`.
pub fn default_config_dir(
    oxide_config_dir: Option<OsString>,
    home: Option<PathBuf>,
) -> Option<PathBuf> {
    match oxide_config_dir.filter(|d| !d.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => home.map(|h| h.join(".config").join("oxide")),
    }
}

/// Why no credentials could be resolved. Each message says what to set.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// A host and a profile were given at the same level.
    #[error("both {host} and {profile} are set; use only one of them")]
    HostAndProfile {
        /// The host input (`--oxide-host` or `OXIDE_HOST`).
        host: &'static str,
        /// The profile input (`--oxide-profile` or `OXIDE_PROFILE`).
        profile: &'static str,
    },
    /// A token without a host.
    #[error("{token} is set but no host is: pass --oxide-host or set OXIDE_HOST")]
    MissingHost {
        /// The token input (`--oxide-token` or `OXIDE_TOKEN`).
        token: &'static str,
    },
    /// A host without a token, and no profile for that host.
    #[error(
        "{host_from} is {host} but there is no token for it: pass --oxide-token (the token or \
         file:PATH), set OXIDE_TOKEN, or log in with `oxide auth login --host {host}`"
    )]
    MissingToken {
        /// The host.
        host: String,
        /// Where it came from.
        host_from: &'static str,
    },
    /// The host is not an http(s) URL.
    #[error("{host_from} must be a URL like https://oxide.example.com, not {host:?}")]
    InvalidHost {
        /// The value given.
        host: String,
        /// Where it came from.
        host_from: &'static str,
    },
    /// A `file:PATH` token could not be read.
    #[error("cannot read the Oxide token file {path} (given as {token_from}=file:PATH)")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Where the reference came from.
        token_from: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The token is empty (after trimming).
    #[error("the Oxide token from {token_from} is empty")]
    EmptyToken {
        /// Where it came from.
        token_from: String,
    },
    /// Files are needed but there is no config directory.
    #[error(
        "no Oxide config directory (no home directory and OXIDE_CONFIG_DIR unset): set \
         OXIDE_HOST and OXIDE_TOKEN, or OXIDE_CONFIG_DIR"
    )]
    NoConfigDir,
    /// `credentials.toml` does not exist.
    #[error("{} does not exist: set OXIDE_HOST and OXIDE_TOKEN, or run `oxide auth login`", path.display())]
    NoCredentialsFile {
        /// The expected path.
        path: PathBuf,
    },
    /// A file exists but cannot be read.
    #[error("cannot read {}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid TOML of the expected shape. Only the parser's message is kept:
    /// its full rendering quotes the offending line, which could hold a token.
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(" line {l}")).unwrap_or_default())]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// 1-based line of the problem, when known.
        line: Option<usize>,
        /// The parser's message.
        message: String,
    },
    /// The requested profile is not in `credentials.toml`.
    #[error("profile {profile:?} (from {selected_by}) is not in {}; known profiles: {}", path.display(), list(known))]
    UnknownProfile {
        /// The name asked for.
        profile: String,
        /// How it was asked for.
        selected_by: &'static str,
        /// `credentials.toml`.
        path: PathBuf,
        /// Profiles that do exist.
        known: Vec<String>,
    },
    /// Nothing selects a profile.
    #[error(
        "no Oxide credentials selected: pass --oxide-profile, set OXIDE_PROFILE, set OXIDE_HOST \
         and OXIDE_TOKEN, or set default-profile in {}; known profiles: {}",
        config.display(),
        list(known)
    )]
    NoDefaultProfile {
        /// `config.toml`.
        config: PathBuf,
        /// Profiles in `credentials.toml`.
        known: Vec<String>,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_string()
    } else {
        names.join(", ")
    }
}

/// One profile of `credentials.toml`.
#[derive(Deserialize)]
struct ProfileCredentials {
    token: String,
    host: String,
    /// Which of the user's tokens `token` is (the reconcile watches its end).
    #[serde(default)]
    token_id: Option<String>,
    // `user` and `time_expires` are in the file too; authentication needs only host and
    // token (unknown keys are ignored, as in the SDK).
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CredentialsFile {
    profile: BTreeMap<String, ProfileCredentials>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct BasicConfigFile {
    default_profile: Option<String>,
}

/// Resolve credentials from `sources` (see the module docs for the precedence).
pub fn resolve(sources: &CredentialSources) -> Result<OxideCredentials, CredentialError> {
    let flags = &sources.flags;
    let env_host = non_empty(&sources.env_host);
    let env_token = non_empty(&sources.env_token);
    let env_profile = non_empty(&sources.env_profile);

    // 1. Flags.
    match (non_empty(&flags.host), non_empty(&flags.profile)) {
        (Some(_), Some(_)) => {
            return Err(CredentialError::HostAndProfile {
                host: "--oxide-host",
                profile: "--oxide-profile",
            });
        }
        (None, Some(profile)) => return from_profile(sources, profile, "--oxide-profile"),
        (Some(host), None) => {
            let host = normalize_host(host, "--oxide-host")?;
            let token = match (non_empty(&flags.token), env_token) {
                (Some(t), _) => Some(read_token(t, "--oxide-token")?),
                (None, Some(t)) => Some(read_token(t, "OXIDE_TOKEN")?),
                (None, None) => None,
            };
            return match token {
                Some(token) => Ok(OxideCredentials {
                    host,
                    token,
                    origin: CredentialOrigin::Flags,
                    token_id: None,
                }),
                None => from_profile_for_host(sources, &host, "--oxide-host"),
            };
        }
        (None, None) => {
            if let Some(token) = non_empty(&flags.token) {
                let Some(host) = env_host else {
                    return Err(CredentialError::MissingHost {
                        token: "--oxide-token",
                    });
                };
                return Ok(OxideCredentials {
                    host: normalize_host(host, "OXIDE_HOST")?,
                    token: read_token(token, "--oxide-token")?,
                    origin: CredentialOrigin::Flags,
                    token_id: None,
                });
            }
        }
    }

    // 2. Environment.
    if env_host.is_some() && env_profile.is_some() {
        return Err(CredentialError::HostAndProfile {
            host: "OXIDE_HOST",
            profile: "OXIDE_PROFILE",
        });
    }
    if let Some(profile) = env_profile {
        return from_profile(sources, profile, "OXIDE_PROFILE");
    }
    match (env_host, env_token) {
        (Some(host), Some(token)) => {
            return Ok(OxideCredentials {
                host: normalize_host(host, "OXIDE_HOST")?,
                token: read_token(token, "OXIDE_TOKEN")?,
                origin: CredentialOrigin::Environment,
                token_id: None,
            });
        }
        (None, Some(_)) => {
            return Err(CredentialError::MissingHost {
                token: "OXIDE_TOKEN",
            });
        }
        (Some(host), None) => {
            let host = normalize_host(host, "OXIDE_HOST")?;
            return from_profile_for_host(sources, &host, "OXIDE_HOST");
        }
        (None, None) => {}
    }

    // 3. The default profile.
    let dir = sources
        .config_dir
        .as_deref()
        .ok_or(CredentialError::NoConfigDir)?;
    let creds = load_credentials(dir)?;
    let config_path = dir.join("config.toml");
    let config: BasicConfigFile = match read_optional(&config_path)? {
        Some(text) => parse_toml(&config_path, &text)?,
        None => BasicConfigFile::default(),
    };
    match config.default_profile.filter(|p| !p.is_empty()) {
        Some(profile) => pick_profile(dir, creds, &profile, "default-profile"),
        None => Err(CredentialError::NoDefaultProfile {
            config: config_path,
            known: creds.profile.into_keys().collect(),
        }),
    }
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

fn from_profile(
    sources: &CredentialSources,
    profile: &str,
    selected_by: &'static str,
) -> Result<OxideCredentials, CredentialError> {
    let dir = sources
        .config_dir
        .as_deref()
        .ok_or(CredentialError::NoConfigDir)?;
    let creds = load_credentials(dir)?;
    pick_profile(dir, creds, profile, selected_by)
}

/// The SDK's backward-compatible rule: a host without a token names the profile for that host.
fn from_profile_for_host(
    sources: &CredentialSources,
    host: &str,
    host_from: &'static str,
) -> Result<OxideCredentials, CredentialError> {
    let missing = || CredentialError::MissingToken {
        host: host.to_string(),
        host_from,
    };
    let Some(dir) = sources.config_dir.as_deref() else {
        return Err(missing());
    };
    let creds = match load_credentials(dir) {
        Ok(creds) => creds,
        Err(CredentialError::NoCredentialsFile { .. }) => return Err(missing()),
        Err(other) => return Err(other),
    };
    let name = creds
        .profile
        .iter()
        .find(|(_, p)| p.host.trim_end_matches('/') == host)
        .map(|(name, _)| name.clone())
        .ok_or_else(missing)?;
    pick_profile(dir, creds, &name, host_from)
}

fn pick_profile(
    dir: &Path,
    mut creds: CredentialsFile,
    name: &str,
    selected_by: &'static str,
) -> Result<OxideCredentials, CredentialError> {
    let path = dir.join("credentials.toml");
    let Some(profile) = creds.profile.remove(name) else {
        return Err(CredentialError::UnknownProfile {
            profile: name.to_string(),
            selected_by,
            path,
            known: creds.profile.into_keys().collect(),
        });
    };
    let token = profile.token.trim();
    if token.is_empty() {
        return Err(CredentialError::EmptyToken {
            token_from: format!("profile {name:?} in {}", path.display()),
        });
    }
    Ok(OxideCredentials {
        host: normalize_host(&profile.host, "the profile's host")?,
        token: OxideToken::new(token),
        origin: CredentialOrigin::Profile {
            name: name.to_string(),
            selected_by,
        },
        token_id: profile.token_id.filter(|id| !id.trim().is_empty()),
    })
}

fn load_credentials(dir: &Path) -> Result<CredentialsFile, CredentialError> {
    let path = dir.join("credentials.toml");
    match read_optional(&path)? {
        Some(text) => parse_toml(&path, &text),
        None => Err(CredentialError::NoCredentialsFile { path }),
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, CredentialError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CredentialError::ReadFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_toml<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, CredentialError> {
    toml::from_str(text).map_err(|e| CredentialError::ParseFile {
        path: path.to_path_buf(),
        line: e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1),
        message: e.message().to_string(),
    })
}

/// A token value, or the contents of `file:PATH` (surrounding whitespace trimmed).
fn read_token(value: &str, token_from: &'static str) -> Result<OxideToken, CredentialError> {
    let token = match value.strip_prefix("file:") {
        Some(path) => {
            let path = PathBuf::from(path);
            std::fs::read_to_string(&path)
                .map_err(|source| CredentialError::TokenFile {
                    path: path.clone(),
                    token_from,
                    source,
                })?
                .trim()
                .to_string()
        }
        None => value.trim().to_string(),
    };
    if token.is_empty() {
        return Err(CredentialError::EmptyToken {
            token_from: token_from.to_string(),
        });
    }
    Ok(OxideToken::new(token))
}

fn normalize_host(host: &str, host_from: &'static str) -> Result<String, CredentialError> {
    let trimmed = host.trim().trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"))
        .unwrap_or("");
    if rest.is_empty() || rest.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(CredentialError::InvalidHost {
            host: host.to_string(),
            host_from,
        });
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const CREDENTIALS: &str = r#"
[profile.prod]
host = "https://prod.oxide.example"
token = "oxide-token-prod"
user = "8f6c1b8e-7d3e-4a4e-9d0e-5e5f1b2c3d4e"
token_id = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
time_expires = "2030-01-01T00:00:00Z"

[profile.lab]
host = "https://lab.oxide.example/"
token = "oxide-token-lab"
user = "8f6c1b8e-7d3e-4a4e-9d0e-5e5f1b2c3d4e"
"#;

    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new(credentials: Option<&str>, config: Option<&str>) -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            if let Some(c) = credentials {
                std::fs::write(dir.path().join("credentials.toml"), c).unwrap();
            }
            if let Some(c) = config {
                std::fs::write(dir.path().join("config.toml"), c).unwrap();
            }
            Fixture { dir }
        }

        fn standard() -> Fixture {
            Fixture::new(Some(CREDENTIALS), Some("default-profile = \"lab\"\n"))
        }

        fn sources(&self) -> CredentialSources {
            CredentialSources {
                config_dir: Some(self.dir.path().to_path_buf()),
                ..Default::default()
            }
        }
    }

    fn flags(host: Option<&str>, token: Option<&str>, profile: Option<&str>) -> CredentialFlags {
        CredentialFlags {
            host: host.map(Into::into),
            token: token.map(Into::into),
            profile: profile.map(Into::into),
        }
    }

    fn ok(sources: &CredentialSources) -> (String, String, CredentialOrigin) {
        let c = resolve(sources).unwrap_or_else(|e| panic!("{e}"));
        (c.host, c.token.expose().to_string(), c.origin)
    }

    fn profile(name: &str, selected_by: &'static str) -> CredentialOrigin {
        CredentialOrigin::Profile {
            name: name.into(),
            selected_by,
        }
    }

    #[test]
    fn flags_host_and_token_beat_everything() {
        let f = Fixture::standard();
        let s = CredentialSources {
            flags: flags(Some("https://flag.example/"), Some("flag-token"), None),
            env_host: Some("https://env.example".into()),
            env_token: Some("env-token".into()),
            ..f.sources()
        };
        assert_eq!(
            ok(&s),
            (
                "https://flag.example".into(),
                "flag-token".into(),
                CredentialOrigin::Flags
            )
        );
    }

    #[test]
    fn flag_profile_beats_env() {
        let f = Fixture::standard();
        let s = CredentialSources {
            flags: flags(None, None, Some("prod")),
            env_host: Some("https://env.example".into()),
            env_token: Some("env-token".into()),
            env_profile: Some("lab".into()),
            ..f.sources()
        };
        assert_eq!(
            ok(&s),
            (
                "https://prod.oxide.example".into(),
                "oxide-token-prod".into(),
                profile("prod", "--oxide-profile")
            )
        );
        // The profile's token_id (which `oxide auth login` writes) comes along: the cluster
        // watches that token's end. Flags and the environment carry none.
        assert_eq!(
            resolve(&s).ok().and_then(|c| c.token_id).as_deref(),
            Some("1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f")
        );
        let env = CredentialSources {
            flags: flags(None, None, None),
            env_profile: None,
            ..s
        };
        assert_eq!(resolve(&env).ok().map(|c| c.token_id), Some(None));
    }

    #[test]
    fn flag_host_takes_the_token_from_env() {
        let s = CredentialSources {
            flags: flags(Some("https://flag.example"), None, None),
            env_token: Some("env-token".into()),
            ..Default::default()
        };
        assert_eq!(
            ok(&s),
            (
                "https://flag.example".into(),
                "env-token".into(),
                CredentialOrigin::Flags
            )
        );
    }

    #[test]
    fn flag_token_takes_the_host_from_env() {
        let s = CredentialSources {
            flags: flags(None, Some("flag-token"), None),
            env_host: Some("https://env.example".into()),
            ..Default::default()
        };
        assert_eq!(
            ok(&s),
            (
                "https://env.example".into(),
                "flag-token".into(),
                CredentialOrigin::Flags
            )
        );
    }

    #[test]
    fn token_may_come_from_a_file() {
        let f = Fixture::new(None, None);
        let path = f.dir.path().join("token");
        std::fs::write(&path, "file-token\n").unwrap();
        let s = CredentialSources {
            flags: flags(
                Some("https://flag.example"),
                Some(&format!("file:{}", path.display())),
                None,
            ),
            ..Default::default()
        };
        assert_eq!(ok(&s).1, "file-token");
        let s = CredentialSources {
            env_host: Some("https://env.example".into()),
            env_token: Some(format!("file:{}", path.display())),
            ..Default::default()
        };
        assert_eq!(
            ok(&s),
            (
                "https://env.example".into(),
                "file-token".into(),
                CredentialOrigin::Environment
            )
        );
    }

    #[test]
    fn env_host_and_token_beat_the_default_profile() {
        let f = Fixture::standard();
        let s = CredentialSources {
            env_host: Some("https://env.example".into()),
            env_token: Some("env-token".into()),
            ..f.sources()
        };
        assert_eq!(
            ok(&s),
            (
                "https://env.example".into(),
                "env-token".into(),
                CredentialOrigin::Environment
            )
        );
    }

    #[test]
    fn env_profile_beats_env_token_and_default_profile() {
        let f = Fixture::standard();
        let s = CredentialSources {
            env_profile: Some("prod".into()),
            env_token: Some("env-token".into()),
            ..f.sources()
        };
        assert_eq!(
            ok(&s),
            (
                "https://prod.oxide.example".into(),
                "oxide-token-prod".into(),
                profile("prod", "OXIDE_PROFILE")
            )
        );
    }

    #[test]
    fn env_host_without_token_selects_the_profile_for_that_host() {
        let f = Fixture::standard();
        let s = CredentialSources {
            env_host: Some("https://lab.oxide.example".into()),
            ..f.sources()
        };
        assert_eq!(
            ok(&s),
            (
                "https://lab.oxide.example".into(),
                "oxide-token-lab".into(),
                profile("lab", "OXIDE_HOST")
            )
        );
    }

    #[test]
    fn default_profile_is_the_last_resort() {
        let f = Fixture::standard();
        assert_eq!(
            ok(&f.sources()),
            (
                "https://lab.oxide.example".into(),
                "oxide-token-lab".into(),
                profile("lab", "default-profile")
            )
        );
    }

    fn err(s: &CredentialSources) -> CredentialError {
        match resolve(s) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn host_and_profile_together_are_an_error_at_each_level() {
        let f = Fixture::standard();
        let e = err(&CredentialSources {
            flags: flags(Some("https://a.example"), None, Some("prod")),
            ..f.sources()
        });
        assert!(
            matches!(
                e,
                CredentialError::HostAndProfile {
                    host: "--oxide-host",
                    ..
                }
            ),
            "{e}"
        );
        let e = err(&CredentialSources {
            env_host: Some("https://a.example".into()),
            env_profile: Some("prod".into()),
            ..f.sources()
        });
        assert!(
            matches!(
                e,
                CredentialError::HostAndProfile {
                    host: "OXIDE_HOST",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("only one"), "{e}");
    }

    #[test]
    fn host_without_token_names_what_to_set() {
        let f = Fixture::standard();
        let e = err(&CredentialSources {
            env_host: Some("https://unknown.example".into()),
            ..f.sources()
        });
        let msg = e.to_string();
        assert!(matches!(e, CredentialError::MissingToken { .. }), "{msg}");
        assert!(
            msg.contains("OXIDE_TOKEN")
                && msg.contains("--oxide-token")
                && msg.contains("https://unknown.example"),
            "{msg}"
        );
        // Also without any config directory.
        let e = err(&CredentialSources {
            flags: flags(Some("https://a.example"), None, None),
            ..Default::default()
        });
        assert!(
            matches!(
                e,
                CredentialError::MissingToken {
                    host_from: "--oxide-host",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn token_without_host_is_an_error() {
        let e = err(&CredentialSources {
            env_token: Some("t".into()),
            ..Default::default()
        });
        assert!(
            matches!(
                e,
                CredentialError::MissingHost {
                    token: "OXIDE_TOKEN"
                }
            ),
            "{e}"
        );
        let e = err(&CredentialSources {
            flags: flags(None, Some("t"), None),
            ..Default::default()
        });
        assert!(
            matches!(
                e,
                CredentialError::MissingHost {
                    token: "--oxide-token"
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn unknown_profile_lists_known_profiles() {
        let f = Fixture::standard();
        let e = err(&CredentialSources {
            flags: flags(None, None, Some("staging")),
            ..f.sources()
        });
        let msg = e.to_string();
        assert!(matches!(e, CredentialError::UnknownProfile { .. }), "{msg}");
        assert!(
            msg.contains("\"staging\"") && msg.contains("lab, prod"),
            "{msg}"
        );
        // A default-profile naming a missing profile is the same error.
        let f = Fixture::new(Some(CREDENTIALS), Some("default-profile = \"gone\"\n"));
        assert!(matches!(
            err(&f.sources()),
            CredentialError::UnknownProfile {
                selected_by: "default-profile",
                ..
            }
        ));
    }

    #[test]
    fn unreadable_token_file_names_the_path() {
        let e = err(&CredentialSources {
            flags: flags(
                Some("https://a.example"),
                Some("file:/nonexistent/oxide-token"),
                None,
            ),
            ..Default::default()
        });
        assert!(matches!(e, CredentialError::TokenFile { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/oxide-token"), "{e}");
    }

    #[test]
    fn empty_token_is_an_error() {
        let f = Fixture::new(None, None);
        let path = f.dir.path().join("empty");
        std::fs::write(&path, "\n").unwrap();
        let e = err(&CredentialSources {
            flags: flags(
                Some("https://a.example"),
                Some(&format!("file:{}", path.display())),
                None,
            ),
            ..Default::default()
        });
        assert!(matches!(e, CredentialError::EmptyToken { .. }), "{e}");
    }

    #[test]
    fn no_home_directory_is_an_error_not_a_panic() {
        let e = err(&CredentialSources::default());
        assert!(matches!(e, CredentialError::NoConfigDir), "{e}");
        assert!(e.to_string().contains("OXIDE_HOST and OXIDE_TOKEN"), "{e}");
        let e = err(&CredentialSources {
            env_profile: Some("prod".into()),
            ..Default::default()
        });
        assert!(matches!(e, CredentialError::NoConfigDir), "{e}");
    }

    #[test]
    fn missing_files_say_how_to_log_in() {
        let f = Fixture::new(None, None);
        let e = err(&f.sources());
        assert!(
            matches!(e, CredentialError::NoCredentialsFile { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("oxide auth login"), "{e}");
        let f = Fixture::new(Some(CREDENTIALS), None);
        let e = err(&f.sources());
        assert!(matches!(e, CredentialError::NoDefaultProfile { .. }), "{e}");
        assert!(e.to_string().contains("lab, prod"), "{e}");
    }

    #[test]
    fn malformed_credentials_file_never_quotes_its_contents() {
        let f = Fixture::new(
            Some("[profile.x]\nhost = \"https://a\"\ntoken = oxide-token-secret\n"),
            None,
        );
        let e = err(&CredentialSources {
            flags: flags(None, None, Some("x")),
            ..f.sources()
        });
        assert!(
            matches!(e, CredentialError::ParseFile { line: Some(3), .. }),
            "{e:?}"
        );
        assert!(
            !format!("{e} {e:?}").contains("oxide-token-secret"),
            "{e:?}"
        );
    }

    #[test]
    fn host_must_be_a_url() {
        let e = err(&CredentialSources {
            env_host: Some("oxide.example".into()),
            env_token: Some("t".into()),
            ..Default::default()
        });
        assert!(matches!(e, CredentialError::InvalidHost { .. }), "{e}");
    }

    #[test]
    fn config_dir_prefers_oxide_config_dir_then_home() {
        assert_eq!(
            default_config_dir(Some("/etc/oxide".into()), Some("/home/u".into())),
            Some(PathBuf::from("/etc/oxide"))
        );
        assert_eq!(
            default_config_dir(Some("".into()), Some("/home/u".into())),
            Some(PathBuf::from("/home/u/.config/oxide"))
        );
        assert_eq!(default_config_dir(None, None), None);
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let s = CredentialSources {
            flags: flags(Some("https://a.example"), Some("flag-secret"), None),
            env_token: Some("env-secret".into()),
            ..Default::default()
        };
        let creds = resolve(&s).unwrap();
        let debug = format!("{s:?} {creds:?}");
        assert!(!debug.contains("secret"), "{debug}");
    }
}
