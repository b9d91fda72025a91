//! The per-worker flow table: one entry per flow in a preallocated slab,
//! indexed by both directions' 5-tuples in one index of cache-line
//! buckets ([`crate::index`]), expired by a timer wheel, evicted
//! oldest-non-ESTABLISHED-first when full.
//!
//! Sans-IO: every call that depends on time takes `now` (seconds on a
//! monotonic clock the caller owns). Nothing allocates after construction:
//! the slab is full-size from the start and the index is sized for two keys
//! per entry (it never grows nor rehashes).
//!
//! Invariants: every live flow has exactly two index entries (original and
//! reply key) and every live template one; every live entry is filed on
//! exactly one wheel list; a live entry's deadline (`last_seen + timeout`)
//! is never earlier than the wheel time it is filed under, so the wheel
//! only ever finds entries late, never misses one. The wheel files entries
//! lazily: a packet only refreshes `last_seen`; the sweep re-files an entry
//! whose deadline moved. A state change re-files at once (timeouts may
//! shrink).
//!
//! Early drop takes the entry that has been non-ESTABLISHED the longest
//! (FIFO by the time it entered a non-ESTABLISHED state); templates are
//! never early-dropped.

use std::hash::BuildHasher;

use crate::fresh::Fresh;
use crate::index::Index;
use std::net::Ipv4Addr;

use xvs_config::Address;

use crate::key::{Endpoint, FlowKey, L4Proto};
use crate::slab::{
    bytes_of, Cold, Entry, ListHead, Slab, AGE, FLAG_AGED, FLAG_ONE_WAY, FLAG_PEER, FLAG_QUIESCED,
    FLAG_TEMPLATE, NIL, WHEEL,
};
use crate::state::{tcp_next, Direction, FlowState};
use crate::stats::{Removal, Stats};
use crate::Timeouts;

/// Wheel slots: one per second; a power of two above the longest default
/// timeout (900 s), so most entries are swept once.
pub(crate) const WHEEL_SLOTS: usize = 1024;
/// Expired entries removed together ([`FlowTable::advance`]).
const EXPIRE_RUN: usize = 16;
pub(crate) const DIR_BIT: u32 = 1 << 31;
/// Largest capacity (slot numbers and the direction bit share a u32).
pub const MAX_CAPACITY: u32 = (1 << 31) - 1;

/// A live entry of a table. Valid until the entry is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowId(pub(crate) u32);

/// What a new flow is: its four ends and who scheduled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewFlow<A: Address = Ipv4Addr> {
    /// Client (original source).
    pub client: Endpoint<A>,
    /// VIP and port (original destination).
    pub vip: Endpoint<A>,
    /// Backend (reply source).
    pub backend: Endpoint<A>,
    /// SNAT address and port (reply destination).
    pub snat: Endpoint<A>,
    /// Protocol.
    pub proto: L4Proto,
    /// Service id.
    pub service: u32,
    /// Backend id.
    pub backend_id: u32,
    /// Ethernet address the client's first packet came from.
    pub client_mac: [u8; 6],
    /// How the caller forwards the flow's packets (a tag the table keeps
    /// and returns, [`FlowRef::plan`]).
    pub plan: u8,
    /// Whether only the client's direction passes the gateway (direct
    /// routing, tunnels: the backend answers the client itself). Such a
    /// flow indexes only its original key, and TCP is driven by the
    /// client's segments alone (IPVS's INPUT-ONLY table, as for
    /// `IP_VS_CONN_F_NOOUTPUT`); `backend` and `snat` are kept for
    /// listings.
    pub one_way: bool,
}

/// What a packet contributes to its flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Packet {
    /// TCP flags byte (ignored for UDP and ICMP).
    pub tcp_flags: u8,
    /// Bytes (L3 length).
    pub len: u32,
}

/// Why a new flow was not inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// Full, and no non-ESTABLISHED entry to early-drop.
    TableFull,
    /// Its original or reply key is already tracked.
    Exists,
}

/// Receives what the table does to connections, so schedulers keep
/// per-backend counts and the data plane can emit flow events. Every
/// method has a no-op default; `()` observes nothing.
pub trait Observer<A: Address = Ipv4Addr> {
    /// A backend gained or lost active (ESTABLISHED) / inactive flows.
    fn conn_counts(&mut self, _service: u32, _backend_id: u32, _d_active: i32, _d_inactive: i32) {}
    /// An entry is about to leave the table.
    fn removed(&mut self, _flow: FlowRef<'_, A>, _why: Removal) {}
}

impl<A: Address> Observer<A> for () {}

impl<A: Address> Slab<A> {
    /// Read access to the entry in `slot` and its cold part.
    #[inline(always)]
    pub(crate) fn flow(&self, slot: u32) -> FlowRef<'_, A> {
        let i = slot as usize;
        FlowRef(&self.entries[i], &self.cold[i])
    }
}

