//! The SNAT endpoints of one worker: each of its SNAT addresses with each
//! port of its slice, walked by a cursor that goes round (port-major
//! within an address, address after address), so the endpoints it meets
//! next are the ones used longest ago.
//!
//! Invariants: the cursor is always a position in `0..total()`, kept as
//! its address index and port offset (`addr < addrs.len()`, `port <
//! ports.size()`), so that stepping it and naming its endpoint divide
//! nothing (a division is tens of cycles on the new flow's critical
//! path; only [`SnatEndpoints::resume_after`], on the rare reclaim path,
//! and a peek past the address's last port divide); the walk never
//! allocates. Which endpoint is free is the flow table's to say (the
//! pipeline looks each candidate's reply key up).

use std::net::Ipv4Addr;

use xvs_config::{Address, PortRange};
use xvs_conntrack::Endpoint;

/// A worker's SNAT addresses × port slice, and the cursor.
#[derive(Debug, Clone)]
pub struct SnatEndpoints<A: Address = Ipv4Addr> {
    addrs: Vec<A>,
    ports: PortRange,
    /// The cursor's address (an index into `addrs`).
    addr: u32,
    /// The cursor's port, as an offset from `ports.first`.
    port: u32,
}

impl<A: Address> SnatEndpoints<A> {
    /// `addrs` × `ports`, the cursor at the start.
    pub fn new(addrs: Vec<A>, ports: PortRange) -> SnatEndpoints<A> {
        SnatEndpoints {
            addrs,
            ports,
            addr: 0,
            port: 0,
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
        let size = self.ports.size();
        if size == 0 {
            return None;
        }
        let end = self.endpoint(self.addr, self.port)?;
        // Saturating as `total()` is (no overflow, whatever the config).
        let at = self.addr.saturating_mul(size).saturating_add(self.port);
        self.port += 1;
        if self.port >= size {
            self.port = 0;
            self.addr += 1;
            if self.addr as usize >= self.addrs.len() {
                self.addr = 0;
            }
        }
        Some((end, at))
    }

    /// The endpoint `ahead` places after the cursor (0: the one
    /// [`SnatEndpoints::advance`] returns next), the cursor unmoved.
    #[inline]
    pub fn peek(&self, ahead: u32) -> Option<Endpoint<A>> {
        let size = self.ports.size();
        let port = u64::from(self.port) + u64::from(ahead);
        if port < u64::from(size) {
            return self.endpoint(self.addr, port as u32);
        }
        // Past this address's last port: where the walk will be.
        let total = u64::from(self.total());
        if total == 0 {
            return None;
        }
        let at = (u64::from(self.addr) * u64::from(size) + port) % total;
        let size = u64::from(size);
        self.endpoint((at / size) as u32, (at % size) as u32)
    }

    /// The endpoint of address `addr` (an index) and port offset `port`
    /// (`< ports.size()`), if there is such an address.
    #[inline(always)]
    fn endpoint(&self, addr: u32, port: u32) -> Option<Endpoint<A>> {
        Some(Endpoint {
            addr: *self.addrs.get(addr as usize)?,
            port: (u32::from(self.ports.first) + port) as u16,
        })
    }

    /// The walk goes on after position `at` (`< total()`).
    pub fn resume_after(&mut self, at: u32) {
        let size = self.ports.size();
        let next = if at.saturating_add(1) >= self.total() {
            0
        } else {
            at + 1
        };
        (self.addr, self.port) = match size {
            0 => (0, 0),
            _ => (next / size, next % size),
        };
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

    /// From every position, a peek `k` places ahead names what the `k`-th
    /// advance returns (past the address's last port and round the
    /// whole walk too), and advances name their positions in order.
    #[test]
    fn peeks_name_the_advances_to_come_from_every_position() {
        let addrs: Vec<Ipv4Addr> = (1..=3).map(|i| Ipv4Addr::new(198, 18, 1, i)).collect();
        let ports = PortRange {
            first: 40000,
            last: 40004,
        };
        let mut s = SnatEndpoints::new(addrs.clone(), ports);
        let total = s.total();
        assert_eq!(total, 15);
        for start in 0..total {
            s.resume_after(if start == 0 { total - 1 } else { start - 1 });
            let peeked: Vec<_> = (0..2 * total + 3).map(|k| s.peek(k)).collect();
            let mut walk = s.clone();
            for (k, want) in peeked.into_iter().enumerate() {
                let (end, at) = walk.advance().unwrap();
                let pos = (start + k as u32) % total;
                assert_eq!(at, pos, "start {start}, step {k}");
                let expect = Endpoint {
                    addr: addrs[(pos / 5) as usize],
                    port: 40000 + (pos % 5) as u16,
                };
                assert_eq!(
                    (want, end),
                    (Some(expect), expect),
                    "start {start}, step {k}"
                );
            }
        }
    }
}
