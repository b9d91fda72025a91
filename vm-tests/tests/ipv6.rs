//! IPv6 and dual-stack in namespaces over the benchmarking ranges
//! (2001:2::/48 beside 198.18.0.0/15): real nginx backends and curl, real
//! TCP and UDP echo, ping6, neighbour discovery from empty caches, REJECT
//! (RST and ICMPv6 port unreachable), weight 0 and live edits under load,
//! the operator's listings (`xvsadm -Ln`, `conntrack -L -f ipv6`), and
//! PMTU discovery through a 1280-byte link between two routers.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use xvs_vm_tests::daemon::{drops, field, Daemon};
use xvs_vm_tests::netns::Netns;
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::{Spawned, STREAMS_READY};
use xvs_vm_tests::topology::{
    address, backend_addr, backend_addr6, link, Spec, Topology, CLIENT_ADDR6, SNAT_ADDR6, VIP6,
};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP4: &str = "198.19.0.1";

fn bins() -> PathBuf {
    xvs_vm_tests::daemon::bins(TESTNET)
}

fn url6(path: &str) -> String {
    format!("http://[{VIP6}]:80{path}")
}

/// A dual-stack config: TCP 80 on an IPv4 and an IPv6 VIP (each with its
/// family's backends, rr), UDP 53 and TCP 9090 (echo, mh) on the IPv6 one,
/// `extra` before the services.
fn config(t: &Topology, extra: &str) -> String {
    let n = t.backends.len();
    let b4: Vec<String> = (0..n)
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    let b6: Vec<String> = (0..n)
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr6(i)))
        .collect();
    format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\npoll = \"adaptive\"\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\", \"{SNAT_ADDR6}\"]\n\n{extra}\n\
         [[services]]\nvip = \"{VIP4}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n\n\
         [[services]]\nvip = \"{VIP6}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n\n\
         [[services]]\nvip = \"{VIP6}\"\nprotocol = \"udp\"\nport = 53\nscheduler = \"rr\"\nbackends = [{}]\n\n\
         [[services]]\nvip = \"{VIP6}\"\nport = 9090\nscheduler = \"mh\"\nbackends = [{}]\n",
        t.gateway_client_if,
        b4.join(", "),
        b6.join(", "),
        b6.iter()
            .map(|b| b.replace("8080", "5353"))
            .collect::<Vec<_>>()
            .join(", "),
        b6.iter()
            .map(|b| b.replace("8080", "9090"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The topology, nginx on both families of every backend, a UDP echo
/// server on each backend's IPv6 address, and xvs.
struct Lab {
    t: Topology,
    nginx: Vec<Nginx>,
    _udp: Vec<Spawned>,
    gw: Daemon,
}

fn lab(extra: &str) -> Lab {
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let nginx = t
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let on = [
                SocketAddr::new(IpAddr::V4(b.addr), 8080),
                SocketAddr::new(IpAddr::V6(b.addr6), 8080),
            ];
            Nginx::start_on(&b.ns, &on, &format!("b{i}")).unwrap()
        })
        .collect();
    let udp = t
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut cmd = b.ns.command(TESTNET);
            cmd.args(["serve", "--name", &format!("u{i}"), "--tcp"])
                .arg(format!("[{}]:9090", b.addr6))
                .arg("--udp")
                .arg(format!("[{}]:5353", b.addr6));
            Spawned::start(cmd, "echo server", Duration::from_secs(5))
                .unwrap()
                .0
        })
        .collect();
    let (gw, ready) = Daemon::start(&t, "ipv6", &bins(), &config(&t, extra), &[]).unwrap();
    assert!(ready.starts_with("ready: 4 services on "), "{ready}");
    Lab {
        t,
        nginx,
        _udp: udp,
        gw,
    }
}

