//! Reconcile workflow against the in-memory fakes: convergence from random worlds, the
//! surge bound, exit classification, dry-run, the Lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use oxide_controller::adapters::webhook_tls;
use oxide_controller::base::names::{self, InstanceTag};
use oxide_controller::base::retry::Backoff;
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::shutdown::{Shutdown, Signal};
use oxide_controller::domain::model::{
    DELETE_ME_ANNOTATION, Disk, DiskState, InstanceState, NodeReadiness, PodRef,
};
use oxide_controller::domain::plan::REMOVING_ANNOTATION;
use oxide_controller::domain::spec::{ClusterSpec, Role};
use oxide_controller::domain::status::Status;
use oxide_controller::fake::{FakePod, FakeWorld};
use oxide_controller::ports::cluster::Cluster;
use oxide_controller::ports::rack::Rack;
use oxide_controller::ports::state::{self, StateStore};
use oxide_controller::workflows::reconcile::{self, ReconcileError, ReconcileOptions, RunOutcome};
use proptest::prelude::*;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 21, 12, 0, 0)
        .single()
        .unwrap_or_default()
}

fn secrets() -> ClusterSecrets {
    ClusterSecrets {
        oxide_host: "http://127.0.0.1:1".into(),
        oxide_token: "t".into(),
        oxide_project: "demo".into(),
        oxide_cluster: "demo".into(),
        k3s_token: "server-token".into(),
        k3s_agent_token: "agent-token".into(),
        ssh_public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIController".into(),
        user_ssh_public_key: None,
        tailscale_auth_key: None,
        oxide_token_id: None,
    }
}

/// Short timeouts, and no in-cluster backups: the fake world runs no backup Job, so a roll of
/// its servers must not wait for one (`domain::backup::roll`; its own tests hold rolls).
fn small_timeouts(spec: &mut ClusterSpec) {
    spec.backup.schedule = None;
    spec.timeouts.join_seconds = 120;
    spec.timeouts.not_ready_grace_seconds = 60;
    spec.timeouts.drain_seconds = 1;
}

/// A world holding `spec` in its ConfigMap, the image and (optionally) the floating IP.
async fn world(spec: &ClusterSpec, with_fip: bool) -> FakeWorld {
    let w = FakeWorld::new(t0());
    w.add_image(&spec.control_plane.image);
    let mut data = BTreeMap::new();
    data.insert(state::keys::SPEC.to_owned(), spec.to_yaml());
    w.state()
        .ensure_state(&secrets(), data)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    if with_fip {
        w.rack()
            .create_floating_ip(&names::api_floating_ip_name(&spec.cluster), "", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // As bootstrap leaves it: the webhook's serving pair and its CA in their Secrets.
    let (tls, ca) =
        webhook_tls::generate(&spec.cluster, "kube-system").unwrap_or_else(|e| panic!("{e}"));
    w.state()
        .ensure_webhook_tls(&tls, &ca)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    w.with(|s| s.log.clear());
    w
}

fn opts(w: &FakeWorld) -> ReconcileOptions {
    let mut o = ReconcileOptions::new("test-run");
    o.poll = Duration::from_millis(1);
    o.stop_wait = Duration::from_millis(1);
    o.backoff = Backoff {
        first: Duration::from_millis(1),
        max: Duration::from_millis(1),
        attempts: 2,
    };
    let clock = w.clone();
    o.now = Arc::new(move || clock.with(|s| s.now));
    o
}

async fn run_once(w: &FakeWorld) -> Result<RunOutcome, ReconcileError> {
    let rack = w.rack();
    reconcile::run(&w.cluster(), &w.state(), move |_, _| Ok(rack), &opts(w)).await
}

async fn set_spec(w: &FakeWorld, spec: &ClusterSpec) {
    put_config(w, state::keys::SPEC, spec.to_yaml()).await;
}

/// Writes one key of the ConfigMap, as an admin's edit would.
async fn put_config(w: &FakeWorld, key: &str, value: String) {
    let snap = w
        .state()
        .read_config()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut data = snap.data.clone();
    data.insert(key.to_owned(), value);
    w.state()
        .replace_config(&snap.resource_version, data)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Runs reconcile + tick until converged; returns the number of runs.
async fn converge(w: &FakeWorld, max_runs: usize) -> usize {
    for i in 1..=max_runs {
        let out = run_once(w).await;
        if matches!(out, Ok(RunOutcome::Converged { .. })) {
            return i;
        }
        w.tick(61);
    }
    let status = w
        .state()
        .read_config()
        .await
        .ok()
        .and_then(|s| s.status_json().map(str::to_owned));
    panic!(
        "not converged after {max_runs} runs; log: {:#?}\nstatus: {}",
        w.lock().log,
        status.unwrap_or_default()
    );
}

/// Checks the converged world against the spec: counts, Nodes = instances, no stray disks,
/// the floating IP on a Ready server.
fn assert_shape(w: &FakeWorld, spec: &ClusterSpec) {
    let s = w.lock();
    for (role, pool) in spec.pools() {
        let prefix = names::instance_prefix(&spec.cluster, &pool.name);
        let members: Vec<_> = s
            .instances
            .values()
            .filter(|i| i.name.starts_with(&prefix))
            .collect();
        assert_eq!(members.len(), pool.count as usize, "pool {}", pool.name);
        for m in &members {
            assert_eq!(m.state, InstanceState::Running, "{}", m.name);
            let tag =
                InstanceTag::parse(&m.description).unwrap_or_else(|| panic!("untagged {}", m.name));
            assert_eq!(
                tag.spec_hash,
                spec.pool_hash(role, pool),
                "{} drifted",
                m.name
            );
            let node = s
                .nodes
                .get(&m.name)
                .unwrap_or_else(|| panic!("no node for {}", m.name));
            assert_eq!(node.readiness, NodeReadiness::Ready);
        }
    }
    for n in s.nodes.keys() {
        assert!(s.instances.contains_key(n), "node {n} without instance");
    }
    for d in s.disks.values() {
        let owner = names::disk_owner(&d.name).unwrap_or_default();
        assert!(s.instances.contains_key(owner), "leaked disk {}", d.name);
    }
    let fip = s
        .floating_ips
        .get(&names::api_floating_ip_name(&spec.cluster))
        .unwrap_or_else(|| panic!("no fip"));
    let holder = s
        .instances
        .values()
        .find(|i| Some(i.id) == fip.instance_id)
        .unwrap_or_else(|| panic!("fip unattached"));
    assert!(holder.name.starts_with(&names::instance_prefix(
        &spec.cluster,
        &spec.control_plane.name
    )));
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn empty_project_converges_to_the_spec_and_then_plans_nothing() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 3, 4);
        small_timeouts(&mut spec);
        let w = world(&spec, false).await;
        let runs = converge(&w, 12).await;
        assert!(runs <= 8, "took {runs} runs");
        assert_shape(&w, &spec);
        // A converged state plans nothing, and a second run changes nothing.
        let before = w.lock().log.len();
        assert!(matches!(
            run_once(&w).await,
            Ok(RunOutcome::Converged { .. })
        ));
        assert_eq!(w.lock().log.len(), before);
        let status = w
            .state()
            .read_config()
            .await
            .ok()
            .and_then(|s| s.status_json().and_then(Status::from_json));
        let status = status.unwrap_or_else(|| panic!("status.json missing"));
        assert_eq!(
            status.condition("Ready").map(|c| c.status.as_str()),
            Some("True")
        );
    });
}

