//! xvs itself on the real AF_XDP path in network namespaces: real TCP
//! connections through a VIP to real backends, full NAT, and the counters
//! and frames accounted for when it stops.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // the in-process data plane needs a real clock

use std::path::PathBuf;
use std::time::Duration;

use xvs_vm_tests::daemon::{self, Daemon};
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, one_arm_head, Arms, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");

/// The `xvs` binary, built beside this test's binaries.
fn xvs_bin() -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_BIN_EXE_xvs-testnet"));
    p.set_file_name("xvs");
    assert!(
        p.exists(),
        "{} missing: build the workspace (cargo build) first",
        p.display()
    );
    p
}

fn config(t: &Topology, scheduler: &str) -> String {
    config_queues(t, scheduler, 1)
}

fn config_queues(t: &Topology, scheduler: &str, queues: usize) -> String {
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    format!(
        r#"{head}
[[services]]
vip = "198.19.0.1"
port = 80
scheduler = "{scheduler}"
backends = [{b}]

[[services]]
vip = "198.19.0.1"
protocol = "udp"
port = 53
scheduler = "{scheduler}"
backends = [{b}]
"#,
        head = one_arm_head(t, queues),
        b = backends.join(", "),
    )
}

fn servers(t: &Topology) -> Vec<Spawned> {
    t.echo_servers(TESTNET, "b", 8080, Some(8080)).unwrap()
}

/// `key=value` of a summary line.
fn field(line: &str, key: &str) -> u64 {
    daemon::field(line, key).unwrap_or_else(|| panic!("{key} not in {line}"))
}

/// Starts `xvs run` on `config` in the gateway namespace (its own folder
/// and admin socket); returns the daemon and its ready line.
fn launch(t: &Topology, config: &str) -> (Daemon, String) {
    let bins = xvs_bin().parent().unwrap().to_owned();
    Daemon::start(t, "e2e", &bins, config, &[]).unwrap()
}

/// Checks every worker line xvs printed at stop: the counters add up and
/// every frame is accounted for; returns the lines.
fn worker_lines(printed: &str) -> Vec<String> {
    let lines: Vec<String> = printed
        .lines()
        .filter(|l| l.starts_with("worker "))
        .map(str::to_owned)
        .collect();
    assert!(!lines.is_empty(), "{printed}");
    for line in &lines {
        let rx = field(line, "rx");
        let sum = field(line, "forwarded")
            + field(line, "answered")
            + field(line, "consumed")
            + field(line, "dropped");
        assert_eq!(rx, sum, "{line}");
        assert!(line.contains("frames_accounted=true"), "{line}");
    }
    lines
}

/// xvs running in the gateway of a one-arm topology with three backends.
struct Running {
    t: Topology,
    _servers: Vec<Spawned>,
    xvs: Daemon,
}

fn start(scheduler: &str) -> Running {
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let servers = servers(&t);
    let (xvs, ready) = launch(&t, &config(&t, scheduler));
    assert!(ready.starts_with("ready: 2 services on g0"), "{ready}");
    Running {
        t,
        _servers: servers,
        xvs,
    }
}

impl Running {
    /// Runs the test client; if it fails, the panic carries what xvs's
    /// counters and drops said at that moment (a stall, a drop reason,
    /// frames lost) beside the client's own error, and what the kernels
    /// on the way said (frames that never reached xvs).
    fn client(&self, args: &[&str]) -> String {
        let out = self.t.client.ns.exec(TESTNET, args).unwrap_or_else(|e| {
            panic!(
                "{e}\nxvs's non-zero counters then:\n{}\n{}\n{}",
                self.xvs.nonzero_metrics(&[]),
                self.xvs.get("/v1/status"),
                self.t.kernel_view()
            )
        });
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Stops xvs; checks its exit, counters and frames, and that the
    /// program left the link; returns its worker line.
    fn stop(self) -> String {
        let (status, printed) = self.xvs.stop();
        assert!(
            status.is_some_and(|s| s.success()),
            "xvs exit {status:?}: {printed}"
        );
        let line = worker_lines(&printed).remove(0);
        // The hold window ends without a successor: the guard detaches.
        assert!(
            daemon::detached(&self.t.gateway, "g0"),
            "program left on g0"
        );
        line
    }
}

/// Per-backend counts of a load summary (`... by=b0:N,b1:M,...`).
fn by_backend(summary: &str) -> Vec<u32> {
    summary
        .rsplit("by=")
        .next()
        .unwrap()
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split(':').nth(1).unwrap().parse().unwrap())
        .collect()
}

