//! Classification of a received Ethernet frame: what it is, where its
//! headers are, and the fields the data plane decides on.
//!
//! No-panic contract: [`classify`] accepts any byte slice. Every length is
//! checked before the field is read (through smoltcp's packet types, whose
//! accessors are panic-free once the length is known good); a frame that
//! fails a check yields the [`DropReason`] of the first failed check.
//!
//! Checks, in order: Ethernet length and EtherType; for IPv4 the length,
//! version, IHL (options are skipped by their length, not rejected), total
//! length against the frame (Ethernet padding after it is ignored), header
//! checksum; then the L4 header. L4 checksums are not verified: a corrupt
//! segment stays corrupt through the incremental rewrite and the endpoint
//! discards it, as with any router.
//!
//! A whole IPv4 TCP or UDP packet without options, most of a gateway's
//! traffic, is answered by a plain check of those fields at constant
//! offsets, inlined into the caller; anything else, or a plain packet that
//! fails a check, takes the general walk, whose answer is the same for
//! every frame the plain way accepts (a property test holds them equal).
//!
//! Fragments: the first fragment carries the L4 header and is classified
//! like a whole packet (with [`Fragment::First`]); later fragments carry
//! none and come back as [`L4::None`] with [`Fragment::Later`] (identified
//! by source, destination, protocol and IP ID) for the data plane's
//! fragment policy.

use std::net::Ipv4Addr;

use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, Icmpv4Packet, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};
use xvs_config::Address;
use xvs_conntrack::{FlowKey, L4Proto};

use super::arp::Arp;
use super::field::{eth, icmp, ipv4, tcp, udp};
use super::DropReason;

/// Length of an Ethernet header (no VLAN tag).
pub const ETH_HEADER_LEN: usize = eth::HEADER_LEN;
/// Length of an IPv4 header without options.
pub const IPV4_MIN_HEADER_LEN: usize = ipv4::MIN_HEADER_LEN;
const TCP_MIN_HEADER_LEN: usize = tcp::MIN_HEADER_LEN;
const UDP_HEADER_LEN: usize = udp::HEADER_LEN;
const ICMP_HEADER_LEN: usize = icmp::HEADER_LEN;

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_DST_UNREACHABLE: u8 = 3;
const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// ARP for Ethernet/IPv4.
    Arp(Arp),
    /// IPv4.
    Ipv4(Ipv4),
    /// IPv6 (neighbour discovery included).
    Ipv6(super::ipv6::Ipv6),
}

/// An IPv4 packet's fields and layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4 {
    /// IPv4 header length in bytes (20..=60).
    pub header_len: u8,
    /// IPv4 total length (header + payload).
    pub total_len: u16,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Time to live.
    pub ttl: u8,
    /// IP identification.
    pub ident: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// Whether and which fragment this is.
    pub fragment: Fragment,
    /// The L4 header.
    pub l4: L4,
}

/// Fragment status of an IPv4 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    /// Not fragmented.
    Whole,
    /// Offset 0 with more fragments: carries the L4 header.
    First,
    /// Offset > 0: no L4 header.
    Later,
}

/// The L4 header of an IP packet (of family `A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4<A: Address = Ipv4Addr> {
    /// TCP.
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Flags.
        flags: TcpFlags,
    },
    /// UDP.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
    },
    /// ICMP (or ICMPv6) echo request or reply.
    IcmpEcho {
        /// Request (ICMP type 8, ICMPv6 128) or reply (0, 129).
        request: bool,
        /// Identifier.
        ident: u16,
    },
    /// ICMP destination unreachable or time exceeded (ICMPv6: also packet
    /// too big), quoting a TCP or UDP packet.
    IcmpError(IcmpError<A>),
    /// An IPv6 neighbour solicitation or advertisement.
    Neighbour(super::ndp::Ndp),
    /// A later fragment (IPv6: any fragment): no L4 header.
    None,
}

