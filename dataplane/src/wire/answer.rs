//! Answers xvs builds in place of the frame that asked: ARP replies for the
//! addresses it owns, ICMP echo replies for VIPs, kube-proxy's REJECT
//! for "no service / no endpoints" (a TCP RST for TCP, ICMP port
//! unreachable for UDP), and the ICMP time exceeded a router sends for a
//! packet whose TTL runs out.
//!
//! Each function turns the received frame, in its own buffer, into the
//! answer and returns how many bytes to transmit: `Ok(Some(len))`. Where
//! the RFCs forbid an answer (a RST for a RST; an ICMP error about a
//! broadcast, multicast or later-fragment packet) it returns `Ok(None)` and
//! leaves the frame alone; the caller drops it with its own reason. Short
//! answers are zero-padded to the Ethernet minimum when the buffer allows.
//!
//! No-panic contract: lengths are checked against the buffer before any
//! write; a buffer too small for the answer gives
//! [`DropReason::AnswerNoRoom`].

use std::net::Ipv4Addr;

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetAddress, Icmpv4Message, Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, Ipv4Repr,
    TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
};

use super::arp::{Arp, ArpOp};
use super::checksum::{get16, put16, put_addr, Delta};
use super::classify::{Fragment, Ipv4, L4};
use super::field::{eth, icmp, ipv4, tcp};
use super::DropReason;
use xvs_config::is_unicast;

/// Shortest Ethernet frame without FCS.
pub const ETH_MIN_FRAME: usize = eth::MIN_FRAME;
/// TTL of packets xvs originates.
pub const ANSWER_TTL: u8 = 64;
const ETH_HEADER_LEN: usize = eth::HEADER_LEN;
const TCP_HEADER_LEN: usize = tcp::MIN_HEADER_LEN;
const ICMP_HEADER_LEN: usize = icmp::HEADER_LEN;
const IP_HEADER_LEN: usize = ipv4::MIN_HEADER_LEN;

/// Zero-pads an answer of `len` bytes to the Ethernet minimum if the
/// buffer is long enough; returns the length to transmit.
pub(super) fn pad(buf: &mut [u8], len: usize) -> usize {
    if len < ETH_MIN_FRAME && buf.len() >= ETH_MIN_FRAME {
        buf[len..ETH_MIN_FRAME].fill(0);
        ETH_MIN_FRAME
    } else {
        len
    }
}

/// Swaps the Ethernet source and destination. `buf.len() >= 14`.
pub(super) fn swap_macs(buf: &mut [u8]) {
    let mut dst = [0u8; 6];
    dst.copy_from_slice(&buf[eth::DST..eth::DST + 6]);
    buf.copy_within(eth::SRC..eth::SRC + 6, eth::DST);
    buf[eth::SRC..eth::SRC + 6].copy_from_slice(&dst);
}

/// Turns an ARP request for an address xvs owns into the reply "it is at
/// `our_mac`". Replies (and requests for other addresses, which the caller
/// filters) get `Ok(None)`.
pub fn arp_reply(
    buf: &mut [u8],
    arp: &Arp,
    our_mac: EthernetAddress,
) -> Result<Option<usize>, DropReason> {
    if arp.op != ArpOp::Request {
        return Ok(None);
    }
    let reply = Arp {
        op: ArpOp::Reply,
        sender_mac: our_mac,
        sender_ip: arp.target_ip,
        target_mac: arp.sender_mac,
        target_ip: arp.sender_ip,
    };
    match reply.emit(buf, arp.sender_mac) {
        Some(len) => Ok(Some(len)),
        None => Err(DropReason::AnswerNoRoom),
    }
}

