//! The end-to-end bench's test bed: one two-arm namespace topology
//! (client → gateway → switch → one sink host answering for the three
//! endpoint addresses 198.18.1.10-12 and 2001:2:0:1::10-12), the generator
//! on the client, the
//! sink on the sink host, and on the gateway one of: the raw forwarder,
//! xvs (in process, busy poll), or the kernel with a rule set loaded.
//!
//! CPU placement on a 2-CPU machine: the generator is pinned to CPU 0;
//! the forwarding work gets CPU 1 — xvs's worker and the raw forwarder are
//! pinned there, and for the kernel modes RPS sends the gateway's client
//! queue to CPU 1. Everything is removed when the bed is dropped (the
//! topology's namespaces, the sink's XDP program, xvs).

#![allow(clippy::disallowed_types)] // a benchmark measures real time

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xvs_dataplane::runtime::Dataplane;
use xvs_dataplane::wire::Endpoint;
use xvs_dataplane::xsk::RingStats;
use xvs_vm_tests::netns::Netns;
use xvs_vm_tests::topology::{Arms, Spec, Topology};

use crate::frames::{ep_any, L4Kind};
use crate::pktgen::{generate, Flows, GenReport, GenSpec, Sink, SinkSpec};
use crate::raw::{forward, RawSpec};

/// The endpoints that receive traffic (all on the sink host).
pub fn target_endpoints() -> Vec<Endpoint<IpAddr>> {
    (10..13)
        .map(|h| ep_any(Ipv4Addr::new(198, 18, 1, h), 9000))
        .collect()
}

/// The IPv6 endpoints that receive traffic (the sink host's too).
pub fn target_endpoints6() -> Vec<Endpoint<IpAddr>> {
    (0x10..0x13)
        .map(|h| ep_any(Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, h), 9000))
        .collect()
}

/// xvs's IPv6 SNAT addresses (2001:2:0:1::2-5, on the sink's link).
pub const SNAT_ADDRS6: [Ipv6Addr; 4] = [
    Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 2),
    Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 3),
    Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 4),
    Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 5),
];

/// The SNAT addresses xvs uses (198.18.1.2-5): 4 x 64k flows per
/// endpoint. The kernel masquerades to the node's one address, as
/// kube-proxy does.
pub const SNAT_ADDRS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(198, 18, 1, 2),
    Ipv4Addr::new(198, 18, 1, 3),
    Ipv4Addr::new(198, 18, 1, 4),
    Ipv4Addr::new(198, 18, 1, 5),
];
/// The CPU the generator runs on.
pub const GEN_CPU: usize = 0;
/// The CPU the forwarding gets.
pub const FWD_CPU: usize = 1;
/// Source addresses the generator uses (198.18.0.2 on): 16M new tuples.
const SOURCES: u32 = 250;
/// Tuples of the established-flow workload.
pub const FIXED_FLOWS: u32 = 256;
/// UDP flow timeout on both xvs and the kernel, short so that new-flow
/// runs do not exhaust SNAT ports (64k per endpoint).
pub const UDP_TIMEOUT: u32 = 1;

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Every packet a new UDP flow.
    NewFlows,
    /// 256 UDP flows, established before the run.
    Established,
}

impl Workload {
    /// Its name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Workload::NewFlows => "new",
            Workload::Established => "established",
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    /// What the generator sent.
    pub sent_pps: f64,
    /// What reached the sink.
    pub delivered_pps: f64,
}

/// The sink's thread: its stop signal and handle.
type SinkThread = (Sender<()>, JoinHandle<Result<(), String>>);

/// The test bed.
pub struct Bed {
    /// The topology.
    pub topo: Topology,
    sink: Option<SinkThread>,
    sink_count: Arc<std::sync::atomic::AtomicU64>,
    gateway_mac: [u8; 6],
    client_mac: [u8; 6],
    sink_mac: [u8; 6],
    /// Packet numbers already used by new-flow runs (so every run's
    /// tuples are new).
    next_flow: u64,
    seconds: f64,
}

