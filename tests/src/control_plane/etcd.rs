//! A cluster's datastore: real etcd members (etcd's own server, each run by the binary of the
//! etcd its server's k3s release bundles, `tests/kube/etcd`), one per k3s
//! server, each on its server's own loopback address (`http://IP:2379` client, `:2380` peer),
//! with etcd's own membership: the first server starts a new cluster, a joining server is
//! added as a learner through the member API and promoted once etcd says it caught up, a
//! member is removed through the member API. Nothing here decides quorum: with fewer than a
//! majority of voters running, etcd itself has no leader and every request fails.
//!
//! Membership calls use etcd's gRPC gateway (`POST /v3/cluster/member/{add,list,promote,
//! remove}` on a member's client URL, JSON), which the embedded server serves by default
//! (`embed.Config.EnableGRPCGateway`). This keeps the calls in the simulator's own async code
//! with the HTTP client it already has, rather than one more `kcp` subcommand per call (a
//! process start per sample would make sampling the member list every 0.5 s costly); the
//! requests are etcd's own `Cluster` RPCs either way.
//!
//! The cluster's one kube-apiserver reaches the members through [`Etcd::client_addr`], a TCP
//! forwarder that hands each new connection to a running voting member (a simplification of
//! k3s, where each server's apiserver uses its own local member: see `tests/FIDELITY.md`).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

/// etcd's client port, as k3s's members use it.
pub const CLIENT_PORT: u16 = 2379;
/// etcd's peer port.
pub const PEER_PORT: u16 = 2380;

/// How often a learner's promotion is tried (k3s's leader tries every `manageTickerTime`,
/// 15 s; the simulator's clock is faster everywhere, see `BootConfig`).
const PROMOTE_EVERY: Duration = Duration::from_millis(300);
/// How long a learner may take to be promoted before the join gives up.
const PROMOTE_PATIENCE: Duration = Duration::from_secs(120);
/// How long a `Maintenance.Snapshot` stream may take. k3s's save sets no deadline of its own
/// (the CLI's signal context down to `snapshotv3.Save`); this is only a harness guard, far above
/// the 5 s the other gateway calls get, which a 100 MB database streamed as base64 JSON by a
/// debug build on a busy machine can exceed.
const SNAPSHOT_PATIENCE: Duration = Duration::from_secs(600);

/// The address a server's member listens on: the VM's own (private) address, or a random
/// loopback address for a VM without one.
pub fn member_ip(private: Option<std::net::IpAddr>) -> Ipv4Addr {
    match private {
        Some(std::net::IpAddr::V4(ip)) => ip,
        _ => super::random_ip(),
    }
}

/// A member as etcd lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdMember {
    /// Empty until an added member started and published its name.
    pub name: String,
    /// etcd's member ID (decimal, as the gateway writes uint64s).
    pub id: String,
    pub peer_url: String,
    pub is_learner: bool,
}

/// One member this simulator started (a server VM's etcd).
struct Local {
    ip: Ipv4Addr,
    /// The etcd binary of the member's k3s release ([`super::binary::etcd_binary`]).
    bin: PathBuf,
    /// The k3s release the member's server installed.
    release: String,
    data: PathBuf,
    log: PathBuf,
    /// The etcd process while the member's VM runs.
    child: Option<Child>,
    /// Promoted (or created as the first voter).
    voter: bool,
}

impl Local {
    fn running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }
}

struct Shared {
    dir: PathBuf,
    members: Mutex<BTreeMap<String, Local>>,
    http: reqwest::Client,
}

/// A cluster's etcd members and the forwarder its apiserver talks to. Dropping it stops
/// every member.
pub struct Etcd {
    shared: Arc<Shared>,
    client_addr: SocketAddr,
    forwarder: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("client_addr", &self.client_addr)
            .finish_non_exhaustive()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.forwarder.abort();
        for m in self.shared.lock().values_mut() {
            if let Some(c) = &mut m.child {
                let _ = c.start_kill();
            }
        }
    }
}

