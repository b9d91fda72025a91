//! The Grafana dashboard (`packaging/grafana/xvs.json`) asks only for what
//! xvs exports: every metric name in every query is a family of
//! `/metrics` (rendered here with every family present and read back by
//! the official Prometheus parser), every label a query matches or groups
//! by is one of that metric's labels (or a target label Prometheus adds),
//! and every literal label value it matches is one xvs writes.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use regex::Regex;
use xvs_control::metrics::{render, Histograms, KubeReading, Scrape};
use xvs_control::view::{BackendView, Listing, Rates, ServiceView, Stats};
use xvs_dataplane::counters::CountersReading;

/// Labels Prometheus itself adds to every series of a target.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Every sample name xvs exports, with the labels (and their values) it
/// carries.
fn exported() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let backend = BackendView {
        address: Ipv4Addr::new(198, 18, 1, 10).into(),
        port: 80,
        weight: 1,
        forward: xvs_config::ForwardMethod::Masq,
        encap: None,
        health: Some("up".into()),
        active: 0,
        inactive: 0,
        stats: Stats::default(),
        rates: Rates::default(),
    };
    let listing = Listing {
        size: 1024,
        services: vec![ServiceView {
            protocol: "tcp".into(),
            vip: Ipv4Addr::new(198, 19, 0, 1).into(),
            port: 80,
            scheduler: "rr".into(),
            flags: Vec::new(),
            persistence: None,
            stats: Stats::default(),
            rates: Rates::default(),
            backends: vec![backend],
        }],
    };
    let scrape = Scrape {
        listing,
        workers: vec![CountersReading::default()],
        overflow: vec![0],
        kube: Some(KubeReading {
            synced: true,
            last_sync_age: Some(1.0),
            errors: 0,
            invalid_values: 0,
        }),
        sync: None,
        admin_refused: (0, 0),
    };
    let text = render(scrape, &Histograms::default());
    let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    if !xvs_vm_tests::prom::available() {
        return out;
    }
    for family in xvs_vm_tests::prom::parse(&text).unwrap().into_values() {
        for s in family.samples {
            let labels = out.entry(s.name).or_default();
            for (k, v) in s.labels {
                labels.entry(k).or_default().insert(v);
            }
        }
    }
    out
}

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

#[test]
fn every_dashboard_query_asks_for_what_xvs_exports() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/grafana/xvs.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exported = exported();
    if exported.is_empty() {
        return; // the parser is missing (and that is allowed here)
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
    let name = Regex::new(r"\bxvs_[a-z0-9_]+").unwrap();
    let selector = Regex::new(r"(xvs_[a-z0-9_]+)\{([^}]*)\}").unwrap();
    let matcher = Regex::new(r#"([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)""#).unwrap();
    let by = Regex::new(r"\bby\s*\(([^)]*)\)").unwrap();
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
