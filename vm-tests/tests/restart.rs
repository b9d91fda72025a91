//! Restart survival end to end: 200 long-lived TCP connections through
//! four services (rr, wlc, sh, mh) keep their byte streams, backends and
//! SNAT ports while `xvs run` is killed (SIGKILL, SIGABRT as systemd's
//! watchdog sends), stopped (SIGTERM) or replaced by another build, and
//! started again; no client sees a reset (a capture on the client's
//! interface). Without a successor the hold window ends: VIP traffic goes
//! to the kernel, nothing stays attached and no state is left.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // the figures are real time

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use xvs_vm_tests::capture::Capture;
use xvs_vm_tests::daemon::{guard_runs, Daemon, ScratchDir};
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::{Spawned, STREAMS_READY};
use xvs_vm_tests::topology::{backend_addr, one_arm_head, Arms, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";
/// One service per scheduler the issue names, each on its own port.
const SCHEDULERS: [(&str, u16); 4] = [("rr", 80), ("wlc", 81), ("sh", 82), ("mh", 83)];
const PER_SERVICE: u32 = 50;

fn bins() -> PathBuf {
    xvs_vm_tests::daemon::bins(TESTNET)
}

fn config(t: &Topology, state: &Path, hold: &str) -> String {
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    let mut text = format!(
        "{}\n[restart]\nhold = \"{hold}\"\nstate_dir = \"{}\"\n",
        one_arm_head(t, 1),
        state.display()
    );
    for (sched, port) in SCHEDULERS {
        text.push_str(&format!(
            "\n[[services]]\nvip = \"{VIP}\"\nport = {port}\nscheduler = \"{sched}\"\nbackends = [{}]\n",
            backends.join(", ")
        ));
    }
    text
}

/// `xvs prepare-state` on `text`, in the host's mount namespace, as the
/// unit's `ExecStartPre=+` runs it (`ip netns exec` gives `xvs run` a
/// private one): the state's huge-page tmpfs.
fn prepare(dir: &Path, text: &str) {
    let cfg = dir.join("prepare.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = Command::new(bins().join("xvs"))
        .args(["prepare-state", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("ready (huge pages)"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The 200 connections: one `xvs-testnet streams` per service.
fn streams(t: &Topology, seconds: u64) -> Vec<Spawned> {
    SCHEDULERS
        .iter()
        .map(|(_, port)| {
            let mut cmd = t.client.ns.command(TESTNET);
            cmd.args([
                "streams",
                "--connect",
                &format!("{VIP}:{port}"),
                "--connections",
                &PER_SERVICE.to_string(),
                "--seconds",
                &seconds.to_string(),
            ]);
            Spawned::start(cmd, "streams", STREAMS_READY).unwrap().0
        })
        .collect()
}

/// Every stream's result: (clients ok, output).
fn finish(streams: Vec<Spawned>, within: Duration) -> (u32, u64, String) {
    let (mut ok, mut stall, mut all) = (0, 0, String::new());
    for s in streams {
        let (status, out) = s.wait(within);
        let summary = out.lines().find(|l| l.starts_with("ok=")).unwrap_or("");
        ok += xvs_vm_tests::daemon::field(summary, "ok").unwrap_or(0) as u32;
        stall = stall.max(xvs_vm_tests::daemon::field(summary, "max_stall_ms").unwrap_or(0));
        all.push_str(&format!("{status:?}: {out}\n"));
    }
    (ok, stall, all)
}

/// The established flows xvs lists (`xvsadm -Lnc --json`) by client and
/// VIP: backend and SNAT endpoint.
fn flows(gw: &Daemon) -> BTreeMap<(String, String), (String, String)> {
    parse_flows(&gw.adm_ok(&["-Lnc", "--json"]))
}

/// [`flows`] of the JSON `xvsadm -Lnc --json` printed.
fn parse_flows(text: &str) -> BTreeMap<(String, String), (String, String)> {
    let json: serde_json::Value = serde_json::from_str(text).unwrap();
    json["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "ESTABLISHED")
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            ((s("client"), s("vip")), (s("backend"), s("snat")))
        })
        .collect()
}

fn link_has_program(t: &Topology) -> bool {
    let link = t
        .gateway
        .ip(&["-d", "link", "show", &t.gateway_client_if])
        .unwrap()
        .stdout;
    String::from_utf8_lossy(&link).contains("prog/xdp")
}

fn state_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("flows"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".flows"))
                .collect()
        })
        .unwrap_or_default()
}

/// The gateway a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gateway {
    /// One arm, one queue, one worker.
    OneArm,
    /// Two arms (clients on gc, backends on gb), two queues, two workers
    /// (each with its own state file and SNAT port slice).
    TwoArmTwoWorkers,
}

