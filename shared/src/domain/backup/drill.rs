//! Restore drills (issue 46 item 4): what a drill found, as its runner leaves it in the
//! ConfigMap (`drill.json`), and how a run judges it: the cluster is Degraded when the newest
//! drill failed (`DrillFailed`) or when no drill succeeded within two periods of
//! `backup.drill_schedule` (`DrillMissing`). Pure: the clock is passed in.
//!
//! The reconcile runs the scheduled drill itself ([`next`], [`judge`]): a run that finds one due
//! (a tick of the schedule since the last drill began), a backup to drill and nothing else to
//! do starts it and records it running ([`DrillRunning`]); later runs read the drill server's
//! verdict off its serial console ([`Console`]) and record it, then delete what the drill made.

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
    /// When it began (the scheduled drill's; a drill from a laptop records only its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<DateTime<Utc>>,
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
    /// The scheduled drill under way, as the run that started it recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<DrillRunning>,
}

/// A scheduled drill under way: its throw-away server restores `backup`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillRunning {
    pub server: String,
    pub backup: String,
    pub backup_time: DateTime<Utc>,
    /// What the backup counted ([`crate::domain::backup::BackupTag::objects`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_objects: Option<u64>,
    pub started: DateTime<Utc>,
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

    /// This report after the scheduled drill under way ended in `drill`.
    #[must_use]
    pub fn finished(mut self, drill: DrillResult) -> Self {
        self.running = None;
        self.after(drill)
    }
}

/// First words of a drill server's description (and its disks'): not a member's
/// [`crate::base::names::InstanceTag`], so no run takes it for a member of any cluster, and
/// nothing but a drill has it (a real cluster named `<cluster>-drill` has member tags).
pub const SERVER_DESCRIPTION_PREFIX: &str = "oxide-controller restore-drill ";

/// A drill server's description: `oxide-controller restore-drill cluster=C backup=B`.
pub fn server_description(cluster: &str, backup: &str) -> String {
    format!("{SERVER_DESCRIPTION_PREFIX}cluster={cluster} backup={backup}")
}

/// The cluster whose drill server a description names ([`server_description`]).
pub fn server_of(description: &str) -> Option<&str> {
    description
        .strip_prefix(SERVER_DESCRIPTION_PREFIX)?
        .split_whitespace()
        .find_map(|w| w.strip_prefix("cluster="))
}

/// The description of a drill's floating IP (`<cluster>-drill-apiserver`).
pub fn address_description(cluster: &str) -> String {
    format!("oxide-controller: restore drill of cluster {cluster}")
}

/// Who runs the scheduled drill ([`DrillResult::by`]).
pub const BY_SCHEDULE: &str = "schedule";
/// How long a scheduled drill may take from its server's create to its verdict on the console
/// (an image boot, k3s's install, a restore and k3s's start take minutes on a rack; k3s's own
/// start is given 300 s by the setup script): later it is failed and cleaned up.
pub const DRILL_TIMEOUT: Duration = Duration::minutes(30);

/// The line the drill server's setup prints on its serial console once its restored API
/// answers: `oxide-controller: drill: restored objects=N` (N: objects of
/// [`crate::domain::backup::COUNTED_KINDS`] it holds, counted with k3s's own kubectl).
pub const RESTORED_MARKER: &str = "oxide-controller: drill: restored objects=";

