//! The XDP steering program on a real veth with a real AF_XDP socket:
//! packets for an owned address reach the socket, IPv4 and IPv6 (and a
//! neighbour solicitation whose target is an owned IPv6 address);
//! everything else (ARP and neighbour discovery for the gateway, ping and
//! TCP to the gateway's own addresses, a router advertisement) reaches
//! the kernel; the program is gone from the interface once dropped. The
//! socket's UMEM is the ports' (`xsk::umem_config`), and every packet sits
//! in its frame where `FrameLayout::of_ports` says.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // an end-to-end test bounds its waits in real time

use std::net::{Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xsk_rs::config::{BindFlags, LibxdpFlags, SocketConfig};
use xsk_rs::{Socket, Umem};
use xvs_config::XdpAttachMode;
use xvs_dataplane::steer::Steering;
use xvs_dataplane::xsk::{umem_config, FrameLayout, XskPort};
use xvs_vm_tests::pages::{page_kib, Reserved};
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{Arms, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0xff, 0, 0, 0, 0, 1);

/// A two-arm topology (one backend, one queue) and its gateway
/// namespace's name, for a thread of the test to enter.
fn two_arm() -> (Topology, String) {
    let t = Topology::build(Spec {
        arms: Arms::Two,
        backends: 1,
        queues: 1,
    })
    .unwrap();
    let gw = t.gateway.name().to_owned();
    (t, gw)
}

/// Sends `requests` UDP datagrams from the client to the VIP, port 53
/// (nobody answers them here: each waits 100 ms, a bounded failure).
fn udp_to_vip(t: &Topology, requests: u32) {
    let n = requests.to_string();
    let _ = t.client.ns.exec(
        TESTNET,
        &[
            "udp",
            "--connect",
            "198.19.0.1:53",
            "--requests",
            &n,
            "--timeout-ms",
            "100",
        ],
    );
}

/// What the socket saw: IPv4 packets to the VIP, ARP about the VIP, the
/// same for the IPv6 VIP (neighbour solicitations whose target is it), and
/// anything else.
#[derive(Debug, Default)]
struct Seen {
    to_vip: u32,
    arp_for_vip: u32,
    to_vip6: u32,
    ns_for_vip6: u32,
    other: u32,
    /// Frames whose packet did not start where [`FrameLayout::of_ports`]
    /// says the kernel puts it (the pipeline bench lays its frames out
    /// by it).
    misplaced: u32,
}

/// Sends one ICMPv6 message (`kind`, then `body` after the 4-byte header)
/// from the client's c0 to `to` with hop limit 255, as neighbour discovery
/// requires (python's raw ICMPv6 socket: the kernel fills the checksum).
fn icmpv6_from_client(t: &Topology, to: &str, kind: u8, body: &[u8]) {
    let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)\n\
         i=socket.if_nametoindex('c0')\n\
         s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)\n\
         s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)\n\
         s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, i)\n\
         s.sendto(bytes([{kind}, 0, 0, 0]) + bytes.fromhex('{hex}'), ('{to}', 0, 0, i))\n"
    );
    t.client.ns.exec("python3", &["-c", &script]).unwrap();
}