impl Lab {
    /// One request with curl to `url`: the body, or the curl error.
    fn curl(&self, url: &str) -> Result<String, String> {
        let out = self
            .t
            .client
            .ns
            .command("curl")
            .args(["-sS", "-m", "3", url])
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// Connections backend `i`'s kernel has accepted (both families).
    fn accepted(&self, i: usize) -> u64 {
        self.t.backends[i].ns.snmp("Tcp", "PassiveOpens").unwrap()
    }

    /// wrk against `url` for `seconds` (16 connections; `close`: a new
    /// connection per request), in a thread: (requests, socket errors,
    /// non-2xx).
    fn wrk(
        &self,
        url: &str,
        seconds: u32,
        close: bool,
    ) -> std::thread::JoinHandle<(u64, u64, u64)> {
        let mut cmd = self.t.client.ns.command("wrk");
        cmd.args(["-t1", "-c16", &format!("-d{seconds}s"), "--timeout", "2s"]);
        if close {
            cmd.args(["-H", "Connection: close"]);
        }
        cmd.arg(url);
        std::thread::spawn(move || {
            let out = cmd.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut r = (0, 0, 0);
            for line in text.lines().map(str::trim) {
                if line.contains(" requests in ") {
                    r.0 = line.split_whitespace().next().unwrap().parse().unwrap();
                }
                if let Some(rest) = line.strip_prefix("Socket errors:") {
                    r.1 = rest
                        .split(',')
                        .filter_map(|kv| kv.split_whitespace().nth(1)?.parse::<u64>().ok())
                        .sum();
                }
                if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
                    r.2 = n.trim().parse().unwrap();
                }
            }
            eprintln!("wrk: {text}");
            r
        })
    }
}

