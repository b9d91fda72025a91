//! The service table a worker looks new flows up in: (VIP, protocol, port)
//! → the compiled service (backends, scheduler, counts, persistence, source
//! ACL), in a hash map, so the cost does not depend on the number of
//! services.
//!
//! A service is compiled once by the control plane ([`CompiledService::new`],
//! [`CompiledService::update`]: O(that service); the Maglev table is built
//! here) and shared by every worker through an `Arc`; each worker keeps its
//! own copy of the scheduler's state (cursors, random generator). Replacing
//! one service touches only its entry.
//!
//! Backend identity: a backend keeps its id for the life of its service,
//! whatever else changes in its list (IPVS's `struct ip_vs_dest`); flows,
//! connection counts and traffic counters refer to the id, never to a
//! position. A removed backend's id stays reserved while flows to it may
//! exist (it is re-used only once every worker has applied its removal
//! and its counts show no flow), and a backend added back with the same
//! address and port gets its old id back, as IPVS takes a destination
//! back from its trash. Invariant: `ids[b.id]` is `b.endpoint` for every
//! backend, and the counts and counters cover every id of `ids`. The
//! traffic of ids given to another backend is kept in `retired`, so the
//! service's totals never go back.

use std::cell::RefCell;
use std::collections::HashMap as StdHashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hashbrown::HashMap;
use xvs_config::{Address, Protocol, Service, ServiceKey};
use xvs_conntrack::{Endpoint, Keyed, L4Proto, Observer};

use crate::forward::Plan;
use crate::sched::{ConnCounts, MaglevParams, Persist, SchedBackend, Scheduler, DEFAULT_SEED};
use crate::traffic::{DestState, TrafficStats, TrafficTotals};

/// Service ids above this get no per-packet traffic counters (the
/// counters are found by id in a dense array).
const MAX_STATS_ID: u32 = 1 << 24;

/// Backend ids the counters of a new service cover at least.
const MIN_ID_CAPACITY: usize = 4;

/// A service ready for the data plane.
///
/// Laid out in declaration order (`repr(C)`) on a line of its own
/// (`align(64)`): what a new flow reads of it comes first and fits that
/// first line ([`CompiledService::HOT_BYTES`]): the backend list, the
/// allowed client ranges and persistence. Its connection counts and
/// traffic counters a new flow takes from the service's handles line
/// instead ([`ServiceTable::handles_of`]), which its insert and every
/// packet of it read anyway. So a new flow of a service with persistence
/// or client ranges reads one line of it, and any other new flow none (a
/// worker's [`ServiceSlot`] has what it needs).
#[derive(Debug)]
#[repr(C, align(64))]
pub struct CompiledService<A: Address = Ipv4Addr> {
    /// Backends, in the service's order, with their stable ids (shared
    /// with every worker's slot, [`ServiceSlot::backends`]).
    pub backends: Arc<[SchedBackend<A>]>,
    /// Allowed client ranges (empty = all).
    pub source_ranges: Box<[A::Net]>,
    /// Client persistence.
    pub persist: Option<Persist<A>>,
    /// Id, unique among live services.
    pub id: u32,
    /// Global connection counts of its backends.
    pub counts: ConnCounts,
    /// Traffic counters of its backends (`--stats`).
    pub stats: TrafficStats,
    /// What identifies it.
    pub key: ServiceKey<A>,
    /// The endpoint each backend id stands for (index = id): the live
    /// backends and removed ones whose id is not re-used yet.
    pub ids: Vec<Endpoint<A>>,
    /// The scheduler as built; workers clone it.
    pub scheduler: Scheduler,
    /// Traffic of backend ids since given to other backends.
    pub retired: TrafficTotals,
}

/// The L4 protocol of a service.
pub fn l4(p: Protocol) -> L4Proto {
    match p {
        Protocol::Tcp => L4Proto::Tcp,
        Protocol::Udp => L4Proto::Udp,
    }
}

fn endpoint_of<A: Address>(b: &xvs_config::Backend<A>) -> Endpoint<A> {
    Endpoint {
        addr: b.address,
        port: b.port,
    }
}

impl<A: Address> CompiledService<A> {
    /// The bytes from its start that a new flow reads (its fields before
    /// `id`): within its first line.
    pub const HOT_BYTES: usize = std::mem::offset_of!(CompiledService<A>, id);

