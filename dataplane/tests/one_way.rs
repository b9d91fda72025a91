//! Direct routing and tunnels through the pipeline on byte fixtures: the
//! client's packet leaves with its ends untouched (route: new MACs and
//! TTL; tunnel: an outer header to the backend), the flow is one-way, and
//! a packet that no longer fits the backend link once wrapped is answered
//! with fragmentation needed carrying the reduced MTU.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

#[path = "fixtures/fixtures.rs"]
mod fixtures;

use std::net::Ipv4Addr;
use std::sync::Arc;

use fixtures::*;
use support::{config, rr_service, run};
use xvs_config::{Encap, ForwardMethod, Protocol};
use xvs_conntrack::{FlowKey, L4Proto};
use xvs_dataplane::pipeline::{Pipeline, PipelineConfig, Side, Verdict};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::wire::{classify, Frame, L4};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
const SNAT: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);

/// A pipeline serving VIP:80 over one backend forwarded by `forward`
/// (and `encap`), on a backend link of `mtu` bytes.
fn pipeline(forward: ForwardMethod, encap: Encap, mtu: u16) -> Pipeline {
    let mut p = Pipeline::new(
        PipelineConfig {
            snat_addrs: vec![SNAT],
            backend_mtu: mtu,
            ..config()
        },
        0,
    );
    p.own(VIP);
    let mut s = rr_service(VIP, Protocol::Tcp, 80, &[(BACKEND, 80, 1)]);
    s.backends[0].forward = forward;
    s.backends[0].encap = encap;
    p.upsert_service(Arc::new(CompiledService::new(1, &s, 1, None)));
    assert_eq!(run(&mut p, ARP_REPLY_FROM_BACKEND, 0).0, Verdict::Consumed);
    p
}

fn ipv4(frame: &[u8]) -> xvs_dataplane::wire::Ipv4 {
    match classify(frame) {
        Ok(Frame::Ipv4(ip)) => ip,
        other => panic!("{other:?}"),
    }
}

#[test]
fn direct_routing_changes_only_the_macs_and_the_ttl() {
    let mut p = pipeline(ForwardMethod::Route, Encap::Ipip, 1500);
    let (v, out) = run(&mut p, TCP_SYN, 1);
    assert_eq!(
        v,
        Verdict::Forward {
            len: TCP_SYN.len(),
            to: Side::Backend
        }
    );
    let (a, b) = (ipv4(TCP_SYN), ipv4(&out));
    assert_eq!((b.src, b.dst, b.l4), (a.src, a.dst, a.l4));
    assert_eq!(b.ttl, a.ttl - 1);
    assert_eq!(&out[34..], &TCP_SYN[34..]);
    // One-way: only the client's key is tracked.
    let f = p.v4.table.iter().next().unwrap();
    assert!(f.is_one_way());
    assert_eq!(p.v4.table.len(), 1);
    let reply = FlowKey::between(f.backend(), f.snat(), L4Proto::Tcp);
    assert_eq!(p.v4.table.lookup(&reply), None);
}

#[test]
fn tunnels_wrap_the_packet_for_the_backend() {
    for (encap, over) in [(Encap::Ipip, 20), (Encap::Gue, 28)] {
        let mut p = pipeline(ForwardMethod::Tunnel, encap, 1500);
        let (v, out) = run(&mut p, TCP_SYN, 1);
        assert_eq!(
            v,
            Verdict::Forward {
                len: TCP_SYN.len() + over,
                to: Side::Backend
            },
            "{encap}"
        );
        // From the first SNAT address (no tunnel.source) to the backend,
        // its header checksum right.
        let outer = smoltcp::wire::Ipv4Packet::new_checked(&out[14..]).unwrap();
        assert!(outer.verify_checksum());
        assert_eq!((outer.src_addr(), outer.dst_addr()), (SNAT, BACKEND));
        match encap {
            Encap::Ipip => assert_eq!(u8::from(outer.next_header()), 4),
            Encap::Gue => assert!(matches!(ipv4(&out).l4, L4::Udp { dst_port: 6080, .. })),
        }
        let inner = [&out[..14], &out[14 + over..]].concat();
        let (a, b) = (ipv4(TCP_SYN), ipv4(&inner));
        assert_eq!((b.src, b.dst, b.l4, b.ttl), (a.src, a.dst, a.l4, a.ttl - 1));
    }
}

