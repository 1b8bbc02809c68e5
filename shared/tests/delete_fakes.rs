//! `bootstrap delete` against the in-memory fakes: exact ownership next to decoys, a dry run
//! that changes nothing and lists exactly what the real run removes, idempotence, and a
//! simulated crash before every single mutating call followed by a re-run, and `run` opening
//! its ports only through the `Connect` it is handed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use oxide_controller::base::names::{self, InstanceTag};
use oxide_controller::base::size::ByteSize;
use oxide_controller::domain::firewall;
use oxide_controller::domain::model::{
    AntiAffinityGroup, Disk, DiskState, FloatingIp, Image, NewDisk, NewInstance, Snapshot,
};
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::fake::{FakeRack, FakeWorld};
use oxide_controller::ports::rack::Rack as _;
use oxide_controller::workflows::delete::{
    self, Confirm, DeleteError, DeleteSummary, InCluster, Kind, LocalFiles, Params, RemoveOptions,
};
use uuid::Uuid;

fn tag(cluster: &str, pool: &str) -> String {
    InstanceTag {
        cluster: cluster.into(),
        pool: pool.into(),
        spec_hash: "abc".into(),
    }
    .to_string()
}

async fn vm(world: &FakeWorld, name: &str, description: &str, data: bool, group: Option<&str>) {
    let new = NewInstance {
        name: name.into(),
        description: description.into(),
        hostname: name.into(),
        ncpus: 2,
        memory: ByteSize::gib(4),
        boot_disk: NewDisk {
            name: names::boot_disk_name(name),
            size: ByteSize::gib(20),
            image: Some(Uuid::nil()),
        },
        data_disk: data.then(|| NewDisk {
            name: names::data_disk_name(name),
            size: ByteSize::gib(10),
            image: None,
        }),
        restore_disk: None,
        user_data: Vec::new(),
        ephemeral_ip: true,
        ip_pool: None,
        anti_affinity_group: group.map(str::to_owned),
        rack_restarts: false,
    };
    world.rack().create_instance(&new).await.unwrap();
    if let Some(g) = group {
        world.with(|s| {
            s.groups
                .entry(g.to_owned())
                .or_insert_with(|| {
                    (
                        AntiAffinityGroup {
                            id: Uuid::new_v4(),
                            name: g.to_owned(),
                            description: names::ANTI_AFFINITY_GROUP_DESCRIPTION.into(),
                        },
                        BTreeSet::new(),
                    )
                })
                .1
                .insert(name.to_owned());
        });
    }
}

fn fip(world: &FakeWorld, name: &str, description: &str, on: Option<&str>) {
    world.with(|s| {
        let instance_id = on.map(|i| s.instances[i].id);
        let n = s.floating_ips.len() as u8;
        s.floating_ips.insert(
            name.to_owned(),
            FloatingIp {
                id: Uuid::new_v4(),
                name: name.to_owned(),
                description: description.to_owned(),
                ip: IpAddr::V4(Ipv4Addr::new(127, 100, 1, n)),
                instance_id,
            },
        );
    });
}

fn disk(world: &FakeWorld, name: &str, description: &str) -> Uuid {
    let id = Uuid::new_v4();
    world.with(|s| {
        s.disks.insert(
            name.to_owned(),
            Disk {
                id,
                name: name.to_owned(),
                description: description.to_owned(),
                state: DiskState::Detached,
                size: ByteSize::gib(1),
                time_created: s.now,
                image_id: None,
            },
        )
    });
    id
}

fn image(world: &FakeWorld, name: &str, description: &str) {
    world.with(|s| {
        s.images.push(Image {
            id: Uuid::new_v4(),
            name: name.to_owned(),
            description: description.to_owned(),
            size: ByteSize::gib(1),
            block_size: 512,
            silo_scoped: false,
        })
    });
}

const CCM: &str = "Managed by oxide-cloud-controller-manager.";

