//! xvs under the clients and servers operators use: nginx backends, wrk
//! with `Connection: close` (which reuses client ports at once), curl from
//! one fixed `--local-port`, and the operator's own commands (`xvsadm -e
//! -w 0`, `-d`, `--stats`, `-Lnc`) while the load runs. The judge of
//! "a backend accepted a connection" is that backend's own kernel
//! (`Tcp: PassiveOpens`), and of "traffic reached it" its `Ip:` counters.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use xvs_vm_tests::daemon::{drops, field, Daemon};
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{backend_addr, Arms, Spec, Topology};
use xvs_vm_tests::wrk::Wrk;

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1:80";

fn bins() -> PathBuf {
    xvs_vm_tests::daemon::bins(TESTNET)
}

/// A one-arm gateway running `xvs run`, three nginx backends behind
/// 198.19.0.1:80 (rr), and the client.
struct Lab {
    t: Topology,
    nginx: Vec<Option<Nginx>>,
    gw: Daemon,
}

/// The config of [`Lab`]; `extra` goes before the services (e.g. a
/// `[conntrack]` table).
fn config(t: &Topology, extra: &str) -> String {
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\npoll = \"adaptive\"\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\"]\n\n{extra}\n\
         [[services]]\nvip = \"198.19.0.1\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n",
        t.gateway_client_if,
        backends.join(", ")
    )
}

fn lab(extra: &str) -> Lab {
    lab_arms(Arms::One, extra)
}

/// [`lab`], one-arm or two-arm.
fn lab_arms(arms: Arms, extra: &str) -> Lab {
    lab_of(arms, extra, &bins())
}

/// [`lab_arms`], its gateway run by the `xvs` in the folder `first`.
fn lab_of(arms: Arms, extra: &str, first: &Path) -> Lab {
    let t = Topology::build(Spec {
        arms,
        backends: 3,
        queues: 1,
    })
    .unwrap();
    let nginx = Nginx::on_backends(&t)
        .unwrap()
        .into_iter()
        .map(Some)
        .collect();
    let mut text = config(&t, extra);
    if let Some(b) = &t.gateway_backend_if {
        text = text.replace(
            "mode = \"one-arm\"",
            &format!("mode = \"two-arm\"\nbackend = \"{b}\""),
        );
    }
    let (gw, ready) = Daemon::start(&t, "real", first, &text, &[]).unwrap();
    assert!(
        ready.starts_with(&format!("ready: 1 services on {}", t.gateway_client_if)),
        "{ready}"
    );
    Lab { t, nginx, gw }
}

impl Lab {
    /// Connections backend `i`'s kernel has accepted so far.
    fn accepted(&self, i: usize) -> u64 {
        self.t.backends[i].ns.snmp("Tcp", "PassiveOpens").unwrap()
    }

    /// IP packets backend `i`'s kernel received and sent so far.
    fn ip_packets(&self, i: usize) -> (u64, u64) {
        let ns = &self.t.backends[i].ns;
        (
            ns.snmp("Ip", "InReceives").unwrap(),
            ns.snmp("Ip", "OutRequests").unwrap(),
        )
    }

    /// wrk against the VIP for `seconds` (16 connections; with `close`,
    /// every request on a new connection, as `Connection: close` loads
    /// do), in a thread: its summary when joined.
    fn wrk(&self, seconds: u32, close: bool) -> std::thread::JoinHandle<Wrk> {
        Wrk::start(&self.t.client.ns, "http://198.19.0.1/", seconds, close)
    }

