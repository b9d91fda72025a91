//! Declarative test topologies: a client host, a gateway, N backends, in
//! network namespaces joined by veth pairs, addressed only from the
//! benchmarking ranges, dual-stack: 198.18.0.0/15 (clients
//! 198.18.0.0/24, backends 198.18.1.0/24; VIPs are 198.19.0.0/16) and
//! 2001:2::/48 (clients 2001:2::/64, backends 2001:2:0:1::/64; VIPs are
//! 2001:2:ff::/64, SNAT addresses 2001:2:0:1::/64 above ::100). IPv6
//! addresses skip duplicate address detection, so they are usable at
//! once.
//!
//! - two-arm: client ↔ gateway `gc` (198.18.0.1), and gateway `gb`
//!   (198.18.1.1) ↔ a switch namespace bridging the backends;
//! - one-arm: client, gateway `g0` and backends all on the switch; the
//!   gateway holds 198.18.0.1 and 198.18.1.1 on its one interface.
//!
//! Every veth has TSO, GSO, GRO and TX checksum offload off, so frames stay
//! MTU-sized with full checksums for XDP. Gateway links get `queues` RX/TX
//! queues. Invariant: the whole topology lives in namespaces created here,
//! so dropping it (also on panic) removes every namespace and link.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::netns::{unique_tag, CmdError, Netns};

/// One-arm or two-arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arms {
    /// Clients and backends behind one gateway interface.
    One,
    /// A client-facing and a backend-facing gateway interface.
    Two,
}

/// What to build.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Arms.
    pub arms: Arms,
    /// Number of backends.
    pub backends: usize,
    /// RX/TX queues of the gateway's links.
    pub queues: u32,
}

impl Spec {
    /// One arm, `backends` backends, one queue: what most tests build.
    pub const fn one_arm(backends: usize) -> Spec {
        Spec {
            arms: Arms::One,
            backends,
            queues: 1,
        }
    }
}

/// A host: its namespace, interface and address.
#[derive(Debug)]
pub struct Host {
    /// Namespace.
    pub ns: Netns,
    /// Its interface (inside `ns`).
    pub ifname: String,
    /// Its address.
    pub addr: Ipv4Addr,
    /// Its IPv6 address.
    pub addr6: Ipv6Addr,
}

/// A built topology; everything is removed on drop.
#[derive(Debug)]
pub struct Topology {
    /// Tag in every name.
    pub tag: String,
    /// Client host (198.18.0.2).
    pub client: Host,
    /// Gateway namespace.
    pub gateway: Netns,
    /// Gateway's client-facing interface (the only one in one-arm mode).
    pub gateway_client_if: String,
    /// Gateway's backend-facing interface (two-arm).
    pub gateway_backend_if: Option<String>,
    /// Backends (198.18.1.10, .11, ...).
    pub backends: Vec<Host>,
    /// The switch namespace bridging backends (and, one-arm, everyone).
    switch: Netns,
}

/// Gateway address on the client side.
pub const GATEWAY_CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Gateway address on the backend side.
pub const GATEWAY_BACKEND_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
/// Client address.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// The SNAT address the one-arm tests give xvs (on the backends' link,
/// no host has it).
pub const SNAT_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);

/// The head of a one-arm config for xvs on `t`'s gateway: its interface
/// with `queues` queues (worker `q` on core `q`), native XDP in copy mode,
/// and [`SNAT_ADDR`] with every port; services follow.
pub fn one_arm_head(t: &Topology, queues: usize) -> String {
    head_with_snat(t, queues, &format!("\"{SNAT_ADDR}\""))
}

/// [`one_arm_head`] with [`SNAT_ADDR6`] beside [`SNAT_ADDR`] (a config
/// with an IPv6 service needs an IPv6 SNAT address).
pub fn one_arm_head_dual(t: &Topology, queues: usize) -> String {
    head_with_snat(t, queues, &format!("\"{SNAT_ADDR}\", \"{SNAT_ADDR6}\""))
}

