//! Encapsulation of a packet for a tunnel backend (IPVS's `-i`): IPv4 in
//! IPv4 (protocol 4), IPv6 in IPv6 (next header 41), or GUE variant 1
//! (the inner IP packet directly in UDP, RFC 8086's "direct IP
//! encapsulation", what Linux's `ip fou add port P gue` and Katran's GUE
//! decapsulation take). The inner packet is left as the client sent it,
//! but for its TTL or hop limit (a router's decrement); the outer header
//! is written in front of it, in the frame's room beyond its end (the
//! packet moves back by the outer header's length).
//!
//! Outer headers (written as xvs's answers are, TTL / hop limit
//! [`super::answer::ANSWER_TTL`]): IPv4 with DF set (the inner packet is
//! never fragmented: what does not fit is refused with
//! [`Encapsulated::TooBig`], which the caller answers with fragmentation
//! needed), the inner TOS copied; IPv6 the inner traffic class copied and
//! a flow label from the GUE/ECMP entropy. The GUE UDP checksum is zero
//! over IPv4 (RFC 8086 allows it) and computed over IPv6 (RFC 8200 needs
//! it).
//!
//! No-panic contract: every function checks that the frame holds the
//! packet its classification describes and that the grown frame fits the
//! buffer before touching either, and refuses with a [`DropReason`]
//! otherwise; the frame is unchanged on every refusal.

use std::net::{Ipv4Addr, Ipv6Addr};

use smoltcp::wire::{EthernetAddress, IpProtocol};

use super::answer::write_ip_header;
use super::answer6::write_header;
use super::checksum::put16;
use super::field::{eth, ipv4, ipv6, udp};
use super::nat::{decrement_ttl, set_macs};
use super::nat6::hop;
use super::ndp::l4_checksum6;
use super::{DropReason, Ipv4, Ipv6};

/// IP protocol number of IPv4 in IP.
const IPPROTO_IPIP: u8 = 4;
/// IP protocol number of IPv6 in IP.
const IPPROTO_IPV6: u8 = 41;
/// IP protocol number of UDP.
const IPPROTO_UDP: u8 = 17;

/// How a packet is wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrap {
    /// IP in IP.
    Ipip,
    /// GUE variant 1 from `src_port` (the flow's entropy) to `dst_port`.
    Gue {
        /// UDP source port.
        src_port: u16,
        /// UDP destination port.
        dst_port: u16,
    },
}

impl Wrap {
    /// Bytes the wrapping adds after the outer IP header.
    const fn extra(self) -> usize {
        match self {
            Wrap::Ipip => 0,
            Wrap::Gue { .. } => udp::HEADER_LEN,
        }
    }

    /// The outer header's protocol (`ipip`: the family's IP-in-IP number).
    const fn protocol(self, ipip: u8) -> u8 {
        match self {
            Wrap::Ipip => ipip,
            Wrap::Gue { .. } => IPPROTO_UDP,
        }
    }
}

/// The outer header's ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outer<A> {
    /// Outer source (the gateway's tunnel address, or one derived from the
    /// client).
    pub src: A,
    /// Outer destination (the backend).
    pub dst: A,
    /// The wrapping.
    pub wrap: Wrap,
}

/// What encapsulating did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encapsulated {
    /// The frame now holds the encapsulated packet, this long.
    Sent(usize),
    /// The packet does not fit the link once wrapped: the largest inner
    /// packet that would (the MTU to tell the client).
    TooBig(u16),
}

/// Bytes an IPv4 outer header with `wrap` adds.
pub const fn overhead4(wrap: Wrap) -> usize {
    ipv4::MIN_HEADER_LEN + wrap.extra()
}

/// Bytes an IPv6 outer header with `wrap` adds.
pub const fn overhead6(wrap: Wrap) -> usize {
    ipv6::HEADER_LEN + wrap.extra()
}

/// Checks the frame and room, and moves the inner packet (`inner` bytes
/// at the IP header) back by `over` bytes; `Ok(None)` when it would not
/// fit `mtu`.
fn make_room(
    frame: &mut [u8],
    inner: usize,
    end: usize,
    over: usize,
    mtu: u16,
    truncated: DropReason,
) -> Result<Option<usize>, DropReason> {
    if frame.len() < end || end < eth::HEADER_LEN + inner {
        return Err(truncated);
    }
    if inner + over > usize::from(mtu) {
        return Ok(None);
    }
    let total = eth::HEADER_LEN + over + inner;
    if frame.len() < total {
        return Err(DropReason::EncapNoRoom);
    }
    Ok(Some(total))
}

