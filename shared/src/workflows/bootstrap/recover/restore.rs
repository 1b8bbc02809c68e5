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
//! 5. `/readyz` through the old kubeconfig (same CA, restored); then `rotations`, before
//!    anything reads the restored Secret: what the laptop knows better written back into it
//!    ([`super::rotations`]);
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
use crate::domain::model::InstanceState;
use crate::domain::spec::ClusterSpec;
use crate::ports::rack::Rack;
use crate::workflows::bootstrap::{BootstrapError, Connect};
use crate::workflows::error::message;

/// The backup a drill takes: as [`choose`], but the cluster's servers may run (a drill does
/// not touch them).
pub(super) async fn choose_any<R: Rack>(
    rack: &R,
    v: &Validated,
    input: &RecoverInput,
    which: &str,
) -> Result<Backup, BootstrapError> {
    pick(rack, v, input, which).await
}

/// The backup a restore takes, after every check that needs no change to the rack.
pub(super) async fn choose<R: Rack>(
    rack: &R,
    v: &Validated,
    input: &RecoverInput,
    which: &str,
) -> Result<Backup, BootstrapError> {
    let chosen = pick(rack, v, input, which).await?;
    let step = "backup";
    let c = &input.cluster;
    let servers = super::servers(rack, c, &v.pool)
        .await
        .map_err(|e| rack_failed(step, e))?;
    if !servers.is_empty() {
        let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        return Err(BootstrapError::needs_person(
            step,
            message(format!(
                "cluster {c} still has servers on the rack ({}): a restore would start a second datastore beside theirs. Run bootstrap recover without --backup (it starts them, or resets etcd on a survivor), or delete them first; bootstrap recover --verify drills a backup without touching them. Nothing was changed",
                names.join(", ")
            )),
        ));
    }
    Ok(chosen)
}

/// The named (or newest) backup of the cluster, refused when another server token made it.
async fn pick<R: Rack>(
    rack: &R,
    v: &Validated,
    input: &RecoverInput,
    which: &str,
) -> Result<Backup, BootstrapError> {
    let step = "backup";
    let c = &input.cluster;
    let all = super::list_backups(rack, c)
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
    Ok(chosen)
}

