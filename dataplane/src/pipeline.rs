//! The per-packet pipeline of one worker, sans-IO: a received frame and
//! the time in, a verdict out (forward, answer, consumed, or drop with a
//! reason), the frame rewritten in place.
//!
//! Both families run the same steps (one [`Half`] each: its flow table,
//! services, owned addresses, neighbours and SNAT endpoints; the code is
//! generic over [`Family`] and monomorphised per family):
//! classify → ARP or neighbour discovery / ICMP answers for owned
//! addresses → conntrack lookup →
//! TTL (a packet that cannot be forwarded creates nothing and is answered
//! with an ICMP time exceeded) → on a hit, IPVS's rules for flows whose
//! client port is reused or whose backend left ([`ConnRules`]) → on a
//! miss in the original direction: service lookup, source ACL, the
//! new-flow rule (TCP: SYN only, except under Maglev), the L4 checksum,
//! persistence and scheduler, a SNAT port from this worker's slice (when
//! the backend's forwarding plan takes one), insert → the flow's plan
//! ([`crate::forward`]) says what the packet becomes (full NAT: the
//! rewrite with incremental checksums, TTL, MACs). ICMP errors about a
//! tracked flow are translated like it (RELATED).
//!
//! An established full-NAT packet (a hit, TCP without SYN or UDP, the
//! backend's next hop cached in its counter line) takes the express lane
//! (`pipeline/express.rs`): the same verdict and effects from the flow
//! entry and the backend's counter line alone, without the general
//! path's questions; anything else it declines untouched.
//!
//! The jobs beside the verdict live in their own modules: next hops and
//! ARP requests in [`crate::neighbours`], SNAT endpoints in
//! [`crate::snat`], flow events in [`crate::events`], counters in
//! [`crate::counters`], forwarding in [`crate::forward`]; the pipeline
//! keeps the owned-address set (VIPs and SNAT addresses, in a
//! [`Keyed`] map a batch probes in stages, as it does the services).
//!
//! The rules on a hit, as IPVS applies `net.ipv4.vs.*` (kube-proxy sets
//! each to 1): a SYN on a flow in TIME_WAIT or CLOSE ends that flow and is
//! scheduled as a new connection, counted like one (`conn_reuse_mode`);
//! a flow whose backend or service was removed ends at its next packet,
//! a TCP segment other than a SYN being answered with a RST as the
//! kernel's own stack would, and a SYN to a quiesced backend is
//! scheduled afresh (`expire_nodest_conn`).
//!
//! Invariants: every frame gets exactly one verdict, and every verdict is
//! counted, so `rx = forwarded + answered + consumed + Σ drops` always;
//! nothing here allocates per packet (the neighbour table and the ARP queue
//! are bounded and grow only when learning new next hops).
//!
//! Fragment policy: IPv4 and IPv6 fragments are dropped and counted
//! (`fragment`);
//! clients behind xvs use PMTU discovery, which the ICMP error translation
//! keeps working.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use smoltcp::wire::{EthernetAddress, EthernetFrame};
use xvs_config::{Address, ConnRules, Encap, PortRange, ServiceKey, UnknownPort};
use xvs_conntrack::{
    tcp_flags, Direction, Endpoint, Filter, FlowId, FlowInfo, FlowKey, FlowState, FlowTable,
    InsertError, Keyed, L4Proto, NewFlow, Packet, Removal, Timeouts,
};

pub use crate::counters::Counters;
use crate::events::{EventKind, EventSender, FlowEvent};
use crate::family::{Answer, Family, IpPacket};
use crate::forward::{NextHop, Plan, Rewrite, Route};
use crate::neighbours::Neighbours;
use crate::sched::{pick_persistent, Request};
pub use crate::services::AnyService;
use crate::services::{CompiledService, ServiceCounts, ServiceTable};
use crate::snat::SnatEndpoints;
use crate::sync::{refresh_due, Op, SyncQueue, SyncRecord};
use crate::traffic::DestState;
use crate::wire::answer::arp_reply;
use crate::wire::encap::{Encapsulated, Outer, Wrap};
use crate::wire::ndp::{advertise, solicited_node};
use crate::wire::{classify, ArpOp, DropReason, Fragment, Frame, IcmpErrorNat, Ipv6, Nat, Ndp, L4};

/// SNAT ports tried for one new flow before giving up.
const SNAT_TRIES: u32 = 64;
/// SNAT ports looked at for a free one before taking the first one whose
/// flow can be reclaimed (bounds the lookups per new flow in a flood).
const RECLAIM_AFTER: u32 = 8;
/// Seconds a worker counts as under pressure after it reclaimed a SNAT
/// port or early-dropped a flow (or while its table is 7/8 full): its new
/// TCP flows get the short `syn_recv_pressure` timeout meanwhile.
const PRESSURE_HOLD: u32 = 2;

/// Which side of the gateway a frame comes from or goes to. In one-arm
/// mode both sides are the same interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Towards clients.
    Client,
    /// Towards backends.
    Backend,
}

/// What to do with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Transmit the rewritten frame (`len` bytes) on side `to`.
    Forward {
        /// Length.
        len: usize,
        /// Side to send it on.
        to: Side,
    },
    /// Transmit the answer built in the frame (`len` bytes) back on the
    /// side it came from.
    Answer(usize),
    /// Used up (an ARP reply learned); nothing to send.
    Consumed,
    /// Drop, for this reason.
    Drop(DropReason),
    /// The frame is untouched and its flow's next hop is being asked for:
    /// hold it and run it again once the neighbour is learned (the
    /// kernel's unresolved queue, `unres_qlen`), or give it up with
    /// [`Pipeline::give_up`]. Not counted until one or the other.
    Unresolved,
}

/// A frame's flow as looked up ahead of processing, with its batch (the
/// batch's flow-table reads overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lookup {
    /// Not looked up (no flow key, or no lookup ahead).
    #[default]
    NotYet,
    /// No flow then (a frame of the same batch may create it: looked up
    /// again if the table took a key that may be it since, see
    /// [`FlowTable::absent_since`]), and whether the destination was
    /// owned (a miss's next question, answered with its service lookup;
    /// ownership changes only between batches).
    Miss {
        /// The destination was owned at the lookup, or it and the
        /// port named a service (a service's VIP is owned).
        owned: bool,
        /// The position of the service the destination names in its
        /// table ([`ServiceTable::at`]), [`NO_SERVICE`] if none: a new
        /// flow's, whose reply key is guessed and fetched a few frames
        /// ahead ([`Pipeline::prefetch_ahead`]), and whose service is
        /// not looked up again.
        service: u32,
        /// The key's index hash ([`FlowTable::key_hash`]).
        hash: u64,
        /// The mark the table was looked up at
        /// ([`FlowTable::lookup_batch`]).
        mark: u32,
    },
    /// This flow, in this direction, found at this release epoch of its
    /// table ([`FlowTable::epoch`]); used only if the epoch is unchanged
    /// or else the entry still holds the key (a frame of the same batch
    /// may have ended the flow and another taken its slot).
    Hit(FlowId, Direction, u32),
}

/// [`Lookup::Miss`]'s service when the destination names none.
pub const NO_SERVICE: u32 = u32::MAX;

/// Of the services the misses of a run of frames named (`services`,
/// [`NO_SERVICE`] for a frame that is no miss to a service): how many
/// are `service` and how many are any, the new flows expected before the
/// frame after them (`service` is never [`NO_SERVICE`]).
#[inline(always)]
fn new_flows_among<'a>(services: impl IntoIterator<Item = &'a u32>, service: u32) -> (usize, u32) {
    let (mut same, mut ahead) = (0, 0);
    for &s in services {
        same += usize::from(s == service);
        ahead += u32::from(s != NO_SERVICE);
    }
    (same, ahead)
}

/// How many frames ahead of the one processed
/// [`Pipeline::prefetch_ahead`] fetches a new flow's reply-key bucket: far
/// enough for the line to arrive (a DRAM miss is a few frames' work), near
/// enough that the guess it rests on still holds.
pub const PREFETCH_AHEAD: usize = 8;

/// How many frames of a received batch are looked up together
/// ([`Pipeline::lookup_prepared`]) and then processed, before the next
/// ones are looked up ([`lookup_chunks`]). Measured on the 1M-flow
/// pipeline bench (100,000 services, frames of 64 at once, count-only
/// runs): established packets cost 118, 97, 80, 88, 91, 95 and 96 ns
/// with chunks of 8, 12, 16, 20, 24, 32 and 64 frames; new flows 271 ns
/// with 16 against 311 with 64; IPv6 111-124 against 125-139 ns
/// established, 345-359 against 418-446 new. The time saved is the
/// processing's, not the lookup's (its share of a batch hardly moved):
/// a chunk's frames find what its lookup fetched (some 4 lines a frame
/// for a hit, 10 for a new flow) still in the first-level cache, where
/// 64 frames' lines fill it (and the frames' headers, one UMEM stride
/// apart, all fall in the same sets of it). Why 32 gains nothing is not
/// understood: 16 is the measured best, not a derived one; below it too
/// few of a stage's misses overlap. A cache-resident table's frames
/// gain and lose nothing measurable (new flows 127 against 128 ns,
/// medians of five runs alternately).
pub const LOOKUP_CHUNK: usize = 16;

/// The chunks a batch of `n` frames is looked up and processed in, in
/// order ([`LOOKUP_CHUNK`] frames each, the last one shorter).
pub fn lookup_chunks(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n)
        .step_by(LOOKUP_CHUNK)
        .map(move |lo| lo..(lo + LOOKUP_CHUNK).min(n))
}

// Every frame between the one processed and the one fetched for may be a
// new flow of the latter's service (one busy service: all of them): the
// scheduler's guess must reach that far, or a single hot service's new
// flows are never fetched ahead.
const _: () = assert!(PREFETCH_AHEAD <= crate::sched::PEEK_MAX);

mod express;

/// The verdict on a frame rewritten for `side` (or why it could not be).
fn sent<I: IpPacket>(rewritten: Result<(), DropReason>, ip: &I, side: Side) -> Verdict {
    match rewritten {
        Ok(()) => Verdict::Forward {
            len: crate::wire::classify::ETH_HEADER_LEN + ip.total_len() as usize,
            to: side,
        },
        Err(r) => Verdict::Drop(r),
    }
}

/// A received IP frame: its buffer (room beyond the frame for answers
/// that grow) and the time.
struct Rx<'a> {
    buf: &'a mut [u8],
    now: u32,
}

/// A frame classified ahead of processing, so a batch's flows can be
/// looked up together.
#[derive(Debug, Clone, Copy)]
pub struct Prepared {
    frame: Result<Frame, DropReason>,
}

