//! k3s's cluster reset in the simulator, run over SSH as k3s documents it for quorum loss:
//! `systemctl stop k3s` takes the server's etcd member and API down, `k3s server
//! --cluster-reset` makes the member a single-member cluster with all its data and writes the
//! reset-flag (a second reset is refused while it is there), `systemctl start k3s` serves the
//! API again with the survivor as the only voter and removes the flag. A former peer started
//! again with its old `server/db` is refused by the reset cluster and never rejoins.
//! k3s refuses the reset on a server whose config still names a server to join; a reset whose
//! forced etcd start fails leaves the reset-flag it wrote first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use oxide::prelude::*;
use oxide::types;
use oxide_controller::adapters::ssh::{self, CommandOutput, HostKeyPins, SshTarget};
use oxide_sim::guest::cluster_api::RealCluster;
use serde_json::json;
use sim_support::*;

const TOKEN: &str = "server-secret-reset-0123";
const SERVERS: [&str; 3] = ["c1-cp-aaaaa", "c1-cp-bbbbb", "c1-cp-ccccc"];

/// Lists namespaces as `system:admin` through `https://{addr}:6443`, giving up after 10 s.
async fn api_answers(real: &RealCluster, addr: IpAddr) -> bool {
    let kubeconfig = real.admin_kubeconfig(&format!("https://{addr}:6443"));
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let req = http::Request::get("/api/v1/namespaces")
        .body(Vec::new())
        .unwrap();
    matches!(
        tokio::time::timeout(
            Duration::from_secs(10),
            client.request::<serde_json::Value>(req)
        )
        .await,
        Ok(Ok(_))
    )
}

async fn run(target: &SshTarget, cmd: &str) -> (u32, String) {
    let CommandOutput {
        exit_status,
        stderr,
        ..
    } = target.exec(cmd).await.unwrap();
    (exit_status, String::from_utf8_lossy(&stderr).into_owned())
}

