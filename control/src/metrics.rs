//! `/metrics`: what an operator watches, in the Prometheus text format
//! (0.0.4), encoded by the Prometheus client library (`prometheus-client`):
//! per service and backend connections, packets and bytes; drops by
//! reason; conntrack use; worker counters and busy ratio; the Kubernetes
//! source, flow sync and admin listener families; and two histograms, the
//! control → data update latency and the Kubernetes event → data plane
//! delay.
//!
//! The counters live in the data plane and are read as one snapshot per
//! scrape ([`Scrape`], a [`Collector`]); the histograms are the library's
//! own live metrics ([`Histograms`]), observed by the control plane.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use serde::{Deserialize, Serialize};
use xvs_conntrack::Stats;
use xvs_dataplane::counters::{Counters, CountersReading, WorkerTallies};
use xvs_dataplane::runtime::SyncState;
use xvs_dataplane::wire::DropReason;
use xvs_dataplane::worker::Snapshot;
use xvs_dataplane::xsk::RingStats;

use crate::kube::source::KubeReading;
use crate::view::{BackendView, Listing, ServiceView};

/// Bucket upper bounds (seconds) of both histograms.
pub const LATENCY_BUCKETS: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// The control plane's histograms (cheap to clone: clones share the
/// counts).
#[derive(Debug, Clone)]
pub struct Histograms {
    /// From a control-plane change to every worker having applied it.
    pub update_latency: Histogram,
    /// From a Kubernetes watch event to every worker having applied the
    /// service state it led to.
    pub kube_delay: Histogram,
}

impl Default for Histograms {
    fn default() -> Histograms {
        Histograms {
            update_latency: Histogram::new(LATENCY_BUCKETS),
            kube_delay: Histogram::new(LATENCY_BUCKETS),
        }
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

/// One scrape's snapshot of everything the data plane counts.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// Services and backends with their counters.
    pub listing: Listing,
    /// Each worker's counters.
    pub workers: Vec<CountersReading>,
    /// Each worker's flow events lost to a full queue.
    pub overflow: Vec<u64>,
    /// The Kubernetes source, when on.
    pub kube: Option<KubeReading>,
    /// Flow sync, when configured.
    pub sync: Option<SyncState>,
    /// Admin connections refused at the limit: (unix, tcp).
    pub admin_refused: (u64, u64),
    /// The SNAT addresses, in the workers' order (see
    /// [`crate::status::snat_addresses`]).
    pub snat_addresses: Vec<std::net::IpAddr>,
}

/// Renders a scrape and the histograms as the text format.
pub fn render(scrape: Scrape, h: &Histograms) -> String {
    let mut registry = Registry::default();
    registry.register_with_unit(
        "xvs_update_latency",
        "Time from a control-plane change to every worker having applied it",
        Unit::Seconds,
        h.update_latency.clone(),
    );
    registry.register_with_unit(
        "xvs_kube_event_to_dataplane",
        "Time from a Kubernetes watch event to every worker having applied the services it changed",
        Unit::Seconds,
        h.kube_delay.clone(),
    );
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

/// Labels of one sample.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// A family being written: its descriptor, then its samples.
pub(crate) struct Family<'e> {
    metric: MetricEncoder<'e>,
    kind: MetricType,
}

/// Starts family `name` (a counter's name ends in `_total`: the library
/// adds the suffix itself).
pub(crate) fn family<'e>(
    enc: &'e mut DescriptorEncoder,
    name: &'e str,
    help: &str,
    kind: MetricType,
) -> Result<Family<'e>, fmt::Error> {
    let name = match kind {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    let metric = enc.encode_descriptor(name, help, None, kind)?;
    Ok(Family { metric, kind })
}

/// A sample value: counters are integers, gauges integers or ratios.
#[derive(Clone, Copy)]
pub(crate) enum Value {
    Int(u64),
    Float(f64),
}

impl Family<'_> {
    /// Writes one sample.
    pub(crate) fn sample(&mut self, labels: &Labels, v: Value) -> fmt::Result {
        if labels.is_empty() {
            return put(&mut self.metric, self.kind, v);
        }
        let kind = self.kind;
        put(&mut self.metric.encode_family(labels)?, kind, v)
    }
}

/// Writes one value as a `kind` sample.
fn put(m: &mut MetricEncoder, kind: MetricType, v: Value) -> fmt::Result {
    match (kind, v) {
        (MetricType::Counter, Value::Int(n)) => m.encode_counter::<NoLabelSet, _, u64>(&n, None),
        (MetricType::Counter, Value::Float(x)) => m.encode_counter::<NoLabelSet, _, f64>(&x, None),
        (_, Value::Int(n)) => m.encode_gauge(&n),
        (_, Value::Float(x)) => m.encode_gauge(&x),
    }
}

