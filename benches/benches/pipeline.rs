//! The whole per-packet pipeline of one worker, sans-IO: a frame in, the
//! verdict and the rewritten frame out. A cache-resident workload (10
//! services, 1,000 flows) and the target one, with 100,000 services and
//! 1,000,000 flows in the table: a packet of an established flow (flows
//! taken in random order), a new flow (SYN to a random service: service
//! lookup, scheduler, SNAT port, insert, rewrite), and the service lookup
//! alone. Twice: with the flow table in anonymous memory, and in a state
//! file mapped shared, as `xvs run` keeps it to survive a restart (in a
//! folder prepared as `xvs prepare-state` prepares `/run/xvs/flows`: a
//! tmpfs with huge pages). The same over IPv6 (an IPv6 table, services and
//! 84-byte frames: the IPv6 header is 20 bytes longer), beside IPv4 in the
//! same run. At the end, a report: each workload's established packet (in
//! batches of 64) and new flow next to the memory floor measured in the
//! same run (a random read from 128 MiB, independent and dependent), and
//! their ratio to one miss's latency: an estimate of the misses per packet
//! that are not overlapped. The pipeline produces flow events, drained
//! every 20 ms by another thread, as the daemon's workers do
//! ([`xvs_benches::drain`]).

#![allow(clippy::unwrap_used)] // benches: a failed unwrap is a broken bench
#![allow(clippy::disallowed_types)] // a benchmark measures wall-clock time

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use smoltcp::wire::EthernetAddress;
use xvs_config::{
    Address, Backend, Family, ForwardMethod, PortRange, Protocol, Scheduler, Service, ServiceKey,
    Timeouts,
};
use xvs_conntrack::{Filter, L4Proto};
use xvs_dataplane::events::FlowEvents;
use xvs_dataplane::pipeline::{lookup_chunks, Pipeline, PipelineConfig, Prepared, Side, Verdict};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::xsk::FrameLayout;

/// A workload: services, and established flows (10 per service) in the
/// table before the measurements.
#[derive(Debug, Clone, Copy)]
struct Load {
    services: u32,
    flows: u32,
}

/// The target workload of the per-packet goals: 100,000 services, 1M
/// flows in random order (the table far beyond the caches).
const BIG: Load = Load {
    services: 100_000,
    flows: 1_000_000,
};
/// A cache-resident one: 10 services, 1,000 flows.
const SMALL: Load = Load {
    services: 10,
    flows: 1_000,
};
use xvs_benches::frames::{arp_reply, tcp64, tcp84, GW_MAC as GW};

/// What the bench needs of an address family: its addresses, its frames,
/// and how the pipeline learns a backend's Ethernet address.
trait Fam {
    type A: xvs_config::Address;
    /// Frame length of a TCP packet with 10 bytes of data.
    const LEN: usize;
    /// The family's table.
    const FAMILY: Family;
    fn vip(n: u32) -> Self::A;
    fn backend(n: u32, k: u32) -> Self::A;
    fn backend_at(a: u32) -> Self::A;
    fn client_of(i: u32) -> (Self::A, u16);
    fn frame(client: Self::A, port: u16, dst: Self::A, flags: u8) -> [u8; 96];
    /// Teaches `p` that backend `a` is at 02:00:00:00:00:03.
    fn learn(p: &mut Pipeline, a: Self::A);
    fn upsert(p: &mut Pipeline, id: u32, s: &Service<Self::A>);
    fn half_len(p: &Pipeline) -> (usize, u32);
    fn find(p: &Pipeline, vip: Self::A) -> bool;
}

struct V4;
struct V6;

