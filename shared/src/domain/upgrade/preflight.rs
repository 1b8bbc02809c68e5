//! The upgrade pre-flight (issue 33 item 2): what must hold before the first member of a new
//! `k3s.version` is created, checked once per target. Pure: the workflow reads each server's
//! `/metrics` (and whatever else a check needs) and hands the readings here; each check adds
//! the blockers it finds, so one more check is one more function called from [`evaluate`].
//!
//! Checks:
//! - every server is a Ready Node (the roll surges one server and removes an old one: it
//!   starts from a whole control plane);
//! - no API that the target removes is still requested: `apiserver_requested_deprecated_apis`
//!   on **every** server's `/metrics` (the gauge is per apiserver process, so one server's
//!   clients are invisible on another's), a sample whose `removed_release` is at most the
//!   target's minor blocks unless `upgrade.allow_removed_apis` lists it; a server whose
//!   metrics cannot be read blocks too (nothing is known of its clients);
//! - each release the roll installs is where the nodes' installer fetches it (the hash file
//!   install.sh downloads first), unless k3s is pre-installed in the image; and, for a release
//!   whose binary the spec pins (`k3s.binary_sha256`), the digest that hash file lists for
//!   `k3s` is the pinned one: otherwise every new node of that release would fail its setup at
//!   `k3s-install`, and the roll would create doomed VMs until its back-off stops it;
//! - before a roll to a newer minor, every server's apiserver has run at least
//!   `upgrade.api_history_seconds` (its `process_start_time_seconds`, from the same
//!   `/metrics`): the deprecated-API gauge lives in the process and starts empty with it
//!   (`k8s.io/apiserver` `metrics.go` registers it in memory only), so a server restarted an
//!   hour ago says nothing of a client that calls once a day. "No samples" is "clean" only
//!   after that long.
//!
//! Not here yet: the etcd member list equal to the servers (a planner check, another change),
//! a backup newer than the edit (backups do not exist yet).

use crate::domain::spec::ClusterSpec;
use crate::domain::spec::upgrade::K3sVersion;

/// The metric family: one sample per deprecated API the apiserver process served since it
/// started (`k8s.io/apiserver` `pkg/endpoints/metrics/metrics.go` `deprecatedRequestGauge`).
pub const DEPRECATED_APIS_METRIC: &str = "apiserver_requested_deprecated_apis";

/// When the process serving `/metrics` started, in Unix seconds: client_golang's process
/// collector, which `k8s.io/component-base` `metrics/legacyregistry` registers in every
/// Kubernetes component (k3s runs the apiserver in its own process, so it is k3s's start).
pub const PROCESS_START_METRIC: &str = "process_start_time_seconds";

/// The condition reason of a failed pre-flight: the issue's `UpgradeBlocked`, the same reason
/// as a version that does not install (the message says which: it starts `pre-flight:`).
pub const FAILED_REASON: &str = "UpgradeBlocked";

/// One sample of [`DEPRECATED_APIS_METRIC`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeprecatedApi {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    /// `MAJOR.MINOR`, empty when no removal is planned.
    pub removed_release: String,
}

impl DeprecatedApi {
    /// `group/version/resource`, `version/resource` for the core group: how findings name it
    /// and how `upgrade.allow_removed_apis` lists it.
    pub fn id(&self) -> String {
        if self.group.is_empty() {
            format!("{}/{}", self.version, self.resource)
        } else {
            format!("{}/{}/{}", self.group, self.version, self.resource)
        }
    }

    /// `(major, minor)` of the release that removes it.
    fn removed_in(&self) -> Option<(u64, u64)> {
        let (major, minor) = self.removed_release.split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    }
}

/// The samples of [`DEPRECATED_APIS_METRIC`] in a Prometheus text exposition (other families
/// and malformed lines are skipped).
pub fn deprecated_apis(metrics: &str) -> Vec<DeprecatedApi> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(DEPRECATED_APIS_METRIC)?.strip_prefix('{'))
        .filter_map(|rest| {
            let (labels, _value) = rest.rsplit_once('}')?;
            let mut api = DeprecatedApi::default();
            for (name, value) in labels_of(labels) {
                match name.as_str() {
                    "group" => api.group = value,
                    "version" => api.version = value,
                    "resource" => api.resource = value,
                    "subresource" => api.subresource = value,
                    "removed_release" => api.removed_release = value,
                    _ => {}
                }
            }
            Some(api)
        })
        .collect()
}

