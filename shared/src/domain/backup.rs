//! Backups of a cluster's datastore kept on the rack (issue 36): what one is, how it is named,
//! described and packed, which ones retention keeps, and which one a restore takes. Pure: no
//! I/O, the clock passed in.
//!
//! A backup is an Oxide snapshot of a small disk written by bulk import. The disk's bytes, from
//! offset 0, are a POSIX ustar archive ([`archive`]) of three files:
//!
//! - [`ARCHIVE_MANIFEST`]: the [`Manifest`] (cluster, k3s version, time, the snapshot's sha256
//!   and size, the server token's fingerprint, the live spec, the servers' private addresses);
//! - [`ARCHIVE_SNAPSHOT`]: the bytes `k3s etcd-snapshot save` wrote (an etcd snapshot);
//! - [`ARCHIVE_SHA256`]: its digest in `sha256sum`'s format, so the guest checks it with
//!   `sha256sum -c` before k3s restores it.
//!
//! A guest reads the archive straight off the disk (`tar -xf /dev/nvmeXn1`). The rack has no
//! API to read a disk back, so what a laptop must know *before* touching anything (whose backup
//! it is, when it was taken, which token it needs) is also in the snapshot's description
//! ([`BackupTag`]), which the snapshot list returns. The description is what tells a backup from
//! any other snapshot: retention and `bootstrap delete` take only snapshots whose tag names their
//! cluster.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::base::names::MAX_NAME_LEN;

pub mod drill;
pub mod report;
pub mod retired;
pub mod roll;
pub use report::{BackupReport, BackupStatus, LastBackup};
pub use roll::{BeforeRoll, RollDecision, before_roll};

/// First words of every backup snapshot's description.
pub const DESCRIPTION_PREFIX: &str = "oxide-controller backup ";
/// The manifest's file name in the archive.
pub const ARCHIVE_MANIFEST: &str = "manifest.json";
/// The etcd snapshot's file name in the archive.
pub const ARCHIVE_SNAPSHOT: &str = "etcd-snapshot";
/// The digest file's name in the archive (`sha256sum -c` input).
pub const ARCHIVE_SHA256: &str = "etcd-snapshot.sha256";
/// Version of the archive layout and manifest.
pub const FORMAT: u32 = 1;

/// What the snapshot's description says of a backup: enough to choose one and to refuse a
/// wrong token before any call that changes something.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackupTag {
    pub cluster: String,
    pub k3s_version: String,
    pub time: DateTime<Utc>,
    /// sha256 (hex) of the etcd snapshot.
    pub sha256: String,
    /// [`token_fingerprint`] of the server token the snapshot's data is encrypted with.
    pub token: String,
    /// Size of the etcd snapshot in bytes.
    pub bytes: u64,
    /// How many objects of the counted kinds the cluster held right after the snapshot
    /// (`crate::adapters::kubeclient::COUNTED_KINDS`), for a restore drill to compare; `None`
    /// when the API could not be counted.
    pub objects: Option<u64>,
    /// The control-plane pool's image when the backup was taken (the image that goes with
    /// `k3s_version`); `None` in backups taken before it was recorded.
    pub image: Option<String>,
}

/// The kinds a backup counts and a restore drill compares: what a restore must bring back and
/// what no controller makes on its own in a settled cluster. Not Secrets: the in-cluster backup
/// counts these with its own account, and `list secrets` would hand that account every Secret's
/// data (audit security-2 N1/N8). Backups say how many kinds they counted
/// ([`COUNTED_KINDS_MARK`]); a drill server counts them with k3s's kubectl (its setup script).
pub const COUNTED_KINDS: [&str; 4] = ["namespaces", "configmaps", "services", "serviceaccounts"];

/// Whether an object created at `created` (its `creationTimestamp`, RFC 3339 in whole
/// seconds) counts for a snapshot taken at `snapshot`: only one created strictly before it. The
/// count is taken after the snapshot (k3s takes scheduled ones itself), so an object made in
/// between would be counted but cannot be restored, and a drill of a busy cluster would fail
/// for nothing; one made in the snapshot's own second is left out too (it may be after it), so
/// a correct restore holds at least the count. Without a time, or a timestamp to read, it counts.
pub fn created_before(created: Option<&str>, snapshot: Option<DateTime<Utc>>) -> bool {
    let (Some(created), Some(snapshot)) = (created, snapshot) else {
        return true;
    };
    DateTime::parse_from_rfc3339(created).map_or(true, |c| c.to_utc() < snapshot)
}