impl Prepared {
    /// Whether it is an ARP reply or a neighbour advertisement (which
    /// every worker learns from).
    pub fn is_arp_reply(&self) -> bool {
        match self.frame {
            Ok(Frame::Arp(a)) => a.op == ArpOp::Reply,
            Ok(Frame::Ipv6(ip)) => matches!(ip.l4, L4::Neighbour(Ndp { solicit: false, .. })),
            _ => false,
        }
    }

    /// Classifies `frame` (no state is touched).
    #[inline]
    pub fn of(frame: &[u8]) -> Prepared {
        Prepared {
            frame: classify(frame),
        }
    }

    /// A placeholder (an empty frame's classification) for a batch's
    /// array, overwritten by [`Prepared::classify`] before it is read.
    pub const EMPTY: Prepared = Prepared {
        frame: Err(DropReason::EthTruncated),
    };

    /// [`Prepared::of`] written in place: the classification is stored
    /// straight into `self` (a slot of the batch's array) instead of
    /// being built aside and copied in (84 bytes, field by field, 45
    /// instructions of a 670-instruction established packet).
    #[inline]
    pub fn classify(&mut self, frame: &[u8]) {
        crate::wire::classify_into(frame, &mut self.frame);
    }

    /// The flow key of a whole TCP or UDP packet of family `A`.
    #[inline]
    fn key<A: Family>(&self) -> Option<FlowKey<A>> {
        let ip = A::packet(self.frame.as_ref().ok()?)?;
        (matches!(ip.l4(), L4::Tcp { .. } | L4::Udp { .. }) && ip.fragment() == Fragment::Whole)
            .then(|| ip.key())
            .flatten()
    }
}

/// Static settings of one worker's pipeline.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Worker index (its row in the connection counts).
    pub worker: usize,
    /// The client-facing interface's Ethernet address.
    pub mac: EthernetAddress,
    /// The backend-facing interface's Ethernet address (the same in
    /// one-arm mode).
    pub backend_mac: EthernetAddress,
    /// SNAT addresses (at least one; the first also sources ARP
    /// requests). Every address has the worker's whole port slice, so
    /// each adds `snat_ports.size()` flows per backend.
    pub snat_addrs: Vec<Ipv4Addr>,
    /// IPv6 SNAT addresses (none: IPv6 services cannot be served; the
    /// first sources neighbour solicitations).
    pub snat_addrs6: Vec<Ipv6Addr>,
    /// This worker's SNAT ports (both families).
    pub snat_ports: PortRange,
    /// Flow table capacity.
    pub capacity: u32,
    /// Conntrack timeouts.
    pub timeouts: Timeouts,
    /// IPVS's reuse and removal rules.
    pub rules: ConnRules,
    /// What a VIP port without a service answers.
    pub unknown_port: UnknownPort,
    /// How tunnel backends' packets are encapsulated.
    pub tunnel: xvs_config::Tunnel,
    /// MTU of the backend-facing link: what an encapsulated packet must
    /// fit.
    pub backend_mtu: u16,
}

/// What a worker's pipeline shares between its families: settings,
/// counters, pressure, events.
struct Core {
    cfg: PipelineConfig,
    /// Until when (worker clock) this worker is under pressure.
    pressure_until: u32,
    counters: Counters,
    /// Where flow events go (none: not produced).
    events: Option<EventSender>,
    /// Where sync records go (none: no flow synchronisation).
    sync: Option<Arc<SyncQueue>>,
    /// This batch's sync records, published together at its end
    /// ([`Pipeline::flush_sync`]): one record written into the shared
    /// queue between two packets costs a cache miss on the queue's slot
    /// (the sync thread's core last wrote it); a run of them streams.
    staged: Vec<SyncRecord>,
    /// Whether established full-NAT packets take the express lane
    /// (`express`); off, every packet takes the general path.
    express: bool,
    /// By position in the batch last looked up
    /// ([`Pipeline::lookup_prepared`]; its first
    /// [`xvs_conntrack::BATCH`] frames): the service a miss named, else
    /// [`NO_SERVICE`]. What [`Pipeline::prefetch_ahead`] counts the new
    /// flows between two frames over: dense, where the lookups' enum is
    /// not.
    miss_services: [u32; xvs_conntrack::BATCH],
    /// Whether a miss of the batch last looked up named a service: if
    /// none did (a batch of established flows), there is no reply key to
    /// fetch ahead and [`Pipeline::prefetch_ahead`] returns at once.
    fetch_replies: bool,
}

/// Sync records a batch stages before they are published.
const STAGED: usize = 64;

impl Core {
    /// Stages a sync record (published at the batch's end, or now when
    /// the stage is full).
    #[inline]
    fn stage(&mut self, r: SyncRecord) {
        if self.staged.len() == STAGED {
            self.flush_sync();
        }
        self.staged.push(r);
    }

    /// Publishes the staged sync records.
    fn flush_sync(&mut self) {
        if let Some(q) = &self.sync {
            for r in self.staged.drain(..) {
                q.push(r);
            }
        }
        self.staged.clear();
    }

    /// Pushes a flow event, when events are produced (inlined: called
    /// out of line, passing the endpoints costs more than the push).
    #[inline(always)]
    fn event<A: Address>(
        &mut self,
        now: u32,
        kind: EventKind,
        protocol: u8,
        src: Endpoint<A>,
        dst: Endpoint<A>,
        [backend, snat]: [Endpoint<A>; 2],
    ) {
        let worker = self.cfg.worker as u16;
        if let Some(ev) = &mut self.events {
            ev.push(FlowEvent {
                time: now,
                worker,
                kind,
                protocol,
                src: FlowEvent::wide(src),
                dst: FlowEvent::wide(dst),
                backend: FlowEvent::wide(backend),
                snat: FlowEvent::wide(snat),
            });
        }
    }

    /// Our Ethernet address on `side`.
    fn mac(&self, side: Side) -> EthernetAddress {
        match side {
            Side::Client => self.cfg.mac,
            Side::Backend => self.cfg.backend_mac,
        }
    }
}

/// A miss in the batch lookup's stages: its index in the batch's keys, the
/// hashes of its service key and of its destination, and the candidate
/// positions their buckets named.
#[derive(Debug, Clone, Copy, Default)]
struct StagedMiss {
    key: usize,
    service_hash: u64,
    service_at: Option<u32>,
}

impl StagedMiss {
    /// The miss of key `k` (at `key` in the batch's keys), its service
    /// key's bucket fetched: the first stage of its service lookup.
    #[inline(always)]
    fn of<A: Family>(services: &ServiceTable<A>, key: usize, k: &FlowKey<A>) -> StagedMiss {
        let service_hash = services.key_hash(k.dst, k.proto, k.dst_port);
        services.prefetch_hash(service_hash);
        StagedMiss {
            key,
            service_hash,
            service_at: None,
        }
    }
}

/// The batch lookup's working arrays, kept from batch to batch: only the
/// first entries a batch fills are read, so they are never initialised
/// again (as arrays on the stack, every call, the idle worker's included,
/// wrote 6 KiB of them before looking at its first key).
struct LookupScratch<A: Family> {
    /// The batch's keys, in frame order (frames without one skipped).
    keys: [FlowKey<A>; xvs_conntrack::BATCH],
    /// The frame of each key.
    at: [usize; xvs_conntrack::BATCH],
    /// Each key's flow, if the table has it.
    hits: [Option<(FlowId, Direction)>; xvs_conntrack::BATCH],
    /// Each key's index hash.
    hashes: [u64; xvs_conntrack::BATCH],
    /// The misses, in key order.
    miss: [StagedMiss; xvs_conntrack::BATCH],
    /// Each miss's service position, or [`NO_SERVICE`].
    found: [u32; xvs_conntrack::BATCH],
    /// Whether the last chunk looked up in a cache-resident table had a
    /// miss (the next one fetches its buckets first).
    missed: bool,
}

impl<A: Family> LookupScratch<A> {
    fn new() -> Box<LookupScratch<A>> {
        let zero = Endpoint {
            addr: A::UNSPECIFIED,
            port: 0,
        };
        Box::new(LookupScratch {
            keys: [FlowKey::between(zero, zero, L4Proto::Tcp); xvs_conntrack::BATCH],
            at: [0; xvs_conntrack::BATCH],
            hits: [None; xvs_conntrack::BATCH],
            hashes: [0; xvs_conntrack::BATCH],
            missed: false,
            miss: [StagedMiss::default(); xvs_conntrack::BATCH],
            found: [NO_SERVICE; xvs_conntrack::BATCH],
        })
    }
}

/// A cache-resident table's lookups of a chunk (`prep`), each key as it
/// is read: a hit's result into `out`, a miss's key, frame and hash kept
/// in `keep`'s arrays; how many were kept. With `FETCHED`, frame `i`'s
/// hash was computed (and its bucket fetched) ahead, into `keep`'s
/// `hashes[i]`: a miss's is moved down to its place among the kept, never
/// past a frame still to be read (kept ones are at most as many as read).
#[inline(always)]
fn look_each<A: Family, const FETCHED: bool>(
    table: &mut FlowTable<A>,
    prep: &[Prepared],
    out: &mut [Lookup],
    epoch: u32,
    keep: (
        &mut [FlowKey<A>; xvs_conntrack::BATCH],
        &mut [usize; xvs_conntrack::BATCH],
        &mut [u64; xvs_conntrack::BATCH],
    ),
) -> usize {
    let (keys, at, hashes) = keep;
    let mut n = 0;
    for (i, p) in prep.iter().enumerate() {
        let Some(k) = p.key::<A>() else {
            continue;
        };
        let hash = if FETCHED {
            hashes[i]
        } else {
            table.key_hash(&k)
        };
        if let Some((id, dir)) = table.lookup_hashed(&k, hash) {
            out[i] = Lookup::Hit(id, dir, epoch);
        } else {
            (keys[n], at[n], hashes[n]) = (k, i, hash);
            n += 1;
        }
    }
    n
}

/// The observer that keeps `services`' connection counts right for
/// `core`'s worker, and stages its sync records.
fn counts_of<'a, A: Family>(services: &'a ServiceTable<A>, core: &'a Core) -> ServiceCounts<'a, A> {
    ServiceCounts {
        table: services,
        worker: core.cfg.worker,
        sync: core.sync.as_deref(),
    }
}

/// One family's state in a worker: its flows, services, owned addresses,
/// next hops and SNAT endpoints.
pub struct Half<A: Family> {
    /// Flows.
    pub table: FlowTable<A>,
    /// Services.
    pub services: ServiceTable<A>,
    /// Addresses answered for (VIPs and SNAT addresses).
    owned: Keyed<A, ()>,
    /// Next hops and the requests to send.
    neighbours: Neighbours<A>,
    /// SNAT endpoints: the search for a free one resumes where the last
    /// one ended, where the oldest flows were, so a free endpoint is
    /// usually the first.
    snat: SnatEndpoints<A>,
    /// Outer source of tunnels (the configured one, else the first SNAT
    /// address), and the network a client-derived one comes from
    /// (`(net, mask)`).
    tunnel_src: A,
    tunnel_net: Option<(A, A)>,
    /// The batch lookup's arrays.
    scratch: Box<LookupScratch<A>>,
}

