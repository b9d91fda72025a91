//! Flow events for `xvsadm observe` (like `hubble observe`): a new flow, a
//! flow closing (TCP into CLOSE or TIME_WAIT), a drop with its reason.
//!
//! Each worker pushes into its own bounded single-producer ring
//! ([`EventSender`], the worker's alone); the control plane drains the
//! shared half ([`FlowEvents`]). A push is a plain store and a release
//! store of the ring's tail: no read-modify-write, so no locked
//! instruction (a full fence on x86, which would wait for the new flow's
//! own stores to reach the cache). A full ring never blocks the worker:
//! the event is counted as overflow and dropped. New-flow and close
//! events are sampled (one in `sample`, default every one); drops are
//! never sampled out, so every drop reason shows up. Invariant: pushing
//! allocates nothing and takes no lock; draining (the control plane's
//! side) takes the consumer's lock, which only drains contend for.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use xvs_conntrack::Endpoint;

use crate::wire::DropReason;

/// Events a worker's queue holds before it overflows.
pub const QUEUE: usize = 8192;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A flow was created and scheduled to `backend`.
    New,
    /// A TCP flow moved to CLOSE or TIME_WAIT.
    Close,
    /// A frame was dropped.
    Drop(DropReason),
}

impl EventKind {
    /// `FORWARDED`-style verdict name (hubble's vocabulary).
    pub fn verdict(self) -> &'static str {
        match self {
            EventKind::New => "NEW",
            EventKind::Close => "CLOSED",
            EventKind::Drop(_) => "DROPPED",
        }
    }
}

/// One event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEvent {
    /// Seconds on the workers' clock.
    pub time: u32,
    /// Worker.
    pub worker: u16,
    /// What happened.
    pub kind: EventKind,
    /// IP protocol number (6 TCP, 17 UDP, 1 ICMP, ...).
    pub protocol: u8,
    /// Source (port 0 when there is none).
    pub src: Endpoint<IpAddr>,
    /// Destination.
    pub dst: Endpoint<IpAddr>,
    /// Backend of the flow (unspecified when none).
    pub backend: Endpoint<IpAddr>,
    /// The flow's SNAT address and port towards the backend
    /// (unspecified when none).
    pub snat: Endpoint<IpAddr>,
}

impl FlowEvent {
    /// An endpoint with no address.
    pub const NONE: Endpoint<IpAddr> = Endpoint {
        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        port: 0,
    };

    /// An endpoint of either family, as events carry it.
    pub fn wide<A: xvs_config::Address>(e: Endpoint<A>) -> Endpoint<IpAddr> {
        Endpoint {
            addr: e.addr.ip(),
            port: e.port,
        }
    }
}

/// One worker's event queue, the control plane's half: drained, its
/// sampling set, its overflow read.
#[derive(Debug)]
pub struct FlowEvents {
    ring: Mutex<rtrb::Consumer<FlowEvent>>,
    overflow: AtomicU64,
    sample: AtomicU32,
}

/// One worker's event queue, the worker's half: pushes.
#[derive(Debug)]
pub struct EventSender {
    ring: rtrb::Producer<FlowEvent>,
    shared: Arc<FlowEvents>,
    /// New-flow and close events to pass over before the next one kept
    /// (a countdown, so that sampling divides nothing per event).
    skip: u32,
}

impl FlowEvents {
    /// A queue of [`QUEUE`] events: the worker's half and the shared one.
    pub fn channel() -> (EventSender, Arc<FlowEvents>) {
        let (producer, consumer) = rtrb::RingBuffer::new(QUEUE);
        let shared = Arc::new(FlowEvents {
            ring: Mutex::new(consumer),
            overflow: AtomicU64::new(0),
            sample: AtomicU32::new(1),
        });
        let sender = EventSender {
            ring: producer,
            shared: shared.clone(),
            skip: 0,
        };
        (sender, shared)
    }

