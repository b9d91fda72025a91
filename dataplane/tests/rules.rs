//! IPVS's rules for flows whose client port is reused or whose backend
//! changed (`conn_reuse_mode`, `expire_nodest_conn`,
//! `expire_quiescent_template`), the TTL rule, the first-packet checksum
//! and the unknown-port policy, on frames built here with valid checksums.
//! Each test says what the frame sequence is as a real client produces it.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::net::Ipv4Addr;
use std::sync::Arc;

use support::{config, ends, looked_up, rr_service, run, tcp, to, udp, GW_MAC};
use xvs_config::{ConnRules, PortRange, Protocol, Service, UnknownPort};
use xvs_conntrack::tcp_flags::{ACK, FIN, RST, SYN};
use xvs_conntrack::FlowState;
use xvs_dataplane::pipeline::{Lookup, Pipeline, PipelineConfig, Side, Verdict};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::wire::{classify, DropReason, Frame, L4};

const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const SNAT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const B0: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 10);
const B1: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 11);

fn service(proto: Protocol, port: u16, backends: &[(Ipv4Addr, u32)]) -> Service<Ipv4Addr> {
    let on_8080: Vec<_> = backends.iter().map(|&(a, w)| (a, 8080, w)).collect();
    rr_service(VIP, proto, port, &on_8080)
}

/// A gateway with TCP 80 and UDP 53 over B0 and B1 (rr), both resolved.
struct Gw {
    p: Pipeline,
    tcp: Arc<CompiledService>,
    udp: Arc<CompiledService>,
}

impl Gw {
    fn new(rules: ConnRules, unknown_port: UnknownPort) -> Gw {
        Self::with_ports(rules, unknown_port, 100)
    }

