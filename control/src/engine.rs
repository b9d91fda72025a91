//! The reconciler: what the data plane should serve (the config file's
//! services plus runtime edits) against what it has, sent as the
//! difference only. It owns the running data plane (a [`crate::plane::Plane`]) on one thread;
//! everything else talks to it through [`EngineHandle`] (a job queue), so
//! the data plane's handles never cross threads.
//!
//! Invariants: `applied` is exactly what was last sent to the workers; a
//! reload or an edit that does not validate changes nothing (the error is
//! kept for `/v1/status` and returned); a reload sends one update per
//! added or changed service and one removal per removed service, and
//! nothing for the others, so their flows and counts are untouched.
//!
//! Health: a backend its health check found down is sent with weight 0
//! (its flows finish, no new ones), as keepalived sets IPVS weights;
//! `applied` keeps the configured weight, so the file's services compare
//! as written and a backend that comes back gets its weight again.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::plane::{Plane, PlaneError};
use xvs_config::{Backend, Config, Scheduler, Service, ServiceKey};

/// One change to the service set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Added or replaced.
    Upsert(Service),
    /// Removed.
    Remove(ServiceKey),
}

/// The changes that turn `applied` into `desired` (by key; a service that
/// compares equal is left alone).
pub fn diff(
    applied: &BTreeMap<ServiceKey, Service>,
    desired: &BTreeMap<ServiceKey, Service>,
) -> Vec<Change> {
    let mut out = Vec::new();
    for (k, s) in desired {
        if applied.get(k) != Some(s) {
            out.push(Change::Upsert(s.clone()));
        }
    }
    for k in applied.keys() {
        if !desired.contains_key(k) {
            out.push(Change::Remove(*k));
        }
    }
    out
}

/// What a reconcile did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    /// Services added.
    pub added: usize,
    /// Services changed.
    pub changed: usize,
    /// Services removed.
    pub removed: usize,
    /// Services left alone.
    pub unchanged: usize,
    /// Seconds until every worker had the changes (when waited for).
    #[serde(default)]
    pub applied_seconds: Option<f64>,
}

/// A runtime edit, ipvsadm's commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// `-A`: a new service (no backends yet).
    AddService(Service),
    /// `-E`: scheduler, flags, persistence of an existing one; see
    /// [`edited`] for what it keeps.
    EditService(Service),
    /// `-D`.
    DeleteService(ServiceKey),
    /// `-a`.
    AddBackend(ServiceKey, Backend),
    /// `-e`.
    EditBackend(ServiceKey, Backend),
    /// `-d`.
    DeleteBackend(ServiceKey, IpAddr, u16),
    /// `-C`.
    Clear,
    /// Several edits as one (`xvsadm -R`): applied in order to a copy,
    /// then all at once, or none of them.
    Batch(Vec<Edit>),
}

/// Why an edit or a reload was refused (the kinds ipvsadm's messages
/// distinguish; the text says which service or destination).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The service or file breaks a rule.
    #[error("{0}")]
    Invalid(String),
    /// The service does not exist.
    #[error("{0}")]
    NoService(String),
    /// The destination does not exist.
    #[error("{0}")]
    NoDestination(String),
    /// The service exists already.
    #[error("{0}")]
    ServiceExists(String),
    /// The destination exists already.
    #[error("{0}")]
    DestinationExists(String),
    /// Edit number `.0` (from 0) of a batch was refused.
    #[error("edit {n}: {1}", n = .0 + 1)]
    InBatch(usize, Box<Refused>),
}

impl Refused {
    /// The kind's name in the API's error answers (`kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Refused::Invalid(_) => "invalid",
            Refused::NoService(_) => "no_service",
            Refused::NoDestination(_) => "no_destination",
            Refused::ServiceExists(_) => "service_exists",
            Refused::DestinationExists(_) => "destination_exists",
            Refused::InBatch(_, r) => r.kind(),
        }
    }
}

/// Service `cur` after `-E` with `s`: scheduler, flags and persistence
/// are `s`'s, as ipvsadm's `-E` replaces them; what ipvsadm cannot say
/// is kept unless `s` gives it: the backends (always kept), the source
/// ranges, the name, and the Maglev table size while the scheduler stays
/// mh.
pub fn edited(cur: Service, s: Service) -> Service {
    let both_mh = cur.scheduler == Scheduler::Mh && s.scheduler == Scheduler::Mh;
    Service {
        backends: cur.backends,
        source_ranges: if s.source_ranges.is_empty() {
            cur.source_ranges
        } else {
            s.source_ranges
        },
        name: s.name.or(cur.name),
        maglev_table_size: s
            .maglev_table_size
            .or(cur.maglev_table_size.filter(|_| both_mh)),
        ..s
    }
}

/// The services a batch of edits has touched so far: `None` = removed.
/// Everything else is as `applied` has it (unless `cleared`).
#[derive(Debug, Default)]
struct Plan {
    touched: BTreeMap<ServiceKey, Option<Service>>,
    cleared: bool,
}

/// Formats a key like ipvsadm: `TCP 198.19.0.1:80`.
pub fn key_name(k: &ServiceKey) -> String {
    format!(
        "{} {}",
        k.protocol.name().to_uppercase(),
        xvs_config::HostPort(k.vip, k.port)
    )
}

/// The state the engine thread owns.
pub struct Engine {
    dp: Box<dyn Plane>,
    path: PathBuf,
    /// The config in force (its services are `applied`).
    config: Config,
    applied: BTreeMap<ServiceKey, Service>,
    last_error: Option<String>,
    reloads: u64,
    /// The Kubernetes source's services (those it owns).
    kube: BTreeMap<ServiceKey, Service>,
    /// Everything the Kubernetes source last asked for, owned or not: a
    /// key the file gives up on reload goes to Kubernetes then, without
    /// waiting for its next update.
    kube_wanted: BTreeMap<ServiceKey, Service>,
    /// Keys both sources want, kept by their first owner.
    conflicts: Vec<String>,
    /// Counters `-Z` zeroed (the listing counts from there).
    zeroed: crate::stats::Zeroed,
    /// When the first update of the latest reconcile was sent.
    #[allow(clippy::disallowed_types)] // the control -> data latency is wall-clock time
    sent_at: Option<std::time::Instant>,
    /// Backends (service, address, port) their health check found down.
    down: std::collections::BTreeSet<(ServiceKey, IpAddr, u16)>,
}

fn by_key(services: &[Service]) -> BTreeMap<ServiceKey, Service> {
    services.iter().map(|s| (s.key, s.clone())).collect()
}

impl Engine {
    /// Wraps a started data plane serving `config` (read from `path`).
    pub fn new(dp: Box<dyn Plane>, path: &Path, config: Config) -> Engine {
        Engine {
            dp,
            path: path.to_owned(),
            applied: by_key(&config.services),
            config,
            last_error: None,
            reloads: 0,
            kube: BTreeMap::new(),
            kube_wanted: BTreeMap::new(),
            conflicts: Vec::new(),
            zeroed: Default::default(),
            sent_at: None,
            down: Default::default(),
        }
    }

