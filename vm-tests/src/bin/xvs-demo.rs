//! `make demo`: xvs's main job on a built-in network-namespace topology —
//! a client, a gateway running xvs (AF_XDP, full NAT) and three backends
//! running real TCP servers — then real connections to the IPv4 and the IPv6 VIP, the
//! per-backend connection counts and the throughput, and cleanup.

#![allow(clippy::disallowed_types)] // a demo measures real time
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{
    backend_addr, backend_addr6, Spec, Topology, SNAT_ADDR6, VIP6 as VIP6_ADDR,
};

const VIP: &str = "198.19.0.1:80";
const VIP6: &str = "[2001:2:ff::1]:80";

fn sibling(name: &str) -> Result<PathBuf, String> {
    let mut p = std::env::current_exe().map_err(|e| e.to_string())?;
    p.set_file_name(name);
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found (build the workspace first)",
            p.display()
        ))
    }
}

fn demo() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the demo creates network namespaces and attaches XDP: run it as root".into());
    }
    let xvs = sibling("xvs")?;
    let testnet = sibling("xvs-testnet")?;
    let t = Topology::build(Spec::one_arm(3)).map_err(|e| e.to_string())?;
    println!(
        "topology {}: client 198.18.0.2 and 2001:2::2 -> gateway (xvs on {}) -> backends 198.18.1.10-12:8080 and [2001:2:0:1::10-12]:8080",
        t.tag, t.gateway_client_if
    );

    let servers = t
        .echo_servers(testnet.to_str().unwrap_or_default(), "backend-", 8080, None)
        .map_err(|e| e.to_string())?;
    // The same backends on IPv6, for the IPv6 service.
    let servers6 = t
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut cmd = b.ns.command(testnet.to_str().unwrap_or_default());
            cmd.args(["serve", "--name", &format!("backend6-{i}"), "--tcp"])
                .arg(format!("[{}]:8080", b.addr6));
            Spawned::start(cmd, "echo server", Duration::from_secs(5)).map(|(s, _)| s)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let backends: Vec<String> = (0..3)
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    let backends6: Vec<String> = (0..3)
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr6(i)))
        .collect();
    let config = format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\npoll = \"adaptive\"\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\", \"{SNAT_ADDR6}\"]\n\n\
         [[services]]\nvip = \"198.19.0.1\"\nport = 80\nscheduler = \"wlc\"\nbackends = [{}]\n\n\
         [[services]]\nvip = \"{VIP6_ADDR}\"\nport = 80\nscheduler = \"wlc\"\nbackends = [{}]\n",
        t.gateway_client_if,
        backends.join(", "),
        backends6.join(", ")
    );
    let dir = std::env::temp_dir().join(format!("xvs-demo-{}", t.tag));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let config = format!(
        "{config}\n[admin]\nsocket = \"{}\"\n\n[restart]\nhold = \"2s\"\nstate_dir = \"{}\"\n",
        dir.join("xvs.sock").display(),
        dir.join("state").display()
    );
    let cfg = dir.join("xvs.toml");
    std::fs::write(&cfg, &config).map_err(|e| e.to_string())?;
    println!("\nconfig {}:\n{config}", cfg.display());

    let start_xvs = || {
        let mut cmd = t.gateway.command(xvs.to_str().unwrap_or_default());
        cmd.args(["run", "--config", cfg.to_str().unwrap_or_default()]);
        Spawned::start(cmd, "xvs", Duration::from_secs(20)).map_err(|e| e.to_string())
    };
    let (xvs_proc, ready) = start_xvs()?;
    println!("xvs: {ready}");

    let load = |args: &[&str]| -> Result<(String, Duration), String> {
        let start = Instant::now();
        let out = t
            .client
            .ns
            .exec(testnet.to_str().unwrap_or_default(), args)
            .map_err(|e| e.to_string())?;
        Ok((
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            start.elapsed(),
        ))
    };
    let n = 3000;
    let (summary, took) = load(&[
        "tcp",
        "--connect",
        VIP,
        "--connections",
        &n.to_string(),
        "--concurrency",
        "32",
        "--payload",
        "1000",
    ])?;
    println!("\n{n} connections to {VIP}, 1000 bytes echoed each: {summary}");
    println!("  {:.0} connections/s", f64::from(n) / took.as_secs_f64());
    for part in summary.rsplit("by=").next().unwrap_or_default().split(',') {
        if let Some((name, count)) = part.split_once(':') {
            println!("  {name}: {count} connections");
        }
    }
    let (summary, took) = load(&[
        "tcp",
        "--connect",
        VIP6,
        "--connections",
        "1000",
        "--concurrency",
        "32",
        "--payload",
        "1000",
    ])?;
    println!("\n1000 connections to the IPv6 VIP {VIP6}: {summary}");
    println!("  {:.0} connections/s", 1000.0 / took.as_secs_f64());
    let bytes = 3 * 64 * 1024 * 1024u64;
    let (summary, took) = load(&[
        "tcp",
        "--connect",
        VIP,
        "--connections",
        "3",
        "--concurrency",
        "3",
        "--payload",
        "67108864",
        "--timeout-ms",
        "20000",
    ])?;
    println!("\n3 streams of 64 MiB echoed through the VIP: {summary}");
    println!(
        "  {:.1} MB/s each way",
        bytes as f64 / took.as_secs_f64() / 1e6
    );

    // A crash in the middle of long-lived connections: kill -9, start
    // again; the connections go on (see README, Operations).
    let mut streams = t.client.ns.command(testnet.to_str().unwrap_or_default());
    streams.args([
        "streams",
        "--connect",
        VIP,
        "--connections",
        "20",
        "--seconds",
        "6",
    ]);
    let (streams, _) =
        Spawned::start(streams, "streams", Duration::from_secs(20)).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(1500));
    let killed = Instant::now();
    xvs_proc.stop(libc::SIGKILL, Duration::from_secs(10));
    let (xvs_proc, _) = start_xvs()?;
    let back = killed.elapsed();
    let (_, out) = streams.wait(Duration::from_secs(60));
    let summary = out
        .lines()
        .find(|l| l.starts_with("ok="))
        .unwrap_or("no summary");
    println!(
        "\n20 long-lived connections across kill -9 of xvs and a start {} ms later: {summary}",
        back.as_millis()
    );

    // The operator's view, as ipvsadm shows it.
    let xvsadm = sibling("xvsadm")?;
    let socket = dir.join("xvs.sock");
    for args in [&["-Ln"][..], &["-Ln", "--stats"][..]] {
        let out = std::process::Command::new(&xvsadm)
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .output()
            .map_err(|e| e.to_string())?;
        println!("\n$ xvsadm {}", args.join(" "));
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
    // And as `xvs status` sums it up (cilium status's one screen).
    let out = std::process::Command::new(&xvs)
        .arg("status")
        .arg("--socket")
        .arg(&socket)
        .output()
        .map_err(|e| e.to_string())?;
    println!("\n$ xvs status");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));

    let (status, printed) = xvs_proc.stop(libc::SIGTERM, Duration::from_secs(10));
    println!(
        "\nxvs stopped ({}):",
        status.map_or("killed".into(), |s| s.to_string())
    );
    for line in printed.lines() {
        println!("  {line}");
    }
    drop(servers);
    drop(servers6);
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
    println!("\nnamespaces removed; done.");
    Ok(())
}

fn main() -> ExitCode {
    match demo() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xvs-demo: {e}");
            ExitCode::from(1)
        }
    }
}
