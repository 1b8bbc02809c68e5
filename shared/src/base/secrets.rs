//! The cluster's secrets: the keys of Secret `kube-system/oxide-controller`, one key per value
//! (never one JSON blob) so RBAC and rotation stay simple. `Debug` never shows a value. No SSH
//! private key: the controller's lives only in the laptop's resume file, so no account that
//! reads this Secret (and no root on a node whose kubelet mounts it) gets root on every node.
//! No webhook token either: those are in a Secret of their own ([`webhook::AUTH_SECRET`]), the
//! only one besides the serving pair's that the webhook's pod mounts, so neither the reconcile
//! account nor the kubelet of the webhook's node reads a token it does not use (audit H1).

use std::collections::BTreeMap;

/// Secret keys, as DESIGN.md lists them. The Oxide CCM reads the first three names too.
pub mod keys {
    pub const OXIDE_HOST: &str = "oxide-host";
    pub const OXIDE_TOKEN: &str = "oxide-token";
    pub const OXIDE_PROJECT: &str = "oxide-project";
    /// The id of the Oxide token (not a secret): which of the user's tokens the reconcile
    /// watches the end of ([`crate::domain::oxide_token`]).
    pub const OXIDE_TOKEN_ID: &str = "oxide-token-id";
    /// The cluster's name, pinned like the project: the ConfigMap's `cluster` must equal it.
    pub const OXIDE_CLUSTER: &str = "oxide-cluster";
    pub const K3S_TOKEN: &str = "k3s-token";
    pub const K3S_AGENT_TOKEN: &str = "k3s-agent-token";
    /// Held the controller's SSH private key until it left the cluster (issue 34): root on
    /// every node must not be one Secret read away. Only the laptop's resume file has it now.
    pub const RETIRED_SSH_PRIVATE_KEY: &str = "ssh-private-key";
    /// Keys an older controller wrote that no version may keep: removed when bootstrap next
    /// ensures the Secret (the way a controller is updated).
    pub const RETIRED: &[&str] = &[
        RETIRED_SSH_PRIVATE_KEY,
        RETIRED_WEBHOOK_TLS_CERT,
        RETIRED_WEBHOOK_TLS_KEY,
    ];
    pub const SSH_PUBLIC_KEY: &str = "ssh-public-key";
    pub const USER_SSH_PUBLIC_KEY: &str = "user-ssh-public-key";
    /// The webhook's token (reads and writes); a key of [`super::webhook::AUTH_SECRET`] (of this
    /// Secret too, before audit H1's fix: [`MOVED_TO_WEBHOOK_AUTH`]).
    pub const WEBHOOK_TOKEN: &str = "webhook-token";
    /// The webhook's read-only token: GETs and `/metrics`, never a change. As [`WEBHOOK_TOKEN`].
    pub const WEBHOOK_READ_TOKEN: &str = "webhook-read-token";
    /// Keys an older controller kept here that now live in [`super::webhook::AUTH_SECRET`]:
    /// bootstrap copies them there when that Secret does not exist yet (their values are the
    /// ones in force, perhaps rotated by hand), then removes them from this Secret. Not
    /// [`RETIRED`]: the tokens stay valid, and every snapshot holds them anyway.
    pub const MOVED_TO_WEBHOOK_AUTH: &[&str] = &[WEBHOOK_TOKEN, WEBHOOK_READ_TOKEN];
    pub const TAILSCALE_AUTH_KEY: &str = "tailscale-auth-key";
    /// Held the webhook's serving certificate until it moved to a Secret of its own
    /// ([`super::webhook::TLS_SECRET`], which the reconcile may rewrite; issue 46).
    pub const RETIRED_WEBHOOK_TLS_CERT: &str = "webhook-tls.crt";
    /// Held its key.
    pub const RETIRED_WEBHOOK_TLS_KEY: &str = "webhook-tls.key";
}

