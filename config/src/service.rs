//! The service model shared by the control and data planes: a virtual
//! service (VIP, protocol, port), its scheduler and flags, persistence,
//! source ACL, and its backends.
//!
//! The rules that make a service valid live here, in [`Service::check`], so
//! every source (the config file, runtime edits, Kubernetes) enforces the
//! same ones; a source maps the [`ServiceField`] of each [`RuleViolation`]
//! to its own notion of a position (a file line, an option, an object).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::family::{Address, HostPort};

use ipnet::{IpNet, Ipv4Net};

use crate::names::{Encap, ForwardMethod, Protocol, Scheduler, SchedulerFlag};

/// Default Maglev lookup table size per service (as Cilium): prime.
pub const DEFAULT_MAGLEV_TABLE_SIZE: u32 = 16_381;
/// Largest accepted Maglev table size (prime). Larger tables cost memory per
/// service and gain nothing at the backend counts a gateway carries.
pub const MAX_MAGLEV_TABLE_SIZE: u32 = 131_071;
/// Largest backend weight (ipvsadm's limit).
pub const MAX_WEIGHT: u32 = 65_535;
/// Default backend weight.
pub const DEFAULT_WEIGHT: u32 = 1;
/// Default persistence timeout in seconds (ipvsadm `-p` without a value).
pub const DEFAULT_PERSISTENCE_TIMEOUT: u32 = 300;
/// Longest accepted timeout of any kind, in seconds (fits a u32 count of
/// milliseconds with room for arithmetic: 2^31 ms).
pub const MAX_TIMEOUT_SECS: u32 = 2_147_483;

/// What identifies a virtual service: IPVS's (protocol, address, port).
/// Port 0 means every port and is allowed only on a persistent service.
/// Generic over the address family (either, [`IpAddr`], by default: the
/// control plane's model; the data plane narrows each service to its own
/// family, see [`Service::narrow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey<A: Address = IpAddr> {
    /// Virtual IP.
    pub vip: A,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Virtual port (0 = all ports).
    pub port: u16,
}

impl<A: Address> ServiceKey<A> {
    /// The same key with a VIP of either family.
    pub fn wide(&self) -> ServiceKey<IpAddr> {
        ServiceKey {
            vip: self.vip.ip(),
            protocol: self.protocol,
            port: self.port,
        }
    }
}

impl ServiceKey<IpAddr> {
    /// The key in family `A`'s type, if its VIP is of that family.
    pub fn narrow<A: Address>(&self) -> Option<ServiceKey<A>> {
        Some(ServiceKey {
            vip: A::from_ip(self.vip)?,
            protocol: self.protocol,
            port: self.port,
        })
    }
}

impl<A: Address> fmt::Display for ServiceKey<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.protocol, HostPort(self.vip, self.port))
    }
}

/// Client persistence (IPVS `-p`/`-M`, Kubernetes sessionAffinity
/// ClientIP): clients whose address matches under `netmask` stick to one
/// backend for `timeout_secs` after their last connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Persistence<A: Address = IpAddr> {
    /// Seconds a client's template outlives its last connection.
    pub timeout_secs: u32,
    /// Netmask applied to the client address (contiguous).
    pub netmask: A,
}

impl<A: Address> Default for Persistence<A> {
    fn default() -> Self {
        Persistence {
            timeout_secs: DEFAULT_PERSISTENCE_TIMEOUT,
            netmask: A::ALL_ONES,
        }
    }
}

/// Flags of the hashing schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SchedulerFlags {
    /// See [`SchedulerFlag::Fallback`].
    pub fallback: bool,
    /// See [`SchedulerFlag::Port`].
    pub port: bool,
}

impl SchedulerFlags {
    /// Whether no flag is set.
    pub const fn is_empty(self) -> bool {
        !self.fallback && !self.port
    }

    /// Sets one flag; returns whether it was already set.
    pub fn set(&mut self, flag: SchedulerFlag) -> bool {
        let slot = match flag {
            SchedulerFlag::Fallback => &mut self.fallback,
            SchedulerFlag::Port => &mut self.port,
        };
        std::mem::replace(slot, true)
    }
}

