//! Tunnels (ipvsadm's `-i`) on the real AF_XDP path: xvs wraps the
//! client's packets in IPv4-in-IPv4, IPv6-in-IPv6 or GUE (either family)
//! to real servers that hold the VIP on `lo` and answer the client
//! straight over the segment. This kernel has neither `ipip` nor `fou`,
//! so each backend decapsulates with `xvs-testnet decap` (raw sockets of
//! protocol 4 and of IPv6 next header 41, and a GUE UDP socket, feeding a
//! TUN device), which does what those interfaces' receive paths do. A large upload shows the fragmentation-needed path: 1500-byte
//! client packets no longer fit a 1500-byte backend link once wrapped.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use xvs_vm_tests::daemon::{self, field_of as field, Daemon};
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{
    backend_addr, backend_addr6, one_arm_head, one_arm_head_dual, Spec, Topology, VIP6,
};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";
/// The longest each backend's decapsulator runs: the test stops it
/// (SIGTERM) once its traffic is through, so this only bounds a test
/// that fails before then.
const DECAP_SECONDS: u64 = 120;

/// Backend `i` as a tunnel real server: the VIP on `lo` (`vip6`: the
/// IPv6 VIP instead), a decapsulator on TUN device `xt0` (up, no
/// reverse-path filter: the inner packets' client is reached over `b0`),
/// and an echo server named `name` on the VIP's port. Returns the
/// decapsulator and the server.
fn tunnel_server_of(t: &Topology, i: usize, name: &str, vip6: bool) -> (Spawned, Spawned) {
    let listen = if vip6 {
        t.lvs_real_server6(i, VIP6).unwrap();
        format!("[{VIP6}]:80")
    } else {
        t.lvs_real_server(i, VIP.parse().unwrap()).unwrap();
        format!("{VIP}:80")
    };
    let ns = &t.backends[i].ns;
    let mut cmd = ns.command(TESTNET);
    cmd.args(["decap", "--tun", "xt0", "--seconds"])
        .arg(DECAP_SECONDS.to_string());
    let (decap, line) = Spawned::start(cmd, "decap", Duration::from_secs(5)).unwrap();
    assert_eq!(line, "ready");
    ns.ip(&["link", "set", "xt0", "up"]).unwrap();
    for dev in ["all", "default", "xt0"] {
        ns.sysctl(&format!("net.ipv4.conf.{dev}.rp_filter"), "0")
            .unwrap();
    }
    let mut cmd = ns.command(TESTNET);
    cmd.args(["serve", "--name", name, "--tcp", &listen]);
    let (server, line) = Spawned::start(cmd, "echo server", Duration::from_secs(5)).unwrap();
    assert_eq!(line, format!("ready {name}"));
    (decap, server)
}

/// [`tunnel_server_of`] for the IPv4 VIP.
fn tunnel_server(t: &Topology, i: usize, name: &str) -> (Spawned, Spawned) {
    tunnel_server_of(t, i, name, false)
}

/// Stops a decapsulator (all the test's traffic is through) and returns
/// what it passed on: `[ipip, gue, ip6ip6]`.
fn decapsulated(decap: Spawned) -> [u64; 3] {
    let (_, out) = decap.stop(libc::SIGTERM, Duration::from_secs(5));
    let line = out
        .lines()
        .find(|l| l.starts_with("decapsulated "))
        .unwrap_or_else(|| panic!("decap printed {out:?}"));
    ["ipip", "gue", "ip6ip6"].map(|k| daemon::field(line, k).unwrap())
}

