//! The control plane's flow-event drain, for benches that run the data
//! plane without the control plane.
//!
//! The daemon always produces flow events (every worker has its queue,
//! `xvsadm observe` reads them) and drains every queue every
//! [`DRAIN_EVERY`] (`control/src/events.rs`), so each new flow's event is a real push into
//! a queue another thread reads. A bench that runs the pipeline or the
//! data plane without a drain measures instead a full queue refusing every
//! push after its first 8,192 events: cheaper than what the daemon does.
//! [`register`] gives a bench's queues the daemon's drain: the drained
//! events go into the control plane's own collector
//! ([`xvs_control::events::Collector`], its history of the last events),
//! with nobody following, as on a gateway nobody is watching.
//!
//! Invariants: one process-wide thread drains every registered queue that
//! still exists, every [`DRAIN_EVERY`]; a queue dropped by its data plane is
//! forgotten at the next turn. The thread sleeps between turns and ends
//! with the process.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

pub use xvs_control::events::DRAIN_EVERY;
use xvs_dataplane::events::FlowEvents;

/// The queues being drained.
static QUEUES: OnceLock<Mutex<Vec<Weak<FlowEvents>>>> = OnceLock::new();

fn lock(m: &Mutex<Vec<Weak<FlowEvents>>>) -> MutexGuard<'_, Vec<Weak<FlowEvents>>> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Drains `queues` from now on as the daemon's control plane does (the
/// first call starts the draining thread). Returns an error if that
/// thread cannot start.
pub fn register(queues: &[Arc<FlowEvents>]) -> std::io::Result<()> {
    let mut first = false;
    let list = QUEUES.get_or_init(|| {
        first = true;
        Mutex::new(Vec::new())
    });
    lock(list).extend(queues.iter().map(Arc::downgrade));
    if first {
        std::thread::Builder::new()
            .name("event-drain".into())
            .spawn(move || drain_forever(list))?;
    }
    Ok(())
}

fn drain_forever(list: &'static Mutex<Vec<Weak<FlowEvents>>>) {
    let mut batch = Vec::new();
    let collector = xvs_control::events::Collector::new();
    loop {
        std::thread::sleep(DRAIN_EVERY);
        let live: Vec<Arc<FlowEvents>> = {
            let mut l = lock(list);
            l.retain(|w| w.strong_count() > 0);
            l.iter().filter_map(Weak::upgrade).collect()
        };
        for q in &live {
            q.drain(&mut batch);
        }
        collector.take(&batch);
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use xvs_dataplane::events::{EventKind, FlowEvent};

    #[test]
    fn a_registered_queue_never_fills_and_a_dropped_one_is_forgotten() {
        let (mut tx, q) = FlowEvents::channel();
        let ep = xvs_conntrack::Endpoint {
            addr: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
            port: 80,
        };
        let e = FlowEvent {
            time: 0,
            worker: 0,
            kind: EventKind::New,
            protocol: 6,
            src: ep,
            dst: ep,
            backend: ep,
            snat: ep,
        };
        register(std::slice::from_ref(&q)).unwrap();
        // 20,000 events, 500 every two periods: more than the queue
        // holds (8,192), so only a running drain keeps it from
        // overflowing.
        for _ in 0..40 {
            for _ in 0..500 {
                tx.push(e);
            }
            std::thread::sleep(DRAIN_EVERY * 2);
        }
        assert_eq!(q.overflow(), 0, "the drain kept up");
        drop((q, tx));
        let list = QUEUES.get().unwrap();
        // At most 250 periods (5 s).
        for _ in 0..250 {
            if lock(list).is_empty() {
                break;
            }
            std::thread::sleep(DRAIN_EVERY);
        }
        assert!(lock(list).is_empty(), "the dropped queue is forgotten");
    }
}
