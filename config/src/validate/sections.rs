//! Rules of the settings sections: interfaces, SNAT, conntrack, admin API
//! and the Kubernetes source.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::family::Address;
use std::ops::Range;
use std::path::PathBuf;

use super::{every, Checker, MAX_CORE, MAX_IFNAME, MAX_QUEUE};
use crate::names::{ArmMode, PollMode, Steering, XdpAttachMode, ZeroCopy};
use crate::raw::{
    RawAdmin, RawConntrack, RawInterfaces, RawKubernetes, RawRestart, RawSnat, RawTimeouts, Sp,
};
use crate::settings::{
    Admin, AdminTcp, ConnRules, Conntrack, Interfaces, Kubernetes, PortRange, Restart, Snat,
    Timeouts, DEFAULT_ADMIN_SOCKET, DEFAULT_HOLD_MS, DEFAULT_SERVICE_PROXY_NAME,
    DEFAULT_SNAT_PORTS, DEFAULT_STATE_DIR, MAX_CONNTRACK_CAPACITY, MAX_HOLD_MS,
};

impl Checker<'_> {
    fn ifname(&mut self, v: &Sp<String>, field: &str) -> Option<String> {
        let name = v.get_ref();
        let ok = !name.is_empty()
            && name.len() <= MAX_IFNAME
            && name != "."
            && name != ".."
            && !name
                .contains(|c: char| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
        if ok {
            Some(name.clone())
        } else {
            self.report(
                &v.span(),
                field,
                format!("\"{name}\" is not an interface name (1 to {MAX_IFNAME} characters, no '/', ':' or spaces)"),
            );
            None
        }
    }

    pub(super) fn interfaces(&mut self, raw: Sp<RawInterfaces>) -> Option<Interfaces> {
        let table = raw.span();
        let raw = raw.into_inner();
        let mode = raw.mode.unwrap_or(ArmMode::OneArm);
        let client = self.ifname(&raw.client, "interfaces.client");
        let backend = match (mode, &raw.backend) {
            (ArmMode::OneArm, Some(b)) => {
                self.report(
                    &b.span(),
                    "interfaces.backend",
                    "only allowed in two-arm mode (interfaces.mode is one-arm)",
                );
                None
            }
            (ArmMode::OneArm, None) => Some(None),
            (ArmMode::TwoArm, None) => {
                self.report(
                    &table,
                    "interfaces.backend",
                    "required in two-arm mode (the backend-facing interface)",
                );
                None
            }
            (ArmMode::TwoArm, Some(b)) => {
                let name = self.ifname(b, "interfaces.backend")?;
                if Some(&name) == client.as_ref() {
                    self.report(
                        &b.span(),
                        "interfaces.backend",
                        format!("must differ from interfaces.client (both are \"{name}\")"),
                    );
                    None
                } else {
                    Some(Some(name))
                }
            }
        };

        let queues = match &raw.queues {
            None => Some(vec![0]),
            Some(list) => self.unique_ints(list, "interfaces.queues", "queue", MAX_QUEUE, ""),
        };
        let cores = match (&raw.cores, &queues) {
            (None, Some(q)) => Some((0..q.len()).collect()),
            (None, None) => None,
            (Some(list), _) => {
                let cores: Vec<usize> = self.unique_ints(
                    list,
                    "interfaces.cores",
                    "core",
                    MAX_CORE,
                    " (each worker needs a core of its own)",
                )?;
                match &queues {
                    Some(q) if q.len() != cores.len() => {
                        self.report(
                            &list.span(),
                            "interfaces.cores",
                            format!(
                                "{} cores for {} queues (one core per queue, in the same order)",
                                cores.len(),
                                q.len()
                            ),
                        );
                        None
                    }
                    _ => Some(cores),
                }
            }
        };
        Some(Interfaces {
            mode,
            client: client?,
            backend: backend?,
            queues: queues?,
            cores: cores?,
            poll: raw.poll.unwrap_or(PollMode::Adaptive),
            steering: raw.steering.unwrap_or(Steering::Vip),
            xdp_mode: raw.xdp_mode.unwrap_or(XdpAttachMode::Auto),
            zero_copy: raw.zero_copy.unwrap_or(ZeroCopy::Auto),
        })
    }

    /// A non-empty list of distinct integers in `0..=max`.
    fn unique_ints<T: TryFrom<i64>>(
        &mut self,
        list: &Sp<Vec<Sp<i64>>>,
        field: &str,
        what: &str,
        max: i64,
        why_unique: &str,
    ) -> Option<Vec<T>> {
        if list.get_ref().is_empty() {
            self.report(
                &list.span(),
                field,
                format!("must list at least one {what}"),
            );
            return None;
        }
        let mut seen = HashSet::new();
        let values = list.get_ref().iter().enumerate().map(|(i, v)| {
            let path = format!("{field}[{i}]");
            let value = self.int_in::<i64>(v, &path, 0..max + 1, &format!("0..={max}"))?;
            if !seen.insert(value) {
                self.report(
                    &v.span(),
                    path,
                    format!("{what} {value} listed twice{why_unique}"),
                );
                return None;
            }
            T::try_from(value).ok()
        });
        every(values)
    }

    fn port_range(&mut self, v: &Sp<String>, field: &str) -> Option<PortRange> {
        let text = v.get_ref();
        let parsed = text.split_once('-').and_then(|(a, b)| {
            Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?))
        });
        let msg = match parsed {
            None => format!(
                "\"{text}\" is not a port range (expected \"FIRST-LAST\", e.g. \"1024-65535\")"
            ),
            Some((0, _)) => format!("\"{text}\": port 0 cannot be allocated (ports start at 1)"),
            Some((first, last)) if first > last => {
                format!("\"{text}\": first port {first} is above last port {last}")
            }
            Some((first, last)) => return Some(PortRange { first, last }),
        };
        self.report(&v.span(), field, msg);
        None
    }

    /// SNAT settings, and the span of each address (for the VIP check).
    pub(super) fn snat(
        &mut self,
        raw: Sp<RawSnat>,
        workers: Option<usize>,
    ) -> Option<(Snat, Vec<Range<usize>>)> {
        let raw = raw.into_inner();
        let mut seen = HashSet::new();
        let mut addresses = every(raw.addresses.get_ref().iter().enumerate().map(|(i, a)| {
            let field = format!("snat.addresses[{i}]");
            let addr = self.unicast_any(a, &field)?;
            if !seen.insert(addr) {
                self.report(&a.span(), field, format!("{addr} listed twice"));
                return None;
            }
            Some((addr, a.span()))
        }));
        if raw.addresses.get_ref().is_empty() {
            self.report(
                &raw.addresses.span(),
                "snat.addresses",
                "must list at least one address",
            );
            addresses = None;
        }

        let ports = match &raw.ports {
            None => Some(DEFAULT_SNAT_PORTS),
            Some(p) => self.port_range(p, "snat.ports"),
        };
        let (ports, workers) = (ports?, workers?);
        let worker_ports = match &raw.worker_ports {
            None => {
                if ports.size() < workers as u32 {
                    let span = raw.ports.as_ref().map_or(0..0, |p| p.span());
                    self.report(
                        &span,
                        "snat.ports",
                        format!(
                            "{ports} has {} ports for {workers} workers (each worker needs a slice of its own)",
                            ports.size()
                        ),
                    );
                    None
                } else {
                    Some(ports.split(workers))
                }
            }
            Some(list) => self.worker_ports(list, ports, workers),
        };
        let (all, spans): (Vec<IpAddr>, Vec<_>) = addresses?.into_iter().unzip();
        let addresses = all.iter().filter_map(|a| Ipv4Addr::from_ip(*a)).collect();
        let addresses6 = all.iter().filter_map(|a| Ipv6Addr::from_ip(*a)).collect();
        Some((
            Snat {
                addresses,
                addresses6,
                ports,
                worker_ports: worker_ports?,
            },
            spans,
        ))
    }

    fn worker_ports(
        &mut self,
        list: &Sp<Vec<Sp<String>>>,
        ports: PortRange,
        workers: usize,
    ) -> Option<Vec<PortRange>> {
        if list.get_ref().len() != workers {
            self.report(
                &list.span(),
                "snat.worker_ports",
                format!(
                    "{} slices for {workers} workers (one slice per queue, in the same order)",
                    list.get_ref().len()
                ),
            );
            return None;
        }
        let mut accepted: Vec<PortRange> = Vec::new();
        every(list.get_ref().iter().enumerate().map(|(i, v)| {
            let field = format!("snat.worker_ports[{i}]");
            let slice = self.port_range(v, &field)?;
            if !ports.contains_range(slice) {
                self.report(&v.span(), field, format!("{slice} is outside snat.ports ({ports})"));
                return None;
            }
            if let Some(j) = accepted.iter().position(|o| o.overlaps(slice)) {
                let other = accepted[j];
                self.report(
                    &v.span(),
                    field,
                    format!("{slice} overlaps snat.worker_ports[{j}] ({other}): each worker needs ports of its own"),
                );
                return None;
            }
            accepted.push(slice);
            Some(slice)
        }))
    }

    pub(super) fn conntrack(
        &mut self,
        raw: RawConntrack,
        workers: Option<usize>,
        ipv6: bool,
    ) -> Option<Conntrack> {
        let capacity = match &raw.capacity {
            None => Some(Conntrack::default().capacity),
            Some(v) => {
                let cap: Option<u32> = self.int_in(
                    v,
                    "conntrack.capacity",
                    1..i64::from(MAX_CONNTRACK_CAPACITY) + 1,
                    &format!("1..={MAX_CONNTRACK_CAPACITY} flows"),
                );
                match (cap, workers) {
                    (Some(c), Some(w)) if (c as usize) < w => {
                        self.report(
                            &v.span(),
                            "conntrack.capacity",
                            format!("{c} is below one flow per worker ({w} workers)"),
                        );
                        None
                    }
                    _ => cap,
                }
            }
        };
        if let (Some(cap), Some(w), Some(m)) = (capacity, workers, &self.host.memory) {
            let needed = (m.needed)(cap, w, ipv6);
            if needed > m.available {
                let span = raw.capacity.as_ref().map_or(0..0, |c| c.span());
                self.report(
                    &span,
                    "conntrack.capacity",
                    format!(
                        "{cap} flows need {} of memory ({} bytes per flow: the entries, the index and the wheel{}, over {w} worker{}), more than the {} this host has available (MemAvailable)",
                        human_bytes(needed),
                        needed / u64::from(cap.max(1)),
                        if ipv6 { ", an IPv4 and an IPv6 table" } else { "" },
                        if w == 1 { "" } else { "s" },
                        human_bytes(m.available)
                    ),
                );
            }
        }
        let timeouts = self.timeouts(&raw.timeouts);
        let d = ConnRules::default();
        let rules = ConnRules {
            conn_reuse_mode: raw.conn_reuse_mode.unwrap_or(d.conn_reuse_mode),
            expire_nodest_conn: raw.expire_nodest_conn.unwrap_or(d.expire_nodest_conn),
            expire_quiescent_template: raw
                .expire_quiescent_template
                .unwrap_or(d.expire_quiescent_template),
        };
        Some(Conntrack {
            capacity: capacity?,
            timeouts: timeouts?,
            rules,
        })
    }

    fn timeouts(&mut self, raw: &RawTimeouts) -> Option<Timeouts> {
        let mut t = Timeouts::default();
        let mut ok = true;
        let fields: [(&str, &Option<Sp<i64>>); 12] = [
            ("established", &raw.established),
            ("syn_sent", &raw.syn_sent),
            ("syn_recv", &raw.syn_recv),
            ("fin_wait", &raw.fin_wait),
            ("time_wait", &raw.time_wait),
            ("close", &raw.close),
            ("close_wait", &raw.close_wait),
            ("last_ack", &raw.last_ack),
            ("synack", &raw.synack),
            ("udp", &raw.udp),
            ("icmp", &raw.icmp),
            ("syn_recv_pressure", &raw.syn_recv_pressure),
        ];
        for (name, value) in fields {
            if let Some(v) = value {
                let field = format!("conntrack.timeouts.{name}");
                match (self.timeout_secs(v, &field), t.by_name(name)) {
                    (Some(secs), Some(slot)) => *slot = secs,
                    _ => ok = false,
                }
            }
        }
        ok.then_some(t)
    }

    pub(super) fn admin(&mut self, raw: RawAdmin) -> Option<Admin> {
        let socket = match &raw.socket {
            None => Some(PathBuf::from(DEFAULT_ADMIN_SOCKET)),
            Some(s) => self.absolute_path(s, "admin.socket"),
        };
        let token_file = match &raw.token_file {
            None => Some(None),
            Some(t) => self.absolute_path(t, "admin.token_file").map(Some),
        };
        let tcp = match &raw.tcp {
            None => Some(None),
            Some(t) => match t.get_ref().parse::<SocketAddr>() {
                Err(_) => {
                    self.report(
                        &t.span(),
                        "admin.tcp",
                        format!(
                            "\"{}\" is not an address:port (e.g. \"127.0.0.1:9180\")",
                            t.get_ref()
                        ),
                    );
                    None
                }
                Ok(address) => match &token_file {
                    Some(Some(token_file)) => Some(Some(AdminTcp {
                        address,
                        token_file: token_file.clone(),
                    })),
                    Some(None) => {
                        self.report(
                            &t.span(),
                            "admin.token_file",
                            "required when admin.tcp is set (the API never listens on TCP without a bearer token)",
                        );
                        None
                    }
                    None => None,
                },
            },
        };
        token_file?;
        Some(Admin {
            socket: socket?,
            tcp: tcp?,
        })
    }

    pub(super) fn tunnel(&mut self, raw: crate::raw::RawTunnel) -> Option<crate::settings::Tunnel> {
        let mut out = crate::settings::Tunnel::default();
        let mut ok = true;
        if let Some(a) = &raw.source {
            match a.get_ref().parse::<Ipv4Addr>() {
                Ok(v) if crate::service::is_unicast(v) => out.source = Some(v),
                _ => {
                    self.report(
                        &a.span(),
                        "tunnel.source",
                        format!("\"{}\" is not a unicast IPv4 address", a.get_ref()),
                    );
                    ok = false;
                }
            }
        }
        if let Some(a) = &raw.source6 {
            match a.get_ref().parse::<Ipv6Addr>() {
                Ok(v) if crate::service::is_unicast6(v) => out.source6 = Some(v),
                _ => {
                    self.report(
                        &a.span(),
                        "tunnel.source6",
                        format!("\"{}\" is not a unicast IPv6 address", a.get_ref()),
                    );
                    ok = false;
                }
            }
        }
        if let Some(n) = &raw.client_source_net {
            match n.get_ref().parse::<ipnet::Ipv4Net>() {
                Ok(net) if net.prefix_len() >= 8 && net.prefix_len() <= 30 => {
                    out.client_source_net = Some(net.trunc())
                }
                _ => {
                    self.report(&n.span(), "tunnel.client_source_net", format!("\"{}\" is not an IPv4 network with a prefix of 8 to 30 bits (e.g. \"198.18.240.0/20\")", n.get_ref()));
                    ok = false;
                }
            }
        }
        if let Some(p) = &raw.gue_port {
            match self.int_in(p, "tunnel.gue_port", 1..65_536, "1..=65535") {
                Some(port) => out.gue_port = port,
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    pub(super) fn cluster(
        &mut self,
        raw: crate::raw::RawCluster,
    ) -> Option<crate::settings::Cluster> {
        let mut out = crate::settings::Cluster::default();
        if let Some(seed) = &raw.hash_seed {
            // TOML integers are signed: every non-negative one is a seed.
            out.hash_seed = self.int_in(
                seed,
                "cluster.hash_seed",
                0..i64::MAX,
                "0..=9223372036854775806",
            )?;
        }
        if let Some(sync) = raw.sync {
            out.sync = Some(self.sync(sync)?);
        }
        Some(out)
    }

    fn sync(&mut self, raw: Sp<crate::raw::RawSync>) -> Option<crate::settings::Sync> {
        let raw = raw.into_inner();
        let node = self.int_in(
            &raw.node,
            "cluster.sync.node",
            1..(1 << 32),
            "1..=4294967295",
        );
        let id = match &raw.id {
            Some(v) => self.int_in(v, "cluster.sync.id", 0..256, "0..=255"),
            None => Some(0),
        };
        let addr = |me: &mut Self, v: &Sp<String>, field: &str| -> Option<std::net::SocketAddr> {
            match v.get_ref().parse::<std::net::SocketAddr>() {
                Ok(a) if a.port() != 0 && !a.ip().is_unspecified() => Some(a),
                _ => {
                    me.report(
                        &v.span(),
                        field,
                        format!(
                            "\"{}\" is not an address and port (e.g. \"198.18.9.1:{}\")",
                            v.get_ref(),
                            crate::settings::DEFAULT_SYNC_PORT
                        ),
                    );
                    None
                }
            }
        };
        let listen = addr(self, &raw.listen, "cluster.sync.listen");
        let listen = match listen {
            Some(l) if l.ip().is_multicast() => {
                self.report(
                    &raw.listen.span(),
                    "cluster.sync.listen",
                    "must be this gateway's own address (the multicast group goes in peers)",
                );
                None
            }
            other => other,
        };
        let mut peers = Vec::new();
        let mut ok = true;
        for p in raw.peers.get_ref() {
            match addr(self, p, "cluster.sync.peers") {
                Some(a) if listen.is_some_and(|l| l.is_ipv4() != a.is_ipv4()) => {
                    self.report(
                        &p.span(),
                        "cluster.sync.peers",
                        "must be of listen's address family",
                    );
                    ok = false;
                }
                Some(a) => peers.push(a),
                None => ok = false,
            }
        }
        if ok && peers.is_empty() {
            self.report(
                &raw.peers.span(),
                "cluster.sync.peers",
                "needs at least one peer, or one multicast group",
            );
            ok = false;
        }
        if ok && peers.len() > 1 && peers.iter().any(|p| p.ip().is_multicast()) {
            self.report(
                &raw.peers.span(),
                "cluster.sync.peers",
                "a multicast group is the only entry, or there is none",
            );
            ok = false;
        }
        let key_file = match &raw.key_file {
            Some(k) => Some(Some(self.absolute_path(k, "cluster.sync.key_file")?)),
            None => Some(None),
        };
        let peer_timeout_ms = match &raw.peer_timeout {
            None => Some(None),
            Some(t) => match parse_duration_ms(t.get_ref()) {
                Some(ms)
                    if (crate::settings::MIN_PEER_TIMEOUT_MS
                        ..=crate::settings::MAX_PEER_TIMEOUT_MS)
                        .contains(&ms) =>
                {
                    Some(Some(ms as u32))
                }
                _ => {
                    self.report(
                        &t.span(),
                        "cluster.sync.peer_timeout",
                        format!(
                            "\"{}\" is not a duration of {}ms to {}s (e.g. \"3s\")",
                            t.get_ref(),
                            crate::settings::MIN_PEER_TIMEOUT_MS,
                            crate::settings::MAX_PEER_TIMEOUT_MS / 1000
                        ),
                    );
                    None
                }
            },
        };
        ok.then_some(())?;
        Some(crate::settings::Sync {
            node: node?,
            id: id?,
            listen: listen?,
            peers,
            key_file: key_file?,
            role: raw.role.unwrap_or_default(),
            peer_timeout_ms: peer_timeout_ms?,
        })
    }

    pub(super) fn restart(&mut self, raw: RawRestart) -> Option<Restart> {
        let hold_ms = match &raw.hold {
            None => Some(DEFAULT_HOLD_MS),
            Some(h) => match parse_duration_ms(h.get_ref()) {
                Some(ms) if ms <= u64::from(MAX_HOLD_MS) => Some(ms as u32),
                _ => {
                    self.report(
                        &h.span(),
                        "restart.hold",
                        format!(
                            "\"{}\" is not a duration of 0 to {}s (e.g. \"5s\", \"1500ms\"; \"0s\" turns restart survival off)",
                            h.get_ref(),
                            MAX_HOLD_MS / 1000
                        ),
                    );
                    None
                }
            },
        };
        let state_dir = match &raw.state_dir {
            None => Some(PathBuf::from(DEFAULT_STATE_DIR)),
            Some(d) => self.absolute_path(d, "restart.state_dir"),
        };
        Some(Restart {
            hold_ms: hold_ms?,
            state_dir: state_dir?,
        })
    }

    pub(super) fn kubernetes(&mut self, raw: RawKubernetes) -> Option<Kubernetes> {
        let kubeconfig = match &raw.kubeconfig {
            None => Some(None),
            Some(k) if k.get_ref().is_empty() => {
                self.report(
                    &k.span(),
                    "kubernetes.kubeconfig",
                    "must not be empty (omit it for in-cluster configuration)",
                );
                None
            }
            Some(k) => Some(Some(PathBuf::from(k.get_ref()))),
        };
        let service_proxy_name = match &raw.service_proxy_name {
            None => Some(DEFAULT_SERVICE_PROXY_NAME.to_owned()),
            Some(n) if is_label_value(n.get_ref()) => Some(n.get_ref().clone()),
            Some(n) => {
                self.report(
                    &n.span(),
                    "kubernetes.service_proxy_name",
                    format!(
                        "\"{}\" is not a label value (1 to 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)",
                        n.get_ref()
                    ),
                );
                None
            }
        };
        Some(Kubernetes {
            enabled: raw.enabled.unwrap_or(false),
            kubeconfig: kubeconfig?,
            service_proxy_name: service_proxy_name?,
        })
    }
}

/// Bytes as an operator reads them (MiB / GiB, one decimal).
fn human_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    let b = b as f64;
    if b >= 1024.0 * MIB {
        format!("{:.1} GiB", b / (1024.0 * MIB))
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

/// A Kubernetes label value, non-empty.
fn is_label_value(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    (1..=63).contains(&s.len())
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars()
            .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
}

/// Milliseconds of a duration written as systemd writes `RestartSec=`: a
/// number with a unit, `ms` or `s` ("5s", "1500ms", "0.5s"); `None` when
/// it is not one.
pub(super) fn parse_duration_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    let value: f64 = number.trim().parse().ok()?;
    (value.is_finite() && value >= 0.0).then(|| (value * scale).round() as u64)
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration_ms;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration_ms("5s"), Some(5000));
        assert_eq!(parse_duration_ms("1500ms"), Some(1500));
        assert_eq!(parse_duration_ms("0.5s"), Some(500));
        assert_eq!(parse_duration_ms("0s"), Some(0));
        assert_eq!(parse_duration_ms("5"), None);
        assert_eq!(parse_duration_ms("-1s"), None);
        assert_eq!(parse_duration_ms("fast"), None);
    }
}
