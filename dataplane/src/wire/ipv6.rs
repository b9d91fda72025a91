//! IPv6 classification (RFC 8200): the fixed header, the walk over the
//! extension headers to the upper-layer header, and TCP, UDP and ICMPv6
//! (echo, errors, neighbour discovery) after it.
//!
//! No-panic contract: [`classify_ipv6`] accepts any frame whose EtherType
//! is IPv6; every offset is checked against the payload length (itself
//! checked against the frame) before it is read.
//!
//! The walk: hop-by-hop options (first only), destination options and
//! routing headers are skipped by their length; a routing header with
//! segments left is refused ([`DropReason::Ipv6RoutingHeader`]: the
//! destination is not the final one); a fragment header makes the packet a
//! fragment (no flow key: fragments are dropped and counted like IPv4's),
//! except an atomic one (offset 0, no more fragments, RFC 6946), which is
//! read as a whole packet. Any other next header than TCP, UDP and ICMPv6
//! is [`DropReason::Ipv6UnknownHeader`]; at most [`MAX_EXT_HEADERS`] are
//! walked. A UDP checksum of zero is refused (RFC 8200 8.1).

use std::net::Ipv6Addr;

use xvs_conntrack::{FlowKey, L4Proto};

use super::checksum::{get16, get_addr6};
use super::classify::{classify_tcp, Fragment, IcmpError, Inner, L4};
use super::field::{eth, icmpv6, ipv6, udp};
use super::ndp::Ndp;
use super::DropReason;

/// Extension headers walked before giving up (a chain longer than any
/// real packet carries).
pub const MAX_EXT_HEADERS: usize = 8;

const TCP: u8 = 6;
const UDP: u8 = 17;

/// An IPv6 packet's fields and layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6 {
    /// Payload length (extension headers and upper layer).
    pub payload_len: u16,
    /// Offset of the upper-layer header in the frame.
    pub l4_at: u16,
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Hop limit.
    pub hop_limit: u8,
    /// The upper-layer protocol (the last next header).
    pub protocol: u8,
    /// Whether and which fragment this is.
    pub fragment: Fragment,
    /// The upper-layer header.
    pub l4: L4<Ipv6Addr>,
}

impl Ipv6 {
    /// Offset of the upper-layer header in the frame.
    pub const fn l4_offset(&self) -> usize {
        self.l4_at as usize
    }

    /// Offset just past the packet in the frame.
    pub const fn end(&self) -> usize {
        eth::HEADER_LEN + ipv6::HEADER_LEN + self.payload_len as usize
    }

    /// The packet's length (header included), as counted in traffic.
    pub const fn total_len(&self) -> u32 {
        (ipv6::HEADER_LEN + self.payload_len as usize) as u32
    }

    /// The conntrack key this packet is looked up with (see
    /// [`super::Ipv4::flow_key`]).
    pub fn flow_key(&self) -> Option<FlowKey<Ipv6Addr>> {
        self.l4.flow_key(self.src, self.dst)
    }
}

/// Classifies an IPv6 frame (its EtherType already read).
pub fn classify_ipv6(frame: &[u8]) -> Result<Ipv6, DropReason> {
    let avail = &frame[eth::HEADER_LEN..];
    if avail.len() < ipv6::HEADER_LEN {
        return Err(DropReason::Ipv6Truncated);
    }
    if avail[0] >> 4 != 6 {
        return Err(DropReason::Ipv6Malformed);
    }
    let payload_len = get16(avail, ipv6::PAYLOAD_LEN);
    let end = ipv6::HEADER_LEN + usize::from(payload_len);
    if end > avail.len() {
        return Err(DropReason::Ipv6Malformed);
    }
    let packet = &avail[..end];
    let src = get_addr6(packet, ipv6::SRC);
    let dst = get_addr6(packet, ipv6::DST);
    let hop_limit = packet[ipv6::HOP_LIMIT];
    let (protocol, at, fragment) = walk(packet)?;
    let l4_at = eth::HEADER_LEN + at;
    let payload = &packet[at..];
    let l4 = match (fragment, protocol) {
        (Fragment::First | Fragment::Later, _) => L4::None,
        (_, TCP) => classify_tcp(payload)?,
        (_, UDP) => classify_udp6(payload)?,
        _ => classify_icmpv6(payload, l4_at, hop_limit)?,
    };
    Ok(Ipv6 {
        payload_len,
        l4_at: l4_at as u16,
        src,
        dst,
        hop_limit,
        protocol,
        fragment,
        l4,
    })
}

