//! Loopback addresses standing in for the rack's external IP pool.
//!
//! Every simulator picks its own random /24 inside 127.100.0.0 – 127.227.255.255 so that
//! simulators running in parallel (tests, benchmarks) never hand out the same address. Hosts
//! `.1` to `.254` of that /24 form the pool; floating IPs, ephemeral IPs and the shared SNAT
//! address all come from here. What listens on those addresses is not this module's concern.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Lowest host number handed out inside the /24.
const FIRST_HOST: u8 = 1;
/// Highest host number handed out inside the /24 (`.255` is left alone).
const LAST_HOST: u8 = 254;

/// A /24 of loopback addresses from which external IPs are allocated.
///
/// Cloning shares the allocation state, so the Oxide API side and whoever binds listeners see
/// the same set of addresses in use.
#[derive(Clone, Debug)]
pub struct AddressPool {
    /// Second and third octets of `127.b.c.0/24`.
    net: [u8; 2],
    /// Host numbers currently allocated.
    used: Arc<Mutex<BTreeSet<u8>>>,
}

impl AddressPool {
    /// A pool on a random /24 in 127.100.0.0 – 127.227.255.0.
    pub fn random() -> Self {
        let second = rand::random_range(100u8..=227u8);
        let third = rand::random::<u8>();
        Self::new(second, third)
    }

    /// A pool on `127.second.third.0/24` (deterministic; for tests).
    pub fn new(second: u8, third: u8) -> Self {
        Self {
            net: [second, third],
            used: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    fn used(&self) -> MutexGuard<'_, BTreeSet<u8>> {
        // A panic elsewhere while holding this lock cannot leave the set inconsistent (every
        // mutation is a single insert/remove), so a poisoned lock is still usable.
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, self.net[0], self.net[1], host)
    }

    /// Allocates the lowest free address, or `None` when the pool is exhausted.
    pub fn allocate(&self) -> Option<Ipv4Addr> {
        let mut used = self.used();
        let host = (FIRST_HOST..=LAST_HOST).find(|h| !used.contains(h))?;
        used.insert(host);
        Some(self.addr(host))
    }

    /// Allocates exactly `ip`; false if it is outside the pool or already in use.
    pub fn allocate_specific(&self, ip: Ipv4Addr) -> bool {
        let Some(host) = self.host_of(ip) else {
            return false;
        };
        self.used().insert(host)
    }

    /// Returns `ip` to the pool. Releasing an address that is not allocated is a no-op.
    pub fn release(&self, ip: Ipv4Addr) {
        if let Some(host) = self.host_of(ip) {
            self.used().remove(&host);
        }
    }

    /// First and last address of the pool's range.
    pub fn first_last(&self) -> (Ipv4Addr, Ipv4Addr) {
        (self.addr(FIRST_HOST), self.addr(LAST_HOST))
    }

    /// Whether `ip` lies inside the pool's range.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.host_of(ip).is_some()
    }

    /// Number of addresses still free.
    pub fn free(&self) -> usize {
        usize::from(LAST_HOST - FIRST_HOST + 1).saturating_sub(self.used().len())
    }

    fn host_of(&self, ip: Ipv4Addr) -> Option<u8> {
        let o = ip.octets();
        (o[0] == 127 && o[1] == self.net[0] && o[2] == self.net[1])
            .then_some(o[3])
            .filter(|h| (FIRST_HOST..=LAST_HOST).contains(h))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn random_pool_lies_in_the_documented_range() {
        for _ in 0..50 {
            let (first, last) = AddressPool::random().first_last();
            let o = first.octets();
            assert_eq!(o[0], 127);
            assert!((100..=227).contains(&o[1]), "{first}");
            assert_eq!(o[3], 1);
            assert_eq!(last.octets()[3], 254);
        }
    }

    #[test]
    fn allocation_is_unique_until_released_and_exhausts() {
        let pool = AddressPool::new(100, 7);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_ne!(a, b);
        pool.release(a);
        assert_eq!(pool.allocate(), Some(a));
        while pool.allocate().is_some() {}
        assert_eq!(pool.free(), 0);
        assert!(!pool.allocate_specific(b));
        pool.release(b);
        assert!(pool.allocate_specific(b));
        assert!(!pool.allocate_specific(Ipv4Addr::new(127, 100, 8, 1)));
    }
}
