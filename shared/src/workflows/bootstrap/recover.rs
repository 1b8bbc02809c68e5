//! `bootstrap recover`: bring a cluster whose API stopped answering back, from the laptop,
//! with nothing but the rack, the resume file and the kubeconfig bootstrap wrote (never the
//! cluster's own API for its state: that API is what is down).
//!
//! 1. `validate` — the cluster name, the resume file (project, the spec bootstrap started with),
//!    the credentials;
//! 2. `observe` — the cluster's servers on the rack (instances tagged with the cluster and the
//!    control-plane pool, their states) and `/readyz` asked as the cluster's administrator (an
//!    unauthenticated probe stops at authentication and cannot see a datastore without quorum);
//! 3. `rung` — the first that applies ([`choose`]):
//!    - 0, the API is ready: nothing to recover, nothing touched;
//!    - 1, a majority of the servers the cluster had still exist (with their disks: a disk
//!      outlives nothing but its instance's deletion): the stopped or failed ones are started,
//!      then `/readyz` awaited. etcd's members keep their data, so nothing is lost;
//!    - 2, fewer servers than a majority, but at least one: k3s's cluster reset on a survivor
//!      (a running one if any): the others are stopped, k3s on the survivor is reset over SSH
//!      (etcd's force-new-cluster: one member keeping all the data), the others are deleted
//!      with their disks, the API address moves to the survivor, k3s starts again and
//!      `/readyz` is awaited ([`reset`] has the steps and why each is safe to repeat). Only
//!      with `--yes`: it deletes servers, and whatever the lost members had not replicated
//!      to the survivor is gone; without it, exit 2 saying what it would do;
//!    - 3, no server left: the datastore is gone; exit 2 naming the restore from a backup
//!      (`--yes` or not);
//! 4. `reconcile` — once the API is ready: the same in-process reconcile runs as bootstrap's
//!    last step, until the pools (three servers among them) are back and Ready.
//!
//! `--dry-run` stops after `rung`, printing the rung and every call the run would make, and
//! makes none. Rung 1 loses nothing and needs no `--yes`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn};

mod reset;
mod restore;
mod rotations;

use super::{BootstrapError, Connect};
use crate::adapters::credentials::{self, CredentialSources};
use crate::adapters::resume::{self, ResumeState};
use crate::base::names;
use crate::domain::model::InstanceState;
use crate::domain::spec::{ClusterSpec, DEFAULT_CONTROL_PLANE_POOL, NodeAccess};
use crate::ports::rack::{Rack, RackError};
use crate::workflows::error::{self, message};

/// Everything `bootstrap recover` is told, unchecked.
#[derive(Debug, Clone)]
pub struct RecoverInput {
    pub credential_sources: CredentialSources,
    pub cluster: String,
    /// Default: the resume file's project.
    pub project: Option<String>,
    /// Default `~/.kube/<cluster>.yaml` (context `<cluster>`).
    pub kubeconfig: Option<PathBuf>,
    /// Default `~/.config/oxide-controller`.
    pub state_dir: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub dry_run: bool,
    /// Take rung 2 (the cluster reset, which deletes servers) or a restore; without it they
    /// exit 2.
    pub yes: bool,
    /// Rung 3: restore from this backup (`latest` or a backup's name) when no server is left.
    pub backup: Option<String>,
    /// The restore drill instead: `backup` (default the newest) restored into a throw-away
    /// server, checked, and deleted; the cluster itself untouched.
    pub verify: bool,
    /// How long the started servers get to make the API ready.
    pub api_timeout: Duration,
    /// How long the reconcile passes afterwards may take in all.
    pub wait: Duration,
    pub holder: String,
    pub shutdown: crate::base::shutdown::Shutdown,
}

pub use crate::workflows::backup::Server;

/// What recover does, the first rung that applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "rung", rename_all = "snake_case")]
pub enum Rung {
    /// 0: the API is ready.
    Healthy,
    /// 1: a majority of servers exist: start these (the others already run) and wait.
    StartServers {
        start: Vec<String>,
        running: Vec<String>,
    },
    /// 2: fewer than a majority exist: cluster reset on `survivor`.
    ResetOnSurvivor {
        survivor: String,
        others: Vec<String>,
    },
    /// 3: no server exists.
    NothingLeft,
    /// 3 with `--backup`: a new first server restores the datastore from `backup`.
    Restore { backup: String },
    /// `--verify`: `backup` restored into a throw-away server and checked.
    Drill { backup: String },
}

impl Rung {
    /// The rung's number, as the README's "When servers are lost" counts them.
    pub fn number(&self) -> u8 {
        match self {
            Rung::Healthy => 0,
            Rung::StartServers { .. } => 1,
            Rung::ResetOnSurvivor { .. } => 2,
            Rung::NothingLeft | Rung::Restore { .. } => 3,
            // Not a rung: the cluster is not touched.
            Rung::Drill { .. } => 0,
        }
    }
}

