//! `bootstrap recover` end to end: the real binary against `oxide-sim`, after a real
//! `bootstrap` of cluster `demo` (3 servers + 2 workers).
//!
//! Checked: on a healthy cluster it says there is nothing to recover and makes no mutating
//! request; with every server stopped (the API gone) `--dry-run` names rung 1 and the starts it
//! would make, and makes none; the real run starts them, the API comes back with what was
//! written before, three servers are Ready again, and a second run has nothing to do; with no
//! server left it exits 2 naming the restore from a backup, touching nothing.
//!
//! With two of three servers stopped, etcd (one real member per server in the simulator) has
//! no quorum and the API stops answering; rung 1 starts them and nothing is lost. With only
//! one server left (the others deleted, the API address's holder among them), rung 2 is
//! named by `--dry-run`, refused without `--yes`, and with `--yes` resets k3s on the survivor
//! over SSH: the data is kept, the deleted servers' Nodes go, and three servers and three
//! voting etcd members are back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{Env, env};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use oxide_controller::adapters::resume;
use oxide_controller::base::names;
use oxide_controller::domain::model::InstanceState;
use oxide_controller::ports::rack::Rack as _;

async fn recover(env: &Env, extra: &[&str]) -> Output {
    let mut with = vec!["--api-timeout", "120", "--wait", "240"];
    with.extend_from_slice(extra);
    let args = env.sub_args("recover", "demo", &with);
    tokio::time::timeout(Duration::from_secs(420), env.command(&args).output())
        .await
        .expect("recover finished within 420 s")
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn servers(env: &Env) -> Vec<(String, InstanceState)> {
    env.rack("demo")
        .list_instances(&names::cluster_prefix("demo"))
        .await
        .unwrap()
        .into_iter()
        .filter(|i| {
            names::InstanceTag::parse(&i.description).is_some_and(|t| t.pool == "control-plane")
        })
        .map(|i| (i.name, i.state))
        .collect()
}

async fn wait_states(env: &Env, want: InstanceState) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = servers(env).await;
        if s.iter().all(|(_, st)| *st == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "servers never all {want:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_stopped_is_recovered_by_starting_them_and_nothing_is_lost() {
    let env = env().await;
    env.run_ok(&[]).await;
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("written-before".into());
    cm.data = Some([("k".to_owned(), "v".to_owned())].into());
    cms.create(&PostParams::default(), &cm).await.unwrap();

    // Rung 0: healthy, nothing touched.
    let (out, made) = env.mutating_during(recover(&env, &[])).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("rung 0") && stdout.contains("nothing to recover"),
        "{stdout}"
    );
    assert_eq!(made, vec![], "a healthy cluster's recover changed the rack");

    // Every server stopped: the API address has nothing behind it.
    let rack = env.rack("demo");
    let names: Vec<String> = servers(&env).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for n in &names {
        rack.stop_instance(n).await.unwrap();
    }
    wait_states(&env, InstanceState::Stopped).await;

    let (out, made) = env.mutating_during(recover(&env, &["--dry-run"])).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("rung 1"), "{stdout}");
    for n in &names {
        assert!(
            stdout.contains(&format!("POST /v1/instances/{n}/start?project=demo")),
            "{stdout}"
        );
    }
    assert_eq!(made, vec![], "--dry-run changed the rack");
    assert!(
        servers(&env)
            .await
            .iter()
            .all(|(_, s)| *s == InstanceState::Stopped)
    );

    // The real run.
    let started = Instant::now();
    let out = recover(&env, &[]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Reconcile: converged"), "{stdout}");
    eprintln!(
        "recover (rung 1) took {:.1}s: {stdout}",
        started.elapsed().as_secs_f64()
    );
    let back = cms.get("written-before").await.unwrap();
    assert_eq!(back.data.unwrap()["k"], "v");
    let ready = env.ready_nodes("demo-control-plane-").await;
    assert_eq!(ready.len(), 3, "{ready:?}");
    // No server was replaced: the same three run.
    let mut now: Vec<String> = servers(&env).await.into_iter().map(|(n, _)| n).collect();
    let mut was = names.clone();
    now.sort();
    was.sort();
    assert_eq!(now, was);

    // And again: nothing to do, nothing touched.
    let (out, made) = env.mutating_during(recover(&env, &[])).await;
    let (stdout, _) = text(&out);
    assert!(
        out.status.success() && stdout.contains("nothing to recover"),
        "{stdout}"
    );
    assert_eq!(made, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_left_exits_2_naming_the_restore_and_touches_nothing() {
    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let rack = env.rack("demo");
    let names: Vec<String> = servers(&env).await.into_iter().map(|(n, _)| n).collect();
    for n in &names {
        rack.stop_instance(n).await.unwrap();
    }
    wait_states(&env, InstanceState::Stopped).await;
    for n in &names {
        rack.delete_instance(n).await.unwrap();
    }
    for dry in [true, false] {
        let extra: &[&str] = if dry { &["--dry-run"] } else { &[] };
        let (out, made) = env.mutating_during(recover(&env, extra)).await;
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("rung 3") && stderr.contains("backup"),
            "{stderr}"
        );
        assert_eq!(made, vec![], "{extra:?} changed the rack");
    }
}

/// A ConfigMap `written-before` in `default`, through the kubeconfig bootstrap wrote.
async fn write_marker(env: &Env) -> Api<ConfigMap> {
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("written-before".into());
    cm.data = Some([("k".to_owned(), "v".to_owned())].into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms
}

/// Lists namespaces through the kubeconfig, giving up after 10 s.
async fn list_namespaces(env: &Env) -> Result<usize, String> {
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    match tokio::time::timeout(Duration::from_secs(10), ns.list(&Default::default())).await {
        Ok(Ok(l)) => Ok(l.items.len()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 10 s".into()),
    }
}

/// The cluster's etcd members as etcd lists them: (voters, learners).
async fn etcd_members(env: &Env) -> (usize, usize) {
    let real = env.sim.boot().real_clusters()[0].clone();
    let members = real.control_plane.etcd().members().await.unwrap();
    let learners = members.iter().filter(|m| m.is_learner).count();
    (members.len() - learners, learners)
}

/// Node names of the cluster (any state).
async fn node_names(env: &Env) -> Vec<String> {
    env.sim
        .kube()
        .list("v1", "Node", None)
        .await
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// Stops `names` and waits until they are stopped.
async fn stop_all(env: &Env, names: &[String]) {
    let rack = env.rack("demo");
    for n in names {
        rack.stop_instance(n).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = servers(env).await;
        if s.iter()
            .filter(|(n, _)| names.contains(n))
            .all(|(_, st)| *st == InstanceState::Stopped)
        {
            return;
        }
        assert!(Instant::now() < deadline, "never stopped: {s:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The end state every recovery must reach: the marker, three Ready servers, three voting
/// members and no learner, and a second recover that has nothing to do and touches nothing.
async fn assert_recovered(env: &Env, cms: &Api<ConfigMap>) {
    let back = cms.get("written-before").await.unwrap();
    assert_eq!(back.data.unwrap()["k"], "v");
    let ready = env.ready_nodes("demo-control-plane-").await;
    assert_eq!(ready.len(), 3, "{ready:?}");
    assert_eq!(servers(env).await.len(), 3);
    assert_eq!(
        etcd_members(env).await,
        (3, 0),
        "3 voting members, no learner"
    );
    let (out, made) = env.mutating_during(recover(env, &[])).await;
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout.contains("nothing to recover"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(made, vec![], "a second recover changed the rack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_servers_stopped_lose_quorum_and_recover_starts_them() {
    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let cms = write_marker(&env).await;
    assert_eq!(etcd_members(&env).await, (3, 0));

    // Two servers stop, not the API address's holder: its apiserver still answers TCP, but
    // its etcd member is one voter of three.
    let state = env.state_dir().join("demo.json");
    let first = resume::load_for_cluster(&state, "demo")
        .unwrap()
        .unwrap()
        .first_control_plane;
    let others: Vec<String> = servers(&env)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| *n != first)
        .collect();
    assert_eq!(others.len(), 2, "{others:?}");
    stop_all(&env, &others).await;
    let stopped = Instant::now();
    let failed = loop {
        match list_namespaces(&env).await {
            Err(why) => break why,
            Ok(_) if stopped.elapsed() > Duration::from_secs(60) => {
                panic!("the API still answers 60 s after two of three servers stopped")
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    eprintln!(
        "the API stopped answering {:.1}s after the stops: {failed}",
        stopped.elapsed().as_secs_f64()
    );

    let (out, made) = env.mutating_during(recover(&env, &["--dry-run"])).await;
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout.contains("rung 1"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(made, vec![], "--dry-run changed the rack");

    let started = Instant::now();
    let out = recover(&env, &[]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("rung 1") && stdout.contains("Reconcile: converged"),
        "{stdout}"
    );
    eprintln!(
        "recover (rung 1, 2 of 3 stopped) took {:.1}s: {stdout}",
        started.elapsed().as_secs_f64()
    );
    assert_recovered(&env, &cms).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_left_is_recovered_by_a_cluster_reset_on_it_and_nothing_is_lost() {
    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let cms = write_marker(&env).await;

    // The first server (the API address's holder) and one more are lost with their disks.
    let state = env.state_dir().join("demo.json");
    let first = resume::load_for_cluster(&state, "demo")
        .unwrap()
        .unwrap()
        .first_control_plane;
    let mut names: Vec<String> = servers(&env).await.into_iter().map(|(n, _)| n).collect();
    names.sort();
    let lost: Vec<String> = std::iter::once(first.clone())
        .chain(names.iter().filter(|n| **n != first).take(1).cloned())
        .collect();
    let survivor = names.iter().find(|n| !lost.contains(n)).unwrap().clone();
    stop_all(&env, &lost).await;
    let rack = env.rack("demo");
    for n in &lost {
        rack.delete_instance(n).await.unwrap();
    }
    assert!(
        list_namespaces(&env).await.is_err(),
        "the API still answers"
    );

    // --dry-run: rung 2, every call named, none made.
    let (out, made) = env.mutating_during(recover(&env, &["--dry-run"])).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("rung 2")
            && stdout.contains(&format!(
                "ssh {survivor} (pinned host keys): sudo -n k3s server --cluster-reset"
            ))
            && stdout.contains(&format!(
                "ssh {survivor} (pinned host keys): sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml"
            ))
            && stdout.contains(&format!(
                "/v1/floating-ips/demo-apiserver/attach?project=demo to {survivor}"
            )),
        "{stdout}"
    );
    assert_eq!(made, vec![], "--dry-run changed the rack");

    // Without --yes: exit 2, saying what it would do and naming --yes; nothing touched.
    let (out, made) = env.mutating_during(recover(&env, &[])).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("rung 2") && stderr.contains("--yes") && stderr.contains(&survivor),
        "{stderr}"
    );
    assert_eq!(made, vec![], "recover without --yes changed the rack");
    assert!(
        list_namespaces(&env).await.is_err(),
        "the API answers untouched"
    );

    // --yes: the cluster reset.
    let started = Instant::now();
    let out = recover(&env, &["--yes"]).await;
    let total = started.elapsed();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("rung 2") && stdout.contains("Reconcile: converged"),
        "{stdout}"
    );
    let readyz = stdout
        .lines()
        .find(|l| l.starts_with("The API was ready"))
        .unwrap_or("no /readyz line");
    eprintln!(
        "recover --yes (rung 2): {readyz} Total {:.1}s.",
        total.as_secs_f64()
    );
    // The reset ran on the survivor, over SSH, as k3s documents it.
    let logs = common::log_lines(&out.stderr);
    assert!(
        logs.iter()
            .any(|l| l["message"] == "etcd is a single member with all its data"),
        "{stderr}"
    );
    // The lost servers' Nodes are gone, the survivor is one of the three servers.
    let nodes = node_names(&env).await;
    for n in &lost {
        assert!(!nodes.contains(n), "Node {n} is still there: {nodes:?}");
    }
    assert!(servers(&env).await.iter().any(|(n, _)| *n == survivor));
    // The survivor, a server that joined, keeps its token and no longer names a server.
    let saved = resume::load_for_cluster(&state, "demo").unwrap().unwrap();
    let fip = rack
        .get_floating_ip("demo-apiserver")
        .await
        .unwrap()
        .unwrap()
        .ip;
    let ssh = oxide_controller::adapters::ssh::SshTarget::new(
        std::net::SocketAddr::new(fip, common::SSH_PORT),
        "ubuntu",
        saved.key_pair().unwrap(),
        oxide_controller::adapters::ssh::HostKeyPins::new(&saved.host_key_pins[&survivor]).unwrap(),
    );
    let config = ssh
        .exec("sudo -n cat /etc/rancher/k3s/config.yaml")
        .await
        .unwrap();
    let config = String::from_utf8_lossy(&config.stdout).into_owned();
    let keys: Vec<&str> = config
        .lines()
        .filter_map(|l| l.split_once(':').map(|(k, _)| k))
        .filter(|k| !k.starts_with(' ') && !k.starts_with('-'))
        .collect();
    assert!(
        !keys.contains(&"server") && keys.contains(&"token"),
        "{keys:?}"
    );
    assert_recovered(&env, &cms).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rung_2_cut_short_after_the_reset_is_picked_up_by_the_next_run() {
    use oxide_controller::adapters::ssh::{HostKeyPins, SshTarget};

    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let cms = write_marker(&env).await;
    let state = env.state_dir().join("demo.json");
    let saved = resume::load_for_cluster(&state, "demo").unwrap().unwrap();
    let survivor = saved.first_control_plane.clone();
    let lost: Vec<String> = servers(&env)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| *n != survivor)
        .collect();
    stop_all(&env, &lost).await;
    let rack = env.rack("demo");
    for n in &lost {
        rack.delete_instance(n).await.unwrap();
    }

    // What a run killed right after the reset leaves: k3s stopped, the reset-flag written.
    let fip = rack
        .get_floating_ip("demo-apiserver")
        .await
        .unwrap()
        .unwrap()
        .ip;
    let pins = HostKeyPins::new(&saved.host_key_pins[&survivor]).unwrap();
    let ssh = SshTarget::new(
        std::net::SocketAddr::new(fip, common::SSH_PORT),
        "ubuntu",
        saved.key_pair().unwrap(),
        pins,
    );
    for cmd in [
        "sudo -n systemctl stop k3s",
        "sudo -n k3s server --cluster-reset",
    ] {
        let out = ssh.exec(cmd).await.unwrap();
        assert!(
            out.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let out = recover(&env, &["--yes"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("rung 2") && stdout.contains("Reconcile: converged"),
        "{stdout}"
    );
    // The flag proves nothing: it is deleted and the reset runs again, and only its exit 0
    // counts.
    let logs = common::log_lines(&out.stderr);
    let at = |m: &str| logs.iter().position(|l| l["message"] == m);
    let again = at(
        "the reset-flag of an earlier reset is there, which proves nothing; deleting it and resetting again",
    );
    let done = at("etcd is a single member with all its data");
    assert!(again.is_some() && done > again, "{stderr}");
    assert_recovered(&env, &cms).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rung_2_whose_reset_failed_after_writing_its_flag_deletes_nothing_and_names_the_flag() {
    use oxide_controller::adapters::ssh::{HostKeyPins, SshTarget};

    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    let state = env.state_dir().join("demo.json");
    let saved = resume::load_for_cluster(&state, "demo").unwrap().unwrap();
    let survivor = saved.first_control_plane.clone();
    let lost: Vec<String> = servers(&env)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| *n != survivor)
        .collect();
    stop_all(&env, &lost).await;
    let rack = env.rack("demo");
    for n in &lost {
        rack.delete_instance(n).await.unwrap();
    }

    // What a reset that failed once etcd was starting leaves (etcd refusing its data, k3s
    // killed): k3s stopped, the reset-flag written, the member still one of three.
    env.sim
        .faults()
        .update(|f| f.cluster_reset_fails = vec![survivor.clone()]);
    let fip = rack
        .get_floating_ip("demo-apiserver")
        .await
        .unwrap()
        .unwrap()
        .ip;
    let pins = HostKeyPins::new(&saved.host_key_pins[&survivor]).unwrap();
    let ssh = SshTarget::new(
        std::net::SocketAddr::new(fip, common::SSH_PORT),
        "ubuntu",
        saved.key_pair().unwrap(),
        pins,
    );
    assert!(
        ssh.exec("sudo -n systemctl stop k3s")
            .await
            .unwrap()
            .success()
    );
    let out = ssh
        .exec("sudo -n k3s server --cluster-reset")
        .await
        .unwrap();
    assert_eq!(
        out.exit_status,
        1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flag = "sudo -n cat /var/lib/rancher/k3s/server/db/reset-flag";
    assert!(ssh.exec(flag).await.unwrap().success(), "no reset-flag");

    // The next run does not take the flag for a finished reset: it tries again, k3s fails
    // again, and the run stops before anything is deleted or k3s started, naming the flag.
    let (out, made) = env.mutating_during(recover(&env, &["--yes"])).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("`sudo -n k3s server --cluster-reset` exited 1: ")
            && stderr.contains("etcd cluster reset failed")
            && stderr.contains("did not finish, so nothing was deleted")
            && stderr.contains("/var/lib/rancher/k3s/server/db/reset-flag")
            && stderr.contains("sudo rm"),
        "{stderr}"
    );
    assert!(
        !made.iter().any(|(k, _)| k.starts_with("DELETE ")),
        "the run deleted something: {made:?}"
    );
    let logs = common::log_lines(&out.stderr);
    assert!(
        !logs.iter().any(
            |l| l["message"] == "etcd is a single member with all its data"
                || l["message"] == "starting k3s without --cluster-reset"
        ),
        "{stderr}"
    );
    assert!(ssh.exec(flag).await.unwrap().success(), "the flag is gone");
    assert!(servers(&env).await.iter().any(|(n, _)| *n == survivor));
    assert!(
        list_namespaces(&env).await.is_err(),
        "the API answers after a failed reset"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rung_is_chosen_from_etcds_voters_not_from_the_count_bootstrap_started_with() {
    let env = env().await;
    env.run_ok(&["--workers", "1"]).await;
    // The resume file says 5 servers (bootstrapped with 5, scaled to 3 since): etcd has 3.
    let state = env.state_dir().join("demo.json");
    let mut saved = resume::load_for_cluster(&state, "demo").unwrap().unwrap();
    let mut spec =
        oxide_controller::domain::spec::ClusterSpec::from_yaml(saved.spec.as_deref().unwrap())
            .unwrap();
    spec.control_plane.count = 5;
    saved.spec = Some(spec.to_yaml());
    resume::save(&state, &saved).unwrap();

    // One server lost with its disks, one stopped, the API address's holder running: 2 of
    // etcd's 3 voters exist, a majority once the stopped one starts.
    let first = saved.first_control_plane.clone();
    let others: Vec<String> = servers(&env)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| *n != first)
        .collect();
    stop_all(&env, &others).await;
    env.rack("demo").delete_instance(&others[0]).await.unwrap();
    wait_for_api_down(&env).await;

    let (out, made) = env.mutating_during(recover(&env, &["--dry-run"])).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("rung 1")
            && stdout.contains(&format!(
                "etcd's voting members: 3, from etcd's member list ({first}'s local etcd member over SSH)"
            ))
            && stdout.contains(&format!("start {}", others[1])),
        "{stdout}"
    );
    assert_eq!(made, vec![], "--dry-run changed the rack");
}

/// Waits until the API stops answering (etcd without quorum).
async fn wait_for_api_down(env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while list_namespaces(env).await.is_ok() {
        assert!(Instant::now() < deadline, "the API still answers");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
