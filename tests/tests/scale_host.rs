//! The webhook's hyper host over loopback, with the in-memory fakes behind it: graceful
//! shutdown lets in-flight requests finish, the per-request deadline answers 503, bodies over
//! 1 KiB are refused without being buffered, HTTPS works from PEM files, and connections
//! beyond the cap wait.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::secrets::webhook::WebhookTokens;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::fake::{FakeCluster, FakeState, FakeWorld};
use oxide_controller::ports::state::{ConfigSnapshot, StateError, StateStore, keys};
use oxide_controller::webhook::host::{self, HostError, HostOptions};
use oxide_controller::webhook::{Deps, WebhookConfig};

const TOKEN: &str = "host-test-token";

/// The fake state store, with every ConfigMap read taking `delay`.
struct Slow {
    inner: FakeState,
    delay: Duration,
}

impl StateStore for Slow {
    async fn read_config(&self) -> Result<ConfigSnapshot, StateError> {
        tokio::time::sleep(self.delay).await;
        self.inner.read_config().await
    }
    async fn replace_config(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.inner.replace_config(rv, data).await
    }
    async fn read_scale(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        self.inner.read_scale().await
    }
    async fn replace_scale(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.inner.replace_scale(rv, data).await
    }
    async fn read_secrets(&self) -> Result<ClusterSecrets, StateError> {
        self.inner.read_secrets().await
    }
    async fn read_webhook_tokens(&self) -> Result<Option<WebhookTokens>, StateError> {
        self.inner.read_webhook_tokens().await
    }
    async fn ensure_state(
        &self,
        s: &ClusterSecrets,
        c: BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        self.inner.ensure_state(s, c).await
    }
    async fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> Result<BTreeMap<String, Vec<String>>, StateError> {
        self.inner.merge_host_key_pins(pins).await
    }
}

