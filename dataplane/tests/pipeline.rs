//! The per-packet pipeline on byte fixtures: new flow to a backend with
//! SNAT, the reply back to the client, ICMP errors of the flow, ARP and
//! echo answers, REJECT when no backend is eligible, and a counted drop
//! for everything else; the counters always add up.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

#[path = "fixtures/fixtures.rs"]
mod fixtures;

use std::net::Ipv4Addr;
use std::sync::Arc;

use fixtures::*;
use support::{config, looked_up, rr_service, run};
use xvs_config::{PortRange, Protocol, Service, ServiceKey};
use xvs_dataplane::pipeline::{Pipeline, PipelineConfig, Side, Verdict};
use xvs_dataplane::services::CompiledService;
use xvs_dataplane::wire::{classify, DropReason, Frame, L4};

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const BACKEND: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
const SNAT: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);

fn service(port: u16, proto: Protocol, backend_port: u16, weight: u32) -> Service<Ipv4Addr> {
    rr_service(VIP, proto, port, &[(BACKEND, backend_port, weight)])
}

fn pipeline() -> Pipeline {
    let mut p = Pipeline::new(
        PipelineConfig {
            snat_addrs: vec![SNAT],
            ..config()
        },
        0,
    );
    p.own(VIP);
    p.upsert_service(Arc::new(CompiledService::new(
        1,
        &service(80, Protocol::Tcp, 8080, 1),
        1,
        None,
    )));
    p.upsert_service(Arc::new(CompiledService::new(
        2,
        &service(53, Protocol::Udp, 5353, 1),
        1,
        None,
    )));
    p
}

/// A pipeline of `cfg` with one full-NAT TCP service (VIP:80 to the
/// backend's 8080), the backend's Ethernet address already learnt.
fn web_pipeline(cfg: PipelineConfig) -> Pipeline {
    let mut p = Pipeline::new(cfg, 0);
    p.own(VIP);
    p.upsert_service(Arc::new(CompiledService::new(
        1,
        &service(80, Protocol::Tcp, 8080, 1),
        1,
        None,
    )));
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    p
}

fn assert_counters_add_up(p: &Pipeline) {
    let c = p.counters();
    assert_eq!(
        c.rx,
        c.forwarded + c.answered + c.consumed + c.dropped(),
        "{c:?}"
    );
}

#[test]
fn a_tcp_flow_through_full_nat_and_back() {
    let mut p = pipeline();
    assert_eq!(run(&mut p, ARP_REPLY_FROM_BACKEND, 0).0, Verdict::Consumed);
    let (v, out) = run(&mut p, TCP_SYN, 1);
    assert_eq!(
        v,
        Verdict::Forward {
            len: TCP_SYN_FORWARDED.len(),
            to: Side::Backend
        }
    );
    assert_eq!(out, TCP_SYN_FORWARDED);
    let (v, out) = run(&mut p, TCP_REPLY, 1);
    assert_eq!(
        v,
        Verdict::Forward {
            len: TCP_REPLY_FORWARDED.len(),
            to: Side::Client
        }
    );
    assert_eq!(out, TCP_REPLY_FORWARDED);
    assert_eq!(p.counters().new_flows, 1);
    assert_eq!(p.v4.table.len(), 1);
    // The service's global counts saw one inactive (SYN_RECV) flow.
    let slot = p.v4.services.by_id(1).unwrap();
    assert_eq!(
        (slot.svc.counts.active(0), slot.svc.counts.inactive(0)),
        (0, 1)
    );
    assert_counters_add_up(&p);
}

#[test]
fn icmp_errors_of_a_flow_are_translated_to_the_client() {
    let mut p = pipeline();
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    run(&mut p, TCP_SYN, 1);
    let (v, out) = run(&mut p, ICMP_FRAG_NEEDED_TCP8, 2);
    assert!(
        matches!(
            v,
            Verdict::Forward {
                to: Side::Client,
                ..
            }
        ),
        "{v:?}"
    );
    let Ok(Frame::Ipv4(ip)) = classify(&out) else {
        panic!()
    };
    assert_eq!((ip.src, ip.dst, ip.ttl), (VIP, CLIENT, 63));
    let L4::IcmpError(e) = ip.l4 else { panic!() };
    assert_eq!(
        (e.inner.src, e.inner.src_port, e.inner.dst, e.inner.dst_port),
        (CLIENT, 40_000, VIP, 80)
    );
    assert_eq!(&out[0..6], &[2, 0, 0, 0, 0, 1], "to the client's MAC");
    // An error about no flow is dropped, counted.
    let mut q = pipeline();
    assert_eq!(
        run(&mut q, ICMP_FRAG_NEEDED_UDP, 2).0,
        Verdict::Drop(DropReason::IcmpErrorNoFlow)
    );
}

