//! `bootstrap delete` end to end: the real binary against `oxide-sim`, after a real
//! `bootstrap` of cluster `prod` (3+3) next to decoys in the same project — a second cluster
//! `prod-2` (another real bootstrap, 1+1, with its own API), another cluster's VM and
//! addresses (`prod-2-…`), an untagged `prod-db`, a user floating IP, a project image nobody
//! uploaded through bootstrap, and the silo image.
//!
//! Checked: the dry run makes no mutating request and lists exactly what the real run
//! removes; afterwards the state dump holds nothing of `prod` and every decoy; a run on a
//! cluster already gone exits 0 saying so; without a terminal and without `--yes` it refuses
//! (exit 2); SIGKILLed at ten points in a row, each followed by a re-run, it ends in the same
//! state; a reconcile run started while the deletion runs creates no VM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Env, IMAGE, env, log_lines};
use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_controller::base::names;
use oxide_controller::base::size::ByteSize;
use oxide_controller::domain::model::{NewDisk, NewInstance};
use oxide_controller::ports::rack::Rack as _;

const CCM: &str = "Managed by oxide-cloud-controller-manager.";

async fn delete(env: &Env, extra: &[&str]) -> std::process::Output {
    env.delete("prod", extra).await
}

/// Cluster `prod`, 3 control planes + 3 workers, and the decoys. With `prod2` set, the
/// kubeconfig path of a second, really bootstrapped cluster `prod-2` (1+1, same project) stands
/// in for the made-up `prod-2` VM and API address.
async fn prod_with_decoys(prod2: Option<&std::path::Path>) -> Env {
    let env = env().await;
    env.run_ok(&["--cluster", "prod", "--workers", "3"]).await;
    let mut vms = vec![("prod-db", "my database")];
    let mut fips = vec![
        ("prod-web", "the user's own address"),
        ("prod-2-default-web", CCM),
        // The CCM's address of one of prod's LoadBalancer Services.
        ("prod-default-web", CCM),
    ];
    match prod2 {
        Some(kubeconfig) => {
            env.run_ok(&[
                "--cluster",
                "prod-2",
                "--project",
                "prod",
                "--control-planes",
                "1",
                "--workers",
                "1",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
            ])
            .await;
        }
        None => {
            vms.push((
                "prod-2-workers-xxxxx",
                "oxide-controller cluster=prod-2 pool=workers spec=abc",
            ));
            fips.push((
                "prod-2-apiserver",
                "oxide-controller cluster=prod-2 Kubernetes API",
            ));
        }
    }
    let rack = env.rack("prod");
    let image = rack.find_image(IMAGE).await.unwrap().unwrap();
    for (name, description) in vms {
        rack.create_instance(&NewInstance {
            name: name.into(),
            description: description.into(),
            hostname: name.into(),
            ncpus: 1,
            memory: ByteSize::gib(1),
            boot_disk: NewDisk {
                name: names::boot_disk_name(name),
                size: ByteSize::gib(3),
                image: Some(image.id),
            },
            data_disk: None,
            restore_disk: None,
            user_data: b"#cloud-config\n".to_vec(),
            ephemeral_ip: false,
            ip_pool: None,
            anti_affinity_group: None,
            rack_restarts: false,
        })
        .await
        .unwrap();
    }
    for (name, description) in fips {
        rack.create_floating_ip(name, description, None)
            .await
            .unwrap();
    }
    // The user's own firewall rule next to bootstrap's.
    rack.ensure_firewall_rules(&[user_rule(
        "allow-office",
        "the user's rule",
        443,
        "203.0.113.0/24",
    )])
    .await
    .unwrap();
    env
}

