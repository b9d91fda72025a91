//! Global per-backend connection counts, as IPVS's `activeconns` and
//! `inactconns`, for the schedulers that weigh load (lc, wlc, sed, nq,
//! twos).
//!
//! Each worker writes only its own row (whole cache lines of one flat
//! array, `[worker][chunk]`, so rows never share a line and a cell is one
//! index away from the handle) with plain Relaxed load/store:
//! a single writer needs no read-modify-write. Readers sum the rows on
//! read. A sum read while workers update may be a few connections stale,
//! exactly as an IPVS read of atomics on another CPU is; no count is ever
//! lost.
//!
//! A cell keeps both counts in one word, so a reader never sees a flow
//! half-way between active and inactive: a row's `active + inactive` is
//! exactly the number of that worker's flows to the backend, which is how
//! the control plane knows that a removed backend's id has no flow left
//! ([`ConnCounts::flows`]). When a version grows the arrays, each worker
//! copies its own row over ([`ConnCounts::adopt_row`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::line::Line64;

/// Active (high half) and inactive (low half) counts of one backend on
/// one worker, each an `i32`.
#[derive(Debug, Default)]
struct Cell(AtomicU64);

impl Cell {
    fn get(&self) -> (i32, i32) {
        let v = self.0.load(Relaxed);
        ((v >> 32) as u32 as i32, v as u32 as i32)
    }

    fn set(&self, active: i32, inactive: i32) {
        let v = (u64::from(active as u32) << 32) | u64::from(inactive as u32);
        self.0.store(v, Relaxed);
    }
}

const CHUNK: usize = 8;

/// The counts of every backend of a service, on every worker: a handle
/// (cloning it shares the cells) whose geometry is inline, so that the
/// address of a cell needs no read of a shared header first (one
/// dependent miss less per new flow when the handle sits in a line the
/// flow already has).
#[derive(Debug, Clone)]
pub struct ConnCounts {
    /// `[worker][chunk]`: `chunks` cache-line chunks per worker.
    cells: Arc<[Line64<[Cell; CHUNK]>]>,
    chunks: u32,
    workers: u32,
    backends: u32,
}

impl ConnCounts {
    /// Counts for backend ids `0..backends` on `workers` workers.
    pub fn new(workers: usize, backends: usize) -> ConnCounts {
        let (chunks, workers) = (backends.div_ceil(CHUNK), workers.max(1));
        let cells = (0..workers * chunks).map(|_| Line64::default()).collect();
        ConnCounts {
            cells,
            chunks: chunks as u32,
            workers: workers as u32,
            backends: backends as u32,
        }
    }

    /// Whether `other` shares these cells (the same array).
    pub fn same(&self, other: &ConnCounts) -> bool {
        Arc::ptr_eq(&self.cells, &other.cells)
    }

    /// Backend ids covered.
    pub fn backends(&self) -> usize {
        self.backends as usize
    }

    /// Workers covered.
    pub fn workers(&self) -> usize {
        self.workers as usize
    }

    fn cell(&self, worker: usize, id: u32) -> Option<&Cell> {
        if id >= self.backends {
            return None;
        }
        let id = id as usize;
        self.cells
            .get(worker * self.chunks as usize + id / CHUNK)
            .map(|c| &c[id % CHUNK])
    }

    /// The address of `worker`'s cell of backend `id`, for prefetching
    /// only: computed without the range checks a read needs (a prefetch
    /// of any address is harmless), so for an unknown worker or id it
    /// points outside the cells.
    #[inline]
    pub fn cell_addr(&self, worker: usize, id: u32) -> *const u8 {
        let id = id as usize;
        let chunk = worker * self.chunks as usize + id / CHUNK;
        self.cells
            .as_ptr()
            .wrapping_add(chunk)
            .cast::<Cell>()
            .wrapping_add(id % CHUNK)
            .cast()
    }

    /// Active (ESTABLISHED) connections of backend `id`, all workers.
    pub fn active(&self, id: u32) -> u32 {
        self.sum(id, |(a, _)| a)
    }

    /// Inactive connections of backend `id`, all workers.
    pub fn inactive(&self, id: u32) -> u32 {
        self.sum(id, |(_, i)| i)
    }

    /// Flows (active and inactive) to backend `id`, all workers. Each
    /// row is read whole, so a flow changing state is never missed.
    pub fn flows(&self, id: u32) -> u32 {
        self.sum(id, |(a, i)| a + i)
    }

