//! Rung 2 of `bootstrap recover`: k3s's cluster reset on the one server left with its disks,
//! as k3s documents it for quorum loss (`systemctl stop k3s`, `k3s server --cluster-reset`,
//! `systemctl start k3s`; the other servers' `server/db` deleted before they may rejoin).
//!
//! In order, each step safe to repeat when a run was cut short:
//! 1. `fence` — every other server is stopped (and stays so until deleted): no old member
//!    may run beside the reset one;
//! 2. `survivor` — started if it is not running, and waited for;
//! 3. `attach-floating-ip` — the API address moves to the survivor (the laptop reaches a
//!    server's SSH and API through it, as bootstrap does);
//! 4. `cluster-reset` — over SSH with the host keys pinned in the resume file (read from the
//!    serial console and pinned there first if it has none for the survivor): k3s stopped;
//!    the `server:` line deleted from its `config.yaml` (k3s refuses a reset while the config
//!    names a server to join, which every server but the first has; a one-member cluster has
//!    nothing to join, so the line stays deleted); then `k3s server --cluster-reset` (etcd's
//!    force-new-cluster: one member, all the data). Only its exit 0 counts as done: k3s exits
//!    0 once etcd runs as this one member, and nowhere else. k3s refuses a second reset while
//!    its reset-flag is there ("previously reset"), but it writes that flag *before* it starts
//!    etcd, so the flag proves nothing: the run deletes it and resets again (harmless on a
//!    member already reset: it stays the one member with its data). A reset that fails stops
//!    the run before anything is deleted;
//! 5. `delete` — the other servers with their disks, before k3s serves again: their
//!    `server/db` still names the old members, so they must never start again ("Backup and
//!    delete ${datadir}/server/db on each peer"), and a re-run that finds the API ready has
//!    no fenced server left behind;
//! 6. `start` — k3s started normally (which removes the reset-flag), then `/readyz` awaited.
//!
//! The caller then runs the reconcile, which deletes the Nodes of the deleted servers and
//! grows the servers back one at a time.

use std::net::IpAddr;

use tokio::time::Instant;
use tracing::info;

use super::{RecoverInput, Validated, rack_failed};
use crate::adapters::ssh::{RemoteShell, SshError};
use crate::base::names;
use crate::domain::model::InstanceState;
use crate::ports::rack::{Rack, RackError};
use crate::workflows::bootstrap::{BootstrapError, Connect};
use crate::workflows::error::message;

/// `systemctl stop k3s`, as k3s's cluster-reset procedure runs it.
pub const STOP_K3S: &str = "sudo -n systemctl stop k3s";
/// The join URL out of the k3s config (the product writes it as one top-level
/// `server: https://…` line; k3s refuses a reset while it is set). GNU sed's in-place edit
/// writes a new file and renames it over the old one, keeping its mode.
pub const DROP_SERVER_URL: &str = "sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml";
/// The reset itself (no snapshot: the member keeps its own data).
pub const CLUSTER_RESET: &str = "sudo -n k3s server --cluster-reset";
/// k3s's reset-flag (`${datadir}/server/db/reset-flag`, default data dir).
pub const RESET_FLAG: &str = "/var/lib/rancher/k3s/server/db/reset-flag";
/// Deletes [`RESET_FLAG`], as k3s's refusal asks before another reset.
pub const REMOVE_RESET_FLAG: &str = "sudo -n rm -f /var/lib/rancher/k3s/server/db/reset-flag";
/// `systemctl start k3s`.
pub const START_K3S: &str = "sudo -n systemctl start k3s";
/// What k3s says when its reset-flag is there (`pkg/cluster/managed.go` `start`).
const PREVIOUSLY_RESET: &str = "was previously reset";

pub(crate) use crate::workflows::retire::{POLL, delete, fence, wait_state};

/// Steps 1-6 (see the module docs). `started` is when the first of them began.
pub(super) async fn run<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &mut Validated,
    input: &RecoverInput,
    survivor: &str,
    others: &[String],
) -> Result<(), BootstrapError> {
    let deadline = Instant::now() + input.api_timeout;
    fence(rack, others, deadline).await?;
    ensure_running(rack, survivor, deadline).await?;
    let ip = attach_api_address(rack, &input.cluster, survivor).await?;
    let shell =
        super::server_shell(connect, rack, v, survivor, ip, deadline, "cluster-reset").await?;
    reset(&shell, survivor, deadline).await?;
    delete(rack, others).await?;
    info!(step = "start", instance = %survivor, "starting k3s without --cluster-reset");
    match shell.exec(START_K3S).await {
        Ok(out) if out.success() => {}
        // k3s started but was not up when the command's time ran out: /readyz tells.
        Err(SshError::CommandTimeout { .. }) => {}
        Ok(out) => return Err(remote_failed("start", START_K3S, &out)),
        Err(e) => return Err(BootstrapError::step("start", e)),
    }
    Ok(())
}

/// Step 2: the survivor runs.
async fn ensure_running<R: Rack>(
    rack: &R,
    survivor: &str,
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let state = rack
        .get_instance(survivor)
        .await
        .map_err(|e| rack_failed("survivor", e))?
        .map(|i| i.state);
    if state != Some(InstanceState::Running) {
        info!(step = "survivor", instance = %survivor, ?state, "starting the survivor");
        match rack.start_instance(survivor).await {
            Ok(()) | Err(RackError::Conflict { .. }) => {}
            Err(e) => return Err(rack_failed("survivor", e)),
        }
    }
    wait_state(rack, survivor, "survivor", deadline, |s| {
        s == Some(InstanceState::Running)
    })
    .await
}

