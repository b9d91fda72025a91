//! Test frames built from scratch with full checksums: the generator's
//! templates and the micro-benchmarks' packets. Every frame is Ethernet II,
//! IPv4 without options, TTL 64, padded to at least 60 bytes; or IPv6
//! without extension headers, hop limit 64 ([`frame6`], [`frame_any`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
    fill_l4(&mut f[L3..L3 + l4_len], src.port, dst.port, l4, &s, &d);
    f
}

/// Fills the L4 header of `t` (ports from `src`/`dst`) and its checksum
/// over the pseudo-header of `s` and `d`.
fn fill_l4(t: &mut [u8], sp: u16, dp: u16, l4: L4Kind, s: &IpAddress, d: &IpAddress) {
    t[0..2].copy_from_slice(&sp.to_be_bytes());
    t[2..4].copy_from_slice(&dp.to_be_bytes());
    match l4 {
        L4Kind::Udp { .. } => {
            let len = t.len() as u16;
            t[4..6].copy_from_slice(&len.to_be_bytes());
            UdpPacket::new_unchecked(t).fill_checksum(s, d);
        }
        L4Kind::Tcp { flags } => {
            t[4..8].copy_from_slice(&1u32.to_be_bytes());
            t[12] = 5 << 4;
            t[13] = flags;
            t[14..16].copy_from_slice(&64240u16.to_be_bytes());
            TcpPacket::new_unchecked(t).fill_checksum(s, d);
        }
    }
}

/// Builds an IPv6 frame `src_mac → dst_mac`, `src → dst` with `l4`.
pub fn frame6(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Endpoint<Ipv6Addr>,
    dst: Endpoint<Ipv6Addr>,
    l4: L4Kind,
) -> Vec<u8> {
    let l4_len = match l4 {
        L4Kind::Udp { payload } => 8 + payload,
        L4Kind::Tcp { .. } => 20,
    };
    let mut f = vec![0u8; 14 + 40 + l4_len];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&[0x86, 0xdd]);
    f[14] = 0x60;
    f[18..20].copy_from_slice(&(l4_len as u16).to_be_bytes());
    f[20] = match l4 {
        L4Kind::Udp { .. } => 17,
        L4Kind::Tcp { .. } => 6,
    };
    f[21] = 64;
    f[22..38].copy_from_slice(&src.addr.octets());
    f[38..54].copy_from_slice(&dst.addr.octets());
    let (s, d) = (IpAddress::Ipv6(src.addr), IpAddress::Ipv6(dst.addr));
    fill_l4(&mut f[54..], src.port, dst.port, l4, &s, &d);
    f
}

/// [`frame`] or [`frame6`], by the endpoints' family (`None` when they
/// differ).
pub fn frame_any(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Endpoint<IpAddr>,
    dst: Endpoint<IpAddr>,
    l4: L4Kind,
) -> Option<Vec<u8>> {
    Some(match (src.addr, dst.addr) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            frame(src_mac, dst_mac, ep(a, src.port), ep(b, dst.port), l4)
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => frame6(
            src_mac,
            dst_mac,
            Endpoint {
                addr: a,
                port: src.port,
            },
            Endpoint {
                addr: b,
                port: dst.port,
            },
            l4,
        ),
        _ => return None,
    })
}

/// An endpoint.
pub fn ep(addr: Ipv4Addr, port: u16) -> Endpoint {
    Endpoint { addr, port }
}

/// An endpoint of either family.
pub fn ep_any(addr: impl Into<IpAddr>, port: u16) -> Endpoint<IpAddr> {
    Endpoint {
        addr: addr.into(),
        port,
    }
}

/// The gateway's Ethernet address in the micro-benchmarks' frames.
pub const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// The source Ethernet address of the benches' client frames.
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

/// The Ethernet header of a frame from `src` to [`GW_MAC`].
fn ethernet(f: &mut [u8], src: [u8; 6], ethertype: u16) {
    f[0..6].copy_from_slice(&GW_MAC);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// A 64-byte TCP frame client → `dst` (port 80) with `flags`, to
/// [`GW_MAC`].
pub fn tcp64(client: Ipv4Addr, port: u16, dst: Ipv4Addr, flags: u8) -> [u8; 64] {
    let mut f = [0u8; 64];
    ethernet(&mut f, CLIENT_MAC, 0x0800);
    {
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&50u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&client.octets());
        ip[16..20].copy_from_slice(&dst.octets());
        Ipv4Packet::new_unchecked(ip).fill_checksum();
    }
    let (s, d) = (IpAddress::Ipv4(client), IpAddress::Ipv4(dst));
    tcp_segment(&mut f[34..64], port, flags, &s, &d);
    f
}