/// 200 connections to `to`, served by two tunnel real servers: each
/// server's echo name and the encapsulation it must receive alone (its
/// index in [`decapsulated`]'s counts), and their decapsulators. Every
/// connection works, 100 to each; xvs forwards exactly the client's
/// segments, none too big; each server decapsulated at least its
/// connections' segments of its own encapsulation and none of another;
/// every forwarded packet was passed on.
fn two_servers_each_decapsulate_their_own(
    t: &Topology,
    xvs: Daemon,
    to: &str,
    servers: [(&str, usize); 2],
    decaps: [Spawned; 2],
) {
    let out_before = t.client.ns.tcp_segments_sent_settled().unwrap();
    let summary = t.tcp_load_payload(TESTNET, to, 200, 1000);
    let mut names = servers.map(|(name, _)| format!("{name}:100"));
    names.sort();
    assert_eq!(summary, format!("ok=200 failed=0 by={}", names.join(",")));
    let sent = t.client.ns.tcp_segments_sent_settled().unwrap() - out_before;
    let line = xvs.stop_accounted();
    assert_eq!(field(&line, "forwarded"), sent, "{line}");
    assert_eq!(field(&line, "too_big"), 0, "{line}");
    let mut passed = 0;
    for ((name, own), decap) in servers.into_iter().zip(decaps) {
        let counts = decapsulated(decap);
        for (kind, &n) in counts.iter().enumerate() {
            match kind == own {
                true => assert!(n >= 100 * 3, "{name}: {counts:?} (ipip, gue, ip6ip6)"),
                false => assert_eq!(n, 0, "{name}: {counts:?} (ipip, gue, ip6ip6)"),
            }
        }
        passed += counts[own];
    }
    // Every forwarded packet reached a backend and was passed on.
    assert_eq!(passed, sent);
}

fn config(t: &Topology, backends: &str) -> String {
    format!(
        "{}\n[[services]]\nvip = \"{VIP}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{backends}]\n",
        one_arm_head(t, 1)
    )
}

/// [`config`] for the IPv6 VIP (with an IPv6 SNAT address beside the
/// IPv4 one).
fn config6(t: &Topology, backends: &str) -> String {
    format!(
        "{}\n[[services]]\nvip = \"{VIP6}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{backends}]\n",
        one_arm_head_dual(t, 1)
    )
}

/// One service, an IPIP and a GUE real server: every connection works,
/// xvs forwards exactly the client's segments (the answers bypass it),
/// and each backend received its own encapsulation only.
#[test]
fn ipip_and_gue_real_servers_answer_the_client_themselves() {
    if !privileged("ipip_and_gue_real_servers_answer_the_client_themselves") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let (decap0, _s0) = tunnel_server(&t, 0, "ipip");
    let (decap1, _s1) = tunnel_server(&t, 1, "gue");
    let backends = format!(
        "{{ address = \"{}\", forward = \"tunnel\" }}, {{ address = \"{}\", forward = \"tunnel\", encap = \"gue\" }}",
        backend_addr(0),
        backend_addr(1)
    );
    let (xvs, _) = Daemon::start(
        &t,
        "tun",
        &daemon::bins(TESTNET),
        &config(&t, &backends),
        &[],
    )
    .unwrap();
    let list = xvs.adm_ok(&["-Ln", "--tun-info"]);
    assert!(
        list.contains("Tunnel") && list.contains("ipip") && list.contains("gue:6080"),
        "{list}"
    );
    let to = format!("{VIP}:80");
    two_servers_each_decapsulate_their_own(
        &t,
        xvs,
        &to,
        [("ipip", 0), ("gue", 1)],
        [decap0, decap1],
    );
}

/// The same over IPv6: an IPv6-in-IPv6 and a GUE-over-IPv6 real server
/// of the IPv6 VIP. Every connection works, xvs forwards exactly the
/// client's segments, and each backend received its own encapsulation
/// only.
#[test]
fn ip6ip6_and_gue6_real_servers_answer_the_client_themselves() {
    if !privileged("ip6ip6_and_gue6_real_servers_answer_the_client_themselves") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let (decap0, _s0) = tunnel_server_of(&t, 0, "ip6ip6", true);
    let (decap1, _s1) = tunnel_server_of(&t, 1, "gue6", true);
    let backends = format!(
        "{{ address = \"{}\", forward = \"tunnel\" }}, \
         {{ address = \"{}\", forward = \"tunnel\", encap = \"gue\" }}",
        backend_addr6(0),
        backend_addr6(1)
    );
    let text = config6(&t, &backends);
    let (xvs, _) = Daemon::start(&t, "tun6", &daemon::bins(TESTNET), &text, &[]).unwrap();
    let list = xvs.adm_ok(&["-Ln", "--tun-info"]);
    assert!(
        list.contains(&format!("  -> [{}]:80", backend_addr6(0)))
            && list.contains("Tunnel")
            && list.contains("gue:6080"),
        "{list}"
    );
    let to = format!("[{VIP6}]:80");
    two_servers_each_decapsulate_their_own(
        &t,
        xvs,
        &to,
        [("ip6ip6", 2), ("gue6", 1)],
        [decap0, decap1],
    );
}

