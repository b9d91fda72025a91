//! Flow events for `xvsadm observe` (like `hubble observe`): a new flow, a
//! flow closing (TCP into CLOSE or TIME_WAIT), a drop with its reason.
//!
//! Each worker pushes into its own bounded lock-free queue; the control
//! plane drains it. A full queue never blocks the worker: the event is
//! counted as overflow and dropped. New-flow and close events are sampled
//! (one in `sample`, default every one); drops are never sampled out, so
//! every drop reason shows up. Invariant: pushing allocates nothing and
//! takes no lock.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crossbeam_queue::ArrayQueue;
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

/// One worker's event queue.
#[derive(Debug)]
pub struct FlowEvents {
    queue: ArrayQueue<FlowEvent>,
    overflow: AtomicU64,
    sample: AtomicU32,
    seen: AtomicU64,
}

impl Default for FlowEvents {
    fn default() -> Self {
        FlowEvents {
            queue: ArrayQueue::new(QUEUE),
            overflow: AtomicU64::new(0),
            sample: AtomicU32::new(1),
            seen: AtomicU64::new(0),
        }
    }
}

impl FlowEvents {
    /// Pushes an event (sampled unless it is a drop); a full queue counts
    /// an overflow instead.
    #[inline]
    pub fn push(&self, e: FlowEvent) {
        if !matches!(e.kind, EventKind::Drop(_)) {
            let n = self.seen.load(Relaxed);
            self.seen.store(n + 1, Relaxed);
            let every = u64::from(self.sample.load(Relaxed).max(1));
            if !n.is_multiple_of(every) {
                return;
            }
        }
        if self.queue.push(e).is_err() {
            self.overflow
                .store(self.overflow.load(Relaxed) + 1, Relaxed);
        }
    }

    /// Takes every queued event.
    pub fn drain(&self, out: &mut Vec<FlowEvent>) {
        while let Some(e) = self.queue.pop() {
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
        let q = FlowEvents::default();
        q.set_sample(4);
        for _ in 0..8 {
            q.push(ev(EventKind::New));
        }
        q.push(ev(EventKind::Drop(DropReason::NoService)));
        let mut out = Vec::new();
        q.drain(&mut out);
        assert_eq!(out.len(), 3, "2 of 8 new flows sampled, and the drop");
        for _ in 0..QUEUE + 5 {
            q.push(ev(EventKind::Drop(DropReason::NoService)));
        }
        assert_eq!(q.overflow(), 5);
        out.clear();
        q.drain(&mut out);
        assert_eq!(out.len(), QUEUE);
    }
}
