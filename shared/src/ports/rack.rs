//! The `Rack` trait: everything oxide-controller asks of the Oxide API, in domain types.
//!
//! The real implementation over the `oxide` SDK is [`crate::adapters::oxide_rack::OxideRack`]; workflow tests use
//! `fake::FakeRack` (feature `testing`). Every list call exhausts pagination. Nothing above this module
//! sees an `oxide::types` value or an HTTP status.

use std::future::Future;
use std::net::IpAddr;

use crate::domain::firewall::{OwnedRule, RuleChange};
use crate::domain::model::{
    AntiAffinityGroup, Disk, ExternalIp, FloatingIp, Image, Instance, NewInstance, Snapshot,
};

/// What went wrong talking to the rack, classified for the caller's decision (adopt, retry,
/// give up). Messages come from the API and never contain our secrets.
#[derive(Debug, thiserror::Error)]
pub enum RackError {
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("{what} already exists")]
    AlreadyExists { what: String },
    #[error("the rack refused the request for {what}: {message}")]
    Invalid { what: String, message: String },
    #[error("the rack says {what} is in a state that forbids this: {message}")]
    Conflict { what: String, message: String },
    #[error("the rack is temporarily unable to handle {what} (HTTP {status}): {message}")]
    Unavailable {
        what: String,
        status: u16,
        message: String,
    },
    #[error(
        "the rack rejected our credentials (HTTP {status}): {message}; check the Oxide token and host"
    )]
    Unauthorized { status: u16, message: String },
    #[error("the rack has not enough capacity for {what}: {message}")]
    InsufficientCapacity { what: String, message: String },
    #[error("request for {what} timed out after {seconds}s")]
    Timeout { what: String, seconds: u64 },
    #[error("could not reach the rack for {what}")]
    Transport {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("unexpected answer from the rack for {what}: {message}")]
    Unexpected { what: String, message: String },
}

impl RackError {
    /// Worth retrying with backoff (503, 5xx, timeouts, connection trouble).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RackError::Unavailable { .. } | RackError::Timeout { .. } | RackError::Transport { .. }
        )
    }
}

/// Everything the product does on an Oxide rack. Instances, disks and floating IPs are
/// addressed by name within the project the rack was built for.
pub trait Rack: Send + Sync {
    /// Creates the project if it does not exist.
    fn ensure_project(&self) -> impl Future<Output = Result<(), RackError>> + Send;

