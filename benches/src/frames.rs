//! Test frames built from scratch with full checksums: the generator's
//! templates and the micro-benchmarks' packets. Every frame is Ethernet II,
//! IPv4 without options, TTL 64, padded to at least 60 bytes.

use std::net::Ipv4Addr;

use smoltcp::wire::{IpAddress, Ipv4Packet, TcpPacket, UdpPacket};
use xvs_dataplane::wire::Endpoint;

/// Ethernet + IPv4 header bytes.
const L3: usize = 14 + 20;

/// The L4 part of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4Kind {
    /// UDP with this many payload bytes (zeros).
    Udp {
        /// Payload bytes.
        payload: usize,
    },
    /// TCP, 20-byte header, no payload, with these flags.
    Tcp {
        /// TCP flags byte (0x02 = SYN).
        flags: u8,
    },
}

/// Builds `src_mac → dst_mac`, `src → dst` with `l4`.
pub fn frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Endpoint,
    dst: Endpoint,
    l4: L4Kind,
) -> Vec<u8> {
    let l4_len = match l4 {
        L4Kind::Udp { payload } => 8 + payload,
        L4Kind::Tcp { .. } => 20,
    };
    let mut f = vec![0u8; (L3 + l4_len).max(60)];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    {
        let ip = &mut f[14..L3];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = match l4 {
            L4Kind::Udp { .. } => 17,
            L4Kind::Tcp { .. } => 6,
        };
        ip[12..16].copy_from_slice(&src.addr.octets());
        ip[16..20].copy_from_slice(&dst.addr.octets());
        Ipv4Packet::new_unchecked(ip).fill_checksum();
    }
    let (s, d) = (IpAddress::Ipv4(src.addr), IpAddress::Ipv4(dst.addr));
    let t = &mut f[L3..L3 + l4_len];
    t[0..2].copy_from_slice(&src.port.to_be_bytes());
    t[2..4].copy_from_slice(&dst.port.to_be_bytes());
    match l4 {
        L4Kind::Udp { .. } => {
            t[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            UdpPacket::new_unchecked(t).fill_checksum(&s, &d);
        }
        L4Kind::Tcp { flags } => {
            t[4..8].copy_from_slice(&1u32.to_be_bytes());
            t[12] = 5 << 4;
            t[13] = flags;
            t[14..16].copy_from_slice(&64240u16.to_be_bytes());
            TcpPacket::new_unchecked(t).fill_checksum(&s, &d);
        }
    }
    f
}

/// An endpoint.
pub fn ep(addr: Ipv4Addr, port: u16) -> Endpoint {
    Endpoint { addr, port }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xvs_dataplane::wire::{classify, L4};

    #[test]
    fn udp_and_syn_frames_classify_with_valid_checksums() {
        let (a, b) = (
            ep(Ipv4Addr::new(198, 18, 0, 2), 1234),
            ep(Ipv4Addr::new(198, 19, 0, 1), 80),
        );
        for l4 in [L4Kind::Udp { payload: 18 }, L4Kind::Tcp { flags: 0x02 }] {
            let f = frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], a, b, l4);
            assert_eq!(f.len(), 60);
            let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
            assert!(ip.verify_checksum());
            let (s, d) = (IpAddress::Ipv4(a.addr), IpAddress::Ipv4(b.addr));
            match l4 {
                L4Kind::Udp { .. } => {
                    assert!(UdpPacket::new_checked(ip.payload())
                        .unwrap()
                        .verify_checksum(&s, &d));
                }
                L4Kind::Tcp { .. } => {
                    assert!(TcpPacket::new_checked(ip.payload())
                        .unwrap()
                        .verify_checksum(&s, &d));
                }
            }
            let c = classify(&f).unwrap();
            let xvs_dataplane::wire::Frame::Ipv4(ip) = c else {
                panic!("not IPv4: {c:?}")
            };
            assert_eq!((ip.src, ip.dst), (a.addr, b.addr));
            assert!(matches!(ip.l4, L4::Udp { .. } | L4::Tcp { .. }));
        }
    }
}
