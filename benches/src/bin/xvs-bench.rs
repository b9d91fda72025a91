//! xvs-bench: the end-to-end comparison, on one namespace topology and in
//! one run, of xvs, a raw AF_XDP forwarder (the ceiling), and the kernel
//! with kube-proxy's rule shapes (iptables-legacy, iptables-nft,
//! nftables), at 1 to 100,000 services, for new and established flows,
//! aiming at the last service in rule order. Also the load time of each
//! rule or service set and the time to apply one endpoint change. Prints
//! a table, writes JSON and an SVG chart, and checks the targets (reading
//! the criterion results of `cargo bench` for the per-packet ones).
//!
//! Then the same over IPv6 (`--ipv6`, at 1 and 10,000 services by
//! default): xvs against ip6tables-legacy and nftables (`ip6` table) with
//! kube-proxy's IPv6 rule shapes, and how xvs's IPv6 new-flow rate
//! compares with its IPv4 one.
//!
//! Run as root, after `cargo bench` (or without it: the per-packet
//! targets are then reported as not measured): `make bench`.

#![allow(clippy::disallowed_types)] // a benchmark measures real time
#![allow(clippy::print_stdout)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use xvs_benches::e2e::{
    feed_timed, target_endpoints, target_endpoints6, with_raw_forwarder, Bed, Measured, Workload,
    XvsRunner, FWD_CPU, SNAT_ADDRS, SNAT_ADDRS6, UDP_TIMEOUT,
};
use xvs_benches::frames::ep_any;
use xvs_benches::report::{
    fill_ratios, merge_rounds, table, write_chart, write_json, Change, Report, Row, Target,
};
use xvs_benches::rulesets::{
    iptables, iptables_change, nftables, nftables_change, services, xvs_services, xvs_services_via,
    Svc,
};
use xvs_config::{Encap, ForwardMethod};
use xvs_dataplane::counters::CountersReading;
use xvs_dataplane::runtime::Dataplane;
use xvs_dataplane::wire::DropReason;
use xvs_dataplane::xsk::RingStats;

#[derive(Parser)]
#[command(
    version,
    about = "xvs against a raw AF_XDP forwarder and kube-proxy's iptables and nftables modes"
)]
struct Cli {
    /// Service counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,1000,10000,100000")]
    services: Vec<usize>,
    /// Seconds of traffic per measurement (at most 30).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "target/xvs-bench.svg")]
    chart: PathBuf,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/xvs-bench.json")]
    json: PathBuf,
    /// Give up on loading one rule set after this many seconds; a load
    /// that the previous count's time, scaled linearly, puts above this is
    /// skipped (with that reason), when that count was 1,000 or more and
    /// within 100x (below, the tool's fixed cost would dominate the
    /// estimate: the load is tried instead).
    #[arg(long, default_value_t = 100)]
    load_timeout: u64,
    /// Criterion's output directory (for the per-packet targets).
    #[arg(long, default_value = "target/criterion")]
    criterion: PathBuf,
    /// Print one rule set (`iptables`, `nftables` or `xvs`) for the first
    /// --services count and exit, to load or inspect it by hand.
    #[arg(long, value_parser = ["iptables", "nftables", "xvs"])]
    dump: Option<String>,
    /// Service count at which one endpoint change is timed.
    #[arg(long, default_value_t = 10_000)]
    change_at: usize,
    /// Service counts of the IPv6 rows (xvs, ip6tables-legacy, nftables
    /// over IPv6); `0` for none.
    #[arg(long, value_delimiter = ',', default_value = "1,10000")]
    ipv6: Vec<usize>,
    /// Rounds of the ceiling and xvs's IPv4 rows, alternated (raw, xvs,
    /// raw, xvs, ...): each row's pps is the median of its rounds', and
    /// each xvs row's share of the ceiling the median of its rounds'
    /// shares, each against the raw forwarder of the same round.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
}

/// Which family a run of rows is over.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fam {
    V4,
    V6,
}

impl Fam {
    /// The service counts of this family's rows.
    fn counts(self, cli: &Cli) -> Vec<usize> {
        match self {
            Fam::V4 => cli.services.clone(),
            Fam::V6 => cli.ipv6.iter().copied().filter(|&n| n > 0).collect(),
        }
    }

    /// The endpoints that receive traffic.
    fn targets(self) -> Vec<xvs_dataplane::wire::Endpoint<IpAddr>> {
        match self {
            Fam::V4 => target_endpoints(),
            Fam::V6 => target_endpoints6(),
        }
    }

    /// A mode's name in this family's rows.
    fn mode(self, v4: &str) -> String {
        match self {
            Fam::V4 => v4.to_owned(),
            Fam::V6 if v4 == "iptables-legacy" => "ip6tables-legacy".to_owned(),
            Fam::V6 => format!("{v4}-ipv6"),
        }
    }
}

const WORKLOADS: [Workload; 2] = [Workload::NewFlows, Workload::Established];
const PORT_OF_TARGET: u16 = 9000;

