//! What `scale status` shows: one cluster at a glance, the way `clusterctl describe cluster`
//! or `kubectl describe` would. Built from what an operator can read with read-only access:
//! the spec and the last run's `status.json` (ConfigMap), the Nodes, and the recent Events.
//!
//! This module only assembles and renders ([`build`], [`render_table`]); the reads are the
//! caller's. The JSON form is [`View`] itself (camelCase, like `status.json`).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::autoscale::{Decision, Unhostable};
use crate::domain::model::{Node, NodeReadiness, REMOVING_ANNOTATION};
use crate::domain::spec::{ClusterSpec, POOL_LABEL, Role};
use crate::domain::status::{Condition, PlannedAction, Status};

/// How many Events the view keeps (newest first).
pub const MAX_EVENTS: usize = 10;

/// A cluster at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    pub cluster: String,
    pub project: String,
    pub pools: Vec<PoolView>,
    /// From the last run; empty before the first.
    pub conditions: Vec<Condition>,
    pub last_run: Option<LastRun>,
    /// Things the last run noticed and did not act on.
    pub findings: Vec<String>,
    pub autoscale: Option<AutoscaleView>,
    /// Newest first, at most [`MAX_EVENTS`].
    pub events: Vec<EventSummary>,
    /// Nodes that carry no pool label of this cluster (joined by hand, or another cluster's).
    pub other_nodes: Vec<String>,
    /// The Kubernetes upgrade the last run saw under way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<crate::domain::upgrade::UpgradeStatus>,
    /// The last backup and the last attempt's error, as the last run saw them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup: Option<crate::domain::backup::BackupStatus>,
    /// Per pool, the earliest certificate end k3s's monitors report, as the last run saw.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<crate::domain::certificates::PoolCertificates>,
    /// The webhook's serving certificate, as the last run kept it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_certificate: Option<crate::domain::certificates::WebhookCertificate>,
    /// The cluster's Oxide token, as the last run found it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oxide_token: Option<crate::domain::oxide_token::OxideTokenRecord>,
    /// What could not be read, and what access it needs (the view is shown without it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// One pool: the spec's count, the last run's tally, and its Nodes now.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    pub name: String,
    pub role: Role,
    /// The spec's count.
    pub desired: u32,
    /// `[min, max]` while the pool autoscales.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<[u32; 2]>,
    /// What the last run counted (ready, joining, broken, removing, drifted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run: Option<crate::domain::plan::PoolCounts>,
    /// The spec's k3s version for the pool.
    pub version: String,
    /// The version the last run rolled the pool to, when not yet `version`, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<WaitingView>,
    pub members: Vec<MemberView>,
}

/// A pool that keeps an older version during an upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingView {
    pub rolling_to: String,
    pub waiting_for: String,
}

/// One Node of a pool, as the API shows it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    pub node: String,
    /// `Ready` or `NotReady` (condition False or Unknown).
    pub ready: String,
    pub created: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    pub cordoned: bool,
    /// Why the controller is removing it (its `oxide-controller/removing` annotation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removing: Option<String>,
    /// Its kubelet version (`status.nodeInfo.kubeletVersion`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The last reconcile run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastRun {
    pub run_id: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub actions: Vec<PlannedAction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_converged_at: Option<DateTime<Utc>>,
}

/// What the autoscaler decided in the last run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoscaleView {
    pub decisions: Vec<Decision>,
    pub unhostable: Vec<Unhostable>,
    /// Unhostable pods past those listed, by owner.
    pub unhostable_more: u32,
}

/// One Kubernetes Event about the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventSummary {
    pub time: DateTime<Utc>,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub note: String,
}

impl View {
    /// The last run reported the cluster Degraded (`status` exits non-zero).
    pub fn degraded(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "True")
    }
}

