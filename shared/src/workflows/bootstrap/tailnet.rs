//! Tailscale in bootstrap: the `--tailscale-*` flags (checked together, before any API call),
//! what they put in the spec and the Secret, and finding the first control plane's tailnet
//! address when bootstrap is to reach it over the tailnet.
//!
//! The rule for reaching the first control plane ([`reach_over_tailnet`]): over the tailnet
//! when Tailscale is configured and the VMs have no external IP of their own
//! (`--external-ip none`, spec `nodes.external_ip: none`). The API floating IP is created and
//! attached all the same — joining members use it as their server URL inside the rack — but
//! bootstrap does not assume the machine it runs on can reach it: a cluster built without
//! external addresses is meant to be reached over the tailnet, and its floating IP may come
//! from a pool routed only inside the datacenter. In that mode the readiness wait, SSH and the
//! kubeconfig's server all use the tailnet IPv4 address of the VM holding the floating IP,
//! found by hostname (= instance name) through the Tailscale devices API. With ephemeral
//! external IPs the nodes still join the tailnet, and bootstrap uses the floating IP as it
//! does without Tailscale.

use std::net::IpAddr;
use std::path::Path;

use tokio::time::Instant;
use tracing::info;

use crate::adapters::tailscale::{self, SecretString, TailscaleError};
use crate::domain::spec::{ClusterSpec, ExternalIpMode, TailscaleSpec};

use super::{BootstrapError, Connect, Tailnet, progress};
use crate::workflows::error::{self, message};

/// Environment variables read for the API key and tailnet when the flags are not given (the
/// names the Tailscale Terraform provider uses). Only consulted once Tailscale is switched
/// on by an auth key, so a shell that exports them for other tools changes nothing.
pub const ENV_API_KEY: &str = "TAILSCALE_API_KEY";
/// See [`ENV_API_KEY`].
pub const ENV_TAILNET: &str = "TAILSCALE_TAILNET";

/// The `--tailscale-*` flags as given (values may be `file:PATH`). `Debug` hides the keys.
#[derive(Debug, Clone, Default)]
pub struct TailscaleFlags {
    /// `--tailscale-auth-key`: switches Tailscale on.
    pub auth_key: Option<SecretString>,
    /// `--tailscale-api-key`.
    pub api_key: Option<SecretString>,
    /// `--tailscale-tailnet`.
    pub tailnet: Option<String>,
    /// `--tailscale-tag` (`NAME` or `tag:NAME`).
    pub tag: Option<String>,
    /// `--tailscale-api-url`.
    pub api_url: Option<String>,
    /// `--tailscale-up-timeout` (checked with the spec as `tailscale.up_timeout_seconds`).
    pub up_timeout_seconds: Option<u32>,
    /// `$TAILSCALE_API_KEY`, used when `api_key` is absent.
    pub env_api_key: Option<SecretString>,
    /// `$TAILSCALE_TAILNET`, used when `tailnet` is absent.
    pub env_tailnet: Option<String>,
}

impl TailscaleFlags {
    /// Adds the environment fallbacks ([`ENV_API_KEY`], [`ENV_TAILNET`]) of this process.
    pub fn with_process_env(mut self) -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        self.env_api_key = var(ENV_API_KEY).map(SecretString::new);
        self.env_tailnet = var(ENV_TAILNET);
        self
    }
}

/// Checked Tailscale settings.
#[derive(Debug, Clone)]
pub(super) struct TailscaleAccess {
    /// Goes into the Secret and every node's user-data.
    pub auth_key: SecretString,
    /// The API's base URL (checked), the tailnet, and the key that lists its devices; the
    /// key is never stored. The client is opened through [`Connect::tailnet`].
    pub api_url: String,
    pub tailnet: String,
    pub api_key: SecretString,
}

impl TailscaleAccess {
    /// The Tailscale API client, from the connector bootstrap was handed.
    pub(super) fn open<C: Connect>(&self, connect: &C) -> Result<C::Tailnet, BootstrapError> {
        connect
            .tailnet(&self.api_url, &self.tailnet, self.api_key.clone())
            .map_err(|e| BootstrapError::input("--tailscale-api-url", e))
    }
}

/// The spec's `tailscale` section for these flags (validated with the rest of the spec).
pub(super) fn spec_for(flags: &TailscaleFlags) -> Option<TailscaleSpec> {
    flags.auth_key.as_ref().map(|_| TailscaleSpec {
        tag: flags
            .tag
            .as_deref()
            .map(crate::domain::spec::tailscale::normalize_tag)
            .unwrap_or_else(|| crate::domain::spec::tailscale::DEFAULT_TAG.to_owned()),
        up_timeout_seconds: flags
            .up_timeout_seconds
            .unwrap_or(crate::domain::spec::DEFAULT_TAILSCALE_UP_TIMEOUT),
        ..TailscaleSpec::default()
    })
}

