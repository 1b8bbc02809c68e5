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
//! Time zones: a `CRON_TZ=`/`TZ=` prefix names an IANA zone (robfig `Parse` loads it with
//! Go's `time.LoadLocation`; here from `chrono-tz`'s copy of the same database) and the
//! schedule fires on that zone's wall clock; without one it fires in UTC (robfig uses
//! `time.Local`, which is UTC in the controller-manager's container). This is how the
//! CronJob controller honours `spec.timeZone`: it prefixes `TZ=<zone>` to the schedule
//! (`formatSchedule`). [`Schedule::in_zone`] does the same. Across daylight saving changes
//! `next_after` follows robfig `Next` step by step: hours advance in absolute time, so a
//! wall-clock time that does not exist (spring forward) is skipped that day and one that
//! happens twice (fall back) fires twice; midnights that do not exist are handled as robfig
//! does (its issue 157).
//!
//! What does not live here: where a schedule is used (spec validation, the simulator's
//! CronJob runner, autoscaling windows).

use chrono::{
    DateTime, Datelike, Duration, DurationRound, NaiveDate, NaiveDateTime, Offset, TimeZone,
    Timelike, Utc,
};
use chrono_tz::Tz;

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    kind: Kind,
    /// The zone whose wall clock the schedule follows; None: UTC.
    zone: Option<Tz>,
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
        let mut zone = None;
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            let eq = spec.find('=').unwrap_or(0);
            let end = spec.find(' ').unwrap_or(spec.len());
            let name = &spec[eq + 1..end];
            zone = Some(
                load_location(name).map_err(|e| format!("provided bad location {name}: {e}"))?,
            );
            spec = spec[end..].trim();
        }
        if spec.starts_with('@') {
            return Ok(Schedule {
                kind: descriptor(spec)?,
                zone,
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
            zone,
        })
    }

    /// The schedule on `zone`'s wall clock, as the CronJob controller runs a CronJob with
    /// `spec.timeZone` (it parses `TZ=<zone> <schedule>`).
    pub fn in_zone(mut self, zone: Tz) -> Schedule {
        self.zone = Some(zone);
        self
    }

    /// Whether the schedule fires in the minute containing `t` (always false for `@every`,
    /// which has no calendar).
    pub fn matches(&self, t: DateTime<Utc>) -> bool {
        match self.zone {
            Some(z) => self.matches_in(&t.with_timezone(&z)),
            None => self.matches_in(&t),
        }
    }

    fn matches_in<Z: TimeZone>(&self, t: &DateTime<Z>) -> bool {
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
    /// years (robfig `Next` returns the zero time then), e.g. `0 0 30 2 *`. Evaluated on the
    /// wall clock of the schedule's zone (UTC without one).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.zone {
            Some(z) => self.next_in(t.with_timezone(&z)),
            None => self.next_in(t),
        }
    }

    /// robfig `SpecSchedule.Next`, step by step, in `t`'s zone.
    fn next_in<Z: TimeZone>(&self, t: DateTime<Z>) -> Option<DateTime<Utc>> {
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
            return (t.to_utc() + *d).duration_trunc(Duration::seconds(1)).ok();
        };
        let zone = t.timezone();
        // Seconds are always 0, so robfig's "the upcoming second" and its seconds loop
        // amount to: start at the next whole minute after t.
        let mut t = truncate_minute(&t)? + Duration::minutes(1);
        let year_limit = t.year() + 5;
        // robfig's `added`: the first field that moves resets the smaller ones once; after
        // that fields only advance (resetting again would loop in a repeated hour).
        let mut added = false;
        'wrap: loop {
            if t.year() > year_limit {
                return None;
            }
            while month & (1 << t.month()) == 0 {
                if !added {
                    added = true;
                    t = go_date(&zone, t.year(), t.month(), 1, 0, 0)?;
                }
                // AddDate(0, 1, 0).
                t = go_date(
                    &zone,
                    t.year(),
                    t.month() + 1,
                    t.day(),
                    t.hour(),
                    t.minute(),
                )?;
                if t.month() == 1 {
                    continue 'wrap;
                }
            }
            while !day_matches(*dom, *dow, &t) {
                if !added {
                    added = true;
                    t = go_date(&zone, t.year(), t.month(), t.day(), 0, 0)?;
                }
                // AddDate(0, 0, 1).
                t = go_date(
                    &zone,
                    t.year(),
                    t.month(),
                    t.day() + 1,
                    t.hour(),
                    t.minute(),
                )?;
                // A midnight that does not exist lands on 23:00 the day before or 01:00:
                // robfig moves it back to the start of the intended day.
                if t.hour() != 0 {
                    if t.hour() > 12 {
                        t += Duration::hours(24 - i64::from(t.hour()));
                    } else {
                        t -= Duration::hours(i64::from(t.hour()));
                    }
                }
                if t.day() == 1 {
                    continue 'wrap;
                }
            }
            while hour & (1 << t.hour()) == 0 {
                if !added {
                    added = true;
                    t = go_date(&zone, t.year(), t.month(), t.day(), t.hour(), 0)?;
                }
                // One hour on in absolute time (robfig `Add`).
                t += Duration::hours(1);
                if t.hour() == 0 {
                    continue 'wrap;
                }
            }
            while minute & (1 << t.minute()) == 0 {
                if !added {
                    added = true;
                    t = truncate_minute(&t)?;
                }
                t += Duration::minutes(1);
                if t.minute() == 0 {
                    continue 'wrap;
                }
            }
            return Some(t.to_utc());
        }
    }
}

