//! The preallocated entry storage of a flow table and the intrusive
//! doubly-linked lists threaded through it (timer-wheel slots and the
//! early-drop age list).
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

/// One tracked flow or persistence template: 88 bytes for IPv4, 136 for
/// IPv6. The fields a lookup compares (addresses, ports, protocol, flags)
/// come first, within `key_bytes` (29 for IPv4), so verifying a key
/// touches at most two cache lines.
///
/// Layout, as Katran's `flow_key` and `real_pos_lru` keep theirs small:
/// the four addresses are the family's own (4 or 16 bytes each: an IPv4
/// flow never pays for IPv6's), the fields are ordered so that no padding
/// is left (every field at its alignment, the u8s and the MAC filling the
/// gap before the u32s), and the byte counters are 48 bits (a low u32 and
/// a high u16 each: 256 TiB per direction per flow, where a u64 would
/// have cost IPv6 the 8 bytes that keep it under 140).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
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
    /// Bits 32..48 of the byte counters, `[original, reply]`.
    pub(crate) bytes_hi: [u16; 2],
    /// Service id (the scheduler's).
    pub(crate) service: u32,
    /// Backend id (the scheduler's).
    pub(crate) backend_id: u32,
    /// Time of the last packet (seconds on the table's clock).
    pub(crate) last_seen: u32,
    /// Seconds the entry lives after `last_seen`.
    pub(crate) timeout: u32,
    /// Packets seen, `[original, reply]`.
    pub(crate) packets: [u32; 2],
    /// Bits 0..32 of the byte counters, `[original, reply]`.
    pub(crate) bytes_lo: [u32; 2],
    /// `[wheel, age][next, prev]`; the free list uses `links[WHEEL][0]`.
    pub(crate) links: [[u32; 2]; 2],
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
        bytes_hi: [0; 2],
        packets: [0; 2],
        links: [[NIL; 2]; 2],
        client_mac: [0; 6],
        service: 0,
        backend_id: 0,
        last_seen: 0,
        timeout: 0,
        addrs: [A::UNSPECIFIED; 4],
        ports: [0; 4],
        wheel_slot: 0,
        proto: L4Proto::Tcp,
        state: 0,
        flags: 0,
        plan: 0,
    };

    /// Bytes seen, `[original, reply]` (48-bit counters).
    #[inline]
    pub(crate) fn bytes(&self) -> [u64; 2] {
        [0, 1].map(|d| u64::from(self.bytes_hi[d]) << 32 | u64::from(self.bytes_lo[d]))
    }

    /// Counts `len` bytes in direction `d` (wrapping at 2^48).
    #[inline]
    pub(crate) fn add_bytes(&mut self, d: usize, len: u32) {
        let v = (u64::from(self.bytes_hi[d]) << 32 | u64::from(self.bytes_lo[d]))
            .wrapping_add(u64::from(len));
        self.bytes_lo[d] = v as u32;
        self.bytes_hi[d] = (v >> 32) as u16;
    }

    /// Sets the byte counters to `len` original bytes and no reply.
    #[inline]
    pub(crate) fn set_first_bytes(&mut self, len: u32) {
        self.bytes_lo = [len, 0];
        self.bytes_hi = [0, 0];
    }

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

    pub(crate) fn deadline(&self) -> u32 {
        self.last_seen.saturating_add(self.timeout)
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

/// Entries and the free list.
pub(crate) struct Slab<A: Address> {
    pub(crate) entries: Region<Entry<A>>,
    pub(crate) free: u32,
    pub(crate) live: u32,
    /// Slots released so far (wrapping): while it is unchanged, no slot
    /// has been freed, so every live entry is the one it was.
    pub(crate) released: u32,
}

impl<A: Address> Slab<A> {
    pub(crate) fn new(capacity: u32) -> Slab<A> {
        Slab::over(Region::anonymous(capacity as usize, Entry::FREE))
    }

    /// A slab of free entries over `entries` (whatever they held).
    pub(crate) fn over(mut entries: Region<Entry<A>>) -> Slab<A> {
        let capacity = entries.len() as u32;
        for (i, e) in entries.iter_mut().enumerate() {
            *e = Entry::FREE;
            let i = i as u32;
            e.links[WHEEL][0] = if i + 1 < capacity { i + 1 } else { NIL };
        }
        Slab {
            entries,
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
            at = self.entries[at as usize].links[WHEEL][0];
        }
        n
    }

    /// Takes a free slot, marked live, or `None` when full. The next
    /// free slot is prefetched: the next new flow (usually of the same
    /// batch) then writes an entry already in cache instead of waiting
    /// for the free list's next link.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let slot = self.free;
        let e = self.entries.get_mut(slot as usize)?;
        self.free = e.links[WHEEL][0];
        *e = Entry::FREE;
        e.flags = FLAG_LIVE;
        self.live += 1;
        if let Some(next) = self.entries.get(self.free as usize) {
            let start = (next as *const Entry<A>).cast::<u8>();
            crate::batch::prefetch(start);
            crate::batch::prefetch(start.wrapping_add(std::mem::size_of::<Entry<A>>() - 1));
        }
        Some(slot)
    }

    /// Returns a slot (already unlinked from every list) to the free list.
    pub(crate) fn release(&mut self, slot: u32) {
        let free = self.free;
        let e = &mut self.entries[slot as usize];
        *e = Entry::FREE;
        e.links[WHEEL][0] = free;
        self.free = slot;
        self.live -= 1;
        self.released = self.released.wrapping_add(1);
    }

    /// Appends `slot` to the list `head` of kind `kind`.
    pub(crate) fn push_back(&mut self, kind: usize, head: &mut ListHead, slot: u32) {
        let last = head.last;
        {
            let e = &mut self.entries[slot as usize];
            e.links[kind] = [NIL, last];
        }
        if last == NIL {
            head.first = slot;
        } else {
            self.entries[last as usize].links[kind][0] = slot;
        }
        head.last = slot;
    }

    /// Removes `slot` from the list `head` of kind `kind`.
    pub(crate) fn unlink(&mut self, kind: usize, head: &mut ListHead, slot: u32) {
        let [next, prev] = self.entries[slot as usize].links[kind];
        if prev == NIL {
            head.first = next;
        } else {
            self.entries[prev as usize].links[kind][0] = next;
        }
        if next == NIL {
            head.last = prev;
        } else {
            self.entries[next as usize].links[kind][1] = prev;
        }
        self.entries[slot as usize].links[kind] = [NIL, NIL];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_88_bytes_for_ipv4_and_136_for_ipv6_with_no_padding() {
        use std::net::{Ipv4Addr, Ipv6Addr};
        assert_eq!(std::mem::size_of::<Entry<Ipv4Addr>>(), 88);
        assert_eq!(std::mem::size_of::<Entry<Ipv6Addr>>(), 136);
        assert_eq!(key_bytes::<Ipv4Addr>(), 29);
        // The byte counters hold 48 bits per direction.
        let mut e = Entry::<Ipv6Addr>::FREE;
        e.set_first_bytes(u32::MAX);
        e.add_bytes(0, u32::MAX);
        e.add_bytes(1, 7);
        assert_eq!(e.bytes(), [2 * u64::from(u32::MAX), 7]);
        e.bytes_hi[0] = u16::MAX;
        e.bytes_lo[0] = u32::MAX;
        e.add_bytes(0, 1);
        assert_eq!(e.bytes()[0], 0, "wraps at 2^48");
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
        assert_eq!(s.entries[1].links[AGE], [3, NIL]);
        s.unlink(AGE, &mut h, 1);
        s.unlink(AGE, &mut h, 3);
        assert!(h.is_empty());
    }
}
