//! Flow events on the control side: a collector drains every worker's
//! queue every 20 ms, stamps the events with wall-clock time, keeps the
//! last [`HISTORY`] of them and fans them out to live followers
//! (`GET /v1/events`, `xvsadm observe`). A slow follower misses events,
//! never slows the collector. Events are never lost without a word: a
//! follower is told, in the stream, how many a full worker queue
//! (`WORKER_QUEUE`, also `xvs_flow_events_overflow_total`) or its own lag
//! (`FOLLOWER_QUEUE`) cost it, as hubble's `EVENTS LOST` lines do
//! ([`LostEvents`]).
//!
//! Invariant: an event is kept and sent to followers as the data plane
//! sent it (a copy, no allocation), filtered in that form, and turned
//! into its text form ([`EventView`]: five formatted addresses) only
//! when a reader's filter passes it: a drain costs a copy per event and
//! per follower. (Hubble keeps flows in its ring and renders them for
//! `observe` the same way. Rendering every event as it came, read or
//! not, took 1.4 µs each: at 400k new flows a second, most of a core;
//! `cargo bench -p xvs-benches --bench events`.)

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xvs_config::HostPort;
use xvs_conntrack::Endpoint;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use xvs_dataplane::events::{EventKind, FlowEvent, FlowEvents};

/// Events kept for `--last`.
pub const HISTORY: usize = 4096;

/// How often the collector drains the workers' queues.
pub const DRAIN_EVERY: Duration = Duration::from_millis(20);

/// One event as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
    /// Milliseconds since the UNIX epoch (when the collector took it).
    pub time_ms: u64,
    /// Worker.
    pub worker: u16,
    /// `NEW`, `CLOSED` or `DROPPED`; `BACKEND_UP` or `BACKEND_DOWN` for a
    /// health check's verdict (worker 0, source `health-check`).
    pub verdict: String,
    /// Drop reason (snake_case), for drops.
    pub reason: Option<String>,
    /// `TCP`, `UDP`, `ICMP` or the protocol number.
    pub protocol: String,
    /// Source `addr:port`.
    pub src: String,
    /// Destination `addr:port` (the VIP for flows).
    pub dst: String,
    /// Backend `addr:port`, for flows.
    pub backend: Option<String>,
    /// SNAT `addr:port` towards the backend, for flows.
    #[serde(default)]
    pub snat: Option<String>,
}

#[cfg(test)]
impl EventView {
    /// A TCP flow's `verdict` event: 198.18.0.2:40000 to 198.19.0.1:80,
    /// scheduled to 198.18.1.10:8080 through 198.18.1.2:1024.
    pub(crate) fn sample(verdict: &str) -> EventView {
        EventView {
            time_ms: 0,
            worker: 0,
            verdict: verdict.into(),
            reason: None,
            protocol: "TCP".into(),
            src: "198.18.0.2:40000".into(),
            dst: "198.19.0.1:80".into(),
            backend: Some("198.18.1.10:8080".into()),
            snat: Some("198.18.1.2:1024".into()),
        }
    }
}

/// Events a follower did not get, as hubble's `lost_events`: from a
/// worker's full queue (`WORKER_QUEUE`, with the worker) or from the
/// follower's own lag behind the collector (`FOLLOWER_QUEUE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostEvents {
    /// `WORKER_QUEUE` or `FOLLOWER_QUEUE`.
    pub source: String,
    /// How many.
    pub num_events_lost: u64,
    /// The worker whose queue was full.
    pub worker: Option<u16>,
}

/// A follower's stream line for [`LostEvents`]: `{"lost_events": ...}`
/// (an event's line has no such field).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostLine {
    /// What was lost.
    pub lost_events: LostEvents,
}

impl LostEvents {
    /// hubble's compact line: `EVENTS LOST: WORKER_QUEUE worker(0) 1234`.
    pub fn line(&self) -> String {
        match self.worker {
            Some(w) => format!(
                "EVENTS LOST: {} worker({w}) {}",
                self.source, self.num_events_lost
            ),
            None => format!("EVENTS LOST: {} {}", self.source, self.num_events_lost),
        }
    }

    /// A follower's lag: `n` events it will not get.
    pub fn behind(n: u64) -> LostEvents {
        LostEvents {
            source: "FOLLOWER_QUEUE".into(),
            num_events_lost: n,
            worker: None,
        }
    }
}

