//! Runtime-mutable fault injection for the simulated rack.
//!
//! The Oxide API side reads the per-route faults (latency, error rate), `fail_at_boot`,
//! `hang_stopping`, `crash_after_requests` and the start refusals `no_capacity` /
//! `quota_exceeded`; the integrator reads `never_join`, `cluster_reset_fails` and
//! `wrong_console_host_key`. This module only holds the specification; acting on it is the
//! job of the code that owns the behaviour.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Shared handle to the current [`FaultSpec`]; clones see the same specification. It also
/// keeps when each [`FaultSpec::deprecated_apis`] entry was last set: that is when its clients
/// made their requests, so only an apiserver process running then has them in its gauge.
#[derive(Clone, Debug, Default)]
pub struct Faults(
    Arc<RwLock<FaultSpec>>,
    Arc<RwLock<BTreeMap<String, SystemTime>>>,
);

/// What to break, and how.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultSpec {
    /// Per-route faults, keyed `"METHOD /v1/template"` (e.g. `"POST /v1/instances"`), or `"*"`
    /// for every Oxide route. An exact key wins over `"*"`.
    pub routes: BTreeMap<String, RouteFault>,
    /// Instance-name prefixes whose instances go `failed` instead of reaching `running`.
    pub fail_at_boot: Vec<String>,
    /// Instance-name prefixes whose k3s never joins (integrator).
    pub never_join: Vec<String>,
    /// Instance-name prefixes that stay in `stopping` forever once stopped.
    pub hang_stopping: Vec<String>,
    /// The process exits with status 137 when a request arrives after this many Oxide API
    /// requests (counted since start or the last `reset_counters`).
    pub crash_after_requests: Option<u64>,
    /// Instance-name prefixes whose NVMe data disk is not there when the setup script looks
    /// for it (integrator): the script prints its failure marker and k3s never starts.
    pub missing_data_disk: Vec<String>,
    /// Instance-name prefixes whose installer downloads fail (curl -f after its retries;
    /// integrator): the setup script stops with its failure marker before k3s.
    pub download_fails: Vec<String>,
    /// Instance-name prefixes whose installer downloads arrive changed (a mirror or a path
    /// serving other bytes; integrator): a `check_sha256` of the download fails as
    /// `sha256sum -c` does, and the setup script stops before running it.
    pub download_tampered: Vec<String>,
    /// Instance-name prefixes whose console prints a different host key (integrator).
    pub wrong_console_host_key: Vec<String>,
    /// Instance-name prefixes on which `k3s server --cluster-reset` fails once etcd starts
    /// with `ForceNewCluster` (integrator): k3s has written its reset-flag by then, so the
    /// flag stays behind (e.g. etcd's initial corruption check refusing the data, a full
    /// disk, or k3s killed before etcd rewrote its WAL).
    pub cluster_reset_fails: Vec<String>,
    /// Instance-name prefixes no sled has room for: a create with `start` answers 201 with a
    /// `stopped` instance and a start answers 507 (a full rack; omicron's start saga fails at
    /// `ALLOC_SERVER` and the create ignores the failed auto-start). `""` matches every name.
    pub no_capacity: Vec<String>,
    /// Like `no_capacity`, but the silo's vCPU quota is what runs out (the start saga fails
    /// at `ADD_VIRTUAL_RESOURCES`).
    pub quota_exceeded: Vec<String>,
    /// The silo's storage quota in bytes (`None`: no limit). Every disk and every snapshot is
    /// charged its full virtual size against it, and a disk or snapshot create that would pass
    /// it answers nexus's 507 "Storage Limit Exceeded" (see [`FaultSpec::storage_refusal`]).
    pub silo_storage_quota: Option<u64>,
    /// The next this many `PUT /v1/vpc-firewall-rules` are undone at once by another writer:
    /// the PUT answers with its list, then the list goes back to what it replaced (new ids), as
    /// when a second read-modify-write that read before this one writes right after it. Nexus
    /// takes no precondition on the PUT (omicron `nexus/src/app/vpc.rs:182-…`).
    pub overwritten_firewall_writes: u32,
    /// Kubernetes API faults (injected by the clusters' front proxies), keyed `"<verb> <resource>[/<subresource>]"`
    /// (e.g. `"create pods/eviction"`, `"update leases"`, `"list nodes"`), `"* <resource>"`,
    /// `"<verb> *"` or `"*"` (most specific wins). `error_status` answers with the
    /// apiserver's Status for that code (500 InternalError, 503 ServiceUnavailable, 429...).
    pub kube: BTreeMap<String, RouteFault>,
    /// Kubernetes API faults injected *after* the request reached the apiserver, keyed like
    /// [`FaultSpec::kube`]: the next `times` matching requests the apiserver *accepted* (2xx)
    /// are answered with `error_status` instead (504 by default: the apiserver's own timeout
    /// answer says it "may still be processing the request"), so the write is committed but
    /// the client is told it failed. Refused requests pass through untouched and do not count.
    pub kube_after: BTreeMap<String, AfterFault>,
    /// Per server (instance-name prefix): the deprecated APIs its apiserver process has served
    /// since it started, as its `/metrics` gauge `apiserver_requested_deprecated_apis` reports
    /// them (one sample each, value 1; see `control_plane::proxy::ServerFacts`).
    pub deprecated_apis: BTreeMap<String, Vec<DeprecatedApi>>,
    /// Instance-name prefixes whose etcd snapshots take this many more milliseconds to save,
    /// as a large datastore's do on a real disk (integrator; the snapshot lock is held
    /// meanwhile).
    pub slow_snapshots: BTreeMap<String, u64>,
}

