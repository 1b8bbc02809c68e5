//! The simulated serial console as propolis serves it and cloud-init writes it: 16 KiB per
//! read unless `max_bytes` says otherwise, read forward from the offset; well over 64 KiB of
//! kernel and systemd output before cloud-init's block; the block printed once per instance,
//! after runcmd, through `logger` (`<14>Mon DD HH:MM:SS cloud-init: `); an empty history on
//! a new VMM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use oxide::prelude::*;
use sim_support::*;

const TOKEN: &str = "server-secret-0123456789";
const END: &str = "-----END SSH HOST KEY FINGERPRINTS-----";

async fn read(c: &oxide::Client, name: &str, most_recent: u64, max: Option<u64>) -> String {
    let req = c
        .instance_serial_console()
        .project(PROJECT)
        .instance(name)
        .most_recent(most_recent);
    let req = match max {
        Some(m) => req.max_bytes(m),
        None => req,
    };
    String::from_utf8_lossy(&req.send().await.unwrap().into_inner().data).into_owned()
}

#[tokio::test]
async fn the_fingerprint_block_comes_late_and_a_read_without_max_bytes_misses_it() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    let whole = wait_console(&c, "c1-cp-aaaaa", END).await;

    // More than 64 KiB of boot output comes before cloud-init's block, which follows the
    // k3s install step (runcmd) and carries the logger prefix on every line.
    let begin = whole
        .find("-----BEGIN SSH HOST KEY FINGERPRINTS-----")
        .unwrap();
    assert!(begin > 64 * 1024, "block at byte {begin}");
    assert!(whole[..begin].contains("k3s is up and running"));
    let fp_line = whole[begin..].lines().nth(1).unwrap();
    let (prefix, rest) = fp_line.split_once(" cloud-init: ").unwrap();
    assert!(prefix.starts_with("<14>"), "{fp_line}");
    assert_eq!(prefix.len(), "<14>Nov 22 20:13:34".len(), "{fp_line}");
    assert!(
        rest.starts_with("256 SHA256:") && rest.ends_with("(ED25519)"),
        "{fp_line}"
    );
    assert_eq!(whole.matches(END).count(), 1, "printed once");

    // What the product used to ask for: propolis returns 16 KiB from 256 KiB back, which
    // here is the start of the boot.
    let default = read(&c, "c1-cp-aaaaa", 256 * 1024, None).await;
    assert_eq!(default.len(), 16 * 1024);
    assert!(!default.contains("SSH HOST KEY"));
    // With max_bytes the tail has it.
    let tail = read(&c, "c1-cp-aaaaa", 32 * 1024, Some(32 * 1024)).await;
    assert!(tail.contains(END));
}

#[tokio::test]
async fn a_restarted_vm_starts_an_empty_history_and_cloud_init_does_not_print_the_keys_again() {
    let sim = start().await;
    let c = client(&sim);
    first_server(&sim, &c, "c1-cp-aaaaa", TOKEN, &[]).await;
    wait_console(&c, "c1-cp-aaaaa", END).await;
    stop_instance(&c, "c1-cp-aaaaa").await;
    // (Its Node cannot be read now: the cluster's only etcd member stopped with it.)
    wait_for("c1-cp-aaaaa stopped", || async {
        let inst = c
            .instance_view()
            .project(PROJECT)
            .instance("c1-cp-aaaaa")
            .send()
            .await
            .unwrap()
            .into_inner();
        (inst.run_state == oxide::types::InstanceState::Stopped).then_some(())
    })
    .await;
    start_instance(&c, "c1-cp-aaaaa").await;
    // k3s comes back from its datastore; the console is that of the new VMM only.
    wait_console(&c, "c1-cp-aaaaa", "k3s is up and running").await;
    wait_node_status(&sim, "c1-cp-aaaaa", "True").await;
    let console = console_after(&c, "c1-cp-aaaaa").await;
    assert_eq!(
        console.matches("running 'init'").count(),
        1,
        "one boot: {console}"
    );
    assert!(console.contains("finished at"), "cloud-final ran");
    assert!(
        !console.contains("SSH HOST KEY"),
        "per instance, not per boot"
    );
}

/// The console once the boot settled.
async fn console_after(c: &oxide::Client, name: &str) -> String {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    console(c, name).await
}