/// TCP flags byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// ACK.
    pub const ACK: u8 = 0x10;

    /// FIN set.
    pub const fn fin(self) -> bool {
        self.0 & Self::FIN != 0
    }
    /// SYN set.
    pub const fn syn(self) -> bool {
        self.0 & Self::SYN != 0
    }
    /// RST set.
    pub const fn rst(self) -> bool {
        self.0 & Self::RST != 0
    }
    /// ACK set.
    pub const fn ack(self) -> bool {
        self.0 & Self::ACK != 0
    }
}

/// An ICMP error and the packet it quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpError<A: Address = Ipv4Addr> {
    /// ICMP type (3 destination unreachable, 11 time exceeded; ICMPv6: 1
    /// destination unreachable, 2 packet too big, 3 time exceeded).
    pub icmp_type: u8,
    /// ICMP code (type 3 code 4: fragmentation needed).
    pub code: u8,
    /// The quoted (embedded) packet.
    pub inner: Inner<A>,
}

impl<A: Address> IcmpError<A> {
    /// Whether this is "fragmentation needed" (PMTU discovery).
    pub const fn is_frag_needed(&self) -> bool {
        self.icmp_type == ICMP_DST_UNREACHABLE && self.code == 4
    }
}

/// The IP + TCP/UDP header quoted inside an ICMP error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inner<A: Address = Ipv4Addr> {
    /// Offset of the quoted IP header in the frame.
    pub offset: u16,
    /// Its header length in bytes (IPv6: 40, no extension header).
    pub header_len: u8,
    /// Bytes of the quoted L4 header present (at least 8).
    pub l4_quoted: u16,
    /// Its protocol.
    pub proto: L4Proto,
    /// Quoted source address.
    pub src: A,
    /// Quoted destination address.
    pub dst: A,
    /// Quoted source port.
    pub src_port: u16,
    /// Quoted destination port.
    pub dst_port: u16,
}

impl<A: Address> Inner<A> {
    /// The key of the quoted packet, in the direction it was sent.
    pub fn key(&self) -> FlowKey<A> {
        FlowKey {
            src: self.src,
            dst: self.dst,
            src_port: self.src_port,
            dst_port: self.dst_port,
            proto: self.proto,
        }
    }
}

impl Ipv4 {
    /// Offset of the L4 header in the frame.
    pub const fn l4_offset(&self) -> usize {
        ETH_HEADER_LEN + self.header_len as usize
    }

    /// Offset just past the IPv4 packet in the frame (Ethernet padding
    /// excluded).
    pub const fn end(&self) -> usize {
        ETH_HEADER_LEN + self.total_len as usize
    }

    /// The conntrack key this packet is looked up with, in the direction it
    /// travels. For an ICMP error that is the reverse of the quoted packet's
    /// key: the error travels back along the quoted packet's flow.
    pub fn flow_key(&self) -> Option<FlowKey> {
        self.l4.flow_key(self.src, self.dst)
    }
}

impl<A: Address> L4<A> {
    /// The conntrack key of a packet from `src` to `dst` with this L4
    /// header, in the direction it travels (an ICMP error's is the reverse
    /// of its quoted packet's: it travels back along that flow).
    #[inline]
    pub fn flow_key(&self, src: A, dst: A) -> Option<FlowKey<A>> {
        let (proto, src_port, dst_port) = match *self {
            L4::Tcp {
                src_port, dst_port, ..
            } => (L4Proto::Tcp, src_port, dst_port),
            L4::Udp { src_port, dst_port } => (L4Proto::Udp, src_port, dst_port),
            L4::IcmpEcho {
                request: true,
                ident,
            } => (L4Proto::Icmp, ident, 0),
            L4::IcmpEcho {
                request: false,
                ident,
            } => (L4Proto::Icmp, 0, ident),
            L4::IcmpError(e) => return Some(e.inner.key().reversed()),
            L4::Neighbour(_) | L4::None => return None,
        };
        Some(FlowKey {
            src,
            dst,
            src_port,
            dst_port,
            proto,
        })
    }
}

