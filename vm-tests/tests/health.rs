//! Real-server health checks end to end, one test per check kind: a
//! backend that fails its check leaves the rotation within `fall ×
//! interval` (weight 0 in `xvsadm -Ln`, `down` in `xvsadm health`,
//! `xvs_backend_up 0`, a `BACKEND_DOWN` event), its established
//! connections go on while it still answers them, no new connection
//! reaches it; once it passes again it comes back after `rise`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // the bound on leaving the rotation is wall-clock time

use std::time::{Duration, Instant};

use xvs_vm_tests::daemon::{self, Daemon};
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{
    backend_addr, backend_addr6, one_arm_head, one_arm_head_dual, Spec, Topology, VIP6,
};
use xvs_vm_tests::wrk::Wrk;

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";
/// Check timing: 200 ms apart, 2 to fall, 2 to rise.
const INTERVAL_MS: u64 = 200;
const FALL: u64 = 2;
const RISE: u64 = 2;

fn config(t: &Topology, check: &str) -> String {
    let addrs: Vec<String> = (0..t.backends.len())
        .map(|i| backend_addr(i).to_string())
        .collect();
    config_of(&one_arm_head(t, 1), VIP, &addrs, check)
}

/// [`config`] for the IPv6 VIP and the backends' IPv6 addresses.
fn config6(t: &Topology, check: &str) -> String {
    let addrs: Vec<String> = (0..t.backends.len())
        .map(|i| backend_addr6(i).to_string())
        .collect();
    config_of(&one_arm_head_dual(t, 1), &VIP6.to_string(), &addrs, check)
}

/// `head`, then a service on `vip`:80 whose backends are `addrs`:8080,
/// each with `check`.
fn config_of(head: &str, vip: &str, addrs: &[String], check: &str) -> String {
    let backends: Vec<String> = addrs
        .iter()
        .map(|a| {
            format!(
                "{{ address = \"{a}\", port = 8080, check = {{ {check}, interval = \"{INTERVAL_MS}ms\", timeout = \"150ms\", rise = {RISE}, fall = {FALL} }} }}"
            )
        })
        .collect();
    format!(
        "{head}\n[[services]]\nvip = \"{vip}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n",
        backends.join(", ")
    )
}