/// Read access to one live entry (and its cold part).
#[derive(Debug, Clone, Copy)]
pub struct FlowRef<'a, A: Address = Ipv4Addr>(pub(crate) &'a Entry<A>, pub(crate) &'a Cold);

impl<A: Address> FlowRef<'_, A> {
    /// Client end.
    pub fn client(&self) -> Endpoint<A> {
        self.0.client()
    }
    /// VIP end.
    pub fn vip(&self) -> Endpoint<A> {
        self.0.vip()
    }
    /// Backend end.
    pub fn backend(&self) -> Endpoint<A> {
        self.0.backend()
    }
    /// SNAT end.
    pub fn snat(&self) -> Endpoint<A> {
        self.0.snat()
    }
    /// Protocol.
    pub fn proto(&self) -> L4Proto {
        self.0.proto
    }
    /// State.
    pub fn state(&self) -> FlowState {
        self.0.state()
    }
    /// Service id.
    pub fn service(&self) -> u32 {
        self.0.service
    }
    /// Backend id.
    pub fn backend_id(&self) -> u32 {
        self.0.backend_id
    }
    /// Packets `[original, reply]`.
    pub fn packets(&self) -> [u32; 2] {
        self.0.packets
    }
    /// Bytes `[original, reply]`.
    pub fn bytes(&self) -> [u64; 2] {
        bytes_of(self.0, self.1)
    }
    /// Time of the last packet.
    pub fn last_seen(&self) -> u32 {
        self.0.last_seen
    }
    /// Seconds the entry lives without packets, in its current state
    /// (or as shortened under pressure).
    pub fn timeout(&self) -> u32 {
        self.1.timeout
    }
    /// Time at which the entry expires unless a packet comes.
    pub fn deadline(&self) -> u32 {
        self.0.last_seen.saturating_add(self.1.timeout)
    }
    /// Whether this is a persistence template.
    pub fn is_template(&self) -> bool {
        self.0.is_template()
    }
    /// Ethernet address the client's packets come from.
    pub fn client_mac(&self) -> [u8; 6] {
        self.0.client_mac
    }
    /// The forwarding plan tag it was created with ([`NewFlow::plan`]).
    pub fn plan(&self) -> u8 {
        self.0.plan
    }
    /// Whether it is a one-way flow ([`NewFlow::one_way`]).
    pub fn is_one_way(&self) -> bool {
        self.0.flags & FLAG_ONE_WAY != 0
    }
    /// Whether its backend was quiesced while it lived.
    pub fn is_quiesced(&self) -> bool {
        self.0.flags & FLAG_QUIESCED != 0
    }
    /// Whether it was installed from another gateway's sync record.
    pub fn is_peer(&self) -> bool {
        self.0.flags & FLAG_PEER != 0
    }
    /// The key of `dir`.
    pub fn key(&self, dir: Direction) -> FlowKey<A> {
        self.0.key(dir)
    }
}

/// Progress of [`FlowTable::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    /// Entries expired by this call.
    pub expired: u32,
    /// Whether the wheel caught up with `now` (else call again).
    pub done: bool,
}

#[derive(Debug, Clone, Copy)]
struct Sweep {
    slot: u16,
    /// Last entry of the slot that belongs to this sweep.
    stop: u32,
}

/// The flow table of one worker.
pub struct FlowTable<A: Address = Ipv4Addr> {
    pub(crate) slab: Slab<A>,
    pub(crate) index: Index,
    hasher: foldhash::fast::RandomState,
    pub(crate) wheel: Box<[ListHead]>,
    sweep: Option<Sweep>,
    /// The last wheel second processed.
    pub(crate) cursor: u32,
    pub(crate) age: ListHead,
    pub(crate) timeouts: Timeouts,
    pub(crate) stats: Stats,
    pub(crate) states: [u32; FlowState::COUNT],
    /// Entries read back from a state file wait for `adopt` (with the
    /// number of insane slots already reset).
    pub(crate) pending: Option<u32>,
    /// Live flows per SNAT address, for the addresses given to
    /// [`FlowTable::count_snat`] (kept at every insert and removal).
    pub(crate) snat: SnatTally<A>,
    /// The hashes inserted since the last batch lookup.
    pub(crate) fresh: Fresh,
}

/// Live flows (not templates) whose SNAT end is each of a few addresses.
#[derive(Debug, Clone)]
pub(crate) struct SnatTally<A> {
    pub(crate) addrs: Vec<A>,
    pub(crate) live: Vec<u32>,
}

