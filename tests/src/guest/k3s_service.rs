//! k3s's documented cluster-reset procedure, run by hand over SSH on a server: `systemctl
//! stop k3s`, `k3s server --cluster-reset`, `systemctl start k3s` (each rule cited in
//! `tests/FIDELITY.md`, "k3s cluster reset").
//!
//! - Stopping the unit ends its k3s: the server's etcd member stops (its data stays), its API
//!   listeners close and its kubelet stops reporting.
//! - `--cluster-reset` is refused while the merged k3s config (config.yaml and its drop-ins
//!   as they are on the disk now) has `server`. Otherwise, with the unit stopped, k3s writes
//!   the reset-flag, then runs the member once with etcd's `--force-new-cluster`, so it is a
//!   one-member cluster with all its data; prints k3s's closing line; exits 0. When that
//!   forced start fails (the `cluster_reset_fails` fault) the flag stays. With the flag
//!   already there it refuses (a second reset must delete the flag first). A normal start
//!   removes the flag.
//! - `sed -i '/^server:/d' config.yaml` deletes the file's top-level `server:` lines (GNU
//!   sed's in-place edit: the same file, the other lines untouched); `rm -f` of the
//!   reset-flag deletes it.
//! - Starting the unit runs k3s as a boot does, and `systemctl start` returns once it is up
//!   (`Type=notify`) or fails when k3s exits first.

use std::sync::Arc;
use uuid::Uuid;

use super::k3s_config::{K3S_CONFIG_DROPIN_DIR, K3S_CONFIG_PATH, K3sConfig, merge_k3s_config};
use super::lifecycle::{K3sEnd, Start};
use super::{Inner, K3sState};

/// `${datadir}/server/db/reset-flag` with k3s's default data dir.
pub const RESET_FLAG_PATH: &str = "/var/lib/rancher/k3s/server/db/reset-flag";

/// k3s's server data dir (`${datadir}/server` with the default data dir).
pub const SERVER_DATA_DIR: &str = "/var/lib/rancher/k3s/server";

pub use super::paths::SNAPSHOT_DIR;

/// k3s's line once the reset member runs alone (`pkg/etcd` `Reset`).
pub const RESET_DONE: &str = "Managed etcd cluster membership has been reset, restart without --cluster-reset flag now. Backup and delete ${datadir}/server/db on each peer etcd server and rejoin the nodes";

