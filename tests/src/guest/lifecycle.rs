//! The VM lifecycle glue: the rack's events (running, halted, deleted, floating IP moved)
//! and the boot sequence that strings cloud-init, sshd, the setup steps and k3s together.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

use super::cloud_init::{UserData, parse_user_data};
use super::k3s::Decision;
use super::k3s_config::{K3S_CONFIG_PATH, K3sConfig, Role};
use super::setup_script::{SetupStep, UpEnd};
use super::{Boot, Inner, K3sState, Vm};
use super::{console, kubelet, setup_script};
use crate::guest::sshd::SshHost;
use crate::oxide::{RackEvents, RunningInstance};

/// How the k3s unit was started, which decides how long its starter waits.
#[derive(Clone, Copy, Debug)]
pub(super) enum Start {
    /// install.sh's `systemctl restart` or `systemctl enable --now`: waits on the start job,
    /// which fails the first time k3s exits before it is Ready (`Type=notify`).
    Job,
    /// The product's `start_k3s`: the job is not waited on; `is-active` is polled for at most
    /// this long, while systemd restarts k3s.
    Poll(std::time::Duration),
    /// A later boot: systemd starts the enabled unit; multi-user.target waits on its job.
    Boot,
}

/// How a wait for k3s ended.
pub(super) enum K3sEnd {
    /// Active (Ready).
    Up,
    /// The start job failed (k3s exited before Ready).
    Failed,
    /// `start_k3s` gave up waiting, with the last error k3s logged.
    TimedOut(Option<String>),
    /// Never returns: k3s keeps retrying (or the boot went stale).
    Hangs,
}

/// The step that starts k3s and how it waits: `start_k3s` in a `k3s-start` step, else the
/// installer (`k3s-install`) or `systemctl enable --now` (`k3s-start`) on the start job.
fn start_of(ud: &UserData) -> (&'static str, Start) {
    let mut out = ("k3s-install", Start::Job);
    for (step, _) in &ud.setup {
        match step {
            SetupStep::K3sInstall { starts: true, .. } => out = ("k3s-install", Start::Job),
            SetupStep::K3sStart {
                wait: Some(wait), ..
            } => out = ("k3s-start", Start::Poll(*wait)),
            SetupStep::K3sStart { wait: None, .. } => out = ("k3s-start", Start::Job),
            _ => {}
        }
    }
    out
}

/// Why the setup script did not get to its end.
enum SetupEnd {
    /// A step failed: the script's EXIT trap prints `node-setup failed: STEP: REASON`.
    Failed(&'static str, String),
    /// A step never returns (a `tailscale up` without `--timeout` that waits).
    Hangs,
}

/// How runcmd ended for this boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runcmd {
    /// Every step returned (successfully or not): cloud-final goes on.
    Finished,
    /// The boot is stale, or a step hangs: cloud-final never gets further.
    Abandoned,
}

