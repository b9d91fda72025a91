//! The preallocated entry storage of a flow table and the intrusive
//! doubly-linked lists threaded through it (timer-wheel slots and the
//! early-drop age list). A slot is an entry (what an established packet
//! touches, line-aligned) and its cold part (timeout, the byte counters'
//! high bits and the list links) at the same index of a parallel array.
//!
//! Invariants: the slab never grows after construction (all `capacity`
//! entries exist from the start); a slot is either on the free list or
//! live, never both; a live entry is on exactly one wheel list and on the
//! age list iff it is a non-ESTABLISHED flow (not a template); a flow
//! indexes both keys unless it is one-way ([`FLAG_ONE_WAY`]); `NIL` ends
//! every list. Links are u32 slot numbers, so capacity < 2^31.

use xvs_config::Address;

use crate::key::{Endpoint, FlowKey, L4Proto};
use crate::region::Region;
use crate::state::{Direction, FlowState};

/// End of a list / no slot.
pub(crate) const NIL: u32 = u32::MAX;
/// Which list a link pair belongs to.
pub(crate) const WHEEL: usize = 0;
pub(crate) const AGE: usize = 1;

/// Entry flag: the backend was quiesced (weight 0) while this flow lived.
pub const FLAG_QUIESCED: u8 = 0x01;
/// Entry flag: a persistence template, not a flow.
pub const FLAG_TEMPLATE: u8 = 0x02;
/// Entry flag: a one-way flow (direct routing, tunnels): only the
/// client's direction passes the gateway, so only its key is indexed and
/// TCP follows IPVS's INPUT-ONLY state table.
pub(crate) const FLAG_ONE_WAY: u8 = 0x08;
/// Entry flag: installed from another gateway's sync record (a peer's
/// flow this gateway holds, and serves once it takes over).
pub(crate) const FLAG_PEER: u8 = 0x10;
/// Entry flag: on the age list.
pub(crate) const FLAG_AGED: u8 = 0x04;
/// Entry flag: live (not on the free list).
pub(crate) const FLAG_LIVE: u8 = 0x80;

/// One tracked flow or persistence template: the fields a packet of an
/// established flow reads or writes, in one aligned cache line for IPv4
/// (64 bytes) and two for IPv6 (112 bytes, aligned to 128); the rest of
/// the flow is its [`Cold`] part, in a parallel array.
///
/// Layout, as Katran's `flow_key` and `real_pos_lru` keep theirs small:
/// the four addresses are the family's own (4 or 16 bytes each: an IPv4
/// flow never pays for IPv6's), the fields are ordered so that no padding
/// is left inside (every field at its alignment, the u8s and the MAC
/// filling the gap before the u32s), and the byte counters are 48 bits:
/// the low 32 here, the high 16 in [`Cold`], written only on a carry
/// (256 TiB per direction per flow). The fields a lookup compares
/// (addresses, ports, protocol, flags) come first, within `key_bytes`
/// (29 for IPv4). Aligned to a line, an established packet touches one
/// line of the entry for IPv4 where an 88-byte stride had it touch 2.25
/// on average (the lookup's prefetch, the key check and the packet's
/// counters and clock); at 1M flows that cut the established packet's
/// time by a quarter.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Entry<A: Address> {
    /// Client, VIP, backend and SNAT addresses.
    pub(crate) addrs: [A; 4],
    /// Client, VIP, backend and SNAT ports.
    pub(crate) ports: [u16; 4],
    /// Wheel slot the entry is filed in.
    pub(crate) wheel_slot: u16,
    pub(crate) proto: L4Proto,
    pub(crate) state: u8,
    pub(crate) flags: u8,
    /// The caller's forwarding plan tag (opaque here; outside the
    /// compared key bytes).
    pub(crate) plan: u8,
    /// The Ethernet address the client's packets came from: replies go
    /// back to it.
    pub(crate) client_mac: [u8; 6],
    /// Service id (the scheduler's).
    pub(crate) service: u32,
    /// Backend id (the scheduler's).
    pub(crate) backend_id: u32,
    /// Time of the last packet (seconds on the table's clock).
    pub(crate) last_seen: u32,
    /// Packets seen, `[original, reply]`.
    pub(crate) packets: [u32; 2],
    /// Bits 0..32 of the byte counters, `[original, reply]`.
    pub(crate) bytes_lo: [u32; 2],
}

