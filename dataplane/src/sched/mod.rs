//! Schedulers with IPVS's semantics (`net/netfilter/ipvs/ip_vs_*.c`):
//! choosing the backend of a new flow. Sans-IO: randomness comes from a
//! seeded generator, load from [`ConnCounts`].
//!
//! Invariants: a backend of weight 0 is never chosen for a new flow
//! (quiesced); when none is eligible the outcome is [`NoBackend`], which the
//! data plane turns into a reject. A scheduler is built for one backend
//! list ([`Scheduler::new`]) and picks indexes into that same list; a
//! change of the list or of a weight builds a new one (O(that service)).
//! Tables (sh, dh, mh) are built at construction, never on the packet path.

mod counts;
mod failover;
mod hash;
mod least;
mod locality;
mod maglev;
mod random;
mod rr;

use std::net::Ipv4Addr;
use xvs_config::Address;

use crate::forward::Plan;
pub use counts::{ConnCounts, CountsObserver};
pub use failover::Failover;
pub use hash::{BucketHash, BUCKETS};
pub use least::Least;
pub use locality::{Locality, EXPIRATION as LOCALITY_EXPIRATION};
pub use maglev::{Maglev, MaglevTable, DEFAULT_SEED};
pub use random::WeightedRandom;
pub use rr::{RoundRobin, WeightedRoundRobin};
use xvs_config::{Scheduler as Kind, SchedulerFlags};
use xvs_conntrack::{Endpoint, FlowTable, L4Proto, Observer};

/// The farthest offset [`Scheduler::peek`] answers for round-robin
/// schedulers (rr counts or walks that far, wrr steps a copy of its
/// state). The pipeline asks up to its prefetch distance: every frame in
/// between may be a new flow of the same service, a single hot service's
/// steady state.
pub const PEEK_MAX: usize = 16;

/// A backend as the schedulers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedBackend<A: Address = Ipv4Addr> {
    /// Stable id: the index of its counts in [`ConnCounts`].
    pub id: u32,
    /// Address and port.
    pub endpoint: Endpoint<A>,
    /// Weight (0 = quiesced).
    pub weight: u32,
    /// How its flows are forwarded (schedulers do not read it).
    pub plan: Plan,
}

impl<A: Address> SchedBackend<A> {
    fn available(&self) -> bool {
        self.weight > 0
    }

    /// Where a new flow asking for port `asked` goes: this backend's
    /// endpoint, except that a port-0 backend (of a port-0 service) keeps
    /// the port the client asked for.
    #[inline]
    pub fn endpoint_for(&self, asked: u16) -> Endpoint<A> {
        Endpoint {
            addr: self.endpoint.addr,
            port: if self.endpoint.port == 0 {
                asked
            } else {
                self.endpoint.port
            },
        }
    }
}

/// What a new flow asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<A: Address = Ipv4Addr> {
    /// Client address and port.
    pub client: Endpoint<A>,
    /// VIP and port asked for.
    pub vip: Endpoint<A>,
}

/// No backend can take a new flow (all quiesced, or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoBackend;

/// Maglev parameters of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaglevParams {
    /// Table size (prime).
    pub size: u32,
    /// Seed shared by every gateway, so tables agree across nodes.
    pub seed: u64,
}

/// A scheduler for one backend list.
#[derive(Debug, Clone)]
pub enum Scheduler {
    /// Round robin.
    Rr(rr::RoundRobin),
    /// Weighted round robin.
    Wrr(WeightedRoundRobin),
    /// lc, wlc, sed, nq.
    Least(Least),
    /// dh, sh.
    Hash(BucketHash),
    /// Maglev.
    Maglev(Maglev),
    /// random, twos.
    Random(WeightedRandom),
    /// lblc, lblcr.
    Locality(Locality),
    /// fo, ovf.
    Failover(Failover),
}

