//! Backups onto the rack, shared by their two writers, and the in-cluster one itself.
//!
//! - `bootstrap backup` ([`crate::workflows::bootstrap::backup`]) takes an on-demand snapshot
//!   over SSH from a laptop;
//! - the in-cluster backup ([`run_scheduled`], `reconcile-once backup`, run by the CronJob
//!   `oxide-controller-backup`) uploads the snapshot k3s's own `etcd-snapshot-schedule-cron`
//!   took on the server its pod runs on, read from a read-only hostPath of k3s's snapshot
//!   directory. It needs no SSH key: the rack token and server token come from the Secret,
//!   the file from the host (docs/DESIGN-NOTES.md "Backups on the rack").
//!
//! Both then [`upload`]: the archive bulk-imported into a temporary disk, the disk finalized,
//! `POST /v1/snapshots` of it with the backup's description, the disk deleted, retention
//! applied; and both leave a [`BackupReport`] in the ConfigMap ([`record`]) that reconcile
//! copies into `status.json`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, SubsecRound as _, Utc};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use tracing::{info, warn};

use crate::adapters::image::{self, ImageStore, SourceReader, UploadOptions};
use crate::base::names::{self, InstanceTag};
use crate::base::secrets::ClusterSecrets;
use crate::domain::backup::{self, BackupReport, LastBackup, Manifest, ManifestServer};
use crate::domain::model::InstanceState;
use crate::domain::spec::{ClusterSpec, DEFAULT_CONTROL_PLANE_POOL};
use crate::ports::rack::{Rack, RackError};
use crate::ports::state::{self, StateError, StateStore};
use crate::workflows::error::{self, WorkflowError, message};

/// Largest etcd snapshot taken (etcd's own quota tops out at 8 GiB; k3s's default is 2).
pub const MAX_SNAPSHOT_BYTES: usize = 2 * 1024 * 1024 * 1024;
/// Where k3s writes snapshots with its default data dir (`${data-dir}/server/db/snapshots`).
pub const K3S_SNAPSHOT_DIR: &str = "/var/lib/rancher/k3s/server/db/snapshots";

fn rack_failed(step: &'static str, e: RackError) -> WorkflowError {
    match e {
        RackError::Unauthorized { .. } => {
            WorkflowError::needs_person(step, error::context("the Oxide API", e))
        }
        _ => WorkflowError::step(step, error::context("the Oxide API", e)),
    }
}

/// One server of the cluster as the rack shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Server {
    pub name: String,
    pub state: InstanceState,
}