#[tokio::test]
async fn a_cluster_reset_over_ssh_keeps_the_data_in_one_member_and_a_stale_peer_never_rejoins() {
    let sim = start().await;
    let c = client(&sim);
    let key = ssh::generate_ed25519();
    let public = key.authorized_key_line("test").unwrap();
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    let first = user_data(
        "server",
        &first_server_config(TOKEN, "agent-secret-1", &[fip]),
        std::slice::from_ref(&public),
    );
    create_instance(&c, SERVERS[0], &first).await;
    wait_node_status(&sim, SERVERS[0], "True").await;
    attach_floating_ip(&c, "c1-apiserver", SERVERS[0]).await;
    let join = format!("server: https://{fip}:6443\ntoken: {TOKEN}\n");
    for name in &SERVERS[1..] {
        let ud = user_data("server", &join, std::slice::from_ref(&public));
        create_instance(&c, name, &ud).await;
        wait_node_status(&sim, name, "True").await;
    }
    let real = sim.boot().real_clusters()[0].clone();
    let etcd = real.control_plane.etcd();
    wait_for("3 voting members", || async {
        let m = etcd.members().await.ok()?;
        (m.len() == 3 && m.iter().all(|m| !m.is_learner)).then_some(())
    })
    .await;
    sim.kube()
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "before", "namespace": "default"},
            "data": {"written": "before the failure"}}))
        .await
        .unwrap();

    // Quorum lost: two of three servers stopped.
    for name in &SERVERS[1..] {
        stop_instance(&c, name).await;
    }
    for name in &SERVERS[1..] {
        wait_for(&format!("{name} stopped"), || async {
            let i = c
                .instance_view()
                .project(PROJECT)
                .instance(*name)
                .send()
                .await
                .ok()?;
            (i.run_state == types::InstanceState::Stopped).then_some(())
        })
        .await;
    }

    let pins = HostKeyPins::from_console(&console(&c, SERVERS[0]).await).unwrap();
    let target = SshTarget::new(SocketAddr::new(fip, SSH_PORT), "ubuntu", key, pins);
    // The unit's k3s holds etcd's ports: no reset while it runs.
    let (status, err) = run(&target, "sudo -n k3s server --cluster-reset").await;
    assert_eq!(status, 1, "{err}");
    // Stopped, the server serves no API.
    assert_eq!(run(&target, "sudo -n systemctl stop k3s").await.0, 0);
    assert!(
        !api_answers(&real, fip).await,
        "the API answers with k3s stopped"
    );

    let (status, err) = run(&target, "sudo -n k3s server --cluster-reset").await;
    assert_eq!(status, 0, "{err}");
    assert!(
        err.contains("level=info msg=\"Managed etcd cluster membership has been reset, restart without --cluster-reset flag now. Backup and delete ${datadir}/server/db on each peer etcd server and rejoin the nodes\""),
        "{err}"
    );
    let flag = "sudo -n cat /var/lib/rancher/k3s/server/db/reset-flag";
    assert_eq!(run(&target, flag).await.0, 0, "the reset-flag is written");
    let (status, err) = run(&target, "sudo -n k3s server --cluster-reset").await;
    assert_eq!(
        status, 1,
        "a second reset is refused while the flag is there"
    );
    assert!(err.contains("was previously reset"), "{err}");
    // Only the commands of the procedure, exactly.
    assert_eq!(run(&target, "sudo -n systemctl restart k3s").await.0, 127);

    assert_eq!(run(&target, "sudo -n systemctl start k3s").await.0, 0);
    wait_for("the API back", || async {
        api_answers(&real, fip).await.then_some(())
    })
    .await;
    let cm = sim
        .kube()
        .get("v1", "ConfigMap", Some("default"), "before")
        .await
        .expect("the ConfigMap written before the reset");
    assert_eq!(cm["data"]["written"], "before the failure");
    let members = etcd.members().await.unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(!members[0].is_learner && members[0].name.starts_with(SERVERS[0]));
    assert_eq!(
        run(&target, flag).await.0,
        1,
        "a normal start removes the flag"
    );

    // A former peer started with its old server/db: refused, it never rejoins.
    start_instance(&c, SERVERS[1]).await;
    wait_console(
        &c,
        SERVERS[1],
        "the member has been permanently removed from the cluster",
    )
    .await;
    // k3s exits and systemd starts it again, refused each time: never joined.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let info = sim.boot().cluster_info();
        let vm = info["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["instance"] == SERVERS[1])
            .unwrap()
            .clone();
        assert_eq!(vm["joined"], false, "the stale peer joined: {vm}");
    }
    let members = etcd.members().await.unwrap();
    assert_eq!(members.len(), 1, "the stale peer is back: {members:?}");
    assert!(api_answers(&real, fip).await);
}

