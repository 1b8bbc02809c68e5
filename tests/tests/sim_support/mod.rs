//! Shared helpers for the `sim_*` tests: start a simulator, drive it through the `oxide` SDK
//! as the product would, render k3s user-data, and poll for outcomes.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use oxide::prelude::*;
use oxide::types;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::Value;

/// SSH port of the simulated VMs in tests (every simulator has its own /24, so no clashes).
pub const SSH_PORT: u16 = 2222;
/// How long any single expectation may take before the test fails.
/// (A real control plane: Node readiness changes take the controller's grace period.)
pub const PATIENCE: Duration = Duration::from_secs(40);
pub const PROJECT: &str = "proj";

pub async fn start() -> SimHandle {
    start_with(|_| {}).await
}

pub async fn start_with(f: impl FnOnce(&mut SimOptions)) -> SimHandle {
    let sim = start_default_firewall(f).await;
    open_api_port(&client(&sim)).await;
    sim
}

/// A simulator whose project has only the VPC's three default firewall rules, which drop
/// the Kubernetes API on external addresses.
pub async fn start_default_firewall(f: impl FnOnce(&mut SimOptions)) -> SimHandle {
    let mut opts = SimOptions {
        ssh_port: SSH_PORT,
        // A stopped VM's Node goes Unknown after this grace period (50 s upstream).
        kubernetes: oxide_sim::control_plane::ControlPlaneOptions {
            node_monitor_grace_period: Duration::from_secs(10),
            ..Default::default()
        },
        ..SimOptions::default()
    };
    f(&mut opts);
    let sim = Sim::start(opts).await.expect("simulator starts");
    sim.oxide().seed_project(PROJECT);
    sim
}

/// Admits tcp/6443 from anywhere in the project's VPC firewall, keeping the other rules (what
/// bootstrap does with its default `--api-allow`).
pub async fn open_api_port(c: &oxide::Client) {
    let mut rules: Vec<types::VpcFirewallRuleUpdate> = c
        .vpc_firewall_rules_view()
        .project(PROJECT)
        .vpc("default")
        .send()
        .await
        .unwrap()
        .into_inner()
        .rules
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
    rules.push(types::VpcFirewallRuleUpdate {
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
        .body(types::VpcFirewallRuleUpdateParams { rules })
        .send()
        .await
        .unwrap();
}

/// The private (VPC) address of an instance's primary NIC.
pub async fn private_ip(c: &oxide::Client, name: &str) -> IpAddr {
    let nics = c
        .instance_network_interface_list()
        .project(PROJECT)
        .instance(name)
        .send()
        .await
        .unwrap()
        .into_inner();
    match &nics.items[0].ip_stack {
        // Without `network_interfaces` nexus makes a dual-stack NIC; its IPv4 address is the one.
        types::PrivateIpStack::V4(v4) | types::PrivateIpStack::DualStack { v4, .. } => {
            IpAddr::V4(v4.ip)
        }
        other => panic!("unexpected stack {other:?}"),
    }
}

/// An SDK client for the simulator, built the way a container would (host + token).
pub fn client(sim: &SimHandle) -> oxide::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", sim.oxide_token).parse().unwrap(),
    );
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    oxide::Client::new_with_client(&sim.oxide_host, http)
}

/// Creates and starts an instance with one ephemeral IP and the given user-data.
pub async fn create_instance(c: &oxide::Client, name: &str, user_data: &str) -> uuid::Uuid {
    let body = types::InstanceCreate::builder()
        .name(name)
        .description(format!("test instance {name}"))
        .hostname(name)
        .ncpus(types::InstanceCpuCount(2))
        .memory(types::ByteCount(4 << 30))
        .external_ips(vec![types::ExternalIpCreate::Ephemeral {
            pool_selector: types::PoolSelector::Auto { ip_version: None },
        }])
        .user_data(base64::engine::general_purpose::STANDARD.encode(user_data));
    let created = c
        .instance_create()
        .project(PROJECT)
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
    created.into_inner().id
}

/// The instance's ephemeral external IP.
pub async fn ephemeral_ip(c: &oxide::Client, name: &str) -> IpAddr {
    let ips = c
        .instance_external_ip_list()
        .project(PROJECT)
        .instance(name)
        .send()
        .await
        .unwrap()
        .into_inner();
    ips.items
        .iter()
        .find_map(|ip| match ip {
            types::ExternalIp::Ephemeral { ip, .. } => Some(*ip),
            _ => None,
        })
        .expect("an ephemeral IP")
}

/// Creates a floating IP and returns its address.
pub async fn create_floating_ip(c: &oxide::Client, name: &str) -> IpAddr {
    let fip = c
        .floating_ip_create()
        .project(PROJECT)
        .body(
            types::FloatingIpCreate::builder()
                .name(name)
                .description("api"),
        )
        .send()
        .await
        .unwrap()
        .into_inner();
    fip.ip
}

pub async fn attach_floating_ip(c: &oxide::Client, fip: &str, instance: &str) {
    wait_for(&format!("attaching {fip} to {instance}"), || async {
        c.floating_ip_attach()
            .project(PROJECT)
            .floating_ip(fip)
            .body(types::FloatingIpAttach {
                kind: types::FloatingIpParentKind::Instance,
                parent: types::NameOrId::Name(instance.parse().unwrap()),
            })
            .send()
            .await
            .ok()
    })
    .await;
}