/// The cluster's servers (instances of its pool `pool`) on the rack.
pub async fn servers<R: Rack>(
    rack: &R,
    cluster: &str,
    pool: &str,
) -> Result<Vec<Server>, RackError> {
    let listed = match rack.list_instances(&names::cluster_prefix(cluster)).await {
        Ok(l) => l,
        Err(RackError::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(listed
        .into_iter()
        .filter(|i| {
            InstanceTag::parse(&i.description)
                .is_some_and(|t| t.cluster == cluster && t.pool == pool)
        })
        .filter(|i| i.state != InstanceState::Destroyed)
        .map(|i| Server {
            name: i.name,
            state: i.state,
        })
        .collect())
}

/// The cluster's backups on the rack, newest first.
pub async fn list_backups<R: Rack>(
    rack: &R,
    cluster: &str,
) -> Result<Vec<backup::Backup>, RackError> {
    let snapshots = rack.list_snapshots().await?;
    Ok(backup::of_cluster(
        cluster,
        snapshots
            .iter()
            .map(|s| (s.name.as_str(), s.description.as_str())),
    ))
}

/// The servers and their private addresses, for the manifest.
pub async fn server_addresses<R: Rack>(
    rack: &R,
    cluster: &str,
    pool: &str,
) -> Result<Vec<ManifestServer>, WorkflowError> {
    let mut out = Vec::new();
    for s in servers(rack, cluster, pool)
        .await
        .map_err(|e| rack_failed("server", e))?
    {
        let ip = rack
            .instance_private_ip(&s.name)
            .await
            .map_err(|e| rack_failed("server", e))?;
        out.push(ManifestServer {
            name: s.name,
            private_ip: ip.map(|i| i.to_string()),
        });
    }
    Ok(out)
}

/// What [`upload`] made.
#[derive(Debug, Clone)]
pub struct Uploaded {
    /// The Oxide snapshot holding the backup.
    pub name: String,
    pub stats: image::UploadStats,
    /// Backups retention deleted.
    pub pruned: Vec<String>,
    /// The cluster's backups now, newest first.
    pub backups: Vec<String>,
}

/// The backup of `snapshot` (`manifest.bytes` of it) described by `manifest` onto the rack,
/// then `retention` applied: the leftovers of earlier backups cut short removed, the archive
/// streamed into a temporary disk (the snapshot between the archive's head and tail, never
/// copied whole), the disk into the backup snapshot, the disk removed (on failure too).
pub async fn upload<R: Rack + ImageStore>(
    rack: &R,
    manifest: &Manifest,
    snapshot: SourceReader,
    retention: backup::Retention,
) -> Result<Uploaded, WorkflowError> {
    remove_leftover_imports(rack, &manifest.cluster).await;
    let name = backup::backup_name(&manifest.cluster, manifest.time);
    let (head, tail) = backup::archive_parts(manifest);
    let size = head.len() as u64 + manifest.bytes + tail.len() as u64;
    let memory = |v: Vec<u8>| SourceReader::Memory {
        data: bytes::Bytes::from(v),
        pos: 0,
    };
    let archive = SourceReader::Chain([memory(head), snapshot, memory(tail)].into());
    let stats = store(rack, &name, manifest, archive, size).await?;
    let (pruned, backups) = prune(rack, &manifest.cluster, retention).await?;
    Ok(Uploaded {
        name,
        stats,
        pruned,
        backups,
    })
}

/// The archive into a temporary disk, the disk into the backup snapshot, the disk removed.
/// On failure the temporary disk is removed too.
async fn store<R: ImageStore>(
    rack: &R,
    name: &str,
    manifest: &Manifest,
    mut reader: SourceReader,
    size: u64,
) -> Result<image::UploadStats, WorkflowError> {
    let step = "upload";
    let disk = backup::import_disk_name(name);
    let opts = UploadOptions::default().normalized();
    let sizes = image::import_sizes(size, opts.block_size);
    let description = image::import_disk_description(name, Some(&manifest.cluster));
    let tag = manifest.tag().description();
    let result = async {
        rack.create_import_disk(&disk, &description, sizes.disk_size, opts.block_size)
            .await
            .map_err(|e| rack_failed(step, e))?;
        rack.bulk_write_start(&disk)
            .await
            .map_err(|e| rack_failed(step, e))?;
        let stats = image::upload(
            rack,
            &disk,
            &mut reader,
            size,
            &format!("backup {name}"),
            &opts,
            &image::NoProgress,
        )
        .await
        .map_err(|e| WorkflowError::step(step, e))?;
        rack.bulk_write_stop(&disk)
            .await
            .map_err(|e| rack_failed(step, e))?;
        rack.finalize_import(&disk, None)
            .await
            .map_err(|e| rack_failed(step, e))?;
        crate::base::retry::retry(opts.retry, RackError::is_retryable, || {
            rack.create_snapshot(name, &tag, &disk)
        })
        .await
        .map_err(|e| rack_failed(step, e))?;
        Ok::<_, WorkflowError>(stats)
    }
    .await;
    // The snapshot outlives its disk; the disk goes either way.
    let released = image::release_import_disk(rack, &disk, opts.retry).await;
    match (result, released) {
        (Ok(stats), Ok(())) => Ok(stats),
        (Ok(stats), Err(e)) => {
            warn!(error = %e, %disk, "the backup is made, but its temporary disk was not removed; the next backup or bootstrap delete removes it");
            Ok(stats)
        }
        (Err(e), _) => Err(e),
    }
}

/// Removes the temporary disks of this cluster's earlier backups that were cut short (a
/// killed run leaves one in whatever import state it reached). Best effort: a failure only
/// leaves them for the next run or `bootstrap delete`.
async fn remove_leftover_imports<R: Rack + ImageStore>(rack: &R, cluster: &str) {
    let disks = match rack.list_disks().await {
        Ok(d) => d,
        Err(e) => {
            warn!(error = %e, "cannot list disks to remove leftovers of earlier backups");
            return;
        }
    };
    let prefix = backup::import_disk_name(&format!("{cluster}-etcd-"));
    for d in disks.iter().filter(|d| {
        d.name.starts_with(prefix.trim_end_matches('-'))
            && image::import_disk_cluster(&d.description) == Some(cluster)
    }) {
        info!(disk = %d.name, "removing the temporary disk of an earlier backup cut short");
        if let Err(e) =
            image::release_import_disk(rack, &d.name, crate::base::retry::Backoff::default()).await
        {
            warn!(disk = %d.name, error = %e, "cannot remove a leftover backup import disk");
        }
    }
}

/// Deletes what retention does not keep; returns the deleted and the kept names.
async fn prune<R: Rack>(
    rack: &R,
    cluster: &str,
    retention: backup::Retention,
) -> Result<(Vec<String>, Vec<String>), WorkflowError> {
    let step = "retention";
    let all = list_backups(rack, cluster)
        .await
        .map_err(|e| rack_failed(step, e))?;
    let gone = backup::prune(&all, retention, Utc::now());
    for name in &gone {
        info!(step, backup = %name, "deleting a backup retention does not keep");
        match rack.delete_snapshot(name).await {
            Ok(()) | Err(RackError::NotFound { .. }) => {}
            Err(e) => return Err(rack_failed(step, e)),
        }
    }
    let kept = all
        .into_iter()
        .map(|b| b.name)
        .filter(|n| !gone.contains(n))
        .collect();
    Ok((gone, kept))
}

/// Leaves the outcome of a backup attempt at `at` in [`state::keys::BACKUP`] of ConfigMap
/// [`state::BACKUP_OBJECT`], the one object the backup account may update (audit security-2
/// N4); in a cluster bootstrapped before it, in the ConfigMap. Re-read and written again on
/// a conflict; nothing else changes.
pub async fn record<S: StateStore>(
    state: &S,
    at: DateTime<Utc>,
    outcome: Result<LastBackup, String>,
) -> Result<(), StateError> {
    state::edit_backups(state, |was| {
        was.and_then(BackupReport::from_json)
            .unwrap_or_default()
            .after(at, outcome.clone())
            .to_json()
    })
    .await
}

/// Leaves a restore drill's result in the ConfigMap's [`state::keys::DRILL`] (re-read and
/// written again on a conflict; nothing else changes); the next reconcile judges it.
pub async fn record_drill<S: StateStore>(
    state: &S,
    result: backup::drill::DrillResult,
) -> Result<(), StateError> {
    state::edit_config(state, None, |data| {
        let report = data
            .get(state::keys::DRILL)
            .and_then(|j| backup::drill::DrillReport::from_json(j))
            .unwrap_or_default()
            .after(result.clone());
        data.insert(state::keys::DRILL.to_owned(), report.to_json());
    })
    .await
}

// ---- the in-cluster backup ----------------------------------------------------------------

/// How the in-cluster backup runs.
#[derive(Debug, Clone)]
pub struct ScheduledOptions {
    /// k3s's snapshot directory as the pod sees it (a read-only hostPath).
    pub snapshot_dir: PathBuf,
    /// How long to wait for the snapshot of this tick (k3s takes it at the same cron tick
    /// the CronJob starts the pod on).
    pub wait: Duration,
    /// Pause between looks at the directory.
    pub poll: Duration,
    /// The Node the pod runs on (the downward API's `spec.nodeName`), for the manifest.
    pub node: Option<String>,
    /// The retention no edit of `spec.yaml` goes below ([`read_retention_floor`]).
    pub retention_floor: Option<backup::Retention>,
}

impl ScheduledOptions {
    pub fn new(snapshot_dir: PathBuf) -> Self {
        ScheduledOptions {
            snapshot_dir,
            wait: Duration::from_secs(300),
            poll: Duration::from_secs(2),
            node: None,
            retention_floor: None,
        }
    }
}

/// What the in-cluster backup did.
#[derive(Debug, Clone)]
pub enum ScheduledOutcome {
    /// The spec's `backup.schedule` is null: nothing to do.
    Off,
    /// The backup `name` of k3s snapshot `k3s_snapshot` is on the rack.
    Done {
        name: String,
        k3s_snapshot: String,
        bytes: u64,
        seconds: f64,
        pruned: Vec<String>,
    },
}

/// The rack credentials the backup pod is given: the files `oxide-host`, `oxide-token`,
/// `oxide-project` and `oxide-cluster` in `dir`, where it mounts Secret
/// `oxide-controller-backup/oxide-controller-rack` (bootstrap writes it from the state Secret).
/// The other fields are empty: the backup needs no other credential. Errors name the file,
/// never a value.
pub fn read_rack_credentials(dir: &Path) -> Result<ClusterSecrets, WorkflowError> {
    use crate::base::secrets::keys;
    let read = |key: &str| {
        let path = dir.join(key);
        std::fs::read_to_string(&path)
            .map(|v| v.trim().to_owned())
            .map_err(|e| {
                WorkflowError::needs_person(
                    "state",
                    message(format!(
                        "cannot read {}: {e}; the backup pod mounts Secret {}/{} there, which bootstrap writes: re-run bootstrap",
                        path.display(),
                        crate::render::manifests::BACKUP_CRONJOB,
                        crate::render::manifests::BACKUP_RACK_SECRET
                    )),
                )
            })
    };
    Ok(ClusterSecrets {
        oxide_host: read(keys::OXIDE_HOST)?,
        oxide_token: read(keys::OXIDE_TOKEN)?,
        oxide_project: read(keys::OXIDE_PROJECT)?,
        oxide_cluster: read(keys::OXIDE_CLUSTER)?,
        ..ClusterSecrets::default()
    })
}

/// The retention floor in `dir` (file [`crate::render::manifests::BACKUP_RETENTION_FLOOR`] of
/// the backup's own Secret, written by bootstrap); `None` when bootstrap wrote none yet.
pub fn read_retention_floor(dir: &Path) -> Result<Option<backup::Retention>, WorkflowError> {
    let path = dir.join(crate::render::manifests::BACKUP_RETENTION_FLOOR);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(WorkflowError::step(
                "state",
                error::context(path.display().to_string(), e),
            ));
        }
    };
    serde_json::from_str(text.trim()).map(Some).map_err(|e| {
        WorkflowError::needs_person(
            "state",
            message(format!(
                "{} is not a retention ({e}); re-run bootstrap to write it again",
                path.display()
            )),
        )
    })
}