/// The one-arm head with `snat` (quoted, comma-separated) as the SNAT
/// addresses.
fn head_with_snat(t: &Topology, queues: usize, snat: &str) -> String {
    let q: Vec<usize> = (0..queues).collect();
    format!(
        r#"[interfaces]
mode = "one-arm"
client = "{}"
queues = {q:?}
cores = {q:?}
poll = "adaptive"
xdp_mode = "native"
zero_copy = "off"

[snat]
addresses = [{snat}]
ports = "1024-65535"
"#,
        t.gateway_client_if
    )
}

/// The address of backend `i`.
pub fn backend_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, 10 + i as u8)
}

/// Client IPv6 address.
pub const CLIENT_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2);
/// Gateway IPv6 address on the client side.
pub const GATEWAY_CLIENT_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1);
/// Gateway IPv6 address on the backend side.
pub const GATEWAY_BACKEND_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1);
/// An IPv6 SNAT address for xvs (on the backends' link, no host has it).
pub const SNAT_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 0x100);
/// The first IPv6 VIP (VIPs are 2001:2:ff::/64, routed via the gateway).
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0xff, 0, 0, 0, 0, 1);

/// The IPv6 address of backend `i`.
pub fn backend_addr6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 0x10 + i as u16)
}

fn offloads_off(ns: &Netns, ifname: &str) -> Result<(), CmdError> {
    ns.exec(
        "ethtool",
        &[
            "-K", ifname, "tso", "off", "gso", "off", "gro", "off", "tx", "off",
        ],
    )
    .map(|_| ())
}

/// Creates a veth pair `a` in `ns_a` and `b` in `ns_b`, with `queues`
/// queues on `a`, offloads off on both, both up.
fn veth(ns_a: &Netns, a: &str, ns_b: &Netns, b: &str, queues: u32) -> Result<(), CmdError> {
    let q = queues.max(1).to_string();
    ns_a.ip(&[
        "link",
        "add",
        a,
        "numrxqueues",
        &q,
        "numtxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        b,
        "netns",
        ns_b.name(),
        "numrxqueues",
        &q,
        "numtxqueues",
        &q,
    ])?;
    for (ns, i) in [(ns_a, a), (ns_b, b)] {
        offloads_off(ns, i)?;
        ns.ip(&["link", "set", i, "up"])?;
    }
    Ok(())
}

/// A veth pair `a` in `ns_a` and `b` in `ns_b` (one queue, offloads off,
/// both up): for tests that add hosts or routers to a topology.
pub fn link(ns_a: &Netns, a: &str, ns_b: &Netns, b: &str) -> Result<(), CmdError> {
    veth(ns_a, a, ns_b, b, 1)
}

/// Adds `cidr` to `ifname` in `ns` (IPv6 without duplicate address
/// detection).
pub fn address(ns: &Netns, ifname: &str, cidr: &str) -> Result<(), CmdError> {
    addr(ns, ifname, cidr)
}

fn addr(ns: &Netns, ifname: &str, cidr: &str) -> Result<(), CmdError> {
    if cidr.contains(':') {
        return ns
            .ip(&["-6", "addr", "add", cidr, "dev", ifname, "nodad"])
            .map(|_| ());
    }
    ns.ip(&["addr", "add", cidr, "dev", ifname]).map(|_| ())
}

