//! The kubelet for the product's own Job pods on a real control plane: the real CronJob and
//! Job controllers make the pods, the real scheduler binds them, and this runner executes
//! each bound pod labelled `app.kubernetes.io/name=oxide-controller` and owned by a Job (KWOK
//! leaves those alone, see `control_plane/kwok-stages.yaml`) as a local process of the binary
//! its container names (`/usr/local/bin/reconcile-once` → `<bin_dir>/reconcile-once`; a
//! command inside a `hostPath` mount runs the file uploaded to that path on the pod's Node).
//!
//! What it does of a kubelet for these pods:
//! - the ServiceAccount token, `POD_NAME`, literal and downward-API `env` (below);
//! - `secret` volumes, written as the kubelet writes them (in a bundle bind-mounted; for a
//!   local process in a directory its arguments naming the `mountPath` are rewritten to);
//! - `hostPath` volumes ([`crate::pods::host_path`]): the directory of the pod's Node is the
//!   host directory mirroring its VM's disk, live (files k3s writes there later are seen),
//!   set up as the kubelet's `type` says (`DirectoryOrCreate` makes it, `Directory` fails
//!   the pod when it is missing); a local process sees it through its arguments (each one
//!   naming a path at or inside the `mountPath` is rewritten to the Node's directory), a
//!   bundle through a bind mount at `mountPath` (read-only with `readOnly: true`). A mount
//!   that cannot be set up fails the pod (`ContainerCannotRun`, the kubelet's
//!   "MountVolume.SetUp failed" text), where a kubelet would keep it `ContainerCreating` and
//!   retry;
//! - status, deletion and grace periods as below.
//!
//! With a runtime bundle of the product's image ([`PodRunner::with_bundle`], `oxide-sim
//! --run-jobs-in-bundle`), the pod's container runs inside the image instead, under `runc`,
//! with the ServiceAccount mounted where a kubelet mounts it (see [`crate::pods::oci_bundle`]).
//!
//! The process authenticates as the pod's ServiceAccount (a TokenRequest token, as a
//! projected token is) against the cluster's `kubernetes` Service address, so the real RBAC
//! authorizer decides; `POD_NAME` and literal `env` entries are set as the kubelet sets them.
//! The pod's status follows the process (Running, then Succeeded/Failed with the exit code);
//! when the pod is deleted (eviction, `activeDeadlineSeconds`, TTL, a Job deletion) the runner
//! stops it as a kubelet does: SIGTERM (`runc kill ID TERM` in a bundle), up to the pod's grace
//! period (`metadata.deletionGracePeriodSeconds`, else `spec.terminationGracePeriodSeconds`,
//! else 30 s; at least 2 s) for it to exit, then SIGKILL; only then is the container's end written to the
//! pod's status and the pod removed with grace 0, as a kubelet confirms a termination.
//! In a bundle the program is PID 1 of its PID namespace, so the kernel drops a SIGTERM it has
//! no handler for (pid_namespaces(7)); as a local process the default action kills it at once.
//!
//! Only a Node whose VM runs has a kubelet: a pod bound to a Node whose VM is halted or gone
//! is neither started nor confirmed deleted (it stays Pending or Terminating, as on a rack,
//! until the Node goes and the pod garbage collector takes it), and a process the runner
//! started dies with its VM (SIGKILL, no status written). Nodes no simulated VM ever
//! registered (made by hand in tests) are run as before.
//!
//! Not run: Deployment pods (the webhook) unless with a bundle, where they run until deleted;
//! `restartPolicy: OnFailure` restarts, init containers, probes, resource limits. A deleted
//! pod nothing runs (the webhook's without a bundle) is removed with grace 0, as a kubelet
//! confirms the termination once its containers stopped; without that, draining the node it
//! was bound to never finished.

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
use crate::pods::host_path::{self, HostPathMount};

/// The label of the product's pods (reconcile Jobs, the webhook).
const OURS: &str = "app.kubernetes.io/name=oxide-controller";

