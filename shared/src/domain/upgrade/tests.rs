#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use chrono::{Duration, TimeZone, Utc};

use super::*;
use crate::domain::model::{NodeReadiness, REMOVING_ANNOTATION};
use crate::domain::spec::upgrade::K3sVersion;
use crate::domain::spec::{ClusterSpec, POOL_LABEL};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 27, 0, 0, 0).unwrap()
}

/// Two worker pools, `workers` and `gpu`, as issue 33's acceptance test has them.
fn spec(version: &str) -> ClusterSpec {
    let mut s = ClusterSpec::new("demo", "demo", "ubuntu", 3, 2);
    s.k3s.version = version.into();
    let mut gpu = s.worker_pools[0].clone();
    gpu.name = "gpu".into();
    s.worker_pools.push(gpu);
    s
}

fn node(name: &str, pool: &str, version: &str, ready: bool) -> Node {
    Node {
        name: name.into(),
        provider_id: None,
        labels: BTreeMap::from([(POOL_LABEL.to_owned(), pool.to_owned())]),
        annotations: BTreeMap::new(),
        readiness: if ready {
            NodeReadiness::Ready
        } else {
            NodeReadiness::NotReady {
                since: now() - Duration::seconds(5),
            }
        },
        unschedulable: false,
        created: now() - Duration::hours(1),
        taints: Vec::new(),
        allocatable: Default::default(),
        kubelet_version: Some(version.into()),
        deleting_since: None,
    }
}

/// Servers at `cp` (each a version), two Nodes per worker pool at `w`.
fn cluster(cp: &[&str], w: &str) -> Vec<Node> {
    let mut out: Vec<Node> = cp
        .iter()
        .enumerate()
        .map(|(i, v)| node(&format!("cp{i}"), "control-plane", v, true))
        .collect();
    for pool in ["workers", "gpu"] {
        for i in 0..2 {
            out.push(node(&format!("{pool}{i}"), pool, w, true));
        }
    }
    out
}

const V33: &str = "v1.33.4+k3s1";
const V34: &str = "v1.34.1+k3s1";
/// The first v1.33 release with etcd v3.5.26 ([`etcd::FIRST_SAFE_RELEASE`]).
const SAFE33: &str = "v1.33.7+k3s3";

fn fields(r: Result<(), SpecErrors>) -> Vec<(String, String)> {
    r.err()
        .map(|e| e.0.into_iter().map(|e| (e.field, e.message)).collect())
        .unwrap_or_default()
}

#[test]
fn versions_order_by_semver_then_the_k3s_build() {
    let v = |s: &str| K3sVersion::parse(s).unwrap();
    assert!(v("v1.34.1+k3s1") > v("v1.33.9+k3s3"));
    assert!(
        v("v1.33.4+k3s2") > v("v1.33.4+k3s1"),
        "same release, later k3s build"
    );
    assert!(
        v("v1.33.4+k3s1") > v("v1.33.4-rc1+k3s1"),
        "a release above its rc"
    );
    assert!(v("v1.33.10+k3s1") > v("v1.33.9+k3s1"), "numeric, not text");
    assert_eq!(v("v1.33.4+k3s1").to_string(), "v1.33.4+k3s1");
    for bad in [
        "1.33.4+k3s1",
        "v1.33+k3s1",
        "v1.33.4+rke2",
        "v1.33.4.1",
        "vx.1.2",
        "v1.33.4-",
    ] {
        assert_eq!(K3sVersion::parse(bad), None, "{bad}");
    }
}

/// (what, servers run, k3s.version, spec edit, refused field + words in the message)
type Case = (
    &'static str,
    &'static [&'static str],
    &'static str,
    Box<dyn Fn(&mut ClusterSpec)>,
    Option<(&'static str, &'static str)>,
);

fn path(p: &'static [&'static str]) -> impl Fn(&mut ClusterSpec) {
    move |s: &mut ClusterSpec| s.upgrade.path = p.iter().map(|v| (*v).to_owned()).collect()
}

