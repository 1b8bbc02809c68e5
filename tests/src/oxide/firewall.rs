//! The VPC firewall of the simulated rack: each project's `default` VPC with the three rules
//! nexus gives a new VPC, the `GET`/`PUT /v1/vpc-firewall-rules` routes with nexus's checks,
//! and the evaluation of inbound rules that decides whether a connection to an instance gets
//! through or is dropped.
//!
//! Sources (tests/FIDELITY.md, "Firewall and instance lifecycle"):
//! - defaults: omicron `nexus/defaults/src/lib.rs` (`DEFAULT_FIREWALL_RULES`);
//! - checks on `PUT`: omicron `nexus/db-model/src/vpc_firewall_rule.rs` (unique names, at most
//!   1024 rules and 256 targets / filters of each kind, non-empty port ranges), then
//!   `nexus/networking/src/firewall_rules.rs` (no `vpc` target or host filter naming another
//!   VPC); every `PUT` gives every rule a new id (`vec_from_params`);
//! - targets and host filters: omicron `nexus/networking/src/firewall_rules.rs` (targets are
//!   the instances' NICs; `instance`/`subnet`/`ip`/`ip_net` host filters become private
//!   addresses, a `vpc` host filter becomes the VPC's VNI);
//! - matching: opte `lib/oxide-vpc/src/engine/firewall.rs` (inbound default deny, a rule
//!   without filters matches everything), `lib/opte/src/engine/layer.rs` (lowest priority
//!   number first, deny before allow at the same priority), and
//!   `lib/oxide-vpc/src/engine/overlay.rs` (only traffic that arrived over the VPC carries
//!   the VNI a `vpc` host filter matches; traffic through the rack's external addresses,
//!   including a member's own hairpin to a floating IP, is external).
//!
//! Not here: what listens on the addresses (`net`, `boot`) and how a dropped connection looks
//! to a client (the listener gate in `net` never answers it).

use std::net::{IpAddr, Ipv4Addr};

use chrono::Utc;
use http::StatusCode;
use oxide::types;
use uuid::Uuid;

use super::error::ApiError;
use super::handler::{Ctx, Reply, body_name};
use super::names::Ref;
use super::store::{Project, Store, query_ref};

/// Nexus's caps (`MAX_FW_RULES_PER_VPC`, `MAX_FW_RULE_PARTS`).
const MAX_RULES: usize = 1024;
const MAX_PARTS: usize = 256;
use super::firewall_rules::{self, DEFAULT_VPC, materialize};

/// Where a connection comes from, as the target's firewall sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// From an instance of the same VPC, over the VPC, with its private address.
    Vpc(IpAddr),
    /// From anywhere else: the host, the internet, or a member that went out through the
    /// rack's external addresses (NAT) and came back to a floating or ephemeral IP.
    External(IpAddr),
}

impl Source {
    fn ip(self) -> IpAddr {
        match self {
            Source::Vpc(ip) | Source::External(ip) => ip,
        }
    }
}

/// The transport protocol of a connection or datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// The instance a connection is for, as the rules name it.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub name: &'a str,
    pub private_ip: Ipv4Addr,
}