/// The calls [`run`] makes, as the person reads them (`spec`: the resume file's).
pub(super) fn calls(
    project: &str,
    cluster: &str,
    pool: &str,
    spec: Option<&ClusterSpec>,
    chosen: &Backup,
) -> Vec<String> {
    let server = format!("{}<new>", names::instance_prefix(cluster, pool));
    let image = chosen.tag.image.as_deref().map_or_else(
        || {
            spec.map_or_else(
                || "the resume file's image".to_owned(),
                |s| format!("image {} (the resume file's)", s.control_plane.image),
            )
        },
        |i| format!("image {i}"),
    );
    vec![
        format!("PUT /v1/vpc-firewall-rules?project={project} (the members rule names {server})"),
        format!(
            "POST /v1/instances?project={project}: {server}, cluster-init with the resume file's tokens, k3s {} (the backup's release) on {image}, with disk restore-{server} from snapshot {} (taken {})",
            chosen.tag.k3s_version,
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
            "PUT Secret kube-system/oxide-controller (the Oxide host, token and project this run uses, no retired key, no webhook token), PUT Secret kube-system/oxide-controller-webhook-auth (new webhook tokens) and apply Secret oxide-controller-backup/oxide-controller-rack, through context {cluster}: the backup's are what they were when it was taken"
        ),
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
    // The API rule names the restoring server too (it names servers, not the VPC): the old
    // kubeconfig reaches it on the API address.
    retarget_api_rule(rack, c, &pool.name, &name)
        .await
        .map_err(|e| rack_failed("firewall", e))?;
    let secrets = v.resume.secrets(&v.host, &v.token, None);
    let new = restoring_server(rack, &secrets, spec, chosen, &name, fip.ip, false, step).await?;
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

use crate::workflows::drill::{clean_drill, drill_names, restoring_server, retarget_api_rule};

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

/// What a restore drill found (`bootstrap recover --verify`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DrillReport {
    pub backup: String,
    /// The throw-away server.
    pub server: String,
    /// From the server's create to a ready `/readyz`.
    pub restore_seconds: f64,
    /// Objects of the counted kinds: the backup's manifest, and the restored API.
    pub expected_objects: Option<u64>,
    pub restored_objects: u64,
    /// Everything the drill made is gone again.
    pub cleaned_up: bool,
}

/// What `drill.json` records of a drill of `chosen` that ended in `drilled`: a ready API
/// holding the objects the backup counted (or no count to compare) passes; anything else
/// fails with its reason.
pub fn drill_result(
    chosen: &Backup,
    drilled: &Result<DrillReport, BootstrapError>,
    by: &str,
) -> backup::drill::DrillResult {
    let mut r = backup::drill::DrillResult {
        at: chrono::Utc::now(),
        backup: Some(chosen.name.clone()),
        backup_time: Some(chosen.tag.time),
        ok: false,
        reason: None,
        expected_objects: chosen.tag.objects,
        restored_objects: None,
        restore_seconds: None,
        cleaned_up: false,
        by: by.to_owned(),
        started: None,
    };
    match drilled {
        Ok(d) => {
            r.restored_objects = Some(d.restored_objects);
            r.restore_seconds = Some(d.restore_seconds);
            r.cleaned_up = d.cleaned_up;
            r.reason = backup::drill::count_mismatch(d.expected_objects, d.restored_objects);
            r.ok = r.reason.is_none();
        }
        Err(e) => {
            r.reason = Some(crate::workflows::error::chain(e));
            // A drill whose cleanup failed says so in its error (step drill-cleanup).
            r.cleaned_up = !r
                .reason
                .as_deref()
                .is_some_and(|m| m.starts_with("drill-cleanup"));
        }
    }
    r
}

/// The restore drill: the backup restored into a throw-away single server (no local agent,
/// so nothing of the restored cluster runs; its API address a temporary floating IP), its
/// `/readyz` awaited through a copy of the kubeconfig pointed at it, its objects counted
/// against the manifest, then everything it made deleted whatever happened.
pub(super) async fn drill<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &Validated,
    input: &RecoverInput,
    chosen: &Backup,
) -> Result<DrillReport, BootstrapError> {
    let step = "drill";
    let c = &input.cluster;
    let (_, fip_name) = drill_names(c);
    let spec = v.spec.as_ref().ok_or_else(|| {
        BootstrapError::needs_person(
            step,
            message(format!(
                "the resume file {} has no spec: the drill server's size and image are unknown",
                v.resume_path.display()
            )),
        )
    })?;
    let (spec, name) = crate::workflows::drill::drill_spec_and_server(spec)?;
    // Where the copy of the admin kubeconfig goes: a directory of a random name made by
    // this process alone, 0700 (audit security-2 N5: a predictable path under a shared /tmp
    // let another local user pre-create it and read the credential).
    let dir = drill_dir(&std::env::temp_dir()).map_err(|e| BootstrapError::step("drill", e))?;
    let made = drill_server(
        connect, rack, v, input, chosen, &spec, &name, &fip_name, &dir,
    )
    .await;
    let cleaned = clean_drill(rack, &name, Some(&fip_name), input.api_timeout).await;
    let _ = std::fs::remove_dir_all(&dir);
    let (restore_seconds, restored_objects) = made?;
    cleaned?;
    Ok(DrillReport {
        backup: chosen.name.clone(),
        server: name,
        restore_seconds,
        expected_objects: chosen.tag.objects,
        restored_objects,
        cleaned_up: true,
    })
}