/// One worker's pipeline: IPv4 and IPv6 side by side.
pub struct Pipeline {
    core: Core,
    /// IPv4 flows, services and next hops.
    pub v4: Half<Ipv4Addr>,
    /// IPv6 flows, services and next hops.
    pub v6: Half<Ipv6Addr>,
}

impl<A: Family> Half<A> {
    fn new(
        mut table: FlowTable<A>,
        snat: Vec<A>,
        ports: PortRange,
        mac: EthernetAddress,
        tunnel: (Option<A>, Option<(A, A)>),
    ) -> Half<A> {
        table.count_snat(&snat);
        let mut owned = Keyed::new();
        owned.extend(snat.iter().copied());
        let first = snat.first().copied().unwrap_or(A::UNSPECIFIED);
        Half {
            tunnel_src: tunnel.0.unwrap_or(first),
            tunnel_net: tunnel.1,
            table,
            services: ServiceTable::default(),
            owned,
            // Requests come from the first SNAT address (see
            // `share_with_host`).
            neighbours: Neighbours::new(snat.first().copied().unwrap_or(A::UNSPECIFIED), mac),
            snat: SnatEndpoints::new(snat, ports),
            scratch: LookupScratch::new(),
        }
    }

    /// The flow table, and the observer that keeps this worker's
    /// connection counts of its services right.
    fn split(&mut self, worker: usize) -> (&mut FlowTable<A>, ServiceCounts<'_, A>) {
        let counts = ServiceCounts {
            table: &self.services,
            worker,
            sync: None,
        };
        (&mut self.table, counts)
    }

    fn is_snat(&self, addr: A) -> bool {
        self.snat.is_snat(addr)
    }

    /// Whether `ip` is addressed to this gateway: its destination is an
    /// owned address, or the destination and port name a service. The
    /// runtime owns a service's VIP before it adds the service and
    /// disowns it only after the VIP's last service is gone, so the
    /// second holds only when the first does; asking the service table
    /// first, as the batch lookup does (it looks the service up
    /// anyway), spares a new flow the owned set's probe.
    fn owns(&self, ip: &A::Ip) -> bool {
        self.owned.contains(&ip.dst())
            || ip
                .key()
                .is_some_and(|k| self.services.find(k.dst, k.proto, k.dst_port).is_some())
    }

    /// The SNAT port `ip` is addressed to, if it is a reply (or an ICMP
    /// error about a flow) to a SNAT address.
    fn snat_port_of(&self, ip: &A::Ip) -> Option<u16> {
        if !self.is_snat(ip.dst()) {
            return None;
        }
        match ip.l4() {
            L4::Tcp { dst_port, .. } | L4::Udp { dst_port, .. } => Some(dst_port),
            L4::IcmpError(e) if self.is_snat(e.inner.src) => Some(e.inner.src_port),
            _ => None,
        }
    }

    /// [`Pipeline::dump`] of this family's table (nothing when an
    /// address of `filter` is of the other family).
    fn dump(
        &self,
        filter: &Filter<IpAddr>,
        cursor: u32,
        budget: u32,
        now: u32,
    ) -> (Vec<FlowInfo<IpAddr>>, Option<u32>) {
        let Some(filter) = filter.narrow::<A>() else {
            return (Vec::new(), None);
        };
        let mut flows = Vec::new();
        let next = self.table.dump(&filter, cursor, budget, now, &mut flows);
        (flows.iter().map(FlowInfo::wide).collect(), next)
    }

    /// [`Pipeline::delete_matching`] in this family's table.
    fn delete_matching(
        &mut self,
        filter: &Filter<IpAddr>,
        cursor: u32,
        budget: u32,
        worker: usize,
    ) -> (u32, Option<u32>) {
        let Some(filter) = filter.narrow::<A>() else {
            return (0, None);
        };
        let (table, mut obs) = self.split(worker);
        table.delete_matching(&filter, cursor, budget, &mut obs)
    }