/// One real server behind a virtual service (of the service's address
/// family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backend<A: Address = IpAddr> {
    /// Real server address.
    pub address: A,
    /// Real server port; 0 only on a port-0 service, where each flow keeps
    /// the port the client asked for.
    pub port: u16,
    /// Weight, 0..=65535; 0 quiesces the backend (no new flows, existing
    /// flows continue).
    pub weight: u32,
    /// Forwarding method.
    pub forward: ForwardMethod,
    /// Encapsulation (tunnel backends only; ipip otherwise).
    pub encap: Encap,
}

/// A virtual service and its backends, of one address family
/// (kube-proxy's model: a dual-stack Service is one service per family;
/// a backend of the other family is a rule violation, NAT64 is not
/// done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service<A: Address = IpAddr> {
    /// What identifies it.
    pub key: ServiceKey<A>,
    /// Optional operator-facing name.
    pub name: Option<String>,
    /// Scheduling algorithm.
    pub scheduler: Scheduler,
    /// Flags of the hashing schedulers.
    pub flags: SchedulerFlags,
    /// Client persistence, if any.
    pub persistence: Option<Persistence<A>>,
    /// Clients allowed to use the service; empty = everyone.
    pub source_ranges: Vec<A::Net>,
    /// Maglev table size if set explicitly (mh only); see
    /// [`Service::maglev_table_size`].
    pub maglev_table_size: Option<u32>,
    /// Real servers.
    pub backends: Vec<Backend<A>>,
}

impl<A: Address> Service<A> {
    /// A service with the defaults (wlc, no persistence, no backends).
    pub fn new(key: ServiceKey<A>) -> Self {
        Service {
            key,
            name: None,
            scheduler: Scheduler::DEFAULT,
            flags: SchedulerFlags::default(),
            persistence: None,
            source_ranges: Vec::new(),
            maglev_table_size: None,
            backends: Vec::new(),
        }
    }

    /// The Maglev table size this service uses (the default unless set).
    pub fn maglev_table_size(&self) -> u32 {
        self.maglev_table_size.unwrap_or(DEFAULT_MAGLEV_TABLE_SIZE)
    }
}

impl<A: Address> Service<A> {
    /// The same service with addresses of either family.
    pub fn wide(&self) -> Service<IpAddr> {
        Service {
            key: self.key.wide(),
            name: self.name.clone(),
            scheduler: self.scheduler,
            flags: self.flags,
            persistence: self.persistence.map(|p| Persistence {
                timeout_secs: p.timeout_secs,
                netmask: p.netmask.ip(),
            }),
            source_ranges: self.source_ranges.iter().map(|n| A::net_wide(*n)).collect(),
            maglev_table_size: self.maglev_table_size,
            backends: self
                .backends
                .iter()
                .map(|b| Backend {
                    address: b.address.ip(),
                    port: b.port,
                    weight: b.weight,
                    forward: b.forward,
                    encap: b.encap,
                })
                .collect(),
        }
    }
}

impl From<Service<Ipv4Addr>> for Service<IpAddr> {
    fn from(s: Service<Ipv4Addr>) -> Self {
        s.wide()
    }
}

impl From<Service<Ipv6Addr>> for Service<IpAddr> {
    fn from(s: Service<Ipv6Addr>) -> Self {
        s.wide()
    }
}

impl Service<IpAddr> {
    /// The service in its own family's types, if every address in it is
    /// of family `A` (what [`Service::check`] makes sure of).
    pub fn narrow<A: Address>(&self) -> Option<Service<A>> {
        let a = |ip: IpAddr| A::from_ip(ip);
        Some(Service {
            key: self.key.narrow()?,
            name: self.name.clone(),
            scheduler: self.scheduler,
            flags: self.flags,
            persistence: match self.persistence {
                Some(p) => Some(Persistence {
                    timeout_secs: p.timeout_secs,
                    netmask: a(p.netmask)?,
                }),
                None => None,
            },
            source_ranges: self
                .source_ranges
                .iter()
                .map(|n| A::net_from(*n))
                .collect::<Option<_>>()?,
            maglev_table_size: self.maglev_table_size,
            backends: self
                .backends
                .iter()
                .map(|b| {
                    Some(Backend {
                        address: a(b.address)?,
                        port: b.port,
                        weight: b.weight,
                        forward: b.forward,
                        encap: b.encap,
                    })
                })
                .collect::<Option<_>>()?,
        })
    }
}

