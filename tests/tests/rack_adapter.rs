//! `OxideRack`, the product's adapter to the Oxide API, over real HTTP against the simulated
//! rack: pagination, error classification with the API's own messages, the 503 retry of
//! floating-IP attaches, lookups that may miss, and token hygiene.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_controller::base::retry::Backoff;
use oxide_controller::base::size::{ByteSize, GIB};
use oxide_controller::domain::model::{ExternalIpKind, InstanceState, NewDisk, NewInstance};
use oxide_controller::ports::rack::{Rack, RackError, reachable_address};
use oxide_sim::oxide::{RouteFault, Timings};
use oxide_sim::{Sim, SimHandle, SimOptions};
use uuid::Uuid;

const PROJECT: &str = "demo";
/// SSH port of simulated VMs (each simulator has its own loopback /24, so no clashes).
const SSH_PORT: u16 = 2222;
/// Upper bound for any wait on the simulated lifecycle.
const PATIENCE: Duration = Duration::from_secs(15);

fn fast_retry(attempts: u32) -> Backoff {
    Backoff {
        first: Duration::from_millis(20),
        max: Duration::from_millis(100),
        attempts,
    }
}

async fn start_sim(timings: Timings) -> SimHandle {
    Sim::start(SimOptions {
        ssh_port: SSH_PORT,
        timings,
        ..SimOptions::default()
    })
    .await
    .expect("simulator starts")
}

fn rack(sim: &SimHandle, page_size: u32) -> OxideRack {
    OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        PROJECT,
        RackOptions {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            page_size,
            read_retry: fast_retry(3),
        },
    )
    .expect("rack client")
}

/// A started simulator with the project (created through the adapter) and a silo image.
async fn setup(timings: Timings, page_size: u32) -> (SimHandle, OxideRack, Uuid) {
    let sim = start_sim(timings).await;
    let image = sim
        .oxide()
        .seed_silo_image("ubuntu-noble", "ubuntu", "24.04", GIB);
    assert!(!image.is_nil());
    let rack = rack(&sim, page_size);
    rack.ensure_project().await.expect("project created");
    (sim, rack, image)
}

fn new_instance(name: &str, image: Uuid) -> NewInstance {
    NewInstance {
        name: name.to_owned(),
        description: "oxide-controller test".to_owned(),
        hostname: name.to_owned(),
        ncpus: 2,
        memory: ByteSize::gib(4),
        boot_disk: NewDisk {
            name: format!("boot-{name}"),
            size: ByteSize::gib(10),
            image: Some(image),
        },
        data_disk: None,
        restore_disk: None,
        user_data: b"#cloud-config\n{}\n".to_vec(),
        ephemeral_ip: false,
        ip_pool: None,
        anti_affinity_group: None,
        rack_restarts: false,
    }
}

async fn wait_for_state(rack: &OxideRack, name: &str, want: InstanceState) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let inst = rack
            .get_instance(name)
            .await
            .unwrap()
            .expect("instance exists");
        if inst.state == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} stuck in {:?}, wanted {want:?}",
            inst.state
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn listings_read_every_page_and_filter_by_prefix() {
    let (sim, rack, image) = setup(Timings::default(), 10).await;
    for i in 0..25 {
        rack.create_instance(&new_instance(&format!("demo-workers-{i:02}"), image))
            .await
            .unwrap();
    }
    for i in 0..3 {
        rack.create_instance(&new_instance(&format!("demo-servers-{i}"), image))
            .await
            .unwrap();
    }
    sim.oxide().reset_counters();

    let workers = rack.list_instances("demo-workers-").await.unwrap();
    let names: Vec<String> = workers.iter().map(|i| i.name.clone()).collect();
    let expected: Vec<String> = (0..25).map(|i| format!("demo-workers-{i:02}")).collect();
    assert_eq!(names, expected);
    assert!(
        workers
            .iter()
            .all(|i| i.ncpus == 2 && i.memory == ByteSize::gib(4))
    );
    // 28 instances at 10 a page: at least 3 requests (the adapter may not stop early).
    let pages = sim.oxide().counters()["GET /v1/instances"];
    assert!(pages >= 3, "only {pages} page requests");

    assert_eq!(rack.list_instances("").await.unwrap().len(), 28);
    let disks = rack.list_disks().await.unwrap();
    assert_eq!(disks.len(), 28, "one boot disk per instance");
    assert!(disks.iter().all(|d| d.size == ByteSize::gib(10)));
}

