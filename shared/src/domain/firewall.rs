//! The VPC firewall rules oxide-controller owns, each named after its cluster: the
//! Kubernetes API (tcp/6443 of its servers) from `--api-allow`; SSH (tcp/22) from `--ssh-allow` only; and
//! the cluster's internal ports (etcd, supervisor, kubelet, VXLAN) from its own members only.
//! Pure: the rules' shapes and the parsing of their sources.
//!
//! A new project's VPC admits traffic from inside the VPC, SSH from anywhere and ICMP
//! (omicron `nexus/defaults/src/lib.rs`), and denies the rest inbound. The rule list is
//! replaced as a whole on the rack (`PUT /v1/vpc-firewall-rules`), so the adapter reads it,
//! changes only rules with our names and writes it back only when one of ours differs: every
//! other rule (nexus's defaults included) stays as it was, and a re-run writes nothing.
//! Narrowing what a default admits is done with our deny rules ahead of it, never by editing
//! the default (docs/DESIGN-NOTES.md "Network exposure").
//!
//! Not here: the read-modify-write itself (`oxide_rack`), and how members reach a
//! server (they use its private VPC address: see docs/DESIGN-NOTES.md "Networking").

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::domain::spec::API_PORT;

/// `--api-allow` when none is given: anywhere. The Kubernetes API authenticates every request
/// (client certificates, tokens); operators who know their addresses narrow this.
pub const DEFAULT_API_ALLOW: &str = "0.0.0.0/0";

/// An IPv4 or IPv6 network, `ADDR/PREFIX` (a bare address means a single host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR (e.g. 203.0.113.0/24)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        // The rack stores the network as given; a host part set below the prefix is almost
        // always a typo for a different network, so say so instead of widening silently.
        let host_bits = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)) & (u128::from(u32::MAX) >> prefix),
            IpAddr::V6(a) => u128::from(a) & u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0),
        };
        if host_bits != 0 {
            return Err(format!(
                "{s:?} has host bits set below /{prefix}; write the network address"
            ));
        }
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Parses `--api-allow`: comma-separated CIDRs or addresses, at least one.
pub fn parse_sources(s: &str) -> Result<Vec<Cidr>, String> {
    let out: Vec<Cidr> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err("give at least one CIDR (0.0.0.0/0 for anywhere)".into());
    }
    // The rack allows at most 256 host filters per rule.
    if out.len() > 256 {
        return Err(format!(
            "{} sources; the rack allows at most 256",
            out.len()
        ));
    }
    Ok(out)
}

/// What an owned rule does to the traffic it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// A transport protocol an owned rule filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

/// The instances an owned rule applies to (the rack resolves these to NICs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleTargets {
    /// Every instance of the project's `default` VPC.
    Vpc,
    /// The named instances of the project.
    Instances(Vec<String>),
}

/// Where the traffic an owned rule matches comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleHosts {
    /// Anywhere (no host filter).
    Any,
    /// Any instance of the `default` VPC, over the VPC (a VNI match: never external traffic).
    Vpc,
    /// These networks.
    Cidrs(Vec<Cidr>),
    /// The private addresses of the named instances.
    Instances(Vec<String>),
    /// Whatever the rule of this name has at the rack: a rule only retargeted (the reconcile
    /// keeps the API rule on the cluster's servers without knowing `--api-allow`). A rule of
    /// this name that does not exist is not created.
    Kept,
}

/// A firewall rule oxide-controller owns in the project's `default` VPC (inbound, enabled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRule {
    pub name: String,
    pub description: String,
    pub action: Action,
    /// Lower numbers are evaluated first; the defaults nexus writes have 65534.
    pub priority: u16,
    pub targets: RuleTargets,
    pub hosts: RuleHosts,
    pub protocols: Vec<Protocol>,
    /// Inclusive port ranges.
    pub ports: Vec<(u16, u16)>,
}

/// What ensuring a rule did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleChange {
    /// The rule was there exactly as wanted; nothing was written.
    Unchanged,
    Created,
    Updated,
}

/// The priority of nexus's default rules, and of the API rule.
pub const DEFAULT_PRIORITY: u16 = 65534;
/// Our allow rules that must win over our deny rules (and over the defaults).
pub const ALLOW_PRIORITY: u16 = 65000;
/// Our deny rules: after our allows, before nexus's defaults (`allow-internal-inbound`,
/// `allow-ssh`), so they narrow what the defaults admit. A user's rule with a lower number
/// still wins over all of ours.
pub const DENY_PRIORITY: u16 = 65001;

