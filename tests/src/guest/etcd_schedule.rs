//! k3s's scheduled etcd snapshots on a server (each rule cited in `tests/FIDELITY.md`, "k3s
//! scheduled etcd snapshots"):
//!
//! - k3s starts its snapshot cron with etcd unless `etcd-disable-snapshots` is set; the
//!   schedule is `etcd-snapshot-schedule-cron` (default `0 */12 * * *`), parsed by robfig/cron
//!   v3's standard parser (five fields or a descriptor such as `@every 20s`); an invalid one
//!   is dropped without a word (k3s ignores `AddJob`'s error), so no snapshot is ever taken.
//! - On a tick (skipped while the previous job still runs) k3s waits a random jitter below
//!   5 s, then takes the same snapshot `k3s etcd-snapshot save` asks for: a learner takes none
//!   ("Unable to take snapshot: not supported for learner"); otherwise it logs "Saving etcd
//!   snapshot to PATH" and etcd's client writes the member's snapshot stream to `PATH.part`
//!   (mode 0600) and renames it to
//!   `${datadir}/server/db/snapshots/<etcd-snapshot-name>-<node name>-<unix seconds>`.
//! - Then retention: of the files in that directory whose name starts with
//!   `etcd-snapshot-name`, all but the newest `etcd-snapshot-retention` (default 5; below 1:
//!   none removed) are deleted, newest by the timestamp after the last `-`.
//! - The schedule lives in the k3s process: it ends when k3s stops (`systemctl stop k3s`, a
//!   halt, the instance's deletion, the simulator's shutdown) and starts again with k3s.
//!
//! Not modelled: `etcd-snapshot-dir`, `etcd-snapshot-compress`, S3, the snapshot metadata
//! ConfigMap and k3s's `ETCDSnapshotFile` objects.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use oxide_controller::base::kcron::Schedule;
use uuid::Uuid;

use super::k3s_config::K3sConfig;
use super::paths::SNAPSHOT_DIR;
use super::{Inner, K3sState};

/// k3s's `etcd-snapshot-schedule-cron` default.
pub const DEFAULT_SNAPSHOT_CRON: &str = "0 */12 * * *";
/// k3s's `etcd-snapshot-retention` default.
pub const DEFAULT_SNAPSHOT_RETENTION: i64 = 5;
/// k3s's `etcd-snapshot-name` default.
pub const DEFAULT_SNAPSHOT_NAME: &str = "etcd-snapshot";
/// k3s's `snapshotJitterMax`: a scheduled snapshot waits a random time below this.
const SNAPSHOT_JITTER_MAX: Duration = Duration::from_secs(5);
/// How often a waiting schedule looks whether its k3s still runs (so it ends promptly).
const STOP_CHECK: Duration = Duration::from_millis(250);

/// What k3s answers a snapshot asked for while another one on the same server is being saved.
pub(super) const SNAPSHOT_BUSY: &str = "snapshot save already in progress";

/// Held while one snapshot of a server's member is saved (k3s `Snapshot`:
/// `if !e.snapshotMu.TryLock() { return nil, errors.New("snapshot save already in progress") }`,
/// k3s index 2990796848 `pkg/etcd/snapshot.go`); released when dropped.
pub(super) struct SnapshotLock {
    inner: Arc<Inner>,
    id: Uuid,
}

impl Drop for SnapshotLock {
    fn drop(&mut self) {
        if let Some(vm) = self.inner.state().vms.get_mut(&self.id) {
            vm.snapshot_busy = false;
        }
    }
}

