//! ipvsadm's output formats, byte for byte (ipvsadm 1.31 `print_title`,
//! `print_service_entry`, `print_largenum`, `list_conn`, `list_timeout`,
//! and `-S`'s rules), so runbooks and scrapers written for `ipvsadm -Ln`
//! and files written by `ipvsadm -S` keep working.
//!
//! Column rules kept exactly: the service column is `PROT  ADDR:PORT`
//! cut to 33 characters, the backend column 28; names (without `-n`) are
//! `host:service` cut to 59 (ipvsadm's buffer); `--stats` and `--rate`
//! numbers are 9 wide with K/M/G/T suffixes past 100 million (`--exact`
//! prints them whole, one space wider than their digits when longer than
//! 8); `-Lnc` expiry is `MM:SS` with minutes unbounded. Scheduler flags
//! print as ipvsadm names them for the scheduler (`sh-port`, `mh-fallback`,
//! else `flag-1`, `flag-2`).
//!
//! Order: ipvsadm sorts what the kernel's table returns with `qsort` and
//! its own comparison, which compares addresses by wrapping subtraction
//! (not a total order when addresses are 2^31 or more apart). Reproduced
//! here: the kernel's order (its 256 hash buckets of protocol, address
//! and port, in bucket order; newest destination first), then glibc's
//! merge sort with that comparison. `--nosort` prints the kernel's order.
//! (Within one bucket services are in key order: xvs does not keep their
//! creation order.)

use std::fmt::Write;
use std::net::IpAddr;

use xvs_config::{Address, Encap, ForwardMethod, DEFAULT_GUE_PORT};

use super::names::{addrport, Names};
use crate::view::{BackendView, ConnView, Listing, ServiceView, TimeoutView};

pub use super::ipvs_opts::Format;

/// The version line's version (the IPVS one ipvsadm users know).
const IPVS_VERSION: &str = "1.2.1";

/// ipvsadm's `print_largenum`.
pub fn largenum(i: u64, exact: bool) -> String {
    if exact {
        let digits = i.to_string();
        let width = if digits.len() <= 8 {
            9
        } else {
            digits.len() + 1
        };
        return format!("{i:>width$}");
    }
    if i < 100_000_000 {
        format!("{i:>9}")
    } else if i < 1_000_000_000 {
        format!("{:>8}K", i / 1000)
    } else if i < 100_000_000_000 {
        format!("{:>8}M", i / 1_000_000)
    } else if i < 100_000_000_000_000 {
        format!("{:>8}G", i / 1_000_000_000)
    } else {
        format!("{:>8}T", i / 1_000_000_000_000)
    }
}

fn truncated(s: String, n: usize) -> String {
    s.chars().take(n).collect()
}

fn proto_upper(p: &str) -> &'static str {
    if p.eq_ignore_ascii_case("udp") {
        "UDP"
    } else {
        "TCP"
    }
}

fn proto_lower(p: &str) -> &'static str {
    if p.eq_ignore_ascii_case("udp") {
        "udp"
    } else {
        "tcp"
    }
}

fn proto_number(p: &str) -> u32 {
    if p.eq_ignore_ascii_case("udp") {
        17
    } else {
        6
    }
}

/// ipvsadm's `print_sched_flags`: the service's flags under the names
/// its scheduler gives them, comma-separated (empty when none).
pub fn sched_flags(s: &ServiceView) -> String {
    let has = |f: &str| s.flags.iter().any(|x| x == f);
    let (one, two) = match s.scheduler.as_str() {
        "sh" => ("sh-fallback", "sh-port"),
        "mh" => ("mh-fallback", "mh-port"),
        _ => ("flag-1", "flag-2"),
    };
    let mut out = Vec::new();
    if has("fallback") {
        out.push(one);
    }
    if has("port") {
        out.push(two);
    }
    out.join(",")
}

