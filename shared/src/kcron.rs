//! Kubernetes' cron dialect: the schedule syntax of a CronJob, as the apiserver validates it
//! and the CronJob controller fires it. Both use robfig/cron v3's `ParseStandard`
//! (minute hour day-of-month month day-of-week; day of week 0–6 with Sunday 0; `sun`–`sat`
//! and `jan`–`dec` names, case-insensitive; `*`, `?`, ranges, lists and steps; the
//! descriptors `@yearly`/`@annually`, `@monthly`, `@weekly`, `@daily`/`@midnight`, `@hourly`
//! and `@every <duration>`; an optional `CRON_TZ=`/`TZ=` prefix).
//!
//! Sources (see `tests/FIDELITY.md`, "Kubernetes twin"): robfig/cron `parser.go` (fields,
//! ranges, descriptors, error texts), `spec.go` (bounds, the day-of-month/day-of-week rule,
//! `Next`), `constantdelay.go` (`@every`); Kubernetes `validateScheduleFormat` (a CronJob
//! created with `TZ`/`CRON_TZ` in its schedule is refused: the time zone goes in
//! `spec.timeZone`).
//!
//! Times are UTC. A `CRON_TZ=`/`TZ=` prefix is understood only for UTC (`UTC`, `Etc/UTC`,
//! `GMT`, `Etc/GMT`); other zones are refused with a message saying so, since this build
//! carries no time zone database.
//!
//! What does not live here: where a schedule is used (spec validation, the simulator's
//! CronJob runner, autoscaling windows).

use chrono::{DateTime, Datelike, Duration, DurationRound, TimeZone, Timelike, Utc};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// Bit sets as robfig keeps them; bit 63 records a `*` (see [`STAR`]).
    Spec {
        minute: u64,
        hour: u64,
        dom: u64,
        month: u64,
        dow: u64,
    },
    /// `@every <duration>`, at least one second (robfig `Every` rounds up to 1s).
    Every(Duration),
}

/// robfig's `starBit`: the field was `*` or `?` (with no step above 1).
const STAR: u64 = 1 << 63;

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [(&'static str, u32)],
}

const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("feb", 2),
        ("mar", 3),
        ("apr", 4),
        ("may", 5),
        ("jun", 6),
        ("jul", 7),
        ("aug", 8),
        ("sep", 9),
        ("oct", 10),
        ("nov", 11),
        ("dec", 12),
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &[
        ("sun", 0),
        ("mon", 1),
        ("tue", 2),
        ("wed", 3),
        ("thu", 4),
        ("fri", 5),
        ("sat", 6),
    ],
};

fn bits(min: u32, max: u32, step: u32) -> u64 {
    let mut out = 0u64;
    let mut i = min;
    while i <= max {
        out |= 1 << i;
        i += step;
    }
    out
}

fn all(b: &Bounds) -> u64 {
    bits(b.min, b.max, 1) | STAR
}

fn parse_int(expr: &str) -> Result<u32, String> {
    let n: i64 = expr
        .parse()
        .map_err(|_| format!("failed to parse int from {expr}"))?;
    if n < 0 {
        return Err(format!("negative number ({n}) not allowed: {expr}"));
    }
    u32::try_from(n).map_err(|_| format!("failed to parse int from {expr}"))
}

fn parse_int_or_name(expr: &str, b: &Bounds) -> Result<u32, String> {
    let lower = expr.to_ascii_lowercase();
    match b.names.iter().find(|(n, _)| *n == lower) {
        Some((_, v)) => Ok(*v),
        None => parse_int(expr),
    }
}

/// robfig `getRange`: `*`/`?`, `N`, `N-M`, each with an optional `/step`.
fn range(expr: &str, b: &Bounds) -> Result<u64, String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_high.len() == 1;
    let (start, mut end, mut extra);
    if low_high[0] == "*" || low_high[0] == "?" {
        (start, end, extra) = (b.min, b.max, STAR);
    } else {
        start = parse_int_or_name(low_high[0], b)?;
        end = match low_high.len() {
            1 => start,
            2 => parse_int_or_name(low_high[1], b)?,
            _ => return Err(format!("too many hyphens: {expr}")),
        };
        extra = 0;
    }
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = parse_int(range_and_step[1])?;
            // "N/step" means "N-max/step".
            if single {
                end = b.max;
            }
            if step > 1 {
                extra = 0;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < b.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            b.min
        ));
    }
    if end > b.max {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            b.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    Ok(bits(start, end, step) | extra)
}