#[test]
fn arp_and_echo_are_answered_for_owned_addresses() {
    let mut p = pipeline();
    let (v, out) = run(&mut p, ARP_REQUEST, 0);
    assert_eq!(v, Verdict::Answer(ARP_REPLY.len()));
    assert_eq!(out, ARP_REPLY);
    let (v, out) = run(&mut p, ICMP_ECHO_REQUEST, 0);
    assert_eq!(v, Verdict::Answer(ICMP_ECHO_REPLY.len()));
    assert_eq!(out, ICMP_ECHO_REPLY);
    p.disown(VIP);
    assert_eq!(
        run(&mut p, ARP_REQUEST, 0).0,
        Verdict::Drop(DropReason::ArpNotOwned)
    );
    assert_eq!(
        run(&mut p, ICMP_ECHO_REQUEST, 0).0,
        Verdict::Drop(DropReason::NotOwned)
    );
    assert_counters_add_up(&p);
}

#[test]
fn no_eligible_backend_is_rejected_like_kube_proxy() {
    let mut p = pipeline();
    p.upsert_service(Arc::new(CompiledService::new(
        3,
        &service(80, Protocol::Tcp, 8080, 0),
        1,
        None,
    )));
    p.upsert_service(Arc::new(CompiledService::new(
        4,
        &service(53, Protocol::Udp, 5353, 0),
        1,
        None,
    )));
    let (v, out) = run(&mut p, TCP_SYN, 0);
    assert_eq!(v, Verdict::Answer(TCP_RST_FOR_SYN.len()));
    assert_eq!(out, TCP_RST_FOR_SYN);
    let (v, out) = run(&mut p, UDP, 0);
    assert_eq!(v, Verdict::Answer(ICMP_PORT_UNREACHABLE.len()));
    assert_eq!(out, ICMP_PORT_UNREACHABLE);
    assert_eq!(p.counters().rejected, 2);
    assert!(p.v4.table.is_empty());
    assert_counters_add_up(&p);
}

#[test]
fn everything_else_is_a_counted_drop() {
    let mut p = pipeline();
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    // A TCP segment without SYN for no flow.
    assert_eq!(
        run(&mut p, TCP_64, 0).0,
        Verdict::Drop(DropReason::TcpNoFlow)
    );
    assert_eq!(p.v4.table.stats().invalid, 1);
    // A reply to the SNAT address for no flow.
    assert_eq!(
        run(&mut p, TCP_REPLY, 0).0,
        Verdict::Drop(DropReason::ReplyNoFlow)
    );
    // No service on the port.
    p.v4.services.remove(&ServiceKey {
        vip: VIP,
        protocol: Protocol::Udp,
        port: 53,
    });
    assert_eq!(run(&mut p, UDP, 0).0, Verdict::Drop(DropReason::NoService));
    // Fragments, malformed frames.
    assert_eq!(
        run(&mut p, UDP_LATER_FRAGMENT, 0).0,
        Verdict::Drop(DropReason::Fragment)
    );
    assert_eq!(
        run(&mut p, BAD_IPV4_CHECKSUM, 0).0,
        Verdict::Drop(DropReason::Ipv4BadChecksum)
    );
    assert_counters_add_up(&p);
    let c = p.counters();
    assert_eq!(c.drops[DropReason::Fragment.index()], 1);
}

#[test]
fn an_unresolved_backend_is_held_untouched_and_arp_requested() {
    let mut p = pipeline();
    // The SYN is left as it came, to hold and run again (the worker's
    // job); not counted until then.
    let mut held = TCP_SYN.to_vec();
    held.resize(2048, 0);
    assert_eq!(p.process(&mut held, TCP_SYN.len(), 0), Verdict::Unresolved);
    assert_eq!(&held[..TCP_SYN.len()], TCP_SYN, "untouched");
    assert_eq!(p.counters().rx, 0);
    let queued: Vec<std::net::IpAddr> = std::iter::from_fn(|| p.next_arp()).collect();
    assert_eq!(queued, [BACKEND]);
    let mut buf = [0u8; 64];
    let len = p.build_arp_request(&mut buf, BACKEND.into()).unwrap();
    let Ok(Frame::Arp(arp)) = classify(&buf[..len]) else {
        panic!()
    };
    assert_eq!((arp.sender_ip, arp.target_ip), (SNAT, BACKEND));
    // Once the backend answers, the held SYN goes through, counted once.
    run(&mut p, ARP_REPLY_FROM_BACKEND, 1);
    assert_eq!(
        p.process(&mut held, TCP_SYN.len(), 1),
        Verdict::Forward {
            len: TCP_SYN_FORWARDED.len(),
            to: Side::Backend
        }
    );
    assert_eq!(&held[..TCP_SYN_FORWARDED.len()], TCP_SYN_FORWARDED);
    assert_eq!((p.counters().rx, p.counters().forwarded), (2, 1));
    assert_counters_add_up(&p);
}