/// Values of the Secret.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct ClusterSecrets {
    pub oxide_host: String,
    pub oxide_token: String,
    pub oxide_project: String,
    /// Empty in Secrets written before the cluster was pinned (bootstrap fills it in).
    pub oxide_cluster: String,
    pub k3s_token: String,
    pub k3s_agent_token: String,
    pub ssh_public_key: String,
    pub user_ssh_public_key: Option<String>,
    pub tailscale_auth_key: Option<String>,
    /// The Oxide token's id, when bootstrap could tell it (absent in older Secrets).
    pub oxide_token_id: Option<String>,
}

impl std::fmt::Debug for ClusterSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSecrets")
            .field("oxide_host", &self.oxide_host)
            .field("oxide_project", &self.oxide_project)
            .field("oxide_cluster", &self.oxide_cluster)
            .finish_non_exhaustive()
    }
}

/// A required key is missing or not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Secret kube-system/oxide-controller lacks key {key:?} (or it is not UTF-8); re-run bootstrap to repair it"
)]
pub struct MissingSecretKey {
    pub key: &'static str,
}

impl ClusterSecrets {
    /// From the Secret's decoded data.
    pub fn from_map(map: &BTreeMap<String, Vec<u8>>) -> Result<Self, MissingSecretKey> {
        let get = |key: &'static str| -> Result<String, MissingSecretKey> {
            map.get(key)
                .and_then(|v| String::from_utf8(v.clone()).ok())
                .ok_or(MissingSecretKey { key })
        };
        let opt = |key: &'static str| {
            map.get(key)
                .and_then(|v| String::from_utf8(v.clone()).ok())
                .filter(|s| !s.is_empty())
        };
        Ok(ClusterSecrets {
            oxide_host: get(keys::OXIDE_HOST)?,
            oxide_token: get(keys::OXIDE_TOKEN)?,
            oxide_project: get(keys::OXIDE_PROJECT)?,
            oxide_cluster: opt(keys::OXIDE_CLUSTER).unwrap_or_default(),
            k3s_token: get(keys::K3S_TOKEN)?,
            k3s_agent_token: get(keys::K3S_AGENT_TOKEN)?,
            ssh_public_key: get(keys::SSH_PUBLIC_KEY)?,
            user_ssh_public_key: opt(keys::USER_SSH_PUBLIC_KEY),
            tailscale_auth_key: opt(keys::TAILSCALE_AUTH_KEY),
            oxide_token_id: opt(keys::OXIDE_TOKEN_ID),
        })
    }

    /// The Secret's data.
    pub fn to_map(&self) -> BTreeMap<String, Vec<u8>> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            m.insert(k.to_owned(), v.as_bytes().to_vec());
        };
        put(keys::OXIDE_HOST, &self.oxide_host);
        put(keys::OXIDE_TOKEN, &self.oxide_token);
        put(keys::OXIDE_PROJECT, &self.oxide_project);
        if !self.oxide_cluster.is_empty() {
            put(keys::OXIDE_CLUSTER, &self.oxide_cluster);
        }
        put(keys::K3S_TOKEN, &self.k3s_token);
        put(keys::K3S_AGENT_TOKEN, &self.k3s_agent_token);
        put(keys::SSH_PUBLIC_KEY, &self.ssh_public_key);
        if let Some(k) = &self.user_ssh_public_key {
            put(keys::USER_SSH_PUBLIC_KEY, k);
        }
        if let Some(k) = &self.tailscale_auth_key {
            put(keys::TAILSCALE_AUTH_KEY, k);
        }
        if let Some(k) = &self.oxide_token_id {
            put(keys::OXIDE_TOKEN_ID, k);
        }
        m
    }
}

/// The webhook's TLS material (see [`crate::adapters::webhook_tls`], which makes it): two
/// Secrets of their own, so the reconcile may re-issue the serving pair without writing the
/// cluster's Secret, and the CA's key is mounted by no pod. And its bearer tokens, in a third
/// ([`AUTH_SECRET`]) that only the webhook's pod mounts and no account of ours may read.
pub mod webhook {
    use std::collections::BTreeMap;