/// How a description marks a count of today's kinds (`crate::adapters::kubeclient::COUNTED_KINDS`,
/// four, no Secrets). A count without it is from before, when Secrets were counted too: it is
/// read as no count, so a drill does not compare it with a count of other kinds.
pub const COUNTED_KINDS_MARK: &str = "kinds=4";

impl BackupTag {
    /// `oxide-controller backup cluster=C k3s=V time=T sha256=H token=F bytes=N [objects=M kinds=4]
    /// [image=I]`. Every value is a single word (names, versions, digits), so the longest
    /// (63-character cluster and image names) stays near 330 of the 512 characters Oxide allows.
    pub fn description(&self) -> String {
        let mut d = format!(
            "{DESCRIPTION_PREFIX}cluster={} k3s={} time={} sha256={} token={} bytes={}",
            self.cluster,
            self.k3s_version,
            self.time.to_rfc3339_opts(SecondsFormat::Secs, true),
            self.sha256,
            self.token,
            self.bytes
        );
        if let Some(n) = self.objects {
            let _ = write!(d, " objects={n} {COUNTED_KINDS_MARK}");
        }
        if let Some(i) = &self.image {
            let _ = write!(d, " image={i}");
        }
        d
    }

    /// The tag of a description [`Self::description`] wrote; `None` for anything else.
    pub fn parse(description: &str) -> Option<BackupTag> {
        let rest = description.strip_prefix(DESCRIPTION_PREFIX)?;
        let field = |key: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        };
        Some(BackupTag {
            cluster: field("cluster")?.to_owned(),
            k3s_version: field("k3s")?.to_owned(),
            time: DateTime::parse_from_rfc3339(field("time")?)
                .ok()?
                .with_timezone(&Utc),
            sha256: field("sha256")?.to_owned(),
            token: field("token")?.to_owned(),
            bytes: field("bytes")?.parse().ok()?,
            objects: field("objects")
                .filter(|_| rest.split_whitespace().any(|w| w == COUNTED_KINDS_MARK))
                .and_then(|n| n.parse().ok()),
            image: field("image").map(str::to_owned),
        })
    }
}

/// A backup as the snapshot list shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Backup {
    /// The snapshot's name.
    pub name: String,
    pub tag: BackupTag,
}

/// The cluster's backups among `snapshots` (name, description), newest first.
pub fn of_cluster<'a>(
    cluster: &str,
    snapshots: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<Backup> {
    let mut out: Vec<Backup> = snapshots
        .into_iter()
        .filter_map(|(name, description)| {
            let tag = BackupTag::parse(description)?;
            (tag.cluster == cluster).then(|| Backup {
                name: name.to_owned(),
                tag,
            })
        })
        .collect();
    out.sort_by(|a, b| (b.tag.time, &b.name).cmp(&(a.tag.time, &a.name)));
    out
}

/// The snapshot name of a backup of `cluster` taken at `time`:
/// `<cluster>-etcd-<YYYYMMDD>-<HHMMSS>`, the cluster part cut so the name fits Oxide's 63
/// characters (the description, not the name, says whose backup it is).
pub fn backup_name(cluster: &str, time: DateTime<Utc>) -> String {
    let stamp = time.format("-etcd-%Y%m%d-%H%M%S").to_string();
    let room = MAX_NAME_LEN - stamp.len();
    let mut head: String = cluster.chars().take(room).collect();
    while head.ends_with('-') {
        head.pop();
    }
    format!("{head}{stamp}")
}

/// Name of the temporary import disk a backup is written into: the backup's name with
/// `import-` in front, cut to 63 characters. Not `boot-`/`data-`: never a member disk.
pub fn import_disk_name(backup: &str) -> String {
    let mut name = format!("import-{backup}");
    name.truncate(MAX_NAME_LEN);
    name.trim_end_matches('-').to_owned()
}

