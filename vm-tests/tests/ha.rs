//! Two gateways, end to end, as keepalived runs IPVS's sync daemon: an
//! active and a backup xvs on one segment with three backends; the
//! active's flows are synchronised to the backup; the active is killed
//! (`kill -9`) and the backup is told to take over (`xvsadm --takeover`,
//! what a keepalived notify script runs), or finds the active silent by
//! itself (`peer_timeout`). Every long-lived connection
//! continues with its byte stream intact, no client sees a reset, and
//! new connections go through the backup. The figures (takeover time,
//! longest stall, segments the client retransmitted, connections
//! surviving) are printed.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // the figures are real time

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xvs_vm_tests::capture::Capture;
use xvs_vm_tests::daemon::{bins, field, Daemon, ScratchDir};
use xvs_vm_tests::netns::Netns;
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::{Spawned, STREAMS_READY};
use xvs_vm_tests::topology::{backend_addr, link, one_arm_head, Spec, Topology, SNAT_ADDR};
use xvs_vm_tests::wrk::Wrk;

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";
const STREAMS: u32 = 200;

/// How a gateway is set up in a test.
struct Gw<'a> {
    /// Node id: 1 at 198.18.1.1, 2 at 198.18.1.3.
    node: u32,
    /// SNAT address.
    snat: &'a str,
    /// `active` or `backup`.
    role: &'a str,
    /// The service's scheduler.
    scheduler: &'a str,
    /// Where sync goes: the other gateway (`None`) or this group.
    group: Option<&'a str>,
    /// More `[cluster.sync]` lines.
    extra: &'a str,
}

/// The config of gateway `g`: the same service and seed on every
/// gateway, each sending its flows to the other (or the group) with the
/// shared key `key`.
fn config(t: &Topology, g: &Gw<'_>, key: &Path) -> String {
    let (me, peer) = match g.node {
        1 => ("198.18.1.1", "198.18.1.3"),
        _ => ("198.18.1.3", "198.18.1.1"),
    };
    let peer = g.group.unwrap_or(peer);
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    format!(
        "{}\n[cluster]\nhash_seed = 20261202\n\n[cluster.sync]\nnode = {}\nid = 7\nlisten = \"{me}:8848\"\npeers = [\"{peer}:8848\"]\nkey_file = \"{}\"\nrole = \"{}\"\n{}\n\
         [[services]]\nvip = \"{VIP}\"\nport = 80\nscheduler = \"{}\"\nbackends = [{}]\n",
        one_arm_head(t, 1).replace(&SNAT_ADDR.to_string(), g.snat),
        g.node,
        key.display(),
        g.role,
        g.extra,
        g.scheduler,
        backends.join(", ")
    )
}

