//! The validated configuration of one xvs instance: interfaces and workers,
//! SNAT, conntrack sizing and timeouts, the admin API, the Kubernetes source,
//! and the static services.
//!
//! Invariant: a [`Config`] is only ever built by validation
//! ([`crate::parse_str`]) or from [`Default`] parts, so a worker count, a
//! port slice or a timeout read from it is already known to be consistent
//! (as many cores as queues, slices disjoint and inside the range, timeouts
//! in range).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use crate::names::{ArmMode, PollMode, Steering, UnknownPort, XdpAttachMode, ZeroCopy};
use crate::service::Service;

/// Default path of the config file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/xvs/xvs.toml";
/// Default path of the admin API's unix socket.
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/xvs/xvs.sock";
/// Default directory of the state that outlives a process (flow tables,
/// the per-interface locks).
pub const DEFAULT_STATE_DIR: &str = "/run/xvs";
/// Default hold window (milliseconds): how long VIP packets are held
/// (dropped, so TCP retransmits) while no worker serves.
pub const DEFAULT_HOLD_MS: u32 = 5_000;
/// Longest hold window accepted (milliseconds).
pub const MAX_HOLD_MS: u32 = 300_000;
/// Default `service.kubernetes.io/service-proxy-name` label value.
pub const DEFAULT_SERVICE_PROXY_NAME: &str = "xvs";
/// Default conntrack capacity (flows, all workers together).
pub const DEFAULT_CONNTRACK_CAPACITY: u32 = 1 << 20;
/// Largest conntrack capacity accepted (flows, all workers together).
pub const MAX_CONNTRACK_CAPACITY: u32 = 1 << 28;
/// Default SNAT port range (the ephemeral range most kernels leave free is
/// different; this one avoids well-known ports).
pub const DEFAULT_SNAT_PORTS: PortRange = PortRange {
    first: 1024,
    last: 65_535,
};

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Interfaces, queues and workers.
    pub interfaces: Interfaces,
    /// Source NAT towards backends.
    pub snat: Snat,
    /// Connection tracking.
    pub conntrack: Conntrack,
    /// Policy for VIP traffic no service takes.
    pub vips: Vips,
    /// Admin API.
    pub admin: Admin,
    /// Kubernetes source.
    pub kubernetes: Kubernetes,
    /// What outlives the process: the hold window and the flow state.
    pub restart: Restart,
    /// How tunnel backends' packets are encapsulated.
    pub tunnel: Tunnel,
    /// What gateways of one cluster share.
    pub cluster: Cluster,
    /// Services from the file.
    pub services: Vec<Service>,
    /// Health checks of the file's backends (those with a `check`).
    pub checks: Vec<crate::health::BackendCheck>,
}

impl Config {
    /// Number of data-plane workers (one per queue).
    pub fn workers(&self) -> usize {
        self.interfaces.queues.len()
    }
}

/// Interfaces the data plane binds, and its workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interfaces {
    /// One-arm or two-arm.
    pub mode: ArmMode,
    /// Client-facing interface (in one-arm mode, also backend-facing).
    pub client: String,
    /// Backend-facing interface (two-arm mode only).
    pub backend: Option<String>,
    /// RX queues, one worker each.
    pub queues: Vec<u32>,
    /// CPU core of each worker (`cores[i]` runs the worker of `queues[i]`).
    pub cores: Vec<usize>,
    /// How workers wait for packets.
    pub poll: PollMode,
    /// Which packets the XDP program hands to xvs.
    pub steering: Steering,
    /// How the XDP program is attached.
    pub xdp_mode: XdpAttachMode,
    /// Zero-copy policy of the AF_XDP sockets.
    pub zero_copy: ZeroCopy,
}

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port.
    pub first: u16,
    /// Last port (inclusive).
    pub last: u16,
}

impl PortRange {
    /// Number of ports in the range.
    pub const fn size(self) -> u32 {
        self.last as u32 - self.first as u32 + 1
    }

