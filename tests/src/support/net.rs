//! Loopback plumbing for the simulator: the HTTP/1.1 accept loop shared by the Oxide API and
//! the admin API, and the registry of per-VM listeners (Kubernetes API at :6443, SSH) keyed by
//! the socket address they occupy.
//!
//! The registry is the single source of truth for "is anything answering on IP:PORT": the
//! simulated k3s asks it whether a join URL is reachable, so a listener that was closed here
//! (VM stopped, floating IP detached) is unreachable for joins as well as for real clients.
//! Address allocation lives in `oxide::addresses` (owned by the Oxide API side); what runs on
//! the addresses (boot, k3s) lives in `boot`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// Largest request body nexus reads on its external API: dropshot's
/// `default_request_body_max_bytes`, 1 MiB in the config sled-agent writes for nexus.
pub const MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Largest body of `POST /v1/disks/{disk}/bulk-write` (nexus's `DISK_BULK_WRITE_MAX_BYTES`),
/// i.e. JSON with base64 data; the decoded data is capped lower, by the pantry.
pub const MAX_BULK_WRITE_BODY: usize = 8 * 1024 * 1024;

/// The body limit of a request: [`MAX_BULK_WRITE_BODY`] for the bulk-write route,
/// [`MAX_REQUEST_BODY`] for everything else (the admin and tailnet APIs take small bodies).
pub fn request_body_cap(method: &http::Method, path: &str) -> usize {
    let segments: Vec<&str> = path.split('/').collect();
    match segments.as_slice() {
        ["", "v1", "disks", _, "bulk-write"] if method == http::Method::POST => MAX_BULK_WRITE_BODY,
        _ => MAX_REQUEST_BODY,
    }
}

/// Serves HTTP/1.1 on `listener` until the returned task is aborted, calling `handler` with
/// each fully-read request. Bodies over [`request_body_cap`] get dropshot's 400 without
/// reaching the handler.
pub fn spawn_http<F, Fut>(listener: TcpListener, handler: F) -> JoinHandle<()>
where
    F: Fn(http::Request<Bytes>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<Bytes>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // EMFILE and friends: back off instead of spinning; the listener stays.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let handler = handler.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let cap = request_body_cap(&parts.method, parts.uri.path());
                        let response = match Limited::new(body, cap).collect().await {
                            Ok(collected) => {
                                handler(http::Request::from_parts(parts, collected.to_bytes()))
                                    .await
                            }
                            Err(_) => body_too_large(cap),
                        };
                        Ok::<_, Infallible>(response.map(Full::new))
                    }
                });
                if let Err(err) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %err, "http connection ended with an error");
                }
            });
        }
    })
}

/// Accepts on `public`: admitted connections are relayed to `inner`, the others are held
/// without a byte of answer until the listener closes.
async fn gate_loop(public: TcpListener, local: SocketAddr, inner: SocketAddr, gate: Gate) {
    let mut dropped = tokio::task::JoinSet::new();
    loop {
        let (mut stream, peer) = match public.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while dropped.try_join_next().is_some() {}
        if gate(peer.ip(), local) {
            tokio::spawn(async move {
                if let Ok(mut upstream) = tokio::net::TcpStream::connect(inner).await {
                    // Small request/response exchanges through the relay must not wait on
                    // Nagle + delayed ACK (40 ms a round).
                    let _ = stream.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
                }
            });
        } else {
            tracing::debug!(%peer, %local, "VPC firewall: connection dropped");
            dropped.spawn(async move {
                let _held = stream;
                std::future::pending::<()>().await;
            });
        }
    }
}

/// Dropshot's answer to an oversize body: 400 with no error code (its
/// `StreamingBody` refuses the body once it passes the cap; see `tests/FIDELITY.md`).
fn body_too_large(cap: usize) -> http::Response<Bytes> {
    let request_id = Uuid::new_v4().to_string();
    let body = serde_json::json!({
        "request_id": request_id,
        "message": format!("request body exceeded maximum size of {cap} bytes"),
    });
    let mut response = http::Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = http::StatusCode::BAD_REQUEST;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = http::HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

/// What a per-VM listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerKind {
    /// The cluster's Kubernetes API (TLS) on a joined server VM.
    KubeApi,
    /// The SSH daemon of a server VM.
    Ssh,
}

/// One open listener as reported by [`Listeners::snapshot`].
#[derive(Clone, Debug, Serialize)]
pub struct ListenerInfo {
    /// Address the listener is bound to.
    pub addr: SocketAddr,
    /// What it serves.
    pub kind: ListenerKind,
    /// The instance it belongs to.
    pub instance: Uuid,
}

#[derive(Debug)]
struct Entry {
    kind: ListenerKind,
    owner: Uuid,
    task: JoinHandle<()>,
}

/// Decides whether a connection from `peer` to the listener on `local` gets through (the
/// rack's VPC firewall); a refused one is held open and never answered, the way a dropped
/// SYN looks to a client: a timeout, not a refusal.
pub type Gate = Arc<dyn Fn(IpAddr, SocketAddr) -> bool + Send + Sync>;