    /// Compiles `svc`, a new service, for `workers` workers.
    pub fn new(
        id: u32,
        svc: &Service<A>,
        workers: usize,
        maglev_seed: Option<u64>,
    ) -> CompiledService<A> {
        let ids: Vec<Endpoint<A>> = svc.backends.iter().map(endpoint_of).collect();
        let capacity = ids.len().max(MIN_ID_CAPACITY);
        let backends = svc
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| SchedBackend {
                id: i as u32,
                endpoint: endpoint_of(b),
                weight: b.weight,
                plan: Plan::of(b.forward, b.encap),
            })
            .collect();
        Self::assemble(
            id,
            svc,
            backends,
            ids,
            ConnCounts::new(workers, capacity),
            TrafficStats::new(workers, capacity),
            TrafficTotals::default(),
            maglev_seed,
        )
    }

    /// Compiles `svc`, the next version of `prev` (same key, same id):
    /// backends keep their ids (matched by address and port, also against
    /// removed ones whose id is still reserved); a new backend takes the
    /// id of a removed one when `settled` (every worker has applied every
    /// version sent so far) and no flow to it is left, else a fresh id.
    /// The counts and counters are `prev`'s, or larger arrays when the ids
    /// outgrow them (each worker adopts its row when it applies this one).
    pub fn update(
        prev: &CompiledService<A>,
        svc: &Service<A>,
        settled: bool,
        maglev_seed: Option<u64>,
    ) -> CompiledService<A> {
        let mut ids = prev.ids.clone();
        let mut retired = prev.retired;
        let by_endpoint: StdHashMap<Endpoint<A>, u32> = ids
            .iter()
            .enumerate()
            .map(|(id, e)| (*e, id as u32))
            .collect();
        let mut taken = vec![false; ids.len()];
        let mut found: Vec<Option<u32>> = svc
            .backends
            .iter()
            .map(|b| {
                let id = *by_endpoint.get(&endpoint_of(b))?;
                (!std::mem::replace(&mut taken[id as usize], true)).then_some(id)
            })
            .collect();
        // Ids free for re-use: not listed any more and without flows.
        let mut reusable = (0..ids.len() as u32)
            .filter(|&id| settled && !taken[id as usize] && prev.counts.flows(id) == 0);
        for (slot, b) in found.iter_mut().zip(&svc.backends) {
            if slot.is_some() {
                continue;
            }
            let id = match reusable.next() {
                Some(id) => {
                    retired.add(&prev.stats.take(id));
                    ids[id as usize] = endpoint_of(b);
                    id
                }
                None => {
                    ids.push(endpoint_of(b));
                    ids.len() as u32 - 1
                }
            };
            *slot = Some(id);
        }
        let backends = svc
            .backends
            .iter()
            .zip(found)
            .map(|(b, id)| SchedBackend {
                id: id.unwrap_or_default(),
                endpoint: endpoint_of(b),
                weight: b.weight,
                plan: Plan::of(b.forward, b.encap),
            })
            .collect();
        let (counts, stats) = if ids.len() <= prev.stats.backends() {
            (prev.counts.clone(), prev.stats.clone())
        } else {
            // Larger arrays; readers see a copy at once, each worker
            // copies its own row exactly when it applies this version.
            let workers = prev.counts.workers();
            let capacity = ids.len().next_power_of_two();
            let counts = ConnCounts::new(workers, capacity);
            let stats = TrafficStats::new(workers, capacity);
            for w in 0..workers {
                counts.adopt_row(&prev.counts, w);
                stats.adopt_row(&prev.stats, w);
            }
            (counts, stats)
        };
        Self::assemble(
            prev.id,
            svc,
            backends,
            ids,
            counts,
            stats,
            retired,
            maglev_seed,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        id: u32,
        svc: &Service<A>,
        backends: Vec<SchedBackend<A>>,
        ids: Vec<Endpoint<A>>,
        counts: ConnCounts,
        stats: TrafficStats,
        retired: TrafficTotals,
        maglev_seed: Option<u64>,
    ) -> CompiledService<A> {
        let maglev = MaglevParams {
            size: svc.maglev_table_size(),
            seed: maglev_seed.unwrap_or(DEFAULT_SEED),
        };
        let scheduler = Scheduler::new(svc.scheduler, svc.flags, &backends, maglev, u64::from(id));
        CompiledService {
            id,
            key: svc.key,
            counts,
            stats,
            retired,
            ids,
            backends: backends.into(),
            scheduler,
            persist: svc.persistence.map(|p| Persist {
                service: id,
                proto: l4(svc.key.protocol),
                timeout: p.timeout_secs,
                netmask: p.netmask,
            }),
            source_ranges: svc.source_ranges.as_slice().into(),
        }
    }

    /// The backend a flow to `endpoint` goes to, if listed: with that
    /// address and port, or with that address and no port (a port-0
    /// service lists its backends without one).
    pub fn backend(&self, endpoint: Endpoint<A>) -> Option<&SchedBackend<A>> {
        let listed = |port| {
            self.backends
                .iter()
                .find(move |b| b.endpoint.addr == endpoint.addr && b.endpoint.port == port)
        };
        listed(endpoint.port).or_else(|| listed(0))
    }

    /// The service's totals: every id's counters, plus those of ids since
    /// given to other backends (they never go back when a backend
    /// leaves).
    pub fn totals(&self) -> TrafficTotals {
        let mut t = self.retired;
        for id in 0..self.ids.len() as u32 {
            t.add(&self.stats.backend(id));
        }
        t
    }

    /// Whether a client may use the service.
    pub fn allows(&self, client: A) -> bool {
        self.source_ranges.is_empty() || self.source_ranges.iter().any(|n| client.within(n))
    }

    /// Whether new TCP flows may start mid-connection (Maglev: a flow that
    /// moved here from another gateway maps to the same backend).
    pub fn adopts_midflow(&self) -> bool {
        matches!(self.scheduler, Scheduler::Maglev(_))
    }
}

/// A service of either family, as control messages carry it and the
/// control plane reads it.
#[derive(Debug, Clone)]
pub enum AnyService {
    /// IPv4.
    V4(Arc<CompiledService<Ipv4Addr>>),
    /// IPv6.
    V6(Arc<CompiledService<Ipv6Addr>>),
}

impl From<Arc<CompiledService<Ipv4Addr>>> for AnyService {
    fn from(s: Arc<CompiledService<Ipv4Addr>>) -> Self {
        AnyService::V4(s)
    }
}

impl From<Arc<CompiledService<Ipv6Addr>>> for AnyService {
    fn from(s: Arc<CompiledService<Ipv6Addr>>) -> Self {
        AnyService::V6(s)
    }
}