fn service_labels(s: &ServiceView) -> Labels {
    vec![
        ("protocol", s.protocol.clone()),
        ("vip", s.vip.to_string()),
        ("port", s.port.to_string()),
    ]
}

fn backend_labels(s: &ServiceView, b: &BackendView) -> Labels {
    let mut l = service_labels(s);
    l.push((
        "backend",
        xvs_config::HostPort(b.address, b.port).to_string(),
    ));
    l
}

fn worker(w: usize) -> Labels {
    vec![("worker", w.to_string())]
}

/// One family of one sample without labels.
pub(crate) fn single(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    v: Value,
) -> fmt::Result {
    family(enc, name, help, kind)?.sample(&Vec::new(), v)
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let enc = &mut enc;
        let l = &self.listing;
        let backends: Vec<(Labels, &BackendView)> = l
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(move |b| (backend_labels(s, b), b)))
            .collect();
        let services: Vec<(Labels, &crate::view::Stats)> = l
            .services
            .iter()
            .map(|s| (service_labels(s), &s.stats))
            .collect();
        traffic(enc, "service", &services)?;
        let backend_stats: Vec<(Labels, &crate::view::Stats)> = backends
            .iter()
            .map(|(l, b)| (l.clone(), &b.stats))
            .collect();
        traffic(enc, "backend", &backend_stats)?;
        for (name, help, get) in [
            (
                "xvs_backend_active_connections",
                "ESTABLISHED flows of the backend (ipvsadm ActiveConn).",
                (|b: &BackendView| b.active) as fn(&_) -> u64,
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
            let mut f = family(enc, name, help, MetricType::Gauge)?;
            for (labels, b) in &backends {
                f.sample(labels, Value::Int(get(b)))?;
            }
        }
        let mut f = family(
            enc,
            "xvs_backend_up",
            "Whether the backend's health check finds it up (checked backends only).",
            MetricType::Gauge,
        )?;
        for (labels, b) in &backends {
            if let Some(h) = &b.health {
                f.sample(labels, Value::Int(u64::from(h == "up")))?;
            }
        }
        let mut f = family(
            enc,
            "xvs_drops_total",
            "Frames dropped, by worker and reason.",
            MetricType::Counter,
        )?;
        for (w, r) in self.workers.iter().enumerate() {
            for reason in DropReason::ALL {
                let mut labels = worker(w);
                labels.push(("reason", reason.name().to_owned()));
                f.sample(&labels, Value::Int(r.pipeline.drops[reason.index()]))?;
            }
        }
        let tables = [
            (Counters::METRICS.as_slice(), Counters::HELP.as_slice()),
            (&WorkerTallies::METRICS, &WorkerTallies::HELP),
            (&RingStats::METRICS, &RingStats::HELP),
        ];
        let values: Vec<Vec<u64>> = self
            .workers
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
            let mut f = family(enc, name, help.trim(), MetricType::Counter)?;
            for (w, v) in values.iter().enumerate() {
                f.sample(&worker(w), Value::Int(v[i]))?;
            }
        }
        let mut f = family(
            enc,
            "xvs_flow_events_overflow_total",
            "Flow events lost because a worker's event queue was full.",
            MetricType::Counter,
        )?;
        for (w, n) in self.overflow.iter().enumerate() {
            f.sample(&worker(w), Value::Int(*n))?;
        }
        let mut f = family(
            enc,
            "xvs_conntrack_ended_total",
            "Flows that left the table, by worker and why (IPVS's conn_reuse_mode and expire_nodest_conn, SNAT port reclaim, early drop, timeout, deletion).",
            MetricType::Counter,
        )?;
        for (w, r) in self.workers.iter().enumerate() {
            let c = &r.conntrack;
            for (why, n) in [
                ("expire", c.expire),
                ("delete", c.delete),
                ("early_drop", c.early_drop),
                ("reschedule", c.reschedule),
                ("nodest", c.nodest),
                ("reclaim", c.reclaim),
            ] {
                let mut labels = worker(w);
                labels.push(("reason", why.to_owned()));
                f.sample(&labels, Value::Int(n))?;
            }
        }
        let mut f = family(
            enc,
            "xvs_conntrack_entries",
            "Live flows, by worker.",
            MetricType::Gauge,
        )?;
        for (w, r) in self.workers.iter().enumerate() {
            f.sample(&worker(w), Value::Int(r.flows))?;
        }
        single(
            enc,
            "xvs_conntrack_capacity",
            "Flow table capacity, all workers.",
            MetricType::Gauge,
            Value::Int(u64::from(l.size)),
        )?;
        let mut f = family(
            enc,
            "xvs_worker_busy_ratio",
            "Share of loop iterations that received frames, since start.",
            MetricType::Gauge,
        )?;
        for (w, r) in self.workers.iter().enumerate() {
            let total = r.worker.busy + r.worker.idle;
            let ratio = if total > 0 {
                r.worker.busy as f64 / total as f64
            } else {
                0.0
            };
            f.sample(&worker(w), Value::Float(ratio))?;
        }
        let mut f = family(
            enc,
            "xvs_snat_flows",
            "Live flows through each SNAT address, all workers (its ports are taken per backend).",
            MetricType::Gauge,
        )?;
        let through = crate::status::per_address(
            &crate::status::total(&self.workers),
            self.snat_addresses.len(),
        );
        for (a, n) in self.snat_addresses.iter().zip(through) {
            f.sample(&vec![("address", a.to_string())], Value::Int(n))?;
        }
        if let Some(k) = &self.kube {
            kube(enc, k)?;
        }
        if let Some(s) = &self.sync {
            crate::ha::encode(enc, s)?;
        }
        let mut f = family(
            enc,
            "xvs_admin_connections_refused_total",
            "Admin API connections closed at once because the listener was at its limit.",
            MetricType::Counter,
        )?;
        let (unix, tcp) = self.admin_refused;
        f.sample(&vec![("listener", "unix".to_owned())], Value::Int(unix))?;
        f.sample(&vec![("listener", "tcp".to_owned())], Value::Int(tcp))
    }
}

