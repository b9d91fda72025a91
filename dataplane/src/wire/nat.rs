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

use super::checksum::{get16, get_addr, put16, put_addr, Delta};
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

/// Which L4 checksum a rewrite must keep right.
#[derive(Clone, Copy)]
enum L4Sum {
    Tcp(usize),
    Udp(usize),
    None,
}

impl L4Sum {
    fn of(ip: &Ipv4) -> L4Sum {
        match ip.l4 {
            L4::Tcp { .. } => L4Sum::Tcp(ip.l4_offset()),
            L4::Udp { .. } => L4Sum::Udp(ip.l4_offset()),
            _ => L4Sum::None,
        }
    }

    /// Offset of the ports, if the packet has them.
    fn ports_at(self) -> Option<usize> {
        match self {
            L4Sum::Tcp(at) | L4Sum::Udp(at) => Some(at),
            L4Sum::None => None,
        }
    }

    fn apply(self, frame: &mut [u8], delta: Delta) {
        match self {
            L4Sum::Tcp(at) => {
                let c = get16(frame, at + tcp::CHECKSUM);
                put16(frame, at + tcp::CHECKSUM, delta.apply(c));
            }
            L4Sum::Udp(at) => {
                let c = get16(frame, at + udp::CHECKSUM);
                put16(frame, at + udp::CHECKSUM, delta.apply_udp(c));
            }
            L4Sum::None => {}
        }
    }
}

#[inline(always)]
fn ensure(frame: &[u8], ip: &Ipv4) -> Result<(), DropReason> {
    if frame.len() < ip.end() {
        Err(DropReason::Ipv4Truncated)
    } else {
        Ok(())
    }
}

#[inline(always)]
fn apply_ip(frame: &mut [u8], delta: Delta) {
    let c = get16(frame, IP_CHECKSUM);
    put16(frame, IP_CHECKSUM, delta.apply(c));
}

/// Rewrites one end (`addr_at`: IP_SRC or IP_DST; `port_off`: 0 source
/// port, 2 destination port), recording checksum changes.
#[inline(always)]
fn rewrite_end(
    frame: &mut [u8],
    l4: L4Sum,
    addr_at: usize,
    port_off: usize,
    to: Endpoint,
    ip_delta: &mut Delta,
    l4_delta: &mut Delta,
) {
    let old = get_addr(frame, addr_at);
    let mut d = Delta::ZERO;
    d.addr(old, to.addr);
    put_addr(frame, addr_at, to.addr);
    ip_delta.add(d);
    if let Some(at) = l4.ports_at() {
        // The pseudo-header holds the addresses: the L4 checksum sees them.
        l4_delta.add(d);
        let old_port = get16(frame, at + port_off);
        l4_delta.word(old_port, to.port);
        put16(frame, at + port_off, to.port);
    }
}

/// Rewrites the source address and (for TCP/UDP) port.
pub fn set_source(frame: &mut [u8], ip: &Ipv4, to: Endpoint) -> Result<(), DropReason> {
    ensure(frame, ip)?;
    let l4 = L4Sum::of(ip);
    let (mut ipd, mut l4d) = (Delta::ZERO, Delta::ZERO);
    rewrite_end(frame, l4, IP_SRC, 0, to, &mut ipd, &mut l4d);
    apply_ip(frame, ipd);
    l4.apply(frame, l4d);
    Ok(())
}

/// Rewrites the destination address and (for TCP/UDP) port.
pub fn set_destination(frame: &mut [u8], ip: &Ipv4, to: Endpoint) -> Result<(), DropReason> {
    ensure(frame, ip)?;
    let l4 = L4Sum::of(ip);
    let (mut ipd, mut l4d) = (Delta::ZERO, Delta::ZERO);
    rewrite_end(frame, l4, IP_DST, 2, to, &mut ipd, &mut l4d);
    apply_ip(frame, ipd);
    l4.apply(frame, l4d);
    Ok(())
}

/// Records a TTL decrement, or refuses it if the packet would expire.
#[inline(always)]
fn ttl_delta(frame: &mut [u8], ipd: &mut Delta) -> Result<(), DropReason> {
    let word = get16(frame, IP_TTL_PROTO);
    let ttl = (word >> 8) as u8;
    if ttl <= 1 {
        return Err(DropReason::TtlExceeded);
    }
    let new = word - 0x0100;
    ipd.word(word, new);
    put16(frame, IP_TTL_PROTO, new);
    Ok(())
}