impl Topology {
    /// Builds the topology; on error, what was built is removed.
    pub fn build(spec: Spec) -> Result<Topology, CmdError> {
        let tag = unique_tag();
        let switch = Netns::create(&tag, "sw")?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        // The switch is plain L2: when br_netfilter is loaded (it is per
        // namespace and defaults to on), bridged frames would go through
        // the switch's iptables hooks, costing every mode CPU. Absent
        // module, absent sysctl: nothing to turn off.
        for key in [
            "bridge-nf-call-iptables",
            "bridge-nf-call-ip6tables",
            "bridge-nf-call-arptables",
        ] {
            let _ = switch.sysctl(&format!("net.bridge.{key}"), "0");
        }
        let gateway = Netns::create(&tag, "gw")?;
        let client_ns = Netns::create(&tag, "cl")?;
        // Ports of the switch are named by role, on the switch side.
        let port = |name: &str| -> Result<(), CmdError> {
            offloads_off(&switch, name)?;
            switch.ip(&["link", "set", name, "master", "br0"])?;
            switch.ip(&["link", "set", name, "up"]).map(|_| ())
        };

        let (gateway_client_if, gateway_backend_if) = match spec.arms {
            Arms::Two => {
                veth(&gateway, "gc", &client_ns, "c0", spec.queues)?;
                veth(&gateway, "gb", &switch, "p-gw", spec.queues)?;
                port("p-gw")?;
                addr(&gateway, "gc", "198.18.0.1/24")?;
                addr(&gateway, "gb", "198.18.1.1/24")?;
                addr(&gateway, "gc", "2001:2::1/64")?;
                addr(&gateway, "gb", "2001:2:0:1::1/64")?;
                ("gc".to_owned(), Some("gb".to_owned()))
            }
            Arms::One => {
                veth(&gateway, "g0", &switch, "p-gw", spec.queues)?;
                port("p-gw")?;
                veth(&client_ns, "c0", &switch, "p-cl", 1)?;
                port("p-cl")?;
                addr(&gateway, "g0", "198.18.0.1/24")?;
                addr(&gateway, "g0", "198.18.1.1/24")?;
                addr(&gateway, "g0", "2001:2::1/64")?;
                addr(&gateway, "g0", "2001:2:0:1::1/64")?;
                ("g0".to_owned(), None)
            }
        };
        addr(&client_ns, "c0", "198.18.0.2/24")?;
        client_ns.ip(&["route", "add", "default", "via", "198.18.0.1"])?;
        addr(&client_ns, "c0", "2001:2::2/64")?;
        client_ns.ip(&["-6", "route", "add", "default", "via", "2001:2::1"])?;
        gateway.sysctl("net.ipv4.ip_forward", "1")?;
        gateway.sysctl("net.ipv6.conf.all.forwarding", "1")?;

        let mut backends = Vec::new();
        for i in 0..spec.backends {
            let ns = Netns::create(&tag, &format!("b{i}"))?;
            let p = format!("p-b{i}");
            veth(&ns, "b0", &switch, &p, 1)?;
            port(&p)?;
            let a = backend_addr(i);
            addr(&ns, "b0", &format!("{a}/24"))?;
            ns.ip(&["route", "add", "default", "via", "198.18.1.1"])?;
            let a6 = backend_addr6(i);
            addr(&ns, "b0", &format!("{a6}/64"))?;
            ns.ip(&["-6", "route", "add", "default", "via", "2001:2:0:1::1"])?;
            backends.push(Host {
                ns,
                ifname: "b0".into(),
                addr: a,
                addr6: a6,
            });
        }
        Ok(Topology {
            tag,
            client: Host {
                ns: client_ns,
                ifname: "c0".into(),
                addr: CLIENT_ADDR,
                addr6: CLIENT_ADDR6,
            },
            gateway,
            gateway_client_if,
            gateway_backend_if,
            backends,
            switch,
        })
    }

    /// Runs `xvs-testnet tcp` (the binary at `testnet`) from the client:
    /// `connections` echo-verified connections to `to`, each operation
    /// bounded by `timeout_ms`. Returns its summary line
    /// (`ok=N failed=M by=NAME:K,...`), also when some failed.
    pub fn tcp_load(&self, testnet: &str, to: &str, connections: usize, timeout_ms: u64) -> String {
        self.client_says(
            testnet,
            &[
                "tcp",
                "--connect",
                to,
                "--connections",
                &connections.to_string(),
                "--timeout-ms",
                &timeout_ms.to_string(),
            ],
        )
    }