/// Step 3: the API floating IP on the survivor. Returns its address.
pub(super) async fn attach_api_address<R: Rack>(
    rack: &R,
    cluster: &str,
    survivor: &str,
) -> Result<IpAddr, BootstrapError> {
    let step = "attach-floating-ip";
    let fip_name = names::api_floating_ip_name(cluster);
    let fip = rack
        .get_floating_ip(&fip_name)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| {
            BootstrapError::needs_person(
                step,
                message(format!(
                    "the API floating IP {fip_name} is gone: the cluster's API address cannot be moved to {survivor}"
                )),
            )
        })?;
    let holder = rack
        .get_instance(survivor)
        .await
        .map_err(|e| rack_failed(step, e))?
        .map(|i| i.id);
    if fip.instance_id.is_some() && fip.instance_id == holder {
        return Ok(fip.ip);
    }
    if fip.instance_id.is_some() {
        info!(step, name = %fip_name, "detaching the API floating IP");
        rack.detach_floating_ip(&fip_name)
            .await
            .map_err(|e| rack_failed(step, e))?;
    }
    info!(step, name = %fip_name, instance = %survivor, "attaching the API floating IP");
    crate::base::retry::retry(
        crate::base::retry::Backoff::default(),
        RackError::is_retryable,
        || rack.attach_floating_ip(&fip_name, survivor),
    )
    .await
    .map_err(|e| rack_failed(step, e))?;
    Ok(fip.ip)
}

/// Step 4: k3s stopped, `server:` out of its config, then reset; only an exit 0 counts.
async fn reset<S: RemoteShell>(
    shell: &S,
    survivor: &str,
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let step = "cluster-reset";
    info!(step, instance = %survivor, "stopping k3s");
    // sshd may still be starting on a survivor that was just started.
    let stopped = loop {
        match shell.exec(STOP_K3S).await {
            Err(e @ (SshError::HostKeyMismatch { .. } | SshError::NoPins { .. })) => {
                return Err(BootstrapError::needs_person(step, e));
            }
            Err(e) if Instant::now() < deadline => {
                info!(step, error = %e, "the survivor's sshd does not answer yet");
                tokio::time::sleep(POLL).await;
            }
            other => break other,
        }
    };
    match stopped {
        Ok(out) if out.success() => {}
        Ok(out) => return Err(remote_failed(step, STOP_K3S, &out)),
        Err(e) => return Err(BootstrapError::step(step, e)),
    }
    info!(step, instance = %survivor, "deleting server: from the k3s config");
    run_ok(shell, step, DROP_SERVER_URL).await?;
    info!(step, instance = %survivor, "running k3s server --cluster-reset");
    let mut out = remote(shell, step, CLUSTER_RESET).await?;
    if !out.success() && String::from_utf8_lossy(&out.stderr).contains(PREVIOUSLY_RESET) {
        // k3s writes its flag before etcd starts as a new cluster: a reset that failed there
        // leaves it too. Only a reset that exits 0 says the member is alone.
        info!(
            step,
            instance = %survivor,
            "the reset-flag of an earlier reset is there, which proves nothing; deleting it and resetting again"
        );
        run_ok(shell, step, REMOVE_RESET_FLAG).await?;
        out = remote(shell, step, CLUSTER_RESET).await?;
    }
    if out.success() {
        info!(step, instance = %survivor, "etcd is a single member with all its data");
        return Ok(());
    }
    let failed = failure_text(CLUSTER_RESET, &out);
    Err(BootstrapError::needs_person(
        step,
        message(format!(
            "{failed}. The cluster reset on {survivor} did not finish, so nothing was deleted (the other servers stay stopped with their disks). k3s writes its reset-flag {RESET_FLAG} before it starts etcd, so a reset that failed there leaves it behind: fix what the error says, then remove the flag (ssh to {survivor}: sudo rm {RESET_FLAG}; a re-run of bootstrap recover --yes also removes it) and run bootstrap recover --yes again"
        )),
    ))
}

/// Runs `command` on the survivor; an SSH failure is the step's error.
async fn remote<S: RemoteShell>(
    shell: &S,
    step: &'static str,
    command: &str,
) -> Result<crate::adapters::ssh::CommandOutput, BootstrapError> {
    shell
        .exec(command)
        .await
        .map_err(|e| BootstrapError::step(step, e))
}

/// Runs `command` on the survivor; a non-zero exit is the step's error.
async fn run_ok<S: RemoteShell>(
    shell: &S,
    step: &'static str,
    command: &str,
) -> Result<(), BootstrapError> {
    let out = remote(shell, step, command).await?;
    if out.success() {
        Ok(())
    } else {
        Err(remote_failed(step, command, &out))
    }
}

/// A remote command that exited non-zero, with its exit status and the end of its stderr.
fn remote_failed(
    step: &'static str,
    command: &str,
    out: &crate::adapters::ssh::CommandOutput,
) -> BootstrapError {
    BootstrapError::step(step, message(failure_text(command, out)))
}

/// "`command` exited N: " and the last three lines of its stderr.
fn failure_text(command: &str, out: &crate::adapters::ssh::CommandOutput) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!(
        "`{command}` exited {}: {}",
        out.exit_status,
        tail.join(" / ")
    )
}
