//! An AF_XDP packet generator and sink (the machine has no kernel pktgen).
//!
//! The generator sends UDP or TCP frames built from one template on one
//! AF_XDP socket per queue, at a fixed or the maximum rate, either every
//! packet a new flow (source address and port advance) or cycling over a
//! fixed set of tuples (established flows). It counts what it sent and,
//! with the steering program on its interface owning its source
//! addresses, what came back.
//!
//! The sink owns a set of addresses on its interface (the steering program
//! passes everything else, ARP included, to the kernel, which answers it),
//! counts every frame sent to them, and either drops them or reflects them
//! to their sender (swapped MACs, addresses and ports).
//!
//! Both run on threads of the calling thread's network namespace and stop
//! by themselves: the generator after its duration, the sink when told.
//! ARP requests for owned addresses come to the sockets too (the steering
//! program sends them there): both answer them.
//!
//! IPv6 works the same way: the template is an IPv6 frame, every packet's
//! source is rewritten with the IPv6 NAT (its checksum updated
//! incrementally), and neighbour solicitations for owned addresses are
//! answered as ARP requests are; reflection is IPv4 only.
//!
//! Invariant: every frame taken from a port goes back to it (sent,
//! released or reflected); the ports' frame accounting checks it on stop.

#![allow(clippy::disallowed_types)] // a generator paces itself by real time

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smoltcp::wire::EthernetAddress;
use xsk_rs::FrameDesc;
use xvs_config::XdpAttachMode;
use xvs_dataplane::steer::Steering;
use xvs_dataplane::wire::{answer, classify, nat, nat6, ndp, Endpoint, Frame, Ipv4, Ipv6, Nat, L4};
use xvs_dataplane::xsk::{XskPort, BATCH};

use crate::frames::{frame_any, L4Kind};

/// Ports a source address cycles through before the next address.
const PORTS: u32 = 64_512;
/// First source port.
const FIRST_PORT: u32 = 1024;

/// Which tuples the generator sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flows {
    /// Every packet a new flow: the source port (then address) advances.
    New,
    /// Cycle over this many fixed tuples (established flows).
    Fixed(u32),
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenSpec {
    /// Interface to send on.
    pub ifname: String,
    /// Queues: one socket and one thread each.
    pub queues: Vec<u32>,
    /// CPUs to pin the threads to (by position; unpinned beyond).
    pub cores: Vec<usize>,
    /// Source MAC (the interface's).
    pub src_mac: [u8; 6],
    /// Destination MAC (the next hop's).
    pub dst_mac: [u8; 6],
    /// First source address (of the destination's family).
    pub src_base: IpAddr,
    /// Source addresses to use from `src_base` on.
    pub src_count: u32,
    /// Destination.
    pub dst: Endpoint<IpAddr>,
    /// UDP or TCP (flags).
    pub l4: L4Kind,
    /// New or fixed flows.
    pub flows: Flows,
    /// The first packet number (new flows: a run starting where the last
    /// one ended sends tuples never seen before).
    pub first: u64,
    /// Packets per second over all queues; `None` is as fast as possible.
    pub rate: Option<u64>,
    /// How long to send.
    pub duration: Duration,
    /// Count replies: own the source addresses with the steering program.
    pub receive: bool,
}

/// What the generator did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenReport {
    /// Frames sent.
    pub sent: u64,
    /// Frames received back.
    pub received: u64,
    /// Sending time.
    pub seconds: f64,
}

impl GenReport {
    /// Sent packets per second.
    pub fn sent_pps(&self) -> f64 {
        per_second(self.sent, self.seconds)
    }

    /// Received packets per second.
    pub fn received_pps(&self) -> f64 {
        per_second(self.received, self.seconds)
    }
}