    /// Runs `xvs-testnet tcp` from the client, 8 connections at a time:
    /// `connections` echo-verified connections to `to` with `payload`
    /// bytes each; its summary line.
    pub fn tcp_load_payload(
        &self,
        testnet: &str,
        to: &str,
        connections: usize,
        payload: usize,
    ) -> String {
        let (n, bytes) = (connections.to_string(), payload.to_string());
        self.client_says(
            testnet,
            &[
                "tcp",
                "--connect",
                to,
                "--connections",
                &n,
                "--concurrency",
                "8",
                "--payload",
                &bytes,
            ],
        )
    }

    /// Runs `testnet ARGS` (an `xvs-testnet` subcommand) on the client
    /// and returns what it printed, trimmed (empty if it did not run).
    pub fn client_says(&self, testnet: &str, args: &[&str]) -> String {
        self.client
            .ns
            .command(testnet)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    /// Runs `xvs-testnet blast` (the binary at `testnet`) from the client:
    /// UDP datagrams to `to` as fast as one socket sends them for
    /// `seconds`; returns its summary line (`sent=N pps=R`).
    pub fn udp_blast(&self, testnet: &str, to: &str, seconds: u32) -> String {
        let out = self
            .client
            .ns
            .command(testnet)
            .args(["blast", "--to", to, "--seconds", &seconds.to_string()])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    /// Starts `xvs-testnet serve` (the binary at `testnet`) in every
    /// backend: TCP on `tcp_port`, UDP on `udp_port` if given, named
    /// `{prefix}{i}`; waits until each is ready.
    pub fn echo_servers(
        &self,
        testnet: &str,
        prefix: &str,
        tcp_port: u16,
        udp_port: Option<u16>,
    ) -> std::io::Result<Vec<crate::procs::Spawned>> {
        self.backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut cmd = b.ns.command(testnet);
                let name = format!("{prefix}{i}");
                cmd.args([
                    "serve",
                    "--name",
                    &name,
                    "--tcp",
                    &format!("{}:{tcp_port}", b.addr),
                ]);
                if let Some(p) = udp_port {
                    cmd.args(["--udp", &format!("{}:{p}", b.addr)]);
                }
                let (s, line) = crate::procs::Spawned::start(
                    cmd,
                    "echo server",
                    std::time::Duration::from_secs(5),
                )?;
                if line != format!("ready {name}") {
                    return Err(std::io::Error::other(format!(
                        "echo server {name} said {line:?}"
                    )));
                }
                Ok(s)
            })
            .collect()
    }

    /// Makes backend `i` a real server that answers `vip` itself, as LVS
    /// direct-routing and tunnel real servers are set up: the VIP on `lo`,
    /// no ARP answers or announcements for it (`arp_ignore = 1`,
    /// `arp_announce = 2`), and the client reached straight over the
    /// segment rather than back through the gateway.
    pub fn lvs_real_server(&self, i: usize, vip: Ipv4Addr) -> Result<(), CmdError> {
        let b = &self.backends[i];
        b.ns.ip(&["addr", "add", &format!("{vip}/32"), "dev", "lo"])?;
        for dev in ["all", b.ifname.as_str()] {
            b.ns.sysctl(&format!("net.ipv4.conf.{dev}.arp_ignore"), "1")?;
            b.ns.sysctl(&format!("net.ipv4.conf.{dev}.arp_announce"), "2")?;
        }
        b.ns.ip(&[
            "route",
            "add",
            &format!("{CLIENT_ADDR}/32"),
            "dev",
            &b.ifname,
        ])
        .map(|_| ())
    }

