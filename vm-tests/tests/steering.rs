//! The XDP steering program on a real veth with a real AF_XDP socket:
//! packets for an owned address reach the socket; everything else (ARP
//! for the gateway, ping and TCP to the gateway's own address) reaches the
//! kernel; the program is gone from the interface once dropped.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // an end-to-end test bounds its waits in real time

use std::net::Ipv4Addr;
use std::num::NonZeroU32;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xsk_rs::config::{BindFlags, LibxdpFlags, SocketConfig, UmemConfig};
use xsk_rs::{Socket, Umem};
use xvs_config::XdpAttachMode;
use xvs_dataplane::steer::Steering;
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{Arms, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);

/// What the socket saw: IPv4 packets to the VIP, ARP about the VIP, and
/// anything else.
#[derive(Debug, Default)]
struct Seen {
    to_vip: u32,
    arp_for_vip: u32,
    other: u32,
}

#[test]
fn only_owned_traffic_reaches_the_socket() {
    if !privileged("only_owned_traffic_reaches_the_socket") {
        return;
    }
    let t = Topology::build(Spec {
        arms: Arms::Two,
        backends: 1,
        queues: 1,
    })
    .unwrap();
    let gw = t.gateway.name().to_owned();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let receiver = std::thread::spawn(move || -> Seen {
        let ns = xvs_vm_tests::netns::Netns::existing(&gw);
        ns.enter_current_thread().unwrap();
        let steering = Steering::attach("gc", XdpAttachMode::Native).unwrap();
        assert!(steering.is_native(), "veth supports native XDP");
        steering.add_address(VIP).unwrap();

        let (umem, mut descs) =
            Umem::new(UmemConfig::default(), NonZeroU32::new(64).unwrap(), false).unwrap();
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
        let deadline = Instant::now() + Duration::from_secs(20);
        while stop_rx.try_recv().is_err() && Instant::now() < deadline {
            // SAFETY: descs come from this UMEM; frames are returned to the
            // fill queue right after being read.
            let n = unsafe { rx.poll_and_consume(&mut descs, 100) }.unwrap();
            for d in descs.iter().take(n) {
                // SAFETY: `d` was just received on this UMEM's socket.
                let data = unsafe { umem.data(d) };
                let f = data.contents();
                let ethertype = u16::from_be_bytes([f[12], f[13]]);
                match ethertype {
                    0x0800 if f[30..34] == VIP.octets() => seen.to_vip += 1,
                    0x0806 if f[38..42] == VIP.octets() => seen.arp_for_vip += 1,
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
    // UDP to the VIP goes to the socket (nobody answers it here: bounded failures).
    let _ = t.client.ns.exec(
        TESTNET,
        &[
            "udp",
            "--connect",
            "198.19.0.1:53",
            "--requests",
            "5",
            "--timeout-ms",
            "100",
        ],
    );
    // ARP for the VIP, from the client's interface.
    let _ = t
        .client
        .ns
        .exec("arping", &["-c", "2", "-w", "1", "-I", "c0", "198.19.0.1"]);
    std::thread::sleep(Duration::from_millis(300));
    stop_tx.send(()).unwrap();
    let seen = receiver.join().unwrap();

    assert_eq!(seen.to_vip, 5, "{seen:?}");
    assert_eq!(seen.arp_for_vip, 2, "{seen:?}");
    assert_eq!(
        seen.other, 0,
        "only owned traffic reaches the socket: {seen:?}"
    );
    // The program is detached once the steering handle is dropped.
    let link = t.gateway.ip(&["-d", "link", "show", "gc"]).unwrap().stdout;
    let link = String::from_utf8_lossy(&link);
    assert!(!link.contains("prog/xdp"), "program left on gc:\n{link}");
}