/// Issue 43: a run lists the Nodes once (the version gate's list serves the observation),
/// and reads the default subnet's prefix only until a run has recorded it (its IPv4 block
/// cannot change); a dry run likewise.
#[test]
fn a_converged_run_lists_the_nodes_once_and_reads_a_recorded_subnet_prefix_no_more() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 2);
        small_timeouts(&mut spec);
        spec.backup.schedule = Some("0 * * * *".into());
        let w = world(&spec, false).await;
        // Twenty minutes past the hourly backup's tick: backup.json is read after a tick.
        w.with(|s| s.now += chrono::Duration::minutes(20));
        w.with(|s| s.subnet_prefix = Some(20));
        converge(&w, 12).await;
        let reads = |w: &FakeWorld| w.with(|s| std::mem::take(&mut s.reads));
        reads(&w);
        assert!(matches!(
            run_once(&w).await,
            Ok(RunOutcome::Converged { .. })
        ));
        assert_eq!(
            reads(&w),
            // k3s's certificate monitor Events (issue 46 item 1): not on every run, only
            // every `monitor_read_every` (10 minutes) while nothing is near its end. The
            // webhook's counts (audit security-2 N4) are one read of their own object.
            BTreeMap::from([("get-scale", 1), ("list-nodes", 1)]),
            "what a converged run read more than once, or read again"
        );
        assert_eq!(status(&w).await.subnet_prefix, Some(20));
        let mut o = opts(&w);
        o.dry_run = true;
        reconcile::run(&w.cluster(), &w.state(), |_, _| Ok(w.rack()), &o)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            reads(&w),
            BTreeMap::from([("get-scale", 1), ("list-nodes", 1)])
        );
        // Ten minutes on, the monitors' Events are listed again.
        w.with(|s| s.now += chrono::Duration::minutes(10));
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            reads(&w),
            BTreeMap::from([
                ("get-scale", 1),
                ("list-certificate-events", 1),
                ("list-nodes", 1)
            ])
        );
        // Without a recorded prefix the run reads it (once).
        let mut status = status(&w).await;
        status.subnet_prefix = None;
        put_config(&w, state::keys::STATUS, status.to_json()).await;
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            reads(&w),
            BTreeMap::from([
                ("default-subnet-prefix", 1),
                ("get-scale", 1),
                ("list-nodes", 1)
            ])
        );
        // backup.json, in the backup writers' own object (audit security-2 N4), is read
        // after the hourly schedule's next tick (`report::read_due`), not on every run.
        w.with(|s| s.now = t0() + chrono::Duration::minutes(75));
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            reads(&w).get("get-backups"),
            Some(&1),
            "after the 13:00 tick"
        );
        w.with(|s| s.now = t0() + chrono::Duration::minutes(90));
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            reads(&w).get("get-backups"),
            None,
            "read after that tick already"
        );
    });
}

/// Issue 34 item 8: the member rules name every member, and each new member is named before
/// the create that makes it (nexus resolves names only when it pushes the rules); a
/// converged run rewrites nothing.
#[test]
fn the_member_rules_name_each_member_before_it_is_created() {
    use oxide_controller::domain::firewall::{RuleHosts, RuleTargets};
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 3, 2);
        small_timeouts(&mut spec);
        let w = world(&spec, false).await;
        // Bootstrap's API rule: its sources, and the first server only (audit security-2
        // N11: the rule names the cluster's servers, not the VPC).
        let sources = oxide_controller::domain::firewall::parse_sources("198.51.100.0/24")
            .unwrap_or_else(|e| panic!("{e}"));
        w.with(|s| {
            s.firewall_rules
                .push(oxide_controller::domain::firewall::api_rule(
                    "demo",
                    sources.clone(),
                    &["demo-control-plane-first".to_owned()],
                ));
        });
        converge(&w, 12).await;
        let log = w.lock().log.clone();
        let created: Vec<usize> = log
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("create demo-"))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(created.len(), 5, "{log:#?}");
        for i in created {
            assert!(
                log[..i].iter().any(|l| l == "firewall-rule demo-members"),
                "{} before any member rule: {log:#?}",
                log[i]
            );
        }
        let members: Vec<String> = {
            let mut m: Vec<String> = w
                .lock()
                .instances
                .values()
                .map(|i| i.name.clone())
                .collect();
            m.sort();
            m
        };
        let rules = w.lock().firewall_rules.clone();
        let allow = rules.iter().find(|r| r.name == "demo-members").unwrap();
        let deny = rules.iter().find(|r| r.name == "demo-isolate").unwrap();
        assert_eq!(allow.targets, RuleTargets::Instances(members.clone()));
        assert_eq!(allow.hosts, RuleHosts::Instances(members.clone()));
        assert_eq!(deny.targets, RuleTargets::Instances(members.clone()));
        assert_eq!(deny.hosts, RuleHosts::Vpc);
        // The API rule names the servers there are (not the workers, not the VPC), its
        // sources as bootstrap wrote them; each server was named before its create.
        let api = rules.iter().find(|r| r.name == "demo-k8s-api").unwrap();
        let servers: Vec<String> = members
            .iter()
            .filter(|m| m.starts_with("demo-control-plane-"))
            .cloned()
            .collect();
        assert_eq!(servers.len(), 3, "{members:?}");
        assert_eq!(api.targets, RuleTargets::Instances(servers.clone()));
        assert_eq!(api.hosts, RuleHosts::Cidrs(sources));
        for server in &servers {
            let at = log
                .iter()
                .position(|l| l.starts_with(&format!("create {server}")))
                .unwrap_or_else(|| panic!("{server} created: {log:#?}"));
            assert!(
                log[..at].iter().any(|l| l == "firewall-rule demo-k8s-api"),
                "{server} created before the API rule named it: {log:#?}"
            );
        }
        // Converged: the same names, nothing written.
        let before = w.lock().log.len();
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.lock().log.len(), before);
    });
}

#[test]
fn scale_down_drains_before_deleting_and_cleans_up_disks() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 3);
        small_timeouts(&mut spec);
        spec.worker_pools[0].data_disk = Some(oxide_controller::base::size::ByteSize::gib(10));
        let w = world(&spec, true).await;
        converge(&w, 10).await;
        let workers = oxide_controller::fake::pool_members(&w, "demo", "workers");
        w.with(|s| {
            for (i, n) in workers.iter().enumerate() {
                s.pods.push(FakePod {
                    pod: PodRef {
                        namespace: "default".into(),
                        name: format!("app-{i}"),
                        daemonset: false,
                        mirror: false,
                        finished: false,
                        ..PodRef::default()
                    },
                    node: n.clone(),
                    protected: false,
                    refused: None,
                    finalizer: false,
                });
            }
        });
        spec.worker_pools[0].count = 1;
        set_spec(&w, &spec).await;
        converge(&w, 10).await;
        assert_shape(&w, &spec);
        let log = w.lock().log.clone();
        for gone in workers
            .iter()
            .filter(|n| !w.lock().instances.contains_key(*n))
        {
            let pos = |p: &str| log.iter().position(|l| l == &format!("{p} {gone}"));
            let (evict, stop, del_node, del) = (
                log.iter().position(|l| {
                    l.starts_with("evict default/app-")
                        && w.lock().pods.iter().all(|p| &p.node != gone)
                }),
                pos("stop"),
                pos("delete-node"),
                pos("delete"),
            );
            assert!(evict.is_some(), "pods on {gone} evicted");
            assert!(
                stop < del_node && del_node < del,
                "{gone}: stop, then Node, then instance: {log:?}"
            );
            assert!(
                log.contains(&format!("delete-disk data-{gone}")),
                "data disk of {gone} deleted"
            );
        }
    });
}

/// A failed member is stopped before it is deleted: on a rack the stop clears the intent to
/// run, so an automatic restart cannot bring it back between our look and our delete.
#[test]
fn a_failed_member_is_stopped_before_it_is_deleted() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        let w = world(&spec, true).await;
        converge(&w, 10).await;
        let worker = oxide_controller::fake::pool_members(&w, "demo", "workers")[0].clone();
        w.with(|s| {
            if let Some(i) = s.instances.get_mut(&worker) {
                i.state = InstanceState::Failed;
            }
            s.log.clear();
        });
        converge(&w, 10).await;
        assert_shape(&w, &spec);
        let log = w.lock().log.clone();
        let pos = |p: &str| log.iter().position(|l| l == &format!("{p} {worker}"));
        let (stop, del) = (pos("stop"), pos("delete"));
        assert!(
            stop.is_some() && stop < del,
            "{worker}: stop, then delete: {log:?}"
        );
    });
}

/// A failed server's replacement is created only once its Node is gone: k3s keeps a deleted
/// Node (finalizers `wrangler.cattle.io/*`) until a server has removed its etcd member, and a
/// new server joining before that would join a cluster still counting the dead voter.
#[test]
fn a_failed_servers_replacement_waits_until_its_node_is_gone() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 3, 1);
        small_timeouts(&mut spec);
        let w = world(&spec, true).await;
        converge(&w, 10).await;
        let servers = oxide_controller::fake::pool_members(&w, "demo", "control-plane");
        let fip_holder = w.with(|s| s.floating_ips.values().next().and_then(|f| f.instance_id));
        let dead = servers
            .iter()
            .find(|n| w.with(|s| Some(s.instances[*n].id) != fip_holder))
            .cloned()
            .unwrap_or_else(|| panic!("a server without the floating IP"));
        w.with(|s| {
            if let Some(i) = s.instances.get_mut(&dead) {
                i.state = InstanceState::Failed;
            }
            // With its boot disk faulted there is nothing to start again: it is replaced.
            if let Some(d) = s.disks.get_mut(&format!("boot-{dead}")) {
                d.state = oxide_controller::domain::model::DiskState::Faulted;
            }
            s.held_nodes.insert(dead.clone());
            s.log.clear();
        });
        for _ in 0..3 {
            let _ = run_once(&w).await;
            w.tick(61);
        }
        let now = oxide_controller::fake::pool_members(&w, "demo", "control-plane");
        assert!(
            now.iter().all(|n| servers.contains(n)),
            "no replacement while {dead}'s Node is terminating: {:?}",
            w.lock().log
        );
        assert!(w.lock().nodes.contains_key(&dead));
        // A server's handlers ran: the Node goes, and the member is replaced.
        w.with(|s| s.held_nodes.clear());
        converge(&w, 10).await;
        assert_shape(&w, &spec);
        let log = w.lock().log.clone();
        let gone = log
            .iter()
            .rposition(|l| *l == format!("delete-node {dead}"))
            .unwrap_or_else(|| panic!("{dead}'s Node deleted: {log:?}"));
        let created = log
            .iter()
            .position(|l| l.starts_with("create demo-control-plane-"))
            .unwrap_or_else(|| panic!("a replacement: {log:?}"));
        assert!(gone < created, "{log:?}");
    });
}