/// The ports only a cluster's own members may reach on its members: etcd (tcp 2379-2380),
/// the k3s supervisor and API (tcp 6443), flannel VXLAN (udp 8472), the kubelet (tcp 10250)
/// and flannel's wireguard-native backend (udp 51820-51821), from k3s's "Inbound Rules for
/// K3s Nodes" (docs.k3s.io/installation/requirements). Both protocols on each range: a rule's
/// protocol and port filters are independent, and the other protocol on these ports is
/// nothing anyone else needs either.
pub const INTERNAL_PORTS: [(u16, u16); 5] = [
    (2379, 2380),
    (API_PORT, API_PORT),
    (8472, 8472),
    (10250, 10250),
    (51820, 51821),
];

/// The rack's cap on targets and on host filters of one rule (omicron
/// `VPC_FIREWALL_RULE_MAX_FILTER_LEN`, `MAX_FW_RULE_PARTS`).
pub const MAX_RULE_PARTS: usize = 256;

/// Name of the API rule of `cluster`.
pub fn api_rule_name(cluster: &str) -> String {
    format!("{cluster}-k8s-api")
}

/// The API rule of `cluster`: tcp/6443 of its `servers` (by name) from `sources`. Named
/// servers, not the VPC: a project holding two clusters must not have one cluster's
/// `--api-allow` open the other's servers (audit security-2 N11). The rack resolves the names
/// each time it sends the rules, so the rule names every server the API floating IP may be
/// attached to: bootstrap writes it with the servers there are and the first one, the
/// reconcile keeps it so ([`api_rule_servers`]) before it creates a server.
pub fn api_rule(cluster: &str, sources: Vec<Cidr>, servers: &[String]) -> OwnedRule {
    let mut servers = servers.to_vec();
    servers.sort();
    servers.dedup();
    OwnedRule {
        name: api_rule_name(cluster),
        description: format!(
            "oxide-controller: Kubernetes API (tcp/{API_PORT}) of cluster {cluster}"
        ),
        action: Action::Allow,
        priority: DEFAULT_PRIORITY,
        targets: RuleTargets::Instances(servers),
        hosts: RuleHosts::Cidrs(sources),
        protocols: vec![Protocol::Tcp],
        ports: vec![(API_PORT, API_PORT)],
    }
}

