//! Issue 11 acceptance, host keys: the real `bootstrap` binary against an `oxide-sim` whose
//! console follows propolis (16 KiB unless `max_bytes`, a fresh history per VMM) and whose
//! cloud-init prints the fingerprint block once per instance, after runcmd.
//!
//! - A re-run after the first server was stopped and started (its console no longer holds
//!   the first boot) verifies the server with the pins saved in the resume file; without
//!   saved pins it reads the block our per-boot script printed on the new boot.
//! - A server whose key no longer matches the saved pin is refused, and the message says
//!   what to check.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Env, log_lines};
use oxide_controller::adapters::oxide_rack::OxideRack;
use oxide_controller::domain::model::InstanceState;
use oxide_controller::ports::rack::Rack as _;
use serde_json::Value;

fn resume_file(env: &Env) -> std::path::PathBuf {
    env.state_dir().join("demo.json")
}

fn first_server(env: &Env) -> String {
    let resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(env)).unwrap()).unwrap();
    resume["first-control-plane"].as_str().unwrap().to_owned()
}

/// Stops and starts `name` (a new VMM: an empty console history) and waits until our
/// per-boot script printed the fingerprints again.
async fn restart(env: &Env, name: &str) {
    let rack = env.rack("demo");
    rack.stop_instance(name).await.unwrap();
    wait_state(&rack, name, InstanceState::Stopped).await;
    rack.start_instance(name).await.unwrap();
    wait_state(&rack, name, InstanceState::Running).await;
    for _ in 0..200 {
        let console =
            String::from_utf8_lossy(&rack.serial_console(name).await.unwrap()).into_owned();
        if console.contains("oxide-controller: -----END SSH HOST KEY FINGERPRINTS-----") {
            assert!(
                !console.contains("cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----"),
                "cloud-init prints its block once per instance, not on a restart"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never printed its host keys after the restart");
}

async fn wait_state(rack: &OxideRack, name: &str, state: InstanceState) {
    for _ in 0..400 {
        if rack
            .get_instance(name)
            .await
            .unwrap()
            .is_some_and(|i| i.state == state)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{name} never reached {state:?}");
}

fn pinned_before(stderr: &[u8]) -> Option<bool> {
    log_lines(stderr)
        .iter()
        .find(|l| l["step"] == "host-key" && l["message"] == "host keys pinned")
        .and_then(|l| l["pinned_before"].as_bool())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rerun_after_the_first_server_restarted_verifies_its_host_key() {
    let env = common::env().await;
    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        pinned_before(&out.stderr),
        Some(false),
        "read from the console"
    );
    let first = first_server(&env);
    let resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    assert!(
        resume["host-key-pins"][&first][0]
            .as_str()
            .unwrap()
            .starts_with("SHA256:"),
        "{resume}"
    );
    // The Secret keeps the same pins (for runs from another machine and the dev-image copy).
    let secret = env
        .sim
        .kube()
        .get("v1", "Secret", Some("kube-system"), "oxide-controller")
        .await
        .unwrap();
    let stored: k8s_openapi::ByteString =
        serde_json::from_value(secret["data"]["host-key-pins"].clone()).unwrap();
    let stored: Value = serde_json::from_slice(&stored.0).unwrap();
    assert_eq!(stored[&first], resume["host-key-pins"][&first], "{stored}");

    restart(&env, &first).await;
    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pinned_before(&out.stderr), Some(true), "the saved pins");

    // Without saved pins, the block the per-boot script printed on the new boot serves.
    let mut resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    resume.as_object_mut().unwrap().remove("host-key-pins");
    std::fs::write(resume_file(&env), resume.to_string()).unwrap();
    restart(&env, &first).await;
    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pinned_before(&out.stderr), Some(false));
}

/// From the second boot on cloud-final's per-boot scripts wait for multi-user.target, so for
/// k3s to be Ready (guest audit 2, G4): a restarted server whose k3s never comes up shows its
/// keys only because the product's `bootcmd` runs the per-boot script in the init stage.
/// The fingerprints on its new console are the ones bootstrap pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_server_whose_k3s_never_starts_still_shows_its_host_keys() {
    let env = common::env().await;
    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = first_server(&env);
    let resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    let pinned: Vec<String> =
        serde_json::from_value(resume["host-key-pins"][&first].clone()).unwrap();
    env.sim
        .faults()
        .update(|f| f.never_join = vec![first.clone()]);
    // `restart` waits for our block on the new console: k3s is still hanging.
    restart(&env, &first).await;
    let rack = env.rack("demo");
    let console = String::from_utf8_lossy(&rack.serial_console(&first).await.unwrap()).into_owned();
    assert!(
        !console.contains("finished at"),
        "cloud-final waits for k3s: {console}"
    );
    assert!(!console.contains("k3s is up and running"), "{console}");
    let pins = oxide_controller::adapters::ssh::HostKeyPins::from_console(&console).unwrap();
    assert_eq!(
        pins.fingerprints().collect::<Vec<_>>(),
        pinned,
        "the keys bootstrap pinned"
    );
}

/// Guest audit 2, G10: the console is read from its tail (256 KiB). After more output than
/// that, the first boot's block is only in the start of the history, which propolis keeps
/// (its first MiB); a re-run without saved pins reads it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pins_are_read_from_the_start_of_a_long_console_history() {
    let env = common::env().await;
    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = first_server(&env);
    let mut resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    let pinned = resume["host-key-pins"][&first].clone();
    resume.as_object_mut().unwrap().remove("host-key-pins");
    std::fs::write(resume_file(&env), resume.to_string()).unwrap();
    // 400 KiB of kernel chatter after the block.
    let dump = env.dump();
    let id: uuid::Uuid = dump["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == first.as_str())
        .and_then(|i| i["id"].as_str())
        .unwrap()
        .parse()
        .unwrap();
    let line =
        "[  812.000000] audit: type=1400 apparmor=\"DENIED\" operation=\"open\" profile=\"snap\"\n";
    let noise = line.repeat(400 * 1024 / line.len() + 1);
    env.sim.oxide().append_console(id, noise.as_bytes());
    let rack = env.rack("demo");
    let tail = String::from_utf8_lossy(&rack.serial_console(&first).await.unwrap()).into_owned();
    assert!(!tail.contains("SSH HOST KEY"), "the tail no longer has it");

    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pinned_before(&out.stderr), Some(false));
    let resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    assert_eq!(resume["host-key-pins"][&first], pinned);
}