impl Scheduler {
    /// Builds the scheduler `kind` for `backends`.
    pub fn new<A: Address>(
        kind: Kind,
        flags: SchedulerFlags,
        backends: &[SchedBackend<A>],
        maglev: MaglevParams,
        rng_seed: u64,
    ) -> Scheduler {
        match kind {
            Kind::Rr => Scheduler::Rr(rr::RoundRobin::new(backends)),
            Kind::Wrr => Scheduler::Wrr(rr::WeightedRoundRobin::new(backends)),
            Kind::Lc | Kind::Wlc | Kind::Sed | Kind::Nq => {
                Scheduler::Least(least::Least::new(kind))
            }
            Kind::Dh | Kind::Sh => {
                Scheduler::Hash(hash::BucketHash::new(kind == Kind::Dh, flags, backends))
            }
            Kind::Mh => Scheduler::Maglev(maglev::Maglev::new(flags, backends, maglev)),
            Kind::Random | Kind::Twos => Scheduler::Random(random::WeightedRandom::new(
                kind == Kind::Twos,
                backends,
                rng_seed,
            )),
            Kind::Lblc | Kind::Lblcr => Scheduler::Locality(Locality::new(kind, backends)),
            Kind::Fo | Kind::Ovf => Scheduler::Failover(Failover::new(kind == Kind::Ovf)),
        }
    }

    /// Takes over the state `prev` (built for `before`) keeps across an
    /// edit of the service, as IPVS keeps its scheduler's data when a
    /// destination is added, edited or removed: lblc's and lblcr's
    /// entries, by stable backend id. Other schedulers start afresh.
    pub fn carry<A: Address>(
        &mut self,
        prev: &Scheduler,
        before: &[SchedBackend<A>],
        backends: &[SchedBackend<A>],
    ) {
        if let (Scheduler::Locality(new), Scheduler::Locality(old)) = (self, prev) {
            new.carry(old, before, backends);
        }
    }

    /// Chooses the backend (an index into `backends`) of a new flow at
    /// `now` (seconds, the flow table's clock).
    #[inline]
    pub fn pick<A: Address>(
        &mut self,
        backends: &[SchedBackend<A>],
        req: &Request<A>,
        counts: &ConnCounts,
        now: u32,
    ) -> Result<usize, NoBackend> {
        match self {
            Scheduler::Rr(s) => s.pick(backends),
            Scheduler::Wrr(s) => s.pick(backends),
            Scheduler::Least(s) => s.pick(backends, counts),
            Scheduler::Hash(s) => s.pick(backends, req),
            Scheduler::Maglev(s) => s.pick(backends, req),
            Scheduler::Random(s) => s.pick(backends, counts),
            Scheduler::Locality(s) => s.pick(backends, counts, now),
            Scheduler::Failover(s) => s.pick(backends, counts),
        }
        .ok_or(NoBackend)
    }

    /// The backend [`Scheduler::pick`] would choose for the `offset`-th
    /// new flow from now (0: the next), if no other pick or count change
    /// came between, without changing anything; `None` where that cannot
    /// be told cheaply (schedulers that read every backend's connection
    /// counts, random ones; round-robin ones past [`PEEK_MAX`]). Only a
    /// guess for prefetching: a wrong one costs a wasted fetch.
    #[inline]
    pub fn peek<A: Address>(
        &self,
        backends: &[SchedBackend<A>],
        req: &Request<A>,
        offset: usize,
    ) -> Option<usize> {
        match self {
            Scheduler::Rr(s) if offset <= PEEK_MAX => s.peek(backends, offset),
            Scheduler::Wrr(s) if offset <= PEEK_MAX => {
                let mut s = s.clone();
                (0..offset).try_for_each(|_| s.pick(backends).map(drop))?;
                s.pick(backends)
            }
            Scheduler::Hash(s) => s.pick(backends, req),
            Scheduler::Maglev(s) => s.pick(backends, req),
            _ => None,
        }
    }

    /// Heap bytes this scheduler holds (its part of the service's
    /// footprint; the Maglev table dominates).
    pub fn memory_bytes(&self) -> usize {
        match self {
            Scheduler::Hash(_) => BUCKETS * std::mem::size_of::<u16>(),
            Scheduler::Maglev(s) => s.memory_bytes(),
            Scheduler::Random(s) => s.memory_bytes(),
            Scheduler::Locality(s) => s.memory_bytes(),
            Scheduler::Rr(_) | Scheduler::Wrr(_) | Scheduler::Least(_) | Scheduler::Failover(_) => {
                0
            }
        }
    }
}

/// Client persistence of a service (IPVS `-p`, sessionAffinity ClientIP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persist<A: Address = Ipv4Addr> {
    /// Service id (recorded in templates).
    pub service: u32,
    /// Protocol of the service.
    pub proto: L4Proto,
    /// Seconds a template lives after the last new connection it placed.
    pub timeout: u32,
    /// Netmask applied to client addresses (IPv6: the prefix as a mask).
    pub netmask: A,
}