impl Inner {
    async fn run_boot(self: Arc<Self>, id: Uuid, generation: u64, user_data: Vec<u8>) {
        let (started, name, hostname, host, decoy, first) = {
            let mut st = self.state();
            let Some(vm) = st.vms.get_mut(&id) else {
                return;
            };
            (
                vm.boot_started,
                vm.name.clone(),
                vm.hostname.clone(),
                vm.ssh_host.clone(),
                vm.decoy_host.clone(),
                // The per-instance semaphores: only the first boot runs write_files and runcmd.
                !std::mem::replace(&mut vm.instance_booted, true),
            )
        };
        // Kernel and systemd output: far more than propolis's default 16 KiB read.
        self.console(id, &console::boot_noise());
        self.log(
            id,
            started,
            &format!(
                "cloud-init[721]: Cloud-init v. 24.4.1 running 'init' at {}. Up 3.12 seconds.",
                chrono::Utc::now().to_rfc2822()
            ),
        );

        let parsed = parse_user_data(&user_data);
        let user_data = match parsed {
            Ok(ud) => Some(Arc::new(ud)),
            Err(err) => {
                self.log(id, started, &format!("cloud-init[721]: {err}"));
                tracing::info!(instance = %name, reason = %err, "user-data refused");
                None
            }
        };
        // The key the console shows: the real one, or a decoy under the fault.
        let wrong_key = Self::name_matches(&self.faults.get().wrong_console_host_key, &name);
        let printed = if wrong_key {
            decoy.unwrap_or(host)
        } else {
            host
        };
        // Init stage: bootcmd on every boot, before write_files — so on the first boot the
        // per-boot script it runs is not there yet (cloud-init@04eacd0
        // `cloudinit/config/cc_bootcmd.py:22` PER_ALWAYS, `config/cloud.cfg.tmpl:112-113`).
        if !first
            && let Some(ud) = &user_data
            && super::cloud_init::bootcmd_runs_per_boot(ud)
        {
            self.per_boot_script(id, ud, &printed, &hostname);
        }
        if first && let Some(ud) = &user_data {
            for path in ud.files.keys() {
                self.log(
                    id,
                    started,
                    &format!("cloud-init[812]: write_files: wrote {path}"),
                );
            }
        }
        {
            let mut st = self.state();
            let Some(vm) = st.vms.get_mut(&id).filter(|v| v.generation == generation) else {
                return;
            };
            vm.user_data = user_data.clone();
            vm.sshd_up = true;
        }
        self.sync_listeners(id);
        if !self.current(id, generation) {
            return;
        }
        if !first {
            // A later boot: no runcmd. tailscaled and an enabled k3s start from their units;
            // cloud-final comes after multi-user.target, which waits for k3s (`Type=notify`,
            // `TimeoutStartSec=0`): a k3s that never gets Ready keeps it from ever running.
            self.reconnect_tailnet(id, generation, started);
            if let Some(ud) = &user_data
                && self.k3s_enabled(id)
                && matches!(
                    self.run_k3s(id, generation, ud, &name, started, Start::Boot)
                        .await,
                    K3sEnd::Hangs
                )
            {
                return;
            }
            if !self.current(id, generation) {
                return;
            }
            if let Some(ud) = &user_data {
                self.per_boot_script(id, ud, &printed, &hostname);
            }
            self.cloud_final_finished(id, started);
            return;
        }
        // cloud-final: scripts_per_boot runs before scripts_user (runcmd).
        if let Some(ud) = &user_data {
            self.per_boot_script(id, ud, &printed, &hostname);
        }
        let finished = self
            .run_runcmd(id, generation, user_data, &name, &hostname, started)
            .await;
        if finished == Runcmd::Abandoned || !self.current(id, generation) {
            return;
        }
        // keys_to_console runs after scripts_user, once per instance (its frequency); the
        // instance ID never changes, so a restarted VM never prints this block again.
        let first_keys = {
            let mut st = self.state();
            match st.vms.get_mut(&id).filter(|v| v.generation == generation) {
                Some(vm) => !std::mem::replace(&mut vm.keys_printed, true),
                None => return,
            }
        };
        if first_keys {
            self.console(
                id,
                &console::fingerprint_block(&printed, &hostname, "cloud-init"),
            );
        }
        self.cloud_final_finished(id, started);
    }

    fn cloud_final_finished(&self, id: Uuid, started: Instant) {
        self.log(
            id,
            started,
            &format!(
                "cloud-init[901]: Cloud-init v. 24.4.1 finished at {}. Up 6.40 seconds",
                chrono::Utc::now().to_rfc2822()
            ),
        );
    }

    /// What the user-data's per-boot script prints: the host key fingerprints, and the
    /// failure marker for a setup an earlier boot left unfinished while k3s was never
    /// enabled (the script's own check; the stub-execution test runs it for real).
    fn per_boot_script(&self, id: Uuid, ud: &UserData, printed: &SshHost, hostname: &str) {
        if let Some(tag) = setup_script::per_boot_host_key_tag(&ud.files) {
            self.console(id, &console::fingerprint_block(printed, hostname, tag));
        }
        let Some(check) = setup_script::per_boot_setup_check(&ud.files) else {
            return;
        };
        let unfinished = {
            let st = self.state();
            st.vms.get(&id).and_then(|vm| {
                let enabled = vm.k3s_enabled
                    && matches!(
                        (
                            vm.user_data.as_ref().and_then(|u| u.role),
                            check.unit.as_str()
                        ),
                        (Some(Role::Server), "k3s") | (Some(Role::Agent), "k3s-agent")
                    );
                vm.setup_state
                    .clone()
                    .filter(|step| step != "done" && !enabled)
            })
        };
        if let Some(step) = unfinished {
            self.console(id, &setup_script::failure_marker(&step, &check.reason));
        }
    }

    fn k3s_enabled(&self, id: Uuid) -> bool {
        self.state().vms.get(&id).is_some_and(|vm| vm.k3s_enabled)
    }

