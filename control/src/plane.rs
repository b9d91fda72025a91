//! The data plane as the control plane uses it: the [`Plane`] trait. The
//! running AF_XDP [`Dataplane`] implements it; so does [`Recorder`], an
//! in-memory plane that compiles services as the real one does and
//! records every change sent to it, so the engine's reconcile, reload,
//! runtime edits and source merging are tested without root.
//!
//! Invariant: a `Plane` lives and is driven on one thread (the engine's:
//! the AF_XDP one holds libbpf objects that may not move); what it
//! reads back (`services`, `counters`, `dump`, ...) is what it was sent,
//! as the workers have it or are about to.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xvs_config::{ConnRules, Family, Service, ServiceKey, UnknownPort};
use xvs_conntrack::{Filter, FlowInfo, Timeouts};
use xvs_dataplane::counters::CountersReading;
use xvs_dataplane::events::FlowEvents;
use xvs_dataplane::runtime::Dataplane;
use xvs_dataplane::services::AnyService;
use xvs_dataplane::steer::SteerError;
use xvs_dataplane::worker::Snapshot;

/// Why the data plane could not take a change.
#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    /// The steering program's map refused an address.
    #[error("steering: {0}")]
    Steering(#[from] SteerError),
    /// This plane cannot do that.
    #[error("{0}")]
    Unsupported(String),
}

/// What the engine needs of a data plane.
pub trait Plane {
    /// Adds or replaces a service on every worker (by its key).
    fn upsert_service(&mut self, svc: &Service) -> Result<(), PlaneError>;
    /// Removes a service; the last one of a VIP releases the VIP.
    fn remove_service(&mut self, key: ServiceKey) -> Result<(), PlaneError>;
    /// Sets the conntrack timeouts on every worker.
    fn set_timeouts(&mut self, t: Timeouts);
    /// Sets IPVS's reuse and removal rules and the unknown-port policy.
    fn set_rules(&mut self, rules: ConnRules, unknown_port: UnknownPort);
    /// Waits until every worker applied what was sent (false after
    /// `timeout`).
    fn wait_applied(&self, timeout: Duration) -> bool;
    /// The services as compiled for the workers, with their counts (by
    /// reference: the estimator reads every one every 2 seconds).
    fn services(&self) -> Box<dyn Iterator<Item = &AnyService> + '_>;
    /// The addresses the steering program hands over, read back (with
    /// whether each is shared with the host).
    fn steered(&self) -> Result<Vec<(IpAddr, bool)>, PlaneError>;
    /// Every worker's flow event queue.
    fn events(&self) -> Vec<Arc<FlowEvents>>;
    /// The interface(s) served, for messages.
    fn interface(&self) -> String;
    /// Every worker's counters.
    fn counters(&self) -> Vec<CountersReading>;
    /// The flows matching `filter` (of `family` only, when given).
    fn dump(&self, filter: Filter<IpAddr>, family: Option<Family>) -> Vec<FlowInfo<IpAddr>>;
    /// Deletes the flows matching `filter`; how many.
    fn delete(&self, filter: Filter<IpAddr>, family: Option<Family>) -> u64;
    /// Deletes every flow; how many.
    fn flush(&self) -> u64;
    /// Every worker's snapshot.
    fn snapshots(&self) -> Vec<Snapshot>;
    /// Stops the workers; their last snapshots.
    fn stop(self: Box<Self>) -> Vec<Snapshot>;
    /// Adopts the flows an earlier instance left, now that the services
    /// are in; false when there was nothing left to do (adoption done at
    /// start, or a plane without state).
    fn adopt(&mut self) -> Result<bool, PlaneError> {
        Ok(false)
    }
    /// Flow synchronisation's state (none: not configured, the default).
    fn sync_state(&self) -> Option<xvs_dataplane::runtime::SyncState> {
        None
    }
    /// Takes over `node`'s addresses (every peer's when `None`; a backup
    /// also starts serving its own); the addresses it serves now that it
    /// did not before.
    fn take_over(&mut self, _node: Option<u32>) -> Result<Vec<IpAddr>, PlaneError> {
        Err(PlaneError::Unsupported(
            "flow synchronisation is not configured ([cluster.sync])".into(),
        ))
    }
    /// What the start took over from an earlier instance (none by
    /// default: a plane without a predecessor).
    fn restart(&self) -> crate::api::RestartView {
        crate::api::RestartView::default()
    }
    /// Where the data plane runs (nothing known by default).
    fn layout(&self) -> xvs_dataplane::runtime::Layout {
        xvs_dataplane::runtime::Layout::default()
    }
}

