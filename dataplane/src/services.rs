//! The service table a worker looks new flows up in: (VIP, protocol, port)
//! → the compiled service (backends, scheduler, counts, persistence, source
//! ACL), in a hash map, so the cost does not depend on the number of
//! services.
//!
//! A service is compiled once by the control plane ([`CompiledService::new`],
//! O(that service): the Maglev table is built here) and shared by every
//! worker through an `Arc`; each worker keeps its own copy of the
//! scheduler's state (cursors, random generator). Replacing one service
//! touches only its entry. Invariant: backend ids are indexes into the
//! service's `backends` and its `counts`.

use std::net::Ipv4Addr;
use std::sync::Arc;

use hashbrown::HashMap;
use ipnet::Ipv4Net;
use xvs_config::{Protocol, Service, ServiceKey};
use xvs_conntrack::{Endpoint, L4Proto, Observer};

use crate::sched::{ConnCounts, MaglevParams, Persist, SchedBackend, Scheduler, DEFAULT_SEED};
use crate::traffic::TrafficStats;

/// Service ids above this get no per-packet traffic counters (the
/// counters are found by id in a dense array).
const MAX_STATS_ID: u32 = 1 << 24;

/// A service ready for the data plane.
#[derive(Debug)]
pub struct CompiledService {
    /// Id, unique among live services.
    pub id: u32,
    /// What identifies it.
    pub key: ServiceKey,
    /// Backends (ids are their indexes).
    pub backends: Vec<SchedBackend>,
    /// The scheduler as built; workers clone it.
    pub scheduler: Scheduler,
    /// Global connection counts of its backends.
    pub counts: Arc<ConnCounts>,
    /// Traffic counters of its backends (`--stats`).
    pub stats: TrafficStats,
    /// Client persistence.
    pub persist: Option<Persist>,
    /// Allowed client ranges (empty = all).
    pub source_ranges: Vec<Ipv4Net>,
}

/// The L4 protocol of a service.
pub fn l4(p: Protocol) -> L4Proto {
    match p {
        Protocol::Tcp => L4Proto::Tcp,
        Protocol::Udp => L4Proto::Udp,
    }
}

impl CompiledService {
    /// Compiles `svc` for `workers` workers.
    pub fn new(
        id: u32,
        svc: &Service,
        workers: usize,
        maglev_seed: Option<u64>,
    ) -> CompiledService {
        let backends: Vec<SchedBackend> = svc
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| SchedBackend {
                id: i as u32,
                endpoint: Endpoint {
                    addr: b.address,
                    port: b.port,
                },
                weight: b.weight,
            })
            .collect();
        let maglev = MaglevParams {
            size: svc.maglev_table_size(),
            seed: maglev_seed.unwrap_or(DEFAULT_SEED),
        };
        let scheduler = Scheduler::new(svc.scheduler, svc.flags, &backends, maglev, u64::from(id));
        CompiledService {
            id,
            key: svc.key,
            counts: ConnCounts::new(workers, backends.len()),
            stats: TrafficStats::new(workers, backends.len()),
            backends,
            scheduler,
            persist: svc.persistence.map(|p| Persist {
                service: id,
                proto: l4(svc.key.protocol),
                timeout: p.timeout_secs,
                netmask: p.netmask,
            }),
            source_ranges: svc.source_ranges.clone(),
        }
    }

    /// Keeps `prev`'s connection counts and traffic counters when the
    /// backends are the same endpoints in the same order (an edit of
    /// weights, scheduler or persistence): flows of `prev` keep reporting
    /// to the counts the scheduler reads. Otherwise they start at zero.
    pub fn carry_over(&mut self, prev: &CompiledService) {
        let same = prev.backends.len() == self.backends.len()
            && prev
                .backends
                .iter()
                .zip(&self.backends)
                .all(|(a, b)| a.endpoint == b.endpoint);
        if same {
            self.counts = prev.counts.clone();
            self.stats = prev.stats.clone();
        }
    }

    /// Whether a client may use the service.
    pub fn allows(&self, client: Ipv4Addr) -> bool {
        self.source_ranges.is_empty() || self.source_ranges.iter().any(|n| n.contains(&client))
    }

    /// Whether new TCP flows may start mid-connection (Maglev: a flow that
    /// moved here from another gateway maps to the same backend).
    pub fn adopts_midflow(&self) -> bool {
        matches!(self.scheduler, Scheduler::Maglev(_))
    }
}

