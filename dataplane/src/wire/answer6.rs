//! The answers of [`super::answer`] for IPv6: echo replies for VIPs,
//! kube-proxy's REJECT (a TCP RST, or an ICMPv6 port unreachable: type 1
//! code 4) and the ICMPv6 time exceeded (type 3 code 0) a router sends
//! for a packet whose hop limit runs out. Neighbour advertisements are
//! [`super::ndp`]'s.
//!
//! Same contract as IPv4's: `Ok(Some(len))` to transmit, `Ok(None)` where
//! RFC 4443 2.4 (e) forbids an answer (an error about an error, about a
//! fragment, or to or from a non-unicast address; a RST for a RST), and
//! [`DropReason::AnswerNoRoom`] for a buffer too short. An ICMPv6 error
//! quotes as much of the packet as fits in the minimum MTU (1280 bytes)
//! and in the buffer.

use std::net::Ipv6Addr;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{IpAddress, IpProtocol, TcpPacket};

use super::answer::{pad, reset_for, swap_macs, ANSWER_TTL};
use super::checksum::{put16, put_addr};
use super::classify::{Fragment, L4};
use super::field::{eth, icmpv6, ipv6, tcp};
use super::ipv6::Ipv6;
use super::ndp::{icmpv6_checksum, l4_checksum6};
use super::DropReason;

const IP: usize = eth::HEADER_LEN;
const L4_AT: usize = IP + ipv6::HEADER_LEN;
/// The minimum IPv6 MTU, which an ICMPv6 error never exceeds.
const MIN_MTU: usize = 1280;

/// Writes a fresh IPv6 header (no extension header) after the Ethernet
/// header. `buf` holds at least both headers.
pub(super) fn write_header(
    buf: &mut [u8],
    payload_len: usize,
    next: u8,
    src: Ipv6Addr,
    dst: Ipv6Addr,
) {
    buf[IP..IP + 4].copy_from_slice(&[0x60, 0, 0, 0]);
    put16(buf, IP + ipv6::PAYLOAD_LEN, payload_len as u16);
    buf[IP + ipv6::NEXT_HEADER] = next;
    buf[IP + ipv6::HOP_LIMIT] = ANSWER_TTL;
    put_addr(buf, IP + ipv6::SRC, src);
    put_addr(buf, IP + ipv6::DST, dst);
}

/// Whether an address may be the source or destination of an answer.
fn unicast(a: Ipv6Addr) -> bool {
    !a.is_unspecified() && !a.is_multicast()
}

/// Turns an ICMPv6 echo request into its reply (addresses and MACs
/// swapped, type 129, hop limit [`ANSWER_TTL`], data echoed, extension
/// headers dropped). Only whole requests to a unicast address are
/// answered.
pub fn echo_reply6(buf: &mut [u8], ip: &Ipv6) -> Result<Option<usize>, DropReason> {
    if !matches!(ip.l4, L4::IcmpEcho { request: true, .. })
        || ip.fragment != Fragment::Whole
        || !unicast(ip.dst)
    {
        return Ok(None);
    }
    if buf.len() < ip.end() {
        return Err(DropReason::Ipv6Truncated);
    }
    let msg_len = ip.end() - ip.l4_offset();
    buf.copy_within(ip.l4_offset()..ip.end(), L4_AT);
    swap_macs(buf);
    write_header(buf, msg_len, ipv6::ICMPV6, ip.dst, ip.src);
    let end = L4_AT + msg_len;
    buf[L4_AT] = icmpv6::ECHO_REPLY;
    put16(buf, L4_AT + 2, 0);
    let sum = icmpv6_checksum(ip.dst, ip.src, &buf[L4_AT..end]);
    put16(buf, L4_AT + 2, sum);
    Ok(Some(pad(buf, end)))
}

