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

/// The first etcd 3.5 a 3.6 member may join (etcd-io/etcd#20995, v3.5.26).
const ETCD_SAFE_3_5: (u64, u64, u64) = (3, 5, 26);

/// `v3.5.21` → (3, 5, 21).
fn etcd_triple(v: &str) -> Option<(u64, u64, u64)> {
    let mut p = v.strip_prefix('v')?.split('.').map(|x| x.parse().ok());
    Some((p.next()??, p.next()??, p.next()??))
}

/// The etcd `release` bundles (the product's table and tests/FIDELITY.md "etcd versions"),
/// not the patch the simulator may run in its place.
fn bundled_etcd(release: &str) -> Option<(u64, u64, u64)> {
    crate::control_plane::RELEASE_ETCD
        .iter()
        .find(|(r, _, _)| *r == release)
        .map_or_else(
            || etcd_triple(crate::control_plane::etcd_version_for(release)),
            |(_, bundled, _)| etcd_triple(bundled),
        )
}

/// **Model** (tests/FIDELITY.md "etcd 3.5 → 3.6 join"): a server whose k3s bundles etcd 3.6
/// joining a cluster that lists a member on etcd older than v3.5.26 fails as
/// k3s-io/k3s#13271 and #13485 report it ("the new node will see an unhealthy cluster": etcd
/// 3.6 takes membership from the v3 store, which in clusters that replaced members lists
/// removed "zombie" members; etcd-io/etcd#20995 repairs it in v3.5.26). The simulator's
/// members are new and their stores agree, so real etcd would let the join through; the
/// simulator assumes the history every product roll creates (each roll replaces members).
/// Err is what the joiner's k3s exits with.
fn zombie_member_refusal(release: &str, listed: &[(String, String)]) -> Result<(), String> {
    let Some(joiner) = bundled_etcd(release).filter(|v| *v >= (3, 6, 0)) else {
        return Ok(());
    };
    let old = listed.iter().find_map(|(name, r)| {
        bundled_etcd(r)
            .filter(|v| *v < ETCD_SAFE_3_5)
            .map(|v| (name, r, v))
    });
    match old {
        Some((name, r, (a, b, c))) => Err(format!(
            "etcdserver: unhealthy cluster (model: etcd v{}.{}.{} of k3s {release} joining; member {name} runs k3s {r} with etcd v{a}.{b}.{c}, older than v3.5.26, whose v3 store lists members the cluster removed: zombie members, https://etcd.io/blog/2025/zombie_members_upgrade/)",
            joiner.0, joiner.1, joiner.2
        )),
        None => Ok(()),
    }
}

/// The k3s release a VM installed (install.sh's `INSTALL_K3S_VERSION`, else the image's).
pub(super) fn installed_release(vm: &super::Vm, image: &str) -> String {
    vm.user_data
        .as_ref()
        .and_then(|u| u.install_version.clone())
        .unwrap_or_else(|| image.to_owned())
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
        let (api, existing, node_name, private, release) = {
            let st = self.state();
            let (Some(c), Some(vm)) = (st.clusters.get(&cluster), st.vms.get(&id)) else {
                return Err("instance vanished".into());
            };
            (
                Arc::clone(&c.api),
                vm.etcd_member.clone().filter(|_| vm.member),
                server_node_name(vm),
                vm.private_loopback,
                installed_release(vm, &self.cfg.k3s_version),
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
        zombie_member_refusal(&release, &etcd.listed_releases().await?)?;
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
        etcd.join(&name, &release, ip).await
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

#[cfg(test)]
mod zombie_tests {
    use super::zombie_member_refusal;

    fn listed(releases: &[&str]) -> Vec<(String, String)> {
        releases
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("m{i}"), (*r).to_owned()))
            .collect()
    }

    #[test]
    fn an_etcd_36_server_is_refused_by_a_cluster_listing_a_member_before_3_5_26() {
        let err = zombie_member_refusal("v1.34.1+k3s1", &listed(&["v1.33.7+k3s3", "v1.33.4+k3s1"]))
            .unwrap_err();
        assert!(
            err.contains("member m1 runs k3s v1.33.4+k3s1 with etcd v3.5.21, older than v3.5.26"),
            "{err}"
        );
        assert!(err.starts_with("etcdserver: unhealthy cluster"), "{err}");
        // From v3.5.26 on, and for 3.5 joiners, the join goes to etcd.
        assert_eq!(
            zombie_member_refusal("v1.34.1+k3s1", &listed(&["v1.33.7+k3s3", "v1.34.1+k3s1"])),
            Ok(())
        );
        assert_eq!(
            zombie_member_refusal("v1.33.7+k3s3", &listed(&["v1.33.4+k3s1"])),
            Ok(())
        );
    }
}
