//! Starting and stopping the data plane from a validated configuration:
//! the steering program on the interface, one AF_XDP port and one pinned
//! worker per queue, the services compiled once and shared, and a
//! [`DataplaneHandle`] to send updates and read snapshots.
//!
//! Invariant: [`Dataplane::stop`] (and dropping a [`Dataplane`]) stops and
//! joins every worker before the steering program is detached, so no
//! packet is steered to a socket that is gone; the program is detached on
//! every path that unwinds.

mod ha;
pub use ha::SyncState;

use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};
use smoltcp::wire::EthernetAddress;
use xvs_config::{ArmMode, Config, Family, Steering as SteeringMode, ZeroCopy};

use crate::counters::{CountersReading, LiveCounters};
use crate::eventfd::EventFd;
use crate::events::FlowEvents;
use crate::pipeline::{Pipeline, PipelineConfig};
use crate::services::AnyService;
use crate::steer::{SteerError, Steering};
use crate::worker::{Control, Handoff, Peers, Snapshot, Worker, WorkerLinks, HANDOFF_RING};
use crate::xsk::{XskError, XskPort};
use xvs_conntrack::FlowTable;
use xvs_conntrack::{Filter, FlowInfo};

/// Capacity of each worker's control channel.
const CONTROL_QUEUE: usize = 4096;

/// Why the data plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration asks for something this data plane does not do.
    #[error("{0}")]
    Unsupported(String),
    /// Reading the interface failed.
    #[error("interface {ifname}: {source}")]
    Interface {
        /// Interface.
        ifname: String,
        /// Why.
        source: std::io::Error,
    },
    /// The steering program.
    #[error(transparent)]
    Steer(#[from] SteerError),
    /// An AF_XDP socket.
    #[error(transparent)]
    Xsk(#[from] XskError),
}

/// How a worker is reached: its control channel and the eventfd that
/// wakes it.
#[derive(Clone)]
struct Mailbox {
    control: Sender<Control>,
    wake: Arc<EventFd>,
}

impl Mailbox {
    /// Sends `msg` (waiting a second at most for room) and wakes the
    /// worker; whether it was sent.
    fn post(&self, msg: Control) -> bool {
        let ok = self
            .control
            .send_timeout(msg, Duration::from_secs(1))
            .is_ok();
        if let Err(e) = self.wake.wake() {
            // Not expected of an eventfd; the worker still sees the message
            // at its next poll timeout.
            tracing::warn!("cannot wake a worker: {e}");
        }
        ok
    }
}

struct WorkerHandle {
    mailbox: Mailbox,
    join: Option<JoinHandle<Snapshot>>,
    /// Its incoming hand-off ring, when there are several workers.
    ring: Option<Arc<Handoff>>,
    /// Its published counters.
    live: Arc<LiveCounters>,
    /// Control messages sent to it (compared with what it has applied).
    sent: AtomicU64,
    /// Its AF_XDP sockets (for the kernel's statistics; valid while it
    /// runs).
    fds: Vec<i32>,
    /// The RX queue it serves.
    queue: u32,
    /// Whether its AF_XDP sockets got zero-copy mode.
    zero_copy: bool,
    /// Whether its UMEM got 2 MiB pages.
    huge_pages: bool,
}

/// Where the data plane runs, as the kernel gave it: each interface's XDP
/// mode, each worker's queue and socket mode (`xvs status`; the cores are
/// the config's).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// Each interface and the XDP mode its program is attached in.
    pub interfaces: Vec<(String, String)>,
    /// Each worker, in order.
    pub workers: Vec<WorkerPlace>,
}

/// One worker's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerPlace {
    /// The RX queue it serves.
    pub queue: u32,
    /// Whether its AF_XDP sockets are in zero-copy mode (else copy).
    pub zero_copy: bool,
    /// Whether its UMEM is on 2 MiB pages (else 4 KiB: no huge pages
    /// were reserved, `vm.nr_hugepages`).
    #[serde(default)]
    pub huge_pages: bool,
}

/// Sends updates to every worker and reads their snapshots.
pub struct DataplaneHandle {
    workers: Vec<WorkerHandle>,
}

