//! What the pipeline tests share: their worker's settings, their
//! services, and running one frame through a pipeline.

// Each test file uses what it needs of this module.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};

use smoltcp::wire::{EthernetAddress, IpAddress, Ipv4Packet, TcpPacket, UdpPacket};
use xvs_config::{
    Address, Backend, ConnRules, ForwardMethod, PortRange, Protocol, Scheduler, Service,
    ServiceKey, Timeouts, UnknownPort,
};
use xvs_conntrack::tcp_flags::ACK;
use xvs_dataplane::pipeline::{Lookup, Pipeline, PipelineConfig, Prepared, Verdict};
use xvs_dataplane::wire::{classify, Frame, L4};

/// The gateway's Ethernet address in every fixture.
pub(crate) const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// Worker 0's settings in the tests: the gateway's address on both
/// sides, SNAT ports 1024-1100, 1024 flows, the default timeouts and
/// rules, unknown ports dropped, and no SNAT address (each test names
/// its own).
pub(crate) fn config() -> PipelineConfig {
    PipelineConfig {
        worker: 0,
        mac: EthernetAddress(GW_MAC),
        backend_mac: EthernetAddress(GW_MAC),
        snat_addrs: Vec::new(),
        snat_addrs6: Vec::new(),
        snat_ports: PortRange {
            first: 1024,
            last: 1100,
        },
        capacity: 1024,
        timeouts: Timeouts::default(),
        rules: ConnRules::default(),
        unknown_port: UnknownPort::Drop,
        tunnel: Default::default(),
        backend_mtu: 1500,
    }
}

/// An rr service `vip`:`port` over `backends` (address, port, weight),
/// full NAT, of either family.
pub(crate) fn rr_service<A: Address>(
    vip: A,
    protocol: Protocol,
    port: u16,
    backends: &[(A, u16, u32)],
) -> Service<A> {
    let mut s = Service::new(ServiceKey {
        vip,
        protocol,
        port,
    });
    s.scheduler = Scheduler::Rr;
    s.backends = backends
        .iter()
        .map(|&(address, port, weight)| Backend {
            address,
            port,
            weight,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        })
        .collect();
    s
}

/// Runs `frame` through `p` (received on the client side) at `now`; the
/// verdict and the frame as it would be sent (empty when dropped or
/// consumed). Checks after every frame that the counters add up.
pub(crate) fn run(p: &mut Pipeline, frame: &[u8], now: u32) -> (Verdict, Vec<u8>) {
    let mut buf = vec![0u8; 2048];
    buf[..frame.len()].copy_from_slice(frame);
    let v = p.process(&mut buf, frame.len(), now);
    let len = match v {
        Verdict::Forward { len: n, .. } | Verdict::Answer(n) => n,
        _ => 0,
    };
    buf.truncate(len);
    let c = p.counters();
    assert_eq!(
        c.rx,
        c.forwarded + c.answered + c.consumed + c.dropped(),
        "{c:?}"
    );
    (v, buf)
}

/// `frames` classified and looked up as one batch, the worker's way.
pub(crate) fn looked_up<F: AsRef<[u8]>>(
    p: &mut Pipeline,
    frames: &[F],
) -> (Vec<Prepared>, Vec<Lookup>) {
    let prepared: Vec<Prepared> = frames.iter().map(|f| Prepared::of(f.as_ref())).collect();
    let mut looked = vec![Lookup::NotYet; prepared.len()];
    p.lookup_prepared(&prepared, &mut looked);
    (prepared, looked)
}

/// An Ethernet/IPv4/TCP frame with valid checksums.
pub(crate) fn tcp(
    src_mac: [u8; 6],
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    flags: u8,
    ttl: u8,
) -> Vec<u8> {
    let mut f = ipv4_frame(src_mac, 20, 6, ttl, (src.0, dst.0));
    let (s, d) = (IpAddress::Ipv4(src.0), IpAddress::Ipv4(dst.0));
    tcp_segment(&mut f[34..54], (s, src.1), (d, dst.1), flags);
    f
}