/// Writes a GUE UDP header at `at` for a payload of `inner` bytes (the
/// checksum left zero).
fn put_udp(frame: &mut [u8], at: usize, src_port: u16, dst_port: u16, inner: usize) {
    put16(frame, at, src_port);
    put16(frame, at + 2, dst_port);
    put16(frame, at + 4, (udp::HEADER_LEN + inner) as u16);
    put16(frame, at + udp::CHECKSUM, 0);
}

/// Encapsulates the IPv4 packet `ip` of `frame` to `outer` for a link of
/// `mtu` bytes, with our and the next hop's Ethernet addresses.
pub fn encap4(
    frame: &mut [u8],
    ip: &Ipv4,
    outer: &Outer<Ipv4Addr>,
    mtu: u16,
    ours: EthernetAddress,
    next: EthernetAddress,
) -> Result<Encapsulated, DropReason> {
    let inner = usize::from(ip.total_len);
    let over = overhead4(outer.wrap);
    let Some(total) = make_room(frame, inner, ip.end(), over, mtu, DropReason::Ipv4Truncated)?
    else {
        return Ok(Encapsulated::TooBig(mtu.saturating_sub(over as u16)));
    };
    decrement_ttl(frame, ip)?;
    let at = eth::HEADER_LEN;
    let tos = frame[at + 1];
    frame.copy_within(at..at + inner, at + over);
    let proto = outer.wrap.protocol(IPPROTO_IPIP);
    let len = (over + inner) as u16;
    write_ip_header(frame, len, tos, true, proto.into(), outer.src, outer.dst);
    if let Wrap::Gue { src_port, dst_port } = outer.wrap {
        put_udp(frame, at + ipv4::MIN_HEADER_LEN, src_port, dst_port, inner);
    }
    set_macs(frame, ours, next)?;
    Ok(Encapsulated::Sent(total))
}

