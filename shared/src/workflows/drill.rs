//! The restore drill's things on the rack, shared by its two runners: `bootstrap recover
//! --verify` (a laptop: it waits for the restored API through a copy of the admin kubeconfig,
//! [`crate::workflows::bootstrap::recover`]) and the reconcile's scheduled drill (it starts the
//! drill, reads the server's verdict off its serial console in later runs and cleans up,
//! [`crate::workflows::reconcile`]). What a drill makes: a floating IP
//! `<cluster>-drill-apiserver` and a throw-away server `<cluster>-drill-<pool>-<suffix>`
//! (described [`crate::domain::backup::drill::server_description`], no member tag, so no run
//! takes it for a member) with its boot and data disks and the disk made from the backup
//! ([`restore_disk_name`]).

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::base::names;
use crate::base::secrets::ClusterSecrets;
use crate::domain::backup::Backup;
use crate::domain::model::{NewInstance, SnapshotDisk};
use crate::domain::spec::{ClusterSpec, Role};
use crate::ports::rack::{Rack, RackError};
use crate::render::cloud_init::MemberInput;
use crate::render::members;
use crate::workflows::error::{self, WorkflowError, message};

fn rack_failed(step: &'static str, e: RackError) -> WorkflowError {
    WorkflowError::step(step, error::context("the Oxide API", e))
}

/// `restore-<server>`, cut to 63 characters: its NVMe serial (the first 20 bytes) is not a
/// boot or data disk's.
pub fn restore_disk_name(server: &str) -> String {
    let mut n = format!("restore-{server}");
    n.truncate(names::MAX_NAME_LEN);
    n.trim_end_matches('-').to_owned()
}

/// Names of what a drill of `cluster` makes: its throw-away cluster name and API address.
pub fn drill_names(cluster: &str) -> (String, String) {
    let tmp = format!("{cluster}-drill");
    let fip = names::api_floating_ip_name(&tmp);
    (tmp, fip)
}

/// `spec` for the drill's throw-away cluster, and a fresh name for its server.
pub fn drill_spec_and_server(spec: &ClusterSpec) -> Result<(ClusterSpec, String), WorkflowError> {
    let (tmp, _) = drill_names(&spec.cluster);
    let mut spec = spec.clone();
    spec.cluster.clone_from(&tmp);
    let name = names::instance_name(
        &tmp,
        &spec.control_plane.name,
        &names::random_suffix(&mut rand::rng()),
    );
    names::validate_name_max("drill server name", &name, names::MAX_INSTANCE_NAME_LEN)
        .map_err(|e| WorkflowError::input("--cluster", e))?;
    Ok((spec, name))
}

/// The cluster-init server that restores `chosen`: `name`, with the cluster's tokens
/// (`secrets`), `api_address` among its TLS names, the control-plane pool's size, the backup's
/// k3s release and image ([`crate::domain::spec::restore_pool`]), and a disk made from the
/// backup; a `drill`'s without a local agent.
#[allow(clippy::too_many_arguments)]
pub async fn restoring_server<R: Rack + crate::adapters::image::ImageStore>(
    rack: &R,
    secrets: &ClusterSecrets,
    spec: &ClusterSpec,
    chosen: &Backup,
    name: &str,
    api_address: IpAddr,
    drill: bool,
    step: &'static str,
) -> Result<NewInstance, WorkflowError> {
    let (pool, note) =
        crate::domain::spec::restore_pool(&chosen.name, &chosen.tag, &spec.control_plane)
            .map_err(|m| WorkflowError::needs_person(step, message(m)))?;
    if let Some(note) = note {
        warn!(step, backup = %chosen.name, "{note}");
    }
    let mut spec = spec.clone();
    spec.control_plane = pool;
    spec.validate().map_err(|e| {
        WorkflowError::needs_person(
            step,
            message(format!(
                "the server restoring backup {} runs k3s {} (the backup's release) on image {}, which the spec does not allow: {e}. Nothing was changed",
                chosen.name, chosen.tag.k3s_version, spec.control_plane.image
            )),
        )
    })?;
    let spec = &spec;
    let pool = &spec.control_plane;
    let image = Rack::find_image(rack, &pool.image)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| {
            WorkflowError::needs_person(
                step,
                message(format!(
                    "image {} (the control-plane image for backup {}) is neither in the project nor in the silo; import it again, or restore another backup. Nothing was changed",
                    pool.image, chosen.name
                )),
            )
        })?;
    let snapshot = crate::adapters::image::ImageStore::snapshot(rack, &chosen.name)
        .await
        .map_err(|e| rack_failed(step, e))?
        .ok_or_else(|| {
            WorkflowError::step(
                step,
                message(format!("backup {} vanished meanwhile", chosen.name)),
            )
        })?;
    // A disk made from a snapshot is at least the snapshot's size.
    let disk = SnapshotDisk {
        name: restore_disk_name(name),
        snapshot: snapshot.id,
        size: crate::base::size::ByteSize(snapshot.size),
    };
    members::new_instance(&MemberInput {
        spec,
        secrets,
        role: Role::ControlPlane,
        pool,
        name,
        image_id: image.id,
        api_address,
        join_address: api_address,
        cluster_init: true,
        ca_hash: None,
        restore: Some(&disk),
        drill,
    })
    .map_err(|m| WorkflowError::step(step, message(m)))
}

