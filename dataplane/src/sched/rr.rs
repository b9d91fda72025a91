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
}

impl RoundRobin {
    pub(crate) fn pick<A: Address>(&mut self, backends: &[SchedBackend<A>]) -> Option<usize> {
        let n = backends.len();
        (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&i| backends[i].available())
            .inspect(|&i| {
                self.next = i + 1;
            })
    }
}

/// wrr state and the weights' max and gcd.
#[derive(Debug, Clone)]
pub struct WeightedRoundRobin {
    /// Index of the last choice (`None` before the first).
    last: Option<usize>,
    /// Current weight.
    cw: i64,
    max: i64,
    gcd: i64,
}

impl WeightedRoundRobin {
    pub(crate) fn new<A: Address>(backends: &[SchedBackend<A>]) -> Self {
        let max = backends.iter().map(|b| b.weight).max().unwrap_or(0);
        let g = backends
            .iter()
            .filter(|b| b.weight > 0)
            .fold(0, |g, b| gcd(g, b.weight));
        WeightedRoundRobin {
            last: None,
            cw: 0,
            max: i64::from(max),
            gcd: i64::from(g.max(1)),
        }
    }

    pub(crate) fn pick<A: Address>(&mut self, backends: &[SchedBackend<A>]) -> Option<usize> {
        let n = backends.len();
        if n == 0 || self.max == 0 {
            return None;
        }
        // At most one full descent of cw over every backend.
        let passes = (self.max / self.gcd + 1) as usize;
        let mut i = self.last.map_or(n - 1, |l| l % n);
        for _ in 0..passes.saturating_mul(n).saturating_add(n) {
            i = (i + 1) % n;
            if i == 0 {
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