impl Gateway {
    fn spec(self) -> Spec {
        match self {
            Gateway::OneArm => Spec::one_arm(3),
            Gateway::TwoArmTwoWorkers => Spec {
                arms: Arms::Two,
                backends: 3,
                queues: 2,
            },
        }
    }

    fn workers(self) -> usize {
        match self {
            Gateway::OneArm => 1,
            Gateway::TwoArmTwoWorkers => 2,
        }
    }

    fn config(self, t: &Topology, state: &Path) -> String {
        let text = config(t, state, "5s");
        match self {
            Gateway::OneArm => text,
            Gateway::TwoArmTwoWorkers => text
                .replace(
                    "mode = \"one-arm\"\nclient = \"gc\"",
                    "mode = \"two-arm\"\nclient = \"gc\"\nbackend = \"gb\"",
                )
                .replace(
                    "queues = [0]\ncores = [0]",
                    "queues = [0, 1]\ncores = [0, 1]",
                ),
        }
    }
}

/// The scenario every variant shares: 200 streams through the build in
/// `first` (a binary directory), the instance ended by `signal`, `next`
/// started on the same configuration, and every stream checked. Returns
/// the figures line it prints.
fn survive(name: &str, signal: i32, first: &Path, next: &Path, shape: Gateway) -> String {
    let t = Topology::build(shape.spec()).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let scratch = ScratchDir::new(&t, &format!("restart-{name}")).unwrap();
    let state = scratch.path().join("state");
    let text = shape.config(&t, &state);
    if shape != Gateway::OneArm {
        assert!(
            text.contains("two-arm") && text.contains("[0, 1]"),
            "{text}"
        );
        // A veth delivers a packet on the queue its sender's socket hash
        // picks, and Linux draws that hash anew at every retransmission
        // timeout (net.core.txrehash): a flow held in the window would
        // come back on the other queue, to the worker without it. A NIC's
        // RSS hashes the addresses and ports, so a flow keeps its queue:
        // the client does the same here.
        t.client
            .ns
            .exec("sysctl", &["-qw", "net.core.txrehash=0"])
            .unwrap();
    }
    prepare(scratch.path(), &text);
    let (gw, _) = Daemon::start(&t, "rs", first, &text, &[]).unwrap();
    let status: serde_json::Value = serde_json::from_str(&gw.get("/v1/status")).unwrap();
    assert!(status["restart"]["plain_pages"].is_null(), "{status}");
    let capture = Capture::start(&t, scratch.path());
    let clients = streams(&t, 12);
    std::thread::sleep(Duration::from_secs(2));
    let before = flows(&gw);
    assert_eq!(
        before.len(),
        (PER_SERVICE as usize) * SCHEDULERS.len(),
        "established flows before"
    );
    let killed = Instant::now();
    let (status, _) = gw.kill(signal);
    assert!(status.is_some(), "xvs did not end on signal {signal}");
    // The program stays, holding VIP packets; the state stays.
    assert!(link_has_program(&t), "the program went with the process");
    if let Some(gb) = &t.gateway_backend_if {
        let link = t.gateway.ip(&["-d", "link", "show", gb]).unwrap().stdout;
        assert!(String::from_utf8_lossy(&link).contains("prog/xdp"), "{gb}");
    }
    assert_eq!(state_files(&state).len(), shape.workers(), "{state:?}");
    let (gw, _) = Daemon::start(&t, "rs", next, &text, &[]).unwrap();
    let restarted = killed.elapsed();
    let status: serde_json::Value = serde_json::from_str(&gw.get("/v1/status")).unwrap();
    let restart = &status["restart"];
    assert_eq!(
        restart["adopted_flows"].as_u64(),
        Some(before.len() as u64),
        "{restart}"
    );
    assert_eq!(restart["adopted_dropped"].as_u64(), Some(0), "{restart}");
    // 200 streams kept sending while no socket served the queue: the
    // replaced program held (dropped and counted) some of their packets,
    // which the start read from its `held` map. (An older build's program
    // may count them elsewhere.)
    if first == next {
        assert!(
            restart["held_packets"].as_u64().unwrap_or(0) > 0,
            "{restart}"
        );
    }
    // One program per interface, each replaced.
    assert_eq!(
        restart["replaced_programs"].as_array().map(Vec::len),
        Some(1 + usize::from(t.gateway_backend_if.is_some())),
        "{restart}"
    );
    let after = flows(&gw);
    // Same backend and SNAT port for every connection.
    assert_eq!(before, after, "flows moved across the restart");
    let (ok, stall, out) = finish(clients, Duration::from_secs(60));
    assert_eq!(
        ok,
        PER_SERVICE * SCHEDULERS.len() as u32,
        "every connection continues:\n{out}"
    );
    let resets = capture.resets();
    assert!(
        resets.is_empty(),
        "clients saw resets:\n{}",
        resets.join("\n")
    );
    let figures = format!(
        "restart figures ({name}): restart took {} ms (kill to ready), longest stream stall {} ms, \
         {} VIP packets held in the window, {}/{} connections survived",
        restarted.as_millis(),
        stall,
        restart["held_packets"],
        ok,
        PER_SERVICE * SCHEDULERS.len() as u32
    );
    println!("{figures}");
    gw.stop();
    figures
}