    /// nginx on every backend, at its IPv4 address (its IPv6 one with
    /// `ipv6`) and `port`, backend `i` answering `b{i}`.
    pub fn nginx_on_backends(
        &self,
        ipv6: bool,
        port: u16,
    ) -> std::io::Result<Vec<crate::nginx::Nginx>> {
        self.backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let addr: std::net::IpAddr = if ipv6 { b.addr6.into() } else { b.addr.into() };
                let on = [std::net::SocketAddr::new(addr, port)];
                crate::nginx::Nginx::start_on(&b.ns, &on, &format!("b{i}"))
            })
            .collect()
    }

    /// Makes backend `i` an LVS-DR real server of the IPv6 VIP `vip`: the
    /// VIP on `lo` (a Linux host answers a neighbour solicitation only
    /// for an address of the interface it came in on, so none for the
    /// VIP: IPv6's side of `arp_ignore`), and the client on-link, so that
    /// the answers go straight to it.
    pub fn lvs_real_server6(&self, i: usize, vip: Ipv6Addr) -> Result<(), CmdError> {
        let b = &self.backends[i];
        b.ns.ip(&["-6", "addr", "add", &format!("{vip}/128"), "dev", "lo"])?;
        b.ns.ip(&[
            "-6",
            "route",
            "add",
            &format!("{CLIENT_ADDR6}/128"),
            "dev",
            &b.ifname,
        ])
        .map(|_| ())
    }

    /// Another gateway on the one-arm switch: namespace `name` with
    /// interface `g0` (switch port `p-NAME`) holding 198.18.0.`octet` and
    /// 198.18.1.`octet`, forwarding on; it goes with the topology's other
    /// namespaces when dropped (the caller keeps it alive until then).
    pub fn add_gateway(&self, name: &str, octet: u8) -> Result<Netns, CmdError> {
        let ns = Netns::create(&self.tag, name)?;
        let port = format!("p-{name}");
        veth(&ns, "g0", &self.switch, &port, 1)?;
        offloads_off(&self.switch, &port)?;
        self.switch.ip(&["link", "set", &port, "master", "br0"])?;
        self.switch.ip(&["link", "set", &port, "up"])?;
        addr(&ns, "g0", &format!("198.18.0.{octet}/24"))?;
        addr(&ns, "g0", &format!("198.18.1.{octet}/24"))?;
        ns.sysctl("net.ipv4.ip_forward", "1")?;
        Ok(ns)
    }

    /// The switch namespace (its ports are `p-gw`, `p-cl` in one-arm
    /// mode, `p-b0`, ...).
    pub fn switch(&self) -> &Netns {
        &self.switch
    }

    /// What the kernels on the way say, for a failing test to print
    /// beside xvs's own counters: the gateway's link (is the program
    /// still attached; frames in and out) with its driver's per-queue XDP
    /// counters, the gateway's IP counters (packets the kernel got
    /// instead of xvs), the switch's ports, and the client's
    /// and backends' TCP sockets and counters (retransmitting? segments
    /// refused?) and the client's neighbours (the gateway resolved?).
    /// A command that fails says so in its place.
    pub fn kernel_view(&self) -> String {
        let show = |ns: &Netns, program: &str, args: &[&str]| {
            let out = match ns.exec(program, args) {
                Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
                Err(e) => format!("({e})\n"),
            };
            format!("--- {} {program} {}\n{out}", ns.name(), args.join(" "))
        };
        let gw = self.gateway_client_if.as_str();
        let mut view = [
            show(&self.gateway, "ip", &["-s", "-d", "link", "show", gw]),
            show(&self.gateway, "ethtool", &["-S", gw]),
            show(&self.gateway, "nstat", &["-as"]),
            show(&self.switch, "ip", &["-s", "link"]),
            show(&self.client.ns, "ss", &["-tinm"]),
            show(&self.client.ns, "ip", &["neigh"]),
            show(&self.client.ns, "nstat", &["-as"]),
        ]
        .concat();
        for b in &self.backends {
            view.push_str(&show(&b.ns, "ss", &["-tinm"]));
            view.push_str(&show(&b.ns, "nstat", &["-as"]));
        }
        view
    }

    /// Names of every namespace of this topology.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v = vec![
            self.switch.name().to_owned(),
            self.gateway.name().to_owned(),
            self.client.ns.name().to_owned(),
        ];
        v.extend(self.backends.iter().map(|b| b.ns.name().to_owned()));
        v
    }
}
