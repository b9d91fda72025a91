//! What the pipeline needs of an address family: the fields of a
//! classified packet and the rewrites and answers of its wire format
//! ([`IpPacket`], for [`Ipv4`] and [`Ipv6`]), and which frames are of the
//! family ([`Family`]).
//!
//! The pipeline is written once over [`Family`] and monomorphised per
//! family, so an IPv4 packet runs the code it ran before IPv6 existed
//! (IPv4 keys, entries and services keep their own sizes). Invariant:
//! every method here is a thin forward to [`crate::wire`], which holds the
//! no-panic contracts.

use std::fmt::Debug;
use std::net::{Ipv4Addr, Ipv6Addr};

use smoltcp::wire::EthernetAddress;
use xvs_config::Address;
use xvs_conntrack::FlowKey;

use crate::wire::encap::{self, Encapsulated, Outer};
use crate::wire::{
    answer, answer6, checksum, icmp_error, nat, nat6, DropReason, Fragment, Frame, IcmpErrorNat,
    Ipv4, Ipv6, Nat, L4,
};

/// An answer built in place: `Ok(Some(len))`, `Ok(None)` (not allowed),
/// or why it could not be built.
pub type Answer = Result<Option<usize>, DropReason>;

/// A classified IP packet of one family.
pub trait IpPacket: Copy + Debug {
    /// Its address type.
    type Addr: Family;
    /// Source address.
    fn src(&self) -> Self::Addr;
    /// Destination address.
    fn dst(&self) -> Self::Addr;
    /// TTL or hop limit.
    fn hop_limit(&self) -> u8;
    /// IP protocol (IPv6: the upper-layer next header).
    fn protocol(&self) -> u8;
    /// Fragment status.
    fn fragment(&self) -> Fragment;
    /// The L4 header.
    fn l4(&self) -> L4<Self::Addr>;
    /// The conntrack key.
    fn key(&self) -> Option<FlowKey<Self::Addr>>;
    /// Length of the IP packet (header included).
    fn total_len(&self) -> u32;
    /// Full-NAT forwarding (hop limit, both ends, checksums, MACs).
    fn forward(
        &self,
        buf: &mut [u8],
        nat: &Nat<Self::Addr>,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason>;
    /// Direct routing: hop limit and MACs only.
    fn route(
        &self,
        buf: &mut [u8],
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason>;
    /// Encapsulation to a tunnel backend over a link of `mtu` bytes
    /// (`label`: the flow's entropy, IPv6's outer flow label).
    fn encap(
        &self,
        buf: &mut [u8],
        outer: &Outer<Self::Addr>,
        mtu: u16,
        label: u32,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<Encapsulated, DropReason>;
    /// The fragmentation needed / packet too big refusing a packet that
    /// does not fit `mtu` once encapsulated.
    fn too_big(&self, buf: &mut [u8], mtu: u16) -> Answer;
    /// Forwarding of an ICMP error about a flow.
    fn forward_error(
        &self,
        buf: &mut [u8],
        m: &IcmpErrorNat<Self::Addr>,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason>;
    /// The echo reply to an echo request.
    fn echo_reply(&self, buf: &mut [u8]) -> Answer;
    /// The RST refusing a TCP segment.
    fn reset(&self, buf: &mut [u8]) -> Answer;
    /// The port unreachable refusing a packet.
    fn unreachable(&self, buf: &mut [u8]) -> Answer;
    /// The time exceeded answering a packet that cannot be forwarded.
    fn time_exceeded(&self, buf: &mut [u8]) -> Answer;
    /// Whether its TCP/UDP checksum verifies in full.
    fn l4_verifies(&self, buf: &[u8]) -> bool;
}

/// An address family the pipeline serves.
pub trait Family: Address {
    /// Its classified packet.
    type Ip: IpPacket<Addr = Self>;
    /// Its packet in a classified frame, if the frame is of this family.
    fn packet(frame: &Frame) -> Option<Self::Ip>;
    /// The address with `net`'s bits where `mask` has ones and `host`'s
    /// elsewhere (a tunnel source derived from the client).
    fn within_net(net: Self, mask: Self, host: Self) -> Self;
}

impl Family for Ipv4Addr {
    type Ip = Ipv4;
    #[inline]
    fn packet(frame: &Frame) -> Option<Ipv4> {
        match frame {
            Frame::Ipv4(ip) => Some(*ip),
            _ => None,
        }
    }
    fn within_net(net: Ipv4Addr, mask: Ipv4Addr, host: Ipv4Addr) -> Ipv4Addr {
        let m = u32::from(mask);
        Ipv4Addr::from(u32::from(net) & m | u32::from(host) & !m)
    }
}

impl Family for Ipv6Addr {
    type Ip = Ipv6;
    #[inline]
    fn packet(frame: &Frame) -> Option<Ipv6> {
        match frame {
            Frame::Ipv6(ip) => Some(*ip),
            _ => None,
        }
    }
    fn within_net(net: Ipv6Addr, mask: Ipv6Addr, host: Ipv6Addr) -> Ipv6Addr {
        let m = u128::from(mask);
        Ipv6Addr::from(u128::from(net) & m | u128::from(host) & !m)
    }
}

impl IpPacket for Ipv4 {
    type Addr = Ipv4Addr;
    #[inline(always)]
    fn src(&self) -> Ipv4Addr {
        self.src
    }
    #[inline(always)]
    fn dst(&self) -> Ipv4Addr {
        self.dst
    }
    #[inline(always)]
    fn hop_limit(&self) -> u8 {
        self.ttl
    }
    #[inline(always)]
    fn protocol(&self) -> u8 {
        self.protocol
    }
    #[inline(always)]
    fn fragment(&self) -> Fragment {
        self.fragment
    }
    #[inline(always)]
    fn l4(&self) -> L4 {
        self.l4
    }
    #[inline(always)]
    fn key(&self) -> Option<FlowKey> {
        self.flow_key()
    }
    #[inline(always)]
    fn total_len(&self) -> u32 {
        u32::from(self.total_len)
    }
    #[inline(always)]
    fn forward(
        &self,
        buf: &mut [u8],
        n: &Nat,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason> {
        nat::forward(buf, self, n, ours, next)
    }
    fn route(
        &self,
        buf: &mut [u8],
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason> {
        nat::route(buf, self, ours, next)
    }
    fn encap(
        &self,
        buf: &mut [u8],
        outer: &Outer<Ipv4Addr>,
        mtu: u16,
        _label: u32,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<Encapsulated, DropReason> {
        encap::encap4(buf, self, outer, mtu, ours, next)
    }
    fn too_big(&self, buf: &mut [u8], mtu: u16) -> Answer {
        answer::icmp_frag_needed(buf, self, mtu)
    }
    fn forward_error(
        &self,
        buf: &mut [u8],
        m: &IcmpErrorNat,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason> {
        icmp_error::forward(buf, self, m, ours, next)
    }
    fn echo_reply(&self, buf: &mut [u8]) -> Answer {
        answer::icmp_echo_reply(buf, self)
    }
    fn reset(&self, buf: &mut [u8]) -> Answer {
        answer::tcp_reset(buf, self)
    }
    fn unreachable(&self, buf: &mut [u8]) -> Answer {
        answer::icmp_port_unreachable(buf, self)
    }
    fn time_exceeded(&self, buf: &mut [u8]) -> Answer {
        answer::icmp_time_exceeded(buf, self)
    }
    fn l4_verifies(&self, buf: &[u8]) -> bool {
        checksum::l4_verifies(buf, self)
    }
}

impl IpPacket for Ipv6 {
    type Addr = Ipv6Addr;
    #[inline(always)]
    fn src(&self) -> Ipv6Addr {
        self.src
    }
    #[inline(always)]
    fn dst(&self) -> Ipv6Addr {
        self.dst
    }
    #[inline(always)]
    fn hop_limit(&self) -> u8 {
        self.hop_limit
    }
    #[inline(always)]
    fn protocol(&self) -> u8 {
        self.protocol
    }
    #[inline(always)]
    fn fragment(&self) -> Fragment {
        self.fragment
    }
    #[inline(always)]
    fn l4(&self) -> L4<Ipv6Addr> {
        self.l4
    }
    #[inline(always)]
    fn key(&self) -> Option<FlowKey<Ipv6Addr>> {
        self.flow_key()
    }
    #[inline(always)]
    fn total_len(&self) -> u32 {
        Ipv6::total_len(self)
    }
    #[inline(always)]
    fn forward(
        &self,
        buf: &mut [u8],
        n: &Nat<Ipv6Addr>,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason> {
        nat6::forward6(buf, self, n, ours, next)
    }
    fn route(
        &self,
        buf: &mut [u8],
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason> {
        nat6::route6(buf, self, ours, next)
    }
    fn encap(
        &self,
        buf: &mut [u8],
        outer: &Outer<Ipv6Addr>,
        mtu: u16,
        label: u32,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<Encapsulated, DropReason> {
        encap::encap6(buf, self, outer, mtu, label, ours, next)
    }
    fn too_big(&self, buf: &mut [u8], mtu: u16) -> Answer {
        answer6::packet_too_big6(buf, self, mtu)
    }
    fn forward_error(
        &self,
        buf: &mut [u8],
        m: &IcmpErrorNat<Ipv6Addr>,
        ours: EthernetAddress,
        next: EthernetAddress,
    ) -> Result<(), DropReason> {
        nat6::icmp_error_forward6(buf, self, m, ours, next)
    }
    fn echo_reply(&self, buf: &mut [u8]) -> Answer {
        answer6::echo_reply6(buf, self)
    }
    fn reset(&self, buf: &mut [u8]) -> Answer {
        answer6::tcp_reset6(buf, self)
    }
    fn unreachable(&self, buf: &mut [u8]) -> Answer {
        answer6::port_unreachable6(buf, self)
    }
    fn time_exceeded(&self, buf: &mut [u8]) -> Answer {
        answer6::time_exceeded6(buf, self)
    }
    fn l4_verifies(&self, buf: &[u8]) -> bool {
        checksum::l4_verifies6(buf, self)
    }
}