    /// A gateway whose one worker has `ports` SNAT ports (from 2000).
    fn with_ports(rules: ConnRules, unknown_port: UnknownPort, ports: u16) -> Gw {
        let mut p = Pipeline::new(
            PipelineConfig {
                snat_addrs: vec![SNAT],
                snat_ports: PortRange {
                    first: 2000,
                    last: 2000 + ports - 1,
                },
                rules,
                unknown_port,
                ..config()
            },
            0,
        );
        p.own(VIP);
        let both = [(B0, 1), (B1, 1)];
        let tcp = Arc::new(CompiledService::new(
            1,
            &service(Protocol::Tcp, 80, &both),
            1,
            None,
        ));
        let udp = Arc::new(CompiledService::new(
            2,
            &service(Protocol::Udp, 53, &both),
            1,
            None,
        ));
        p.upsert_service(tcp.clone());
        p.upsert_service(udp.clone());
        for b in [B0, B1] {
            let mut f = vec![0u8; 60];
            f[0..6].copy_from_slice(&GW_MAC);
            f[6..12].copy_from_slice(&[2, 0, 0, 0, 1, b.octets()[3]]);
            f[12..14].copy_from_slice(&[0x08, 0x06]);
            f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 2]);
            f[22..28].copy_from_slice(&[2, 0, 0, 0, 1, b.octets()[3]]);
            f[28..32].copy_from_slice(&b.octets());
            f[32..38].copy_from_slice(&GW_MAC);
            f[38..42].copy_from_slice(&SNAT.octets());
            assert_eq!(run(&mut p, &f, 0).0, Verdict::Consumed);
        }
        Gw { p, tcp, udp }
    }

    /// Replaces the TCP service with `backends` (a new version of it).
    fn set_tcp(&mut self, backends: &[(Ipv4Addr, u32)]) {
        self.tcp = self.next_version(&self.tcp.clone(), backends);
    }

    /// Replaces the UDP service with `backends`.
    fn set_udp(&mut self, backends: &[(Ipv4Addr, u32)]) {
        self.udp = self.next_version(&self.udp.clone(), backends);
    }

    /// The next version of `prev` with `backends`, applied.
    fn next_version(
        &mut self,
        prev: &CompiledService,
        backends: &[(Ipv4Addr, u32)],
    ) -> Arc<CompiledService> {
        let k = prev.key;
        let svc = service(k.protocol, k.port, backends);
        let v = Arc::new(CompiledService::update(prev, &svc, true, None));
        self.p.upsert_service(v.clone());
        v
    }

    /// The client sends `flags` from `port` to VIP:80.
    fn client(&mut self, port: u16, flags: u8) -> (Verdict, Vec<u8>) {
        let f = tcp(CLIENT_MAC, (CLIENT, port), (VIP, 80), flags, 64);
        run(&mut self.p, &f, 1)
    }

    /// As [`Gw::client`], the worker's way: looked up with its batch
    /// first; also what the batch's lookup found.
    fn client_batched(&mut self, port: u16, flags: u8) -> (Verdict, Vec<u8>, Lookup) {
        let f = tcp(CLIENT_MAC, (CLIENT, port), (VIP, 80), flags, 64);
        let (prepared, looked) = looked_up(&mut self.p, &[&f]);
        let mut buf = vec![0u8; 2048];
        buf[..f.len()].copy_from_slice(&f);
        let v = self
            .p
            .process_prepared(Side::Client, &mut buf, 1, &prepared[0], looked[0]);
        if let Verdict::Forward { len, .. } = v {
            buf.truncate(len);
        }
        (v, buf, looked[0])
    }

    /// A connection from `port` to B0 (the first, rr), closed by the
    /// client first, then the backend: TIME_WAIT for 120 s. Its SYN as
    /// forwarded.
    fn time_wait(&mut self, port: u16) -> Vec<u8> {
        let syn = self.connect(port);
        assert_eq!(to(&syn), B0);
        self.client(port, FIN | ACK);
        self.backend(&syn, FIN | ACK);
        assert_eq!(self.state(port), Some(FlowState::TimeWait));
        syn
    }

    /// That the SYN `again` (verdict `v`) reusing the flow of the SYN
    /// `first` was scheduled afresh: to the other backend (rr), from a
    /// fresh SNAT port, one reschedule counted, two new flows in all.
    fn assert_rescheduled(&self, v: Verdict, again: &[u8], first: &[u8]) {
        assert!(
            matches!(
                v,
                Verdict::Forward {
                    to: Side::Backend,
                    ..
                }
            ),
            "{v:?}"
        );
        assert_eq!(to(again), B1);
        assert_ne!(ends(again).0, ends(first).0, "a fresh SNAT port");
        assert_eq!(self.p.v4.table.stats().reschedule, 1);
        assert_eq!(self.p.counters().new_flows, 2);
    }

    /// The backend of a forwarded frame answers it with `flags`.
    fn backend(&mut self, forwarded: &[u8], flags: u8) -> (Verdict, Vec<u8>) {
        let (src, dst) = ends(forwarded);
        let f = tcp([2, 0, 0, 0, 1, 0], dst, src, flags, 64);
        run(&mut self.p, &f, 1)
    }

    /// A whole handshake from `port`; returns the SYN as forwarded.
    fn connect(&mut self, port: u16) -> Vec<u8> {
        let (v, syn) = self.client(port, SYN);
        assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
        self.backend(&syn, SYN | ACK);
        self.client(port, ACK);
        syn
    }

    fn state(&mut self, port: u16) -> Option<FlowState> {
        let key = xvs_conntrack::FlowKey {
            src: CLIENT,
            dst: VIP,
            src_port: port,
            dst_port: 80,
            proto: xvs_conntrack::L4Proto::Tcp,
        };
        let (id, _) = self.p.v4.table.lookup(&key)?;
        Some(self.p.v4.table.flow(id).state())
    }

    fn conns(&self) -> u64 {
        self.tcp.totals().conns
    }
}

#[test]
fn a_syn_on_a_time_wait_or_closed_flow_is_a_new_connection() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    let syn = g.time_wait(40_000);
    // The same client port again (curl --local-port, wrk's Connection:
    // close): scheduled afresh (rr: the other backend), counted.
    let (v, again) = g.client(40_000, SYN);
    g.assert_rescheduled(v, &again, &syn);
    assert_eq!(g.conns(), 2, "the reuse is a new connection in --stats");
    // Established, then reset by the client: CLOSE; the next SYN is new
    // again.
    g.backend(&again, SYN | ACK);
    g.client(40_000, ACK);
    g.client(40_000, RST);
    assert_eq!(g.state(40_000), Some(FlowState::Close));
    let (_, third) = g.client(40_000, SYN);
    assert_eq!(to(&third), B0);
    assert_eq!(g.conns(), 3);
    // A SYN retransmitted while the handshake is under way stays put.
    let (_, retransmit) = g.client(40_000, SYN);
    assert_eq!(to(&retransmit), B0);
    assert_eq!(g.conns(), 3);
}