impl Fam for V4 {
    type A = Ipv4Addr;
    const LEN: usize = 64;
    const FAMILY: Family = Family::V4;
    fn vip(n: u32) -> Ipv4Addr {
        vip(n)
    }
    fn backend(n: u32, k: u32) -> Ipv4Addr {
        backend(n, k)
    }
    fn backend_at(a: u32) -> Ipv4Addr {
        Ipv4Addr::from(0xc612_0100 + a)
    }
    fn client_of(i: u32) -> (Ipv4Addr, u16) {
        client_of(i)
    }
    fn frame(client: Ipv4Addr, port: u16, dst: Ipv4Addr, flags: u8) -> [u8; 96] {
        let mut f = [0u8; 96];
        f[..64].copy_from_slice(&tcp64(client, port, dst, flags));
        f
    }
    fn learn(p: &mut Pipeline, a: Ipv4Addr) {
        let mut f = arp_reply(a);
        p.process(&mut f, 60, 0);
    }
    fn upsert(p: &mut Pipeline, id: u32, s: &Service<Ipv4Addr>) {
        p.upsert_service(Arc::new(CompiledService::new(id, s, 1, None)));
    }
    fn half_len(p: &Pipeline) -> (usize, u32) {
        (p.v4.services.len(), p.v4.table.len())
    }
    fn find(p: &Pipeline, vip: Ipv4Addr) -> bool {
        p.v4.services.find(vip, L4Proto::Tcp, 80).is_some()
    }
}

fn v6(prefix: [u16; 4], n: u32) -> Ipv6Addr {
    let [a, b, c, d] = prefix;
    Ipv6Addr::new(a, b, c, d, 0, 0, (n >> 16) as u16, n as u16)
}

impl Fam for V6 {
    type A = Ipv6Addr;
    const LEN: usize = 84;
    const FAMILY: Family = Family::V6;
    fn vip(n: u32) -> Ipv6Addr {
        v6([0x2001, 2, 0xff, 0], n + 1)
    }
    fn backend(n: u32, k: u32) -> Ipv6Addr {
        Self::backend_at((n * 3 + k) % 60_000)
    }
    fn backend_at(a: u32) -> Ipv6Addr {
        v6([0x2001, 2, 0, 1], 0x100 + a)
    }
    fn client_of(i: u32) -> (Ipv6Addr, u16) {
        (
            v6([0x2001, 2, 0, 0], 0x8000 + (i >> 14)),
            (i & 0x3fff) as u16 + 1024,
        )
    }
    fn frame(client: Ipv6Addr, port: u16, dst: Ipv6Addr, flags: u8) -> [u8; 96] {
        let mut f = [0u8; 96];
        f[..84].copy_from_slice(&tcp84(client, port, dst, flags));
        f
    }
    fn learn(p: &mut Pipeline, a: Ipv6Addr) {
        let ns = xvs_dataplane::wire::Ndp {
            solicit: true,
            target: a,
            lladdr: None,
        };
        let mut f = [0u8; 128];
        let n = xvs_dataplane::wire::ndp::advertise(
            &mut f,
            &ns,
            snat6(),
            EthernetAddress(GW),
            EthernetAddress([2, 0, 0, 0, 0, 3]),
        )
        .unwrap();
        p.process(&mut f, n, 0);
    }
    fn upsert(p: &mut Pipeline, id: u32, s: &Service<Ipv6Addr>) {
        let c = CompiledService::new(id, s, 1, None);
        p.upsert_service(Arc::new(c));
    }
    fn half_len(p: &Pipeline) -> (usize, u32) {
        (p.v6.services.len(), p.v6.table.len())
    }
    fn find(p: &Pipeline, vip: Ipv6Addr) -> bool {
        p.v6.services.find(vip, L4Proto::Tcp, 80).is_some()
    }
}

fn snat6() -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 2, 0, 0xfe, 0, 0, 0, 1)
}

fn vip(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xc613_0000 + n)
}

fn backend(n: u32, k: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xc612_0100 + (n * 3 + k) % 60_000)
}

fn client_of(i: u32) -> (Ipv4Addr, u16) {
    (
        Ipv4Addr::from(0xc612_8000 + (i >> 14)),
        (i & 0x3fff) as u16 + 1024,
    )
}

/// The state-file variant's state directory.
fn state_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("xvs-bench-pipeline-{}", std::process::id()))
}

