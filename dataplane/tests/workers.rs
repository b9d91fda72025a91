//! Two workers on the in-memory loopback, stepped by the test with its own
//! clock (no root, no threads): the paths that only show with several
//! workers. An ARP reply that lands on one worker's queue teaches the
//! other; a reply arriving on the wrong queue is handed to the worker that
//! owns its SNAT port, both ways; a full hand-off ring and a full TX ring
//! are counted; every frame is accounted for throughout.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::Ipv4Addr;
use std::sync::Arc;

use crossbeam_channel::Sender;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, IpAddress, IpProtocol, Ipv4Address, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket,
    TcpRepr, TcpSeqNumber,
};
use xvs_config::{
    Backend, ForwardMethod, PollMode, PortRange, Protocol, Scheduler, Service, ServiceKey,
};
use xvs_dataplane::counters::LiveCounters;
use xvs_dataplane::eventfd::EventFd;
use xvs_dataplane::io::loopback::{Loopback, Wire};
use xvs_dataplane::pipeline::{Pipeline, PipelineConfig, LOOKUP_CHUNK};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::wire::DropReason;
use xvs_dataplane::worker::{
    Control, Handoff, Peers, Snapshot, Step, Worker, WorkerLinks, HANDOFF_RING,
};

const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const BACKEND_MAC: [u8; 6] = [2, 0, 0, 0, 0, 3];
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
const SNAT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
/// Worker 0's SNAT ports, then worker 1's.
const SLICES: [PortRange; 2] = [
    PortRange {
        first: 1024,
        last: 1999,
    },
    PortRange {
        first: 2000,
        last: 2999,
    },
];

struct Gateway {
    workers: Vec<Worker<Loopback>>,
    wires: Vec<Wire>,
    _control: Vec<Sender<Control>>,
    now: u32,
}

impl Gateway {
    /// Two one-arm workers serving VIP:80 → BACKEND:8080, each with
    /// `frames` frames.
    fn new(frames: u32) -> Gateway {
        let rings: Vec<Arc<Handoff>> = (0..2)
            .map(|_| Arc::new(Handoff::new(HANDOFF_RING)))
            .collect();
        let peers = Peers {
            slices: Arc::from(SLICES.to_vec()),
            rings: Arc::from(rings),
        };
        let mut svc = Service::new(ServiceKey {
            vip: VIP,
            protocol: Protocol::Tcp,
            port: 80,
        });
        svc.scheduler = Scheduler::Rr;
        svc.backends = vec![Backend {
            address: BACKEND,
            port: 8080,
            weight: 1,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        }];
        let compiled = Arc::new(CompiledService::new(1, &svc, 2, None));
        let mut g = Gateway {
            workers: Vec::new(),
            wires: Vec::new(),
            _control: Vec::new(),
            now: 1,
        };
        for (w, slice) in SLICES.iter().enumerate() {
            let mut p = Pipeline::new(
                PipelineConfig {
                    worker: w,
                    mac: EthernetAddress(GW_MAC),
                    backend_mac: EthernetAddress(GW_MAC),
                    snat_addrs: vec![SNAT],
                    snat_addrs6: Vec::new(),
                    snat_ports: *slice,
                    capacity: 4096,
                    timeouts: Default::default(),
                    rules: Default::default(),
                    unknown_port: Default::default(),
                    tunnel: Default::default(),
                    backend_mtu: 1500,
                },
                0,
            );
            p.own(VIP);
            p.upsert_service(compiled.clone());
            let (port, wire) = Loopback::new(frames, 1);
            let (tx, rx) = crossbeam_channel::bounded(16);
            let worker = Worker::new(
                w,
                p,
                port,
                PollMode::Busy,
                WorkerLinks {
                    control: rx,
                    wake: Arc::new(EventFd::new().unwrap()),
                    peers: Some(peers.clone()),
                    live: Arc::new(LiveCounters::default()),
                    liveness: Default::default(),
                },
            );
            g.workers.push(worker);
            g.wires.push(wire);
            g._control.push(tx);
        }
        g
    }

    /// One step of worker `w` (the clock moves one second per step).
    fn step(&mut self, w: usize) -> Step {
        self.now += 1;
        self.workers[w].step(self.now)
    }

    fn snap(&self, w: usize) -> Snapshot {
        self.workers[w].snapshot()
    }

