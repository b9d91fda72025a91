//! `xvs-dsr-bench`: what direct routing saves the gateway when answers
//! are the bulk of the bytes. Real HTTP in a one-arm namespace topology:
//! wrk on the client fetches a file 100 times the size of its request
//! (10 KiB) through the VIP from two nginx real servers, once with full
//! NAT (`masq`: every answer crosses xvs) and once with direct routing
//! (`route`: the real servers hold the VIP on `lo` and answer over the
//! switch). Printed per mode: requests/s, bytes delivered, the frames xvs
//! handled, and xvs's CPU time (utime + stime of the daemon), each per
//! delivered MiB, with the route/masq ratio. The two runs share one
//! window (same build, same machine state): only their ratio is a
//! result; the absolute figures move with the machine.

#![allow(clippy::disallowed_types)] // a benchmark measures real time

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use xvs_vm_tests::daemon::{self, Daemon};
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::topology::{backend_addr, one_arm_head, Spec, Topology};
use xvs_vm_tests::wrk::Wrk;

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// The answer: 100 times a ~100-byte request.
const FILE_BYTES: usize = 10 * 1024;

#[derive(Parser)]
#[command(
    version,
    about = "The gateway's cost per delivered byte: full NAT against direct routing, real HTTP"
)]
struct Cli {
    /// Seconds of load per mode.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
}

/// One mode's figures.
struct Run {
    mode: &'static str,
    wrk: Wrk,
    frames: u64,
    cpu_seconds: f64,
}

impl Run {
    fn mib(&self) -> f64 {
        self.wrk.bytes / f64::from(1u32 << 20)
    }
    fn cpu_ms_per_mib(&self) -> f64 {
        self.cpu_seconds * 1e3 / self.mib().max(1e-9)
    }
    fn frames_per_mib(&self) -> f64 {
        self.frames as f64 / self.mib().max(1e-9)
    }
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> Result<f64, String> {
    xvs_benches::procstat::cpu_seconds(std::path::Path::new(&format!("/proc/{pid}/stat")))
}

/// Frames xvs's workers received, from its `/metrics`.
fn rx_frames(metrics: &str) -> u64 {
    daemon::sample_sum(metrics, "xvs_rx_frames_total") as u64
}

fn config(t: &Topology, forward: &str) -> String {
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| match forward {
            "route" => format!(
                "{{ address = \"{}\", forward = \"route\" }}",
                backend_addr(i)
            ),
            _ => format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)),
        })
        .collect();
    format!(
        "{}\n[[services]]\nvip = \"{VIP}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n",
        one_arm_head(t, 1),
        backends.join(", ")
    )
}

fn measure(t: &Topology, mode: &'static str, seconds: u32) -> Result<Run, String> {
    let bins = daemon::bins(
        &std::env::current_exe()
            .map_err(|e| e.to_string())?
            .display()
            .to_string(),
    );
    let (xvs, _) = Daemon::start(t, &format!("dsr-{mode}"), &bins, &config(t, mode), &[])?;
    let url = format!("http://{VIP}/files/big");
    let warm = Wrk::start(&t.client.ns, &url, 1, false)
        .join()
        .map_err(|_| "wrk panicked")?;
    if warm.requests == 0 {
        return Err(format!("{mode}: no answer through the VIP: {}", warm.text));
    }
    let cpu0 = cpu_seconds(xvs.pid())?;
    let rx0 = rx_frames(&xvs.get("/metrics"));
    let wrk = Wrk::start(&t.client.ns, &url, seconds, false)
        .join()
        .map_err(|_| "wrk panicked")?;
    let cpu1 = cpu_seconds(xvs.pid())?;
    let frames = rx_frames(&xvs.get("/metrics")).saturating_sub(rx0);
    xvs.stop_accounted();
    if wrk.errors > 0 || wrk.non_2xx > 0 {
        return Err(format!("{mode}: wrk saw errors: {}", wrk.text));
    }
    Ok(Run {
        mode,
        wrk,
        frames,
        cpu_seconds: cpu1 - cpu0,
    })
}

fn bench(cli: &Cli) -> Result<(), String> {
    if !(1..=60).contains(&cli.seconds) {
        return Err(format!("--seconds {}: expected 1..=60", cli.seconds));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("run as root: the bench creates namespaces and attaches XDP".into());
    }
    let t = Topology::build(Spec::one_arm(2)).map_err(|e| e.to_string())?;
    let mut servers = Vec::new();
    for i in 0..2 {
        // Each real server answers on its own address (full NAT) and on
        // the VIP (direct routing).
        t.lvs_real_server(i, VIP).map_err(|e| e.to_string())?;
        let on = [
            SocketAddr::from((backend_addr(i), 8080)),
            SocketAddr::from((VIP, 80)),
        ];
        let n =
            Nginx::start_on(&t.backends[i].ns, &on, &format!("b{i}")).map_err(|e| e.to_string())?;
        n.put_file("big", FILE_BYTES).map_err(|e| e.to_string())?;
        servers.push(n);
    }
    let masq = measure(&t, "masq", cli.seconds)?;
    std::thread::sleep(Duration::from_millis(500));
    let route = measure(&t, "route", cli.seconds)?;
    println!(
        "xvs-dsr-bench: HTTP GET of {FILE_BYTES} B through {VIP}:80, wrk 16 connections keep-alive, {} s per mode",
        cli.seconds
    );
    println!(
        "{:<6} {:>10} {:>12} {:>12} {:>10} {:>14} {:>12}",
        "mode", "req/s", "MiB", "xvs frames", "xvs CPU s", "CPU ms / MiB", "frames / MiB"
    );
    for r in [&masq, &route] {
        println!(
            "{:<6} {:>10.0} {:>12.1} {:>12} {:>10.3} {:>14.3} {:>12.1}",
            r.mode,
            r.wrk.requests as f64 / f64::from(cli.seconds),
            r.mib(),
            r.frames,
            r.cpu_seconds,
            r.cpu_ms_per_mib(),
            r.frames_per_mib()
        );
    }
    println!(
        "route / masq: CPU per delivered byte {:.3}, frames per delivered byte {:.3}",
        route.cpu_ms_per_mib() / masq.cpu_ms_per_mib().max(1e-9),
        route.frames_per_mib() / masq.frames_per_mib().max(1e-9)
    );
    drop(servers);
    Ok(())
}

fn main() -> ExitCode {
    match bench(&Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xvs-dsr-bench: {e}");
            ExitCode::from(1)
        }
    }
}
