//! In-place NAT of a classified IPv4 frame: addresses, ports, TTL and MACs,
//! with every checksum updated incrementally (RFC 1624).
//!
//! Each function reads the current value of what it rewrites from the frame
//! itself, so rewrites compose in any order and number; the [`Ipv4`] passed
//! in only supplies the layout (offsets and the kind of L4 header), which no
//! rewrite changes.
//!
//! What each L4 kind gets: TCP and UDP (whole or first fragment) have their
//! ports rewritten and their checksum updated for the pseudo-header and the
//! ports; a zero UDP checksum (none) stays zero. Later fragments, ICMP echo
//! and ICMP errors have only their IPv4 addresses rewritten here (ICMP has no
//! pseudo-header; quoted headers are [`super::icmp_error`]'s job).
//!
//! No-panic contract: every function first checks that the frame is at
//! least as long as its classification says and otherwise returns
//! [`DropReason::Ipv4Truncated`]; after that every offset is in bounds.

use std::net::Ipv4Addr;

use smoltcp::wire::EthernetAddress;
use xvs_config::Address;
pub use xvs_conntrack::Endpoint;

use super::checksum::Delta;
use super::classify::{Ipv4, L4};
use super::field::{eth, ipv4, tcp, udp};
use super::DropReason;

/// IPv4 header fields, from the start of the frame.
const IP_TTL_PROTO: usize = eth::HEADER_LEN + ipv4::TTL_PROTO;
const IP_CHECKSUM: usize = eth::HEADER_LEN + ipv4::CHECKSUM;
const IP_SRC: usize = eth::HEADER_LEN + ipv4::SRC;
const IP_DST: usize = eth::HEADER_LEN + ipv4::DST;

/// A full-NAT mapping: both ends of the packet are rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nat<A: Address = Ipv4Addr> {
    /// New source.
    pub src: Endpoint<A>,
    /// New destination.
    pub dst: Endpoint<A>,
}

#[inline(always)]
fn ensure(frame: &[u8], ip: &Ipv4) -> Result<(), DropReason> {
    if frame.len() < ip.end() {
        Err(DropReason::Ipv4Truncated)
    } else {
        Ok(())
    }
}

/// Rewrites the source address and (for TCP/UDP) port.
pub fn set_source(frame: &mut [u8], ip: &Ipv4, to: Endpoint) -> Result<(), DropReason> {
    rewrite(
        frame,
        ip,
        Pass {
            src: Some(to),
            ..Pass::NONE
        },
    )
}

/// Rewrites the destination address and (for TCP/UDP) port.
pub fn set_destination(frame: &mut [u8], ip: &Ipv4, to: Endpoint) -> Result<(), DropReason> {
    rewrite(
        frame,
        ip,
        Pass {
            dst: Some(to),
            ..Pass::NONE
        },
    )
}

/// Decrements the TTL; a packet whose TTL would reach 0 is refused with
/// [`DropReason::TtlExceeded`] and left unchanged.
pub fn decrement_ttl(frame: &mut [u8], ip: &Ipv4) -> Result<(), DropReason> {
    rewrite(
        frame,
        ip,
        Pass {
            ttl: true,
            ..Pass::NONE
        },
    )
}

/// Direct routing (IPVS's `-g`): the packet leaves as it came but for the
/// TTL (a router's decrement) and the MACs. On
/// [`DropReason::TtlExceeded`] the frame is unchanged.
pub fn route(
    frame: &mut [u8],
    ip: &Ipv4,
    ours: EthernetAddress,
    next: EthernetAddress,
) -> Result<(), DropReason> {
    decrement_ttl(frame, ip)?;
    set_macs(frame, ours, next)
}

/// Sets the Ethernet source and destination addresses.
pub fn set_macs(
    frame: &mut [u8],
    src: EthernetAddress,
    dst: EthernetAddress,
) -> Result<(), DropReason> {
    if frame.len() < eth::HEADER_LEN {
        return Err(DropReason::EthTruncated);
    }
    put_macs(frame, src, dst);
    Ok(())
}

/// Writes the Ethernet addresses of a frame at least
/// [`eth::HEADER_LEN`] long.
pub(super) fn put_macs(frame: &mut [u8], src: EthernetAddress, dst: EthernetAddress) {
    frame[eth::DST..eth::DST + 6].copy_from_slice(&dst.0);
    frame[eth::SRC..eth::SRC + 6].copy_from_slice(&src.0);
}

/// Everything forwarding a TCP/UDP packet through full NAT does, in one
/// pass with one update per checksum: TTL decrement, source and destination
/// rewrite, MACs. On [`DropReason::TtlExceeded`] the frame is unchanged.
#[inline]
pub fn forward(
    frame: &mut [u8],
    ip: &Ipv4,
    nat: &Nat,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
) -> Result<(), DropReason> {
    rewrite(
        frame,
        ip,
        Pass {
            ttl: true,
            src: Some(nat.src),
            dst: Some(nat.dst),
            macs: Some((src_mac, dst_mac)),
        },
    )
}

/// What one [`rewrite`] pass changes.
#[derive(Clone, Copy)]
struct Pass {
    /// Decrement the TTL.
    ttl: bool,
    /// New source address and (TCP/UDP) port.
    src: Option<Endpoint>,
    /// New destination address and (TCP/UDP) port.
    dst: Option<Endpoint>,
    /// New Ethernet source and destination.
    macs: Option<(EthernetAddress, EthernetAddress)>,
}