/// Runs the product's Job pods of every real cluster of a simulator.
#[derive(Clone)]
pub struct PodRunner {
    boot: Boot,
    /// Where the Job pods' programs are; None: Job pods are not run (but a deleted pod of ours
    /// still goes, as a kubelet confirms its termination).
    bin_dir: Option<PathBuf>,
    /// An OCI runtime bundle of the product's image (`config.json`, `rootfs/`): Job pods run
    /// in it under `runc` instead of from `bin_dir`, and so do Deployment (ReplicaSet) pods.
    bundle: Option<PathBuf>,
    work_dir: PathBuf,
    started: Arc<Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for PodRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodRunner")
            .field("bin_dir", &self.bin_dir)
            .field("bundle", &self.bundle)
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
            bundle: None,
            work_dir,
            started: Arc::default(),
        }
    }

    /// Runs Job pods, and the webhook Deployment's, inside this OCI runtime bundle of the
    /// product's image (under `runc`) rather than as local processes; None keeps the runner
    /// as it is.
    #[must_use]
    pub fn with_bundle(mut self, bundle: Option<PathBuf>) -> Self {
        if bundle.is_some() {
            self.bundle = bundle;
        }
        self
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
            let owned_by = |kind: &str| {
                pod["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["kind"] == kind))
            };
            // With the image's bundle the webhook's Deployment pods run too (host network:
            // they answer on this machine's loopback at their container port).
            let runnable = owned_by("Job") || (self.bundle.is_some() && owned_by("ReplicaSet"));
            let bound = pod["spec"]["nodeName"].is_string();
            // No kubelet on a halted or deleted VM: nothing starts, nothing is confirmed.
            if let Some(node) = pod["spec"]["nodeName"].as_str()
                && self.boot.node_vm_running(node) == Some(false)
            {
                continue;
            }
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
            if (self.bin_dir.is_none() && self.bundle.is_none())
                || !runnable
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
        let prepared = match &self.bundle {
            Some(bundle) => self.in_bundle(cluster, &pod, bundle).await,
            None => self.local(cluster, &pod).await,
        };
        let (mut cmd, scratch, what) = match prepared {
            Ok(p) => p,
            Err(e) => return fail(e).await,
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return fail(format!("{what}: {e}")).await,
        };
        set_status(json!({"phase": "Running", "startTime": started_at,
            "conditions": [{"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
            "containerStatuses": [{"name": container, "ready": true, "started": true,
                "restartCount": 0, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                "state": {"running": {"startedAt": started_at}}}]}))
        .await;
        tracing::info!(pod = %name, program = %what, "pod started");
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
        // Deleted under the process (eviction, deadline, TTL): the kubelet stops it. Its VM
        // halted: the process dies with it.
        let node = pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let going = async {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if self.boot.node_vm_running(&node) == Some(false) {
                    return Going::VmHalted;
                }
                match cp.get("v1", "Pod", Some(&ns), &name).await {
                    Ok(None) => return Going::Deleted(Duration::from_secs(MIN_GRACE_SECONDS)),
                    Ok(Some(p)) if p["metadata"]["deletionTimestamp"].is_string() => {
                        return Going::Deleted(grace_period(&p));
                    }
                    _ => {}
                }
            }
        };
        let exit = tokio::select! {
            s = child.wait() => s.ok().and_then(|s| s.code()),
            going = going => match going {
                Going::VmHalted => {
                    scratch.stop();
                    let _ = child.kill().await;
                    tracing::info!(pod = %name, %node, "the pod's VM stopped; its process died with it");
                    return;
                }
                Going::Deleted(grace) => {
                    // kubelet: TERM, the grace period, then KILL.
                    scratch.signal("TERM");
                    if let Some(pid) = child.id().filter(|_| scratch.container.is_none()) {
                        let _ = std::process::Command::new("kill")
                            .args(["-TERM", &pid.to_string()])
                            .status();
                    }
                    tracing::info!(pod = %name, grace_s = grace.as_secs(), "pod deleted; SIGTERM sent");
                    let code = match tokio::time::timeout(grace, child.wait()).await {
                        Ok(s) => {
                            let code = s.ok().and_then(|s| exit_code(&s));
                            tracing::info!(pod = %name, exit = ?code, "the pod's process exited within its grace period");
                            code
                        }
                        Err(_) => {
                            scratch.stop();
                            let _ = child.kill().await;
                            tracing::info!(pod = %name, grace_s = grace.as_secs(), "the pod's process outlived its grace period; SIGKILL sent");
                            Some(137)
                        }
                    };
                    drop(scratch);
                    let code = code.unwrap_or(137);
                    set_status(terminated(&pod, &container, &started_at, &now(), code)).await;
                    let force = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
                    let _ = cp.delete_with("v1", "Pod", Some(&ns), &name, &force).await;
                    return;
                }
            }
        };
        drop(scratch);
        let code = exit.unwrap_or(137);
        set_status(terminated(&pod, &container, &started_at, &now(), code)).await;
        tracing::info!(pod = %name, exit = code, "pod finished");
    }
}

/// Why the runner stopped watching a started pod's process.
enum Going {
    /// The pod is being deleted, with this grace period.
    Deleted(Duration),
    /// The VM of the pod's Node stopped.
    VmHalted,
}

/// The grace period a kubelet gives a deleted pod's containers: the deletion's own
/// (`metadata.deletionGracePeriodSeconds`), else the pod's `terminationGracePeriodSeconds`,
/// else the API default of 30 s; never less than 2 s (kubernetes@v1.33.4
/// `pkg/kubelet/kuberuntime/kuberuntime_container.go:1421-1440,853-856`,
/// `kuberuntime_manager.go:79`).
fn grace_period(pod: &Value) -> Duration {
    let secs = pod["metadata"]["deletionGracePeriodSeconds"]
        .as_u64()
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_u64())
        .unwrap_or(30);
    Duration::from_secs(secs.max(MIN_GRACE_SECONDS))
}

