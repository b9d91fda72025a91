//! Prometheus text exposition (format 0.0.4) of what an operator watches:
//! per service and backend connections, packets and bytes; drops by
//! reason; conntrack use; worker busy ratio; the control → data update
//! latency histogram. Written by hand: the text format is a few lines per
//! family, and the values come from our own snapshots, not from a
//! registry of live metric objects.

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use xvs_conntrack::Stats;
use xvs_dataplane::counters::{Counters, CountersReading, WorkerTallies};
use xvs_dataplane::wire::DropReason;
use xvs_dataplane::worker::Snapshot;
use xvs_dataplane::xsk::RingStats;

use crate::view::Listing;

/// Bucket upper bounds (seconds) of the update latency histogram.
pub const LATENCY_BUCKETS: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// A cumulative histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Observations at or below each bucket bound.
    pub buckets: [u64; LATENCY_BUCKETS.len()],
    /// All observations.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
}

impl Histogram {
    /// Records one observation (seconds).
    pub fn observe(&mut self, v: f64) {
        for (b, le) in self.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if v <= le {
                *b += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }
}

/// One worker's conntrack state (`/v1/conntrack/stats`, `conntrack -S`):
/// the flow table's counters (one JSON key per [`Stats`] field) and the
/// losses before the table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerConntrack {
    /// Worker.
    pub worker: usize,
    /// Live flows.
    pub entries: u32,
    /// The table's event counters.
    #[serde(flatten)]
    pub stats: Stats,
    /// What the kernel counted on the worker's AF_XDP sockets.
    #[serde(default)]
    pub rings: RingStats,
    /// Frames dropped because the TX ring had no room.
    #[serde(default)]
    pub tx_ring_full: u64,
}

impl WorkerConntrack {
    /// From a worker snapshot.
    pub fn of(s: &Snapshot) -> WorkerConntrack {
        WorkerConntrack {
            worker: s.worker,
            entries: s.flows,
            stats: s.conntrack,
            rings: s.rings,
            tx_ring_full: s.counters.drops[DropReason::TxRingFull.index()],
        }
    }
}

