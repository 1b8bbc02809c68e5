//! Planner table tests: one test per rule, each built from a small observed world.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use chrono::{DateTime, Duration, TimeZone, Utc};
use uuid::Uuid;

use super::*;
use crate::base::size::ByteSize;
use crate::domain::model::{
    DELETE_ME_ANNOTATION, Disk, DiskState, FloatingIp, Image, Instance, InstanceState, Node,
    NodeReadiness,
};
use crate::domain::spec::ClusterSpec;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0)
        .single()
        .unwrap_or_default()
}

fn spec(cp: u32, workers: u32) -> ClusterSpec {
    ClusterSpec::new("demo", "demo", "ubuntu", cp, workers)
}

/// A little world builder.
struct World {
    spec: ClusterSpec,
    obs: Observed,
    n: u128,
}

impl World {
    fn new(cp: u32, workers: u32) -> World {
        let spec = spec(cp, workers);
        let mut images = BTreeMap::new();
        images.insert(
            "ubuntu".to_owned(),
            Some(Image {
                id: Uuid::from_u128(999),
                name: "ubuntu".into(),
                description: String::new(),
                size: ByteSize::gib(3),
                block_size: 512,
                silo_scoped: true,
            }),
        );
        World {
            spec,
            obs: Observed {
                images,
                ..Default::default()
            },
            n: 0,
        }
    }

    /// Adds an instance of `pool` named `<cluster>-<pool>-<suffix>`, created `age_s` ago.
    fn inst(&mut self, pool: &str, suffix: &str, state: InstanceState, age_s: i64) -> Uuid {
        self.n += 1;
        let id = Uuid::from_u128(self.n);
        let (role, p) = self
            .spec
            .pool(pool)
            .map(|(r, p)| (r, p.clone()))
            .unwrap_or((Role::Worker, self.spec.worker_pools[0].clone()));
        let hash = self.spec.pool_hash(role, &p);
        let name = names::instance_name("demo", pool, suffix);
        // Its boot disk, attached (a member's boot disk exists while its instance does).
        self.obs.disks.push(Disk {
            id: Uuid::from_u128(100_000 + self.n),
            name: names::boot_disk_name(&name),
            description: String::new(),
            state: DiskState::Attached(id),
            size: ByteSize::gib(20),
            time_created: now() - Duration::seconds(age_s),
            image_id: None,
        });
        self.obs.instances.push(Instance {
            id,
            name: name.clone(),
            description: InstanceTag {
                cluster: "demo".into(),
                pool: pool.into(),
                spec_hash: hash,
            }
            .to_string(),
            hostname: name,
            state,
            ncpus: 2,
            memory: ByteSize::gib(4),
            time_created: now() - Duration::seconds(age_s),
            time_state_updated: now() - Duration::seconds(age_s),
        });
        id
    }

    fn node(&mut self, name: &str, readiness: NodeReadiness, server: bool) -> &mut Node {
        let mut labels = BTreeMap::new();
        if server {
            labels.insert(CONTROL_PLANE_LABEL.to_owned(), "true".to_owned());
        }
        self.obs.nodes.push(Node {
            name: name.to_owned(),
            provider_id: None,
            labels,
            annotations: BTreeMap::new(),
            readiness,
            unschedulable: false,
            created: now() - Duration::hours(1),
            taints: Vec::new(),
            allocatable: Default::default(),
            kubelet_version: None,
            deleting_since: None,
        });
        self.obs.nodes.last_mut().unwrap_or_else(|| unreachable!())
    }

    /// A Running, Ready member.
    fn ready(&mut self, pool: &str, suffix: &str, age_s: i64) -> Uuid {
        let id = self.inst(pool, suffix, InstanceState::Running, age_s);
        let server = pool == "control-plane";
        self.node(
            &names::instance_name("demo", pool, suffix),
            NodeReadiness::Ready,
            server,
        );
        id
    }

    fn fip_on(&mut self, holder: Option<Uuid>) {
        self.obs.api_floating_ip = Some(FloatingIp {
            id: Uuid::from_u128(7777),
            name: "demo-apiserver".into(),
            description: String::new(),
            ip: IpAddr::V4(Ipv4Addr::new(127, 100, 0, 1)),
            instance_id: holder,
        });
    }

    /// 3 Ready servers (fip on the first) and `w` Ready workers.
    fn healthy(cp: u32, workers: u32, w: u32) -> World {
        let mut world = World::new(cp, workers);
        let mut first = None;
        for i in 0..cp {
            let id = world.ready("control-plane", &format!("cp00{i}"), 3600 - i as i64);
            first.get_or_insert(id);
        }
        for i in 0..w {
            world.ready("workers", &format!("wk00{i}"), 3000 - i as i64);
        }
        world.fip_on(first);
        world
    }

    fn plan(&self) -> Plan {
        let suffixes: Vec<String> = (0..50).map(|i| format!("new{i:02}")).collect();
        plan(&self.spec, &self.obs, now(), &suffixes)
    }
}

fn creates(p: &Plan, pool: &str) -> usize {
    p.actions
        .iter()
        .filter(|a| matches!(a, Action::CreateMember { pool: q, .. } if q == pool))
        .count()
}

