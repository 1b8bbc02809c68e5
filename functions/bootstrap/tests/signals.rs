//! bootstrap asked to stop (audit sim-3 K4): SIGTERM during the reconcile step ends the pass
//! at a safe point, gives the reconcile Lease back and exits 143; SIGINT twice during an
//! earlier step stops at once with 130; a re-run with the same flags then finishes the cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::env;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Starts bootstrap, sends `signal` (`times` times, 200 ms apart) once stderr shows `step`,
/// and returns the exit code, how long it took after the first signal, and stderr.
async fn signalled_at(
    env: &common::Env,
    step: &str,
    signal: &str,
    times: usize,
) -> (Option<i32>, Duration, String) {
    let mut child = env
        .command(&env.args(&[]))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap().to_string();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    let reached = tokio::time::timeout(Duration::from_secs(300), async {
        while let Ok(Some(line)) = lines.next_line().await {
            log.push_str(&line);
            log.push('\n');
            if serde_json::from_str::<Value>(&line).is_ok_and(|v| v["step"] == step) {
                return true;
            }
        }
        false
    })
    .await
    .expect("step reached in time");
    assert!(reached, "bootstrap never reached {step}:\n{log}");
    let asked = tokio::time::Instant::now();
    for i in 0..times {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let sent = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(sent.success());
    }
    let rest = async {
        while let Ok(Some(line)) = lines.next_line().await {
            log.push_str(&line);
            log.push('\n');
        }
        child.wait().await.unwrap()
    };
    let status = tokio::time::timeout(Duration::from_secs(60), rest)
        .await
        .expect("bootstrap stopped within 60 s");
    (status.code(), asked.elapsed(), log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_stops_on_sigterm_and_sigint_and_a_rerun_finishes() {
    let env = env().await;

    // Twice Ctrl-C while waiting for the API: stop at once.
    let (code, took, log) = signalled_at(&env, "wait-api", "-INT", 2).await;
    assert_eq!(code, Some(130), "{log}");
    assert!(took < Duration::from_secs(5), "{took:?}\n{log}");
    assert!(log.contains("bootstrap stopped by SIGINT"), "{log}");

    // SIGTERM in the reconcile step: the pass stops, the Lease is given back.
    let (code, took, log) = signalled_at(&env, "reconcile", "-TERM", 1).await;
    assert_eq!(code, Some(143), "{log}");
    assert!(took < Duration::from_secs(20), "{took:?}\n{log}");
    assert!(log.contains("bootstrap stopped by SIGTERM"), "{log}");
    let lease = env
        .sim
        .kube()
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-system"),
            "oxide-controller",
        )
        .await;
    assert!(
        lease
            .as_ref()
            .is_none_or(|l| l["spec"]["holderIdentity"].is_null()),
        "the reconcile Lease is left held: {lease:?}\n{log}"
    );

    // A re-run finishes the cluster.
    env.run_ok(&[]).await;
    assert_eq!(env.ready_nodes("demo-workers-").await.len(), 2);
}
