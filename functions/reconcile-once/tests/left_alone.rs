//! Issue 46 acceptance, item 1: a cluster left alone keeps its certificates. The simulator
//! scales a year down (`SimOptions::cert_lifetime`: k3s's 365-day certificates last
//! [`LIFETIME`], its 90-day renewal window and monitor scale with it); the real
//! `reconcile-once` runs every few seconds, as its CronJob would, with nobody acting, for
//! three lifetimes. Every node's certificates are renewed at least twice, the API never
//! presents an ended certificate, and the cluster ends Ready. Without the reconcile the same
//! certificates end and TLS fails: `oxide-sim`'s
//! `sim_certs::certificates_end_fail_tls_and_a_restart_inside_the_window_renews_them`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::domain::status::Status;
use oxide_controller::ports::state::{self, StateStore};
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimOptions};

const BIN: &str = env!("CARGO_BIN_EXE_reconcile-once");
/// What 365 days last here.
const LIFETIME: Duration = Duration::from_secs(80);

/// `days` of the scaled year, in the real days the product's settings are written in.
fn scaled_days(days: f64) -> f64 {
    days * LIFETIME.as_secs_f64() / (365.0 * 86_400.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_left_alone_for_three_certificate_lifetimes_renews_them_and_stays_ready() {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 1,
        }),
        cert_lifetime: LIFETIME,
        ..SimOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    let kubeconfig = sim.kubeconfig.clone().expect("preset kubeconfig");
    let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
        .await
        .unwrap();
    let store = KubeStateStore::new(client, "kube-system");
    // Restart 85 (scaled) days ahead, inside k3s's 90; Degraded 20 days ahead.
    let snap = store.read_config().await.unwrap();
    let mut spec = ClusterSpec::from_yaml(snap.spec_yaml().unwrap_or_default()).unwrap();
    spec.certificates.renew_before_days = scaled_days(85.0);
    spec.certificates.degraded_before_days = scaled_days(20.0);
    let mut data = snap.data.clone();
    data.insert(state::keys::SPEC.into(), spec.to_yaml());
    store
        .replace_config(&snap.resource_version, data)
        .await
        .unwrap();

    let started = Instant::now();
    // Renewals per node: restarts the node's monitor confirmed (each run counted once).
    let mut restarts: BTreeMap<String, u32> = BTreeMap::new();
    let mut runs = std::collections::BTreeSet::new();
    let mut logs = Vec::new();
    let mut api_ok = 0u32;
    while started.elapsed() < 3 * LIFETIME {
        let out = tokio::process::Command::new(BIN)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--log-format", "json"])
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        // Never an ended certificate, whoever asks: this run, or a client now.
        assert!(
            !stderr.contains("Expired") && !stderr.contains("expired certificate"),
            "a run met an ended certificate after {:?}:\n{stderr}\n{}",
            started.elapsed(),
            logs.join("\n")
        );
        match probe(&kubeconfig).await {
            Ok(()) => api_ok += 1,
            Err(e) => assert!(
                !e.contains("Expired"),
                "the API presented an ended certificate after {:?}: {e}\n{}",
                started.elapsed(),
                logs.join("\n")
            ),
        }
        let status = store
            .read_config()
            .await
            .ok()
            .and_then(|s| s.status_json().and_then(Status::from_json));
        if let Some(s) = status.as_ref().filter(|s| runs.insert(s.run_id.clone())) {
            for a in &s.last_plan {
                if a.action == "restarted" && a.outcome == "done" {
                    assert!(
                        a.reason.contains("were renewed"),
                        "a restart that renewed nothing: {a:?}"
                    );
                    *restarts.entry(a.target.clone()).or_default() += 1;
                }
            }
        }
        let evs = {
            use oxide_controller::ports::cluster::Cluster as _;
            let c = oxide_controller::adapters::kube_cluster::KubeCluster::new(
                oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
                    .await
                    .unwrap(),
                "kube-system",
            );
            c.certificate_events()
                .await
                .map(|v| {
                    (
                        oxide_controller::domain::certificates::latest(&v),
                        v.into_iter()
                            .map(|e| {
                                format!("{} {} {} {}", e.node, e.reason, e.last_seen, e.message)
                            })
                            .collect::<Vec<_>>(),
                    )
                })
                .map_err(|e| e.to_string())
        };
        logs.push(format!(
            "{:?}: events {evs:?}\n  exit {:?}; plan {:?}; certificates {:?}; findings {:?}; run {:?}",
            started.elapsed(),
            out.status.code(),
            status.as_ref().map(|s| &s.last_plan),
            status.as_ref().map(|s| &s.certificates),
            status.as_ref().map(|s| &s.findings),
            status.as_ref().map(|s| &s.run_id),
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let log = logs.join("\n");
    assert_eq!(
        restarts.len(),
        2,
        "both nodes restarted: {restarts:?}\n{log}"
    );
    assert!(
        restarts.values().all(|n| *n >= 2),
        "each node's certificates renewed at least twice in three lifetimes: {restarts:?}\n{log}"
    );
    assert!(api_ok > 0);
    // Let the last restart finish; the cluster is Ready and not Degraded.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let out = tokio::process::Command::new(BIN)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let s = store
            .read_config()
            .await
            .unwrap()
            .status_json()
            .and_then(Status::from_json)
            .unwrap();
        let ready = s.condition("Ready").is_some_and(|c| c.status == "True");
        if out.status.success() && ready {
            assert_eq!(
                s.condition("Degraded").map(|c| c.status.as_str()),
                Some("False"),
                "{}",
                s.to_json()
            );
            assert_eq!(s.certificates.len(), 2, "{}", s.to_json());
            break;
        }
        assert!(
            Instant::now() < until,
            "not Ready after the last lifetime: {}\n{log}",
            s.to_json()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// `kubectl version` with the operator's kubeconfig: Ok, or the client's error chain.
async fn probe(kubeconfig: &std::path::Path) -> Result<(), String> {
    let client = oxide_controller::adapters::kubeclient::client(Some(kubeconfig), None)
        .await
        .map_err(|e| format!("{e:?}"))?;
    client
        .apiserver_version()
        .await
        .map(drop)
        .map_err(|e| format!("{e:?}"))
}