/// Classifies a received frame, or says why it must be dropped.
///
/// Inlined into the caller's loop: most frames are plain IPv4 TCP or UDP
/// (`plain_ipv4`), answered without the general walk's call, its frame
/// and its copy of the result; every other frame, and every plain one
/// that fails a check, goes the general way (`classify_any`), which
/// gives the same answer for a frame the plain way accepts.
#[inline(always)]
pub fn classify(frame: &[u8]) -> Result<Frame, DropReason> {
    let mut out = Err(DropReason::EthTruncated);
    classify_into(frame, &mut out);
    out
}

/// [`classify`] into `out`, each way storing its answer there directly
/// (a batch's array slot: nothing built aside and copied in).
#[inline(always)]
pub fn classify_into(frame: &[u8], out: &mut Result<Frame, DropReason>) {
    match plain_ipv4(frame) {
        Some(ip) => *out = Ok(Frame::Ipv4(ip)),
        None => *out = classify_any(frame),
    }
}

/// A whole IPv4 TCP or UDP packet without options whose every check
/// passes, or `None` (the frame is then classified the general way,
/// which names the reason if it is to be dropped).
///
/// The same checks as [`classify_any`]'s, on constant offsets: version
/// 4 and IHL 5 in one byte, the total length against the frame, the
/// header checksum, neither offset nor more-fragments set, then the L4
/// header's own checks.
#[inline(always)]
fn plain_ipv4(frame: &[u8]) -> Option<Ipv4> {
    const L4_AT: usize = ETH_HEADER_LEN + IPV4_MIN_HEADER_LEN;
    let f = frame.first_chunk::<L4_AT>()?;
    if f[eth::ETHERTYPE..eth::ETHERTYPE + 2] != [0x08, 0x00] {
        return None;
    }
    let h = f.last_chunk::<IPV4_MIN_HEADER_LEN>()?;
    if h[ipv4::VER_IHL] != 0x45 {
        return None;
    }
    let total_len = usize::from(u16::from_be_bytes([h[ipv4::LENGTH], h[ipv4::LENGTH + 1]]));
    let flags_offset = u16::from_be_bytes([h[ipv4::FLAGS_OFFSET], h[ipv4::FLAGS_OFFSET + 1]]);
    if flags_offset & (ipv4::OFFSET_MASK | ipv4::MORE_FRAGMENTS) != 0 || !header_checksum_ok(h, &[])
    {
        return None;
    }
    let seg = frame.get(L4_AT..ETH_HEADER_LEN + total_len)?;
    let protocol = h[ipv4::TTL_PROTO + 1];
    let l4 = match protocol {
        PROTO_TCP => classify_tcp(seg).ok()?,
        PROTO_UDP => classify_udp(seg, Fragment::Whole).ok()?,
        _ => return None,
    };
    Some(ipv4_of(
        h,
        IPV4_MIN_HEADER_LEN,
        total_len,
        Fragment::Whole,
        l4,
    ))
}

/// [`classify`] for any frame: the general walk, out of line.
#[inline(never)]
fn classify_any(frame: &[u8]) -> Result<Frame, DropReason> {
    if frame.len() < ETH_HEADER_LEN {
        return Err(DropReason::EthTruncated);
    }
    let eth = EthernetFrame::new_unchecked(frame);
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => classify_ipv4(frame).map(Frame::Ipv4),
        EthernetProtocol::Arp => Arp::parse(&frame[ETH_HEADER_LEN..]).map(Frame::Arp),
        EthernetProtocol::Ipv6 => super::ipv6::classify_ipv6(frame).map(Frame::Ipv6),
        _ => Err(DropReason::UnsupportedEthertype),
    }
}