#[tokio::test]
async fn deleting_a_running_instance_is_refused_with_the_api_message() {
    let (_sim, rack, image) = setup(Timings::default(), 100).await;
    rack.create_instance(&new_instance("demo-workers-del01", image))
        .await
        .unwrap();
    wait_for_state(&rack, "demo-workers-del01", InstanceState::Running).await;

    let err = rack
        .delete_instance("demo-workers-del01")
        .await
        .expect_err("running");
    match &err {
        RackError::Invalid { what, message } => {
            assert_eq!(what, "instance demo-workers-del01");
            assert_eq!(
                message,
                "cannot delete instance: instance is running or has not yet fully stopped"
            );
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(!err.is_retryable());

    rack.stop_instance("demo-workers-del01").await.unwrap();
    wait_for_state(&rack, "demo-workers-del01", InstanceState::Stopped).await;
    rack.delete_instance("demo-workers-del01").await.unwrap();
    assert_eq!(rack.get_instance("demo-workers-del01").await.unwrap(), None);
    assert!(matches!(
        rack.delete_instance("demo-workers-del01").await,
        Err(RackError::NotFound { what }) if what == "instance demo-workers-del01"
    ));
    // The boot disk stays behind, detached, and can then be deleted.
    rack.delete_disk("boot-demo-workers-del01").await.unwrap();
    assert!(rack.list_disks().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_uppercase_name_is_refused_by_the_rack() {
    let (_sim, rack, image) = setup(Timings::default(), 100).await;
    // The SDK's own pattern lets uppercase through after the first letter; the rack does not.
    let mut new = new_instance("demo-Workers-1", image);
    new.boot_disk.name = "boot-demo-workers-1".to_owned();
    let err = rack.create_instance(&new).await.expect_err("uppercase");
    assert!(
        matches!(&err, RackError::Invalid { what, .. } if what == "instance demo-Workers-1"),
        "{err:?}"
    );
    assert!(rack.list_instances("").await.unwrap().is_empty());
    assert!(rack.list_disks().await.unwrap().is_empty());
}

#[tokio::test]
async fn taken_names_come_back_as_already_exists() {
    let (_sim, rack, image) = setup(Timings::default(), 100).await;
    let new = new_instance("demo-workers-dup01", image);
    let first = rack.create_instance(&new).await.unwrap();
    assert_eq!(first.name, "demo-workers-dup01");
    assert!(matches!(
        first.state,
        InstanceState::Starting | InstanceState::Creating
    ));
    assert!(matches!(
        rack.create_instance(&new).await,
        Err(RackError::AlreadyExists { what }) if what == "instance demo-workers-dup01"
    ));

    rack.create_floating_ip("demo-apiserver", "API", None)
        .await
        .unwrap();
    assert!(matches!(
        rack.create_floating_ip("demo-apiserver", "API", None).await,
        Err(RackError::AlreadyExists { what }) if what == "floating IP demo-apiserver"
    ));

    // The ensure_* calls adopt what exists.
    rack.ensure_project().await.unwrap();
    rack.ensure_anti_affinity_group("demo-workers")
        .await
        .unwrap();
    rack.ensure_anti_affinity_group("demo-workers")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_full_create_places_disks_ips_and_group_as_asked() {
    let (_sim, rack, image) = setup(Timings::default(), 100).await;
    rack.ensure_anti_affinity_group("demo-workers")
        .await
        .unwrap();
    let mut new = new_instance("demo-workers-full1", image);
    new.data_disk = Some(NewDisk {
        name: "data-demo-workers-full1".to_owned(),
        size: ByteSize::gib(20),
        image: None,
    });
    new.ephemeral_ip = true;
    new.ip_pool = Some("default".to_owned());
    new.anti_affinity_group = Some("demo-workers".to_owned());
    let inst = rack.create_instance(&new).await.unwrap();
    assert_eq!(inst.hostname, "demo-workers-full1");

    let disks = rack.list_disks().await.unwrap();
    let mut names: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["boot-demo-workers-full1", "data-demo-workers-full1"]
    );

    let ips = rack
        .instance_external_ips("demo-workers-full1")
        .await
        .unwrap();
    let kinds: Vec<ExternalIpKind> = ips.iter().map(|i| i.kind).collect();
    assert!(kinds.contains(&ExternalIpKind::Ephemeral), "{ips:?}");
    let reachable = reachable_address(&ips).expect("an ephemeral address");
    assert!(
        ips.iter()
            .any(|i| i.ip == reachable && i.kind == ExternalIpKind::Ephemeral),
        "{ips:?}"
    );
}

#[tokio::test]
async fn a_floating_ip_attach_during_starting_is_retried_until_it_succeeds() {
    let timings = Timings {
        starting_to_running: Duration::from_millis(700),
        ..Timings::default()
    };
    let (_sim, rack, image) = setup(timings, 100).await;
    let fip = rack
        .create_floating_ip("demo-apiserver", "API", None)
        .await
        .unwrap();
    assert_eq!(fip.instance_id, None);
    let inst = rack
        .create_instance(&new_instance("demo-servers-fip01", image))
        .await
        .unwrap();
    assert_eq!(inst.state, InstanceState::Starting);

    // One try lands in `starting`: the rack's 503, surfaced for the caller to retry.
    let once = rack
        .attach_floating_ip("demo-apiserver", "demo-servers-fip01")
        .await;
    assert!(
        matches!(&once, Err(RackError::Unavailable { what, status: 503, .. }) if what == "floating IP demo-apiserver"),
        "{once:?}"
    );

    rack.attach_floating_ip_retrying("demo-apiserver", "demo-servers-fip01", fast_retry(100))
        .await
        .unwrap();
    let attached = rack
        .get_floating_ip("demo-apiserver")
        .await
        .unwrap()
        .expect("exists");
    assert_eq!(attached.instance_id, Some(inst.id));
    assert_eq!(attached.ip, fip.ip);

    let ips = rack
        .instance_external_ips("demo-servers-fip01")
        .await
        .unwrap();
    assert!(
        ips.iter()
            .any(|i| i.kind == ExternalIpKind::Floating && i.ip == fip.ip),
        "{ips:?}"
    );
    assert_eq!(reachable_address(&ips), Some(fip.ip));
    // SNAT is listed as its own kind and never chosen as the address to connect to.
    assert!(
        ips.iter()
            .filter(|i| i.kind == ExternalIpKind::Snat)
            .all(|i| i.ip != fip.ip)
    );
    assert_eq!(rack.list_floating_ips().await.unwrap(), vec![attached]);

    // Attaching again to the same instance is idempotent; detaching frees it.
    rack.attach_floating_ip("demo-apiserver", "demo-servers-fip01")
        .await
        .unwrap();
    rack.detach_floating_ip("demo-apiserver").await.unwrap();
    let detached = rack
        .get_floating_ip("demo-apiserver")
        .await
        .unwrap()
        .expect("exists");
    assert_eq!(detached.instance_id, None);
}

#[tokio::test]
async fn lookups_of_missing_objects_are_none() {
    let (sim, rack, silo_image) = setup(Timings::default(), 100).await;
    assert_eq!(rack.get_instance("demo-workers-nope").await.unwrap(), None);
    assert_eq!(rack.get_floating_ip("demo-nope").await.unwrap(), None);
    assert_eq!(rack.find_image("no-such-image").await.unwrap(), None);
    // The project's default subnet is nexus's /22; a project that does not exist has none.
    assert_eq!(rack.default_subnet_prefix().await.unwrap(), Some(22));
    let elsewhere = OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        "no-such-project",
        RackOptions::default(),
    )
    .unwrap();
    assert_eq!(elsewhere.default_subnet_prefix().await.unwrap(), None);

    let found = rack
        .find_image("ubuntu-noble")
        .await
        .unwrap()
        .expect("silo image");
    assert_eq!(found.id, silo_image);
    assert!(found.silo_scoped);
    assert_eq!(found.size, ByteSize(GIB));

    // A project image of the same name wins over the silo's.
    let project_image = sim
        .oxide()
        .seed_project_image(PROJECT, "ubuntu-noble", 2 * GIB);
    let found = rack
        .find_image("ubuntu-noble")
        .await
        .unwrap()
        .expect("project image");
    assert_eq!(found.id, project_image);
    assert!(!found.silo_scoped);
}

#[tokio::test]
async fn reads_ride_out_transient_503s_but_mutations_do_not() {
    let (sim, rack, image) = setup(Timings::default(), 100).await;
    rack.create_instance(&new_instance("demo-workers-r1", image))
        .await
        .unwrap();
    let faults = sim.faults().clone();
    let always_503 = RouteFault {
        error_rate: 1.0,
        error_status: 503,
        ..RouteFault::default()
    };
    faults.update(|f| {
        f.routes.insert(
            "GET /v1/instances/{instance}".to_owned(),
            always_503.clone(),
        );
        f.routes.insert(
            "POST /v1/instances/{instance}/stop".to_owned(),
            always_503.clone(),
        );
    });

    // The default rack gives up after 3 attempts...
    let err = rack
        .get_instance("demo-workers-r1")
        .await
        .expect_err("503s");
    assert!(
        matches!(err, RackError::Unavailable { status: 503, .. }),
        "{err:?}"
    );

    // ...a patient one outlasts a fault that clears.
    let patient = OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        PROJECT,
        RackOptions {
            read_retry: fast_retry(100),
            ..RackOptions::default()
        },
    )
    .unwrap();
    let clear = {
        let faults = faults.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            faults.update(|f| {
                f.routes.remove("GET /v1/instances/{instance}");
            });
        })
    };
    sim.oxide().reset_counters();
    let found = patient.get_instance("demo-workers-r1").await.unwrap();
    assert_eq!(found.map(|i| i.name), Some("demo-workers-r1".to_owned()));
    assert!(sim.oxide().counters()["GET /v1/instances/{instance}"] > 1);
    clear.await.unwrap();

    // A mutation is sent exactly once.
    sim.oxide().reset_counters();
    let err = patient
        .stop_instance("demo-workers-r1")
        .await
        .expect_err("503");
    assert!(err.is_retryable());
    assert_eq!(
        sim.oxide().counters()["POST /v1/instances/{instance}/stop"],
        1
    );
}