    /// A later boot of a VM that joined the tailnet: tailscaled reconnects from its state.
    fn reconnect_tailnet(self: &Arc<Self>, id: Uuid, generation: u64, started: Instant) {
        let Some(ip) = self.tailnet.get().and_then(|t| t.reconnect(id)) else {
            return;
        };
        {
            let mut st = self.state();
            let Some(vm) = st.vms.get_mut(&id).filter(|v| v.generation == generation) else {
                return;
            };
            vm.tailnet_ip = Some(IpAddr::V4(ip));
        }
        self.log(
            id,
            started,
            &format!(
                "tailscaled[1240]: Switching ipn state Starting -> Running; tailnet address {ip}"
            ),
        );
        self.sync_listeners(id);
    }

    /// cloud-init's `scripts_user` (runcmd) and what it starts: the Tailscale join and the
    /// k3s install step, which returns once k3s is up (the unit is `Type=notify`) or failed.
    /// A k3s that keeps retrying keeps runcmd (and so cloud-final) from ever finishing.
    async fn run_runcmd(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        user_data: Option<Arc<UserData>>,
        name: &str,
        hostname: &str,
        started: Instant,
    ) -> Runcmd {
        let Some(ud) = user_data else {
            return Runcmd::Finished;
        };
        match self
            .run_setup_steps(id, generation, &ud, name, hostname, started)
            .await
        {
            Ok(()) => {}
            Err(SetupEnd::Failed(step, reason)) => {
                // The script's `set -e`/`fail`: one marker line, and k3s never starts.
                self.console(id, &setup_script::failure_marker(step, &reason));
                tracing::info!(instance = %name, step, reason = %reason, "node setup failed");
                return Runcmd::Finished;
            }
            Err(SetupEnd::Hangs) => return Runcmd::Abandoned,
        }
        let (step, start) = start_of(&ud);
        match self
            .run_k3s(id, generation, &ud, name, started, start)
            .await
        {
            K3sEnd::Up => {
                for (step, _) in &ud.setup {
                    let SetupStep::DrillReport { wait, kinds } = step else {
                        continue;
                    };
                    self.record_setup_state(id, &ud, step.name());
                    self.console(
                        id,
                        &format!("oxide-controller: node-setup: {}\n", step.name()),
                    );
                    match self.drill_report(id, *wait, kinds).await {
                        Ok(n) => self.console(
                            id,
                            &format!("oxide-controller: drill: restored objects={n}\n"),
                        ),
                        Err(reason) => {
                            self.console(id, &setup_script::failure_marker(step.name(), &reason));
                            return Runcmd::Finished;
                        }
                    }
                }
                // The script's last line records the setup done.
                self.record_setup_state(id, &ud, "done");
                Runcmd::Finished
            }
            K3sEnd::Hangs => Runcmd::Abandoned,
            // `set -e` ends the script where the start job failed.
            K3sEnd::Failed => {
                self.console(id, &setup_script::failure_marker(step, "exit status 1"));
                Runcmd::Finished
            }
            // `start_k3s`'s `fail`, with the last error k3s logged.
            K3sEnd::TimedOut(why) => {
                let (unit, secs) = match start {
                    Start::Poll(wait) => (ud.role.map_or("k3s", Role::unit), wait.as_secs()),
                    Start::Job | Start::Boot => ("k3s", 0),
                };
                let why = why.unwrap_or_else(|| "it logged no error".to_owned());
                self.console(
                    id,
                    &setup_script::failure_marker(
                        step,
                        &format!("{unit} is not up after {secs} s: {why}"),
                    ),
                );
                Runcmd::Finished
            }
        }
    }

