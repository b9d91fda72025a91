//! What the index took since a batch was looked up: a one-hash filter
//! (4,096 bits) over the hashes inserted since the last mark
//! ([`FlowTable::lookup_batch`] marks).
//!
//! A key a batch's lookup missed is still missing when its frame is
//! processed unless a frame before it in the batch inserted that key (the
//! same new flow twice in one batch, as a UDP burst brings it), so the
//! frame need not probe the index again: [`FlowTable::absent_since`].
//! Removals never make a missing key present, so only inserts are noted.
//!
//! Invariant: every hash inserted since the current mark has its bit set
//! (a bit set by another hash is a false "maybe": one probe more, never a
//! wrong answer); a mark taken when nothing was inserted since the last
//! one keeps its number (the bits are all clear), so the lookups of a
//! batch's chunks share one mark.
//!
//! Written by hand: a fixed-size bitset with a generation number is a few
//! lines, and the crates' Bloom filters hash again and allocate.
//!
//! [`FlowTable::lookup_batch`]: crate::FlowTable::lookup_batch
//! [`FlowTable::absent_since`]: crate::FlowTable::absent_since

/// 64-bit words of the filter: 4,096 bits, one line of them per 512.
/// A batch of 64 new flows inserts 128 hashes: about 3% of the keys
/// looked up before them are then probed again for nothing.
const WORDS: usize = 64;

/// The hashes inserted since the last mark.
#[derive(Debug, Clone)]
pub(crate) struct Fresh {
    /// Boxed: the table's own fields, which every packet reads, stay
    /// on as few lines as they were.
    bits: Box<[u64; WORDS]>,
    /// The current mark's number.
    mark: u32,
    /// Whether any hash was noted since the mark.
    any: bool,
}

impl Default for Fresh {
    fn default() -> Fresh {
        Fresh {
            bits: Box::new([0; WORDS]),
            mark: 0,
            any: false,
        }
    }
}

/// A hash's word and bit (its top 12 bits; the index places a key by its
/// top bits too, which only makes keys of one bucket share a bit).
#[inline(always)]
fn bit(hash: u64) -> (usize, u64) {
    let b = (hash >> 52) as usize;
    (b >> 6, 1 << (b & 63))
}

impl Fresh {
    /// Notes an inserted hash.
    #[inline(always)]
    pub(crate) fn note(&mut self, hash: u64) {
        let (w, m) = bit(hash);
        self.bits[w] |= m;
        self.any = true;
    }

    /// Starts a new mark (unless nothing was inserted since the last) and
    /// returns its number.
    #[inline]
    pub(crate) fn mark(&mut self) -> u32 {
        if self.any {
            *self.bits = [0; WORDS];
            self.any = false;
            self.mark = self.mark.wrapping_add(1);
        }
        self.mark
    }

    /// Whether no key with `hash` was inserted since mark `mark` (`false`
    /// also when another mark was taken since, or another hash shares the
    /// bit).
    #[inline(always)]
    pub(crate) fn absent_since(&self, mark: u32, hash: u64) -> bool {
        let (w, m) = bit(hash);
        mark == self.mark && self.bits[w] & m == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noted_hash_is_never_absent_until_the_next_mark() {
        let mut f = Fresh::default();
        let m = f.mark();
        let hashes: Vec<u64> = (0..128u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        assert!(hashes.iter().all(|&h| f.absent_since(m, h)));
        for &h in &hashes {
            f.note(h);
        }
        assert!(hashes.iter().all(|&h| !f.absent_since(m, h)));
        // A new mark forgets them, and the old mark is stale.
        let m2 = f.mark();
        assert_ne!(m, m2);
        assert!(hashes.iter().all(|&h| f.absent_since(m2, h)));
        assert!(hashes.iter().all(|&h| !f.absent_since(m, h)));
        // With nothing inserted, a mark keeps its number.
        assert_eq!(f.mark(), m2);
    }

    #[test]
    fn few_other_hashes_look_inserted_after_a_batch_of_new_flows() {
        let mut f = Fresh::default();
        let m = f.mark();
        let mix = |i: u64| {
            (i ^ 0x5555)
                .wrapping_mul(0xff51_afd7_ed55_8ccd)
                .rotate_left(17)
        };
        for i in 0..128 {
            f.note(mix(i));
        }
        let maybe = (1_000..11_000)
            .filter(|&i| !f.absent_since(m, mix(i)))
            .count();
        // 128 of 4,096 bits: about 3% of other hashes.
        assert!(maybe < 500, "{maybe} of 10,000 other hashes look inserted");
    }
}
