//! A worker: one thread per (interface, queue), pinned to its core, owning
//! its AF_XDP port and its pipeline. Each loop iteration drains control
//! messages, reclaims and refills frames, receives a batch, runs every
//! frame through the pipeline, transmits the batch (and any ARP requests
//! the pipeline queued), and advances the conntrack timers by a bounded
//! amount.
//!
//! Cross-queue replies: RSS hashes a reply (backend → SNAT address:port)
//! independently of its flow, so it may arrive on another worker's queue.
//! The SNAT port says which worker owns the flow (each has its own slice):
//! a frame for another worker is copied into that worker's bounded
//! lock-free [`Handoff`] ring and processed there; a full ring drops it,
//! counted.
//!
//! Next hops being resolved: a frame whose next hop is not known yet
//! (a new backend's first SYN) is held, untouched, in a bounded list
//! ([`HOLD`] frames, the kernel's `unres_qlen`) and run again when a
//! neighbour is learned or a second passes (which asks again); after
//! more than [`HOLD_SECONDS`] it is given up, counted as `next_hop_unresolved`.
//!
//! Poll modes: `busy` spins; `adaptive` spins while there is traffic and,
//! after a run of empty polls, sleeps in poll(2) on the socket and an
//! eventfd that the control side writes after sending a message, so
//! control messages wake it at once.

use std::net::IpAddr;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use crossbeam_queue::ArrayQueue;
use xvs_config::{Family, PollMode, PortRange, ServiceKey};
use xvs_conntrack::{Filter, FlowInfo};

use crate::counters::{CountersReading, LiveCounters, WorkerTallies};
use crate::io::PacketIo;
use crate::pipeline::{AnyService, Counters, Lookup, Pipeline, Prepared, Side, Verdict};
use crate::xsk::{RingStats, XskPort, BATCH};

/// Empty polls before an adaptive worker sleeps.
const SPIN_BEFORE_SLEEP: u32 = 256;
/// Longest sleep of an idle adaptive worker, in milliseconds.
const SLEEP_MS: i32 = 100;
/// Conntrack entries examined per loop iteration.
const EXPIRY_BUDGET: u32 = 256;
/// Frames a side keeps waiting for its TX ring, retried on the next loop
/// iterations; beyond this they are dropped, counted (`tx_ring_full`).
const TX_BACKLOG: usize = 2 * BATCH;
/// Flow-table slots one dump or delete request walks (bounded pause).
const CHUNK_SLOTS: u32 = 16_384;

/// Frames a worker holds for next hops being resolved; more are dropped,
/// counted (`next_hop_unresolved`).
pub const HOLD: usize = 64;
/// Seconds (of the workers' clock) a frame may be held; it is given up
/// once more have passed. The kernel gives up after 3 unanswered probes
/// a second apart.
pub const HOLD_SECONDS: u32 = 3;

/// A frame held for its next hop.
struct Held<F> {
    desc: F,
    prep: Prepared,
    side: Side,
    since: u32,
}

/// Largest frame handed between workers.
pub const HANDOFF_FRAME: usize = 2048;
/// Frames a hand-off ring holds.
pub const HANDOFF_RING: usize = 1024;

/// A frame copied for another worker.
#[derive(Clone, Copy)]
pub struct HandoffFrame {
    len: u16,
    side: Side,
    bytes: [u8; HANDOFF_FRAME],
}

/// A worker's incoming hand-off ring (many producers: the other workers).
pub type Handoff = ArrayQueue<HandoffFrame>;

/// Which worker owns each SNAT port, and the rings to reach them.
#[derive(Clone)]
pub struct Peers {
    /// SNAT port slice of each worker, by index.
    pub slices: Arc<[PortRange]>,
    /// Hand-off ring of each worker, by index.
    pub rings: Arc<[Arc<Handoff>]>,
}

