//! dh and sh: 256 buckets filled by weight, as `ip_vs_sh.c`.
//!
//! Filling (the kernel's `ip_vs_sh_reassign`): bucket after bucket, each
//! backend in list order takes as many consecutive buckets as its weight
//! (at least one: a quiesced backend keeps one bucket), wrapping around the
//! list until all 256 are taken. sh hashes the client address (and port,
//! with `port`) as the kernel does: `hash_32(port + addr, 8)`; dh hashes
//! the destination the same way, except that without `port` it uses the
//! kernel dh's `addr × 2654435761 mod 256`. With `fallback`, a bucket whose
//! backend is quiesced is skipped for the next one of the kernel's probe
//! sequence; without it the flow finds no backend, as in IPVS.
//!
//! IPv6 addresses are folded to 32 bits as the kernel's
//! `ip_vs_sh_hashkey` and `ip_vs_dh_hashkey` fold them
//! (`ipv6_addr_hash`: the XOR of the address's four 32-bit words), then
//! hashed like an IPv4 address ([`Address::fold32`]).
//!
//! The kernel's dh gives every backend one bucket in turn whatever its
//! weight; xvs fills dh by weight like sh, which is the same table when all
//! weights are 1.

use xvs_config::Address;
use xvs_config::SchedulerFlags;

use super::{Request, SchedBackend};

/// Number of buckets.
pub const BUCKETS: usize = 256;
const EMPTY: u16 = u16::MAX;
/// The kernel's GOLDEN_RATIO_32 (`hash_32`).
const GOLDEN_RATIO_32: u32 = 0x61C8_8647;

/// A dh or sh bucket table.
#[derive(Debug, Clone)]
pub struct BucketHash {
    dest: bool,
    flags: SchedulerFlags,
    buckets: Box<[u16; BUCKETS]>,
}

/// The kernel's `hash_32(val, 8)`.
fn hash_32(val: u32) -> u32 {
    val.wrapping_mul(GOLDEN_RATIO_32) >> (32 - 8)
}

impl BucketHash {
    pub(crate) fn new<A: Address>(
        dest: bool,
        flags: SchedulerFlags,
        backends: &[SchedBackend<A>],
    ) -> Self {
        let mut buckets = Box::new([EMPTY; BUCKETS]);
        if !backends.is_empty() {
            let (mut p, mut count) = (0usize, 0u32);
            for bucket in buckets.iter_mut() {
                *bucket = p as u16;
                count += 1;
                if count >= backends[p].weight {
                    p = (p + 1) % backends.len();
                    count = 0;
                }
            }
        }
        BucketHash {
            dest,
            flags,
            buckets,
        }
    }

    /// The bucket table (backend index per bucket; `u16::MAX` = none).
    pub fn buckets(&self) -> &[u16; BUCKETS] {
        &self.buckets
    }

    fn key<A: Address>(&self, req: &Request<A>) -> (u32, u32) {
        let e = if self.dest { req.vip } else { req.client };
        let port = if self.flags.port {
            u32::from(e.port)
        } else {
            0
        };
        (e.addr.fold32(), port)
    }

    /// The kernel's bucket for (addr, port) with a probe offset.
    fn bucket(&self, addr: u32, port: u32, offset: u32) -> usize {
        let h = if self.dest && !self.flags.port {
            addr.wrapping_mul(2_654_435_761) % BUCKETS as u32
        } else {
            hash_32(port.wrapping_add(addr))
        };
        ((offset + h) % BUCKETS as u32) as usize
    }

