//! k3s's documented cluster-reset procedure, run by hand over SSH on a server: `systemctl
//! stop k3s`, `k3s server --cluster-reset`, `systemctl start k3s` (each rule cited in
//! `tests/FIDELITY.md`, "k3s cluster reset").
//!
//! - Stopping the unit ends its k3s: the server's etcd member stops (its data stays), its API
//!   listeners close and its kubelet stops reporting.
//! - `--cluster-reset` with the unit stopped runs the member once with etcd's
//!   `--force-new-cluster`, so it is a one-member cluster with all its data; writes the
//!   reset-flag; prints k3s's closing line; exits 0. With the flag already there it refuses
//!   (a second reset must delete the flag first). A normal start removes the flag.
//! - Starting the unit runs k3s as a boot does, and `systemctl start` returns once it is up
//!   (`Type=notify`) or fails when k3s exits first.

use std::sync::Arc;
use uuid::Uuid;

use super::lifecycle::{K3sEnd, Start};
use super::{Inner, K3sState};

/// `${datadir}/server/db/reset-flag` with k3s's default data dir.
pub const RESET_FLAG_PATH: &str = "/var/lib/rancher/k3s/server/db/reset-flag";

/// k3s's server data dir (`${datadir}/server` with the default data dir).
pub const SERVER_DATA_DIR: &str = "/var/lib/rancher/k3s/server";

pub use super::paths::SNAPSHOT_DIR;

/// k3s's line once the reset member runs alone (`pkg/etcd` `Reset`).
pub const RESET_DONE: &str = "Etcd is running, restart without --cluster-reset flag now. Backup and delete ${datadir}/server/db on each peer etcd server and rejoin the nodes";

/// What a command run over SSH ended with: exit status, stdout, stderr.
pub type Ran = (u32, String, String);

impl Inner {
    /// The run number a k3s unit task started now carries.
    pub(super) fn k3s_unit_run(&self, id: Uuid) -> u64 {
        self.state().vms.get(&id).map_or(0, |v| v.k3s_unit)
    }

    /// The boot is current and the unit was neither stopped nor started again since `run`.
    pub(super) fn unit_current(&self, id: Uuid, generation: u64, run: u64) -> bool {
        self.current(id, generation) && self.state().vms.get(&id).is_some_and(|v| v.k3s_unit == run)
    }

    /// `systemctl stop k3s`.
    pub(super) fn k3s_service_stop(self: &Arc<Self>, id: Uuid, generation: u64) -> Ran {
        let (node, kube) = {
            let mut st = self.state();
            let kube = self.api_of(&st, id);
            let Some(vm) = st
                .vms
                .get_mut(&id)
                .filter(|v| v.generation == generation && v.running)
            else {
                return (1, String::new(), "Connection closed\n".into());
            };
            if !vm.k3s_enabled {
                return (5, String::new(), UNIT_NOT_LOADED.into());
            }
            vm.k3s_unit += 1;
            vm.k3s = K3sState::Off;
            let node = vm.node_name.clone();
            self.etcd_stop(&st, id);
            (node, kube)
        };
        self.sync_listeners(id);
        if let (Some(node), Some(real)) = (node, kube) {
            self.runtime.spawn(async move {
                if let Err(err) =
                    super::cluster_api::silence_real_node(&real.control_plane, &node).await
                {
                    tracing::warn!(%node, error = %err, "cannot stop the node's heartbeats");
                }
            });
        }
        (0, String::new(), String::new())
    }

    /// `systemctl start k3s`: a no-op when the unit runs; else k3s starts as on a boot and
    /// this returns when it is up or has failed.
    pub(super) async fn k3s_service_start(self: &Arc<Self>, id: Uuid, generation: u64) -> Ran {
        let (ud, name, started) = {
            let mut st = self.state();
            let Some(vm) = st
                .vms
                .get_mut(&id)
                .filter(|v| v.generation == generation && v.running)
            else {
                return (1, String::new(), "Connection closed\n".into());
            };
            let Some(ud) = vm.user_data.clone().filter(|_| vm.k3s_enabled) else {
                return (5, String::new(), UNIT_NOT_FOUND.into());
            };
            if vm.k3s != K3sState::Off {
                return (0, String::new(), String::new());
            }
            vm.k3s_unit += 1;
            vm.k3s = K3sState::Waiting;
            (ud, vm.name.clone(), vm.boot_started)
        };
        match self
            .run_k3s(id, generation, &ud, &name, started, Start::Boot)
            .await
        {
            K3sEnd::Up => (0, String::new(), String::new()),
            K3sEnd::Failed | K3sEnd::TimedOut(_) | K3sEnd::Hangs => (
                1,
                String::new(),
                "Job for k3s.service failed because the control process exited with error code.\nSee \"systemctl status k3s.service\" and \"journalctl -xeu k3s.service\" for details.\n".into(),
            ),
        }
    }