    /// `n` HTTP requests, each a new connection from client port `port`,
    /// one after the other (`xvs-testnet http-from-port`: it lets the
    /// server close first, so its own kernel frees the port at once,
    /// while xvs still holds the last connection in TIME_WAIT); each
    /// answer's body (the backend's name) or `ERR ...`.
    fn requests_from_port(&self, port: u16, n: usize) -> Vec<String> {
        let out = self
            .t
            .client
            .ns
            .command(TESTNET)
            .args(["http-from-port", "--connect", VIP, "--local-port"])
            .arg(port.to_string())
            .arg("--count")
            .arg(n.to_string())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// One request with curl: the answer's body.
    fn curl(&self) -> String {
        let out = self
            .t
            .client
            .ns
            .exec("curl", &["-sf", "-m", "2", "http://198.19.0.1/"])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `xvsadm -Ln --stats --json` (or without `--stats`): the service.
    fn service_json(&self) -> serde_json::Value {
        let out = self.gw.adm_ok(&["-Ln", "--stats", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["services"][0].clone()
    }
}

/// How many of `answers` each of the three backends gave (their bodies
/// are `b0`, `b1`, `b2`).
fn per_backend(answers: &[String]) -> [usize; 3] {
    ["b0", "b1", "b2"].map(|name| answers.iter().filter(|s| *s == name).count())
}

fn backend(i: usize) -> String {
    format!("{}:8080", backend_addr(i))
}

/// Quiesce, then delete, a backend under a `Connection: close` load: once
/// the change is in force, the backend's kernel accepts not one more
/// connection, whatever ports the client reuses; the service's `Conns`
/// counts every connection the backends accepted.
#[test]
fn under_connection_close_load_a_quiesced_or_deleted_backend_accepts_nothing_new() {
    if !privileged("under_connection_close_load_a_quiesced_or_deleted_backend_accepts_nothing_new")
    {
        return;
    }
    let lab = lab("");
    let before: Vec<u64> = (0..3).map(|i| lab.accepted(i)).collect();

    // Phase 1: weight 0 on b2 while wrk runs, with keep-alive connections
    // (some on b2) beside the `Connection: close` load.
    let load = lab.wrk(6, true);
    let kept = lab.wrk(6, false);
    std::thread::sleep(Duration::from_secs(2));
    lab.gw
        .adm_ok(&["-e", "-t", VIP, "-r", &backend(2), "-m", "-w", "0"]);
    // SYNs already on their way when the change landed may still finish.
    std::thread::sleep(Duration::from_millis(300));
    let b2_at_change = lab.accepted(2);
    let mid: Vec<u64> = (0..3).map(|i| lab.accepted(i)).collect();
    // (This query is one connection to b2 of its own.)
    let b2_status = lab.nginx[2].as_ref().unwrap().status().unwrap();
    let w1 = load.join().unwrap();
    let k1 = kept.join().unwrap();
    let after1: Vec<u64> = (0..3).map(|i| lab.accepted(i)).collect();
    let b2_end = lab.nginx[2].as_ref().unwrap().status().unwrap();
    eprintln!("phase 1: {w1:?} {k1:?}\naccepted {before:?} -> {mid:?} -> {after1:?}\nb2 nginx {b2_status:?} -> {b2_end:?}");
    assert!(w1.requests > 1000, "{}", w1.text);
    assert_eq!(
        after1[2],
        b2_at_change + 1,
        "the quiesced backend accepted new connections (one is the status query)"
    );
    assert_eq!(w1.errors + k1.errors, 0, "{}\n{}", w1.text, k1.text);
    // Its established (keep-alive) connections went on serving.
    assert!(
        b2_end.requests > b2_status.requests + 100,
        "b2's established connections stopped: {b2_status:?} -> {b2_end:?}"
    );
    for i in 0..2 {
        assert!(after1[i] > mid[i] + 100, "b{i} took the load: {after1:?}");
    }

    // Phase 2: delete b1 while wrk runs.
    let load = lab.wrk(6, true);
    std::thread::sleep(Duration::from_secs(2));
    lab.gw.adm_ok(&["-d", "-t", VIP, "-r", &backend(1)]);
    std::thread::sleep(Duration::from_millis(300));
    let b1_at_change = lab.accepted(1);
    let w2 = load.join().unwrap();
    let after2: Vec<u64> = (0..3).map(|i| lab.accepted(i)).collect();
    eprintln!("phase 2: {w2:?}\naccepted -> {after2:?}");
    assert!(w2.requests > 1000, "{}", w2.text);
    assert_eq!(
        after2[1], b1_at_change,
        "the deleted backend accepted new connections"
    );
    assert_eq!(
        after2[2],
        after1[2] + 1,
        "b2 is still quiesced (one more status query)"
    );
    assert!(after2[0] > after1[0] + 1000);

    // Every connection a backend accepted was scheduled and counted:
    // Conns is at least that. It is a little more: a SYN the backend
    // refused (its TIME_WAIT on a SNAT endpoint used again within 60 s
    // rejects an older timestamp: TcpExt PAWSTimewait) is retried by the
    // client and counted again, as IPVS counts it.
    // (Less the two status queries to b2.)
    let accepted: u64 = (0..3).map(|i| after2[i] - before[i]).sum::<u64>() - 2;
    let conns = lab.service_json()["stats"]["conns"].as_u64().unwrap();
    eprintln!(
        "conns={conns} accepted={accepted} requests={}",
        w1.requests + w2.requests
    );
    assert!(
        conns >= accepted && conns - accepted <= accepted * 3 / 100 + 50,
        "Conns {conns} for {accepted} accepted connections"
    );
    let line = &lab.gw.stop_counters();
    eprintln!("{line}");
    assert!(field(line, "reschedule").unwrap() > 100, "{line}");
}

/// A client that always uses the same source port (as `curl
/// --local-port` does):
/// every request is a new connection, scheduled afresh (rr spreads them),
/// never to a quiesced or deleted backend, and never failing while a
/// healthy backend is left, even once the deleted backend's server is
/// gone.
#[test]
fn a_client_reusing_one_port_is_scheduled_afresh_every_time() {
    if !privileged("a_client_reusing_one_port_is_scheduled_afresh_every_time") {
        return;
    }
    let mut lab = lab("");
    assert!(lab.curl().starts_with('b'));
    let first = lab.requests_from_port(40_000, 30);
    // rr after the curl: 10 each.
    assert_eq!(per_backend(&first), [10, 10, 10], "{first:?}");
    lab.gw
        .adm_ok(&["-e", "-t", VIP, "-r", &backend(0), "-m", "-w", "0"]);
    let quiesced = lab.requests_from_port(40_000, 20);
    assert_eq!(
        per_backend(&quiesced)[1] + per_backend(&quiesced)[2],
        20,
        "{quiesced:?}"
    );
    lab.gw.adm_ok(&["-d", "-t", VIP, "-r", &backend(1)]);
    let deleted = lab.requests_from_port(40_000, 10);
    assert_eq!(per_backend(&deleted)[2], 10, "{deleted:?}");
    // The deleted backend's server stops: nothing changes for the client.
    lab.nginx[1] = None;
    let gone = lab.requests_from_port(40_000, 10);
    assert_eq!(per_backend(&gone)[2], 10, "{gone:?}");
    // 71 connections, each counted.
    let conns = lab.service_json()["stats"]["conns"].as_u64().unwrap();
    assert_eq!(conns, 71);
}

/// A backend that comes back on another Ethernet address (a pod
/// restarted with the same IP) is served at the new one as soon as it
/// speaks ARP: xvs's cached next hop for it does not outlive the change.
#[test]
fn a_backend_back_on_another_mac_is_served_there_once_it_speaks_arp() {
    if !privileged("a_backend_back_on_another_mac_is_served_there_once_it_speaks_arp") {
        return;
    }
    let lab = lab("");
    let before = lab.requests_from_port(41_000, 6);
    assert_eq!(per_backend(&before)[0], 2, "{before:?}");
    // Backend 0's interface moves to another address and, as a host that
    // comes back does, asks for its next hop: the ARP request teaches
    // xvs the new address.
    let b = &lab.t.backends[0];
    b.ns.ip(&[
        "link",
        "set",
        "dev",
        &b.ifname,
        "address",
        "02:00:00:00:99:01",
    ])
    .unwrap();
    b.ns.ip(&["neigh", "flush", "dev", &b.ifname]).unwrap();
    b.ns.exec("ping", &["-c", "1", "-W", "2", "198.18.1.2"])
        .unwrap();
    let after = lab.requests_from_port(41_000, 6);
    assert_eq!(per_backend(&after), [2, 2, 2], "{after:?}");
}

/// After a backend is deleted, the others' `--stats` still match what
/// their own kernels counted (nothing of the deleted one's traffic
/// credited to them), the service's totals did not go back, and the
/// `ActiveConn`/`InActConn` of every backend equal the connection listing.
#[test]
fn after_a_delete_stats_match_the_backends_kernels_and_the_listing() {
    if !privileged("after_a_delete_stats_match_the_backends_kernels_and_the_listing") {
        return;
    }
    let lab = lab("");
    let base: Vec<(u64, u64)> = (0..3).map(|i| lab.ip_packets(i)).collect();
    // Keep-alive and close loads, then the middle backend leaves while
    // wrk's keep-alive connections to it are open.
    let load = lab.wrk(3, false);
    let w = load.join().unwrap();
    assert!(w.requests > 1000, "{}", w.text);
    let load = lab.wrk(6, false);
    std::thread::sleep(Duration::from_secs(2));
    let total_before = lab.service_json()["stats"].clone();
    lab.gw.adm_ok(&["-d", "-t", VIP, "-r", &backend(1)]);
    let w = load.join().unwrap();
    eprintln!("{w:?}");
    let w = lab.wrk(2, true).join().unwrap();
    assert!(w.requests > 200, "{}", w.text);
    std::thread::sleep(Duration::from_millis(500));

    let svc = lab.service_json();
    for (i, addr) in [(0, backend_addr(0)), (2, backend_addr(2))] {
        let b = svc["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["address"] == addr.to_string())
            .unwrap();
        let (rx, tx) = lab.ip_packets(i);
        let (rx, tx) = (rx - base[i].0, tx - base[i].1);
        let (inp, outp) = (
            b["stats"]["inpkts"].as_u64().unwrap(),
            b["stats"]["outpkts"].as_u64().unwrap(),
        );
        eprintln!("b{i}: xvs in={inp} out={outp}, kernel received={rx} sent={tx}");
        let close = |a: u64, b: u64| a.abs_diff(b) <= 20 + b / 200;
        assert!(
            close(inp, rx),
            "b{i}: InPkts {inp}, its kernel received {rx}"
        );
        assert!(
            close(outp, tx),
            "b{i}: OutPkts {outp}, its kernel sent {tx}"
        );
    }
    // The service's totals only grow.
    for k in ["conns", "inpkts", "outpkts", "inbytes", "outbytes"] {
        assert!(
            svc["stats"][k].as_u64().unwrap() >= total_before[k].as_u64().unwrap(),
            "{k}: {} then {}",
            total_before[k],
            svc["stats"][k]
        );
    }
    // ActiveConn / InActConn against the listing, with no traffic. The
    // two are read one after the other while flows still time out (a
    // closing flow's seconds run out between the reads), so the service
    // is read between two listings that agree: counts that differ then
    // are a defect, not a race.
    let listed = |conns: &serde_json::Value| {
        let mut by: std::collections::BTreeMap<(String, bool), u64> = Default::default();
        for c in conns["connections"].as_array().unwrap() {
            let key = (
                c["backend"].as_str().unwrap().to_string(),
                c["state"] == "ESTABLISHED",
            );
            *by.entry(key).or_default() += 1;
        }
        by
    };
    let listing = || -> serde_json::Value {
        serde_json::from_str(&lab.gw.adm_ok(&["-Lnc", "--json"])).unwrap()
    };
    let (svc, counts) = (0..10)
        .find_map(|_| {
            let before = listed(&listing());
            let svc = lab.service_json();
            let after = listed(&listing());
            if before == after {
                return Some((svc, after));
            }
            std::thread::sleep(Duration::from_millis(300));
            None
        })
        .expect("the connection listing settles within ten reads");
    for b in svc["backends"].as_array().unwrap() {
        let addr = format!("{}:{}", b["address"].as_str().unwrap(), b["port"]);
        let n = |established: bool| {
            counts
                .get(&(addr.clone(), established))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(b["active"].as_u64().unwrap(), n(true), "{addr}");
        assert_eq!(b["inactive"].as_u64().unwrap(), n(false), "{addr}");
    }
    // wrk's keep-alive requests to nginx are established full-NAT
    // packets: most of what was forwarded took the express lane, as an
    // operator reads it off /metrics.
    let text = lab.gw.get("/metrics");
    let express = xvs_vm_tests::daemon::sample_sum(&text, "xvs_express_frames_total");
    let forwarded = xvs_vm_tests::daemon::sample_sum(&text, "xvs_forwarded_frames_total");
    assert!(
        express > forwarded / 2.0 && express < forwarded,
        "express {express} of {forwarded} forwarded"
    );
    // /metrics, read by the official client library's parser, says the
    // same as the listing, and the delete's update latency was observed.
    if !xvs_vm_tests::prom::available() {
        return;
    }
    let families = xvs_vm_tests::prom::parse(&lab.gw.get("/metrics")).unwrap();
    let sample = |family: &str, backend: &str, direction: Option<&str>| {
        families[family]
            .samples
            .iter()
            .find(|s| {
                s.labels["backend"] == backend
                    && direction.is_none_or(|d| s.labels["direction"] == d)
            })
            .map(|s| s.value() as u64)
    };
    for b in svc["backends"].as_array().unwrap() {
        let addr = format!("{}:{}", b["address"].as_str().unwrap(), b["port"]);
        let packets = "xvs_backend_packets";
        assert_eq!(
            sample(packets, &addr, Some("in")),
            b["stats"]["inpkts"].as_u64()
        );
        assert_eq!(
            sample(packets, &addr, Some("out")),
            b["stats"]["outpkts"].as_u64()
        );
        let active = sample("xvs_backend_active_connections", &addr, None);
        assert_eq!(active, b["active"].as_u64(), "{addr}");
    }
    let updates = &families["xvs_update_latency_seconds"];
    assert_eq!(updates.kind, "histogram");
    let count = updates
        .samples
        .iter()
        .find(|s| s.name == "xvs_update_latency_seconds_count")
        .unwrap();
    assert!(count.value() >= 1.0, "{count:?}");
}

/// SYNs with TTL 1 and 0 (hping3): no flow, no connection counted
/// against a backend, an ICMP time exceeded for each, counted.
#[test]
fn ttl_1_and_0_syns_create_no_flow_and_get_time_exceeded() {
    if !privileged("ttl_1_and_0_syns_create_no_flow_and_get_time_exceeded") {
        return;
    }
    let lab = lab("");
    for ttl in ["1", "0"] {
        let out = lab
            .t
            .client
            .ns
            .command("hping3")
            .args([
                "-n",
                "-S",
                "-p",
                "80",
                "-c",
                "3",
                "-i",
                "u200000",
                "-t",
                ttl,
                "198.19.0.1",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let exceeded = text
            .lines()
            .filter(|l| l.contains("during transit from ip=198.19.0.1"))
            .count();
        assert_eq!(exceeded, 3, "TTL {ttl}: hping3 said:\n{text}");
    }
    let listing = lab.gw.adm_ok(&["-Lnc"]);
    assert_eq!(listing.lines().count(), 2, "no flow: {listing}");
    let svc = lab.service_json();
    assert_eq!(svc["stats"]["conns"], 0);
    for b in svc["backends"].as_array().unwrap() {
        assert_eq!(
            (b["active"].as_u64(), b["inactive"].as_u64()),
            (Some(0), Some(0))
        );
    }
    let metrics = lab.gw.get("/metrics");
    assert!(
        metrics.contains("xvs_time_exceeded_total{worker=\"0\"} 6"),
        "{metrics}"
    );
    let line = &lab.gw.stop_counters();
    assert_eq!(field(line, "time_exceeded"), Some(6), "{line}");
    assert_eq!(field(line, "new_flows"), Some(0), "{line}");
}

/// A UDP blast the worker cannot keep up with (the debug build's worker,
/// one core): every datagram the client sent is accounted for, either in
/// xvs's own identity (`rx = forwarded + answered + consumed + drops`) or
/// as a loss the kernel counted at xvs's AF_XDP socket (`xsk_rx_dropped`,
/// `xsk_rx_ring_full`), or on a link on the way: sent = received by xvs +
/// lost at its socket + dropped elsewhere.
#[test]
fn a_udp_overload_is_accounted_for_to_the_datagram() {
    if !privileged("a_udp_overload_is_accounted_for_to_the_datagram") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let udp = "[[services]]\nvip = \"198.19.0.1\"\nprotocol = \"udp\"\nport = 53\nscheduler = \"rr\"\nbackends = [{ address = \"198.18.1.10\", port = 5353 }]\n";
    let text = format!("{}\n{udp}", config(&t, ""));
    let (gw, _) = Daemon::start(&t, "real", &bins(), &text, &[]).unwrap();
    let sw = t.switch();
    // Drops the kernel counts on the way to the gateway (not at xvs's
    // socket): the client's link, the switch's two ports.
    let elsewhere = || {
        let c0 = t.client.ns.link_stats("c0").unwrap();
        let pcl = sw.link_stats("p-cl").unwrap();
        let pgw = sw.link_stats("p-gw").unwrap();
        c0.3 + pcl.1 + pgw.3
    };
    let counters = || {
        let text = gw.get("/metrics");
        let metric = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}{{worker=\"0\"}} ")))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{name} not in {text}"))
        };
        (
            metric("xvs_rx_frames_total"),
            metric("xvs_xsk_rx_dropped_total") + metric("xvs_xsk_rx_ring_full_total"),
        )
    };
    let (rx0, lost0, else0) = {
        let (r, l) = counters();
        (r, l, elsewhere())
    };
    let blast = t.udp_blast(TESTNET, "198.19.0.1:53", 3);
    let sent = field(&blast, "sent").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let (rx1, lost1) = counters();
    let dropped_elsewhere = elsewhere() - else0;
    let (rx, lost) = (rx1 - rx0, lost1 - lost0);
    eprintln!("{blast}: xvs received {rx}, lost at its socket {lost}, dropped elsewhere {dropped_elsewhere}");
    assert!(lost > 0, "no overload: nothing to account for");
    // A few frames besides the blast (ARP) may cross the socket too.
    let accounted = rx + lost + dropped_elsewhere;
    assert!(
        accounted >= sent && accounted - sent <= 20,
        "sent {sent}, accounted {accounted}"
    );
    let line = &gw.stop_counters();
    let sum = ["forwarded", "answered", "consumed", "dropped"]
        .iter()
        .map(|k| field(line, k).unwrap())
        .sum::<u64>();
    assert_eq!(field(line, "rx"), Some(sum), "{line}");
    assert_eq!(
        field(line, "xsk_rx_dropped").unwrap() + field(line, "xsk_rx_ring_full").unwrap(),
        lost1,
        "{line}"
    );
}

/// The node's own address as the SNAT address, as kube-proxy masquerades:
/// a port range that collides with the kernel's is refused with the
/// collision named; with a range of its own, xvs serves the VIP through
/// that address while the node's own ping and TCP to the backends, and
/// the backends' TCP to the node, keep working; a listener started later
/// inside the range makes a reload refuse.
#[test]
fn the_nodes_own_address_as_snat_leaves_the_nodes_traffic_alone() {
    if !privileged("the_nodes_own_address_as_snat_leaves_the_nodes_traffic_alone") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _nginx = Nginx::on_backends(&t).unwrap();
    // The node's own TCP service, on the address xvs will share.
    let mut serve = t.gateway.command(TESTNET);
    serve.args(["serve", "--name", "node", "--tcp", "198.18.1.1:2222"]);
    let (_node, _) =
        xvs_vm_tests::procs::Spawned::start(serve, "node server", Duration::from_secs(5)).unwrap();

    // The whole default range: refused, naming what collides.
    let node_snat = |ports: &str| {
        config(&t, "").replace(
            "addresses = [\"198.18.1.2\"]",
            &format!("addresses = [\"198.18.1.1\"]\n{ports}"),
        )
    };
    let scratch = xvs_vm_tests::daemon::ScratchDir::new(&t, "snat").unwrap();
    let dir = scratch.path();
    let cfg = dir.join("refused.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}\n[admin]\nsocket = \"{}/x.sock\"\n\n[restart]\nstate_dir = \"{}/state\"\n",
            node_snat(""),
            dir.display(),
            dir.display()
        ),
    )
    .unwrap();
    // (Bounded: a build that does not refuse would serve until killed.)
    let out = t
        .gateway
        .command("timeout")
        .args([
            "20",
            bins().join("xvs").to_str().unwrap(),
            "run",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("198.18.1.1 is this host's")
            && err.contains("32768-60999 (net.ipv4.ip_local_port_range)")
            && err.contains("2222/tcp"),
        "{err}"
    );
    let link = t.gateway.ip(&["-d", "link", "show", "g0"]).unwrap().stdout;
    assert!(
        !String::from_utf8_lossy(&link).contains("prog/xdp"),
        "nothing was attached"
    );
    // check-config says so too, on this host.
    let check = t
        .gateway
        .command(bins().join("xvs").to_str().unwrap())
        .arg("check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    let check_err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{check_err}");
    assert!(check_err.contains("2222/tcp"), "{check_err}");

    // A range of its own: served.
    let text = node_snat("ports = \"10000-20000\"");
    let (gw, ready) = Daemon::start(&t, "real", &bins(), &text, &[]).unwrap();
    assert!(ready.starts_with("ready:"), "{ready}");
    let load = std::thread::spawn({
        let mut cmd = t.client.ns.command("wrk");
        cmd.args([
            "-t1",
            "-c8",
            "-d4s",
            "-H",
            "Connection: close",
            "http://198.19.0.1/",
        ]);
        move || Wrk::parse(&String::from_utf8_lossy(&cmd.output().unwrap().stdout))
    });
    std::thread::sleep(Duration::from_millis(500));
    // The node's own ping and TCP to a backend.
    t.gateway
        .exec("ping", &["-c", "3", "-i", "0.2", "-W", "2", "198.18.1.10"])
        .unwrap();
    let body = t
        .gateway
        .exec("curl", &["-sf", "-m", "2", "http://198.18.1.11:8080/"])
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&body.stdout).trim(), "b1");
    // A backend's TCP to the node.
    let out = t.backends[2]
        .ns
        .exec(
            TESTNET,
            &["tcp", "--connect", "198.18.1.1:2222", "--connections", "20"],
        )
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok=20 failed=0 by=node:20"
    );
    let w = load.join().unwrap();
    assert!(w.requests > 500 && w.errors == 0, "{}", w.text);
    // The VIP's flows go out from the node's address, in the range.
    let conns: serde_json::Value = serde_json::from_str(&gw.adm_ok(&["-Lnc", "--json"])).unwrap();
    let snat = conns["connections"][0]["snat"].as_str().unwrap().to_owned();
    let port: u16 = snat.strip_prefix("198.18.1.1:").unwrap().parse().unwrap();
    assert!((10_000..=20_000).contains(&port), "{snat}");

    // A listener inside the range: the next reload says so and changes
    // nothing.
    let mut late = t.gateway.command(TESTNET);
    late.args(["serve", "--name", "late", "--tcp", "198.18.1.1:15000"]);
    let (_late, _) =
        xvs_vm_tests::procs::Spawned::start(late, "late server", Duration::from_secs(5)).unwrap();
    let (status, _, err) = gw.adm(&["--reload"]);
    assert_eq!(status, 255, "{err}");
    assert!(err.contains("15000/tcp"), "{err}");
    let line = &gw.stop_counters();
    // Nothing of the node's own reached xvs (it would have dropped it).
    assert_eq!(drops(line, "reply_no_flow"), 0, "{line}");
    assert_eq!(drops(line, "not_owned"), 0, "{line}");
    assert_eq!(drops(line, "icmp_unsupported_type"), 0, "{line}");
}

/// A client whose link leaves TCP checksums to an offload it does not do
/// (TX checksum offload on, on the veth straight to the gateway, two-arm:
/// one-arm goes through a bridge, whose forwarding completes the
/// checksum): xvs counts its first segments as
/// `l4_bad_checksum` and creates nothing, instead of forwarding segments
/// the backend's kernel would discard (`InCsumErrors`). With the offload
/// off again, the same client gets through.
#[test]
fn partial_checksums_from_an_offloading_sender_are_counted_not_forwarded() {
    if !privileged("partial_checksums_from_an_offloading_sender_are_counted_not_forwarded") {
        return;
    }
    let lab = lab_arms(Arms::Two, "");
    let csum_errors = |i: usize| lab.t.backends[i].ns.snmp("Tcp", "InCsumErrors").unwrap();
    let before: u64 = (0..3).map(csum_errors).sum();
    lab.t
        .client
        .ns
        .exec("ethtool", &["-K", "c0", "tx", "on"])
        .unwrap();
    let refused = lab
        .t
        .client
        .ns
        .exec("curl", &["-s", "-m", "2", "http://198.19.0.1/"]);
    assert!(
        refused.is_err(),
        "a request with partial checksums got through"
    );
    lab.t
        .client
        .ns
        .exec("ethtool", &["-K", "c0", "tx", "off"])
        .unwrap();
    assert!(lab.curl().starts_with('b'));
    let after: u64 = (0..3).map(csum_errors).sum();
    assert_eq!(
        after, before,
        "nothing with a bad checksum reached a backend"
    );
    let line = &lab.gw.stop_counters();
    assert!(drops(line, "l4_bad_checksum") >= 1, "{line}");
    assert_eq!(
        field(line, "new_flows"),
        Some(1),
        "only the good request: {line}"
    );
}

/// `[vips] unknown_port = "reject"`: a port of the VIP that no service
/// serves is refused at once (a RST: curl's "connection refused"), like
/// kube-proxy's REJECT; with the default, `drop`, the client times out.
#[test]
fn an_unknown_port_is_rejected_when_configured() {
    if !privileged("an_unknown_port_is_rejected_when_configured") {
        return;
    }
    let rejecting = lab("[vips]\nunknown_port = \"reject\"\n");
    let out = rejecting
        .t
        .client
        .ns
        .command("curl")
        .args(["-s", "-m", "3", "http://198.19.0.1:81/"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "curl: couldn't connect (refused)"
    );
    let line = &rejecting.gw.stop_counters();
    assert!(field(line, "rejected").unwrap() >= 1, "{line}");
    let dropping = lab("");
    let out = dropping
        .t
        .client
        .ns
        .command("curl")
        .args(["-s", "-m", "1", "http://198.19.0.1:81/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(28), "curl: timed out (dropped)");
}

/// The operator's check of a restart: wrk through the VIP to nginx, with
/// keep-alive connections and with `Connection: close`, while xvs is
/// killed (`kill -9`) and started again on the same configuration. Not one
/// socket error, timeout or failed answer; the requests go on. (With
/// `hold = "0s"`, restart survival off, the same run sees resets.)
#[test]
fn wrk_sees_no_error_while_xvs_is_killed_and_started_again() {
    if !privileged("wrk_sees_no_error_while_xvs_is_killed_and_started_again") {
        return;
    }
    wrk_across_a_restart(&bins(), libc::SIGKILL);
}

/// The same through a package upgrade from the release before the state
/// file's layout changed (`XVS_UPGRADE_FROM`: the folder of its `xvs`,
/// as `make layout-upgrade-test` builds it): that release serves wrk,
/// is stopped (SIGTERM, as `systemctl restart` does), and this build
/// rewrites its flow state file in its own layout and carries every
/// connection on.
#[test]
fn wrk_sees_no_error_across_an_upgrade_from_the_layout_before() {
    if !privileged("wrk_sees_no_error_across_an_upgrade_from_the_layout_before") {
        return;
    }
    let Some(from) = xvs_vm_tests::daemon::upgrade_from() else {
        return;
    };
    wrk_across_a_restart(&from, libc::SIGTERM);
}

/// wrk (keep-alive and `Connection: close`) through a gateway run by the
/// `xvs` in `first`, ended by `signal` 3 s in, then this build started on
/// the same configuration and state: the flows adopted, and not one wrk
/// error or failed answer.
fn wrk_across_a_restart(first: &Path, signal: i32) {
    /// The state directory, removed when dropped (also on a panic).
    struct StateDir(PathBuf);
    impl Drop for StateDir {
        fn drop(&mut self) {
            xvs_vm_tests::daemon::unmount_under(&self.0);
            xvs_vm_tests::daemon::remove_folder(&self.0);
        }
    }
    let state =
        StateDir(std::env::temp_dir().join(format!("xvs-real-restart-{}", std::process::id())));
    let lab = lab_of(
        Arms::One,
        &format!(
            "[restart]\nhold = \"5s\"\nstate_dir = \"{}\"\n",
            state.0.display()
        ),
        first,
    );
    let text = std::fs::read_to_string(&lab.gw.cfg).unwrap();
    let kept = lab.wrk(8, false);
    let closed = lab.wrk(8, true);
    std::thread::sleep(Duration::from_secs(3));
    let Lab { t, nginx, gw } = lab;
    let (status, _) = gw.kill(signal);
    assert!(status.is_some());
    let (gw, _) = Daemon::start(&t, "real", &bins(), &text, &[]).unwrap();
    let status: serde_json::Value = serde_json::from_str(&gw.get("/v1/status")).unwrap();
    assert!(
        status["restart"]["adopted_flows"].as_u64().unwrap_or(0) >= 16,
        "{status}"
    );
    for (what, w) in [("keep-alive", kept), ("Connection: close", closed)] {
        let w = w.join().unwrap();
        assert!(w.requests > 1000, "{what}: {}", w.text);
        assert_eq!((w.errors, w.non_2xx), (0, 0), "{what}: {}", w.text);
    }
    drop(gw);
    drop(nginx);
    drop(t);
}

/// `xvs status` on a gateway that served wrk, dropped SYNs to a port no
/// service serves, and has a quiesced backend: the screen and its JSON
/// say so (interfaces and their XDP mode, the worker's core and copy
/// mode, flows against capacity, backends by state, the last minute's
/// top drop reason); `--watch --count 2` refreshes once.
#[test]
fn xvs_status_shows_the_gateway_as_it_is() {
    if !privileged("xvs_status_shows_the_gateway_as_it_is") {
        return;
    }
    let lab = lab("[conntrack]\ncapacity = 4096\n");
    let w = lab.wrk(2, false).join().unwrap();
    assert!(w.requests > 100, "{}", w.text);
    // A port no service serves: dropped (counted as no_service).
    let _ = lab
        .t
        .client
        .ns
        .exec("curl", &["-s", "-m", "1", "http://198.19.0.1:81/"]);
    lab.gw
        .adm_ok(&["-e", "-t", VIP, "-r", &backend(2), "-m", "-w", "0"]);
    // The daemon samples its counters every 2 seconds.
    std::thread::sleep(Duration::from_millis(2500));
    let status = |args: &[&str]| lab.gw.status(args);
    let json: serde_json::Value = serde_json::from_str(&status(&["--json"])).unwrap();
    let ifs = json["interfaces"].as_array().unwrap();
    assert_eq!(ifs.len(), 1, "{json}");
    assert_eq!(ifs[0]["name"], lab.t.gateway_client_if.as_str());
    assert_eq!(ifs[0]["role"], "client+backend");
    assert!(
        ["native", "generic"].contains(&ifs[0]["xdp_mode"].as_str().unwrap()),
        "{json}"
    );
    let workers = json["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1);
    assert_eq!(
        (workers[0]["queue"].as_u64(), workers[0]["core"].as_u64()),
        (Some(0), Some(0))
    );
    // zero_copy = "off" in the config.
    assert_eq!(workers[0]["zero_copy"], false);
    // The UMEM's pages: 2 MiB if the machine reserves some, else 4 KiB,
    // as the kernel's account of the daemon's mappings says.
    let huge = workers[0]["huge_pages"].as_bool().unwrap();
    let pid = json["pid"].as_u64().unwrap() as u32;
    assert_eq!(huge, xvs_vm_tests::pages::has_huge_mapping(pid), "{json}");
    assert_eq!(json["capacity"], 4096);
    let services = &json["services"];
    assert_eq!(
        (services["services"].as_u64(), services["backends"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(
        (services["healthy"].as_u64(), services["quiesced"].as_u64()),
        (Some(2), Some(1)),
        "{json}"
    );
    assert_eq!(json["kubernetes"], serde_json::Value::Null);
    let drops = json["drops_last_minute"].as_array().unwrap();
    // The SYNs to port 81 are among them (another reason may count more:
    // a late segment of wrk's, say), most first, five at most.
    let no_service = drops.iter().find(|d| d[0] == "no_service");
    assert!(
        no_service.is_some_and(|d| d[1].as_u64() >= Some(1)),
        "{json}"
    );
    let counts: Vec<u64> = drops.iter().map(|d| d[1].as_u64().unwrap()).collect();
    assert!(
        counts.len() <= 5 && counts.is_sorted_by(|a, b| a >= b),
        "{json}"
    );
    assert!(json["uptime_seconds"].as_f64().unwrap() > 2.0);
    assert_eq!(json["snat"]["addresses"][0], "198.18.1.2");
    // Every flow is full NAT through the one SNAT address.
    assert!(json["flows"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["snat"]["flows"][0], json["flows"], "{json}");

    let screen = status(&[]);
    eprintln!("{screen}");
    for line in [
        format!(
            "Interfaces:        {} (client+backend): XDP",
            lab.t.gateway_client_if
        ),
        "Workers:           1".to_owned(),
        format!(
            "  q0 @ cpu0        copy       {} pages",
            if huge { "2 MiB" } else { "4 KiB" }
        ),
        " / 4,096 (".to_owned(),
        "Services:          1 (0 from Kubernetes), 3 backends: 2 healthy, 0 down, 1 quiesced"
            .to_owned(),
        "Kubernetes:        off".to_owned(),
        format!(
            "SNAT:              198.18.1.2 ({} flows) ports 1024-65535",
            json["flows"]
        ),
        "no_service ".to_owned(),
    ] {
        assert!(screen.contains(&line), "{line:?} not in\n{screen}");
    }
    // The web view is on the unix socket too.
    assert!(lab.gw.get("/ui").contains("<title>xvs</title>"));
    let watched = status(&["--watch", "0.2", "--count", "2"]);
    assert_eq!(watched.matches("Interfaces:").count(), 2, "{watched}");
    assert_eq!(watched.matches("\x1b[2J").count(), 2);
}