    /// Whether two ranges share a port.
    pub const fn overlaps(self, other: PortRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    /// Whether `other` lies inside `self`.
    pub const fn contains_range(self, other: PortRange) -> bool {
        self.first <= other.first && other.last <= self.last
    }

    /// Splits the range into `n` disjoint, contiguous slices of nearly
    /// equal size (the first `len % n` get one port more). `n` must be at
    /// least 1 and at most `len`.
    pub fn split(self, n: usize) -> Vec<SnatPortSlice> {
        let n = n.max(1) as u32;
        let (base, extra) = (self.size() / n, self.size() % n);
        let mut next = u32::from(self.first);
        (0..n)
            .map(|i| {
                let size = base + u32::from(i < extra);
                let slice = SnatPortSlice {
                    first: next as u16,
                    last: (next + size - 1) as u16,
                };
                next += size;
                slice
            })
            .collect()
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// The SNAT ports one worker allocates from: disjoint from every other
/// worker's, so the owner of a reply is computable from its port.
pub type SnatPortSlice = PortRange;

impl Snat {
    /// Every SNAT address, IPv4 first.
    pub fn all_addresses(&self) -> Vec<IpAddr> {
        let v4 = self.addresses.iter().map(|a| IpAddr::V4(*a));
        v4.chain(self.addresses6.iter().map(|a| IpAddr::V6(*a)))
            .collect()
    }
}

/// Source NAT towards backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snat {
    /// IPv4 addresses the gateway uses as source towards backends.
    pub addresses: Vec<Ipv4Addr>,
    /// IPv6 addresses the gateway uses as source towards IPv6 backends
    /// (the same `addresses` list in the file: split by family).
    pub addresses6: Vec<Ipv6Addr>,
    /// The whole port range.
    pub ports: PortRange,
    /// Each worker's slice, in queue order (disjoint, inside `ports`).
    pub worker_ports: Vec<SnatPortSlice>,
}

/// Connection tracking sizing, timeouts and reuse rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conntrack {
    /// Flows, all workers together (each worker gets an equal share).
    pub capacity: u32,
    /// Per-state timeouts.
    pub timeouts: Timeouts,
    /// What happens to flows whose client port is reused or whose backend
    /// changed.
    pub rules: ConnRules,
}

impl Default for Conntrack {
    fn default() -> Self {
        Conntrack {
            capacity: DEFAULT_CONNTRACK_CAPACITY,
            timeouts: Timeouts::default(),
            rules: ConnRules::default(),
        }
    }
}

/// IPVS's connection sysctls (`net.ipv4.vs.*`), with the values kube-proxy
/// sets in IPVS mode as defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnRules {
    /// `conn_reuse_mode`: a SYN that hits a flow in TIME_WAIT or CLOSE
    /// (a client reusing its port) ends that flow and is scheduled as a
    /// new connection. Off: it goes to the old flow's backend.
    pub conn_reuse_mode: bool,
    /// `expire_nodest_conn`: a flow whose backend (or service) was removed
    /// ends at its next packet (a TCP segment other than a SYN is
    /// answered with a RST, as the kernel does for IPVS; a SYN or a UDP
    /// datagram is scheduled afresh), and a SYN on a flow to a quiesced
    /// (weight 0) backend is scheduled afresh. Off: such flows go on to
    /// their backend until they close or expire.
    pub expire_nodest_conn: bool,
    /// `expire_quiescent_template`: a persistence template pointing at a
    /// quiesced backend ends, so the client is scheduled afresh. Off: the
    /// client keeps its quiesced backend while the template lives.
    pub expire_quiescent_template: bool,
}

impl Default for ConnRules {
    fn default() -> Self {
        ConnRules {
            conn_reuse_mode: true,
            expire_nodest_conn: true,
            expire_quiescent_template: true,
        }
    }
}

/// Seed of the Maglev tables when `[cluster] hash_seed` is not set.
pub const DEFAULT_HASH_SEED: u64 = 0x7876_735f_6d61_676c; // "xvs_magl"

/// What the gateways of one cluster must share to agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Seed of every service's Maglev table and of its client hash
    /// (Cilium's `maglev.hashSeed`): gateways behind one ECMP group with
    /// the same services and the same seed choose the same backend for
    /// every flow. sh and dh hash as IPVS does, without a seed.
    pub hash_seed: u64,
    /// Flow synchronisation with the other gateways (none: off).
    pub sync: Option<Sync>,
}

impl Default for Cluster {
    fn default() -> Cluster {
        Cluster {
            hash_seed: DEFAULT_HASH_SEED,
            sync: None,
        }
    }
}

/// IPVS's default sync port.
pub const DEFAULT_SYNC_PORT: u16 = 8848;