/// `name="value"` pairs of a label set (values may hold escaped quotes and commas).
fn labels_of(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim_start_matches([',', ' ']);
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((name.trim().to_owned(), value));
        rest = after[end..].trim_start_matches([',', ' ']);
    }
    out
}

/// What the workflow read for the pre-flight.
#[derive(Debug, Clone, Default)]
pub struct Readings {
    /// Each server (instance name) and its `/metrics` text, or why it could not be read.
    pub metrics: Vec<(String, Result<String, String>)>,
    /// Servers that are not Ready Nodes, with what they are (`joining`, `not_ready`, ...),
    /// and how many servers the spec wants against how many are Ready.
    pub servers_not_ready: Vec<(String, String)>,
    pub servers_ready: usize,
    pub servers_desired: usize,
    /// Each release the nodes will install (`k3s.version`, the `upgrade.path` steps) with
    /// its hash file's URL and the file's text, or why it could not be read (none with
    /// `install: preinstalled`).
    pub releases: Vec<(String, String, Result<String, String>)>,
    /// Why etcd's member list and the servers disagree (the planner's own check,
    /// [`crate::domain::plan::etcd_members_match`]), if they do.
    pub etcd_mismatch: Option<String>,
    /// The oldest `MAJOR.MINOR` the servers' Nodes run, when known: the history check applies
    /// only to a target of a newer minor (a patch release removes no API).
    pub servers_minor: Option<(u64, u64)>,
    /// When the readings were taken, in Unix seconds.
    pub now_unix: i64,
}