/// Checks the flags as a whole: auth key, API key and tailnet come together; tag and API URL
/// mean nothing without them. Reads `file:` values. No network.
pub(super) fn validate_flags(
    flags: &TailscaleFlags,
    home: Option<&Path>,
) -> Result<Option<TailscaleAccess>, BootstrapError> {
    let read = |flag: &'static str, v: &SecretString| -> Result<SecretString, BootstrapError> {
        let value = super::value_or_file(flag, v.expose(), home)?;
        crate::domain::spec::tailscale::check_key(&value)
            .map_err(|m| BootstrapError::input(flag, message(m)))?;
        Ok(SecretString::new(value))
    };
    let Some(auth_key) = &flags.auth_key else {
        // Without an auth key nothing joins a tailnet; the other flags would be ignored.
        for (given, flag) in [
            (flags.api_key.is_some(), "--tailscale-api-key"),
            (flags.tailnet.is_some(), "--tailscale-tailnet"),
            (flags.tag.is_some(), "--tailscale-tag"),
            (flags.api_url.is_some(), "--tailscale-api-url"),
            (flags.up_timeout_seconds.is_some(), "--tailscale-up-timeout"),
        ] {
            if given {
                return Err(BootstrapError::input(
                    "--tailscale-auth-key",
                    message(format!(
                        "missing; {flag} is only used with --tailscale-auth-key, --tailscale-api-key and --tailscale-tailnet together"
                    )),
                ));
            }
        }
        return Ok(None);
    };
    let auth_key = read("--tailscale-auth-key", auth_key)?;
    let api_key = match flags.api_key.as_ref().or(flags.env_api_key.as_ref()) {
        Some(k) => read("--tailscale-api-key", k)?,
        None => {
            return Err(BootstrapError::input(
                "--tailscale-api-key",
                message(format!(
                    "missing (or ${ENV_API_KEY}); with --tailscale-auth-key bootstrap needs an API access token to find the first control plane in the tailnet"
                )),
            ));
        }
    };
    let tailnet = flags
        .tailnet
        .clone()
        .or_else(|| flags.env_tailnet.clone())
        .map(|t| t.trim().to_owned())
        .ok_or_else(|| {
            BootstrapError::input(
                "--tailscale-tailnet",
                message(format!(
                    "missing (or ${ENV_TAILNET}); with --tailscale-auth-key bootstrap needs the tailnet name (e.g. example.com, or - for the API key's own tailnet)"
                )),
            )
        })?;
    if tailnet.is_empty()
        || tailnet
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err(BootstrapError::input(
            "--tailscale-tailnet",
            message(format!(
                "{tailnet:?} is not a tailnet name (e.g. example.com, or -)"
            )),
        ));
    }
    let url = flags
        .api_url
        .as_deref()
        .map(str::trim)
        .unwrap_or(tailscale::DEFAULT_API_URL);
    tailscale::check_base_url(url).map_err(|e| BootstrapError::input("--tailscale-api-url", e))?;
    Ok(Some(TailscaleAccess {
        auth_key,
        api_url: url.to_owned(),
        tailnet,
        api_key,
    }))
}

/// A Tailscale API error as bootstrap reports it: the person's to fix (exit 2, naming the
/// flag) or worth a re-run (exit 1).
fn api_error(step: &'static str, e: TailscaleError) -> BootstrapError {
    let flag = match e {
        TailscaleError::Unauthorized { .. } => "--tailscale-api-key",
        TailscaleError::UnknownTailnet { .. } => "--tailscale-tailnet",
        TailscaleError::BadUrl { .. } => "--tailscale-api-url",
        _ => return BootstrapError::step(step, e),
    };
    BootstrapError::input(flag, e)
}

/// One device list, before any VM exists: a wrong API key or tailnet is reported now rather
/// than after the first control plane was created.
pub(super) async fn probe<T: Tailnet>(api: &T) -> Result<(), BootstrapError> {
    let devices = api
        .devices()
        .await
        .map_err(|e| api_error(super::STEP_VALIDATE, e))?;
    info!(
        step = super::STEP_VALIDATE,
        tailnet = api.name(),
        devices = devices.len(),
        "the Tailscale API answers"
    );
    Ok(())
}

/// Whether bootstrap reaches the first control plane over the tailnet (see the module docs).
pub(super) fn reach_over_tailnet(spec: &ClusterSpec, access: Option<&TailscaleAccess>) -> bool {
    access.is_some() && spec.tailscale.is_some() && spec.nodes.external_ip == ExternalIpMode::None
}