/// One sample of `apiserver_requested_deprecated_apis`: its labels (`k8s.io/apiserver`
/// `pkg/endpoints/metrics/metrics.go` `deprecatedRequestGauge`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeprecatedApi {
    /// API group (`""` for the core group).
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    /// `MAJOR.MINOR` of the release that removes it (`1.34`); empty when none is planned.
    pub removed_release: String,
}

/// A committed-but-failed answer (see [`FaultSpec::kube_after`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct AfterFault {
    /// The status the client gets instead of the apiserver's success.
    pub error_status: u16,
    /// How many more accepted requests get it.
    pub times: u32,
}

impl Default for AfterFault {
    fn default() -> Self {
        Self {
            error_status: 504,
            times: 1,
        }
    }
}

/// Fault for one route (or all of them).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct RouteFault {
    /// Added delay before the request is handled.
    pub latency_ms: u64,
    /// Fraction (0.0–1.0) of requests that fail with `error_status` instead of being handled.
    pub error_rate: f64,
    /// Status of injected failures: 503 (ServiceNotAvailable), 500 (Internal), 507, ...
    pub error_status: u16,
}

impl Default for RouteFault {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            error_rate: 0.0,
            error_status: 503,
        }
    }
}

impl Faults {
    /// A handle holding `spec`.
    pub fn new(spec: FaultSpec) -> Self {
        let this = Self::default();
        this.set(spec);
        this
    }

    /// A copy of the current specification.
    pub fn get(&self) -> FaultSpec {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the specification.
    pub fn set(&self, spec: FaultSpec) {
        self.update(|s| *s = spec);
    }

    /// Edits the specification in place.
    pub fn update(&self, f: impl FnOnce(&mut FaultSpec)) {
        let mut spec = self.0.write().unwrap_or_else(|e| e.into_inner());
        let before = spec.deprecated_apis.clone();
        f(&mut spec);
        let mut at = self.1.write().unwrap_or_else(|e| e.into_inner());
        at.retain(|prefix, _| spec.deprecated_apis.contains_key(prefix));
        for (prefix, samples) in &spec.deprecated_apis {
            if before.get(prefix) != Some(samples) {
                at.insert(prefix.clone(), SystemTime::now());
            }
        }
    }

    /// The deprecated APIs `instance`'s apiserver process, started at `process_start`, has
    /// served: the [`FaultSpec::deprecated_apis`] entries naming it that were set while it ran.
    /// The gauge lives in the process (`k8s.io/apiserver@v0.33.4`
    /// `pkg/endpoints/metrics/metrics.go:66-73,590-593`), so a k3s restart empties it.
    pub fn deprecated_apis_of(
        &self,
        instance: &str,
        process_start: SystemTime,
    ) -> Vec<DeprecatedApi> {
        let spec = self.0.read().unwrap_or_else(|e| e.into_inner());
        let at = self.1.read().unwrap_or_else(|e| e.into_inner());
        spec.deprecated_apis
            .iter()
            .filter(|(prefix, _)| instance.starts_with(prefix.as_str()))
            .filter(|(prefix, _)| at.get(*prefix).is_some_and(|t| *t >= process_start))
            .flat_map(|(_, samples)| samples.iter().cloned())
            .collect()
    }

    /// The fault for route `key` (exact key first, then `"*"`).
    pub fn route(&self, key: &str) -> Option<RouteFault> {
        let spec = self.0.read().unwrap_or_else(|e| e.into_inner());
        spec.routes
            .get(key)
            .or_else(|| spec.routes.get("*"))
            .cloned()
    }
}

impl Faults {
    /// The Kubernetes fault for `verb` on `resource` (see [`FaultSpec::kube`]).
    pub fn kube_route(&self, verb: &str, resource: &str) -> Option<RouteFault> {
        let spec = self.0.read().unwrap_or_else(|e| e.into_inner());
        [
            format!("{verb} {resource}"),
            format!("* {resource}"),
            format!("{verb} *"),
            "*".to_owned(),
        ]
        .iter()
        .find_map(|k| spec.kube.get(k))
        .cloned()
    }
}

impl Faults {
    /// Takes one committed-but-failed answer for `verb` on `resource`, if one is left (see
    /// [`FaultSpec::kube_after`]; the most specific key with `times` left wins): its status.
    pub fn take_kube_after(&self, verb: &str, resource: &str) -> Option<u16> {
        let mut spec = self.0.write().unwrap_or_else(|e| e.into_inner());
        let key = [
            format!("{verb} {resource}"),
            format!("* {resource}"),
            format!("{verb} *"),
            "*".to_owned(),
        ]
        .into_iter()
        .find(|k| spec.kube_after.get(k).is_some_and(|f| f.times > 0))?;
        let fault = spec.kube_after.get_mut(&key)?;
        fault.times -= 1;
        Some(fault.error_status)
    }
}

impl FaultSpec {
    /// Whether instance `name` matches one of `prefixes`.
    pub fn matches(prefixes: &[String], name: &str) -> bool {
        prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }

