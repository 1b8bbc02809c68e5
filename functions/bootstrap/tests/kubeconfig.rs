//! Issue 46 item 2: the laptop's kubeconfig outlives its client certificate. The simulator
//! scales a year down (`SimOptions::cert_lifetime`: k3s's 365-day certificates, `k3s.yaml`'s
//! client certificate among them, last [`LIFETIME`]). The real `reconcile-once` runs every few
//! seconds as the reconcile's ServiceAccount (as its CronJob would), restarting nodes for their
//! certificates; `bootstrap kubeconfig` renews the laptop's kubeconfig now and then. Checked:
//! the kubeconfig bootstrap wrote ends with its certificate (the API refuses it), the renewed
//! one works throughout, and a laptop command warns about a certificate that ends soon,
//! naming `bootstrap kubeconfig`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::env_with;
use oxide_sim::SimOptions;

/// What 365 days last here: long enough for bootstrap to finish inside one.
const LIFETIME: Duration = Duration::from_secs(120);

/// `days` of the scaled year, in the real days the product's settings are written in.
fn scaled_days(days: f64) -> f64 {
    days * LIFETIME.as_secs_f64() / (365.0 * 86_400.0)
}

/// `kubectl version` with `kubeconfig`: Ok, or the error chain.
async fn probe(kubeconfig: &std::path::Path) -> Result<(), String> {
    let client = oxide_controller::adapters::kubeclient::client(Some(kubeconfig), Some("demo"))
        .await
        .map_err(|e| format!("{e:?}"))?;
    client
        .apiserver_version()
        .await
        .map(drop)
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_renewed_by_bootstrap_kubeconfig_works_after_the_first_one_ended() {
    let env = env_with(SimOptions {
        cert_lifetime: LIFETIME,
        ..SimOptions::default()
    })
    .await;
    let bins = common::workspace_binaries();
    env.run_ok(&["--control-planes", "1", "--workers", "1"])
        .await;
    let first = env.dir.path().join("first.kubeconfig");
    std::fs::copy(env.kubeconfig(), &first).unwrap();
    let text = std::fs::read_to_string(&first).unwrap();
    let first_end = oxide_controller::adapters::kubeconfig::client_certificate_end(&text)
        .expect("k3s.yaml's client certificate has an end");

    // The reconcile's own identity, as its Job has it: a ServiceAccount token.
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned();
    let real = env.sim.control_planes().into_iter().next().unwrap();
    let sa = env.dir.path().join("reconcile.kubeconfig");
    std::fs::write(
        &sa,
        real.control_plane
            .service_account_kubeconfig(
                &server,
                "oxide-controller-jobs",
                "oxide-controller-reconcile",
            )
            .await
            .unwrap(),
    )
    .unwrap();
    // Restarts 85 (scaled) days ahead, inside k3s's 90.
    let out = env
        .sim
        .kube()
        .get("v1", "ConfigMap", Some("kube-system"), "oxide-controller")
        .await
        .unwrap();
    let mut spec = oxide_controller::domain::spec::ClusterSpec::from_yaml(
        out["data"]["spec.yaml"].as_str().unwrap(),
    )
    .unwrap();
    spec.certificates.renew_before_days = scaled_days(85.0);
    spec.certificates.degraded_before_days = scaled_days(20.0);
    env.sim
        .kube()
        .merge_patch(
            "v1",
            "ConfigMap",
            Some("kube-system"),
            "oxide-controller",
            &serde_json::json!({"data": {"spec.yaml": spec.to_yaml()}}),
        )
        .await
        .unwrap();

    let started = Instant::now();
    let mut renewed = 0u32;
    let mut last_renew = Instant::now() - Duration::from_secs(60);
    let mut first_refused = false;
    let mut warned = false;
    let mut log = Vec::new();
    while started.elapsed() < 2 * LIFETIME {
        let run = tokio::process::Command::new(bins.join("reconcile-once"))
            .arg("--kubeconfig")
            .arg(&sa)
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        log.push(format!(
            "{:?}: reconcile exit {:?}",
            started.elapsed(),
            run.status.code()
        ));
        if last_renew.elapsed() > Duration::from_secs(10) {
            let out = env
                .command(&env.sub_args("kubeconfig", "demo", &[]))
                .output()
                .await
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            log.push(format!(
                "{:?}: bootstrap kubeconfig {:?}: {stdout}",
                started.elapsed(),
                out.status.code()
            ));
            if out.status.success() {
                renewed += 1;
                last_renew = Instant::now();
            }
        }
        // The renewed kubeconfig never meets an ended certificate, on either side.
        if let Err(e) = probe(&env.kubeconfig()).await {
            assert!(
                !e.contains("Expired") && !e.contains("CertificateExpired"),
                "the renewed kubeconfig failed on a certificate after {:?}: {e}\n{}",
                started.elapsed(),
                log.join("\n")
            );
        }
        // The first one, once its certificate ended, is refused.
        if chrono::Utc::now() > first_end + chrono::Duration::seconds(2)
            && let Err(e) = probe(&first).await
        {
            first_refused = true;
            log.push(format!("first kubeconfig: {e}"));
        }
        // A laptop command with a kubeconfig whose certificate ends within 30 days warns.
        if !warned {
            let status = tokio::process::Command::new(bins.join("scale"))
                .args(["status", "--kubeconfig"])
                .arg(env.kubeconfig())
                .args(["--context", "demo"])
                .env("RUST_LOG", "warn")
                .kill_on_drop(true)
                .output()
                .await
                .unwrap();
            let stderr = String::from_utf8_lossy(&status.stderr);
            warned = stderr.contains("bootstrap kubeconfig --cluster demo");
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let log = log.join("\n");
    assert!(
        renewed >= 5,
        "bootstrap kubeconfig renewed {renewed} times\n{log}"
    );
    assert!(
        first_refused,
        "the kubeconfig bootstrap wrote still worked after its certificate's end {first_end}\n{log}"
    );
    assert!(
        warned,
        "no laptop command warned about the ending certificate"
    );
    // The one on disk now ends after the first one did: it was renewed.
    let now_end = oxide_controller::adapters::kubeconfig::client_certificate_end(
        &std::fs::read_to_string(env.kubeconfig()).unwrap(),
    )
    .unwrap();
    assert!(
        now_end > first_end + chrono::Duration::seconds(30),
        "{now_end} vs {first_end}"
    );
    probe(&env.kubeconfig())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{log}"));
}