/// The rules (unicast addresses of the VIP's family, contiguous
/// netmasks), for either family.
impl<A: Address> Service<A> {
    /// Checks every rule of a valid service; returns each violation found,
    /// in field order (empty = valid). The one set of rules for every
    /// source (file, API, xvsadm, Kubernetes); [`Service::check_in`] adds
    /// the ones that depend on the gateway.
    pub fn check(&self) -> Vec<RuleViolation> {
        let mut out = Vec::new();
        let mut violation = |field, message: String| out.push(RuleViolation { field, message });

        if !is_unicast_any(self.key.vip) {
            violation(ServiceField::Vip, not_unicast_any(self.key.vip));
        }
        if self.key.port == 0 && self.persistence.is_none() {
            violation(
                ServiceField::Port,
                "port 0 (all ports) is allowed only on a persistent service".into(),
            );
        }
        if !self.flags.is_empty() && !self.scheduler.takes_hash_flags() {
            violation(
                ServiceField::Flags,
                format!(
                    "scheduler {} takes no flags (fallback and port apply to dh, sh and mh)",
                    self.scheduler
                ),
            );
        }
        if let Some(p) = &self.persistence {
            if !(1..=MAX_TIMEOUT_SECS).contains(&p.timeout_secs) {
                violation(
                    ServiceField::PersistenceTimeout,
                    format!(
                        "{} is out of range (expected 1..={MAX_TIMEOUT_SECS} seconds)",
                        p.timeout_secs
                    ),
                );
            }
            if p.netmask.family() != self.key.vip.family() {
                violation(
                    ServiceField::PersistenceNetmask,
                    format!(
                        "{} is not of the VIP's family (IPv6 services take a prefix length, e.g. 64)",
                        p.netmask
                    ),
                );
            } else if !is_contiguous(p.netmask) {
                violation(
                    ServiceField::PersistenceNetmask,
                    format!(
                        "{} is not a contiguous netmask (e.g. 255.255.255.0)",
                        p.netmask
                    ),
                );
            }
        }
        self.check_maglev(&mut violation);
        for (i, n) in self.source_ranges.iter().enumerate() {
            let net = A::net_wide(*n);
            if net.addr().family() != self.key.vip.family() {
                violation(
                    ServiceField::SourceRange(i),
                    format!("{net} is not of the VIP's family ({})", self.key.vip),
                );
            }
        }
        self.check_backends(&mut violation);
        out
    }

    fn check_maglev(&self, violation: &mut impl FnMut(ServiceField, String)) {
        if self.maglev_table_size.is_some() && self.scheduler != Scheduler::Mh {
            violation(
                ServiceField::MaglevTableSize,
                format!(
                    "only the mh scheduler uses a Maglev table (scheduler is {})",
                    self.scheduler
                ),
            );
            return;
        }
        if self.scheduler != Scheduler::Mh {
            return;
        }
        let m = self.maglev_table_size();
        if !(2..=MAX_MAGLEV_TABLE_SIZE).contains(&m) {
            violation(
                ServiceField::MaglevTableSize,
                format!("{m} is out of range (expected a prime up to {MAX_MAGLEV_TABLE_SIZE})"),
            );
        } else if !is_prime(m) {
            violation(
                ServiceField::MaglevTableSize,
                format!(
                    "{m} is not prime (nearest primes: {} and {})",
                    prev_prime(m),
                    next_prime(m)
                ),
            );
        } else if self.backends.len() as u64 >= u64::from(m) {
            violation(
                ServiceField::MaglevTableSize,
                format!(
                    "{m} must be larger than the number of backends ({})",
                    self.backends.len()
                ),
            );
        }
    }