impl DataplaneHandle {
    /// Sends `msg` to `w`, counted among the messages
    /// [`DataplaneHandle::wait_applied`] waits for.
    fn send_to(&self, w: &WorkerHandle, msg: Control) -> bool {
        let ok = w.mailbox.post(msg);
        if ok {
            w.sent.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Adds or replaces a service on every worker.
    pub fn upsert(&self, svc: AnyService) {
        for w in &self.workers {
            self.send_to(w, Control::Upsert(svc.clone()));
        }
    }

    /// Sets the conntrack timeouts on every worker (like `ipvsadm --set`:
    /// flows take them at their next state change or packet).
    pub fn set_timeouts(&self, t: xvs_conntrack::Timeouts) {
        for w in &self.workers {
            self.send_to(w, Control::SetTimeouts(t));
        }
    }

    /// Sets IPVS's reuse and removal rules and the unknown-port policy on
    /// every worker (in force from their next packet).
    pub fn set_rules(&self, rules: xvs_config::ConnRules, unknown_port: xvs_config::UnknownPort) {
        for w in &self.workers {
            self.send_to(w, Control::SetRules(rules, unknown_port));
        }
    }

    /// Removes a service from every worker.
    pub fn remove(&self, key: xvs_config::ServiceKey<IpAddr>) {
        for w in &self.workers {
            self.send_to(w, Control::Remove(key));
        }
    }

    /// Whether every worker has applied every control message sent to it
    /// so far (updates sent before this call are in force when it is true).
    pub fn applied(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.live.applied() >= w.sent.load(Ordering::Relaxed))
    }

    /// Waits, polling, until [`Self::applied`] or `timeout` passes; returns
    /// whether everything was applied.
    pub fn wait_applied(&self, timeout: Duration) -> bool {
        let step = Duration::from_micros(20);
        let mut waited = Duration::ZERO;
        while !self.applied() {
            if waited >= timeout {
                return false;
            }
            std::thread::sleep(step);
            waited += step;
        }
        true
    }

    /// Every worker's counters, read from what the workers publish (no
    /// round trip; at most one batch old), with what the kernel counted
    /// on their sockets (asked here, not by the workers).
    pub fn counters(&self) -> Vec<CountersReading> {
        self.workers
            .iter()
            .map(|w| {
                let mut r = w.live.read();
                for &fd in &w.fds {
                    r.rings.add(&crate::xsk::RingStats::of_socket(fd));
                }
                r
            })
            .collect()
    }

    /// The flows matching `filter` on every worker, of both families (an
    /// address in it selects its family's table; `family`, only that
    /// family's), fetched chunk by chunk so no worker pauses for long.
    pub fn dump(&self, filter: Filter<IpAddr>, family: Option<Family>) -> Vec<FlowInfo<IpAddr>> {
        let mut out = Vec::new();
        self.walk(
            family,
            |family, cursor, reply| Control::Dump {
                filter,
                family,
                cursor,
                reply,
            },
            |flows| out.extend(flows),
        );
        out
    }

    /// Deletes the flows matching `filter` on every worker (as
    /// [`DataplaneHandle::dump`] selects them, chunked); returns how many.
    pub fn delete(&self, filter: Filter<IpAddr>, family: Option<Family>) -> u64 {
        let mut total = 0;
        self.walk(
            family,
            |family, cursor, reply| Control::Delete {
                filter,
                family,
                cursor,
                reply,
            },
            |n| total += u64::from(n),
        );
        total
    }

    /// Walks every worker's tables of `family` (both when `None`) in
    /// chunks: `ask` makes the request for the chunk of a table at a
    /// cursor, `take` receives each chunk's result; a worker that does not
    /// answer within 5 s is left (its rest unseen).
    fn walk<T>(
        &self,
        family: Option<Family>,
        ask: impl Fn(Family, u32, Sender<(T, Option<u32>)>) -> Control,
        mut take: impl FnMut(T),
    ) {
        let families = [Family::V4, Family::V6]
            .into_iter()
            .filter(|f| family.is_none_or(|only| only == *f));
        for f in families {
            for w in &self.workers {
                let mut cursor = Some(0);
                while let Some(c) = cursor {
                    let (tx, rx) = bounded(1);
                    if !self.send_to(w, ask(f, c, tx)) {
                        break;
                    }
                    let Ok((chunk, next)) = rx.recv_timeout(Duration::from_secs(5)) else {
                        break;
                    };
                    take(chunk);
                    cursor = next;
                }
            }
        }
    }

    /// Deletes every flow and persistence template, of both families.
    pub fn flush(&self) -> u64 {
        let all = Filter {
            templates: true,
            ..Filter::default()
        };
        self.delete(all, None)
    }

    /// Every worker's snapshot.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        let (tx, rx) = bounded(self.workers.len().max(1));
        for w in &self.workers {
            self.send_to(w, Control::Snapshot(tx.clone()));
        }
        drop(tx);
        let mut v: Vec<Snapshot> = rx.iter().take(self.workers.len()).collect();
        v.sort_by_key(|s| s.worker);
        v
    }
}

