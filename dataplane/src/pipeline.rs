//! The per-packet pipeline of one worker, sans-IO: a received frame and
//! the time in, a verdict out (forward, answer, consumed, or drop with a
//! reason), the frame rewritten in place.
//!
//! Classify → ARP / ICMP answers for owned addresses → conntrack lookup →
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
//! The jobs beside the verdict live in their own modules: next hops and
//! ARP requests in [`crate::neighbours`], SNAT endpoints in
//! [`crate::snat`], flow events in [`crate::events`], counters in
//! [`crate::counters`], forwarding in [`crate::forward`]; the pipeline
//! keeps the owned-address set (a hash set of VIPs and SNAT addresses).
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
//! Fragment policy: IPv4 fragments are dropped and counted (`fragment`);
//! clients behind xvs use PMTU discovery, which the ICMP error translation
//! keeps working.

use std::net::Ipv4Addr;
use std::sync::Arc;

use hashbrown::HashSet;
use smoltcp::wire::{EthernetAddress, EthernetFrame};
use xvs_config::{ConnRules, PortRange, UnknownPort};
use xvs_conntrack::{
    tcp_flags, Direction, Endpoint, FlowId, FlowKey, FlowState, FlowTable, InsertError, L4Proto,
    NewFlow, Packet, Removal, Timeouts,
};

pub use crate::counters::Counters;
use crate::events::{EventKind, FlowEvent, FlowEvents};
use crate::forward::{NextHop, Plan, Route};
use crate::neighbours::Neighbours;
use crate::sched::{pick_persistent, Request};
use crate::services::{CompiledService, ServiceCounts, ServiceTable};
use crate::snat::SnatEndpoints;
use crate::traffic::DestState;
use crate::wire::answer::{
    arp_reply, icmp_echo_reply, icmp_port_unreachable, icmp_time_exceeded, tcp_reset,
};
use crate::wire::checksum::l4_verifies;
use crate::wire::{
    classify, icmp_error, nat, ArpOp, DropReason, Fragment, Frame, IcmpErrorNat, Ipv4, Nat, L4,
};

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
}

/// A frame's flow as looked up ahead of processing, with its batch (the
/// batch's flow-table reads overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lookup {
    /// Not looked up (no flow key, or no lookup ahead).
    #[default]
    NotYet,
    /// No flow then (a frame of the same batch may create it: looked up
    /// again).
    Miss,
    /// This flow, in this direction (used only if the entry still holds
    /// the key: a frame of the same batch may have replaced it).
    Hit(FlowId, Direction),
}

/// The verdict on a frame rewritten for `side` (or why it could not be).
fn sent(rewritten: Result<(), DropReason>, ip: &Ipv4, side: Side) -> Verdict {
    match rewritten {
        Ok(()) => Verdict::Forward {
            len: ip.end(),
            to: side,
        },
        Err(r) => Verdict::Drop(r),
    }
}

/// A received frame: the side it came in on, its buffer (room beyond
/// `len` for answers that grow), its length and the time.
struct Rx<'a> {
    ingress: Side,
    buf: &'a mut [u8],
    len: usize,
    now: u32,
}

/// A frame classified ahead of processing, with its flow key (TCP and
/// UDP only), so a batch's flows can be looked up together.
#[derive(Debug, Clone, Copy)]
pub struct Prepared {
    frame: Result<Frame, DropReason>,
    key: Option<FlowKey>,
}

impl Prepared {
    /// Whether it is an ARP reply (which every worker learns from).
    pub fn is_arp_reply(&self) -> bool {
        matches!(self.frame, Ok(Frame::Arp(a)) if a.op == ArpOp::Reply)
    }

