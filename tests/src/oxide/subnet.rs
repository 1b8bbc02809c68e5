//! A project's `default` VPC subnet: the /22 nexus creates with every project, its reserved
//! addresses, and where its addresses live on this machine.
//!
//! On a rack the subnet is `172.30.0.0/22` in every project (omicron
//! `nexus/defaults/src/lib.rs` `DEFAULT_VPC_SUBNET_IPV4_BLOCK`); nexus never hands out its
//! first five addresses nor its last (omicron `common/src/address.rs`
//! `NUM_INITIAL_RESERVED_IP_ADDRESSES`, `nexus/db-model/src/ipv4net.rs`
//! `check_requestable_addr`), so 1,018 NICs fit. The simulator keeps that arithmetic and lays
//! each subnet onto its own /22 of loopback addresses at the same offsets (`172.30.0.0 + n` is
//! `base + n`), so instances of several projects, and of simulators running side by side, each
//! have a private address something can listen on.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// Prefix length of the default VPC subnet.
pub const PREFIX_LEN: u8 = 22;
/// The rack's default VPC subnet block, as the API shows it.
pub const RACK_BLOCK: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 0);
/// Addresses at the start of every subnet that nexus keeps for itself.
pub const RESERVED_FRONT: u32 = 5;

const SIZE: u32 = 1 << (32 - PREFIX_LEN);

/// Loopback /22s handed to projects: `127.16.0.0` – `127.99.255.255`, apart from the external
/// pool's `127.100-227.x.x` and the tailnet's `127.228-254.x.x`.
const LOOPBACK_SECOND_OCTETS: std::ops::RangeInclusive<u8> = 16..=99;
const PER_SECOND_OCTET: u32 = 256 / (SIZE / 256);

/// One project's default subnet: which host offsets are in use.
#[derive(Clone, Debug)]
pub struct VpcSubnet {
    /// First loopback address of the /22 standing in for `172.30.0.0`.
    base: Ipv4Addr,
    used: BTreeSet<u32>,
}

impl VpcSubnet {
    /// The `index`-th loopback /22 of the range (wrapping), e.g. a simulator's random start
    /// plus the number of projects it created before.
    pub fn nth(index: u32) -> Self {
        let span = u32::from(LOOPBACK_SECOND_OCTETS.end() - LOOPBACK_SECOND_OCTETS.start()) + 1;
        let index = index % (span * PER_SECOND_OCTET);
        let second = u32::from(*LOOPBACK_SECOND_OCTETS.start()) + index / PER_SECOND_OCTET;
        let third = (index % PER_SECOND_OCTET) * (SIZE / 256);
        let base = Ipv4Addr::from((127 << 24) | (second << 16) | (third << 8));
        Self {
            base,
            used: BTreeSet::new(),
        }
    }

    /// How many /22s the loopback range holds (for drawing a random start).
    pub fn slots() -> u32 {
        (u32::from(LOOPBACK_SECOND_OCTETS.end() - LOOPBACK_SECOND_OCTETS.start()) + 1)
            * PER_SECOND_OCTET
    }

    /// The lowest free address that nexus would hand out, or `None` when the subnet is full.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        let off = (RESERVED_FRONT..SIZE - 1).find(|o| !self.used.contains(o))?;
        self.used.insert(off);
        Some(self.at(off))
    }

    /// Takes the address at `off` from the subnet's start (a request for an explicit address
    /// already checked with `check_requestable`); `None` when it is in use.
    pub fn take(&mut self, off: u32) -> Option<Ipv4Addr> {
        self.used.insert(off).then(|| self.at(off))
    }

    /// nexus's `Ipv4Net::check_requestable_addr` on the subnet as the API shows it
    /// (`172.30.0.0/22`): the address's offset, or nexus's refusal text.
    pub fn check_requestable(addr: Ipv4Addr) -> Result<u32, String> {
        let off = rack_offset(addr)
            .ok_or_else(|| format!("{addr} is outside subnet {RACK_BLOCK}/{PREFIX_LEN}"))?;
        if off < RESERVED_FRONT {
            return Err(format!(
                "The first {RESERVED_FRONT} addresses of a subnet are reserved"
            ));
        }
        if off == SIZE - 1 {
            return Err("Cannot request a broadcast address".to_owned());
        }
        Ok(off)
    }

    /// Returns `ip` to the subnet; an address it does not hold is ignored.
    pub fn release(&mut self, ip: Ipv4Addr) {
        if let Some(off) = self.offset(ip) {
            self.used.remove(&off);
        }
    }

    /// Addresses still free for NICs.
    pub fn free(&self) -> usize {
        usize::try_from(SIZE - 1 - RESERVED_FRONT).unwrap_or(0) - self.used.len()
    }

    /// Whether `ip` is one of this subnet's loopback addresses.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.offset(ip).is_some()
    }

    /// The address the rack shows for one of this subnet's loopback stand-ins: the same
    /// offset in `172.30.0.0/22` (what the API reports and the guest sees on its NIC).
    pub fn rack_addr(&self, loopback: Ipv4Addr) -> Option<Ipv4Addr> {
        self.offset(loopback)
            .map(|off| Ipv4Addr::from(u32::from(RACK_BLOCK) + off))
    }

    /// The loopback stand-in for a rack address of this subnet (`172.30.0.0/22`), where
    /// whatever serves that address listens; `None` outside the subnet.
    pub fn loopback_for(&self, rack: Ipv4Addr) -> Option<Ipv4Addr> {
        rack_offset(rack).map(|off| self.at(off))
    }

    /// [`Self::loopback_for`] as a guest can work it out: from its own NIC's rack address
    /// and loopback stand-in (both in the same subnet), the stand-in of `rack`.
    pub fn peer_loopback(
        rack: Ipv4Addr,
        own_rack: Ipv4Addr,
        own_loopback: Ipv4Addr,
    ) -> Option<Ipv4Addr> {
        let base = u32::from(own_loopback).checked_sub(rack_offset(own_rack)?)?;
        Some(Ipv4Addr::from(base + rack_offset(rack)?))
    }

    fn at(&self, off: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + off)
    }

    fn offset(&self, ip: Ipv4Addr) -> Option<u32> {
        u32::from(ip)
            .checked_sub(u32::from(self.base))
            .filter(|o| *o < SIZE)
    }
}