/// A new directory for the drill's kubeconfig under `parent`: a random name, created by
/// `mkdir` (which fails on anything already there, a symlink included) with mode 0700.
fn drill_dir(parent: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let mut last = None;
    for _ in 0..8 {
        let dir = parent.join(format!(
            "oxide-controller-drill-{}",
            names::random_suffix(&mut rand::rng())
        ));
        let mut b = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        match b.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

/// The drill's server, up to a counted ready API: (seconds to `/readyz`, objects).
#[allow(clippy::too_many_arguments)]
async fn drill_server<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &Validated,
    input: &RecoverInput,
    chosen: &Backup,
    spec: &crate::domain::spec::ClusterSpec,
    name: &str,
    fip_name: &str,
    dir: &std::path::Path,
) -> Result<(f64, u64), BootstrapError> {
    let step = "drill";
    let started = Instant::now();
    let secrets = v.resume.secrets(&v.host, &v.token, None);
    let ip = crate::workflows::drill::create_drill_server(
        rack,
        &secrets,
        spec,
        chosen,
        &input.cluster,
        name,
        step,
    )
    .await?;
    let deadline = started + input.api_timeout;
    super::reset::wait_state(rack, name, step, deadline, |s| {
        s == Some(InstanceState::Running)
    })
    .await?;
    crate::base::retry::retry(
        crate::base::retry::Backoff::default(),
        crate::ports::rack::RackError::is_retryable,
        || rack.attach_floating_ip(fip_name, name),
    )
    .await
    .map_err(|e| rack_failed(step, e))?;
    let kubeconfig = dir.join("kubeconfig");
    crate::adapters::kubeconfig::copy_with_server(
        &v.kubeconfig,
        &input.cluster,
        &crate::domain::spec::server_url(ip),
        &kubeconfig,
    )
    .map_err(|e| BootstrapError::step(step, e))?;
    loop {
        // A setup that failed (a backup whose digest does not match, say) never serves an
        // API: its console's failure marker says so at once, with the step's reason.
        if let Ok(console) = rack.serial_console(name).await
            && let Some(f) =
                crate::render::cloud_init::setup_failure(&String::from_utf8_lossy(&console))
        {
            return Err(BootstrapError::step(
                step,
                message(format!(
                    "the drill server's setup failed at step {}: {}: the backup {} does not restore",
                    f.step, f.reason, chosen.name
                )),
            ));
        }
        match connect.api_ready(&kubeconfig, &input.cluster).await {
            Ok(()) => break,
            Err(why) if Instant::now() >= deadline => {
                return Err(BootstrapError::step(
                    step,
                    message(format!(
                        "the restored API was not ready within {}s (last: {why}): the backup {} does not restore",
                        input.api_timeout.as_secs(),
                        chosen.name
                    )),
                ));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let objects = connect
        .object_count(&kubeconfig, &input.cluster, None)
        .await
        .map_err(|e| BootstrapError::step(step, message(e)))?;
    Ok((seconds, objects))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Audit security-2 N5: the drill's kubeconfig goes into a directory nobody else can have
    /// made or can read: a new random name each time, mode 0700, and a name already taken (a
    /// pre-created directory or a symlink) is never reused.
    #[test]
    fn the_drill_directory_is_new_private_and_unpredictable() {
        let parent = std::env::temp_dir().join(format!("drill-dir-test-{}", std::process::id()));
        std::fs::create_dir_all(&parent).unwrap();
        let a = drill_dir(&parent).unwrap();
        let b = drill_dir(&parent).unwrap();
        assert_ne!(a, b);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700);
        }
        // The kubeconfig is written only as a new file: one planted in its place is refused.
        let planted = a.join("kubeconfig");
        std::fs::write(&planted, "someone else's").unwrap();
        let src = parent.join("admin.yaml");
        std::fs::write(
            &src,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\ncurrent-context: c\n",
        )
        .unwrap();
        assert!(
            crate::adapters::kubeconfig::copy_with_server(
                &src,
                "c",
                "https://10.0.0.2:6443",
                &planted
            )
            .is_err()
        );
        assert_eq!(std::fs::read_to_string(&planted).unwrap(), "someone else's");
        let fresh = b.join("kubeconfig");
        crate::adapters::kubeconfig::copy_with_server(&src, "c", "https://10.0.0.2:6443", &fresh)
            .unwrap();
        assert!(
            std::fs::read_to_string(&fresh)
                .unwrap()
                .contains("10.0.0.2")
        );
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