/// Go's `time.LoadLocation` over `chrono-tz`'s IANA database: `""` and `UTC` are UTC, other
/// names must be zone names, case as written. The error is Go's.
pub fn load_location(name: &str) -> Result<Tz, String> {
    if name.is_empty() || name == "UTC" {
        return Ok(Tz::UTC);
    }
    name.parse::<Tz>()
        .map_err(|_| format!("unknown time zone {name}"))
}

/// Checks a schedule's time zone as the apiserver checks a CronJob's `spec.timeZone`
/// (`validateTimeZone`): not empty, each `/`-separated part of IANA's name characters (at
/// most 14, not `.`/`..`, not starting with `-`), not `Local`, and a zone that loads.
pub fn validate_time_zone(zone: &str) -> Result<Tz, String> {
    if zone.is_empty() {
        return Err("timeZone must be nil or non-empty string".into());
    }
    let name_part = |p: &str| {
        (1..=14).contains(&p.len())
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
    };
    if zone
        .split('/')
        .any(|p| p == "." || p == ".." || p.starts_with('-') || !name_part(p))
    {
        return Err(format!("unknown time zone {zone}"));
    }
    if zone.eq_ignore_ascii_case("Local") {
        return Err(
            "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones"
                .into(),
        );
    }
    load_location(zone)
}

/// `t` truncated to the minute (Go's `Truncate(time.Minute)`, absolute time).
fn truncate_minute<Z: TimeZone>(t: &DateTime<Z>) -> Option<DateTime<Z>> {
    t.clone().duration_trunc(Duration::minutes(1)).ok()
}

/// Go's `time.Date(year, month, day, hour, minute, 0, 0, loc)`: month and day may overflow and
/// are normalised; a wall-clock time that does not exist or exists twice gets the offset Go
/// picks (the one in force at the wall clock read as UTC, unless that instant is not in its
/// period, then the one in force at the corrected instant).
fn go_date<Z: TimeZone>(
    zone: &Z,
    year: i32,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
) -> Option<DateTime<Z>> {
    let months = i64::from(year) * 12 + i64::from(month) - 1;
    let (y, m) = (
        i32::try_from(months.div_euclid(12)).ok()?,
        months.rem_euclid(12) as u32 + 1,
    );
    let naive: NaiveDateTime = NaiveDate::from_ymd_opt(y, m, 1)?.and_hms_opt(0, 0, 0)?
        + Duration::days(i64::from(day) - 1)
        + Duration::hours(i64::from(hour))
        + Duration::minutes(i64::from(minute));
    let offset_at =
        |utc: &NaiveDateTime| i64::from(zone.offset_from_utc_datetime(utc).fix().local_minus_utc());
    let guess = offset_at(&naive);
    let utc = naive - Duration::seconds(guess);
    let offset = offset_at(&utc);
    let utc = if offset == guess {
        utc
    } else {
        naive - Duration::seconds(offset)
    };
    Some(zone.from_utc_datetime(&utc))
}