/// [`super::binary::etcd_binary`] off the async runtime.
async fn binary_for(release: &str) -> Result<PathBuf, String> {
    let release = release.to_string();
    tokio::task::spawn_blocking(move || super::binary::etcd_binary(&release))
        .await
        .map_err(|e| e.to_string())?
}

fn client_url(ip: Ipv4Addr) -> String {
    format!("http://{ip}:{CLIENT_PORT}")
}

fn peer_url(ip: Ipv4Addr) -> String {
    format!("http://{ip}:{PEER_PORT}")
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Local>> {
        self.members
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts member `name`'s process with `args` (the data directory and URLs added).
    fn spawn(&self, name: &str, m: &mut Local, args: &[String]) -> Result<(), String> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(|e| format!("{}: {e}", m.log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&m.bin)
            .arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", m.data.display()))
            .arg(format!("--listen-client-url={}", client_url(m.ip)))
            .arg(format!("--listen-peer-url={}", peer_url(m.ip)))
            .args(args)
            .env("KCP_PARENT_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", m.bin.display()))?;
        m.child = Some(child);
        Ok(())
    }

    /// Client URLs of the running voters, then of the other running members.
    fn running_urls(&self) -> Vec<String> {
        let mut members = self.lock();
        let mut voters = Vec::new();
        let mut others = Vec::new();
        for m in members.values_mut() {
            if m.running() {
                if m.voter { &mut voters } else { &mut others }.push(client_url(m.ip));
            }
        }
        voters.extend(others);
        voters
    }

    /// A running voter's client address, for the forwarder.
    fn serving(&self) -> Option<SocketAddr> {
        let mut members = self.lock();
        members.values_mut().find_map(|m| {
            (m.voter && m.running()).then_some(SocketAddr::new(m.ip.into(), CLIENT_PORT))
        })
    }

    /// `POST {url}/v3/cluster/member/{call}` on the first running member that answers.
    async fn call(&self, call: &str, body: Value) -> Result<Value, String> {
        let urls = self.running_urls();
        if urls.is_empty() {
            return Err("no etcd member is running".into());
        }
        let mut last = String::new();
        for url in urls {
            let answer = self
                .http
                .post(format!("{url}/v3/cluster/member/{call}"))
                .json(&body)
                .send()
                .await;
            match answer {
                Ok(resp) => {
                    let v: Value = resp.json().await.map_err(|e| e.to_string())?;
                    if let Some(msg) = v["error"].as_str().or(v["message"].as_str()) {
                        return Err(msg.to_string());
                    }
                    return Ok(v);
                }
                Err(e) => last = format!("{url}: {e}"),
            }
        }
        Err(last)
    }
}

fn parse_members(v: &Value) -> Vec<EtcdMember> {
    v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| EtcdMember {
            name: m["name"].as_str().unwrap_or_default().to_string(),
            id: m["ID"].as_str().unwrap_or_default().to_string(),
            peer_url: m["peerURLs"][0].as_str().unwrap_or_default().to_string(),
            is_learner: m["isLearner"].as_bool().unwrap_or(false),
        })
        .collect()
}

