//! The webhook's Prometheus metrics: requests by route, method and status, a request latency
//! histogram per route, reconcile triggers by result, and ConfigMap write conflicts; and the
//! cluster's own ([`cluster`]: what the last reconcile wrote to `status.json`). Rendered in
//! the Prometheus text exposition format (version 0.0.4) at `/metrics`.
//!
//! These counters and the cluster metrics' cache ([`ClusterCache`]) are the only state the
//! webhook keeps between requests. Label values come from fixed sets (route templates, known
//! methods) or from the spec and status the reconcile wrote, never from request input, so a
//! caller cannot blow up the series count.

use super::pending::TriggerReason;
use crate::ports::state::StateStore;
use crate::workflows::error::chain;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod cluster;
pub use cluster::Input;

/// Route templates, in the order their histograms are kept.
pub const ROUTES: [&str; 11] = [
    "/healthz",
    "/readyz",
    "/metrics",
    "/status",
    "/reconcile",
    "/nodes/workers",
    "/nodes/workers/modify",
    "/pools/{pool}",
    "/pools/{pool}/modify",
    "/pools/{pool}/autoscale",
    "other",
];

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Result labels of `reconcile_triggers_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerResult {
    Created,
    Pending,
    NoCronJob,
    Error,
}

impl TriggerResult {
    const ALL: [TriggerResult; 4] = [
        TriggerResult::Created,
        TriggerResult::Pending,
        TriggerResult::NoCronJob,
        TriggerResult::Error,
    ];

    fn label(self) -> &'static str {
        match self {
            TriggerResult::Created => "created",
            TriggerResult::Pending => "pending",
            TriggerResult::NoCronJob => "no_cronjob",
            TriggerResult::Error => "error",
        }
    }
}

#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

/// All metrics of one webhook process.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(usize, &'static str, u16), u64>>,
    latency: [Histogram; ROUTES.len()],
    triggers: [AtomicU64; 4],
    /// Triggers by reason, in [`TriggerReason::ALL`] order.
    reasons: [AtomicU64; 3],
    /// 1 while the pending-pod watch is open.
    watching: AtomicU64,
    conflicts: AtomicU64,
    writes: AtomicU64,
}

/// Method label: known methods by name, anything else `other`.
pub(crate) fn method_label(m: &http::Method) -> &'static str {
    match *m {
        http::Method::GET => "GET",
        http::Method::HEAD => "HEAD",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        http::Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

impl Metrics {
    /// Records one finished request.
    pub fn observe(&self, route: usize, method: &'static str, status: u16, elapsed: Duration) {
        let route = route.min(ROUTES.len() - 1);
        *self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((route, method, status))
            .or_default() += 1;
        let h = &self.latency[route];
        let secs = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            h.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        h.count.fetch_add(1, Ordering::Relaxed);
        h.sum_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Records the result of one reconcile trigger.
    pub fn trigger(&self, result: TriggerResult) {
        let i = TriggerResult::ALL
            .iter()
            .position(|r| *r == result)
            .unwrap_or(3);
        self.triggers[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Records why a reconcile was triggered.
    pub fn trigger_reason(&self, reason: TriggerReason) {
        let i = TriggerReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.reasons[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Triggers recorded for `reason`.
    pub fn triggers_for(&self, reason: TriggerReason) -> u64 {
        TriggerReason::ALL
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.reasons[i].load(Ordering::Relaxed))
    }

    /// Whether the pending-pod watch is open.
    pub fn set_watching(&self, on: bool) {
        self.watching.store(u64::from(on), Ordering::Relaxed);
    }

    /// Records `n` ConfigMap write conflicts (409s).
    pub fn conflicts(&self, n: u32) {
        self.conflicts.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    /// ConfigMap write conflicts (409s) so far.
    pub fn conflicts_seen(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    /// Records one successful ConfigMap write of spec changes (a batch queued together).
    pub fn write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Successful ConfigMap writes of spec changes so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Requests recorded for `route` (a template from [`ROUTES`]) with `status`, any method.
    pub fn requests(&self, route: &str, status: u16) -> u64 {
        let Some(r) = ROUTES.iter().position(|x| *x == route) else {
            return 0;
        };
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((rr, _, s), _)| *rr == r && *s == status)
            .map(|(_, n)| n)
            .sum()
    }

    /// The Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.render_requests(&mut out);
        self.render_latency(&mut out);
        header(
            &mut out,
            "oxide_controller_webhook_reconcile_triggers_total",
            "counter",
            "On-demand reconcile Job triggers, by result.",
        );
        labelled(
            &mut out,
            "oxide_controller_webhook_reconcile_triggers_total",
            "result",
            TriggerResult::ALL
                .iter()
                .map(|r| r.label())
                .zip(&self.triggers),
        );
        header(
            &mut out,
            "oxide_controller_triggers_total",
            "counter",
            "Reconcile runs started by the webhook, by why: scale_change (a count or autoscaling change), manual (POST /reconcile), pending_pods (new unschedulable pods).",
        );
        labelled(
            &mut out,
            "oxide_controller_triggers_total",
            "reason",
            TriggerReason::ALL
                .iter()
                .map(|r| r.as_str())
                .zip(&self.reasons),
        );
        header(
            &mut out,
            "oxide_controller_webhook_pending_watch",
            "gauge",
            "1 while the webhook watches for unschedulable pods (some pool autoscales).",
        );
        let _ = writeln!(
            out,
            "oxide_controller_webhook_pending_watch {}",
            self.watching.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "oxide_controller_webhook_state_conflicts_total",
            "counter",
            "ConfigMap writes refused with 409 (each one re-read and re-applied).",
        );
        let _ = writeln!(
            out,
            "oxide_controller_webhook_state_conflicts_total {}",
            self.conflicts.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "oxide_controller_webhook_state_writes_total",
            "counter",
            "ConfigMap writes of spec changes that succeeded; changes queued behind a write go together in the next one.",
        );
        let _ = writeln!(
            out,
            "oxide_controller_webhook_state_writes_total {}",
            self.writes.load(Ordering::Relaxed)
        );
        out
    }

    /// `oxide_controller_webhook_requests_total`, by route template, method and status.
    fn render_requests(&self, out: &mut String) {
        header(
            out,
            "oxide_controller_webhook_requests_total",
            "counter",
            "Webhook requests handled, by route template, method and status.",
        );
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for ((route, method, status), n) in &requests {
            let _ = writeln!(
                out,
                "oxide_controller_webhook_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                ROUTES[*route]
            );
        }
    }

    /// `oxide_controller_webhook_request_duration_seconds`, a histogram per route template.
    fn render_latency(&self, out: &mut String) {
        header(
            out,
            "oxide_controller_webhook_request_duration_seconds",
            "histogram",
            "Time to handle a webhook request, by route template.",
        );
        for (route, h) in ROUTES.iter().zip(&self.latency) {
            let count = h.count.load(Ordering::Relaxed);
            if count == 0 {
                continue;
            }
            let mut cumulative = 0;
            for (le, b) in BUCKETS.iter().zip(&h.buckets) {
                cumulative += b.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "oxide_controller_webhook_request_duration_seconds_bucket{{route=\"{route}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "oxide_controller_webhook_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {count}"
            );
            let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "oxide_controller_webhook_request_duration_seconds_sum{{route=\"{route}\"}} {sum}"
            );
            let _ = writeln!(
                out,
                "oxide_controller_webhook_request_duration_seconds_count{{route=\"{route}\"}} {count}"
            );
        }
    }
}

/// The cluster metrics' input, read from the ConfigMap at most once per TTL however often
/// `/metrics` is scraped: Prometheus scrapes every 15 to 60 seconds, more replicas of it or a
/// curl loop more often, and none of them should turn into apiserver reads.
#[derive(Debug, Default)]
pub struct ClusterCache {
    /// When it was read, and what. An async lock held across the read: scrapes that arrive
    /// while it is under way wait for it instead of reading too.
    slot: tokio::sync::Mutex<Option<(Instant, Input)>>,
    reads: AtomicU64,
}

impl ClusterCache {
    /// The input as read within the last `ttl`, or read now. A ConfigMap that cannot be read
    /// gives `status_up 0` under the cluster name last known (and is cached the same: an
    /// apiserver in trouble is not asked more often).
    pub async fn input<S: StateStore>(&self, state: &S, ttl: Duration) -> Input {
        let mut slot = self.slot.lock().await;
        if let Some((at, input)) = slot.as_ref()
            && at.elapsed() < ttl
        {
            return input.clone();
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let input = match state.read_config().await {
            Ok(snapshot) => Input::from_snapshot(&snapshot, chrono::Utc::now()),
            Err(e) => {
                tracing::warn!(error = %chain(&e), "cluster metrics: cannot read the ConfigMap");
                Input::unreadable(
                    slot.as_ref()
                        .map(|(_, i)| i.cluster.clone())
                        .unwrap_or_default(),
                )
            }
        };
        *slot = Some((Instant::now(), input.clone()));
        input
    }

    /// ConfigMap reads made for the cluster metrics so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

/// The `# HELP` and `# TYPE` lines of metric `name`.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One sample of `name` per label value.
fn labelled<'a>(
    out: &mut String,
    name: &str,
    label: &str,
    samples: impl Iterator<Item = (&'a str, &'a AtomicU64)>,
) {
    for (value, n) in samples {
        let _ = writeln!(
            out,
            "{name}{{{label}=\"{value}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_the_count() {
        let m = Metrics::default();
        m.observe(5, "GET", 200, Duration::from_micros(300));
        m.observe(5, "GET", 200, Duration::from_millis(3));
        m.observe(5, "GET", 200, Duration::from_secs(30));
        let text = m.render();
        assert!(
            text.contains(r#"_bucket{route="/nodes/workers",le="0.0005"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"_bucket{route="/nodes/workers",le="0.005"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"_bucket{route="/nodes/workers",le="5"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"_bucket{route="/nodes/workers",le="+Inf"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"_count{route="/nodes/workers"} 3"#),
            "{text}"
        );
        assert_eq!(m.requests("/nodes/workers", 200), 3);
    }
}