impl AnyService {
    /// Compiles `svc` (a service of either family, checked: its addresses
    /// are of its VIP's family) as `id`, or as the next version of
    /// `prev`, with the cluster's hash `seed`; `None` when its addresses
    /// are not all of one family.
    pub fn compile(
        id: u32,
        svc: &Service<IpAddr>,
        prev: Option<&AnyService>,
        (workers, applied): (usize, bool),
        seed: u64,
    ) -> Option<AnyService> {
        // The next version of `prev` when it is of the same family, else a
        // new service.
        fn one<A: Address>(
            id: u32,
            svc: &Service<A>,
            prev: Option<&Arc<CompiledService<A>>>,
            (workers, applied): (usize, bool),
            seed: u64,
        ) -> Arc<CompiledService<A>> {
            Arc::new(match prev {
                Some(p) => CompiledService::update(p, svc, applied, Some(seed)),
                None => CompiledService::new(id, svc, workers, Some(seed)),
            })
        }
        Some(match svc.key.vip {
            IpAddr::V4(_) => {
                let prev = match prev {
                    Some(AnyService::V4(p)) => Some(p),
                    _ => None,
                };
                AnyService::V4(one(id, &svc.narrow()?, prev, (workers, applied), seed))
            }
            IpAddr::V6(_) => {
                let prev = match prev {
                    Some(AnyService::V6(p)) => Some(p),
                    _ => None,
                };
                AnyService::V6(one(id, &svc.narrow()?, prev, (workers, applied), seed))
            }
        })
    }

    /// Its id.
    pub fn id(&self) -> u32 {
        match self {
            AnyService::V4(s) => s.id,
            AnyService::V6(s) => s.id,
        }
    }

    /// Its key, of either family.
    pub fn key(&self) -> ServiceKey<IpAddr> {
        match self {
            AnyService::V4(s) => s.key.wide(),
            AnyService::V6(s) => s.key.wide(),
        }
    }

    /// The stable id of the backend at `addr`:`port`, if listed.
    pub fn backend_id(&self, addr: IpAddr, port: u16) -> Option<u32> {
        fn find<A: Address>(s: &CompiledService<A>, addr: IpAddr, port: u16) -> Option<u32> {
            let at = Endpoint {
                addr: A::from_ip(addr)?,
                port,
            };
            Some(s.backend(at)?.id)
        }
        match self {
            AnyService::V4(s) => find(s, addr, port),
            AnyService::V6(s) => find(s, addr, port),
        }
    }

    /// Calls `f` with each of its backends' address, port and stable id,
    /// in the service's order.
    pub fn for_each_backend(&self, mut f: impl FnMut(IpAddr, u16, u32)) {
        fn each<A: Address>(s: &CompiledService<A>, f: &mut impl FnMut(IpAddr, u16, u32)) {
            for b in s.backends.iter() {
                f(b.endpoint.addr.ip(), b.endpoint.port, b.id);
            }
        }
        match self {
            AnyService::V4(s) => each(s, &mut f),
            AnyService::V6(s) => each(s, &mut f),
        }
    }

    /// Fetches the compiled service's own lines (the first step of
    /// [`AnyService::prefetch_backends`]'s, a pass ahead of it).
    pub fn prefetch(&self) {
        match self {
            AnyService::V4(s) => xvs_conntrack::prefetch_lines(Arc::as_ptr(s)),
            AnyService::V6(s) => xvs_conntrack::prefetch_lines(Arc::as_ptr(s)),
        }
    }

    /// Fetches what [`AnyService::for_each_backend`] and its first
    /// backend's counters read (the service's lines, fetched by
    /// [`AnyService::prefetch`] a pass before, give the addresses).
    pub fn prefetch_backends(&self) {
        fn fetch<A: Address>(s: &CompiledService<A>) {
            xvs_conntrack::prefetch_bytes(
                s.backends.as_ptr().cast(),
                std::mem::size_of_val(&*s.backends).min(256),
            );
            if let Some(b) = s.backends.first() {
                s.stats.prefetch_backend(b.id);
            }
        }
        match self {
            AnyService::V4(s) => fetch(s),
            AnyService::V6(s) => fetch(s),
        }
    }

    /// Its backends' connection counts.
    pub fn counts(&self) -> &ConnCounts {
        match self {
            AnyService::V4(s) => &s.counts,
            AnyService::V6(s) => &s.counts,
        }
    }

    /// Its backends' traffic counters.
    pub fn stats(&self) -> &TrafficStats {
        match self {
            AnyService::V4(s) => &s.stats,
            AnyService::V6(s) => &s.stats,
        }
    }

    /// Its totals ([`CompiledService::totals`]).
    pub fn totals(&self) -> TrafficTotals {
        match self {
            AnyService::V4(s) => s.totals(),
            AnyService::V6(s) => s.totals(),
        }
    }
}