    /// Every counter identity a worker keeps.
    fn assert_accounted(&self) {
        for w in 0..2 {
            let s = self.snap(w);
            let c = &s.counters;
            assert!(s.frames_accounted, "worker {w}: {s:?}");
            assert_eq!(
                c.rx,
                c.forwarded + c.answered + c.consumed + c.dropped(),
                "worker {w}: {c:?}"
            );
            assert_eq!(
                c.forwarded + c.answered + s.tallies.arp_requests + s.tallies.announced,
                s.tallies.tx,
                "worker {w}: {s:?}"
            );
        }
    }
}

/// smoltcp's address type is the standard one.
fn ipv4(a: Ipv4Addr) -> Ipv4Address {
    a
}

/// An Ethernet/IPv4/TCP frame with correct checksums.
fn tcp(
    (src_mac, dst_mac): ([u8; 6], [u8; 6]),
    (src, sport): (Ipv4Addr, u16),
    (dst, dport): (Ipv4Addr, u16),
    control: TcpControl,
    ack: Option<u32>,
) -> Vec<u8> {
    let t = TcpRepr {
        src_port: sport,
        dst_port: dport,
        control,
        seq_number: TcpSeqNumber(1000),
        ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
        window_len: 64240,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let ip = Ipv4Repr {
        src_addr: ipv4(src),
        dst_addr: ipv4(dst),
        next_header: IpProtocol::Tcp,
        payload_len: t.header_len(),
        hop_limit: 64,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress(src_mac),
        dst_addr: EthernetAddress(dst_mac),
        ethertype: EthernetProtocol::Ipv4,
    };
    let mut buf = vec![0u8; eth.buffer_len() + ip.buffer_len() + t.header_len()];
    let caps = ChecksumCapabilities::default();
    let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
    eth.emit(&mut f);
    let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
    ip.emit(&mut p, &caps);
    let mut s = TcpPacket::new_unchecked(p.payload_mut());
    t.emit(
        &mut s,
        &IpAddress::Ipv4(ipv4(src)),
        &IpAddress::Ipv4(ipv4(dst)),
        &caps,
    );
    buf
}

fn syn(sport: u16) -> Vec<u8> {
    tcp(
        (CLIENT_MAC, GW_MAC),
        (CLIENT, sport),
        (VIP, 80),
        TcpControl::Syn,
        None,
    )
}

/// The backend's SYN-ACK to a SNAT port.
fn syn_ack(snat_port: u16) -> Vec<u8> {
    tcp(
        (BACKEND_MAC, GW_MAC),
        (BACKEND, 8080),
        (SNAT, snat_port),
        TcpControl::Syn,
        Some(1001),
    )
}

/// The backend's ARP reply to a request for it.
fn arp_reply() -> Vec<u8> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Reply,
        source_hardware_addr: EthernetAddress(BACKEND_MAC),
        source_protocol_addr: ipv4(BACKEND),
        target_hardware_addr: EthernetAddress(GW_MAC),
        target_protocol_addr: ipv4(SNAT),
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress(BACKEND_MAC),
        dst_addr: EthernetAddress(GW_MAC),
        ethertype: EthernetProtocol::Arp,
    };
    let mut buf = vec![0u8; 60];
    let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
    eth.emit(&mut f);
    arp.emit(&mut ArpPacket::new_unchecked(f.payload_mut()));
    buf
}

/// (dst MAC, src IP, src port, dst IP, dst port) of a sent TCP frame.
fn tcp_of(f: &[u8]) -> ([u8; 6], Ipv4Addr, u16, Ipv4Addr, u16) {
    let e = EthernetFrame::new_checked(f).unwrap();
    let p = Ipv4Packet::new_checked(e.payload()).unwrap();
    let t = TcpPacket::new_checked(p.payload()).unwrap();
    let mut mac = [0u8; 6];
    mac.copy_from_slice(e.dst_addr().as_bytes());
    (mac, p.src_addr(), t.src_port(), p.dst_addr(), t.dst_port())
}

/// Both workers ask for the backend's MAC (a first SYN each, held);
/// the one reply lands on worker 1's queue and teaches both, and each
/// sends the SYN it held.
fn learn_backend(g: &mut Gateway) {
    for w in 0..2 {
        g.wires[w].deliver(0, &syn(39000 + w as u16));
        g.step(w);
        let asked = g.wires[w].take_sent(0);
        assert_eq!(asked.len(), 1);
        assert_eq!(&asked[0][12..14], &[0x08, 0x06], "an ARP request");
        assert_eq!(g.snap(w).tallies.held, 1);
    }
    g.wires[1].deliver(0, &arp_reply());
    assert_eq!(g.step(1), Step::Busy);
    assert_eq!(
        g.snap(1).tallies.handed_off,
        1,
        "a copy of the ARP reply for worker 0"
    );
    assert_eq!(g.step(0), Step::Busy);
    assert_eq!(g.snap(0).tallies.handed_in, 1);
    for w in 0..2 {
        let sent = g.wires[w].take_sent(0);
        assert_eq!(sent.len(), 1, "worker {w} sent the SYN it held");
        let (mac, _, _, dst, dport) = tcp_of(&sent[0]);
        assert_eq!((mac, dst, dport), (BACKEND_MAC, BACKEND, 8080));
    }
}