#[test]
fn only_owned_traffic_reaches_the_socket() {
    if !privileged("only_owned_traffic_reaches_the_socket") {
        return;
    }
    let (t, gw) = two_arm();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let receiver = std::thread::spawn(move || -> Seen {
        let ns = xvs_vm_tests::netns::Netns::existing(&gw);
        ns.enter_current_thread().unwrap();
        let steering = Steering::attach("gc", XdpAttachMode::Native).unwrap();
        assert!(steering.is_native(), "veth supports native XDP");
        steering.add_address(VIP).unwrap();
        steering.add_address(VIP6).unwrap();

        let (umem, mut descs) =
            Umem::new(umem_config().unwrap(), NonZeroU32::new(64).unwrap(), false).unwrap();
        let cfg = SocketConfig::builder()
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .bind_flags(BindFlags::XDP_COPY)
            .build();
        // SAFETY: the UMEM is not shared and the program-load inhibit flag is set.
        let (_tx, mut rx, fq_cq) =
            unsafe { Socket::new(cfg, &umem, &"gc".parse().unwrap(), 0) }.unwrap();
        let (mut fq, _cq) = fq_cq.unwrap();
        steering.register_socket(0, rx.fd().as_raw_fd()).unwrap();
        // SAFETY: every frame is owned by this thread and handed once.
        unsafe { fq.produce(&descs) };
        ready_tx.send(()).unwrap();

        let mut seen = Seen::default();
        let layout = FrameLayout::of_ports();
        let deadline = Instant::now() + Duration::from_secs(20);
        while stop_rx.try_recv().is_err() && Instant::now() < deadline {
            // SAFETY: descs come from this UMEM; frames are returned to the
            // fill queue right after being read.
            let n = unsafe { rx.poll_and_consume(&mut descs, 100) }.unwrap();
            for d in descs.iter().take(n) {
                if d.addr() % layout.stride != layout.offset {
                    seen.misplaced += 1;
                }
                // SAFETY: `d` was just received on this UMEM's socket.
                let data = unsafe { umem.data(d) };
                let f = data.contents();
                let ethertype = u16::from_be_bytes([f[12], f[13]]);
                let icmp6 = ethertype == 0x86dd && f.len() >= 78 && f[20] == 58;
                match ethertype {
                    0x0800 if f[30..34] == VIP.octets() => seen.to_vip += 1,
                    0x0806 if f[38..42] == VIP.octets() => seen.arp_for_vip += 1,
                    0x86dd if icmp6 && f[54] == 135 && f[62..78] == VIP6.octets() => {
                        seen.ns_for_vip6 += 1
                    }
                    0x86dd if f[38..54] == VIP6.octets() => seen.to_vip6 += 1,
                    _ => seen.other += 1,
                }
            }
            // SAFETY: these frames were consumed above and are no longer read.
            unsafe { fq.produce(&descs[..n]) };
        }
        drop(steering);
        seen
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();

    // The gateway's own address keeps answering ping and TCP (through the kernel).
    t.client
        .ns
        .exec("ping", &["-c", "3", "-i", "0.2", "-W", "2", "198.18.0.1"])
        .unwrap();
    let mut server = t.gateway.command(TESTNET);
    server.args(["serve", "--name", "gw", "--tcp", "198.18.0.1:2222"]);
    let (_server, _) =
        xvs_vm_tests::procs::Spawned::start(server, "gateway server", Duration::from_secs(5))
            .unwrap();
    let out = t
        .client
        .ns
        .exec(
            TESTNET,
            &["tcp", "--connect", "198.18.0.1:2222", "--connections", "20"],
        )
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok=20 failed=0 by=gw:20"
    );
    // UDP to the VIP goes to the socket.
    udp_to_vip(&t, 5);
    // ARP for the VIP, from the client's interface.
    let _ = t
        .client
        .ns
        .exec("arping", &["-c", "2", "-w", "1", "-I", "c0", "198.19.0.1"]);
    // IPv6: the gateway's own address answers ping (the kernel's
    // neighbour discovery and echo); UDP to the IPv6 VIP and a
    // solicitation for it go to the socket; a router advertisement and a
    // solicitation for the gateway's own address go to the kernel.
    t.client
        .ns
        .exec(
            "ping",
            &["-6", "-c", "3", "-i", "0.2", "-W", "2", "2001:2::1"],
        )
        .unwrap();
    let _ = t.client.ns.exec(
        TESTNET,
        &[
            "udp",
            "--connect",
            "[2001:2:ff::1]:53",
            "--requests",
            "4",
            "--timeout-ms",
            "100",
        ],
    );
    let mac = t.client.ns.mac("c0").unwrap();
    let ns_for = |target: Ipv6Addr| {
        let mut body = vec![0u8; 4];
        body.extend(target.octets());
        body.extend([1, 1]);
        body.extend(mac);
        body
    };
    icmpv6_from_client(&t, "ff02::1:ff00:1", 135, &ns_for(VIP6));
    icmpv6_from_client(
        &t,
        "ff02::1:ff00:1",
        135,
        &ns_for("2001:2::1".parse().unwrap()),
    );
    // A router advertisement: hop limit 64, no flags, lifetime 0, no
    // options.
    icmpv6_from_client(&t, "ff02::1", 134, &[64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    std::thread::sleep(Duration::from_millis(300));
    stop_tx.send(()).unwrap();
    let seen = receiver.join().unwrap();

    assert_eq!(seen.to_vip, 5, "{seen:?}");
    assert_eq!(seen.arp_for_vip, 2, "{seen:?}");
    assert_eq!(seen.to_vip6, 4, "{seen:?}");
    assert_eq!(seen.ns_for_vip6, 1, "{seen:?}");
    assert_eq!(
        seen.other, 0,
        "only owned traffic reaches the socket: {seen:?}"
    );
    assert_eq!(seen.misplaced, 0, "{:?}: {seen:?}", FrameLayout::of_ports());
    // The program is detached once the steering handle is dropped.
    let link = t.gateway.ip(&["-d", "link", "show", "gc"]).unwrap().stdout;
    let link = String::from_utf8_lossy(&link);
    assert!(!link.contains("prog/xdp"), "program left on gc:\n{link}");
}

/// A queue whose socket just closed is bound again at once, as a daemon
/// restarted after `kill -9` binds the queues its predecessor held: the
/// kernel releases a closed socket's hold on its queue in deferred work,
/// and a bind before that work ran used to fail with EBUSY ("cannot
/// start the data plane"). 40 closes and binds back to back, copy mode
/// and the zero-copy-else-copy default alike. A queue an open socket
/// holds is still refused, with the kernel's reason.
#[test]
fn a_queue_is_bound_again_right_after_its_socket_closes() {
    if !privileged("a_queue_is_bound_again_right_after_its_socket_closes") {
        return;
    }
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let (_t, gw) = two_arm(); // the topology lives until the test ends
    let binds = std::thread::spawn(move || -> Result<u32, String> {
        xvs_vm_tests::netns::Netns::existing(&gw)
            .enter_current_thread()
            .map_err(|e| e.to_string())?;
        let mut bound = 0;
        for i in 0..40 {
            let zero_copy = if i % 2 == 0 { Some(false) } else { None };
            let port =
                XskPort::open(&["gc"], 0, zero_copy).map_err(|e| format!("bind {i}: {e}"))?;
            drop(port);
            bound += 1;
        }
        // A queue held by an open socket is not taken: the bind gives up
        // after its bounded wait and says why, with the kernel's errno.
        let held = XskPort::open(&["gc"], 0, Some(false)).map_err(|e| e.to_string())?;
        let second = XskPort::open(&["gc"], 0, Some(false)).map(|_| ());
        drop(held);
        let refused = second.err().map(|e| e.to_string()).unwrap_or_default();
        if !refused.ends_with("Device or resource busy (os error 16)") {
            return Err(format!("a held queue: {refused:?}"));
        }
        Ok(bound)
    });
    assert_eq!(binds.join().unwrap(), Ok(40));
}

/// The id of the XDP program attached to the gateway's `gc`, as
/// `ip -d link` shows it.
fn attached_id(t: &Topology) -> Option<u32> {
    let out = t.gateway.ip(&["-d", "link", "show", "gc"]).unwrap().stdout;
    let link = String::from_utf8_lossy(&out).into_owned();
    let at = link.find("prog/xdp id ")? + "prog/xdp id ".len();
    link[at..].split_whitespace().next()?.parse().ok()
}

/// A start whose look at the interface goes stale before it attaches
/// looks again and applies the rules to what is there now: the program
/// it found was detached (a stopped xvs's hold window ended and its
/// guard released it) → it attaches afresh; another xvs took the
/// interface over → it replaces that one. Each is landed in the gap
/// between the look and the attach, where a successor starting as the
/// guard's window ended used to fail with "cannot replace program N:
/// File exists".
#[test]
fn an_attach_whose_look_goes_stale_looks_again() {
    if !privileged("an_attach_whose_look_goes_stale_looks_again") {
        return;
    }
    let (t, gw) = two_arm();
    // Per attach: (what it took over, its looks, its program id); and
    // the id of the program landed in the second gap.
    type Seen = (Vec<(Option<u32>, u32, u32)>, u32);
    let ids = std::thread::spawn(move || -> Result<Seen, String> {
        xvs_vm_tests::netns::Netns::existing(&gw)
            .enter_current_thread()
            .map_err(|e| e.to_string())?;
        let native = XdpAttachMode::Native;
        let kept = || -> Result<u32, String> {
            let mut s = Steering::attach("gc", native).map_err(|e| e.to_string())?;
            s.keep_attached();
            s.program_id().ok_or("no id".to_owned())
        };
        let mut seen = Vec::new();
        // Released in the gap.
        let first = kept()?;
        let mut second = Steering::load("gc").map_err(|e| e.to_string())?;
        let mut looks = 0;
        let takeover = second
            .attach_mode_with_gap(native, || {
                looks += 1;
                if looks == 1 {
                    let gone = xvs_dataplane::steer::release("gc", Some(first));
                    assert_eq!(gone.unwrap(), Some(first), "the guard's release");
                }
            })
            .map_err(|e| format!("after a release: {e}"))?;
        seen.push((takeover.previous, looks, second.program_id().unwrap_or(0)));
        second.keep_attached();
        drop(second);
        // Replaced by another xvs in the gap.
        let mut third = Steering::load("gc").map_err(|e| e.to_string())?;
        let mut looks = 0;
        let mut successor = 0;
        let takeover = third
            .attach_mode_with_gap(native, || {
                looks += 1;
                if looks == 1 {
                    successor = kept().unwrap();
                }
            })
            .map_err(|e| format!("after a takeover: {e}"))?;
        seen.push((takeover.previous, looks, third.program_id().unwrap_or(0)));
        Ok((seen, successor))
    });
    let (seen, successor) = ids.join().unwrap().unwrap();
    let (previous, looks, second) = seen[0];
    assert_eq!(
        (previous, looks),
        (None, 2),
        "after the release, a second look found nothing to take over"
    );
    let (previous, looks, third) = seen[1];
    assert_eq!(
        (previous, looks),
        (Some(successor), 2),
        "the second look found the successor's program and replaced it"
    );
    assert_ne!(second, third);
    // The third handle dropped with the thread: it detached its program.
    assert_eq!(attached_id(&t), None, "the last program is gone");
}

/// Held by the tests here that open [`XskPort`]s: each tries for huge
/// pages, and the huge-page test counts them exactly.
static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// With 2 MiB pages reserved (`vm.nr_hugepages`), a port's UMEM is on
/// them, as the kernel's own account of the mapping says, and a packet
/// to an owned address arrives in one of its frames, where
/// `FrameLayout::of_ports` says. With exactly one port's pages free:
/// a port opened right after the one holding them closes (a restarted
/// daemon's worker) waits for the kernel to free them and gets them
/// (it used to fall back to 4 KiB pages for its whole life); another
/// port, with none left, falls back to 4 KiB pages.
#[test]
fn a_port_s_umem_is_on_huge_pages_when_some_are_reserved() {
    if !privileged("a_port_s_umem_is_on_huge_pages_when_some_are_reserved") {
        return;
    }
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    // Eight 2 MiB pages a port (16 MiB of frames).
    let _reserved = Reserved::exactly_free(8);
    let (t, gw) = two_arm();
    let (ready_tx, ready_rx) = mpsc::channel();
    type Pages = (Option<u64>, Option<u64>, Option<u64>);
    let receiver = std::thread::spawn(move || -> Result<(Pages, u32), String> {
        xvs_vm_tests::netns::Netns::existing(&gw)
            .enter_current_thread()
            .map_err(|e| e.to_string())?;
        let open = |ifname: &str| {
            let port = XskPort::open(&[ifname], 0, Some(false)).map_err(|e| e.to_string())?;
            let kib = page_kib(port.umem_addr());
            if port.has_huge_pages() != (kib == Some(2048)) {
                return Err(format!(
                    "{ifname}: huge pages {}, {kib:?} KiB",
                    port.has_huge_pages()
                ));
            }
            Ok((port, kib))
        };
        // The pages of a port just closed are freed in the kernel's
        // deferred work, after its queue: a port on another queue (here,
        // of the other interface) is not held back by the queue and must
        // wait for the pages themselves.
        let (first, first_kib) = open("gb")?;
        drop(first);
        let (mut port, kib) = open("gc")?;
        // None left.
        let (_other, other_kib) = open("gb")?;
        let steering = Steering::attach("gc", XdpAttachMode::Native).map_err(|e| e.to_string())?;
        steering.add_address(VIP).map_err(|e| e.to_string())?;
        steering
            .register_socket(0, port.fd(0))
            .map_err(|e| e.to_string())?;
        ready_tx.send(()).map_err(|e| e.to_string())?;
        let layout = FrameLayout::of_ports();
        let mut rx = vec![xsk_rs::FrameDesc::default(); 64];
        let mut to_vip = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while to_vip == 0 && Instant::now() < deadline {
            port.refill();
            let n = port.receive(0, &mut rx);
            for d in &mut rx[..n] {
                if d.addr() % layout.stride != layout.offset {
                    return Err(format!("a frame at {}", d.addr()));
                }
                // SAFETY: a frame just received on this port, referenced
                // nowhere else.
                let ours = unsafe {
                    port.with_frame(d, |f, len| {
                        len >= 34 && f[12..14] == [8, 0] && f[30..34] == VIP.octets()
                    })
                };
                to_vip += u32::from(ours);
            }
            port.release(&rx[..n]);
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(steering);
        Ok(((first_kib, kib, other_kib), to_vip))
    });
    if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
        panic!("the ports did not open: {:?}", receiver.join());
    }
    udp_to_vip(&t, 5);
    let (pages, to_vip) = receiver.join().unwrap().unwrap();
    assert_eq!(
        pages,
        (Some(2048), Some(2048), Some(4)),
        "KiB pages: the first port, the one opened right after it closed, the one with none left"
    );
    assert!(to_vip > 0, "no packet to the VIP reached the port");
}