    /// Adopts the flows of a table read back from a state file (see
    /// [`Pipeline::adopt`]).
    fn adopt(&mut self, now: u32, worker: usize) -> xvs_conntrack::Adopted {
        let services = &self.services;
        let resolve = |f: xvs_conntrack::FlowRef<'_, A>| {
            let vip = f.vip();
            let slot = services.find(vip.addr, f.proto(), vip.port)?;
            let b = f.backend();
            let backend = slot.svc.backend(b)?;
            Some((slot.svc.id, backend.id))
        };
        let mut counts = ServiceCounts {
            table: &self.services,
            worker,
            sync: None,
        };
        self.table.adopt(now, resolve, &mut counts)
    }

    /// Applies one peer's record (see [`Pipeline::apply_sync`]); whether
    /// it was.
    fn apply_sync(&mut self, r: &SyncRecord, worker: usize, now: u32) -> bool {
        let end = |e: Endpoint<IpAddr>| {
            Some(Endpoint {
                addr: A::from_ip(e.addr)?,
                port: e.port,
            })
        };
        let (Some(client), Some(vip), Some(backend), Some(snat)) =
            (end(r.client), end(r.vip), end(r.backend), end(r.snat))
        else {
            return false;
        };
        let Some(slot) = self.services.find(vip.addr, r.proto, vip.port) else {
            return false;
        };
        let svc = &*slot.svc;
        let Some(b) = svc.backend(backend).copied() else {
            return false;
        };
        let mut obs = ServiceCounts {
            table: &self.services,
            worker,
            sync: None,
        };
        if r.state == FlowState::Template {
            let Some(p) = &svc.persist else { return false };
            let key = FlowTable::template_key(client.addr, vip, p.proto);
            let timeout = r.timeout.min(p.timeout);
            return self
                .table
                .template_set(&key, svc.id, b.id, b.endpoint, timeout, now, &mut obs)
                .is_ok();
        }
        if r.op == Op::Delete {
            let key = FlowKey::between(client, vip, r.proto);
            return match self.table.lookup(&key) {
                Some((id, Direction::Original)) if self.table.flow(id).is_peer() => {
                    self.table.remove(id, &mut obs);
                    true
                }
                _ => false,
            };
        }
        // This gateway forwards as its own backend says; a peer's flow to
        // a backend forwarded another way here is not installed.
        if b.plan.is_one_way() != r.one_way {
            return false;
        }
        let new = NewFlow {
            client,
            vip,
            backend,
            snat,
            proto: r.proto,
            service: svc.id,
            backend_id: b.id,
            client_mac: r.client_mac,
            plan: b.plan.tag(),
            one_way: r.one_way,
        };
        // No ARP request here: a backup's SNAT address is not its own yet,
        // and a request from it would move the backends' entry for it.
        // The first packet after a takeover asks (and is held meanwhile).
        self.table.install(&new, r.state, now, &mut obs).is_ok()
    }

    /// Adds or replaces a service (its next hops are resolved at once).
    fn upsert_service(&mut self, svc: Arc<CompiledService<A>>, worker: usize) {
        for b in svc.backends.iter() {
            self.neighbours.resolve(b.endpoint.addr);
        }
        self.services.upsert(svc, worker);
    }

    /// Looks a batch's keys up at once (see [`Pipeline::lookup_prepared`]);
    /// whether any miss named a service (a new flow's reply key to fetch
    /// ahead).
    fn lookup_batch(
        &mut self,
        prepared: &[Prepared],
        out: &mut [Lookup],
        miss_services: &mut [u32; xvs_conntrack::BATCH],
        worker: usize,
    ) -> bool {
        let mut to_services = false;
        let LookupScratch {
            keys,
            at,
            hits,
            hashes,
            miss,
            found,
            missed,
        } = &mut *self.scratch;
        let resident = self.table.is_cache_resident();
        let epoch = self.table.epoch();
        for (c, (prep, out)) in prepared
            .chunks(xvs_conntrack::BATCH)
            .zip(out.chunks_mut(xvs_conntrack::BATCH))
            .enumerate()
        {
            // `keys[..n]` (with `at` and `hashes`) end up holding at least
            // the misses; `miss` names them.
            let mut n = 0;
            let mut misses = 0;
            let mark = if resident {
                // A cache-resident table: its flows' buckets and entries
                // stay in cache, so each key is looked up as it is read,
                // and only the misses are kept (the staged way cost 50
                // instructions a packet more: the copies of every key and
                // result, and its passes).
                //
                // A miss's bucket is not among those: its key is new, its
                // bucket anywhere in an index sized for the table's
                // capacity. Misses come in runs (a burst of connections, a
                // flood), so after a chunk that had one, every key's
                // bucket is fetched in a first pass (else each miss waits
                // for its line alone: 40 ns a new flow, 1,000 flows in a
                // table for 201,000); a chunk after one of hits alone does
                // without (it costs 33 instructions a packet).
                let mark = self.table.lookup_mark();
                if *missed {
                    for (p, h) in prep.iter().zip(hashes.iter_mut()) {
                        if let Some(k) = p.key::<A>() {
                            *h = self.table.key_hash(&k);
                            self.table.prefetch_hash(*h);
                        }
                    }
                }
                let keep = (&mut *keys, &mut *at, &mut *hashes);
                n = if *missed {
                    look_each::<A, true>(&mut self.table, prep, out, epoch, keep)
                } else {
                    look_each::<A, false>(&mut self.table, prep, out, epoch, keep)
                };
                // Every key kept is a miss: their service lookups start
                // here, a pass apart from the flow lookups (inside that
                // loop, they cost its hits 9 instructions a packet).
                for (j, (m, k)) in miss.iter_mut().zip(&keys[..n]).enumerate() {
                    *m = StagedMiss::of(&self.services, j, k);
                }
                misses = n;
                *missed = n > 0;
                mark
            } else {
                for (i, p) in prep.iter().enumerate() {
                    if let Some(k) = p.key::<A>() {
                        keys[n] = k;
                        at[n] = i;
                        n += 1;
                    }
                }
                if n == 0 {
                    continue;
                }
                let services = &self.services;
                let mark = self.table.lookup_batch_with(
                    &keys[..n],
                    &mut hits[..n],
                    &mut hashes[..n],
                    |service| services.prefetch_handles(service),
                );
                // The hits' entries are in cache now and their services'
                // handle lines on the way (fetched as each hit was
                // found). A pass files the hits and starts the misses'
                // service lookups; the next, reading the handle lines,
                // fetches each hit's backend counter line (the packet
                // updates it and reads the backend's state and next hop
                // from it).
                for (j, hit) in hits[..n].iter().enumerate() {
                    if let Some((id, dir)) = *hit {
                        out[at[j]] = Lookup::Hit(id, dir, epoch);
                    } else {
                        miss[misses] = StagedMiss::of(&self.services, j, &keys[j]);
                        misses += 1;
                    }
                }
                for &(id, _) in hits[..n].iter().flatten() {
                    let f = self.table.flow(id);
                    if let Some(t) = self.services.traffic(f.service()) {
                        xvs_conntrack::prefetch(t.cell_addr(worker, f.backend_id()));
                    }
                }
                mark
            };
            // A miss may be a new flow: its ownership and service are
            // looked up in stages, every miss's at once (hash and fetch
            // the buckets, above; probe them and fetch the service slot;
            // fetch the compiled service and its counter handles; its
            // backends; the flow's count cell), so the packet's own
            // lookup finds them in cache.
            // The buckets arrived: their candidates' entries are fetched,
            // then checked a pass later.
            for m in &mut miss[..misses] {
                m.service_at = self.services.candidate(m.service_hash);
                if let Some(p) = m.service_at {
                    self.services.prefetch_at(p);
                }
            }
            for (m, found) in miss[..misses].iter().zip(found.iter_mut()) {
                let k = &keys[m.key];
                let key = (k.dst, k.proto, k.dst_port);
                let pos = self.services.confirm(m.service_hash, key, m.service_at);
                *found = pos.unwrap_or(NO_SERVICE);
                to_services |= pos.is_some();
                // A service's VIP is owned: the owned-address set is
                // asked only for a miss that names no service (not
                // staged: traffic to no service is the rare case).
                out[at[m.key]] = Lookup::Miss {
                    owned: pos.is_some() || self.owned.contains(&k.dst),
                    service: *found,
                    hash: hashes[m.key],
                    mark,
                };
                if c == 0 {
                    miss_services[at[m.key]] = *found;
                }
            }
            // The slots are in cache (the check read them). The
            // service's counter handles, and what the slot holds the
            // addresses of: the backend list, the flow's count cell,
            // whichever backend it gets (the first and the last
            // backend's lines cover a small service), and the compiled
            // service's first line only if the flow will read it
            // (persistence, client ranges). All in one pass: none waits
            // for another.
            for slot in found[..misses]
                .iter()
                .filter_map(|&pos| self.services.at(pos))
            {
                self.services.prefetch_handles(slot.id);
                slot.prefetch_ahead();
            }
        }
        to_services
    }

    /// Fetches the index bucket of the reply key that `key`'s new flow
    /// (a miss to the service at `pos`) is expected to take: the backend
    /// the scheduler would pick `same` new flows of that service from
    /// now, the SNAT endpoint `snat_ahead` places past the cursor
    /// (`ahead` is both). A guess: a
    /// frame in between that fails, or a taken endpoint, makes it a
    /// wasted fetch, never a wrong result.
    fn prefetch_reply(&self, key: &FlowKey<A>, pos: u32, ahead: (usize, u32), worker: usize) {
        let (same, snat_ahead) = ahead;
        let Some(slot) = self.services.at(pos) else {
            return;
        };
        if slot.persist().is_some() {
            return;
        }
        let (stats, counts) = self.services.handles_of(slot);
        let req = Request {
            client: key.source(),
            vip: key.destination(),
        };
        let Some(i) = slot.sched.borrow().peek(&slot.backends, &req, same) else {
            return;
        };
        let b = &slot.backends[i];
        // The lines the insert writes next: the backend's connection
        // count and traffic counter.
        xvs_conntrack::prefetch(counts.cell_addr(worker, b.id));
        xvs_conntrack::prefetch(stats.cell_addr(worker, b.id));
        if !b.plan.takes_snat() {
            return;
        }
        let Some(snat) = self.snat.peek(snat_ahead) else {
            return;
        };
        let reply = FlowKey::between(b.endpoint_for(key.dst_port), snat, key.proto);
        self.table.prefetch_hash(self.table.key_hash(&reply));
    }

    /// The verdict on an IP packet of this family.
    fn verdict(&mut self, core: &mut Core, rx: Rx<'_>, ip: &A::Ip, looked: Lookup) -> Verdict {
        let Rx { buf, now } = rx;
        let l4 = ip.l4();
        // TCP and UDP look their flow up first: a flow key names an owned
        // address, so a hit needs no ownership check (one hash lookup less
        // on the established path); a miss is checked below.
        let tcp_udp = matches!(l4, L4::Tcp { .. } | L4::Udp { .. });
        if !tcp_udp && !self.owned.contains(&ip.dst()) {
            return Verdict::Drop(DropReason::NotOwned);
        }
        if ip.fragment() != Fragment::Whole {
            return Verdict::Drop(DropReason::Fragment);
        }
        match l4 {
            L4::IcmpEcho { request: true, .. } => return answer(ip.echo_reply(buf)),
            L4::IcmpEcho { .. } => return Verdict::Drop(DropReason::IcmpUnsupportedType),
            L4::IcmpError(_) => return self.related(core, buf, ip),
            L4::None | L4::Neighbour(_) => return Verdict::Drop(DropReason::Fragment),
            L4::Tcp { .. } | L4::Udp { .. } => {}
        }
        let src_mac = EthernetFrame::new_unchecked(&*buf).src_addr().0;
        let tcp_flags = match l4 {
            L4::Tcp { flags, .. } => flags.0,
            _ => 0,
        };
        let pkt = Packet {
            tcp_flags,
            len: ip.total_len(),
        };
        // A hit of the table's current epoch is still the packet's flow:
        // its key is built only when it must be checked or looked up
        // again (and is kept for a new flow).
        let (mut hit, key) = match looked {
            Lookup::Hit(id, dir, epoch) if epoch == self.table.epoch() => (Some((id, dir)), None),
            _ => {
                let Some(key) = ip.key() else {
                    return Verdict::Drop(DropReason::UnsupportedProtocol);
                };
                // Hashed once (by the batch's lookup, for a miss): a new
                // flow's insert takes the hash too.
                let h = match looked {
                    Lookup::Miss { hash, .. } => hash,
                    _ => self.table.key_hash(&key),
                };
                debug_assert_eq!(h, self.table.key_hash(&key));
                let hit = match looked {
                    Lookup::Hit(id, dir, _) if self.table.holds(id, dir, &key) => Some((id, dir)),
                    // Missing still, unless a frame since inserted it: a
                    // new flow probes the index once, not twice.
                    Lookup::Miss { mark, .. } if self.table.absent_since(mark, h) => None,
                    _ => self.table.lookup_hashed(&key, h),
                };
                // A flow found now (not by the batch) may take the
                // express lane too (the single-frame path).
                if let (Some(h), true) = (hit, core.express) {
                    if let Some(v) = self.express(core, buf, ip, h, now) {
                        return v;
                    }
                }
                (hit, Some((key, h)))
            }
        };
        // Whether the destination is owned, as the batch's lookup found
        // or else asked now (only a packet without a flow needs it).
        let known = match looked {
            Lookup::Miss { owned, .. } => Some(owned),
            _ => None,
        };
        let owned = |this: &Self| known.unwrap_or_else(|| this.owns(ip));
        // A packet that cannot be forwarded changes nothing (no flow, no
        // state, no count against a backend): a router's answer.
        if ip.hop_limit() <= 1 {
            if hit.is_none() && !owned(self) {
                return Verdict::Drop(DropReason::NotOwned);
            }
            return match ip.time_exceeded(buf) {
                Ok(Some(len)) => {
                    core.counters.time_exceeded += 1;
                    Verdict::Answer(len)
                }
                Ok(None) => Verdict::Drop(DropReason::TtlExceeded),
                Err(r) => Verdict::Drop(r),
            };
        }
        if let Some((id, dir)) = hit {
            if let Some(why) = self.ends_flow(core, id, dir, tcp_flags) {
                self.retire(core, id, why);
                hit = None;
                let opens = tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
                match (dir, l4) {
                    // The backend's side of a flow that ended.
                    (Direction::Reply, _) => return Verdict::Drop(DropReason::ReplyNoFlow),
                    // The kernel's answer to a segment of a connection it
                    // does not know.
                    (Direction::Original, L4::Tcp { .. }) if !opens => {
                        return self.reject(core, buf, ip, L4Proto::Tcp);
                    }
                    _ => {}
                }
            }
        }
        let (id, dir) = match hit {
            Some((id, dir)) => {
                // A backend's reply teaches its address, unless it is
                // the one cached already (nothing to learn: no probe).
                if dir == Direction::Reply && !self.caches_hop(core, id, ip.src(), src_mac) {
                    self.neighbours.learn(ip.src(), src_mac);
                }
                self.track(core, (id, dir), pkt, now, ip.protocol());
                (id, dir)
            }
            None if !owned(self) => return Verdict::Drop(DropReason::NotOwned),
            None if self.is_snat(ip.dst()) => return Verdict::Drop(DropReason::ReplyNoFlow),
            // A new flow is inserted with its first packet accounted.
            None => {
                // (A match, not `or_else`: that one is called out of
                // line, on every new flow.)
                let key = match key {
                    Some(key) => key,
                    None => match ip.key() {
                        Some(k) => (k, self.table.key_hash(&k)),
                        None => return Verdict::Drop(DropReason::UnsupportedProtocol),
                    },
                };
                match self.new_flow(core, buf, ip, key, src_mac, pkt, now, looked) {
                    Ok(id) => (id, Direction::Original),
                    Err(v) => return v,
                }
            }
        };
        self.forward(core, buf, ip, id, dir)
    }

    /// A tracked flow's packet: its state, timer and counters advance,
    /// with the close event and the sync record that change produces.
    #[inline(always)]
    fn track(
        &mut self,
        core: &mut Core,
        (id, dir): (FlowId, Direction),
        pkt: Packet,
        now: u32,
        protocol: u8,
    ) {
        let (table, mut obs) = self.split(core.cfg.worker);
        let (before, after) = table.on_packet(id, dir, pkt, now, &mut obs);
        if before != after
            && matches!(after, FlowState::Close | FlowState::TimeWait)
            && core.events.is_some()
        {
            let f = self.table.flow(id);
            let (src, dst, to) = (f.client(), f.vip(), [f.backend(), f.snat()]);
            core.event(now, EventKind::Close, protocol, src, dst, to);
        }
        if core.sync.is_some() {
            let f = self.table.flow(id);
            let changed = before != after;
            let due = dir == Direction::Original && refresh_due(f.packets()[0]);
            if (changed || due) && !f.is_peer() {
                core.stage(SyncRecord::of(&f, Op::Update));
            }
        }
    }

    /// The next hop backend `backend_id` of service `service` has cached
    /// in its counter line, still valid (see `crate::traffic`).
    #[inline]
    fn cached_hop(&self, worker: usize, service: u32, backend_id: u32) -> Option<[u8; 6]> {
        self.services
            .traffic(service)?
            .next_hop(worker, backend_id, self.neighbours.generation())
    }

    /// Whether `mac` at `addr` is what flow `id`'s backend caches as its
    /// next hop.
    #[inline]
    fn caches_hop(&self, core: &Core, id: FlowId, addr: A, mac: [u8; 6]) -> bool {
        let f = self.table.flow(id);
        f.backend().addr == addr
            && self.cached_hop(core.cfg.worker, f.service(), f.backend_id()) == Some(mac)
    }

    /// Whether IPVS's rules end the flow `id` at this packet (see the
    /// module docs), and why. One read of the backend's state, from the
    /// traffic-counter line the packet updates anyway.
    #[inline(always)]
    fn ends_flow(&self, core: &Core, id: FlowId, dir: Direction, flags: u8) -> Option<Removal> {
        let f = self.table.flow(id);
        let dest = self
            .services
            .dest_state(f.service(), core.cfg.worker, f.backend_id());
        removal(core.cfg.rules, &f, dir, flags, dest)
    }

    /// Ends a flow for `why`, keeping the connection counts right.
    fn retire(&mut self, core: &Core, id: FlowId, why: Removal) {
        let mut obs = counts_of(&self.services, core);
        self.table.retire(id, why, &mut obs);
    }

    /// kube-proxy's REJECT: a TCP RST or an ICMP port unreachable (counted
    /// in `rejected`), or a drop when the packet may not be answered.
    fn reject(&mut self, core: &mut Core, buf: &mut [u8], ip: &A::Ip, proto: L4Proto) -> Verdict {
        let answer = match proto {
            L4Proto::Tcp => ip.reset(buf),
            _ => ip.unreachable(buf),
        };
        match answer {
            Ok(Some(len)) => {
                core.counters.rejected += 1;
                Verdict::Answer(len)
            }
            Ok(None) => Verdict::Drop(DropReason::NoBackend),
            Err(r) => Verdict::Drop(r),
        }
    }

    /// A tracked flow's packet, sent the way its plan says. Inlined into
    /// [`Half::verdict`], its one caller: every forwarded packet takes it.
    #[inline(always)]
    fn forward(
        &mut self,
        core: &mut Core,
        buf: &mut [u8],
        ip: &A::Ip,
        id: FlowId,
        dir: Direction,
    ) -> Verdict {
        let f = self.table.flow(id);
        let route = Plan::from_tag(f.plan()).route(&f, dir);
        // The backend's counter line: the packet is counted there, and a
        // packet to the backend takes its next hop from it, else from the
        // neighbour table, and caches it there (see `crate::traffic`).
        let line = self
            .services
            .traffic(f.service())
            .and_then(|t| t.line(core.cfg.worker, f.backend_id()));
        let to_backend = matches!(route.next_hop, NextHop::Neighbour(a) if a == f.backend().addr);
        let generation = self.neighbours.generation();
        let cached = line
            .filter(|_| to_backend)
            .and_then(|l| l.next_hop(generation));
        let (ours, next) = match cached {
            Some(mac) => (core.mac(route.side), EthernetAddress(mac)),
            None => match link(&mut self.neighbours, core, &route, true) {
                Ok(macs) => {
                    if let Some(l) = line.filter(|_| to_backend) {
                        l.set_next_hop(generation, macs.1 .0);
                    }
                    macs
                }
                Err(v) => return v,
            },
        };
        if let Some(l) = line {
            let d = match dir {
                Direction::Original => 0,
                Direction::Reply => 1,
            };
            l.packet(d, u64::from(ip.total_len()));
        }
        match route.rewrite {
            Rewrite::Nat(nat) => sent(ip.forward(buf, &nat, ours, next), ip, route.side),
            Rewrite::Route => sent(ip.route(buf, ours, next), ip, route.side),
            Rewrite::Tunnel(e) => self.tunnel(core, buf, ip, e, id, (ours, next)),
        }
    }

    /// Encapsulates a packet of the tunnel flow `id` to its backend; one that no longer fits the backend link gets
    /// fragmentation needed / packet too big (Katran's answer, counted in
    /// `too_big`), never a silent drop.
    fn tunnel(
        &self,
        core: &mut Core,
        buf: &mut [u8],
        ip: &A::Ip,
        encap: Encap,
        id: FlowId,
        (ours, next): (EthernetAddress, EthernetAddress),
    ) -> Verdict {
        // The entry is in cache: the packet just looked it up.
        let f = self.table.flow(id);
        let (client, to) = (f.client(), f.backend().addr);
        // The flow's entropy: the outer UDP source port (and IPv6 flow
        // label) spread tunnelled flows over a backend's queues.
        let h = client.addr.fold32() ^ u32::from(client.port).wrapping_mul(0x9e37_79b1);
        let h = h ^ (h >> 16);
        let wrap = match encap {
            Encap::Ipip => Wrap::Ipip,
            Encap::Gue => Wrap::Gue {
                src_port: 0xc000 | (h as u16 & 0x3fff),
                dst_port: core.cfg.tunnel.gue_port,
            },
        };
        let src = match self.tunnel_net {
            Some((net, mask)) => A::within_net(net, mask, client.addr),
            None => self.tunnel_src,
        };
        let outer = Outer { src, dst: to, wrap };
        match ip.encap(buf, &outer, core.cfg.backend_mtu, h, ours, next) {
            Ok(Encapsulated::Sent(len)) => Verdict::Forward {
                len,
                to: Side::Backend,
            },
            Ok(Encapsulated::TooBig(mtu)) => match ip.too_big(buf, mtu) {
                Ok(Some(len)) => {
                    core.counters.too_big += 1;
                    Verdict::Answer(len)
                }
                Ok(None) => Verdict::Drop(DropReason::TunnelTooBig),
                Err(r) => Verdict::Drop(r),
            },
            Err(r) => Verdict::Drop(r),
        }
    }

    /// A packet to a VIP that no flow knows: schedule and track it.
    #[allow(clippy::too_many_arguments)]
    fn new_flow(
        &mut self,
        core: &mut Core,
        buf: &mut [u8],
        ip: &A::Ip,
        (key, h_orig): (FlowKey<A>, u64),
        src_mac: [u8; 6],
        first: Packet,
        now: u32,
        looked: Lookup,
    ) -> Result<FlowId, Verdict> {
        let worker = core.cfg.worker;
        // The batch's lookup found the service's position already (it is
        // checked all the same; else, or without a lookup ahead, found).
        let slot = match looked {
            Lookup::Miss { service, .. } => {
                self.services
                    .at_for(service, key.dst, key.proto, key.dst_port)
            }
            _ => None,
        }
        .or_else(|| self.services.find(key.dst, key.proto, key.dst_port));
        let Some(slot) = slot else {
            return Err(match core.cfg.unknown_port {
                UnknownPort::Reject => self.reject(core, buf, ip, key.proto),
                UnknownPort::Drop => Verdict::Drop(DropReason::NoService),
            });
        };
        if !slot.allows(ip.src()) {
            return Err(Verdict::Drop(DropReason::SourceDenied));
        }
        // The pick and the insert below read the service's handles line
        // (counts and counters): fetch it while the segment is checked.
        self.services.prefetch_handles(slot.id);
        if let L4::Tcp { flags, .. } = ip.l4() {
            let opens = flags.syn() && !flags.ack();
            if !opens && !slot.svc.adopts_midflow() {
                self.table.count_invalid();
                return Err(Verdict::Drop(DropReason::TcpNoFlow));
            }
        }
        // Once per flow: a segment the backend would discard creates
        // nothing.
        if !ip.l4_verifies(buf) {
            self.table.count_invalid();
            return Err(Verdict::Drop(DropReason::L4BadChecksum));
        }
        let req = Request {
            client: key.source(),
            vip: key.destination(),
        };
        // What the flow reads of its service is in the slot and the
        // handles line (counts and counters, which the insert reads
        // anyway): the compiled service only for persistence (and,
        // above, client ranges).
        let (stats, counts) = self.services.handles_of(slot);
        let picked = {
            let mut sched = slot.sched.borrow_mut();
            match slot.persist() {
                Some(p) => {
                    // Persistence may early-drop a flow of any service: it
                    // reports to every service's counts.
                    let mut obs = counts_of(&self.services, core);
                    pick_persistent(
                        &mut sched,
                        &slot.backends,
                        &req,
                        counts,
                        p,
                        core.cfg.rules.expire_quiescent_template,
                        &mut self.table,
                        now,
                        &mut obs,
                    )
                }
                None => sched.pick(&slot.backends, &req, counts, now),
            }
        };
        let Ok(i) = picked else {
            return Err(self.reject(core, buf, ip, key.proto));
        };
        let b = slot.backends[i];
        let backend = b.endpoint_for(key.dst_port);
        // What the flow touches once inserted is fetched while the SNAT
        // port is found and the flow inserted: the backend's connection
        // count and traffic counter lines (the latter caches its next
        // hop).
        xvs_conntrack::prefetch(counts.cell_addr(worker, b.id));
        xvs_conntrack::prefetch(stats.cell_addr(worker, b.id));
        // A plan without SNAT keeps the client as the reply destination.
        let (snat, h_reply) = if b.plan.takes_snat() {
            let fields = (&mut self.snat, &mut self.table, &self.services);
            Self::snat_port(fields, core, backend, key.proto, now)
                .ok_or(Verdict::Drop(DropReason::SnatExhausted))?
        } else {
            let reply = FlowKey::between(backend, key.source(), key.proto);
            (key.source(), self.table.key_hash(&reply))
        };
        let new = NewFlow {
            client: key.source(),
            vip: key.destination(),
            backend,
            snat,
            proto: key.proto,
            service: slot.id,
            backend_id: b.id,
            client_mac: src_mac,
            plan: b.plan.tag(),
            one_way: b.plan.is_one_way(),
        };
        let mut obs = counts_of(&self.services, core);
        // Both keys were just found free: the orig key missed above, the
        // reply key in snat_port.
        let evicted = self.table.stats().early_drop;
        let hashes = [h_orig, h_reply];
        let inserted = self.table.insert_new(&new, hashes, first, now, &mut obs);
        let table = &self.table;
        if table.stats().early_drop != evicted || table.len() >= table.capacity() / 8 * 7 {
            core.pressure_until = now + PRESSURE_HOLD;
        }
        match inserted {
            Ok(id) => {
                // Under pressure (a SYN flood), handshakes that never
                // complete leave sooner.
                if now < core.pressure_until && self.table.flow(id).state() == FlowState::SynRecv {
                    let secs = self.table.timeouts().syn_recv_pressure;
                    self.table.shorten(id, secs);
                }
                core.counters.new_flows += 1;
                stats.conn(worker, b.id);
                if core.sync.is_some() {
                    core.stage(SyncRecord::of(&self.table.flow(id), Op::Update));
                    if let Some(p) = slot.persist() {
                        let net = new.client.addr.masked(p.netmask);
                        let r = SyncRecord::template(p.proto, net, new.vip, b.endpoint, p.timeout);
                        core.stage(r);
                    }
                }
                let to = [new.backend, new.snat];
                core.event(now, EventKind::New, ip.protocol(), new.client, new.vip, to);
                Ok(id)
            }
            Err(InsertError::TableFull) => Err(Verdict::Drop(DropReason::ConntrackFull)),
            Err(InsertError::Exists) => Err(Verdict::Drop(DropReason::ConntrackInsertFailed)),
        }
    }

    /// A SNAT endpoint towards `backend`, from the next of the addresses
    /// × port slice on (the cursor goes round, so the endpoints it meets
    /// are the ones used longest ago): the first whose reply key is not
    /// tracked, trying at most [`SNAT_TRIES`]; or, once [`RECLAIM_AFTER`]
    /// were tried, the first held by a flow that is only a handshake or
    /// already closed ([`FlowState::is_reclaimable`]: a SYN flood's or
    /// TIME_WAIT's), which is ended (counted as `reclaim`) to free it.
    /// ESTABLISHED flows are never reclaimed. With the endpoint, the hash
    /// its reply key was looked up with (for the insert).
    ///
    /// Of the family's state it takes only the endpoints, the flows and
    /// (shared) the services: a new flow keeps its service borrowed
    /// across it instead of holding a counted reference (an atomic
    /// increment and decrement on a line every worker's new flows to
    /// that service write).
    fn snat_port(
        (snat, table, services): (&mut SnatEndpoints<A>, &mut FlowTable<A>, &ServiceTable<A>),
        core: &mut Core,
        backend: Endpoint<A>,
        proto: L4Proto,
        now: u32,
    ) -> Option<(Endpoint<A>, u64)> {
        let mut victim = None;
        for tried in 0..SNAT_TRIES.min(snat.total()) {
            if tried >= RECLAIM_AFTER && victim.is_some() {
                break;
            }
            let (end, at) = snat.advance()?;
            let reply = FlowKey::between(backend, end, proto);
            let h = table.key_hash(&reply);
            match table.lookup_hashed(&reply, h) {
                None => return Some((end, h)),
                Some((id, _)) if victim.is_none() && table.flow(id).state().is_reclaimable() => {
                    victim = Some((id, (end, h), at));
                }
                Some(_) => {}
            }
        }
        let (id, end, at) = victim?;
        // The search goes on from there: the endpoints after it were used
        // after it, so reclaiming stays oldest first.
        snat.resume_after(at);
        let mut obs = counts_of(services, core);
        table.retire(id, Removal::Reclaimed, &mut obs);
        core.pressure_until = now + PRESSURE_HOLD;
        Some(end)
    }

    /// An ICMP error about a tracked flow, translated like the flow.
    fn related(&mut self, core: &mut Core, buf: &mut [u8], ip: &A::Ip) -> Verdict {
        let Some(key) = ip.key() else {
            return Verdict::Drop(DropReason::IcmpErrorNoFlow);
        };
        let Some((id, dir)) = self.table.lookup(&key) else {
            return Verdict::Drop(DropReason::IcmpErrorNoFlow);
        };
        let f = self.table.flow(id);
        // The error goes where the flow's packets in `dir` go (the flow's
        // plan says where); the packet it quotes went the other way.
        let route = Plan::from_tag(f.plan()).route(&f, dir);
        let (ours, next) = match link(&mut self.neighbours, core, &route, false) {
            Ok(macs) => macs,
            Err(v) => return v,
        };
        match route.rewrite {
            Rewrite::Nat(nat) => {
                let m = IcmpErrorNat {
                    outer_src: nat.src.addr,
                    outer_dst: nat.dst.addr,
                    inner: Nat {
                        src: nat.dst,
                        dst: nat.src,
                    },
                };
                sent(ip.forward_error(buf, &m, ours, next), ip, route.side)
            }
            // A one-way flow's backend gets the error as it came (IPVS
            // passes it to the real server by the flow's method), so its
            // PMTU discovery towards the client works.
            Rewrite::Route => sent(ip.route(buf, ours, next), ip, route.side),
            Rewrite::Tunnel(e) => self.tunnel(core, buf, ip, e, id, (ours, next)),
        }
    }
}