/// The backend's Ethernet address a flow's packets go to follows the
/// neighbour table: an ARP reply or the backend's own reply from a new
/// address moves the flow's next packets there (the address cached in
/// the backend's counter line does not outlive a change).
#[test]
fn a_backend_that_moves_to_another_mac_gets_the_next_packets_there() {
    let mut p = pipeline();
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    let first: [u8; 6] = ARP_REPLY_FROM_BACKEND[6..12].try_into().unwrap();
    let dst_mac = |out: &[u8]| -> [u8; 6] { out[..6].try_into().unwrap() };
    let (v, out) = run(&mut p, TCP_SYN, 1);
    assert!(matches!(v, Verdict::Forward { .. }));
    assert_eq!(dst_mac(&out), first);
    // Again, now from the cache.
    assert_eq!(dst_mac(&run(&mut p, TCP_SYN, 1).1), first);
    // An ARP reply from another address.
    let moved = [0x02, 0, 0, 0, 0x77, 0x01];
    let mut arp = ARP_REPLY_FROM_BACKEND.to_vec();
    arp[6..12].copy_from_slice(&moved);
    arp[22..28].copy_from_slice(&moved);
    assert_eq!(run(&mut p, &arp, 1).0, Verdict::Consumed);
    let (v, out) = run(&mut p, TCP_SYN, 1);
    assert!(matches!(v, Verdict::Forward { .. }));
    assert_eq!(dst_mac(&out), moved);
    // The backend's reply from a third address teaches it too.
    let third = [0x02, 0, 0, 0, 0x77, 0x02];
    let mut reply = TCP_REPLY.to_vec();
    reply[6..12].copy_from_slice(&third);
    assert!(matches!(run(&mut p, &reply, 1).0, Verdict::Forward { .. }));
    assert_eq!(dst_mac(&run(&mut p, TCP_SYN, 1).1), third);
    // And its replies from the cached address change nothing.
    let generation = p.neighbour_generation();
    run(&mut p, &reply, 1);
    assert_eq!(p.neighbour_generation(), generation);
    assert_counters_add_up(&p);
}

#[test]
fn a_held_frame_given_up_is_counted_as_unresolved() {
    use xvs_dataplane::pipeline::Prepared;
    let mut p = pipeline();
    let mut buf = TCP_SYN.to_vec();
    assert_eq!(p.process(&mut buf, TCP_SYN.len(), 0), Verdict::Unresolved);
    p.give_up(&Prepared::of(TCP_SYN), 3);
    let c = p.counters();
    assert_eq!(c.drops[DropReason::NextHopUnresolved.index()], 1);
    assert_eq!(c.rx, 1);
    assert_counters_add_up(&p);
}

/// A batch looked up before any of it is processed: a flow the batch
/// itself creates (SYN, then its reply) is found when its turn comes.
#[test]
fn a_batch_looked_up_together_sees_flows_it_creates() {
    use xvs_dataplane::pipeline::{Lookup, NO_SERVICE};
    let mut p = pipeline();
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    let frames = [TCP_SYN, TCP_REPLY];
    let (prepared, looked) = looked_up(&mut p, &frames);
    // The VIP and the SNAT address are both owned; the SYN names its
    // service, the reply none.
    assert!(
        matches!(
            looked[..],
            [
                Lookup::Miss { owned: true, service, .. },
                Lookup::Miss { owned: true, service: NO_SERVICE, .. }
            ] if service != NO_SERVICE
        ),
        "both miss before processing: {looked:?}"
    );
    // Fetching ahead changes nothing.
    for j in 0..prepared.len() {
        p.prefetch_ahead(&prepared, &looked, j);
    }
    let sent = forward_batch(&mut p, &frames, &prepared, &looked);
    assert_eq!(sent, [TCP_SYN_FORWARDED, TCP_REPLY_FORWARDED]);
    // Looked up now, the reply hits.
    let (_, looked) = looked_up(&mut p, &[TCP_REPLY]);
    assert!(matches!(looked[0], Lookup::Hit(..)));
    // A VIP given up while its service stays (the runtime never does
    // that: it disowns a VIP after its last service is gone) is still
    // addressed to the gateway, for the service names it: batched or
    // one at a time, its new flows are forwarded.
    p.disown(VIP);
    let syn = syn_from(50_001);
    let (prepared, looked) = looked_up(&mut p, &[&syn]);
    assert!(
        matches!(looked[..], [Lookup::Miss { owned: true, service, .. }] if service != NO_SERVICE),
        "{looked:?}"
    );
    let mut buf = syn.clone();
    let v = p.process_prepared(Side::Client, &mut buf, 1, &prepared[0], looked[0]);
    assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
    let mut buf = syn_from(50_002);
    let len = buf.len();
    assert!(matches!(
        p.process(&mut buf, len, 1),
        Verdict::Forward { .. }
    ));
    // Its services gone too, the next new flow misses as not owned, and
    // is dropped as such, batched or not.
    for (protocol, port) in [(Protocol::Tcp, 80), (Protocol::Udp, 53)] {
        p.remove_service(&ServiceKey {
            vip: VIP.into(),
            protocol,
            port,
        });
    }
    let syn = syn_from(50_003);
    let (prepared, looked) = looked_up(&mut p, &[&syn]);
    assert!(
        matches!(
            looked[..],
            [Lookup::Miss {
                owned: false,
                service: NO_SERVICE,
                ..
            }]
        ),
        "{looked:?}"
    );
    let mut buf = syn.clone();
    let v = p.process_prepared(Side::Client, &mut buf, 1, &prepared[0], looked[0]);
    assert_eq!(v, Verdict::Drop(DropReason::NotOwned));
    let mut buf = syn_from(50_004);
    let len = buf.len();
    assert_eq!(
        p.process(&mut buf, len, 1),
        Verdict::Drop(DropReason::NotOwned)
    );
    assert_counters_add_up(&p);
}