/// What a follower receives: an event (a flow's as the data plane sent
/// it, with its wall-clock stamp: each follower renders only what its
/// filter passes), or a count of those lost.
#[derive(Debug, Clone)]
pub enum Live {
    /// A flow's event and its time (ms since the UNIX epoch).
    Flow(FlowEvent, u64),
    /// One of the control plane's own (a health check's verdict).
    Event(EventView),
    /// Events lost before the collector could take them.
    Lost(LostEvents),
}

/// One line of a follower's stream (newline-terminated JSON): an event
/// that passes `filter`, or a notice of lost events (whatever the
/// filter: what was lost might have passed it); `None` when the
/// collector is gone.
pub async fn next_line(rx: &mut broadcast::Receiver<Live>, filter: &EventFilter) -> Option<String> {
    use broadcast::error::RecvError;
    let lost = |l: LostEvents| serde_json::to_string(&LostLine { lost_events: l });
    let text = loop {
        match rx.recv().await {
            Ok(Live::Flow(e, time_ms)) if filter.matches_flow(&e) => {
                let mut line = String::with_capacity(LINE_CAPACITY);
                flow_json(&e, time_ms, &mut line);
                line.push('\n');
                return Some(line);
            }
            Ok(Live::Event(e)) if filter.matches(&e) => break serde_json::to_string(&e),
            Ok(Live::Flow(..) | Live::Event(_)) => continue,
            Ok(Live::Lost(l)) => break lost(l),
            Err(RecvError::Lagged(n)) => break lost(LostEvents::behind(n)),
            Err(RecvError::Closed) => return None,
        }
    };
    Some(text.unwrap_or_default() + "\n")
}

/// `observe`'s filters, named as `hubble observe`'s flags: `xvsadm
/// observe`'s flags, `GET /v1/events`'s query keys (the same names, with
/// `_` for `-`); `None` passes every event. A flow's ends: the client
/// (`from`), the VIP and the backend (`to`: either, as hubble shows a
/// service's flow to the endpoint it was translated to). A health
/// check's event comes from no address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct EventFilter {
    /// Only this verdict: NEW, CLOSED, DROPPED, FORWARDED (new or
    /// closed), BACKEND_UP or BACKEND_DOWN.
    #[arg(long)]
    pub verdict: Option<String>,
    /// Only flows to this VIP:PORT.
    #[arg(long)]
    pub service: Option<String>,
    /// Only flows with this address at either end (client, VIP or
    /// backend).
    #[arg(long)]
    pub ip: Option<IpAddr>,
    /// Only flows from this client address.
    #[arg(long)]
    pub from_ip: Option<IpAddr>,
    /// Only flows to this VIP or backend address.
    #[arg(long)]
    pub to_ip: Option<IpAddr>,
    /// Only flows with this port at either end.
    #[arg(long)]
    pub port: Option<u16>,
    /// Only flows from this client port.
    #[arg(long)]
    pub from_port: Option<u16>,
    /// Only flows to this VIP or backend port.
    #[arg(long)]
    pub to_port: Option<u16>,
    /// Only this protocol: tcp, udp or icmp.
    #[arg(long)]
    pub protocol: Option<String>,
}

/// The verdicts `--verdict` takes (any case): an event's own, and
/// hubble's `FORWARDED`, a flow's new or closed event (its packets were
/// forwarded).
pub const VERDICTS: [&str; 6] = [
    "NEW",
    "CLOSED",
    "DROPPED",
    "FORWARDED",
    "BACKEND_UP",
    "BACKEND_DOWN",
];

/// The protocols `--protocol` takes (any case).
pub const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "ICMP"];

impl EventFilter {
    /// Why the filter can match no event (a verdict or protocol no event
    /// has), instead of showing nothing without a word.
    pub fn check(&self) -> Result<(), String> {
        let known = |v: &Option<String>, names: &[&str], what: &str| match v {
            Some(v) if !names.iter().any(|n| n.eq_ignore_ascii_case(v)) => {
                Err(format!("{what} `{v}': one of {}", names.join(", ")))
            }
            _ => Ok(()),
        };
        known(&self.verdict, &VERDICTS, "verdict")?;
        known(&self.protocol, &PROTOCOLS, "protocol")
    }

    /// Whether `e` passes every filter given.
    pub fn matches(&self, e: &EventView) -> bool {
        let end = |s: &str| s.parse::<SocketAddr>().ok();
        self.passes(&Facts {
            verdict: &e.verdict,
            protocol: &e.protocol,
            src: end(&e.src),
            dst: end(&e.dst),
            backend: e.backend.as_deref().and_then(end),
        })
    }

