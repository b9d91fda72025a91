//! Batched lookup, as DPDK's `rte_hash_lookup_bulk` does it, in stages
//! a batch at a time: every key is hashed and its index bucket (one
//! line) prefetched; then the buckets are probed without touching entries
//! (each probe only collects the slot its tag matched); then the
//! candidate entries are prefetched; then verified. A batch's index and
//! slab misses overlap instead of queuing behind one another.
//!
//! Results equal [`FlowTable::lookup`]'s key by key, counters included;
//! a probe that matched more than one tag (rare: 7-bit tags over a few
//! buckets) falls back to the exact lookup.

use crate::key::FlowKey;
use xvs_config::Address;

use crate::slab::{Entry, NIL};
use crate::state::Direction;
use crate::table::{dir_of, slot_of, FlowId, FlowTable};

/// Keys per internal pass; longer slices are processed in chunks.
pub const BATCH: usize = 64;

/// Live entries up to which a table's working set is taken to stay in
/// cache between batches: what an established packet touches (its index
/// bucket, its entry's two lines, its service's handle line and its
/// backend's counter line: five lines), 2,048 flows over, is 640 KiB at
/// most, within a core's L2. Below it the staged prefetches of a hit only
/// cost instructions (measured: 72 of 1,044 per cache-resident
/// established packet), so [`FlowTable::lookup_batch`] skips them, and
/// the dataplane skips the stages themselves, looking each key up as it
/// reads it ([`FlowTable::lookup_mark`], [`FlowTable::lookup_hashed`]:
/// 47 of 576 instructions per established packet); a miss's service
/// stages are kept (a new flow's service and SNAT state are not bounded
/// by the flow count).
pub const CACHE_RESIDENT_FLOWS: u32 = 2048;

impl<A: Address> FlowTable<A> {
    /// Looks up every key of `keys` into the same position of `out`, its
    /// hash ([`FlowTable::key_hash`]) into the same position of `hashes`
    /// (both at least `keys.len()` long; extra positions are left alone).
    /// Returns the mark the lookups were made at: a key missed here is
    /// still missing while [`FlowTable::absent_since`] says so, without
    /// a second probe.
    pub fn lookup_batch(
        &mut self,
        keys: &[FlowKey<A>],
        out: &mut [Option<(FlowId, Direction)>],
        hashes: &mut [u64],
    ) -> u32 {
        self.lookup_batch_with(keys, out, hashes, |_| {})
    }

    /// [`FlowTable::lookup_batch`], calling `on_hit` with the service of
    /// each hit's entry as the hit is found (its entry then in cache): a
    /// caller's next stage, started while the rest of the batch is
    /// compared.
    #[inline]
    pub fn lookup_batch_with(
        &mut self,
        keys: &[FlowKey<A>],
        out: &mut [Option<(FlowId, Direction)>],
        hashes: &mut [u64],
        mut on_hit: impl FnMut(u32),
    ) -> u32 {
        let mark = self.fresh.mark();
        let chunks = keys.chunks(BATCH).zip(out.chunks_mut(BATCH));
        for ((keys, out), hashes) in chunks.zip(hashes.chunks_mut(BATCH)) {
            self.lookup_chunk(keys, out, hashes, &mut on_hit);
        }
        mark
    }

    /// Takes the mark for lookups made one at a time
    /// ([`FlowTable::lookup_hashed`]) as a batch: what
    /// [`FlowTable::lookup_batch`] returns, for a caller that looks a
    /// cache-resident table's keys up as it reads them.
    #[inline]
    pub fn lookup_mark(&mut self) -> u32 {
        self.fresh.mark()
    }

    /// Whether a key with `hash` that a lookup at `mark` missed
    /// ([`FlowTable::lookup_batch`]) is certainly still missing: nothing
    /// that could be it was inserted since. `false` means "look again".
    #[inline(always)]
    pub fn absent_since(&self, mark: u32, hash: u64) -> bool {
        self.fresh.absent_since(mark, hash)
    }

    /// Whether the table is small enough for its working set to stay in
    /// cache ([`CACHE_RESIDENT_FLOWS`]): then a batch's lookups need no
    /// prefetches.
    #[inline]
    pub fn is_cache_resident(&self) -> bool {
        self.len() <= CACHE_RESIDENT_FLOWS
    }