fn thousand_connections(scheduler: &str) -> (Vec<u32>, String) {
    let r = start(scheduler);
    let summary = r.client(&[
        "tcp",
        "--connect",
        "198.19.0.1:80",
        "--connections",
        "1000",
        "--concurrency",
        "32",
    ]);
    assert!(
        summary.starts_with("ok=1000 failed=0 by="),
        "{scheduler}: {summary}"
    );
    let line = r.stop();
    assert_eq!(field(&line, "new_flows"), 1000, "{line}");
    (by_backend(&summary), line)
}

#[test]
fn a_thousand_tcp_connections_through_a_vip_rr() {
    if !privileged("a_thousand_tcp_connections_through_a_vip_rr") {
        return;
    }
    let (counts, _) = thousand_connections("rr");
    // rr with one worker: the counts differ by at most one.
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{counts:?}"
    );
}

#[test]
fn a_thousand_tcp_connections_through_a_vip_wlc_and_mh() {
    if !privileged("a_thousand_tcp_connections_through_a_vip_wlc_and_mh") {
        return;
    }
    for scheduler in ["wlc", "mh"] {
        let (counts, _) = thousand_connections(scheduler);
        assert_eq!(counts.iter().sum::<u32>(), 1000);
        // wlc spreads the connections; mh hashes the client address, and
        // there is one client, so one backend takes them all.
        match scheduler {
            "wlc" => assert_eq!(counts.len(), 3, "{counts:?}"),
            _ => assert_eq!(counts, [1000], "{counts:?}"),
        }
    }
}

#[test]
fn udp_arp_and_ping_for_the_vip_and_the_gateway_stays_reachable() {
    if !privileged("udp_arp_and_ping_for_the_vip_and_the_gateway_stays_reachable") {
        return;
    }
    let r = start("rr");
    let summary = r.client(&["udp", "--connect", "198.19.0.1:53", "--requests", "90"]);
    assert_eq!(by_backend(&summary).iter().sum::<u32>(), 90, "{summary}");
    assert!(summary.starts_with("ok=90 failed=0"), "{summary}");
    // xvs answers ARP and ping for the VIP ...
    r.t.client
        .ns
        .exec("arping", &["-c", "2", "-w", "3", "-I", "c0", "198.19.0.1"])
        .unwrap();
    r.t.client
        .ns
        .exec("ping", &["-c", "3", "-i", "0.2", "-W", "2", "198.19.0.1"])
        .unwrap();
    // ... while the kernel keeps the gateway's own address: ping and TCP.
    r.t.client
        .ns
        .exec("ping", &["-c", "3", "-i", "0.2", "-W", "2", "198.18.0.1"])
        .unwrap();
    let mut gw_server = r.t.gateway.command(TESTNET);
    gw_server.args(["serve", "--name", "gw", "--tcp", "198.18.0.1:2222"]);
    let (_gw, _) = Spawned::start(gw_server, "gateway server", Duration::from_secs(5)).unwrap();
    let summary = r.client(&["tcp", "--connect", "198.18.0.1:2222", "--connections", "20"]);
    assert_eq!(summary, "ok=20 failed=0 by=gw:20");
    let line = r.stop();
    assert!(
        field(&line, "answered") >= 5,
        "ARP and echo answered: {line}"
    );
}

/// A data plane run in-process inside the gateway namespace (its own
/// thread, which stays there), driven by jobs sent to that thread.
type Job = Box<dyn FnOnce(&mut xvs_dataplane::runtime::Dataplane) + Send>;

struct InProcess {
    jobs: std::sync::mpsc::Sender<Job>,
    thread: Option<std::thread::JoinHandle<Vec<xvs_dataplane::worker::Snapshot>>>,
}

