//! A flow table that outlives its process: the entries in a state file
//! (mapped shared, see `region`), a header that says whether a new process
//! may adopt them, and adoption, which rebuilds everything derived from
//! the entries.
//!
//! Only the entries and their cold parts are kept (the cold parts' list
//! links are kept with them and ignored). The index (keyed with a hasher
//! seeded per process), the free list, the timer wheel lists, the age list
//! and the gauges are rebuilt from them at adoption, in one pass: what a
//! process killed in the middle of an update leaves (a half-linked entry, a
//! stale list head) cannot survive into the next one. An entry is adopted
//! when it is sane (a known protocol), its keys are not taken by an entry
//! adopted before it, and the caller still has its service and backend
//! (resolved by identity, the VIP and backend address and port, not by the
//! ids the old process gave them); every other slot is freed.
//!
//! Invariants: a file is adopted only when its header matches this build
//! and this configuration exactly ([`LAYOUT_VERSION`] and the entry layout
//! signature, capacity, address family, worker index and count, SNAT
//! identity, boot, [`IDENTITY_SCHEME`]), or when it is of the layout
//! before this one and matches in everything else (it is then rewritten
//! in this layout first: `migrate`); otherwise it is reset and the
//! reason returned. Time in the entries is seconds of CLOCK_MONOTONIC, the
//! same in every process of one boot, so deadlines carry over unchanged.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use xvs_config::Address;

use crate::key::{FlowKey, L4Proto};
use crate::migrate;
use crate::region::{Region, HEADER};
use crate::slab::{Cold, Entry, Regions, Slab, FLAG_AGED, FLAG_LIVE, FLAG_TEMPLATE, NIL};
use crate::state::Direction;
use crate::table::{FlowRef, FlowTable, Observer, DIR_BIT};
use crate::Timeouts;

/// Version of the state file layout: bump it whenever `Entry`, `Cold`,
/// the file's arrangement (`region`) or the header changes (`layout_signature_is_pinned` fails until it is).
pub const LAYOUT_VERSION: u32 = 3;

const MAGIC: [u8; 8] = *b"XVSFLOWS";

/// Version of how an adopted entry is matched to this process's services
/// and backends (today: the VIP, protocol and port name the service, the
/// address and port the backend). Bump it when that changes.
pub const IDENTITY_SCHEME: u32 = 1;

/// Address types whose every bit pattern is a valid value, so entries read
/// back from a file are sound to use: the two families' own types.
pub trait FlatAddress: Address {}
impl FlatAddress for Ipv4Addr {}
impl FlatAddress for Ipv6Addr {}

/// What a state file must agree on with the process that opens it, beyond
/// the build: the worker it belongs to and how SNAT ports were divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateIdentity {
    /// This worker's index.
    pub worker: u32,
    /// Workers of the instance.
    pub workers: u32,
    /// A digest of the SNAT addresses and this worker's port slice (a
    /// flow's SNAT port must stay in the slice of the worker that has it).
    pub snat: u64,
}

/// The header page's fields (little-endian u64 words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    layout: u64,
    signature: u64,
    capacity: u64,
    family: u64,
    worker: u64,
    workers: u64,
    snat: u64,
    boot: u64,
    identity: u64,
}

impl Header {
    const FIELDS: [&'static str; 9] = [
        "layout version",
        "entry layout",
        "capacity",
        "address family",
        "worker",
        "workers",
        "SNAT addresses or port slice",
        "boot",
        "service identity scheme",
    ];

    fn words(&self) -> [u64; 9] {
        [
            self.layout,
            self.signature,
            self.capacity,
            self.family,
            self.worker,
            self.workers,
            self.snat,
            self.boot,
            self.identity,
        ]
    }

    fn read(page: &[u8; HEADER]) -> Option<Header> {
        if page[..8] != MAGIC {
            return None;
        }
        let w = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&page[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(b)
        };
        Some(Header {
            layout: w(0),
            signature: w(1),
            capacity: w(2),
            family: w(3),
            worker: w(4),
            workers: w(5),
            snat: w(6),
            boot: w(7),
            identity: w(8),
        })
    }

