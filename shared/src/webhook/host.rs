//! The hyper host of the webhook function: HTTP/1.1 over TCP (optionally TLS with rustls and
//! the aws-lc-rs provider), bounded body reads, a per-request deadline, a header-read timeout,
//! and graceful shutdown that stops accepting and lets in-flight requests finish.
//!
//! Owns sockets and nothing else: every request goes to [`super::handle`] as an
//! `http::Request<Bytes>`. TLS material comes from PEM files (re-read, so a renewed pair is
//! served without a restart) or from Secret `oxide-controller-webhook-tls`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::error::WebhookError;
use super::{Deps, MAX_BODY, handle, host_error_response};
use crate::ports::cluster::Cluster;
use crate::ports::state::StateStore;

/// The Secret holding the webhook's serving pair (bootstrap makes it, the reconcile renews it).
pub const TLS_SECRET: &str = crate::base::secrets::webhook::TLS_SECRET;

/// Default of [`HostOptions::max_connections`]. Each connection costs a task and hyper's
/// buffers (at most 16 KiB read buffer, see `max_buf_size` below, plus TLS state): 256 of
/// them stay a few MiB, well inside the Deployment's 128 Mi, and far above what the
/// webhook's callers (the kubelet's probes, Prometheus, an autoscaler, an operator) open.
pub const MAX_CONNECTIONS: usize = 256;

/// Host settings.
#[derive(Clone)]
pub struct HostOptions {
    /// Deadline for reading a request's body and answering it.
    pub request_timeout: Duration,
    /// Deadline for a client to send a request's headers (and for a TLS handshake).
    pub header_timeout: Duration,
    /// After shutdown starts, how long in-flight requests get before the host returns anyway.
    pub shutdown_grace: Duration,
    /// Serve HTTPS with this configuration; plain HTTP when `None`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Connections served at once (at least 1). When all are taken the host stops
    /// accepting: new connections wait in the kernel's listen backlog until one ends (an idle
    /// one ends after `header_timeout`), and are not refused.
    pub max_connections: usize,
}

impl std::fmt::Debug for HostOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostOptions")
            .field("request_timeout", &self.request_timeout)
            .field("header_timeout", &self.header_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("tls", &self.tls.is_some())
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            request_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(15),
            tls: None,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// Host trouble.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {}", path.display())]
    ReadTls {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no usable {what} in the TLS material ({source_name}); expected PEM")]
    Pem {
        what: &'static str,
        source_name: String,
    },
    #[error("the TLS certificate and key do not form a usable server configuration")]
    Tls(#[source] rustls::Error),
    #[error(
        "there is no Secret {namespace}/{TLS_SECRET}; re-run bootstrap (it makes the webhook's certificate) or use --tls-cert/--tls-key"
    )]
    NoTlsInSecret { namespace: String },
    #[error("cannot read the Secret {namespace}/{TLS_SECRET} for its TLS keys")]
    SecretUnreadable {
        namespace: String,
        #[source]
        source: crate::ports::state::StateError,
    },
}

/// Binds `addr` (use port 0 for a free one).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HostError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HostError::Bind { addr, source })
}

/// The serving certificate and key (PEM) as rustls signs with them; checked to belong
/// together. `source_name` names where the PEM came from, for errors.
fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    source_name: &str,
) -> Result<Arc<rustls::sign::CertifiedKey>, HostError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| HostError::Pem {
            what: "certificate",
            source_name: source_name.to_owned(),
        })?;
    if certs.is_empty() {
        return Err(HostError::Pem {
            what: "certificate",
            source_name: source_name.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| HostError::Pem {
        what: "private key",
        source_name: source_name.to_owned(),
    })?;
    rustls::sign::CertifiedKey::from_der(certs, key, &provider())
        .map(Arc::new)
        .map_err(HostError::Tls)
}

fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// The certificate the host serves: one slot, read by every handshake, that a
/// [`ReloadingCert`] task may fill anew.
#[derive(Debug)]
struct CertSlot(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl rustls::server::ResolvesServerCert for CertSlot {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

impl CertSlot {
    fn set(&self, key: Arc<rustls::sign::CertifiedKey>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = key;
    }
}

fn server_config(slot: Arc<CertSlot>) -> Result<Arc<rustls::ServerConfig>, HostError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .map_err(HostError::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(slot);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A rustls server configuration (aws-lc-rs, TLS 1.2/1.3, ALPN http/1.1) from PEM text.
/// `source_name` names where the PEM came from, for errors.
pub fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    source_name: &str,
) -> Result<Arc<rustls::ServerConfig>, HostError> {
    let key = certified_key(cert_pem, key_pem, source_name)?;
    server_config(Arc::new(CertSlot(std::sync::RwLock::new(key))))
}

/// How often [`tls_from_files`] looks at its files again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// TLS from PEM files, re-read every `every`: a pair that changed (the kubelet updates a
/// mounted Secret within a minute or so of the reconcile re-issuing it) is served from the
/// next handshake on, without a restart. A pair that does not load (half written, key and
/// certificate not matching) is logged and the one before kept. The re-reading task ends
/// with the returned configuration. Needs a Tokio runtime.
pub fn tls_from_files(
    cert: &Path,
    key: &Path,
    every: Duration,
) -> Result<Arc<rustls::ServerConfig>, HostError> {
    let files = ReloadingCert {
        cert: cert.to_owned(),
        key: key.to_owned(),
    };
    let (pem, current) = files.load()?;
    let slot = Arc::new(CertSlot(std::sync::RwLock::new(current)));
    let config = server_config(slot.clone())?;
    let weak = Arc::downgrade(&slot);
    drop(slot);
    tokio::spawn(files.watch(weak, pem, every));
    Ok(config)
}

/// The files a [`tls_from_files`] configuration re-reads.
#[derive(Debug, Clone)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
}

impl ReloadingCert {
    /// Both files' bytes and the pair they make.
    fn load(&self) -> Result<(Vec<u8>, Arc<rustls::sign::CertifiedKey>), HostError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| HostError::ReadTls {
                path: p.to_owned(),
                source,
            })
        };
        let (cert, key) = (read(&self.cert)?, read(&self.key)?);
        let name = format!("{} and {}", self.cert.display(), self.key.display());
        let loaded = certified_key(&cert, &key, &name)?;
        Ok(([cert, key].concat(), loaded))
    }

    async fn watch(self, slot: std::sync::Weak<CertSlot>, mut seen: Vec<u8>, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            let Some(slot) = slot.upgrade() else { return };
            let files = self.clone();
            let loaded = tokio::task::spawn_blocking(move || files.load()).await;
            match loaded {
                Ok(Ok((pem, key))) if pem != seen => {
                    slot.set(key);
                    seen = pem;
                    tracing::info!(cert = %self.cert.display(), "serving the renewed TLS certificate");
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the TLS files do not load; serving the certificate before them");
                }
                Err(e) => tracing::warn!(error = %e, "reading the TLS files failed"),
            }
        }
    }
}

