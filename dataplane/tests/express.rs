//! The express lane (established full-NAT packets, `pipeline/express.rs`)
//! against the general path: two gateways built alike, one with the lane
//! off, get the same random traffic, one frame at a time and in batches
//! the worker's way (clients opening, using, closing and reusing ports
//! over TCP and UDP, backends answering from their own or another MAC,
//! TTLs running out, a backend removed, quiesced and restored, a next hop
//! learned or moved, time passing, the removal rule switched). After
//! every step their verdicts, the frames they send and their counters are
//! equal; at the end, their flow tables, the services' traffic counters,
//! the flow events and the sync records too.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::net::Ipv4Addr;
use std::sync::Arc;

use proptest::prelude::*;
use support::{config, ends, rr_service, run, tcp, udp, GW_MAC};
use xvs_config::{ConnRules, Family, PortRange, Protocol, Service, UnknownPort};
use xvs_conntrack::tcp_flags::{ACK, FIN, RST, SYN};

/// TCP PSH (data), beside conntrack's flags.
const PSH: u8 = 0x08;
use xvs_conntrack::Filter;
use xvs_dataplane::events::FlowEvents;
use xvs_dataplane::pipeline::{
    Counters, Lookup, Pipeline, PipelineConfig, Prepared, Side, Verdict,
};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::sync::SyncQueue;

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const SNAT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
const BACKENDS: [Ipv4Addr; 2] = [Ipv4Addr::new(198, 18, 1, 10), Ipv4Addr::new(198, 18, 1, 11)];

/// A backend's MAC: `which` 0 and 1 are the two backends', 2 is another
/// host's (a backend that moved, or a reply from somewhere else).
fn mac(which: u8) -> [u8; 6] {
    [2, 0, 0, 0, 1, 10 + which]
}

/// One gateway under test, and where its events and sync records go.
struct Gw {
    p: Pipeline,
    tcp: Arc<CompiledService>,
    udp: Arc<CompiledService>,
    events: Arc<FlowEvents>,
    sync: Arc<SyncQueue>,
}

fn service(protocol: Protocol, port: u16, weights: [u32; 2]) -> Service<Ipv4Addr> {
    let backends: Vec<_> = BACKENDS
        .iter()
        .zip(weights)
        .filter(|&(_, w)| w != u32::MAX)
        .map(|(&a, w)| (a, 8080, w))
        .collect();
    rr_service(VIP, protocol, port, &backends)
}

impl Gw {
    /// TCP 80 and UDP 53 over both backends (rr, full NAT); the first
    /// backend's next hop known, the second's not.
    fn new(express: bool) -> Gw {
        let mut p = Pipeline::new(
            PipelineConfig {
                snat_addrs: vec![SNAT],
                snat_ports: PortRange {
                    first: 2000,
                    last: 2063,
                },
                ..config()
            },
            0,
        );
        p.set_express(express);
        p.own(VIP);
        let tcp = Arc::new(CompiledService::new(
            1,
            &service(Protocol::Tcp, 80, [1, 1]),
            1,
            None,
        ));
        let udp = Arc::new(CompiledService::new(
            2,
            &service(Protocol::Udp, 53, [1, 1]),
            1,
            None,
        ));
        p.upsert_service(tcp.clone());
        p.upsert_service(udp.clone());
        let events = Arc::new(FlowEvents::default());
        let sync = Arc::new(SyncQueue::new(1 << 16));
        p.set_events(events.clone());
        p.set_sync(Some(sync.clone()));
        let mut gw = Gw {
            p,
            tcp,
            udp,
            events,
            sync,
        };
        gw.arp(0, 0);
        gw
    }