/// One in-cluster backup: reads the ConfigMap, waits for k3s's snapshot of this tick, counts
/// the cluster's objects as `bootstrap backup` does (`count`: the kinds of
/// `crate::adapters::kubeclient::COUNTED_KINDS`, for a restore drill to compare), uploads it
/// and applies retention, then records the outcome in the ConfigMap (a failure too).
/// `make_rack` connects with the rack credentials the pod was given (its own Secret, mounted:
/// the backup account reads no Secret, so it never holds the server token that decrypts the
/// Secrets in the snapshot, audit security-2 N1/N8); the token fingerprint the backup is tagged
/// with is the ConfigMap's ([`state::keys::K3S_TOKEN_FINGERPRINT`], written by bootstrap).
pub async fn run_scheduled<S, R, M, C, F>(
    state: &S,
    make_rack: M,
    count: C,
    opts: &ScheduledOptions,
) -> Result<ScheduledOutcome, WorkflowError>
where
    S: StateStore,
    R: Rack + ImageStore,
    M: FnOnce() -> Result<R, RackError>,
    C: FnOnce(DateTime<Utc>) -> F,
    F: std::future::Future<Output = Result<u64, String>>,
{
    let step = "state";
    let started_at = Utc::now();
    let config = state
        .read_config()
        .await
        .map_err(|e| WorkflowError::step(step, e))?;
    let spec_text = config
        .spec_yaml()
        .ok_or_else(|| {
            WorkflowError::needs_person(step, message("the ConfigMap has no spec.yaml"))
        })?
        .to_owned();
    let spec =
        ClusterSpec::from_yaml(&spec_text).map_err(|e| WorkflowError::needs_person(step, e))?;
    if spec.backup.schedule.is_none() {
        info!("backup.schedule is null: the in-cluster backup is off");
        return Ok(ScheduledOutcome::Off);
    }
    let report = state::read_backup_report(state, &config)
        .await
        .map_err(|e| WorkflowError::step(step, e))?
        .and_then(|j| BackupReport::from_json(&j))
        .unwrap_or_default();
    let after = report.last_success.as_ref().map(|b| b.time);
    let token = recorded_token_fingerprint(&config)?;
    let attempt = async {
        let (file, time) = wait_for_snapshot(opts, started_at, after).await?;
        refuse_retired_keys(state, &file, time).await?;
        // Counted as soon as the snapshot is there, of what was made before it (k3s took it at
        // this tick; what was made since cannot be restored), as `bootstrap backup`'s count.
        let objects = count_or_warn(|| count(time)).await;
        let rack = make_rack().map_err(|e| WorkflowError::step("upload", e))?;
        let (snapshot, bytes, sha256) = open_snapshot(&opts.snapshot_dir.join(&file)).await?;
        let manifest = Manifest {
            format: backup::FORMAT,
            cluster: spec.cluster.clone(),
            // The control plane's release and image: what a restore of this backup installs.
            k3s_version: spec.k3s_version(&spec.control_plane).to_owned(),
            image: Some(spec.control_plane.image.clone()),
            time,
            k3s_snapshot: file.clone(),
            taken_on: opts.node.clone().unwrap_or_else(|| node_of(&file)),
            sha256,
            bytes,
            token: token.clone(),
            objects,
            spec: spec_text.clone(),
            servers: server_addresses(&rack, &spec.cluster, DEFAULT_CONTROL_PLANE_POOL).await?,
        };
        let uploading = tokio::time::Instant::now();
        let (retention, raised) = spec.backup.retention().at_least(opts.retention_floor);
        if raised {
            warn!(spec = ?spec.backup.retention(), applied = ?retention, "spec.yaml keeps fewer backups than the floor bootstrap recorded; the floor applies (re-run bootstrap with the lower retention to lower it)");
        }
        let up = upload(&rack, &manifest, snapshot, retention).await?;
        Ok::<_, WorkflowError>((manifest, up, uploading.elapsed().as_secs_f64()))
    }
    .await;
    let recorded = match &attempt {
        Ok((m, up, _)) => Ok(LastBackup {
            name: up.name.clone(),
            time: m.time,
            k3s_snapshot: m.k3s_snapshot.clone(),
            bytes: m.bytes,
            by: "schedule".to_owned(),
        }),
        Err(e) => Err(error::chain(e)),
    };
    if let Err(e) = record(state, Utc::now(), recorded).await {
        warn!(error = %e, "cannot record the backup's outcome in the ConfigMap; status.json will not show it");
    }
    let (manifest, up, seconds) = attempt?;
    info!(backup = %up.name, k3s_snapshot = %manifest.k3s_snapshot, bytes = manifest.bytes, seconds, pruned = ?up.pruned, "the backup is on the rack");
    Ok(ScheduledOutcome::Done {
        name: up.name,
        k3s_snapshot: manifest.k3s_snapshot,
        bytes: manifest.bytes,
        seconds,
        pruned: up.pruned,
    })
}