/// A fingerprint of the server token: the first 16 hex digits of
/// `sha256("oxide-controller backup token\0" || token)`. It tells a backup made with another
/// token apart (a restore with the wrong token cannot decrypt k3s's bootstrap data) without
/// putting the token, or a plain hash of it, in a description every project member can read.
pub fn token_fingerprint(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"oxide-controller backup token\0");
    h.update(token.as_bytes());
    hex(&h.finalize()[..8])
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// One server of the cluster when the backup was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestServer {
    pub name: String,
    /// Its private (VPC) address, when the rack said.
    pub private_ip: Option<String>,
}

/// The archive's `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub cluster: String,
    pub k3s_version: String,
    pub time: DateTime<Utc>,
    /// The file `k3s etcd-snapshot save` wrote, on the server it ran on.
    pub k3s_snapshot: String,
    /// The server the snapshot was taken on.
    pub taken_on: String,
    pub sha256: String,
    pub bytes: u64,
    pub token: String,
    /// See [`BackupTag::objects`].
    #[serde(default)]
    pub objects: Option<u64>,
    /// See [`BackupTag::image`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The live `spec.yaml` (bootstrap's spec when the cluster's was unreadable).
    pub spec: String,
    pub servers: Vec<ManifestServer>,
}

impl Manifest {
    /// The tag the snapshot's description carries.
    pub fn tag(&self) -> BackupTag {
        BackupTag {
            cluster: self.cluster.clone(),
            k3s_version: self.k3s_version.clone(),
            time: self.time,
            sha256: self.sha256.clone(),
            token: self.token.clone(),
            bytes: self.bytes,
            objects: self.objects,
            image: self.image.clone(),
        }
    }
}

/// The archive of a backup: [`ARCHIVE_MANIFEST`], [`ARCHIVE_SNAPSHOT`], [`ARCHIVE_SHA256`], in
/// that order, then the two zero blocks that end a tar archive.
pub fn archive(manifest: &Manifest, snapshot: &[u8]) -> Vec<u8> {
    let (head, tail) = archive_parts(manifest);
    let mut out = Vec::with_capacity(head.len() + snapshot.len() + tail.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(snapshot);
    out.extend_from_slice(&tail);
    out
}

/// [`archive`] without the snapshot's bytes: what goes before them (the manifest's header and
/// data, the snapshot's header) and after them (its padding, the digest file, the end), for
/// `manifest.bytes` of snapshot. The in-cluster backup streams the file between the two, so
/// its memory does not grow with the snapshot.
pub fn archive_parts(manifest: &Manifest) -> (Vec<u8>, Vec<u8>) {
    let mut json = serde_json::to_vec_pretty(manifest).unwrap_or_default();
    json.push(b'\n');
    let sums = format!("{}  {ARCHIVE_SNAPSHOT}\n", manifest.sha256);
    let mtime = u64::try_from(manifest.time.timestamp()).unwrap_or(0);
    let pad = |v: &mut Vec<u8>, len: u64| {
        let rest = (512 - len % 512) % 512;
        v.resize(v.len() + rest as usize, 0);
    };
    let mut head = Vec::with_capacity(json.len() + 3 * 512);
    head.extend_from_slice(&ustar_header(ARCHIVE_MANIFEST, json.len() as u64, mtime));
    head.extend_from_slice(&json);
    pad(&mut head, json.len() as u64);
    head.extend_from_slice(&ustar_header(ARCHIVE_SNAPSHOT, manifest.bytes, mtime));
    let mut tail = Vec::with_capacity(5 * 512);
    pad(&mut tail, manifest.bytes);
    tail.extend_from_slice(&ustar_header(ARCHIVE_SHA256, sums.len() as u64, mtime));
    tail.extend_from_slice(sums.as_bytes());
    pad(&mut tail, sums.len() as u64);
    tail.resize(tail.len() + 1024, 0);
    (head, tail)
}

/// A ustar header for a regular file `name` (under 100 bytes) of `size` bytes, mode 0600,
/// owner root (POSIX.1-1988 `ustar` as GNU tar and busybox read it).
fn ustar_header(name: &str, size: u64, mtime: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    let mut put = |at: usize, field: &[u8]| h[at..at + field.len()].copy_from_slice(field);
    put(0, name.as_bytes());
    put(100, b"0000600\0");
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{size:011o}\0").as_bytes());
    put(136, format!("{mtime:011o}\0").as_bytes());
    put(148, b"        ");
    put(156, b"0");
    put(257, b"ustar\0");
    put(263, b"00");
    put(265, b"root");
    put(297, b"root");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// The spec's `backup` block: when the cluster backs itself up, and how many backups stay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupSpec {
    /// When the in-cluster backup runs (CronJob cron dialect, UTC): k3s's
    /// `etcd-snapshot-schedule-cron` on every server and the backup CronJob's schedule. `null`
    /// turns the in-cluster backup off (the CronJob is suspended; `bootstrap backup` still
    /// works). Default: hourly, on the hour.
    #[serde(default = "default_schedule")]
    pub schedule: Option<String>,
    /// The newest this many stay, whatever their age.
    #[serde(default = "default_keep")]
    pub keep: u32,
    /// Beyond those, the newest of each of the last this many UTC days (counting today).
    #[serde(default = "default_keep_daily")]
    pub keep_daily: u32,
    /// When the in-cluster restore drill runs (CronJob cron dialect, UTC): the newest backup
    /// restored into a throw-away server, checked and deleted ([`drill`]). `null` turns the
    /// scheduled drill off (a failed drill still makes the cluster Degraded). Default: weekly,
    /// Sundays 03:30.
    #[serde(default = "default_drill_schedule")]
    pub drill_schedule: Option<String>,
}

/// How many backups stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retention {
    pub keep: u32,
    pub keep_daily: u32,
}

