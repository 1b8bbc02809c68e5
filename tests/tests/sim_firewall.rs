//! The simulated rack's VPC firewall seen from outside: a new project's default rules drop
//! the Kubernetes API on an instance's external address (a timeout, not a refusal) and let
//! SSH through; a rule that admits tcp/6443 opens it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::IpAddr;
use std::time::Duration;

use oxide::prelude::*;
use oxide::types;
use sim_support::*;

const TOKEN: &str = "K10abc::server:firewall-token";

/// `GET https://ip:6443/readyz` with a short deadline: `Err(true)` for a timeout.
async fn probe_api(ip: IpAddr) -> Result<u16, bool> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_rules_drop_the_api_until_a_rule_admits_tcp_6443() {
    let sim = start().await;
    let c = client(&sim);
    let rules = c
        .vpc_firewall_rules_view()
        .project(PROJECT)
        .vpc("default")
        .send()
        .await
        .unwrap()
        .into_inner()
        .rules;
    let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["allow-internal-inbound", "allow-ssh", "allow-icmp"]);

    first_server(&sim, &c, "cp-0", TOKEN, &[]).await;
    let ip = ephemeral_ip(&c, "cp-0").await;
    // The listener is there (the VPC drops the packets, nothing refuses them)...
    assert!(tokio::net::TcpStream::connect((ip, 6443)).await.is_ok());
    // ...but nothing ever answers.
    assert_eq!(probe_api(ip).await, Err(true), "dropped: a timeout");
    // SSH is allowed by the default `allow-ssh`.
    let mut ssh = tokio::net::TcpStream::connect((ip, SSH_PORT))
        .await
        .unwrap();
    let mut banner = [0u8; 4];
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_exact(&mut ssh, &mut banner),
    )
    .await
    .expect("the SSH banner arrives")
    .unwrap();
    assert_eq!(&banner, b"SSH-");

    let mut update: Vec<types::VpcFirewallRuleUpdate> = rules
        .into_iter()
        .map(|r| types::VpcFirewallRuleUpdate {
            action: r.action,
            description: r.description,
            direction: r.direction,
            filters: r.filters,
            name: r.name,
            priority: r.priority,
            status: r.status,
            targets: r.targets,
        })
        .collect();
    update.push(types::VpcFirewallRuleUpdate {
        action: types::VpcFirewallRuleAction::Allow,
        description: "Kubernetes API".into(),
        direction: types::VpcFirewallRuleDirection::Inbound,
        filters: types::VpcFirewallRuleFilter {
            hosts: Some(vec![types::VpcFirewallRuleHostFilter::IpNet(
                "0.0.0.0/0".parse().unwrap(),
            )]),
            ports: Some(vec!["6443".parse().unwrap()]),
            protocols: Some(vec![types::VpcFirewallRuleProtocol::Tcp]),
        },
        name: "k8s-api".parse().unwrap(),
        priority: 65534,
        status: types::VpcFirewallRuleStatus::Enabled,
        targets: vec![types::VpcFirewallRuleTarget::Vpc(
            "default".parse().unwrap(),
        )],
    });
    c.vpc_firewall_rules_update()
        .project(PROJECT)
        .vpc("default")
        .body(types::VpcFirewallRuleUpdateParams { rules: update })
        .send()
        .await
        .unwrap();
    assert!(probe_api(ip).await.is_ok(), "the API answers once admitted");
}
