//! Restore drills (issue 46 item 4): what a drill found, as its runner leaves it in the
//! ConfigMap (`drill.json`), and how a run judges it: the cluster is Degraded when the newest
//! drill failed (`DrillFailed`) or when no drill succeeded within two periods of
//! `backup.drill_schedule` (`DrillMissing`). Pure: the clock is passed in.

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

/// One drill: which backup, when, and what came of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillResult {
    /// When the drill finished.
    pub at: DateTime<Utc>,
    /// The backup drilled (its snapshot's name), when one was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// When that backup was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_time: Option<DateTime<Utc>>,
    pub ok: bool,
    /// Why it failed; absent when it passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Objects of the counted kinds the backup recorded, and the restored API held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_objects: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_objects: Option<u64>,
    /// From the drill server's create to a ready API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_seconds: Option<f64>,
    /// Everything the drill made was deleted again.
    pub cleaned_up: bool,
    /// Who ran it: `schedule` (the in-cluster drill) or `bootstrap recover --verify`.
    pub by: String,
}

// f64 has no Eq; `restore_seconds` is never NaN (an elapsed time).
impl Eq for DrillResult {}

/// What `drill.json` holds: the newest drill and the newest that passed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillReport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<DrillResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<DateTime<Utc>>,
}

impl DrillReport {
    pub fn from_json(s: &str) -> Option<DrillReport> {
        serde_json::from_str(s).ok()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// This report after `drill`.
    #[must_use]
    pub fn after(mut self, drill: DrillResult) -> Self {
        if drill.ok {
            self.last_success_at = Some(self.last_success_at.map_or(drill.at, |t| t.max(drill.at)));
        }
        self.last = Some(drill);
        self
    }
}

/// The `drill` part of `status.json`'s `backup` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillStatus {
    /// The spec's `backup.drill_schedule` (absent: scheduled drills are off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(flatten)]
    pub report: DrillReport,
    /// `DrillFailed`, `DrillMissing`, or absent when the drills are fine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The Degraded reason when the newest drill failed.
pub const FAILED: &str = "DrillFailed";
/// The Degraded reason when no drill passed within two periods of the drill schedule.
pub const MISSING: &str = "DrillMissing";
/// How long a drill may take after its tick before it counts as missed (a restore, a boot and
/// k3s's start on a rack take minutes).
pub const DRILL_GRACE: Duration = Duration::hours(1);

/// The drill status at `now`: `DrillFailed` when the newest drill failed (whatever the
/// schedule: a backup that does not restore is news even when drills are run by hand);
/// `DrillMissing` when `schedule` is set and two of its ticks passed (plus [`DRILL_GRACE`], at
/// most one period) after the newest drill that passed, or, with none, after `watching_since`.
pub fn status(
    schedule: Option<&str>,
    report: &DrillReport,
    watching_since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> DrillStatus {
    let failed = report.last.as_ref().is_some_and(|d| !d.ok);
    let missing = schedule
        .and_then(|s| crate::base::kcron::Schedule::parse(s).ok())
        .is_some_and(|s| {
            let from = report.last_success_at.unwrap_or(watching_since);
            let Some(first) = s.next_after(from) else {
                return false;
            };
            let Some(second) = s.next_after(first) else {
                return false;
            };
            now > second + DRILL_GRACE.min(second - first)
        });
    DrillStatus {
        schedule: schedule.map(str::to_owned),
        report: report.clone(),
        problem: if failed {
            Some(FAILED.to_owned())
        } else if missing {
            Some(MISSING.to_owned())
        } else {
            None
        },
    }
}

impl DrillStatus {
    /// The Degraded finding's words (starting with the reason) when the drills are not fine.
    pub fn finding(&self, watching_since: DateTime<Utc>) -> Option<String> {
        let time = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Secs, true);
        match self.problem.as_deref()? {
            FAILED => {
                let d = self.report.last.as_ref()?;
                let backup = d.backup.as_deref().unwrap_or("(none chosen)");
                let left = if d.cleaned_up {
                    ""
                } else {
                    "; NOT everything it made was deleted: the next drill removes it, or bootstrap delete does"
                };
                Some(format!(
                    "{FAILED}: the restore drill of backup {backup} at {} ({}) failed: {}{left}. The backups may not restore: drill again with bootstrap recover --verify, and take a new backup",
                    time(d.at),
                    d.by,
                    d.reason.as_deref().unwrap_or("no reason given")
                ))
            }
            MISSING => Some(format!(
                "{MISSING}: no restore drill passed since {}, more than two periods of backup.drill_schedule {:?}: drill the newest backup with bootstrap recover --verify (or set backup.drill_schedule to null to stop expecting drills)",
                time(self.report.last_success_at.unwrap_or(watching_since)),
                self.schedule.as_deref().unwrap_or_default()
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn drill(time: &str, ok: bool) -> DrillResult {
        DrillResult {
            at: at(time),
            backup: Some("c-etcd-20261127-100000".into()),
            backup_time: Some(at("2026-11-27T10:00:00Z")),
            ok,
            reason: (!ok).then(|| "sha256 mismatch".into()),
            expected_objects: Some(60),
            restored_objects: ok.then_some(60),
            restore_seconds: Some(4.5),
            cleaned_up: true,
            by: "schedule".into(),
        }
    }

    #[test]
    fn the_newest_drill_failing_is_drill_failed_with_its_reason() {
        let since = at("2026-11-01T00:00:00Z");
        let now = at("2026-11-27T12:00:00Z");
        let weekly = Some("0 3 * * 0");
        let r = DrillReport::default()
            .after(drill("2026-11-27T11:00:00Z", true))
            .after(drill("2026-11-27T11:30:00Z", false));
        assert_eq!(r.last_success_at, Some(at("2026-11-27T11:00:00Z")));
        let s = status(weekly, &r, since, now);
        assert_eq!(s.problem.as_deref(), Some(FAILED));
        let f = s.finding(since).unwrap();
        assert!(f.starts_with("DrillFailed: "), "{f}");
        assert!(
            f.contains("sha256 mismatch") && f.contains("c-etcd-20261127-100000"),
            "{f}"
        );
        // Drills by hand only (no schedule): a failure still counts.
        assert_eq!(
            status(None, &r, since, now).problem.as_deref(),
            Some(FAILED)
        );
        // A passing drill after it clears it.
        let r = r.after(drill("2026-11-27T11:45:00Z", true));
        assert_eq!(status(weekly, &r, since, now).problem, None);
    }

    #[test]
    fn no_drill_passing_within_two_periods_is_drill_missing() {
        let weekly = Some("0 3 * * 0"); // Sundays 03:00; 2026-11-29 is a Sunday.
        let passed = DrillReport::default().after(drill("2026-11-29T03:10:00Z", true));
        let since = at("2026-11-01T00:00:00Z");
        // Ticks after it: 12-06 03:00 and 12-13 03:00; the grace is an hour.
        assert_eq!(
            status(weekly, &passed, since, at("2026-12-13T03:59:00Z")).problem,
            None
        );
        let s = status(weekly, &passed, since, at("2026-12-13T04:01:00Z"));
        assert_eq!(s.problem.as_deref(), Some(MISSING));
        assert!(s.finding(since).unwrap().starts_with("DrillMissing: "));
        // None ever: counted from when the runs started watching.
        let none = DrillReport::default();
        let watching = at("2026-11-29T04:00:00Z");
        assert_eq!(
            status(weekly, &none, watching, at("2026-12-13T03:30:00Z")).problem,
            None
        );
        assert_eq!(
            status(weekly, &none, watching, at("2026-12-13T04:01:00Z"))
                .problem
                .as_deref(),
            Some(MISSING)
        );
        // Scheduled drills off: never missing.
        assert_eq!(
            status(None, &none, watching, at("2027-06-01T00:00:00Z")).problem,
            None
        );
        assert_eq!(
            DrillReport::from_json(&passed.to_json())
                .unwrap()
                .last_success_at,
            passed.last_success_at
        );
    }
}
