//! fo and ovf, as `ip_vs_fo.c` and `ip_vs_ovf.c`: the backend of the
//! highest weight takes every new connection.
//!
//! fo: among backends with a weight, the first of the highest weight.
//! ovf: the same among backends whose active connections do not exceed
//! their weight, so connections overflow to the next weight down when the
//! top one is full. Ties go to the earlier backend in the list (the
//! kernel's strict `>`).

use super::{ConnCounts, SchedBackend};
use xvs_config::Address;

/// fo or ovf (no state: functions of the weights and counts).
#[derive(Debug, Clone)]
pub struct Failover {
    overflow: bool,
}

impl Failover {
    pub(crate) fn new(overflow: bool) -> Self {
        Failover { overflow }
    }

    pub(crate) fn pick<A: Address>(
        &self,
        backends: &[SchedBackend<A>],
        counts: &ConnCounts,
    ) -> Option<usize> {
        let mut best: Option<(usize, u32)> = None;
        for (i, b) in backends.iter().enumerate() {
            if b.weight == 0 || (self.overflow && counts.active(b.id) > b.weight) {
                continue;
            }
            if best.is_none_or(|(_, hw)| b.weight > hw) {
                best = Some((i, b.weight));
            }
        }
        best.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_backends;

    /// `ip_vs_fo_schedule` and `ip_vs_ovf_schedule`, transcribed.
    fn kernel(overflow: bool, b: &[SchedBackend], c: &ConnCounts) -> Option<usize> {
        let mut h = None;
        let mut hw: i64 = 0;
        for (i, d) in b.iter().enumerate() {
            let w = i64::from(d.weight);
            if overflow {
                if i64::from(c.active(d.id)) > w || w == 0 {
                    continue;
                }
                if h.is_none() || w > hw {
                    h = Some(i);
                    hw = w;
                }
            } else if w > hw {
                h = Some(i);
                hw = w;
            }
        }
        h
    }

    #[test]
    fn fo_takes_the_first_of_the_highest_weight() {
        let b = test_backends(&[2, 5, 5, 0, 1]);
        let c = ConnCounts::new(1, b.len());
        c.add(0, 1, 100, 0);
        assert_eq!(Failover::new(false).pick(&b, &c), Some(1));
        assert_eq!(Failover::new(false).pick(&test_backends(&[0, 0]), &c), None);
    }

    #[test]
    fn ovf_overflows_past_a_full_backend() {
        let b = test_backends(&[2, 5, 3]);
        let c = ConnCounts::new(1, b.len());
        let s = Failover::new(true);
        let mut seq = Vec::new();
        for _ in 0..12 {
            let Some(i) = s.pick(&b, &c) else {
                seq.push('-');
                continue;
            };
            seq.push((b'A' + i as u8) as char);
            c.add(0, b[i].id, 1, 0);
        }
        // B takes 6 (active may reach weight + 1), then C 4, then A 3,
        // then nothing is left.
        assert_eq!(seq.iter().collect::<String>(), "BBBBBBCCCCAA");
        assert_eq!(s.pick(&b, &c), Some(0));
        c.add(0, 0, 1, 0);
        assert_eq!(s.pick(&b, &c), None);
    }

    #[test]
    fn both_follow_the_kernel() {
        let mut seed = 0x2545_f491_u32;
        for round in 0..500 {
            let n = 1 + round % 6;
            let weights: Vec<u32> = (0..n)
                .map(|k| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (seed >> 16) % 5 + u32::from(k == 0 && round % 7 == 0)
                })
                .collect();
            let b = test_backends(&weights);
            let c = ConnCounts::new(1, n);
            for d in &b {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                c.add(0, d.id, ((seed >> 16) % 7) as i32, 0);
            }
            for overflow in [false, true] {
                assert_eq!(
                    Failover::new(overflow).pick(&b, &c),
                    kernel(overflow, &b, &c),
                    "{weights:?} overflow={overflow}"
                );
            }
        }
    }
}