/// robfig `getField`: a comma-separated list of ranges.
fn field(text: &str, b: &Bounds) -> Result<u64, String> {
    let mut out = 0;
    for expr in text.split(',').filter(|e| !e.is_empty()) {
        out |= range(expr, b)?;
    }
    Ok(out)
}

/// Go's `time.ParseDuration`, for the units a schedule can sensibly use (`ns` to `h`,
/// decimals allowed, e.g. `1h30m`, `1.5h`).
fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("time: invalid duration \"{s}\"");
    if s.is_empty() {
        return Err(bad());
    }
    let mut rest = s;
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("time: missing unit in duration \"{s}\""))?;
        if num_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let per = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            u => return Err(format!("time: unknown unit \"{u}\" in duration \"{s}\"")),
        };
        total_ns += value * per;
        rest = &rest[unit_len..];
    }
    if total_ns > i64::MAX as f64 {
        return Err(bad());
    }
    Ok(Duration::nanoseconds(total_ns as i64))
}

fn descriptor(spec: &str) -> Result<Kind, String> {
    let one = |b: &Bounds| 1u64 << b.min;
    let kind = |minute, hour, dom, month, dow| Kind::Spec {
        minute,
        hour,
        dom,
        month,
        dow,
    };
    Ok(match spec {
        "@yearly" | "@annually" => kind(
            one(&MINUTES),
            one(&HOURS),
            one(&DOM),
            one(&MONTHS),
            all(&DOW),
        ),
        "@monthly" => kind(
            one(&MINUTES),
            one(&HOURS),
            one(&DOM),
            all(&MONTHS),
            all(&DOW),
        ),
        "@weekly" => kind(
            one(&MINUTES),
            one(&HOURS),
            all(&DOM),
            all(&MONTHS),
            one(&DOW),
        ),
        "@daily" | "@midnight" => kind(
            one(&MINUTES),
            one(&HOURS),
            all(&DOM),
            all(&MONTHS),
            all(&DOW),
        ),
        "@hourly" => kind(
            one(&MINUTES),
            all(&HOURS),
            all(&DOM),
            all(&MONTHS),
            all(&DOW),
        ),
        _ => match spec.strip_prefix("@every ") {
            Some(d) => {
                let d = parse_go_duration(d)
                    .map_err(|e| format!("failed to parse duration {spec}: {e}"))?;
                // robfig `Every`: below one second becomes one second; sub-seconds drop.
                let secs = d.num_seconds().max(1);
                Kind::Every(Duration::seconds(secs))
            }
            None => return Err(format!("unrecognized descriptor: {spec}")),
        },
    })
}

