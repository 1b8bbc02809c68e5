//! The local files bootstrap writes for a cluster, where the laptop's commands (`bootstrap
//! delete`, `bootstrap recover`) look for them: the resume file in the state directory and
//! the kubeconfig, each with its default under the home directory.

use std::path::{Path, PathBuf};

use crate::adapters::resume;
use crate::workflows::error::{WorkflowError, message};

/// Where the resume file and the kubeconfig of one cluster are.
#[derive(Debug, Clone)]
pub struct LocalPaths {
    pub resume: PathBuf,
    pub kubeconfig: PathBuf,
}

/// The paths for `cluster`: `--state-dir` (default `~/.config/oxide-controller`) holds the
/// resume file; `--kubeconfig` defaults to `~/.kube/<cluster>.yaml`. Without a home directory a
/// default is an input error naming its flag.
pub fn local_paths(
    cluster: &str,
    state_dir: Option<&Path>,
    kubeconfig: Option<&Path>,
    home: Option<&Path>,
) -> Result<LocalPaths, WorkflowError> {
    let no_home = |flag: &'static str, what: &str| {
        WorkflowError::input(
            flag,
            message(format!(
                "there is no home directory for the default {what}; pass {flag}"
            )),
        )
    };
    let state_dir = match state_dir {
        Some(d) => d.to_path_buf(),
        None => resume::default_state_dir(home.map(Path::to_path_buf))
            .ok_or_else(|| no_home("--state-dir", "~/.config/oxide-controller"))?,
    };
    let kubeconfig = match kubeconfig {
        Some(p) => p.to_path_buf(),
        None => home
            .map(|h| h.join(".kube").join(format!("{cluster}.yaml")))
            .ok_or_else(|| no_home("--kubeconfig", "~/.kube/<cluster>.yaml"))?,
    };
    Ok(LocalPaths {
        resume: resume::resume_path(&state_dir, cluster),
        kubeconfig,
    })
}