/// An 84-byte IPv6 TCP frame client → `dst` (port 80) with `flags`, to
/// [`GW_MAC`]: [`tcp64`]'s segment behind the 20 bytes longer header.
pub fn tcp84(client: Ipv6Addr, port: u16, dst: Ipv6Addr, flags: u8) -> [u8; 84] {
    let mut f = [0u8; 84];
    ethernet(&mut f, CLIENT_MAC, 0x86dd);
    f[14] = 0x60;
    f[18..20].copy_from_slice(&30u16.to_be_bytes());
    f[20] = 6;
    f[21] = 64;
    f[22..38].copy_from_slice(&client.octets());
    f[38..54].copy_from_slice(&dst.octets());
    let (s, d) = (IpAddress::Ipv6(client), IpAddress::Ipv6(dst));
    tcp_segment(&mut f[54..84], port, flags, &s, &d);
    f
}

/// The 30-byte TCP segment of [`tcp64`] and [`tcp84`]: `port` → 80 with
/// `flags`, 10 bytes of zeros, its checksum over `s` and `d`.
fn tcp_segment(t: &mut [u8], port: u16, flags: u8, s: &IpAddress, d: &IpAddress) {
    t[0..2].copy_from_slice(&port.to_be_bytes());
    t[2..4].copy_from_slice(&80u16.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&1000u16.to_be_bytes());
    TcpPacket::new_unchecked(&mut t[..30]).fill_checksum(s, d);
}

/// An ARP reply from `ip` to [`GW_MAC`], so a pipeline learns the
/// backend's MAC.
pub fn arp_reply(ip: Ipv4Addr) -> [u8; 60] {
    let mut f = [0u8; 60];
    ethernet(&mut f, [2, 0, 0, 0, 0, 3], 0x0806);
    f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 2]);
    f[22..28].copy_from_slice(&[2, 0, 0, 0, 0, 3]);
    f[28..32].copy_from_slice(&ip.octets());
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use xvs_dataplane::wire::{classify, L4};

    #[test]
    fn the_benches_tcp_frames_of_both_families_verify() {
        let f = tcp64(
            Ipv4Addr::new(198, 18, 0, 2),
            1234,
            Ipv4Addr::new(198, 19, 0, 1),
            0x10,
        );
        let xvs_dataplane::wire::Frame::Ipv4(ip) = classify(&f).unwrap() else {
            panic!("not IPv4")
        };
        assert!(matches!(ip.l4, L4::Tcp { .. }));
        assert!(xvs_dataplane::wire::checksum::l4_verifies(&f, &ip));
        let (c, v): (Ipv6Addr, Ipv6Addr) = (
            "2001:2::2".parse().unwrap(),
            "2001:2:ff::1".parse().unwrap(),
        );
        let f = tcp84(c, 1234, v, 0x02);
        let xvs_dataplane::wire::Frame::Ipv6(ip) = classify(&f).unwrap() else {
            panic!("not IPv6")
        };
        assert_eq!((ip.src, ip.dst), (c, v));
        assert!(matches!(ip.l4, L4::Tcp { .. }));
        assert!(xvs_dataplane::wire::checksum::l4_verifies6(&f, &ip));
    }

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
            // The same over IPv6.
            let (a6, b6) = (
                ep_any("2001:2::2".parse::<Ipv6Addr>().unwrap(), 1234),
                ep_any("2001:2:ff::1".parse::<Ipv6Addr>().unwrap(), 80),
            );
            let f = frame_any([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], a6, b6, l4).unwrap();
            let c = classify(&f).unwrap();
            let xvs_dataplane::wire::Frame::Ipv6(ip) = c else {
                panic!("not IPv6: {c:?}")
            };
            assert_eq!((IpAddr::V6(ip.src), IpAddr::V6(ip.dst)), (a6.addr, b6.addr));
            assert!(xvs_dataplane::wire::checksum::l4_verifies6(&f, &ip));
        }
    }
}
