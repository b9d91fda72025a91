//! The control plane on a running gateway: `xvs run` on the real AF_XDP
//! path in namespaces, driven by `xvsadm` over the admin socket and by
//! reloads of its file, with real TCP traffic through the VIPs.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use xvs_vm_tests::daemon::{dir_of, Daemon};
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");

/// `xvs` or `xvsadm` of the build under test (checked as fresh as its
/// sources, or from `XVS_BIN_DIR`: [`xvs_vm_tests::daemon::bins`]).
fn sibling(name: &str) -> PathBuf {
    let p = bins().join(name);
    assert!(
        p.exists(),
        "{} missing: build the workspace (cargo build) first",
        p.display()
    );
    p
}

/// A config with two services on 198.19.0.1, ports 80 and 81, over the
/// topology's backends (`weights81` for port 81).
fn config(t: &Topology, socket: &Path, weights81: &[u32]) -> String {
    config_admin(t, socket, weights81, "")
}

/// [`config`] with more `[admin]` keys.
fn config_admin(t: &Topology, socket: &Path, weights81: &[u32], admin: &str) -> String {
    let all: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    let p81: Vec<String> = weights81
        .iter()
        .enumerate()
        .map(|(i, w)| {
            format!(
                "{{ address = \"{}\", port = 8080, weight = {w} }}",
                backend_addr(i)
            )
        })
        .collect();
    format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\npoll = \"adaptive\"\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\"]\n\n[admin]\nsocket = \"{}\"\n{admin}\n\
         [[services]]\nvip = \"198.19.0.1\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n\n\
         [[services]]\nvip = \"198.19.0.1\"\nport = 81\nscheduler = \"rr\"\nbackends = [{}]\n",
        t.gateway_client_if,
        socket.display(),
        all.join(", "),
        p81.join(", ")
    )
}

fn bins() -> PathBuf {
    xvs_vm_tests::daemon::bins(TESTNET)
}

/// `xvs run` on [`config`] with `weights81`.
fn start(t: &Topology, weights81: &[u32]) -> Daemon {
    start_with(t, weights81, &[], "")
}

/// [`start`] with environment variables and more `[admin]` keys.
fn start_with(t: &Topology, weights81: &[u32], env: &[(&str, &Path)], admin: &str) -> Daemon {
    let socket = dir_of(t, "ctl").join("xvs.sock");
    let text = config_admin(t, &socket, weights81, admin);
    let (gw, ready) = Daemon::start(t, "ctl", &bins(), &text, env).unwrap();
    assert!(ready.contains("admin API on"), "{ready}");
    gw
}

fn load(t: &Topology, port: u16, n: usize) -> String {
    t.tcp_load(TESTNET, &format!("198.19.0.1:{port}"), n, 5000)
}

/// A long-lived connection to 198.19.0.1:80, held for 4 s.
fn hold80(t: &Topology) -> Spawned {
    let mut hold = t.client.ns.command(TESTNET);
    hold.args(["hold", "--connect", "198.19.0.1:80", "--seconds", "4"]);
    Spawned::start(hold, "long-lived connection", Duration::from_secs(5))
        .unwrap()
        .0
}

fn topology() -> Topology {
    Topology::build(Spec::one_arm(3)).unwrap()
}

