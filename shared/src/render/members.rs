//! Turning a `CreateMember` decision into a concrete [`NewInstance`]: sizes from the pool,
//! the boot image resolved by name, the description tag with the pool's spec hash, and the
//! user-data rendered by [`crate::render::cloud_init`] with the join settings (server URL, the right
//! token for the role, TLS SANs, node name, labels, taints). Pure.

use crate::base::names::{self, InstanceTag};
use crate::base::secrets::ClusterSecrets;
use crate::domain::model::NewInstance;
use crate::domain::plan::{MemberFactory, Observed};
use crate::domain::spec::{ClusterSpec, Role};
use crate::render::cloud_init::MemberInput;

/// Builds members of a cluster from its spec, secrets and what the run observed.
#[derive(Debug)]
pub struct SpecMembers<'a> {
    spec: &'a ClusterSpec,
    secrets: &'a ClusterSecrets,
    observed: &'a Observed,
    ca_hash: Option<&'a str>,
}

impl<'a> SpecMembers<'a> {
    pub fn new(spec: &'a ClusterSpec, secrets: &'a ClusterSecrets, observed: &'a Observed) -> Self {
        SpecMembers {
            spec,
            secrets,
            observed,
            ca_hash: None,
        }
    }

    /// New members join with the full `K10<ca_hash>::` token form.
    pub fn with_ca_hash(mut self, ca_hash: Option<&'a str>) -> Self {
        self.ca_hash = ca_hash;
        self
    }
}

/// Builds the [`NewInstance`] for one member.
pub fn new_instance(m: &MemberInput) -> Result<NewInstance, String> {
    let spec = m.spec;
    let tag = InstanceTag {
        cluster: spec.cluster.clone(),
        pool: m.pool.name.clone(),
        spec_hash: spec.pool_hash(m.role, m.pool),
    };
    if spec.tailscale.is_some() && m.secrets.tailscale_auth_key.is_none() {
        // Without the key the VM would come up outside the tailnet it is meant to be on.
        return Err(format!(
            "spec.yaml has tailscale but the Secret has no {} key; re-run bootstrap with --tailscale-auth-key",
            crate::base::secrets::keys::TAILSCALE_AUTH_KEY
        ));
    }
    let user_data = crate::render::cloud_init::render_member(m)
        .map_err(|e| format!("rendering user-data for {}: {e}", m.name))?;
    Ok(NewInstance {
        name: m.name.to_owned(),
        description: tag.to_string(),
        hostname: m.name.to_owned(),
        ncpus: m.pool.cpus,
        memory: m.pool.memory,
        boot_disk: crate::domain::model::NewDisk {
            name: names::boot_disk_name(m.name),
            size: m.pool.boot_disk,
            image: Some(m.image_id),
        },
        data_disk: m.pool.data_disk.map(|size| crate::domain::model::NewDisk {
            name: names::data_disk_name(m.name),
            size,
            image: None,
        }),
        restore_disk: m.restore.cloned(),
        user_data,
        ephemeral_ip: spec.nodes.external_ip.ephemeral_for(m.role),
        ip_pool: spec.nodes.ip_pool.clone(),
        anti_affinity_group: spec.anti_affinity_group(m.role, m.pool),
        // Servers: the rack restarts them after a sled fault even when no controller can
        // run (quorum lost); see DESIGN-NOTES "Start before replace".
        rack_restarts: m.role == Role::ControlPlane,
    })
}

