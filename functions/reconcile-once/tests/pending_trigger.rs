//! Issue 23: pending pods start a reconcile within seconds. `scale serve` (the real binary)
//! watches a real control plane's pods while a pool autoscales; the real scheduler marks pods
//! unschedulable; the reconcile Jobs it starts run the real `reconcile-once` (the simulator's
//! pod runner), which creates instances on the simulated rack. The CronJob is suspended, so
//! every run here was started by the webhook.

use std::time::Duration;

use oxide_sim::SimHandle;
use serde_json::json;

#[path = "support/pending.rs"]
mod support;
use support::{Webhook, cluster, creates, deployment, wait_until};

/// Reconcile Jobs started so far: the distinct Jobs behind the pods in their namespace.
async fn jobs_run(sim: &SimHandle) -> usize {
    sim.kube()
        .list("v1", "Pod", Some("oxide-controller-jobs"))
        .await
        .iter()
        .filter_map(|p| {
            p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"]
                .as_str()
                .map(str::to_owned)
        })
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Ten pods of 900m that the one worker cannot hold: the webhook starts one run within
/// seconds (not at the next tick of the suspended CronJob) and the rack gets its first create;
/// the trigger is in the metrics, the log and `GET /status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unschedulable_pods_start_one_run_that_creates_workers() {
    let (sim, token) = cluster(true, 6).await;
    let webhook = Webhook::start(&sim, &token).await;
    webhook.wait_watching().await;
    sim.oxide().reset_counters();
    deployment(&sim, "web", 10, "900m").await;
    let took = wait_until(
        "the first instance create",
        Duration::from_secs(60),
        async || creates(&sim) > 0,
    )
    .await;
    eprintln!("Deployment created → first instance create: {took:.1?}");
    assert_eq!(
        webhook.triggers("pending_pods").await,
        1,
        "one run for the burst"
    );
    // The run writes status.json when it ends; GET /status adds what the webhook started.
    wait_until("the run's status", Duration::from_secs(60), async || {
        webhook.status().await["runId"].is_string()
    })
    .await;
    let status = webhook.status().await;
    assert_eq!(status["lastTrigger"]["reason"], "pending_pods", "{status}");
    assert!(
        status["lastTrigger"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("unschedulable pod(s): default/web-")),
        "{status}"
    );
}

/// A burst of 100 pending pods created over five seconds is one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_pending_pods_over_five_seconds_is_one_run() {
    let (sim, token) = cluster(true, 2).await;
    let webhook = Webhook::start(&sim, &token).await;
    webhook.wait_watching().await;
    for i in 0..100u32 {
        sim.kube()
            .apply(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("burst-{i}"), "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "nginx",
                    "resources": {"requests": {"cpu": "1500m"}}}]}
            }))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until("a trigger", Duration::from_secs(30), async || {
        webhook.triggers("pending_pods").await > 0
    })
    .await;
    // The window (1 s quiet, 10 s at most) has long closed: nothing more comes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(webhook.triggers("pending_pods").await, 1);
    assert_eq!(jobs_run(&sim).await, 1, "one reconcile Job");
}

/// Killing the webhook mid-watch loses nothing: pods that became pending while it was down
/// start a run once the replacement is up. A pod no pool can host starts at most one run:
/// the run names it unhostable, and neither its updates nor a restart trigger again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_webhook_resumes_and_unhostable_pods_trigger_at_most_once() {
    let (sim, token) = cluster(true, 3).await;
    let mut webhook = Webhook::start(&sim, &token).await;
    webhook.wait_watching().await;
    let _ = webhook.child.start_kill();
    let _ = webhook.child.wait().await;
    sim.oxide().reset_counters();
    // Two fit on the worker and two on the server; four stay pending.
    deployment(&sim, "while-down", 8, "900m").await;
    let webhook = Webhook::start(&sim, &token).await;
    wait_until(
        "a run for the pods that became pending while the webhook was down",
        Duration::from_secs(60),
        async || creates(&sim) > 0,
    )
    .await;
    assert_eq!(webhook.triggers("pending_pods").await, 1);

    // Larger than any worker: no pool can host it.
    sim.kube()
        .apply(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "huge", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "64"}}}]}
        }))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait_until(
        "a run for the huge pod",
        Duration::from_secs(30),
        async || webhook.triggers("pending_pods").await == 2,
    )
    .await;
    wait_until(
        "that run to name it unhostable",
        Duration::from_secs(60),
        async || {
            sim.kube()
                .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
                .await
                .and_then(|c| c["data"]["status.json"].as_str().map(str::to_owned))
                .is_some_and(|s| s.contains("default/huge"))
        },
    )
    .await;
    drop(webhook);
    let webhook = Webhook::start(&sim, &token).await;
    webhook.wait_watching().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        webhook.triggers("pending_pods").await,
        0,
        "an unhostable pod does not start a run again"
    );
}

/// With no pool autoscaling the webhook opens no watch and starts nothing for pending pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_pool_autoscales_no_watch_and_no_trigger() {
    let (sim, token) = cluster(false, 6).await;
    let webhook = Webhook::start(&sim, &token).await;
    // The webhook has read the spec at least once (it answers) and rechecks every second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sim.kube().reset_counters();
    sim.oxide().reset_counters();
    deployment(&sim, "web", 10, "900m").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!webhook.watching().await);
    assert_eq!(webhook.triggers("pending_pods").await, 0);
    let pod_reads = sim
        .kube()
        .counters()
        .into_iter()
        .filter(|(k, _)| k == "GET /api/v1/pods")
        .map(|(_, n)| n)
        .sum::<u64>();
    assert_eq!(pod_reads, 0, "no list or watch of pods");
    assert_eq!(creates(&sim), 0);
}