/// A batch longer than a lookup chunk (the worker looks up and
/// processes [`LOOKUP_CHUNK`] frames at a time): every frame is
/// forwarded once, each as its own new flow.
#[test]
fn a_batch_of_several_lookup_chunks_forwards_each_frame_once() {
    let mut g = Gateway::new(1024);
    learn_backend(&mut g);
    let n = 2 * LOOKUP_CHUNK + 5;
    for p in 0..n as u16 {
        g.wires[0].deliver(0, &syn(44000 + p));
    }
    g.step(0);
    assert_eq!(g.wires[0].pending(0), 0, "one step took the whole batch");
    let sent = g.wires[0].take_sent(0);
    assert_eq!(sent.len(), n);
    let ends: Vec<_> = sent.iter().map(|f| tcp_of(f)).collect();
    assert!(ends
        .iter()
        .all(|&(mac, src, _, dst, dport)| (mac, src, dst, dport)
            == (BACKEND_MAC, SNAT, BACKEND, 8080)));
    let mut ports: Vec<u16> = ends.iter().map(|e| e.2).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(
        ports.len(),
        n,
        "each frame its own flow's SNAT port: {ports:?}"
    );
    let s = g.snap(0);
    assert_eq!(s.counters.new_flows, 1 + n as u64, "{s:?}");
    g.assert_accounted();
}

#[test]
fn an_arp_reply_on_one_queue_teaches_every_worker() {
    let mut g = Gateway::new(256);
    learn_backend(&mut g);
    for (w, slice) in SLICES.iter().enumerate() {
        let s = g.snap(w);
        assert_eq!(s.counters.drops[DropReason::NextHopUnresolved.index()], 0);
        assert_eq!(s.tallies.arp_requests, 1);
        // Now each forwards.
        g.wires[w].deliver(0, &syn(40000));
        g.step(w);
        let sent = g.wires[w].take_sent(0);
        assert_eq!(sent.len(), 1, "the SYN went out");
        let (mac, src, sport, dst, dport) = tcp_of(&sent[0]);
        assert_eq!((mac, src, dst, dport), (BACKEND_MAC, SNAT, BACKEND, 8080));
        assert!((slice.first..=slice.last).contains(&sport), "{sport}");
    }
    g.assert_accounted();
}

#[test]
fn a_next_hop_that_never_answers_is_asked_each_second_then_given_up() {
    let mut g = Gateway::new(256);
    g.wires[0].deliver(0, &syn(39000));
    g.step(0);
    for _ in 0..=xvs_dataplane::worker::HOLD_SECONDS {
        assert_eq!(g.snap(0).counters.dropped(), 0, "still held");
        g.step(0);
    }
    let s = g.snap(0);
    assert_eq!(s.tallies.held, 1);
    assert_eq!(s.counters.drops[DropReason::NextHopUnresolved.index()], 1);
    assert_eq!(s.counters.rx, 1);
    assert_eq!(
        s.tallies.arp_requests,
        1 + u64::from(xvs_dataplane::worker::HOLD_SECONDS),
        "asked again each second"
    );
    g.assert_accounted();
}