impl InProcess {
    fn start(t: &Topology, cfg_text: String) -> InProcess {
        let gw = t.gateway.name().to_owned();
        let (jobs, rx) = std::sync::mpsc::channel::<
            Box<dyn FnOnce(&mut xvs_dataplane::runtime::Dataplane) + Send>,
        >();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            xvs_vm_tests::netns::Netns::existing(&gw)
                .enter_current_thread()
                .unwrap();
            // No guard runs in-process: restart survival off (a stop
            // detaches, as the assertions on `ip link` expect).
            let cfg_text = format!(
                "{cfg_text}\n[restart]\nhold = \"0s\"\nstate_dir = \"{}\"\n",
                std::env::temp_dir()
                    .join(format!("xvs-inproc-{gw}"))
                    .display()
            );
            let cfg = xvs_config::parse_str("test.toml", &cfg_text).unwrap();
            let start = std::time::Instant::now();
            let mut dp = xvs_dataplane::runtime::Dataplane::start(&cfg, move || {
                start.elapsed().as_secs() as u32
            })
            .unwrap();
            ready_tx.send(()).unwrap();
            for job in rx {
                job(&mut dp);
            }
            dp.stop()
        });
        ready_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        InProcess {
            jobs,
            thread: Some(thread),
        }
    }

    fn run(&self, job: impl FnOnce(&mut xvs_dataplane::runtime::Dataplane) + Send + 'static) {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        self.jobs
            .send(Box::new(move |dp| {
                job(dp);
                // Control messages are applied between batches: wait until
                // every worker has them.
                done_tx
                    .send(dp.handle().wait_applied(Duration::from_secs(5)))
                    .unwrap();
            }))
            .unwrap();
        let applied = done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(applied, "every worker applied the update within 5 s");
    }

    fn stop(mut self) -> Vec<xvs_dataplane::worker::Snapshot> {
        let (tx, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.jobs, tx));
        self.thread.take().unwrap().join().unwrap()
    }
}

fn service(port: u16, weights: &[(usize, u32)]) -> xvs_config::Service {
    let mut s = xvs_config::Service::new(xvs_config::ServiceKey {
        vip: std::net::Ipv4Addr::new(198, 19, 0, 1),
        protocol: xvs_config::Protocol::Tcp,
        port,
    });
    s.scheduler = xvs_config::Scheduler::Rr;
    s.backends = weights
        .iter()
        .map(|&(i, weight)| xvs_config::Backend {
            address: backend_addr(i),
            port: 8080,
            weight,
            forward: xvs_config::ForwardMethod::Masq,
            encap: xvs_config::Encap::Ipip,
        })
        .collect();
    s.into()
}