/// Four uploads of 2 MB to `to` through the tunnel real server `name`
/// (its decapsulator `decap`, which counts them at `index` of
/// [`decapsulated`]): every byte arrives, the client's route to the VIP
/// (`ip ROUTE_GET`) ends with path MTU `mtu`, xvs answered at least one
/// too-big packet, and at least the 8 MB in segments of at most 1440
/// bytes went through the tunnel.
fn uploads_lower_the_path_mtu(
    t: &Topology,
    xvs: Daemon,
    (to, route_get): (&str, &[&str]),
    (name, index, decap): (&str, usize, Spawned),
    mtu: u32,
) {
    let summary = t.tcp_load_payload(TESTNET, to, 4, 2_000_000);
    assert_eq!(summary, format!("ok=4 failed=0 by={name}:4"));
    let route = t.client.ns.ip(route_get).unwrap();
    let route = String::from_utf8_lossy(&route.stdout).into_owned();
    assert!(route.contains(&format!("mtu {mtu}")), "{route}");
    let line = xvs.stop_accounted();
    assert!(field(&line, "too_big") >= 1, "{line}");
    assert!(
        field(&line, "answered") >= field(&line, "too_big"),
        "{line}"
    );
    let passed = decapsulated(decap)[index];
    assert!(
        passed >= 4 * 2_000_000 / 1440,
        "only {passed} packets decapsulated"
    );
}

/// Uploads of 2 MB through an IPIP real server whose link has the
/// client's MTU (1500): the first full-size segments do not fit once
/// wrapped, xvs answers fragmentation needed with 1480, the client's
/// kernel lowers its path MTU to the VIP and every byte arrives.
#[test]
fn a_large_upload_through_a_tunnel_lowers_the_client_s_path_mtu() {
    if !privileged("a_large_upload_through_a_tunnel_lowers_the_client_s_path_mtu") {
        return;
    }
    let t = Topology::build(Spec::one_arm(1)).unwrap();
    let (decap, _server) = tunnel_server(&t, 0, "ipip");
    let backends = format!(
        "{{ address = \"{}\", forward = \"tunnel\" }}",
        backend_addr(0)
    );
    let text = config(&t, &backends);
    let (xvs, _) = Daemon::start(&t, "tun-mtu", &daemon::bins(TESTNET), &text, &[]).unwrap();
    let to = format!("{VIP}:80");
    let route_get: &[&str] = &["route", "get", VIP];
    uploads_lower_the_path_mtu(&t, xvs, (&to, route_get), ("ipip", 0, decap), 1480);
}

/// The same over IPv6: uploads of 2 MB through an IPv6-in-IPv6 real
/// server whose link has the client's MTU (1500): xvs answers packet too
/// big with 1460 (the outer header's 40 bytes less), the client's kernel
/// lowers its path MTU to the VIP and every byte arrives.
#[test]
fn a_large_upload_through_an_ipv6_tunnel_lowers_the_client_s_path_mtu() {
    if !privileged("a_large_upload_through_an_ipv6_tunnel_lowers_the_client_s_path_mtu") {
        return;
    }
    let t = Topology::build(Spec::one_arm(1)).unwrap();
    let (decap, _server) = tunnel_server_of(&t, 0, "ip6ip6", true);
    let backends = format!(
        "{{ address = \"{}\", forward = \"tunnel\" }}",
        backend_addr6(0)
    );
    let text = config6(&t, &backends);
    let (xvs, _) = Daemon::start(&t, "tun6-mtu", &daemon::bins(TESTNET), &text, &[]).unwrap();
    let to = format!("[{VIP6}]:80");
    let vip6 = VIP6.to_string();
    let route_get: &[&str] = &["-6", "route", "get", &vip6];
    uploads_lower_the_path_mtu(&t, xvs, (&to, route_get), ("ip6ip6", 2, decap), 1460);
}
