//! [`OxideRack`]: the [`Rack`] trait over the `oxide` SDK (0.18), talking HTTP to Nexus.
//!
//! This module owns the translation between domain types ([`crate::domain::model`]) and `oxide::types`,
//! pagination (every list reads every page), the retry of reads, and the classification of
//! API errors into [`RackError`]. Decisions (what to create, when to give up) do not live here:
//! mutations are sent once and their errors handed back, because only the caller knows whether
//! a retried create should adopt what an earlier, lost try made.
//!
//! The bearer token lives only inside the `reqwest` client, as a header marked sensitive. It
//! never reaches `Debug`, `Display` or an error. Note that the SDK logs the first KiB of request
//! bodies (user-data included) at DEBUG level under the `oxide` tracing target; binaries keep
//! that target at INFO or above.

use std::future::Future;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::str::FromStr as _;
use std::time::Duration;

use base64::Engine as _;
use oxide::prelude::*;
use oxide::types;

use crate::base::names;
use crate::base::retry::{self, Backoff};
use crate::base::size::ByteSize;
use crate::domain::firewall::{self as fw, OwnedRule, RuleChange};
use crate::domain::model::{
    AntiAffinityGroup, Disk, DiskState, ExternalIp, ExternalIpKind, FloatingIp, Image, Instance,
    InstanceState, NewDisk, NewInstance, Snapshot,
};
use crate::ports::rack::{Rack, RackError};

pub mod images;

/// Page size when none is configured.
pub const DEFAULT_PAGE_SIZE: u32 = 10_000;
/// Largest page Nexus serves; larger requests are clamped by the server anyway.
pub const MAX_PAGE_SIZE: u32 = 10_000;
/// How much recent serial console output [`Rack::serial_console`] reads. cloud-init's SSH
/// host key block is printed late in the first boot (and our per-boot script prints it on
/// every boot), so the tail is what matters.
pub const SERIAL_CONSOLE_BYTES: u64 = 256 * 1024;
/// Bytes asked for per request. propolis returns 16 KiB unless `max_bytes` says otherwise,
/// reading FORWARD from the start offset; Nexus passes `max_bytes` on only when given.
const SERIAL_CONSOLE_PAGE: u64 = 128 * 1024;
/// Block size of the blank data disks we create. 4096 is the native size of the rack's storage.
const DATA_DISK_BLOCK_SIZE: i64 = 4096;
/// Description given to a project we create.
const PROJECT_DESCRIPTION: &str = "created by oxide-controller";
/// How dropshot starts its refusal of an `api-version` newer than the server's.
const VERSION_REFUSED: &str = "server does not support this API version";
/// Nexus API versions of released rack software, newest first (the newest
/// `openapi/nexus/nexus-*.json` at omicron's `rel/vNN` tags). Only used to name the rack's
/// version when it refuses ours: nexus does not report its version otherwise.
const RACK_RELEASES: &[(&str, &str)] = &[
    ("22", "2026073100.0.0"),
    ("21", "2026061000.0.0"),
    ("20", "2026060800.0.0"),
    ("19", "2026032500.0.0"),
    ("18", "2026021301.0.0"),
];

/// The `api-version` every request carries (the SDK's): the oldest rack API this controller
/// works with.
pub fn api_version() -> &'static str {
    <oxide::Client as oxide::ClientInfo<()>>::api_version()
}

/// The one-line error for a rack older than [`api_version`]; `accepts` is the newest released
/// version it was seen to accept, if any.
fn too_old(accepts: Option<(&str, &str)>) -> RackError {
    let need = api_version();
    let rack = match accepts {
        Some((release, v)) => format!("{v} (rack release {release})"),
        None => "an older version".to_owned(),
    };
    RackError::Invalid {
        what: "the Oxide API version".to_owned(),
        message: format!(
            "the rack serves Oxide API {rack}, older than {need} that this controller needs; upgrade the rack to release 22 or newer"
        ),
    }
}

fn is_too_old(e: &RackError) -> bool {
    matches!(e, RackError::Invalid { what, .. } if what == "the Oxide API version")
}

/// Timeouts, page size and read retry policy of an [`OxideRack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RackOptions {
    /// Whole-request deadline (connect, send, answer, body).
    pub request_timeout: Duration,
    /// TCP + TLS connect deadline.
    pub connect_timeout: Duration,
    /// Items per page for list calls; clamped to `1..=MAX_PAGE_SIZE`.
    pub page_size: u32,
    /// Retry policy for reads that fail with a retryable error (503, 5xx, timeouts, transport).
    pub read_retry: Backoff,
}

impl Default for RackOptions {
    fn default() -> Self {
        RackOptions {
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            page_size: DEFAULT_PAGE_SIZE,
            read_retry: Backoff::default(),
        }
    }
}

/// Whether `url`'s host is a loopback address (127.0.0.0/8, `[::1]`) or `localhost`: the only
/// hosts the token may be sent to over plain http://.
fn is_loopback(url: &reqwest::Url) -> bool {
    // The URL parser has already normalised IP literals (`[::1]`, `2130706433`).
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The Oxide API of one project on one rack.
pub struct OxideRack {
    client: oxide::Client,
    host: String,
    project: String,
    opts: RackOptions,
}

impl std::fmt::Debug for OxideRack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token lives in the client's default headers; never print the client.
        f.debug_struct("OxideRack")
            .field("host", &self.host)
            .field("project", &self.project)
            .field("token", &"<redacted>")
            .field("opts", &self.opts)
            .finish()
    }
}

