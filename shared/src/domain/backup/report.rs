//! What the cluster knows of its backups between runs: the report the backup writers leave in
//! the ConfigMap (`backup.json`: the in-cluster backup Job and `bootstrap backup`), the k3s
//! scheduled snapshot files the Job uploads, and the `backup` part of `status.json` with its
//! staleness rule (the cluster is Degraded when the newest backup is older than two schedule
//! periods). Pure: the clock is passed in.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// The last backup taken and the last attempt's error, as the writers leave them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupReport {
    /// The newest backup a writer made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success: Option<LastBackup>,
    /// When a writer last tried, whatever came of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// Why the last attempt failed; absent when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One backup made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastBackup {
    /// The Oxide snapshot holding it.
    pub name: String,
    /// When k3s took the etcd snapshot.
    pub time: DateTime<Utc>,
    /// The k3s snapshot file it holds.
    pub k3s_snapshot: String,
    pub bytes: u64,
    /// Who made it: `schedule` (the in-cluster Job) or `bootstrap backup`.
    pub by: String,
}

impl BackupReport {
    pub fn from_json(s: &str) -> Option<BackupReport> {
        serde_json::from_str(s).ok()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// This report after an attempt at `at`: a success replaces the last one and clears the
    /// error; a failure keeps the last success.
    #[must_use]
    pub fn after(mut self, at: DateTime<Utc>, outcome: Result<LastBackup, String>) -> Self {
        self.last_attempt_at = Some(at);
        match outcome {
            Ok(b) => {
                // A laptop backup may land after a newer scheduled one: keep the newest.
                if self.last_success.as_ref().is_none_or(|l| l.time <= b.time) {
                    self.last_success = Some(b);
                }
                self.last_error = None;
            }
            Err(e) => self.last_error = Some(e),
        }
        self
    }
}

/// Prefix of k3s's scheduled snapshot files (`etcd-snapshot-name`'s default).
pub const SCHEDULED_PREFIX: &str = "etcd-snapshot-";

/// A scheduled snapshot file k3s wrote: `etcd-snapshot-<node>-<unix seconds>`; None for
/// anything else (on-demand snapshots, etcd's `.part` files still being written, compressed
/// ones).
pub fn scheduled_snapshot_time(file_name: &str) -> Option<DateTime<Utc>> {
    let rest = file_name.strip_prefix(SCHEDULED_PREFIX)?;
    let (node, secs) = rest.rsplit_once('-')?;
    if node.is_empty() || secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    DateTime::from_timestamp(secs.parse().ok()?, 0)
}

/// The `backup` part of `status.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The spec's schedule (absent: the in-cluster backup is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// What the writers reported (its keys inline: `lastSuccess`, `lastAttemptAt`,
    /// `lastError`).
    #[serde(flatten)]
    pub report: BackupReport,
    /// Since when a run has watched for backups (the age rule's start when none was ever
    /// made).
    pub watching_since: DateTime<Utc>,
    /// The newest backup is older than two schedule periods (the cluster is Degraded).
    pub stale: bool,
    /// The restore drills: the newest, the newest that passed, and what is wrong with them
    /// (set by the run from `drill.json`; see [`super::drill`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<super::drill::DrillStatus>,
    /// When a run last read `backup.json` ([`read_due`]); absent in runs before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<DateTime<Utc>>,
}

/// The longest a run goes without reading `backup.json` ([`read_due`]): it lives in the
/// backup writers' own object, one more request a run otherwise; between reads the last run's
/// view (this status) stands.
pub const READ_EVERY: Duration = Duration::hours(1);

