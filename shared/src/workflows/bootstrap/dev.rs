//! The `--controller-image dev:PATH` part of bootstrap: build the three binaries right after
//! validation (before any Oxide API call, so a build error creates nothing), copy them to the
//! first control-plane VM before the manifests are applied (the CronJob and webhook then run
//! them from there), and to every other control-plane VM once reconcile has made them. Each
//! Node gets [`manifests::NODE_BINARIES_LABEL`] once its copy is complete, and the pods select
//! that label, so they never land on a Node without the binaries.
//!
//! Logged under the steps they belong to (`validate`, `manifests`, `reconcile`): the step list
//! is the same with or without a dev image.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::{ApplyManifests, BootstrapError, Connect, Ports, failed, rack_failed, read_pins};
use crate::adapters::dev_image::{Built, DevImage, Installed};
use crate::adapters::ssh::{HostKeyPins, RemoteShell, SshKeyPair};
use crate::base::names;
use crate::domain::model::InstanceState;
use crate::domain::spec::ClusterSpec;
use crate::ports::rack::Rack as _;
use crate::ports::state::StateStore as _;
use crate::render::manifests::{self, NodeBinaries};
use crate::workflows::error::{self, message};

/// Builds the binaries (step `validate`: a source that does not build is the input's fault).
pub(super) async fn build<C: Connect>(
    connect: &C,
    dev: &DevImage,
    profile: &str,
) -> Result<Built, BootstrapError> {
    let step = super::STEP_VALIDATE;
    let started = Instant::now();
    info!(step, path = %dev.path.display(), profile, platform = %dev.platform, "building the controller binaries");
    let built = connect.build_controller(dev, profile).await.map_err(|e| {
        if e.is_config() {
            BootstrapError::inputs(e)
        } else {
            failed(step, e)
        }
    })?;
    info!(step, build = %built.id(), seconds = started.elapsed().as_secs_f64(), "controller binaries built");
    Ok(built)
}

/// Where the manifests find the binaries.
pub(super) fn node_binaries(built: &Built) -> NodeBinaries {
    NodeBinaries {
        host_dir: built.remote_dir(),
        label_value: built.id(),
    }
}

/// Copies the build to one VM (unless there already) and labels its Node.
pub(super) async fn install_on<S: RemoteShell, M: ApplyManifests>(
    step: &'static str,
    target: &S,
    addr: SocketAddr,
    node: &str,
    built: &Built,
    applier: &M,
) -> Result<(), BootstrapError> {
    let how = crate::adapters::dev_image::install(target, addr, built)
        .await
        .map_err(|e| failed(step, e))?;
    let how = match how {
        Installed::Copied => "copied",
        Installed::AlreadyThere => "already there",
    };
    info!(step, node, dir = %built.remote_dir(), how, "controller binaries on the node");
    label_node(step, applier, node, &built.id()).await
}

/// Labels the Node, waiting (up to a minute) for a just-started server to register it.
async fn label_node<M: ApplyManifests>(
    step: &'static str,
    applier: &M,
    node: &str,
    value: &str,
) -> Result<(), BootstrapError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match applier
            .label_node(node, manifests::NODE_BINARIES_LABEL, value)
            .await
        {
            Ok(()) => return Ok(()),
            Err(error) if Instant::now() < deadline => {
                info!(step, node, %error, "cannot label the Node yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => {
                return Err(failed(
                    step,
                    message(format!(
                        "labelling Node {node} {}={value}: {error}",
                        manifests::NODE_BINARIES_LABEL,
                    )),
                ));
            }
        }
    }
}

/// The ports [`install_on_servers`] reaches the control-plane VMs through.
pub(super) struct Servers<'a, C: Connect> {
    pub connect: &'a C,
    pub rack: &'a C::Rack,
    pub ports: &'a Ports<C>,
}

/// Copies the build to every running control-plane VM of the cluster (step `reconcile`: they
/// exist once reconcile has run). A VM that cannot be reached is reported and skipped: its
/// Node stays unlabelled, so no controller pod is placed there; re-running bootstrap retries.
pub(super) async fn install_on_servers<C: Connect>(
    servers_at: &Servers<'_, C>,
    spec: &ClusterSpec,
    key: &SshKeyPair,
    built: &Built,
    timeout: Duration,
    tty: bool,
) -> Result<(), BootstrapError> {
    let step = "reconcile";
    let (rack, store) = (servers_at.rack, &servers_at.ports.store);
    // Pins stored when each server was first reached: a server restarted since then (its
    // console no longer shows the first boot's block) is still verified against them.
    let stored = store
        .merge_host_key_pins(&Default::default())
        .await
        .map_err(|e| failed(step, e))?;
    let servers = rack
        .list_instances(&names::instance_prefix(
            &spec.cluster,
            &spec.control_plane.name,
        ))
        .await
        .map_err(|e| rack_failed(step, e))?;
    let mut missed = Vec::new();
    for server in servers.iter().filter(|i| i.state == InstanceState::Running) {
        let result = async {
            let ips = rack
                .instance_external_ips(&server.name)
                .await
                .map_err(|e| rack_failed(step, e))?;
            let ip = crate::ports::rack::reachable_address(&ips).ok_or_else(|| {
                failed(
                    step,
                    message(format!(
                        "{} has no external address to reach it by",
                        server.name
                    )),
                )
            })?;
            let pins = match stored.get(&server.name) {
                Some(saved) => HostKeyPins::new(saved).map_err(|e| {
                    failed(
                        step,
                        error::context(format!("the stored pin of {}", server.name), e),
                    )
                })?,
                None => {
                    let pins = read_pins(rack, &server.name, Instant::now() + timeout, tty).await?;
                    let new = BTreeMap::from([(
                        server.name.clone(),
                        pins.fingerprints().map(str::to_owned).collect(),
                    )]);
                    store
                        .merge_host_key_pins(&new)
                        .await
                        .map_err(|e| failed(step, e))?;
                    pins
                }
            };
            let addr = SocketAddr::new(ip, spec.nodes.ssh_port);
            let target = servers_at
                .connect
                .shell(addr, &spec.nodes.ssh_user, key.clone(), pins);
            let applier = &servers_at.ports.manifests;
            install_on(step, &target, addr, &server.name, built, applier).await
        }
        .await;
        if let Err(e) = result {
            warn!(step, node = %server.name, error = %error::chain(&e), "the controller binaries are not on this control-plane VM; no controller pod will run there (re-run bootstrap to retry)");
            missed.push(server.name.clone());
        }
    }
    if !missed.is_empty() {
        warn!(
            step,
            missed = %missed.join(","),
            "some control-plane VMs lack the dev binaries"
        );
    }
    Ok(())
}
