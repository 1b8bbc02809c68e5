//! `bootstrap backup`: one backup of the cluster's datastore, taken from the laptop and kept on
//! the rack as an Oxide snapshot ([`crate::domain::backup`] says what one holds), then the
//! spec's retention applied.
//!
//! 1. `validate` — the resume file (project, SSH key, server token, spec), the credentials;
//! 2. `server` — the server holding the API floating IP (the laptop reaches SSH through it, as
//!    bootstrap does), host keys pinned as for recover;
//! 3. `etcd-snapshot` — `k3s etcd-snapshot save` on it (k3s's own consistent on-demand
//!    snapshot), the file read back over SSH, then `k3s etcd-snapshot delete` of it: k3s
//!    applies no retention to on-demand snapshots, and each is a plaintext copy of the
//!    datastore. A delete that fails leaves the backup going and is named in the summary;
//! 4. `upload` — the archive (manifest, snapshot, digest) bulk-imported into a temporary disk,
//!    the disk finalized, `POST /v1/snapshots` of it with the backup's description, the disk
//!    deleted. A failure removes the temporary disk;
//! 5. `retention` — the cluster's backups beyond the spec's `backup` counts are deleted.
//!
//! Nothing here needs the cluster's API beyond reading the live spec (the resume file's spec
//! stands in when the API does not answer).

use std::time::Duration;

use chrono::{SubsecRound as _, Utc};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;
use tracing::{info, warn};

use super::recover::{self, Local, Validated, rack_failed};
use super::{BootstrapError, Connect};
use crate::adapters::credentials::CredentialSources;
use crate::adapters::image;
use crate::adapters::ssh::RemoteShell;
use crate::base::names;
use crate::domain::backup::{self, Manifest};
use crate::domain::spec::ClusterSpec;
use crate::ports::rack::Rack;
use crate::ports::state::StateStore;
use crate::workflows::backup as shared;
use crate::workflows::error::message;

/// `k3s etcd-snapshot save`: k3s's on-demand snapshot, written under
/// [`K3S_SNAPSHOT_DIR`] on the server.
pub const SNAPSHOT_SAVE: &str = "sudo -n k3s etcd-snapshot save";
/// `k3s etcd-snapshot delete NAME` (the name follows): removes the on-demand snapshot the
/// backup read, as k3s itself does (`POST /db/snapshot` with operation `delete`).
pub const SNAPSHOT_DELETE: &str = "sudo -n k3s etcd-snapshot delete";
pub use crate::workflows::backup::{K3S_SNAPSHOT_DIR, MAX_SNAPSHOT_BYTES};

/// Everything `bootstrap backup` is told, unchecked.
#[derive(Debug, Clone)]
pub struct BackupInput {
    pub credential_sources: CredentialSources,
    pub cluster: String,
    pub project: Option<String>,
    pub kubeconfig: Option<std::path::PathBuf>,
    pub state_dir: Option<std::path::PathBuf>,
    pub home: Option<std::path::PathBuf>,
    /// How long the whole backup may take.
    pub timeout: Duration,
}

/// What a backup run did.
#[derive(Debug, Clone, Serialize)]
pub struct BackupSummary {
    pub cluster: String,
    pub project: String,
    /// The Oxide snapshot holding the backup.
    pub name: String,
    pub taken_on: String,
    /// The file k3s wrote on the server.
    pub k3s_snapshot: String,
    /// Why the file k3s wrote is still on the server, when `k3s etcd-snapshot delete` did not
    /// remove it (it is a plaintext copy of the datastore: delete it by hand).
    pub left_on_server: Option<String>,
    /// Size of the etcd snapshot.
    pub bytes: u64,
    pub sha256: String,
    /// Size of the archive written (the disk is rounded up to whole GiB).
    pub archive_bytes: u64,
    pub disk_bytes: u64,
    /// Bulk writes made, and the bytes they carried (zero runs are not sent).
    pub writes: u64,
    pub written_bytes: u64,
    /// Seconds from the snapshot command to the backup listed.
    pub seconds: f64,
    /// Backups retention deleted.
    pub pruned: Vec<String>,
    /// The cluster's backups now, newest first.
    pub backups: Vec<String>,
}

