//! Creates that cannot succeed until something changes on the rack.
//!
//! A create refused for insufficient capacity, a spent quota, a full VPC subnet or a request
//! the rack rejects outright (an image or disk problem) fails the same way when retried at
//! once. Creating the whole shortfall again every run would send the same hundreds of
//! failing sagas to a shared control plane every few minutes, for a condition that will not
//! change by itself. So a pool whose create failed that way is *blocked*: each later run sends
//! at most one probe create for it, no sooner than an exponentially growing delay after the
//! last attempt, until a create succeeds again. The memory lives in `status.json`
//! (`createBackoff`), like the autoscaler's; a change of the pool's spec (smaller members, a
//! new image) lifts the block at once.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// Longest pause between two probe creates.
pub const MAX_DELAY: Duration = Duration::minutes(30);

/// Why a create failed in a way retrying at once does not fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BlockCause {
    /// No sled has room for a member of this size (507 `InsufficientCapacity`).
    Capacity,
    /// The silo's quota is spent (507, "... Limit Exceeded").
    Quota,
    /// The project's VPC subnet has no free private address for the NIC (400, "No available
    /// IPv4 addresses for interface ...").
    SubnetFull,
    /// The rack's external IP pool has no address for the member's ephemeral IP.
    ExternalAddresses,
    /// The rack rejected the request itself (an image or disk problem, an invalid value).
    Rejected,
    /// A new member of a pool being rolled failed its node setup (a k3s version that does not
    /// install: a release that does not exist, an image with another k3s): every further
    /// member of that spec would fail the same way, so the roll waits (issue 33 item 3). The
    /// block holds while no member of the new spec is Ready, whatever the rack says of the
    /// probe's create.
    SetupFailed,
}

impl BlockCause {
    /// What an operator can do about it.
    pub fn remedy(self) -> &'static str {
        match self {
            BlockCause::Capacity => {
                "free capacity on the rack (stop or delete instances), or use smaller members (cpus, memory)"
            }
            BlockCause::Quota => {
                "raise the silo's quota (cpus, memory, storage), or use fewer or smaller members"
            }
            BlockCause::SubnetFull => {
                "free addresses in the project's VPC subnet (delete instances there), use fewer members, or a project with a larger subnet"
            }
            BlockCause::ExternalAddresses => {
                "add addresses to the IP pool, or set nodes.external_ip: none"
            }
            BlockCause::Rejected => {
                "fix the pool's spec (image, disk sizes) as the rack's message says"
            }
            BlockCause::SetupFailed => {
                "set a version that installs (a release that exists, or the image's k3s) as the console says; the old members stay meanwhile"
            }
        }
    }

    fn what(self) -> &'static str {
        match self {
            BlockCause::Capacity => "the rack has no room",
            BlockCause::Quota => "the silo quota is spent",
            BlockCause::SubnetFull => "the VPC subnet has no free address",
            BlockCause::ExternalAddresses => "the IP pool has no free external address",
            BlockCause::Rejected => "the rack rejects the request",
            BlockCause::SetupFailed => "a new member failed its node setup",
        }
    }
}

/// A create failure that blocks its pool, as apply saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub cause: BlockCause,
    /// The rack's own words.
    pub message: String,
}

/// The memory of one blocked pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateBackoff {
    pub cause: BlockCause,
    pub message: String,
    /// The first failure of this streak.
    pub since: DateTime<Utc>,
    /// The last create tried (and refused).
    pub last_attempt: DateTime<Utc>,
    /// Creates refused in a row.
    pub failures: u32,
    /// The pool's spec hash when it was blocked: a changed spec lifts the block.
    pub spec_hash: String,
    /// With [`BlockCause::SetupFailed`]: the member whose failure was last counted (each
    /// failed member counts once, however many runs see it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

impl CreateBackoff {
    /// When the next probe may go: `base` after the first failure, doubling with each
    /// further one, at most [`MAX_DELAY`] (or `base`, if that is longer).
    pub fn next_probe(&self, base: Duration) -> DateTime<Utc> {
        let doublings = self.failures.saturating_sub(1).min(16);
        let delay = base
            .checked_mul(1 << doublings)
            .unwrap_or(MAX_DELAY)
            .min(MAX_DELAY.max(base));
        self.last_attempt + delay
    }