/// The part of a flow that its packets do not touch while its state
/// holds: read by the wheel's sweep, state changes, list edits and
/// listings. 24 bytes, in an array parallel to the entries (slot `i`'s
/// cold part is `cold[i]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Cold {
    /// Seconds the entry lives after `last_seen`.
    pub(crate) timeout: u32,
    /// Bits 32..48 of the byte counters, `[original, reply]`.
    pub(crate) bytes_hi: [u16; 2],
    /// `[wheel, age][next, prev]`; the free list uses `links[WHEEL][0]`.
    pub(crate) links: [[u32; 2]; 2],
}

impl Cold {
    pub(crate) const FREE: Cold = Cold {
        timeout: 0,
        bytes_hi: [0; 2],
        links: [[NIL; 2]; 2],
    };
}

/// Bytes of an entry that key comparison reads, from its start: the four
/// addresses, the four ports, the wheel slot, protocol, state and flags
/// (the layout test holds the entry to it).
#[cfg(test)]
pub(crate) const fn key_bytes<A: Address>() -> usize {
    4 * A::LEN + 4 * 2 + 2 + 3
}

const CLIENT: usize = 0;
const VIP: usize = 1;
const BACKEND: usize = 2;
const SNAT: usize = 3;

impl<A: Address> Entry<A> {
    pub(crate) const FREE: Entry<A> = Entry {
        bytes_lo: [0; 2],
        packets: [0; 2],
        client_mac: [0; 6],
        service: 0,
        backend_id: 0,
        last_seen: 0,
        addrs: [A::UNSPECIFIED; 4],
        ports: [0; 4],
        wheel_slot: 0,
        proto: L4Proto::Tcp,
        state: 0,
        flags: 0,
        plan: 0,
    };

    pub(crate) fn endpoint(&self, which: usize) -> Endpoint<A> {
        Endpoint {
            addr: self.addrs[which],
            port: self.ports[which],
        }
    }

    pub(crate) fn set_endpoint(&mut self, which: usize, e: Endpoint<A>) {
        self.addrs[which] = e.addr;
        self.ports[which] = e.port;
    }

    pub(crate) fn client(&self) -> Endpoint<A> {
        self.endpoint(CLIENT)
    }
    pub(crate) fn vip(&self) -> Endpoint<A> {
        self.endpoint(VIP)
    }
    pub(crate) fn backend(&self) -> Endpoint<A> {
        self.endpoint(BACKEND)
    }
    pub(crate) fn snat(&self) -> Endpoint<A> {
        self.endpoint(SNAT)
    }
    pub(crate) fn set_ends(
        &mut self,
        client: Endpoint<A>,
        vip: Endpoint<A>,
        backend: Endpoint<A>,
        snat: Endpoint<A>,
    ) {
        self.set_endpoint(CLIENT, client);
        self.set_endpoint(VIP, vip);
        self.set_endpoint(BACKEND, backend);
        self.set_endpoint(SNAT, snat);
    }

    /// The key packets carry in `dir`: client → VIP, or backend → SNAT.
    #[inline]
    pub(crate) fn key(&self, dir: Direction) -> FlowKey<A> {
        match dir {
            Direction::Original => FlowKey::between(self.client(), self.vip(), self.proto),
            Direction::Reply => FlowKey::between(self.backend(), self.snat(), self.proto),
        }
    }

    pub(crate) fn state(&self) -> FlowState {
        FlowState::from_index(self.state)
    }

    pub(crate) fn is_live(&self) -> bool {
        self.flags & FLAG_LIVE != 0
    }

    pub(crate) fn is_template(&self) -> bool {
        self.flags & FLAG_TEMPLATE != 0
    }

    /// Whether only the original key is indexed (a template or a one-way
    /// flow).
    pub(crate) fn has_one_key(&self) -> bool {
        self.flags & (FLAG_TEMPLATE | FLAG_ONE_WAY) != 0
    }
}

/// First and last slot of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListHead {
    pub(crate) first: u32,
    pub(crate) last: u32,
}

impl ListHead {
    pub(crate) const EMPTY: ListHead = ListHead {
        first: NIL,
        last: NIL,
    };

    pub(crate) fn is_empty(&self) -> bool {
        self.first == NIL
    }
}

/// The memory of a slab: its entries and their cold parts.
pub(crate) type Regions<A> = (Region<Entry<A>>, Region<Cold>);

