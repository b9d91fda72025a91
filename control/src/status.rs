//! `xvs status`: one screen about a running xvs, as `cilium status` gives
//! one: version and uptime, interfaces with their XDP mode, workers with
//! their core, socket mode, rates and busy ratio, flows against capacity,
//! SNAT addresses and pressure, services and backends by state, the
//! Kubernetes source, what the start adopted, and the top drop reasons of
//! the last minute.
//!
//! The daemon answers `/v1/overview` with an [`Overview`]; rates and the
//! last minute come from a [`History`] of counter readings the daemon
//! keeps (one every [`crate::stats::SAMPLE_SECONDS`], a minute of them).
//! The client prints it ([`render`]) or its JSON.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use xvs_dataplane::counters::CountersReading;
use xvs_dataplane::runtime::Layout;
use xvs_dataplane::wire::DropReason;

use crate::api::RestartView;
use crate::kube::source::KubeReading;

/// How far back [`History`] keeps readings (seconds).
pub const WINDOW_SECONDS: f64 = 60.0;

/// Counter readings of every worker, taken at seconds since start.
#[derive(Debug, Default)]
pub struct History {
    readings: VecDeque<(f64, Vec<CountersReading>)>,
}

impl History {
    /// Adds a reading taken at `at`; forgets those older than the window
    /// (keeping one at or beyond it, the start of the last minute).
    pub fn push(&mut self, at: f64, workers: Vec<CountersReading>) {
        self.readings.push_back((at, workers));
        while self
            .readings
            .get(1)
            .is_some_and(|(t, _)| at - t >= WINDOW_SECONDS)
        {
            self.readings.pop_front();
        }
    }

    /// The oldest reading within the window (the last minute's start).
    fn oldest(&self) -> Option<&(f64, Vec<CountersReading>)> {
        self.readings.front()
    }

    /// The newest reading at least a second before `now`.
    fn before(&self, now: f64) -> Option<&(f64, Vec<CountersReading>)> {
        self.readings.iter().rev().find(|(t, _)| now - t >= 1.0)
    }
}

/// One interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceView {
    /// Its name.
    pub name: String,
    /// `client`, `backend`, or `client+backend` (one-arm).
    pub role: String,
    /// The XDP mode the program is attached in.
    pub xdp_mode: String,
}

/// One worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Worker number.
    pub worker: usize,
    /// The NIC queue it serves.
    pub queue: u32,
    /// The core it is pinned to.
    pub core: usize,
    /// AF_XDP zero-copy (else copy mode).
    pub zero_copy: bool,
    /// Its UMEM on 2 MiB pages (else 4 KiB).
    pub huge_pages: bool,
    /// Frames received per second (recent).
    pub rx_pps: f64,
    /// Frames transmitted per second (recent).
    pub tx_pps: f64,
    /// Share of recent loop iterations that received frames.
    pub busy: f64,
    /// Its live flows.
    pub flows: u64,
}

/// The SNAT side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnatView {
    /// The addresses.
    pub addresses: Vec<IpAddr>,
    /// Live flows through each address (all workers), in the same order.
    #[serde(default)]
    pub flows: Vec<u64>,
    /// The port range.
    pub ports: String,
    /// Ports per worker (each worker's slice of the range).
    pub ports_per_worker: Vec<u32>,
    /// New flows dropped without a free SNAT port, last minute.
    pub exhausted_last_minute: u64,
    /// Ports reclaimed from handshakes and closed flows, last minute.
    pub reclaimed_last_minute: u64,
}

/// Services and backends by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicesView {
    /// Services in force.
    pub services: usize,
    /// Of which from Kubernetes.
    pub from_kubernetes: usize,
    /// Backends.
    pub backends: usize,
    /// Found up by a health check, or unchecked with a weight.
    pub healthy: usize,
    /// Found down by their health check.
    pub down: usize,
    /// Weight 0 by configuration (taking no new flows).
    pub quiesced: usize,
}

/// `/v1/overview`: what `xvs status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overview {
    /// The daemon's version.
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// Seconds since it started.
    pub uptime_seconds: f64,
    /// Its config file.
    pub config: String,
    /// Successful reloads.
    pub reloads: u64,
    /// The last refused reload or edit, if the latest was refused.
    pub last_error: Option<String>,
    /// Interfaces.
    pub interfaces: Vec<InterfaceView>,
    /// Workers.
    pub workers: Vec<WorkerView>,
    /// Live flows, all workers.
    pub flows: u64,
    /// The flow table's capacity.
    pub capacity: u32,
    /// SNAT.
    pub snat: SnatView,
    /// Services and backends.
    pub services: ServicesView,
    /// The Kubernetes source (none: off).
    pub kubernetes: Option<KubeReading>,
    /// What the start took over from the instance before it.
    pub restart: RestartView,
    /// The most frequent drop reasons of the last minute (at most five,
    /// most first) with their counts.
    pub drops_last_minute: Vec<(String, u64)>,
    /// The seconds that "last minute" covers (less after a start).
    pub window_seconds: f64,
    /// Every drop reason's count since start, all workers (the web view
    /// draws their rates over time).
    #[serde(default)]
    pub drops_total: Vec<(String, u64)>,
}