impl<A: Address> SnatTally<A> {
    /// Counts `e` (a flow entering, `+1`, or leaving, `-1`).
    #[inline]
    pub(crate) fn add(&mut self, e: &crate::slab::Entry<A>, d: i32) {
        if e.is_template() {
            return;
        }
        let addr = e.snat().addr;
        if let Some(i) = self.addrs.iter().position(|a| *a == addr) {
            self.live[i] = self.live[i].wrapping_add_signed(d);
        }
    }
}

impl<A: Address> FlowTable<A> {
    /// A table for `capacity` entries (flows and templates), at time `now`.
    pub fn new(capacity: u32, timeouts: Timeouts, now: u32) -> FlowTable<A> {
        FlowTable::with_slab(Slab::new(capacity.min(MAX_CAPACITY)), timeouts, now)
    }

    /// A table over `slab` (its entries all free, or pending adoption).
    pub(crate) fn with_slab(slab: Slab<A>, timeouts: Timeouts, now: u32) -> FlowTable<A> {
        let capacity = slab.capacity();
        FlowTable {
            slab,
            index: Index::with_capacity(2 * capacity as usize),
            hasher: foldhash::fast::RandomState::default(),
            wheel: vec![ListHead::EMPTY; WHEEL_SLOTS].into_boxed_slice(),
            sweep: None,
            cursor: now,
            age: ListHead::EMPTY,
            timeouts,
            stats: Stats::default(),
            states: [0; FlowState::COUNT],
            pending: None,
            snat: SnatTally {
                addrs: Vec::new(),
                live: Vec::new(),
            },
            fresh: Fresh::default(),
        }
    }

    /// Counts live flows per SNAT address for `addrs` from now on (the
    /// live ones counted at once; entries waiting for adoption are counted
    /// when adopted): [`FlowTable::snat_flows`].
    pub fn count_snat(&mut self, addrs: &[A]) {
        self.snat = SnatTally {
            addrs: addrs.to_vec(),
            live: vec![0; addrs.len()],
        };
        if self.pending.is_some() {
            return;
        }
        for i in 0..self.slab.capacity() {
            let e = self.slab.entries[i as usize];
            if e.is_live() {
                self.snat.add(&e, 1);
            }
        }
    }

    /// Live flows per SNAT address, in the order given to
    /// [`FlowTable::count_snat`].
    pub fn snat_flows(&self) -> &[u32] {
        &self.snat.live
    }

    /// Empties everything derived from the entries (index, lists,
    /// gauges) and sets the wheel to `now`, for adoption to rebuild.
    pub(crate) fn reset_derived(&mut self, now: u32) {
        self.index.clear();
        self.wheel.fill(ListHead::EMPTY);
        self.sweep = None;
        self.cursor = now;
        self.age = ListHead::EMPTY;
        self.states = [0; FlowState::COUNT];
        self.slab.free = NIL;
        self.slab.live = 0;
    }

    /// Whether `key` is indexed, as a template's key or a flow's.
    pub(crate) fn indexed(&self, key: &FlowKey<A>, template: bool) -> bool {
        let entries = &self.slab.entries;
        self.index
            .find(self.hash(key), |v| {
                let e = &entries[(v & !DIR_BIT) as usize];
                e.is_template() == template && e.key(dir_of(v)) == *key
            })
            .is_some()
    }

    /// Entries the table holds.
    pub fn capacity(&self) -> u32 {
        self.slab.capacity()
    }

    /// Live entries (flows and templates).
    pub fn len(&self) -> u32 {
        self.slab.live()
    }

    /// Whether the table holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Event counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Live entries per state (index by [`FlowState::index`]).
    pub fn states(&self) -> [u32; FlowState::COUNT] {
        self.states
    }

    /// Heap bytes a table of `capacity` entries takes (what
    /// [`FlowTable::memory_bytes`] will say once it is built), without
    /// building it: the slab (`capacity` entries of 64 bytes for IPv4,
    /// 128 for IPv6, and their 24-byte cold parts), the index for two
    /// keys per entry (about 14 bytes per entry, `Index`), and the
    /// wheel. To refuse a capacity the host cannot hold before
    /// allocating anything.
    pub fn footprint(capacity: u32) -> u64 {
        let capacity = u64::from(capacity.min(MAX_CAPACITY));
        capacity * (std::mem::size_of::<Entry<A>>() + std::mem::size_of::<Cold>()) as u64
            + Index::bytes_for(2 * capacity as usize)
            + (WHEEL_SLOTS * std::mem::size_of::<ListHead>()) as u64
    }

    /// Heap bytes the table holds (slab, index, wheel): its whole
    /// footprint, whatever the number of live entries.
    pub fn memory_bytes(&self) -> usize {
        self.slab.entries.len() * (std::mem::size_of::<Entry<A>>() + std::mem::size_of::<Cold>())
            + self.index.allocation_size()
            + self.wheel.len() * std::mem::size_of::<ListHead>()
    }

