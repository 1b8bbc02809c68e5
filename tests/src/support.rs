//! Plumbing the rest of the simulator stands on: the loopback HTTP accept loop and listener
//! registry, and per-process scratch directories.

pub mod net;
pub mod scratch;
pub mod ustar;

/// Writes `dir/<context>.yaml`: a kubeconfig whose one context, `context`, names a cluster
/// whose API does not answer (nothing listens on loopback port 9, the discard port), as a
/// laptop's kubeconfig looks once every server of the cluster is gone. Returns its path.
pub fn kubeconfig_without_api(dir: &std::path::Path, context: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{context}.yaml"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {context}\n  cluster:\n    server: https://127.0.0.1:9\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: not-a-token\ncontexts:\n- name: {context}\n  context:\n    cluster: {context}\n    user: admin\ncurrent-context: {context}\n"
    );
    if let Err(e) = std::fs::write(&path, text) {
        panic!("{}: {e}", path.display());
    }
    path
}