    /// Whether a flow's event as the data plane sent it passes: the same
    /// answer as [`EventFilter::matches`] on its [`EventView`], without
    /// rendering it (a follower's filter runs on every event).
    pub fn matches_flow(&self, e: &FlowEvent) -> bool {
        let end = |p: &Endpoint<IpAddr>| SocketAddr::new(p.addr, p.port);
        self.passes(&Facts {
            verdict: e.kind.verdict(),
            protocol: proto_str(e.protocol),
            src: Some(end(&e.src)),
            dst: Some(end(&e.dst)),
            backend: (e.backend.addr != FlowEvent::NONE.addr).then(|| end(&e.backend)),
        })
    }

    /// The one matcher both forms go through.
    fn passes(&self, e: &Facts<'_>) -> bool {
        let service = |s: &str| {
            s.parse::<SocketAddr>()
                .ok()
                .is_some_and(|s| e.dst == Some(s))
        };
        let named = self.verdict.as_deref().is_none_or(|v| {
            e.verdict.eq_ignore_ascii_case(v)
                || (v.eq_ignore_ascii_case("FORWARDED") && matches!(e.verdict, "NEW" | "CLOSED"))
        }) && self.service.as_deref().is_none_or(service)
            && self
                .protocol
                .as_deref()
                .is_none_or(|p| e.protocol.eq_ignore_ascii_case(p));
        if !named {
            return false;
        }
        let from = [e.src];
        let to = [e.dst, e.backend];
        let all = [e.src, e.dst, e.backend];
        let ip = |want: Option<IpAddr>, ends: &[Option<SocketAddr>]| {
            want.is_none_or(|w| ends.iter().flatten().any(|a| a.ip() == w))
        };
        let port = |want: Option<u16>, ends: &[Option<SocketAddr>]| {
            want.is_none_or(|w| ends.iter().flatten().any(|a| a.port() == w))
        };
        ip(self.ip, &all)
            && ip(self.from_ip, &from)
            && ip(self.to_ip, &to)
            && port(self.port, &all)
            && port(self.from_port, &from)
            && port(self.to_port, &to)
    }
}

/// What a filter looks at in an event (the client, the VIP, the backend).
struct Facts<'a> {
    verdict: &'a str,
    protocol: &'a str,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    backend: Option<SocketAddr>,
}

/// Room for one flow's line: IPv6 at every endpoint fits.
const LINE_CAPACITY: usize = 320;

/// Writes `serde_json::to_string(&EventView::of(e, time_ms))`'s JSON
/// straight into `out`: the same object (fields, order, `null`s), without
/// the view's seven strings. A follower taking every event renders each
/// one, and at 400,000 events a second the view and its serializer
/// cost most of a core (`cargo bench -p xvs-benches --bench events`).
/// Hand-written because every value is a number or a string that needs
/// no escaping (addresses, ports, fixed names); a proptest holds it to
/// the serializer's output.
fn flow_json(e: &FlowEvent, time_ms: u64, out: &mut String) {
    use std::fmt::Write;
    let quoted = |out: &mut String, ep: &Endpoint<IpAddr>| match shown(ep) {
        Some(hp) => {
            let _ = write!(out, "\"{hp}\"");
        }
        None => out.push_str("null"),
    };
    let _ = write!(
        out,
        "{{\"time_ms\":{time_ms},\"worker\":{},\"verdict\":\"{}\",\"reason\":",
        e.worker,
        e.kind.verdict()
    );
    match e.kind {
        EventKind::Drop(r) => {
            let _ = write!(out, "\"{}\"", r.name());
        }
        _ => out.push_str("null"),
    }
    let _ = write!(out, ",\"protocol\":\"{}\"", ProtoName(e.protocol));
    let _ = write!(out, ",\"src\":\"{}\"", HostPort(e.src.addr, e.src.port));
    let _ = write!(out, ",\"dst\":\"{}\"", HostPort(e.dst.addr, e.dst.port));
    out.push_str(",\"backend\":");
    quoted(out, &e.backend);
    out.push_str(",\"snat\":");
    quoted(out, &e.snat);
    out.push('}');
}

/// An IP protocol's name as events show it (a number has none here: no
/// `--protocol` names it).
fn proto_str(p: u8) -> &'static str {
    match p {
        6 => "TCP",
        17 => "UDP",
        1 => "ICMP",
        _ => "-",
    }
}

/// How events show a protocol: its name, else its number (0: `-`).
struct ProtoName(u8);