fn setup<F: Fam>(in_file: bool, load: Load) -> Pipeline {
    let capacity = load.flows + 200_000;
    // The family under test gets the big table; the other a token one.
    let ipv6 = <F::A as Address>::LEN == 16;
    let (cap4, cap6) = if ipv6 { (64, capacity) } else { (capacity, 64) };
    let table = if in_file {
        let identity = xvs_conntrack::StateIdentity {
            worker: 0,
            workers: 1,
            snat: 0,
        };
        let (dir, plain) = xvs_dataplane::state::prepare_dir(&state_dir()).unwrap();
        println!(
            "state file in {}: {}",
            dir.display(),
            plain.as_deref().unwrap_or("huge pages")
        );
        let path = dir.join("bench.flows");
        let (t, _) =
            xvs_conntrack::FlowTable::open_state(&path, identity, capacity, Timeouts::default(), 0)
                .unwrap();
        // The mapping keeps the bytes; the name can go now.
        std::fs::remove_file(&path).unwrap();
        t
    } else {
        xvs_conntrack::FlowTable::new(cap4, Timeouts::default(), 0)
    };
    let mut p = Pipeline::with_tables(
        PipelineConfig {
            worker: 0,
            mac: EthernetAddress(GW),
            backend_mac: EthernetAddress(GW),
            snat_addrs: vec![Ipv4Addr::new(198, 18, 254, 1)],
            snat_addrs6: vec![snat6()],
            snat_ports: PortRange {
                first: 1024,
                last: 65_535,
            },
            capacity,
            timeouts: Timeouts::default(),
            rules: xvs_config::ConnRules::default(),
            unknown_port: xvs_config::UnknownPort::Drop,
            tunnel: Default::default(),
            backend_mtu: 1500,
        },
        table,
        xvs_conntrack::FlowTable::new(cap6, Timeouts::default(), 0),
    );
    // Flow events produced and drained as the daemon does (every worker
    // produces them; the control plane drains them every 20 ms).
    let (sender, events) = FlowEvents::channel();
    p.set_events(sender);
    xvs_benches::drain::register(&[events]).unwrap();
    for n in 0..load.services {
        let mut s = Service::new(ServiceKey {
            vip: F::vip(n),
            protocol: Protocol::Tcp,
            port: 80,
        });
        s.scheduler = Scheduler::Rr;
        s.backends = (0..3)
            .map(|k| Backend {
                address: F::backend(n, k),
                port: 8080,
                weight: 1,
                forward: ForwardMethod::Masq,
                encap: Default::default(),
            })
            .collect();
        F::upsert(&mut p, n + 1, &s);
        p.own(F::vip(n).ip());
    }
    for a in 0..60_000 {
        F::learn(&mut p, F::backend_at(a));
    }
    // The flows, ESTABLISHED.
    for i in 0..load.flows {
        let (c, port) = F::client_of(i);
        let mut syn = F::frame(c, port, F::vip(i % load.services), 0x02);
        assert!(matches!(
            p.process(&mut syn, F::LEN, 0),
            Verdict::Forward { .. }
        ));
        let mut ack = F::frame(c, port, F::vip(i % load.services), 0x10);
        p.process(&mut ack, F::LEN, 0);
    }
    p
}

/// `XVS_PIPELINE_COUNT=<batches>`: run only the first selected
/// workload's established batch that many times and exit, for counting
/// the instructions per packet, which the machine's noise does not
/// change: `XVS_PIPELINE_COUNT=20000 valgrind --tool=callgrind
/// --toggle-collect='pipeline::Batch::process' <bench> --bench
/// pipeline_10_services_1k_flows` (with `GLIBC_TUNABLES` set as
/// [`xvs_benches::exec_with_huge_page_heap`] sets it, so that valgrind
/// follows no exec). With `XVS_PIPELINE_NEW=1` too, that many batches of
/// 64 new flows instead (all to one service with
/// `XVS_PIPELINE_ONE_SERVICE=1`); with `XVS_PIPELINE_GENERAL=1`, the established
/// batch with the express lane off (the general path).
fn count_only() -> Option<usize> {
    std::env::var("XVS_PIPELINE_COUNT").ok()?.parse().ok()
}

