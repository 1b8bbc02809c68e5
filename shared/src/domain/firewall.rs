//! The one VPC firewall rule oxide-controller owns: inbound TCP to the Kubernetes API
//! (6443) of the project's instances, from the sources the operator names with
//! `--api-allow`. Pure: the rule's shape and the parsing of its sources.
//!
//! A new project's VPC admits only traffic from inside the VPC, SSH and ICMP (omicron
//! `nexus/defaults/src/lib.rs`), so without this rule the API on the floating IP is dropped.
//! The rule list is replaced as a whole on the rack (`PUT /v1/vpc-firewall-rules`), so the
//! adapter reads it, changes only the rule named [`api_rule_name`] and writes it back only
//! when that rule differs: every other rule stays as it was, and a re-run writes nothing.
//!
//! Not here: the read-modify-write itself (`oxide_rack`), and how members reach a
//! server (they use its private VPC address, which the default `allow-internal-inbound`
//! admits: see docs/DESIGN-NOTES.md "Networking").

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

/// A firewall rule oxide-controller owns: inbound TCP on one port of every instance in the
/// project's `default` VPC, from `sources`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpAllowRule {
    pub name: String,
    pub description: String,
    pub port: u16,
    pub sources: Vec<Cidr>,
}

/// What ensuring a rule did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleChange {
    /// The rule was there exactly as wanted; nothing was written.
    Unchanged,
    Created,
    Updated,
}

/// Name of the API rule of `cluster`.
pub fn api_rule_name(cluster: &str) -> String {
    format!("{cluster}-k8s-api")
}

/// The API rule of `cluster`.
pub fn api_rule(cluster: &str, sources: Vec<Cidr>) -> TcpAllowRule {
    TcpAllowRule {
        name: api_rule_name(cluster),
        description: format!(
            "oxide-controller: Kubernetes API (tcp/{API_PORT}) of cluster {cluster}"
        ),
        port: API_PORT,
        sources,
    }
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
    fn the_api_rule_is_named_for_the_cluster() {
        let r = api_rule("demo", parse_sources("0.0.0.0/0").unwrap());
        assert_eq!(r.name, "demo-k8s-api");
        assert_eq!(r.port, 6443);
    }
}
