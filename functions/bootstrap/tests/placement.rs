//! Issue 34 §3: our pods run on servers only, and `--dedicated-servers` keeps tenant pods off
//! them. The simulator's real kube-scheduler places every pod; the tests read where it bound
//! them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Env, env};
use serde_json::{Value, json};

const SERVERS: &str = "demo-control-plane-";
const WORKERS: &str = "demo-workers-";
/// The webhook's namespace.
const NS: &str = "kube-system";
/// The reconcile CronJob's and its Jobs' namespace.
const JOBS: &str = "oxide-controller-jobs";

/// Many copies of our pods, more than there are servers, so a placement that ignored the
/// servers-only rule would spread some onto workers: the webhook Deployment at `replicas` and
/// `jobs` Jobs from the CronJob's template (as `kubectl create job --from`).
async fn start_many_of_ours(env: &Env, replicas: u32, jobs: u32) {
    let kube = env.sim.kube();
    kube.merge_patch(
        "apps/v1",
        "Deployment",
        Some(NS),
        "oxide-controller-webhook",
        &json!({"spec": {"replicas": replicas}}),
    )
    .await
    .unwrap();
    let cron = kube
        .get("batch/v1", "CronJob", Some(JOBS), "oxide-controller")
        .await
        .expect("the CronJob");
    for i in 0..jobs {
        kube.apply(json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("placed-{i}"), "namespace": JOBS},
            "spec": cron["spec"]["jobTemplate"]["spec"].clone()}))
            .await
            .unwrap();
    }
}

/// A tenant Deployment in `default`, tolerating nothing special.
async fn start_tenant(env: &Env, replicas: u32) {
    env.sim
        .kube()
        .apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "tenant", "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "tenant"}},
                "template": {"metadata": {"labels": {"app": "tenant"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}))
        .await
        .unwrap();
}

/// The node each pod of `namespaces` matching `select` was bound to, once `want` of them are
/// bound (two minutes at most).
async fn bound(
    env: &Env,
    namespaces: &[&str],
    want: usize,
    select: impl Fn(&Value) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut pods = Vec::new();
        for ns in namespaces {
            pods.extend(env.sim.kube().list("v1", "Pod", Some(ns)).await);
        }
        let nodes: Vec<String> = pods
            .iter()
            .filter(|p| select(p))
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
            .collect();
        if nodes.len() >= want {
            return nodes;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {want} pods were bound: {nodes:?}",
            nodes.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn ours(p: &Value) -> bool {
    let labels = &p["metadata"]["labels"];
    labels["app.kubernetes.io/name"] == "oxide-controller"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_pods_are_bound_only_to_servers_though_workers_have_room() {
    let env = env().await;
    env.run_ok(&["--control-planes", "1", "--workers", "2"])
        .await;
    start_many_of_ours(&env, 4, 3).await;
    let nodes = bound(&env, &[NS, JOBS], 7, ours).await;
    assert!(
        nodes.iter().all(|n| n.starts_with(SERVERS)),
        "our pods went to {nodes:?}"
    );
    // Tenant pods still use the servers too: nothing taints them by default.
    start_tenant(&env, 6).await;
    let tenant = bound(&env, &["default"], 6, |p| {
        p["metadata"]["labels"]["app"] == "tenant"
    })
    .await;
    assert!(tenant.iter().any(|n| n.starts_with(WORKERS)), "{tenant:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedicated_servers_keep_tenant_pods_off_them_and_ours_on_them() {
    let env = env().await;
    env.run_ok(&[
        "--control-planes",
        "1",
        "--workers",
        "2",
        "--dedicated-servers",
    ])
    .await;
    let server = env
        .sim
        .kube()
        .list("v1", "Node", None)
        .await
        .into_iter()
        .find(|n| {
            n["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(SERVERS))
        })
        .expect("a server Node");
    assert_eq!(
        server["spec"]["taints"],
        json!([{"key": "CriticalAddonsOnly", "value": "true", "effect": "NoExecute"}]),
        "the server registered with k3s's dedicated-server taint"
    );
    start_tenant(&env, 6).await;
    let tenant = bound(&env, &["default"], 6, |p| {
        p["metadata"]["labels"]["app"] == "tenant"
    })
    .await;
    assert!(
        tenant.iter().all(|n| n.starts_with(WORKERS)),
        "tenant pods went to {tenant:?}"
    );
    start_many_of_ours(&env, 2, 2).await;
    let nodes = bound(&env, &[NS, JOBS], 4, ours).await;
    assert!(
        nodes.iter().all(|n| n.starts_with(SERVERS)),
        "our pods went to {nodes:?}"
    );
}
