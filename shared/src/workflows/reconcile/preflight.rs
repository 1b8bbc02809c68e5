//! The upgrade pre-flight's readings (issue 33 item 2): which servers are Ready Nodes, and
//! each server's own `/metrics`, read through that server's address (the deprecated-API
//! gauge is per apiserver process). What blocks is decided by
//! [`crate::domain::upgrade::preflight::evaluate`].
//!
//! A server's address: its floating or ephemeral IP when it has one (reachable from where a
//! laptop runs `scale upgrade`, and from the rack), else its private VPC address (reachable
//! from the cluster's pods, where the reconcile CronJob runs). Requests: one external-IP and
//! one private-IP lookup per server, one `GET /metrics` per server, and one `GET` of each
//! release's hash file at `k3s.release_url` (its text: the digest it lists for `k3s` is
//! compared with a pinned `k3s.binary_sha256`).

use chrono::{DateTime, Utc};

use crate::adapters::releases;
use crate::domain::plan::{self, Health, Observed};
use crate::domain::spec::ClusterSpec;
use crate::domain::spec::upgrade::K3sVersion;
use crate::domain::upgrade::preflight::{self, Readings};
use crate::ports::cluster::Cluster;
use crate::ports::rack::{self, Rack};

/// The pre-flight's blockers for `spec`'s `k3s.version` (empty: it passed).
pub async fn run<R: Rack, C: Cluster>(
    rack: &R,
    cluster: &C,
    spec: &ClusterSpec,
    observed: &Observed,
    now: DateTime<Utc>,
) -> Vec<String> {
    let members = plan::classify(spec, observed, now);
    let servers: Vec<&plan::Member> = members
        .iter()
        .filter(|m| m.pool == spec.control_plane.name && m.health != Health::Removing)
        .collect();
    let mut readings = Readings {
        servers_desired: spec.control_plane.count as usize,
        servers_ready: servers.iter().filter(|m| m.health == Health::Ready).count(),
        etcd_mismatch: plan::etcd_members_match(spec, observed, now)
            .err()
            .map(|f| f.message),
        servers_minor: servers
            .iter()
            .filter_map(|m| m.node.as_ref()?.kubelet_version.as_deref())
            .filter_map(K3sVersion::parse)
            .map(|v| (v.major, v.minor))
            .min(),
        now_unix: now.timestamp(),
        ..Readings::default()
    };
    readings.servers_not_ready = servers
        .iter()
        .filter(|m| m.health != Health::Ready)
        .map(|m| {
            let what = serde_json::to_value(&m.health)
                .ok()
                .map(|v| match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (m.instance.name.clone(), what)
        })
        .collect();
    let read = servers
        .iter()
        .filter(|m| m.node.is_some())
        .map(|m| async move {
            let name = m.instance.name.as_str();
            let addresses = addresses(rack, name).await;
            let metrics = match cluster.server_get(&addresses, "/metrics").await {
                Ok(text) => Ok(text),
                Err(e) => Err(e.to_string()),
            };
            (name.to_owned(), metrics)
        });
    readings.metrics = futures::future::join_all(read).await;
    readings.releases = releases(spec).await;
    preflight::evaluate(spec, &readings)
}

/// Each release the roll installs (`upgrade.path`, then `k3s.version`) and its hash file at
/// `k3s.release_url` (its text, or why it could not be read); none when k3s is pre-installed
/// in the image.
async fn releases(spec: &ClusterSpec) -> Vec<(String, String, Result<String, String>)> {
    if spec.k3s.install == crate::domain::spec::K3sInstall::Preinstalled {
        return Vec::new();
    }
    let versions: Vec<&String> = spec
        .upgrade
        .path
        .iter()
        .chain(std::iter::once(&spec.k3s.version))
        .collect();
    let checks = versions.into_iter().map(|v| async move {
        let url = releases::hash_url(&spec.k3s.release_url, v);
        let found = releases::hash_file(&url).await;
        (v.clone(), url, found)
    });
    futures::future::join_all(checks).await
}

/// Where `name`'s apiserver may be reached: its floating or ephemeral IP, then its private
/// address.
async fn addresses<R: Rack>(rack: &R, name: &str) -> Vec<std::net::IpAddr> {
    let (external, private) = tokio::join!(
        rack.instance_external_ips(name),
        rack.instance_private_ip(name)
    );
    external
        .ok()
        .and_then(|ips| rack::reachable_address(&ips))
        .into_iter()
        .chain(private.ok().flatten())
        .collect()
}