/// Both families at once: curl over IPv4 and IPv6 interleaved (and wrk on
/// both together) all succeed and spread over the backends; the listings
/// show IPv6 as ipvsadm and conntrack print it.
#[test]
fn a_dual_stack_service_pair_answers_on_both_families_at_once() {
    if !privileged("a_dual_stack_service_pair_answers_on_both_families_at_once") {
        return;
    }
    let lab = lab("");
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..12 {
        for url in [format!("http://{VIP4}/"), url6("/")] {
            let body = lab.curl(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            *seen.entry((url.contains('[') as u8, body)).or_insert(0) += 1;
        }
    }
    eprintln!("{seen:?}");
    // rr over three backends, per family.
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(seen.values().all(|&n| n == 4), "{seen:?}");

    let w4 = lab.wrk(&format!("http://{VIP4}/"), 3, false);
    let w6 = lab.wrk(&url6("/"), 3, true);
    let (r4, e4, n4) = w4.join().unwrap();
    let (r6, e6, n6) = w6.join().unwrap();
    assert!(r4 > 500 && r6 > 200, "ipv4 {r4}, ipv6 {r6}");
    assert_eq!((e4, n4, e6, n6), (0, 0, 0, 0));

    // UDP over IPv6, echo-verified.
    let out = lab
        .t
        .client
        .ns
        .command(TESTNET)
        .args([
            "udp",
            "--connect",
            &format!("[{VIP6}]:53"),
            "--requests",
            "30",
        ])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(line.starts_with("ok=30 failed=0"), "{line}");

    // ipvsadm's listing: IPv4 services first, IPv6 as [addr]:port.
    let list = lab.gw.adm_ok(&["-Ln"]);
    eprintln!("{list}");
    assert!(list.contains(&format!("TCP  [{VIP6}]:80 rr")), "{list}");
    assert!(list.contains(&format!("UDP  [{VIP6}]:53 rr")), "{list}");
    assert!(
        list.contains(&format!("  -> [{}]:8080", backend_addr6(0))),
        "{list}"
    );
    let v4_at = list.find(&format!("TCP  {VIP4}:80")).unwrap();
    let v6_at = list.find(&format!("TCP  [{VIP6}]:80")).unwrap();
    assert!(
        v4_at < v6_at,
        "IPv4 services are listed first, as libipvs sorts"
    );
    // -Lnc: IPv6 connections with every end as [addr]:port.
    let conns = lab.gw.adm_ok(&["-Lnc"]);
    assert!(
        conns.lines().any(|l| l.starts_with("TCP ")
            && l.contains(&format!(" [{VIP6}]:80 "))
            && l.contains(&format!(" [{CLIENT_ADDR6}]:"))
            && l.contains(&format!(" [{}]:8080", backend_addr6(0)))),
        "{conns}"
    );
    // `-L -t [VIP6]:80` and an edit by the IPv6 address work as for IPv4.
    let one = lab.gw.adm_ok(&["-Ln", "-t", &format!("[{VIP6}]:80")]);
    assert!(one.contains(&format!("[{VIP6}]:80")), "{one}");
    // -S writes what -R reads back, IPv6 included.
    let saved = lab.gw.adm_ok(&["-S", "-n"]);
    assert!(
        saved.contains(&format!("-A -t [{VIP6}]:80 -s rr")),
        "{saved}"
    );
    assert!(
        saved.contains(&format!(
            "-a -t [{VIP6}]:80 -r [{}]:8080 -m -w 1",
            backend_addr6(0)
        )),
        "{saved}"
    );

    // The runbook's save and restore: the IPv6 service's lines of -S,
    // the service deleted (its VIP no longer serves), the lines restored
    // with -R (it serves again, from the same backends).
    let mine: String = saved
        .lines()
        .filter(|l| l.contains(&format!("[{VIP6}]:80")))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(mine.lines().count(), 4, "{mine}");
    lab.gw.adm_ok(&["-D", "-t", &format!("[{VIP6}]:80")]);
    assert!(lab.curl(&url6("/")).is_err(), "a deleted VIP still serves");
    let (status, _, err) = lab.gw.adm_input(&["-R"], &mine);
    assert_eq!(status, 0, "{err}");
    let back: std::collections::BTreeSet<String> =
        (0..6).map(|_| lab.curl(&url6("/")).unwrap()).collect();
    assert_eq!(back.len(), 3, "restored with its three backends: {back:?}");
    assert_eq!(
        lab.gw.adm_ok(&["-S", "-n"]),
        saved,
        "-S after -R is the same"
    );

    // conntrack: -f ipv6 lists only IPv6 flows, -f ipv4 only IPv4 ones.
    let v6 = lab
        .gw
        .adm_ok(&["conntrack", "-L", "-f", "ipv6", "-o", "extended"]);
    let v4 = lab.gw.adm_ok(&["conntrack", "-L", "-f", "ipv4"]);
    assert!(v6.lines().count() > 10, "{v6}");
    assert!(
        v6.lines().all(|l| l.starts_with("ipv6     10 ")),
        "{}",
        v6.lines().next().unwrap_or("")
    );
    assert!(v6.contains(&format!("dst={VIP6} ")), "{v6}");
    assert!(v4.lines().count() > 10 && !v4.contains("2001:2:"), "{v4}");
    // conntrack -D by an IPv6 backend (the reply tuple's source): its
    // flows go, the other backends' and the IPv4 ones stay (counts as
    // bounds: a closed flow may expire meanwhile).
    let b6 = backend_addr6(0).to_string();
    let to_b6 = |l: &str| l.contains(&format!("src={b6} "));
    let before = v6.lines().filter(|l| to_b6(l)).count();
    assert!(before > 0 && before < v6.lines().count(), "{v6}");
    let (status, out, deleted) = lab.gw.adm(&["conntrack", "-D", "-r", &b6]);
    assert_eq!((status, out.as_str()), (0, ""));
    let n: usize = deleted
        .split_whitespace()
        .rev()
        .nth(5)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{deleted}"));
    assert!(
        n > 0 && n <= before && deleted.ends_with(" flow entries have been deleted.\n"),
        "{before}: {deleted}"
    );
    let (status, out, left) = lab.gw.adm(&["conntrack", "-L", "-r", &b6]);
    assert_eq!((status, out.as_str()), (0, ""));
    assert!(
        left.ends_with(" 0 flow entries have been shown.\n"),
        "{left}"
    );
    let v6_after = lab.gw.adm_ok(&["conntrack", "-L", "-f", "ipv6"]);
    assert!(v6_after.lines().count() > 0 && !v6_after.lines().any(to_b6));
    let v4_after = lab.gw.adm_ok(&["conntrack", "-L", "-f", "ipv4"]);
    assert!(v4_after.lines().count() > 10, "{v4_after}");
    // /metrics labels carry IPv6 addresses as ipvsadm writes them.
    let metrics = lab.gw.get("/metrics");
    assert!(
        metrics.contains(&format!(
            "vip=\"{VIP6}\",port=\"80\",backend=\"[{}]:8080\"",
            backend_addr6(0)
        )),
        "{}",
        &metrics[..metrics.len().min(3000)]
    );
    // Flow events filtered by an IPv6 service, as ipvsadm writes it.
    let news = lab.gw.adm_ok(&[
        "observe",
        "--verdict",
        "NEW",
        "--service",
        &format!("[{VIP6}]:80"),
        "--last",
        "3",
    ]);
    assert_eq!(news.lines().count(), 3, "{news}");
    assert!(
        news.lines()
            .all(|l| l.contains(&format!("-> [{VIP6}]:80 NEW"))),
        "{news}"
    );
    let line = lab.gw.stop_counters();
    eprintln!("{line}");
}

/// ping6 of the VIP answers; a VIP nobody serves on IPv6 gets nothing
/// from xvs (the kernel's own IPv6 traffic is left alone: the gateway's
/// addresses still answer).
#[test]
fn ping6_of_the_vip_and_the_gateways_own_ipv6_still_answer() {
    if !privileged("ping6_of_the_vip_and_the_gateways_own_ipv6_still_answer") {
        return;
    }
    let lab = lab("");
    let ping = |to: &str| {
        lab.t
            .client
            .ns
            .exec("ping", &["-6", "-c", "3", "-i", "0.2", "-W", "1", to])
    };
    let out = ping(&VIP6.to_string()).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("3 received"), "{text}");
    // The gateway kernel's own address (not steered).
    let out = ping("2001:2::1").unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 received"));
    let steered = lab.gw.steered();
    assert!(
        steered.iter().any(|s| s.contains(&VIP6.to_string())),
        "{steered:?}"
    );
    assert!(
        !steered.iter().any(|s| s.contains("2001:2::1")),
        "{steered:?}"
    );
}