/// One worker's view of a service.
///
/// It holds everything a new flow of a service reads before its
/// backend's lines, so that for a service without persistence or client
/// ranges the flow never reads the compiled service itself: its id,
/// whether it persists or filters clients, the scheduler's state, the
/// backend list (shared), and where the flow's count cell will be.
///
/// Laid out in declaration order (`repr(C)`), the scheduler's state
/// last: its key and what the batch's lookup reads of it (up to
/// `sched`) share the first line of its entry in the table.
#[derive(Debug)]
#[repr(C)]
pub struct ServiceSlot<A: Address = Ipv4Addr> {
    /// The shared compiled service.
    pub svc: Arc<CompiledService<A>>,
    /// `svc.id`, beside the pointer: a lookup that only needs the id
    /// does not wait for the compiled service's line.
    pub id: u32,
    /// Whether `svc` has persistence ([`ServiceSlot::persist`]).
    persistent: bool,
    /// Whether `svc` takes every client (no source ranges,
    /// [`ServiceSlot::allows`]).
    open: bool,
    /// `svc.backends`, the same list: the scheduler reads it, and the
    /// batch's lookup fetches its first line, with no wait on the
    /// compiled service's line.
    pub backends: Arc<[SchedBackend<A>]>,
    /// This worker's connection-count cells of the first and the last
    /// backend (eight backends' cells share a line): where a new flow's
    /// count will be. Kept here, the batch's lookup fetches them with the
    /// backend list, a pass after the slot, instead of a pass later
    /// (their addresses depend on the backends' ids in the list).
    /// Addresses only, for [`xvs_conntrack::prefetch`] (which never
    /// faults), into what `svc` keeps alive.
    pub ahead: [usize; 2],
    /// This worker's scheduler state. In a cell: a pick mutates it while
    /// the table is read (persistence reports evictions to every
    /// service's counts), and only this worker's thread touches it.
    pub sched: RefCell<Scheduler>,
}

impl<A: Address> ServiceSlot<A> {
    /// The slot of `svc` for worker `worker`, with the scheduler's state
    /// `sched`.
    fn new(svc: Arc<CompiledService<A>>, sched: Scheduler, worker: usize) -> ServiceSlot<A> {
        let cell = |b: Option<&SchedBackend<A>>| {
            b.map_or(0, |b| svc.counts.cell_addr(worker, b.id) as usize)
        };
        ServiceSlot {
            id: svc.id,
            persistent: svc.persist.is_some(),
            open: svc.source_ranges.is_empty(),
            sched: RefCell::new(sched),
            backends: svc.backends.clone(),
            ahead: [cell(svc.backends.first()), cell(svc.backends.last())],
            svc,
        }
    }

    /// Whether the service takes a flow from `client`
    /// ([`CompiledService::allows`]; read only when it has ranges).
    #[inline(always)]
    pub fn allows(&self, client: A) -> bool {
        self.open || self.svc.allows(client)
    }

    /// The service's persistence (read only when it has some).
    #[inline(always)]
    pub fn persist(&self) -> Option<&Persist<A>> {
        if self.persistent {
            self.svc.persist.as_ref()
        } else {
            None
        }
    }

    /// Starts fetching what a new flow reads after the slot: the backend
    /// list's first line and [`ServiceSlot::ahead`]; and, only for a
    /// service that persists or filters clients, the compiled service's
    /// first line ([`CompiledService::HOT_BYTES`]).
    #[inline(always)]
    pub fn prefetch_ahead(&self) {
        xvs_conntrack::prefetch(self.backends.as_ptr().cast());
        for a in self.ahead {
            xvs_conntrack::prefetch(a as *const u8);
        }
        if self.persistent || !self.open {
            let hot = CompiledService::<A>::HOT_BYTES;
            xvs_conntrack::prefetch_bytes(Arc::as_ptr(&self.svc).cast(), hot);
        }
    }
}

/// A service's key in a worker's table: VIP, protocol, port (0: every
/// port of the VIP).
type SlotKey<A> = (A, L4Proto, u16);

/// A worker's service table.
///
/// Services are found by key in a [`Keyed`] map, whose buckets a batch
/// fetches ahead ([`ServiceTable::key_hash`], [`ServiceTable::prefetch_hash`],
/// [`ServiceTable::find_hashed`]), and then by their position there
/// ([`ServiceTable::at`]), which stays the service's own while it lives.
#[derive(Debug)]
pub struct ServiceTable<A: Address = Ipv4Addr> {
    by_key: Keyed<SlotKey<A>, ServiceSlot<A>>,
    /// Service id → position in `by_key`.
    by_id: HashMap<u32, u32>,
    /// Services on port 0 (only then does a miss look a second key up).
    port0: usize,
    /// What a flow's packets touch, by service id (dense: one array read
    /// per packet, the handles inline, no hash lookup).
    hot: Vec<Option<Hot>>,
}

/// The handles a service's flows touch per packet or state change: its
/// traffic counters and its connection counts, both with their geometry
/// inline, in one line of their own (a packet reads the line, then the
/// backend's cell: no shared header between).
#[derive(Debug, Clone)]
#[repr(align(64))]
struct Hot {
    stats: TrafficStats,
    counts: ConnCounts,
}

fn key_of<A: Address>(k: &ServiceKey<A>) -> SlotKey<A> {
    (k.vip, l4(k.protocol), k.port)
}

impl<A: Address> Default for ServiceTable<A> {
    fn default() -> Self {
        ServiceTable {
            by_key: Keyed::new(),
            by_id: HashMap::new(),
            port0: 0,
            hot: Vec::new(),
        }
    }
}