/// Turns an ICMP echo request into its reply: addresses and MACs swapped,
/// type 0, TTL [`ANSWER_TTL`], data echoed. Only whole (unfragmented)
/// requests are answered.
pub fn icmp_echo_reply(buf: &mut [u8], ip: &Ipv4) -> Result<Option<usize>, DropReason> {
    if !matches!(ip.l4, L4::IcmpEcho { request: true, .. }) || ip.fragment != Fragment::Whole {
        return Ok(None);
    }
    if buf.len() < ip.end() {
        return Err(DropReason::Ipv4Truncated);
    }
    swap_macs(buf);
    let at = ETH_HEADER_LEN;
    // Swapping the addresses leaves the header sum unchanged; the TTL does not.
    let mut ipd = Delta::ZERO;
    let ttl_proto = get16(buf, at + ipv4::TTL_PROTO);
    let new = u16::from(ANSWER_TTL) << 8 | (ttl_proto & 0xff);
    ipd.word(ttl_proto, new);
    put16(buf, at + ipv4::TTL_PROTO, new);
    put_addr(buf, at + ipv4::SRC, ip.dst);
    put_addr(buf, at + ipv4::DST, ip.src);
    let c = get16(buf, at + ipv4::CHECKSUM);
    put16(buf, at + ipv4::CHECKSUM, ipd.apply(c));
    let m = ip.l4_offset();
    let type_code = get16(buf, m + icmp::TYPE_CODE);
    let mut d = Delta::ZERO;
    d.word(type_code, type_code & 0x00ff);
    put16(buf, m + icmp::TYPE_CODE, type_code & 0x00ff);
    let c = get16(buf, m + icmp::CHECKSUM);
    put16(buf, m + icmp::CHECKSUM, d.apply(c));
    Ok(Some(pad(buf, ip.end())))
}

/// Emits a fresh 20-byte IPv4 header after the Ethernet header and fills
/// its checksum. `buf` holds at least the Ethernet and IPv4 headers.
pub(super) fn write_ip_header(
    buf: &mut [u8],
    total_len: u16,
    tos: u8,
    dont_frag: bool,
    proto: IpProtocol,
    src: Ipv4Addr,
    dst: Ipv4Addr,
) {
    let h = &mut buf[ETH_HEADER_LEN..ETH_HEADER_LEN + IP_HEADER_LEN];
    let mut p = Ipv4Packet::new_unchecked(h);
    Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: proto,
        payload_len: usize::from(total_len) - IP_HEADER_LEN,
        hop_limit: ANSWER_TTL,
    }
    .emit(&mut p, &ChecksumCapabilities::ignored());
    p.set_dscp(tos >> 2);
    p.set_ecn(tos & 0x03);
    p.set_dont_frag(dont_frag);
    p.fill_checksum();
}

/// Turns a TCP segment into the RST that refuses it (RFC 793, "Reset
/// Generation"): if it carried an ACK, `seq = SEG.ACK` and no ACK;
/// otherwise `seq = 0, ack = SEG.SEQ + SEG.LEN` (SYN and FIN count one)
/// with ACK set. A RST is never answered.
pub fn tcp_reset(buf: &mut [u8], ip: &Ipv4) -> Result<Option<usize>, DropReason> {
    let L4::Tcp {
        src_port,
        dst_port,
        flags,
    } = ip.l4
    else {
        return Ok(None);
    };
    if flags.rst() || ip.fragment == Fragment::Later {
        return Ok(None);
    }
    let len = ETH_HEADER_LEN + IP_HEADER_LEN + TCP_HEADER_LEN;
    if buf.len() < len || buf.len() < ip.end() {
        return Err(DropReason::AnswerNoRoom);
    }
    let rst = reset_for(&buf[ip.l4_offset()..ip.end()], flags, src_port, dst_port);
    swap_macs(buf);
    write_ip_header(
        buf,
        (IP_HEADER_LEN + TCP_HEADER_LEN) as u16,
        0,
        true,
        IpProtocol::Tcp,
        ip.dst,
        ip.src,
    );
    let t = &mut buf[ETH_HEADER_LEN + IP_HEADER_LEN..len];
    rst.emit(
        &mut TcpPacket::new_unchecked(t),
        &IpAddress::Ipv4(ip.dst),
        &IpAddress::Ipv4(ip.src),
        &ChecksumCapabilities::default(),
    );
    Ok(Some(pad(buf, len)))
}

