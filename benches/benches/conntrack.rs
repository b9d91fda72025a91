//! Flow table cost at 1M and 10M entries with random access: lookup hit,
//! insert, expire; and the memory each flow costs, index included.
//!
//! Every bench fills a table to its size first, then measures operations
//! on keys taken in a random order, so the CPU caches do not hold the
//! working set (≈110 MB at 1M flows).
//!
//! `XVS_BENCH_SIZES=1000000` (comma-separated) limits the table sizes
//! built, for quick comparisons (filling 10M entries takes a minute).

#![allow(clippy::unwrap_used)] // benches: a failed unwrap is a broken bench
#![allow(clippy::disallowed_types)] // a benchmark measures wall-clock time

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use xvs_config::Address;
use xvs_conntrack::{
    Direction, Endpoint, FlowKey, FlowTable, L4Proto, NewFlow, Packet, Timeouts, BATCH,
};

const SIZES: [u32; 3] = [1_000, 1_000_000, 10_000_000];
/// Room kept free for the insert and expire benches.
const CHUNK: u32 = 10_000;

fn flow(n: u32) -> NewFlow {
    let client = Ipv4Addr::from(0xc612_0000 | (n >> 14));
    NewFlow {
        client: Endpoint {
            addr: client,
            port: (n & 0x3fff) as u16 + 1024,
        },
        vip: Endpoint {
            addr: Ipv4Addr::new(198, 19, 0, 1),
            port: 80,
        },
        backend: Endpoint {
            addr: Ipv4Addr::new(198, 18, 1, (n % 200) as u8),
            port: 8080,
        },
        snat: Endpoint {
            addr: Ipv4Addr::from(0xc612_8000 | (n >> 16)),
            port: n as u16,
        },
        proto: L4Proto::Tcp,
        service: 1,
        backend_id: n % 200,
        client_mac: [2, 0, 0, 0, 0, 1],
        plan: 0,
        one_way: false,
    }
}

/// The next unused flow number after `n` more beyond `size`'s table (kept
/// below 2^29 so [`flow`] stays unique).
fn bump(size: u32, next: u32, n: u32) -> u32 {
    size + (next - size + n) % (1 << 28)
}

/// A deterministic permutation of `0..n` (multiplicative, odd step).
fn shuffled(n: u32) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n)
        .map(|i| ((u64::from(i) * 2_654_435_761) % u64::from(n)) as u32)
        .collect();
    v.dedup();
    v
}

fn filled(size: u32) -> FlowTable {
    // Long-lived ESTABLISHED flows, their last packets spread over one wheel
    // revolution as in a steady state; UDP flows live 1 s so the expire
    // bench's clock moves 1 s per chunk.
    let timeouts = Timeouts {
        established: xvs_config::MAX_TIMEOUT_SECS,
        udp: 1,
        ..Timeouts::default()
    };
    let mut t = FlowTable::new(size + CHUNK, timeouts, 0);
    let syn = Packet {
        tcp_flags: 0x02,
        len: 60,
    };
    let ack = Packet {
        tcp_flags: 0x10,
        len: 52,
    };
    for n in 0..size {
        let at = n % 1024;
        let id = t.insert(&flow(n), syn, at, &mut ()).unwrap();
        t.on_packet(id, Direction::Original, ack, at, &mut ());
    }
    t
}

/// The memory floor the lookups run against, measured in the same run: a
/// random 8-byte read from a 128 MiB buffer (independent reads, as
/// independent lookups are), and three reads each depending on the last
/// (what a hashbrown probe does: control group, bucket, then the entry).
fn memory_baseline(c: &mut Criterion) {
    const WORDS: usize = 16 << 20; // 128 MiB of u64
    let buf: Vec<u64> = (0..WORDS as u64)
        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % WORDS as u64)
        .collect();
    let mut g = c.benchmark_group("memory_baseline");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(3));
    let mut i = 0u64;
    g.bench_function("random_read_128MiB", |b| {
        b.iter(|| {
            i = i.wrapping_add(0x9e37_79b9) % WORDS as u64;
            black_box(buf[i as usize])
        })
    });
    g.bench_function("three_dependent_reads_128MiB", |b| {
        b.iter(|| {
            i = i.wrapping_add(0x9e37_79b9) % WORDS as u64;
            let a = buf[i as usize];
            let b2 = buf[a as usize];
            black_box(buf[b2 as usize])
        })
    });
    g.finish();
}

