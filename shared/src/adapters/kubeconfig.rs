//! The kubeconfig bootstrap hands to the person: k3s's `/etc/rancher/k3s/k3s.yaml` with its
//! server rewritten to the API floating IP and its `default` cluster, user and context renamed
//! to the cluster name, written with mode 0600.
//!
//! Owns the rewrite, the decision whether an existing file may be touched (never clobbered
//! without `--kubeconfig-overwrite`; `--kubeconfig-merge` adds or replaces this cluster's
//! entries and keeps the others), and the write itself. Not here: fetching k3s.yaml (SSH) or
//! building a client from the file ([`crate::adapters::kubeclient`]). Error messages never quote the
//! file (it holds client keys).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Kubeconfig trouble.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("the kubeconfig from k3s is not what k3s writes: {0}")]
    Malformed(String),
    #[error(
        "{} already exists and is not this cluster's kubeconfig; pass --kubeconfig-overwrite to replace it, --kubeconfig-merge to add the cluster to it, or another --kubeconfig",
        path.display()
    )]
    Exists { path: PathBuf },
    #[error(
        "{} already has context {cluster:?} pointing at {found}, not {server}; pass --kubeconfig-overwrite or --kubeconfig-merge to update it",
        path.display()
    )]
    OtherServer {
        path: PathBuf,
        cluster: String,
        found: String,
        server: String,
    },
    #[error("{} is not a kubeconfig this tool can merge into: {message}", path.display())]
    Unmergeable { path: PathBuf, message: String },
    #[error("cannot read {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("cannot write {}: {message}", path.display())]
    Write { path: PathBuf, message: String },
}

/// What to do when the target file exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Only if absent (or already this cluster's, pointing at the same server: then untouched).
    Create,
    /// Replace the file.
    Overwrite,
    /// Add or replace this cluster's entries, keep the rest.
    Merge,
}

/// What [`write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Created,
    Replaced,
    Merged,
    /// The file already held this cluster's entries for this server.
    Unchanged,
}

/// What is at the target path now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    Absent,
    /// A kubeconfig with a context named after the cluster; its cluster's server.
    Ours {
        server: Option<String>,
    },
    /// Anything else: another kubeconfig, or not a kubeconfig.
    Foreign,
}

fn parse(text: &str) -> Result<Value, String> {
    let v: Value = serde_saphyr::from_str(text).map_err(|e| {
        // The parser may quote the offending line; keep only its first line of prose.
        e.to_string()
            .lines()
            .next()
            .unwrap_or("unparseable")
            .to_owned()
    })?;
    if !v.is_object() {
        return Err("not a mapping".into());
    }
    Ok(v)
}

fn render(doc: &Value) -> Result<String, String> {
    serde_saphyr::to_string(doc).map_err(|e| e.to_string())
}

/// k3s's kubeconfig with `server` as the API address and `cluster` as the name of its
/// cluster, user and context (k3s calls all three `default`), `cluster` the current context.
pub fn rewrite_k3s(k3s_yaml: &str, cluster: &str, server: &str) -> Result<String, KubeconfigError> {
    let bad = KubeconfigError::Malformed;
    let mut doc = parse(k3s_yaml).map_err(bad)?;
    for list in ["clusters", "users", "contexts"] {
        let items = doc[list]
            .as_array_mut()
            .ok_or_else(|| KubeconfigError::Malformed(format!("no {list} list")))?;
        if items.len() != 1 {
            return Err(KubeconfigError::Malformed(format!(
                "{} entries in {list}, expected 1",
                items.len()
            )));
        }
        items[0]["name"] = Value::from(cluster);
    }
    doc["clusters"][0]["cluster"]["server"] = Value::from(server);
    doc["contexts"][0]["context"]["cluster"] = Value::from(cluster);
    doc["contexts"][0]["context"]["user"] = Value::from(cluster);
    doc["current-context"] = Value::from(cluster);
    render(&doc).map_err(KubeconfigError::Malformed)
}

