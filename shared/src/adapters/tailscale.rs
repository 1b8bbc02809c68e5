//! Tailscale: the names and defaults the nodes join a tailnet with, and the one Tailscale API
//! call the controller makes — listing the tailnet's devices to find a VM's tailnet address.
//!
//! This module owns the Tailscale vocabulary (tags, the device list's wire format, the choice
//! of a device for a hostname) and the HTTP client for `GET /api/v2/tailnet/{tailnet}/devices`.
//! What the VMs run to join is rendered by [`crate::render::cloud_init`]; when bootstrap uses the
//! tailnet address is decided by the bootstrap workflow.
//!
//! Two keys are involved and they are kept apart: the *auth key* lets VMs join the tailnet and
//! is stored in the cluster Secret (reconcile needs it for new members); the *API key* only
//! lists devices, is used by bootstrap on the person's machine and is never stored.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Deserialize;

pub use crate::domain::spec::tailscale::{DEFAULT_TAG, check_key, check_tag, normalize_tag};

/// Base URL of the Tailscale API.
pub const DEFAULT_API_URL: &str = "https://api.tailscale.com";

/// A secret string (an auth key or API key): `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        SecretString(value.into())
    }

    /// The value, for the one place that must send or store it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for SecretString {
    fn from(value: String) -> Self {
        SecretString(value)
    }
}

/// One device of `GET /api/v2/tailnet/{tailnet}/devices`, the fields used here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The machine's OS hostname (our instance name).
    #[serde(default)]
    pub hostname: String,
    /// MagicDNS name (`host.tailnet.ts.net`; `host-1...` when the hostname was taken).
    #[serde(default)]
    pub name: String,
    /// Tailnet addresses, IPv4 and IPv6.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// RFC 3339 time the device was added.
    #[serde(default)]
    pub created: Option<String>,
    /// RFC 3339 time the device was last connected.
    #[serde(default)]
    pub last_seen: Option<String>,
    /// ACL tags of the device.
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Deserialize)]
struct DeviceList {
    #[serde(default)]
    devices: Vec<Device>,
}

fn time(s: Option<&String>) -> Option<chrono::DateTime<chrono::Utc>> {
    s.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// The IPv4 tailnet address of the device called `hostname`. A VM that was recreated under
/// the same name can leave an older device behind (until an ephemeral key's cleanup removes
/// it), so the most recently seen (then most recently created) one wins.
pub fn pick_ipv4(devices: &[Device], hostname: &str) -> Option<Ipv4Addr> {
    devices
        .iter()
        .filter(|d| d.hostname.eq_ignore_ascii_case(hostname))
        .filter_map(|d| {
            let v4 = d
                .addresses
                .iter()
                .find_map(|a| a.parse::<Ipv4Addr>().ok())?;
            Some(((time(d.last_seen.as_ref()), time(d.created.as_ref())), v4))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, ip)| ip)
}

/// Why the device list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TailscaleError {
    /// The base URL is not an absolute http(s) URL.
    #[error("{url:?} is not an http(s) base URL like {DEFAULT_API_URL}")]
    BadUrl {
        /// What was given.
        url: String,
    },
    /// 401/403: the API key is wrong, expired, or lacks the devices scope.
    #[error(
        "the Tailscale API refused the API key (HTTP {status}); it needs to be a valid access token allowed to list devices"
    )]
    Unauthorized {
        /// The status.
        status: u16,
    },
    /// 404: no such tailnet for this key.
    #[error("the Tailscale API knows no tailnet {tailnet:?} for this API key (HTTP 404)")]
    UnknownTailnet {
        /// The tailnet asked for.
        tailnet: String,
    },
    /// Any other unexpected status.
    #[error("the Tailscale API answered HTTP {status} listing the devices of {tailnet:?}")]
    Status {
        /// The status.
        status: u16,
        /// The tailnet.
        tailnet: String,
    },
    /// No answer (DNS, connect, timeout).
    #[error("cannot reach the Tailscale API at {base}")]
    Transport {
        /// The base URL.
        base: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// An answer that is not a device list.
    #[error("the Tailscale API's device list is not the expected JSON")]
    Decode(#[source] serde_json::Error),
}

impl TailscaleError {
    /// Errors only a person can fix (wrong key, tailnet or URL): retrying does not help.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            TailscaleError::BadUrl { .. }
                | TailscaleError::Unauthorized { .. }
                | TailscaleError::UnknownTailnet { .. }
        )
    }
}

