//! Validation: the raw file ([`crate::raw`]) becomes a [`Config`], or every
//! problem found becomes a located [`Diagnostic`].
//!
//! Invariants: a syntax or shape error (bad TOML, unknown key, wrong type,
//! unknown keyword, missing required key) stops at the first one, as serde
//! does; once the shape is right, every semantic rule is checked and every
//! violation reported, sorted by position. Rules of a single service are
//! [`Service::check`]'s (shared with runtime edits and Kubernetes); rules
//! that span sections (duplicate services, SNAT against VIPs, workers
//! against ports and capacity) live here.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;

use ipnet::Ipv4Net;
use serde_path_to_error::Segment;

use crate::error::{Diagnostic, Invalid, Locator};
use crate::names::{ArmMode, ForwardMethod, PollMode, Protocol, Steering, XdpAttachMode, ZeroCopy};
use crate::raw::{RawAdmin, RawBackend, RawConntrack, RawFile, RawInterfaces, RawKubernetes};
use crate::raw::{RawService, RawSnat, RawTimeouts, Sp};
use crate::service::{
    is_unicast, Backend, BackendField, Persistence, Service, ServiceField, ServiceKey,
    DEFAULT_WEIGHT, MAX_MAGLEV_TABLE_SIZE, MAX_TIMEOUT_SECS, MAX_WEIGHT,
};
use crate::settings::{
    Admin, AdminTcp, Config, Conntrack, Interfaces, Kubernetes, PortRange, Snat, Timeouts,
    DEFAULT_ADMIN_SOCKET, DEFAULT_SERVICE_PROXY_NAME, DEFAULT_SNAT_PORTS, MAX_CONNTRACK_CAPACITY,
};

/// Largest RX queue index accepted.
const MAX_QUEUE: i64 = 65_535;
/// Largest CPU core index accepted (glibc's CPU_SETSIZE is 1024).
const MAX_CORE: i64 = 1_023;
/// Longest interface name (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;

/// Parses and validates `text`, read from `file`.
pub(crate) fn parse(file: &str, text: &str) -> Result<Config, Invalid> {
    let mut c = Checker {
        file,
        locator: Locator::new(text),
        out: Vec::new(),
    };
    let raw = match read_raw(text) {
        Ok(raw) => raw,
        Err((span, field, message)) => {
            c.report(&span, field, message);
            return Err(c.finish_err());
        }
    };
    let config = c.config(raw);
    match config {
        Some(config) if c.out.is_empty() => Ok(config),
        _ => Err(c.finish_err()),
    }
}

/// Reads the shape of the file; on failure, the span, field path and
/// message of the first problem.
fn read_raw(text: &str) -> Result<RawFile, (Range<usize>, String, String)> {
    let de = toml::Deserializer::parse(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        (span, String::new(), e.message().to_owned())
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let mut field = field_path(e.path());
        let inner = e.into_inner();
        let span = inner.span().unwrap_or(0..0);
        let message = serde_message(inner.message(), &mut field);
        (span, field, message)
    })
}

/// Renders a serde path as `services[2].scheduler`, dropping the internal
/// segments of `toml::Spanned`.
fn field_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } if key.starts_with("$__serde_spanned") => {}
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// Rewrites serde's messages into the project's style (quotes, not
/// backticks; "expected X, found Y"); a missing field moves into the path.
fn serde_message(message: &str, field: &mut String) -> String {
    let unquote = |s: &str| s.replace('`', "");
    if let Some(rest) = message.strip_prefix("missing field ") {
        if !field.is_empty() {
            field.push('.');
        }
        field.push_str(&unquote(rest));
        return "required field is missing".to_owned();
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (name, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let expected = expected.strip_prefix("one of ").unwrap_or(expected);
        let name = unquote(name);
        return match expected {
            "" | "there are no fields" => format!("unknown field \"{name}\""),
            _ => format!(
                "unknown field \"{name}\" (expected one of {})",
                unquote(expected)
            ),
        };
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            let expected = match expected {
                "i64" | "u16" | "u32" | "an integer" => "an integer",
                "a boolean" | "bool" => "true or false",
                "a sequence" => "an array",
                "a borrowed string" | "a string" => "a string",
                e if e.starts_with("struct ") || e.starts_with("a map") => "a table",
                e => e,
            };
            return format!("expected {expected}, found {}", unquote(found));
        }
    }
    message.to_owned()
}