#[test]
fn flows_survive_kill_9_and_a_restart() {
    if !privileged("flows_survive_kill_9_and_a_restart") {
        return;
    }
    survive("sigkill", libc::SIGKILL, &bins(), &bins(), Gateway::OneArm);
}

/// Two arms and two workers: the program on both interfaces, a state file
/// per worker, replies handed between the workers.
#[test]
fn flows_survive_kill_9_on_two_arms_with_two_workers() {
    if !privileged("flows_survive_kill_9_on_two_arms_with_two_workers") {
        return;
    }
    survive(
        "twoarm",
        libc::SIGKILL,
        &bins(),
        &bins(),
        Gateway::TwoArmTwoWorkers,
    );
}

/// SIGABRT is what systemd's watchdog sends a hung xvs.
#[test]
fn flows_survive_an_abort_and_a_restart() {
    if !privileged("flows_survive_an_abort_and_a_restart") {
        return;
    }
    survive("sigabrt", libc::SIGABRT, &bins(), &bins(), Gateway::OneArm);
}

/// A `systemctl restart`: SIGTERM, then a start.
#[test]
fn flows_survive_a_clean_restart() {
    if !privileged("flows_survive_a_clean_restart") {
        return;
    }
    survive("sigterm", libc::SIGTERM, &bins(), &bins(), Gateway::OneArm);
}

/// An upgrade: the running build stopped, a second build of `xvs` (the
/// same layout version; `make test` builds it into `target/upgrade`, see
/// the Makefile) started on the same state.
#[test]
fn flows_survive_an_upgrade_to_another_build() {
    if !privileged("flows_survive_an_upgrade_to_another_build") {
        return;
    }
    let Some(next) = upgrade_bins() else {
        eprintln!("skipping: no second build (XVS_UPGRADE_DIR unset; `make test` sets it)");
        return;
    };
    let version = |dir: &Path| {
        let out = Command::new(dir.join("xvs"))
            .arg("--version")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_ne!(
        version(&bins()),
        version(&next),
        "the upgrade target is the same build"
    );
    survive("upgrade", libc::SIGTERM, &bins(), &next, Gateway::OneArm);
}

/// An upgrade from an earlier release whose flow state file has the
/// layout before this build's (`XVS_UPGRADE_FROM`: the directory of its
/// `xvs`; layout 2 is bb5d48b's, built by `git worktree add` and `cargo
/// build -p xvs-control --bins`): this build rewrites the file in its
/// own layout and every stream goes on.
#[test]
fn flows_survive_an_upgrade_from_the_layout_before() {
    if !privileged("flows_survive_an_upgrade_from_the_layout_before") {
        return;
    }
    let Some(from) = xvs_vm_tests::daemon::upgrade_from() else {
        return;
    };
    // `survive` holds the new build to adopting every flow the old one
    // had: a file it could not read would start it empty.
    survive("layout", libc::SIGTERM, &from, &bins(), Gateway::OneArm);
}

/// The second build's folder, from `XVS_UPGRADE_DIR` (required to exist
/// when set).
fn upgrade_bins() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("XVS_UPGRADE_DIR")?);
    assert!(
        dir.join("xvs").exists(),
        "XVS_UPGRADE_DIR={} has no xvs",
        dir.display()
    );
    Some(dir)
}

