//! Direct routing (ipvsadm's `-g`) on the real AF_XDP path: backends on
//! the gateway's segment hold the VIP on `lo` with `arp_ignore = 1` and
//! `arp_announce = 2`, as LVS-DR real servers are set up, and answer the
//! client straight over the switch; xvs sees only the client's half of
//! each connection: with the project's echo client, with nginx, curl and
//! wrk, and across a `kill -9` of xvs; the same over IPv6 (the VIP on
//! the real servers' `lo`, no neighbour answer for it). A mixed service
//! (one route, one masq backend) serves both ways at once.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::time::Duration;

use xvs_vm_tests::daemon::{self, field_of as field, Daemon};
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{
    backend_addr, backend_addr6, one_arm_head, one_arm_head_dual, Spec, Topology, VIP6,
};
use xvs_vm_tests::wrk::Wrk;

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";

fn bins() -> PathBuf {
    daemon::bins(TESTNET)
}

/// Makes backend `i` an LVS-DR real server of the VIP.
fn real_server(t: &Topology, i: usize) {
    t.lvs_real_server(i, VIP.parse().unwrap()).unwrap();
}

/// An echo server named `name` in backend `i` on `on`.
fn serve(t: &Topology, i: usize, name: &str, on: &str) -> Spawned {
    let mut cmd = t.backends[i].ns.command(TESTNET);
    cmd.args(["serve", "--name", name, "--tcp", on]);
    let (s, line) = Spawned::start(cmd, "echo server", Duration::from_secs(5)).unwrap();
    assert_eq!(line, format!("ready {name}"));
    s
}

fn config(t: &Topology, backends: &str) -> String {
    format!(
        "{}\n[[services]]\nvip = \"{VIP}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{backends}]\n",
        one_arm_head(t, 1)
    )
}