/// The same reuse in the worker's batch: the batch's lookup finds the
/// TIME_WAIT flow (a hit), the verdict ends it and schedules the SYN
/// afresh, whose key the hit did not need until then.
#[test]
fn a_batched_syn_on_a_time_wait_flow_is_a_new_connection() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    let syn = g.time_wait(40_000);
    let (v, again, looked) = g.client_batched(40_000, SYN);
    assert!(matches!(looked, Lookup::Hit(..)), "{looked:?}");
    g.assert_rescheduled(v, &again, &syn);
    assert_eq!(g.state(40_000), Some(FlowState::SynRecv));
}

#[test]
fn without_conn_reuse_mode_the_old_backend_keeps_the_port() {
    let rules = ConnRules {
        conn_reuse_mode: false,
        ..ConnRules::default()
    };
    let mut g = Gw::new(rules, UnknownPort::Drop);
    let syn = g.connect(40_000);
    g.client(40_000, RST);
    let (_, again) = g.client(40_000, SYN);
    assert_eq!(to(&again), to(&syn));
    assert_eq!(g.conns(), 1);
}

#[test]
fn a_quiesced_backend_takes_no_new_connection_even_on_a_reused_port() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    let first = g.connect(40_000);
    let other = g.connect(40_001);
    assert_eq!((to(&first), to(&other)), (B0, B1));
    g.set_tcp(&[(B0, 0), (B1, 1)]);
    // Established flows to the quiesced backend go on.
    let (v, data) = g.client(40_000, ACK);
    assert!(matches!(v, Verdict::Forward { .. }));
    assert_eq!(to(&data), B0);
    // A SYN on that flow's port (the client's stack reused it): not B0.
    let (_, syn) = g.client(40_000, SYN);
    assert_eq!(to(&syn), B1);
    assert_eq!(g.p.v4.table.stats().reschedule, 1);
    let b0 = g.tcp.backends[0].id;
    assert_eq!(
        g.tcp.counts.flows(b0),
        0,
        "its counts followed the flow out"
    );
}

#[test]
fn a_removed_backend_ends_its_flows_at_their_next_packet() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    let a = g.connect(40_000);
    g.connect(40_001);
    let c = g.connect(40_002);
    assert_eq!((to(&a), to(&c)), (B0, B0));
    let b0 = g.tcp.backends[0].id;
    assert_eq!(g.tcp.counts.active(b0), 2);
    g.set_tcp(&[(B1, 1)]);
    // The client's next segment is refused as the kernel would: a RST.
    let (v, rst) = g.client(40_000, ACK);
    assert!(matches!(v, Verdict::Answer(_)), "{v:?}");
    let Ok(Frame::Ipv4(ip)) = classify(&rst) else {
        panic!()
    };
    assert!(
        matches!(ip.l4, L4::Tcp { flags, .. } if flags.rst()),
        "{ip:?}"
    );
    assert_eq!((ip.src, ip.dst), (VIP, CLIENT));
    assert_eq!(g.state(40_000), None);
    // The backend's side of another one: dropped, the flow gone.
    assert_eq!(g.backend(&c, ACK).0, Verdict::Drop(DropReason::ReplyNoFlow));
    assert_eq!(g.state(40_002), None);
    assert_eq!(g.p.v4.table.stats().nodest, 2);
    assert_eq!(g.tcp.counts.flows(b0), 0);
    // A new connection from the same port goes to what is left.
    let (_, syn) = g.client(40_000, SYN);
    assert_eq!(to(&syn), B1);
    // The flow to B1 was never touched.
    assert_eq!(g.state(40_001), Some(FlowState::Established));
}

#[test]
fn without_expire_nodest_conn_flows_to_a_removed_backend_go_on() {
    let rules = ConnRules {
        expire_nodest_conn: false,
        ..ConnRules::default()
    };
    let mut g = Gw::new(rules, UnknownPort::Drop);
    let a = g.connect(40_000);
    g.set_tcp(&[(B1, 1)]);
    let (v, data) = g.client(40_000, ACK);
    assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
    assert_eq!(to(&data), to(&a));
    assert_eq!(g.p.v4.table.stats().nodest, 0);
}