/// Refuses the snapshot `file` taken at `time` if it predates bootstrap's removal of the
/// retired keys from the Secret ([`backup::retired::check_snapshot`], audit security-2 N1): it
/// would carry the old controller's SSH private key to the rack. The ConfigMap is read again
/// here, after the wait, so a bootstrap that ran meanwhile counts.
async fn refuse_retired_keys<S: StateStore>(
    state: &S,
    file: &str,
    time: DateTime<Utc>,
) -> Result<(), WorkflowError> {
    let step = "snapshot";
    let config = state
        .read_config()
        .await
        .map_err(|e| WorkflowError::step(step, e))?;
    let recorded = config
        .data
        .get(state::keys::RETIRED_KEYS_REMOVED_AT)
        .map(String::as_str);
    backup::retired::check_snapshot(recorded, file, time).map_err(|why| {
        warn!(%file, %time, "{why}");
        WorkflowError::step(step, message(why))
    })
}

/// The server token's fingerprint bootstrap wrote into the ConfigMap
/// ([`state::keys::K3S_TOKEN_FINGERPRINT`]): what the backup is tagged with.
fn recorded_token_fingerprint(config: &state::ConfigSnapshot) -> Result<String, WorkflowError> {
    config
        .data
        .get(state::keys::K3S_TOKEN_FINGERPRINT)
        .cloned()
        .ok_or_else(|| {
            WorkflowError::needs_person(
                "state",
                message(format!(
                    "the ConfigMap has no {:?} (the server token's fingerprint, written by bootstrap): re-run bootstrap",
                    state::keys::K3S_TOKEN_FINGERPRINT
                )),
            )
        })
}