/// The Kubernetes source's families.
fn kube(enc: &mut DescriptorEncoder, k: &KubeReading) -> fmt::Result {
    single(
        enc,
        "xvs_kube_synced",
        "1 when the Services and EndpointSlices copy is in sync with the API server.",
        MetricType::Gauge,
        Value::Int(u64::from(k.synced)),
    )?;
    single(
        enc,
        "xvs_kube_last_sync_age_seconds",
        "Seconds since the last event from the API server.",
        MetricType::Gauge,
        Value::Float(k.last_event_age.unwrap_or(f64::INFINITY)),
    )?;
    single(
        enc,
        "xvs_kube_watch_errors_total",
        "Watch errors (the last good state was kept).",
        MetricType::Counter,
        Value::Int(k.errors),
    )?;
    single(
        enc,
        "xvs_kube_invalid_values",
        "Invalid values (xvs.io annotations) in the latest set of Services; each was logged with its Service and the default used.",
        MetricType::Gauge,
        Value::Int(k.invalid_values),
    )
}

/// The connection, packet and byte families of services or backends
/// (`what`), one sample per labelled row (and direction).
fn traffic(
    enc: &mut DescriptorEncoder,
    what: &str,
    rows: &[(Labels, &crate::view::Stats)],
) -> fmt::Result {
    let name = format!("xvs_{what}_connections_total");
    let help = format!("Connections scheduled to the {what}.");
    let mut f = family(enc, &name, &help, MetricType::Counter)?;
    for (labels, st) in rows {
        f.sample(labels, Value::Int(st.conns))?;
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
        let mut f = family(enc, &name, &help, MetricType::Counter)?;
        for (labels, st) in rows {
            let (i, o) = get(st);
            for (dir, v) in [("in", i), ("out", o)] {
                let mut l = labels.clone();
                l.push(("direction", dir.to_owned()));
                f.sample(&l, Value::Int(v))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{BackendView, Rates, ServiceView, Stats};
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::Ipv4Addr;

    /// A scrape with every family present: a service with a checked
    /// backend, one worker, the Kubernetes source.
    fn example() -> Scrape {
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
                    health: Some("up".into()),
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
        r.snat_flows[0] = 6;
        Scrape {
            listing: l,
            workers: vec![r],
            overflow: vec![7],
            kube: Some(KubeReading {
                synced: true,
                last_event_age: None,
                errors: 2,
                invalid_values: 1,
            }),
            sync: None,
            admin_refused: (0, 5),
            snat_addresses: vec![Ipv4Addr::new(198, 18, 1, 2).into()],
        }
    }

    #[test]
    fn families_are_typed_and_labelled() {
        let h = Histograms::default();
        h.update_latency.observe(0.0003);
        h.update_latency.observe(0.002);
        h.kube_delay.observe(0.004);
        let scrape = example();
        let text = render(scrape, &h);
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
            "xvs_kube_event_to_dataplane_seconds_count 1",
            "xvs_conntrack_capacity 1024",
            "xvs_flow_events_overflow_total{worker=\"0\"} 7",
            "xvs_kube_watch_errors_total 2",
            "xvs_kube_invalid_values 1",
            "xvs_snat_flows{address=\"198.18.1.2\"} 6",
            "xvs_kube_last_sync_age_seconds +Inf",
            "xvs_admin_connections_refused_total{listener=\"tcp\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        // The official client library's parser reads it: every family
        // typed, every sample in its family.
        if !xvs_vm_tests::prom::available() {
            return;
        }
        let families = xvs_vm_tests::prom::parse(&text).unwrap();
        assert_eq!(families["xvs_drops"].kind, "counter");
        assert_eq!(families["xvs_update_latency_seconds"].kind, "histogram");
        assert_eq!(
            families["xvs_kube_event_to_dataplane_seconds"].kind,
            "histogram"
        );
        assert_eq!(families["xvs_worker_busy_ratio"].kind, "gauge");
        for (name, f) in &families {
            assert!(!f.help.is_empty() && f.kind != "unknown", "{name}: {f:?}");
        }
        let drop = families["xvs_drops"]
            .samples
            .iter()
            .find(|s| s.labels.get("reason").map(String::as_str) == Some("no_service"))
            .unwrap();
        assert_eq!((drop.name.as_str(), drop.value()), ("xvs_drops_total", 4.0));
    }

    /// Labels Prometheus itself adds to every series of a target.
    const TARGET_LABELS: [&str; 2] = ["instance", "job"];

    /// Every PromQL expression of the dashboard (panel targets and template
    /// variable queries).
    fn expressions(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", serde_json::Value::String(s))
                            if s.contains("xvs_") =>
                        {
                            out.push(s.clone())
                        }
                        _ => expressions(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| expressions(v, out)),
            _ => {}
        }
    }

    /// The Grafana dashboard (`packaging/grafana/xvs.json`) asks only for
    /// what xvs exports: every metric name in every query is a sample of
    /// `/metrics` (every family rendered, read back by the official parser),
    /// every label a query matches or groups by is one of that metric's (or a
    /// target label Prometheus adds), and every literal label value it
    /// matches is one xvs writes.
    #[test]
    fn the_grafana_dashboard_asks_only_for_what_xvs_exports() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/grafana/xvs.json");
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        if !xvs_vm_tests::prom::available() {
            return;
        }
        let text = render(example(), &Histograms::default());
        let mut exported: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for family in xvs_vm_tests::prom::parse(&text).unwrap().into_values() {
            for s in family.samples {
                let labels = exported.entry(s.name).or_default();
                for (k, v) in s.labels {
                    labels.entry(k).or_default().insert(v);
                }
            }
        }
        let mut exprs = Vec::new();
        expressions(&dashboard, &mut exprs);
        assert!(exprs.len() >= 12, "{exprs:?}");
        // The panels the dashboard promises.
        for wanted in [
            "xvs_rx_frames_total",
            "xvs_drops_total",
            "xvs_new_flows_total",
            "xvs_conntrack_entries",
            "xvs_conntrack_capacity",
            "snat_exhausted",
            "xvs_service_packets_total",
            "xvs_update_latency_seconds_bucket",
            "xvs_kube_event_to_dataplane_seconds_bucket",
        ] {
            assert!(
                exprs.iter().any(|e| e.contains(wanted)),
                "no query uses {wanted}"
            );
        }
        let name = regex::Regex::new(r"\bxvs_[a-z0-9_]+").unwrap();
        let selector = regex::Regex::new(r"(xvs_[a-z0-9_]+)\{([^}]*)\}").unwrap();
        let matcher = regex::Regex::new(r#"([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)""#).unwrap();
        let by = regex::Regex::new(r"\bby\s*\(([^)]*)\)").unwrap();
        for e in &exprs {
            let names: Vec<&str> = name.find_iter(e).map(|m| m.as_str()).collect();
            for n in &names {
                assert!(exported.contains_key(*n), "{n} (in {e}) is not exported");
            }
            for c in selector.captures_iter(e) {
                let labels = &exported[&c[1]];
                for m in matcher.captures_iter(&c[2]) {
                    let key = &m[1];
                    if TARGET_LABELS.contains(&key) {
                        continue;
                    }
                    let values = labels
                        .get(key)
                        .unwrap_or_else(|| panic!("{} has no label {key} (in {e})", &c[1]));
                    if &m[2] == "=" {
                        assert!(
                            values.contains(&m[3]),
                            "{}{{{key}=\"{}\"}}: no such value",
                            &c[1],
                            &m[3]
                        );
                    }
                }
            }
            for c in by.captures_iter(e) {
                for key in c[1].split(',').map(str::trim).filter(|k| !k.is_empty()) {
                    let has = names
                        .iter()
                        .any(|n| exported[*n].contains_key(key) || TARGET_LABELS.contains(&key));
                    assert!(has, "no metric of {e} has label {key}");
                }
            }
        }
    }
}
