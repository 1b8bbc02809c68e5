//! `bootstrap backup`: one backup of the cluster's datastore, taken from the laptop and kept on
//! the rack as an Oxide snapshot ([`crate::domain::backup`] says what one holds), then the
//! spec's retention applied.
//!
//! 1. `validate` — the resume file (project, SSH key, server token, spec), the credentials;
//! 2. `server` — the server holding the API floating IP (the laptop reaches SSH through it, as
//!    bootstrap does), host keys pinned as for recover;
//! 3. `etcd-snapshot` — `k3s etcd-snapshot save` on it (k3s's own consistent on-demand
//!    snapshot), then the file read back over SSH;
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
    let (k3s_snapshot, data) =
        take_snapshot(&shell, &server, (deadline, SNAPSHOT_BUSY_RETRY)).await?;
    // Counted right after the snapshot, so the two agree but for what changed in between.
    let objects = match connect.object_count(&v.kubeconfig, &input.cluster).await {
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
    let spec_text = live_spec(store.as_ref(), &v).await;
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

/// `k3s etcd-snapshot save` on the server, then the file it wrote. Asked again every `retry`
/// while k3s is saving another snapshot (its schedule fires at the top of the hour), until
/// `deadline`.
async fn take_snapshot<S: RemoteShell>(
    shell: &S,
    server: &str,
    (deadline, retry): (Instant, Duration),
) -> Result<(String, Vec<u8>), BootstrapError> {
    let step = "etcd-snapshot";
    let (out, said) = loop {
        info!(step, %server, "running k3s etcd-snapshot save");
        let out = shell
            .exec(SNAPSHOT_SAVE)
            .await
            .map_err(|e| BootstrapError::step(step, e))?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.success() || !said.contains(SNAPSHOT_BUSY) || Instant::now() + retry >= deadline {
            break (out, said);
        }
        info!(step, %server, ?retry, "k3s is saving another snapshot; asking again");
        tokio::time::sleep(retry).await;
    };
    let name = saved_name(&said);
    let name = match (out.success(), name) {
        (true, Some(name)) => name,
        (true, None) => {
            return Err(BootstrapError::step(
                step,
                message(format!(
                    "k3s etcd-snapshot save on {server} exited 0 but saved no snapshot (k3s takes none on an etcd learner; is {server} still joining?)"
                )),
            ));
        }
        (false, _) => {
            let tail: String = said.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
            return Err(BootstrapError::step(
                step,
                message(format!(
                    "`{SNAPSHOT_SAVE}` on {server} exited {}: {tail}",
                    out.exit_status
                )),
            ));
        }
    };
    let path = format!("{K3S_SNAPSHOT_DIR}/{name}");
    let left = deadline.saturating_duration_since(Instant::now());
    let data = shell
        .read_large_file(&path, MAX_SNAPSHOT_BYTES, left.max(Duration::from_secs(60)))
        .await
        .map_err(|e| BootstrapError::step(step, e))?;
    if data.is_empty() {
        return Err(BootstrapError::step(
            step,
            message(format!("{path} on {server} is empty")),
        ));
    }
    info!(step, %server, snapshot = %name, bytes = data.len(), "read the snapshot");
    Ok((name, data))
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

/// The cluster's `spec.yaml` as the ConfigMap has it, else the resume file's.
async fn live_spec<S: StateStore>(store: Result<&S, &String>, v: &Validated) -> String {
    let fallback = v.resume.spec.clone().unwrap_or_default();
    let store = match store {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "the cluster's API is not reachable; the manifest gets the resume file's spec");
            return fallback;
        }
    };
    let read = tokio::time::timeout(Duration::from_secs(20), store.read_config()).await;
    match read {
        Ok(Ok(c)) => c.spec_yaml().map_or(fallback, str::to_owned),
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read the ConfigMap; the manifest gets the resume file's spec");
            fallback
        }
        Err(_) => fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::ssh::{CommandOutput, SshError};
    use futures::future::BoxFuture;
    use std::sync::Mutex;

    /// A server whose `k3s etcd-snapshot save` answers from a script, one answer per call.
    struct Scripted {
        answers: Mutex<Vec<(u32, &'static str)>>,
        calls: Mutex<u32>,
    }

    impl RemoteShell for Scripted {
        fn exec<'a>(&'a self, cmd: &'a str) -> BoxFuture<'a, Result<CommandOutput, SshError>> {
            Box::pin(async move {
                assert_eq!(cmd, SNAPSHOT_SAVE);
                *self.calls.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                let (exit_status, stderr) = self
                    .answers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(0);
                Ok(CommandOutput {
                    exit_status,
                    stdout: Vec::new(),
                    stderr: stderr.as_bytes().to_vec(),
                })
            })
        }

        fn read_file<'a>(&'a self, _path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, SshError>> {
            Box::pin(async move { Ok(b"etcd".to_vec()) })
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

    /// Audit day2-fidelity-4 M6: k3s refuses a second snapshot while its scheduled one is
    /// being saved; `bootstrap backup` asks again rather than failing the backup.
    #[tokio::test]
    async fn a_snapshot_refused_as_already_in_progress_is_asked_for_again() {
        let shell = Scripted {
            answers: Mutex::new(vec![(1, BUSY), (1, BUSY), (0, SAVED)]),
            calls: Mutex::new(0),
        };
        let deadline = Instant::now() + Duration::from_secs(300);
        let retry = Duration::from_millis(1);
        let (name, data) = take_snapshot(&shell, "c1-cp-abcde", (deadline, retry))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(name, "on-demand-c1-cp-abcde-1795000000");
        assert_eq!(data, b"etcd");
        assert_eq!(*shell.calls.lock().unwrap_or_else(|e| e.into_inner()), 3);
        // Any other failure, or the deadline, ends it at once with k3s's words.
        let shell = Scripted {
            answers: Mutex::new(vec![(1, BUSY)]),
            calls: Mutex::new(0),
        };
        let soon = Instant::now() + Duration::from_secs(1);
        let err = take_snapshot(&shell, "c1-cp-abcde", (soon, SNAPSHOT_BUSY_RETRY))
            .await
            .err()
            .map(|e| crate::workflows::error::chain(&e))
            .unwrap_or_default();
        assert!(err.contains("snapshot save already in progress"), "{err}");
        assert_eq!(*shell.calls.lock().unwrap_or_else(|e| e.into_inner()), 1);
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