    /// [`Service::check`], and the rules that depend on where the service
    /// is served: its VIP and backends must not be the gateway's SNAT
    /// addresses nor the host's own addresses.
    pub fn check_in(&self, gateway: &Gateway<'_, A>) -> Vec<RuleViolation> {
        let mut out = self.check();
        let vip = self.key.vip;
        // An address check() refuses already is not reported twice.
        let unicast = is_unicast_any(vip);
        // (No SNAT address at all is the snat section's own error.)
        let snat_of_family = gateway.snat.iter().any(|a| a.family() == vip.family());
        if unicast && !gateway.snat.is_empty() && !snat_of_family {
            out.push(RuleViolation {
                field: ServiceField::Vip,
                message: format!(
                    "{vip} needs a SNAT address of its family in snat.addresses (full NAT sources its backends' flows from one)"
                ),
            });
        } else if unicast && gateway.snat.contains(&vip) {
            out.push(RuleViolation {
                field: ServiceField::Vip,
                message: format!("{vip} is a SNAT address of this gateway (a VIP must not be one)"),
            });
        } else if unicast && gateway.host.contains(&vip) {
            out.push(RuleViolation {
                field: ServiceField::Vip,
                message: format!(
                    "{vip} is an address of this host: its own traffic to it would go to xvs (give the service an address of its own)"
                ),
            });
        }
        for (index, b) in self.backends.iter().enumerate() {
            let field = ServiceField::Backend {
                index,
                field: BackendField::Address,
            };
            let a = b.address;
            let message = if !is_unicast_any(a) || a.family() != vip.family() {
                continue;
            } else if gateway.snat.contains(&a) {
                format!("{a} is a SNAT address of this gateway (a backend must be another host)")
            } else if gateway.host.contains(&a) {
                format!("{a} is an address of this host (a backend must be another host)")
            } else if b.forward == ForwardMethod::Route
                && !gateway.connected.is_empty()
                && !gateway.connected.iter().any(|n| n.contains(&a.ip()))
            {
                let nets: Vec<String> = gateway.connected.iter().map(|n| n.to_string()).collect();
                format!(
                    "{a} is not on a directly connected segment of this gateway ({}): direct routing rewrites only the Ethernet destination, so the backend must share a link with the gateway (use tunnel for a routed backend)",
                    nets.join(", ")
                )
            } else {
                continue;
            };
            out.push(RuleViolation { field, message });
        }
        out.sort_by_key(|v| v.field.order());
        out
    }

    fn check_backends(&self, violation: &mut impl FnMut(ServiceField, String)) {
        let mut seen: HashMap<(A, u16), usize> = HashMap::new();
        for (index, b) in self.backends.iter().enumerate() {
            let at = |field| ServiceField::Backend { index, field };
            if b.weight > MAX_WEIGHT {
                violation(
                    at(BackendField::Weight),
                    format!("{} is out of range (expected 0..={MAX_WEIGHT})", b.weight),
                );
            }
            if b.address.family() != self.key.vip.family() {
                violation(
                    at(BackendField::Address),
                    format!(
                        "{} is not of the VIP's family ({}): a service's backends are of its VIP's family (NAT64 is not done; a dual-stack service is one service per family)",
                        b.address, self.key.vip
                    ),
                );
            } else if !is_unicast_any(b.address) {
                violation(at(BackendField::Address), not_unicast_any(b.address));
            } else if b.address == self.key.vip {
                violation(
                    at(BackendField::Address),
                    format!(
                        "{} is the service's VIP (a backend must be another address)",
                        b.address
                    ),
                );
            }
            if self.key.port == 0 && b.port != 0 {
                violation(
                    at(BackendField::Port),
                    "must be omitted on a port-0 service (each flow keeps the port the client asked for)"
                        .into(),
                );
            } else if self.key.port != 0 && b.port == 0 {
                violation(
                    at(BackendField::Port),
                    "port 0 is allowed only on a port-0 service".into(),
                );
            } else if b.forward.bypasses_replies() && b.port != self.key.port {
                violation(
                    at(BackendField::Port),
                    format!(
                        "{} cannot translate ports (the packet reaches the backend as the client sent it): omit port or give the service's port {}",
                        b.forward, self.key.port
                    ),
                );
            }
            if let Some(first) = seen.insert((b.address, b.port), index) {
                seen.insert((b.address, b.port), first);
                violation(
                    at(BackendField::Address),
                    format!(
                        "duplicate backend {} (first in backends[{first}])",
                        HostPort(b.address, b.port)
                    ),
                );
            }
        }
    }
}

/// A field of a service, for locating a rule violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceField {
    /// `vip`.
    Vip,
    /// `port`.
    Port,
    /// `scheduler`.
    Scheduler,
    /// `flags`.
    Flags,
    /// `persistence.timeout`.
    PersistenceTimeout,
    /// `persistence.netmask`.
    PersistenceNetmask,
    /// `maglev_table_size`.
    MaglevTableSize,
    /// One of `source_ranges`.
    SourceRange(usize),
    /// A field of one backend.
    Backend {
        /// Index in `backends`.
        index: usize,
        /// The field.
        field: BackendField,
    },
}

