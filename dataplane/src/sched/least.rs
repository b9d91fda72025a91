//! lc, wlc, sed and nq, as `ip_vs_lc.c`, `ip_vs_wlc.c`, `ip_vs_sed.c` and
//! `ip_vs_nq.c`, on the global counts of [`ConnCounts`].
//!
//! Overheads: lc and wlc use `active × 256 + inactive`; sed and nq use
//! `active + 1`. lc takes the smallest overhead; wlc, sed and nq compare
//! overhead / weight by cross-multiplication (`a × wb > b × wa`), so no
//! division and no rounding; nq first takes any backend with no active
//! connection. Ties go to the earlier backend in the list, as the kernel's
//! strict comparisons do.

use xvs_config::Address;
use xvs_config::Scheduler as Kind;

use super::{ConnCounts, SchedBackend};

/// State of lc, wlc, sed, nq (none: they are functions of the counts).
#[derive(Debug, Clone)]
pub struct Least {
    kind: Kind,
}

impl Least {
    pub(crate) fn new(kind: Kind) -> Self {
        Least { kind }
    }

    pub(crate) fn pick<A: Address>(
        &self,
        backends: &[SchedBackend<A>],
        counts: &ConnCounts,
    ) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for (i, b) in backends.iter().enumerate().filter(|(_, b)| b.available()) {
            let active = u64::from(counts.active(b.id));
            let overhead = match self.kind {
                Kind::Lc | Kind::Wlc => active * 256 + u64::from(counts.inactive(b.id)),
                _ => active + 1,
            };
            if self.kind == Kind::Nq && active == 0 {
                return Some(i);
            }
            let better = match best {
                None => true,
                Some((j, least)) => match self.kind {
                    Kind::Lc => overhead < least,
                    _ => least * u64::from(b.weight) > overhead * u64::from(backends[j].weight),
                },
            };
            if better {
                best = Some((i, overhead));
            }
        }
        best.map(|(i, _)| i)
    }
}

/// The wlc overhead of a backend, for two-choices.
pub(crate) fn wlc_overhead<A: Address>(b: &SchedBackend<A>, counts: &ConnCounts) -> u64 {
    u64::from(counts.active(b.id)) * 256 + u64::from(counts.inactive(b.id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xvs_conntrack::Endpoint;

    /// Backends with (weight, active, inactive).
    fn setup(spec: &[(u32, i32, i32)]) -> (Vec<SchedBackend>, ConnCounts) {
        let counts = ConnCounts::new(2, spec.len());
        let b = spec
            .iter()
            .enumerate()
            .map(|(i, &(w, a, n))| {
                // Split across two workers: the sum is what counts.
                counts.add(0, i as u32, a / 2, n / 2);
                counts.add(1, i as u32, a - a / 2, n - n / 2);
                SchedBackend {
                    id: i as u32,
                    endpoint: Endpoint {
                        addr: std::net::Ipv4Addr::new(198, 18, 1, i as u8),
                        port: 80,
                    },
                    weight: w,
                    plan: Default::default(),
                }
            })
            .collect();
        (b, counts)
    }

    fn pick(kind: Kind, spec: &[(u32, i32, i32)]) -> Option<usize> {
        let (b, c) = setup(spec);
        Least::new(kind).pick(&b, &c)
    }

    #[test]
    fn lc_weighs_active_256_times_inactive() {
        // 1*256+0 = 256 vs 0*256+300 = 300 vs 1*256+1 = 257.
        assert_eq!(
            pick(Kind::Lc, &[(1, 1, 0), (1, 0, 300), (1, 1, 1)]),
            Some(0)
        );
        // Weights do not matter to lc, quiescence does.
        assert_eq!(
            pick(Kind::Lc, &[(0, 0, 0), (100, 2, 0), (1, 1, 5)]),
            Some(2)
        );
        // Ties: the first.
        assert_eq!(pick(Kind::Lc, &[(1, 1, 0), (1, 1, 0)]), Some(0));
    }

    #[test]
    fn wlc_divides_by_weight() {
        // 10*256/1 = 2560, 30*256/5 = 1536, 4*256/1 = 1024.
        assert_eq!(
            pick(Kind::Wlc, &[(1, 10, 0), (5, 30, 0), (1, 4, 0)]),
            Some(2)
        );
        // 2560/1 vs 7680/5 = 1536: the heavier one.
        assert_eq!(pick(Kind::Wlc, &[(1, 10, 0), (5, 30, 0)]), Some(1));
        // Equal ratio 256/1 and 512/2: the first.
        assert_eq!(pick(Kind::Wlc, &[(1, 1, 0), (2, 2, 0)]), Some(0));
        assert_eq!(pick(Kind::Wlc, &[(0, 0, 0)]), None);
    }

    #[test]
    fn sed_counts_the_next_connection() {
        // (0+1)/1 = 1 vs (2+1)/4 = 0.75: sed prefers the big idle-ish one.
        assert_eq!(pick(Kind::Sed, &[(1, 0, 0), (4, 2, 0)]), Some(1));
        // Inactive connections do not count.
        assert_eq!(pick(Kind::Sed, &[(1, 1, 1000), (1, 2, 0)]), Some(0));
    }

    #[test]
    fn nq_takes_an_idle_backend_first() {
        // Backend 2 is idle (no active): taken though sed would prefer 1.
        assert_eq!(
            pick(Kind::Nq, &[(1, 3, 0), (10, 1, 0), (1, 0, 50)]),
            Some(2)
        );
        // No idle one: sed's choice.
        assert_eq!(pick(Kind::Nq, &[(1, 1, 0), (4, 2, 0)]), Some(1));
        // A quiesced idle backend is not taken.
        assert_eq!(pick(Kind::Nq, &[(0, 0, 0), (1, 5, 0)]), Some(1));
    }
}
