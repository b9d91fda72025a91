//! Translation of an ICMP error (destination unreachable, incl.
//! fragmentation needed, and time exceeded) through the NAT of the flow it
//! quotes, so PMTU discovery and unreachables work across xvs.
//!
//! An ICMP error carries the header of the packet that caused it. When the
//! error crosses the NAT, both must be rewritten: the outer IPv4 addresses
//! (outer header checksum), and inside the ICMP payload the quoted IPv4
//! addresses (quoted header checksum), the quoted ports, and the quoted
//! TCP/UDP checksum when the quote is long enough to hold it. Every one of
//! those words is also covered by the ICMP checksum, which is updated for
//! each (ICMP has no pseudo-header, so the outer addresses do not touch it).
//!
//! Invariant: after [`translate`], every checksum that verified before
//! still verifies, and the quoted header reads as the packet the peer on
//! this side sent or would have received (the reverse of the mapping the
//! flow's packets got).

use std::net::Ipv4Addr;

use smoltcp::wire::EthernetAddress;
use xvs_config::Address;

use super::checksum::{get16, get_addr, put16, put_addr, Delta};
use super::classify::{Ipv4, L4};
use super::field::{eth, icmp, ipv4, tcp, udp};
use super::nat::{put_macs, Endpoint, Nat};
use super::DropReason;
use xvs_conntrack::L4Proto;

const ETH_HEADER_LEN: usize = eth::HEADER_LEN;
const IP_TTL_PROTO: usize = ipv4::TTL_PROTO;
const IP_CHECKSUM: usize = ipv4::CHECKSUM;
const IP_SRC: usize = ipv4::SRC;
const IP_DST: usize = ipv4::DST;
const ICMP_CHECKSUM: usize = icmp::CHECKSUM;

/// The rewrite of an ICMP error: new outer addresses, and the mapping of the
/// quoted packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpErrorNat<A: Address = Ipv4Addr> {
    /// New outer source address.
    pub outer_src: A,
    /// New outer destination address.
    pub outer_dst: A,
    /// New source and destination of the quoted packet.
    pub inner: Nat<A>,
}

/// Rewrites a classified ICMP error in place. Frames that are not ICMP
/// errors are refused with [`DropReason::IcmpErrorUnsupported`].
pub fn translate(frame: &mut [u8], ip: &Ipv4, nat: &IcmpErrorNat) -> Result<(), DropReason> {
    rewrite(frame, ip, nat, false)
}

/// Everything forwarding an ICMP error through the NAT does, in one pass
/// with one update per checksum: [`translate`], TTL decrement, MACs. On
/// [`DropReason::TtlExceeded`] the frame is unchanged.
pub fn forward(
    frame: &mut [u8],
    ip: &Ipv4,
    nat: &IcmpErrorNat,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
) -> Result<(), DropReason> {
    rewrite(frame, ip, nat, true)?;
    put_macs(frame, src_mac, dst_mac);
    Ok(())
}

fn rewrite(frame: &mut [u8], ip: &Ipv4, nat: &IcmpErrorNat, ttl: bool) -> Result<(), DropReason> {
    let L4::IcmpError(err) = ip.l4 else {
        return Err(DropReason::IcmpErrorUnsupported);
    };
    let inner = err.inner;
    let inner_at = usize::from(inner.offset);
    let quoted_l4 = inner_at + usize::from(inner.header_len);
    if frame.len() < ip.end() || frame.len() < quoted_l4 + usize::from(inner.l4_quoted) {
        return Err(DropReason::Ipv4Truncated);
    }

    // Outer header (TTL first: an expiring packet is left unchanged).
    let mut outer = Delta::ZERO;
    if ttl {
        let at = ETH_HEADER_LEN + IP_TTL_PROTO;
        let word = get16(frame, at);
        if word >> 8 <= 1 {
            return Err(DropReason::TtlExceeded);
        }
        outer.word(word, word - 0x0100);
        put16(frame, at, word - 0x0100);
    }
    for (at, to) in [(IP_SRC, nat.outer_src), (IP_DST, nat.outer_dst)] {
        let at = ETH_HEADER_LEN + at;
        outer.addr(get_addr(frame, at), to);
        put_addr(frame, at, to);
    }
    let c = get16(frame, ETH_HEADER_LEN + IP_CHECKSUM);
    put16(frame, ETH_HEADER_LEN + IP_CHECKSUM, outer.apply(c));

    // Quoted header: addresses and ports.
    let (mut icmp, mut quoted_ip, mut quoted_l4sum) = (Delta::ZERO, Delta::ZERO, Delta::ZERO);
    let ends: [(usize, usize, Endpoint); 2] =
        [(IP_SRC, 0, nat.inner.src), (IP_DST, 2, nat.inner.dst)];
    for (addr_at, port_off, to) in ends {
        let at = inner_at + addr_at;
        let mut d = Delta::ZERO;
        d.addr(get_addr(frame, at), to.addr);
        put_addr(frame, at, to.addr);
        quoted_ip.add(d);
        quoted_l4sum.add(d);
        icmp.add(d);
        let at = quoted_l4 + port_off;
        let old = get16(frame, at);
        quoted_l4sum.word(old, to.port);
        icmp.word(old, to.port);
        put16(frame, at, to.port);
    }

    // Quoted IPv4 header checksum.
    let at = inner_at + IP_CHECKSUM;
    let old = get16(frame, at);
    let new = quoted_ip.apply(old);
    icmp.word(old, new);
    put16(frame, at, new);

    // Quoted L4 checksum, when quoted.
    let l4sum = match inner.proto {
        L4Proto::Tcp if usize::from(inner.l4_quoted) >= tcp::CHECKSUM + 2 => {
            Some((quoted_l4 + tcp::CHECKSUM, false))
        }
        L4Proto::Udp => Some((quoted_l4 + udp::CHECKSUM, true)),
        _ => None,
    };
    if let Some((at, udp)) = l4sum {
        let old = get16(frame, at);
        let new = if udp {
            quoted_l4sum.apply_udp(old)
        } else {
            quoted_l4sum.apply(old)
        };
        icmp.word(old, new);
        put16(frame, at, new);
    }

    let at = ip.l4_offset() + ICMP_CHECKSUM;
    let c = get16(frame, at);
    put16(frame, at, icmp.apply(c));
    Ok(())
}