impl Schedule {
    /// Parses a schedule the way robfig/cron `ParseStandard` does (what the CronJob
    /// controller runs). Errors use robfig's wording.
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        if spec.is_empty() {
            return Err("empty spec string".into());
        }
        let mut spec = spec;
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            let eq = spec.find('=').unwrap_or(0);
            let end = spec.find(' ').unwrap_or(spec.len());
            let zone = &spec[eq + 1..end];
            if !matches!(zone, "UTC" | "Etc/UTC" | "GMT" | "Etc/GMT") {
                return Err(format!(
                    "provided bad location {zone}: only UTC is supported by oxide-controller's schedule parser"
                ));
            }
            spec = spec[end..].trim();
        }
        if spec.starts_with('@') {
            return Ok(Schedule {
                kind: descriptor(spec)?,
            });
        }
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: [{}]",
                fields.len(),
                fields.join(" ")
            ));
        }
        Ok(Schedule {
            kind: Kind::Spec {
                minute: field(fields[0], &MINUTES)?,
                hour: field(fields[1], &HOURS)?,
                dom: field(fields[2], &DOM)?,
                month: field(fields[3], &MONTHS)?,
                dow: field(fields[4], &DOW)?,
            },
        })
    }

    /// Whether the schedule fires in the minute containing `t` (always false for `@every`,
    /// which has no calendar).
    pub fn matches(&self, t: DateTime<Utc>) -> bool {
        match &self.kind {
            Kind::Every(_) => false,
            Kind::Spec {
                minute,
                hour,
                dom,
                month,
                dow,
            } => {
                minute & (1 << t.minute()) != 0
                    && hour & (1 << t.hour()) != 0
                    && month & (1 << t.month()) != 0
                    && day_matches(*dom, *dow, t)
            }
        }
    }

    /// The first firing time strictly after `t`, or None if there is none within five
    /// years (robfig `Next` returns the zero time then), e.g. `0 0 30 2 *`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let Kind::Spec {
            minute,
            hour,
            dom,
            month,
            dow,
        } = &self.kind
        else {
            let Kind::Every(d) = &self.kind else {
                return None;
            };
            // robfig `ConstantDelaySchedule.Next`: t + delay, rounded down to the second.
            return (t + *d).duration_trunc(Duration::seconds(1)).ok();
        };
        // Seconds are always 0: start at the next whole minute after t.
        let mut t = t.duration_trunc(Duration::minutes(1)).ok()? + Duration::minutes(1);
        let year_limit = t.year() + 5;
        'wrap: loop {
            if t.year() > year_limit {
                return None;
            }
            while month & (1 << t.month()) == 0 {
                // First minute of the next month.
                let (y, m) = if t.month() == 12 {
                    (t.year() + 1, 1)
                } else {
                    (t.year(), t.month() + 1)
                };
                t = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single()?;
                if m == 1 {
                    continue 'wrap;
                }
            }
            while !day_matches(*dom, *dow, t) {
                t = t.duration_trunc(Duration::days(1)).ok()? + Duration::days(1);
                if t.day() == 1 {
                    continue 'wrap;
                }
            }
            while hour & (1 << t.hour()) == 0 {
                t = t.duration_trunc(Duration::hours(1)).ok()? + Duration::hours(1);
                if t.hour() == 0 {
                    continue 'wrap;
                }
            }
            while minute & (1 << t.minute()) == 0 {
                t += Duration::minutes(1);
                if t.minute() == 0 {
                    continue 'wrap;
                }
            }
            return Some(t);
        }
    }
}

impl Schedule {
    /// Firing times after `from`, in order (ends when [`Schedule::next_after`] finds none).
    pub fn upcoming(&self, from: DateTime<Utc>) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        std::iter::successors(self.next_after(from), move |t| self.next_after(*t))
    }
}

/// robfig `dayMatches`: when either day field is `*`, both must match; otherwise either.
fn day_matches(dom: u64, dow: u64, t: DateTime<Utc>) -> bool {
    let dom_match = dom & (1 << t.day()) != 0;
    let dow_match = dow & (1 << t.weekday().num_days_from_sunday()) != 0;
    if dom & STAR != 0 || dow & STAR != 0 {
        dom_match && dow_match
    } else {
        dom_match || dow_match
    }
}

