//! Building the `kube::Client` every Kubernetes adapter uses: from an explicit kubeconfig file,
//! or inferred (in-cluster ServiceAccount, then `$KUBECONFIG` / `~/.kube/config`), always with
//! timeouts. Only client construction lives here; API calls belong to the adapters
//! (`kube_cluster`, `kube_store`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Time allowed to open a connection to the API server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for the API server to answer one request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Time allowed to send one request.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("cannot read kubeconfig {}; check --kubeconfig", path.display())]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("kubeconfig {} is unusable (context {context})", path.display())]
    LoadKubeconfig {
        path: PathBuf,
        context: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(
        "no Kubernetes configuration found: not running in a cluster and no usable $KUBECONFIG or ~/.kube/config; pass --kubeconfig"
    )]
    Infer {
        #[source]
        source: kube::config::InferConfigError,
    },
    #[error(
        "the default kubeconfig ($KUBECONFIG or ~/.kube/config) is unusable (context {context})"
    )]
    LoadDefault {
        context: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build a Kubernetes client for {server}")]
    Build {
        server: String,
        #[source]
        source: kube::Error,
    },
}

/// A client for the cluster named by `kubeconfig` (and `context`, else its current context),
/// or, without a path, the inferred one: in-cluster config or `$KUBECONFIG` / `~/.kube/config`.
///
/// The client has connect/read/write timeouts and **no** built-in retry layer: kube's default
/// layer retries 429 and 503 up to 15 times with growing delays, which would hide an eviction
/// refused by a PodDisruptionBudget (429) for minutes. Callers retry with their own bounded
/// policy ([`crate::base::retry`]) where a retry makes sense.
pub async fn client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, KubeClientError> {
    client_from_config(config(kubeconfig, context).await?)
}

/// A client certificate this close to its end is warned about (issue 46 item 2).
pub const CERTIFICATE_WARNING: chrono::Duration = chrono::Duration::days(30);

/// Warns when the client certificate of `context` (or the current one) in the kubeconfig at
/// `path` ends within [`CERTIFICATE_WARNING`], naming the command that renews it.
fn warn_if_ending(path: &Path, context: Option<&str>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let Some((name, end)) = crate::adapters::kubeconfig::context_certificate_end(&text, context)
    else {
        return;
    };
    let left = end - chrono::Utc::now();
    if left <= CERTIFICATE_WARNING {
        let when = if left <= chrono::Duration::zero() {
            "has ended".to_owned()
        } else {
            format!("ends in {} days", left.num_days())
        };
        tracing::warn!(
            kubeconfig = %path.display(),
            context = %name,
            ends = %end,
            "the kubeconfig's client certificate {when}: renew it with `bootstrap kubeconfig --cluster {name}`"
        );
    }
}

/// The configuration [`client`] builds its client from (for clients of one server's
/// apiserver with the same credentials: [`crate::adapters::kube_cluster::KubeCluster::with_server_config`]).
pub async fn config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Config, KubeClientError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let context_name = context.unwrap_or("current-context").to_owned();
    let config = match kubeconfig {
        Some(path) => {
            let file =
                Kubeconfig::read_from(path).map_err(|source| KubeClientError::ReadKubeconfig {
                    path: path.to_owned(),
                    source,
                })?;
            warn_if_ending(path, context);
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|source| KubeClientError::LoadKubeconfig {
                    path: path.to_owned(),
                    context: context_name,
                    source,
                })?
        }
        // An explicit context only makes sense for a kubeconfig file, so skip in-cluster.
        None if context.is_some() => {
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|source| KubeClientError::LoadDefault {
                    context: context_name,
                    source,
                })?
        }
        None => kube::Config::infer()
            .await
            .map_err(|source| KubeClientError::Infer { source })?,
    };
    // A kubeconfig found the default way ($KUBECONFIG's first file, else ~/.kube/config);
    // in a pod (a ServiceAccount token) there is none.
    if kubeconfig.is_none()
        && let Some(path) = default_kubeconfig()
    {
        warn_if_ending(&path, context);
    }
    Ok(config)
}

/// Where kubectl looks without `--kubeconfig`: the first file of `$KUBECONFIG`, else
/// `~/.kube/config`; None when that file does not exist.
fn default_kubeconfig() -> Option<std::path::PathBuf> {
    let path = match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(list) => std::env::split_paths(&list).next()?,
        None => std::env::home_dir()?.join(".kube").join("config"),
    };
    path.is_file().then_some(path)
}

/// A client from a ready [`kube::Config`], with this module's timeouts and without kube's
/// retry layer (see [`client`]).
pub fn client_from_config(mut config: kube::Config) -> Result<kube::Client, KubeClientError> {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    // Count the read timeout from when the request was sent, not from when a pooled
    // connection went idle.
    config.reset_reader_on_write = true;
    config.default_retry = false;
    let server = config.cluster_url.to_string();
    kube::Client::try_from(config).map_err(|source| KubeClientError::Build { server, source })
}