/// A new flow of a batch probes the index for its own key once (the
/// batch's lookup), not again when processed, unless a frame before it
/// inserted a key that may be its own: the same new UDP flow twice in one
/// batch (a burst) is one flow, its second packet found, not a second
/// insert refused.
#[test]
fn a_batch_s_new_flow_is_probed_once_and_its_repeat_is_found() {
    let mut p = pipeline();
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    let syns = [syn_from(50_001), syn_from(50_002), syn_from(50_003)];
    let (prepared, looked) = looked_up(&mut p, &syns);
    let before = p.conntrack_stats();
    forward_batch(&mut p, &syns, &prepared, &looked);
    let after = p.conntrack_stats();
    // Per flow: one SNAT probe (its reply key), no second own-key probe.
    assert_eq!(
        (after.insert - before.insert, after.miss - before.miss),
        (3, 3)
    );
    let frames = [UDP, UDP];
    let (prepared, looked) = looked_up(&mut p, &frames);
    let before = p.conntrack_stats();
    let sent = forward_batch(&mut p, &frames, &prepared, &looked);
    let after = p.conntrack_stats();
    assert_eq!(sent[0], sent[1], "both packets of the flow leave alike");
    assert_eq!(
        (after.insert - before.insert, after.found - before.found),
        (1, 1),
        "{after:?}"
    );
    assert_eq!(after.insert_failed, before.insert_failed);
    assert_eq!(p.flows(), 4);
    assert_counters_add_up(&p);
}

/// The batch lookup keeps its working arrays from batch to batch: a batch
/// reads only what it wrote itself (a reply to the SNAT address, which
/// names no service, after a batch of SYNs that each named one).
#[test]
fn a_batch_lookup_reads_nothing_an_earlier_batch_left() {
    use xvs_dataplane::pipeline::{Lookup, NO_SERVICE};
    let mut p = pipeline();
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    let syns = [syn_from(50_001), syn_from(50_002), syn_from(50_003)];
    let (_, looked) = looked_up(&mut p, &syns);
    assert!(looked.iter().all(names_a_service), "{looked:?}");
    let (_, looked) = looked_up(&mut p, &[TCP_REPLY]);
    assert!(
        matches!(
            looked[..],
            [Lookup::Miss {
                owned: true,
                service: NO_SERVICE,
                ..
            }]
        ),
        "{looked:?}"
    );
    let stats = p.conntrack_stats();
    assert_eq!(stats.miss, 4, "{stats:?}");
}

/// A hit looked up before its flow was deleted (`conntrack -D`) and its
/// slot taken by another flow is not trusted: the packet is looked up
/// again and starts a flow of its own, instead of being sent as the
/// slot's new flow.
#[test]
fn a_hit_whose_slot_another_flow_took_is_looked_up_again() {
    use xvs_dataplane::pipeline::{Lookup, Prepared};
    let mut p = pipeline();
    run(&mut p, ARP_REPLY_FROM_BACKEND, 0);
    let (x, y) = (syn_from(50_001), syn_from(50_002));
    forward_batch(&mut p, &[&x], &[Prepared::of(&x)], &[Lookup::NotYet]);
    let (prepared, looked) = looked_up(&mut p, &[&x]);
    assert!(matches!(looked[0], Lookup::Hit(..)), "{looked:?}");
    let all = xvs_conntrack::Filter::default();
    assert_eq!(
        p.delete_matching(&all, xvs_config::Family::V4, 0, u32::MAX)
            .0,
        1
    );
    // The freed slot is the next one taken.
    let sent_y = forward_batch(&mut p, &[&y], &[Prepared::of(&y)], &[Lookup::NotYet]);
    assert_eq!(p.flows(), 1);
    let sent_x = forward_batch(&mut p, &[&x], &prepared, &looked);
    assert_eq!(p.flows(), 2, "the stale hit started a flow of its own");
    assert_ne!(source_of(&sent_x[0]), source_of(&sent_y[0]));
    assert_counters_add_up(&p);
}

