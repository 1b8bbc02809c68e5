//! Presets: a simulator that starts with a cluster built the way the product builds one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use oxide_controller::base::names::InstanceTag;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimOptions};

#[tokio::test]
async fn preset_cluster_is_joined_and_carries_the_products_state() {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        preset: Some(Preset::Cluster {
            control_plane: 3,
            workers: 2,
        }),
        ..SimOptions::default()
    })
    .await
    .expect("preset builds");
    assert_eq!(sim.project.as_deref(), Some("sim"));
    let path = sim.kubeconfig.clone().expect("a kubeconfig file");
    let mode = std::fs::metadata(&path).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );

    // The kubeconfig works as-is (server = the API floating IP, names = the cluster).
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some("sim"));
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let nodes = nodes.list(&Default::default()).await.unwrap().items;
    assert_eq!(nodes.len(), 5);

    // Every Node is an instance of the cluster, named by the product, with the product's
    // description tag and a providerID pointing at the instance.
    let dump = sim.oxide().dump();
    let instances = dump["instances"].as_array().unwrap();
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap();
        let inst = instances
            .iter()
            .find(|i| i["name"] == name.as_str())
            .expect("instance for node");
        let tag = InstanceTag::parse(inst["description"].as_str().unwrap()).expect("tagged");
        assert_eq!(tag.cluster, "sim");
        assert!(name.starts_with(&format!("sim-{}-", tag.pool)), "{name}");
        // oxide://<instance id> when the product's cloud-init sets the kubelet's provider ID,
        // else what k3s's own cloud controller sets.
        let provider = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap();
        let by_product = format!("oxide://{}", inst["id"].as_str().unwrap());
        assert!(
            provider == by_product || provider == format!("k3s://{name}"),
            "{provider}"
        );
        let ready = node.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert!(
            ready
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        );
    }
    let cp = nodes
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key("node-role.kubernetes.io/control-plane")
        })
        .count();
    assert_eq!(cp, 3);

    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), "kube-system");
    let secret = secrets.get("oxide-controller").await.unwrap();
    let data = secret.data.unwrap();
    for key in [
        "oxide-host",
        "oxide-token",
        "oxide-project",
        "k3s-token",
        "k3s-agent-token",
        "ssh-public-key",
    ] {
        assert!(data.contains_key(key), "Secret lacks {key}");
    }
    // Audit H1: the webhook's tokens have a Secret of their own.
    assert!(!data.contains_key("webhook-token"), "{:?}", data.keys());
    let auth = secrets.get("oxide-controller-webhook-auth").await.unwrap();
    assert!(auth.data.unwrap().contains_key("webhook-token"));
    assert!(
        !data.contains_key("ssh-private-key"),
        "the SSH private key stays on the laptop"
    );
    assert_eq!(data["oxide-host"].0, sim.oxide_host.as_bytes());
    let configs: kube::Api<ConfigMap> = kube::Api::namespaced(client, "kube-system");
    let config = configs.get("oxide-controller").await.unwrap().data.unwrap();
    let spec = ClusterSpec::from_yaml(&config["spec.yaml"]).unwrap();
    assert_eq!(
        (spec.control_plane.count, spec.worker_pools[0].count),
        (3, 2)
    );
    sim.shutdown();
    assert!(!path.exists(), "shutdown removes the temporary kubeconfig");
}

#[test]
fn binary_with_a_preset_reports_project_and_kubeconfig_and_cleans_up() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxide-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--ssh-port",
            "2222",
            "--preset",
            "cluster:1:1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).expect("JSON ready line");
    assert_eq!(ready["project"], "sim");
    let kubeconfig = std::path::PathBuf::from(ready["kubeconfig"].as_str().unwrap());
    assert!(kubeconfig.exists());

    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean exit: {status}");
    assert!(!kubeconfig.exists(), "temporary files removed on exit");
}