    fn lookup_chunk(
        &mut self,
        keys: &[FlowKey<A>],
        out: &mut [Option<(FlowId, Direction)>],
        hashes: &mut [u64],
        on_hit: &mut impl FnMut(u32),
    ) {
        let n = keys.len().min(out.len()).min(hashes.len());
        let (keys, out, hashes) = (&keys[..n], &mut out[..n], &mut hashes[..n]);
        let fetch = !self.is_cache_resident();
        // Stage 1: every hash (into the caller's array, which returns
        // them), its bucket line prefetched, so the probes below find
        // their lines arriving instead of each waiting alone.
        for (h, key) in hashes.iter_mut().zip(keys) {
            *h = self.hash(key);
            if fetch {
                self.index.prefetch(*h);
            }
        }
        // Stage 2: each key's first candidate, its entry fetched as soon
        // as it is known; a key whose probe matched more than one tag
        // (rare) gets its bit in `more` (a chunk is at most 64 keys).
        let mut cand = [NIL; BATCH];
        let mut more = 0u64;
        for (i, (c, &hash)) in cand.iter_mut().zip(hashes.iter()).enumerate() {
            let (mut first, mut many) = (NIL, false);
            // Collect tag matches without reading the slab: `false` keeps
            // the probe going to the end of its sequence.
            self.index.find(hash, |v| {
                if first == NIL {
                    first = v;
                } else {
                    many = true;
                }
                false
            });
            *c = first;
            more |= u64::from(many) << i;
            if fetch {
                if let Some(e) = self.slab.entries.get(slot_of(first) as usize) {
                    // Every line of the entry, not only the key's: a hit's
                    // packet next writes its counters and clock (one line
                    // for IPv4, two for IPv6).
                    prefetch_lines(e as *const Entry<A>);
                }
            }
        }
        // Stage 3: each candidate compared (its entry arrived), and each
        // hit handed to `on_hit` (the caller's next fetch starts while
        // the rest are compared).
        let looked = keys.iter().zip(&cand).zip(out.iter_mut()).enumerate();
        for (i, ((key, &v), slot)) in looked {
            *slot = if v == NIL {
                self.stats.miss += 1;
                None
            } else if more & (1 << i) != 0 {
                let found = self.lookup(key);
                if let Some((id, _)) = found {
                    on_hit(self.flow(id).service());
                }
                found
            } else {
                let e = &self.slab.entries[slot_of(v) as usize];
                if !e.is_template() && e.key(dir_of(v)) == *key {
                    self.stats.found += 1;
                    on_hit(e.service);
                    Some((FlowId(slot_of(v)), dir_of(v)))
                } else {
                    self.stats.miss += 1;
                    None
                }
            };
        }
    }
}

/// Hints the CPU to bring in every cache line of the `T` at `p` (which
/// need not be valid: nothing is read).
#[inline(always)]
pub fn prefetch_lines<T>(p: *const T) {
    if align_of::<T>().is_multiple_of(64) {
        // Line-aligned: its lines start every 64 bytes from `p`.
        for at in (0..size_of::<T>()).step_by(64) {
            prefetch(p.cast::<u8>().wrapping_add(at));
        }
    } else {
        prefetch_bytes(p.cast::<u8>(), size_of::<T>());
    }
}

/// Hints the CPU to bring in every cache line of the `len` bytes at
/// `start` (any address: never faults, reads nothing observable).
#[inline(always)]
pub fn prefetch_bytes(start: *const u8, len: usize) {
    let mut at = 0;
    while at < len {
        prefetch(start.wrapping_add(at));
        at += 64;
    }
    // The last line, when `start` is not line-aligned.
    if len > 0 {
        prefetch(start.wrapping_add(len - 1));
    }
}

#[inline(always)]
/// Hints the CPU to bring the cache line at `p` in (any address: never
/// faults, reads nothing observable; a no-op off x86_64).
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is part of the x86_64 baseline, so the instruction
        // exists; a prefetch is a hint that never faults and reads nothing
        // observable, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