fn title(f: Format) -> String {
    if f.stats {
        format!(
            "{:<33} {:>8} {:>8} {:>8} {:>8} {:>8}\n  -> RemoteAddress:Port\n",
            "Prot LocalAddress:Port", "Conns", "InPkts", "OutPkts", "InBytes", "OutBytes"
        )
    } else if f.rate {
        format!(
            "{:<33} {:>8} {:>8} {:>8} {:>8} {:>8}\n  -> RemoteAddress:Port\n",
            "Prot LocalAddress:Port", "CPS", "InPPS", "OutPPS", "InBPS", "OutBPS"
        )
    } else if f.thresholds {
        format!(
            "{:<33} {:<10} {:<10} {:<10} {:<10}\n  -> RemoteAddress:Port\n",
            "Prot LocalAddress:Port", "Uthreshold", "Lthreshold", "ActiveConn", "InActConn"
        )
    } else if f.tun_info {
        "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn InActConn\n".to_owned()
    } else {
        "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n".to_owned()
    }
}

fn service(out: &mut String, s: &ServiceView, f: Format, names: &dyn Names) {
    let proto = proto_lower(&s.protocol);
    let vname = addrport(names, s.vip, s.port, proto);
    let name = truncated(format!("{:<4} {vname}", proto_upper(&s.protocol)), 33);
    if f.stats {
        let st = &s.stats;
        let _ = write!(out, "{name:<33}");
        for v in [st.conns, st.inpkts, st.outpkts, st.inbytes, st.outbytes] {
            out.push_str(&largenum(v, f.exact));
        }
    } else if f.rate {
        let r = &s.rates;
        let _ = write!(out, "{name:<33}");
        for v in [r.cps, r.inpps, r.outpps, r.inbps, r.outbps] {
            out.push_str(&largenum(v, f.exact));
        }
    } else {
        let _ = write!(out, "{name} {}", s.scheduler);
        let flags = sched_flags(s);
        if !flags.is_empty() {
            let _ = write!(out, " ({flags})");
        }
        if let Some(p) = &s.persistence {
            let _ = write!(out, " persistent {}", p.timeout);
            if let Some(m) = netmask(p.netmask) {
                let _ = write!(out, " mask {m}");
            }
        }
    }
    out.push('\n');
    for b in dests(&s.backends, f.nosort) {
        let d = truncated(addrport(names, b.address, b.port, proto), 28);
        if f.stats {
            let st = &b.stats;
            let _ = write!(out, "  -> {d:<28}");
            for v in [st.conns, st.inpkts, st.outpkts, st.inbytes, st.outbytes] {
                out.push_str(&largenum(v, f.exact));
            }
            out.push('\n');
        } else if f.rate {
            let r = &b.rates;
            let _ = write!(
                out,
                "  -> {d:<28} {:>8} {:>8} {:>8}",
                r.cps, r.inpps, r.outpps
            );
            out.push_str(&largenum(r.inbps, f.exact));
            out.push_str(&largenum(r.outbps, f.exact));
            out.push('\n');
        } else if f.thresholds {
            // xvs has no thresholds: IPVS shows 0 for "none".
            let _ = writeln!(
                out,
                "  -> {d:<28} {:<10} {:<10} {:<10} {:<10}",
                0, 0, b.active, b.inactive
            );
        } else if f.tun_info {
            let tun = match b.encap {
                Some(Encap::Gue) => format!("gue:{DEFAULT_GUE_PORT}:nocsum"),
                Some(Encap::Ipip) => "ipip".to_owned(),
                None => "n/a".to_owned(),
            };
            let _ = writeln!(
                out,
                "  -> {d:<28} {:<7} {:<13} {:<6} {:<10} {:<10}",
                b.forward.ipvsadm_name(),
                tun,
                b.weight,
                b.active,
                b.inactive
            );
        } else {
            let _ = writeln!(
                out,
                "  -> {d:<28} {:<7} {:<6} {:<10} {:<10}",
                b.forward.ipvsadm_name(),
                b.weight,
                b.active,
                b.inactive
            );
        }
    }
}

/// The address family number libipvs compares (`AF_INET`, `AF_INET6`).
fn af(a: IpAddr) -> i64 {
    match a {
        IpAddr::V4(_) => 2,
        IpAddr::V6(_) => 10,
    }
}

