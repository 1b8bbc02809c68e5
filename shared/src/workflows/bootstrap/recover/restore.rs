//! Rung 3 of `bootstrap recover`, with `--backup latest|NAME`: no server is left, so the
//! cluster comes back from a backup ([`crate::domain::backup`]) as k3s documents a restore onto
//! a new node ("Restoring a snapshot to new nodes": the old cluster's token, then
//! `k3s server --cluster-reset --cluster-reset-restore-path`).
//!
//! 1. `backup` — the backup chosen among the cluster's (the snapshot list's tags); refused with
//!    exit 2 and nothing touched when it was taken with another server token than the resume
//!    file's (k3s could not decrypt the certificates it keeps, and the old kubeconfig and join
//!    tokens would not fit), or when any server of the cluster is on the rack (a second
//!    datastore beside it; rungs 1 and 2 are for that);
//! 2. `firewall` — the members rule names the new server, as before any create;
//! 3. `restore-server` — a cluster-init server with the old tokens and a disk made from the
//!    backup; its setup unpacks the archive, checks the snapshot's sha256, restores k3s's
//!    datastore from it and starts k3s (`restore_etcd` in [`crate::render::cloud_init`]);
//! 4. `attach-floating-ip` — the API address moves to it;
//! 5. `/readyz` through the old kubeconfig (same CA, restored);
//! 6. `workers` — the workers still on the rack are stopped and deleted with their disks: their
//!    k3s agents joined through servers' private addresses that are all gone (the agent's load
//!    balancer knows only those), so none can reach the restored server; their Nodes came back
//!    Ready from the snapshot and would look alive until the node lifecycle controller's grace,
//!    then wait out the NotReady grace before reconcile replaced them;
//! 7. the caller's reconcile: the Nodes without instances go, the servers grow back to the
//!    spec's count, new workers join the restored servers.

use std::fmt::Write as _;

use tokio::time::Instant;
use tracing::info;

use super::{RecoverInput, Validated, rack_failed};
use crate::base::names::{self, InstanceTag};
use crate::domain::backup::{self, Backup, Choice};
use crate::domain::model::{InstanceState, SnapshotDisk};
use crate::domain::spec::Role;
use crate::ports::rack::Rack;
use crate::render::cloud_init::MemberInput;
use crate::render::members;
use crate::workflows::bootstrap::{BootstrapError, Connect};
use crate::workflows::error::message;