impl BackupSummary {
    /// What the person reads on stdout.
    pub fn render(&self) -> String {
        let mut s = format!(
            "Backup {} of cluster {} (project {}): etcd snapshot {} from {}, {} bytes, sha256 {}.\n",
            self.name,
            self.cluster,
            self.project,
            self.k3s_snapshot,
            self.taken_on,
            self.bytes,
            self.sha256
        );
        s.push_str(&format!(
            "Written: {} bytes in {} bulk writes into a {} GiB disk, {:.1}s in all.\n",
            self.written_bytes,
            self.writes,
            self.disk_bytes / crate::base::size::GIB,
            self.seconds
        ));
        if let Some(why) = &self.left_on_server {
            s.push_str(&format!(
                "Left on {}: {K3S_SNAPSHOT_DIR}/{} ({why}); it is a plaintext copy of the datastore, delete it: ssh to {} and run `{SNAPSHOT_DELETE} {}`.\n",
                self.taken_on, self.k3s_snapshot, self.taken_on, self.k3s_snapshot
            ));
        }
        if !self.pruned.is_empty() {
            s.push_str(&format!("Retention deleted: {}.\n", self.pruned.join(", ")));
        }
        s.push_str(&format!(
            "Backups of {} on the rack ({}): {}.\n",
            self.cluster,
            self.backups.len(),
            self.backups.join(", ")
        ));
        s
    }
}

/// What a laptop command on the server holding the API address has in hand (`backup`,
/// `kubeconfig`): the validated local files, the rack, that server, its address, a shell on it.
pub(super) struct OnApiServer<C: Connect> {
    pub v: Validated,
    pub rack: C::Rack,
    pub server: String,
    pub ip: std::net::IpAddr,
    pub shell: C::Shell,
}

/// Steps `validate` and `server` of a laptop command: the resume file and credentials
/// checked, the server holding the API floating IP found, a shell on it with pinned host keys.
pub(super) async fn on_api_server<C: Connect>(
    input: &BackupInput,
    connect: &C,
    deadline: Instant,
    what: &str,
) -> Result<OnApiServer<C>, BootstrapError> {
    let mut v = recover::validate_local(&Local {
        credential_sources: &input.credential_sources,
        cluster: &input.cluster,
        project: input.project.as_deref(),
        kubeconfig: input.kubeconfig.as_deref(),
        state_dir: input.state_dir.as_deref(),
        home: input.home.as_deref(),
    })?;
    let rack = connect
        .rack(&v.host, &v.token, &v.project)
        .map_err(BootstrapError::inputs)?;
    let (server, ip) = api_server(&rack, &input.cluster).await?;
    info!(step = "server", %server, "{what} on the server holding the API address");
    let shell =
        recover::server_shell(connect, &rack, &mut v, &server, ip, deadline, "server").await?;
    Ok(OnApiServer {
        v,
        rack,
        server,
        ip,
        shell,
    })
}