/// Lost quorum, as k3s refuses and fails a reset on a server that joined: k3s's CLI refuses
/// `--cluster-reset` while the config has `server` (exit 1, no reset-flag); with the line
/// deleted it resets, unless etcd's forced start fails, which leaves the flag k3s wrote
/// before it; `rm -f` of the flag lets the next reset run.
#[tokio::test]
async fn a_reset_is_refused_while_the_config_names_a_server_and_a_failed_one_leaves_its_flag() {
    let sim = start().await;
    let c = client(&sim);
    let key = ssh::generate_ed25519();
    let public = key.authorized_key_line("test").unwrap();
    let fip = create_floating_ip(&c, "c1-apiserver").await;
    let first = user_data(
        "server",
        &first_server_config(TOKEN, "agent-secret-1", &[fip]),
        std::slice::from_ref(&public),
    );
    create_instance(&c, SERVERS[0], &first).await;
    wait_node_status(&sim, SERVERS[0], "True").await;
    attach_floating_ip(&c, "c1-apiserver", SERVERS[0]).await;
    let join = format!("server: https://{fip}:6443\ntoken: {TOKEN}\n");
    for name in &SERVERS[1..] {
        let ud = user_data("server", &join, std::slice::from_ref(&public));
        create_instance(&c, name, &ud).await;
        wait_node_status(&sim, name, "True").await;
    }
    let real = sim.boot().real_clusters()[0].clone();
    let etcd = real.control_plane.etcd();
    wait_for("3 voting members", || async {
        let m = etcd.members().await.ok()?;
        (m.len() == 3 && m.iter().all(|m| !m.is_learner)).then_some(())
    })
    .await;

    // Quorum lost; the survivor is a server that joined (its config has `server:`).
    let survivor = SERVERS[1];
    for name in [SERVERS[0], SERVERS[2]] {
        stop_instance(&c, name).await;
    }
    for name in [SERVERS[0], SERVERS[2]] {
        wait_for(&format!("{name} stopped"), || async {
            let i = c
                .instance_view()
                .project(PROJECT)
                .instance(name)
                .send()
                .await
                .ok()?;
            (i.run_state == types::InstanceState::Stopped).then_some(())
        })
        .await;
    }
    c.floating_ip_detach()
        .project(PROJECT)
        .floating_ip("c1-apiserver")
        .send()
        .await
        .unwrap();
    attach_floating_ip(&c, "c1-apiserver", survivor).await;
    let pins = HostKeyPins::from_console(&console(&c, survivor).await).unwrap();
    let target = SshTarget::new(SocketAddr::new(fip, SSH_PORT), "ubuntu", key, pins);
    assert_eq!(run(&target, "sudo -n systemctl stop k3s").await.0, 0);

    let reset = "sudo -n k3s server --cluster-reset";
    let flag = "sudo -n cat /var/lib/rancher/k3s/server/db/reset-flag";
    let (status, err) = run(&target, reset).await;
    assert_eq!(status, 1, "{err}");
    assert!(
        err.contains("level=fatal msg=\"cannot perform cluster-reset while server URL is set - remove server from configuration before resetting\""),
        "{err}"
    );
    assert_eq!(
        run(&target, flag).await.0,
        1,
        "a refused reset writes no flag"
    );

    // The join URL out of the config, in place; the token stays. Twice is the same.
    let sed = "sudo -n sed -i '/^server:/d' /etc/rancher/k3s/config.yaml";
    for _ in 0..2 {
        assert_eq!(run(&target, sed).await.0, 0);
        let config = target
            .exec("sudo -n cat /etc/rancher/k3s/config.yaml")
            .await
            .unwrap();
        let config = String::from_utf8_lossy(&config.stdout).into_owned();
        assert!(
            !config.contains("server:") && config.contains(&format!("token: {TOKEN}")),
            "{config}"
        );
    }

    // etcd's forced start fails: k3s wrote the flag before it, and it stays.
    sim.faults()
        .update(|f| f.cluster_reset_fails = vec![survivor.to_owned()]);
    let (status, err) = run(&target, reset).await;
    assert_eq!(status, 1, "{err}");
    assert_eq!(
        run(&target, flag).await.0,
        0,
        "the flag stays after a failed reset"
    );
    let (status, err) = run(&target, reset).await;
    assert_eq!(status, 1, "{err}");
    assert!(err.contains("was previously reset"), "{err}");

    // The flag deleted by hand, the cause gone: the reset runs.
    sim.faults().update(|f| f.cluster_reset_fails.clear());
    assert_eq!(
        run(
            &target,
            "sudo -n rm -f /var/lib/rancher/k3s/server/db/reset-flag"
        )
        .await
        .0,
        0
    );
    assert_eq!(run(&target, flag).await.0, 1, "rm -f deletes the flag");
    let (status, err) = run(&target, reset).await;
    assert_eq!(status, 0, "{err}");
    assert_eq!(run(&target, "sudo -n systemctl start k3s").await.0, 0);
    wait_for("the API back", || async {
        api_answers(&real, fip).await.then_some(())
    })
    .await;
    let members = etcd.members().await.unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(members[0].name.starts_with(survivor), "{members:?}");
}