    /// The timeouts in force.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Replaces the timeouts; live flows take the new value at their next
    /// state change.
    pub fn set_timeouts(&mut self, timeouts: Timeouts) {
        self.timeouts = timeouts;
    }

    /// Counts a packet the caller could not track.
    pub fn count_invalid(&mut self) {
        self.stats.invalid += 1;
    }

    #[inline(always)]
    pub(crate) fn hash(&self, key: &FlowKey<A>) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The index hash of `key`, for [`FlowTable::prefetch_hash`].
    #[inline]
    pub fn key_hash(&self, key: &FlowKey<A>) -> u64 {
        self.hash(key)
    }

    /// Brings in the index bucket where a key with `hash` is looked up or
    /// inserted, ahead of that (nothing is read).
    #[inline]
    pub fn prefetch_hash(&self, hash: u64) {
        self.index.prefetch(hash);
    }

    /// The flow a packet with `key` belongs to, and its direction.
    #[inline(always)]
    pub fn lookup(&mut self, key: &FlowKey<A>) -> Option<(FlowId, Direction)> {
        self.lookup_hashed(key, self.hash(key))
    }

    /// [`FlowTable::lookup`] with the key's hash ([`FlowTable::key_hash`])
    /// computed by the caller, who keeps it for [`FlowTable::insert_new`].
    #[inline(always)]
    pub fn lookup_hashed(&mut self, key: &FlowKey<A>, hash: u64) -> Option<(FlowId, Direction)> {
        debug_assert_eq!(hash, self.hash(key));
        let hit = self.find(key, hash);
        match hit {
            Some(_) => self.stats.found += 1,
            None => self.stats.miss += 1,
        }
        hit
    }

    /// [`FlowTable::lookup`] without counting it (a listing's or a
    /// delete's, not a packet's).
    pub(crate) fn peek(&self, key: &FlowKey<A>) -> Option<(FlowId, Direction)> {
        self.find(key, self.hash(key))
    }

    #[inline(always)]
    fn find(&self, key: &FlowKey<A>, hash: u64) -> Option<(FlowId, Direction)> {
        let entries = &self.slab.entries;
        let v = self.index.find(hash, |v| {
            let e = &entries[(v & !DIR_BIT) as usize];
            !e.is_template() && e.key(dir_of(v)) == *key
        })?;
        Some((FlowId(v & !DIR_BIT), dir_of(v)))
    }

    /// Whether `id` is a live flow whose `dir` key is still `key` (a
    /// lookup result may be stale once the table has changed).
    pub fn holds(&self, id: FlowId, dir: Direction, key: &FlowKey<A>) -> bool {
        self.slab
            .entries
            .get(id.0 as usize)
            .is_some_and(|e| e.is_live() && !e.is_template() && e.key(dir) == *key)
    }