/// Runs the whole flow (see the module docs).
pub async fn run<C: Connect>(
    input: BackupInput,
    connect: &C,
) -> Result<BackupSummary, BootstrapError> {
    let deadline = Instant::now() + input.timeout;
    let OnApiServer {
        v,
        rack,
        server,
        shell,
        ..
    } = on_api_server(&input, connect, deadline, "taking the backup").await?;
    let started = Instant::now();
    // No later than the snapshot: what is made after this is not counted (see below).
    let snapshot_at = Utc::now();
    let Taken {
        name: k3s_snapshot,
        data,
        left_on_server,
    } = take_snapshot(&shell, &server, (deadline, SNAPSHOT_BUSY_RETRY)).await?;
    // Counted right after the snapshot, of what was made before it: a restore holds at least
    // that many (more when something was deleted in between).
    let objects = match connect
        .object_count(&v.kubeconfig, &input.cluster, Some(snapshot_at))
        .await
    {
        Ok(n) => Some(n),
        Err(e) => {
            warn!(error = %e, "cannot count the cluster's objects; a restore drill will not compare them");
            None
        }
    };
    // The cluster's state objects, opened once: the live spec now, the report at the end.
    let store = connect
        .in_cluster(&v.kubeconfig, &input.cluster, "bootstrap-backup")
        .await
        .map(|p| p.store)
        .map_err(|e| e.to_string());
    let (spec_text, retired) = live_spec(store.as_ref(), &v).await;
    // Audit security-2 N1: a bootstrap cut short while it removed the retired keys.
    backup::retired::check_new_snapshot(retired.as_deref(), &k3s_snapshot)
        .map_err(|why| BootstrapError::needs_person("etcd-snapshot", message(why)))?;
    let spec = ClusterSpec::from_yaml(&spec_text).ok().or(v.spec.clone());
    let manifest = Manifest {
        format: backup::FORMAT,
        cluster: input.cluster.clone(),
        // The control plane's release and image: what a restore of this backup installs.
        k3s_version: spec.as_ref().map_or_else(
            || "unknown".to_owned(),
            |s| s.k3s_version(&s.control_plane).to_owned(),
        ),
        image: spec.as_ref().map(|s| s.control_plane.image.clone()),
        // Whole seconds: the description carries no more, and the two must agree.
        time: Utc::now().trunc_subsecs(0),
        k3s_snapshot: k3s_snapshot.clone(),
        taken_on: server.clone(),
        sha256: backup::hex(&Sha256::digest(&data)),
        bytes: data.len() as u64,
        token: backup::token_fingerprint(&v.resume.k3s_token),
        objects,
        spec: spec_text,
        servers: shared::server_addresses(&rack, &input.cluster, &v.pool).await?,
    };
    let retention = spec.map(|s| s.backup.retention()).unwrap_or_default();
    let snapshot = image::SourceReader::Memory {
        data: bytes::Bytes::from(data),
        pos: 0,
    };
    let up = shared::upload(&rack, &manifest, snapshot, retention).await?;
    let (name, stats, pruned, backups) = (up.name, up.stats, up.pruned, up.backups);
    let seconds = started.elapsed().as_secs_f64();
    info!(step = "upload", backup = %name, seconds, "the backup is on the rack");
    let made = backup::LastBackup {
        name: name.clone(),
        time: manifest.time,
        k3s_snapshot: k3s_snapshot.clone(),
        bytes: manifest.bytes,
        by: "bootstrap backup".to_owned(),
    };
    record_in_cluster(store.as_ref(), made).await;
    Ok(BackupSummary {
        cluster: input.cluster,
        project: v.project,
        name,
        taken_on: server,
        k3s_snapshot,
        left_on_server,
        bytes: manifest.bytes,
        sha256: manifest.sha256,
        archive_bytes: stats.source_bytes,
        disk_bytes: image::import_sizes(stats.source_bytes, image::DEFAULT_BLOCK_SIZE).disk_size,
        writes: stats.writes,
        written_bytes: stats.written_bytes,
        seconds,
        pruned,
        backups,
    })
}