/// Encapsulates the IPv6 packet `ip` of `frame` to `outer` for a link of
/// `mtu` bytes; `label` is the outer flow label (20 bits kept).
pub fn encap6(
    frame: &mut [u8],
    ip: &Ipv6,
    outer: &Outer<Ipv6Addr>,
    mtu: u16,
    label: u32,
    ours: EthernetAddress,
    next: EthernetAddress,
) -> Result<Encapsulated, DropReason> {
    let inner = ip.total_len() as usize;
    let over = overhead6(outer.wrap);
    let Some(total) = make_room(frame, inner, ip.end(), over, mtu, DropReason::Ipv6Truncated)?
    else {
        return Ok(Encapsulated::TooBig(mtu.saturating_sub(over as u16)));
    };
    hop(frame)?;
    let at = eth::HEADER_LEN;
    let class = (u16::from_be_bytes([frame[at], frame[at + 1]]) >> 4) as u8;
    frame.copy_within(at..at + inner, at + over);
    let proto = outer.wrap.protocol(IPPROTO_IPV6);
    write_header(
        frame,
        over - ipv6::HEADER_LEN + inner,
        proto,
        outer.src,
        outer.dst,
    );
    // The inner traffic class, and the flow's entropy as the label.
    let first = 0x6000_0000 | u32::from(class) << 20 | (label & 0x000f_ffff);
    frame[at..at + 4].copy_from_slice(&first.to_be_bytes());
    if let Wrap::Gue { src_port, dst_port } = outer.wrap {
        let u = at + ipv6::HEADER_LEN;
        put_udp(frame, u, src_port, dst_port, inner);
        let sum = l4_checksum6(outer.src, outer.dst, IpProtocol::Udp, &frame[u..total]);
        put16(
            frame,
            u + udp::CHECKSUM,
            if sum == 0 { 0xffff } else { sum },
        );
    }
    set_macs(frame, ours, next)?;
    Ok(Encapsulated::Sent(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{classify, Frame, L4};

    const OURS: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
    const NEXT: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

    /// A TCP SYN from 198.18.0.2:40000 to 198.19.0.1:80 with `payload`
    /// bytes, in a buffer of `room` bytes.
    fn syn4(payload: usize, room: usize) -> (Vec<u8>, usize) {
        let ip_len = 40 + payload;
        let mut buf = vec![0u8; room.max(14 + ip_len)];
        buf[0..6].copy_from_slice(&OURS.0);
        buf[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        buf[12..14].copy_from_slice(&[0x08, 0x00]);
        let h = &mut buf[14..34];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
        h[6] = 0x40;
        h[8] = 64;
        h[9] = 6;
        h[12..16].copy_from_slice(&[198, 18, 0, 2]);
        h[16..20].copy_from_slice(&[198, 19, 0, 1]);
        smoltcp::wire::Ipv4Packet::new_unchecked(&mut buf[14..34]).fill_checksum();
        let t = &mut buf[34..54];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&80u16.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = 0x02;
        for (i, b) in buf[54..14 + ip_len].iter_mut().enumerate() {
            *b = i as u8;
        }
        buf.truncate(room.max(14 + ip_len));
        (buf, 14 + ip_len)
    }

    fn outer4(wrap: Wrap) -> Outer<Ipv4Addr> {
        Outer {
            src: Ipv4Addr::new(198, 18, 1, 1),
            dst: Ipv4Addr::new(198, 18, 1, 10),
            wrap,
        }
    }

    #[test]
    fn ipip_wraps_the_packet_whole_with_a_valid_outer_header() {
        let (mut buf, len) = syn4(100, 2048);
        let original = buf[..len].to_vec();
        let Ok(Frame::Ipv4(ip)) = classify(&buf[..len]) else {
            panic!("not IPv4")
        };
        let out = encap4(&mut buf, &ip, &outer4(Wrap::Ipip), 1500, OURS, NEXT).unwrap();
        let Encapsulated::Sent(n) = out else {
            panic!("{out:?}")
        };
        assert_eq!(n, len + 20);
        // The outer header classifies (its checksum verifies) as IPv4
        // protocol 4 from the tunnel source to the backend.
        let outer = smoltcp::wire::Ipv4Packet::new_checked(&buf[14..n]).unwrap();
        assert!(outer.verify_checksum());
        assert_eq!(u8::from(outer.next_header()), IPPROTO_IPIP);
        assert_eq!(outer.src_addr(), Ipv4Addr::new(198, 18, 1, 1));
        assert_eq!(outer.dst_addr(), Ipv4Addr::new(198, 18, 1, 10));
        assert!(outer.dont_frag());
        assert_eq!(&buf[0..6], &NEXT.0);
        // The inner packet is the original but for its TTL (and header
        // checksum), which still verifies.
        let inner = &buf[34..n];
        let Ok(Frame::Ipv4(i)) = classify(&[&original[..14], inner].concat()) else {
            panic!("inner not IPv4")
        };
        assert_eq!(i.ttl, ip.ttl - 1);
        assert!(matches!(i.l4, L4::Tcp { .. }));
        assert_eq!(&inner[20..], &original[34..]);
    }

    #[test]
    fn gue_puts_the_packet_in_udp_to_the_gue_port() {
        let (mut buf, len) = syn4(0, 2048);
        let Ok(Frame::Ipv4(ip)) = classify(&buf[..len]) else {
            panic!()
        };
        let wrap = Wrap::Gue {
            src_port: 50000,
            dst_port: 6080,
        };
        let Encapsulated::Sent(n) = encap4(&mut buf, &ip, &outer4(wrap), 1500, OURS, NEXT).unwrap()
        else {
            panic!()
        };
        assert_eq!(n, len + 28);
        let Ok(Frame::Ipv4(o)) = classify(&buf[..n]) else {
            panic!()
        };
        assert_eq!(
            o.l4,
            L4::Udp {
                src_port: 50000,
                dst_port: 6080
            }
        );
        // GUE variant 1: the UDP payload starts with the inner IPv4 header.
        assert_eq!(buf[42] >> 4, 4);
    }

    #[test]
    fn what_does_not_fit_is_refused_with_the_mtu_and_left_unchanged() {
        let (mut buf, len) = syn4(1460, 2048);
        let before = buf.clone();
        let Ok(Frame::Ipv4(ip)) = classify(&buf[..len]) else {
            panic!()
        };
        assert_eq!(
            encap4(&mut buf, &ip, &outer4(Wrap::Ipip), 1500, OURS, NEXT),
            Ok(Encapsulated::TooBig(1480))
        );
        let gue = Wrap::Gue {
            src_port: 1,
            dst_port: 6080,
        };
        assert_eq!(
            encap4(&mut buf, &ip, &outer4(gue), 1500, OURS, NEXT),
            Ok(Encapsulated::TooBig(1472))
        );
        assert_eq!(buf, before);
        // No room in the buffer: refused, unchanged.
        let (mut small, len) = syn4(100, 160);
        let before = small.clone();
        let Ok(Frame::Ipv4(ip)) = classify(&small[..len]) else {
            panic!()
        };
        assert_eq!(
            encap4(&mut small, &ip, &outer4(Wrap::Ipip), 1500, OURS, NEXT),
            Err(DropReason::EncapNoRoom)
        );
        assert_eq!(small, before);
    }

    /// A TCP SYN from 2001:2::2 to 2001:2:ff::1 with hop limit 64 and a
    /// traffic class of 0x28, in a 2048-byte buffer.
    fn syn6() -> (Vec<u8>, usize) {
        let mut buf = vec![0u8; 2048];
        buf[12..14].copy_from_slice(&[0x86, 0xdd]);
        buf[14..18].copy_from_slice(&[0x62, 0x80, 0, 0]);
        buf[18..20].copy_from_slice(&20u16.to_be_bytes());
        buf[20] = 6;
        buf[21] = 64;
        let src: Ipv6Addr = "2001:2::2".parse().unwrap();
        let dst: Ipv6Addr = "2001:2:ff::1".parse().unwrap();
        buf[22..38].copy_from_slice(&src.octets());
        buf[38..54].copy_from_slice(&dst.octets());
        buf[54..56].copy_from_slice(&40000u16.to_be_bytes());
        buf[56..58].copy_from_slice(&80u16.to_be_bytes());
        buf[66] = 5 << 4;
        buf[67] = 0x02;
        (buf, 14 + 40 + 20)
    }

    #[test]
    fn ipv6_tunnels_keep_the_class_label_the_flow_and_checksum_gue() {
        let outer = |wrap| Outer {
            src: "2001:2:0:1::100".parse::<Ipv6Addr>().unwrap(),
            dst: "2001:2:0:1::10".parse::<Ipv6Addr>().unwrap(),
            wrap,
        };
        let gue = Wrap::Gue {
            src_port: 50000,
            dst_port: 6080,
        };
        for (wrap, over, next) in [(Wrap::Ipip, 40, IPPROTO_IPV6), (gue, 48, IPPROTO_UDP)] {
            let (mut buf, len) = syn6();
            let original = buf[..len].to_vec();
            let Ok(Frame::Ipv6(ip)) = classify(&buf[..len]) else {
                panic!("not IPv6")
            };
            let out = encap6(&mut buf, &ip, &outer(wrap), 1500, 0xabcde, OURS, NEXT).unwrap();
            assert_eq!(out, Encapsulated::Sent(len + over));
            let o = smoltcp::wire::Ipv6Packet::new_checked(&buf[14..len + over]).unwrap();
            assert_eq!(u8::from(o.next_header()), next);
            assert_eq!(usize::from(o.payload_len()), len - 14 + over - 40);
            assert_eq!((o.traffic_class(), o.flow_label()), (0x28, 0xabcde));
            assert_eq!(o.hop_limit(), 64);
            let inner = &buf[14 + over..len + over];
            assert_eq!(inner[7], 63, "inner hop limit decremented");
            assert_eq!(&inner[8..], &original[22..]);
            if wrap == gue {
                let u = smoltcp::wire::UdpPacket::new_checked(&buf[54..len + over]).unwrap();
                let (s, d) = (o.src_addr(), o.dst_addr());
                assert!(u.verify_checksum(&s.into(), &d.into()));
            }
        }
        // Too big for the link: the MTU that would fit, frame unchanged.
        let (mut buf, len) = syn6();
        let before = buf.clone();
        let Ok(Frame::Ipv6(ip)) = classify(&buf[..len]) else {
            panic!()
        };
        let mtu = (len - 14 + 40 - 1) as u16;
        assert_eq!(
            encap6(&mut buf, &ip, &outer(Wrap::Ipip), mtu, 0, OURS, NEXT),
            Ok(Encapsulated::TooBig(mtu - 40))
        );
        assert_eq!(buf, before);
    }
}