/// A running data plane.
pub struct Dataplane {
    handle: DataplaneHandle,
    /// One per interface; emptied at stop (detaching unless the hold
    /// window keeps the program).
    steerings: Vec<Steering>,
    /// What attaching found on each interface.
    takeovers: Vec<crate::steer::Takeover>,
    /// What each worker made of its flow state file.
    restored: Vec<crate::state::Restored>,
    /// Adoption waits for [`Dataplane::adopt`].
    pending: bool,
    /// The workers' clock.
    clock: Box<dyn Fn() -> u32 + Send>,
    ifname: String,
    /// The services the workers have, by key (an update keeps its
    /// service's id, and its counts when the backends are the same).
    compiled: std::collections::HashMap<xvs_config::ServiceKey<IpAddr>, AnyService>,
    next_id: u32,
    /// Every worker's flow events.
    events: Vec<Arc<FlowEvents>>,
    workers: usize,
    /// The cluster's hash seed (`[cluster] hash_seed`): every service's
    /// Maglev table is built with it.
    hash_seed: u64,
    /// The sync thread, when `[cluster.sync]` is set.
    sync: Option<crate::sync::daemon::SyncDaemon>,
    /// A backup that has not taken over: its addresses are not steered.
    standby: bool,
    /// Addresses taken over from peers.
    taken: Vec<IpAddr>,
    /// The SNAT addresses (both families), and those shared with the host.
    snat_all: Vec<IpAddr>,
    shared: Vec<std::net::Ipv4Addr>,
}

/// Asks the kernel about an interface with `request` (an `SIOCGIF*`
/// ioctl, which follows the calling thread's network namespace; /sys
/// would show the namespace it was mounted in) and reads the answer.
fn ask_interface<R>(
    ifname: &str,
    request: libc::c_ulong,
    read: impl FnOnce(&libc::ifreq) -> R,
) -> Result<R, StartError> {
    let err = |source| StartError::Interface {
        ifname: ifname.to_owned(),
        source,
    };
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(err(std::io::Error::other("name too long")));
    }
    // SAFETY: socket has no memory preconditions; the result is checked
    // before it is owned (and closed when `sock` drops).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `ifr` is a valid ifreq with a NUL-terminated name (the
    // name is shorter than IFNAMSIZ and the rest is zero); the SIOCGIF*
    // requests write only into it.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), request as _, &mut ifr) };
    if ret != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(read(&ifr))
}

/// The interface's Ethernet address.
fn interface_mac(ifname: &str) -> Result<EthernetAddress, StartError> {
    ask_interface(ifname, libc::SIOCGIFHWADDR as libc::c_ulong, |ifr| {
        // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
        let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (m, b) in mac.iter_mut().zip(sa.sa_data.iter()) {
            *m = *b as u8;
        }
        EthernetAddress(mac)
    })
}

/// The interface's MTU (what a tunnel backend's encapsulated packets
/// must fit).
fn interface_mtu(ifname: &str) -> Result<u16, StartError> {
    ask_interface(ifname, libc::SIOCGIFMTU as libc::c_ulong, |ifr| {
        // SAFETY: SIOCGIFMTU filled the mtu member of the union.
        let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
        mtu.clamp(576, i32::from(u16::MAX)) as u16
    })
}

impl Dataplane {
    /// Where it runs: interfaces with their XDP mode, workers with their
    /// queue and socket mode.
    pub fn layout(&self) -> Layout {
        Layout {
            interfaces: self
                .steerings
                .iter()
                .map(|s| (s.ifname().to_owned(), s.mode().to_owned()))
                .collect(),
            workers: self
                .handle
                .workers
                .iter()
                .map(|w| WorkerPlace {
                    queue: w.queue,
                    zero_copy: w.zero_copy,
                    huge_pages: w.huge_pages,
                })
                .collect(),
        }
    }