    fn write(&self, page: &mut [u8; HEADER]) {
        page.fill(0);
        page[..8].copy_from_slice(&MAGIC);
        for (i, v) in self.words().iter().enumerate() {
            page[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
    }

    /// Why a file with header `self` cannot be adopted by `want`.
    fn mismatch(&self, want: &Header) -> Option<String> {
        let (a, b) = (self.words(), want.words());
        (0..a.len()).find(|&i| a[i] != b[i]).map(|i| {
            format!(
                "{} changed (state file {}, now {})",
                Header::FIELDS[i],
                a[i],
                b[i]
            )
        })
    }
}

/// A digest of the entry layout: its size and every field's offset, for
/// family `A`, and the same of its cold part. Part of the header, so a
/// layout change a version bump forgot is still caught.
pub fn layout_signature<A: Address>() -> u64 {
    let parts = [
        std::mem::size_of::<Entry<A>>(),
        std::mem::offset_of!(Entry<A>, addrs),
        std::mem::offset_of!(Entry<A>, ports),
        std::mem::offset_of!(Entry<A>, wheel_slot),
        std::mem::offset_of!(Entry<A>, proto),
        std::mem::offset_of!(Entry<A>, state),
        std::mem::offset_of!(Entry<A>, flags),
        std::mem::offset_of!(Entry<A>, plan),
        std::mem::offset_of!(Entry<A>, service),
        std::mem::offset_of!(Entry<A>, backend_id),
        std::mem::offset_of!(Entry<A>, last_seen),
        std::mem::offset_of!(Entry<A>, client_mac),
        std::mem::offset_of!(Entry<A>, bytes_lo),
        std::mem::offset_of!(Entry<A>, packets),
        std::mem::size_of::<Cold>(),
        std::mem::offset_of!(Cold, timeout),
        std::mem::offset_of!(Cold, bytes_hi),
        std::mem::offset_of!(Cold, links),
    ];
    digest(parts.iter().map(|&p| p as u64))
}

/// FNV-1a over `words`: a digest that is the same across builds,
/// processes and platforms (what a state header compares), unlike the
/// seeded hashers the tables use.
pub fn digest(words: impl IntoIterator<Item = u64>) -> u64 {
    words.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ w).wrapping_mul(0x100_0000_01b3)
    })
}

/// A digest of this boot (`/proc/sys/kernel/random/boot_id`): monotonic
/// time starts again at a reboot.
fn boot_digest() -> u64 {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    digest(id.trim().bytes().map(u64::from))
}

/// How a state file was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Its entries were kept: adopt them ([`FlowTable::adopt`]).
    Kept,
    /// It was of the layout version `from`, and its entries were
    /// rewritten in this build's layout and kept: adopt them.
    Migrated {
        /// The file's layout version before.
        from: u32,
    },
    /// It was (re)initialised empty, for this reason.
    Fresh(String),
}

/// What adoption found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Flows adopted.
    pub flows: u32,
    /// Persistence templates adopted.
    pub templates: u32,
    /// Entries dropped: insane, duplicate, or of a service or backend the
    /// process does not have.
    pub dropped: u32,
}

