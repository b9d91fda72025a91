//! Flow synchronisation between gateways (IPVS's sync daemon,
//! `ip_vs_sync.c`): every worker tells the others' gateways about its
//! flows, so that a backup (or an active peer) that takes over a
//! gateway's addresses serves its connections without resetting them.
//!
//! - Producing: a worker stages a [`SyncRecord`] and publishes the
//!   batch's records at its end into its own bounded lock-free
//!   [`SyncQueue`] when a flow is created, changes state
//!   (established, closing, closed), ends, or a persistence template is
//!   written. A full queue never blocks the worker: the record is dropped
//!   and counted (`overflow`).
//! - Sending ([`daemon`]): one thread drains the queues into datagrams
//!   ([`wire`], versioned, HMAC-SHA256 with the cluster's key) to the
//!   peers (unicast or a multicast group), every [`daemon::FLUSH_MS`]
//!   while records flow ([`daemon::IDLE_MS`] when they do not), and sends
//!   a hello with the addresses it serves every [`daemon::HELLO_MS`]
//!   (the peers' liveness check).
//! - Receiving: the same thread parses each datagram whole (anything bad
//!   is dropped and counted by reason, never installed), and hands the
//!   records to the workers as control messages; a worker installs a
//!   flow only for a service and backend it has itself.
//!
//! Invariants: pushing allocates nothing and takes no lock; the packet
//! path never waits on synchronisation; nothing from the network reaches
//! a flow table without passing [`wire::parse`].

pub mod daemon;
pub mod wire;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crossbeam_queue::ArrayQueue;
pub use wire::{Op, SyncDrop, SyncRecord};
use xvs_config::Address;
use xvs_conntrack::{Endpoint, FlowRef};

use crate::events::FlowEvent;

/// A flow is refreshed at its peers on its original direction's packet
/// number `SYNC_FIRST` and every `SYNC_PERIOD` after (IPVS's
/// `sync_threshold`, 3 50), so that a long-lived flow's copy does not
/// time out while the flow lives.
pub const SYNC_FIRST: u32 = 3;
/// See [`SYNC_FIRST`].
pub const SYNC_PERIOD: u32 = 50;

impl SyncRecord {
    /// The record of a live flow or template.
    pub fn of<A: Address>(f: &FlowRef<'_, A>, op: Op) -> SyncRecord {
        let w = FlowEvent::wide;
        SyncRecord {
            op,
            proto: f.proto(),
            state: f.state(),
            one_way: f.is_one_way(),
            lag: 0,
            client_mac: f.client_mac(),
            timeout: f.timeout(),
            client: w(f.client()),
            vip: w(f.vip()),
            backend: w(f.backend()),
            snat: w(f.snat()),
        }
    }

    /// The record of the persistence template placing clients of
    /// `client_net` on `vip` at `backend` for `timeout` seconds.
    pub fn template<A: Address>(
        proto: xvs_conntrack::L4Proto,
        client_net: A,
        vip: Endpoint<A>,
        backend: Endpoint<A>,
        timeout: u32,
    ) -> SyncRecord {
        let w = FlowEvent::wide;
        SyncRecord {
            op: Op::Update,
            proto,
            state: xvs_conntrack::FlowState::Template,
            one_way: false,
            lag: 0,
            client_mac: [0; 6],
            timeout,
            client: w(Endpoint {
                addr: client_net,
                port: 0,
            }),
            vip: w(vip),
            backend: w(backend),
            snat: w(Endpoint {
                addr: A::UNSPECIFIED,
                port: 0,
            }),
        }
    }
}

/// Whether a flow's original-direction packet count `packets` is one
/// its peers are refreshed at.
#[inline]
pub fn refresh_due(packets: u32) -> bool {
    packets % SYNC_PERIOD == SYNC_FIRST
}

/// Records a worker's queue holds before it overflows.
pub const QUEUE: usize = 16_384;

/// A worker's records waiting for the sync thread, with when each was
/// produced (seconds on the workers' clock).
#[derive(Debug)]
pub struct SyncQueue {
    queue: ArrayQueue<(u32, SyncRecord)>,
    overflow: AtomicU64,
    /// The producing worker's clock (set once per loop iteration).
    clock: AtomicU32,
}

impl Default for SyncQueue {
    fn default() -> Self {
        SyncQueue::new(QUEUE)
    }
}

impl SyncQueue {
    /// A queue of `capacity` records.
    pub fn new(capacity: usize) -> SyncQueue {
        SyncQueue {
            queue: ArrayQueue::new(capacity),
            overflow: AtomicU64::new(0),
            clock: AtomicU32::new(0),
        }
    }

    /// The producing worker's time (seconds on the workers' clock).
    #[inline]
    pub fn tick(&self, now: u32) {
        self.clock.store(now, Relaxed);
    }

    /// Queues `r`, stamped with the worker's time; a full queue counts it
    /// instead.
    #[inline]
    pub fn push(&self, r: SyncRecord) {
        let now = self.clock.load(Relaxed);
        if self.queue.push((now, r)).is_err() {
            self.overflow.fetch_add(1, Relaxed);
        }
    }

    /// The oldest record.
    pub fn pop(&self) -> Option<(u32, SyncRecord)> {
        self.queue.pop()
    }

    /// Records dropped because the queue was full.
    pub fn overflow(&self) -> u64 {
        self.overflow.load(Relaxed)
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xvs_config::Timeouts;
    use xvs_conntrack::{FlowTable, L4Proto, NewFlow, Packet};

    /// A flow's record carries the timeout it lives on: its state's, or
    /// the shorter one pressure gave it.
    #[test]
    fn a_flows_record_carries_its_timeout_as_shortened() {
        let t = Timeouts::default();
        let mut table = FlowTable::new(16, t, 100);
        let ep = |a: [u8; 4], port| Endpoint {
            addr: Ipv4Addr::from(a),
            port,
        };
        let new = NewFlow {
            client: ep([198, 18, 0, 1], 40_000),
            vip: ep([198, 19, 0, 1], 80),
            backend: ep([198, 18, 1, 1], 8080),
            snat: ep([198, 18, 254, 1], 1024),
            proto: L4Proto::Tcp,
            service: 1,
            backend_id: 0,
            client_mac: [2, 0, 0, 0, 0, 1],
            plan: 0,
            one_way: false,
        };
        let syn = Packet {
            tcp_flags: 0x02,
            len: 60,
        };
        let id = table.insert(&new, syn, 100, &mut ()).unwrap();
        let r = SyncRecord::of(&table.flow(id), Op::Update);
        assert_eq!(r.timeout, t.syn_recv);
        table.shorten(id, 3);
        let r = SyncRecord::of(&table.flow(id), Op::Update);
        assert_eq!(r.timeout, 3);
    }
}