impl Etcd {
    /// Starts a new cluster with one member `name` on `ip` (etcd `--initial-cluster-state
    /// new`, as k3s's cluster-init server does) and the forwarder on `forward_ip:2379`; waits
    /// until the member answers.
    pub async fn start(
        release: &str,
        dir: &Path,
        forward_ip: Ipv4Addr,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<Etcd, String> {
        Self::start_from(release, dir, forward_ip, name, ip, None).await
    }

    /// [`Etcd::start`] with the member's data directory copied from `seed` first (a data
    /// directory a restore wrote on the server's disk, see [`restore_member`]): etcd starts
    /// from it (its WAL names the member and its one-member cluster; the initial-cluster flags
    /// are ignored once data exists).
    pub async fn start_from(
        release: &str,
        dir: &Path,
        forward_ip: Ipv4Addr,
        name: &str,
        ip: Ipv4Addr,
        seed: Option<&Path>,
    ) -> Result<Etcd, String> {
        if let Some(seed) = seed {
            let to = dir.join(format!("etcd-{name}"));
            copy_dir(seed, &to)
                .map_err(|e| format!("{} → {}: {e}", seed.display(), to.display()))?;
        }
        let listener = TcpListener::bind((forward_ip, CLIENT_PORT))
            .await
            .map_err(|e| format!("{forward_ip}:{CLIENT_PORT}: {e}"))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            members: Mutex::new(BTreeMap::new()),
            http,
        });
        let forwarder = tokio::spawn(forward(listener, Arc::clone(&shared)));
        let etcd = Etcd {
            shared,
            client_addr: SocketAddr::new(forward_ip.into(), CLIENT_PORT),
            forwarder,
        };
        etcd.add_local(
            (name, release),
            ip,
            true,
            &["--initial-cluster-state=new".into()],
        )
        .await?;
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if etcd.members().await.is_ok() {
                return Ok(etcd);
            }
            if Instant::now() >= deadline || !etcd.shared.lock().values_mut().any(Local::running) {
                return Err(format!(
                    "etcd member {name} did not start:\n{}",
                    etcd.log_tail(name)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn add_local(
        &self,
        (name, release): (&str, &str),
        ip: Ipv4Addr,
        voter: bool,
        args: &[String],
    ) -> Result<(), String> {
        let bin = binary_for(release).await?;
        let mut m = Local {
            ip,
            bin,
            release: release.to_string(),
            data: self.shared.dir.join(format!("etcd-{name}")),
            log: self.shared.dir.join(format!("etcd-{name}.log")),
            child: None,
            voter,
        };
        self.shared.spawn(name, &mut m, args)?;
        self.shared.lock().insert(name.to_string(), m);
        Ok(())
    }

    /// What the apiserver's `--etcd-servers` names.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The member list, from the first running member that answers (etcd serves it from
    /// its own view, without a quorum read).
    pub async fn members(&self) -> Result<Vec<EtcdMember>, String> {
        let v = self.shared.call("list", json!({})).await?;
        Ok(parse_members(&v))
    }

    /// etcd's `MemberList` asked of member `name` alone, serializable (`linearizable: false`:
    /// the member answers from its own view, with or without quorum), as etcd's gateway
    /// answers it (`POST /v3/cluster/member/list`; `ID`s as strings). Err when the member
    /// does not run.
    pub async fn local_member_list(&self, name: &str) -> Result<String, String> {
        let ip = {
            let mut members = self.shared.lock();
            let m = members
                .get_mut(name)
                .ok_or_else(|| format!("no etcd member {name} here"))?;
            if !m.running() {
                return Err(format!("etcd member {name} is not running"));
            }
            m.ip
        };
        self.shared
            .http
            .post(format!("{}/v3/cluster/member/list", client_url(ip)))
            .json(&json!({"linearizable": false}))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())
    }

    /// etcd's `Put` of `key` = `value` through a running member (gateway `POST /v3/kv/put`).
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        let urls = self.shared.running_urls();
        let url = urls.first().ok_or("no etcd member is running")?;
        kv_put(&self.shared.http, url, key, value).await
    }

    /// etcd's `Range` of every key under `prefix` through a running member (gateway
    /// `POST /v3/kv/range` with `range_end` the prefix's end): (key, value) pairs.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        let urls = self.shared.running_urls();
        let url = urls.first().ok_or("no etcd member is running")?;
        kv_prefix(&self.shared.http, url, prefix).await
    }