fn removed(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::RemoveMember { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn converged_cluster_plans_nothing() {
    let w = World::healthy(3, 2, 2);
    let p = w.plan();
    assert_eq!(p.actions, vec![]);
    assert!(p.is_converged(), "{p:?}");
    assert!(!p.is_degraded());
}

#[test]
fn scale_up_creates_the_shortfall_with_reasons() {
    let mut w = World::healthy(3, 5, 2);
    w.spec.worker_pools[0].count = 5;
    let p = w.plan();
    assert_eq!(creates(&p, "workers"), 3);
    for a in &p.actions {
        assert!(a.reason().contains("2 of 5"), "{a:?}");
    }
    let names: Vec<&str> = p.actions.iter().map(Action::target).collect();
    assert_eq!(
        names,
        [
            "demo-workers-new00",
            "demo-workers-new01",
            "demo-workers-new02"
        ]
    );
}

#[test]
fn new_names_skip_existing_ones() {
    let mut w = World::healthy(3, 3, 2);
    w.ready("workers", "new00", 10);
    w.spec.worker_pools[0].count = 4;
    let p = w.plan();
    assert_eq!(
        p.actions.iter().map(Action::target).collect::<Vec<_>>(),
        ["demo-workers-new01"]
    );
}

#[test]
fn joining_members_count_towards_capacity() {
    let mut w = World::healthy(3, 3, 2);
    w.inst("workers", "jn001", InstanceState::Starting, 30);
    assert_eq!(w.plan().actions, vec![]);
}

#[test]
fn scale_down_victims_in_order_delete_me_never_joined_not_ready_newest() {
    let mut w = World::healthy(3, 1, 0);
    w.ready("workers", "old01", 5000);
    w.ready("workers", "new01", 100);
    w.ready("workers", "mark1", 4000);
    w.node_annot("demo-workers-mark1");
    w.inst("workers", "nojn1", InstanceState::Running, 60);
    let nr = w.inst("workers", "nrdy1", InstanceState::Running, 4500);
    let _ = nr;
    w.node(
        "demo-workers-nrdy1",
        NodeReadiness::NotReady {
            since: now() - Duration::seconds(10),
        },
        false,
    );
    // 5 members, desired 1: remove 4 in order.
    let p = w.plan();
    assert_eq!(
        removed(&p),
        [
            "demo-workers-mark1",
            "demo-workers-nojn1",
            "demo-workers-nrdy1",
            "demo-workers-new01"
        ]
    );
    // Ready victims get drained; a member without a Ready Node does not.
    for a in &p.actions {
        if let Action::RemoveMember { name, drain, .. } = a {
            assert_eq!(
                *drain,
                name.ends_with("mark1") || name.ends_with("new01"),
                "{a:?}"
            );
        }
    }
}

impl World {
    fn node_annot(&mut self, name: &str) {
        if let Some(n) = self.obs.nodes.iter_mut().find(|n| n.name == name) {
            n.annotations
                .insert(DELETE_ME_ANNOTATION.to_owned(), "true".to_owned());
        }
    }
    fn mark_removing(&mut self, name: &str) {
        if let Some(n) = self.obs.nodes.iter_mut().find(|n| n.name == name) {
            n.annotations
                .insert(REMOVING_ANNOTATION.to_owned(), "scale-down".to_owned());
            n.unschedulable = true;
        }
    }
    fn set_state(&mut self, name: &str, state: InstanceState) {
        if let Some(i) = self.obs.instances.iter_mut().find(|i| i.name == name) {
            i.state = state;
        }
    }
    /// Its instance entered `state` `secs` ago.
    fn set_state_since(&mut self, name: &str, state: InstanceState, secs: i64) {
        if let Some(i) = self.obs.instances.iter_mut().find(|i| i.name == name) {
            i.state = state;
            i.time_state_updated = now() - Duration::seconds(secs);
        }
    }
    /// Its Node says we started its instance again `secs` ago.
    fn restarted(&mut self, name: &str, secs: i64) {
        if let Some(n) = self.obs.nodes.iter_mut().find(|n| n.name == name) {
            n.annotations.insert(
                RESTARTED_ANNOTATION.to_owned(),
                (now() - Duration::seconds(secs)).to_rfc3339(),
            );
        }
    }
    fn set_not_ready(&mut self, name: &str, secs: i64) {
        if let Some(n) = self.obs.nodes.iter_mut().find(|n| n.name == name) {
            n.readiness = NodeReadiness::NotReady {
                since: now() - Duration::seconds(secs),
            };
        }
    }
}

#[test]
fn failed_worker_is_replaced_and_removed() {
    let mut w = World::healthy(3, 2, 2);
    w.set_state("demo-workers-wk000", InstanceState::Failed);
    w.set_not_ready("demo-workers-wk000", 5);
    let p = w.plan();
    assert_eq!(creates(&p, "workers"), 1);
    assert_eq!(removed(&p), ["demo-workers-wk000"]);
    assert!(p.actions.iter().any(|a| a.reason().contains("failed")));
}

#[test]
fn join_timeout_replaces_a_member_that_never_joined() {
    let mut w = World::healthy(3, 2, 1);
    w.inst("workers", "slow1", InstanceState::Running, 601);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-slow1"]);
    assert_eq!(creates(&p, "workers"), 1);
    assert!(p.actions.iter().any(|a| {
        a.reason()
            .contains("did not become a Ready Node within 600s")
    }));
    // Within the deadline it is just joining.
    let mut w = World::healthy(3, 2, 1);
    w.inst("workers", "slow1", InstanceState::Running, 599);
    assert_eq!(w.plan().actions, vec![]);
}

#[test]
fn not_ready_past_grace_is_replaced_but_not_within_it() {
    let mut w = World::healthy(3, 2, 2);
    w.set_not_ready("demo-workers-wk001", 200);
    assert_eq!(w.plan().actions, vec![], "within grace: wait");
    w.set_not_ready("demo-workers-wk001", 301);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-wk001"]);
    assert_eq!(creates(&p, "workers"), 1);
}

#[test]
fn pool_never_exceeds_desired_plus_one_instances() {
    // Two failed of three: one replacement now (3 existing + 1 = desired + 1), one next run.
    let mut w = World::healthy(3, 3, 3);
    w.set_state("demo-workers-wk000", InstanceState::Failed);
    w.set_state("demo-workers-wk001", InstanceState::Failed);
    let p = w.plan();
    assert_eq!(creates(&p, "workers"), 1);
    assert_eq!(removed(&p).len(), 2);
}

#[test]
fn removals_in_progress_continue() {
    let mut w = World::healthy(3, 2, 3);
    w.mark_removing("demo-workers-wk002");
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-wk002"]);
    assert_eq!(creates(&p, "workers"), 0);
    // A stopped instance without a Node is a removal that got past the Node deletion.
    let mut w = World::healthy(3, 2, 2);
    w.inst("workers", "gone1", InstanceState::Stopped, 900);
    assert_eq!(removed(&w.plan()), ["demo-workers-gone1"]);
}

#[test]
fn an_autoscaler_removal_given_up_is_called_off_while_its_vm_runs() {
    let mut w = World::healthy(3, 2, 3);
    w.mark_removing("demo-workers-wk002");
    w.obs
        .autoscale_given_up
        .insert("demo-workers-wk002".to_owned());
    let p = w.plan();
    assert!(removed(&p).is_empty(), "{:?}", p.actions);
    assert!(
        p.actions.iter().any(|a| matches!(a,
            Action::CancelRemoval { node, .. } if node == "demo-workers-wk002")),
        "{:?}",
        p.actions
    );
    assert_eq!(creates(&p, "workers"), 0);
    // Past the drain (the VM stopping), the removal finishes whatever the autoscaler says.
    w.set_state("demo-workers-wk002", InstanceState::Stopping);
    assert_eq!(removed(&w.plan()), ["demo-workers-wk002"]);
}

#[test]
fn a_member_stopped_by_someone_else_is_started() {
    let mut w = World::healthy(3, 2, 2);
    w.set_state("demo-workers-wk001", InstanceState::Stopped);
    w.set_not_ready("demo-workers-wk001", 30);
    let p = w.plan();
    assert!(
        matches!(&p.actions[..], [Action::StartMember { name, .. }] if name == "demo-workers-wk001"),
        "{p:?}"
    );
}

#[test]
fn drift_rolls_one_member_at_a_time_surge_first() {
    let mut w = World::healthy(3, 2, 2);
    w.spec.worker_pools[0].cpus = 4;
    let p = w.plan();
    assert_eq!(creates(&p, "workers"), 1, "{p:?}");
    assert!(removed(&p).is_empty());
    assert!(p.actions[0].reason().contains("rolling"));
    // The surge member is joining: nothing is removed yet.
    let mut w2 = World::healthy(3, 2, 2);
    w2.spec.worker_pools[0].cpus = 4;
    w2.inst("workers", "srg01", InstanceState::Running, 20);
    let p = w2.plan();
    assert_eq!(p.actions, vec![], "{p:?}");
    // Once it is Ready, exactly one drifted member goes.
    let mut w3 = World::healthy(3, 2, 2);
    w3.spec.worker_pools[0].cpus = 4;
    w3.ready("workers", "srg01", 20);
    let p = w3.plan();
    let r = removed(&p);
    assert_eq!(r.len(), 1, "{p:?}");
    assert!(r[0].contains("wk00"), "{r:?}");
    assert_eq!(creates(&p, "workers"), 0);
}

#[test]
fn control_plane_replaces_a_failed_member_removing_first_one_at_a_time() {
    let mut w = World::healthy(3, 2, 2);
    // Failed again after the start we made 60 s ago.
    w.set_state_since("demo-control-plane-cp002", InstanceState::Failed, 10);
    w.set_not_ready("demo-control-plane-cp002", 120);
    w.restarted("demo-control-plane-cp002", 60);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-control-plane-cp002"]);
    assert_eq!(
        creates(&p, "control-plane"),
        0,
        "replacement comes after the removal"
    );
    // Next run: the dead member is gone; one replacement.
    let mut w = World::healthy(3, 2, 2);
    w.obs
        .instances
        .retain(|i| i.name != "demo-control-plane-cp002");
    w.obs.nodes.retain(|n| n.name != "demo-control-plane-cp002");
    let p = w.plan();
    assert_eq!(creates(&p, "control-plane"), 1);
}

#[test]
fn control_plane_grows_one_member_at_a_time() {
    let mut w = World::healthy(1, 2, 2);
    w.spec.control_plane.count = 3;
    assert_eq!(creates(&w.plan(), "control-plane"), 1);
    w.inst("control-plane", "jn001", InstanceState::Running, 10);
    assert_eq!(
        creates(&w.plan(), "control-plane"),
        0,
        "wait for the joining member"
    );
}

#[test]
fn control_plane_is_left_alone_without_quorum() {
    let mut w = World::healthy(3, 2, 2);
    w.set_state("demo-control-plane-cp001", InstanceState::Failed);
    w.set_state("demo-control-plane-cp002", InstanceState::Failed);
    w.set_not_ready("demo-control-plane-cp001", 900);
    w.set_not_ready("demo-control-plane-cp002", 900);
    let p = w.plan();
    assert!(
        removed(&p).iter().all(|n| !n.contains("control-plane")),
        "{p:?}"
    );
    assert_eq!(creates(&p, "control-plane"), 0);
    assert!(p.is_degraded());
    assert!(p.findings.iter().any(|f| f.message.contains("quorum")));
    // Their disks are intact: both are started again.
    assert_eq!(
        started(&p),
        ["demo-control-plane-cp001", "demo-control-plane-cp002"],
        "{p:?}"
    );
}

/// Issue 32 item 3: a server that failed (a sled fault) or was stopped, whose Node is there
/// and whose boot disk exists, is started again — its Node marked first — and not removed
/// or replaced; nothing else changes in the control plane meanwhile.
#[test]
fn a_failed_or_stopped_server_with_its_disk_is_started_once_not_replaced() {
    for state in [InstanceState::Failed, InstanceState::Stopped] {
        let mut w = World::healthy(3, 2, 2);
        w.set_state_since("demo-control-plane-cp002", state.clone(), 30);
        w.set_not_ready("demo-control-plane-cp002", 20);
        let p = w.plan();
        assert_eq!(
            started(&p),
            ["demo-control-plane-cp002"],
            "{state:?}: {p:?}"
        );
        assert!(removed(&p).is_empty(), "{state:?}: {p:?}");
        assert_eq!(creates(&p, "control-plane"), 0, "{state:?}: {p:?}");
        let marked = p.actions.iter().any(|a| {
            matches!(a, Action::StartMember { mark_node: Some(n), reason, .. }
                if n == "demo-control-plane-cp002" && reason.contains("once"))
        });
        assert!(marked, "the start is recorded on the Node: {p:?}");
        assert!(!p.is_converged());
    }
}

/// After our start: rejoining within the join deadline is waited for; the start is made again
/// (unmarked) while it has not taken; going down again after it took, or not being back by
/// the deadline, replaces it (removal first); a start older than the deadline after which it
/// came back and failed again is a new outage: started again.
#[test]
fn a_restarted_server_gets_one_join_deadline_then_is_replaced() {
    let cp = "demo-control-plane-cp002";
    let join = 600;
    // Started 100 s ago, running since 90 s, Node still NotReady since the fault: rejoining.
    let mut w = World::healthy(3, 2, 2);
    w.set_state_since(cp, InstanceState::Running, 90);
    w.set_not_ready(cp, 400);
    w.restarted(cp, 100);
    let p = w.plan();
    assert_eq!(p.actions, vec![], "waits for the rejoin: {p:?}");
    // The same past the deadline from its start: replaced (removed first).
    w.set_state_since(cp, InstanceState::Running, join + 10);
    w.restarted(cp, join + 20);
    assert_eq!(removed(&w.plan()), [cp]);
    // The start was refused (still failed since before it), within the deadline: again.
    let mut w = World::healthy(3, 2, 2);
    w.set_state_since(cp, InstanceState::Failed, 300);
    w.set_not_ready(cp, 300);
    w.restarted(cp, 100);
    let p = w.plan();
    assert_eq!(started(&p), [cp], "{p:?}");
    assert!(
        p.actions.iter().all(|a| !matches!(
            a,
            Action::StartMember {
                mark_node: Some(_),
                ..
            }
        )),
        "not marked again: the mark is the first start's time: {p:?}"
    );
    // ... and past the deadline, still failed since before that start: it did not come
    // back, replaced.
    w.set_state_since(cp, InstanceState::Failed, join + 50);
    w.restarted(cp, join + 1);
    let p = w.plan();
    assert_eq!(removed(&p), [cp], "{p:?}");
    assert!(
        p.actions
            .iter()
            .any(|a| a.reason().contains("not a Ready Node"))
    );
    // Failed again after the start took: replaced, not started a second time.
    let mut w = World::healthy(3, 2, 2);
    w.set_state_since(cp, InstanceState::Failed, 10);
    w.set_not_ready(cp, 300);
    w.restarted(cp, 100);
    let p = w.plan();
    assert_eq!(removed(&p), [cp], "{p:?}");
    assert!(started(&p).is_empty(), "{p:?}");
    assert!(
        p.actions
            .iter()
            .any(|a| a.reason().contains("again after it was started again"))
    );
    // A start older than the deadline, after which it came back and failed again: a new
    // outage, started (and marked) again.
    w.restarted(cp, join + 100);
    let p = w.plan();
    assert_eq!(started(&p), [cp], "{p:?}");
    assert!(removed(&p).is_empty(), "{p:?}");
}

/// Without its boot disk (gone or faulted) there is nothing to start: replaced as before.
#[test]
fn a_failed_server_without_a_usable_boot_disk_is_replaced() {
    let cp = "demo-control-plane-cp002";
    for faulted in [true, false] {
        let mut w = World::healthy(3, 2, 2);
        w.set_state_since(cp, InstanceState::Failed, 30);
        let boot = names::boot_disk_name(cp);
        if faulted {
            if let Some(d) = w.obs.disks.iter_mut().find(|d| d.name == boot) {
                d.state = DiskState::Faulted;
            }
        } else {
            w.obs.disks.retain(|d| d.name != boot);
        }
        let p = w.plan();
        assert_eq!(removed(&p), [cp], "{p:?}");
        assert!(started(&p).is_empty(), "{p:?}");
        assert!(p.actions.iter().any(|a| a.reason().contains("boot disk")));
    }
}

/// Workers are not started again: a failed worker is replaced at once, as before.
#[test]
fn a_failed_worker_is_still_replaced_not_started() {
    let mut w = World::healthy(3, 2, 2);
    w.set_state_since("demo-workers-wk000", InstanceState::Failed, 30);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-wk000"]);
    assert!(started(&p).is_empty());
}

#[test]
fn control_plane_scale_down_spares_the_floating_ip_holder() {
    let mut w = World::healthy(5, 2, 2);
    w.spec.control_plane.count = 3;
    // The holder is cp000, the oldest; make it also the newest to tempt the victim order.
    if let Some(i) = w
        .obs
        .instances
        .iter_mut()
        .find(|i| i.name == "demo-control-plane-cp000")
    {
        i.time_created = now();
    }
    let r = removed(&w.plan());
    assert_eq!(r.len(), 1, "one at a time");
    assert_ne!(r[0], "demo-control-plane-cp000");
}

#[test]
fn floating_ip_moves_off_a_dead_holder_to_the_oldest_ready_server() {
    let mut w = World::healthy(3, 2, 2);
    w.set_state("demo-control-plane-cp000", InstanceState::Failed);
    w.set_not_ready("demo-control-plane-cp000", 5);
    let p = w.plan();
    let attach = p.actions.iter().find_map(|a| match a {
        Action::AttachApiFloatingIp {
            to,
            from,
            stop_from,
            ..
        } => Some((to.clone(), from.clone(), *stop_from)),
        _ => None,
    });
    // A failed holder is stopped first: nexus refuses to detach from it.
    assert_eq!(
        attach,
        Some((
            "demo-control-plane-cp001".to_owned(),
            Some("demo-control-plane-cp000".to_owned()),
            true
        ))
    );
    // Attach comes before anything that could remove the old holder.
    assert!(
        matches!(p.actions[0], Action::AttachApiFloatingIp { .. }),
        "{p:?}"
    );
}

/// A control-plane roll removes every drifted server, the holder too, and a removal stops the
/// VM: the API address moves to an up-to-date Ready server as soon as one exists, before the
/// holder's turn (issue 33: otherwise the API is unreachable on its address mid-roll).
#[test]
fn floating_ip_moves_off_a_drifted_holder_once_a_new_server_is_ready() {
    let mut w = World::healthy(3, 2, 2);
    w.spec.control_plane.cpus = 4;
    // Drifted, no new server Ready yet: the address stays.
    let p = w.plan();
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::AttachApiFloatingIp { .. })),
        "{p:?}"
    );
    w.ready("control-plane", "srg01", 20);
    let p = w.plan();
    let attach = p.actions.iter().find_map(|a| match a {
        Action::AttachApiFloatingIp {
            to, from, reason, ..
        } => Some((to.clone(), from.clone(), reason.clone())),
        _ => None,
    });
    assert_eq!(
        attach.as_ref().map(|a| (a.0.as_str(), a.1.as_deref())),
        Some(("demo-control-plane-srg01", Some("demo-control-plane-cp000"))),
        "{p:?}"
    );
    assert!(attach.is_some_and(|a| a.2.contains("drifted")));
}

