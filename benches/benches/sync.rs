//! What flow synchronisation costs the packet path: new flows (SYN to a
//! random one of 10,000 services: scheduler, SNAT port, insert, rewrite)
//! on one pipeline, by rounds of 20,000 alternately without sync and with
//! its records going through its queue to the real sync thread, which
//! sends them over UDP on loopback to a socket that reads them (as a
//! peer's would). The medians of each and their ratio are printed, with
//! the sync thread's counters (every record sent, none lost to a full
//! queue). The packet path runs on core 0, the sync thread and the peer
//! on core 1.
//!
//! `cargo bench -p xvs-benches --bench sync`

#![allow(clippy::unwrap_used)] // benches: a failed unwrap is a broken bench
#![allow(clippy::disallowed_types)] // a benchmark measures wall-clock time

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::wire::EthernetAddress;
use xvs_benches::frames::{arp_reply, tcp64, GW_MAC as GW};
use xvs_config::{
    Backend, Family, ForwardMethod, PortRange, Protocol, Scheduler, Service, ServiceKey, Timeouts,
};
use xvs_conntrack::{Filter, FlowState, L4Proto};
use xvs_dataplane::pipeline::{Pipeline, PipelineConfig, Verdict};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::sync::daemon::SyncDaemon;
use xvs_dataplane::sync::SyncQueue;

const SERVICES: u32 = 10_000;
const ROUND: u32 = 20_000;
const ROUNDS: usize = 15;

fn vip(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xc613_0000 + n)
}

fn backend(n: u32, k: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xc612_0100 + (n * 3 + k) % 30_000)
}

fn pipeline() -> Pipeline {
    let mut p = Pipeline::new(
        PipelineConfig {
            worker: 0,
            mac: EthernetAddress(GW),
            backend_mac: EthernetAddress(GW),
            snat_addrs: vec![Ipv4Addr::new(198, 18, 254, 1)],
            snat_addrs6: Vec::new(),
            snat_ports: PortRange {
                first: 1024,
                last: 65_535,
            },
            capacity: 1 << 20,
            timeouts: Timeouts::default(),
            rules: xvs_config::ConnRules::default(),
            unknown_port: xvs_config::UnknownPort::Drop,
            tunnel: Default::default(),
            backend_mtu: 1500,
        },
        0,
    );
    for n in 0..SERVICES {
        let mut s = Service::new(ServiceKey {
            vip: vip(n),
            protocol: Protocol::Tcp,
            port: 80,
        });
        s.scheduler = Scheduler::Rr;
        s.backends = (0..3)
            .map(|k| Backend {
                address: backend(n, k),
                port: 8080,
                weight: 1,
                forward: ForwardMethod::Masq,
                encap: Default::default(),
            })
            .collect();
        p.upsert_service(Arc::new(CompiledService::new(n + 1, &s, 1, None)));
        p.own(vip(n));
    }
    for a in 0..30_000u32 {
        let mut f = arp_reply(Ipv4Addr::from(0xc612_0100 + a));
        p.process(&mut f, 60, 0);
    }
    p
}

/// One round: `ROUND` new flows from `first` on; the time they took. The
/// flows are deleted afterwards (not timed).
fn round(p: &mut Pipeline, first: u32) -> Duration {
    let frames: Vec<[u8; 64]> = (0..ROUND)
        .map(|j| {
            let i = first + j;
            let client = Ipv4Addr::from(0xc612_8000 + (i >> 14));
            let s = ((u64::from(i) * 2_654_435_761) % u64::from(SERVICES)) as u32;
            tcp64(client, (i & 0x3fff) as u16 + 1024, vip(s), 0x02)
        })
        .collect();
    let mut buf = [0u8; 2048];
    let start = Instant::now();
    // In batches of 64, as a worker takes them; it publishes the
    // batch's sync records at the end.
    for batch in frames.chunks(64) {
        for f in batch {
            buf[..64].copy_from_slice(f);
            let v = p.process(&mut buf, 64, 1);
            debug_assert!(matches!(v, Verdict::Forward { .. }));
            black_box(v);
        }
        p.flush_sync();
    }
    let spent = start.elapsed();
    let filter = Filter {
        state: Some(FlowState::SynRecv),
        proto: Some(L4Proto::Tcp),
        ..Filter::default()
    };
    let mut cursor = Some(0);
    while let Some(c) = cursor {
        cursor = p.delete_matching(&filter, Family::V4, c, u32::MAX).1;
    }
    spent
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // The sync thread and the peer run on core 1 (they inherit this
    // thread's affinity when they start), the packet path on core 0, as
    // a gateway keeps its workers' cores for them.
    let pinned = core_affinity::set_for_current(core_affinity::CoreId { id: 1 });
    // The peer: a socket that reads what the sync thread sends.
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    sink.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let peer = sink.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut buf, mut n) = ([0u8; 2048], 0u64);
            while !stop.load(Ordering::Relaxed) {
                if sink.recv(&mut buf).is_ok() {
                    n += 1;
                }
            }
            n
        })
    };
    let me = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let settings = xvs_config::Sync {
        node: 1,
        id: 0,
        listen: SocketAddr::new(me.ip(), me.port()),
        peers: vec![peer],
        key_file: None,
        role: xvs_config::SyncRole::Active,
        peer_timeout_ms: None,
    };
    let queue = Arc::new(SyncQueue::default());
    let key = b"a bench key of more than 16 bytes";
    let daemon =
        SyncDaemon::start(&settings, Some(key), vec![queue.clone()], Box::new(|_| {})).unwrap();
    let pinned = pinned && core_affinity::set_for_current(core_affinity::CoreId { id: 0 });
    println!("packet path on core 0, sync thread on core 1: {pinned}");
    // One pipeline, sync turned on and off round by round: the same
    // memory either way (two pipelines differ by where their tables
    // landed, by several percent).
    let mut p = pipeline();
    // Rounds cycle: without, with, without again (the two without give
    // the noise floor of the comparison).
    let mut t: [Vec<f64>; 3] = Default::default();
    let mut first = 0u32;
    for r in 0..3 * ROUNDS {
        let k = r % 3;
        p.set_sync((k == 1).then(|| queue.clone()));
        let spent = round(&mut p, first);
        t[k].push(spent.as_nanos() as f64 / f64::from(ROUND));
        first = (first + ROUND) % (1 << 22);
    }
    // Let the thread send what is left.
    std::thread::sleep(Duration::from_millis(200));
    let reading = daemon.reading();
    daemon.stop();
    stop.store(true, Ordering::Relaxed);
    let datagrams = reader.join().unwrap();
    let [off, on, off2] = t.map(median);
    println!(
        "sync overhead: new flow {off:.0} ns without sync, {on:.0} ns with sync (medians of {ROUNDS} rounds of {ROUND}); \
         ratio {:.3} (+{:.1}%); noise floor (without/without) {:.3}; sync thread: {} records in {} datagrams sent, \
         {} read by the peer, {} lost to a full queue",
        on / off,
        (on / off - 1.0) * 100.0,
        off2 / off,
        reading.sent_records,
        reading.sent_datagrams,
        datagrams,
        reading.overflow
    );
}
