//! Property tests of the packet core: after any sequence of rewrites every
//! incrementally updated checksum verifies by full recomputation (smoltcp's
//! `verify_checksum` is the oracle), and no input makes anything panic.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::Ipv4Addr;

use proptest::prelude::*;
use smoltcp::wire::{
    checksum, EthernetAddress, Icmpv4Packet, IpAddress, Ipv4Packet, TcpPacket, UdpPacket,
};
use xvs_dataplane::wire::answer::{arp_reply, icmp_echo_reply, icmp_port_unreachable, tcp_reset};
use xvs_dataplane::wire::{
    classify, icmp_error, nat, Endpoint, Frame, IcmpErrorNat, Ipv4, Nat, L4,
};

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

fn ip_addr(a: Ipv4Addr) -> IpAddress {
    IpAddress::Ipv4(a)
}

/// An IPv4 header (with `opt_words` words of NOP options) and checksum.
fn ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    payload: usize,
    ttl: u8,
    opt_words: usize,
) -> Vec<u8> {
    let hl = 20 + 4 * opt_words;
    let mut h = vec![0u8; hl];
    h[0] = 0x40 | (hl / 4) as u8;
    h[2..4].copy_from_slice(&((hl + payload) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&0x5a5au16.to_be_bytes());
    h[8] = ttl;
    h[9] = proto;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    h[20..].fill(1);
    Ipv4Packet::new_unchecked(&mut h[..]).fill_checksum();
    h
}

fn eth(payload: Vec<u8>) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&MAC_A.0);
    f.extend_from_slice(&MAC_B.0);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend(payload);
    f
}

fn tcp_segment(src: Endpoint, dst: Endpoint, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; 20];
    s[0..2].copy_from_slice(&src.port.to_be_bytes());
    s[2..4].copy_from_slice(&dst.port.to_be_bytes());
    s[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    s[12] = 5 << 4;
    s[13] = flags;
    s[14..16].copy_from_slice(&1000u16.to_be_bytes());
    s.extend_from_slice(payload);
    TcpPacket::new_unchecked(&mut s[..]).fill_checksum(&ip_addr(src.addr), &ip_addr(dst.addr));
    s
}

fn udp_datagram(src: Endpoint, dst: Endpoint, payload: &[u8], with_sum: bool) -> Vec<u8> {
    let mut d = vec![0u8; 8];
    d[0..2].copy_from_slice(&src.port.to_be_bytes());
    d[2..4].copy_from_slice(&dst.port.to_be_bytes());
    d[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    d.extend_from_slice(payload);
    if with_sum {
        UdpPacket::new_unchecked(&mut d[..]).fill_checksum(&ip_addr(src.addr), &ip_addr(dst.addr));
    }
    d
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    (any::<u32>(), any::<u16>()).prop_map(|(a, port)| Endpoint {
        addr: Ipv4Addr::from(a),
        port,
    })
}

#[derive(Debug, Clone, Copy)]
enum L4Kind {
    Tcp,
    UdpSum,
    UdpNoSum,
}

#[derive(Debug, Clone)]
enum Op {
    Src(Endpoint),
    Dst(Endpoint),
    Ttl,
    Forward(Nat),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        endpoint().prop_map(Op::Src),
        endpoint().prop_map(Op::Dst),
        Just(Op::Ttl),
        (endpoint(), endpoint()).prop_map(|(src, dst)| Op::Forward(Nat { src, dst })),
    ]
}

fn classified(frame: &[u8]) -> Ipv4 {
    match classify(frame) {
        Ok(Frame::Ipv4(ip)) => ip,
        other => panic!("{other:?}"),
    }
}