/// New members join through a Ready server's private VPC address (which the VPC's default
/// `allow-internal-inbound` admits), not through the floating IP.
#[test]
fn new_members_join_through_a_ready_servers_private_address() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        let w = world(&spec, true).await;
        converge(&w, 10).await;
        let before = oxide_controller::fake::pool_members(&w, "demo", "workers");
        spec.worker_pools[0].count = 2;
        set_spec(&w, &spec).await;
        converge(&w, 10).await;
        let server = oxide_controller::fake::pool_members(&w, "demo", "control-plane")[0].clone();
        let private = w
            .rack()
            .instance_private_ip(&server)
            .await
            .unwrap()
            .expect("the server has a private address");
        let new = oxide_controller::fake::pool_members(&w, "demo", "workers")
            .into_iter()
            .find(|n| !before.contains(n))
            .expect("a new worker");
        let ud = String::from_utf8(w.lock().user_data[&new].clone()).unwrap();
        assert!(
            ud.contains(&format!("https://{private}:6443")),
            "joins via {private}: {ud}"
        );
    });
}

#[test]
fn a_pod_disruption_budget_blocks_the_removal_until_it_allows_it() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 2);
        small_timeouts(&mut spec);
        let w = world(&spec, true).await;
        converge(&w, 10).await;
        let workers = oxide_controller::fake::pool_members(&w, "demo", "workers");
        w.with(|s| {
            for n in &workers {
                s.pods.push(FakePod {
                    pod: PodRef {
                        namespace: "db".into(),
                        name: format!("pg-{n}"),
                        daemonset: false,
                        mirror: false,
                        finished: false,
                        ..PodRef::default()
                    },
                    node: n.clone(),
                    protected: true,
                    refused: None,
                    finalizer: false,
                });
            }
        });
        spec.worker_pools[0].count = 1;
        set_spec(&w, &spec).await;
        for _ in 0..3 {
            let _ = run_once(&w).await;
            w.tick(61);
        }
        assert_eq!(
            oxide_controller::fake::pool_members(&w, "demo", "workers").len(),
            2,
            "blocked: nothing deleted"
        );
        let victim = w.with(|s| {
            s.nodes
                .values()
                .find(|n| n.annotations.contains_key(REMOVING_ANNOTATION))
                .map(|n| n.name.clone())
        });
        let victim = victim.unwrap_or_else(|| panic!("a victim is marked"));
        assert!(w.lock().nodes[&victim].unschedulable, "victim cordoned");
        // The budget allows it now.
        w.with(|s| s.pods.iter_mut().for_each(|p| p.protected = false));
        converge(&w, 6).await;
        assert!(!w.lock().instances.contains_key(&victim));
    });
}

/// A world at 1 of 2 workers converged with `pods(node)` on each worker, scaled down to 1.
async fn scaled_down_with(
    pods: impl Fn(&str) -> Vec<FakePod>,
) -> (FakeWorld, ClusterSpec, Vec<String>) {
    let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 2);
    small_timeouts(&mut spec);
    let w = world(&spec, true).await;
    converge(&w, 10).await;
    let workers = oxide_controller::fake::pool_members(&w, "demo", "workers");
    w.with(|s| {
        for n in &workers {
            s.pods.extend(pods(n));
        }
    });
    spec.worker_pools[0].count = 1;
    set_spec(&w, &spec).await;
    (w, spec, workers)
}

fn fake_pod(ns: &str, name: &str, node: &str) -> FakePod {
    FakePod {
        pod: PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ..PodRef::default()
        },
        node: node.into(),
        protected: false,
        refused: None,
        finalizer: false,
    }
}

fn victim(w: &FakeWorld) -> String {
    w.with(|s| {
        s.nodes
            .values()
            .find(|n| n.annotations.contains_key(REMOVING_ANNOTATION))
            .map(|n| n.name.clone())
    })
    .unwrap_or_else(|| panic!("a victim is marked"))
}

async fn status(w: &FakeWorld) -> Status {
    let snap = w
        .state()
        .read_config()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    snap.status_json()
        .and_then(Status::from_json)
        .unwrap_or_else(|| panic!("a status"))
}

#[test]
fn a_pod_whose_eviction_is_refused_is_named_and_the_others_are_evicted() {
    rt().block_on(async {
        let several = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
        let (w, spec, _) = scaled_down_with(|n| {
            let mut db = fake_pod("db", &format!("pg-{n}"), n);
            db.refused = Some(several.into());
            vec![db, fake_pod("web", &format!("web-{n}"), n)]
        })
        .await;
        let _ = run_once(&w).await;
        let victim = victim(&w);
        let log = w.lock().log.clone();
        assert!(log.contains(&format!("evict web/web-{victim}")), "{log:?}");
        let status = status(&w).await;
        assert_eq!(status.condition("Degraded").map(|c| c.status.as_str()), Some("True"));
        let text = serde_json::to_string(&status.last_plan).unwrap_or_default();
        assert!(
            text.contains(&format!("blocked by db/pg-{victim}: {several}")),
            "{text}"
        );
        assert!(w.lock().nodes[&victim].unschedulable, "kept cordoned");
        assert!(w.lock().instances[&victim].state == InstanceState::Running, "VM left running");
        // Someone fixes the budgets: the next runs finish the removal.
        w.with(|s| s.pods.iter_mut().for_each(|p| p.refused = None));
        converge(&w, 6).await;
        assert_shape(&w, &spec);
        assert!(!w.lock().instances.contains_key(&victim));
    });
}

#[test]
fn a_pod_stuck_terminating_is_reported_by_name_until_its_finalizer_goes() {
    rt().block_on(async {
        let (w, spec, _) = scaled_down_with(|n| {
            let mut stuck = fake_pod("app", &format!("held-{n}"), n);
            stuck.finalizer = true;
            vec![stuck]
        })
        .await;
        for _ in 0..2 {
            let _ = run_once(&w).await;
            w.tick(61);
        }
        let victim = victim(&w);
        let status = status(&w).await;
        let text = serde_json::to_string(&status.last_plan).unwrap_or_default();
        assert!(
            text.contains(&format!("pod app/held-{victim} stuck terminating")),
            "{text}"
        );
        assert_eq!(
            status.condition("Degraded").map(|c| c.status.as_str()),
            Some("True")
        );
        assert!(w.lock().nodes[&victim].unschedulable, "kept cordoned");
        assert!(w.lock().instances.contains_key(&victim), "VM not deleted");
        assert!(
            !w.lock().log.contains(&format!("stop {victim}")),
            "VM not stopped"
        );
        // The finalizer is removed: the pod goes, the next run finishes.
        w.with(|s| s.pods.retain(|p| !p.pod.name.starts_with("held-")));
        converge(&w, 6).await;
        assert_shape(&w, &spec);
    });
}

#[test]
fn drain_never_evicts_the_runs_own_pod() {
    rt().block_on(async {
        let (w, spec, workers) = scaled_down_with(|n| {
            vec![
                fake_pod("kube-system", &format!("reconcile-{n}"), n),
                fake_pod("web", &format!("web-{n}"), n),
            ]
        })
        .await;
        // The run executes in the pod on the newest worker (the planner's victim).
        let mut o = opts(&w);
        let rack = w.rack();
        let mut runs_on = None;
        for n in &workers {
            o.own_pod = Some(("kube-system".into(), format!("reconcile-{n}")));
            w.with(|s| s.log.clear());
            let rack = rack.clone();
            let _ = reconcile::run(&w.cluster(), &w.state(), move |_, _| Ok(rack), &o).await;
            if w.lock().log.iter().any(|l| l.starts_with("evict web/")) {
                runs_on = Some(n.clone());
                break;
            }
        }
        let victim = victim(&w);
        assert_eq!(
            runs_on.as_deref(),
            Some(victim.as_str()),
            "the first run drained the victim"
        );
        let log = w.lock().log.clone();
        assert!(
            !log.iter().any(|l| l.contains("evict kube-system/")),
            "{log:?}"
        );
        assert!(
            !log.contains(&format!("stop {victim}")),
            "its own node is not stopped under it: {log:?}"
        );
        let text = serde_json::to_string(&status(&w).await.last_plan).unwrap_or_default();
        assert!(
            text.contains(&format!(
                "this run's own pod kube-system/reconcile-{victim}"
            )),
            "{text}"
        );
        // A run elsewhere (its own pod gone with the first run) finishes the removal.
        w.with(|s| s.pods.retain(|p| p.pod.namespace != "kube-system"));
        converge(&w, 6).await;
        assert_shape(&w, &spec);
    });
}

