//! Issue 32 item 5 (audit day2 D4): `bootstrap` over a project that still holds members of the
//! cluster — a worker, or the disks of a server whose instance is gone — but no control-plane
//! server refuses to make a new first server (a second, empty datastore under the same name):
//! exit 2, one line naming `bootstrap recover --cluster demo`, and not one mutating request to
//! the rack.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Env, IMAGE, env};
use oxide_controller::adapters::oxide_rack::OxideRack;
use oxide_controller::adapters::resume;
use oxide_controller::base::names::{self, InstanceTag};
use oxide_controller::base::size::ByteSize;
use oxide_controller::domain::model::{InstanceState, NewDisk, NewInstance};
use oxide_controller::ports::rack::Rack as _;

async fn member(rack: &OxideRack, name: &str, pool: &str, image: uuid::Uuid) {
    let description = InstanceTag {
        cluster: "demo".into(),
        pool: pool.into(),
        spec_hash: "0123456789ab".into(),
    }
    .to_string();
    rack.create_instance(&NewInstance {
        name: name.into(),
        description,
        hostname: name.into(),
        ncpus: 1,
        memory: ByteSize::gib(1),
        boot_disk: NewDisk {
            name: names::boot_disk_name(name),
            size: ByteSize::gib(3),
            image: Some(image),
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

/// Stops and deletes instance `name`; its disks stay (detached).
async fn delete_instance(rack: &OxideRack, name: &str) {
    rack.stop_instance(name).await.unwrap();
    for _ in 0..100 {
        let state = rack.get_instance(name).await.unwrap().map(|i| i.state);
        if state == Some(InstanceState::Stopped) {
            rack.delete_instance(name).await.unwrap();
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never stopped");
}

/// Runs bootstrap for `demo` and expects the refusal, with no mutating request.
async fn refused(env: &Env, what: &str) {
    env.sim.oxide().reset_counters();
    let out = env.command(&env.args(&[])).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
    let human: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('{'))
        .collect();
    assert_eq!(human.len(), 1, "{what}: one line for a person: {stderr}");
    for needle in ["bootstrap recover --cluster demo", "datastore"] {
        assert!(human[0].contains(needle), "{what}: {:?}", human[0]);
    }
    assert_eq!(env.mutating_calls(), vec![], "{what}: nothing changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_over_a_clusters_members_without_a_server_refuses_a_second_datastore() {
    let env = env().await;
    // The resume file of the bootstrap that made the cluster.
    let state = resume::ResumeState::generate("demo", "demo", &env.sim.oxide_host, "control-plane")
        .unwrap();
    resume::save(&resume::resume_path(&env.state_dir(), "demo"), &state).unwrap();
    let rack = env.rack("demo");
    rack.ensure_project().await.unwrap();
    let image = rack.find_image(IMAGE).await.unwrap().unwrap().id;
    // A worker of the cluster, and a server that was deleted (its disk is left).
    member(&rack, "demo-workers-aaaaa", "workers", image).await;
    member(&rack, "demo-control-plane-bbbbb", "control-plane", image).await;
    delete_instance(&rack, "demo-control-plane-bbbbb").await;

    refused(&env, "a worker and a server's disk").await;
    // The worker gone too (with its disk): the server's disk alone still holds the cluster.
    delete_instance(&rack, "demo-workers-aaaaa").await;
    rack.delete_disk(&names::boot_disk_name("demo-workers-aaaaa"))
        .await
        .unwrap();
    refused(&env, "a server's disk").await;
    assert!(
        rack.get_instance(&state.first_control_plane)
            .await
            .unwrap()
            .is_none(),
        "no first server was made"
    );
}
