//! `bootstrap recover` end to end: the real binary against `oxide-sim`, after a real
//! `bootstrap` of cluster `demo` (3 servers + 2 workers).
//!
//! Checked: on a healthy cluster it says there is nothing to recover and makes no mutating
//! request; with every server stopped (the API gone) `--dry-run` names rung 1 and the starts it
//! would make, and makes none; the real run starts them, the API comes back with what was
//! written before, three servers are Ready again, and a second run has nothing to do; with no
//! server left it exits 2 naming the restore from a backup, touching nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{Env, env};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use oxide_controller::base::names;
use oxide_controller::domain::model::InstanceState;
use oxide_controller::ports::rack::Rack as _;

async fn recover(env: &Env, extra: &[&str]) -> Output {
    let token = format!("file:{}", env.dir.path().join("token").display());
    let state_dir = env.state_dir().display().to_string();
    let kubeconfig = env.kubeconfig().display().to_string();
    let mut args: Vec<String> = [
        "recover",
        "--oxide-host",
        &env.sim.oxide_host,
        "--oxide-token",
        &token,
        "--cluster",
        "demo",
        "--state-dir",
        &state_dir,
        "--kubeconfig",
        &kubeconfig,
        "--log-format",
        "json",
        "--api-timeout",
        "120",
        "--wait",
        "240",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
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

/// Mutating Oxide requests made while `f` ran.
async fn mutating_during<F: std::future::Future<Output = Output>>(
    env: &Env,
    f: F,
) -> (Output, Vec<(String, u64)>) {
    let before = env.mutating_calls();
    let out = f.await;
    let after = env.mutating_calls();
    let made = after
        .into_iter()
        .filter(|(k, n)| before.iter().find(|(b, _)| b == k).map_or(0, |(_, m)| *m) < *n)
        .collect();
    (out, made)
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
    let (out, made) = mutating_during(&env, recover(&env, &[])).await;
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

    let (out, made) = mutating_during(&env, recover(&env, &["--dry-run"])).await;
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
    let (out, made) = mutating_during(&env, recover(&env, &[])).await;
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
        let (out, made) = mutating_during(&env, recover(&env, extra)).await;
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("rung 3") && stderr.contains("backup"),
            "{stderr}"
        );
        assert_eq!(made, vec![], "{extra:?} changed the rack");
    }
}
