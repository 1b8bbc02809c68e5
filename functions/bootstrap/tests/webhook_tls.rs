//! Issue 34 §6: TLS by default. Bootstrap makes the webhook's CA and serving pair (the pair in
//! the Secret, the CA beside the resume file), the in-cluster webhook serves HTTPS from the
//! Secret, a client that trusts the CA gets in and one that does not is refused, 2,000 idle
//! connections do not starve it, and plain HTTP beyond loopback needs an explicit flag.
//!
//! Issue 46 item 1 (audit security-2 N10): the pair lives in a Secret of its own that the
//! reconcile's account (and no other) may rewrite, signed by a CA whose key only the reconcile
//! reads; a run re-issues a pair that ends within `renew_before_days`, and a webhook serving
//! from the mounted files serves the new one without a restart.

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
        assert!(
            secret["data"][key].is_null(),
            "the cluster's Secret still holds {key}"
        );
    }
    let (_, tls) = read_pair(&env).await;
    assert_eq!(tls.ca_pem, ca, "the Secret's CA is the laptop's");
    who_may_touch_the_webhooks_secrets(&env).await;

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

    renewed_by_a_run_and_served_without_a_restart(&env, &scale, &ca).await;

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

/// Secret `oxide-controller-webhook-tls`'s resourceVersion and pair.
async fn read_pair(
    env: &common::Env,
) -> (String, oxide_controller::adapters::webhook_tls::WebhookTls) {
    use oxide_controller::ports::state::StateStore as _;
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let store = oxide_controller::adapters::kube_store::KubeStateStore::new(client, "kube-system");
    store
        .read_webhook_tls()
        .await
        .unwrap()
        .expect("bootstrap made the webhook's Secret")
}

/// The real authorizer: the reconcile's account may rewrite the pair and read the CA's key;
/// it still only reads the cluster's Secret; the webhook's own account reads neither.
async fn who_may_touch_the_webhooks_secrets(env: &common::Env) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(client);
    let may = |account: &str, verb: &str, name: &str| {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(format!("system:serviceaccount:{account}")),
                groups: Some(vec!["system:serviceaccounts".into()]),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some("kube-system".into()),
                    verb: Some(verb.into()),
                    resource: Some("secrets".into()),
                    name: Some(name.into()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviews = reviews.clone();
        async move {
            let r = reviews
                .create(&kube::api::PostParams::default(), &review)
                .await
                .unwrap();
            r.status.is_some_and(|s| s.allowed)
        }
    };
    let reconcile = "oxide-controller-jobs:oxide-controller-reconcile";
    let webhook = "kube-system:oxide-controller-webhook";
    assert!(may(reconcile, "update", "oxide-controller-webhook-tls").await);
    assert!(may(reconcile, "get", "oxide-controller-webhook-ca").await);
    assert!(!may(reconcile, "update", "oxide-controller-webhook-ca").await);
    assert!(!may(reconcile, "update", "oxide-controller").await);
    assert!(!may(webhook, "get", "oxide-controller-webhook-ca").await);
    assert!(!may(webhook, "update", "oxide-controller-webhook-tls").await);
}

/// The DER of the certificate a fresh connection to the webhook on `port` is served.
async fn served(ca: &str, port: u16) -> Vec<u8> {
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .tls_info(true)
        .resolve(
            "oxide-controller-webhook.kube-system.svc",
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        )
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let r = client
        .get(format!(
            "https://oxide-controller-webhook.kube-system.svc:{port}/healthz"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|t| t.peer_certificate())
        .expect("the server's certificate")
        .to_vec()
}

fn der(pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// A pair 20 days from its end (put in the Secret as if a year had passed), a record a day
/// old (the run reads the Secret again), one `reconcile-once`: the Secret holds a new pair
/// under the same CA, the status says when, and the webhook serving the mounted files (the
/// test plays the kubelet) serves it from a later connection on, the same process.
async fn renewed_by_a_run_and_served_without_a_restart(env: &common::Env, scale: &Path, ca: &str) {
    use oxide_controller::adapters::webhook_tls;
    use oxide_controller::ports::state::StateStore as _;
    let client = common::kube_client(&env.kubeconfig(), "demo").await;
    let store =
        oxide_controller::adapters::kube_store::KubeStateStore::new(client.clone(), "kube-system");
    let webhook_ca = store
        .read_webhook_ca()
        .await
        .unwrap()
        .expect("the CA's Secret");
    let now = chrono::Utc::now();
    let old = webhook_tls::reissue(
        &webhook_ca,
        "demo",
        "kube-system",
        now - chrono::Duration::days(345),
    )
    .unwrap();
    let (rv, _) = read_pair(env).await;
    store.replace_webhook_tls(&rv, &old).await.unwrap();
    let files = env.dir.path().join("webhook-tls");
    std::fs::create_dir_all(&files).unwrap();
    let (cert, key) = (files.join("tls.crt"), files.join("tls.key"));
    std::fs::write(&cert, &old.cert_pem).unwrap();
    std::fs::write(&key, &old.key_pem).unwrap();
    let (mut webhook, port) = serve(
        scale,
        &env.kubeconfig(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &cert.display().to_string(),
            "--tls-key",
            &key.display().to_string(),
        ],
    )
    .await;
    assert_eq!(served(ca, port).await, der(&old.cert_pem));

    // The last run's record is trusted for a day: age it, as a day passing would.
    let configs: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "kube-system");
    let mut cm = configs.get("oxide-controller").await.unwrap();
    let data = cm.data.as_mut().unwrap();
    let mut status: serde_json::Value = serde_json::from_str(&data["status.json"]).unwrap();
    assert!(
        status["webhookCertificate"]["notAfter"].is_string(),
        "{status}"
    );
    status["webhookCertificate"]["checkedAt"] =
        serde_json::json!((now - chrono::Duration::days(2)).to_rfc3339());
    data.insert("status.json".into(), status.to_string());
    configs
        .replace("oxide-controller", &kube::api::PostParams::default(), &cm)
        .await
        .unwrap();

    let out = tokio::process::Command::new(common::workspace_binaries().join("reconcile-once"))
        .args(["--kubeconfig", &env.kubeconfig().display().to_string()])
        .args(["--context", "demo", "--log-format", "json"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("PRIVATE KEY"), "a key in the log");
    let (_, renewed) = read_pair(env).await;
    assert_ne!(
        renewed.cert_pem, old.cert_pem,
        "the run did not re-issue: {stderr}"
    );
    assert_eq!(renewed.ca_pem, ca, "the same CA");
    let end = webhook_tls::end(&renewed.cert_pem).unwrap();
    assert!(end > now + chrono::Duration::days(360), "{end}");
    let cm = configs.get("oxide-controller").await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&cm.data.unwrap()["status.json"]).unwrap();
    assert!(
        status["webhookCertificate"]["renewedAt"].is_string(),
        "{status}"
    );

    // The kubelet's update of the mounted Secret, then the same webhook process serves it.
    std::fs::write(&key, &renewed.key_pem).unwrap();
    std::fs::write(&cert, &renewed.cert_pem).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while served(ca, port).await != der(&renewed.cert_pem) {
        assert!(
            Instant::now() < deadline,
            "the renewed pair was not served within 30 s"
        );
        assert!(webhook.try_wait().unwrap().is_none(), "the webhook exited");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
