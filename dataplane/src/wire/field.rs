//! Header layouts, declared once: the offsets and lengths every module of
//! [`crate::wire`] reads and writes (smoltcp keeps the same per-protocol
//! `field` modules private; the incremental rewrites here need them).
//!
//! Offsets in [`eth`] are from the start of the frame; in the other modules
//! from the start of their own header.

/// Ethernet II (no VLAN tag).
pub mod eth {
    /// Destination address.
    pub const DST: usize = 0;
    /// Source address.
    pub const SRC: usize = 6;
    /// EtherType.
    pub const ETHERTYPE: usize = 12;
    /// Header length.
    pub const HEADER_LEN: usize = 14;
    /// Shortest frame without FCS.
    pub const MIN_FRAME: usize = 60;
}

/// IPv4 (RFC 791).
pub mod ipv4 {
    /// Version and IHL.
    pub const VER_IHL: usize = 0;
    /// Total length.
    pub const LENGTH: usize = 2;
    /// Identification.
    pub const IDENT: usize = 4;
    /// Flags (3 bits) and fragment offset (13 bits, in 8-byte units).
    pub const FLAGS_OFFSET: usize = 6;
    /// The fragment offset's bits in that word.
    pub const OFFSET_MASK: u16 = 0x1fff;
    /// The more-fragments flag's bit in that word.
    pub const MORE_FRAGMENTS: u16 = 0x2000;
    /// TTL, then protocol: one 16-bit word of the header checksum.
    pub const TTL_PROTO: usize = 8;
    /// Header checksum.
    pub const CHECKSUM: usize = 10;
    /// Source address.
    pub const SRC: usize = 12;
    /// Destination address.
    pub const DST: usize = 16;
    /// Header length without options.
    pub const MIN_HEADER_LEN: usize = 20;
}

/// TCP (RFC 793).
pub mod tcp {
    /// Flags byte.
    pub const FLAGS: usize = 13;
    /// Checksum.
    pub const CHECKSUM: usize = 16;
    /// Header length without options.
    pub const MIN_HEADER_LEN: usize = 20;
}

/// UDP (RFC 768).
pub mod udp {
    /// Checksum (0: none).
    pub const CHECKSUM: usize = 6;
    /// Header length.
    pub const HEADER_LEN: usize = 8;
}

/// ICMP (RFC 792).
pub mod icmp {
    /// Type, then code: one 16-bit word of the checksum.
    pub const TYPE_CODE: usize = 0;
    /// Checksum.
    pub const CHECKSUM: usize = 2;
    /// Header length (type, code, checksum and 4 bytes of rest-of-header).
    pub const HEADER_LEN: usize = 8;
}

/// ARP for Ethernet/IPv4 (RFC 826).
pub mod arp {
    /// Packet length.
    pub const LEN: usize = 28;
}

/// IPv6 (RFC 8200).
pub mod ipv6 {
    /// Payload length.
    pub const PAYLOAD_LEN: usize = 4;
    /// Next header.
    pub const NEXT_HEADER: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC: usize = 8;
    /// Destination address.
    pub const DST: usize = 24;
    /// Header length (extension headers follow).
    pub const HEADER_LEN: usize = 40;
    /// Next header values of the extension headers xvs walks.
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing header.
    pub const ROUTING: u8 = 43;
    /// Fragment header.
    pub const FRAGMENT: u8 = 44;
    /// Destination options.
    pub const DEST_OPTIONS: u8 = 60;
    /// No next header.
    pub const NO_NEXT: u8 = 59;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
}

/// ICMPv6 (RFC 4443) and neighbour discovery (RFC 4861).
pub mod icmpv6 {
    /// Destination unreachable.
    pub const DST_UNREACHABLE: u8 = 1;
    /// Packet too big.
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 129;
    /// Neighbour solicitation.
    pub const NEIGHBOUR_SOLICIT: u8 = 135;
    /// Neighbour advertisement.
    pub const NEIGHBOUR_ADVERT: u8 = 136;
    /// Length of a solicitation or advertisement without options.
    pub const NDP_LEN: usize = 24;
    /// Offset of the target address in either.
    pub const NDP_TARGET: usize = 8;
    /// Source link-layer address option.
    pub const OPT_SOURCE_LLADDR: u8 = 1;
    /// Target link-layer address option.
    pub const OPT_TARGET_LLADDR: u8 = 2;
}