#[test]
fn missing_floating_ip_is_created_and_blocks_creates_until_it_exists() {
    let mut w = World::healthy(3, 3, 2);
    w.obs.api_floating_ip = None;
    let p = w.plan();
    assert!(matches!(
        &p.actions[0],
        Action::CreateApiFloatingIp { description, .. }
            if *description == names::api_floating_ip_description(&w.spec.cluster)
    ));
    assert_eq!(creates(&p, "workers"), 0);
}

#[test]
fn missing_image_blocks_creates_and_degrades() {
    let mut w = World::healthy(3, 3, 2);
    w.obs.images.insert("ubuntu".into(), None);
    let p = w.plan();
    assert_eq!(creates(&p, "workers"), 0);
    assert!(p.is_degraded());
    assert!(p.findings.iter().any(|f| f.message.contains("\"ubuntu\"")));
}

#[test]
fn orphan_nodes_and_disks_are_cleaned_up_but_foreign_ones_are_not() {
    let mut w = World::healthy(3, 2, 2);
    w.node(
        "demo-workers-zzzzz",
        NodeReadiness::NotReady { since: now() },
        false,
    );
    w.node("someone-elses-node", NodeReadiness::Ready, false);
    let disk = |name: &str, state: DiskState| Disk {
        id: Uuid::new_v4(),
        name: name.into(),
        description: String::new(),
        state,
        size: ByteSize::gib(20),
        time_created: now(),
        image_id: None,
    };
    w.obs
        .disks
        .push(disk("boot-demo-workers-zzzzz", DiskState::Detached));
    w.obs
        .disks
        .push(disk("data-demo-workers-yyyyy", DiskState::Detached));
    w.obs.disks.push(disk(
        "boot-demo-workers-wk000",
        DiskState::Attached(Uuid::nil()),
    ));
    w.obs.disks.push(disk("boot-other-vm", DiskState::Detached));
    w.obs.disks.push(disk(
        "boot-demo-workers-xxxxx",
        DiskState::Busy("creating".into()),
    ));
    let p = w.plan();
    let targets: Vec<(&str, &str)> = p.actions.iter().map(|a| (a.verb(), a.target())).collect();
    assert_eq!(
        targets,
        [
            ("delete-node", "demo-workers-zzzzz"),
            ("delete-disk", "boot-demo-workers-zzzzz"),
            ("delete-disk", "data-demo-workers-yyyyy")
        ]
    );
}