/// Neighbour discovery every way, from empty caches: xvs's own at its
/// start (it solicits its backends from its SNAT address); the backends'
/// flushed, so the first connection needs them to solicit the SNAT
/// address; and a VIP on the client's own link (a load-balancer address
/// announced on L2), which the client solicits. xvs answers both with
/// the gateway's Ethernet address.
#[test]
fn neighbour_resolution_from_empty_caches() {
    if !privileged("neighbour_resolution_from_empty_caches") {
        return;
    }
    let lab = lab("");
    for b in &lab.t.backends {
        let _ = b.ns.ip(&["-6", "neigh", "flush", "all"]);
    }
    let _ = lab.t.client.ns.ip(&["-6", "neigh", "flush", "all"]);
    assert!(lab.curl(&url6("/")).is_ok());
    let gw_mac = lab.t.gateway.mac(&lab.t.gateway_client_if).unwrap();
    let mac = gw_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let b0 = lab.t.backends[0]
        .ns
        .ip(&["-6", "neigh", "show", &SNAT_ADDR6.to_string()])
        .unwrap();
    let b0 = String::from_utf8_lossy(&b0.stdout);
    assert!(
        b0.contains(&mac),
        "b0's entry for the SNAT address: {b0:?}, gateway {mac}"
    );
    // A VIP in the client's /64: no router between, the client asks for
    // it with a solicitation to its solicited-node group.
    let on_link = "2001:2::80";
    let svc = format!("[{on_link}]:80");
    lab.gw.adm_ok(&["-A", "-t", &svc, "-s", "rr"]);
    let b = format!("[{}]:8080", backend_addr6(0));
    lab.gw.adm_ok(&["-a", "-t", &svc, "-r", &b, "-m"]);
    let _ = lab.t.client.ns.ip(&["-6", "neigh", "flush", "all"]);
    let url = format!("http://[{on_link}]/");
    assert!(lab.curl(&url).is_ok(), "{url}");
    let client = lab
        .t
        .client
        .ns
        .ip(&["-6", "neigh", "show", on_link])
        .unwrap();
    let client = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.contains(&mac),
        "the client's entry for the on-link VIP: {client:?}, gateway {mac}"
    );
}

/// kube-proxy's REJECT over IPv6: with every backend at weight 0, a TCP
/// connection is refused at once (RST) and a UDP request gets an ICMPv6
/// port unreachable (the client's socket sees ECONNREFUSED).
#[test]
fn reject_with_rst_and_icmpv6_port_unreachable() {
    if !privileged("reject_with_rst_and_icmpv6_port_unreachable") {
        return;
    }
    let lab = lab("");
    for i in 0..3 {
        let b = format!("[{}]:8080", backend_addr6(i));
        lab.gw.adm_ok(&[
            "-e",
            "-t",
            &format!("[{VIP6}]:80"),
            "-r",
            &b,
            "-m",
            "-w",
            "0",
        ]);
        let b = format!("[{}]:5353", backend_addr6(i));
        lab.gw.adm_ok(&[
            "-e",
            "-u",
            &format!("[{VIP6}]:53"),
            "-r",
            &b,
            "-m",
            "-w",
            "0",
        ]);
    }
    let err = lab.curl(&url6("/")).unwrap_err();
    assert!(
        err.contains("Connection refused") || err.contains("Couldn't connect"),
        "{err}"
    );
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\ns.settimeout(2)\ns.connect(('{VIP6}', 53))\ns.send(b'x')\ntry:\n    s.recv(100)\n    print('answered')\nexcept ConnectionRefusedError:\n    print('refused')\nexcept socket.timeout:\n    print('timeout')\n"
    );
    let out = lab.t.client.ns.exec("python3", &["-c", &script]).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "refused");
    // IPv4 is untouched by the IPv6 edits.
    assert!(lab.curl(&format!("http://{VIP4}/")).is_ok());
    let line = lab.gw.stop_counters();
    assert!(field(&line, "rejected").unwrap() >= 2, "{line}");
}

