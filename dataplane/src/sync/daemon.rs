//! The sync thread: drains the workers' record queues into datagrams to
//! the peers, sends a hello every [`HELLO_MS`] (the addresses this
//! gateway serves; the peers' liveness signal: five of them fit in the
//! shortest `peer_timeout`), and receives the peers'
//! datagrams, which it checks whole ([`parse`]) before handing their
//! records to the workers.
//!
//! One thread, plain blocking UDP with a short timeout: a few thousand
//! datagrams a second at most, far from the packet path, which never
//! waits on it. Peers are tracked by node id: their epoch and sequence
//! (a datagram seen already, or of an older epoch, is a replay and is
//! dropped), datagrams lost (sequence gaps), when they were last heard
//! and what they announced.
//!
//! Invariants: every received datagram is either applied or counted
//! under exactly one [`SyncDrop`] reason; every record taken from a
//! queue is sent (or counted lost with its datagram when the socket
//! refuses it).

// The sync thread is an I/O edge: it reads the clock for its flushes,
// hellos, peers' silence and its epoch.
#![allow(clippy::disallowed_types)]

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ring::hmac;
use xvs_config::Sync as Settings;

use super::wire::{parse, Body, Builder, Kind, Role, SyncDrop, SyncRecord};
use super::SyncQueue;

/// Longest a record waits in a queue before it is sent while records
/// flow, in milliseconds.
pub const FLUSH_MS: u64 = 1;
/// How long the thread waits for a datagram when the queues were empty,
/// in milliseconds (records then wait this long at most).
pub const IDLE_MS: u64 = 10;
/// Milliseconds between hellos. A peer's liveness check
/// (`peer_timeout`, at least [`xvs_config::MIN_PEER_TIMEOUT_MS`]) must
/// see several in its window: with one hello a second and a one-second
/// timeout, a live peer's next hello arriving a few milliseconds late
/// made it look silent, and both gateways took the addresses over.
pub const HELLO_MS: u64 = 100;
const _: () = assert!(HELLO_MS * 5 <= xvs_config::MIN_PEER_TIMEOUT_MS);

/// Where received records go: `(records)` of one datagram, each to the
/// worker that owns its flow (the runtime decides).
pub type Deliver = Box<dyn FnMut(Vec<SyncRecord>) + Send>;

/// The daemon's counters.
#[derive(Debug, Default)]
pub struct SyncCounters {
    sent_datagrams: AtomicU64,
    sent_records: AtomicU64,
    send_errors: AtomicU64,
    received_datagrams: AtomicU64,
    received_records: AtomicU64,
    lagging: AtomicU64,
    lost: AtomicU64,
    dropped: [AtomicU64; SyncDrop::COUNT],
}

/// A reading of the daemon's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncReading {
    /// Datagrams sent (flows and hellos).
    pub sent_datagrams: u64,
    /// Flow records sent.
    pub sent_records: u64,
    /// Datagrams the socket refused (their records are lost).
    pub send_errors: u64,
    /// Datagrams received and applied.
    pub received_datagrams: u64,
    /// Flow records received and handed to the workers.
    pub received_records: u64,
    /// Records that waited more than a second before they were sent (in
    /// this gateway's queues, or as a received record says of the
    /// peer's).
    pub lagging: u64,
    /// Peers' datagrams never received (gaps in their sequences).
    pub lost: u64,
    /// Records the workers' queues had no room for.
    pub overflow: u64,
    /// Received datagrams dropped, by reason.
    pub dropped: Vec<(String, u64)>,
}

/// A peer as this gateway knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerView {
    /// Its node id.
    pub node: u32,
    /// Where its datagrams come from.
    pub from: SocketAddr,
    /// Milliseconds since it was last heard.
    pub silent_ms: u64,
    /// Its epoch and last sequence number.
    pub epoch: u32,
    /// Last sequence number.
    pub seq: u32,
    /// Its datagrams lost.
    pub lost: u64,
    /// Its SNAT addresses (from its hellos).
    pub snat: Vec<IpAddr>,
    /// The VIPs it serves (from its hellos).
    pub vips: Vec<IpAddr>,
}

#[derive(Debug)]
struct Peer {
    from: SocketAddr,
    heard: Instant,
    epoch: u32,
    seq: u32,
    lost: u64,
    announced: Vec<(IpAddr, Role)>,
}

/// What the thread and the control side share.
struct Shared {
    counters: SyncCounters,
    peers: Mutex<BTreeMap<u32, Peer>>,
    /// What this gateway announces in its hellos.
    announce: Mutex<Vec<(IpAddr, Role)>>,
    stop: AtomicBool,
}

/// The running sync thread.
pub struct SyncDaemon {
    shared: Arc<Shared>,
    queues: Vec<Arc<SyncQueue>>,
    settings: Settings,
    join: Option<JoinHandle<()>>,
}