    /// k3s starting, and the caller waiting for it as `start` says: from the setup on the
    /// first boot (`Job`: install.sh's `systemctl restart` or `enable --now`; `Poll`: the
    /// product's `start_k3s`), from its enabled unit on later boots (`Boot`). The unit itself
    /// runs on in [`Inner::k3s_unit`] whatever the caller concludes, as systemd's does.
    pub(super) async fn run_k3s(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        ud: &UserData,
        name: &str,
        started: Instant,
        start: Start,
    ) -> K3sEnd {
        let Some(role) = ud.role else {
            return K3sEnd::Up;
        };
        let Some(mut k3s) = ud.k3s.clone() else {
            // k3s without a config file: a fresh server would create its own cluster with a
            // random token, an agent would have no server. Model what the product renders.
            let msg = format!(
                "oxide-sim: cloud-init wrote no {K3S_CONFIG_PATH}; k3s has no configuration"
            );
            self.k3s_log(id, started, "fatal", &msg);
            self.set_k3s(id, generation, K3sState::Refused);
            return K3sEnd::Failed;
        };
        if let Some(prefix) = &ud.smbios_provider_id_prefix {
            k3s.kubelet_arg.push(format!("provider-id={prefix}{id}"));
        }

        tokio::time::sleep(self.cfg.k3s_boot).await;
        if !self.current(id, generation) {
            return K3sEnd::Hangs;
        }
        let version = ud
            .install_version
            .clone()
            .unwrap_or_else(|| self.cfg.k3s_version.clone());
        let unit = role.unit();
        match start {
            Start::Job | Start::Poll(_) => {
                self.log(
                    id,
                    started,
                    &format!("cloud-init[1187]: [INFO]  Using {version} as release"),
                );
                self.log(
                    id,
                    started,
                    &format!("cloud-init[1187]: [INFO]  systemd: Starting {unit}"),
                );
            }
            Start::Boot => self.log(id, started, &format!("systemd[1]: Starting {unit}.service")),
        }
        // Enabled before it is started (install.sh `systemd_enable`, `start_k3s`).
        if let Some(vm) = self
            .state()
            .vms
            .get_mut(&id)
            .filter(|v| v.generation == generation)
        {
            vm.k3s_enabled = true;
            vm.k3s_exits = 0;
            vm.k3s_last_error = None;
        }
        let run = self.k3s_unit_run(id);
        self.runtime.spawn(self.clone().k3s_unit(
            id,
            generation,
            run,
            role,
            k3s,
            version,
            name.to_owned(),
            started,
        ));
        let deadline = match start {
            Start::Poll(wait) => Some(tokio::time::Instant::now() + wait),
            Start::Job | Start::Boot => None,
        };
        let tick = (self.cfg.join_retry / 4).max(std::time::Duration::from_millis(10));
        loop {
            if !self.current(id, generation) {
                return K3sEnd::Hangs;
            }
            let (joined, exits, last) = {
                let st = self.state();
                match st.vms.get(&id) {
                    Some(vm) => (
                        vm.k3s == K3sState::Joined,
                        vm.k3s_exits,
                        vm.k3s_last_error.clone(),
                    ),
                    None => return K3sEnd::Hangs,
                }
            };
            if joined {
                return K3sEnd::Up;
            }
            // `Type=notify`: the start job fails when k3s exits before READY=1.
            if deadline.is_none() && exits > 0 {
                return K3sEnd::Failed;
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return K3sEnd::TimedOut(last);
            }
            tokio::time::sleep(tick).await;
        }
    }