impl Bed {
    /// Builds the topology and starts the sink, which also counts frames
    /// to `also` (VIPs whose packets reach it unchanged: direct routing).
    pub fn build(seconds: f64, also: &[IpAddr]) -> Result<Bed, String> {
        let topo = Topology::build(Spec {
            arms: Arms::Two,
            backends: 1,
            queues: 1,
        })
        .map_err(|e| e.to_string())?;
        let b = &topo.backends[0];
        for h in 11..13 {
            b.ns.ip(&["addr", "add", &format!("198.18.1.{h}/24"), "dev", &b.ifname])
                .map_err(|e| e.to_string())?;
            xvs_vm_tests::topology::address(&b.ns, &b.ifname, &format!("2001:2:0:1::{h}/64"))
                .map_err(|e| e.to_string())?;
        }
        let gateway_mac = topo
            .gateway
            .mac(&topo.gateway_client_if)
            .map_err(|e| e.to_string())?;
        let client_mac = topo
            .client
            .ns
            .mac(&topo.client.ifname)
            .map_err(|e| e.to_string())?;
        let sink_mac = b.ns.mac(&b.ifname).map_err(|e| e.to_string())?;
        // Short UDP timeouts in the gateway's conntrack (see UDP_TIMEOUT).
        for key in [
            "net.netfilter.nf_conntrack_udp_timeout",
            "net.netfilter.nf_conntrack_udp_timeout_stream",
        ] {
            // conntrack's sysctls appear once the module is loaded; the
            // first rule load loads it, so failing here is retried there.
            let _ = topo.gateway.sysctl(key, &UDP_TIMEOUT.to_string());
        }
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stop_tx, stop_rx) = channel::<()>();
        let (up_tx, up_rx) = channel();
        let spec = SinkSpec {
            ifname: b.ifname.clone(),
            queues: vec![0],
            addrs: target_endpoints()
                .iter()
                .chain(&target_endpoints6())
                .map(|e| e.addr)
                .chain(also.iter().copied())
                .collect(),
            mac: sink_mac,
            reflect: false,
        };
        let ns = b.ns.name().to_owned();
        let shared = count.clone();
        let join = std::thread::spawn(move || -> Result<(), String> {
            let started = Netns::existing(&ns)
                .enter_current_thread()
                .map_err(|e| e.to_string())
                .and_then(|()| Sink::start(&spec));
            let sink = match started {
                Ok(s) => {
                    let _ = up_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = up_tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            // Publish the count every millisecond until told to stop.
            while stop_rx.recv_timeout(Duration::from_millis(1)).is_err() {
                shared.store(sink.received(), Ordering::Relaxed);
            }
            shared.store(sink.received(), Ordering::Relaxed);
            sink.stop().map(|_| ())
        });
        up_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the sink did not start".to_owned())??;
        Ok(Bed {
            topo,
            sink: Some((stop_tx, join)),
            sink_count: count,
            gateway_mac,
            client_mac,
            sink_mac,
            next_flow: 0,
            seconds,
        })
    }

    /// The gateway namespace's name.
    pub fn gateway(&self) -> &Netns {
        &self.topo.gateway
    }

    /// The raw forwarder's spec (for `addr`).
    pub fn raw_spec(&self, addr: Ipv4Addr) -> Result<RawSpec, String> {
        let gb = self
            .topo
            .gateway_backend_if
            .clone()
            .ok_or("no backend interface")?;
        Ok(RawSpec {
            client_if: self.topo.gateway_client_if.clone(),
            src_mac: self.topo.gateway.mac(&gb).map_err(|e| e.to_string())?,
            backend_if: gb,
            addr,
            dst_mac: self.sink_mac,
            core: Some(FWD_CPU),
        })
    }

    /// Runs the generator at full rate against `dst` with `workload` for
    /// the bed's duration, after a slow warm-up (neighbour resolution,
    /// and for established flows every tuple seen once); returns what was
    /// sent and what reached the sink.
    pub fn measure(
        &mut self,
        dst: Endpoint<IpAddr>,
        workload: Workload,
    ) -> Result<Measured, String> {
        let base = GenSpec {
            ifname: self.topo.client.ifname.clone(),
            queues: vec![0],
            cores: vec![GEN_CPU],
            src_mac: self.client_mac,
            dst_mac: self.gateway_mac,
            src_base: match dst.addr {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2)),
            },
            src_count: SOURCES,
            dst,
            l4: L4Kind::Udp { payload: 18 },
            flows: Flows::New,
            first: 0,
            rate: None,
            duration: Duration::from_secs_f64(self.seconds),
            receive: false,
        };
        let (warm, run) = match workload {
            Workload::NewFlows => {
                let first = self.next_flow;
                (
                    GenSpec {
                        first,
                        rate: Some(1000),
                        duration: Duration::from_millis(300),
                        ..base.clone()
                    },
                    GenSpec {
                        first: first + 1000,
                        ..base
                    },
                )
            }
            Workload::Established => {
                let fixed = GenSpec {
                    flows: Flows::Fixed(FIXED_FLOWS),
                    ..base
                };
                (
                    GenSpec {
                        rate: Some(u64::from(FIXED_FLOWS) * 4),
                        duration: Duration::from_millis(500),
                        ..fixed.clone()
                    },
                    fixed,
                )
            }
        };
        let client = self.topo.client.ns.name().to_owned();
        let count = self.sink_count.clone();
        let result = std::thread::spawn(move || -> Result<(GenReport, u64), String> {
            Netns::existing(&client)
                .enter_current_thread()
                .map_err(|e| e.to_string())?;
            let never = AtomicBool::new(false);
            generate(&warm, &never)?;
            std::thread::sleep(Duration::from_millis(300));
            let before = count.load(Ordering::Relaxed);
            let r = generate(&run, &never)?;
            // Frames in flight land within milliseconds.
            std::thread::sleep(Duration::from_millis(200));
            Ok((r, count.load(Ordering::Relaxed) - before))
        })
        .join()
        .map_err(|_| "the generator panicked".to_owned())??;
        let (r, delivered) = result;
        if workload == Workload::NewFlows {
            self.next_flow += 1000 + r.sent;
        }
        Ok(Measured {
            sent_pps: r.sent_pps(),
            delivered_pps: delivered as f64 / r.seconds.max(1e-9),
        })
    }

    /// Sets the RPS CPU mask of the gateway's client-side queue (kernel
    /// modes: `1 << FWD_CPU`; 0 restores the default).
    pub fn set_rps(&self, mask: u32) -> Result<(), String> {
        let path = format!(
            "/sys/class/net/{}/queues/rx-0/rps_cpus",
            self.topo.gateway_client_if
        );
        self.topo
            .gateway
            .exec("sh", &["-c", &format!("echo {mask:x} > {path}")])
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some((stop, join)) = self.sink.take() {
            let _ = stop.send(());
            let _ = join.join();
        }
    }
}

