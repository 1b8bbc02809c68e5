//! A VM's listeners: SSH on server VMs once sshd is up, the Kubernetes API once k3s joined,
//! on every address the VM answers on (ephemeral, floating, tailnet).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::cluster_api::RealCluster;
use super::k3s_config::Role;
use super::{Inner, K3sState, KUBE_API_PORT, State, Vm};
use crate::support::net::{ListenerKind, ListenersGuard};

/// A listener a VM should have: address, kind, and the SANs of its certificate.
type Desired = (SocketAddr, ListenerKind, Vec<String>);

impl Inner {
    /// Brings the VM's listeners in line with its state: SSH on every address of a running
    /// server VM once sshd is up, the Kubernetes API on every address once it joined.
    pub(super) fn sync_listeners(self: &Arc<Self>, id: Uuid) {
        let _rt = self.runtime.enter();
        let mut guard = self.listeners.lock();
        let (desired, api) = self.desired_listeners(id);
        for (addr, kind) in guard.owned_by(id) {
            if !desired.iter().any(|(a, k, _)| *a == addr && *k == kind) {
                guard.close(addr);
            }
        }
        for (addr, kind, sans) in desired {
            if guard.owned_by(id).contains(&(addr, kind)) && guard.is_serving(addr, kind) {
                continue;
            }
            self.open_listener(&mut guard, id, addr, kind, sans, &api);
        }
    }

    /// Closes `id`'s Kubernetes API listeners (k3s restarted with renewed certificates: the
    /// next [`Self::sync_listeners`] opens them with the new ones).
    pub(super) fn close_api_listeners(self: &Arc<Self>, id: Uuid) {
        let _rt = self.runtime.enter();
        let mut guard = self.listeners.lock();
        for (addr, kind) in guard.owned_by(id) {
            if kind == ListenerKind::KubeApi {
                guard.close(addr);
            }
        }
    }

    /// What `id` should listen on, and the API its listeners serve (its cluster's).
    fn desired_listeners(&self, id: Uuid) -> (Vec<Desired>, Option<Arc<RealCluster>>) {
        let st = self.state();
        let api = self.api_of(&st, id);
        if self.closed.load(Ordering::SeqCst) {
            return (Vec::new(), api);
        }
        let Some(vm) = st.vms.get(&id) else {
            return (Vec::new(), api);
        };
        let is_server = vm.user_data.as_ref().and_then(|u| u.role) == Some(Role::Server);
        if !vm.running || !is_server {
            return (Vec::new(), api);
        }
        let mut ips: Vec<IpAddr> = vm.ephemeral_ips.clone();
        ips.extend(vm.private_loopback);
        let mut floating: Vec<IpAddr> = st
            .floating
            .iter()
            .filter(|(_, owner)| **owner == id)
            .map(|(ip, _)| *ip)
            .collect();
        floating.sort();
        ips.extend(floating);
        ips.extend(vm.tailnet_ip);
        let mut out = Vec::new();
        if vm.sshd_up {
            for ip in &ips {
                out.push((
                    SocketAddr::new(*ip, self.cfg.ssh_port),
                    ListenerKind::Ssh,
                    Vec::new(),
                ));
            }
        }
        if vm.k3s == K3sState::Joined {
            let sans = self.serving_sans(&st, vm);
            for ip in &ips {
                out.push((
                    SocketAddr::new(*ip, KUBE_API_PORT),
                    ListenerKind::KubeApi,
                    sans.clone(),
                ));
            }
        }
        (out, api)
    }

    /// SANs of the API serving certificate, as k3s builds them: loopback and in-cluster names,
    /// the node's own addresses, and every `tls-san` of the cluster's servers. A floating IP is
    /// NAT in front of the VM (the guest never sees it), so it is in the certificate only when
    /// some server lists it in `tls-san` — exactly as on a real rack. The same holds for an
    /// ephemeral IP.
    fn serving_sans(&self, st: &State, vm: &Vm) -> Vec<String> {
        let mut sans: BTreeSet<String> = [
            "127.0.0.1",
            "::1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.43.0.1",
        ]
        .into_iter()
        .map(str::to_string)
        .collect();
        sans.insert(vm.hostname.clone());
        // No ephemeral IP: like a floating IP it is NAT in front of the VM, the guest never
        // sees it, and k3s >= 1.28 (`tls-san-security`) adds no address it was not given.
        // k3s puts the node's own address (the NIC's private IP) in the certificate too.
        sans.extend(vm.private_ip.map(|ip| ip.to_string()));
        for other in st.vms.values() {
            let fellow = (other.member && other.cluster == vm.cluster) || std::ptr::eq(other, vm);
            if fellow && let Some(k3s) = other.user_data.as_ref().and_then(|u| u.k3s.as_ref()) {
                sans.extend(k3s.tls_san.iter().cloned());
            }
            // The `tls-san+` drop-in written from `tailscale ip -4` at boot.
            if fellow
                && other.tailnet_san
                && let Some(ip) = other.tailnet_ip
            {
                sans.insert(ip.to_string());
            }
        }
        sans.into_iter().collect()
    }

    /// What the server's own apiserver answers: its name and the k3s release it installed.
    fn server_facts(&self, id: Uuid) -> Option<Arc<crate::control_plane::proxy::ServerFacts>> {
        let st = self.state();
        let vm = st.vms.get(&id)?;
        let version = vm
            .user_data
            .as_ref()
            .and_then(|u| u.install_version.clone())
            .unwrap_or_else(|| self.cfg.k3s_version.clone());
        Some(Arc::new(crate::control_plane::proxy::ServerFacts {
            instance: vm.name.clone(),
            version,
            started: vm.k3s_started,
        }))
    }

    fn open_listener(
        self: &Arc<Self>,
        guard: &mut ListenersGuard<'_>,
        id: Uuid,
        addr: SocketAddr,
        kind: ListenerKind,
        sans: Vec<String>,
        api: &Option<Arc<RealCluster>>,
    ) {
        let result = match kind {
            ListenerKind::KubeApi => {
                let Some(real) = api else {
                    return;
                };
                let end = self.state().vms.get(&id).and_then(|v| v.certs_end);
                match real.proxy.tls_config_until(&sans, end) {
                    Ok(tls) => {
                        let proxy = Arc::clone(&real.proxy);
                        let server = self.server_facts(id);
                        guard.open(addr, kind, id, move |listener| {
                            proxy.serve_as(listener, tls, server)
                        })
                    }
                    Err(err) => {
                        tracing::warn!(%addr, error = %err, "cannot build the API serving certificate");
                        return;
                    }
                }
            }
            ListenerKind::Ssh => {
                let Some((host, backend)) = self.ssh_parts(id, addr) else {
                    return;
                };
                guard.open(addr, kind, id, move |listener| async move {
                    host.serve(listener, backend).await;
                })
            }
        };
        if let Err(err) = result {
            tracing::warn!(%addr, ?kind, instance = %id, error = %err, "cannot listen");
        }
    }
}