/// libipvs's address comparison: IPv4 by wrapping 32-bit subtraction
/// read as a signed int; IPv6 the same, word by word, until one differs.
fn cmp_addrs(a: IpAddr, b: IpAddr) -> i32 {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => u32::from(a).wrapping_sub(u32::from(b)) as i32,
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let (a, b) = (a.octets(), b.octets());
            (0..4)
                .map(|i| {
                    let w = |o: &[u8; 16]| {
                        u32::from_be_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
                    };
                    w(&a).wrapping_sub(w(&b)) as i32
                })
                .find(|&r| r != 0)
                .unwrap_or(0)
        }
        _ => 0,
    }
}

/// `ipvs_cmp_services` without fwmarks: the family (IPv4 first), the
/// protocol number, the address ([`cmp_addrs`]), then the port.
fn cmp_services(a: &ServiceView, b: &ServiceView) -> i64 {
    let f = af(a.vip) - af(b.vip);
    if f != 0 {
        return f;
    }
    let p = i64::from(proto_number(&a.protocol)) - i64::from(proto_number(&b.protocol));
    if p != 0 {
        return p;
    }
    let r = cmp_addrs(a.vip, b.vip);
    if r != 0 {
        return i64::from(r);
    }
    i64::from(a.port) - i64::from(b.port)
}

/// `ipvs_cmp_dests`: the address ([`cmp_addrs`]), then the port.
fn cmp_dests(a: &BackendView, b: &BackendView) -> i64 {
    let r = cmp_addrs(a.address, b.address);
    if r != 0 {
        return i64::from(r);
    }
    i64::from(a.port) - i64::from(b.port)
}