/// One worker's view of a service.
#[derive(Debug)]
pub struct ServiceSlot {
    /// The shared compiled service.
    pub svc: Arc<CompiledService>,
    /// This worker's scheduler state.
    pub sched: Scheduler,
}

/// A worker's service table.
#[derive(Debug, Default)]
pub struct ServiceTable {
    by_key: HashMap<(Ipv4Addr, L4Proto, u16), ServiceSlot>,
    by_id: HashMap<u32, (Ipv4Addr, L4Proto, u16)>,
    /// Traffic counters by service id (dense: one array index per packet,
    /// the handle inline).
    traffic: Vec<Option<TrafficStats>>,
}

fn key_of(k: &ServiceKey) -> (Ipv4Addr, L4Proto, u16) {
    (k.vip, l4(k.protocol), k.port)
}

impl ServiceTable {
    /// Adds or replaces a service (by key).
    pub fn upsert(&mut self, svc: Arc<CompiledService>) {
        let k = key_of(&svc.key);
        if let Some(old) = self.by_key.get(&k) {
            self.by_id.remove(&old.svc.id);
            if old.svc.id != svc.id {
                if let Some(t) = self.traffic.get_mut(old.svc.id as usize) {
                    *t = None;
                }
            }
        }
        self.by_id.insert(svc.id, k);
        if svc.id < MAX_STATS_ID {
            let i = svc.id as usize;
            if self.traffic.len() <= i {
                self.traffic.resize(i + 1, None);
            }
            self.traffic[i] = Some(svc.stats.clone());
        }
        let sched = svc.scheduler.clone();
        self.by_key.insert(k, ServiceSlot { svc, sched });
    }

    /// Removes a service.
    pub fn remove(&mut self, key: &ServiceKey) {
        if let Some(old) = self.by_key.remove(&key_of(key)) {
            self.by_id.remove(&old.svc.id);
            if let Some(t) = self.traffic.get_mut(old.svc.id as usize) {
                *t = None;
            }
        }
    }

    /// The traffic counters of service `id` (still alive or not: flows of
    /// a removed service are no longer counted).
    #[inline]
    pub fn traffic(&self, id: u32) -> Option<&TrafficStats> {
        self.traffic.get(id as usize)?.as_ref()
    }

    /// The service for (vip, proto, port), else the port-0 one of the VIP.
    #[inline]
    pub fn find(&mut self, vip: Ipv4Addr, proto: L4Proto, port: u16) -> Option<&mut ServiceSlot> {
        if self.by_key.contains_key(&(vip, proto, port)) {
            return self.by_key.get_mut(&(vip, proto, port));
        }
        self.by_key.get_mut(&(vip, proto, 0))
    }

    /// The service with id `id`.
    pub fn by_id(&self, id: u32) -> Option<&ServiceSlot> {
        self.by_key.get(self.by_id.get(&id)?)
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
    pub fn iter(&self) -> impl Iterator<Item = &ServiceSlot> {
        self.by_key.values()
    }
}

/// Routes conntrack's per-backend count changes to the right service's
/// counts, in this worker's row.
pub(crate) struct ServiceCounts<'a> {
    pub(crate) table: &'a ServiceTable,
    pub(crate) worker: usize,
}

impl Observer for ServiceCounts<'_> {
    fn conn_counts(&mut self, service: u32, backend_id: u32, d_active: i32, d_inactive: i32) {
        if let Some(slot) = self.table.by_id(service) {
            slot.svc
                .counts
                .add(self.worker, backend_id, d_active, d_inactive);
        }
    }
}
