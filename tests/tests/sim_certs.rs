//! k3s's leaf certificates in the simulator, with the lifetime scaled down (see
//! `oxide_sim::guest::certs`): the monitor's Events, a server whose certificates ended fails
//! TLS, and a restart inside the renewal window renews them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node};
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimOptions};

const LIFETIME: Duration = Duration::from_secs(30);

async fn client(path: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// The monitor's Events: (node, reason, message), newest last.
async fn monitor_events(client: &kube::Client) -> Vec<(String, String, String)> {
    let events: kube::Api<Event> = kube::Api::namespaced(client.clone(), "default");
    let lp = kube::api::ListParams::default().fields("source=k3s-cert-monitor");
    let mut list = events.list(&lp).await.unwrap().items;
    list.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    list.into_iter()
        .map(|e| {
            (
                e.involved_object.name.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

async fn wait_until<F, Fut>(what: &str, patience: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + patience;
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn certificates_end_fail_tls_and_a_restart_inside_the_window_renews_them() {
    let sim = Sim::start(SimOptions {
        preset: Some(Preset::Cluster {
            control_plane: 1,
            workers: 1,
        }),
        cert_lifetime: LIFETIME,
        ..SimOptions::default()
    })
    .await
    .expect("preset builds");
    let started = Instant::now();
    let path = sim.kubeconfig.clone().unwrap();
    let kube = client(&path).await;
    let nodes: kube::Api<Node> = kube::Api::all(kube.clone());
    let listed = nodes.list(&Default::default()).await.unwrap().items;
    assert_eq!(listed.len(), 2);
    let names: Vec<String> = listed
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    // The server's Node is named after its instance (the one rebooted below).
    let server = listed
        .iter()
        .find(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("node-role.kubernetes.io/control-plane"))
        })
        .and_then(|n| n.metadata.name.clone())
        .expect("a server Node");

    // On start, every node's monitor says its certificates are fine.
    wait_until("an OK event per node", Duration::from_secs(10), || async {
        let evs = monitor_events(&kube).await;
        names.iter().all(|n| {
            evs.iter()
                .any(|(node, reason, _)| node == n && reason == "CertificateExpirationOK")
        })
    })
    .await;

    // Inside the renewal window (the last 90/365 of the lifetime) it warns, naming the end.
    wait_until("a warning per node", LIFETIME, || async {
        let evs = monitor_events(&kube).await;
        names.iter().all(|n| {
            evs.iter().any(|(node, reason, msg)| {
                node == n
                    && reason == "CertificateExpirationWarning"
                    && msg.contains("will expire within 90 days at ")
            })
        })
    })
    .await;
    let end_secs = started.elapsed();
    assert!(
        end_secs > LIFETIME / 2,
        "no warning before the window: {end_secs:?}"
    );

    // Past the end, the server's API fails TLS for every client.
    wait_until("the API to fail TLS", LIFETIME, || async {
        match kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::read_from(&path).unwrap(),
                &Default::default(),
            )
            .await
            .unwrap(),
        )
        .unwrap()
        .apiserver_version()
        .await
        {
            Ok(_) => false,
            Err(e) => {
                let chain = format!("{e:?}");
                assert!(
                    chain.to_lowercase().contains("expired")
                        || chain.contains("NotValidYet")
                        || chain.contains("Expired"),
                    "a failure other than an expired certificate: {chain}"
                );
                true
            }
        }
    })
    .await;

    // A reboot restarts k3s, which renews what ended: the API answers again.
    let http = reqwest::Client::new();
    let r = http
        .post(format!(
            "{}/v1/instances/{server}/reboot?project={}",
            sim.oxide_host,
            sim.project.clone().unwrap()
        ))
        .bearer_auth(&sim.oxide_token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "reboot: {}", r.status());
    wait_until(
        "the API to answer after the restart",
        Duration::from_secs(30),
        || async { client(&path).await.apiserver_version().await.is_ok() },
    )
    .await;
}
