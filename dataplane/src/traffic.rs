//! Per-backend traffic counters of a service, as IPVS keeps them for
//! `ipvsadm -Ln --stats`: connections scheduled, packets and bytes in each
//! direction ("in" is client → backend, "out" backend → client).
//!
//! Each worker writes only its own row (one cache line per backend cell)
//! with Relaxed load/store: a single writer needs no read-modify-write, so
//! accounting a packet costs two plain stores. Readers sum the rows; a sum may be one packet stale, never
//! lose one. Unknown workers or backend ids are ignored (never a panic on
//! the packet path).
//!
//! The cell also holds what the worker's own service version says of the
//! backend ([`DestState`]: available, quiesced, removed), written by that
//! worker when it applies a version: the packet path reads it from the
//! line it updates anyway, to apply IPVS's rules for flows whose backend
//! was quiesced or removed.
//!
//! The cell also caches the backend's Ethernet address as this worker's
//! neighbour table last gave it, stamped with that table's generation
//! ([`Line::next_hop`]): a packet to the backend takes its next
//! hop from the line it updates anyway instead of probing the neighbour
//! table, and any change to the table (a new or changed address) makes
//! every stamp stale at once. Applying a service version clears the
//! worker's stamps, so an id given to another backend never keeps the
//! old one's address.
//!
//! Ids are stable for the life of a service (see [`crate::services`]); the
//! arrays cover every id in use and grow when a version needs more: each
//! worker then copies its own row into the new arrays when it applies
//! that version ([`TrafficStats::adopt_row`]), so no count is lost.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use crate::line::Line64;
use crate::sched::SchedBackend;

/// What a worker's service version says of a backend id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DestState {
    /// Not in the service (removed, or the service itself is gone).
    Removed = 0,
    /// In the service with weight 0: no new flows.
    Quiesced = 1,
    /// In the service with a weight.
    Available = 2,
}

/// One backend's counters on one worker.
#[derive(Debug, Default)]
struct Cell {
    conns: AtomicU64,
    pkts: [AtomicU64; 2],
    bytes: [AtomicU64; 2],
    state: AtomicU8,
    /// The backend's Ethernet address (low 48 bits), valid while
    /// `hop_stamp` is the worker's neighbour generation plus one (0:
    /// none; a generation counts changes in a u64, so it never reaches
    /// u64::MAX).
    hop_mac: AtomicU64,
    hop_stamp: AtomicU64,
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
    /// Whether every counter is zero.
    pub fn is_zero(&self) -> bool {
        *self == TrafficTotals::default()
    }

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
    cells: Arc<[Line64<Cell>]>,
    backends: u32,
}

