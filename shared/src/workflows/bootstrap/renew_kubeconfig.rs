//! `bootstrap kubeconfig`: a new client certificate for the laptop's kubeconfig (issue 46
//! item 2). The one bootstrap wrote is `k3s.yaml`'s as a server had it then, valid a year.
//! Two ways, chosen by [`operator_credential::choose`] (`--via auto|csr|ssh`):
//!
//! - **CSR**, while the kubeconfig's certificate is valid: a fresh key and a
//!   CertificateSigningRequest for `kubernetes.io/kube-apiserver-client`, approved with the
//!   current credential and signed by kube-controller-manager; the new certificate names
//!   [`operator_credential::operator_user`], bound to `cluster-admin` (the apiserver refuses
//!   such requests for `system:masters`). Needs neither the rack nor SSH.
//!   1. `csr` — binding ensured, request created, approved, signed, deleted;
//!   2. `write-kubeconfig` — this cluster's user gets the new key and certificate.
//! - **SSH**, when it has ended (or, with `auto`, when the CSR way fails): the current
//!   `k3s.yaml` read over SSH — the resume file's key, the pinned host keys — which works
//!   whether or not the old certificate still does. Each k3s start within 90 days of its end
//!   renews that server's `k3s.yaml` (and the reconcile restarts servers for that, see
//!   [`crate::domain::certificates`]).
//!   1. `validate` — the resume file, the credentials;
//!   2. `server` — the server holding the API floating IP, host keys pinned as for recover;
//!   3. `fetch-kubeconfig` — `k3s.yaml` over SSH;
//!   4. `write-kubeconfig` — this cluster's context, cluster and user replaced, the rest kept.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{BootstrapError, Connect, K3S_KUBECONFIG_PATH, failed};
use crate::adapters::client_csr;
use crate::adapters::kubeconfig::{self, Existing, WriteMode, WriteOutcome};
use crate::adapters::ssh::RemoteShell;
use crate::domain::operator_credential::{self as op, Route, Via};
use crate::workflows::error;

/// Everything `bootstrap kubeconfig` is told, unchecked: what `bootstrap backup` is (the
/// cluster's local files and the rack's credentials), and the way to take.
#[derive(Debug, Clone)]
pub struct KubeconfigInput {
    pub files: super::backup::BackupInput,
    pub via: Via,
}

/// How long the CSR way waits for kube-controller-manager to sign (it signs within a second
/// when it runs with the signer's CA; the run's own deadline may be shorter).
pub const SIGNER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What it did.
#[derive(Debug, Clone, Serialize)]
pub struct KubeconfigSummary {
    pub cluster: String,
    pub path: std::path::PathBuf,
    pub server: String,
    /// Where the certificate came from: the CSR API, or a server's `k3s.yaml` over SSH.
    pub from: String,
    /// The new client certificate's end.
    pub ends: Option<DateTime<Utc>>,
    pub unchanged: bool,
}

impl KubeconfigSummary {
    pub fn render(&self) -> String {
        let ends = self.ends.map_or_else(
            || "an unreadable end".to_owned(),
            |t| format!("a client certificate valid until {t}"),
        );
        format!(
            "{} context {} in {} ({}): {ends}, {}.\n",
            if self.unchanged {
                "Already current:"
            } else {
                "Renewed"
            },
            self.cluster,
            self.path.display(),
            self.server,
            self.from
        )
    }
}

/// Runs the whole flow (see the module docs).
pub async fn run<C: Connect>(
    input: KubeconfigInput,
    connect: &C,
) -> Result<KubeconfigSummary, BootstrapError> {
    let deadline = Instant::now() + input.files.timeout;
    let cluster = input.files.cluster.clone();
    crate::base::names::validate_name("cluster name", &cluster)
        .map_err(|e| BootstrapError::input("--cluster", e))?;
    let path = crate::workflows::local::local_paths(
        &cluster,
        input.files.state_dir.as_deref(),
        input.files.kubeconfig.as_deref(),
        input.files.home.as_deref(),
    )?
    .kubeconfig;
    let current = std::fs::read_to_string(&path).ok();
    let ends = current
        .as_deref()
        .and_then(|t| kubeconfig::context_certificate_end(t, Some(&cluster)))
        .map(|(_, end)| end);
    let route = op::choose(input.via, &cluster, ends, Utc::now())
        .map_err(|e| BootstrapError::input("--via", e))?;
    let reason = match (route, current) {
        (Route::Csr, Some(text)) => {
            match via_csr(connect, &cluster, &path, &text, deadline).await {
                Ok(summary) => return Ok(summary),
                Err(e) if op::falls_back(input.via) => {
                    let reason = format!("the CSR way failed: {e:#}");
                    warn!(step = "csr", error = %format!("{e:#}"), "renewing over SSH instead");
                    reason
                }
                Err(e) => return Err(e),
            }
        }
        // `choose` takes the CSR way only for a certificate it read from the file.
        (Route::Csr, None) => "the kubeconfig is unreadable".to_owned(),
        (Route::Ssh { reason }, _) => reason,
    };
    info!(step = "validate", %reason, "renewing over SSH");
    via_ssh(&input.files, connect, deadline).await
}