/// The filter given on the command line (`cargo bench --bench pipeline --
/// 10_services`), as criterion reads it: the first argument that is not
/// an option or an option's value. A workload whose name does not
/// contain it is not even set up (a 1M-flow setup takes seconds).
fn filter() -> Option<String> {
    const VALUED: &[&str] = &[
        "--save-baseline",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--measurement-time",
        "--warm-up-time",
        "--sample-size",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--profile-time",
        "--output-format",
        "--plotting-backend",
        "--color",
        "-c",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    args.iter()
        .enumerate()
        .find(|(i, a)| !a.starts_with('-') && (*i == 0 || !VALUED.contains(&args[i - 1].as_str())))
        .map(|(_, a)| a.clone())
}

fn pipeline(c: &mut Criterion) {
    let base = memory_baseline();
    let wanted = filter();
    let mut rows = Vec::new();
    let mut run = |c: &mut Criterion, name: &str, v6: bool, in_file: bool, load: Load| {
        // A filter may name a function too (`group/function`).
        let group = wanted.as_deref().map(|f| f.split('/').next().unwrap_or(f));
        if group.is_some_and(|f| !name.contains(f)) {
            return;
        }
        let row = if v6 {
            measure::<V6>(c, name, setup::<V6>(in_file, load), load)
        } else {
            measure::<V4>(c, name, setup::<V4>(in_file, load), load)
        };
        rows.push((name.to_owned(), row));
    };
    run(c, "pipeline_10_services_1k_flows", false, false, SMALL);
    run(c, "pipeline_100k_services_1M_flows", false, false, BIG);
    run(c, "pipeline_ipv6_100k_services_1M_flows", true, false, BIG);
    run(
        c,
        "pipeline_100k_services_1M_flows_state_file",
        false,
        true,
        BIG,
    );
    remove_state_dir();
    let clock = [base.clock, core_clock()];
    report(&base, clock, &rows);
}

/// Unmounts and removes [`state_dir`] (what `setup` prepared for the
/// state-file workload; nothing if it did not run).
fn remove_state_dir() {
    xvs_dataplane::state::unmount_dir(&state_dir());
    let _ = std::fs::remove_dir_all(state_dir());
}

/// The memory floor, measured in the same run: a random 8-byte read from
/// a 128 MiB buffer, independent reads (they overlap, as a batch's
/// lookups can) and dependent ones (each waits for the last: the latency
/// of one miss). Medians of 5 runs of 2M reads, in ns per read.
struct Baseline {
    independent: f64,
    dependent: f64,
    /// The core's clock at the start of the run ([`core_clock`]).
    clock: f64,
}

/// The clock this core runs at now, in GHz: a chain of dependent adds
/// retires one add a cycle on any x86-64 core, so adds per ns is cycles
/// per ns (median of 5 runs of 100M). A VM's core runs at whatever the
/// host gives it: on the same machine the same build's times differ
/// about 2x between hours, and this says how much of that is the clock.
/// Elsewhere than x86-64, 0 (unknown).
fn core_clock() -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        const ADDS: u64 = 100_000_000;
        let runs: Vec<f64> = (0..5)
            .map(|_| {
                let mut x = 0u64;
                let start = Instant::now();
                for _ in 0..ADDS {
                    // SAFETY: adds 1 to a register the asm is given; it
                    // touches no memory and no flags anyone reads.
                    unsafe { std::arch::asm!("add {0}, 1", inout(reg) x, options(nomem, nostack)) };
                }
                black_box(x);
                ADDS as f64 / start.elapsed().as_nanos() as f64
            })
            .collect();
        median(runs)
    }
    #[cfg(not(target_arch = "x86_64"))]
    0.0
}