fn row(
    mode: &str,
    services: usize,
    w: Workload,
    m: Result<Measured, String>,
    load: Option<f64>,
) -> Row {
    let (sent, pps, error) = match m {
        Ok(m) => (m.sent_pps, Some(m.delivered_pps), None),
        Err(e) => (0.0, None, Some(e)),
    };
    Row {
        mode: mode.into(),
        services,
        workload: w.name().into(),
        sent_pps: sent,
        pps,
        of_ceiling: None,
        of_iptables_legacy: None,
        load_seconds: load,
        error,
        note: None,
    }
}

/// The xvs workers' counters added up.
fn xvs_totals(runner: &XvsRunner) -> Result<CountersReading, String> {
    runner.run(|dp: &mut Option<Dataplane>| {
        let mut t = CountersReading::default();
        for r in dp
            .as_ref()
            .map(|d| d.handle().counters())
            .unwrap_or_default()
        {
            t.add(&r);
        }
        t
    })
}

/// What xvs counted between two readings.
fn xvs_note(a: &CountersReading, b: &CountersReading) -> String {
    let mut s = format!(
        "rx={} forwarded={} new_flows={} tx={} busy_loops={} idle_loops={}",
        b.pipeline.rx - a.pipeline.rx,
        b.pipeline.forwarded - a.pipeline.forwarded,
        b.pipeline.new_flows - a.pipeline.new_flows,
        b.worker.tx - a.worker.tx,
        b.worker.busy - a.worker.busy,
        b.worker.idle - a.worker.idle
    );
    for r in DropReason::ALL {
        let d = b.pipeline.drops[r.index()] - a.pipeline.drops[r.index()];
        if d > 0 {
            s.push_str(&format!(" drop.{}={d}", r.name()));
        }
    }
    s.push_str(&ring_note(&a.rings, &b.rings));
    s
}

/// What the kernel counted on the AF_XDP sockets between two readings
/// (only what moved): the frames lost before the forwarder saw them, and
/// why — where offered and received part.
fn ring_note(a: &RingStats, b: &RingStats) -> String {
    let mut s = String::new();
    for ((name, before), (_, after)) in a.named().zip(b.named()) {
        let d = after.saturating_sub(before);
        if d > 0 {
            s.push_str(&format!(" {name}={d}"));
        }
    }
    s
}

fn failed(mode: &str, services: usize, e: &str, rows: &mut Vec<Row>) {
    for w in WORKLOADS {
        rows.push(row(mode, services, w, Err(e.to_owned()), None));
    }
}

/// The endpoint change applied at `change_at`: the target's third
/// endpoint moves to another address.
fn changed(svc: &Svc) -> Svc {
    let mut new = svc.clone();
    if let Some(e) = new.endpoints.last_mut() {
        e.addr = Ipv4Addr::new(198, 18, 1, 13).into();
    }
    new
}

/// Where the measured data plane keeps its flow state (in shared memory,
/// as in production); removed after the xvs rows.
fn bench_state_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("xvs-bench-state-{}", std::process::id()))
}

fn xvs_header(fam: Fam) -> String {
    let mut snat: Vec<String> = SNAT_ADDRS.iter().map(|a| format!("\"{a}\"")).collect();
    // IPv6 SNAT addresses only for the IPv6 rows (they add a flow table).
    if fam == Fam::V6 {
        snat.extend(SNAT_ADDRS6.iter().map(|a| format!("\"{a}\"")));
    }
    format!(
        "[interfaces]\nmode = \"two-arm\"\nclient = \"gc\"\nbackend = \"gb\"\nqueues = [0]\ncores = [{FWD_CPU}]\n\
         poll = \"busy\"\nzero_copy = \"off\"\n\n[snat]\naddresses = [{}]\nports = \"1024-65535\"\n\n\
         [conntrack]\ncapacity = 2000000\n\n[conntrack.timeouts]\nudp = {UDP_TIMEOUT}\n\n\
         [restart]\nstate_dir = \"{}\"\n\n",
        snat.join(", "),
        bench_state_dir().display()
    )
}

/// Both workloads against `dst` with xvs running (`mode` with `n`
/// services, loaded in `load` seconds): a row each, xvs's counters in
/// its note.
fn measure_xvs(
    runner: &XvsRunner,
    bed: &mut Bed,
    (mode, n, load): (&str, usize, f64),
    dst: xvs_dataplane::wire::Endpoint<IpAddr>,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    for w in WORKLOADS {
        let before = xvs_totals(runner)?;
        let m = bed.measure(dst, w);
        let after = xvs_totals(runner)?;
        let mut r = row(mode, n, w, m, Some(load));
        r.note = Some(xvs_note(&before, &after));
        rows.push(r);
    }
    Ok(())
}

