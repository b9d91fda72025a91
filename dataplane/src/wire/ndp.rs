//! IPv6 neighbour discovery (RFC 4861), the part a gateway needs: neighbour
//! solicitations and advertisements parsed from ICMPv6, the advertisement
//! answering a solicitation for an address xvs owns, and the solicitation
//! that resolves a next hop (ARP's two jobs for IPv6).
//!
//! Validation as RFC 4861 7.1 asks: hop limit 255 (the packet cannot have
//! crossed a router), code 0, at least 24 bytes, options of non-zero
//! length within the message. The ICMPv6 checksum is not verified (as for
//! the L4 checksums the classifier reads): a corrupt solicitation gets an
//! answer the asker discards.
//!
//! No-panic contract: [`Ndp::parse`] accepts any slice; the emitters check
//! the buffer's length first and return `None` when it is too short.

use std::net::Ipv6Addr;

use smoltcp::wire::{EthernetAddress, IpProtocol};

use super::checksum::{get_addr6, put16, put_addr};
use super::field::{eth, icmpv6, ipv6};
use super::DropReason;

/// Hop limit of every neighbour discovery message.
pub const NDP_HOP_LIMIT: u8 = 255;
/// Length of the frames built here: Ethernet, IPv6, a 24-byte message and
/// one 8-byte link-layer address option.
pub const NDP_FRAME_LEN: usize = eth::HEADER_LEN + ipv6::HEADER_LEN + icmpv6::NDP_LEN + 8;

/// A neighbour solicitation or advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ndp {
    /// A solicitation (type 135), else an advertisement (136).
    pub solicit: bool,
    /// The address asked about or advertised.
    pub target: Ipv6Addr,
    /// The link-layer address option: the sender's in a solicitation,
    /// the target's in an advertisement.
    pub lladdr: Option<EthernetAddress>,
}

impl Ndp {
    /// Parses a neighbour solicitation or advertisement (the ICMPv6
    /// message) received with `hop_limit`.
    pub fn parse(msg: &[u8], hop_limit: u8) -> Result<Ndp, DropReason> {
        if hop_limit != NDP_HOP_LIMIT || msg.len() < icmpv6::NDP_LEN || msg[1] != 0 {
            return Err(DropReason::NdpMalformed);
        }
        let solicit = msg[0] == icmpv6::NEIGHBOUR_SOLICIT;
        let wanted = if solicit {
            icmpv6::OPT_SOURCE_LLADDR
        } else {
            icmpv6::OPT_TARGET_LLADDR
        };
        let mut lladdr = None;
        let mut at = icmpv6::NDP_LEN;
        while at + 2 <= msg.len() {
            let len = usize::from(msg[at + 1]) * 8;
            if len == 0 || at + len > msg.len() {
                return Err(DropReason::NdpMalformed);
            }
            if msg[at] == wanted && len >= 8 {
                lladdr = Some(EthernetAddress::from_bytes(&msg[at + 2..at + 8]));
            }
            at += len;
        }
        Ok(Ndp {
            solicit,
            target: get_addr6(msg, icmpv6::NDP_TARGET),
            lladdr,
        })
    }
}