/// What the daemon knows, for [`overview`].
#[derive(Debug)]
pub struct Inputs<'a> {
    /// The config in force.
    pub config: &'a xvs_config::Config,
    /// Config file, reloads, last error.
    pub file: (String, u64, Option<String>),
    /// Where the data plane runs.
    pub layout: Layout,
    /// Every worker's counters now.
    pub now: Vec<CountersReading>,
    /// Seconds since start.
    pub uptime: f64,
    /// The services in force and their backends, counted
    /// ([`crate::stats::tally`]; `from_kubernetes` is set there too).
    pub services: ServicesView,
    /// The Kubernetes source.
    pub kubernetes: Option<KubeReading>,
    /// The restart information.
    pub restart: RestartView,
}

/// Every worker's counters added up ([`CountersReading::add`]).
pub fn total(workers: &[CountersReading]) -> CountersReading {
    let mut t = CountersReading::default();
    for w in workers {
        t.add(w);
    }
    t
}

/// Builds the overview from what the daemon knows and its history.
pub fn overview(i: Inputs<'_>, history: &History) -> Overview {
    let cfg = i.config;
    let now = i.uptime;
    let interfaces = i
        .layout
        .interfaces
        .iter()
        .map(|(name, mode)| InterfaceView {
            role: match &cfg.interfaces.backend {
                None => "client+backend".into(),
                Some(b) if b == name => "backend".into(),
                Some(_) => "client".into(),
            },
            name: name.clone(),
            xdp_mode: mode.clone(),
        })
        .collect();
    let recent = history.before(now);
    let workers = i
        .layout
        .workers
        .iter()
        .enumerate()
        .map(|(w, place)| {
            let cur = i.now.get(w).cloned().unwrap_or_default();
            let (rx_pps, tx_pps, busy) = match recent.and_then(|(t, r)| Some((now - t, r.get(w)?)))
            {
                Some((dt, then)) if dt > 0.0 => {
                    let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
                    let loops = (cur.worker.busy + cur.worker.idle)
                        .saturating_sub(then.worker.busy + then.worker.idle);
                    let busy = if loops > 0 {
                        cur.worker.busy.saturating_sub(then.worker.busy) as f64 / loops as f64
                    } else {
                        0.0
                    };
                    (
                        rate(cur.pipeline.rx, then.pipeline.rx),
                        rate(cur.worker.tx, then.worker.tx),
                        busy,
                    )
                }
                _ => (0.0, 0.0, 0.0),
            };
            WorkerView {
                worker: w,
                queue: place.queue,
                // Pinned to its queue's core (the config's, position for
                // position).
                core: cfg.interfaces.cores.get(w).copied().unwrap_or_default(),
                zero_copy: place.zero_copy,
                huge_pages: place.huge_pages,
                rx_pps,
                tx_pps,
                busy,
                flows: cur.flows,
            }
        })
        .collect();
    let now_total = total(&i.now);
    let (window, start) = match history.oldest() {
        Some((t, r)) => (now - t, total(r)),
        None => (0.0, CountersReading::default()),
    };
    let (nd, sd) = (&now_total.pipeline.drops, &start.pipeline.drops);
    let drops_total: Vec<(String, u64)> = DropReason::ALL
        .iter()
        .map(|r| (r.name().to_owned(), nd[r.index()]))
        .collect();
    let mut drops: Vec<(String, u64)> = DropReason::ALL
        .iter()
        .map(|r| {
            (
                r.name().to_owned(),
                nd[r.index()].saturating_sub(sd[r.index()]),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    drops.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    drops.truncate(5);
    let k = DropReason::SnatExhausted.index();
    let exhausted = nd[k].saturating_sub(sd[k]);
    let reclaimed = now_total
        .conntrack
        .reclaim
        .saturating_sub(start.conntrack.reclaim);
    let addresses = snat_addresses(cfg);
    let flows_through = per_address(&now_total, addresses.len());
    Overview {
        version: crate::cli::VERSION.to_owned(),
        pid: std::process::id(),
        uptime_seconds: now,
        config: i.file.0,
        reloads: i.file.1,
        last_error: i.file.2,
        interfaces,
        workers,
        flows: now_total.flows,
        capacity: cfg.conntrack.capacity,
        snat: SnatView {
            addresses,
            flows: flows_through,
            ports: cfg.snat.ports.to_string(),
            ports_per_worker: cfg
                .snat
                .worker_ports
                .iter()
                .map(|s| u32::from(s.last) - u32::from(s.first) + 1)
                .collect(),
            exhausted_last_minute: exhausted,
            reclaimed_last_minute: reclaimed,
        },
        services: i.services,
        kubernetes: i.kubernetes,
        restart: i.restart,
        drops_last_minute: drops,
        window_seconds: window,
        drops_total,
    }
}

/// The SNAT addresses in the order the workers count them: IPv4, then
/// IPv6, as in the config.
pub fn snat_addresses(cfg: &xvs_config::Config) -> Vec<IpAddr> {
    let v4 = cfg.snat.addresses.iter().map(|a| IpAddr::from(*a));
    v4.chain(cfg.snat.addresses6.iter().map(|a| IpAddr::from(*a)))
        .collect()
}

/// Live flows through each of the first `n` SNAT addresses, from the
/// workers' [`total`].
pub fn per_address(total: &CountersReading, n: usize) -> Vec<u64> {
    total.snat_flows[..n.min(total.snat_flows.len())].to_vec()
}

/// A count with thousands separators.
fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (k, c) in s.chars().enumerate() {
        if k > 0 && (s.len() - k).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate in packets per second, scaled.
fn pps(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} Mpps", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} kpps", v / 1e3)
    } else {
        format!("{v:.0} pps")
    }
}

/// A duration as `1d02h`, `3h04m`, `5m06s` or `7s`.
fn duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    let (d, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// `xvs status`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The admin socket.
    #[arg(long, value_name = "PATH", default_value = xvs_config::DEFAULT_ADMIN_SOCKET)]
    pub socket: std::path::PathBuf,
    /// The admin API over TCP, HOST:PORT (with --token-file).
    #[arg(long, value_name = "HOST:PORT", requires = "token_file")]
    pub server: Option<String>,
    /// The TCP admin API's bearer token.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Print the JSON of /v1/overview instead of the screen.
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECONDS (1 without a value) until interrupted.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1")]
    pub watch: Option<f64>,
    /// With --watch: stop after N screens.
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,
}

/// Runs `xvs status`: 0, or 1 when xvs cannot be reached.
pub fn main(a: &StatusArgs, out: &mut dyn std::io::Write, err: &mut dyn std::io::Write) -> u8 {
    use crate::adm::client::{request, Endpoint};
    let to = match (&a.server, &a.token_file) {
        (Some(s), Some(f)) => match std::fs::read_to_string(f) {
            Ok(t) => Endpoint::Tcp(s.clone(), t.trim().to_owned()),
            Err(e) => {
                let _ = writeln!(err, "{}: {e}", f.display());
                return 1;
            }
        },
        _ => Endpoint::Unix(a.socket.clone()),
    };
    let interval = a
        .watch
        .map(|s| std::time::Duration::from_secs_f64(s.max(0.1)));
    let mut shown = 0u64;
    loop {
        let answer = request(&to, hyper::Method::GET, "/v1/overview", None).and_then(|r| r.ok());
        let text = match answer.and_then(|body| {
            let o: Overview = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            Ok(if a.json {
                serde_json::to_string_pretty(&o).map_err(|e| e.to_string())? + "\n"
            } else {
                render(&o)
            })
        }) {
            Ok(t) => t,
            Err(e) => {
                let _ = writeln!(err, "xvs status: {e}");
                return 1;
            }
        };
        if interval.is_some() && !a.json {
            // Home and clear, as watch(1) does.
            let _ = write!(out, "\x1b[H\x1b[2J");
        }
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        shown += 1;
        match interval {
            Some(every) if a.count.is_none_or(|n| shown < n) => std::thread::sleep(every),
            _ => return 0,
        }
    }
}

/// One labelled line of the screen.
fn row(out: &mut String, label: &str, text: &str) {
    let _ = writeln!(out, "{:<19}{text}", format!("{label}:"));
}

/// The screen `xvs status` prints.
pub fn render(o: &Overview) -> String {
    let mut out = String::new();
    let head = format!(
        "{} up {}, pid {}, config {} ({} reloads)",
        o.version,
        duration(o.uptime_seconds),
        o.pid,
        o.config,
        o.reloads
    );
    row(&mut out, "xvs", &head);
    if let Some(e) = &o.last_error {
        row(&mut out, "Last error", e);
    }
    let ifs: Vec<String> = o
        .interfaces
        .iter()
        .map(|i| format!("{} ({}): XDP {}", i.name, i.role, i.xdp_mode))
        .collect();
    row(&mut out, "Interfaces", &ifs.join(" | "));
    row(&mut out, "Workers", &o.workers.len().to_string());
    for w in &o.workers {
        let _ = writeln!(
            out,
            "  {:<17}{:<10} {:<11} rx {:>10}  tx {:>10}  busy {:>3.0}%  flows {}",
            format!("q{} @ cpu{}", w.queue, w.core),
            if w.zero_copy { "zero-copy" } else { "copy" },
            if w.huge_pages {
                "2 MiB pages"
            } else {
                "4 KiB pages"
            },
            pps(w.rx_pps),
            pps(w.tx_pps),
            w.busy * 100.0,
            count(w.flows)
        );
    }
    let pct = if o.capacity > 0 {
        o.flows as f64 * 100.0 / f64::from(o.capacity)
    } else {
        0.0
    };
    let flows = format!(
        "{} / {} ({pct:.1}%)",
        count(o.flows),
        count(u64::from(o.capacity))
    );
    row(&mut out, "Flows", &flows);
    let addrs: Vec<String> = o
        .snat
        .addresses
        .iter()
        .enumerate()
        .map(|(k, a)| match o.snat.flows.get(k) {
            Some(n) => format!("{a} ({} flows)", count(*n)),
            None => a.to_string(),
        })
        .collect();
    let per_worker: Vec<String> = o
        .snat
        .ports_per_worker
        .iter()
        .map(|p| count(u64::from(*p)))
        .collect();
    let snat = format!(
        "{} ports {} ({} per worker); last minute: {} exhausted, {} reclaimed",
        addrs.join(", "),
        o.snat.ports,
        per_worker.join("/"),
        count(o.snat.exhausted_last_minute),
        count(o.snat.reclaimed_last_minute)
    );
    row(&mut out, "SNAT", &snat);
    let s = &o.services;
    let services = format!(
        "{} ({} from Kubernetes), {} backends: {} healthy, {} down, {} quiesced",
        s.services, s.from_kubernetes, s.backends, s.healthy, s.down, s.quiesced
    );
    row(&mut out, "Services", &services);
    let kube = match &o.kubernetes {
        None => "off".into(),
        Some(k) => format!(
            "{}, last event {}, {} watch errors",
            if k.synced { "synced" } else { "NOT synced" },
            k.last_event_age
                .map_or("never".into(), |a| format!("{} ago", duration(a))),
            k.errors
        ),
    };
    row(&mut out, "Kubernetes", &kube);
    let r = &o.restart;
    let restart = if r.hold_ms == 0 {
        "survival off (hold 0s)".into()
    } else {
        format!(
            "hold {}ms; adopted {} flows, {} templates ({} dropped); state files: {}{}",
            r.hold_ms,
            count(r.adopted_flows),
            count(r.adopted_templates),
            count(r.adopted_dropped),
            r.state_files.len(),
            r.plain_pages
                .as_ref()
                .map_or(String::new(), |w| format!(", plain pages: {w}"))
        )
    };
    row(&mut out, "Restart", &restart);
    let drops = if o.drops_last_minute.is_empty() {
        "none".into()
    } else {
        o.drops_last_minute
            .iter()
            .map(|(r, n)| format!("{r} {}", count(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    row(
        &mut out,
        &format!("Drops (last {:.0}s)", o.window_seconds),
        &drops,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(rx: u64, no_service: u64) -> CountersReading {
        let mut r = CountersReading::default();
        r.pipeline.rx = rx;
        r.pipeline.drops[DropReason::NoService.index()] = no_service;
        r.worker.busy = rx / 10;
        r.worker.idle = rx / 10;
        r
    }

    #[test]
    fn the_history_keeps_a_minute_and_its_start() {
        let mut h = History::default();
        for t in 0u32..100 {
            h.push(f64::from(t) * 2.0, vec![reading(u64::from(t), 0)]);
        }
        let (first, _) = h.oldest().unwrap();
        assert_eq!(*first, 198.0 - 60.0);
        assert_eq!(h.before(199.0).unwrap().0, 198.0);
        assert_eq!(h.before(198.5).unwrap().0, 196.0);
    }

    #[test]
    fn formats() {
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(12), "12");
        assert_eq!(duration(3725.0), "1h02m");
        assert_eq!(duration(59.0), "59s");
        assert_eq!(pps(1_500_000.0), "1.50 Mpps");
    }
}
