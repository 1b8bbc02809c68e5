//! A backup before every roll of the control plane (issue 46 item 4): a roll that replaces
//! healthy servers (a spec drift, an upgrade step, later a certificate renewal) first finds a
//! backup taken *after* it was decided, so that whatever the roll breaks can be restored to
//! the cluster as it was when the roll began. The replacement of a dead server is no roll and
//! does not wait (it restores what was lost; waiting for a backup would hold a lost member).
//!
//! Pure: the run passes the roll it decided (what it rolls to, since when: [`decide`]) and what
//! the backup writers reported (`backup.json`); [`before_roll`] says whether the roll may take
//! its next step.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::BackupReport;

/// A roll of the control plane as a run decided it: the control-plane pool's spec hash it
/// rolls the servers to, and when a run first saw that it must. Kept in `status.json`
/// (`controlPlaneRoll`) while the roll lasts, so the decision time survives runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollDecision {
    /// The control-plane pool's spec hash the servers roll to.
    pub to: String,
    pub decided_at: DateTime<Utc>,
    /// Why the roll's next step waits, while it does (the finding's words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for_backup: Option<String>,
}

/// The roll this run is in: none when no server is to be rolled (`rolling_to` is None); the
/// previous run's decision when it rolls to the same spec; else a new one decided `now` (a
/// spec changed again mid-roll is a new decision: the backup must hold the cluster as it is
/// when that roll begins).
pub fn decide(
    previous: Option<&RollDecision>,
    rolling_to: Option<&str>,
    now: DateTime<Utc>,
) -> Option<RollDecision> {
    let to = rolling_to?;
    Some(match previous.filter(|p| p.to == to) {
        Some(p) => RollDecision {
            waiting_for_backup: None,
            ..p.clone()
        },
        None => RollDecision {
            to: to.to_owned(),
            decided_at: now,
            waiting_for_backup: None,
        },
    })
}

/// Whether a roll decided at some time may go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeforeRoll {
    /// A backup taken after the decision exists (or in-cluster backups are off, see
    /// [`before_roll`]): the roll goes on. The note, when any, says what the roll goes without.
    Proceed { note: Option<String> },
    /// No backup taken after the decision yet: the roll's next step waits.
    Wait {
        /// What the status says.
        message: String,
        /// A backup attempt made after the decision failed: a person should look (the
        /// cluster is Degraded while the roll waits for it).
        failed: bool,
    },
}

