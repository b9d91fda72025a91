//! Forwarding benchmark on the namespace topology (two-arm: client, gateway,
//! one backend): the UDP packets per second that reach the backend through
//! (1) a raw AF_XDP forwarder on the gateway's veths — MAC rewrite only,
//! the same sockets and UMEM as xvs, the ceiling of this path — and
//! (2) xvs, full NAT with conntrack, in the same run, with the same
//! offered load (one flow from a kernel UDP sender). Prints a table and
//! the ratio. Run as root: `cargo run --release -p xvs-benches --bin
//! xvs-fwd-bench` (after building the workspace's binaries in release).

#![allow(clippy::disallowed_types)] // a benchmark measures real time
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xsk_rs::FrameDesc;
use xvs_config::XdpAttachMode;
use xvs_dataplane::steer::Steering;
use xvs_dataplane::xsk::{XskPort, BATCH};
use xvs_vm_tests::netns::Netns;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, Arms, Spec, Topology};

const SECONDS: &str = "4";

fn sibling(name: &str) -> Result<PathBuf, String> {
    let mut p = std::env::current_exe().map_err(|e| e.to_string())?;
    p.set_file_name(name);
    p.exists().then_some(p.clone()).ok_or_else(|| {
        format!(
            "{} not found: build the workspace's binaries first",
            p.display()
        )
    })
}