/// The RST refusing the received TCP segment `seg` (header and
/// payload) from `src_port` to `dst_port` with `flags`: RFC 793's reset
/// generation (see [`tcp_reset`]), for either family.
pub(super) fn reset_for(
    seg: &[u8],
    flags: super::TcpFlags,
    src_port: u16,
    dst_port: u16,
) -> TcpRepr<'static> {
    let t = TcpPacket::new_unchecked(seg);
    let payload = seg.len().saturating_sub(usize::from(t.header_len()));
    let (seq_in, ack_in) = (t.seq_number().0 as u32, t.ack_number().0 as u32);
    let seg_len = (payload + usize::from(flags.syn()) + usize::from(flags.fin())) as u32;
    let (seq, ack) = if flags.ack() {
        (ack_in, None)
    } else {
        (0, Some(seq_in.wrapping_add(seg_len)))
    };
    TcpRepr {
        src_port: dst_port,
        dst_port: src_port,
        control: TcpControl::Rst,
        seq_number: TcpSeqNumber(seq as i32),
        ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
        window_len: 0,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    }
}

/// Turns a TCP or UDP packet into an ICMP port unreachable (type 3, code
/// 3) from its destination, quoting its IPv4 header and first 8 payload
/// bytes (RFC 792). Suppressed (RFC 1812 4.3.2.7) for later fragments and
/// for packets from or to a non-unicast address.
pub fn icmp_port_unreachable(buf: &mut [u8], ip: &Ipv4) -> Result<Option<usize>, DropReason> {
    icmp_error_answer(buf, ip, 3, 3, 0)
}

/// Turns a TCP or UDP packet that no longer fits the next link once
/// encapsulated into an ICMP fragmentation needed (type 3, code 4, RFC
/// 1191) from its destination, carrying `mtu` (what fits before
/// encapsulation) as the next-hop MTU, so the client's PMTU discovery
/// lowers its segment size. Suppressed like [`icmp_port_unreachable`].
pub fn icmp_frag_needed(buf: &mut [u8], ip: &Ipv4, mtu: u16) -> Result<Option<usize>, DropReason> {
    icmp_error_answer(buf, ip, 3, 4, u32::from(mtu))
}

/// Turns a TCP or UDP packet whose TTL ran out (0 or 1 on arrival: it
/// cannot be forwarded) into an ICMP time exceeded in transit (type 11,
/// code 0, RFC 792 and RFC 1812 5.3.1) from the address it was sent to
/// (a VIP or SNAT address xvs owns), quoting it like any ICMP error.
/// Suppressed like [`icmp_port_unreachable`].
pub fn icmp_time_exceeded(buf: &mut [u8], ip: &Ipv4) -> Result<Option<usize>, DropReason> {
    icmp_error_answer(buf, ip, 11, 0, 0)
}

/// An ICMP error of `kind` and `code` about a TCP or UDP packet, from its
/// destination; `rest` is the header's second word (zero but for
/// fragmentation needed, where it carries the next-hop MTU).
fn icmp_error_answer(
    buf: &mut [u8],
    ip: &Ipv4,
    kind: u8,
    code: u8,
    rest: u32,
) -> Result<Option<usize>, DropReason> {
    if !matches!(ip.l4, L4::Tcp { .. } | L4::Udp { .. })
        || ip.fragment == Fragment::Later
        || !is_unicast(ip.src)
        || !is_unicast(ip.dst)
    {
        return Ok(None);
    }
    let quote = usize::from(ip.header_len) + 8;
    let at = ETH_HEADER_LEN + IP_HEADER_LEN;
    let len = at + ICMP_HEADER_LEN + quote;
    if buf.len() < len || buf.len() < ETH_HEADER_LEN + quote {
        return Err(DropReason::AnswerNoRoom);
    }
    buf.copy_within(ETH_HEADER_LEN..ETH_HEADER_LEN + quote, at + ICMP_HEADER_LEN);
    swap_macs(buf);
    // Precedence "internetwork control", as Linux sends ICMP errors.
    write_ip_header(
        buf,
        (len - ETH_HEADER_LEN) as u16,
        0xc0,
        false,
        IpProtocol::Icmp,
        ip.dst,
        ip.src,
    );
    // The quote is the received header as it was (options included, RFC
    // 792), not one re-emitted from a representation: only the ICMP
    // header is written here.
    let m = &mut buf[at..len];
    m[..ICMP_HEADER_LEN].fill(0); // checksum, unused
    m[4..8].copy_from_slice(&rest.to_be_bytes());
    let mut msg = Icmpv4Packet::new_unchecked(m);
    msg.set_msg_type(Icmpv4Message::from(kind));
    msg.set_msg_code(code);
    msg.fill_checksum();
    Ok(Some(pad(buf, len)))
}