/// The object count for the backup's manifest, or none (with a warning) when the API could
/// not be counted: the backup itself goes on.
async fn count_or_warn<C, F>(count: C) -> Option<u64>
where
    C: FnOnce() -> F,
    F: std::future::Future<Output = Result<u64, String>>,
{
    match count().await {
        Ok(n) => Some(n),
        Err(e) => {
            warn!(error = %e, "cannot count the cluster's objects; a restore drill of this backup will not compare them");
            None
        }
    }
}

/// How far before the Job's start a snapshot still counts as this tick's (the pod may start
/// after k3s wrote it).
const TICK_SLACK: Duration = Duration::from_secs(120);

/// The scheduled snapshot to upload: the newest one of this tick (taken no earlier than
/// [`TICK_SLACK`] before `started_at`) newer than the last backup (`after`), waited for up
/// to `opts.wait`; after that, the newest one newer than the last backup, whatever its age.
async fn wait_for_snapshot(
    opts: &ScheduledOptions,
    started_at: DateTime<Utc>,
    after: Option<DateTime<Utc>>,
) -> Result<(String, DateTime<Utc>), WorkflowError> {
    let step = "snapshot";
    let tick = started_at - chrono::Duration::from_std(TICK_SLACK).unwrap_or_default();
    let until = tokio::time::Instant::now() + opts.wait;
    loop {
        let newest = newest_scheduled(&opts.snapshot_dir)
            .map_err(|e| {
                WorkflowError::step(
                    step,
                    error::context(format!("reading {}", opts.snapshot_dir.display()), e),
                )
            })?
            .filter(|(_, t)| after.is_none_or(|a| *t > a));
        match newest {
            Some((file, time)) if time >= tick => return Ok((file, time)),
            Some((file, time)) if tokio::time::Instant::now() >= until => {
                warn!(%file, %time, "k3s took no snapshot at this tick; uploading the newest one not backed up yet");
                return Ok((file, time));
            }
            None if tokio::time::Instant::now() >= until => {
                return Err(WorkflowError::step(
                    step,
                    message(format!(
                        "k3s took no scheduled etcd snapshot in {} newer than {} within {} s: each server's etcd-snapshot-schedule-cron follows backup.schedule only from when it was created (older servers keep k3s's default, 0 */12 * * *, until they are replaced)",
                        opts.snapshot_dir.display(),
                        after.map_or_else(|| "the start".to_owned(), |a| a.to_rfc3339()),
                        opts.wait.as_secs()
                    )),
                ));
            }
            _ => tokio::time::sleep(opts.poll).await,
        }
    }
}

/// The newest scheduled snapshot file in `dir` (by the time in its name) and that time.
fn newest_scheduled(dir: &Path) -> std::io::Result<Option<(String, DateTime<Utc>)>> {
    let mut newest: Option<(String, DateTime<Utc>)> = None;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Some(time) = backup::report::scheduled_snapshot_time(&name) else {
            continue;
        };
        if newest.as_ref().is_none_or(|(n, t)| (time, &name) > (*t, n)) {
            newest = Some((name, time));
        }
    }
    Ok(newest.map(|(n, t)| (n, t.trunc_subsecs(0))))
}

/// The node part of `etcd-snapshot-<node>-<unix seconds>`.
fn node_of(file: &str) -> String {
    file.strip_prefix(backup::report::SCHEDULED_PREFIX)
        .and_then(|r| r.rsplit_once('-'))
        .map_or_else(|| "unknown".to_owned(), |(n, _)| n.to_owned())
}

/// How much of the snapshot one read takes while it is hashed.
const HASH_CHUNK: usize = 1 << 20;