fn decoys() -> BTreeSet<String> {
    [
        "instance prod-2-workers-xxxxx",
        "instance prod-db",
        "disk boot-prod-2-workers-xxxxx",
        "disk boot-prod-db",
        "floating_ip prod-web",
        "floating_ip prod-2-apiserver",
        "floating_ip prod-2-default-web",
        &format!("image {IMAGE}"),
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// Every object in the simulator's state dump as `kind name`.
fn everything(env: &Env) -> BTreeSet<String> {
    let dump = env.dump();
    let mut out = BTreeSet::new();
    for (key, kind) in [
        ("instances", "instance"),
        ("disks", "disk"),
        ("floating_ips", "floating_ip"),
        ("images", "image"),
        ("snapshots", "snapshot"),
        ("anti_affinity_groups", "group"),
    ] {
        for o in dump[key].as_array().into_iter().flatten() {
            if let Some(n) = o["name"].as_str() {
                out.insert(format!("{kind} {n}"));
            }
        }
    }
    out
}

/// The `kind name` pairs of a dry run's list (its table lines).
fn listed(stdout: &str) -> BTreeSet<String> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("Dry run"))
        .skip(1)
        .take_while(|l| l.starts_with("  ") && !l.starts_with("  would:"))
        .filter_map(|l| {
            let l = l.trim();
            [
                "instance",
                "disk",
                "floating IP",
                "snapshot",
                "import disk",
                "anti-affinity group",
                "firewall rule",
                "image",
            ]
            .iter()
            .find_map(|k| {
                l.strip_prefix(k)
                    .map(|rest| format!("{k} {}", rest.split_whitespace().next().unwrap_or("")))
            })
        })
        .collect()
}

/// What the real run said it removed, from its `step=remove` log lines.
fn removed(stderr: &[u8]) -> BTreeSet<String> {
    log_lines(stderr)
        .iter()
        .filter(|v| v["step"] == "remove")
        .filter_map(|v| Some(format!("{} {}", v["kind"].as_str()?, v["name"].as_str()?)))
        .collect()
}

/// Whether a dump entry is cluster `prod`'s (what delete must remove).
fn is_prods(entry: &str) -> bool {
    let name = entry.split_once(' ').map(|(_, n)| n).unwrap_or_default();
    [
        "prod-control-plane-",
        "prod-workers-",
        "oxide-controller-import-",
    ]
    .iter()
    .any(|p| name.starts_with(p) || name.starts_with(&format!("boot-{p}")))
        || ["prod-apiserver", "prod-default-web", "prod-control-plane"].contains(&name)
}