/// The solicited-node multicast address of `addr` (ff02::1:ffXX:XXXX).
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet address of an IPv6 multicast address (33:33 and its last
/// 32 bits, RFC 2464 7).
pub fn multicast_mac(addr: Ipv6Addr) -> EthernetAddress {
    let o = addr.octets();
    EthernetAddress([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// Writes a complete neighbour discovery frame: Ethernet `src_mac` →
/// `dst_mac`, IPv6 `src` → `dst` with hop limit 255, ICMPv6 `kind` with
/// `flags` (the first 32 bits after the checksum), `target`, and one
/// link-layer address option `opt` carrying `src_mac` (none when
/// `opt` is 0). Returns the frame's length, or `None` if `buf` is short.
#[allow(clippy::too_many_arguments)]
fn emit(
    buf: &mut [u8],
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    kind: u8,
    flags: u32,
    target: Ipv6Addr,
    opt: u8,
) -> Option<usize> {
    let msg_len = icmpv6::NDP_LEN + if opt == 0 { 0 } else { 8 };
    let len = eth::HEADER_LEN + ipv6::HEADER_LEN + msg_len;
    let frame = buf.get_mut(..len)?;
    super::nat::put_macs(frame, src_mac, dst_mac);
    put16(frame, eth::ETHERTYPE, 0x86dd);
    let ip = eth::HEADER_LEN;
    frame[ip..ip + 4].copy_from_slice(&[0x60, 0, 0, 0]);
    put16(frame, ip + ipv6::PAYLOAD_LEN, msg_len as u16);
    frame[ip + ipv6::NEXT_HEADER] = ipv6::ICMPV6;
    frame[ip + ipv6::HOP_LIMIT] = NDP_HOP_LIMIT;
    put_addr(frame, ip + ipv6::SRC, src);
    put_addr(frame, ip + ipv6::DST, dst);
    let m = ip + ipv6::HEADER_LEN;
    frame[m] = kind;
    frame[m + 1] = 0;
    put16(frame, m + 2, 0);
    frame[m + 4..m + 8].copy_from_slice(&flags.to_be_bytes());
    put_addr(frame, m + icmpv6::NDP_TARGET, target);
    if opt != 0 {
        let o = m + icmpv6::NDP_LEN;
        frame[o] = opt;
        frame[o + 1] = 1;
        frame[o + 2..o + 8].copy_from_slice(&src_mac.0);
    }
    let sum = icmpv6_checksum(src, dst, &frame[m..len]);
    put16(frame, m + 2, sum);
    Some(len)
}

/// The ICMPv6 checksum of `msg` (its checksum field zero) from `src` to
/// `dst` (RFC 4443 2.3: the pseudo-header is part of it).
pub fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    l4_checksum6(src, dst, IpProtocol::Icmpv6, msg)
}

/// The TCP, UDP or ICMPv6 checksum of `seg` (its checksum field zero).
pub fn l4_checksum6(src: Ipv6Addr, dst: Ipv6Addr, proto: IpProtocol, seg: &[u8]) -> u16 {
    use super::checksum::{fold, ones_sum, pseudo_sum};
    !fold(pseudo_sum(src, dst, u8::from(proto), seg.len()) + ones_sum(seg))
}

/// Turns the neighbour solicitation `ns` (classified from `buf`, from
/// `asker` at `asker_mac`) into the advertisement that `ns.target` is at
/// `our_mac`: solicited and override set, to the asker (to all nodes
/// when it asked from `::`, as duplicate address detection does).
pub fn advertise(
    buf: &mut [u8],
    ns: &Ndp,
    asker: Ipv6Addr,
    asker_mac: EthernetAddress,
    our_mac: EthernetAddress,
) -> Option<usize> {
    const SOLICITED: u32 = 1 << 30;
    const OVERRIDE: u32 = 1 << 29;
    let (dst, dst_mac, flags) = if asker.is_unspecified() {
        let all = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
        (all, multicast_mac(all), OVERRIDE)
    } else {
        (asker, asker_mac, SOLICITED | OVERRIDE)
    };
    emit(
        buf,
        our_mac,
        dst_mac,
        ns.target,
        dst,
        icmpv6::NEIGHBOUR_ADVERT,
        flags,
        ns.target,
        icmpv6::OPT_TARGET_LLADDR,
    )
}

/// An unsolicited advertisement that `target` is at `mac` (override set,
/// to all nodes): what a gateway that takes an address over sends, as
/// the kernel does for a moved address (RFC 4861 7.2.6).
pub fn announce(buf: &mut [u8], mac: EthernetAddress, target: Ipv6Addr) -> Option<usize> {
    const OVERRIDE: u32 = 1 << 29;
    let all = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    emit(
        buf,
        mac,
        multicast_mac(all),
        target,
        all,
        icmpv6::NEIGHBOUR_ADVERT,
        OVERRIDE,
        target,
        icmpv6::OPT_TARGET_LLADDR,
    )
}

/// A neighbour solicitation for `target` from `source` at `mac`, to the
/// target's solicited-node multicast address (from `::` it carries no
/// link-layer address option, RFC 4861 4.3).
pub fn solicit(
    buf: &mut [u8],
    mac: EthernetAddress,
    source: Ipv6Addr,
    target: Ipv6Addr,
) -> Option<usize> {
    let group = solicited_node(target);
    let opt = if source.is_unspecified() {
        0
    } else {
        icmpv6::OPT_SOURCE_LLADDR
    };
    emit(
        buf,
        mac,
        multicast_mac(group),
        source,
        group,
        icmpv6::NEIGHBOUR_SOLICIT,
        0,
        target,
        opt,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{classify, Frame, L4};

    const MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
    const PEER: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 9]);

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn a_solicitation_round_trips_and_goes_to_the_solicited_node_group() {
        let mut buf = [0u8; 128];
        let n = solicit(&mut buf, MAC, a("2001:2:0:1::2"), a("2001:2:0:1::10")).unwrap();
        assert_eq!(n, NDP_FRAME_LEN);
        assert_eq!(&buf[..6], &[0x33, 0x33, 0xff, 0, 0, 0x10]);
        let Ok(Frame::Ipv6(ip)) = classify(&buf[..n]) else {
            panic!("not IPv6");
        };
        assert_eq!(ip.dst, a("ff02::1:ff00:10"));
        let L4::Neighbour(ndp) = ip.l4 else {
            panic!("not NDP: {:?}", ip.l4);
        };
        assert!(ndp.solicit);
        assert_eq!(ndp.target, a("2001:2:0:1::10"));
        assert_eq!(ndp.lladdr, Some(MAC));
        let m = &buf[54..n];
        assert_eq!(icmpv6_checksum(ip.src, ip.dst, m), 0, "checksum verifies");
    }

    #[test]
    fn an_advertisement_answers_the_asker_or_all_nodes() {
        let ns = Ndp {
            solicit: true,
            target: a("2001:2:1::1"),
            lladdr: Some(PEER),
        };
        let mut buf = [0u8; 128];
        let n = advertise(&mut buf, &ns, a("2001:2::2"), PEER, MAC).unwrap();
        let Ok(Frame::Ipv6(ip)) = classify(&buf[..n]) else {
            panic!("not IPv6");
        };
        assert_eq!((ip.src, ip.dst), (ns.target, a("2001:2::2")));
        assert_eq!(&buf[..6], &PEER.0);
        assert_eq!(buf[54 + 4] >> 5, 0b011, "solicited, override");
        let L4::Neighbour(na) = ip.l4 else {
            panic!("not NDP");
        };
        assert_eq!(
            (na.solicit, na.target, na.lladdr),
            (false, ns.target, Some(MAC))
        );
        let n = advertise(&mut buf, &ns, Ipv6Addr::UNSPECIFIED, PEER, MAC).unwrap();
        assert_eq!(&buf[..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(buf[54 + 4] >> 5, 0b001, "unsolicited: to all nodes");
        assert_eq!(advertise(&mut buf[..n - 1], &ns, a("::2"), PEER, MAC), None);
    }

    #[test]
    fn rfc4861_validation_refuses_what_crossed_a_router_or_is_cut() {
        let mut buf = [0u8; 128];
        let n = solicit(&mut buf, MAC, a("2001:2::2"), a("2001:2::10")).unwrap();
        let msg = &buf[54..n];
        assert!(Ndp::parse(msg, 255).is_ok());
        assert_eq!(Ndp::parse(msg, 64), Err(DropReason::NdpMalformed));
        assert_eq!(Ndp::parse(&msg[..23], 255), Err(DropReason::NdpMalformed));
        let mut zero_opt = msg.to_vec();
        zero_opt[25] = 0;
        assert_eq!(Ndp::parse(&zero_opt, 255), Err(DropReason::NdpMalformed));
        let bare = solicit(&mut buf, MAC, Ipv6Addr::UNSPECIFIED, a("2001:2::10")).unwrap();
        assert_eq!(bare, NDP_FRAME_LEN - 8, "no option from ::");
        assert_eq!(Ndp::parse(&buf[54..bare], 255).unwrap().lladdr, None);
    }
}
