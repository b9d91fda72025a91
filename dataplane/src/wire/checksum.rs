//! Incremental Internet checksum update (RFC 1624, eqn. 3:
//! `HC' = ~(~HC + ~m + m')`).
//!
//! Written by hand because it is five lines and sits on the per-packet path:
//! smoltcp only recomputes checksums over whole buffers, which would read
//! every payload byte of every forwarded packet. Full computation
//! (`smoltcp::wire::checksum`) is the oracle in the tests and is used for
//! the packets xvs builds itself.
//!
//! Invariant: a [`Delta`] is the one's-complement sum of `~old + new` over
//! every 16-bit word that changed; applying it to a checksum that was valid
//! before the change yields one that is valid after it. Words must sit at
//! even offsets from the start of the checksummed data (all header fields
//! xvs rewrites do).

use std::net::Ipv4Addr;

use xvs_config::Address;

/// Accumulated change of checksummed 16-bit words. The sum is kept in 64
/// bits and folded once, when applied: no realistic number of changes can
/// overflow it (2^47 words).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta(u64);

impl Delta {
    /// No change.
    pub const ZERO: Delta = Delta(0);

    /// Records that a 16-bit word changed from `old` to `new`.
    #[inline(always)]
    pub fn word(&mut self, old: u16, new: u16) {
        self.0 += u64::from(!old) + u64::from(new);
    }

    /// Records that a 32-bit field (two words) changed.
    #[inline(always)]
    pub fn dword(&mut self, old: u32, new: u32) {
        self.word((old >> 16) as u16, (new >> 16) as u16);
        self.word(old as u16, new as u16);
    }

    /// Records that an address of either family changed (its 16-bit
    /// words, in network order: the addresses of both families sit at
    /// even offsets in their headers and pseudo-headers). Σ(~w) over the
    /// old address's n words is n·0xffff − Σw (each w ≤ 0xffff).
    #[inline(always)]
    pub fn addr<A: Address>(&mut self, old: A, new: A) {
        self.0 += old.word_count() * 0xffff - old.word_sum() + new.word_sum();
    }

    /// Adds another delta (changes that cover the same checksum).
    #[inline(always)]
    pub fn add(&mut self, other: Delta) {
        self.0 += other.0;
    }

    /// The checksum `hc` after the recorded changes.
    #[inline(always)]
    pub fn apply(self, hc: u16) -> u16 {
        let mut sum = u64::from(!hc) + self.0;
        sum = (sum & 0xffff_ffff) + (sum >> 32);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        !(sum as u16)
    }

    /// As [`Delta::apply`] for a UDP checksum: 0 means "no checksum" and
    /// stays 0; a computed 0 is sent as 0xffff (RFC 768).
    #[inline(always)]
    pub fn apply_udp(self, hc: u16) -> u16 {
        if hc == 0 {
            return 0;
        }
        match self.apply(hc) {
            0 => 0xffff,
            c => c,
        }
    }
}

/// Reads the big-endian u16 at `at`. Callers have checked the length.
#[inline(always)]
pub(crate) fn get16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([buf[at], buf[at + 1]])
}

/// Writes the big-endian u16 at `at`. Callers have checked the length.
#[inline(always)]
pub(crate) fn put16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Reads the IPv4 address at `at`. Callers have checked the length.
#[inline(always)]
pub(crate) fn get_addr(buf: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(buf[at], buf[at + 1], buf[at + 2], buf[at + 3])
}

/// Reads the IPv6 address at `at`. Callers have checked the length.
#[inline(always)]
pub(crate) fn get_addr6(buf: &[u8], at: usize) -> std::net::Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&buf[at..at + 16]);
    std::net::Ipv6Addr::from(o)
}

/// Writes an address at `at`. Callers have checked the length.
#[inline(always)]
pub(crate) fn put_addr<A: Address>(buf: &mut [u8], at: usize, a: A) {
    let bytes = a.octets();
    buf[at..at + bytes.as_ref().len()].copy_from_slice(bytes.as_ref());
}