/// Entries, their cold parts and the free list.
pub(crate) struct Slab<A: Address> {
    pub(crate) entries: Region<Entry<A>>,
    /// `cold[i]` is entry `i`'s cold part (same length as `entries`).
    pub(crate) cold: Region<Cold>,
    pub(crate) free: u32,
    pub(crate) live: u32,
    /// Slots released so far (wrapping): while it is unchanged, no slot
    /// has been freed, so every live entry is the one it was.
    pub(crate) released: u32,
}

impl<A: Address> Slab<A> {
    pub(crate) fn new(capacity: u32) -> Slab<A> {
        Slab::over(
            Region::anonymous(capacity as usize, Entry::FREE),
            Region::anonymous(capacity as usize, Cold::FREE),
        )
    }

    /// A slab of free entries over `entries` and `cold` (whatever they
    /// held; of one length).
    pub(crate) fn over(mut entries: Region<Entry<A>>, mut cold: Region<Cold>) -> Slab<A> {
        assert_eq!(entries.len(), cold.len(), "entries and cold parts pair up");
        let capacity = entries.len() as u32;
        entries.fill(Entry::FREE);
        for (i, c) in cold.iter_mut().enumerate() {
            *c = Cold::FREE;
            let i = i as u32;
            c.links[WHEEL][0] = if i + 1 < capacity { i + 1 } else { NIL };
        }
        Slab {
            entries,
            cold,
            free: if capacity > 0 { 0 } else { NIL },
            live: 0,
            released: 0,
        }
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.entries.len() as u32
    }

    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Length of the free list (walked: for invariant checks only).
    pub(crate) fn free_len(&self) -> u32 {
        let (mut n, mut at) = (0, self.free);
        while at != NIL && n <= self.capacity() {
            n += 1;
            at = self.cold[at as usize].links[WHEEL][0];
        }
        n
    }

    /// Takes a free slot, marked live, or `None` when full. The next
    /// free slot is prefetched (its entry line and its cold part): the
    /// next new flow (usually of the same batch) then writes lines
    /// already in cache instead of waiting for the free list's next
    /// link.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let slot = self.free;
        let c = self.cold.get_mut(slot as usize)?;
        self.free = c.links[WHEEL][0];
        *c = Cold::FREE;
        let e = &mut self.entries[slot as usize];
        *e = Entry::FREE;
        e.flags = FLAG_LIVE;
        self.live += 1;
        if let (Some(next), Some(cold)) = (
            self.entries.get(self.free as usize),
            self.cold.get(self.free as usize),
        ) {
            crate::batch::prefetch_lines(next as *const Entry<A>);
            crate::batch::prefetch_lines(cold as *const Cold);
        }
        Some(slot)
    }

    /// Returns a slot (already unlinked from every list) to the free list.
    pub(crate) fn release(&mut self, slot: u32) {
        self.release_unlinked(slot);
        self.live -= 1;
        self.released = self.released.wrapping_add(1);
    }

    /// Frees `slot` without touching any list or count (adoption
    /// rebuilds them; [`Slab::release`] for a live slot).
    pub(crate) fn release_unlinked(&mut self, slot: u32) {
        self.entries[slot as usize] = Entry::FREE;
        let c = &mut self.cold[slot as usize];
        *c = Cold::FREE;
        c.links[WHEEL][0] = self.free;
        self.free = slot;
    }

    /// When `slot`'s entry stops living without a packet or a change
    /// (`last_seen + timeout`).
    #[inline]
    pub(crate) fn deadline(&self, slot: u32) -> u32 {
        self.flow(slot).deadline()
    }

    /// Counts `len` bytes in direction `d` of `slot` (wrapping at 2^48):
    /// the cold part is written only when the low word carries.
    #[inline(always)]
    pub(crate) fn add_bytes(&mut self, slot: u32, d: usize, len: u32) {
        let e = &mut self.entries[slot as usize];
        let (lo, carry) = e.bytes_lo[d].overflowing_add(len);
        e.bytes_lo[d] = lo;
        if carry {
            self.carry(slot, d);
        }
    }

    /// The carry of [`Slab::add_bytes`]: once per 4 GiB of a direction.
    #[cold]
    #[inline(never)]
    fn carry(&mut self, slot: u32, d: usize) {
        let hi = &mut self.cold[slot as usize].bytes_hi[d];
        *hi = hi.wrapping_add(1);
    }

    /// Sets `slot`'s byte counters to `len` original bytes and no reply.
    #[inline]
    pub(crate) fn set_first_bytes(&mut self, slot: u32, len: u32) {
        self.entries[slot as usize].bytes_lo = [len, 0];
        self.cold[slot as usize].bytes_hi = [0, 0];
    }

    /// Appends `slot` to the list `head` of kind `kind`.
    pub(crate) fn push_back(&mut self, kind: usize, head: &mut ListHead, slot: u32) {
        let last = head.last;
        self.cold[slot as usize].links[kind] = [NIL, last];
        if last == NIL {
            head.first = slot;
        } else {
            self.cold[last as usize].links[kind][0] = slot;
        }
        head.last = slot;
    }

    /// Removes `slot` from the list `head` of kind `kind`.
    pub(crate) fn unlink(&mut self, kind: usize, head: &mut ListHead, slot: u32) {
        let [next, prev] = self.cold[slot as usize].links[kind];
        if prev == NIL {
            head.first = next;
        } else {
            self.cold[prev as usize].links[kind][0] = next;
        }
        if next == NIL {
            head.last = prev;
        } else {
            self.cold[next as usize].links[kind][1] = prev;
        }
        self.cold[slot as usize].links[kind] = [NIL, NIL];
    }
}

