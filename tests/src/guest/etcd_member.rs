//! What k3s's managed etcd does around a server's real etcd member
//! ([`crate::control_plane::etcd`]): the member's name, joining as a learner, stopping and
//! starting with the VM, its data going with the instance, and the removal of a deleted
//! server Node's member. Each rule is cited in `tests/FIDELITY.md` ("k3s etcd membership").

use std::net::Ipv4Addr;
use std::sync::Arc;

use uuid::Uuid;

use super::k3s_config::Role;
use super::{Inner, State};

/// The Node annotations k3s's etcd metadata controller writes on a server's own Node: its
/// member's name and address, which the member controller reads when the Node is deleted.
pub const NODE_NAME_ANNOTATION: &str = "etcd.k3s.cattle.io/node-name";
pub const NODE_ADDRESS_ANNOTATION: &str = "etcd.k3s.cattle.io/node-address";

/// What etcd says when a removed member's peers refuse it.
pub const REMOVED_MEMBER: &str = "the member has been permanently removed from the cluster";

/// k3s's member name (`setName`): the server's node name, a dash, 8 characters of a fresh
/// UUID; kept on the server's disk (`db/etcd/name`), so it survives restarts.
pub(super) fn member_name(node_name: &str) -> String {
    format!("{node_name}-{}", &Uuid::new_v4().to_string()[..8])
}

/// The node name k3s gives a server: `node-name` from its config, else its hostname in
/// lower case (as its Node is registered).
fn server_node_name(vm: &super::Vm) -> String {
    vm.user_data
        .as_ref()
        .and_then(|u| u.k3s.as_ref())
        .and_then(|k| k.node_name.clone())
        .unwrap_or_else(|| vm.hostname.to_lowercase())
}

impl Inner {
    /// The member a cluster-init server starts its cluster with (name and address), recorded
    /// on the VM.
    pub(super) fn new_etcd_member(&self, id: Uuid) -> (String, Option<Ipv4Addr>) {
        let mut st = self.state();
        let Some(vm) = st.vms.get_mut(&id) else {
            return (member_name("default"), None);
        };
        let ip = crate::control_plane::etcd::member_ip(vm.private_loopback);
        let name = member_name(&server_node_name(vm));
        vm.etcd_member = Some((name.clone(), ip));
        (name, Some(ip))
    }

    /// A server of `cluster` starting k3s whose member has its data: the member starts
    /// again (k3s `Start`: "Starting etcd for existing cluster member"). Nothing otherwise.
    pub(super) fn etcd_restart(&self, id: Uuid, role: Role, cluster: Uuid) -> Result<(), String> {
        if role != Role::Server {
            return Ok(());
        }
        let (api, existing) = {
            let st = self.state();
            let (Some(c), Some(vm)) = (st.clusters.get(&cluster), st.vms.get(&id)) else {
                return Ok(());
            };
            (
                Arc::clone(&c.api),
                vm.etcd_member.clone().filter(|_| vm.member),
            )
        };
        match existing {
            Some((name, _)) => {
                // Started without `--cluster-reset`: k3s removes the reset-flag.
                if let Some(vm) = self.state().vms.get_mut(&id) {
                    vm.reset_flag = false;
                }
                api.control_plane.etcd().restart(&name).map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// A server of `cluster` starting k3s: a member with its data starts again; a new one is
    /// added as a learner and promoted (k3s `join`). Err is what k3s exits with.
    pub(super) async fn etcd_join(
        self: &Arc<Self>,
        id: Uuid,
        role: Role,
        cluster: Uuid,
    ) -> Result<(), String> {
        if role != Role::Server {
            return Ok(());
        }
        let (api, existing, node_name, private) = {
            let st = self.state();
            let (Some(c), Some(vm)) = (st.clusters.get(&cluster), st.vms.get(&id)) else {
                return Err("instance vanished".into());
            };
            (
                Arc::clone(&c.api),
                vm.etcd_member.clone().filter(|_| vm.member),
                server_node_name(vm),
                vm.private_loopback,
            )
        };
        let etcd = api.control_plane.etcd();
        if let Some((name, ip)) = &existing
            && etcd.restart(name)?
        {
            // A member the cluster no longer lists (removed, or reset away) is refused by its
            // peers (410 "removed member") and its etcd stops until its data is deleted.
            if etcd.removed_elsewhere(name, *ip).await == Some(true) {
                etcd.stop(name);
                return Err(format!(
                    "{REMOVED_MEMBER}; data-dir used by this member must be removed"
                ));
            }
            return Ok(());
        }
        let (name, ip) = match existing {
            Some(member) => member,
            None => {
                let member = (
                    member_name(&node_name),
                    crate::control_plane::etcd::member_ip(private),
                );
                if let Some(vm) = self.state().vms.get_mut(&id) {
                    vm.etcd_member = Some(member.clone());
                }
                member
            }
        };
        etcd.join(&name, ip).await
    }

    /// The VM stopped: its member's process stops, its data stays.
    pub(super) fn etcd_stop(&self, st: &State, id: Uuid) {
        if let (Some(api), Some((name, _))) = (
            self.api_of(st, id),
            st.vms.get(&id).and_then(|v| v.etcd_member.as_ref()),
        ) {
            api.control_plane.etcd().stop(name);
        }
    }

    /// The instance was deleted with its disks: its member's data is gone.
    pub(super) fn etcd_forget(&self, st: &State, id: Uuid) {
        if let (Some(api), Some((name, _))) = (
            self.api_of(st, id),
            st.vms.get(&id).and_then(|v| v.etcd_member.as_ref()),
        ) {
            api.control_plane.etcd().forget(name);
        }
    }
}