impl OxideRack {
    /// Builds a client for `host` (`https://...`, or `http://` on a loopback address only: a
    /// simulator, or a local TLS-terminating proxy) that sends
    /// `Authorization: Bearer <token>` on every request and works in `project`. Does no I/O;
    /// bad credentials surface on the first call as [`RackError::Unauthorized`].
    ///
    /// Never uses `oxide::ClientConfig` (it reads `$HOME`, which containers may not have).
    pub fn connect(
        host: &str,
        token: &str,
        project: &str,
        opts: RackOptions,
    ) -> Result<OxideRack, RackError> {
        let host = host.trim().trim_end_matches('/');
        let url = reqwest::Url::parse(host).map_err(|e| RackError::Invalid {
            what: format!("Oxide host {host:?}"),
            message: format!("not a URL: {e}"),
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(RackError::Invalid {
                what: format!("Oxide host {host:?}"),
                message: "must be an http:// or https:// URL with a host".to_owned(),
            });
        }
        if url.scheme() == "http" && !is_loopback(&url) {
            return Err(RackError::Invalid {
                what: format!("Oxide host {host:?}"),
                message: format!(
                    "is plain http:// and not loopback: the API token would cross the network in clear; use https://{}",
                    host.split_once("://").map_or(host, |(_, rest)| rest)
                ),
            });
        }
        names::validate_name("project name", project).map_err(|e| RackError::Invalid {
            what: format!("project {project:?}"),
            message: e.to_string(),
        })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(RackError::Invalid {
                what: "Oxide token".to_owned(),
                message: "is empty".to_owned(),
            });
        }
        let mut auth =
            reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                RackError::Invalid {
                    what: "Oxide token".to_owned(),
                    // Deliberately says nothing about the token's content.
                    message: "contains characters not allowed in an HTTP header".to_owned(),
                }
            })?;
        auth.set_sensitive(true);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, auth);

        let opts = RackOptions {
            page_size: opts.page_size.clamp(1, MAX_PAGE_SIZE),
            ..opts
        };
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(opts.connect_timeout)
            .timeout(opts.request_timeout)
            .user_agent(concat!("oxide-controller/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| RackError::Transport {
                what: format!("HTTP client for {host}"),
                source: Box::new(e),
            })?;
        Ok(OxideRack {
            client: oxide::Client::new_with_client(host, http),
            host: host.to_owned(),
            project: project.to_owned(),
            opts,
        })
    }

    /// The project every call works in.
    pub fn project(&self) -> &str {
        &self.project
    }

    /// The API base URL.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The SDK client (for adapters of other traits over the same connection, e.g. images).
    pub(crate) fn client(&self) -> &oxide::Client {
        &self.client
    }

    /// Timeouts, page size and retry policy in force.
    pub fn options(&self) -> RackOptions {
        self.opts
    }

    /// [`Rack::attach_floating_ip`], retried with `backoff` while the rack answers with a
    /// retryable error — chiefly the 503 Nexus gives while the instance is in a transient
    /// state (`starting` right after create). Transport errors and timeouts are retried too:
    /// attaching to the same instance again is idempotent, so a lost answer is harmless.
    pub async fn attach_floating_ip_retrying(
        &self,
        fip: &str,
        instance: &str,
        backoff: Backoff,
    ) -> Result<(), RackError> {
        retry::retry(backoff, RackError::is_retryable, || {
            self.attach_floating_ip(fip, instance)
        })
        .await
    }

    /// Runs a read with the configured retry policy.
    async fn read<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, RackError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, oxide::Error<types::Error>>>,
    {
        let result = retry::retry(self.opts.read_retry, RackError::is_retryable, || {
            let fut = op();
            async move { fut.await.map_err(|e| self.classify(what, e)) }
        })
        .await;
        match result {
            Err(e) => Err(self.name_rack_version(e).await),
            ok => ok,
        }
    }

    /// A refusal of our API version, with the rack's own version named when it is a
    /// released one; any other error unchanged.
    async fn name_rack_version(&self, e: RackError) -> RackError {
        if is_too_old(&e) {
            too_old(self.rack_release().await)
        } else {
            e
        }
    }

    /// Like [`Self::read`], with `Ok(None)` for a 404.
    async fn read_optional<T, F, Fut>(&self, what: &str, op: F) -> Result<Option<T>, RackError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, oxide::Error<types::Error>>>,
    {
        match self.read(what, op).await {
            Ok(v) => Ok(Some(v)),
            Err(RackError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads every page: `fetch(None)` asks for the first page, `fetch(Some(token))` for the
    /// next. Each page is retried on its own, so a 503 halfway does not restart the listing.
    /// Stops at a short or empty page, or a missing `next_page`.
    async fn all_pages<T, F, Fut>(&self, what: &str, fetch: F) -> Result<Vec<T>, RackError>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<(Vec<T>, Option<String>), oxide::Error<types::Error>>>,
    {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let (items, next) = self.read(what, || fetch(token.clone())).await?;
            // The API fills every page but the last, so a short page ends the listing
            // without asking for the empty page after it.
            let last = items.len() < self.page_size().get() as usize;
            if items.is_empty() {
                return Ok(out);
            }
            out.extend(items);
            if last {
                return Ok(out);
            }
            match next {
                None => return Ok(out),
                // A server handing back the token we sent would loop us forever.
                Some(next) if token.as_deref() == Some(next.as_str()) => {
                    return Err(RackError::Unexpected {
                        what: what.to_owned(),
                        message: "the API returned the same page token twice".to_owned(),
                    });
                }
                Some(next) => token = Some(next),
            }
        }
    }

    fn page_size(&self) -> NonZeroU32 {
        NonZeroU32::new(self.opts.page_size).unwrap_or(NonZeroU32::MIN)
    }

    /// Sends a mutation once and classifies its error.
    async fn mutate<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<oxide::ResponseValue<T>, oxide::Error<types::Error>>>,
    ) -> Result<T, RackError> {
        match fut.await {
            Ok(v) => Ok(v.into_inner()),
            Err(e) => Err(self.name_rack_version(self.classify(what, e)).await),
        }
    }

    fn classify(&self, what: &str, err: oxide::Error<types::Error>) -> RackError {
        classify(what, err, self.opts.request_timeout)
    }
}

/// Maps an SDK error to a [`RackError`] about `what`. `timeout` is the configured request
/// timeout, reported when the request ran out of time.
pub(crate) fn classify(
    what: &str,
    err: oxide::Error<types::Error>,
    timeout: Duration,
) -> RackError {
    let what = what.to_owned();
    match err {
        oxide::Error::ErrorResponse(rv) => {
            let status = rv.status().as_u16();
            let body = rv.into_inner();
            classify_status(what, status, body.error_code.as_deref(), body.message)
        }
        oxide::Error::CommunicationError(e) | oxide::Error::ResponseBodyError(e) => {
            if e.is_timeout() {
                RackError::Timeout {
                    what,
                    seconds: timeout
                        .as_millis()
                        .div_ceil(1000)
                        .try_into()
                        .unwrap_or(u64::MAX),
                }
            } else {
                RackError::Transport {
                    what,
                    source: Box::new(e),
                }
            }
        }
        // The SDK refused to build the request (a value failed the API's pattern).
        oxide::Error::InvalidRequest(message) => RackError::Invalid { what, message },
        oxide::Error::InvalidResponsePayload(_, e) => RackError::Unexpected {
            what,
            message: format!("cannot parse the answer: {e}"),
        },
        oxide::Error::UnexpectedResponse(resp) => RackError::Unexpected {
            what,
            message: format!("unexpected HTTP status {}", resp.status()),
        },
        oxide::Error::InvalidUpgrade(e) => RackError::Unexpected {
            what,
            message: format!("invalid connection upgrade: {e}"),
        },
        oxide::Error::Custom(message) => RackError::Unexpected { what, message },
    }
}

/// The part of [`classify`] that looks at an API error answer (status, `error_code`, message).
fn classify_status(what: String, status: u16, code: Option<&str>, message: String) -> RackError {
    match status {
        404 => RackError::NotFound { what },
        // Nexus answers ObjectAlreadyExists with 400, not 409.
        400 if code == Some("ObjectAlreadyExists") => RackError::AlreadyExists { what },
        400 if code.is_none() && message.starts_with(VERSION_REFUSED) => too_old(None),
        401 | 403 => RackError::Unauthorized { status, message },
        409 => RackError::Conflict { what, message },
        507 => RackError::InsufficientCapacity { what, message },
        // Nexus has no 408/429 today; a proxy in front of it might. Both pass with time.
        408 | 429 | 500..=599 => RackError::Unavailable {
            what,
            status,
            message,
        },
        _ => RackError::Invalid { what, message },
    }
}

fn instance_from(i: types::Instance) -> Instance {
    Instance {
        id: i.id,
        name: i.name.to_string(),
        description: i.description,
        hostname: i.hostname,
        state: state_from(i.run_state),
        ncpus: i.ncpus.0,
        memory: ByteSize(i.memory.0),
        time_created: i.time_created,
        time_state_updated: i.time_run_state_updated,
    }
}

fn state_from(s: types::InstanceState) -> InstanceState {
    use types::InstanceState as S;
    match s {
        S::Creating => InstanceState::Creating,
        S::Starting => InstanceState::Starting,
        S::Running => InstanceState::Running,
        S::Stopping => InstanceState::Stopping,
        S::Stopped => InstanceState::Stopped,
        S::Rebooting => InstanceState::Rebooting,
        S::Migrating => InstanceState::Migrating,
        S::Repairing => InstanceState::Repairing,
        S::Failed => InstanceState::Failed,
        S::Destroyed => InstanceState::Destroyed,
    }
}

fn disk_from(d: types::Disk) -> Disk {
    use types::DiskState as S;
    let state = match d.state {
        S::Detached => DiskState::Detached,
        S::Attached(id) => DiskState::Attached(id),
        S::Faulted => DiskState::Faulted,
        S::Creating => DiskState::Busy("creating".to_owned()),
        S::ImportReady => DiskState::Busy("import_ready".to_owned()),
        S::ImportingFromUrl => DiskState::Busy("importing_from_url".to_owned()),
        S::ImportingFromBulkWrites => DiskState::Busy("importing_from_bulk_writes".to_owned()),
        S::Finalizing => DiskState::Busy("finalizing".to_owned()),
        S::Maintenance => DiskState::Busy("maintenance".to_owned()),
        S::Attaching(_) => DiskState::Busy("attaching".to_owned()),
        S::Detaching(_) => DiskState::Busy("detaching".to_owned()),
        S::Destroyed => DiskState::Busy("destroyed".to_owned()),
    };
    Disk {
        id: d.id,
        name: d.name.to_string(),
        description: d.description,
        state,
        size: ByteSize(d.size.0),
        time_created: d.time_created,
        image_id: d.image_id,
    }
}