impl Half<Ipv6Addr> {
    /// A neighbour solicitation for an owned address gets its
    /// advertisement; every solicitation and advertisement teaches its
    /// sender's (or target's) Ethernet address. (IPv6's alone: IPv4's
    /// counterpart is ARP, answered in [`Pipeline::process_prepared`].)
    fn neighbour(&mut self, mac: EthernetAddress, buf: &mut [u8], ip: &Ipv6, ndp: &Ndp) -> Verdict {
        if !ndp.solicit {
            if let Some(lladdr) = ndp.lladdr {
                self.neighbours.learn(ndp.target, lladdr.0);
            }
            return Verdict::Consumed;
        }
        if let (Some(lladdr), false) = (ndp.lladdr, ip.src.is_unspecified()) {
            self.neighbours.learn(ip.src, lladdr.0);
        }
        if ip.dst != ndp.target && ip.dst != solicited_node(ndp.target) {
            return Verdict::Drop(DropReason::NdpMalformed);
        }
        if !self.owned.contains(&ndp.target) {
            return Verdict::Drop(DropReason::NdpNotOwned);
        }
        let asker_mac = ndp
            .lladdr
            .unwrap_or_else(|| EthernetAddress::from_bytes(&buf[6..12]));
        match advertise(buf, ndp, ip.src, asker_mac, mac) {
            Some(len) => Verdict::Answer(len),
            None => Verdict::Drop(DropReason::AnswerNoRoom),
        }
    }
}

