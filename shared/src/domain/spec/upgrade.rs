//! The upgrade vocabulary of `spec.yaml`: the `upgrade:` block and k3s release versions as
//! the version gate compares them. The gate and the roll order are
//! [`crate::domain::upgrade`].

use serde::{Deserialize, Serialize};

/// How a change of `k3s.version` is rolled out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeSpec {
    /// Intermediate releases the control plane walks through, in order, when `k3s.version`
    /// is more than one minor above what the servers run (one per skipped minor).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    /// Worker pools upgraded at once, in spec order, once every server runs the target.
    #[serde(default = "one")]
    pub worker_pool_concurrency: u32,
    /// APIs the pre-flight lets through although a server still serves requests for them and
    /// the target release removes them, as `group/version/resource` (`version/resource` for
    /// the core group), e.g. `flowcontrol.apiserver.k8s.io/v1beta3/flowschemas`: the explicit
    /// override of [`crate::domain::upgrade::preflight`]'s deprecated-API check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_removed_apis: Vec<String>,
    /// How long every server's apiserver must have run before a roll to a newer minor, in
    /// seconds (default a day): the deprecated-API gauge the pre-flight reads is kept per
    /// apiserver process and starts empty when k3s restarts, so a client that calls a removed
    /// API once a day is seen only by a process that has run a day. `0` turns the check off.
    #[serde(default = "one_day", skip_serializing_if = "is_one_day")]
    pub api_history_seconds: u64,
    /// The k3s release channel the cluster follows: `stable`, `latest` or a minor such as
    /// `v1.33` (k3s's channels). A newer patch of the minor the cluster runs becomes
    /// `k3s.version` inside a maintenance window; a newer minor is only reported (see
    /// [`crate::domain::upgrade::channel`]). Absent: no channel is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The channel server (`<channel_url>/<channel>` answers a redirect to the release), for
    /// mirrors and sites without internet access. Default k3s's own.
    #[serde(
        default = "default_channel_url",
        skip_serializing_if = "is_default_channel_url"
    )]
    pub channel_url: String,
}

/// k3s's channel server (install.sh's `INSTALL_K3S_CHANNEL_URL` default).
pub const K3S_CHANNEL_URL: &str = "https://update.k3s.io/v1-release/channels";

fn default_channel_url() -> String {
    K3S_CHANNEL_URL.to_owned()
}

fn is_default_channel_url(url: &str) -> bool {
    url == K3S_CHANNEL_URL
}

fn one() -> u32 {
    1
}

/// [`UpgradeSpec::api_history_seconds`]'s default: a daily CronJob's period.
pub const DEFAULT_API_HISTORY_SECONDS: u64 = 24 * 60 * 60;

fn one_day() -> u64 {
    DEFAULT_API_HISTORY_SECONDS
}

fn is_one_day(v: &u64) -> bool {
    *v == DEFAULT_API_HISTORY_SECONDS
}

impl Default for UpgradeSpec {
    fn default() -> Self {
        UpgradeSpec {
            path: Vec::new(),
            worker_pool_concurrency: 1,
            allow_removed_apis: Vec::new(),
            api_history_seconds: DEFAULT_API_HISTORY_SECONDS,
            channel: None,
            channel_url: default_channel_url(),
        }
    }
}

impl UpgradeSpec {
    /// The defaults (left out of the YAML the product writes).
    pub fn is_default(&self) -> bool {
        *self == UpgradeSpec::default()
    }

    /// Structural checks (the comparison with what runs is the gate's).
    pub fn validate(&self, err: &mut impl FnMut(String, String)) {
        if self.worker_pool_concurrency == 0 {
            err(
                "upgrade.worker_pool_concurrency".into(),
                "must be at least 1".into(),
            );
        }
        for (i, api) in self.allow_removed_apis.iter().enumerate() {
            let parts: Vec<&str> = api.split('/').collect();
            if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.trim().is_empty()) {
                err(
                    format!("upgrade.allow_removed_apis[{i}]"),
                    format!(
                        "{api:?} is not group/version/resource (version/resource for the core group), like flowcontrol.apiserver.k8s.io/v1beta3/flowschemas"
                    ),
                );
            }
        }
        if let Some(c) = &self.channel
            && !is_channel_name(c)
        {
            err(
                "upgrade.channel".into(),
                format!(
                    "{c:?} is not a k3s release channel this controller follows: stable, latest, or a minor like v1.33"
                ),
            );
        }
        if crate::domain::spec::check_installer_url(&self.channel_url).is_err() {
            err(
                "upgrade.channel_url".into(),
                format!(
                    "{:?} must be an http(s):// URL without quotes, spaces or $, like {K3S_CHANNEL_URL}",
                    self.channel_url
                ),
            );
        }
        for (i, v) in self.path.iter().enumerate() {
            if K3sVersion::parse(v).is_none() {
                err(
                    format!("upgrade.path[{i}]"),
                    format!("{v:?} is not a k3s release like v1.33.4+k3s1"),
                );
            }
        }
    }
}

/// `stable`, `latest`, or `vMAJOR.MINOR` (k3s's channels without the `testing` ones, which
/// name release candidates: k3s-io/k3s `channel.yaml`).
fn is_channel_name(c: &str) -> bool {
    if matches!(c, "stable" | "latest") {
        return true;
    }
    let digits = |p: &str| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit());
    c.strip_prefix('v')
        .and_then(|r| r.split_once('.'))
        .is_some_and(|(major, minor)| digits(major) && digits(minor))
}