/// Flow synchronisation (`[cluster.sync]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sync {
    /// This gateway's node id (unique in the cluster, 1..).
    pub node: u32,
    /// The cluster's sync id (ipvsadm's `--syncid`): datagrams with
    /// another are dropped.
    pub id: u8,
    /// Where sync datagrams are received (and sent from).
    pub listen: std::net::SocketAddr,
    /// Where they are sent: the peers, or one multicast group (joined on
    /// the interface of `listen`'s address).
    pub peers: Vec<std::net::SocketAddr>,
    /// The shared key (HMAC-SHA256 of every datagram); none: datagrams
    /// are not authenticated.
    pub key_file: Option<PathBuf>,
    /// Active or backup.
    pub role: crate::names::SyncRole,
    /// Built-in liveness check: a peer silent this long (milliseconds)
    /// is taken over; none: only on request.
    pub peer_timeout_ms: Option<u32>,
}

/// The shortest `peer_timeout` accepted, in milliseconds: five of a
/// gateway's hellos (the sync daemon's `HELLO_MS` is held to a fifth of
/// it), so that a live peer whose datagrams are late by a few hundred
/// milliseconds is never taken for a silent one.
pub const MIN_PEER_TIMEOUT_MS: u64 = 500;
/// The longest `peer_timeout` accepted, in milliseconds.
pub const MAX_PEER_TIMEOUT_MS: u64 = 600_000;

impl Sync {
    /// Whether the peers are one multicast group.
    pub fn multicast(&self) -> bool {
        matches!(self.peers.as_slice(), [one] if one.ip().is_multicast())
    }
}

/// GUE's conventional port (Katran's and the Linux examples').
pub const DEFAULT_GUE_PORT: u16 = 6080;

/// Encapsulation settings for tunnel backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunnel {
    /// Outer source of IPv4 tunnels (none: the first IPv4 SNAT address).
    pub source: Option<Ipv4Addr>,
    /// Outer source of IPv6 tunnels (none: the first IPv6 SNAT address).
    pub source6: Option<std::net::Ipv6Addr>,
    /// Katran's trick: the outer IPv4 source is this network's prefix with
    /// the client address's low bits, so a backend's RSS spreads tunnelled
    /// flows over its queues by client (none: `source` for every flow).
    /// Backends must accept these sources and never answer them.
    pub client_source_net: Option<ipnet::Ipv4Net>,
    /// UDP destination port of GUE encapsulation.
    pub gue_port: u16,
}

impl Default for Tunnel {
    fn default() -> Tunnel {
        Tunnel {
            source: None,
            source6: None,
            client_source_net: None,
            gue_port: DEFAULT_GUE_PORT,
        }
    }
}

/// Policy for traffic to a VIP that no service takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Vips {
    /// A packet to a VIP on a port without a service.
    pub unknown_port: UnknownPort,
}

/// Per-state timeouts in seconds; defaults are IPVS's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP ESTABLISHED.
    pub established: u32,
    /// TCP SYN_SENT.
    pub syn_sent: u32,
    /// TCP SYN_RECV.
    pub syn_recv: u32,
    /// TCP FIN_WAIT.
    pub fin_wait: u32,
    /// TCP TIME_WAIT.
    pub time_wait: u32,
    /// TCP CLOSE.
    pub close: u32,
    /// TCP CLOSE_WAIT.
    pub close_wait: u32,
    /// TCP LAST_ACK.
    pub last_ack: u32,
    /// TCP SYNACK.
    pub synack: u32,
    /// UDP.
    pub udp: u32,
    /// ICMP.
    pub icmp: u32,
    /// TCP SYN_RECV for a flow created while its worker is under pressure
    /// (it reclaimed a SNAT port or evicted a flow in the last seconds: a
    /// SYN flood): flows the handshake never completes leave sooner.
    pub syn_recv_pressure: u32,
}

