//! Issue 10 acceptance (VPC firewall, full rack): the Kubernetes API on the floating IP
//! answers only once bootstrap's rule admits this host; a re-run writes no rule; a rule the
//! user made before bootstrap is still there after it. On a full rack bootstrap fails at once
//! with the rack's answer instead of waiting for the API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::env;
use oxide_controller::domain::firewall::{TcpAllowRule, parse_sources};
use oxide_controller::ports::rack::Rack as _;

/// `GET https://<ip>:6443/readyz` with a short deadline: `Err(true)` for a timeout.
async fn probe_api(ip: &str) -> Result<u16, bool> {
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    match http.get(format!("https://{ip}:6443/readyz")).send().await {
        Ok(r) => Ok(r.status().as_u16()),
        Err(e) => Err(e.is_timeout()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_answers_once_the_rule_admits_us_and_a_rerun_changes_no_rule() {
    let env = env().await;
    env.sim.oxide().seed_project("demo");
    let rack = env.rack("demo");
    // The user's own rule, made before bootstrap.
    let user_rule = TcpAllowRule {
        name: "user-web".into(),
        description: "the user's web service".into(),
        port: 8080,
        sources: parse_sources("10.0.0.0/8").unwrap(),
    };
    rack.ensure_firewall_rule(&user_rule).await.unwrap();

    // A rule that does not admit this host: the API on the floating IP is dropped.
    let out = env
        .run(&[
            "--workers",
            "1",
            "--api-allow",
            "203.0.113.0/24",
            "--api-timeout",
            "25",
        ])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("wait-api") && stderr.contains("--api-allow"),
        "{stderr}"
    );
    let fip = env.dump()["floating_ips"][0]["ip"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        probe_api(&fip).await,
        Err(true),
        "dropped: a timeout, not a refusal"
    );

    // The default admits anyone: the same bootstrap goes through and the API answers.
    env.run_ok(&["--workers", "1"]).await;
    assert!(probe_api(&fip).await.is_ok());
    let rules = rack.list_firewall_rules().await.unwrap();
    assert_eq!(
        rules,
        [
            "allow-internal-inbound",
            "allow-ssh",
            "allow-icmp",
            "user-web",
            "demo-k8s-api"
        ]
    );
    // Members joined through the server's private address (the default rules admit it).
    assert_eq!(env.ready_nodes("demo-").await.len(), 4);

    // A re-run writes no rule at all.
    env.sim.oxide().reset_counters();
    env.run_ok(&["--workers", "1"]).await;
    let puts = env
        .sim
        .oxide()
        .counters()
        .get("PUT /v1/vpc-firewall-rules")
        .copied()
        .unwrap_or(0);
    assert_eq!(puts, 0, "a re-run changes no rule");
    assert_eq!(rack.list_firewall_rules().await.unwrap(), rules);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_full_rack_bootstrap_fails_fast_with_the_racks_answer() {
    let env = env().await;
    env.sim
        .faults()
        .update(|f| f.no_capacity.push(String::new()));
    let started = std::time::Instant::now();
    let out = env.run(&["--workers", "1", "--api-timeout", "120"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("first-control-plane") && stderr.contains("Insufficient capacity"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "failed before the API wait, not after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_api_allow_exits_2_naming_the_flag_before_any_api_call() {
    let env = env().await;
    env.sim.oxide().reset_counters();
    let out = env.run(&["--api-allow", "10.1.2.3/8"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--api-allow") && stderr.contains("host bits"),
        "{stderr}"
    );
    let calls: u64 = env.sim.oxide().counters().values().sum();
    assert_eq!(calls, 0, "no Oxide API call before validation passes");
}