/// Writes a 20-byte TCP header with `flags` into `seg` (sequence 1000,
/// acknowledging 1 when ACK is set, window 0xffff) and its checksum over
/// the pseudo-header of `src` and `dst`.
pub(crate) fn tcp_segment(seg: &mut [u8], src: (IpAddress, u16), dst: (IpAddress, u16), flags: u8) {
    seg[0..2].copy_from_slice(&src.1.to_be_bytes());
    seg[2..4].copy_from_slice(&dst.1.to_be_bytes());
    seg[4..8].copy_from_slice(&1000u32.to_be_bytes());
    if flags & ACK != 0 {
        seg[8..12].copy_from_slice(&1u32.to_be_bytes());
    }
    seg[12] = 5 << 4;
    seg[13] = flags;
    seg[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
    TcpPacket::new_unchecked(seg).fill_checksum(&src.0, &dst.0);
}

/// Writes a 12-byte UDP datagram (payload "ping") into `dgram`, with its
/// checksum over the pseudo-header of `src` and `dst`.
pub(crate) fn udp_datagram(dgram: &mut [u8], src: (IpAddress, u16), dst: (IpAddress, u16)) {
    dgram[0..2].copy_from_slice(&src.1.to_be_bytes());
    dgram[2..4].copy_from_slice(&dst.1.to_be_bytes());
    dgram[4..6].copy_from_slice(&12u16.to_be_bytes());
    dgram[8..12].copy_from_slice(b"ping");
    UdpPacket::new_unchecked(dgram).fill_checksum(&src.0, &dst.0);
}

/// An Ethernet/IPv4/UDP frame with 4 payload bytes and valid checksums.
pub(crate) fn udp(
    src_mac: [u8; 6],
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    ttl: u8,
) -> Vec<u8> {
    let mut f = ipv4_frame(src_mac, 12, 17, ttl, (src.0, dst.0));
    let (s, d) = (IpAddress::Ipv4(src.0), IpAddress::Ipv4(dst.0));
    udp_datagram(&mut f[34..46], (s, src.1), (d, dst.1));
    f
}

/// An Ethernet/IPv4 frame from `src_mac` to the gateway with room for
/// `l4_len` bytes of protocol `proto` after a 20-byte header (its
/// checksum valid).
fn ipv4_frame(
    src_mac: [u8; 6],
    l4_len: u16,
    proto: u8,
    ttl: u8,
    (src, dst): (Ipv4Addr, Ipv4Addr),
) -> Vec<u8> {
    let mut f = vec![0u8; 34 + usize::from(l4_len)];
    f[0..6].copy_from_slice(&GW_MAC);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let h = &mut f[14..34];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&(20 + l4_len).to_be_bytes());
    h[6] = 0x40;
    h[8] = ttl;
    h[9] = proto;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    Ipv4Packet::new_unchecked(h).fill_checksum();
    f
}

/// Source and destination of an IPv4 TCP or UDP frame.
pub(crate) fn ends(frame: &[u8]) -> ((Ipv4Addr, u16), (Ipv4Addr, u16)) {
    let v4 = |(a, port): (IpAddr, u16)| match a {
        IpAddr::V4(a) => (a, port),
        IpAddr::V6(_) => panic!("not IPv4: {frame:?}"),
    };
    let (src, dst) = endpoints(frame);
    (v4(src), v4(dst))
}

/// Source and destination of a TCP or UDP frame of either family.
pub(crate) fn endpoints(frame: &[u8]) -> ((IpAddr, u16), (IpAddr, u16)) {
    fn ports<A: Address>(l4: L4<A>) -> (u16, u16) {
        match l4 {
            L4::Tcp {
                src_port, dst_port, ..
            }
            | L4::Udp { src_port, dst_port } => (src_port, dst_port),
            other => panic!("{other:?}"),
        }
    }
    let (src, dst, (sp, dp)) = match classify(frame) {
        Ok(Frame::Ipv4(ip)) => (IpAddr::from(ip.src), IpAddr::from(ip.dst), ports(ip.l4)),
        Ok(Frame::Ipv6(ip)) => (IpAddr::from(ip.src), IpAddr::from(ip.dst), ports(ip.l4)),
        other => panic!("{other:?}"),
    };
    ((src, sp), (dst, dp))
}

/// The backend address a forwarded frame went to.
pub(crate) fn to(frame: &[u8]) -> Ipv4Addr {
    ends(frame).1 .0
}