/// Removes the measured data plane's flow state (after its runner).
fn remove_bench_state() {
    let dir = bench_state_dir();
    xvs_dataplane::state::remove_files(&dir, "gc");
    xvs_dataplane::state::unmount_dir(&dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// (Re)starts xvs in the runner on config `text`; the seconds it took
/// to start.
fn start_xvs(runner: &XvsRunner, text: String) -> Result<Result<f64, String>, String> {
    runner.run(move |dp: &mut Option<Dataplane>| -> Result<f64, String> {
        if let Some(old) = dp.take() {
            old.stop();
        }
        let start = Instant::now();
        let cfg = xvs_config::parse_str("bench.toml", &text).map_err(|e| e.to_string())?;
        let d = Dataplane::start(&cfg, xvs_dataplane::steer::monotonic_secs)
            .map_err(|e| e.to_string())?;
        let took = start.elapsed().as_secs_f64();
        // Its flow events drained as the daemon's control plane drains
        // them.
        xvs_benches::drain::register(d.events()).map_err(|e| e.to_string())?;
        *dp = Some(d);
        Ok(took)
    })
}

/// The service counts the direct-return rows are measured at: the
/// smallest and the largest asked for.
fn dsr_counts(cli: &Cli) -> Vec<usize> {
    let mut c: Vec<usize> = [cli.services.iter().min(), cli.services.iter().max()]
        .into_iter()
        .flatten()
        .copied()
        .collect();
    c.dedup();
    c
}

/// The VIPs the direct-return rows send to (the sink counts them too:
/// direct routing delivers the packet to the endpoint unchanged).
fn dsr_vips(cli: &Cli) -> Vec<IpAddr> {
    dsr_counts(cli)
        .into_iter()
        .map(|n| services(n, "udp", &target_endpoints())[n - 1].vip)
        .collect()
}

/// xvs with direct routing and with GUE tunnels to the same endpoints
/// (replies would bypass the gateway; here the sink counts what arrives,
/// and it takes UDP: GUE rather than IPIP): `xvs-route` and `xvs-gue`
/// rows beside full NAT's, at the smallest and the largest service
/// count.
fn run_xvs_dsr(cli: &Cli, bed: &mut Bed, rows: &mut Vec<Row>) -> Result<(), String> {
    let runner = XvsRunner::new(bed.gateway())?;
    for (forward, mode) in [
        (ForwardMethod::Route, "xvs-route"),
        (ForwardMethod::Tunnel, "xvs-gue"),
    ] {
        for n in dsr_counts(cli) {
            let svcs = services(n, "udp", &target_endpoints());
            let text = format!(
                "{}{}",
                xvs_header(Fam::V4),
                xvs_services_via(&svcs, forward, Encap::Gue)
            );
            eprintln!("{mode}: {n} services");
            let load = match start_xvs(&runner, text)? {
                Ok(s) => s,
                Err(e) => {
                    failed(mode, n, &e, rows);
                    continue;
                }
            };
            let dst = ep_any(svcs[n - 1].vip, svcs[n - 1].port);
            measure_xvs(&runner, bed, (mode, n, load), dst, rows)?;
        }
    }
    drop(runner);
    remove_bench_state();
    Ok(())
}

fn run_xvs(
    cli: &Cli,
    fam: Fam,
    bed: &mut Bed,
    rows: &mut Vec<Row>,
    changes: &mut Vec<Change>,
) -> Result<(), String> {
    let runner = XvsRunner::new(bed.gateway())?;
    let mode = fam.mode("xvs");
    for n in fam.counts(cli) {
        let svcs = services(n, "udp", &fam.targets());
        let text = format!("{}{}", xvs_header(fam), xvs_services(&svcs));
        eprintln!("{mode}: {n} services");
        let loaded = start_xvs(&runner, text)?;
        let load = match loaded {
            Ok(s) => s,
            Err(e) => {
                failed(&mode, n, &e, rows);
                continue;
            }
        };
        let dst = ep_any(svcs[n - 1].vip, svcs[n - 1].port);
        measure_xvs(&runner, bed, (&mode, n, load), dst, rows)?;
        if n == cli.change_at && fam == Fam::V4 {
            let new = changed(&svcs[n - 1]);
            let one = format!("{}{}", xvs_header(fam), xvs_services(&[new]));
            let cfg = xvs_config::parse_str("change.toml", &one).map_err(|e| e.to_string())?;
            let svc = cfg.services[0].clone();
            let took = runner.run(move |dp: &mut Option<Dataplane>| -> Result<f64, String> {
                let dp = dp.as_mut().ok_or("xvs is not running")?;
                let start = Instant::now();
                dp.upsert_service(&svc).map_err(|e| e.to_string())?;
                if !dp.handle().wait_applied(Duration::from_secs(5)) {
                    return Err("not applied by every worker within 5 s".into());
                }
                Ok(start.elapsed().as_secs_f64())
            })?;
            changes.push(Change {
                mode: "xvs".into(),
                services: n,
                seconds: took.as_ref().ok().copied(),
                error: took.err(),
            });
        }
    }
    drop(runner);
    remove_bench_state();
    Ok(())
}

/// A kernel mode: how to load, empty and change its rules.
struct Kernel {
    mode: &'static str,
    fam: Fam,
    program: &'static str,
    load_args: &'static [&'static str],
    change_args: &'static [&'static str],
    empty: &'static str,
    full: fn(&[Svc]) -> String,
    change: fn(&Svc, &Svc) -> String,
}