#[test]
fn weight_zero_and_live_changes_never_disturb_established_connections() {
    if !privileged("weight_zero_and_live_changes_never_disturb_established_connections") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _servers = servers(&t);
    let dp = InProcess::start(&t, config(&t, "rr"));

    // A long-lived connection; it tells which backend it reached.
    let mut hold = t.client.ns.command(TESTNET);
    hold.args(["hold", "--connect", "198.19.0.1:80", "--seconds", "4"]);
    let (hold, first) =
        Spawned::start(hold, "long-lived connection", Duration::from_secs(5)).unwrap();
    let held: usize = first.strip_prefix("connected b").unwrap().parse().unwrap();

    // Quiesce the held backend: new connections avoid it, the held one goes on.
    let weights: Vec<(usize, u32)> = (0..3).map(|i| (i, u32::from(i != held))).collect();
    let svc = service(80, &weights);
    dp.run(move |dp| dp.upsert_service(&svc).unwrap());
    let load = |n: usize| t.tcp_load(TESTNET, "198.19.0.1:80", n, 5000);
    let summary = load(200);
    assert!(summary.starts_with("ok=200 failed=0"), "{summary}");
    assert!(
        !summary.contains(&format!("b{held}:")),
        "weight 0 took new flows: {summary}"
    );

    // Remove another backend, add a service on another port, remove it.
    let other = (held + 1) % 3;
    let svc = service(80, &[(held, 0), ((held + 2) % 3, 1)]);
    dp.run(move |dp| dp.upsert_service(&svc).unwrap());
    let summary = load(50);
    assert_eq!(
        summary,
        format!("ok=50 failed=0 by=b{}:50", (held + 2) % 3),
        "backend b{other} removed"
    );
    let extra = service(81, &[(0, 1), (1, 1), (2, 1)]);
    dp.run(move |dp| dp.upsert_service(&extra).unwrap());
    let on81 = t.tcp_load(TESTNET, "198.19.0.1:81", 30, 5000);
    assert!(on81.starts_with("ok=30 failed=0"), "{on81}");
    dp.run(|dp| dp.remove_service(service(81, &[]).key).unwrap());
    let refused = t.client.ns.exec(
        TESTNET,
        &[
            "tcp",
            "--connect",
            "198.19.0.1:81",
            "--connections",
            "1",
            "--timeout-ms",
            "500",
        ],
    );
    assert!(refused.is_err(), "a removed service takes no new flow");

    // The held connection saw none of it.
    let (status, printed) = hold.stop(0, Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{printed}");
    assert!(printed.trim().starts_with("ok rounds="), "{printed}");

    // Counters are readable live, without a round trip; dump and flush
    // work in chunks on the running workers.
    let (tx, rx) = std::sync::mpsc::channel();
    dp.run(move |dp| {
        let h = dp.handle();
        let live = h.counters();
        let backend = xvs_conntrack::Filter {
            backend: Some(backend_addr((held + 2) % 3).into()),
            ..Default::default()
        };
        let to_backend = h.dump(backend, None).len();
        let all = h.dump(xvs_conntrack::Filter::default(), None).len();
        let flushed = h.flush();
        let after = h.dump(xvs_conntrack::Filter::default(), None).len();
        tx.send((live, to_backend, all, flushed, after)).unwrap();
    });
    let (live, to_backend, all, flushed, after) = rx.recv().unwrap();
    let c = &live[0].pipeline;
    assert_eq!(
        c.rx,
        c.forwarded + c.answered + c.consumed + c.dropped(),
        "{c:?}"
    );
    assert!(c.new_flows >= 281, "{c:?}");
    // The established segments of real TCP connections take the express
    // lane (in the worker's own batches), the rest the general path.
    assert!(c.express > 0 && c.express < c.forwarded, "{c:?}");
    assert!(
        to_backend >= 50 && to_backend <= all,
        "{to_backend} of {all}"
    );
    assert_eq!((flushed as usize, after), (all, 0));

    let snaps = dp.stop();
    let c = &snaps[0].counters;
    assert_eq!(c.rx, c.forwarded + c.answered + c.consumed + c.dropped());
    assert!(snaps[0].frames_accounted);
    assert!(c.drops[xvs_dataplane::wire::DropReason::NoService.index()] >= 1);
}

#[test]
fn two_queues_two_workers_hand_replies_to_their_owner() {
    if !privileged("two_queues_two_workers_hand_replies_to_their_owner") {
        return;
    }
    let t = Topology::build(Spec {
        arms: Arms::One,
        backends: 3,
        queues: 2,
    })
    .unwrap();
    let _servers = servers(&t);
    let (xvs, ready) = launch(&t, &config_queues(&t, "rr", 2));
    assert!(ready.contains("2 worker(s)"), "{ready}");
    let out = t.client.ns.exec(
        TESTNET,
        &[
            "tcp",
            "--connect",
            "198.19.0.1:80",
            "--connections",
            "1000",
            "--concurrency",
            "32",
        ],
    );
    let (status, printed) = xvs.stop();
    let out = out.unwrap_or_else(|e| panic!("{e}\nxvs:\n{printed}"));
    let summary = String::from_utf8(out.stdout).unwrap();
    assert!(summary.starts_with("ok=1000 failed=0"), "{summary}");
    assert!(status.is_some_and(|s| s.success()), "{printed}");
    eprintln!("{printed}");
    let lines = worker_lines(&printed);
    assert_eq!(lines.len(), 2, "{printed}");
    let (mut off, mut inn, mut new_flows) = (0, 0, 0);
    for line in &lines {
        assert_eq!(field(line, "handoff_full"), 0, "{line}");
        off += field(line, "handed_off");
        inn += field(line, "handed_in") + field(line, "handoff_left");
        new_flows += field(line, "new_flows");
    }
    assert_eq!(
        off, inn,
        "every frame handed off was processed by its owner or counted as left at stop"
    );
    assert!(
        off > 0,
        "replies landed on the other queue and were handed over"
    );
    // A SYN the client retransmits may leave on another queue (Linux
    // rehashes a socket's TX queue on timeout) and open a second flow on
    // the other worker; every connection still completes.
    assert!(new_flows >= 1000, "{new_flows}");
}

/// Millions of packets through the data plane (bulk streams both ways):
/// every UMEM frame is still accounted for and the counters add up.
#[test]
fn millions_of_packets_leave_every_frame_accounted() {
    if !privileged("millions_of_packets_leave_every_frame_accounted") {
        return;
    }
    let r = start("rr");
    // 3 streams x 512 MiB echoed: about 370k data segments each way
    // per stream plus their ACKs.
    let summary = r.client(&[
        "tcp",
        "--connect",
        "198.19.0.1:80",
        "--connections",
        "3",
        "--concurrency",
        "3",
        "--payload",
        "536870912",
        "--timeout-ms",
        "60000",
    ]);
    assert!(summary.starts_with("ok=3 failed=0"), "{summary}");
    let line = r.stop();
    eprintln!("{line}");
    assert!(field(&line, "rx") >= 2_000_000, "{line}");
}

/// Two-arm: clients on one interface, backends on another; each worker's
/// two sockets share one UMEM, so a frame received on one interface is
/// sent on the other without a copy.
#[test]
fn two_arm_full_nat_between_two_interfaces() {
    if !privileged("two_arm_full_nat_between_two_interfaces") {
        return;
    }
    let t = Topology::build(Spec {
        arms: Arms::Two,
        backends: 3,
        queues: 1,
    })
    .unwrap();
    let _servers = servers(&t);
    let text = config(&t, "rr").replace(
        "mode = \"one-arm\"\nclient = \"gc\"",
        "mode = \"two-arm\"\nclient = \"gc\"\nbackend = \"gb\"",
    );
    assert!(text.contains("two-arm"), "{text}");
    let (xvs, ready) = launch(&t, &text);
    assert!(
        ready.starts_with("ready: 2 services on gc (clients) and gb (backends)"),
        "{ready}"
    );
    let out = t.client.ns.exec(
        TESTNET,
        &[
            "tcp",
            "--connect",
            "198.19.0.1:80",
            "--connections",
            "1000",
            "--concurrency",
            "32",
        ],
    );
    let udp = t.client.ns.exec(
        TESTNET,
        &["udp", "--connect", "198.19.0.1:53", "--requests", "30"],
    );
    let (status, printed) = xvs.stop();
    let out = out.unwrap_or_else(|e| panic!("{e}\nxvs:\n{printed}"));
    let summary = String::from_utf8(out.stdout).unwrap();
    assert!(summary.starts_with("ok=1000 failed=0"), "{summary}");
    let counts = by_backend(summary.trim());
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{summary}"
    );
    let udp = udp.unwrap_or_else(|e| panic!("{e}"));
    assert!(String::from_utf8_lossy(&udp.stdout).starts_with("ok=30 failed=0"));
    assert!(status.is_some_and(|s| s.success()), "{printed}");
    worker_lines(&printed);
    for ifname in ["gc", "gb"] {
        assert!(
            daemon::detached(&t.gateway, ifname),
            "program left on {ifname}"
        );
    }
}