/// Whether a roll of the control plane decided at `decided_at` may take its next step: only
/// once the newest backup (`report`, what the backup writers left in `backup.json`) was taken
/// after the decision. Taken "after" by the etcd snapshot's own time, not the upload's: the
/// backup must hold the datastore as it was once the roll was decided. Backup times are whole
/// seconds (k3s names its snapshots by unix second), so one from the decision's own second
/// may have been taken before it and does not count.
///
/// With `schedule` None (the spec's `backup.schedule: null`, in-cluster backups off) the roll
/// proceeds with a note: the operator chose to take backups elsewhere, and nothing in the
/// cluster could take one. Otherwise it waits for the next scheduled backup (due at
/// `next_tick`, when the schedule parses) or one taken from a laptop; an attempt after the
/// decision that failed holds the roll too, and says why.
pub fn before_roll(
    decided_at: DateTime<Utc>,
    report: &BackupReport,
    schedule: Option<&str>,
    cluster: &str,
) -> BeforeRoll {
    let newest = report.last_success.as_ref();
    if newest.is_some_and(|b| b.time > decided_at) {
        return BeforeRoll::Proceed { note: None };
    }
    let decided = decided_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let Some(schedule) = schedule else {
        return BeforeRoll::Proceed {
            note: Some(format!(
                "control plane: rolling without a backup taken after the roll was decided ({decided}): backup.schedule is off (bootstrap backup --cluster {cluster} takes one from a laptop)"
            )),
        };
    };
    let newest = newest.map_or_else(
        || "no backup was ever taken".to_owned(),
        |b| {
            format!(
                "the newest backup, {}, is from {}",
                b.name,
                b.time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        },
    );
    let failed = report
        .last_attempt_at
        .filter(|at| *at > decided_at)
        .and(report.last_error.as_deref());
    let next = crate::base::kcron::Schedule::parse(schedule)
        .ok()
        .and_then(|s| s.next_after(decided_at))
        .map_or_else(String::new, |t| {
            format!(
                " (the next is due at {})",
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        });
    let take_one = format!("bootstrap backup --cluster {cluster} takes one now");
    match failed {
        Some(e) => BeforeRoll::Wait {
            message: format!(
                "{WAIT_REASON}: the roll of the control plane decided at {decided} is held: the backup attempted after it failed: {e}; {newest}. It goes on once a backup succeeds: the next scheduled one{next}, or {take_one}"
            ),
            failed: true,
        },
        None => BeforeRoll::Wait {
            message: format!(
                "{WAIT_REASON}: the roll of the control plane decided at {decided} waits for a backup taken after it; {newest}. It goes on after the next scheduled backup (backup.schedule {schedule:?}){next}, or {take_one}"
            ),
            failed: false,
        },
    }
}

/// The first word of a held roll's finding (and the Degraded reason when its backup failed).
pub const WAIT_REASON: &str = "RollWaitsForBackup";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::backup::LastBackup;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn backup_at(time: &str) -> LastBackup {
        LastBackup {
            name: "c-etcd-x".into(),
            time: at(time),
            k3s_snapshot: "etcd-snapshot-c-cp-a-1".into(),
            bytes: 1,
            by: "schedule".into(),
        }
    }

    #[test]
    fn a_decision_is_kept_while_the_roll_goes_to_the_same_spec() {
        let t0 = at("2026-11-27T10:00:00Z");
        let t1 = at("2026-11-27T10:05:00Z");
        assert_eq!(decide(None, None, t0), None);
        let d = decide(None, Some("h1"), t0).unwrap();
        assert_eq!((d.to.as_str(), d.decided_at), ("h1", t0));
        // The next run, same target: the first decision's time stays.
        let mut waiting = d.clone();
        waiting.waiting_for_backup = Some("w".into());
        let kept = decide(Some(&waiting), Some("h1"), t1).unwrap();
        assert_eq!(kept.decided_at, t0);
        assert_eq!(kept.waiting_for_backup, None, "each run says again");
        // The spec changed mid-roll: a new decision, a new backup to wait for.
        assert_eq!(decide(Some(&d), Some("h2"), t1).unwrap().decided_at, t1);
        // Done rolling: nothing kept.
        assert_eq!(decide(Some(&d), None, t1), None);
    }

    #[test]
    fn a_roll_goes_on_only_after_a_backup_taken_after_its_decision() {
        let decided = at("2026-11-27T10:20:00Z");
        let hourly = Some("0 * * * *");
        // No backup ever: waits, and says when the next is due and how to take one.
        let none = BackupReport::default();
        let BeforeRoll::Wait { message, failed } = before_roll(decided, &none, hourly, "prod")
        else {
            panic!("no backup: must wait")
        };
        assert!(!failed);
        assert!(message.starts_with(WAIT_REASON), "{message}");
        assert!(message.contains("no backup was ever taken"), "{message}");
        assert!(message.contains("2026-11-27T11:00:00Z"), "{message}");
        assert!(
            message.contains("bootstrap backup --cluster prod"),
            "{message}"
        );
        // A backup from before the decision does not count, not even one the same second.
        for old in ["2026-11-27T10:00:00Z", "2026-11-27T10:20:00Z"] {
            let r = BackupReport {
                last_success: Some(backup_at(old)),
                ..BackupReport::default()
            };
            assert!(
                matches!(
                    before_roll(decided, &r, hourly, "prod"),
                    BeforeRoll::Wait { failed: false, .. }
                ),
                "{old}"
            );
        }
        // Decided within a second, a backup stamped with that second may be from before it.
        let mid_second = decided + chrono::Duration::milliseconds(300);
        let r = BackupReport {
            last_success: Some(backup_at("2026-11-27T10:20:00Z")),
            ..BackupReport::default()
        };
        assert!(matches!(
            before_roll(mid_second, &r, hourly, "prod"),
            BeforeRoll::Wait { .. }
        ));
        // One taken after: go.
        let r = BackupReport {
            last_success: Some(backup_at("2026-11-27T11:00:00Z")),
            ..BackupReport::default()
        };
        assert_eq!(
            before_roll(decided, &r, hourly, "prod"),
            BeforeRoll::Proceed { note: None }
        );
    }

    #[test]
    fn a_failed_backup_after_the_decision_holds_the_roll_and_says_why() {
        let decided = at("2026-11-27T10:20:00Z");
        let r = BackupReport {
            last_success: Some(backup_at("2026-11-27T10:00:00Z")),
            last_attempt_at: Some(at("2026-11-27T11:00:40Z")),
            last_error: Some("quota exceeded".into()),
        };
        let BeforeRoll::Wait { message, failed } =
            before_roll(decided, &r, Some("0 * * * *"), "prod")
        else {
            panic!("a failed backup must hold the roll")
        };
        assert!(failed);
        assert!(message.contains("failed: quota exceeded"), "{message}");
        assert!(message.contains("c-etcd-x"), "{message}");
        // A failure from before the decision is no news about this roll: it just waits.
        let earlier = BackupReport {
            last_attempt_at: Some(at("2026-11-27T10:00:40Z")),
            ..r
        };
        assert!(matches!(
            before_roll(decided, &earlier, Some("0 * * * *"), "prod"),
            BeforeRoll::Wait { failed: false, .. }
        ));
    }

    #[test]
    fn with_in_cluster_backups_off_the_roll_goes_on_and_says_so() {
        let decided = at("2026-11-27T10:20:00Z");
        let BeforeRoll::Proceed { note: Some(note) } =
            before_roll(decided, &BackupReport::default(), None, "prod")
        else {
            panic!("off: proceed with a note")
        };
        assert!(note.contains("backup.schedule is off"), "{note}");
    }
}