impl Inner {
    /// The server's snapshot lock, or None while another snapshot holds it; then as long as
    /// the `slow_snapshots` fault adds to the save.
    pub(super) async fn try_snapshot_lock(self: &Arc<Self>, id: Uuid) -> Option<SnapshotLock> {
        let stall = {
            let mut st = self.state();
            let vm = st.vms.get_mut(&id)?;
            if vm.snapshot_busy {
                return None;
            }
            vm.snapshot_busy = true;
            self.faults
                .get()
                .slow_snapshots
                .iter()
                .find(|(prefix, _)| vm.name.starts_with(prefix.as_str()))
                .map(|(_, ms)| Duration::from_millis(*ms))
        };
        let lock = SnapshotLock {
            inner: Arc::clone(self),
            id,
        };
        if let Some(stall) = stall {
            tokio::time::sleep(stall).await;
        }
        Some(lock)
    }

    /// k3s came up on server `id` (boot `generation`, unit run `run`): its snapshot cron
    /// starts, unless disabled or its spec does not parse.
    pub(super) fn start_snapshot_schedule(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        run: u64,
        k3s: &K3sConfig,
        started: Instant,
    ) {
        if k3s.etcd_disable_snapshots {
            return;
        }
        let spec = k3s
            .etcd_snapshot_cron
            .clone()
            .unwrap_or_else(|| DEFAULT_SNAPSHOT_CRON.to_owned());
        // robfig `AddJob` returns the parse error; k3s's `setSnapshotFunction` drops it.
        let Ok(schedule) = Schedule::parse(&spec) else {
            tracing::info!(instance = %id, %spec, "k3s drops an invalid etcd snapshot schedule");
            return;
        };
        let prefix = k3s
            .etcd_snapshot_name
            .clone()
            .unwrap_or_else(|| DEFAULT_SNAPSHOT_NAME.to_owned());
        let retention = k3s
            .etcd_snapshot_retention
            .unwrap_or(DEFAULT_SNAPSHOT_RETENTION);
        let inner = Arc::clone(self);
        self.runtime.spawn(async move {
            inner
                .snapshot_cron(
                    id,
                    (generation, run),
                    schedule,
                    (prefix, retention),
                    started,
                )
                .await;
        });
    }

    /// The cron loop: fire, run the job to its end (`SkipIfStillRunning`: ticks that pass
    /// meanwhile are skipped), fire at the next tick after that.
    async fn snapshot_cron(
        self: Arc<Self>,
        id: Uuid,
        (generation, run): (u64, u64),
        schedule: Schedule,
        (prefix, retention): (String, i64),
        started: Instant,
    ) {
        let mut next = schedule.next_after(Utc::now());
        loop {
            let Some(at) = next else { return };
            if !self.sleep_while_up(id, generation, run, until(at)).await {
                return;
            }
            let jitter = SNAPSHOT_JITTER_MAX.mul_f64(rand::random::<f64>());
            if !self.sleep_while_up(id, generation, run, jitter).await {
                return;
            }
            self.scheduled_snapshot(id, (generation, run), &prefix, retention, started)
                .await;
            let now = Utc::now();
            next = Some(at);
            while let Some(t) = next.filter(|t| *t <= now) {
                next = schedule.next_after(t);
            }
        }
    }

    /// Sleeps `d` in short steps; false as soon as this k3s run is over.
    async fn sleep_while_up(&self, id: Uuid, generation: u64, run: u64, d: Duration) -> bool {
        let end = tokio::time::Instant::now() + d;
        loop {
            if !self.unit_current(id, generation, run) {
                return false;
            }
            let now = tokio::time::Instant::now();
            if now >= end {
                return true;
            }
            tokio::time::sleep((end - now).min(STOP_CHECK)).await;
        }
    }