    /// The k3s unit: `Restart=always`, `RestartSec=5s` (install.sh
    /// `create_systemd_service_file`; the simulator's restart delay is `join_retry`). Each
    /// round is one k3s process; a process that exits is started again, one that joins or
    /// keeps retrying stays.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn k3s_unit(
        self: Arc<Self>,
        id: Uuid,
        generation: u64,
        run: u64,
        role: Role,
        k3s: K3sConfig,
        version: String,
        name: String,
        started: Instant,
    ) {
        let unit = role.unit();
        loop {
            if !self.unit_current(id, generation, run) {
                return;
            }
            let Some(msg) = self
                .k3s_process(id, generation, run, role, &k3s, &version, &name, started)
                .await
            else {
                return;
            };
            self.k3s_log(id, started, "fatal", &msg);
            tracing::info!(instance = %name, "k3s exited");
            {
                let mut st = self.state();
                let Some(vm) = st
                    .vms
                    .get_mut(&id)
                    .filter(|v| v.generation == generation && v.k3s_unit == run)
                else {
                    return;
                };
                vm.k3s = K3sState::Refused;
                vm.k3s_exits += 1;
                vm.k3s_last_error = Some(msg);
            }
            self.log(
                id,
                started,
                &format!(
                    "systemd[1]: {unit}.service: Main process exited, code=exited, status=1/FAILURE"
                ),
            );
            tokio::time::sleep(self.cfg.join_retry).await;
            if !self.unit_current(id, generation, run) {
                return;
            }
            self.log(
                id,
                started,
                &format!("systemd[1]: {unit}.service: Scheduled restart job."),
            );
        }
    }

    /// One k3s process: Some(why) when it exits, None when it joined, hangs for ever (the
    /// `never_join` fault) or the boot went stale.
    #[allow(clippy::too_many_arguments)]
    async fn k3s_process(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        run: u64,
        role: Role,
        k3s: &K3sConfig,
        version: &str,
        name: &str,
        started: Instant,
    ) -> Option<String> {
        self.k3s_log(
            id,
            started,
            "info",
            &format!(
                "Starting k3s {} {version}",
                if role == Role::Server {
                    "server"
                } else {
                    "agent"
                }
            ),
        );
        self.set_k3s(id, generation, K3sState::Waiting);
        if let Some(msg) = kubelet::refused_node_labels(k3s) {
            // The kubelet exits at once, so k3s does too.
            return Some(format!("kubelet exited: {msg}"));
        }
        if Self::name_matches(&self.faults.get().never_join, name) {
            // Fault: k3s hangs before it ever registers (e.g. a broken network path).
            self.k3s_log(
                id,
                started,
                "info",
                "Waiting for control-plane node to start: etcd not ready",
            );
            return None;
        }

        let mut attempt: u64 = 0;
        let mut last_retry = String::new();
        loop {
            if !self.unit_current(id, generation, run) {
                return None;
            }
            let mut decision = self.decide(id, role, k3s);
            // A server's etcd starts before anything else of k3s talks to its API (the node
            // password check goes through it): a member with data starts again here.
            if let Decision::Join(cluster) = decision
                && let Err(err) = self.etcd_restart(id, role, cluster)
            {
                return Some(format!("starting etcd: {err}"));
            }
            if let Decision::Join(cluster) = decision
                && let Some(msg) = self.node_password_refused(id, cluster, k3s).await
            {
                // k3s's agent config loop (servers run one too) logs it and retries every 5 s.
                if attempt.is_multiple_of(25) {
                    self.k3s_log(id, started, "info", &msg);
                }
                decision = Decision::Wait;
            }
            match decision {
                Decision::Wait => {
                    attempt += 1;
                    tokio::time::sleep(self.cfg.join_retry).await;
                }
                Decision::RetryError(msg) => {
                    // `logrus.Error(err)`, then again after 2 s (an agent validating its token).
                    if msg != last_retry || attempt.is_multiple_of(25) {
                        self.k3s_log(id, started, "error", &msg);
                        last_retry.clone_from(&msg);
                    }
                    if let Some(vm) = self
                        .state()
                        .vms
                        .get_mut(&id)
                        .filter(|v| v.generation == generation)
                    {
                        vm.k3s_last_error = Some(msg);
                    }
                    attempt += 1;
                    tokio::time::sleep(self.cfg.join_retry).await;
                }
                Decision::Fatal(msg) => return Some(msg),
                decision @ (Decision::Create | Decision::Join(_)) => {
                    // cluster-init on a real control plane: it starts while k3s does.
                    let mut kept = None;
                    let prepared = match &decision {
                        Decision::Create => {
                            let (cp, ()) = tokio::join!(
                                self.start_cluster(id, k3s),
                                tokio::time::sleep(self.cfg.k3s_join)
                            );
                            match cp {
                                Ok((cp, filled)) => {
                                    kept = Some(filled);
                                    Some(cp)
                                }
                                Err(err) => return Some(err),
                            }
                        }
                        Decision::Join(cluster) => {
                            // k3s `join`: "ETCD join failed" is fatal; systemd restarts k3s.
                            let (joined, ()) = tokio::join!(
                                self.etcd_join(id, role, *cluster),
                                tokio::time::sleep(self.cfg.k3s_join)
                            );
                            if let Err(err) = joined {
                                return Some(format!("ETCD join failed: {err}"));
                            }
                            None
                        }
                        _ => None,
                    };
                    if !self.unit_current(id, generation, run) {
                        return None;
                    }
                    let config = kept.as_ref().unwrap_or(k3s);
                    self.finish_join(
                        id,
                        generation,
                        role,
                        config,
                        version,
                        match decision {
                            Decision::Join(cluster) => Some(cluster),
                            _ => None,
                        },
                        started,
                        prepared,
                    );
                    // The agent starts the certificate monitor (k3s `certmonitor.Setup`).
                    if !(role == Role::Server && config.disable_agent) {
                        self.start_cert_monitor(id, generation, run);
                    }
                    // k3s's etcd `Start` starts the snapshot cron (servers only).
                    if role == Role::Server {
                        self.start_snapshot_schedule(id, generation, run, config, started);
                    }
                    return None;
                }
            }
        }
    }

    /// The setup script's steps before k3s, in the script's order, each printing the line the
    /// script's `step` prints. The first that fails ends the script with its step name and
    /// reason, as the script's failure marker says; the k3s step itself is left to the caller.
    async fn run_setup_steps(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        ud: &UserData,
        name: &str,
        hostname: &str,
        started: Instant,
    ) -> Result<(), SetupEnd> {
        let faults = self.faults.get();
        let download_fails = Self::name_matches(&faults.download_fails, name);
        let tampered = Self::name_matches(&faults.download_tampered, name);
        let mut joined = false;
        for (step, _) in &ud.setup {
            // After k3s: run by `run_runcmd` once k3s is up.
            if matches!(step, SetupStep::DrillReport { .. }) {
                continue;
            }
            self.record_setup_state(id, ud, step.name());
            self.console(
                id,
                &format!("oxide-controller: node-setup: {}\n", step.name()),
            );
            let download =
                |url: &Option<String>, sha256: &Option<(String, String)>| match (url, sha256) {
                    // curl -f exits 22 after its retries; the script's download() says which URL.
                    (Some(url), _) if download_fails => Err(SetupEnd::Failed(
                        step.name(),
                        format!("download of {url} failed"),
                    )),
                    // Other bytes than the digest names: `sha256sum -c` exits 1 and the script's
                    // check_sha256 fails the step before the installer runs. Untampered, the
                    // download is the file the digest was taken of (the model has no bytes).
                    (Some(_), Some((file, d))) if tampered => Err(SetupEnd::Failed(
                        step.name(),
                        format!("sha256 of {file} is not the expected {d}"),
                    )),
                    _ => Ok(()),
                };
            match step {
                SetupStep::DataDisk { serial } => {
                    let attached = self
                        .state()
                        .vms
                        .get(&id)
                        .is_some_and(|vm| vm.disk_serials.contains(serial));
                    if !attached || Self::name_matches(&faults.missing_data_disk, name) {
                        return Err(SetupEnd::Failed(
                            step.name(),
                            format!("no NVMe disk with serial {serial}"),
                        ));
                    }
                }
                SetupStep::ProviderId { .. }
                | SetupStep::K3sStart { .. }
                | SetupStep::DrillReport { .. } => {}
                SetupStep::EtcdRestore { serial, dir } => {
                    self.etcd_restore_step(id, ud, (serial, dir), started)
                        .await
                        .map_err(|reason| SetupEnd::Failed(step.name(), reason))?;
                }
                SetupStep::TailscaleInstall { url, sha256 } => download(url, sha256)?,
                SetupStep::TailscaleUp => {
                    match self
                        .tailscale_up(id, generation, ud, hostname, started)
                        .await
                    {
                        UpEnd::Joined => joined = true,
                        UpEnd::Failed(reason) => {
                            return Err(SetupEnd::Failed(step.name(), reason));
                        }
                        UpEnd::Waits => return Err(SetupEnd::Hangs),
                    }
                }
                SetupStep::TailscaleSan => {
                    if !joined {
                        return Err(SetupEnd::Failed(
                            step.name(),
                            "no tailnet IPv4 address".into(),
                        ));
                    }
                }
                SetupStep::K3sInstall {
                    url,
                    sha256,
                    version,
                    binary,
                    skip_download,
                    ..
                } => {
                    if let Some(bin) = binary {
                        // The step's own download of a release's binary: curl -f fails on the
                        // 404 of a release GitHub does not have; `sha256sum -c` then compares
                        // the file with the digest, and `install` runs only after it passed.
                        let exists = bin.release.as_deref().is_some_and(|r| {
                            setup_script::k3s_release_exists(r, &self.cfg.k3s_version)
                        });
                        if download_fails || !exists {
                            return Err(SetupEnd::Failed(
                                step.name(),
                                format!("download of {} failed", bin.url),
                            ));
                        }
                        let got = bin
                            .release
                            .as_deref()
                            .map(setup_script::k3s_binary_sha256)
                            .filter(|_| !tampered);
                        if let Some((file, want)) = &bin.sha256
                            && got.as_deref() != Some(want.to_ascii_lowercase().as_str())
                        {
                            return Err(SetupEnd::Failed(
                                step.name(),
                                format!("sha256 of {file} is not the expected {want}"),
                            ));
                        }
                    }
                    download(url, sha256)?;
                    if *skip_download {
                        // install.sh's `download_and_verify`: no download, no hash file, no
                        // version; `verify_k3s_is_executable` wants the binary in BIN_DIR.
                        self.console(id, "[INFO]  Skipping k3s download and verify\n");
                        if binary.is_none() {
                            self.console(
                                id,
                                &format!(
                                    "[ERROR]  Executable k3s binary not found at {}\n",
                                    setup_script::K3S_BIN_PATH
                                ),
                            );
                            return Err(SetupEnd::Failed(step.name(), "exit status 1".into()));
                        }
                    } else if let Some(version) = version
                        && !setup_script::k3s_release_exists(version, &self.cfg.k3s_version)
                    {
                        self.console(id, &setup_script::missing_release_lines(version));
                        return Err(SetupEnd::Failed(step.name(), "exit status 1".into()));
                    }
                }
                SetupStep::K3sVersion { expected } => {
                    // The image's k3s is the simulator's configured release.
                    let have = &self.cfg.k3s_version;
                    if have != expected {
                        return Err(SetupEnd::Failed(
                            step.name(),
                            format!("the image has k3s {have}, the spec wants {expected}"),
                        ));
                    }
                }
                SetupStep::Unknown => {
                    return Err(SetupEnd::Failed(step.name(), "exit status 127".into()));
                }
            }
        }
        Ok(())
    }

    /// A restore drill's `drill_report`: k3s's kubectl (the admin kubeconfig k3s wrote) polls
    /// `/readyz` of the server's own API once a second for at most `wait`, then lists each of
    /// `kinds` in all namespaces (`-o name`, one line per object); the script adds them up. A
    /// kind the API does not serve fails the step as kubectl's non-zero exit does.
    async fn drill_report(
        self: &Arc<Self>,
        id: Uuid,
        wait: std::time::Duration,
        kinds: &[String],
    ) -> Result<u64, String> {
        let deadline = Instant::now() + wait;
        let api = loop {
            let api = {
                let st = self.state();
                self.api_of(&st, id)
            };
            if let Some(api) = api
                && api
                    .control_plane
                    .list("v1", "Namespace", None)
                    .await
                    .is_ok()
            {
                break api;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the restored API did not answer /readyz within {} s",
                    wait.as_secs()
                ));
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        };
        let mut n = 0u64;
        for kind in kinds {
            let listed = match kind.as_str() {
                "namespaces" => Some("Namespace"),
                "configmaps" => Some("ConfigMap"),
                "services" => Some("Service"),
                "serviceaccounts" => Some("ServiceAccount"),
                _ => None,
            };
            let Some(k) = listed else {
                // kubectl: `error: the server doesn't have a resource type "KIND"`, exit 1.
                return Err(format!("k3s kubectl get {kind} failed"));
            };
            match api.control_plane.list("v1", k, None).await {
                Ok(items) => n += items.len() as u64,
                Err(_) => return Err(format!("k3s kubectl get {kind} failed")),
            }
        }
        Ok(n)
    }

    /// The setup script's `step` (and its last line) write the state file, when it has one.
    fn record_setup_state(&self, id: Uuid, ud: &UserData, state: &str) {
        if !setup_script::records_setup_state(&ud.files) {
            return;
        }
        if let Some(vm) = self.state().vms.get_mut(&id) {
            vm.setup_state = Some(state.to_owned());
        }
    }

    /// The VM stopped running: its boot stops, listeners close, its kubelet stops reporting.
    fn halt(self: &Arc<Self>, id: Uuid) {
        let (node, kube) = {
            let mut st = self.state();
            let kube = self.api_of(&st, id);
            self.etcd_stop(&st, id);
            let Some(vm) = st.vms.get_mut(&id) else {
                return;
            };
            vm.generation += 1;
            vm.running = false;
            vm.sshd_up = false;
            vm.k3s = K3sState::Off;
            vm.tailnet_ip = None;
            (vm.node_name.clone(), kube)
        };
        if let Some(tailnet) = self.tailnet.get() {
            tailnet.disconnect(id);
        }
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
    }
}

