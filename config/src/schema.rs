//! The documentation of every key of `xvs.toml`, for the `xvs.toml(5)`
//! man page.
//!
//! Invariant: each [`Section`] lists exactly the keys serde reads into
//! its `raw` struct, in the struct's order. [`Section::read_keys`] asks
//! serde itself for that list (the field names its derived `Deserialize`
//! accepts; unknown keys are refused, `deny_unknown_fields`), and a test
//! holds the two equal, so the page cannot document a key the validator
//! refuses or miss one it reads.

use crate::raw;

/// One key of a table.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// Its name in the file.
    pub name: &'static str,
    /// What it holds (a TOML type, or the words it takes).
    pub kind: &'static str,
    /// Its value when absent (`required` when it must be given).
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// One table of the file.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    /// Its TOML header, e.g. `[conntrack.timeouts]` or `[[services]]`.
    pub header: &'static str,
    /// What it configures.
    pub doc: &'static str,
    /// Its keys.
    pub keys: &'static [Key],
    /// The keys serde reads for it (see the module's invariant).
    read: fn() -> &'static [&'static str],
}

impl Section {
    /// The key names the validator reads for this table, as serde's
    /// derived `Deserialize` of its raw struct declares them.
    pub fn read_keys(&self) -> &'static [&'static str] {
        (self.read)()
    }
}

const fn key(
    name: &'static str,
    kind: &'static str,
    default: &'static str,
    doc: &'static str,
) -> Key {
    Key {
        name,
        kind,
        default,
        doc,
    }
}

fn read<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    serde_aux::serde_introspection::serde_introspect::<T>()
}

/// The file's top-level tables.
pub const FILE: Section = Section {
    header: "TABLES",
    doc: "The file holds these tables; only [interfaces] and [snat] are required.",
    keys: &[
        key(
            "interfaces",
            "table",
            "required",
            "The NICs and queues the data plane runs on.",
        ),
        key(
            "snat",
            "table",
            "required",
            "The addresses full-NAT flows leave from.",
        ),
        key("conntrack", "table", "", "The flow table."),
        key(
            "vips",
            "table",
            "",
            "What a VIP does with what no service serves.",
        ),
        key(
            "admin",
            "table",
            "",
            "The admin API (xvsadm, xvs status, the web view, /metrics).",
        ),
        key(
            "kubernetes",
            "table",
            "",
            "The Kubernetes source of services.",
        ),
        key("restart", "table", "", "Restart survival."),
        key("tunnel", "table", "", "Tunnelled (IPIP, GUE) backends."),
        key("cluster", "table", "", "More than one gateway."),
        key("services", "array of tables", "[]", "The static services."),
    ],
    read: read::<raw::RawFile>,
};