/// What systemd's `Restart=on-failure` with `RestartSec=` does, where
/// systemd is not PID 1 (as on the machines these tests run on): start
/// `xvs run`, and start it again after `restart_sec` whenever it ends in
/// failure (a signal, a non-zero status); stop when it ends cleanly.
struct Supervisor {
    pid: std::sync::Arc<std::sync::atomic::AtomicU32>,
    starts: std::sync::Arc<std::sync::atomic::AtomicU32>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Supervisor {
    fn start(t: &Topology, cfg: &Path, restart_sec: Duration) -> Supervisor {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::Arc;
        let pid = Arc::new(AtomicU32::new(0));
        let starts = Arc::new(AtomicU32::new(0));
        let (p, s) = (pid.clone(), starts.clone());
        let gw = t.gateway.name().to_owned();
        let cfg = cfg.to_owned();
        let thread = std::thread::spawn(move || {
            for _ in 0..5 {
                let ns = xvs_vm_tests::netns::Netns::existing(&gw);
                let mut cmd = ns.command(&bins().join("xvs").display().to_string());
                cmd.args(["run", "--config"]).arg(&cfg);
                let Ok((xvs, _ready)) = Spawned::start(cmd, "xvs", Duration::from_secs(20)) else {
                    return;
                };
                p.store(xvs.pid(), Ordering::SeqCst);
                s.fetch_add(1, Ordering::SeqCst);
                let (status, _) = xvs.wait(Duration::from_secs(120));
                if status.is_none_or(|s| s.success()) {
                    return;
                }
                std::thread::sleep(restart_sec);
            }
        });
        let sup = Supervisor {
            pid,
            starts,
            thread: Some(thread),
        };
        sup.wait_starts(1);
        sup
    }

    fn wait_starts(&self, n: u32) {
        use std::sync::atomic::Ordering;
        for _ in 0..1500 {
            if self.starts.load(Ordering::SeqCst) >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("xvs was not started {n} time(s)");
    }

    fn signal(&self, sig: i32) {
        let pid = self.pid.load(std::sync::atomic::Ordering::SeqCst);
        assert!(pid > 0);
        // SAFETY: signals only the xvs this supervisor started, by PID.
        unsafe { libc::kill(pid as i32, sig) };
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `Restart=on-failure`: a killed xvs is started again by its supervisor
/// (as systemd does with the unit's `RestartSec=`), and the flows survive.
#[test]
fn a_supervisor_restarts_a_killed_xvs_and_the_flows_survive() {
    if !privileged("a_supervisor_restarts_a_killed_xvs_and_the_flows_survive") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let scratch = ScratchDir::new(&t, "restart-sup").unwrap();
    let state = scratch.path().join("state");
    let cfg = scratch.path().join("xvs.toml");
    let socket = scratch.path().join("xvs.sock");
    std::fs::write(
        &cfg,
        format!(
            "{}\n[admin]\nsocket = \"{}\"\n",
            config(&t, &state, "5s"),
            socket.display()
        ),
    )
    .unwrap();
    prepare(scratch.path(), &config(&t, &state, "5s"));
    // RestartSec of the shipped unit.
    let sup = Supervisor::start(&t, &cfg, Duration::from_millis(500));
    let adm = |args: &[&str]| {
        let out = Command::new(bins().join("xvsadm"))
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = || parse_flows(&adm(&["-Lnc", "--json"]));
    let capture = Capture::start(&t, scratch.path());
    let clients = streams(&t, 10);
    std::thread::sleep(Duration::from_secs(2));
    let before = listed();
    assert_eq!(before.len(), (PER_SERVICE as usize) * SCHEDULERS.len());
    sup.signal(libc::SIGKILL);
    sup.wait_starts(2);
    assert_eq!(listed(), before, "flows moved across the restart");
    let (ok, stall, out) = finish(clients, Duration::from_secs(60));
    assert_eq!(ok, PER_SERVICE * SCHEDULERS.len() as u32, "{out}");
    let resets = capture.resets();
    assert!(
        resets.is_empty(),
        "clients saw resets:\n{}",
        resets.join("\n")
    );
    println!(
        "restart figures (supervisor, RestartSec=500ms): longest stream stall {stall} ms, \
         {ok}/{} connections survived",
        PER_SERVICE * SCHEDULERS.len() as u32
    );
}

/// No successor within the hold window: while it lasts, VIP packets are
/// dropped (no reset from the kernel) and the gateway's own traffic is
/// not held; after it, VIP traffic reaches the kernel (which refuses the
/// connection), the program is gone and no state is left.
#[test]
fn without_a_restart_the_hold_window_ends_and_nothing_is_left() {
    if !privileged("without_a_restart_the_hold_window_ends_and_nothing_is_left") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let scratch = ScratchDir::new(&t, "restart-none").unwrap();
    let state = scratch.path().join("state");
    let text = config(&t, &state, "3s");
    prepare(scratch.path(), &text);
    let (gw, _) = Daemon::start(&t, "rn", &bins(), &text, &[]).unwrap();
    assert!(t
        .tcp_load(TESTNET, "198.19.0.1:80", 20, 5000)
        .starts_with("ok=20 failed=0"));
    let (status, _) = gw.kill(libc::SIGKILL);
    assert!(status.is_some());
    let killed = Instant::now();
    // In the window: a new connection gets no answer at all (held)...
    let held = t.tcp_load(TESTNET, "198.19.0.1:80", 1, 1000);
    assert!(held.starts_with("ok=0 failed=1"), "{held}");
    // ... while the gateway's own address answers.
    let ping = t
        .client
        .ns
        .exec("ping", &["-c", "1", "-W", "1", "198.18.0.1"]);
    assert!(ping.is_ok(), "the gateway's own traffic was held");
    assert!(link_has_program(&t));
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "the checks outlasted the window"
    );
    // After it: the kernel answers (refuses: nothing listens on the VIP),
    // the guard has detached the program and removed the state.
    std::thread::sleep(Duration::from_secs(3).saturating_sub(killed.elapsed()));
    assert!(
        xvs_vm_tests::daemon::detached(&t.gateway, &t.gateway_client_if),
        "a program stayed after the window"
    );
    // (The emptied tmpfs stays mounted in the host's namespace, where
    // the guard, in xvs's, cannot reach it; the next start uses it.)
    assert!(state_files(&state).is_empty(), "{:?}", state_files(&state));
    // The kernel refuses at once (a reset), where the window held.
    let refused = Instant::now();
    let after = t.tcp_load(TESTNET, "198.19.0.1:80", 1, 2000);
    assert!(after.starts_with("ok=0 failed=1"), "{after}");
    assert!(
        refused.elapsed() < Duration::from_millis(1500),
        "no answer from the kernel after the window"
    );
}

/// `xvs run` on `text` (with an admin socket `name.sock` in `dir`), in
/// the gateway namespace, expected to stop at once: its exit status and
/// stderr.
fn run_refused(t: &Topology, dir: &Path, name: &str, text: &str) -> (Option<i32>, String) {
    let cfg = dir.join(format!("{name}.toml"));
    let socket = dir.join(format!("{name}.sock"));
    std::fs::write(
        &cfg,
        format!("{text}\n[admin]\nsocket = \"{}\"\n", socket.display()),
    )
    .unwrap();
    let out = t
        .gateway
        .command(&bins().join("xvs").display().to_string())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One xvs per interface: a second `xvs run` on the same interfaces is
/// refused, saying who runs.
#[test]
fn a_second_instance_on_the_same_interface_is_refused() {
    if !privileged("a_second_instance_on_the_same_interface_is_refused") {
        return;
    }
    let t = Topology::build(Spec::one_arm(1)).unwrap();
    let scratch = ScratchDir::new(&t, "restart-twice").unwrap();
    let state = scratch.path().join("state");
    let text = config(&t, &state, "1s");
    let (gw, _) = Daemon::start(&t, "r2", &bins(), &text, &[]).unwrap();
    let (code, err) = run_refused(&t, scratch.path(), "second", &text);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "another xvs already runs on interface {} (run pid {}",
            t.gateway_client_if,
            gw.pid()
        )),
        "{err}"
    );
    // The first one is untouched.
    assert!(link_has_program(&t));
    assert!(gw.get("/v1/status").contains("\"programs\""));
}

/// A program xvs did not attach is never replaced: the error names it and
/// says how to remove it.
#[test]
fn a_foreign_xdp_program_is_named_not_replaced() {
    if !privileged("a_foreign_xdp_program_is_named_not_replaced") {
        return;
    }
    let t = Topology::build(Spec::one_arm(1)).unwrap();
    let scratch = ScratchDir::new(&t, "restart-foreign").unwrap();
    let src = scratch.path().join("other.c");
    let obj = scratch.path().join("other.o");
    std::fs::write(
        &src,
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"xdp\") int someone_else(struct xdp_md *ctx) { return XDP_PASS; }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    )
    .unwrap();
    let cc = Command::new("clang")
        .args([
            "-O2",
            "-target",
            "bpf",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    t.gateway
        .ip(&[
            "link",
            "set",
            "dev",
            &t.gateway_client_if,
            "xdpdrv",
            "obj",
            obj.to_str().unwrap(),
            "sec",
            "xdp",
        ])
        .unwrap();
    let text = config(&t, &scratch.path().join("state"), "1s");
    let (code, err) = run_refused(&t, scratch.path(), "x", &text);
    assert_eq!(code, Some(1), "{err}");
    let ifname = &t.gateway_client_if;
    assert!(
        err.contains(&format!(
            "{ifname} already has XDP program \"someone_else\""
        )) && err.contains("native mode")
            && err.contains(&format!("ip link set dev {ifname} xdpdrv off")),
        "{err}"
    );
    // Still there, untouched.
    let link = t
        .gateway
        .ip(&["-d", "link", "show", ifname])
        .unwrap()
        .stdout;
    assert!(String::from_utf8_lossy(&link).contains("someone_else"));
}

/// A successor whose configuration does not fit the state (here another
/// capacity) starts empty and says why, in the log and `/v1/status`.
#[test]
fn an_incompatible_restart_starts_empty_and_says_why() {
    if !privileged("an_incompatible_restart_starts_empty_and_says_why") {
        return;
    }
    let t = Topology::build(Spec::one_arm(1)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let scratch = ScratchDir::new(&t, "restart-incompat").unwrap();
    let state = scratch.path().join("state");
    let text = config(&t, &state, "5s");
    let (gw, _) = Daemon::start(&t, "ri", &bins(), &text, &[]).unwrap();
    assert!(t
        .tcp_load(TESTNET, "198.19.0.1:80", 10, 5000)
        .starts_with("ok=10 failed=0"));
    gw.kill(libc::SIGKILL);
    let other = text.replace("[restart]", "[conntrack]\ncapacity = 5000\n\n[restart]");
    let (gw, _) = Daemon::start(&t, "ri", &bins(), &other, &[]).unwrap();
    let status: serde_json::Value = serde_json::from_str(&gw.get("/v1/status")).unwrap();
    let empty = status["restart"]["started_empty"].to_string();
    assert!(
        empty.contains("worker 0: capacity or entry size changed"),
        "{status}"
    );
    assert_eq!(status["restart"]["adopted_flows"].as_u64(), Some(0));
    // It serves, from an empty table.
    assert!(t
        .tcp_load(TESTNET, "198.19.0.1:80", 10, 5000)
        .starts_with("ok=10 failed=0"));
}

/// Services from Kubernetes: the restarted xvs adopts their flows once
/// its first copy of the API server's Services and EndpointSlices is in
/// (until then the program holds the VIP's packets), so they survive too.
#[test]
fn flows_of_kubernetes_services_survive_kill_9() {
    if !privileged("flows_of_kubernetes_services_survive_kill_9") {
        return;
    }
    use serde_json::json;
    use xvs_vm_tests::fakekube::{FakeKube, Kind};
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let gw_ns = t.gateway.name().to_owned();
    let fake = std::thread::spawn(move || {
        xvs_vm_tests::netns::Netns::existing(&gw_ns)
            .enter_current_thread()
            .unwrap();
        FakeKube::start().unwrap()
    })
    .join()
    .unwrap();
    let scratch = ScratchDir::new(&t, "restart-kube").unwrap();
    let state = scratch.path().join("state");
    let kubeconfig = scratch.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).unwrap();
    fake.apply(
        Kind::Service,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop",
                         "annotations": {"xvs.io/scheduler": "mh"},
                         "labels": {"service.kubernetes.io/service-proxy-name": "xvs"}},
            "spec": {"clusterIP": "198.19.0.9", "clusterIPs": ["198.19.0.9"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        }),
    );
    fake.apply(
        Kind::EndpointSlice,
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": (0..3).map(|i| json!({
                "addresses": [backend_addr(i).to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false}
            })).collect::<Vec<_>>(),
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }),
    );
    let text = format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\n\
         xdp_mode = \"native\"\nzero_copy = \"off\"\n\n[snat]\naddresses = [\"198.18.1.2\"]\n\n\
         [kubernetes]\nenabled = true\nkubeconfig = \"{}\"\n\n\
         [restart]\nhold = \"5s\"\nstate_dir = \"{}\"\n",
        t.gateway_client_if,
        kubeconfig.display(),
        state.display()
    );
    prepare(scratch.path(), &text);
    let (gw, _) = Daemon::start(&t, "rk", &bins(), &text, &[]).unwrap();
    // The service arrives from the API server.
    for _ in 0..250 {
        if gw.get("/v1/status").contains("\"kube_services\":1") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let capture = Capture::start(&t, scratch.path());
    let mut cmd = t.client.ns.command(TESTNET);
    cmd.args([
        "streams",
        "--connect",
        "198.19.0.9:80",
        "--connections",
        "50",
        "--seconds",
        "10",
    ]);
    let clients = vec![Spawned::start(cmd, "streams", STREAMS_READY).unwrap().0];
    std::thread::sleep(Duration::from_secs(2));
    let before = flows(&gw);
    assert_eq!(before.len(), 50);
    gw.kill(libc::SIGKILL);
    let (gw, _) = Daemon::start(&t, "rk", &bins(), &text, &[]).unwrap();
    // Adoption waits for the first whole copy from the API server.
    let mut status = serde_json::Value::Null;
    for _ in 0..250 {
        status = serde_json::from_str(&gw.get("/v1/status")).unwrap_or_default();
        if status["restart"]["adopted_flows"].as_u64() == Some(50) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        status["restart"]["adopted_flows"].as_u64(),
        Some(50),
        "{status}"
    );
    assert_eq!(flows(&gw), before, "flows moved across the restart");
    let (ok, stall, out) = finish(clients, Duration::from_secs(60));
    assert_eq!(ok, 50, "{out}");
    let resets = capture.resets();
    assert!(
        resets.is_empty(),
        "clients saw resets:\n{}",
        resets.join("\n")
    );
    println!("restart figures (kubernetes, kill -9): longest stream stall {stall} ms, {ok}/50 connections survived");
}

