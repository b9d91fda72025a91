//! The pipeline over IPv6 on byte fixtures (`fixtures/gen6.py`), beside
//! IPv4 in the same pipeline: a flow through full NAT and back (with
//! extension headers too), neighbour discovery both ways, echo, REJECT,
//! the hop-limit answer, packet too big translated for PMTU discovery, and
//! every refusal counted by its reason.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

#[path = "fixtures/fixtures.rs"]
mod fixtures;
#[path = "fixtures/fixtures6.rs"]
mod fixtures6;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use fixtures6::*;
use support::{config, rr_service, run};
use xvs_config::{Protocol, Service, UnknownPort};
use xvs_dataplane::pipeline::{Pipeline, PipelineConfig, Side, Verdict};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::wire::DropReason;

const VIP4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const BACKEND4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);

fn a6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn vip() -> Ipv6Addr {
    a6("2001:2:ff::1")
}

fn backend() -> Ipv6Addr {
    a6("2001:2:0:1::1")
}

/// TCP 80 to port 8080 or UDP 53 to port 5353, rr over `backend`.
fn service<A: xvs_config::Address>(vip: A, backend: A, proto: Protocol, weight: u32) -> Service<A> {
    let (port, backend_port) = match proto {
        Protocol::Tcp => (80, 8080),
        Protocol::Udp => (53, 5353),
    };
    rr_service(vip, proto, port, &[(backend, backend_port, weight)])
}

/// A dual-stack pipeline: the IPv4 fixtures' services and the IPv6 ones,
/// backends of weight `weight`.
fn pipeline(weight: u32, unknown_port: UnknownPort) -> Pipeline {
    let mut p = Pipeline::new(
        PipelineConfig {
            snat_addrs: vec![Ipv4Addr::new(198, 18, 2, 1)],
            snat_addrs6: vec![a6("2001:2:0:2::1")],
            unknown_port,
            ..config()
        },
        0,
    );
    p.own(vip());
    p.own(VIP4);
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    for proto in [Protocol::Tcp, Protocol::Udp] {
        let s6 = service(vip(), backend(), proto, weight);
        p.upsert_service(Arc::new(CompiledService::new(next(), &s6, 1, None)));
        let s4 = service(VIP4, BACKEND4, proto, weight);
        p.upsert_service(Arc::new(CompiledService::new(next(), &s4, 1, None)));
    }
    p
}

fn forward(to: Side, out: &[u8]) -> Verdict {
    Verdict::Forward { len: out.len(), to }
}

#[test]
fn an_ipv6_tcp_flow_through_full_nat_and_back_beside_an_ipv4_one() {
    let mut p = pipeline(1, UnknownPort::Drop);
    // Both next hops learned: the IPv6 backend from its advertisement,
    // the IPv4 one from its ARP reply.
    assert_eq!(run(&mut p, NA6_FROM_BACKEND, 0).0, Verdict::Consumed);
    let arp = fixtures::ARP_REPLY_FROM_BACKEND;
    assert_eq!(run(&mut p, arp, 0).0, Verdict::Consumed);

    let (v, out) = run(&mut p, TCP6_SYN, 1);
    assert_eq!(v, forward(Side::Backend, TCP6_SYN_FORWARDED));
    assert_eq!(out, TCP6_SYN_FORWARDED);
    let (v, out) = run(&mut p, TCP6_REPLY, 1);
    assert_eq!(v, forward(Side::Client, TCP6_REPLY_FORWARDED));
    assert_eq!(out, TCP6_REPLY_FORWARDED);
    // The IPv4 flow of the same ports, side by side.
    let (v, out) = run(&mut p, fixtures::TCP_SYN, 1);
    assert_eq!(out, fixtures::TCP_SYN_FORWARDED, "{v:?}");
    assert_eq!((p.v6.table.len(), p.v4.table.len()), (1, 1));
    assert_eq!(p.flows(), 2);
    assert_eq!(p.counters().new_flows, 2);
    // UDP (on a fresh pipeline: its first SNAT port is the fixture's).
    let mut p = pipeline(1, UnknownPort::Drop);
    run(&mut p, NA6_FROM_BACKEND, 0);
    let (v, out) = run(&mut p, UDP6, 1);
    assert_eq!(v, forward(Side::Backend, UDP6_FORWARDED));
    assert_eq!(out, UDP6_FORWARDED);
    // Its next datagram is established: the express lane's, byte for
    // byte the same.
    assert_eq!(p.counters().express, 0);
    let (v, out) = run(&mut p, UDP6, 1);
    assert_eq!(v, forward(Side::Backend, UDP6_FORWARDED));
    assert_eq!(out, UDP6_FORWARDED);
    assert_eq!(p.counters().express, 1);
}