/// Weight 0 and a delete under a `Connection: close` wrk load over IPv6:
/// the quiesced backend accepts nothing new while its keep-alive
/// connections go on; the deleted one accepts nothing new; no request
/// fails.
#[test]
fn weight_zero_and_live_edits_under_ipv6_load() {
    if !privileged("weight_zero_and_live_edits_under_ipv6_load") {
        return;
    }
    let lab = lab("");
    let svc = format!("[{VIP6}]:80");
    let load = lab.wrk(&url6("/"), 5, true);
    let kept = lab.wrk(&url6("/"), 5, false);
    std::thread::sleep(Duration::from_secs(2));
    let b2 = format!("[{}]:8080", backend_addr6(2));
    lab.gw
        .adm_ok(&["-e", "-t", &svc, "-r", &b2, "-m", "-w", "0"]);
    std::thread::sleep(Duration::from_millis(300));
    let b2_at = lab.accepted(2);
    let status_before = lab.nginx[2].status().unwrap();
    let (r1, e1, n1) = load.join().unwrap();
    let (_, e2, n2) = kept.join().unwrap();
    let status_after = lab.nginx[2].status().unwrap();
    assert!(r1 > 200, "{r1}");
    assert_eq!((e1, n1, e2, n2), (0, 0, 0, 0));
    assert_eq!(
        lab.accepted(2),
        b2_at + 2,
        "the quiesced backend accepted new connections (two are the status queries)"
    );
    assert!(
        status_after.requests > status_before.requests + 50,
        "b2's keep-alive connections stopped: {status_before:?} -> {status_after:?}"
    );

    let load = lab.wrk(&url6("/"), 4, true);
    std::thread::sleep(Duration::from_secs(1));
    let b1 = format!("[{}]:8080", backend_addr6(1));
    lab.gw.adm_ok(&["-d", "-t", &svc, "-r", &b1]);
    std::thread::sleep(Duration::from_millis(300));
    let b1_at = lab.accepted(1);
    let (r3, e3, n3) = load.join().unwrap();
    assert!(r3 > 100);
    // Connections in flight to the deleted backend end there (IPVS's
    // expire_nodest_conn, which kube-proxy sets): at most wrk's 16.
    assert!(e3 <= 16 && n3 == 0, "{e3} errors, {n3} non-2xx");
    assert_eq!(
        lab.accepted(1),
        b1_at,
        "the deleted backend accepted new connections"
    );
    let line = lab.gw.stop_counters();
    eprintln!("{line}");
    assert_eq!(drops(&line, "conntrack_full"), 0);
}