/// Waits for `instance` to appear in the tailnet and returns its IPv4 address. Stops early
/// when its console shows that the node setup failed (e.g. `tailscale up` was refused).
pub(super) async fn tailnet_address<T: Tailnet, R: crate::ports::rack::Rack>(
    api: &T,
    rack: &R,
    instance: &str,
    deadline: Instant,
    tty: bool,
) -> Result<IpAddr, BootstrapError> {
    let step = "wait-api";
    let tailnet = api.name();
    let mut spinner = progress::Spinner::new(
        step,
        format!("waiting for {instance} to join tailnet {tailnet}"),
        tty,
    );
    let mut polls: u64 = 0;
    loop {
        let detail = match api.device_ipv4(instance).await {
            Ok(Some(ip)) => {
                spinner.done();
                info!(step, %instance, tailnet, %ip, "found the tailnet address");
                return Ok(IpAddr::V4(ip));
            }
            Ok(None) => "not in the tailnet yet".to_owned(),
            Err(e) if e.is_config() => {
                spinner.done();
                return Err(api_error(step, e));
            }
            Err(e) => error::chain(&e),
        };
        spinner.tick(&detail);
        polls += 1;
        if polls % 8 == 1
            && let Err(e) = super::setup_not_failed(rack, instance, step).await
        {
            spinner.done();
            return Err(e);
        }
        if Instant::now() >= deadline {
            spinner.done();
            return Err(BootstrapError::step(
                step,
                message(format!(
                    "{instance} did not join tailnet {tailnet} in time (last: {detail}); its serial console shows what tailscale said; re-run bootstrap to keep waiting"
                )),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn flags() -> TailscaleFlags {
        TailscaleFlags {
            auth_key: Some(SecretString::new("tskey-auth-x")),
            api_key: Some(SecretString::new("tskey-api-x")),
            tailnet: Some("example.com".into()),
            ..TailscaleFlags::default()
        }
    }

    fn message(f: &TailscaleFlags) -> String {
        match validate_flags(f, None) {
            Err(e @ BootstrapError::Input { .. }) => error::chain(&e),
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn the_three_come_together_and_the_missing_flag_is_named() {
        assert!(validate_flags(&flags(), None).unwrap().is_some());
        assert!(
            validate_flags(&TailscaleFlags::default(), None)
                .unwrap()
                .is_none()
        );
        let m = message(&TailscaleFlags {
            api_key: None,
            ..flags()
        });
        assert!(m.starts_with("--tailscale-api-key: missing"), "{m}");
        let m = message(&TailscaleFlags {
            tailnet: None,
            ..flags()
        });
        assert!(m.starts_with("--tailscale-tailnet: missing"), "{m}");
        for f in [
            TailscaleFlags {
                auth_key: None,
                ..flags()
            },
            TailscaleFlags {
                tag: Some("k8s".into()),
                ..TailscaleFlags::default()
            },
            TailscaleFlags {
                api_url: Some("http://127.0.0.1:1".into()),
                ..TailscaleFlags::default()
            },
        ] {
            let m = message(&f);
            assert!(m.starts_with("--tailscale-auth-key: missing"), "{m}");
        }
    }

    #[test]
    fn the_environment_fills_in_only_once_an_auth_key_switches_tailscale_on() {
        let env_only = TailscaleFlags {
            env_api_key: Some(SecretString::new("tskey-api-env")),
            env_tailnet: Some("example.com".into()),
            ..TailscaleFlags::default()
        };
        assert!(validate_flags(&env_only, None).unwrap().is_none());
        let with_key = TailscaleFlags {
            auth_key: Some(SecretString::new("tskey-auth-x")),
            ..env_only
        };
        let access = validate_flags(&with_key, None).unwrap().unwrap();
        assert_eq!(access.tailnet, "example.com");
    }

    #[test]
    fn bad_values_name_their_flag_and_never_echo_a_key() {
        let m = message(&TailscaleFlags {
            auth_key: Some(SecretString::new("tskey-auth secret")),
            ..flags()
        });
        assert!(m.starts_with("--tailscale-auth-key:"), "{m}");
        assert!(!m.contains("secret"), "{m}");
        let m = message(&TailscaleFlags {
            api_url: Some("api.tailscale.com".into()),
            ..flags()
        });
        assert!(m.starts_with("--tailscale-api-url:"), "{m}");
        let m = message(&TailscaleFlags {
            tailnet: Some("a b".into()),
            ..flags()
        });
        assert!(m.starts_with("--tailscale-tailnet:"), "{m}");
        let m = message(&TailscaleFlags {
            auth_key: Some(SecretString::new("file:/nonexistent/ts-key")),
            ..flags()
        });
        assert!(m.starts_with("--tailscale-auth-key: cannot read"), "{m}");
    }

    #[test]
    fn the_tag_defaults_to_the_go_controllers_and_takes_either_form() {
        assert_eq!(spec_for(&TailscaleFlags::default()), None);
        assert_eq!(
            spec_for(&flags()).unwrap().tag,
            crate::domain::spec::tailscale::DEFAULT_TAG,
            "default"
        );
        for given in ["k8s", "tag:k8s"] {
            let f = TailscaleFlags {
                tag: Some(given.into()),
                ..flags()
            };
            assert_eq!(spec_for(&f).unwrap().tag, "tag:k8s");
        }
    }

    #[test]
    fn only_clusters_without_external_ips_are_reached_over_the_tailnet() {
        let access = validate_flags(&flags(), None).unwrap();
        let mut spec = ClusterSpec::new("demo", "demo", "img", 1, 0);
        spec.tailscale = spec_for(&flags());
        spec.nodes.external_ip = ExternalIpMode::None;
        assert!(reach_over_tailnet(&spec, access.as_ref()));
        assert!(!reach_over_tailnet(&spec, None));
        spec.nodes.external_ip = ExternalIpMode::Ephemeral;
        assert!(!reach_over_tailnet(&spec, access.as_ref()));
    }
}
