//! Scheduler costs: the pick latency of every scheduler over 1,000
//! backends (with load spread over the counts), and Maglev table builds for
//! M = 65537 and M = 655373 with 1,000 backends.

#![allow(clippy::unwrap_used)] // benches: a failed unwrap is a broken bench

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use xvs_config::{Scheduler as Kind, SchedulerFlags};
use xvs_conntrack::Endpoint;
use xvs_dataplane::sched::{
    ConnCounts, MaglevParams, MaglevTable, Request, SchedBackend, Scheduler, DEFAULT_SEED,
};

const BACKENDS: usize = 1_000;

fn backends() -> Vec<SchedBackend> {
    (0..BACKENDS)
        .map(|i| SchedBackend {
            id: i as u32,
            endpoint: Endpoint {
                addr: Ipv4Addr::from(0xc612_0100 + i as u32),
                port: 8080,
            },
            weight: 1 + (i % 5) as u32,
            plan: Default::default(),
        })
        .collect()
}

fn picks(c: &mut Criterion) {
    let b = backends();
    let counts = ConnCounts::new(2, BACKENDS);
    for i in 0..BACKENDS as u32 {
        counts.add(
            (i % 2) as usize,
            i,
            (i * 7 % 13) as i32,
            (i * 3 % 17) as i32,
        );
    }
    let maglev = MaglevParams {
        size: 16_381,
        seed: DEFAULT_SEED,
    };
    let mut g = c.benchmark_group("sched_pick_1000_backends");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(3));
    for &kind in Kind::ALL {
        let flags = SchedulerFlags {
            fallback: kind.takes_hash_flags(),
            port: false,
        };
        let mut s = Scheduler::new(kind, flags, &b, maglev, 7);
        let mut n = 0u32;
        g.bench_function(kind.name(), |bench| {
            bench.iter(|| {
                n = n.wrapping_add(0x9e37_79b9);
                let r = Request {
                    client: Endpoint {
                        addr: Ipv4Addr::from(0xc612_0000 | (n >> 16)),
                        port: n as u16,
                    },
                    vip: Endpoint {
                        addr: Ipv4Addr::new(198, 19, 0, 1),
                        port: 80,
                    },
                };
                black_box(s.pick(&b, black_box(&r), &counts, 0)).unwrap()
            })
        });
    }
    g.finish();
}

fn maglev_build(c: &mut Criterion) {
    let b = backends();
    let mut g = c.benchmark_group("maglev_build_1000_backends");
    g.sample_size(20);
    for m in [65_537u32, 655_373] {
        g.bench_function(format!("M={m}"), |bench| {
            bench.iter(|| black_box(MaglevTable::build(black_box(&b), m, DEFAULT_SEED)))
        });
    }
    g.finish();
}

criterion_group!(benches, picks, maglev_build);
criterion_main!(benches);