    /// `k3s server --cluster-reset` (k3s's log goes to stderr).
    pub(super) async fn k3s_cluster_reset(self: &Arc<Self>, id: Uuid, generation: u64) -> Ran {
        let (api, member, state, flag, now) = {
            let st = self.state();
            let Some(vm) = st
                .vms
                .get(&id)
                .filter(|v| v.generation == generation && v.running)
            else {
                return (1, String::new(), "Connection closed\n".into());
            };
            (
                self.api_of(&st, id),
                vm.etcd_member.clone().filter(|_| vm.member),
                vm.k3s,
                vm.reset_flag,
                vm.boot_started,
            )
        };
        let fatal = |msg: String| (1, String::new(), log_line("fatal", &msg));
        let (Some(api), Some((member, _))) = (api, member) else {
            return fatal("no etcd datastore on this server to reset".into());
        };
        if flag {
            return fatal(format!(
                "Managed etcd cluster membership was previously reset, please remove the cluster-reset flag and start k3s normally. If you need to perform another cluster reset, you must first manually delete the {RESET_FLAG_PATH} file"
            ));
        }
        if state != K3sState::Off {
            // The unit's k3s holds etcd's ports.
            return fatal(format!(
                "starting etcd: listen tcp: bind: address already in use (k3s is running: {state:?})"
            ));
        }
        let etcd = api.control_plane.etcd();
        if let Err(err) = etcd.force_new_cluster(&member).await {
            return fatal(format!("etcd cluster reset failed: {err}"));
        }
        if let Some(vm) = self.state().vms.get_mut(&id) {
            vm.reset_flag = true;
        }
        self.k3s_log(id, now, "info", RESET_DONE);
        (0, String::new(), log_line("info", RESET_DONE))
    }

    /// `k3s etcd-snapshot save`: the CLI asks the running server (`POST /db/snapshot` on its
    /// supervisor port) for an on-demand snapshot of the server's own etcd member, taken with
    /// etcd's snapshot API and written to
    /// `${datadir}/server/db/snapshots/on-demand-<node name>-<unix seconds>` on the VM's disk.
    /// The server logs "Saving etcd snapshot to PATH" (the console here); the CLI prints
    /// "Snapshot NAME saved." on stderr.
    pub(super) async fn k3s_etcd_snapshot_save(self: &Arc<Self>, id: Uuid, generation: u64) -> Ran {
        let (api, member, state, node, started) = {
            let st = self.state();
            let Some(vm) = st
                .vms
                .get(&id)
                .filter(|v| v.generation == generation && v.running)
            else {
                return (1, String::new(), "Connection closed\n".into());
            };
            (
                self.api_of(&st, id),
                vm.etcd_member.clone().filter(|_| vm.member),
                vm.k3s,
                vm.node_name.clone().unwrap_or_else(|| vm.hostname.clone()),
                vm.boot_started,
            )
        };
        let fatal = |msg: String| (1, String::new(), log_line("fatal", &msg));
        if state != K3sState::Joined {
            // Nothing serves the supervisor port the CLI posts to.
            return fatal(
                "Get \"https://127.0.0.1:6443/cacerts\": dial tcp 127.0.0.1:6443: connect: connection refused".into(),
            );
        }
        let (Some(api), Some((member, _))) = (api, member) else {
            return fatal(format!(
                "see server log for details: etcd database not found in {SERVER_DATA_DIR}"
            ));
        };
        let etcd = api.control_plane.etcd();
        let learner = etcd.members().await.ok().and_then(|ms| {
            ms.into_iter()
                .find(|m| m.name == member)
                .map(|m| m.is_learner)
        });
        if learner == Some(true) {
            // The server logs a warning and takes no snapshot; the CLI lists nothing created.
            self.k3s_log(
                id,
                started,
                "warning",
                "Unable to take snapshot: not supported for learner",
            );
            return (0, String::new(), String::new());
        }
        let Some(_lock) = self.try_snapshot_lock(id).await else {
            return fatal(format!(
                "see server log for details: {}",
                super::etcd_schedule::SNAPSHOT_BUSY
            ));
        };
        let name = super::etcd_schedule::snapshot_name("on-demand", &node, chrono::Utc::now());
        let path = format!("{SNAPSHOT_DIR}/{name}");
        self.k3s_log(
            id,
            started,
            "info",
            &format!("Saving etcd snapshot to {path}"),
        );
        let data = match etcd.snapshot(&member).await {
            Ok(data) => data,
            Err(err) => {
                return fatal(format!(
                    "see server log for details: failed to save snapshot: {err}"
                ));
            }
        };
        if let Err(err) = self.save_snapshot_file(id, &name, &data) {
            return fatal(format!("see server log for details: {path}: {err}"));
        }
        (
            0,
            String::new(),
            log_line("info", &format!("Snapshot {name} saved.")),
        )
    }

    /// Whether the reset-flag is on the VM's disk (what `cat` of [`RESET_FLAG_PATH`] sees).
    pub(super) fn has_reset_flag(&self, id: Uuid) -> bool {
        self.state().vms.get(&id).is_some_and(|v| v.reset_flag)
    }
}

const UNIT_NOT_LOADED: &str = "Failed to stop k3s.service: Unit k3s.service not loaded.\n";
const UNIT_NOT_FOUND: &str = "Failed to start k3s.service: Unit k3s.service not found.\n";

fn log_line(level: &str, msg: &str) -> String {
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ");
    format!("time=\"{now}\" level={level} msg=\"{msg}\"\n")
}