    /// Classifies `frame` (no state is touched).
    pub fn of(frame: &[u8]) -> Prepared {
        let frame = classify(frame);
        let key = match &frame {
            Ok(Frame::Ipv4(ip))
                if matches!(ip.l4, L4::Tcp { .. } | L4::Udp { .. })
                    && ip.fragment == Fragment::Whole =>
            {
                ip.flow_key()
            }
            _ => None,
        };
        Prepared { frame, key }
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
    /// This worker's SNAT ports.
    pub snat_ports: PortRange,
    /// Flow table capacity.
    pub capacity: u32,
    /// Conntrack timeouts.
    pub timeouts: Timeouts,
    /// IPVS's reuse and removal rules.
    pub rules: ConnRules,
    /// What a VIP port without a service answers.
    pub unknown_port: UnknownPort,
}

/// One worker's pipeline.
pub struct Pipeline {
    cfg: PipelineConfig,
    /// Flows.
    pub table: FlowTable,
    /// Services.
    pub services: ServiceTable,
    /// Addresses answered for (VIPs and SNAT addresses).
    owned: HashSet<Ipv4Addr>,
    /// Next hops and the ARP requests to send.
    neighbours: Neighbours,
    /// SNAT endpoints: the search for a free one resumes where the last
    /// one ended, where the oldest flows were, so a free endpoint is
    /// usually the first.
    snat: SnatEndpoints,
    /// Until when (worker clock) this worker is under pressure.
    pressure_until: u32,
    counters: Counters,
    /// Where flow events go (none: not produced).
    events: Option<Arc<FlowEvents>>,
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
        let mut owned = HashSet::new();
        owned.extend(cfg.snat_addrs.iter().copied());
        Pipeline {
            table,
            services: ServiceTable::default(),
            owned,
            // ARP requests come from the first SNAT address (see
            // `share_with_host`).
            neighbours: Neighbours::new(
                cfg.snat_addrs
                    .first()
                    .copied()
                    .unwrap_or(Ipv4Addr::UNSPECIFIED),
                cfg.backend_mac,
            ),
            snat: SnatEndpoints::new(cfg.snat_addrs.clone(), cfg.snat_ports),
            pressure_until: 0,
            counters: Counters::default(),
            events: None,
            cfg,
        }
    }

