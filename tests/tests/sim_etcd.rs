//! k3s's embedded etcd in the simulator: each server VM runs its own real etcd member, a
//! joining server is added as a learner and promoted, a stopped VM's member is down, and a
//! deleted server Node's member is removed. With two of three servers stopped, etcd has no
//! quorum and the cluster's API stops answering, as on a rack.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxide::prelude::*;
use oxide::types;
use oxide_sim::SimHandle;
use oxide_sim::control_plane::etcd::EtcdMember;
use oxide_sim::guest::cluster_api::RealCluster;
use serde_json::json;
use sim_support::*;

const TOKEN: &str = "server-secret-0123456789";
const SERVERS: [&str; 3] = ["c1-cp-aaaaa", "c1-cp-bbbbb", "c1-cp-ccccc"];

/// The first server (holding the floating IP `c1-apiserver`) and two servers joining through
/// it, one after the other as the product adds them, while the member list is sampled every
/// 100 ms. Returns the cluster, the floating IP and the samples.
async fn three_servers(
    sim: &SimHandle,
    c: &oxide::Client,
) -> (Arc<RealCluster>, IpAddr, Vec<Vec<EtcdMember>>) {
    let fip = create_floating_ip(c, "c1-apiserver").await;
    first_server(sim, c, SERVERS[0], TOKEN, &[fip]).await;
    attach_floating_ip(c, "c1-apiserver", SERVERS[0]).await;
    let real = sim.boot().real_clusters()[0].clone();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (real, samples) = (Arc::clone(&real), Arc::clone(&samples));
        tokio::spawn(async move {
            loop {
                if let Ok(m) = real.control_plane.etcd().members().await {
                    samples.lock().unwrap().push(m);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let join = format!("server: https://{fip}:6443\ntoken: {TOKEN}\n");
    for name in &SERVERS[1..] {
        create_instance(c, name, &user_data("server", &join, &[])).await;
        wait_node_status(sim, name, "True").await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    (real, fip, samples)
}

/// Lists namespaces as `system:admin` through `https://{addr}:6443`, giving up after 10 s.
async fn list_namespaces(real: &RealCluster, addr: IpAddr) -> Result<usize, String> {
    let kubeconfig = real.admin_kubeconfig(&format!("https://{addr}:6443"));
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).map_err(|e| e.to_string())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let client = kube::Client::try_from(cfg).map_err(|e| e.to_string())?;
    let req = http::Request::get("/api/v1/namespaces")
        .body(Vec::new())
        .unwrap();
    match tokio::time::timeout(
        Duration::from_secs(10),
        client.request::<serde_json::Value>(req),
    )
    .await
    {
        Ok(Ok(list)) => Ok(list["items"].as_array().map_or(0, Vec::len)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 10 s".into()),
    }
}

async fn wait_state(c: &oxide::Client, name: &str, state: types::InstanceState) {
    wait_for(&format!("{name} {state:?}"), || async {
        let inst = c
            .instance_view()
            .project(PROJECT)
            .instance(name)
            .send()
            .await
            .unwrap()
            .into_inner();
        (inst.run_state == state).then_some(())
    })
    .await;
}

fn voters(members: &[EtcdMember]) -> usize {
    members.iter().filter(|m| !m.is_learner).count()
}

#[tokio::test]
async fn with_two_of_three_servers_stopped_etcd_has_no_quorum_and_the_api_stops_answering() {
    let sim = start().await;
    let c = client(&sim);
    let (real, fip, samples) = three_servers(&sim, &c).await;

    // Each server joined as a learner and was then promoted; never two learners at once.
    let members = real.control_plane.etcd().members().await.unwrap();
    assert_eq!(voters(&members), 3, "{members:?}");
    assert!(
        samples
            .iter()
            .all(|s| s.iter().filter(|m| m.is_learner).count() <= 1),
        "at most one learner at a time: {samples:?}"
    );
    for joiner in &members {
        let seen: Vec<bool> = samples
            .iter()
            .filter_map(|s| s.iter().find(|m| m.id == joiner.id))
            .map(|m| m.is_learner)
            .collect();
        if seen.first() == Some(&false) {
            continue; // the first server: a voter from the start
        }
        let promoted = seen.iter().position(|l| !l).expect("promoted");
        assert!(
            seen[..promoted].iter().all(|l| *l) && seen[promoted..].iter().all(|l| !l),
            "{}: learner, then voter for good: {seen:?}",
            joiner.name
        );
    }
    assert_eq!(
        samples
            .iter()
            .flatten()
            .filter(|m| m.is_learner)
            .map(|m| &m.id)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        2,
        "both joining servers were seen as learners: {samples:?}"
    );

    sim.kube()
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "before", "namespace": "default"},
            "data": {"written": "before the failure"}}))
        .await
        .unwrap();
    assert!(list_namespaces(&real, fip).await.unwrap() >= 4);

    // Two of three servers stop: their members are down, one voter of three is left.
    for name in &SERVERS[1..] {
        stop_instance(&c, name).await;
    }
    for name in &SERVERS[1..] {
        wait_state(&c, name, types::InstanceState::Stopped).await;
    }
    let stopped = Instant::now();
    let failed = loop {
        match list_namespaces(&real, fip).await {
            Err(why) => break why,
            Ok(_) if stopped.elapsed() > Duration::from_secs(60) => {
                panic!("the API still answers 60 s after two of three servers stopped")
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    eprintln!(
        "the API stopped answering {:?} after the stops: {failed}",
        stopped.elapsed()
    );
    // It stays down: etcd has no leader while only one voter runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(list_namespaces(&real, fip).await.is_err());

    // Started again, the members rejoin with their data; the API answers, nothing lost.
    for name in &SERVERS[1..] {
        start_instance(&c, name).await;
    }
    let back = Instant::now();
    loop {
        if list_namespaces(&real, fip).await.is_ok() {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(120),
            "the API is not back 120 s after the servers started"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let cm = sim
        .kube()
        .get("v1", "ConfigMap", Some("default"), "before")
        .await
        .expect("the ConfigMap written before the failure");
    assert_eq!(cm["data"]["written"], "before the failure");
    let members = real.control_plane.etcd().members().await.unwrap();
    assert_eq!((members.len(), voters(&members)), (3, 3), "{members:?}");
}

#[tokio::test]
async fn deleting_a_server_node_removes_its_etcd_member() {
    let sim = start().await;
    let c = client(&sim);
    let (real, fip, _) = three_servers(&sim, &c).await;
    let gone = SERVERS[2];
    let node = sim.kube().get("v1", "Node", None, gone).await.unwrap();
    let member = node["metadata"]["annotations"]["etcd.k3s.cattle.io/node-name"]
        .as_str()
        .expect("k3s names the member on the Node")
        .to_string();
    assert!(member.starts_with(&format!("{gone}-")), "{member}");
    let listed = real.control_plane.etcd().members().await.unwrap();
    assert!(listed.iter().any(|m| m.name == member), "{listed:?}");

    // As the product removes a server: stop it, delete its Node, delete the instance.
    stop_instance(&c, gone).await;
    wait_state(&c, gone, types::InstanceState::Stopped).await;
    // Stopped, the member is down but still listed: only the Node's deletion removes it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let listed = real.control_plane.etcd().members().await.unwrap();
    assert!(listed.iter().any(|m| m.name == member), "{listed:?}");
    assert!(
        real.control_plane.etcd().has_data(&member),
        "a stopped VM keeps its data"
    );
    assert!(sim.kube().delete("v1", "Node", None, gone).await);
    wait_for("the Node gone and its member removed", || async {
        let node = sim.kube().get("v1", "Node", None, gone).await;
        let members = real.control_plane.etcd().members().await.ok()?;
        (node.is_none() && !members.iter().any(|m| m.name == member)).then_some(members)
    })
    .await;
    c.instance_delete()
        .project(PROJECT)
        .instance(gone)
        .send()
        .await
        .unwrap();
    wait_for(
        "the deleted VM's member data gone with its disks",
        || async { (!real.control_plane.etcd().has_data(&member)).then_some(()) },
    )
    .await;
    let members = real.control_plane.etcd().members().await.unwrap();
    assert_eq!((members.len(), voters(&members)), (2, 2), "{members:?}");
    // Two voters of two: the cluster still has quorum and answers.
    list_namespaces(&real, fip).await.unwrap();
}

/// `GET https://{addr}:6443/db/info` as k3s's supervisor answers it, with basic credentials
/// `auth`, the certificate verified against the cluster CA. (status, body).
async fn db_info(real: &RealCluster, addr: IpAddr, auth: Option<(&str, &str)>) -> (u16, String) {
    let ca = reqwest::Certificate::from_pem(real.ca_pem().as_bytes()).unwrap();
    let http = reqwest::Client::builder()
        .tls_certs_only([ca])
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut req = http.get(format!("https://{addr}:6443/db/info"));
    if let Some((user, pass)) = auth {
        req = req.basic_auth(user, Some(pass));
    }
    let resp = req.send().await.unwrap();
    let code = resp.status().as_u16();
    (code, resp.text().await.unwrap())
}

/// k3s's supervisor serves the etcd member list on `/db/info` to the `server` user with the
/// server token only, in the shape Go's `encoding/json` gives etcd's `Member`; with no
/// quorum etcd's (linearizable) MemberList fails and k3s answers 500.
#[tokio::test]
async fn db_info_lists_the_members_to_the_server_token_only_and_fails_without_quorum() {
    let sim = start().await;
    let c = client(&sim);
    let (real, fip, _) = three_servers(&sim, &c).await;

    let (code, body) = db_info(&real, fip, None).await;
    assert_eq!(
        code, 403,
        "no credentials: no user, so no k3s:server role: {body}"
    );
    assert!(body.contains("\"forbidden\""), "{body}");
    let (code, body) = db_info(&real, fip, Some(("server", "wrong"))).await;
    assert_eq!(code, 401, "a wrong password: {body}");
    let (code, _) = db_info(&real, fip, Some(("node", TOKEN))).await;
    assert_eq!(code, 401, "the token is the `server` user's password only");

    let (code, body) = db_info(&real, fip, Some(("server", TOKEN))).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listed = v["members"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{body}");
    let etcd = real.control_plane.etcd().members().await.unwrap();
    for m in listed {
        let id = m["ID"]
            .as_u64()
            .expect("ID is a JSON number, as encoding/json writes uint64");
        let name = m["name"].as_str().unwrap();
        assert!(
            etcd.iter()
                .any(|e| e.id == id.to_string() && e.name == name),
            "{m} in {etcd:?}"
        );
        assert!(m.get("isLearner").is_none(), "false is left out: {m}");
        assert!(m["peerURLs"][0].as_str().unwrap().ends_with(":2380"), "{m}");
        assert!(
            m["clientURLs"][0].as_str().unwrap().ends_with(":2379"),
            "{m}"
        );
        // k3s names a member `<node-name>-<8 hex>`.
        let (node, suffix) = name.rsplit_once('-').unwrap();
        assert!(SERVERS.contains(&node), "{name}");
        assert!(
            suffix.len() == 8 && suffix.chars().all(|c| c.is_ascii_hexdigit()),
            "{name}"
        );
    }

    // Two of three servers stop: no leader, MemberList fails, 500 from the survivor.
    for name in &SERVERS[1..] {
        stop_instance(&c, name).await;
    }
    for name in &SERVERS[1..] {
        wait_state(&c, name, types::InstanceState::Stopped).await;
    }
    let stopped = Instant::now();
    let body = loop {
        let (code, body) = db_info(&real, fip, Some(("server", TOKEN))).await;
        if code == 500 {
            break body;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "/db/info still answers {code} 60 s after two of three servers stopped: {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        body.contains("failed to get etcd MemberList"),
        "k3s's message: {body}"
    );
}