/// Every checksum of a TCP/UDP frame verifies by full recomputation.
fn assert_l4_frame_valid(frame: &[u8], kind: L4Kind) {
    let ip = classified(frame);
    let packet = Ipv4Packet::new_unchecked(&frame[14..ip.end()]);
    assert!(packet.verify_checksum(), "IPv4 header checksum");
    let (src, dst) = (ip_addr(ip.src), ip_addr(ip.dst));
    let l4 = &frame[ip.l4_offset()..ip.end()];
    match kind {
        L4Kind::Tcp => assert!(
            TcpPacket::new_unchecked(l4).verify_checksum(&src, &dst),
            "TCP checksum"
        ),
        L4Kind::UdpSum => {
            let udp = UdpPacket::new_unchecked(l4);
            assert_ne!(udp.checksum(), 0, "a UDP checksum must not become 'none'");
            assert!(udp.verify_checksum(&src, &dst), "UDP checksum");
        }
        L4Kind::UdpNoSum => assert_eq!(UdpPacket::new_unchecked(l4).checksum(), 0),
    }
}

fn l4_frame(
    kind: L4Kind,
    src: Endpoint,
    dst: Endpoint,
    payload: &[u8],
    ttl: u8,
    opts: usize,
) -> Vec<u8> {
    let (proto, seg) = match kind {
        L4Kind::Tcp => (6, tcp_segment(src, dst, 0x18, payload)),
        L4Kind::UdpSum => (17, udp_datagram(src, dst, payload, true)),
        L4Kind::UdpNoSum => (17, udp_datagram(src, dst, payload, false)),
    };
    let mut ip = ipv4_header(src.addr, dst.addr, proto, seg.len(), ttl, opts);
    ip.extend(seg);
    eth(ip)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn rewrites_keep_every_checksum_valid(
        kind in prop_oneof![Just(L4Kind::Tcp), Just(L4Kind::UdpSum), Just(L4Kind::UdpNoSum)],
        src in endpoint(),
        dst in endpoint(),
        payload in prop::collection::vec(any::<u8>(), 0..64),
        ttl in 1u8..=255,
        opts in 0usize..=10,
        ops in prop::collection::vec(op(), 1..8),
    ) {
        let mut frame = l4_frame(kind, src, dst, &payload, ttl, opts);
        assert_l4_frame_valid(&frame, kind);
        let ip = classified(&frame);
        let (mut want_src, mut want_dst) = (src, dst);
        for op in &ops {
            let res = match *op {
                Op::Src(e) => nat::set_source(&mut frame, &ip, e).map(|()| want_src = e),
                Op::Dst(e) => nat::set_destination(&mut frame, &ip, e).map(|()| want_dst = e),
                Op::Ttl => nat::decrement_ttl(&mut frame, &ip),
                Op::Forward(n) => nat::forward(&mut frame, &ip, &n, MAC_B, MAC_A).map(|()| {
                    want_src = n.src;
                    want_dst = n.dst;
                }),
            };
            // The only refusal is an expiring TTL.
            if let Err(e) = res {
                prop_assert_eq!(e, xvs_dataplane::wire::DropReason::TtlExceeded);
            }
            assert_l4_frame_valid(&frame, kind);
        }
        let after = classified(&frame);
        prop_assert_eq!((after.src, after.dst), (want_src.addr, want_dst.addr));
        let ports = match after.l4 {
            L4::Tcp { src_port, dst_port, .. } | L4::Udp { src_port, dst_port } => (src_port, dst_port),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(ports, (want_src.port, want_dst.port));
    }

    #[test]
    fn icmp_error_translation_keeps_every_checksum_valid(
        udp in any::<bool>(),
        full_quote in any::<bool>(),
        a in (endpoint(), endpoint()),
        outer in (any::<u32>(), any::<u32>()),
        maps in prop::collection::vec((any::<u32>(), any::<u32>(), endpoint(), endpoint()), 1..5),
        payload in prop::collection::vec(any::<u8>(), 0..32),
    ) {
        let (q_src, q_dst) = a;
        // The quoted packet: a TCP header (whole, or its first 8 bytes) or
        // the first 8 bytes of a UDP datagram with a payload not quoted.
        let build_quoted = |s: Endpoint, d: Endpoint| -> Vec<u8> {
            let (proto, l4) = if udp {
                (17, udp_datagram(s, d, &payload, true))
            } else {
                (6, tcp_segment(s, d, 0x02, &[]))
            };
            let mut q = ipv4_header(s.addr, d.addr, proto, l4.len(), 17, 0);
            let take = if full_quote && !udp { l4.len() } else { 8 };
            q.extend_from_slice(&l4[..take]);
            q
        };
        let quoted = build_quoted(q_src, q_dst);
        let mut msg = vec![3u8, 4, 0, 0, 0, 0, 0x05, 0x78];
        msg.extend_from_slice(&quoted);
        Icmpv4Packet::new_unchecked(&mut msg[..]).fill_checksum();
        let mut ip = ipv4_header(Ipv4Addr::from(outer.0), Ipv4Addr::from(outer.1), 1, msg.len(), 64, 0);
        ip.extend(msg);
        let mut frame = eth(ip);
        let parsed = classified(&frame);

        for (os, od, is, id) in maps {
            let m = IcmpErrorNat {
                outer_src: Ipv4Addr::from(os),
                outer_dst: Ipv4Addr::from(od),
                inner: Nat { src: is, dst: id },
            };
            icmp_error::translate(&mut frame, &parsed, &m).unwrap();
            let now = classified(&frame);
            prop_assert!(Ipv4Packet::new_unchecked(&frame[14..now.end()]).verify_checksum());
            let icmp = &frame[now.l4_offset()..now.end()];
            prop_assert!(Icmpv4Packet::new_unchecked(icmp).verify_checksum(), "ICMP checksum");
            let inner = &icmp[8..];
            prop_assert_eq!(checksum::data(&inner[..20]), 0xffff, "quoted IPv4 header checksum");
            // The quoted header equals the one the peer would have sent
            // with the new mapping, checksums included.
            let want = build_quoted(is, id);
            // The quoted IPv4 checksum may differ only as +0 / -0.
            prop_assert_eq!(&inner[..10], &want[..10]);
            prop_assert_eq!(&inner[12..], &want[12..]);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        exercise(&bytes);
    }

    /// The classification's own header checksum and field reads agree
    /// with smoltcp's: a header (any options, any byte of it changed) is
    /// refused as a bad checksum exactly when smoltcp's full sum fails,
    /// and an accepted one reads as smoltcp reads it.
    #[test]
    fn the_ipv4_header_reads_as_smoltcp_reads_it(
        kind in prop_oneof![Just(L4Kind::Tcp), Just(L4Kind::UdpSum)],
        src in endpoint(),
        dst in endpoint(),
        ttl in 1u8..=255,
        opts in 0usize..=10,
        flip in prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
        frag in prop_oneof![Just(0u16), Just(0x4000), Just(0x2000), any::<u16>()],
    ) {
        let mut frame = l4_frame(kind, src, dst, b"payload", ttl, opts);
        let hl = 20 + 4 * opts;
        frame[14 + 6..14 + 8].copy_from_slice(&frag.to_be_bytes());
        // The checksum again, over the new flags and offset.
        let mut h = Ipv4Packet::new_unchecked(&mut frame[14..14 + hl]);
        h.fill_checksum();
        if let Some((at, v)) = flip {
            // Any byte but version/IHL and the lengths (their own checks).
            let i = [1usize, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 19]
                [at.index(13)]
                .min(hl - 1);
            frame[14 + i] = v;
        }
        let header = Ipv4Packet::new_unchecked(&frame[14..]);
        let sum_ok = checksum::data(&frame[14..14 + hl]) == 0xffff;
        match classify(&frame) {
            Err(xvs_dataplane::wire::DropReason::Ipv4BadChecksum) => prop_assert!(!sum_ok),
            Err(xvs_dataplane::wire::DropReason::UnsupportedProtocol) => {
                prop_assert!(sum_ok);
                prop_assert!(![1u8, 6, 17].contains(&u8::from(header.next_header())));
            }
            Err(_) => prop_assert!(sum_ok),
            Ok(Frame::Ipv4(ip)) => {
                prop_assert!(sum_ok);
                prop_assert_eq!(ip.src, header.src_addr());
                prop_assert_eq!(ip.dst, header.dst_addr());
                prop_assert_eq!(ip.ttl, header.hop_limit());
                prop_assert_eq!(ip.ident, header.ident());
                prop_assert_eq!(ip.protocol, u8::from(header.next_header()));
                prop_assert_eq!(usize::from(ip.header_len), hl);
                let want = match (header.frag_offset(), header.more_frags()) {
                    (0, false) => xvs_dataplane::wire::Fragment::Whole,
                    (0, true) => xvs_dataplane::wire::Fragment::First,
                    _ => xvs_dataplane::wire::Fragment::Later,
                };
                prop_assert_eq!(ip.fragment, want);
            }
            Ok(other) => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        kind in prop_oneof![Just(L4Kind::Tcp), Just(L4Kind::UdpSum)],
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let e = Endpoint { addr: Ipv4Addr::new(198, 18, 0, 1), port: 1 };
        let mut frame = l4_frame(kind, e, e, b"payload", 64, 1);
        for (at, v) in flips {
            let i = at.index(frame.len());
            frame[i] = v;
        }
        frame.truncate(cut.index(frame.len() + 1));
        exercise(&frame);
    }
}

/// Runs every packet-core function that applies to whatever `bytes`
/// classify as; none may panic.
fn exercise(bytes: &[u8]) {
    match classify(bytes) {
        Ok(Frame::Ipv4(ip)) => {
            let e = Endpoint {
                addr: Ipv4Addr::new(198, 18, 1, 1),
                port: 8080,
            };
            let n = Nat { src: e, dst: e };
            let mut f = bytes.to_vec();
            let _ = nat::forward(&mut f, &ip, &n, MAC_A, MAC_B);
            let _ = nat::decrement_ttl(&mut f, &ip);
            let m = IcmpErrorNat {
                outer_src: e.addr,
                outer_dst: e.addr,
                inner: n,
            };
            let _ = icmp_error::translate(&mut f, &ip, &m);
            let _ = icmp_echo_reply(&mut bytes.to_vec(), &ip);
            let _ = tcp_reset(&mut bytes.to_vec(), &ip);
            let mut big = bytes.to_vec();
            big.resize(2048, 0);
            let _ = icmp_port_unreachable(&mut big, &ip);
            let _ = icmp_port_unreachable(&mut bytes.to_vec(), &ip);
            // A classification applied to a shorter frame is refused, not a panic.
            let mut short = bytes[..bytes.len() / 2].to_vec();
            let _ = nat::forward(&mut short, &ip, &n, MAC_A, MAC_B);
            let _ = icmp_error::translate(&mut short, &ip, &m);
            let _ = tcp_reset(&mut short, &ip);
            let _ = icmp_echo_reply(&mut short, &ip);
        }
        Ok(Frame::Ipv6(ip)) => {
            use xvs_dataplane::wire::{answer6, nat6, ndp};
            let e = Endpoint {
                addr: "2001:2:0:1::1".parse::<std::net::Ipv6Addr>().unwrap(),
                port: 8080,
            };
            let n = Nat { src: e, dst: e };
            let m = IcmpErrorNat {
                outer_src: e.addr,
                outer_dst: e.addr,
                inner: n,
            };
            let half = bytes.len() / 2;
            for mut f in [bytes.to_vec(), bytes[..half].to_vec()] {
                let _ = nat6::forward6(&mut f, &ip, &n, MAC_A, MAC_B);
                let _ = nat6::icmp_error_forward6(&mut f, &ip, &m, MAC_A, MAC_B);
                let _ = answer6::echo_reply6(&mut f.clone(), &ip);
                let _ = answer6::tcp_reset6(&mut f.clone(), &ip);
                let _ = answer6::port_unreachable6(&mut f.clone(), &ip);
                let mut big = f.clone();
                big.resize(2048, 0);
                let _ = answer6::time_exceeded6(&mut big, &ip);
                if let L4::Neighbour(ns) = ip.l4 {
                    let _ = ndp::advertise(&mut f, &ns, ip.src, MAC_A, MAC_B);
                }
            }
        }
        Ok(Frame::Arp(arp)) => {
            let _ = arp_reply(&mut bytes.to_vec(), &arp, MAC_A);
            let _ = arp_reply(&mut bytes[..bytes.len() / 2].to_vec(), &arp, MAC_A);
        }
        Err(_) => {}
    }
}