#[test]
fn a_failed_lease_release_is_retried_so_the_next_run_is_not_locked_out() {
    rt().block_on(async {
        let spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        let w = world(&spec, true).await;
        w.with(|s| s.release_failures = 2);
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.lock().release_failures, 0, "released on the third try");
        assert!(
            w.lock().lease.is_none(),
            "the Lease is free for the next run"
        );
        assert!(matches!(
            run_once(&w).await,
            Ok(RunOutcome::Converged { .. } | RunOutcome::Progressing { .. })
        ));
    });
}

#[test]
fn a_failed_lease_renewal_is_retried_while_the_lease_is_valid() {
    rt().block_on(async {
        let spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        let w = world(&spec, true).await;
        let cluster = w.cluster();
        let len = Duration::from_secs(3);
        cluster
            .acquire_lease("me", len)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // One failure: retried, the Lease is kept, the loop goes on renewing.
        w.with(|s| s.renew_failures = 1);
        let start = tokio::time::Instant::now();
        let kept = tokio::time::timeout(
            Duration::from_secs(4),
            reconcile::keep_lease(&cluster, "me", len, start + len),
        )
        .await;
        assert!(
            kept.is_err(),
            "still holding the Lease after a failed renewal"
        );
        assert_eq!(w.lock().renew_failures, 0);
        // Renewals that keep failing: given up before the Lease runs out, not at the first.
        w.with(|s| s.renew_failures = u32::MAX);
        let start = tokio::time::Instant::now();
        reconcile::keep_lease(&cluster, "me", len, start + len).await;
        let took = start.elapsed();
        assert!(took > Duration::from_millis(1500) && took < len, "{took:?}");
        // Someone else took it: given up at once.
        w.with(|s| {
            s.renew_failures = 0;
            s.lease = Some(("other".into(), s.now));
        });
        let start = tokio::time::Instant::now();
        reconcile::keep_lease(&cluster, "me", len, start + len).await;
        assert!(start.elapsed() < Duration::from_millis(1500));
    });
}

#[test]
fn the_run_stays_out_while_another_holds_the_lease_and_dry_run_changes_nothing() {
    rt().block_on(async {
        let spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 2);
        let w = world(&spec, true).await;
        let other = w.cluster();
        other
            .acquire_lease("someone-else", Duration::from_secs(300))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        match run_once(&w).await {
            Ok(RunOutcome::LeaseHeld { holder }) => assert_eq!(holder, "someone-else"),
            other => panic!("{other:?}"),
        }
        assert!(w.lock().log.is_empty());
        let mut o = opts(&w);
        o.dry_run = true;
        let rack = w.rack();
        match reconcile::run(&w.cluster(), &w.state(), move |_, _| Ok(rack), &o).await {
            Ok(RunOutcome::DryRun { plan }) => assert_eq!(plan.actions.len(), 3),
            other => panic!("{other:?}"),
        }
        assert!(w.lock().log.is_empty(), "dry run changed nothing");
    });
}

#[test]
fn a_bad_spec_is_a_configuration_error_and_changes_nothing() {
    rt().block_on(async {
        let spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 2);
        let w = world(&spec, true).await;
        let snap = w
            .state()
            .read_config()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut data = snap.data.clone();
        data.insert(
            state::keys::SPEC.to_owned(),
            spec.to_yaml().replace("count: 1", "count: 2"),
        );
        w.state()
            .replace_config(&snap.resource_version, data)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let err = run_once(&w).await.expect_err("even control plane");
        assert_eq!(err.exit_code(), 2);
        let printed = oxide_controller::workflows::error::chain(&err);
        assert!(printed.starts_with("configuration error: "), "{printed}");
        assert!(printed.contains("control_plane.count"), "{printed}");
        assert!(w.lock().log.is_empty());
    });
}

#[derive(Debug, Clone)]
enum Seed {
    Ready,
    Joining,
    NeverJoins,
    Failed,
    StoppedNoNode,
    NotReadyLong,
    Drifted,
    DeleteMe,
    Removing,
}

fn seed() -> impl Strategy<Value = Seed> {
    prop_oneof![
        4 => Just(Seed::Ready),
        1 => Just(Seed::Joining),
        1 => Just(Seed::NeverJoins),
        1 => Just(Seed::Failed),
        1 => Just(Seed::StoppedNoNode),
        1 => Just(Seed::NotReadyLong),
        1 => Just(Seed::Drifted),
        1 => Just(Seed::DeleteMe),
        1 => Just(Seed::Removing),
    ]
}