/// Registry of per-VM listeners: (ip, port) → the task serving it. Closing an entry aborts its
/// task, which drops the socket, so new connections to the address are refused at once.
#[derive(Clone, Default)]
pub struct Listeners {
    inner: Arc<Mutex<BTreeMap<SocketAddr, Entry>>>,
    gate: Arc<std::sync::RwLock<Option<Gate>>>,
}

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listeners")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// Exclusive access to the registry; held while deciding and applying a VM's listener set so
/// two concurrent updates for the same VM cannot interleave.
pub struct ListenersGuard<'a> {
    map: MutexGuard<'a, BTreeMap<SocketAddr, Entry>>,
    gate: Option<Gate>,
}

impl std::fmt::Debug for ListenersGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenersGuard")
            .field("map", &self.map)
            .finish_non_exhaustive()
    }
}

impl Listeners {
    /// Creates an empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Locks the registry. Lock order: the registry before any boot state.
    pub fn lock(&self) -> ListenersGuard<'_> {
        ListenersGuard {
            map: self
                .inner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            gate: self
                .gate
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        }
    }

    /// Puts `gate` in front of every listener opened from now on.
    pub fn set_gate(&self, gate: Gate) {
        *self
            .gate
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(gate);
    }

    /// True when something of `kind` is currently listening on `addr`.
    pub fn is_serving(&self, addr: SocketAddr, kind: ListenerKind) -> bool {
        self.lock()
            .map
            .get(&addr)
            .is_some_and(|e| e.kind == kind && !e.task.is_finished())
    }

    /// Closes every listener (simulator shutdown).
    pub fn close_all(&self) {
        let mut guard = self.lock();
        for (_, entry) in std::mem::take(&mut *guard.map) {
            entry.task.abort();
        }
    }

    /// Everything currently open, ordered by address.
    pub fn snapshot(&self) -> Vec<ListenerInfo> {
        self.lock()
            .map
            .iter()
            .map(|(addr, e)| ListenerInfo {
                addr: *addr,
                kind: e.kind,
                instance: e.owner,
            })
            .collect()
    }
}

impl ListenersGuard<'_> {
    /// Addresses (and kinds) currently owned by `owner`.
    pub fn owned_by(&self, owner: Uuid) -> Vec<(SocketAddr, ListenerKind)> {
        self.map
            .iter()
            .filter(|(_, e)| e.owner == owner)
            .map(|(addr, e)| (*addr, e.kind))
            .collect()
    }

    /// True when `addr` is taken by a listener of `kind` (of any owner).
    pub fn is_serving(&self, addr: SocketAddr, kind: ListenerKind) -> bool {
        self.serving_owner(addr, kind).is_some()
    }

    /// The owner of the live listener of `kind` on `addr`.
    pub fn serving_owner(&self, addr: SocketAddr, kind: ListenerKind) -> Option<Uuid> {
        self.map
            .get(&addr)
            .filter(|e| e.kind == kind && !e.task.is_finished())
            .map(|e| e.owner)
    }

    /// Closes the listener on `addr`, if any.
    pub fn close(&mut self, addr: SocketAddr) {
        if let Some(entry) = self.map.remove(&addr) {
            entry.task.abort();
            tracing::debug!(%addr, kind = ?entry.kind, instance = %entry.owner, "listener closed");
        }
    }

    /// Closes every listener owned by `owner`.
    pub fn close_owner(&mut self, owner: Uuid) {
        for (addr, _) in self.owned_by(owner) {
            self.close(addr);
        }
    }

    /// Binds `addr` (synchronously, so callers need no await while holding the guard) and
    /// registers the task built by `serve` for it, replacing whatever was there.
    pub fn open<F, Fut>(
        &mut self,
        addr: SocketAddr,
        kind: ListenerKind,
        owner: Uuid,
        serve: F,
    ) -> std::io::Result<()>
    where
        F: FnOnce(TcpListener) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.close(addr);
        let bind = |addr: SocketAddr| -> std::io::Result<TcpListener> {
            let std_listener = std::net::TcpListener::bind(addr)?;
            std_listener.set_nonblocking(true)?;
            TcpListener::from_std(std_listener)
        };
        let listener = bind(addr)?;
        let task = match self.gate.clone() {
            None => tokio::spawn(serve(listener)),
            Some(gate) => {
                // The server gets a private socket on the same address; the public one only
                // passes on what the gate admits.
                let inner = bind(SocketAddr::new(addr.ip(), 0))?;
                let inner_addr = inner.local_addr()?;
                let served = serve(inner);
                tokio::spawn(async move {
                    tokio::join!(served, gate_loop(listener, addr, inner_addr, gate));
                })
            }
        };
        tracing::debug!(%addr, ?kind, instance = %owner, "listener opened");
        self.map.insert(addr, Entry { kind, owner, task });
        Ok(())
    }
}