/// The server new members join through: the API floating IP's holder when it is a Ready
/// server, else the oldest Ready server. `None` while no server is Ready.
pub fn join_server(
    spec: &ClusterSpec,
    observed: &Observed,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<String> {
    let members = crate::domain::plan::classify(spec, observed, now);
    let ready: Vec<_> = members
        .iter()
        .filter(|m| {
            m.pool == spec.control_plane.name && m.health == crate::domain::plan::Health::Ready
        })
        .collect();
    let holder = observed
        .api_floating_ip
        .as_ref()
        .and_then(|f| f.instance_id);
    ready
        .iter()
        .find(|m| Some(m.instance.id) == holder)
        .or_else(|| {
            ready
                .iter()
                .min_by_key(|m| (m.instance.time_created, m.instance.name.clone()))
        })
        .map(|m| m.instance.name.clone())
}

impl MemberFactory for SpecMembers<'_> {
    fn new_instance(&self, pool: &str, name: &str) -> Result<NewInstance, String> {
        let (role, pool) = self
            .spec
            .pool(pool)
            .ok_or_else(|| format!("pool {pool:?} is not in the spec"))?;
        let image = self
            .observed
            .images
            .get(&pool.image)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("image {:?} not found", pool.image))?;
        let fip = self
            .observed
            .api_floating_ip
            .as_ref()
            .ok_or_else(|| "the API floating IP does not exist yet".to_owned())?;
        // Joiners use a Ready server's VPC address: traffic through the floating IP arrives
        // as external and passes only if `--api-allow` admits the rack's own addresses. With
        // no Ready server there is no private address to give; the floating IP is the only
        // way in, and a later run's members use a private address again.
        let join_address = self.observed.join_address.unwrap_or(fip.ip);
        new_instance(&MemberInput {
            spec: self.spec,
            secrets: self.secrets,
            role,
            pool,
            name,
            image_id: image.id,
            ca_hash: self.ca_hash,
            restore: None,
            drill: false,
            api_address: fip.ip,
            join_address,
            cluster_init: false,
        })
    }

    fn anti_affinity_group(&self, pool: &str) -> Option<String> {
        self.spec
            .pool(pool)
            .and_then(|(role, p)| self.spec.anti_affinity_group(role, p))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::domain::spec::Role;

    /// Issue 32 item 6: a server is created in the control plane's default anti-affinity
    /// group, which apply makes sure of first; a worker of a pool naming none in no group.
    #[test]
    fn servers_join_the_default_anti_affinity_group_and_the_rack_restarts_them() {
        let spec = ClusterSpec::new("demo", "demo", "ubuntu", 3, 2);
        let secrets = ClusterSecrets {
            k3s_token: "k3s-token".into(),
            k3s_agent_token: "agent-token".into(),
            ssh_public_key:
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb1M0Y4hl6YqVnZ8vQm7oFzX3xK1p4tq9w2nqkqzJ0A c"
                    .into(),
            ..Default::default()
        };
        let made = |role, pool, name| {
            new_instance(&MemberInput {
                spec: &spec,
                secrets: &secrets,
                role,
                pool,
                name,
                image_id: uuid::Uuid::nil(),
                api_address: "172.30.0.10".parse().unwrap(),
                join_address: "172.30.0.10".parse().unwrap(),
                cluster_init: false,
                ca_hash: None,
                restore: None,
                drill: false,
            })
            .unwrap()
        };
        let server = made(
            Role::ControlPlane,
            &spec.control_plane,
            "demo-control-plane-abcde",
        );
        assert_eq!(
            server.anti_affinity_group.as_deref(),
            Some("demo-control-plane")
        );
        assert!(server.rack_restarts);
        let worker = made(Role::Worker, &spec.worker_pools[0], "demo-workers-abcde");
        assert_eq!(worker.anti_affinity_group, None);
        assert!(!worker.rack_restarts);
        let observed = Observed::default();
        let factory = SpecMembers {
            spec: &spec,
            secrets: &secrets,
            observed: &observed,
            ca_hash: None,
        };
        assert_eq!(
            factory.anti_affinity_group("control-plane").as_deref(),
            Some("demo-control-plane")
        );
        assert_eq!(factory.anti_affinity_group("workers"), None);
    }

    #[test]
    fn a_tailscale_spec_without_the_auth_key_in_the_secret_creates_nothing() {
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu", 3, 2);
        spec.tailscale = Some(crate::domain::spec::TailscaleSpec::default());
        let without = ClusterSecrets {
            k3s_token: "k3s-token".into(),
            k3s_agent_token: "agent-token".into(),
            ssh_public_key:
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb1M0Y4hl6YqVnZ8vQm7oFzX3xK1p4tq9w2nqkqzJ0A c"
                    .into(),
            ..Default::default()
        };
        let with = ClusterSecrets {
            tailscale_auth_key: Some("tskey-auth-x".into()),
            ..without.clone()
        };
        let input = |secrets| MemberInput {
            spec: &spec,
            secrets,
            role: Role::ControlPlane,
            pool: &spec.control_plane,
            name: "demo-control-plane-abcde",
            image_id: uuid::Uuid::nil(),
            api_address: "172.30.0.10".parse().unwrap(),
            join_address: "172.30.0.10".parse().unwrap(),
            cluster_init: false,
            ca_hash: None,
            restore: None,
            drill: false,
        };
        let e = new_instance(&input(&without)).expect_err("no key");
        assert!(e.contains("tailscale-auth-key"), "{e}");
        let made = new_instance(&input(&with)).unwrap();
        let user_data = String::from_utf8(made.user_data).unwrap();
        assert!(
            user_data.contains("--auth-key=file:/etc/oxide-controller/tailscale-auth-key"),
            "{user_data}"
        );
    }
}