#[test]
fn xvsadm_changes_a_weight_under_traffic_and_lists_like_ipvsadm() {
    if !privileged("xvsadm_changes_a_weight_under_traffic_and_lists_like_ipvsadm") {
        return;
    }
    let t = topology();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let gw = start(&t, &[1, 1, 1]);

    // A long-lived connection runs across the change.
    let hold = hold80(&t);

    let before = load(&t, 80, 90);
    assert_eq!(
        before, "ok=90 failed=0 by=b0:30,b1:30,b2:30",
        "rr over three"
    );

    // Quiesce b2 with ipvsadm's syntax, while the held connection runs.
    let b2 = format!("{}:8080", backend_addr(2));
    gw.adm_ok(&["-e", "-t", "198.19.0.1:80", "-r", &b2, "-m", "-w", "0"]);
    let listing = gw.adm_ok(&["-Ln"]);
    let want = format!("  -> {b2:<28} Masq    0      ");
    assert!(listing.contains(&want), "{listing}");
    assert!(listing.starts_with("IP Virtual Server version 1.2.1 (size="));
    assert!(listing.contains("TCP  198.19.0.1:80 rr\n"), "{listing}");
    // The same listing as curl gets it: JSON, said so in its header, with
    // the quiesced backend's weight.
    let out = Command::new("curl")
        .args(["-s", "-i", "--unix-socket"])
        .arg(&gw.socket)
        .arg("http://xvs/v1/services")
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_default();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    let weights: Vec<_> = json["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["port"] == 80)
        .flat_map(|s| s["backends"].as_array().unwrap())
        .map(|b| b["weight"].as_u64())
        .collect();
    assert_eq!(weights, [Some(1), Some(1), Some(0)], "{body}");

    let after = load(&t, 80, 60);
    assert_eq!(
        after, "ok=60 failed=0 by=b0:30,b1:30",
        "weight 0 takes no new flows"
    );
    let (_, held) = hold.stop(0, Duration::from_secs(10));
    assert!(
        held.contains("ok rounds="),
        "the held connection went on: {held}"
    );

    // Counters: 90 + 60 + 1 connections were scheduled on port 80.
    let stats = gw.adm_ok(&["-Ln", "--stats", "--exact"]);
    let line = stats
        .lines()
        .find(|l| l.starts_with("TCP  198.19.0.1:80 "))
        .unwrap();
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(2)
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(fields[0], 151, "{stats}");
    assert!(fields[1] >= 151 * 3 && fields[2] >= 151 * 2, "{stats}");

    // JSON for scripts, and the same numbers.
    let json: serde_json::Value = serde_json::from_str(&gw.adm_ok(&["-Ln", "--json"])).unwrap();
    let s80 = json["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["port"] == 80)
        .unwrap();
    assert_eq!(s80["stats"]["conns"], 151);

    // Connections (-Lnc) and conntrack -D by backend.
    let conns = gw.adm_ok(&["-Lnc"]);
    assert!(conns.starts_with("IPVS connection entries\npro expire state"));
    assert!(
        conns.contains("TIME_WAIT") || conns.contains("CLOSE"),
        "{conns}"
    );
    // conntrack(8) prints its summary lines on stderr.
    let (status, out, deleted) = gw.adm(&["conntrack", "-D", "-r", &backend_addr(0).to_string()]);
    assert_eq!((status, out.as_str()), (0, ""));
    assert!(
        deleted.contains("flow entries have been deleted"),
        "{deleted}"
    );
    let (status, out, left) = gw.adm(&["conntrack", "-L", "-r", &backend_addr(0).to_string()]);
    assert_eq!((status, out.as_str()), (0, ""));
    assert!(
        left.ends_with(" 0 flow entries have been shown.\n"),
        "{left}"
    );
    // The API pages connections: 2 per page, the pages add up.
    let page = |n: usize| -> serde_json::Value {
        let out = Command::new("curl")
            .args(["-s", "--unix-socket"])
            .arg(&gw.socket)
            .arg(format!("http://xvs/v1/connections?size=2&page={n}"))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let first = page(0);
    let total = first["total"].as_u64().unwrap() as usize;
    assert!(total >= 3, "{first}");
    let mut seen = 0;
    for n in 0..total.div_ceil(2) {
        let got = page(n)["connections"].as_array().unwrap().len();
        assert_eq!(got, 2.min(total - 2 * n), "page {n}");
        seen += got;
    }
    assert_eq!(seen, total);
    // Closed flows were seen as CLOSED events (FIN/RST into TIME_WAIT/CLOSE).
    let closed = gw.adm_ok(&["observe", "--verdict", "CLOSED", "--last", "3"]);
    assert_eq!(closed.lines().count(), 3, "{closed}");
    assert!(
        closed
            .lines()
            .all(|l| l.contains(" CLOSED (TCP) to 198.18.1.1")),
        "{closed}"
    );
    // Flush empties the table (conntrack -F).
    let (_, _, flushed) = gw.adm(&["conntrack", "-F"]);
    assert!(
        flushed.contains("flow entries have been deleted"),
        "{flushed}"
    );
    let (_, empty, summary) = gw.adm(&["conntrack", "-L"]);
    assert_eq!(empty, "");
    assert!(
        summary.ends_with(" 0 flow entries have been shown.\n"),
        "{summary}"
    );

    // A bad edit: ipvsadm's words and status (255, from the table).
    let (status, _, err) = gw.adm(&[
        "-e",
        "-t",
        "198.19.0.1:80",
        "-r",
        "198.18.1.99:8080",
        "-m",
        "-w",
        "3",
    ]);
    assert_eq!((status, err.as_str()), (255, "No such destination\n"));

    // ipvsadm --set, then --timeout (0 keeps a value).
    assert_eq!(
        gw.adm_ok(&["-L", "--timeout"]),
        "Timeout (tcp tcpfin udp): 900 120 300\n"
    );
    gw.adm_ok(&["--set", "600", "0", "30"]);
    assert_eq!(
        gw.adm_ok(&["-L", "--timeout"]),
        "Timeout (tcp tcpfin udp): 600 120 30\n"
    );
    // Out of the file's range: refused, nothing changed.
    let (status, _, err) = gw.adm(&["--set", "4294967295", "0", "0"]);
    assert_eq!(
        (status, err.as_str()),
        (2, "invalid timeout value `4294967295' specified\n")
    );
    let (status, _, err) = gw.adm(&["--set", "2678400", "0", "0"]);
    assert_eq!(status, 255);
    assert_eq!(
        err,
        "established: 2678400 is out of range (expected 1..=2147483 seconds)\n"
    );
    assert_eq!(
        gw.adm_ok(&["-L", "--timeout"]),
        "Timeout (tcp tcpfin udp): 600 120 30\n"
    );
    // Every state, not only ipvsadm's three.
    gw.adm_ok(&["--set-timeout", "time_wait", "30"]);
    let states: serde_json::Value =
        serde_json::from_str(&gw.adm_ok(&["--set-timeout", "syn_recv", "20", "--json"])).unwrap();
    assert_eq!(
        (states["time_wait"].as_u64(), states["syn_recv"].as_u64()),
        (Some(30), Some(20))
    );
    let (status, _, err) = gw.adm(&["--set-timeout", "time_wiat", "30"]);
    assert_eq!(status, 255);
    assert!(
        err.starts_with("unknown timeout \"time_wiat\" (expected one of established,"),
        "{err}"
    );

    // A drop the test provokes (a VIP port with no service) shows up in
    // observe, with its reason; new flows show their backend.
    let refused = t.tcp_load(TESTNET, "198.19.0.1:99", 1, 300);
    assert_eq!(refused, "ok=0 failed=1 by=", "nothing serves port 99");
    std::thread::sleep(Duration::from_millis(200));
    let drops = gw.adm_ok(&[
        "observe",
        "--verdict",
        "DROPPED",
        "--service",
        "198.19.0.1:99",
        "--last",
        "5",
    ]);
    assert!(drops.lines().count() >= 1, "{drops}");
    for l in drops.lines() {
        assert!(
            l.contains(" -> 198.19.0.1:99 DROPPED (TCP) no_service"),
            "{l}"
        );
    }
    let news = gw.adm_ok(&["observe", "--verdict", "NEW", "--last", "3"]);
    assert_eq!(news.lines().count(), 3, "{news}");
    assert!(
        news.lines()
            .all(|l| l.contains("-> 198.19.0.1:80 NEW (TCP) to 198.18.1.1")),
        "{news}"
    );
    let json = gw.adm_ok(&["observe", "--verdict", "DROPPED", "--last", "1", "--json"]);
    let e: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(e["reason"], "no_service");

    let (_, printed) = gw.stop();
    assert!(printed.contains("worker 0:"), "{printed}");
}

#[test]
fn reload_applies_one_changed_service_and_refuses_a_bad_file() {
    if !privileged("reload_applies_one_changed_service_and_refuses_a_bad_file") {
        return;
    }
    let t = topology();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let gw = start(&t, &[1, 1, 1]);

    // A connection on :80 is held across the reload.
    let hold = hold80(&t);
    assert_eq!(load(&t, 81, 30), "ok=30 failed=0 by=b0:10,b1:10,b2:10");
    let stats80 = |gw: &Daemon| -> String {
        // One service: the title, no version line (as ipvsadm).
        gw.adm_ok(&["-Ln", "--stats", "--exact", "-t", "198.19.0.1:80"])
            .lines()
            .nth(2)
            .unwrap()
            .to_owned()
    };
    let conns80 = stats80(&gw);

    // Only port 81 changes: b0 leaves it.
    gw.rewrite(&config(&t, &gw.socket, &[0, 1, 1]));
    let out = gw.adm_ok(&["--reload"]);
    assert_eq!(out, "applied: 0 added, 1 changed, 0 removed, 1 unchanged\n");
    assert_eq!(load(&t, 81, 30), "ok=30 failed=0 by=b1:15,b2:15");
    // Port 80 was not touched: its flow goes on, its counters did not reset.
    let (_, held) = hold.stop(0, Duration::from_secs(10));
    assert!(held.contains("ok rounds="), "{held}");
    let conns_after: u64 = stats80(&gw)
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    let conns_before: u64 = conns80.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert_eq!(conns_after, conns_before, "port 80 kept its counters");

    // A bad file: refused with its position, the state stays.
    let listing = gw.adm_ok(&["-Ln"]);
    let good = std::fs::read_to_string(&gw.cfg).unwrap();
    gw.rewrite(&good.replace("scheduler = \"rr\"", "scheduler = \"rrr\""));
    let (status, _, err) = gw.adm(&["--reload"]);
    assert_eq!(status, 255);
    assert!(
        err.contains("xvs.toml:")
            && err.contains("services[0].scheduler: unknown scheduler \"rrr\""),
        "{err}"
    );
    assert_eq!(gw.adm_ok(&["-Ln"]), listing, "nothing changed");
    let status: serde_json::Value = serde_json::from_str(&gw.adm_ok(&["-Ln", "--json"])).unwrap();
    assert_eq!(status["services"].as_array().unwrap().len(), 2);
    assert_eq!(load(&t, 81, 30), "ok=30 failed=0 by=b1:15,b2:15");

    // SIGHUP does the same as --reload: the fixed file applies.
    gw.rewrite(&config(&t, &gw.socket, &[1, 1, 1]));
    let pid = gw.pid();
    // SAFETY: signals only the xvs process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    // Poll until the reload is in force (b0 serves again); a load that
    // straddles the reload mixes the two schedules, so the distribution is
    // checked on the next, whole load.
    for _ in 0..50 {
        if load(&t, 81, 3).contains("b0:") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(load(&t, 81, 30), "ok=30 failed=0 by=b0:10,b1:10,b2:10");
    gw.stop();
}

#[test]
fn systemd_hears_ready_reloading_and_stopping() {
    if !privileged("systemd_hears_ready_reloading_and_stopping") {
        return;
    }
    let t = topology();
    let dir = std::env::temp_dir().join(format!("xvs-notify-{}", t.tag));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let next = || {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let gw = start_with(&t, &[1, 1, 1], &[("NOTIFY_SOCKET", &path)], "");
    assert!(next().contains("READY=1"));
    let pid = gw.pid();
    // SAFETY: signals only the xvs process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    assert!(next().contains("RELOADING=1"));
    assert!(next().contains("READY=1"));
    gw.stop();
    assert!(next().contains("STOPPING=1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_tcp_admin_listener_requires_the_bearer_token() {
    if !privileged("the_tcp_admin_listener_requires_the_bearer_token") {
        return;
    }
    let t = topology();
    let dir = dir_of(&t, "ctl");
    std::fs::create_dir_all(&dir).unwrap();
    let (token, wrong) = (dir.join("token"), dir.join("wrong"));
    std::fs::write(&token, "s3cret-token\n").unwrap();
    std::fs::write(&wrong, "guess\n").unwrap();
    let admin = format!(
        "tcp = \"127.0.0.1:19180\"\ntoken_file = \"{}\"",
        token.display()
    );
    let gw = start_with(&t, &[1, 1, 1], &[], &admin);
    // The listener is on the gateway namespace's loopback.
    let adm = |file: &Path| {
        t.gateway
            .command(sibling("xvsadm").to_str().unwrap())
            .args(["-Ln", "--server", "127.0.0.1:19180", "--token-file"])
            .arg(file)
            .output()
            .unwrap()
    };
    let ok = adm(&token);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("TCP  198.19.0.1:80 rr"));
    let refused = adm(&wrong);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "missing or wrong bearer token\n"
    );
    gw.stop();
}

/// Every way a VIP stops being used releases it: the steering program's
/// map (read back from the kernel) equals the VIPs of the service table
/// plus the SNAT address after each of -A/-a, -E, -D, a reload; a deleted
/// VIP answers nothing, and once the host takes that address its own
/// service on it works.
#[test]
fn every_removal_releases_the_vip_it_owned() {
    if !privileged("every_removal_releases_the_vip_it_owned") {
        return;
    }
    let t = topology();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let gw = start(&t, &[1, 1, 1]);
    assert_eq!(gw.steered(), ["198.18.1.2", "198.19.0.1"]);

    let b0 = format!("{}:8080", backend_addr(0));
    gw.adm_ok(&["-A", "-t", "198.19.0.7:80", "-s", "rr"]);
    gw.adm_ok(&["-a", "-t", "198.19.0.7:80", "-r", &b0, "-m"]);
    assert_eq!(gw.steered(), ["198.18.1.2", "198.19.0.1", "198.19.0.7"]);
    let served = t.tcp_load(TESTNET, "198.19.0.7:80", 5, 2000);
    assert_eq!(served, "ok=5 failed=0 by=b0:5");
    gw.adm_ok(&["-E", "-t", "198.19.0.7:80", "-s", "wrr"]);
    assert_eq!(gw.steered(), ["198.18.1.2", "198.19.0.1", "198.19.0.7"]);
    gw.adm_ok(&["-D", "-t", "198.19.0.7:80"]);
    assert_eq!(gw.steered(), ["198.18.1.2", "198.19.0.1"]);
    let ping = t
        .client
        .ns
        .exec("ping", &["-c", "2", "-i", "0.2", "-W", "1", "198.19.0.7"]);
    assert!(ping.is_err(), "a deleted VIP still answers ping");
    // The host takes the address: its own service there works.
    t.gateway
        .ip(&["addr", "add", "198.19.0.7/32", "dev", &t.gateway_client_if])
        .unwrap();
    let mut serve = t.gateway.command(TESTNET);
    serve.args(["serve", "--name", "host", "--tcp", "198.19.0.7:2222"]);
    let (_host, _) = Spawned::start(serve, "host server", Duration::from_secs(5)).unwrap();
    assert_eq!(
        t.tcp_load(TESTNET, "198.19.0.7:2222", 5, 2000),
        "ok=5 failed=0 by=host:5"
    );

    // Deleting one port of a VIP keeps it for the other.
    gw.adm_ok(&["-D", "-t", "198.19.0.1:81"]);
    assert_eq!(gw.steered(), ["198.18.1.2", "198.19.0.1"]);
    // A reload whose file has no service on it releases it.
    let text = std::fs::read_to_string(&gw.cfg).unwrap();
    let head = text.split("[[services]]").next().unwrap().to_owned();
    gw.rewrite(&format!("{head}[[services]]\nvip = \"198.19.0.8\"\nport = 80\nscheduler = \"rr\"\nbackends = [{{ address = \"{}\", port = 8080 }}]\n", backend_addr(1)));
    gw.adm_ok(&["--reload"]);
    assert_eq!(gw.steered(), ["198.18.1.2", "198.19.0.8"]);
    assert_eq!(
        t.tcp_load(TESTNET, "198.19.0.8:80", 5, 2000),
        "ok=5 failed=0 by=b1:5"
    );
    gw.stop();
}

/// What is not the daemon's stays as it was: an `[admin] socket` path
/// that names a regular file is refused (the file kept); a reload that
/// changes `[admin]` is refused like `[interfaces]`; an API body with a
/// field the API does not know is refused; and `xvsadm ... | head` ends
/// quietly, as Unix tools do.
#[test]
fn what_is_not_the_daemons_is_left_alone() {
    if !privileged("what_is_not_the_daemons_is_left_alone") {
        return;
    }
    let t = topology();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    // A regular file where the socket should go.
    let dir = xvs_vm_tests::daemon::ScratchDir::new(&t, "adminfile").unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "keep me\n").unwrap();
    let cfg = dir.path().join("xvs.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}\n[restart]\nhold = \"300ms\"\nstate_dir = \"{}\"\n",
            config(&t, &precious, &[1, 1, 1]),
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let out = t
        .gateway
        .command("timeout")
        .args(["20", sibling("xvs").to_str().unwrap(), "run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("exists and is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me\n");

    let gw = start(&t, &[1, 1, 1]);
    // [admin] changes take a restart.
    let text = std::fs::read_to_string(&gw.cfg).unwrap();
    gw.rewrite(&text.replace(
        "[admin]\n",
        "[admin]\ntcp = \"127.0.0.1:19181\"\ntoken_file = \"/nonexistent\"\n",
    ));
    let (status, _, err) = gw.adm(&["--reload"]);
    assert_eq!(status, 255);
    assert!(
        err.contains("[admin] changed: it takes effect on restart only"),
        "{err}"
    );
    gw.rewrite(&text);
    // A field the API does not know.
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(&gw.socket)
        .args([
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"protocol":"tcp","vip":"198.19.0.5","port":80,"schedular":"rr"}"#,
            "http://xvs/v1/services",
        ])
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.ends_with("\n422"), "{answer}");
    assert!(answer.contains("unknown field `schedular`"), "{answer}");
    assert!(!gw.adm_ok(&["-Ln"]).contains("198.19.0.5"));
    // Every problem of a body is reported, not only the first.
    let post = |body: &str| {
        let out = Command::new("curl")
            .args(["-s", "--unix-socket"])
            .arg(&gw.socket)
            .args([
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
                body,
            ])
            .arg("http://xvs/v1/services")
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["error"].as_str().unwrap_or_default().to_owned()
    };
    let two = post(
        r#"{"protocol":"tcp","vip":"198.19.0.5","port":80,"scheduler":"rrr","flags":["sideways"]}"#,
    );
    assert_eq!(two.lines().count(), 2, "{two}");
    assert!(
        two.starts_with("scheduler: unknown scheduler \"rrr\""),
        "{two}"
    );
    let rules = post(
        r#"{"protocol":"tcp","vip":"224.0.0.9","port":80,"scheduler":"rr","backends":[{"address":"127.0.0.1"}]}"#,
    );
    assert_eq!(rules.lines().count(), 2, "{rules}");
    assert!(
        rules.contains("TCP 224.0.0.9:80: vip: ")
            && rules.contains("TCP 224.0.0.9:80: backends[0].address: "),
        "{rules}"
    );
    // A listing longer than a pipe's buffer, read by `head`.
    assert!(load(&t, 80, 1000).starts_with("ok=1000 "));
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} -Lnc --socket {} | head -1",
            sibling("xvsadm").display(),
            gw.socket.display()
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "IPVS connection entries\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "xvsadm complained"
    );
    gw.stop();
}

/// A conntrack capacity the host cannot hold is refused, with the figure,
/// by `xvs check-config` and by `xvs run`, before anything is attached.
#[test]
fn a_capacity_beyond_the_hosts_memory_is_refused_before_anything_is_attached() {
    if !privileged("a_capacity_beyond_the_hosts_memory_is_refused_before_anything_is_attached") {
        return;
    }
    let t = topology();
    let dir = xvs_vm_tests::daemon::ScratchDir::new(&t, "capacity").unwrap();
    let cfg = dir.path().join("xvs.toml");
    let text = config(&t, &dir.path().join("xvs.sock"), &[1, 1, 1])
        .replace("[admin]", "[conntrack]\ncapacity = 268435456\n\n[admin]");
    std::fs::write(&cfg, text).unwrap();
    let check = t
        .gateway
        .command(sibling("xvs").to_str().unwrap())
        .args(["check-config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{err}");
    assert!(
        err.contains("conntrack.capacity: 268435456 flows need ")
            && err.contains("this host has available (MemAvailable)"),
        "{err}"
    );
    let run = t
        .gateway
        .command("timeout")
        .args(["20", sibling("xvs").to_str().unwrap(), "run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(err.contains("268435456 flows need "), "{err}");
    let link = t.gateway.ip(&["-d", "link", "show", "g0"]).unwrap().stdout;
    assert!(
        !String::from_utf8_lossy(&link).contains("prog/xdp"),
        "a program was left attached"
    );
}

/// The daemon's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// More half-sent requests on the TCP admin listener than it serves: the
/// excess is closed at once, the rest are cut when the header timeout
/// passes, the unix socket answers `xvsadm -Ln` within a second
/// meanwhile, and the daemon's memory comes back down.
#[test]
fn the_tcp_admin_listener_cannot_be_exhausted() {
    if !privileged("the_tcp_admin_listener_cannot_be_exhausted") {
        return;
    }
    let t = topology();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let dir = dir_of(&t, "ctl");
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let admin = format!(
        "tcp = \"127.0.0.1:19182\"\ntoken_file = \"{}\"",
        token.display()
    );
    let gw = start_with(&t, &[1, 1, 1], &[], &admin);
    let rss_before = rss_kib(gw.pid());
    let opened = 300;
    let gw_ns = t.gateway.name().to_owned();
    // Connect from inside the gateway's namespace (the listener is on its
    // loopback), each sending a request head that never ends.
    let conns = std::thread::spawn(move || {
        xvs_vm_tests::netns::Netns::existing(&gw_ns)
            .enter_current_thread()
            .unwrap();
        (0..opened)
            .map(|_| {
                let mut s = std::net::TcpStream::connect("127.0.0.1:19182").unwrap();
                use std::io::Write;
                let _ = s.write_all(b"GET /v1/services HTTP/1.1\r\nHost: xvs\r\nX-Slow: ");
                s
            })
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    // Closed by the daemon: a read ends (end of stream or reset) instead
    // of timing out.
    let closed = |s: &std::net::TcpStream, wait: Duration| {
        use std::io::{ErrorKind, Read};
        s.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0u8; 64];
        match (&*s).read(&mut buf) {
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            Ok(n) => n == 0,
        }
    };
    let refused = conns
        .iter()
        .filter(|s| closed(s, Duration::from_millis(50)))
        .count();
    assert!(
        refused >= opened - 256,
        "{refused} of {opened} closed at once (the listener serves 256)"
    );
    // The operator still gets in, at once.
    #[allow(clippy::disallowed_types)] // measures the answer time
    let started = std::time::Instant::now();
    let listing = gw.adm_ok(&["-Ln"]);
    assert!(listing.contains("TCP  198.19.0.1:80 rr"), "{listing}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "xvsadm -Ln took {:?}",
        started.elapsed()
    );
    // The slow ones are cut when the header timeout (5 s) passes.
    std::thread::sleep(Duration::from_secs(6));
    let cut = conns
        .iter()
        .filter(|s| closed(s, Duration::from_millis(50)))
        .count();
    assert_eq!(cut, opened, "every half-sent request was cut");
    drop(conns);
    std::thread::sleep(Duration::from_millis(500));
    let rss_after = rss_kib(gw.pid());
    assert!(
        rss_after <= rss_before + 16 * 1024,
        "RSS {rss_before} KiB before, {rss_after} KiB after"
    );
    let metrics = gw.get("/metrics");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("xvs_admin_connections_refused_total{listener=\"tcp\"}"))
        .unwrap();
    let n: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= opened - 256, "{line}");
    gw.stop();
}

/// `observe --follow` during a burst of drops, by a reader that stops
/// reading (a paused terminal, a slow pipe): it misses events, and is told
/// how many in the stream (hubble's `EVENTS LOST:`), so that what it read
/// and what it was told it lost add up to every drop the metrics counted
/// while it followed.
#[test]
fn a_follower_that_falls_behind_is_told_how_many_events_it_lost() {
    if !privileged("a_follower_that_falls_behind_is_told_how_many_events_it_lost") {
        return;
    }
    use std::io::{Read, Write};
    let t = topology();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let gw = start(&t, &[1, 1, 1]);
    let drops =
        |gw: &Daemon| xvs_vm_tests::daemon::sample_sum(&gw.get("/metrics"), "xvs_drops_total");
    // HTTP/1.0: the stream's body ends with the connection, unchunked.
    let mut follow =
        std::os::unix::net::UnixStream::connect(dir_of(&t, "ctl").join("xvs.sock")).unwrap();
    follow
        .write_all(b"GET /v1/events?last=0&follow=true HTTP/1.0\r\nHost: xvs\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = drops(&gw);
    // Every datagram to a port nothing serves is a drop, and each drop an
    // event (drops are never sampled out); nothing is read meanwhile.
    let blast = t.udp_blast(TESTNET, "198.19.0.1:99", 2);
    let sent = xvs_vm_tests::daemon::field_of(&blast, "sent");
    // Settled: the worker may still be taking the burst's last frames
    // off its ring when the sender is done (each a drop and an event
    // after a count read too early).
    let mut after = drops(&gw);
    for _ in 0..25 {
        std::thread::sleep(Duration::from_millis(200));
        let now = drops(&gw);
        if now == after {
            break;
        }
        after = now;
    }
    let mut text = Vec::new();
    follow
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match follow.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&text);
    let (mut read, mut lost, mut notices) = (0u64, 0u64, Vec::new());
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        match v.get("lost_events") {
            Some(l) => {
                lost += l["num_events_lost"].as_u64().unwrap();
                notices.push(format!("{} {}", l["source"], l["num_events_lost"]));
            }
            None if v["verdict"] == "DROPPED" => read += 1,
            None => {}
        }
    }
    let counted = (after - before) as u64;
    eprintln!("{blast}; drops counted {counted}, read {read}, lost {lost}: {notices:?}");
    assert!(sent > 20_000, "a burst the follower cannot hold: {blast}");
    assert!(lost > 0, "nothing lost: the follower held {read} events");
    assert!(
        notices.iter().any(|n| n.starts_with("\"FOLLOWER_QUEUE\"")),
        "the follower's own lag is named: {notices:?}"
    );
    assert_eq!(read + lost, counted, "every drop read or told as lost");
    let line = gw.adm_ok(&["observe", "--last", "1", "--verdict", "DROPPED"]);
    assert!(
        line.contains("-> 198.19.0.1:99 DROPPED (UDP) no_service"),
        "{line}"
    );
}