/// Assembles the view. `events` in any order; the newest [`MAX_EVENTS`] are kept.
pub fn build(
    spec: &ClusterSpec,
    status: Option<&Status>,
    nodes: &[Node],
    mut events: Vec<EventSummary>,
) -> View {
    let pools: Vec<PoolView> = spec
        .pools()
        .map(|(role, p)| {
            let mut members: Vec<MemberView> = nodes
                .iter()
                .filter(|n| n.labels.get(POOL_LABEL) == Some(&p.name))
                .map(member)
                .collect();
            members.sort_by(|a, b| a.node.cmp(&b.node));
            PoolView {
                name: p.name.clone(),
                role,
                desired: p.count,
                autoscale: p
                    .autoscale
                    .as_ref()
                    .is_some_and(|a| a.enabled)
                    .then_some([p.min, p.max]),
                last_run: status.and_then(|s| s.pools.iter().find(|c| c.pool == p.name).cloned()),
                version: spec.k3s_version(p).to_owned(),
                waiting: status
                    .and_then(|s| s.versions.iter().find(|v| v.pool == p.name))
                    .and_then(|v| {
                        Some(WaitingView {
                            rolling_to: v.rolling_to.clone(),
                            waiting_for: v.waiting_for.clone()?,
                        })
                    }),
                members,
            }
        })
        .collect();
    let mut other_nodes: Vec<String> = nodes
        .iter()
        .filter(|n| {
            n.labels
                .get(POOL_LABEL)
                .is_none_or(|pool| !spec.pools().any(|(_, p)| &p.name == pool))
        })
        .map(|n| n.name.clone())
        .collect();
    other_nodes.sort();
    events.sort_by_key(|e| std::cmp::Reverse(e.time));
    events.truncate(MAX_EVENTS);
    View {
        cluster: spec.cluster.clone(),
        project: spec.project.clone(),
        pools,
        conditions: status.map(|s| s.conditions.clone()).unwrap_or_default(),
        last_run: status.map(|s| LastRun {
            run_id: s.run_id.clone(),
            started_at: s.started_at,
            finished_at: s.finished_at,
            actions: s.last_plan.clone(),
            error: s.last_error.clone(),
            last_converged_at: s.last_converged_at,
        }),
        findings: status.map(|s| s.findings.clone()).unwrap_or_default(),
        autoscale: status
            .and_then(|s| s.autoscale.as_ref())
            .map(|a| AutoscaleView {
                decisions: a.decisions.clone(),
                unhostable: a.unhostable.clone(),
                unhostable_more: a.unhostable_more.values().sum(),
            }),
        events,
        other_nodes,
        upgrade: status.and_then(|s| s.upgrade.clone()),
        backup: status.and_then(|s| s.backup.clone()),
        certificates: status.map(|s| s.certificates.clone()).unwrap_or_default(),
        webhook_certificate: status.and_then(|s| s.webhook_certificate.clone()),
        oxide_token: status.and_then(|s| s.oxide_token.clone()),
        unreadable: Vec::new(),
    }
}

fn member(n: &Node) -> MemberView {
    MemberView {
        node: n.name.clone(),
        ready: match n.readiness {
            NodeReadiness::Ready => "Ready",
            NodeReadiness::NotReady { .. } => "NotReady",
        }
        .to_owned(),
        created: n.created,
        provider_id: n.provider_id.clone(),
        cordoned: n.unschedulable,
        removing: n.annotations.get(REMOVING_ANNOTATION).cloned(),
        version: n.kubelet_version.clone(),
    }
}

