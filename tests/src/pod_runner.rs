//! The kubelet for the product's own Job pods on a real control plane: the real CronJob and
//! Job controllers make the pods, the real scheduler binds them, and this runner executes
//! each bound pod labelled `app.kubernetes.io/name=oxide-controller` and owned by a Job (KWOK
//! leaves those alone, see `control_plane/kwok-stages.yaml`) as a local process of the binary
//! its container names (`/usr/local/bin/reconcile-once` → `<bin_dir>/reconcile-once`; a
//! command inside a `hostPath` mount runs the file uploaded to that path on the pod's Node).
//!
//! The process authenticates as the pod's ServiceAccount (a TokenRequest token, as a
//! projected token is) against the cluster's `kubernetes` Service address, so the real RBAC
//! authorizer decides; `POD_NAME` and literal `env` entries are set as the kubelet sets them.
//! The pod's status follows the process (Running, then Succeeded/Failed with the exit code);
//! when the pod is deleted (eviction, `activeDeadlineSeconds`, TTL, a Job deletion) the process
//! is killed and the pod removed with grace 0, as a kubelet confirms a termination.
//!
//! Not run: Deployment pods (the webhook), `restartPolicy: OnFailure` restarts, init
//! containers, probes, resource limits. A deleted pod nothing runs (the webhook's) is removed
//! with grace 0, as a kubelet confirms the termination once its containers stopped; without
//! that, draining the node it was bound to never finished.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::DeleteParams;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

use crate::guest::Boot;
use crate::guest::cluster_api::RealCluster;

/// The label of the product's pods (reconcile Jobs, the webhook).
const OURS: &str = "app.kubernetes.io/name=oxide-controller";

/// Runs the product's Job pods of every real cluster of a simulator.
#[derive(Clone)]
pub struct PodRunner {
    boot: Boot,
    /// Where the Job pods' programs are; None: Job pods are not run (but a deleted pod of ours
    /// still goes, as a kubelet confirms its termination).
    bin_dir: Option<PathBuf>,
    work_dir: PathBuf,
    started: Arc<Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for PodRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodRunner")
            .field("bin_dir", &self.bin_dir)
            .finish_non_exhaustive()
    }
}

