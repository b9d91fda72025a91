//! What the host itself uses, for SNAT addresses that are the host's own
//! (kube-proxy masquerades to the node's address, so operators configure
//! it): the host's addresses, the kernel's ephemeral port range
//! (`net.ipv4.ip_local_port_range`) and its listening TCP and bound UDP
//! ports on an address. Read from the kernel of the calling thread's
//! network namespace; never on the packet path.
//!
//! Rule (checked at start and on every reload): on an address shared with
//! the host, the SNAT port range must not overlap the kernel's ephemeral
//! range nor a port the host listens on, because the steering program
//! hands xvs exactly the packets to that address whose destination port
//! is in the SNAT range, and passes every other one to the kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use xvs_config::{Address, PortRange};

/// The addresses of the host's interfaces (IPv4).
pub fn addresses() -> std::io::Result<Vec<Ipv4Addr>> {
    Ok(all_addresses()?
        .into_iter()
        .filter_map(Ipv4Addr::from_ip)
        .collect())
}

/// The addresses of the host's interfaces, of both families.
pub fn all_addresses() -> std::io::Result<Vec<IpAddr>> {
    Ok(interface_nets()?.into_iter().map(|n| n.addr()).collect())
}

/// The addresses of the host's interfaces (both families), and the
/// prefixes of its links (every interface address with its prefix
/// length, loopback's left out: where a direct-routing backend must be),
/// from one read.
pub fn addresses_and_links() -> std::io::Result<(Vec<IpAddr>, Vec<ipnet::IpNet>)> {
    let nets = interface_nets()?;
    let links = nets
        .iter()
        .filter(|n| !n.addr().is_loopback())
        .map(|n| n.trunc())
        .collect();
    Ok((nets.into_iter().map(|n| n.addr()).collect(), links))
}

/// A socket address of getifaddrs as an IP address, if it is one.
///
/// # Safety
/// `sa` is null or points at a sockaddr of the family it names, alive for
/// the call.
unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null, and a sockaddr (the caller's contract).
    let family = i32::from(unsafe { (*sa).sa_family });
    if family == libc::AF_INET {
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
        Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
            sin.sin_addr.s_addr,
        ))))
    } else if family == libc::AF_INET6 {
        // SAFETY: an AF_INET6 address is a sockaddr_in6.
        let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
        Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
    } else {
        None
    }
}

/// Every interface address with its prefix (from its netmask).
fn interface_nets() -> std::io::Result<Vec<ipnet::IpNet>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with
    // freeifaddrs, on success only.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, alive
        // until freeifaddrs.
        let ifa = unsafe { &*at };
        // SAFETY: the node's address and netmask are null or sockaddrs of
        // the family they name, alive until freeifaddrs.
        let (addr, mask) = unsafe { (ip_of(ifa.ifa_addr), ip_of(ifa.ifa_netmask)) };
        if let Some(addr) = addr {
            let prefix = match mask {
                Some(IpAddr::V4(m)) => u32::from(m).leading_ones() as u8,
                Some(IpAddr::V6(m)) => u128::from(m).leading_ones() as u8,
                None if addr.is_ipv4() => 32,
                None => 128,
            };
            if let Ok(net) = ipnet::IpNet::new(addr, prefix) {
                out.push(net);
            }
        }
        at = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// A field of `/proc/meminfo` (its number, without the unit), if the
/// kernel says.
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Bytes of memory the host can give (`MemAvailable` of
/// `/proc/meminfo`), if the kernel says.
pub fn available_memory() -> Option<u64> {
    Some(meminfo("MemAvailable")? * 1024)
}

/// The huge pages the kernel keeps reserved (`HugePages_Total`:
/// `vm.nr_hugepages`); a port's UMEM takes 8 of 2 MiB when enough are
/// free.
pub fn huge_pages_reserved() -> Option<u64> {
    meminfo("HugePages_Total")
}

/// Bytes of one port's UMEM (a worker has one port: its interfaces'
/// sockets share it).
pub const UMEM_BYTES: u64 = crate::xsk::FRAMES as u64 * 4096;

/// 2 MiB pages one port's UMEM takes when the host has them reserved.
pub const UMEM_HUGE_PAGES: u64 = UMEM_BYTES / (2 << 20);
// A whole number of them: the pool's free pages divide by it exactly.
const _: () = assert!(UMEM_BYTES.is_multiple_of(2 << 20));

/// The free 2 MiB pages of the host's reserved pool (`HugePages_Free`,
/// when `Hugepagesize` is 2 MiB; none otherwise): what UMEMs can be
/// mapped on instead of `MemAvailable`.
pub fn huge_pages_free() -> u64 {
    match meminfo("Hugepagesize") {
        Some(2048) => meminfo("HugePages_Free").unwrap_or(0),
        _ => 0,
    }
}

/// Bytes of `MemAvailable` the data plane allocates for `capacity` flows
/// over `workers` workers: each worker's flow table
/// ([`xvs_conntrack::FlowTable::footprint`] of its share), its IPv6 table
/// too when `ipv6` (IPv6 SNAT addresses are configured), and its UMEM,
/// unless that comes from the `huge_free` reserved 2 MiB pages (the
/// kernel keeps the pool out of `MemAvailable`: one port maps its UMEM
/// there when [`UMEM_HUGE_PAGES`] are free).
pub fn needed_memory(capacity: u32, workers: usize, ipv6: bool, huge_free: u64) -> u64 {
    let workers = workers.max(1) as u64;
    let share = (u64::from(capacity) / workers).max(1) as u32;
    let table6 = if ipv6 {
        xvs_conntrack::FlowTable::<Ipv6Addr>::footprint(share)
    } else {
        0
    };
    let on_pool = workers.min(huge_free / UMEM_HUGE_PAGES);
    workers * (<xvs_conntrack::FlowTable>::footprint(share) + table6)
        + (workers - on_pool) * UMEM_BYTES
}

/// The kernel's ephemeral port range.
pub fn local_port_range() -> std::io::Result<PortRange> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    parse_port_range(&text).ok_or_else(|| std::io::Error::other("unreadable ip_local_port_range"))
}