/// Waits until `gw` has heard `node`.
fn hears(gw: &Daemon, node: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let want = format!("peer {node} at");
    loop {
        let daemon = gw.adm_ok(&["-L", "--daemon"]);
        if daemon.contains(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {node} not heard after 10 s:\n{daemon}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 200 streams from the client to the VIP for `seconds`.
fn streams(t: &Topology, seconds: u32) -> Spawned {
    let mut cmd = t.client.ns.command(TESTNET);
    cmd.args([
        "streams",
        "--connect",
        &format!("{VIP}:80"),
        "--connections",
        &STREAMS.to_string(),
        "--seconds",
        &seconds.to_string(),
    ]);
    Spawned::start(cmd, "streams", STREAMS_READY).unwrap().0
}

/// (connections ok, longest stall in ms, output) of finished streams.
fn finished(s: Spawned) -> (u64, u64, String) {
    let (_, out) = s.wait(Duration::from_secs(60));
    let summary = out.lines().find(|l| l.starts_with("ok=")).unwrap_or("");
    let ok = field(summary, "ok").unwrap_or(0);
    let stall = field(summary, "max_stall_ms").unwrap_or(0);
    let failed = field(summary, "failed").unwrap_or(u64::MAX);
    assert_eq!(
        (ok, failed),
        (u64::from(STREAMS), 0),
        "every connection continues:\n{out}"
    );
    (ok, stall, out)
}

/// Established flows `gw` lists with SNAT address `snat` (any: `""`).
fn established_via(gw: &Daemon, snat: &str) -> usize {
    let json: serde_json::Value = serde_json::from_str(&gw.adm_ok(&["-Lnc", "--json"])).unwrap();
    json["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "ESTABLISHED")
        .filter(|c| c["snat"].as_str().unwrap_or_default().starts_with(snat))
        .count()
}

/// Established flows `gw` lists.
fn established(gw: &Daemon) -> usize {
    established_via(gw, "")
}

/// What every test here builds: three echo backends on the one-arm
/// segment, the first gateway's namespace (the topology's) and a second
/// one (`gwb`, 198.18.x.3), a scratch folder with the shared key.
struct Bed {
    servers: Vec<Spawned>,
    b_ns: Netns,
    scratch: ScratchDir,
    key: PathBuf,
    bins: PathBuf,
    t: Topology,
}

impl Bed {
    fn new(kind: &str) -> Bed {
        let t = Topology::build(Spec::one_arm(3)).unwrap();
        let servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
        let b_ns = t.add_gateway("gwb", 3).unwrap();
        let scratch = ScratchDir::new(&t, kind).unwrap();
        let key = scratch.path().join("sync.key");
        std::fs::write(&key, b"a shared key for the two gateways").unwrap();
        Bed {
            servers,
            b_ns,
            scratch,
            key,
            bins: bins(TESTNET),
            t,
        }
    }

    /// The VIPs on the clients' segment, as LVS VIPs are: the client asks
    /// who has one, and a takeover's gratuitous ARP moves it.
    fn vips_on_segment(&self) {
        let c = &self.t.client;
        c.ns.ip(&["route", "add", "198.19.0.0/16", "dev", &c.ifname])
            .unwrap();
    }

    /// Starts gateway `g` (node 1 in the topology's gateway namespace,
    /// node 2 in `gwb`).
    fn start(&self, g: &Gw<'_>) -> Daemon {
        let text = config(&self.t, g, &self.key);
        let (d, _) = match g.node {
            1 => Daemon::start(
                &self.t,
                &format!("{}-1", self.tag()),
                &self.bins,
                &text,
                &[],
            ),
            _ => {
                let dir = self.scratch.path().join("b");
                Daemon::start_in(&self.b_ns, &dir, &self.bins, &text, &[])
            }
        }
        .unwrap();
        d
    }

    /// An active (node 1) and a backup (node 2) with the same SNAT
    /// address, `scheduler`, sync to `group` (else to each other) and
    /// `extra` `[cluster.sync]` lines.
    fn active_backup(&self, scheduler: &str, group: Option<&str>, extra: &str) -> (Daemon, Daemon) {
        let snat = SNAT_ADDR.to_string();
        let gw = |node, role| Gw {
            node,
            snat: &snat,
            role,
            scheduler,
            group,
            extra,
        };
        (self.start(&gw(1, "active")), self.start(&gw(2, "backup")))
    }

    fn tag(&self) -> String {
        self.scratch
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Waits (at most 15 s) until `gw` lists `n` established flows, and
/// hands `streams` back; else fails with what the streams said and the
/// drop counters of the gateways `all`, so that a slow start and a lost
/// packet tell themselves apart.
fn wait_established(gw: &Daemon, n: usize, streams: Spawned, all: &[&Daemon]) -> Spawned {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut got = established(gw);
    while got < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        got = established(gw);
    }
    if got >= n {
        return streams;
    }
    let drops: Vec<String> = all
        .iter()
        .map(|d| d.nonzero_metrics(&["xvs_drops_total", "xvs_rejected_total"]))
        .collect();
    let (_, out) = streams.stop(libc::SIGTERM, Duration::from_secs(10));
    panic!(
        "{got} of {n} flows established after 15 s; the streams said:\n{out}\n\
         the gateways' drops:\n{}",
        drops.join("\n--\n")
    );
}

#[test]
fn a_backup_takes_over_and_every_synced_connection_continues() {
    if !privileged("a_backup_takes_over_and_every_synced_connection_continues") {
        return;
    }
    let bed = Bed::new("ha");
    let t = &bed.t;
    bed.vips_on_segment();
    // Sync over a multicast group on the segment, as IPVS's daemon sends.
    let (active, backup) = bed.active_backup("rr", Some("239.0.0.81"), "");
    // The backup hears the active and serves nothing meanwhile.
    hears(&backup, 1);
    let daemon = backup.adm_ok(&["-L", "--daemon"]);
    assert!(
        daemon.starts_with(
            "backup sync daemon (listen=198.18.1.3:8848, syncid=7, maxlen=1472, peers=239.0.0.81:8848, auth=hmac-sha256)"
        ),
        "{daemon}"
    );
    assert!(
        daemon.contains("peer 1 at 198.18.1.1:8848") && daemon.contains("snat 198.18.1.2"),
        "{daemon}"
    );
    assert!(backup.steered().is_empty(), "{:?}", backup.steered());
    let before = t.tcp_load(TESTNET, &format!("{VIP}:80"), 30, 3000);
    assert!(
        before.starts_with("ok=30 failed=0 by=b0:10,b1:10,b2:10"),
        "{before}"
    );

    let resets = Capture::start(t, bed.scratch.path());
    let streams = streams(t, 12);
    // Every stream is older than the sync delay, and is on the backup.
    let streams = wait_established(&backup, STREAMS as usize, streams, &[&active, &backup]);
    std::thread::sleep(Duration::from_secs(2));
    let synced = established(&backup);
    assert!(
        synced >= STREAMS as usize,
        "the backup holds {synced} established flows"
    );
    let retrans_before = t.client.ns.snmp("Tcp", "RetransSegs").unwrap();
    // Connection-per-request load across the failover.
    let mut requests = t.client.ns.command(TESTNET);
    requests.args([
        "tcp",
        "--connect",
        &format!("{VIP}:80"),
        "--connections",
        "3000",
        "--concurrency",
        "4",
        "--timeout-ms",
        "10000",
    ]);
    // It prints only its summary at the end: started, not waited for.
    let requests =
        Spawned::start_until(requests, "requests", Duration::from_secs(5), || true).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let killed = Instant::now();
    let (status, _) = active.kill(libc::SIGKILL);
    assert!(status.is_some(), "the active did not end");
    let said = backup.adm_ok(&["--takeover"]);
    let takeover = killed.elapsed();
    assert!(said.starts_with("took over 2 address(es)"), "{said}");
    assert!(said.contains("198.18.1.2") && said.contains(VIP), "{said}");
    let steered = backup.steered();
    assert_eq!(steered, ["198.18.1.2", VIP], "{steered:?}");
    // New connections after the takeover: through the backup, all of them.
    let after = t.tcp_load(TESTNET, &format!("{VIP}:80"), 60, 3000);
    assert!(
        after.starts_with("ok=60 failed=0"),
        "after the takeover: {after}"
    );

    let (_, out) = streams.wait(Duration::from_secs(60));
    let summary = out
        .lines()
        .find(|l| l.starts_with("ok="))
        .unwrap_or("")
        .to_owned();
    let ok = field(&summary, "ok").unwrap_or(0);
    let stall = field(&summary, "max_stall_ms").unwrap_or(0);
    let (_, req) = requests.wait(Duration::from_secs(120));
    let req = req
        .lines()
        .find(|l| l.starts_with("ok="))
        .unwrap_or("")
        .to_owned();
    let lost = t.client.ns.snmp("Tcp", "RetransSegs").unwrap() - retrans_before;
    let seen = resets.resets();
    let daemon = backup.adm_ok(&["-L", "--daemon"]);
    println!(
        "failover figures (active/backup, kill -9): takeover {} ms after the kill, longest stream stall {stall} ms, \
         {lost} segments retransmitted by the client, {ok}/{STREAMS} connections survived; request load: {req}\n{daemon}",
        takeover.as_millis()
    );
    assert_eq!(
        ok,
        u64::from(STREAMS),
        "every synced connection continues:\n{out}"
    );
    assert!(summary.contains("failed=0"), "{summary}");
    // On a reset, the backup's drops and rejects say which path sent it.
    assert!(
        seen.is_empty(),
        "clients saw resets:\n{}\nthe backup's drops and rejects:\n{}",
        seen.join("\n"),
        backup.nonzero_metrics(&["xvs_drops_total", "xvs_rejected_total"])
    );
    // Of the requests, only those in flight at the kill (4 at a time) and
    // younger than the sync delay may have been lost.
    assert!(field(&req, "failed").is_some_and(|f| f <= 4), "{req}");
    // What Prometheus scrapes of it.
    let metrics = backup.get("/metrics");
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    assert!(
        value("xvs_sync_received_records_total ") >= STREAMS as f64,
        "{metrics}"
    );
    assert_eq!(
        value("xvs_sync_dropped_datagrams_total{reason=\"bad_mac\"} "),
        0.0
    );
    assert_eq!(
        value("xvs_sync_lost_datagrams_total "),
        0.0,
        "a quiet segment loses nothing"
    );
    assert!(
        value("xvs_sync_sent_datagrams_total ") > 0.0,
        "its hellos at least"
    );
    assert_eq!(
        value("xvs_sync_lagging_records_total "),
        0.0,
        "nothing waited a second"
    );
    assert_eq!(value("xvs_sync_standby "), 0.0, "active after the takeover");
    let line = backup.stop_accounted();
    assert!(field(&line, "announced").unwrap_or(0) >= 2, "{line}");
}

/// Two active gateways behind a router doing ECMP with an L4 hash: each
/// serves its share of the client's connections through its own SNAT
/// address and holds the other's flows. One is killed; the router stops
/// using it (the BGP speaker's withdrawal, done here by the test) and the
/// other takes over its SNAT address and flows: every connection
/// continues.
#[test]
fn an_active_peer_adopts_a_killed_peer_s_addresses_and_flows_behind_ecmp() {
    if !privileged("an_active_peer_adopts_a_killed_peer_s_addresses_and_flows_behind_ecmp") {
        return;
    }
    let bed = Bed::new("ha-ecmp");
    let t = &bed.t;
    // The router: on the clients' segment at 198.18.0.4, the VIPs over
    // both gateways, hashed by addresses and ports.
    let router = Netns::create(&t.tag, "rt").unwrap();
    link(t.switch(), "p-rt", &router, "r0").unwrap();
    t.switch()
        .ip(&["link", "set", "p-rt", "master", "br0"])
        .unwrap();
    router
        .ip(&["addr", "add", "198.18.0.4/24", "dev", "r0"])
        .unwrap();
    for (k, v) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.fib_multipath_hash_policy", "1"),
        ("net.ipv4.conf.all.send_redirects", "0"),
        ("net.ipv4.conf.r0.send_redirects", "0"),
    ] {
        router.sysctl(k, v).unwrap();
    }
    router
        .ip(&[
            "route",
            "add",
            "198.19.0.0/16",
            "nexthop",
            "via",
            "198.18.0.1",
            "dev",
            "r0",
            "nexthop",
            "via",
            "198.18.0.3",
            "dev",
            "r0",
        ])
        .unwrap();
    t.client
        .ns
        .ip(&["route", "add", "198.19.0.0/16", "via", "198.18.0.4"])
        .unwrap();
    let (snat_a, snat_b) = ("198.18.1.2", "198.18.1.4");
    let gw = |node, snat| Gw {
        node,
        snat,
        role: "active",
        scheduler: "mh",
        group: None,
        extra: "",
    };
    let a = bed.start(&gw(1, snat_a));
    let b = bed.start(&gw(2, snat_b));
    hears(&a, 2);
    hears(&b, 1);
    assert_eq!(b.steered(), [snat_b, VIP]);

    let resets = Capture::start(t, bed.scratch.path());
    let streams = streams(t, 12);
    let streams = wait_established(&b, STREAMS as usize, streams, &[&a, &b]);
    std::thread::sleep(Duration::from_secs(2));
    // The router spread the connections over both; each holds all.
    let (on_a, on_b) = (established_via(&a, snat_a), established_via(&b, snat_b));
    assert_eq!(
        on_a + on_b,
        STREAMS as usize,
        "{on_a} through A, {on_b} through B"
    );
    assert!(on_a > 0 && on_b > 0, "{on_a} through A, {on_b} through B");
    assert_eq!(established_via(&b, snat_a), on_a, "A's flows on B");
    assert_eq!(established_via(&a, snat_b), on_b, "B's flows on A");
    let retrans_before = t.client.ns.snmp("Tcp", "RetransSegs").unwrap();

    let killed = Instant::now();
    let (status, _) = a.kill(libc::SIGKILL);
    assert!(status.is_some(), "A did not end");
    // The BGP speaker's withdrawal: the router stops sending to A.
    router
        .ip(&[
            "route",
            "replace",
            "198.19.0.0/16",
            "via",
            "198.18.0.3",
            "dev",
            "r0",
        ])
        .unwrap();
    let said = b.adm_ok(&["--takeover", "1"]);
    let takeover = killed.elapsed();
    assert!(
        said.starts_with("took over 1 address(es)") && said.contains(snat_a),
        "{said}"
    );
    assert_eq!(b.steered(), [snat_a, snat_b, VIP]);
    let after = t.tcp_load(TESTNET, &format!("{VIP}:80"), 60, 3000);
    assert!(
        after.starts_with("ok=60 failed=0"),
        "after the takeover: {after}"
    );

    let (ok, stall, _) = finished(streams);
    let lost = t.client.ns.snmp("Tcp", "RetransSegs").unwrap() - retrans_before;
    let seen = resets.resets();
    println!(
        "failover figures (active/active behind ECMP, kill -9): {on_a} of {STREAMS} connections were on the killed gateway; \
         takeover {} ms after the kill, longest stream stall {stall} ms, {lost} segments retransmitted by the client, \
         {ok}/{STREAMS} connections survived\n{}",
        takeover.as_millis(),
        b.adm_ok(&["-L", "--daemon"])
    );
    assert!(seen.is_empty(), "clients saw resets:\n{}", seen.join("\n"));
    b.stop_accounted();
}

/// The built-in liveness check: a backup with `peer_timeout` takes over
/// by itself when the active goes silent, and the connections continue.
#[test]
fn a_backup_takes_over_by_itself_when_the_active_goes_silent() {
    if !privileged("a_backup_takes_over_by_itself_when_the_active_goes_silent") {
        return;
    }
    let bed = Bed::new("ha-live");
    let t = &bed.t;
    bed.vips_on_segment();
    let (active, backup) = bed.active_backup("wlc", None, "peer_timeout = \"1s\"\n");
    hears(&backup, 1);
    let streams = streams(t, 8);
    let streams = wait_established(&backup, STREAMS as usize, streams, &[&active, &backup]);
    assert!(
        backup.steered().is_empty(),
        "the backup waits while the active speaks"
    );
    let killed = Instant::now();
    let (status, _) = active.kill(libc::SIGKILL);
    assert!(status.is_some(), "the active did not end");
    let deadline = Instant::now() + Duration::from_secs(10);
    while backup.steered().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = killed.elapsed();
    assert_eq!(backup.steered(), ["198.18.1.2", VIP]);
    let (ok, stall, _) = finished(streams);
    println!(
        "failover figures (built-in liveness check, peer_timeout 1s): serving {} ms after the kill, \
         longest stream stall {stall} ms, {ok}/{STREAMS} connections survived",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    backup.stop_accounted();
}

/// How the backup comes to serve in a failover test.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Failover {
    /// `xvsadm --takeover` right after the kill (a keepalived notify
    /// script).
    Told,
    /// Nothing: the backup's own liveness check (`peer_timeout = "1s"`)
    /// finds the active silent.
    Silent,
}

/// The operator's own clients across a failover: nginx backends, wrk with
/// keep-alive and with `Connection: close` through the active; `kill -9`
/// of the active and `xvsadm --takeover` on the backup. The keep-alive
/// connections continue without one error; of the connection-per-request
/// load, only connections opened in the last instants before the kill
/// (not yet synced) may time out, one per wrk connection at most.
#[test]
fn nginx_and_wrk_through_a_failover() {
    if !privileged("nginx_and_wrk_through_a_failover") {
        return;
    }
    nginx_and_wrk_across(Failover::Told, "ha-wrk");
}

/// The same clients across a failover that nobody announces: the backup
/// (`peer_timeout = "1s"`) takes over by itself within three seconds of
/// the kill. Its second of silence is longer than the stall after a told
/// takeover, so a keep-alive request in flight at the kill may exceed
/// wrk's two-second timeout (its retransmissions back off past the
/// takeover): one per wrk connection at most, and none answered wrong.
#[test]
fn nginx_and_wrk_through_a_failover_the_backup_finds_by_itself() {
    if !privileged("nginx_and_wrk_through_a_failover_the_backup_finds_by_itself") {
        return;
    }
    nginx_and_wrk_across(Failover::Silent, "ha-wrks");
}

fn nginx_and_wrk_across(how: Failover, kind: &str) {
    let mut bed = Bed::new(kind);
    // nginx, not the echo servers, on the backends' port.
    bed.servers.clear();
    let t = &bed.t;
    bed.vips_on_segment();
    let nginx: Vec<Nginx> = t.nginx_on_backends(false, 8080).unwrap();
    let extra = match how {
        Failover::Told => "",
        Failover::Silent => "peer_timeout = \"1s\"\n",
    };
    let (active, backup) = bed.active_backup("wlc", None, extra);
    hears(&backup, 1);
    let url = format!("http://{VIP}/");
    let kept = Wrk::start(&t.client.ns, &url, 8, false);
    let closed = Wrk::start(&t.client.ns, &url, 8, true);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        backup.steered().is_empty(),
        "the backup waits while the active speaks"
    );
    let killed = Instant::now();
    let (status, _) = active.kill(libc::SIGKILL);
    assert!(status.is_some(), "the active did not end");
    match how {
        Failover::Told => {
            let said = backup.adm_ok(&["--takeover"]);
            assert!(said.starts_with("took over 2 address(es)"), "{said}");
        }
        Failover::Silent => {
            let deadline = Instant::now() + Duration::from_secs(10);
            while backup.steered().is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let took = killed.elapsed();
            assert_eq!(backup.steered(), ["198.18.1.2", VIP]);
            assert!(took < Duration::from_secs(3), "{took:?}");
            println!("the backup served {} ms after the kill", took.as_millis());
        }
    }
    let (kept, closed) = (kept.join().unwrap(), closed.join().unwrap());
    println!(
        "failover figures ({how:?}; nginx, wrk 16 connections each): keep-alive {} requests, {} errors; \
         Connection: close {} requests, {} errors",
        kept.requests, kept.errors, closed.requests, closed.errors
    );
    assert!(kept.requests > 500, "{}", kept.text);
    let kept_errors = match how {
        Failover::Told => 0,
        Failover::Silent => 16,
    };
    assert!(
        kept.errors <= kept_errors && kept.non_2xx == 0,
        "keep-alive: {}",
        kept.text
    );
    assert!(closed.requests > 500, "{}", closed.text);
    assert!(
        closed.errors <= 16 && closed.non_2xx == 0,
        "Connection: close: {}",
        closed.text
    );
    // After the takeover every backend still answered through xvs.
    for n in &nginx {
        let s = n.status().unwrap();
        assert!(s.requests > 100, "{}: {s:?}", n.name);
    }
    backup.stop_accounted();
}