fn meta(v: &Value, field: &str) -> String {
    v["metadata"][field]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

impl PodRunner {
    pub fn new(boot: Boot, bin_dir: Option<PathBuf>, work_dir: PathBuf) -> Self {
        PodRunner {
            boot,
            bin_dir,
            work_dir,
            started: Arc::default(),
        }
    }

    /// Looks for pods to run every `period` until the task is aborted.
    pub fn spawn(self, period: Duration) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                for cluster in self.boot.real_clusters() {
                    self.sync(&cluster).await;
                }
                tokio::time::sleep(period).await;
            }
        })
    }

    async fn sync(&self, cluster: &Arc<RealCluster>) {
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
            cluster.control_plane.client(),
            &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
        );
        let Ok(pods) = api
            .list(&kube::api::ListParams::default().labels(OURS))
            .await
        else {
            return;
        };
        for pod in pods.items {
            let Ok(pod) = serde_json::to_value(pod) else {
                continue;
            };
            let owned_by_job = pod["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["kind"] == "Job"));
            let bound = pod["spec"]["nodeName"].is_string();
            let terminal = matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            let running_here = self
                .started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&meta(&pod, "uid"));
            if pod["metadata"]["deletionTimestamp"].is_string()
                && bound
                && !terminal
                && !running_here
            {
                // Deleted, and no process of ours runs it (a Deployment pod such as the
                // webhook's, or a Job pod not started yet): a kubelet stops its containers and
                // confirms the termination, so the pod goes instead of lingering for ever.
                let force = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                let pods: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
                    cluster.control_plane.client(),
                    &meta(&pod, "namespace"),
                    &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
                );
                let _ = pods.delete(&meta(&pod, "name"), &force).await;
                continue;
            }
            if self.bin_dir.is_none()
                || !owned_by_job
                || !bound
                || pod["status"]["phase"] != "Pending"
            {
                continue;
            }
            if !self
                .started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(meta(&pod, "uid"))
            {
                continue;
            }
            let runner = self.clone();
            let cluster = Arc::clone(cluster);
            tokio::spawn(async move { runner.run(&cluster, pod).await });
        }
    }

    /// The program the pod's first container runs, or why it cannot start.
    fn program(&self, pod: &Value) -> Result<(PathBuf, Vec<String>), String> {
        let spec = &pod["spec"];
        let container = &spec["containers"][0];
        let mut argv: Vec<String> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(container["args"].as_array().into_iter().flatten())
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        if argv.is_empty() {
            return Err("the container has no command".into());
        }
        let command = argv.remove(0);
        if let Some(host_path) = host_path_of(spec, container, &command) {
            let node = spec["nodeName"].as_str().unwrap_or_default();
            return self
                .boot
                .node_file(node, &host_path)
                .map(|f| (f, argv.clone()))
                .ok_or_else(|| format!("Node {node} has no {host_path} (hostPath)"));
        }
        match Path::new(&command).file_name() {
            Some(f) => match &self.bin_dir {
                Some(dir) => Ok((dir.join(f), argv)),
                None => Err("the simulator runs no Job pods (no --run-jobs)".into()),
            },
            None => Err(format!("command {command:?} names no program")),
        }
    }

    async fn run(&self, cluster: &RealCluster, pod: Value) {
        let cp = &cluster.control_plane;
        let (ns, name) = (meta(&pod, "namespace"), meta(&pod, "name"));
        let sa = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let now = || chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let started_at = now();
        let container = pod["spec"]["containers"][0]["name"]
            .as_str()
            .unwrap_or("main")
            .to_string();
        let set_status = async |status: Value| {
            if let Err(e) = cp
                .merge_patch_status("v1", "Pod", Some(&ns), &name, &json!({"status": status}))
                .await
            {
                tracing::debug!(pod = %name, error = %e, "cannot set the pod's status");
            }
        };
        let fail = async |message: String| {
            tracing::warn!(pod = %name, %message, "the pod's container cannot start");
            set_status(
                json!({"phase": "Failed", "message": message, "reason": "ContainerCannotRun"}),
            )
            .await;
        };
        let (program, args) = match self.program(&pod) {
            Ok(p) => p,
            Err(e) => return fail(e).await,
        };
        let kubeconfig = self.work_dir.join(format!("pod-{ns}-{name}.kubeconfig"));
        let written = match cp
            .service_account_kubeconfig(&cluster.service_url, &ns, &sa)
            .await
        {
            Ok(text) => std::fs::write(&kubeconfig, text).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = written {
            return fail(format!("cannot mount the ServiceAccount token: {e}")).await;
        }
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&args);
        for e in pod["spec"]["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
                cmd.env(k, v);
            }
        }
        cmd.env("POD_NAME", &name)
            .env("KUBECONFIG", &kubeconfig)
            .env("OXIDE_CONTROLLER_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return fail(format!("{}: {e}", program.display())).await,
        };
        set_status(json!({"phase": "Running", "startTime": started_at,
            "conditions": [{"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
            "containerStatuses": [{"name": container, "ready": true, "started": true,
                "restartCount": 0, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                "state": {"running": {"startedAt": started_at}}}]}))
        .await;
        tracing::info!(pod = %name, program = %program.display(), "pod started");
        for out in [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child.stderr.take().map(|e| Box::new(e) as _),
        ]
        .into_iter()
        .flatten()
        {
            let pod = name.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[{pod}] {line}");
                }
            });
        }
        // Deleted under the process (eviction, deadline, TTL): the kubelet stops it.
        let going = async {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                match cp.get("v1", "Pod", Some(&ns), &name).await {
                    Ok(None) => return,
                    Ok(Some(p)) if p["metadata"]["deletionTimestamp"].is_string() => return,
                    _ => {}
                }
            }
        };
        let exit = tokio::select! {
            s = child.wait() => s.ok().and_then(|s| s.code()),
            () = going => {
                let _ = child.kill().await;
                tracing::info!(pod = %name, "pod deleted; its process was killed");
                let _ = std::fs::remove_file(&kubeconfig);
                let force = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
                let _ = cp.delete_with("v1", "Pod", Some(&ns), &name, &force).await;
                return;
            }
        };
        let _ = std::fs::remove_file(&kubeconfig);
        let code = exit.unwrap_or(137);
        let ok = code == 0;
        set_status(json!({"phase": if ok { "Succeeded" } else { "Failed" },
            "conditions": [{"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "PodCompleted"},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": [{"name": container, "ready": false, "started": false,
                "restartCount": 0, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                "state": {"terminated": {"exitCode": code,
                    "reason": if ok { "Completed" } else { "Error" },
                    "startedAt": started_at, "finishedAt": now()}}}]}))
        .await;
        tracing::info!(pod = %name, exit = code, "pod finished");
    }
}

/// The host path behind `program` when it lies inside one of the container's volume mounts
/// whose volume is a `hostPath`.
fn host_path_of(pod: &Value, container: &Value, program: &str) -> Option<String> {
    container["volumeMounts"].as_array()?.iter().find_map(|m| {
        let mount = m["mountPath"].as_str()?.trim_end_matches('/');
        let rest = program.strip_prefix(mount)?.strip_prefix('/')?;
        let volume = pod["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == m["name"])?;
        let host = volume["hostPath"]["path"].as_str()?.trim_end_matches('/');
        Some(format!("{host}/{rest}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(host: &str, mount: &str) -> (Value, Value) {
        let pod = json!({
            "volumes": [
                {"name": "other", "emptyDir": {}},
                {"name": "bin", "hostPath": {"path": host, "type": "Directory"}},
            ],
        });
        let container = json!({
            "volumeMounts": [
                {"name": "other", "mountPath": "/tmp"},
                {"name": "bin", "mountPath": mount, "readOnly": true},
            ],
        });
        (pod, container)
    }

    #[test]
    fn a_command_inside_a_hostpath_mount_maps_to_the_host_file() {
        let (p, c) = pod("/var/lib/x/bin/abc", "/opt/bin");
        assert_eq!(
            host_path_of(&p, &c, "/opt/bin/reconcile-once").as_deref(),
            Some("/var/lib/x/bin/abc/reconcile-once")
        );
        let (p, c) = pod("/var/lib/x/", "/opt/bin/");
        assert_eq!(
            host_path_of(&p, &c, "/opt/bin/sub/scale").as_deref(),
            Some("/var/lib/x/sub/scale")
        );
    }

    #[test]
    fn other_commands_are_not_hostpath_files() {
        let (p, c) = pod("/var/lib/x", "/opt/bin");
        for program in [
            "/usr/local/bin/reconcile-once",
            "/opt/binx/a",
            "/opt/bin",
            "/tmp/a",
        ] {
            assert_eq!(host_path_of(&p, &c, program), None, "{program}");
        }
        assert_eq!(host_path_of(&json!({}), &c, "/opt/bin/a"), None);
    }
}