fn parse_port_range(text: &str) -> Option<PortRange> {
    let mut it = text.split_whitespace().map(|v| v.parse::<u16>().ok());
    Some(PortRange {
        first: it.next()??,
        last: it.next()??,
    })
}

/// A port the host uses on an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPort {
    /// Port.
    pub port: u16,
    /// `"tcp"` (listening) or `"udp"` (bound).
    pub proto: &'static str,
}

/// Ports the host listens on (TCP) or has bound (UDP) on `addr`, directly
/// or through a wildcard (IPv4 or dual-stack IPv6) socket.
pub fn ports_on(addr: Ipv4Addr) -> Vec<HostPort> {
    let mut out = Vec::new();
    for (file, proto, state) in [
        ("/proc/net/tcp", "tcp", "0A"),
        ("/proc/net/tcp6", "tcp", "0A"),
        ("/proc/net/udp", "udp", "07"),
        ("/proc/net/udp6", "udp", "07"),
    ] {
        if let Ok(text) = std::fs::read_to_string(file) {
            out.extend(
                sockets(&text, state)
                    .filter(|(a, _)| a.is_none_or(|a| a == addr))
                    .map(|(_, port)| HostPort { port, proto }),
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The local (address, port) of every socket in state `state` of a
/// `/proc/net/{tcp,udp}[6]` table; `None` for a wildcard address, and
/// IPv6 addresses other than wildcard and v4-mapped are skipped.
fn sockets<'a>(
    text: &'a str,
    state: &'a str,
) -> impl Iterator<Item = (Option<Ipv4Addr>, u16)> + 'a {
    text.lines().skip(1).filter_map(move |line| {
        let mut f = line.split_whitespace();
        let local = f.nth(1)?;
        let st = f.nth(1)?;
        if st != state {
            return None;
        }
        let (a, p) = local.split_once(':')?;
        let port = u16::from_str_radix(p, 16).ok()?;
        let addr = match a.len() {
            // The kernel prints each 32-bit word of the address as a u32
            // in host order: its native bytes are the address's.
            8 => u32::from_str_radix(a, 16)
                .ok()
                .map(|v| Ipv4Addr::from(v.to_ne_bytes())),
            32 if a.chars().all(|c| c == '0') => None,
            32 if a[..24].eq_ignore_ascii_case("0000000000000000FFFF0000") => {
                u32::from_str_radix(&a[24..], 16)
                    .ok()
                    .map(|v| Ipv4Addr::from(v.to_ne_bytes()))
            }
            _ => return None,
        };
        match addr {
            Some(a) if a.is_unspecified() => Some((None, port)),
            Some(a) => Some((Some(a), port)),
            None if a.len() == 32 => Some((None, port)),
            None => None,
        }
    })
}

/// Checks SNAT addresses against the host: returns those that are the
/// host's own (shared with the kernel), or an error that names every
/// overlap of `ports` with what the host uses on them, and a range that
/// would do.
pub fn check_snat(addrs: &[Ipv4Addr], ports: PortRange) -> Result<Vec<Ipv4Addr>, String> {
    let host = addresses().map_err(|e| format!("cannot list the host's addresses: {e}"))?;
    let shared: Vec<Ipv4Addr> = addrs.iter().copied().filter(|a| host.contains(a)).collect();
    if shared.is_empty() {
        return Ok(shared);
    }
    let ephemeral =
        local_port_range().map_err(|e| format!("cannot read net.ipv4.ip_local_port_range: {e}"))?;
    let mut problems = Vec::new();
    let mut used: Vec<u16> = Vec::new();
    if ports.overlaps(ephemeral) {
        problems.push(format!(
            "the kernel's ephemeral ports {ephemeral} (net.ipv4.ip_local_port_range)"
        ));
    }
    for a in &shared {
        let mine: Vec<HostPort> = ports_on(*a);
        used.extend(mine.iter().map(|p| p.port));
        let inside: Vec<String> = mine
            .iter()
            .filter(|p| ports.first <= p.port && p.port <= ports.last)
            .map(|p| format!("{}/{}", p.port, p.proto))
            .collect();
        if !inside.is_empty() {
            problems.push(format!("ports the host uses on {a}: {}", inside.join(" ")));
        }
    }
    if problems.is_empty() {
        return Ok(shared);
    }
    let list: Vec<String> = shared.iter().map(Ipv4Addr::to_string).collect();
    let mut msg = format!(
        "snat.addresses: {} {} this host's, so xvs shares {} with the kernel, which keeps the ports it uses: snat.ports {ports} overlaps {}",
        list.join(", "),
        if shared.len() == 1 { "is" } else { "are" },
        if shared.len() == 1 { "it" } else { "them" },
        problems.join(" and ")
    );
    match free_range(ephemeral, &used) {
        Some(r) => msg.push_str(&format!("; set snat.ports outside them, e.g. \"{r}\"")),
        None => msg.push_str("; use an address of its own for SNAT"),
    }
    Err(msg)
}

/// The largest range of ports from 1024 up that avoids `ephemeral` and
/// every port of `used`.
fn free_range(ephemeral: PortRange, used: &[u16]) -> Option<PortRange> {
    let mut best: Option<PortRange> = None;
    let mut start: Option<u16> = None;
    for p in 1024..=u16::MAX {
        let in_ephemeral = ephemeral.first <= p && p <= ephemeral.last;
        let free = !(in_ephemeral || used.contains(&p));
        match (free, start) {
            (true, None) => start = Some(p),
            (false, Some(s)) => {
                let r = PortRange {
                    first: s,
                    last: p - 1,
                };
                if best.is_none_or(|b| r.size() > b.size()) {
                    best = Some(r);
                }
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        let r = PortRange {
            first: s,
            last: u16::MAX,
        };
        if best.is_none_or(|b| r.size() > b.size()) {
            best = Some(r);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tables_give_addresses_ports_and_wildcards() {
        // 198.18.1.1:2222 listening, 0.0.0.0:22 listening, an
        // established socket (ignored), [::]:80 and v4-mapped
        // [::ffff:198.18.1.1]:8443 listening.
        let tcp = "  sl  local_address rem_address   st\n\
                   0: 010112C6:08AE 00000000:0000 0A 0\n\
                   1: 00000000:0016 00000000:0000 0A 0\n\
                   2: 010112C6:9C40 0A0012C6:0050 01 0\n";
        let tcp6 = "  sl  local_address rem_address st\n\
                    0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0\n\
                    1: 0000000000000000FFFF0000010112C6:20FB 00000000000000000000000000000000:0000 0A 0\n";
        let a = Ipv4Addr::new(198, 18, 1, 1);
        let got: Vec<_> = sockets(tcp, "0A").collect();
        assert_eq!(got, [(Some(a), 2222), (None, 22)]);
        let got: Vec<_> = sockets(tcp6, "0A").collect();
        assert_eq!(got, [(None, 80), (Some(a), 8443)]);
    }

    #[test]
    fn meminfo_fields_are_read_by_their_whole_name() {
        // `HugePages_Total` is what `vm.nr_hugepages` set (nothing else
        // in this test binary changes it), not `HugePages_Free` or
        // `Hugepagesize` that share its start.
        let nr: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(huge_pages_reserved(), Some(nr));
        assert_eq!(meminfo("Hugepagesize"), Some(2048));
        assert_eq!(meminfo("Huge"), None);
        let total = meminfo("MemTotal").unwrap() * 1024;
        let available = available_memory().unwrap();
        assert!(
            available > 0 && available <= total,
            "{available} of {total}"
        );
    }

    #[test]
    fn an_ipv6_table_is_counted_with_its_larger_entries() {
        let v4 = needed_memory(1_000_000, 2, false, 0);
        let both = needed_memory(1_000_000, 2, true, 0);
        let table6 = both - v4;
        // About 170 bytes per flow all-in (128-byte entries, their 24-byte
        // cold parts and the index).
        assert!((160..=180).contains(&(table6 / 1_000_000)), "{table6}");
    }

    #[test]
    fn a_umem_on_reserved_pages_is_not_counted_against_available_memory() {
        let all = needed_memory(100_000, 2, false, 0);
        // Each worker's port takes its UMEM from the pool when a whole
        // UMEM's pages are free there, else from MemAvailable.
        for (free, on_pool) in [(7, 0), (8, 1), (15, 1), (16, 2), (64, 2)] {
            let n = needed_memory(100_000, 2, false, free);
            assert_eq!(all - n, on_pool * UMEM_BYTES, "{free} pages free");
        }
    }

    #[test]
    fn the_suggested_range_avoids_ephemeral_and_used_ports() {
        let eph = PortRange {
            first: 32768,
            last: 60999,
        };
        let r = free_range(eph, &[2222, 8080]).unwrap();
        assert_eq!((r.first, r.last), (8081, 32767));
        assert_eq!(
            parse_port_range("32768\t60999\n"),
            Some(eph),
            "the sysctl's format"
        );
    }
}