    /// An ARP reply from backend `b`, from MAC `which`.
    fn arp(&mut self, b: usize, which: u8) -> (Verdict, Vec<u8>) {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&GW_MAC);
        f[6..12].copy_from_slice(&mac(which));
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 2]);
        f[22..28].copy_from_slice(&mac(which));
        f[28..32].copy_from_slice(&BACKENDS[b].octets());
        f[32..38].copy_from_slice(&GW_MAC);
        f[38..42].copy_from_slice(&SNAT.octets());
        run(&mut self.p, &f, 0)
    }

    /// Both services again with these weights (`u32::MAX`: removed).
    fn set_backends(&mut self, weights: [u32; 2]) {
        for (svc, protocol, port) in [
            (&mut self.tcp, Protocol::Tcp, 80),
            (&mut self.udp, Protocol::Udp, 53),
        ] {
            let next = service(protocol, port, weights);
            *svc = Arc::new(CompiledService::update(svc, &next, true, None));
            self.p.upsert_service(svc.clone());
        }
    }

    /// `frames` through the gateway at `now`, one at a time or as one
    /// batch the worker's way: each verdict and frame as sent.
    fn send(&mut self, frames: &[Vec<u8>], batched: bool, now: u32) -> Vec<(Verdict, Vec<u8>)> {
        let out = if batched {
            let prepared: Vec<Prepared> = frames.iter().map(|f| Prepared::of(f)).collect();
            let mut looked = vec![Lookup::NotYet; frames.len()];
            self.p.lookup_prepared(&prepared, &mut looked);
            frames
                .iter()
                .zip(&prepared)
                .zip(&looked)
                .map(|((f, prep), &look)| {
                    let mut buf = vec![0u8; 2048];
                    buf[..f.len()].copy_from_slice(f);
                    let v = self
                        .p
                        .process_prepared(Side::Client, &mut buf, now, prep, look);
                    sent(v, buf)
                })
                .collect()
        } else {
            frames.iter().map(|f| run(&mut self.p, f, now)).collect()
        };
        self.p.flush_sync();
        out
    }

    /// Everything else either gateway shows: its flows, the services'
    /// traffic counters, its events and its sync records.
    fn state(&self, now: u32) -> String {
        let (flows, _) = self
            .p
            .dump(&Filter::default(), Family::V4, 0, u32::MAX, now);
        let mut events = Vec::new();
        self.events.drain(&mut events);
        let mut records = Vec::new();
        while let Some(r) = self.sync.pop() {
            records.push(r);
        }
        format!(
            "flows {flows:?}\ntcp {:?}\nudp {:?}\nevents {events:?}\nsync {records:?}",
            self.tcp.totals(),
            self.udp.totals()
        )
    }
}

/// The frame as sent: its first `len` bytes, none if nothing is sent.
fn sent(v: Verdict, mut buf: Vec<u8>) -> (Verdict, Vec<u8>) {
    let len = match v {
        Verdict::Forward { len, .. } | Verdict::Answer(len) => len,
        _ => 0,
    };
    buf.truncate(len);
    (v, buf)
}

/// Counters without the express lane's own, which only one gateway has.
fn general(c: &Counters) -> Counters {
    Counters { express: 0, ..*c }
}

/// A TCP or UDP frame's source and destination.
type Ends = ((Ipv4Addr, u16), (Ipv4Addr, u16));

/// A packet of the random traffic.
#[derive(Debug, Clone)]
enum Packet {
    /// From the client's port `port` (of four) to the VIP.
    Client {
        port: u8,
        udp: bool,
        flags: u8,
        ttl: u8,
    },
    /// The backend's answer on the flow of the client's port `port`, from
    /// MAC `mac` (see [`mac`]).
    Reply {
        port: u8,
        udp: bool,
        flags: u8,
        ttl: u8,
        mac: u8,
    },
}

#[derive(Debug, Clone)]
enum Step {
    Packets {
        packets: Vec<Packet>,
        batched: bool,
    },
    /// Backend weights (`u32::MAX`: removed).
    Backends([u32; 2]),
    /// An ARP reply from backend `b` from MAC `mac`.
    Arp {
        b: usize,
        mac: u8,
    },
    /// `expire_nodest_conn` on or off.
    ExpireNodest(bool),
    /// Seconds pass.
    Wait(u32),
}

fn flags() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => Just(ACK),
        3 => Just(PSH | ACK),
        2 => Just(SYN),
        1 => Just(SYN | ACK),
        1 => Just(FIN | ACK),
        1 => Just(RST),
        1 => Just(RST | ACK),
    ]
}

fn ttl() -> impl Strategy<Value = u8> {
    prop_oneof![9 => Just(64u8), 1 => Just(1u8)]
}

fn packet() -> impl Strategy<Value = Packet> {
    prop_oneof![
        (0..4u8, any::<bool>(), flags(), ttl()).prop_map(|(port, udp, flags, ttl)| {
            Packet::Client {
                port,
                udp,
                flags,
                ttl,
            }
        }),
        (
            0..4u8,
            any::<bool>(),
            flags(),
            ttl(),
            prop_oneof![4 => 0..2u8, 1 => Just(2u8)]
        )
            .prop_map(|(port, udp, flags, ttl, mac)| Packet::Reply {
                port,
                udp,
                flags,
                ttl,
                mac
            }),
    ]
}

fn weight() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(1u32), 1 => Just(0u32), 1 => Just(u32::MAX)]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (prop::collection::vec(packet(), 1..6), any::<bool>())
            .prop_map(|(packets, batched)| Step::Packets { packets, batched }),
        2 => [weight(), weight()].prop_map(Step::Backends),
        1 => (0..2usize, 0..3u8).prop_map(|(b, mac)| Step::Arp { b, mac }),
        2 => any::<bool>().prop_map(Step::ExpireNodest),
        1 => prop_oneof![Just(1u32), Just(130)].prop_map(Step::Wait),
    ]
}