/// ipvsadm's all-ports service (`-A -t VIP:0 -p`) beside a port-80 one on
/// the same VIP: port 80 stays the port-80 service's, any other port goes
/// to the port-0 service's backend on the port the client asked for, the
/// same through a batch's staged lookup and one frame at a time; once the
/// port-0 service is gone, the other port has no service.
#[test]
fn a_port_0_service_takes_every_port_its_vip_does_not_serve_otherwise() {
    use smoltcp::wire::{IpAddress, TcpPacket};
    use xvs_config::{Persistence, ServiceKey};
    const OTHER: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
    let mut p = pipeline();
    for i in [1, 2] {
        let mut arp = ARP_REPLY_FROM_BACKEND.to_vec();
        arp[31] = i; // the sender's address: 198.18.1.i
        p.process(&mut arp, ARP_REPLY_FROM_BACKEND.len(), 0);
    }
    let mut all = rr_service(VIP, Protocol::Tcp, 0, &[(OTHER, 0, 1)]);
    all.persistence = Some(Persistence {
        timeout_secs: 300,
        netmask: Ipv4Addr::BROADCAST,
    });
    p.upsert_service(Arc::new(CompiledService::new(3, &all, 1, None)));
    // A SYN from `src_port` to VIP:`dst_port`.
    let syn = |src_port: u16, dst_port: u16| {
        let mut f = syn_from(src_port);
        let l4 = 14 + usize::from(f[14] & 0x0f) * 4;
        f[l4 + 2..l4 + 4].copy_from_slice(&dst_port.to_be_bytes());
        let mut t = TcpPacket::new_unchecked(&mut f[l4..]);
        t.fill_checksum(&IpAddress::Ipv4(CLIENT), &IpAddress::Ipv4(VIP));
        f
    };
    // The forwarded frame's destination.
    let to = |f: &[u8]| {
        let Ok(Frame::Ipv4(ip)) = classify(f) else {
            panic!("not IPv4")
        };
        let L4::Tcp { dst_port, .. } = ip.l4 else {
            panic!("{:?}", ip.l4)
        };
        (ip.dst, dst_port)
    };
    // Batched: both name a service, and each goes to its own.
    let frames = [syn(40_001, 80), syn(40_002, 8443)];
    let (prepared, looked) = looked_up(&mut p, &frames);
    assert!(looked.iter().all(names_a_service), "{looked:?}");
    let sent = forward_batch(&mut p, &frames, &prepared, &looked);
    let sent: Vec<_> = sent.iter().map(|f| to(f)).collect();
    assert_eq!(sent, [(BACKEND, 8080), (OTHER, 8443)]);
    // One at a time: the same answers.
    for (dst_port, want) in [(80, (BACKEND, 8080)), (9000, (OTHER, 9000))] {
        let mut buf = syn(41_000 + dst_port % 1000, dst_port);
        let len = buf.len();
        let Verdict::Forward { len, .. } = p.process(&mut buf, len, 1) else {
            panic!("port {dst_port}")
        };
        assert_eq!(to(&buf[..len]), want);
    }
    // Without the port-0 service, only port 80 is served.
    p.remove_service(&ServiceKey {
        vip: VIP.into(),
        protocol: Protocol::Tcp,
        port: 0,
    });
    let mut buf = syn(42_000, 8443);
    let len = buf.len();
    assert_eq!(
        p.process(&mut buf, len, 2),
        Verdict::Drop(DropReason::NoService)
    );
    let mut buf = syn(42_001, 80);
    let len = buf.len();
    assert!(matches!(
        p.process(&mut buf, len, 2),
        Verdict::Forward { .. }
    ));
    assert_counters_add_up(&p);
}

/// A miss to an owned address that names a service: a new flow's.
fn names_a_service(l: &xvs_dataplane::pipeline::Lookup) -> bool {
    use xvs_dataplane::pipeline::{Lookup, NO_SERVICE};
    matches!(l, Lookup::Miss { owned: true, service, .. } if *service != NO_SERVICE)
}

/// A batch's frames, looked up ahead (`looked`), processed in order at
/// time 1: each one's forwarded bytes (any other verdict fails the test).
fn forward_batch<F: AsRef<[u8]>>(
    p: &mut Pipeline,
    frames: &[F],
    prepared: &[xvs_dataplane::pipeline::Prepared],
    looked: &[xvs_dataplane::pipeline::Lookup],
) -> Vec<Vec<u8>> {
    let items = frames.iter().zip(prepared).zip(looked);
    items
        .map(|((f, prep), look)| {
            let f = f.as_ref();
            let mut buf = vec![0u8; 2048];
            buf[..f.len()].copy_from_slice(f);
            let v = p.process_prepared(Side::Client, &mut buf, 1, prep, *look);
            let Verdict::Forward { len, .. } = v else {
                panic!("{v:?}")
            };
            buf.truncate(len);
            buf
        })
        .collect()
}