/// Cluster `prod` (3+3, workers in a group, one orphaned disk, an import leftover, an uploaded
/// image, its API address and a CCM address), and decoys of every kind.
async fn world() -> FakeWorld {
    let w = FakeWorld::new(chrono::Utc::now());
    for s in ["aaaaa", "bbbbb", "ccccc"] {
        vm(
            &w,
            &format!("prod-control-plane-{s}"),
            &tag("prod", "control-plane"),
            true,
            None,
        )
        .await;
        vm(
            &w,
            &format!("prod-workers-{s}"),
            &tag("prod", "workers"),
            false,
            Some("prod-workers"),
        )
        .await;
    }
    vm(
        &w,
        "prod-2-workers-xxxxx",
        &tag("prod-2", "workers"),
        false,
        Some("prod-2-workers"),
    )
    .await;
    vm(
        &w,
        "prod-2-control-plane-xxxxx",
        &tag("prod-2", "control-plane"),
        false,
        None,
    )
    .await;
    vm(&w, "prod-db", "my database", true, None).await;
    // A restore drill of prod under way (its own description, no member tag), and one of
    // prod-2's, which stays.
    let drill = oxide_controller::domain::backup::drill::server_description;
    vm(
        &w,
        "prod-drill-control-plane-ddddd",
        &drill("prod", "prod-etcd-20261127t090000z"),
        true,
        None,
    )
    .await;
    vm(
        &w,
        "prod-2-drill-control-plane-eeeee",
        &drill("prod-2", "prod-2-etcd-20261127t090000z"),
        false,
        None,
    )
    .await;
    // A shared group name that prod-2's VM still sits in.
    vm(
        &w,
        "prod-2-workers-yyyyy",
        &tag("prod-2", "workers"),
        false,
        Some("shared"),
    )
    .await;
    vm(
        &w,
        "prod-workers-ddddd",
        &tag("prod", "workers"),
        false,
        Some("shared"),
    )
    .await;
    w.tick(1);
    fip(
        &w,
        "prod-apiserver",
        "oxide-controller cluster=prod Kubernetes API",
        Some("prod-control-plane-aaaaa"),
    );
    fip(
        &w,
        "prod-2-apiserver",
        "oxide-controller cluster=prod-2 Kubernetes API",
        Some("prod-2-control-plane-xxxxx"),
    );
    let drill_address = oxide_controller::domain::backup::drill::address_description;
    fip(
        &w,
        "prod-drill-apiserver",
        &drill_address("prod"),
        Some("prod-drill-control-plane-ddddd"),
    );
    fip(
        &w,
        "prod-2-drill-apiserver",
        &drill_address("prod-2"),
        Some("prod-2-drill-control-plane-eeeee"),
    );
    fip(&w, "prod-web", "the user's own address", None);
    fip(&w, "prod-default-web", CCM, Some("prod-workers-bbbbb"));
    fip(&w, "prod-kube-system-lb", CCM, None);
    fip(&w, "prod-2-default-web", CCM, Some("prod-2-workers-xxxxx"));
    disk(&w, "boot-prod-workers-zzzzz", &tag("prod", "workers"));
    // A volume someone attached by hand to one of prod's workers (audit 2 F5): not prod's.
    let volume = disk(&w, "team-volume", "the team's data");
    w.with(|s| {
        let worker = s.instances["prod-workers-aaaaa"].id;
        if let Some(d) = s.disks.values_mut().find(|d| d.id == volume) {
            d.state = DiskState::Attached(worker);
        }
    });
    disk(&w, "boot-prod-2-workers-zzzzz", &tag("prod-2", "workers"));
    disk(&w, "scratch", "someone's disk");
    let import = disk(
        &w,
        "oxide-controller-import-0011223344",
        "oxide-controller: temporary import of image noble cluster=prod",
    );
    let import2 = disk(
        &w,
        "oxide-controller-import-5566778899",
        "oxide-controller: temporary import of image jammy cluster=prod-2",
    );
    w.with(|s| {
        for (name, disk_id) in [
            ("oxide-controller-import-0011223344", import),
            ("oxide-controller-import-5566778899", import2),
            ("backup", Uuid::new_v4()),
        ] {
            s.snapshots.insert(
                name.to_owned(),
                Snapshot {
                    id: Uuid::new_v4(),
                    name: name.to_owned(),
                    description: String::new(),
                    disk_id,
                },
            );
        }
    });
    image(
        &w,
        "noble",
        &names::uploaded_image_description(Some("prod"), "https://x/noble.raw"),
    );
    image(
        &w,
        "jammy",
        &names::uploaded_image_description(Some("prod-2"), "https://x/jammy.raw"),
    );
    image(&w, "golden", "the user's image");
    w.with(|s| {
        for cluster in ["prod", "prod-2"] {
            s.firewall_rules.push(firewall::api_rule(
                cluster,
                firewall::parse_sources("0.0.0.0/0").unwrap(),
                &[format!("{cluster}-cp-a")],
            ));
            s.firewall_rules.extend(firewall::ssh_rules(
                cluster,
                firewall::parse_sources("198.51.100.7").unwrap(),
            ));
            s.firewall_rules.extend(
                firewall::member_rules(cluster, &[format!("{cluster}-control-plane-aaaaa")])
                    .unwrap(),
            );
        }
        let mut office =
            firewall::api_rule("x", firewall::parse_sources("203.0.113.0/24").unwrap(), &[]);
        office.name = "allow-office".into();
        office.description = "the user's rule".into();
        office.ports = vec![(443, 443)];
        s.firewall_rules.push(office);
    });
    w
}

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::new("prod", "prod", "noble", 3, 3);
    // A group name another cluster uses too: it stays while prod-2's VM is in it.
    s.control_plane.anti_affinity_group = Some("shared".into());
    if let Some(w) = s.worker_pools.first_mut() {
        w.anti_affinity_group = Some("prod-workers".into());
    }
    s
}

