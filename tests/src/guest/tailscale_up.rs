//! A guest's `tailscale up`, run against the simulated tailnet when the user-data asks for it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

use super::Inner;
use super::cloud_init::UserData;
use super::setup_script::UpEnd;

impl Inner {
    /// Runs the user-data's `tailscale up` against the simulated tailnet: on success the VM
    /// gets its tailnet address (and listeners there); on failure the console says why, the
    /// way tailscale prints it, and the VM stays off the tailnet. A join that waits (device
    /// approval, no key) waits out `--timeout` and then fails, or waits for ever without one
    /// (tailscale@de9ec7e `cmd/tailscale/cli/up.go:134,805-830`).
    pub(super) async fn tailscale_up(
        self: &Arc<Self>,
        id: Uuid,
        generation: u64,
        ud: &UserData,
        hostname: &str,
        started: Instant,
    ) -> UpEnd {
        let Some(up) = &ud.tailscale else {
            return UpEnd::Failed("no tailscale up line".into());
        };
        // `|| fail "…"` gives the reason; under `set -e` alone the trap prints the status.
        let failed = || UpEnd::Failed(up.on_fail.clone().unwrap_or_else(|| "exit status 1".into()));
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
                        return UpEnd::Waits;
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
                UpEnd::Joined
            }
            Err(err) if err.waits() => {
                self.log(id, started, &format!("cloud-init[1250]: {err}"));
                tracing::info!(instance = %id, reason = %err, timeout = ?up.timeout, "tailscale up waits");
                let Some(timeout) = up.timeout else {
                    return UpEnd::Waits;
                };
                tokio::time::sleep(timeout).await;
                if !self.current(id, generation) {
                    return UpEnd::Waits;
                }
                self.log(
                    id,
                    started,
                    &format!("cloud-init[1250]: {}", crate::tailscale::UP_TIMEOUT_MESSAGE),
                );
                failed()
            }
            Err(err) => {
                self.log(id, started, &format!("cloud-init[1250]: {err}"));
                tracing::info!(instance = %id, reason = %err, "tailscale up refused");
                failed()
            }
        }
    }
}