fn mac_of(ns: &Netns, ifname: &str) -> Result<[u8; 6], String> {
    let out = ns
        .ip(&["link", "show", ifname])
        .map_err(|e| e.to_string())?
        .stdout;
    let text = String::from_utf8_lossy(&out);
    let mac = text
        .split("link/ether ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .ok_or("no MAC")?;
    let bytes: Vec<u8> = mac
        .split(':')
        .filter_map(|h| u8::from_str_radix(h, 16).ok())
        .collect();
    bytes.try_into().map_err(|_| format!("bad MAC {mac}"))
}

/// Runs `blast` from the client to `to` against a sink on the backend;
/// returns (sent pps, received pps).
fn measure(t: &Topology, testnet: &str, to: &str) -> Result<(f64, f64), String> {
    let b = &t.backends[0];
    let mut sink = b.ns.command(testnet);
    sink.args([
        "sink",
        "--listen",
        &format!("{}:9000", b.addr),
        "--seconds",
        "6",
    ]);
    let (sink, _) =
        Spawned::start(sink, "sink", Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let out = t
        .client
        .ns
        .exec(
            testnet,
            &["blast", "--to", to, "--seconds", SECONDS, "--size", "18"],
        )
        .map_err(|e| e.to_string())?;
    let sent = String::from_utf8_lossy(&out.stdout).into_owned();
    let (_, printed) = sink.stop(0, Duration::from_secs(10));
    let pps = |text: &str| -> f64 {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix("pps="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    Ok((pps(&sent), pps(&printed)))
}

/// The raw forwarder: frames for the backend's address arrive on the
/// client-side socket, get the backend's MAC and the gateway's, and leave
/// on the backend-side socket. Nothing else.
fn raw_forwarder(
    gw: String,
    backend: std::net::Ipv4Addr,
    macs: ([u8; 6], [u8; 6]),
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Result<(), String> {
    Netns::existing(&gw)
        .enter_current_thread()
        .map_err(|e| e.to_string())?;
    let steering = Steering::attach("gc", XdpAttachMode::Native).map_err(|e| e.to_string())?;
    steering.add_address(backend).map_err(|e| e.to_string())?;
    let mut port = XskPort::open(&["gc", "gb"], 0, Some(false), None).map_err(|e| e.to_string())?;
    steering
        .register_socket(0, port.fd(0))
        .map_err(|e| e.to_string())?;
    let mut rx = vec![FrameDesc::default(); BATCH];
    let (dst, src) = macs;
    let mut forwarded = 0u64;
    while !stop.load(Ordering::Relaxed) {
        port.reclaim();
        port.refill();
        let n = port.receive(0, &mut rx);
        for d in rx.iter_mut().take(n) {
            // SAFETY: a frame just received on this port, referenced nowhere else.
            unsafe {
                port.with_frame(d, |buf, len| {
                    if len >= 12 {
                        buf[0..6].copy_from_slice(&dst);
                        buf[6..12].copy_from_slice(&src);
                    }
                });
            }
        }
        forwarded += port.transmit(1, &rx[..n]) as u64;
    }
    done.store(forwarded, Ordering::Relaxed);
    Ok(())
}

fn bench() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("run as root: the bench creates namespaces and attaches XDP".into());
    }
    let testnet = sibling("xvs-testnet")?;
    let testnet = testnet.to_str().unwrap_or_default();
    let xvs = sibling("xvs")?;
    let t = Topology::build(Spec {
        arms: Arms::Two,
        backends: 1,
        queues: 1,
    })
    .map_err(|e| e.to_string())?;
    let backend = backend_addr(0);
    let macs = (mac_of(&t.backends[0].ns, "b0")?, mac_of(&t.gateway, "gb")?);

    // 1. Raw AF_XDP forwarder, client -> backend address directly.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let fwd = {
        let (gw, stop, done) = (t.gateway.name().to_owned(), stop.clone(), done.clone());
        std::thread::spawn(move || raw_forwarder(gw, backend, macs, stop, done))
    };
    std::thread::sleep(Duration::from_millis(500));
    let raw = measure(&t, testnet, &format!("{backend}:9000"));
    stop.store(true, Ordering::Relaxed);
    fwd.join().map_err(|_| "forwarder panicked")??;
    let raw = raw?;
    let raw_forwarded = done.load(Ordering::Relaxed) as f64;

    // 2. xvs, client -> VIP, full NAT to the same backend.
    let dir = std::env::temp_dir().join(format!("xvs-fwd-bench-{}", t.tag));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let cfg = dir.join("xvs.toml");
    let text = format!(
        "[interfaces]\nmode = \"two-arm\"\nclient = \"gc\"\nbackend = \"gb\"\nqueues = [0]\ncores = [0]\npoll = \"busy\"\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\"]\n\n[[services]]\nvip = \"198.19.0.1\"\nprotocol = \"udp\"\nport = 9000\nscheduler = \"rr\"\n\
         backends = [{{ address = \"{backend}\", port = 9000 }}]\n"
    );
    std::fs::write(&cfg, text).map_err(|e| e.to_string())?;
    let mut cmd = t.gateway.command(xvs.to_str().unwrap_or_default());
    cmd.args(["run", "--config", cfg.to_str().unwrap_or_default()]);
    let (proc_, _) =
        Spawned::start(cmd, "xvs", Duration::from_secs(20)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(500));
    let through_xvs = measure(&t, testnet, "198.19.0.1:9000");
    let (_, printed) = proc_.stop(libc::SIGTERM, Duration::from_secs(10));
    let through_xvs = through_xvs?;
    let _ = std::fs::remove_dir_all(&dir);

    let secs: f64 = SECONDS.parse().unwrap_or(1.0);
    let xvs_forwarded = printed
        .lines()
        .find(|l| l.starts_with("worker 0:"))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix("forwarded="))
        })
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let ratio = if raw.1 > 0.0 {
        through_xvs.1 / raw.1
    } else {
        0.0
    };
    println!("forwarding through the gateway, one UDP flow, 18-byte payloads ({SECONDS} s each, same topology):");
    println!(
        "{:<22} {:>12} {:>14} {:>14} {:>7}",
        "mode", "offered pps", "forwarded pps", "delivered pps", "of raw"
    );
    println!(
        "{:<22} {:>12.0} {:>14.0} {:>14.0} {:>7}",
        "raw AF_XDP forwarder",
        raw.0,
        raw_forwarded / secs,
        raw.1,
        "1.00"
    );
    println!(
        "{:<22} {:>12.0} {:>14.0} {:>14.0} {:>7.2}",
        "xvs (full NAT)",
        through_xvs.0,
        xvs_forwarded / secs,
        through_xvs.1,
        ratio
    );
    println!("(\"of raw\" compares delivered pps; forwarded pps is what each forwarder sent in the {SECONDS} s window)");
    if let Some(line) = printed.lines().find(|l| l.starts_with("worker 0:")) {
        println!("xvs {line}");
    }
    Ok(())
}

fn main() -> ExitCode {
    match bench() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xvs-fwd-bench: {e}");
            ExitCode::from(1)
        }
    }
}