#[test]
fn udp_to_a_removed_backend_is_scheduled_afresh() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    let dgram = udp(CLIENT_MAC, (CLIENT, 5000), (VIP, 53), 64);
    let (_, first) = run(&mut g.p, &dgram, 1);
    assert_eq!(to(&first), B0);
    g.set_udp(&[(B1, 1)]);
    let (v, next) = run(&mut g.p, &dgram, 2);
    assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
    assert_eq!(to(&next), B1);
    assert_eq!(g.p.v4.table.stats().nodest, 1);
}

#[test]
fn flows_of_a_removed_service_end_at_their_next_packet() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    g.connect(40_000);
    let key = g.tcp.key;
    g.p.v4.services.remove(&key);
    assert!(matches!(g.client(40_000, ACK).0, Verdict::Answer(_)));
    assert_eq!(g.p.v4.table.stats().nodest, 1);
}

#[test]
fn ttl_0_and_1_create_nothing_and_get_time_exceeded() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    for ttl in [1, 0] {
        let f = tcp(CLIENT_MAC, (CLIENT, 40_000), (VIP, 80), SYN, ttl);
        let (v, out) = run(&mut g.p, &f, 1);
        assert!(matches!(v, Verdict::Answer(_)), "ttl {ttl}: {v:?}");
        let Ok(Frame::Ipv4(ip)) = classify(&out) else {
            panic!()
        };
        assert_eq!((ip.src, ip.dst, ip.protocol), (VIP, CLIENT, 1));
        assert_eq!(out[34], 11, "ICMP time exceeded");
        assert_eq!(out[35], 0, "in transit");
        // The quote is the SYN's header.
        assert_eq!(&out[34 + 8..34 + 8 + 20], &f[14..34]);
    }
    assert!(g.p.v4.table.is_empty(), "no flow");
    assert_eq!(g.conns(), 0, "no connection counted");
    assert_eq!(g.tcp.counts.flows(0) + g.tcp.counts.flows(1), 0);
    assert_eq!(g.p.counters().time_exceeded, 2);
    assert_eq!(g.p.counters().new_flows, 0);
    // TTL 1 on an existing flow: answered, the flow's state untouched.
    g.connect(40_001);
    let f = tcp(CLIENT_MAC, (CLIENT, 40_001), (VIP, 80), FIN | ACK, 1);
    assert!(matches!(run(&mut g.p, &f, 1).0, Verdict::Answer(_)));
    assert_eq!(g.state(40_001), Some(FlowState::Established));
    // Not ours: still not ours.
    let f = tcp(
        CLIENT_MAC,
        (CLIENT, 1),
        (Ipv4Addr::new(198, 19, 9, 9), 80),
        SYN,
        1,
    );
    assert_eq!(run(&mut g.p, &f, 1).0, Verdict::Drop(DropReason::NotOwned));
}

#[test]
fn a_first_packet_with_a_bad_l4_checksum_creates_nothing() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    // A partial checksum, as a veth sender with TX offload leaves it.
    let mut f = tcp(CLIENT_MAC, (CLIENT, 40_000), (VIP, 80), SYN, 64);
    f[50] ^= 0x5a;
    assert_eq!(
        run(&mut g.p, &f, 1).0,
        Verdict::Drop(DropReason::L4BadChecksum)
    );
    let mut d = udp(CLIENT_MAC, (CLIENT, 5000), (VIP, 53), 64);
    d[40] ^= 1;
    assert_eq!(
        run(&mut g.p, &d, 1).0,
        Verdict::Drop(DropReason::L4BadChecksum)
    );
    assert!(g.p.v4.table.is_empty());
    assert_eq!(g.p.v4.table.stats().invalid, 2);
    // Fixed, it goes through.
    let f = tcp(CLIENT_MAC, (CLIENT, 40_000), (VIP, 80), SYN, 64);
    assert!(matches!(run(&mut g.p, &f, 1).0, Verdict::Forward { .. }));
}