/// A k3s release version, `vMAJOR.MINOR.PATCH[-PRE][+k3sN]`, ordered as k3s-upgrade orders
/// them: semver first (a pre-release below its release), then the k3s build number `N`
/// (k3s-io/k3s-upgrade `scripts/upgrade.sh` `compare_versions`, then its build check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K3sVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// Semver pre-release (`rc1`), if any.
    pub pre: Option<String>,
    /// The `+k3sN` build number (0 when absent).
    pub build: u64,
}

impl K3sVersion {
    /// Parses `v1.34.1+k3s1` (also `v1.34.1`, `v1.34.1-rc1+k3s2`); None for anything else.
    pub fn parse(s: &str) -> Option<K3sVersion> {
        let rest = s.strip_prefix('v')?;
        let (core_pre, build) = match rest.split_once('+') {
            Some((c, b)) => (c, b.strip_prefix("k3s")?.parse().ok()?),
            None => (rest, 0),
        };
        let (core, pre) = match core_pre.split_once('-') {
            Some((c, p)) if !p.is_empty() => (c, Some(p.to_owned())),
            Some(_) => return None,
            None => (core_pre, None),
        };
        let mut parts = core.split('.');
        let mut num = || -> Option<u64> {
            let p = parts.next()?;
            (!p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                .then(|| p.parse().ok())
                .flatten()
        };
        let (major, minor, patch) = (num()?, num()?, num()?);
        if parts.next().is_some() {
            return None;
        }
        Some(K3sVersion {
            major,
            minor,
            patch,
            pre,
            build,
        })
    }

    /// Minors from `self` up to `other` (negative when `other` is older), across majors as
    /// Kubernetes numbers them (1.x only in practice; another major counts as far away).
    pub fn minors_to(&self, other: &K3sVersion) -> i64 {
        if self.major != other.major {
            return if other.major > self.major {
                i64::MAX / 2
            } else {
                i64::MIN / 2
            };
        }
        i64::try_from(other.minor).unwrap_or(i64::MAX / 2)
            - i64::try_from(self.minor).unwrap_or(i64::MAX / 2)
    }
}

impl Ord for K3sVersion {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            // A release is above its pre-releases (semver §11).
            .then_with(|| match (&self.pre, &other.pre) {
                (None, None) => std::cmp::Ordering::Equal,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(_), None) => std::cmp::Ordering::Less,
                (Some(a), Some(b)) => a.cmp(b),
            })
            .then_with(|| self.build.cmp(&other.build))
    }
}

impl PartialOrd for K3sVersion {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Display for K3sVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)?;
        if let Some(p) = &self.pre {
            write!(f, "-{p}")?;
        }
        if self.build > 0 {
            write!(f, "+k3s{}", self.build)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::domain::spec::{ClusterSpec, SpecLoadError};

    fn with(extra: &str) -> Result<ClusterSpec, SpecLoadError> {
        let mut yaml = ClusterSpec::new("demo", "demo", "ubuntu", 3, 2).to_yaml();
        yaml.push_str(extra);
        ClusterSpec::from_yaml(&yaml)
    }

    fn fields(e: SpecLoadError) -> Vec<(String, String)> {
        match e {
            SpecLoadError::Invalid(errs) => {
                errs.0.into_iter().map(|e| (e.field, e.message)).collect()
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_channel_and_windows_parse_round_trip_and_stay_out_of_the_yaml_when_absent() {
        let plain = ClusterSpec::new("demo", "demo", "ubuntu", 3, 2);
        let yaml = plain.to_yaml();
        assert!(
            !yaml.contains("channel") && !yaml.contains("maintenance"),
            "{yaml}"
        );
        assert_eq!(plain.upgrade.channel, None);
        let spec = with(
            "upgrade:\n  channel: v1.33\n  channel_url: http://mirror.example/v1-release/channels\nmaintenance:\n  windows:\n  - cron: '0 2 * * sat'\n    duration: 4h\n    time_zone: Europe/Berlin\n",
        )
        .unwrap();
        assert_eq!(spec.upgrade.channel.as_deref(), Some("v1.33"));
        assert_eq!(spec.maintenance.windows.len(), 1);
        let again = ClusterSpec::from_yaml(&spec.to_yaml()).unwrap();
        assert_eq!(again, spec);
        let stable = with("upgrade:\n  channel: stable\n").unwrap();
        assert_eq!(stable.upgrade.channel_url, super::K3S_CHANNEL_URL);
        assert!(!stable.to_yaml().contains("channel_url"));
        assert!(with("upgrade:\n  channel: latest\n").is_ok());
    }

    #[test]
    fn a_channel_this_controller_does_not_follow_is_refused_naming_the_field() {
        for bad in [
            "testing",
            "v1.33-testing",
            "v1.33.4+k3s1",
            "1.33",
            "v1",
            "Stable",
            "",
        ] {
            let errs = fields(with(&format!("upgrade:\n  channel: '{bad}'\n")).unwrap_err());
            assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
            assert_eq!(errs[0].0, "upgrade.channel");
            assert!(
                errs[0].1.contains("stable, latest, or a minor like v1.33"),
                "{errs:?}"
            );
        }
        let errs =
            fields(with("upgrade:\n  channel: stable\n  channel_url: ftp://x\n").unwrap_err());
        assert_eq!(errs[0].0, "upgrade.channel_url");
        assert!(
            errs[0]
                .1
                .contains("like https://update.k3s.io/v1-release/channels")
        );
    }

    #[test]
    fn bad_windows_are_refused_naming_each_field() {
        let errs = fields(
            with("maintenance:\n  windows:\n  - cron: '0 2 * *'\n    duration: 4\n    time_zone: Nowhere/Land\n")
                .unwrap_err(),
        );
        let names: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            names,
            [
                "maintenance.windows[0].cron",
                "maintenance.windows[0].time_zone",
                "maintenance.windows[0].duration"
            ],
            "{errs:?}"
        );
    }
}
