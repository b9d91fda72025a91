//! Global per-backend connection counts, as IPVS's `activeconns` and
//! `inactconns`, for the schedulers that weigh load (lc, wlc, sed, nq,
//! twos).
//!
//! Each worker writes only its own row (one cache-line-padded allocation
//! per worker, so rows never share a line) with plain Relaxed load/store:
//! a single writer needs no read-modify-write. Readers sum the rows on
//! read. A sum read while workers update may be a few connections stale,
//! exactly as an IPVS read of atomics on another CPU is; no count is ever
//! lost.

use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

/// Active/inactive counts of one backend on one worker.
#[derive(Debug, Default)]
struct Cell {
    active: AtomicI32,
    inactive: AtomicI32,
}

const CHUNK: usize = 8;

/// One worker's cells, in cache-line-aligned chunks.
type Row = Box<[CachePadded<[Cell; CHUNK]>]>;

/// The counts of every backend of a service, on every worker.
#[derive(Debug)]
pub struct ConnCounts {
    rows: Box<[Row]>,
    backends: usize,
}

impl ConnCounts {
    /// Counts for backend ids `0..backends` on `workers` workers.
    pub fn new(workers: usize, backends: usize) -> Arc<ConnCounts> {
        let chunks = backends.div_ceil(CHUNK);
        let rows = (0..workers.max(1))
            .map(|_| {
                (0..chunks)
                    .map(|_| CachePadded::new(Default::default()))
                    .collect()
            })
            .collect();
        Arc::new(ConnCounts { rows, backends })
    }

    /// Backend ids covered.
    pub fn backends(&self) -> usize {
        self.backends
    }

    fn cell(&self, worker: usize, id: u32) -> Option<&Cell> {
        let id = id as usize;
        if id >= self.backends {
            return None;
        }
        self.rows
            .get(worker)?
            .get(id / CHUNK)
            .map(|c| &c[id % CHUNK])
    }

    /// Active (ESTABLISHED) connections of backend `id`, all workers.
    pub fn active(&self, id: u32) -> u32 {
        self.sum(id, |c| &c.active)
    }

    /// Inactive connections of backend `id`, all workers.
    pub fn inactive(&self, id: u32) -> u32 {
        self.sum(id, |c| &c.inactive)
    }

    fn sum(&self, id: u32, field: impl Fn(&Cell) -> &AtomicI32) -> u32 {
        let total: i64 = (0..self.rows.len())
            .filter_map(|w| self.cell(w, id))
            .map(|c| i64::from(field(c).load(Relaxed)))
            .sum();
        total.max(0) as u32
    }

    /// Applies a change seen by `worker` (the only writer of its row).
    /// Unknown workers or ids are ignored.
    pub fn add(&self, worker: usize, id: u32, d_active: i32, d_inactive: i32) {
        if let Some(c) = self.cell(worker, id) {
            c.active.store(c.active.load(Relaxed) + d_active, Relaxed);
            c.inactive
                .store(c.inactive.load(Relaxed) + d_inactive, Relaxed);
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
    fn rows_do_not_share_cache_lines() {
        let c = ConnCounts::new(2, 3);
        for row in c.rows.iter() {
            let start = row.as_ptr() as usize;
            let end = start + std::mem::size_of_val(&**row);
            assert_eq!(start % 64, 0);
            assert_eq!(end % 64, 0);
        }
    }
}