// ---------------------------------------------------------------------------------------------
// events

impl RackEvents for Boot {
    fn instance_running(&self, inst: &RunningInstance) {
        let inner = &self.inner;
        let generation = {
            let mut st = inner.state();
            let floating: BTreeSet<IpAddr> = st.floating.keys().copied().collect();
            let wrong_key =
                Inner::name_matches(&inner.faults.get().wrong_console_host_key, &inst.name);
            let vm = st.vms.entry(inst.id).or_insert_with(|| Vm {
                tailnet_ip: None,
                tailnet_san: false,
                ssh_logins: Vec::new(),
                name: inst.name.clone(),
                hostname: inst.hostname.clone(),
                ssh_host: Arc::new(SshHost::generate()),
                decoy_host: None,
                generation: 0,
                running: false,
                boot_started: Instant::now(),
                ephemeral_ips: Vec::new(),
                external_ips: Vec::new(),
                private_ip: None,
                private_loopback: None,
                api_ssh_keys: Vec::new(),
                user_data: None,
                sshd_up: false,
                k3s: K3sState::Off,
                k3s_started: std::time::UNIX_EPOCH,
                certs_end: None,
                member: false,
                cluster: None,
                keys_printed: false,
                instance_booted: false,
                setup_state: None,
                k3s_enabled: false,
                k3s_exits: 0,
                k3s_last_error: None,
                node_name: None,
                etcd_member: None,
                k3s_unit: 0,
                reset_flag: false,
                snapshot_busy: false,
                ncpus: inst.ncpus,
                memory: inst.memory,
                uploads: BTreeMap::new(),
                root_owned: Default::default(),
                disk_serials: Vec::new(),
                restored: None,
            });
            if wrong_key && vm.decoy_host.is_none() {
                vm.decoy_host = Some(Arc::new(SshHost::generate()));
            }
            vm.generation += 1;
            vm.running = true;
            vm.boot_started = Instant::now();
            vm.name = inst.name.clone();
            vm.hostname = inst.hostname.clone();
            vm.disk_serials = inst.disk_serials.clone();
            (vm.ncpus, vm.memory) = (inst.ncpus, inst.memory);
            vm.external_ips = inst.external_ips.clone();
            vm.private_ip = inst.private_ip;
            vm.private_loopback = inst.private_loopback;
            vm.ephemeral_ips = inst
                .external_ips
                .iter()
                .filter(|ip| !floating.contains(ip))
                .copied()
                .collect();
            vm.api_ssh_keys = inst.ssh_public_keys.clone();
            vm.user_data = None;
            vm.sshd_up = false;
            vm.k3s = K3sState::Off;
            vm.tailnet_ip = None;
            vm.tailnet_san = false;
            vm.generation
        };
        let task = inner
            .clone()
            .run_boot(inst.id, generation, inst.user_data.clone());
        inner.runtime.spawn(task);
    }