/// The median of an odd number of timings (the upper middle of an even
/// one).
fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn memory_baseline() -> Baseline {
    const WORDS: usize = 16 << 20; // 128 MiB of u64
                                   // One cycle through every word in random order (Sattolo's shuffle),
                                   // so a chain of dependent reads never settles in a short, cached
                                   // loop.
    let mut buf: Vec<u64> = (0..WORDS as u64).collect();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for i in (1..WORDS).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.swap(i, (x % i as u64) as usize);
    }
    let reads = 2_000_000u32;
    let time = |dependent: bool| {
        let runs: Vec<f64> = (0..5)
            .map(|r| {
                let (mut i, mut acc) = (u64::from(r as u32) * 7919, 0u64);
                let start = Instant::now();
                for _ in 0..reads {
                    i = if dependent {
                        buf[i as usize]
                    } else {
                        acc = acc.wrapping_add(buf[i as usize]);
                        i.wrapping_add(0x9e37_79b9) % WORDS as u64
                    };
                }
                black_box((i, acc));
                start.elapsed().as_nanos() as f64 / f64::from(reads)
            })
            .collect();
        median(runs)
    };
    Baseline {
        independent: time(false),
        dependent: time(true),
        clock: core_clock(),
    }
}

/// One workload's own timings (medians, ns): an established packet in
/// batches of 64, and a new flow.
struct Row {
    established: f64,
    /// Established, every packet on the general path (the express lane
    /// off), timed alternately with `established` in the same window.
    general: f64,
    /// In batches of 64.
    new_flow: f64,
    /// One at a time.
    new_single: f64,
    /// In batches of 64, every flow to one service (the end-to-end
    /// bench's traffic, a single busy service's: each frame's scheduler
    /// pick and SNAT endpoint follow every frame's before it).
    new_one_service: f64,
}

/// Each workload's time per packet next to the memory floor: the ratio
/// to one miss's latency is an estimate of the misses per packet that
/// are not overlapped.
fn report(base: &Baseline, clock: [f64; 2], rows: &[(String, Row)]) {
    println!(
        "\nmemory floor in this run: {:.1} ns per independent random read (overlapped), {:.1} ns per dependent one (one miss) (128 MiB)",
        base.independent, base.dependent
    );
    // Cycles at the run's mean clock: what the work costs whatever the
    // host gives the core this hour.
    let ghz = (clock[0] + clock[1]) / 2.0;
    println!(
        "core clock in this run: {:.2} GHz at the start, {:.2} GHz at the end (a chain of dependent adds, one a cycle); cycles below at {ghz:.2} GHz",
        clock[0], clock[1]
    );
    println!(
        "{:<44} {:>13} {:>7} {:>7} {:>7} {:>13} {:>7} {:>13} {:>7} {:>7} {:>7} {:>13} {:>13}",
        "workload",
        "established",
        "cycles",
        "÷ read",
        "÷ miss",
        "general path",
        "÷ it",
        "new flow",
        "cycles",
        "÷ read",
        "÷ miss",
        "new, single",
        "new, 1 svc"
    );
    for (name, r) in rows {
        println!(
            "{:<44} {:>10.1} ns {:>7.0} {:>7.2} {:>7.2} {:>10.1} ns {:>7.2} {:>10.0} ns {:>7.0} {:>7.2} {:>7.2} {:>10.0} ns {:>10.0} ns",
            name,
            r.established,
            r.established * ghz,
            r.established / base.independent,
            r.established / base.dependent,
            r.general,
            r.established / r.general,
            r.new_flow,
            r.new_flow * ghz,
            r.new_flow / base.independent,
            r.new_flow / base.dependent,
            r.new_single,
            r.new_one_service,
        );
    }
    println!(
        "(established and new flow in batches of 64, the worker's way; cycles: the time at the run's clock; ÷ read: overlapped reads' worth, ÷ miss: dependent misses' worth;\n general path: established with the express lane off, timed alternately with it; ÷ it: the lane's time over the general path's;\n new, 1 svc: new flows in batches of 64, all to one service)"
    );
}

