//! random and twos: weighted random choice, and the power of two choices
//! weighted by load.
//!
//! random draws a point in the total weight and takes the backend whose
//! share contains it (prefix sums, binary search: O(log n)). twos draws two
//! backends that way and keeps the one with the smaller wlc overhead per
//! weight (ties: the first drawn). The generator is a seeded `fastrand`
//! (wyrand): deterministic for tests, per-worker in the data plane.

use super::least::wlc_overhead;
use super::{ConnCounts, SchedBackend};
use xvs_config::Address;

/// random / twos state.
#[derive(Debug, Clone)]
pub struct WeightedRandom {
    twos: bool,
    /// Running sums of the weights (quiesced backends add nothing).
    prefix: Box<[u64]>,
    rng: fastrand::Rng,
}

impl WeightedRandom {
    pub(crate) fn new<A: Address>(twos: bool, backends: &[SchedBackend<A>], seed: u64) -> Self {
        let mut sum = 0u64;
        let prefix = backends
            .iter()
            .map(|b| {
                sum += u64::from(b.weight);
                sum
            })
            .collect();
        WeightedRandom {
            twos,
            prefix,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.prefix.len() * std::mem::size_of::<u64>()
    }

    fn draw(&mut self) -> Option<usize> {
        let total = *self.prefix.last()?;
        if total == 0 {
            return None;
        }
        let r = self.rng.u64(0..total);
        Some(self.prefix.partition_point(|&s| s <= r))
    }

    pub(crate) fn pick<A: Address>(
        &mut self,
        backends: &[SchedBackend<A>],
        counts: &ConnCounts,
    ) -> Option<usize> {
        let a = self.draw()?;
        if !self.twos {
            return Some(a);
        }
        let b = self.draw()?;
        let (ba, bb) = (&backends[a], &backends[b]);
        // b wins only if strictly less loaded per weight.
        let better = wlc_overhead(bb, counts) * u64::from(ba.weight)
            < wlc_overhead(ba, counts) * u64::from(bb.weight);
        Some(if better { b } else { a })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sched::test_backends as backends;

    #[test]
    fn random_follows_weights_and_skips_quiesced() {
        let b = backends(&[1, 0, 3]);
        let counts = ConnCounts::new(1, 3);
        let mut s = WeightedRandom::new(false, &b, 42);
        let mut n = [0u32; 3];
        for _ in 0..40_000 {
            n[s.pick(&b, &counts).unwrap()] += 1;
        }
        assert_eq!(n[1], 0);
        let ratio = f64::from(n[2]) / f64::from(n[0]);
        assert!((2.8..3.2).contains(&ratio), "{n:?}");
        assert_eq!(
            WeightedRandom::new(false, &backends(&[0, 0]), 1).pick(&b, &counts),
            None
        );
    }

    #[test]
    fn twos_prefers_the_less_loaded_of_two() {
        let b = backends(&[1, 1]);
        let counts = ConnCounts::new(1, 2);
        counts.add(0, 0, 100, 0);
        let mut s = WeightedRandom::new(true, &b, 7);
        let mut n = [0u32; 2];
        for _ in 0..10_000 {
            n[s.pick(&b, &counts).unwrap()] += 1;
        }
        // Backend 0 wins only when both draws are 0: about a quarter.
        let share = f64::from(n[0]) / 10_000.0;
        assert!((0.22..0.28).contains(&share), "{n:?}");
    }
}
