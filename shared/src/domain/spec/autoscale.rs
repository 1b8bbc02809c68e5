//! The `autoscale` block of a worker pool in `spec.yaml`: its fields, defaults and checks.
//! The decisions made from it live in [`crate::domain::autoscale`].

use serde::{Deserialize, Serialize};

/// Per-pool autoscaling settings (`worker_pools[].autoscale` in `spec.yaml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscaleSpec {
    /// Off means the pool's count is what the spec or the webhook says, as without this block.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long a node must stay unneeded before it is removed (cluster-autoscaler's
    /// `--scale-down-unneeded-time`, default 10 minutes).
    #[serde(default = "default_unneeded_seconds")]
    pub scale_down_unneeded_seconds: u64,
    /// A node whose larger request fraction (cpu or memory) is below this is a candidate for
    /// removal (`--scale-down-utilization-threshold`, default 0.5). 0 disables scale-down of
    /// non-empty nodes.
    #[serde(default = "default_threshold")]
    pub utilization_threshold: f64,
    /// The most nodes one run adds to this pool.
    #[serde(default = "default_max_added")]
    pub max_nodes_per_run: u32,
    /// No node of this pool is removed until this long after the last scale-up
    /// (`--scale-down-delay-after-add`, default 10 minutes).
    #[serde(default = "default_unneeded_seconds")]
    pub scale_down_delay_after_add_seconds: u64,
    /// A removal the autoscaler started that has not finished after this long is given up:
    /// the node is uncordoned and left alone for five minutes (cluster-autoscaler saves a
    /// node whose eviction keeps failing). Default 10 minutes (`--max-graceful-termination-sec`).
    #[serde(default = "default_unneeded_seconds")]
    pub removal_timeout_seconds: u64,
    /// Windows that override min/max while active; the first active one wins.
    #[serde(default)]
    pub schedules: Vec<ScheduleWindow>,
}

fn yes() -> bool {
    true
}
fn default_unneeded_seconds() -> u64 {
    600
}
fn default_threshold() -> f64 {
    0.5
}
fn default_max_added() -> u32 {
    10
}

impl Default for AutoscaleSpec {
    fn default() -> Self {
        AutoscaleSpec {
            enabled: true,
            scale_down_unneeded_seconds: default_unneeded_seconds(),
            utilization_threshold: default_threshold(),
            max_nodes_per_run: default_max_added(),
            scale_down_delay_after_add_seconds: default_unneeded_seconds(),
            removal_timeout_seconds: default_unneeded_seconds(),
            schedules: Vec::new(),
        }
    }
}

/// A time window, opened by a cron schedule and lasting `duration_minutes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleWindow {
    pub name: String,
    /// Kubernetes cron dialect, e.g. `0 8 * * 1-5`.
    pub start: String,
    pub duration_minutes: u32,
    /// IANA zone whose wall clock `start` follows (a CronJob's `spec.timeZone`), e.g.
    /// `Europe/Berlin`; default UTC. Checked as the apiserver checks `timeZone`.
    #[serde(default = "utc")]
    pub time_zone: String,
    #[serde(default)]
    pub min: Option<u32>,
    #[serde(default)]
    pub max: Option<u32>,
}

fn utc() -> String {
    "UTC".into()
}

/// What is wrong with an `autoscale` block; `field` is relative to the block.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct AutoscaleSpecError {
    pub field: String,
    pub message: String,
}

impl AutoscaleSpec {
    /// Checks the block against the pool's bounds; every problem is reported.
    pub fn validate(&self, pool_min: u32, pool_max: u32) -> Vec<AutoscaleSpecError> {
        let mut errs = Vec::new();
        let mut err =
            |field: String, message: String| errs.push(AutoscaleSpecError { field, message });
        if !(0.0..=1.0).contains(&self.utilization_threshold) {
            err(
                "utilization_threshold".into(),
                format!("{} is not between 0 and 1", self.utilization_threshold),
            );
        }
        if self.max_nodes_per_run == 0 {
            err("max_nodes_per_run".into(), "must be at least 1".into());
        }
        if self.removal_timeout_seconds == 0 {
            err(
                "removal_timeout_seconds".into(),
                "must be at least 1".into(),
            );
        }
        for (i, w) in self.schedules.iter().enumerate() {
            let base = format!("schedules[{i}]");
            // As a CronJob: no TZ in the schedule, the zone goes in its own field.
            if let Err(e) = crate::base::kcron::validate_cronjob_schedule(&w.start) {
                err(format!("{base}.start"), e);
            }
            if let Err(e) = crate::base::kcron::validate_time_zone(&w.time_zone) {
                err(format!("{base}.time_zone"), e);
            }
            if w.duration_minutes == 0 {
                err(
                    format!("{base}.duration_minutes"),
                    "must be at least 1".into(),
                );
            }
            let (min, max) = (w.min.unwrap_or(pool_min), w.max.unwrap_or(pool_max));
            if min > max {
                err(
                    format!("{base}.min"),
                    format!("min {min} is greater than max {max} while the window is active"),
                );
            }
        }
        errs
    }
}
