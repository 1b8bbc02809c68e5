//! Issue 7 acceptance, Oxide CCM mode: `bootstrap --oxide-ccm` against `oxide-sim` gives Nodes
//! with `oxide://<instance-uuid>` provider IDs, k3s with its cloud controller disabled and the
//! kubelet's cloud provider external, the Secret keys the CCM reads, and the CCM installed from
//! its published manifest. Floating IPs made the way the CCM makes them for LoadBalancer
//! Services are left exactly as they are by `reconcile-once`, through a no-op run, a scale-down
//! and a move of the API floating IP.
//!
//! `reconcile-once` is built next to `bootstrap` by the same `cargo build` a dev image uses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::{Env, env, kube_client, workspace_binaries};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::adapters::oxide_rack::OxideRack;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::domain::status::Status;
use oxide_controller::ports::rack::Rack as _;
use oxide_controller::ports::state::{self, StateStore as _};
use serde_json::Value;

const CP: &str = "demo-control-plane-";
const WK: &str = "demo-workers-";
const CCM_IMAGE: &str = "registry.example/oxide-ccm:test";
/// What the CCM writes into the description of its floating IPs.
const CCM_DESCRIPTION: &str = "Managed by oxide-cloud-controller-manager.";

/// Runs with `args`, expects exit 2 with one human line containing `needles`, and no Oxide
/// API request at all.
async fn refused(env: &Env, args: Vec<String>, needles: &[&str]) {
    env.sim.oxide().reset_counters();
    let out = env.command(&args).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}\n{stderr}");
    let human: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('{'))
        .collect();
    assert_eq!(human.len(), 1, "one line for a person: {stderr}");
    for needle in needles {
        assert!(human[0].contains(needle), "{:?} lacks {needle:?}", human[0]);
    }
    let calls: u64 = env.sim.oxide().counters().values().sum();
    assert_eq!(calls, 0, "{:?}", env.sim.oxide().counters());
}

fn instances(env: &Env, prefix: &str) -> Vec<Value> {
    let mut all: Vec<Value> = env.dump()["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .collect();
    all.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    all
}

fn instance_id(env: &Env, name: &str) -> String {
    instances(env, name)
        .first()
        .and_then(|i| i["id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no instance {name}"))
}

/// Floating IPs by name: (address, attached instance id).
fn floating_ips(env: &Env) -> BTreeMap<String, (String, Option<String>)> {
    env.dump()["floating_ips"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_owned(),
                (
                    f["ip"].as_str().unwrap().to_owned(),
                    f["instance"].as_str().map(str::to_owned),
                ),
            )
        })
        .collect()
}

fn api_holder(env: &Env) -> String {
    let id = floating_ips(env)["demo-apiserver"]
        .1
        .clone()
        .expect("the API floating IP is attached");
    instances(env, "")
        .iter()
        .find(|i| i["id"] == id.as_str())
        .and_then(|i| i["name"].as_str().map(str::to_owned))
        .unwrap()
}

/// Workers, oldest first (as the planner sees their age: the rack's time_created).
async fn workers_by_age(rack: &OxideRack) -> Vec<String> {
    let mut w = rack.list_instances(WK).await.unwrap();
    w.sort_by_key(|i| (i.time_created, i.name.clone()));
    w.into_iter().map(|i| i.name).collect()
}

