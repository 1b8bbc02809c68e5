#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Issue 23 figures (prints, asserts nothing): how fast pending pods get capacity when the
//! webhook triggers the run, on a real control plane (kube-apiserver, scheduler, controllers,
//! KWOK) and the simulated rack. Each trial: a fresh 1 + 1 cluster, the workers autoscaling
//! (max 6), `scale serve` watching, the CronJob suspended (so nothing but the webhook starts a
//! run); then a Deployment of 10 pods of 900m (the two nodes hold four) and the time to
//! (a) the reconcile Job's creation, (b) the first instance create on the rack, (c) all ten
//! pods Running. The simulator's instance timings are its defaults (printed); a real VM's
//! boot and k3s join add their own minutes to (c), never to (a) or (b).
//!
//! Run: `cargo bench -p reconcile-once --bench pending` (5 trials; `OXIDE_BENCH_SHORT=1`: 2).

use std::time::Duration;

use oxide_sim::SimHandle;
use tokio::time::Instant;

#[path = "../tests/support/pending.rs"]
mod support;
use support::{Webhook, cluster, creates, deployment};

async fn job_created(sim: &SimHandle) -> bool {
    !sim.kube()
        .list("batch/v1", "Job", Some("oxide-controller-jobs"))
        .await
        .is_empty()
}

async fn running(sim: &SimHandle, app: &str) -> usize {
    sim.kube()
        .list("v1", "Pod", Some("default"))
        .await
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == app && p["status"]["phase"] == "Running")
        .count()
}

async fn trial() -> (Duration, Duration, Duration) {
    let (sim, token) = cluster(true, 6).await;
    let webhook = Webhook::start(&sim, &token).await;
    webhook.wait_watching().await;
    sim.oxide().reset_counters();
    let start = Instant::now();
    deployment(&sim, "web", 10, "900m").await;
    let (mut job, mut create) = (None, None);
    loop {
        if job.is_none() && job_created(&sim).await {
            job = Some(start.elapsed());
        }
        if create.is_none() && creates(&sim) > 0 {
            create = Some(start.elapsed());
        }
        if running(&sim, "web").await == 10 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "pods not all Running after 5 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all = start.elapsed();
    drop(webhook);
    (job.unwrap_or(all), create.unwrap_or(all), all)
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    format!("median {:.1?}, max {:.1?}", v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    let trials = if std::env::var_os("OXIDE_BENCH_SHORT").is_some() {
        2
    } else {
        5
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let t = oxide_sim::oxide::Timings::default();
    println!(
        "pending pods → capacity, {trials} trials; simulator timings: create→starting {:?}, starting→running {:?}",
        t.create_to_starting, t.starting_to_running
    );
    let mut rows = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..trials {
        let (a, b, c) = rt.block_on(trial());
        println!(
            "  trial {}: Job {a:.1?}, first create {b:.1?}, all Running {c:.1?}",
            i + 1
        );
        rows.0.push(a);
        rows.1.push(b);
        rows.2.push(c);
    }
    println!(
        "(a) Deployment → reconcile Job created:   {}",
        summary(rows.0)
    );
    println!(
        "(b) Deployment → first instance create:   {}   (target ≤ 15 s, median ≤ 10 s)",
        summary(rows.1)
    );
    println!(
        "(c) Deployment → all 10 pods Running:     {}",
        summary(rows.2)
    );
}