/// Times `iters` inserts of fresh flows with `insert`, in chunks; each
/// chunk is removed again (not timed) so the table stays at its size.
fn timed_inserts<R>(
    t: &mut FlowTable,
    size: u32,
    next: &mut u32,
    iters: u64,
    mut insert: impl FnMut(&mut FlowTable, &NewFlow, Packet) -> R,
) -> Duration {
    let syn = Packet {
        tcp_flags: 0x02,
        len: 60,
    };
    let mut spent = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(u64::from(CHUNK)) as u32;
        let start = Instant::now();
        for k in 0..n {
            black_box(insert(t, &flow(*next + k), syn));
        }
        spent += start.elapsed();
        for k in 0..n {
            let f = flow(*next + k);
            let (id, _) = t
                .lookup(&FlowKey::between(f.client, f.vip, f.proto))
                .unwrap();
            t.remove(id, &mut ());
        }
        *next = bump(size, *next, n);
        left -= u64::from(n);
    }
    spent
}

/// The table sizes to bench: [`SIZES`], or those `XVS_BENCH_SIZES` lists.
fn sizes() -> Vec<u32> {
    match std::env::var("XVS_BENCH_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|s| s.trim().parse().expect("XVS_BENCH_SIZES: a list of sizes"))
            .collect(),
        Err(_) => SIZES.to_vec(),
    }
}

fn conntrack(c: &mut Criterion) {
    for size in sizes() {
        let mut t = filled(size);
        let per_flow = t.memory_bytes() as f64 / f64::from(t.capacity());
        println!(
            "conntrack/{size}: {per_flow:.1} bytes per flow all-in ({} MiB for {} entries)",
            t.memory_bytes() >> 20,
            t.capacity()
        );
        let order = shuffled(size);
        let keys: Vec<FlowKey> = order
            .iter()
            .map(|&n| {
                let f = flow(n);
                FlowKey::between(f.client, f.vip, f.proto)
            })
            .collect();

        let mut g = c.benchmark_group(format!("conntrack/{size}"));
        g.throughput(Throughput::Elements(1));
        g.sample_size(20);
        g.measurement_time(Duration::from_secs(4));

        lookups(&mut g, &mut t, &keys);

        let mut next = size;
        g.bench_function("insert", |b| {
            b.iter_custom(|iters| {
                timed_inserts(&mut t, size, &mut next, iters, |t, f, p| {
                    t.insert(f, p, 0, &mut ()).unwrap()
                })
            })
        });
        // What the data plane calls: it has just found both keys free.
        g.bench_function("insert_new", |b| {
            b.iter_custom(|iters| {
                timed_inserts(&mut t, size, &mut next, iters, |t, f, p| {
                    let orig = FlowKey::between(f.client, f.vip, f.proto);
                    let reply = FlowKey::between(f.backend, f.snat, f.proto);
                    let hashes = [t.key_hash(&orig), t.key_hash(&reply)];
                    t.insert_new(f, hashes, p, 0, &mut ()).unwrap()
                })
            })
        });

        // Expire: chunks of UDP flows that time out together amid the
        // table's long-lived flows; measured per expired entry, including
        // the lazy re-filing of the long-lived flows the wheel passes
        // (1/1024 of them per second). Every wheel second expires a full
        // chunk whatever criterion's iteration count, so the re-filing is
        // shared by the same number of expiries at every sample (with one
        // expiry per second, a 10M table would charge ~10k re-filings to
        // it); the time is scaled to `iters` expiries.
        let mut now = 1024u32;
        g.bench_function("expire", |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let chunks = iters.div_ceil(u64::from(CHUNK));
                for _ in 0..chunks {
                    now += 1;
                    for k in 0..CHUNK {
                        let mut f = flow(next + k);
                        f.proto = L4Proto::Udp;
                        t.insert(&f, Packet::default(), now, &mut ()).unwrap();
                    }
                    next = bump(size, next, CHUNK);
                    now += 1;
                    let start = Instant::now();
                    let a = t.advance(now, u32::MAX, &mut ());
                    spent += start.elapsed();
                    assert_eq!(a.expired, CHUNK);
                }
                spent.mul_f64(iters as f64 / (chunks * u64::from(CHUNK)) as f64)
            })
        });
        g.finish();
    }
}