impl Pipeline {
    /// A pipeline with no service yet, at time `now`.
    pub fn new(cfg: PipelineConfig, now: u32) -> Pipeline {
        let table = FlowTable::new(cfg.capacity, cfg.timeouts, now);
        Pipeline::with_table(cfg, table)
    }

    /// A pipeline over `table` (one read back from a state file: call
    /// [`Pipeline::adopt`] once the services are in).
    pub fn with_table(cfg: PipelineConfig, table: FlowTable) -> Pipeline {
        let table6 = FlowTable::new(Self::capacity6(&cfg), cfg.timeouts, 0);
        Pipeline::with_tables(cfg, table, table6)
    }

    /// A pipeline over an IPv4 and an IPv6 table.
    pub fn with_tables(
        cfg: PipelineConfig,
        table: FlowTable<Ipv4Addr>,
        table6: FlowTable<Ipv6Addr>,
    ) -> Pipeline {
        let net = cfg
            .tunnel
            .client_source_net
            .map(|n| (n.network(), n.netmask()));
        let v4 = Half::new(
            table,
            cfg.snat_addrs.clone(),
            cfg.snat_ports,
            cfg.backend_mac,
            (cfg.tunnel.source, net),
        );
        let v6 = Half::new(
            table6,
            cfg.snat_addrs6.clone(),
            cfg.snat_ports,
            cfg.backend_mac,
            (cfg.tunnel.source6, None),
        );
        Pipeline {
            core: Core {
                cfg,
                pressure_until: 0,
                counters: Counters::default(),
                events: None,
                sync: None,
                staged: Vec::with_capacity(STAGED),
                express: true,
                miss_services: [NO_SERVICE; xvs_conntrack::BATCH],
                fetch_replies: false,
            },
            v4,
            v6,
        }
    }

    /// The IPv6 table's capacity: the configured one when there are IPv6
    /// SNAT addresses, else a minimal table (no IPv6 flow can be made).
    pub fn capacity6(cfg: &PipelineConfig) -> u32 {
        if cfg.snat_addrs6.is_empty() {
            64
        } else {
            cfg.capacity
        }
    }

    /// Adopts the flows of the tables read back from a state file,
    /// resolving each one's service by its VIP, protocol and port and its
    /// backend by address and port (the ids this process gave them), and
    /// counting their connections; flows whose service or backend is gone
    /// are dropped, counted. Nothing to do for a table not read back.
    pub fn adopt(&mut self, now: u32) -> xvs_conntrack::Adopted {
        let worker = self.core.cfg.worker;
        let mut a = self.v4.adopt(now, worker);
        let b = self.v6.adopt(now, worker);
        a.flows += b.flows;
        a.templates += b.templates;
        a.dropped += b.dropped;
        a
    }

    /// The SNAT port a classified frame is addressed to, if it is a reply
    /// (or an ICMP error about a flow) to this pipeline's SNAT address:
    /// its owner is the worker whose slice holds that port.
    pub fn snat_port_of(&self, prepared: &Prepared) -> Option<u16> {
        match prepared.frame {
            Ok(Frame::Ipv4(ip)) => self.v4.snat_port_of(&ip),
            Ok(Frame::Ipv6(ip)) => self.v6.snat_port_of(&ip),
            _ => None,
        }
    }

    /// Counters so far.
    pub fn counters(&self) -> &Counters {
        &self.core.counters
    }

    /// Live flows of both families.
    pub fn flows(&self) -> u32 {
        self.v4.table.len() + self.v6.table.len()
    }

    /// Live flows per SNAT address into `out`: the IPv4 addresses, then
    /// the IPv6 ones, in the config's order (those beyond `out` are not
    /// reported).
    pub fn snat_flows(&self, out: &mut [u64]) {
        let both = self
            .v4
            .table
            .snat_flows()
            .iter()
            .chain(self.v6.table.snat_flows());
        for (o, n) in out.iter_mut().zip(both) {
            *o = u64::from(*n);
        }
    }

    /// Conntrack counters of both families.
    pub fn conntrack_stats(&self) -> xvs_conntrack::Stats {
        let mut s = self.v4.table.stats();
        s.add(&self.v6.table.stats());
        s
    }

    /// Marks SNAT addresses that are also the host's: xvs resolves next
    /// hops with ARP probes (sender 0.0.0.0) unless another SNAT address
    /// is its own, so the kernel keeps its ARP on its address.
    pub fn share_with_host(&mut self, shared: &[Ipv4Addr]) {
        let source = self
            .v4
            .snat
            .addrs()
            .iter()
            .copied()
            .find(|a| !shared.contains(a))
            .unwrap_or(Ipv4Addr::UNSPECIFIED);
        self.v4.neighbours.set_source(source);
    }