#[test]
fn an_unknown_port_drops_or_rejects_as_configured() {
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Drop);
    let syn81 = tcp(CLIENT_MAC, (CLIENT, 40_000), (VIP, 81), SYN, 64);
    assert_eq!(
        run(&mut g.p, &syn81, 1).0,
        Verdict::Drop(DropReason::NoService)
    );
    let mut g = Gw::new(ConnRules::default(), UnknownPort::Reject);
    let (v, rst) = run(&mut g.p, &syn81, 1);
    assert!(matches!(v, Verdict::Answer(_)), "{v:?}");
    assert!(
        matches!(classify(&rst), Ok(Frame::Ipv4(ip)) if matches!(ip.l4, L4::Tcp { flags, .. } if flags.rst()))
    );
    let (v, unreach) = run(&mut g.p, &udp(CLIENT_MAC, (CLIENT, 5000), (VIP, 54), 64), 1);
    assert!(matches!(v, Verdict::Answer(_)), "{v:?}");
    assert_eq!((unreach[34], unreach[35]), (3, 3), "port unreachable");
    assert_eq!(g.p.counters().rejected, 2);
    assert!(g.p.v4.table.is_empty());
}

#[test]
fn a_short_port_range_reclaims_closed_and_half_open_flows_never_established_ones() {
    // 4 SNAT ports, two backends (rr): 8 flows fit.
    let mut g = Gw::with_ports(ConnRules::default(), UnknownPort::Drop, 4);
    for port in 40_000..40_008 {
        let syn = g.connect(port);
        g.client(port, FIN | ACK);
        g.backend(&syn, FIN | ACK);
        assert_eq!(g.state(port), Some(FlowState::TimeWait));
    }
    // Every port is held by a TIME_WAIT flow for 120 s: the next client
    // takes the oldest one's port at once.
    let (v, _) = g.client(41_000, SYN);
    assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
    assert_eq!(g.p.v4.table.stats().reclaim, 1);
    let time_wait = (40_000..40_008)
        .filter(|&p| g.state(p) == Some(FlowState::TimeWait))
        .count();
    assert_eq!(time_wait, 7, "one TIME_WAIT flow gave its port");
    // ESTABLISHED flows are never taken.
    let mut g = Gw::with_ports(ConnRules::default(), UnknownPort::Drop, 4);
    for port in 40_000..40_008 {
        g.connect(port);
    }
    assert_eq!(
        g.client(41_000, SYN).0,
        Verdict::Drop(DropReason::SnatExhausted)
    );
    assert_eq!(g.p.v4.table.stats().reclaim, 0);
}

#[test]
fn a_syn_flood_is_reclaimed_and_its_flows_leave_sooner_under_pressure() {
    let mut g = Gw::with_ports(ConnRules::default(), UnknownPort::Drop, 16);
    // 32 SYNs from spoofed sources fill every (backend, port) pair with a
    // half-open flow: 60 s of SYN_RECV each.
    let flood = |n: u32| {
        let src = Ipv4Addr::from(0xc612_0000 + 0x100 + n);
        tcp(CLIENT_MAC, (src, 1024 + n as u16), (VIP, 80), SYN, 64)
    };
    for n in 0..32 {
        assert!(matches!(
            run(&mut g.p, &flood(n), 1).0,
            Verdict::Forward { .. }
        ));
    }
    // The flood goes on: every new SYN reclaims the oldest half-open
    // flow; a real client's handshake completes in between.
    for n in 32..64 {
        assert!(matches!(
            run(&mut g.p, &flood(n), 1).0,
            Verdict::Forward { .. }
        ));
    }
    let syn = g.connect(40_000);
    assert!(matches!(g.backend(&syn, ACK).0, Verdict::Forward { .. }));
    assert_eq!(g.state(40_000), Some(FlowState::Established));
    let reclaimed = g.p.v4.table.stats().reclaim;
    assert_eq!(reclaimed, 33, "one per new flow once the ports ran out");
    // Flows created under pressure leave after syn_recv_pressure (5 s),
    // not syn_recv (60 s); the real connection stays.
    g.p.advance(1 + 5 + 1, u32::MAX);
    let mut left = Vec::new();
    g.p.v4
        .table
        .dump(&xvs_conntrack::Filter::default(), 0, u32::MAX, 7, &mut left);
    assert!(left.iter().any(|f| f.client.addr == CLIENT));
    for f in left.iter().filter(|f| f.client.addr != CLIENT) {
        let n = u32::from(f.client.addr) - 0xc612_0100;
        assert!(
            n < 32,
            "flood flow {n}, created under pressure, is still here"
        );
        assert_eq!(f.state, FlowState::SynRecv);
    }
    assert!(left.len() < 32, "{}", left.len());
}