/// The restored object count on a drill server's console, if it printed one (the last wins).
pub fn restored_objects(console: &str) -> Option<u64> {
    console.lines().rev().find_map(|l| {
        let rest = &l[l.find(RESTORED_MARKER)? + RESTORED_MARKER.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// Why a drill that restored `restored` objects fails: fewer than the backup counted. The
/// count is of objects created before the snapshot ([`crate::domain::backup::created_before`]),
/// so a correct restore holds at least that many; more is what was deleted between the
/// snapshot and the count (the restore brings it back), never a loss.
pub fn count_mismatch(expected: Option<u64>, restored: u64) -> Option<String> {
    match expected {
        Some(n) if restored < n => Some(format!(
            "the restored API holds {restored} objects where the backup counted {n}"
        )),
        _ => None,
    }
}

/// What the scheduled drill's run does, decided from what it already read (the ConfigMap, the
/// instance list, the plan): nothing when no drill is due, running or left behind, so such a
/// run makes no request for drills.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrillPlan {
    /// Start a drill of the newest backup.
    pub start: bool,
    /// Read the console of the drill under way and judge it ([`judge`]).
    pub watch: Option<DrillRunning>,
    /// The running drill's server is not on the rack: its start was cut short before the
    /// create (the run records the drill first). Forget it (no result: the drill is due
    /// again) and delete what it may have made.
    pub vanished: Option<DrillRunning>,
    /// Drill servers on the rack of no drill under way, made more than [`DRILL_TIMEOUT`] ago:
    /// delete them (with their disks, and the drill's address unless a drill is under way).
    /// A younger one is a drill from a laptop (`bootstrap recover --verify`) under way: it is
    /// left alone, and no scheduled drill starts beside it.
    pub clean: Vec<String>,
}

/// The scheduled drill's next step. `drill_servers`: the instances of the drill's throw-away
/// cluster on the rack, with when each was made; `quiet`: the run plans nothing else and finds
/// nothing Degraded; `has_backup`: a backup writer reported one (`backup.json`).
pub fn next(
    schedule: Option<&str>,
    report: &DrillReport,
    drill_servers: &[(String, DateTime<Utc>)],
    quiet: bool,
    has_backup: bool,
    watching_since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> DrillPlan {
    let mut plan = DrillPlan::default();
    let running = report.running.as_ref();
    let others: Vec<&(String, DateTime<Utc>)> = drill_servers
        .iter()
        .filter(|(s, _)| running.is_none_or(|r| r.server != *s))
        .collect();
    plan.clean = others
        .iter()
        .filter(|(_, made)| now - *made > DRILL_TIMEOUT)
        .map(|(s, _)| s.clone())
        .collect();
    if let Some(r) = running {
        if drill_servers.iter().any(|(s, _)| *s == r.server) {
            plan.watch = Some(r.clone());
        } else {
            plan.vanished = Some(r.clone());
        }
        return plan;
    }
    plan.start =
        quiet && has_backup && others.is_empty() && due(schedule, report, watching_since, now);
    plan
}

/// A tick of `schedule` came after the last drill began (or, with none, after the runs began
/// watching): a drill is due.
pub fn due(
    schedule: Option<&str>,
    report: &DrillReport,
    watching_since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> bool {
    let Some(s) = schedule.and_then(|s| crate::base::kcron::Schedule::parse(s).ok()) else {
        return false;
    };
    let from = report.last.as_ref().map_or(watching_since, |d| {
        d.started.unwrap_or(d.at).max(watching_since)
    });
    s.next_after(from).is_some_and(|tick| tick <= now)
}

/// What the drill server's console says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Console {
    /// Its restored API answered holding this many objects of the counted kinds.
    Restored(u64),
    /// A setup step failed (the node-setup failure marker): `step: reason`.
    Failed(String),
    /// Nothing yet (or the console could not be read).
    Nothing,
}

/// The verdict on the drill under way at `now`: its result, or `None` while it may still
/// report. `cleaned_up` is false: the caller sets it once the drill's things are deleted.
pub fn judge(running: &DrillRunning, console: &Console, now: DateTime<Utc>) -> Option<DrillResult> {
    let mut r = DrillResult {
        at: now,
        backup: Some(running.backup.clone()),
        backup_time: Some(running.backup_time),
        ok: false,
        reason: None,
        expected_objects: running.expected_objects,
        restored_objects: None,
        restore_seconds: None,
        cleaned_up: false,
        by: BY_SCHEDULE.to_owned(),
        started: Some(running.started),
    };
    match console {
        Console::Restored(n) => {
            r.restored_objects = Some(*n);
            // Seen by a run, not timed by the server: an upper bound (one run period at most).
            r.restore_seconds = Some((now - running.started).as_seconds_f64());
            r.reason = count_mismatch(running.expected_objects, *n);
            r.ok = r.reason.is_none();
        }
        Console::Failed(why) => {
            r.reason = Some(format!(
                "the drill server's setup failed at step {why}: the backup {} does not restore",
                running.backup
            ));
        }
        Console::Nothing if now - running.started > DRILL_TIMEOUT => {
            r.reason = Some(format!(
                "the drill server {} printed no result within {} minutes of its create: the backup {} may not restore (see the server's serial console before the next drill deletes it)",
                running.server,
                DRILL_TIMEOUT.num_minutes(),
                running.backup
            ));
        }
        Console::Nothing => return None,
    }
    Some(r)
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
                    "; NOT everything it made was deleted (the run log says what): the runs delete a drill server left behind once it is 30 minutes old, and the next drill its address"
                };
                Some(format!(
                    "{FAILED}: the restore drill of backup {backup} at {} ({}) failed: {}{left}. The backups may not restore: drill again with bootstrap recover --verify, and take a new backup",
                    time(d.at),
                    d.by,
                    d.reason.as_deref().unwrap_or("no reason given")
                ))
            }
            MISSING => Some(format!(
                "{MISSING}: no restore drill passed since {}, more than two periods of backup.drill_schedule {:?}: the runs start a drill at a tick only with a backup to drill and nothing else under way (see backup.drill in status.json and the run log); drill by hand with bootstrap recover --verify, or set backup.drill_schedule to null to stop expecting drills",
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
            started: None,
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

    fn running(server: &str, started: &str) -> DrillRunning {
        DrillRunning {
            server: server.into(),
            backup: "c-etcd-20261127-100000".into(),
            backup_time: at("2026-11-27T10:00:00Z"),
            expected_objects: Some(60),
            started: at(started),
        }
    }

    /// Sundays 03:30 (the default); 2026-11-29 is a Sunday.
    const WEEKLY: Option<&str> = Some("30 3 * * 0");

    #[test]
    fn a_drill_is_due_once_a_tick_passed_since_the_last_one_began() {
        let since = at("2026-11-01T00:00:00Z");
        let last = DrillReport::default().after(DrillResult {
            started: Some(at("2026-11-22T03:31:00Z")),
            ..drill("2026-11-22T03:40:00Z", true)
        });
        // Before this Sunday's tick: not due; after it: due; never without a schedule.
        assert!(!due(WEEKLY, &last, since, at("2026-11-29T03:29:00Z")));
        assert!(due(WEEKLY, &last, since, at("2026-11-29T03:31:00Z")));
        assert!(!due(None, &last, since, at("2027-01-01T00:00:00Z")));
        // A drill that began after the tick covers it.
        let after = last.clone().after(DrillResult {
            started: Some(at("2026-11-29T03:32:00Z")),
            ..drill("2026-11-29T03:40:00Z", false)
        });
        assert!(!due(WEEKLY, &after, since, at("2026-12-05T00:00:00Z")));
        // None ever: counted from when the runs began watching, so a new cluster drills at
        // the first tick after it exists, not at once.
        let none = DrillReport::default();
        let watching = at("2026-11-29T04:00:00Z");
        assert!(!due(WEEKLY, &none, watching, at("2026-12-06T03:29:00Z")));
        assert!(due(WEEKLY, &none, watching, at("2026-12-06T03:31:00Z")));
    }

    #[test]
    fn a_due_drill_starts_only_with_a_backup_and_nothing_else_planned() {
        let since = at("2026-11-01T00:00:00Z");
        let now = at("2026-11-29T03:31:00Z");
        let none = DrillReport::default();
        let start = |quiet, backup| next(WEEKLY, &none, &[], quiet, backup, since, now).start;
        assert!(start(true, true));
        assert!(!start(false, true), "something else planned or Degraded");
        assert!(!start(true, false), "no backup to drill");
        // Not due: nothing at all (no request for drills).
        assert_eq!(
            next(
                WEEKLY,
                &none,
                &[],
                true,
                true,
                since,
                at("2026-11-01T01:00:00Z")
            ),
            DrillPlan::default()
        );
    }

    #[test]
    fn one_drill_at_a_time_and_its_server_is_never_taken_for_a_leftover() {
        let since = at("2026-11-01T00:00:00Z");
        let now = at("2026-11-29T03:40:00Z");
        let under_way = DrillReport {
            running: Some(running("c-drill-cp-aaaaa", "2026-11-29T03:31:00Z")),
            ..DrillReport::default()
        };
        let servers = [
            ("c-drill-cp-aaaaa".to_owned(), at("2026-11-29T03:31:30Z")),
            ("c-drill-cp-bbbbb".to_owned(), at("2026-11-28T00:00:00Z")),
        ];
        let p = next(WEEKLY, &under_way, &servers, true, true, since, now);
        assert!(!p.start, "a drill is under way");
        assert_eq!(
            p.watch.as_ref().map(|r| r.server.as_str()),
            Some("c-drill-cp-aaaaa")
        );
        assert_eq!(p.clean, ["c-drill-cp-bbbbb"], "only the one of no drill");
        assert_eq!(p.vanished, None);
        // A server left behind (no drill under way): deleted, and no new drill until it is gone.
        let p = next(
            WEEKLY,
            &DrillReport::default(),
            &servers[1..],
            true,
            true,
            since,
            now,
        );
        assert_eq!(p.clean, ["c-drill-cp-bbbbb"]);
        assert!(!p.start);
        // A young one of no scheduled drill is a laptop's drill under way: kept, and no
        // scheduled drill starts beside it.
        let laptop = [("c-drill-cp-ccccc".to_owned(), at("2026-11-29T03:35:00Z"))];
        let p = next(
            WEEKLY,
            &DrillReport::default(),
            &laptop,
            true,
            true,
            since,
            now,
        );
        assert!(p.clean.is_empty(), "{p:?}");
        assert!(!p.start);
        // The drill under way has no server (its start was cut short): forgotten, cleaned.
        let p = next(WEEKLY, &under_way, &[], true, true, since, now);
        assert_eq!(
            p.vanished.as_ref().map(|r| r.server.as_str()),
            Some("c-drill-cp-aaaaa")
        );
        assert_eq!(p.watch, None);
        assert!(!p.start);
    }

    #[test]
    fn the_drill_servers_console_decides_and_silence_times_out() {
        let r = running("c-drill-cp-aaaaa", "2026-11-29T03:31:00Z");
        let soon = at("2026-11-29T03:40:00Z");
        assert_eq!(judge(&r, &Console::Nothing, soon), None, "still under way");
        let passed = judge(&r, &Console::Restored(60), soon).unwrap();
        assert!(passed.ok && passed.reason.is_none(), "{passed:?}");
        assert_eq!(passed.restored_objects, Some(60));
        assert_eq!(passed.started, Some(r.started));
        assert_eq!(passed.by, BY_SCHEDULE);
        assert!(!passed.cleaned_up, "the caller cleans up, then says so");
        let short = judge(&r, &Console::Restored(41), soon).unwrap();
        assert!(!short.ok);
        assert_eq!(
            short.reason.as_deref(),
            Some("the restored API holds 41 objects where the backup counted 60")
        );
        let broken = judge(
            &r,
            &Console::Failed(
                "etcd-restore: the backup's etcd snapshot does not match its sha256".into(),
            ),
            soon,
        )
        .unwrap();
        assert!(!broken.ok);
        assert!(
            broken
                .reason
                .as_deref()
                .unwrap()
                .contains("step etcd-restore"),
            "{broken:?}"
        );
        let late = r.started + DRILL_TIMEOUT + Duration::seconds(1);
        let silent = judge(&r, &Console::Nothing, late).unwrap();
        assert!(!silent.ok);
        assert!(
            silent
                .reason
                .as_deref()
                .unwrap()
                .contains("no result within 30 minutes")
        );
        // The result ends the drill under way in drill.json.
        let report = DrillReport {
            running: Some(r),
            ..DrillReport::default()
        }
        .finished(passed);
        assert_eq!(report.running, None);
        assert_eq!(report.last_success_at, Some(soon));
    }

    #[test]
    fn a_drill_servers_description_names_its_cluster_and_no_member_tag_does() {
        let d = server_description("demo", "demo-etcd-20261127t090000z");
        assert_eq!(server_of(&d), Some("demo"));
        assert!(crate::base::names::InstanceTag::parse(&d).is_none());
        let member = crate::base::names::InstanceTag {
            cluster: "demo-drill".into(),
            pool: "control-plane".into(),
            spec_hash: "0".into(),
        }
        .to_string();
        assert_eq!(
            server_of(&member),
            None,
            "a cluster named demo-drill is no drill"
        );
    }

    #[test]
    fn the_restored_count_is_read_off_the_console() {
        let console = "[ 12.000000] cloud-init[901]: x\noxide-controller: node-setup: drill-report\n[ 40.1] oxide-controller: drill: restored objects=57\r\n";
        assert_eq!(restored_objects(console), Some(57));
        assert_eq!(
            restored_objects("oxide-controller: node-setup: k3s-start\n"),
            None
        );
    }

    /// The backup counts what was made before its snapshot: a correct restore holds at least
    /// that many (more when something was deleted between the snapshot and the count); fewer
    /// is a loss. (An exact comparison failed drills of a cluster that made one ConfigMap
    /// between k3s's scheduled snapshot and the backup Job's count: seen in CI.)
    #[test]
    fn a_drill_fails_only_when_the_restore_holds_fewer_objects_than_counted() {
        assert_eq!(
            count_mismatch(Some(61), 62),
            None,
            "a deletion after the snapshot"
        );
        assert_eq!(count_mismatch(Some(61), 61), None);
        assert_eq!(
            count_mismatch(Some(62), 61).as_deref(),
            Some("the restored API holds 61 objects where the backup counted 62")
        );
        assert_eq!(count_mismatch(None, 0), None, "nothing to compare");
    }
}