fn per_second(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// The source of packet number `k`.
pub fn source_of(spec: &GenSpec, k: u64) -> Endpoint<IpAddr> {
    let k = match spec.flows {
        Flows::New => k,
        Flows::Fixed(n) => k % u64::from(n.max(1)),
    };
    let port = FIRST_PORT + (k % u64::from(PORTS)) as u32;
    let host = (k / u64::from(PORTS)) % u64::from(spec.src_count.max(1));
    Endpoint {
        addr: nth(spec.src_base, host as u32),
        port: port as u16,
    }
}

/// The address `n` after `base`.
fn nth(base: IpAddr, n: u32) -> IpAddr {
    match base {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) + n)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) + u128::from(n))),
    }
}

/// The generator's template, classified: how each packet's source is
/// rewritten.
#[derive(Clone, Copy)]
enum Template {
    V4(Ipv4),
    /// The packet, its destination and its (source, destination) MACs:
    /// the IPv6 rewrite writes both ends and the MACs at once.
    V6(Ipv6, Endpoint<Ipv6Addr>, [EthernetAddress; 2]),
}

impl Template {
    fn of(frame: &[u8], spec: &GenSpec) -> Result<Template, String> {
        match (classify(frame), spec.dst.addr) {
            (Ok(Frame::Ipv4(ip)), _) => Ok(Template::V4(ip)),
            (Ok(Frame::Ipv6(ip)), IpAddr::V6(a)) => Ok(Template::V6(
                ip,
                Endpoint {
                    addr: a,
                    port: spec.dst.port,
                },
                [spec.src_mac, spec.dst_mac].map(EthernetAddress),
            )),
            (other, _) => Err(format!("template does not classify: {other:?}")),
        }
    }

    /// Rewrites the source of a copy of the template in `buf`.
    fn set_source(&self, buf: &mut [u8], src: Endpoint<IpAddr>) -> bool {
        match (self, src.addr) {
            (Template::V4(ip), IpAddr::V4(a)) => nat::set_source(
                buf,
                ip,
                Endpoint {
                    addr: a,
                    port: src.port,
                },
            )
            .is_ok(),
            (Template::V6(ip, dst, [src_mac, dst_mac]), IpAddr::V6(a)) => {
                let n = Nat {
                    src: Endpoint {
                        addr: a,
                        port: src.port,
                    },
                    dst: *dst,
                };
                // (The template's hop limit goes from 64 to 63: a copy
                // is rewritten, never the template.)
                nat6::forward6(buf, ip, &n, *src_mac, *dst_mac).is_ok()
            }
            _ => false,
        }
    }
}

fn pin(cores: &[usize], i: usize) {
    if let Some(&id) = cores.get(i) {
        core_affinity::set_for_current(core_affinity::CoreId { id });
    }
}

/// Runs the generator for `spec.duration` (or until `stop`); returns the
/// totals over every queue.
pub fn generate(spec: &GenSpec, stop: &AtomicBool) -> Result<GenReport, String> {
    let steering = if spec.receive {
        let st =
            Steering::attach(&spec.ifname, XdpAttachMode::Native).map_err(|e| e.to_string())?;
        for h in 0..spec.src_count {
            st.add_address(nth(spec.src_base, h))
                .map_err(|e| e.to_string())?;
        }
        Some(st)
    } else {
        None
    };
    let threads = spec.queues.len().max(1) as u64;
    let mut ports = Vec::new();
    for &queue in &spec.queues {
        let port =
            XskPort::open(&[spec.ifname.as_str()], queue, None).map_err(|e| e.to_string())?;
        if let Some(st) = &steering {
            st.register_socket(queue, port.fd(0))
                .map_err(|e| e.to_string())?;
        }
        ports.push(port);
    }
    let results: Vec<Result<GenReport, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = ports
            .into_iter()
            .enumerate()
            .map(|(i, port)| {
                s.spawn(move || {
                    pin(&spec.cores, i);
                    send_queue(spec, port, spec.first + i as u64, threads, stop)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("sender panicked".into())))
            .collect()
    });
    let mut total = GenReport::default();
    for r in results {
        let r = r?;
        total.sent += r.sent;
        total.received += r.received;
        total.seconds = total.seconds.max(r.seconds);
    }
    Ok(total)
}