impl Peers {
    fn owner(&self, port: u16) -> Option<usize> {
        self.slices
            .iter()
            .position(|s| s.first <= port && port <= s.last)
    }
}

/// A message from the control side.
#[derive(Debug)]
pub enum Control {
    /// Add or replace a service.
    Upsert(AnyService),
    /// Remove a service.
    Remove(ServiceKey<std::net::IpAddr>),
    /// Answer ARP (neighbour solicitations) and ping for an address (a
    /// VIP).
    Own(std::net::IpAddr),
    /// Stop answering for an address.
    Disown(std::net::IpAddr),
    /// Report a snapshot.
    Snapshot(crossbeam_channel::Sender<Snapshot>),
    /// Adopt the flows of the table read back from a state file (the
    /// services are in), start marking the queue alive, and answer what
    /// was adopted.
    Adopt {
        /// The time now.
        now: u32,
        /// The answer.
        reply: crossbeam_channel::Sender<xvs_conntrack::Adopted>,
    },
    /// List the flows of one family's table matching a filter: one chunk
    /// of slots from `cursor`, answered with the flows and where to
    /// continue (`None`: done).
    Dump {
        /// Which flows.
        filter: Filter<IpAddr>,
        /// Whose table.
        family: Family,
        /// Slot to start at.
        cursor: u32,
        /// The answer.
        reply: crossbeam_channel::Sender<(Vec<FlowInfo<IpAddr>>, Option<u32>)>,
    },
    /// Delete the flows of one family's table matching a filter, one
    /// chunk from `cursor`; answered with how many and where to continue.
    Delete {
        /// Which flows (with `templates` set and nothing else: a flush).
        filter: Filter<IpAddr>,
        /// Whose table.
        family: Family,
        /// Slot to start at.
        cursor: u32,
        /// The answer.
        reply: crossbeam_channel::Sender<(u32, Option<u32>)>,
    },
    /// New conntrack timeouts (flows take them at their next transition).
    SetTimeouts(xvs_conntrack::Timeouts),
    /// New reuse and removal rules and unknown-port policy.
    SetRules(xvs_config::ConnRules, xvs_config::UnknownPort),
    /// Enter or leave a backup's standby (see [`Pipeline::standby`]),
    /// with the SNAT addresses shared with the host.
    Standby(bool, Vec<std::net::Ipv4Addr>),
    /// Install, update or delete a peer's flows (flow synchronisation).
    Sync(Vec<crate::sync::SyncRecord>),
    /// Announce that an address is here now (a gratuitous ARP or an
    /// unsolicited neighbour advertisement on every side), after taking
    /// it over from another gateway.
    Announce(std::net::IpAddr),
    /// Stop the worker.
    Stop,
}

/// What a worker reports.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Worker index.
    pub worker: usize,
    /// Pipeline counters.
    pub counters: Counters,
    /// Conntrack counters.
    pub conntrack: xvs_conntrack::Stats,
    /// Live flows.
    pub flows: u32,
    /// Frames (userspace, fill/RX, TX).
    pub frames: (u32, u32, u32),
    /// Whether every UMEM frame is accounted for.
    pub frames_accounted: bool,
    /// The loop's own counters.
    pub tallies: WorkerTallies,
    /// The kernel's statistics of the worker's AF_XDP sockets.
    pub rings: RingStats,
    /// Frames other workers handed to this one that were still in its
    /// ring when it stopped (filled in by the runtime after the stop).
    pub handoff_left: u64,
}

/// How a worker is reached: its control channel and wake-up eventfd, the
/// other workers' hand-off rings, and where it publishes its counters.
pub struct WorkerLinks {
    /// Control messages.
    pub control: Receiver<Control>,
    /// Eventfd the control side writes to wake the worker.
    pub wake: std::sync::Arc<crate::eventfd::EventFd>,
    /// Peers, when there are several workers.
    pub peers: Option<Peers>,
    /// Published counters.
    pub live: Arc<LiveCounters>,
    /// The queue's liveness mark in the steering program (empty when
    /// there is no program, as in tests on a loopback port).
    pub liveness: crate::steer::Liveness,
}

