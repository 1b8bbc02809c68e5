//! The cluster twin's stand-in for the CronJob and Job controllers and the kubelet: CronJobs
//! fire on their schedule (`cron` crate, `concurrencyPolicy: Forbid` honoured), and every Job
//! — scheduled, or created by hand or by the webhook — runs once as a local process of the
//! binary its container names (`/usr/local/bin/reconcile-once` → `<bin_dir>/reconcile-once`),
//! authenticated as the pod's ServiceAccount, so RBAC is exactly what the manifests grant.
//! A command inside a `hostPath` volume mount runs the file uploaded to that path on a Node
//! (over SSH, see [`crate::guest::Boot::node_file`]) instead: the pod is placed on a random
//! Ready, schedulable Node matching its `nodeSelector` (taints and tolerations are not
//! modelled); without a matching Node the Job stays pending, and a Node without the file fails
//! it, as a container whose program is missing would.
//! The Job's status (startTime, succeeded/failed, Complete/Failed condition) follows the
//! process; `activeDeadlineSeconds` kills it and `ttlSecondsAfterFinished` deletes the Job.
//!
//! Only for demos and end-to-end tests: off unless [`crate::SimOptions::job_binaries`] is set.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

use crate::guest::Boot;
use crate::net::{ListenerKind, Listeners};
use crate::twin::Twin;

const CRONJOB: (&str, &str) = ("batch/v1", "CronJob");
const JOB: (&str, &str) = ("batch/v1", "Job");

/// Runs CronJobs and Jobs of the twin as local processes.
#[derive(Clone)]
pub struct JobRunner {
    twin: Twin,
    listeners: Listeners,
    bin_dir: PathBuf,
    work_dir: PathBuf,
    boot: Option<Boot>,
    state: Arc<Mutex<RunnerState>>,
}

impl std::fmt::Debug for JobRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobRunner")
            .field("bin_dir", &self.bin_dir)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct RunnerState {
    /// Last time each CronJob (ns/name) was considered.
    last_tick: BTreeMap<String, DateTime<Utc>>,
    /// Jobs (ns/name, uid) already started.
    started: BTreeSet<(String, String)>,
}

impl JobRunner {
    /// A runner that takes binaries from `bin_dir` and writes kubeconfigs under `work_dir`.
    pub fn new(twin: Twin, listeners: Listeners, bin_dir: PathBuf, work_dir: PathBuf) -> Self {
        JobRunner {
            twin,
            listeners,
            bin_dir,
            work_dir,
            boot: None,
            state: Arc::default(),
        }
    }

    /// Lets commands inside `hostPath` volumes run the files uploaded to the VMs.
    pub fn with_boot(mut self, boot: Boot) -> Self {
        self.boot = Some(boot);
        self
    }

