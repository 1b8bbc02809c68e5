//! Bad input exits 2 with one line naming the problem, before any call to the rack.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Env, env, serve_files};

/// Runs with `args`, expects exit 2, no Oxide API request at all, and exactly one line on
/// stderr that is not a JSON log line, containing every `needles` entry.
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
        assert!(
            human[0].contains(needle),
            "{:?} does not mention {needle:?}",
            human[0]
        );
    }
    let calls: u64 = env.sim.oxide().counters().values().sum();
    assert_eq!(
        calls,
        0,
        "no Oxide API call before validation passes: {:?}",
        env.sim.oxide().counters()
    );
    assert_eq!(env.mutating_calls(), vec![]);
    assert!(
        !env.state_dir().join("demo.json").exists(),
        "no resume file either"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_token_file_is_named() {
    let env = env().await;
    let mut args = env.args(&[]);
    let i = args.iter().position(|a| a == "--oxide-token").unwrap();
    args[i + 1] = "file:/nonexistent/token".into();
    refused(&env, args, &["/nonexistent/token", "token"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_profile_is_named_with_the_known_ones() {
    let env = env().await;
    let cfg = env.home().join(".config/oxide");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("credentials.toml"),
        format!(
            "[profile.sim]\nhost = \"{}\"\ntoken = \"{}\"\nuser = \"u\"\n",
            env.sim.oxide_host, env.sim.oxide_token
        ),
    )
    .unwrap();
    let mut args = env.args(&["--oxide-profile", "nope"]);
    // Profile instead of host + token.
    for flag in ["--oxide-host", "--oxide-token"] {
        let i = args.iter().position(|a| a == flag).unwrap();
        args.drain(i..i + 2);
    }
    refused(&env, args, &["\"nope\"", "sim"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_cluster_name_is_named() {
    let env = env().await;
    refused(
        &env,
        env.args(&["--cluster", "Demo_1"]),
        &["--cluster", "Demo_1"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_even_control_plane_count_is_refused() {
    let env = env().await;
    refused(
        &env,
        env.args(&["--control-planes", "2"]),
        &["--control-planes", "odd"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_that_is_not_whole_gib_is_refused() {
    let env = env().await;
    refused(
        &env,
        env.args(&["--worker-memory", "1536MiB"]),
        &["--worker-memory", "whole number of GiB"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_source_that_404s_is_refused() {
    let env = env().await;
    let base = serve_files(vec![]).await;
    let url = format!("{base}/images/missing.raw");
    let digest = "0".repeat(64);
    refused(
        &env,
        env.args(&[
            "--image",
            "custom",
            "--image-source",
            &url,
            "--image-source-sha256",
            &digest,
        ]),
        &["--image-source", "404"],
    )
    .await;
}

/// Issue 34 §7: an installer or image fetched over http:// without a digest could be changed
/// on the way into something every VM runs as root; bootstrap refuses it before any call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_installers_and_images_without_a_digest_and_unknown_installers_are_refused() {
    let env = env().await;
    refused(
        &env,
        env.args(&["--k3s-installer-url", "http://10.0.0.5/k3s/install.sh"]),
        &[
            "--k3s-installer-sha256",
            "k3s.installer_url is http://",
            "give the file's sha256 here, or use https://",
        ],
    )
    .await;
    // A release newer than every installer the controller knows: it names the field to set.
    refused(
        &env,
        env.args(&["--k3s-version", "v1.35.0+k3s1"]),
        &[
            "--k3s-installer-sha256",
            "not for v1.35.0+k3s1",
            "https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh",
        ],
    )
    .await;
    refused(
        &env,
        env.args(&[
            "--k3s-installer-url",
            "http://10.0.0.5/k3s/install.sh",
            "--k3s-installer-sha256",
            "not-a-digest",
        ]),
        &["--k3s-installer-sha256", "64 hex digits"],
    )
    .await;
    // Audit security-2 N12: a pinned k3s binary's digest is 64 hex digits.
    refused(
        &env,
        env.args(&["--k3s-binary-sha256", "not-a-digest"]),
        &[
            "--k3s-binary-sha256",
            "v1.33.4+k3s1: must be a sha256 digest",
        ],
    )
    .await;
    let base = serve_files(vec![("/images/custom.raw", vec![1u8; 4096])]).await;
    let url = format!("{base}/images/custom.raw");
    refused(
        &env,
        env.args(&["--image", "custom", "--image-source", &url]),
        &[
            "--image-source",
            "http://",
            "--image-source-sha256",
            "https://",
        ],
    )
    .await;
    refused(
        &env,
        env.args(&[
            "--image",
            "custom",
            "--image-source",
            &url,
            "--image-source-sha256",
            "abc",
        ]),
        &["--image-source-sha256", "64 hex digits"],
    )
    .await;
}

/// A qcow2 image (what Ubuntu publishes as `*.img`): magic, then anything.
fn qcow2_bytes() -> Vec<u8> {
    let mut bytes = b"QFI\xfb\0\0\0\x03".to_vec();
    bytes.resize(4 << 20, 0);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_image_source_is_refused_with_how_to_convert_it() {
    let env = env().await;
    let path = env.dir.path().join("noble.img");
    std::fs::write(&path, qcow2_bytes()).unwrap();
    let needles = [
        "--image-source",
        "qcow2",
        "qemu-img convert -f qcow2 -O raw",
    ];
    refused(
        &env,
        env.args(&[
            "--image",
            "custom",
            "--image-source",
            path.to_str().unwrap(),
        ]),
        &needles,
    )
    .await;
    let base = serve_files(vec![("/images/noble.img", qcow2_bytes())]).await;
    let url = format!("{base}/images/noble.img");
    let digest = "0".repeat(64);
    refused(
        &env,
        env.args(&[
            "--image",
            "custom",
            "--image-source",
            &url,
            "--image-source-sha256",
            &digest,
        ]),
        &needles,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_file_and_a_bad_schedule_and_a_foreign_kubeconfig_are_refused() {
    let env = env().await;
    refused(
        &env,
        env.args(&["--image-source", "/nonexistent/disk.raw"]),
        &["/nonexistent/disk.raw"],
    )
    .await;
    refused(
        &env,
        env.args(&["--schedule", "every 5 minutes"]),
        &["--schedule"],
    )
    .await;
    refused(
        &env,
        env.args(&["--worker-memory", "lots"]),
        &["--worker-memory"],
    )
    .await;
    std::fs::write(
        env.kubeconfig(),
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
    )
    .unwrap();
    refused(
        &env,
        env.args(&[]),
        &["--kubeconfig-overwrite", "--kubeconfig-merge"],
    )
    .await;
}

/// A floating IP that happens to carry the cluster's API name but is someone else's (audit 2
/// F5) is never adopted: bootstrap exits 2 naming it, before any VM, and leaves it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_elses_address_with_the_api_name_is_not_adopted() {
    use oxide_controller::ports::rack::Rack as _;
    let env = env().await;
    env.sim.oxide().seed_project("demo");
    let rack = env.rack("demo");
    rack.create_floating_ip("demo-apiserver", "the team's address", None)
        .await
        .unwrap();
    let out = env.command(&env.args(&[])).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("demo-apiserver") && stderr.contains("not this cluster's API address"),
        "{stderr}"
    );
    assert!(env.names("instances").is_empty(), "no VM was made");
    let fip = rack
        .get_floating_ip("demo-apiserver")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fip.description, "the team's address");
}
