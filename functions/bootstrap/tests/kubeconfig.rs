//! Issue 46 item 2: the laptop's kubeconfig outlives its client certificate. The simulator
//! scales a year down (`SimOptions::cert_lifetime`: k3s's 365-day certificates, `k3s.yaml`'s
//! client certificate among them, last [`LIFETIME`]). The real `reconcile-once` runs every few
//! seconds as the reconcile's ServiceAccount (as its CronJob would), restarting nodes for their
//! certificates; `bootstrap kubeconfig` renews the laptop's kubeconfig now and then. Checked:
//! while the kubeconfig's certificate is valid it is renewed through the CSR API (no rack, no
//! SSH: a new key, a year's certificate for the operator user with cluster-admin's rights, no
//! CertificateSigningRequest left behind); the kubeconfig bootstrap wrote ends with its
//! certificate (the API refuses it), the renewed one works throughout, a laptop command warns
//! about a certificate that ends soon, naming `bootstrap kubeconfig`, and an ended one is
//! renewed over SSH.

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

/// The `client-key-data` of context `demo`'s user, as kube reads it.
fn client_key(kubeconfig: &std::path::Path) -> String {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let doc = serde_json::to_value(&kc).unwrap();
    doc["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "demo")
        .unwrap()["user"]["client-key-data"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Creates `obj` (a review: the answer is its status) as the kubeconfig's user.
async fn review<K>(kubeconfig: &std::path::Path, obj: K) -> K
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let client = oxide_controller::adapters::kubeclient::client(Some(kubeconfig), Some("demo"))
        .await
        .unwrap();
    kube::Api::<K>::all(client)
        .create(&Default::default(), &obj)
        .await
        .unwrap()
}

/// With a still-valid kubeconfig, `bootstrap kubeconfig --via csr` renews it without the rack
/// (an address nothing listens on: the SSH path could not even find the server).
async fn renewal_through_the_csr_api(env: &common::Env, bins: &std::path::Path) {
    let path = env.kubeconfig();
    let before_key = client_key(&path);
    let before_end = oxide_controller::adapters::kubeconfig::client_certificate_end(
        &std::fs::read_to_string(&path).unwrap(),
    )
    .unwrap();
    let out = env
        .command(&env.sub_args(
            "kubeconfig",
            "demo",
            &["--via", "csr", "--oxide-host", "http://127.0.0.1:9"],
        ))
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(
            "through the CertificateSigningRequest API as oxide-controller:operator:demo"
        ),
        "{stdout}"
    );
    // A new key, and the signer's year (less its 5-minute backdate), not the scaled one.
    assert_ne!(client_key(&path), before_key);
    let end = oxide_controller::adapters::kubeconfig::client_certificate_end(
        &std::fs::read_to_string(&path).unwrap(),
    )
    .unwrap();
    eprintln!("renewed through the CSR API: NotAfter {end} (before: {before_end})");
    assert!(
        end > chrono::Utc::now() + chrono::Duration::days(364),
        "{end} vs {before_end}"
    );
    // Accepted, as the operator user, with cluster-admin's rights.
    use k8s_openapi::api::{authentication::v1 as authn, authorization::v1 as authz};
    let me = review(&path, authn::SelfSubjectReview::default()).await;
    assert_eq!(
        me.status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .as_deref(),
        Some("oxide-controller:operator:demo")
    );
    let access = review(
        &path,
        authz::SelfSubjectAccessReview {
            spec: authz::SelfSubjectAccessReviewSpec {
                resource_attributes: Some(authz::ResourceAttributes {
                    verb: Some("*".into()),
                    group: Some("*".into()),
                    resource: Some("*".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await;
    assert!(
        access.status.is_some_and(|s| s.allowed),
        "not cluster-admin"
    );
    let status = tokio::process::Command::new(bins.join("scale"))
        .args(["status", "--kubeconfig"])
        .arg(&path)
        .args(["--context", "demo"])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(
        status.status.success(),
        "scale status with the renewed kubeconfig: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    // No request left behind.
    let csrs = env
        .sim
        .kube()
        .try_list("certificates.k8s.io/v1", "CertificateSigningRequest", None)
        .await
        .unwrap();
    assert!(
        !csrs.iter().any(|c| c["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("oxide-controller-operator"))),
        "{csrs:?}"
    );
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

    renewal_through_the_csr_api(&env, &bins).await;

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
        // A laptop command with a kubeconfig whose certificate ends within 30 days warns
        // (bootstrap's: the renewed one lasts a year).
        if !warned {
            let status = tokio::process::Command::new(bins.join("scale"))
                .args(["status", "--kubeconfig"])
                .arg(&first)
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

    // An ended certificate: renewed over SSH, from k3s.yaml.
    std::fs::copy(&first, env.kubeconfig()).unwrap();
    let out = env
        .command(&env.sub_args("kubeconfig", "demo", &[]))
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && stdout.contains("k3s.yaml over SSH"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    probe(&env.kubeconfig())
        .await
        .unwrap_or_else(|e| panic!("after the SSH renewal: {e}\n{log}"));
}