#[test]
fn members_of_removed_pools_go_but_servers_never_do() {
    let mut w = World::healthy(3, 2, 2);
    w.ready("gpu", "gpu01", 100);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-gpu-gpu01"]);
    let mut w = World::healthy(3, 2, 2);
    w.spec.control_plane.name = "cp".into();
    let p = w.plan();
    assert!(removed(&p).is_empty(), "{p:?}");
    assert!(p.is_degraded());
}

#[test]
fn instances_of_other_clusters_or_untagged_are_ignored() {
    let mut w = World::healthy(3, 2, 2);
    w.inst("workers", "mine1", InstanceState::Running, 10);
    if let Some(i) = w.obs.instances.last_mut() {
        i.description = "a VM someone made by hand".into();
    }
    assert_eq!(w.plan().actions, vec![]);
}

#[test]
fn plan_is_deterministic_and_serializes() {
    let mut w = World::healthy(3, 5, 2);
    w.spec.worker_pools[0].count = 5;
    let a = w.plan();
    assert_eq!(a, w.plan());
    let json = serde_json::to_value(&a).unwrap_or_default();
    assert_eq!(json["actions"][0]["action"], "create_member");
}

fn started(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::StartMember { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// A create that came back `stopped` (full rack, silo quota) is started again — once per
/// run — and neither replaced nor deleted: that would only churn on a full rack.
#[test]
fn a_member_the_rack_never_started_is_started_not_replaced_or_deleted() {
    // (desired workers, Ready workers, never-started workers) -> (starts, creates, removals)
    for (desired, ready, stopped, want) in [
        (3, 1, 2, (2, 0, 0)),
        (3, 0, 3, (3, 0, 0)),
        (2, 2, 1, (0, 0, 1)),
        (2, 1, 2, (1, 0, 1)),
    ] {
        let mut w = World::healthy(3, desired, ready);
        for i in 0..stopped {
            w.inst(
                "workers",
                &format!("full{i}"),
                InstanceState::Stopped,
                60 + i64::from(i),
            );
        }
        let p = w.plan();
        let got = (started(&p).len(), creates(&p, "workers"), removed(&p).len());
        assert_eq!(
            got, want,
            "desired {desired}, ready {ready}, stopped {stopped}: {p:?}"
        );
        assert!(
            started(&p)
                .iter()
                .chain(removed(&p).iter())
                .all(|n| n.contains("-full")),
            "{p:?}"
        );
        assert!(!p.is_converged());
    }
}

#[test]
fn a_control_plane_member_the_rack_never_started_is_started_and_blocks_other_changes() {
    let mut w = World::healthy(3, 2, 2);
    w.spec.control_plane.count = 5;
    w.inst("control-plane", "full0", InstanceState::Stopped, 60);
    let p = w.plan();
    assert_eq!(started(&p), ["demo-control-plane-full0"], "{p:?}");
    assert_eq!(creates(&p, "control-plane"), 0, "{p:?}");
    assert!(removed(&p).is_empty(), "{p:?}");
}

/// Past the join deadline a stopped member without a Node may be a removal that was cut
/// short after its stop; starting it again would loop, so the removal is finished.
#[test]
fn a_stopped_member_without_a_node_past_the_join_deadline_is_removed() {
    let mut w = World::healthy(3, 2, 1);
    let old = w.spec.timeouts.join_seconds as i64 + 60;
    w.inst("workers", "gone1", InstanceState::Stopped, old);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-gone1"], "{p:?}");
    assert!(started(&p).is_empty(), "{p:?}");
}

#[test]
fn a_member_whose_console_says_its_setup_failed_is_replaced_before_the_join_deadline() {
    let failure = crate::domain::model::SetupFailure {
        step: "data-disk".into(),
        reason: "no NVMe disk with serial data-demo-workers-ba".into(),
    };
    let mut w = World::healthy(3, 2, 1);
    w.inst("workers", "bad01", InstanceState::Running, 60);
    w.obs
        .setup_failures
        .insert("demo-workers-bad01".into(), failure.clone());
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-bad01"]);
    assert_eq!(creates(&p, "workers"), 1);
    assert!(
        p.actions.iter().any(|a| a.reason().contains(
            "node setup failed at data-disk: no NVMe disk with serial data-demo-workers-ba"
        )),
        "{:?}",
        p.actions
    );
    // A control-plane member too, when quorum allows.
    let mut w = World::healthy(3, 2, 2);
    w.inst("control-plane", "bad02", InstanceState::Running, 60);
    w.obs
        .setup_failures
        .insert("demo-control-plane-bad02".into(), failure);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-control-plane-bad02"], "{:?}", p.actions);
    // Without the marker the same member is only joining.
    let mut w = World::healthy(3, 2, 1);
    w.inst("workers", "bad01", InstanceState::Running, 60);
    assert_eq!(w.plan().actions, vec![]);
}

/// A pool whose creates the rack refused (`failures` in a row, the last `ago_s` ago).
fn refused(w: &mut World, failures: u32, ago_s: i64) {
    let (role, pool) = w
        .spec
        .pool("workers")
        .map(|(r, p)| (r, p.clone()))
        .unwrap_or_else(|| unreachable!());
    w.obs.create_backoff.insert(
        "workers".into(),
        backoff::CreateBackoff {
            cause: backoff::BlockCause::SubnetFull,
            message: "No available IPv4 addresses for interface in subnet 'default'".into(),
            since: now() - Duration::hours(1),
            last_attempt: now() - Duration::seconds(ago_s),
            failures,
            spec_hash: w.spec.pool_hash(role, &pool),
            member: None,
        },
    );
}

#[test]
fn a_refused_pool_sends_one_probe_once_its_delay_has_passed() {
    // Default base 60 s: after 3 refusals the next probe waits 240 s.
    let mut w = World::healthy(3, 10, 2);
    refused(&mut w, 3, 200);
    let p = w.plan();
    assert_eq!(creates(&p, "workers"), 0, "{p:?}");
    let f = p
        .findings
        .iter()
        .find(|f| f.degraded)
        .expect("a degraded finding");
    assert!(
        f.message.contains("VPC subnet has no free address")
            && f.message
                .contains("free addresses in the project's VPC subnet")
            && f.message.contains("next try after 2026-11-21T12:00:40Z"),
        "{f:?}"
    );
    assert!(
        p.create_backoff.contains_key("workers"),
        "the block is carried"
    );

    refused(&mut w, 3, 240);
    let p = w.plan();
    assert_eq!(
        creates(&p, "workers"),
        1,
        "one probe, not the shortfall of 8"
    );
    assert!(
        p.actions[0].reason().contains("one probe"),
        "{:?}",
        p.actions[0]
    );
    assert!(
        p.findings
            .iter()
            .any(|f| f.message.contains("trying one create this run"))
    );
}

#[test]
fn a_changed_pool_spec_or_a_pool_that_needs_no_member_drops_the_block() {
    let mut w = World::healthy(3, 10, 2);
    refused(&mut w, 5, 10);
    w.spec.worker_pools[0].memory = ByteSize::gib(2);
    let p = w.plan();
    assert_eq!(
        creates(&p, "workers"),
        8,
        "smaller members: try them all again"
    );
    assert!(p.create_backoff.is_empty() && !p.is_degraded(), "{p:?}");

    let mut w = World::healthy(3, 2, 2);
    refused(&mut w, 5, 10);
    let p = w.plan();
    assert!(p.create_backoff.is_empty() && p.is_converged(), "{p:?}");
}

#[test]
fn a_new_member_never_takes_the_name_of_a_node_that_still_exists() {
    // A worker is missing; the first fresh name is that of a Node still being deleted (its
    // instance is gone, k3s's finalizers keep the Node).
    let mut w = World::healthy(3, 2, 1);
    w.node(
        &names::instance_name("demo", "workers", "new00"),
        NodeReadiness::NotReady { since: now() },
        false,
    );
    let p = w.plan();
    let created: Vec<&str> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateMember { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        created,
        [names::instance_name("demo", "workers", "new01")],
        "{p:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// etcd membership (issue 32 item 2): control-plane changes wait for etcd and the servers to
// agree.

fn member(name: &str, id: u64, learner: bool) -> EtcdMember {
    EtcdMember {
        id,
        name: name.to_owned(),
        peer_urls: vec![format!("https://172.30.0.{id}:2380")],
        client_urls: vec![format!("https://172.30.0.{id}:2379")],
        is_learner: learner,
    }
}

impl World {
    /// etcd lists one voter per server Node (k3s's own bookkeeping), plus `extra`.
    fn etcd_agrees(&mut self, extra: Vec<EtcdMember>) {
        let mut list: Vec<EtcdMember> = self
            .obs
            .nodes
            .iter()
            .filter(|n| n.labels.contains_key(CONTROL_PLANE_LABEL))
            .zip(1u64..)
            .map(|(n, i)| member(&format!("{}-0a1b2c{i:02x}", n.name), i, false))
            .collect();
        list.extend(extra);
        self.obs.etcd = EtcdMembership::Read(list);
    }
}

/// No create, no removal, no start of a never-started server in pool `control-plane`.
fn control_plane_untouched(p: &Plan) -> bool {
    !p.actions.iter().any(|a| match a {
        Action::CreateMember { pool, .. }
        | Action::RemoveMember { pool, .. }
        | Action::StartMember { pool, .. } => pool == "control-plane",
        _ => false,
    })
}

fn etcd_finding(p: &Plan) -> Option<&Finding> {
    p.findings.iter().find(|f| f.message.contains("etcd"))
}

/// The worlds in which a control-plane change is due (each plans one when etcd agrees).
fn changes_due() -> Vec<(&'static str, World)> {
    let mut grow = World::healthy(3, 2, 2);
    grow.obs
        .instances
        .retain(|i| i.name != "demo-control-plane-cp002");
    grow.obs
        .nodes
        .retain(|n| n.name != "demo-control-plane-cp002");
    let mut roll = World::healthy(3, 2, 2);
    roll.spec.control_plane.cpus = 8;
    let mut shrink_after_surge = World::healthy(3, 2, 2);
    shrink_after_surge.spec.control_plane.cpus = 8;
    shrink_after_surge.ready("control-plane", "srg01", 20);
    let mut replace = World::healthy(3, 2, 2);
    replace.set_state_since("demo-control-plane-cp002", InstanceState::Failed, 10);
    replace.set_not_ready("demo-control-plane-cp002", 120);
    replace.restarted("demo-control-plane-cp002", 60);
    let mut shrink = World::healthy(3, 2, 2);
    shrink.spec.control_plane.count = 1;
    vec![
        ("a missing server is created", grow),
        ("a roll makes its surge server", roll),
        ("a roll removes a drifted server", shrink_after_surge),
        ("a failed server is removed for its replacement", replace),
        ("a smaller control plane removes a server", shrink),
    ]
}

#[test]
fn every_control_plane_change_is_made_when_etcd_and_the_servers_agree() {
    for (what, mut w) in changes_due() {
        w.etcd_agrees(vec![]);
        let p = w.plan();
        assert!(!control_plane_untouched(&p), "{what}: {p:?}");
        assert!(etcd_finding(&p).is_none(), "{what}: {p:?}");
    }
}

#[test]
fn a_stale_member_holds_every_control_plane_change_and_is_named() {
    for (what, mut w) in changes_due() {
        w.etcd_agrees(vec![member("demo-control-plane-gone1-5e6f7a8b", 77, false)]);
        w.spec.worker_pools[0].count = 3;
        let p = w.plan();
        assert!(control_plane_untouched(&p), "{what}: {p:?}");
        let f = etcd_finding(&p).unwrap_or_else(|| panic!("{what}: no finding: {p:?}"));
        assert!(f.degraded, "{what}");
        assert!(
            f.message
                .contains("demo-control-plane-gone1-5e6f7a8b (ID 4d"),
            "{what}: {}",
            f.message
        );
        assert!(
            f.message.contains("etcdctl member remove 4d"),
            "{}",
            f.message
        );
        // Workers carry on.
        assert_eq!(creates(&p, "workers"), 1, "{what}: {p:?}");
    }
}

/// Audit day2-fidelity-4 P7: on a real k3s a server deleted by hand whose Node lacked the
/// etcd annotations keeps its Node Terminating (the member controller errs and keeps its
/// finalizer) and its member listed. The Terminating Node is no server: the member is named.
#[test]
fn a_member_beside_a_server_node_stuck_deleting_without_its_instance_is_named() {
    let mut w = World::healthy(3, 2, 2);
    w.spec.control_plane.cpus = 8;
    w.etcd_agrees(vec![]);
    w.obs
        .instances
        .retain(|i| i.name != "demo-control-plane-cp002");
    let since = now() - Duration::minutes(30);
    if let Some(n) = w
        .obs
        .nodes
        .iter_mut()
        .find(|n| n.name == "demo-control-plane-cp002")
    {
        n.deleting_since = Some(since);
    }
    let p = w.plan();
    assert!(control_plane_untouched(&p), "{p:?}");
    let f = etcd_finding(&p).unwrap_or_else(|| panic!("no finding: {p:?}"));
    assert!(f.degraded);
    assert!(
        f.message.contains("demo-control-plane-cp002-0a1b2c03")
            && f.message.contains(&format!(
                "outlives its server: Node demo-control-plane-cp002 has been deleting since {}",
                since.format("%Y-%m-%d %H:%M:%S UTC")
            ))
            && f.message.contains("etcdctl member remove 3"),
        "{}",
        f.message
    );
    // While its instance exists the removal is under way: no finding.
    let mut w = World::healthy(3, 2, 2);
    w.etcd_agrees(vec![]);
    if let Some(n) = w
        .obs
        .nodes
        .iter_mut()
        .find(|n| n.name == "demo-control-plane-cp002")
    {
        n.deleting_since = Some(since);
    }
    assert!(etcd_finding(&w.plan()).is_none());
}

#[test]
fn a_server_node_without_a_member_holds_control_plane_changes_and_is_named() {
    let mut w = World::healthy(3, 2, 2);
    w.spec.control_plane.cpus = 8;
    w.etcd_agrees(vec![]);
    if let EtcdMembership::Read(list) = &mut w.obs.etcd {
        list.retain(|m| !m.name.starts_with("demo-control-plane-cp001-"));
    }
    let p = w.plan();
    assert!(control_plane_untouched(&p), "{p:?}");
    let f = etcd_finding(&p).unwrap_or_else(|| panic!("{p:?}"));
    assert!(
        f.message
            .contains("server demo-control-plane-cp001 has no etcd member"),
        "{}",
        f.message
    );
    assert!(f.degraded);
}

#[test]
fn a_learner_holds_control_plane_changes_degraded_only_without_a_join() {
    // A learner and no server joining: stuck, degraded.
    let mut w = World::healthy(3, 2, 2);
    w.spec.control_plane.cpus = 8;
    w.etcd_agrees(vec![]);
    if let EtcdMembership::Read(list) = &mut w.obs.etcd {
        list[2].is_learner = true;
    }
    let p = w.plan();
    assert!(control_plane_untouched(&p), "{p:?}");
    let f = etcd_finding(&p).unwrap_or_else(|| panic!("{p:?}"));
    assert!(
        f.message.contains("learner") && f.message.contains("cp002"),
        "{}",
        f.message
    );
    assert!(f.degraded);
    // A server joining, its member an unnamed learner: that join, not degraded.
    let mut w = World::healthy(3, 2, 2);
    w.obs
        .instances
        .retain(|i| i.name != "demo-control-plane-cp002");
    w.obs.nodes.retain(|n| n.name != "demo-control-plane-cp002");
    w.inst("control-plane", "jn001", InstanceState::Running, 20);
    w.etcd_agrees(vec![member("", 9, true)]);
    let p = w.plan();
    assert!(control_plane_untouched(&p), "{p:?}");
    let f = etcd_finding(&p).unwrap_or_else(|| panic!("{p:?}"));
    assert!(
        f.message
            .contains("unstarted member at https://172.30.0.9:2380"),
        "{}",
        f.message
    );
    assert!(!f.degraded);
}

#[test]
fn an_unreadable_member_list_holds_control_plane_changes_and_says_so() {
    for (what, mut w) in changes_due() {
        w.obs.etcd = EtcdMembership::Unreadable("HTTP 500: failed to get etcd MemberList".into());
        w.spec.worker_pools[0].count = 3;
        let p = w.plan();
        assert!(control_plane_untouched(&p), "{what}: {p:?}");
        let f = etcd_finding(&p).unwrap_or_else(|| panic!("{what}: {p:?}"));
        assert!(f.degraded);
        assert!(
            f.message.contains("cannot read the etcd member list")
                && f.message.contains("failed to get etcd MemberList"),
            "{}",
            f.message
        );
        assert_eq!(creates(&p, "workers"), 1, "{what}: workers carry on");
    }
}

#[test]
fn a_removal_under_way_and_a_down_server_go_on_while_etcd_disagrees() {
    let mut w = World::healthy(3, 2, 2);
    if let Some(n) = w
        .obs
        .nodes
        .iter_mut()
        .find(|n| n.name == "demo-control-plane-cp001")
    {
        n.annotations
            .insert(REMOVING_ANNOTATION.to_owned(), "rolling".to_owned());
    }
    w.etcd_agrees(vec![member("demo-control-plane-gone1-5e6f7a8b", 77, false)]);
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-control-plane-cp001"], "{p:?}");
    assert!(etcd_finding(&p).is_some());
}

#[test]
fn members_are_matched_to_nodes_by_the_name_before_their_last_hyphen() {
    let m = member("demo-control-plane-cp000-1a2b3c4d", 1, false);
    assert_eq!(m.node_name(), Some("demo-control-plane-cp000"));
    assert_eq!(member("ab", 1, false).node_name(), Some("ab"));
    assert_eq!(member("a-b", 1, false).node_name(), Some("a-b"));
    assert_eq!(member("", 1, true).node_name(), None);
}

#[test]
fn etcd_members_match_is_the_planners_check() {
    let mut w = World::healthy(3, 2, 2);
    w.etcd_agrees(vec![]);
    assert_eq!(etcd_members_match(&w.spec, &w.obs, now()), Ok(()));
    w.etcd_agrees(vec![member("demo-control-plane-gone1-5e6f7a8b", 77, false)]);
    let f = etcd_members_match(&w.spec, &w.obs, now()).expect_err("a stale member");
    assert!(f.message.contains("demo-control-plane-gone1-5e6f7a8b"));
}

/// A new member of a roll that failed a step other than installing k3s (its data disk is
/// missing) is its own trouble: it is replaced at once, and the roll is not blocked.
#[test]
fn a_new_member_failing_another_setup_step_is_replaced_without_blocking_the_roll() {
    let mut w = World::healthy(3, 2, 2);
    w.spec.k3s.version = "v1.33.99+k3s1".into();
    w.inst("control-plane", "new01", InstanceState::Running, 60);
    w.obs.setup_failures.insert(
        "demo-control-plane-new01".into(),
        crate::domain::model::SetupFailure {
            step: "data-disk".into(),
            reason: "no NVMe disk with serial data-demo-control-pl".into(),
        },
    );
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-control-plane-new01"], "{:?}", p.actions);
    assert!(
        !p.create_backoff.contains_key("control-plane"),
        "{:?}",
        p.create_backoff
    );
}

/// Issue 33 item 3: the first member of a rolled pool that fails its node setup blocks the
/// roll: it is removed, no member replaces it until the back-off's probe is due, the old
/// members stay, and the block (naming the console's reason) is carried while no member of
/// the new spec is Ready. The same failed member is counted once; the next one doubles the
/// delay.
#[test]
fn a_new_member_that_fails_its_setup_blocks_the_roll_and_backs_off() {
    let failure = crate::domain::model::SetupFailure {
        step: "k3s-install".into(),
        reason: "exit status 1".into(),
    };
    let mut w = World::healthy(3, 2, 2);
    w.spec.k3s.version = "v1.33.99+k3s1".into();
    // The surge server of the new spec failed its setup.
    w.inst("control-plane", "new01", InstanceState::Running, 60);
    w.obs
        .setup_failures
        .insert("demo-control-plane-new01".into(), failure.clone());
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-control-plane-new01"], "{:?}", p.actions);
    assert_eq!(creates(&p, "control-plane"), 0);
    let b = p
        .create_backoff
        .get("control-plane")
        .cloned()
        .unwrap_or_else(|| panic!("no block: {p:?}"));
    assert_eq!(
        (b.cause, b.failures, b.member.as_deref()),
        (
            backoff::BlockCause::SetupFailed,
            1,
            Some("demo-control-plane-new01")
        )
    );
    assert!(
        p.findings
            .iter()
            .any(|f| f.degraded && f.message.contains("node setup failed at k3s-install")),
        "{:?}",
        p.findings
    );

    // Next run: the failed member is gone, the probe is not due: nothing is created, no old
    // server is removed, the block is carried.
    let mut w2 = World::healthy(3, 2, 2);
    w2.spec.k3s.version = "v1.33.99+k3s1".into();
    w2.obs
        .create_backoff
        .insert("control-plane".into(), b.clone());
    let p = w2.plan();
    assert_eq!(creates(&p, "control-plane"), 0, "{:?}", p.actions);
    assert!(removed(&p).is_empty(), "{:?}", p.actions);
    assert!(p.create_backoff.contains_key("control-plane"));
    // Once the delay has passed: one probe.
    let mut due = b.clone();
    due.last_attempt = now() - Duration::minutes(5);
    w2.obs
        .create_backoff
        .insert("control-plane".into(), due.clone());
    let p = w2.plan();
    assert_eq!(creates(&p, "control-plane"), 1, "{:?}", p.actions);
    // The probe fails too: counted once, and a second time only for another member.
    w2.inst("control-plane", "new02", InstanceState::Running, 30);
    w2.obs
        .setup_failures
        .insert("demo-control-plane-new02".into(), failure);
    let p = w2.plan();
    assert_eq!(p.create_backoff["control-plane"].failures, 2);
    let mut again = w2;
    again.obs.create_backoff.insert(
        "control-plane".into(),
        p.create_backoff["control-plane"].clone(),
    );
    let p = again.plan();
    assert_eq!(p.create_backoff["control-plane"].failures, 2);
}

// ---- restarts for certificates (crate::domain::certificates) ----

fn report(w: &mut World, node: &str, at: DateTime<Utc>, ends: Option<DateTime<Utc>>) {
    w.obs
        .certificates
        .get_or_insert_with(|| Ok(BTreeMap::new()))
        .as_mut()
        .unwrap()
        .insert(
            node.to_owned(),
            crate::domain::certificates::Report { at, ends },
        );
}

fn restarts(p: &Plan) -> Vec<(String, bool, DateTime<Utc>)> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::RestartForCertificates {
                name, drain, since, ..
            } => Some((name.clone(), *drain, *since)),
            _ => None,
        })
        .collect()
}

#[test]
fn certificates_inside_the_renewal_lead_restart_one_node_the_earliest_first() {
    let mut w = World::healthy(3, 2, 2);
    let (cp0, wk0, wk1) = (
        "demo-control-plane-cp000",
        "demo-workers-wk000",
        "demo-workers-wk001",
    );
    // All reported; two inside the 60 days, one outside.
    report(&mut w, cp0, now(), Some(now() + Duration::days(50)));
    report(&mut w, wk0, now(), Some(now() + Duration::days(40)));
    report(&mut w, wk1, now(), Some(now() + Duration::days(80)));
    let p = w.plan();
    assert_eq!(restarts(&p), vec![(wk0.to_owned(), true, now())], "{p:?}");
    // The status names the earliest per pool, and nothing is Degraded yet (40 > 30 days).
    let workers = p
        .certificates
        .pools
        .iter()
        .find(|c| c.pool == "workers")
        .unwrap();
    assert_eq!(workers.node.as_deref(), Some(wk0));
    assert!(!p.is_degraded(), "{:?}", p.findings);
    assert!(p.certificates.degraded.is_none());
}

#[test]
fn the_api_address_leaves_a_server_before_its_restart_for_certificates() {
    let mut w = World::healthy(3, 1, 1);
    report(
        &mut w,
        "demo-control-plane-cp000",
        now(),
        Some(now() + Duration::days(50)),
    );
    // cp000 holds the address: it moves to the oldest other Ready server first.
    let p = w.plan();
    assert!(restarts(&p).is_empty(), "{:?}", p.actions);
    assert!(
        matches!(
            p.actions.as_slice(),
            [Action::AttachApiFloatingIp { to, from: Some(f), .. }]
                if to == "demo-control-plane-cp001" && f == "demo-control-plane-cp000"
        ),
        "{:?}",
        p.actions
    );
    // Once it has moved, the restart.
    let cp1 = w.obs.instances[1].id;
    w.fip_on(Some(cp1));
    assert_eq!(
        restarts(&w.plan()),
        vec![("demo-control-plane-cp000".to_owned(), false, now())]
    );
}

#[test]
fn a_server_is_restarted_without_a_drain_and_only_when_every_member_is_ready() {
    let mut w = World::healthy(3, 2, 2);
    report(
        &mut w,
        "demo-control-plane-cp001",
        now(),
        Some(now() + Duration::days(10)),
    );
    let p = w.plan();
    assert_eq!(
        restarts(&p),
        vec![("demo-control-plane-cp001".to_owned(), false, now())]
    );
    // Within 30 days: Degraded, reason CertificatesExpiring (the condition's reason).
    assert!(p.certificates.degraded.is_some(), "{p:?}");
    assert!(p.is_degraded());

    // A worker not Ready: nothing restarts (its replacement goes first).
    w.obs.nodes[3].readiness = NodeReadiness::NotReady {
        since: now() - Duration::seconds(10),
    };
    assert!(restarts(&w.plan()).is_empty());
}

#[test]
fn a_restart_under_way_is_finished_once_the_monitor_reports_after_it_and_none_starts_meanwhile() {
    let mut w = World::healthy(3, 2, 2);
    let since = now() - Duration::minutes(5);
    let wk0 = "demo-workers-wk000";
    let node = w.obs.nodes.iter_mut().find(|n| n.name == wk0).unwrap();
    node.unschedulable = true;
    node.annotations.insert(
        crate::domain::certificates::RESTART_ANNOTATION.to_owned(),
        crate::domain::certificates::Restart::Restarting(since).value(),
    );
    // Rebooted after the ask; its monitor has not spoken since: wait, and start no other.
    w.obs
        .instances
        .iter_mut()
        .find(|i| i.name == wk0)
        .unwrap()
        .time_state_updated = since + Duration::minutes(1);
    report(
        &mut w,
        wk0,
        since - Duration::minutes(1),
        Some(now() + Duration::days(50)),
    );
    report(
        &mut w,
        "demo-workers-wk001",
        now(),
        Some(now() + Duration::days(45)),
    );
    let p = w.plan();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // The old k3s spoke after the ask but before the reboot: not the restarted one's word.
    report(
        &mut w,
        wk0,
        since + Duration::seconds(30),
        Some(now() + Duration::days(50)),
    );
    let p = w.plan();
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    // It spoke after the restart: finished (uncordoned), still no second restart this run.
    report(&mut w, wk0, now() - Duration::seconds(30), None);
    let p = w.plan();
    assert!(
        matches!(
            p.actions.as_slice(),
            [Action::FinishCertificateRestart { uncordon: true, since: s, .. }] if *s == since
        ),
        "{:?}",
        p.actions
    );
}

#[test]
fn an_unfinished_drain_is_carried_on_with_the_first_asks_time() {
    let mut w = World::healthy(3, 2, 2);
    let since = now() - Duration::minutes(5);
    let wk0 = "demo-workers-wk000";
    let node = w.obs.nodes.iter_mut().find(|n| n.name == wk0).unwrap();
    node.unschedulable = true;
    node.annotations.insert(
        crate::domain::certificates::RESTART_ANNOTATION.to_owned(),
        crate::domain::certificates::Restart::Restarting(since).value(),
    );
    report(
        &mut w,
        wk0,
        since - Duration::minutes(1),
        Some(now() + Duration::days(50)),
    );
    // The instance was not rebooted since (its state is older than the ask).
    assert_eq!(restarts(&w.plan()), vec![(wk0.to_owned(), true, since)]);
}

#[test]
fn no_restart_without_the_monitors_events_and_none_repeated_right_after_one_that_renewed_nothing() {
    let mut w = World::healthy(1, 1, 1);
    w.obs.certificates = Some(Err("forbidden".into()));
    let p = w.plan();
    assert!(p.actions.is_empty());
    assert!(
        p.findings
            .iter()
            .any(|f| f.degraded && f.message.contains("list on events"))
    );
    w.obs.certificates = None;
    let wk0 = "demo-workers-wk000";
    report(&mut w, wk0, now(), Some(now() + Duration::days(50)));
    let node = w.obs.nodes.iter_mut().find(|n| n.name == wk0).unwrap();
    node.annotations.insert(
        crate::domain::certificates::RESTART_ANNOTATION.to_owned(),
        crate::domain::certificates::Restart::Done(now() - Duration::days(1)).value(),
    );
    assert!(restarts(&w.plan()).is_empty());
    // Half the lead later, it is tried again, drained: the server takes pods.
    node_annotation_done(&mut w, wk0, now() - Duration::days(31));
    assert_eq!(restarts(&w.plan()), vec![(wk0.to_owned(), true, now())]);
    // A server dedicated by its taint cannot: the lone worker is restarted undrained.
    w.obs.nodes[0].taints.push(crate::domain::spec::Taint {
        key: "node-role.kubernetes.io/control-plane".into(),
        value: "true".into(),
        effect: crate::domain::spec::TaintEffect::NoSchedule,
    });
    assert_eq!(restarts(&w.plan()), vec![(wk0.to_owned(), false, now())]);
}

fn node_annotation_done(w: &mut World, node: &str, at: DateTime<Utc>) {
    let n = w.obs.nodes.iter_mut().find(|n| n.name == node).unwrap();
    n.annotations.insert(
        crate::domain::certificates::RESTART_ANNOTATION.to_owned(),
        crate::domain::certificates::Restart::Done(at).value(),
    );
}

/// Issue 46 item 4: a roll of the control plane held for a backup makes no surge server and
/// says why; the same roll with no hold makes it; a dead server's replacement, a missing
/// server and a worker roll do not wait; the roll is what `control_plane_rolling_to` reports.
#[test]
fn a_roll_held_for_a_backup_makes_no_surge_server_and_says_why() {
    let hold = Finding {
        degraded: false,
        message: "RollWaitsForBackup: waits for a backup".into(),
    };
    let mut roll = World::healthy(3, 2, 2);
    roll.spec.control_plane.cpus = 8;
    roll.etcd_agrees(vec![]);
    assert_eq!(
        control_plane_rolling_to(&roll.spec, &roll.obs, now()),
        Some(
            roll.spec
                .pool_hash(Role::ControlPlane, &roll.spec.control_plane)
        )
    );
    assert_eq!(creates(&roll.plan(), "control-plane"), 1);
    roll.obs.roll_hold = Some(hold.clone());
    let p = roll.plan();
    assert_eq!(creates(&p, "control-plane"), 0, "{p:?}");
    assert!(p.findings.contains(&hold), "{p:?}");
    // Not a roll: nothing to decide, nothing held.
    let w = World::healthy(3, 2, 2);
    assert_eq!(control_plane_rolling_to(&w.spec, &w.obs, now()), None);
    for (what, mut w) in changes_due() {
        if what.contains("roll") {
            continue;
        }
        w.etcd_agrees(vec![]);
        w.obs.roll_hold = Some(hold.clone());
        let p = w.plan();
        assert!(!control_plane_untouched(&p), "{what}: {p:?}");
    }
    let mut workers = World::healthy(3, 2, 2);
    workers.spec.worker_pools[0].cpus = 4;
    workers.obs.roll_hold = Some(hold);
    assert_eq!(creates(&workers.plan(), "workers"), 1);
}

#[test]
fn the_only_server_is_restarted_after_the_run_its_api_goes_down_with() {
    let mut w = World::healthy(1, 1, 1);
    report(
        &mut w,
        "demo-control-plane-cp000",
        now(),
        Some(now() + Duration::days(50)),
    );
    let p = w.plan();
    assert!(
        matches!(
            p.actions.as_slice(),
            [Action::RestartForCertificates {
                after_run: true,
                drain: false,
                ..
            }]
        ),
        "{:?}",
        p.actions
    );
    // With another Ready server, the restart is the run's own (the address moved first).
    let mut w = World::healthy(3, 1, 1);
    let cp1 = w.obs.instances[1].id;
    w.fip_on(Some(cp1));
    report(
        &mut w,
        "demo-control-plane-cp000",
        now(),
        Some(now() + Duration::days(50)),
    );
    assert!(matches!(
        w.plan().actions.as_slice(),
        [Action::RestartForCertificates {
            after_run: false,
            ..
        }]
    ));
}

/// `now()` is Saturday 2026-11-21 12:00 UTC: a Sunday-night window is closed, a daily
/// 11:00 one is open.
fn window(w: &mut World, cron: &str, duration: &str) {
    w.spec.maintenance.windows = vec![crate::domain::maintenance::MaintenanceWindow {
        cron: cron.into(),
        duration: duration.into(),
        time_zone: "UTC".into(),
    }];
}

#[test]
fn a_drift_roll_starts_only_inside_a_maintenance_window() {
    for pool in ["control-plane", "workers"] {
        let mut w = World::healthy(3, 2, 2);
        match pool {
            "control-plane" => w.spec.control_plane.cpus = 8,
            _ => w.spec.worker_pools[0].cpus = 4,
        }
        window(&mut w, "0 2 * * sun", "4h");
        let p = w.plan();
        assert_eq!(p.actions, vec![], "{pool}: {p:?}");
        assert_eq!(
            p.findings,
            [Finding {
                degraded: false,
                message: format!(
                    "pool {pool:?}: its spec changed; the roll waits for the maintenance window opening at 2026-11-22T02:00:00Z"
                ),
            }],
            "{pool}"
        );
        assert!(!p.is_converged() && !p.is_degraded());
        window(&mut w, "0 11 * * *", "2h");
        let p = w.plan();
        assert_eq!(creates(&p, pool), 1, "{pool}: {p:?}");
        assert!(p.actions[0].reason().contains("rolling"), "{p:?}");
    }
}

#[test]
fn a_replacement_begun_inside_a_window_finishes_after_it_closes() {
    // The surge worker made inside the window is Ready: its drifted member goes.
    let mut w = World::healthy(3, 2, 2);
    w.spec.worker_pools[0].cpus = 4;
    w.ready("workers", "srg01", 20);
    window(&mut w, "0 2 * * sun", "4h");
    let p = w.plan();
    assert_eq!(removed(&p).len(), 1, "{p:?}");
    assert_eq!(creates(&p, "workers"), 0);
    // The same for a server.
    let mut w = World::healthy(3, 2, 2);
    w.spec.control_plane.cpus = 8;
    w.ready("control-plane", "srg01", 20);
    window(&mut w, "0 2 * * sun", "4h");
    let p = w.plan();
    assert_eq!(removed(&p).len(), 1, "{p:?}");
    assert!(removed(&p)[0].contains("cp00"), "{p:?}");
}

#[test]
fn broken_members_are_replaced_whatever_the_windows_say() {
    let mut w = World::healthy(3, 2, 2);
    w.set_state_since("demo-workers-wk001", InstanceState::Failed, 10);
    window(&mut w, "0 2 * * sun", "4h");
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-wk001"], "{p:?}");
    assert_eq!(creates(&p, "workers"), 1, "{p:?}");
    // A worker that never joined, in a pool whose roll waits.
    let mut w = World::healthy(3, 2, 1);
    w.spec.worker_pools[0].cpus = 4;
    w.inst("workers", "late1", InstanceState::Running, 3000);
    window(&mut w, "0 2 * * sun", "4h");
    let p = w.plan();
    assert_eq!(removed(&p), ["demo-workers-late1"], "{p:?}");
    assert_eq!(creates(&p, "workers"), 1, "{p:?}");
}

#[test]
fn a_restart_for_certificates_waits_for_a_maintenance_window_unless_urgent() {
    let mut w = World::healthy(3, 2, 2);
    // A Sunday-night window: closed at now() (a Saturday noon).
    window(&mut w, "0 22 * * 0", "4h");
    report(
        &mut w,
        "demo-workers-wk000",
        now(),
        Some(now() + Duration::days(50)),
    );
    let p = w.plan();
    assert!(restarts(&p).is_empty(), "{:?}", p.actions);
    assert!(
        p.findings
            .iter()
            .any(|f| !f.degraded && f.message.contains("waits for")),
        "{:?}",
        p.findings
    );
    // Within degraded_before_days it is urgent: it goes now.
    report(
        &mut w,
        "demo-workers-wk000",
        now(),
        Some(now() + Duration::days(20)),
    );
    assert_eq!(restarts(&w.plan()).len(), 1);
    // Inside a window (daily at 11:00 for 2 h): it goes.
    window(&mut w, "0 11 * * *", "2h");
    report(
        &mut w,
        "demo-workers-wk000",
        now(),
        Some(now() + Duration::days(50)),
    );
    assert_eq!(restarts(&w.plan()).len(), 1);
}

#[test]
fn only_the_restarted_k3s_all_clear_counts_in_the_second_the_instance_came_back() {
    let mut w = World::healthy(3, 2, 2);
    let since = now() - Duration::minutes(5);
    let back = since + Duration::milliseconds(60_400);
    let wk0 = "demo-workers-wk000";
    let node = w.obs.nodes.iter_mut().find(|n| n.name == wk0).unwrap();
    node.unschedulable = true;
    node.annotations.insert(
        crate::domain::certificates::RESTART_ANNOTATION.to_owned(),
        crate::domain::certificates::Restart::Restarting(since).value(),
    );
    w.obs
        .instances
        .iter_mut()
        .find(|i| i.name == wk0)
        .unwrap()
        .time_state_updated = back;
    let second = since + Duration::seconds(60);
    // A warning stamped in that second may be the old k3s's last: wait.
    report(&mut w, wk0, second, Some(now() + Duration::days(50)));
    assert!(w.plan().actions.is_empty());
    // The all-clear in that second is the new k3s's first check: finished.
    report(&mut w, wk0, second, None);
    assert!(matches!(
        w.plan().actions.as_slice(),
        [Action::FinishCertificateRestart { .. }]
    ));
}