    /// The Secret holding the webhook's bearer tokens ([`super::keys::WEBHOOK_TOKEN`],
    /// [`super::keys::WEBHOOK_READ_TOKEN`]); the webhook's pod mounts it, no account reads it.
    pub const AUTH_SECRET: &str = "oxide-controller-webhook-auth";
    /// The Secret holding the serving pair and the CA's certificate (the webhook pod mounts it).
    pub const TLS_SECRET: &str = "oxide-controller-webhook-tls";
    /// The Secret holding the CA's certificate and key (no pod mounts it).
    pub const CA_SECRET: &str = "oxide-controller-webhook-ca";
    /// Keys of [`TLS_SECRET`] (a `kubernetes.io/tls` Secret) and [`CA_SECRET`].
    pub mod keys {
        pub const CERT: &str = "tls.crt";
        pub const KEY: &str = "tls.key";
        pub const CA_CERT: &str = "ca.crt";
        pub const CA_KEY: &str = "ca.key";
    }
    /// A serving pair and the CA that signed it, PEM. `Debug` hides the key.
    #[derive(Clone, PartialEq, Eq)]
    pub struct WebhookTls {
        pub ca_pem: String,
        pub cert_pem: String,
        pub key_pem: String,
    }

    impl std::fmt::Debug for WebhookTls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("WebhookTls").finish_non_exhaustive()
        }
    }

    /// The CA's certificate and key, PEM. `Debug` hides the key.
    #[derive(Clone, PartialEq, Eq)]
    pub struct WebhookCa {
        pub ca_pem: String,
        pub ca_key_pem: String,
    }

    impl std::fmt::Debug for WebhookCa {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("WebhookCa").finish_non_exhaustive()
        }
    }

    /// The webhook's bearer tokens, the data of [`AUTH_SECRET`]. `Debug` hides both.
    #[derive(Clone, PartialEq, Eq, Default)]
    pub struct WebhookTokens {
        /// Reads and writes; empty: the webhook accepts nobody.
        pub token: String,
        /// Reads only. Absent in clusters bootstrapped before it existed.
        pub read_token: Option<String>,
    }

    impl std::fmt::Debug for WebhookTokens {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("WebhookTokens").finish_non_exhaustive()
        }
    }

    impl WebhookTokens {
        /// From a Secret's decoded data (this one's, or the cluster Secret's keys of an older
        /// controller); `None` when it holds no write token (missing, empty or not UTF-8).
        pub fn from_map(map: &BTreeMap<String, Vec<u8>>) -> Option<Self> {
            let text = |key: &str| {
                map.get(key)
                    .and_then(|v| String::from_utf8(v.clone()).ok())
                    .filter(|s| !s.is_empty())
            };
            Some(WebhookTokens {
                token: text(super::keys::WEBHOOK_TOKEN)?,
                read_token: text(super::keys::WEBHOOK_READ_TOKEN),
            })
        }

        /// The Secret's data.
        pub fn to_map(&self) -> BTreeMap<String, Vec<u8>> {
            let mut m = BTreeMap::from([(
                super::keys::WEBHOOK_TOKEN.to_owned(),
                self.token.as_bytes().to_vec(),
            )]);
            if let Some(r) = &self.read_token {
                m.insert(
                    super::keys::WEBHOOK_READ_TOKEN.to_owned(),
                    r.as_bytes().to_vec(),
                );
            }
            m
        }
    }
}

/// A random token of `bytes` random bytes, hex-encoded (k3s and webhook tokens).
pub fn random_token(rng: &mut impl rand::Rng, bytes: usize) -> String {
    use rand::RngExt;
    (0..bytes)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

/// A secret flag given its value literally on the command line, where other local users can
/// read it (`/proc/PID/cmdline`, `ps`) and the shell history keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecretFlag {
    /// The flag, e.g. `--oxide-token`.
    pub flag: &'static str,
    /// The environment variable read instead when the flag is absent.
    pub env: &'static str,
}