/// Makes the drill's address (kept when it exists) and creates its server `name` restoring
/// `chosen` of `cluster`, alone (no anti-affinity group, no ephemeral address). `spec` is the
/// drill's ([`drill_spec_and_server`]). Returns the address.
#[allow(clippy::too_many_arguments)]
pub async fn create_drill_server<R: Rack + crate::adapters::image::ImageStore>(
    rack: &R,
    secrets: &ClusterSecrets,
    spec: &ClusterSpec,
    chosen: &Backup,
    cluster: &str,
    name: &str,
    step: &'static str,
) -> Result<IpAddr, WorkflowError> {
    let (_, fip_name) = drill_names(cluster);
    let fip = match rack
        .get_floating_ip(&fip_name)
        .await
        .map_err(|e| rack_failed(step, e))?
    {
        Some(f) => f,
        None => rack
            .create_floating_ip(
                &fip_name,
                &crate::domain::backup::drill::address_description(cluster),
                spec.nodes.ip_pool.as_deref(),
            )
            .await
            .map_err(|e| rack_failed(step, e))?,
    };
    let mut new = restoring_server(rack, secrets, spec, chosen, name, fip.ip, true, step).await?;
    new.anti_affinity_group = None;
    new.ephemeral_ip = false;
    new.description = crate::domain::backup::drill::server_description(cluster, &chosen.name);
    // The cluster's API rule names servers, not the VPC (audit security-2 N11): it names the
    // drill's server before it exists, so a laptop's drill reaches its API on the address.
    retarget_api_rule(rack, cluster, &spec.control_plane.name, name)
        .await
        .map_err(|e| rack_failed(step, e))?;
    info!(step, instance = %name, backup = %chosen.name, "creating the drill's server");
    rack.create_instance(&new)
        .await
        .map_err(|e| rack_failed(step, e))?;
    Ok(fip.ip)
}

/// Deletes what a drill made: the server `name` with its disks, and, with `fip_name`, the
/// drill's address. Each gone already is fine, so a drill cut short is cleaned by the next; a
/// Names `new` in `cluster`'s API rule, beside its servers and drill servers as the rack lists
/// them ([`crate::domain::firewall::api_servers`]), before `new` exists; the rule's sources
/// stay as bootstrap wrote them, and a cluster without the rule gets none.
pub async fn retarget_api_rule<R: Rack>(
    rack: &R,
    cluster: &str,
    control_plane_pool: &str,
    new: &str,
) -> Result<(), RackError> {
    let listed = rack.list_instances(&names::cluster_prefix(cluster)).await?;
    let mut servers = crate::domain::firewall::api_servers(
        cluster,
        control_plane_pool,
        listed
            .iter()
            .map(|i| (i.name.as_str(), i.description.as_str())),
    );
    servers.push(new.to_owned());
    if let Some(rule) = crate::domain::firewall::api_rule_servers(cluster, &servers) {
        rack.ensure_firewall_rules(&[rule]).await?;
    }
    Ok(())
}

/// stop still under way at `timeout` fails (the next try goes on).
pub async fn clean_drill<R: Rack>(
    rack: &R,
    name: &str,
    fip_name: Option<&str>,
    timeout: Duration,
) -> Result<(), WorkflowError> {
    let step = "drill-cleanup";
    let deadline = Instant::now() + timeout;
    let others = [name.to_owned()];
    if let Some(fip_name) = fip_name {
        let attached = rack
            .get_floating_ip(fip_name)
            .await
            .map_err(|e| rack_failed(step, e))?
            .is_some_and(|f| f.instance_id.is_some());
        if attached {
            rack.detach_floating_ip(fip_name)
                .await
                .map_err(|e| rack_failed(step, e))?;
        }
    }
    crate::workflows::retire::fence(rack, &others, deadline).await?;
    crate::workflows::retire::delete(rack, &others).await?;
    let restore = restore_disk_name(name);
    let deleted = crate::base::retry::retry(
        crate::base::retry::Backoff::default(),
        |e: &RackError| e.is_retryable() || matches!(e, RackError::Conflict { .. }),
        || rack.delete_disk(&restore),
    )
    .await;
    match deleted {
        Ok(()) | Err(RackError::NotFound { .. }) => {}
        Err(e) => return Err(rack_failed(step, e)),
    }
    let Some(fip_name) = fip_name else {
        return Ok(());
    };
    match rack.delete_floating_ip(fip_name).await {
        Ok(()) | Err(RackError::NotFound { .. }) => Ok(()),
        Err(e) => Err(rack_failed(step, e)),
    }
}