/// The instances the API rule of `cluster` names, from the project's `(name, description)`:
/// its servers (members of pool `control_plane_pool`) and its restore-drill servers, which a
/// laptop's drill reaches through their own address (`bootstrap recover --verify`).
pub fn api_servers<'a>(
    cluster: &str,
    control_plane_pool: &str,
    instances: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<String> {
    instances
        .into_iter()
        .filter(|(_, description)| {
            crate::base::names::InstanceTag::parse(description)
                .is_some_and(|t| t.cluster == cluster && t.pool == control_plane_pool)
                || crate::domain::backup::drill::server_of(description) == Some(cluster)
        })
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The API rule of `cluster` aimed at `servers`, its sources as the rack has them
/// ([`RuleHosts::Kept`]): what a reconcile run ensures. `None` with no server, or more than a
/// rule can name.
pub fn api_rule_servers(cluster: &str, servers: &[String]) -> Option<OwnedRule> {
    if servers.is_empty() || servers.len() > MAX_RULE_PARTS {
        return None;
    }
    let mut rule = api_rule(cluster, Vec::new(), servers);
    rule.hosts = RuleHosts::Kept;
    Some(rule)
}

/// Names of the SSH rules of `cluster`: the allow, then the deny.
pub fn ssh_rule_names(cluster: &str) -> [String; 2] {
    [format!("{cluster}-ssh"), format!("{cluster}-ssh-deny")]
}

/// The SSH rules of `cluster`: tcp/22 of the project's instances from `sources` only.
/// nexus's default `allow-ssh` (tcp/22 from anywhere, priority 65534) stays as it is: our
/// deny (from anywhere, [`DENY_PRIORITY`]) comes before it and our allow before that, so
/// the default never decides. The deny covers the whole VPC, as SSH from anywhere did:
/// every cluster in the project adds its own allow, so SSH is open to the union of their
/// `--ssh-allow` lists (docs/DESIGN-NOTES.md "Network exposure").
pub fn ssh_rules(cluster: &str, sources: Vec<Cidr>) -> [OwnedRule; 2] {
    let [allow, deny] = ssh_rule_names(cluster);
    let rule = |name, action, priority, hosts, what: &str| OwnedRule {
        name,
        description: format!("oxide-controller: SSH (tcp/22) {what}, for cluster {cluster}"),
        action,
        priority,
        targets: RuleTargets::Vpc,
        hosts,
        protocols: vec![Protocol::Tcp],
        ports: vec![(22, 22)],
    };
    [
        rule(
            allow,
            Action::Allow,
            ALLOW_PRIORITY,
            RuleHosts::Cidrs(sources),
            "from --ssh-allow",
        ),
        rule(
            deny,
            Action::Deny,
            DENY_PRIORITY,
            RuleHosts::Any,
            "from anywhere else",
        ),
    ]
}

/// Names of the member rules of `cluster`: the allow, then the deny.
pub fn member_rule_names(cluster: &str) -> [String; 2] {
    [format!("{cluster}-members"), format!("{cluster}-isolate")]
}

/// The member rules of `cluster`: [`INTERNAL_PORTS`] of its members admitted from its
/// members, and denied from every other VPC instance (the default `allow-internal-inbound`
/// would admit them). `None` when there is no member, or more than a rule can name
/// ([`MAX_RULE_PARTS`]). Members are named, not addressed: the rack resolves the names to
/// the NICs' addresses each time it sends the rules to the sleds.
pub fn member_rules(cluster: &str, members: &[String]) -> Option<[OwnedRule; 2]> {
    if members.is_empty() || members.len() > MAX_RULE_PARTS {
        return None;
    }
    let mut names = members.to_vec();
    names.sort();
    names.dedup();
    let [allow, deny] = member_rule_names(cluster);
    let rule = |name, action, priority, hosts, what: &str| OwnedRule {
        name,
        description: format!(
            "oxide-controller: etcd, k3s supervisor, kubelet, VXLAN of cluster {cluster} {what}"
        ),
        action,
        priority,
        targets: RuleTargets::Instances(names.clone()),
        hosts,
        protocols: vec![Protocol::Tcp, Protocol::Udp],
        ports: INTERNAL_PORTS.to_vec(),
    };
    Some([
        rule(
            allow,
            Action::Allow,
            ALLOW_PRIORITY,
            RuleHosts::Instances(names.clone()),
            "from its members",
        ),
        rule(
            deny,
            Action::Deny,
            DENY_PRIORITY,
            RuleHosts::Vpc,
            "from the rest of the VPC",
        ),
    ])
}

/// Every rule name `cluster` may own, for `bootstrap delete`.
pub fn owned_rule_names(cluster: &str) -> Vec<String> {
    let mut out = vec![api_rule_name(cluster)];
    out.extend(ssh_rule_names(cluster));
    out.extend(member_rule_names(cluster));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_networks_and_single_addresses() {
        let got = parse_sources("203.0.113.0/24, 198.51.100.7,2001:db8::/32").unwrap();
        let shown: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["203.0.113.0/24", "198.51.100.7/32", "2001:db8::/32"]
        );
        assert_eq!(
            parse_sources(DEFAULT_API_ALLOW).unwrap()[0].to_string(),
            "0.0.0.0/0"
        );
    }

    #[test]
    fn bad_sources_say_what_to_write() {
        for (bad, says) in [
            ("", "at least one"),
            ("10.0.0.0/33", "prefix length"),
            ("example.com", "not an IP address"),
            ("10.1.2.3/8", "host bits"),
        ] {
            let e = parse_sources(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_api_rule_is_named_for_the_cluster_and_aims_at_its_servers_only() {
        let servers = ["demo-cp-b".to_owned(), "demo-cp-a".to_owned()];
        let r = api_rule("demo", parse_sources("0.0.0.0/0").unwrap(), &servers);
        assert_eq!(r.name, "demo-k8s-api");
        assert_eq!(r.ports, [(6443, 6443)]);
        // Not the VPC: another cluster's servers in the project are not opened (N11).
        assert_eq!(
            r.targets,
            RuleTargets::Instances(vec!["demo-cp-a".into(), "demo-cp-b".into()])
        );
        let tag = |pool: &str| {
            crate::base::names::InstanceTag {
                cluster: "demo".into(),
                pool: pool.into(),
                spec_hash: "h".into(),
            }
            .to_string()
        };
        let drill = crate::domain::backup::drill::server_description("demo", "b1");
        let other = crate::domain::backup::drill::server_description("demo-2", "b1");
        let (cp, workers) = (tag("control-plane"), tag("workers"));
        let listed = [
            ("demo-control-plane-a", cp.as_str()),
            ("demo-workers-b", workers.as_str()),
            ("demo-drill-control-plane-c", drill.as_str()),
            ("demo-2-drill-control-plane-d", other.as_str()),
            ("hand-made", "a VM someone made"),
        ];
        assert_eq!(
            api_servers("demo", "control-plane", listed),
            ["demo-control-plane-a", "demo-drill-control-plane-c"]
        );
        let kept = api_rule_servers("demo", &servers).unwrap();
        assert_eq!((kept.hosts, kept.targets), (RuleHosts::Kept, r.targets));
        assert_eq!(api_rule_servers("demo", &[]), None);
    }
}
