//! rr and wrr, as `ip_vs_rr.c` and `ip_vs_wrr.c`.
//!
//! rr continues after the backend it chose last, skipping quiesced ones.
//! wrr is the kernel's gcd-based interleaving: the current weight `cw`
//! starts at the largest weight and drops by the gcd of the weights at the
//! end of each pass over the list; a backend is chosen when its weight is
//! at least `cw`. Weights 4, 3, 2 give A A B A B C A B C.

use super::{gcd, SchedBackend};
use xvs_config::Address;

/// rr state: where the next search starts.
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    next: usize,
    /// Every backend of the list it was made for has a weight (the
    /// common case): [`RoundRobin::peek`] then counts instead of walking.
    dense: bool,
}

impl RoundRobin {
    /// The state for `backends`, the list its picks are made from.
    pub(crate) fn new<A: Address>(backends: &[SchedBackend<A>]) -> Self {
        RoundRobin {
            next: 0,
            dense: !backends.is_empty() && backends.iter().all(SchedBackend::available),
        }
    }

    /// The next backend with a weight, at most one pass over the list.
    pub(crate) fn pick<A: Address>(&mut self, backends: &[SchedBackend<A>]) -> Option<usize> {
        let i = self.nth_available(backends, 0, backends.len())?;
        self.next = i + 1;
        Some(i)
    }