    /// A backup's standby (`on`): next hops are asked from no address
    /// (an ARP probe, whose answer the steering program hands over; a
    /// solicitation from `::`), never from a SNAT address, which the
    /// active gateway still serves and whose entry in the backends'
    /// caches a request would move. Off: asked as [`Pipeline::share_with_host`]
    /// says, given the SNAT addresses `shared` with the host.
    pub fn standby(&mut self, on: bool, shared: &[Ipv4Addr]) {
        if on {
            self.v4.neighbours.set_source(Ipv4Addr::UNSPECIFIED);
            self.v6.neighbours.set_source(Ipv6Addr::UNSPECIFIED);
        } else {
            self.share_with_host(shared);
            let first6 = self.v6.snat.addrs().first().copied();
            self.v6
                .neighbours
                .set_source(first6.unwrap_or(Ipv6Addr::UNSPECIFIED));
        }
    }

    /// Whether established full-NAT packets take the express lane (on
    /// from the start). The two paths agree on every packet; off, each
    /// takes the general path, which the tests and the pipeline bench
    /// compare the lane against.
    pub fn set_express(&mut self, on: bool) {
        self.core.express = on;
    }

    /// Replaces the reuse and removal rules (from the next packet on).
    pub fn set_rules(&mut self, rules: ConnRules, unknown_port: UnknownPort) {
        self.core.cfg.rules = rules;
        self.core.cfg.unknown_port = unknown_port;
    }

    /// New conntrack timeouts for both tables.
    pub fn set_timeouts(&mut self, t: Timeouts) {
        self.v4.table.set_timeouts(t);
        self.v6.table.set_timeouts(t);
    }

    /// Answers ARP / neighbour solicitations and ping for `addr` (a VIP).
    pub fn own(&mut self, addr: impl Into<IpAddr>) {
        match addr.into() {
            IpAddr::V4(a) => {
                self.v4.owned.add(a);
            }
            IpAddr::V6(a) => {
                self.v6.owned.add(a);
            }
        }
    }

    /// Stops answering for `addr` (never a SNAT address).
    pub fn disown(&mut self, addr: impl Into<IpAddr>) {
        match addr.into() {
            IpAddr::V4(a) if !self.v4.is_snat(a) => {
                self.v4.owned.remove(&a);
            }
            IpAddr::V6(a) if !self.v6.is_snat(a) => {
                self.v6.owned.remove(&a);
            }
            _ => {}
        }
    }

    /// Adds or replaces a service of either family, as this worker
    /// applies it (its next hops are resolved at once).
    pub fn upsert_service(&mut self, svc: impl Into<AnyService>) {
        let worker = self.core.cfg.worker;
        match svc.into() {
            AnyService::V4(s) => self.v4.upsert_service(s, worker),
            AnyService::V6(s) => self.v6.upsert_service(s, worker),
        }
    }

    /// Removes a service of either family.
    pub fn remove_service(&mut self, key: &ServiceKey<IpAddr>) {
        if let Some(k) = key.narrow() {
            self.v4.services.remove(&k);
        } else if let Some(k) = key.narrow() {
            self.v6.services.remove(&k);
        }
    }

    /// Takes the next address to send an ARP request or a neighbour
    /// solicitation for.
    pub fn next_arp(&mut self) -> Option<IpAddr> {
        if let Some(a) = self.v4.neighbours.next_request() {
            return Some(IpAddr::V4(a));
        }
        self.v6.neighbours.next_request().map(IpAddr::V6)
    }

    /// A frame this pipeline forwarded (or, `answer`, answered) that never
    /// got into a TX ring: it counts as a `tx_ring_full` drop instead, so
    /// `rx = forwarded + answered + consumed + Σ drops` still holds and
    /// `forwarded` counts only frames handed to the kernel.
    pub fn unsent(&mut self, answer: bool) {
        let c = &mut self.core.counters;
        let from = if answer {
            &mut c.answered
        } else {
            &mut c.forwarded
        };
        *from = from.saturating_sub(1);
        c.drops[DropReason::TxRingFull.index()] += 1;
    }

    /// Builds an ARP request (or, for an IPv6 `target`, a neighbour
    /// solicitation) for `target` into `buf` (to send on the backend
    /// side); returns its length or `None` if `buf` is too short.
    pub fn build_arp_request(&self, buf: &mut [u8], target: IpAddr) -> Option<usize> {
        match target {
            IpAddr::V4(t) => self.v4.neighbours.build_request(buf, t),
            IpAddr::V6(t) => self.v6.neighbours.build_request(buf, t),
        }
    }

    /// Processes one frame of `len` bytes in `buf` (the buffer may be
    /// longer: answers may grow into it) received on the client side.
    pub fn process(&mut self, buf: &mut [u8], len: usize, now: u32) -> Verdict {
        self.process_on(Side::Client, buf, len, now)
    }

    /// Processes one frame received on side `ingress`.
    pub fn process_on(&mut self, ingress: Side, buf: &mut [u8], len: usize, now: u32) -> Verdict {
        let len = len.min(buf.len());
        let prepared = Prepared::of(&buf[..len]);
        self.process_prepared(ingress, buf, now, &prepared, Lookup::NotYet)
    }

    /// Looks up the flows of a batch of prepared frames at once
    /// ([`FlowTable::lookup_batch`]: the flow-table reads of the batch
    /// overlap); `out[i]` is a hit or a miss for every frame with a flow
    /// key, [`Lookup::NotYet`] for the others. Any number of frames; the
    /// worker passes a chunk of a received batch at a time
    /// ([`lookup_chunks`]) and processes it before the next.
    pub fn lookup_prepared(&mut self, prepared: &[Prepared], out: &mut [Lookup]) {
        out.fill(Lookup::NotYet);
        let worker = self.core.cfg.worker;
        let services = &mut self.core.miss_services;
        services.fill(NO_SERVICE);
        let mut to_services = self.v4.lookup_batch(prepared, out, services, worker);
        if !self.v6.table.is_empty() {
            to_services |= self.v6.lookup_batch(prepared, out, services, worker);
        }
        self.core.fetch_replies = to_services;
    }

    /// Before frame `j` of a batch is processed: if the frame
    /// [`PREFETCH_AHEAD`] places later is a miss to a service (likely a
    /// new flow), guesses its reply key (the frames in between that are
    /// misses are taken to become new flows first, each with a SNAT
    /// endpoint) and fetches that key's index bucket, so that its SNAT
    /// probe and insert find it in cache.
    /// (The first frame also starts the fetches of the ones up to there;
    /// in a batch whose misses named no service, nothing is fetched.)
    #[inline]
    pub fn prefetch_ahead(&self, prepared: &[Prepared], looked: &[Lookup], j: usize) {
        if !self.core.fetch_replies {
            return;
        }
        if j == 0 {
            for t in 1..PREFETCH_AHEAD {
                self.prefetch_frame(prepared, looked, 0, t);
            }
        }
        self.prefetch_frame(prepared, looked, j, j + PREFETCH_AHEAD);
    }

    /// [`Pipeline::prefetch_ahead`]'s fetch for frame `t`, with frames
    /// `j..t` still to be processed before it: only a miss to a service
    /// has one (checked here, inline: most frames are hits).
    #[inline(always)]
    fn prefetch_frame(&self, prepared: &[Prepared], looked: &[Lookup], j: usize, t: usize) {
        if let (Some(prep), Some(&Lookup::Miss { service, .. })) = (prepared.get(t), looked.get(t))
        {
            if service != NO_SERVICE {
                // The dense copy agrees with the lookups it was made with.
                debug_assert!(self.core.miss_services.get(t).is_none_or(|&s| s == service));
                self.prefetch_reply_of(prep, service, j, t);
            }
        }
    }

    /// [`Pipeline::prefetch_frame`]'s fetch for frame `t` (`prep`), a miss
    /// to the service at `service`.
    #[inline(never)]
    fn prefetch_reply_of(&self, prep: &Prepared, service: u32, j: usize, t: usize) {
        // Over the dense copy of the lookups' services, a window of the
        // usual width is counted without a branch (frames past the
        // copy's first BATCH are not counted: a guess either way).
        let services = &self.core.miss_services;
        let (same, ahead) = match services.get(j..t) {
            Some(w) => match <&[u32; PREFETCH_AHEAD]>::try_from(w) {
                Ok(w) => new_flows_among(w, service),
                Err(_) => new_flows_among(w, service),
            },
            None => (0, 0),
        };
        let worker = self.core.cfg.worker;
        match prep.frame {
            Ok(Frame::Ipv4(ref ip)) => {
                if let Some(k) = ip.key() {
                    self.v4.prefetch_reply(&k, service, (same, ahead), worker);
                }
            }
            Ok(Frame::Ipv6(ref ip)) => {
                if let Some(k) = ip.key() {
                    self.v6.prefetch_reply(&k, service, (same, ahead), worker);
                }
            }
            _ => {}
        }
    }

    /// Processes a frame already classified by [`Prepared::of`], with its
    /// flow looked up in advance (`looked`), or not. A hit found in
    /// advance is used only if no entry was freed since, or else the entry
    /// still holds that key (a flow of the same batch may have replaced
    /// it); a miss is looked up again
    /// (a flow of the same batch may have created it).
    ///
    /// Inlined into the worker's loop: a hit the express lane takes
    /// returns from there, and only the other frames call the general
    /// path (out of line, with its larger frame to set up).
    #[inline]
    pub fn process_prepared(
        &mut self,
        ingress: Side,
        buf: &mut [u8],
        now: u32,
        prepared: &Prepared,
        looked: Lookup,
    ) -> Verdict {
        if let (Lookup::Hit(id, dir, epoch), true) = (looked, self.core.express) {
            let taken = match prepared.frame {
                Ok(Frame::Ipv4(ref ip)) if epoch == self.v4.table.epoch() => {
                    self.v4.express(&mut self.core, buf, ip, (id, dir), now)
                }
                Ok(Frame::Ipv6(ref ip)) if epoch == self.v6.table.epoch() => {
                    self.v6.express(&mut self.core, buf, ip, (id, dir), now)
                }
                _ => None,
            };
            if let Some(verdict) = taken {
                self.account(verdict, prepared, now);
                return verdict;
            }
        }
        self.process_general(ingress, Rx { buf, now }, prepared, looked)
    }

    /// [`Pipeline::process_prepared`] for every frame the express lane
    /// did not take.
    #[inline(never)]
    fn process_general(
        &mut self,
        ingress: Side,
        rx: Rx,
        prepared: &Prepared,
        looked: Lookup,
    ) -> Verdict {
        let now = rx.now;
        let verdict = match prepared.frame {
            Err(r) => Verdict::Drop(r),
            Ok(Frame::Arp(arp)) => {
                self.v4.neighbours.learn(arp.sender_ip, arp.sender_mac.0);
                if arp.op == ArpOp::Reply {
                    Verdict::Consumed
                } else if !self.v4.owned.contains(&arp.target_ip) {
                    Verdict::Drop(DropReason::ArpNotOwned)
                } else {
                    answer(arp_reply(rx.buf, &arp, self.core.mac(ingress)))
                }
            }
            Ok(Frame::Ipv4(ref ip)) => self.v4.verdict(&mut self.core, rx, ip, looked),
            Ok(Frame::Ipv6(ref ip)) => match ip.l4 {
                L4::Neighbour(ndp) => self.v6.neighbour(self.core.mac(ingress), rx.buf, ip, &ndp),
                _ => self.v6.verdict(&mut self.core, rx, ip, looked),
            },
        };
        self.account(verdict, prepared, now);
        verdict
    }