    pub(crate) fn pick<A: Address>(
        &self,
        backends: &[SchedBackend<A>],
        req: &Request<A>,
    ) -> Option<usize> {
        let (addr, port) = self.key(req);
        let first = self.bucket(addr, port, 0);
        let take = |b: usize| {
            let i = self.buckets[b];
            (i != EMPTY && backends.get(usize::from(i)).is_some_and(|x| x.available()))
                .then_some(usize::from(i))
        };
        if let Some(i) = take(first) {
            return Some(i);
        }
        if !self.flags.fallback {
            return None;
        }
        // ip_vs_sh_get_fallback: probe offsets from the first bucket.
        let ihash = first as u32;
        (0..BUCKETS as u32)
            .find_map(|off| take(self.bucket(addr, port, (off + ihash) % BUCKETS as u32)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xvs_conntrack::Endpoint;

    use crate::sched::test_backends as backends;

    fn req(client: [u8; 4], port: u16) -> Request {
        Request {
            client: Endpoint {
                addr: Ipv4Addr::from(client),
                port,
            },
            vip: Endpoint {
                addr: Ipv4Addr::new(198, 19, 0, 1),
                port: 80,
            },
        }
    }

    #[test]
    fn buckets_fill_by_weight_like_the_kernel() {
        let t = BucketHash::new(false, SchedulerFlags::default(), &backends(&[2, 1, 0]));
        // A A B C, repeated: a quiesced backend still holds one bucket.
        let want: Vec<u16> = (0..BUCKETS).map(|i| [0, 0, 1, 2][i % 4]).collect();
        assert_eq!(&t.buckets()[..], &want[..]);
        let t = BucketHash::new(false, SchedulerFlags::default(), &backends(&[3, 1]));
        assert_eq!(&t.buckets()[..8], &[0, 0, 0, 1, 0, 0, 0, 1]);
        let t = BucketHash::new::<Ipv4Addr>(true, SchedulerFlags::default(), &[]);
        assert!(t.buckets().iter().all(|&b| b == EMPTY));
    }

    #[test]
    fn sh_hashes_the_client_address_as_the_kernel() {
        let b = backends(&[1, 1, 1, 1]);
        let t = BucketHash::new(false, SchedulerFlags::default(), &b);
        // hash_32(0xc612000a, 8) = (0xc612000a * 0x61c88647) >> 24.
        let h = (0xc612_000au32.wrapping_mul(0x61c8_8647) >> 24) as usize;
        assert_eq!(t.pick(&b, &req([198, 18, 0, 10], 1)), Some(h % 4));
        // Same client, any port: same backend without the port flag.
        assert_eq!(
            t.pick(&b, &req([198, 18, 0, 10], 2)),
            t.pick(&b, &req([198, 18, 0, 10], 3))
        );
    }

    #[test]
    fn an_ipv6_client_is_folded_as_ipv6_addr_hash_folds_it() {
        let b4 = backends(&[1, 1, 1, 1]);
        let b6: Vec<SchedBackend<std::net::Ipv6Addr>> = b4
            .iter()
            .map(|x| SchedBackend {
                id: x.id,
                endpoint: Endpoint {
                    addr: std::net::Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, x.id as u16),
                    port: x.endpoint.port,
                },
                weight: x.weight,
                plan: x.plan,
            })
            .collect();
        let t = BucketHash::new(false, SchedulerFlags::default(), &b6);
        let client: std::net::Ipv6Addr = "2001:2::10".parse().unwrap();
        // ipv6_addr_hash: the XOR of the four 32-bit words (2001:0002,
        // 0000:0000, 0000:0000, 0000:0010).
        let words: [u32; 4] = [0x2001_0002, 0, 0, 0x10];
        let fold = words.iter().fold(0, |a, w| a ^ w);
        let h = (fold.wrapping_mul(0x61c8_8647) >> 24) as usize;
        let r = Request {
            client: Endpoint {
                addr: client,
                port: 1,
            },
            vip: Endpoint {
                addr: "2001:2:ff::1".parse().unwrap(),
                port: 80,
            },
        };
        assert_eq!(t.pick(&b6, &r), Some(h % 4));
    }

    #[test]
    fn sh_port_flag_spreads_ports() {
        let b = backends(&[1, 1, 1, 1]);
        let flags = SchedulerFlags {
            port: true,
            ..Default::default()
        };
        let t = BucketHash::new(false, flags, &b);
        let picks: std::collections::HashSet<usize> = (0..64)
            .map(|p| t.pick(&b, &req([198, 18, 0, 10], 1000 + p)).unwrap())
            .collect();
        assert_eq!(picks.len(), 4);
    }

    #[test]
    fn dh_hashes_the_destination() {
        let b = backends(&[1, 1, 1]);
        let t = BucketHash::new(true, SchedulerFlags::default(), &b);
        let h = (0xc613_0001u32.wrapping_mul(2_654_435_761) % 256) as usize;
        // Any client: the VIP decides.
        assert_eq!(t.pick(&b, &req([198, 18, 0, 1], 1)), Some(h % 3));
        assert_eq!(t.pick(&b, &req([198, 18, 0, 2], 9)), Some(h % 3));
    }

    #[test]
    fn quiesced_bucket_fails_without_fallback_and_moves_on_with_it() {
        let mut b = backends(&[1, 1]);
        let r = req([198, 18, 0, 10], 1);
        let chosen = BucketHash::new(false, SchedulerFlags::default(), &b)
            .pick(&b, &r)
            .unwrap();
        b[chosen].weight = 0;
        let t = BucketHash::new(false, SchedulerFlags::default(), &b);
        assert_eq!(t.pick(&b, &r), None);
        let t = BucketHash::new(
            false,
            SchedulerFlags {
                fallback: true,
                ..Default::default()
            },
            &b,
        );
        assert_eq!(t.pick(&b, &r), Some(1 - chosen));
    }
}