/// Every table, in the order of the man page.
pub const SECTIONS: &[Section] = &[
    FILE,
    Section {
        header: "[interfaces]",
        doc: "The NICs the data plane attaches to, and how it polls them.",
        keys: &[
            key("mode", "one-arm | two-arm", "one-arm", "One NIC for clients and backends, or a client NIC and a backend NIC."),
            key("client", "string", "required", "The client-side interface (and the only one in one-arm mode)."),
            key("backend", "string", "required in two-arm mode", "The backend-side interface (two-arm only)."),
            key("queues", "array of integers", "[0]", "The NIC queues to serve: one worker and one AF_XDP socket each."),
            key("cores", "array of integers", "queue i on core i", "The core each queue's worker is pinned to, one per queue."),
            key("poll", "adaptive | busy", "adaptive", "Busy polling, or polling that sleeps on the socket when idle."),
            key("steering", "vip | all", "vip", "Whether the XDP program sends only VIP and SNAT traffic to xvs (the host keeps the rest) or everything."),
            key("xdp_mode", "auto | native | generic", "auto", "The XDP attach mode (auto: native when the driver has it)."),
            key("zero_copy", "auto | on | off", "auto", "AF_XDP zero-copy (on refuses to start without it)."),
        ],
        read: read::<raw::RawInterfaces>,
    },
    Section {
        header: "[snat]",
        doc: "The source addresses of full-NAT (masq) flows towards the backends.",
        keys: &[
            key("addresses", "array of strings", "required", "SNAT addresses, either family; an IPv6 one must be xvs's own, not the host's."),
            key("ports", "string", "\"1024-65535\"", "The SNAT port range, split evenly between the workers."),
            key("worker_ports", "array of strings", "even split", "An explicit, disjoint port range per worker."),
        ],
        read: read::<raw::RawSnat>,
    },
    Section {
        header: "[conntrack]",
        doc: "The flow table: its size and IPVS's reuse rules (as kube-proxy sets them).",
        keys: &[
            key("capacity", "integer", "1048576", "Flows, all workers together; a full table drops new flows, counted as conntrack_full."),
            key("conn_reuse_mode", "boolean", "true", "A SYN reusing the tuple of a closing flow starts a new flow (IPVS's conn_reuse_mode)."),
            key("expire_nodest_conn", "boolean", "true", "A packet of a flow whose backend was removed ends the flow (IPVS's expire_nodest_conn)."),
            key("expire_quiescent_template", "boolean", "true", "A persistence template to a weight-0 backend expires (IPVS's expire_quiescent_template)."),
            key("timeouts", "table", "IPVS's", "Per-state timeouts, [conntrack.timeouts]."),
        ],
        read: read::<raw::RawConntrack>,
    },
    Section {
        header: "[conntrack.timeouts]",
        doc: "Per-state flow timeouts in seconds; the defaults are IPVS's.",
        keys: &[
            key("established", "integer", "900", "TCP ESTABLISHED."),
            key("syn_sent", "integer", "120", "TCP SYN_SENT."),
            key("syn_recv", "integer", "60", "TCP SYN_RECV."),
            key("fin_wait", "integer", "120", "TCP FIN_WAIT."),
            key("time_wait", "integer", "120", "TCP TIME_WAIT."),
            key("close", "integer", "10", "TCP CLOSE."),
            key("close_wait", "integer", "60", "TCP CLOSE_WAIT."),
            key("last_ack", "integer", "30", "TCP LAST_ACK."),
            key("synack", "integer", "120", "TCP SYNACK."),
            key("udp", "integer", "300", "UDP."),
            key("icmp", "integer", "60", "ICMP."),
            key("syn_recv_pressure", "integer", "5", "SYN_RECV of flows created while the table is under pressure (a SYN flood)."),
        ],
        read: read::<raw::RawTimeouts>,
    },
    Section {
        header: "[vips]",
        doc: "Packets to a VIP that no service serves.",
        keys: &[key("unknown_port", "drop | reject", "drop", "Drop them (counted as no_service), or answer like REJECT (TCP RST, ICMP port unreachable).")],
        read: read::<raw::RawVips>,
    },
    Section {
        header: "[admin]",
        doc: "The admin API: xvsadm, xvs status, the web view and /metrics.",
        keys: &[
            key("socket", "string", "\"/run/xvs/xvs.sock\"", "The unix socket (absolute path)."),
            key("tcp", "string", "off", "A TCP listener, address:port; requires token_file."),
            key("token_file", "string", "none", "The bearer token the TCP listener requires (absolute path)."),
        ],
        read: read::<raw::RawAdmin>,
    },
    Section {
        header: "[kubernetes]",
        doc: "Services and EndpointSlices of a cluster as xvs services, as kube-proxy reads them.",
        keys: &[
            key("enabled", "boolean", "false", "Watch the API server."),
            key("kubeconfig", "string", "in-cluster", "A kubeconfig file (a gateway outside the cluster)."),
            key("service_proxy_name", "string", "\"xvs\"", "Serve the Services labelled service.kubernetes.io/service-proxy-name with this value."),
        ],
        read: read::<raw::RawKubernetes>,
    },
    Section {
        header: "[restart]",
        doc: "Restart survival: the XDP program and the flow table outlive the process for a while, and the next xvs adopts them.",
        keys: &[
            key("hold", "string", "\"5s\"", "How long; \"0s\" turns restart survival off."),
            key("state_dir", "string", "\"/run/xvs\"", "Locks, and the flow state in flows/ (a huge-page tmpfs)."),
        ],
        read: read::<raw::RawRestart>,
    },
    Section {
        header: "[tunnel]",
        doc: "Backends reached through IPIP or GUE tunnels.",
        keys: &[
            key("source", "string", "the first IPv4 SNAT address", "The outer IPv4 source."),
            key("source6", "string", "the first IPv6 SNAT address", "The outer IPv6 source."),
            key("client_source_net", "string", "off", "An IPv4 prefix: the outer source is the prefix with the client's low bits (Katran's way), so a backend's RSS spreads tunnels."),
            key("gue_port", "integer", "6080", "The GUE destination port."),
        ],
        read: read::<raw::RawTunnel>,
    },
    Section {
        header: "[cluster]",
        doc: "Gateways that share services.",
        keys: &[
            key("hash_seed", "integer", "a fixed built-in seed", "Seed of every Maglev table and client hash (0..=2^63-2): gateways behind one ECMP group with the same seed choose alike."),
            key("sync", "table", "off", "Flow synchronisation, [cluster.sync]."),
        ],
        read: read::<raw::RawCluster>,
    },
    Section {
        header: "[cluster.sync]",
        doc: "Flow synchronisation between gateways (IPVS's sync daemon, over UDP).",
        keys: &[
            key("node", "integer", "required", "This gateway's node number, unique, 1..=2^32-1."),
            key("id", "integer", "0", "The sync id (ipvsadm's --syncid)."),
            key("listen", "string", "required", "This gateway's address:port."),
            key("peers", "array of strings", "required", "The other gateways' address:port, or one multicast group joined on listen's interface."),
            key("key_file", "string", "none", "At least 16 bytes: every datagram carries an HMAC-SHA256 with it."),
            key("role", "active | backup", "active", "Whether this gateway serves its addresses."),
            key("peer_timeout", "string", "off", "Take a peer over when it has been silent this long, e.g. \"3s\"."),
        ],
        read: read::<raw::RawSync>,
    },
    Section {
        header: "[[services]]",
        doc: "A virtual service (ipvsadm -A).",
        keys: &[
            key("name", "string", "none", "A name for listings."),
            key("vip", "string", "required", "The virtual address, IPv4 or IPv6."),
            key("protocol", "tcp | udp", "tcp", "The protocol."),
            key("port", "integer", "required", "The port; 0 serves all ports (persistent services only)."),
            key("scheduler", "rr | wrr | lc | wlc | lblc | lblcr | dh | sh | sed | nq | fo | ovf | mh | random | twos", "wlc", "IPVS's schedulers (mh is Maglev), and random and power-of-two choices."),
            key("flags", "array of strings", "[]", "Scheduler flags for dh, sh and mh: fallback, port."),
            key("persistence", "inline table", "off", "Client persistence: { timeout = 300, netmask = \"255.255.255.255\" }."),
            key("source_ranges", "array of strings", "[] (all)", "CIDRs of the VIP's family allowed to connect."),
            key("maglev_table_size", "integer", "16381", "mh only: a prime, at most 131071, larger than the backend count."),
            key("backends", "array of tables", "[]", "The real servers, [[services.backends]]."),
        ],
        read: read::<raw::RawService>,
    },
    Section {
        header: "persistence = { ... }",
        doc: "A service's client persistence (ipvsadm -p and -M).",
        keys: &[
            key("timeout", "integer", "300", "Seconds a client keeps its backend after its last flow."),
            key("netmask", "string", "all bits", "The client granularity: a mask, or a prefix length (\"64\", IPv6's way)."),
        ],
        read: read::<raw::RawPersistence>,
    },
    Section {
        header: "[[services.backends]]",
        doc: "A real server of the service above (ipvsadm -a).",
        keys: &[
            key("address", "string", "required", "Its address, of the VIP's family."),
            key("port", "integer", "the service's", "Its port."),
            key("weight", "integer", "1", "0..=65535; 0 takes no new flows (quiesced)."),
            key("forward", "masq | route | tunnel", "masq", "Full NAT; direct routing (the backend on a connected segment holds the VIP); or encapsulated."),
            key("encap", "ipip | gue", "ipip", "The tunnel of forward = \"tunnel\"."),
            key("check", "table", "none", "A health check, [services.backends.check]."),
        ],
        read: read::<raw::RawBackend>,
    },
    Section {
        header: "[services.backends.check]",
        doc: "A backend's health check; a backend found down is listed at weight 0 and takes no new flows.",
        keys: &[
            key("kind", "tcp | http | none", "tcp", "A TCP connect, or an HTTP GET."),
            key("port", "integer", "the backend's", "The port probed."),
            key("interval", "string", "\"2s\"", "Between probes."),
            key("timeout", "string", "\"1s\"", "Of one probe."),
            key("rise", "integer", "2", "Successes to be up."),
            key("fall", "integer", "3", "Failures to be down."),
            key("http_path", "string", "\"/\"", "The path of an HTTP check."),
            key("expect_status", "integer", "200", "The status of a passing HTTP check."),
        ],
        read: read::<raw::RawCheck>,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_documents_exactly_the_keys_serde_reads() {
        for s in SECTIONS {
            let documented: Vec<&str> = s.keys.iter().map(|k| k.name).collect();
            assert_eq!(documented, s.read_keys(), "{}", s.header);
        }
    }

    #[test]
    fn every_table_of_the_file_has_its_section() {
        let headers: Vec<&str> = SECTIONS.iter().map(|s| s.header).collect();
        for k in FILE.keys {
            assert!(
                headers.iter().any(|h| h.trim_matches(['[', ']']) == k.name),
                "{} has no section",
                k.name
            );
        }
    }
}