/// `3d4h`, `2h5m`, `4m10s`, `12s`: kubectl's short ages.
pub fn age(from: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let s = (now - from).num_seconds().max(0);
    let (d, h, m) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{}s", s % 60),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

/// The view as text for a terminal: a header, a table per pool, then conditions, the last
/// run, the autoscaler and the Events. Ages are relative to `now`.
pub fn render_table(v: &View, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    render_header(&mut out, v);
    for p in &v.pools {
        render_pool(&mut out, p, now);
    }
    if !v.other_nodes.is_empty() {
        let _ = writeln!(out, "\nNodes in no pool: {}", v.other_nodes.join(", "));
    }
    render_conditions(&mut out, v, now);
    render_last_run(&mut out, v, now);
    if let Some(b) = &v.backup {
        render_backup(&mut out, b, now);
    }
    if !v.certificates.is_empty() || v.webhook_certificate.is_some() {
        render_certificates(&mut out, &v.certificates, now);
    }
    if let Some(w) = &v.webhook_certificate {
        render_webhook_certificate(&mut out, w, now);
    }
    if let Some(t) = &v.oxide_token {
        render_oxide_token(&mut out, t, now);
    }
    if let Some(a) = &v.autoscale {
        render_autoscaler(&mut out, a);
    }
    render_events(&mut out, v, now);
    for u in &v.unreadable {
        let _ = writeln!(out, "\nnot shown: {u}");
    }
    out
}

/// `cluster <c> (project <p>): <state>`.
fn render_header(out: &mut String, v: &View) {
    let state = if v.degraded() {
        "Degraded"
    } else if v
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
    {
        "Ready"
    } else if v.last_run.is_none() {
        "no run yet"
    } else {
        "not Ready"
    };
    let _ = writeln!(
        out,
        "cluster {} (project {}): {state}",
        v.cluster, v.project
    );
    if let Some(u) = &v.upgrade {
        let _ = writeln!(
            out,
            "upgrading {} -> {}: phase {} (servers first, then worker pools in order)",
            u.from, u.to, u.phase
        );
    }
}

/// A pool's line (desired size, autoscaling bounds, last run's tally) and its Nodes' table.
fn render_pool(out: &mut String, p: &PoolView, now: DateTime<Utc>) {
    let _ = writeln!(out);
    let role = match p.role {
        Role::ControlPlane => "control plane",
        Role::Worker => "workers",
    };
    let bounds = p
        .autoscale
        .map(|[lo, hi]| format!(", autoscaling {lo}..{hi}"))
        .unwrap_or_default();
    let tally = p
        .last_run
        .as_ref()
        .map(|c| {
            let mut parts = vec![format!("{} ready", c.ready)];
            for (n, what) in [
                (c.joining, "joining"),
                (c.not_ready, "not ready"),
                (c.broken, "broken"),
                (c.removing, "removing"),
                (c.drifted, "drifted"),
            ] {
                if n > 0 {
                    parts.push(format!("{n} {what}"));
                }
            }
            format!(" — last run: {}", parts.join(", "))
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "pool {} ({role}): desired {}{bounds}, k3s {}{tally}",
        p.name, p.desired, p.version
    );
    if let Some(w) = &p.waiting {
        let _ = writeln!(
            out,
            "  stays at {} (also for new members) until {}",
            w.rolling_to, w.waiting_for
        );
    }
    if p.members.is_empty() {
        let _ = writeln!(out, "  (no Nodes)");
        return;
    }
    let rows: Vec<[String; 6]> = p
        .members
        .iter()
        .map(|m| {
            let mut notes = Vec::new();
            if m.cordoned {
                notes.push("cordoned".to_owned());
            }
            if let Some(r) = &m.removing {
                notes.push(format!("removing: {r}"));
            }
            [
                m.node.clone(),
                m.ready.clone(),
                m.version.clone().unwrap_or_else(|| "-".into()),
                age(m.created, now),
                m.provider_id.clone().unwrap_or_else(|| "-".into()),
                notes.join("; "),
            ]
        })
        .collect();
    table(
        out,
        ["NODE", "STATUS", "VERSION", "AGE", "PROVIDER ID", "NOTES"],
        &rows,
    );
}

fn render_conditions(out: &mut String, v: &View, now: DateTime<Utc>) {
    if v.conditions.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nconditions:");
    let rows: Vec<[String; 5]> = v
        .conditions
        .iter()
        .map(|c| {
            [
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                age(c.last_transition_time, now),
                c.message.clone(),
            ]
        })
        .collect();
    table(out, ["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], &rows);
}

/// The last run with its actions and error, then the findings.
fn render_last_run(out: &mut String, v: &View, now: DateTime<Utc>) {
    match &v.last_run {
        Some(r) => {
            let took = (r.finished_at - r.started_at).num_milliseconds().max(0);
            let _ = writeln!(
                out,
                "\nlast run {}: {} ago, took {}.{:03}s, {} action(s)",
                r.run_id,
                age(r.finished_at, now),
                took / 1000,
                took % 1000,
                r.actions.len()
            );
            for a in &r.actions {
                let _ = writeln!(
                    out,
                    "  {} {}: {} ({})",
                    a.action, a.target, a.outcome, a.reason
                );
            }
            if let Some(e) = &r.error {
                let _ = writeln!(out, "  error: {e}");
            }
        }
        None => {
            let _ = writeln!(out, "\nno reconcile run has written a status yet");
        }
    }
    for f in &v.findings {
        let _ = writeln!(out, "  finding: {f}");
    }
}

/// `backups (schedule S): last NAME 12m ago[, STALE]` and the last attempt's error.
fn render_backup(out: &mut String, b: &crate::domain::backup::BackupStatus, now: DateTime<Utc>) {
    let schedule = b.schedule.as_deref().map_or_else(
        || "in-cluster schedule off".to_owned(),
        |s| format!("schedule {s}"),
    );
    let last = b.report.last_success.as_ref().map_or_else(
        || "none yet".to_owned(),
        |l| format!("last {} {} ago (by {})", l.name, age(l.time, now), l.by),
    );
    let stale = if b.stale {
        ", STALE: older than two schedule periods"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "
backups ({schedule}): {last}{stale}"
    );
    if let Some(e) = &b.report.last_error {
        let at = b
            .report
            .last_attempt_at
            .map_or_else(String::new, |t| format!(" {} ago", age(t, now)));
        let _ = writeln!(out, "  last attempt failed{at}: {e}");
    }
    if let Some(d) = &b.drill {
        let last = d.report.last.as_ref().map_or_else(
            || "none yet".to_owned(),
            |l| {
                let outcome = if l.ok {
                    "passed".to_owned()
                } else {
                    format!(
                        "FAILED: {}",
                        l.reason.as_deref().unwrap_or("no reason given")
                    )
                };
                format!(
                    "last {} ago of {} (by {}): {outcome}",
                    age(l.at, now),
                    l.backup.as_deref().unwrap_or("no backup"),
                    l.by
                )
            },
        );
        let schedule = d
            .schedule
            .as_deref()
            .map_or_else(|| "schedule off".to_owned(), |s| format!("schedule {s}"));
        let problem = d
            .problem
            .as_deref()
            .map_or_else(String::new, |p| format!(" [{p}]"));
        let _ = writeln!(out, "  restore drills ({schedule}): {last}{problem}");
        if let Some(r) = &d.report.running {
            let _ = writeln!(
                out,
                "  restore drill under way for {}: server {} restoring {}",
                age(r.started, now),
                r.server,
                r.backup
            );
        }
    }
}

/// `certificates: POOL earliest end ... (NODE)` per pool, from k3s's certificate monitors.
fn render_certificates(
    out: &mut String,
    pools: &[crate::domain::certificates::PoolCertificates],
    now: DateTime<Utc>,
) {
    let _ = writeln!(
        out,
        "\ncertificates (k3s's monitors, which report 90 days ahead):"
    );
    for c in pools {
        let end = match (c.earliest_end, &c.node) {
            (Some(end), Some(node)) if end > now => {
                format!("earliest end in {} ({end}, {node})", age(now, end))
            }
            (Some(end), Some(node)) => format!("ENDED {} ago ({end}, {node})", age(end, now)),
            _ => "nothing ends within 90 days".to_owned(),
        };
        let _ = write!(out, "  {}: {end}", c.pool);
        if let Some(r) = &c.restarting {
            let _ = write!(out, "; restarting {r} to renew them");
        }
        if !c.unreported.is_empty() {
            let _ = write!(out, "; not reported yet: {}", c.unreported.join(", "));
        }
        let _ = writeln!(out);
    }
}

/// `  webhook: ends in ... (re-issued ... ago)[; NOT RE-ISSUED: why]`, under `certificates`.
fn render_webhook_certificate(
    out: &mut String,
    w: &crate::domain::certificates::WebhookCertificate,
    now: DateTime<Utc>,
) {
    let end = if w.not_after > now {
        format!("ends in {} ({})", age(now, w.not_after), w.not_after)
    } else {
        format!("ENDED {} ago ({})", age(w.not_after, now), w.not_after)
    };
    let renewed = w
        .renewed_at
        .map_or_else(String::new, |r| format!(", re-issued {} ago", age(r, now)));
    let problem = w
        .error
        .as_deref()
        .map_or_else(String::new, |e| format!("; NOT RE-ISSUED: {e}"));
    let _ = writeln!(out, "  webhook: {end}{renewed}{problem}");
}

/// `oxide token: ends in ... (...)`, `never expires`, or why it cannot be told.
fn render_oxide_token(
    out: &mut String,
    t: &crate::domain::oxide_token::OxideTokenRecord,
    now: DateTime<Utc>,
) {
    let what = match (&t.error, t.expires_at) {
        (Some(e), _) => format!("UNKNOWN: {e}"),
        (None, None) => "never expires".to_owned(),
        (None, Some(end)) if end > now => format!("ends in {} ({end})", age(now, end)),
        (None, Some(end)) => format!("ENDED {} ago ({end})", age(end, now)),
    };
    let _ = writeln!(
        out,
        "\noxide token: {what} (checked {} ago)",
        age(t.checked_at, now)
    );
}

fn render_autoscaler(out: &mut String, a: &AutoscaleView) {
    if !a.decisions.is_empty() || !a.unhostable.is_empty() {
        let _ = writeln!(out, "\nautoscaler:");
    }
    for d in &a.decisions {
        let _ = writeln!(out, "  {}: {} → {} ({})", d.pool, d.from, d.to, d.reason);
    }
    for u in &a.unhostable {
        let _ = writeln!(out, "  unhostable {}: {}", u.pod, u.reason);
    }
    if a.unhostable_more > 0 {
        let _ = writeln!(out, "  … and {} more unhostable pods", a.unhostable_more);
    }
}

fn render_events(out: &mut String, v: &View, now: DateTime<Utc>) {
    if v.events.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nevents (newest first):");
    let rows: Vec<[String; 4]> = v
        .events
        .iter()
        .map(|e| {
            [
                age(e.time, now),
                e.type_.clone(),
                e.reason.clone(),
                e.note.clone(),
            ]
        })
        .collect();
    table(out, ["AGE", "TYPE", "REASON", "NOTE"], &rows);
}

/// Columns padded to their widest cell, indented two spaces; the last column is not padded.
fn table<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut width = header.map(|h| h.chars().count());
    for r in rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: [&str; N]| {
        let mut s = String::from(" ");
        for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
            s.push(' ');
            s.push_str(cell);
            if i + 1 < N {
                s.push_str(&" ".repeat(w - cell.chars().count() + 1));
            }
        }
        let _ = writeln!(out, "{}", s.trim_end());
    };
    line(out, header);
    for r in rows {
        line(out, std::array::from_fn(|i| r[i].as_str()));
    }
}

#[cfg(test)]
mod tests;