/// The frames of `packets`: a reply answers what the gateway last sent
/// to a backend for that client port (or goes to a SNAT port no flow
/// has, before there was any).
fn frames(packets: &[Packet], last: &[Option<Ends>; 8]) -> Vec<Vec<u8>> {
    packets
        .iter()
        .map(|p| match *p {
            Packet::Client {
                port,
                udp: u,
                flags,
                ttl,
            } => {
                let src = (CLIENT, 40_000 + u16::from(port));
                if u {
                    let mut f = udp(CLIENT_MAC, src, (VIP, 53));
                    set_ttl(&mut f, ttl);
                    f
                } else {
                    tcp(CLIENT_MAC, src, (VIP, 80), flags, ttl)
                }
            }
            Packet::Reply {
                port,
                udp: u,
                flags,
                ttl,
                mac: m,
            } => {
                let (to, from) = last[usize::from(port) + 4 * usize::from(u)]
                    .unwrap_or(((SNAT, 2999), (BACKENDS[0], 8080)));
                if u {
                    let mut f = udp(mac(m), from, to);
                    set_ttl(&mut f, ttl);
                    f
                } else {
                    tcp(mac(m), from, to, flags, ttl)
                }
            }
        })
        .collect()
}

/// Sets an IPv4 frame's TTL, keeping its header checksum right.
fn set_ttl(f: &mut [u8], ttl: u8) {
    f[22] = ttl;
    let mut h = smoltcp::wire::Ipv4Packet::new_unchecked(&mut f[14..34]);
    h.fill_checksum();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_express_lane_and_the_general_path_agree(steps in prop::collection::vec(step(), 1..40)) {
        let (mut a, mut b) = (Gw::new(true), Gw::new(false));
        let mut last = [None; 8];
        let mut now = 1;
        for s in &steps {
            match s {
                Step::Packets { packets, batched } => {
                    let fs = frames(packets, &last);
                    let (ra, rb) = (a.send(&fs, *batched, now), b.send(&fs, *batched, now));
                    prop_assert_eq!(&ra, &rb, "{:?}", s);
                    for (p, (v, out)) in packets.iter().zip(&ra) {
                        if let (Packet::Client { port, udp, .. }, Verdict::Forward { to: Side::Backend, .. }) = (p, v) {
                            last[usize::from(*port) + 4 * usize::from(*udp)] = Some(ends(out));
                        }
                    }
                }
                Step::Backends(w) => {
                    a.set_backends(*w);
                    b.set_backends(*w);
                }
                Step::Arp { b: which, mac } => {
                    prop_assert_eq!(a.arp(*which, *mac), b.arp(*which, *mac));
                }
                Step::ExpireNodest(on) => {
                    let rules = ConnRules { expire_nodest_conn: *on, ..ConnRules::default() };
                    a.p.set_rules(rules, UnknownPort::Drop);
                    b.p.set_rules(rules, UnknownPort::Drop);
                }
                Step::Wait(secs) => now += secs,
            }
            prop_assert_eq!(general(a.p.counters()), general(b.p.counters()), "{:?}", s);
            prop_assert_eq!(b.p.counters().express, 0);
        }
        prop_assert_eq!(a.state(now), b.state(now));
    }
}

/// The lane is taken: every packet of an established flow, both ways,
/// once the backend's next hop is cached; the first packet of a flow,
/// its SYN, and a reply from a MAC not yet cached are not.
#[test]
fn established_packets_both_ways_take_the_express_lane() {
    let mut g = Gw::new(true);
    let syn = tcp(CLIENT_MAC, (CLIENT, 40_000), (VIP, 80), SYN, 64);
    let (v, out) = run(&mut g.p, &syn, 1);
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
    assert_eq!(
        g.p.counters().express,
        0,
        "a new flow takes the general path"
    );
    let (snat, backend) = ends(&out);
    assert_eq!(backend.0, BACKENDS[0]);
    // The SYN-ACK teaches the backend's MAC (general path); from then on
    // both directions are express.
    run(&mut g.p, &tcp(mac(0), backend, snat, SYN | ACK, 64), 1);
    assert_eq!(g.p.counters().express, 0);
    for i in 0..10 {
        let (v, _) = run(
            &mut g.p,
            &tcp(CLIENT_MAC, (CLIENT, 40_000), (VIP, 80), PSH | ACK, 64),
            1,
        );
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
        let (v, _) = run(&mut g.p, &tcp(mac(0), backend, snat, PSH | ACK, 64), 1);
        assert!(
            matches!(
                v,
                Verdict::Forward {
                    to: Side::Client,
                    ..
                }
            ),
            "{v:?}"
        );
        assert_eq!(g.p.counters().express, 2 * (i + 1));
    }
    // A reply from another MAC is learned on the general path.
    run(&mut g.p, &tcp(mac(2), backend, snat, ACK, 64), 1);
    assert_eq!(g.p.counters().express, 20);
    assert_eq!(g.p.counters().forwarded, 23);
}
