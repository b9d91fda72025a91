//! What the control plane's flow-event collector costs per event: one
//! worker's full queue (8,192 new-flow events with a backend and a SNAT
//! endpoint, the daemon's drain of 20 ms at 410k new flows per second)
//! taken into the history, with nobody following and with one follower
//! (`xvsadm observe --follow`) reading every event. The collector runs on
//! the gateway's housekeeping core beside the kernel's own work, so what
//! it spends per event is taken from the same two cores the packet path
//! and its interrupts share.
//!
//! `cargo bench -p xvs-benches --bench events`

#![allow(clippy::unwrap_used)] // benches: a failed unwrap is a broken bench

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use xvs_conntrack::Endpoint;
use xvs_control::events::{Collector, EventFilter, Live};
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
    let followed = Collector::new();
    let mut rx = followed.follow();
    g.bench_function("take_drain_followed", |b| {
        b.iter_batched(
            || (),
            |()| {
                followed.take(black_box(&batch));
                // The follower reads every event it was sent, as
                // `observe --follow` does (its lag, if any, is skipped).
                let mut read = 0usize;
                loop {
                    match rx.try_recv() {
                        Ok(Live::Event(e)) => read += e.src.len(),
                        Ok(Live::Lost(_)) => {}
                        Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => {}
                        Err(_) => break,
                    }
                }
                black_box(read)
            },
            BatchSize::PerIteration,
        )
    });
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