impl Plane for Dataplane {
    fn layout(&self) -> xvs_dataplane::runtime::Layout {
        Dataplane::layout(self)
    }
    fn adopt(&mut self) -> Result<bool, PlaneError> {
        Ok(Dataplane::adopt(self)?)
    }
    fn sync_state(&self) -> Option<xvs_dataplane::runtime::SyncState> {
        Dataplane::sync_state(self)
    }
    fn take_over(&mut self, node: Option<u32>) -> Result<Vec<IpAddr>, PlaneError> {
        if self.sync_state().is_none() {
            return Err(PlaneError::Unsupported(
                "flow synchronisation is not configured ([cluster.sync])".into(),
            ));
        }
        Ok(Dataplane::take_over(self, node)?)
    }
    fn restart(&self) -> crate::api::RestartView {
        let mut v = crate::api::RestartView::default();
        for r in self.restored() {
            v.adopted_flows += u64::from(r.adopted.flows);
            v.adopted_templates += u64::from(r.adopted.templates);
            v.adopted_dropped += u64::from(r.adopted.dropped);
            for f in r.file.iter().chain(&r.file6) {
                v.state_files.push(f.display().to_string());
            }
            if let Some(why) = &r.plain_pages {
                v.plain_pages = Some(why.clone());
            }
            if let Some(why) = &r.fresh {
                v.started_empty.push(format!("worker {}: {why}", r.worker));
            }
        }
        for t in self.takeovers() {
            v.replaced_programs.extend(t.previous);
            v.held_packets += t.held;
        }
        v.programs = self.program_ids().into_iter().flatten().collect();
        v
    }
    fn upsert_service(&mut self, svc: &Service) -> Result<(), PlaneError> {
        Ok(Dataplane::upsert_service(self, svc)?)
    }
    fn remove_service(&mut self, key: ServiceKey) -> Result<(), PlaneError> {
        Ok(Dataplane::remove_service(self, key)?)
    }
    fn set_timeouts(&mut self, t: Timeouts) {
        self.handle().set_timeouts(t);
    }
    fn set_rules(&mut self, rules: ConnRules, unknown_port: UnknownPort) {
        self.handle().set_rules(rules, unknown_port);
    }
    fn wait_applied(&self, timeout: Duration) -> bool {
        self.handle().wait_applied(timeout)
    }
    fn services(&self) -> Box<dyn Iterator<Item = &AnyService> + '_> {
        Box::new(Dataplane::services(self))
    }
    fn steered(&self) -> Result<Vec<(IpAddr, bool)>, PlaneError> {
        Ok(Dataplane::steered(self)?)
    }
    fn events(&self) -> Vec<Arc<FlowEvents>> {
        Dataplane::events(self).to_vec()
    }
    fn interface(&self) -> String {
        Dataplane::interface(self).to_owned()
    }
    fn counters(&self) -> Vec<CountersReading> {
        self.handle().counters()
    }
    fn dump(&self, filter: Filter<IpAddr>, family: Option<Family>) -> Vec<FlowInfo<IpAddr>> {
        self.handle().dump(filter, family)
    }
    fn delete(&self, filter: Filter<IpAddr>, family: Option<Family>) -> u64 {
        self.handle().delete(filter, family)
    }
    fn flush(&self) -> u64 {
        self.handle().flush()
    }
    fn snapshots(&self) -> Vec<Snapshot> {
        self.handle().snapshots()
    }
    fn stop(self: Box<Self>) -> Vec<Snapshot> {
        Dataplane::stop(*self)
    }
}