    /// All instances of the project whose name starts with `prefix` (all pages).
    fn list_instances(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<Vec<Instance>, RackError>> + Send;
    fn get_instance(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Instance>, RackError>> + Send;
    /// Creates and starts an instance. `AlreadyExists` when the name is taken (e.g. a lost
    /// response to an earlier try): callers adopt it.
    fn create_instance(
        &self,
        new: &NewInstance,
    ) -> impl Future<Output = Result<Instance, RackError>> + Send;
    fn start_instance(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    fn stop_instance(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Reboots a running instance (nexus `instance_reboot`: a running VMM only).
    fn reboot_instance(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Deletes a stopped or failed instance (its disks stay, detached).
    fn delete_instance(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    fn instance_external_ips(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Vec<ExternalIp>, RackError>> + Send;
    /// The private (VPC) address of the instance's primary network interface; `None` when
    /// the instance does not exist or has no such interface.
    fn instance_private_ip(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<IpAddr>, RackError>> + Send;
    /// Recent serial console output (bounded).
    fn serial_console(&self, name: &str)
    -> impl Future<Output = Result<Vec<u8>, RackError>> + Send;
    /// The start of the console history (bounded), where a first boot's output stays when
    /// more than [`Rack::serial_console`] holds was printed after it. The default reads the
    /// recent output: a console that small keeps its whole history.
    fn serial_console_head(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Vec<u8>, RackError>> + Send {
        self.serial_console(name)
    }

    /// All disks of the project (all pages).
    fn list_disks(&self) -> impl Future<Output = Result<Vec<Disk>, RackError>> + Send;
    fn delete_disk(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Deletes a disk an image import left behind (`bootstrap delete`), walking it to a
    /// deletable state first when the import stopped half-way. The default only deletes.
    fn delete_import_disk(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send {
        self.delete_disk(name)
    }

    fn list_floating_ips(&self) -> impl Future<Output = Result<Vec<FloatingIp>, RackError>> + Send;

    /// The calling user's own unexpired device tokens (`GET /v1/me/access-tokens`, all
    /// pages): ids and ends, never the bearer values. Not scoped to the project.
    fn my_access_tokens(
        &self,
    ) -> impl Future<Output = Result<Vec<crate::domain::oxide_token::AccessToken>, RackError>> + Send;

    /// The prefix length of subnet `default` of the project's VPC `default`, where members'
    /// NICs get their addresses; `None` when the project or that subnet does not exist.
    fn default_subnet_prefix(&self) -> impl Future<Output = Result<Option<u8>, RackError>> + Send;
    fn get_floating_ip(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<FloatingIp>, RackError>> + Send;
    fn create_floating_ip(
        &self,
        name: &str,
        description: &str,
        pool: Option<&str>,
    ) -> impl Future<Output = Result<FloatingIp, RackError>> + Send;
    /// Attaches; a 503 (instance in a transient state) comes back as `Unavailable` for the
    /// caller's retry loop.
    fn attach_floating_ip(
        &self,
        fip: &str,
        instance: &str,
    ) -> impl Future<Output = Result<(), RackError>> + Send;
    fn detach_floating_ip(&self, fip: &str) -> impl Future<Output = Result<(), RackError>> + Send;

    /// Finds an image by name: the project's first, then the silo's.
    fn find_image(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Image>, RackError>> + Send;

    /// Creates the anti-affinity group if it does not exist.
    fn ensure_anti_affinity_group(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(), RackError>> + Send;

    // ---- deleting a cluster (`bootstrap delete`, workflows::delete) ----

    /// Whether the project exists.
    fn project_exists(&self) -> impl Future<Output = Result<bool, RackError>> + Send;
    /// Deletes a floating IP; Oxide refuses while it is attached.
    fn delete_floating_ip(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// The project's own images (never the silo's), all pages.
    fn list_project_images(&self) -> impl Future<Output = Result<Vec<Image>, RackError>> + Send;
    /// Deletes a project image.
    fn delete_image(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// All snapshots of the project (all pages).
    fn list_snapshots(&self) -> impl Future<Output = Result<Vec<Snapshot>, RackError>> + Send;
    fn delete_snapshot(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// All anti-affinity groups of the project (all pages).
    fn list_anti_affinity_groups(
        &self,
    ) -> impl Future<Output = Result<Vec<AntiAffinityGroup>, RackError>> + Send;
    /// Names of the instances in an anti-affinity group (all pages).
    fn anti_affinity_group_members(
        &self,
        group: &str,
    ) -> impl Future<Output = Result<Vec<String>, RackError>> + Send;
    fn delete_anti_affinity_group(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Names of the project's VPCs.
    fn list_vpcs(&self) -> impl Future<Output = Result<Vec<String>, RackError>> + Send;
    /// Names of the project's affinity groups (all pages); a project holding one cannot be
    /// deleted.
    fn list_affinity_groups(&self) -> impl Future<Output = Result<Vec<String>, RackError>> + Send;
    /// Names of the subnets of the project's `default` VPC (all pages); a VPC holding one
    /// cannot be deleted.
    fn list_default_vpc_subnets(
        &self,
    ) -> impl Future<Output = Result<Vec<String>, RackError>> + Send;
    /// Deletes the project. Oxide refuses while it holds anything, a VPC included, so this
    /// first removes the `default` VPC's `default` subnet and the `default` VPC (which the
    /// project's creation made), each counted done when already gone. Three calls, not one
    /// transaction: a refusal after the first leaves the project without its network, so the
    /// caller checks first that nothing nexus refuses over is left.
    fn delete_project(&self) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Removes the rule named `name` from the `default` VPC's firewall: read-modify-write of
    /// the whole list keeping every other rule as it was; `false` (nothing written) when there
    /// is no such rule.
    fn remove_firewall_rule(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<bool, RackError>> + Send;
    /// Names of the firewall rules of the project's `default` VPC, in the rack's order.
    fn list_firewall_rules(&self) -> impl Future<Output = Result<Vec<String>, RackError>> + Send;
    /// Makes each rule named in `rules` in the project's `default` VPC exactly as given, in
    /// one read-modify-write of the whole list that keeps every other rule as it was, and
    /// writes nothing when all of them are already right. Returns `Created` when any was
    /// missing, else `Updated` when any differed.
    fn ensure_firewall_rules(
        &self,
        rules: &[OwnedRule],
    ) -> impl Future<Output = Result<RuleChange, RackError>> + Send;
}

/// An address we may connect to for a member: floating first, then ephemeral; SNAT never.
pub fn reachable_address(ips: &[ExternalIp]) -> Option<IpAddr> {
    use crate::domain::model::ExternalIpKind::*;
    ips.iter()
        .find(|i| i.kind == Floating)
        .or_else(|| ips.iter().find(|i| i.kind == Ephemeral))
        .map(|i| i.ip)
}