/// This cluster's entries of `kubeconfig` (context `cluster`, its cluster and user) as a
/// one-cluster kubeconfig in [`rewrite_k3s`]'s form, its user's client certificate and key
/// replaced by `cert_pem` and `key_pem`: what [`write`] merges in after a renewal through the
/// CSR API, as it merges k3s.yaml after one over SSH.
pub fn with_client_credential(
    kubeconfig: &str,
    cluster: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<String, KubeconfigError> {
    use base64::Engine as _;
    let bad = |what: String| KubeconfigError::Malformed(format!("the current kubeconfig: {what}"));
    let doc = parse(kubeconfig).map_err(bad)?;
    let find = |list: &str, name: &str| {
        doc[list]
            .as_array()
            .and_then(|items| items.iter().find(|i| i["name"] == name))
            .cloned()
            .ok_or_else(|| bad(format!("no {list} entry {name}")))
    };
    let mut context = find("contexts", cluster)?;
    let cluster_name = context["context"]["cluster"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let user_name = context["context"]["user"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut entry = find("clusters", &cluster_name)?;
    let mut user = find("users", &user_name)?;
    for item in [&mut context, &mut entry, &mut user] {
        item["name"] = Value::from(cluster);
    }
    context["context"]["cluster"] = Value::from(cluster);
    context["context"]["user"] = Value::from(cluster);
    let b64 = |pem: &str| Value::from(base64::engine::general_purpose::STANDARD.encode(pem));
    user["user"] = serde_json::json!({
        "client-certificate-data": b64(cert_pem),
        "client-key-data": b64(key_pem),
    });
    let out = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [entry],
        "users": [user],
        "contexts": [context],
        "current-context": cluster,
    });
    render(&out).map_err(KubeconfigError::Malformed)
}

/// A copy of the kubeconfig at `src` whose context `context` points at `server` instead (its
/// credentials unchanged), written to `dest` with mode 0600: how a restore drill reaches its
/// throw-away server as the cluster's administrator.
pub fn copy_with_server(
    src: &Path,
    context: &str,
    server: &str,
    dest: &Path,
) -> Result<(), KubeconfigError> {
    let text = std::fs::read_to_string(src)
        .map_err(|e| KubeconfigError::Malformed(format!("reading {}: {e}", src.display())))?;
    let mut doc = parse(&text).map_err(KubeconfigError::Malformed)?;
    let cluster = doc["contexts"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == context))
        .and_then(|c| c["context"]["cluster"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| KubeconfigError::Malformed(format!("no context {context}")))?;
    let entry = doc["clusters"]
        .as_array_mut()
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == cluster.as_str()))
        .ok_or_else(|| KubeconfigError::Malformed(format!("no cluster {cluster}")))?;
    entry["cluster"]["server"] = Value::from(server);
    doc["current-context"] = Value::from(context);
    let out = render(&doc).map_err(KubeconfigError::Malformed)?;
    // A new file only (O_EXCL, which also refuses a symlink in its place): the mode applies
    // only to a file this call creates.
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts
        .open(dest)
        .map_err(|e| KubeconfigError::Malformed(format!("writing {}: {e}", dest.display())))?;
    std::io::Write::write_all(&mut f, out.as_bytes())
        .map_err(|e| KubeconfigError::Malformed(format!("writing {}: {e}", dest.display())))
}

