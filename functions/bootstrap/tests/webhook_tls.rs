//! Issue 34 §6: TLS by default. Bootstrap makes the webhook's CA and serving pair (the pair in
//! the Secret, the CA beside the resume file), the in-cluster webhook serves HTTPS from the
//! Secret, a client that trusts the CA gets in and one that does not is refused, 2,000 idle
//! connections do not starve it, and plain HTTP beyond loopback needs an explicit flag.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{env, workspace_binaries};
use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;

/// `scale serve` as the in-cluster Deployment runs it (`--tls-from-secret`), on loopback,
/// with `kubeconfig`; returns the child and its port once it accepts connections.
async fn serve(scale: &Path, kubeconfig: &Path, extra: &[&str]) -> (tokio::process::Child, u16) {
    let mut child = tokio::process::Command::new(scale)
        .args(["serve", "--context", "demo"])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("the webhook did not start")
    .unwrap();
    let start: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(start["tls"], true, "{start}");
    let listen: std::net::SocketAddr = start["listen"].as_str().unwrap().parse().unwrap();
    (child, listen.port())
}

/// A client trusting only `ca` (or nothing at all), resolving the Service's DNS name to
/// loopback as a port-forward would.
fn client(ca: Option<&str>, port: u16) -> reqwest::Client {
    let roots: Vec<reqwest::Certificate> = ca
        .map(|ca| reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .into_iter()
        .collect();
    reqwest::Client::builder()
        .tls_certs_only(roots)
        .resolve(
            "oxide-controller-webhook.kube-system.svc",
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        )
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_serves_https_under_the_ca_bootstrap_wrote_and_refuses_other_clients() {
    let env = env().await;
    let stdout = env
        .run_ok(&["--control-planes", "1", "--workers", "1"])
        .await;
    let ca_path = env.state_dir().join("demo-webhook-ca.pem");
    assert!(
        stdout.contains(&ca_path.display().to_string()),
        "the summary names the CA: {stdout}"
    );
    assert!(stdout.contains("https://127.0.0.1:8443"), "{stdout}");
    let ca = std::fs::read_to_string(&ca_path).unwrap();
    let secret = env
        .sim
        .kube()
        .get("v1", "Secret", Some("kube-system"), "oxide-controller")
        .await
        .unwrap();
    for key in ["webhook-tls.crt", "webhook-tls.key"] {
        assert!(secret["data"][key].is_string(), "the Secret lacks {key}");
    }

    let scale = workspace_binaries().join("scale");
    let (_webhook, port) = serve(
        &scale,
        &env.kubeconfig(),
        &["--listen", "127.0.0.1:0", "--tls-from-secret"],
    )
    .await;
    for host in [
        format!("https://oxide-controller-webhook.kube-system.svc:{port}"),
        format!("https://127.0.0.1:{port}"),
        format!("https://localhost:{port}"),
    ] {
        let r = client(Some(&ca), port)
            .get(format!("{host}/healthz"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{host} with the CA: {e:?}"));
        assert_eq!(r.status(), 200, "{host}");
    }
    let refused = client(None, port)
        .get(format!("https://127.0.0.1:{port}/healthz"))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a client without the CA was served: {refused:?}"
    );

    // 2,000 idle connections (no request, no TLS hello) do not keep a real client out.
    let mut idle = Vec::with_capacity(2000);
    for _ in 0..2000 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        );
    }
    let started = Instant::now();
    let r = client(Some(&ca), port)
        .get(format!("https://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Within the client's 10 s timeout, which is also the host's header deadline: a webhook
    // that served connections one at a time, or capped them, would not answer in time.
    eprintln!(
        "a request beside 2,000 idle connections took {:?}",
        started.elapsed()
    );
    drop(idle);

    // Plain HTTP beyond loopback is refused unless asked for by name.
    let out = tokio::process::Command::new(&scale)
        .args(["serve", "--context", "demo", "--listen", "0.0.0.0:0"])
        .env("KUBECONFIG", env.kubeconfig())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--insecure-plain-http"), "{stderr}");
}