/// The 48-bit byte counters of an entry and its cold part.
pub(crate) fn bytes_of<A: Address>(e: &Entry<A>, c: &Cold) -> [u64; 2] {
    [0, 1].map(|d| u64::from(c.bytes_hi[d]) << 32 | u64::from(e.bytes_lo[d]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_one_line_for_ipv4_and_two_for_ipv6_and_its_cold_part_24_bytes() {
        use std::net::{Ipv4Addr, Ipv6Addr};
        assert_eq!(std::mem::size_of::<Entry<Ipv4Addr>>(), 64);
        assert_eq!(std::mem::align_of::<Entry<Ipv4Addr>>(), 64);
        assert_eq!(std::mem::size_of::<Entry<Ipv6Addr>>(), 128);
        assert_eq!(std::mem::size_of::<Cold>(), 24);
        assert_eq!(key_bytes::<Ipv4Addr>(), 29);
        // No padding inside the IPv4 entry; IPv6's 16 bytes are at its end.
        let end = std::mem::offset_of!(Entry<Ipv6Addr>, bytes_lo) + 8;
        assert_eq!(end, 112);
        // The byte counters hold 48 bits per direction.
        let mut s = Slab::<Ipv6Addr>::new(1);
        let i = s.alloc().unwrap();
        s.set_first_bytes(i, u32::MAX);
        s.add_bytes(i, 0, u32::MAX);
        s.add_bytes(i, 1, 7);
        assert_eq!(s.flow(i).bytes(), [2 * u64::from(u32::MAX), 7]);
        s.cold[0].bytes_hi[0] = u16::MAX;
        s.entries[0].bytes_lo[0] = u32::MAX;
        s.add_bytes(i, 0, 1);
        assert_eq!(s.flow(i).bytes()[0], 0, "wraps at 2^48");
    }

    #[test]
    fn a_slot_s_entry_is_line_aligned() {
        let s = Slab::<std::net::Ipv4Addr>::new(3);
        for e in s.entries.iter() {
            assert_eq!((e as *const Entry<_>).addr() % 64, 0);
        }
    }

    #[test]
    fn alloc_until_full_then_release() {
        let mut s = Slab::<std::net::Ipv4Addr>::new(3);
        let a: Vec<u32> = (0..3).map(|_| s.alloc().unwrap()).collect();
        assert_eq!(a, [0, 1, 2]);
        assert_eq!(s.alloc(), None);
        assert_eq!(s.live(), 3);
        s.release(1);
        assert_eq!(s.alloc(), Some(1));
        assert!(s.entries[1].is_live());
    }

    #[test]
    fn lists_keep_order_and_unlink_anywhere() {
        let mut s = Slab::<std::net::Ipv4Addr>::new(4);
        let mut h = ListHead::EMPTY;
        for _ in 0..4 {
            let i = s.alloc().unwrap();
            s.push_back(AGE, &mut h, i);
        }
        s.unlink(AGE, &mut h, 2);
        s.unlink(AGE, &mut h, 0);
        assert_eq!((h.first, h.last), (1, 3));
        assert_eq!(s.cold[1].links[AGE], [3, NIL]);
        s.unlink(AGE, &mut h, 1);
        s.unlink(AGE, &mut h, 3);
        assert!(h.is_empty());
    }
}
