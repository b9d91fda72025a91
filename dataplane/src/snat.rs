//! The SNAT endpoints of one worker: each of its SNAT addresses with each
//! port of its slice, walked by a cursor that goes round (port-major
//! within an address, address after address), so the endpoints it meets
//! next are the ones used longest ago.
//!
//! Invariants: the cursor is always a position in `0..total()`; the
//! walk never allocates. Which endpoint is free is the flow table's to
//! say (the pipeline looks each candidate's reply key up).

use std::net::Ipv4Addr;

use xvs_config::{Address, PortRange};
use xvs_conntrack::Endpoint;

/// A worker's SNAT addresses × port slice, and the cursor.
#[derive(Debug, Clone)]
pub struct SnatEndpoints<A: Address = Ipv4Addr> {
    addrs: Vec<A>,
    ports: PortRange,
    next: u32,
}

impl<A: Address> SnatEndpoints<A> {
    /// `addrs` × `ports`, the cursor at the start.
    pub fn new(addrs: Vec<A>, ports: PortRange) -> SnatEndpoints<A> {
        SnatEndpoints {
            addrs,
            ports,
            next: 0,
        }
    }

    /// Whether `addr` is one of the SNAT addresses (a handful: a scan).
    #[inline]
    pub fn is_snat(&self, addr: A) -> bool {
        self.addrs.contains(&addr)
    }

    /// The SNAT addresses.
    pub fn addrs(&self) -> &[A] {
        &self.addrs
    }

    /// Endpoints in all.
    pub fn total(&self) -> u32 {
        self.ports.size().saturating_mul(self.addrs.len() as u32)
    }

    /// The endpoint at the cursor, with its position; the cursor moves on.
    #[inline]
    pub fn advance(&mut self) -> Option<(Endpoint<A>, u32)> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let at = self.next % total;
        self.resume_after(at);
        Some((self.endpoint_at(at)?, at))
    }

    /// The endpoint at position `at` (`< total()`): port-major within an
    /// address.
    #[inline]
    fn endpoint_at(&self, at: u32) -> Option<Endpoint<A>> {
        let size = self.ports.size();
        Some(Endpoint {
            addr: *self.addrs.get((at / size) as usize)?,
            port: (u32::from(self.ports.first) + at % size) as u16,
        })
    }

    /// The endpoint `ahead` places after the cursor (0: the one
    /// [`SnatEndpoints::advance`] returns next), the cursor unmoved.
    #[inline]
    pub fn peek(&self, ahead: u32) -> Option<Endpoint<A>> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        self.endpoint_at(((u64::from(self.next) + u64::from(ahead)) % u64::from(total)) as u32)
    }

    /// The walk goes on after position `at`.
    pub fn resume_after(&mut self, at: u32) {
        self.next = if at + 1 >= self.total() { 0 } else { at + 1 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_goes_round_every_address_and_port() {
        let a = Ipv4Addr::new(198, 18, 1, 2);
        let b = Ipv4Addr::new(198, 18, 1, 3);
        let mut s = SnatEndpoints::new(
            vec![a, b],
            PortRange {
                first: 1024,
                last: 1025,
            },
        );
        assert_eq!(s.total(), 4);
        let seen: Vec<(Ipv4Addr, u16, u32)> = (0..5)
            .map(|_| {
                let (e, at) = s.advance().unwrap();
                (e.addr, e.port, at)
            })
            .collect();
        assert_eq!(
            seen,
            [
                (a, 1024, 0),
                (a, 1025, 1),
                (b, 1024, 2),
                (b, 1025, 3),
                (a, 1024, 0)
            ]
        );
        s.resume_after(1);
        // peek names what advance returns, without moving the cursor.
        assert_eq!(
            s.peek(0),
            Some(Endpoint {
                addr: b,
                port: 1024
            })
        );
        assert_eq!(
            s.peek(3),
            Some(Endpoint {
                addr: a,
                port: 1025
            })
        );
        assert_eq!(s.advance().unwrap().1, 2);
        assert!(
            SnatEndpoints::<Ipv4Addr>::new(vec![], PortRange { first: 1, last: 2 })
                .advance()
                .is_none()
        );
    }
}