/// TCP_SYN from another client port.
fn syn_from(port: u16) -> Vec<u8> {
    syn_from_client(CLIENT, port)
}

/// The source endpoint of a forwarded frame.
fn source_of(frame: &[u8]) -> (Ipv4Addr, u16) {
    let Ok(Frame::Ipv4(ip)) = classify(frame) else {
        panic!("not IPv4")
    };
    match ip.l4 {
        L4::Tcp { src_port, .. } | L4::Udp { src_port, .. } => (ip.src, src_port),
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_snat_address_adds_the_port_slice_and_replies_find_their_flow() {
    const SNAT2: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);
    let mut p = web_pipeline(PipelineConfig {
        snat_addrs: vec![SNAT, SNAT2],
        snat_ports: PortRange {
            first: 2000,
            last: 2001,
        },
        capacity: 64,
        ..config()
    });
    // Two addresses x two ports: four flows to the one backend, each
    // from its own SNAT endpoint, the second address once the first's
    // ports are taken.
    let mut used = Vec::new();
    let mut forwarded = Vec::new();
    for client_port in 40_000..40_004 {
        let (v, out) = run(&mut p, &syn_from(client_port), 1);
        assert!(
            matches!(
                v,
                Verdict::Forward {
                    to: Side::Backend,
                    ..
                }
            ),
            "{v:?}"
        );
        used.push(source_of(&out));
        forwarded.push(out);
    }
    assert_eq!(
        used,
        vec![(SNAT, 2000), (SNAT, 2001), (SNAT2, 2000), (SNAT2, 2001)]
    );
    // The fifth finds nothing free: all four are half-open, so the oldest
    // gives its endpoint (counted); ESTABLISHED ones never would.
    let (v, out) = run(&mut p, &syn_from(40_004), 1);
    assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
    assert_eq!(source_of(&out), (SNAT, 2000));
    assert_eq!(p.v4.table.stats().reclaim, 1);
    // The backend's reply to the second address reaches the third client.
    let mut reply = forwarded[2].clone();
    let (src, dst) = (reply[26..30].to_vec(), reply[30..34].to_vec());
    reply[26..30].copy_from_slice(&dst);
    reply[30..34].copy_from_slice(&src);
    let (sp, dp) = (reply[34..36].to_vec(), reply[36..38].to_vec());
    reply[34..36].copy_from_slice(&dp);
    reply[36..38].copy_from_slice(&sp);
    reply[47] = 0x12; // SYN-ACK
    assert_eq!(source_of(&reply), (BACKEND, 8080));
    let mut snat2 = [0u8; 4];
    snat2.copy_from_slice(&reply[30..34]);
    assert_eq!(Ipv4Addr::from(snat2), SNAT2);
    // The IPv4 header checksum is symmetric under the swap; the reply is
    // addressed to SNAT2, which the pipeline owns.
    let (v, out) = run(&mut p, &reply, 1);
    assert!(
        matches!(
            v,
            Verdict::Forward {
                to: Side::Client,
                ..
            }
        ),
        "{v:?}"
    );
    assert_eq!(source_of(&out), (VIP, 80));
    let Ok(Frame::Ipv4(ip)) = classify(&out) else {
        panic!()
    };
    assert!(
        matches!(
            ip.l4,
            L4::Tcp {
                dst_port: 40_002,
                ..
            }
        ),
        "{:?}",
        ip.l4
    );
    assert_eq!(
        p.snat_port_of(&xvs_dataplane::pipeline::Prepared::of(&reply)),
        Some(2000)
    );
    assert_counters_add_up(&p);
}

/// Flow synchronisation between two gateways with the same services:
/// what the active one records of its flow, installed on the backup,
/// makes the backup forward the flow's packets in both directions byte
/// for byte as the active one does; and the backup's copy is never sent
/// back.
#[test]
fn a_peer_s_synced_flow_is_served_byte_for_byte() {
    use xvs_conntrack::FlowState;
    use xvs_dataplane::sync::{Op, SyncQueue};
    let (mut active, mut backup) = (pipeline(), pipeline());
    let (qa, qb) = (Arc::new(SyncQueue::new(64)), Arc::new(SyncQueue::new(64)));
    active.set_sync(Some(qa.clone()));
    backup.set_sync(Some(qb.clone()));
    for p in [&mut active, &mut backup] {
        run(p, ARP_REPLY_FROM_BACKEND, 0);
    }
    assert_eq!(run(&mut active, TCP_SYN, 1).1, TCP_SYN_FORWARDED);
    assert!(qa.is_empty(), "staged until the batch ends");
    active.flush_sync();
    let records: Vec<_> = std::iter::from_fn(|| qa.pop().map(|(_, r)| r)).collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (records[0].op, records[0].state),
        (Op::Update, FlowState::SynRecv)
    );
    assert_eq!(backup.apply_sync(&records, 2), (1, 0));
    // The backup now serves both directions exactly as the active does.
    let (on_active, on_backup) = (
        run(&mut active, TCP_REPLY, 3),
        run(&mut backup, TCP_REPLY, 3),
    );
    assert_eq!(on_backup, on_active);
    assert_eq!(on_backup.1, TCP_REPLY_FORWARDED);
    let (on_active, on_backup) = (run(&mut active, TCP_64, 3), run(&mut backup, TCP_64, 3));
    assert!(
        matches!(on_backup.0, Verdict::Forward { .. }),
        "{:?}",
        on_backup.0
    );
    assert_eq!(on_backup, on_active);
    // The active's state changes follow; the backup's copy says nothing.
    active.flush_sync();
    backup.flush_sync();
    let more: Vec<_> = std::iter::from_fn(|| qa.pop().map(|(_, r)| r)).collect();
    assert!(more.iter().all(|r| r.op == Op::Update), "{more:?}");
    assert_eq!(backup.apply_sync(&more, 3).1, 0);
    assert!(qb.is_empty(), "a peer's flow is never sent back");
    let c = backup.counters();
    assert_eq!((c.synced, c.new_flows), (1 + more.len() as u64, 0));
    assert_counters_add_up(&backup);
}