    /// Polls the twin every `period` until aborted.
    pub fn spawn(self, period: Duration) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                self.tick(Utc::now());
                tokio::time::sleep(period).await;
            }
        })
    }

    /// One pass: fire due CronJobs, start new Jobs, expire finished ones.
    pub fn tick(&self, now: DateTime<Utc>) {
        for cj in self.twin.list(CRONJOB.0, CRONJOB.1, None) {
            self.schedule(&cj, now);
        }
        for job in self.twin.list(JOB.0, JOB.1, None) {
            self.maybe_start(&job);
            self.maybe_expire(&job, now);
        }
    }

    fn schedule(&self, cj: &Value, now: DateTime<Utc>) {
        let (ns, name) = (meta(cj, "namespace"), meta(cj, "name"));
        let key = format!("{ns}/{name}");
        let Some(schedule) = cj["spec"]["schedule"]
            .as_str()
            .and_then(|s| cron::Schedule::from_str(&format!("0 {s}")).ok())
        else {
            return;
        };
        if cj["spec"]["suspend"] == true {
            return;
        }
        let last = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let last = st.last_tick.get(&key).copied().unwrap_or(now);
            st.last_tick.insert(key, now);
            last
        };
        let Some(due) = schedule.after(&last).next().filter(|t| *t <= now) else {
            return;
        };
        let active = self
            .twin
            .list(JOB.0, JOB.1, Some(&ns))
            .into_iter()
            .any(|j| owned_by(&j, cj) && !finished(&j));
        if active && cj["spec"]["concurrencyPolicy"] == "Forbid" {
            tracing::info!(cronjob = %name, "skipping a scheduled run: the previous one is still active");
            return;
        }
        let job = json!({
            "apiVersion": JOB.0, "kind": JOB.1,
            "metadata": {
                "name": format!("{name}-{}", due.timestamp() / 60),
                "namespace": ns,
                "labels": cj["spec"]["jobTemplate"]["metadata"]["labels"].clone(),
                "ownerReferences": [{"apiVersion": CRONJOB.0, "kind": CRONJOB.1, "name": name, "uid": cj["metadata"]["uid"].clone(), "controller": true}],
            },
            "spec": cj["spec"]["jobTemplate"]["spec"].clone(),
        });
        if let Err(e) = self.twin.upsert(job) {
            tracing::warn!(error = %e, "cannot create the scheduled Job");
        }
    }

    fn maybe_start(&self, job: &Value) {
        if finished(job) || !job["status"]["startTime"].is_null() {
            return;
        }
        let (ns, name) = (meta(job, "namespace"), meta(job, "name"));
        let uid = job["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let key = (format!("{ns}/{name}"), uid);
        let already = |st: &Mutex<RunnerState>| {
            st.lock()
                .unwrap_or_else(|p| p.into_inner())
                .started
                .contains(&key)
        };
        if already(&self.state) {
            return;
        }
        let program = match self.program(job) {
            Placement::Pending => return,
            Placement::Run(p) => Ok(p),
            Placement::Fail(why) => Err(why),
        };
        if !self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .started
            .insert(key)
        {
            return;
        }
        let pod = &job["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let command: Vec<String> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(container["args"].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let sa = pod["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let deadline = job["spec"]["activeDeadlineSeconds"]
            .as_u64()
            .map(Duration::from_secs);
        let env: Vec<(String, String)> = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_owned(),
                    e["value"].as_str()?.to_owned(),
                ))
            })
            .collect();
        self.set_status(
            &ns,
            &name,
            json!({"startTime": Utc::now().to_rfc3339(), "active": 1}),
        );
        let runner = self.clone();
        tokio::spawn(async move {
            let ok = match program {
                Ok(program) => {
                    runner
                        .run(&ns, &name, &sa, &program, &command, &env, deadline)
                        .await
                }
                Err(why) => {
                    tracing::warn!(job = %name, "{why}");
                    false
                }
            };
            let now = Utc::now().to_rfc3339();
            let (cond, field) = if ok {
                ("Complete", "succeeded")
            } else {
                ("Failed", "failed")
            };
            let mut status = json!({"active": 0, "completionTime": now,
                "conditions": [{"type": cond, "status": "True", "lastTransitionTime": now}]});
            status[field] = json!(1);
            runner.set_status(&ns, &name, status);
        });
    }

    /// Where the Job's program comes from: `<bin_dir>/<basename>`, or for a command inside a
    /// hostPath volume, the file uploaded to that path on the Node the pod is placed on.
    fn program(&self, job: &Value) -> Placement {
        let pod = &job["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let Some(command) = container["command"][0].as_str() else {
            return Placement::Fail("Job has no command".into());
        };
        let Some(host_path) = host_path_of(pod, container, command) else {
            return match Path::new(command).file_name() {
                Some(f) => Placement::Run(self.bin_dir.join(f)),
                None => Placement::Fail(format!("Job command {command:?} names no program")),
            };
        };
        let Some(node) = self.place(pod) else {
            tracing::debug!(job = %meta(job, "name"), "no Ready Node matches the Job's nodeSelector; pending");
            return Placement::Pending;
        };
        match self
            .boot
            .as_ref()
            .and_then(|b| b.node_file(&node, &host_path))
        {
            Some(file) => {
                tracing::info!(job = %meta(job, "name"), %node, host_path, "Job placed; running the Node's file");
                Placement::Run(file)
            }
            None => Placement::Fail(format!(
                "Job placed on Node {node}, which has no {host_path} (hostPath): the container cannot start"
            )),
        }
    }

    /// A random Ready, schedulable Node carrying every label of the pod's `nodeSelector`.
    fn place(&self, pod: &Value) -> Option<String> {
        use rand::seq::IndexedRandom as _;
        let selector = pod["nodeSelector"].as_object().cloned().unwrap_or_default();
        let fits: Vec<String> = self
            .twin
            .list("v1", "Node", None)
            .into_iter()
            .filter(|n| n["spec"]["unschedulable"] != true)
            .filter(|n| {
                n["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .filter(|n| {
                selector
                    .iter()
                    .all(|(k, v)| n["metadata"]["labels"][k.as_str()] == *v)
            })
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        fits.choose(&mut rand::rng()).cloned()
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        ns: &str,
        name: &str,
        sa: &str,
        program: &Path,
        command: &[String],
        env: &[(String, String)],
        deadline: Option<Duration>,
    ) -> bool {
        let Some(server) = self
            .listeners
            .snapshot()
            .into_iter()
            .find(|l| l.kind == ListenerKind::KubeApi)
            .map(|l| format!("https://{}", l.addr))
        else {
            tracing::warn!(job = %name, "no API server is up to run the Job against");
            return false;
        };
        let kubeconfig = self.work_dir.join(format!("job-{ns}-{name}.kubeconfig"));
        if let Err(e) = std::fs::write(
            &kubeconfig,
            self.twin.service_account_kubeconfig(&server, ns, sa),
        ) {
            tracing::warn!(error = %e, "cannot write the Job's kubeconfig");
            return false;
        }
        let pod_name = format!("{name}-{:05x}", rand::random::<u32>() & 0xfffff);
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(command.get(1..).unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("POD_NAME", &pod_name)
            .env("KUBECONFIG", &kubeconfig)
            .env("OXIDE_CONTROLLER_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(job = %name, program = %program.display(), error = %e, "cannot start the Job's process");
                return false;
            }
        };
        tracing::info!(job = %name, pod = %pod_name, program = %program.display(), "Job started");
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
            let pod = pod_name.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[{pod}] {line}");
                }
            });
        }
        let status = match deadline {
            Some(d) => match tokio::time::timeout(d, child.wait()).await {
                Ok(s) => s.ok(),
                Err(_) => {
                    let _ = child.kill().await;
                    tracing::warn!(job = %name, "Job exceeded activeDeadlineSeconds and was killed");
                    None
                }
            },
            None => child.wait().await.ok(),
        };
        let _ = std::fs::remove_file(&kubeconfig);
        let ok = status.is_some_and(|s| s.success());
        tracing::info!(job = %name, ok, "Job finished");
        ok
    }

    fn maybe_expire(&self, job: &Value, now: DateTime<Utc>) {
        let Some(ttl) = job["spec"]["ttlSecondsAfterFinished"].as_i64() else {
            return;
        };
        let done = job["status"]["completionTime"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
        if let Some(done) = done
            && now.signed_duration_since(done).num_seconds() >= ttl
        {
            self.twin.delete(
                JOB.0,
                JOB.1,
                Some(&meta(job, "namespace")),
                &meta(job, "name"),
            );
        }
    }

    fn set_status(&self, ns: &str, name: &str, patch: Value) {
        if let Some(mut job) = self.twin.get(JOB.0, JOB.1, Some(ns), name) {
            let status = job["status"].as_object().cloned().unwrap_or_default();
            let mut merged = Value::Object(status);
            if let (Some(m), Some(p)) = (merged.as_object_mut(), patch.as_object()) {
                for (k, v) in p {
                    m.insert(k.clone(), v.clone());
                }
            }
            job["status"] = merged;
            if let Err(e) = self.twin.upsert(job) {
                tracing::warn!(error = %e, "cannot update the Job's status");
            }
        }
    }
}

/// Where a Job's program comes from.
enum Placement {
    /// Run this file.
    Run(PathBuf),
    /// No Node fits yet: leave the Job pending.
    Pending,
    /// The container cannot start.
    Fail(String),
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

fn meta(v: &Value, field: &str) -> String {
    v["metadata"][field].as_str().unwrap_or_default().to_owned()
}

fn finished(job: &Value) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
    })
}

fn owned_by(job: &Value, cj: &Value) -> bool {
    job["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|o| {
            o.iter()
                .any(|r| r["kind"] == "CronJob" && r["name"] == cj["metadata"]["name"])
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