fn classify_ipv4(frame: &[u8]) -> Result<Ipv4, DropReason> {
    let avail = &frame[ETH_HEADER_LEN..];
    // The fixed part of the header through one array view: its fields sit
    // at constant offsets, checked once (smoltcp's accessors check every
    // read, and its protocol conversion is an out-of-line call, twice).
    let Some(h) = avail.first_chunk::<IPV4_MIN_HEADER_LEN>() else {
        return Err(DropReason::Ipv4Truncated);
    };
    if h[ipv4::VER_IHL] >> 4 != 4 {
        return Err(DropReason::Ipv4BadVersion);
    }
    let header_len = usize::from(h[ipv4::VER_IHL] & 0x0f) * 4;
    if header_len < IPV4_MIN_HEADER_LEN || header_len > avail.len() {
        return Err(DropReason::Ipv4BadHeaderLen);
    }
    let total_len = usize::from(u16::from_be_bytes([h[ipv4::LENGTH], h[ipv4::LENGTH + 1]]));
    if total_len < header_len || total_len > avail.len() {
        return Err(DropReason::Ipv4BadTotalLen);
    }
    if !header_checksum_ok(h, &avail[IPV4_MIN_HEADER_LEN..header_len]) {
        return Err(DropReason::Ipv4BadChecksum);
    }
    let flags_offset = u16::from_be_bytes([h[ipv4::FLAGS_OFFSET], h[ipv4::FLAGS_OFFSET + 1]]);
    let fragment = match (
        flags_offset & ipv4::OFFSET_MASK,
        flags_offset & ipv4::MORE_FRAGMENTS,
    ) {
        (0, 0) => Fragment::Whole,
        (0, _) => Fragment::First,
        _ => Fragment::Later,
    };
    let protocol = h[ipv4::TTL_PROTO + 1];
    let payload = &avail[header_len..total_len];
    let l4 = match (fragment, protocol) {
        (_, p) if !matches!(p, PROTO_TCP | PROTO_UDP | PROTO_ICMP) => {
            return Err(DropReason::UnsupportedProtocol)
        }
        (Fragment::Later, _) => L4::None,
        (_, PROTO_TCP) => classify_tcp(payload)?,
        (_, PROTO_UDP) => classify_udp(payload, fragment)?,
        _ => classify_icmp(payload, ETH_HEADER_LEN + header_len)?,
    };
    Ok(ipv4_of(h, header_len, total_len, fragment, l4))
}

/// The packet whose fixed header is `h`, with the lengths, fragment
/// status and L4 header its checks found.
#[inline(always)]
fn ipv4_of(
    h: &[u8; IPV4_MIN_HEADER_LEN],
    header_len: usize,
    total_len: usize,
    fragment: Fragment,
    l4: L4,
) -> Ipv4 {
    let addr = |at: usize| Ipv4Addr::new(h[at], h[at + 1], h[at + 2], h[at + 3]);
    Ipv4 {
        header_len: header_len as u8,
        total_len: total_len as u16,
        src: addr(ipv4::SRC),
        dst: addr(ipv4::DST),
        ttl: h[ipv4::TTL_PROTO],
        ident: u16::from_be_bytes([h[ipv4::IDENT], h[ipv4::IDENT + 1]]),
        protocol: h[ipv4::TTL_PROTO + 1],
        fragment,
        l4,
    }
}

/// Verifies an IPv4 header checksum: the fixed 20 bytes `fixed` and the
/// options after them (`options`, a multiple of 4 bytes long: the IHL
/// counts 32-bit words).
///
/// By hand because smoltcp's `checksum::data` sums any slice 16 bits at a
/// time in an out-of-line loop (a twentieth of an established packet's
/// instructions). Here the one's-complement sum runs over 32-bit words,
/// five of them fixed, and is folded once; the sum of a valid header is
/// 0xffff in either byte order, so the words are read in the machine's
/// own. Unlike smoltcp's `verify_checksum`, it also verifies when built
/// with `cfg(fuzzing)`.
#[inline]
fn header_checksum_ok(fixed: &[u8; IPV4_MIN_HEADER_LEN], options: &[u8]) -> bool {
    let word = |w: &[u8]| u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    let mut sum: u64 = fixed.chunks_exact(4).map(word).sum();
    sum += options.chunks_exact(4).map(word).sum::<u64>();
    super::checksum::fold(sum) == 0xffff
}

