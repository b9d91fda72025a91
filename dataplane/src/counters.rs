//! A worker's counters as the rest of the process reads them: Relaxed
//! atomics in one cache-line-padded block per worker, written only by that
//! worker (plain stores of its own tallies, once per batch), read by anyone
//! at any time without a round trip to the worker.
//!
//! The AF_XDP socket's own statistics (what the kernel dropped before xvs
//! saw it) are not published here: readers ask the kernel for them
//! ([`crate::xsk::RingStats`]), so the worker makes no extra syscall.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use crossbeam_utils::CachePadded;

use crate::pipeline::Counters;
use crate::wire::DropReason;
use crate::xsk::RingStats;
use xvs_conntrack::Stats;

const CONNTRACK_FIELDS: usize = 13;

/// Conntrack's counters as an array (published field by field).
fn conntrack_fields(s: &Stats) -> [u64; CONNTRACK_FIELDS] {
    [
        s.found,
        s.miss,
        s.insert,
        s.insert_failed,
        s.invalid,
        s.drop,
        s.early_drop,
        s.delete,
        s.expire,
        s.table_full,
        s.reschedule,
        s.nodest,
        s.reclaim,
    ]
}

/// The inverse of [`conntrack_fields`].
fn conntrack_stats(v: [u64; CONNTRACK_FIELDS]) -> Stats {
    let [found, miss, insert, insert_failed, invalid, drop, early_drop, delete, expire, table_full, reschedule, nodest, reclaim] =
        v;
    Stats {
        found,
        miss,
        insert,
        insert_failed,
        invalid,
        drop,
        early_drop,
        delete,
        expire,
        table_full,
        reschedule,
        nodest,
        reclaim,
    }
}

/// The published counters of one worker.
#[derive(Debug, Default)]
pub struct LiveCounters {
    inner: CachePadded<Block>,
}

#[derive(Debug)]
struct Block {
    rx: AtomicU64,
    forwarded: AtomicU64,
    answered: AtomicU64,
    consumed: AtomicU64,
    new_flows: AtomicU64,
    rejected: AtomicU64,
    time_exceeded: AtomicU64,
    drops: [AtomicU64; DropReason::COUNT],
    arp_requests: AtomicU64,
    /// Conntrack's event counters, in [`conntrack_fields`] order.
    conntrack: [AtomicU64; CONNTRACK_FIELDS],
    tx: AtomicU64,
    busy: AtomicU64,
    idle: AtomicU64,
    flows: AtomicU64,
    handed_off: AtomicU64,
    handed_in: AtomicU64,
    handoff_full: AtomicU64,
    /// Control messages applied so far (Release after each one).
    applied: AtomicU64,
}

impl Default for Block {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        Block {
            rx: z(),
            forwarded: z(),
            answered: z(),
            consumed: z(),
            new_flows: z(),
            rejected: z(),
            time_exceeded: z(),
            drops: std::array::from_fn(|_| z()),
            arp_requests: z(),
            conntrack: std::array::from_fn(|_| z()),
            tx: z(),
            busy: z(),
            idle: z(),
            flows: z(),
            handed_off: z(),
            handed_in: z(),
            handoff_full: z(),
            applied: z(),
        }
    }
}

/// A reading of [`LiveCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CountersReading {
    /// Pipeline counters.
    pub pipeline: Counters,
    /// Frames sent.
    pub tx: u64,
    /// ARP requests the worker built and queued (not received frames).
    pub arp_requests: u64,
    /// The flow table's event counters.
    pub conntrack: Stats,
    /// What the kernel counted on the worker's AF_XDP sockets (filled in
    /// by the reader, which asks the kernel).
    pub rings: RingStats,
    /// Loop iterations that received packets.
    pub busy: u64,
    /// Loop iterations that received nothing.
    pub idle: u64,
    /// Live flows.
    pub flows: u64,
    /// Frames handed to other workers.
    pub handed_off: u64,
    /// Frames received from other workers.
    pub handed_in: u64,
    /// Hand-offs dropped (ring full).
    pub handoff_full: u64,
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
        let c = &r.pipeline;
        b.rx.store(c.rx, Relaxed);
        b.forwarded.store(c.forwarded, Relaxed);
        b.answered.store(c.answered, Relaxed);
        b.consumed.store(c.consumed, Relaxed);
        b.new_flows.store(c.new_flows, Relaxed);
        b.rejected.store(c.rejected, Relaxed);
        b.time_exceeded.store(c.time_exceeded, Relaxed);
        for (a, v) in b.drops.iter().zip(c.drops) {
            a.store(v, Relaxed);
        }
        b.arp_requests.store(r.arp_requests, Relaxed);
        for (a, v) in b.conntrack.iter().zip(conntrack_fields(&r.conntrack)) {
            a.store(v, Relaxed);
        }
        b.tx.store(r.tx, Relaxed);
        b.busy.store(r.busy, Relaxed);
        b.idle.store(r.idle, Relaxed);
        b.flows.store(r.flows, Relaxed);
        b.handed_off.store(r.handed_off, Relaxed);
        b.handed_in.store(r.handed_in, Relaxed);
        b.handoff_full.store(r.handoff_full, Relaxed);
    }

    /// Reads the last published values.
    pub fn read(&self) -> CountersReading {
        let b = &self.inner;
        let mut drops = [0; DropReason::COUNT];
        for (d, a) in drops.iter_mut().zip(&b.drops) {
            *d = a.load(Relaxed);
        }
        CountersReading {
            pipeline: Counters {
                rx: b.rx.load(Relaxed),
                forwarded: b.forwarded.load(Relaxed),
                answered: b.answered.load(Relaxed),
                consumed: b.consumed.load(Relaxed),
                drops,
                new_flows: b.new_flows.load(Relaxed),
                rejected: b.rejected.load(Relaxed),
                time_exceeded: b.time_exceeded.load(Relaxed),
            },
            tx: b.tx.load(Relaxed),
            arp_requests: b.arp_requests.load(Relaxed),
            conntrack: conntrack_stats(std::array::from_fn(|i| b.conntrack[i].load(Relaxed))),
            rings: RingStats::default(),
            busy: b.busy.load(Relaxed),
            idle: b.idle.load(Relaxed),
            flows: b.flows.load(Relaxed),
            handed_off: b.handed_off.load(Relaxed),
            handed_in: b.handed_in.load(Relaxed),
            handoff_full: b.handoff_full.load(Relaxed),
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
        r.arp_requests = 6;
        r.conntrack.reclaim = 7;
        r.conntrack.found = 8;
        r.tx = 7;
        r.flows = 2;
        live.publish(&r);
        assert_eq!(live.read(), r);
        assert!(std::mem::align_of::<LiveCounters>() >= 64);
    }
}