/// How many voting members etcd has, and where that number came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum Voters {
    /// etcd's member list (`via`: `/db/info` from the server behind the API address, or a
    /// server's local member over SSH): its voters.
    Etcd { voters: usize, via: String },
    /// The member list did not answer (`why`; k3s serves it only while etcd has quorum): the
    /// larger of the spec's control-plane count (`spec`, from the resume file) and the
    /// servers on the rack (`servers`).
    Guessed {
        spec: usize,
        servers: usize,
        why: String,
    },
}

impl Voters {
    /// The count a majority is taken of.
    pub fn count(&self) -> usize {
        match self {
            Voters::Etcd { voters, .. } => *voters,
            Voters::Guessed { spec, servers, .. } => (*spec).max(*servers),
        }
    }

    /// Where the count came from, as the person reads it.
    pub fn describe(&self) -> String {
        match self {
            Voters::Etcd { voters, via } => format!("{voters}, from etcd's member list ({via})"),
            Voters::Guessed { spec, servers, why } => format!(
                "{}, the larger of the spec's {spec} and the {servers} servers on the rack (etcd's member list did not answer: {why})",
                self.count()
            ),
        }
    }
}

/// The rung for an API that is (or is not) `ready` with `servers` on the rack, of a cluster
/// whose etcd has `voters` voting members. etcd needs a majority of them; each server is one.
pub fn choose(ready: bool, servers: &[Server], voters: &Voters) -> Rung {
    if ready {
        return Rung::Healthy;
    }
    let members = voters.count().max(1);
    let quorum = members / 2 + 1;
    let mut names: Vec<&Server> = servers.iter().collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    if servers.len() >= quorum {
        let (running, start): (Vec<&Server>, Vec<&Server>) = names
            .into_iter()
            .partition(|s| matches!(s.state, InstanceState::Running | InstanceState::Starting));
        return Rung::StartServers {
            start: start.into_iter().map(|s| s.name.clone()).collect(),
            running: running.into_iter().map(|s| s.name.clone()).collect(),
        };
    }
    // The survivor: a running one if any (its etcd has the newest data), else the first.
    let survivor = names
        .iter()
        .find(|s| s.state == InstanceState::Running)
        .or(names.first())
        .map(|s| s.name.clone());
    match survivor {
        Some(survivor) => Rung::ResetOnSurvivor {
            others: names
                .iter()
                .map(|s| s.name.clone())
                .filter(|n| *n != survivor)
                .collect(),
            survivor,
        },
        None => Rung::NothingLeft,
    }
}

/// What a run found and did.
#[derive(Debug, Clone, Serialize)]
pub struct RecoverSummary {
    pub cluster: String,
    pub project: String,
    pub rung: Rung,
    /// etcd's voting members the rung was chosen with (none for a restore or drill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voters: Option<Voters>,
    pub dry_run: bool,
    /// The calls the rung makes (all of them under `--dry-run`, which makes none).
    pub calls: Vec<String>,
    /// From the first start to a ready API.
    pub api_ready_after: Option<Duration>,
    pub converged: bool,
    /// `--verify`: what the drill found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drill: Option<restore::DrillReport>,
    /// A restore: the rotations the backup predated and what was done about each (audit
    /// security-2 N6; never a value).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rotations: Vec<String>,
}

impl RecoverSummary {
    /// What the person reads on stdout.
    pub fn render(&self) -> String {
        if let Rung::Drill { backup } = &self.rung {
            return self.render_drill(backup);
        }
        let mut s = String::new();
        let c = &self.cluster;
        let _ = writeln!(
            s,
            "Cluster {c} (project {}): rung {}.",
            self.project,
            self.rung.number()
        );
        if let Some(voters) = self.voters.as_ref().filter(|_| self.rung != Rung::Healthy) {
            let _ = writeln!(s, "etcd's voting members: {}.", voters.describe());
        }
        match &self.rung {
            Rung::Healthy if self.rotations.is_empty() => {
                let _ = writeln!(
                    s,
                    "The API is ready: nothing to recover. Nothing was changed."
                );
            }
            Rung::Healthy => {
                let _ = writeln!(
                    s,
                    "The API is ready; an earlier restore had not rewritten the Secret it brought back: done now (below)."
                );
            }
            Rung::StartServers { start, running } => {
                let _ = writeln!(
                    s,
                    "A majority of the servers exist with their disks: start {} (running: {}), wait for /readyz; no data is lost.",
                    list(start),
                    list(running)
                );
            }
            Rung::ResetOnSurvivor { survivor, others } => {
                let _ = writeln!(
                    s,
                    "Fewer than a majority of the servers exist: k3s's cluster reset on {survivor} (etcd keeps its data as a single member); stop and delete {} with their disks; the API address moves to {survivor}.",
                    list(others)
                );
            }
            Rung::NothingLeft | Rung::Drill { .. } => {}
            Rung::Restore { backup } => {
                let _ = writeln!(
                    s,
                    "No server is left: a new first server restores the datastore from backup {backup}; the API address moves to it; the workers left are replaced (their agents' servers are gone); reconcile brings the servers and workers back."
                );
            }
        }
        let verb = if self.dry_run { "would make" } else { "made" };
        if !self.calls.is_empty() {
            let _ = writeln!(s, "Calls it {verb}:");
            for call in &self.calls {
                let _ = writeln!(s, "  {call}");
            }
        }
        if let Some(t) = self.api_ready_after {
            let _ = writeln!(
                s,
                "The API was ready {:.1}s after the first call.",
                t.as_secs_f64()
            );
        }
        if !self.rotations.is_empty() {
            let _ = writeln!(
                s,
                "What the backup predates (the laptop's values written back):"
            );
            for line in &self.rotations {
                let _ = writeln!(s, "  - {line}");
            }
        }
        if !self.dry_run && self.rung != Rung::Healthy {
            let state = if self.converged {
                "converged"
            } else {
                "not converged yet (the CronJob carries on)"
            };
            let _ = writeln!(s, "Reconcile: {state}.");
        }
        s
    }
}