/// A record for a service or backend the gateway does not have, or that
/// would replace a flow of its own, is skipped and counted.
#[test]
fn peer_records_that_do_not_fit_are_skipped() {
    use xvs_dataplane::sync::SyncQueue;
    let (mut active, mut other) = (pipeline(), pipeline());
    let q = Arc::new(SyncQueue::new(64));
    active.set_sync(Some(q.clone()));
    for p in [&mut active, &mut other] {
        run(p, ARP_REPLY_FROM_BACKEND, 0);
    }
    run(&mut active, TCP_SYN, 1);
    active.flush_sync();
    let r = q.pop().unwrap().1;
    // Its own flow for the same client is in the way.
    run(&mut other, TCP_SYN, 1);
    let mut elsewhere = r;
    elsewhere.snat.port += 1;
    assert_eq!(other.apply_sync(&[elsewhere], 2), (0, 1));
    let mut unknown = r;
    unknown.vip.port = 81;
    let mut gone = r;
    gone.backend.addr = "198.18.1.99".parse().unwrap();
    assert_eq!(other.apply_sync(&[unknown, gone], 2), (0, 2));
    assert_eq!(other.counters().sync_skipped, 3);
}

/// A takeover's announcement of an IPv4 address: a gratuitous ARP, a
/// broadcast request for the address from itself, as keepalived sends.
#[test]
fn a_gratuitous_arp_announces_a_taken_address() {
    use xvs_dataplane::wire::ArpOp;
    let p = pipeline();
    let mut buf = [0u8; 64];
    let n = p
        .build_announcement(&mut buf, SNAT.into(), Side::Backend)
        .unwrap();
    assert_eq!(&buf[0..6], &[0xff; 6], "broadcast");
    let Ok(Frame::Arp(arp)) = classify(&buf[..n]) else {
        panic!("not ARP")
    };
    assert_eq!(arp.op, ArpOp::Request);
    assert_eq!((arp.sender_ip, arp.target_ip), (SNAT, SNAT));
    assert_eq!(arp.sender_mac.0, support::GW_MAC);
}

/// `TCP_SYN` from `client`:`port` (checksums made right again).
fn syn_from_client(client: Ipv4Addr, port: u16) -> Vec<u8> {
    use smoltcp::wire::{IpAddress, Ipv4Packet, TcpPacket};
    let mut f = TCP_SYN.to_vec();
    let ihl = usize::from(f[14] & 0x0f) * 4;
    f[26..30].copy_from_slice(&client.octets());
    Ipv4Packet::new_unchecked(&mut f[14..14 + ihl]).fill_checksum();
    let l4 = 14 + ihl;
    f[l4..l4 + 2].copy_from_slice(&port.to_be_bytes());
    let mut t = TcpPacket::new_unchecked(&mut f[l4..]);
    t.fill_checksum(&IpAddress::Ipv4(client), &IpAddress::Ipv4(VIP));
    f
}