/// The held frames are bounded: beyond `HOLD` waiting for a next hop,
/// a frame is given up at once (received, dropped as
/// `next_hop_unresolved`); the held ones go out when the neighbour
/// answers, without being counted as held a second time.
#[test]
fn frames_beyond_the_held_limit_are_given_up_at_once() {
    use xvs_dataplane::worker::HOLD;
    let mut g = Gateway::new(512);
    let extra = 10;
    for p in 0..(HOLD + extra) as u16 {
        g.wires[0].deliver(0, &syn(41000 + p));
    }
    while g.wires[0].pending(0) > 0 {
        g.step(0);
    }
    let s = g.snap(0);
    assert_eq!(s.tallies.held, HOLD as u64, "{s:?}");
    assert_eq!(
        s.counters.drops[DropReason::NextHopUnresolved.index()],
        extra as u64
    );
    assert_eq!(
        s.counters.rx, extra as u64,
        "the held ones are not received yet"
    );
    // (The port counts no frame the worker holds: the whole identity is
    // checked once they went out, below.)
    g.wires[0].take_sent(0);
    g.wires[0].deliver(0, &arp_reply());
    g.step(0);
    let sent = g.wires[0].take_sent(0);
    assert_eq!(sent.len(), HOLD, "every held SYN went out");
    let s = g.snap(0);
    assert_eq!(s.tallies.held, HOLD as u64);
    assert_eq!(s.counters.forwarded, HOLD as u64);
    assert_eq!(
        s.counters.rx,
        (HOLD + extra) as u64 + 1,
        "and the ARP reply"
    );
    g.assert_accounted();
}

#[test]
fn replies_on_the_wrong_queue_reach_the_flow_s_worker_both_ways() {
    let mut g = Gateway::new(256);
    learn_backend(&mut g);
    for (owner, other) in [(0, 1), (1, 0)] {
        let client_port = 41000 + owner as u16;
        g.wires[owner].deliver(0, &syn(client_port));
        g.step(owner);
        let sent = g.wires[owner].take_sent(0);
        let (_, _, snat_port, _, _) = tcp_of(&sent[0]);
        // The backend's answer comes in on the other worker's queue.
        let before = g.snap(other).tallies.handed_off;
        g.wires[other].deliver(0, &syn_ack(snat_port));
        g.step(other);
        assert_eq!(
            g.snap(other).tallies.handed_off,
            before + 1,
            "handed from {other}"
        );
        assert!(g.wires[other].take_sent(0).is_empty());
        g.step(owner);
        let back = g.wires[owner].take_sent(0);
        assert_eq!(back.len(), 1, "worker {owner} forwards it");
        let (mac, src, sport, dst, dport) = tcp_of(&back[0]);
        assert_eq!(
            (mac, src, sport, dst, dport),
            (CLIENT_MAC, VIP, 80, CLIENT, client_port)
        );
    }
    g.assert_accounted();
}

#[test]
fn a_full_hand_off_ring_is_counted() {
    let mut g = Gateway::new(512);
    learn_backend(&mut g);
    g.wires[0].deliver(0, &syn(42000));
    g.step(0);
    let (_, _, snat_port, _, _) = tcp_of(&g.wires[0].take_sent(0)[0]);
    // More replies for worker 0 than its ring holds, while it does not
    // step.
    let n = HANDOFF_RING + 100;
    for _ in 0..n {
        g.wires[1].deliver(0, &syn_ack(snat_port));
    }
    while g.wires[1].pending(0) > 0 {
        g.step(1);
    }
    let s = g.snap(1);
    assert_eq!(
        (s.tallies.handed_off, s.tallies.handoff_full),
        (HANDOFF_RING as u64 + 1, 100),
        "the ARP copy and the ring's worth, then 100 counted drops"
    );
    // Worker 0 takes what its ring holds, and forwards it.
    while g.step(0) == Step::Busy {}
    assert_eq!(g.snap(0).tallies.handed_in, 1 + HANDOFF_RING as u64);
    assert_eq!(g.wires[0].take_sent(0).len(), HANDOFF_RING);
    g.assert_accounted();
}

#[test]
fn a_full_tx_ring_keeps_a_backlog_then_counts_the_rest() {
    let mut g = Gateway::new(1024);
    learn_backend(&mut g);
    // The client side's ring takes nothing.
    g.wires[0].set_tx_room(0, Some(0));
    for p in 0..300u16 {
        g.wires[0].deliver(0, &syn(43000 + p));
    }
    while g.wires[0].pending(0) > 0 {
        g.step(0);
    }
    let s = g.snap(0);
    let full = s.counters.drops[DropReason::TxRingFull.index()];
    // Besides the SYN held while the backend was learned: 128 wait (the
    // backlog, counted as forwarded while they wait), the others are
    // dropped, counted as such instead.
    assert_eq!((s.counters.forwarded, full), (1 + 128, 300 - 128), "{s:?}");
    assert_eq!(
        s.tallies.tx,
        s.tallies.arp_requests + 1,
        "nothing went out but the ARP request and the held SYN"
    );
    // The ring opens: the backlog goes out.
    g.wires[0].set_tx_room(0, None);
    g.step(0);
    assert_eq!(g.wires[0].take_sent(0).len(), 128);
    g.assert_accounted();
}
