//! The rule data of a VPC firewall: the three rules nexus writes into every new VPC, and the
//! stored form of a rule list (each rule with a new id, as every `PUT` gives it). Pure data,
//! shared by the store (a new project's VPC) and the firewall routes.
//!
//! Sources: omicron `nexus/defaults/src/lib.rs` (`DEFAULT_FIREWALL_RULES`),
//! `nexus/db-model/src/vpc_firewall_rule.rs` (`vec_from_params`); tests/FIDELITY.md.

use chrono::Utc;
use oxide::types;
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