struct Running {
    addr: SocketAddr,
    deps: Arc<Deps<Slow, FakeCluster>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(delay: Duration, opts: HostOptions) -> Running {
    let w = FakeWorld::new(chrono::Utc::now());
    let spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 1, 2);
    w.state()
        .ensure_state(
            &ClusterSecrets::default(),
            BTreeMap::from([(keys::SPEC.to_owned(), spec.to_yaml())]),
        )
        .await
        .unwrap();
    w.state()
        .ensure_webhook_tokens(&WebhookTokens {
            token: TOKEN.into(),
            read_token: None,
        })
        .await
        .unwrap();
    let deps = Arc::new(Deps::new(
        Slow {
            inner: w.state(),
            delay,
        },
        w.cluster(),
        WebhookConfig::default(),
    ));
    let listener = host::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(host::serve(listener, deps.clone(), opts, async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        deps,
        stop,
        task,
    }
}

#[tokio::test]
async fn shutdown_stops_accepting_but_finishes_requests_in_flight() {
    let run = start(Duration::from_millis(600), HostOptions::default()).await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/nodes/workers", run.addr);
    let in_flight = tokio::spawn(http.get(&url).bearer_auth(TOKEN).send());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = Instant::now();
    run.stop.send(()).unwrap();

    let r = in_flight
        .await
        .unwrap()
        .expect("the in-flight request is answered");
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (200, "2".to_owned())
    );
    tokio::time::timeout(Duration::from_secs(5), run.task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited for the request"
    );
    let fresh = reqwest::Client::new();
    assert!(
        fresh.get(&url).bearer_auth(TOKEN).send().await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn a_request_over_its_deadline_is_answered_503_and_counted() {
    let opts = HostOptions {
        request_timeout: Duration::from_millis(200),
        ..HostOptions::default()
    };
    let run = start(Duration::from_secs(3), opts).await;
    let started = Instant::now();
    let r = reqwest::Client::new()
        .get(format!("http://{}/nodes/workers", run.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert!(r.text().await.unwrap().contains("\"timeout\""));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(run.deps.metrics.requests("/nodes/workers", 503), 1);
}

#[tokio::test]
async fn bodies_over_one_kib_are_413_whether_declared_or_streamed() {
    let run = start(Duration::ZERO, HostOptions::default()).await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/nodes/workers", run.addr);
    // Declared: Content-Length 1 MiB.
    let r = http
        .put(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(vec![b' '; 1 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // Streamed: chunked, no length, far more than the limit.
    let chunks = futures::stream::iter(
        (0..256).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 4096]))),
    );
    let r = http
        .put(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    // The host answers after 1 KiB and closes; the client may see the 413 or a reset while
    // still sending, but never a success.
    if let Ok(r) = r {
        assert_eq!(r.status(), 413);
    }
    assert_eq!(run.deps.metrics.requests("/nodes/workers", 200), 0);
    let r = http
        .put(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(r#"{"count":3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "small bodies still work");
}

#[tokio::test]
async fn https_from_pem_files_serves_the_webhook_and_plain_http_is_refused() {
    let key =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, key.cert.pem()).unwrap();
    std::fs::write(&key_path, key.signing_key.serialize_pem()).unwrap();
    let tls = host::tls_from_files(&cert_path, &key_path, host::RELOAD_EVERY).unwrap();
    let run = start(
        Duration::ZERO,
        HostOptions {
            tls: Some(tls),
            ..HostOptions::default()
        },
    )
    .await;

    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(key.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let r = https
        .get(format!(
            "https://localhost:{}/nodes/workers",
            run.addr.port()
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (200, "2".to_owned())
    );
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", run.addr))
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
}

/// The end entity certificate `addr` serves to a client trusting only `ca`, through a fresh
/// connection (DER).
async fn served_certificate(addr: SocketAddr, ca: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("oxide-controller-webhook.kube-system.svc")
        .unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Issue 46 item 1: the reconcile re-issues the webhook's pair into its Secret and the
/// kubelet rewrites the mounted files; the running host serves the new certificate from the
/// next connection on, without a restart, and keeps the old one while the files are half
/// written.
#[tokio::test]
async fn a_renewed_pair_in_the_files_is_served_without_a_restart() {
    use oxide_controller::adapters::webhook_tls;
    let (first, ca) = webhook_tls::generate("demo", "kube-system").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, &first.cert_pem).unwrap();
    std::fs::write(&key_path, &first.key_pem).unwrap();
    let every = Duration::from_millis(50);
    let tls = host::tls_from_files(&cert_path, &key_path, every).unwrap();
    let run = start(
        Duration::ZERO,
        HostOptions {
            tls: Some(tls),
            ..HostOptions::default()
        },
    )
    .await;
    let der = |pem: &str| {
        use rustls::pki_types::pem::PemObject as _;
        rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    };
    assert_eq!(
        served_certificate(run.addr, &ca.ca_pem).await,
        der(&first.cert_pem)
    );

    let renewed = webhook_tls::reissue(
        &ca,
        "demo",
        "kube-system",
        chrono::Utc::now() + chrono::Duration::seconds(5),
    )
    .unwrap();
    // Half written: the new certificate beside the old key does not load; the old pair stays.
    std::fs::write(&cert_path, &renewed.cert_pem).unwrap();
    tokio::time::sleep(every * 4).await;
    assert_eq!(
        served_certificate(run.addr, &ca.ca_pem).await,
        der(&first.cert_pem)
    );
    std::fs::write(&key_path, &renewed.key_pem).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if served_certificate(run.addr, &ca.ca_pem).await == der(&renewed.cert_pem) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed pair was never served"
        );
        tokio::time::sleep(every).await;
    }
}

#[test]
fn unusable_tls_material_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&cert, "not a certificate").unwrap();
    std::fs::write(&key, "not a key").unwrap();
    let e = host::tls_from_files(&cert, &key, host::RELOAD_EVERY).unwrap_err();
    assert!(
        matches!(
            e,
            HostError::Pem {
                what: "certificate",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("c.pem"), "{e}");
    let e = host::tls_from_files(&dir.path().join("missing.pem"), &key, host::RELOAD_EVERY)
        .unwrap_err();
    assert!(
        matches!(e, HostError::ReadTls { .. }) && e.to_string().contains("missing.pem"),
        "{e}"
    );
}

/// Issue 46 item 5: the host serves `/metrics` to a scraper without a token: the webhook's
/// own counters and the cluster's status (before any run: `status_up 0` under the spec's
/// cluster name, and the schedule's interval).
#[tokio::test]
async fn metrics_are_served_without_a_token() {
    let run = start(Duration::ZERO, HostOptions::default()).await;
    let r = reqwest::Client::new()
        .get(format!("http://{}/metrics", run.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = r.text().await.unwrap();
    for line in [
        r#"oxide_controller_status_up{cluster="demo"} 0"#,
        r#"oxide_controller_reconcile_interval_seconds{cluster="demo"} 300"#,
        "# TYPE oxide_controller_webhook_requests_total counter",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(!text.contains(TOKEN));
    assert_eq!(run.deps.cluster_metrics.reads(), 1);
}

/// Audit L2: connections beyond `max_connections` are not served until one ends. With a cap
/// of 2, two idle connections hold both slots; a third one's request gets no answer (it
/// waits in the listen backlog, not accepted) until one of the two closes, then it is served.
#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_ends() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let opts = HostOptions {
        max_connections: 2,
        ..HostOptions::default()
    };
    let run = start(Duration::ZERO, opts).await;
    let started = Instant::now();
    let first = tokio::net::TcpStream::connect(run.addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(run.addr).await.unwrap();
    let mut third = tokio::net::TcpStream::connect(run.addr).await.unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    third.write_all(request).await.unwrap();
    let mut buf = [0u8; 256];
    assert!(
        tokio::time::timeout(Duration::from_millis(400), third.read(&mut buf))
            .await
            .is_err(),
        "the third connection is not served while two are open"
    );
    // The two held slots serve requests.
    second.write_all(request).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(1), second.read(&mut buf))
        .await
        .expect("a connection within the cap is served")
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);

    drop(first);
    let n = tokio::time::timeout(Duration::from_secs(1), third.read(&mut buf))
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(run.deps.metrics.requests("/healthz", 200), 2);
}