/// The cluster's API, in memory: records quiesce in the world's log.
#[derive(Clone)]
struct FakeApi {
    world: FakeWorld,
    spec: Option<ClusterSpec>,
    lbs: Vec<(String, String)>,
}

impl InCluster for FakeApi {
    async fn quiesce(&self, holder: &str, _wait: Duration) -> Result<Vec<String>, String> {
        self.world.with(|s| {
            s.cronjob = false;
            s.log.push(format!("quiesce {holder}"));
        });
        Ok(vec!["suspended".into()])
    }
    async fn spec(&self) -> Result<Option<ClusterSpec>, String> {
        Ok(self.spec.clone())
    }
    async fn load_balancers(&self) -> Result<Vec<(String, String)>, String> {
        Ok(self.lbs.clone())
    }
}

fn params(dry_run: bool) -> Params<'static> {
    Params {
        cluster: "prod",
        project: "prod",
        dry_run,
        confirm: Confirm::Yes,
        delete_images: true,
        delete_backups: false,
        delete_project: false,
        holder: "delete@test",
        tty: false,
    }
}

fn opts() -> RemoveOptions {
    RemoveOptions {
        concurrency: 4,
        poll: Duration::from_millis(2),
        timeout: Duration::from_secs(10),
    }
}

fn local(dir: &tempfile::TempDir) -> LocalFiles {
    LocalFiles {
        kubeconfig: dir.path().join("prod.yaml"),
        resume: dir.path().join("prod.json"),
    }
}

/// Moves instances along (stopping → stopped) while a run waits.
fn clock(world: &FakeWorld) -> tokio::task::JoinHandle<()> {
    let w = world.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(3)).await;
            w.tick(1);
        }
    })
}

async fn run(
    world: &FakeWorld,
    api: Option<&FakeApi>,
    dry: bool,
    dir: &tempfile::TempDir,
) -> Result<DeleteSummary, DeleteError> {
    let rack: FakeRack = world.rack();
    delete::run_with(&rack, api, Some(spec()), &params(dry), &opts(), &local(dir)).await
}

/// Every object of the world as `kind name`.
fn snapshot_of(world: &FakeWorld) -> BTreeSet<String> {
    world.with(|s| {
        let mut out = BTreeSet::new();
        out.extend(s.instances.keys().map(|n| format!("instance {n}")));
        out.extend(s.disks.keys().map(|n| format!("disk {n}")));
        out.extend(s.floating_ips.keys().map(|n| format!("fip {n}")));
        out.extend(s.images.iter().map(|i| format!("image {}", i.name)));
        out.extend(s.snapshots.keys().map(|n| format!("snapshot {n}")));
        out.extend(s.groups.keys().map(|n| format!("group {n}")));
        out.extend(s.firewall_rules.iter().map(|r| format!("rule {}", r.name)));
        out
    })
}