/// The value of the unlabelled gauge `family` in a Prometheus text exposition.
pub fn gauge(metrics: &str, family: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(family)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The blockers of the pre-flight for `spec`'s `k3s.version` (empty: it passed). Each names
/// what blocks and where; the deprecated-API ones also what to do.
pub fn evaluate(spec: &ClusterSpec, r: &Readings) -> Vec<String> {
    let mut out = Vec::new();
    servers_ready(r, &mut out);
    if let Some(why) = &r.etcd_mismatch {
        out.push(format!("etcd's members and the servers disagree: {why}"));
    }
    removed_apis(spec, r, &mut out);
    api_history(spec, r, &mut out);
    releases(spec, r, &mut out);
    out
}

/// Before a roll to a newer minor, every server's apiserver has run long enough for its
/// deprecated-API gauge to have seen the clients that call rarely.
fn api_history(spec: &ClusterSpec, r: &Readings, out: &mut Vec<String>) {
    let window = spec.upgrade.api_history_seconds;
    let Some(target) = K3sVersion::parse(&spec.k3s.version) else {
        return;
    };
    let newer_minor = r
        .servers_minor
        .is_none_or(|running| (target.major, target.minor) > running);
    if window == 0 || !newer_minor {
        return;
    }
    for (server, metrics) in &r.metrics {
        // An unreadable /metrics is already a blocker of its own (removed_apis).
        let Ok(text) = metrics else { continue };
        let Some(started) = gauge(text, PROCESS_START_METRIC) else {
            out.push(format!(
                "server {server}'s /metrics has no {PROCESS_START_METRIC}: how long its apiserver has seen its clients is unknown; set upgrade.api_history_seconds to 0 to roll without knowing"
            ));
            continue;
        };
        let started = started as i64;
        let ran = r.now_unix.saturating_sub(started).max(0) as u64;
        if ran < window {
            let ready = chrono::DateTime::from_timestamp(started.saturating_add(window as i64), 0)
                .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                .unwrap_or_default();
            out.push(format!(
                "server {server}'s apiserver started {} ago, less than upgrade.api_history_seconds ({}): a client that calls an API v{}.{} removes less often than that would not show yet; the check passes at {ready}, or lower upgrade.api_history_seconds (0 turns it off)",
                human(ran),
                human(window),
                target.major,
                target.minor
            ));
        }
    }
}

/// `90s`, `14m`, `5h12m`, `3d4h`.
fn human(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// Every release the roll installs is where the nodes fetch it, and a binary the spec pins
/// is the one that release lists.
fn releases(spec: &ClusterSpec, r: &Readings, out: &mut Vec<String>) {
    for (version, url, found) in &r.releases {
        let text = match found {
            Ok(text) => text,
            Err(why) => {
                out.push(format!(
                    "release {version} is not at {url} ({why}), where the nodes' installer fetches it; set a k3s release that exists"
                ));
                continue;
            }
        };
        // Unpinned (or pinned for other releases only, which validation and the member's
        // rendering refuse on their own): install.sh checks the binary against this file.
        let Ok(Some(pinned)) = spec.k3s_binary_sha256(version) else {
            continue;
        };
        // A file that lists no `k3s` says nothing against the pin (install.sh, which would
        // need the line, does not run its download with a pin).
        let Some(listed) = listed_sha256(text, K3S_BINARY_FILE) else {
            continue;
        };
        if !listed.eq_ignore_ascii_case(pinned) {
            out.push(format!(
                "k3s.binary_sha256[{version}] is {pinned} but the release's sha256sum-amd64.txt ({url}) lists {listed} for {K3S_BINARY_FILE}: every new node of {version} would fail its setup at k3s-install; correct the spec (compare with a second source) or the mirror (k3s.release_url)"
            ));
        }
    }
}

/// The amd64 binary's name in a release's hash file (install.sh's `k3s${SUFFIX}`, `SUFFIX`
/// empty on amd64).
pub const K3S_BINARY_FILE: &str = "k3s";

/// The digest a `sha256sum` listing (`<hex>  <file>` lines, as k3s's release workflow writes
/// `sha256sum-<arch>.txt`) gives for `file`: the first line whose name is `file` after one
/// blank, the digest up to the first blank, as install.sh's `download_hash` reads it
/// (`grep " k3s${SUFFIX}$"`, then `${HASH_EXPECTED%%[[:blank:]]*}`). A name with a directory
/// (`dist/artifacts/k3s`) is another file, as for that `grep`.
pub fn listed_sha256<'a>(listing: &'a str, file: &str) -> Option<&'a str> {
    listing.lines().find_map(|line| {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let head = line.strip_suffix(file)?.strip_suffix(' ')?;
        let digest = head.split([' ', '\t']).next()?;
        (!digest.is_empty()).then_some(digest)
    })
}

/// Every server a Ready Node, as many as the spec asks.
fn servers_ready(r: &Readings, out: &mut Vec<String>) {
    for (name, what) in &r.servers_not_ready {
        out.push(format!("server {name} is not a Ready Node ({what})"));
    }
    if r.servers_ready < r.servers_desired && r.servers_not_ready.is_empty() {
        out.push(format!(
            "{} of {} servers are Ready Nodes",
            r.servers_ready, r.servers_desired
        ));
    }
}

/// No API the target removes still requested on any server, unless allowed.
fn removed_apis(spec: &ClusterSpec, r: &Readings, out: &mut Vec<String>) {
    let Some(target) = K3sVersion::parse(&spec.k3s.version) else {
        return;
    };
    for (server, metrics) in &r.metrics {
        let text = match metrics {
            Ok(t) => t,
            Err(why) => {
                out.push(format!(
                    "cannot read {DEPRECATED_APIS_METRIC} from server {server}'s /metrics ({why}); the APIs its clients use are unknown"
                ));
                continue;
            }
        };
        let mut seen = std::collections::BTreeSet::new();
        for api in deprecated_apis(text) {
            let removed = api
                .removed_in()
                .filter(|(major, minor)| (*major, *minor) <= (target.major, target.minor));
            let Some((major, minor)) = removed else {
                continue;
            };
            let id = api.id();
            if spec.upgrade.allow_removed_apis.contains(&id) || !seen.insert(id.clone()) {
                continue;
            }
            out.push(format!(
                "{} {} removed in v{major}.{minor} still requested (server {server}); move its clients to a served version, or list {id:?} in upgrade.allow_removed_apis",
                api_group_version(&api),
                api.resource
            ));
        }
    }
}