    /// `s` as the data plane gets it: the backends found down at weight 0.
    fn effective(&self, s: &Service) -> Service {
        let mut out = s.clone();
        for b in &mut out.backends {
            if self.down.contains(&(s.key, b.address, b.port)) {
                b.weight = 0;
            }
        }
        out
    }

    /// Whether the backend `address:port` of `key` was found down.
    pub fn is_down(&self, key: &ServiceKey, address: IpAddr, port: u16) -> bool {
        self.down.contains(&(*key, address, port))
    }

    /// Records a health check's verdict on a backend; when it changes
    /// what the data plane has, sends that one service again (its other
    /// backends, and every other service, untouched). Returns whether the
    /// verdict changed anything.
    pub fn set_health(&mut self, key: ServiceKey, address: IpAddr, port: u16, up: bool) -> bool {
        let changed = if up {
            self.down.remove(&(key, address, port))
        } else {
            self.down.insert((key, address, port))
        };
        let Some(s) = self.applied.get(&key).filter(|_| changed) else {
            return changed;
        };
        if !s
            .backends
            .iter()
            .any(|b| b.address == address && b.port == port)
        {
            return changed;
        }
        let sent = self.effective(s);
        if let Err(e) = self.dp.upsert_service(&sent) {
            tracing::error!("{}: health change not applied: {e}", key_name(&key));
        }
        changed
    }

    /// The data plane.
    pub fn dataplane(&self) -> &dyn Plane {
        self.dp.as_ref()
    }

    /// Takes over `node`'s addresses (see [`Plane::take_over`]).
    pub fn take_over(&mut self, node: Option<u32>) -> Result<Vec<IpAddr>, PlaneError> {
        self.dp.take_over(node)
    }

    /// Adopts the flows an earlier instance left (once; later calls do
    /// nothing) and logs what was taken over.
    pub fn adopt(&mut self) {
        match self.dp.adopt() {
            Ok(true) => log_adopted(&self.dp.restart()),
            Ok(false) => {}
            Err(e) => tracing::error!("adopting the flow state: {e}"),
        }
    }

    /// The config file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until every worker applied what was sent; returns the
    /// seconds from the first update sent by the latest reconcile to the
    /// last worker applying everything (`None` if nothing was sent, or
    /// after 1 s: a worker is stuck).
    pub fn wait_applied(&mut self) -> Option<f64> {
        let start = self.sent_at.take()?;
        self.dp
            .wait_applied(Duration::from_secs(1))
            .then(|| start.elapsed().as_secs_f64())
    }

    /// The config in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The services in force.
    pub fn applied(&self) -> &BTreeMap<ServiceKey, Service> {
        &self.applied
    }

    /// `-Z`: zeroes the listing's counters of `key`, or of every service.
    pub fn zero(&mut self, key: Option<ServiceKey>) -> Result<(), Refused> {
        if let Some(k) = &key {
            if !self.applied.contains_key(k) {
                return Err(Refused::NoService(format!(
                    "{}: no such service",
                    key_name(k)
                )));
            }
        }
        let samples = crate::stats::sample(self);
        self.zeroed.zero(&samples, key.as_ref());
        Ok(())
    }

    /// What `-Z` zeroed.
    pub fn zeroed(&self) -> &crate::stats::Zeroed {
        &self.zeroed
    }

    /// The last refused reload or edit, if the latest one was refused.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Successful reloads so far.
    pub fn reloads(&self) -> u64 {
        self.reloads
    }

    /// Makes `desired` the service set: sends only the difference.
    fn reconcile(&mut self, desired: BTreeMap<ServiceKey, Service>) -> Result<Applied, Refused> {
        // After apply, applied == desired: apply's count of the unchanged
        // ones holds.
        self.apply(&diff(&self.applied, &desired))
    }

    /// Sends `changes` to the workers and records them as applied.
    fn apply(&mut self, changes: &[Change]) -> Result<Applied, Refused> {
        if !changes.is_empty() {
            #[allow(clippy::disallowed_types)]
            let now = std::time::Instant::now();
            self.sent_at = Some(now);
        }
        let mut a = Applied::default();
        for c in changes {
            match c {
                Change::Upsert(s) => {
                    if self.applied.contains_key(&s.key) {
                        a.changed += 1;
                    } else {
                        a.added += 1;
                    }
                    self.dp
                        .upsert_service(&self.effective(s))
                        .map_err(|e| Refused::Invalid(format!("{}: {e}", key_name(&s.key))))?;
                    self.zeroed.keep_backends(s);
                    self.applied.insert(s.key, s.clone());
                }
                Change::Remove(k) => {
                    a.removed += 1;
                    if let Err(e) = self.dp.remove_service(*k) {
                        tracing::error!(
                            "{}: removed, but its VIP was not released: {e}",
                            key_name(k)
                        );
                    }
                    self.zeroed.forget(k);
                    self.applied.remove(k);
                }
            }
        }
        a.unchanged = self.applied.len() - a.added - a.changed;
        Ok(a)
    }

    /// Reads the file again and applies its services. An invalid file,
    /// or one that changes what needs a restart (interfaces, SNAT,
    /// conntrack), changes nothing.
    pub fn reload(&mut self) -> Result<Applied, Refused> {
        let r = self.try_reload();
        match &r {
            Ok(_) => {
                self.last_error = None;
                self.reloads += 1;
            }
            Err(e) => self.last_error = Some(e.to_string()),
        }
        r
    }