/// Waits (at most `within`) until `xvsadm health` shows `backend` in
/// `state`; how long it took.
fn wait_state(xvs: &Daemon, backend: &str, state: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let list = xvs.adm_ok(&["health"]);
        if list
            .lines()
            .any(|l| l.contains(backend) && l.split_whitespace().nth(4) == Some(state))
        {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{backend} not {state}:\n{list}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The bound on a change: `n` probes apart, plus one interval (the probe
/// in flight when the backend changed), a timeout, and room for a busy
/// machine (the supervisor's first look, xvsadm's own round trips).
fn bound(n: u64) -> Duration {
    Duration::from_millis((n + 1) * INTERVAL_MS + 150 + 1500)
}

/// The `-Ln` weight of `backend`.
fn weight(xvs: &Daemon, backend: &str) -> u32 {
    let list = xvs.adm_ok(&["-Ln"]);
    let line = list
        .lines()
        .find(|l| l.contains(backend))
        .unwrap_or_else(|| panic!("{backend} not listed:\n{list}"));
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

fn curl_names(t: &Topology, n: usize) -> Vec<String> {
    curl_names_at(t, &format!("http://{VIP}/"), n)
}

/// The backend names `n` curls of `url` got.
fn curl_names_at(t: &Topology, url: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let out = t.client.ns.exec("curl", &["-sf", "-m", "2", url]).unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        })
        .collect()
}

/// HTTP checks against nginx real servers: `/health` turns 503 on one of
/// them while wrk's keep-alive connections to it go on.
#[test]
fn http_check_takes_a_failing_backend_out_and_brings_it_back() {
    if !privileged("http_check_takes_a_failing_backend_out_and_brings_it_back") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let nginx: Vec<Nginx> = t.nginx_on_backends(false, 8080).unwrap();
    let check = "kind = \"http\", http_path = \"/health\", expect_status = 200";
    let (xvs, _) = Daemon::start(
        &t,
        "health-http",
        &daemon::bins(TESTNET),
        &config(&t, check),
        &[],
    )
    .unwrap();
    let b1 = format!("{}:8080", backend_addr(1));
    wait_state(&xvs, &b1, "up", bound(1));
    let mut names = curl_names(&t, 10);
    names.sort();
    names.dedup();
    assert_eq!(names, ["b0", "b1"]);

    // Keep-alive connections to both, then b1's health page fails.
    let load = Wrk::start(&t.client.ns, &format!("http://{VIP}/"), 6, false);
    std::thread::sleep(Duration::from_secs(1));
    nginx[1].set_healthy(false).unwrap();
    let took = wait_state(&xvs, &b1, "down", bound(FALL) * 2);
    assert!(
        took <= bound(FALL),
        "down after {took:?}, bound {:?}",
        bound(FALL)
    );
    assert_eq!(weight(&xvs, &b1), 0);
    let metrics = xvs.get("/metrics");
    assert!(
        metrics.contains(&format!(
            "xvs_backend_up{{protocol=\"tcp\",vip=\"{VIP}\",port=\"80\",backend=\"{b1}\"}} 0"
        )),
        "{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("xvs_backend_up"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let health = xvs.adm_ok(&["health"]);
    assert!(health.contains("status 503, expected 200"), "{health}");
    let events = xvs.adm_ok(&["observe", "--verdict", "BACKEND_DOWN"]);
    assert!(
        events.contains(&format!(
            "health-check -> {VIP}:80 BACKEND_DOWN (TCP) {b1}: GET /health: status 503, expected 200"
        )),
        "{events}"
    );
    // New connections: none reaches b1.
    assert!(curl_names(&t, 20).iter().all(|n| n == "b0"));
    // Its established connections go on: b1 serves more requests.
    let served = nginx[1].status().unwrap().requests;
    std::thread::sleep(Duration::from_secs(1));
    assert!(nginx[1].status().unwrap().requests > served + 10);

    // Healthy again: back after rise probes, with its weight.
    nginx[1].set_healthy(true).unwrap();
    let took = wait_state(&xvs, &b1, "up", bound(RISE) * 2);
    assert!(took <= bound(RISE), "up after {took:?}");
    assert_eq!(weight(&xvs, &b1), 1);
    assert!(curl_names(&t, 10).iter().any(|n| n == "b1"));
    let w = load.join().unwrap();
    assert!(w.requests > 100, "{}", w.text);
    assert_eq!((w.errors, w.non_2xx), (0, 0), "{}", w.text);
    xvs.stop_accounted();
}

/// TCP checks on a port of their own: the check's listener on one
/// backend stops while its service port (and the streams on it) go on.
#[test]
fn tcp_check_takes_a_failing_backend_out_and_brings_it_back() {
    if !privileged("tcp_check_takes_a_failing_backend_out_and_brings_it_back") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let check_listener = |i: usize| {
        let mut cmd = t.backends[i].ns.command(TESTNET);
        cmd.args([
            "serve",
            "--name",
            "check",
            "--tcp",
            &format!("{}:8081", backend_addr(i)),
        ]);
        Spawned::start(cmd, "check listener", Duration::from_secs(5))
            .unwrap()
            .0
    };
    let _check0 = check_listener(0);
    let check1 = check_listener(1);
    let (xvs, _) = Daemon::start(
        &t,
        "health-tcp",
        &daemon::bins(TESTNET),
        &config(&t, "kind = \"tcp\", port = 8081"),
        &[],
    )
    .unwrap();
    let b1 = format!("{}:8080", backend_addr(1));
    wait_state(&xvs, &b1, "up", bound(1));
    let health = xvs.adm_ok(&["health"]);
    assert!(health.contains("tcp:8081"), "{health}");

    // Long-lived streams through both backends while b1's check fails.
    let mut streams = t.client.ns.command(TESTNET);
    streams.args([
        "streams",
        "--connect",
        &format!("{VIP}:80"),
        "--connections",
        "8",
        "--seconds",
        "5",
    ]);
    let streams = std::thread::spawn(move || streams.output().unwrap());
    std::thread::sleep(Duration::from_secs(1));
    check1.stop(libc::SIGTERM, Duration::from_secs(5));
    let took = wait_state(&xvs, &b1, "down", bound(FALL) * 2);
    assert!(took <= bound(FALL), "down after {took:?}");
    assert_eq!(weight(&xvs, &b1), 0);
    let load = t.tcp_load(TESTNET, &format!("{VIP}:80"), 40, 2000);
    assert_eq!(load, "ok=40 failed=0 by=b0:40");
    let out = streams.join().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    let summary = out.lines().last().unwrap_or_default();
    assert!(summary.starts_with("ok=8 failed=0"), "{out}");
    assert!(out.contains(" b1"), "no stream went to b1: {out}");

    let _check1 = check_listener(1);
    let took = wait_state(&xvs, &b1, "up", bound(RISE) * 2);
    assert!(took <= bound(RISE), "up after {took:?}");
    let load = t.tcp_load(TESTNET, &format!("{VIP}:80"), 40, 2000);
    assert_eq!(load, "ok=40 failed=0 by=b0:20,b1:20");
    xvs.stop_accounted();
}

/// The HTTP check of IPv6 backends behind an IPv6 VIP: probes go to
/// `[address]:port` (with the bracketed `Host` header nginx expects), a
/// failing one leaves the rotation and comes back as an IPv4 one does.
#[test]
fn http_check_of_ipv6_backends_takes_one_out_and_brings_it_back() {
    if !privileged("http_check_of_ipv6_backends_takes_one_out_and_brings_it_back") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let nginx: Vec<Nginx> = t.nginx_on_backends(true, 8080).unwrap();
    let check = "kind = \"http\", http_path = \"/health\", expect_status = 200";
    let text = config6(&t, check);
    let (xvs, _) = Daemon::start(&t, "health-http6", &daemon::bins(TESTNET), &text, &[]).unwrap();
    let b1 = format!("[{}]:8080", backend_addr6(1));
    let url = format!("http://[{VIP6}]/");
    wait_state(&xvs, &b1, "up", bound(1));
    let mut names = curl_names_at(&t, &url, 10);
    names.sort();
    names.dedup();
    assert_eq!(names, ["b0", "b1"]);

    nginx[1].set_healthy(false).unwrap();
    let took = wait_state(&xvs, &b1, "down", bound(FALL) * 2);
    assert!(took <= bound(FALL), "down after {took:?}");
    assert_eq!(weight(&xvs, &b1), 0);
    let health = xvs.adm_ok(&["health"]);
    assert!(health.contains("status 503, expected 200"), "{health}");
    assert!(curl_names_at(&t, &url, 20).iter().all(|n| n == "b0"));

    nginx[1].set_healthy(true).unwrap();
    let took = wait_state(&xvs, &b1, "up", bound(RISE) * 2);
    assert!(took <= bound(RISE), "up after {took:?}");
    assert_eq!(weight(&xvs, &b1), 1);
    assert!(curl_names_at(&t, &url, 10).iter().any(|n| n == "b1"));
    xvs.stop_accounted();
}