/// The server the API floating IP is attached to, and the address.
pub(super) async fn api_server<R: Rack>(
    rack: &R,
    cluster: &str,
) -> Result<(String, std::net::IpAddr), BootstrapError> {
    let step = "server";
    let fip_name = names::api_floating_ip_name(cluster);
    let fip = rack
        .get_floating_ip(&fip_name)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| {
            BootstrapError::needs_person(
                step,
                message(format!(
                    "the API floating IP {fip_name} does not exist: is cluster {cluster} in this project? (bootstrap recover brings a lost cluster back)"
                )),
            )
        })?;
    let holder = fip.instance_id;
    let instances = rack
        .list_instances(&names::cluster_prefix(cluster))
        .await
        .map_err(|e| rack_failed(step, e))?;
    instances
        .into_iter()
        .find(|i| Some(i.id) == holder)
        .map(|i| (i.name, fip.ip))
        .ok_or_else(|| {
            BootstrapError::needs_person(
                step,
                message(format!(
                    "the API floating IP {fip_name} is attached to no server of cluster {cluster}: run bootstrap recover --cluster {cluster} first"
                )),
            )
        })
}

/// What k3s answers while another snapshot of the same server is being saved, such as its
/// scheduled one (`pkg/etcd/snapshot.go` `Snapshot`: `snapshotMu.TryLock()`).
const SNAPSHOT_BUSY: &str = "snapshot save already in progress";

/// How long to wait before asking again while k3s is saving another snapshot.
const SNAPSHOT_BUSY_RETRY: Duration = Duration::from_secs(5);

/// How long `k3s etcd-snapshot delete` may take (k3s's CLI gives the server 2 minutes:
/// `pkg/cli/etcdsnapshot/etcd_snapshot.go` `timeout`; removing one file takes far less).
const DELETE_PATIENCE: Duration = Duration::from_secs(60);

/// What [`take_snapshot`] brings back.
struct Taken {
    /// The file k3s wrote, in [`K3S_SNAPSHOT_DIR`].
    name: String,
    data: Vec<u8>,
    /// Why that file is still on the server (`None`: deleted).
    left_on_server: Option<String>,
}

/// `k3s etcd-snapshot save` on the server, the file it wrote read back, then the file deleted
/// with `k3s etcd-snapshot delete` whether the read worked or not: it is a plaintext copy of
/// the datastore, and k3s keeps on-demand snapshots until someone deletes them. A delete that
/// fails is a warning and [`Taken::left_on_server`], not an error.
async fn take_snapshot<S: RemoteShell>(
    shell: &S,
    server: &str,
    (deadline, retry): (Instant, Duration),
) -> Result<Taken, BootstrapError> {
    let step = "etcd-snapshot";
    let name = save_snapshot(shell, server, (deadline, retry)).await?;
    let path = format!("{K3S_SNAPSHOT_DIR}/{name}");
    let left = deadline.saturating_duration_since(Instant::now());
    let read = shell
        .read_large_file(&path, MAX_SNAPSHOT_BYTES, left.max(Duration::from_secs(60)))
        .await
        .map_err(|e| BootstrapError::step(step, e));
    let left_on_server = delete_snapshot(shell, server, &name).await.err();
    let data = read?;
    if data.is_empty() {
        return Err(BootstrapError::step(
            step,
            message(format!("{path} on {server} is empty")),
        ));
    }
    info!(step, %server, snapshot = %name, bytes = data.len(), "read the snapshot");
    Ok(Taken {
        name,
        data,
        left_on_server,
    })
}

/// `k3s etcd-snapshot save` on the server: the name of the file it wrote. Asked again every
/// `retry` while k3s is saving another snapshot (its schedule fires at the top of the hour),
/// until `deadline`.
async fn save_snapshot<S: RemoteShell>(
    shell: &S,
    server: &str,
    (deadline, retry): (Instant, Duration),
) -> Result<String, BootstrapError> {
    let step = "etcd-snapshot";
    let (out, said) = loop {
        info!(step, %server, "running k3s etcd-snapshot save");
        let out = shell
            .exec(SNAPSHOT_SAVE)
            .await
            .map_err(|e| BootstrapError::step(step, e))?;
        let said = output_text(&out);
        if out.success() || !said.contains(SNAPSHOT_BUSY) || Instant::now() + retry >= deadline {
            break (out, said);
        }
        info!(step, %server, ?retry, "k3s is saving another snapshot; asking again");
        tokio::time::sleep(retry).await;
    };
    match (out.success(), saved_name(&said)) {
        (true, Some(name)) => Ok(name),
        (true, None) => Err(BootstrapError::step(
            step,
            message(format!(
                "k3s etcd-snapshot save on {server} exited 0 but saved no snapshot (k3s takes none on an etcd learner; is {server} still joining?)"
            )),
        )),
        (false, _) => Err(BootstrapError::step(
            step,
            message(format!(
                "`{SNAPSHOT_SAVE}` on {server} exited {}: {}",
                out.exit_status,
                last_lines(&said)
            )),
        )),
    }
}