/// The CSR way (steps `csr`, `write-kubeconfig`), with the credential in `text` (the
/// kubeconfig at `path`).
async fn via_csr<C: Connect>(
    connect: &C,
    cluster: &str,
    path: &std::path::Path,
    text: &str,
    deadline: Instant,
) -> Result<KubeconfigSummary, BootstrapError> {
    let step = "csr";
    let user = op::operator_user(cluster);
    let name = op::request_name(cluster, Utc::now());
    let request = client_csr::new_request(&user, None).map_err(|e| failed(step, e))?;
    let wait = SIGNER_WAIT.min(deadline.saturating_duration_since(Instant::now()));
    let cert = tokio::time::timeout_at(
        deadline,
        connect.client_certificate(path, cluster, &user, &name, &request, wait),
    )
    .await
    .map_err(|_| {
        failed(
            step,
            error::message("asking for a certificate did not finish in time"),
        )
    })?
    .map_err(|e| failed(step, e))?;
    let step = "write-kubeconfig";
    let url = match kubeconfig::inspect(path, cluster) {
        Ok(Existing::Ours {
            server: Some(found),
        }) => found,
        _ => {
            return Err(failed(
                step,
                error::message(format!(
                    "{} has no server for context {cluster}",
                    path.display()
                )),
            ));
        }
    };
    let ours = kubeconfig::with_client_credential(text, cluster, &cert, &request.key_pem)
        .map_err(|e| failed(step, e))?;
    let summary = write(
        path,
        cluster,
        &url,
        &ours,
        format!("through the CertificateSigningRequest API as {user} (request {name}, deleted)"),
    )?;
    Ok(summary)
}

/// The SSH way (steps `validate` to `write-kubeconfig` of the module docs).
async fn via_ssh<C: Connect>(
    input: &super::backup::BackupInput,
    connect: &C,
    deadline: Instant,
) -> Result<KubeconfigSummary, BootstrapError> {
    let super::backup::OnApiServer {
        v,
        server,
        ip,
        shell,
        ..
    } = super::backup::on_api_server(input, connect, deadline, "reading k3s.yaml").await?;
    let step = "fetch-kubeconfig";
    let bytes = tokio::time::timeout_at(deadline, shell.read_file(K3S_KUBECONFIG_PATH))
        .await
        .map_err(|_| {
            failed(
                step,
                error::message(format!(
                    "reading {K3S_KUBECONFIG_PATH} on {server} did not finish in time"
                )),
            )
        })?
        .map_err(|e| failed(step, e))?;
    let k3s_yaml = String::from_utf8(bytes).map_err(|e| {
        failed(
            step,
            error::context(format!("{K3S_KUBECONFIG_PATH} is not UTF-8"), e),
        )
    })?;

    // The server this cluster's entry already names (the address bootstrap chose), else the
    // API floating IP's.
    let step = "write-kubeconfig";
    let url = match kubeconfig::inspect(&v.kubeconfig, &input.cluster) {
        Ok(Existing::Ours {
            server: Some(found),
        }) => found,
        _ => crate::domain::spec::server_url(ip),
    };
    let ours =
        kubeconfig::rewrite_k3s(&k3s_yaml, &input.cluster, &url).map_err(|e| failed(step, e))?;
    write(
        &v.kubeconfig,
        &input.cluster,
        &url,
        &ours,
        format!("from {server}'s k3s.yaml over SSH"),
    )
}

/// Step `write-kubeconfig`: `ours` (one cluster's entries) merged into the kubeconfig at
/// `path`, the same way whichever way the certificate came.
fn write(
    path: &std::path::Path,
    cluster: &str,
    url: &str,
    ours: &str,
    from: String,
) -> Result<KubeconfigSummary, BootstrapError> {
    let step = "write-kubeconfig";
    let ends = kubeconfig::client_certificate_end(ours);
    let outcome = kubeconfig::write(path, ours, cluster, url, WriteMode::Merge)
        .map_err(|e| failed(step, e))?;
    info!(step, path = %path.display(), ?outcome, ?ends, %from, "kubeconfig written");
    Ok(KubeconfigSummary {
        cluster: cluster.to_owned(),
        path: path.to_owned(),
        server: url.to_owned(),
        from,
        ends,
        unchanged: outcome == WriteOutcome::Unchanged,
    })
}