impl RecoverSummary {
    fn render_drill(&self, backup: &str) -> String {
        let c = &self.cluster;
        let Some(d) = &self.drill else {
            return format!(
                "Cluster {c} (project {}): a restore drill of backup {backup} would restore it into a throw-away server, wait for /readyz, count its objects and delete everything it made. Nothing was changed.\n",
                self.project
            );
        };
        let compared = match d.expected_objects {
            Some(n) => format!(
                "objects: {} restored, {n} in the backup",
                d.restored_objects
            ),
            None => format!(
                "objects: {} restored, NOT COMPARED: backup {backup} recorded no count of today's kinds (taken before backups counted objects or while they counted Secrets too, or its count failed), so the drill proves only that it restores to a ready API; drill a newer backup (or one `bootstrap backup` takes) to compare",
                d.restored_objects
            ),
        };
        format!(
            "Restore drill of cluster {c}: backup {backup} restored into {} and ready in {:.1}s; {compared}. Everything the drill made is deleted; the cluster was not touched.\n",
            d.server, d.restore_seconds
        )
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

pub(super) struct Validated {
    pub project: String,
    pub host: String,
    pub token: String,
    /// The token's id when the profile records it (`token_id`).
    pub token_id: Option<String>,
    pub kubeconfig: PathBuf,
    pub expected: usize,
    pub pool: String,
    /// The spec bootstrap started with (from the resume file), when it has one.
    pub spec: Option<ClusterSpec>,
    pub resume: ResumeState,
    pub resume_path: PathBuf,
    pub ssh_user: String,
    pub ssh_port: u16,
}

fn validate(input: &RecoverInput) -> Result<Validated, BootstrapError> {
    validate_local(&Local {
        credential_sources: &input.credential_sources,
        cluster: &input.cluster,
        project: input.project.as_deref(),
        kubeconfig: input.kubeconfig.as_deref(),
        state_dir: input.state_dir.as_deref(),
        home: input.home.as_deref(),
    })
}

/// What a laptop command about an existing cluster is told (`recover`, `backup`), unchecked.
pub(super) struct Local<'a> {
    pub credential_sources: &'a CredentialSources,
    pub cluster: &'a str,
    pub project: Option<&'a str>,
    pub kubeconfig: Option<&'a std::path::Path>,
    pub state_dir: Option<&'a std::path::Path>,
    pub home: Option<&'a std::path::Path>,
}

/// Checks the cluster name, loads the resume file bootstrap wrote (with its spec) and
/// resolves the credentials.
pub(super) fn validate_local(input: &Local<'_>) -> Result<Validated, BootstrapError> {
    names::validate_name("cluster name", input.cluster)
        .map_err(|e| BootstrapError::input("--cluster", e))?;
    let paths = crate::workflows::local::local_paths(
        input.cluster,
        input.state_dir,
        input.kubeconfig,
        input.home,
    )?;
    let resume_path = paths.resume;
    let resume = resume::load_for_cluster(&resume_path, input.cluster)
        .map_err(BootstrapError::inputs)?
        .ok_or_else(|| {
            BootstrapError::input(
                "--state-dir",
                message(format!(
                    "no resume file for cluster {} at {}: this command needs the one bootstrap wrote (pass --state-dir where it is)",
                    input.cluster,
                    resume_path.display()
                )),
            )
        })?;
    if let Some(p) = input.project.filter(|p| *p != resume.project) {
        return Err(BootstrapError::input(
            "--project",
            message(format!(
                "{p}: the resume file {} says cluster {} lives in project {}",
                resume_path.display(),
                input.cluster,
                resume.project
            )),
        ));
    }
    let spec = resume
        .spec
        .as_deref()
        .and_then(|t| ClusterSpec::from_yaml(t).ok());
    let creds = credentials::resolve(input.credential_sources).map_err(BootstrapError::inputs)?;
    Ok(Validated {
        project: resume.project.clone(),
        host: creds.host.clone(),
        token: creds.token.expose().to_owned(),
        token_id: creds.token_id.clone(),
        kubeconfig: paths.kubeconfig,
        expected: spec.as_ref().map_or(0, |s| s.control_plane.count as usize),
        pool: spec.as_ref().map_or_else(
            || DEFAULT_CONTROL_PLANE_POOL.to_owned(),
            |s| s.control_plane.name.clone(),
        ),
        // An older resume file without the spec: the defaults bootstrap had then.
        ssh_user: spec.as_ref().map_or_else(
            || NodeAccess::default().ssh_user,
            |s| s.nodes.ssh_user.clone(),
        ),
        ssh_port: spec
            .as_ref()
            .map_or(NodeAccess::default().ssh_port, |s| s.nodes.ssh_port),
        spec,
        resume,
        resume_path,
    })
}

pub(super) fn rack_failed(step: &'static str, e: RackError) -> BootstrapError {
    BootstrapError::step(step, error::context("the Oxide API", e))
}

pub(super) use crate::workflows::backup::servers;

/// A shell on server `server` at `ip` with its pinned host keys (pinned from its serial
/// console first when the resume file has none for it), logging in with the resume file's key.
pub(super) async fn server_shell<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &mut Validated,
    server: &str,
    ip: std::net::IpAddr,
    deadline: Instant,
    step: &'static str,
) -> Result<C::Shell, BootstrapError> {
    let (pins, _) = crate::workflows::bootstrap::host_key_pins(
        rack,
        &v.resume_path,
        &mut v.resume,
        server,
        deadline,
        false,
    )
    .await?;
    let key = v
        .resume
        .key_pair()
        .map_err(|e| BootstrapError::needs_person(step, error::context("the resume file", e)))?;
    let addr = std::net::SocketAddr::new(ip, v.ssh_port);
    Ok(connect.shell(
        addr,
        &v.ssh_user,
        key,
        crate::adapters::ssh::HostKeyPins::clone(&pins),
    ))
}