impl<A: FlatAddress> FlowTable<A> {
    /// A table whose entries live in the state file `path` (created when
    /// missing; reset, with the reason, when it cannot be adopted). When
    /// kept, call [`FlowTable::adopt`] before anything else.
    pub fn open_state(
        path: &Path,
        identity: StateIdentity,
        capacity: u32,
        timeouts: Timeouts,
        now: u32,
    ) -> std::io::Result<(FlowTable<A>, Opened)> {
        let capacity = capacity.min(crate::MAX_CAPACITY);
        let want = Header {
            layout: u64::from(LAYOUT_VERSION),
            signature: layout_signature::<A>(),
            capacity: u64::from(capacity),
            family: A::LEN as u64,
            worker: u64::from(identity.worker),
            workers: u64::from(identity.workers),
            snat: identity.snat,
            boot: boot_digest(),
            identity: u64::from(IDENTITY_SCHEME),
        };
        let (mut region, cold, verdict) = match migrate_v2::<A>(path, capacity, &want)? {
            Some((region, cold)) => (
                region,
                cold,
                Opened::Migrated {
                    from: migrate::FROM as u32,
                },
            ),
            None => {
                let (mut region, cold, had) =
                    Region::<Entry<A>>::file_pair::<Cold>(path, capacity as usize)?;
                let bytes = Region::<Entry<A>>::pair_bytes::<Cold>(capacity as usize);
                let header = region.header().map(|h| Header::read(h));
                let verdict = match header {
                    _ if had == 0 => Opened::Fresh("no state file".into()),
                    _ if had != bytes => Opened::Fresh(format!(
                        "capacity or entry size changed (state file {had} bytes, now {bytes})"
                    )),
                    Some(Some(h)) => match h.mismatch(&want) {
                        None => Opened::Kept,
                        Some(why) => Opened::Fresh(why),
                    },
                    _ => Opened::Fresh("no state header".into()),
                };
                (region, cold, verdict)
            }
        };
        let mut insane = 0;
        let slab = match verdict {
            Opened::Kept | Opened::Migrated { .. } => {
                for i in 0..capacity as usize {
                    insane += u32::from(!sanitise(region.raw(i)));
                }
                Slab {
                    entries: region,
                    cold,
                    free: NIL,
                    live: 0,
                    released: 0,
                }
            }
            Opened::Fresh(_) => {
                if let Some(h) = region.header() {
                    // Written before the entries: a file whose header is
                    // valid but whose entries are half reset is reset
                    // again (its size or header then say so).
                    want.write(h);
                }
                Slab::over(region, cold)
            }
        };
        let mut table = FlowTable::with_slab(slab, timeouts, now);
        table.pending = (!matches!(verdict, Opened::Fresh(_))).then_some(insane);
        Ok((table, verdict))
    }
}

/// The regions of `path` migrated to this layout, if it is a layout-2
/// file that `want` would have adopted but for its layout (see
/// `migrate`); `None` for any other file.
fn migrate_v2<A: FlatAddress>(
    path: &Path,
    capacity: u32,
    want: &Header,
) -> std::io::Result<Option<Regions<A>>> {
    use std::os::unix::fs::FileExt;
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    if len != migrate::bytes::<A>(capacity) {
        return Ok(None);
    }
    let mut page = [0u8; HEADER];
    std::fs::File::open(path)?.read_exact_at(&mut page, 0)?;
    let old = Header {
        layout: migrate::FROM,
        signature: migrate::signature::<A>(),
        ..*want
    };
    if Header::read(&page) != Some(old) {
        return Ok(None);
    }
    want.write(&mut page);
    migrate::from_v2::<A>(path, capacity, &page).map(Some)
}

/// Resets a slot that does not hold a sane entry to a free one (false).
/// Reads only bytes before the entry is used as one: `proto` is the one
/// field with invalid bit patterns.
fn sanitise<A: Address>(raw: *mut Entry<A>) -> bool {
    // SAFETY: `raw` points at an entry-sized, aligned slot of the mapping;
    // the byte read is within it.
    let proto = unsafe { *raw.cast::<u8>().add(std::mem::offset_of!(Entry<A>, proto)) };
    let known = [L4Proto::Icmp as u8, L4Proto::Tcp as u8, L4Proto::Udp as u8].contains(&proto);
    if !known {
        // SAFETY: as above; writes a whole valid entry over the slot.
        unsafe { raw.write(Entry::FREE) };
    }
    known
}