/// TLS from Secret `oxide-controller-webhook-tls`'s `tls.crt` / `tls.key`, read once (the
/// in-cluster Deployment mounts the Secret and uses [`tls_from_files`], which follows
/// re-issues).
pub async fn tls_from_secret(
    client: kube::Client,
    namespace: &str,
) -> Result<Arc<rustls::ServerConfig>, HostError> {
    use crate::ports::state::StateStore as _;
    let store = crate::adapters::kube_store::KubeStateStore::new(client, namespace);
    match store.read_webhook_tls().await {
        Ok(Some((_, tls))) => tls_config(
            tls.cert_pem.as_bytes(),
            tls.key_pem.as_bytes(),
            &format!("Secret {namespace}/{TLS_SECRET} keys tls.crt/tls.key"),
        ),
        Ok(None) => Err(HostError::NoTlsInSecret {
            namespace: namespace.to_owned(),
        }),
        Err(source) => Err(HostError::SecretUnreadable {
            namespace: namespace.to_owned(),
            source,
        }),
    }
}

/// Reads at most `MAX_BODY + 1` bytes of a body: enough for the handler to tell "too large"
/// without buffering whatever a client chooses to send.
async fn read_bounded(mut body: Incoming) -> Result<Bytes, hyper::Error> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            let room = MAX_BODY + 1 - buf.len();
            buf.extend_from_slice(&data[..data.len().min(room)]);
            if buf.len() > MAX_BODY {
                break;
            }
        }
    }
    Ok(buf.freeze())
}

async fn serve_request<S, C>(
    deps: Arc<Deps<S, C>>,
    timeout: Duration,
    req: http::Request<Incoming>,
) -> http::Response<Full<Bytes>>
where
    S: StateStore + 'static,
    C: Cluster + 'static,
{
    let (parts, body) = req.into_parts();
    let (method, path) = (parts.method.clone(), parts.uri.path().to_owned());
    let declared_too_large = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY as u64);
    let started = std::time::Instant::now();
    let work = async {
        // A declared oversize body is not read at all; the handler answers 413 from the header.
        let bytes = if declared_too_large {
            Ok(Bytes::new())
        } else {
            read_bounded(body).await
        };
        match bytes {
            Ok(bytes) => handle(&deps, http::Request::from_parts(parts, bytes)).await,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read a request body");
                let err = WebhookError::BodyUnreadable;
                host_error_response(&deps, &method, &path, &err, started.elapsed())
            }
        }
    };
    let response = match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => {
            let err = WebhookError::Timeout { after: timeout };
            host_error_response(&deps, &method, &path, &err, timeout)
        }
    };
    response.map(Full::new)
}

/// Serves `deps` on `listener` until `shutdown` completes, then stops accepting, lets
/// in-flight requests finish (up to `opts.shutdown_grace`) and returns.
pub async fn serve<S, C, F>(
    listener: TcpListener,
    deps: Arc<Deps<S, C>>,
    opts: HostOptions,
    shutdown: F,
) where
    S: StateStore + 'static,
    C: Cluster + 'static,
    F: Future<Output = ()>,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let tls = opts.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        // Headers plus a 1 KiB body fit with room to spare; hyper will not go below 8 KiB.
        .max_buf_size(16 * 1024)
        .keep_alive(true);
    let builder = Arc::new(builder);
    // A permit per connection, taken *before* accepting: when all are out the host does not
    // accept, and new connections wait in the listen backlog (as tokio's mini-redis server
    // does), instead of being accepted and closed (which a kubelet probe would count as a
    // failure).
    let slots = Arc::new(tokio::sync::Semaphore::new(opts.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                // Never closed.
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off rather than spin; the listener stays.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let deps = deps.clone();
        let builder = builder.clone();
        let tls = tls.clone();
        let (request_timeout, header_timeout) = (opts.request_timeout, opts.header_timeout);
        tokio::spawn(async move {
            // Held until the connection ends.
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let deps = deps.clone();
                async move { Ok::<_, Infallible>(serve_request(deps, request_timeout, req).await) }
            });
            let result = match tls {
                None => {
                    watcher
                        .watch(builder.serve_connection(TokioIo::new(stream), service))
                        .await
                }
                Some(acceptor) => {
                    match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls_stream)) => {
                            watcher
                                .watch(builder.serve_connection(TokioIo::new(tls_stream), service))
                                .await
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: finishing in-flight requests");
    if tokio::time::timeout(opts.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?opts.shutdown_grace, "in-flight requests did not finish in time");
    }
}