    fn sum(&self, id: u32, field: impl Fn((i64, i64)) -> i64) -> u32 {
        let total: i64 = (0..self.workers())
            .filter_map(|w| self.cell(w, id))
            .map(|c| {
                let (a, i) = c.get();
                field((i64::from(a), i64::from(i)))
            })
            .sum();
        total.max(0) as u32
    }

    /// Applies a change seen by `worker` (the only writer of its row).
    /// Unknown workers or ids are ignored.
    pub fn add(&self, worker: usize, id: u32, d_active: i32, d_inactive: i32) {
        if let Some(c) = self.cell(worker, id) {
            let (a, i) = c.get();
            c.set(a.wrapping_add(d_active), i.wrapping_add(d_inactive));
        }
    }

    /// Copies `worker`'s row of `from` (an earlier version's counts) into
    /// these counts when they are another array: the worker's thread
    /// only, when it applies the version holding them.
    pub fn adopt_row(&self, from: &ConnCounts, worker: usize) {
        if self.same(from) {
            return;
        }
        for id in 0..self.backends.min(from.backends) {
            if let (Some(to), Some(c)) = (self.cell(worker, id), from.cell(worker, id)) {
                let (a, i) = c.get();
                to.set(a, i);
            }
        }
    }
}

/// Feeds one worker's conntrack transitions into the counts of one
/// service (the data plane keeps one per service and routes by service id).
#[derive(Debug, Clone, Copy)]
pub struct CountsObserver<'a> {
    /// The worker whose row is written.
    pub worker: usize,
    /// The service's counts.
    pub counts: &'a ConnCounts,
}

impl xvs_conntrack::Observer for CountsObserver<'_> {
    fn conn_counts(&mut self, _service: u32, backend_id: u32, d_active: i32, d_inactive: i32) {
        self.counts
            .add(self.worker, backend_id, d_active, d_inactive);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_rows_of_every_worker() {
        let c = ConnCounts::new(3, 4);
        c.add(0, 2, 1, 0);
        c.add(1, 2, 1, 3);
        c.add(2, 2, 0, 1);
        c.add(2, 2, 0, -1);
        assert_eq!((c.active(2), c.inactive(2)), (2, 3));
        assert_eq!((c.active(0), c.inactive(0)), (0, 0));
        c.add(9, 0, 1, 1);
        c.add(0, 99, 1, 1);
        assert_eq!(c.backends(), 4);
    }

    #[test]
    fn a_grown_array_adopts_rows_and_flows_counts_both() {
        let old = ConnCounts::new(2, 2);
        old.add(0, 1, 2, 3);
        old.add(1, 1, -1, 5);
        assert_eq!(old.flows(1), 9);
        let new = ConnCounts::new(2, 16);
        new.adopt_row(&old, 0);
        new.adopt_row(&old, 1);
        assert_eq!((new.active(1), new.inactive(1), new.flows(1)), (1, 8, 9));
        new.add(0, 1, -2, 2);
        assert_eq!(new.flows(1), 9, "a move between the halves keeps the sum");
    }

    #[test]
    fn rows_do_not_share_cache_lines() {
        assert_eq!(ConnCounts::new(3, 0).workers(), 3, "no backend yet");
        let c = ConnCounts::new(2, 11);
        assert_eq!((c.workers(), c.chunks), (2, 2));
        for w in 0..2 {
            let chunks = c.chunks as usize;
            let row = &c.cells[w * chunks..(w + 1) * chunks];
            let start = row.as_ptr() as usize;
            let end = start + std::mem::size_of_val(row);
            assert_eq!(start % 64, 0);
            assert_eq!(end % 64, 0);
        }
        // Worker 1's first cell is on the line after worker 0's last one.
        let (last0, first1) = (c.cell(0, 10).unwrap(), c.cell(1, 0).unwrap());
        let line = |c: &Cell| c as *const Cell as usize / 64;
        assert_eq!(line(first1), line(last0) + 1);
        assert!(c.cell(2, 0).is_none() && c.cell(0, 11).is_none());
        // A prefetch address is the cell's, for every worker and id.
        for (w, id) in [(0, 0), (0, 7), (0, 8), (0, 10), (1, 0), (1, 9)] {
            let cell: *const Cell = c.cell(w, id).unwrap();
            assert_eq!(c.cell_addr(w, id), cell.cast(), "worker {w} id {id}");
        }
    }
}