fn floating_ip_from(f: types::FloatingIp) -> FloatingIp {
    FloatingIp {
        id: f.id,
        name: f.name.to_string(),
        description: f.description,
        ip: f.ip,
        instance_id: f.instance_id,
    }
}

fn external_ip_from(e: types::ExternalIp) -> ExternalIp {
    match e {
        types::ExternalIp::Snat { ip, .. } => ExternalIp {
            ip,
            kind: ExternalIpKind::Snat,
        },
        types::ExternalIp::Ephemeral { ip, .. } => ExternalIp {
            ip,
            kind: ExternalIpKind::Ephemeral,
        },
        types::ExternalIp::Floating { ip, .. } => ExternalIp {
            ip,
            kind: ExternalIpKind::Floating,
        },
    }
}

fn image_from(i: types::Image) -> Image {
    Image {
        id: i.id,
        name: i.name.to_string(),
        description: i.description,
        size: ByteSize(i.size.0),
        block_size: u64::try_from(*i.block_size).unwrap_or(0),
        silo_scoped: i.project_id.is_none(),
    }
}

/// A value the SDK's own type rejects, reported as the API would.
fn invalid(what: &str, field: &str, e: impl std::fmt::Display) -> RackError {
    RackError::Invalid {
        what: what.to_owned(),
        message: format!("{field}: {e}"),
    }
}

fn name(what: &str, field: &str, value: &str) -> Result<types::Name, RackError> {
    types::Name::try_from(value).map_err(|e| invalid(what, field, e))
}

/// The pool to allocate an address from: the named one, or the silo's default IPv4 pool
/// (our NICs are IPv4-only, so an IPv6 address would be unreachable).
fn pool_selector(what: &str, pool: Option<&str>) -> Result<types::PoolSelector, RackError> {
    Ok(match pool {
        Some(p) => types::PoolSelector::Explicit {
            pool: types::NameOrId::try_from(p).map_err(|e| invalid(what, "ip pool", e))?,
        },
        None => types::PoolSelector::Auto {
            ip_version: Some(types::IpVersion::V4),
        },
    })
}

/// A disk created with the instance: from an image when it has one, else blank.
fn disk_attachment(
    what: &str,
    disk: &NewDisk,
    description: &str,
) -> Result<types::InstanceDiskAttachment, RackError> {
    let source = match disk.image {
        Some(image_id) => types::DiskSource::Image {
            image_id,
            read_only: false,
        },
        None => types::DiskSource::Blank {
            block_size: types::BlockSize::try_from(DATA_DISK_BLOCK_SIZE)
                .map_err(|e| invalid(what, "block size", e))?,
        },
    };
    Ok(types::InstanceDiskAttachment::Create {
        description: description.to_owned(),
        disk_backend: types::DiskBackend::Distributed(source),
        name: name(what, "disk name", &disk.name)?,
        size: types::ByteCount(disk.size.bytes()),
    })
}

/// Translates a [`NewInstance`] into the API's create body.
pub(crate) fn instance_create_body(new: &NewInstance) -> Result<types::InstanceCreate, RackError> {
    let what = format!("instance {}", new.name);
    let what = what.as_str();
    let external_ips = if new.ephemeral_ip {
        vec![types::ExternalIpCreate::Ephemeral {
            pool_selector: pool_selector(what, new.ip_pool.as_deref())?,
        }]
    } else {
        Vec::new()
    };
    let anti_affinity_groups = match &new.anti_affinity_group {
        Some(g) => vec![types::NameOrId::Name(name(what, "anti-affinity group", g)?)],
        None => Vec::new(),
    };
    let mut disks = match &new.data_disk {
        Some(d) => vec![disk_attachment(what, d, &new.description)?],
        None => Vec::new(),
    };
    if let Some(r) = &new.restore_disk {
        disks.push(types::InstanceDiskAttachment::Create {
            description: new.description.clone(),
            disk_backend: types::DiskBackend::Distributed(types::DiskSource::Snapshot {
                read_only: false,
                snapshot_id: r.snapshot,
            }),
            name: name(what, "disk name", &r.name)?,
            size: types::ByteCount(r.size.bytes()),
        });
    }
    Ok(types::InstanceCreate {
        anti_affinity_groups,
        // Servers: `best_effort`, so a sled fault that fails them (even two at once, when no
        // controller run can happen) ends with the rack starting them on their intact disks.
        // Workers: `never`; the controller replaces them. Either way a removal stops the
        // instance before deleting it, which clears nexus's intent to run it, so an automatic
        // restart cannot bring back a member being removed (DESIGN-NOTES "Start before
        // replace").
        auto_restart_policy: Some(if new.rack_restarts {
            types::InstanceAutoRestartPolicy::BestEffort
        } else {
            types::InstanceAutoRestartPolicy::Never
        }),
        boot_disk: Some(disk_attachment(what, &new.boot_disk, &new.description)?),
        cpu_platform: None,
        description: new.description.clone(),
        disks,
        enable_jumbo_frames: false,
        external_ips,
        hostname: types::Hostname::try_from(new.hostname.as_str())
            .map_err(|e| invalid(what, "hostname", e))?,
        memory: types::ByteCount(new.memory.bytes()),
        multicast_groups: Vec::new(),
        name: name(what, "name", &new.name)?,
        ncpus: types::InstanceCpuCount(new.ncpus),
        network_interfaces: types::InstanceNetworkInterfaceAttachment::DefaultIpv4,
        // Some([]), not None: None would inject every SSH key of the token's user. Our keys
        // travel in cloud-init only.
        ssh_public_keys: Some(Vec::new()),
        start: true,
        user_data: base64::engine::general_purpose::STANDARD.encode(&new.user_data),
    })
}