/// Turns a TCP segment into the RST that refuses it (the rules of
/// [`super::answer::tcp_reset`]).
pub fn tcp_reset6(buf: &mut [u8], ip: &Ipv6) -> Result<Option<usize>, DropReason> {
    let L4::Tcp {
        src_port,
        dst_port,
        flags,
    } = ip.l4
    else {
        return Ok(None);
    };
    if flags.rst() || ip.fragment != Fragment::Whole || !unicast(ip.src) {
        return Ok(None);
    }
    let len = L4_AT + tcp::MIN_HEADER_LEN;
    if buf.len() < len || buf.len() < ip.end() {
        return Err(DropReason::AnswerNoRoom);
    }
    let rst = reset_for(&buf[ip.l4_offset()..ip.end()], flags, src_port, dst_port);
    swap_macs(buf);
    write_header(buf, tcp::MIN_HEADER_LEN, 6, ip.dst, ip.src);
    rst.emit(
        &mut TcpPacket::new_unchecked(&mut buf[L4_AT..len]),
        &IpAddress::Ipv6(ip.dst),
        &IpAddress::Ipv6(ip.src),
        &ChecksumCapabilities::default(),
    );
    Ok(Some(pad(buf, len)))
}

/// Turns a TCP or UDP packet into an ICMPv6 port unreachable (type 1,
/// code 4) from its destination.
pub fn port_unreachable6(buf: &mut [u8], ip: &Ipv6) -> Result<Option<usize>, DropReason> {
    error_answer6(buf, ip, icmpv6::DST_UNREACHABLE, 4, 0)
}

/// Turns a TCP or UDP packet that no longer fits the next link once
/// encapsulated into an ICMPv6 packet too big (type 2, code 0, RFC 4443
/// 3.2) from its destination, carrying `mtu` (what fits before
/// encapsulation, at least the minimum 1280).
pub fn packet_too_big6(buf: &mut [u8], ip: &Ipv6, mtu: u16) -> Result<Option<usize>, DropReason> {
    let mtu = u32::from(mtu).max(MIN_MTU as u32);
    error_answer6(buf, ip, icmpv6::PACKET_TOO_BIG, 0, mtu)
}

/// Turns a TCP or UDP packet whose hop limit ran out into an ICMPv6 time
/// exceeded (type 3, code 0) from the address it was sent to.
pub fn time_exceeded6(buf: &mut [u8], ip: &Ipv6) -> Result<Option<usize>, DropReason> {
    error_answer6(buf, ip, icmpv6::TIME_EXCEEDED, 0, 0)
}

/// An ICMPv6 error of `kind` and `code` about a TCP or UDP packet, from
/// its destination, quoting the packet from its IPv6 header on; `rest` is
/// the header's second word (the MTU of a packet too big).
fn error_answer6(
    buf: &mut [u8],
    ip: &Ipv6,
    kind: u8,
    code: u8,
    rest: u32,
) -> Result<Option<usize>, DropReason> {
    if !matches!(ip.l4, L4::Tcp { .. } | L4::Udp { .. })
        || ip.fragment != Fragment::Whole
        || !unicast(ip.src)
        || !unicast(ip.dst)
    {
        return Ok(None);
    }
    let at = L4_AT + 8;
    let room = buf.len().min(eth::HEADER_LEN + MIN_MTU);
    if room < at + ipv6::HEADER_LEN + 8 || buf.len() < ip.end() {
        return Err(DropReason::AnswerNoRoom);
    }
    let quote = (ip.end() - IP).min(room - at);
    buf.copy_within(IP..IP + quote, at);
    swap_macs(buf);
    let msg_len = 8 + quote;
    write_header(buf, msg_len, ipv6::ICMPV6, ip.dst, ip.src);
    let end = L4_AT + msg_len;
    buf[L4_AT..at].fill(0);
    buf[L4_AT] = kind;
    buf[L4_AT + 1] = code;
    buf[L4_AT + 4..L4_AT + 8].copy_from_slice(&rest.to_be_bytes());
    let sum = icmpv6_checksum(ip.dst, ip.src, &buf[L4_AT..end]);
    put16(buf, L4_AT + 2, sum);
    Ok(Some(pad(buf, end)))
}

/// Refills the TCP or UDP checksum of a whole IPv6 packet in `frame` (for
/// tests and generators that build frames).
pub fn fill_l4_checksum6(frame: &mut [u8], ip: &Ipv6) {
    let (proto, off) = match ip.l4 {
        L4::Tcp { .. } => (IpProtocol::Tcp, tcp::CHECKSUM),
        L4::Udp { .. } => (IpProtocol::Udp, super::field::udp::CHECKSUM),
        _ => return,
    };
    let at = ip.l4_offset();
    put16(frame, at + off, 0);
    let sum = l4_checksum6(ip.src, ip.dst, proto, &frame[at..ip.end()]);
    put16(frame, at + off, if sum == 0 { 0xffff } else { sum });
}