/// Puts one member into the world in the given condition.
async fn plant(w: &FakeWorld, spec: &ClusterSpec, role: Role, suffix: &str, s: &Seed) {
    let pool = match role {
        Role::ControlPlane => spec.control_plane.clone(),
        Role::Worker => spec.worker_pools[0].clone(),
    };
    let name = names::instance_name(&spec.cluster, &pool.name, suffix);
    let img = w.with(|st| st.images[0].id);
    let mut hash = spec.pool_hash(role, &pool);
    if matches!(s, Seed::Drifted) {
        hash = "0ldhash00000".into();
    }
    let new = oxide_controller::domain::model::NewInstance {
        name: name.clone(),
        description: InstanceTag {
            cluster: spec.cluster.clone(),
            pool: pool.name.clone(),
            spec_hash: hash,
        }
        .to_string(),
        hostname: name.clone(),
        ncpus: pool.cpus,
        memory: pool.memory,
        boot_disk: oxide_controller::domain::model::NewDisk {
            name: names::boot_disk_name(&name),
            size: pool.boot_disk,
            image: Some(img),
        },
        data_disk: None,
        restore_disk: None,
        user_data: Vec::new(),
        ephemeral_ip: true,
        ip_pool: None,
        anti_affinity_group: None,
        rack_restarts: false,
    };
    let _ = w.rack().create_instance(&new).await;
    w.with(|st| {
        let now = st.now;
        let ready_node = |st: &mut oxide_controller::fake::WorldState, r: NodeReadiness| {
            st.nodes.insert(
                name.clone(),
                oxide_controller::domain::model::Node {
                    name: name.clone(),
                    provider_id: None,
                    labels: BTreeMap::new(),
                    annotations: BTreeMap::new(),
                    readiness: r,
                    unschedulable: false,
                    created: now,
                    taints: Vec::new(),
                    allocatable: Default::default(),
                    kubelet_version: None,
                    deleting_since: None,
                },
            );
        };
        let inst = st.instances.get_mut(&name);
        let Some(inst) = inst else { return };
        match s {
            Seed::Ready | Seed::Drifted | Seed::DeleteMe | Seed::Removing => {
                inst.state = InstanceState::Running;
                ready_node(st, NodeReadiness::Ready);
                if let Some(n) = st.nodes.get_mut(&name) {
                    if matches!(s, Seed::DeleteMe) {
                        n.annotations
                            .insert(DELETE_ME_ANNOTATION.into(), "true".into());
                    }
                    if matches!(s, Seed::Removing) {
                        n.annotations
                            .insert(REMOVING_ANNOTATION.into(), "earlier run".into());
                        n.unschedulable = true;
                    }
                }
            }
            Seed::Joining => {}
            Seed::NeverJoins => {
                st.never_join.insert(name.clone());
            }
            Seed::Failed => inst.state = InstanceState::Failed,
            Seed::StoppedNoNode => inst.state = InstanceState::Stopped,
            Seed::NotReadyLong => {
                inst.state = InstanceState::Running;
                st.never_join.insert(name.clone());
                ready_node(
                    st,
                    NodeReadiness::NotReady {
                        since: now - chrono::Duration::seconds(3600),
                    },
                );
            }
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Random worlds converge to the desired shape within a bounded number of runs, never
    /// hold more than desired+1 instances in a pool, and then plan nothing.
    #[test]
    fn random_worlds_converge(
        cp in prop::sample::select(vec![1u32, 3]),
        desired in 0u32..6,
        cps in prop::collection::vec(seed(), 0..4),
        workers in prop::collection::vec(seed(), 0..7),
        orphan_node in any::<bool>(),
        orphan_disk in any::<bool>(),
        fip in any::<bool>(),
    ) {
        rt().block_on(async {
            let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", cp, desired);
            small_timeouts(&mut spec);
            let w = world(&spec, fip).await;
            for (i, s) in cps.iter().enumerate() {
                plant(&w, &spec, Role::ControlPlane, &format!("c{i:04}"), s).await;
            }
            // A live cluster has etcd quorum (without it the API would be down and nothing
            // could be observed): add Ready servers until the seeded ones have it.
            let voting = cps.iter().filter(|s| !matches!(s, Seed::Joining | Seed::NeverJoins | Seed::Failed | Seed::StoppedNoNode | Seed::Removing)).count();
            let mut ready = cps.iter().filter(|s| matches!(s, Seed::Ready | Seed::Drifted | Seed::DeleteMe)).count();
            let mut extra = 0;
            while !cps.is_empty() && (ready < (voting + extra) / 2 + 1 || ready == 0) {
                plant(&w, &spec, Role::ControlPlane, &format!("cbas{extra}"), &Seed::Ready).await;
                ready += 1;
                extra += 1;
            }
            for (i, s) in workers.iter().enumerate() {
                plant(&w, &spec, Role::Worker, &format!("w{i:04}"), s).await;
            }
            w.with(|st| {
                if orphan_node {
                    st.nodes.insert("demo-workers-zz9zz".into(), oxide_controller::domain::model::Node {
                        name: "demo-workers-zz9zz".into(), provider_id: None, labels: BTreeMap::new(),
                        annotations: BTreeMap::new(), readiness: NodeReadiness::Ready, unschedulable: false, created: st.now, taints: Vec::new(), allocatable: Default::default(), kubelet_version: None, deleting_since: None,
                    });
                }
                if orphan_disk {
                    st.disks.insert("boot-demo-workers-yy8yy".into(), Disk {
                        id: uuid::Uuid::new_v4(), name: "boot-demo-workers-yy8yy".into(), description: String::new(), state: DiskState::Detached,
                        size: oxide_controller::base::size::ByteSize::gib(20), time_created: st.now, image_id: None,
                    });
                }
                st.peak_instances = 0;
            });
            let workers_before = oxide_controller::fake::pool_members(&w, "demo", "workers").len();
            converge(&w, 30).await;
            assert_shape(&w, &spec);
            let peak = w.with(|s| s.peak_instances);
            let bound = (desired.max(cp) as usize + 1).max(workers_before).max(cps.len() + extra);
            assert!(peak <= bound, "peak {peak} > bound {bound}");
            let before = w.lock().log.len();
            assert!(matches!(run_once(&w).await, Ok(RunOutcome::Converged { .. })));
            assert_eq!(w.lock().log.len(), before, "converged run changes nothing");
        });
    }
}

/// nexus's answer when the project's subnet has no address left (omicron
/// `nexus/db-queries/src/db/queries/network_interface.rs`).
const SUBNET_FULL: &str = "No available IPv4 addresses for interface in subnet 'default' with ID '0a1b2c3d-0000-4000-8000-000000000000'";

#[test]
fn a_pool_the_rack_refuses_gets_one_probe_per_run_with_backoff_and_one_event() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        let w = world(&spec, true).await;
        converge(&w, 10).await;
        spec.worker_pools[0].count = 8;
        set_spec(&w, &spec).await;
        w.with(|s| s.refuse_creates = Some(SUBNET_FULL.to_owned()));
        // Runs five minutes apart, as the CronJob runs: the probe delay (60 s doubling) lets
        // the first three runs probe, then every other one.
        let mut per_run = Vec::new();
        for _ in 0..6 {
            let before = w.with(|s| s.refused_creates);
            let _ = run_once(&w).await;
            per_run.push(w.with(|s| s.refused_creates) - before);
            w.tick(300);
        }
        assert_eq!(
            per_run,
            [1, 1, 1, 1, 0, 1],
            "one probe per run at most, backing off"
        );
        let st = status(&w).await;
        let degraded = st
            .condition("Degraded")
            .cloned()
            .unwrap_or_else(|| panic!("Degraded"));
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "CreatesRefused")
        );
        assert!(
            degraded
                .message
                .contains("the VPC subnet has no free address")
                && degraded.message.contains(SUBNET_FULL)
                && degraded.message.contains("use fewer members"),
            "{degraded:?}"
        );
        assert_eq!(st.create_backoff["workers"].failures, 5);
        let events: Vec<String> = w.with(|s| {
            s.events
                .iter()
                .filter(|(_, reason, _)| reason.contains("Creat"))
                .map(|(_, reason, msg)| format!("{reason}: {msg}"))
                .collect()
        });
        assert_eq!(events.len(), 1, "one Event for the streak: {events:#?}");
        assert!(events[0].starts_with("CreatesRefused"), "{events:?}");

        // The cause is lifted: the next probe succeeds, then the rest follow.
        w.with(|s| s.refuse_creates = None);
        w.tick(1800);
        let runs = converge(&w, 10).await;
        assert!(runs <= 4, "converged in {runs} runs");
        assert_shape(&w, &spec);
        assert!(status(&w).await.create_backoff.is_empty());
        let resumed = w.with(|s| {
            s.events
                .iter()
                .filter(|(_, r, _)| r == "CreatesResumed")
                .count()
        });
        assert_eq!(resumed, 1);
    });
}

/// Asked to stop while a drain waits on a budget (SIGTERM to the Job's pod): the run stops
/// waiting at once instead of at the drain timeout, starts nothing more, writes status naming
/// the interrupted drain, gives the Lease back, and deletes nothing of the half-drained member.
#[test]
fn a_run_asked_to_stop_mid_drain_ends_at_once_and_releases_the_lease() {
    rt().block_on(async {
        let (w, mut spec, workers) = scaled_down_with(|n| {
            let mut p = fake_pod("db", &format!("pg-{n}"), n);
            p.protected = true;
            vec![p]
        })
        .await;
        spec.timeouts.drain_seconds = 60;
        set_spec(&w, &spec).await;
        let mut o = opts(&w);
        o.shutdown = Shutdown::new();
        let trigger = o.shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            trigger.trigger(Signal::Term);
        });
        let rack = w.rack();
        let started = std::time::Instant::now();
        let out = reconcile::run(&w.cluster(), &w.state(), move |_, _| Ok(rack), &o).await;
        assert!(
            matches!(
                out,
                Ok(RunOutcome::Stopped {
                    signal: Signal::Term
                })
            ),
            "{out:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "waited {:?}",
            started.elapsed()
        );
        assert!(w.lock().lease.is_none(), "the Lease is free");
        assert_eq!(
            oxide_controller::fake::pool_members(&w, "demo", "workers"),
            workers,
            "nothing deleted"
        );
        let victim = victim(&w);
        assert!(w.lock().nodes[&victim].unschedulable, "still cordoned");
        let status = status(&w).await;
        assert!(
            status.last_plan.iter().any(|a| a.action == "remove"
                && a.detail
                    .as_deref()
                    .is_some_and(|d| d.contains("interrupted"))),
            "{status:?}"
        );
        // The next run carries on.
        w.with(|s| s.pods.iter_mut().for_each(|p| p.protected = false));
        converge(&w, 6).await;
    });
}

/// Issue 32 item 2, through the workflow: the run reads the etcd member list with the
/// Secret's server token; a member that matches no server holds the control plane's growth
/// (with a finding naming it in status.json) while the workers grow; once the member is gone
/// the control plane grows too. A list that cannot be read holds it as well.
#[tokio::test]
async fn a_stale_etcd_member_holds_the_control_plane_but_not_the_workers() {
    let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
    small_timeouts(&mut spec);
    let w = world(&spec, true).await;
    converge(&w, 10).await;
    let stale = oxide_controller::domain::model::EtcdMember {
        id: 0xabc,
        name: "demo-control-plane-gone1-1a2b3c4d".into(),
        peer_urls: vec!["https://172.30.0.9:2380".into()],
        client_urls: vec![],
        is_learner: false,
    };
    let server_node = w.with(|s| {
        s.nodes
            .keys()
            .find(|n| n.starts_with("demo-control-plane-"))
            .cloned()
            .unwrap_or_default()
    });
    let mut listed = vec![oxide_controller::domain::model::EtcdMember {
        id: 1,
        name: format!("{server_node}-00000001"),
        peer_urls: vec!["https://172.30.0.5:2380".into()],
        client_urls: vec![],
        is_learner: false,
    }];
    listed.push(stale.clone());
    w.with(|s| s.etcd_members = Some(Ok(listed.clone())));
    spec.control_plane.count = 3;
    spec.worker_pools[0].count = 2;
    set_spec(&w, &spec).await;
    for _ in 0..3 {
        let _ = run_once(&w).await;
        w.tick(61);
    }
    let (servers, workers, token) = w.with(|s| {
        let count = |p: &str| s.instances.keys().filter(|n| n.starts_with(p)).count();
        (
            count("demo-control-plane-"),
            count("demo-workers-"),
            s.etcd_token_seen.clone(),
        )
    });
    assert_eq!(
        token.as_deref(),
        Some("server-token"),
        "the Secret's k3s token"
    );
    assert_eq!(servers, 1, "the control plane is held");
    assert_eq!(workers, 2, "the workers grow");
    let status = w
        .state()
        .read_config()
        .await
        .ok()
        .and_then(|s| s.status_json().and_then(Status::from_json))
        .unwrap_or_else(|| panic!("status"));
    assert!(
        status
            .findings
            .iter()
            .any(|f| f.contains("demo-control-plane-gone1-1a2b3c4d")),
        "{:?}",
        status.findings
    );
    // Unreadable: still held, and said so.
    w.with(|s| s.etcd_members = Some(Err("HTTP 500: failed to get etcd MemberList".into())));
    let _ = run_once(&w).await;
    assert_eq!(
        w.with(|s| s
            .instances
            .keys()
            .filter(|n| n.starts_with("demo-control-plane-"))
            .count()),
        1
    );
    // k3s's own bookkeeping again (the stale member removed): the control plane grows.
    w.with(|s| s.etcd_members = None);
    converge(&w, 20).await;
    assert_eq!(
        w.with(|s| s
            .instances
            .keys()
            .filter(|n| n.starts_with("demo-control-plane-"))
            .count()),
        3
    );
}

