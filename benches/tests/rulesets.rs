//! The kube-proxy-shaped rule sets load into real iptables-legacy,
//! iptables-nft and nftables (in a namespace of the test's own), and the
//! one-endpoint change applies on top of them; the IPv6 shapes into
//! ip6tables-legacy and an `ip6` nftables table.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use xvs_benches::e2e::feed_timed;
use xvs_benches::rulesets::{
    iptables, iptables_change, nftables, nftables_change, nftables_empty, services,
};
use xvs_dataplane::wire::Endpoint;
use xvs_vm_tests::netns::{unique_tag, Netns};
use xvs_vm_tests::privileged;

/// Feeds `input` to `program args` in `ns`; panics with its stderr if it
/// fails.
fn feed(ns: &Netns, program: &str, args: &[&str], input: &str) {
    if let Err(e) = feed_timed(ns, program, args, input, Duration::from_secs(60)) {
        panic!("{program} {args:?}: {e}");
    }
}

fn text(ns: &Netns, program: &str, args: &[&str]) -> String {
    String::from_utf8(ns.exec(program, args).unwrap().stdout).unwrap()
}

fn target() -> Vec<Endpoint<IpAddr>> {
    (10..13)
        .map(|h| Endpoint {
            addr: Ipv4Addr::new(198, 18, 1, h).into(),
            port: 9000,
        })
        .collect()
}

fn target6() -> Vec<Endpoint<IpAddr>> {
    (0x10..0x13)
        .map(|h| Endpoint {
            addr: Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, h).into(),
            port: 9000,
        })
        .collect()
}

#[test]
fn rule_sets_load_and_change_in_every_kernel_mode() {
    if !privileged("rule_sets_load_and_change_in_every_kernel_mode") {
        return;
    }
    let ns = Netns::create(&unique_tag(), "rules").unwrap();
    let svcs = services(100, "udp", &target());
    let mut new = svcs[99].clone();
    new.endpoints[0].addr = Ipv4Addr::new(198, 18, 1, 13).into();

    for (restore, save) in [
        ("iptables-legacy-restore", "iptables-legacy-save"),
        ("iptables-nft-restore", "iptables-nft-save"),
    ] {
        feed(&ns, restore, &[], &iptables(&svcs));
        let saved = text(&ns, save, &["-t", "nat"]);
        assert_eq!(saved.matches("-A KUBE-SERVICES").count(), 101, "{restore}");
        assert_eq!(saved.matches("-j DNAT").count(), 300, "{restore}");
        // The kernel keeps the probability as a 32-bit fraction: iptables-save
        // prints what kube-proxy users see.
        assert!(saved.contains("--mode random --probability 0.33333333349"));
        feed(
            &ns,
            restore,
            &["--noflush"],
            &iptables_change(&svcs[99], &new),
        );
        let saved = text(&ns, save, &["-t", "nat"]);
        assert_eq!(saved.matches("-j DNAT").count(), 300, "{restore}");
        assert!(
            saved.contains("--to-destination 198.18.1.13:9000"),
            "{restore}"
        );
        assert!(
            !saved.contains("--to-destination 198.18.1.10:9000"),
            "{restore}"
        );
        // Empty the table again for the next mode.
        feed(&ns, restore, &[], "*nat\nCOMMIT\n");
    }

    feed(&ns, "nft", &["-f", "-"], &nftables(&svcs));
    let listed = text(&ns, "nft", &["list", "table", "ip", "kube-proxy"]);
    assert_eq!(listed.matches("dnat to").count(), 300);
    assert_eq!(listed.matches(": goto service-").count(), 100);
    feed(&ns, "nft", &["-f", "-"], &nftables_change(&svcs[99], &new));
    let listed = text(&ns, "nft", &["list", "table", "ip", "kube-proxy"]);
    assert_eq!(listed.matches("dnat to").count(), 300);
    assert!(listed.contains("dnat to 198.18.1.13:9000"));
    assert!(!listed.contains("dnat to 198.18.1.10:9000"));
    // Loading the whole set again replaces the table.
    feed(&ns, "nft", &["-f", "-"], &nftables(&svcs));
    let listed = text(&ns, "nft", &["list", "table", "ip", "kube-proxy"]);
    assert_eq!(listed.matches("dnat to").count(), 300);
}

#[test]
fn ipv6_rule_sets_load_and_change_in_ip6tables_legacy_and_nftables() {
    if !privileged("ipv6_rule_sets_load_and_change_in_ip6tables_legacy_and_nftables") {
        return;
    }
    let ns = Netns::create(&unique_tag(), "rules6").unwrap();
    let svcs = services(100, "udp", &target6());
    let mut new = svcs[99].clone();
    new.endpoints[0].addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 0x13).into();

    feed(&ns, "ip6tables-legacy-restore", &[], &iptables(&svcs));
    let saved = text(&ns, "ip6tables-legacy-save", &["-t", "nat"]);
    assert_eq!(saved.matches("-A KUBE-SERVICES").count(), 101);
    assert_eq!(saved.matches("-j DNAT").count(), 300);
    assert!(
        saved.contains("--to-destination [2001:2:0:1::10]:9000"),
        "{saved}"
    );
    feed(
        &ns,
        "ip6tables-legacy-restore",
        &["--noflush"],
        &iptables_change(&svcs[99], &new),
    );
    let saved = text(&ns, "ip6tables-legacy-save", &["-t", "nat"]);
    assert_eq!(saved.matches("-j DNAT").count(), 300);
    assert!(saved.contains("--to-destination [2001:2:0:1::13]:9000"));
    assert!(!saved.contains("--to-destination [2001:2:0:1::10]:9000"));
    feed(&ns, "ip6tables-legacy-restore", &[], "*nat\nCOMMIT\n");

    feed(&ns, "nft", &["-f", "-"], &nftables(&svcs));
    let listed = text(&ns, "nft", &["list", "table", "ip6", "kube-proxy"]);
    assert_eq!(listed.matches("dnat to").count(), 300);
    assert_eq!(listed.matches(": goto service-").count(), 100);
    feed(&ns, "nft", &["-f", "-"], &nftables_change(&svcs[99], &new));
    let listed = text(&ns, "nft", &["list", "table", "ip6", "kube-proxy"]);
    assert!(listed.contains("dnat to [2001:2:0:1::13]:9000"), "{listed}");
    assert!(!listed.contains("dnat to [2001:2:0:1::10]:9000"));
    feed(&ns, "nft", &["-f", "-"], &nftables_empty(svcs[0].vip));
}
