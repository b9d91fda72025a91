//! The flow index: key hash → slot value (an entry number with the
//! direction bit), in buckets of one cache line each, as DPDK's
//! `rte_hash` and folly's F14 lay them out: twelve values and their
//! 8-bit tags (a byte of the hash) side by side, so a probe costs one
//! line, and a batch can prefetch that line from the hash alone
//! ([`Index::prefetch`]) before it probes.
//!
//! A value lives in its home bucket (from the hash's high bits) or, when
//! that one is full, in the first bucket after it with room (linear, with
//! wrap-around). Each bucket counts the values homed at or before it that
//! are stored beyond it (`overflow`, F14's outbound overflow count): a
//! lookup goes on to the next bucket only while that count is not zero,
//! so it usually reads one line. Removal clears the slot and lowers the
//! counts on the way from home, so nothing is ever tombstoned or rehashed.
//!
//! Sized so `keys` values fill at most three quarters of the slots
//! (about 7 bytes per key); an insert beyond `keys` still succeeds while
//! any slot is free (the flow table never inserts more than two keys per
//! entry).
//!
//! Hand-written because hashbrown (the table this replaces) keeps its
//! control bytes and values in two arrays, so a probe is two misses, and
//! has no way to ask where a hash's group lies, so a batch cannot
//! prefetch it.
//!
//! Invariants: `tags[i] == FREE_TAG` exactly when slot `i` is free (its
//! value is then meaningless); a value is found from its home bucket by
//! walking buckets whose `overflow` is non-zero; `len` is the number of
//! values.

use allocator_api2::vec::Vec as AVec;

use crate::huge::HugePages;

/// Values per bucket.
const SLOTS: usize = 12;
/// The tag of a free slot (a hash's tag is never 0).
const FREE_TAG: u8 = 0;

/// One cache line: twelve tags and the overflow count (the first 16
/// bytes, compared in one SSE2 instruction), then the twelve values.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    tags: [u8; SLOTS],
    /// Values homed at or before this bucket stored after it.
    overflow: u32,
    vals: [u32; SLOTS],
}

const FREE: Bucket = Bucket {
    tags: [FREE_TAG; SLOTS],
    overflow: 0,
    vals: [0; SLOTS],
};

impl Bucket {
    /// Bit `i` set for each slot whose tag is `t`.
    #[inline(always)]
    fn matching(&self, t: u8) -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{
                __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
            };
            // SAFETY: SSE2 is part of the x86_64 baseline; the load reads
            // the bucket's first 16 bytes (the tags and the overflow
            // count), inside the bucket and with no alignment needed.
            let m = unsafe {
                let group = _mm_loadu_si128((self as *const Bucket).cast::<__m128i>());
                _mm_movemask_epi8(_mm_cmpeq_epi8(group, _mm_set1_epi8(t as i8)))
            };
            m as u32 & ((1 << SLOTS) - 1)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mut m = 0;
            for (i, &x) in self.tags.iter().enumerate() {
                m |= u32::from(x == t) << i;
            }
            m
        }
    }
}

/// The index (see the module docs).
pub(crate) struct Index {
    buckets: AVec<Bucket, HugePages>,
    len: usize,
}

/// The tag of a hash: its low byte, never [`FREE_TAG`] (the bucket comes
/// from the high bits).
#[inline(always)]
fn tag(hash: u64) -> u8 {
    (hash as u8).max(1)
}

/// Bucket count for `keys` values: three quarters of the slots at most.
fn buckets_for(keys: usize) -> usize {
    (keys * 4).div_ceil(3 * SLOTS).max(1)
}

impl Index {
    /// An index for `keys` values.
    pub(crate) fn with_capacity(keys: usize) -> Index {
        let n = buckets_for(keys);
        let mut buckets = AVec::with_capacity_in(n, HugePages);
        buckets.resize(n, FREE);
        Index { buckets, len: 0 }
    }