/// Lookups of `keys` (all tracked, in a random order) in `t`: one at a
/// time, and in batches of [`BATCH`]; the group's throughput is left at one
/// element.
fn lookups<A: Address>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    t: &mut FlowTable<A>,
    keys: &[FlowKey<A>],
) {
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("lookup_hit", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(t.lookup(black_box(&keys[i]))).unwrap()
        })
    });
    let mut out = vec![None; BATCH];
    let mut hashes = vec![0; BATCH];
    let mut j = 0usize;
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("lookup_hit_batch64", |b| {
        b.iter(|| {
            j = (j + BATCH) % (keys.len() - BATCH);
            t.lookup_batch(black_box(&keys[j..j + BATCH]), &mut out, &mut hashes);
            assert!(out[BATCH - 1].is_some());
        })
    });
    g.throughput(Throughput::Elements(1));
}

/// A flow of [`flow`]'s numbering with its addresses mapped into family
/// `A`.
fn flow_in<A: Address>(n: u32, map: fn(Ipv4Addr) -> A) -> NewFlow<A> {
    let f = flow(n);
    let end = |e: Endpoint| Endpoint {
        addr: map(e.addr),
        port: e.port,
    };
    NewFlow {
        client: end(f.client),
        vip: end(f.vip),
        backend: end(f.backend),
        snat: end(f.snat),
        proto: f.proto,
        service: f.service,
        backend_id: f.backend_id,
        client_mac: f.client_mac,
        plan: f.plan,
        one_way: f.one_way,
    }
}

/// The same 1M-flow table and random lookups for each way of holding an
/// address: the table generic over IPv4 (what the data plane runs), over
/// the standard `IpAddr` enum (one type for both families), and over
/// IPv6 (2001:2::/48 addresses): time per lookup and bytes per flow.
fn family(c: &mut Criterion) {
    fn one<A: Address>(c: &mut Criterion, name: &str, map: fn(Ipv4Addr) -> A) {
        const SIZE: u32 = 1_000_000;
        let mut t: FlowTable<A> = FlowTable::new(SIZE, Timeouts::default(), 0);
        let syn = Packet {
            tcp_flags: 0x02,
            len: 60,
        };
        for n in 0..SIZE {
            t.insert(&flow_in(n, map), syn, 0, &mut ()).unwrap();
        }
        println!(
            "family/{name}: {:.1} bytes per flow all-in",
            t.memory_bytes() as f64 / f64::from(t.capacity())
        );
        let keys: Vec<FlowKey<A>> = shuffled(SIZE)
            .iter()
            .map(|&n| {
                let f = flow_in(n, map);
                FlowKey::between(f.client, f.vip, f.proto)
            })
            .collect();
        let mut g = c.benchmark_group(format!("family/{name}"));
        g.sample_size(20);
        g.measurement_time(Duration::from_secs(4));
        lookups(&mut g, &mut t, &keys);
        g.finish();
    }
    one(c, "ipv4_generic", |a| a);
    one(c, "ipaddr_enum", IpAddr::V4);
    one(c, "ipv6_generic", |a| {
        let [a, b, c, d] = a.octets();
        Ipv6Addr::new(
            0x2001,
            2,
            0,
            0,
            0,
            0,
            u16::from_be_bytes([a, b]),
            u16::from_be_bytes([c, d]),
        )
    });
}

criterion_group!(benches, memory_baseline, conntrack, family);
criterion_main!(benches);
