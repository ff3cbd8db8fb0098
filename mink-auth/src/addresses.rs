//! The connections each client address holds on one port, so one address cannot take
//! every slot of `--max-connections` and lock everyone else out.
//!
//! ```text
//!  accepted from 192.0.2.7 ──> its count < limit? ──yes──> AddressSlot (count + 1,
//!                                   │                       - 1 when dropped)
//!                                   └──no──> refused (the connection is closed at once)
//!  accepted from 127.0.0.1 or ::1 ──> admitted, not counted
//! ```
//!
//! mink's own processes (the Flight SQL endpoint's node client, `mink worker`s on the same
//! host, the tests) and local clients all connect from 127.0.0.1 or ::1, so those two
//! addresses are not counted: the port's total bound still holds for them. Every other
//! address, the rest of 127.0.0.0/8 included, is. An IPv6 client counts with its /64, the
//! block one host is usually given, so walking through the addresses of its block does
//! not multiply its share. An IPv4 address mapped into IPv6 (a dual-stack listener) counts
//! as the IPv4 address.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

/// The count of connections each address holds on one port.
#[derive(Debug)]
pub(crate) struct AddressCounts {
    limit: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// The answer for an address that holds its limit.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AddressFull;

/// One admitted connection's place in its address's count, given back when dropped.
#[derive(Debug)]
pub(crate) struct AddressSlot {
    counts: Arc<AddressCounts>,
    address: IpAddr,
}

impl AddressCounts {
    /// Counts that let each address hold at most `limit` connections.
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Admits a connection from `peer`: `Ok(None)` for an exempt address, `Ok(Some(slot))`
    /// while its address holds fewer than the limit, [`AddressFull`] when it holds the limit.
    pub(crate) fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
    ) -> Result<Option<AddressSlot>, AddressFull> {
        if is_exempt(peer) {
            return Ok(None);
        }
        let address = counted_address(peer);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(address).or_insert(0);
        if *count >= self.limit {
            return Err(AddressFull);
        }
        *count += 1;
        Ok(Some(AddressSlot {
            counts: Arc::clone(self),
            address,
        }))
    }

    /// The addresses holding connections now (for the tests).
    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut held = self
            .counts
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.address);
            }
        }
    }
}

/// Whether `peer` is one of the two addresses mink's own processes connect from.
fn is_exempt(peer: IpAddr) -> bool {
    match peer.to_canonical() {
        IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST,
    }
}

/// The address `peer` is counted under: an IPv4 address as it is (also when mapped into
/// IPv6), an IPv6 address as its /64.
fn counted_address(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_address_holds_up_to_the_limit_and_a_dropped_slot_frees_a_place() {
        let counts = AddressCounts::new(2);
        let first = counts.admit(ip("127.0.0.2")).unwrap();
        let second = counts.admit(ip("127.0.0.2")).unwrap();
        assert!(first.is_some() && second.is_some());
        assert!(counts.admit(ip("127.0.0.2")).is_err());
        // Another address has its own count.
        let other = counts.admit(ip("192.0.2.7")).unwrap();
        assert!(other.is_some());
        drop(first);
        let third = counts.admit(ip("127.0.0.2")).unwrap();
        assert!(third.is_some());
        drop((second, third, other));
        assert_eq!(
            counts.addresses(),
            0,
            "an address holding nothing is forgotten"
        );
    }

    #[test]
    fn loopback_one_and_its_ipv6_forms_are_not_counted() {
        let counts = AddressCounts::new(1);
        for exempt in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            for _ in 0..3 {
                assert!(counts.admit(ip(exempt)).unwrap().is_none(), "{exempt}");
            }
        }
        assert_eq!(counts.addresses(), 0);
    }

    #[test]
    fn an_ipv6_block_counts_as_one_and_a_mapped_ipv4_as_itself() {
        let counts = AddressCounts::new(1);
        let _held = counts.admit(ip("2001:db8:1:2::1")).unwrap();
        assert!(counts.admit(ip("2001:db8:1:2:ffff::9")).is_err());
        assert!(counts.admit(ip("2001:db8:1:3::1")).unwrap().is_some());
        let _v4 = counts.admit(ip("192.0.2.7")).unwrap();
        assert!(counts.admit(ip("::ffff:192.0.2.7")).is_err());
    }
}
