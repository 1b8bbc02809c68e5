//! The simulated rack's VPC firewall seen from outside: a new project's default rules drop
//! the Kubernetes API on an instance's external address (a timeout, not a refusal) and let
//! SSH through; a rule that admits tcp/6443 opens it. A joiner going through the floating IP
//! arrives as external traffic and is dropped by the defaults; through the server's private
//! address it arrives over the VPC and is admitted by `allow-internal-inbound`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::IpAddr;
use std::time::Duration;

use oxide::prelude::*;
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
    let sim = start_default_firewall(|_| {}).await;
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

    open_api_port(&c).await;
    assert!(probe_api(ip).await.is_ok(), "the API answers once admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_through_the_floating_ip_is_external_and_through_the_private_address_is_not() {
    let sim = start_default_firewall(|_| {}).await;
    let c = client(&sim);
    first_server(&sim, &c, "cp-0", TOKEN, &[]).await;
    let fip = create_floating_ip(&c, "api").await;
    attach_floating_ip(&c, "api", "cp-0").await;
    let private = private_ip(&c, "cp-0").await;

    let via_fip = format!("server: https://{fip}:6443\ntoken: agent-secret-1\n");
    create_instance(&c, "hairpin", &user_data("agent", &via_fip, &[])).await;
    let via_vpc = format!("server: https://{private}:6443\ntoken: agent-secret-1\n");
    create_instance(&c, "inside", &user_data("agent", &via_vpc, &[])).await;

    wait_node_status(&sim, "inside", "True").await;
    let console = wait_console(&c, "hairpin", "i/o timeout").await;
    assert!(console.contains(&fip.to_string()), "{console}");
    assert!(node_ready(&sim, "hairpin").await.is_none());
}