impl std::fmt::Display for ProtoName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match proto_str(self.0) {
            "-" if self.0 != 0 => write!(f, "{}", self.0),
            name => f.write_str(name),
        }
    }
}

/// A flow event's endpoint as shown, or none if the event has none there
/// (an unset backend or SNAT address).
fn shown(ep: &Endpoint<IpAddr>) -> Option<HostPort<IpAddr>> {
    (ep.addr != FlowEvent::NONE.addr).then_some(HostPort(ep.addr, ep.port))
}

impl EventView {
    fn of(e: &FlowEvent, time_ms: u64) -> EventView {
        EventView {
            time_ms,
            worker: e.worker,
            verdict: e.kind.verdict().into(),
            reason: match e.kind {
                EventKind::Drop(r) => Some(r.name().into()),
                _ => None,
            },
            protocol: ProtoName(e.protocol).to_string(),
            src: HostPort(e.src.addr, e.src.port).to_string(),
            dst: HostPort(e.dst.addr, e.dst.port).to_string(),
            backend: shown(&e.backend).map(|hp| hp.to_string()),
            snat: shown(&e.snat).map(|hp| hp.to_string()),
        }
    }

    /// A health check's verdict on a backend (`BACKEND_UP` or
    /// `BACKEND_DOWN` with why), from the control plane (worker 0), now.
    pub fn health(c: &xvs_config::BackendCheck, up: bool, why: Option<String>) -> EventView {
        EventView {
            time_ms: now_ms(),
            worker: 0,
            verdict: if up { "BACKEND_UP" } else { "BACKEND_DOWN" }.into(),
            reason: why,
            protocol: c.service.protocol.name().to_ascii_uppercase(),
            src: "health-check".into(),
            dst: HostPort(c.service.vip, c.service.port).to_string(),
            backend: Some(HostPort(c.address, c.port).to_string()),
            snat: None,
        }
    }

    /// One line like `hubble observe`'s.
    pub fn line(&self) -> String {
        let secs = self.time_ms / 1000;
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        let health = self.verdict.starts_with("BACKEND_");
        let tail = match (&self.reason, &self.backend) {
            (Some(r), Some(b)) if health => format!(" {b}: {r}"),
            (None, Some(b)) if health => format!(" {b}"),
            (Some(r), _) => format!(" {r}"),
            (None, Some(b)) => format!(" to {b}"),
            _ => String::new(),
        };
        format!(
            "{h:02}:{m:02}:{s:02}.{:03}: {} -> {} {} ({}){tail}",
            self.time_ms % 1000,
            self.src,
            self.dst,
            self.verdict,
            self.protocol
        )
    }
}

/// Milliseconds since the UNIX epoch: wall-clock stamps for operators
/// (the data plane has only its own monotonic seconds).
fn now_ms() -> u64 {
    #[allow(clippy::disallowed_types)]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An event as the history keeps it: a flow's as the data plane sent it
/// (rendered when read), the control plane's own (rare) already rendered.
enum Kept {
    Flow(FlowEvent, u64),
    Own(Box<EventView>),
}

impl Kept {
    fn passes(&self, filter: &EventFilter) -> bool {
        match self {
            Kept::Flow(e, _) => filter.matches_flow(e),
            Kept::Own(v) => filter.matches(v),
        }
    }

    fn view(&self) -> EventView {
        match self {
            Kept::Flow(e, time_ms) => EventView::of(e, *time_ms),
            Kept::Own(v) => (**v).clone(),
        }
    }
}

/// The collector's shared state.
pub struct Collector {
    history: Mutex<VecDeque<Kept>>,
    live: broadcast::Sender<Live>,
}

impl Collector {
    /// Empty.
    pub fn new() -> Arc<Collector> {
        let (live, _) = broadcast::channel(HISTORY);
        Arc::new(Collector {
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
            live,
        })
    }

    /// The last `n` events that pass the filter, oldest first.
    pub fn last(&self, n: usize, filter: &EventFilter) -> Vec<EventView> {
        let h = self.history();
        let mut v: Vec<EventView> = h
            .iter()
            .rev()
            .filter(|k| k.passes(filter))
            .take(n)
            .map(Kept::view)
            .collect();
        v.reverse();
        v
    }

    /// Live events from now on.
    pub fn follow(&self) -> broadcast::Receiver<Live> {
        self.live.subscribe()
    }

    /// Takes a drained batch into the history and to the followers (a
    /// copy each: rendered by whoever reads it).
    pub fn take(&self, batch: &[FlowEvent]) {
        let now = now_ms();
        // Only the last HISTORY of a longer batch would stay.
        let kept = &batch[batch.len().saturating_sub(HISTORY)..];
        let mut h = self.history();
        for e in kept {
            Self::keep(&mut h, Kept::Flow(*e, now));
        }
        drop(h);
        if self.live.receiver_count() > 0 {
            for e in batch {
                let _ = self.live.send(Live::Flow(*e, now));
            }
        }
    }

    /// Publishes one event of the control plane's own (a health check's
    /// verdict) beside the flows'.
    pub fn record(&self, v: EventView) {
        Self::keep(&mut self.history(), Kept::Own(Box::new(v.clone())));
        let _ = self.live.send(Live::Event(v));
    }

    fn history(&self) -> std::sync::MutexGuard<'_, VecDeque<Kept>> {
        match self.history.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        }
    }

    fn keep(h: &mut VecDeque<Kept>, k: Kept) {
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(k);
    }

    /// Drains `queues` every [`DRAIN_EVERY`] until the task is dropped.
    pub async fn run(self: Arc<Self>, queues: Vec<Arc<FlowEvents>>) {
        let mut tick = tokio::time::interval(DRAIN_EVERY);
        let mut drain = Drain::new(&queues);
        loop {
            tick.tick().await;
            drain.once(&self, &queues);
        }
    }
}