/// Validates `spec.schedule` of a CronJob as the apiserver does on create: robfig's
/// standard parser, and no `TZ`/`CRON_TZ` in the schedule (Kubernetes wants the zone in
/// `spec.timeZone`). The error is the apiserver's detail text.
pub fn validate_cronjob_schedule(spec: &str) -> Result<Schedule, String> {
    let parsed = Schedule::parse(spec);
    if spec.contains("TZ") {
        return Err("cannot use TZ or CRON_TZ in schedule, use timeZone field instead".into());
    }
    parsed
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn next(spec: &str, from: &str) -> Option<String> {
        Schedule::parse(spec)
            .unwrap()
            .next_after(at(from))
            .map(|t| t.to_rfc3339())
    }

    #[test]
    fn sunday_is_zero_and_seven_is_out_of_range() {
        // 2026-11-22 is a Sunday.
        assert_eq!(
            next("0 3 * * 0", "2026-11-19T00:00:00Z").as_deref(),
            Some("2026-11-22T03:00:00+00:00")
        );
        assert_eq!(
            next("0 3 * * sun", "2026-11-19T00:00:00Z").as_deref(),
            Some("2026-11-22T03:00:00+00:00")
        );
        assert_eq!(
            next("0 3 * * 1", "2026-11-22T04:00:00Z").as_deref(),
            Some("2026-11-23T03:00:00+00:00"),
            "1 is Monday"
        );
        assert_eq!(
            Schedule::parse("0 3 * * 7").unwrap_err(),
            "end of range (7) above maximum (6): 7"
        );
    }

    #[test]
    fn names_ranges_steps_and_lists() {
        assert_eq!(
            next("*/15 9-17 * * MON-fri", "2026-11-21T12:00:00Z").as_deref(),
            Some("2026-11-23T09:00:00+00:00")
        );
        assert_eq!(
            next("5,35 * * jan,Jul *", "2026-11-21T12:00:00Z").as_deref(),
            Some("2027-01-01T00:05:00+00:00")
        );
        assert_eq!(
            next("30 2 1/10 * ?", "2026-11-21T12:00:00Z").as_deref(),
            Some("2026-12-01T02:30:00+00:00")
        );
        assert!(Schedule::parse("1-2-3 * * * *").is_err());
        assert!(Schedule::parse("*/0 * * * *").is_err());
        assert!(Schedule::parse("5-1 * * * *").is_err());
        assert_eq!(
            Schedule::parse("* * * *").unwrap_err(),
            "expected exactly 5 fields, found 4: [* * * *]"
        );
        assert_eq!(Schedule::parse("").unwrap_err(), "empty spec string");
    }

    #[test]
    fn day_of_month_and_week_combine_like_robfig() {
        // Neither is a star: either matches. 2026-12-01 is a Tuesday, 2026-11-27 a Friday.
        assert_eq!(
            next("0 0 1 * fri", "2026-11-22T00:00:00Z").as_deref(),
            Some("2026-11-27T00:00:00+00:00")
        );
        // `*/1` keeps the star bit; `*/2` does not.
        assert_eq!(
            next("0 0 */1 * fri", "2026-11-22T00:00:00Z").as_deref(),
            Some("2026-11-27T00:00:00+00:00")
        );
        assert_eq!(
            next("0 0 */2 * fri", "2026-11-22T00:00:00Z").as_deref(),
            Some("2026-11-23T00:00:00+00:00")
        );
    }

    #[test]
    fn descriptors_and_every() {
        assert_eq!(
            next("@hourly", "2026-11-22T10:59:59Z").as_deref(),
            Some("2026-11-22T11:00:00+00:00")
        );
        assert_eq!(
            next("@weekly", "2026-11-22T10:00:00Z").as_deref(),
            Some("2026-11-29T00:00:00+00:00")
        );
        assert_eq!(
            next("@yearly", "2026-11-22T10:00:00Z").as_deref(),
            Some("2027-01-01T00:00:00+00:00")
        );
        assert_eq!(
            next("@every 1h30m", "2026-11-22T10:00:00.5Z").as_deref(),
            Some("2026-11-22T11:30:00+00:00")
        );
        assert!(Schedule::parse("@fortnightly").is_err());
        assert!(Schedule::parse("@every 5 minutes").is_err());
        assert!(!Schedule::parse("@every 1m").unwrap().matches(Utc::now()));
    }

    #[test]
    fn impossible_dates_have_no_next() {
        assert_eq!(next("0 0 30 2 *", "2026-01-01T00:00:00Z"), None);
    }

    #[test]
    fn matches_is_per_minute() {
        let s = Schedule::parse("0 3 * * 0").unwrap();
        assert!(s.matches(at("2026-11-22T03:00:59Z")));
        assert!(!s.matches(at("2026-11-22T03:01:00Z")));
        assert!(!s.matches(at("2026-11-23T03:00:00Z")));
    }

    #[test]
    fn time_zone_prefixes() {
        assert_eq!(
            next("CRON_TZ=UTC 0 3 * * *", "2026-11-22T00:00:00Z").as_deref(),
            Some("2026-11-22T03:00:00+00:00")
        );
        assert!(Schedule::parse("TZ=Europe/Paris 0 3 * * *").is_err());
        assert_eq!(
            validate_cronjob_schedule("CRON_TZ=UTC 0 3 * * *").unwrap_err(),
            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
        );
        assert!(validate_cronjob_schedule("@daily").is_ok());
    }
}