    /// One scheduled snapshot (k3s `Snapshot` from the cron job), then retention.
    async fn scheduled_snapshot(
        self: &Arc<Self>,
        id: Uuid,
        (generation, run): (u64, u64),
        prefix: &str,
        retention: i64,
        started: Instant,
    ) {
        let (api, member, node, joined) = {
            let st = self.state();
            let Some(vm) = st.vms.get(&id) else { return };
            (
                self.api_of(&st, id),
                vm.etcd_member.clone().filter(|_| vm.member),
                vm.node_name.clone().unwrap_or_else(|| vm.hostname.clone()),
                vm.k3s == K3sState::Joined,
            )
        };
        let (Some(api), Some((member, _)), true) = (api, member, joined) else {
            self.k3s_log(
                id,
                started,
                "error",
                "Failed to take scheduled snapshot: failed to check etcd status for snapshot: etcd is not running",
            );
            return;
        };
        let etcd = api.control_plane.etcd();
        let learner = etcd.members().await.ok().and_then(|ms| {
            ms.into_iter()
                .find(|m| m.name == member)
                .map(|m| m.is_learner)
        });
        // k3s stopped meanwhile: its process logs and writes nothing more.
        let up = || self.unit_current(id, generation, run);
        if !up() {
            return;
        }
        if learner == Some(true) {
            self.k3s_log(
                id,
                started,
                "warning",
                "Unable to take snapshot: not supported for learner",
            );
            return;
        }
        let Some(_lock) = self.try_snapshot_lock(id).await else {
            self.k3s_log(
                id,
                started,
                "error",
                &format!("Failed to take scheduled snapshot: {SNAPSHOT_BUSY}"),
            );
            return;
        };
        let name = snapshot_name(prefix, &node, Utc::now());
        let path = format!("{SNAPSHOT_DIR}/{name}");
        self.k3s_log(
            id,
            started,
            "info",
            &format!("Saving etcd snapshot to {path}"),
        );
        let taken = etcd.snapshot(&member).await;
        if !up() {
            return;
        }
        let saved = taken.and_then(|data| self.save_snapshot_file(id, &name, &data));
        if let Err(err) = saved {
            self.k3s_log(
                id,
                started,
                "error",
                &format!("Failed to take etcd snapshot: {err}"),
            );
            return;
        }
        self.snapshot_retention(id, prefix, retention, started);
    }

    /// etcd's `snapshot.Save` into k3s's snapshot directory on the VM's disk (created 0700
    /// when missing): the stream goes to `NAME.part` (0600), which is then renamed to NAME;
    /// a reader of the directory never sees a partial NAME. Also what `cat` over SSH reads.
    pub(super) fn save_snapshot_file(
        &self,
        id: Uuid,
        name: &str,
        data: &[u8],
    ) -> Result<(), String> {
        use std::io::Write as _;
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
        let dir = self
            .guest_dir(id, SNAPSHOT_DIR)
            .ok_or_else(|| "no upload directory".to_owned())?;
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| format!("failed to get etcd-snapshot-dir: {e}"))?;
        }
        let host = dir.join(name);
        let part = dir.join(format!("{name}.part"));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&part)
            .and_then(|mut f| f.write_all(data).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&part, &host));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&part);
            return Err(format!("could not write snapshot {}: {e}", part.display()));
        }
        let mut st = self.state();
        let vm = st.vms.get_mut(&id).ok_or_else(|| "no such VM".to_owned())?;
        vm.uploads.insert(format!("{SNAPSHOT_DIR}/{name}"), host);
        Ok(())
    }

    /// k3s `snapshotRetention`: keeps the newest `retention` files named `prefix…` in the
    /// snapshot directory, deletes the rest (from the disk and from what `cat` reads).
    fn snapshot_retention(&self, id: Uuid, prefix: &str, retention: i64, started: Instant) {
        let Ok(keep) = usize::try_from(retention) else {
            return;
        };
        if keep < 1 {
            return;
        }
        let Some(dir) = self.guest_dir(id, SNAPSHOT_DIR) else {
            return;
        };
        self.k3s_log(
            id,
            started,
            "info",
            &format!(
                "Applying snapshot retention={retention} to local snapshots with prefix {prefix} in {SNAPSHOT_DIR}"
            ),
        );
        for name in prune(&dir, prefix, keep) {
            let path = format!("{SNAPSHOT_DIR}/{name}");
            self.k3s_log(
                id,
                started,
                "info",
                &format!("Removing local snapshot {path}"),
            );
            if let Err(err) = std::fs::remove_file(dir.join(&name)) {
                self.k3s_log(
                    id,
                    started,
                    "warning",
                    &format!("Failed to apply local snapshot retention policy: {err}"),
                );
                return;
            }
            if let Some(vm) = self.state().vms.get_mut(&id) {
                vm.uploads.remove(&path);
            }
        }
    }

    /// The host directory mirroring guest directory `path` (absolute, no `..`) of VM `id`,
    /// whether or not it exists yet.
    pub(super) fn guest_dir(&self, id: Uuid, path: &str) -> Option<PathBuf> {
        let rel = path.trim_start_matches('/').trim_end_matches('/');
        if rel.split('/').any(|c| c == "..") {
            return None;
        }
        let dir = self.vm_upload_dir(id)?;
        Some(if rel.is_empty() { dir } else { dir.join(rel) })
    }
}