    /// Counts a frame's verdict.
    #[inline(always)]
    fn account(&mut self, verdict: Verdict, prepared: &Prepared, now: u32) {
        let c = &mut self.core.counters;
        // A frame held for its next hop is received when it runs again or
        // is given up.
        c.rx += u64::from(verdict != Verdict::Unresolved);
        match verdict {
            Verdict::Forward { .. } => c.forwarded += 1,
            Verdict::Answer(_) => c.answered += 1,
            Verdict::Consumed => c.consumed += 1,
            Verdict::Drop(r) => self.dropped(r, prepared, now),
            Verdict::Unresolved => {}
        }
    }

    /// A frame held for its next hop ([`Verdict::Unresolved`]) that will
    /// not run again (the neighbour never answered, or there is no room
    /// to hold it): received and dropped as `next_hop_unresolved`.
    pub fn give_up(&mut self, prepared: &Prepared, now: u32) {
        self.core.counters.rx += 1;
        self.dropped(DropReason::NextHopUnresolved, prepared, now);
    }

    /// Counts a drop for `r`, with its flow event.
    fn dropped(&mut self, r: DropReason, prepared: &Prepared, now: u32) {
        self.core.counters.drops[r.index()] += 1;
        // The frame's endpoints are read only when events are produced.
        if self.core.events.is_some() {
            let (protocol, src, dst) = endpoints_of(prepared);
            let none = FlowEvent::NONE;
            let kind = EventKind::Drop(r);
            self.core.event(now, kind, protocol, src, dst, [none, none]);
        }
    }

    /// Changes whenever a next hop is learned or changes (frames held for
    /// one run again then).
    pub fn neighbour_generation(&self) -> u64 {
        self.v4.neighbours.generation() + self.v6.neighbours.generation()
    }

    /// Builds the announcement that `addr` is here, on `side`, into
    /// `buf`: a gratuitous ARP (a request for itself, broadcast, as
    /// keepalived sends) or an unsolicited neighbour advertisement; its
    /// length, or `None` if `buf` is too short.
    pub fn build_announcement(&self, buf: &mut [u8], addr: IpAddr, side: Side) -> Option<usize> {
        let mac = self.core.mac(side);
        match addr {
            IpAddr::V4(a) => {
                crate::wire::Arp::request(mac, a, a).emit(buf, EthernetAddress::BROADCAST)
            }
            IpAddr::V6(a) => crate::wire::ndp::announce(buf, mac, a),
        }
    }

    /// Publishes the sync records staged since the last call (the worker
    /// calls it once per loop iteration, after its batches).
    pub fn flush_sync(&mut self) {
        self.core.flush_sync();
    }

    /// The worker's time for the sync records it produces.
    pub fn sync_tick(&self, now: u32) {
        if let Some(q) = &self.core.sync {
            q.tick(now);
        }
    }

    /// Sends sync records of this worker's flows to `sync` from now on
    /// (none: no more; what is staged is published first).
    pub fn set_sync(&mut self, sync: Option<Arc<SyncQueue>>) {
        self.core.flush_sync();
        self.core.sync = sync;
    }

    /// Installs (or updates, or deletes) the flows and templates of a
    /// peer's sync records at `now` (see [`FlowTable::install`]). A record
    /// for a service or backend this gateway does not have, or that
    /// would replace a flow of its own, is skipped: (installed, skipped).
    pub fn apply_sync(&mut self, records: &[SyncRecord], now: u32) -> (u64, u64) {
        let worker = self.core.cfg.worker;
        let (mut done, mut skipped) = (0, 0);
        for r in records {
            let ok = match r.vip.addr {
                IpAddr::V4(_) => self.v4.apply_sync(r, worker, now),
                IpAddr::V6(_) => self.v6.apply_sync(r, worker, now),
            };
            if ok {
                done += 1;
            } else {
                skipped += 1;
            }
        }
        self.core.counters.synced += done;
        self.core.counters.sync_skipped += skipped;
        (done, skipped)
    }

    /// Sends flow events to `events` (the worker's half of a
    /// [`FlowEvents::channel`]) from now on.
    ///
    /// [`FlowEvents::channel`]: crate::events::FlowEvents::channel
    pub fn set_events(&mut self, events: EventSender) {
        self.core.events = Some(events);
    }

    /// The flows of `family`'s table matching `filter` among `budget`
    /// slots from `cursor`, and where to continue (`None`: done).
    pub fn dump(
        &self,
        filter: &Filter<IpAddr>,
        family: xvs_config::Family,
        cursor: u32,
        budget: u32,
        now: u32,
    ) -> (Vec<FlowInfo<IpAddr>>, Option<u32>) {
        match family {
            xvs_config::Family::V4 => self.v4.dump(filter, cursor, budget, now),
            xvs_config::Family::V6 => self.v6.dump(filter, cursor, budget, now),
        }
    }

    /// Deletes the flows of `family`'s table matching `filter` among
    /// `budget` slots from `cursor`, keeping the services' connection
    /// counts right; how many, and where to continue.
    pub fn delete_matching(
        &mut self,
        filter: &Filter<IpAddr>,
        family: xvs_config::Family,
        cursor: u32,
        budget: u32,
    ) -> (u32, Option<u32>) {
        let worker = self.core.cfg.worker;
        match family {
            xvs_config::Family::V4 => self.v4.delete_matching(filter, cursor, budget, worker),
            xvs_config::Family::V6 => self.v6.delete_matching(filter, cursor, budget, worker),
        }
    }

    /// Advances conntrack's timers by at most `budget` entries (each
    /// family's table).
    pub fn advance(&mut self, now: u32, budget: u32) -> xvs_conntrack::Advance {
        let worker = self.core.cfg.worker;
        let (table, mut obs) = self.v4.split(worker);
        let a = table.advance(now, budget, &mut obs);
        let (table, mut obs) = self.v6.split(worker);
        let b = table.advance(now, budget, &mut obs);
        xvs_conntrack::Advance {
            expired: a.expired + b.expired,
            done: a.done && b.done,
        }
    }
}

/// The Ethernet addresses of `route`: ours on its side, and its next
/// hop's from `neighbours` (a request for it queued when unknown, if
/// `resolve`).
fn link<A: Family>(
    neighbours: &mut Neighbours<A>,
    core: &Core,
    route: &Route<A>,
    resolve: bool,
) -> Result<(EthernetAddress, EthernetAddress), Verdict> {
    let ours = core.mac(route.side);
    let next = match route.next_hop {
        NextHop::Mac(mac) => mac,
        NextHop::Neighbour(addr) => match neighbours.get(addr) {
            Some(mac) => mac,
            None if resolve => {
                neighbours.resolve(addr);
                return Err(Verdict::Unresolved);
            }
            None => return Err(Verdict::Drop(DropReason::NextHopUnresolved)),
        },
    };
    Ok((ours, EthernetAddress(next)))
}

/// Whether IPVS's rules end flow `f` at a packet in direction `dir` with
/// TCP `flags`, its backend being `dest` in the worker's service
/// version, and why (see the module docs). The one statement of those
/// rules: the general path and the express lane both ask it.
#[inline(always)]
fn removal<A: Address>(
    rules: ConnRules,
    f: &xvs_conntrack::FlowRef<'_, A>,
    dir: Direction,
    flags: u8,
    dest: DestState,
) -> Option<Removal> {
    // IPVS's is_new_conn(): a SYN without ACK, FIN or RST.
    let all = tcp_flags::SYN | tcp_flags::ACK | tcp_flags::FIN | tcp_flags::RST;
    // The flags first: a packet that is no SYN answers without a read.
    let new_conn =
        flags & all == tcp_flags::SYN && dir == Direction::Original && f.proto() == L4Proto::Tcp;
    match dest {
        DestState::Removed if rules.expire_nodest_conn => Some(Removal::NoDest),
        DestState::Quiesced if new_conn && rules.expire_nodest_conn => Some(Removal::Rescheduled),
        _ if new_conn
            && rules.conn_reuse_mode
            && matches!(f.state(), FlowState::TimeWait | FlowState::Close) =>
        {
            Some(Removal::Rescheduled)
        }
        _ => None,
    }
}

fn answer(r: Answer) -> Verdict {
    match r {
        Ok(Some(len)) => Verdict::Answer(len),
        Ok(None) => Verdict::Drop(DropReason::IcmpUnsupportedType),
        Err(reason) => Verdict::Drop(reason),
    }
}

/// The protocol, source and destination of a prepared frame (ports for
/// TCP/UDP, 0 otherwise; unspecified when it is not IP).
fn endpoints_of(p: &Prepared) -> (u8, Endpoint<IpAddr>, Endpoint<IpAddr>) {
    fn of<I: IpPacket>(ip: &I) -> (u8, Endpoint<IpAddr>, Endpoint<IpAddr>) {
        let (sp, dp) = match ip.l4() {
            L4::Tcp {
                src_port, dst_port, ..
            }
            | L4::Udp { src_port, dst_port } => (src_port, dst_port),
            _ => (0, 0),
        };
        let e = |a: I::Addr, port| Endpoint { addr: a.ip(), port };
        (ip.protocol(), e(ip.src(), sp), e(ip.dst(), dp))
    }
    match &p.frame {
        Ok(Frame::Ipv4(ip)) => of(ip),
        Ok(Frame::Ipv6(ip)) => of(ip),
        _ => (0, FlowEvent::NONE, FlowEvent::NONE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks cover a batch's frames once each, in order, none empty
    /// and none longer than [`LOOKUP_CHUNK`].
    #[test]
    fn lookup_chunks_cover_a_batch_in_order() {
        for n in [
            0,
            1,
            LOOKUP_CHUNK - 1,
            LOOKUP_CHUNK,
            LOOKUP_CHUNK + 1,
            64,
            65,
        ] {
            let chunks: Vec<_> = lookup_chunks(n).collect();
            let frames: Vec<usize> = chunks.iter().cloned().flatten().collect();
            assert_eq!(frames, (0..n).collect::<Vec<_>>(), "{n} frames");
            assert!(chunks
                .iter()
                .all(|c| !c.is_empty() && c.len() <= LOOKUP_CHUNK));
            assert_eq!(chunks.len(), n.div_ceil(LOOKUP_CHUNK));
        }
    }
}