/// One queue's sender: packet numbers `first`, `first + step`, ...
fn send_queue(
    spec: &GenSpec,
    mut port: XskPort,
    first: u64,
    step: u64,
    stop: &AtomicBool,
) -> Result<GenReport, String> {
    let template = frame_any(
        spec.src_mac,
        spec.dst_mac,
        source_of(spec, first),
        spec.dst,
        spec.l4,
    )
    .ok_or("the source and the destination are of different families")?;
    let tpl = Template::of(&template, spec)?;
    let rate = spec.rate.map(|r| r as f64 / step as f64);
    let mut descs: Vec<FrameDesc> = Vec::with_capacity(BATCH);
    let mut rx = vec![FrameDesc::default(); BATCH];
    let (mut sent, mut received, mut k) = (0u64, 0u64, first);
    let start = Instant::now();
    let mut elapsed = Duration::ZERO;
    while elapsed < spec.duration && !stop.load(Ordering::Relaxed) {
        port.reclaim();
        let n = port.receive(0, &mut rx);
        if n > 0 {
            received += serve(&mut port, &mut rx[..n], spec.src_mac, false, &mut descs);
            port.transmit(0, &descs);
            port.refill();
        }
        let want = match rate {
            Some(r) => ((elapsed.as_secs_f64() * r) as u64)
                .saturating_sub(sent)
                .min(BATCH as u64) as usize,
            None => BATCH,
        };
        descs.clear();
        while descs.len() < want {
            let Some(mut d) = port.alloc() else { break };
            let src = source_of(spec, k);
            // SAFETY: `d` was just allocated from this port's free list
            // and nothing else refers to it.
            let ok = unsafe {
                port.with_frame(&mut d, |buf, _| {
                    buf[..template.len()].copy_from_slice(&template);
                    tpl.set_source(&mut buf[..template.len()], src)
                })
            };
            // SAFETY: as above; the frame holds `template.len()` bytes.
            unsafe { port.set_len(&mut d, template.len()) };
            if !ok {
                port.release(&[d]);
                break;
            }
            descs.push(d);
            k += step;
        }
        let queued = port.transmit(0, &descs);
        sent += queued as u64;
        // Frames the ring refused were released: send them again later.
        k -= (descs.len() - queued) as u64 * step;
        elapsed = start.elapsed();
    }
    let seconds = elapsed.as_secs_f64();
    // Let the last frames complete so the accounting closes.
    for _ in 0..100 {
        port.reclaim();
        if port.frame_counts().2 == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(GenReport {
        sent,
        received,
        seconds,
    })
}

/// What the sink serves.
#[derive(Debug, Clone)]
pub struct SinkSpec {
    /// Interface.
    pub ifname: String,
    /// Queues: one socket and one thread each.
    pub queues: Vec<u32>,
    /// Addresses it owns (frames to them are counted; ARP requests and
    /// neighbour solicitations for them are answered).
    pub addrs: Vec<IpAddr>,
    /// The interface's MAC address (for ARP replies).
    pub mac: [u8; 6],
    /// Send every UDP/TCP frame back to its sender.
    pub reflect: bool,
}

/// A running sink; stops and detaches on [`Sink::stop`] or drop.
pub struct Sink {
    received: Arc<AtomicU64>,
    reflected: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<(), String>>>,
    _steering: Steering,
}

impl Sink {
    /// Starts the sink in the calling thread's namespace.
    pub fn start(spec: &SinkSpec) -> Result<Sink, String> {
        let steering =
            Steering::attach(&spec.ifname, XdpAttachMode::Native).map_err(|e| e.to_string())?;
        for a in &spec.addrs {
            steering.add_address(*a).map_err(|e| e.to_string())?;
        }
        let (received, reflected, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let mut threads = Vec::new();
        for &queue in &spec.queues {
            let port =
                XskPort::open(&[spec.ifname.as_str()], queue, None).map_err(|e| e.to_string())?;
            steering
                .register_socket(queue, port.fd(0))
                .map_err(|e| e.to_string())?;
            let (received, reflected, stop) = (received.clone(), reflected.clone(), stop.clone());
            let (mac, reflect) = (spec.mac, spec.reflect);
            threads.push(std::thread::spawn(move || {
                sink_queue(port, mac, reflect, &received, &reflected, &stop)
            }));
        }
        Ok(Sink {
            received,
            reflected,
            stop,
            threads,
            _steering: steering,
        })
    }

    /// Frames received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Frames sent back so far.
    pub fn reflected(&self) -> u64 {
        self.reflected.load(Ordering::Relaxed)
    }

    /// Stops the threads; returns (received, reflected).
    pub fn stop(mut self) -> Result<(u64, u64), String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().map_err(|_| "sink panicked".to_owned())??;
        }
        Ok((self.received(), self.reflected()))
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn sink_queue(
    mut port: XskPort,
    mac: [u8; 6],
    reflect: bool,
    received: &AtomicU64,
    reflected: &AtomicU64,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut rx = vec![FrameDesc::default(); BATCH];
    let mut back: Vec<FrameDesc> = Vec::with_capacity(BATCH);
    while !stop.load(Ordering::Relaxed) {
        port.reclaim();
        port.refill();
        let n = port.receive(0, &mut rx);
        if n == 0 {
            let mut pfd = libc::pollfd {
                fd: port.fd(0),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, 20) };
            continue;
        }
        back.clear();
        let counted = serve(&mut port, &mut rx[..n], mac, reflect, &mut back);
        received.fetch_add(counted, Ordering::Relaxed);
        let sent = port.transmit(0, &back) as u64;
        if reflect {
            reflected.fetch_add(sent.min(counted), Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Handles received frames: answers ARP requests (the steering program
/// sends those for owned addresses here), counts UDP/TCP frames and, with
/// `reflect`, turns them around. Frames to send are appended to `out`,
/// the rest released. Returns the UDP/TCP frames counted.
fn serve(
    port: &mut XskPort,
    rx: &mut [FrameDesc],
    mac: [u8; 6],
    reflect: bool,
    out: &mut Vec<FrameDesc>,
) -> u64 {
    out.clear();
    let mut counted = 0;
    for d in rx.iter_mut() {
        // SAFETY: a frame just received on this port, referenced nowhere
        // else; its new length is set before it is sent.
        let send = unsafe {
            port.with_frame(d, |buf, len| match classify(&buf[..len]) {
                Ok(Frame::Arp(arp)) => answer::arp_reply(buf, &arp, EthernetAddress(mac))
                    .ok()
                    .flatten(),
                Ok(Frame::Ipv4(ip)) if matches!(ip.l4, L4::Udp { .. } | L4::Tcp { .. }) => {
                    counted += 1;
                    (reflect && swap(&mut buf[..len])).then_some(len)
                }
                // The steering program sends only solicitations for the
                // owned addresses.
                Ok(Frame::Ipv6(ip)) => match ip.l4 {
                    L4::Neighbour(ns) if ns.solicit => {
                        let asker = EthernetAddress::from_bytes(&buf[6..12]);
                        ndp::advertise(buf, &ns, ip.src, asker, EthernetAddress(mac))
                    }
                    L4::Udp { .. } | L4::Tcp { .. } => {
                        counted += 1;
                        None
                    }
                    _ => None,
                },
                _ => None,
            })
        };
        match send {
            Some(len) => {
                // SAFETY: as above.
                unsafe { port.set_len(d, len) };
                out.push(*d);
            }
            None => port.release(&[*d]),
        }
    }
    counted
}

/// Turns a UDP/TCP frame around: MACs, addresses and ports swapped.
fn swap(buf: &mut [u8]) -> bool {
    let Ok(Frame::Ipv4(ip)) = classify(buf) else {
        return false;
    };
    let (sp, dp) = match ip.l4 {
        L4::Udp { src_port, dst_port }
        | L4::Tcp {
            src_port, dst_port, ..
        } => (src_port, dst_port),
        _ => return false,
    };
    let (src, dst) = (
        Endpoint {
            addr: ip.src,
            port: sp,
        },
        Endpoint {
            addr: ip.dst,
            port: dp,
        },
    );
    let mut macs = [0u8; 12];
    macs.copy_from_slice(&buf[..12]);
    buf[..6].copy_from_slice(&macs[6..]);
    buf[6..12].copy_from_slice(&macs[..6]);
    // set_source recomputes from the frame's current source, so rewrite
    // the source first and classify again for the destination.
    if nat::set_source(buf, &ip, dst).is_err() {
        return false;
    }
    let Ok(Frame::Ipv4(ip)) = classify(buf) else {
        return false;
    };
    nat::set_destination(buf, &ip, src).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::{ep, ep_any, frame};

    fn spec(flows: Flows) -> GenSpec {
        GenSpec {
            ifname: "x".into(),
            queues: vec![0],
            cores: vec![],
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_base: Ipv4Addr::new(198, 18, 0, 2).into(),
            src_count: 3,
            dst: ep_any(Ipv4Addr::new(198, 19, 0, 1), 80),
            l4: L4Kind::Udp { payload: 18 },
            flows,
            first: 0,
            rate: None,
            duration: Duration::from_secs(1),
            receive: false,
        }
    }

    #[test]
    fn new_flows_advance_ports_then_addresses_and_fixed_flows_cycle() {
        let s = spec(Flows::New);
        assert_eq!(source_of(&s, 0), ep_any(Ipv4Addr::new(198, 18, 0, 2), 1024));
        assert_eq!(source_of(&s, 1), ep_any(Ipv4Addr::new(198, 18, 0, 2), 1025));
        let next_host = u64::from(PORTS);
        assert_eq!(
            source_of(&s, next_host),
            ep_any(Ipv4Addr::new(198, 18, 0, 3), 1024)
        );
        // Wraps after every address was used.
        assert_eq!(source_of(&s, 3 * next_host), source_of(&s, 0));
        let f = spec(Flows::Fixed(4));
        assert_eq!(source_of(&f, 4), source_of(&f, 0));
        assert_ne!(source_of(&f, 3), source_of(&f, 0));
        // IPv6 sources advance the same way.
        let s6 = GenSpec {
            src_base: "2001:2::2".parse::<Ipv6Addr>().unwrap().into(),
            ..spec(Flows::New)
        };
        assert_eq!(
            source_of(&s6, next_host + 1),
            ep_any("2001:2::3".parse::<Ipv6Addr>().unwrap(), 1025)
        );
    }

    #[test]
    fn an_ipv6_template_gets_each_source_with_a_valid_checksum() {
        let dst = ep_any("2001:2:ff::1".parse::<Ipv6Addr>().unwrap(), 5000);
        let src = ep_any("2001:2::2".parse::<Ipv6Addr>().unwrap(), 1024);
        let l4 = L4Kind::Udp { payload: 18 };
        let t = frame_any([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], src, dst, l4).unwrap();
        let s = GenSpec {
            dst,
            src_base: src.addr,
            ..spec(Flows::New)
        };
        let tpl = Template::of(&t, &s).unwrap();
        let next = ep_any("2001:2::7".parse::<Ipv6Addr>().unwrap(), 4242);
        let mut f = t.clone();
        assert!(tpl.set_source(&mut f, next));
        let want = frame_any([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], next, dst, l4).unwrap();
        // The same frame, but for the hop limit the rewrite decremented.
        assert_eq!(f[..21], want[..21]);
        assert_eq!(f[21], 63);
        assert_eq!(f[22..], want[22..]);
    }

    #[test]
    fn swap_turns_a_frame_around_with_valid_checksums() {
        let (a, b) = (
            ep(Ipv4Addr::new(198, 18, 0, 2), 1234),
            ep(Ipv4Addr::new(198, 18, 1, 10), 9000),
        );
        for l4 in [L4Kind::Udp { payload: 18 }, L4Kind::Tcp { flags: 0x02 }] {
            let mut f = frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], a, b, l4);
            assert!(swap(&mut f));
            let expect = frame([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], b, a, l4);
            assert_eq!(f, expect, "{l4:?}");
        }
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!swap(&mut arp));
    }
}