    /// Takes every queued event.
    pub fn drain(&self, out: &mut Vec<FlowEvent>) {
        // A drain that panicked leaves the ring as consistent as any pop
        // does: take it back.
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        while let Ok(e) = ring.pop() {
            out.push(e);
        }
    }

    /// Events lost to a full queue.
    pub fn overflow(&self) -> u64 {
        self.overflow.load(Relaxed)
    }

    /// Keeps one new-flow or close event in `n` (1 = all).
    pub fn set_sample(&self, n: u32) {
        self.sample.store(n.max(1), Relaxed);
    }
}

impl EventSender {
    /// Pushes an event (sampled unless it is a drop); a full queue counts
    /// an overflow instead.
    #[inline]
    pub fn push(&mut self, e: FlowEvent) {
        if !matches!(e.kind, EventKind::Drop(_)) {
            let every = self.shared.sample.load(Relaxed).max(1);
            // A countdown left from a sparser rate ends at once.
            if self.skip > 0 && self.skip < every {
                self.skip -= 1;
                return;
            }
            // Kept: the next `every - 1` are passed over.
            self.skip = every - 1;
        }
        if self.ring.push(e).is_err() {
            let overflow = &self.shared.overflow;
            // The worker is the only writer.
            overflow.store(overflow.load(Relaxed) + 1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventKind) -> FlowEvent {
        FlowEvent {
            time: 1,
            worker: 0,
            kind,
            protocol: 6,
            src: FlowEvent::NONE,
            dst: FlowEvent::NONE,
            backend: FlowEvent::NONE,
            snat: FlowEvent::NONE,
        }
    }

    #[test]
    fn overflow_is_counted_and_drops_are_never_sampled_out() {
        let (mut tx, q) = FlowEvents::channel();
        q.set_sample(4);
        for _ in 0..8 {
            tx.push(ev(EventKind::New));
        }
        tx.push(ev(EventKind::Drop(DropReason::NoService)));
        let mut out = Vec::new();
        q.drain(&mut out);
        assert_eq!(out.len(), 3, "2 of 8 new flows sampled, and the drop");
        // One kept, with three to pass over at one in 4; back to every
        // event, the very next one is kept too.
        tx.push(ev(EventKind::New));
        q.set_sample(1);
        tx.push(ev(EventKind::New));
        out.clear();
        q.drain(&mut out);
        assert_eq!(out.len(), 2, "a lower rate waits for no countdown");
        for _ in 0..QUEUE + 5 {
            tx.push(ev(EventKind::Drop(DropReason::NoService)));
        }
        assert_eq!(q.overflow(), 5);
        out.clear();
        q.drain(&mut out);
        assert_eq!(out.len(), QUEUE);
    }

    #[test]
    fn a_worker_thread_s_events_arrive_whole_and_in_order() {
        let (mut tx, q) = FlowEvents::channel();
        let n = 3 * QUEUE as u32;
        let worker = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                // Waits for the drain rather than overflowing.
                if tx.ring.slots() > 0 {
                    tx.push(FlowEvent {
                        time: i,
                        ..ev(EventKind::New)
                    });
                    i += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            tx
        });
        let mut out = Vec::new();
        // Bounded: 5,000 empty drains in a row (5 s without an event)
        // end the wait.
        let mut idle = 0;
        while out.len() < n as usize && idle < 5_000 {
            let before = out.len();
            q.drain(&mut out);
            if out.len() == before {
                idle += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            } else {
                idle = 0;
            }
        }
        assert_eq!(out.len(), n as usize, "events lost or stuck");
        let tx = worker.join().unwrap();
        assert!(out.iter().enumerate().all(|(i, e)| e.time == i as u32
            && *e
                == FlowEvent {
                    time: e.time,
                    ..ev(EventKind::New)
                }));
        assert_eq!((out.len(), q.overflow(), tx.skip), (n as usize, 0, 0));
    }
}