const KERNELS: [Kernel; 3] = [
    Kernel {
        mode: "iptables-legacy",
        fam: Fam::V4,
        program: "iptables-legacy-restore",
        load_args: &[],
        change_args: &["--noflush"],
        empty: "*nat\nCOMMIT\n",
        full: iptables,
        change: iptables_change,
    },
    Kernel {
        mode: "iptables-nft",
        fam: Fam::V4,
        program: "iptables-nft-restore",
        load_args: &[],
        change_args: &["--noflush"],
        empty: "*nat\nCOMMIT\n",
        full: iptables,
        change: iptables_change,
    },
    Kernel {
        mode: "nftables",
        fam: Fam::V4,
        program: "nft",
        load_args: &["-f", "-"],
        change_args: &["-f", "-"],
        empty: "table ip kube-proxy\ndelete table ip kube-proxy\n",
        full: nftables,
        change: nftables_change,
    },
];

/// kube-proxy's IPv6 proxier: the same shapes in ip6tables and an `ip6`
/// nftables table.
const KERNELS6: [Kernel; 2] = [
    Kernel {
        mode: "ip6tables-legacy",
        fam: Fam::V6,
        program: "ip6tables-legacy-restore",
        load_args: &[],
        change_args: &["--noflush"],
        empty: "*nat\nCOMMIT\n",
        full: iptables,
        change: iptables_change,
    },
    Kernel {
        mode: "nftables-ipv6",
        fam: Fam::V6,
        program: "nft",
        load_args: &["-f", "-"],
        change_args: &["-f", "-"],
        empty: "table ip6 kube-proxy\ndelete table ip6 kube-proxy\n",
        full: nftables,
        change: nftables_change,
    },
];

fn run_kernel(
    cli: &Cli,
    k: &Kernel,
    bed: &mut Bed,
    rows: &mut Vec<Row>,
    changes: &mut Vec<Change>,
) -> Result<(), String> {
    let timeout = Duration::from_secs(cli.load_timeout);
    let gw = bed.gateway().name().to_owned();
    let ns = xvs_vm_tests::netns::Netns::existing(&gw);
    let mut previous: Option<(usize, f64)> = None;
    for n in k.fam.counts(cli) {
        eprintln!("{}: {n} services", k.mode);
        // A load time extrapolates linearly only from 1,000 services or
        // more and a count near enough (below, the tool's fixed cost
        // dominates: 1 service loads in 0.02 s, which would put 10,000 at
        // 200 s); otherwise the load itself is tried, time-boxed.
        if let Some((m, took)) = previous.filter(|&(m, _)| m >= 1_000 && m * 100 >= n) {
            let expected = took * n as f64 / m as f64;
            if expected > timeout.as_secs_f64() {
                let e = format!(
                    "skipped: {took:.1} s at {m} services puts {n} at {expected:.0} s or more, above the {} s limit",
                    timeout.as_secs()
                );
                failed(k.mode, n, &e, rows);
                continue;
            }
        }
        let svcs = services(n, "udp", &k.fam.targets());
        feed_timed(&ns, k.program, k.load_args, k.empty, timeout)?;
        let text = (k.full)(&svcs);
        let commit_line = format!("line {} failed", text.lines().count());
        let loaded = feed_timed(&ns, k.program, k.load_args, &text, timeout);
        drop(text);
        let load = match loaded {
            Ok(d) => d.as_secs_f64(),
            Err(e) => {
                // Failing on the last line (COMMIT) means every rule parsed
                // and the kernel refused the table: legacy x_tables caps a
                // table at 512 MiB (setsockopt IPT_SO_SET_REPLACE: ENOMEM).
                let e = if k.mode == "iptables-legacy" && e.contains(&commit_line) {
                    format!("{e}: the kernel refused the table at COMMIT (x_tables caps a table at 512 MiB)")
                } else {
                    e
                };
                failed(k.mode, n, &e, rows);
                continue;
            }
        };
        previous = Some((n, load));
        // conntrack's sysctls exist once the rules loaded the module.
        for key in [
            "net.netfilter.nf_conntrack_udp_timeout",
            "net.netfilter.nf_conntrack_udp_timeout_stream",
        ] {
            bed.gateway()
                .sysctl(key, &UDP_TIMEOUT.to_string())
                .map_err(|e| e.to_string())?;
        }
        let dst = ep_any(svcs[n - 1].vip, svcs[n - 1].port);
        for w in WORKLOADS {
            rows.push(row(k.mode, n, w, bed.measure(dst, w), Some(load)));
        }
        if n == cli.change_at && k.fam == Fam::V4 {
            let took = feed_timed(
                &ns,
                k.program,
                k.change_args,
                &(k.change)(&svcs[n - 1], &changed(&svcs[n - 1])),
                timeout,
            );
            changes.push(Change {
                mode: k.mode.into(),
                services: n,
                seconds: took.as_ref().ok().map(Duration::as_secs_f64),
                error: took.err(),
            });
        }
    }
    feed_timed(&ns, k.program, k.load_args, k.empty, timeout)?;
    Ok(())
}