/// PMTU discovery through xvs: the backend sits behind two routers joined
/// by a 1280-byte link (both ends of every other link 1500, so both TCP
/// ends advertise 1440-byte segments). The first router answers the
/// client's large segments with packet too big, sent to xvs's SNAT
/// address; xvs translates it to the client, which lowers its path MTU:
/// echoed transfers of 300 KB in both directions complete.
#[test]
fn ipv6_pmtu_discovery_through_a_1280_link_completes_transfers() {
    if !privileged("ipv6_pmtu_discovery_through_a_1280_link_completes_transfers") {
        return;
    }
    let t = Topology::build(Spec::one_arm(0)).unwrap();
    let r1 = Netns::create(&t.tag, "r1").unwrap();
    let r2 = Netns::create(&t.tag, "r2").unwrap();
    let far = Netns::create(&t.tag, "far").unwrap();
    let backend = "2001:2:0:3::10";
    // switch <-> r1 (1500) <-> r2 (1280) <-> far backend (1500)
    link(t.switch(), "p-r1", &r1, "r0").unwrap();
    t.switch()
        .ip(&["link", "set", "p-r1", "master", "br0"])
        .unwrap();
    link(&r1, "r1", &r2, "r0").unwrap();
    link(&r2, "r1", &far, "b0").unwrap();
    for (ns, i) in [(&r1, "r1"), (&r2, "r0")] {
        ns.ip(&["link", "set", i, "mtu", "1280"]).unwrap();
    }
    address(&r1, "r0", "2001:2:0:1::fe/64").unwrap();
    address(&r1, "r1", "2001:2:0:4::1/64").unwrap();
    address(&r2, "r0", "2001:2:0:4::2/64").unwrap();
    address(&r2, "r1", "2001:2:0:3::1/64").unwrap();
    address(&far, "b0", &format!("{backend}/64")).unwrap();
    for ns in [&r1, &r2] {
        ns.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
    }
    r1.ip(&[
        "-6",
        "route",
        "add",
        "2001:2:0:3::/64",
        "via",
        "2001:2:0:4::2",
    ])
    .unwrap();
    r1.ip(&["-6", "route", "add", "2001:2::/48", "via", "2001:2:0:1::1"])
        .unwrap();
    r2.ip(&["-6", "route", "add", "default", "via", "2001:2:0:4::1"])
        .unwrap();
    far.ip(&["-6", "route", "add", "default", "via", "2001:2:0:3::1"])
        .unwrap();
    // r1 answers neighbour solicitations for the far backend (xvs
    // resolves a backend on its link; the router stands in for it).
    r1.sysctl("net.ipv6.conf.all.proxy_ndp", "1").unwrap();
    r1.ip(&["-6", "neigh", "add", "proxy", backend, "dev", "r0"])
        .unwrap();
    let mut cmd = far.command(TESTNET);
    cmd.args(["serve", "--name", "far", "--tcp"])
        .arg(format!("[{backend}]:9090"));
    let _server = Spawned::start(cmd, "echo server", Duration::from_secs(5)).unwrap();
    let config = format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\npoll = \"adaptive\"\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\", \"{SNAT_ADDR6}\"]\n\n\
         [[services]]\nvip = \"{VIP6}\"\nport = 9090\nbackends = [{{ address = \"{backend}\" }}]\n",
        t.gateway_client_if
    );
    let (gw, ready) = Daemon::start(&t, "pmtu", &bins(), &config, &[]).unwrap();
    assert!(ready.starts_with("ready: 1 services"), "{ready}");
    let out = t
        .client
        .ns
        .command(TESTNET)
        .args([
            "tcp",
            "--connect",
            &format!("[{VIP6}]:9090"),
            "--connections",
            "4",
            // One at a time: a Linux client whose sibling socket learns
            // the path MTU while this one has full-size segments queued
            // drops them itself (Ip6FragFails) and recovers only by
            // retransmission backoff, 6 s and more; that is the client
            // kernel's, not the path's.
            "--concurrency",
            "1",
            "--payload",
            "300000",
            "--timeout-ms",
            "8000",
        ])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let errors = String::from_utf8_lossy(&out.stderr);
    let r1_ptb = r1.snmp6("Icmp6OutPktTooBigs").unwrap_or(0);
    let cl_frag_fails = t.client.ns.snmp6("Ip6FragFails").unwrap_or(0);
    let cl_ptb_in = t.client.ns.snmp6("Icmp6InPktTooBigs").unwrap_or(0);
    let counters = gw.stop_counters();
    eprintln!(
        "{line}\n{errors}r1 sent {r1_ptb} packet too big; the client got {cl_ptb_in} \
         and dropped {cl_frag_fails} of its own segments\n{counters}"
    );
    assert!(line.starts_with("ok=4 failed=0"), "{line}");
    assert!(
        r1_ptb >= 1,
        "the 1280 link was never hit: nothing was tested"
    );
    assert_eq!(cl_ptb_in, r1_ptb, "every packet too big reaches the client");
    // The client learned the path MTU from the translated error.
    let route = t
        .client
        .ns
        .ip(&["-6", "route", "get", &VIP6.to_string()])
        .unwrap();
    let route = String::from_utf8_lossy(&route.stdout);
    assert!(route.contains("mtu 1280"), "{route}");
}