pub(super) use crate::workflows::backup::list_backups;

/// Runs the whole flow on the ports `connect` opens. See the module docs.
pub async fn run<C: Connect>(
    input: RecoverInput,
    connect: &C,
) -> Result<RecoverSummary, BootstrapError> {
    info!(step = "validate", cluster = %input.cluster, "validating the input");
    let mut v = validate(&input)?;
    let rack = connect
        .rack(&v.host, &v.token, &v.project)
        .map_err(BootstrapError::inputs)?;
    if input.verify {
        return run_verify(input, connect, v, rack).await;
    }
    if let Some(which) = input.backup.clone() {
        return run_restore(input, connect, v, rack, &which).await;
    }
    info!(step = "observe", project = %v.project, "reading the cluster's servers and /readyz");
    let servers = servers(&rack, &input.cluster, &v.pool)
        .await
        .map_err(|e| rack_failed("observe", e))?;
    let ready = connect.api_ready(&v.kubeconfig, &input.cluster).await;
    if let Err(why) = &ready {
        info!(step = "observe", %why, "the API is not ready");
    }
    let voters = match &ready {
        Ok(()) => Voters::Etcd {
            voters: servers.len(),
            via: "not asked: the API is ready".to_owned(),
        },
        Err(_) => count_voters(connect, &rack, &mut v, &input.cluster, &servers).await,
    };
    let rung = choose(ready.is_ok(), &servers, &voters);
    info!(
        step = "rung",
        rung = rung.number(),
        servers = servers.len(),
        voters = %voters.describe(),
        "chosen"
    );
    let mut summary = RecoverSummary {
        cluster: input.cluster.clone(),
        project: v.project.clone(),
        calls: calls(&rung, &v.project, &input.cluster),
        rung: rung.clone(),
        voters: Some(voters.clone()),
        dry_run: input.dry_run,
        api_ready_after: None,
        converged: false,
        drill: None,
        rotations: Vec::new(),
    };
    let started = Instant::now();
    match &rung {
        Rung::Healthy if input.dry_run => return Ok(summary),
        Rung::Healthy => {
            summary.rotations = finish_restore(connect, &mut v, &input).await?;
            return Ok(summary);
        }
        Rung::NothingLeft | Rung::Restore { .. } | Rung::Drill { .. } => {
            return Err(nothing_left(&input, &v.project));
        }
        _ if input.dry_run => return Ok(summary),
        Rung::ResetOnSurvivor { survivor, .. } if !input.yes => {
            return Err(reset_needs_yes(
                &input,
                &v.project,
                survivor,
                &summary.calls,
            ));
        }
        Rung::ResetOnSurvivor { survivor, others } => {
            reset::run(connect, &rack, &mut v, &input, survivor, others).await?;
        }
        Rung::StartServers { start, .. } => {
            start_servers(&rack, start, started + input.api_timeout).await?;
        }
    }
    wait_ready(connect, &v, &input, started).await?;
    summary.api_ready_after = Some(started.elapsed());
    summary.rotations = finish_restore(connect, &mut v, &input).await?;
    let ports = connect
        .in_cluster(&v.kubeconfig, &input.cluster, &input.holder)
        .await
        .map_err(|e| BootstrapError::step("reconcile", e))?;
    let (_, converged) =
        super::reconcile_loop(connect, &ports, &input.holder, input.wait, &input.shutdown).await?;
    summary.converged = converged;
    Ok(summary)
}