/// Audit L3: when the tail holds a block printed long after the first boot, the first
/// boot's block in the start of the history still wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_printed_later_in_the_tail_does_not_beat_the_first_boots_in_the_head() {
    let env = common::env().await;
    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = first_server(&env);
    let mut resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    let pinned = resume["host-key-pins"][&first].clone();
    resume.as_object_mut().unwrap().remove("host-key-pins");
    std::fs::write(resume_file(&env), resume.to_string()).unwrap();
    // 400 KiB of kernel chatter after the block.
    let dump = env.dump();
    let id: uuid::Uuid = dump["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == first.as_str())
        .and_then(|i| i["id"].as_str())
        .unwrap()
        .parse()
        .unwrap();
    let line =
        "[  812.000000] audit: type=1400 apparmor=\"DENIED\" operation=\"open\" profile=\"snap\"\n";
    let noise = line.repeat(400 * 1024 / line.len() + 1);
    env.sim.oxide().append_console(id, noise.as_bytes());
    // Then a block in the trusted format with another key, as a privileged pod could write
    // it to /dev/console.
    let forged = "<14>Nov  2 21:00:00 oxide-controller: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n\
         <14>Nov  2 21:00:00 oxide-controller: 256 SHA256:PiPoFgA5WUoziU9lZOGxNIu9egCI1CxKy3PurtWcAJ0 root@x (ED25519)\n\
         <14>Nov  2 21:00:00 oxide-controller: -----END SSH HOST KEY FINGERPRINTS-----\n";
    env.sim.oxide().append_console(id, forged.as_bytes());
    let rack = env.rack("demo");
    let tail = String::from_utf8_lossy(&rack.serial_console(&first).await.unwrap()).into_owned();
    assert_eq!(
        tail.matches("BEGIN SSH HOST KEY FINGERPRINTS").count(),
        1,
        "only the forged block"
    );

    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pinned_before(&out.stderr), Some(false));
    let resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    assert_eq!(resume["host-key-pins"][&first], pinned);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_key_that_changed_since_it_was_pinned_is_refused_with_what_to_check() {
    let env = common::env().await;
    let out = env.run(&["--workers", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = first_server(&env);
    restart(&env, &first).await;
    // The pin no longer matches what the server presents (as if it had been rebuilt, or
    // someone else answered at its address).
    let other = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU";
    let mut resume: Value =
        serde_json::from_str(&std::fs::read_to_string(resume_file(&env)).unwrap()).unwrap();
    resume["host-key-pins"][&first] = serde_json::json!([other]);
    std::fs::write(resume_file(&env), resume.to_string()).unwrap();

    let out = env.run(&["--workers", "0"]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    for needle in [
        "refusing to connect",
        other,
        "serial console",
        "host-key-pins",
        &first,
    ] {
        assert!(last.contains(needle), "{needle:?} missing from: {last}");
    }
}

/// Members reconcile adds join with the full token form, whose CA hash bootstrap took from
/// the kubeconfig; the simulated k3s refuses a hash that is not its CA's, so a Ready worker
/// shows the hash is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_added_after_bootstrap_join_with_the_cluster_ca_hash() {
    let env = common::env().await;
    let out = env.run(&["--workers", "1"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = oxide_sim::guest::ca_hash(&env.sim.kube().ca_pem().unwrap());
    let first = first_server(&env);
    let dump = env.dump();
    let mut seen = 0;
    for i in dump["instances"].as_array().unwrap() {
        let name = i["name"].as_str().unwrap();
        let running = env
            .sim
            .oxide()
            .running_instance(i["id"].as_str().unwrap().parse().unwrap())
            .unwrap();
        let ud = oxide_sim::guest::parse_user_data(&running.user_data).unwrap();
        let token = ud.k3s.unwrap().token.unwrap();
        if name == first {
            assert!(
                !token.starts_with("K10"),
                "the first server has no CA to pin yet"
            );
        } else {
            assert!(token.starts_with(&format!("K10{hash}::")), "{name}");
            seen += 1;
        }
    }
    assert!(seen >= 1, "at least the worker joined after bootstrap");
    assert!(!env.ready_nodes("demo-").await.is_empty());
}
