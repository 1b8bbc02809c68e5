//! The planner's part of certificate renewal (see [`crate::domain::certificates`]): which
//! node to restart, when a restart is over, what the status says.

use std::collections::BTreeMap;

use chrono::{DateTime, SubsecRound as _, Utc};

use super::{Action, Finding, Health, Member, Observed, Plan};
use crate::domain::certificates::{Outcome, PoolCertificates, RESTART_ANNOTATION, Report, Restart};
use crate::domain::spec::{ClusterSpec, Role, TaintEffect};

fn restart_of(m: &Member) -> Option<Restart> {
    m.node
        .and_then(|n| n.annotations.get(RESTART_ANNOTATION))
        .and_then(|v| Restart::parse(v))
}

/// What the steps below share.
struct Ctx<'a> {
    spec: &'a ClusterSpec,
    observed: &'a Observed,
    members: &'a [Member<'a>],
    reports: &'a BTreeMap<String, Report>,
    now: DateTime<Utc>,
}

impl Ctx<'_> {
    fn report(&self, m: &Member) -> Option<Report> {
        m.node.and_then(|n| self.reports.get(&n.name)).copied()
    }
}

/// Restarts for certificates: finishes those whose node reported after them, starts one
/// when the cluster has nothing else to do, and fills `p.certificates`.
pub(super) fn plan(
    spec: &ClusterSpec,
    observed: &Observed,
    members: &[Member],
    etcd_held: bool,
    now: DateTime<Utc>,
    p: &mut Plan,
) {
    let reports = match &observed.certificates {
        None => return,
        Some(Ok(reports)) => reports,
        Some(Err(why)) => {
            // Without them nothing renews, and the cluster stops in a year.
            p.findings.push(Finding {
                degraded: true,
                message: format!(
                    "cannot read k3s's certificate monitor Events in namespace default ({why}); no node is restarted to renew its certificates until they can be read (the reconcile account needs list on events there)"
                ),
            });
            return;
        }
    };
    let cx = Ctx {
        spec,
        observed,
        members,
        reports,
        now,
    };
    let under_way = restarts_under_way(&cx, p);
    p.certificates = outcome(&cx, p);
    // A new restart: one node at a time, when nothing else is planned or under way, every
    // member Ready and etcd's members as expected (a server's restart then keeps quorum).
    if under_way || !p.actions.is_empty() || etcd_held {
        return;
    }
    if members.iter().any(|m| m.health != Health::Ready) {
        return;
    }
    start_one(&cx, p);
}

/// Restarts under way: over once the node is Ready and its monitor spoke after it; carried
/// on while asked for and not made (a drain that had not finished). Whether one is.
fn restarts_under_way(cx: &Ctx, p: &mut Plan) -> bool {
    let renew_before = cx.spec.certificates.renew_before();
    let mut under_way = false;
    for m in cx.members {
        let (Some(Restart::Restarting(at)), Some(node)) = (restart_of(m), m.node) else {
            continue;
        };
        under_way = true;
        // The monitor of the k3s that was restarted: the instance changed state after the ask
        // (the reboot), and the report came after that. The old k3s may still report between
        // the ask and the VM's halt. Event times have whole seconds: a report in the second
        // the instance came back counts only as the fresh start's all-clear (k3s records
        // `CertificateExpirationOK` only on its first check after a start).
        let back = m.instance.time_state_updated;
        let reported = back > at
            && cx.report(m).is_some_and(|r| {
                r.at > back || (r.ends.is_none() && r.at >= back.trunc_subsecs(0))
            });
        if m.health == Health::Ready && reported {
            let still = cx
                .report(m)
                .and_then(|r| r.ends)
                .filter(|e| *e - cx.now <= renew_before);
            p.actions.push(Action::FinishCertificateRestart {
                pool: m.pool.clone(),
                name: m.instance.name.clone(),
                node: node.name.clone(),
                uncordon: node.unschedulable,
                since: at,
                reason: match still {
                    None => "k3s's certificate monitor reports after the restart: its certificates were renewed".to_owned(),
                    Some(end) => format!(
                        "k3s's certificate monitor reports after the restart, and a certificate still ends at {end}: k3s did not renew it (see the node's k3s log)"
                    ),
                },
            });
        } else if m.instance.time_state_updated <= at && m.health == Health::Ready {
            p.actions.push(restart_action(
                cx.spec,
                m,
                node.name.as_str(),
                at,
                cx.members,
                "carrying on the restart for certificates",
            ));
        }
    }
    under_way
}