/// Nexus's checks on a replacement rule list (all before anything changes).
pub fn check_update(params: &types::VpcFirewallRuleUpdateParams) -> Result<(), ApiError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut dupes = std::collections::BTreeSet::new();
    for r in &params.rules {
        body_name(&r.name)?;
        if !seen.insert(r.name.as_str()) {
            dupes.insert(format!("\"{}\"", r.name.as_str()));
        }
    }
    if !dupes.is_empty() {
        return Err(ApiError::invalid_value(
            "rules",
            format!(
                "Rule names must be unique. Duplicates: [{}]",
                dupes.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let max = |len: usize, label: &str, max: usize| {
        if len > max {
            Err(ApiError::invalid_value(label, format!("max length {max}")))
        } else {
            Ok(())
        }
    };
    max(params.rules.len(), "rules", MAX_RULES)?;
    // Port numbers are `NonZeroU16`s: a bad one fails the body's deserialisation, before
    // any rule is looked at.
    for r in &params.rules {
        for p in r.filters.ports.iter().flatten() {
            parse_port_range(p).map_err(ApiError::bad_body)?;
        }
    }
    // Then per rule, in nexus's order (`VpcFirewallRule::new`): targets, hosts, ports, protocols.
    for r in &params.rules {
        max(r.targets.len(), "targets", MAX_PARTS)?;
        let f = &r.filters;
        max(
            f.hosts.as_ref().map_or(0, Vec::len),
            "filters.hosts",
            MAX_PARTS,
        )?;
        max(
            f.ports.as_ref().map_or(0, Vec::len),
            "filters.ports",
            MAX_PARTS,
        )?;
        for p in f.ports.iter().flatten() {
            port_range(p)?;
        }
        max(
            f.protocols.as_ref().map_or(0, Vec::len),
            "filters.protocols",
            MAX_PARTS,
        )?;
        for proto in f.protocols.iter().flatten() {
            if let types::VpcFirewallRuleProtocol::Icmp(Some(types::VpcFirewallIcmpFilter {
                code: Some(code),
                ..
            })) = proto
            {
                let bounds = match code.split_once('-') {
                    Some((a, b)) => a.parse::<u8>().ok().zip(b.parse::<u8>().ok()),
                    None => code.parse::<u8>().ok().map(|c| (c, c)),
                };
                if bounds.is_some_and(|(first, last)| last < first) {
                    return Err(ApiError::invalid_value(
                        "code",
                        "range has larger start value than end value",
                    ));
                }
            }
        }
        for t in &r.targets {
            if let types::VpcFirewallRuleTarget::Vpc(n)
            | types::VpcFirewallRuleTarget::Subnet(n)
            | types::VpcFirewallRuleTarget::Instance(n) = t
            {
                body_name(n)?;
            }
        }
    }
    Ok(())
}

/// Nexus refuses a list that names another VPC before it writes anything
/// (`ensure_no_cross_vpc_references`): rule by rule, a `vpc` target, then a `vpc` host
/// filter, whose name is not the VPC's own. Subnet and instance names are not checked here:
/// they name things inside the VPC and are only looked up when the rules are pushed.
fn check_same_vpc(rules: &[types::VpcFirewallRuleUpdate], vpc: &str) -> Result<(), ApiError> {
    for r in rules {
        let other_target = r
            .targets
            .iter()
            .any(|t| matches!(t, types::VpcFirewallRuleTarget::Vpc(n) if n.as_str() != vpc));
        if other_target {
            return Err(ApiError::invalid_request(
                "cross-VPC firewall target unsupported",
            ));
        }
        let other_host =
            r.filters.hosts.iter().flatten().any(
                |h| matches!(h, types::VpcFirewallRuleHostFilter::Vpc(n) if n.as_str() != vpc),
            );
        if other_host {
            return Err(ApiError::invalid_request(
                "cross-VPC firewall host filter unsupported",
            ));
        }
    }
    Ok(())
}

/// nexus's `L4PortRange::from_str`: "22" or "8000-8080", ports are `NonZeroU16`; the error
/// texts are `L4PortRangeError`'s.
fn parse_port_range(p: &str) -> Result<(u16, u16), String> {
    let parse = |s: &str| {
        s.parse::<std::num::NonZeroU16>()
            .map(std::num::NonZeroU16::get)
            .map_err(|e| format!("{s:?} unparsable for type: {e}"))
    };
    match p.split_once('-') {
        None => parse(p).map(|one| (one, one)),
        Some(("", _)) => Err("range has no start value".into()),
        Some((_, "")) => Err("range has no end value".into()),
        Some((a, b)) => Ok((parse(a)?, parse(b)?)),
    }
}

/// An `L4PortRange` as an inclusive range; a reversed one is nexus's
/// `L4PortRangeError::EmptyRange` (400 `InvalidValue` "l4_port_range").
fn port_range(p: &types::L4PortRange) -> Result<(u16, u16), ApiError> {
    let (first, last) = parse_port_range(p).map_err(ApiError::bad_body)?;
    if last < first {
        return Err(ApiError::invalid_value(
            "l4_port_range",
            "range has larger start value than end value",
        ));
    }
    Ok((first, last))
}

fn net_contains(net: &types::IpNet, ip: IpAddr) -> bool {
    let (base, prefix) = match net.to_string().split_once('/') {
        Some((b, p)) => match (b.parse::<IpAddr>(), p.parse::<u32>()) {
            (Ok(b), Ok(p)) => (b, p),
            _ => return false,
        },
        None => return false,
    };
    match (base, ip) {
        (IpAddr::V4(b), IpAddr::V4(i)) if prefix <= 32 => {
            let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
            u32::from(b) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(b), IpAddr::V6(i)) if prefix <= 128 => {
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            u128::from(b) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

/// Private address of instance `name` in the same VPC, for `instance` targets/filters.
type Resolve<'a> = &'a dyn Fn(&str) -> Option<Ipv4Addr>;

fn targets_match(rule: &types::VpcFirewallRule, t: Target<'_>) -> bool {
    let ip = IpAddr::V4(t.private_ip);
    // A rule without targets applies to every NIC (omicron
    // `illumos-utils/src/opte/firewall_rules.rs` `opte_firewall_rules`).
    if rule.targets.is_empty() {
        return true;
    }
    rule.targets.iter().any(|target| match target {
        types::VpcFirewallRuleTarget::Vpc(n) | types::VpcFirewallRuleTarget::Subnet(n) => {
            n.as_str() == DEFAULT_VPC
        }
        types::VpcFirewallRuleTarget::Instance(n) => n.as_str() == t.name,
        types::VpcFirewallRuleTarget::Ip(a) => *a == ip,
        types::VpcFirewallRuleTarget::IpNet(net) => net_contains(net, ip),
    })
}

fn host_matches(h: &types::VpcFirewallRuleHostFilter, src: Source, resolve: Resolve<'_>) -> bool {
    match h {
        // A VNI match: only traffic that came over this VPC carries it.
        types::VpcFirewallRuleHostFilter::Vpc(n) => {
            n.as_str() == DEFAULT_VPC && matches!(src, Source::Vpc(_))
        }
        // The subnet's private range; an external source address is never in it because
        // the simulator's private and external addresses come from different ranges.
        types::VpcFirewallRuleHostFilter::Subnet(n) => {
            n.as_str() == DEFAULT_VPC && matches!(src, Source::Vpc(_))
        }
        types::VpcFirewallRuleHostFilter::Instance(n) => {
            resolve(n.as_str()).is_some_and(|ip| src == Source::Vpc(IpAddr::V4(ip)))
        }
        types::VpcFirewallRuleHostFilter::Ip(a) => *a == src.ip(),
        types::VpcFirewallRuleHostFilter::IpNet(net) => net_contains(net, src.ip()),
    }
}

fn filters_match(
    f: &types::VpcFirewallRuleFilter,
    src: Source,
    proto: Proto,
    port: u16,
    resolve: Resolve<'_>,
) -> bool {
    let hosts = f
        .hosts
        .as_ref()
        .filter(|h| !h.is_empty())
        .is_none_or(|h| h.iter().any(|h| host_matches(h, src, resolve)));
    let protocols = f
        .protocols
        .as_ref()
        .filter(|p| !p.is_empty())
        .is_none_or(|p| {
            p.iter().any(|p| match p {
                types::VpcFirewallRuleProtocol::Tcp => proto == Proto::Tcp,
                types::VpcFirewallRuleProtocol::Udp => proto == Proto::Udp,
                _ => false,
            })
        });
    let ports = f.ports.as_ref().filter(|p| !p.is_empty()).is_none_or(|p| {
        p.iter()
            .filter_map(|r| port_range(r).ok())
            .any(|(a, b)| (a..=b).contains(&port))
    });
    hosts && protocols && ports
}

/// Whether inbound `proto` traffic from `src` to `port` of `target` gets through `rules`:
/// the enabled inbound rule with the lowest priority number that targets the instance and
/// whose filters all match decides (deny first at equal priority); no match means deny.
/// A rule naming several protocols or hosts matches when any of them does: sled-agent
/// unrolls it into one opte rule per protocol and host at the same priority and action
/// (omicron `illumos-utils/src/opte/firewall_rules.rs` `opte_firewall_rules`).
pub fn allows(
    rules: &[types::VpcFirewallRule],
    target: Target<'_>,
    src: Source,
    proto: Proto,
    port: u16,
    resolve: Resolve<'_>,
) -> bool {
    let mut matching: Vec<&types::VpcFirewallRule> = rules
        .iter()
        .filter(|r| {
            r.status == types::VpcFirewallRuleStatus::Enabled
                && r.direction == types::VpcFirewallRuleDirection::Inbound
                && targets_match(r, target)
                && filters_match(&r.filters, src, proto, port, resolve)
        })
        .collect();
    matching.sort_by_key(|r| (r.priority, r.action != types::VpcFirewallRuleAction::Deny));
    matching
        .first()
        .is_some_and(|r| r.action == types::VpcFirewallRuleAction::Allow)
}

/// Resolves the `vpc` (and optional `project`) query parameters to the project owning it.
pub(super) fn select_vpc(store: &Store, cx: &Ctx<'_>) -> Result<Uuid, ApiError> {
    let raw = cx
        .query
        .get("vpc")
        .ok_or_else(|| ApiError::bad_query("missing field `vpc`"))?;
    select_vpc_ref(store, query_ref(raw)?, cx.project())
}

/// The project whose VPC `vpc` names (with `project`, a name; alone, an id). A deleted VPC
/// is not found, as nexus's lookup skips deleted rows.
pub(super) fn select_vpc_ref(
    store: &Store,
    vpc: Ref,
    project: Option<&str>,
) -> Result<Uuid, ApiError> {
    let project = project.map(query_ref).transpose()?;
    match (vpc, project) {
        (Ref::Name(n), Some(p)) => {
            let pid = store.project_id(&p)?;
            let live = store.projects.get(&pid).is_some_and(|p| !p.vpc_deleted);
            if n == DEFAULT_VPC && live {
                Ok(pid)
            } else {
                Err(ApiError::not_found_by_name("vpc", &n))
            }
        }
        (Ref::Id(id), None) => store
            .projects
            .values()
            .find(|p| p.vpc_id == id && !p.vpc_deleted)
            .map(|p| p.id)
            .ok_or_else(|| ApiError::not_found_by_id("vpc", &id)),
        (Ref::Id(_), Some(_)) => Err(ApiError::invalid_request(
            "when providing vpc as an ID, project should not be specified",
        )),
        (Ref::Name(_), None) => Err(ApiError::invalid_request(
            "vpc should either be an ID or project should be specified",
        )),
    }
}

fn project<'s>(store: &'s Store, id: &Uuid) -> Result<&'s Project, ApiError> {
    store.projects.get(id).ok_or_else(ApiError::internal)
}

/// `GET /v1/vpc-firewall-rules`.
pub fn view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let pid = select_vpc(cx.store, cx)?;
    let rules = project(cx.store, &pid)?.firewall_rules.clone();
    Reply::json(StatusCode::OK, &types::VpcFirewallRules { rules })
}

/// `PUT /v1/vpc-firewall-rules`: replaces the whole list.
pub fn update(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let pid = select_vpc(cx.store, cx)?;
    let params: types::VpcFirewallRuleUpdateParams = cx
        .body::<firewall_rules::VpcFirewallRuleUpdateParams>()?
        .into();
    check_update(&params)?;
    check_same_vpc(&params.rules, DEFAULT_VPC)?;
    let vpc_id = project(cx.store, &pid)?.vpc_id;
    let rules = materialize(vpc_id, params.rules);
    let p = cx
        .store
        .projects
        .get_mut(&pid)
        .ok_or_else(ApiError::internal)?;
    if cx.env.faults.overwritten_firewall_writes > 0 {
        // Another writer's PUT lands right after this one, with the list as it was before.
        for r in &mut p.firewall_rules {
            r.id = Uuid::new_v4();
            r.time_modified = Utc::now();
        }
        cx.fx.firewall_write_overwritten = true;
    } else {
        p.firewall_rules = rules.clone();
    }
    Reply::json(StatusCode::OK, &types::VpcFirewallRules { rules })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::oxide::firewall_rules::default_rules;

    fn target() -> Target<'static> {
        Target {
            name: "web-1",
            private_ip: Ipv4Addr::new(127, 30, 0, 5),
        }
    }

    fn none(_: &str) -> Option<Ipv4Addr> {
        None
    }

    fn with(extra: Vec<types::VpcFirewallRuleUpdate>) -> Vec<types::VpcFirewallRule> {
        let mut rules = default_rules();
        rules.extend(extra);
        materialize(Uuid::new_v4(), rules)
    }

    fn allow_6443_from(net: &str, priority: u16, action: &str) -> types::VpcFirewallRuleUpdate {
        serde_json::from_value(serde_json::json!({
            "name": format!("k8s-{priority}-{action}"), "description": "",
            "action": action, "direction": "inbound", "status": "enabled",
            "priority": priority, "targets": [{"type": "vpc", "value": "default"}],
            "filters": {"hosts": [{"type": "ip_net", "value": net}],
                        "protocols": [{"type": "tcp"}], "ports": ["6443"]}
        }))
        .unwrap()
    }

    #[test]
    fn the_default_rules_admit_ssh_from_anywhere_and_everything_from_the_vpc_only() {
        let rules = with(Vec::new());
        let ext = Source::External("203.0.113.9".parse().unwrap());
        let vpc = Source::Vpc("127.30.0.6".parse().unwrap());
        assert!(allows(&rules, target(), ext, Proto::Tcp, 22, &none));
        assert!(!allows(&rules, target(), ext, Proto::Tcp, 6443, &none));
        assert!(allows(&rules, target(), vpc, Proto::Tcp, 6443, &none));
    }

    #[test]
    fn a_member_coming_back_through_a_floating_ip_is_external() {
        // Same machine, but via NAT: the VPC host filter does not match it.
        let rules = with(Vec::new());
        let hairpin = Source::External("127.100.0.7".parse().unwrap());
        assert!(!allows(&rules, target(), hairpin, Proto::Tcp, 6443, &none));
    }

    #[test]
    fn host_filters_match_cidrs_and_deny_wins_at_equal_priority() {
        let rules = with(vec![allow_6443_from("203.0.113.0/24", 100, "allow")]);
        let inside = Source::External("203.0.113.200".parse().unwrap());
        let outside = Source::External("198.51.100.1".parse().unwrap());
        assert!(allows(&rules, target(), inside, Proto::Tcp, 6443, &none));
        assert!(!allows(&rules, target(), outside, Proto::Tcp, 6443, &none));
        let rules = with(vec![
            allow_6443_from("0.0.0.0/0", 100, "allow"),
            allow_6443_from("203.0.113.0/24", 100, "deny"),
        ]);
        assert!(!allows(&rules, target(), inside, Proto::Tcp, 6443, &none));
        assert!(allows(&rules, target(), outside, Proto::Tcp, 6443, &none));
    }

    #[test]
    fn duplicate_names_and_empty_port_ranges_are_refused() {
        let mut params = types::VpcFirewallRuleUpdateParams {
            rules: default_rules(),
        };
        params.rules.push(default_rules().remove(0));
        let e = check_update(&params).unwrap_err();
        assert!(
            e.message
                .contains("Duplicates: [\"allow-internal-inbound\"]"),
            "{e:?}"
        );
        let mut bad = allow_6443_from("0.0.0.0/0", 1, "allow");
        bad.filters.ports = Some(vec![types::L4PortRange::try_from("90-80").unwrap()]);
        assert!(check_update(&types::VpcFirewallRuleUpdateParams { rules: vec![bad] }).is_err());
    }

    fn rule(json: serde_json::Value) -> types::VpcFirewallRuleUpdate {
        serde_json::from_value(json).unwrap()
    }

    /// Two clusters' member rules as the product writes them (allow from members at 65000,
    /// deny from the VPC at 65001, tcp and udp on the same ports).
    fn member_rules(cluster: &str, members: &[&str]) -> Vec<types::VpcFirewallRuleUpdate> {
        let instances = |kind: &str| -> Vec<serde_json::Value> {
            members
                .iter()
                .map(|m| serde_json::json!({"type": kind, "value": m}))
                .collect()
        };
        let ports = ["2379-2380", "6443", "8472", "10250"];
        let protocols = serde_json::json!([{"type": "tcp"}, {"type": "udp"}]);
        vec![
            rule(serde_json::json!({
                "name": format!("{cluster}-members"), "description": "", "action": "allow",
                "direction": "inbound", "status": "enabled", "priority": 65000,
                "targets": instances("instance"),
                "filters": {"hosts": instances("instance"), "protocols": protocols, "ports": ports}
            })),
            rule(serde_json::json!({
                "name": format!("{cluster}-isolate"), "description": "", "action": "deny",
                "direction": "inbound", "status": "enabled", "priority": 65001,
                "targets": instances("instance"),
                "filters": {"hosts": [{"type": "vpc", "value": "default"}],
                            "protocols": protocols, "ports": ports}
            })),
        ]
    }

    #[test]
    fn member_rules_keep_two_clusters_of_one_vpc_apart_on_tcp_and_udp() {
        let mut extra = member_rules("a", &["a-cp", "a-w"]);
        extra.extend(member_rules("b", &["b-cp", "b-w"]));
        let rules = with(extra);
        let addr = |n: &str| -> Option<Ipv4Addr> {
            Some(match n {
                "a-cp" => Ipv4Addr::new(172, 30, 0, 5),
                "a-w" => Ipv4Addr::new(172, 30, 0, 6),
                "b-cp" => Ipv4Addr::new(172, 30, 0, 7),
                "b-w" => Ipv4Addr::new(172, 30, 0, 8),
                _ => return None,
            })
        };
        let at = |n: &'static str| Target {
            name: n,
            private_ip: addr(n).unwrap(),
        };
        let from = |n: &str| Source::Vpc(IpAddr::V4(addr(n).unwrap()));
        for (proto, port) in [(Proto::Tcp, 10250), (Proto::Udp, 8472), (Proto::Tcp, 2379)] {
            assert!(allows(&rules, at("b-w"), from("b-cp"), proto, port, &addr));
            assert!(allows(&rules, at("a-cp"), from("a-w"), proto, port, &addr));
            assert!(
                !allows(&rules, at("b-w"), from("a-w"), proto, port, &addr),
                "{proto:?}/{port}"
            );
            assert!(
                !allows(&rules, at("a-cp"), from("b-cp"), proto, port, &addr),
                "{proto:?}/{port}"
            );
        }
        // Ports the member rules do not name keep what `allow-internal-inbound` admits.
        assert!(allows(
            &rules,
            at("b-w"),
            from("a-w"),
            Proto::Tcp,
            30080,
            &addr
        ));
        // A UDP rule does not admit TCP, nor a TCP rule UDP.
        let rules = with(vec![allow_6443_from("0.0.0.0/0", 100, "allow")]);
        let ext = Source::External("203.0.113.9".parse().unwrap());
        assert!(allows(&rules, target(), ext, Proto::Tcp, 6443, &none));
        assert!(!allows(&rules, target(), ext, Proto::Udp, 6443, &none));
    }

    #[test]
    fn a_rule_without_targets_applies_to_every_instance() {
        let rules = materialize(
            Uuid::new_v4(),
            vec![rule(serde_json::json!({
                "name": "everything", "description": "", "action": "allow",
                "direction": "inbound", "status": "enabled", "priority": 1,
                "targets": [], "filters": {}
            }))],
        );
        let ext = Source::External("203.0.113.9".parse().unwrap());
        assert!(allows(&rules, target(), ext, Proto::Udp, 8472, &none));
    }
}
