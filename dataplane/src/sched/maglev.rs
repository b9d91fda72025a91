//! mh: Maglev consistent hashing, populated as `ip_vs_mh.c` does.
//!
//! Each backend has a preference list over the M slots (M prime) given by
//! an offset and a skip from two seeded hashes of its address and port;
//! backends take turns claiming their next free preferred slot, each
//! claiming `weight / gcd` slots per turn, until the table is full. A flow
//! goes to the slot its client hash names.
//!
//! Invariants: the table depends only on the set of (address, port,
//! weight), the size and the seed — backends are sorted before populating,
//! so the order they were added in does not matter and every gateway with
//! the same seed builds the same table. The hashes are SipHash-1-3
//! (`siphasher`, a fixed algorithm: stable across builds and machines)
//! keyed from the seed. Quiesced backends take no slot (`turns = 0`), as in
//! the kernel.

use std::sync::Arc;
use xvs_config::Address;

use siphasher::sip::SipHasher13;
use xvs_config::SchedulerFlags;
use xvs_conntrack::Endpoint;

use super::{gcd, MaglevParams, Request, SchedBackend};

/// Seed used when a service configures none.
pub const DEFAULT_SEED: u64 = xvs_config::DEFAULT_HASH_SEED;
const EMPTY: u16 = u16::MAX;

/// A populated lookup table: slot → backend index (into the list the table
/// was built for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaglevTable {
    slots: Arc<[u16]>,
}

impl MaglevTable {
    /// Builds the table of `size` slots (prime, > number of backends) for
    /// `backends`. More than 65535 backends are not representable and
    /// yield an empty table.
    pub fn build<A: Address>(backends: &[SchedBackend<A>], size: u32, seed: u64) -> MaglevTable {
        let m = size as usize;
        let mut slots = vec![EMPTY; m];
        if backends.len() >= usize::from(EMPTY) || m < 2 {
            return MaglevTable {
                slots: slots.into(),
            };
        }
        // Sorted by (address, port): independent of insertion order.
        let mut order: Vec<usize> = (0..backends.len()).collect();
        order.sort_by_key(|&i| (backends[i].endpoint.addr, backends[i].endpoint.port));
        let g = backends
            .iter()
            .filter(|b| b.weight > 0)
            .fold(0, |g, b| gcd(g, b.weight))
            .max(1);
        // Turns per round; scaled down (keeping every weighted backend at
        // least one) so a round never exceeds the table.
        let mut shift = 0;
        while backends
            .iter()
            .map(|b| u64::from((b.weight / g) >> shift))
            .sum::<u64>()
            > m as u64 / 2
            && shift < 31
        {
            shift += 1;
        }
        let mut setup: Vec<(usize, u64, u64, u32)> = order
            .iter()
            .filter(|&&i| backends[i].weight > 0)
            .map(|&i| {
                let e = backends[i].endpoint;
                let offset = hash(seed, 1, e) % m as u64;
                let skip = hash(seed, 2, e) % (m as u64 - 1) + 1;
                let turns = ((backends[i].weight / g) >> shift).max(1);
                (i, offset, skip, turns)
            })
            .collect();
        if setup.is_empty() {
            return MaglevTable {
                slots: slots.into(),
            };
        }
        let mut filled = 0usize;
        'fill: loop {
            for (i, perm, skip, turns) in setup.iter_mut() {
                for _ in 0..*turns {
                    // perm, skip < m: a compare-and-subtract replaces `%`,
                    // the bulk of the build time.
                    while slots[*perm as usize] != EMPTY {
                        *perm += *skip;
                        if *perm >= m as u64 {
                            *perm -= m as u64;
                        }
                    }
                    slots[*perm as usize] = *i as u16;
                    filled += 1;
                    if filled == m {
                        break 'fill;
                    }
                }
            }
        }
        MaglevTable {
            slots: slots.into(),
        }
    }

    /// Table size.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the table has no slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Backend index of slot `s`, if any.
    pub fn slot(&self, s: usize) -> Option<usize> {
        self.slots
            .get(s)
            .filter(|&&i| i != EMPTY)
            .map(|&i| usize::from(i))
    }

    /// Heap bytes of the table.
    pub fn memory_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<u16>()
    }
}

/// SipHash-1-3 of an endpoint under a key derived from the seed and a
/// purpose (1: offset, 2: skip, 3: client lookup).
fn hash<A: Address>(seed: u64, purpose: u64, e: Endpoint<A>) -> u64 {
    let mut h = SipHasher13::new_with_keys(seed, seed.rotate_left(17) ^ purpose);
    // IPv6 folded as IPVS's `ip_vs_mh_hashkey` folds it (an IPv4
    // address is its own fold).
    std::hash::Hasher::write(&mut h, &e.addr.fold32().to_be_bytes());
    std::hash::Hasher::write(&mut h, &e.port.to_be_bytes());
    std::hash::Hasher::finish(&h)
}

/// The mh scheduler of one service.
#[derive(Debug, Clone)]
pub struct Maglev {
    table: MaglevTable,
    flags: SchedulerFlags,
    seed: u64,
}

impl Maglev {
    pub(crate) fn new<A: Address>(
        flags: SchedulerFlags,
        backends: &[SchedBackend<A>],
        p: MaglevParams,
    ) -> Self {
        Maglev {
            table: MaglevTable::build(backends, p.size, p.seed),
            flags,
            seed: p.seed,
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
    }

    pub(crate) fn pick<A: Address>(
        &self,
        backends: &[SchedBackend<A>],
        req: &Request<A>,
    ) -> Option<usize> {
        let m = self.table.len() as u64;
        if m == 0 {
            return None;
        }
        let port = if self.flags.port { req.client.port } else { 0 };
        let at = |offset: u16| {
            let e = Endpoint {
                addr: req.client.addr,
                port: port.wrapping_add(offset),
            };
            (hash(self.seed, 3, e) % m) as usize
        };
        let take = |s: usize| {
            self.table
                .slot(s)
                .filter(|&i| backends.get(i).is_some_and(|b| b.available()))
        };
        if let Some(i) = take(at(0)) {
            return Some(i);
        }
        if !self.flags.fallback {
            return None;
        }
        // ip_vs_mh_get_fallback: rehash with growing offsets.
        (1..=u16::MAX)
            .take(m as usize)
            .find_map(|off| take(at(off)))
    }
}