    fn instance_halted(&self, id: Uuid) {
        self.inner.halt(id);
    }

    fn instance_deleted(&self, id: Uuid) {
        self.inner.halt(id);
        if let Some(tailnet) = self.inner.tailnet.get() {
            tailnet.remove(id);
        }
        let mut st = self.inner.state();
        self.inner.etcd_forget(&st, id);
        if let Some(node) = st.vms.get(&id).and_then(|v| v.node_name.clone()) {
            st.departed_nodes.insert(node);
        }
        if let Some(vm) = st.vms.remove(&id)
            && !vm.uploads.is_empty()
            && let Some(dir) = self.inner.vm_upload_dir(id)
        {
            let _ = std::fs::remove_dir_all(dir);
        }
        st.floating.retain(|_, owner| *owner != id);
        // A cluster whose every member is gone is gone (its datastore lived on their disks).
        let alive: BTreeSet<Uuid> = st
            .vms
            .values()
            .filter(|v| v.member)
            .filter_map(|v| v.cluster)
            .collect();
        st.clusters.retain(|id, _| alive.contains(id));
        drop(st);
        self.inner.listeners.lock().close_owner(id);
    }

    fn floating_ip_changed(&self, ip: IpAddr, instance: Option<Uuid>) {
        let previous = {
            let mut st = self.inner.state();
            let previous = match instance {
                Some(owner) => st.floating.insert(ip, owner),
                None => st.floating.remove(&ip),
            };
            // A floating IP is never one of the VM's own addresses.
            if let Some(owner) = instance
                && let Some(vm) = st.vms.get_mut(&owner)
            {
                vm.ephemeral_ips.retain(|e| *e != ip);
            }
            previous
        };
        if let Some(prev) = previous
            && Some(prev) != instance
        {
            self.inner.sync_listeners(prev);
        }
        if let Some(owner) = instance {
            self.inner.sync_listeners(owner);
        }
    }
}