impl SyncDaemon {
    /// Binds the socket (joining the group when the peer is one) and
    /// starts the thread draining `queues` and delivering to `deliver`;
    /// `secret` is the key file's content.
    pub fn start(
        settings: &Settings,
        secret: Option<&[u8]>,
        queues: Vec<Arc<SyncQueue>>,
        deliver: Deliver,
    ) -> io::Result<SyncDaemon> {
        let socket = bind(settings)?;
        let shared = Arc::new(Shared {
            counters: SyncCounters::default(),
            peers: Mutex::new(BTreeMap::new()),
            announce: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let mut ctx = Thread {
            socket,
            settings: settings.clone(),
            key: secret.map(super::wire::key),
            // A restarted gateway starts a later epoch (its peers take
            // its sequence numbers afresh; older ones are replays).
            epoch: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as u32)
                .unwrap_or(1),
            seq: 0,
            queues: queues.clone(),
            shared: shared.clone(),
            deliver,
        };
        let join = std::thread::Builder::new()
            .name("xvs-sync".into())
            .spawn(move || ctx.run())?;
        Ok(SyncDaemon {
            shared,
            queues,
            settings: settings.clone(),
            join: Some(join),
        })
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Announces `addrs` in the hellos from now on.
    pub fn set_announced(&self, addrs: Vec<(IpAddr, Role)>) {
        if let Ok(mut a) = self.shared.announce.lock() {
            *a = addrs;
        }
    }

    /// The peers heard so far, by node id.
    pub fn peers(&self) -> Vec<PeerView> {
        let Ok(peers) = self.shared.peers.lock() else {
            return Vec::new();
        };
        peers
            .iter()
            .map(|(&node, p)| PeerView {
                node,
                from: p.from,
                silent_ms: p.heard.elapsed().as_millis() as u64,
                epoch: p.epoch,
                seq: p.seq,
                lost: p.lost,
                snat: pick(&p.announced, Role::Snat),
                vips: pick(&p.announced, Role::Vip),
            })
            .collect()
    }

    /// The counters now.
    pub fn reading(&self) -> SyncReading {
        let c = &self.shared.counters;
        SyncReading {
            sent_datagrams: c.sent_datagrams.load(Relaxed),
            sent_records: c.sent_records.load(Relaxed),
            send_errors: c.send_errors.load(Relaxed),
            received_datagrams: c.received_datagrams.load(Relaxed),
            received_records: c.received_records.load(Relaxed),
            lagging: c.lagging.load(Relaxed),
            lost: c.lost.load(Relaxed),
            overflow: self.queues.iter().map(|q| q.overflow()).sum(),
            dropped: SyncDrop::ALL
                .iter()
                .map(|d| (d.name().to_owned(), c.dropped[d.index()].load(Relaxed)))
                .collect(),
        }
    }

    /// Stops the thread (it sends what its queues still hold first).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

impl Drop for SyncDaemon {
    fn drop(&mut self) {
        self.halt();
    }
}

fn pick(announced: &[(IpAddr, Role)], role: Role) -> Vec<IpAddr> {
    announced
        .iter()
        .filter(|(_, r)| *r == role)
        .map(|(a, _)| *a)
        .collect()
}

/// The socket: bound to `listen` for unicast; for a multicast group,
/// bound to the group's port on every address, the group joined on the
/// interface of `listen`'s address, sent from there with TTL 1 and
/// without looping back.
fn bind(s: &Settings) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if s.listen.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_reuse_address(true)?;
    if s.multicast() {
        let group = s.peers[0];
        match (group.ip(), s.listen.ip()) {
            (IpAddr::V4(g), IpAddr::V4(me)) => {
                sock.bind(
                    &SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), group.port())
                        .into(),
                )?;
                sock.join_multicast_v4(&g, &me)?;
                sock.set_multicast_if_v4(&me)?;
                sock.set_multicast_loop_v4(false)?;
                sock.set_multicast_ttl_v4(1)?;
            }
            (IpAddr::V6(g), IpAddr::V6(_)) => {
                sock.bind(
                    &SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), group.port())
                        .into(),
                )?;
                sock.join_multicast_v6(&g, 0)?;
                sock.set_multicast_loop_v6(false)?;
                sock.set_multicast_hops_v6(1)?;
            }
            _ => {
                return Err(io::Error::other(
                    "the group and listen are of different families",
                ))
            }
        }
    } else {
        sock.bind(&s.listen.into())?;
    }
    let sock: UdpSocket = sock.into();
    sock.set_read_timeout(Some(Duration::from_millis(IDLE_MS)))?;
    Ok(sock)
}

struct Thread {
    socket: UdpSocket,
    settings: Settings,
    key: Option<hmac::Key>,
    epoch: u32,
    seq: u32,
    queues: Vec<Arc<SyncQueue>>,
    shared: Arc<Shared>,
    deliver: Deliver,
}