/// The control plane's rules: skips, `upgrade.path`, downgrades.
fn server_cases() -> Vec<Case> {
    vec![
        (
            "patch bump",
            &[V33, V33, V33],
            "v1.33.5+k3s1",
            Box::new(|_| {}),
            None,
        ),
        (
            "one minor",
            &[SAFE33, SAFE33, SAFE33],
            V34,
            Box::new(|_| {}),
            None,
        ),
        (
            "same version",
            &[V33, V33, V33],
            V33,
            Box::new(|_| {}),
            None,
        ),
        (
            "mid-roll, same target",
            &[SAFE33, V34, V34],
            V34,
            Box::new(|_| {}),
            None,
        ),
        (
            "skipped minor",
            &["v1.32.3+k3s1"; 3],
            V34,
            Box::new(|_| {}),
            Some(("k3s.version", "Set k3s.version to a v1.33 release first")),
        ),
        (
            "skipped minor listed in upgrade.path",
            &["v1.32.3+k3s1"; 3],
            V34,
            Box::new(path(&[SAFE33])),
            None,
        ),
        (
            "path listing another minor",
            &["v1.32.3+k3s1"; 3],
            V34,
            Box::new(path(&["v1.32.9+k3s1"])),
            Some(("k3s.version", "missing: v1.33")),
        ),
        (
            "path entry not below the target",
            &[V33; 3],
            V34,
            Box::new(path(&["v1.34.1+k3s1"])),
            Some(("upgrade.path[0]", "not below k3s.version")),
        ),
        (
            "path going down",
            &["v1.31.0+k3s1"; 3],
            V34,
            Box::new(path(&["v1.33.1+k3s1", "v1.32.1+k3s1"])),
            Some(("upgrade.path[1]", "must go up")),
        ),
        (
            "four minors at once",
            &["v1.30.0+k3s1"; 3],
            V34,
            Box::new(path(&["v1.31.0+k3s1", "v1.32.0+k3s1", "v1.33.0+k3s1"])),
            Some(("k3s.version", "at most 3 minors per change")),
        ),
        (
            "downgrade",
            &[V34, V34, V34],
            V33,
            Box::new(|_| {}),
            Some((
                "k3s.version",
                "restore the etcd snapshot taken before the upgrade",
            )),
        ),
        (
            "reverting mid-roll is a downgrade",
            &[V33, V33, V34],
            V33,
            Box::new(|_| {}),
            Some(("k3s.version", "which server cp2 runs")),
        ),
        (
            "an older k3s build of the same release",
            &["v1.33.4+k3s2"; 3],
            V33,
            Box::new(|_| {}),
            Some(("k3s.version", "does not support downgrading")),
        ),
    ]
}

/// The worker pools' and the control-plane override's rules.
fn pool_cases() -> Vec<Case> {
    vec![
        (
            "worker pool above the servers",
            &[V33; 3],
            V33,
            Box::new(|s| s.worker_pools[1].k3s_version = Some(V34.into())),
            Some((
                "worker_pools.gpu.k3s_version",
                "must not be newer than kube-apiserver",
            )),
        ),
        (
            "worker pool four minors below",
            &[V33; 3],
            V33,
            Box::new(|s| s.worker_pools[1].k3s_version = Some("v1.29.0+k3s1".into())),
            Some(("worker_pools.gpu.k3s_version", "set it to v1.30 or newer")),
        ),
        (
            "worker pool three minors below",
            &[V33; 3],
            V33,
            Box::new(|s| s.worker_pools[1].k3s_version = Some("v1.30.0+k3s1".into())),
            Some((
                "worker_pools.gpu.k3s_version",
                "kubelets are not downgraded",
            )),
        ),
        (
            "control-plane override differing",
            &[V33; 3],
            V33,
            Box::new(|s| s.control_plane.k3s_version = Some(V34.into())),
            Some((
                "control_plane.k3s_version",
                "remove control_plane.k3s_version",
            )),
        ),
        (
            "control-plane override equal",
            &[V33; 3],
            V33,
            Box::new(|s| s.control_plane.k3s_version = Some(V33.into())),
            None,
        ),
    ]
}

/// etcd 3.5 → 3.6 only from v3.5.26 (audit day2-fidelity-4 finding 2; etcd-io/etcd#20995,
/// k3s-io/k3s#13271, #13493).
fn etcd_cases() -> Vec<Case> {
    vec![
        (
            "v1.33.4 (etcd 3.5.21) straight to v1.34 (etcd 3.6)",
            &[V33; 3],
            V34,
            Box::new(|_| {}),
            Some((
                "k3s.version",
                "server cp0 runs v1.33.4+k3s1, which bundles etcd v3.5.21: a new etcd 3.6 member joins only a cluster on etcd v3.5.26 or newer",
            )),
        ),
        (
            "the fix is named: the first safe v1.33 release, through upgrade.path",
            &[V33; 3],
            V34,
            Box::new(|_| {}),
            Some((
                "k3s.version",
                "Roll the servers to v1.33.7+k3s3 (etcd v3.5.26) or a later v1.33 release first: set k3s.version to it, or list it in upgrade.path",
            )),
        ),
        (
            "one old server left is enough to refuse",
            &[SAFE33, SAFE33, "v1.33.1+k3s1"],
            V34,
            Box::new(|_| {}),
            Some(("k3s.version", "server cp2 runs v1.33.1+k3s1")),
        ),
        (
            "through the safe patch in upgrade.path",
            &[V33; 3],
            V34,
            Box::new(path(&[SAFE33])),
            None,
        ),
        (
            "mid-way through the safe patch",
            &[V33, SAFE33, SAFE33],
            V34,
            Box::new(path(&[SAFE33])),
            None,
        ),
        (
            "a patch roll to the safe release",
            &[V33; 3],
            SAFE33,
            Box::new(|_| {}),
            None,
        ),
        (
            "a later v1.33 release not in the table is after the fix",
            &["v1.33.9+k3s1"; 3],
            "v1.34.6+k3s1",
            Box::new(|_| {}),
            None,
        ),
        (
            "an earlier build of the same patch is before it",
            &["v1.33.7+k3s1"; 3],
            V34,
            Box::new(|_| {}),
            Some(("k3s.version", "which bundles an etcd older than v3.5.26")),
        ),
        (
            "a path whose v1.33 entry predates the fix",
            &["v1.32.3+k3s1"; 3],
            V34,
            Box::new(path(&[V33])),
            Some((
                "k3s.version",
                "the servers come to it from upgrade.path's v1.33.4+k3s1, which bundles etcd v3.5.21",
            )),
        ),
    ]
}