/// A guard releases only the program its own instance attached: a
/// successor with another state directory (so no shared lock) that took
/// the program over keeps it after the first instance's window ends.
#[test]
fn a_guard_leaves_a_successors_program_alone() {
    if !privileged("a_guard_leaves_a_successors_program_alone") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let scratch = ScratchDir::new(&t, "restart-guard").unwrap();
    // A window long enough for the successor to start inside it on a
    // slow host: the test is about a guard whose window ends after a
    // successor took its program over.
    let hold = Duration::from_secs(4);
    let first = config(&t, &scratch.path().join("a"), "4s");
    let (gw, _) = Daemon::start(&t, "ga", &bins(), &first, &[]).unwrap();
    gw.stop();
    let stopped = Instant::now();
    let second = config(&t, &scratch.path().join("b"), "500ms");
    assert!(link_has_program(&t), "the first window holds its program");
    let (gw, _) = Daemon::start(&t, "gb", &bins(), &second, &[]).unwrap();
    assert!(
        stopped.elapsed() < hold,
        "the successor started after the first window ended ({:?}): nothing to test",
        stopped.elapsed()
    );
    // The first instance's window ends, and its guard looks.
    std::thread::sleep((hold + Duration::from_millis(1000)).saturating_sub(stopped.elapsed()));
    assert!(
        link_has_program(&t),
        "the first guard detached the successor's program"
    );
    let load = t.tcp_load(TESTNET, "198.19.0.1:80", 20, 2000);
    assert!(load.starts_with("ok=20 failed=0"), "{load}");
    gw.stop();
    assert!(
        xvs_vm_tests::daemon::detached(&t.gateway, &t.gateway_client_if),
        "the second guard left its program"
    );
}