fn decoys() -> BTreeSet<String> {
    [
        "instance prod-2-workers-xxxxx",
        "instance prod-2-control-plane-xxxxx",
        "instance prod-2-workers-yyyyy",
        "instance prod-db",
        "instance prod-2-drill-control-plane-eeeee",
        "disk boot-prod-2-drill-control-plane-eeeee",
        "fip prod-2-drill-apiserver",
        "disk boot-prod-2-workers-xxxxx",
        "disk boot-prod-2-control-plane-xxxxx",
        "disk boot-prod-2-workers-yyyyy",
        "disk boot-prod-db",
        "disk data-prod-db",
        "disk boot-prod-2-workers-zzzzz",
        "disk scratch",
        "disk team-volume",
        "disk oxide-controller-import-5566778899",
        "fip prod-2-apiserver",
        "fip prod-web",
        "fip prod-2-default-web",
        "image jammy",
        "image golden",
        "snapshot oxide-controller-import-5566778899",
        "snapshot backup",
        "group prod-2-workers",
        "group shared",
        "rule prod-2-k8s-api",
        "rule prod-2-ssh",
        "rule prod-2-ssh-deny",
        "rule prod-2-members",
        "rule prod-2-isolate",
        "rule allow-office",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

fn listed(summary: &DeleteSummary) -> BTreeSet<(Kind, String)> {
    summary
        .inventory
        .items
        .iter()
        .map(|i| (i.kind, i.name.clone()))
        .collect()
}

#[tokio::test]
async fn a_dry_run_changes_nothing_and_lists_exactly_what_the_real_run_removes() {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let before = snapshot_of(&w);
    let dry = run(&w, None, true, &dir).await.unwrap();
    assert_eq!(snapshot_of(&w), before);
    assert!(
        w.with(|s| s.log.iter().all(|l| l.starts_with("create "))),
        "{:?}",
        w.with(|s| s.log.clone())
    );
    let text = dry.render();
    assert!(text.contains("Dry run: would delete"), "{text}");
    assert!(
        text.contains("prod-db") && text.contains("no oxide-controller tag"),
        "{text}"
    );

    let tick = clock(&w);
    let real = run(&w, None, false, &dir).await.unwrap();
    tick.abort();
    let removed: BTreeSet<(Kind, String)> = real
        .removed
        .iter()
        .map(|(i, _)| (i.kind, i.name.clone()))
        .collect();
    assert_eq!(listed(&dry), removed);
    assert_eq!(snapshot_of(&w), decoys());
    assert!(listed(&dry).contains(&(Kind::FloatingIp, "prod-kube-system-lb".into())));
    for rule in [
        "prod-k8s-api",
        "prod-ssh",
        "prod-ssh-deny",
        "prod-members",
        "prod-isolate",
    ] {
        assert!(
            listed(&dry).contains(&(Kind::FirewallRule, rule.into())),
            "{rule} is removed with its cluster"
        );
    }
    assert!(listed(&dry).contains(&(Kind::AntiAffinityGroup, "prod-workers".into())));
    assert!(
        dry.inventory
            .kept
            .iter()
            .any(|k| k.name == "shared" && k.why.contains("prod-2-workers-yyyyy"))
    );
    assert!(
        dry.inventory
            .kept
            .iter()
            .any(|k| k.name == "team-volume" && k.why.contains("attached by hand")),
        "{text}"
    );

    let again = run(&w, None, false, &dir).await.unwrap();
    assert!(again.already_gone, "{}", again.render());
    assert!(again.render().contains("already gone"));
}

#[tokio::test]
async fn the_api_is_quiesced_before_the_first_vm_is_touched_and_its_services_name_the_ccm_addresses()
 {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let api = FakeApi {
        world: w.clone(),
        spec: Some(spec()),
        // Only prod-default-web belongs to a Service still in the cluster; the by-name
        // rule covers prod-kube-system-lb anyway (no longer cluster claims it).
        lbs: vec![("default".into(), "web".into())],
    };
    let dry = run(&w, Some(&api), true, &dir).await.unwrap();
    assert!(w.with(|s| !s.log.iter().any(|l| l.starts_with("quiesce"))));
    assert!(
        dry.inventory
            .items
            .iter()
            .any(|i| i.name == "prod-default-web" && i.reason.contains("LoadBalancer"))
    );
    let tick = clock(&w);
    run(&w, Some(&api), false, &dir).await.unwrap();
    tick.abort();
    let log = w.with(|s| s.log.clone());
    let q = log
        .iter()
        .position(|l| l == "quiesce delete@test")
        .expect("quiesced");
    let first_stop = log
        .iter()
        .position(|l| l.starts_with("stop "))
        .expect("stopped");
    assert!(q < first_stop, "{log:?}");
    assert_eq!(snapshot_of(&w), decoys());
}

#[tokio::test]
async fn a_crash_before_any_mutating_call_is_finished_by_the_next_run() {
    // How many mutating calls a clean run makes.
    let clean = world().await;
    let dir = tempfile::tempdir().unwrap();
    let tick = clock(&clean);
    run(&clean, None, false, &dir).await.unwrap();
    tick.abort();
    let calls = clean.with(|s| s.log.iter().filter(|l| !l.starts_with("create ")).count());
    assert!(calls > 20, "{calls}");
    let end = snapshot_of(&clean);
    for n in 0..calls {
        let w = world().await;
        let dir = tempfile::tempdir().unwrap();
        let tick = clock(&w);
        w.with(|s| s.mutation_budget = Some(n));
        let first = run(&w, None, false, &dir).await;
        assert!(first.is_err(), "crash after {n} calls went unnoticed");
        w.with(|s| s.mutation_budget = None);
        let second = run(&w, None, false, &dir).await;
        tick.abort();
        assert!(second.is_ok(), "after a crash at call {n}: {second:?}");
        assert_eq!(snapshot_of(&w), end, "crash at call {n}");
    }
}

#[tokio::test]
async fn local_files_go_last_and_only_once_the_rack_is_clean() {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let l = local(&dir);
    std::fs::write(&l.resume, "{}").unwrap();
    let tick = clock(&w);
    w.with(|s| s.mutation_budget = Some(5));
    assert!(run(&w, None, false, &dir).await.is_err());
    assert!(
        l.resume.exists(),
        "a failed run keeps the resume file for the re-run"
    );
    w.with(|s| s.mutation_budget = None);
    let done = run(&w, None, false, &dir).await.unwrap();
    tick.abort();
    assert!(!l.resume.exists());
    assert!(
        done.render().contains("removed resume file"),
        "{}",
        done.render()
    );
}

#[tokio::test]
async fn images_stay_without_the_flag_and_the_project_stays_while_it_holds_anything() {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let rack = w.rack();
    let mut p = params(true);
    p.delete_images = false;
    p.delete_project = true;
    let s = delete::run_with::<_, FakeApi>(&rack, None, Some(spec()), &p, &opts(), &local(&dir))
        .await
        .unwrap();
    assert!(
        !s.inventory
            .items
            .iter()
            .any(|i| i.kind == Kind::Image || i.kind == Kind::Project)
    );
    let text = s.render();
    assert!(text.contains("pass --delete-images"), "{text}");
    let project = s
        .inventory
        .kept
        .iter()
        .find(|k| k.kind == Kind::Project)
        .expect("project kept");
    assert!(project.why.contains("instance prod-db"), "{}", project.why);
    assert!(project.why.contains("image golden"), "{}", project.why);
    assert!(
        project.why.contains("firewall rule allow-office"),
        "{}",
        project.why
    );
    assert!(!project.why.contains("prod-k8s-api"), "{}", project.why);
}

/// Backups (issue 36 §4): a cluster's backups stay unless `--delete-backups` is given, listed
/// with how to restore them; another cluster's (`prod-2`) never go, nor a snapshot whose
/// description only looks alike.
#[tokio::test]
async fn backups_stay_without_the_flag_and_only_the_clusters_own_go_with_it() {
    use chrono::TimeZone as _;
    use oxide_controller::domain::backup::{BackupTag, token_fingerprint};
    let w = world().await;
    let tag = |cluster: &str, hour: u32| {
        BackupTag {
            cluster: cluster.into(),
            k3s_version: "v1.34.1+k3s1".into(),
            time: chrono::Utc
                .with_ymd_and_hms(2026, 11, 27, hour, 0, 0)
                .unwrap(),
            sha256: "0".repeat(64),
            token: token_fingerprint("t"),
            bytes: 1,
            objects: None,
            image: None,
        }
        .description()
    };
    w.with(|s| {
        for (name, description) in [
            ("prod-etcd-20261127-010000", tag("prod", 1)),
            ("prod-etcd-20261127-020000", tag("prod", 2)),
            ("prod-2-etcd-20261127-010000", tag("prod-2", 1)),
            (
                "prod-lookalike",
                "oxide-controller backup of prod, by hand".to_owned(),
            ),
        ] {
            s.snapshots.insert(
                name.to_owned(),
                Snapshot {
                    id: Uuid::new_v4(),
                    name: name.to_owned(),
                    description,
                    disk_id: Uuid::new_v4(),
                },
            );
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let rack = w.rack();
    let clock = clock(&w);
    let s = run(&w, None, false, &dir).await.unwrap();
    let kept: Vec<&str> = s
        .inventory
        .kept
        .iter()
        .filter(|k| k.kind == Kind::Snapshot)
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(
        kept,
        ["prod-etcd-20261127-020000", "prod-etcd-20261127-010000"]
    );
    assert!(s.render().contains("--delete-backups"), "{}", s.render());
    let left = snapshot_of(&w);
    for name in [
        "prod-etcd-20261127-010000",
        "prod-etcd-20261127-020000",
        "prod-2-etcd-20261127-010000",
        "prod-lookalike",
    ] {
        assert!(
            left.contains(&format!("snapshot {name}")),
            "{name} went: {left:?}"
        );
    }

    let mut p = params(false);
    p.delete_backups = true;
    let s = delete::run_with::<_, FakeApi>(&rack, None, Some(spec()), &p, &opts(), &local(&dir))
        .await
        .unwrap();
    let gone: BTreeSet<String> = s
        .inventory
        .of_kind(Kind::Snapshot)
        .map(|i| i.name.clone())
        .collect();
    assert!(
        gone.contains("prod-etcd-20261127-010000") && gone.contains("prod-etcd-20261127-020000"),
        "{gone:?}"
    );
    let left = snapshot_of(&w);
    assert!(
        !left.contains("snapshot prod-etcd-20261127-010000"),
        "{left:?}"
    );
    assert!(
        !left.contains("snapshot prod-etcd-20261127-020000"),
        "{left:?}"
    );
    assert!(
        left.contains("snapshot prod-2-etcd-20261127-010000"),
        "{left:?}"
    );
    assert!(left.contains("snapshot prod-lookalike"), "{left:?}");
    clock.abort();
}

/// Audit oxide-api-2 F5: another cluster in the project that named the same image found it
/// and never marked it; its members boot from it. `--delete-images` keeps it, saying why, and
/// still removes an uploaded image nothing else uses.
#[tokio::test]
async fn delete_images_keeps_an_image_another_clusters_disks_were_created_from() {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let noble = w.with(|s| {
        let noble = s.images.iter().find(|i| i.name == "noble").unwrap().id;
        // prod-2's member boots from prod's upload.
        s.disks
            .get_mut("boot-prod-2-workers-zzzzz")
            .unwrap()
            .image_id = Some(noble);
        noble
    });
    let rack = w.rack();
    let mut p = params(true);
    p.delete_images = true;
    let s = delete::run_with::<_, FakeApi>(&rack, None, Some(spec()), &p, &opts(), &local(&dir))
        .await
        .unwrap();
    assert!(
        !s.inventory
            .items
            .iter()
            .any(|i| i.kind == Kind::Image && i.name == "noble"),
        "{:?}",
        s.inventory.items
    );
    let kept = s
        .inventory
        .kept
        .iter()
        .find(|k| k.kind == Kind::Image && k.name == "noble")
        .expect("noble kept");
    assert!(
        kept.why.contains("boot-prod-2-workers-zzzzz"),
        "{}",
        kept.why
    );
    // Once nothing else uses it, the flag removes it (prod's own boot disks go with prod).
    w.with(|s| {
        s.disks
            .get_mut("boot-prod-2-workers-zzzzz")
            .unwrap()
            .image_id = None;
        for d in s.disks.values_mut() {
            if d.name.starts_with("boot-prod-workers") {
                d.image_id = Some(noble);
            }
        }
    });
    let s = delete::run_with::<_, FakeApi>(&rack, None, Some(spec()), &p, &opts(), &local(&dir))
        .await
        .unwrap();
    assert!(
        s.inventory
            .items
            .iter()
            .any(|i| i.kind == Kind::Image && i.name == "noble"),
        "{:?}",
        s.inventory.kept
    );
}

#[test]
fn the_project_goes_only_when_nothing_else_is_in_it() {
    use oxide_controller::workflows::delete::owned::{ObservedProject, Scope, inventory};
    let scope = Scope {
        cluster: "prod".into(),
        delete_project: true,
        ..Scope::default()
    };
    let mut obs = ObservedProject {
        exists: true,
        vpcs: vec!["default".into()],
        firewall_rules: Some(vec!["allow-ssh".into(), "prod-k8s-api".into()]),
        ..ObservedProject::default()
    };
    assert!(
        inventory(&scope, &obs)
            .items
            .iter()
            .any(|i| i.kind == Kind::Project)
    );
    obs.firewall_rules = Some(vec!["allow-office".into()]);
    let inv = inventory(&scope, &obs);
    assert!(inv.items.is_empty());
    assert!(inv.kept[0].why.contains("firewall rule allow-office"));
    obs.firewall_rules = None;
    assert!(
        inventory(&scope, &obs).items.is_empty(),
        "unknown rules keep the project"
    );
    obs.firewall_rules = Some(Vec::new());
    obs.vpcs.push("lab".into());
    assert!(inventory(&scope, &obs).kept[0].why.contains("VPC lab"));
    // Audit oxide-api-2 F2: nexus also refuses a project with an affinity group, and a VPC
    // with a subnet besides `default`.
    obs.vpcs = vec!["default".into()];
    obs.affinity_groups = vec!["db-pair".into()];
    let why = &inventory(&scope, &obs).kept[0].why;
    assert!(why.contains("affinity group db-pair"), "{why}");
    obs.affinity_groups.clear();
    obs.subnets = vec!["default".into(), "lab".into()];
    let why = &inventory(&scope, &obs).kept[0].why;
    assert!(why.contains("subnet lab of VPC default"), "{why}");
    obs.subnets = vec!["default".into()];
    assert!(inventory(&scope, &obs).kept.is_empty());
}

/// An empty project's network as a fresh one has it, and the cluster's API address in it.
fn bare_project() -> FakeWorld {
    let w = FakeWorld::new(chrono::Utc::now());
    fip(
        &w,
        "prod-apiserver",
        &names::api_floating_ip_description("prod"),
        None,
    );
    w
}

#[tokio::test]
async fn an_affinity_group_or_a_second_subnet_keeps_the_project_and_its_network_whole() {
    for (what, add) in [
        (
            "affinity group db-pair",
            (|s: &mut oxide_controller::fake::WorldState| s.affinity_groups.push("db-pair".into()))
                as fn(&mut _),
        ),
        ("subnet lab of VPC default", |s| {
            s.subnets.push("lab".into())
        }),
    ] {
        let w = bare_project();
        w.with(add);
        let dir = tempfile::tempdir().unwrap();
        let mut p = params(false);
        p.delete_project = true;
        let s = delete::run_with::<_, FakeApi>(&w.rack(), None, None, &p, &opts(), &local(&dir))
            .await
            .unwrap();
        let kept = s.inventory.kept.iter().find(|k| k.kind == Kind::Project);
        assert!(
            kept.is_some_and(|k| k.why.contains(what)),
            "{:?}",
            s.inventory
        );
        w.with(|s| {
            assert!(!s.project_deleted);
            assert_eq!(s.vpcs, ["default"], "{what}");
            assert!(s.subnets.iter().any(|n| n == "default"), "{what}");
            assert_eq!(s.log, ["delete-fip prod-apiserver"], "{what}");
        });
    }
}

/// Something made in the project after the inventory (here an affinity group) keeps it: the
/// project step looks again before the rack deletes subnet and VPC, and deletes nothing.
#[tokio::test]
async fn a_project_that_gained_something_since_the_inventory_is_kept_whole() {
    let w = bare_project();
    let dir = tempfile::tempdir().unwrap();
    let mut p = params(true);
    p.delete_project = true;
    let dry = delete::run_with::<_, FakeApi>(&w.rack(), None, None, &p, &opts(), &local(&dir))
        .await
        .unwrap();
    assert!(dry.inventory.of_kind(Kind::Project).next().is_some());
    w.with(|s| s.affinity_groups.push("late".into()));
    let progress = delete::Progress::new(false, dry.inventory.items.len());
    let out = delete::remove_all(&w.rack(), &dry.inventory, &opts(), &progress).await;
    let refused = out
        .iter()
        .find_map(|r| r.as_ref().err().filter(|(i, _)| i.kind == Kind::Project))
        .expect("the project step refused");
    assert!(
        refused.1.to_string().contains("affinity group late"),
        "{}",
        refused.1
    );
    w.with(|s| {
        assert!(!s.project_deleted);
        assert_eq!(s.vpcs, ["default"]);
        assert_eq!(s.subnets, ["default"]);
    });
}

/// A project whose VPC `default` a user (or an interrupted run) already removed is still
/// observed and deleted.
#[tokio::test]
async fn a_project_without_its_default_vpc_is_still_deleted() {
    let w = bare_project();
    w.with(|s| {
        s.subnets.clear();
        s.vpcs.clear();
    });
    let dir = tempfile::tempdir().unwrap();
    let mut p = params(false);
    p.delete_project = true;
    delete::run_with::<_, FakeApi>(&w.rack(), None, None, &p, &opts(), &local(&dir))
        .await
        .unwrap();
    w.with(|s| {
        assert!(s.project_deleted);
        assert_eq!(s.log, ["delete-fip prod-apiserver", "delete-project"]);
    });
}

#[test]
fn ccm_names_follow_the_ccm_and_a_longer_cluster_name_claims_its_addresses() {
    use oxide_controller::workflows::delete::owned::ccm_floating_ip_name;
    assert_eq!(
        ccm_floating_ip_name("prod", "default", "web"),
        "prod-default-web"
    );
    let long = ccm_floating_ip_name(
        "prod",
        "a-very-long-namespace-name",
        "and-a-long-service-name-x-",
    );
    assert!(long.len() <= 63 && !long.ends_with('-'), "{long}");
}

#[test]
fn an_api_address_re_created_by_reconcile_is_the_clusters_to_delete() {
    use oxide_controller::domain::model::FloatingIp;
    use oxide_controller::workflows::delete::owned::{ObservedProject, Scope, inventory};
    let scope = Scope {
        cluster: "prod".into(),
        ..Scope::default()
    };
    let owned_with = |description: &str| {
        let obs = ObservedProject {
            exists: true,
            vpcs: vec!["default".into()],
            firewall_rules: Some(Vec::new()),
            floating_ips: vec![FloatingIp {
                id: Uuid::from_u128(7),
                name: names::api_floating_ip_name("prod"),
                description: description.into(),
                ip: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)),
                instance_id: None,
            }],
            ..ObservedProject::default()
        };
        inventory(&scope, &obs)
            .items
            .iter()
            .any(|i| i.kind == Kind::FloatingIp && i.name == "prod-apiserver")
    };
    // What reconcile's repair writes is what bootstrap writes, and delete owns it.
    assert!(owned_with(&names::api_floating_ip_description("prod")));
    // Addresses an older reconcile re-created are still recognised, not leaked.
    assert!(owned_with(names::LEGACY_RECONCILE_API_FIP_DESCRIPTION));
    assert!(!owned_with(
        "oxide-controller cluster=prod-2 Kubernetes API"
    ));
    assert!(!owned_with("the user's own address"));
}

/// `delete::run` builds nothing itself: it opens the rack and the cluster's API through the
/// `Connect` it is handed, with the credentials it resolved, the project it validated and the
/// kubeconfig it was given.
struct RecordingConnect {
    world: FakeWorld,
    api: FakeApi,
    asked: std::sync::Mutex<Vec<String>>,
}

impl delete::Connect for RecordingConnect {
    type Rack = FakeRack;
    type InCluster = FakeApi;

    fn rack(
        &self,
        host: &str,
        token: &str,
        project: &str,
    ) -> Result<FakeRack, oxide_controller::ports::rack::RackError> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("rack {host} {token} {project}"));
        // As the live connector refuses a host that is not a URL, with no I/O.
        if !host.starts_with("https://") {
            return Err(oxide_controller::ports::rack::RackError::Invalid {
                what: "the Oxide host".into(),
                message: format!("{host} is not an https URL"),
            });
        }
        Ok(self.world.rack())
    }

    async fn in_cluster(
        &self,
        kubeconfig: &std::path::Path,
        cluster: &str,
    ) -> Result<FakeApi, String> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("in-cluster {} {cluster}", kubeconfig.display()));
        Ok(self.api.clone())
    }
}