/// The snapshot file (bounded by [`MAX_SNAPSHOT_BYTES`]) opened for the upload, its size and
/// its sha256 (hex), read once in [`HASH_CHUNK`]s: memory stays bounded whatever the
/// snapshot's size (the Job's limit, `k8s-cronjobs/backup.yaml`). The upload reads the same
/// open file again from the start: k3s writes snapshots whole and renames them into place, and
/// its retention may unlink this one meanwhile, which an open file outlives.
pub async fn open_snapshot(path: &Path) -> Result<(SourceReader, u64, String), WorkflowError> {
    let step = "snapshot";
    let failed = |e: std::io::Error| {
        WorkflowError::step(step, error::context(path.display().to_string(), e))
    };
    let file = std::fs::File::open(path).map_err(failed)?;
    let len = file.metadata().map_err(failed)?.len();
    if len == 0 || len > MAX_SNAPSHOT_BYTES as u64 {
        return Err(WorkflowError::step(
            step,
            message(format!(
                "{} is {len} bytes: not an etcd snapshot this backup takes (1 byte to 2 GiB)",
                path.display()
            )),
        ));
    }
    let (file, hashed) = tokio::task::spawn_blocking(move || {
        use std::io::{Read as _, Seek as _};
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; HASH_CHUNK];
        let mut read = 0u64;
        let hashed = (|| {
            let mut f = &file;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                read += n as u64;
            }
            f.rewind()?;
            Ok::<_, std::io::Error>((read, backup::hex(&hasher.finalize())))
        })();
        (file, hashed)
    })
    .await
    .map_err(|e| WorkflowError::step(step, message(format!("the hashing thread failed: {e}"))))?;
    let (read, sha256) = hashed.map_err(failed)?;
    if read != len {
        return Err(WorkflowError::step(
            step,
            message(format!(
                "{} changed while it was read ({len} bytes, then {read}); the next run takes the next snapshot",
                path.display()
            )),
        ));
    }
    Ok((SourceReader::File(Some(file)), len, sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backup's own Secret holds the four rack keys (and the retention floor, not a
    /// secret) and nothing else: no server or agent token, no SSH or Tailscale key (the webhook's
    /// tokens are not in the state Secret at all)
    /// (audit security-2 N1, N8).
    #[test]
    fn the_backups_rack_secret_holds_the_rack_credentials_only() {
        use base64::Engine as _;
        let secrets = ClusterSecrets {
            oxide_host: "https://rack.example".into(),
            oxide_token: "oxide-token-value".into(),
            oxide_project: "prod".into(),
            oxide_cluster: "prod".into(),
            k3s_token: "k3s-token-value".into(),
            k3s_agent_token: "agent-token-value".into(),
            ssh_public_key: "ssh-ed25519 AAAA-public-value".into(),
            tailscale_auth_key: Some("tskey-value".into()),
            ..ClusterSecrets::default()
        };
        let m = crate::render::manifests::backup_rack_secret(&secrets, Default::default());
        assert_eq!(
            m.describe(),
            "Secret oxide-controller-backup/oxide-controller-rack"
        );
        let data = m.object["data"].as_object().unwrap();
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "backup-retention-floor",
                "oxide-cluster",
                "oxide-host",
                "oxide-project",
                "oxide-token"
            ]
        );
        let token = base64::engine::general_purpose::STANDARD
            .decode(data["oxide-token"].as_str().unwrap())
            .unwrap();
        assert_eq!(token, b"oxide-token-value");
        let text = m.object.to_string();
        for absent in [
            "k3s-token-value",
            "agent-token-value",
            "AAAA-public-value",
            "tskey-value",
        ] {
            let b64 = base64::engine::general_purpose::STANDARD.encode(absent);
            assert!(!text.contains(absent) && !text.contains(&b64), "{absent}");
        }
    }

    /// The pod's rack credentials are the four files of its mounted Secret; a missing one is
    /// named (with what to do), its neighbours' values never.
    #[test]
    fn rack_credentials_are_read_from_the_mounted_secret_and_errors_name_no_value() {
        let dir = tempfile::tempdir().unwrap();
        for (k, v) in [
            ("oxide-host", "https://rack.example\n"),
            ("oxide-token", "oxide-token-value-9a1c"),
            ("oxide-project", "prod"),
        ] {
            std::fs::write(dir.path().join(k), v).unwrap();
        }
        let e = read_rack_credentials(dir.path()).unwrap_err();
        let text = crate::workflows::error::chain(&e);
        assert!(
            text.contains("oxide-cluster") && text.contains("re-run bootstrap"),
            "{text}"
        );
        assert!(!text.contains("oxide-token-value-9a1c"), "{text}");
        std::fs::write(dir.path().join("oxide-cluster"), "prod").unwrap();
        let s = read_rack_credentials(dir.path()).unwrap();
        assert_eq!(s.oxide_host, "https://rack.example");
        assert_eq!(s.oxide_token, "oxide-token-value-9a1c");
        assert_eq!(
            (s.oxide_project.as_str(), s.oxide_cluster.as_str()),
            ("prod", "prod")
        );
        assert!(s.k3s_token.is_empty(), "no server token");
    }

    /// A FakeState whose ConfigMap changes under the first write (the webhook writing the spec),
    /// and which has no backup object (a cluster bootstrapped before it): the record re-reads,
    /// keeps that change, and adds its report to the ConfigMap.
    #[derive(Clone)]
    struct Racing(
        crate::fake::FakeState,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    );

    impl StateStore for Racing {
        async fn read_config(&self) -> Result<state::ConfigSnapshot, StateError> {
            self.0.read_config().await
        }
        async fn replace_config(
            &self,
            rv: &str,
            data: std::collections::BTreeMap<String, String>,
        ) -> Result<String, StateError> {
            if !self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let now = self.0.read_config().await?;
                let mut other = now.data.clone();
                other.insert(state::keys::SPEC.into(), "changed meanwhile".into());
                self.0.replace_config(&now.resource_version, other).await?;
            }
            self.0.replace_config(rv, data).await
        }
        async fn read_secrets(&self) -> Result<ClusterSecrets, StateError> {
            self.0.read_secrets().await
        }
        async fn ensure_state(
            &self,
            s: &ClusterSecrets,
            c: std::collections::BTreeMap<String, String>,
        ) -> Result<(), StateError> {
            self.0.ensure_state(s, c).await
        }
        async fn merge_host_key_pins(
            &self,
            p: &std::collections::BTreeMap<String, Vec<String>>,
        ) -> Result<std::collections::BTreeMap<String, Vec<String>>, StateError> {
            self.0.merge_host_key_pins(p).await
        }
    }

    #[tokio::test]
    async fn a_record_survives_a_concurrent_write_and_keeps_the_last_success() {
        let world = crate::fake::FakeWorld::new(Utc::now());
        let fake = world.state();
        fake.ensure_state(
            &ClusterSecrets::default(),
            [(state::keys::SPEC.to_owned(), "spec".to_owned())].into(),
        )
        .await
        .unwrap();
        let racing = Racing(fake.clone(), std::sync::Arc::default());
        let at = Utc::now().trunc_subsecs(0);
        let made = LastBackup {
            name: "demo-etcd-x".into(),
            time: at,
            k3s_snapshot: "etcd-snapshot-demo-cp-a-1".into(),
            bytes: 7,
            by: "schedule".into(),
        };
        record(&racing, at, Ok(made.clone())).await.unwrap();
        record(&racing, at, Err("quota".into())).await.unwrap();
        let data = fake.read_config().await.unwrap().data;
        assert_eq!(
            data[state::keys::SPEC],
            "changed meanwhile",
            "the other write is kept"
        );
        let report = BackupReport::from_json(&data[state::keys::BACKUP]).unwrap();
        assert_eq!(report.last_success, Some(made));
        assert_eq!(report.last_error.as_deref(), Some("quota"));
    }

    /// Audit security-2 N4: the report goes to ConfigMap `oxide-controller-backup`, the one
    /// object the backup account may update; the ConfigMap is not written. The first record
    /// after an upgrade starts from the report the ConfigMap still holds, and a reader then
    /// finds the new one.
    #[tokio::test]
    async fn a_record_goes_to_the_backup_object_and_starts_from_the_legacy_report() {
        let world = crate::fake::FakeWorld::new(Utc::now());
        let fake = world.state();
        let at = Utc::now().trunc_subsecs(0);
        let made = LastBackup {
            name: "demo-etcd-x".into(),
            time: at,
            k3s_snapshot: "etcd-snapshot-demo-cp-a-1".into(),
            bytes: 7,
            by: "schedule".into(),
        };
        let legacy = BackupReport::default().after(at, Ok(made.clone()));
        fake.ensure_state(
            &ClusterSecrets::default(),
            [
                (state::keys::SPEC.to_owned(), "spec".to_owned()),
                (state::keys::BACKUP.to_owned(), legacy.to_json()),
            ]
            .into(),
        )
        .await
        .unwrap();
        let config = fake.read_config().await.unwrap();
        record(&fake, at, Err("quota".into())).await.unwrap();
        assert_eq!(
            fake.read_config().await.unwrap(),
            config,
            "ConfigMap untouched"
        );
        let object = fake.read_backups().await.unwrap().unwrap();
        let report = BackupReport::from_json(&object.data[state::keys::BACKUP]).unwrap();
        assert_eq!(report.last_success, Some(made), "carried over");
        assert_eq!(report.last_error.as_deref(), Some("quota"));
        let read = state::read_backup_report(&fake, &config).await.unwrap();
        assert_eq!(read.as_deref(), Some(report.to_json().as_str()));
    }

    /// Audit security-2 N4: a `spec.yaml` edited down to `keep: 1, keep_daily: 0` (by whoever
    /// may write it) does not make the in-cluster backup delete the history: the floor
    /// bootstrap recorded in the backup's own Secret applies. Without a floor the edit would.
    #[tokio::test]
    async fn the_retention_floor_keeps_what_an_edited_spec_would_prune() {
        let dir = tempfile::tempdir().unwrap();
        let floor = backup::Retention {
            keep: 24,
            keep_daily: 7,
        };
        std::fs::write(
            dir.path()
                .join(crate::render::manifests::BACKUP_RETENTION_FLOOR),
            serde_json::to_string(&floor).unwrap(),
        )
        .unwrap();
        assert_eq!(read_retention_floor(dir.path()).unwrap(), Some(floor));
        for (floor, left) in [(None, 1), (Some(floor), 2)] {
            let world = crate::fake::FakeWorld::new(Utc::now());
            let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 1, 1);
            (spec.backup.keep, spec.backup.keep_daily) = (1, 0);
            world
                .state()
                .ensure_state(
                    &ClusterSecrets::default(),
                    [
                        (state::keys::SPEC.to_owned(), spec.to_yaml()),
                        (
                            state::keys::K3S_TOKEN_FINGERPRINT.to_owned(),
                            backup::token_fingerprint("t"),
                        ),
                    ]
                    .into(),
                )
                .await
                .unwrap();
            let snaps = tempfile::tempdir().unwrap();
            let mut opts = ScheduledOptions::new(snaps.path().to_path_buf());
            (opts.wait, opts.poll, opts.retention_floor) =
                (Duration::ZERO, Duration::from_millis(1), floor);
            let now = Utc::now().timestamp();
            for age in [7200, 3600] {
                let file = format!("etcd-snapshot-demo-control-plane-a-{}", now - age);
                std::fs::write(snaps.path().join(file), b"etcd").unwrap();
                let rack = world.rack();
                run_scheduled(&world.state(), || Ok(rack), |_| async { Ok(1) }, &opts)
                    .await
                    .unwrap();
            }
            let backups = world.with(|s| s.snapshots.len());
            assert_eq!(backups, left, "floor {floor:?}");
        }
    }

    /// Audit security-2 N1 fix 4: an upgraded cluster's scheduled backup that finds only a
    /// snapshot older than bootstrap's removal of the retired keys (the old SSH private key)
    /// refuses it, says why in the log, the error and `backup.json`, and uploads nothing; a
    /// snapshot taken after the removal goes up as usual.
    #[tokio::test]
    async fn a_snapshot_older_than_the_retired_keys_removal_is_refused_and_a_newer_one_goes_up() {
        let world = crate::fake::FakeWorld::new(Utc::now());
        let fake = world.state();
        let now = Utc::now().trunc_subsecs(0);
        let removed = now - chrono::Duration::minutes(10);
        let spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 3, 0).to_yaml();
        fake.ensure_state(
            &ClusterSecrets::default(),
            [
                (state::keys::SPEC.to_owned(), spec),
                (
                    state::keys::K3S_TOKEN_FINGERPRINT.to_owned(),
                    backup::token_fingerprint("t"),
                ),
                (
                    state::keys::RETIRED_KEYS_REMOVED_AT.to_owned(),
                    removed.to_rfc3339(),
                ),
            ]
            .into(),
        )
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut opts = ScheduledOptions::new(dir.path().to_path_buf());
        opts.wait = Duration::from_millis(100);
        opts.poll = Duration::from_millis(20);
        // The 12-hour schedule's last snapshot, taken before bootstrap removed the key.
        let old = format!(
            "etcd-snapshot-demo-control-plane-a-{}",
            (removed - chrono::Duration::hours(1)).timestamp()
        );
        std::fs::write(dir.path().join(&old), b"old etcd bytes").unwrap();
        let rack = world.rack();
        let run = || run_scheduled(&fake, || Ok(rack.clone()), |_| async { Ok(1) }, &opts);
        let e = run().await.unwrap_err();
        let text = error::chain(&e);
        assert!(
            text.contains(&old) && text.contains("retired-keys-removed-at"),
            "{text}"
        );
        assert!(list_backups(&rack, "demo").await.unwrap().is_empty());
        let data = fake.read_backups().await.unwrap().unwrap().data;
        let report = BackupReport::from_json(&data[state::keys::BACKUP]).unwrap();
        assert!(report.last_success.is_none(), "{report:?}");
        assert!(
            report
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains(&old) && e.contains("predates")),
            "{report:?}"
        );
        // k3s's next snapshot, after the removal: uploaded.
        let new = format!("etcd-snapshot-demo-control-plane-a-{}", now.timestamp());
        std::fs::write(dir.path().join(&new), b"new etcd bytes").unwrap();
        match run().await.unwrap() {
            ScheduledOutcome::Done { k3s_snapshot, .. } => assert_eq!(k3s_snapshot, new),
            other => panic!("{other:?}"),
        }
        assert_eq!(list_backups(&rack, "demo").await.unwrap().len(), 1);
    }

    #[test]
    fn the_newest_scheduled_file_is_chosen_and_others_ignored() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            "etcd-snapshot-c1-cp-a-1795000000",
            "etcd-snapshot-c1-cp-a-1795003600",
            "etcd-snapshot-c1-cp-a-1795007200.part",
            "on-demand-c1-cp-a-1795009000",
        ] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let (name, time) = newest_scheduled(dir.path()).unwrap().unwrap();
        assert_eq!(name, "etcd-snapshot-c1-cp-a-1795003600");
        assert_eq!(time.timestamp(), 1_795_003_600);
        assert_eq!(node_of(&name), "c1-cp-a");
    }

    #[tokio::test]
    async fn the_wait_takes_this_ticks_snapshot_else_the_newest_not_backed_up_else_fails() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = ScheduledOptions::new(dir.path().to_path_buf());
        opts.wait = Duration::from_millis(300);
        opts.poll = Duration::from_millis(50);
        let now = Utc::now();
        let old = now.timestamp() - 3600;
        std::fs::write(dir.path().join(format!("etcd-snapshot-n-{old}")), b"x").unwrap();
        // Nothing of this tick: after the wait, the newest not backed up yet.
        let (f, _) = wait_for_snapshot(&opts, now, None).await.unwrap();
        assert_eq!(f, format!("etcd-snapshot-n-{old}"));
        // Already backed up: nothing to take, a clear error.
        let after = DateTime::from_timestamp(old, 0);
        let e = wait_for_snapshot(&opts, now, after).await.unwrap_err();
        assert!(
            error::chain(&e).contains("etcd-snapshot-schedule-cron"),
            "{}",
            error::chain(&e)
        );
        // One written while waiting is taken at once.
        opts.wait = Duration::from_secs(10);
        let fresh = now.timestamp() + 1;
        let d = dir.path().to_path_buf();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::fs::write(d.join(format!("etcd-snapshot-n-{fresh}")), b"x").unwrap();
        });
        let (f, t) = wait_for_snapshot(&opts, now, after).await.unwrap();
        assert_eq!(
            (f, t.timestamp()),
            (format!("etcd-snapshot-n-{fresh}"), fresh)
        );
    }
}