/// A persistent service (per /24) on two gateways: the active's template
/// goes with its flow, so on the backup a new connection of the same
/// client goes where the template says, not where the backup's own rr
/// would send it; a delete record ends the backup's copy of a flow, and
/// never a flow of its own.
#[test]
fn a_peer_s_template_and_delete_records_are_applied() {
    use xvs_config::{Family, Persistence};
    use xvs_conntrack::{Filter, FlowState};
    use xvs_dataplane::sync::{Op, SyncQueue};
    let b = |i: u8| (Ipv4Addr::new(198, 18, 1, i), 8080, 1);
    let mut svc = rr_service(VIP, Protocol::Tcp, 80, &[b(1), b(2), b(3)]);
    svc.persistence = Some(Persistence {
        timeout_secs: 600,
        netmask: Ipv4Addr::new(255, 255, 255, 0),
    });
    let gateway = || {
        let mut p = Pipeline::new(
            PipelineConfig {
                snat_addrs: vec![SNAT],
                ..config()
            },
            0,
        );
        p.own(VIP);
        p.upsert_service(Arc::new(CompiledService::new(1, &svc, 1, None)));
        for i in 1..=3 {
            let mut arp = ARP_REPLY_FROM_BACKEND.to_vec();
            arp[31] = i; // the sender's address: 198.18.1.i
            p.process(&mut arp, ARP_REPLY_FROM_BACKEND.len(), 0);
        }
        p
    };
    let flows = |p: &Pipeline| p.dump(&Filter::default(), Family::V4, 0, u32::MAX, 3).0;
    let (mut active, mut backup) = (gateway(), gateway());
    let q = Arc::new(SyncQueue::new(64));
    // Another client's network takes the active's first backend.
    run(
        &mut active,
        &syn_from_client(Ipv4Addr::new(198, 18, 5, 99), 1000),
        1,
    );
    active.set_sync(Some(q.clone()));
    assert!(matches!(
        run(&mut active, &syn_from(1000), 1).0,
        Verdict::Forward { .. }
    ));
    assert!(q.is_empty(), "staged until the batch ends");
    active.flush_sync();
    let records: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, r)| r)).collect();
    assert_eq!(records.len(), 2, "the flow and its template: {records:?}");
    let (flow, template) = (records[0], records[1]);
    assert_eq!(template.state, FlowState::Template);
    assert_eq!(
        template.backend.addr,
        std::net::IpAddr::from(Ipv4Addr::new(198, 18, 1, 2))
    );
    assert_eq!(backup.apply_sync(&records, 2), (2, 0));
    // The same client's next connection, on the backup: the template's
    // backend (the backup's own rr would start at the first).
    let v = run(&mut backup, &syn_from(2000), 2).0;
    assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
    let mine = flows(&backup)
        .into_iter()
        .find(|f| f.client.port == 2000)
        .unwrap();
    assert_eq!(mine.backend.addr, template.backend.addr);
    // A delete ends the peer's flow on the backup...
    let delete = |mut r: xvs_dataplane::sync::SyncRecord| {
        r.op = Op::Delete;
        r
    };
    assert_eq!(backup.apply_sync(&[delete(flow)], 3), (1, 0));
    assert!(!flows(&backup).iter().any(|f| f.client.port == 1000));
    // ...and never one of the backup's own.
    let mut own = flow;
    own.client.port = 2000;
    own.backend = mine.backend;
    own.snat = mine.snat;
    assert_eq!(backup.apply_sync(&[delete(own)], 3), (0, 1));
    assert!(flows(&backup).iter().any(|f| f.client.port == 2000));
}

/// A new flow's SNAT port is found with one probe of the flow index while
/// the range has room in the cursor's order: the cursor meets the
/// endpoint used longest ago, which a flow deleted since has freed.
/// Sixteen ports, twelve flows (endpoints 0 to 11), the first four
/// deleted (`conntrack -D`): the next eight new flows take endpoints 12
/// to 15, then 0 to 3 again, each with exactly two index misses (its own
/// key, then the one SNAT endpoint it probes).
#[test]
fn a_new_flow_probes_one_snat_endpoint_while_the_range_has_room() {
    let mut p = web_pipeline(PipelineConfig {
        snat_addrs: vec![SNAT],
        snat_ports: PortRange {
            first: 2000,
            last: 2015,
        },
        ..config()
    });
    let client = |i: u8| Ipv4Addr::new(198, 18, 0, 100 + i);
    let new_flow = |p: &mut Pipeline, i: u8| {
        let misses = p.conntrack_stats().miss;
        let mut buf = syn_from_client(client(i), 40_000);
        let len = buf.len();
        let v = p.process(&mut buf, len, 1);
        assert!(matches!(v, Verdict::Forward { .. }), "{v:?}");
        (source_of(&buf).1, p.conntrack_stats().miss - misses)
    };
    for i in 0..12 {
        assert_eq!(new_flow(&mut p, i), (2000 + u16::from(i), 2));
    }
    for i in 0..4 {
        let filter = xvs_conntrack::Filter::<std::net::IpAddr> {
            client: Some(client(i).into()),
            ..xvs_conntrack::Filter::default()
        };
        let (deleted, _) = p.delete_matching(&filter, xvs_config::Family::V4, 0, u32::MAX);
        assert_eq!(deleted, 1);
    }
    let ports: Vec<(u16, u64)> = (12..20).map(|i| new_flow(&mut p, i)).collect();
    let expected: Vec<(u16, u64)> = (2012..2016)
        .chain(2000..2004)
        .map(|port| (port, 2))
        .collect();
    assert_eq!(ports, expected);
    assert_eq!(p.flows(), 16);
    assert_counters_add_up(&p);
}
