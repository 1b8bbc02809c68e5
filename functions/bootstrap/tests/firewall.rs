//! Issue 10 acceptance (VPC firewall, full rack): the Kubernetes API on the floating IP
//! answers only once bootstrap's rule admits this host; a re-run writes no rule; a rule the
//! user made before bootstrap is still there after it. On a full rack bootstrap fails at once
//! with the rack's answer instead of waiting for the API.
//!
//! Issue 34 item 8 (less exposure): two clusters in one project cannot reach each other's
//! etcd, supervisor, kubelet or VXLAN ports (the simulator's firewall evaluation), while
//! their own members can; SSH is admitted only from `--ssh-allow` (by default this machine's
//! address toward the rack API: loopback here); workers have no ephemeral external IP, only
//! the SNAT address nexus gives every instance; `bootstrap delete` of one cluster removes
//! its rules and leaves the other's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::env;
use oxide_controller::domain::firewall::{api_rule, parse_sources};
use oxide_controller::domain::model::{ExternalIpKind, Instance};
use oxide_controller::ports::rack::Rack as _;
use oxide_sim::oxide::{Peer, Proto};

/// `GET https://<ip>:6443/readyz` with a short deadline: `Err(true)` for a timeout.
async fn probe_api(ip: &str) -> Result<u16, bool> {
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    match http.get(format!("https://{ip}:6443/readyz")).send().await {
        Ok(r) => Ok(r.status().as_u16()),
        Err(e) => Err(e.is_timeout()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_answers_once_the_rule_admits_us_and_a_rerun_changes_no_rule() {
    let env = env().await;
    env.sim.oxide().seed_project("demo");
    let rack = env.rack("demo");
    // The user's own rule, made before bootstrap.
    let mut user_rule = api_rule("user", parse_sources("10.0.0.0/8").unwrap(), &[]);
    user_rule.targets = oxide_controller::domain::firewall::RuleTargets::Vpc;
    user_rule.name = "user-web".into();
    user_rule.description = "the user's web service".into();
    user_rule.ports = vec![(8080, 8080)];
    rack.ensure_firewall_rules(&[user_rule]).await.unwrap();

    // A rule that does not admit this host: the API on the floating IP is dropped.
    let out = env
        .run(&[
            "--workers",
            "1",
            "--api-allow",
            "203.0.113.0/24",
            "--api-timeout",
            "25",
        ])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("wait-api") && stderr.contains("--api-allow"),
        "{stderr}"
    );
    let fip = env.dump()["floating_ips"][0]["ip"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        probe_api(&fip).await,
        Err(true),
        "dropped: a timeout, not a refusal"
    );

    // The default admits anyone: the same bootstrap goes through and the API answers.
    env.run_ok(&["--workers", "1"]).await;
    assert!(probe_api(&fip).await.is_ok());
    let rules = rack.list_firewall_rules().await.unwrap();
    assert_eq!(
        rules,
        [
            "allow-internal-inbound",
            "allow-ssh",
            "allow-icmp",
            "user-web",
            "demo-k8s-api",
            "demo-ssh",
            "demo-ssh-deny",
            "demo-members",
            "demo-isolate"
        ]
    );
    // Members joined through the server's private address (the default rules admit it).
    assert_eq!(env.ready_nodes("demo-").await.len(), 4);

    // A re-run writes no rule at all.
    env.sim.oxide().reset_counters();
    env.run_ok(&["--workers", "1"]).await;
    let puts = env
        .sim
        .oxide()
        .counters()
        .get("PUT /v1/vpc-firewall-rules")
        .copied()
        .unwrap_or(0);
    assert_eq!(puts, 0, "a re-run changes no rule");
    assert_eq!(rack.list_firewall_rules().await.unwrap(), rules);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_full_rack_bootstrap_fails_fast_with_the_racks_answer() {
    let env = env().await;
    env.sim
        .faults()
        .update(|f| f.no_capacity.push(String::new()));
    let started = std::time::Instant::now();
    let out = env.run(&["--workers", "1", "--api-timeout", "120"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("first-control-plane") && stderr.contains("Insufficient capacity"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "failed before the API wait, not after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_api_allow_exits_2_naming_the_flag_before_any_api_call() {
    let env = env().await;
    env.sim.oxide().reset_counters();
    let out = env.run(&["--api-allow", "10.1.2.3/8"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--api-allow") && stderr.contains("host bits"),
        "{stderr}"
    );
    let calls: u64 = env.sim.oxide().counters().values().sum();
    assert_eq!(calls, 0, "no Oxide API call before validation passes");
}

/// The one instance whose name starts with `prefix`.
async fn only(rack: &impl oxide_controller::ports::rack::Rack, prefix: &str) -> Instance {
    let mut found = rack.list_instances(prefix).await.unwrap();
    assert_eq!(found.len(), 1, "{prefix}: {found:?}");
    found.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clusters_in_one_project_reach_only_their_own_members_and_ssh_only_from_us() {
    let env = env().await;
    let kubeconfig = |c: &str| env.dir.path().join(format!("{c}.kubeconfig"));
    for cluster in ["a", "b"] {
        let path = kubeconfig(cluster).display().to_string();
        env.run_ok(&[
            "--cluster",
            cluster,
            "--project",
            "demo",
            "--control-planes",
            "1",
            "--workers",
            "1",
            "--kubeconfig",
            &path,
        ])
        .await;
    }
    let rack = env.rack("demo");
    let oxide = env.sim.oxide();
    let a_cp = only(&rack, "a-control-plane-").await;
    let a_w = only(&rack, "a-workers-").await;
    let b_cp = only(&rack, "b-control-plane-").await;
    let b_w = only(&rack, "b-workers-").await;
    // The API reports the rack's 172.30.x address; the simulator's stand-in is on loopback.
    let private = async |i: &Instance| {
        let std::net::IpAddr::V4(ip) = rack.instance_private_ip(&i.name).await.unwrap().unwrap()
        else {
            panic!("{} has an IPv4 NIC", i.name)
        };
        std::net::IpAddr::V4(oxide.private_loopback("demo", ip).unwrap())
    };
    let judge = async |proto: Proto, from: &Instance, to: &Instance, port: u16| {
        let to_addr = std::net::SocketAddr::new(private(to).await, port);
        oxide
            .admitted(proto, Peer::Instance(from.id), to_addr)
            .unwrap_or_else(|| panic!("{} is an instance of the rack", to.name))
    };
    let internal = [
        (Proto::Tcp, 10250),
        (Proto::Udp, 8472),
        (Proto::Tcp, 2379),
        (Proto::Tcp, 6443),
    ];
    for (proto, port) in internal {
        // A worker of a cannot open b's kubelet, VXLAN, etcd or supervisor port...
        assert!(
            !judge(proto, &a_w, &b_w, port).await,
            "a's worker to b's worker {proto:?}/{port}"
        );
        assert!(
            !judge(proto, &a_w, &b_cp, port).await,
            "a's worker to b's server {proto:?}/{port}"
        );
        assert!(
            !judge(proto, &b_w, &a_cp, port).await,
            "b's worker to a's server {proto:?}/{port}"
        );
        // ...while each cluster's own members reach each other.
        assert!(
            judge(proto, &a_w, &a_cp, port).await,
            "a's worker to a's server {proto:?}/{port}"
        );
        assert!(
            judge(proto, &a_cp, &a_w, port).await,
            "a's server to a's worker {proto:?}/{port}"
        );
        assert!(
            judge(proto, &b_cp, &b_w, port).await,
            "b's server to b's worker {proto:?}/{port}"
        );
    }
    // Both clusters' members joined, each in its own cluster.
    for cluster in ["a", "b"] {
        let client = common::kube_client(&kubeconfig(cluster), cluster).await;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let ready: Vec<String> = nodes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|n| n.metadata.name)
            .collect();
        assert_eq!(ready.len(), 2, "{cluster}: {ready:?}");
        assert!(
            ready.iter().all(|n| n.starts_with(&format!("{cluster}-"))),
            "{ready:?}"
        );
    }

    // Workers reach out through the SNAT address only; servers keep an ephemeral IP.
    for w in [&a_w, &b_w] {
        let ips = rack.instance_external_ips(&w.name).await.unwrap();
        assert!(
            !ips.is_empty() && ips.iter().all(|i| i.kind == ExternalIpKind::Snat),
            "{}: {ips:?}",
            w.name
        );
    }
    let a_cp_ips = rack.instance_external_ips(&a_cp.name).await.unwrap();
    let a_cp_ephemeral = a_cp_ips
        .iter()
        .find(|i| i.kind == ExternalIpKind::Ephemeral)
        .unwrap_or_else(|| panic!("a server keeps its ephemeral IP: {a_cp_ips:?}"))
        .ip;

    // SSH: from this machine (loopback, the default --ssh-allow) but from nowhere else.
    let ssh = std::net::SocketAddr::new(a_cp_ephemeral, 22);
    let from = |ip: &str| Peer::Host(ip.parse().unwrap());
    assert_eq!(oxide.tcp_admitted(from("127.0.0.1"), ssh), Some(true));
    assert_eq!(oxide.tcp_admitted(from("203.0.113.9"), ssh), Some(false));
    // The API stays as --api-allow says (anywhere by default).
    let api = std::net::SocketAddr::new(a_cp_ephemeral, 6443);
    assert_eq!(oxide.tcp_admitted(from("203.0.113.9"), api), Some(true));

    // Deleting a takes its rules and leaves b's, which still keep b to itself.
    let a_path = kubeconfig("a").display().to_string();
    let out = env
        .delete(
            "a",
            &["--project", "demo", "--yes", "--kubeconfig", &a_path],
        )
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = rack.list_firewall_rules().await.unwrap();
    assert_eq!(
        rules,
        [
            "allow-internal-inbound",
            "allow-ssh",
            "allow-icmp",
            "b-k8s-api",
            "b-ssh",
            "b-ssh-deny",
            "b-members",
            "b-isolate"
        ]
    );
    assert!(judge(Proto::Udp, &b_cp, &b_w, 8472).await);
}