    /// The table's release epoch: it changes whenever an entry is freed
    /// (removed, expired, retired), and only then. A lookup result taken
    /// at the epoch still current holds without a second key compare:
    /// its entry cannot have been freed and reused since, and a live
    /// flow's keys never change.
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.slab.released
    }

    /// Read access to a live entry.
    pub fn flow(&self, id: FlowId) -> FlowRef<'_, A> {
        self.slab.flow(id.0)
    }

    /// Caps a live flow's timeout in its current state at `secs` (a state
    /// change sets it from the state again), filing it earlier.
    pub fn shorten(&mut self, id: FlowId, secs: u32) {
        let (Some(e), Some(c)) = (
            self.slab.entries.get(id.0 as usize),
            self.slab.cold.get_mut(id.0 as usize),
        ) else {
            return;
        };
        if !e.is_live() || c.timeout <= secs {
            return;
        }
        c.timeout = secs;
        self.unfile(id.0);
        self.file(id.0);
    }

    /// Marks a flow's backend as quiesced (weight 0): shown in dumps.
    pub fn mark_quiesced(&mut self, id: FlowId) {
        self.slab.entries[id.0 as usize].flags |= FLAG_QUIESCED;
    }

    /// Accounts a packet of a tracked flow: counters, last seen, and (TCP)
    /// the state transition. Returns the states before and after the
    /// packet (the one before is read anyway: a caller that reports
    /// changes needs no read of its own).
    #[inline(always)]
    pub fn on_packet(
        &mut self,
        id: FlowId,
        dir: Direction,
        pkt: Packet,
        now: u32,
        obs: &mut impl Observer<A>,
    ) -> (FlowState, FlowState) {
        let d = dir as usize;
        self.slab.add_bytes(id.0, d, pkt.len);
        let e = &mut self.slab.entries[id.0 as usize];
        e.packets[d] = e.packets[d].wrapping_add(1);
        e.last_seen = now;
        let old = e.state();
        let new = tcp_next(old, dir, pkt.tcp_flags, e.flags & FLAG_ONE_WAY != 0);
        if new != old {
            self.change_state(id.0, old, new, obs);
        }
        (old, new)
    }

    /// Moves an entry to a new state: gauges, active/inactive counts, age
    /// list, timeout, wheel. Out of line: most packets change no state,
    /// and [`FlowTable::on_packet`] stays small enough to inline.
    #[inline(never)]
    fn change_state(
        &mut self,
        slot: u32,
        old: FlowState,
        new: FlowState,
        obs: &mut impl Observer<A>,
    ) {
        self.states[old.index()] -= 1;
        self.states[new.index()] += 1;
        let timeout = new.timeout(&self.timeouts);
        self.slab.cold[slot as usize].timeout = timeout;
        let e = &mut self.slab.entries[slot as usize];
        e.state = new as u8;
        let (service, backend) = (e.service, e.backend_id);
        match (old.is_active(), new.is_active()) {
            (false, true) => {
                obs.conn_counts(service, backend, 1, -1);
                self.age_remove(slot);
            }
            (true, false) => {
                obs.conn_counts(service, backend, -1, 1);
                self.age_add(slot);
            }
            _ => {}
        }
        self.unfile(slot);
        self.file(slot);
    }

    pub(crate) fn age_add(&mut self, slot: u32) {
        self.slab.push_back(AGE, &mut self.age, slot);
        self.slab.entries[slot as usize].flags |= FLAG_AGED;
    }

    fn age_remove(&mut self, slot: u32) {
        if self.slab.entries[slot as usize].flags & FLAG_AGED != 0 {
            self.slab.unlink(AGE, &mut self.age, slot);
            self.slab.entries[slot as usize].flags &= !FLAG_AGED;
        }
    }

    /// Files an entry in the wheel at its deadline (never in the past).
    pub(crate) fn file(&mut self, slot: u32) {
        self.file_at(slot, self.slab.deadline(slot));
    }

    /// Files an entry in the wheel at `deadline`, its deadline (the
    /// caller that has just set it need not read it back).
    #[inline(always)]
    fn file_at(&mut self, slot: u32, deadline: u32) {
        let at = deadline.max(self.cursor.wrapping_add(1));
        let w = at as usize % WHEEL_SLOTS;
        self.slab.push_back(WHEEL, &mut self.wheel[w], slot);
        self.slab.entries[slot as usize].wheel_slot = w as u16;
    }

    /// Takes an entry off its wheel list, keeping an interrupted sweep
    /// consistent.
    fn unfile(&mut self, slot: u32) {
        let e = &self.slab.entries[slot as usize];
        let w = e.wheel_slot;
        if let Some(sw) = self.sweep {
            if sw.slot == w && sw.stop == slot {
                let prev = self.slab.cold[slot as usize].links[WHEEL][1];
                self.sweep = (prev != NIL).then_some(Sweep {
                    slot: w,
                    stop: prev,
                });
            }
        }
        self.slab.unlink(WHEEL, &mut self.wheel[w as usize], slot);
    }

    /// Allocates a slot, early-dropping the oldest non-ESTABLISHED entry
    /// if the table is full.
    fn alloc(&mut self, obs: &mut impl Observer<A>) -> Result<u32, InsertError> {
        if let Some(slot) = self.slab.alloc() {
            return Ok(slot);
        }
        self.stats.table_full += 1;
        let Some(victim) = (!self.age.is_empty()).then_some(self.age.first) else {
            self.stats.drop += 1;
            return Err(InsertError::TableFull);
        };
        self.stats.early_drop += 1;
        self.remove_slot(victim, Removal::EarlyDropped, obs);
        self.slab.alloc().ok_or(InsertError::TableFull)
    }

    /// Tracks a new flow with its first packet (original direction);
    /// refuses it ([`InsertError::Exists`]) if either key is tracked.
    pub fn insert(
        &mut self,
        new: &NewFlow<A>,
        pkt: Packet,
        now: u32,
        obs: &mut impl Observer<A>,
    ) -> Result<FlowId, InsertError> {
        self.insert_flow(new, None, pkt, now, obs)
    }

    /// As [`FlowTable::insert`], for a caller that has just looked both
    /// keys up and found neither tracked (the data plane does: a lookup
    /// miss, then a SNAT port whose reply key is free): the table does not
    /// probe for them again, nor hash them again (`hashes`: the original
    /// and the reply key's [`FlowTable::key_hash`], as the caller looked
    /// them up). Both checked in debug builds.
    pub fn insert_new(
        &mut self,
        new: &NewFlow<A>,
        hashes: [u64; 2],
        pkt: Packet,
        now: u32,
        obs: &mut impl Observer<A>,
    ) -> Result<FlowId, InsertError> {
        self.insert_flow(new, Some(hashes), pkt, now, obs)
    }

    fn insert_flow(
        &mut self,
        new: &NewFlow<A>,
        hashes: Option<[u64; 2]>,
        pkt: Packet,
        now: u32,
        obs: &mut impl Observer<A>,
    ) -> Result<FlowId, InsertError> {
        let orig = FlowKey::between(new.client, new.vip, new.proto);
        let reply = FlowKey::between(new.backend, new.snat, new.proto);
        // Keys the caller looked up (it gives their hashes) are not
        // probed again, but in debug builds.
        let check = hashes.is_none() || cfg!(debug_assertions);
        let [h_orig, h_reply] = hashes.unwrap_or_else(|| [self.hash(&orig), self.hash(&reply)]);
        debug_assert_eq!([h_orig, h_reply], [self.hash(&orig), self.hash(&reply)]);
        let entries = &self.slab.entries;
        let taken = |h: u64, k: &FlowKey<A>| {
            self.index
                .find(h, |v| {
                    let e = &entries[(v & !DIR_BIT) as usize];
                    !e.is_template() && e.key(dir_of(v)) == *k
                })
                .is_some()
        };
        let two_way = !new.one_way;
        if (two_way && orig == reply)
            || (check && (taken(h_orig, &orig) || (two_way && taken(h_reply, &reply))))
        {
            self.stats.insert_failed += 1;
            return Err(InsertError::Exists);
        }
        let slot = self.alloc(obs)?;
        let state = match new.proto {
            L4Proto::Tcp => tcp_next(
                FlowState::None,
                Direction::Original,
                pkt.tcp_flags,
                new.one_way,
            ),
            L4Proto::Udp => FlowState::Udp,
            L4Proto::Icmp => FlowState::Icmp,
        };
        let e = &mut self.slab.entries[slot as usize];
        e.set_ends(new.client, new.vip, new.backend, new.snat);
        e.client_mac = new.client_mac;
        e.plan = new.plan;
        if new.one_way {
            e.flags |= FLAG_ONE_WAY;
        }
        e.proto = new.proto;
        e.service = new.service;
        e.backend_id = new.backend_id;
        e.state = state as u8;
        e.last_seen = now;
        e.packets[0] = 1;
        self.slab.set_first_bytes(slot, pkt.len);
        let timeout = state.timeout(&self.timeouts);
        self.slab.cold[slot as usize].timeout = timeout;
        self.index_insert(h_orig, slot);
        if two_way {
            self.index_insert(h_reply, slot | DIR_BIT);
        }
        self.states[state.index()] += 1;
        self.snat.add(&self.slab.entries[slot as usize], 1);
        self.stats.insert += 1;
        if state.is_active() {
            obs.conn_counts(new.service, new.backend_id, 1, 0);
        } else {
            obs.conn_counts(new.service, new.backend_id, 0, 1);
            self.age_add(slot);
        }
        self.file_at(slot, now.saturating_add(timeout));
        Ok(FlowId(slot))
    }

    /// Installs a flow another gateway tracks (flow synchronisation) in
    /// `state`, marked as a peer's ([`FlowRef::is_peer`]): a peer's flow
    /// tracked already (by its original key, with the same backend and
    /// SNAT end) moves to `state`; one with other ends is replaced (the
    /// peer's choice is the one the client's connection lives on); else it
    /// is inserted. Its timeout is `state`'s, from `now`. A flow of this
    /// gateway's own is never touched, nor is a template state or `None`
    /// installed ([`InsertError::Exists`] for all three).
    pub fn install(
        &mut self,
        new: &NewFlow<A>,
        state: FlowState,
        now: u32,
        obs: &mut impl Observer<A>,
    ) -> Result<FlowId, InsertError> {
        if matches!(state, FlowState::None | FlowState::Template) {
            return Err(InsertError::Exists);
        }
        let orig = FlowKey::between(new.client, new.vip, new.proto);
        let reply = FlowKey::between(new.backend, new.snat, new.proto);
        let own =
            |t: &mut Self, k: &FlowKey<A>| t.lookup(k).is_some_and(|(id, _)| !t.flow(id).is_peer());
        if own(self, &orig) || (!new.one_way && own(self, &reply)) {
            return Err(InsertError::Exists);
        }
        let id = match self.lookup(&orig) {
            Some((id, Direction::Original))
                if {
                    let f = self.flow(id);
                    f.backend() == new.backend && f.snat() == new.snat
                } =>
            {
                id
            }
            found => {
                if let Some((id, _)) = found {
                    self.retire(id, Removal::Rescheduled, obs);
                }
                // The reply key may be another (stale) flow's: it goes too.
                if let (false, Some((id, _))) = (new.one_way, self.lookup(&reply)) {
                    self.retire(id, Removal::Rescheduled, obs);
                }
                let syn = Packet {
                    tcp_flags: crate::state::tcp_flags::SYN,
                    len: 0,
                };
                self.insert_flow(new, None, syn, now, obs)?
            }
        };
        let e = &mut self.slab.entries[id.0 as usize];
        e.flags |= FLAG_PEER;
        e.last_seen = now;
        let old = e.state();
        if new.proto == L4Proto::Tcp && old != state {
            self.change_state(id.0, old, state, obs);
        } else {
            // Refiled from now.
            self.slab.cold[id.0 as usize].timeout = old.timeout(&self.timeouts);
            self.unfile(id.0);
            self.file(id.0);
        }
        Ok(id)
    }

    pub(crate) fn index_insert(&mut self, hash: u64, value: u32) {
        // Sized for two keys per entry: never full.
        let added = self.index.insert(hash, value);
        debug_assert!(added, "index full");
        self.fresh.note(hash);
    }

    fn index_remove(&mut self, value: u32) {
        let e = &self.slab.entries[(value & !DIR_BIT) as usize];
        let hash = self.hash(&e.key(dir_of(value)));
        self.index.remove(hash, value);
    }

    /// Deletes a live entry on request.
    pub fn remove(&mut self, id: FlowId, obs: &mut impl Observer<A>) {
        if self
            .slab
            .entries
            .get(id.0 as usize)
            .is_some_and(Entry::is_live)
        {
            self.stats.delete += 1;
            self.remove_slot(id.0, Removal::Deleted, obs);
        }
    }

    /// Ends a live flow for `why` (a reschedule, a removed backend, a
    /// reclaimed SNAT port), counted under that reason. `Expired`,
    /// `Deleted` and `EarlyDropped` are counted as such.
    pub fn retire(&mut self, id: FlowId, why: Removal, obs: &mut impl Observer<A>) {
        if !self
            .slab
            .entries
            .get(id.0 as usize)
            .is_some_and(Entry::is_live)
        {
            return;
        }
        let counter = match why {
            Removal::Expired => &mut self.stats.expire,
            Removal::Deleted => &mut self.stats.delete,
            Removal::EarlyDropped => &mut self.stats.early_drop,
            Removal::Rescheduled => &mut self.stats.reschedule,
            Removal::NoDest => &mut self.stats.nodest,
            Removal::Reclaimed => &mut self.stats.reclaim,
        };
        *counter += 1;
        self.remove_slot(id.0, why, obs);
    }

    /// Takes a live entry out of every structure and frees its slot. The
    /// caller has counted the removal.
    pub(crate) fn remove_slot(&mut self, slot: u32, why: Removal, obs: &mut impl Observer<A>) {
        let e = self.slab.entries[slot as usize];
        obs.removed(self.slab.flow(slot), why);
        let state = e.state();
        if !e.is_template() {
            let (a, i) = if state.is_active() { (-1, 0) } else { (0, -1) };
            obs.conn_counts(e.service, e.backend_id, a, i);
        }
        if !e.has_one_key() {
            self.index_remove(slot | DIR_BIT);
        }
        self.index_remove(slot);
        self.age_remove(slot);
        if e.wheel_slot as usize != WHEEL_SLOTS {
            self.unfile(slot);
        }
        self.states[state.index()] -= 1;
        self.snat.add(&e, -1);
        self.slab.release(slot);
    }

    /// Starts fetching what removing the entry in `slot` (in cache: just
    /// unlinked) touches: its keys' index buckets and its age-list
    /// neighbours.
    #[inline]
    fn prefetch_removal(&self, slot: u32) {
        let e = &self.slab.entries[slot as usize];
        self.index.prefetch(self.hash(&e.key(Direction::Original)));
        if !e.has_one_key() {
            self.index.prefetch(self.hash(&e.key(Direction::Reply)));
        }
        if e.flags & FLAG_AGED != 0 {
            // The unlink writes their links, in their cold parts.
            for n in self.slab.cold[slot as usize].links[AGE] {
                if let Some(c) = self.slab.cold.get(n as usize) {
                    crate::batch::prefetch_lines(c as *const Cold);
                }
            }
        }
    }

    /// Removes a run of expired entries, unlinked from the wheel.
    fn remove_expired(&mut self, run: &[u32], obs: &mut impl Observer<A>) {
        for &slot in run {
            self.remove_slot(slot, Removal::Expired, obs);
        }
    }

    /// Advances the wheel to `now`, examining at most `budget` entries and
    /// seconds; expired entries leave the table (counted in `expire`).
    pub fn advance(&mut self, now: u32, budget: u32, obs: &mut impl Observer<A>) -> Advance {
        let mut work = 0u32;
        let mut expired = 0u32;
        // Expired entries are removed a run at a time: the sweep unlinks
        // up to EXPIRE_RUN of them and fetches the lines their removal
        // touches (index buckets, age-list neighbours), then removes them,
        // so those misses overlap instead of adding up.
        let mut run = [0u32; EXPIRE_RUN];
        let mut n = 0;
        loop {
            if work >= budget {
                self.remove_expired(&run[..n], obs);
                return Advance {
                    expired,
                    done: false,
                };
            }
            if let Some(sw) = self.sweep {
                let head = &mut self.wheel[sw.slot as usize];
                let slot = head.first;
                let last = slot == sw.stop;
                self.slab.unlink(WHEEL, head, slot);
                self.slab.entries[slot as usize].wheel_slot = WHEEL_SLOTS as u16;
                if last {
                    self.sweep = None;
                }
                work += 1;
                if self.slab.deadline(slot) <= self.cursor {
                    self.stats.expire += 1;
                    expired += 1;
                    self.prefetch_removal(slot);
                    run[n] = slot;
                    n += 1;
                    if n == EXPIRE_RUN {
                        self.remove_expired(&run, obs);
                        n = 0;
                    }
                } else {
                    self.file(slot);
                }
                continue;
            }
            self.remove_expired(&run[..n], obs);
            n = 0;
            if self.cursor >= now {
                return Advance {
                    expired,
                    done: true,
                };
            }
            if self.slab.live() == 0 {
                self.cursor = now;
                continue;
            }
            self.cursor += 1;
            work += 1;
            let w = self.cursor as usize % WHEEL_SLOTS;
            let last = self.wheel[w].last;
            if last != NIL {
                self.sweep = Some(Sweep {
                    slot: w as u16,
                    stop: last,
                });
            }
        }
    }

    // ---- persistence templates ----

    /// The key of the template for clients of `client_net` on `vip`.
    pub fn template_key(client_net: A, vip: Endpoint<A>, proto: L4Proto) -> FlowKey<A> {
        FlowKey::between(
            Endpoint {
                addr: client_net,
                port: 0,
            },
            vip,
            proto,
        )
    }

    fn find_template(&self, hash: u64, key: &FlowKey<A>) -> Option<u32> {
        let entries = &self.slab.entries;
        self.index.find(hash, |v| {
            v & DIR_BIT == 0 && {
                let e = &entries[v as usize];
                e.is_template() && e.key(Direction::Original) == *key
            }
        })
    }

    /// The backend (id and end) a live, unexpired template assigns.
    pub fn template_lookup(&mut self, key: &FlowKey<A>, now: u32) -> Option<(u32, Endpoint<A>)> {
        let slot = self.find_template(self.hash(key), key)?;
        let e = &self.slab.entries[slot as usize];
        (self.slab.deadline(slot) > now).then(|| (e.backend_id, e.backend()))
    }

    /// Creates or refreshes the template `key` → backend, living `timeout`
    /// seconds from `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn template_set(
        &mut self,
        key: &FlowKey<A>,
        service: u32,
        backend_id: u32,
        backend: Endpoint<A>,
        timeout: u32,
        now: u32,
        obs: &mut impl Observer<A>,
    ) -> Result<(), InsertError> {
        let hash = self.hash(key);
        let slot = match self.find_template(hash, key) {
            Some(slot) => slot,
            None => {
                let slot = self.alloc(obs)?;
                let e = &mut self.slab.entries[slot as usize];
                let zero = Endpoint {
                    addr: A::UNSPECIFIED,
                    port: 0,
                };
                e.set_ends(key.source(), key.destination(), backend, zero);
                e.proto = key.proto;
                e.flags |= FLAG_TEMPLATE;
                e.state = FlowState::Template as u8;
                e.last_seen = now;
                self.index_insert(hash, slot);
                self.states[FlowState::Template.index()] += 1;
                self.stats.insert += 1;
                self.file(slot);
                slot
            }
        };
        let shrinks = now.saturating_add(timeout) < self.slab.deadline(slot);
        self.slab.cold[slot as usize].timeout = timeout;
        let e = &mut self.slab.entries[slot as usize];
        e.service = service;
        e.backend_id = backend_id;
        e.set_endpoint(2, backend);
        e.last_seen = now;
        if shrinks {
            self.unfile(slot);
            self.file(slot);
        }
        Ok(())
    }
}

#[inline(always)]
pub(crate) fn dir_of(v: u32) -> Direction {
    if v & DIR_BIT == 0 {
        Direction::Original
    } else {
        Direction::Reply
    }
}

pub(crate) fn slot_of(v: u32) -> u32 {
    v & !DIR_BIT
}