    /// Starts the data plane described by `cfg`. `clock` gives seconds on
    /// a monotonic clock (shared by every worker).
    pub fn start(
        cfg: &Config,
        clock: impl Fn() -> u32 + Clone + Send + 'static,
    ) -> Result<Dataplane, StartError> {
        Dataplane::start_with(cfg, clock, false)
    }

    /// As [`Dataplane::start`], but the flows of the state files are
    /// adopted only at [`Dataplane::adopt`], once the services that come
    /// later (from Kubernetes) are in: until then the sockets are not in
    /// the steering program's map and the program holds the VIPs' packets
    /// (for its hold window at most).
    pub fn start_deferred(
        cfg: &Config,
        clock: impl Fn() -> u32 + Clone + Send + 'static,
    ) -> Result<Dataplane, StartError> {
        Dataplane::start_with(cfg, clock, true)
    }

    fn start_with(
        cfg: &Config,
        clock: impl Fn() -> u32 + Clone + Send + 'static,
        defer: bool,
    ) -> Result<Dataplane, StartError> {
        let i = &cfg.interfaces;
        if cfg.snat.addresses.is_empty() {
            return Err(StartError::Unsupported("snat.addresses is empty".into()));
        }
        // Two-arm: a socket on each interface per queue, sharing a UMEM;
        // the steering program on both.
        let mut ifnames: Vec<&str> = vec![i.client.as_str()];
        if let (ArmMode::TwoArm, Some(b)) = (i.mode, &i.backend) {
            ifnames.push(b.as_str());
        }
        let mac = interface_mac(ifnames[0])?;
        let backend_mac = interface_mac(ifnames[ifnames.len() - 1])?;
        let backend_mtu = interface_mtu(ifnames[ifnames.len() - 1])?;
        // `steering = "all"`: the program hands every packet to xvs.
        let all = i.steering == SteeringMode::All;
        // SNAT addresses that are the host's own: their ports are checked
        // against the kernel's, and the steering program takes only the
        // SNAT ports' packets to them.
        let shared = crate::host::check_snat(&cfg.snat.addresses, cfg.snat.ports)
            .map_err(StartError::Unsupported)?;
        if all && !shared.is_empty() {
            return Err(StartError::Unsupported(format!(
                "snat.addresses: {} is this host's address, which needs steering = \"vip\" (with \"all\" the kernel would get none of its own traffic)",
                shared[0]
            )));
        }
        // IPv6 SNAT addresses are xvs's alone (the steering program
        // takes every packet to one, neighbour discovery included).
        let host = crate::host::all_addresses().unwrap_or_default();
        if let Some(a) = cfg
            .snat
            .addresses6
            .iter()
            .find(|a| host.contains(&IpAddr::V6(**a)))
        {
            return Err(StartError::Unsupported(format!(
                "snat.addresses: {a} is this host's address; an IPv6 SNAT address must be xvs's own (the host would lose its neighbour discovery and traffic)"
            )));
        }
        let workers = cfg.workers();
        let services: Vec<AnyService> = cfg
            .services
            .iter()
            .enumerate()
            .map(|(n, s)| {
                let seed = cfg.cluster.hash_seed;
                AnyService::compile(n as u32 + 1, s, None, (workers, true), seed).ok_or_else(|| {
                    StartError::Unsupported(format!(
                        "service {}: its addresses are not all of one family",
                        s.key
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        let mut owned: Vec<IpAddr> = cfg.snat.all_addresses();
        owned.extend(services.iter().map(|s| s.key().vip));
        let sync_queues: Vec<Arc<crate::sync::SyncQueue>> = match &cfg.cluster.sync {
            Some(_) => (0..workers).map(|_| Arc::default()).collect(),
            None => Vec::new(),
        };
        let standby = cfg
            .cluster
            .sync
            .as_ref()
            .is_some_and(|s| s.role == xvs_config::SyncRole::Backup);
        // Every large allocation (the flow tables) before anything is
        // attached: a capacity the host cannot hold stops here, leaving
        // nothing on an interface.
        let mut pipelines: Vec<Pipeline> = Vec::with_capacity(workers);
        let mut restored = Vec::with_capacity(workers);
        if cfg.restart.hold_ms == 0 {
            crate::state::remove_files(&cfg.restart.state_dir, &i.client);
        }
        for w in 0..workers {
            let now = clock();
            let capacity = (cfg.conntrack.capacity / workers as u32).max(1);
            let state_err = |e: std::io::Error| {
                StartError::Unsupported(format!(
                    "cannot open the flow state in {}: {e}",
                    cfg.restart.state_dir.display()
                ))
            };
            let pcfg = PipelineConfig {
                worker: w,
                mac,
                backend_mac,
                snat_addrs: cfg.snat.addresses.clone(),
                snat_addrs6: cfg.snat.addresses6.clone(),
                snat_ports: cfg.snat.worker_ports[w],
                capacity,
                timeouts: cfg.conntrack.timeouts,
                rules: cfg.conntrack.rules,
                unknown_port: cfg.vips.unknown_port,
                tunnel: cfg.tunnel,
                backend_mtu,
            };
            let (table, mut r) =
                crate::state::open_table(cfg, w, capacity, now).map_err(state_err)?;
            // The IPv6 table, in its own file, only when IPv6 flows can
            // be made.
            let table6 = if cfg.snat.addresses6.is_empty() {
                FlowTable::new(Pipeline::capacity6(&pcfg), cfg.conntrack.timeouts, now)
            } else {
                let (t, r6) = crate::state::open_table(cfg, w, capacity, now).map_err(state_err)?;
                if r.fresh.is_none() {
                    r.fresh = r6.fresh;
                }
                r.file6 = r6.file;
                t
            };
            let mut pipeline = Pipeline::with_tables(pcfg, table, table6);
            if let Some(q) = sync_queues.get(w) {
                pipeline.set_sync(Some(q.clone()));
            }
            for a in &owned {
                pipeline.own(*a);
            }
            pipeline.share_with_host(&shared);
            if standby {
                pipeline.standby(true, &shared);
            }
            for s in &services {
                pipeline.upsert_service(s.clone());
            }
            if !defer {
                r.adopted = pipeline.adopt(now);
            }
            restored.push(r);
            pipelines.push(pipeline);
        }
        // The program is filled before it is attached, and its queues
        // held until their workers serve: a program left by an earlier
        // xvs is replaced in one step, with no moment where VIP packets
        // reach the kernel.
        let hold_ns = u64::from(cfg.restart.hold_ms) * 1_000_000;
        let mut steerings: Vec<Steering> = ifnames
            .iter()
            .map(|n| Steering::load(n))
            .collect::<Result<_, _>>()?;
        for st in &steerings {
            if all {
                st.steer_all(cfg.snat.ports)?;
            } else {
                st.set_snat_ports(cfg.snat.ports)?;
            }
            // A backup's addresses stay the active gateway's until it
            // takes over (see ha.rs).
            for a in owned.iter().filter(|_| !standby) {
                match a {
                    IpAddr::V4(v4) if shared.contains(v4) => st.share_address(*v4)?,
                    _ => st.add_address(*a)?,
                }
            }
            for &q in &i.queues {
                st.hold(q, hold_ns)?;
            }
        }
        let mut takeovers = Vec::new();
        for st in &mut steerings {
            takeovers.push(st.attach_mode(i.xdp_mode)?);
        }
        let zero_copy = match i.zero_copy {
            ZeroCopy::Auto => None,
            ZeroCopy::On => Some(true),
            ZeroCopy::Off => Some(false),
        };
        // With several workers, replies can land on any queue: each worker
        // hands frames of another's SNAT slice over to it.
        let peers = (workers > 1).then(|| Peers {
            slices: cfg.snat.worker_ports.clone().into(),
            rings: (0..workers)
                .map(|_| Arc::new(Handoff::new(HANDOFF_RING)))
                .collect(),
        });
        let mut handles = Vec::new();
        let mut events = Vec::new();
        for (w, (&queue, &core)) in i.queues.iter().zip(&i.cores).enumerate() {
            let port = XskPort::open(&ifnames, queue, zero_copy)?;
            let fds = port.fds();
            let zero_copy = port.is_zero_copy();
            let huge_pages = port.has_huge_pages();
            if !huge_pages {
                tracing::info!(
                    queue,
                    "the UMEM is on 4 KiB pages: no 2 MiB pages were free (vm.nr_hugepages; \
                     8 per worker)"
                );
            }
            let mut liveness = crate::steer::Liveness::default();
            for (k, st) in steerings.iter().enumerate() {
                if !defer {
                    st.register_socket(queue, port.fd(k))?;
                }
                liveness.join(st.liveness(queue));
            }
            // In worker order (the vector holds one per queue).
            let mut pipeline = pipelines.remove(0);
            let (sender, ev) = FlowEvents::channel();
            pipeline.set_events(sender);
            events.push(ev);
            let (tx, rx) = bounded(CONTROL_QUEUE);
            let wake =
                Arc::new(EventFd::new().map_err(|e| {
                    StartError::Unsupported(format!("cannot create an eventfd: {e}"))
                })?);
            let live = Arc::new(LiveCounters::default());
            let worker = Worker::new(
                w,
                pipeline,
                port,
                i.poll,
                WorkerLinks {
                    control: rx,
                    wake: wake.clone(),
                    peers: peers.clone(),
                    live: live.clone(),
                    liveness,
                },
            );
            let mut worker = worker;
            if defer {
                worker.await_adoption();
            }
            let clock = clock.clone();
            let join = std::thread::Builder::new()
                .name(format!("xvs-q{queue}"))
                .spawn(move || {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                        tracing::warn!(
                            queue,
                            core,
                            "worker cannot pin to its core; running unpinned"
                        );
                    }
                    worker.run(clock)
                })
                .map_err(|e| {
                    StartError::Unsupported(format!("cannot start a worker thread: {e}"))
                })?;
            handles.push(WorkerHandle {
                mailbox: Mailbox { control: tx, wake },
                join: Some(join),
                ring: peers.as_ref().map(|p| p.rings[w].clone()),
                live,
                sent: AtomicU64::new(0),
                fds,
                queue,
                zero_copy,
                huge_pages,
            });
        }
        let sync = match &cfg.cluster.sync {
            Some(sc) => Some(ha::start_sync(
                sc,
                sync_queues,
                &handles,
                &cfg.snat.worker_ports,
            )?),
            None => None,
        };
        // From here on the program outlives the process: the hold window
        // covers a stop, a crash or an upgrade.
        if hold_ns > 0 {
            for st in &mut steerings {
                st.keep_attached();
            }
        }
        Ok(Dataplane {
            handle: DataplaneHandle { workers: handles },
            takeovers,
            restored,
            pending: defer,
            clock: Box::new(clock),
            steerings,
            ifname: match &ifnames[..] {
                [one] => (*one).to_owned(),
                [client, backend, ..] => format!("{client} (clients) and {backend} (backends)"),
                [] => String::new(),
            },
            compiled: services.iter().map(|s| (s.key(), s.clone())).collect(),
            events,
            next_id: services.len() as u32 + 1,
            workers,
            hash_seed: cfg.cluster.hash_seed,
            sync,
            standby,
            taken: Vec::new(),
            snat_all: cfg.snat.all_addresses(),
            shared,
        })
        .inspect(|d| d.announce_addresses())
    }

    /// Adds or replaces a service (by its key) on every worker: compiled
    /// once, O(that service); other services are not touched. Flows of a
    /// replaced service keep their backend.
    pub fn upsert_service(&mut self, svc: &xvs_config::Service) -> Result<(), SteerError> {
        let prev = self.compiled.get(&svc.key).cloned();
        let id = match &prev {
            Some(p) => p.id(),
            None => {
                let id = self.next_id;
                self.next_id += 1;
                id
            }
        };
        let applied = self.handle.applied();
        let at = (self.workers, applied);
        let Some(compiled) = AnyService::compile(id, svc, prev.as_ref(), at, self.hash_seed) else {
            return Err(SteerError::Bpf {
                what: format!("add service {}", svc.key),
                source: std::io::Error::other("its addresses are not all of one family"),
            });
        };
        for st in self.steerings.iter().filter(|_| !self.standby) {
            st.add_address(svc.key.vip)?;
        }
        for w in &self.handle.workers {
            self.handle.send_to(w, Control::Own(svc.key.vip));
        }
        self.compiled.insert(svc.key, compiled.clone());
        self.handle.upsert(compiled);
        self.announce_addresses();
        Ok(())
    }

    /// Removes a service. When it was the last one on its VIP, the VIP is
    /// released: the steering program passes its packets to the kernel
    /// again (which answers them, or serves them if the address is its
    /// own) and the workers stop answering ARP and ping for it; flows of
    /// the service that are left end there (as `expire_nodest_conn` ends
    /// them while the VIP is kept for another service's port).
    pub fn remove_service(&mut self, key: xvs_config::ServiceKey) -> Result<(), SteerError> {
        self.compiled.remove(&key);
        self.handle.remove(key);
        if self.compiled.keys().any(|k| k.vip == key.vip) {
            return Ok(());
        }
        for w in &self.handle.workers {
            self.handle.send_to(w, Control::Disown(key.vip));
        }
        self.announce_addresses();
        let mut first_error = None;
        for st in self.steerings.iter().filter(|_| !self.standby) {
            if let Err(e) = st.remove_address(key.vip) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The addresses the steering program hands to xvs, as its map holds
    /// them (read back from the kernel: what is, not what was meant),
    /// with whether each is shared with the host; sorted.
    pub fn steered(&self) -> Result<Vec<(IpAddr, bool)>, SteerError> {
        match self.steerings.first() {
            Some(st) => st.addresses(),
            None => Ok(Vec::new()),
        }
    }

    /// Every worker's flow event queue.
    pub fn events(&self) -> &[Arc<FlowEvents>] {
        &self.events
    }

    /// The services the workers have (or are about to have: see
    /// [`DataplaneHandle::wait_applied`]), with their counts and counters.
    pub fn services(&self) -> impl Iterator<Item = &AnyService> {
        self.compiled.values()
    }

    /// The handle for updates and snapshots.
    pub fn handle(&self) -> &DataplaneHandle {
        &self.handle
    }

    /// What attaching the steering program found on each interface (an
    /// earlier xvs's program replaced, and what it held).
    pub fn takeovers(&self) -> &[crate::steer::Takeover] {
        &self.takeovers
    }

    /// Adopts the state files' flows on every worker, now that the
    /// services are in, then hands the queues' packets to the workers (a
    /// data plane started with [`Dataplane::start`] did both at start).
    /// Whether this call adopted (false: done already).
    pub fn adopt(&mut self) -> Result<bool, SteerError> {
        if !std::mem::take(&mut self.pending) {
            return Ok(false);
        }
        for (w, h) in self.handle.workers.iter().enumerate() {
            let (tx, rx) = bounded(1);
            self.handle.send_to(
                h,
                Control::Adopt {
                    now: (self.clock)(),
                    reply: tx,
                },
            );
            if let (Ok(adopted), Some(r)) = (
                rx.recv_timeout(Duration::from_secs(30)),
                self.restored.get_mut(w),
            ) {
                r.adopted = adopted;
            }
            for (k, st) in self.steerings.iter().enumerate() {
                if let Some(&fd) = h.fds.get(k) {
                    st.register_socket(h.queue, fd)?;
                }
            }
        }
        Ok(true)
    }

    /// What each worker made of its flow state file at start.
    pub fn restored(&self) -> &[crate::state::Restored] {
        &self.restored
    }

    /// The ids of the attached steering programs, one per interface.
    pub fn program_ids(&self) -> Vec<Option<u32>> {
        self.steerings.iter().map(Steering::program_id).collect()
    }

    /// The interface it serves (two-arm: both, with their roles).
    pub fn interface(&self) -> &str {
        &self.ifname
    }

    /// Stops every worker, then detaches the steering program; returns the
    /// workers' final snapshots.
    pub fn stop(mut self) -> Vec<Snapshot> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Vec<Snapshot> {
        self.stop_sync();
        // Every worker is told first, so they stop together.
        for w in &self.handle.workers {
            self.handle.send_to(w, Control::Stop);
        }
        let mut out = Vec::new();
        for w in &mut self.handle.workers {
            if let Some(j) = w.join.take() {
                if let Ok(s) = j.join() {
                    out.push(s);
                }
            }
        }
        // What was handed over after its owner stopped is counted, not lost.
        for s in &mut out {
            if let Some(ring) = self
                .handle
                .workers
                .get(s.worker)
                .and_then(|w| w.ring.as_ref())
            {
                s.handoff_left = ring.len() as u64;
            }
        }
        self.steerings.clear();
        out
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        if self.handle.workers.iter().any(|w| w.join.is_some()) {
            self.shutdown();
        }
    }
}