/// Whether a run reads `backup.json` now: never read; read [`READ_EVERY`] ago; the last view
/// stale (re-read before saying so again); a control-plane roll waiting for a backup
/// (`roll_waiting`: it must see the new one as soon as it is there); or a tick of one of
/// `schedules` (the backup's, the drill's) came since the last read, up to the upload grace
/// after it (the new backup, or the one a drill due now restores, shows as soon as it is
/// made). With an hourly schedule and a run every 5 minutes that is two or three reads an
/// hour instead of twelve.
pub fn read_due(
    last: Option<&BackupStatus>,
    schedules: &[Option<&str>],
    roll_waiting: bool,
    now: DateTime<Utc>,
) -> bool {
    let Some(at) = last.and_then(|l| l.read_at) else {
        return true;
    };
    if roll_waiting || last.is_some_and(|l| l.stale) || now - at >= READ_EVERY {
        return true;
    }
    schedules
        .iter()
        .flatten()
        .filter_map(|s| crate::base::kcron::Schedule::parse(s).ok())
        .any(|s| {
            // A tick in (at - grace, now]: its backup may have come after the last read. The
            // grace is at most one period, so a short schedule is judged on its own scale.
            let period = s
                .next_after(at)
                .and_then(|t| Some(s.next_after(t)? - t))
                .unwrap_or(UPLOAD_GRACE);
            s.next_after(at - UPLOAD_GRACE.min(period))
                .is_some_and(|tick| tick <= now)
        })
}

/// How long after a tick the backup it makes may take before it counts as missed: the Job
/// waits for k3s's snapshot, then uploads it.
pub const UPLOAD_GRACE: Duration = Duration::minutes(10);