/// The backup a restore takes, after every check that needs no change to the rack.
pub(super) async fn choose<R: Rack>(
    rack: &R,
    v: &Validated,
    input: &RecoverInput,
    which: &str,
) -> Result<Backup, BootstrapError> {
    let step = "backup";
    let c = &input.cluster;
    let all = crate::workflows::bootstrap::backup::list(rack, c)
        .await
        .map_err(|e| rack_failed(step, e))?;
    let Some(chosen) = Choice::parse(which).pick(&all).cloned() else {
        let listed = if all.is_empty() {
            "none".to_owned()
        } else {
            all.iter()
                .map(|b| b.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(BootstrapError::needs_person(
            step,
            message(format!(
                "no backup {which:?} of cluster {c} in project {} (its backups: {listed}); `bootstrap backup --cluster {c}` takes one while the cluster runs. Nothing was changed",
                v.project
            )),
        ));
    };
    let ours = backup::token_fingerprint(&v.resume.k3s_token);
    if chosen.tag.token != ours {
        return Err(BootstrapError::needs_person(
            step,
            message(format!(
                "backup {} of cluster {c} was taken with another server token (fingerprint {}) than the resume file's ({ours}, {}): k3s could not decrypt the certificates it keeps, and the kubeconfig and join tokens would not fit. Use the resume file of the cluster the backup is from, or another backup. Nothing was changed",
                chosen.name,
                chosen.tag.token,
                v.resume_path.display()
            )),
        ));
    }
    let servers = super::servers(rack, c, &v.pool)
        .await
        .map_err(|e| rack_failed(step, e))?;
    if !servers.is_empty() {
        let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        return Err(BootstrapError::needs_person(
            step,
            message(format!(
                "cluster {c} still has servers on the rack ({}): a restore would start a second datastore beside theirs. Run bootstrap recover without --backup (it starts them, or resets etcd on a survivor), or delete them first. Nothing was changed",
                names.join(", ")
            )),
        ));
    }
    Ok(chosen)
}

/// The calls [`run`] makes, as the person reads them.
pub(super) fn calls(project: &str, cluster: &str, pool: &str, chosen: &Backup) -> Vec<String> {
    let server = format!("{}<new>", names::instance_prefix(cluster, pool));
    vec![
        format!("PUT /v1/vpc-firewall-rules?project={project} (the members rule names {server})"),
        format!(
            "POST /v1/instances?project={project}: {server}, cluster-init with the resume file's tokens, with disk restore-{server} from snapshot {} (taken {})",
            chosen.name,
            chosen
                .tag
                .time
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        format!(
            "POST /v1/floating-ips/{}/attach?project={project} to {server}",
            names::api_floating_ip_name(cluster)
        ),
        format!("GET /readyz through context {cluster} until ready"),
        format!(
            "POST /v1/instances/{{worker}}/stop, DELETE /v1/instances/{{worker}} and its disks?project={project}, for every worker of {cluster} left (their agents' servers are gone)"
        ),
        "reconcile passes until the pools are back and Ready".to_owned(),
    ]
}

/// Step 6: every worker of the cluster on the rack, stopped and deleted with its disks.
/// Returns their names.
pub(super) async fn retire_workers<R: Rack>(
    rack: &R,
    cluster: &str,
    control_plane_pool: &str,
    deadline: Instant,
) -> Result<Vec<String>, BootstrapError> {
    let workers: Vec<String> = rack
        .list_instances(&names::cluster_prefix(cluster))
        .await
        .map_err(|e| rack_failed("workers", e))?
        .into_iter()
        .filter(|i| {
            InstanceTag::parse(&i.description)
                .is_some_and(|t| t.cluster == cluster && t.pool != control_plane_pool)
        })
        .filter(|i| i.state != InstanceState::Destroyed)
        .map(|i| i.name)
        .collect();
    if workers.is_empty() {
        return Ok(workers);
    }
    info!(
        step = "workers",
        count = workers.len(),
        "replacing the workers: their servers are gone"
    );
    super::reset::fence(rack, &workers, deadline).await?;
    super::reset::delete(rack, &workers).await?;
    Ok(workers)
}

/// The refusal without `--yes`: what a restore would do.
pub(super) fn needs_yes(cluster: &str, project: &str, calls: &[String]) -> BootstrapError {
    let mut text = format!(
        "cluster {cluster} (project {project}): no server is left (rung 3). A restore makes a new first server from the backup; whatever the cluster wrote after the backup was taken is lost. Nothing was changed. Run again with --yes to make these calls:"
    );
    for call in calls {
        let _ = write!(text, "\n  {call}");
    }
    BootstrapError::needs_person("rung", message(text))
}

/// Steps 2-4 (see the module docs). The caller waits for `/readyz` and reconciles.
pub(super) async fn run<C: Connect>(
    rack: &C::Rack,
    v: &Validated,
    input: &RecoverInput,
    chosen: &Backup,
) -> Result<String, BootstrapError> {
    let step = "restore-server";
    let c = &input.cluster;
    let spec = v.spec.as_ref().ok_or_else(|| {
        BootstrapError::needs_person(
            step,
            message(format!(
                "the resume file {} has no spec (written by an older bootstrap): the new server's size and image are unknown",
                v.resume_path.display()
            )),
        )
    })?;
    let pool = &spec.control_plane;
    let image = Rack::find_image(rack, &pool.image)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| {
            BootstrapError::needs_person(
                step,
                message(format!(
                    "image {} of the control-plane pool is neither in the project nor in the silo",
                    pool.image
                )),
            )
        })?;
    let fip_name = names::api_floating_ip_name(c);
    let fip = rack
        .get_floating_ip(&fip_name)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| {
            BootstrapError::needs_person(
                step,
                message(format!(
                    "the API floating IP {fip_name} is gone: the old kubeconfig and the workers point at it"
                )),
            )
        })?;
    let name = names::instance_name(c, &pool.name, &names::random_suffix(&mut rand::rng()));
    ensure_member_rule(rack, c, &name).await?;
    let snapshot = crate::adapters::image::ImageStore::snapshot(rack, &chosen.name)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| {
            BootstrapError::step(
                step,
                message(format!("backup {} vanished meanwhile", chosen.name)),
            )
        })?;
    // A disk made from a snapshot is at least the snapshot's size.
    let disk = SnapshotDisk {
        name: restore_disk_name(&name),
        snapshot: snapshot.id,
        size: crate::base::size::ByteSize(snapshot.size),
    };
    let secrets = v.resume.secrets(&v.host, &v.token, None);
    let new = members::new_instance(&MemberInput {
        spec,
        secrets: &secrets,
        role: Role::ControlPlane,
        pool,
        name: &name,
        image_id: image.id,
        api_address: fip.ip,
        join_address: fip.ip,
        cluster_init: true,
        ca_hash: None,
        restore: Some(&disk),
    })
    .map_err(|m| BootstrapError::step(step, message(m)))?;
    if let Some(group) = &new.anti_affinity_group {
        rack.ensure_anti_affinity_group(group)
            .await
            .map_err(|e| rack_failed(step, e))?;
    }
    info!(step, instance = %name, backup = %chosen.name, "creating the restoring server");
    match rack.create_instance(&new).await {
        Ok(i) if i.state == InstanceState::Stopped => rack
            .start_instance(&name)
            .await
            .map_err(|e| rack_failed(step, e))?,
        Ok(_) => {}
        Err(e) => return Err(rack_failed(step, e)),
    }
    let deadline = Instant::now() + input.api_timeout;
    super::reset::wait_state(rack, &name, step, deadline, |s| {
        s == Some(InstanceState::Running)
    })
    .await?;
    super::reset::attach_api_address(rack, c, &name).await?;
    Ok(name)
}

/// `restore-<server>`, cut to 63 characters: its NVMe serial (the first 20 bytes) is not a
/// boot or data disk's.
pub fn restore_disk_name(server: &str) -> String {
    let mut n = format!("restore-{server}");
    n.truncate(names::MAX_NAME_LEN);
    n.trim_end_matches('-').to_owned()
}

/// The members rule names the cluster's instances and `new` (before it exists, as reconcile
/// does before each create).
async fn ensure_member_rule<R: Rack>(
    rack: &R,
    cluster: &str,
    new: &str,
) -> Result<(), BootstrapError> {
    let step = "firewall";
    let mut members: Vec<String> = rack
        .list_instances(&names::cluster_prefix(cluster))
        .await
        .map_err(|e| rack_failed(step, e))?
        .into_iter()
        .filter(|i| InstanceTag::parse(&i.description).is_some_and(|t| t.cluster == cluster))
        .map(|i| i.name)
        .collect();
    members.push(new.to_owned());
    let Some(rules) = crate::domain::firewall::member_rules(cluster, &members) else {
        return Err(BootstrapError::step(
            step,
            message(format!(
                "cluster {cluster} has {} instances, more than one firewall rule may name",
                members.len()
            )),
        ));
    };
    rack.ensure_firewall_rules(&rules)
        .await
        .map(drop)
        .map_err(|e| rack_failed(step, e))
}