/// A channel server that names one release (or fails), counting the questions.
#[derive(Debug, Default)]
struct OneRelease {
    answer: std::sync::Mutex<Option<String>>,
    asked: std::sync::atomic::AtomicU32,
}

impl oxide_controller::ports::channel::ReleaseChannels for OneRelease {
    fn latest<'a>(
        &'a self,
        base: &'a str,
        channel: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<String, oxide_controller::ports::channel::ChannelError>,
    > {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = self
            .answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Box::pin(async move {
            answer.ok_or(oxide_controller::ports::channel::ChannelError::Status {
                url: format!("{base}/{channel}"),
                status: 503,
            })
        })
    }
}

/// Issue 46 item 3: the channel's patch is written into k3s.version only inside a window
/// (the run's clock places it), one question a run; an unanswered channel fails no run.
#[test]
fn a_channels_patch_becomes_k3s_version_only_inside_a_window_and_a_silent_server_fails_no_run() {
    use oxide_controller::domain::upgrade::channel::ChannelState;
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        spec.upgrade.channel = Some("v1.33".into());
        // t0 is 12:00 UTC: the window opens at 13:00.
        spec.maintenance.windows = vec![oxide_controller::domain::maintenance::MaintenanceWindow {
            cron: "0 13 * * *".into(),
            duration: "1h".into(),
            time_zone: "UTC".into(),
        }];
        let w = world(&spec, true).await;
        let channel = Arc::new(OneRelease::default());
        let run = |w: &FakeWorld| {
            let mut o = opts(w);
            o.channels = channel.clone();
            let (rack, cluster, state) = (w.rack(), w.cluster(), w.state());
            async move { reconcile::run(&cluster, &state, move |_, _| Ok(rack), &o).await }
        };
        let version = |w: &FakeWorld| {
            let w = w.clone();
            async move {
                let snap = w
                    .state()
                    .read_config()
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                ClusterSpec::from_yaml(snap.spec_yaml().unwrap_or_default())
                    .unwrap_or_else(|e| panic!("{e}"))
                    .k3s
                    .version
            }
        };

        // No answer: a finding, and the run does its work.
        run(&w).await.unwrap_or_else(|e| panic!("{e:?}"));
        let c = status(&w)
            .await
            .channel
            .unwrap_or_else(|| panic!("channel"));
        assert_eq!(c.state, ChannelState::Unresolved, "{c:?}");
        assert!(status(&w).await.findings.contains(&c.message));

        *channel.answer.lock().unwrap_or_else(|p| p.into_inner()) = Some("v1.33.7+k3s3".into());
        w.tick(60);
        run(&w).await.unwrap_or_else(|e| panic!("{e:?}"));
        let c = status(&w)
            .await
            .channel
            .unwrap_or_else(|| panic!("channel"));
        assert_eq!(c.state, ChannelState::Waiting, "{c:?}");
        assert_eq!(
            c.next_window,
            Some(Utc.with_ymd_and_hms(2026, 11, 21, 13, 0, 0).unwrap())
        );
        assert_eq!(version(&w).await, "v1.33.4+k3s1");
        assert_eq!(channel.asked.load(std::sync::atomic::Ordering::SeqCst), 2);

        w.with(|s| s.now = Utc.with_ymd_and_hms(2026, 11, 21, 13, 0, 30).unwrap());
        run(&w).await.unwrap_or_else(|e| panic!("{e:?}"));
        let c = status(&w)
            .await
            .channel
            .unwrap_or_else(|| panic!("channel"));
        assert_eq!(c.state, ChannelState::Adopted, "{c:?}");
        assert_eq!(version(&w).await, "v1.33.7+k3s3");
        assert_eq!(channel.asked.load(std::sync::atomic::Ordering::SeqCst), 3);
    });
}

/// Audit security-2 N12: with pinned k3s binaries (`k3s.binary_sha256`), a channel's new patch
/// has no digest yet, so it is held (k3s.version stays; the status says which line to add)
/// rather than written into a spec whose new members would download an unpinned binary or
/// be checked against another release's digest; once the digest is in the spec it is adopted.
#[test]
fn a_channels_patch_waits_for_its_binary_digest_when_binaries_are_pinned() {
    use oxide_controller::domain::upgrade::channel::ChannelState;
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        spec.upgrade.channel = Some("v1.33".into());
        spec.k3s
            .binary_sha256
            .insert("v1.33.4+k3s1".into(), "ab".repeat(32));
        let w = world(&spec, true).await;
        let channel = Arc::new(OneRelease::default());
        *channel.answer.lock().unwrap_or_else(|p| p.into_inner()) = Some("v1.33.7+k3s3".into());
        let run = |w: &FakeWorld| {
            let mut o = opts(w);
            o.channels = channel.clone();
            let (rack, cluster, state) = (w.rack(), w.cluster(), w.state());
            async move { reconcile::run(&cluster, &state, move |_, _| Ok(rack), &o).await }
        };
        let stored = |w: &FakeWorld| {
            let w = w.clone();
            async move {
                let snap = w
                    .state()
                    .read_config()
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                ClusterSpec::from_yaml(snap.spec_yaml().unwrap_or_default())
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        run(&w).await.unwrap_or_else(|e| panic!("{e:?}"));
        let c = status(&w)
            .await
            .channel
            .unwrap_or_else(|| panic!("channel"));
        assert_eq!(c.state, ChannelState::Held, "{c:?}");
        assert!(
            c.message.contains("is refused: k3s.binary_sha256: has digests for other releases but not for v1.33.7+k3s3")
                && c.message.contains("add `v1.33.7+k3s3: <sha256>`"),
            "{c:?}"
        );
        assert_eq!(stored(&w).await.k3s.version, "v1.33.4+k3s1");

        let mut with_digest = stored(&w).await;
        with_digest
            .k3s
            .binary_sha256
            .insert("v1.33.7+k3s3".into(), "cd".repeat(32));
        set_spec(&w, &with_digest).await;
        w.tick(60);
        run(&w).await.unwrap_or_else(|e| panic!("{e:?}"));
        let c = status(&w)
            .await
            .channel
            .unwrap_or_else(|| panic!("channel"));
        assert_eq!(c.state, ChannelState::Adopted, "{c:?}");
        assert_eq!(stored(&w).await.k3s.version, "v1.33.7+k3s3");
    });
}

