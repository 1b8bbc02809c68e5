//! The `oxide-sim` binary as scripts and demos use it: one JSON line on stdout, a working API
//! and admin endpoint, a clean exit on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test]
async fn binary_prints_one_ready_line_serves_the_api_and_exits_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxide-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--ssh-port",
            "2222",
            "--latency-ms",
            "GET /v1/projects=1",
            "--k3s-version",
            "v1.33.4+k3s1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("oxide-sim starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        (line, stdout)
    });
    let (line, mut stdout) = tokio::time::timeout(Duration::from_secs(20), line)
        .await
        .expect("ready line within 20 s")
        .unwrap();

    let ready: serde_json::Value = serde_json::from_str(&line).expect("the ready line is JSON");
    let keys: Vec<&str> = ready
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "admin_url",
            "kubeconfig",
            "oxide_host",
            "oxide_token",
            "project",
            "release_url",
            "tailscale_api_url"
        ]
    );
    assert!(
        ready["project"].is_null() && ready["kubeconfig"].is_null(),
        "no preset: {ready}"
    );
    let host = ready["oxide_host"].as_str().unwrap();
    let token = ready["oxide_token"].as_str().unwrap();
    let admin = ready["admin_url"].as_str().unwrap();
    let releases = ready["release_url"].as_str().unwrap();
    let tailscale = ready["tailscale_api_url"].as_str().unwrap();
    assert!(host.starts_with("http://127.0.0.1:"));
    assert!(releases.starts_with("http://127.0.0.1:"), "{releases}");
    assert!(tailscale.starts_with("http://127.0.0.1:"), "{tailscale}");

    let http = reqwest::Client::new();
    let unauthenticated = http
        .get(format!("{host}/v1/projects"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);
    let projects = http
        .get(format!("{host}/v1/projects"))
        .bearer_auth(token)
        .header("api-version", "2026073100.0.0")
        .send()
        .await
        .unwrap();
    assert_eq!(projects.status(), 200);

    // The release mirror serves the hash file of the release it installs, as GitHub does;
    // the Tailscale API wants its key.
    let hashes = http
        .get(format!(
            "{releases}/download/v1.33.4+k3s1/sha256sum-amd64.txt"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(hashes.status(), 200);
    let devices = http
        .get(format!("{tailscale}/api/v2/tailnet/-/devices"))
        .send()
        .await
        .unwrap();
    assert_eq!(devices.status(), 401);

    let counters: serde_json::Value = http
        .get(format!("{admin}/counters"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        counters["oxide"]["GET /v1/projects"].as_u64().unwrap() >= 1,
        "{counters}"
    );
    let faults: serde_json::Value = http
        .get(format!("{admin}/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(faults["routes"]["GET /v1/projects"]["latency_ms"], 1);

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "oxide-sim did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean exit: {status}");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "", "nothing but the ready line on stdout");
}