struct Checker<'a> {
    file: &'a str,
    locator: Locator<'a>,
    out: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn report(
        &mut self,
        span: &Range<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        let (line, column) = self.locator.position(span);
        self.out.push(Diagnostic {
            file: self.file.to_owned(),
            line,
            column,
            field: field.into(),
            message: message.into(),
        });
    }

    fn finish_err(mut self) -> Invalid {
        self.out.sort_by_key(|d| (d.line, d.column));
        Invalid {
            diagnostics: self.out,
        }
    }

    fn config(&mut self, raw: RawFile) -> Option<Config> {
        let interfaces = match raw.interfaces {
            Some(i) => self.interfaces(i),
            None => {
                self.report(
                    &(0..0),
                    "interfaces",
                    "required section is missing (e.g. [interfaces] client = \"eth0\")",
                );
                None
            }
        };
        let workers = interfaces.as_ref().map(|i| i.queues.len());
        let snat = match raw.snat {
            Some(s) => self.snat(s, workers),
            None => {
                self.report(
                    &(0..0),
                    "snat",
                    "required section is missing (full NAT needs a source address, e.g. [snat] addresses = [\"198.18.2.1\"])",
                );
                None
            }
        };
        let conntrack = self.conntrack(raw.conntrack, workers);
        let admin = self.admin(raw.admin);
        let kubernetes = self.kubernetes(raw.kubernetes);
        let services = self.services(raw.services);
        if let (Some(snat), Some(services)) = (&snat, &services) {
            self.snat_not_vip(snat, services);
        }
        Some(Config {
            interfaces: interfaces?,
            snat: snat?.0,
            conntrack: conntrack?,
            admin: admin?,
            kubernetes: kubernetes?,
            services: services?.into_iter().map(|(s, _)| s).collect(),
        })
    }

    /// An integer in `range`, else a report saying what is allowed.
    fn int_in<T: TryFrom<i64>>(
        &mut self,
        v: &Sp<i64>,
        field: &str,
        range: Range<i64>,
        allowed: &str,
    ) -> Option<T> {
        let value = *v.get_ref();
        if range.contains(&value) {
            T::try_from(value).ok()
        } else {
            self.report(
                &v.span(),
                field,
                format!("{value} is out of range (expected {allowed})"),
            );
            None
        }
    }

    fn ipv4(&mut self, v: &Sp<String>, field: &str) -> Option<Ipv4Addr> {
        match v.get_ref().parse::<Ipv4Addr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.report(
                    &v.span(),
                    field,
                    format!("\"{}\" is not an IPv4 address", v.get_ref()),
                );
                None
            }
        }
    }

    fn unicast(&mut self, v: &Sp<String>, field: &str) -> Option<Ipv4Addr> {
        let a = self.ipv4(v, field)?;
        if is_unicast(a) {
            Some(a)
        } else {
            self.report(
                &v.span(),
                field,
                format!("{a} is not a unicast address (not 0.0.0.0/8, loopback, multicast or broadcast)"),
            );
            None
        }
    }

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

    fn interfaces(&mut self, raw: Sp<RawInterfaces>) -> Option<Interfaces> {
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
        let mut out = Some(Vec::new());
        for (i, v) in list.get_ref().iter().enumerate() {
            let path = format!("{field}[{i}]");
            let value = self.int_in::<i64>(v, &path, 0..max + 1, &format!("0..={max}"));
            match value {
                Some(value) if !seen.insert(value) => {
                    self.report(
                        &v.span(),
                        path,
                        format!("{what} {value} listed twice{why_unique}"),
                    );
                    out = None;
                }
                Some(value) => {
                    if let (Some(out), Ok(value)) = (out.as_mut(), T::try_from(value)) {
                        out.push(value);
                    }
                }
                None => out = None,
            }
        }
        out
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
    fn snat(
        &mut self,
        raw: Sp<RawSnat>,
        workers: Option<usize>,
    ) -> Option<(Snat, Vec<Range<usize>>)> {
        let raw = raw.into_inner();
        let mut addresses = Some(Vec::new());
        let mut spans = Vec::new();
        let mut seen = HashSet::new();
        if raw.addresses.get_ref().is_empty() {
            self.report(
                &raw.addresses.span(),
                "snat.addresses",
                "must list at least one address",
            );
            addresses = None;
        }
        for (i, a) in raw.addresses.get_ref().iter().enumerate() {
            let field = format!("snat.addresses[{i}]");
            match self.unicast(a, &field) {
                Some(addr) if !seen.insert(addr) => {
                    self.report(&a.span(), field, format!("{addr} listed twice"));
                    addresses = None;
                }
                Some(addr) => {
                    addresses.as_mut().map(|v| v.push(addr));
                    spans.push(a.span());
                }
                None => addresses = None,
            }
        }

        let ports = match &raw.ports {
            None => Some(DEFAULT_SNAT_PORTS),
            Some(p) => self.port_range(p, "snat.ports"),
        };
        let (ports, workers) = (ports?, workers?);
        let worker_ports = match &raw.worker_ports {
            None => {
                if ports.len() < workers as u32 {
                    let span = raw.ports.as_ref().map_or(0..0, |p| p.span());
                    self.report(
                        &span,
                        "snat.ports",
                        format!(
                            "{ports} has {} ports for {workers} workers (each worker needs a slice of its own)",
                            ports.len()
                        ),
                    );
                    None
                } else {
                    Some(ports.split(workers))
                }
            }
            Some(list) => self.worker_ports(list, ports, workers),
        };
        Some((
            Snat {
                addresses: addresses?,
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
        let mut out: Option<Vec<PortRange>> = Some(Vec::new());
        let mut accepted: Vec<(usize, PortRange)> = Vec::new();
        for (i, v) in list.get_ref().iter().enumerate() {
            let field = format!("snat.worker_ports[{i}]");
            let Some(slice) = self.port_range(v, &field) else {
                out = None;
                continue;
            };
            if !ports.contains_range(slice) {
                self.report(
                    &v.span(),
                    field,
                    format!("{slice} is outside snat.ports ({ports})"),
                );
                out = None;
            } else if let Some((j, other)) = accepted.iter().find(|(_, o)| o.overlaps(slice)) {
                self.report(
                    &v.span(),
                    field,
                    format!("{slice} overlaps snat.worker_ports[{j}] ({other}): each worker needs ports of its own"),
                );
                out = None;
            } else {
                accepted.push((i, slice));
                out.as_mut().map(|o| o.push(slice));
            }
        }
        out
    }

    fn conntrack(&mut self, raw: RawConntrack, workers: Option<usize>) -> Option<Conntrack> {
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
        let timeouts = self.timeouts(&raw.timeouts);
        Some(Conntrack {
            capacity: capacity?,
            timeouts: timeouts?,
        })
    }

    fn timeouts(&mut self, raw: &RawTimeouts) -> Option<Timeouts> {
        let mut t = Timeouts::default();
        let mut ok = true;
        let fields: [(&str, &Option<Sp<i64>>, &mut u32); 11] = [
            ("established", &raw.established, &mut t.established),
            ("syn_sent", &raw.syn_sent, &mut t.syn_sent),
            ("syn_recv", &raw.syn_recv, &mut t.syn_recv),
            ("fin_wait", &raw.fin_wait, &mut t.fin_wait),
            ("time_wait", &raw.time_wait, &mut t.time_wait),
            ("close", &raw.close, &mut t.close),
            ("close_wait", &raw.close_wait, &mut t.close_wait),
            ("last_ack", &raw.last_ack, &mut t.last_ack),
            ("synack", &raw.synack, &mut t.synack),
            ("udp", &raw.udp, &mut t.udp),
            ("icmp", &raw.icmp, &mut t.icmp),
        ];
        for (name, value, slot) in fields {
            if let Some(v) = value {
                let field = format!("conntrack.timeouts.{name}");
                match self.timeout_secs(v, &field) {
                    Some(secs) => *slot = secs,
                    None => ok = false,
                }
            }
        }
        ok.then_some(t)
    }

    fn timeout_secs(&mut self, v: &Sp<i64>, field: &str) -> Option<u32> {
        self.int_in(
            v,
            field,
            1..i64::from(MAX_TIMEOUT_SECS) + 1,
            &format!("1..={MAX_TIMEOUT_SECS} seconds"),
        )
    }

    fn absolute_path(&mut self, v: &Sp<String>, field: &str) -> Option<PathBuf> {
        let path = PathBuf::from(v.get_ref());
        if path.is_absolute() {
            Some(path)
        } else {
            self.report(
                &v.span(),
                field,
                format!("\"{}\" is not an absolute path", v.get_ref()),
            );
            None
        }
    }

    fn admin(&mut self, raw: RawAdmin) -> Option<Admin> {
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

    fn kubernetes(&mut self, raw: RawKubernetes) -> Option<Kubernetes> {
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

    /// The services, each with its header span, or `None` if any is invalid.
    fn services(&mut self, raw: Vec<Sp<RawService>>) -> Option<Vec<(Service, Range<usize>)>> {
        let mut out = Some(Vec::new());
        let mut first: HashMap<ServiceKey, (usize, Range<usize>)> = HashMap::new();
        for (i, s) in raw.iter().enumerate() {
            let Some(service) = self.service(i, s) else {
                out = None;
                continue;
            };
            if let Some((j, at)) = first.get(&service.key) {
                let (line, _) = self.locator.position(at);
                self.report(
                    &s.span(),
                    format!("services[{i}]"),
                    format!(
                        "duplicate service {} (first defined by services[{j}] at line {line})",
                        service.key
                    ),
                );
                out = None;
                continue;
            }
            first.insert(service.key, (i, s.span()));
            out.as_mut().map(|o| o.push((service, s.span())));
        }
        out
    }

    fn service(&mut self, i: usize, raw: &Sp<RawService>) -> Option<Service> {
        let header = raw.span();
        let r = raw.get_ref();
        let at = format!("services[{i}]");
        let vip = self.unicast(&r.vip, &format!("{at}.vip"));
        let port: Option<u16> = self.int_in(&r.port, &format!("{at}.port"), 0..65_536, "0..=65535");
        let persistence = match &r.persistence {
            None => Some(None),
            Some(p) => {
                let p = p.get_ref();
                let mut out = Persistence::default();
                let timeout = match &p.timeout {
                    None => Some(out.timeout_secs),
                    Some(t) => self.timeout_secs(t, &format!("{at}.persistence.timeout")),
                };
                let netmask = match &p.netmask {
                    None => Some(out.netmask),
                    Some(m) => self.ipv4(m, &format!("{at}.persistence.netmask")),
                };
                out.timeout_secs = timeout?;
                out.netmask = netmask?;
                Some(Some(out))
            }
        };
        let mut flags = crate::service::SchedulerFlags::default();
        let mut flags_ok = true;
        if let Some(list) = &r.flags {
            for (k, f) in list.get_ref().iter().enumerate() {
                if flags.set(*f.get_ref()) {
                    self.report(
                        &f.span(),
                        format!("{at}.flags[{k}]"),
                        format!("flag {} listed twice", f.get_ref()),
                    );
                    flags_ok = false;
                }
            }
        }
        let mut source_ranges = Some(Vec::new());
        for (k, cidr) in r.source_ranges.iter().enumerate() {
            match parse_cidr(cidr.get_ref()) {
                Some(net) => source_ranges.as_mut().map(|v| v.push(net)),
                None => {
                    self.report(
                        &cidr.span(),
                        format!("{at}.source_ranges[{k}]"),
                        format!(
                            "\"{}\" is not an IPv4 CIDR (e.g. \"198.18.0.0/24\")",
                            cidr.get_ref()
                        ),
                    );
                    source_ranges = None;
                    None
                }
            };
        }
        let maglev_table_size = match &r.maglev_table_size {
            None => Some(None),
            Some(m) => self
                .int_in(
                    m,
                    &format!("{at}.maglev_table_size"),
                    2..i64::from(MAX_MAGLEV_TABLE_SIZE) + 1,
                    &format!("a prime up to {MAX_MAGLEV_TABLE_SIZE}"),
                )
                .map(Some),
        };
        let mut backends = Some(Vec::new());
        for (k, b) in r.backends.iter().enumerate() {
            match self.backend(&format!("{at}.backends[{k}]"), b.get_ref(), port) {
                Some(b) => backends.as_mut().map(|v| v.push(b)),
                None => {
                    backends = None;
                    None
                }
            };
        }

        let service = Service {
            key: ServiceKey {
                vip: vip?,
                protocol: r.protocol.unwrap_or(Protocol::Tcp),
                port: port?,
            },
            name: r.name.clone(),
            scheduler: r
                .scheduler
                .as_ref()
                .map_or(crate::names::Scheduler::DEFAULT, |s| *s.get_ref()),
            flags,
            persistence: persistence?,
            source_ranges: source_ranges?,
            maglev_table_size: maglev_table_size?,
            backends: backends?,
        };
        if !flags_ok {
            return None;
        }
        let violations = service.check();
        for v in &violations {
            let span = service_field_span(r, &header, v.field);
            self.report(&span, format!("{at}.{}", v.field), v.message.clone());
        }
        violations.is_empty().then_some(service)
    }

    fn backend(
        &mut self,
        at: &str,
        raw: &RawBackend,
        service_port: Option<u16>,
    ) -> Option<Backend> {
        let address = self.ipv4(&raw.address, &format!("{at}.address"));
        let port = match &raw.port {
            None => service_port,
            Some(p) => self.int_in(p, &format!("{at}.port"), 0..65_536, "0..=65535"),
        };
        let weight = match &raw.weight {
            None => Some(DEFAULT_WEIGHT),
            Some(w) => self.int_in(
                w,
                &format!("{at}.weight"),
                0..i64::from(MAX_WEIGHT) + 1,
                &format!("0..={MAX_WEIGHT}"),
            ),
        };
        Some(Backend {
            address: address?,
            port: port?,
            weight: weight?,
            forward: raw.forward.unwrap_or(ForwardMethod::Masq),
        })
    }

    fn snat_not_vip(
        &mut self,
        snat: &(Snat, Vec<Range<usize>>),
        services: &[(Service, Range<usize>)],
    ) {
        for (k, (addr, span)) in snat.0.addresses.iter().zip(&snat.1).enumerate() {
            if let Some(i) = services.iter().position(|(s, _)| s.key.vip == *addr) {
                self.report(
                    span,
                    format!("snat.addresses[{k}]"),
                    format!("{addr} is also the VIP of services[{i}] (a SNAT address must not be a VIP)"),
                );
            }
        }
    }
}

/// The span that best locates a rule violation of a service: the field
/// itself when written, else the table that would hold it.
fn service_field_span(r: &RawService, header: &Range<usize>, field: ServiceField) -> Range<usize> {
    let or_header = |s: Option<Range<usize>>| s.unwrap_or_else(|| header.clone());
    match field {
        ServiceField::Vip => r.vip.span(),
        ServiceField::Port => r.port.span(),
        ServiceField::Scheduler => or_header(r.scheduler.as_ref().map(|s| s.span())),
        ServiceField::Flags => or_header(r.flags.as_ref().map(|s| s.span())),
        ServiceField::PersistenceTimeout | ServiceField::PersistenceNetmask => {
            let p = r.persistence.as_ref();
            let inner = p.and_then(|p| {
                let p = p.get_ref();
                match field {
                    ServiceField::PersistenceTimeout => p.timeout.as_ref().map(|t| t.span()),
                    _ => p.netmask.as_ref().map(|t| t.span()),
                }
            });
            or_header(inner.or_else(|| p.map(|p| p.span())))
        }
        ServiceField::MaglevTableSize => or_header(
            r.maglev_table_size
                .as_ref()
                .map(|m| m.span())
                .or_else(|| r.scheduler.as_ref().map(|s| s.span())),
        ),
        ServiceField::Backend { index, field } => match r.backends.get(index) {
            None => header.clone(),
            Some(b) => {
                let raw = b.get_ref();
                let inner = match field {
                    BackendField::Address => Some(raw.address.span()),
                    BackendField::Port => raw.port.as_ref().map(|p| p.span()),
                    BackendField::Weight => raw.weight.as_ref().map(|w| w.span()),
                };
                inner.unwrap_or_else(|| b.span())
            }
        },
    }
}

/// `A.B.C.D/N` or a bare address (as /32); host bits are cleared, as
/// Kubernetes does for loadBalancerSourceRanges.
fn parse_cidr(text: &str) -> Option<Ipv4Net> {
    if let Ok(net) = text.parse::<Ipv4Net>() {
        return Some(net.trunc());
    }
    text.parse::<Ipv4Addr>()
        .ok()
        .and_then(|a| Ipv4Net::new(a, 32).ok())
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
