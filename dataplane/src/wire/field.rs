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