/// `k3s etcd-snapshot delete NAME` on the server; `Err` says why the file is still there.
/// k3s's CLI exits 0 whether or not the server removed anything: it logs "Snapshot NAME
/// deleted." for each file removed and warns "Snapshot NAME not found." for each other name,
/// one the server failed to remove included (`pkg/cli/etcdsnapshot/etcd_snapshot.go`
/// `delete`; `pkg/etcd/snapshot.go` `DeleteSnapshots`). So only that first line is a delete.
async fn delete_snapshot<S: RemoteShell>(
    shell: &S,
    server: &str,
    name: &str,
) -> Result<(), String> {
    let step = "etcd-snapshot";
    let cmd = format!(
        "{SNAPSHOT_DELETE} {}",
        crate::adapters::ssh::shell_quote(name)
    );
    let why = match tokio::time::timeout(DELETE_PATIENCE, shell.exec(&cmd)).await {
        Err(_) => format!("`{cmd}` did not answer within {DELETE_PATIENCE:?}"),
        Ok(Err(e)) => format!("`{cmd}` failed: {}", crate::workflows::error::chain(&e)),
        Ok(Ok(out)) => {
            let said = output_text(&out);
            if out.success() && deleted(&said, name) {
                info!(step, %server, snapshot = %name, "deleted the on-demand snapshot from the server");
                return Ok(());
            }
            format!("`{cmd}` exited {}: {}", out.exit_status, last_lines(&said))
        }
    };
    warn!(step, %server, snapshot = %name, reason = %why, "the on-demand snapshot, a plaintext copy of the datastore, is still on the server: delete it by hand");
    Err(why)
}

/// Whether k3s's CLI said it deleted snapshot `name` (its `Snapshot NAME deleted.` line).
fn deleted(output: &str, name: &str) -> bool {
    let said = format!("Snapshot {name} deleted.");
    output.lines().any(|l| l.contains(&said))
}

/// A command's stdout then stderr, as text.
fn output_text(out: &crate::adapters::ssh::CommandOutput) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The last three lines of a command's output, newest first, on one line.
fn last_lines(said: &str) -> String {
    let tail: Vec<&str> = said.lines().rev().take(3).collect();
    if tail.is_empty() {
        "no output".to_owned()
    } else {
        tail.join(" | ")
    }
}

/// The name in k3s's `Snapshot NAME saved.` line (`pkg/cli/etcdsnapshot`).
fn saved_name(output: &str) -> Option<String> {
    output
        .lines()
        .find_map(|l| {
            let at = l.find("Snapshot ")?;
            let rest = &l[at + "Snapshot ".len()..];
            let name = rest.split_whitespace().next()?;
            rest.contains("saved.").then(|| {
                name.trim_matches(|c: char| c == '"' || c == '\\')
                    .to_owned()
            })
        })
        .filter(|n| !n.is_empty() && !n.contains('/'))
}