/// Issue 46 item 1 (audit security-2 N10): the webhook's serving certificate is re-issued by
/// the run inside `certificates.renew_before_days` of its end, signed by the kept CA (so
/// clients need nothing new), written against the read resourceVersion; a no-op run reads
/// neither Secret; without the CA's key the run says why and the cluster goes Degraded
/// (`CertificatesExpiring`) within `degraded_before_days`.
#[test]
fn the_webhooks_certificate_is_reissued_before_its_end_and_a_noop_run_reads_nothing_for_it() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        let w = world(&spec, false).await;
        converge(&w, 12).await;
        let now = w.with(|s| s.now);
        let first = status(&w)
            .await
            .webhook_certificate
            .unwrap_or_else(|| panic!("recorded"));
        // Within 60 days of its end: 25 days left.
        let ca = w
            .with(|s| s.webhook_ca.clone())
            .unwrap_or_else(|| panic!("a CA"));
        let old = webhook_tls::reissue(
            &ca,
            "demo",
            "kube-system",
            now - chrono::Duration::days(340),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        w.with(|s| {
            let rv = s.webhook_tls.as_ref().map_or(1, |(rv, _)| *rv);
            s.webhook_tls = Some((rv, old.clone()));
        });
        // The record is a day old: the next run reads the pair again (a hand-made change).
        w.with(|s| s.now += chrono::Duration::hours(25));
        let reads = |w: &FakeWorld| w.with(|s| std::mem::take(&mut s.reads));
        reads(&w);
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        let now = w.with(|s| s.now);
        let kept = status(&w)
            .await
            .webhook_certificate
            .unwrap_or_else(|| panic!("recorded"));
        assert_eq!(kept.renewed_at, Some(now), "{kept:?}");
        assert_eq!(kept.error, None);
        assert!(
            kept.not_after > now + chrono::Duration::days(360),
            "{kept:?} vs {first:?}"
        );
        let (_, served) = w
            .with(|s| s.webhook_tls.clone())
            .unwrap_or_else(|| panic!("a pair"));
        assert_ne!(served.key_pem, old.key_pem, "a new key");
        assert_eq!(
            served.ca_pem, ca.ca_pem,
            "the same CA: clients need nothing new"
        );
        webhook_tls::verify(&served, "kube-system", now).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(webhook_tls::end(&served.cert_pem), Some(kept.not_after));
        let r = reads(&w);
        assert_eq!(
            (r.get("get-webhook-tls"), r.get("get-webhook-ca")),
            (Some(&1), Some(&1))
        );
        // The next run trusts its record: no request for the webhook's Secrets.
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        let r = reads(&w);
        assert_eq!(
            (r.get("get-webhook-tls"), r.get("get-webhook-ca")),
            (None, None),
            "{r:?}"
        );

        // No CA key (a Secret deleted by hand): not re-issued, said why, Degraded near the end.
        let ending = webhook_tls::reissue(
            &ca,
            "demo",
            "kube-system",
            now - chrono::Duration::days(355),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        w.with(|s| {
            s.webhook_ca = None;
            let rv = s.webhook_tls.as_ref().map_or(1, |(rv, _)| *rv);
            s.webhook_tls = Some((rv, ending.clone()));
            s.now += chrono::Duration::hours(25);
        });
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        let st = status(&w).await;
        let kept = st
            .webhook_certificate
            .clone()
            .unwrap_or_else(|| panic!("recorded"));
        assert_eq!(
            kept.not_after,
            webhook_tls::end(&ending.cert_pem).unwrap_or_default()
        );
        assert!(
            kept.error.as_deref().is_some_and(
                |e| e.contains("oxide-controller-webhook-ca") && e.contains("re-run bootstrap")
            ),
            "{kept:?}"
        );
        let degraded = st
            .condition("Degraded")
            .unwrap_or_else(|| panic!("a condition"));
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "CertificatesExpiring"),
            "{degraded:?}"
        );
        assert!(degraded.message.contains("webhook"), "{}", degraded.message);
        assert!(
            !format!("{st:?}").contains("PRIVATE"),
            "no key in the status"
        );
    });
}

/// Issue 46 item 4: the reconcile's scheduled drill never deletes the server of the drill under
/// way (`drill.json` `running`) nor a young one of no scheduled drill (a laptop's `--verify`
/// under way), and deletes one left behind (older than the drill timeout); a drill whose
/// server says nothing for 30 minutes fails, and its server goes too.
#[test]
fn a_left_behind_drill_server_is_deleted_and_the_running_drills_only_when_it_ends() {
    use oxide_controller::domain::backup::drill::{DRILL_TIMEOUT, DrillReport, DrillRunning};
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        let w = world(&spec, false).await;
        converge(&w, 12).await;
        let drill_server = |name: &str, made| oxide_controller::domain::model::Instance {
            id: uuid::Uuid::new_v4(),
            name: name.into(),
            description: oxide_controller::domain::backup::drill::server_description(
                "demo",
                "demo-etcd-20261121t110000z",
            ),
            hostname: name.into(),
            state: InstanceState::Running,
            ncpus: 2,
            memory: oxide_controller::base::size::ByteSize(4 << 30),
            time_created: made,
            time_state_updated: made,
        };
        let (running, left, laptop) = (
            "demo-drill-control-plane-aaaaa",
            "demo-drill-control-plane-bbbbb",
            "demo-drill-control-plane-ccccc",
        );
        let now = w.with(|s| {
            let made = [
                (running, s.now),
                (left, s.now - DRILL_TIMEOUT - chrono::Duration::minutes(1)),
                (laptop, s.now),
            ];
            for (name, made) in made {
                s.instances.insert(name.into(), drill_server(name, made));
                // A drill server runs no kubelet: no Node of it joins.
                s.never_join.insert(name.into());
            }
            s.now
        });
        let report = DrillReport {
            running: Some(DrillRunning {
                server: running.into(),
                backup: "demo-etcd-20261121t110000z".into(),
                backup_time: t0(),
                expected_objects: Some(40),
                started: now,
            }),
            ..DrillReport::default()
        };
        w.with(|s| {
            s.config
                .data
                .insert(state::keys::DRILL.into(), report.to_json());
        });
        let drill_json = |w: &FakeWorld| {
            w.with(|s| {
                s.config
                    .data
                    .get(state::keys::DRILL)
                    .and_then(|j| DrillReport::from_json(j))
                    .unwrap_or_default()
            })
        };
        let on_rack = |w: &FakeWorld, name: &str| w.with(|s| s.instances.contains_key(name));
        // The drills' one address (every drill of the cluster has the same).
        w.rack()
            .create_floating_ip("demo-drill-apiserver", "", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let address =
            |w: &FakeWorld| w.with(|s| s.floating_ips.contains_key("demo-drill-apiserver"));
        // The left-behind server is stopped, then deleted; the running drill's is untouched.
        for _ in 0..3 {
            let _ = run_once(&w).await;
            w.tick(1);
        }
        assert!(
            !on_rack(&w, left),
            "the left-behind drill server is deleted"
        );
        assert!(on_rack(&w, running), "the running drill's server stays");
        assert!(on_rack(&w, laptop), "a laptop's drill under way stays");
        assert!(address(&w), "and the address the drills under way use");
        assert_eq!(
            w.with(|s| s.instances[running].state.clone()),
            InstanceState::Running
        );
        assert_eq!(drill_json(&w).running, report.running, "still under way");
        // No verdict on its console for longer than the timeout: failed, and deleted.
        w.tick(DRILL_TIMEOUT.num_seconds());
        for _ in 0..3 {
            let _ = run_once(&w).await;
            w.tick(1);
        }
        let after = drill_json(&w);
        assert!(
            !on_rack(&w, running),
            "the timed-out drill's server is deleted"
        );
        assert!(
            !on_rack(&w, laptop),
            "and the laptop's, left behind as long"
        );
        assert!(!address(&w), "the address goes with the last drill server");
        // No scheduled drill: a left-behind server goes, but the address stays while a
        // laptop's drill under way uses it.
        w.with(|s| {
            let now = s.now;
            let made = [
                (left, now - DRILL_TIMEOUT - chrono::Duration::minutes(1)),
                (laptop, now),
            ];
            for (name, made) in made {
                s.instances.insert(name.into(), drill_server(name, made));
            }
        });
        w.rack()
            .create_floating_ip("demo-drill-apiserver", "", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..3 {
            let _ = run_once(&w).await;
            w.tick(1);
        }
        assert!(!on_rack(&w, left));
        assert!(on_rack(&w, laptop));
        assert!(address(&w), "the laptop's drill keeps its address");
        assert_eq!(after.running, None);
        let last = after.last.unwrap_or_else(|| panic!("no result"));
        assert!(!last.ok);
        assert!(
            last.reason
                .as_deref()
                .is_some_and(|r| r.contains("printed no result within 30 minutes")),
            "{last:?}"
        );
        let status = w
            .state()
            .read_config()
            .await
            .ok()
            .and_then(|s| s.status_json().and_then(Status::from_json))
            .unwrap_or_else(|| panic!("status.json missing"));
        assert_eq!(
            status.condition("Degraded").map(|c| c.reason.as_str()),
            Some("DrillFailed")
        );
    });
}