/// glibc's `qsort` (`msort_with_tmp`): top-down merge sort, halves of
/// n/2 and n - n/2, the left element taken on `cmp <= 0`. With a
/// comparison that is not a total order, this is what fixes the output.
fn glibc_msort<T: Copy>(v: &mut [T], cmp: &impl Fn(&T, &T) -> i64) {
    let n = v.len();
    if n <= 1 {
        return;
    }
    let n1 = n / 2;
    glibc_msort(&mut v[..n1], cmp);
    glibc_msort(&mut v[n1..], cmp);
    let (mut i, mut j) = (0, n1);
    let mut out = Vec::with_capacity(n);
    while i < n1 && j < n {
        if cmp(&v[i], &v[j]) <= 0 {
            out.push(v[i]);
            i += 1;
        } else {
            out.push(v[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&v[i..n1]);
    out.extend_from_slice(&v[j..]);
    v.copy_from_slice(&out);
}

/// The kernel's service hash bucket (`ip_vs_svc_hashkey`, 8 bits, the
/// per-namespace term taken as 0).
fn bucket(s: &ServiceView) -> u32 {
    let porth = u32::from(s.port);
    // An IPv6 address is folded (`ipv6_addr_hash`) as for IPv4's hash.
    (proto_number(&s.protocol) ^ s.vip.fold32() ^ (porth >> 8) ^ porth) & 0xff
}

fn services(l: &Listing, nosort: bool) -> Vec<&ServiceView> {
    let mut v: Vec<&ServiceView> = l.services.iter().collect();
    v.sort_by(|a, b| {
        (bucket(a), proto_number(&a.protocol), a.vip, a.port).cmp(&(
            bucket(b),
            proto_number(&b.protocol),
            b.vip,
            b.port,
        ))
    });
    if !nosort {
        glibc_msort(&mut v, &|a: &&ServiceView, b: &&ServiceView| {
            cmp_services(a, b)
        });
    }
    v
}

/// A service's destinations: the kernel lists the newest first; ipvsadm
/// sorts them unless `--nosort`.
fn dests(backends: &[BackendView], nosort: bool) -> Vec<&BackendView> {
    let mut v: Vec<&BackendView> = backends.iter().rev().collect();
    if !nosort {
        glibc_msort(&mut v, &|a: &&BackendView, b: &&BackendView| {
            cmp_dests(a, b)
        });
    }
    v
}

/// `-L` (with `-n`, `--stats`, `--rate`, `--exact`, `--thresholds`,
/// `--tun-info`, `--nosort`).
pub fn list(l: &Listing, f: Format, names: &dyn Names) -> String {
    let mut out = format!(
        "IP Virtual Server version {IPVS_VERSION} (size={})\n",
        l.size
    );
    out.push_str(&title(f));
    for s in services(l, f.nosort) {
        service(&mut out, s, f, names);
    }
    out
}

/// `-L -t|-u VIP:PORT`: the title and that service, no version line.
pub fn list_service(s: &ServiceView, f: Format, names: &dyn Names) -> String {
    let mut out = title(f);
    service(&mut out, s, f, names);
    out
}

/// A persistence netmask as ipvsadm writes it: an IPv4 mask as an
/// address, an IPv6 one as its prefix length; none when it keeps every
/// bit.
fn netmask(mask: IpAddr) -> Option<String> {
    match mask {
        IpAddr::V4(m) if m != std::net::Ipv4Addr::BROADCAST => Some(m.to_string()),
        IpAddr::V6(m) if xvs_config::prefix_len(m) != 128 => {
            Some(xvs_config::prefix_len(m).to_string())
        }
        _ => None,
    }
}

/// `-S`: the table as ipvsadm rules, which `-R` reads back.
pub fn save(l: &Listing, f: Format, names: &dyn Names) -> String {
    let mut out = String::new();
    for s in services(l, f.nosort) {
        let proto = proto_lower(&s.protocol);
        let opt = if proto == "udp" { "-u" } else { "-t" };
        let svc = format!("{opt} {}", addrport(names, s.vip, s.port, proto));
        let _ = write!(out, "-A {svc} -s {}", s.scheduler);
        if let Some(p) = &s.persistence {
            let _ = write!(out, " -p {}", p.timeout);
            if let Some(m) = netmask(p.netmask) {
                let _ = write!(out, " -M {m}");
            }
        }
        let flags = sched_flags(s);
        if !flags.is_empty() {
            let _ = write!(out, " -b {flags}");
        }
        out.push('\n');
        for b in dests(&s.backends, f.nosort) {
            let fwd = match (b.forward, b.encap) {
                (ForwardMethod::Masq, _) => "-m".to_owned(),
                (ForwardMethod::Route, _) => "-g".to_owned(),
                (ForwardMethod::Tunnel, Some(Encap::Gue)) => {
                    format!("-i --tun-type gue --tun-port {DEFAULT_GUE_PORT} --tun-nocsum")
                }
                (ForwardMethod::Tunnel, _) => "-i".to_owned(),
            };
            let _ = writeln!(
                out,
                "-a {svc} -r {} {fwd} -w {}",
                addrport(names, b.address, b.port, proto),
                b.weight
            );
        }
    }
    out
}

/// `-Lc` (`-n` for numbers).
pub fn connections(conns: &[ConnView], names: &dyn Names) -> String {
    let mut out = String::from("IPVS connection entries\n");
    let _ = writeln!(
        out,
        "pro expire {:<11} {:<18} {:<18} destination",
        "state", "source", "virtual"
    );
    for c in conns {
        let proto = proto_lower(&c.protocol);
        let name = |a: std::net::SocketAddr| addrport(names, a.ip(), a.port(), proto);
        let expire = format!("{:02}:{:02}", c.expires / 60, c.expires % 60);
        let _ = writeln!(
            out,
            "{:<3} {:<6} {:<11} {:<18} {:<18} {}",
            c.protocol,
            expire,
            c.state,
            name(c.client),
            name(c.vip),
            name(c.backend)
        );
    }
    out
}

/// `--timeout`.
pub fn timeout(t: &TimeoutView) -> String {
    format!(
        "Timeout (tcp tcpfin udp): {} {} {}\n",
        t.tcp, t.tcpfin, t.udp
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adm::names::Numeric;
    use crate::view::{PersistView, Rates, Stats};
    use std::net::Ipv4Addr;

    fn backend(last: u8, weight: u32, active: u64, inactive: u64) -> BackendView {
        BackendView {
            address: Ipv4Addr::new(198, 18, 1, last).into(),
            port: 8080,
            weight,
            forward: xvs_config::ForwardMethod::Masq,
            encap: None,
            health: None,
            active,
            inactive,
            stats: Stats::default(),
            rates: Rates::default(),
        }
    }

    fn listing() -> Listing {
        let mut web = ServiceView {
            protocol: "tcp".into(),
            vip: Ipv4Addr::new(198, 19, 0, 1).into(),
            port: 80,
            scheduler: "wlc".into(),
            flags: Vec::new(),
            persistence: None,
            stats: Stats {
                conns: 1234,
                inpkts: 987_654_321,
                outpkts: 123_456_789_012,
                inbytes: 99_999_999,
                outbytes: 123_456_789_012_345_678,
            },
            rates: Rates {
                cps: 12,
                inpps: 3400,
                outpps: 3300,
                inbps: 2_100_000,
                outbps: 150_000_000,
            },
            // Deliberately out of order: ipvsadm sorts.
            backends: vec![backend(11, 1, 7, 2), backend(10, 100, 12, 0)],
        };
        web.backends[0].stats = Stats {
            conns: 600,
            inpkts: 500_000_000,
            outpkts: 1,
            inbytes: 2,
            outbytes: 3,
        };
        web.backends[0].rates = Rates {
            cps: 6,
            inpps: 1700,
            outpps: 1650,
            inbps: 1_050_000,
            outbps: 75_000_000,
        };
        let dns = ServiceView {
            protocol: "udp".into(),
            vip: Ipv4Addr::new(198, 19, 0, 2).into(),
            port: 53,
            scheduler: "rr".into(),
            flags: Vec::new(),
            persistence: Some(PersistView {
                timeout: 360,
                netmask: Ipv4Addr::new(255, 255, 255, 0).into(),
            }),
            stats: Stats::default(),
            rates: Rates::default(),
            backends: vec![backend(20, 0, 0, 3)],
        };
        Listing {
            size: 4096,
            services: vec![dns, web],
        }
    }

    #[test]
    fn list_numeric_matches_ipvsadm() {
        let want = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  198.19.0.1:80 wlc
  -> 198.18.1.10:8080             Masq    100    12         0         
  -> 198.18.1.11:8080             Masq    1      7          2         
UDP  198.19.0.2:53 rr persistent 360 mask 255.255.255.0
  -> 198.18.1.20:8080             Masq    0      0          3         
";
        assert_eq!(list(&listing(), Format::default(), &Numeric), want);
    }

    #[test]
    fn stats_use_k_m_g_t_past_100_million() {
        let want = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes
  -> RemoteAddress:Port
TCP  198.19.0.1:80                    1234  987654K     123G 99999999  123456T
  -> 198.18.1.10:8080                    0        0        0        0        0
  -> 198.18.1.11:8080                  600  500000K        1        2        3
UDP  198.19.0.2:53                       0        0        0        0        0
  -> 198.18.1.20:8080                    0        0        0        0        0
";
        let f = Format {
            stats: true,
            ..Format::default()
        };
        assert_eq!(list(&listing(), f, &Numeric), want);
    }

    #[test]
    fn exact_prints_whole_numbers_one_wider_than_their_digits() {
        let out = list(
            &listing(),
            Format {
                stats: true,
                exact: true,
                ..Format::default()
            },
            &Numeric,
        );
        let tcp = out.lines().nth(3).unwrap();
        assert_eq!(
            tcp,
            "TCP  198.19.0.1:80                    1234 987654321 123456789012 99999999 123456789012345678"
        );
    }

    #[test]
    fn rate_prints_backend_packet_rates_unscaled() {
        let want = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS
  -> RemoteAddress:Port
TCP  198.19.0.1:80                      12     3400     3300  2100000  150000K
  -> 198.18.1.10:8080                    0        0        0        0        0
  -> 198.18.1.11:8080                    6     1700     1650  1050000 75000000
UDP  198.19.0.2:53                       0        0        0        0        0
  -> 198.18.1.20:8080                    0        0        0        0        0
";
        let f = Format {
            rate: true,
            ..Format::default()
        };
        assert_eq!(list(&listing(), f, &Numeric), want);
    }

    #[test]
    fn largenum_boundaries() {
        assert_eq!(largenum(99_999_999, false), " 99999999");
        assert_eq!(largenum(100_000_000, false), "  100000K");
        assert_eq!(largenum(999_999_999, false), "  999999K");
        assert_eq!(largenum(1_000_000_000, false), "    1000M");
        assert_eq!(largenum(99_999_999_999, false), "   99999M");
        assert_eq!(largenum(100_000_000_000, false), "     100G");
        assert_eq!(largenum(100_000_000_000_000, false), "     100T");
        assert_eq!(largenum(12, true), "       12");
        assert_eq!(largenum(123_456_789, true), " 123456789");
    }

    #[test]
    fn connections_show_mm_ss_and_columns() {
        let c = |state: &str, expires: u32| ConnView {
            protocol: "TCP".into(),
            expires,
            state: state.into(),
            client: "198.18.0.2:40000".parse().unwrap(),
            vip: "198.19.0.1:80".parse().unwrap(),
            backend: "198.18.1.10:8080".parse().unwrap(),
            snat: "198.18.1.2:1024".parse().unwrap(),
            packets: [1, 1],
            template: false,
        };
        let want = "\
IPVS connection entries
pro expire state       source             virtual            destination
TCP 14:59  ESTABLISHED 198.18.0.2:40000   198.19.0.1:80      198.18.1.10:8080
TCP 00:07  CLOSE       198.18.0.2:40000   198.19.0.1:80      198.18.1.10:8080
TCP 120:00 FIN_WAIT    198.18.0.2:40000   198.19.0.1:80      198.18.1.10:8080
";
        assert_eq!(
            connections(
                &[c("ESTABLISHED", 899), c("CLOSE", 7), c("FIN_WAIT", 7200)],
                &Numeric
            ),
            want
        );
    }

    #[test]
    fn timeout_line() {
        assert_eq!(
            timeout(&TimeoutView {
                tcp: 900,
                tcpfin: 120,
                udp: 300
            }),
            "Timeout (tcp tcpfin udp): 900 120 300\n"
        );
    }

    #[test]
    fn long_names_are_cut_like_ipvsadm() {
        let mut l = listing();
        l.services.truncate(1);
        l.services[0].vip = Ipv4Addr::new(255, 255, 255, 255).into();
        l.services[0].port = 65535;
        l.services[0].backends = vec![BackendView {
            address: Ipv4Addr::new(255, 255, 255, 255).into(),
            port: 65535,
            ..backend(1, 1, 0, 0)
        }];
        let out = list(&l, Format::default(), &Numeric);
        // "UDP  255.255.255.255:65535" is 26 characters: nothing to cut,
        // and the backend column stays 28 wide.
        assert!(
            out.contains("UDP  255.255.255.255:65535 rr persistent 360"),
            "{out}"
        );
        assert!(
            out.contains("  -> 255.255.255.255:65535        Masq"),
            "{out}"
        );
    }

    #[test]
    fn scheduler_flags_show_under_their_scheduler_s_names() {
        let mut l = listing();
        l.services[0].scheduler = "sh".into();
        l.services[0].protocol = "udp".into();
        l.services[0].flags = vec!["port".into()];
        l.services[1].scheduler = "dh".into();
        l.services[1].flags = vec!["fallback".into(), "port".into()];
        let out = list(&l, Format::default(), &Numeric);
        assert!(
            out.contains("\nUDP  198.19.0.2:53 sh (sh-port) persistent 360 mask 255.255.255.0\n"),
            "{out}"
        );
        assert!(
            out.contains("\nTCP  198.19.0.1:80 dh (flag-1,flag-2)\n"),
            "{out}"
        );
        let rules = save(&l, Format::default(), &Numeric);
        assert_eq!(
            rules,
            "-A -t 198.19.0.1:80 -s dh -b flag-1,flag-2
-a -t 198.19.0.1:80 -r 198.18.1.10:8080 -m -w 100
-a -t 198.19.0.1:80 -r 198.18.1.11:8080 -m -w 1
-A -u 198.19.0.2:53 -s sh -p 360 -M 255.255.255.0 -b sh-port
-a -u 198.19.0.2:53 -r 198.18.1.20:8080 -m -w 0
"
        );
    }

    #[test]
    fn one_service_has_no_version_line() {
        let l = listing();
        let out = list_service(&l.services[1], Format::default(), &Numeric);
        assert!(
            out.starts_with("Prot LocalAddress:Port Scheduler Flags\n"),
            "{out}"
        );
        assert_eq!(out.lines().count(), 5);
    }

    #[test]
    fn order_is_glibc_s_merge_sort_of_the_kernel_s_order() {
        // Far apart: 10.0.0.1 - 198.19.0.1 wraps to a positive int, so
        // ipvsadm's comparison puts 198.19.0.1 first; 10.0.0.1 and
        // 100.64.0.1 compare normally.
        let svc = |vip: [u8; 4], port: u16| ServiceView {
            vip: std::net::Ipv4Addr::from(vip).into(),
            port,
            backends: vec![],
            ..listing().services[1].clone()
        };
        let l = Listing {
            size: 1,
            services: vec![
                svc([10, 0, 0, 1], 80),
                svc([198, 19, 0, 1], 80),
                svc([100, 64, 0, 1], 80),
            ],
        };
        let order: Vec<String> = services(&l, false)
            .iter()
            .map(|s| s.vip.to_string())
            .collect();
        // The kernel's buckets: (6 ^ addr ^ 0 ^ 80) & 255 = 87 for all:
        // one bucket, key order 10.0.0.1, 100.64.0.1, 198.19.0.1. Merge
        // sort: [10.0.0.1] [100.64.0.1, 198.19.0.1]; the right half is
        // in order (100.64 - 198.19 < 0); 10.0.0.1 vs 100.64.0.1: < 0,
        // take 10.0.0.1; then the rest.
        assert_eq!(order, ["10.0.0.1", "100.64.0.1", "198.19.0.1"]);
        let l = Listing {
            size: 1,
            services: vec![svc([198, 19, 0, 1], 80), svc([10, 0, 0, 1], 81)],
        };
        // Buckets 87 (198.19.0.1, port 80) and 86 (10.0.0.1, 81): the
        // kernel returns 10.0.0.1 first; 10.0.0.1 - 198.19.0.1 wraps to
        // a positive int, so ipvsadm puts 198.19.0.1 first, unlike a
        // numeric sort.
        let order: Vec<String> = services(&l, false)
            .iter()
            .map(|s| s.vip.to_string())
            .collect();
        assert_eq!(order, ["198.19.0.1", "10.0.0.1"]);
        let mut v = vec![3, 1, 2];
        glibc_msort(&mut v, &|a: &i32, b: &i32| i64::from(*a - *b));
        assert_eq!(v, [1, 2, 3]);
    }

    #[test]
    fn an_ipv6_persistence_mask_is_its_prefix_length_in_listings_and_rules() {
        let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap();
        let svc = |mask: &str| ServiceView {
            vip: v6("2001:2:ff::1").into(),
            persistence: Some(PersistView {
                timeout: 360,
                netmask: v6(mask).into(),
            }),
            backends: vec![],
            ..listing().services[0].clone()
        };
        let l = Listing {
            size: 1,
            services: vec![svc("ffff:ffff:ffff:ffff::")],
        };
        let listed = list(&l, Format::default(), &Numeric);
        assert!(
            listed.contains("\nUDP  [2001:2:ff::1]:53 rr persistent 360 mask 64\n"),
            "{listed}"
        );
        let saved = save(&l, Format::default(), &Numeric);
        assert_eq!(saved, "-A -u [2001:2:ff::1]:53 -s rr -p 360 -M 64\n");
        // A mask keeping every bit is not written, as for IPv4's
        // 255.255.255.255.
        let l = Listing {
            size: 1,
            services: vec![svc("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")],
        };
        let saved = save(&l, Format::default(), &Numeric);
        assert_eq!(saved, "-A -u [2001:2:ff::1]:53 -s rr -p 360\n");
    }
}