#[test]
fn what_no_longer_fits_gets_fragmentation_needed_with_the_reduced_mtu() {
    let ip_len = TCP_SYN.len() - 14;
    // A link just too small for the wrapped SYN.
    let mut p = pipeline(ForwardMethod::Tunnel, Encap::Ipip, (ip_len + 19) as u16);
    let (v, out) = run(&mut p, TCP_SYN, 1);
    assert!(matches!(v, Verdict::Answer(_)), "{v:?}");
    let icmp = ipv4(&out);
    // From the VIP back to the client, type 3 code 4, next-hop MTU.
    assert_eq!((icmp.src, icmp.dst), (VIP, ipv4(TCP_SYN).src));
    let at = 14 + 20;
    assert_eq!((out[at], out[at + 1]), (3, 4));
    assert_eq!(
        u16::from_be_bytes([out[at + 6], out[at + 7]]),
        (ip_len - 1) as u16
    );
    assert_eq!(p.counters().too_big, 1);
}

/// A router on the client's side answers a backend's direct reply with
/// fragmentation needed, to the VIP: the error goes to the flow's backend
/// the flow's way (IPVS passes it to the real server), unchanged but for
/// the TTL, so the backend's PMTU towards the client shrinks.
#[test]
fn icmp_errors_about_direct_replies_go_to_the_backend_the_flow_s_way() {
    let error = ICMP_FRAG_NEEDED_ABOUT_DIRECT_REPLY;
    for (forward, over) in [(ForwardMethod::Route, 0), (ForwardMethod::Tunnel, 20)] {
        let mut p = pipeline(forward, Encap::Ipip, 1500);
        run(&mut p, TCP_SYN, 1);
        let (v, out) = run(&mut p, error, 2);
        assert_eq!(
            v,
            Verdict::Forward {
                len: error.len() + over,
                to: Side::Backend
            },
            "{forward}"
        );
        let inner = [&out[..14], &out[14 + over..]].concat();
        let (a, b) = (ipv4(error), ipv4(&inner));
        assert_eq!((b.src, b.dst, b.l4), (a.src, a.dst, a.l4), "{forward}");
        assert_eq!(b.ttl, a.ttl - 1);
        assert_eq!(&inner[34..], &error[34..]);
    }
    // No flow: dropped, counted.
    let mut p = pipeline(ForwardMethod::Route, Encap::Ipip, 1500);
    let (v, _) = run(&mut p, error, 2);
    assert!(matches!(v, Verdict::Drop(_)), "{v:?}");
}

/// The outer source: `tunnel.source` when given, and with
/// `tunnel.client_source_net` (Katran's trick) that network's prefix with
/// the client's low bits, so a backend's RSS spreads clients.
#[test]
fn the_outer_source_is_the_configured_one_or_derived_from_the_client() {
    let client = ipv4(TCP_SYN).src;
    for (tunnel, want) in [
        (
            xvs_config::Tunnel {
                source: Some(Ipv4Addr::new(198, 18, 1, 250)),
                ..Default::default()
            },
            Ipv4Addr::new(198, 18, 1, 250),
        ),
        (
            xvs_config::Tunnel {
                client_source_net: Some("198.18.240.0/20".parse().unwrap()),
                ..Default::default()
            },
            Ipv4Addr::from(
                u32::from(Ipv4Addr::new(198, 18, 240, 0)) | (u32::from(client) & 0x0fff),
            ),
        ),
    ] {
        let mut p = Pipeline::new(
            PipelineConfig {
                snat_addrs: vec![SNAT],
                tunnel,
                ..config()
            },
            0,
        );
        p.own(VIP);
        let mut s = rr_service(VIP, Protocol::Tcp, 80, &[(BACKEND, 80, 1)]);
        s.backends[0].forward = ForwardMethod::Tunnel;
        p.upsert_service(Arc::new(CompiledService::new(1, &s, 1, None)));
        run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
        let (_, out) = run(&mut p, TCP_SYN, 1);
        let outer = smoltcp::wire::Ipv4Packet::new_checked(&out[14..]).unwrap();
        assert_eq!((outer.src_addr(), outer.dst_addr()), (want, BACKEND));
    }
}
