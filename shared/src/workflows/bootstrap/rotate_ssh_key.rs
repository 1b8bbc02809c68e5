//! `bootstrap rotate-ssh-key`: a new SSH key pair for the controller, on every node it can
//! reach, the old one off them (audit security-2 N1: an older controller kept the private key
//! in the cluster's Secret, so it is in etcd snapshots and may be in backups).
//!
//! 1. `validate` — the resume file and the credentials;
//! 2. `key` — the new pair: the one a run cut short left in the resume file, else a new one
//!    saved there (beside the old one, which stays the controller's) before any node sees it;
//! 3. `secret` — the Secret's `ssh-public-key` set to the new key, so every VM created from
//!    now on (a replacement, a scale-up) authorizes it in its user-data;
//! 4. `nodes` — on each running node of the cluster with an address this machine reaches
//!    (host keys pinned as for `recover`): the new key added to the login user's
//!    `authorized_keys` (written as that user, into a temporary file moved into place), a
//!    login with the new key proven, the old key removed, a login with the old key proven
//!    refused. A node that already refuses the old key and accepts the new one is done. A node
//!    without such an address, or not running, is reported, never guessed at;
//! 5. `finish` — once every node reached is done: the new pair becomes the controller's in the
//!    resume file and the old one is dropped (one atomic write).
//!
//! A failure on a node stops the run before the resume file changes: the old key still logs in
//! wherever it was not yet removed, both keys are in the resume file, and the next run goes on
//! from where this one stopped (each step checks what is there first). cloud-init adds the
//! user-data's keys once per instance, so a reboot does not bring the old key back.

use std::net::SocketAddr;

use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn};

use super::backup::BackupInput;
use super::recover::{self, Local, Validated, rack_failed};
use super::{BootstrapError, Connect};
use crate::adapters::resume;
use crate::adapters::ssh::{self, HostKeyPins, RemoteShell, SshError, SshKeyPair};
use crate::base::names::{self, InstanceTag};
use crate::domain::authorized_keys;
use crate::domain::model::InstanceState;
use crate::ports::rack::Rack;
use crate::ports::state::StateStore as _;
use crate::workflows::error::{self, message};

/// What a rotation did.
#[derive(Debug, Clone, Serialize)]
pub struct RotateSummary {
    pub cluster: String,
    /// `SHA256:` fingerprints of the key the nodes trusted, and of the one they trust now.
    pub old_key: String,
    pub new_key: String,
    /// Nodes now trusting the new key only (this run or an earlier one).
    pub rotated: Vec<String>,
    /// Nodes this machine could not reach, and why: they still accept the old key.
    pub not_reached: Vec<(String, String)>,
}

impl RotateSummary {
    /// What the person reads on stdout.
    pub fn render(&self) -> String {
        let mut s = format!(
            "The controller's SSH key of cluster {} is now {} (was {}); the resume file holds only the new one, and new VMs get it from the Secret.\n",
            self.cluster, self.new_key, self.old_key
        );
        s.push_str(&format!(
            "Rotated ({}): {}.\n",
            self.rotated.len(),
            if self.rotated.is_empty() {
                "none".to_owned()
            } else {
                self.rotated.join(", ")
            }
        ));
        for (node, why) in &self.not_reached {
            s.push_str(&format!(
                "Not reached: {node} ({why}); it still accepts the old key (which this machine no longer holds): replace it (delete the instance; the reconcile creates a replacement that authorizes the new key).\n"
            ));
        }
        s
    }
}

/// A node as the rotation found it.
enum Node {
    Rotated,
    NotReached(String),
}

