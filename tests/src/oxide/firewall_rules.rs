//! The rule data of a VPC firewall: the three rules nexus writes into every new VPC, the body
//! of a `PUT` as nexus parses it, and the stored form of a rule list (each rule with a new id,
//! as every `PUT` gives it). Pure data, shared by the store (a new project's VPC) and the
//! firewall routes.
//!
//! Sources: omicron `nexus/defaults/src/lib.rs` (`DEFAULT_FIREWALL_RULES`),
//! `common/src/api/external/mod.rs` (the update types),
//! `nexus/db-model/src/vpc_firewall_rule.rs` (`vec_from_params`); tests/FIDELITY.md.

use chrono::Utc;
use oxide::types;
use serde::Deserialize;
use uuid::Uuid;

/// Priority nexus gives the default rules.
const DEFAULT_PRIORITY: u16 = 65534;
/// The VPC (and subnet) a project's creation makes.
pub const DEFAULT_VPC: &str = "default";

fn name(s: &str) -> types::Name {
    // The names below are literals that satisfy the Name rules.
    types::Name::try_from(s).unwrap_or_else(|_| unreachable!("valid literal name {s}"))
}

fn tcp_port(port: u16) -> types::L4PortRange {
    types::L4PortRange::try_from(port.to_string())
        .unwrap_or_else(|_| unreachable!("a u16 is a valid port range"))
}

/// The three rules nexus writes into a new VPC (omicron `DEFAULT_FIREWALL_RULES`).
pub fn default_rules() -> Vec<types::VpcFirewallRuleUpdate> {
    let vpc = || vec![types::VpcFirewallRuleTarget::Vpc(name(DEFAULT_VPC))];
    let rule = |n: &str, description: &str, filters| types::VpcFirewallRuleUpdate {
        action: types::VpcFirewallRuleAction::Allow,
        description: description.into(),
        direction: types::VpcFirewallRuleDirection::Inbound,
        filters,
        name: name(n),
        priority: DEFAULT_PRIORITY,
        status: types::VpcFirewallRuleStatus::Enabled,
        targets: vpc(),
    };
    vec![
        rule(
            "allow-internal-inbound",
            "allow inbound traffic to all instances within the VPC if originated within the VPC",
            types::VpcFirewallRuleFilter {
                hosts: Some(vec![types::VpcFirewallRuleHostFilter::Vpc(name(
                    DEFAULT_VPC,
                ))]),
                ports: None,
                protocols: None,
            },
        ),
        rule(
            "allow-ssh",
            "allow inbound TCP connections on port 22 from anywhere",
            types::VpcFirewallRuleFilter {
                hosts: None,
                ports: Some(vec![tcp_port(22)]),
                protocols: Some(vec![types::VpcFirewallRuleProtocol::Tcp]),
            },
        ),
        rule(
            "allow-icmp",
            "allow inbound ICMP traffic from anywhere",
            types::VpcFirewallRuleFilter {
                hosts: None,
                ports: None,
                protocols: Some(vec![types::VpcFirewallRuleProtocol::Icmp(None)]),
            },
        ),
    ]
}

/// The body of `PUT /v1/vpc-firewall-rules` as nexus's own types take it, which the SDK's
/// differ from: their fields have serde defaults (nexus's filter fields have none, so a
/// `filters` array shorter than three is refused) and are in another order (a struct given as
/// an array is read by position). The type names are nexus's: serde's messages quote them.
#[derive(Debug, Deserialize)]
pub struct VpcFirewallRuleUpdateParams {
    #[serde(default)]
    rules: Vec<VpcFirewallRuleUpdate>,
}

/// One rule of [`VpcFirewallRuleUpdateParams`], fields in nexus's order.
#[derive(Debug, Deserialize)]
struct VpcFirewallRuleUpdate {
    name: types::Name,
    description: String,
    status: types::VpcFirewallRuleStatus,
    direction: types::VpcFirewallRuleDirection,
    targets: Vec<types::VpcFirewallRuleTarget>,
    filters: VpcFirewallRuleFilter,
    action: types::VpcFirewallRuleAction,
    priority: u16,
}

/// The filters of a [`VpcFirewallRuleUpdate`], fields in nexus's order, without defaults.
#[derive(Debug, Deserialize)]
struct VpcFirewallRuleFilter {
    hosts: Option<Vec<types::VpcFirewallRuleHostFilter>>,
    protocols: Option<Vec<types::VpcFirewallRuleProtocol>>,
    ports: Option<Vec<types::L4PortRange>>,
}

impl From<VpcFirewallRuleUpdateParams> for types::VpcFirewallRuleUpdateParams {
    fn from(params: VpcFirewallRuleUpdateParams) -> Self {
        let rules = params
            .rules
            .into_iter()
            .map(|r| types::VpcFirewallRuleUpdate {
                action: r.action,
                description: r.description,
                direction: r.direction,
                filters: types::VpcFirewallRuleFilter {
                    hosts: r.filters.hosts,
                    ports: r.filters.ports,
                    protocols: r.filters.protocols,
                },
                name: r.name,
                priority: r.priority,
                status: r.status,
                targets: r.targets,
            })
            .collect();
        Self { rules }
    }
}

/// The stored form of a replacement list: each rule gets a new id, as in nexus.
pub fn materialize(
    vpc_id: Uuid,
    rules: Vec<types::VpcFirewallRuleUpdate>,
) -> Vec<types::VpcFirewallRule> {
    let now = Utc::now();
    rules
        .into_iter()
        .map(|r| types::VpcFirewallRule {
            action: r.action,
            description: r.description,
            direction: r.direction,
            filters: r.filters,
            id: Uuid::new_v4(),
            name: r.name,
            priority: r.priority,
            status: r.status,
            targets: r.targets,
            time_created: now,
            time_modified: now,
            vpc_id,
        })
        .collect()
}