/// A field of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendField {
    /// `address`.
    Address,
    /// `port`.
    Port,
    /// `weight`.
    Weight,
}

impl ServiceField {
    /// Position in field order (VIP, port, ..., backends by index).
    fn order(&self) -> (usize, usize, usize) {
        match *self {
            ServiceField::Vip => (0, 0, 0),
            ServiceField::Port => (1, 0, 0),
            ServiceField::Scheduler => (2, 0, 0),
            ServiceField::Flags => (3, 0, 0),
            ServiceField::PersistenceTimeout => (4, 0, 0),
            ServiceField::PersistenceNetmask => (5, 0, 0),
            ServiceField::MaglevTableSize => (6, 0, 0),
            ServiceField::SourceRange(i) => (7, i, 0),
            ServiceField::Backend { index, field } => (8, index, field as usize),
        }
    }
}

impl fmt::Display for ServiceField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceField::Vip => f.write_str("vip"),
            ServiceField::Port => f.write_str("port"),
            ServiceField::Scheduler => f.write_str("scheduler"),
            ServiceField::Flags => f.write_str("flags"),
            ServiceField::PersistenceTimeout => f.write_str("persistence.timeout"),
            ServiceField::PersistenceNetmask => f.write_str("persistence.netmask"),
            ServiceField::MaglevTableSize => f.write_str("maglev_table_size"),
            ServiceField::SourceRange(i) => write!(f, "source_ranges[{i}]"),
            ServiceField::Backend { index, field } => {
                let name = match field {
                    BackendField::Address => "address",
                    BackendField::Port => "port",
                    BackendField::Weight => "weight",
                };
                write!(f, "backends[{index}].{name}")
            }
        }
    }
}

/// One broken rule of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleViolation {
    /// The field at fault.
    pub field: ServiceField,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for RuleViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Whether `mask` (of either family) is a run of ones followed by zeros.
pub fn is_contiguous<A: Address>(mask: A) -> bool {
    let octets = mask.octets();
    let bytes = octets.as_ref();
    // The mask's bits from the top of a u128.
    let m = bytes.iter().fold(0u128, |a, &b| a << 8 | u128::from(b)) << (128 - 8 * bytes.len());
    m.leading_ones() == m.count_ones()
}

/// The netmask that keeps every bit of an address of `vip`'s family (the
/// default persistence granularity: one client address).
pub fn full_mask(vip: IpAddr) -> IpAddr {
    match vip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::BROADCAST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(u128::MAX)),
    }
}

/// A persistence netmask as every source writes it, for a service on
/// `vip`: an address of the VIP's family (`255.255.255.0`), or a prefix
/// length (`24`; what ipvsadm's `-M` takes for an IPv6 service).
pub fn parse_netmask(text: &str, vip: IpAddr) -> Result<IpAddr, String> {
    let text = text.trim().trim_start_matches('/');
    if let Ok(len) = text.parse::<u8>() {
        return match vip {
            IpAddr::V4(_) if len <= 32 => Ok(IpAddr::V4(Ipv4Addr::from(
                u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0),
            ))),
            IpAddr::V6(_) if len <= 128 => Ok(IpAddr::V6(prefix_mask6(len))),
            _ => Err(format!("prefix length {len} is out of range for {vip}")),
        };
    }
    match text.parse::<IpAddr>() {
        Ok(m) if m.family() == vip.family() => Ok(m),
        Ok(m) => Err(format!("{m} is not of the VIP's family ({vip})")),
        Err(_) => Err(format!(
            "\"{text}\" is not a netmask (e.g. \"255.255.255.0\", or a prefix length such as 64)"
        )),
    }
}

/// The prefix length of a contiguous mask (as ipvsadm prints an IPv6
/// service's `mask`).
pub fn prefix_len<A: Address>(mask: A) -> u32 {
    mask.octets().as_ref().iter().map(|b| b.count_ones()).sum()
}

/// The IPv6 mask of a prefix length (ipvsadm's `-M` for an IPv6 service).
pub fn prefix_mask6(len: u8) -> Ipv6Addr {
    Ipv6Addr::from(
        u128::MAX
            .checked_shl(128 - u32::from(len.min(128)))
            .unwrap_or(0),
    )
}