/// Runs the whole flow (see the module docs).
pub async fn run<C: Connect>(
    input: BackupInput,
    connect: &C,
) -> Result<RotateSummary, BootstrapError> {
    let deadline = Instant::now() + input.timeout;
    let mut v = recover::validate_local(&Local {
        credential_sources: &input.credential_sources,
        cluster: &input.cluster,
        project: input.project.as_deref(),
        kubeconfig: input.kubeconfig.as_deref(),
        state_dir: input.state_dir.as_deref(),
        home: input.home.as_deref(),
    })?;
    let old = v.resume.key_pair().map_err(|e| bad_resume(&v, e))?;
    let old_line = v.resume.ssh_public_key.clone();
    let (new, made) = v
        .resume
        .begin_ssh_key_rotation()
        .map_err(|e| bad_resume(&v, e))?;
    let new_line = v.resume.ssh_next_public_key.clone().unwrap_or_default();
    if made {
        resume::save(&v.resume_path, &v.resume).map_err(|e| BootstrapError::step("key", e))?;
        info!(step = "key", new = %new.fingerprint(), "a new key pair, saved in the resume file beside the old one");
    } else {
        info!(step = "key", new = %new.fingerprint(), "going on with the key pair an earlier run began");
    }
    set_secret(connect, &v, &input.cluster, &new_line).await?;
    let rack = connect
        .rack(&v.host, &v.token, &v.project)
        .map_err(BootstrapError::inputs)?;
    let keys = Keys {
        old: &old,
        old_line: &old_line,
        new: &new,
        new_line: &new_line,
    };
    let mut summary = RotateSummary {
        cluster: input.cluster.clone(),
        old_key: old.fingerprint(),
        new_key: new.fingerprint(),
        rotated: Vec::new(),
        not_reached: Vec::new(),
    };
    for (node, state) in nodes(&rack, &input.cluster).await? {
        let outcome = if state == InstanceState::Running {
            rotate_node(connect, &rack, &mut v, &node, &keys, deadline).await?
        } else {
            Node::NotReached(format!("{state:?}, not running"))
        };
        match outcome {
            Node::Rotated => summary.rotated.push(node),
            Node::NotReached(why) => {
                warn!(step = "nodes", %node, %why, "not reached: it still accepts the old key");
                summary.not_reached.push((node, why));
            }
        }
    }
    v.resume.finish_ssh_key_rotation();
    resume::save(&v.resume_path, &v.resume).map_err(|e| BootstrapError::step("finish", e))?;
    info!(
        step = "finish",
        rotated = summary.rotated.len(),
        not_reached = summary.not_reached.len(),
        "the new key is the controller's"
    );
    Ok(summary)
}

fn bad_resume(v: &Validated, e: resume::ResumeError) -> BootstrapError {
    BootstrapError::needs_person(
        "key",
        error::context(format!("the resume file {}", v.resume_path.display()), e),
    )
}

/// Step `secret`: the Secret's `ssh-public-key` becomes `line`.
async fn set_secret<C: Connect>(
    connect: &C,
    v: &Validated,
    cluster: &str,
    line: &str,
) -> Result<(), BootstrapError> {
    let step = "secret";
    let ports = connect
        .in_cluster(&v.kubeconfig, cluster, "bootstrap-rotate-ssh-key")
        .await
        .map_err(|e| {
            BootstrapError::step(
                step,
                message(format!(
                    "cannot reach the cluster's API to set the Secret's ssh-public-key ({}); nothing on the nodes changed yet: run bootstrap recover first if the API is down",
                    error::chain(e.as_ref())
                )),
            )
        })?;
    ports
        .store
        .set_ssh_public_key(line)
        .await
        .map_err(|e| BootstrapError::step(step, e))?;
    info!(
        step,
        "the Secret's ssh-public-key is the new key: new VMs authorize it"
    );
    Ok(())
}

/// The cluster's instances (every pool) and their states, by name.
async fn nodes<R: Rack>(
    rack: &R,
    cluster: &str,
) -> Result<Vec<(String, InstanceState)>, BootstrapError> {
    let listed = rack
        .list_instances(&names::cluster_prefix(cluster))
        .await
        .map_err(|e| rack_failed("nodes", e))?;
    let mut out: Vec<(String, InstanceState)> = listed
        .into_iter()
        .filter(|i| InstanceTag::parse(&i.description).is_some_and(|t| t.cluster == cluster))
        .filter(|i| i.state != InstanceState::Destroyed)
        .map(|i| (i.name, i.state))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The two key pairs and their `authorized_keys` lines.
struct Keys<'a> {
    old: &'a SshKeyPair,
    old_line: &'a str,
    new: &'a SshKeyPair,
    new_line: &'a str,
}