/// `apps/v1beta1`, or `v1` for the core group.
fn api_group_version(api: &DeprecatedApi) -> String {
    if api.group.is_empty() {
        api.version.clone()
    } else {
        format!("{}/{}", api.group, api.version)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const METRICS: &str = "# HELP apiserver_request_total x\n# TYPE apiserver_request_total counter\napiserver_request_total{code=\"200\"} 5\n# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.\n# TYPE apiserver_requested_deprecated_apis gauge\napiserver_requested_deprecated_apis{group=\"apps\",removed_release=\"1.34\",resource=\"deployments\",subresource=\"\",version=\"v1beta1\"} 1\napiserver_requested_deprecated_apis{group=\"flowcontrol.apiserver.k8s.io\",removed_release=\"1.35\",resource=\"flowschemas\",subresource=\"status\",version=\"v1beta3\"} 1\napiserver_requested_deprecated_apis{group=\"\",removed_release=\"\",resource=\"componentstatuses\",subresource=\"\",version=\"v1\"} 1\n# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.70000000012e+09\n";

    /// [`METRICS`]'s process start, and the same line alone (a process that served nothing
    /// deprecated).
    const STARTED: i64 = 1_700_000_000;
    const QUIET: &str = "process_start_time_seconds 1.7e+09\n";
    const DAY: i64 = 86_400;

    fn spec(version: &str) -> ClusterSpec {
        let mut s = ClusterSpec::new("demo", "demo", "ubuntu", 3, 1);
        s.k3s.version = version.into();
        s
    }

    #[test]
    fn an_etcd_member_list_that_disagrees_with_the_servers_blocks() {
        let mut r = Readings {
            servers_ready: 3,
            servers_desired: 3,
            ..Readings::default()
        };
        assert!(evaluate(&spec("v1.34.1+k3s1"), &r).is_empty());
        r.etcd_mismatch = Some("etcd member demo-cp-x-0a1b2c3d has no server".into());
        let b = evaluate(&spec("v1.34.1+k3s1"), &r);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].contains("demo-cp-x-0a1b2c3d"), "{b:?}");
    }

    #[test]
    fn the_samples_are_read_with_their_labels() {
        let apis = deprecated_apis(METRICS);
        assert_eq!(apis.len(), 3, "{apis:?}");
        assert_eq!(apis[0].id(), "apps/v1beta1/deployments");
        assert_eq!(apis[1].subresource, "status");
        assert_eq!(apis[2].id(), "v1/componentstatuses");
    }

    #[test]
    fn an_api_the_target_removes_blocks_unless_allowed_and_unreadable_metrics_block() {
        let r = Readings {
            metrics: vec![
                ("demo-cp-a".into(), Ok(QUIET.into())),
                ("demo-cp-b".into(), Ok(METRICS.into())),
            ],
            servers_ready: 3,
            servers_desired: 3,
            servers_minor: Some((1, 33)),
            now_unix: STARTED + 2 * DAY,
            ..Readings::default()
        };
        // v1.33: nothing removed yet.
        assert!(evaluate(&spec("v1.33.5+k3s1"), &r).is_empty());
        // v1.34 removes apps/v1beta1 deployments, not flowschemas (1.35).
        let b = evaluate(&spec("v1.34.1+k3s1"), &r);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(
            b[0].starts_with(
                "apps/v1beta1 deployments removed in v1.34 still requested (server demo-cp-b)"
            ),
            "{b:?}"
        );
        let mut allowed = spec("v1.35.0+k3s1");
        allowed.upgrade.allow_removed_apis = vec!["apps/v1beta1/deployments".into()];
        let b = evaluate(&allowed, &r);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(b[0].contains("flowcontrol.apiserver.k8s.io/v1beta3 flowschemas removed in v1.35"));
        let unreadable = Readings {
            metrics: vec![("demo-cp-c".into(), Err("HTTP 403".into()))],
            ..r
        };
        let b = evaluate(&spec("v1.34.1+k3s1"), &unreadable);
        assert!(
            b[0].contains("demo-cp-c") && b[0].contains("HTTP 403"),
            "{b:?}"
        );
    }

    /// Audit day2-fidelity-4 P6: the gauge starts empty with the apiserver process, so a
    /// server that restarted recently says nothing yet of its rare clients.
    #[test]
    fn a_recently_restarted_apiserver_is_not_taken_for_one_without_deprecated_clients() {
        let r = |now: i64| Readings {
            metrics: vec![
                ("demo-cp-a".into(), Ok(QUIET.into())),
                ("demo-cp-b".into(), Ok(QUIET.into())),
            ],
            servers_ready: 3,
            servers_desired: 3,
            servers_minor: Some((1, 33)),
            now_unix: now,
            ..Readings::default()
        };
        let target = spec("v1.34.1+k3s1");
        // 90 minutes after the start: both servers block, each named, with when it passes.
        let b = evaluate(&target, &r(STARTED + 5400));
        assert_eq!(
            b,
            [
                "server demo-cp-a's apiserver started 90m ago, less than upgrade.api_history_seconds (24h0m): a client that calls an API v1.34 removes less often than that would not show yet; the check passes at 2023-11-15 22:13 UTC, or lower upgrade.api_history_seconds (0 turns it off)",
                "server demo-cp-b's apiserver started 90m ago, less than upgrade.api_history_seconds (24h0m): a client that calls an API v1.34 removes less often than that would not show yet; the check passes at 2023-11-15 22:13 UTC, or lower upgrade.api_history_seconds (0 turns it off)",
            ]
        );
        // A day on: clean.
        assert!(evaluate(&target, &r(STARTED + DAY)).is_empty());
        // A patch release removes nothing: no history needed.
        assert!(evaluate(&spec("v1.33.9+k3s1"), &r(STARTED + 60)).is_empty());
        // The operator's shorter window, or 0.
        let mut short = target.clone();
        short.upgrade.api_history_seconds = 3600;
        assert!(evaluate(&short, &r(STARTED + 5400)).is_empty());
        short.upgrade.api_history_seconds = 0;
        assert!(evaluate(&short, &r(STARTED)).is_empty());
        // Unknown Node versions: the check applies.
        let unknown = Readings {
            servers_minor: None,
            ..r(STARTED + 60)
        };
        assert_eq!(evaluate(&spec("v1.33.9+k3s1"), &unknown).len(), 2);
        // No process start in /metrics: nothing is known of how long it has watched.
        let silent = Readings {
            metrics: vec![("demo-cp-c".into(), Ok(String::new()))],
            ..r(STARTED + DAY)
        };
        let b = evaluate(&target, &silent);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(
            b[0].starts_with("server demo-cp-c's /metrics has no process_start_time_seconds"),
            "{b:?}"
        );
    }

    #[test]
    fn a_release_that_is_not_there_blocks() {
        let r = Readings {
            servers_ready: 3,
            servers_desired: 3,
            releases: vec![(
                "v1.34.99+k3s1".into(),
                "http://r/download/v1.34.99+k3s1/sha256sum-amd64.txt".into(),
                Err("HTTP 404".into()),
            )],
            ..Readings::default()
        };
        assert_eq!(
            evaluate(&spec("v1.34.99+k3s1"), &r),
            [
                "release v1.34.99+k3s1 is not at http://r/download/v1.34.99+k3s1/sha256sum-amd64.txt (HTTP 404), where the nodes' installer fetches it; set a k3s release that exists"
            ]
        );
    }

    /// A release's hash file as k3s's release workflow assembles it: the air-gap image
    /// tarballs' lines, then the binary's (`sha256sum dist/artifacts/k3s | sed
    /// 's|dist/artifacts/||'`).
    fn listing(k3s: &str) -> String {
        format!(
            "{a}  k3s-airgap-images-amd64.tar.gz\n{a}  k3s-airgap-images-amd64.tar\n{a}  k3s-airgap-images-amd64.tar.zst\n{k3s}  k3s\n",
            a = "1".repeat(64),
        )
    }

    #[test]
    fn the_digest_listed_for_a_file_is_read_as_install_sh_reads_it() {
        let k3s = "ab".repeat(32);
        let text = listing(&k3s);
        assert_eq!(listed_sha256(&text, "k3s"), Some(k3s.as_str()));
        assert_eq!(
            listed_sha256(&text, "k3s-airgap-images-amd64.tar"),
            Some("1".repeat(64).as_str())
        );
        assert_eq!(listed_sha256("", "k3s"), None);
        // Another file whose name ends in `k3s` is not it (install.sh's `grep " k3s$"`).
        assert_eq!(
            listed_sha256(&format!("{k3s}  dist/artifacts/k3s\n"), "k3s"),
            None
        );
        assert_eq!(listed_sha256(&format!("{k3s}  k3s-arm64\n"), "k3s"), None);
        assert_eq!(
            listed_sha256(&format!("{k3s}  k3s\r\n"), "k3s"),
            Some(k3s.as_str())
        );
    }

    /// The spec pins the target's binary by a digest the release's hash file does not list
    /// for `k3s`: every new node would fail at `k3s-install`, so the roll does not start.
    /// The same digest (in either case) passes; so does an unpinned spec, a release whose hash
    /// file lists no `k3s`, and one that cannot be read keeps its own blocker only.
    #[test]
    fn a_pinned_binary_digest_the_release_does_not_list_blocks() {
        const TO: &str = "v1.34.1+k3s1";
        const URL: &str = "http://r/download/v1.34.1+k3s1/sha256sum-amd64.txt";
        let released = "ab".repeat(32);
        let wrong = "cd".repeat(32);
        let r = |found: Result<String, String>| Readings {
            servers_ready: 3,
            servers_desired: 3,
            releases: vec![(TO.into(), URL.into(), found)],
            ..Readings::default()
        };
        let pinned = |digest: &str| {
            let mut s = spec(TO);
            s.k3s.binary_sha256.insert(TO.into(), digest.into());
            s
        };
        assert_eq!(
            evaluate(&pinned(&wrong), &r(Ok(listing(&released)))),
            [format!(
                "k3s.binary_sha256[{TO}] is {wrong} but the release's sha256sum-amd64.txt ({URL}) lists {released} for k3s: every new node of {TO} would fail its setup at k3s-install; correct the spec (compare with a second source) or the mirror (k3s.release_url)"
            )]
        );
        assert!(evaluate(&pinned(&released), &r(Ok(listing(&released)))).is_empty());
        assert!(
            evaluate(
                &pinned(&released.to_ascii_uppercase()),
                &r(Ok(listing(&released)))
            )
            .is_empty()
        );
        assert!(evaluate(&spec(TO), &r(Ok(listing(&released)))).is_empty());
        assert!(evaluate(&pinned(&wrong), &r(Ok(String::new()))).is_empty());
        assert_eq!(
            evaluate(&pinned(&wrong), &r(Err("HTTP 404".into()))),
            [format!(
                "release {TO} is not at {URL} (HTTP 404), where the nodes' installer fetches it; set a k3s release that exists"
            )]
        );
        // Each release the roll installs is checked against its own digest: an upgrade.path
        // step's too.
        const STEP: &str = "v1.33.7+k3s3";
        let mut walk = pinned(&released);
        walk.upgrade.path = vec![STEP.into()];
        walk.k3s.binary_sha256.insert(STEP.into(), wrong.clone());
        let both = Readings {
            releases: vec![
                (STEP.into(), "http://r/step".into(), Ok(listing(&released))),
                (TO.into(), URL.into(), Ok(listing(&released))),
            ],
            ..r(Ok(String::new()))
        };
        let b = evaluate(&walk, &both);
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(
            b[0].starts_with(&format!("k3s.binary_sha256[{STEP}] is {wrong}")),
            "{b:?}"
        );
    }

    #[test]
    fn a_server_that_is_not_ready_blocks() {
        let r = Readings {
            servers_not_ready: vec![("demo-cp-a".into(), "joining".into())],
            servers_ready: 2,
            servers_desired: 3,
            ..Readings::default()
        };
        assert_eq!(
            evaluate(&spec("v1.34.1+k3s1"), &r),
            ["server demo-cp-a is not a Ready Node (joining)"]
        );
        let short = Readings {
            servers_not_ready: vec![],
            ..r
        };
        assert_eq!(
            evaluate(&spec("v1.34.1+k3s1"), &short),
            ["2 of 3 servers are Ready Nodes"]
        );
    }
}