pub(super) fn classify_tcp<A: Address>(seg: &[u8]) -> Result<L4<A>, DropReason> {
    if seg.len() < TCP_MIN_HEADER_LEN {
        return Err(DropReason::TcpMalformed);
    }
    let tcp = TcpPacket::new_unchecked(seg);
    let data_offset = usize::from(tcp.header_len());
    if data_offset < TCP_MIN_HEADER_LEN || data_offset > seg.len() {
        return Err(DropReason::TcpMalformed);
    }
    Ok(L4::Tcp {
        src_port: tcp.src_port(),
        dst_port: tcp.dst_port(),
        flags: TcpFlags(seg[tcp::FLAGS]),
    })
}

fn classify_udp(dgram: &[u8], fragment: Fragment) -> Result<L4, DropReason> {
    if dgram.len() < UDP_HEADER_LEN {
        return Err(DropReason::UdpMalformed);
    }
    let udp = UdpPacket::new_unchecked(dgram);
    let len = usize::from(udp.len());
    // A first fragment's UDP length covers the whole datagram.
    if len < UDP_HEADER_LEN || (fragment == Fragment::Whole && len > dgram.len()) {
        return Err(DropReason::UdpMalformed);
    }
    Ok(L4::Udp {
        src_port: udp.src_port(),
        dst_port: udp.dst_port(),
    })
}

fn classify_icmp(msg: &[u8], msg_offset: usize) -> Result<L4, DropReason> {
    if msg.len() < ICMP_HEADER_LEN {
        return Err(DropReason::IcmpMalformed);
    }
    let icmp = Icmpv4Packet::new_unchecked(msg);
    let (icmp_type, code) = (msg[0], msg[1]);
    match icmp_type {
        ICMP_ECHO_REQUEST | ICMP_ECHO_REPLY => Ok(L4::IcmpEcho {
            request: icmp_type == ICMP_ECHO_REQUEST,
            ident: icmp.echo_ident(),
        }),
        ICMP_DST_UNREACHABLE | ICMP_TIME_EXCEEDED => {
            let inner = classify_inner(&msg[ICMP_HEADER_LEN..], msg_offset + ICMP_HEADER_LEN)?;
            Ok(L4::IcmpError(IcmpError {
                icmp_type,
                code,
                inner,
            }))
        }
        _ => Err(DropReason::IcmpUnsupportedType),
    }
}

