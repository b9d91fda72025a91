//! The same set of services written three ways, for the end-to-end
//! comparison: kube-proxy's iptables-mode `nat` table (for
//! `iptables-restore`, legacy or nft), kube-proxy's nftables-mode table
//! (for `nft -f`), and an xvs config file. Plus the one-endpoint change
//! each applies, shaped like the proxy's partial sync.
//!
//! Shapes follow kube-proxy (pkg/proxy/iptables/proxier.go and
//! pkg/proxy/nftables/proxier.go) for ClusterIP services:
//! - iptables: `KUBE-SERVICES` has one rule per service, in order, jumping
//!   to `KUBE-SVC-*`, which marks off-cluster sources for masquerade and
//!   picks one of the `KUBE-SEP-*` chains with `statistic --mode random`
//!   (probabilities 1/n, 1/(n-1), ..., the last unconditional); each
//!   `KUBE-SEP-*` marks hairpin traffic and DNATs. `KUBE-POSTROUTING`
//!   masquerades marked packets with `--random-fully`.
//! - nftables: a `service-ips` verdict map keyed by
//!   `ipv4_addr . inet_proto . inet_service` in the `services` chain; one
//!   `service-*` chain per service choosing an `endpoint-*` chain with
//!   `numgen random mod n vmap`; masquerade of marked packets.
//!
//! IPv6 services (kube-proxy runs one proxier per family) get the same
//! shapes in `ip6tables` (`/128` matches, `--to-destination [addr]:port`)
//! and an `ip6 kube-proxy` table (`ipv6_addr` keys, `ip6 daddr`); the
//! family follows the services' VIPs.
//!
//! Chain-name hashes are SipHash (kube-proxy uses SHA-256 + base32; only
//! uniqueness and length matter here). Invariant: the last service in the
//! list is the last rule of `KUBE-SERVICES` — the one a benchmark aims at.

use std::fmt::Write;
use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use siphasher::sip::SipHasher13;
use xvs_config::{Encap, ForwardMethod, HostPort};
use xvs_dataplane::wire::Endpoint;

/// The cluster's pod CIDR: sources outside it are masqueraded.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The cluster's IPv6 pod CIDR.
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/56";

/// An endpoint of either family.
pub type Ep = Endpoint<IpAddr>;

/// Per-family words of the rule sets.
struct Words {
    host: u8,
    cluster: &'static str,
    nft_family: &'static str,
    nft_addr: &'static str,
    nft_ip: &'static str,
}

fn words(vip: IpAddr) -> Words {
    match vip {
        IpAddr::V4(_) => Words {
            host: 32,
            cluster: CLUSTER_CIDR,
            nft_family: "ip",
            nft_addr: "ipv4_addr",
            nft_ip: "ip",
        },
        IpAddr::V6(_) => Words {
            host: 128,
            cluster: CLUSTER_CIDR6,
            nft_family: "ip6",
            nft_addr: "ipv6_addr",
            nft_ip: "ip6",
        },
    }
}

/// One ClusterIP service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Svc {
    /// `namespace/name:port` (for comments and chain names).
    pub name: String,
    /// Cluster IP.
    pub vip: IpAddr,
    /// Port.
    pub port: u16,
    /// `udp` or `tcp`.
    pub proto: &'static str,
    /// Endpoints.
    pub endpoints: Vec<Ep>,
}

/// `n` services of 3 endpoints each; the last one's endpoints are
/// `target` (the addresses that receive traffic), the others' are
/// addresses in 198.18.128.0/17 (2001:2:0:80::/64 for IPv6 targets) that
/// nothing answers for. The VIPs are of the targets' family.
pub fn services(n: usize, proto: &'static str, target: &[Ep]) -> Vec<Svc> {
    let v6 = target.first().is_some_and(|e| e.addr.is_ipv6());
    (0..n)
        .map(|i| {
            let endpoints = if i + 1 == n {
                target.to_vec()
            } else {
                (0..3)
                    .map(|k| {
                        let h = ((i * 3 + k) % 32_000) as u32 + 1;
                        Endpoint {
                            addr: if v6 {
                                IpAddr::V6(Ipv6Addr::new(
                                    0x2001,
                                    2,
                                    0,
                                    0x80,
                                    0,
                                    0,
                                    (h >> 16) as u16,
                                    h as u16,
                                ))
                            } else {
                                IpAddr::V4(Ipv4Addr::from(0xc612_8000 + h))
                            },
                            port: 8000 + (i / 10_000) as u16,
                        }
                    })
                    .collect()
            };
            Svc {
                name: format!("bench/svc-{i}:p"),
                vip: if v6 {
                    IpAddr::V6(vip6_of(i))
                } else {
                    IpAddr::V4(vip_of(i))
                },
                port: 5000 + (i % 2) as u16,
                proto,
                endpoints,
            }
        })
        .collect()
}