/// Issue 32 item 6: the servers of a cluster whose spec names no group are in the default
/// group `<cluster>-control-plane`, and only they.
fn assert_servers_spread(env: &Env, cluster: &str) {
    let dump = env.dump();
    let group = format!("{cluster}-control-plane");
    let members: BTreeSet<String> = dump["anti_affinity_groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == group.as_str())
        .unwrap_or_else(|| panic!("no group {group}: {dump:#}"))["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    let servers: BTreeSet<String> = dump["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| {
            i["name"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{group}-"))
        })
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(!servers.is_empty());
    assert_eq!(members, servers, "{group} holds exactly the servers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_removes_the_cluster_and_nothing_else() {
    let scratch = tempfile::tempdir().unwrap();
    let prod2_kubeconfig = scratch.path().join("prod-2.kubeconfig");
    let env = prod_with_decoys(Some(&prod2_kubeconfig)).await;
    env.sim
        .oxide()
        .seed_project_image("prod", "golden", 1 << 30);
    // Two uploads for prod killed half-way (audit 2 F1): one disk still taking bulk writes, one
    // stopped but not finalized. Nexus deletes neither as it stands.
    {
        use oxide_controller::adapters::image::{ImageStore as _, import_disk_description};
        let r = env.rack("prod");
        for (name, stop) in [
            ("oxide-controller-import-aaaaaaaaaa", false),
            ("oxide-controller-import-bbbbbbbbbb", true),
        ] {
            r.create_import_disk(
                name,
                &import_disk_description("noble", Some("prod")),
                1 << 30,
                512,
            )
            .await
            .unwrap();
            r.bulk_write_start(name).await.unwrap();
            if stop {
                r.bulk_write_stop(name).await.unwrap();
            }
        }
    }
    let before = everything(&env);
    assert_servers_spread(&env, "prod");
    assert_servers_spread(&env, "prod-2");
    let decoys: BTreeSet<String> = before.iter().filter(|o| !is_prods(o)).cloned().collect();
    assert!(
        decoys
            .iter()
            .any(|o| o.starts_with("instance prod-2-control-plane-")),
        "{decoys:?}"
    );
    assert!(decoys.contains("image golden"));
    assert!(
        before
            .iter()
            .any(|o| o.starts_with("instance prod-workers-"))
    );

    // No terminal, no --yes: refused before any request.
    env.sim.oxide().reset_counters();
    let refused = delete(&env, &[]).await;
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    assert!(env.sim.oxide().counters().values().all(|n| *n == 0));

    env.sim.oxide().reset_counters();
    let dry = delete(&env, &["--dry-run", "--delete-images", "--delete-project"]).await;
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let dry_out = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert_eq!(env.mutating_calls(), vec![], "a dry run mutates nothing");
    assert_eq!(everything(&env), before);
    let dry_list = listed(&dry_out);
    assert_eq!(
        dry_list
            .iter()
            .filter(|l| l.starts_with("instance "))
            .count(),
        6,
        "{dry_out}"
    );
    assert!(
        dry_out.contains("prod-db") && dry_out.contains("no oxide-controller tag"),
        "{dry_out}"
    );
    assert!(
        dry_out.contains("would: take the reconcile Lease"),
        "{dry_out}"
    );

    let real = delete(&env, &["--yes", "--delete-images", "--delete-project"]).await;
    let stdout = String::from_utf8_lossy(&real.stdout).into_owned();
    assert!(
        real.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&real.stderr)
    );
    assert_eq!(
        removed(&real.stderr),
        dry_list,
        "the dry run listed what the real run removed\n{stdout}"
    );
    assert_eq!(everything(&env), decoys, "{stdout}");
    assert!(
        !env.kubeconfig().exists(),
        "the kubeconfig bootstrap wrote is gone"
    );
    assert!(
        !env.state_dir().join("prod.json").exists(),
        "the resume file is gone"
    );
    assert!(stdout.contains("Deleted cluster prod"), "{stdout}");
    // The project still holds the decoys: kept, and the output says why.
    assert!(
        stdout.contains("(the project)")
            && stdout.contains("it still holds")
            && stdout.contains("instance prod-db"),
        "{stdout}"
    );
    assert!(env.names("projects").contains(&"prod".to_owned()));
    // Only bootstrap's rule for prod went.
    let rules = env.rack("prod").list_firewall_rules().await.unwrap();
    assert!(!rules.contains(&"prod-k8s-api".to_owned()), "{rules:?}");
    for kept in ["prod-2-k8s-api", "allow-office", "allow-ssh"] {
        assert!(
            rules.contains(&kept.to_owned()),
            "{kept} missing: {rules:?}"
        );
    }
    // prod-2 still runs, with its own API.
    let client = common::kube_client(&prod2_kubeconfig, "prod-2").await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let names: Vec<String> = nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("prod-2-")), "{names:?}");
    assert!(env.state_dir().join("prod-2.json").exists());

    let again = delete(&env, &["--yes"]).await;
    let again_out = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success());
    assert!(again_out.contains("already gone"), "{again_out}");
    assert_eq!(everything(&env), decoys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_ten_times_during_deletion_each_rerun_gets_further_and_the_end_is_the_same() {
    let env = prod_with_decoys(None).await;
    // The tests' clusters take no scheduled backups (`--backup-schedule off`, a suspended
    // CronJob); this one's CronJob runs, as a default cluster's does.
    env.sim
        .kube()
        .apply(
            serde_json::json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "oxide-controller-backup",
                "namespace": "oxide-controller-backup"},
            "spec": {"suspend": false}}),
        )
        .await
        .unwrap();
    // One instance at a time, so every kill point below is reached by a run of its own.
    let args = env.delete_args("prod", &["--yes", "--concurrency", "1"]);
    // Each run is SIGKILLed right after its first mutating request reached the simulator,
    // and the next run resumes what it left; until a run gets through on its own.
    let mut killed = 0;
    while kill_after_first_mutation(&env, &args).await {
        killed += 1;
        if killed == 1 {
            // The Lease is ours and the CronJob suspended: a reconcile started now (as a
            // CronJob run would) must not create a VM.
            let kube = env.sim.kube();
            let cj = kube
                .get(
                    "batch/v1",
                    "CronJob",
                    Some("oxide-controller-jobs"),
                    "oxide-controller",
                )
                .await
                .expect("CronJob");
            assert_eq!(cj["spec"]["suspend"], true);
            // The in-cluster backup too (audit security-2 N1): none is made after the backups
            // were listed, to outlive --delete-backups.
            let backup = kube
                .get(
                    "batch/v1",
                    "CronJob",
                    Some("oxide-controller-backup"),
                    "oxide-controller-backup",
                )
                .await
                .expect("the backup CronJob");
            assert_eq!(
                backup["spec"]["suspend"], true,
                "the backup CronJob runs on"
            );
            let lease = kube
                .get(
                    "coordination.k8s.io/v1",
                    "Lease",
                    Some("kube-system"),
                    "oxide-controller",
                )
                .await
                .expect("Lease");
            assert!(
                lease["spec"]["holderIdentity"]
                    .as_str()
                    .is_some_and(|h| h.starts_with("bootstrap-delete@")),
                "{lease}"
            );
            env.sim.oxide().reset_counters();
            reconcile_now(&env).await;
            assert_eq!(
                env.sim
                    .oxide()
                    .counters()
                    .get("POST /v1/instances")
                    .copied()
                    .unwrap_or(0),
                0,
                "a reconcile during deletion created a VM"
            );
        }
        assert!(killed < 100, "delete never finishes");
    }
    eprintln!("delete was killed {killed} times before a run finished");
    assert!(
        killed >= 10,
        "only {killed} runs were killed before finishing"
    );
    let out = env.command(&args).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        everything(&env),
        decoys(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Starts delete and SIGKILLs it as soon as the simulator served one mutating request of it.
/// False when the run finished first.
async fn kill_after_first_mutation(env: &Env, args: &[String]) -> bool {
    env.sim.oxide().reset_counters();
    let mut child = env
        .command(args)
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        if !env.mutating_calls().is_empty() {
            child.start_kill().unwrap();
            let _ = child.wait().await;
            return true;
        }
        if let Ok(Some(status)) = child.try_wait() {
            assert!(status.success(), "delete failed: {status}");
            return false;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "delete ran for 300 s"
        );
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// One reconcile pass with the admin kubeconfig, as the CronJob's Job would run it.
async fn reconcile_now(env: &Env) {
    use oxide_controller::adapters::kube_cluster::KubeCluster;
    use oxide_controller::adapters::kube_store::KubeStateStore;
    use oxide_controller::ports::cluster::NAMESPACE;
    use oxide_controller::workflows::reconcile::{self, ReconcileOptions};
    let Ok(client) =
        oxide_controller::adapters::kubeclient::client(Some(&env.kubeconfig()), Some("prod")).await
    else {
        return;
    };
    let cluster = KubeCluster::new(client.clone(), NAMESPACE);
    let store = KubeStateStore::new(client, NAMESPACE);
    let mut opts = ReconcileOptions::new("reconcile-test");
    opts.deadline = Some(Duration::from_secs(20));
    let make_rack = |s: &oxide_controller::base::secrets::ClusterSecrets,
                     spec: &oxide_controller::domain::spec::ClusterSpec| {
        OxideRack::connect(
            &s.oxide_host,
            &s.oxide_token,
            &spec.project,
            RackOptions::default(),
        )
    };
    let outcome = reconcile::run(&cluster, &store, make_rack, &opts).await;
    assert!(
        matches!(
            outcome,
            Ok(reconcile::RunOutcome::LeaseHeld { .. }) | Err(_)
        ),
        "{outcome:?}"
    );
}

/// A request to the simulator's Oxide API as a user would make it (the console, the CLI).
async fn oxide_api(
    env: &Env,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) {
    let mut req = reqwest::Client::new()
        .request(method.clone(), format!("{}{path}", env.sim.oxide_host))
        .bearer_auth(&env.sim.oxide_token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    assert!(
        status.is_success(),
        "{method} {path}: {status} {}",
        resp.text().await.unwrap_or_default()
    );
}

/// `bootstrap delete --delete-project` of cluster `name` (its project has the same name).
async fn delete_project(env: &Env, name: &str, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec!["--delete-project"];
    args.extend_from_slice(extra);
    let out = env.delete(name, &args).await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The project `name` in the state dump: `None` once deleted.
fn project_dump(env: &Env, name: &str) -> Option<serde_json::Value> {
    env.dump()["projects"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .cloned()
}

/// Audit oxide-api-2 F2, against the simulator's nexus rules for deleting subnets, VPCs and
/// projects: an emptied project goes with its VPC and subnet; one holding a user's affinity
/// group or a second subnet is kept, with its network whole (the rack would otherwise delete
/// subnet and VPC, rules included, then refuse the project); one whose VPC a user removed
/// still goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_project_goes_only_whole_and_a_project_without_its_vpc_still_goes() {
    let env = common::env().await;
    for name in ["solo", "aff", "sub", "novpc"] {
        let rack = env.rack(name);
        rack.ensure_project().await.unwrap();
        rack.create_floating_ip(
            &names::api_floating_ip_name(name),
            &names::api_floating_ip_description(name),
            None,
        )
        .await
        .unwrap();
    }
    oxide_api(
        &env,
        reqwest::Method::POST,
        "/v1/affinity-groups?project=aff",
        Some(
            serde_json::json!({"name": "db-pair", "description": "a user's",
            "policy": "allow", "failure_domain": "sled"}),
        ),
    )
    .await;
    oxide_api(
        &env,
        reqwest::Method::POST,
        "/v1/vpc-subnets?project=sub&vpc=default",
        Some(serde_json::json!({"name": "lab", "description": "a user's",
            "ipv4_block": "10.20.0.0/24"})),
    )
    .await;
    for path in [
        "/v1/vpc-subnets/default?project=novpc&vpc=default",
        "/v1/vpcs/default?project=novpc",
    ] {
        oxide_api(&env, reqwest::Method::DELETE, path, None).await;
    }

    // Emptied: the project goes, with its VPC and subnet.
    let (ok, stdout, stderr) = delete_project(&env, "solo", &["--yes"]).await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(project_dump(&env, "solo").is_none(), "{stdout}");

    // Kept, with the reason, by the dry run and the real run alike; nothing of the network
    // deleted.
    for (name, why) in [
        ("aff", "affinity group db-pair"),
        ("sub", "subnet lab of VPC default"),
    ] {
        let (ok, dry, stderr) = delete_project(&env, name, &["--dry-run"]).await;
        assert!(ok, "{dry}\n{stderr}");
        assert!(dry.contains(why), "{dry}");
        env.sim.oxide().reset_counters();
        let (ok, real, stderr) = delete_project(&env, name, &["--yes"]).await;
        assert!(ok, "{real}\n{stderr}");
        assert!(real.contains(why), "{real}");
        assert_eq!(
            env.mutating_calls(),
            vec![("DELETE /v1/floating-ips/{floating_ip}".to_owned(), 1)],
            "only the cluster's address goes\n{real}"
        );
        let p = project_dump(&env, name).expect("project kept");
        assert_eq!(p["vpcs"], serde_json::json!(["default"]), "{p}");
        assert!(
            p["subnets"].as_array().unwrap().contains(&"default".into()),
            "{p}"
        );
        for rule in ["allow-internal-inbound", "allow-ssh", "allow-icmp"] {
            assert!(
                p["firewall_rules"]
                    .as_array()
                    .unwrap()
                    .contains(&rule.into()),
                "{rule}: {p}"
            );
        }
    }

    // VPC removed by hand: observed all the same, and the project goes.
    let (ok, stdout, stderr) = delete_project(&env, "novpc", &["--yes"]).await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(project_dump(&env, "novpc").is_none(), "{stdout}");
}

/// Audit oxide-api-2 F3: a user deletes the API floating IP, reconcile re-creates it (the
/// CronJob reaches the API through a server's own address, not the floating IP), and
/// `bootstrap delete --delete-project` then knows the new address as the cluster's: it removes
/// it and the project (a foreign description would have kept both, leaking the address).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_address_reconcile_re_created_goes_with_the_project() {
    use oxide_controller::adapters::kube_cluster::KubeCluster;
    use oxide_controller::adapters::kube_store::KubeStateStore;
    use oxide_controller::ports::cluster::NAMESPACE;
    use oxide_controller::workflows::reconcile::{self, ReconcileOptions};

    let env = common::env().await;
    env.run_ok(&["--control-planes", "1", "--workers", "0"])
        .await;
    let fip = "demo-apiserver";
    let old_ip = env.dump()["floating_ips"][0]["ip"]
        .as_str()
        .unwrap()
        .to_owned();
    for (method, path) in [
        (
            reqwest::Method::POST,
            "/v1/floating-ips/demo-apiserver/detach?project=demo",
        ),
        (
            reqwest::Method::DELETE,
            "/v1/floating-ips/demo-apiserver?project=demo",
        ),
    ] {
        oxide_api(&env, method, path, None).await;
    }
    assert_eq!(env.names("floating_ips"), Vec::<String>::new());

    // The kubeconfig, pointed at the server's own (ephemeral) address. k3s does not put that
    // address in its serving certificate (NAT the guest never sees; `tls-san-security`), so the
    // certificate is verified for the old floating IP, which the product passed as `tls-san`.
    let server_ip = env.dump()["instances"][0]["external_ips"][0]
        .as_str()
        .expect("the server has an address of its own")
        .to_owned();
    let via = env.dir.path().join("via-server.kubeconfig");
    let mut config = kube::config::Kubeconfig::read_from(env.kubeconfig()).unwrap();
    for named in &mut config.clusters {
        let cluster = named.cluster.as_mut().unwrap();
        assert_eq!(
            cluster.server.as_deref(),
            Some(format!("https://{old_ip}:6443").as_str())
        );
        cluster.server = Some(format!("https://{server_ip}:6443"));
        cluster.tls_server_name = Some(old_ip.clone());
    }
    // JSON is YAML: any kubeconfig reader takes it.
    std::fs::write(&via, serde_json::to_vec(&config).unwrap()).unwrap();
    let client = oxide_controller::adapters::kubeclient::client(Some(&via), Some("demo"))
        .await
        .unwrap();
    let cluster = KubeCluster::new(client.clone(), NAMESPACE);
    let store = KubeStateStore::new(client, NAMESPACE);
    let make_rack = |s: &oxide_controller::base::secrets::ClusterSecrets,
                     spec: &oxide_controller::domain::spec::ClusterSpec| {
        OxideRack::connect(
            &s.oxide_host,
            &s.oxide_token,
            &spec.project,
            RackOptions::default(),
        )
    };
    let outcome = reconcile::run(
        &cluster,
        &store,
        make_rack,
        &ReconcileOptions::new("f3-test"),
    )
    .await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(
        env.names("floating_ips"),
        vec![fip.to_owned()],
        "re-created"
    );

    let out = env.delete("demo", &["--yes", "--delete-project"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(env.names("floating_ips"), Vec::<String>::new(), "{stdout}");
    assert!(project_dump(&env, "demo").is_none(), "{stdout}");
}

/// A rule of the user's: tcp/`port` of the VPC's instances from `sources`.
fn user_rule(
    name: &str,
    description: &str,
    port: u16,
    sources: &str,
) -> oxide_controller::domain::firewall::OwnedRule {
    use oxide_controller::domain::firewall::{api_rule, parse_sources};
    let mut r = api_rule("user", parse_sources(sources).unwrap(), &[]);
    r.targets = oxide_controller::domain::firewall::RuleTargets::Vpc;
    r.name = name.into();
    r.description = description.into();
    r.ports = vec![(port, port)];
    r
}
