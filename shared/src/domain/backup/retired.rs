//! Snapshots that still hold a retired key (audit security-2 N1, fix 4). An older controller
//! kept keys in Secret `kube-system/oxide-controller` that no version may keep
//! ([`crate::base::secrets::keys::RETIRED`]: the controller's SSH private key first); bootstrap
//! removes them when it next ensures the state. An etcd snapshot taken before that removal
//! still holds them, and a backup would keep them on the rack for as long as retention keeps
//! it. So bootstrap records when it removed them, in the ConfigMap's
//! [`CONFIG_KEY`], and no backup uploads a snapshot
//! taken before ([`check_snapshot`]).
//!
//! The record is written in two steps so that a run cut short never leaves a removal
//! unrecorded: [`REMOVING`] before the Secret is rewritten, the time (RFC 3339, whole seconds
//! rounded up) once it was ([`finished`]). While it says [`REMOVING`] every snapshot may
//! hold the keys; the next bootstrap run writes the time. Pure: the clock is passed in.

use chrono::{DateTime, Duration, SecondsFormat, SubsecRound as _, Utc};

/// The ConfigMap key of the record (`crate::ports::state::keys::RETIRED_KEYS_REMOVED_AT`).
pub const CONFIG_KEY: &str = "retired-keys-removed-at";

/// The record while the Secret is being rewritten (or a run was cut short doing it).
pub const REMOVING: &str = "removing";

/// What the ConfigMap records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetiredKeys {
    /// The removal began and was not seen to finish.
    Removing,
    /// The Secret held no retired key from this time on (server clocks: see the README).
    RemovedAt(DateTime<Utc>),
}

impl RetiredKeys {
    /// The recorded value; `None` when it is neither [`REMOVING`] nor an RFC 3339 time.
    pub fn parse(value: &str) -> Option<RetiredKeys> {
        let value = value.trim();
        if value == REMOVING {
            return Some(RetiredKeys::Removing);
        }
        DateTime::parse_from_rfc3339(value)
            .ok()
            .map(|t| RetiredKeys::RemovedAt(t.with_timezone(&Utc)))
    }

    /// The value to record.
    pub fn value(&self) -> String {
        match self {
            RetiredKeys::Removing => REMOVING.to_owned(),
            RetiredKeys::RemovedAt(t) => t.to_rfc3339_opts(SecondsFormat::Secs, true),
        }
    }
}

/// The record once a removal is known to have finished by `now`: `now` rounded up to whole
/// seconds (a snapshot's time has whole seconds), never earlier than a time already recorded
/// (a later removal of another retired key moves it on, never back). `None`: nothing to
/// write (the record already says so).
pub fn finished(recorded: Option<&str>, now: DateTime<Utc>) -> Option<String> {
    let up = if now.trunc_subsecs(0) == now {
        now
    } else {
        now.trunc_subsecs(0) + Duration::seconds(1)
    };
    match recorded.and_then(RetiredKeys::parse) {
        Some(RetiredKeys::RemovedAt(t)) if t >= up => None,
        _ => Some(RetiredKeys::RemovedAt(up).value()),
    }
}

/// Whether the snapshot `file`, taken at `time`, may go to the rack given the ConfigMap's
/// record `recorded`: only if taken after the retired keys left the Secret. `Err` says why not
/// and what happens next (for the log and `backup.json`).
pub fn check_snapshot(
    recorded: Option<&str>,
    file: &str,
    time: DateTime<Utc>,
) -> Result<(), String> {
    let key = CONFIG_KEY;
    let why = "an older controller kept its SSH private key (and the webhook's TLS key) there";
    match recorded.map(|v| (v, RetiredKeys::parse(v))) {
        None => Ok(()),
        Some((_, Some(RetiredKeys::RemovedAt(at)))) if time > at => Ok(()),
        Some((_, Some(RetiredKeys::RemovedAt(at)))) => Err(format!(
            "not uploading etcd snapshot {file} (taken {}): it predates {} ({key} in ConfigMap \
             kube-system/oxide-controller), when bootstrap removed the retired keys from Secret \
             kube-system/oxide-controller ({why}), so it still holds them and a backup would keep \
             them on the rack; the next snapshot k3s takes goes up (`bootstrap backup` takes one \
             now), and `bootstrap rotate-ssh-key` makes the old key useless",
            time.to_rfc3339_opts(SecondsFormat::Secs, true),
            at.to_rfc3339_opts(SecondsFormat::Secs, true),
        )),
        Some((_, Some(RetiredKeys::Removing))) => Err(format!(
            "not uploading etcd snapshot {file}: {key} in ConfigMap kube-system/oxide-controller \
             says bootstrap began removing the retired keys from Secret \
             kube-system/oxide-controller ({why}) and was not seen to finish, so any snapshot may \
             still hold them; re-run bootstrap, which finishes the removal and records its time"
        )),
        Some((v, None)) => Err(format!(
            "not uploading etcd snapshot {file}: {key} in ConfigMap kube-system/oxide-controller \
             is {v:?}, neither {REMOVING:?} nor an RFC 3339 time, so whether the snapshot holds \
             the retired keys ({why}) is unknown; re-run bootstrap, which records the time again"
        )),
    }
}

