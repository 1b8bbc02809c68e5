//! The etcd each k3s release bundles, and the one etcd upgrade boundary the servers' roll must
//! respect: etcd 3.5 → 3.6 only from etcd v3.5.26 or newer.
//!
//! Every roll replaces etcd members (a new server joins as a learner, an old one is removed).
//! etcd 3.6 takes cluster membership from its v3 store, where 3.5 kept it in the v2 store; in
//! clusters whose members were replaced the two could disagree, and a 3.6 member then sees
//! removed "zombie" members and an unhealthy cluster. etcd v3.5.26 repairs the v3 store
//! (etcd-io/etcd#20995, "[release-3.5] server: cleanup zombie membership information");
//! etcd says "If you are upgrading, make sure to update to v3.5.26 or later first" and that
//! there is no safe workaround otherwise (<https://etcd.io/blog/2025/zombie_members_upgrade/>).
//! k3s reports exactly this on v1.33 → v1.34 by replacing servers: k3s-io/k3s#13271 ("Start an
//! new server node with v1.34.x and try joining the existing cluster which will fail because
//! the new node will see an unhealthy cluster") and #13485 (v1.33.7+k3s1 → v1.34.3+k3s1),
//! fixed on the 1.33 line by k3s-io/k3s#13493 ("[release-1.33] Bump etcd to v3.5.26 for zombie
//! member fix"). A k3s maintainer (k3s-io/k3s discussion #14908): only clusters that never
//! replaced etcd members are spared; this product always replaces them.
//!
//! Pure: a table and comparisons.

use crate::domain::spec::upgrade::K3sVersion;

/// An etcd version (`major.minor.patch`).
pub type EtcdVersion = (u64, u64, u64);

/// The first etcd 3.5 that may be upgraded to 3.6 (etcd-io/etcd#20995, in v3.5.26).
pub const ETCD_SAFE_3_5: EtcdVersion = (3, 5, 26);

/// k3s releases and the etcd they bundle ("Embedded Component Versions" of each release's
/// notes, or the release branch's `go.mod` `replace go.etcd.io/etcd/server/v3 =>
/// github.com/k3s-io/etcd/server/v3 vX-k3s1`). Sources, release by release:
/// - v1.30.0+k3s1: v3.5.9-k3s1 (release notes, github.com/k3s-io/k3s/releases/tag/v1.30.0+k3s1).
/// - v1.33.1+k3s1, v1.33.4+k3s1: v3.5.21-k3s1. Kubernetes 1.33.0 moved to etcd 3.5.21, and
///   every k3s release of the same months ships v3.5.21-k3s1 (docs.k3s.io/release-notes/v1.31.X:
///   v1.31.9+k3s1 of May 2025 to v1.31.13+k3s1 of Sep 2025); the v1.33.X page was not in the
///   sources read, so the exact patch is inferred, its minor (3.5, below 3.5.26) is certain
///   (3.5.26 was released in Dec 2025).
/// - v1.33.7+k3s3: v3.5.26-k3s1 (k3s `go.mod` at `k8s.io/kubernetes => … v1.33.7-k3s3`, the
///   first 1.33 release after k3s-io/k3s#13493; discussion #14908 reports the same).
/// - v1.34.1+k3s1: v3.6.5-k3s1 (k3s `go.mod` of v1.34.1-k3s1); every k3s 1.34 and newer ships
///   etcd 3.6 (k3s-io/k3s#13496 "[release-1.34] Bump etcd to v3.6.7"; v1.34.9+k3s1's notes list
///   v3.6.12-k3s1, v1.35.5+k3s1 and v1.36.1+k3s1 v3.6.7-k3s1).
pub const K3S_ETCD: &[(&str, EtcdVersion)] = &[
    ("v1.30.0+k3s1", (3, 5, 9)),
    ("v1.33.1+k3s1", (3, 5, 21)),
    ("v1.33.4+k3s1", (3, 5, 21)),
    ("v1.33.7+k3s3", (3, 5, 26)),
    ("v1.34.1+k3s1", (3, 6, 5)),
];

/// The first release of a k3s minor whose etcd is v3.5.26 or newer, where known: what a
/// cluster on that minor rolls to before it may take an etcd 3.6 server.
pub const FIRST_SAFE_RELEASE: &[((u64, u64), &str)] = &[((1, 33), "v1.33.7+k3s3")];

/// What the product knows of a release's etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundledEtcd {
    /// In [`K3S_ETCD`].
    Exact(EtcdVersion),
    /// Not in the table, k3s 1.34 or newer: etcd 3.6 (or newer), patch unknown.
    AtLeast36,
    /// Not in the table, at or above its minor's [`FIRST_SAFE_RELEASE`]: etcd 3.5.26 or newer
    /// (k3s never moves a release line's etcd back).
    Safe35,
    /// Not in the table, older than 1.34 and below its minor's first safe release (or on a
    /// minor with none known): taken as older than v3.5.26, the safe assumption.
    Before3526,
}

impl BundledEtcd {
    /// etcd 3.6 or newer.
    pub fn is_36(self) -> bool {
        match self {
            BundledEtcd::Exact(v) => v >= (3, 6, 0),
            BundledEtcd::AtLeast36 => true,
            BundledEtcd::Safe35 | BundledEtcd::Before3526 => false,
        }
    }

    /// May be upgraded to etcd 3.6 by adding 3.6 members (v3.5.26 or newer).
    pub fn may_take_36(self) -> bool {
        match self {
            BundledEtcd::Exact(v) => v >= ETCD_SAFE_3_5,
            BundledEtcd::AtLeast36 | BundledEtcd::Safe35 => true,
            BundledEtcd::Before3526 => false,
        }
    }
}

impl std::fmt::Display for BundledEtcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BundledEtcd::Exact((a, b, c)) => write!(f, "etcd v{a}.{b}.{c}"),
            BundledEtcd::AtLeast36 => f.write_str("etcd 3.6"),
            BundledEtcd::Safe35 => f.write_str("etcd v3.5.26 or newer"),
            BundledEtcd::Before3526 => f.write_str("an etcd older than v3.5.26"),
        }
    }
}

/// The etcd `release` bundles.
pub fn bundled_etcd(release: &K3sVersion) -> BundledEtcd {
    if let Some((_, v)) = K3S_ETCD
        .iter()
        .find(|(r, _)| K3sVersion::parse(r).as_ref() == Some(release))
    {
        return BundledEtcd::Exact(*v);
    }
    if (release.major, release.minor) >= (1, 34) {
        return BundledEtcd::AtLeast36;
    }
    match first_safe_release(release.major, release.minor).and_then(K3sVersion::parse) {
        Some(first) if *release >= first => BundledEtcd::Safe35,
        _ => BundledEtcd::Before3526,
    }
}

/// [`FIRST_SAFE_RELEASE`] of minor `major.minor`.
pub fn first_safe_release(major: u64, minor: u64) -> Option<&'static str> {
    FIRST_SAFE_RELEASE
        .iter()
        .find(|(m, _)| *m == (major, minor))
        .map(|(_, r)| *r)
}

/// What to roll the servers on `from` to before a release with etcd 3.6.
pub fn safe_step_hint(from: &K3sVersion) -> String {
    match first_safe_release(from.major, from.minor) {
        Some(r) => format!(
            "{r} (etcd v3.5.26) or a later v{}.{} release",
            from.major, from.minor
        ),
        None => format!(
            "a v{}.{} release whose etcd is v3.5.26 or newer",
            from.major, from.minor
        ),
    }
}