fn measure<F: Fam>(c: &mut Criterion, group: &str, mut p: Pipeline, load: Load) -> Row {
    let (services, flows) = F::half_len(&p);
    println!("{group}: {services} services, {flows} flows");
    let len = F::LEN;
    // Established flows in random order (a multiplicative permutation).
    let acks: Vec<[u8; 96]> = (0..load.flows)
        .map(|k| {
            let i = ((u64::from(k) * 2_654_435_761) % u64::from(load.flows)) as u32;
            let (c, port) = F::client_of(i);
            F::frame(c, port, F::vip(i % load.services), 0x10)
        })
        .collect();
    if let Some(batches) = count_only() {
        let mut batch = Batch::new();
        if std::env::var_os("XVS_PIPELINE_NEW").is_some() {
            // New flows instead: `batches` batches of 64 SYNs (all to
            // one service with XVS_PIPELINE_ONE_SERVICE set).
            let one = std::env::var_os("XVS_PIPELINE_ONE_SERVICE").is_some();
            let mut next = load.flows;
            let spent: Duration = (0..batches)
                .map(|_| new_flows::<F>(&mut p, load, &mut next, 64, Some(&mut batch), one))
                .sum();
            let per = spent.as_nanos() as f64 / (batches * 64) as f64;
            println!(
                "{group}: {} new flows in batches of 64, {per:.1} ns each",
                batches * 64
            );
            drop(p);
            remove_state_dir();
            std::process::exit(0);
        }
        // For an instruction count (callgrind): the established batch
        // alone, `batches` times, then nothing else (on the general path
        // with XVS_PIPELINE_GENERAL set).
        p.set_express(std::env::var_os("XVS_PIPELINE_GENERAL").is_none());
        let mut k = 0usize;
        let spent: Duration = (0..batches)
            .map(|_| batch.run(&mut p, &acks, &mut k, len))
            .sum();
        let packets = batches * 64;
        let per = spent.as_nanos() as f64 / packets as f64;
        println!("{group}: {packets} established packets in batches of 64, {per:.1} ns each");
        drop(p);
        remove_state_dir();
        std::process::exit(0);
    }
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    let mut k = 0usize;
    let mut buf = [0u8; 2048];
    g.bench_function("established_packet", |b| {
        b.iter(|| {
            k = (k + 1) % acks.len();
            buf[..len].copy_from_slice(&acks[k][..len]);
            let v = p.process(&mut buf, len, 1);
            debug_assert!(matches!(v, Verdict::Forward { .. }));
            black_box(v)
        })
    });

    // The worker's way: a batch of 64 classified, looked up together, then
    // processed.
    g.throughput(Throughput::Elements(64));
    let mut batch = Batch::new();
    g.bench_function("established_batch64", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| batch.run(&mut p, &acks, &mut k, len))
                .sum()
        })
    });
    g.throughput(Throughput::Elements(1));

    let mut next = load.flows;
    for batched in [false, true] {
        let name = if batched {
            "new_flow_syn_batch64"
        } else {
            "new_flow_syn"
        };
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(20_000) as u32;
                    let batch = batched.then_some(&mut batch);
                    spent += new_flows::<F>(&mut p, load, &mut next, n, batch, false);
                    left -= u64::from(n);
                }
                spent
            })
        });
    }

    let mut n = 0u32;
    g.bench_function("service_lookup", |b| {
        b.iter(|| {
            n = (n + 7919) % load.services;
            black_box(F::find(&p, black_box(F::vip(n))))
        })
    });
    g.finish();
    // The same two, timed here for the report beside the memory floor
    // (medians of 5 runs).
    // Established with the express lane on and off, alternately, so
    // the two meet the same noise.
    let mut lanes = [Vec::new(), Vec::new()];
    for _ in 0..5 {
        for (on, times) in [true, false].into_iter().zip(&mut lanes) {
            p.set_express(on);
            let spent: Duration = (0..2_000)
                .map(|_| batch.run(&mut p, &acks, &mut k, len))
                .sum();
            times.push(spent.as_nanos() as f64 / (2_000.0 * 64.0));
        }
    }
    p.set_express(true);
    let [established, general] = lanes.map(median);
    let mut new_flow = |mut batch: Option<&mut Batch>, one_service: bool| {
        median(
            (0..5)
                .map(|_| {
                    let b = batch.as_deref_mut();
                    let spent = new_flows::<F>(&mut p, load, &mut next, 5_000, b, one_service);
                    spent.as_nanos() as f64 / 5_000.0
                })
                .collect(),
        )
    };
    let new_single = new_flow(None, false);
    let new_one_service = new_flow(Some(&mut batch), true);
    let new_flow = new_flow(Some(&mut batch), false);
    Row {
        established,
        general,
        new_flow,
        new_single,
        new_one_service,
    }
}