/// Decrements the TTL; a packet whose TTL would reach 0 is refused with
/// [`DropReason::TtlExceeded`] and left unchanged.
pub fn decrement_ttl(frame: &mut [u8], ip: &Ipv4) -> Result<(), DropReason> {
    ensure(frame, ip)?;
    let mut ipd = Delta::ZERO;
    ttl_delta(frame, &mut ipd)?;
    apply_ip(frame, ipd);
    Ok(())
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
///
/// Every packet of a flow takes this path, so it works on fixed views:
/// the Ethernet and IPv4 headers' fixed part, and the L4 header's ports
/// and checksum, each checked once before anything is written; the fields
/// are then at constant offsets, with no check per field.
#[inline]
pub fn forward(
    frame: &mut [u8],
    ip: &Ipv4,
    nat: &Nat,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
) -> Result<(), DropReason> {
    const HEAD: usize = eth::HEADER_LEN + ipv4::MIN_HEADER_LEN;
    ensure(frame, ip)?;
    let (head, l4) = frame
        .split_at_mut_checked(ip.l4_offset())
        .ok_or(DropReason::Ipv4Truncated)?;
    let head = head
        .first_chunk_mut::<HEAD>()
        .ok_or(DropReason::Ipv4Truncated)?;
    let l4 = match ip.l4 {
        L4::Tcp { .. } => L4View::Tcp(
            l4.first_chunk_mut::<{ tcp::MIN_HEADER_LEN }>()
                .ok_or(DropReason::Ipv4Truncated)?,
        ),
        L4::Udp { .. } => L4View::Udp(
            l4.first_chunk_mut::<{ udp::HEADER_LEN }>()
                .ok_or(DropReason::Ipv4Truncated)?,
        ),
        _ => L4View::None,
    };
    // The sums run over the words as the machine reads them: a one's-
    // complement sum is the same in either byte order, byte-swapped
    // (RFC 1071, 2.(B)), so reading, summing and writing every word
    // natively keeps each checksum right without swapping a byte.
    let ttl = head[IP_TTL_PROTO];
    if ttl <= 1 {
        return Err(DropReason::TtlExceeded);
    }
    let proto = head[IP_TTL_PROTO + 1];
    let mut ipd = Delta::ZERO;
    ipd.word(
        u16::from_ne_bytes([ttl, proto]),
        u16::from_ne_bytes([ttl - 1, proto]),
    );
    head[IP_TTL_PROTO] = ttl - 1;
    let mut addrs = Delta::ZERO;
    for (at, to) in [(IP_SRC, nat.src.addr), (IP_DST, nat.dst.addr)] {
        let field = &mut head[at..at + 4];
        let old = u32::from_ne_bytes([field[0], field[1], field[2], field[3]]);
        addrs.dword(old, u32::from_ne_bytes(to.octets()));
        field.copy_from_slice(&to.octets());
    }
    ipd.add(addrs);
    let sum = ipd.apply(ne16(head, IP_CHECKSUM));
    head[IP_CHECKSUM..IP_CHECKSUM + 2].copy_from_slice(&sum.to_ne_bytes());
    match l4 {
        L4View::Tcp(seg) => nat_ports(seg, tcp::CHECKSUM, nat, addrs, Delta::apply),
        L4View::Udp(dgram) => nat_ports(dgram, udp::CHECKSUM, nat, addrs, Delta::apply_udp),
        L4View::None => {}
    }
    put_macs(head, src_mac, dst_mac);
    Ok(())
}

/// The 16-bit word at `at`, as the machine reads it.
#[inline(always)]
fn ne16(buf: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([buf[at], buf[at + 1]])
}

/// [`forward`]'s view of the L4 header: its fixed part.
enum L4View<'a> {
    Tcp(&'a mut [u8; tcp::MIN_HEADER_LEN]),
    Udp(&'a mut [u8; udp::HEADER_LEN]),
    None,
}

/// Rewrites the ports at the start of an L4 header (`l4`, its first `N`
/// bytes) and updates its checksum at `sum_at` for them and for the
/// pseudo-header's address change `addrs`, with `apply` (TCP's or UDP's
/// rule). Native word order, as in [`forward`]: `addrs` is too.
#[inline(always)]
fn nat_ports<const N: usize>(
    l4: &mut [u8; N],
    sum_at: usize,
    nat: &Nat,
    mut d: Delta,
    apply: fn(Delta, u16) -> u16,
) {
    for (at, port) in [(0, nat.src.port), (2, nat.dst.port)] {
        let new = port.to_be_bytes();
        d.word(ne16(l4, at), u16::from_ne_bytes(new));
        l4[at..at + 2].copy_from_slice(&new);
    }
    let sum = apply(d, ne16(l4, sum_at));
    l4[sum_at..sum_at + 2].copy_from_slice(&sum.to_ne_bytes());
}
