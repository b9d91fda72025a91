//! In-place NAT of a classified IPv6 frame: addresses, ports, hop limit
//! and MACs, and the translation of an ICMPv6 error through a flow's NAT,
//! with every checksum updated incrementally (RFC 1624), as
//! [`super::nat`] and [`super::icmp_error`] do for IPv4.
//!
//! What differs from IPv4: there is no header checksum (the hop limit and
//! the addresses change no IP-layer sum), and ICMPv6, unlike ICMP, has a
//! pseudo-header (RFC 4443 2.3), so an ICMPv6 error's checksum follows its
//! outer addresses as well as the quoted ones. A UDP checksum is never
//! zero here (the classifier refused it), so it is updated like TCP's
//! except that a computed zero is sent as 0xffff.
//!
//! No-panic contract: each function first checks that the frame is as
//! long as its classification says ([`DropReason::Ipv6Truncated`]).

use std::net::Ipv6Addr;

use smoltcp::wire::EthernetAddress;
use xvs_conntrack::L4Proto;

use super::checksum::{get16, get_addr6, put16, put_addr, Delta};
use super::classify::L4;
use super::field::{eth, icmp, ipv6, tcp, udp};
use super::icmp_error::IcmpErrorNat;
use super::ipv6::Ipv6;
use super::nat::{put_macs, Endpoint, Nat};
use super::DropReason;

const HOP_LIMIT: usize = eth::HEADER_LEN + ipv6::HOP_LIMIT;
const SRC: usize = eth::HEADER_LEN + ipv6::SRC;
const DST: usize = eth::HEADER_LEN + ipv6::DST;

/// Decrements the hop limit, or refuses with [`DropReason::TtlExceeded`]
/// (the frame unchanged) when it would reach 0.
#[inline(always)]
pub(super) fn hop(frame: &mut [u8]) -> Result<(), DropReason> {
    let h = frame[HOP_LIMIT];
    if h <= 1 {
        return Err(DropReason::TtlExceeded);
    }
    frame[HOP_LIMIT] = h - 1;
    Ok(())
}

/// Direct routing (IPVS's `-g`): the packet leaves as it came but for the
/// hop limit and the MACs. On [`DropReason::TtlExceeded`] the frame is
/// unchanged.
pub fn route6(
    frame: &mut [u8],
    ip: &Ipv6,
    ours: EthernetAddress,
    next: EthernetAddress,
) -> Result<(), DropReason> {
    if frame.len() < ip.end() {
        return Err(DropReason::Ipv6Truncated);
    }
    hop(frame)?;
    super::nat::set_macs(frame, ours, next)
}

/// Rewrites the address at `at` to `to`; the change as a checksum delta.
#[inline(always)]
fn swap_addr(frame: &mut [u8], at: usize, to: Ipv6Addr) -> Delta {
    let mut d = Delta::ZERO;
    d.addr(get_addr6(frame, at), to);
    put_addr(frame, at, to);
    d
}

/// Everything forwarding a TCP/UDP packet through full NAT does: hop
/// limit, both ends, one update of the L4 checksum, MACs. On
/// [`DropReason::TtlExceeded`] the frame is unchanged.
#[inline]
pub fn forward6(
    frame: &mut [u8],
    ip: &Ipv6,
    nat: &Nat<Ipv6Addr>,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
) -> Result<(), DropReason> {
    if frame.len() < ip.end() {
        return Err(DropReason::Ipv6Truncated);
    }
    hop(frame)?;
    let mut d = swap_addr(frame, SRC, nat.src.addr);
    d.add(swap_addr(frame, DST, nat.dst.addr));
    let at = ip.l4_offset();
    let sum_at = match ip.l4 {
        L4::Tcp { .. } => Some((at + tcp::CHECKSUM, false)),
        L4::Udp { .. } => Some((at + udp::CHECKSUM, true)),
        _ => None,
    };
    if let Some((sum_at, is_udp)) = sum_at {
        for (off, to) in [(0, nat.src.port), (2, nat.dst.port)] {
            d.word(get16(frame, at + off), to);
            put16(frame, at + off, to);
        }
        let c = get16(frame, sum_at);
        put16(
            frame,
            sum_at,
            if is_udp { d.apply_udp(c) } else { d.apply(c) },
        );
    }
    put_macs(frame, src_mac, dst_mac);
    Ok(())
}

/// Forwards an ICMPv6 error about a tracked flow: hop limit, outer
/// addresses, the quoted packet's addresses, ports and L4 checksum (when
/// quoted), the ICMPv6 checksum for all of them, MACs. Frames that are not
/// ICMPv6 errors get [`DropReason::IcmpErrorUnsupported`].
pub fn icmp_error_forward6(
    frame: &mut [u8],
    ip: &Ipv6,
    nat: &IcmpErrorNat<Ipv6Addr>,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
) -> Result<(), DropReason> {
    let L4::IcmpError(err) = ip.l4 else {
        return Err(DropReason::IcmpErrorUnsupported);
    };
    let inner = err.inner;
    let inner_at = usize::from(inner.offset);
    let quoted_l4 = inner_at + usize::from(inner.header_len);
    if frame.len() < ip.end() || ip.end() < quoted_l4 + usize::from(inner.l4_quoted) {
        return Err(DropReason::Ipv6Truncated);
    }
    hop(frame)?;
    // The ICMPv6 checksum covers the outer addresses (pseudo-header) and
    // every quoted word changed below.
    let mut sum = swap_addr(frame, SRC, nat.outer_src);
    sum.add(swap_addr(frame, DST, nat.outer_dst));
    let mut quoted = Delta::ZERO;
    let ends: [(usize, usize, Endpoint<Ipv6Addr>); 2] =
        [(ipv6::SRC, 0, nat.inner.src), (ipv6::DST, 2, nat.inner.dst)];
    for (addr_at, port_off, to) in ends {
        let d = swap_addr(frame, inner_at + addr_at, to.addr);
        quoted.add(d);
        sum.add(d);
        let at = quoted_l4 + port_off;
        let old = get16(frame, at);
        quoted.word(old, to.port);
        sum.word(old, to.port);
        put16(frame, at, to.port);
    }
    let l4sum = match inner.proto {
        L4Proto::Tcp if usize::from(inner.l4_quoted) >= tcp::CHECKSUM + 2 => {
            Some(quoted_l4 + tcp::CHECKSUM)
        }
        L4Proto::Udp => Some(quoted_l4 + udp::CHECKSUM),
        _ => None,
    };
    if let Some(at) = l4sum {
        let old = get16(frame, at);
        let new = quoted.apply(old);
        sum.word(old, new);
        put16(frame, at, new);
    }
    let at = ip.l4_offset() + icmp::CHECKSUM;
    let c = get16(frame, at);
    put16(frame, at, sum.apply(c));
    put_macs(frame, src_mac, dst_mac);
    Ok(())
}
