//! What the user-data's `runcmd` steps do in the guest: which k3s role the install step
//! selects, the pinned version, the SMBIOS provider-ID drop-in, and `tailscale up` against
//! the simulated tailnet.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

use super::Inner;
use super::cloud_init::UserData;
use super::k3s::Role;

/// The first word of an env assignment's value (`INSTALL_K3S_EXEC='server --foo'` → server).
fn env_value<'a>(cmd: &'a str, var: &str) -> Option<&'a str> {
    let idx = cmd.find(&format!("{var}="))?;
    let rest = &cmd[idx + var.len() + 1..];
    let rest = rest.trim_start_matches(['\'', '"']);
    rest.split(|c: char| c.is_whitespace() || c == '\'' || c == '"')
        .next()
}

pub(super) fn detect_role(commands: &[String]) -> Option<Role> {
    let word_role = |w: &str| match w {
        "server" => Some(Role::Server),
        "agent" => Some(Role::Agent),
        _ => None,
    };
    for cmd in commands {
        if let Some(role) = env_value(cmd, "INSTALL_K3S_EXEC").and_then(word_role) {
            return Some(role);
        }
        if let Some(idx) = cmd.find("sh -s -") {
            let after = cmd[idx + "sh -s -".len()..].split_whitespace().next();
            if let Some(role) = after.and_then(word_role) {
                return Some(role);
            }
        }
        let words: Vec<&str> = cmd.split_whitespace().collect();
        if let Some(pos) = words.iter().position(|w| *w == "systemctl") {
            let rest = &words[pos + 1..];
            if rest
                .iter()
                .any(|w| matches!(*w, "enable" | "start" | "restart"))
            {
                if rest
                    .iter()
                    .any(|w| matches!(*w, "k3s-agent" | "k3s-agent.service"))
                {
                    return Some(Role::Agent);
                }
                if rest.iter().any(|w| matches!(*w, "k3s" | "k3s.service")) {
                    return Some(Role::Server);
                }
            }
        }
        // The install script without INSTALL_K3S_EXEC: agent when K3S_URL is set.
        if cmd.contains("get.k3s.io") || (cmd.contains("install.sh") && !cmd.contains("tailscale"))
        {
            return Some(if cmd.contains("K3S_URL=") {
                Role::Agent
            } else {
                Role::Server
            });
        }
    }
    None
}

pub(super) fn detect_smbios_provider_id(commands: &[String]) -> Option<String> {
    commands.iter().find_map(|cmd| {
        if !cmd.contains("product_uuid") {
            return None;
        }
        let idx = cmd.find("provider-id=")?;
        let rest = &cmd[idx + "provider-id=".len()..];
        let end = rest
            .find(|c: char| matches!(c, '%' | '$' | '"' | '\'' | '\\') || c.is_whitespace())
            .unwrap_or(rest.len());
        Some(rest[..end].to_string())
    })
}

pub(super) fn detect_install_version(commands: &[String]) -> Option<String> {
    commands
        .iter()
        .find_map(|c| env_value(c, "INSTALL_K3S_VERSION"))
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// Directory of scripts cloud-init's `scripts_per_boot` module runs on every boot (in
/// cloud-final, before `scripts_user`).
pub(super) const PER_BOOT_DIR: &str = "/var/lib/cloud/scripts/per-boot/";

/// The logger tag of a per-boot script in the user-data that prints the host key
/// fingerprints between cloud-init's markers (`ssh-keygen -l` piped into `logger -s -t TAG`),
/// if there is one. The simulator cannot run shell: the stub-execution test runs the script
/// for real; here its effect is applied on every boot.
pub(super) fn per_boot_host_key_tag(files: &BTreeMap<String, Vec<u8>>) -> Option<&'static str> {
    files.iter().find_map(|(path, content)| {
        let script = std::str::from_utf8(content).ok()?;
        let runs = path
            .strip_prefix(PER_BOOT_DIR)
            .is_some_and(|f| !f.is_empty() && !f.contains('/'));
        (runs
            && script.contains("ssh-keygen -l")
            && script.contains("-----BEGIN SSH HOST KEY FINGERPRINTS-----")
            && script.contains("logger -s -p user.info -t oxide-controller"))
        .then_some("oxide-controller")
    })
}

impl Inner {
    /// Runs the user-data's `tailscale up` against the simulated tailnet: on success the VM
    /// gets its tailnet address (and listeners there); on failure the console says why, the
    /// way tailscale prints it, and the VM stays off the tailnet.
    pub(super) fn tailscale_up(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        ud: &UserData,
        hostname: &str,
        started: Instant,
    ) {
        let Some(up) = &ud.tailscale else { return };
        let joined = match self.tailnet.get() {
            Some(tailnet) => tailnet.join(id, up, hostname),
            None => Err(crate::tailscale::JoinError::InvalidKey),
        };
        match joined {
            Ok(ip) => {
                {
                    let mut st = self.state();
                    let Some(vm) = st.vms.get_mut(&id).filter(|v| v.generation == generation)
                    else {
                        return;
                    };
                    vm.tailnet_ip = Some(IpAddr::V4(ip));
                    vm.tailnet_san = up.san_drop_in;
                }
                self.log(
                    id,
                    started,
                    &format!("tailscaled[1240]: Switching ipn state Starting -> Running; tailnet address {ip}"),
                );
                self.sync_listeners(id);
            }
            Err(err) => {
                self.log(id, started, &format!("cloud-init[1250]: {err}"));
                tracing::info!(instance = %id, reason = %err, "tailscale up refused");
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn role_comes_from_the_install_step() {
        let cases = [
            (
                "INSTALL_K3S_EXEC=\"agent\" sh /opt/install.sh",
                Some(Role::Agent),
            ),
            (
                "INSTALL_K3S_EXEC=server sh /opt/install.sh",
                Some(Role::Server),
            ),
            (
                "curl -sfL https://get.k3s.io | sh -s - agent",
                Some(Role::Agent),
            ),
            ("systemctl enable --now k3s-agent", Some(Role::Agent)),
            ("systemctl enable --now k3s", Some(Role::Server)),
            ("echo hello", None),
            // Tailscale's installer is not k3s's.
            ("curl -fsSL https://tailscale.com/install.sh | sh", None),
        ];
        for (cmd, role) in cases {
            assert_eq!(detect_role(&[cmd.to_string()]), role, "{cmd}");
        }
    }
}