/// With the API ready: a restore an earlier run began and did not finish (the resume file's
/// `restore_pending`) gets its Secret rewritten now ([`rotations::reassert`]); its report's
/// lines, none when nothing was pending.
async fn finish_restore<C: Connect>(
    connect: &C,
    v: &mut Validated,
    input: &RecoverInput,
) -> Result<Vec<String>, BootstrapError> {
    let Some(backup) = v.resume.restore_pending.clone() else {
        return Ok(Vec::new());
    };
    info!(step = "rotations", %backup, "an earlier restore did not rewrite the Secret; doing it now");
    let ports = connect
        .in_cluster(&v.kubeconfig, &input.cluster, &input.holder)
        .await
        .map_err(|e| BootstrapError::step("rotations", e))?;
    rotations::reassert(&ports.store, &ports.manifests, v, &input.cluster, &backup).await
}

/// The local etcd member's own member list, asked over SSH on a server: etcd's gateway on
/// k3s's client-HTTP port (k3s puts HTTP clients on 2382, gRPC alone on 2379), with k3s's
/// etcd client certificate, serializable (`linearizable: false`: the member answers from its
/// own view, which it has without quorum too).
pub const ETCD_MEMBER_LIST: &str = "sudo -n curl -sS --max-time 10 --cacert /var/lib/rancher/k3s/server/tls/etcd/server-ca.crt --cert /var/lib/rancher/k3s/server/tls/etcd/client.crt --key /var/lib/rancher/k3s/server/tls/etcd/client.key -X POST -d '{\"linearizable\":false}' https://127.0.0.1:2382/v3/cluster/member/list";

/// etcd's voting members: from the member list k3s's supervisor serves on `/db/info` (the
/// server behind the API address, asked with the server token); k3s asks etcd for it
/// linearizably, so without quorum it fails, and then from the local member's own list over
/// SSH on the server holding the API address, if that one runs. When neither answers, the
/// larger of the spec's count and the servers on the rack.
async fn count_voters<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &mut Validated,
    cluster: &str,
    servers: &[Server],
) -> Voters {
    let read = match connect
        .in_cluster(&v.kubeconfig, cluster, "bootstrap-recover")
        .await
    {
        Ok(ports) => {
            use crate::ports::cluster::Cluster as _;
            ports
                .cluster
                .etcd_members(&v.resume.k3s_token)
                .await
                .map_err(|e| error::chain(&e))
        }
        Err(e) => Err(error::chain(e.as_ref())),
    };
    let db_info = match read {
        Ok(members) => {
            return Voters::Etcd {
                voters: members.iter().filter(|m| !m.is_learner).count(),
                via: "/db/info".to_owned(),
            };
        }
        Err(why) => why,
    };
    match local_voters(connect, rack, v, cluster, servers).await {
        Ok((voters, server)) => Voters::Etcd {
            voters,
            via: format!("{server}'s local etcd member over SSH"),
        },
        Err(why) => Voters::Guessed {
            spec: v.expected,
            servers: servers.len(),
            why: format!("/db/info: {db_info}; over SSH: {why}"),
        },
    }
}

/// The voters in the local member list of the running server holding the API address.
async fn local_voters<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &mut Validated,
    cluster: &str,
    servers: &[Server],
) -> Result<(usize, String), String> {
    use crate::adapters::ssh::RemoteShell as _;
    let fip = rack
        .get_floating_ip(&names::api_floating_ip_name(cluster))
        .await
        .map_err(|e| error::chain(&e))?
        .ok_or("the API floating IP is gone")?;
    let holder = fip
        .instance_id
        .ok_or("the API floating IP is attached to no server")?;
    let mut server = None;
    for s in servers.iter().filter(|s| s.state == InstanceState::Running) {
        let id = rack
            .get_instance(&s.name)
            .await
            .map_err(|e| error::chain(&e))?
            .map(|i| i.id);
        if id == Some(holder) {
            server = Some(s.name.clone());
        }
    }
    let server = server.ok_or("the API floating IP is on no running server")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let shell = server_shell(connect, rack, v, &server, fip.ip, deadline, "observe")
        .await
        .map_err(|e| error::chain(&e))?;
    let out = shell
        .exec(ETCD_MEMBER_LIST)
        .await
        .map_err(|e| error::chain(&e))?;
    if !out.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{server}: exit {}: {}",
            out.exit_status,
            stderr.trim()
        ));
    }
    let voters = local_member_voters(&out.stdout)
        .map_err(|e| format!("{server}: etcd's member list: {e}"))?;
    Ok((voters, server))
}

/// The voting members in etcd's gateway answer to `MemberList` (`{"members": [...]}`,
/// `isLearner` left out when false).
fn local_member_voters(body: &[u8]) -> Result<usize, String> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let members = v["members"]
        .as_array()
        .ok_or_else(|| format!("no members in {}", String::from_utf8_lossy(body)))?;
    Ok(members
        .iter()
        .filter(|m| m["isLearner"].as_bool() != Some(true))
        .count())
}