/// Persistence first, then the scheduler: a client (under the netmask)
/// with a live template goes to its backend while that backend is still
/// in the list, and has a weight unless `expire_quiescent` is off (IPVS's
/// `expire_quiescent_template`); otherwise the scheduler picks and the
/// template is (re)written. A template that cannot be stored (table full
/// of ESTABLISHED flows) does not fail the flow: it is scheduled anyway.
#[allow(clippy::too_many_arguments)]
pub fn pick_persistent<A: Address>(
    sched: &mut Scheduler,
    backends: &[SchedBackend<A>],
    req: &Request<A>,
    counts: &ConnCounts,
    persist: &Persist<A>,
    expire_quiescent: bool,
    table: &mut FlowTable<A>,
    now: u32,
    obs: &mut impl Observer<A>,
) -> Result<usize, NoBackend> {
    let net = req.client.addr.masked(persist.netmask);
    let key = FlowTable::template_key(net, req.vip, persist.proto);
    if let Some((id, endpoint)) = table.template_lookup(&key, now) {
        let found = backends.iter().position(|b| {
            b.id == id && b.endpoint == endpoint && (b.available() || !expire_quiescent)
        });
        if let Some(i) = found {
            let _ = table.template_set(
                &key,
                persist.service,
                id,
                endpoint,
                persist.timeout,
                now,
                obs,
            );
            return Ok(i);
        }
    }
    let i = sched.pick(backends, req, counts, now)?;
    let b = backends[i];
    let _ = table.template_set(
        &key,
        persist.service,
        b.id,
        b.endpoint,
        persist.timeout,
        now,
        obs,
    );
    Ok(i)
}

/// Greatest common divisor.
pub(crate) fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Backends `A, B, C, ...` at 198.18.1.1, .2, ... port 80 with `weights`.
#[cfg(test)]
pub(crate) fn test_backends(weights: &[u32]) -> Vec<SchedBackend> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| SchedBackend {
            id: i as u32,
            endpoint: Endpoint {
                addr: Ipv4Addr::from(0xc612_0101 + i as u32),
                port: 80,
            },
            weight: w,
            plan: Default::default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `peek(k)` names the pick k new flows from now (for the schedulers
    /// it answers for) and changes nothing; the others answer `None`.
    #[test]
    fn peek_names_the_picks_to_come_without_changing_anything() {
        let b = test_backends(&[4, 3, 0, 2]);
        let counts = ConnCounts::new(b.len(), 1);
        let maglev = MaglevParams {
            size: 251,
            seed: DEFAULT_SEED,
        };
        let req = |port: u16| Request {
            client: Endpoint {
                addr: Ipv4Addr::new(198, 18, 0, 2),
                port,
            },
            vip: Endpoint {
                addr: Ipv4Addr::new(198, 19, 0, 1),
                port: 80,
            },
        };
        for kind in [Kind::Rr, Kind::Wrr, Kind::Sh, Kind::Dh, Kind::Mh] {
            let mut s = Scheduler::new(kind, SchedulerFlags::default(), &b, maglev, 7);
            for round in 0..20u16 {
                let guesses: Vec<_> = (0..=PEEK_MAX).map(|k| s.peek(&b, &req(round), k)).collect();
                // The round-robin ones answer every offset the pipeline
                // asks (hashing ones answer `None` for a quiesced pick).
                if matches!(kind, Kind::Rr | Kind::Wrr) {
                    assert!(guesses.iter().all(Option::is_some), "{kind:?}");
                }
                let mut ahead = s.clone();
                let picks: Vec<_> = (0..=PEEK_MAX)
                    .map(|_| ahead.pick(&b, &req(round), &counts, 0).ok())
                    .collect();
                assert_eq!(guesses, picks, "{kind:?} round {round}");
                assert_eq!(s.peek(&b, &req(round), 0), guesses[0], "{kind:?}");
                let _ = s.pick(&b, &req(round), &counts, 0);
            }
        }
        for kind in [Kind::Lc, Kind::Wlc, Kind::Random] {
            let s = Scheduler::new(kind, SchedulerFlags::default(), &b, maglev, 7);
            assert_eq!(s.peek(&b, &req(1), 0), None, "{kind:?}");
        }
    }
}