    /// nexus's 507 when charging `add` more bytes of disks or snapshots to a silo that has
    /// `provisioned` would pass [`FaultSpec::silo_storage_quota`] (the message omicron's
    /// `from_diesel` gives the "Not enough storage" sentinel, with the "Insufficient capacity: "
    /// prefix its `InsufficientCapacity` error adds).
    pub fn storage_refusal(&self, provisioned: u64, add: u64) -> Option<String> {
        let quota = self.silo_storage_quota?;
        (provisioned.saturating_add(add) > quota).then(|| {
            "Insufficient capacity: Storage Limit Exceeded: Not enough storage to complete \
             request. Either remove unneeded disks and snapshots to free up resources or contact \
             the rack operator to request a capacity increase."
                .to_owned()
        })
    }

    /// The message of the 507 a start of instance `name` gets under `no_capacity` or
    /// `quota_exceeded` (nexus's texts, with the "Insufficient capacity: " prefix its
    /// `InsufficientCapacity` error adds).
    pub fn start_refusal(&self, name: &str) -> Option<String> {
        if Self::matches(&self.quota_exceeded, name) {
            Some(
                "Insufficient capacity: vCPU Limit Exceeded: Not enough vCPUs to complete request. \
                 Either stop unused instances to free up resources or contact the rack operator \
                 to request a capacity increase."
                    .into(),
            )
        } else if Self::matches(&self.no_capacity, name) {
            Some(
                "Insufficient capacity: Failed to place instance: Could not find any valid sled \
                 on which this instance can be placed"
                    .into(),
            )
        } else {
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn exact_route_fault_wins_over_wildcard() {
        let faults = Faults::default();
        faults.update(|s| {
            s.routes.insert(
                "*".into(),
                RouteFault {
                    latency_ms: 1,
                    ..RouteFault::default()
                },
            );
            s.routes.insert(
                "GET /v1/instances".into(),
                RouteFault {
                    latency_ms: 2,
                    ..RouteFault::default()
                },
            );
        });
        assert_eq!(faults.route("GET /v1/instances").unwrap().latency_ms, 2);
        assert_eq!(faults.route("GET /v1/disks").unwrap().latency_ms, 1);
    }

    #[test]
    fn route_fault_status_defaults_to_503_when_omitted() {
        let f: RouteFault = serde_json::from_str(r#"{"error_rate":0.5}"#).unwrap();
        assert_eq!(f.error_status, 503);
        let spec: FaultSpec = serde_json::from_str(r#"{"hang_stopping":["w"]}"#).unwrap();
        assert!(FaultSpec::matches(&spec.hang_stopping, "worker-1"));
        assert!(!FaultSpec::matches(&spec.hang_stopping, "cp-1"));
    }
}
