//! The example configs shipped under `config/examples/` validate, and mean
//! what their comments say; a minimal file gets IPVS's defaults.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::Ipv4Addr;
use std::path::Path;

use xvs_config::{
    load, parse_str, ArmMode, PollMode, Protocol, Scheduler, Steering, Timeouts, XdpAttachMode,
    ZeroCopy,
};

fn example(name: &str) -> xvs_config::Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    load(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn one_arm_with_three_services() {
    let c = example("one-arm.toml");
    assert_eq!(c.interfaces.mode, ArmMode::OneArm);
    assert_eq!(c.interfaces.backend, None);
    assert_eq!(c.workers(), 2);
    assert_eq!(c.services.len(), 3);
    let dns = &c.services[2];
    assert_eq!(dns.key.protocol, Protocol::Udp);
    assert_eq!(dns.scheduler, Scheduler::Sh);
    assert!(dns.flags.port && !dns.flags.fallback);
    // A backend without a port takes the service's.
    assert!(dns.backends.iter().all(|b| b.port == 53));
    assert_eq!(dns.backends[2].weight, 0);
    // The SNAT range is split evenly between the two workers.
    assert_eq!(c.snat.worker_ports.len(), 2);
    assert_eq!(c.snat.worker_ports[0].first, 1024);
    assert_eq!(c.snat.worker_ports[1].last, 65_535);
}

#[test]
fn two_arm_with_maglev_and_persistence() {
    let c = example("two-arm-maglev.toml");
    assert_eq!(c.interfaces.mode, ArmMode::TwoArm);
    assert_eq!(c.interfaces.backend.as_deref(), Some("eth1"));
    assert_eq!(c.interfaces.poll, PollMode::Busy);
    assert_eq!(c.interfaces.xdp_mode, XdpAttachMode::Native);
    assert_eq!(c.interfaces.zero_copy, ZeroCopy::On);
    let mh = &c.services[0];
    assert_eq!(mh.scheduler, Scheduler::Mh);
    assert_eq!(mh.maglev_table_size(), 65_537);
    assert!(mh.flags.fallback);
    assert_eq!(mh.source_ranges[0].to_string(), "198.18.0.0/16");
    let sticky = &c.services[1];
    assert_eq!(sticky.key.port, 0);
    let p = sticky.persistence.unwrap();
    assert_eq!(p.timeout_secs, 1800);
    assert_eq!(p.netmask, Ipv4Addr::new(255, 255, 255, 0));
    assert!(sticky.backends.iter().all(|b| b.port == 0));
    assert_eq!(c.conntrack.timeouts.established, 3600);
    assert_eq!(c.conntrack.timeouts.close, 10, "unset timeouts keep IPVS's");
    let tcp = c.admin.tcp.unwrap();
    assert_eq!(tcp.address.to_string(), "127.0.0.1:9180");
}

#[test]
fn dual_stack_is_one_service_per_family() {
    let c = example("dual-stack.toml");
    assert_eq!(c.snat.addresses, [Ipv4Addr::new(198, 18, 2, 1)]);
    assert_eq!(c.snat.addresses6.len(), 1);
    let web6 = &c.services[1];
    assert_eq!(web6.key.vip.to_string(), "2001:2:ff::1");
    assert!(web6.backends.iter().all(|b| b.address.is_ipv6()));
    assert_eq!(
        xvs_config::prefix_len(web6.persistence.unwrap().netmask),
        64
    );
    assert!(web6.narrow::<std::net::Ipv6Addr>().is_some());
}

#[test]
fn kubernetes_only() {
    let c = example("kubernetes.toml");
    assert!(c.kubernetes.enabled);
    assert_eq!(c.kubernetes.service_proxy_name, "xvs");
    assert!(c.services.is_empty());
}

#[test]
fn every_example_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 3, "expected at least three examples, found {n}");
}

#[test]
fn minimal_file_gets_the_defaults() {
    let c = parse_str(
        "xvs.toml",
        "[interfaces]\nclient = \"eth0\"\n[snat]\naddresses = [\"198.18.2.1\"]\n[[services]]\nvip = \"198.19.0.1\"\nport = 80\nbackends = [{ address = \"198.18.1.1\" }]\n",
    )
    .unwrap();
    assert_eq!(c.interfaces.mode, ArmMode::OneArm);
    assert_eq!(c.interfaces.queues, vec![0]);
    assert_eq!(c.interfaces.cores, vec![0]);
    assert_eq!(c.interfaces.poll, PollMode::Adaptive);
    assert_eq!(c.interfaces.steering, Steering::Vip);
    assert_eq!(c.interfaces.xdp_mode, XdpAttachMode::Auto);
    assert_eq!(c.interfaces.zero_copy, ZeroCopy::Auto);
    assert_eq!(c.snat.ports, xvs_config::DEFAULT_SNAT_PORTS);
    assert_eq!(c.conntrack.capacity, 1 << 20);
    // IPVS's defaults (ip_vs_proto_tcp.c, ip_vs_proto_udp.c).
    let t = c.conntrack.timeouts;
    assert_eq!(t, Timeouts::default());
    assert_eq!(
        [
            t.established,
            t.syn_sent,
            t.syn_recv,
            t.fin_wait,
            t.time_wait,
            t.close
        ],
        [900, 120, 60, 120, 120, 10]
    );
    assert_eq!(
        [t.close_wait, t.last_ack, t.synack, t.udp, t.icmp],
        [60, 30, 120, 300, 60]
    );
    assert_eq!(c.admin.socket.to_str(), Some("/run/xvs/xvs.sock"));
    assert!(c.admin.tcp.is_none());
    assert!(!c.kubernetes.enabled);
    assert_eq!(c.kubernetes.service_proxy_name, "xvs");
    let s = &c.services[0];
    assert_eq!(s.key.protocol, Protocol::Tcp);
    assert_eq!(s.scheduler, Scheduler::Wlc);
    assert_eq!(s.persistence, None);
    assert_eq!(s.backends[0].port, 80);
    assert_eq!(s.backends[0].weight, 1);
}

#[test]
fn direct_return_routes_tunnels_and_checks() {
    use xvs_config::{CheckKind, Encap, ForwardMethod};
    let c = example("direct-return.toml");
    let b = &c.services[0].backends;
    assert_eq!(
        b.iter().map(|b| (b.forward, b.port)).collect::<Vec<_>>(),
        [
            (ForwardMethod::Route, 80),
            (ForwardMethod::Route, 80),
            (ForwardMethod::Tunnel, 80)
        ]
    );
    assert_eq!(b[2].encap, Encap::Gue);
    assert_eq!(c.tunnel.gue_port, 6080);
    assert_eq!(
        c.checks.iter().map(|k| k.check.kind).collect::<Vec<_>>(),
        [CheckKind::Http, CheckKind::Http, CheckKind::Tcp]
    );
}

#[test]
fn active_backup_is_a_backup_on_a_group_with_a_key() {
    let c = example("active-backup.toml");
    let s = c.cluster.sync.unwrap();
    assert_eq!(s.role, xvs_config::SyncRole::Backup);
    assert!(s.multicast());
    assert_eq!(s.key_file.unwrap().to_str(), Some("/etc/xvs/sync.key"));
    assert_eq!(s.peer_timeout_ms, Some(3000));
    assert_eq!(c.cluster.hash_seed, 20_261_202);
}