fn delete_input(dir: &tempfile::TempDir, host: &str) -> delete::DeleteInput {
    use oxide_controller::adapters::credentials::{CredentialFlags, CredentialSources};
    delete::DeleteInput {
        credential_sources: CredentialSources {
            flags: CredentialFlags {
                host: Some(host.into()),
                token: Some("token-for-the-fakes".into()),
                profile: None,
            },
            env_host: None,
            env_token: None,
            env_profile: None,
            config_dir: None,
        },
        cluster: "prod".into(),
        project: None,
        kubeconfig: Some(dir.path().join("prod.yaml")),
        state_dir: Some(dir.path().to_path_buf()),
        home: Some(dir.path().to_path_buf()),
        dry_run: false,
        confirm: Confirm::Yes,
        delete_images: true,
        delete_backups: false,
        delete_project: false,
        concurrency: 4,
        timeout: Duration::from_secs(10),
        holder: "delete@test".into(),
        json_logs: true,
    }
}

#[tokio::test]
async fn run_opens_its_ports_through_the_connect_it_is_handed() {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let connect = RecordingConnect {
        world: w.clone(),
        api: FakeApi {
            world: w.clone(),
            spec: Some(spec()),
            lbs: Vec::new(),
        },
        asked: std::sync::Mutex::new(Vec::new()),
    };
    let tick = clock(&w);
    let summary = delete::run(delete_input(&dir, "https://rack.example"), &connect)
        .await
        .unwrap();
    tick.abort();
    assert!(!summary.removed.is_empty(), "{}", summary.render());
    assert_eq!(snapshot_of(&w), decoys());
    assert!(w.with(|s| s.log.iter().any(|l| l == "quiesce delete@test")));
    assert_eq!(
        *connect.asked.lock().unwrap(),
        [
            "rack https://rack.example token-for-the-fakes prod".to_owned(),
            format!("in-cluster {} prod", dir.path().join("prod.yaml").display()),
        ]
    );
}

#[tokio::test]
async fn a_rack_the_connect_refuses_is_bad_input_and_nothing_is_touched() {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let before = snapshot_of(&w);
    let connect = RecordingConnect {
        world: w.clone(),
        api: FakeApi {
            world: w.clone(),
            spec: Some(spec()),
            lbs: Vec::new(),
        },
        asked: std::sync::Mutex::new(Vec::new()),
    };
    let err = delete::run(delete_input(&dir, "http://rack.example"), &connect)
        .await
        .unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(
        oxide_controller::workflows::error::chain(&err).contains("not an https URL"),
        "{err}"
    );
    assert_eq!(snapshot_of(&w), before);
    assert_eq!(
        connect.asked.lock().unwrap().len(),
        1,
        "no second port opened"
    );
}