    fn try_reload(&mut self) -> Result<Applied, Refused> {
        // The machine's addresses, not its memory: what the running data
        // plane holds is not available any more, and the capacity cannot
        // change without a restart anyway.
        let machine = crate::machine::Machine {
            available: None,
            ..crate::machine::Machine::read()
        };
        let new = xvs_config::load_on(&self.path, &machine.host())
            .map_err(|e| Refused::Invalid(e.to_string()))?;
        let restart = [
            ("[interfaces]", new.interfaces != self.config.interfaces),
            ("[snat]", new.snat != self.config.snat),
            ("[admin]", new.admin != self.config.admin),
            ("[kubernetes]", new.kubernetes != self.config.kubernetes),
            ("[restart]", new.restart != self.config.restart),
            // Every Maglev table would change at once, under live flows.
            ("[cluster]", new.cluster != self.config.cluster),
            (
                "[conntrack] capacity",
                new.conntrack.capacity != self.config.conntrack.capacity,
            ),
        ];
        if let Some((section, _)) = restart.iter().find(|(_, changed)| *changed) {
            return Err(Refused::Invalid(format!(
                "{}: {section} changed: it takes effect on restart only; nothing was applied",
                self.path.display()
            )));
        }
        // The host may have started using SNAT ports of an address it
        // shares with xvs since the start: say so now.
        xvs_dataplane::host::check_snat(&new.snat.addresses, new.snat.ports).map_err(|e| {
            Refused::Invalid(format!("{}: {e}; nothing was applied", self.path.display()))
        })?;
        // Keys the Kubernetes source owns stay its own (first owner kept);
        // a key it wants that the file no longer has becomes its own.
        let mut desired = by_key(&new.services);
        let mut conflicts = Vec::new();
        let mut kube = self.kube.clone();
        for (k, s) in &self.kube {
            if desired.contains_key(k) {
                conflicts.push(format!(
                    "{}: in the file and from Kubernetes; kept the Kubernetes one (first)",
                    key_name(k)
                ));
            }
            desired.insert(*k, s.clone());
        }
        for (k, s) in &self.kube_wanted {
            if self.kube.contains_key(k) {
                continue;
            }
            if desired.contains_key(k) {
                conflicts.push(format!(
                    "{}: from Kubernetes and already served (file or runtime edit); kept the first",
                    key_name(k)
                ));
            } else {
                let problems = self.problems(s);
                if problems.is_empty() {
                    desired.insert(*k, s.clone());
                    kube.insert(*k, s.clone());
                }
                conflicts.extend(problems.into_iter().map(|p| format!("{p}; not applied")));
            }
        }
        for c in &conflicts {
            tracing::warn!("{c}");
        }
        let a = self.reconcile(desired)?;
        self.conflicts = conflicts;
        self.kube = kube;
        if new.conntrack.timeouts != self.config.conntrack.timeouts {
            self.dp.set_timeouts(new.conntrack.timeouts);
        }
        if (new.conntrack.rules, new.vips) != (self.config.conntrack.rules, self.config.vips) {
            self.dp
                .set_rules(new.conntrack.rules, new.vips.unknown_port);
        }
        self.config = new;
        Ok(a)
    }

    /// Applies one runtime edit (validated like a config file's service).
    pub fn edit(&mut self, e: Edit) -> Result<Applied, Refused> {
        let r = self.try_edit(e);
        if let Err(err) = &r {
            self.last_error = Some(err.to_string());
        }
        r
    }

    /// Works on copies of the services the edit touches (O(those
    /// services), whatever the number of services; a clear is O(all)),
    /// validates each, then sends only what changed.
    fn try_edit(&mut self, e: Edit) -> Result<Applied, Refused> {
        let mut plan = Plan::default();
        match e {
            Edit::Batch(edits) => {
                for (i, e) in edits.into_iter().enumerate() {
                    self.plan(&mut plan, e)
                        .map_err(|r| Refused::InBatch(i, Box::new(r)))?;
                }
            }
            e => self.plan(&mut plan, e)?,
        }
        let mut changes = Vec::new();
        if plan.cleared {
            for k in self.applied.keys() {
                if !plan.touched.contains_key(k) {
                    changes.push(Change::Remove(*k));
                }
            }
        }
        for (k, s) in plan.touched {
            match s {
                None if self.applied.contains_key(&k) => changes.push(Change::Remove(k)),
                None => {}
                Some(s) if self.applied.get(&k) == Some(&s) => {}
                Some(s) => {
                    let problems = self.problems(&s);
                    if !problems.is_empty() {
                        return Err(Refused::Invalid(problems.join("\n")));
                    }
                    changes.push(Change::Upsert(s));
                }
            }
        }
        self.apply(&changes)
    }

    /// The service `k` as the plan has it so far.
    fn planned(&self, plan: &Plan, k: &ServiceKey) -> Option<Service> {
        match plan.touched.get(k) {
            Some(s) => s.clone(),
            None if plan.cleared => None,
            None => self.applied.get(k).cloned(),
        }
    }

    /// Adds one edit to `plan`, refusing it as IPVS would.
    fn plan(&self, plan: &mut Plan, e: Edit) -> Result<(), Refused> {
        let no_service =
            |k: &ServiceKey| Refused::NoService(format!("{}: no such service", key_name(k)));
        let current =
            |plan: &Plan, k: &ServiceKey| self.planned(plan, k).ok_or_else(|| no_service(k));
        let no_destination = |k: &ServiceKey, addr: IpAddr, port: u16| {
            Refused::NoDestination(format!(
                "{}: no destination {}",
                key_name(k),
                xvs_config::HostPort(addr, port)
            ))
        };
        let (k, next) = match e {
            Edit::AddService(s) => {
                if self.planned(plan, &s.key).is_some() {
                    return Err(Refused::ServiceExists(format!(
                        "{}: service already exists",
                        key_name(&s.key)
                    )));
                }
                (s.key, Some(s))
            }
            Edit::EditService(s) => {
                let cur = current(plan, &s.key)?;
                (s.key, Some(edited(cur, s)))
            }
            Edit::DeleteService(k) => {
                current(plan, &k)?;
                (k, None)
            }
            Edit::AddBackend(k, b) => {
                let mut cur = current(plan, &k)?;
                if cur
                    .backends
                    .iter()
                    .any(|x| (x.address, x.port) == (b.address, b.port))
                {
                    return Err(Refused::DestinationExists(format!(
                        "{}: destination {}:{} already exists",
                        key_name(&k),
                        b.address,
                        b.port
                    )));
                }
                cur.backends.push(b);
                (k, Some(cur))
            }
            Edit::EditBackend(k, b) => {
                let mut cur = current(plan, &k)?;
                let d = cur
                    .backends
                    .iter_mut()
                    .find(|x| (x.address, x.port) == (b.address, b.port))
                    .ok_or_else(|| no_destination(&k, b.address, b.port))?;
                *d = b;
                (k, Some(cur))
            }
            Edit::DeleteBackend(k, addr, port) => {
                let mut cur = current(plan, &k)?;
                let before = cur.backends.len();
                cur.backends.retain(|x| (x.address, x.port) != (addr, port));
                if cur.backends.len() == before {
                    return Err(no_destination(&k, addr, port));
                }
                (k, Some(cur))
            }
            Edit::Clear => {
                plan.touched.clear();
                plan.cleared = true;
                return Ok(());
            }
            Edit::Batch(edits) => {
                for e in edits {
                    self.plan(plan, e)?;
                }
                return Ok(());
            }
        };
        plan.touched.insert(k, next);
        Ok(())
    }

    /// Every rule a service from the API, xvsadm or Kubernetes breaks, one
    /// line each (`KEY: FIELD: MESSAGE`): the file's rules
    /// ([`Service::check_in`], with this gateway's SNAT addresses and the
    /// host's own addresses), so every source refuses the same services
    /// with the same words.
    fn problems(&self, s: &Service) -> Vec<String> {
        let (host, connected) = xvs_dataplane::host::addresses_and_links().unwrap_or_default();
        let snat = self.config.snat.all_addresses();
        let gateway = xvs_config::Gateway {
            snat: &snat,
            host: &host,
            connected: &connected,
        };
        s.check_in(&gateway)
            .iter()
            .map(|v| format!("{}: {v}", key_name(&s.key)))
            .collect()
    }