impl Pass {
    const NONE: Pass = Pass {
        ttl: false,
        src: None,
        dst: None,
        macs: None,
    };
}

/// Every IPv4 rewrite, in one pass with one update per checksum (each
/// caller's `pass` is a constant, so what it leaves out is compiled out).
///
/// Every packet of a flow takes this path, so it works on fixed views:
/// the Ethernet and IPv4 headers' fixed part, and (when ends change) the
/// L4 header's ports and checksum, each checked once before anything is
/// written; the fields are then at constant offsets, with no check per
/// field. The sums run over the words as the machine reads them: a
/// one's-complement sum is the same in either byte order, byte-swapped
/// (RFC 1071, 2.(B)), so reading, summing and writing every word
/// natively keeps each checksum right without swapping a byte.
#[inline(always)]
fn rewrite(frame: &mut [u8], ip: &Ipv4, pass: Pass) -> Result<(), DropReason> {
    const HEAD: usize = eth::HEADER_LEN + ipv4::MIN_HEADER_LEN;
    ensure(frame, ip)?;
    let (head, l4) = frame
        .split_at_mut_checked(ip.l4_offset())
        .ok_or(DropReason::Ipv4Truncated)?;
    let head = head
        .first_chunk_mut::<HEAD>()
        .ok_or(DropReason::Ipv4Truncated)?;
    let ends = pass.src.is_some() || pass.dst.is_some();
    let l4 = match ip.l4 {
        L4::Tcp { .. } if ends => L4View::Tcp(
            l4.first_chunk_mut::<{ tcp::MIN_HEADER_LEN }>()
                .ok_or(DropReason::Ipv4Truncated)?,
        ),
        L4::Udp { .. } if ends => L4View::Udp(
            l4.first_chunk_mut::<{ udp::HEADER_LEN }>()
                .ok_or(DropReason::Ipv4Truncated)?,
        ),
        _ => L4View::None,
    };
    let mut ipd = Delta::ZERO;
    if pass.ttl {
        let ttl = head[IP_TTL_PROTO];
        if ttl <= 1 {
            return Err(DropReason::TtlExceeded);
        }
        let proto = head[IP_TTL_PROTO + 1];
        ipd.word(
            u16::from_ne_bytes([ttl, proto]),
            u16::from_ne_bytes([ttl - 1, proto]),
        );
        head[IP_TTL_PROTO] = ttl - 1;
    }
    // The pseudo-header holds the addresses: the L4 checksum sees them.
    let mut addrs = Delta::ZERO;
    if let Some(to) = pass.src {
        set_addr(head, IP_SRC, to.addr, &mut addrs);
    }
    if let Some(to) = pass.dst {
        set_addr(head, IP_DST, to.addr, &mut addrs);
    }
    ipd.add(addrs);
    let sum = ipd.apply(ne16(head, IP_CHECKSUM));
    head[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&sum.to_ne_bytes());
    let ports = [pass.src.map(|e| e.port), pass.dst.map(|e| e.port)];
    match l4 {
        L4View::Tcp(seg) => nat_ports(seg, tcp::CHECKSUM, ports, addrs, Delta::apply),
        L4View::Udp(dgram) => nat_ports(dgram, udp::CHECKSUM, ports, addrs, Delta::apply_udp),
        L4View::None => {}
    }
    if let Some((src, dst)) = pass.macs {
        put_macs(head, src, dst);
    }
    Ok(())
}

/// The 16-bit word at `at`, as the machine reads it.
#[inline(always)]
fn ne16(buf: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([buf[at], buf[at + 1]])
}

/// Writes the address at `at` of the fixed header view, recording the
/// change in native word order.
#[inline(always)]
fn set_addr<const N: usize>(head: &mut [u8; N], at: usize, to: Ipv4Addr, d: &mut Delta) {
    let old = u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    d.dword(old, u32::from_ne_bytes(to.octets()));
    head[at..at + 4].copy_from_slice(&to.octets());
}

/// Writes the port at `at` of the L4 view, recording the change in
/// native word order.
#[inline(always)]
fn set_port<const N: usize>(l4: &mut [u8; N], at: usize, port: u16, d: &mut Delta) {
    let new = port.to_be_bytes();
    d.word(ne16(l4, at), u16::from_ne_bytes(new));
    l4[at..at + 2].copy_from_slice(&new);
}

/// [`rewrite`]'s view of the L4 header: its fixed part.
enum L4View<'a> {
    Tcp(&'a mut [u8; tcp::MIN_HEADER_LEN]),
    Udp(&'a mut [u8; udp::HEADER_LEN]),
    None,
}

/// Rewrites the ports at the start of an L4 header (`l4`, its first `N`
/// bytes; `ports`: the new source and destination port, each if it
/// changes) and updates its checksum at `sum_at` for them and for the
/// pseudo-header's address change `addrs`, with `apply` (TCP's or UDP's
/// rule). Native word order, as in [`rewrite`]: `addrs` is too.
#[inline(always)]
fn nat_ports<const N: usize>(
    l4: &mut [u8; N],
    sum_at: usize,
    ports: [Option<u16>; 2],
    mut d: Delta,
    apply: fn(Delta, u16) -> u16,
) {
    if let Some(port) = ports[0] {
        set_port(l4, 0, port, &mut d);
    }
    if let Some(port) = ports[1] {
        set_port(l4, 2, port, &mut d);
    }
    let sum = apply(d, ne16(l4, sum_at));
    l4[sum_at..sum_at + 2].copy_from_slice(&sum.to_ne_bytes());
}
