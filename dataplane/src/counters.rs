//! A worker's counters, declared once, and as the rest of the process reads
//! them.
//!
//! The tables ([`Counters`] of the pipeline, [`WorkerTallies`] of the
//! loop, conntrack's [`Stats`], the kernel's [`RingStats`]) are declared
//! with [`xvs_conntrack::counter_table!`]: the live block, the snapshot,
//! the stop line and `/metrics` iterate over them, so adding a counter is
//! one line in a table.
//!
//! [`LiveCounters`]: Relaxed atomics in one cache-line-padded block per
//! worker, written only by that worker (plain stores of its own tallies,
//! once per batch), read by anyone at any time without a round trip to the
//! worker. The AF_XDP socket's own statistics (what the kernel dropped
//! before xvs saw it) are not published there: readers ask the kernel for
//! them ([`crate::xsk::RingStats`]), so the worker makes no extra syscall.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use crossbeam_utils::CachePadded;

use crate::wire::{DropReason, Drops};
use crate::xsk::RingStats;
use xvs_conntrack::Stats;

xvs_conntrack::counter_table! {
    /// Counters of one pipeline. Invariant: `rx = forwarded + answered +
    /// consumed + Σ drops`.
    pub struct Counters {
        /// Frames received.
        rx => "xvs_rx_frames_total",
        /// Frames forwarded.
        forwarded => "xvs_forwarded_frames_total",
        /// Answers sent (ARP, echo, RST, port unreachable).
        answered => "xvs_answered_frames_total",
        /// Frames used up with nothing to send (ARP replies learned).
        consumed => "xvs_consumed_frames_total",
        /// Frames forwarded by the express lane, among the forwarded:
        /// established full-NAT packets decided from their flow entry and
        /// their backend's counter line alone (the rest take the general
        /// path; see `pipeline/express.rs` for what sends a packet there).
        express => "xvs_express_frames_total",
        /// Flows created.
        new_flows => "xvs_new_flows_total",
        /// REJECT answers sent (TCP RST, ICMP port unreachable), among the
        /// answers: a service without an eligible backend, a port without
        /// a service (`unknown_port = "reject"`), or a flow whose backend
        /// was removed.
        rejected => "xvs_rejected_total",
        /// ICMP time exceeded sent for packets whose TTL ran out, among the
        /// answers.
        time_exceeded => "xvs_time_exceeded_total",
        /// ICMP fragmentation needed / packet too big sent for packets to a
        /// tunnel backend that no longer fit its link once encapsulated,
        /// among the answers.
        too_big => "xvs_too_big_total",
        /// Flows and templates installed, updated or deleted from peers'
        /// sync records.
        synced => "xvs_sync_installed_total",
        /// Peers' sync records skipped: a service or backend this gateway
        /// does not have, or a flow of its own in the way.
        sync_skipped => "xvs_sync_skipped_total",
    }
    extra {
        /// Frames dropped, by reason.
        drops: Drops,
    }
}

impl Counters {
    /// Total drops.
    pub fn dropped(&self) -> u64 {
        self.drops.total()
    }
}

xvs_conntrack::counter_table! {
    /// What a worker's loop counts besides its pipeline.
    pub struct WorkerTallies {
        /// Frames put into the TX rings (forwarded, answers, ARP requests).
        tx => "xvs_tx_frames_total",
        /// ARP requests sent to resolve next hops (among `tx`).
        arp_requests => "xvs_arp_requests_total",
        /// Gratuitous ARPs and unsolicited neighbour advertisements sent
        /// for addresses taken over (among `tx`).
        announced => "xvs_announcements_total",
        /// Worker loop iterations that received frames.
        busy => "xvs_worker_busy_loops_total",
        /// Worker loop iterations that received nothing.
        idle => "xvs_worker_idle_loops_total",
        /// Frames received on this worker's queue but owned by another
        /// worker, handed over.
        handed_off => "xvs_handed_off_frames_total",
        /// Frames received from other workers.
        handed_in => "xvs_handed_in_frames_total",
        /// Hand-offs dropped because the owner's ring was full.
        handoff_full => "xvs_handoff_full_total",
        /// Frames held until their next hop answered ARP or neighbour
        /// discovery (then run again, or given up as
        /// `next_hop_unresolved`).
        held => "xvs_held_frames_total",
    }
}

/// How many SNAT addresses (IPv4 then IPv6) have their live flows
/// published ([`CountersReading::snat_flows`]).
pub const SNAT_SLOTS: usize = 16;

/// The published counters of one worker.
#[derive(Debug, Default)]
pub struct LiveCounters {
    inner: CachePadded<Block>,
}