/// The Secret's decoded data, read through the Kubernetes API as the CCM would.
async fn secret_data(env: &Env) -> BTreeMap<String, String> {
    let client = kube_client(&env.kubeconfig(), "demo").await;
    let secret = Api::<Secret>::namespaced(client, "kube-system")
        .get("oxide-controller")
        .await
        .unwrap();
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

async fn reconcile(kubeconfig: &Path, reconcile_once: &Path) -> Output {
    tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(reconcile_once)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--context", "demo", "--log-format", "json"])
            .env_remove("KUBECONFIG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("reconcile-once finished in time")
    .unwrap()
}

async fn store(kubeconfig: &Path) -> KubeStateStore {
    let client = oxide_controller::adapters::kubeclient::client(Some(kubeconfig), Some("demo"))
        .await
        .unwrap();
    KubeStateStore::new(client, "kube-system")
}

/// Runs reconcile-once until the status says Ready (at least once); returns the runs.
async fn converge(kubeconfig: &Path, reconcile_once: &Path, max_runs: usize) -> usize {
    let store = store(kubeconfig).await;
    for i in 1..=max_runs {
        let out = reconcile(kubeconfig, reconcile_once).await;
        let code = out.status.code();
        assert!(
            matches!(code, Some(0 | 1)),
            "run {i}: exit {code:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ready = store
            .read_config()
            .await
            .ok()
            .and_then(|s| s.status_json().and_then(Status::from_json))
            .and_then(|s| s.condition("Ready").map(|c| c.status == "True"));
        if code == Some(0) && ready == Some(true) {
            return i;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("not converged after {max_runs} runs");
}

/// A kubeconfig like `kubeconfig` that reaches the API through `member`'s own address (in the
/// cluster the CronJob uses the kubernetes Service, not the floating IP that may be moving).
/// The address is the member's ephemeral IP, which k3s does not put in its serving certificate
/// (NAT the guest never sees; `tls-san-security`), so the certificate is verified for the API
/// floating IP the product passes as `tls-san` (`tls-server-name`), as an operator would.
fn via_member(env: &Env, kubeconfig: &Path, member: &str) -> PathBuf {
    let ip = instances(env, member)[0]["external_ips"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let fip = &floating_ips(env)["demo-apiserver"].0;
    let mut config = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    for named in &mut config.clusters {
        let cluster = named.cluster.as_mut().unwrap();
        assert_eq!(
            cluster.server.as_deref(),
            Some(format!("https://{fip}:6443").as_str())
        );
        cluster.server = Some(format!("https://{ip}:6443"));
        cluster.tls_server_name = Some(fip.clone());
    }
    let path = kubeconfig.with_file_name(format!("kubeconfig-{member}"));
    // JSON is YAML: any kubeconfig reader takes it.
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ccm_mode_gives_provider_ids_and_the_ccm_and_reconcile_leaves_its_floating_ips_alone() {
    let reconcile_once = workspace_binaries().join("reconcile-once");
    let env = env().await;
    env.run_ok(&[
        "--oxide-ccm",
        "--oxide-ccm-image",
        CCM_IMAGE,
        "--workers",
        "3",
    ])
    .await;

    // Every Node's provider ID is oxide://<its instance's UUID>; instance name = node name.
    let nodes = env.sim.kube().list("v1", "Node", None).await;
    assert_eq!(nodes.len(), 6);
    for n in &nodes {
        let name = n["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            n["spec"]["providerID"],
            format!("oxide://{}", instance_id(&env, name)),
            "{name}"
        );
    }

    // k3s: no built-in cloud controller on servers, external cloud provider everywhere, the
    // provider ID from the SMBIOS UUID.
    for i in instances(&env, "demo-") {
        let running = env
            .sim
            .oxide()
            .running_instance(i["id"].as_str().unwrap().parse().unwrap())
            .unwrap();
        let ud = oxide_sim::guest::parse_user_data(&running.user_data).unwrap();
        let k3s = ud.k3s.as_ref().unwrap();
        let server = i["name"].as_str().unwrap().starts_with(CP);
        assert_eq!(k3s.disable_cloud_controller, server, "{}", i["name"]);
        assert!(
            k3s.kubelet_arg
                .iter()
                .any(|a| a == "cloud-provider=external"),
            "{}: {:?}",
            i["name"],
            k3s.kubelet_arg
        );
        assert_eq!(ud.smbios_provider_id_prefix.as_deref(), Some("oxide://"));
    }

    // The Secret keys the CCM reads, with the values it needs.
    let data = secret_data(&env).await;
    assert_eq!(data["oxide-host"], env.sim.oxide_host);
    assert_eq!(data["oxide-token"], env.sim.oxide_token);
    assert_eq!(data["oxide-project"], "demo");

    // The CCM from its published manifest: our image, our Secret, our cluster name.
    let kube = env.sim.kube();
    let ccm = kube
        .get(
            "apps/v1",
            "Deployment",
            Some("kube-system"),
            "oxide-cloud-controller-manager",
        )
        .await
        .expect("the CCM Deployment");
    let c = &ccm["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], CCM_IMAGE);
    let command: Vec<&str> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        command,
        [
            "/usr/bin/oxide-cloud-controller-manager",
            "--cloud-provider=oxide",
            "--cluster-name=demo"
        ]
    );
    let env_refs: Vec<(String, String, String)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let r = &e["valueFrom"]["secretKeyRef"];
            (
                e["name"].as_str().unwrap().to_owned(),
                r["name"].as_str().unwrap().to_owned(),
                r["key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        env_refs,
        [
            ("OXIDE_HOST", "oxide-controller", "oxide-host"),
            ("OXIDE_TOKEN", "oxide-controller", "oxide-token"),
            ("OXIDE_PROJECT", "oxide-controller", "oxide-project"),
        ]
        .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()))
    );
    for (api, kind, ns, name) in [
        (
            "v1",
            "ServiceAccount",
            Some("kube-system"),
            "oxide-cloud-controller-manager",
        ),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            None,
            "system:oxide-cloud-controller-manager",
        ),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            None,
            "system:oxide-cloud-controller-manager",
        ),
    ] {
        assert!(
            kube.get(api, kind, ns, name).await.is_some(),
            "{kind} {name}"
        );
    }

    // Floating IPs the way the CCM makes them for LoadBalancer Services: named
    // <cluster-name>-<namespace>-<service> (ours pass --cluster-name=demo; an unconfigured CCM
    // uses "kubernetes"), created in the project, attached to a node's instance.
    let holder = api_holder(&env);
    let servers: Vec<String> = instances(&env, CP)
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_owned())
        .collect();
    let other_servers: Vec<&String> = servers.iter().filter(|s| **s != holder).collect();
    let rack = env.rack("demo");
    let workers = workers_by_age(&rack).await;
    let ccm_fips: [(&str, Option<&str>); 4] = [
        ("demo-default-web", Some(workers[0].as_str())),
        ("kubernetes-default-web", Some(workers[1].as_str())),
        ("demo-ingress-traefik", Some(other_servers[0].as_str())),
        ("demo-default-idle", None),
    ];
    for (name, on) in ccm_fips {
        rack.create_floating_ip(name, CCM_DESCRIPTION, None)
            .await
            .unwrap();
        if let Some(instance) = on {
            rack.attach_floating_ip(name, instance).await.unwrap();
        }
    }
    let snapshot = |env: &Env| -> BTreeMap<String, (String, Option<String>)> {
        floating_ips(env)
            .into_iter()
            .filter(|(n, _)| ccm_fips.iter().any(|(c, _)| c == n))
            .collect()
    };
    let before = snapshot(&env);
    assert_eq!(before.len(), 4);
    for (name, on) in ccm_fips {
        assert_eq!(before[name].1, on.map(|i| instance_id(&env, i)), "{name}");
    }
    let kubeconfig = env.kubeconfig();

    // 1. A converged cluster: runs change nothing of the CCM's.
    for _ in 0..2 {
        let out = reconcile(&kubeconfig, &reconcile_once).await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(snapshot(&env), before, "after no-op runs");

    // 2. Scale-down 3 → 2 workers: the newest worker goes; the CCM's stay where they are.
    let st = store(&kubeconfig).await;
    let snap = st.read_config().await.unwrap();
    let mut spec = ClusterSpec::from_yaml(snap.spec_yaml().unwrap()).unwrap();
    spec.worker_pools[0].count = 2;
    let mut data = snap.data.clone();
    data.insert(state::keys::SPEC.into(), spec.to_yaml());
    st.replace_config(&snap.resource_version, data)
        .await
        .unwrap();
    converge(&kubeconfig, &reconcile_once, 30).await;
    assert_eq!(
        workers_by_age(&rack).await,
        workers[..2],
        "the newest worker went"
    );
    assert_eq!(snapshot(&env), before, "after the scale-down");
    assert_eq!(api_holder(&env), holder);

    // 3. The API floating IP's holder dies: reconcile moves <cluster>-apiserver (and replaces
    //    the server), and nothing else.
    let via = via_member(&env, &kubeconfig, other_servers.last().unwrap().as_str());
    // It does not come back when started again (it fails at boot), so it is replaced.
    env.sim
        .faults()
        .update(|f| f.fail_at_boot = vec![holder.clone()]);
    env.sim
        .oxide()
        .set_instance_failed(instance_id(&env, &holder).parse().unwrap());
    converge(&via, &reconcile_once, 40).await;
    let moved_to = api_holder(&env);
    assert_ne!(moved_to, holder, "the API floating IP moved");
    assert!(moved_to.starts_with(CP));
    assert!(
        !instances(&env, CP)
            .iter()
            .any(|i| i["name"] == holder.as_str()),
        "the dead server was replaced"
    );
    assert_eq!(
        env.ready_nodes(CP).await.len(),
        3,
        "three Ready servers again: {:?}",
        env.ready_nodes(CP).await
    );
    assert_eq!(snapshot(&env), before, "after the API floating IP moved");
    // Every floating IP that exists is either ours or the CCM's: nothing was added either.
    let names: Vec<String> = floating_ips(&env).into_keys().collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names.contains(&"demo-apiserver".to_owned()));

    // 4. The Oxide token every run and the CCM read is rotated (audit security-2 H2's rest).
    oxide_token_rotation(&env, &via, &reconcile_once).await;
}

/// The token's id was recorded by bootstrap; a token that does not work changes nothing;
/// after the rack's token is rotated, runs fail until `bootstrap rotate-oxide-token` writes
/// the new one (and its id) into the Secret and the backup pod's copy; then they converge.
async fn oxide_token_rotation(env: &Env, kubeconfig: &Path, reconcile_once: &Path) {
    let old_id = env.sim.oxide().token_id().to_string();
    assert_eq!(
        secret_data(env).await.get("oxide-token-id"),
        Some(&old_id),
        "bootstrap records the only token's id"
    );
    let bad = env.dir.path().join("bad-token");
    std::fs::write(&bad, "oxide-token-not-one-the-rack-knows\n").unwrap();
    let bad_flag = format!("file:{}", bad.display());
    let out = env
        .command(&env.sub_args("rotate-oxide-token", "demo", &["--oxide-token", &bad_flag]))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "a refused token is not written");
    assert_eq!(
        secret_data(env)
            .await
            .get("oxide-token")
            .map(String::as_str),
        Some(env.oxide_token().trim()),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    env.rotate_oxide_token("oxide-token-rotated-by-the-silo-admin-0123456789");
    let refused = reconcile(kubeconfig, reconcile_once).await;
    assert!(!refused.status.success(), "the old token is refused");
    let out = env
        .command(&env.sub_args("rotate-oxide-token", "demo", &[]))
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_id = env.sim.oxide().token_id().to_string();
    assert_ne!(new_id, old_id);
    assert!(stdout.contains(&format!("Its id is {new_id}")), "{stdout}");
    assert!(
        stdout.contains(&format!("DELETE /v1/me/access-tokens/{old_id}")),
        "{stdout}"
    );
    assert!(
        !stdout.contains(env.oxide_token().trim()),
        "no token on stdout"
    );
    let data = secret_data(env).await;
    assert_eq!(data["oxide-token"], env.oxide_token().trim());
    assert_eq!(data["oxide-token-id"], new_id);
    let client = kube_client(&env.kubeconfig(), "demo").await;
    let copy = Api::<Secret>::namespaced(client, "oxide-controller-backup")
        .get("oxide-controller-rack")
        .await
        .unwrap();
    assert_eq!(
        copy.data.unwrap()["oxide-token"].0,
        env.oxide_token().trim().as_bytes(),
        "the backup pod's copy"
    );
    converge(kubeconfig, reconcile_once, 10).await;
    let status = store(kubeconfig)
        .await
        .read_config()
        .await
        .ok()
        .and_then(|s| s.status_json().and_then(Status::from_json))
        .unwrap();
    assert_eq!(
        status.oxide_token.and_then(|t| t.id),
        Some(new_id),
        "the run listed the tokens at once (the id changed)"
    );
}

/// `--oxide-ccm-image` without `--oxide-ccm`, or not an image; and (audit security-2 N12) an
/// image by digest whose digest is not `sha256:` and 64 hex digits, for the CCM's and the
/// controller's image alike: exit 2 naming the flag and the form, before any call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_ccm_or_controller_image_is_refused_naming_the_flag() {
    let env = env().await;
    refused(
        &env,
        env.args(&["--oxide-ccm-image", CCM_IMAGE]),
        &["--oxide-ccm-image", "with --oxide-ccm"],
    )
    .await;
    refused(
        &env,
        env.args(&["--oxide-ccm", "--oxide-ccm-image", "bad image"]),
        &["--oxide-ccm-image", "bad image"],
    )
    .await;
    let short = "ghcr.io/oxidecomputer/oxide-cloud-controller-manager@sha256:0123abcd";
    refused(
        &env,
        env.args(&["--oxide-ccm", "--oxide-ccm-image", short]),
        &[
            "--oxide-ccm-image",
            "NAME@sha256:<64 lower-case hex digits>",
        ],
    )
    .await;
    let unknown = format!(
        "ghcr.io/aifoundry-org/oxide-controller@md5:{}",
        "0".repeat(32)
    );
    refused(
        &env,
        env.args(&["--controller-image", &unknown]),
        &[
            "--controller-image",
            "NAME@sha256:<64 lower-case hex digits>",
        ],
    )
    .await;
}