/// Runs `program args` in `ns` with `input` on stdin; returns the wall
/// time, or an error (its stderr) on failure or after `timeout` (the
/// process is killed).
pub fn feed_timed(
    ns: &Netns,
    program: &str,
    args: &[&str],
    input: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name(), program])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let input = input.to_owned();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let took = start.elapsed();
                let _ = writer.join();
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return if status.success() {
                    Ok(took)
                } else {
                    Err(format!("{program} failed: {}", err.trim()))
                };
            }
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = writer.join();
                return Err(format!(
                    "{program} did not finish in {} s",
                    timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{program}: {e}")),
        }
    }
}

type Job = Box<dyn FnOnce(&mut Option<Dataplane>) + Send>;

/// xvs in process, on a thread of the gateway namespace that owns the
/// data plane (its workers inherit the namespace). Stops it on drop and
/// then detaches the steering program its hold window leaves attached
/// (what `xvs release` does; no guard process runs here): a mode
/// measured after it must not run behind xvs's program, which drops VIP
/// packets for the first seconds and runs on every packet after.
pub struct XvsRunner {
    jobs: Option<Sender<Job>>,
    join: Option<JoinHandle<()>>,
}

impl XvsRunner {
    /// Starts the owning thread in `ns`.
    pub fn new(ns: &Netns) -> Result<XvsRunner, String> {
        let (tx, rx) = channel::<Job>();
        let name = ns.name().to_owned();
        let (up_tx, up_rx) = channel();
        let join = std::thread::spawn(move || {
            let entered = Netns::existing(&name)
                .enter_current_thread()
                .map_err(|e| e.to_string());
            let ok = entered.is_ok();
            let _ = up_tx.send(entered);
            if !ok {
                return;
            }
            let mut dp: Option<Dataplane> = None;
            for job in rx {
                job(&mut dp);
            }
            if let Some(dp) = dp.take() {
                dp.stop();
            }
            for ifname in interfaces() {
                if let Err(e) = xvs_dataplane::steer::release(&ifname, None) {
                    eprintln!("xvs runner: {e}");
                }
            }
        });
        up_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| "xvs runner did not start".to_owned())??;
        Ok(XvsRunner {
            jobs: Some(tx),
            join: Some(join),
        })
    }

    /// Runs `f` on the owning thread and returns its result.
    pub fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Option<Dataplane>) -> R + Send + 'static,
    ) -> Result<R, String> {
        let (tx, rx) = channel();
        self.jobs
            .as_ref()
            .ok_or("runner stopped")?
            .send(Box::new(move |dp| {
                let _ = tx.send(f(dp));
            }))
            .map_err(|_| "runner gone".to_owned())?;
        rx.recv_timeout(Duration::from_secs(300))
            .map_err(|_| "xvs job did not finish in 300 s".to_owned())
    }
}