impl<A: Address> ServiceTable<A> {
    /// Adds or replaces a service (by key), as worker `worker` applies
    /// it: a new version of the same service takes over this worker's
    /// row of counts and counters (when its arrays are new) and sets the
    /// row's view of every backend id.
    pub fn upsert(&mut self, svc: Arc<CompiledService<A>>, worker: usize) {
        let k = key_of(&svc.key);
        if let Some(old) = self.by_key.get(&k) {
            self.by_id.remove(&old.svc.id);
            if old.svc.id != svc.id {
                if let Some(t) = self.hot.get_mut(old.svc.id as usize) {
                    *t = None;
                }
            } else {
                svc.counts.adopt_row(&old.svc.counts, worker);
                svc.stats.adopt_row(&old.svc.stats, worker);
            }
        }
        svc.stats.set_states(worker, &svc.backends);
        if svc.id < MAX_STATS_ID {
            let i = svc.id as usize;
            if self.hot.len() <= i {
                self.hot.resize(i + 1, None);
            }
            self.hot[i] = Some(Hot {
                stats: svc.stats.clone(),
                counts: svc.counts.clone(),
            });
        }
        let mut sched = svc.scheduler.clone();
        if let Some(old) = self.by_key.get(&k) {
            sched.carry(&old.sched.borrow(), &old.svc.backends, &svc.backends);
        }
        let id = svc.id;
        if self
            .by_key
            .insert(k, ServiceSlot::new(svc, sched, worker))
            .is_none()
            && k.2 == 0
        {
            self.port0 += 1;
        }
        if let Some(pos) = self.by_key.position(&k) {
            self.by_id.insert(id, pos);
        }
    }

    /// Removes a service.
    pub fn remove(&mut self, key: &ServiceKey<A>) {
        if let Some(old) = self.by_key.remove(&key_of(key)) {
            self.port0 -= usize::from(key.port == 0);
            self.by_id.remove(&old.svc.id);
            if let Some(t) = self.hot.get_mut(old.svc.id as usize) {
                *t = None;
            }
        }
    }

    /// The traffic counters of service `id` (still alive or not: flows of
    /// a removed service are no longer counted).
    #[inline]
    pub fn traffic(&self, id: u32) -> Option<&TrafficStats> {
        self.hot.get(id as usize)?.as_ref().map(|h| &h.stats)
    }

    /// The traffic counters and connection counts of service `id`,
    /// alive: from the dense array, or beyond it the slower way, by id
    /// (out of line: the packet path inlines the array read alone).
    #[inline(always)]
    fn handles(&self, id: u32) -> Option<(&TrafficStats, &ConnCounts)> {
        if id < MAX_STATS_ID {
            self.hot_handles(id)
        } else {
            self.handles_by_id(id)
        }
    }

    /// Service `id`'s handles line, if it has one (ids below
    /// [`MAX_STATS_ID`] of live services).
    #[inline(always)]
    fn hot_handles(&self, id: u32) -> Option<(&TrafficStats, &ConnCounts)> {
        let h = self.hot.get(id as usize)?.as_ref()?;
        Some((&h.stats, &h.counts))
    }

    #[inline(never)]
    fn handles_by_id(&self, id: u32) -> Option<(&TrafficStats, &ConnCounts)> {
        self.by_id(id).map(|s| (&s.svc.stats, &s.svc.counts))
    }

    /// The traffic counters and connection counts of the service in
    /// `slot`, as a new flow of it takes them: from the service's handles
    /// line (the flow's insert and every packet of it read that line
    /// anyway), else, beyond the dense array, from the compiled service.
    /// Both are the same cells.
    #[inline(always)]
    pub fn handles_of<'a>(
        &'a self,
        slot: &'a ServiceSlot<A>,
    ) -> (&'a TrafficStats, &'a ConnCounts) {
        self.hot_handles(slot.id)
            .unwrap_or((&slot.svc.stats, &slot.svc.counts))
    }

    /// The connection counts of service `id`, alive.
    #[inline]
    pub fn counts(&self, id: u32) -> Option<&ConnCounts> {
        self.handles(id).map(|(_, c)| c)
    }

    /// Starts fetching the line of service `id`'s handles (a batch's
    /// stage ahead of [`ServiceTable::traffic`] and the counts).
    #[inline]
    pub fn prefetch_handles(&self, id: u32) {
        if let Some(t) = self.hot.get(id as usize) {
            // `Hot` is one aligned line: this is one fetch.
            xvs_conntrack::prefetch_lines(t as *const Option<Hot>);
        }
    }

    /// This worker's view of backend `backend_id` of service `service`:
    /// removed when the service itself is gone.
    #[inline]
    pub fn dest_state(&self, service: u32, worker: usize, backend_id: u32) -> DestState {
        self.handles(service)
            .map_or(DestState::Removed, |(t, _)| t.state(worker, backend_id))
    }

    /// The service for (vip, proto, port), else the port-0 one of the VIP.
    #[inline]
    pub fn find(&self, vip: A, proto: L4Proto, port: u16) -> Option<&ServiceSlot<A>> {
        let h = self.key_hash(vip, proto, port);
        self.at(self.find_hashed(h, vip, proto, port)?)
    }

    /// The hash [`ServiceTable::find_hashed`] takes for (vip, proto, port).
    #[inline(always)]
    pub fn key_hash(&self, vip: A, proto: L4Proto, port: u16) -> u64 {
        self.by_key.hash(&(vip, proto, port))
    }

    /// Starts fetching the bucket of a key's hash (a port-0 fallback,
    /// probed only when some service listens on port 0 and the key itself
    /// is not there, pays its own miss).
    #[inline(always)]
    pub fn prefetch_hash(&self, hash: u64) {
        self.by_key.prefetch(hash);
    }

    /// The position of the service for (vip, proto, port), whose hash is
    /// `hash`, else of the port-0 one of the VIP.
    #[inline(always)]
    pub fn find_hashed(&self, hash: u64, vip: A, proto: L4Proto, port: u16) -> Option<u32> {
        let found = self.by_key.find_hashed(hash, &(vip, proto, port));
        found.or_else(|| self.port0_of(vip, proto, port))
    }

    /// A batch's probe that reads only the bucket of `hash`: the likely
    /// position of its service, to fetch ([`ServiceTable::prefetch_at`])
    /// and then check with [`ServiceTable::confirm`].
    #[inline(always)]
    pub fn candidate(&self, hash: u64) -> Option<u32> {
        self.by_key.candidate(hash)
    }

    /// [`ServiceTable::find_hashed`]'s answer for `key` (vip, proto,
    /// port), given the [`ServiceTable::candidate`] found for it.
    #[inline(always)]
    pub fn confirm(&self, hash: u64, key: SlotKey<A>, candidate: Option<u32>) -> Option<u32> {
        let found = self.by_key.confirm(hash, &key, candidate);
        found.or_else(|| self.port0_of(key.0, key.1, key.2))
    }

    /// The port-0 service of a VIP, for a key without a service.
    #[inline(always)]
    fn port0_of(&self, vip: A, proto: L4Proto, port: u16) -> Option<u32> {
        if self.port0 > 0 && port != 0 {
            self.by_key.position(&(vip, proto, 0))
        } else {
            None
        }
    }

    /// The service at position `pos` (as [`ServiceTable::find_hashed`]
    /// gave it).
    #[inline(always)]
    pub fn at(&self, pos: u32) -> Option<&ServiceSlot<A>> {
        self.by_key.at(pos).map(|(_, s)| s)
    }

    /// The service at `pos` if it is the one for (vip, proto, port): a
    /// position found earlier in the same batch, checked.
    #[inline(always)]
    pub fn at_for(&self, pos: u32, vip: A, proto: L4Proto, port: u16) -> Option<&ServiceSlot<A>> {
        let (&(v, p, o), s) = self.by_key.at(pos)?;
        (v == vip && p == proto && (o == port || o == 0)).then_some(s)
    }

    /// Starts fetching the service slot at `pos`.
    #[inline(always)]
    pub fn prefetch_at(&self, pos: u32) {
        self.by_key.prefetch_at(pos);
    }

    /// The service with id `id`.
    pub fn by_id(&self, id: u32) -> Option<&ServiceSlot<A>> {
        self.at(*self.by_id.get(&id)?)
    }

    /// Number of services.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether there is no service.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Every service.
    pub fn iter(&self) -> impl Iterator<Item = &ServiceSlot<A>> {
        self.by_key.values()
    }
}

