//! The namespace harness itself, on real veths with real TCP and UDP: the
//! topologies carry traffic (through the gateway's kernel forwarding; the
//! data-plane tests put xvs there), offloads are off, queues are as asked,
//! and everything is gone afterwards, also after a panic.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use xvs_vm_tests::netns::{leftover_namespaces, run};
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, Arms, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");

fn namespaces_now() -> Vec<String> {
    let out = run("ip", &["netns", "list"]).unwrap().stdout;
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Starts an echo server named `b{i}` in every backend.
fn servers(t: &Topology) -> Vec<Spawned> {
    t.echo_servers(TESTNET, "b", 8080, Some(5353)).unwrap()
}

fn load(t: &Topology, args: &[&str]) -> String {
    let out = t
        .client
        .ns
        .exec(TESTNET, args)
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn two_arm_topology_carries_real_tcp_and_udp() {
    if !privileged("two_arm_topology_carries_real_tcp_and_udp") {
        return;
    }
    let t = Topology::build(Spec {
        arms: Arms::Two,
        backends: 3,
        queues: 2,
    })
    .unwrap();
    let names = t.namespaces();
    let _servers = servers(&t);
    for i in 0..3 {
        let to = format!("{}:8080", backend_addr(i));
        let summary = load(
            &t,
            &[
                "tcp",
                "--connect",
                &to,
                "--connections",
                "334",
                "--concurrency",
                "32",
            ],
        );
        assert_eq!(summary, format!("ok=334 failed=0 by=b{i}:334"));
        let to = format!("{}:5353", backend_addr(i));
        assert_eq!(
            load(&t, &["udp", "--connect", &to, "--requests", "50"]),
            format!("ok=50 failed=0 by=b{i}:50")
        );
    }
    // A long-lived stream of 4 MiB echoes intact too.
    let to = format!("{}:8080", backend_addr(0));
    let summary = load(
        &t,
        &[
            "tcp",
            "--connect",
            &to,
            "--connections",
            "1",
            "--payload",
            "4194304",
        ],
    );
    assert_eq!(summary, "ok=1 failed=0 by=b0:1");

    // Offloads are off and the gateway links have the queues asked for.
    let k = t.gateway.exec("ethtool", &["-k", "gc"]).unwrap().stdout;
    let k = String::from_utf8_lossy(&k);
    for feature in [
        "tcp-segmentation-offload: off",
        "generic-segmentation-offload: off",
        "generic-receive-offload: off",
        "tx-checksumming: off",
    ] {
        assert!(k.contains(feature), "{feature} not in:\n{k}");
    }
    let q = t
        .gateway
        .exec("ls", &["/sys/class/net/gb/queues"])
        .unwrap()
        .stdout;
    assert_eq!(
        String::from_utf8_lossy(&q)
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["rx-0", "rx-1", "tx-0", "tx-1"]
    );

    drop(_servers);
    drop(t);
    let now = namespaces_now();
    assert!(
        names.iter().all(|n| !now.contains(n)),
        "left behind: {now:?}"
    );
}

#[test]
fn one_arm_topology_carries_real_tcp() {
    if !privileged("one_arm_topology_carries_real_tcp") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    assert_eq!(t.gateway_backend_if, None);
    let _servers = servers(&t);
    for i in 0..2 {
        let to = format!("{}:8080", backend_addr(i));
        let summary = load(
            &t,
            &[
                "tcp",
                "--connect",
                &to,
                "--connections",
                "100",
                "--concurrency",
                "16",
            ],
        );
        assert_eq!(summary, format!("ok=100 failed=0 by=b{i}:100"));
    }
}

#[test]
fn a_failed_load_is_reported_not_hidden() {
    if !privileged("a_failed_load_is_reported_not_hidden") {
        return;
    }
    let t = Topology::build(Spec {
        arms: Arms::Two,
        backends: 1,
        queues: 1,
    })
    .unwrap();
    // No server: every connection is refused, and the client says so.
    let to = format!("{}:8080", backend_addr(0));
    let err = t
        .client
        .ns
        .exec(
            TESTNET,
            &[
                "tcp",
                "--connect",
                &to,
                "--connections",
                "3",
                "--timeout-ms",
                "1000",
            ],
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("connection 0: connect"), "{err}");
}

#[test]
fn everything_is_removed_even_when_a_test_panics() {
    if !privileged("everything_is_removed_even_when_a_test_panics") {
        return;
    }
    let names = std::panic::catch_unwind(|| {
        let t = Topology::build(Spec {
            arms: Arms::Two,
            backends: 2,
            queues: 1,
        })
        .unwrap();
        let names = t.namespaces();
        assert!(names.iter().all(|n| namespaces_now().contains(n)));
        std::panic::panic_any(names)
    })
    .unwrap_err()
    .downcast::<Vec<String>>()
    .unwrap();
    let now = namespaces_now();
    assert!(
        names.iter().all(|n| !now.contains(n)),
        "left behind: {now:?}"
    );
    // The suite-level check sees only namespaces of tests still running.
    let _ = leftover_namespaces();
}