#[tokio::test]
async fn the_serial_console_returns_the_recent_bytes() {
    let (sim, rack, image) = setup(Timings::default(), 100).await;
    let inst = rack
        .create_instance(&new_instance("demo-servers-con01", image))
        .await
        .unwrap();
    wait_for_state(&rack, "demo-servers-con01", InstanceState::Running).await;
    let marker = b"-----BEGIN SSH HOST KEY FINGERPRINTS-----\n256 SHA256:abc root@x (ED25519)\n-----END SSH HOST KEY FINGERPRINTS-----\n";
    sim.oxide().append_console(inst.id, marker);
    let console = rack.serial_console("demo-servers-con01").await.unwrap();
    assert!(
        console.ends_with(marker),
        "{:?}",
        String::from_utf8_lossy(&console)
    );
    assert!(matches!(
        rack.serial_console("demo-servers-nope").await,
        Err(RackError::NotFound { what }) if what == "serial console of instance demo-servers-nope"
    ));
}

#[tokio::test]
async fn the_token_never_shows_in_debug_or_errors() {
    let sim = start_sim(Timings::default()).await;
    let rack = rack(&sim, 100);
    let shown = format!("{rack:?}");
    assert!(!shown.contains(&sim.oxide_token), "{shown}");
    assert!(shown.contains(&sim.oxide_host));

    let wrong = "oxide-token-wrong-0123456789";
    let bad = OxideRack::connect(&sim.oxide_host, wrong, PROJECT, RackOptions::default()).unwrap();
    let err = bad.list_instances("").await.expect_err("wrong token");
    assert!(
        matches!(err, RackError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    let text = format!("{err} {err:?} {bad:?}");
    assert!(!text.contains(wrong), "{text}");
}

/// Audit security-2 H2's rest: the user's tokens as the reconcile watches them. Nexus lists
/// the caller's unexpired tokens (id and end, never the bearer value) and answers 401 to an
/// expired one, which the list then leaves out (omicron@14861487
/// `nexus/tests/integration_tests/device_auth.rs`, `test_device_token_expiration`).
#[tokio::test]
async fn the_users_tokens_are_listed_with_their_ends_and_an_expired_one_is_refused() {
    let sim = start_sim(Timings::default()).await;
    let rack = rack(&sim, 1);
    let listed = rack.my_access_tokens().await.unwrap();
    let id = sim.oxide().token_id().to_string();
    assert_eq!(
        listed,
        vec![oxide_controller::domain::oxide_token::AccessToken {
            id: id.clone(),
            expires_at: None
        }]
    );
    let end = chrono::Utc::now() + chrono::Duration::days(20);
    sim.oxide().set_token_expiry(Some(end));
    let listed = rack.my_access_tokens().await.unwrap();
    assert_eq!(
        listed[0].expires_at.map(|e| e.timestamp()),
        Some(end.timestamp())
    );
    assert!(!format!("{listed:?}").contains(&sim.oxide_token));
    sim.oxide()
        .set_token_expiry(Some(chrono::Utc::now() - chrono::Duration::seconds(1)));
    let err = rack.my_access_tokens().await.expect_err("expired");
    assert!(
        matches!(err, RackError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    let err = rack.list_instances("").await.expect_err("expired");
    assert!(matches!(err, RackError::Unauthorized { .. }), "{err:?}");
}

/// Audit oxide-api-2 F7: the rule list is replaced whole with no precondition, so a second
/// writer that read before our write and wrote after it undoes ours. The adapter reads the
/// list again after each write and writes again; it gives up, saying why, only when every
/// attempt is undone.
#[tokio::test]
async fn a_firewall_write_undone_by_another_writer_is_made_again() {
    use oxide_controller::domain::firewall::{RuleChange, api_rule, parse_sources};
    let (sim, rack, _) = setup(Timings::default(), 100).await;
    let rule = api_rule(
        "demo",
        parse_sources("0.0.0.0/0").unwrap(),
        &["demo-servers-1".to_owned()],
    );
    let puts = || {
        sim.oxide()
            .counters()
            .get("PUT /v1/vpc-firewall-rules")
            .copied()
            .unwrap_or(0)
    };
    let names = async || rack.list_firewall_rules().await.unwrap();

    sim.faults().update(|f| f.overwritten_firewall_writes = 1);
    assert_eq!(
        rack.ensure_firewall_rules(std::slice::from_ref(&rule))
            .await
            .unwrap(),
        RuleChange::Created
    );
    assert_eq!(puts(), 2, "written again after the first write was undone");
    assert!(names().await.contains(&rule.name));

    sim.faults().update(|f| f.overwritten_firewall_writes = 1);
    assert!(rack.remove_firewall_rule(&rule.name).await.unwrap());
    assert_eq!(puts(), 4);
    assert!(!names().await.contains(&rule.name));
    assert_eq!(names().await.len(), 3, "the defaults stay");

    sim.faults().update(|f| f.overwritten_firewall_writes = 10);
    let err = rack
        .ensure_firewall_rules(std::slice::from_ref(&rule))
        .await
        .unwrap_err();
    assert!(matches!(err, RackError::Conflict { .. }), "{err:?}");
    assert!(err.to_string().contains("another writer"), "{err}");
    assert_eq!(puts(), 7, "three attempts");
}

/// Audit security-2 N11: two clusters in one project. Each cluster's API rule names its own
/// servers, so cluster `a`'s `--api-allow` (anywhere) does not open tcp/6443 on cluster `b`'s
/// server, whose own rule admits only its network; the rule the reconcile ensures
/// ([`api_rule_servers`]) moves the targets to the servers there are and keeps the sources
/// bootstrap wrote, and never makes a rule that is missing.
#[tokio::test]
async fn one_clusters_api_allow_does_not_open_another_clusters_servers() {
    use oxide_controller::domain::firewall::{
        RuleChange, RuleHosts, api_rule, api_rule_servers, parse_sources,
    };
    use oxide_sim::oxide::Peer;
    let (sim, rack, image) = setup(Timings::default(), 100).await;
    let mut ips = std::collections::BTreeMap::new();
    for name in ["a-servers-one01", "a-servers-two02", "b-servers-one01"] {
        let mut new = new_instance(name, image);
        new.ephemeral_ip = true;
        new.ip_pool = Some("default".to_owned());
        rack.create_instance(&new).await.unwrap();
        let external = rack.instance_external_ips(name).await.unwrap();
        ips.insert(
            name,
            reachable_address(&external).expect("an ephemeral address"),
        );
    }
    let anywhere = parse_sources("0.0.0.0/0").unwrap();
    let narrow = parse_sources("203.0.113.0/24").unwrap();
    rack.ensure_firewall_rules(&[
        api_rule("a", anywhere, &["a-servers-one01".to_owned()]),
        api_rule("b", narrow.clone(), &["b-servers-one01".to_owned()]),
    ])
    .await
    .unwrap();
    let laptop = Peer::Host("198.51.100.9".parse().unwrap());
    let api = |name: &str| std::net::SocketAddr::new(ips[name], 6443);
    let oxide = sim.oxide();
    assert_eq!(
        oxide.tcp_admitted(laptop, api("a-servers-one01")),
        Some(true)
    );
    assert_eq!(
        oxide.tcp_admitted(laptop, api("b-servers-one01")),
        Some(false),
        "cluster a's rule opened cluster b's server"
    );
    assert_eq!(
        oxide.tcp_admitted(laptop, api("a-servers-two02")),
        Some(false),
        "not yet named"
    );

    // The reconcile's rule: a's second server named, a's sources kept.
    let servers = ["a-servers-one01".to_owned(), "a-servers-two02".to_owned()];
    let retargeted = api_rule_servers("a", &servers).unwrap();
    assert_eq!(retargeted.hosts, RuleHosts::Kept);
    assert_eq!(
        rack.ensure_firewall_rules(std::slice::from_ref(&retargeted))
            .await
            .unwrap(),
        RuleChange::Updated
    );
    assert_eq!(
        oxide.tcp_admitted(laptop, api("a-servers-two02")),
        Some(true)
    );
    assert_eq!(
        oxide.tcp_admitted(laptop, api("b-servers-one01")),
        Some(false)
    );
    assert_eq!(
        rack.ensure_firewall_rules(&[retargeted]).await.unwrap(),
        RuleChange::Unchanged,
        "the same servers: nothing written"
    );
    // b's sources survive a retarget too: 203.0.113.0/24 gets in, the laptop does not.
    rack.ensure_firewall_rules(&[api_rule_servers("b", &["b-servers-one01".to_owned()]).unwrap()])
        .await
        .unwrap();
    let inside = Peer::Host("203.0.113.7".parse().unwrap());
    assert_eq!(
        oxide.tcp_admitted(inside, api("b-servers-one01")),
        Some(true)
    );
    assert_eq!(
        oxide.tcp_admitted(laptop, api("b-servers-one01")),
        Some(false)
    );
    // A cluster whose rule is missing gets none from a retarget (it has no sources to keep).
    let before = rack.list_firewall_rules().await.unwrap();
    assert_eq!(
        rack.ensure_firewall_rules(&[
            api_rule_servers("c", &["c-servers-one01".to_owned()]).unwrap()
        ])
        .await
        .unwrap(),
        RuleChange::Unchanged
    );
    assert_eq!(rack.list_firewall_rules().await.unwrap(), before);
    // A rule naming no instance would apply to every one: refused before anything is sent.
    let err = rack
        .ensure_firewall_rules(&[api_rule("d", parse_sources("0.0.0.0/0").unwrap(), &[])])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("every instance"), "{err}");
}
