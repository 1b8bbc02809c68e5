//! Audit sim-3 K5: `reconcile-once` against writes the apiserver committed but answered 504
//! ("may still be processing the request"; the simulator's `kube_after` faults). The Lease
//! create, the Lease updates (take, release) and the status write are each retried or
//! re-read: the run succeeds, its status is the one stored, and the Lease is left free, so
//! nothing is lost, doubled or left locked.

use std::path::Path;

use oxide_sim::SimHandle;
use oxide_sim::oxide::{AfterFault, FaultSpec};
use serde_json::Value;

#[path = "support/pending.rs"]
mod support;

async fn reconcile(kubeconfig: &Path) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(support::RECONCILE)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--log-format", "json", "--holder", "committed-writes"])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The run id of the run's summary line.
fn run_id(log: &str) -> String {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message"] == "reconcile finished")
        .and_then(|v| v["run_id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no summary line:\n{log}"))
}

async fn stored_run_id(sim: &SimHandle) -> Option<String> {
    let cm = sim
        .kube()
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await?;
    let status: Value = serde_json::from_str(cm["data"]["status.json"].as_str()?).ok()?;
    status["runId"].as_str().map(str::to_owned)
}

fn after(sim: &SimHandle, keys: &[(&str, u32)]) {
    sim.faults().set(FaultSpec {
        kube_after: keys
            .iter()
            .map(|(k, times)| {
                (
                    (*k).to_owned(),
                    AfterFault {
                        times: *times,
                        ..AfterFault::default()
                    },
                )
            })
            .collect(),
        ..FaultSpec::default()
    });
}

fn all_fired(sim: &SimHandle) -> bool {
    sim.faults().get().kube_after.values().all(|f| f.times == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_and_status_writes_answered_504_after_they_landed_are_not_lost_or_left_locked() {
    let (sim, _) = support::cluster(false, 3).await;
    let kubeconfig = sim
        .kubeconfig
        .clone()
        .unwrap_or_else(|| panic!("kubeconfig"));
    // No Lease yet: the run creates it, and is told the create failed.
    let _ = sim
        .kube()
        .delete(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-system"),
            "oxide-controller",
        )
        .await;
    assert!(support::lease(&sim).await.is_none());
    after(&sim, &[("create leases", 1)]);
    let (code, log) = reconcile(&kubeconfig).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(all_fired(&sim), "the Lease create was answered 504");
    assert_eq!(stored_run_id(&sim).await, Some(run_id(&log)), "{log}");
    let held = support::lease(&sim)
        .await
        .unwrap_or_else(|| panic!("a Lease"));
    assert!(
        held["spec"]["holderIdentity"].is_null(),
        "left free: {held}"
    );

    // The Lease take and release, and the status write, each committed but answered 504.
    after(&sim, &[("update leases", 2), ("update configmaps", 1)]);
    let (code, log) = reconcile(&kubeconfig).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(all_fired(&sim), "{:?}", sim.faults().get().kube_after);
    assert_eq!(stored_run_id(&sim).await, Some(run_id(&log)), "{log}");
    let held = support::lease(&sim)
        .await
        .unwrap_or_else(|| panic!("a Lease"));
    assert!(
        held["spec"]["holderIdentity"].is_null(),
        "left free: {held}"
    );

    // The next run does not find the Lease held.
    sim.faults().set(FaultSpec::default());
    let (code, log) = reconcile(&kubeconfig).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("holds the Lease"), "{log}");
    assert_eq!(stored_run_id(&sim).await, Some(run_id(&log)));
}