/// Walks the extension headers of `packet` (header included): the
/// upper-layer protocol, its offset in `packet`, and the fragment status.
fn walk(packet: &[u8]) -> Result<(u8, usize, Fragment), DropReason> {
    let mut next = packet[ipv6::NEXT_HEADER];
    let mut at = ipv6::HEADER_LEN;
    let mut fragment = Fragment::Whole;
    for i in 0..=MAX_EXT_HEADERS {
        match next {
            TCP | UDP | ipv6::ICMPV6 => return Ok((next, at, fragment)),
            _ if i == MAX_EXT_HEADERS => break,
            ipv6::HOP_BY_HOP if at != ipv6::HEADER_LEN => return Err(DropReason::Ipv6Malformed),
            ipv6::HOP_BY_HOP | ipv6::DEST_OPTIONS | ipv6::ROUTING => {
                let h = packet.get(at..at + 8).ok_or(DropReason::Ipv6Malformed)?;
                if next == ipv6::ROUTING && h[3] != 0 {
                    return Err(DropReason::Ipv6RoutingHeader);
                }
                next = h[0];
                at += (usize::from(h[1]) + 1) * 8;
            }
            ipv6::FRAGMENT => {
                let h = packet.get(at..at + 8).ok_or(DropReason::Ipv6Malformed)?;
                let off_m = u16::from_be_bytes([h[2], h[3]]);
                fragment = match (off_m >> 3, off_m & 1) {
                    (0, 0) => fragment,
                    (0, _) => Fragment::First,
                    _ => Fragment::Later,
                };
                next = h[0];
                at += 8;
                if fragment != Fragment::Whole {
                    return Ok((next, at.min(packet.len()), fragment));
                }
            }
            ipv6::NO_NEXT => return Err(DropReason::UnsupportedProtocol),
            _ => return Err(DropReason::Ipv6UnknownHeader),
        }
        if at > packet.len() {
            return Err(DropReason::Ipv6Malformed);
        }
    }
    Err(DropReason::Ipv6UnknownHeader)
}

fn classify_udp6(dgram: &[u8]) -> Result<L4<Ipv6Addr>, DropReason> {
    if dgram.len() < udp::HEADER_LEN {
        return Err(DropReason::UdpMalformed);
    }
    let len = usize::from(get16(dgram, 4));
    if len < udp::HEADER_LEN || len > dgram.len() {
        return Err(DropReason::UdpMalformed);
    }
    if get16(dgram, udp::CHECKSUM) == 0 {
        return Err(DropReason::UdpZeroChecksum);
    }
    Ok(L4::Udp {
        src_port: get16(dgram, 0),
        dst_port: get16(dgram, 2),
    })
}

fn classify_icmpv6(msg: &[u8], msg_at: usize, hop_limit: u8) -> Result<L4<Ipv6Addr>, DropReason> {
    if msg.len() < 8 {
        return Err(DropReason::IcmpMalformed);
    }
    match msg[0] {
        t @ (icmpv6::ECHO_REQUEST | icmpv6::ECHO_REPLY) => Ok(L4::IcmpEcho {
            request: t == icmpv6::ECHO_REQUEST,
            ident: get16(msg, 4),
        }),
        t @ (icmpv6::DST_UNREACHABLE | icmpv6::PACKET_TOO_BIG | icmpv6::TIME_EXCEEDED) => {
            let inner = classify_inner6(&msg[8..], msg_at + 8)?;
            Ok(L4::IcmpError(IcmpError {
                icmp_type: t,
                code: msg[1],
                inner,
            }))
        }
        icmpv6::NEIGHBOUR_SOLICIT | icmpv6::NEIGHBOUR_ADVERT => {
            Ndp::parse(msg, hop_limit).map(L4::Neighbour)
        }
        _ => Err(DropReason::IcmpUnsupportedType),
    }
}

/// The quoted packet of an ICMPv6 error: an IPv6 header directly followed
/// by at least 8 bytes of TCP or UDP (a quote with extension headers is
/// not translated).
fn classify_inner6(quoted: &[u8], offset: usize) -> Result<Inner<Ipv6Addr>, DropReason> {
    if quoted.len() < ipv6::HEADER_LEN + 8 || quoted[0] >> 4 != 6 {
        return Err(DropReason::IcmpErrorMalformed);
    }
    let proto = match quoted[ipv6::NEXT_HEADER] {
        TCP => L4Proto::Tcp,
        UDP => L4Proto::Udp,
        _ => return Err(DropReason::IcmpErrorUnsupported),
    };
    let l4 = &quoted[ipv6::HEADER_LEN..];
    Ok(Inner {
        offset: offset as u16,
        header_len: ipv6::HEADER_LEN as u8,
        l4_quoted: l4.len().min(usize::from(u16::MAX)) as u16,
        proto,
        src: get_addr6(quoted, ipv6::SRC),
        dst: get_addr6(quoted, ipv6::DST),
        src_port: get16(l4, 0),
        dst_port: get16(l4, 2),
    })
}
