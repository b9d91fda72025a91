//! Keyword enums: the closed sets of names an operator writes in a config
//! file, an `xvsadm` option or a Kubernetes annotation (schedulers,
//! protocols, poll modes, ...).
//!
//! Invariant: every enum defined here has exactly one canonical lower-case
//! name per variant (`NAMES`, in declaration order), `Display` prints it,
//! `FromStr` accepts it (and only it), and a rejected name produces an
//! [`UnknownName`] that lists every accepted name — so the error an operator
//! sees always says what is allowed.

use std::fmt;

/// A name that is not one of the accepted keywords.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} \"{found}\" (expected one of {})", expected.join(", "))]
pub struct UnknownName {
    /// What was being named ("scheduler", "protocol", ...).
    pub kind: &'static str,
    /// The name as written.
    pub found: String,
    /// Every accepted name.
    pub expected: &'static [&'static str],
}

/// Defines a keyword enum with canonical names, `Display`, `FromStr` and a
/// serde `Deserialize` that reports [`UnknownName`].
macro_rules! keyword_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $kind:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every accepted name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The canonical name.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::names::UnknownName;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    _ => Err($crate::names::UnknownName {
                        kind: $kind,
                        found: s.to_owned(),
                        expected: Self::NAMES,
                    }),
                }
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    };
}

keyword_enum! {
    /// Transport protocol of a virtual service.
    pub enum Protocol: "protocol" {
        /// TCP (`ipvsadm -t`).
        Tcp = "tcp",
        /// UDP (`ipvsadm -u`).
        Udp = "udp",
    }
}

keyword_enum! {
    /// Scheduling algorithm of a virtual service, with IPVS's names.
    pub enum Scheduler: "scheduler" {
        /// Round robin.
        Rr = "rr",
        /// Weighted round robin (the kernel's gcd-based algorithm).
        Wrr = "wrr",
        /// Least connection: overhead = active × 256 + inactive.
        Lc = "lc",
        /// Weighted least connection: overhead / weight (ipvsadm's default).
        Wlc = "wlc",
        /// Shortest expected delay: (active + 1) / weight.
        Sed = "sed",
        /// Never queue: first idle backend, else sed.
        Nq = "nq",
        /// Destination hashing (256 buckets).
        Dh = "dh",
        /// Source hashing (256 buckets).
        Sh = "sh",
        /// Maglev consistent hashing.
        Mh = "mh",
        /// Uniformly random among eligible backends (weighted).
        Random = "random",
        /// Power of two choices weighted by load.
        Twos = "twos",
        /// Locality-based least connection: the backend last chosen for
        /// the destination address, while it is not overloaded (wlc picks
        /// a new one).
        Lblc = "lblc",
        /// Locality-based least connection with replication: a set of
        /// backends per destination address, grown under overload and
        /// trimmed after a day unchanged.
        Lblcr = "lblcr",
        /// Weighted failover: the available backend of the highest weight.
        Fo = "fo",
        /// Overflow connection: the highest weight whose active
        /// connections do not exceed its weight.
        Ovf = "ovf",
    }
}

impl Scheduler {
    /// ipvsadm's default scheduler.
    pub const DEFAULT: Scheduler = Scheduler::Wlc;

    /// Whether the scheduler takes the `fallback` and `port` flags
    /// (IPVS's sh-fallback/sh-port and mh-fallback/mh-port; dh alike).
    pub const fn takes_hash_flags(self) -> bool {
        matches!(self, Scheduler::Dh | Scheduler::Sh | Scheduler::Mh)
    }
}

keyword_enum! {
    /// A flag of the hashing schedulers (dh, sh, mh).
    pub enum SchedulerFlag: "scheduler flag" {
        /// If the hashed backend is unavailable (weight 0), try the next
        /// one instead of refusing the flow.
        Fallback = "fallback",
        /// Include the source port in the hash.
        Port = "port",
    }
}

keyword_enum! {
    /// How packets reach a backend.
    #[derive(Default)]
    pub enum ForwardMethod: "forward method" {
        /// Full NAT: destination rewritten to the backend, source to a SNAT
        /// address of the gateway (ipvsadm shows it as `Masq`).
        #[default]
        Masq = "masq",
        /// Direct routing (ipvsadm's `-g`, `Route`): only the Ethernet
        /// destination is rewritten; the backend, on a segment of the
        /// gateway, holds the VIP on a non-ARPing interface and answers the
        /// client itself.
        Route = "route",
        /// IP-in-IP or GUE tunnelling (ipvsadm's `-i`, `Tunnel`): the packet
        /// is encapsulated to the backend, which decapsulates it and answers
        /// the client itself.
        Tunnel = "tunnel",
    }
}

impl ForwardMethod {
    /// Whether the backend's replies bypass the gateway (direct routing,
    /// tunnels): no SNAT, one-way flows, no port translation.
    pub const fn bypasses_replies(self) -> bool {
        !matches!(self, ForwardMethod::Masq)
    }