impl Schedule {
    /// Firing times after `from`, in order (ends when [`Schedule::next_after`] finds none).
    pub fn upcoming(&self, from: DateTime<Utc>) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        std::iter::successors(self.next_after(from), move |t| self.next_after(*t))
    }
}

/// robfig `dayMatches`: when either day field is `*`, both must match; otherwise either.
fn day_matches<Z: TimeZone>(dom: u64, dow: u64, t: &DateTime<Z>) -> bool {
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
        // 03:00 in Paris (UTC+1 in November) is 02:00 UTC.
        assert_eq!(
            next("TZ=Europe/Paris 0 3 * * *", "2026-11-22T00:00:00Z").as_deref(),
            Some("2026-11-22T02:00:00+00:00")
        );
        assert_eq!(
            Schedule::parse("TZ=Mars/Olympus 0 3 * * *").unwrap_err(),
            "provided bad location Mars/Olympus: unknown time zone Mars/Olympus"
        );
        assert_eq!(
            validate_cronjob_schedule("CRON_TZ=UTC 0 3 * * *").unwrap_err(),
            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
        );
        assert!(validate_cronjob_schedule("@daily").is_ok());
    }

    /// Instant equality, whatever offset the strings are written with.
    fn assert_next(spec: &str, from: &str, expected: &str) {
        let got = Schedule::parse(spec).unwrap().next_after(at(from));
        assert_eq!(got, Some(at(expected)), "{spec} after {from}");
    }

    /// robfig/cron's own daylight-saving cases (`spec_test.go` `TestNext`, America/New_York
    /// and America/Sao_Paulo), with the seconds field dropped (the standard parser has none).
    #[test]
    fn daylight_saving_follows_robfig_next() {
        let ny = "TZ=America/New_York";
        let cases = [
            // 2am EST -> 3am EDT: 02:30 does not exist that day, so the next is a year on.
            (
                "2012-03-11T00:00:00-05:00",
                "30 2 11 Mar ?",
                "2013-03-11T02:30:00-04:00",
            ),
            (
                "2012-03-11T00:00:00-05:00",
                "0 * * * ?",
                "2012-03-11T01:00:00-05:00",
            ),
            (
                "2012-03-11T01:00:00-05:00",
                "0 * * * ?",
                "2012-03-11T03:00:00-04:00",
            ),
            (
                "2012-03-11T03:00:00-04:00",
                "0 * * * ?",
                "2012-03-11T04:00:00-04:00",
            ),
            (
                "2012-03-11T01:00:00-05:00",
                "0 1 * * ?",
                "2012-03-12T01:00:00-04:00",
            ),
            // The 2am nightly job is skipped.
            (
                "2012-03-11T00:00:00-05:00",
                "0 2 * * ?",
                "2012-03-12T02:00:00-04:00",
            ),
            // 2am EDT -> 1am EST: 01:xx happens twice and fires twice.
            (
                "2012-11-04T00:00:00-04:00",
                "30 2 04 Nov ?",
                "2012-11-04T02:30:00-05:00",
            ),
            (
                "2012-11-04T01:45:00-04:00",
                "30 1 04 Nov ?",
                "2012-11-04T01:30:00-05:00",
            ),
            (
                "2012-11-04T01:00:00-04:00",
                "0 * * * ?",
                "2012-11-04T01:00:00-05:00",
            ),
            (
                "2012-11-04T01:00:00-05:00",
                "0 * * * ?",
                "2012-11-04T02:00:00-05:00",
            ),
            (
                "2012-11-04T00:00:00-04:00",
                "0 1 * * ?",
                "2012-11-04T01:00:00-04:00",
            ),
            (
                "2012-11-04T01:00:00-04:00",
                "0 1 * * ?",
                "2012-11-04T01:00:00-05:00",
            ),
            (
                "2012-11-04T01:00:00-05:00",
                "0 1 * * ?",
                "2012-11-05T01:00:00-05:00",
            ),
            (
                "2012-11-04T00:00:00-04:00",
                "0 2 * * ?",
                "2012-11-04T02:00:00-05:00",
            ),
            (
                "2012-11-04T02:00:00-05:00",
                "0 2 * * ?",
                "2012-11-05T02:00:00-05:00",
            ),
            (
                "2012-11-04T00:00:00-04:00",
                "0 3 * * ?",
                "2012-11-04T03:00:00-05:00",
            ),
            (
                "2012-11-04T00:00:00-04:00",
                "0 3 3 * ?",
                "2012-12-03T03:00:00-05:00",
            ),
        ];
        for (from, spec, expected) in cases {
            assert_next(&format!("{ny} {spec}"), from, expected);
        }
        // robfig issue 157: a midnight that does not exist (Sao Paulo, 2018-11-04).
        let sp = "TZ=America/Sao_Paulo";
        assert_next(
            &format!("{sp} 0 9 10 * ?"),
            "2018-10-17T05:00:00-04:00",
            "2018-11-10T06:00:00-05:00",
        );
        assert_next(
            &format!("{sp} 0 9 22 * ?"),
            "2018-02-14T05:00:00-05:00",
            "2018-02-22T07:00:00-05:00",
        );
    }

    /// The same rules in Europe/Berlin (CET/CEST, 2026-03-29 and 2026-10-25), through
    /// [`Schedule::in_zone`] as the CronJob controller applies `spec.timeZone`.
    #[test]
    fn berlin_weekday_mornings_across_both_changes() {
        let berlin = load_location("Europe/Berlin").unwrap();
        let s = Schedule::parse("0 8 * * 1-5").unwrap().in_zone(berlin);
        let next = |from: &str| s.next_after(at(from));
        // Friday before spring forward: 08:00 CET is 07:00Z; the Monday after: 06:00Z.
        assert_eq!(
            next("2026-03-27T00:00:00Z"),
            Some(at("2026-03-27T07:00:00Z"))
        );
        assert_eq!(
            next("2026-03-27T07:00:00Z"),
            Some(at("2026-03-30T06:00:00Z"))
        );
        // Friday before fall back (CEST): 06:00Z; the Monday after (CET): 07:00Z.
        assert_eq!(
            next("2026-10-23T00:00:00Z"),
            Some(at("2026-10-23T06:00:00Z"))
        );
        assert_eq!(
            next("2026-10-23T06:00:00Z"),
            Some(at("2026-10-26T07:00:00Z"))
        );
        assert!(s.matches(at("2026-03-30T06:00:00Z")));
        assert!(!s.matches(at("2026-03-30T07:00:00Z")));
        // 02:30 does not exist on 2026-03-29 and exists twice on 2026-10-25.
        let s = Schedule::parse("30 2 * * *").unwrap().in_zone(berlin);
        assert_eq!(
            s.next_after(at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-30T00:30:00Z"))
        );
        let fall: Vec<_> = s.upcoming(at("2026-10-24T12:00:00Z")).take(3).collect();
        assert_eq!(
            fall,
            [
                at("2026-10-25T00:30:00Z"),
                at("2026-10-25T01:30:00Z"),
                at("2026-10-26T01:30:00Z")
            ]
        );
    }

    #[test]
    fn zones_load_like_go_load_location() {
        assert_eq!(load_location(""), Ok(Tz::UTC));
        assert_eq!(load_location("UTC"), Ok(Tz::UTC));
        assert_eq!(load_location("Europe/Berlin"), Ok(Tz::Europe__Berlin));
        assert_eq!(
            load_location("europe/berlin").unwrap_err(),
            "unknown time zone europe/berlin"
        );
        assert!(load_location("Local").is_err());
        assert_eq!(validate_time_zone("Europe/Berlin"), Ok(Tz::Europe__Berlin));
        for (zone, message) in [
            ("", "timeZone must be nil or non-empty string"),
            ("../etc/passwd", "unknown time zone ../etc/passwd"),
            (
                "Europe/Berlinxxxxxxxxx",
                "unknown time zone Europe/Berlinxxxxxxxxx",
            ),
            ("Mars/Olympus", "unknown time zone Mars/Olympus"),
        ] {
            assert_eq!(validate_time_zone(zone).unwrap_err(), message, "{zone:?}");
        }
        assert!(
            validate_time_zone("local")
                .unwrap_err()
                .contains("explicit time zone")
        );
    }
}
