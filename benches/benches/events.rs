//! What the control plane's flow-event collector costs per event: one
//! worker's full queue (8,192 new-flow events with a backend and a SNAT
//! endpoint, the daemon's drain of 20 ms at 410k new flows per second)
//! taken into the history, with nobody following and with one follower
//! (`xvsadm observe --follow`) reading every event it is sent, with no
//! filter (every event rendered) and with one that passes none. The collector runs on
//! the gateway's housekeeping core beside the kernel's own work, so what
//! it spends per event is taken from the same two cores the packet path
//! and its interrupts share.
//!
//! `cargo bench -p xvs-benches --bench events`

#![allow(clippy::unwrap_used)] // benches: a failed unwrap is a broken bench

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{criterion_group, Criterion, Throughput};
use xvs_conntrack::Endpoint;
use xvs_control::events::{next_line, Collector, EventFilter};
use xvs_dataplane::events::{EventKind, FlowEvent, QUEUE};

fn at(a: u32, port: u16) -> Endpoint<IpAddr> {
    Endpoint {
        addr: IpAddr::V4(Ipv4Addr::from(a)),
        port,
    }
}

/// A drain's worth of new-flow events, every one a different client.
fn drained() -> Vec<FlowEvent> {
    (0..QUEUE as u32)
        .map(|i| FlowEvent {
            time: 100,
            worker: 0,
            kind: EventKind::New,
            protocol: 17,
            src: at(0xc612_0000 + i / 60_000, 1024 + (i % 60_000) as u16),
            dst: at(0xc613_0001, 53),
            backend: at(0xc612_010a + i % 3, 5353),
            snat: at(0xc612_fe01, 1024 + i as u16),
        })
        .collect()
}

fn events(c: &mut Criterion) {
    let batch = drained();
    let mut g = c.benchmark_group("event_collector");
    g.throughput(Throughput::Elements(batch.len() as u64));
    let collector = Collector::new();
    g.bench_function("take_drain_unobserved", |b| {
        b.iter(|| collector.take(black_box(&batch)))
    });
    // A follower as the API serves one: each line filtered, rendered and
    // serialized (`events::next_line`), read until none is ready.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let everything = EventFilter::default();
    let elsewhere = EventFilter {
        to_ip: Some("198.18.9.9".parse().unwrap()),
        ..EventFilter::default()
    };
    for (name, filter) in [
        ("take_drain_followed", &everything),
        ("take_drain_followed_filtered", &elsewhere),
    ] {
        let followed = Collector::new();
        let mut rx = followed.follow();
        g.bench_function(name, |b| {
            b.iter(|| {
                followed.take(black_box(&batch));
                rt.block_on(async {
                    let mut bytes = 0usize;
                    let now = std::time::Duration::ZERO;
                    while let Ok(Some(line)) =
                        tokio::time::timeout(now, next_line(&mut rx, filter)).await
                    {
                        bytes += line.len();
                    }
                    black_box(bytes)
                })
            })
        });
    }
    g.finish();
    // What `xvsadm observe --last 20` asks of a full history.
    c.bench_function("event_collector/last_20", |b| {
        b.iter(|| black_box(collector.last(20, &EventFilter::default())))
    });
}

criterion_group!(benches, events);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
