//! Per-backend traffic counters of a service, as IPVS keeps them for
//! `ipvsadm -Ln --stats`: connections scheduled, packets and bytes in each
//! direction ("in" is client → backend, "out" backend → client).
//!
//! Each worker writes only its own row (one cache line per backend cell) with Relaxed load/store — a single writer
//! needs no read-modify-write, so accounting a packet costs two plain
//! stores. Readers sum the rows; a sum may be one packet stale, never
//! lose one. Unknown workers or backend ids are ignored (never a panic on
//! the packet path).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

/// One backend's counters on one worker.
#[derive(Debug, Default)]
struct Cell {
    conns: AtomicU64,
    pkts: [AtomicU64; 2],
    bytes: [AtomicU64; 2],
}

/// A sum over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficTotals {
    /// Connections scheduled.
    pub conns: u64,
    /// Packets `[in, out]`.
    pub pkts: [u64; 2],
    /// Bytes `[in, out]`.
    pub bytes: [u64; 2],
}

impl TrafficTotals {
    /// Adds another total.
    pub fn add(&mut self, o: &TrafficTotals) {
        self.conns += o.conns;
        for i in 0..2 {
            self.pkts[i] += o.pkts[i];
            self.bytes[i] += o.bytes[i];
        }
    }
}

/// The counters of every backend of a service, on every worker: one flat
/// shared array, `[worker][backend]`, so that the worker's per-packet
/// update is one load of this handle (kept inline in the service table)
/// and one write to the cell. Cloning shares the counters.
#[derive(Debug, Clone)]
pub struct TrafficStats {
    cells: Arc<[CachePadded<Cell>]>,
    backends: u32,
}

impl TrafficStats {
    /// Counters for backend ids `0..backends` on `workers` workers.
    pub fn new(workers: usize, backends: usize) -> TrafficStats {
        let cells = (0..workers.max(1) * backends)
            .map(|_| CachePadded::default())
            .collect();
        TrafficStats {
            cells,
            backends: backends as u32,
        }
    }

    /// Backend ids covered.
    pub fn backends(&self) -> usize {
        self.backends as usize
    }

    #[inline]
    fn cell(&self, worker: usize, id: u32) -> Option<&Cell> {
        if id >= self.backends {
            return None;
        }
        self.cells
            .get(worker * self.backends as usize + id as usize)
            .map(|c| &**c)
    }

    /// The address of a cell, for prefetching (never dereferenced here).
    #[inline]
    pub fn cell_addr(&self, worker: usize, id: u32) -> *const u8 {
        self.cell(worker, id)
            .map_or(std::ptr::null(), |c| (c as *const Cell).cast())
    }

    /// A new connection to backend `id`, seen by `worker`.
    #[inline]
    pub fn conn(&self, worker: usize, id: u32) {
        if let Some(c) = self.cell(worker, id) {
            c.conns.store(c.conns.load(Relaxed) + 1, Relaxed);
        }
    }

    /// A packet of `len` bytes; `dir` 0 = in (client → backend), 1 = out.
    #[inline]
    pub fn packet(&self, worker: usize, id: u32, dir: usize, len: u64) {
        if let (Some(c), true) = (self.cell(worker, id), dir < 2) {
            c.pkts[dir].store(c.pkts[dir].load(Relaxed) + 1, Relaxed);
            c.bytes[dir].store(c.bytes[dir].load(Relaxed) + len, Relaxed);
        }
    }

    /// Backend `id`'s totals over every worker.
    pub fn backend(&self, id: u32) -> TrafficTotals {
        let mut t = TrafficTotals::default();
        let workers = self.cells.len() / (self.backends.max(1) as usize);
        for w in 0..workers {
            if let Some(c) = self.cell(w, id) {
                t.conns += c.conns.load(Relaxed);
                for i in 0..2 {
                    t.pkts[i] += c.pkts[i].load(Relaxed);
                    t.bytes[i] += c.bytes[i].load(Relaxed);
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sum_and_out_of_range_is_ignored() {
        let s = TrafficStats::new(2, 3);
        s.conn(0, 1);
        s.conn(1, 1);
        s.packet(0, 1, 0, 60);
        s.packet(1, 1, 1, 1500);
        s.packet(1, 1, 1, 40);
        s.packet(5, 1, 0, 60); // no such worker
        s.packet(0, 9, 0, 60); // no such backend
        s.packet(0, 1, 2, 60); // no such direction
        assert_eq!(
            s.backend(1),
            TrafficTotals {
                conns: 2,
                pkts: [1, 2],
                bytes: [60, 1540]
            }
        );
        assert_eq!(s.backend(0), TrafficTotals::default());
        assert_eq!(s.backends(), 3);
        assert!(std::mem::align_of::<CachePadded<Cell>>() >= 64);
    }
}