/// One atomic per table field, in table order.
#[derive(Debug)]
struct Block {
    pipeline: [AtomicU64; Counters::LEN],
    drops: [AtomicU64; DropReason::COUNT],
    worker: [AtomicU64; WorkerTallies::LEN],
    conntrack: [AtomicU64; Stats::LEN],
    flows: AtomicU64,
    snat_flows: [AtomicU64; SNAT_SLOTS],
    /// Control messages applied so far (Release after each one).
    applied: AtomicU64,
}

impl Default for Block {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        Block {
            pipeline: std::array::from_fn(|_| z()),
            drops: std::array::from_fn(|_| z()),
            worker: std::array::from_fn(|_| z()),
            conntrack: std::array::from_fn(|_| z()),
            flows: z(),
            snat_flows: std::array::from_fn(|_| z()),
            applied: z(),
        }
    }
}

fn store<const N: usize>(to: &[AtomicU64; N], from: [u64; N]) {
    for (a, v) in to.iter().zip(from) {
        a.store(v, Relaxed);
    }
}

fn load<const N: usize>(from: &[AtomicU64; N]) -> [u64; N] {
    std::array::from_fn(|i| from[i].load(Relaxed))
}

/// A reading of [`LiveCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CountersReading {
    /// Pipeline counters.
    pub pipeline: Counters,
    /// The loop's own counters.
    pub worker: WorkerTallies,
    /// The flow table's event counters.
    pub conntrack: Stats,
    /// What the kernel counted on the worker's AF_XDP sockets (filled in
    /// by the reader, which asks the kernel).
    pub rings: RingStats,
    /// Live flows.
    pub flows: u64,
    /// Live flows per SNAT address (the config's IPv4 addresses, then its
    /// IPv6 ones; the first [`SNAT_SLOTS`]).
    pub snat_flows: [u64; SNAT_SLOTS],
}

impl CountersReading {
    /// Adds another worker's reading (totals over workers).
    pub fn add(&mut self, o: &CountersReading) {
        self.pipeline.add(&o.pipeline);
        self.pipeline.drops.add(&o.pipeline.drops);
        self.worker.add(&o.worker);
        self.conntrack.add(&o.conntrack);
        self.rings.add(&o.rings);
        self.flows += o.flows;
        for (a, b) in self.snat_flows.iter_mut().zip(o.snat_flows) {
            *a += b;
        }
    }
}

impl LiveCounters {
    /// Marks one more control message as applied by the worker.
    pub(crate) fn applied_one(&self) {
        self.inner.applied.fetch_add(1, Release);
    }

    /// How many control messages the worker has applied.
    pub fn applied(&self) -> u64 {
        self.inner.applied.load(Acquire)
    }

    /// Publishes the worker's tallies (its thread only).
    pub(crate) fn publish(&self, r: &CountersReading) {
        let b = &self.inner;
        store(&b.pipeline, r.pipeline.values());
        store(&b.drops, r.pipeline.drops.0);
        store(&b.worker, r.worker.values());
        store(&b.conntrack, r.conntrack.values());
        b.flows.store(r.flows, Relaxed);
        store(&b.snat_flows, r.snat_flows);
    }

    /// Reads the last published values.
    pub fn read(&self) -> CountersReading {
        let b = &self.inner;
        CountersReading {
            pipeline: Counters {
                drops: Drops(load(&b.drops)),
                ..Counters::from_array(load(&b.pipeline))
            },
            worker: WorkerTallies::from_array(load(&b.worker)),
            conntrack: Stats::from_array(load(&b.conntrack)),
            rings: RingStats::default(),
            flows: b.flows.load(Relaxed),
            snat_flows: load(&b.snat_flows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_then_read_round_trips_and_blocks_are_padded() {
        let live = LiveCounters::default();
        let mut r = CountersReading::default();
        r.pipeline.rx = 10;
        r.pipeline.forwarded = 7;
        r.pipeline.drops[DropReason::NoService.index()] = 3;
        r.pipeline.drops[DropReason::TxRingFull.index()] = 4;
        r.pipeline.time_exceeded = 5;
        r.worker.arp_requests = 6;
        r.worker.handoff_full = 9;
        r.conntrack.reclaim = 7;
        r.conntrack.found = 8;
        r.worker.tx = 7;
        r.flows = 2;
        r.snat_flows[1] = 11;
        live.publish(&r);
        assert_eq!(live.read(), r);
        assert!(std::mem::align_of::<LiveCounters>() >= 64);
    }
}