/// `sha256` (lower-case hex) of the k3s server CA as `certificate-authority-data` carries it,
/// i.e. of the PEM bundle the servers serve at `/cacerts`: the `<hash>` of k3s's full token
/// form `K10<hash>::<user>:<password>`, with which a joining node checks the CA it is shown.
pub fn k3s_ca_hash(k3s_yaml: &str) -> Result<String, KubeconfigError> {
    use base64::Engine as _;
    use sha2::Digest as _;
    let doc = parse(k3s_yaml).map_err(KubeconfigError::Malformed)?;
    let data = doc["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .ok_or_else(|| KubeconfigError::Malformed("no certificate-authority-data".into()))?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|_| {
            KubeconfigError::Malformed("certificate-authority-data is not base64".into())
        })?;
    Ok(sha2::Sha256::digest(&pem)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The server of the cluster that context `name` uses, if the document has that context.
fn context_server(doc: &Value, name: &str) -> Option<Option<String>> {
    let ctx = doc["contexts"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)?;
    let cluster = ctx["context"]["cluster"].as_str().unwrap_or_default();
    Some(
        doc["clusters"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == cluster))
            .and_then(|c| c["cluster"]["server"].as_str())
            .map(str::to_owned),
    )
}

/// Looks at the target path without changing anything (input validation uses this).
pub fn inspect(path: &Path, cluster: &str) -> Result<Existing, KubeconfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Existing::Absent),
        Err(e) => {
            return Err(KubeconfigError::Read {
                path: path.to_owned(),
                message: e.to_string(),
            });
        }
    };
    Ok(
        match parse(&text)
            .ok()
            .and_then(|doc| context_server(&doc, cluster))
        {
            Some(server) => Existing::Ours { server },
            None => Existing::Foreign,
        },
    )
}

