//! Why a frame was dropped: one enum for counters, metrics and flow events.
//!
//! Invariant: every variant has a stable snake_case [`DropReason::name`]
//! (metric label values and JSON depend on it: never rename one) and a dense
//! [`DropReason::index`] below [`DropReason::COUNT`], so per-worker counters
//! can be a plain array indexed by reason.

use std::fmt;

macro_rules! drop_reasons {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, )+) => {
        /// Why a frame was dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum DropReason {
            $( $(#[$doc])* $variant, )+
        }

        impl DropReason {
            /// Every reason, in index order.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant),+];
            /// Number of reasons.
            pub const COUNT: usize = Self::ALL.len();

            /// Stable snake_case name (metric label, JSON, flow events).
            pub const fn name(self) -> &'static str {
                match self {
                    $( DropReason::$variant => $name, )+
                }
            }
        }
    };
}

drop_reasons! {
    /// Shorter than an Ethernet header.
    EthTruncated = "eth_truncated",
    /// EtherType neither IPv4, IPv6 nor ARP (VLAN tags included).
    UnsupportedEthertype = "unsupported_ethertype",
    /// ARP for another hardware/protocol type, or truncated.
    ArpMalformed = "arp_malformed",
    /// ARP operation other than request or reply.
    ArpUnsupportedOp = "arp_unsupported_op",
    /// Shorter than a minimal IPv4 header.
    Ipv4Truncated = "ipv4_truncated",
    /// IP version field is not 4.
    Ipv4BadVersion = "ipv4_bad_version",
    /// IHL below 5 or header longer than the packet.
    Ipv4BadHeaderLen = "ipv4_bad_header_len",
    /// Total length shorter than the header or longer than the frame.
    Ipv4BadTotalLen = "ipv4_bad_total_len",
    /// IPv4 header checksum does not verify.
    Ipv4BadChecksum = "ipv4_bad_checksum",
    /// IP protocol other than TCP, UDP or ICMP.
    UnsupportedProtocol = "unsupported_protocol",
    /// TCP header truncated or data offset out of range.
    TcpMalformed = "tcp_malformed",
    /// UDP header truncated or length field out of range.
    UdpMalformed = "udp_malformed",
    /// ICMP header truncated.
    IcmpMalformed = "icmp_malformed",
    /// ICMP error whose embedded IPv4/TCP/UDP header is unusable.
    IcmpErrorMalformed = "icmp_error_malformed",
    /// ICMP error about something other than TCP or UDP.
    IcmpErrorUnsupported = "icmp_error_unsupported",
    /// ICMP type xvs does not handle.
    IcmpUnsupportedType = "icmp_unsupported_type",
    /// TTL would reach zero on forwarding.
    TtlExceeded = "ttl_exceeded",
    /// Buffer too small to build an answer in place.
    AnswerNoRoom = "answer_no_room",
    /// IPv4 packet for an address xvs does not own.
    NotOwned = "not_owned",
    /// ARP request for an address xvs does not own.
    ArpNotOwned = "arp_not_owned",
    /// IPv4 fragment (fragments are not forwarded; see the data plane's
    /// fragment policy).
    Fragment = "fragment",
    /// No service on the VIP for this protocol and port.
    NoService = "no_service",
    /// The service has no eligible backend and the packet gets no reject.
    NoBackend = "no_backend",
    /// The client is outside the service's source ranges.
    SourceDenied = "source_denied",
    /// A TCP segment other than a SYN for an unknown flow.
    TcpNoFlow = "tcp_no_flow",
    /// A packet to a SNAT address that belongs to no tracked flow.
    ReplyNoFlow = "reply_no_flow",
    /// An ICMP error about no tracked flow.
    IcmpErrorNoFlow = "icmp_error_no_flow",
    /// The flow table was full of ESTABLISHED flows.
    ConntrackFull = "conntrack_full",
    /// The flow's keys were already tracked.
    ConntrackInsertFailed = "conntrack_insert_failed",
    /// No free SNAT port in this worker's slice.
    SnatExhausted = "snat_exhausted",
    /// The next hop's Ethernet address is not known yet (an ARP request is
    /// sent; the sender retransmits).
    NextHopUnresolved = "next_hop_unresolved",
    /// The first packet of a would-be flow carries a TCP or UDP checksum
    /// that does not verify (often a sender relying on a checksum offload
    /// its link does not do: see the README on veth and VM offloads).
    L4BadChecksum = "l4_bad_checksum",
    /// The TX ring had no room for the frame, even after retrying on the
    /// next loop iterations.
    TxRingFull = "tx_ring_full",
    /// Shorter than an IPv6 header.
    Ipv6Truncated = "ipv6_truncated",
    /// IPv6 version field is not 6, or the payload length is longer than
    /// the frame, or an extension header runs past the packet.
    Ipv6Malformed = "ipv6_malformed",
    /// An IPv6 next header that is neither an extension header xvs walks
    /// (hop-by-hop, routing, fragment, destination options) nor TCP, UDP
    /// or ICMPv6.
    Ipv6UnknownHeader = "ipv6_unknown_header",
    /// An IPv6 routing header with segments left: the packet's
    /// destination is not its final one.
    Ipv6RoutingHeader = "ipv6_routing_header",
    /// A UDP datagram over IPv6 with a zero checksum (RFC 8200 8.1: not
    /// allowed).
    UdpZeroChecksum = "udp_zero_checksum",
    /// A neighbour solicitation or advertisement that fails RFC 4861's
    /// validation (hop limit 255, code 0, length, options).
    NdpMalformed = "ndp_malformed",
    /// A neighbour solicitation for an address xvs does not own.
    NdpNotOwned = "ndp_not_owned",
    /// A packet for a tunnel backend that no longer fits the link once
    /// encapsulated and may not be answered with fragmentation needed /
    /// packet too big (an ICMP error itself, a fragment, a non-unicast
    /// source).
    TunnelTooBig = "tunnel_too_big",
    /// No room in the frame's buffer for the encapsulation header.
    EncapNoRoom = "encap_no_room",
}

impl DropReason {
    /// Dense index, `0..COUNT`.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Frames dropped, by reason ([`DropReason::index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drops(pub [u64; DropReason::COUNT]);

impl Default for Drops {
    fn default() -> Self {
        Drops([0; DropReason::COUNT])
    }
}

impl Drops {
    /// Every reason's count, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().copied().zip(self.0)
    }

    /// Adds another count.
    pub fn add(&mut self, o: &Drops) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
    }

    /// All drops.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

impl std::ops::Index<usize> for Drops {
    type Output = u64;
    fn index(&self, i: usize) -> &u64 {
        &self.0[i]
    }
}

impl std::ops::IndexMut<usize> for Drops {
    fn index_mut(&mut self, i: usize) -> &mut u64 {
        &mut self.0[i]
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case_and_indexes_dense() {
        let mut seen = std::collections::HashSet::new();
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert!(seen.insert(r.name()), "duplicate name {}", r.name());
            assert!(r
                .name()
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
        }
        assert_eq!(DropReason::COUNT, DropReason::ALL.len());
        assert_eq!(DropReason::TtlExceeded.to_string(), "ttl_exceeded");
    }
}