/// The backup status at `now`: stale when two ticks of `schedule` passed after the newest
/// backup (or, with none, after `watching_since`) and the upload grace after the second one
/// too (at most one period, so a short schedule is judged on its own scale). Never stale
/// without a schedule, nor with one that does not parse.
pub fn status(
    schedule: Option<&str>,
    report: &BackupReport,
    watching_since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> BackupStatus {
    let stale = schedule
        .and_then(|s| crate::base::kcron::Schedule::parse(s).ok())
        .is_some_and(|s| {
            let from = report
                .last_success
                .as_ref()
                .map_or(watching_since, |b| b.time);
            let Some(first) = s.next_after(from) else {
                return false;
            };
            let Some(second) = s.next_after(first) else {
                return false;
            };
            let grace = UPLOAD_GRACE.min(second - first);
            now > second + grace
        });
    BackupStatus {
        schedule: schedule.map(str::to_owned),
        report: report.clone(),
        watching_since,
        stale,
        drill: None,
        read_at: None,
    }
}

impl BackupStatus {
    /// The Degraded finding's words when stale.
    pub fn finding(&self) -> Option<String> {
        if !self.stale {
            return None;
        }
        let newest = self.report.last_success.as_ref().map_or_else(
            || format!("no backup since {}", self.watching_since.to_rfc3339()),
            |b| {
                format!(
                    "the newest backup {} is from {}",
                    b.name,
                    b.time.to_rfc3339()
                )
            },
        );
        let why = self
            .report
            .last_error
            .as_deref()
            .map_or_else(String::new, |e| format!("; the last attempt failed: {e}"));
        Some(format!(
            "{newest}, older than two periods of backup.schedule {:?}{why} (see the CronJob oxide-controller-backup/oxide-controller-backup; bootstrap backup takes one from a laptop)",
            self.schedule.as_deref().unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_json_is_read_after_a_tick_or_when_a_roll_or_a_stale_view_asks() {
        let t0: DateTime<Utc> = "2026-11-29T10:02:00Z".parse().unwrap_or_default();
        let hourly = [Some("0 * * * *"), Some("30 3 * * 0")];
        let mut last = status(hourly[0], &BackupReport::default(), t0, t0);
        let due = |last: &BackupStatus, roll: bool, at: Duration| {
            read_due(Some(last), &hourly, roll, t0 + at)
        };
        assert!(read_due(None, &hourly, false, t0));
        assert!(due(&last, false, Duration::zero()), "never read");
        // Read at 10:02, two minutes after the 10:00 tick: its upload may still come.
        last.read_at = Some(t0);
        assert!(due(&last, false, Duration::minutes(3)));
        // Read at 10:12, past the tick's grace: nothing new until the 11:00 tick.
        last.read_at = Some(t0 + Duration::minutes(10));
        assert!(!due(&last, false, Duration::minutes(15)));
        assert!(!due(&last, false, Duration::minutes(57)));
        assert!(due(&last, false, Duration::minutes(58)), "the 11:00 tick");
        assert!(due(&last, true, Duration::minutes(15)), "a roll waits");
        last.stale = true;
        assert!(due(&last, false, Duration::minutes(15)), "stale");
        // Without a schedule, every READ_EVERY; a schedule every minute, every run.
        last.stale = false;
        assert!(!read_due(
            Some(&last),
            &[None],
            false,
            t0 + Duration::minutes(40)
        ));
        assert!(read_due(
            Some(&last),
            &[None],
            false,
            t0 + Duration::minutes(70)
        ));
        let often = [Some("* * * * *")];
        assert!(read_due(
            Some(&last),
            &often,
            false,
            t0 + Duration::minutes(11)
        ));
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn last(time: &str) -> LastBackup {
        LastBackup {
            name: "c1-etcd-x".into(),
            time: at(time),
            k3s_snapshot: "etcd-snapshot-c1-cp-a-1".into(),
            bytes: 1,
            by: "schedule".into(),
        }
    }

    #[test]
    fn stale_only_after_two_missed_ticks_and_the_grace() {
        let report = BackupReport {
            last_success: Some(last("2026-11-27T10:00:05Z")),
            ..BackupReport::default()
        };
        let since = at("2026-11-27T00:00:00Z");
        let hourly = Some("0 * * * *");
        // Ticks at 11:00 and 12:00 missed; grace 10 min after 12:00.
        assert!(!status(hourly, &report, since, at("2026-11-27T12:09:00Z")).stale);
        let s = status(hourly, &report, since, at("2026-11-27T12:11:00Z"));
        assert!(s.stale);
        assert!(s.finding().unwrap().contains("c1-etcd-x"));
        // Off, or no schedule: never stale.
        assert!(!status(None, &report, since, at("2027-01-01T00:00:00Z")).stale);
        // No backup ever: counted from watching_since.
        let none = BackupReport::default();
        assert!(
            !status(
                hourly,
                &none,
                at("2026-11-27T12:30:00Z"),
                at("2026-11-27T14:05:00Z")
            )
            .stale
        );
        assert!(
            status(
                hourly,
                &none,
                at("2026-11-27T12:30:00Z"),
                at("2026-11-27T14:11:00Z")
            )
            .stale
        );
        // A short schedule gets at most one period of grace.
        let every = Some("@every 20s");
        let r = BackupReport {
            last_success: Some(last("2026-11-27T10:00:00Z")),
            ..BackupReport::default()
        };
        assert!(!status(every, &r, since, at("2026-11-27T10:01:00Z")).stale);
        assert!(status(every, &r, since, at("2026-11-27T10:01:01Z")).stale);
    }

    #[test]
    fn a_failure_keeps_the_last_success_and_a_success_clears_the_error() {
        let r = BackupReport::default()
            .after(at("2026-11-27T10:00:00Z"), Ok(last("2026-11-27T10:00:00Z")));
        let r = r.after(at("2026-11-27T11:00:30Z"), Err("quota".into()));
        assert_eq!(
            r.last_success.as_ref().unwrap().time,
            at("2026-11-27T10:00:00Z")
        );
        assert_eq!(r.last_error.as_deref(), Some("quota"));
        let r = r.after(at("2026-11-27T12:00:30Z"), Ok(last("2026-11-27T12:00:00Z")));
        assert_eq!(r.last_error, None);
        // An older backup landing later does not hide the newer one.
        let r = r.after(at("2026-11-27T12:01:00Z"), Ok(last("2026-11-27T09:00:00Z")));
        assert_eq!(r.last_success.unwrap().time, at("2026-11-27T12:00:00Z"));
        assert_eq!(
            BackupReport::from_json(&BackupReport::default().to_json()),
            Some(BackupReport::default())
        );
    }

    #[test]
    fn only_scheduled_snapshot_files_are_taken() {
        assert_eq!(
            scheduled_snapshot_time("etcd-snapshot-c1-cp-abcde-1795000000"),
            DateTime::from_timestamp(1_795_000_000, 0)
        );
        for other in [
            "on-demand-c1-cp-abcde-1795000000",
            "etcd-snapshot-c1-cp-abcde-1795000000.part",
            "etcd-snapshot-c1-cp-abcde-1795000000.zip",
            "etcd-snapshot-1795000000",
            "etcd-snapshot-node-",
        ] {
            assert_eq!(scheduled_snapshot_time(other), None, "{other}");
        }
    }
}
