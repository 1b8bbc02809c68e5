//! Crash safety: bootstrap SIGKILLed at every step of its flow (the moment stderr shows the
//! N-th distinct `step`), then run again to the end, leaves one cluster: the first
//! control-plane VM exactly once and the one that created the cluster, every requested member
//! Ready, and no leaked VM, disk, snapshot or floating IP.
//!
//! The runs upload their image from a local file, so the image step (import disk, snapshot)
//! is among the killed points.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{env, sample_image};
use oxide_controller::workflows::bootstrap::STEPS;

/// Where to kill the first run.
enum KillAt {
    /// When stderr shows the n-th distinct step (1-based).
    Step(usize),
    /// When the simulator has served this route this many times.
    Route(&'static str, u64),
}

/// A local image of random-ish data throughout, so the upload takes several 4 MiB writes,
/// and the flags that upload it as `custom-img`.
fn custom_image(env: &common::Env) -> Vec<String> {
    let src = env.dir.path().join("disk.raw");
    let mut image = sample_image(24 * 1024 * 1024 + 300);
    image
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b ^= (i % 251) as u8 | 1);
    std::fs::write(&src, image).unwrap();
    [
        "--image",
        "custom-img",
        "--image-source",
        src.to_str().unwrap(),
        "--workers",
        "2",
        "--upload-parallelism",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn kill_then_rerun(at: KillAt) {
    let env = env().await;
    let extra = custom_image(&env);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    // The killed run and the re-run get the same flags.
    let args = env.args(&extra);
    let what = match at {
        KillAt::Step(step) => {
            let seen = env.run_killed_at_step_with(step, &args).await;
            assert_eq!(
                seen.len(),
                step,
                "killed at step {step} ({}); saw {seen:?}",
                STEPS[step - 1]
            );
            assert_eq!(
                seen.last().map(String::as_str),
                Some(STEPS[step - 1]),
                "steps come in the documented order: {seen:?}"
            );
            format!("step {}", STEPS[step - 1])
        }
        KillAt::Route(route, times) => {
            assert!(
                env.run_killed_after_route(&args, route, times).await,
                "bootstrap finished before {route} x{times}"
            );
            format!("{route} x{times}")
        }
    };

    let stdout = env.run_ok(&extra).await;
    let ctx = format!("killed at {what}\n{stdout}");

    // One cluster with every member Ready, and nothing else.
    let instances = env.names("instances");
    assert_eq!(instances.len(), 5, "{ctx}\n{instances:?}");
    assert_eq!(
        env.ready_nodes("demo-control-plane-").await.len(),
        3,
        "{ctx}"
    );
    assert_eq!(env.ready_nodes("demo-workers-").await.len(), 2, "{ctx}");
    let resume: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.state_dir().join("demo.json")).unwrap())
            .unwrap();
    let first = resume["first-control-plane"].as_str().unwrap();
    assert_eq!(instances.iter().filter(|i| *i == first).count(), 1, "{ctx}");
    let info = env.sim.boot().cluster_info();
    assert_eq!(
        info["creator"], first,
        "the cluster was created once, by the first server: {info}"
    );
    // Disks: exactly a boot disk per instance; no import leftovers, no snapshots.
    let mut disks = env.names("disks");
    disks.sort();
    let mut want: Vec<String> = instances.iter().map(|i| format!("boot-{i}")).collect();
    want.sort();
    assert_eq!(disks, want, "{ctx}");
    assert_eq!(env.names("snapshots"), Vec::<String>::new(), "{ctx}");
    assert_eq!(
        env.names("floating_ips"),
        vec!["demo-apiserver".to_owned()],
        "{ctx}"
    );
    let images = env.names("images");
    assert_eq!(
        images.iter().filter(|i| *i == "custom-img").count(),
        1,
        "{ctx}\n{images:?}"
    );
}

macro_rules! kill_tests {
    ($($name:ident => $step:expr),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                kill_then_rerun($step).await;
            }
        )*
    };
}

kill_tests! {
    killed_at_validate => KillAt::Step(1),
    killed_at_resume => KillAt::Step(2),
    killed_at_project => KillAt::Step(3),
    killed_at_image => KillAt::Step(4),
    killed_at_floating_ip => KillAt::Step(5),
    killed_at_first_control_plane => KillAt::Step(6),
    killed_at_attach_floating_ip => KillAt::Step(7),
    killed_at_wait_api => KillAt::Step(8),
    killed_at_host_key => KillAt::Step(9),
    killed_at_fetch_kubeconfig => KillAt::Step(10),
    killed_at_write_kubeconfig => KillAt::Step(11),
    killed_at_state => KillAt::Step(12),
    killed_at_manifests => KillAt::Step(13),
    killed_at_reconcile => KillAt::Step(14),
    killed_at_summary => KillAt::Step(15),
    // Inside steps, at the rack's side of the wire:
    killed_mid_upload => KillAt::Route("POST /v1/disks/{disk}/bulk-write", 2),
    killed_after_finalize_before_the_image => KillAt::Route("POST /v1/disks/{disk}/finalize", 1),
    killed_after_the_image_before_cleanup => KillAt::Route("POST /v1/images", 1),
    killed_right_after_creating_the_first_vm => KillAt::Route("POST /v1/instances", 1),
    killed_while_reconcile_creates_members => KillAt::Route("POST /v1/instances", 3),
}

#[test]
fn every_step_has_a_kill_test() {
    assert_eq!(STEPS.len(), 15);
}

/// Audit oxide-api-2 F1: a bootstrap SIGKILLed in the middle of its image upload leaves an
/// import disk taking bulk writes, which nexus will not delete; `bootstrap delete --yes` walks
/// it (stop the writes, finalize, delete) and removes every disk, snapshot and image of the
/// cluster and the local files; a second delete finds nothing and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bootstrap_killed_mid_upload_is_removed_whole_by_bootstrap_delete() {
    let env = env().await;
    let extra = custom_image(&env);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    assert!(
        env.run_killed_after_route(&env.args(&extra), "POST /v1/disks/{disk}/bulk-write", 2)
            .await,
        "bootstrap finished before its second bulk write"
    );
    let disks = env.dump()["disks"].clone();
    assert!(
        disks
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["state"] == "importing_from_bulk_writes"),
        "the kill left an import disk taking writes: {disks}"
    );
    for run in ["first", "second"] {
        let out = env.delete("demo", &["--yes"]).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{run} delete: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(env.names("disks"), Vec::<String>::new(), "{run}: {stdout}");
        assert_eq!(
            env.names("snapshots"),
            Vec::<String>::new(),
            "{run}: {stdout}"
        );
        assert_eq!(
            env.names("images"),
            vec![common::IMAGE.to_owned()],
            "{run}: {stdout}"
        );
        assert!(
            !env.state_dir().join("demo.json").exists(),
            "{run}: {stdout}"
        );
        if run == "second" {
            assert!(stdout.contains("already gone"), "{stdout}");
        }
    }
}