/// Leaves the backup in the ConfigMap's `backup.json` (status.json shows it after the next
/// reconcile). Best effort: the backup is on the rack either way.
async fn record_in_cluster<S: StateStore>(store: Result<&S, &String>, made: backup::LastBackup) {
    let recorded = match store {
        Ok(store) => {
            let at = made.time.max(Utc::now());
            tokio::time::timeout(
                Duration::from_secs(20),
                crate::workflows::backup::record(store, at, Ok(made)),
            )
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r.map_err(|e| e.to_string()))
        }
        Err(e) => Err(e.clone()),
    };
    if let Err(e) = recorded {
        warn!(error = %e, "cannot record the backup in the ConfigMap; status.json will not show it");
    }
}

/// The cluster's `spec.yaml` as the ConfigMap has it, else the resume file's; and the
/// ConfigMap's `retired-keys-removed-at`, when read.
async fn live_spec<S: StateStore>(
    store: Result<&S, &String>,
    v: &Validated,
) -> (String, Option<String>) {
    let fallback = v.resume.spec.clone().unwrap_or_default();
    let store = match store {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "the cluster's API is not reachable; the manifest gets the resume file's spec");
            return (fallback, None);
        }
    };
    let read = tokio::time::timeout(Duration::from_secs(20), store.read_config()).await;
    match read {
        Ok(Ok(c)) => (
            c.spec_yaml().map_or(fallback, str::to_owned),
            c.data
                .get(crate::ports::state::keys::RETIRED_KEYS_REMOVED_AT)
                .cloned(),
        ),
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the ConfigMap; the manifest gets the resume file's spec");
            (fallback, None)
        }
        Err(_) => (fallback, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::ssh::{CommandOutput, SshError};
    use futures::future::BoxFuture;
    use std::sync::Mutex;

    /// A server whose `k3s etcd-snapshot save` and `delete` answer from scripts, one answer
    /// per call (a delete with no answer left fails the SSH exec), and whose snapshot reads
    /// as "etcd" unless `read_fails`.
    struct Scripted {
        answers: Mutex<Vec<(u32, &'static str)>>,
        calls: Mutex<u32>,
        deletes: Mutex<Vec<(u32, &'static str)>>,
        deleted: Mutex<Vec<String>>,
        read_fails: bool,
    }

    const ADDR: std::net::SocketAddr =
        std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 22);

    impl Scripted {
        fn new(save: Vec<(u32, &'static str)>, delete: Vec<(u32, &'static str)>) -> Self {
            Scripted {
                answers: Mutex::new(save),
                calls: Mutex::new(0),
                deletes: Mutex::new(delete),
                deleted: Mutex::new(Vec::new()),
                read_fails: false,
            }
        }

        fn delete_commands(&self) -> Vec<String> {
            self.deleted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }
    }

    impl RemoteShell for Scripted {
        fn exec<'a>(&'a self, cmd: &'a str) -> BoxFuture<'a, Result<CommandOutput, SshError>> {
            Box::pin(async move {
                let answer = if cmd.starts_with(SNAPSHOT_DELETE) {
                    self.deleted
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(cmd.to_owned());
                    let mut left = self.deletes.lock().unwrap_or_else(|e| e.into_inner());
                    if left.is_empty() {
                        return Err(SshError::CommandTimeout {
                            addr: ADDR,
                            timeout: Duration::from_secs(30),
                        });
                    }
                    left.remove(0)
                } else {
                    assert_eq!(cmd, SNAPSHOT_SAVE);
                    *self.calls.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                    self.answers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(0)
                };
                let (exit_status, stderr) = answer;
                Ok(CommandOutput {
                    exit_status,
                    stdout: Vec::new(),
                    stderr: stderr.as_bytes().to_vec(),
                })
            })
        }

        fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, SshError>> {
            Box::pin(async move {
                if self.read_fails {
                    return Err(SshError::ReadFile {
                        addr: ADDR,
                        path: path.to_owned(),
                        exit_status: 1,
                        stderr: "cat: cannot read".into(),
                    });
                }
                Ok(b"etcd".to_vec())
            })
        }

        fn upload<'a>(
            &'a self,
            _path: &'a str,
            _bytes: &'a [u8],
            _mode: u32,
        ) -> BoxFuture<'a, Result<(), SshError>> {
            Box::pin(async move { Ok(()) })
        }
    }

    const BUSY: &str = "time=\"2026-11-29T10:00:01Z\" level=fatal msg=\"see server log for details: snapshot save already in progress\"\n";
    const SAVED: &str = "time=\"2026-11-29T10:00:06Z\" level=info msg=\"Snapshot on-demand-c1-cp-abcde-1795000000 saved.\"\n";

    const DELETED: &str = "time=\"2026-11-29T10:00:07Z\" level=info msg=\"Snapshot on-demand-c1-cp-abcde-1795000000 deleted.\"\n";
    const NOT_FOUND: &str = "time=\"2026-11-29T10:00:07Z\" level=warning msg=\"Snapshot on-demand-c1-cp-abcde-1795000000 not found.\"\n";
    const DELETE_LINE: &str = "sudo -n k3s etcd-snapshot delete on-demand-c1-cp-abcde-1795000000";

    fn far() -> (Instant, Duration) {
        (
            Instant::now() + Duration::from_secs(300),
            Duration::from_millis(1),
        )
    }

    /// Audit day2-fidelity-4 M6: k3s refuses a second snapshot while its scheduled one is
    /// being saved; `bootstrap backup` asks again rather than failing the backup.
    #[tokio::test]
    async fn a_snapshot_refused_as_already_in_progress_is_asked_for_again() {
        let shell = Scripted::new(vec![(1, BUSY), (1, BUSY), (0, SAVED)], vec![(0, DELETED)]);
        let taken = take_snapshot(&shell, "c1-cp-abcde", far())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(taken.name, "on-demand-c1-cp-abcde-1795000000");
        assert_eq!(taken.data, b"etcd");
        assert_eq!(*shell.calls.lock().unwrap_or_else(|e| e.into_inner()), 3);
        // Any other failure, or the deadline, ends it at once with k3s's words.
        let shell = Scripted::new(vec![(1, BUSY)], Vec::new());
        let soon = Instant::now() + Duration::from_secs(1);
        let err = take_snapshot(&shell, "c1-cp-abcde", (soon, SNAPSHOT_BUSY_RETRY))
            .await
            .err()
            .map(|e| crate::workflows::error::chain(&e))
            .unwrap_or_default();
        assert!(err.contains("snapshot save already in progress"), "{err}");
        assert_eq!(*shell.calls.lock().unwrap_or_else(|e| e.into_inner()), 1);
        // Nothing was saved, so nothing is deleted.
        assert!(shell.delete_commands().is_empty());
    }

    /// Audit security-2 N1 (fix 5): the on-demand snapshot, a plaintext copy of the datastore
    /// that k3s never prunes, is deleted with k3s's own command once it has been read.
    #[tokio::test]
    async fn the_on_demand_snapshot_is_deleted_once_read() {
        let shell = Scripted::new(vec![(0, SAVED)], vec![(0, DELETED)]);
        let taken = take_snapshot(&shell, "c1-cp-abcde", far())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(taken.data, b"etcd");
        assert_eq!(taken.left_on_server, None);
        assert_eq!(shell.delete_commands(), [DELETE_LINE]);
    }

    /// Audit security-2 N1 (fix 5): a delete that does not happen does not fail the backup; it
    /// is reported, and the summary names the file left behind and how to delete it. k3s's
    /// CLI exits 0 for a name it did not delete ("not found", also when the server failed to
    /// remove the file), so only its "deleted." line counts.
    #[tokio::test]
    async fn a_delete_that_fails_keeps_the_backup_and_names_the_file_left_behind() {
        let fatal = "time=\"2026-11-29T10:00:07Z\" level=fatal msg=\"see server log for details: context deadline exceeded\"\n";
        for (answers, expect) in [
            (vec![(0, NOT_FOUND)], "not found."),
            (vec![(1, fatal)], "exited 1"),
            (vec![(0, "")], "no output"),
            (Vec::new(), "did not finish within"),
        ] {
            let shell = Scripted::new(vec![(0, SAVED)], answers);
            let taken = take_snapshot(&shell, "c1-cp-abcde", far())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(taken.data, b"etcd", "{expect}");
            let why = taken.left_on_server.unwrap_or_default();
            assert!(why.contains(expect), "{why}");
            assert_eq!(shell.delete_commands(), [DELETE_LINE]);
            let summary = BackupSummary {
                cluster: "c1".into(),
                project: "p".into(),
                name: "c1-etcd-20261129-100007".into(),
                taken_on: "c1-cp-abcde".into(),
                k3s_snapshot: taken.name,
                left_on_server: Some(why),
                bytes: 4,
                sha256: "00".into(),
                archive_bytes: 4,
                disk_bytes: crate::base::size::GIB,
                writes: 1,
                written_bytes: 4,
                seconds: 1.0,
                pruned: Vec::new(),
                backups: vec!["c1-etcd-20261129-100007".into()],
            };
            let text = summary.render();
            assert!(
                text.contains(&format!(
                    "Left on c1-cp-abcde: {K3S_SNAPSHOT_DIR}/on-demand-c1-cp-abcde-1795000000 ("
                )) && text.contains(DELETE_LINE),
                "{text}"
            );
        }
    }

    /// A snapshot saved but not read back is deleted all the same; the read's error is the
    /// run's.
    #[tokio::test]
    async fn a_snapshot_that_cannot_be_read_back_is_deleted_too() {
        let shell = Scripted {
            read_fails: true,
            ..Scripted::new(vec![(0, SAVED)], vec![(0, DELETED)])
        };
        let err = take_snapshot(&shell, "c1-cp-abcde", far())
            .await
            .err()
            .map(|e| crate::workflows::error::chain(&e))
            .unwrap_or_default();
        assert!(err.contains("cat: cannot read"), "{err}");
        assert_eq!(shell.delete_commands(), [DELETE_LINE]);
    }

    #[test]
    fn a_delete_is_read_from_k3s_deleted_line_only() {
        let name = "on-demand-c1-cp-abcde-1795000000";
        assert!(deleted(DELETED, name));
        assert!(deleted(
            "INFO[0000] Snapshot on-demand-c1-cp-abcde-1795000000 deleted.\n",
            name
        ));
        assert!(!deleted(NOT_FOUND, name));
        assert!(!deleted("", name));
        // Another snapshot's line, and the server's own log line, are not this delete.
        assert!(!deleted(
            "level=info msg=\"Snapshot on-demand-c1-cp-abcde-17950000001 deleted.\"",
            name
        ));
        assert!(!deleted(
            "level=info msg=\"Snapshot on-demand-c1-cp-abcde-1795000000 deleted locally\"",
            name
        ));
        assert_eq!(last_lines(""), "no output");
        assert_eq!(last_lines("a\nb\nc\nd\n"), "d | c | b");
    }

    #[test]
    fn the_saved_name_is_read_from_k3s_line() {
        let line = "time=\"2026-11-27T11:00:00Z\" level=info msg=\"Snapshot on-demand-c1-cp-abcde-1795000000 saved.\"\n";
        assert_eq!(
            saved_name(line).as_deref(),
            Some("on-demand-c1-cp-abcde-1795000000")
        );
        assert_eq!(
            saved_name("INFO[0000] Snapshot on-demand-x-1 saved.\n").as_deref(),
            Some("on-demand-x-1")
        );
        assert_eq!(
            saved_name("level=warning msg=\"Unable to take snapshot\""),
            None
        );
        assert_eq!(saved_name("Snapshot ../../etc/shadow saved."), None);
    }
}
