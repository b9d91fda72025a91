//! Next hops of one worker: the Ethernet addresses learned from ARP
//! (every ARP frame teaches its sender's), and the queue of addresses to
//! ask for (a new backend, or a next hop a packet could not reach).
//!
//! The table and the queue are generic over the address family; how a
//! request is asked is the family's (ARP for IPv4, a neighbour
//! solicitation to the target's solicited-node group for IPv6: one `impl`
//! block each).
//!
//! Invariants: both are bounded ([`CAPACITY`] entries, [`QUEUE`]
//! requests), so learning never allocates past them and nothing here
//! allocates per packet; an address is queued at most once and never
//! while known. Requests are sent from the ARP source: a SNAT address the
//! host does not also use, else 0.0.0.0 (a probe, whose answer the
//! steering program gives xvs without taking the kernel's ARP).

use hashbrown::HashMap;
use std::net::Ipv4Addr;

use smoltcp::wire::EthernetAddress;
use xvs_config::Address;

use crate::wire::Arp;

/// Next hops a worker keeps.
pub const CAPACITY: usize = 65_536;
/// ARP requests waiting to be sent.
pub const QUEUE: usize = 256;

/// The neighbour table and the ARP requests to send.
#[derive(Debug)]
pub struct Neighbours<A: Address = Ipv4Addr> {
    table: HashMap<A, [u8; 6]>,
    queue: Vec<A>,
    /// Sender address of the requests.
    source: A,
    /// Sender Ethernet address of the requests (the backend side's).
    mac: EthernetAddress,
    /// Bumped whenever an address is learned or changes: frames held for
    /// a next hop are run again only then (or when they age).
    generation: u64,
}

impl<A: Address> Neighbours<A> {
    /// Empty, asking from `source` with `mac`.
    pub fn new(source: A, mac: EthernetAddress) -> Neighbours<A> {
        Neighbours {
            table: HashMap::new(),
            queue: Vec::with_capacity(QUEUE),
            source,
            mac,
            generation: 0,
        }
    }

    /// Asks from `source` from now on.
    pub fn set_source(&mut self, source: A) {
        self.source = source;
    }

    /// Records `addr` at `mac` (a known one is updated; a new one only
    /// while there is room).
    pub fn learn(&mut self, addr: A, mac: [u8; 6]) {
        if (self.table.len() < CAPACITY || self.table.contains_key(&addr))
            && self.table.insert(addr, mac) != Some(mac)
        {
            self.generation += 1;
        }
    }

    /// How many times an address was learned or changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The Ethernet address of `addr`, if known.
    #[inline]
    pub fn get(&self, addr: A) -> Option<[u8; 6]> {
        self.table.get(&addr).copied()
    }

    /// Queues a request for `addr`, once, unless it is known.
    pub fn resolve(&mut self, addr: A) {
        if !self.table.contains_key(&addr)
            && !self.queue.contains(&addr)
            && self.queue.len() < QUEUE
        {
            self.queue.push(addr);
        }
    }

    /// The next address to ask for.
    pub fn next_request(&mut self) -> Option<A> {
        self.queue.pop()
    }
}

impl Neighbours<Ipv4Addr> {
    /// Builds a request for `target` into `buf` (to send on the backend
    /// side); its length (60 with room for the padding), or `None` if
    /// `buf` cannot hold it.
    pub fn build_request(&self, buf: &mut [u8], target: Ipv4Addr) -> Option<usize> {
        Arp::request(self.mac, self.source, target).emit(buf, EthernetAddress::BROADCAST)
    }
}

impl Neighbours<std::net::Ipv6Addr> {
    /// Builds a neighbour solicitation for `target` into `buf` (to send on
    /// the backend side); its length, or `None` if `buf` cannot hold it.
    pub fn build_request(&self, buf: &mut [u8], target: std::net::Ipv6Addr) -> Option<usize> {
        crate::wire::ndp::solicit(buf, self.mac, self.source, target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);

    #[test]
    fn a_request_is_queued_once_and_never_for_a_known_address() {
        let mut n = Neighbours::new(Ipv4Addr::UNSPECIFIED, EthernetAddress([2, 0, 0, 0, 0, 2]));
        n.resolve(B);
        n.resolve(B);
        assert_eq!((n.next_request(), n.next_request()), (Some(B), None));
        n.learn(B, [2, 0, 0, 0, 0, 3]);
        assert_eq!(n.generation(), 1);
        n.learn(B, [2, 0, 0, 0, 0, 3]);
        assert_eq!(n.generation(), 1, "the same address again is nothing new");
        n.resolve(B);
        assert_eq!(n.next_request(), None);
        assert_eq!(n.get(B), Some([2, 0, 0, 0, 0, 3]));
    }

    #[test]
    fn requests_come_from_the_arp_source() {
        let mut n = Neighbours::new(
            Ipv4Addr::new(198, 18, 1, 2),
            EthernetAddress([2, 0, 0, 0, 0, 2]),
        );
        let mut buf = [0u8; 64];
        assert_eq!(n.build_request(&mut buf, B), Some(60));
        assert_eq!(&buf[28..32], &[198, 18, 1, 2]);
        assert_eq!(&buf[38..42], &B.octets());
        n.set_source(Ipv4Addr::UNSPECIFIED);
        n.build_request(&mut buf, B);
        assert_eq!(&buf[28..32], &[0, 0, 0, 0], "a probe");
        assert_eq!(n.build_request(&mut [0u8; 41], B), None);
    }

    #[test]
    fn the_table_holds_either_family() {
        use std::net::Ipv6Addr;
        let b: Ipv6Addr = "2001:2::10".parse().unwrap();
        let mut n = Neighbours::new(Ipv6Addr::UNSPECIFIED, EthernetAddress([2, 0, 0, 0, 0, 2]));
        n.resolve(b);
        assert_eq!(n.next_request(), Some(b));
        n.learn(b, [2, 0, 0, 0, 0, 3]);
        assert_eq!(n.get(b), Some([2, 0, 0, 0, 0, 3]));
    }
}