/// Frames waiting for one side's TX ring, in order, with whether each is
/// an answer (else a forwarded frame): a frame that never gets into the
/// ring is taken back out of the count it was in.
struct Outbox<F> {
    frames: Vec<F>,
    answers: Vec<bool>,
}

/// Empty, without capacity (what a taken-out outbox leaves behind for
/// the moment it is out).
impl<F> Default for Outbox<F> {
    fn default() -> Self {
        Outbox {
            frames: Vec::new(),
            answers: Vec::new(),
        }
    }
}

impl<F> Outbox<F> {
    fn new() -> Outbox<F> {
        Outbox {
            frames: Vec::with_capacity(TX_BACKLOG + 2 * BATCH),
            answers: Vec::with_capacity(TX_BACKLOG + 2 * BATCH),
        }
    }

    fn push(&mut self, desc: F, answer: bool) {
        self.frames.push(desc);
        self.answers.push(answer);
    }

    /// The first `n` frames went into the ring.
    fn sent(&mut self, n: usize) {
        self.frames.drain(..n);
        self.answers.drain(..n);
    }
}

/// What one loop iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Frames came in (from the port or other workers).
    Busy,
    /// Nothing came in; `sleep` says whether an adaptive worker would
    /// now sleep.
    Idle {
        /// Time to sleep.
        sleep: bool,
    },
    /// A stop message came: the worker does nothing more.
    Stopped,
}

/// Everything a worker thread owns, on its packet I/O `P` (the AF_XDP
/// port in production).
pub struct Worker<P: PacketIo = XskPort> {
    /// Index.
    pub index: usize,
    /// The pipeline.
    pub pipeline: Pipeline,
    /// The port.
    pub port: P,
    /// Control messages.
    pub control: Receiver<Control>,
    /// Eventfd the control side writes to wake the worker.
    pub wake: std::sync::Arc<crate::eventfd::EventFd>,
    /// Poll mode.
    pub poll: PollMode,
    peers: Option<Peers>,
    live: Arc<LiveCounters>,
    liveness: crate::steer::Liveness,
    /// Whether the queue is marked alive (not until its flows are
    /// adopted, when adoption waits for the services).
    serving: bool,
    last_now: u32,
    keep: Vec<usize>,
    preps: Vec<Prepared>,
    looked: Vec<Lookup>,
    tallies: WorkerTallies,
    /// The loop's frame buffers (kept between iterations: no allocation
    /// per iteration).
    rx: Vec<P::Frame>,
    outs: [Outbox<P::Frame>; 2],
    drop: Vec<P::Frame>,
    /// Frames held for next hops, and the spare list they are moved
    /// through when run again (both with capacity [`HOLD`]).
    held: Vec<Held<P::Frame>>,
    held_spare: Vec<Held<P::Frame>>,
    /// The neighbour generation and the second of the last retry.
    held_retried: (u64, u32),
    empty_streak: u32,
}

impl<P: PacketIo> Worker<P> {
    /// A worker ready to run.
    pub fn new(
        index: usize,
        pipeline: Pipeline,
        port: P,
        poll: PollMode,
        links: WorkerLinks,
    ) -> Worker<P> {
        Worker {
            index,
            pipeline,
            port,
            control: links.control,
            wake: links.wake,
            poll,
            peers: links.peers,
            live: links.live,
            liveness: links.liveness,
            serving: true,
            last_now: 0,
            keep: Vec::with_capacity(BATCH),
            preps: vec![Prepared::EMPTY; BATCH],
            looked: Vec::with_capacity(BATCH),
            tallies: WorkerTallies::default(),
            rx: vec![P::Frame::default(); BATCH],
            outs: [Outbox::new(), Outbox::new()],
            drop: Vec::with_capacity(BATCH),
            held: Vec::with_capacity(HOLD),
            held_spare: Vec::with_capacity(HOLD),
            held_retried: (0, 0),
            empty_streak: 0,
        }
    }