/// Whether a failed request may still have been carried out: a 5xx (the apiserver's 504
/// "may still be processing the request", a 500 after the write) or no answer at all (a
/// timeout, a dropped connection). 4xx answers are refusals: nothing happened.
pub fn outcome_unknown(err: &kube::Error) -> bool {
    api_status(err).is_none_or(|code| code >= 500)
}

/// The HTTP status of a failed API call, when the server answered (kube reports every 4xx/5xx
/// answer as `kube::Error::Api`); `None` for transport trouble (connect, TLS, timeouts).
pub fn api_status(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The server's message of a failed API call, or the error's own text for transport trouble.
pub fn api_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// Asks the API at context `context` of the kubeconfig at `kubeconfig` whether it is ready, as
/// its administrator: `GET /readyz`, which runs the apiserver's etcd check. An unauthenticated
/// probe stops at authentication (401) and so cannot tell an API that lost its datastore from
/// a healthy one. `Err` says why it is not ready (its checks' report, or the failure to ask).
pub async fn readyz(kubeconfig: &Path, context: &str) -> Result<(), String> {
    let client = client(Some(kubeconfig), Some(context))
        .await
        .map_err(|e| e.to_string())?;
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(CONNECT_TIMEOUT, client.request_text(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(kube::Error::Api(s))) => Err(format!("HTTP {}: {}", s.code, s.message.trim())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {}s", CONNECT_TIMEOUT.as_secs())),
    }
}

/// The kinds [`object_count`] counts (see the domain's definition).
pub use crate::domain::backup::COUNTED_KINDS;

/// How many objects of [`COUNTED_KINDS`] the cluster holds, all namespaces, as its
/// administrator through context `context` of `kubeconfig` (a backup's manifest records it; a
/// restore drill compares); with `before`, only those created before it (see
/// [`count_objects`]).
pub async fn object_count(
    kubeconfig: &Path,
    context: &str,
    before: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<u64, String> {
    let client = client(Some(kubeconfig), Some(context))
        .await
        .map_err(|e| e.to_string())?;
    count_objects(&client, before).await
}

/// [`object_count`] through `client` (the in-cluster backup's own: its ServiceAccount may list
/// the [`COUNTED_KINDS`], `k8s-cronjobs/backup.yaml`). With `before` (the snapshot's time), an
/// object created at or after it is not counted: the snapshot cannot hold it, so a restore
/// cannot bring it back ([`crate::domain::backup::created_before`]).
pub async fn count_objects(
    client: &kube::Client,
    before: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<u64, String> {
    let mut total = 0u64;
    for kind in COUNTED_KINDS {
        // Names only: a list of metadata, not of Secrets' data.
        let req = http::Request::get(format!("/api/v1/{kind}?limit=0"))
            .header(
                "Accept",
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            )
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let list: serde_json::Value =
            match tokio::time::timeout(CONNECT_TIMEOUT * 4, client.request(req)).await {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => return Err(format!("listing {kind}: {e}")),
                Err(_) => return Err(format!("listing {kind}: no answer in time")),
            };
        total += list["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .filter(|i| {
                    crate::domain::backup::created_before(
                        i["metadata"]["creationTimestamp"].as_str(),
                        before,
                    )
                })
                .count() as u64
        });
    }
    Ok(total)
}

/// The line a run from a laptop (`kubeconfig` given) ends with when the cluster's API is not
/// ready: it names `bootstrap recover`, whose context is the cluster's name in the kubeconfig
/// bootstrap writes. `None` without a kubeconfig (a pod) or when the API is ready.
pub async fn recover_hint(kubeconfig: Option<&Path>, context: Option<&str>) -> Option<String> {
    let path = kubeconfig?;
    let context = match context {
        Some(c) => c.to_owned(),
        None => Kubeconfig::read_from(path).ok()?.current_context?,
    };
    let why = readyz(path, &context).await.err()?;
    Some(format!(
        "the cluster's API is not ready ({why}); if its servers are lost, see what would bring it back: bootstrap recover --cluster {context} --dry-run"
    ))
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nope.yaml");
        let Err(err) = client(Some(&path), None).await else {
            panic!("a missing file must fail")
        };
        assert!(
            matches!(err, KubeClientError::ReadKubeconfig { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("nope.yaml"), "{err}");
    }

    #[tokio::test]
    async fn an_unknown_context_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: a\n  context:\n    cluster: c\n    user: u\n\
             current-context: a\n",
        )
        .expect("write");
        let Err(err) = client(Some(&path), Some("missing")).await else {
            panic!("an unknown context must fail")
        };
        assert!(err.to_string().contains("missing"), "{err}");
        // The current context works and points where the file says.
        let ok = client(Some(&path), None).await.expect("client");
        assert_eq!(ok.default_namespace(), "default");
    }
}