    /// One line for findings, status and Events: cause, the rack's words, what to do.
    pub fn describe(&self, pool: &str) -> String {
        if self.cause == BlockCause::SetupFailed {
            return format!(
                "pool {pool:?}: the roll is blocked since {} ({} new member(s) failed, the last {}): {}; {}",
                self.since.format("%Y-%m-%dT%H:%M:%SZ"),
                self.failures,
                self.member.as_deref().unwrap_or("?"),
                self.message,
                self.cause.remedy()
            );
        }
        format!(
            "pool {pool:?}: creates are refused since {} ({} in a row: {}): {}; {}",
            self.since.format("%Y-%m-%dT%H:%M:%SZ"),
            self.failures,
            self.cause.what(),
            self.message,
            self.cause.remedy()
        )
    }
}

/// Blocked pools by name.
pub type Backoffs = BTreeMap<String, CreateBackoff>;

/// The memory after a run: `carried` is what the plan kept (pools still short of members,
/// spec unchanged); `attempts` is, per pool that tried creates this run, `Ok(())` when one
/// succeeded and `Err(blocked)` when every one that was tried failed and one failed in a
/// blocking way.
pub fn after_run(
    carried: &Backoffs,
    attempts: &BTreeMap<String, Result<(), Blocked>>,
    hashes: &BTreeMap<String, String>,
    now: DateTime<Utc>,
) -> Backoffs {
    let mut out = carried.clone();
    for (pool, attempt) in attempts {
        match attempt {
            // A probe the rack created says nothing of whether it installs: the block stays
            // (the probe's own setup decides), its delay counting from this attempt.
            Ok(())
                if carried
                    .get(pool)
                    .is_some_and(|b| b.cause == BlockCause::SetupFailed) =>
            {
                if let Some(b) = out.get_mut(pool) {
                    b.last_attempt = now;
                }
            }
            Ok(()) => {
                out.remove(pool);
            }
            Err(b) => {
                let prev = carried.get(pool);
                out.insert(
                    pool.clone(),
                    CreateBackoff {
                        cause: b.cause,
                        message: b.message.clone(),
                        since: prev.map_or(now, |p| p.since),
                        last_attempt: now,
                        failures: prev.map_or(0, |p| p.failures).saturating_add(1),
                        spec_hash: hashes.get(pool).cloned().unwrap_or_default(),
                        member: None,
                    },
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    fn blocked(failures: u32, last: i64) -> CreateBackoff {
        CreateBackoff {
            cause: BlockCause::SubnetFull,
            message: "No available IPv4 addresses".into(),
            since: at(0),
            last_attempt: at(last),
            failures,
            spec_hash: "h".into(),
            member: None,
        }
    }

    #[test]
    fn the_probe_delay_doubles_up_to_the_cap() {
        let base = Duration::seconds(60);
        let delays: Vec<i64> = (1..=8)
            .map(|n| (blocked(n, 0).next_probe(base) - at(0)).num_seconds())
            .collect();
        assert_eq!(delays, [60, 120, 240, 480, 960, 1800, 1800, 1800]);
        // A zero base probes every run.
        assert_eq!(blocked(9, 5).next_probe(Duration::zero()), at(5));
    }

    #[test]
    fn a_success_lifts_the_block_and_a_failure_extends_the_streak() {
        let hashes = BTreeMap::from([("w".to_owned(), "h2".to_owned())]);
        let carried = Backoffs::from([("w".to_owned(), blocked(2, 10))]);
        let fail = BTreeMap::from([(
            "w".to_owned(),
            Err(Blocked {
                cause: BlockCause::Quota,
                message: "vCPU Limit Exceeded".into(),
            }),
        )]);
        let next = after_run(&carried, &fail, &hashes, at(400));
        let w = &next["w"];
        assert_eq!(
            (
                w.cause,
                w.since,
                w.last_attempt,
                w.failures,
                w.spec_hash.as_str()
            ),
            (BlockCause::Quota, at(0), at(400), 3, "h2")
        );
        let ok = BTreeMap::from([("w".to_owned(), Ok(()))]);
        assert!(after_run(&next, &ok, &hashes, at(900)).is_empty());
        // A pool that tried nothing keeps what the plan carried.
        assert_eq!(after_run(&next, &BTreeMap::new(), &hashes, at(900)), next);
    }
}