/// Offset of `rack` in `172.30.0.0/22`, `None` outside it.
fn rack_offset(rack: Ipv4Addr) -> Option<u32> {
    u32::from(rack)
        .checked_sub(u32::from(RACK_BLOCK))
        .filter(|o| *o < SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnet_holds_what_nexus_hands_out_of_a_slash_22() {
        let mut s = VpcSubnet::nth(0);
        assert_eq!(s.free(), 1018);
        let first = s.allocate().unwrap();
        // 172.30.0.5 is the first address nexus gives a NIC.
        assert_eq!(first, Ipv4Addr::new(127, 16, 0, 5));
        let mut last = first;
        for _ in 1..1018 {
            last = s.allocate().unwrap();
        }
        // ... and 172.30.3.254 the last (172.30.3.255 is the broadcast address).
        assert_eq!(last, Ipv4Addr::new(127, 16, 3, 254));
        assert_eq!((s.allocate(), s.free()), (None, 0));
        s.release(Ipv4Addr::new(127, 16, 2, 7));
        assert_eq!(s.allocate(), Some(Ipv4Addr::new(127, 16, 2, 7)));
        assert!(s.contains(first) && !s.contains(Ipv4Addr::new(127, 16, 4, 5)));
    }

    #[test]
    fn rack_addresses_and_loopback_stand_ins_map_at_the_same_offset() {
        let mut s = VpcSubnet::nth(0);
        let lo = s.allocate().unwrap();
        let rack = s.rack_addr(lo).unwrap();
        assert_eq!(rack, Ipv4Addr::new(172, 30, 0, 5));
        assert_eq!(s.loopback_for(rack), Some(lo));
        assert_eq!(
            s.loopback_for(Ipv4Addr::new(172, 30, 3, 254)),
            Some(Ipv4Addr::new(127, 16, 3, 254))
        );
        assert_eq!(s.loopback_for(Ipv4Addr::new(172, 30, 4, 0)), None);
        assert_eq!(s.rack_addr(Ipv4Addr::new(127, 17, 0, 5)), None);
        // A guest works a peer's stand-in out from its own pair of addresses.
        let peer = Ipv4Addr::new(172, 30, 1, 9);
        assert_eq!(
            VpcSubnet::peer_loopback(peer, rack, lo),
            s.loopback_for(peer)
        );
        assert_eq!(
            VpcSubnet::peer_loopback(Ipv4Addr::new(10, 0, 0, 1), rack, lo),
            None
        );
    }

    #[test]
    fn consecutive_subnets_do_not_overlap_and_the_range_wraps() {
        let a = VpcSubnet::nth(63).base;
        let b = VpcSubnet::nth(64).base;
        assert_eq!(
            (a, b),
            (Ipv4Addr::new(127, 16, 252, 0), Ipv4Addr::new(127, 17, 0, 0))
        );
        assert_eq!(
            VpcSubnet::nth(VpcSubnet::slots()).base,
            VpcSubnet::nth(0).base
        );
        assert_eq!(
            VpcSubnet::nth(VpcSubnet::slots() - 1).base,
            Ipv4Addr::new(127, 99, 252, 0)
        );
    }
}