/// One change a [`Recorder`] was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// A service added or replaced.
    Upsert(ServiceKey),
    /// A service removed.
    Remove(ServiceKey),
    /// Timeouts.
    Timeouts(Timeouts),
    /// Rules and the unknown-port policy.
    Rules(ConnRules, UnknownPort),
}

/// An in-memory plane: services compiled as the real data plane compiles
/// them (stable backend ids, counts), no workers, no flows; every change
/// it is sent is appended to a log the test keeps a handle on.
pub struct Recorder {
    compiled: BTreeMap<ServiceKey, AnyService>,
    next_id: u32,
    workers: usize,
    log: Arc<Mutex<Vec<Sent>>>,
}

impl Recorder {
    /// An empty plane with `workers` (virtual) workers, already holding
    /// `services` (as a started data plane does), and the log it writes.
    pub fn new(services: &[Service], workers: usize) -> (Recorder, Arc<Mutex<Vec<Sent>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut r = Recorder {
            compiled: BTreeMap::new(),
            next_id: 1,
            workers,
            log: log.clone(),
        };
        for s in services {
            r.compile(s);
        }
        (r, log)
    }

    fn compile(&mut self, svc: &Service) {
        let prev = self.compiled.get(&svc.key);
        if prev.is_none() {
            self.next_id += 1;
        }
        let seed = xvs_config::DEFAULT_HASH_SEED;
        if let Some(c) =
            AnyService::compile(self.next_id - 1, svc, prev, (self.workers, true), seed)
        {
            self.compiled.insert(svc.key, c);
        }
    }

    fn record(&self, s: Sent) {
        if let Ok(mut l) = self.log.lock() {
            l.push(s);
        }
    }
}

impl Plane for Recorder {
    fn upsert_service(&mut self, svc: &Service) -> Result<(), PlaneError> {
        self.compile(svc);
        self.record(Sent::Upsert(svc.key));
        Ok(())
    }
    fn remove_service(&mut self, key: ServiceKey) -> Result<(), PlaneError> {
        self.compiled.remove(&key);
        self.record(Sent::Remove(key));
        Ok(())
    }
    fn set_timeouts(&mut self, t: Timeouts) {
        self.record(Sent::Timeouts(t));
    }
    fn set_rules(&mut self, rules: ConnRules, unknown_port: UnknownPort) {
        self.record(Sent::Rules(rules, unknown_port));
    }
    fn wait_applied(&self, _: Duration) -> bool {
        true
    }
    fn services(&self) -> Box<dyn Iterator<Item = &AnyService> + '_> {
        Box::new(self.compiled.values())
    }
    fn steered(&self) -> Result<Vec<(IpAddr, bool)>, PlaneError> {
        let mut v: Vec<(IpAddr, bool)> = self.compiled.keys().map(|k| (k.vip, false)).collect();
        v.dedup();
        Ok(v)
    }
    fn events(&self) -> Vec<Arc<FlowEvents>> {
        Vec::new()
    }
    fn interface(&self) -> String {
        "recorder".into()
    }
    fn counters(&self) -> Vec<CountersReading> {
        Vec::new()
    }
    fn dump(&self, _: Filter<IpAddr>, _: Option<Family>) -> Vec<FlowInfo<IpAddr>> {
        Vec::new()
    }
    fn delete(&self, _: Filter<IpAddr>, _: Option<Family>) -> u64 {
        0
    }
    fn flush(&self) -> u64 {
        0
    }
    fn snapshots(&self) -> Vec<Snapshot> {
        Vec::new()
    }
    fn stop(self: Box<Self>) -> Vec<Snapshot> {
        Vec::new()
    }
}