impl Thread {
    fn run(&mut self) {
        let mut flows = Builder::new(Kind::Flows);
        let mut buf = vec![0u8; 65_536];
        let mut last_hello: Option<Instant> = None;
        let mut busy = false;
        loop {
            let stopping = self.shared.stop.load(Relaxed);
            // Received: until the socket's timeout says nothing is left.
            loop {
                match self.socket.recv_from(&mut buf) {
                    Ok((n, from)) => self.received(&buf[..n], from),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        break
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!("sync: receive failed: {e}");
                        break;
                    }
                }
                if self.shared.stop.load(Relaxed) {
                    break;
                }
            }
            // Records flowing: back soon; none: wait longer.
            let flowing = self.drain(&mut flows) > 0;
            if flowing != busy {
                busy = flowing;
                let wait = if busy { FLUSH_MS } else { IDLE_MS };
                let _ = self
                    .socket
                    .set_read_timeout(Some(Duration::from_millis(wait)));
            }
            if last_hello.is_none_or(|t| t.elapsed() >= Duration::from_millis(HELLO_MS)) {
                self.hello();
                last_hello = Some(Instant::now());
            }
            if stopping {
                return;
            }
        }
    }

    /// Seconds on the workers' clock (the records' stamps).
    fn now(&self) -> u32 {
        crate::steer::monotonic_secs()
    }

    /// Sends what the queues hold, in as few datagrams as it fits in;
    /// how many records.
    fn drain(&mut self, flows: &mut Builder) -> usize {
        let mut taken = 0;
        let now = self.now();
        let shared = self.shared.clone();
        for q in self.queues.clone() {
            while let Some((at, mut r)) = q.pop() {
                let waited = now.saturating_sub(at);
                // Whole seconds of the clock: 2 apart is more than one.
                if waited >= 2 {
                    shared.counters.lagging.fetch_add(1, Relaxed);
                }
                r.lag = waited.min(255) as u8;
                taken += 1;
                if !flows.push(&r) {
                    self.send(flows);
                    flows.push(&r);
                }
            }
        }
        if flows.count() > 0 {
            self.send(flows);
        }
        taken
    }

    fn hello(&mut self) {
        let mut b = Builder::new(Kind::Hello);
        let announce = self
            .shared
            .announce
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default();
        for (addr, role) in announce {
            if !b.push_address(addr, role) {
                break;
            }
        }
        self.send(&mut b);
    }

    fn send(&mut self, b: &mut Builder) {
        self.seq = self.seq.wrapping_add(1);
        let records = u64::from(b.count());
        let kind_flows = b.kind() == Kind::Flows;
        let s = &self.settings;
        let d = b.finish(s.id, s.node, self.epoch, self.seq, self.key.as_ref());
        let c = &self.shared.counters;
        for peer in &s.peers {
            match self.socket.send_to(d, peer) {
                Ok(_) => {
                    c.sent_datagrams.fetch_add(1, Relaxed);
                    if kind_flows {
                        c.sent_records.fetch_add(records, Relaxed);
                    }
                }
                Err(_) => {
                    c.send_errors.fetch_add(1, Relaxed);
                }
            }
        }
        b.clear();
    }

    fn dropped(&self, why: SyncDrop) {
        self.shared.counters.dropped[why.index()].fetch_add(1, Relaxed);
    }

    fn received(&mut self, d: &[u8], from: SocketAddr) {
        let s = &self.settings;
        // Unicast: only the configured peers' addresses are listened to.
        if !s.multicast() && !s.peers.iter().any(|p| p.ip() == from.ip()) {
            return self.dropped(SyncDrop::UnknownPeer);
        }
        let (h, body) = match parse(d, s.id, self.key.as_ref()) {
            Ok(x) => x,
            Err(why) => return self.dropped(why),
        };
        if h.node == s.node {
            return self.dropped(SyncDrop::FromSelf);
        }
        let c = &self.shared.counters;
        {
            let Ok(mut peers) = self.shared.peers.lock() else {
                return;
            };
            let p = peers.entry(h.node).or_insert(Peer {
                from,
                heard: Instant::now(),
                epoch: h.epoch,
                seq: h.seq.wrapping_sub(1),
                lost: 0,
                announced: Vec::new(),
            });
            if h.epoch < p.epoch || (h.epoch == p.epoch && h.seq <= p.seq) {
                drop(peers);
                return self.dropped(SyncDrop::Replayed);
            }
            if h.epoch == p.epoch {
                let gap = u64::from(h.seq - p.seq - 1);
                p.lost += gap;
                c.lost.fetch_add(gap, Relaxed);
            }
            p.epoch = h.epoch;
            p.seq = h.seq;
            p.from = from;
            p.heard = Instant::now();
            if let Body::Hello(addrs) = &body {
                p.announced.clone_from(addrs);
            }
        }
        c.received_datagrams.fetch_add(1, Relaxed);
        if let Body::Flows(records) = body {
            let late = records.iter().filter(|r| r.lag >= 2).count() as u64;
            c.lagging.fetch_add(late, Relaxed);
            c.received_records.fetch_add(records.len() as u64, Relaxed);
            (self.deliver)(records);
        }
    }
}