/// The admin listeners' refusals.
pub fn render_admin(unix: u64, tcp: u64) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "xvs_admin_connections_refused_total",
        "counter",
        "Admin API connections closed at once because the listener was at its limit.",
    );
    let _ = writeln!(
        out,
        "xvs_admin_connections_refused_total{{listener=\"unix\"}} {unix}\nxvs_admin_connections_refused_total{{listener=\"tcp\"}} {tcp}"
    );
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Renders every family; `overflow[w]` is worker `w`'s flow events lost
/// to a full queue.
pub fn render(
    l: &Listing,
    workers: &[CountersReading],
    overflow: &[u64],
    latency: &Histogram,
) -> String {
    let mut out = String::new();
    let svc_label = |s: &crate::view::ServiceView| {
        format!(
            "protocol=\"{}\",vip=\"{}\",port=\"{}\"",
            s.protocol, s.vip, s.port
        )
    };
    let services: Vec<(String, &crate::view::Stats)> = l
        .services
        .iter()
        .map(|s| (svc_label(s), &s.stats))
        .collect();
    let backends: Vec<(String, &crate::view::BackendView)> = l
        .services
        .iter()
        .flat_map(|s| {
            s.backends.iter().map(move |b| {
                let label = format!(
                    "{},backend=\"{}\"",
                    svc_label(s),
                    xvs_config::HostPort(b.address, b.port)
                );
                (label, b)
            })
        })
        .collect();
    traffic(&mut out, "service", &services);
    let backend_stats: Vec<(String, &crate::view::Stats)> = backends
        .iter()
        .map(|(l, b)| (l.clone(), &b.stats))
        .collect();
    traffic(&mut out, "backend", &backend_stats);
    for (name, help, get) in [
        (
            "xvs_backend_active_connections",
            "ESTABLISHED flows of the backend (ipvsadm ActiveConn).",
            (|b: &crate::view::BackendView| b.active) as fn(&_) -> u64,
        ),
        (
            "xvs_backend_inactive_connections",
            "Other flows of the backend (ipvsadm InActConn).",
            |b| b.inactive,
        ),
        (
            "xvs_backend_weight",
            "Weight of the backend in force (0: quiesced, or found down by its health check).",
            |b| u64::from(b.weight),
        ),
    ] {
        family(&mut out, name, "gauge", help);
        for (label, b) in &backends {
            let _ = writeln!(out, "{name}{{{label}}} {}", get(b));
        }
    }
    family(
        &mut out,
        "xvs_backend_up",
        "gauge",
        "Whether the backend's health check finds it up (checked backends only).",
    );
    for (label, b) in &backends {
        if let Some(h) = &b.health {
            let _ = writeln!(out, "xvs_backend_up{{{label}}} {}", u8::from(h == "up"));
        }
    }
    family(
        &mut out,
        "xvs_drops_total",
        "counter",
        "Frames dropped, by worker and reason.",
    );
    for (w, r) in workers.iter().enumerate() {
        for reason in DropReason::ALL {
            let _ = writeln!(
                out,
                "xvs_drops_total{{worker=\"{w}\",reason=\"{}\"}} {}",
                reason.name(),
                r.pipeline.drops[reason.index()]
            );
        }
    }
    let tables = [
        (Counters::METRICS.as_slice(), Counters::HELP.as_slice()),
        (&WorkerTallies::METRICS, &WorkerTallies::HELP),
        (&RingStats::METRICS, &RingStats::HELP),
    ];
    let values: Vec<Vec<u64>> = workers
        .iter()
        .map(|r| {
            let mut v = r.pipeline.values().to_vec();
            v.extend(r.worker.values());
            v.extend(r.rings.values());
            v
        })
        .collect();
    let fields = tables
        .iter()
        .flat_map(|(metrics, help)| metrics.iter().zip(help.iter()));
    for (i, (name, help)) in fields.enumerate() {
        if name.is_empty() {
            continue;
        }
        family(&mut out, name, "counter", help.trim());
        for (w, v) in values.iter().enumerate() {
            let _ = writeln!(out, "{name}{{worker=\"{w}\"}} {}", v[i]);
        }
    }
    family(
        &mut out,
        "xvs_flow_events_overflow_total",
        "counter",
        "Flow events lost because a worker's event queue was full.",
    );
    for (w, n) in overflow.iter().enumerate() {
        let _ = writeln!(out, "xvs_flow_events_overflow_total{{worker=\"{w}\"}} {n}");
    }
    family(
        &mut out,
        "xvs_conntrack_ended_total",
        "counter",
        "Flows that left the table, by worker and why (IPVS's conn_reuse_mode and expire_nodest_conn, SNAT port reclaim, early drop, timeout, deletion).",
    );
    for (w, r) in workers.iter().enumerate() {
        let c = &r.conntrack;
        for (why, n) in [
            ("expire", c.expire),
            ("delete", c.delete),
            ("early_drop", c.early_drop),
            ("reschedule", c.reschedule),
            ("nodest", c.nodest),
            ("reclaim", c.reclaim),
        ] {
            let _ = writeln!(
                out,
                "xvs_conntrack_ended_total{{worker=\"{w}\",reason=\"{why}\"}} {n}"
            );
        }
    }
    family(
        &mut out,
        "xvs_conntrack_entries",
        "gauge",
        "Live flows, by worker.",
    );
    for (w, r) in workers.iter().enumerate() {
        let _ = writeln!(out, "xvs_conntrack_entries{{worker=\"{w}\"}} {}", r.flows);
    }
    family(
        &mut out,
        "xvs_conntrack_capacity",
        "gauge",
        "Flow table capacity, all workers.",
    );
    let _ = writeln!(out, "xvs_conntrack_capacity {}", l.size);
    family(
        &mut out,
        "xvs_worker_busy_ratio",
        "gauge",
        "Share of loop iterations that received frames, since start.",
    );
    for (w, r) in workers.iter().enumerate() {
        let total = r.worker.busy + r.worker.idle;
        let ratio = if total > 0 {
            r.worker.busy as f64 / total as f64
        } else {
            0.0
        };
        let _ = writeln!(out, "xvs_worker_busy_ratio{{worker=\"{w}\"}} {ratio}");
    }
    family(
        &mut out,
        "xvs_update_latency_seconds",
        "histogram",
        "Time from a control-plane change to every worker having applied it.",
    );
    for (le, n) in LATENCY_BUCKETS.iter().zip(latency.buckets) {
        let _ = writeln!(out, "xvs_update_latency_seconds_bucket{{le=\"{le}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "xvs_update_latency_seconds_bucket{{le=\"+Inf\"}} {}\nxvs_update_latency_seconds_sum {}\nxvs_update_latency_seconds_count {}",
        latency.count, latency.sum, latency.count
    );
    out
}

/// The Kubernetes source's families.
pub fn render_kube(k: &crate::kube::source::KubeStatus) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "xvs_kube_synced",
        "gauge",
        "1 when the Services and EndpointSlices copy is in sync with the API server.",
    );
    let _ = writeln!(out, "xvs_kube_synced {}", u8::from(k.synced()));
    family(
        &mut out,
        "xvs_kube_last_sync_age_seconds",
        "gauge",
        "Seconds since the last event from the API server.",
    );
    let _ = writeln!(
        out,
        "xvs_kube_last_sync_age_seconds {}",
        k.last_sync_age().unwrap_or(f64::INFINITY)
    );
    family(
        &mut out,
        "xvs_kube_watch_errors_total",
        "counter",
        "Watch errors (the last good state was kept).",
    );
    let _ = writeln!(
        out,
        "xvs_kube_watch_errors_total {}",
        k.errors.load(std::sync::atomic::Ordering::Relaxed)
    );
    out
}

/// The connection, packet and byte families of services or backends
/// (`what`), one sample per labelled row (and direction).
fn traffic(out: &mut String, what: &str, rows: &[(String, &crate::view::Stats)]) {
    let name = format!("xvs_{what}_connections_total");
    family(
        out,
        &name,
        "counter",
        &format!("Connections scheduled to the {what}."),
    );
    for (label, st) in rows {
        let _ = writeln!(out, "{name}{{{label}}} {}", st.conns);
    }
    for (unit, get) in [
        (
            "packets",
            (|st: &crate::view::Stats| (st.inpkts, st.outpkts)) as fn(&_) -> (u64, u64),
        ),
        ("bytes", |st| (st.inbytes, st.outbytes)),
    ] {
        let name = format!("xvs_{what}_{unit}_total");
        let help = format!(
            "{} of the {what}, by direction (in: client to backend).",
            if unit == "bytes" { "Bytes" } else { "Packets" }
        );
        family(out, &name, "counter", &help);
        for (label, st) in rows {
            let (i, o) = get(st);
            let _ = writeln!(out, "{name}{{{label},direction=\"in\"}} {i}");
            let _ = writeln!(out, "{name}{{{label},direction=\"out\"}} {o}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{BackendView, Rates, ServiceView, Stats};
    use std::net::Ipv4Addr;

    #[test]
    fn families_are_typed_and_labelled() {
        let l = Listing {
            size: 1024,
            services: vec![ServiceView {
                protocol: "tcp".into(),
                vip: Ipv4Addr::new(198, 19, 0, 1).into(),
                port: 80,
                scheduler: "rr".into(),
                flags: Vec::new(),
                persistence: None,
                stats: Stats {
                    conns: 3,
                    ..Stats::default()
                },
                rates: Rates::default(),
                backends: vec![BackendView {
                    address: Ipv4Addr::new(198, 18, 1, 10).into(),
                    port: 80,
                    weight: 2,
                    forward: xvs_config::ForwardMethod::Masq,
                    encap: None,
                    health: None,
                    active: 1,
                    inactive: 2,
                    stats: Stats {
                        conns: 3,
                        inpkts: 10,
                        ..Stats::default()
                    },
                    rates: Rates::default(),
                }],
            }],
        };
        let mut r = CountersReading::default();
        r.pipeline.drops[DropReason::NoService.index()] = 4;
        r.worker.busy = 1;
        r.worker.idle = 3;
        let mut h = Histogram::default();
        h.observe(0.0003);
        h.observe(0.002);
        let text = render(&l, &[r], &[7], &h);
        for line in [
            "# TYPE xvs_backend_packets_total counter",
            "xvs_service_connections_total{protocol=\"tcp\",vip=\"198.19.0.1\",port=\"80\"} 3",
            "xvs_backend_packets_total{protocol=\"tcp\",vip=\"198.19.0.1\",port=\"80\",backend=\"198.18.1.10:80\",direction=\"in\"} 10",
            "xvs_backend_active_connections{protocol=\"tcp\",vip=\"198.19.0.1\",port=\"80\",backend=\"198.18.1.10:80\"} 1",
            "xvs_drops_total{worker=\"0\",reason=\"no_service\"} 4",
            "xvs_worker_busy_ratio{worker=\"0\"} 0.25",
            "xvs_update_latency_seconds_bucket{le=\"0.00025\"} 0",
            "xvs_update_latency_seconds_bucket{le=\"0.0005\"} 1",
            "xvs_update_latency_seconds_bucket{le=\"+Inf\"} 2",
            "xvs_update_latency_seconds_count 2",
            "xvs_conntrack_capacity 1024",
            "xvs_flow_events_overflow_total{worker=\"0\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        // Every sample line belongs to a declared family.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split(['{', ' ']).next().unwrap();
            let base = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(text.contains(&format!("# TYPE {base} ")), "{name}");
        }
    }
}