/// Step `nodes` on one node (see the module docs). `Err` stops the run: the node was reached
/// but did not end up trusting the new key only.
async fn rotate_node<C: Connect>(
    connect: &C,
    rack: &C::Rack,
    v: &mut Validated,
    node: &str,
    keys: &Keys<'_>,
    deadline: Instant,
) -> Result<Node, BootstrapError> {
    let step = "nodes";
    let ips = rack
        .instance_external_ips(node)
        .await
        .map_err(|e| rack_failed(step, e))?;
    let Some(ip) = crate::ports::rack::reachable_address(&ips) else {
        return Ok(Node::NotReached(
            "no external or floating address this machine reaches".to_owned(),
        ));
    };
    let pins = match super::host_key_pins(
        rack,
        &v.resume_path,
        &mut v.resume,
        node,
        deadline,
        false,
    )
    .await
    {
        Ok((pins, _)) => pins,
        Err(e) => return Ok(Node::NotReached(format!("host key: {}", error::chain(&e)))),
    };
    let addr = SocketAddr::new(ip, v.ssh_port);
    let shell =
        |key: &SshKeyPair| connect.shell(addr, &v.ssh_user, key.clone(), HostKeyPins::clone(&pins));
    let (old, new) = (shell(keys.old), shell(keys.new));
    let path = authorized_keys::path(&v.ssh_user);
    let failed = |what: String| {
        BootstrapError::step(
            step,
            message(format!(
                "{node}: {what}; run `bootstrap rotate-ssh-key` again (the resume file keeps both keys)"
            )),
        )
    };
    let via = match logs_in(&old).await {
        Ok(true) => &old,
        Ok(false) => match logs_in(&new).await {
            Ok(true) => &new,
            Ok(false) => return Ok(Node::NotReached("it refuses both keys".to_owned())),
            Err(e) => return Ok(Node::NotReached(e)),
        },
        Err(e) => return Ok(Node::NotReached(e)),
    };
    let content = read(via, &path).await.map_err(&failed)?;
    let added = authorized_keys::with_key(&content, keys.new_line);
    if added != content {
        write(via, &path, &added).await.map_err(&failed)?;
    }
    if !logs_in(&new).await.map_err(&failed)? {
        return Err(failed(format!(
            "{path} holds the new key but a login with it is refused; the old key was left in place"
        )));
    }
    let content = read(&new, &path).await.map_err(&failed)?;
    let removed = authorized_keys::without_key(&content, keys.old_line);
    if removed != content {
        write(&new, &path, &removed).await.map_err(&failed)?;
    }
    if logs_in(&old).await.map_err(&failed)? {
        return Err(failed(format!(
            "the old key {} still logs in after it left {path} (is it authorized elsewhere, e.g. authorized_keys2?)",
            keys.old.fingerprint()
        )));
    }
    info!(step, %node, "rotated: the new key logs in, the old one is refused");
    Ok(Node::Rotated)
}

/// Whether a login with the shell's key succeeds (`true` runs): `Ok(false)` when the key is
/// refused, `Err` when the node could not be asked.
async fn logs_in<S: RemoteShell>(shell: &S) -> Result<bool, String> {
    match shell.exec("true").await {
        Ok(out) => Ok(out.success()),
        Err(SshError::AuthRejected { .. }) => Ok(false),
        Err(e) => Err(error::chain(&e)),
    }
}

/// The login user's own file, read as that user.
async fn read<S: RemoteShell>(shell: &S, path: &str) -> Result<String, String> {
    let out = shell
        .exec(&format!("cat {}", ssh::shell_quote(path)))
        .await
        .map_err(|e| error::chain(&e))?;
    if !out.success() {
        return Err(format!(
            "cannot read {path}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| format!("{path} is not UTF-8"))
}

/// The login user's own file replaced, as that user, mode 0600, in one rename.
async fn write<S: RemoteShell>(shell: &S, path: &str, content: &str) -> Result<(), String> {
    shell
        .replace_own_file(path, content.as_bytes(), 0o600)
        .await
        .map_err(|e| error::chain(&e))
}