/// Whether an IPv6 address can be a VIP, SNAT address or backend: not
/// unspecified, loopback, multicast, link-local (it has a scope) or an
/// IPv4-mapped address.
pub fn is_unicast6(addr: Ipv6Addr) -> bool {
    !(addr.is_unspecified()
        || addr.is_loopback()
        || addr.is_multicast()
        || addr.is_unicast_link_local()
        || addr.to_ipv4_mapped().is_some())
}

/// [`is_unicast`] or [`is_unicast6`], by the address's family.
pub fn is_unicast_any<A: Address>(addr: A) -> bool {
    match addr.ip() {
        IpAddr::V4(a) => is_unicast(a),
        IpAddr::V6(a) => is_unicast6(a),
    }
}

/// The message for an address [`is_unicast_any`] refuses.
pub fn not_unicast_any<A: Address>(addr: A) -> String {
    match addr.ip() {
        IpAddr::V4(a) => not_unicast(a),
        IpAddr::V6(a) => format!(
            "{a} is not a unicast address (not ::, loopback, multicast, link-local fe80::/10 or IPv4-mapped)"
        ),
    }
}

/// Whether `addr` can be a VIP, SNAT address or backend: not unspecified,
/// broadcast, multicast, loopback or in 0.0.0.0/8.
pub fn is_unicast(addr: Ipv4Addr) -> bool {
    !(addr.is_unspecified()
        || addr.is_broadcast()
        || addr.is_multicast()
        || addr.is_loopback()
        || addr.octets()[0] == 0
        || addr.octets()[0] >= 240)
}

/// A source range as every source writes it: `A.B.C.D/N`, or a bare
/// address (as /32); host bits are cleared, as Kubernetes does for
/// loadBalancerSourceRanges. The error is the message every source gives.
pub fn parse_source_range(text: &str) -> Result<IpNet, String> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    text.parse::<IpAddr>().ok().map(IpNet::from).ok_or_else(|| {
        format!("\"{text}\" is not a CIDR (e.g. \"198.18.0.0/24\" or \"2001:2::/64\")")
    })
}

/// An IPv4 source range ([`parse_source_range`] of that family).
pub fn parse_source_range4(text: &str) -> Result<Ipv4Net, String> {
    match parse_source_range(text)? {
        IpNet::V4(n) => Ok(n),
        IpNet::V6(_) => Err(format!(
            "\"{text}\" is not an IPv4 CIDR (e.g. \"198.18.0.0/24\")"
        )),
    }
}

/// The message for an address [`is_unicast`] refuses (every source says
/// it the same way).
pub fn not_unicast(addr: Ipv4Addr) -> String {
    format!("{addr} is not a unicast address (not 0.0.0.0/8, loopback, multicast, 240.0.0.0/4 or broadcast)")
}

/// Where services are served: what a service must not collide with
/// ([`Service::check_in`]). The caller reads the host's addresses (this
/// crate does no I/O).
#[derive(Debug, Clone, Copy)]
pub struct Gateway<'a, A: Address = IpAddr> {
    /// The SNAT addresses.
    pub snat: &'a [A],
    /// The host's own addresses.
    pub host: &'a [A],
    /// The prefixes of the host's links (where a direct-routing backend
    /// must be; empty: unknown, not checked).
    pub connected: &'a [IpNet],
}

/// Deterministic primality by trial division (inputs are table sizes,
/// ≤ a few million: at most ~1,000 divisions).
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n < 4 {
        return true;
    }
    if n.is_multiple_of(2) {
        return false;
    }
    let n = u64::from(n);
    let mut d = 3u64;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

fn next_prime(n: u32) -> u32 {
    (n.saturating_add(1)..=u32::MAX)
        .find(|&k| is_prime(k))
        .unwrap_or(n)
}