/// `addrs` as route backends of the VIP's port.
fn route_backends_of<T: std::fmt::Display>(addrs: impl IntoIterator<Item = T>) -> String {
    addrs
        .into_iter()
        .map(|a| format!("{{ address = \"{a}\", forward = \"route\" }}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The backends of `t` as route backends of the VIP's port.
fn route_backends(t: &Topology) -> String {
    route_backends_of((0..t.backends.len()).map(backend_addr))
}

/// nginx real servers through xvs (`xvs`, started as `name` from `text`):
/// ten curls to `url` reach both; then wrk with keep-alive and with
/// `Connection: close` while xvs is killed (`kill -9`) and started again:
/// the new instance adopts the flows, wrk sees no error, and both real
/// servers answered the load.
fn curl_and_wrk_across_kill_9(
    t: &Topology,
    xvs: Daemon,
    (name, text): (&str, &str),
    url: &str,
    nginx: &[Nginx],
) {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let out = t.client.ns.exec("curl", &["-sf", "-m", "2", url]).unwrap();
        assert!(out.status.success(), "curl: {out:?}");
        seen.insert(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["b0", "b1"]);
    let kept = Wrk::start(&t.client.ns, url, 8, false);
    let closed = Wrk::start(&t.client.ns, url, 8, true);
    std::thread::sleep(Duration::from_secs(3));
    let (status, _) = xvs.kill(libc::SIGKILL);
    assert!(status.is_some());
    let (xvs, _) = Daemon::start(t, name, &bins(), text, &[]).unwrap();
    let status: serde_json::Value = serde_json::from_str(&xvs.get("/v1/status")).unwrap();
    assert!(
        status["restart"]["adopted_flows"].as_u64().unwrap_or(0) >= 16,
        "{status}"
    );
    for (what, w) in [("keep-alive", kept), ("Connection: close", closed)] {
        let w = w.join().unwrap();
        assert!(w.requests > 500, "{what}: {}", w.text);
        assert_eq!((w.errors, w.non_2xx), (0, 0), "{what}: {}", w.text);
    }
    // Both real servers answered the load, every request through xvs.
    for n in nginx {
        let s = n.status().unwrap();
        assert!(s.requests > 100, "{}: {s:?}", n.name);
    }
    xvs.stop_accounted();
}

fn client_tcp(t: &Topology, connections: usize) -> String {
    t.tcp_load_payload(TESTNET, &format!("{VIP}:80"), connections, 1000)
}

/// 200 echo connections from the client to `to`, 100 answered by each
/// echo server (`b0`, `b1`): the TCP segments the client sent and
/// received meanwhile.
fn echo_200(t: &Topology, to: &str) -> (u64, u64) {
    let out_before = t.client.ns.tcp_segments_sent_settled().unwrap();
    let in_before = t.client.ns.snmp("Tcp", "InSegs").unwrap();
    let summary = t.tcp_load_payload(TESTNET, to, 200, 1000);
    assert!(summary.starts_with("ok=200 failed=0 by="), "{summary}");
    assert!(
        summary.contains("b0:100") && summary.contains("b1:100"),
        "{summary}"
    );
    let sent = t.client.ns.tcp_segments_sent_settled().unwrap() - out_before;
    (sent, t.client.ns.snmp("Tcp", "InSegs").unwrap() - in_before)
}

#[test]
fn direct_routing_replies_bypass_xvs() {
    if !privileged("direct_routing_replies_bypass_xvs") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let mut servers = Vec::new();
    for i in 0..2 {
        real_server(&t, i);
        servers.push(serve(&t, i, &format!("b{i}"), &format!("{VIP}:80")));
    }
    let backends = route_backends(&t);
    let (xvs, ready) = Daemon::start(&t, "dr", &bins(), &config(&t, &backends), &[]).unwrap();
    assert!(ready.starts_with("ready: 1 services on g0"), "{ready}");
    // The listing shows the method as ipvsadm does, and -S carries it.
    let list = xvs.adm_ok(&["-Ln"]);
    assert!(
        list.contains(&format!("  -> {}:80", backend_addr(0))) && list.contains("Route"),
        "{list}"
    );
    let saved = xvs.adm_ok(&["-Sn"]);
    assert!(
        saved.contains(&format!("-r {}:80 -g -w 1", backend_addr(0))),
        "{saved}"
    );

    let (sent, received) = echo_200(&t, &format!("{VIP}:80"));
    // Conntrack keeps the client's direction only: no reply counted.
    let conns = xvs.adm_ok(&["-Lnc"]);
    assert!(
        conns.contains("ESTABLISHED") || conns.contains("FIN_WAIT") || conns.contains("CLOSE"),
        "{conns}"
    );
    let line = xvs.stop_accounted();
    // xvs forwarded exactly the client's segments, and nothing else: the
    // backends' answers (as many segments again) reached the client
    // without it.
    assert_eq!(field(&line, "forwarded"), sent, "{line}");
    assert!(received >= 3 * 200, "client received {received} segments");
    assert_eq!(field(&line, "new_flows"), 200, "{line}");
    drop(servers);
}

#[test]
fn a_mixed_service_routes_one_backend_and_masquerades_the_other() {
    if !privileged("a_mixed_service_routes_one_backend_and_masquerades_the_other") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    real_server(&t, 0);
    let _dr = serve(&t, 0, "dr", &format!("{VIP}:80"));
    let _nat = serve(&t, 1, "nat", &format!("{}:8080", backend_addr(1)));
    let backends = format!(
        "{{ address = \"{}\", forward = \"route\" }}, {{ address = \"{}\", port = 8080, forward = \"masq\" }}",
        backend_addr(0),
        backend_addr(1)
    );
    let (xvs, _) = Daemon::start(&t, "mixed", &bins(), &config(&t, &backends), &[]).unwrap();
    let list = xvs.adm_ok(&["-Ln"]);
    assert!(list.contains("Route") && list.contains("Masq"), "{list}");
    let summary = client_tcp(&t, 100);
    assert!(summary.starts_with("ok=100 failed=0 by="), "{summary}");
    assert!(
        summary.contains("dr:50") && summary.contains("nat:50"),
        "{summary}"
    );
    let line = xvs.stop_accounted();
    assert_eq!(field(&line, "new_flows"), 100, "{line}");
}

#[test]
fn xvsadm_adds_route_and_tunnel_real_servers_as_ipvsadm_does() {
    if !privileged("xvsadm_adds_route_and_tunnel_real_servers_as_ipvsadm_does") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let (xvs, _) = Daemon::start(&t, "adm", &bins(), &config(&t, ""), &[]).unwrap();
    let svc = format!("{VIP}:80");
    // No method: ipvsadm's default, gatewaying; its port is forced to the
    // service's, as ipvsadm does.
    xvs.adm_ok(&["-a", "-t", &svc, "-r", &format!("{}:8080", backend_addr(0))]);
    xvs.adm_ok(&[
        "-a",
        "-t",
        &svc,
        "-r",
        &backend_addr(1).to_string(),
        "-i",
        "--tun-type",
        "gue",
        "--tun-port",
        "6080",
    ]);
    let list = xvs.adm_ok(&["-Ln", "--tun-info"]);
    assert!(
        list.contains(&format!("  -> {}:80", backend_addr(0))),
        "{list}"
    );
    assert!(
        list.contains("Route") && list.contains("Tunnel") && list.contains("gue:6080"),
        "{list}"
    );
    let saved = xvs.adm_ok(&["-Sn"]);
    assert!(
        saved.contains(&format!("-r {}:80 -g -w 1", backend_addr(0))),
        "{saved}"
    );
    assert!(
        saved.contains(&format!(
            "-r {}:80 -i --tun-type gue --tun-port 6080 --tun-nocsum -w 1",
            backend_addr(1)
        )),
        "{saved}"
    );
    // -S output restores to the same listing.
    xvs.adm_ok(&["-C"]);
    let (code, _, err) = xvs.adm_input(&["-R"], &saved);
    assert_eq!(code, 0, "{err}");
    assert_eq!(xvs.adm_ok(&["-Sn"]), saved);
    // A route backend off the gateway's segments is refused, saying why.
    let (code, _, err) = xvs.adm(&["-a", "-t", &svc, "-r", "198.18.9.9", "-g"]);
    assert_ne!(code, 0);
    assert!(err.contains("not on a directly connected segment"), "{err}");
    xvs.stop_accounted();
}

/// The operator's own clients through direct routing: nginx real servers
/// listening on the VIP, curl seeing both, and wrk with keep-alive and
/// `Connection: close` connections without one error, also while xvs is
/// killed (`kill -9`) and started again: the next instance adopts the
/// one-way flows, and the backends' answers never needed xvs.
#[test]
fn nginx_curl_and_wrk_through_direct_routing_across_kill_9() {
    if !privileged("nginx_curl_and_wrk_through_direct_routing_across_kill_9") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let vip: std::net::Ipv4Addr = VIP.parse().unwrap();
    let mut nginx = Vec::new();
    for i in 0..2 {
        real_server(&t, i);
        nginx.push(Nginx::start(&t.backends[i].ns, vip, 80, &format!("b{i}")).unwrap());
    }
    // The flow state outlives each instance's own folder.
    let state = daemon::ScratchDir::new(&t, "dr-real-state").unwrap();
    let text = format!(
        "{}\n[restart]\nhold = \"5s\"\nstate_dir = \"{}\"\n",
        config(&t, &route_backends(&t)),
        state.path().display()
    );
    let (xvs, _) = Daemon::start(&t, "dr-real", &bins(), &text, &[]).unwrap();
    curl_and_wrk_across_kill_9(
        &t,
        xvs,
        ("dr-real", &text),
        &format!("http://{VIP}/"),
        &nginx,
    );
}

/// IPv6 direct routing end to end, as the IPv4 tests above do it: LVS-DR
/// real servers with the IPv6 VIP on `lo`; the project's echo client's
/// 200 connections answered by both, straight from the backends (xvs
/// forwards exactly the client's segments); then nginx on the VIP, curl
/// reaching both real servers, and wrk keep-alive and `Connection:
/// close` with 0 errors across a `kill -9` of xvs and a start that adopts
/// the one-way IPv6 flows.
#[test]
fn ipv6_direct_routing_with_the_echo_client_nginx_curl_and_wrk_across_kill_9() {
    if !privileged("ipv6_direct_routing_with_the_echo_client_nginx_curl_and_wrk_across_kill_9") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    for i in 0..2 {
        t.lvs_real_server6(i, VIP6).unwrap();
    }
    let backends = route_backends_of((0..2).map(backend_addr6));
    let state = daemon::ScratchDir::new(&t, "dr6-state").unwrap();
    let text = format!(
        "{}\n[restart]\nhold = \"5s\"\nstate_dir = \"{}\"\n\n\
         [[services]]\nvip = \"{VIP6}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{backends}]\n",
        one_arm_head_dual(&t, 1),
        state.path().display()
    );
    let (xvs, ready) = Daemon::start(&t, "dr6", &bins(), &text, &[]).unwrap();
    assert!(ready.starts_with("ready: 1 services on g0"), "{ready}");
    let list = xvs.adm_ok(&["-Ln"]);
    assert!(
        list.contains(&format!("  -> [{}]:80", backend_addr6(0))) && list.contains("Route"),
        "{list}"
    );

    // The echo client: every answer from a backend, none through xvs.
    let servers: Vec<Spawned> = (0..2)
        .map(|i| serve(&t, i, &format!("b{i}"), &format!("[{VIP6}]:80")))
        .collect();
    let (sent, received) = echo_200(&t, &format!("[{VIP6}]:80"));
    let conns = xvs.adm_ok(&["-Lnc"]);
    assert!(conns.contains(&format!("[{VIP6}]:80")), "{conns}");
    let line = xvs.stop_accounted();
    assert_eq!(field(&line, "forwarded"), sent, "{line}");
    assert_eq!(field(&line, "new_flows"), 200, "{line}");
    assert!(received >= 3 * 200, "client received {received} segments");
    drop(servers);

    // nginx real servers on the VIP, curl and wrk, xvs killed mid-load.
    let on = [std::net::SocketAddr::new(VIP6.into(), 80)];
    let nginx: Vec<Nginx> = (0..2)
        .map(|i| Nginx::start_on(&t.backends[i].ns, &on, &format!("b{i}")).unwrap())
        .collect();
    let (xvs, _) = Daemon::start(&t, "dr6", &bins(), &text, &[]).unwrap();
    curl_and_wrk_across_kill_9(
        &t,
        xvs,
        ("dr6", &text),
        &format!("http://[{VIP6}]/"),
        &nginx,
    );
}