impl TrafficStats {
    /// Counters for backend ids `0..backends` on `workers` workers, every
    /// id [`DestState::Removed`] until a worker sets its row's states.
    pub fn new(workers: usize, backends: usize) -> TrafficStats {
        let cells = (0..workers.max(1) * backends)
            .map(|_| Line64::default())
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

    /// Fetches every worker's line of backend `id` (for a pass over many
    /// services' counters, a few services ahead of the one read).
    pub fn prefetch_backend(&self, id: u32) {
        for w in 0..self.workers() {
            xvs_conntrack::prefetch(self.cell_addr(w, id));
        }
    }

    fn workers(&self) -> usize {
        self.cells.len() / (self.backends.max(1) as usize)
    }

    /// Whether `other` is the same shared array.
    pub fn same(&self, other: &TrafficStats) -> bool {
        Arc::ptr_eq(&self.cells, &other.cells)
    }

    /// Sets `worker`'s view of every id from its service version's
    /// `backends`: the ones listed are available (or quiesced at weight
    /// 0), every other id is removed. O(ids); the worker's thread only.
    /// Clears the row's cached next hops too.
    pub fn set_states<A: xvs_config::Address>(&self, worker: usize, backends: &[SchedBackend<A>]) {
        for id in 0..self.backends {
            if let Some(c) = self.cell(worker, id) {
                c.state.store(DestState::Removed as u8, Relaxed);
                c.hop_stamp.store(0, Relaxed);
            }
        }
        for b in backends {
            if let Some(c) = self.cell(worker, b.id) {
                let s = if b.weight > 0 {
                    DestState::Available
                } else {
                    DestState::Quiesced
                };
                c.state.store(s as u8, Relaxed);
            }
        }
    }

    /// `worker`'s view of backend `id` (removed when unknown).
    #[inline]
    pub fn state(&self, worker: usize, id: u32) -> DestState {
        self.line(worker, id)
            .map_or(DestState::Removed, |l| l.state())
    }

    /// Copies `worker`'s row of `from` (an earlier version's counters)
    /// into this array, when the two differ: the worker's thread only,
    /// when it applies the version that holds this array, so the copy is
    /// exact (it is the only writer of its row).
    pub fn adopt_row(&self, from: &TrafficStats, worker: usize) {
        if self.same(from) {
            return;
        }
        for id in 0..self.backends.min(from.backends) {
            if let (Some(to), Some(c)) = (self.cell(worker, id), from.cell(worker, id)) {
                to.conns.store(c.conns.load(Relaxed), Relaxed);
                for d in 0..2 {
                    to.pkts[d].store(c.pkts[d].load(Relaxed), Relaxed);
                    to.bytes[d].store(c.bytes[d].load(Relaxed), Relaxed);
                }
            }
        }
    }

    /// Backend `id`'s totals over every worker, then zeroes them (for an
    /// id given to another backend: no worker has a flow to it, so none
    /// writes its cells meanwhile).
    pub fn take(&self, id: u32) -> TrafficTotals {
        let t = self.backend(id);
        for w in 0..self.workers() {
            if let Some(c) = self.cell(w, id) {
                c.conns.store(0, Relaxed);
                for d in 0..2 {
                    c.pkts[d].store(0, Relaxed);
                    c.bytes[d].store(0, Relaxed);
                }
            }
        }
        t
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

    /// The address of a cell, for prefetching only: computed without the
    /// range checks a read needs (a prefetch of any address is harmless),
    /// so for an unknown worker or id it points outside the cells.
    #[inline]
    pub fn cell_addr(&self, worker: usize, id: u32) -> *const u8 {
        let at = worker * self.backends as usize + id as usize;
        self.cells.as_ptr().wrapping_add(at).cast()
    }

    /// A new connection to backend `id`, seen by `worker`.
    #[inline]
    pub fn conn(&self, worker: usize, id: u32) {
        if let Some(c) = self.cell(worker, id) {
            c.conns.store(c.conns.load(Relaxed) + 1, Relaxed);
        }
    }

    /// Backend `id`'s Ethernet address as `worker` cached it while its
    /// neighbour table was at `generation`; `None` once the table changed
    /// (or nothing was cached).
    #[inline]
    pub fn next_hop(&self, worker: usize, id: u32, generation: u64) -> Option<[u8; 6]> {
        self.line(worker, id)?.next_hop(generation)
    }

    /// Backend `id`'s line as `worker` sees it: what a packet of one of
    /// its flows reads and counts, found once for all of them.
    #[inline]
    pub fn line(&self, worker: usize, id: u32) -> Option<Line<'_>> {
        self.cell(worker, id).map(Line)
    }

    /// Backend `id`'s totals over every worker.
    pub fn backend(&self, id: u32) -> TrafficTotals {
        let mut t = TrafficTotals::default();
        for w in 0..self.workers() {
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

/// One backend's counter line on one worker ([`TrafficStats::line`]).
#[derive(Debug, Clone, Copy)]
pub struct Line<'a>(&'a Cell);

impl Line<'_> {
    /// What the worker's service version says of the backend.
    #[inline]
    pub fn state(self) -> DestState {
        match self.0.state.load(Relaxed) {
            2 => DestState::Available,
            1 => DestState::Quiesced,
            _ => DestState::Removed,
        }
    }

    /// The backend's Ethernet address as cached while the worker's
    /// neighbour table was at `generation`; `None` once the table
    /// changed (or nothing was cached).
    #[inline]
    pub fn next_hop(self, generation: u64) -> Option<[u8; 6]> {
        let c = self.0;
        if c.hop_stamp.load(Relaxed) != generation.wrapping_add(1) {
            return None;
        }
        let m = c.hop_mac.load(Relaxed).to_le_bytes();
        Some([m[0], m[1], m[2], m[3], m[4], m[5]])
    }

    /// Caches the backend's Ethernet address, as the worker's neighbour
    /// table gives it at `generation`.
    #[inline]
    pub fn set_next_hop(self, generation: u64, mac: [u8; 6]) {
        let mut m = [0u8; 8];
        m[..6].copy_from_slice(&mac);
        self.0.hop_mac.store(u64::from_le_bytes(m), Relaxed);
        self.0.hop_stamp.store(generation.wrapping_add(1), Relaxed);
    }

    /// A packet of `len` bytes in direction `dir` (0 in, 1 out; another
    /// value is ignored).
    #[inline]
    pub fn packet(self, dir: usize, len: u64) {
        let c = self.0;
        if let (Some(p), Some(b)) = (c.pkts.get(dir), c.bytes.get(dir)) {
            p.store(p.load(Relaxed) + 1, Relaxed);
            b.store(b.load(Relaxed) + len, Relaxed);
        }
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
        let line = |w, id| s.line(w, id).unwrap();
        line(0, 1).packet(0, 60);
        line(1, 1).packet(1, 1500);
        line(1, 1).packet(1, 40);
        assert!(s.line(5, 1).is_none(), "no such worker");
        assert!(s.line(0, 9).is_none(), "no such backend");
        line(0, 1).packet(2, 60); // no such direction: ignored
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
        assert_eq!(std::mem::size_of::<Line64<Cell>>(), 64, "one line a cell");
        // A prefetch address is the cell's, for every worker and id.
        for (w, id) in [(0, 0), (0, 2), (1, 0), (1, 2)] {
            let cell: *const Cell = s.cell(w, id).unwrap();
            assert_eq!(s.cell_addr(w, id), cell.cast(), "worker {w} id {id}");
        }
    }

    fn backend(id: u32, weight: u32) -> SchedBackend {
        SchedBackend {
            id,
            endpoint: xvs_conntrack::Endpoint {
                addr: std::net::Ipv4Addr::new(198, 18, 1, 10 + id as u8),
                port: 80,
            },
            weight,
            plan: Default::default(),
        }
    }

    #[test]
    fn a_cached_next_hop_lives_until_the_neighbours_or_the_version_change() {
        // Counters, state and next hop share the cell's one line.
        assert!(std::mem::size_of::<Cell>() <= 64);
        let s = TrafficStats::new(2, 3);
        let mac = [2, 0, 0, 0, 0, 7];
        let line = |w, id| s.line(w, id).unwrap();
        assert_eq!(line(0, 1).next_hop(0), None, "nothing cached");
        line(0, 1).set_next_hop(5, mac);
        assert_eq!(line(0, 1).next_hop(5), Some(mac));
        assert_eq!(line(1, 1).next_hop(5), None, "per worker");
        assert_eq!(line(0, 2).next_hop(5), None, "per backend");
        assert_eq!(line(0, 1).next_hop(6), None, "the table changed since");
        assert!(
            s.line(0, 9).is_none(),
            "no such backend: nothing to cache in"
        );
        // A version applied clears the worker's row (an id may now
        // stand for another backend).
        line(0, 1).set_next_hop(5, mac);
        line(1, 1).set_next_hop(5, mac);
        s.set_states(0, &[backend(1, 1)]);
        assert_eq!(line(0, 1).next_hop(5), None);
        assert_eq!(line(1, 1).next_hop(5), Some(mac), "other rows untouched");
    }

    #[test]
    fn states_are_per_worker_and_unlisted_ids_are_removed() {
        let s = TrafficStats::new(2, 4);
        assert_eq!(s.state(0, 0), DestState::Removed, "before any version");
        s.set_states(0, &[backend(0, 1), backend(2, 0)]);
        assert_eq!(s.state(0, 0), DestState::Available);
        assert_eq!(s.state(0, 1), DestState::Removed);
        assert_eq!(s.state(0, 2), DestState::Quiesced);
        assert_eq!(
            s.state(1, 0),
            DestState::Removed,
            "worker 1 has not applied"
        );
        assert_eq!(s.state(0, 99), DestState::Removed);
        s.set_states(0, &[backend(2, 1)]);
        assert_eq!(
            s.state(0, 0),
            DestState::Removed,
            "removed by a later version"
        );
        assert_eq!(s.state(0, 2), DestState::Available);
    }

    #[test]
    fn a_grown_array_adopts_each_row_and_take_zeroes() {
        let old = TrafficStats::new(2, 2);
        old.conn(0, 1);
        old.line(1, 1).unwrap().packet(0, 100);
        let new = TrafficStats::new(2, 8);
        new.adopt_row(&old, 0);
        assert_eq!(new.backend(1).conns, 1);
        assert_eq!(new.backend(1).pkts, [0, 0], "row 1 not adopted yet");
        new.adopt_row(&old, 1);
        assert_eq!(new.backend(1), old.backend(1));
        // Adopting itself changes nothing.
        new.adopt_row(&new.clone(), 0);
        assert_eq!(new.backend(1).conns, 1);
        assert_eq!(new.take(1).bytes, [100, 0]);
        assert!(new.backend(1).is_zero());
    }
}