#[test]
fn the_gate_refuses_skips_downgrades_and_skewed_pools_naming_the_field() {
    let cases = server_cases()
        .into_iter()
        .chain(pool_cases())
        .chain(etcd_cases());
    for (what, servers, to, edit, want) in cases {
        let mut s = spec(to);
        edit(&mut s);
        let got = fields(gate(&s, &cluster(servers, V33.min(servers[0]))));
        match want {
            None => assert!(got.is_empty(), "{what}: refused {got:?}"),
            Some((field, words)) => assert!(
                got.iter().any(|(f, m)| f == field && m.contains(words)),
                "{what}: want {field} with {words:?}, got {got:?}"
            ),
        }
    }
}

#[test]
fn a_cluster_whose_nodes_report_no_version_passes_the_spec_only_rules() {
    let mut s = spec(V34);
    assert_eq!(gate(&s, &[]), Ok(()));
    s.worker_pools[0].k3s_version = Some("v1.35.0+k3s1".into());
    assert_eq!(
        fields(gate(&s, &[]))[0].0,
        "worker_pools.workers.k3s_version"
    );
}

fn rolling_to(p: &Progress, pool: &str) -> String {
    p.pools
        .iter()
        .find(|v| v.pool == pool)
        .map(|v| v.rolling_to.clone())
        .unwrap()
}

#[test]
fn workers_keep_their_version_until_every_ready_server_runs_the_target() {
    let s = spec(V34);
    // Nothing rolled yet; one server rolled; all but a NotReady old one... each holds workers.
    for servers in [&[V33, V33, V33][..], &[V33, V33, V34], &[V33, V34, V34]] {
        let p = progress(&s, &cluster(servers, V33), now(), None);
        assert_eq!(rolling_to(&p, "control-plane"), V34);
        assert_eq!(rolling_to(&p, "workers"), V33, "{servers:?}");
        assert_eq!(rolling_to(&p, "gpu"), V33, "{servers:?}");
        assert_eq!(p.upgrade.as_ref().unwrap().phase, Phase::ControlPlane);
        assert_eq!(p.upgrade.as_ref().unwrap().from, V33);
        // The effective spec pins them: old members are not drifted, new ones get V33.
        let e = effective_spec(&s, &p);
        for (role, pool) in e.pools().skip(1) {
            assert_eq!(e.k3s_version(pool), V33);
            let mut old = s.clone();
            old.k3s.version = V33.into();
            assert_eq!(
                e.pool_hash(role, pool),
                old.pool_hash(role, old.pool(&pool.name).unwrap().1),
                "a held pool hashes as before the edit"
            );
        }
    }
}

#[test]
fn worker_pools_roll_in_spec_order_one_at_a_time_once_the_servers_are_done() {
    let s = spec(V34);
    let mut nodes = cluster(&[V34, V34, V34], V33);
    let p = progress(&s, &nodes, now(), None);
    assert_eq!(p.upgrade.as_ref().unwrap().phase, Phase::Workers);
    assert_eq!(rolling_to(&p, "workers"), V34);
    assert_eq!(rolling_to(&p, "gpu"), V33);
    assert!(
        findings(&p)
            .iter()
            .any(|f| f.contains("\"gpu\" stays at v1.33.4+k3s1")
                && f.contains("before it are done (upgrade.worker_pool_concurrency 1)"))
    );
    // The first pool half done: still the only one.
    nodes[3].kubelet_version = Some(V34.into());
    let p = progress(&s, &nodes, now(), None);
    assert_eq!(
        (rolling_to(&p, "workers"), rolling_to(&p, "gpu")),
        (V34.into(), V33.into())
    );
    // Its last old Node being removed: done, the next pool goes.
    nodes[4]
        .annotations
        .insert(REMOVING_ANNOTATION.into(), "rolling".into());
    let p = progress(&s, &nodes, now(), None);
    assert_eq!(
        (rolling_to(&p, "workers"), rolling_to(&p, "gpu")),
        (V34.into(), V34.into())
    );
    // Two at a time: both at once.
    let mut s2 = s.clone();
    s2.upgrade.worker_pool_concurrency = 2;
    let p = progress(&s2, &cluster(&[V34, V34, V34], V33), now(), None);
    assert_eq!(
        (rolling_to(&p, "workers"), rolling_to(&p, "gpu")),
        (V34.into(), V34.into())
    );
    // Everything at the target: no upgrade under way.
    let p = progress(&s, &cluster(&[V34, V34, V34], V34), now(), None);
    assert_eq!(p.upgrade, None);
    assert!(findings(&p).is_empty());
}