impl Retention {
    /// Each count at least `floor`'s (audit security-2 N4: the floor bootstrap records where
    /// no in-cluster account can write it, so an edited `spec.yaml` cannot erase the backup
    /// history). Returns what to apply and whether the floor raised anything.
    pub fn at_least(self, floor: Option<Retention>) -> (Retention, bool) {
        let Some(f) = floor else {
            return (self, false);
        };
        let r = Retention {
            keep: self.keep.max(f.keep),
            keep_daily: self.keep_daily.max(f.keep_daily),
        };
        (r, r != self)
    }
}

fn default_schedule() -> Option<String> {
    Some(DEFAULT_SCHEDULE.to_owned())
}
fn default_drill_schedule() -> Option<String> {
    Some(DEFAULT_DRILL_SCHEDULE.to_owned())
}
fn default_keep() -> u32 {
    24
}
fn default_keep_daily() -> u32 {
    7
}

/// Hourly, on the hour (the default; k3s's own default is every 12 hours).
pub const DEFAULT_SCHEDULE: &str = "0 * * * *";
/// Weekly, Sundays at 03:30 (off the hourly backup's minute).
pub const DEFAULT_DRILL_SCHEDULE: &str = "30 3 * * 0";

impl Default for BackupSpec {
    fn default() -> Self {
        BackupSpec {
            schedule: default_schedule(),
            keep: default_keep(),
            keep_daily: default_keep_daily(),
            drill_schedule: default_drill_schedule(),
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        BackupSpec::default().retention()
    }
}

impl BackupSpec {
    pub fn is_default(&self) -> bool {
        *self == BackupSpec::default()
    }

    pub fn retention(&self) -> Retention {
        Retention {
            keep: self.keep,
            keep_daily: self.keep_daily,
        }
    }
}

/// The backups (of one cluster, any order) retention removes at `now`: all but the newest
/// `keep`, and the newest of each of the last `keep_daily` UTC days. Never the newest one.
pub fn prune(backups: &[Backup], retention: Retention, now: DateTime<Utc>) -> Vec<String> {
    let mut newest_first: Vec<&Backup> = backups.iter().collect();
    newest_first.sort_by(|a, b| (b.tag.time, &b.name).cmp(&(a.tag.time, &a.name)));
    let mut kept: BTreeSet<&str> = newest_first
        .iter()
        .take(retention.keep.max(1) as usize)
        .map(|b| b.name.as_str())
        .collect();
    let today = now.date_naive();
    let mut days = BTreeSet::new();
    for b in &newest_first {
        let day = b.tag.time.date_naive();
        let age = (today - day).num_days();
        if age < i64::from(retention.keep_daily) && days.insert(day) {
            kept.insert(b.name.as_str());
        }
    }
    newest_first
        .iter()
        .filter(|b| !kept.contains(b.name.as_str()))
        .map(|b| b.name.clone())
        .collect()
}

/// Which backup a restore takes (`--backup latest|NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Latest,
    Named(String),
}