/// `<prefix>-<node name>-<unix seconds>`, the time rounded to the second (k3s
/// `time.Now().Round(time.Second)`).
pub(super) fn snapshot_name(prefix: &str, node: &str, now: DateTime<Utc>) -> String {
    let secs = now.timestamp() + i64::from(now.timestamp_subsec_millis() >= 500);
    format!("{prefix}-{node}-{secs}")
}

/// The names `snapshotRetention` removes: files of `dir` starting with `prefix`, newest first
/// by the number after their last `-` (an optional `.zip` cut; the file's mtime when it is
/// none), all past the first `keep`.
fn prune(dir: &Path, prefix: &str, keep: usize) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(i64, String)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !name.starts_with(prefix) {
                return None;
            }
            let base = name.strip_suffix(".zip").unwrap_or(&name);
            let ts = base
                .rsplit_once('-')
                .and_then(|(_, t)| t.parse::<i64>().ok())
                .or_else(|| {
                    let modified = e.metadata().ok()?.modified().ok()?;
                    Some(DateTime::<Utc>::from(modified).timestamp())
                })?;
            Some((ts, name))
        })
        .collect();
    if files.len() <= keep {
        return Vec::new();
    }
    // Newest first (Go's `sort.Slice` is not stable; ties are in no particular order there).
    files.sort_by(|a, b| b.cmp(a));
    files.split_off(keep).into_iter().map(|(_, n)| n).collect()
}

/// How long from now until `at` (zero when it has passed).
fn until(at: DateTime<Utc>) -> Duration {
    (at - Utc::now()).to_std().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_prefix_node_and_the_rounded_unix_second() {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            snapshot_name("etcd-snapshot", "c1-cp-a", t("2026-11-27T10:00:00.499Z")),
            format!(
                "etcd-snapshot-c1-cp-a-{}",
                t("2026-11-27T10:00:00Z").timestamp()
            )
        );
        assert_eq!(
            snapshot_name("etcd-snapshot", "c1-cp-a", t("2026-11-27T10:00:00.5Z")),
            format!(
                "etcd-snapshot-c1-cp-a-{}",
                t("2026-11-27T10:00:01Z").timestamp()
            )
        );
    }

    #[test]
    fn retention_removes_the_oldest_files_of_the_prefix_only() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "etcd-snapshot-n1-100",
            "etcd-snapshot-n1-300",
            "etcd-snapshot-n1-200",
            "etcd-snapshot-n1-50.zip",
            "on-demand-n1-10",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        std::fs::create_dir(dir.path().join("etcd-snapshot-dir-1")).unwrap();
        let mut pruned = prune(dir.path(), "etcd-snapshot", 2);
        pruned.sort();
        assert_eq!(pruned, ["etcd-snapshot-n1-100", "etcd-snapshot-n1-50.zip"]);
        assert!(prune(dir.path(), "etcd-snapshot", 4).is_empty());
    }
}