/// IPv6 flows live in their own state file and survive kill -9 like
/// IPv4's: 20 long-lived echo streams to the IPv6 VIP (mh) go on across a
/// kill and a start, each with its backend and SNAT endpoint.
#[test]
fn ipv6_flows_survive_kill_9_and_a_restart() {
    if !privileged("ipv6_flows_survive_kill_9_and_a_restart") {
        return;
    }
    // The state outlives the daemon's own folder (removed with it).
    struct State(PathBuf);
    impl Drop for State {
        fn drop(&mut self) {
            xvs_vm_tests::daemon::unmount_under(&self.0);
            xvs_vm_tests::daemon::remove_folder(&self.0);
        }
    }
    let state = State(std::env::temp_dir().join(format!(
        "xvs-ipv6-state-{}-{}",
        std::process::id(),
        xvs_vm_tests::netns::unique_tag()
    )));
    let extra = format!(
        "[restart]\nhold = \"300ms\"\nstate_dir = \"{}\"\n",
        state.0.display()
    );
    let lab = lab(&extra);
    let mut cmd = lab.t.client.ns.command(TESTNET);
    cmd.args([
        "streams",
        "--connect",
        &format!("[{VIP6}]:9090"),
        "--connections",
        "20",
        "--seconds",
        "6",
    ]);
    let (streams, _) = Spawned::start(cmd, "streams", STREAMS_READY).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let before = lab.gw.adm_ok(&["-Lnc"]);
    let ours = |text: &str| -> Vec<String> {
        let mut v: Vec<String> = text
            .lines()
            .filter(|l| l.contains(&format!("[{VIP6}]:9090")))
            .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ours(&before).len(), 20, "{before}");
    let Lab { t, nginx, _udp, gw } = lab;
    let (status, _) = gw.kill(libc::SIGKILL);
    assert!(status.is_some());
    let (gw, _) = Daemon::start(&t, "ipv6", &bins(), &config(&t, &extra), &[]).unwrap();
    let restart: serde_json::Value = serde_json::from_str(&gw.get("/v1/status")).unwrap();
    let restart = &restart["restart"];
    assert!(
        restart["state_files"].as_array().is_some_and(|f| f
            .iter()
            .any(|p| p.as_str().unwrap_or("").ends_with(".flows6"))),
        "{restart}"
    );
    assert!(
        restart["adopted_flows"].as_u64().unwrap_or(0) >= 20,
        "{restart}"
    );
    assert_eq!(restart["adopted_dropped"].as_u64(), Some(0), "{restart}");
    let after = gw.adm_ok(&["-Lnc"]);
    // Same client, backend and SNAT endpoint for each (state and expiry
    // columns aside).
    let ends = |v: Vec<String>| -> Vec<String> {
        v.iter()
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(ends(ours(&before)), ends(ours(&after)));
    let (_, out) = streams.wait(Duration::from_secs(60));
    let summary = out.lines().find(|l| l.starts_with("ok=")).unwrap_or("");
    assert!(summary.starts_with("ok=20 failed=0"), "{out}");
    drop((nginx, _udp));
}

/// A client's SYN with hop limit 1 (its socket's IPV6_UNICAST_HOPS) to
/// the IPv6 VIP creates no flow and is answered with an ICMPv6 time
/// exceeded, which the client's kernel counts; hop limit 2 goes through.
#[test]
fn hop_limit_1_syns_create_no_flow_and_get_time_exceeded() {
    if !privileged("hop_limit_1_syns_create_no_flow_and_get_time_exceeded") {
        return;
    }
    let lab = lab("");
    let connect = |hops: u32| -> String {
        let script = format!(
            "import socket\ns=socket.socket(socket.AF_INET6, socket.SOCK_STREAM)\n\
             s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, {hops})\n\
             s.settimeout(1.5)\ntry:\n    s.connect(('{VIP6}', 80))\n    print('connected')\n\
             except OSError as e:\n    print('failed', e)\n"
        );
        let out = lab.t.client.ns.exec("python3", &["-c", &script]).unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let before = lab.t.client.ns.snmp6("Icmp6InTimeExcds").unwrap();
    let r = connect(1);
    assert!(r.starts_with("failed"), "{r}");
    let after = lab.t.client.ns.snmp6("Icmp6InTimeExcds").unwrap();
    assert!(after > before, "no ICMPv6 time exceeded reached the client");
    let flows = lab.gw.adm_ok(&["-Lnc"]);
    assert!(!flows.contains(&format!("[{VIP6}]:80")), "{flows}");
    assert_eq!(connect(2), "connected");
    let line = lab.gw.stop_counters();
    assert!(field(&line, "time_exceeded").unwrap() >= 1, "{line}");
}