    /// Adopts the flows of a table read back from a state file, resolving
    /// each one's service by its VIP, protocol and port and its backend by
    /// address and port (the ids this process gave them), and counting
    /// their connections; flows whose service or backend is gone are
    /// dropped, counted. Nothing to do for a table not read back.
    pub fn adopt(&mut self, now: u32) -> xvs_conntrack::Adopted {
        let services = &self.services;
        let resolve = |f: xvs_conntrack::FlowRef<'_>| {
            let vip = f.vip();
            let slot = services.find(vip.addr, f.proto(), vip.port)?;
            let b = f.backend();
            let backend = slot.svc.backend(b).or_else(|| {
                slot.svc
                    .backends
                    .iter()
                    .find(|x| x.endpoint.addr == b.addr && x.endpoint.port == 0)
            })?;
            Some((slot.svc.id, backend.id))
        };
        let mut counts = ServiceCounts {
            table: &self.services,
            worker: self.cfg.worker,
        };
        self.table.adopt(now, resolve, &mut counts)
    }

    /// The SNAT port a classified frame is addressed to, if it is a reply
    /// (or an ICMP error about a flow) to this pipeline's SNAT address:
    /// its owner is the worker whose slice holds that port.
    pub fn snat_port_of(&self, prepared: &Prepared) -> Option<u16> {
        let Ok(Frame::Ipv4(ip)) = prepared.frame else {
            return None;
        };
        if !self.is_snat(ip.dst) {
            return None;
        }
        match ip.l4 {
            L4::Tcp { dst_port, .. } | L4::Udp { dst_port, .. } => Some(dst_port),
            L4::IcmpError(e) if self.is_snat(e.inner.src) => Some(e.inner.src_port),
            _ => None,
        }
    }

    /// Whether `addr` is one of the SNAT addresses.
    fn is_snat(&self, addr: Ipv4Addr) -> bool {
        self.snat.is_snat(addr)
    }

    /// Counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Marks SNAT addresses that are also the host's: xvs resolves next
    /// hops with ARP probes (sender 0.0.0.0) unless another SNAT address
    /// is its own, so the kernel keeps its ARP on its address.
    pub fn share_with_host(&mut self, shared: &[Ipv4Addr]) {
        let source = self
            .snat
            .addrs()
            .iter()
            .copied()
            .find(|a| !shared.contains(a))
            .unwrap_or(Ipv4Addr::UNSPECIFIED);
        self.neighbours.set_source(source);
    }

    /// Replaces the reuse and removal rules (from the next packet on).
    pub fn set_rules(&mut self, rules: ConnRules, unknown_port: UnknownPort) {
        self.cfg.rules = rules;
        self.cfg.unknown_port = unknown_port;
    }

    /// Answers ARP and ping for `addr` (a VIP).
    pub fn own(&mut self, addr: Ipv4Addr) {
        self.owned.insert(addr);
    }

    /// Stops answering for `addr` (never a SNAT address).
    pub fn disown(&mut self, addr: Ipv4Addr) {
        if !self.is_snat(addr) {
            self.owned.remove(&addr);
        }
    }

    /// Adds or replaces a service, as this worker applies it (its next
    /// hops are resolved at once).
    pub fn upsert_service(&mut self, svc: Arc<CompiledService>) {
        for b in &svc.backends {
            self.resolve(b.endpoint.addr);
        }
        self.services.upsert(svc, self.cfg.worker);
    }

    /// Queues an ARP request for `addr` (e.g. a new backend), once.
    pub fn resolve(&mut self, addr: Ipv4Addr) {
        self.neighbours.resolve(addr);
    }

    /// Takes the next address to send an ARP request for.
    pub fn next_arp(&mut self) -> Option<Ipv4Addr> {
        self.neighbours.next_request()
    }

    /// A frame this pipeline forwarded (or, `answer`, answered) that never
    /// got into a TX ring: it counts as a `tx_ring_full` drop instead, so
    /// `rx = forwarded + answered + consumed + Σ drops` still holds and
    /// `forwarded` counts only frames handed to the kernel.
    pub fn unsent(&mut self, answer: bool) {
        let c = &mut self.counters;
        let from = if answer {
            &mut c.answered
        } else {
            &mut c.forwarded
        };
        *from = from.saturating_sub(1);
        c.drops[DropReason::TxRingFull.index()] += 1;
    }

    /// Builds an ARP request for `target` from the ARP source (a SNAT
    /// address, or 0.0.0.0: see [`Pipeline::share_with_host`]) into `buf`
    /// (to send on the backend side); returns its length (60) or `None`
    /// if `buf` is too short.
    pub fn build_arp_request(&self, buf: &mut [u8], target: Ipv4Addr) -> Option<usize> {
        self.neighbours.build_request(buf, target)
    }

    fn learn(&mut self, addr: Ipv4Addr, mac: [u8; 6]) {
        self.neighbours.learn(addr, mac);
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
        self.process_prepared(ingress, buf, len, now, &prepared, Lookup::NotYet)
    }

    /// Looks up the flows of a batch of prepared frames at once
    /// ([`FlowTable::lookup_batch`]: the flow-table reads of the batch
    /// overlap); `out[i]` is a hit or a miss for every frame with a flow
    /// key, [`Lookup::NotYet`] for the others.
    pub fn lookup_prepared(&mut self, prepared: &[Prepared], out: &mut [Lookup]) {
        let mut keys = [FlowKey::between(
            Endpoint {
                addr: Ipv4Addr::UNSPECIFIED,
                port: 0,
            },
            Endpoint {
                addr: Ipv4Addr::UNSPECIFIED,
                port: 0,
            },
            L4Proto::Tcp,
        ); xvs_conntrack::BATCH];
        let mut at = [0usize; xvs_conntrack::BATCH];
        let mut hits = [None; xvs_conntrack::BATCH];
        for (prep, out) in prepared
            .chunks(xvs_conntrack::BATCH)
            .zip(out.chunks_mut(xvs_conntrack::BATCH))
        {
            let mut n = 0;
            for (i, p) in prep.iter().enumerate() {
                out[i] = Lookup::NotYet;
                if let Some(k) = p.key {
                    keys[n] = k;
                    at[n] = i;
                    n += 1;
                }
            }
            self.table.lookup_batch(&keys[..n], &mut hits[..n]);
            for j in 0..n {
                out[at[j]] = match hits[j] {
                    Some((id, dir)) => Lookup::Hit(id, dir),
                    None => Lookup::Miss,
                };
                // The hit's entry is in cache now: start fetching the
                // backend's traffic counters it will update.
                if let Some((id, _)) = hits[j] {
                    let f = self.table.flow(id);
                    if let Some(t) = self.services.traffic(f.service()) {
                        xvs_conntrack::prefetch(t.cell_addr(self.cfg.worker, f.backend_id()));
                    }
                }
            }
        }
    }

    /// Processes a frame already classified by [`Prepared::of`], with its
    /// flow looked up in advance (`looked`), or not. A hit found in
    /// advance is used only if the entry still holds that key (a flow of
    /// the same batch may have replaced it); a miss is looked up again
    /// (a flow of the same batch may have created it).
    pub fn process_prepared(
        &mut self,
        ingress: Side,
        buf: &mut [u8],
        len: usize,
        now: u32,
        prepared: &Prepared,
        looked: Lookup,
    ) -> Verdict {
        self.counters.rx += 1;
        let rx = Rx {
            ingress,
            len: len.min(buf.len()),
            buf,
            now,
        };
        let verdict = self.verdict(rx, prepared, looked);
        match verdict {
            Verdict::Forward { .. } => self.counters.forwarded += 1,
            Verdict::Answer(_) => self.counters.answered += 1,
            Verdict::Consumed => self.counters.consumed += 1,
            Verdict::Drop(r) => {
                self.counters.drops[r.index()] += 1;
                let (protocol, src, dst) = endpoints_of(prepared);
                let none = FlowEvent::NONE;
                self.event(now, EventKind::Drop(r), protocol, src, dst, [none, none]);
            }
        }
        verdict
    }

    /// Pushes a flow event, when events are produced.
    #[inline]
    fn event(
        &self,
        now: u32,
        kind: EventKind,
        protocol: u8,
        src: Endpoint,
        dst: Endpoint,
        [backend, snat]: [Endpoint; 2],
    ) {
        if let Some(ev) = &self.events {
            ev.push(FlowEvent {
                time: now,
                worker: self.cfg.worker as u16,
                kind,
                protocol,
                src,
                dst,
                backend,
                snat,
            });
        }
    }

    /// Sends flow events to `events` from now on.
    pub fn set_events(&mut self, events: Arc<FlowEvents>) {
        self.events = Some(events);
    }

    fn verdict(&mut self, rx: Rx<'_>, prepared: &Prepared, looked: Lookup) -> Verdict {
        let Rx {
            ingress,
            buf,
            len,
            now,
        } = rx;
        let frame = match prepared.frame {
            Ok(f) => f,
            Err(r) => return Verdict::Drop(r),
        };
        let ip = match frame {
            Frame::Arp(arp) => {
                self.learn(arp.sender_ip, arp.sender_mac.0);
                if arp.op == ArpOp::Reply {
                    return Verdict::Consumed;
                }
                if !self.owned.contains(&arp.target_ip) {
                    return Verdict::Drop(DropReason::ArpNotOwned);
                }
                let mac = match ingress {
                    Side::Client => self.cfg.mac,
                    Side::Backend => self.cfg.backend_mac,
                };
                return answer(arp_reply(buf, &arp, mac));
            }
            Frame::Ipv4(ip) => ip,
        };
        // TCP and UDP look their flow up first: a flow key names an owned
        // address, so a hit needs no ownership check (one hash lookup less
        // on the established path); a miss is checked below.
        let tcp_udp = matches!(ip.l4, L4::Tcp { .. } | L4::Udp { .. });
        if !tcp_udp && !self.owned.contains(&ip.dst) {
            return Verdict::Drop(DropReason::NotOwned);
        }
        if ip.fragment != Fragment::Whole {
            return Verdict::Drop(DropReason::Fragment);
        }
        match ip.l4 {
            L4::IcmpEcho { request: true, .. } => return answer(icmp_echo_reply(buf, &ip)),
            L4::IcmpEcho { .. } => return Verdict::Drop(DropReason::IcmpUnsupportedType),
            L4::IcmpError(_) => return self.related(buf, len, &ip, now),
            L4::None => return Verdict::Drop(DropReason::Fragment),
            L4::Tcp { .. } | L4::Udp { .. } => {}
        }
        let Some(key) = ip.flow_key() else {
            return Verdict::Drop(DropReason::UnsupportedProtocol);
        };
        let src_mac = EthernetFrame::new_unchecked(&*buf).src_addr().0;
        let tcp_flags = match ip.l4 {
            L4::Tcp { flags, .. } => flags.0,
            _ => 0,
        };
        let pkt = Packet {
            tcp_flags,
            len: u32::from(ip.total_len),
        };
        let mut hit = match looked {
            Lookup::Hit(id, dir) if self.table.holds(id, dir, &key) => Some((id, dir)),
            _ => self.table.lookup(&key),
        };
        // A packet that cannot be forwarded changes nothing (no flow, no
        // state, no count against a backend): a router's answer.
        if ip.ttl <= 1 {
            if hit.is_none() && !self.owned.contains(&ip.dst) {
                return Verdict::Drop(DropReason::NotOwned);
            }
            return match icmp_time_exceeded(buf, &ip) {
                Ok(Some(len)) => {
                    self.counters.time_exceeded += 1;
                    Verdict::Answer(len)
                }
                Ok(None) => Verdict::Drop(DropReason::TtlExceeded),
                Err(r) => Verdict::Drop(r),
            };
        }
        if let Some((id, dir)) = hit {
            if let Some(why) = self.ends_flow(id, dir, tcp_flags) {
                self.retire(id, why);
                hit = None;
                let opens = tcp_flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN;
                match (dir, key.proto) {
                    // The backend's side of a flow that ended.
                    (Direction::Reply, _) => return Verdict::Drop(DropReason::ReplyNoFlow),
                    // The kernel's answer to a segment of a connection it
                    // does not know.
                    (Direction::Original, L4Proto::Tcp) if !opens => {
                        return self.reject(buf, &ip, key.proto)
                    }
                    // A SYN or a datagram: scheduled afresh below.
                    _ => {}
                }
            }
        }
        let (id, dir) = match hit {
            Some((id, dir)) => {
                if dir == Direction::Reply {
                    self.learn(ip.src, src_mac);
                }
                let mut obs = ServiceCounts {
                    table: &self.services,
                    worker: self.cfg.worker,
                };
                // The state before is read only when events are produced
                // (the entry is in cache: the lookup just verified it).
                let before = self.events.as_ref().map(|_| self.table.flow(id).state());
                let after = self.table.on_packet(id, dir, pkt, now, &mut obs);
                if before.is_some_and(|b| b != after)
                    && matches!(after, FlowState::Close | FlowState::TimeWait)
                {
                    let f = self.table.flow(id);
                    let (src, dst, to) = (f.client(), f.vip(), [f.backend(), f.snat()]);
                    self.event(now, EventKind::Close, ip.protocol, src, dst, to);
                }
                (id, dir)
            }
            None if !self.owned.contains(&ip.dst) => return Verdict::Drop(DropReason::NotOwned),
            None if self.is_snat(ip.dst) => return Verdict::Drop(DropReason::ReplyNoFlow),
            // A new flow is inserted with its first packet accounted.
            None => match self.new_flow(buf, &ip, key, src_mac, pkt, now) {
                Ok(id) => (id, Direction::Original),
                Err(v) => return v,
            },
        };
        self.forward(buf, &ip, id, dir)
    }

    /// Whether IPVS's rules end the flow `id` at this packet (see the
    /// module docs), and why. One read of the backend's state, from the
    /// traffic-counter line the packet updates anyway.
    #[inline]
    fn ends_flow(&self, id: FlowId, dir: Direction, flags: u8) -> Option<Removal> {
        let rules = self.cfg.rules;
        let f = self.table.flow(id);
        let dest = self
            .services
            .dest_state(f.service(), self.cfg.worker, f.backend_id());
        // IPVS's is_new_conn(): a SYN without ACK, FIN or RST.
        let all = tcp_flags::SYN | tcp_flags::ACK | tcp_flags::FIN | tcp_flags::RST;
        let new_conn = f.proto() == L4Proto::Tcp
            && dir == Direction::Original
            && flags & all == tcp_flags::SYN;
        match dest {
            DestState::Removed if rules.expire_nodest_conn => Some(Removal::NoDest),
            DestState::Quiesced if new_conn && rules.expire_nodest_conn => {
                Some(Removal::Rescheduled)
            }
            _ if new_conn
                && rules.conn_reuse_mode
                && matches!(f.state(), FlowState::TimeWait | FlowState::Close) =>
            {
                Some(Removal::Rescheduled)
            }
            _ => None,
        }
    }

    /// Ends a flow for `why`, keeping the connection counts right.
    fn retire(&mut self, id: FlowId, why: Removal) {
        let mut obs = ServiceCounts {
            table: &self.services,
            worker: self.cfg.worker,
        };
        self.table.retire(id, why, &mut obs);
    }

    /// kube-proxy's REJECT: a TCP RST or an ICMP port unreachable (counted
    /// in `rejected`), or a drop when the packet may not be answered.
    fn reject(&mut self, buf: &mut [u8], ip: &Ipv4, proto: L4Proto) -> Verdict {
        let answer = match proto {
            L4Proto::Tcp => tcp_reset(buf, ip),
            _ => icmp_port_unreachable(buf, ip),
        };
        match answer {
            Ok(Some(len)) => {
                self.counters.rejected += 1;
                Verdict::Answer(len)
            }
            Ok(None) => Verdict::Drop(DropReason::NoBackend),
            Err(r) => Verdict::Drop(r),
        }
    }

    /// Full-NAT rewrite of a tracked flow's packet.
    fn forward(&mut self, buf: &mut [u8], ip: &Ipv4, id: FlowId, dir: Direction) -> Verdict {
        let f = self.table.flow(id);
        if let Some(t) = self.services.traffic(f.service()) {
            let d = match dir {
                Direction::Original => 0,
                Direction::Reply => 1,
            };
            t.packet(self.cfg.worker, f.backend_id(), d, u64::from(ip.total_len));
        }
        let route = Plan::from_tag(f.plan()).route(&f, dir);
        let (ours, next) = match self.link(&route, true) {
            Ok(macs) => macs,
            Err(v) => return v,
        };
        sent(
            nat::forward(buf, ip, &route.nat, ours, next),
            ip,
            route.side,
        )
    }

    /// The Ethernet addresses of `route`: ours on its side, and its next
    /// hop's (a request for it queued when unknown, if `resolve`).
    fn link(
        &mut self,
        route: &Route,
        resolve: bool,
    ) -> Result<(EthernetAddress, EthernetAddress), Verdict> {
        let ours = match route.side {
            Side::Client => self.cfg.mac,
            Side::Backend => self.cfg.backend_mac,
        };
        let next = match route.next_hop {
            NextHop::Mac(mac) => mac,
            NextHop::Neighbour(addr) => match self.neighbours.get(addr) {
                Some(mac) => mac,
                None => {
                    if resolve {
                        self.resolve(addr);
                    }
                    return Err(Verdict::Drop(DropReason::NextHopUnresolved));
                }
            },
        };
        Ok((ours, EthernetAddress(next)))
    }

    /// A packet to a VIP that no flow knows: schedule and track it.
    fn new_flow(
        &mut self,
        buf: &mut [u8],
        ip: &Ipv4,
        key: FlowKey,
        src_mac: [u8; 6],
        first: Packet,
        now: u32,
    ) -> Result<FlowId, Verdict> {
        let worker = self.cfg.worker;
        let Some(slot) = self.services.find(ip.dst, key.proto, key.dst_port) else {
            return Err(match self.cfg.unknown_port {
                UnknownPort::Reject => self.reject(buf, ip, key.proto),
                UnknownPort::Drop => Verdict::Drop(DropReason::NoService),
            });
        };
        if !slot.svc.allows(ip.src) {
            return Err(Verdict::Drop(DropReason::SourceDenied));
        }
        if let L4::Tcp { flags, .. } = ip.l4 {
            let opens = flags.syn() && !flags.ack();
            if !opens && !slot.svc.adopts_midflow() {
                self.table.count_invalid();
                return Err(Verdict::Drop(DropReason::TcpNoFlow));
            }
        }
        // Once per flow: a segment the backend would discard creates
        // nothing.
        if !l4_verifies(buf, ip) {
            self.table.count_invalid();
            return Err(Verdict::Drop(DropReason::L4BadChecksum));
        }
        let req = Request {
            client: key.source(),
            vip: key.destination(),
        };
        let svc = slot.svc.clone();
        let picked = {
            let mut sched = slot.sched.borrow_mut();
            match &svc.persist {
                Some(p) => {
                    // Persistence may early-drop a flow of any service: it
                    // reports to every service's counts.
                    let mut obs = ServiceCounts {
                        table: &self.services,
                        worker,
                    };
                    pick_persistent(
                        &mut sched,
                        &svc.backends,
                        &req,
                        &svc.counts,
                        p,
                        self.cfg.rules.expire_quiescent_template,
                        &mut self.table,
                        now,
                        &mut obs,
                    )
                }
                None => sched.pick(&svc.backends, &req, &svc.counts, now),
            }
        };
        let Ok(i) = picked else {
            return Err(self.reject(buf, ip, key.proto));
        };
        let b = svc.backends[i];
        // A port-0 service keeps the port the client asked for.
        let backend = Endpoint {
            addr: b.endpoint.addr,
            port: if b.endpoint.port == 0 {
                key.dst_port
            } else {
                b.endpoint.port
            },
        };
        // A plan without SNAT keeps the client as the reply destination.
        let snat = if b.plan.takes_snat() {
            self.snat_port(backend, key.proto, now)
                .ok_or(Verdict::Drop(DropReason::SnatExhausted))?
        } else {
            key.source()
        };
        let new = NewFlow {
            client: key.source(),
            vip: key.destination(),
            backend,
            snat,
            proto: key.proto,
            service: svc.id,
            backend_id: b.id,
            client_mac: src_mac,
            plan: b.plan.tag(),
        };
        let mut obs = ServiceCounts {
            table: &self.services,
            worker,
        };
        // Both keys were just found free: the orig key missed above, the
        // reply key in snat_port.
        let evicted = self.table.stats().early_drop;
        let inserted = self.table.insert_new(&new, first, now, &mut obs);
        let table = &self.table;
        if table.stats().early_drop != evicted || table.len() >= table.capacity() / 8 * 7 {
            self.pressure_until = now + PRESSURE_HOLD;
        }
        match inserted {
            Ok(id) => {
                // Under pressure (a SYN flood), handshakes that never
                // complete leave sooner.
                if now < self.pressure_until && self.table.flow(id).state() == FlowState::SynRecv {
                    let secs = self.table.timeouts().syn_recv_pressure;
                    self.table.shorten(id, secs);
                }
                self.counters.new_flows += 1;
                svc.stats.conn(worker, b.id);
                self.event(
                    now,
                    EventKind::New,
                    ip.protocol,
                    new.client,
                    new.vip,
                    [new.backend, new.snat],
                );
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
    /// ESTABLISHED flows are never reclaimed.
    fn snat_port(&mut self, backend: Endpoint, proto: L4Proto, now: u32) -> Option<Endpoint> {
        let mut victim = None;
        for tried in 0..SNAT_TRIES.min(self.snat.total()) {
            if tried >= RECLAIM_AFTER && victim.is_some() {
                break;
            }
            let (snat, at) = self.snat.advance()?;
            match self.table.lookup(&FlowKey::between(backend, snat, proto)) {
                None => return Some(snat),
                Some((id, _))
                    if victim.is_none() && self.table.flow(id).state().is_reclaimable() =>
                {
                    victim = Some((id, snat, at));
                }
                Some(_) => {}
            }
        }
        let (id, snat, at) = victim?;
        // The search goes on from there: the endpoints after it were used
        // after it, so reclaiming stays oldest first.
        self.snat.resume_after(at);
        self.retire(id, Removal::Reclaimed);
        self.pressure_until = now + PRESSURE_HOLD;
        Some(snat)
    }

    /// An ICMP error about a tracked flow, translated like the flow.
    fn related(&mut self, buf: &mut [u8], _len: usize, ip: &Ipv4, _now: u32) -> Verdict {
        let Some(key) = ip.flow_key() else {
            return Verdict::Drop(DropReason::IcmpErrorNoFlow);
        };
        let Some((id, dir)) = self.table.lookup(&key) else {
            return Verdict::Drop(DropReason::IcmpErrorNoFlow);
        };
        let f = self.table.flow(id);
        // The error goes where the flow's packets in `dir` go (the flow's
        // plan says where); the packet it quotes went the other way.
        let route = Plan::from_tag(f.plan()).route(&f, dir);
        let m = IcmpErrorNat {
            outer_src: route.nat.src.addr,
            outer_dst: route.nat.dst.addr,
            inner: Nat {
                src: route.nat.dst,
                dst: route.nat.src,
            },
        };
        let (ours, next) = match self.link(&route, false) {
            Ok(macs) => macs,
            Err(v) => return v,
        };
        sent(icmp_error::forward(buf, ip, &m, ours, next), ip, route.side)
    }

    /// Deletes the flows matching `filter` among `budget` slots from
    /// `cursor`, keeping the services' connection counts right.
    pub fn delete_matching(
        &mut self,
        filter: &xvs_conntrack::Filter,
        cursor: u32,
        budget: u32,
    ) -> (u32, Option<u32>) {
        let mut obs = ServiceCounts {
            table: &self.services,
            worker: self.cfg.worker,
        };
        self.table.delete_matching(filter, cursor, budget, &mut obs)
    }

    /// Advances conntrack's timers by at most `budget` entries.
    pub fn advance(&mut self, now: u32, budget: u32) -> xvs_conntrack::Advance {
        let mut obs = ServiceCounts {
            table: &self.services,
            worker: self.cfg.worker,
        };
        self.table.advance(now, budget, &mut obs)
    }
}

fn answer(r: Result<Option<usize>, DropReason>) -> Verdict {
    match r {
        Ok(Some(len)) => Verdict::Answer(len),
        Ok(None) => Verdict::Drop(DropReason::IcmpUnsupportedType),
        Err(reason) => Verdict::Drop(reason),
    }
}

/// The protocol, source and destination of a prepared frame (ports for
/// TCP/UDP, 0 otherwise; unspecified when it is not IPv4).
fn endpoints_of(p: &Prepared) -> (u8, Endpoint, Endpoint) {
    match &p.frame {
        Ok(Frame::Ipv4(ip)) => {
            let (sp, dp) = match ip.l4 {
                L4::Tcp {
                    src_port, dst_port, ..
                }
                | L4::Udp { src_port, dst_port } => (src_port, dst_port),
                _ => (0, 0),
            };
            (
                ip.protocol,
                Endpoint {
                    addr: ip.src,
                    port: sp,
                },
                Endpoint {
                    addr: ip.dst,
                    port: dp,
                },
            )
        }
        _ => (0, FlowEvent::NONE, FlowEvent::NONE),
    }
}