/// The status: per pool, the earliest end reported; Degraded within `degraded_before_days`.
fn outcome(cx: &Ctx, p: &mut Plan) -> Outcome {
    let mut pools: BTreeMap<&str, PoolCertificates> = BTreeMap::new();
    for m in cx.members {
        let e = pools
            .entry(m.pool.as_str())
            .or_insert_with(|| PoolCertificates {
                pool: m.pool.clone(),
                earliest_end: None,
                node: None,
                unreported: Vec::new(),
                restarting: None,
            });
        let Some(node) = m.node else { continue };
        if matches!(restart_of(m), Some(Restart::Restarting(_))) {
            e.restarting = Some(node.name.clone());
        }
        match cx.report(m) {
            None => e.unreported.push(node.name.clone()),
            Some(Report {
                ends: Some(end), ..
            }) if e.earliest_end.is_none_or(|x| end < x) => {
                e.earliest_end = Some(end);
                e.node = Some(node.name.clone());
            }
            Some(_) => {}
        }
    }
    let mut outcome = Outcome {
        pools: pools.into_values().collect(),
        degraded: None,
        read_at: Some(cx.now),
    };
    if let Some(worst) = outcome
        .pools
        .iter()
        .filter_map(|c| Some((c.earliest_end?, c.node.clone()?)))
        .min()
        .filter(|(end, _)| *end - cx.now <= cx.spec.certificates.degraded_before())
    {
        let msg = format!(
            "the certificates of {} end at {} (within certificates.degraded_before_days = {}): {}",
            worst.1,
            worst.0,
            cx.spec.certificates.degraded_before_days,
            if worst.0 <= cx.now {
                "they have ended; k3s renews them on its next start (reboot the node)"
            } else {
                "their renewal did not happen; see the last plan and the node's k3s log"
            }
        );
        p.findings.push(Finding {
            degraded: true,
            message: msg.clone(),
        });
        outcome.degraded = Some(msg);
    }
    outcome
}

/// The node whose certificates end first within the lead, restarted (or the API address
/// moved off it first), when a window allows or it is urgent.
fn start_one(cx: &Ctx, p: &mut Plan) {
    let renew_before = cx.spec.certificates.renew_before();
    let now = cx.now;
    let due = cx
        .members
        .iter()
        .filter_map(|m| {
            let end = cx.report(m)?.ends?;
            (end - now <= renew_before).then_some((end, m))
        })
        .filter(|(_, m)| {
            // A restart the monitor reported after and that renewed nothing is not repeated
            // for half the renewal lead (the finding of its finish says why).
            !matches!(restart_of(m), Some(Restart::Done(at)) if now - at < renew_before / 2)
        })
        .min_by_key(|(end, m)| (*end, m.instance.name.clone()));
    let Some((end, m)) = due else {
        return;
    };
    // Outside the maintenance windows only an urgent restart starts: one whose certificates
    // end within `degraded_before_days` (waiting longer risks the end itself).
    let gate = crate::domain::maintenance::Windows::new(&cx.spec.maintenance).allows(now);
    if end - now > cx.spec.certificates.degraded_before() && !gate.is_allowed() {
        p.findings.push(Finding {
            degraded: false,
            message: format!(
                "{}'s certificates end at {end}: its restart to renew them waits for {}",
                m.instance.name,
                gate.describe_wait()
            ),
        });
        return;
    }
    if let Some(action) = move_api_address_first(cx.spec, cx.observed, cx.members, m) {
        // The API floating IP leaves a server before its restart, so the API stays
        // reachable at its address; the restart follows in a later run.
        p.actions.push(action);
        return;
    }
    if let Some(node) = m.node {
        let why = format!(
            "its certificates end at {end}, within certificates.renew_before_days = {}: k3s renews them on a start",
            cx.spec.certificates.renew_before_days
        );
        p.actions.push(restart_action(
            cx.spec, m, &node.name, now, cx.members, &why,
        ));
    }
}

/// When `m` holds the API floating IP and another server is Ready: move the address there.
fn move_api_address_first(
    spec: &ClusterSpec,
    observed: &Observed,
    members: &[Member],
    m: &Member,
) -> Option<Action> {
    let fip = observed.api_floating_ip.as_ref()?;
    if fip.instance_id != Some(m.instance.id) {
        return None;
    }
    let to = members
        .iter()
        .filter(|o| {
            o.pool == spec.control_plane.name
                && o.instance.id != m.instance.id
                && o.health == Health::Ready
        })
        .min_by_key(|o| (o.instance.time_created, o.instance.name.clone()))?;
    Some(Action::AttachApiFloatingIp {
        fip: fip.name.clone(),
        to: to.instance.name.clone(),
        from: Some(m.instance.name.clone()),
        stop_from: false,
        reason: format!(
            "the API floating IP moves off {} before its restart for certificates",
            m.instance.name
        ),
    })
}

/// Restart `m` (asked for at `since`): drain a worker first when another node can take its
/// pods; never a server (its restart is short, and a drained single server could leave the
/// next run's Job nowhere to go).
fn restart_action(
    spec: &ClusterSpec,
    m: &Member,
    node: &str,
    since: DateTime<Utc>,
    members: &[Member],
    why: &str,
) -> Action {
    let is_server = spec
        .pool(&m.pool)
        .is_some_and(|(role, _)| role == Role::ControlPlane);
    // Another Ready node that takes pods (not cordoned, not tainted NoSchedule/NoExecute as
    // dedicated servers are): else a drain would only leave the pods, and the next run's Job,
    // Pending.
    let others_schedulable = members.iter().any(|o| {
        o.instance.name != m.instance.name
            && o.health == Health::Ready
            && o.node.is_some_and(|n| {
                !n.unschedulable
                    && !n.taints.iter().any(|t| {
                        matches!(t.effect, TaintEffect::NoSchedule | TaintEffect::NoExecute)
                    })
            })
    });
    let other_server_ready = members.iter().any(|o| {
        o.instance.name != m.instance.name
            && o.pool == spec.control_plane.name
            && o.health == Health::Ready
    });
    Action::RestartForCertificates {
        pool: m.pool.clone(),
        name: m.instance.name.clone(),
        node: node.to_owned(),
        drain: !is_server && others_schedulable,
        after_run: is_server && !other_server_ready,
        since,
        reason: why.to_owned(),
    }
}