#[test]
fn a_not_ready_old_server_does_not_hold_the_workers_but_a_ready_one_does() {
    let s = spec(V34);
    let mut nodes = cluster(&[V34, V34, V34], V33);
    nodes[0].kubelet_version = Some(V33.into());
    assert_eq!(
        rolling_to(&progress(&s, &nodes, now(), None), "workers"),
        V33
    );
    nodes[0].readiness = NodeReadiness::NotReady { since: now() };
    assert_eq!(
        rolling_to(&progress(&s, &nodes, now(), None), "workers"),
        V34
    );
}

#[test]
fn the_servers_walk_the_path_one_minor_at_a_time() {
    let mut s = spec(V34);
    s.upgrade.path = vec!["v1.33.4+k3s1".into()];
    let p = progress(
        &s,
        &cluster(&["v1.32.3+k3s1"; 3], "v1.32.3+k3s1"),
        now(),
        None,
    );
    assert_eq!(rolling_to(&p, "control-plane"), "v1.33.4+k3s1");
    assert_eq!(rolling_to(&p, "workers"), "v1.32.3+k3s1");
    let p = progress(
        &s,
        &cluster(&[V33, V33, "v1.32.3+k3s1"], "v1.32.3+k3s1"),
        now(),
        None,
    );
    assert_eq!(rolling_to(&p, "control-plane"), "v1.33.4+k3s1");
    let p = progress(&s, &cluster(&[V33; 3], "v1.32.3+k3s1"), now(), None);
    assert_eq!(rolling_to(&p, "control-plane"), V34);
    assert_eq!(rolling_to(&p, "workers"), "v1.32.3+k3s1");
}

#[test]
fn the_record_keeps_from_and_start_while_the_target_stays() {
    let s = spec(V34);
    let first = progress(&s, &cluster(&[V33; 3], V33), now(), None);
    let u = first.upgrade.clone().unwrap();
    assert_eq!(
        (u.from.as_str(), u.to.as_str(), u.started_at),
        (V33, V34, now())
    );
    let later = now() + Duration::minutes(5);
    let next = progress(&s, &cluster(&[V34; 3], V33), later, Some(&u));
    let n = next.upgrade.unwrap();
    assert_eq!(
        (n.from.as_str(), n.started_at, n.phase),
        (V33, now(), Phase::Workers)
    );
    // A new target starts a new record.
    let s2 = spec("v1.34.2+k3s1");
    let n = progress(&s2, &cluster(&[V34; 3], V34), later, Some(&u))
        .upgrade
        .unwrap();
    assert_eq!((n.from.as_str(), n.started_at), (V34, later));
}

#[test]
fn a_new_pool_with_no_nodes_gets_what_the_servers_run_while_they_roll() {
    let s = spec(V34);
    let nodes: Vec<Node> = cluster(&[V33, V34, V34], V33)
        .into_iter()
        .filter(|n| !n.name.starts_with("gpu"))
        .collect();
    let p = progress(&s, &nodes, now(), None);
    assert_eq!(rolling_to(&p, "gpu"), V33);
}

#[test]
fn the_etcd_table_knows_each_simulated_release_and_infers_the_rest_safely() {
    use etcd::{BundledEtcd, bundled_etcd};
    let v = |s: &str| bundled_etcd(&K3sVersion::parse(s).unwrap());
    assert_eq!(v(V33), BundledEtcd::Exact((3, 5, 21)));
    assert_eq!(v(SAFE33), BundledEtcd::Exact((3, 5, 26)));
    assert_eq!(v(V34), BundledEtcd::Exact((3, 6, 5)));
    assert_eq!(v("v1.35.0+k3s1"), BundledEtcd::AtLeast36);
    assert_eq!(v("v1.33.8+k3s1"), BundledEtcd::Safe35);
    assert_eq!(v("v1.33.6+k3s1"), BundledEtcd::Before3526);
    assert_eq!(v("v1.32.9+k3s1"), BundledEtcd::Before3526);
    assert!(!v(V33).may_take_36() && v(SAFE33).may_take_36() && v(V34).is_36());
}
