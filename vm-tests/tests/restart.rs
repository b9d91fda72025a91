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

use xvs_vm_tests::daemon::{Daemon, ScratchDir};
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";
/// One service per scheduler the issue names, each on its own port.
const SCHEDULERS: [(&str, u16); 4] = [("rr", 80), ("wlc", 81), ("sh", 82), ("mh", 83)];
const PER_SERVICE: u32 = 50;

fn bins() -> PathBuf {
    PathBuf::from(TESTNET).parent().unwrap().to_owned()
}

fn config(t: &Topology, state: &Path, hold: &str) -> String {
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    let mut text = format!(
        r#"[interfaces]
mode = "one-arm"
client = "{}"
queues = [0]
cores = [0]
poll = "adaptive"
xdp_mode = "native"
zero_copy = "off"

[snat]
addresses = ["198.18.1.2"]
ports = "1024-65535"

[restart]
hold = "{hold}"
state_dir = "{}"
"#,
        t.gateway_client_if,
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
            Spawned::start(cmd, "streams", Duration::from_secs(20))
                .unwrap()
                .0
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
    let json: serde_json::Value = serde_json::from_str(&gw.adm_ok(&["-Lnc", "--json"])).unwrap();
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

/// A packet capture on the client's interface, counting TCP resets.
struct Capture {
    tcpdump: Option<Spawned>,
    file: PathBuf,
}

impl Capture {
    fn start(t: &Topology, dir: &Path) -> Capture {
        let file = dir.join("client.pcap");
        let mut cmd = t.client.ns.command("tcpdump");
        cmd.args(["-i", &t.client.ifname, "-nn", "-U", "-w"])
            .arg(&file)
            .args(["tcp"]);
        let pcap = file.clone();
        let tcpdump = Spawned::start_until(cmd, "tcpdump", Duration::from_secs(10), || {
            pcap.metadata().is_ok_and(|m| m.len() > 0)
        })
        .unwrap();
        Capture {
            tcpdump: Some(tcpdump),
            file,
        }
    }

    /// Stops the capture; the resets it saw.
    fn resets(mut self) -> Vec<String> {
        if let Some(t) = self.tcpdump.take() {
            t.stop(libc::SIGINT, Duration::from_secs(5));
        }
        let out = Command::new("tcpdump")
            .args(["-nn", "-r"])
            .arg(&self.file)
            .arg("tcp[tcpflags] & tcp-rst != 0")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }
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
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".flows"))
                .collect()
        })
        .unwrap_or_default()
}

/// How the running instance is ended before its successor starts.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Signal(i32),
}

/// The scenario every variant shares: 200 streams, the instance ended,
/// `next` (a binary directory) started on the same configuration, and
/// every stream checked. Returns the figures line it prints.
fn survive(name: &str, ending: Ending, next: &Path) -> String {
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let scratch = ScratchDir::new(&t, &format!("restart-{name}")).unwrap();
    let state = scratch.path().join("state");
    let text = config(&t, &state, "5s");
    let (gw, _) = Daemon::start(&t, "rs", &bins(), &text, &[]).unwrap();
    let capture = Capture::start(&t, scratch.path());
    let clients = streams(&t, 12);
    std::thread::sleep(Duration::from_secs(2));
    let before = flows(&gw);
    assert_eq!(
        before.len(),
        (PER_SERVICE as usize) * SCHEDULERS.len(),
        "established flows before"
    );
    let Ending::Signal(sig) = ending;
    let killed = Instant::now();
    let (status, _) = gw.kill(sig);
    assert!(status.is_some(), "xvs did not end on signal {sig}");
    // The program stays, holding VIP packets; the state stays.
    assert!(link_has_program(&t), "the program went with the process");
    assert_eq!(state_files(&state).len(), 1, "{state:?}");
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
    assert_eq!(
        restart["replaced_programs"].as_array().map(Vec::len),
        Some(1),
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
    survive("sigkill", Ending::Signal(libc::SIGKILL), &bins());
}
