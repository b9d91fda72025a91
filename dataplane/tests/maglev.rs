//! Maglev tables: balance at equal weights, proportion to weights, the
//! disruption bound when a backend leaves, and determinism across nodes.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::Ipv4Addr;

use xvs_conntrack::Endpoint;
use xvs_dataplane::sched::{MaglevTable, SchedBackend, DEFAULT_SEED};

fn backends(n: usize, weight: impl Fn(usize) -> u32) -> Vec<SchedBackend> {
    (0..n)
        .map(|i| SchedBackend {
            id: i as u32,
            endpoint: Endpoint {
                addr: Ipv4Addr::from(0xc612_0100u32 + i as u32),
                port: 8080,
            },
            weight: weight(i),
            plan: Default::default(),
        })
        .collect()
}

/// Slots per backend, keyed by endpoint.
fn shares(t: &MaglevTable, b: &[SchedBackend]) -> Vec<usize> {
    let mut n = vec![0; b.len()];
    for s in 0..t.len() {
        n[t.slot(s).unwrap()] += 1;
    }
    n
}

#[test]
fn equal_weights_get_floor_or_ceil_of_m_over_n() {
    for (m, n) in [
        (16_381u32, 10usize),
        (16_381, 100),
        (65_537, 1000),
        (251, 7),
    ] {
        let b = backends(n, |_| 1);
        let t = MaglevTable::build(&b, m, DEFAULT_SEED);
        let (lo, hi) = (m as usize / n, (m as usize).div_ceil(n));
        for (i, &k) in shares(&t, &b).iter().enumerate() {
            assert!(k == lo || k == hi, "M={m} N={n}: backend {i} has {k} slots");
        }
    }
}

#[test]
fn slots_are_proportional_to_weights() {
    let b = backends(4, |i| [100, 200, 300, 400][i]);
    let m = 16_381;
    let t = MaglevTable::build(&b, m, DEFAULT_SEED);
    let n = shares(&t, &b);
    // Weights 1:2:3:4 after the gcd: each round hands out 10 slots.
    for (i, &k) in n.iter().enumerate() {
        let want = m as f64 * (i + 1) as f64 / 10.0;
        assert!((k as f64 - want).abs() <= 4.0, "{n:?}");
    }
    // Quiesced backends take no slot.
    let b = backends(3, |i| [1, 0, 1][i]);
    let t = MaglevTable::build(&b, 251, DEFAULT_SEED);
    assert_eq!(shares(&t, &b)[1], 0);
}

#[test]
fn removing_one_of_n_moves_at_most_two_n_ths_of_the_slots() {
    for n in [10usize, 100] {
        let m = 65_537;
        let all = backends(n, |_| 1);
        let before = MaglevTable::build(&all, m, DEFAULT_SEED);
        for gone in [0, n / 2, n - 1] {
            let rest: Vec<SchedBackend> = all
                .iter()
                .copied()
                .filter(|b| b.id as usize != gone)
                .collect();
            let after = MaglevTable::build(&rest, m, DEFAULT_SEED);
            let changed = (0..m as usize)
                .filter(|&s| {
                    let was = all[before.slot(s).unwrap()].endpoint;
                    let now = rest[after.slot(s).unwrap()].endpoint;
                    was != now
                })
                .count();
            let bound = 2 * m as usize / n;
            assert!(
                changed <= bound,
                "N={n}, removing {gone}: {changed} slots moved (bound {bound})"
            );
            // At least the removed backend's own slots moved.
            assert!(changed >= m as usize / n);
        }
    }
}

#[test]
fn same_seed_and_shuffled_order_build_the_same_table() {
    let b = backends(50, |i| 1 + (i % 3) as u32);
    let mut shuffled = b.clone();
    // A fixed shuffle: reverse, then rotate.
    shuffled.reverse();
    shuffled.rotate_left(17);
    let m = 16_381;
    let t1 = MaglevTable::build(&b, m, 42);
    let t2 = MaglevTable::build(&shuffled, m, 42);
    for s in 0..m as usize {
        assert_eq!(
            b[t1.slot(s).unwrap()].endpoint,
            shuffled[t2.slot(s).unwrap()].endpoint
        );
    }
    // Another seed is another table.
    let t3 = MaglevTable::build(&b, m, 43);
    assert!((0..m as usize).any(|s| t1.slot(s) != t3.slot(s)));
    assert_eq!(t1.memory_bytes(), m as usize * 2);
}
