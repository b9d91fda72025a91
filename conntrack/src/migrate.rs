//! Migrating a state file of the layout before this one (layout 2: a whole
//! flow in one entry, 88 bytes for IPv4 and 136 for IPv6) to this
//! layout (a line-aligned entry and its cold part, see `slab`), so that
//! the upgrade that split the entry keeps every flow, as a restart
//! within one layout does.
//!
//! Invariants: a file is migrated only when its header is layout 2's,
//! with layout 2's own entry signature, and agrees with this process on
//! everything else (what `persist` would have asked of it), and its
//! length is layout 2's for the capacity. The new file is written beside
//! it (`<path>.migrating`) and renamed over it only when whole, so a
//! process killed mid-migration leaves the old file, migrated again by
//! the next. The old entries are read, never trusted: each becomes an
//! entry of this layout field by field, and adoption then checks it as
//! it checks any entry read back from a file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use xvs_config::Address;

use crate::persist::FlatAddress;
use crate::region::{Region, HEADER};
use crate::slab::{Cold, Entry, Regions, Slab};

/// The layout version this module migrates from.
pub(crate) const FROM: u64 = 2;

/// Layout 2's entry, field for field (its protocol as a byte: read from
/// a file, any byte may be there).
#[derive(Clone, Copy)]
#[repr(C)]
struct EntryV2<A: Address> {
    addrs: [A; 4],
    ports: [u16; 4],
    wheel_slot: u16,
    proto: u8,
    state: u8,
    flags: u8,
    plan: u8,
    client_mac: [u8; 6],
    bytes_hi: [u16; 2],
    service: u32,
    backend_id: u32,
    last_seen: u32,
    timeout: u32,
    packets: [u32; 2],
    bytes_lo: [u32; 2],
    links: [[u32; 2]; 2],
}

/// Layout 2's entry signature for family `A`, as its header holds it:
/// the digest of the entry's size and field offsets, in the order
/// layout 2's `layout_signature` took them.
pub(crate) fn signature<A: Address>() -> u64 {
    use std::mem::{offset_of, size_of};
    let parts = [
        size_of::<EntryV2<A>>(),
        offset_of!(EntryV2<A>, addrs),
        offset_of!(EntryV2<A>, ports),
        offset_of!(EntryV2<A>, wheel_slot),
        offset_of!(EntryV2<A>, proto),
        offset_of!(EntryV2<A>, state),
        offset_of!(EntryV2<A>, flags),
        offset_of!(EntryV2<A>, plan),
        offset_of!(EntryV2<A>, service),
        offset_of!(EntryV2<A>, backend_id),
        offset_of!(EntryV2<A>, last_seen),
        offset_of!(EntryV2<A>, timeout),
        offset_of!(EntryV2<A>, client_mac),
        offset_of!(EntryV2<A>, bytes_hi),
        offset_of!(EntryV2<A>, bytes_lo),
        offset_of!(EntryV2<A>, packets),
        offset_of!(EntryV2<A>, links),
    ];
    crate::persist::digest(parts.iter().map(|&p| p as u64))
}

/// The length of a layout-2 file of `capacity` entries.
pub(crate) fn bytes<A: Address>(capacity: u32) -> u64 {
    (HEADER + capacity as usize * std::mem::size_of::<EntryV2<A>>()) as u64
}

/// Entries read from the old file at a time.
const CHUNK: usize = 4096;

/// Writes the flows of the layout-2 file `old` (of `capacity` entries,
/// its header already checked) into a file of this layout with the
/// header page `header`, renames it over `old`, and returns its regions
/// (the entries as the old file had them: adoption checks them).
pub(crate) fn from_v2<A: FlatAddress>(
    old: &Path,
    capacity: u32,
    header: &[u8; HEADER],
) -> std::io::Result<Regions<A>> {
    let len = capacity as usize;
    let file = File::open(old)?;
    let mut tmp = old.as_os_str().to_owned();
    tmp.push(".migrating");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let (entries, cold, _) = Region::<Entry<A>>::file_pair::<Cold>(&tmp, len)?;
    let mut slab = Slab::over(entries, cold);
    let size = std::mem::size_of::<EntryV2<A>>();
    let mut buf = vec![0u8; CHUNK * size];
    for first in (0..len).step_by(CHUNK) {
        let n = CHUNK.min(len - first);
        let raw = &mut buf[..n * size];
        file.read_exact_at(raw, (HEADER + first * size) as u64)?;
        for (i, bytes) in raw.chunks_exact(size).enumerate() {
            let (e, proto, c) = convert(read(bytes));
            let slot = slab.entries.raw(first + i);
            // Written through the raw slot: the protocol byte may be one
            // no `L4Proto` has, which adoption's check (`sanitise`)
            // resets before the entry is used as one.
            // SAFETY: `slot` is a slot of the mapping (`first + i <
            // len`, checked by `raw`), aligned; `e` is a whole value and
            // the byte written after it is within it, at its protocol.
            unsafe {
                slot.write(e);
                slot.cast::<u8>()
                    .add(std::mem::offset_of!(Entry<A>, proto))
                    .write(proto);
            }
            slab.cold[first + i] = c;
        }
    }
    let mut entries = slab.entries;
    if let Some(h) = entries.header() {
        h.copy_from_slice(header);
    }
    std::fs::rename(&tmp, old)?;
    Ok((entries, slab.cold))
}

