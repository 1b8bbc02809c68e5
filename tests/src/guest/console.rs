//! The serial console as the guest writes it: kernel-style timestamped lines and k3s's log
//! format. What the Oxide API serves from it is `oxide`'s business; this is only the writer.

use std::time::Instant;

use uuid::Uuid;

use super::Inner;
use crate::guest::sshd::SshHost;

impl Inner {
    pub(super) fn console(&self, id: Uuid, text: &str) {
        if let Some(oxide) = self.oxide.get() {
            oxide.append_console(id, text.as_bytes());
        }
    }

    /// Console line with a kernel-style timestamp since boot.
    pub(super) fn log(&self, id: Uuid, started: Instant, line: &str) {
        let t = started.elapsed();
        self.console(
            id,
            &format!("[{:>5}.{:06}] {line}\n", t.as_secs(), t.subsec_micros()),
        );
    }

    pub(super) fn k3s_log(&self, id: Uuid, started: Instant, level: &str, msg: &str) {
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ");
        self.log(
            id,
            started,
            &format!("k3s[1402]: time=\"{now}\" level={level} msg=\"{msg}\""),
        );
    }
}

/// At least this much kernel and systemd output precedes cloud-init's final stage on the
/// console of an Ubuntu cloud image (`console=ttyS0`); a reader that only gets 16 KiB from
/// the start of the history never sees what cloud-init prints at the end.
pub(super) const BOOT_NOISE_BYTES: usize = 72 * 1024;

/// Kernel and systemd lines as an Ubuntu cloud image prints them on ttyS0, repeated with
/// rising timestamps until `BOOT_NOISE_BYTES` are written. The content is filler; only the
/// amount and the shape (no fingerprint markers, no `cloud-init:` syslog lines) matter.
pub(super) fn boot_noise() -> String {
    const KERNEL: [&str; 12] = [
        "Linux version 6.8.0-oxide (buildd@oxide) #1 SMP PREEMPT_DYNAMIC",
        "Command line: BOOT_IMAGE=/vmlinuz root=LABEL=cloudimg-rootfs ro console=ttyS0",
        "BIOS-provided physical RAM map:",
        "ACPI: RSDP 0x00000000000F0000 000024 (v02 OXIDE )",
        "pci 0000:00:04.0: [01de:0000] type 00 class 0x010802 PCIe Endpoint",
        "nvme nvme0: pci function 0000:00:04.0",
        "nvme nvme0: 1/0/0 default/read/poll queues",
        " nvme0n1: p1 p14 p15",
        "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
        "virtio_net virtio1 enp0s8: renamed from eth0",
        "audit: type=1400 audit(1700000000.000:2): apparmor=\"STATUS\" operation=\"profile_load\"",
        "random: crng init done",
    ];
    const SYSTEMD: [&str; 10] = [
        "[  OK  ] Started systemd-journald.service - Journal Service.",
        "[  OK  ] Finished systemd-udev-trigger.service - Coldplug All udev Devices.",
        "[  OK  ] Reached target local-fs.target - Local File Systems.",
        "         Starting systemd-networkd.service - Network Configuration...",
        "[  OK  ] Started systemd-networkd.service - Network Configuration.",
        "[  OK  ] Reached target network-online.target - Network is Online.",
        "[  OK  ] Started ssh.service - OpenBSD Secure Shell server.",
        "[  OK  ] Started snapd.service - Snap Daemon.",
        "[  OK  ] Started unattended-upgrades.service - Unattended Upgrades Shutdown.",
        "[  OK  ] Reached target multi-user.target - Multi-User System.",
    ];
    let mut out = String::with_capacity(BOOT_NOISE_BYTES + 256);
    let mut i: u64 = 0;
    while out.len() < BOOT_NOISE_BYTES {
        let line = if i % 3 == 2 {
            SYSTEMD[(i as usize / 3) % SYSTEMD.len()].to_string()
        } else {
            let t = i * 1_733;
            format!(
                "[{:>5}.{:06}] {}",
                t / 1_000_000,
                t % 1_000_000,
                KERNEL[i as usize % KERNEL.len()]
            )
        };
        out.push_str(&line);
        out.push('\n');
        i += 1;
    }
    out
}

/// One line as util-linux `logger -s -p user.info -t TAG --` writes it to stderr (the way
/// cloud-init's `write-ssh-key-fingerprints` prints): `<14>Mon DD HH:MM:SS TAG: message`.
pub(super) fn syslog_line(tag: &str, message: &str) -> String {
    let now = chrono::Utc::now().format("%b %e %H:%M:%S");
    format!("<14>{now} {tag}: {message}\n")
}

/// The host key block cloud-init's `write-ssh-key-fingerprints` prints (with `tag` as the
/// logger tag): the fingerprint lines through `logger`, then the public keys as plain text.
pub(super) fn fingerprint_block(host: &SshHost, hostname: &str, tag: &str) -> String {
    let rule = "#############################################################";
    let mut out = String::new();
    for line in [
        rule,
        "-----BEGIN SSH HOST KEY FINGERPRINTS-----",
        &format!("256 {} root@{hostname} (ED25519)", host.fingerprint()),
        "-----END SSH HOST KEY FINGERPRINTS-----",
        rule,
    ] {
        out.push_str(&syslog_line(tag, line));
    }
    let key = host
        .public_key()
        .to_openssh()
        .unwrap_or_else(|_| String::from("ssh-ed25519"));
    out.push_str(&format!(
        "-----BEGIN SSH HOST KEY KEYS-----\n{key} root@{hostname}\n-----END SSH HOST KEY KEYS-----\n"
    ));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The block the simulated guest prints is cloud-init's: every fingerprint line through
    /// `logger -s -t cloud-init` (`<14>Mmm dd hh:mm:ss cloud-init: …`), and the product's
    /// parser reads exactly the host's key from it.
    #[test]
    fn the_console_block_is_what_cloud_init_prints() {
        let host = SshHost::generate();
        let block = fingerprint_block(&host, "demo-cp-abcde", "cloud-init");
        let fp = host.fingerprint();
        let logged: Vec<&str> = block
            .lines()
            .filter_map(|l| l.split_once(" cloud-init: ").map(|(_, m)| m))
            .collect();
        assert_eq!(
            logged[1..4],
            [
                "-----BEGIN SSH HOST KEY FINGERPRINTS-----",
                &format!("256 {fp} root@demo-cp-abcde (ED25519)"),
                "-----END SSH HOST KEY FINGERPRINTS-----",
            ]
        );
        assert!(
            block
                .lines()
                .all(|l| !l.contains(" cloud-init: ") || l.starts_with("<14>"))
        );
        let pins = oxide_controller::adapters::ssh::HostKeyPins::from_console(&block).unwrap();
        assert_eq!(pins.fingerprints().collect::<Vec<_>>(), [fp.as_str()]);
        assert!(fp.starts_with("SHA256:") && fp.len() == 7 + 43, "{fp}");
    }
}