/// Whether the TCP or UDP checksum of `ip` (a whole packet in `frame`)
/// verifies in full, pseudo-header included (a UDP checksum of 0, "none",
/// verifies; other protocols are not checked here). Reads every byte of
/// the segment: for the first packet of a flow only, where a sender
/// that left its checksum to an offload it does not have (a partial
/// checksum on a veth or a VM's virtio link) shows up once, counted,
/// instead of as a backend silently discarding every segment.
pub fn l4_verifies(frame: &[u8], ip: &super::Ipv4) -> bool {
    use smoltcp::wire::{IpAddress, TcpPacket, UdpPacket};
    let Some(seg) = frame.get(ip.l4_offset()..ip.end()) else {
        return false;
    };
    let (src, dst) = (IpAddress::Ipv4(ip.src), IpAddress::Ipv4(ip.dst));
    match ip.l4 {
        super::L4::Tcp { .. } => {
            TcpPacket::new_checked(seg).is_ok_and(|t| t.verify_checksum(&src, &dst))
        }
        super::L4::Udp { .. } => {
            UdpPacket::new_checked(seg).is_ok_and(|u| u.verify_checksum(&src, &dst))
        }
        _ => true,
    }
}

/// [`l4_verifies`] for IPv6 (a zero UDP checksum never reaches here: the
/// classifier refuses it).
pub fn l4_verifies6(frame: &[u8], ip: &super::ipv6::Ipv6) -> bool {
    use smoltcp::wire::IpProtocol;
    let Some(seg) = frame.get(ip.l4_offset()..ip.end()) else {
        return false;
    };
    let proto = match ip.l4 {
        super::L4::Tcp { .. } => IpProtocol::Tcp,
        super::L4::Udp { .. } => IpProtocol::Udp,
        _ => return true,
    };
    super::ndp::l4_checksum6(ip.src, ip.dst, proto, seg) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::checksum;

    /// A buffer with its checksum at `at` made valid by full computation.
    fn fill(buf: &mut [u8], at: usize) {
        put16(buf, at, 0);
        let c = !checksum::data(buf);
        put16(buf, at, c);
    }

    #[test]
    fn rfc1624_example() {
        // RFC 1624 section 4: HC = 0xDD2F, m = 0x5555 -> m' = 0x3285,
        // HC' = 0x0000 by eqn. 3 (eqn. 2 would give the -0 0xFFFF).
        let mut d = Delta::ZERO;
        d.word(0x5555, 0x3285);
        assert_eq!(d.apply(0xDD2F), 0x0000);
    }

    #[test]
    fn matches_full_recomputation() {
        let mut buf: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37)).collect();
        fill(&mut buf, 10);
        let mut d = Delta::ZERO;
        for (at, new) in [(0usize, 0xffffu16), (2, 0), (12, 0x1234), (38, 0xfedc)] {
            d.word(get16(&buf, at), new);
            put16(&mut buf, at, new);
        }
        let hc = get16(&buf, 10);
        put16(&mut buf, 10, d.apply(hc));
        assert_eq!(checksum::data(&buf), 0xffff);
    }

    #[test]
    fn an_address_of_either_family_matches_full_recomputation() {
        use std::net::Ipv6Addr;
        let mut buf: Vec<u8> = (0..48u8).map(|i| i.wrapping_mul(29)).collect();
        fill(&mut buf, 2);
        let mut d = Delta::ZERO;
        let v4 = Ipv4Addr::new(198, 18, 0, 7);
        d.addr(get_addr(&buf, 4), v4);
        put_addr(&mut buf, 4, v4);
        let v6: Ipv6Addr = "2001:2::42".parse().unwrap();
        let mut old = [0u8; 16];
        old.copy_from_slice(&buf[8..24]);
        d.addr(Ipv6Addr::from(old), v6);
        put_addr(&mut buf, 8, v6);
        let hc = get16(&buf, 2);
        put16(&mut buf, 2, d.apply(hc));
        assert_eq!(checksum::data(&buf), 0xffff);
    }

    #[test]
    fn udp_zero_stays_zero_and_computed_zero_becomes_ffff() {
        let mut d = Delta::ZERO;
        d.word(1, 2);
        assert_eq!(d.apply_udp(0), 0);
        // A change that makes the checksum exactly 0 (+0) must be sent as 0xffff.
        let mut d = Delta::ZERO;
        d.word(0x5555, 0x3285);
        assert_eq!(d.apply_udp(0xDD2F), 0xffff);
    }

    #[test]
    fn many_words_do_not_overflow() {
        let mut d = Delta::ZERO;
        for _ in 0..100_000 {
            d.word(0, 0xffff);
        }
        // 0 -> ffff is +0xffff +0xffff = a multiple of 0xffff: no change mod 2^16-1.
        assert_eq!(d.apply(0x1234), 0x1234);
    }
}
