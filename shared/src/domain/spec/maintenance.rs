//! The `maintenance:` block of `spec.yaml`: the windows in which the reconcile may disrupt
//! running members when nothing forces it (see [`crate::domain::maintenance`] for what is
//! decided from them).
//!
//! A window is a cron schedule (Kubernetes' dialect, [`crate::base::kcron`]) that opens it and
//! a duration, as a Karpenter NodePool disruption budget has (`schedule` + `duration`,
//! kubernetes-sigs/karpenter `pkg/apis/v1/nodepool.go`), on the wall clock of an IANA zone as
//! a CronJob's `spec.timeZone`.

use serde::{Deserialize, Serialize};

/// `maintenance:` (absent or without windows: no window, anything may roll at any time, as
/// before the block existed).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceSpec {
    /// Roll-outs that are not urgent start only while one of these is open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<MaintenanceWindow>,
}

/// One window: opened by `cron`, open for `duration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceWindow {
    /// Five-field cron schedule (a CronJob's), e.g. `0 2 * * sat`: when the window opens.
    pub cron: String,
    /// How long it stays open, in hours and minutes as Karpenter's budget `duration`: `4h`,
    /// `90m`, `1h30m`.
    pub duration: String,
    /// IANA zone whose wall clock `cron` follows (a CronJob's `spec.timeZone`), e.g.
    /// `Europe/Berlin`; default UTC.
    #[serde(default = "utc", skip_serializing_if = "is_utc")]
    pub time_zone: String,
}

fn utc() -> String {
    "UTC".into()
}

fn is_utc(z: &str) -> bool {
    z == "UTC"
}

impl MaintenanceSpec {
    /// No window: nothing is held back.
    pub fn is_default(&self) -> bool {
        self.windows.is_empty()
    }

    /// Every problem with the windows, each naming its field.
    pub fn validate(&self, err: &mut impl FnMut(String, String)) {
        for (i, w) in self.windows.iter().enumerate() {
            let base = format!("maintenance.windows[{i}]");
            // As a CronJob: no TZ in the schedule, the zone goes in its own field.
            match crate::base::kcron::validate_cronjob_schedule(&w.cron) {
                Err(e) => err(format!("{base}.cron"), e),
                Ok(s) if s.next_after(reference()).is_none() => err(
                    format!("{base}.cron"),
                    format!(
                        "{:?} never fires (no such date in five years), so the window never opens",
                        w.cron
                    ),
                ),
                Ok(_) => {}
            }
            if let Err(e) = crate::base::kcron::validate_time_zone(&w.time_zone) {
                err(format!("{base}.time_zone"), e);
            }
            if let Err(e) = parse_duration(&w.duration) {
                err(format!("{base}.duration"), e);
            }
        }
    }
}

/// Any instant serves to ask whether a schedule fires at all (robfig's `Next` looks five years
/// ahead, and every calendar date recurs within four).
fn reference() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::UNIX_EPOCH
}

/// The most a window may last: a week (a weekly window can then be open all the time; longer
/// says nothing a shorter one does not).
const MAX_MINUTES: u64 = 7 * 24 * 60;

/// Parses a window's `duration` as Karpenter validates a budget's
/// (`^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$`): hours, minutes, or hours then minutes, an
/// optional trailing `0s` (how Kubernetes prints a `metav1.Duration`). At least a minute, at
/// most a week.
pub fn parse_duration(s: &str) -> Result<chrono::Duration, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration in hours and minutes like 4h, 90m or 1h30m (at least 1m, at most 168h)"
        )
    };
    let core = s.strip_suffix("0s").unwrap_or(s);
    let number = |t: &str| -> Option<u64> {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse().ok())
            .flatten()
    };
    let minutes = if let Some(h) = core.strip_suffix('h') {
        number(h).and_then(|h| h.checked_mul(60))
    } else if let Some(rest) = core.strip_suffix('m') {
        match rest.split_once('h') {
            Some((h, m)) => number(h)
                .and_then(|h| h.checked_mul(60))
                .zip(number(m))
                .and_then(|(h, m)| h.checked_add(m)),
            None => number(rest),
        }
    } else {
        None
    }
    .ok_or_else(bad)?;
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(bad());
    }
    Ok(chrono::Duration::minutes(
        i64::try_from(minutes).map_err(|_| bad())?,
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_karpenters_hours_and_minutes() {
        for (s, m) in [
            ("4h", 240),
            ("90m", 90),
            ("1h30m", 90),
            ("2h0s", 120),
            ("1h5m0s", 65),
            ("168h", 10080),
        ] {
            assert_eq!(parse_duration(s), Ok(chrono::Duration::minutes(m)), "{s}");
        }
        for s in [
            "", "4", "h", "30s", "1h30", "1m30s", "-1h", "1.5h", "0m", "0h", "169h", "1d", " 4h",
            "4H",
        ] {
            let e = parse_duration(s).unwrap_err();
            assert!(e.contains("like 4h, 90m or 1h30m"), "{s}: {e}");
        }
    }

    fn errors(spec: &MaintenanceSpec) -> Vec<(String, String)> {
        let mut out = Vec::new();
        spec.validate(&mut |f, m| out.push((f, m)));
        out
    }

    #[test]
    fn each_bad_field_is_named() {
        let spec = MaintenanceSpec {
            windows: vec![
                MaintenanceWindow {
                    cron: "0 2 * * sat".into(),
                    duration: "4h".into(),
                    time_zone: "Europe/Berlin".into(),
                },
                MaintenanceWindow {
                    cron: "0 2 * *".into(),
                    duration: "4 hours".into(),
                    time_zone: "Mars/Olympus".into(),
                },
                MaintenanceWindow {
                    cron: "0 0 30 2 *".into(),
                    duration: "1h".into(),
                    time_zone: "UTC".into(),
                },
                MaintenanceWindow {
                    cron: "TZ=UTC 0 2 * * *".into(),
                    duration: "1h".into(),
                    time_zone: "UTC".into(),
                },
            ],
        };
        let errs = errors(&spec);
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "maintenance.windows[1].cron",
                "maintenance.windows[1].time_zone",
                "maintenance.windows[1].duration",
                "maintenance.windows[2].cron",
                "maintenance.windows[3].cron",
            ],
            "{errs:?}"
        );
        assert!(errs[0].1.contains("expected exactly 5 fields"), "{errs:?}");
        assert!(errs[1].1.contains("unknown time zone Mars/Olympus"));
        assert!(errs[3].1.contains("never fires"), "{errs:?}");
        assert!(errs[4].1.contains("use timeZone field"), "{errs:?}");
    }

    #[test]
    fn the_zone_is_utc_unless_named_and_left_out_when_utc() {
        let w: MaintenanceWindow =
            serde_saphyr::from_str("cron: '0 2 * * *'\nduration: 2h\n").unwrap();
        assert_eq!(w.time_zone, "UTC");
        let yaml = serde_saphyr::to_string(&w).unwrap();
        assert!(!yaml.contains("time_zone"), "{yaml}");
        assert!(
            serde_saphyr::from_str::<MaintenanceWindow>("cron: x\nduration: 1h\nzone: UTC\n")
                .is_err()
        );
    }
}