/// A client for the Tailscale devices API of one tailnet. `Debug` hides the key.
#[derive(Clone)]
pub struct TailscaleApi {
    base: String,
    devices_url: reqwest::Url,
    tailnet: String,
    api_key: SecretString,
    http: reqwest::Client,
}

impl std::fmt::Debug for TailscaleApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailscaleApi")
            .field("base", &self.base)
            .field("tailnet", &self.tailnet)
            .finish_non_exhaustive()
    }
}

/// `base_url` as the API's base: an absolute http(s) URL with a host and no query.
fn base(base_url: &str) -> Result<reqwest::Url, TailscaleError> {
    let bad = || TailscaleError::BadUrl {
        url: base_url.to_owned(),
    };
    let url = reqwest::Url::parse(base_url).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        || url.query().is_some()
    {
        return Err(bad());
    }
    Ok(url)
}

/// Checks that `base_url` can be the API's base URL (what [`TailscaleApi::new`] refuses as
/// [`TailscaleError::BadUrl`]), without building a client.
pub fn check_base_url(base_url: &str) -> Result<(), TailscaleError> {
    base(base_url).map(drop)
}

impl TailscaleApi {
    /// A client for `tailnet` (`-` is the API key's own tailnet) at `base_url`. No I/O.
    pub fn new(
        base_url: &str,
        tailnet: &str,
        api_key: SecretString,
    ) -> Result<TailscaleApi, TailscaleError> {
        let bad = || TailscaleError::BadUrl {
            url: base_url.to_owned(),
        };
        let mut url = base(base_url)?;
        url.path_segments_mut()
            .map_err(|_| bad())?
            .pop_if_empty()
            .extend(["api", "v2", "tailnet", tailnet, "devices"]);
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .user_agent(concat!("oxide-controller/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| TailscaleError::Transport {
                base: base_url.to_owned(),
                source,
            })?;
        Ok(TailscaleApi {
            base: base_url.to_owned(),
            devices_url: url,
            tailnet: tailnet.to_owned(),
            api_key,
            http,
        })
    }

    /// The tailnet this client lists.
    pub fn tailnet(&self) -> &str {
        &self.tailnet
    }

    /// Every device of the tailnet.
    pub async fn devices(&self) -> Result<Vec<Device>, TailscaleError> {
        let response = self
            .http
            .get(self.devices_url.clone())
            .bearer_auth(self.api_key.expose())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|source| TailscaleError::Transport {
                base: self.base.clone(),
                source: source.without_url(),
            })?;
        let status = response.status().as_u16();
        match status {
            200 => {}
            401 | 403 => return Err(TailscaleError::Unauthorized { status }),
            404 => {
                return Err(TailscaleError::UnknownTailnet {
                    tailnet: self.tailnet.clone(),
                });
            }
            _ => {
                return Err(TailscaleError::Status {
                    status,
                    tailnet: self.tailnet.clone(),
                });
            }
        }
        let body = response
            .bytes()
            .await
            .map_err(|source| TailscaleError::Transport {
                base: self.base.clone(),
                source: source.without_url(),
            })?;
        let list: DeviceList = serde_json::from_slice(&body).map_err(TailscaleError::Decode)?;
        Ok(list.devices)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn device(host: &str, addrs: &[&str], seen: &str) -> Device {
        Device {
            hostname: host.into(),
            name: format!("{host}.example.ts.net"),
            addresses: addrs.iter().map(|a| a.to_string()).collect(),
            created: Some("2025-01-01T00:00:00Z".into()),
            last_seen: Some(seen.into()),
            tags: vec![DEFAULT_TAG.into()],
        }
    }

