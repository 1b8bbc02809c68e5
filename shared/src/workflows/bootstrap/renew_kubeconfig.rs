//! `bootstrap kubeconfig`: a new client certificate for the laptop's kubeconfig (issue 46
//! item 2). The one bootstrap wrote is `k3s.yaml`'s as a server had it then, valid a year;
//! each k3s start within 90 days of its end renews that server's `k3s.yaml` (and the reconcile
//! restarts servers for that, see [`crate::domain::certificates`]). This reads the current one
//! over SSH — the resume file's key, the pinned host keys — which works whether or not the old
//! certificate still does, and writes it into the kubeconfig in place of this cluster's entry.
//!
//! 1. `validate` — the resume file, the credentials;
//! 2. `server` — the server holding the API floating IP, host keys pinned as for recover;
//! 3. `fetch-kubeconfig` — `k3s.yaml` over SSH;
//! 4. `write-kubeconfig` — this cluster's context, cluster and user replaced, the rest kept.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::Instant;
use tracing::info;

use super::{BootstrapError, Connect, K3S_KUBECONFIG_PATH, failed};
use crate::adapters::kubeconfig::{self, Existing, WriteMode, WriteOutcome};
use crate::adapters::ssh::RemoteShell;
use crate::workflows::error;

/// Everything `bootstrap kubeconfig` is told, unchecked: what `bootstrap backup` is (the
/// cluster's local files and the rack's credentials).
pub type KubeconfigInput = super::backup::BackupInput;

/// What it did.
#[derive(Debug, Clone, Serialize)]
pub struct KubeconfigSummary {
    pub cluster: String,
    pub path: std::path::PathBuf,
    pub server: String,
    /// The server `k3s.yaml` came from.
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
            "{} context {} in {} ({}): {ends}, from {}'s k3s.yaml.\n",
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
    let deadline = Instant::now() + input.timeout;
    let super::backup::OnApiServer {
        v,
        server,
        ip,
        shell,
        ..
    } = super::backup::on_api_server(&input, connect, deadline, "reading k3s.yaml").await?;
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
    let ends = kubeconfig::client_certificate_end(&ours);
    let outcome = kubeconfig::write(&v.kubeconfig, &ours, &input.cluster, &url, WriteMode::Merge)
        .map_err(|e| failed(step, e))?;
    info!(step, path = %v.kubeconfig.display(), ?outcome, ?ends, "kubeconfig written");
    Ok(KubeconfigSummary {
        cluster: input.cluster,
        path: v.kubeconfig,
        server: url,
        from: server,
        ends,
        unchanged: outcome == WriteOutcome::Unchanged,
    })
}