/// The kubelet's `minimumGracePeriodInSeconds`.
const MIN_GRACE_SECONDS: u64 = 2;

/// The exit code a container runtime reports: the process's own, or 128 + the signal that
/// killed it.
fn exit_code(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt as _;
    status.code().or_else(|| status.signal().map(|s| 128 + s))
}

/// The pod's status once its container ended with `code`.
fn terminated(
    pod: &Value,
    container: &str,
    started_at: &str,
    finished_at: &str,
    code: i32,
) -> Value {
    let ok = code == 0;
    json!({"phase": if ok { "Succeeded" } else { "Failed" },
            "conditions": [{"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "PodCompleted"},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": [{"name": container, "ready": false, "started": false,
                "restartCount": 0, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                "state": {"terminated": {"exitCode": code,
                    "reason": if ok { "Completed" } else { "Error" },
                    "startedAt": started_at, "finishedAt": finished_at}}}]})
}

impl PodRunner {
    /// The pod's container as a local process of `bin_dir`, with a ServiceAccount kubeconfig.
    async fn local(
        &self,
        cluster: &RealCluster,
        pod: &Value,
    ) -> Result<(tokio::process::Command, Scratch, String), String> {
        let (program, args) = self.program(pod)?;
        let (ns, name) = (meta(pod, "namespace"), meta(pod, "name"));
        // No mount namespace: the container sees its hostPath and secret volumes through its
        // arguments (a secret volume's files written as the kubelet writes them).
        let mut mounts = self.host_path_volumes(pod)?;
        let volumes_dir = self.work_dir.join(format!("pod-{ns}-{name}-volumes"));
        for (host, mount_path) in self.secret_volumes(cluster, pod, &volumes_dir).await? {
            mounts.push((
                host,
                HostPathMount {
                    volume: String::new(),
                    path: String::new(),
                    kind: String::new(),
                    mount_path,
                    read_only: true,
                },
            ));
        }
        let args: Vec<String> = args
            .iter()
            .map(|a| host_path::map_arg(a, &mounts))
            .collect();
        let sa = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        let kubeconfig = self.work_dir.join(format!("pod-{ns}-{name}.kubeconfig"));
        let text = cluster
            .control_plane
            .service_account_kubeconfig(&cluster.service_url, &ns, sa)
            .await
            .map_err(|e| format!("cannot mount the ServiceAccount token: {e}"))?;
        std::fs::write(&kubeconfig, text)
            .map_err(|e| format!("cannot mount the ServiceAccount token: {e}"))?;
        let scratch = Scratch {
            path: kubeconfig.clone(),
            container: None,
        };
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&args);
        for (k, v) in container_env(pod) {
            cmd.env(k, v);
        }
        cmd.env("POD_NAME", &name)
            .env("KUBECONFIG", &kubeconfig)
            .env("OXIDE_CONTROLLER_LOG_FORMAT", "text");
        Ok((cmd, scratch, program.display().to_string()))
    }

    /// The pod's container inside the image's runtime bundle, as `runc run` of a bundle of
    /// its own (see [`crate::pods::oci_bundle`]), with the ServiceAccount's token, CA and namespace
    /// mounted where a kubelet mounts them and the `kubernetes` Service in the environment.
    async fn in_bundle(
        &self,
        cluster: &RealCluster,
        pod: &Value,
        bundle: &Path,
    ) -> Result<(tokio::process::Command, Scratch, String), String> {
        let cp = &cluster.control_plane;
        let (ns, name) = (meta(pod, "namespace"), meta(pod, "name"));
        let sa = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        let template_file = bundle.join("config.json");
        let template: Value = std::fs::read(&template_file)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            .map_err(|e| format!("{}: {e}", template_file.display()))?;
        let rootfs = bundle.join(template["root"]["path"].as_str().unwrap_or("rootfs"));
        let rootfs = std::fs::canonicalize(&rootfs)
            .map_err(|e| format!("the bundle's rootfs {}: {e}", rootfs.display()))?;
        let (host, port) = cluster
            .service_url
            .trim_start_matches("https://")
            .rsplit_once(':')
            .ok_or_else(|| format!("no port in {}", cluster.service_url))?;

        let dir = self.work_dir.join(format!("pod-{ns}-{name}"));
        let mut scratch = Scratch {
            path: dir.clone(),
            container: None,
        };
        let sa_dir = dir.join("serviceaccount");
        let token = cp
            .service_account_token(&ns, sa)
            .await
            .map_err(|e| format!("cannot mount the ServiceAccount token: {e}"))?;
        std::fs::create_dir_all(&sa_dir)
            .and_then(|()| std::fs::write(sa_dir.join("token"), token))
            .and_then(|()| std::fs::write(sa_dir.join("ca.crt"), cp.ca_pem()))
            .and_then(|()| std::fs::write(sa_dir.join("namespace"), &ns))
            .map_err(|e| format!("cannot mount the ServiceAccount token: {e}"))?;
        let mut volumes: Vec<(PathBuf, String, bool)> = self
            .secret_volumes(cluster, pod, &dir)
            .await?
            .into_iter()
            .map(|(host, at)| (host, at, true))
            .collect();
        volumes.extend(
            self.host_path_volumes(pod)?
                .into_iter()
                .map(|(host, m)| (host, m.mount_path, m.read_only)),
        );
        let config = crate::pods::oci_bundle::container_config(
            &template,
            pod,
            &rootfs,
            &sa_dir,
            &[
                ("POD_NAME", name.clone()),
                ("POD_NAMESPACE", ns.clone()),
                ("KUBERNETES_SERVICE_HOST", host.to_owned()),
                ("KUBERNETES_SERVICE_PORT", port.to_owned()),
                ("OXIDE_CONTROLLER_LOG_FORMAT", "text".to_owned()),
            ],
            &volumes,
        )?;
        let text = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("config.json"), text)
            .map_err(|e| format!("{}: {e}", dir.display()))?;

        let root = self.work_dir.join("runc");
        let id = format!("{ns}-{name}");
        let mut cmd = tokio::process::Command::new(RUNC);
        cmd.arg("--root")
            .arg(&root)
            .args(["run", "--bundle"])
            .arg(&dir)
            .arg(&id);
        let argv: Vec<&str> = config["process"]["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let what = format!("{RUNC} run {id} ({})", argv.join(" "));
        scratch.container = Some((root, id));
        Ok((cmd, scratch, what))
    }

    /// The container's `hostPath` volume mounts, set up on the pod's Node as the kubelet sets
    /// them up: `(the Node's directory on this machine, the mount)`.
    fn host_path_volumes(&self, pod: &Value) -> Result<Vec<(PathBuf, HostPathMount)>, String> {
        let spec = &pod["spec"];
        let node = spec["nodeName"].as_str().unwrap_or_default();
        host_path::host_path_mounts(spec, &spec["containers"][0])
            .into_iter()
            .map(|m| {
                let setup_failed = |e: String| {
                    format!("MountVolume.SetUp failed for volume \"{}\" : {e}", m.volume)
                };
                let host = self
                    .boot
                    .node_dir(node, &m.path)
                    .ok_or_else(|| setup_failed(format!("Node {node} has no running VM")))?;
                host_path::set_up(&m, &host).map_err(setup_failed)?;
                Ok((host, m))
            })
            .collect()
    }

    /// The container's `secret` volume mounts, written under `dir` as a kubelet writes them
    /// (the kubelet reads a Secret a pod bound to its Node names): `(host dir, mount path)`.
    /// The files' group is the pod's `fsGroup` where set, as the kubelet sets it.
    async fn secret_volumes(
        &self,
        cluster: &RealCluster,
        pod: &Value,
        dir: &Path,
    ) -> Result<Vec<(PathBuf, String)>, String> {
        let ns = meta(pod, "namespace");
        let fs_group = pod["spec"]["securityContext"]["fsGroup"]
            .as_u64()
            .and_then(|g| u32::try_from(g).ok());
        let mut out = Vec::new();
        for m in pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(volume) = pod["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == m["name"] && v["secret"].is_object())
            else {
                continue;
            };
            let secret_name = volume["secret"]["secretName"].as_str().unwrap_or_default();
            let secret = cluster
                .control_plane
                .get("v1", "Secret", Some(&ns), secret_name)
                .await
                .map_err(|e| format!("reading secret {secret_name}: {e}"))?;
            let files = crate::pods::oci_bundle::secret_volume_files(volume, secret.as_ref())
                .map_err(|e| format!("MountVolume.SetUp failed for volume {}: {e}", m["name"]))?;
            let host = dir.join(format!("volume-{}", m["name"].as_str().unwrap_or("secret")));
            std::fs::create_dir_all(&host).map_err(|e| format!("{}: {e}", host.display()))?;
            for (path, bytes, mode) in files {
                use std::os::unix::fs::PermissionsExt as _;
                let file = host.join(&path);
                std::fs::write(&file, bytes)
                    .and_then(|()| {
                        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
                    })
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                if let Some(g) = fs_group {
                    std::os::unix::fs::chown(&file, None, Some(g))
                        .map_err(|e| format!("{}: {e}", file.display()))?;
                }
            }
            out.push((host, m["mountPath"].as_str().unwrap_or_default().to_owned()));
        }
        Ok(out)
    }
}

/// The OCI runtime Job pods run under with a bundle. runc, not podman or crun: podman always
/// sets `process.rlimits` (CI's sandbox lacks `CAP_SYS_RESOURCE`), crun refuses cgroup v1 with
/// a cgroup2 `unified` mount ("cgroups in hybrid mode not supported").
const RUNC: &str = "runc";

/// What a started pod leaves until it ends: its kubeconfig file or bundle directory, and its
/// container (`runc --root ROOT`, id), deleted with it.
struct Scratch {
    path: PathBuf,
    container: Option<(PathBuf, String)>,
}

impl Scratch {
    /// `runc --root ROOT <command> ID <rest>`, when there is a container.
    fn runc(&self, command: &[&str], rest: &[&str]) {
        if let Some((root, id)) = &self.container {
            let _ = std::process::Command::new(RUNC)
                .arg("--root")
                .arg(root)
                .args(command)
                .arg(id)
                .args(rest)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Kills the container's processes (a kubelet's SIGKILL once the grace period is over).
    fn stop(&self) {
        self.signal("KILL");
    }

    /// Sends `signal` (`TERM`, `KILL`) to the container's init process.
    fn signal(&self, signal: &str) {
        self.runc(&["kill"], &[signal]);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.runc(&["delete", "--force"], &[]);
        let _ = if self.path.is_dir() {
            std::fs::remove_dir_all(&self.path)
        } else {
            std::fs::remove_file(&self.path)
        };
    }
}

/// The container's environment as a kubelet resolves it: literal `value`s, and the downward
/// API's `fieldRef` to the pod's `metadata.name` and `metadata.namespace` (what the manifests
/// use; kubernetes pkg/kubelet/kubelet_pods.go podFieldSelectorRuntimeValue).
fn container_env(pod: &Value) -> Vec<(String, String)> {
    pod["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e["name"].as_str()?.to_owned();
            let value = match (
                e["value"].as_str(),
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            ) {
                (Some(v), _) => v.to_owned(),
                (None, Some("metadata.name")) => meta(pod, "name"),
                (None, Some("metadata.namespace")) => meta(pod, "namespace"),
                _ => return None,
            };
            Some((name, value))
        })
        .collect()
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
    fn the_grace_period_is_the_deletions_else_the_pods_else_30_s_and_at_least_2_s() {
        let secs = |v: Value| grace_period(&v).as_secs();
        assert_eq!(
            secs(json!({"metadata": {"deletionGracePeriodSeconds": 7},
                "spec": {"terminationGracePeriodSeconds": 60}})),
            7
        );
        assert_eq!(
            secs(json!({"spec": {"terminationGracePeriodSeconds": 60}})),
            60
        );
        assert_eq!(secs(json!({})), 30);
        assert_eq!(
            secs(json!({"metadata": {"deletionGracePeriodSeconds": 0}})),
            2
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
