//! The admin API: counters, state dump, runtime faults, forcing failures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use oxide::prelude::*;
use serde_json::{Value, json};
use sim_support::*;

async fn get(url: &str) -> Value {
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    resp.json().await.unwrap()
}

#[tokio::test]
async fn counters_count_oxide_routes_and_reset() {
    let sim = start().await;
    let c = client(&sim);
    for _ in 0..3 {
        c.project_list().send().await.unwrap();
    }
    let counters = get(&format!("{}/counters", sim.admin_url)).await;
    assert_eq!(counters["oxide"]["GET /v1/projects"], 3, "{counters}");
    assert!(counters["kube"].is_object());

    let http = reqwest::Client::new();
    let reset = http
        .post(format!("{}/counters/reset", sim.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 204);
    let counters = get(&format!("{}/counters", sim.admin_url)).await;
    assert!(
        counters["oxide"]
            .get("GET /v1/projects")
            .is_none_or(|v| v == 0),
        "{counters}"
    );
}

#[tokio::test]
async fn state_shows_instances_and_which_vms_joined_as_which_nodes() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", "tok-state", &[]).await;
    let state = get(&format!("{}/state", sim.admin_url)).await;
    let instances = state["oxide"]["instances"].as_array().unwrap();
    assert!(
        instances.iter().any(|i| i["name"] == "c1-cp-aaaaa"),
        "{state}"
    );
    assert_eq!(state["cluster"]["joined"], json!(["c1-cp-aaaaa"]));
    let vm = &state["cluster"]["vms"][0];
    assert_eq!(
        (vm["instance"].as_str(), vm["node"].as_str()),
        (Some("c1-cp-aaaaa"), Some("c1-cp-aaaaa"))
    );
    assert!(state["kube"].is_object());
}

#[tokio::test]
async fn faults_set_at_runtime_take_effect() {
    let sim = start().await;
    let c = client(&sim);
    let http = reqwest::Client::new();
    let spec = json!({"routes": {"GET /v1/projects": {"error_rate": 1.0, "error_status": 503}}});
    let put = http
        .put(format!("{}/faults", sim.admin_url))
        .json(&spec)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let err = c.project_list().send().await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503), "{err}");

    let put = http
        .put(format!("{}/faults", sim.admin_url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    c.project_list().send().await.unwrap();

    let bad = http
        .put(format!("{}/faults", sim.admin_url))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn failing_an_instance_fails_it_and_its_node_stops_reporting() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", "tok-fail", &[]).await;
    // A worker fails, not the only server: with its server gone a cluster has no etcd member
    // and no API left to show the Node (sim_etcd), as on a rack.
    let server_ip = ephemeral_ip(&c, "c1-cp-aaaaa").await;
    let agent = format!("server: https://{server_ip}:6443\ntoken: agent-secret-1\n");
    create_instance(&c, "c1-workers-aaaaa", &user_data("agent", &agent, &[])).await;
    wait_node_status(&sim, "c1-workers-aaaaa", "True").await;
    // No automatic restart: the rack would bring the VM back and its kubelet would report
    // again before the node lifecycle controller's grace period ran out.
    let id = sim.oxide().dump()["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "c1-workers-aaaaa")
        .and_then(|i| i["id"].as_str())
        .unwrap()
        .parse()
        .unwrap();
    sim.oxide()
        .set_auto_restart_policy(id, Some(oxide::types::InstanceAutoRestartPolicy::Never));
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/instances/c1-workers-aaaaa/fail", sim.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let view = c
        .instance_view()
        .project(PROJECT)
        .instance("c1-workers-aaaaa")
        .send()
        .await
        .unwrap();
    assert_eq!(
        view.into_inner().run_state,
        oxide::types::InstanceState::Failed
    );
    wait_node_status(&sim, "c1-workers-aaaaa", "Unknown").await;

    let missing = http
        .post(format!("{}/instances/nope/fail", sim.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}