/// The names of the calling thread's namespace's interfaces.
fn interfaces() -> Vec<String> {
    // SAFETY: if_nameindex returns a list ending with a zero entry (or
    // null on failure), freed once below with if_freenameindex.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut at = list;
        while (*at).if_index != 0 {
            out.push(
                std::ffi::CStr::from_ptr((*at).if_name)
                    .to_string_lossy()
                    .into_owned(),
            );
            at = at.add(1);
        }
        libc::if_freenameindex(list);
        out
    }
}

/// Whether any interface of `ns` runs an XDP program.
pub fn xdp_attached(ns: &Netns) -> Result<bool, String> {
    let out = ns.ip(&["-d", "link", "show"]).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out.stdout).contains("prog/xdp"))
}

impl Drop for XvsRunner {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// Runs the raw forwarder in the gateway while `body` runs; `body` can
/// read the kernel's statistics of the forwarder's sockets (summed) with
/// its second argument, e.g. before and after a measurement.
pub fn with_raw_forwarder<R>(
    bed: &mut Bed,
    spec: RawSpec,
    body: impl FnOnce(&mut Bed, &dyn Fn() -> RingStats) -> R,
) -> Result<(R, u64), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let gw = bed.gateway().name().to_owned();
    let s = stop.clone();
    let (fds_tx, fds_rx) = channel();
    let join = std::thread::spawn(move || -> Result<u64, String> {
        Netns::existing(&gw)
            .enter_current_thread()
            .map_err(|e| e.to_string())?;
        forward(&spec, &s, |fds| {
            let _ = fds_tx.send(fds);
        })
    });
    // Empty if the forwarder failed to open (its error comes from join).
    let fds: Vec<i32> = fds_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_default();
    std::thread::sleep(Duration::from_millis(300));
    // The descriptors stay open until `stop` is set, after `body`.
    let rings = || RingStats::of_sockets(fds.iter().copied());
    let r = body(bed, &rings);
    stop.store(true, Ordering::Relaxed);
    let forwarded = join
        .join()
        .map_err(|_| "the raw forwarder panicked".to_owned())??;
    Ok((r, forwarded))
}