/// Layout 2's entry in `bytes` (exactly its size).
fn read<A: FlatAddress>(bytes: &[u8]) -> EntryV2<A> {
    assert_eq!(bytes.len(), std::mem::size_of::<EntryV2<A>>());
    // SAFETY: `bytes` holds a whole `EntryV2<A>`, read unaligned; every
    // bit pattern of its fields is a value (integers, byte arrays and a
    // `FlatAddress`, whose every pattern is an address).
    unsafe { bytes.as_ptr().cast::<EntryV2<A>>().read_unaligned() }
}

/// The entry and cold part of this layout that hold what `old` held
/// (list links are not kept: adoption rebuilds them), but for the
/// protocol, returned as the byte it was (valid or not) for the caller
/// to write over the entry's.
fn convert<A: FlatAddress>(old: EntryV2<A>) -> (Entry<A>, u8, Cold) {
    let mut e = Entry::FREE;
    e.addrs = old.addrs;
    e.ports = old.ports;
    e.wheel_slot = old.wheel_slot;
    e.state = old.state;
    e.flags = old.flags;
    e.plan = old.plan;
    e.client_mac = old.client_mac;
    e.service = old.service;
    e.backend_id = old.backend_id;
    e.last_seen = old.last_seen;
    e.packets = old.packets;
    e.bytes_lo = old.bytes_lo;
    let c = Cold {
        timeout: old.timeout,
        bytes_hi: old.bytes_hi,
        ..Cold::FREE
    };
    (e, old.proto, c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Endpoint, FlowKey, L4Proto};
    use crate::persist::{Opened, StateIdentity};
    use crate::slab::{FLAG_LIVE, NIL};
    use crate::state::{tcp_flags, Direction};
    use crate::table::{FlowTable, NewFlow, Packet};
    use crate::Timeouts;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// Layout 2's signatures, as its build pinned them: this module's
    /// copy of its entry is the entry layout 2 had.
    #[test]
    fn the_copy_of_layout_2_is_layout_2() {
        assert_eq!(
            (
                std::mem::size_of::<EntryV2<Ipv4Addr>>(),
                signature::<Ipv4Addr>(),
                std::mem::size_of::<EntryV2<Ipv6Addr>>(),
                signature::<Ipv6Addr>()
            ),
            (
                88,
                3_357_201_085_506_562_853,
                136,
                9_261_486_008_361_045_509
            )
        );
    }

    const ID: StateIdentity = StateIdentity {
        worker: 1,
        workers: 2,
        snat: 9,
    };

    fn ep<A: Address>(a: A, port: u16) -> Endpoint<A> {
        Endpoint { addr: a, port }
    }

    /// What adoption must give back of a flow: everything but the links.
    type Seen<A> = (
        FlowKey<A>,
        u8,
        [u32; 2],
        [u64; 2],
        u32,
        u32,
        [u8; 6],
        u8,
        bool,
    );

    fn seen<A: FlatAddress>(t: &FlowTable<A>) -> Vec<Seen<A>> {
        let mut v: Vec<Seen<A>> = t
            .iter()
            .map(|f| {
                (
                    f.key(Direction::Original),
                    f.state() as u8,
                    f.packets(),
                    f.bytes(),
                    f.last_seen(),
                    f.deadline(),
                    f.client_mac(),
                    f.plan(),
                    f.is_one_way(),
                )
            })
            .collect();
        v.sort_by_key(|s| format!("{s:?}"));
        v
    }

    /// Layout 2's file of what `t` holds: its header page with layout 2's
    /// version and signature, then every slot as layout 2's entry.
    fn as_v2<A: FlatAddress>(t: &mut FlowTable<A>) -> Vec<u8> {
        let mut out = t.slab.entries.header().unwrap().to_vec();
        out[8..16].copy_from_slice(&FROM.to_le_bytes());
        out[16..24].copy_from_slice(&signature::<A>().to_le_bytes());
        for (e, c) in t.slab.entries.iter().zip(t.slab.cold.iter()) {
            let old = EntryV2::<A> {
                addrs: e.addrs,
                ports: e.ports,
                wheel_slot: e.wheel_slot,
                proto: e.proto as u8,
                state: e.state,
                flags: e.flags,
                plan: e.plan,
                client_mac: e.client_mac,
                bytes_hi: c.bytes_hi,
                service: e.service,
                backend_id: e.backend_id,
                last_seen: e.last_seen,
                timeout: c.timeout,
                packets: e.packets,
                bytes_lo: e.bytes_lo,
                links: [[7, NIL]; 2],
            };
            let size = std::mem::size_of::<EntryV2<A>>();
            // SAFETY: layout 2's entry has no padding (88 and 136 bytes
            // of fields, `the_copy_of_layout_2_is_layout_2`), so all of
            // its bytes are initialised.
            let bytes = unsafe {
                std::slice::from_raw_parts((&old as *const EntryV2<A>).cast::<u8>(), size)
            };
            out.extend_from_slice(bytes);
        }
        out
    }

    /// A table of layout 2's file is migrated and adopted whole: every
    /// flow, template and one-way flow with its state, counters (past
    /// 4 GiB), clock, deadline, MAC and plan; what was not live stays
    /// free, an entry with an unknown protocol is dropped, and the file is
    /// this layout's afterwards (adopted as kept the next time).
    fn migrates_whole<A: FlatAddress>(addr: impl Fn(u8) -> A, name: &str) {
        let path =
            std::env::temp_dir().join(format!("xvs-migrate-{name}-{}.flows", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let (capacity, timeouts) = (100, Timeouts::default());
        let (mut t, opened) =
            FlowTable::<A>::open_state(&path, ID, capacity, timeouts, 50).unwrap();
        assert!(matches!(opened, Opened::Fresh(_)));
        t.adopt(50, |_| Some((0, 0)), &mut ());
        for n in 0..12u8 {
            let new = NewFlow {
                client: ep(addr(10 + n), 40_000 + u16::from(n)),
                vip: ep(addr(1), 80),
                backend: ep(addr(100 + n % 3), 8080),
                snat: ep(addr(200), 2000 + u16::from(n)),
                proto: if n % 4 == 3 {
                    L4Proto::Udp
                } else {
                    L4Proto::Tcp
                },
                service: 3,
                backend_id: u32::from(n % 3),
                client_mac: [2, 0, 0, 0, 0, n],
                plan: n % 2,
                one_way: n == 5,
            };
            let syn = Packet {
                tcp_flags: tcp_flags::SYN,
                len: 60,
            };
            let id = t.insert(&new, syn, 50 + u32::from(n), &mut ()).unwrap();
            if n % 2 == 0 {
                let ack = Packet {
                    tcp_flags: tcp_flags::ACK,
                    len: u32::MAX,
                };
                t.on_packet(id, Direction::Original, ack, 70, &mut ());
                t.on_packet(id, Direction::Original, ack, 71, &mut ());
            }
        }
        let key = FlowTable::<A>::template_key(addr(0), ep(addr(1), 80), L4Proto::Tcp);
        t.template_set(&key, 3, 1, ep(addr(101), 8080), 600, 72, &mut ())
            .unwrap();
        let before = seen(&t);
        assert_eq!(before.len(), 13);
        let mut file = as_v2(&mut t);
        drop(t);
        // Slot 40, free, holds a live entry of an unknown protocol.
        let size = std::mem::size_of::<EntryV2<A>>();
        let at = HEADER + 40 * size;
        file[at + std::mem::offset_of!(EntryV2<A>, proto)] = 0x7f;
        file[at + std::mem::offset_of!(EntryV2<A>, flags)] = FLAG_LIVE;
        assert_eq!(file.len() as u64, bytes::<A>(capacity));
        std::fs::write(&path, &file).unwrap();

        let (mut t, opened) =
            FlowTable::<A>::open_state(&path, ID, capacity, timeouts, 80).unwrap();
        assert_eq!(opened, Opened::Migrated { from: 2 });
        let adopted = t.adopt(80, |_| Some((4, 5)), &mut ());
        assert_eq!(
            (adopted.flows, adopted.templates, adopted.dropped),
            (12, 1, 1)
        );
        t.check_invariants().unwrap();
        assert_eq!(seen(&t), before);
        assert!(t.iter().all(|f| (f.service(), f.backend_id()) == (4, 5)));
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".migrating");
        assert!(!std::path::Path::new(&tmp).exists());
        drop(t);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            Region::<Entry<A>>::pair_bytes::<Cold>(capacity as usize)
        );
        let (mut t, opened) =
            FlowTable::<A>::open_state(&path, ID, capacity, timeouts, 81).unwrap();
        assert_eq!(opened, Opened::Kept);
        t.adopt(81, |_| Some((4, 5)), &mut ());
        assert_eq!(seen(&t), before);
        drop(t);

        // Layout 2's file of another identity is not migrated: it starts
        // empty, saying why.
        std::fs::write(&path, &file).unwrap();
        let other = StateIdentity { workers: 3, ..ID };
        let (t, opened) = FlowTable::<A>::open_state(&path, other, capacity, timeouts, 82).unwrap();
        assert!(matches!(opened, Opened::Fresh(_)), "{opened:?}");
        assert!(t.is_empty());
        drop(t);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_layout_2_file_is_migrated_and_adopted_whole() {
        migrates_whole(|n| Ipv4Addr::new(198, 18, 0, n), "v4");
        migrates_whole(
            |n| Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, u16::from(n)),
            "v6",
        );
    }
}