/// Whether `mode` may write to `path` at all (before any API call): a foreign file needs
/// `Overwrite` or `Merge`, and `Merge` needs a kubeconfig (or an absent file).
pub fn check_target(
    path: &Path,
    cluster: &str,
    mode: WriteMode,
) -> Result<Existing, KubeconfigError> {
    let existing = inspect(path, cluster)?;
    match (&existing, mode) {
        (Existing::Foreign, WriteMode::Create) => Err(KubeconfigError::Exists {
            path: path.to_owned(),
        }),
        (Existing::Foreign, WriteMode::Merge) => {
            let text = std::fs::read_to_string(path).map_err(|e| KubeconfigError::Read {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            if text.trim().is_empty() {
                return Ok(existing);
            }
            parse(&text)
                .map(drop)
                .map_err(|message| KubeconfigError::Unmergeable {
                    path: path.to_owned(),
                    message,
                })?;
            Ok(existing)
        }
        _ => Ok(existing),
    }
}

/// `ours` (a one-cluster kubeconfig named `cluster`) merged into `existing`: entries named
/// `cluster` are replaced, others kept; the current context is kept unless there is none.
pub fn merge(existing: &str, ours: &str, cluster: &str) -> Result<String, String> {
    let mut doc = if existing.trim().is_empty() {
        serde_json::json!({"apiVersion": "v1", "kind": "Config"})
    } else {
        parse(existing)?
    };
    let ours = parse(ours)?;
    for list in ["clusters", "users", "contexts"] {
        let mut items: Vec<Value> = match &doc[list] {
            Value::Array(a) => a.clone(),
            Value::Null => Vec::new(),
            _ => return Err(format!("{list} is not a list")),
        };
        items.retain(|i| i["name"] != cluster);
        items.extend(ours[list].as_array().cloned().unwrap_or_default());
        doc[list] = Value::Array(items);
    }
    let current = doc["current-context"].as_str().unwrap_or_default();
    if current.is_empty() {
        doc["current-context"] = Value::from(cluster);
    }
    render(&doc)
}

/// Writes `ours` (the output of [`rewrite_k3s`]) to `path` according to `mode`, mode 0600.
pub fn write(
    path: &Path,
    ours: &str,
    cluster: &str,
    server: &str,
    mode: WriteMode,
) -> Result<WriteOutcome, KubeconfigError> {
    let write_err = |e: std::io::Error| KubeconfigError::Write {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let existing = inspect(path, cluster)?;
    let (bytes, outcome) = match (existing, mode) {
        (Existing::Absent, WriteMode::Merge) => (ours.to_owned(), WriteOutcome::Merged),
        (Existing::Absent, _) => (ours.to_owned(), WriteOutcome::Created),
        (_, WriteMode::Overwrite) => (ours.to_owned(), WriteOutcome::Replaced),
        (_, WriteMode::Merge) => {
            let text = std::fs::read_to_string(path).map_err(|e| KubeconfigError::Read {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            let merged =
                merge(&text, ours, cluster).map_err(|message| KubeconfigError::Unmergeable {
                    path: path.to_owned(),
                    message,
                })?;
            if merged == text {
                return Ok(WriteOutcome::Unchanged);
            }
            (merged, WriteOutcome::Merged)
        }
        (Existing::Ours { server: found }, WriteMode::Create) => {
            if found.as_deref() == Some(server) {
                return Ok(WriteOutcome::Unchanged);
            }
            return Err(KubeconfigError::OtherServer {
                path: path.to_owned(),
                cluster: cluster.to_owned(),
                found: found.unwrap_or_else(|| "no server".into()),
                server: server.to_owned(),
            });
        }
        (Existing::Foreign, WriteMode::Create) => {
            return Err(KubeconfigError::Exists {
                path: path.to_owned(),
            });
        }
    };
    crate::adapters::resume::write_private_atomic(path, bytes.as_bytes()).map_err(write_err)?;
    Ok(outcome)
}

/// What [`remove_context`] did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveOutcome {
    /// No file at the path.
    NoFile,
    /// The file has no context named after the cluster.
    NoContext,
    /// The context (and the cluster and user only it used) went; other contexts stay.
    ContextRemoved,
    /// Nothing else was in the file, so the file went.
    FileRemoved,
}

/// Removes what bootstrap wrote for `cluster` from the kubeconfig at `path`: the context named
/// `cluster`, and the cluster and user entries it points at unless another context uses
/// them. A file left with no context, cluster or user is deleted. A file that is not a
/// kubeconfig is left alone (an error).
pub fn remove_context(
    path: &Path,
    cluster: &str,
    dry_run: bool,
) -> Result<RemoveOutcome, KubeconfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RemoveOutcome::NoFile),
        Err(e) => {
            return Err(KubeconfigError::Read {
                path: path.to_owned(),
                message: e.to_string(),
            });
        }
    };
    let unmergeable = |message: String| KubeconfigError::Unmergeable {
        path: path.to_owned(),
        message,
    };
    let mut doc = parse(&text).map_err(unmergeable)?;
    let contexts = doc["contexts"].as_array().cloned().unwrap_or_default();
    let Some(ctx) = contexts.iter().find(|c| c["name"] == cluster).cloned() else {
        return Ok(RemoveOutcome::NoContext);
    };
    let others: Vec<Value> = contexts
        .into_iter()
        .filter(|c| c["name"] != cluster)
        .collect();
    let used = |field: &str, name: &Value| others.iter().any(|c| &c["context"][field] == name);
    for (list, field) in [("clusters", "cluster"), ("users", "user")] {
        let name = ctx["context"][field].clone();
        if used(field, &name) {
            continue;
        }
        if let Some(items) = doc[list].as_array_mut() {
            items.retain(|i| i["name"] != name);
        }
    }
    let empty = |list: &str| doc[list].as_array().is_none_or(Vec::is_empty);
    let outcome = if others.is_empty() && empty("clusters") && empty("users") {
        RemoveOutcome::FileRemoved
    } else {
        RemoveOutcome::ContextRemoved
    };
    if dry_run {
        return Ok(outcome);
    }
    let write_err = |e: std::io::Error| KubeconfigError::Write {
        path: path.to_owned(),
        message: e.to_string(),
    };
    if outcome == RemoveOutcome::FileRemoved {
        std::fs::remove_file(path).map_err(write_err)?;
        return Ok(outcome);
    }
    if doc["current-context"] == cluster {
        doc["current-context"] = others
            .first()
            .map(|c| c["name"].clone())
            .unwrap_or_else(|| Value::from(""));
    }
    doc["contexts"] = Value::Array(others);
    let rendered = render(&doc).map_err(unmergeable)?;
    crate::adapters::resume::write_private_atomic(path, rendered.as_bytes()).map_err(write_err)?;
    Ok(outcome)
}

pub use crate::base::der::certificate_end;

/// The context `context` (else the current one) of a kubeconfig, and the end of its user's
/// client certificate (`client-certificate-data`), when it has one.
pub fn context_certificate_end(
    kubeconfig: &str,
    context: Option<&str>,
) -> Option<(String, chrono::DateTime<chrono::Utc>)> {
    use base64::Engine as _;
    let doc = parse(kubeconfig).ok()?;
    let name = context
        .map(str::to_owned)
        .or_else(|| doc["current-context"].as_str().map(str::to_owned))?;
    let user = doc["contexts"]
        .as_array()?
        .iter()
        .find(|c| c["name"].as_str() == Some(name.as_str()))?["context"]["user"]
        .as_str()?
        .to_owned();
    let data = doc["users"]
        .as_array()?
        .iter()
        .find(|u| u["name"].as_str() == Some(user.as_str()))?["user"]["client-certificate-data"]
        .as_str()?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    Some((name, certificate_end(std::str::from_utf8(&pem).ok()?)?))
}

/// The end of the client certificate `ours` (a kubeconfig [`rewrite_k3s`] wrote) carries.
pub fn client_certificate_end(kubeconfig: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    use base64::Engine as _;
    let doc = parse(kubeconfig).ok()?;
    let data = doc["users"]
        .as_array()?
        .iter()
        .find_map(|u| u["user"]["client-certificate-data"].as_str())?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    certificate_end(std::str::from_utf8(&pem).ok()?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn cert_ending(y: i32, m: u8, d: u8) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.not_after = rcgen::date_time_ymd(y, m, d);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_certificates_end_is_read_in_both_time_encodings() {
        // UTCTime before 2050, GeneralizedTime from 2050 (RFC 5280 4.1.2.5).
        assert_eq!(
            certificate_end(&cert_ending(2031, 5, 6)).map(|t| t.to_rfc3339()),
            Some("2031-05-06T00:00:00+00:00".to_owned())
        );
        assert_eq!(
            certificate_end(&cert_ending(2051, 1, 2)).map(|t| t.to_rfc3339()),
            Some("2051-01-02T00:00:00+00:00".to_owned())
        );
        assert_eq!(certificate_end("not a certificate"), None);
        use base64::Engine as _;
        let kc = K3S.replace(
            "Q0VSVA==",
            &base64::engine::general_purpose::STANDARD.encode(cert_ending(2031, 5, 6)),
        );
        assert_eq!(
            client_certificate_end(&kc).map(|t| t.to_rfc3339()),
            Some("2031-05-06T00:00:00+00:00".to_owned())
        );
    }

    const K3S: &str = "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: Q0E=\n    server: https://127.0.0.1:6443\n  name: default\ncontexts:\n- context:\n    cluster: default\n    user: default\n  name: default\ncurrent-context: default\nkind: Config\npreferences: {}\nusers:\n- name: default\n  user:\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n";
    const SERVER: &str = "https://172.30.0.10:6443";

    fn doc(text: &str) -> Value {
        serde_saphyr::from_str(text).unwrap()
    }

    #[test]
    fn k3s_names_and_server_are_rewritten_and_credentials_kept() {
        let out = doc(&rewrite_k3s(K3S, "demo", SERVER).unwrap());
        assert_eq!(out["current-context"], "demo");
        assert_eq!(out["clusters"][0]["name"], "demo");
        assert_eq!(out["clusters"][0]["cluster"]["server"], SERVER);
        assert_eq!(
            out["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(out["users"][0]["name"], "demo");
        assert_eq!(out["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(
            out["contexts"][0]["context"],
            serde_json::json!({"cluster": "demo", "user": "demo"})
        );
        // kube reads it.
        let kc = kube::config::Kubeconfig::from_yaml(&rewrite_k3s(K3S, "demo", SERVER).unwrap())
            .unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("demo"));
    }

    #[test]
    fn a_csr_renewal_replaces_only_this_clusters_key_and_certificate_through_the_same_merge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        // Another cluster's entries first, then ours as bootstrap wrote it.
        let other = rewrite_k3s(K3S, "other", "https://10.0.0.1:6443").unwrap();
        write(
            &path,
            &other,
            "other",
            "https://10.0.0.1:6443",
            WriteMode::Create,
        )
        .unwrap();
        let ours = rewrite_k3s(K3S, "demo", SERVER).unwrap();
        write(&path, &ours, "demo", SERVER, WriteMode::Merge).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();

        let renewed = with_client_credential(&text, "demo", "NEWCERT", "NEWKEY").unwrap();
        assert_eq!(
            write(&path, &renewed, "demo", SERVER, WriteMode::Merge).unwrap(),
            WriteOutcome::Merged
        );
        let after = doc(&std::fs::read_to_string(&path).unwrap());
        let user = |name: &str| {
            after["users"]
                .as_array()
                .unwrap()
                .iter()
                .find(|u| u["name"] == name)
                .unwrap()["user"]
                .clone()
        };
        assert_eq!(user("demo")["client-certificate-data"], "TkVXQ0VSVA==");
        assert_eq!(user("demo")["client-key-data"], "TkVXS0VZ");
        // The other cluster, this cluster's server and CA: untouched.
        assert_eq!(user("other")["client-key-data"], "S0VZ");
        assert_eq!(
            inspect(&path, "demo").unwrap(),
            Existing::Ours {
                server: Some(SERVER.to_owned())
            }
        );
        let clusters = after["clusters"].as_array().unwrap();
        assert!(
            clusters
                .iter()
                .all(|c| c["cluster"]["certificate-authority-data"] == "Q0E=")
        );
        assert_eq!(after["current-context"], "other");
        assert!(with_client_credential(&text, "absent", "C", "K").is_err());
    }

    #[test]
    fn garbage_from_the_vm_is_refused() {
        assert!(rewrite_k3s("just text", "demo", SERVER).is_err());
        assert!(rewrite_k3s("clusters: []\nusers: []\ncontexts: []\n", "demo", SERVER).is_err());
    }

    #[test]
    fn an_absent_file_is_created_0600_and_an_identical_rerun_leaves_it_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.yaml");
        let ours = rewrite_k3s(K3S, "demo", SERVER).unwrap();
        assert_eq!(
            write(&path, &ours, "demo", SERVER, WriteMode::Create).unwrap(),
            WriteOutcome::Created
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            check_target(&path, "demo", WriteMode::Create).unwrap(),
            Existing::Ours {
                server: Some(SERVER.into())
            }
        );
        assert_eq!(
            write(&path, &ours, "demo", SERVER, WriteMode::Create).unwrap(),
            WriteOutcome::Unchanged
        );
        let moved = rewrite_k3s(K3S, "demo", "https://172.30.0.11:6443").unwrap();
        assert!(matches!(
            write(
                &path,
                &moved,
                "demo",
                "https://172.30.0.11:6443",
                WriteMode::Create
            ),
            Err(KubeconfigError::OtherServer { .. })
        ));
    }

    #[test]
    fn a_foreign_file_is_never_clobbered_without_a_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let other = rewrite_k3s(K3S, "prod", "https://10.0.0.1:6443").unwrap();
        std::fs::write(&path, &other).unwrap();
        let e = check_target(&path, "demo", WriteMode::Create)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--kubeconfig-overwrite") && e.contains("--kubeconfig-merge"),
            "{e}"
        );
        let ours = rewrite_k3s(K3S, "demo", SERVER).unwrap();
        assert!(write(&path, &ours, "demo", SERVER, WriteMode::Create).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), other, "untouched");
        assert_eq!(
            write(&path, &ours, "demo", SERVER, WriteMode::Overwrite).unwrap(),
            WriteOutcome::Replaced
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), ours);
    }

    #[test]
    fn merge_adds_the_cluster_as_a_named_context_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(
            &path,
            rewrite_k3s(K3S, "prod", "https://10.0.0.1:6443").unwrap(),
        )
        .unwrap();
        let ours = rewrite_k3s(K3S, "demo", SERVER).unwrap();
        check_target(&path, "demo", WriteMode::Merge).unwrap();
        assert_eq!(
            write(&path, &ours, "demo", SERVER, WriteMode::Merge).unwrap(),
            WriteOutcome::Merged
        );
        let merged = doc(&std::fs::read_to_string(&path).unwrap());
        let names = |l: &str| {
            merged[l]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names("contexts"), ["prod", "demo"]);
        assert_eq!(names("clusters"), ["prod", "demo"]);
        assert_eq!(
            merged["current-context"], "prod",
            "the person's current context stays"
        );
        // Merging again replaces, never duplicates.
        assert_eq!(
            write(&path, &ours, "demo", SERVER, WriteMode::Merge).unwrap(),
            WriteOutcome::Unchanged
        );
        let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
        assert_eq!(kc.contexts.len(), 2);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn merge_refuses_a_file_that_is_not_yaml() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, "[unclosed").unwrap();
        assert!(matches!(
            check_target(&path, "demo", WriteMode::Merge),
            Err(KubeconfigError::Unmergeable { .. })
        ));
    }

    #[test]
    fn remove_context_takes_only_the_clusters_entries_and_the_file_when_nothing_else_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let prod = rewrite_k3s(K3S, "prod", SERVER).unwrap();
        let prod2 = rewrite_k3s(K3S, "prod-2", "https://172.30.0.11:6443").unwrap();
        std::fs::write(&path, merge(&prod2, &prod, "prod").unwrap()).unwrap();
        assert_eq!(
            remove_context(&path, "prod", true).unwrap(),
            RemoveOutcome::ContextRemoved
        );
        assert_eq!(
            inspect(&path, "prod").unwrap(),
            Existing::Ours {
                server: Some(SERVER.into())
            },
            "a dry run changes nothing"
        );
        assert_eq!(
            remove_context(&path, "prod", false).unwrap(),
            RemoveOutcome::ContextRemoved
        );
        let left = doc(&std::fs::read_to_string(&path).unwrap());
        assert_eq!(left["contexts"].as_array().unwrap().len(), 1);
        assert_eq!(left["contexts"][0]["name"], "prod-2");
        assert_eq!(left["clusters"][0]["name"], "prod-2");
        assert_eq!(left["users"].as_array().unwrap().len(), 1);
        assert_ne!(left["current-context"], "prod");
        assert_eq!(
            remove_context(&path, "prod", false).unwrap(),
            RemoveOutcome::NoContext
        );
        assert_eq!(
            remove_context(&path, "prod-2", false).unwrap(),
            RemoveOutcome::FileRemoved
        );
        assert!(!path.exists());
        assert_eq!(
            remove_context(&path, "prod-2", false).unwrap(),
            RemoveOutcome::NoFile
        );
    }

    #[test]
    fn the_ca_hash_is_the_sha256_of_the_pem_the_kubeconfig_carries() {
        use base64::Engine as _;
        use sha2::Digest as _;
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let yaml = format!(
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: https://127.0.0.1:6443\n  name: default\n",
            base64::engine::general_purpose::STANDARD.encode(pem)
        );
        let want: String = sha2::Sha256::digest(pem.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(k3s_ca_hash(&yaml).unwrap(), want);
        assert!(k3s_ca_hash("apiVersion: v1\nclusters: []\n").is_err());
    }
}