/// `steering = "all"`: the steering program hands every packet to xvs
/// (the gateway's own traffic included, which xvs drops, counted); it is
/// gone at the end of the hold window after the stop.
#[test]
fn steering_all_hands_every_packet_to_xvs() {
    if !privileged("steering_all_hands_every_packet_to_xvs") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _servers = servers(&t);
    // The client's next hop is the kernel's address, which xvs does not
    // answer ARP for in this mode: pin it.
    let link = t.gateway.ip(&["link", "show", "g0"]).unwrap().stdout;
    let link = String::from_utf8_lossy(&link);
    let mac = link
        .split("link/ether ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    t.client
        .ns
        .ip(&[
            "neigh",
            "replace",
            "198.18.0.1",
            "lladdr",
            &mac,
            "nud",
            "permanent",
            "dev",
            "c0",
        ])
        .unwrap();
    let text = config(&t, "rr").replace(
        "poll = \"adaptive\"",
        "poll = \"adaptive\"\nsteering = \"all\"",
    );
    let (xvs, _) = launch(&t, &text);
    let attached = t.gateway.ip(&["-d", "link", "show", "g0"]).unwrap().stdout;
    assert!(
        String::from_utf8_lossy(&attached).contains("xdp"),
        "no program while running"
    );
    let out = t.client.ns.exec(
        TESTNET,
        &["tcp", "--connect", "198.19.0.1:80", "--connections", "200"],
    );
    // The gateway's own address now reaches xvs, which drops it, counted.
    let ping = t
        .client
        .ns
        .exec("ping", &["-c", "1", "-W", "1", "198.18.0.1"]);
    let (status, printed) = xvs.stop();
    let out = out.unwrap_or_else(|e| panic!("{e}\nxvs:\n{printed}"));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok=200 failed=0"));
    assert!(
        ping.is_err(),
        "ping to the gateway went to the kernel in steering=all"
    );
    assert!(status.is_some_and(|s| s.success()), "{printed}");
    let line = worker_lines(&printed).remove(0);
    assert!(line.contains("not_owned="), "{line}");
    assert!(daemon::detached(&t.gateway, "g0"), "program left on g0");
}

/// The gateway's interface goes down and up again (`ip link set g0
/// down; ... up`, an operator's or a switch port's flap) while a
/// connection is held through the VIP: the AF_XDP socket and the
/// steering program stay bound across it, the held connection goes on
/// once the link is back (its segments retransmitted over the gap), new
/// connections work (the echo client's, and curl's to nginx behind a
/// service added with xvsadm -A/-a), and every frame is accounted for.
#[test]
fn a_link_flap_loses_neither_the_socket_nor_a_held_connection() {
    if !privileged("a_link_flap_loses_neither_the_socket_nor_a_held_connection") {
        return;
    }
    let r = start("rr");
    let t = &r.t;
    // nginx behind port 81, added as an operator would (ipvsadm's -A, -a).
    let _nginx = t.nginx_on_backends(false, 8081).unwrap();
    r.xvs.adm_ok(&["-A", "-t", "198.19.0.1:81", "-s", "rr"]);
    for i in 0..t.backends.len() {
        let real = format!("{}:8081", backend_addr(i));
        r.xvs
            .adm_ok(&["-a", "-t", "198.19.0.1:81", "-r", &real, "-m"]);
    }
    let curls = |n: usize| -> Vec<String> {
        (0..n)
            .map(|_| {
                let out = t
                    .client
                    .ns
                    .exec("curl", &["-sS", "-m", "2", "http://198.19.0.1:81/"]);
                let out = out.unwrap_or_else(|e| panic!("curl: {e:?}"));
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            })
            .collect()
    };
    assert_eq!(curls(3), ["b0", "b1", "b2"]);
    let before = t.tcp_load(TESTNET, "198.19.0.1:80", 30, 5000);
    assert!(before.starts_with("ok=30 failed=0"), "{before}");
    let mut hold = t.client.ns.command(TESTNET);
    hold.args(["hold", "--connect", "198.19.0.1:80", "--seconds", "6"]);
    let (hold, first) =
        Spawned::start(hold, "long-lived connection", Duration::from_secs(5)).unwrap();
    assert!(first.starts_with("connected b"), "{first}");

    t.gateway.ip(&["link", "set", "g0", "down"]).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    t.gateway.ip(&["link", "set", "g0", "up"]).unwrap();

    let after = t.tcp_load(TESTNET, "198.19.0.1:80", 30, 5000);
    assert!(
        after.starts_with("ok=30 failed=0"),
        "after the flap: {after}"
    );
    assert_eq!(curls(3), ["b0", "b1", "b2"], "curl to nginx after the flap");
    let (status, printed) = hold.wait(Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "{printed}");
    assert!(printed.trim().starts_with("ok rounds="), "{printed}");
    let link = t.gateway.ip(&["-d", "link", "show", "g0"]).unwrap().stdout;
    let link = String::from_utf8_lossy(&link);
    assert!(link.contains("prog/xdp"), "steering program gone:\n{link}");
    let line = r.xvs.stop_accounted();
    assert!(field(&line, "forwarded") > 0, "{line}");
}