/// A batch of 64 established packets, the worker's way: classified,
/// looked up together, then processed. The frames are copied into the
/// batch's frames before the clock starts (in the worker they arrive
/// there, and the copy is the bench's own work), which sit as received
/// packets sit in a port's UMEM ([`FrameLayout::of_ports`]): a frame's
/// stride apart, each packet at the same offset of its frame, so that
/// their headers share L1 sets as the worker's do.
struct Batch {
    frames: Frames,
    preps: Vec<Prepared>,
    looked: Vec<xvs_dataplane::pipeline::Lookup>,
}

/// 64 frames laid out as a port's UMEM lays out received packets: one
/// aligned [`Chunk`] per frame, the packet at [`Chunk::OFFSET`].
struct Frames {
    chunks: Vec<Chunk>,
}

/// One UMEM frame. The layout is constant here (the bench's loops then
/// cost what they cost over plain buffers) and held equal to the ports'
/// ([`FrameLayout::of_ports`]) when the bench starts.
#[repr(C, align(4096))]
#[derive(Clone)]
struct Chunk([u8; Chunk::STRIDE]);

impl Chunk {
    const STRIDE: usize = 4096;
    const OFFSET: usize = 256;
}

impl Frames {
    const COUNT: usize = 64;

    fn new() -> Frames {
        assert_eq!(
            FrameLayout::of_ports(),
            FrameLayout {
                stride: Chunk::STRIDE,
                offset: Chunk::OFFSET
            },
            "the bench lays its frames out as the ports do"
        );
        Frames {
            chunks: vec![Chunk([0; Chunk::STRIDE]); Self::COUNT],
        }
    }

    /// Every frame's packet bytes, from the packet's first byte to the
    /// frame's end (what the worker's frame access gives), in order.
    fn packets(&mut self) -> impl Iterator<Item = &mut [u8]> {
        self.chunks.iter_mut().map(|c| &mut c.0[Chunk::OFFSET..])
    }
}

impl Batch {
    fn new() -> Batch {
        Batch {
            frames: Frames::new(),
            preps: vec![Prepared::EMPTY; Frames::COUNT],
            looked: vec![xvs_dataplane::pipeline::Lookup::NotYet; Frames::COUNT],
        }
    }

    /// The next 64 of `acks` from `k` on: the time their processing took.
    fn run(&mut self, p: &mut Pipeline, acks: &[[u8; 96]], k: &mut usize, len: usize) -> Duration {
        for packet in self.frames.packets() {
            *k = (*k + 1) % acks.len();
            packet[..len].copy_from_slice(&acks[*k][..len]);
        }
        self.process(p, Frames::COUNT, len, 1)
    }

    /// `frames` (at most 64) as one batch: the time it took.
    fn run_frames(
        &mut self,
        p: &mut Pipeline,
        frames: &[[u8; 96]],
        len: usize,
        now: u32,
    ) -> Duration {
        for (packet, f) in self.frames.packets().zip(frames) {
            packet[..len].copy_from_slice(&f[..len]);
        }
        self.process(p, frames.len(), len, now)
    }