#[test]
fn extension_headers_are_walked_and_kept() {
    let mut p = pipeline(1, UnknownPort::Drop);
    run(&mut p, NA6_FROM_BACKEND, 0);
    let (v, out) = run(&mut p, TCP6_SYN_EXT, 1);
    assert_eq!(v, forward(Side::Backend, TCP6_SYN_EXT_FORWARDED));
    assert_eq!(out, TCP6_SYN_EXT_FORWARDED);
}

#[test]
fn neighbour_discovery_answers_for_the_vip_and_resolves_from_an_empty_cache() {
    let mut p = pipeline(1, UnknownPort::Drop);
    let (v, out) = run(&mut p, NS6_FOR_VIP, 0);
    assert_eq!(v, Verdict::Answer(NA6_FROM_VIP.len()));
    assert_eq!(out, NA6_FROM_VIP);
    // The backend is not known yet: the SYN is held (run again once the
    // backend answers) and a solicitation for it is queued, once.
    assert_eq!(run(&mut p, TCP6_SYN, 1).0, Verdict::Unresolved);
    let queued: Vec<IpAddr> = std::iter::from_fn(|| p.next_arp()).collect();
    assert!(queued.contains(&IpAddr::V6(backend())), "{queued:?}");
    let mut buf = [0u8; 128];
    let n = p
        .build_arp_request(&mut buf, IpAddr::V6(backend()))
        .unwrap();
    assert_eq!(&buf[..n], NS6_FOR_BACKEND);
    run(&mut p, NA6_FROM_BACKEND, 1);
    let (_, out) = run(&mut p, TCP6_SYN, 2);
    assert_eq!(out, TCP6_SYN_FORWARDED);
    // Not for an address xvs owns, or not from a neighbour: refused.
    let mut other = NS6_FOR_VIP.to_vec();
    other[54 + 8 + 15] ^= 1; // the target
    assert_eq!(
        run(&mut p, &other, 2).0,
        Verdict::Drop(DropReason::NdpMalformed),
        "the group no longer matches the target"
    );
    assert_eq!(
        run(&mut p, NS6_HOP_64, 2).0,
        Verdict::Drop(DropReason::NdpMalformed)
    );
}

#[test]
fn echo_requests_to_the_vip_are_answered() {
    let mut p = pipeline(1, UnknownPort::Drop);
    let (v, out) = run(&mut p, ECHO6_REQUEST, 0);
    assert_eq!(v, Verdict::Answer(ECHO6_REPLY.len()));
    assert_eq!(out, ECHO6_REPLY);
}

#[test]
fn no_eligible_backend_is_a_rst_or_a_port_unreachable() {
    let mut p = pipeline(0, UnknownPort::Drop);
    let (v, out) = run(&mut p, TCP6_SYN, 0);
    assert_eq!(v, Verdict::Answer(TCP6_RST_FOR_SYN.len()));
    assert_eq!(out, TCP6_RST_FOR_SYN);
    let (v, out) = run(&mut p, UDP6, 0);
    assert_eq!(v, Verdict::Answer(UDP6_PORT_UNREACHABLE.len()));
    assert_eq!(out, UDP6_PORT_UNREACHABLE);
    assert_eq!(p.counters().rejected, 2);
    assert!(p.v6.table.is_empty());
}

#[test]
fn hop_limit_one_is_answered_with_time_exceeded_and_creates_nothing() {
    let mut p = pipeline(1, UnknownPort::Drop);
    let (v, out) = run(&mut p, TCP6_HOP1, 0);
    assert_eq!(v, Verdict::Answer(TCP6_HOP1_TIME_EXCEEDED.len()));
    assert_eq!(out, TCP6_HOP1_TIME_EXCEEDED);
    assert!(p.v6.table.is_empty());
    assert_eq!(p.counters().time_exceeded, 1);
}

#[test]
fn packet_too_big_about_a_flow_reaches_the_client_translated() {
    for (ptb, translated) in [
        (PTB6_FULL, PTB6_FULL_TRANSLATED),
        (PTB6_QUOTE8, PTB6_QUOTE8_TRANSLATED),
    ] {
        let mut p = pipeline(1, UnknownPort::Drop);
        run(&mut p, NA6_FROM_BACKEND, 0);
        // The client's MAC is known from its SYN.
        assert_eq!(run(&mut p, TCP6_SYN, 1).1, TCP6_SYN_FORWARDED);
        let mut buf = vec![0u8; 2048];
        buf[..ptb.len()].copy_from_slice(ptb);
        let v = p.process_on(Side::Backend, &mut buf, ptb.len(), 1);
        assert_eq!(v, forward(Side::Client, translated));
        assert_eq!(&buf[..translated.len()], translated);
    }
}