pub async fn stop_instance(c: &oxide::Client, name: &str) {
    c.instance_stop()
        .project(PROJECT)
        .instance(name)
        .send()
        .await
        .unwrap();
}

pub async fn start_instance(c: &oxide::Client, name: &str) {
    c.instance_start()
        .project(PROJECT)
        .instance(name)
        .send()
        .await
        .unwrap();
}

/// Stops `name`, waits until it is stopped, and starts it again (a new VMM: an empty
/// console history).
pub async fn restart_instance(c: &oxide::Client, name: &str) {
    stop_instance(c, name).await;
    wait_for(&format!("{name} stopped"), || async {
        let inst = c
            .instance_view()
            .project(PROJECT)
            .instance(name)
            .send()
            .await
            .unwrap()
            .into_inner();
        (inst.run_state == types::InstanceState::Stopped).then_some(())
    })
    .await;
    start_instance(c, name).await;
}

/// The instance's serial console so far, as text (empty while the API refuses to show it,
/// e.g. before the instance is running, as a real rack does).
pub async fn console(c: &oxide::Client, name: &str) -> String {
    match c
        .instance_serial_console()
        .project(PROJECT)
        .instance(name)
        .from_start(0)
        .max_bytes(1 << 20)
        .send()
        .await
    {
        Ok(data) => String::from_utf8_lossy(&data.into_inner().data).into_owned(),
        Err(oxide::Error::ErrorResponse(resp)) if resp.status() == 400 => String::new(),
        Err(e) => panic!("reading {name}'s console: {e}"),
    }
}

/// Polls `f` every 50 ms until it yields Some, failing the test after [`PATIENCE`].
pub async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the console contains `needle`, returning the console.
pub async fn wait_console(c: &oxide::Client, name: &str, needle: &str) -> String {
    wait_for(&format!("'{needle}' on {name}'s console"), || async {
        let text = console(c, name).await;
        text.contains(needle).then_some(text)
    })
    .await
}

/// Status of the Node's Ready condition ("True", "Unknown", ...), None without the Node.
pub async fn node_ready(sim: &SimHandle, node: &str) -> Option<String> {
    let obj = sim.kube().get("v1", "Node", None, node).await?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
        .map(str::to_string)
}

pub async fn wait_node_status(sim: &SimHandle, node: &str, status: &str) -> Value {
    wait_for(&format!("node {node} Ready={status}"), || async {
        if node_ready(sim, node).await.as_deref() == Some(status) {
            sim.kube().get("v1", "Node", None, node).await
        } else {
            None
        }
    })
    .await
}

/// Renders user-data the way the product's renderer shapes it: the k3s config file via
/// `write_files` (base64), keys for user `ubuntu`, and the install step.
pub fn user_data(role: &str, k3s_config: &str, ssh_keys: &[String]) -> String {
    let mut out = String::from("#cloud-config\n");
    if !ssh_keys.is_empty() {
        out.push_str("users:\n  - default\n  - name: ubuntu\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    ssh_authorized_keys:\n");
        for key in ssh_keys {
            out.push_str(&format!("      - {key}\n"));
        }
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(k3s_config);
    // The setup script as the product writes it, reduced to its k3s step.
    let script = format!(
        "#!/bin/sh\nset -eu\nstep k3s-install\ndownload /run/oxide-controller/k3s-install.sh 'https://get.k3s.io'\nINSTALL_K3S_VERSION='v1.33.4+k3s1' INSTALL_K3S_EXEC='{role}' sh /run/oxide-controller/k3s-install.sh\n"
    );
    let script = base64::engine::general_purpose::STANDARD.encode(script);
    out.push_str(&format!(
        "write_files:\n  - path: /etc/rancher/k3s/config.yaml\n    permissions: '0600'\n    encoding: b64\n    content: {b64}\n  - path: /usr/local/sbin/oxide-node-setup\n    permissions: '0755'\n    encoding: b64\n    content: {script}\nruncmd:\n  - [/usr/local/sbin/oxide-node-setup]\n"
    ));
    out
}

/// A k3s config for the first server.
pub fn first_server_config(token: &str, agent_token: &str, tls_san: &[IpAddr]) -> String {
    let sans: Vec<String> = tls_san.iter().map(|ip| format!("\"{ip}\"")).collect();
    format!(
        "cluster-init: true\ntoken: {token}\nagent-token: {agent_token}\ntls-san: [{}]\nnode-label:\n  - oxide-controller/pool=control-plane\n",
        sans.join(", ")
    )
}

/// Starts the first server and waits for its Ready Node.
pub async fn first_server(
    sim: &SimHandle,
    c: &oxide::Client,
    name: &str,
    token: &str,
    tls_san: &[IpAddr],
) -> Value {
    let ud = user_data(
        "server",
        &first_server_config(token, "agent-secret-1", tls_san),
        &[],
    );
    create_instance(c, name, &ud).await;
    wait_node_status(sim, name, "True").await
}