impl Timeouts {
    /// Every timeout with its name (the `[conntrack.timeouts]` key), in
    /// declaration order.
    pub fn named(&self) -> [(&'static str, u32); 12] {
        [
            ("established", self.established),
            ("syn_sent", self.syn_sent),
            ("syn_recv", self.syn_recv),
            ("fin_wait", self.fin_wait),
            ("time_wait", self.time_wait),
            ("close", self.close),
            ("close_wait", self.close_wait),
            ("last_ack", self.last_ack),
            ("synack", self.synack),
            ("udp", self.udp),
            ("icmp", self.icmp),
            ("syn_recv_pressure", self.syn_recv_pressure),
        ]
    }

    /// The timeout named `name`, to write.
    pub fn by_name(&mut self, name: &str) -> Option<&mut u32> {
        Some(match name {
            "established" => &mut self.established,
            "syn_sent" => &mut self.syn_sent,
            "syn_recv" => &mut self.syn_recv,
            "fin_wait" => &mut self.fin_wait,
            "time_wait" => &mut self.time_wait,
            "close" => &mut self.close,
            "close_wait" => &mut self.close_wait,
            "last_ack" => &mut self.last_ack,
            "synack" => &mut self.synack,
            "udp" => &mut self.udp,
            "icmp" => &mut self.icmp,
            "syn_recv_pressure" => &mut self.syn_recv_pressure,
            _ => return None,
        })
    }

    /// Sets the timeout named `name` to `secs`, checked as the file's
    /// `[conntrack.timeouts]` are; the message says what is wrong.
    pub fn set(&mut self, name: &str, secs: u64) -> Result<(), String> {
        let names: Vec<&str> = self.named().iter().map(|(n, _)| *n).collect();
        let Some(slot) = self.by_name(name) else {
            return Err(format!(
                "unknown timeout \"{name}\" (expected one of {})",
                names.join(", ")
            ));
        };
        if !(1..=u64::from(crate::MAX_TIMEOUT_SECS)).contains(&secs) {
            return Err(format!(
                "{name}: {secs} is out of range (expected 1..={} seconds)",
                crate::MAX_TIMEOUT_SECS
            ));
        }
        *slot = secs as u32;
        Ok(())
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            established: 900,
            syn_sent: 120,
            syn_recv: 60,
            fin_wait: 120,
            time_wait: 120,
            close: 10,
            close_wait: 60,
            last_ack: 30,
            synack: 120,
            udp: 300,
            icmp: 60,
            syn_recv_pressure: 5,
        }
    }
}

/// Admin API endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// Unix socket path (mode 0600).
    pub socket: PathBuf,
    /// Optional TCP listener; always with a bearer token.
    pub tcp: Option<AdminTcp>,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            socket: PathBuf::from(DEFAULT_ADMIN_SOCKET),
            tcp: None,
        }
    }
}

/// The admin API's TCP listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminTcp {
    /// Address to listen on.
    pub address: SocketAddr,
    /// File holding the bearer token clients must present.
    pub token_file: PathBuf,
}

/// Restart survival (`[restart]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// Milliseconds VIP packets are held while no worker serves (a crash,
    /// a restart, an upgrade); 0 turns restart survival off: a stop
    /// detaches at once and removes the flow state.
    pub hold_ms: u32,
    /// Directory of the flow state files and the per-interface locks
    /// (tmpfs: it must not outlive a reboot). One per network namespace.
    pub state_dir: PathBuf,
}

impl Default for Restart {
    fn default() -> Self {
        Restart {
            hold_ms: DEFAULT_HOLD_MS,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
        }
    }
}

/// The Kubernetes source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubernetes {
    /// Whether to watch Services and EndpointSlices.
    pub enabled: bool,
    /// Kubeconfig path; in-cluster configuration when absent.
    pub kubeconfig: Option<PathBuf>,
    /// Only Services labelled `service.kubernetes.io/service-proxy-name`
    /// with this value are served.
    pub service_proxy_name: String,
}

impl Default for Kubernetes {
    fn default() -> Self {
        Kubernetes {
            enabled: false,
            kubeconfig: None,
            service_proxy_name: DEFAULT_SERVICE_PROXY_NAME.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_disjoint_and_covers_the_range() {
        let r = PortRange {
            first: 1024,
            last: 65_535,
        };
        for n in 1..=7 {
            let slices = r.split(n);
            assert_eq!(slices.len(), n);
            assert_eq!(slices[0].first, r.first);
            assert_eq!(slices[n - 1].last, r.last);
            for w in slices.windows(2) {
                assert_eq!(u32::from(w[0].last) + 1, u32::from(w[1].first));
            }
            let total: u32 = slices.iter().map(|s| s.size()).sum();
            assert_eq!(total, r.size());
            let sizes: Vec<u32> = slices.iter().map(|s| s.size()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn overlap() {
        let a = PortRange {
            first: 10,
            last: 20,
        };
        assert!(a.overlaps(PortRange {
            first: 20,
            last: 30
        }));
        assert!(!a.overlaps(PortRange {
            first: 21,
            last: 30
        }));
        assert!(a.contains_range(PortRange {
            first: 10,
            last: 20
        }));
        assert!(!a.contains_range(PortRange { first: 9, last: 20 }));
    }
}
