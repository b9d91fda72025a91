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

    /// Records that a 32-bit field (two words) changed: in one step, as
    /// a 32-bit word is congruent to the sum of its two halves modulo
    /// 0xffff (2^16 ≡ 1), and so is its complement to theirs.
    #[inline(always)]
    pub fn dword(&mut self, old: u32, new: u32) {
        self.0 += u64::from(!old) + u64::from(new);
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
        !fold(u64::from(!hc) + self.0)
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

/// The one's-complement sum of `data` as big-endian 16-bit words (an
/// odd last byte is the high byte of a word whose low byte is zero, RFC
/// 1071), not yet folded: add other parts' sums to it, then [`fold`].
///
/// By hand because smoltcp's `checksum::data` adds 16 bits at a time in
/// an out-of-line loop: verifying a flow's first segment with it cost a
/// new flow more instructions than its whole SNAT search. Here 64-bit
/// words are added in native order with the carry brought back in (an
/// add with carry, as the kernel's `csum_partial`): 2^64 ≡ 1 modulo
/// 0xffff, so the end-around carry keeps the sum's class, and a sum of
/// byte-swapped words is the byte-swapped sum (RFC 1071 2.(B)), so the
/// folded native sum, read big-endian, is the big-endian words' sum. It
/// is 0 only for data of zeros, as the big-endian sum is.
#[inline]
pub fn ones_sum(data: &[u8]) -> u64 {
    u64::from(u16::from_be(fold(native_sum(data))))
}

/// An add with the carry brought back in (one's-complement, 64 bits).
#[inline(always)]
fn add(sum: u64, v: u64) -> u64 {
    let (s, carry) = sum.overflowing_add(v);
    s + u64::from(carry)
}

/// [`ones_sum`] before its fold and byte swap: the 64-bit sum of `data`
/// as the machine reads it, for parts summed in the same order to be
/// added to it (the IPv4 pseudo-header in [`l4_verifies`]).
#[inline(always)]
fn native_sum(data: &[u8]) -> u64 {
    let (words, tail) = data.as_chunks::<8>();
    let mut sum = 0u64;
    for w in words {
        sum = add(sum, u64::from_ne_bytes(*w));
    }
    // The last 0 to 7 bytes as a word zero-padded on the right (every
    // byte keeps its place), made in a register: from the data's last 8
    // bytes, one load, the ones already summed shifted out (read little
    // endian, then put in the machine's order). Not assembled in memory
    // from 4-, 2- and 1-byte stores and read back as one word: such a
    // load is not forwarded from the store buffer and waits until every
    // older store is written, on a new flow some to lines still arriving
    // (7.7% of `Half::new_flow`'s samples sat there).
    let t = tail.len();
    if t == 0 {
        return sum;
    }
    let last = match data.last_chunk::<8>() {
        Some(w) => u64::from_le_bytes(*w) >> (8 * (8 - t)),
        None => tail.iter().rev().fold(0, |x, &b| x << 8 | u64::from(b)),
    };
    add(sum, u64::from_le(last))
}

/// A one's-complement sum ([`ones_sum`]s and words added together)
/// folded to 16 bits: 0xffff for data whose checksum verifies.
///
/// Two end-around-carry adds (64 → 32 → 16 bits, RFC 1071 2.(C)): each
/// half added to the other with its carry brought back in, an add with
/// carry to the machine, where shift-and-mask rounds take four.
#[inline(always)]
pub fn fold(sum: u64) -> u16 {
    let (s, carry) = (sum as u32).overflowing_add((sum >> 32) as u32);
    // No overflow: after a carry out, `s` is at most 0xffff_fffe.
    let s = s + u32::from(carry);
    let (t, carry) = (s as u16).overflowing_add((s >> 16) as u16);
    t + u16::from(carry)
}

/// The pseudo-header's part of a TCP or UDP checksum (RFC 793, RFC 768;
/// RFC 8200 8.1 for IPv6: its length is 32 bits, split in two words).
#[inline(always)]
pub fn pseudo_sum<A: Address>(src: A, dst: A, proto: u8, len: usize) -> u64 {
    let len = len as u64;
    src.word_sum() + dst.word_sum() + u64::from(proto) + (len >> 16) + (len & 0xffff)
}

/// Whether the TCP or UDP checksum of `ip` (a whole packet in `frame`)
/// verifies in full, pseudo-header included (a UDP checksum of 0, "none",
/// verifies; other protocols are not checked here). Reads every byte of
/// the segment: for the first packet of a flow only, where a sender
/// that left its checksum to an offload it does not have (a partial
/// checksum on a veth or a VM's virtio link) shows up once, counted,
/// instead of as a backend silently discarding every segment.
pub fn l4_verifies(frame: &[u8], ip: &super::Ipv4) -> bool {
    let Some(seg) = frame.get(ip.l4_offset()..ip.end()) else {
        return false;
    };
    let seg = match ip.l4 {
        // The classifier has checked the TCP header's length.
        super::L4::Tcp { .. } => seg,
        // The datagram is what its length field says (`UdpPacket`'s
        // `check_len`), and a zero checksum is none.
        super::L4::Udp { .. } => {
            if seg.len() < 8 {
                return false;
            }
            let len = usize::from(get16(seg, 4));
            if len < 8 || len > seg.len() {
                return false;
            }
            if get16(seg, 6) == 0 {
                return true;
            }
            &seg[..len]
        }
        _ => return true,
    };
    // The pseudo-header summed in the segment's native order: the
    // addresses as the header holds them, protocol and length as the
    // big-endian words they are (a sum of 0xffff reads the same either
    // way round, so the fold needs no swap).
    let pseudo = u64::from(u32::from_ne_bytes(ip.src.octets()))
        + u64::from(u32::from_ne_bytes(ip.dst.octets()))
        + u64::from(u16::from_ne_bytes([0, ip.protocol]))
        + u64::from(u16::from_ne_bytes((seg.len() as u16).to_be_bytes()));
    fold(add(native_sum(seg), pseudo)) == 0xffff
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

    use proptest::prelude::*;
    use smoltcp::wire::{IpAddress, IpProtocol, TcpPacket, UdpPacket};

    /// An IPv4 frame (no options) around `seg`, classified, or `None`
    /// when the classifier refuses it.
    fn frame4(proto: u8, seg: &[u8]) -> Option<(Vec<u8>, crate::wire::Ipv4)> {
        let mut f = vec![0u8; 14 + 20 + seg.len()];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + seg.len()) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
        ip[16..20].copy_from_slice(&[198, 19, 7, 9]);
        fill(ip, 10);
        f[34..].copy_from_slice(seg);
        match crate::wire::classify(&f) {
            Ok(crate::wire::Frame::Ipv4(ip)) => Some((f, ip)),
            _ => None,
        }
    }

    /// Folding by repeated shift-and-mask rounds, the textbook way.
    fn fold_by_rounds(mut sum: u64) -> u16 {
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    #[test]
    fn fold_agrees_with_rounds_at_the_carries() {
        for sum in [
            0,
            1,
            0xffff,
            0x1_0000,
            0x1_fffe,
            0xffff_ffff,
            0x1_0000_0000,
            0xffff_fffe_ffff_ffff,
            0xffff_ffff_ffff_fffe,
            u64::MAX,
        ] {
            assert_eq!(fold(sum), fold_by_rounds(sum), "{sum:#x}");
        }
    }

    proptest! {
        /// Any sum folds as the textbook rounds fold it.
        #[test]
        fn fold_agrees_with_rounds(sum in any::<u64>()) {
            prop_assert_eq!(fold(sum), fold_by_rounds(sum));
        }

        /// A 32-bit field's change recorded in one step updates any
        /// checksum exactly as its two 16-bit words' changes do, +0 and
        /// -0 included.
        #[test]
        fn a_dword_is_its_two_words(
            old in any::<u32>(),
            new in any::<u32>(),
            before in any::<u64>(),
            hc in any::<u16>(),
        ) {
            let start = Delta(before >> 20);
            let (mut one, mut two) = (start, start);
            one.dword(old, new);
            two.word((old >> 16) as u16, (new >> 16) as u16);
            two.word(old as u16, new as u16);
            prop_assert_eq!(one.apply(hc), two.apply(hc));
        }

        /// The sum matches smoltcp's at every length, odd ones too.
        #[test]
        fn ones_sum_matches_smoltcp(data in proptest::collection::vec(any::<u8>(), 0..1600)) {
            prop_assert_eq!(fold(ones_sum(&data)), checksum::data(&data));
        }

        /// TCP and UDP segments with their checksum made valid (by
        /// smoltcp), then maybe one byte changed or the UDP length
        /// field shortened: verified exactly when smoltcp verifies them.
        #[test]
        fn l4_verifies_as_smoltcp_does(
            udp in any::<bool>(),
            body in proptest::collection::vec(any::<u8>(), 0..1500),
            flip in proptest::option::of((any::<proptest::sample::Index>(), 1..=255u8)),
            short in 0..4usize,
            zero in any::<bool>(),
        ) {
            let (src, dst) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 19, 7, 9));
            let (s, d) = (IpAddress::Ipv4(src), IpAddress::Ipv4(dst));
            let mut seg = vec![0u8; 20];
            seg.extend_from_slice(&body);
            let len = seg.len();
            if udp {
                put16(&mut seg, 0, 5353);
                put16(&mut seg, 2, 53);
                put16(&mut seg, 4, (len - short.min(len - 8)) as u16);
                let mut u = UdpPacket::new_unchecked(&mut seg[..]);
                u.fill_checksum(&s, &d);
                if zero {
                    put16(&mut seg, 6, 0);
                }
            } else {
                seg[12] = 5 << 4;
                seg[13] = 0x02;
                let mut t = TcpPacket::new_unchecked(&mut seg[..]);
                t.fill_checksum(&s, &d);
            }
            if let Some((at, by)) = flip {
                let at = at.index(seg.len());
                seg[at] ^= by;
            }
            let proto = if udp { 17 } else { 6 };
            let Some((frame, ip)) = frame4(proto, &seg) else {
                return Ok(());
            };
            let expected = if udp {
                UdpPacket::new_checked(&seg[..]).is_ok_and(|u| u.verify_checksum(&s, &d))
            } else {
                TcpPacket::new_checked(&seg[..]).is_ok_and(|t| t.verify_checksum(&s, &d))
            };
            prop_assert_eq!(l4_verifies(&frame, &ip), expected);
        }

        /// The IPv6 checksum of any segment is smoltcp's.
        #[test]
        fn l4_checksum6_matches_smoltcp(
            seg in proptest::collection::vec(any::<u8>(), 0..1600),
            src in any::<u128>(),
            dst in any::<u128>(),
        ) {
            let (src, dst) = (std::net::Ipv6Addr::from(src), std::net::Ipv6Addr::from(dst));
            let ours = crate::wire::ndp::l4_checksum6(src, dst, IpProtocol::Udp, &seg);
            let theirs = !checksum::combine(&[
                checksum::pseudo_header_v6(&src, &dst, IpProtocol::Udp, seg.len() as u32),
                checksum::data(&seg),
            ]);
            prop_assert_eq!(ours, theirs);
        }
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
