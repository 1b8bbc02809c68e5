//! Maintenance windows: whether a disruption that is not urgent may start at a given instant,
//! and when the next window opens.
//!
//! A window opened by a cron firing at `f` is open over `[f, f + duration)`: it is open at `t`
//! when the schedule's first firing after `t - duration` is not after `t` (Karpenter's
//! `Budget.IsActive`, kubernetes-sigs/karpenter `pkg/apis/v1/nodepool.go`; the autoscaler's
//! schedule windows use the same rule). Firings follow the zone's wall clock as the CronJob
//! controller fires them ([`crate::base::kcron`]): a firing time that does not exist on a
//! spring-forward day is skipped that day, one that happens twice on a fall-back day opens the
//! window twice; `duration` is absolute time.
//!
//! Like system-upgrade-controller's `spec.window`, a window gates the *start* of work: a
//! member replacement begun inside a window finishes after it closes (the old member goes once
//! its replacement is Ready); the next one waits for the next window. What is urgent (a dead
//! member, one that never joined) is never gated.
//!
//! Used by the planner (spec-drift rolls), the channel follower
//! ([`crate::domain::upgrade::channel`]), and the certificate rolls.

use chrono::{DateTime, Duration, Utc};

use crate::base::kcron::{self, Schedule};
pub use crate::domain::spec::maintenance::{MaintenanceSpec, MaintenanceWindow, parse_duration};

/// The windows of a spec, parsed.
#[derive(Debug, Clone)]
pub struct Windows {
    windows: Vec<(Schedule, Duration)>,
    /// The spec had windows (even if none parsed): then nothing is ever allowed outside them.
    gated: bool,
}

/// Whether a disruption may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// No windows are configured, or one is open.
    Allowed,
    /// Every window is closed; the next opens at `next_open` (None: none within five years,
    /// which a validated spec does not have).
    Wait { next_open: Option<DateTime<Utc>> },
}

impl Gate {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Gate::Allowed)
    }

    /// `the maintenance window opening at 2026-01-03T02:00:00Z`, for findings.
    pub fn describe_wait(&self) -> String {
        match self {
            Gate::Allowed => "nothing (a maintenance window is open)".into(),
            Gate::Wait {
                next_open: Some(t), ..
            } => format!(
                "the maintenance window opening at {}",
                t.format("%Y-%m-%dT%H:%M:%SZ")
            ),
            Gate::Wait { next_open: None } => {
                "a maintenance window, and none opens within five years (check maintenance.windows)"
                    .into()
            }
        }
    }
}

impl Windows {
    /// The spec's windows. A window that does not parse (a spec that skipped validation) is
    /// never open.
    pub fn new(spec: &MaintenanceSpec) -> Windows {
        let windows = spec
            .windows
            .iter()
            .filter_map(|w| {
                let zone = kcron::load_location(&w.time_zone).ok()?;
                let schedule = Schedule::parse(&w.cron).ok()?.in_zone(zone);
                Some((schedule, parse_duration(&w.duration).ok()?))
            })
            .collect();
        Windows {
            windows,
            gated: !spec.windows.is_empty(),
        }
    }

    /// Whether one of the windows is open at `t`.
    pub fn is_open(&self, t: DateTime<Utc>) -> bool {
        self.windows
            .iter()
            .any(|(s, len)| s.next_after(t - *len).is_some_and(|f| f <= t))
    }

    /// When the next window opens strictly after `t` (None: no window fires within five
    /// years).
    pub fn next_open(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.windows
            .iter()
            .filter_map(|(s, _)| s.next_after(t))
            .min()
    }