#[test]
fn what_cannot_be_served_is_dropped_by_its_reason() {
    let mut p = pipeline(1, UnknownPort::Drop);
    for (frame, why) in [
        (UDP6_ZERO_CHECKSUM, DropReason::UdpZeroChecksum),
        (UDP6_FRAGMENT, DropReason::Fragment),
        (IPV6_UNKNOWN_HEADER, DropReason::Ipv6UnknownHeader),
        (IPV6_ROUTING_LEFT, DropReason::Ipv6RoutingHeader),
        (IPV6_TRUNCATED, DropReason::Ipv6Truncated),
        (IPV6_PAYLOAD_LONG, DropReason::Ipv6Malformed),
    ] {
        assert_eq!(run(&mut p, frame, 0).0, Verdict::Drop(why), "{why}");
        assert_eq!(p.counters().drops[why.index()], 1, "{why}");
    }
    assert!(p.v6.table.is_empty());
}

/// Direct routing and IPv6-in-IPv6 over IPv6: the SYN reaches the backend
/// as the client sent it but for the hop limit (route) or inside an outer
/// IPv6 header from the first IPv6 SNAT address (tunnel), on a one-way
/// flow; a backend link too small answers packet too big.
#[test]
fn ipv6_direct_routing_and_tunnels_keep_the_client_s_packet() {
    let make = |forward, mtu| {
        let mut p = Pipeline::new(
            PipelineConfig {
                snat_addrs: vec![Ipv4Addr::new(198, 18, 2, 1)],
                snat_addrs6: vec![a6("2001:2:0:2::1")],
                backend_mtu: mtu,
                ..config()
            },
            0,
        );
        p.own(vip());
        let mut s = rr_service(vip(), Protocol::Tcp, 80, &[(backend(), 80, 1)]);
        s.backends[0].forward = forward;
        p.upsert_service(Arc::new(CompiledService::new(1, &s, 1, None)));
        run(&mut p, NA6_FROM_BACKEND, 0);
        p
    };
    let mut p = make(xvs_config::ForwardMethod::Route, 1500);
    let (v, out) = run(&mut p, TCP6_SYN, 1);
    assert_eq!(v, forward(Side::Backend, TCP6_SYN));
    assert_eq!(&out[14..21], &TCP6_SYN[14..21]);
    assert_eq!(out[21], TCP6_SYN[21] - 1, "hop limit");
    assert_eq!(&out[22..], &TCP6_SYN[22..]);
    assert!(p.v6.table.iter().next().unwrap().is_one_way());

    let mut p = make(xvs_config::ForwardMethod::Tunnel, 1500);
    let (v, out) = run(&mut p, TCP6_SYN, 1);
    assert_eq!(
        v,
        Verdict::Forward {
            len: TCP6_SYN.len() + 40,
            to: Side::Backend
        }
    );
    let outer = smoltcp::wire::Ipv6Packet::new_checked(&out[14..]).unwrap();
    assert_eq!(u8::from(outer.next_header()), 41);
    assert_eq!(
        (outer.src_addr(), outer.dst_addr()),
        (a6("2001:2:0:2::1"), backend())
    );
    assert_eq!(&out[54 + 8..], &TCP6_SYN[22..]);

    let small = (TCP6_SYN.len() - 14 + 39) as u16;
    let mut p = make(xvs_config::ForwardMethod::Tunnel, small);
    let (v, out) = run(&mut p, TCP6_SYN, 1);
    assert!(matches!(v, Verdict::Answer(_)), "{v:?}");
    assert_eq!((out[54], out[55]), (2, 0), "packet too big");
    assert_eq!(p.counters().too_big, 1);
}

/// A takeover's announcement of an IPv6 address: an unsolicited neighbour
/// advertisement (override set) to all nodes, from the address, with our
/// Ethernet address; it parses as neighbour discovery does.
#[test]
fn an_unsolicited_advertisement_announces_a_taken_address() {
    use xvs_dataplane::wire::{classify, Frame, L4};
    let p = pipeline(1, UnknownPort::Drop);
    let addr: Ipv6Addr = "2001:2:0:1::100".parse().unwrap();
    let mut buf = [0u8; 128];
    let n = p
        .build_announcement(&mut buf, IpAddr::V6(addr), Side::Backend)
        .unwrap();
    assert_eq!(&buf[0..6], &[0x33, 0x33, 0, 0, 0, 1], "to all nodes");
    assert_eq!(&buf[6..12], &support::GW_MAC);
    let Ok(Frame::Ipv6(ip)) = classify(&buf[..n]) else {
        panic!("not IPv6: {:?}", &buf[..n])
    };
    assert_eq!((ip.src, ip.dst), (addr, "ff02::1".parse().unwrap()));
    let L4::Neighbour(na) = ip.l4 else {
        panic!("not neighbour discovery")
    };
    assert!(!na.solicit);
    assert_eq!(na.target, addr);
    assert_eq!(na.lladdr.map(|m| m.0), Some(support::GW_MAC));
    // Override set, solicited not: the flags byte after the type, code
    // and checksum.
    assert_eq!(buf[54 + 4] & 0xe0, 0x20);
}