impl Choice {
    pub fn parse(text: &str) -> Choice {
        match text {
            "latest" => Choice::Latest,
            name => Choice::Named(name.to_owned()),
        }
    }

    /// The chosen backup among the cluster's (newest first, as [`of_cluster`] returns them).
    pub fn pick<'a>(&self, backups: &'a [Backup]) -> Option<&'a Backup> {
        match self {
            Choice::Latest => backups.first(),
            Choice::Named(n) => backups.iter().find(|b| b.name == *n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_objects_made_before_the_snapshots_second_are_counted() {
        let snapshot = DateTime::parse_from_rfc3339("2026-11-29T18:16:13Z")
            .map(|t| t.to_utc())
            .ok();
        assert!(created_before(Some("2026-11-29T18:16:12Z"), snapshot));
        assert!(
            !created_before(Some("2026-11-29T18:16:13Z"), snapshot),
            "the same second may be after it"
        );
        assert!(
            !created_before(Some("2026-11-29T18:16:20Z"), snapshot),
            "made between the snapshot and the count"
        );
        assert!(
            created_before(Some("2026-11-29T18:16:20Z"), None),
            "no snapshot time: everything"
        );
        assert!(created_before(None, snapshot), "no timestamp: counted");
    }
    use chrono::TimeZone as _;

    fn at(h: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 27, 0, 0, 0).unwrap() + chrono::Duration::hours(h)
    }

    fn tag(cluster: &str, time: DateTime<Utc>) -> BackupTag {
        BackupTag {
            cluster: cluster.into(),
            k3s_version: "v1.34.1+k3s1".into(),
            time,
            sha256: "ab".repeat(32),
            token: token_fingerprint("t"),
            bytes: 12345,
            objects: Some(42),
            image: Some("ubuntu-2404-k3s".into()),
        }
    }

    #[test]
    fn a_description_round_trips_and_names_its_cluster_exactly() {
        let t = tag("prod", at(5));
        let d = t.description();
        assert!(d.len() < 256, "{d}");
        assert_eq!(BackupTag::parse(&d), Some(t));
        assert_eq!(BackupTag::parse("oxide-controller: temporary import"), None);
        let listed = of_cluster(
            "prod",
            [
                ("a", d.as_str()),
                ("b", tag("prod-2", at(6)).description().leak() as &str),
                ("c", "someone's snapshot"),
            ],
        );
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, "a");
    }

    #[test]
    fn the_longest_description_fits_oxides_512_and_old_ones_still_parse() {
        let mut t = tag(&"c".repeat(MAX_NAME_LEN), at(5));
        t.image = Some("i".repeat(MAX_NAME_LEN));
        t.k3s_version = "v1.134.10+k3s10".into();
        t.bytes = u64::MAX;
        t.objects = Some(u64::MAX);
        let d = t.description();
        assert!(d.len() <= 400, "{} characters: {d}", d.len());
        assert_eq!(BackupTag::parse(&d), Some(t));
        // A backup from before `image=` (and `objects=`): both absent, the rest as written.
        let old = "oxide-controller backup cluster=c k3s=v1.33.4+k3s1 time=2026-11-27T05:00:00Z sha256=ab token=cd bytes=7";
        let parsed = BackupTag::parse(old).unwrap();
        assert_eq!((parsed.image, parsed.objects), (None, None));
        assert_eq!(parsed.k3s_version, "v1.33.4+k3s1");
    }

    #[test]
    fn names_fit_oxide_and_the_fingerprint_is_not_the_token() {
        assert_eq!(backup_name("c1", at(13)), "c1-etcd-20261127-130000");
        let long = backup_name(&"a".repeat(60), at(1));
        assert!(long.len() <= MAX_NAME_LEN && long.ends_with("-etcd-20261127-010000"));
        assert!(import_disk_name(&long).len() <= MAX_NAME_LEN);
        let f = token_fingerprint("K10secret::server:abc");
        assert_eq!(f.len(), 16);
        assert_ne!(f, token_fingerprint("K10secret::server:abd"));
        assert!(!f.contains("secret"));
    }

    #[test]
    fn retention_keeps_the_newest_and_one_a_day() {
        // One backup an hour for three days and a bit.
        let now = at(24 * 3 + 2);
        let backups: Vec<Backup> = (0..=(24 * 3 + 2))
            .map(|h| Backup {
                name: format!("b{h:03}"),
                tag: tag("c", at(h)),
            })
            .collect();
        let gone = prune(
            &backups,
            Retention {
                keep: 5,
                keep_daily: 3,
            },
            now,
        );
        let kept: Vec<&str> = backups
            .iter()
            .map(|b| b.name.as_str())
            .filter(|n| !gone.iter().any(|g| g == n))
            .collect();
        // Newest five (hours 70..=74); then one a day for the last three days: today (hours
        // 72..=74) and yesterday (48..=71) have theirs among the five, the day before (24..=47)
        // keeps hour 47; the first day (0..=23) is three days old and keeps nothing.
        assert_eq!(kept, ["b047", "b070", "b071", "b072", "b073", "b074"]);
        // Nothing goes while there are fewer than `keep`.
        assert!(prune(&backups[..3], Retention::default(), now).is_empty());
        // Even keep: 0 keeps the newest.
        let gone = prune(
            &backups,
            Retention {
                keep: 0,
                keep_daily: 0,
            },
            now,
        );
        assert_eq!(gone.len(), backups.len() - 1);
        assert!(!gone.contains(&"b074".to_owned()));
    }

    #[test]
    fn the_archive_is_a_tar_with_the_three_files() {
        let snapshot = b"etcd bytes".repeat(100);
        let m = Manifest {
            format: FORMAT,
            cluster: "c".into(),
            k3s_version: "v1.34.1+k3s1".into(),
            time: at(1),
            k3s_snapshot: "on-demand-x-1".into(),
            taken_on: "c-cp-aaaaa".into(),
            sha256: hex(&Sha256::digest(&snapshot)),
            bytes: snapshot.len() as u64,
            token: token_fingerprint("t"),
            objects: None,
            image: Some("ubuntu-2404".into()),
            spec: "cluster: c\n".into(),
            servers: vec![],
        };
        let a = archive(&m, &snapshot);
        assert_eq!(a.len() % 512, 0);
        // Walk it as tar does: header, checksum, size, data.
        let mut at_ = 0;
        let mut names = Vec::new();
        while a[at_] != 0 {
            let h = &a[at_..at_ + 512];
            let stored =
                u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap().trim(), 8).unwrap();
            let sum: u32 = h
                .iter()
                .enumerate()
                .map(|(i, &b)| {
                    if (148..156).contains(&i) {
                        32
                    } else {
                        u32::from(b)
                    }
                })
                .sum();
            assert_eq!(stored, sum);
            let name = std::str::from_utf8(&h[..100])
                .unwrap()
                .trim_end_matches('\0');
            let size = u64::from_str_radix(std::str::from_utf8(&h[124..135]).unwrap(), 8).unwrap()
                as usize;
            let data = &a[at_ + 512..at_ + 512 + size];
            if name == ARCHIVE_SNAPSHOT {
                assert_eq!(data, snapshot.as_slice());
            }
            if name == ARCHIVE_SHA256 {
                assert_eq!(data, format!("{}  etcd-snapshot\n", m.sha256).as_bytes());
            }
            if name == ARCHIVE_MANIFEST {
                let back: Manifest = serde_json::from_slice(data).unwrap();
                assert_eq!(back, m);
            }
            names.push(name.to_owned());
            at_ += 512 + size.div_ceil(512) * 512;
        }
        assert_eq!(names, [ARCHIVE_MANIFEST, ARCHIVE_SNAPSHOT, ARCHIVE_SHA256]);
        assert!(a[at_..].iter().all(|&b| b == 0) && a.len() - at_ == 1024);
    }

    #[test]
    fn latest_is_the_newest_and_a_name_must_exist() {
        let backups = of_cluster(
            "c",
            [
                ("old", tag("c", at(1)).description().leak() as &str),
                ("new", tag("c", at(2)).description().leak() as &str),
            ],
        );
        assert_eq!(Choice::parse("latest").pick(&backups).unwrap().name, "new");
        assert_eq!(Choice::parse("old").pick(&backups).unwrap().name, "old");
        assert_eq!(Choice::parse("nope").pick(&backups), None);
    }
}