/// The local address this machine sends from toward the rack's API at `host` (a URL): a UDP
/// socket connected to the API's address takes the source address the kernel's route
/// lookup picks, and a UDP connect sends no packet.
pub async fn source_address_toward(host: &str) -> Result<std::net::IpAddr, String> {
    let url = reqwest::Url::parse(host).map_err(|e| format!("{host:?} is not a URL: {e}"))?;
    let name = url
        .host_str()
        .ok_or_else(|| format!("{host:?} names no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs = tokio::net::lookup_host((name.as_str(), port))
        .await
        .map_err(|e| format!("resolving {name}: {e}"))?;
    let mut last = format!("{name} has no address");
    for addr in addrs {
        let local: std::net::SocketAddr = if addr.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let found = async {
            let socket = tokio::net::UdpSocket::bind(local).await?;
            socket.connect(addr).await?;
            socket.local_addr()
        }
        .await;
        match found {
            Ok(a) => return Ok(a.ip()),
            Err(e) => last = format!("no route to {addr}: {e}"),
        }
    }
    Err(last)
}

/// The VPC every project gets, which default NICs join.
const DEFAULT_VPC: &str = "default";

/// The update form of a rule we own (inbound, enabled, in the `default` VPC).
fn firewall_rule_update(rule: &OwnedRule) -> Result<types::VpcFirewallRuleUpdate, RackError> {
    let what = format!("firewall rule {}", rule.name);
    let instance = |n: &String| name(&what, "instance", n);
    let hosts = match &rule.hosts {
        fw::RuleHosts::Any => None,
        fw::RuleHosts::Vpc => Some(vec![types::VpcFirewallRuleHostFilter::Vpc(name(
            &what,
            "vpc",
            DEFAULT_VPC,
        )?)]),
        fw::RuleHosts::Cidrs(cidrs) => Some(
            cidrs
                .iter()
                .map(|c| {
                    types::IpNet::from_str(&c.to_string())
                        .map(types::VpcFirewallRuleHostFilter::IpNet)
                        .map_err(|e| invalid(&what, "source", e))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        fw::RuleHosts::Instances(names) => Some(
            names
                .iter()
                .map(|n| instance(n).map(types::VpcFirewallRuleHostFilter::Instance))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        // Taken from the rule at the rack by `ensure_firewall_rules`.
        fw::RuleHosts::Kept => None,
    };
    let targets = match &rule.targets {
        fw::RuleTargets::Vpc => vec![types::VpcFirewallRuleTarget::Vpc(name(
            &what,
            "vpc",
            DEFAULT_VPC,
        )?)],
        // A rule with no target applies to every NIC of the VPC (omicron
        // `nexus/networking/src/firewall_rules.rs`): never what naming instances means.
        fw::RuleTargets::Instances(names) if names.is_empty() => {
            return Err(invalid(
                &what,
                "targets",
                "no instance named (the rule would apply to every instance)",
            ));
        }
        fw::RuleTargets::Instances(names) => names
            .iter()
            .map(|n| instance(n).map(types::VpcFirewallRuleTarget::Instance))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let ports = rule
        .ports
        .iter()
        .map(|(a, b)| {
            let text = if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            };
            types::L4PortRange::try_from(text).map_err(|e| invalid(&what, "port", e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let protocols = rule
        .protocols
        .iter()
        .map(|p| match p {
            fw::Protocol::Tcp => types::VpcFirewallRuleProtocol::Tcp,
            fw::Protocol::Udp => types::VpcFirewallRuleProtocol::Udp,
        })
        .collect();
    Ok(types::VpcFirewallRuleUpdate {
        action: match rule.action {
            fw::Action::Allow => types::VpcFirewallRuleAction::Allow,
            fw::Action::Deny => types::VpcFirewallRuleAction::Deny,
        },
        description: rule.description.clone(),
        direction: types::VpcFirewallRuleDirection::Inbound,
        filters: types::VpcFirewallRuleFilter {
            hosts,
            ports: Some(ports),
            protocols: Some(protocols),
        },
        name: name(&what, "name", &rule.name)?,
        priority: rule.priority,
        status: types::VpcFirewallRuleStatus::Enabled,
        targets,
    })
}

fn rule_update_from(r: types::VpcFirewallRule) -> types::VpcFirewallRuleUpdate {
    types::VpcFirewallRuleUpdate {
        action: r.action,
        description: r.description,
        direction: r.direction,
        filters: r.filters,
        name: r.name,
        priority: r.priority,
        status: r.status,
        targets: r.targets,
    }
}

/// The SDK's rule types have no `PartialEq`; their JSON is their identity.
fn same_rule(a: &types::VpcFirewallRuleUpdate, b: &types::VpcFirewallRuleUpdate) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

/// How much of the start of the console history [`Rack::serial_console_head`] reads:
/// propolis keeps the first MiB of a VMM's output however much follows
/// (propolis@372a574 `lib/propolis/src/hw/uart/history_buffer.rs:110-117`, per
/// `audits/guest-2.md` G10).
pub const SERIAL_CONSOLE_HEAD_BYTES: u64 = 1024 * 1024;

impl OxideRack {
    /// The start of the instance's console history (at most
    /// [`SERIAL_CONSOLE_HEAD_BYTES`]): where cloud-init's first-boot fingerprint block stays
    /// when more than [`SERIAL_CONSOLE_BYTES`] were printed after it.
    async fn console_head(&self, name: &str) -> Result<Vec<u8>, RackError> {
        let what = format!("serial console of instance {name}");
        let mut out: Vec<u8> = Vec::new();
        while (out.len() as u64) < SERIAL_CONSOLE_HEAD_BYTES {
            let from = out.len() as u64;
            let want = SERIAL_CONSOLE_PAGE.min(SERIAL_CONSOLE_HEAD_BYTES - from);
            let data = self.console_page(&what, name, from, want).await?;
            if data.is_empty() {
                break;
            }
            let full = data.len() as u64 >= want;
            out.extend(data);
            if !full {
                break;
            }
        }
        Ok(out)
    }

    /// At most `want` console bytes read forward from the absolute offset `from`.
    async fn console_page(
        &self,
        what: &str,
        name: &str,
        from: u64,
        want: u64,
    ) -> Result<Vec<u8>, RackError> {
        let page = self
            .read(what, || {
                self.client
                    .instance_serial_console()
                    .project(self.project.as_str())
                    .instance(name)
                    .from_start(from)
                    .max_bytes(want)
                    .send()
            })
            .await?;
        let mut data = page.into_inner().data;
        data.truncate(usize::try_from(want).unwrap_or(usize::MAX));
        Ok(data)
    }

    /// The newest released API version the rack accepts (read-only probes, at most one per
    /// entry of [`RACK_RELEASES`]), after it refused ours.
    async fn rack_release(&self) -> Option<(&'static str, &'static str)> {
        let url = format!("{}/v1/projects?limit=1", self.host);
        for &(release, version) in RACK_RELEASES {
            if version == api_version() {
                continue;
            }
            let http = <oxide::Client as oxide::ClientInfo<()>>::client(&self.client);
            let Ok(resp) = http.get(&url).header("api-version", version).send().await else {
                return None;
            };
            if resp.status().is_success() {
                return Some((release, version));
            }
            let body: Option<types::Error> = resp.json().await.ok();
            if !body.is_some_and(|b| b.message.starts_with(VERSION_REFUSED)) {
                return None;
            }
        }
        None
    }

    async fn firewall_rules(&self) -> Result<Vec<types::VpcFirewallRule>, RackError> {
        let what = format!("firewall rules of project {}", self.project);
        self.read(&what, || {
            self.client
                .vpc_firewall_rules_view()
                .project(self.project.as_str())
                .vpc(DEFAULT_VPC)
                .send()
        })
        .await
        .map(|rv| rv.into_inner().rules)
    }

    /// Read-modify-write of the default VPC's rule list, checked. `edit` gets the current
    /// list and returns the list to write (`None`: nothing to do); after the write the list is
    /// read again and `holds` must accept it. Nexus replaces the list whole and takes no
    /// precondition, so a second writer that read before our write and wrote after it (a
    /// second bootstrap in the project, a console edit) silently undoes ours: that shows in
    /// the re-read, and the edit is made again on the list as it now is, up to
    /// [`FIREWALL_WRITE_ATTEMPTS`] times. Returns the first write's value.
    async fn edit_firewall_rules<T>(
        &self,
        what: &str,
        edit: impl Fn(Vec<types::VpcFirewallRule>) -> Option<(Vec<types::VpcFirewallRuleUpdate>, T)>,
        holds: impl Fn(&[types::VpcFirewallRule]) -> bool,
    ) -> Result<Option<T>, RackError> {
        let mut first = None;
        for attempt in 1..=FIREWALL_WRITE_ATTEMPTS {
            let Some((rules, value)) = edit(self.firewall_rules().await?) else {
                return Ok(first);
            };
            first.get_or_insert(value);
            self.mutate(
                what,
                self.client
                    .vpc_firewall_rules_update()
                    .project(self.project.as_str())
                    .vpc(DEFAULT_VPC)
                    .body(types::VpcFirewallRuleUpdateParams { rules })
                    .send(),
            )
            .await?;
            if holds(&self.firewall_rules().await?) {
                return Ok(first);
            }
            tracing::warn!(
                what,
                attempt,
                "another writer replaced the VPC firewall rules right after ours; writing again"
            );
        }
        Err(RackError::Conflict {
            what: what.to_owned(),
            message: format!(
                "another writer replaced the VPC firewall rules of project {} right after each of our {FIREWALL_WRITE_ATTEMPTS} writes; stop it (a second bootstrap, a console edit) and re-run",
                self.project
            ),
        })
    }
}

/// How many times a firewall edit is written while another writer keeps undoing it.
const FIREWALL_WRITE_ATTEMPTS: u32 = 3;

impl Rack for OxideRack {
    async fn ensure_project(&self) -> Result<(), RackError> {
        let what = format!("project {}", self.project);
        // Look first: a token scoped to the project may see it but not be allowed to create
        // projects in the silo.
        let found = self
            .read_optional(&what, || {
                self.client
                    .project_view()
                    .project(self.project.as_str())
                    .send()
            })
            .await?;
        if found.is_some() {
            return Ok(());
        }
        // API 2026073100 (rack release 22) creates the default VPC and subnet with every
        // project; default NICs need them.
        let body = types::ProjectCreate {
            description: PROJECT_DESCRIPTION.to_owned(),
            name: name(&what, "name", &self.project)?,
        };
        match self
            .mutate(&what, self.client.project_create().body(body).send())
            .await
        {
            Ok(_) | Err(RackError::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn list_instances(&self, prefix: &str) -> Result<Vec<Instance>, RackError> {
        let what = format!("instances of project {}", self.project);
        // Oxide has no server-side name filter: read everything, filter here.
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.instance_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all
            .into_iter()
            .filter(|i| i.name.starts_with(prefix))
            .map(instance_from)
            .collect())
    }

    async fn get_instance(&self, name: &str) -> Result<Option<Instance>, RackError> {
        let what = format!("instance {name}");
        let found = self
            .read_optional(&what, || {
                self.client
                    .instance_view()
                    .project(self.project.as_str())
                    .instance(name)
                    .send()
            })
            .await?;
        Ok(found.map(|rv| instance_from(rv.into_inner())))
    }

    async fn instance_private_ip(&self, name: &str) -> Result<Option<IpAddr>, RackError> {
        let what = format!("network interfaces of instance {name}");
        let nics = self
            .read_optional(&what, || {
                self.client
                    .instance_network_interface_list()
                    .project(self.project.as_str())
                    .instance(name)
                    .send()
            })
            .await?;
        Ok(nics.and_then(|page| {
            let page = page.into_inner();
            let nic = page
                .items
                .iter()
                .find(|n| n.primary)
                .or(page.items.first())?;
            Some(match &nic.ip_stack {
                types::PrivateIpStack::V4(v4) | types::PrivateIpStack::DualStack { v4, .. } => {
                    IpAddr::V4(v4.ip)
                }
                types::PrivateIpStack::V6(v6) => IpAddr::V6(v6.ip),
            })
        }))
    }

    async fn create_instance(&self, new: &NewInstance) -> Result<Instance, RackError> {
        let what = format!("instance {}", new.name);
        let body = instance_create_body(new)?;
        let created = self
            .mutate(
                &what,
                self.client
                    .instance_create()
                    .project(self.project.as_str())
                    .body(body)
                    .send(),
            )
            .await?;
        Ok(instance_from(created))
    }

    async fn start_instance(&self, name: &str) -> Result<(), RackError> {
        let what = format!("instance {name}");
        self.mutate(
            &what,
            self.client
                .instance_start()
                .project(self.project.as_str())
                .instance(name)
                .send(),
        )
        .await
        .map(drop)
    }

    async fn reboot_instance(&self, name: &str) -> Result<(), RackError> {
        let what = format!("instance {name}");
        self.mutate(
            &what,
            self.client
                .instance_reboot()
                .project(self.project.as_str())
                .instance(name)
                .send(),
        )
        .await
        .map(drop)
    }

    async fn stop_instance(&self, name: &str) -> Result<(), RackError> {
        let what = format!("instance {name}");
        self.mutate(
            &what,
            self.client
                .instance_stop()
                .project(self.project.as_str())
                .instance(name)
                .send(),
        )
        .await
        .map(drop)
    }

    async fn delete_instance(&self, name: &str) -> Result<(), RackError> {
        let what = format!("instance {name}");
        self.mutate(
            &what,
            self.client
                .instance_delete()
                .project(self.project.as_str())
                .instance(name)
                .send(),
        )
        .await
    }

    async fn instance_external_ips(&self, name: &str) -> Result<Vec<ExternalIp>, RackError> {
        let what = format!("external IPs of instance {name}");
        // Not paginated; includes the SNAT address, which callers must never connect to.
        let page = self
            .read(&what, || {
                self.client
                    .instance_external_ip_list()
                    .project(self.project.as_str())
                    .instance(name)
                    .send()
            })
            .await?
            .into_inner();
        Ok(page.items.into_iter().map(external_ip_from).collect())
    }

    async fn serial_console_head(&self, name: &str) -> Result<Vec<u8>, RackError> {
        self.console_head(name).await
    }

    async fn serial_console(&self, name: &str) -> Result<Vec<u8>, RackError> {
        let what = format!("serial console of instance {name}");
        // The last page first (`most_recent` = `max_bytes`: exactly the tail), then the pages
        // before it, until SERIAL_CONSOLE_BYTES are read or the history starts. Each page is
        // read forward from an absolute offset, so output written meanwhile cannot shift it.
        let last = self
            .read(&what, || {
                self.client
                    .instance_serial_console()
                    .project(self.project.as_str())
                    .instance(name)
                    .most_recent(SERIAL_CONSOLE_PAGE)
                    .max_bytes(SERIAL_CONSOLE_PAGE)
                    .send()
            })
            .await?
            .into_inner();
        let mut start = last.last_byte_offset.saturating_sub(last.data.len() as u64);
        let mut pages = vec![last.data];
        let mut have = pages[0].len() as u64;
        while start > 0 && have < SERIAL_CONSOLE_BYTES {
            let from = start.saturating_sub(SERIAL_CONSOLE_PAGE);
            let want = start - from;
            // The middle of a long history is gone (propolis keeps the first and the last
            // MiB); what was read is the tail, which is what callers need.
            let Ok(data) = self.console_page(&what, name, from, want).await else {
                break;
            };
            if data.is_empty() {
                break;
            }
            have += data.len() as u64;
            start = from;
            pages.push(data);
        }
        Ok(pages.into_iter().rev().flatten().collect())
    }

    async fn list_disks(&self) -> Result<Vec<Disk>, RackError> {
        let what = format!("disks of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.disk_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all.into_iter().map(disk_from).collect())
    }

    async fn delete_disk(&self, name: &str) -> Result<(), RackError> {
        let what = format!("disk {name}");
        self.mutate(
            &what,
            self.client
                .disk_delete()
                .project(self.project.as_str())
                .disk(name)
                .send(),
        )
        .await
    }

    async fn list_floating_ips(&self) -> Result<Vec<FloatingIp>, RackError> {
        let what = format!("floating IPs of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.floating_ip_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all.into_iter().map(floating_ip_from).collect())
    }

    async fn my_access_tokens(
        &self,
    ) -> Result<Vec<crate::domain::oxide_token::AccessToken>, RackError> {
        let all = self
            .all_pages("the user's access tokens", |token| {
                let b = self
                    .client
                    .current_user_access_token_list()
                    .limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b.sort_by(types::IdSortMode::IdAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all
            .into_iter()
            .map(|t| crate::domain::oxide_token::AccessToken {
                id: t.id.to_string(),
                expires_at: t.time_expires,
            })
            .collect())
    }

    /// Stop, finalize, delete: the walk [`crate::adapters::image::release_import_disk`] does through
    /// this rack's [`crate::adapters::image::ImageStore`] side.
    async fn delete_import_disk(&self, name: &str) -> Result<(), RackError> {
        match crate::adapters::image::release_import_disk(
            self,
            name,
            crate::base::retry::Backoff::default(),
        )
        .await
        {
            Ok(()) => Ok(()),
            Err(crate::adapters::image::ImageError::Rack { source, .. }) => Err(source),
            Err(e) => Err(RackError::Unexpected {
                what: format!("import disk {name}"),
                message: e.to_string(),
            }),
        }
    }

    async fn default_subnet_prefix(&self) -> Result<Option<u8>, RackError> {
        let what = "subnet default of VPC default";
        let found = self
            .read_optional(what, || {
                self.client
                    .vpc_subnet_view()
                    .project(self.project.as_str())
                    .vpc(names::DEFAULT_VPC)
                    .subnet(names::DEFAULT_VPC)
                    .send()
            })
            .await?;
        found
            .map(|rv| {
                let block = rv.into_inner().ipv4_block;
                block
                    .rsplit_once('/')
                    .and_then(|(_, len)| len.parse::<u8>().ok())
                    .filter(|len| *len <= 32)
                    .ok_or_else(|| RackError::Unexpected {
                        what: what.to_owned(),
                        message: format!("cannot read the IPv4 block {:?}", block.as_str()),
                    })
            })
            .transpose()
    }

    async fn get_floating_ip(&self, name: &str) -> Result<Option<FloatingIp>, RackError> {
        let what = format!("floating IP {name}");
        let found = self
            .read_optional(&what, || {
                self.client
                    .floating_ip_view()
                    .project(self.project.as_str())
                    .floating_ip(name)
                    .send()
            })
            .await?;
        Ok(found.map(|rv| floating_ip_from(rv.into_inner())))
    }

    async fn create_floating_ip(
        &self,
        fip: &str,
        description: &str,
        pool: Option<&str>,
    ) -> Result<FloatingIp, RackError> {
        let what = format!("floating IP {fip}");
        let body = types::FloatingIpCreate {
            address_allocator: types::AddressAllocator::Auto {
                pool_selector: pool_selector(&what, pool)?,
            },
            description: description.to_owned(),
            name: name(&what, "name", fip)?,
        };
        let created = self
            .mutate(
                &what,
                self.client
                    .floating_ip_create()
                    .project(self.project.as_str())
                    .body(body)
                    .send(),
            )
            .await?;
        Ok(floating_ip_from(created))
    }

    async fn attach_floating_ip(&self, fip: &str, instance: &str) -> Result<(), RackError> {
        let what = format!("floating IP {fip}");
        let body = types::FloatingIpAttach {
            kind: types::FloatingIpParentKind::Instance,
            parent: types::NameOrId::Name(name(&what, "instance", instance)?),
        };
        self.mutate(
            &what,
            self.client
                .floating_ip_attach()
                .project(self.project.as_str())
                .floating_ip(fip)
                .body(body)
                .send(),
        )
        .await
        .map(drop)
    }

    async fn detach_floating_ip(&self, fip: &str) -> Result<(), RackError> {
        let what = format!("floating IP {fip}");
        self.mutate(
            &what,
            self.client
                .floating_ip_detach()
                .project(self.project.as_str())
                .floating_ip(fip)
                .send(),
        )
        .await
        .map(drop)
    }

    async fn find_image(&self, image: &str) -> Result<Option<Image>, RackError> {
        let what = format!("image {image}");
        let project_image = self
            .read_optional(&what, || {
                self.client
                    .image_view()
                    .project(self.project.as_str())
                    .image(image)
                    .send()
            })
            .await?;
        if let Some(rv) = project_image {
            return Ok(Some(image_from(rv.into_inner())));
        }
        // A name without a project names a silo image (omicron@b848b6d
        // `nexus/src/app/image.rs:66-74`, `image_lookup`): one read, not a listing of the silo.
        let silo_what = format!("silo image {image}");
        let silo_image = self
            .read_optional(&silo_what, || self.client.image_view().image(image).send())
            .await?;
        Ok(silo_image.map(|rv| image_from(rv.into_inner())))
    }

    async fn ensure_anti_affinity_group(&self, group: &str) -> Result<(), RackError> {
        let what = format!("anti-affinity group {group}");
        let body = types::AntiAffinityGroupCreate {
            description: names::ANTI_AFFINITY_GROUP_DESCRIPTION.to_owned(),
            failure_domain: types::FailureDomain::Sled,
            name: name(&what, "name", group)?,
            // `allow`: spread when possible, still place an instance when a small rack has
            // fewer sleds than the pool has members. `fail` would strand scale-ups.
            policy: types::AffinityPolicy::Allow,
        };
        match self
            .mutate(
                &what,
                self.client
                    .anti_affinity_group_create()
                    .project(self.project.as_str())
                    .body(body)
                    .send(),
            )
            .await
        {
            Ok(_) | Err(RackError::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    // ---- deleting a cluster ----

    async fn project_exists(&self) -> Result<bool, RackError> {
        let what = format!("project {}", self.project);
        let found = self
            .read_optional(&what, || {
                self.client
                    .project_view()
                    .project(self.project.as_str())
                    .send()
            })
            .await?;
        Ok(found.is_some())
    }

    async fn delete_floating_ip(&self, fip: &str) -> Result<(), RackError> {
        let what = format!("floating IP {fip}");
        self.mutate(
            &what,
            self.client
                .floating_ip_delete()
                .project(self.project.as_str())
                .floating_ip(fip)
                .send(),
        )
        .await
    }

    async fn list_project_images(&self) -> Result<Vec<Image>, RackError> {
        let what = format!("images of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.image_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all.into_iter().map(image_from).collect())
    }

    async fn delete_image(&self, image: &str) -> Result<(), RackError> {
        let what = format!("image {image}");
        self.mutate(
            &what,
            self.client
                .image_delete()
                .project(self.project.as_str())
                .image(image)
                .send(),
        )
        .await
    }

    async fn list_snapshots(&self) -> Result<Vec<Snapshot>, RackError> {
        let what = format!("snapshots of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.snapshot_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all
            .into_iter()
            .map(|s| Snapshot {
                id: s.id,
                name: s.name.to_string(),
                description: s.description,
                disk_id: s.disk_id,
            })
            .collect())
    }

    async fn delete_snapshot(&self, snapshot: &str) -> Result<(), RackError> {
        let what = format!("snapshot {snapshot}");
        self.mutate(
            &what,
            self.client
                .snapshot_delete()
                .project(self.project.as_str())
                .snapshot(snapshot)
                .send(),
        )
        .await
    }

    async fn list_anti_affinity_groups(&self) -> Result<Vec<AntiAffinityGroup>, RackError> {
        let what = format!("anti-affinity groups of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self
                    .client
                    .anti_affinity_group_list()
                    .limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all
            .into_iter()
            .map(|g| AntiAffinityGroup {
                id: g.id,
                name: g.name.to_string(),
                description: g.description,
            })
            .collect())
    }

    async fn anti_affinity_group_members(&self, group: &str) -> Result<Vec<String>, RackError> {
        let what = format!("members of anti-affinity group {group}");
        // The group is a path parameter selected by name within the project, so the project
        // goes with every page, token or not.
        let all = self
            .all_pages(&what, |token| {
                let b = self
                    .client
                    .anti_affinity_group_member_list()
                    .anti_affinity_group(group)
                    .project(self.project.as_str())
                    .limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b.sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all
            .into_iter()
            .map(|m| match m {
                types::AntiAffinityGroupMember::Instance { name, .. } => name.to_string(),
            })
            .collect())
    }

    async fn delete_anti_affinity_group(&self, group: &str) -> Result<(), RackError> {
        let what = format!("anti-affinity group {group}");
        self.mutate(
            &what,
            self.client
                .anti_affinity_group_delete()
                .project(self.project.as_str())
                .anti_affinity_group(group)
                .send(),
        )
        .await
    }

    async fn list_vpcs(&self) -> Result<Vec<String>, RackError> {
        let what = format!("VPCs of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.vpc_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all.into_iter().map(|v| v.name.to_string()).collect())
    }

    async fn list_affinity_groups(&self) -> Result<Vec<String>, RackError> {
        let what = format!("affinity groups of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.affinity_group_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all.into_iter().map(|g| g.name.to_string()).collect())
    }

    async fn list_default_vpc_subnets(&self) -> Result<Vec<String>, RackError> {
        let what = format!("subnets of VPC {DEFAULT_VPC} of project {}", self.project);
        let all = self
            .all_pages(&what, |token| {
                let b = self.client.vpc_subnet_list().limit(self.page_size());
                let b = match token {
                    Some(t) => b.page_token(t),
                    None => b
                        .project(self.project.as_str())
                        .vpc(DEFAULT_VPC)
                        .sort_by(types::NameOrIdSortMode::NameAscending),
                };
                async move {
                    let page = b.send().await?.into_inner();
                    Ok((page.items, page.next_page))
                }
            })
            .await?;
        Ok(all.into_iter().map(|s| s.name.to_string()).collect())
    }

    async fn delete_project(&self) -> Result<(), RackError> {
        // The project's creation made VPC `default` with subnet `default`; Nexus deletes a
        // project only when it holds no VPC, and a VPC only when it holds no subnet.
        // Absent already (an earlier, interrupted run) is fine.
        let gone = |r: Result<(), RackError>| match r {
            Ok(()) | Err(RackError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        };
        gone(
            self.mutate(
                "subnet default of VPC default",
                self.client
                    .vpc_subnet_delete()
                    .project(self.project.as_str())
                    .vpc(names::DEFAULT_VPC)
                    .subnet(names::DEFAULT_VPC)
                    .send(),
            )
            .await,
        )?;
        gone(
            self.mutate(
                "VPC default",
                self.client
                    .vpc_delete()
                    .project(self.project.as_str())
                    .vpc(names::DEFAULT_VPC)
                    .send(),
            )
            .await,
        )?;
        let what = format!("project {}", self.project);
        self.mutate(
            &what,
            self.client
                .project_delete()
                .project(self.project.as_str())
                .send(),
        )
        .await
    }

    async fn remove_firewall_rule(&self, rule: &str) -> Result<bool, RackError> {
        let what = format!("firewall rule {rule}");
        let removed = self
            .edit_firewall_rules(
                &what,
                |current| {
                    if !current.iter().any(|r| r.name.as_str() == rule) {
                        return None;
                    }
                    // Every other rule back exactly as it was (the list is replaced as a whole).
                    let rules = current
                        .into_iter()
                        .filter(|r| r.name.as_str() != rule)
                        .map(rule_update_from)
                        .collect();
                    Some((rules, ()))
                },
                |after| !after.iter().any(|r| r.name.as_str() == rule),
            )
            .await?;
        Ok(removed.is_some())
    }

    async fn list_firewall_rules(&self) -> Result<Vec<String>, RackError> {
        Ok(self
            .firewall_rules()
            .await?
            .into_iter()
            .map(|r| r.name.to_string())
            .collect())
    }

    async fn ensure_firewall_rules(&self, rules: &[OwnedRule]) -> Result<RuleChange, RackError> {
        let what = format!(
            "firewall rules {}",
            rules
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let wanted = rules
            .iter()
            .map(|r| Ok((firewall_rule_update(r)?, r.hosts == fw::RuleHosts::Kept)))
            .collect::<Result<Vec<_>, RackError>>()?;
        // A rule whose hosts are kept takes them from the rule at the rack.
        let as_wanted =
            |w: &types::VpcFirewallRuleUpdate, kept: bool, r: &types::VpcFirewallRuleUpdate| {
                let mut w = w.clone();
                if kept {
                    w.filters.hosts.clone_from(&r.filters.hosts);
                }
                w
            };
        let change = self
            .edit_firewall_rules(
                &what,
                |current| {
                    // Every rule back in the shape the update takes, field for field, so a
                    // rule we did not make is written back exactly as it was.
                    let mut rules: Vec<types::VpcFirewallRuleUpdate> =
                        current.into_iter().map(rule_update_from).collect();
                    let mut change = None;
                    for (w, kept) in &wanted {
                        match rules.iter_mut().find(|r| r.name == w.name) {
                            Some(r) => {
                                let w = as_wanted(w, *kept, r);
                                if !same_rule(r, &w) {
                                    *r = w;
                                    change.get_or_insert(RuleChange::Updated);
                                }
                            }
                            // Only retargeted: never made without its sources.
                            None if *kept => {}
                            None => {
                                rules.push(w.clone());
                                change = Some(RuleChange::Created);
                            }
                        }
                    }
                    change.map(|c| (rules, c))
                },
                |after| {
                    wanted.iter().all(|(w, kept)| {
                        let found = after
                            .iter()
                            .map(|r| rule_update_from(r.clone()))
                            .find(|r| r.name == w.name);
                        match found {
                            Some(r) => same_rule(&r, &as_wanted(w, *kept, &r)),
                            None => *kept,
                        }
                    })
                },
            )
            .await?;
        Ok(change.unwrap_or(RuleChange::Unchanged))
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::base::size::GIB;

    fn api_error(status: u16, code: Option<&str>, message: &str) -> oxide::Error<types::Error> {
        let body = types::Error {
            error_code: code.map(str::to_owned),
            message: message.to_owned(),
            request_id: "00000000-0000-4000-8000-000000000000".to_owned(),
        };
        let status = reqwest::StatusCode::from_u16(status).expect("valid status");
        oxide::Error::ErrorResponse(oxide::ResponseValue::new(
            body,
            status,
            reqwest::header::HeaderMap::new(),
        ))
    }

    fn map(status: u16, code: Option<&str>, message: &str) -> RackError {
        classify(
            "instance demo-workers-abc12",
            api_error(status, code, message),
            Duration::from_secs(30),
        )
    }

    #[test]
    fn api_errors_are_classified_by_status_and_error_code() {
        assert!(matches!(
            map(404, Some("ObjectNotFound"), "not found: instance with name \"x\""),
            RackError::NotFound { what } if what == "instance demo-workers-abc12"
        ));
        assert!(matches!(
            map(400, Some("ObjectAlreadyExists"), "already exists: instance \"x\""),
            RackError::AlreadyExists { what } if what == "instance demo-workers-abc12"
        ));
        assert!(matches!(
            map(400, Some("InvalidRequest"), "instance is running or has not yet fully stopped"),
            RackError::Invalid { message, .. }
                if message == "instance is running or has not yet fully stopped"
        ));
        assert!(matches!(
            map(400, None, "unable to parse JSON body"),
            RackError::Invalid { .. }
        ));
        assert!(matches!(
            map(401, Some("Unauthorized"), "credentials missing or invalid"),
            RackError::Unauthorized { status: 401, .. }
        ));
        assert!(matches!(
            map(403, Some("Forbidden"), "Forbidden"),
            RackError::Unauthorized { status: 403, .. }
        ));
        assert!(matches!(
            map(409, Some("Conflict"), "instance is stopping"),
            RackError::Conflict { .. }
        ));
        assert!(matches!(
            map(
                503,
                Some("ServiceNotAvailable"),
                "can't attach in transient state"
            ),
            RackError::Unavailable { status: 503, .. }
        ));
        assert!(matches!(
            map(500, Some("Internal"), "Internal Server Error"),
            RackError::Unavailable { status: 500, .. }
        ));
        assert!(matches!(
            map(507, Some("InsufficientCapacity"), "no sled with room"),
            RackError::InsufficientCapacity { .. }
        ));
    }

    #[test]
    fn only_transient_answers_are_retryable() {
        assert!(map(503, Some("ServiceNotAvailable"), "busy").is_retryable());
        assert!(map(502, None, "bad gateway").is_retryable());
        assert!(!map(507, Some("InsufficientCapacity"), "full").is_retryable());
        assert!(!map(400, Some("InvalidRequest"), "no").is_retryable());
        assert!(!map(404, Some("ObjectNotFound"), "gone").is_retryable());
    }

    #[test]
    fn sdk_side_rejections_and_bad_payloads_are_classified() {
        let e = classify(
            "instance x",
            oxide::Error::InvalidRequest("conversion to `NameOrId` for project failed".into()),
            Duration::from_secs(1),
        );
        assert!(matches!(e, RackError::Invalid { .. }));
        let parse_err = serde_json::from_str::<types::Instance>("{}").expect_err("not an instance");
        let e = classify(
            "instance x",
            oxide::Error::InvalidResponsePayload(bytes::Bytes::from_static(b"{}"), parse_err),
            Duration::from_secs(1),
        );
        assert!(matches!(e, RackError::Unexpected { .. }));
    }

    /// A server that accepts connections and never answers.
    async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        (format!("http://{addr}"), task)
    }

    #[tokio::test]
    async fn a_silent_rack_times_out_after_retrying_reads() {
        let (host, task) = silent_server().await;
        let opts = RackOptions {
            request_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_millis(200),
            page_size: 10,
            read_retry: Backoff {
                first: Duration::from_millis(1),
                max: Duration::from_millis(2),
                attempts: 2,
            },
        };
        let rack = OxideRack::connect(&host, "secret-token", "demo", opts).expect("connect");
        let started = std::time::Instant::now();
        let err = rack.get_instance("demo-x").await.expect_err("times out");
        assert!(
            matches!(&err, RackError::Timeout { what, seconds: 1 } if what == "instance demo-x"),
            "{err:?}"
        );
        // Two attempts of 200 ms each.
        assert!(started.elapsed() >= Duration::from_millis(400));
        task.abort();
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_error() {
        // Bind then drop: the port is (almost certainly) closed right after.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let opts = RackOptions {
            read_retry: Backoff {
                first: Duration::from_millis(1),
                max: Duration::from_millis(1),
                attempts: 1,
            },
            ..RackOptions::default()
        };
        let rack =
            OxideRack::connect(&format!("http://{addr}"), "t", "demo", opts).expect("connect");
        let err = rack.list_disks().await.expect_err("refused");
        assert!(
            matches!(&err, RackError::Transport { what, .. } if what == "disks of project demo"),
            "{err:?}"
        );
        assert!(err.is_retryable());
    }

    #[test]
    fn connect_rejects_bad_hosts_projects_and_tokens_without_echoing_the_token() {
        let ok = RackOptions::default();
        assert!(matches!(
            OxideRack::connect("rack.example", "t", "demo", ok),
            Err(RackError::Invalid { .. })
        ));
        assert!(matches!(
            OxideRack::connect("ftp://rack.example", "t", "demo", ok),
            Err(RackError::Invalid { .. })
        ));
        assert!(matches!(
            OxideRack::connect("https://rack.example", "t", "Demo", ok),
            Err(RackError::Invalid { .. })
        ));
        assert!(matches!(
            OxideRack::connect("https://rack.example", "  ", "demo", ok),
            Err(RackError::Invalid { .. })
        ));
        let err = OxideRack::connect("https://rack.example", "tok\nen-SECRET", "demo", ok)
            .expect_err("newline in token");
        assert!(!format!("{err} {err:?}").contains("SECRET"));
    }

    /// Audit L5: the token never goes over plain http:// to a host that is not loopback; the
    /// simulator's and the tests' loopback http:// hosts still connect.
    #[test]
    fn plain_http_is_refused_unless_the_host_is_loopback() {
        let ok = RackOptions::default();
        for host in [
            "http://rack.example",
            "http://rack.example:8080/",
            "http://10.0.0.5",
            "http://[fd00::1]:12220",
            "http://localhost.rack.example",
            "http://128.0.0.1",
        ] {
            let err = OxideRack::connect(host, "oxide-token-SECRET", "demo", ok).expect_err(host);
            let text = err.to_string();
            let bare = host.trim_end_matches('/');
            assert!(
                text.contains(bare) && text.contains("https://") && text.contains("in clear"),
                "{text}"
            );
            assert!(!format!("{err} {err:?}").contains("SECRET"));
        }
        for host in [
            "http://127.0.0.1:12220",
            "http://127.8.9.10",
            "http://[::1]:8080",
            "http://localhost:3000",
            "http://LOCALHOST",
            "https://rack.example",
            "https://10.0.0.5",
        ] {
            OxideRack::connect(host, "t", "demo", ok).expect(host);
        }
    }

    #[test]
    fn debug_redacts_the_token_and_page_size_is_clamped() {
        let opts = RackOptions {
            page_size: 50_000,
            ..RackOptions::default()
        };
        let rack = OxideRack::connect("https://rack.example/", "oxide-token-SECRET", "demo", opts)
            .expect("connect");
        let dbg = format!("{rack:?}");
        assert!(!dbg.contains("SECRET"), "{dbg}");
        assert!(dbg.contains("<redacted>"));
        assert_eq!(rack.host(), "https://rack.example");
        assert_eq!(rack.page_size().get(), MAX_PAGE_SIZE);
    }

    fn new_instance() -> NewInstance {
        NewInstance {
            name: "demo-workers-abc12".into(),
            description: "oxide-controller cluster=demo pool=workers".into(),
            hostname: "demo-workers-abc12".into(),
            ncpus: 4,
            memory: ByteSize::gib(8),
            boot_disk: NewDisk {
                name: "boot-demo-workers-abc12".into(),
                size: ByteSize::gib(20),
                image: Some(uuid::Uuid::nil()),
            },
            data_disk: Some(NewDisk {
                name: "data-demo-workers-abc12".into(),
                size: ByteSize::gib(100),
                image: None,
            }),
            restore_disk: None,
            user_data: b"#cloud-config\n".to_vec(),
            ephemeral_ip: true,
            ip_pool: Some("public".into()),
            anti_affinity_group: Some("demo-workers".into()),
            rack_restarts: false,
        }
    }

    #[test]
    fn instance_create_body_matches_the_api_shape() {
        let body = instance_create_body(&new_instance()).expect("valid");
        let json = serde_json::to_value(&body).expect("serializes");
        assert_eq!(json["name"], "demo-workers-abc12");
        assert_eq!(json["hostname"], "demo-workers-abc12");
        assert_eq!(json["ncpus"], 4);
        assert_eq!(json["memory"], 8 * GIB);
        assert_eq!(json["start"], true);
        // Workers: the controller replaces failed ones; the rack must not restart them too.
        assert_eq!(json["auto_restart_policy"], "never");
        // Servers: the rack restarts them after a sled fault.
        let server = NewInstance {
            rack_restarts: true,
            ..new_instance()
        };
        let json_server = serde_json::to_value(instance_create_body(&server).expect("valid"))
            .expect("serializes");
        assert_eq!(json_server["auto_restart_policy"], "best_effort");
        assert_eq!(json["ssh_public_keys"], serde_json::json!([]));
        assert_eq!(json["user_data"], "I2Nsb3VkLWNvbmZpZwo=");
        assert_eq!(
            json["network_interfaces"],
            serde_json::json!({"type": "default_ipv4"})
        );
        assert_eq!(
            json["boot_disk"],
            serde_json::json!({
                "type": "create",
                "name": "boot-demo-workers-abc12",
                "description": "oxide-controller cluster=demo pool=workers",
                "size": 20 * GIB,
                "disk_backend": {"type": "distributed", "disk_source": {
                    "type": "image", "image_id": uuid::Uuid::nil(), "read_only": false}}
            })
        );
        assert_eq!(
            json["disks"][0]["disk_backend"],
            serde_json::json!({"type": "distributed", "disk_source": {"type": "blank", "block_size": 4096}})
        );
        assert_eq!(
            json["external_ips"],
            serde_json::json!([{"type": "ephemeral", "pool_selector": {"type": "explicit", "pool": "public"}}])
        );
        assert_eq!(
            json["anti_affinity_groups"],
            serde_json::json!(["demo-workers"])
        );
    }

    #[test]
    fn instance_without_extras_omits_ips_groups_and_data_disk() {
        let mut new = new_instance();
        new.ephemeral_ip = false;
        new.anti_affinity_group = None;
        new.data_disk = None;
        let json = serde_json::to_value(instance_create_body(&new).expect("valid")).expect("json");
        assert!(json.get("external_ips").is_none());
        assert!(json.get("anti_affinity_groups").is_none());
        assert!(json.get("disks").is_none());
        new.ephemeral_ip = true;
        new.ip_pool = None;
        let json = serde_json::to_value(instance_create_body(&new).expect("valid")).expect("json");
        assert_eq!(
            json["external_ips"],
            serde_json::json!([{"type": "ephemeral", "pool_selector": {"type": "auto", "ip_version": "v4"}}])
        );
    }

    #[test]
    fn an_empty_hostname_is_refused_before_sending() {
        let mut new = new_instance();
        new.hostname = String::new();
        assert!(matches!(
            instance_create_body(&new),
            Err(RackError::Invalid { what, message }) if what == "instance demo-workers-abc12" && message.starts_with("hostname")
        ));
    }
}