/// One warning per flag of `flags` that `argv` gives a literal value (not `file:PATH`), naming
/// the flag and the safer forms. The value itself is never part of a warning.
pub fn literal_secret_warnings(argv: &[std::ffi::OsString], flags: &[SecretFlag]) -> Vec<String> {
    let mut found: Vec<&SecretFlag> = Vec::new();
    let mut args = argv.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        for f in flags {
            let value = if arg == f.flag {
                args.next().map(|v| v.into_owned())
            } else {
                arg.strip_prefix(f.flag)
                    .and_then(|rest| rest.strip_prefix('='))
                    .map(str::to_owned)
            };
            if let Some(v) = value
                && !v.is_empty()
                && !v.starts_with("file:")
                && !found.contains(&f)
            {
                found.push(f);
            }
        }
    }
    found
        .into_iter()
        .map(|f| {
            format!(
                "warning: {flag} was given its secret on the command line, where other local \
                 users can read it (ps, /proc/PID/cmdline) and your shell history keeps it; \
                 pass {flag} file:PATH (a file only you can read) or set {env} instead",
                flag = f.flag,
                env = f.env
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Audit L4: a literal secret in argv is named with the safer forms, never quoted;
    /// `file:PATH` and absent flags are quiet.
    #[test]
    fn literal_secrets_in_argv_are_warned_about_without_their_value() {
        let flags = [
            SecretFlag {
                flag: "--oxide-token",
                env: "OXIDE_TOKEN",
            },
            SecretFlag {
                flag: "--tailscale-auth-key",
                env: "OXIDE_CONTROLLER_TAILSCALE_AUTH_KEY",
            },
            SecretFlag {
                flag: "--tailscale-api-key",
                env: "TAILSCALE_API_KEY",
            },
        ];
        let argv = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let w = literal_secret_warnings(
            &argv(&[
                "bootstrap",
                "--oxide-token",
                "oxide-token-s3cr3t",
                "--tailscale-auth-key=tskey-auth-s3cr3t",
                "--tailscale-api-key",
                "file:/home/me/ts-api",
                "--cluster",
                "demo",
            ]),
            &flags,
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("--oxide-token file:PATH") && w[0].contains("OXIDE_TOKEN"));
        assert!(w[1].contains("--tailscale-auth-key file:PATH"));
        assert!(w.iter().all(|w| !w.contains("s3cr3t")), "{w:?}");
        assert!(
            literal_secret_warnings(
                &argv(&[
                    "bootstrap",
                    "--oxide-token=file:t",
                    "--",
                    "--oxide-token",
                    "x"
                ]),
                &flags
            )
            .is_empty()
        );
    }

    #[test]
    fn round_trips_and_debug_hides_values() {
        let s = ClusterSecrets {
            oxide_host: "https://rack".into(),
            oxide_token: "oxide-token-value".into(),
            oxide_project: "p".into(),
            oxide_cluster: "demo".into(),
            k3s_token: "k3s-token-value".into(),
            k3s_agent_token: "agent-token-value".into(),
            ssh_public_key: "ssh-ed25519 AAAA".into(),
            user_ssh_public_key: None,
            tailscale_auth_key: None,
            oxide_token_id: Some("5a1e0000-0000-4000-8000-000000000001".into()),
        };
        assert_eq!(ClusterSecrets::from_map(&s.to_map()), Ok(s.clone()));
        let tokens = webhook::WebhookTokens {
            token: "hook-token-value".into(),
            read_token: Some("read-token-value".into()),
        };
        assert_eq!(
            webhook::WebhookTokens::from_map(&tokens.to_map()),
            Some(tokens.clone())
        );
        let dbg = format!("{s:?} {tokens:?}");
        for secret in [
            "oxide-token-value",
            "k3s-token-value",
            "agent-token-value",
            "PRIVATE",
            "hook-token-value",
            "read-token-value",
        ] {
            assert!(!dbg.contains(secret), "{dbg}");
        }
    }

    #[test]
    fn missing_key_is_named() {
        let mut m = BTreeMap::new();
        m.insert(keys::OXIDE_HOST.to_owned(), b"h".to_vec());
        let e = ClusterSecrets::from_map(&m).expect_err("incomplete");
        assert_eq!(e.key, keys::OXIDE_TOKEN);
    }
}