    /// Publishes the counters for readers on other threads.
    fn publish(&self) {
        let mut snat_flows = [0; crate::counters::SNAT_SLOTS];
        self.pipeline.snat_flows(&mut snat_flows);
        self.live.publish(&CountersReading {
            pipeline: *self.pipeline.counters(),
            worker: self.tallies,
            conntrack: self.pipeline.conntrack_stats(),
            rings: RingStats::default(),
            flows: u64::from(self.pipeline.flows()),
            snat_flows,
        });
    }

    /// What it reports now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            worker: self.index,
            counters: *self.pipeline.counters(),
            conntrack: self.pipeline.conntrack_stats(),
            flows: self.pipeline.flows(),
            frames: self.port.frame_counts(),
            frames_accounted: self.port.frames_accounted(),
            tallies: self.tallies,
            rings: self.port.ring_stats(),
            handoff_left: 0,
        }
    }

    /// Applies control messages; returns false on Stop.
    fn control(&mut self) -> bool {
        while let Ok(msg) = self.control.try_recv() {
            match msg {
                Control::Upsert(svc) => self.pipeline.upsert_service(svc),
                Control::Remove(key) => self.pipeline.remove_service(&key),
                Control::Own(a) => self.pipeline.own(a),
                Control::Disown(a) => self.pipeline.disown(a),
                Control::Snapshot(reply) => {
                    let _ = reply.send(self.snapshot());
                }
                Control::Adopt { now, reply } => {
                    let adopted = self.pipeline.adopt(now);
                    self.serving = true;
                    let _ = reply.send(adopted);
                }
                Control::Dump {
                    filter,
                    family,
                    cursor,
                    reply,
                } => {
                    let (p, now) = (&self.pipeline, self.last_now);
                    let _ = reply.send(p.dump(&filter, family, cursor, CHUNK_SLOTS, now));
                }
                Control::Delete {
                    filter,
                    family,
                    cursor,
                    reply,
                } => {
                    let p = &mut self.pipeline;
                    let _ = reply.send(p.delete_matching(&filter, family, cursor, CHUNK_SLOTS));
                }
                Control::SetTimeouts(t) => self.pipeline.set_timeouts(t),
                Control::SetRules(r, u) => self.pipeline.set_rules(r, u),
                Control::Standby(on, shared) => self.pipeline.standby(on, &shared),
                // Sent by the sync thread and the takeover, not the
                // engine: not among the messages it waits to see applied.
                Control::Sync(records) => {
                    self.pipeline.apply_sync(&records, self.last_now);
                    continue;
                }
                Control::Announce(addr) => {
                    self.announce(addr);
                    continue;
                }
                Control::Stop => return false,
            }
            self.live.applied_one();
        }
        true
    }

    /// The socket of a side (one-arm: both are socket 0).
    fn sock_of(&self, side: Side) -> usize {
        match side {
            Side::Client => 0,
            Side::Backend => self.port.sockets() - 1,
        }
    }

    /// Holds back the liveness mark until a [`Control::Adopt`]: the
    /// steering program's hold window is then all the time adoption may
    /// take.
    pub fn await_adoption(&mut self) {
        self.serving = false;
    }

    /// Runs until stopped; returns the final snapshot.
    pub fn run(mut self, clock: impl Fn() -> u32) -> Snapshot {
        loop {
            // The steering program holds this queue's packets while the
            // mark is recent and no socket takes them (see steer.rs).
            if self.serving {
                self.liveness.mark(crate::steer::monotonic_ns());
            }
            match self.step(clock()) {
                Step::Stopped => break,
                Step::Idle { sleep: true } => self.sleep(),
                Step::Busy | Step::Idle { sleep: false } => {}
            }
        }
        self.finish()
    }

    /// One loop iteration at time `now`: control messages, frames in,
    /// verdicts, frames out, ARP requests, timers.
    pub fn step(&mut self, now: u32) -> Step {
        if !self.control() {
            return Step::Stopped;
        }
        self.last_now = now;
        self.pipeline.sync_tick(now);
        self.port.reclaim();
        self.port.refill();
        let mut rx = std::mem::take(&mut self.rx);
        let mut outs = std::mem::take(&mut self.outs);
        let mut drop = std::mem::take(&mut self.drop);
        let mut got = 0;
        for sock in 0..self.port.sockets() {
            let ingress = if sock == 0 {
                Side::Client
            } else {
                Side::Backend
            };
            let n = self.port.receive(sock, &mut rx);
            got += n;
            self.process_batch(&mut rx[..n], ingress, true, now, &mut outs, &mut drop);
        }
        for _ in 0..BATCH {
            let Some((desc, side)) = self.take_handed_in() else {
                break;
            };
            got += 1;
            self.process_batch(&mut [desc], side, false, now, &mut outs, &mut drop);
        }
        self.retry_held(now, &mut outs, &mut drop);
        self.pipeline.flush_sync();
        self.port.release(&drop);
        drop.clear();
        for side in [Side::Client, Side::Backend] {
            self.transmit(side, &mut outs[side as usize], TX_BACKLOG);
        }
        (self.rx, self.outs, self.drop) = (rx, outs, drop);
        self.send_arp();
        self.pipeline.advance(now, EXPIRY_BUDGET);
        if got > 0 {
            self.empty_streak = 0;
            self.tallies.busy += 1;
            self.publish();
            return Step::Busy;
        }
        self.tallies.idle += 1;
        self.empty_streak += 1;
        if self.empty_streak.is_multiple_of(SPIN_BEFORE_SLEEP) {
            self.publish();
        }
        let sleep = self.poll == PollMode::Adaptive && self.empty_streak >= SPIN_BEFORE_SLEEP;
        if sleep {
            self.empty_streak = 0;
        }
        Step::Idle { sleep }
    }

    /// After the last step: what never got into a ring is dropped,
    /// counted; the final snapshot.
    pub fn finish(mut self) -> Snapshot {
        for h in std::mem::take(&mut self.held) {
            self.pipeline.give_up(&h.prep, self.last_now);
            self.port.release(&[h.desc]);
        }
        let mut outs = std::mem::take(&mut self.outs);
        for side in [Side::Client, Side::Backend] {
            self.transmit(side, &mut outs[side as usize], 0);
        }
        self.publish();
        self.snapshot()
    }

    /// Puts what it can of `out` into `side`'s TX ring; keeps at most
    /// `backlog` frames for the next iteration and drops the newest of
    /// the rest, each counted as `tx_ring_full` instead of what it was.
    fn transmit(&mut self, side: Side, out: &mut Outbox<P::Frame>, backlog: usize) {
        if out.frames.is_empty() {
            return;
        }
        let sock = self.sock_of(side);
        let n = self.port.transmit(sock, &out.frames);
        self.tallies.tx += n as u64;
        out.sent(n);
        if out.frames.len() > backlog {
            for &answer in &out.answers[backlog..] {
                self.pipeline.unsent(answer);
            }
            self.port.release(&out.frames[backlog..]);
            out.frames.truncate(backlog);
            out.answers.truncate(backlog);
        }
    }

    /// Runs a batch through the pipeline: every frame's headers are
    /// fetched a few frames ahead of it; frames for another worker are
    /// handed over (only those received from the port); the others are
    /// classified, their flows looked up together (the flow-table reads
    /// overlap), then each gets its verdict and goes to `outs` (by side)
    /// or `drop`.
    fn process_batch(
        &mut self,
        descs: &mut [P::Frame],
        ingress: Side,
        from_port: bool,
        now: u32,
        outs: &mut [Outbox<P::Frame>; 2],
        drop: &mut Vec<P::Frame>,
    ) {
        self.keep.clear();
        // Classified in place into the batch's array (taken out of `self`
        // for the loop: no allocation, the array is put back below).
        let mut all = std::mem::take(&mut self.preps);
        if all.len() < descs.len() {
            all.resize(descs.len(), Prepared::EMPTY);
        }
        for k in 0..descs.len() {
            // The headers are fetched a few frames ahead of the one
            // classified: the kernel's copy wrote them on another core,
            // or they left the cache, and classifying waited for each in
            // turn.
            self.port.prefetch_ahead(descs, k);
            let desc = &mut descs[k];
            // Classified once: for the hand-off and for the verdict, into
            // the slot after the frames kept so far.
            let prep = &mut all[self.keep.len()];
            // SAFETY: `desc` was just received on this port (or filled
            // from the hand-off ring) and is referenced nowhere else.
            unsafe {
                self.port
                    .with_frame(desc, |buf, len| prep.classify(&buf[..len]))
            };
            if from_port && self.hand_off(desc, prep, ingress) {
                drop.push(*desc);
                continue;
            }
            self.keep.push(k);
        }
        let n = self.keep.len();
        let preps = &all[..n];
        // Taken out for the loop as the classifications are.
        let mut looked_all = std::mem::take(&mut self.looked);
        looked_all.clear();
        looked_all.resize(n, Lookup::NotYet);
        // Looked up and processed a chunk at a time: what a chunk's
        // lookup fetched is still in cache when its frames are processed.
        for chunk in crate::pipeline::lookup_chunks(n) {
            let lo = chunk.start;
            let (preps, looked) = (&preps[chunk.clone()], &mut looked_all[chunk]);
            self.pipeline.lookup_prepared(preps, looked);
            for (i, prep) in preps.iter().enumerate() {
                self.pipeline.prefetch_ahead(preps, looked, i);
                let desc = &mut descs[self.keep[lo + i]];
                let pipeline = &mut self.pipeline;
                let look = looked[i];
                // SAFETY: as above.
                let verdict = unsafe {
                    self.port.with_frame(desc, |buf, _| {
                        pipeline.process_prepared(ingress, buf, now, prep, look)
                    })
                };
                // The classification is copied only for a frame held
                // (most are sent or dropped: no copy of it per packet).
                if !self.place(*desc, ingress, verdict, outs, drop) {
                    let held = Held {
                        desc: *desc,
                        prep: *prep,
                        side: ingress,
                        since: now,
                    };
                    self.hold(held, true, drop);
                }
            }
        }
        self.looked = looked_all;
        self.preps = all;
    }

    /// Sends the frame `desc`, received on `side`, where its `verdict`
    /// says: to `outs` (by side) or to `drop`; false if the verdict is
    /// [`Verdict::Unresolved`], for the caller to [`Worker::hold`] it.
    #[inline]
    fn place(
        &mut self,
        mut desc: P::Frame,
        side: Side,
        verdict: Verdict,
        outs: &mut [Outbox<P::Frame>; 2],
        drop: &mut Vec<P::Frame>,
    ) -> bool {
        let (len, to, answer) = match verdict {
            Verdict::Forward { len, to } => (len, to, false),
            Verdict::Answer(len) => (len, side, true),
            Verdict::Consumed | Verdict::Drop(_) => {
                drop.push(desc);
                return true;
            }
            Verdict::Unresolved => return false,
        };
        // SAFETY: a frame of this port (received, handed in or held),
        // referenced nowhere else; it is about to be sent.
        unsafe { self.port.set_len(&mut desc, len) };
        outs[to as usize].push(desc, answer);
        true
    }

    /// Holds `h`, whose next hop is unresolved, with the held frames
    /// (`fresh`: for the first time; `h.since` is when it first was), or
    /// gives it up when they are full.
    fn hold(&mut self, h: Held<P::Frame>, fresh: bool, drop: &mut Vec<P::Frame>) {
        if self.held.len() < HOLD {
            self.tallies.held += u64::from(fresh);
            self.held.push(h);
        } else {
            self.pipeline.give_up(&h.prep, h.since);
            drop.push(h.desc);
        }
    }

    /// Runs the held frames again when a next hop was learned or a new
    /// second began (asking again for those still unknown); gives up
    /// those held more than [`HOLD_SECONDS`].
    fn retry_held(&mut self, now: u32, outs: &mut [Outbox<P::Frame>; 2], drop: &mut Vec<P::Frame>) {
        let retried = (self.pipeline.neighbour_generation(), now);
        if self.held.is_empty() || retried == self.held_retried {
            return;
        }
        self.held_retried = retried;
        // Both lists keep their capacity: no allocation.
        let spare = std::mem::take(&mut self.held_spare);
        let mut pending = std::mem::replace(&mut self.held, spare);
        for mut h in pending.drain(..) {
            if now.wrapping_sub(h.since) > HOLD_SECONDS {
                self.pipeline.give_up(&h.prep, now);
                drop.push(h.desc);
                continue;
            }
            let pipeline = &mut self.pipeline;
            let (side, prep) = (h.side, h.prep);
            // SAFETY: a held frame of this port, referenced nowhere else
            // (untouched since it was received).
            let verdict = unsafe {
                self.port.with_frame(&mut h.desc, |buf, _| {
                    pipeline.process_prepared(side, buf, now, &prep, Lookup::NotYet)
                })
            };
            if !self.place(h.desc, side, verdict, outs, drop) {
                self.hold(h, false, drop);
            }
        }
        self.held_spare = pending;
    }

    /// If the frame belongs to another worker's flow, copies it into that
    /// worker's ring (or counts it dropped when full) and returns true;
    /// an ARP reply is copied to every other worker and processed here.
    fn hand_off(&mut self, desc: &mut P::Frame, prep: &Prepared, side: Side) -> bool {
        let Some(peers) = &self.peers else {
            return false;
        };
        let owner = self
            .pipeline
            .snat_port_of(prep)
            .and_then(|p| peers.owner(p))
            .filter(|&o| o != self.index);
        if owner.is_none() && !prep.is_arp_reply() {
            return false;
        }
        // SAFETY: `desc` is a received frame referenced nowhere else.
        let frame = unsafe {
            self.port.with_frame(desc, |buf, len| {
                (len <= HANDOFF_FRAME).then(|| {
                    let mut f = HandoffFrame {
                        len: len as u16,
                        side,
                        bytes: [0; HANDOFF_FRAME],
                    };
                    f.bytes[..len].copy_from_slice(&buf[..len]);
                    f
                })
            })
        };
        // Too large to hand over: processed here.
        let Some(frame) = frame else { return false };
        let mut push = |i: usize| {
            if peers.rings[i].push(frame).is_ok() {
                self.tallies.handed_off += 1;
            } else {
                self.tallies.handoff_full += 1;
            }
        };
        match owner {
            Some(o) => push(o),
            None => (0..peers.rings.len())
                .filter(|&i| i != self.index)
                .for_each(push),
        }
        // An ARP reply is also processed here; a frame handed over is not.
        owner.is_some()
    }

    /// Takes one frame another worker handed over into a free frame of
    /// this port, with the side it arrived on.
    fn take_handed_in(&mut self) -> Option<(P::Frame, Side)> {
        let ring = self.peers.as_ref()?.rings[self.index].clone();
        let mut desc = self.port.alloc()?;
        let Some(frame) = ring.pop() else {
            self.port.release(&[desc]);
            return None;
        };
        let len = usize::from(frame.len);
        // SAFETY: a free frame of this port, referenced nowhere else.
        unsafe {
            self.port.with_frame(&mut desc, |buf, _| {
                buf[..len].copy_from_slice(&frame.bytes[..len])
            });
            self.port.set_len(&mut desc, len);
        }
        self.tallies.handed_in += 1;
        Some((desc, frame.side))
    }

    /// Builds the ARP requests the pipeline queued into free frames and
    /// sends them on the backend side; one the TX ring cannot take is
    /// released (the next packet to that next hop asks again).
    fn send_arp(&mut self) {
        let mut frames = [P::Frame::default(); 8];
        loop {
            let mut n = 0;
            while n < frames.len() {
                let Some(target) = self.pipeline.next_arp() else {
                    break;
                };
                let Some(mut desc) = self.port.alloc() else {
                    break;
                };
                let pipeline = &self.pipeline;
                // SAFETY: a free frame of this port, referenced nowhere else.
                let len = unsafe {
                    self.port
                        .with_frame(&mut desc, |buf, _| pipeline.build_arp_request(buf, target))
                };
                match len {
                    Some(len) => {
                        // SAFETY: as above.
                        unsafe { self.port.set_len(&mut desc, len) };
                        frames[n] = desc;
                        n += 1;
                    }
                    None => self.port.release(&[desc]),
                }
            }
            if n == 0 {
                return;
            }
            let sock = self.sock_of(Side::Backend);
            let sent = self.port.transmit(sock, &frames[..n]);
            self.tallies.tx += sent as u64;
            self.tallies.arp_requests += sent as u64;
            self.port.release(&frames[sent..n]);
            if sent < n {
                return;
            }
        }
    }

    /// Sends the announcement that `addr` is here on every side (one
    /// frame each; one the TX ring cannot take is released, counted as
    /// nothing: the control side announces more than once).
    fn announce(&mut self, addr: IpAddr) {
        for (sock, side) in [(0, Side::Client), (self.port.sockets() - 1, Side::Backend)] {
            if side == Side::Backend && sock == 0 {
                break; // one-arm: one socket, sent already
            }
            let Some(mut desc) = self.port.alloc() else {
                return;
            };
            let pipeline = &self.pipeline;
            // SAFETY: a free frame of this port, referenced nowhere else.
            let len = unsafe {
                self.port.with_frame(&mut desc, |buf, _| {
                    pipeline.build_announcement(buf, addr, side)
                })
            };
            let Some(len) = len else {
                self.port.release(&[desc]);
                continue;
            };
            // SAFETY: as above.
            unsafe { self.port.set_len(&mut desc, len) };
            let sent = self.port.transmit(sock, &[desc]);
            self.tallies.tx += sent as u64;
            self.tallies.announced += sent as u64;
            if sent == 0 {
                self.port.release(&[desc]);
            }
        }
    }

    /// Sleeps until a packet arrives, a control message is signalled, or
    /// the sleep times out.
    fn sleep(&mut self) {
        let mut fds = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&*self.wake),
            events: libc::POLLIN,
            revents: 0,
        }; 3];
        let mut socks = 0;
        for k in 0..self.port.sockets() {
            if let Some(fd) = self.port.poll_fd(k) {
                socks += 1;
                fds[socks].fd = fd;
            }
        }
        // SAFETY: `fds` holds 1 + socks valid pollfd entries, alive for
        // the call; the descriptors are the worker's own (its eventfd and
        // sockets live as long as it does).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1 + socks as libc::nfds_t, SLEEP_MS) };
        // A failed poll (EINTR) is a spurious wakeup: the loop looks at
        // its rings and queue anyway.
        if n > 0 && fds[0].revents & libc::POLLIN != 0 {
            // Only EAGAIN can come back from a nonblocking eventfd read
            // (and is no error); the count itself is not needed.
            let _ = self.wake.drain();
        }
    }
}