    /// Whether a disruption that is not urgent may start at `now`.
    pub fn allows(&self, now: DateTime<Utc>) -> Gate {
        if !self.gated || self.is_open(now) {
            Gate::Allowed
        } else {
            Gate::Wait {
                next_open: self.next_open(now),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn windows(list: &[(&str, &str, &str)]) -> Windows {
        Windows::new(&MaintenanceSpec {
            windows: list
                .iter()
                .map(|(cron, duration, zone)| MaintenanceWindow {
                    cron: (*cron).into(),
                    duration: (*duration).into(),
                    time_zone: (*zone).into(),
                })
                .collect(),
        })
    }

    #[test]
    fn no_windows_allow_everything() {
        let w = windows(&[]);
        assert_eq!(w.allows(t("2026-03-01T12:00:00Z")), Gate::Allowed);
    }

    #[test]
    fn a_window_is_open_from_its_firing_for_its_duration() {
        // Saturdays 02:00 UTC for 4 hours; 2026-01-03 is a Saturday.
        let w = windows(&[("0 2 * * sat", "4h", "UTC")]);
        let next = Gate::Wait {
            next_open: Some(t("2026-01-03T02:00:00Z")),
        };
        assert_eq!(w.allows(t("2026-01-03T01:59:59Z")), next);
        assert_eq!(w.allows(t("2026-01-03T02:00:00Z")), Gate::Allowed);
        assert_eq!(w.allows(t("2026-01-03T05:59:59Z")), Gate::Allowed);
        assert_eq!(
            w.allows(t("2026-01-03T06:00:00Z")),
            Gate::Wait {
                next_open: Some(t("2026-01-10T02:00:00Z"))
            }
        );
        assert_eq!(
            next.describe_wait(),
            "the maintenance window opening at 2026-01-03T02:00:00Z"
        );
    }

    #[test]
    fn the_earliest_of_several_windows_opens_next_and_any_open_one_allows() {
        let w = windows(&[("0 2 * * sat", "4h", "UTC"), ("30 22 * * 2", "1h", "UTC")]);
        // Thursday 2026-01-01: the Saturday window comes first.
        assert_eq!(
            w.allows(t("2026-01-01T12:00:00Z")),
            Gate::Wait {
                next_open: Some(t("2026-01-03T02:00:00Z"))
            }
        );
        // Tuesday 2026-01-06 22:45: the second window is open.
        assert_eq!(w.allows(t("2026-01-06T22:45:00Z")), Gate::Allowed);
    }

    #[test]
    fn windows_follow_the_zones_wall_clock() {
        // 02:00 in Berlin is 01:00 UTC in winter, 00:00 UTC in summer.
        let w = windows(&[("0 2 * * *", "1h", "Europe/Berlin")]);
        assert!(w.is_open(t("2026-01-15T01:30:00Z")));
        assert!(!w.is_open(t("2026-01-15T02:30:00Z")));
        assert!(w.is_open(t("2026-07-15T00:30:00Z")));
        assert!(!w.is_open(t("2026-07-15T01:30:00Z")));
    }

    #[test]
    fn a_firing_time_that_does_not_exist_on_the_spring_forward_day_opens_no_window_that_day() {
        // Berlin springs forward on 2026-03-29 at 02:00 CET (01:00 UTC) to 03:00 CEST: 02:30
        // does not exist that day, so the daily 02:30 window opens on the 28th and the 30th.
        let w = windows(&[("30 2 * * *", "1h", "Europe/Berlin")]);
        assert!(
            w.is_open(t("2026-03-28T01:45:00Z")),
            "02:45 CET on the 28th"
        );
        assert_eq!(
            w.allows(t("2026-03-28T03:00:00Z")),
            Gate::Wait {
                // 02:30 CEST on the 30th.
                next_open: Some(t("2026-03-30T00:30:00Z"))
            }
        );
        for h in ["00:00", "00:45", "01:15", "02:00"] {
            assert!(
                !w.is_open(t(&format!("2026-03-29T{h}:00Z"))),
                "{h} UTC on the 29th"
            );
        }
    }

    #[test]
    fn a_firing_time_that_happens_twice_on_the_fall_back_day_opens_the_window_twice() {
        // Berlin falls back on 2026-10-25 at 03:00 CEST (01:00 UTC) to 02:00 CET: 02:30 happens
        // at 00:30 UTC and again at 01:30 UTC. A 30-minute window is open after each.
        let w = windows(&[("30 2 * * *", "30m", "Europe/Berlin")]);
        assert!(w.is_open(t("2026-10-25T00:45:00Z")));
        assert_eq!(
            w.allows(t("2026-10-25T01:00:00Z")),
            Gate::Wait {
                next_open: Some(t("2026-10-25T01:30:00Z"))
            }
        );
        assert!(w.is_open(t("2026-10-25T01:45:00Z")));
        assert!(!w.is_open(t("2026-10-25T02:00:00Z")));
    }

    #[test]
    fn the_duration_is_absolute_time_across_a_clock_change() {
        // 01:30 CET on the spring-forward day for 2 hours: 00:30 to 02:30 UTC, though the
        // wall clock reads 04:30 CEST at the end.
        let w = windows(&[("30 1 29 3 *", "2h", "Europe/Berlin")]);
        assert!(w.is_open(t("2026-03-29T02:29:00Z")));
        assert!(!w.is_open(t("2026-03-29T02:30:00Z")));
    }

    #[test]
    fn a_window_that_never_opens_waits_for_ever() {
        // Validation refuses it; a spec that skipped validation must still not roll.
        let w = windows(&[("0 0 30 2 *", "1h", "UTC")]);
        let g = w.allows(t("2026-01-01T00:00:00Z"));
        assert_eq!(g, Gate::Wait { next_open: None });
        assert!(g.describe_wait().contains("none opens within five years"));
        let bad = windows(&[("not a cron", "1h", "UTC")]);
        assert_eq!(
            bad.allows(t("2026-01-01T00:00:00Z")),
            Gate::Wait { next_open: None }
        );
    }
}