    /// The `skip`-th backend with a weight (0: the first) from where the
    /// next search starts, looking at `looks` places at most. The walk
    /// wraps by comparison, not `%`: a division is tens of cycles on a
    /// new flow's critical path (`next` is at most `n` after a pick; only
    /// a list shorter than the last one divides).
    #[inline(always)]
    fn nth_available<A: Address>(
        &self,
        backends: &[SchedBackend<A>],
        skip: usize,
        looks: usize,
    ) -> Option<usize> {
        let n = backends.len();
        let mut i = match self.next {
            next if next < n => next,
            _ if n == 0 => return None,
            next => next % n,
        };
        let mut left = skip;
        for _ in 0..looks {
            if backends[i].available() {
                if left == 0 {
                    return Some(i);
                }
                left -= 1;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
        None
    }

    /// The backend the `offset`-th [`RoundRobin::pick`] from now would
    /// choose: counted `offset` places on from the next where every
    /// backend has a weight, or else by one walk over the list (stepping
    /// a copy of the state `offset` times cost 14 instructions a step on
    /// a new flow's path). The walk looks at most [`PEEK_LOOKS`] places
    /// past the `offset + 1` it needs: `None` beyond (a list mostly
    /// quiesced). A guess for prefetching: given another list than its
    /// own, a wrong one.
    pub(crate) fn peek<A: Address>(
        &self,
        backends: &[SchedBackend<A>],
        offset: usize,
    ) -> Option<usize> {
        let n = backends.len();
        if self.dense && n > 0 {
            // Subtracted, not `%` (see `pick`): `offset / n + 1` steps.
            let mut i = self.next.saturating_add(offset);
            while i >= n {
                i -= n;
            }
            return Some(i);
        }
        self.nth_available(backends, offset, offset + 1 + PEEK_LOOKS)
    }
}

/// How many quiesced backends [`RoundRobin::peek`] walks past at most.
const PEEK_LOOKS: usize = 32;

/// wrr state and the weights' max and gcd.
#[derive(Debug, Clone)]
pub struct WeightedRoundRobin {
    /// Index of the last choice (`None` before the first).
    last: Option<usize>,
    /// Current weight.
    cw: i64,
    max: i64,
    gcd: i64,
    /// `max / gcd + 1`: the passes over the list one pick takes at most
    /// (a full descent of `cw`), divided out once.
    passes: usize,
}

impl WeightedRoundRobin {
    pub(crate) fn new<A: Address>(backends: &[SchedBackend<A>]) -> Self {
        let max = backends.iter().map(|b| b.weight).max().unwrap_or(0);
        let g = backends
            .iter()
            .filter(|b| b.weight > 0)
            .fold(0, |g, b| gcd(g, b.weight));
        let (max, gcd) = (i64::from(max), i64::from(g.max(1)));
        WeightedRoundRobin {
            last: None,
            cw: 0,
            max,
            gcd,
            passes: (max / gcd + 1) as usize,
        }
    }

    pub(crate) fn pick<A: Address>(&mut self, backends: &[SchedBackend<A>]) -> Option<usize> {
        let n = backends.len();
        if n == 0 || self.max == 0 {
            return None;
        }
        let mut i = self.last.map_or(n - 1, |l| if l < n { l } else { l % n });
        // At most one full descent of cw over every backend.
        for _ in 0..self.passes.saturating_mul(n).saturating_add(n) {
            // `i < n`: wrapped by comparison, not `%` (as rr).
            i += 1;
            if i == n {
                i = 0;
                self.cw -= self.gcd;
                if self.cw <= 0 {
                    self.cw = self.max;
                }
            }
            if i64::from(backends[i].weight) >= self.cw {
                self.last = Some(i);
                return Some(i);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sched::test_backends as backends;

    fn names(seq: &[usize]) -> String {
        seq.iter().map(|&i| (b'A' + i as u8) as char).collect()
    }

    #[test]
    fn rr_cycles_and_skips_quiesced() {
        let b = backends(&[1, 0, 5, 1]);
        let mut s = RoundRobin::default();
        let seq: Vec<usize> = (0..7).map(|_| s.pick(&b).unwrap()).collect();
        assert_eq!(names(&seq), "ACDACDA");
        assert_eq!(RoundRobin::default().pick(&backends(&[0, 0])), None);
        assert_eq!(RoundRobin::default().pick::<std::net::Ipv4Addr>(&[]), None);
    }

    /// From every place in lists with and without quiesced backends
    /// (and one nearly all quiesced), a peek `k` ahead is the `k`-th pick
    /// to come or, past its walk's bound, no guess; never another
    /// backend, and never `None` where every backend is available.
    #[test]
    fn rr_peeks_name_the_picks_to_come() {
        let mut sparse = vec![0; 100];
        sparse[7] = 1;
        sparse[60] = 1;
        for weights in [&[1, 1, 1][..], &[4], &[1, 0, 5, 1, 0], &sparse] {
            let b = backends(weights);
            for next in 0..b.len() + 2 {
                // Made for the list (counting where it is dense) and not
                // (walking).
                let made = RoundRobin {
                    next,
                    ..RoundRobin::new(&b)
                };
                assert_eq!(made.dense, !weights.contains(&0));
                for s in [made, RoundRobin { next, dense: false }] {
                    let mut walk = s.clone();
                    for k in 0..20 {
                        let pick = walk.pick(&b);
                        let at = format!("{weights:?} from {next}, k {k}, dense {}", s.dense);
                        match s.peek(&b, k) {
                            Some(guess) => assert_eq!(Some(guess), pick, "{at}"),
                            None => assert!(weights.contains(&0), "{at}"),
                        }
                    }
                }
            }
        }
        assert_eq!(
            RoundRobin::default().peek::<std::net::Ipv4Addr>(&[], 0),
            None
        );
        assert_eq!(RoundRobin::default().peek(&backends(&[0, 0]), 0), None);
    }

    /// The search wraps as `(next + k) % n` did, from every place in the
    /// list, and a state left past the end of a shorter list starts over
    /// where `%` put it.
    #[test]
    fn rr_wraps_as_modulo_did_from_every_start() {
        let b = backends(&[1, 0, 1, 1, 0]);
        let modulo = |next: usize, b: &[SchedBackend<std::net::Ipv4Addr>]| {
            (0..b.len())
                .map(|k| (next + k) % b.len())
                .find(|&i| b[i].available())
        };
        for next in 0..12 {
            for list in [&b[..], &b[..3], &b[..1]] {
                let mut s = RoundRobin { next, dense: false };
                assert_eq!(
                    s.pick(list),
                    modulo(next, list),
                    "next {next}, {} backends",
                    list.len()
                );
            }
        }
    }

    #[test]
    fn wrr_reproduces_the_kernel_sequence() {
        let b = backends(&[4, 3, 2]);
        let mut s = WeightedRoundRobin::new(&b);
        let seq: Vec<usize> = (0..18).map(|_| s.pick(&b).unwrap()).collect();
        assert_eq!(names(&seq), "AABABCABCAABABCABC");
    }

    #[test]
    fn wrr_uses_the_gcd_and_skips_quiesced() {
        // Weights 4, 2, 0: gcd 2, so cw goes 4, 2: A A B, repeat.
        let b = backends(&[4, 2, 0]);
        let mut s = WeightedRoundRobin::new(&b);
        let seq: Vec<usize> = (0..9).map(|_| s.pick(&b).unwrap()).collect();
        assert_eq!(names(&seq), "AABAABAAB");
        let b = backends(&[0, 0]);
        assert_eq!(WeightedRoundRobin::new(&b).pick(&b), None);
    }

    #[test]
    fn wrr_proportions_follow_weights() {
        let b = backends(&[5, 1, 3]);
        let mut s = WeightedRoundRobin::new(&b);
        let mut n = [0; 3];
        for _ in 0..900 {
            n[s.pick(&b).unwrap()] += 1;
        }
        assert_eq!(n, [500, 100, 300]);
    }
}
