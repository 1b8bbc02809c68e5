//! A rack older than the API version the SDK sends: bootstrap stops at its first call with
//! one line naming the rack's version and the one it needs, and changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::env_with;
use oxide_sim::SimOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_rack_is_named_with_both_api_versions() {
    // Rack release 21 serves 2026061000.0.0; the controller sends release 22's 2026073100.0.0.
    let env = env_with(SimOptions {
        api_version: "2026061000.0.0".into(),
        ..SimOptions::default()
    })
    .await;
    let out = env.command(&env.args(&[])).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let human: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('{'))
        .collect();
    assert_eq!(human.len(), 1, "one line for a person: {stderr}");
    for needle in ["2026061000.0.0", "2026073100.0.0", "older"] {
        assert!(human[0].contains(needle), "{:?} lacks {needle:?}", human[0]);
    }
    assert_eq!(env.mutating_calls(), vec![]);
}