    /// The Kubernetes source's new desired set: sends only what changed
    /// in it. A key the file (or a runtime edit) already serves stays
    /// theirs and is reported as a conflict.
    pub fn set_kube(&mut self, new: BTreeMap<ServiceKey, Service>) -> Result<Applied, Refused> {
        self.kube_wanted = new.clone();
        let file: std::collections::BTreeSet<ServiceKey> =
            self.config.services.iter().map(|s| s.key).collect();
        let mut changes = Vec::new();
        let mut conflicts = Vec::new();
        let mut owned = BTreeMap::new();
        for (k, s) in new {
            let file_owned =
                file.contains(&k) || (self.applied.contains_key(&k) && !self.kube.contains_key(&k));
            if file_owned {
                conflicts.push(format!(
                    "{}: from Kubernetes and already served (file or runtime edit); kept the first",
                    key_name(&k)
                ));
                continue;
            }
            if self.kube.get(&k) != Some(&s) {
                let problems = self.problems(&s);
                if !problems.is_empty() {
                    for p in problems {
                        conflicts.push(format!("{p}; not applied"));
                    }
                    continue;
                }
                changes.push(Change::Upsert(s.clone()));
            }
            owned.insert(k, s);
        }
        for k in self.kube.keys() {
            if !owned.contains_key(k) {
                changes.push(Change::Remove(*k));
            }
        }
        for c in &conflicts {
            tracing::warn!("{c}");
        }
        self.conflicts = conflicts;
        self.kube = owned;
        self.apply(&changes)
    }

    /// The conflicts between sources of the latest reload or Kubernetes
    /// update.
    pub fn conflicts(&self) -> &[String] {
        &self.conflicts
    }

    /// The services the Kubernetes source owns.
    pub fn kube_services(&self) -> &BTreeMap<ServiceKey, Service> {
        &self.kube
    }

    /// `ipvsadm --set tcp tcpfin udp`: sets the ESTABLISHED, FIN_WAIT and
    /// UDP timeouts (0 leaves one unchanged) on every worker; a value out
    /// of the file's range refuses the whole change.
    pub fn set_timeouts(
        &mut self,
        tcp: u32,
        tcpfin: u32,
        udp: u32,
    ) -> Result<xvs_config::Timeouts, Refused> {
        let changes: Vec<(&str, u32)> = [("established", tcp), ("fin_wait", tcpfin), ("udp", udp)]
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .collect();
        self.set_named_timeouts(&changes)
    }

    /// Sets timeouts by their `[conntrack.timeouts]` names (every state,
    /// not only ipvsadm's three), all or none, live on every worker.
    pub fn set_named_timeouts(
        &mut self,
        changes: &[(&str, u32)],
    ) -> Result<xvs_config::Timeouts, Refused> {
        let mut t = self.config.conntrack.timeouts;
        for (name, secs) in changes {
            t.set(name, u64::from(*secs)).map_err(Refused::Invalid)?;
        }
        self.config.conntrack.timeouts = t;
        self.dp.set_timeouts(t);
        Ok(t)
    }

    /// Stops the data plane (detaching its programs).
    pub fn stop(self) -> Vec<xvs_dataplane::worker::Snapshot> {
        self.dp.stop()
    }
}

type Job = Box<dyn FnOnce(&mut Engine) + Send>;

/// Why a call to the engine thread got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Its queue stayed full for 5 s, or it has stopped.
    #[error("the engine is busy or gone")]
    Unavailable,
    /// It stopped while the request waited or ran.
    #[error("the engine dropped the request")]
    Dropped,
    /// The request could not be handed over (the runtime is shutting down).
    #[error("the engine request could not be sent: {0}")]
    Runtime(String),
}

/// Why the engine thread did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The thread could not be created.
    #[error("cannot start the engine thread: {0}")]
    Thread(#[from] std::io::Error),
    /// It ended before building the engine.
    #[error("the engine thread ended")]
    Ended,
    /// Building the engine (starting the data plane) failed.
    #[error("{0}")]
    Build(String),
}

/// Talks to the engine thread. Cloneable; the thread ends when every
/// handle is gone.
#[derive(Clone)]
pub struct EngineHandle {
    jobs: crossbeam_channel::Sender<Job>,
}

/// The engine's thread.
pub struct EngineThread {
    join: Option<JoinHandle<Vec<xvs_dataplane::worker::Snapshot>>>,
}

impl EngineThread {
    /// Waits for the engine to stop; returns the workers' last snapshots.
    pub fn join(mut self) -> Vec<xvs_dataplane::worker::Snapshot> {
        self.join
            .take()
            .and_then(|j| j.join().ok())
            .unwrap_or_default()
    }
}

impl EngineHandle {
    /// Starts the engine thread with `build` (which starts the data plane
    /// on that thread).
    pub fn spawn(
        build: impl FnOnce() -> Result<Engine, String> + Send + 'static,
    ) -> Result<(EngineHandle, EngineThread), SpawnError> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(1024);
        let (up_tx, up_rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name("xvs-engine".into())
            .spawn(move || {
                let mut engine = match build() {
                    Ok(e) => {
                        let _ = up_tx.send(Ok(()));
                        e
                    }
                    Err(e) => {
                        let _ = up_tx.send(Err(e));
                        return Vec::new();
                    }
                };
                for job in rx {
                    job(&mut engine);
                }
                engine.stop()
            })?;
        up_rx
            .recv()
            .map_err(|_| SpawnError::Ended)?
            .map_err(SpawnError::Build)?;
        Ok((EngineHandle { jobs: tx }, EngineThread { join: Some(join) }))
    }

    /// Runs `f` on the engine thread and waits for its answer (from async
    /// code: the wait happens on a blocking thread).
    pub async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Engine) -> R + Send + 'static,
    ) -> Result<R, CallError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let jobs = self.jobs.clone();
        let job: Job = Box::new(move |e| {
            let _ = tx.send(f(e));
        });
        tokio::task::spawn_blocking(move || jobs.send_timeout(job, Duration::from_secs(5)))
            .await
            .map_err(|e| CallError::Runtime(e.to_string()))?
            .map_err(|_| CallError::Unavailable)?;
        rx.await.map_err(|_| CallError::Dropped)
    }

    /// Runs `f` on the engine thread, blocking (for non-async callers).
    pub fn call_blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Engine) -> R + Send + 'static,
    ) -> Result<R, CallError> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move |e| {
                let _ = tx.send(f(e));
            }))
            .map_err(|_| CallError::Unavailable)?;
        rx.recv().map_err(|_| CallError::Dropped)
    }
}

