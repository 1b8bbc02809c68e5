//! The scheduled restore drill, run by the reconcile (issue 46 item 4): each run decides with
//! [`crate::domain::backup::drill::next`] from what it already read (`drill.json`, the instance
//! list, its plan) and does at most this:
//!
//! - start: when a tick of `backup.drill_schedule` came since the last drill began, a backup
//!   writer reported a backup, and the run plans nothing else and finds nothing Degraded: the
//!   drill is recorded running in `drill.json` (server, backup, start) *before* anything is
//!   made, then its address and throw-away server are created from the newest backup
//!   ([`crate::workflows::drill`]). The run does not wait.
//! - watch: a later run reads the drill server's serial console (its setup prints the restored
//!   object count, or the node-setup failure marker) and, on a verdict or after
//!   [`crate::domain::backup::drill::DRILL_TIMEOUT`], records the result as the laptop's drill
//!   does and deletes what the drill made;
//! - clean: drill servers of no drill under way made more than the timeout ago (a run or a
//!   laptop's drill cut short) are deleted; a younger one is a laptop's drill under way.
//!
//! A run with no drill due, under way or left behind makes no request for drills. Failures
//! are logged and left to the next run: a drill never fails the reconcile.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use crate::base::secrets::ClusterSecrets;
use crate::domain::backup::drill::{self, Console, DrillReport, DrillRunning};
use crate::domain::backup::{self, BackupReport};
use crate::domain::model::InstanceState;
use crate::domain::plan::{Observed, Plan};
use crate::domain::spec::ClusterSpec;
use crate::ports::rack::Rack;
use crate::ports::state::{self, StateStore};
use crate::workflows::drill::{
    clean_drill, create_drill_server, drill_names, drill_spec_and_server,
};
use crate::workflows::error;

/// What the drill step reads of the run.
pub(super) struct DrillInput<'a> {
    pub spec: &'a ClusterSpec,
    pub secrets: &'a ClusterSecrets,
    pub observed: &'a Observed,
    /// `drill.json` as the run read it.
    pub report: DrillReport,
    pub backups: &'a BackupReport,
    pub watching_since: DateTime<Utc>,
    pub now: DateTime<Utc>,
    /// How long a cleanup may wait for the drill server to stop.
    pub stop_wait: Duration,
}

/// The run plans nothing else and finds nothing Degraded: a drill may start.
pub(super) fn quiet(plan: &Plan) -> bool {
    plan.actions.is_empty() && plan.roll.is_none() && !plan.findings.iter().any(|f| f.degraded)
}

/// The cluster's drill servers on the rack (described as its drill's,
/// [`drill::server_description`]) and when each was made.
fn drill_servers(spec: &ClusterSpec, observed: &Observed) -> Vec<(String, DateTime<Utc>)> {
    observed
        .instances
        .iter()
        .filter(|i| i.state != InstanceState::Destroyed)
        .filter(|i| drill::server_of(&i.description) == Some(spec.cluster.as_str()))
        .map(|i| (i.name.clone(), i.time_created))
        .collect()
}

/// The drill's step this run. Returns `drill.json` as this run left it, when it changed it.
pub(super) async fn step<R, S>(
    rack: &R,
    state: &S,
    input: DrillInput<'_>,
    quiet: bool,
) -> Option<DrillReport>
where
    R: Rack + crate::adapters::image::ImageStore,
    S: StateStore,
{
    let servers = drill_servers(input.spec, input.observed);
    let next = drill::next(
        input.spec.backup.drill_schedule.as_deref(),
        &input.report,
        &servers,
        quiet,
        input.backups.last_success.is_some(),
        input.watching_since,
        input.now,
    );
    let (_, fip_name) = drill_names(&input.spec.cluster);
    // Every drill of the cluster has the same address: while another drill's server stays (a
    // laptop's drill under way, or the scheduled one), it stays too.
    let running = input.report.running.as_ref().map(|r| r.server.as_str());
    let others_stay = servers
        .iter()
        .any(|(s, _)| Some(s.as_str()) != running && !next.clean.contains(s));
    let address = (!others_stay).then_some(fip_name.as_str());
    for server in &next.clean {
        info!(instance = %server, "deleting a restore drill's server left behind (no drill under way on it)");
        let fip = address.filter(|_| running.is_none());
        if let Err(e) = clean_drill(rack, server, fip, input.stop_wait).await {
            warn!(instance = %server, error = %error::chain(&e), "could not delete the drill's server; the next run tries again");
        }
    }
    let mut changed = None;
    if let Some(r) = &next.vanished {
        warn!(instance = %r.server, backup = %r.backup, "the drill under way has no server on the rack (its start was cut short): forgetting it, the drill is due again");
        if clean_drill(rack, &r.server, address, input.stop_wait)
            .await
            .is_ok()
        {
            changed = record(state, |d| DrillReport { running: None, ..d }).await;
        }
    }
    if let Some(r) = &next.watch {
        changed = watch(rack, state, &input, r, address).await.or(changed);
    }
    if next.start {
        changed = start(rack, state, &input).await.or(changed);
    }
    changed
}