/// A criterion median in nanoseconds per element (`per` elements per
/// iteration) and when it was written, if `cargo bench` ran.
fn criterion_ns(
    dir: &std::path::Path,
    group: &str,
    bench: &str,
    per: f64,
) -> Option<(f64, SystemTime)> {
    let path = dir.join(group).join(bench).join("new/estimates.json");
    let text = std::fs::read_to_string(&path).ok()?;
    let written = std::fs::metadata(&path).ok()?.modified().ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"]
        .as_f64()
        .map(|ns| (ns / per, written))
}

fn targets(cli: &Cli, rows: &[Row]) -> Vec<Target> {
    let mut out = Vec::new();
    let pps = |mode: &str, w: &str| -> Vec<(usize, f64)> {
        rows.iter()
            .filter(|r| r.mode == mode && r.workload == w)
            .filter_map(|r| r.pps.map(|p| (r.services, p)))
            .collect()
    };
    let xvs_new = pps("xvs", "new");
    if let (Some(lo), Some(hi)) = (
        xvs_new.iter().map(|p| p.1).reduce(f64::min),
        xvs_new.iter().map(|p| p.1).reduce(f64::max),
    ) {
        let spread = 1.0 - lo / hi.max(1.0);
        out.push(Target {
            goal: "xvs new-flow pps within 10% from 1 to 100,000 services".into(),
            measured: format!(
                "{:.0} to {:.0} pps, spread {:.1}% ({})",
                lo,
                hi,
                spread * 100.0,
                xvs_new
                    .iter()
                    .map(|(n, p)| format!("{n}: {p:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            met: spread <= 0.10,
            missed_by: format!("{:.1} points", (spread - 0.10) * 100.0),
            cause: "run-to-run noise of the shared 2-vCPU machine (the service lookup is one hash probe at any count; see pipeline_100k_services_1M_flows/service_lookup)".into(),
        });
    }
    out.extend(ceiling_targets(rows));
    let legacy = pps("iptables-legacy", "new");
    let below: Vec<String> = xvs_new
        .iter()
        .filter_map(|&(n, p)| {
            let l = legacy.iter().find(|l| l.0 == n)?.1;
            (p <= l).then(|| format!("{n} services: xvs {p:.0} <= legacy {l:.0}"))
        })
        .collect();
    let compared = xvs_new
        .iter()
        .filter(|(n, _)| legacy.iter().any(|l| l.0 == *n))
        .count();
    out.push(Target {
        goal: "xvs above iptables-legacy at every service count for new flows".into(),
        measured: format!(
            "{} of {compared} counts above{}",
            compared - below.len(),
            if compared < cli.services.len() {
                " (legacy did not load at some counts: see the table)"
            } else {
                ""
            }
        ),
        met: below.is_empty() && compared > 0,
        missed_by: below.join("; "),
        cause: "the generator and the kernel path share the bottleneck at small rule counts".into(),
    });
    // IPv6's new-flow rate against IPv4's, at the counts both ran.
    let xvs_new6 = pps("xvs-ipv6", "new");
    let pairs: Vec<(usize, f64, f64)> = xvs_new6
        .iter()
        .filter_map(|&(n, p6)| Some((n, xvs_new.iter().find(|v| v.0 == n)?.1, p6)))
        .collect();
    if !pairs.is_empty() {
        let worst = pairs
            .iter()
            .map(|&(_, p4, p6)| p6 / p4.max(1.0))
            .fold(f64::INFINITY, f64::min);
        out.push(Target {
            goal: "xvs IPv6 new-flow pps within 10% of IPv4's".into(),
            measured: pairs
                .iter()
                .map(|(n, p4, p6)| format!("{n} services: IPv6 {p6:.0} / IPv4 {p4:.0} = {:.2}", p6 / p4.max(1.0)))
                .collect::<Vec<_>>()
                .join("; "),
            met: worst >= 0.9,
            missed_by: format!("{:.2}", 0.9 - worst),
            cause: "an IPv6 frame is 20 bytes longer and its entry two cache lines where an IPv4 entry is one (128 bytes against 64): more bytes per packet through the same CPU".into(),
        });
    }
    out.extend(pipeline_targets(&cli.criterion, SystemTime::now()));
    out
}

/// The end-to-end targets: xvs's share of the raw forwarder's pps in the
/// same round (the median of the rounds' shares), new flows >= 0.9 and
/// established ones >= 0.95, at every IPv4 service count measured.
fn ceiling_targets(rows: &[Row]) -> Vec<Target> {
    [("new", 0.9), ("established", 0.95)]
        .into_iter()
        .filter_map(|(workload, floor)| {
            let shares: Vec<(usize, f64)> = rows
                .iter()
                .filter(|r| r.mode == "xvs" && r.workload == workload)
                .filter_map(|r| r.of_ceiling.map(|c| (r.services, c)))
                .collect();
            let worst = shares.iter().map(|s| s.1).reduce(f64::min)?;
            Some(Target {
                goal: format!(
                    "xvs {workload} flows >= {floor} of the raw AF_XDP forwarder at every service count"
                ),
                measured: shares
                    .iter()
                    .map(|(n, c)| format!("{n} services: {c:.2}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                met: worst >= floor,
                missed_by: missed_by(worst >= floor, || format!("{:.2}", floor - worst)),
                cause: "per-packet work of xvs (conntrack, NAT, scheduling; for new flows an insert, a SNAT reply-key probe and an expiry, all at random in the flow table) beyond the raw forwarder's MAC rewrite, on a CPU whose time the kernel's copy-mode transmit takes most of; rounds of one run spread about 0.1 on this machine (`--rounds` takes the median)".into(),
            })
        })
        .collect()
}

/// The per-packet targets, read from criterion's medians of the
/// `pipeline` bench (each estimate's age is shown: they are whatever run
/// of `cargo bench -p xvs-benches --bench pipeline` wrote them last; that
/// run's own report divides them by the memory floor of the same run).
fn pipeline_targets(dir: &std::path::Path, now: SystemTime) -> Vec<Target> {
    let lookup = criterion_ns(dir, "conntrack_1000000", "lookup_hit", 1.0);
    let dram = criterion_ns(dir, "memory_baseline", "random_read_128MiB", 1.0);
    let cause_dram = format!(
        "random access over 1M flows and 100k services: each packet's flow-index bucket, its entry's cache line, its service's handles, its backend's traffic counters (300k backends, IPVS-style per-packet --stats) and its next hop miss the caches; a batch prefetches them in stages, so the packet costs what the memory system's parallelism allows (conntrack lookup hit at 1M: {} ns; independent random reads: {} ns each; the pipeline bench's report divides each time by the reads of its own run)",
        lookup.map_or("-".into(), |(v, _)| format!("{v:.0}")),
        dram.map_or("-".into(), |(v, _)| format!("{v:.1}"))
    );
    let cause_new = format!(
        "a new flow probes the service table, reads its scheduler and backends, probes the flow index for the SNAT candidate's reply key, takes a free entry, inserts both keys and counts the connection in two per-backend lines: misses at 1M flows that its batch overlaps only in part; {cause_dram}"
    );
    let cause_resident = "instructions, not misses: about 530 per established packet and 2,000 per new flow (callgrind, `XVS_PIPELINE_COUNT`), spread over classification, lookup, state, rewrite, checksum and counters; and the machine's window (the same build's times differ about 2x between hours here)".to_owned();
    let big = "pipeline_100k_services_1M_flows";
    let small = "pipeline_10_services_1k_flows";
    let limits = [
        Limit {
            group: big,
            batch: ("established_batch64", 64.0),
            single: "established_packet",
            ns: 100.0,
            what: "established flow (100k services, 1M flows)",
            cause: &cause_dram,
        },
        Limit {
            group: big,
            batch: ("new_flow_syn_batch64", 1.0),
            single: "new_flow_syn",
            ns: 300.0,
            what: "new flow (100k services, 1M flows)",
            cause: &cause_new,
        },
        Limit {
            group: small,
            batch: ("established_batch64", 64.0),
            single: "established_packet",
            ns: 40.0,
            what: "established flow (cache-resident: 10 services, 1,000 flows)",
            cause: &cause_resident,
        },
        Limit {
            group: small,
            batch: ("new_flow_syn_batch64", 1.0),
            single: "new_flow_syn",
            ns: 150.0,
            what: "new flow (cache-resident: 10 services, 1,000 flows)",
            cause: &cause_resident,
        },
    ];
    limits
        .into_iter()
        .map(|l| {
            let goal = format!("per-packet pipeline <= {:.0} ns, {}", l.ns, l.what);
            match criterion_ns(dir, l.group, l.batch.0, l.batch.1) {
                Some((v, written)) => Target {
                    goal,
                    measured: format!(
                        "{v:.0} ns in batches of 64 (one at a time: {}; criterion median {})",
                        criterion_ns(dir, l.group, l.single, 1.0)
                            .map_or("-".into(), |(v, _)| format!("{v:.0} ns")),
                        age(written, now)
                    ),
                    met: v <= l.ns,
                    missed_by: missed_by(v <= l.ns, || format!("{:.0} ns", v - l.ns)),
                    cause: l.cause.clone(),
                },
                None => Target {
                    goal,
                    measured:
                        "not measured: run `cargo bench -p xvs-benches --bench pipeline` first"
                            .into(),
                    met: false,
                    missed_by: "-".into(),
                    cause: "-".into(),
                },
            }
        })
        .collect()
}

/// A per-packet limit and the criterion medians that judge it.
struct Limit<'a> {
    /// Criterion's group (the `pipeline` bench's workload).
    group: &'a str,
    /// The batched function, and the packets one of its iterations takes.
    batch: (&'a str, f64),
    /// The one-at-a-time function (one packet an iteration).
    single: &'a str,
    /// The limit, in ns per packet.
    ns: f64,
    /// What is measured, for the goal's text.
    what: &'a str,
    /// Why it is missed, if it is.
    cause: &'a String,
}

/// [`Target::missed_by`]: empty when the target is met, else `by()`.
fn missed_by(met: bool, by: impl FnOnce() -> String) -> String {
    if met {
        String::new()
    } else {
        by()
    }
}

/// How long before `now` an estimate was written, for a reader to tell
/// this run's figures from an old one's.
fn age(written: SystemTime, now: SystemTime) -> String {
    match now.duration_since(written) {
        Ok(d) if d.as_secs() < 120 => format!("written {} s ago", d.as_secs()),
        Ok(d) if d.as_secs() < 7_200 => format!("written {} min ago", d.as_secs() / 60),
        Ok(d) => format!("written {:.1} h ago", d.as_secs_f64() / 3_600.0),
        Err(_) => "written after this report began".into(),
    }
}

fn bench(cli: Cli) -> Result<(), String> {
    if let Some(kind) = &cli.dump {
        let n = cli.services.first().copied().unwrap_or(1);
        let svcs = services(n, "udp", &target_endpoints());
        match kind.as_str() {
            "iptables" => print!("{}", iptables(&svcs)),
            "nftables" => print!("{}", nftables(&svcs)),
            _ => print!("{}{}", xvs_header(Fam::V4), xvs_services(&svcs)),
        }
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("run as root: the bench creates namespaces and attaches XDP".into());
    }
    if !(cli.seconds > 0.0 && cli.seconds <= 30.0) {
        return Err(format!(
            "--seconds {}: expected 0 < seconds <= 30",
            cli.seconds
        ));
    }
    if !(1..=20).contains(&cli.rounds) {
        return Err(format!("--rounds {}: expected 1..=20", cli.rounds));
    }
    if cli.services.iter().any(|&n| n == 0 || n > 200_000) {
        return Err("--services: each count must be 1..=200000".into());
    }
    let started = Instant::now();
    let mut bed = Bed::build(cli.seconds, &dsr_vips(&cli))?;
    let (mut rows, mut changes) = (Vec::new(), Vec::new());

    // 1. The ceiling: the raw forwarder, aimed at an endpoint directly,
    // then xvs over IPv4; in `--rounds` rounds.
    let mut rounds = Vec::new();
    for round in 0..cli.rounds {
        if cli.rounds > 1 {
            eprintln!("round {} of {}", round + 1, cli.rounds);
        }
        let mut these = Vec::new();
        eprintln!("raw AF_XDP forwarder");
        let spec = bed.raw_spec(Ipv4Addr::new(198, 18, 1, 10))?;
        let dst = ep_any(target_endpoints()[0].addr, PORT_OF_TARGET);
        let (raw, _) = with_raw_forwarder(&mut bed, spec, |bed, rings| {
            WORKLOADS.map(|w| {
                let before = rings();
                let m = bed.measure(dst, w);
                (w, m, ring_note(&before, &rings()))
            })
        })?;
        for (w, m, note) in raw {
            let mut r = row("raw", 0, w, m, None);
            r.note = Some(note);
            these.push(r);
        }
        // The endpoint change is timed in the first round only.
        let mut later = Vec::new();
        let changes = if round == 0 { &mut changes } else { &mut later };
        run_xvs(&cli, Fam::V4, &mut bed, &mut these, changes)?;
        rounds.push(these);
    }
    rows.extend(merge_rounds(rounds).ok_or("the rounds measured different rows")?);

    // 2. xvs's other forwarding methods, and IPv6.
    run_xvs_dsr(&cli, &mut bed, &mut rows)?;
    run_xvs(&cli, Fam::V6, &mut bed, &mut rows, &mut changes)?;

    // 3. The kernel, with RPS giving it the forwarding CPU, and no XDP
    // program left in its path.
    if xvs_benches::e2e::xdp_attached(bed.gateway())? {
        return Err("an XDP program is still attached in the gateway: the kernel's modes would run behind it".into());
    }
    bed.set_rps(1 << FWD_CPU)?;
    for k in KERNELS.iter().chain(&KERNELS6) {
        if let Err(e) = run_kernel(&cli, k, &mut bed, &mut rows, &mut changes) {
            eprintln!("{}: {e}", k.mode);
        }
    }
    bed.set_rps(0)?;
    drop(bed);

    fill_ratios(&mut rows);
    let targets = targets(&cli, &rows);
    let report = Report {
        seconds_per_run: cli.seconds,
        rows,
        changes,
        targets,
    };
    println!(
        "xvs-bench: UDP, 18-byte payloads, {} s per run, generator on CPU 0, forwarding on CPU {FWD_CPU}; pps = delivered to the sink; \
         {} huge pages reserved (each port's UMEM on 2 MiB pages if 8 are free, else 4 KiB)",
        cli.seconds,
        xvs_dataplane::host::huge_pages_reserved().unwrap_or(0)
    );
    print!("{}", table(&report));
    write_json(&report, &cli.json)?;
    write_chart(&report, &cli.chart)?;
    println!(
        "\nwrote {} and {} in {:.0} s",
        cli.json.display(),
        cli.chart.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // xvs runs in this process: with the heap the daemon's unit gives it.
    xvs_benches::exec_with_huge_page_heap();
    match bench(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xvs-bench: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xvs_row(services: usize, workload: &str, of_ceiling: f64) -> Row {
        Row {
            mode: "xvs".into(),
            services,
            workload: workload.into(),
            sent_pps: 500_000.0,
            pps: Some(300_000.0 * of_ceiling),
            of_ceiling: Some(of_ceiling),
            of_iptables_legacy: None,
            load_seconds: None,
            error: None,
            note: None,
        }
    }

    /// The issue's end-to-end targets, per workload and at every count:
    /// one count under the line misses the target by its gap.
    #[test]
    fn each_workload_s_share_is_held_to_its_own_floor_at_every_count() {
        let rows = [
            xvs_row(1, "new", 0.92),
            xvs_row(100_000, "new", 0.87),
            xvs_row(1, "established", 0.95),
            xvs_row(100_000, "established", 0.97),
        ];
        let t = ceiling_targets(&rows);
        assert_eq!(t.len(), 2);
        assert!(t[0].goal.contains("new flows >= 0.9 "), "{}", t[0].goal);
        assert_eq!(
            (t[0].met, t[0].missed_by.as_str()),
            (false, "0.03"),
            "{t:?}"
        );
        assert_eq!(t[0].measured, "1 services: 0.92, 100000 services: 0.87");
        assert!(t[1].goal.contains("established flows >= 0.95 "));
        assert_eq!((t[1].met, t[1].missed_by.as_str()), (true, ""), "{t:?}");
        // No xvs row of a workload: no verdict on it.
        assert_eq!(ceiling_targets(&rows[2..]).len(), 1);
    }

    /// The per-packet targets read criterion's medians, per element, with
    /// their age; a bench that did not run is said to be unmeasured.
    #[test]
    fn pipeline_targets_read_criterion_s_medians_with_their_age() {
        let dir = std::env::temp_dir().join(format!("xvs-bench-targets-{}", std::process::id()));
        let write = |group: &str, bench: &str, median: f64| {
            let d = dir.join(group).join(bench).join("new");
            std::fs::create_dir_all(&d).unwrap();
            let json = format!(r#"{{"median": {{"point_estimate": {median}}}}}"#);
            std::fs::write(d.join("estimates.json"), json).unwrap();
        };
        let big = "pipeline_100k_services_1M_flows";
        write(big, "established_batch64", 64.0 * 99.0);
        write(big, "established_packet", 400.0);
        write(big, "new_flow_syn_batch64", 301.0);
        write(
            "pipeline_10_services_1k_flows",
            "established_batch64",
            64.0 * 41.0,
        );
        let later = SystemTime::now() + Duration::from_secs(3 * 3_600);
        let t = pipeline_targets(&dir, later);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(t.len(), 4);
        let verdicts: Vec<(bool, &str)> = t.iter().map(|t| (t.met, t.missed_by.as_str())).collect();
        assert_eq!(
            verdicts,
            [(true, ""), (false, "1 ns"), (false, "1 ns"), (false, "-")]
        );
        assert!(t[0]
            .measured
            .starts_with("99 ns in batches of 64 (one at a time: 400 ns"));
        assert!(
            t[0].measured.contains("written 3.0 h ago"),
            "{}",
            t[0].measured
        );
        assert!(t[2]
            .goal
            .contains("<= 40 ns, established flow (cache-resident"));
        assert!(t[3].goal.contains("<= 150 ns, new flow (cache-resident"));
        assert!(t[3].measured.starts_with("not measured"));
    }

    #[test]
    fn ages_read_in_the_unit_that_suits_them() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| age(t0, t0 + Duration::from_secs(s));
        assert_eq!(at(5), "written 5 s ago");
        assert_eq!(at(600), "written 10 min ago");
        assert_eq!(at(5_400), "written 90 min ago");
        assert_eq!(at(9_000), "written 2.5 h ago");
        assert_eq!(
            age(t0 + Duration::from_secs(1), t0),
            "written after this report began"
        );
    }
}