fn prev_prime(n: u32) -> u32 {
    (2..n).rev().find(|&k| is_prime(k)).unwrap_or(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> ServiceKey {
        ServiceKey {
            vip: Ipv4Addr::new(198, 19, 0, 1).into(),
            protocol: Protocol::Tcp,
            port,
        }
    }

    fn backend(last: u8, weight: u32) -> Backend {
        Backend {
            address: Ipv4Addr::new(198, 18, 1, last).into(),
            port: 8080,
            weight,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        }
    }

    fn v6_vip() -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 2, 0xff, 0, 0, 0, 0, 1)
    }

    #[test]
    fn primes() {
        assert!(is_prime(16_381));
        assert!(is_prime(65_537));
        assert!(is_prime(131_071));
        assert!(is_prime(655_373));
        assert!(!is_prime(65_536));
        assert!(!is_prime(1));
        assert_eq!(next_prime(16_382), 16_411);
        assert_eq!(prev_prime(16_382), 16_381);
    }

    #[test]
    fn netmasks() {
        assert!(is_contiguous(Ipv4Addr::new(255, 255, 255, 0)));
        assert!(is_contiguous(Ipv4Addr::new(0, 0, 0, 0)));
        assert!(is_contiguous(Ipv4Addr::BROADCAST));
        assert!(!is_contiguous(Ipv4Addr::new(255, 0, 255, 0)));
        assert!(!is_contiguous(Ipv4Addr::new(0, 0, 0, 1)));
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert!(is_contiguous(v6("ffff:ffff:ffff:ffff::")));
        assert!(is_contiguous(v6("::")));
        assert!(is_contiguous(Ipv6Addr::from(u128::MAX)));
        assert!(!is_contiguous(v6("ffff::ffff")));
        assert!(!is_contiguous(v6("::1")));
        assert!(is_contiguous(IpAddr::V4(Ipv4Addr::new(255, 255, 128, 0))));
        assert!(!is_contiguous(IpAddr::V6(v6("ff00:ff00::"))));
    }

    #[test]
    fn a_key_narrows_to_its_own_family_only() {
        let k4 = key(80);
        assert_eq!(k4.narrow::<Ipv4Addr>().map(|k| k.wide()), Some(k4));
        assert_eq!(k4.narrow::<Ipv6Addr>(), None);
        let k6 = ServiceKey {
            vip: IpAddr::V6(v6_vip()),
            ..k4
        };
        assert_eq!(k6.narrow::<Ipv6Addr>().map(|k| k.vip), Some(v6_vip()));
        assert_eq!(k6.narrow::<Ipv4Addr>(), None);
    }

    #[test]
    fn valid_service_has_no_violation() {
        let mut s = Service::new(key(80));
        s.backends = vec![backend(1, 1), backend(2, 0), backend(3, 65_535)];
        assert_eq!(s.check(), vec![]);
        s.scheduler = Scheduler::Mh;
        s.flags.fallback = true;
        assert_eq!(s.check(), vec![]);
    }

    #[test]
    fn every_violation_names_its_field() {
        let mut s = Service::new(key(0));
        s.flags.port = true;
        s.maglev_table_size = Some(16_381);
        s.backends = vec![backend(1, 70_000), backend(1, 1)];
        let got: Vec<String> = s.check().iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            vec![
                "port: port 0 (all ports) is allowed only on a persistent service",
                "flags: scheduler wlc takes no flags (fallback and port apply to dh, sh and mh)",
                "maglev_table_size: only the mh scheduler uses a Maglev table (scheduler is wlc)",
                "backends[0].weight: 70000 is out of range (expected 0..=65535)",
                "backends[0].port: must be omitted on a port-0 service (each flow keeps the port the client asked for)",
                "backends[1].port: must be omitted on a port-0 service (each flow keeps the port the client asked for)",
                "backends[1].address: duplicate backend 198.18.1.1:8080 (first in backends[0])",
            ]
        );
    }

    #[test]
    fn a_service_model_exists_for_either_family() {
        use std::net::Ipv6Addr;
        let vip: Ipv6Addr = "2001:2::1".parse().unwrap();
        let mut s = Service::new(ServiceKey {
            vip,
            protocol: Protocol::Tcp,
            port: 443,
        });
        s.persistence = Some(Persistence::default());
        s.source_ranges = vec!["2001:2::/48".parse().unwrap()];
        s.backends.push(Backend {
            address: "2001:2::10".parse().unwrap(),
            port: 8443,
            weight: 1,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        });
        assert_eq!(
            s.persistence.unwrap().netmask,
            Ipv6Addr::from_bits(u128::MAX)
        );
        assert_eq!(s.key.to_string(), "tcp [2001:2::1]:443");
        assert_eq!(s.maglev_table_size(), DEFAULT_MAGLEV_TABLE_SIZE);
    }
}
