//! What the admin API answers and `xvsadm` prints: services with their
//! backends, counters and rates, connections, timeouts. Plain data with
//! serde, shared by the daemon and the client, so the JSON of one is the
//! input of the other.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

/// Cumulative counters (IPVS's `--stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Connections scheduled.
    pub conns: u64,
    /// Packets client → backend.
    pub inpkts: u64,
    /// Packets backend → client.
    pub outpkts: u64,
    /// Bytes client → backend.
    pub inbytes: u64,
    /// Bytes backend → client.
    pub outbytes: u64,
}

/// Rates from the estimator (IPVS's `--rate`), per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rates {
    /// Connections per second.
    pub cps: u64,
    /// Packets per second in.
    pub inpps: u64,
    /// Packets per second out.
    pub outpps: u64,
    /// Bytes per second in.
    pub inbps: u64,
    /// Bytes per second out.
    pub outbps: u64,
}

/// Persistence of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistView {
    /// Seconds.
    pub timeout: u32,
    /// Client netmask.
    pub netmask: IpAddr,
}

fn masq() -> xvs_config::ForwardMethod {
    xvs_config::ForwardMethod::Masq
}

/// One backend of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendView {
    /// Address.
    pub address: IpAddr,
    /// Port.
    pub port: u16,
    /// Weight.
    pub weight: u32,
    /// Forwarding method (`masq`, `route`, `tunnel`).
    #[serde(default = "masq")]
    pub forward: xvs_config::ForwardMethod,
    /// Encapsulation of a tunnel backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<xvs_config::Encap>,
    /// `up` or `down` by its health check (none: not checked); a backend
    /// found down is shown at weight 0, the weight the data plane uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// ESTABLISHED flows, all workers.
    pub active: u64,
    /// Other flows, all workers.
    pub inactive: u64,
    /// Counters.
    pub stats: Stats,
    /// Rates.
    pub rates: Rates,
}

/// One service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Virtual address.
    pub vip: IpAddr,
    /// Port (0 = every port).
    pub port: u16,
    /// Scheduler name (ipvsadm's).
    pub scheduler: String,
    /// Scheduler flags, as the config file names them (`fallback`,
    /// `port`); `xvsadm` prints ipvsadm's names (`sh-port`, ...).
    #[serde(default)]
    pub flags: Vec<String>,
    /// Persistence, if any.
    pub persistence: Option<PersistView>,
    /// Counters (the sum of its backends').
    pub stats: Stats,
    /// Rates.
    pub rates: Rates,
    /// Backends.
    pub backends: Vec<BackendView>,
}

/// The service table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// Connection table size (the conntrack capacity).
    pub size: u32,
    /// Services.
    pub services: Vec<ServiceView>,
}

/// One connection (a conntrack flow).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnView {
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// Seconds until it expires.
    pub expires: u32,
    /// IPVS state name (`ESTABLISHED`, `SYN_RECV`, ..., `UDP`).
    pub state: String,
    /// Client.
    pub client: SocketAddr,
    /// Virtual service.
    pub vip: SocketAddr,
    /// Backend.
    pub backend: SocketAddr,
    /// The SNAT address and port towards the backend.
    pub snat: SocketAddr,
    /// Packets `[original, reply]`.
    #[serde(default)]
    pub packets: [u32; 2],
    /// A persistence template, not a connection.
    #[serde(default)]
    pub template: bool,
}

/// The three timeouts ipvsadm shows and sets (unknown fields refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutView {
    /// ESTABLISHED.
    pub tcp: u32,
    /// FIN_WAIT.
    pub tcpfin: u32,
    /// UDP.
    pub udp: u32,
}