impl<A: Address> FlowTable<A> {
    /// Adopts the entries of a kept state file: resolves each entry's
    /// service and backend with `resolve` (`None` drops it), reports every
    /// adopted flow's connection to `obs`, and rebuilds the index, lists
    /// and gauges; expired entries leave at the next advance. A table that
    /// is not pending adoption is left as it is.
    pub fn adopt(
        &mut self,
        now: u32,
        mut resolve: impl FnMut(FlowRef<'_, A>) -> Option<(u32, u32)>,
        obs: &mut impl Observer<A>,
    ) -> Adopted {
        let mut out = Adopted::default();
        let Some(insane) = self.pending.take() else {
            return out;
        };
        out.dropped = insane;
        self.reset_derived(now);
        let capacity = self.slab.entries.len() as u32;
        let mut aged: Vec<(u32, u32)> = Vec::new();
        // Backwards, so the free list comes out in slot order.
        for slot in (0..capacity).rev() {
            let e = self.slab.entries[slot as usize];
            let keep = e.flags & FLAG_LIVE != 0
                && resolve(FlowRef(&e, &self.slab.cold[slot as usize])).is_some_and(
                    |(service, backend)| {
                        let entry = &mut self.slab.entries[slot as usize];
                        entry.service = service;
                        entry.backend_id = backend;
                        self.adopt_keys(slot)
                    },
                );
            if !keep {
                if e.flags & FLAG_LIVE != 0 {
                    out.dropped += 1;
                }
                self.slab.release_unlinked(slot);
                continue;
            }
            self.slab.cold[slot as usize].links = [[NIL; 2]; 2];
            let e = &mut self.slab.entries[slot as usize];
            e.flags &= !FLAG_AGED;
            let e = *e;
            self.slab.live += 1;
            let state = e.state();
            self.states[state.index()] += 1;
            self.snat.add(&e, 1);
            if e.flags & FLAG_TEMPLATE != 0 {
                out.templates += 1;
            } else {
                out.flows += 1;
                if state.is_active() {
                    obs.conn_counts(e.service, e.backend_id, 1, 0);
                } else {
                    obs.conn_counts(e.service, e.backend_id, 0, 1);
                    aged.push((e.last_seen, slot));
                }
            }
            self.file(slot);
        }
        // Early drop takes the longest non-ESTABLISHED first: oldest last
        // packet first is the nearest order the entries still tell.
        aged.sort_unstable();
        for (_, slot) in aged {
            self.age_add(slot);
        }
        self.stats.adopt += u64::from(out.flows + out.templates);
        self.stats.adopt_dropped += u64::from(out.dropped);
        out
    }

    /// Indexes an adopted entry's keys (one for a template or a one-way
    /// flow, both for a flow); false, indexing nothing, if one is already
    /// taken.
    fn adopt_keys(&mut self, slot: u32) -> bool {
        let e = self.slab.entries[slot as usize];
        let template = e.flags & FLAG_TEMPLATE != 0;
        let mut keys: [(FlowKey<A>, u32); 2] = [(e.key(Direction::Original), slot); 2];
        let n = if e.has_one_key() {
            1
        } else {
            keys[1] = (e.key(Direction::Reply), slot | DIR_BIT);
            if keys[0].0 == keys[1].0 {
                return false;
            }
            2
        };
        if keys[..n].iter().any(|(k, _)| self.indexed(k, template)) {
            return false;
        }
        for &(k, v) in &keys[..n] {
            let h = self.hash(&k);
            self.index_insert(h, v);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry layout is pinned to the state file's layout version: a
    /// change to [`Entry`] or [`Cold`] fails here until [`LAYOUT_VERSION`] is bumped
    /// and the new signatures are written down.
    #[test]
    fn layout_signature_is_pinned() {
        assert_eq!(
            (
                LAYOUT_VERSION,
                std::mem::size_of::<Entry<Ipv4Addr>>(),
                layout_signature::<Ipv4Addr>(),
                std::mem::size_of::<Entry<Ipv6Addr>>(),
                layout_signature::<Ipv6Addr>()
            ),
            (
                3,
                64,
                11_490_108_099_567_468_775,
                128,
                7_277_026_578_654_797_895
            ),
            "the flow entry layout changed: bump LAYOUT_VERSION and update this test"
        );
    }
}