/// The collector's drain of the workers' queues (by worker, in order):
/// what it has taken, and each queue's overflow count when last read.
pub struct Drain {
    batch: Vec<FlowEvent>,
    overflow: Vec<u64>,
}

impl Drain {
    /// Losses before now are not reported (they are in the metric).
    pub fn new(queues: &[Arc<FlowEvents>]) -> Drain {
        Drain {
            batch: Vec::new(),
            overflow: queues.iter().map(|q| q.overflow()).collect(),
        }
    }

    /// Takes every queued event into `c`, then tells the followers what
    /// each full queue lost since the last drain.
    pub fn once(&mut self, c: &Collector, queues: &[Arc<FlowEvents>]) {
        self.batch.clear();
        for q in queues {
            q.drain(&mut self.batch);
        }
        if !self.batch.is_empty() {
            c.take(&self.batch);
        }
        for (worker, (q, seen)) in queues.iter().zip(&mut self.overflow).enumerate() {
            let now = q.overflow();
            if now > *seen && c.live.receiver_count() > 0 {
                let _ = c.live.send(Live::Lost(LostEvents {
                    source: "WORKER_QUEUE".into(),
                    num_events_lost: now - *seen,
                    worker: Some(worker as u16),
                }));
            }
            *seen = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xvs_conntrack::Endpoint;
    use xvs_dataplane::wire::DropReason;

    fn ev(kind: EventKind, port: u16) -> FlowEvent {
        FlowEvent {
            time: 0,
            worker: 0,
            kind,
            protocol: 6,
            src: Endpoint {
                addr: Ipv4Addr::new(198, 18, 0, 2).into(),
                port: 40000,
            },
            dst: Endpoint {
                addr: Ipv4Addr::new(198, 19, 0, 1).into(),
                port,
            },
            backend: FlowEvent::NONE,
            snat: FlowEvent::NONE,
        }
    }

    #[test]
    fn history_filters_and_lines() {
        let c = Collector::new();
        let mut rx = c.follow();
        c.take(&[
            ev(EventKind::New, 80),
            ev(EventKind::Drop(DropReason::NoService), 99),
            ev(EventKind::Close, 80),
        ]);
        let only = |verdict: Option<&str>, service: Option<&str>| EventFilter {
            verdict: verdict.map(Into::into),
            service: service.map(Into::into),
            ..EventFilter::default()
        };
        let drops = c.last(10, &only(Some("DROPPED"), None));
        assert_eq!(drops.len(), 1);
        assert_eq!(drops[0].reason.as_deref(), Some("no_service"));
        let line = drops[0].line();
        assert!(
            line.ends_with(": 198.18.0.2:40000 -> 198.19.0.1:99 DROPPED (TCP) no_service"),
            "{line}"
        );
        assert_eq!(c.last(10, &only(None, Some("198.19.0.1:80"))).len(), 2);
        assert_eq!(c.last(1, &only(None, None))[0].verdict, "CLOSED");
        assert_eq!(event(rx.try_recv().unwrap()).verdict, "NEW");
    }

    fn event(l: Live) -> EventView {
        match l {
            Live::Flow(e, time_ms) => EventView::of(&e, time_ms),
            Live::Event(e) => e,
            Live::Lost(l) => panic!("an event, not {l:?}"),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

        /// A flow's event as sent and as rendered pass the same filters
        /// (the raw one is what followers and `last` use; the rendered
        /// one is what a reader sees).
        #[test]
        fn a_raw_event_passes_a_filter_as_its_rendered_view_does(
            kind in 0usize..4,
            protocol in proptest::sample::select(vec![6u8, 17, 1, 0, 132]),
            ends in proptest::collection::vec((0usize..4, 0usize..3), 4),
            no_backend in proptest::bool::ANY,
            verdict in proptest::option::weighted(0.3, proptest::sample::select(VERDICTS.to_vec())),
            service in proptest::option::weighted(0.2, (0usize..4, 0usize..3)),
            proto in proptest::option::weighted(0.2, proptest::sample::select(vec!["tcp", "UDP", "Icmp"])),
            ips in proptest::collection::vec(proptest::option::weighted(0.25, 0usize..4), 3),
            ports in proptest::collection::vec(proptest::option::weighted(0.25, 0usize..3), 3),
        ) {
            let addrs: [IpAddr; 4] = [
                "198.18.0.2".parse().unwrap(),
                "198.19.0.1".parse().unwrap(),
                "2001:2::2".parse().unwrap(),
                "2001:2:ff::1".parse().unwrap(),
            ];
            let port_set = [0u16, 53, 80];
            let at = |(a, p): (usize, usize)| Endpoint { addr: addrs[a], port: port_set[p] };
            let e = FlowEvent {
                time: 0,
                worker: 0,
                kind: [
                    EventKind::New,
                    EventKind::Close,
                    EventKind::Drop(DropReason::NoService),
                    EventKind::Drop(DropReason::TcpNoFlow),
                ][kind],
                protocol,
                src: at(ends[0]),
                dst: at(ends[1]),
                backend: if no_backend { FlowEvent::NONE } else { at(ends[2]) },
                snat: at(ends[3]),
            };
            let f = EventFilter {
                verdict: verdict.map(Into::into),
                service: service.map(|s| {
                    let e = at(s);
                    HostPort(e.addr, e.port).to_string()
                }),
                ip: ips[0].map(|i| addrs[i]),
                from_ip: ips[1].map(|i| addrs[i]),
                to_ip: ips[2].map(|i| addrs[i]),
                port: ports[0].map(|p| port_set[p]),
                from_port: ports[1].map(|p| port_set[p]),
                to_port: ports[2].map(|p| port_set[p]),
                protocol: proto.map(Into::into),
            };
            proptest::prop_assert_eq!(f.matches_flow(&e), f.matches(&EventView::of(&e, 0)));
            // The follower's line is the view's JSON, byte for byte.
            let mut line = String::new();
            flow_json(&e, 1_700_000_000_123, &mut line);
            let view = EventView::of(&e, 1_700_000_000_123);
            proptest::prop_assert_eq!(&line, &serde_json::to_string(&view).unwrap());
        }
    }

    /// A worker's full queue: the follower gets what was drained, then
    /// how many were lost and where; a drain with no new loss says
    /// nothing, and a loss while nobody follows is not told later.
    #[test]
    fn a_full_worker_queue_is_told_to_followers_as_lost_events() {
        let (mut w0, q0) = FlowEvents::channel();
        let (mut w1, q1) = FlowEvents::channel();
        let queues = [q0, q1];
        let c = Collector::new();
        let mut drain = Drain::new(&queues);
        // Nobody follows: an overflow now is only counted.
        for i in 0..xvs_dataplane::events::QUEUE as u16 + 3 {
            w1.push(ev(EventKind::New, i));
        }
        drain.once(&c, &queues);
        let mut rx = c.follow();
        for i in 0..xvs_dataplane::events::QUEUE as u16 + 5 {
            w0.push(ev(EventKind::New, i));
        }
        w1.push(ev(EventKind::Close, 7));
        drain.once(&c, &queues);
        // The drained events are more than a follower's buffer: it lags
        // (counted), and what it still gets ends with the notice.
        let (mut got, mut lagged) = (Vec::new(), 0);
        loop {
            match rx.try_recv() {
                Ok(l) => got.push(l),
                Err(broadcast::error::TryRecvError::Lagged(n)) => lagged += n as usize,
                Err(_) => break,
            }
        }
        let lost: Vec<&LostEvents> = got
            .iter()
            .filter_map(|l| match l {
                Live::Lost(l) => Some(l),
                Live::Flow(..) | Live::Event(_) => None,
            })
            .collect();
        let sent = xvs_dataplane::events::QUEUE + 1 + 1;
        assert_eq!(lagged + got.len(), sent, "events, then one notice");
        let want = LostEvents {
            source: "WORKER_QUEUE".into(),
            num_events_lost: 5,
            worker: Some(0),
        };
        assert_eq!(lost, [&want]);
        assert!(
            matches!(got.last(), Some(Live::Lost(_))),
            "after the drained events"
        );
        assert_eq!(want.line(), "EVENTS LOST: WORKER_QUEUE worker(0) 5");
        assert_eq!(queues[0].overflow(), 5, "the metric counts the same");
        w0.push(ev(EventKind::New, 1));
        drain.once(&c, &queues);
        assert_eq!(event(rx.try_recv().unwrap()).dst, "198.19.0.1:1");
        assert!(rx.try_recv().is_err(), "no new loss, no notice");
    }

    /// A follower that falls behind the collector by more than its
    /// buffer is told how many it missed (whatever its filter), then gets
    /// the events it kept.
    #[tokio::test]
    async fn a_lagging_follower_is_told_how_many_it_missed() {
        let c = Collector::new();
        let mut rx = c.follow();
        let batch: Vec<FlowEvent> = (0..HISTORY as u16 + 100)
            .map(|i| ev(EventKind::New, 1000 + i))
            .collect();
        c.take(&batch);
        let only = EventFilter {
            port: Some(1100 + HISTORY as u16 - 1),
            ..EventFilter::default()
        };
        let first = next_line(&mut rx, &only).await.unwrap();
        let lost: LostLine = serde_json::from_str(first.trim()).unwrap();
        assert_eq!(lost.lost_events, LostEvents::behind(100));
        assert_eq!(lost.lost_events.line(), "EVENTS LOST: FOLLOWER_QUEUE 100");
        let next = next_line(&mut rx, &only).await.unwrap();
        let e: EventView = serde_json::from_str(next.trim()).unwrap();
        assert_eq!(e.dst, format!("198.19.0.1:{}", 1099 + HISTORY));
        assert!(next.ends_with('\n'));
        drop(c);
        assert_eq!(
            next_line(&mut rx, &only).await,
            None,
            "the collector is gone"
        );
    }

    #[test]
    fn the_history_keeps_the_last_events_in_order_and_followers_get_every_one() {
        let c = Collector::new();
        // Nobody follows: the events are kept, rendered when read.
        let first: Vec<FlowEvent> = (0..HISTORY as u16 + 10)
            .map(|i| ev(EventKind::New, 1000 + i))
            .collect();
        c.take(&first);
        let all = c.last(HISTORY + 100, &EventFilter::default());
        assert_eq!(all.len(), HISTORY);
        assert_eq!(all[0].dst, "198.19.0.1:1010", "the oldest kept");
        assert_eq!(
            all[HISTORY - 1].dst,
            format!("198.19.0.1:{}", 1009 + HISTORY)
        );
        assert_eq!(all[0].backend, None);
        // A follower gets every event of a batch, in order, and a health
        // verdict between two batches is kept where it came.
        let mut rx = c.follow();
        c.take(&[ev(EventKind::New, 1), ev(EventKind::Close, 2)]);
        let mut check = EventView::sample("BACKEND_DOWN");
        check.src = "health-check".into();
        c.record(check.clone());
        c.take(&[ev(EventKind::Drop(DropReason::NoService), 3)]);
        let got: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(event)
            .map(|e| format!("{} {}", e.verdict, e.dst))
            .collect();
        let want = [
            "NEW 198.19.0.1:1",
            "CLOSED 198.19.0.1:2",
            "BACKEND_DOWN 198.19.0.1:80",
            "DROPPED 198.19.0.1:3",
        ];
        assert_eq!(got, want);
        let last: Vec<String> = c
            .last(4, &EventFilter::default())
            .iter()
            .map(|e| format!("{} {}", e.verdict, e.dst))
            .collect();
        assert_eq!(last, want, "the history as the follower saw it");
        assert_eq!(
            c.last(1, &EventFilter::default())[0].reason.as_deref(),
            Some("no_service")
        );
    }

    /// hubble's address, port and protocol flags: `from` is the client,
    /// `to` the VIP or the backend, the plain ones any end; a health
    /// check's event has no client and matches no `from`.
    #[test]
    fn addresses_ports_and_protocols_filter_as_hubble_s() {
        let flow = EventView::sample("NEW");
        let six = EventView {
            protocol: "UDP".into(),
            src: "[2001:2::2]:5300".into(),
            dst: "[2001:2:ff::1]:53".into(),
            backend: Some("[2001:2:1::10]:53".into()),
            ..flow.clone()
        };
        let check = EventView {
            verdict: "BACKEND_DOWN".into(),
            src: "health-check".into(),
            backend: Some("198.18.1.10:8080".into()),
            ..flow.clone()
        };
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let cases: [(EventFilter, [bool; 3]); 12] = [
            (EventFilter::default(), [true, true, true]),
            (
                EventFilter {
                    ip: ip("198.18.0.2"),
                    ..Default::default()
                },
                [true, false, false],
            ),
            (
                EventFilter {
                    ip: ip("198.18.1.10"),
                    ..Default::default()
                },
                [true, false, true],
            ),
            (
                EventFilter {
                    from_ip: ip("198.18.0.2"),
                    ..Default::default()
                },
                [true, false, false],
            ),
            (
                EventFilter {
                    from_ip: ip("198.19.0.1"),
                    ..Default::default()
                },
                [false, false, false],
            ),
            (
                EventFilter {
                    to_ip: ip("198.19.0.1"),
                    ..Default::default()
                },
                [true, false, true],
            ),
            (
                EventFilter {
                    to_ip: ip("2001:2:1::10"),
                    ..Default::default()
                },
                [false, true, false],
            ),
            (
                EventFilter {
                    port: Some(40000),
                    ..Default::default()
                },
                [true, false, false],
            ),
            (
                EventFilter {
                    from_port: Some(5300),
                    ..Default::default()
                },
                [false, true, false],
            ),
            (
                EventFilter {
                    to_port: Some(8080),
                    ..Default::default()
                },
                [true, false, true],
            ),
            (
                EventFilter {
                    protocol: Some("udp".into()),
                    ..Default::default()
                },
                [false, true, false],
            ),
            (
                EventFilter {
                    from_ip: ip("198.18.0.2"),
                    to_port: Some(53),
                    ..Default::default()
                },
                [false, false, false],
            ),
        ];
        for (f, want) in cases {
            let got = [&flow, &six, &check].map(|e| f.matches(e));
            assert_eq!(got, want, "{f:?}");
        }
    }

    /// What xvsadm sends is what the API reads back: every filter, an
    /// IPv6 service's brackets and colons escaped, no key for a filter
    /// not given.
    #[test]
    fn a_filter_goes_through_the_query_whole() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let f = EventFilter {
            verdict: Some("DROPPED".into()),
            service: Some("[2001:2:ff::1]:53".into()),
            ip: ip("198.18.0.2"),
            from_ip: ip("2001:2::2"),
            to_ip: ip("198.18.1.10"),
            port: Some(53),
            from_port: Some(5300),
            to_port: Some(8080),
            protocol: Some("udp".into()),
        };
        let q = serde_urlencoded::to_string(&f).unwrap();
        assert!(q.contains("service=%5B2001%3A2%3Aff%3A%3A1%5D%3A53"), "{q}");
        assert_eq!(serde_urlencoded::from_str::<EventFilter>(&q), Ok(f));
        assert_eq!(
            serde_urlencoded::to_string(EventFilter::default()).unwrap(),
            ""
        );
    }

    /// hubble's FORWARDED is a flow's new or closed event; a verdict or
    /// protocol no event has is refused, not answered with nothing.
    #[test]
    fn forwarded_is_new_or_closed_and_unknown_names_are_refused() {
        let by = |v: &str| EventFilter {
            verdict: Some(v.into()),
            ..EventFilter::default()
        };
        let kinds = ["NEW", "CLOSED", "DROPPED"].map(EventView::sample);
        assert_eq!(
            kinds.each_ref().map(|e| by("forwarded").matches(e)),
            [true, true, false]
        );
        assert_eq!(
            kinds.each_ref().map(|e| by("dropped").matches(e)),
            [false, false, true]
        );
        assert_eq!(by("Forwarded").check(), Ok(()));
        let err = by("REDIRECTED").check().unwrap_err();
        assert!(
            err.starts_with("verdict `REDIRECTED': one of NEW, CLOSED"),
            "{err}"
        );
        let sctp = EventFilter {
            protocol: Some("sctp".into()),
            ..EventFilter::default()
        };
        assert!(sctp.check().unwrap_err().contains("`sctp'"));
    }
}