/// Killed twice in a row, as a crash-looping unit or an impatient
/// operator does: the second instance starts inside the first one's hold
/// window and is killed before that window ends. The first guard then
/// finds the lock free, but the state is the second instance's, for the
/// next start: that guard leaves it, and the third instance adopts the
/// flows (CI once saw the first guard remove it and the third start
/// empty).
#[test]
fn a_successor_killed_inside_the_window_leaves_its_state_to_the_next() {
    if !privileged("a_successor_killed_inside_the_window_leaves_its_state_to_the_next") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let scratch = ScratchDir::new(&t, "restart-twice").unwrap();
    let state = scratch.path().join("state");
    // The first window short, the later ones long: the test waits for the
    // first guard, then starts the third instance well inside the second
    // window.
    let short = config(&t, &state, "3s");
    let long = config(&t, &state, "10s");
    let (gw, _) = Daemon::start(&t, "rt", &bins(), &short, &[]).unwrap();
    let load = t.tcp_load(TESTNET, "198.19.0.1:80", 20, 5000);
    assert!(load.starts_with("ok=20 failed=0"), "{load}");
    let first = gw.pid();
    assert!(guard_runs(first), "no guard for the first instance");
    let (status, _) = gw.kill(libc::SIGKILL);
    assert!(status.is_some());
    let adopted = |gw: &Daemon| {
        let status: serde_json::Value = serde_json::from_str(&gw.get("/v1/status")).unwrap();
        status["restart"]["adopted_flows"].as_u64().unwrap_or(0)
    };
    let (gw, _) = Daemon::start(&t, "rt", &bins(), &long, &[]).unwrap();
    assert!(
        adopted(&gw) >= 20,
        "the second instance adopted {}",
        adopted(&gw)
    );
    let (status, _) = gw.kill(libc::SIGKILL);
    assert!(status.is_some());
    let second_killed = Instant::now();
    // The first window ends and its guard looks, then exits.
    let waited = Instant::now();
    while guard_runs(first) && waited.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!guard_runs(first), "the first guard still runs");
    assert!(
        second_killed.elapsed() < Duration::from_secs(8),
        "the second window nearly over ({:?}): nothing to test",
        second_killed.elapsed()
    );
    assert!(link_has_program(&t), "the second instance's program went");
    assert_eq!(
        state_files(&state).len(),
        1,
        "the first guard removed the state"
    );
    let (gw, _) = Daemon::start(&t, "rt", &bins(), &long, &[]).unwrap();
    assert!(
        adopted(&gw) >= 20,
        "the third instance adopted {}",
        adopted(&gw)
    );
    let load = t.tcp_load(TESTNET, "198.19.0.1:80", 20, 5000);
    assert!(load.starts_with("ok=20 failed=0"), "{load}");
    gw.stop();
}
