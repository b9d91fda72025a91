//! Per-packet cost of the packet core: classify + full-NAT rewrite of a
//! 64-byte TCP frame, and classify + translation of an ICMP error. Frames are
//! processed in batches of 64 (the data plane's RX batch) and reported per
//! packet (criterion's throughput in elements).

#![allow(clippy::unwrap_used)] // benches: a failed unwrap is a broken bench

#[path = "../../dataplane/tests/fixtures/fixtures.rs"]
mod fixtures;

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use smoltcp::wire::EthernetAddress;
use xvs_dataplane::wire::{classify, icmp_error, nat, Endpoint, Frame, IcmpErrorNat, Nat};

const BATCH: usize = 64;
const MAC_GW: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const MAC_BACKEND: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 3]);

fn batch_of(frame: &[u8]) -> Vec<[u8; 128]> {
    let mut one = [0u8; 128];
    one[..frame.len()].copy_from_slice(frame);
    vec![one; BATCH]
}

fn packet_core(c: &mut Criterion) {
    let to_backend = Nat {
        src: Endpoint {
            addr: Ipv4Addr::new(198, 18, 2, 1),
            port: 1024,
        },
        dst: Endpoint {
            addr: Ipv4Addr::new(198, 18, 1, 1),
            port: 8080,
        },
    };
    let to_client = IcmpErrorNat {
        outer_src: Ipv4Addr::new(198, 19, 0, 1),
        outer_dst: Ipv4Addr::new(198, 18, 0, 10),
        inner: Nat {
            src: Endpoint {
                addr: Ipv4Addr::new(198, 18, 0, 10),
                port: 40_000,
            },
            dst: Endpoint {
                addr: Ipv4Addr::new(198, 19, 0, 1),
                port: 80,
            },
        },
    };

    let mut g = c.benchmark_group("packet_core");
    g.throughput(Throughput::Elements(BATCH as u64));

    let tcp_len = fixtures::TCP_64.len();
    assert_eq!(tcp_len, 64);
    g.bench_function("classify_forward_tcp64", |b| {
        b.iter_batched_ref(
            || batch_of(fixtures::TCP_64),
            |frames| {
                for f in frames.iter_mut() {
                    let f = &mut f[..tcp_len];
                    if let Ok(Frame::Ipv4(ip)) = classify(black_box(f)) {
                        black_box(nat::forward(f, &ip, &to_backend, MAC_GW, MAC_BACKEND)).unwrap();
                    }
                }
            },
            BatchSize::SmallInput,
        )
    });

    let icmp_len = fixtures::ICMP_FRAG_NEEDED_TCP8.len();
    g.bench_function("classify_forward_icmp_error", |b| {
        b.iter_batched_ref(
            || batch_of(fixtures::ICMP_FRAG_NEEDED_TCP8),
            |frames| {
                for f in frames.iter_mut() {
                    let f = &mut f[..icmp_len];
                    if let Ok(Frame::Ipv4(ip)) = classify(black_box(f)) {
                        black_box(icmp_error::forward(f, &ip, &to_client, MAC_GW, MAC_BACKEND))
                            .unwrap();
                    }
                }
            },
            BatchSize::SmallInput,
        )
    });

    g.bench_function("classify_only_tcp64", |b| {
        let frame = fixtures::TCP_64;
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(classify(black_box(frame))).unwrap();
            }
        })
    });
    g.finish();
}

criterion_group!(benches, packet_core);
criterion_main!(benches);