/// Reads the drill server's console; on a verdict (or the timeout), deletes what the drill
/// made and records the result.
async fn watch<R: Rack, S: StateStore>(
    rack: &R,
    state: &S,
    input: &DrillInput<'_>,
    running: &DrillRunning,
    address: Option<&str>,
) -> Option<DrillReport> {
    let console = match rack.serial_console(&running.server).await {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            match (
                crate::render::cloud_init::setup_failure(&text),
                drill::restored_objects(&text),
            ) {
                (Some(f), _) => Console::Failed(format!("{}: {}", f.step, f.reason)),
                (None, Some(n)) => Console::Restored(n),
                (None, None) => Console::Nothing,
            }
        }
        Err(e) => {
            tracing::debug!(instance = %running.server, error = %e, "the drill server's console is not readable yet");
            Console::Nothing
        }
    };
    let Some(mut result) = drill::judge(running, &console, input.now) else {
        info!(instance = %running.server, backup = %running.backup, "restore drill under way");
        return None;
    };
    match clean_drill(rack, &running.server, address, input.stop_wait).await {
        Ok(()) => result.cleaned_up = true,
        Err(e) => {
            warn!(instance = %running.server, error = %error::chain(&e), "could not delete everything the drill made; the next run tries again");
        }
    }
    info!(backup = %running.backup, ok = result.ok, reason = result.reason.as_deref().unwrap_or(""), "restore drill finished");
    record(state, move |d| d.finished(result.clone())).await
}

/// Starts a drill of the newest backup: recorded running first, then made.
async fn start<R, S>(rack: &R, state: &S, input: &DrillInput<'_>) -> Option<DrillReport>
where
    R: Rack + crate::adapters::image::ImageStore,
    S: StateStore,
{
    let step = "drill";
    let cluster = &input.spec.cluster;
    let listed = crate::workflows::backup::list_backups(rack, cluster).await;
    let chosen = match listed {
        Ok(all) => all.into_iter().next()?,
        Err(e) => {
            warn!(error = %e, "cannot list the backups to drill; the next run tries again");
            return None;
        }
    };
    let failed = |reason: String| drill::DrillResult {
        at: input.now,
        backup: Some(chosen.name.clone()),
        backup_time: Some(chosen.tag.time),
        ok: false,
        reason: Some(reason),
        expected_objects: chosen.tag.objects,
        restored_objects: None,
        restore_seconds: None,
        cleaned_up: true,
        by: drill::BY_SCHEDULE.to_owned(),
        started: Some(input.now),
    };
    let ours = backup::token_fingerprint(&input.secrets.k3s_token);
    if chosen.tag.token != ours {
        let result = failed(format!(
            "backup {} was taken with another server token (fingerprint {}) than the cluster's ({ours}): k3s could not decrypt it. Take a new backup (bootstrap backup --cluster {cluster})",
            chosen.name, chosen.tag.token
        ));
        return record(state, move |d| d.finished(result.clone())).await;
    }
    let (spec, name) = match drill_spec_and_server(input.spec) {
        Ok(x) => x,
        Err(e) => {
            let result = failed(error::chain(&e));
            return record(state, move |d| d.finished(result.clone())).await;
        }
    };
    let running = DrillRunning {
        server: name.clone(),
        backup: chosen.name.clone(),
        backup_time: chosen.tag.time,
        expected_objects: chosen.tag.objects,
        started: input.now,
    };
    // Recorded before anything is made: a run cut short leaves a drill the next run cleans.
    let recorded = record(state, |d| DrillReport {
        running: Some(running.clone()),
        ..d
    })
    .await?;
    info!(instance = %name, backup = %chosen.name, "starting a scheduled restore drill");
    match create_drill_server(rack, input.secrets, &spec, &chosen, cluster, &name, step).await {
        Ok(_) => Some(recorded),
        Err(e) => {
            let mut result = failed(format!(
                "the drill's server could not be made: {}",
                error::chain(&e)
            ));
            let (_, fip_name) = drill_names(cluster);
            result.cleaned_up = clean_drill(rack, &name, Some(&fip_name), input.stop_wait)
                .await
                .is_ok();
            record(state, move |d| d.finished(result.clone())).await
        }
    }
}

/// Edits `drill.json` (re-read on a conflict). Returns the report written, or `None` (logged)
/// when it could not be.
async fn record<S: StateStore>(
    state: &S,
    edit: impl Fn(DrillReport) -> DrillReport + Send + Sync,
) -> Option<DrillReport> {
    let mut written = None;
    let done = state::edit_config(state, None, |data| {
        let report = edit(
            data.get(state::keys::DRILL)
                .and_then(|j| DrillReport::from_json(j))
                .unwrap_or_default(),
        );
        data.insert(state::keys::DRILL.to_owned(), report.to_json());
        written = Some(report);
    })
    .await;
    match done {
        Ok(()) => written,
        Err(e) => {
            warn!(error = %e, "could not write drill.json");
            None
        }
    }
}
