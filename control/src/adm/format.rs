//! ipvsadm's output formats, byte for byte (ipvsadm 1.31 `print_title`,
//! `print_service_entry`, `print_largenum`, `list_conn`, `list_timeout`),
//! so runbooks and scrapers written for `ipvsadm -Ln` keep working.
//!
//! Column rules kept exactly: the service column is `PROT  ADDR:PORT`
//! truncated to 33 characters, the backend column 28; `--stats` and
//! `--rate` numbers are 9 wide with K/M/G/T suffixes past 100 million
//! (`--exact` prints them whole, one space wider than their digits when
//! longer than 8); `-Lnc` expiry is `MM:SS` with minutes unbounded.
//! Services are sorted by protocol, address and port, backends by address
//! and port, as ipvsadm does unless `--nosort`.

use std::fmt::Write;

use crate::view::{ConnView, Listing, ServiceView, TimeoutView};

/// Which listing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Format {
    /// `--stats`.
    pub stats: bool,
    /// `--rate`.
    pub rate: bool,
    /// `--exact`.
    pub exact: bool,
}

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
    } else {
        "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n".to_owned()
    }
}

fn service(out: &mut String, s: &ServiceView, f: Format) {
    let name = truncated(
        format!("{}  {}:{}", proto_upper(&s.protocol), s.vip, s.port),
        33,
    );
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
        if let Some(p) = &s.persistence {
            let _ = write!(out, " persistent {}", p.timeout);
            if p.netmask != std::net::Ipv4Addr::BROADCAST {
                let _ = write!(out, " mask {}", p.netmask);
            }
        }
    }
    out.push('\n');
    let mut backends: Vec<_> = s.backends.iter().collect();
    backends.sort_by_key(|b| (b.address, b.port));
    for b in backends {
        let d = truncated(format!("{}:{}", b.address, b.port), 28);
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
        } else {
            let _ = writeln!(
                out,
                "  -> {d:<28} {:<7} {:<6} {:<10} {:<10}",
                "Masq", b.weight, b.active, b.inactive
            );
        }
    }
}

/// `-Ln` (with `--stats`, `--rate`, `--exact`).
pub fn list(l: &Listing, f: Format) -> String {
    let mut out = format!(
        "IP Virtual Server version {IPVS_VERSION} (size={})\n",
        l.size
    );
    out.push_str(&title(f));
    let mut services: Vec<&ServiceView> = l.services.iter().collect();
    services.sort_by_key(|s| (proto_upper(&s.protocol), s.vip, s.port));
    for s in services {
        service(&mut out, s, f);
    }
    out
}

/// `-Lnc`.
pub fn connections(conns: &[ConnView]) -> String {
    let mut out = String::from("IPVS connection entries\n");
    let _ = writeln!(
        out,
        "pro expire {:<11} {:<18} {:<18} destination",
        "state", "source", "virtual"
    );
    for c in conns {
        let expire = format!("{:02}:{:02}", c.expires / 60, c.expires % 60);
        let _ = writeln!(
            out,
            "{:<3} {:<6} {:<11} {:<18} {:<18} {}",
            c.protocol, expire, c.state, c.client, c.vip, c.backend
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
    use crate::view::{BackendView, PersistView, Rates, Stats};
    use std::net::Ipv4Addr;

    fn backend(last: u8, weight: u32, active: u64, inactive: u64) -> BackendView {
        BackendView {
            address: Ipv4Addr::new(198, 18, 1, last),
            port: 8080,
            weight,
            active,
            inactive,
            stats: Stats::default(),
            rates: Rates::default(),
        }
    }

    fn listing() -> Listing {
        let mut web = ServiceView {
            protocol: "tcp".into(),
            vip: Ipv4Addr::new(198, 19, 0, 1),
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
            vip: Ipv4Addr::new(198, 19, 0, 2),
            port: 53,
            scheduler: "rr".into(),
            flags: Vec::new(),
            persistence: Some(PersistView {
                timeout: 360,
                netmask: Ipv4Addr::new(255, 255, 255, 0),
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
        assert_eq!(list(&listing(), Format::default()), want);
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
        assert_eq!(list(&listing(), f), want);
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
        assert_eq!(list(&listing(), f), want);
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
        };
        let want = "\
IPVS connection entries
pro expire state       source             virtual            destination
TCP 14:59  ESTABLISHED 198.18.0.2:40000   198.19.0.1:80      198.18.1.10:8080
TCP 00:07  CLOSE       198.18.0.2:40000   198.19.0.1:80      198.18.1.10:8080
TCP 120:00 FIN_WAIT    198.18.0.2:40000   198.19.0.1:80      198.18.1.10:8080
";
        assert_eq!(
            connections(&[c("ESTABLISHED", 899), c("CLOSE", 7), c("FIN_WAIT", 7200)]),
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
        l.services[0].vip = Ipv4Addr::new(255, 255, 255, 255);
        l.services[0].port = 65535;
        l.services[0].backends = vec![BackendView {
            address: Ipv4Addr::new(255, 255, 255, 255),
            port: 65535,
            ..backend(1, 1, 0, 0)
        }];
        let out = list(&l, Format::default());
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
}