/// Whether a snapshot taken just now (`bootstrap backup`'s own) may go to the rack: it
/// postdates any removal that finished, so only a record that does not say when (a bootstrap
/// cut short while it removed the keys: the Secret may still hold them) refuses it.
pub fn check_new_snapshot(recorded: Option<&str>, file: &str) -> Result<(), String> {
    match recorded.map(RetiredKeys::parse) {
        None | Some(Some(RetiredKeys::RemovedAt(_))) => Ok(()),
        Some(_) => check_snapshot(recorded, file, DateTime::<Utc>::MAX_UTC),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_snapshot_before_the_removal_is_refused_and_one_after_it_goes_up() {
        let at = "2026-11-29T10:00:05Z";
        let e =
            check_snapshot(Some(at), "etcd-snapshot-a-1", t("2026-11-29T10:00:00Z")).unwrap_err();
        assert!(
            e.contains("etcd-snapshot-a-1")
                && e.contains(at)
                && e.contains("retired-keys-removed-at")
                && e.contains("next snapshot"),
            "{e}"
        );
        // The same second is not after: the snapshot may have begun before the removal.
        assert!(check_snapshot(Some(at), "f", t(at)).is_err());
        assert_eq!(
            check_snapshot(Some(at), "f", t("2026-11-29T10:00:06Z")),
            Ok(())
        );
        // No record: no retired key was ever removed by a controller that records it.
        assert_eq!(check_snapshot(None, "f", t(at)), Ok(()));
    }

    #[test]
    fn an_unfinished_or_unreadable_record_refuses_every_snapshot_and_says_rerun_bootstrap() {
        let late = t("2030-01-01T00:00:00Z");
        for v in [REMOVING, "yesterday"] {
            let e = check_snapshot(Some(v), "f", late).unwrap_err();
            assert!(e.contains("re-run bootstrap"), "{e}");
            let e = check_new_snapshot(Some(v), "on-demand-x").unwrap_err();
            assert!(
                e.contains("on-demand-x") && e.contains("re-run bootstrap"),
                "{e}"
            );
        }
        // A snapshot taken now postdates a finished removal, whatever the clocks say.
        assert_eq!(
            check_new_snapshot(Some("2030-01-01T00:00:00Z"), "f"),
            Ok(())
        );
        assert_eq!(check_new_snapshot(None, "f"), Ok(()));
    }

    #[test]
    fn the_finish_rounds_up_and_never_moves_back() {
        let now = t("2026-11-29T10:00:05.250Z");
        assert_eq!(finished(None, now).as_deref(), Some("2026-11-29T10:00:06Z"));
        assert_eq!(
            finished(Some(REMOVING), now).as_deref(),
            Some("2026-11-29T10:00:06Z")
        );
        assert_eq!(
            finished(Some("garbage"), now).as_deref(),
            Some("2026-11-29T10:00:06Z")
        );
        assert_eq!(
            finished(Some("2026-11-29T09:00:00Z"), now).as_deref(),
            Some("2026-11-29T10:00:06Z")
        );
        assert_eq!(finished(Some("2026-11-29T10:00:06Z"), now), None);
        assert_eq!(
            RetiredKeys::parse(&finished(None, t("2026-11-29T10:00:05Z")).unwrap()),
            Some(RetiredKeys::RemovedAt(t("2026-11-29T10:00:05Z")))
        );
    }
}