/// `--verify` (see [`restore::drill`]): fails (exit 1) when the backup does not restore to a
/// ready API holding the objects its manifest counted.
async fn run_verify<C: Connect>(
    input: RecoverInput,
    connect: &C,
    v: Validated,
    rack: C::Rack,
) -> Result<RecoverSummary, BootstrapError> {
    let which = input.backup.clone().unwrap_or_else(|| "latest".to_owned());
    info!(step = "backup", project = %v.project, backup = %which, "choosing the backup to drill");
    let chosen = restore::choose_any(&rack, &v, &input, &which).await?;
    let mut summary = RecoverSummary {
        cluster: input.cluster.clone(),
        project: v.project.clone(),
        rung: Rung::Drill {
            backup: chosen.name.clone(),
        },
        voters: None,
        calls: Vec::new(),
        dry_run: input.dry_run,
        api_ready_after: None,
        converged: false,
        drill: None,
        rotations: Vec::new(),
    };
    if input.dry_run {
        return Ok(summary);
    }
    let drilled = restore::drill(connect, &rack, &v, &input, &chosen).await;
    record_drill(connect, &v, &input, &chosen, &drilled).await;
    let report = drilled?;
    summary.api_ready_after = Some(Duration::from_secs_f64(report.restore_seconds));
    if report.expected_objects.is_none() {
        warn!(step = "drill", backup = %report.backup, "the backup recorded no object count: the drill compared nothing but a ready API");
    }
    let short = crate::domain::backup::drill::count_mismatch(
        report.expected_objects,
        report.restored_objects,
    );
    summary.drill = Some(report.clone());
    if short.is_some() {
        return Err(BootstrapError::step(
            "drill",
            message(format!(
                "backup {} restored to a ready API in {:.1}s, but it holds {} objects where the backup counted {}; everything the drill made is deleted",
                report.backup,
                report.restore_seconds,
                report.restored_objects,
                report.expected_objects.unwrap_or_default()
            )),
        ));
    }
    Ok(summary)
}