/// Routes conntrack's per-backend count changes to the right service's
/// counts, in this worker's row.
/// With `sync`, a flow of this gateway's own that is ended before its
/// time (not an expiry: peers time their copies out themselves) is
/// announced to the peers as deleted.
pub(crate) struct ServiceCounts<'a, A: Address = Ipv4Addr> {
    pub(crate) table: &'a ServiceTable<A>,
    pub(crate) worker: usize,
    pub(crate) sync: Option<&'a crate::sync::SyncQueue>,
}

impl<A: Address> Observer<A> for ServiceCounts<'_, A> {
    fn conn_counts(&mut self, service: u32, backend_id: u32, d_active: i32, d_inactive: i32) {
        if let Some(counts) = self.table.counts(service) {
            counts.add(self.worker, backend_id, d_active, d_inactive);
        }
    }

    fn removed(&mut self, flow: xvs_conntrack::FlowRef<'_, A>, why: xvs_conntrack::Removal) {
        if let Some(q) = self.sync {
            if why != xvs_conntrack::Removal::Expired && !flow.is_peer() {
                q.push(crate::sync::SyncRecord::of(&flow, crate::sync::Op::Delete));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xvs_config::{Backend, ForwardMethod};

    /// What a new flow reads of its compiled service fits the first of
    /// its lines, of either family (IPv6's persistence netmask is the
    /// longest field), and the service starts on a line: a field added
    /// before `id` must keep it so.
    #[test]
    fn what_a_new_flow_reads_of_a_service_is_one_line() {
        use std::net::Ipv6Addr;
        for (hot, align) in [
            (
                CompiledService::<Ipv4Addr>::HOT_BYTES,
                align_of::<CompiledService<Ipv4Addr>>(),
            ),
            (
                CompiledService::<Ipv6Addr>::HOT_BYTES,
                align_of::<CompiledService<Ipv6Addr>>(),
            ),
        ] {
            assert!(hot <= 64 && align == 64, "{hot} bytes, aligned to {align}");
        }
    }

    fn svc(hosts: &[u8]) -> Service<Ipv4Addr> {
        let mut s = Service::new(ServiceKey {
            vip: Ipv4Addr::new(198, 19, 0, 1),
            protocol: Protocol::Tcp,
            port: 80,
        });
        s.backends = hosts
            .iter()
            .map(|&h| Backend {
                address: Ipv4Addr::new(198, 18, 1, h),
                port: 8080,
                weight: 1,
                forward: ForwardMethod::Masq,
                encap: Default::default(),
            })
            .collect();
        s
    }

    fn ids(c: &CompiledService) -> Vec<u32> {
        c.backends.iter().map(|b| b.id).collect()
    }

    #[test]
    fn a_services_handles_fill_one_line_of_their_own() {
        assert_eq!(std::mem::size_of::<Option<Hot>>(), 64);
        assert_eq!(std::mem::align_of::<Option<Hot>>(), 64);
    }

    #[test]
    fn deleting_a_backend_keeps_the_others_ids_and_counters() {
        let v1 = CompiledService::new(7, &svc(&[10, 11, 12]), 2, None);
        assert_eq!(ids(&v1), [0, 1, 2]);
        v1.stats.conn(0, 2);
        v1.counts.add(1, 1, 1, 0);
        let v2 = CompiledService::update(&v1, &svc(&[10, 12]), true, None);
        assert_eq!(ids(&v2), [0, 2], "the third keeps id 2");
        assert_eq!(v2.id, 7);
        assert_eq!(v2.stats.backend(2).conns, 1, "its counters follow it");
        // Backend 11 still has a flow: its id stays reserved.
        let v3 = CompiledService::update(&v2, &svc(&[10, 12, 13]), true, None);
        assert_eq!(ids(&v3), [0, 2, 3]);
        // Added back while reserved: the old id, as IPVS's trash.
        let v4 = CompiledService::update(&v3, &svc(&[10, 11, 12, 13]), true, None);
        assert_eq!(ids(&v4), [0, 1, 2, 3]);
        assert_eq!(v4.counts.active(1), 1);
    }

    #[test]
    fn an_id_is_reused_only_when_settled_and_without_flows() {
        let v1 = CompiledService::new(1, &svc(&[10, 11, 12, 13]), 1, None);
        v1.stats.line(0, 1).unwrap().packet(0, 1000);
        let before = v1.totals();
        let v2 = CompiledService::update(&v1, &svc(&[10, 12, 13]), true, None);
        // Not settled: a worker may still send flows to 11.
        let v3 = CompiledService::update(&v2, &svc(&[10, 12, 13, 14]), false, None);
        assert_eq!(ids(&v3), [0, 2, 3, 4]);
        assert_eq!(v3.stats.backends(), 8, "the arrays grew");
        assert_eq!(v3.totals(), before);
        // Settled and no flow left: 14 would take id 1 now.
        let v4 = CompiledService::update(&v2, &svc(&[10, 12, 13, 14]), true, None);
        assert_eq!(ids(&v4), [0, 2, 3, 1]);
        assert!(v4.stats.backend(1).is_zero(), "the new backend starts at 0");
        assert_eq!(
            v4.totals(),
            before,
            "the service's totals keep the old traffic"
        );
        assert_eq!(v4.ids[1].addr, Ipv4Addr::new(198, 18, 1, 14));
    }

    #[test]
    fn a_worker_adopts_its_row_and_sees_removed_backends() {
        let v1 = Arc::new(CompiledService::new(1, &svc(&[10, 11]), 1, None));
        let mut t = ServiceTable::default();
        t.upsert(v1.clone(), 0);
        v1.counts.add(0, 1, 0, 1);
        v1.stats.conn(0, 1);
        assert_eq!(t.dest_state(1, 0, 1), DestState::Available);
        let mut grown = svc(&[10, 12, 13, 14, 15]);
        grown.backends[0].weight = 0;
        let v2 = Arc::new(CompiledService::update(&v1, &grown, false, None));
        assert!(!v1.counts.same(&v2.counts));
        // The worker's own row moves when it applies the version.
        v1.counts.add(0, 1, 1, -1);
        t.upsert(v2.clone(), 0);
        assert_eq!((v2.counts.active(1), v2.counts.inactive(1)), (1, 0));
        assert_eq!(v2.stats.backend(1).conns, 1);
        assert_eq!(t.dest_state(1, 0, 0), DestState::Quiesced);
        assert_eq!(t.dest_state(1, 0, 1), DestState::Removed);
        assert_eq!(t.dest_state(1, 0, 5), DestState::Available);
        t.remove(&v2.key);
        assert_eq!(t.dest_state(1, 0, 0), DestState::Removed, "service gone");
        // An id beyond the dense counters is found by id.
        let big = Arc::new(CompiledService::new(MAX_STATS_ID + 5, &svc(&[10]), 1, None));
        t.upsert(big, 0);
        assert!(t.traffic(MAX_STATS_ID + 5).is_none());
        assert_eq!(t.dest_state(MAX_STATS_ID + 5, 0, 0), DestState::Available);
        // A new flow of it counts in its own cells all the same.
        let s = t.by_id(MAX_STATS_ID + 5).unwrap();
        let (stats, counts) = t.handles_of(s);
        assert!(stats.same(&s.svc.stats) && counts.same(&s.svc.counts));
    }

    /// A slot keeps, for its worker, what a new flow's batch lookup
    /// fetches with it: the version's backend list itself, and the
    /// addresses of its count cells of the first and the last backend
    /// (the new version's, once a worker applies one whose counts
    /// moved).
    #[test]
    fn a_slot_keeps_what_a_new_flow_reads_after_it_for_its_worker() {
        let v1 = Arc::new(CompiledService::new(1, &svc(&[10, 11, 12]), 2, None));
        let mut t = ServiceTable::default();
        t.upsert(v1.clone(), 1);
        let want = |v: &CompiledService<Ipv4Addr>, first: u32, last: u32| {
            [
                v.counts.cell_addr(1, first) as usize,
                v.counts.cell_addr(1, last) as usize,
            ]
        };
        assert!(Arc::ptr_eq(&t.by_id(1).unwrap().backends, &v1.backends));
        assert_eq!(t.by_id(1).unwrap().ahead, want(&v1, 0, 2));
        assert_ne!(want(&v1, 0, 2), want(&v1, 0, 1), "the last backend's cell");
        let v2 = Arc::new(CompiledService::update(
            &v1,
            &svc(&[10, 12, 13, 14, 15, 16, 17, 18, 19, 20]),
            false,
            None,
        ));
        assert!(!v1.counts.same(&v2.counts));
        t.upsert(v2.clone(), 1);
        let last = v2.backends.last().unwrap().id;
        assert!(Arc::ptr_eq(&t.by_id(1).unwrap().backends, &v2.backends));
        assert_eq!(t.by_id(1).unwrap().ahead, want(&v2, 0, last));
        // A new flow counts in the new version's cells, which the
        // handles line now holds.
        let (stats, counts) = t.handles_of(t.by_id(1).unwrap());
        assert!(counts.same(&v2.counts) && stats.same(&v2.stats));
    }

    /// An IPv4 service's entry in a worker's table is two lines, and its
    /// key and everything the batch's lookup reads of its slot (all but
    /// the scheduler's state) share the first.
    #[test]
    fn a_service_s_entry_is_two_lines_its_key_with_what_the_batch_reads() {
        type Table = Keyed<SlotKey<Ipv4Addr>, ServiceSlot<Ipv4Addr>>;
        assert_eq!(Table::ENTRY_BYTES, 128);
        let batch_reads = std::mem::offset_of!(ServiceSlot<Ipv4Addr>, sched);
        assert!(size_of::<SlotKey<Ipv4Addr>>() + batch_reads <= 64);
    }

    /// A slot answers for persistence and client ranges as its compiled
    /// service does, from its own flags when the service has neither,
    /// and follows a new version that adds or drops them.
    #[test]
    fn a_slot_persists_and_filters_as_its_service_does() {
        let client = Ipv4Addr::new(198, 18, 0, 7);
        let mut plain = svc(&[10]);
        let v1 = Arc::new(CompiledService::new(1, &plain, 1, None));
        let mut t = ServiceTable::default();
        t.upsert(v1.clone(), 0);
        let s = t.by_id(1).unwrap();
        assert!(s.allows(client) && s.persist().is_none());
        plain.persistence = Some(Default::default());
        plain.source_ranges = vec!["198.18.1.0/24".parse().unwrap()];
        let v2 = Arc::new(CompiledService::update(&v1, &plain, false, None));
        t.upsert(v2.clone(), 0);
        let s = t.by_id(1).unwrap();
        assert!(!s.allows(client));
        assert!(s.allows(Ipv4Addr::new(198, 18, 1, 9)));
        assert_eq!(
            s.persist().map(|p| p.timeout),
            v2.persist.map(|p| p.timeout)
        );
        assert!(s.persist().is_some());
        let v3 = Arc::new(CompiledService::update(&v2, &svc(&[10]), false, None));
        t.upsert(v3, 0);
        let s = t.by_id(1).unwrap();
        assert!(s.allows(client) && s.persist().is_none());
    }

    /// A key finds its own service, else its VIP's port-0 one, the same
    /// by `find` and by the batch's hash-then-probe; a position stays its
    /// service's through a new version, and `at_for` accepts it only for
    /// a key that service serves.
    #[test]
    fn a_key_finds_its_service_or_the_vips_port_0_one() {
        let vip = Ipv4Addr::new(198, 19, 0, 1);
        let on = |id: u32, port: u16| {
            let mut s = svc(&[10]);
            s.key.port = port;
            Arc::new(CompiledService::new(id, &s, 1, None))
        };
        let mut t = ServiceTable::default();
        let both = |t: &ServiceTable, port: u16| {
            let by_find = t.find(vip, L4Proto::Tcp, port).map(|s| s.id);
            let h = t.key_hash(vip, L4Proto::Tcp, port);
            let pos = t.find_hashed(h, vip, L4Proto::Tcp, port);
            assert_eq!(
                pos.and_then(|p| t.at(p)).map(|s| s.id),
                by_find,
                "port {port}"
            );
            let key = (vip, L4Proto::Tcp, port);
            assert_eq!(t.confirm(h, key, t.candidate(h)), pos, "port {port}");
            by_find
        };
        t.upsert(on(1, 80), 0);
        assert_eq!((both(&t, 80), both(&t, 81)), (Some(1), None));
        t.upsert(on(2, 0), 0);
        assert_eq!(
            (both(&t, 80), both(&t, 81), both(&t, 0)),
            (Some(1), Some(2), Some(2))
        );
        let pos = t.find_hashed(t.key_hash(vip, L4Proto::Tcp, 81), vip, L4Proto::Tcp, 81);
        let pos = pos.unwrap();
        assert!(t.at_for(pos, vip, L4Proto::Tcp, 81).is_some());
        assert!(t.at_for(pos, vip, L4Proto::Udp, 81).is_none());
        assert!(t
            .at_for(pos, Ipv4Addr::new(198, 19, 0, 2), L4Proto::Tcp, 81)
            .is_none());
        // A new version keeps the position; the id finds it.
        t.upsert(on(2, 0), 0);
        assert_eq!(t.at(pos).map(|s| s.id), Some(2));
        assert_eq!(t.by_id(2).map(|s| s.svc.key.port), Some(0));
        let port0 = on(2, 0).key;
        t.remove(&port0);
        assert_eq!((both(&t, 80), both(&t, 81)), (Some(1), None));
        assert!(t.at(pos).is_none() && t.by_id(2).is_none());
        // Many services: the index grows and finds every one.
        for i in 0..5000u32 {
            let mut s = svc(&[10]);
            s.key.vip = Ipv4Addr::from(0xc613_0000 + i + 10);
            t.upsert(Arc::new(CompiledService::new(10 + i, &s, 1, None)), 0);
        }
        assert_eq!(t.len(), 5001);
        for i in 0..5000u32 {
            let a = Ipv4Addr::from(0xc613_0000 + i + 10);
            assert_eq!(t.find(a, L4Proto::Tcp, 80).map(|s| s.id), Some(10 + i));
            assert!(t.find(a, L4Proto::Tcp, 81).is_none());
        }
    }
}