/// The cluster IP of service `i`: two service ports per address in
/// 198.19.0.0/16.
pub fn vip_of(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0xc613_0000 + (i / 2) as u32 + 1)
}

/// The IPv6 cluster IP of service `i` (2001:2:ff::/64).
pub fn vip6_of(i: usize) -> Ipv6Addr {
    let h = (i / 2) as u32 + 1;
    Ipv6Addr::new(0x2001, 2, 0xff, 0, 0, 0, (h >> 16) as u16, h as u16)
}

fn hash16(parts: &[&str]) -> String {
    let mut h = SipHasher13::new();
    for p in parts {
        h.write(p.as_bytes());
        h.write_u8(0);
    }
    format!("{:016X}", h.finish())
}

fn svc_chain(s: &Svc) -> String {
    format!("KUBE-SVC-{}", hash16(&[&s.name, s.proto]))
}

fn sep_chain(s: &Svc, e: &Ep) -> String {
    format!(
        "KUBE-SEP-{}",
        hash16(&[&s.name, s.proto, &e.addr.to_string(), &e.port.to_string()])
    )
}

/// kube-proxy's `nat` table for `svcs`, for `iptables-restore` (which
/// replaces the table).
pub fn iptables(svcs: &[Svc]) -> String {
    let mut out = String::with_capacity(svcs.len() * 1400);
    out.push_str("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
    out.push_str(":KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    for s in svcs {
        let _ = writeln!(out, ":{} - [0:0]", svc_chain(s));
        for e in &s.endpoints {
            let _ = writeln!(out, ":{} - [0:0]", sep_chain(s, e));
        }
    }
    out.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    for s in svcs {
        let _ = writeln!(
            out,
            "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\" -d {}/{} -p {p} -m {p} --dport {} -j {}",
            s.name,
            s.vip,
            words(s.vip).host,
            s.port,
            svc_chain(s),
            p = s.proto
        );
    }
    out.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
    for s in svcs {
        iptables_service_rules(&mut out, s);
    }
    out.push_str("COMMIT\n");
    out
}

/// The rules of one service's `KUBE-SVC-*` and `KUBE-SEP-*` chains.
fn iptables_service_rules(out: &mut String, s: &Svc) {
    let svc = svc_chain(s);
    let w = words(s.vip);
    let _ = writeln!(
        out,
        "-A {svc} -m comment --comment \"{} cluster IP\" -d {}/{} -p {p} -m {p} --dport {} ! -s {} -j KUBE-MARK-MASQ",
        s.name,
        s.vip,
        w.host,
        s.port,
        w.cluster,
        p = s.proto
    );
    let n = s.endpoints.len();
    for (i, e) in s.endpoints.iter().enumerate() {
        let stat = if i + 1 < n {
            format!(
                " -m statistic --mode random --probability {:.11}",
                1.0 / (n - i) as f64
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "-A {svc} -m comment --comment \"{} -> {}\"{stat} -j {}",
            s.name,
            HostPort(e.addr, e.port),
            sep_chain(s, e)
        );
    }
    for e in &s.endpoints {
        let sep = sep_chain(s, e);
        let _ = writeln!(
            out,
            "-A {sep} -m comment --comment {} -s {}/{} -j KUBE-MARK-MASQ\n-A {sep} -m comment --comment {} -p {p} -m {p} -j DNAT --to-destination {}",
            s.name,
            e.addr,
            w.host,
            s.name,
            HostPort(e.addr, e.port),
            p = s.proto
        );
    }
}

/// kube-proxy's partial sync for one service whose endpoints became
/// `new`: for `iptables-restore --noflush`, declaring (so flushing) its
/// chains, writing them again and deleting the stale endpoint chains.
pub fn iptables_change(old: &Svc, new: &Svc) -> String {
    let mut out = String::from("*nat\n");
    let _ = writeln!(out, ":{} - [0:0]", svc_chain(new));
    for e in &new.endpoints {
        let _ = writeln!(out, ":{} - [0:0]", sep_chain(new, e));
    }
    let stale: Vec<String> = old
        .endpoints
        .iter()
        .filter(|e| !new.endpoints.contains(e))
        .map(|e| sep_chain(old, e))
        .collect();
    for c in &stale {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    iptables_service_rules(&mut out, new);
    for c in &stale {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n");
    out
}

fn nft_svc_chain(s: &Svc) -> String {
    format!(
        "service-{}-{}",
        &hash16(&[&s.name, s.proto])[..8],
        s.name.replace(['/', ':'], "-")
    )
}

fn nft_ep_chain(s: &Svc, e: &Ep) -> String {
    format!(
        "endpoint-{}-{}-{}-{}",
        &hash16(&[&s.name, s.proto, &e.addr.to_string(), &e.port.to_string()])[..8],
        s.name.replace(['/', ':'], "-"),
        e.addr.to_string().replace(['.', ':'], "-"),
        e.port
    )
}

/// What empties the nftables table of `svcs`' family.
pub fn nftables_empty(vip: IpAddr) -> String {
    let f = words(vip).nft_family;
    format!("table {f} kube-proxy\ndelete table {f} kube-proxy\n")
}

/// kube-proxy's nftables-mode table `ip kube-proxy` for `svcs`, for
/// `nft -f` (deletes and recreates the table in one transaction).
pub fn nftables(svcs: &[Svc]) -> String {
    let mut out = String::with_capacity(svcs.len() * 1200);
    let vip = svcs
        .first()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |s| s.vip);
    let w = words(vip);
    let head =         "table ip kube-proxy\ndelete table ip kube-proxy\n\
         table ip kube-proxy {\n\
         \tcomment \"rules for kube-proxy\"\n\
         \tchain mark-for-masquerade {\n\t\tmeta mark set meta mark or 0x4000\n\t}\n\
         \tchain masquerading {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tmeta mark & 0x4000 == 0 return\n\t\tmeta mark set meta mark xor 0x4000\n\t\tmasquerade fully-random\n\t}\n\
         \tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\
         \t\tcomment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"\n\t}\n\
         \tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n\
         \tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n\
         \tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n";
    out.push_str(
        &head
            .replace("table ip ", &format!("table {} ", w.nft_family))
            .replace("ipv4_addr", w.nft_addr)
            .replace("\t\tip daddr", &format!("\t\t{} daddr", w.nft_ip)),
    );
    for s in svcs {
        let _ = writeln!(out, "\tchain {} {{\n\t}}", nft_svc_chain(s));
        for e in &s.endpoints {
            let _ = writeln!(out, "\tchain {} {{\n\t}}", nft_ep_chain(s, e));
        }
    }
    out.push_str("}\n");
    for s in svcs {
        nft_service_rules(&mut out, s);
    }
    // One element statement per 1000 services keeps lines reasonable.
    for chunk in svcs.chunks(1000) {
        let _ = write!(
            out,
            "add element {} kube-proxy service-ips {{ ",
            w.nft_family
        );
        for (k, s) in chunk.iter().enumerate() {
            let _ = write!(
                out,
                "{}{} . {} . {} : goto {}",
                if k > 0 { ", " } else { "" },
                s.vip,
                s.proto,
                s.port,
                nft_svc_chain(s)
            );
        }
        out.push_str(" }\n");
    }
    out
}

/// The rules of one service's `service-*` and `endpoint-*` chains.
fn nft_service_rules(out: &mut String, s: &Svc) {
    let svc = nft_svc_chain(s);
    let Words {
        cluster,
        nft_family: f,
        nft_ip: ip,
        ..
    } = words(s.vip);
    let _ = writeln!(
        out,
        "add rule {f} kube-proxy {svc} {ip} daddr {} {} dport {} {ip} saddr != {cluster} jump mark-for-masquerade",
        s.vip, s.proto, s.port
    );
    let arms: Vec<String> = s
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{i} : goto {}", nft_ep_chain(s, e)))
        .collect();
    let _ = writeln!(
        out,
        "add rule {f} kube-proxy {svc} numgen random mod {} vmap {{ {} }}",
        s.endpoints.len(),
        arms.join(", ")
    );
    for e in &s.endpoints {
        let ep = nft_ep_chain(s, e);
        let _ = writeln!(
            out,
            "add rule {f} kube-proxy {ep} {ip} saddr {} jump mark-for-masquerade\n\
             add rule {f} kube-proxy {ep} meta l4proto {} dnat to {}",
            e.addr,
            s.proto,
            HostPort(e.addr, e.port)
        );
    }
}

/// kube-proxy's nftables partial sync for one service whose endpoints
/// became `new`: flush its chain, add the new endpoint chains, rewrite
/// the service chain, delete the stale endpoint chains.
pub fn nftables_change(old: &Svc, new: &Svc) -> String {
    let mut out = String::new();
    let f = words(new.vip).nft_family;
    let _ = writeln!(out, "flush chain {f} kube-proxy {}", nft_svc_chain(new));
    for e in new.endpoints.iter().filter(|e| !old.endpoints.contains(e)) {
        let _ = writeln!(out, "add chain {f} kube-proxy {}", nft_ep_chain(new, e));
    }
    // Rewrites the service chain and (re)writes every endpoint chain.
    for e in &new.endpoints {
        let _ = writeln!(out, "flush chain {f} kube-proxy {}", nft_ep_chain(new, e));
    }
    nft_service_rules(&mut out, new);
    for e in old.endpoints.iter().filter(|e| !new.endpoints.contains(e)) {
        let c = nft_ep_chain(old, e);
        let _ = writeln!(
            out,
            "flush chain {f} kube-proxy {c}\ndelete chain {f} kube-proxy {c}"
        );
    }
    out
}

/// The `[[services]]` of an xvs config for `svcs` (round robin, the
/// closest to `statistic --mode random` among IPVS schedulers).
pub fn xvs_services(svcs: &[Svc]) -> String {
    xvs_services_via(svcs, ForwardMethod::Masq, Encap::Ipip)
}

/// [`xvs_services`] with every backend forwarded by `forward` (tunnels
/// with `encap`): full NAT to the endpoint's port, or (direct routing,
/// tunnels, which keep the packet's port) to the endpoint's address at
/// the service's port.
pub fn xvs_services_via(svcs: &[Svc], forward: ForwardMethod, encap: Encap) -> String {
    let mut out = String::with_capacity(svcs.len() * 200);
    for s in svcs {
        let _ = writeln!(
            out,
            "[[services]]\nvip = \"{}\"\nprotocol = \"{}\"\nport = {}\nscheduler = \"rr\"\nbackends = [",
            s.vip, s.proto, s.port
        );
        for e in &s.endpoints {
            let _ = match forward {
                ForwardMethod::Masq => {
                    writeln!(out, "  {{ address = \"{}\", port = {} }},", e.addr, e.port)
                }
                f => writeln!(
                    out,
                    "  {{ address = \"{}\", forward = \"{f}\", encap = \"{encap}\" }},",
                    e.addr
                ),
            };
        }
        out.push_str("]\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Vec<Ep> {
        (10..13)
            .map(|h| Endpoint {
                addr: IpAddr::V4(Ipv4Addr::new(198, 18, 1, h)),
                port: 9000,
            })
            .collect()
    }

    fn target6() -> Vec<Ep> {
        (0x10..0x13)
            .map(|h| Endpoint {
                addr: IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, h)),
                port: 9000,
            })
            .collect()
    }

    #[test]
    fn the_last_service_is_the_target_and_the_last_portal_rule() {
        let svcs = services(1000, "udp", &target());
        assert_eq!(svcs.len(), 1000);
        assert_eq!(svcs[999].endpoints, target());
        let mut keys: Vec<_> = svcs.iter().map(|s| (s.vip, s.port)).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 1000, "every service port is distinct");
        let text = iptables(&svcs);
        let portals: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SERVICES") && l.contains("cluster IP"))
            .collect();
        assert_eq!(portals.len(), 1000);
        assert!(portals[999].contains("bench/svc-999:p"));
        // 1 portal + 1 masq + 3 picks + 3 x 2 endpoint rules per service.
        let rules = text.lines().filter(|l| l.starts_with("-A KUBE-S")).count();
        assert_eq!(rules, 1000 * 11 + 1);
        assert!(text.contains("--probability 0.33333333333"));
        assert!(text.contains("--probability 0.50000000000"));
    }

    #[test]
    fn a_change_rewrites_one_service_and_deletes_its_stale_chain() {
        let svcs = services(3, "tcp", &target());
        let mut new = svcs[2].clone();
        new.endpoints[2].addr = Ipv4Addr::new(198, 18, 1, 13).into();
        let ipt = iptables_change(&svcs[2], &new);
        assert_eq!(ipt.matches("-X KUBE-SEP-").count(), 1);
        assert!(ipt.contains("198.18.1.13:9000"));
        assert!(!ipt.contains("svc-1:p"), "other services untouched");
        let nft = nftables_change(&svcs[2], &new);
        assert_eq!(nft.matches("delete chain").count(), 1);
        assert!(nft.contains("dnat to 198.18.1.13:9000"));
        assert!(!nft.contains("svc-1-p"));
    }

    #[test]
    fn ipv6_services_take_kube_proxys_ipv6_shapes() {
        let svcs = services(3, "udp", &target6());
        assert!(svcs.iter().all(|s| s.vip.is_ipv6()));
        let ipt = iptables(&svcs);
        assert!(ipt.contains("-d 2001:2:ff::2/128 -p udp"), "{ipt}");
        assert!(
            ipt.contains("--to-destination [2001:2:0:1::10]:9000"),
            "{ipt}"
        );
        assert!(ipt.contains(&format!("! -s {CLUSTER_CIDR6}")));
        let nft = nftables(&svcs);
        assert!(nft.starts_with("table ip6 kube-proxy\ndelete table ip6 kube-proxy\n"));
        assert!(nft.contains("type ipv6_addr . inet_proto . inet_service : verdict"));
        assert!(nft.contains("ip6 daddr . meta l4proto . th dport vmap @service-ips"));
        assert!(nft.contains("add element ip6 kube-proxy service-ips { 2001:2:ff::1 . udp . 5000"));
        assert!(nft.contains("dnat to [2001:2:0:1::10]:9000"), "{nft}");
        assert!(!nft.contains(" ip kube-proxy"), "no IPv4 table statement");
        assert_eq!(
            nftables_empty(svcs[0].vip),
            "table ip6 kube-proxy\ndelete table ip6 kube-proxy\n"
        );
        let text = format!(
            "[interfaces]\nclient = \"a\"\n\n[snat]\naddresses = [\"2001:2:0:1::2\"]\n\n{}",
            xvs_services(&svcs)
        );
        assert_eq!(
            xvs_config::parse_str("bench.toml", &text)
                .unwrap()
                .services
                .len(),
            3
        );
    }

    #[test]
    fn xvs_services_parse_as_a_config() {
        let svcs = services(10, "udp", &target());
        let text = format!(
            "[interfaces]\nmode = \"two-arm\"\nclient = \"a\"\nbackend = \"b\"\nqueues = [0]\ncores = [0]\n\n\
             [snat]\naddresses = [\"198.18.1.2\"]\n\n{}",
            xvs_services(&svcs)
        );
        let cfg = xvs_config::parse_str("bench.toml", &text).unwrap();
        assert_eq!(cfg.services.len(), 10);
        assert_eq!(cfg.services[9].backends.len(), 3);
    }
}