    #[test]
    fn tags_are_normalized_and_checked() {
        assert_eq!(normalize_tag("ainekko-k8s-node"), DEFAULT_TAG);
        assert_eq!(normalize_tag("tag:k8s"), "tag:k8s");
        assert!(check_tag(DEFAULT_TAG).is_ok());
        for bad in ["tag:", "tag:1abc", "tag:a b", "tag:a_b", "k8s"] {
            assert!(check_tag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_must_be_one_word() {
        assert!(check_key("tskey-auth-abc123").is_ok());
        for bad in ["", "a b", "a\nb"] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_devices_ipv4_address_is_picked_by_hostname_newest_first() {
        let devices = vec![
            device(
                "demo-cp-aaaaa",
                &["fd7a:115c:a1e0::1", "100.64.0.1"],
                "2025-01-02T00:00:00Z",
            ),
            device("demo-cp-bbbbb", &["100.64.0.2"], "2025-01-02T00:00:00Z"),
            device("demo-cp-aaaaa", &["100.64.0.9"], "2025-01-03T00:00:00Z"),
            device(
                "demo-cp-ccccc",
                &["fd7a:115c:a1e0::3"],
                "2025-01-03T00:00:00Z",
            ),
        ];
        assert_eq!(
            pick_ipv4(&devices, "demo-cp-aaaaa"),
            Some(Ipv4Addr::new(100, 64, 0, 9))
        );
        assert_eq!(
            pick_ipv4(&devices, "demo-cp-bbbbb"),
            Some(Ipv4Addr::new(100, 64, 0, 2))
        );
        assert_eq!(pick_ipv4(&devices, "demo-cp-ccccc"), None, "no IPv4");
        assert_eq!(pick_ipv4(&devices, "demo-cp-ddddd"), None);
    }

    #[test]
    fn the_device_list_wire_format_parses() {
        let body = r#"{"devices":[{"addresses":["100.87.74.78","fd7a:115c:a1e0::1"],
            "id":"92960230385","nodeId":"n292kg92CNTRL","user":"amelie@example.com",
            "name":"pangolin.tailfe8c.ts.net","hostname":"pangolin","clientVersion":"",
            "os":"linux","created":"2022-12-01T05:23:30Z","lastSeen":"2022-12-01T05:23:30Z",
            "authorized":true,"tags":["tag:prod"]}]}"#;
        let list: DeviceList = serde_json::from_str(body).unwrap();
        assert_eq!(list.devices[0].hostname, "pangolin");
        assert_eq!(
            pick_ipv4(&list.devices, "pangolin"),
            Some(Ipv4Addr::new(100, 87, 74, 78))
        );
    }

    #[test]
    fn the_devices_url_keeps_a_base_path_and_encodes_the_tailnet() {
        let api = TailscaleApi::new(
            "http://127.0.0.1:9/tailscale/",
            "me@example.com",
            SecretString::new("tskey-api-secret"),
        )
        .unwrap();
        assert_eq!(
            api.devices_url.as_str(),
            "http://127.0.0.1:9/tailscale/api/v2/tailnet/me@example.com/devices"
        );
        for bad in [
            "api.tailscale.com",
            "ftp://x",
            "https://x/?a=b",
            "mailto:a@b",
        ] {
            assert!(
                matches!(
                    TailscaleApi::new(bad, "-", SecretString::new("k")),
                    Err(TailscaleError::BadUrl { .. })
                ),
                "{bad}"
            );
        }
        assert!(!format!("{api:?}").contains("tskey-api-secret"));
    }
}