    /// Classifies, looks up and processes the first `n` frames.
    fn process(&mut self, p: &mut Pipeline, n: usize, len: usize, now: u32) -> Duration {
        let start = Instant::now();
        for (prep, packet) in self.preps.iter_mut().zip(self.frames.packets().take(n)) {
            prep.classify(&packet[..len]);
        }
        // A chunk at a time, as the worker does.
        let mut packets = self.frames.packets();
        for chunk in lookup_chunks(n) {
            let (preps, looked) = (&self.preps[chunk.clone()], &mut self.looked[chunk]);
            p.lookup_prepared(preps, looked);
            // The chunk's classifications lead the zip, so it takes no
            // packet past the chunk's end.
            for (j, (prep, packet)) in preps.iter().zip(packets.by_ref()).enumerate() {
                p.prefetch_ahead(preps, looked, j);
                black_box(p.process_prepared(Side::Client, packet, now, prep, looked[j]));
            }
        }
        start.elapsed()
    }
}

/// `n` new flows (SYNs to random services, or all to the first with
/// `one_service`) from `next` on, one at a time
/// or, with `batch`, in batches of 64 the worker's way: the time they
/// took; they are taken out again (not timed), each by its whole tuple
/// (a lookup: a walk of the table would leave the caches cold for the
/// next ones, which a gateway's flows, ending by their timers, do not),
/// after every `load.flows` of them (at most 20,000), so the table holds
/// at most twice its workload's flows: a cache-resident workload's stays
/// cache-resident.
fn new_flows<F: Fam>(
    p: &mut Pipeline,
    load: Load,
    next: &mut u32,
    n: u32,
    mut batch: Option<&mut Batch>,
    one_service: bool,
) -> Duration {
    let chunk = load.flows.clamp(64, 20_000);
    let mut spent = Duration::ZERO;
    let mut left = n;
    while left > 0 {
        let m = left.min(chunk);
        spent += new_flows_once::<F>(p, load, next, m, batch.as_deref_mut(), one_service);
        left -= m;
    }
    spent
}

/// [`new_flows`] for one chunk of `n`.
fn new_flows_once<F: Fam>(
    p: &mut Pipeline,
    load: Load,
    next: &mut u32,
    n: u32,
    batch: Option<&mut Batch>,
    one_service: bool,
) -> Duration {
    let len = F::LEN;
    let tuples: Vec<(F::A, u16, F::A)> = (0..n)
        .map(|j| {
            let i = *next + j;
            let (c, port) = F::client_of(i);
            let s = if one_service {
                0
            } else {
                ((u64::from(i) * 2_654_435_761) % u64::from(load.services)) as u32
            };
            (c, port, F::vip(s))
        })
        .collect();
    let frames: Vec<[u8; 96]> = tuples
        .iter()
        .map(|&(c, port, vip)| F::frame(c, port, vip, 0x02))
        .collect();
    let before = p.flows();
    let mut buf = [0u8; 2048];
    let spent = match batch {
        None => {
            let start = Instant::now();
            for f in &frames {
                buf[..len].copy_from_slice(&f[..len]);
                black_box(p.process(&mut buf, len, 2));
            }
            start.elapsed()
        }
        Some(batch) => frames
            .chunks(64)
            .map(|chunk| batch.run_frames(p, chunk, len, 2))
            .sum(),
    };
    for &(client, port, vip) in &tuples {
        let whole = Filter::<IpAddr> {
            client: Some(client.ip()),
            client_port: Some(port),
            vip: Some(vip.ip()),
            vip_port: Some(80),
            proto: Some(L4Proto::Tcp),
            state: Some(xvs_conntrack::FlowState::SynRecv),
            ..Filter::default()
        };
        p.delete_matching(&whole, F::FAMILY, 0, 1);
    }
    assert_eq!(p.flows(), before, "new flows left in the table");
    *next = load.flows + (*next - load.flows + n) % (1 << 22);
    spent
}

criterion_group!(benches, pipeline);

/// criterion_main!'s, under the daemon's heap (see
/// `xvs_benches::exec_with_huge_page_heap`).
fn main() {
    xvs_benches::exec_with_huge_page_heap();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
