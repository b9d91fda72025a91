//! ARP for Ethernet/IPv4 (RFC 826): parsed from a checked view, emitted
//! from a representation (smoltcp's `ArpPacket` / `ArpRepr`).
//!
//! No-panic contract: [`Arp::parse`] accepts any byte slice; [`Arp::emit`]
//! writes only into a buffer it has checked is long enough.

use std::net::Ipv4Addr;

use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr,
};

use super::field::{arp, eth};
use super::DropReason;

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOp {
    /// Who has `target_ip`?
    Request,
    /// `sender_ip` is at `sender_mac`.
    Reply,
}

/// An ARP request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    /// Request or reply.
    pub op: ArpOp,
    /// Sender hardware address.
    pub sender_mac: EthernetAddress,
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target hardware address (zero in a request).
    pub target_mac: EthernetAddress,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

impl Arp {
    /// Parses the ARP packet after an Ethernet header.
    pub fn parse(payload: &[u8]) -> Result<Arp, DropReason> {
        if payload.len() < arp::LEN {
            return Err(DropReason::ArpMalformed);
        }
        let packet = ArpPacket::new_unchecked(payload);
        // Ethernet (1), IPv4 (0x0800), 6-byte and 4-byte addresses.
        if payload[..6] != [0, 1, 0x08, 0x00, 6, 4] {
            return Err(DropReason::ArpMalformed);
        }
        let op = match packet.operation() {
            ArpOperation::Request => ArpOp::Request,
            ArpOperation::Reply => ArpOp::Reply,
            _ => return Err(DropReason::ArpUnsupportedOp),
        };
        let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        Ok(Arp {
            op,
            sender_mac: EthernetAddress::from_bytes(packet.source_hardware_addr()),
            sender_ip: ip(packet.source_protocol_addr()),
            target_mac: EthernetAddress::from_bytes(packet.target_hardware_addr()),
            target_ip: ip(packet.target_protocol_addr()),
        })
    }

    /// A request from `mac`/`ip` for `target`.
    pub fn request(mac: EthernetAddress, ip: Ipv4Addr, target: Ipv4Addr) -> Arp {
        Arp {
            op: ArpOp::Request,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: EthernetAddress([0; 6]),
            target_ip: target,
        }
    }

    /// Writes the frame carrying this packet to `dst` (broadcast for a
    /// request), zero-padded to the Ethernet minimum when `buf` has room;
    /// returns its length, or `None` if `buf` cannot hold the packet.
    pub fn emit(&self, buf: &mut [u8], dst: EthernetAddress) -> Option<usize> {
        let end = eth::HEADER_LEN + arp::LEN;
        let frame = buf.get_mut(..end)?;
        EthernetRepr {
            src_addr: self.sender_mac,
            dst_addr: dst,
            ethertype: EthernetProtocol::Arp,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut *frame));
        let repr = ArpRepr::EthernetIpv4 {
            operation: match self.op {
                ArpOp::Request => ArpOperation::Request,
                ArpOp::Reply => ArpOperation::Reply,
            },
            source_hardware_addr: self.sender_mac,
            source_protocol_addr: self.sender_ip,
            target_hardware_addr: self.target_mac,
            target_protocol_addr: self.target_ip,
        };
        repr.emit(&mut ArpPacket::new_unchecked(&mut frame[eth::HEADER_LEN..]));
        match buf.get_mut(end..eth::MIN_FRAME) {
            Some(pad) => {
                pad.fill(0);
                Some(eth::MIN_FRAME)
            }
            None => Some(end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

    #[test]
    fn a_request_round_trips_and_is_broadcast_and_padded() {
        let a = Arp::request(
            MAC,
            Ipv4Addr::new(198, 18, 1, 2),
            Ipv4Addr::new(198, 18, 1, 10),
        );
        let mut buf = [0xaau8; 64];
        assert_eq!(a.emit(&mut buf, EthernetAddress::BROADCAST), Some(60));
        assert_eq!(&buf[..6], &[0xff; 6]);
        assert_eq!(&buf[6..12], &MAC.0);
        assert_eq!(&buf[12..14], &[0x08, 0x06]);
        assert!(buf[42..60].iter().all(|&b| b == 0));
        assert_eq!(buf[60], 0xaa, "nothing written past the frame");
        assert_eq!(Arp::parse(&buf[14..60]), Ok(a));
        assert_eq!(a.emit(&mut [0u8; 59], EthernetAddress::BROADCAST), Some(42));
        assert_eq!(a.emit(&mut [0u8; 41], EthernetAddress::BROADCAST), None);
    }

    #[test]
    fn other_hardware_and_operations_are_refused() {
        let mut buf = [0u8; 60];
        Arp::request(MAC, Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST)
            .emit(&mut buf, EthernetAddress::BROADCAST)
            .unwrap();
        let mut bad = buf;
        bad[15] = 6; // hardware type IEEE 802
        assert_eq!(Arp::parse(&bad[14..]), Err(DropReason::ArpMalformed));
        let mut rarp = buf;
        rarp[21] = 3;
        assert_eq!(Arp::parse(&rarp[14..]), Err(DropReason::ArpUnsupportedOp));
        assert_eq!(Arp::parse(&buf[14..41]), Err(DropReason::ArpMalformed));
    }
}