    /// The home bucket of `hash` (Lemire's multiply-shift over the high
    /// bits: any bucket count, no division).
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.buckets.len() as u128) >> 64) as usize
    }

    #[inline(always)]
    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets.len() {
            0
        } else {
            b + 1
        }
    }

    /// Starts fetching the home bucket of `hash` (never dereferenced here).
    #[inline(always)]
    pub(crate) fn prefetch(&self, hash: u64) {
        let b = self.buckets.as_ptr().wrapping_add(self.home(hash));
        crate::batch::prefetch(b.cast());
    }

    /// The first value with `hash`'s tag for which `eq` holds.
    #[inline(always)]
    pub(crate) fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let t = tag(hash);
        let mut b = self.home(hash);
        for _ in 0..self.buckets.len() {
            let bucket = &self.buckets[b];
            let mut m = bucket.matching(t);
            while m != 0 {
                let v = bucket.vals[m.trailing_zeros() as usize];
                if eq(v) {
                    return Some(v);
                }
                m &= m - 1;
            }
            if bucket.overflow == 0 {
                return None;
            }
            b = self.next(b);
        }
        None
    }

    /// The first value in `hash`'s home bucket with its tag, if any: a
    /// candidate a batch can fetch before it checks it (without reading
    /// what the value names, as [`Index::find`] must).
    #[inline(always)]
    pub(crate) fn first(&self, hash: u64) -> Option<u32> {
        let bucket = &self.buckets[self.home(hash)];
        let m = bucket.matching(tag(hash));
        (m != 0).then(|| bucket.vals[m.trailing_zeros() as usize])
    }

    /// Adds `value` under `hash` (the caller makes sure it is not there
    /// yet). False only when every slot is taken.
    pub(crate) fn insert(&mut self, hash: u64, value: u32) -> bool {
        if self.len == self.buckets.len() * SLOTS {
            return false;
        }
        let t = tag(hash);
        let mut b = self.home(hash);
        loop {
            let bucket = &mut self.buckets[b];
            let free = bucket.matching(FREE_TAG);
            if free != 0 {
                let i = free.trailing_zeros() as usize;
                bucket.vals[i] = value;
                bucket.tags[i] = t;
                self.len += 1;
                return true;
            }
            bucket.overflow += 1;
            b = self.next(b);
        }
    }

    /// Removes `value`, filed under `hash`; false when it is not there.
    pub(crate) fn remove(&mut self, hash: u64, value: u32) -> bool {
        let (t, home) = (tag(hash), self.home(hash));
        let mut b = home;
        for _ in 0..self.buckets.len() {
            let bucket = &mut self.buckets[b];
            let mut m = bucket.matching(t);
            while m != 0 {
                let i = m.trailing_zeros() as usize;
                if bucket.vals[i] == value {
                    bucket.tags[i] = FREE_TAG;
                    self.len -= 1;
                    // Lower the counts of the buckets it had passed.
                    let mut p = home;
                    while p != b {
                        self.buckets[p].overflow -= 1;
                        p = self.next(p);
                    }
                    return true;
                }
                m &= m - 1;
            }
            if bucket.overflow == 0 {
                return false;
            }
            b = self.next(b);
        }
        false
    }

    /// Values held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every value, in bucket order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.buckets.iter().flat_map(|b| {
            b.tags
                .iter()
                .zip(b.vals)
                .filter(|&(&t, _)| t != FREE_TAG)
                .map(|(_, v)| v)
        })
    }

    /// Empties it (no allocation changes).
    pub(crate) fn clear(&mut self) {
        self.buckets.fill(FREE);
        self.len = 0;
    }

    /// Bytes allocated.
    pub(crate) fn allocation_size(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<Bucket>()
    }

    /// Bytes the index of `keys` values allocates (for sizing ahead).
    pub(crate) fn bytes_for(keys: usize) -> u64 {
        (buckets_for(keys) * std::mem::size_of::<Bucket>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_bucket_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }

    /// Hashes that all land in one home bucket (high bits equal), so
    /// values overflow into the next buckets and wrap around the end.
    #[test]
    fn overflow_chains_find_insert_and_remove_like_a_map() {
        let mut ix = Index::with_capacity(30); // 4 buckets
        assert_eq!(ix.buckets.len(), 4);
        let last = u64::MAX - 1000; // home: the last bucket
        let mut model = HashMap::new();
        for v in 0..40u32 {
            let h = last + u64::from(v);
            assert!(ix.insert(h, v));
            model.insert(v, h);
        }
        assert_eq!(ix.len(), 40);
        for (&v, &h) in &model {
            assert_eq!(ix.find(h, |x| x == v), Some(v), "value {v}");
        }
        // Remove every other one; the rest stay findable, and the counts
        // go back to zero once all are gone.
        for v in (0..40u32).step_by(2) {
            assert!(ix.remove(model[&v], v));
            assert!(!ix.remove(model[&v], v), "removed twice");
            assert_eq!(ix.find(model[&v], |x| x == v), None);
        }
        for v in (1..40u32).step_by(2) {
            assert_eq!(ix.find(model[&v], |x| x == v), Some(v));
        }
        for v in (1..40u32).step_by(2) {
            assert!(ix.remove(model[&v], v));
        }
        assert_eq!(ix.len(), 0);
        assert!(ix.buckets.iter().all(|b| b.overflow == 0));
    }

    #[test]
    fn a_full_index_refuses_and_tags_do_not_confuse_values() {
        let mut ix = Index::with_capacity(9); // 1 bucket, 12 slots
        for v in 0..12 {
            assert!(ix.insert(0x42, v), "slot {v}");
        }
        assert!(!ix.insert(0x42, 12), "no slot left");
        // Same tag, same bucket: eq tells them apart.
        assert_eq!(ix.find(0x42, |x| x == 7), Some(7));
        assert_eq!(ix.find(0x43, |x| x == 7), None, "another tag");
        assert_eq!(ix.iter().count(), 12);
        ix.clear();
        assert_eq!((ix.len(), ix.iter().count()), (0, 0));
        // A hash whose tag byte is the free tag's, and any value.
        assert!(ix.insert(0x100, u32::MAX));
        assert_eq!(ix.find(0x100, |x| x == u32::MAX), Some(u32::MAX));
        assert_eq!(ix.iter().collect::<Vec<_>>(), [u32::MAX]);
        assert!(ix.remove(0x100, u32::MAX));
        ix.clear();
        assert_eq!((ix.len(), ix.iter().count()), (0, 0));
    }
}