/// Audit security-2 N4: the webhook's counts live in ConfigMap `oxide-controller-scale`, the
/// only object its account may update. A run applies them within the webhook's own limits;
/// written there directly beyond them (as whoever holds the account could), they are ignored
/// with nothing created or removed (the pool keeps the count the last run planned), and the
/// status says why. An administrator's later edit of
/// `spec.yaml` wins over an older override.
#[test]
fn the_webhooks_counts_apply_within_its_limits_and_a_direct_write_beyond_them_creates_nothing() {
    use oxide_controller::domain::spec::scale::{PoolOverride, PoolScale, ScaleOverrides};
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        spec.webhook = Some(oxide_controller::domain::spec::WebhookSpec { ceiling: 3 });
        let w = world(&spec, false).await;
        converge(&w, 12).await;
        let pool = spec.worker_pools[0].name.clone();
        let over = PoolScale::of(&spec.worker_pools[0]);
        let put_scale = |count: u32, max: u32| {
            let o = ScaleOverrides {
                pools: BTreeMap::from([(
                    pool.clone(),
                    PoolOverride {
                        set: PoolScale { count, max, ..over },
                        over,
                    },
                )]),
            };
            let st = w.state();
            async move {
                let now = st.read_scale().await.unwrap_or_else(|e| panic!("{e}"));
                let now = now.unwrap_or_else(|| panic!("bootstrap made no scale object"));
                let data = BTreeMap::from([(
                    oxide_controller::domain::spec::scale::KEY.to_owned(),
                    o.to_json(),
                )]);
                st.replace_scale(&now.resource_version, data)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        };
        let workers = |w: &FakeWorld| {
            w.with(|s| {
                s.instances
                    .keys()
                    .filter(|n| n.starts_with(&format!("demo-{pool}-")))
                    .count()
            })
        };
        // Within the ceiling: two workers.
        put_scale(2, over.max).await;
        converge(&w, 12).await;
        assert_eq!(workers(&w), 2);
        // Beyond it (the webhook would answer 422; the account can still write the object).
        put_scale(50, over.max).await;
        w.with(|s| s.log.clear());
        let out = run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(out, RunOutcome::Converged { .. }), "{out:?}");
        assert!(w.lock().log.is_empty(), "{:?}", w.lock().log);
        assert_eq!(
            workers(&w),
            2,
            "the count the last run planned stands: {:?}",
            w.lock().log
        );
        let findings = status(&w).await.findings.join("\n");
        assert!(
            findings.contains("oxide-controller-scale") && findings.contains("ceiling"),
            "{findings}"
        );
        // Back within the limits, then an administrator edits spec.yaml: theirs wins.
        put_scale(2, over.max).await;
        converge(&w, 12).await;
        assert_eq!(workers(&w), 2);
        let mut admin = spec.clone();
        admin.worker_pools[0].count = 3;
        set_spec(&w, &admin).await;
        converge(&w, 12).await;
        assert_eq!(workers(&w), 3);
    });
}

/// Audit security-2, the rest of H2: the end of the cluster's Oxide token is watched. Listed
/// once a day (a no-op run in between asks nothing), a finding within 60 days of its end,
/// Degraded (reason `OxideTokenExpiring`) within 30; a rotation whose new id is in the Secret
/// is listed at once and clears it; two tokens and no id: said, not guessed.
#[test]
fn the_oxide_tokens_end_is_watched_daily_and_degrades_the_cluster_before_it_comes() {
    use oxide_controller::domain::oxide_token::AccessToken;
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 1);
        small_timeouts(&mut spec);
        let w = world(&spec, false).await;
        converge(&w, 12).await;
        let first = status(&w).await;
        let record = first
            .oxide_token
            .clone()
            .unwrap_or_else(|| panic!("recorded"));
        let old_id = w.with(|s| s.access_tokens[0].id.clone());
        // The user's only token, which never expires: known without an id in the Secret.
        assert_eq!(
            (
                record.id.as_deref(),
                record.expires_at,
                record.error.as_deref()
            ),
            (Some(old_id.as_str()), None, None)
        );
        assert!(
            !first.findings.iter().any(|f| f.contains("OxideToken")),
            "{:?}",
            first.findings
        );

        // The silo gave it an end, 45 days away; within a day nobody asks again.
        let end = w.with(|s| s.now) + chrono::Duration::days(45);
        w.with(|s| s.access_tokens[0].expires_at = Some(end));
        let reads = |w: &FakeWorld| w.with(|s| std::mem::take(&mut s.reads));
        reads(&w);
        w.with(|s| s.now += chrono::Duration::hours(23));
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reads(&w).get("access-tokens"), None, "listed once a day");
        assert_eq!(
            status(&w).await.oxide_token.and_then(|t| t.expires_at),
            None
        );
        w.with(|s| s.now += chrono::Duration::hours(2));
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reads(&w).get("access-tokens"), Some(&1));
        let st = status(&w).await;
        assert_eq!(
            st.oxide_token.as_ref().and_then(|t| t.expires_at),
            Some(end)
        );
        let finding = st
            .findings
            .iter()
            .find(|f| f.starts_with("OxideTokenExpiring: "))
            .unwrap_or_else(|| panic!("a finding within 60 days: {:?}", st.findings));
        assert!(
            finding.contains(&old_id) && finding.contains("oxide-token-id"),
            "{finding}"
        );
        assert_ne!(
            st.condition("Degraded")
                .map(|c| c.reason.clone())
                .as_deref(),
            Some("OxideTokenExpiring"),
            "45 days left is a finding, not Degraded"
        );

        // 25 days left: Degraded, with the token's reason.
        w.with(|s| s.now = end - chrono::Duration::days(25));
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        let st = status(&w).await;
        let degraded = st
            .condition("Degraded")
            .unwrap_or_else(|| panic!("a condition"));
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "OxideTokenExpiring"),
            "{degraded:?}"
        );

        // A person logs in again and writes the new token's id: the next run, minutes later,
        // lists at once, and the cluster is no longer Degraded for it.
        let new_id = "5a1e0000-0000-4000-8000-0000000000b2".to_owned();
        w.with(|s| {
            s.access_tokens.push(AccessToken {
                id: new_id.clone(),
                expires_at: Some(s.now + chrono::Duration::days(365)),
            });
            if let Some(sec) = s.secrets.as_mut() {
                sec.oxide_token_id = Some(new_id.clone());
            }
            s.now += chrono::Duration::minutes(5);
        });
        reads(&w);
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            reads(&w).get("access-tokens"),
            Some(&1),
            "a rotation is listed at once"
        );
        let st = status(&w).await;
        assert_eq!(
            st.oxide_token.as_ref().and_then(|t| t.id.clone()),
            Some(new_id)
        );
        assert!(
            !st.findings.iter().any(|f| f.contains("OxideToken")),
            "{:?}",
            st.findings
        );
        assert_ne!(
            st.condition("Degraded")
                .map(|c| c.reason.clone())
                .as_deref(),
            Some("OxideTokenExpiring"),
            "{:?}",
            st.condition("Degraded")
        );

        // Two tokens and no id in the Secret: which one is not guessed.
        w.with(|s| {
            if let Some(sec) = s.secrets.as_mut() {
                sec.oxide_token_id = None;
            }
            s.now += chrono::Duration::hours(25);
        });
        run_once(&w).await.unwrap_or_else(|e| panic!("{e}"));
        let st = status(&w).await;
        assert!(
            st.findings
                .iter()
                .any(|f| f
                    .starts_with("OxideTokenUnknown: cannot tell which of this user's 2 tokens")),
            "{:?}",
            st.findings
        );
    });
}

/// The API floating IP leaves a drifted server for a new Ready one by a detach and an attach.
/// When the attach is refused, the address goes back to the server it left (clients keep
/// reaching the API) and that server is not removed in the same run; once the rack takes the
/// attach, the move and the roll complete.
#[test]
fn a_refused_move_of_the_api_address_puts_it_back_and_keeps_its_holder() {
    rt().block_on(async {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 1, 0);
        small_timeouts(&mut spec);
        let w = world(&spec, true).await;
        converge(&w, 12).await;
        let fip = names::api_floating_ip_name("demo");
        let holder_of = |w: &FakeWorld| {
            w.with(|s| {
                let id = s.floating_ips.get(&fip).and_then(|f| f.instance_id);
                s.instances
                    .values()
                    .find(|i| Some(i.id) == id)
                    .map(|i| i.name.clone())
            })
        };
        let old = holder_of(&w).unwrap_or_else(|| panic!("the address is attached"));
        w.with(|s| s.attach_only_to = Some(old.clone()));
        spec.control_plane.cpus += 2;
        set_spec(&w, &spec).await;
        // A detach, the refused attach (not logged), and the attach back to the holder.
        let put_back = format!("detach-fip {fip}\nattach-fip {fip} {old}");
        let mut refused = false;
        for _ in 0..12 {
            let _ = run_once(&w).await;
            w.tick(30);
            if w.with(|s| s.log.join("\n")).contains(&put_back) {
                refused = true;
                break;
            }
        }
        assert!(
            refused,
            "the move was tried and put back: {}",
            w.with(|s| s.log.join("\n"))
        );
        assert_eq!(
            holder_of(&w),
            Some(old.clone()),
            "the address is back on its holder"
        );
        assert!(
            w.with(|s| s.instances.contains_key(&old)),
            "the holder was not removed while it holds the address"
        );
        w.with(|s| s.attach_only_to = None);
        converge(&w, 20).await;
        let now = holder_of(&w).unwrap_or_else(|| panic!("attached"));
        assert_ne!(now, old, "moved once the rack took the attach");
        assert!(!w.with(|s| s.instances.contains_key(&old)), "rolled");
    });
}
