//! Property tests of the IPv6 packet core: after forwarding through full
//! NAT, every incrementally updated checksum of a random TCP or UDP packet
//! (with random extension headers before it) equals a full recomputation
//! (smoltcp's `verify_checksum` over the IPv6 pseudo-header is the
//! oracle), and so does an ICMPv6 error's after translation; no input
//! makes anything panic.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::Ipv6Addr;

use proptest::prelude::*;
use smoltcp::wire::{EthernetAddress, IpAddress, IpProtocol, TcpPacket, UdpPacket};
use xvs_dataplane::wire::ndp::{icmpv6_checksum, l4_checksum6};
use xvs_dataplane::wire::{classify, nat6, Endpoint, Frame, IcmpErrorNat, Ipv6, Nat, L4};

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

type Ep = Endpoint<Ipv6Addr>;

fn endpoint() -> impl Strategy<Value = Ep> {
    (any::<u128>(), any::<u16>()).prop_map(|(a, port)| Endpoint {
        addr: Ipv6Addr::from(a),
        port,
    })
}

fn sum_into(seg: &mut [u8], at: usize, src: Ipv6Addr, dst: Ipv6Addr, proto: IpProtocol) {
    seg[at..at + 2].fill(0);
    let c = l4_checksum6(src, dst, proto, seg);
    let c = if c == 0 && proto == IpProtocol::Udp {
        0xffff
    } else {
        c
    };
    seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// TCP or UDP from `src` to `dst` with `payload`, checksum filled.
fn segment(tcp: bool, src: Ep, dst: Ep, payload: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; if tcp { 20 } else { 8 }];
    s[0..2].copy_from_slice(&src.port.to_be_bytes());
    s[2..4].copy_from_slice(&dst.port.to_be_bytes());
    if tcp {
        s[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        s[12] = 5 << 4;
        s[13] = 0x18;
    } else {
        s[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    }
    s.extend_from_slice(payload);
    let (at, proto) = if tcp {
        (16, IpProtocol::Tcp)
    } else {
        (6, IpProtocol::Udp)
    };
    sum_into(&mut s, at, src.addr, dst.addr, proto);
    s
}

/// An Ethernet frame: IPv6 from `src` to `dst`, then `exts` extension
/// headers (hop-by-hop first, then destination options; each with PadN
/// of `pad` 8-byte units), then `upper` of protocol `nh`.
fn frame(src: Ipv6Addr, dst: Ipv6Addr, hop: u8, exts: &[u8], nh: u8, upper: &[u8]) -> Vec<u8> {
    let mut ext = Vec::new();
    for (i, &units) in exts.iter().enumerate() {
        let next = if i + 1 < exts.len() { 60 } else { nh };
        let len = (usize::from(units) + 1) * 8;
        let mut h = vec![next, units, 1, (len - 4) as u8];
        h.resize(len, 0);
        ext.extend(h);
    }
    let first = if exts.is_empty() { nh } else { 0 };
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
    f.extend([0x60, 0, 0, 0]);
    f.extend(((ext.len() + upper.len()) as u16).to_be_bytes());
    f.extend([first, hop]);
    f.extend(src.octets());
    f.extend(dst.octets());
    f.extend(ext);
    f.extend(upper);
    f
}

fn classified(frame: &[u8]) -> Ipv6 {
    match classify(frame) {
        Ok(Frame::Ipv6(ip)) => ip,
        other => panic!("{other:?}"),
    }
}

fn ip6(a: Ipv6Addr) -> IpAddress {
    IpAddress::Ipv6(a)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn forwarding_keeps_the_l4_checksum_equal_to_a_full_recomputation(
        tcp in any::<bool>(),
        src in endpoint(),
        dst in endpoint(),
        nat_src in endpoint(),
        nat_dst in endpoint(),
        payload in prop::collection::vec(any::<u8>(), 0..80),
        hop in 2u8..=255,
        exts in prop::collection::vec(0u8..3, 0..3),
    ) {
        let seg = segment(tcp, src, dst, &payload);
        let mut f = frame(src.addr, dst.addr, hop, &exts, if tcp { 6 } else { 17 }, &seg);
        let ip = classified(&f);
        let nat = Nat { src: nat_src, dst: nat_dst };
        nat6::forward6(&mut f, &ip, &nat, MAC_A, MAC_B).unwrap();
        let after = classified(&f);
        prop_assert_eq!((after.src, after.dst, after.hop_limit), (nat_src.addr, nat_dst.addr, hop - 1));
        let l4 = &f[after.l4_offset()..after.end()];
        let (s, d) = (ip6(nat_src.addr), ip6(nat_dst.addr));
        if tcp {
            prop_assert!(TcpPacket::new_unchecked(l4).verify_checksum(&s, &d));
        } else {
            let u = UdpPacket::new_unchecked(l4);
            prop_assert_ne!(u.checksum(), 0, "never 'no checksum' over IPv6");
            prop_assert!(u.verify_checksum(&s, &d));
        }
        let ports = match after.l4 {
            L4::Tcp { src_port, dst_port, .. } | L4::Udp { src_port, dst_port } => (src_port, dst_port),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(ports, (nat_src.port, nat_dst.port));
    }

    #[test]
    fn an_icmpv6_error_translated_keeps_every_checksum_right(
        tcp in any::<bool>(),
        inner_src in endpoint(),
        inner_dst in endpoint(),
        outer_src in any::<u128>(),
        outer_dst in any::<u128>(),
        to in (endpoint(), endpoint(), any::<u128>(), any::<u128>()),
        payload in prop::collection::vec(any::<u8>(), 0..40),
        quote_cut in 0usize..40,
        kind in prop_oneof![Just(1u8), Just(2u8), Just(3u8)],
    ) {
        let (outer_src, outer_dst) = (Ipv6Addr::from(outer_src), Ipv6Addr::from(outer_dst));
        let seg = segment(tcp, inner_src, inner_dst, &payload);
        let quoted_full = frame(inner_src.addr, inner_dst.addr, 63, &[], if tcp { 6 } else { 17 }, &seg);
        // The quote: the IPv6 header and at least 8 bytes of the segment.
        let keep = (14 + 40 + 8 + quote_cut).min(quoted_full.len());
        let quote = &quoted_full[14..keep];
        let mut msg = vec![kind, 0, 0, 0, 0, 0, 5, 0];
        msg.extend_from_slice(quote);
        let c = icmpv6_checksum(outer_src, outer_dst, &msg);
        msg[2..4].copy_from_slice(&c.to_be_bytes());
        let mut f = frame(outer_src, outer_dst, 64, &[], 58, &msg);
        let ip = classified(&f);
        let (a, b, os, od) = to;
        let m = IcmpErrorNat {
            outer_src: Ipv6Addr::from(os),
            outer_dst: Ipv6Addr::from(od),
            inner: Nat { src: a, dst: b },
        };
        nat6::icmp_error_forward6(&mut f, &ip, &m, MAC_A, MAC_B).unwrap();
        let after = classified(&f);
        prop_assert_eq!((after.src, after.dst), (m.outer_src, m.outer_dst));
        let msg = &f[after.l4_offset()..after.end()];
        prop_assert_eq!(icmpv6_checksum(after.src, after.dst, msg), 0, "ICMPv6 checksum");
        let L4::IcmpError(e) = after.l4 else { panic!("{:?}", after.l4) };
        prop_assert_eq!((e.inner.src, e.inner.dst), (a.addr, b.addr));
        prop_assert_eq!((e.inner.src_port, e.inner.dst_port), (a.port, b.port));
        // The quoted segment's checksum, when quoted whole, verifies for
        // the quoted addresses.
        let q = &msg[8 + 40..];
        if q.len() == seg.len() {
            let (s, d) = (ip6(a.addr), ip6(b.addr));
            if tcp {
                prop_assert!(TcpPacket::new_unchecked(q).verify_checksum(&s, &d));
            } else {
                prop_assert!(UdpPacket::new_unchecked(q).verify_checksum(&s, &d));
            }
        }
    }

    #[test]
    fn any_bytes_after_an_ipv6_ethertype_classify_without_panicking(
        body in prop::collection::vec(any::<u8>(), 0..200),
        nh in prop_oneof![Just(0u8), Just(6), Just(17), Just(43), Just(44), Just(58), Just(60), any::<u8>()],
    ) {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd, 0x60, 0, 0, 0];
        f.extend((body.len() as u16).to_be_bytes());
        f.extend([nh, 64]);
        f.extend([0u8; 32]);
        f.extend(&body);
        let _ = classify(&f);
        let _ = classify(&f[..f.len() / 2]);
    }
}