/// Logs what a start adopted from the state an earlier instance left.
pub fn log_adopted(r: &crate::api::RestartView) {
    if r.adopted_flows + r.adopted_templates + r.adopted_dropped > 0 {
        tracing::info!(
            flows = r.adopted_flows,
            templates = r.adopted_templates,
            dropped = r.adopted_dropped,
            files = r.state_files.len(),
            "adopted the flow state an earlier xvs left"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xvs_config::{ForwardMethod, Protocol};

    fn svc(port: u16, weight: u32) -> Service {
        let mut s = Service::new(ServiceKey {
            vip: Ipv4Addr::new(198, 19, 0, 1),
            protocol: Protocol::Tcp,
            port,
        });
        s.backends = vec![Backend {
            address: Ipv4Addr::new(198, 18, 1, 10),
            port,
            weight,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        }];
        s.into()
    }

    #[test]
    fn diff_sends_only_what_changed() {
        let applied = by_key(&[svc(80, 1), svc(81, 1), svc(82, 1)]);
        let desired = by_key(&[svc(80, 1), svc(81, 5), svc(83, 1)]);
        let changes = diff(&applied, &desired);
        assert_eq!(
            changes,
            vec![
                Change::Upsert(svc(81, 5)),
                Change::Upsert(svc(83, 1)),
                Change::Remove(svc(82, 1).key),
            ]
        );
        assert!(diff(&desired, &desired).is_empty());
    }

    #[test]
    fn an_edit_replaces_what_ipvsadm_says_and_keeps_the_rest() {
        let mut cur = svc(80, 1);
        cur.scheduler = Scheduler::Mh;
        cur.maglev_table_size = Some(16381);
        cur.source_ranges = vec!["198.18.0.0/24".parse().unwrap()];
        cur.name = Some("web".into());
        let mut e = Service::new(cur.key);
        e.scheduler = Scheduler::Mh;
        let out = edited(cur.clone(), e.clone());
        assert_eq!(out.backends, cur.backends);
        assert_eq!(out.source_ranges, cur.source_ranges);
        assert_eq!(out.name.as_deref(), Some("web"));
        assert_eq!(out.maglev_table_size, Some(16381));
        assert_eq!(out.persistence, None);
        // Away from mh, the table size goes (only mh has one).
        e.scheduler = Scheduler::Rr;
        let out = edited(cur, e);
        assert_eq!(
            (out.scheduler, out.maglev_table_size),
            (Scheduler::Rr, None)
        );
    }

    // ---- The engine on an in-memory plane: reload, edits, merging. ----

    use crate::plane::{Recorder, Sent};
    use std::sync::{Arc, Mutex};

    /// A config file in a folder of its own, removed when dropped.
    struct File(std::path::PathBuf);

    impl File {
        fn new(services: &str) -> File {
            let dir = std::env::temp_dir().join(format!(
                "xvs-engine-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let f = File(dir.join("xvs.toml"));
            f.write(services);
            f
        }
        fn write(&self, services: &str) {
            std::fs::write(&self.0, format!("{HEAD}{services}")).unwrap();
        }
        fn write_raw(&self, text: &str) {
            std::fs::write(&self.0, text).unwrap();
        }
    }

    impl Drop for File {
        fn drop(&mut self) {
            if let Some(d) = self.0.parent() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }

    const HEAD: &str =
        "[interfaces]\nclient = \"xvs0\"\n\n[snat]\naddresses = [\"198.18.1.2\"]\n\n";

    /// `[[services]]` on 198.19.0.1 for each (port, weight of 198.18.1.10).
    fn services(ports: &[(u16, u32)]) -> String {
        ports
            .iter()
            .map(|(p, w)| {
                format!(
                    "[[services]]\nvip = \"198.19.0.1\"\nport = {p}\nscheduler = \"rr\"\nbackends = [{{ address = \"198.18.1.10\", port = 8080, weight = {w} }}, {{ address = \"198.18.1.11\", port = 8080 }}]\n\n"
                )
            })
            .collect()
    }

    fn key(port: u16) -> ServiceKey {
        ServiceKey {
            vip: Ipv4Addr::new(198, 19, 0, 1).into(),
            protocol: Protocol::Tcp,
            port,
        }
    }

    fn engine(f: &File) -> (Engine, Arc<Mutex<Vec<Sent>>>) {
        let config = xvs_config::load(&f.0).unwrap();
        let (plane, log) = Recorder::new(&config.services, 2);
        (Engine::new(Box::new(plane), &f.0, config), log)
    }

    fn taken(log: &Arc<Mutex<Vec<Sent>>>) -> Vec<Sent> {
        std::mem::take(&mut *log.lock().unwrap())
    }

    fn backend(last: u8, weight: u32) -> Backend {
        Backend {
            address: Ipv4Addr::new(198, 18, 1, last).into(),
            port: 8080,
            weight,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        }
    }

    fn new_service(port: u16) -> Service {
        let mut s = Service::new(key(port));
        s.scheduler = Scheduler::Rr;
        s
    }

    #[test]
    fn a_reload_of_the_same_file_sends_nothing() {
        let f = File::new(&services(&[(80, 1), (81, 1)]));
        let (mut e, log) = engine(&f);
        let a = e.reload().unwrap();
        assert_eq!((a.added, a.changed, a.removed, a.unchanged), (0, 0, 0, 2));
        assert!(taken(&log).is_empty());
        assert_eq!(e.reloads(), 1);
        assert_eq!(a.applied_seconds, None);
    }

    #[test]
    fn a_reload_sends_one_change_per_changed_service_only() {
        let f = File::new(&services(&[(80, 1), (81, 1), (82, 1)]));
        let (mut e, log) = engine(&f);
        f.write(&services(&[(80, 1), (81, 5), (83, 1)]));
        let a = e.reload().unwrap();
        assert_eq!((a.added, a.changed, a.removed, a.unchanged), (1, 1, 1, 1));
        assert_eq!(
            taken(&log),
            [
                Sent::Upsert(key(81)),
                Sent::Upsert(key(83)),
                Sent::Remove(key(82))
            ]
        );
        assert_eq!(e.applied()[&key(81)].backends[0].weight, 5);
    }

    /// A health verdict sends that one service again, the backend at
    /// weight 0, and nothing when it changes nothing; a reload keeps the
    /// verdict in what it sends; the configured weight comes back with
    /// the backend.
    #[test]
    fn a_backend_found_down_is_sent_at_weight_0_and_comes_back_with_its_weight() {
        let f = File::new(&services(&[(80, 3), (81, 1)]));
        let (mut e, log) = engine(&f);
        let b = IpAddr::from(Ipv4Addr::new(198, 18, 1, 10));
        let weight = |e: &Engine| {
            crate::stats::sample(e)
                .into_iter()
                .find(|s| s.key == key(80))
                .unwrap()
                .backends[0]
                .weight
        };
        assert!(e.set_health(key(80), b, 8080, false));
        assert_eq!(taken(&log), [Sent::Upsert(key(80))]);
        assert!(e.is_down(&key(80), b, 8080));
        assert_eq!(weight(&e), 0);
        assert_eq!(e.applied()[&key(80)].backends[0].weight, 3);
        // The same verdict again changes nothing.
        assert!(!e.set_health(key(80), b, 8080, false));
        assert!(taken(&log).is_empty());
        // A reload that changes the service sends it still down.
        f.write(&services(&[(80, 4), (81, 1)]));
        e.reload().unwrap();
        assert_eq!(taken(&log), [Sent::Upsert(key(80))]);
        assert_eq!(weight(&e), 0);
        assert!(e.set_health(key(80), b, 8080, true));
        assert_eq!(taken(&log), [Sent::Upsert(key(80))]);
        assert_eq!(weight(&e), 4);
    }

    #[test]
    fn an_invalid_file_changes_nothing_and_says_where() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        f.write(&services(&[(80, 1)]).replace("\"rr\"", "\"rrr\""));
        let err = e.reload().unwrap_err().to_string();
        assert!(
            err.contains("xvs.toml:")
                && err.contains("services[0].scheduler: unknown scheduler \"rrr\""),
            "{err}"
        );
        assert!(taken(&log).is_empty());
        assert_eq!(e.last_error(), Some(err.as_str()));
        assert_eq!(e.reloads(), 0);
        // The next good reload clears the error.
        f.write(&services(&[(80, 2)]));
        e.reload().unwrap();
        assert_eq!(e.last_error(), None);
        assert_eq!(taken(&log), [Sent::Upsert(key(80))]);
    }

    #[test]
    fn what_takes_a_restart_is_refused_on_reload() {
        for (what, from, to) in [
            ("[interfaces]", "client = \"xvs0\"", "client = \"xvs1\""),
            ("[snat]", "198.18.1.2", "198.18.1.3"),
            (
                "[admin]",
                "[snat]",
                "[admin]\nsocket = \"/run/xvs/other.sock\"\n\n[snat]",
            ),
            (
                "[conntrack] capacity",
                "[snat]",
                "[conntrack]\ncapacity = 4096\n\n[snat]",
            ),
            ("[cluster]", "[snat]", "[cluster]\nhash_seed = 7\n\n[snat]"),
        ] {
            let f = File::new(&services(&[(80, 1)]));
            let (mut e, log) = engine(&f);
            f.write_raw(&format!("{HEAD}{}", services(&[(80, 3)])).replace(from, to));
            let err = e.reload().unwrap_err().to_string();
            assert!(
                err.contains(&format!("{what} changed: it takes effect on restart only")),
                "{what}: {err}"
            );
            assert!(taken(&log).is_empty(), "{what}");
            assert_eq!(e.applied()[&key(80)].backends[0].weight, 1, "{what}");
        }
    }

    #[test]
    fn timeouts_and_rules_in_the_file_are_sent_only_when_they_change() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        f.write_raw(&format!(
            "{HEAD}[conntrack.timeouts]\nestablished = 600\n\n{}",
            services(&[(80, 1)])
        ));
        e.reload().unwrap();
        let sent = taken(&log);
        assert!(
            matches!(sent[..], [Sent::Timeouts(t)] if t.established == 600),
            "{sent:?}"
        );
        f.write_raw(&format!(
            "{HEAD}[conntrack]\nconn_reuse_mode = false\n\n[conntrack.timeouts]\nestablished = 600\n\n[vips]\nunknown_port = \"reject\"\n\n{}",
            services(&[(80, 1)])
        ));
        e.reload().unwrap();
        let sent = taken(&log);
        assert!(
            matches!(sent[..], [Sent::Rules(r, xvs_config::UnknownPort::Reject)] if !r.conn_reuse_mode),
            "{sent:?}"
        );
        e.reload().unwrap();
        assert!(taken(&log).is_empty());
    }

    #[test]
    fn edits_are_ipvsadm_s_commands_with_its_refusals() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        // -A, and -A again.
        e.edit(Edit::AddService(new_service(90))).unwrap();
        assert!(matches!(
            e.edit(Edit::AddService(new_service(90))),
            Err(Refused::ServiceExists(_))
        ));
        // -a, twice; -a to a missing service.
        e.edit(Edit::AddBackend(key(90), backend(10, 1))).unwrap();
        assert!(matches!(
            e.edit(Edit::AddBackend(key(90), backend(10, 4))),
            Err(Refused::DestinationExists(_))
        ));
        assert!(matches!(
            e.edit(Edit::AddBackend(key(91), backend(10, 1))),
            Err(Refused::NoService(_))
        ));
        // -e of a missing destination, then of the right one.
        assert!(matches!(
            e.edit(Edit::EditBackend(key(90), backend(12, 1))),
            Err(Refused::NoDestination(_))
        ));
        e.edit(Edit::EditBackend(key(90), backend(10, 7))).unwrap();
        assert_eq!(e.applied()[&key(90)].backends[0].weight, 7);
        // -d of a missing one, then of the right one.
        assert!(matches!(
            e.edit(Edit::DeleteBackend(
                key(90),
                Ipv4Addr::new(198, 18, 1, 12).into(),
                8080
            )),
            Err(Refused::NoDestination(_))
        ));
        e.edit(Edit::DeleteBackend(
            key(90),
            Ipv4Addr::new(198, 18, 1, 10).into(),
            8080,
        ))
        .unwrap();
        // -E and -D of a missing service.
        assert!(matches!(
            e.edit(Edit::EditService(new_service(91))),
            Err(Refused::NoService(_))
        ));
        assert!(matches!(
            e.edit(Edit::DeleteService(key(91))),
            Err(Refused::NoService(_))
        ));
        e.edit(Edit::DeleteService(key(90))).unwrap();
        assert_eq!(
            taken(&log),
            [
                Sent::Upsert(key(90)),
                Sent::Upsert(key(90)),
                Sent::Upsert(key(90)),
                Sent::Upsert(key(90)),
                Sent::Remove(key(90)),
            ]
        );
        // The refusal is kept for /v1/status until the next success.
        assert!(e.last_error().is_some());
    }

    #[test]
    fn an_edit_that_changes_nothing_sends_nothing() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        let same = e.applied()[&key(80)].clone();
        let a = e.edit(Edit::EditService(same)).unwrap();
        assert_eq!((a.changed, a.unchanged), (0, 1));
        assert!(taken(&log).is_empty());
    }

    #[test]
    fn an_edit_the_rules_refuse_changes_nothing() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        let mut bad = new_service(90);
        bad.key.vip = Ipv4Addr::new(198, 18, 1, 2).into(); // the SNAT address
        let err = e.edit(Edit::AddService(bad)).unwrap_err().to_string();
        assert!(err.contains("is a SNAT address of this gateway"), "{err}");
        // A backend that is the VIP.
        let err = e
            .edit(Edit::AddBackend(
                key(80),
                Backend {
                    address: Ipv4Addr::new(198, 19, 0, 1).into(),
                    ..backend(1, 1)
                },
            ))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is the service's VIP"), "{err}");
        assert!(taken(&log).is_empty());
        assert_eq!(e.applied().len(), 1);
    }

    #[test]
    fn clear_removes_every_service() {
        let f = File::new(&services(&[(80, 1), (81, 1)]));
        let (mut e, log) = engine(&f);
        let a = e.edit(Edit::Clear).unwrap();
        assert_eq!(a.removed, 2);
        assert_eq!(taken(&log), [Sent::Remove(key(80)), Sent::Remove(key(81))]);
        assert!(e.applied().is_empty());
    }

    #[test]
    fn a_batch_is_all_or_nothing_and_names_the_refused_edit() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        let r = e.edit(Edit::Batch(vec![
            Edit::AddService(new_service(90)),
            Edit::AddBackend(key(90), backend(10, 1)),
            Edit::AddService(new_service(80)),
        ]));
        match r {
            Err(Refused::InBatch(2, inner)) => {
                assert!(matches!(*inner, Refused::ServiceExists(_)))
            }
            other => panic!("{other:?}"),
        }
        assert!(taken(&log).is_empty());
        assert!(!e.applied().contains_key(&key(90)));
        // Edits see the ones before them: -A then -a of that service.
        e.edit(Edit::Batch(vec![
            Edit::AddService(new_service(90)),
            Edit::AddBackend(key(90), backend(10, 1)),
            Edit::EditBackend(key(90), backend(10, 3)),
        ]))
        .unwrap();
        // One change for the service, whatever the number of edits.
        assert_eq!(taken(&log), [Sent::Upsert(key(90))]);
        assert_eq!(e.applied()[&key(90)].backends[0].weight, 3);
    }

    #[test]
    fn clear_then_the_same_table_in_one_batch_changes_nothing() {
        let f = File::new(&services(&[(80, 1), (81, 1)]));
        let (mut e, log) = engine(&f);
        let again: Vec<Edit> = std::iter::once(Edit::Clear)
            .chain(e.applied().values().map(|s| Edit::AddService(s.clone())))
            .collect();
        let a = e.edit(Edit::Batch(again)).unwrap();
        assert_eq!((a.added, a.changed, a.removed, a.unchanged), (0, 0, 0, 2));
        assert!(
            taken(&log).is_empty(),
            "flows of unchanged services are kept"
        );
        // Clear, then one service back: the other goes.
        let one = vec![Edit::Clear, Edit::AddService(e.applied()[&key(80)].clone())];
        e.edit(Edit::Batch(one)).unwrap();
        assert_eq!(taken(&log), [Sent::Remove(key(81))]);
    }

    #[test]
    fn runtime_edits_last_until_the_next_reload() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        e.edit(Edit::AddService(new_service(90))).unwrap();
        e.edit(Edit::EditBackend(key(80), backend(10, 9))).unwrap();
        taken(&log);
        let a = e.reload().unwrap();
        assert_eq!((a.changed, a.removed), (1, 1));
        assert_eq!(taken(&log), [Sent::Upsert(key(80)), Sent::Remove(key(90))]);
        assert_eq!(e.applied()[&key(80)].backends[0].weight, 1);
    }

    fn kube(ports: &[u16]) -> BTreeMap<ServiceKey, Service> {
        ports
            .iter()
            .map(|&p| {
                let mut s = new_service(p);
                s.backends = vec![backend(20, 1)];
                (s.key, s)
            })
            .collect()
    }

    #[test]
    fn kubernetes_services_merge_and_the_first_owner_keeps_a_key() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        // 80 is the file's: a conflict, kept; 8080 and 8081 are added.
        let a = e.set_kube(kube(&[80, 8080, 8081])).unwrap();
        assert_eq!(a.added, 2);
        assert_eq!(
            taken(&log),
            [Sent::Upsert(key(8080)), Sent::Upsert(key(8081))]
        );
        assert_eq!(e.conflicts().len(), 1);
        assert!(e.conflicts()[0].contains("TCP 198.19.0.1:80: from Kubernetes and already served"));
        assert_eq!(
            e.applied()[&key(80)].backends[0].address,
            Ipv4Addr::new(198, 18, 1, 10)
        );
        // The same set again: nothing sent.
        e.set_kube(kube(&[80, 8080, 8081])).unwrap();
        assert!(taken(&log).is_empty());
        // One goes: one removal.
        e.set_kube(kube(&[8080])).unwrap();
        assert_eq!(taken(&log), [Sent::Remove(key(8081))]);
        assert_eq!(e.kube_services().len(), 1);
        assert!(e.conflicts().is_empty());
    }

    #[test]
    fn a_reload_keeps_kubernetes_services_and_reports_the_file_s_clash() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        e.set_kube(kube(&[8080])).unwrap();
        taken(&log);
        // The file now also wants 8080: Kubernetes had it first.
        f.write(&services(&[(80, 1), (8080, 1)]));
        let a = e.reload().unwrap();
        assert_eq!((a.added, a.changed, a.removed), (0, 0, 0));
        assert!(taken(&log).is_empty());
        assert_eq!(e.conflicts().len(), 1);
        assert!(
            e.conflicts()[0].contains("in the file and from Kubernetes; kept the Kubernetes one")
        );
        assert_eq!(
            e.applied()[&key(8080)].backends[0].address,
            Ipv4Addr::new(198, 18, 1, 20)
        );
    }

    #[test]
    fn a_kubernetes_service_the_rules_refuse_is_reported_not_applied() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        let mut set = kube(&[8080]);
        set.get_mut(&key(8080)).unwrap().backends[0].address = Ipv4Addr::new(198, 18, 1, 2).into();
        e.set_kube(set).unwrap();
        assert!(taken(&log).is_empty());
        assert!(
            e.conflicts()[0].contains("is a SNAT address of this gateway"),
            "{:?}",
            e.conflicts()
        );
        assert!(e.conflicts()[0].ends_with("; not applied"));
    }

    #[test]
    fn one_endpoint_change_from_kubernetes_sends_one_update() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        e.set_kube(kube(&[8080, 8081, 8082])).unwrap();
        taken(&log);
        let mut set = kube(&[8080, 8081, 8082]);
        set.get_mut(&key(8081))
            .unwrap()
            .backends
            .push(backend(21, 1));
        let a = e.set_kube(set).unwrap();
        assert_eq!((a.added, a.changed, a.removed), (0, 1, 0));
        assert_eq!(taken(&log), [Sent::Upsert(key(8081))]);
        assert_eq!(e.applied()[&key(8081)].backends.len(), 2);
        assert_eq!(e.applied()[&key(8080)].backends.len(), 1);
    }

    #[test]
    fn kubernetes_losing_every_service_leaves_the_file_s() {
        let f = File::new(&services(&[(80, 1), (81, 1)]));
        let (mut e, log) = engine(&f);
        e.set_kube(kube(&[80, 8080])).unwrap();
        taken(&log);
        e.set_kube(BTreeMap::new()).unwrap();
        assert_eq!(taken(&log), [Sent::Remove(key(8080))]);
        assert!(e.conflicts().is_empty());
        let keys: Vec<ServiceKey> = e.applied().keys().copied().collect();
        assert_eq!(keys, [key(80), key(81)]);
        assert_eq!(
            e.applied()[&key(80)].backends[0].address,
            Ipv4Addr::new(198, 18, 1, 10),
            "the file's 80 was kept throughout"
        );
    }

    #[test]
    fn a_reload_that_drops_a_clashing_service_hands_the_key_to_kubernetes() {
        let f = File::new(&services(&[(80, 1), (81, 1)]));
        let (mut e, log) = engine(&f);
        e.set_kube(kube(&[81])).unwrap();
        assert_eq!(e.conflicts().len(), 1);
        taken(&log);
        // The file gives 81 up: Kubernetes' 81 is served from now on.
        f.write(&services(&[(80, 1)]));
        e.reload().unwrap();
        assert_eq!(taken(&log), [Sent::Upsert(key(81))]);
        assert!(e.conflicts().is_empty(), "{:?}", e.conflicts());
        assert_eq!(
            e.applied()[&key(81)].backends[0].address,
            Ipv4Addr::new(198, 18, 1, 20)
        );
    }

    #[test]
    fn a_runtime_service_keeps_its_key_against_kubernetes() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        e.edit(Edit::AddService(new_service(8080))).unwrap();
        taken(&log);
        e.set_kube(kube(&[8080])).unwrap();
        assert!(taken(&log).is_empty());
        assert!(e.conflicts()[0].contains("already served (file or runtime edit)"));
    }

    #[test]
    fn timeouts_are_range_checked_all_or_none() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, log) = engine(&f);
        let t = e.set_timeouts(600, 0, 30).unwrap();
        assert_eq!((t.established, t.udp), (600, 30));
        assert!(matches!(taken(&log)[..], [Sent::Timeouts(x)] if x == t));
        let err = e.set_timeouts(700, 0, 4_000_000).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
        assert!(taken(&log).is_empty());
        assert_eq!(e.config().conntrack.timeouts.established, 600);
        let t = e
            .set_named_timeouts(&[("time_wait", 30), ("syn_recv", 20)])
            .unwrap();
        assert_eq!((t.time_wait, t.syn_recv), (30, 20));
        assert!(e.set_named_timeouts(&[("time_wiat", 30)]).is_err());
    }

    #[test]
    fn zero_needs_the_service_and_keeps_a_base() {
        let f = File::new(&services(&[(80, 1)]));
        let (mut e, _) = engine(&f);
        assert!(matches!(e.zero(Some(key(81))), Err(Refused::NoService(_))));
        e.zero(Some(key(80))).unwrap();
        e.zero(None).unwrap();
        // A removed service forgets its base: re-created, it counts from
        // its own start.
        e.edit(Edit::DeleteService(key(80))).unwrap();
        let mut samples = crate::stats::sample(&e);
        e.zeroed().apply(&mut samples);
        assert!(samples.is_empty());
    }

    /// `xvs status`'s counts are the listing's: a backend found down by
    /// its check is down (not quiesced, though its listed weight is 0), a
    /// configured weight 0 is quiesced, the rest healthy.
    #[test]
    fn the_status_tally_counts_backends_as_the_listing_shows_them() {
        // Port 80's first backend is checked, and found down; port 81's
        // first has weight 0; port 82's first is found down unchecked
        // (listed with no health, at weight 0: quiesced).
        let checked = "[[services]]\nvip = \"198.19.0.1\"\nport = 80\nscheduler = \"rr\"\n\
            backends = [{ address = \"198.18.1.10\", port = 8080, weight = 3, check = { kind = \"tcp\" } }, \
            { address = \"198.18.1.11\", port = 8080 }]\n\n";
        let f = File::new(&format!("{checked}{}", services(&[(81, 0), (82, 1)])));
        let (mut e, _) = engine(&f);
        let b = IpAddr::from(Ipv4Addr::new(198, 18, 1, 10));
        assert!(e.set_health(key(80), b, 8080, false));
        assert!(e.set_health(key(82), b, 8080, false));
        let t = crate::stats::tally(&e);
        let samples = crate::stats::sample(&e);
        let listed: Vec<_> = samples.iter().flat_map(|s| &s.backends).collect();
        let down = listed.iter().filter(|b| b.up == Some(false)).count();
        let quiesced = listed
            .iter()
            .filter(|b| b.up != Some(false) && b.weight == 0)
            .count();
        assert_eq!((t.services, t.backends), (samples.len(), listed.len()));
        assert_eq!((t.down, t.quiesced), (down, quiesced));
        assert_eq!(t.healthy, listed.len() - down - quiesced);
        assert!(t.down > 0 && t.quiesced > 0 && t.healthy > 0, "{t:?}");
    }

    /// The estimator's sample reads the compiled services alone, not the
    /// configuration: it must see exactly the listing's backends, with
    /// the same counters (a backend found down included; each backend's
    /// traffic different, so a mix-up of ids shows).
    #[test]
    fn the_estimator_samples_the_listing_s_backends_and_counters() {
        // More services than the visit fetches ahead (16), so its fetches
        // run too.
        let ports: Vec<(u16, u32)> = (80..100).map(|p| (p, u32::from(p % 3) + 1)).collect();
        let f = File::new(&services(&ports));
        let (mut e, _) = engine(&f);
        let b = IpAddr::from(Ipv4Addr::new(198, 18, 1, 10));
        assert!(e.set_health(key(81), b, 8080, false));
        for (n, c) in e.dataplane().services().enumerate() {
            c.for_each_backend(|_, _, id| {
                for w in 0..=(n as u32 * 4 + id) {
                    c.stats().conn(w as usize % 2, id);
                }
            });
        }
        let mut visited = Vec::new();
        let services = crate::stats::compiled_services(&e);
        crate::stats::visit_totals(&services, &mut |k, t| visited.push((k, t.conns)));
        let mut listed: Vec<_> = crate::stats::sample(&e)
            .into_iter()
            .flat_map(|s| {
                s.backends
                    .into_iter()
                    .map(move |b| ((s.key, b.address, b.port), b.totals.conns))
            })
            .collect();
        visited.sort();
        listed.sort();
        assert_eq!(visited.len(), 2 * ports.len(), "{visited:?}");
        assert_eq!(visited, listed);
        let mut conns: Vec<u64> = visited.iter().map(|v| v.1).collect();
        conns.sort_unstable();
        conns.dedup();
        assert_eq!(
            conns.len(),
            visited.len(),
            "every backend counted apart: {visited:?}"
        );
    }

    #[test]
    fn the_stats_sample_reads_the_plane_s_compiled_services() {
        let f = File::new(&services(&[(80, 1), (81, 2)]));
        let (e, _) = engine(&f);
        let samples = crate::stats::sample(&e);
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[1].backends[0].weight, 2);
        assert_eq!(samples[0].scheduler, "rr");
    }
}
