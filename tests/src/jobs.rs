//! The cluster twin's stand-in for the CronJob and Job controllers and the kubelet: CronJobs
//! fire on their schedule (Kubernetes' cron dialect, [`oxide_controller::kcron`]; `Forbid`,
//! `startingDeadlineSeconds`, `status.active` and the history limits as `syncCronJob` has them),
//! and every Job
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

    /// One `syncCronJob` pass of the CronJob controller: forget finished or vanished Jobs
    /// from `status.active`, apply the history limits to every Job the CronJob controls,
    /// then start the due run unless it is too late (`startingDeadlineSeconds`) or, with
    /// `Forbid`, a Job the controller started is still active. A Job someone else made from
    /// the template (the webhook's, `kubectl create job --from`) is owned but not in
    /// `status.active`, so it does not hold back a scheduled run, as in the real controller.
    fn schedule(&self, cj: &Value, now: DateTime<Utc>) {
        let (ns, name) = (meta(cj, "namespace"), meta(cj, "name"));
        let key = format!("{ns}/{name}");
        let owned: Vec<Value> = self
            .twin
            .list(JOB.0, JOB.1, Some(&ns))
            .into_iter()
            .filter(|j| owned_by(j, cj))
            .collect();
        let mut cj = cj.clone();
        let before = cj["status"].clone();
        let mut active: Vec<Value> = cj["status"]["active"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        active.retain(|r| {
            owned
                .iter()
                .any(|j| j["metadata"]["uid"] == r["uid"] && !finished(j))
        });
        for j in owned.iter().filter(|j| !finished(j)) {
            if !active.iter().any(|r| r["uid"] == j["metadata"]["uid"]) {
                tracing::debug!(cronjob = %name, job = %meta(j, "name"), "UnexpectedJob: saw a job that the controller did not create");
            }
        }
        self.cleanup_finished(&cj, &owned);
        cj["status"]["active"] = json!(active);
        let save = |cj: &Value| {
            if cj["status"] != before
                && let Err(e) = self.twin.upsert(cj.clone())
            {
                tracing::warn!(error = %e, "cannot update the CronJob's status");
            }
        };
        let schedule = cj["spec"]["schedule"]
            .as_str()
            .and_then(|s| oxide_controller::kcron::Schedule::parse(s).ok());
        let Some(schedule) = schedule.filter(|_| cj["spec"]["suspend"] != true) else {
            return save(&cj);
        };
        let last = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let last = st.last_tick.get(&key).copied().unwrap_or(now);
            st.last_tick.insert(key, now);
            last
        };
        // The most recent unmet time in (last, now], as `mostRecentScheduleTime` finds it.
        let mut due = None;
        let mut t = last;
        while let Some(next) = schedule.next_after(t).filter(|n| *n <= now) {
            due = Some(next);
            t = next;
        }
        let Some(due) = due else {
            return save(&cj);
        };
        if let Some(deadline) = cj["spec"]["startingDeadlineSeconds"].as_i64()
            && due + chrono::Duration::seconds(deadline) < now
        {
            tracing::info!(cronjob = %name, "MissSchedule: missed the scheduled time to start a job");
            return save(&cj);
        }
        if !active.is_empty() && cj["spec"]["concurrencyPolicy"] == "Forbid" {
            tracing::info!(cronjob = %name, "JobAlreadyActive: skipping a scheduled run, the previous one is still active");
            return save(&cj);
        }
        let job = json!({
            "apiVersion": JOB.0, "kind": JOB.1,
            "metadata": {
                "name": format!("{name}-{}", due.timestamp() / 60),
                "namespace": ns,
                "labels": cj["spec"]["jobTemplate"]["metadata"]["labels"].clone(),
                "ownerReferences": [{"apiVersion": CRONJOB.0, "kind": CRONJOB.1, "name": name, "uid": cj["metadata"]["uid"].clone(), "controller": true, "blockOwnerDeletion": true}],
            },
            "spec": cj["spec"]["jobTemplate"]["spec"].clone(),
        });
        match self.twin.upsert(job) {
            Ok(created) => {
                let mut active = active;
                active.push(json!({"apiVersion": JOB.0, "kind": JOB.1, "namespace": ns,
                    "name": created["metadata"]["name"].clone(), "uid": created["metadata"]["uid"].clone()}));
                cj["status"]["active"] = json!(active);
                cj["status"]["lastScheduleTime"] =
                    json!(due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            }
            Err(e) => tracing::warn!(error = %e, "cannot create the scheduled Job"),
        }
        save(&cj);
    }

    /// `cleanupFinishedJobs`: keep the newest `successfulJobsHistoryLimit` complete and
    /// `failedJobsHistoryLimit` failed Jobs the CronJob controls (by start time), delete the rest.
    fn cleanup_finished(&self, cj: &Value, owned: &[Value]) {
        for (cond, limit) in [
            ("Complete", &cj["spec"]["successfulJobsHistoryLimit"]),
            ("Failed", &cj["spec"]["failedJobsHistoryLimit"]),
        ] {
            let Some(limit) = limit.as_u64() else {
                continue;
            };
            let mut done: Vec<&Value> = owned
                .iter()
                .filter(|j| finished_as(j) == Some(cond))
                .collect();
            let excess = done.len().saturating_sub(limit as usize);
            done.sort_by_key(|j| j["status"]["startTime"].as_str().unwrap_or("").to_owned());
            for j in done.into_iter().take(excess) {
                self.twin
                    .delete(JOB.0, JOB.1, Some(&meta(j, "namespace")), &meta(j, "name"));
            }
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
            Placement::Run(p, node) => Ok((p, node)),
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
        let template = job["spec"]["template"].clone();
        let job_uid = job["metadata"]["uid"].clone();
        tokio::spawn(async move {
            let ok = match program {
                Ok((program, node)) => {
                    let pod = runner.job_pod(&ns, &name, &job_uid, &template, node);
                    runner
                        .run(&ns, &name, &sa, &program, &command, &env, deadline, &pod)
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
                Some(f) => Placement::Run(self.bin_dir.join(f), None),
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
                Placement::Run(file, Some(node))
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

    /// The Job's Pod, as the Job controller and the scheduler would make and bind it: named
    /// `<job>-<5 hex>`, the template's labels plus `job-name`, owned by the Job, on `node`
    /// (or a Ready, schedulable Node matching its `nodeSelector`; unbound if none is). The
    /// run's `POD_NAME` is this name, so a run can see (and must not evict) its own pod.
    fn job_pod(
        &self,
        ns: &str,
        job: &str,
        job_uid: &Value,
        template: &Value,
        node: Option<String>,
    ) -> Value {
        let name = format!("{job}-{:05x}", rand::random::<u32>() & 0xfffff);
        let mut labels = template["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        labels.insert("job-name".into(), json!(job));
        labels.insert("batch.kubernetes.io/job-name".into(), json!(job));
        let mut spec = template["spec"].clone();
        if let Some(node) = node.or_else(|| self.place(&spec)) {
            spec["nodeName"] = json!(node);
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                "ownerReferences": [{"apiVersion": JOB.0, "kind": JOB.1, "name": job, "uid": job_uid, "controller": true, "blockOwnerDeletion": true}]},
            "spec": spec, "status": {"phase": "Pending"}});
        match self.twin.upsert(pod.clone()) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(error = %e, job, "cannot create the Job's pod");
                pod
            }
        }
    }

    /// Whether the Job's pod is gone or being deleted (evicted): its process must stop.
    fn pod_going(&self, ns: &str, pod: &str) -> bool {
        self.twin
            .get("v1", "Pod", Some(ns), pod)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
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
        pod: &Value,
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
        let pod_name = meta(pod, "name");
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
        // The pod evicted or deleted under the process: the kubelet stops its containers.
        let evicted = async {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if self.pod_going(ns, &pod_name) {
                    return;
                }
            }
        };
        let limit = deadline.unwrap_or(Duration::MAX);
        let status = tokio::select! {
            s = tokio::time::timeout(limit, child.wait()) => match s {
                Ok(s) => s.ok(),
                Err(_) => {
                    let _ = child.kill().await;
                    tracing::warn!(job = %name, "Job exceeded activeDeadlineSeconds and was killed");
                    None
                }
            },
            () = evicted => {
                let _ = child.kill().await;
                tracing::warn!(job = %name, pod = %pod_name, "the Job's pod was evicted or deleted; its process was killed");
                None
            }
        };
        let _ = std::fs::remove_file(&kubeconfig);
        let ok = status.is_some_and(|s| s.success());
        if let Some(mut p) = self.twin.get("v1", "Pod", Some(ns), &pod_name)
            && p["metadata"]["deletionTimestamp"].is_null()
        {
            p["status"]["phase"] = json!(if ok { "Succeeded" } else { "Failed" });
            if let Err(e) = self.twin.upsert(p) {
                tracing::debug!(error = %e, "cannot finish the Job's pod");
            }
        }
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
    /// Run this file (on this Node, when the placement chose one).
    Run(PathBuf, Option<String>),
    /// No Node fits yet: leave the Job pending.
    Pending,
    /// The container cannot start.
    Fail(String),
}

/// The host path behind `program` when it lies inside one of the container's volume mounts
/// whose volume is a `hostPath`.
pub(crate) fn host_path_of(pod: &Value, container: &Value, program: &str) -> Option<String> {
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
    finished_as(job).is_some()
}

/// `Complete` or `Failed` when that condition is True.
fn finished_as(job: &Value) -> Option<&'static str> {
    let conditions = job["status"]["conditions"].as_array()?;
    ["Complete", "Failed"].into_iter().find(|t| {
        conditions
            .iter()
            .any(|c| c["type"] == *t && c["status"] == "True")
    })
}

/// Whether the CronJob is the Job's controller (by uid, as `metav1.IsControlledBy`).
fn owned_by(job: &Value, cj: &Value) -> bool {
    job["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|o| {
            o.iter().any(|r| {
                r["kind"] == "CronJob"
                    && r["uid"] == cj["metadata"]["uid"]
                    && r["controller"] == true
            })
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::twin::TwinConfig;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn runner() -> JobRunner {
        let twin = Twin::new(TwinConfig::default()).unwrap();
        let dir = std::env::temp_dir();
        JobRunner::new(twin, Listeners::new(), dir.clone(), dir)
    }

    fn cronjob(r: &JobRunner, schedule: &str) -> Value {
        r.twin
            .upsert(json!({"apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": {"name": "cj", "namespace": "default"},
                "spec": {"schedule": schedule, "concurrencyPolicy": "Forbid", "successfulJobsHistoryLimit": 1,
                    "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "command": ["/bin/true"]}]}}}}}}))
            .unwrap()
    }

    fn jobs(r: &JobRunner) -> Vec<String> {
        r.twin
            .list(JOB.0, JOB.1, Some("default"))
            .iter()
            .map(|j| meta(j, "name"))
            .collect()
    }

    fn sync(r: &JobRunner, now: &str) {
        let cj = r
            .twin
            .get(CRONJOB.0, CRONJOB.1, Some("default"), "cj")
            .unwrap();
        r.schedule(&cj, at(now));
    }

    fn finish(r: &JobRunner, name: &str, cond: &str, start: &str) {
        let mut j = r.twin.get(JOB.0, JOB.1, Some("default"), name).unwrap();
        j["status"] = json!({"startTime": start, "conditions": [{"type": cond, "status": "True"}]});
        r.twin.upsert(j).unwrap();
    }

    #[test]
    fn day_of_week_zero_fires_on_sunday() {
        let r = runner();
        cronjob(&r, "0 3 * * 0");
        // 2026-11-21 is a Saturday.
        sync(&r, "2026-11-21T00:00:00Z");
        sync(&r, "2026-11-21T23:59:00Z");
        assert!(jobs(&r).is_empty(), "nothing on Saturday");
        sync(&r, "2026-11-22T03:00:10Z");
        let fired = at("2026-11-22T03:00:00Z").timestamp() / 60;
        assert_eq!(jobs(&r), [format!("cj-{fired}")]);
        let cj = r
            .twin
            .get(CRONJOB.0, CRONJOB.1, Some("default"), "cj")
            .unwrap();
        assert_eq!(cj["status"]["lastScheduleTime"], "2026-11-22T03:00:00Z");
        assert_eq!(cj["status"]["active"][0]["name"], format!("cj-{fired}"));
    }

    #[test]
    fn a_job_made_by_hand_from_the_template_does_not_hold_back_a_forbid_run() {
        let r = runner();
        let cj = cronjob(&r, "*/5 * * * *");
        // The webhook's Job: owned by the CronJob, but not in its status.active.
        r.twin
            .upsert(json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "now", "namespace": "default", "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "cj", "uid": cj["metadata"]["uid"].clone(), "controller": true}]},
                "spec": {}}))
            .unwrap();
        sync(&r, "2026-11-22T10:01:00Z");
        sync(&r, "2026-11-22T10:05:30Z");
        assert_eq!(jobs(&r).len(), 2, "{:?}", jobs(&r));
        // Its own scheduled Job, still running, does hold back the next one.
        sync(&r, "2026-11-22T10:10:30Z");
        assert_eq!(jobs(&r).len(), 2, "{:?}", jobs(&r));
    }

    #[test]
    fn history_limits_apply_to_every_job_the_cronjob_controls() {
        let r = runner();
        cronjob(&r, "*/5 * * * *");
        sync(&r, "2026-11-22T10:01:00Z");
        sync(&r, "2026-11-22T10:05:30Z");
        let first = jobs(&r)[0].clone();
        finish(&r, &first, "Complete", "2026-11-22T10:05:31Z");
        sync(&r, "2026-11-22T10:10:30Z");
        let second = jobs(&r).into_iter().find(|j| *j != first).unwrap();
        finish(&r, &second, "Complete", "2026-11-22T10:10:31Z");
        sync(&r, "2026-11-22T10:12:00Z");
        // successfulJobsHistoryLimit: 1 keeps only the newest complete Job.
        assert_eq!(jobs(&r), [second]);
    }

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