    /// The name ipvsadm's listing shows (`Masq`, `Route`, `Tunnel`).
    pub const fn ipvsadm_name(self) -> &'static str {
        match self {
            ForwardMethod::Masq => "Masq",
            ForwardMethod::Route => "Route",
            ForwardMethod::Tunnel => "Tunnel",
        }
    }
}

keyword_enum! {
    /// How a tunnel backend's packets are encapsulated.
    #[derive(Default)]
    pub enum Encap: "encapsulation" {
        #[default]
        /// IP-in-IP (IPv4 protocol 4; IPv6-in-IPv6 next header 41), what
        /// Linux's `ipip`/`ip6tnl` interfaces decapsulate.
        Ipip = "ipip",
        /// GUE variant 1 (the inner IP packet directly in UDP, to
        /// `tunnel.gue_port`), what `ip fou add port P gue` decapsulates;
        /// NICs that hash only UDP spread it by the source port, which
        /// follows the flow.
        Gue = "gue",
    }
}

keyword_enum! {
    /// How a backend's health is checked.
    pub enum CheckKind: "check kind" {
        /// Not checked (always in rotation).
        Off = "none",
        /// A TCP connection to the backend's address and port.
        Tcp = "tcp",
        /// An HTTP/1.1 GET of `http_path`, expecting `expect_status`.
        Http = "http",
    }
}

keyword_enum! {
    /// Whether clients and backends sit behind one interface or two.
    pub enum ArmMode: "interface mode" {
        /// One interface faces clients and backends.
        OneArm = "one-arm",
        /// A client-facing and a backend-facing interface; a worker binds
        /// queue q on both with one shared UMEM.
        TwoArm = "two-arm",
    }
}

keyword_enum! {
    /// How a worker waits for packets.
    pub enum PollMode: "poll mode" {
        /// Spin: lowest latency, one core per worker at 100 %.
        Busy = "busy",
        /// Spin while busy, sleep in poll(2) when idle.
        Adaptive = "adaptive",
    }
}

keyword_enum! {
    /// Which packets the XDP program hands to xvs.
    pub enum Steering: "steering" {
        /// Only packets for VIPs and SNAT addresses (and ARP for them);
        /// everything else goes to the kernel.
        Vip = "vip",
        /// Every packet (libxdp's default program).
        All = "all",
    }
}

keyword_enum! {
    /// What a packet to a VIP on a port no service serves gets.
    pub enum UnknownPort: "unknown-port policy" {
        /// Dropped, counted as `no_service` (the default).
        Drop = "drop",
        /// Answered like kube-proxy's REJECT: a TCP RST or an ICMP port
        /// unreachable.
        Reject = "reject",
    }
}

// The macro's derive list is shared by every keyword enum; this one alone
// has a default.
#[allow(clippy::derivable_impls)]
impl Default for UnknownPort {
    fn default() -> Self {
        UnknownPort::Drop
    }
}

keyword_enum! {
    /// How the XDP program is attached.
    pub enum XdpAttachMode: "XDP attach mode" {
        /// In the driver.
        Native = "native",
        /// Generic (SKB) mode, slower, works everywhere.
        Generic = "generic",
        /// Native, else generic.
        Auto = "auto",
    }
}

keyword_enum! {
    /// Whether AF_XDP sockets use zero-copy.
    pub enum ZeroCopy: "zero-copy mode" {
        /// Zero-copy where the driver supports it, else copy.
        Auto = "auto",
        /// Zero-copy or fail.
        On = "on",
        /// Always copy.
        Off = "off",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Scheduler::ALL {
            assert_eq!(s.name().parse::<Scheduler>(), Ok(*s));
            assert_eq!(s.to_string(), s.name());
        }
        for p in Protocol::ALL {
            assert_eq!(p.name().parse::<Protocol>(), Ok(*p));
        }
    }

    #[test]
    fn unknown_name_lists_the_choices() {
        let err = "lcx".parse::<Scheduler>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown scheduler \"lcx\" (expected one of rr, wrr, lc, wlc, sed, nq, dh, sh, mh, random, twos, lblc, lblcr, fo, ovf)"
        );
    }

    #[test]
    fn names_are_case_sensitive() {
        assert!("WLC".parse::<Scheduler>().is_err());
        assert!("TCP".parse::<Protocol>().is_err());
    }
}

keyword_enum! {
    /// A gateway's part in flow synchronisation.
    #[derive(Default)]
    pub enum SyncRole: "sync role" {
        /// Serves its addresses and sends its flows (ipvsadm's master).
        #[default]
        Active = "active",
        /// Holds the peers' flows and serves nothing until told to take
        /// over (ipvsadm's backup): its VIPs and SNAT addresses are not
        /// steered to it meanwhile.
        Backup = "backup",
    }
}
