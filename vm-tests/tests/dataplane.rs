//! xvs itself on the real AF_XDP path in network namespaces: real TCP
//! connections through a VIP to real backends, full NAT, and the counters
//! and frames accounted for when it stops.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::time::Duration;

use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, Arms, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");

/// The `xvs` binary, built beside this test's binaries.
fn xvs_bin() -> PathBuf {
    let mut p = PathBuf::from(env!("CARGO_BIN_EXE_xvs-testnet"));
    p.set_file_name("xvs");
    assert!(
        p.exists(),
        "{} missing: build the workspace (cargo build) first",
        p.display()
    );
    p
}

fn config(t: &Topology, scheduler: &str) -> String {
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    format!(
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

[[services]]
vip = "198.19.0.1"
port = 80
scheduler = "{scheduler}"
backends = [{}]
"#,
        t.gateway_client_if,
        backends.join(", ")
    )
}

fn servers(t: &Topology) -> Vec<Spawned> {
    t.backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut cmd = b.ns.command(TESTNET);
            cmd.args([
                "serve",
                "--name",
                &format!("b{i}"),
                "--tcp",
                &format!("{}:8080", b.addr),
            ]);
            Spawned::start(cmd, "echo server", Duration::from_secs(5))
                .unwrap()
                .0
        })
        .collect()
}

/// `key=value` of a summary line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} not in {line}"))
}

#[test]
fn a_thousand_tcp_connections_through_a_vip() {
    if !privileged("a_thousand_tcp_connections_through_a_vip") {
        return;
    }
    let t = Topology::build(Spec {
        arms: Arms::One,
        backends: 3,
        queues: 1,
    })
    .unwrap();
    let _servers = servers(&t);
    let dir = std::env::temp_dir().join(format!("xvs-e2e-{}", t.tag));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("xvs.toml");
    std::fs::write(&cfg, config(&t, "rr")).unwrap();
    let mut cmd = t.gateway.command(xvs_bin().to_str().unwrap());
    cmd.args(["run", "--config", cfg.to_str().unwrap()]);
    let (xvs, ready) = Spawned::start(cmd, "xvs", Duration::from_secs(20)).unwrap();
    assert!(ready.starts_with("ready: 1 services on g0"), "{ready}");

    let out = t
        .client
        .ns
        .exec(
            TESTNET,
            &[
                "tcp",
                "--connect",
                "198.19.0.1:80",
                "--connections",
                "1000",
                "--concurrency",
                "32",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let summary = String::from_utf8(out.stdout).unwrap();
    assert!(summary.starts_with("ok=1000 failed=0 by="), "{summary}");
    // rr with one worker: the counts differ by at most one.
    let counts: Vec<u32> = summary
        .trim()
        .rsplit("by=")
        .next()
        .unwrap()
        .split(',')
        .map(|kv| kv.split(':').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 3, "{summary}");
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{summary}"
    );

    let (status, printed) = xvs.stop(libc::SIGTERM, Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "xvs exit {status:?}: {printed}"
    );
    let line = printed
        .lines()
        .find(|l| l.starts_with("worker 0:"))
        .unwrap_or_else(|| panic!("{printed}"));
    eprintln!("{summary}{line}");
    let rx = field(line, "rx");
    let sum = field(line, "forwarded")
        + field(line, "answered")
        + field(line, "consumed")
        + field(line, "dropped");
    assert_eq!(rx, sum, "{line}");
    assert!(line.contains("frames_accounted=true"), "{line}");
    assert_eq!(field(line, "new_flows"), 1000, "{line}");
    // The steering program is gone from the interface.
    let link = t.gateway.ip(&["-d", "link", "show", "g0"]).unwrap().stdout;
    assert!(!String::from_utf8_lossy(&link).contains("prog/xdp"));
    let _ = std::fs::remove_dir_all(&dir);
}