/// Leaves the drill's result in the cluster's ConfigMap (`drill.json`), passed or failed, for
/// the next reconcile to judge (a failed drill makes the cluster Degraded). Best effort: the
/// drill's own exit code and output say the same.
async fn record_drill<C: Connect>(
    connect: &C,
    v: &Validated,
    input: &RecoverInput,
    chosen: &crate::domain::backup::Backup,
    drilled: &Result<restore::DrillReport, BootstrapError>,
) {
    let result = restore::drill_result(chosen, drilled, "bootstrap recover --verify");
    let recorded = match connect
        .in_cluster(&v.kubeconfig, &input.cluster, "bootstrap-drill")
        .await
    {
        Ok(p) => tokio::time::timeout(
            Duration::from_secs(20),
            crate::workflows::backup::record_drill(&p.store, result),
        )
        .await
        .map_err(|_| "timed out".to_owned())
        .and_then(|r| r.map_err(|e| e.to_string())),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = recorded {
        warn!(step = "drill", error = %e, "cannot record the drill's result in the ConfigMap; status.json will not show it");
    }
}

/// Rung 3 with `--backup` (see [`restore`]).
async fn run_restore<C: Connect>(
    input: RecoverInput,
    connect: &C,
    mut v: Validated,
    rack: C::Rack,
    which: &str,
) -> Result<RecoverSummary, BootstrapError> {
    info!(step = "backup", project = %v.project, backup = %which, "choosing the backup");
    let chosen = restore::choose(&rack, &v, &input, which).await?;
    let calls = restore::calls(
        &v.project,
        &input.cluster,
        &v.pool,
        v.spec.as_ref(),
        &chosen,
    );
    let mut summary = RecoverSummary {
        cluster: input.cluster.clone(),
        project: v.project.clone(),
        rung: Rung::Restore {
            backup: chosen.name.clone(),
        },
        voters: None,
        calls,
        dry_run: input.dry_run,
        api_ready_after: None,
        converged: false,
        drill: None,
        rotations: Vec::new(),
    };
    if input.dry_run {
        return Ok(summary);
    }
    if !input.yes {
        return Err(restore::needs_yes(
            &input.cluster,
            &v.project,
            &summary.calls,
        ));
    }
    rotations::mark_pending(&mut v, &chosen.name)?;
    let started = Instant::now();
    restore::run::<C>(&rack, &v, &input, &chosen).await?;
    wait_ready(connect, &v, &input, started).await?;
    summary.api_ready_after = Some(started.elapsed());
    let ports = connect
        .in_cluster(&v.kubeconfig, &input.cluster, &input.holder)
        .await
        .map_err(|e| BootstrapError::step("rotations", e))?;
    // Before anything reads the restored Secret (the reconcile's rack is made from it).
    summary.rotations = rotations::reassert(
        &ports.store,
        &ports.manifests,
        &mut v,
        &input.cluster,
        &chosen.name,
    )
    .await?;
    let deadline = Instant::now() + input.api_timeout;
    restore::retire_workers(&rack, &input.cluster, &v.pool, deadline).await?;
    let (_, converged) =
        super::reconcile_loop(connect, &ports, &input.holder, input.wait, &input.shutdown).await?;
    summary.converged = converged;
    Ok(summary)
}

/// The calls a rung makes, in order, as the person would read them.
fn calls(rung: &Rung, project: &str, cluster: &str) -> Vec<String> {
    match rung {
        Rung::Healthy | Rung::NothingLeft | Rung::Restore { .. } | Rung::Drill { .. } => Vec::new(),
        Rung::StartServers { start, .. } => start
            .iter()
            .map(|n| format!("POST /v1/instances/{n}/start?project={project}"))
            .chain([
                format!("GET /readyz through context {cluster} until ready"),
                "reconcile passes until the pools are back and Ready".to_owned(),
            ])
            .collect(),
        Rung::ResetOnSurvivor { survivor, others } => {
            let fip = names::api_floating_ip_name(cluster);
            let ssh = |cmd: &str| format!("ssh {survivor} (pinned host keys): {cmd}");
            let mut calls: Vec<String> = others
                .iter()
                .map(|n| format!("POST /v1/instances/{n}/stop?project={project}"))
                .collect();
            calls.extend([
                format!("POST /v1/instances/{survivor}/start?project={project} (unless running)"),
                format!(
                    "POST /v1/floating-ips/{fip}/attach?project={project} to {survivor} (unless there)"
                ),
                ssh(reset::STOP_K3S),
                ssh(reset::DROP_SERVER_URL),
                ssh(reset::CLUSTER_RESET),
            ]);
            for n in others {
                calls.push(format!("DELETE /v1/instances/{n}?project={project}"));
                for d in [names::boot_disk_name(n), names::data_disk_name(n)] {
                    calls.push(format!("DELETE /v1/disks/{d}?project={project}"));
                }
            }
            calls.extend([
                ssh(reset::START_K3S),
                format!("GET /readyz through context {cluster} until ready"),
                "reconcile passes until the pools are back and Ready".to_owned(),
            ]);
            calls
        }
    }
}

fn reset_needs_yes(
    input: &RecoverInput,
    project: &str,
    survivor: &str,
    calls: &[String],
) -> BootstrapError {
    let c = &input.cluster;
    let mut text = format!(
        "cluster {c} (project {project}): fewer than a majority of its servers exist, so etcd cannot regain quorum by starting them (rung 2). The way back is k3s's cluster reset on {survivor}: it keeps what {survivor}'s etcd holds, and deletes the other servers with their disks. Nothing was changed. Run again with --yes to make these calls:"
    );
    for call in calls {
        let _ = write!(text, "\n  {call}");
    }
    BootstrapError::needs_person("rung", message(text))
}

fn nothing_left(input: &RecoverInput, project: &str) -> BootstrapError {
    let c = &input.cluster;
    BootstrapError::needs_person(
        "rung",
        message(format!(
            "cluster {c}: no server is left in project {project}, so its datastore is gone (rung 3). Nothing was changed. Restore it from a backup with bootstrap recover --cluster {c} --backup latest --yes (or --backup NAME; bootstrap backup takes them); bootstrap would make a new, empty cluster instead"
        )),
    )
}

/// Starts every server in `names`. Nexus answers a start of one already starting or
/// running with success (idempotent), and refuses one still `stopping` with a conflict
/// ("instance must finish stopping before it can be started"): that one is waited for until
/// it has stopped, then started. Any other refusal is the step's error.
async fn start_servers<R: Rack>(
    rack: &R,
    names: &[String],
    deadline: Instant,
) -> Result<(), BootstrapError> {
    for name in names {
        info!(step = "start", instance = %name, "starting the server");
        loop {
            let refused = match rack.start_instance(name).await {
                Ok(()) => break,
                Err(e @ RackError::Conflict { .. }) => e,
                Err(e) => return Err(rack_failed("start", e)),
            };
            let state = rack
                .get_instance(name)
                .await
                .map_err(|e| rack_failed("start", e))?
                .map(|i| i.state);
            if state != Some(InstanceState::Stopping) {
                return Err(rack_failed("start", refused));
            }
            info!(step = "start", instance = %name, "still stopping; waiting until it has stopped");
            reset::wait_state(rack, name, "start", deadline, |s| {
                s != Some(InstanceState::Stopping)
            })
            .await?;
        }
    }
    Ok(())
}

/// Waits until the API is ready, up to `--api-timeout` after `started`.
async fn wait_ready<C: Connect>(
    connect: &C,
    v: &Validated,
    input: &RecoverInput,
    started: Instant,
) -> Result<(), BootstrapError> {
    let deadline = started + input.api_timeout;
    loop {
        match connect.api_ready(&v.kubeconfig, &input.cluster).await {
            Ok(()) => {
                info!(
                    step = "wait-api",
                    after_s = started.elapsed().as_secs_f64(),
                    "the API is ready"
                );
                return Ok(());
            }
            Err(why) if Instant::now() >= deadline => {
                return Err(BootstrapError::step(
                    "wait-api",
                    message(format!(
                        "the API was not ready within {}s of the first call (last: {why}); re-run bootstrap recover to keep waiting",
                        input.api_timeout.as_secs()
                    )),
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str, state: InstanceState) -> Server {
        Server {
            name: name.to_owned(),
            state,
        }
    }

    #[tokio::test]
    async fn a_server_caught_stopping_is_started_once_it_has_stopped() {
        use crate::fake::FakeWorld;
        let world = FakeWorld::new(chrono::Utc::now());
        let now = world.lock().now;
        for (name, state) in [
            ("c-cp-a", InstanceState::Stopping),
            ("c-cp-b", InstanceState::Running),
        ] {
            world.with(|w| {
                w.instances.insert(
                    name.to_owned(),
                    crate::domain::model::Instance {
                        id: uuid::Uuid::new_v4(),
                        name: name.to_owned(),
                        description: String::new(),
                        hostname: name.to_owned(),
                        state,
                        ncpus: 2,
                        memory: crate::base::size::ByteSize::gib(4),
                        time_created: now,
                        time_state_updated: now,
                    },
                )
            });
        }
        // The stop finishes a second later.
        let later = world.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            later.tick(1);
        });
        let names = ["c-cp-a".to_owned(), "c-cp-b".to_owned()];
        let deadline = Instant::now() + Duration::from_secs(30);
        start_servers(&world.rack(), &names, deadline)
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        let state = world.with(|w| w.instances["c-cp-a"].state.clone());
        assert_eq!(
            state,
            InstanceState::Starting,
            "the stopped server was not started"
        );
        let log = world.with(|w| w.log.clone());
        assert!(log.contains(&"start c-cp-a".to_owned()), "{log:?}");
    }

    fn etcd(voters: usize) -> Voters {
        Voters::Etcd {
            voters,
            via: "test".into(),
        }
    }

    fn guessed(spec: usize, servers: usize) -> Voters {
        Voters::Guessed {
            spec,
            servers,
            why: "HTTP 500".into(),
        }
    }

    #[test]
    fn the_first_rung_that_applies_is_taken() {
        use InstanceState::{Failed, Running, Stopped};
        let three = [
            s("c-cp-a", Running),
            s("c-cp-b", Stopped),
            s("c-cp-c", Failed),
        ];
        assert_eq!(choose(true, &three, &guessed(3, 3)), Rung::Healthy);
        assert_eq!(
            choose(false, &three, &guessed(3, 3)),
            Rung::StartServers {
                start: vec!["c-cp-b".into(), "c-cp-c".into()],
                running: vec!["c-cp-a".into()],
            }
        );
        // Two of three is a majority: start them.
        assert_eq!(choose(false, &three[1..], &guessed(3, 2)).number(), 1);
        // One of three is not: reset on the running one, else the first by name.
        assert_eq!(
            choose(
                false,
                &[s("c-cp-b", Stopped), s("c-cp-z", Running)][..1],
                &guessed(3, 1)
            ),
            Rung::ResetOnSurvivor {
                survivor: "c-cp-b".into(),
                others: vec![],
            }
        );
        assert_eq!(
            choose(
                false,
                &[s("c-cp-b", Stopped), s("c-cp-z", Running)],
                &guessed(5, 2)
            ),
            Rung::ResetOnSurvivor {
                survivor: "c-cp-z".into(),
                others: vec!["c-cp-b".into()],
            }
        );
        assert_eq!(choose(false, &[], &guessed(3, 0)), Rung::NothingLeft);
        // More servers than the spec says (a surge member): they count as members.
        assert_eq!(choose(false, &three, &guessed(1, 3)).number(), 1);
        // All running and still not ready: start nothing, wait.
        assert_eq!(
            choose(false, &[s("a", Running)], &guessed(1, 1)),
            Rung::StartServers {
                start: vec![],
                running: vec!["a".into()],
            }
        );
    }

    #[test]
    fn the_rung_follows_etcds_voters_not_the_count_bootstrap_started_with() {
        use InstanceState::{Running, Stopped};
        let two = [s("c-cp-a", Running), s("c-cp-b", Stopped)];
        // Bootstrapped with 5, scaled to 3, one server deleted: starting the stopped one
        // gives 2 of 3, a majority. The bootstrap-time count would have reset instead.
        assert_eq!(choose(false, &two, &guessed(5, 2)).number(), 2);
        assert_eq!(
            choose(false, &two, &etcd(3)),
            Rung::StartServers {
                start: vec!["c-cp-b".into()],
                running: vec!["c-cp-a".into()],
            }
        );
        // Bootstrapped with 3, scaled to 5, three deleted: 2 of 5 is no majority, so
        // starting servers never brings /readyz; the reset is the way back.
        assert_eq!(choose(false, &two, &guessed(3, 2)).number(), 1);
        assert_eq!(
            choose(false, &two, &etcd(5)),
            Rung::ResetOnSurvivor {
                survivor: "c-cp-a".into(),
                others: vec!["c-cp-b".into()],
            }
        );
        assert!(
            guessed(5, 2)
                .describe()
                .contains("did not answer: HTTP 500"),
            "{}",
            guessed(5, 2).describe()
        );
        assert!(etcd(3).describe().contains("from etcd's member list"));
        // etcd's gateway answer: IDs as strings, isLearner only when true.
        let body = br#"{"header":{"cluster_id":"1"},"members":[{"ID":"1","name":"a","peerURLs":["http://a:2380"]},{"ID":"2","name":"b"},{"ID":"3","isLearner":true}]}"#;
        assert_eq!(local_member_voters(body), Ok(2));
        assert!(local_member_voters(b"{}").is_err());
    }
}