/// The quoted packet of an ICMP error: an IPv4 header and at least the
/// first 8 bytes of its TCP/UDP header (RFC 792), possibly truncated.
fn classify_inner(quoted: &[u8], offset: usize) -> Result<Inner, DropReason> {
    if quoted.len() < IPV4_MIN_HEADER_LEN {
        return Err(DropReason::IcmpErrorMalformed);
    }
    let ip = Ipv4Packet::new_unchecked(quoted);
    let header_len = usize::from(ip.header_len());
    if ip.version() != 4
        || header_len < IPV4_MIN_HEADER_LEN
        || quoted.len() < header_len + 8
        || ip.frag_offset() != 0
    {
        return Err(DropReason::IcmpErrorMalformed);
    }
    let proto = match ip.next_header() {
        IpProtocol::Tcp => L4Proto::Tcp,
        IpProtocol::Udp => L4Proto::Udp,
        _ => return Err(DropReason::IcmpErrorUnsupported),
    };
    let l4 = &quoted[header_len..];
    Ok(Inner {
        offset: offset as u16,
        header_len: header_len as u8,
        l4_quoted: l4.len() as u16,
        proto,
        src: ip.src_addr(),
        dst: ip.dst_addr(),
        src_port: u16::from_be_bytes([l4[0], l4[1]]),
        dst_port: u16::from_be_bytes([l4[2], l4[3]]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A valid Ethernet + IPv4 (no options) + TCP or UDP frame with
    /// `payload` bytes after the L4 header and `pad` bytes of Ethernet
    /// padding after the IP packet.
    fn frame(proto: u8, flags_offset: u16, payload: usize, pad: usize) -> Vec<u8> {
        let l4_len = if proto == PROTO_TCP { 20 } else { 8 };
        let total = 20 + l4_len + payload;
        let mut f = vec![0u8; 14 + total + pad];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let h = &mut f[14..34];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        h[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        h[6..8].copy_from_slice(&flags_offset.to_be_bytes());
        h[8] = 64;
        h[9] = proto;
        h[12..16].copy_from_slice(&[198, 18, 0, 1]);
        h[16..20].copy_from_slice(&[198, 18, 0, 2]);
        let sum = smoltcp::wire::checksum::data(h);
        h[10..12].copy_from_slice(&(!sum).to_be_bytes());
        let l4 = &mut f[34..];
        l4[0..4].copy_from_slice(&[0x9c, 0x40, 0x00, 0x50]);
        if proto == PROTO_TCP {
            l4[12] = 0x50;
            l4[13] = TcpFlags::ACK;
        } else {
            l4[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
        }
        f
    }

    #[test]
    fn plain_tcp_and_udp_take_the_plain_way() {
        for proto in [PROTO_TCP, PROTO_UDP] {
            let f = frame(proto, 0x4000, 6, 4);
            let ip = plain_ipv4(&f).expect("a plain packet is classified the plain way");
            assert_eq!(Ok(Frame::Ipv4(ip)), classify_any(&f));
        }
        // A plain packet that fails a check goes the general way, which
        // names the reason.
        let mut bad_sum = frame(PROTO_TCP, 0, 0, 0);
        bad_sum[18] ^= 1;
        assert_eq!(plain_ipv4(&bad_sum), None);
        assert_eq!(classify(&bad_sum), Err(DropReason::Ipv4BadChecksum));
        let long = frame(PROTO_UDP, 0, 0, 0);
        assert_eq!(
            classify(&long[..long.len() - 1]),
            Err(DropReason::Ipv4BadTotalLen)
        );
        // Fragments, options and other protocols go the general way.
        assert_eq!(plain_ipv4(&frame(PROTO_TCP, 0x2000, 0, 0)), None);
        assert_eq!(plain_ipv4(&frame(PROTO_TCP, 0x0001, 0, 0)), None);
        assert_eq!(plain_ipv4(&frame(PROTO_ICMP, 0, 8, 0)), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]

        /// Whatever the bytes of a frame's headers, `classify` (the plain
        /// way first) answers as the general walk does: the plain way
        /// takes nothing the general walk would classify otherwise or
        /// drop.
        #[test]
        fn the_plain_way_answers_as_the_general_walk(
            tcp in any::<bool>(),
            flags_offset in prop_oneof![Just(0u16), Just(0x4000), Just(0x2000), any::<u16>()],
            payload in 0usize..40,
            pad in 0usize..8,
            edits in prop::collection::vec((0usize..60, any::<u8>()), 0..4),
            cut in prop::option::of(0usize..100),
        ) {
            let proto = if tcp { PROTO_TCP } else { PROTO_UDP };
            let mut f = frame(proto, flags_offset, payload, pad);
            for (at, byte) in edits {
                if let Some(b) = f.get_mut(at) {
                    *b = byte;
                }
            }
            if let Some(cut) = cut {
                f.truncate(cut);
            }
            let general = classify_any(&f);
            if let Some(ip) = plain_ipv4(&f) {
                prop_assert_eq!(Ok(Frame::Ipv4(ip)), general);
            }
            prop_assert_eq!(classify(&f), general);
        }
    }
}