    /// k3s's join (`pkg/etcd` `join`): adds `name` at `ip` as a learner
    /// (`MemberAddAsLearner`) through a running member, starts it with the cluster it was
    /// added to (`--initial-cluster-state existing`), then tries `MemberPromote` every
    /// [`PROMOTE_EVERY`] until etcd accepts it (it refuses a learner not yet in sync with the
    /// leader). Fails with etcd's error when the add is refused (e.g. a learner exists
    /// already, or the cluster has no quorum) or the learner is never promoted.
    pub async fn join(&self, name: &str, release: &str, ip: Ipv4Addr) -> Result<(), String> {
        let peer = peer_url(ip);
        // A join that failed after its add (k3s exits and systemd starts it again) finds
        // itself in the list and is not added twice (k3s `join`: "If we're already in the
        // cluster, don't try to add ourselves").
        let listed = parse_members(&self.shared.call("list", json!({})).await?);
        let (id, members) = match listed.iter().find(|m| m.peer_url == peer) {
            Some(me) => (me.id.clone(), listed.clone()),
            None => {
                let added = self
                    .shared
                    .call("add", json!({"peerURLs": [peer], "isLearner": true}))
                    .await?;
                let id = added["member"]["ID"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                (id, parse_members(&added))
            }
        };
        let cluster: Vec<String> = members
            .into_iter()
            .map(|m| {
                let n = if m.peer_url == peer {
                    name.to_string()
                } else {
                    m.name
                };
                format!("{n}={}", m.peer_url)
            })
            .collect();
        let running = self.shared.lock().get_mut(name).is_some_and(Local::running);
        if !running {
            self.add_local(
                (name, release),
                ip,
                false,
                &[
                    format!("--initial-cluster={}", cluster.join(",")),
                    "--initial-cluster-state=existing".into(),
                ],
            )
            .await?;
        }
        let deadline = Instant::now() + PROMOTE_PATIENCE;
        let mut last = String::new();
        while Instant::now() < deadline {
            tokio::time::sleep(PROMOTE_EVERY).await;
            match self.shared.call("promote", json!({"ID": id})).await {
                Ok(_) => {
                    if let Some(m) = self.shared.lock().get_mut(name) {
                        m.voter = true;
                    }
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(format!(
            "learner {name} not promoted after {PROMOTE_PATIENCE:?}: {last}"
        ))
    }

    /// etcd's `Maintenance.Snapshot` on member `name` (what k3s's `etcd-snapshot save` calls
    /// through etcd's client, `snapshot.Save`, on the server's own member): the member's whole
    /// backend database as etcd streams it, with the sha256 etcd appends, i.e. the bytes of a
    /// snapshot file. Asked through the gRPC gateway (`POST /v3/maintenance/snapshot`), whose
    /// server stream arrives as one `{"result": SnapshotResponse}` JSON object per chunk.
    pub async fn snapshot(&self, name: &str) -> Result<Vec<u8>, String> {
        use base64::Engine as _;
        let ip = {
            let mut members = self.shared.lock();
            let m = members
                .get_mut(name)
                .ok_or_else(|| format!("no etcd member {name} here"))?;
            if !m.running() {
                return Err(format!("etcd member {name} is not running"));
            }
            m.ip
        };
        let url = format!("{}/v3/maintenance/snapshot", client_url(ip));
        let resp = self
            .shared
            .http
            .post(&url)
            .timeout(SNAPSHOT_PATIENCE)
            .json(&json!({}))
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let body = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
        let mut out = Vec::new();
        let stream = serde_json::Deserializer::from_slice(&body).into_iter::<Value>();
        for chunk in stream {
            let chunk = chunk.map_err(|e| format!("{url}: {e}"))?;
            if let Some(err) = chunk.get("error") {
                let msg = err["message"].as_str().unwrap_or("snapshot failed");
                return Err(msg.to_owned());
            }
            if let Some(blob) = chunk["result"]["blob"].as_str() {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(blob)
                    .map_err(|e| format!("{url}: blob: {e}"))?;
                out.extend_from_slice(&bytes);
            }
        }
        if out.is_empty() {
            return Err(format!("{url}: empty snapshot"));
        }
        Ok(out)
    }

    /// The member's VM stopped: its etcd process ends; its data stays.
    pub fn stop(&self, name: &str) {
        if let Some(m) = self.shared.lock().get_mut(name)
            && let Some(mut c) = m.child.take()
        {
            let _ = c.start_kill();
        }
    }

    /// The member's VM started again: its etcd starts from its data (etcd ignores the
    /// initial-cluster flags once a data directory exists). False if it has no data here.
    pub fn restart(&self, name: &str) -> Result<bool, String> {
        let mut members = self.shared.lock();
        let Some(m) = members.get_mut(name) else {
            return Ok(false);
        };
        if m.running() {
            return Ok(true);
        }
        if !m.data.exists() {
            return Ok(false);
        }
        self.shared
            .spawn(name, m, &["--initial-cluster-state=existing".into()])?;
        Ok(true)
    }

    /// The member's VM was deleted: its process and data are gone (the member stays in
    /// etcd's list until it is removed).
    pub fn forget(&self, name: &str) {
        let gone = self.shared.lock().remove(name);
        if let Some(mut m) = gone {
            if let Some(c) = &mut m.child {
                let _ = c.start_kill();
            }
            let _ = std::fs::remove_dir_all(&m.data);
        }
    }

    /// k3s's `removePeer`: removes the member named `name` whose peer URL's host is
    /// `address`, through a running member (`MemberRemove`). A member already gone is no
    /// error; a cluster without quorum refuses.
    pub async fn remove(&self, name: &str, address: &str) -> Result<bool, String> {
        let members = self.members().await?;
        let Some(m) = members.into_iter().find(|m| {
            m.name == name
                && m.peer_url
                    .strip_prefix("http://")
                    .and_then(|r| r.rsplit_once(':'))
                    .is_some_and(|(host, _)| host == address)
        }) else {
            return Ok(false);
        };
        match self.shared.call("remove", json!({"ID": m.id})).await {
            Ok(_) => Ok(true),
            Err(e) if e.contains("member not found") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// k3s's `--cluster-reset` (`pkg/etcd` `Reset`): member `name`, stopped with its data,
    /// runs once with etcd's `--force-new-cluster` (every other member dropped, the data
    /// kept) until it lists itself alone; then it stops again, as k3s exits.
    pub async fn force_new_cluster(&self, name: &str) -> Result<(), String> {
        let ip = {
            let mut members = self.shared.lock();
            let m = members
                .get_mut(name)
                .ok_or_else(|| format!("no etcd member {name} here"))?;
            if m.running() {
                return Err(format!(
                    "listen tcp {}:{PEER_PORT}: bind: address already in use",
                    m.ip
                ));
            }
            if !m.data.exists() {
                return Err(format!("no etcd data for {name}"));
            }
            self.shared
                .spawn(name, m, &["--force-new-cluster".into()])?;
            m.ip
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let result = loop {
            let listed = self
                .shared
                .http
                .post(format!("{}/v3/cluster/member/list", client_url(ip)))
                .json(&json!({}))
                .send()
                .await;
            if let Ok(resp) = listed
                && let Ok(v) = resp.json::<Value>().await
            {
                let members = parse_members(&v);
                if members.len() == 1 && members[0].peer_url == peer_url(ip) {
                    break Ok(());
                }
            }
            if Instant::now() >= deadline {
                break Err(format!(
                    "etcd member {name} did not come up alone:\n{}",
                    self.log_tail(name)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if let Some(m) = self.shared.lock().get_mut(name) {
            m.voter = true;
        }
        self.stop(name);
        result
    }

    /// Whether the cluster, asked through a running voter other than `name`, no longer lists
    /// the member at `ip` (removed, or reset away). `None` when no other voter answers.
    pub async fn removed_elsewhere(&self, name: &str, ip: Ipv4Addr) -> Option<bool> {
        let urls: Vec<String> = {
            let mut members = self.shared.lock();
            members
                .iter_mut()
                .filter(|(n, _)| n.as_str() != name)
                .filter_map(|(_, m)| (m.voter && m.running()).then(|| client_url(m.ip)))
                .collect()
        };
        for url in urls {
            let answer = self
                .shared
                .http
                .post(format!("{url}/v3/cluster/member/list"))
                .json(&json!({}))
                .send()
                .await;
            if let Ok(resp) = answer
                && let Ok(v) = resp.json::<Value>().await
                && v.get("members").is_some()
            {
                return Some(!parse_members(&v).iter().any(|m| m.peer_url == peer_url(ip)));
            }
        }
        None
    }

    /// The k3s release of each member this simulator started that etcd still lists (by peer
    /// URL): `(member name, release)`, running or stopped.
    pub async fn listed_releases(&self) -> Result<Vec<(String, String)>, String> {
        let listed = self.members().await?;
        let members = self.shared.lock();
        Ok(members
            .iter()
            .filter(|(_, m)| listed.iter().any(|l| l.peer_url == peer_url(m.ip)))
            .map(|(n, m)| (n.clone(), m.release.clone()))
            .collect())
    }

    /// What each running member answers on its client URL's `GET /version` (etcd's
    /// `etcdserver` field): `(member name, k3s release, etcd version)`.
    pub async fn server_versions(&self) -> Vec<(String, String, String)> {
        let running: Vec<(String, String, Ipv4Addr)> = {
            let mut members = self.shared.lock();
            members
                .iter_mut()
                .filter_map(|(n, m)| m.running().then(|| (n.clone(), m.release.clone(), m.ip)))
                .collect()
        };
        let mut out = Vec::new();
        for (name, release, ip) in running {
            let version = match self
                .shared
                .http
                .get(format!("{}/version", client_url(ip)))
                .send()
                .await
            {
                Ok(resp) => resp
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|v| v["etcdserver"].as_str().map(str::to_owned)),
                Err(_) => None,
            };
            out.push((name, release, version.unwrap_or_else(|| "?".into())));
        }
        out
    }

    /// Whether member `name`'s data directory exists (its VM's disk holds it).
    pub fn has_data(&self, name: &str) -> bool {
        self.shared.dir.join(format!("etcd-{name}")).exists()
    }

    /// The last 40 lines of member `name`'s log.
    pub fn log_tail(&self, name: &str) -> String {
        super::log_tail(&self.shared.dir.join(format!("etcd-{name}.log")))
    }
}

/// A handle on a cluster's members for k3s's supervisor, which serves them on `/db/info`
/// ([`crate::control_plane::proxy::FrontProxy::serve_db_info`]).
#[derive(Clone)]
pub struct MemberLister(Arc<Shared>);

impl std::fmt::Debug for MemberLister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemberLister")
    }
}

impl Etcd {
    /// The lister k3s's supervisor uses.
    pub fn lister(&self) -> MemberLister {
        MemberLister(Arc::clone(&self.shared))
    }
}

impl MemberLister {
    /// What k3s's `infoHandler` asks within its 2 s: etcd's `MemberList`, which etcd's client
    /// sends linearizable (so a member without a leader cannot answer it), written as Go's
    /// `encoding/json` marshals etcd's `Member` (`ID` a number; `name`, `peerURLs`,
    /// `clientURLs`, `isLearner` left out when empty). Err is why it failed.
    pub async fn db_info(&self) -> Result<Value, String> {
        let listed = tokio::time::timeout(
            Duration::from_secs(2),
            self.0.call("list", json!({"linearizable": true})),
        )
        .await
        .map_err(|_| "context deadline exceeded".to_string())??;
        let members: Vec<Value> = listed["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let mut out = serde_json::Map::new();
                let id = m["ID"]
                    .as_str()
                    .and_then(|s| s.parse::<u64>().ok())
                    .or_else(|| m["ID"].as_u64())
                    .unwrap_or_default();
                out.insert("ID".into(), json!(id));
                for key in ["name", "peerURLs", "clientURLs"] {
                    let v = &m[key];
                    let empty = v.is_null()
                        || v.as_str().is_some_and(str::is_empty)
                        || v.as_array().is_some_and(Vec::is_empty);
                    if !empty {
                        out.insert(key.into(), v.clone());
                    }
                }
                if m["isLearner"].as_bool() == Some(true) {
                    out.insert("isLearner".into(), json!(true));
                }
                Value::Object(out)
            })
            .collect();
        Ok(json!({ "members": members }))
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn kv_put(http: &reqwest::Client, url: &str, key: &str, value: &[u8]) -> Result<(), String> {
    let v: Value = http
        .post(format!("{url}/v3/kv/put"))
        .json(&json!({"key": b64(key.as_bytes()), "value": b64(value)}))
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    match v["error"].as_str().or(v["message"].as_str()) {
        Some(msg) => Err(msg.to_owned()),
        None => Ok(()),
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `GetPrefixRangeEnd`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

async fn kv_prefix(
    http: &reqwest::Client,
    url: &str,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    use base64::Engine as _;
    let v: Value = http
        .post(format!("{url}/v3/kv/range"))
        .json(&json!({"key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix.as_bytes()))}))
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if let Some(msg) = v["error"].as_str().or(v["message"].as_str()) {
        return Err(msg.to_owned());
    }
    let dec = |s: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(s.as_str().unwrap_or_default())
            .map_err(|e| format!("{url}: {e}"))
    };
    let mut out = Vec::new();
    for kv in v["kvs"].as_array().into_iter().flatten() {
        let key = String::from_utf8_lossy(&dec(&kv["key"])?).into_owned();
        out.push((key, dec(&kv["value"])?));
    }
    Ok(out)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// k3s's restore from a snapshot (`k3s server --cluster-reset
/// --cluster-reset-restore-path=FILE`, `pkg/etcd` `Reset` → `Restore`): etcd member `name` on
/// `ip` is restored from `snapshot` into `data` (which must not hold data; etcdutl's
/// `snapshot restore`, which checks the snapshot's appended sha256) and started as the only
/// member of a new cluster, logging to `log`; `read` runs against its client URL once it
/// answers; then the member stops, its data kept. Err is what etcd or `read` said.
pub async fn restore_member<T, F, Fut>(
    release: &str,
    (snapshot, data, log): (&Path, &Path, &Path),
    name: &str,
    ip: Ipv4Addr,
    read: F,
) -> Result<T, String>
where
    F: FnOnce(reqwest::Client, String) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let bin = binary_for(release).await?;
    let shared = Shared {
        dir: data.parent().unwrap_or(data).to_path_buf(),
        members: Mutex::new(BTreeMap::new()),
        http: http.clone(),
    };
    let mut m = Local {
        ip,
        bin,
        release: release.to_string(),
        data: data.to_path_buf(),
        log: log.to_path_buf(),
        child: None,
        voter: true,
    };
    shared.spawn(
        name,
        &mut m,
        &[format!("--restore-snapshot={}", snapshot.display())],
    )?;
    let url = client_url(ip);
    let deadline = Instant::now() + Duration::from_secs(90);
    let answered = loop {
        let listed = http
            .post(format!("{url}/v3/cluster/member/list"))
            .json(&json!({}))
            .send()
            .await;
        if let Ok(resp) = listed
            && let Ok(v) = resp.json::<Value>().await
            && parse_members(&v).len() == 1
        {
            break Ok(());
        }
        if !m.running() || Instant::now() >= deadline {
            // The process ends with etcd's error (a bad snapshot, a data dir in use).
            if let Some(c) = &mut m.child {
                let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
            }
            let tail = super::log_tail(log);
            let why = tail
                .lines()
                .rev()
                .find(|l| l.starts_with("etcd: "))
                .map_or_else(|| tail.clone(), |l| l["etcd: ".len()..].to_owned());
            break Err(why);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let result = match answered {
        Ok(()) => read(http, url).await,
        Err(e) => Err(e),
    };
    if let Some(c) = &mut m.child {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    result
}

/// [`kv_prefix`] for a [`restore_member`] reader.
pub async fn read_prefix(
    http: reqwest::Client,
    url: String,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    kv_prefix(&http, &url, prefix).await
}

/// Hands each connection to a running voting member (or closes it when none runs, as a
/// refused connection would end).
async fn forward(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let target = shared.serving();
        tokio::spawn(async move {
            let Some(target) = target else {
                return;
            };
            if let Ok(mut out) = TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_member_list_is_read_with_learners_and_unnamed_members() {
        let v = json!({"members": [
            {"ID": "4117", "peerURLs": ["http://127.3.0.2:2380"], "isLearner": true},
            {"ID": "1287", "name": "a", "peerURLs": ["http://127.3.0.1:2380"],
             "clientURLs": ["http://127.3.0.1:2379"]}
        ]});
        let m = parse_members(&v);
        assert_eq!(m.len(), 2);
        assert!(m[0].is_learner && m[0].name.is_empty() && m[0].id == "4117");
        assert!(!m[1].is_learner && m[1].name == "a");
    }
}