/// k3s's refusal of `--cluster-reset` while its configuration has `server` (`pkg/cli/server`
/// `run`).
pub const RESET_WITH_SERVER_URL: &str = "cannot perform cluster-reset while server URL is set - remove server from configuration before resetting";

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
        let (api, member, state, flag, now, name) = {
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
                vm.name.clone(),
            )
        };
        let fatal = |msg: String| (1, String::new(), log_line("fatal", &msg));
        // The CLI's own check, before anything of the datastore is looked at.
        match self.k3s_config_on_disk(id) {
            Ok(cfg) if cfg.server.is_some() => return fatal(RESET_WITH_SERVER_URL.into()),
            Ok(_) => {}
            Err(why) => return fatal(why),
        }
        let (Some(api), Some((member, _))) = (api, member) else {
            return fatal("no etcd datastore on this server to reset".into());
        };
        if flag {
            return fatal(format!(
                "Managed etcd cluster membership was previously reset, please remove the cluster-reset flag and start k3s normally. If you need to perform another cluster reset, you must first manually delete the file at {RESET_FLAG_PATH}"
            ));
        }
        if state != K3sState::Off {
            // The unit's k3s holds etcd's ports.
            return fatal(format!(
                "starting etcd: listen tcp: bind: address already in use (k3s is running: {state:?})"
            ));
        }
        // "touch a file to avoid multiple resets", then etcd starts with ForceNewCluster: a
        // start that fails leaves the flag.
        if let Some(vm) = self.state().vms.get_mut(&id) {
            vm.reset_flag = true;
        }
        if Self::name_matches(&self.faults.get().cluster_reset_fails, &name) {
            return fatal(
                "etcd cluster reset failed: etcdserver: found data inconsistency with peers (fault cluster_reset_fails)".into(),
            );
        }
        let etcd = api.control_plane.etcd();
        if let Err(err) = etcd.force_new_cluster(&member).await {
            return fatal(format!("etcd cluster reset failed: {err}"));
        }
        self.k3s_log(id, now, "info", RESET_DONE);
        (0, String::new(), log_line("info", RESET_DONE))
    }

    /// The k3s configuration as k3s reads it now: `config.yaml`, then each `*.yaml`/`*.yml`
    /// drop-in in `config.yaml.d` in name order, each as the disk holds it (what cloud-init
    /// wrote, or what was written over SSH since).
    pub(super) fn k3s_config_on_disk(&self, id: Uuid) -> Result<K3sConfig, String> {
        let files = self.k3s_config_files(id);
        let mut cfg = K3sConfig::default();
        for (_, content) in files {
            merge_k3s_config(&mut cfg, &content).map_err(|e| e.to_string())?;
        }
        Ok(cfg)
    }

    /// `config.yaml` first, then the drop-ins by name, with their contents now.
    fn k3s_config_files(&self, id: Uuid) -> Vec<(String, Vec<u8>)> {
        let (written, uploads) = {
            let st = self.state();
            let Some(vm) = st.vms.get(&id) else {
                return Vec::new();
            };
            (
                vm.user_data
                    .as_ref()
                    .map(|u| u.files.clone())
                    .unwrap_or_default(),
                vm.uploads.clone(),
            )
        };
        let is_dropin = |path: &str| {
            path.strip_prefix(K3S_CONFIG_DROPIN_DIR)
                .is_some_and(|f| !f.contains('/') && (f.ends_with(".yaml") || f.ends_with(".yml")))
        };
        let dropins: std::collections::BTreeSet<&String> = written
            .keys()
            .chain(uploads.keys())
            .filter(|p| is_dropin(p))
            .collect();
        let config = K3S_CONFIG_PATH.to_owned();
        let mut out = Vec::new();
        for path in std::iter::once(&config).chain(dropins) {
            let content = match uploads.get(path) {
                Some(host) => std::fs::read(host).ok(),
                None => written.get(path).cloned(),
            };
            if let Some(content) = content {
                out.push((path.clone(), content));
            }
        }
        out
    }

    /// `sed -i '/^server:/d' /etc/rancher/k3s/config.yaml`: the lines starting `server:`
    /// deleted in place (mode kept). Exit 2 with sed's text when the file is not there.
    pub(super) fn k3s_config_drop_server(&self, id: Uuid, generation: u64) -> Ran {
        if !self.current(id, generation) {
            return (1, String::new(), "Connection closed\n".into());
        }
        let Some((_, content)) = self
            .k3s_config_files(id)
            .into_iter()
            .find(|(p, _)| p == K3S_CONFIG_PATH)
        else {
            return (
                2,
                String::new(),
                format!("sed: can't read {K3S_CONFIG_PATH}: No such file or directory\n"),
            );
        };
        let text = String::from_utf8_lossy(&content);
        let kept: String = text
            .split_inclusive('\n')
            .filter(|line| !line.starts_with("server:"))
            .collect();
        // GNU sed -i writes a new file with the old one's mode; cloud-init wrote it 0600.
        let mode = self
            .state()
            .vms
            .get(&id)
            .and_then(|vm| vm.uploads.get(K3S_CONFIG_PATH).cloned())
            .and_then(|host| std::fs::metadata(host).ok())
            .map_or(0o600, |m| {
                use std::os::unix::fs::PermissionsExt as _;
                m.permissions().mode() & 0o7777
            });
        match self.put_vm_file(id, K3S_CONFIG_PATH, kept.as_bytes(), Some(mode)) {
            Ok(()) => (0, String::new(), String::new()),
            Err(err) => (
                4,
                String::new(),
                format!("sed: couldn't open temporary file: {err}\n"),
            ),
        }
    }

    /// `curl` of the local etcd member's own member list (etcd's gateway on k3s's
    /// client-HTTP port 2382, serializable): the member's answer, or curl's connection
    /// refusal (exit 7) when k3s's etcd does not run here.
    pub(super) async fn etcd_local_member_list(self: &Arc<Self>, id: Uuid, generation: u64) -> Ran {
        let (api, member) = {
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
            )
        };
        let refused = (
            7,
            String::new(),
            "curl: (7) Failed to connect to 127.0.0.1 port 2382 after 0 ms: Couldn't connect to server\n".to_owned(),
        );
        let (Some(api), Some((member, _))) = (api, member) else {
            return refused;
        };
        match api.control_plane.etcd().local_member_list(&member).await {
            Ok(body) => (0, body, String::new()),
            Err(_) => refused,
        }
    }

    /// `rm -f` of the reset-flag: gone (or never there), exit 0.
    pub(super) fn k3s_remove_reset_flag(&self, id: Uuid, generation: u64) -> Ran {
        let mut st = self.state();
        let Some(vm) = st
            .vms
            .get_mut(&id)
            .filter(|v| v.generation == generation && v.running)
        else {
            return (1, String::new(), "Connection closed\n".into());
        };
        vm.reset_flag = false;
        (0, String::new(), String::new())
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

    /// `k3s etcd-snapshot delete NAME`: the CLI asks the running server (`POST /db/snapshot`,
    /// operation `delete`), which removes `NAME` from its snapshot directory, logging
    /// "Snapshot NAME deleted locally", or "Snapshot NAME not found locally" when there is no
    /// such file, or "Failed to delete local snapshot NAME: ERR". The CLI exits 0 in every
    /// case: it prints "Snapshot NAME deleted." for a removed file and warns "Snapshot NAME
    /// not found." for any other. Without a running k3s it fails as `save` does.
    pub(super) fn k3s_etcd_snapshot_delete(&self, id: Uuid, generation: u64, name: &str) -> Ran {
        let (state, started) = {
            let st = self.state();
            let Some(vm) = st
                .vms
                .get(&id)
                .filter(|v| v.generation == generation && v.running)
            else {
                return (1, String::new(), "Connection closed\n".into());
            };
            (vm.k3s, vm.boot_started)
        };
        if state != K3sState::Joined {
            return (
                1,
                String::new(),
                log_line(
                    "fatal",
                    "Get \"https://127.0.0.1:6443/cacerts\": dial tcp 127.0.0.1:6443: connect: connection refused",
                ),
            );
        }
        let path = format!("{SNAPSHOT_DIR}/{name}");
        let removed = match self.guest_dir(id, SNAPSHOT_DIR) {
            Some(dir) => std::fs::remove_file(dir.join(name)),
            None => Err(std::io::ErrorKind::NotFound.into()),
        };
        match removed {
            Ok(()) => {
                if let Some(vm) = self.state().vms.get_mut(&id) {
                    vm.uploads.remove(&path);
                }
                self.k3s_log(
                    id,
                    started,
                    "info",
                    &format!("Snapshot {name} deleted locally"),
                );
                (
                    0,
                    String::new(),
                    log_line("info", &format!("Snapshot {name} deleted.")),
                )
            }
            Err(err) => {
                let said = if err.kind() == std::io::ErrorKind::NotFound {
                    ("info", format!("Snapshot {name} not found locally"))
                } else {
                    (
                        "error",
                        format!("Failed to delete local snapshot {name}: remove {path}: {err}"),
                    )
                };
                self.k3s_log(id, started, said.0, &said.1);
                (
                    0,
                    String::new(),
                    log_line("warning", &format!("Snapshot {name} not found.")),
                )
            }
        }
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
