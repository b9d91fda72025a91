//! The flow table on a virtual clock: lookups in both directions, TCP
//! lifecycles, every timeout, early drop, persistence templates, chunked
//! dump and delete, and exact counters over a million flows.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::net::Ipv4Addr;

use xvs_conntrack::tcp_flags::{ACK, FIN, RST, SYN};
use xvs_conntrack::{
    Direction, Endpoint, Filter, FlowKey, FlowRef, FlowState, FlowTable, InsertError, L4Proto,
    NewFlow, Observer, Packet, Removal, Stats, Timeouts,
};

/// Per-backend (active, inactive) counts as the schedulers would keep them,
/// and every removal.
#[derive(Default)]
struct Counts {
    conns: HashMap<u32, (i64, i64)>,
    removed: Vec<(Endpoint, Removal)>,
}

impl Observer for Counts {
    fn conn_counts(&mut self, _service: u32, backend: u32, a: i32, i: i32) {
        let c = self.conns.entry(backend).or_default();
        c.0 += i64::from(a);
        c.1 += i64::from(i);
    }
    fn removed(&mut self, flow: FlowRef<'_>, why: Removal) {
        self.removed.push((flow.client(), why));
    }
}

fn ep(a: [u8; 4], port: u16) -> Endpoint {
    Endpoint {
        addr: Ipv4Addr::from(a),
        port,
    }
}

fn new_flow(n: u32, proto: L4Proto) -> NewFlow {
    NewFlow {
        client: ep([198, 18, (n >> 16) as u8, (n >> 8) as u8], n as u16),
        vip: ep([198, 19, 0, 1], 80),
        backend: ep([198, 18, 1, 1 + (n % 3) as u8], 8080),
        snat: ep(
            [198, 18, 2 + (n / 60_000) as u8, 1],
            (n % 60_000) as u16 + 1024,
        ),
        proto,
        service: 7,
        backend_id: n % 3,
        client_mac: [2, 0, 0, 0, 0, 1],
        plan: 0,
        one_way: false,
    }
}

fn syn() -> Packet {
    Packet {
        tcp_flags: SYN,
        len: 60,
    }
}

fn flags(f: u8) -> Packet {
    Packet {
        tcp_flags: f,
        len: 52,
    }
}

#[test]
fn both_directions_find_one_entry() {
    let mut t = FlowTable::new(16, Timeouts::default(), 0);
    let f = new_flow(1, L4Proto::Tcp);
    let id = t.insert(&f, syn(), 0, &mut ()).unwrap();
    let orig = FlowKey::between(f.client, f.vip, L4Proto::Tcp);
    let reply = FlowKey::between(f.backend, f.snat, L4Proto::Tcp);
    assert_eq!(t.lookup(&orig), Some((id, Direction::Original)));
    assert_eq!(t.lookup(&reply), Some((id, Direction::Reply)));
    assert_eq!(t.lookup(&orig.reversed()), None);
    let s = t.stats();
    assert_eq!((s.insert, s.found, s.miss), (1, 2, 1));
    // The same flow cannot be inserted twice, nor one reusing its reply key.
    assert_eq!(t.insert(&f, syn(), 0, &mut ()), Err(InsertError::Exists));
    let mut g = new_flow(2, L4Proto::Tcp);
    g.snat = f.snat;
    g.backend = f.backend;
    assert_eq!(t.insert(&g, syn(), 0, &mut ()), Err(InsertError::Exists));
    assert_eq!(t.stats().insert_failed, 2);
    t.check_invariants().unwrap();
}

/// A batch's lookups answer as one lookup per key does, counters
/// included, on either side of the cache-resident size (the stages
/// without their prefetches at most `CACHE_RESIDENT_FLOWS` flows, with
/// them beyond).
#[test]
fn batched_lookups_equal_single_ones_below_and_above_the_cache_resident_size() {
    for flows in [100, xvs_conntrack::CACHE_RESIDENT_FLOWS + 1000] {
        let mut t = FlowTable::new(flows + 16, Timeouts::default(), 0);
        for n in 0..flows {
            // A service per flow: `on_hit` must name each hit's own.
            let f = NewFlow {
                service: n,
                ..new_flow(n, L4Proto::Tcp)
            };
            t.insert(&f, syn(), 0, &mut ()).unwrap();
        }
        assert_eq!(
            t.is_cache_resident(),
            flows <= xvs_conntrack::CACHE_RESIDENT_FLOWS
        );
        // Originals, replies and misses (a flow's key reversed, and flows
        // never inserted), interleaved, in batches longer than one chunk.
        let keys: Vec<FlowKey> = (0..flows + 200)
            .flat_map(|n| {
                let f = new_flow(n, L4Proto::Tcp);
                let orig = FlowKey::between(f.client, f.vip, L4Proto::Tcp);
                let reply = FlowKey::between(f.backend, f.snat, L4Proto::Tcp);
                [orig, reply, orig.reversed()]
            })
            .collect();
        let before = t.stats();
        let want: Vec<_> = keys.iter().map(|k| t.lookup(k)).collect();
        let single = t.stats();
        let mut got = vec![None; keys.len()];
        let mut hashes = vec![0; keys.len()];
        let mut named = Vec::new();
        t.lookup_batch_with(&keys, &mut got, &mut hashes, |s| named.push(s));
        let batched = t.stats();
        assert_eq!(got, want, "{flows} flows");
        // `on_hit` named every hit's service, in order, and nothing else.
        let services: Vec<u32> = got
            .iter()
            .flatten()
            .map(|&(id, _)| t.flow(id).service())
            .collect();
        assert_eq!(named, services, "{flows} flows");
        assert_eq!(named.len() as u32, 2 * flows);
        let hashed: Vec<u64> = keys.iter().map(|k| t.key_hash(k)).collect();
        assert_eq!(hashes, hashed, "{flows} flows");
        assert_eq!(
            got.iter().flatten().count() as u32,
            2 * flows,
            "{flows} flows"
        );
        assert_eq!(
            (batched.found - single.found, batched.miss - single.miss),
            (single.found - before.found, single.miss - before.miss),
            "{flows} flows"
        );
    }
}

/// The release epoch moves when an entry is freed (removed or expired),
/// and only then: packets and inserts leave it, so a lookup result taken
/// at the current epoch still holds.
#[test]
fn the_epoch_moves_only_when_an_entry_is_freed() {
    let mut t = FlowTable::new(16, Timeouts::default(), 0);
    let e0 = t.epoch();
    let tcp = t
        .insert(&new_flow(1, L4Proto::Tcp), syn(), 0, &mut ())
        .unwrap();
    let udp = new_flow(2, L4Proto::Udp);
    t.insert(&udp, Packet::default(), 0, &mut ()).unwrap();
    t.on_packet(tcp, Direction::Reply, flags(SYN | ACK), 1, &mut ());
    t.advance(1, u32::MAX, &mut ());
    assert_eq!(
        t.epoch(),
        e0,
        "inserts, packets and an advance that frees nothing"
    );
    t.remove(tcp, &mut ());
    let e1 = t.epoch();
    assert_ne!(e1, e0, "a removal");
    t.advance(1000, u32::MAX, &mut ());
    let key = FlowKey::between(udp.client, udp.vip, L4Proto::Udp);
    assert_eq!(t.lookup(&key), None, "the UDP flow expired");
    assert_ne!(t.epoch(), e1, "an expiry");
}

/// A key a batch lookup missed stays "absent since" the lookup's mark
/// until an insert could have made it present: its own flow's (by either
/// key), not another's in general, and never a removal; a later batch
/// lookup that follows an insert takes a new mark.
#[test]
fn a_batch_miss_stays_absent_until_its_key_is_inserted() {
    let mut t = FlowTable::new(1024, Timeouts::default(), 0);
    let flows: Vec<NewFlow> = (0..40).map(|n| new_flow(n, L4Proto::Udp)).collect();
    let orig = |f: &NewFlow| FlowKey::between(f.client, f.vip, L4Proto::Udp);
    let reply = |f: &NewFlow| FlowKey::between(f.backend, f.snat, L4Proto::Udp);
    let keys: Vec<FlowKey> = flows.iter().flat_map(|f| [orig(f), reply(f)]).collect();
    let (mut out, mut hashes) = (vec![None; keys.len()], vec![0; keys.len()]);
    let mark = t.lookup_batch(&keys, &mut out, &mut hashes);
    assert!(out.iter().all(Option::is_none));
    assert!(hashes.iter().all(|&h| t.absent_since(mark, h)));
    // The first flow inserted: both its keys are no longer certain
    // absences; of the other 78 keys, few look inserted (one shared bit).
    t.insert(&flows[0], Packet::default(), 0, &mut ()).unwrap();
    assert!(!t.absent_since(mark, hashes[0]) && !t.absent_since(mark, hashes[1]));
    let other = hashes[2..]
        .iter()
        .filter(|&&h| !t.absent_since(mark, h))
        .count();
    assert!(other <= 2, "{other} of 78 other keys look inserted");
    // A removal adds nothing; a new batch lookup starts afresh.
    let id = t.lookup(&orig(&flows[0])).unwrap().0;
    t.remove(id, &mut ());
    assert!(!t.absent_since(mark, hashes[0]), "still since the old mark");
    let again = t.lookup_batch(&keys, &mut out, &mut hashes);
    assert_ne!(again, mark, "an insert came between the two lookups");
    assert!(hashes.iter().all(|&h| t.absent_since(again, h)));
    assert!(!t.absent_since(mark, hashes[5]), "the old mark is stale");
    // With nothing inserted between them, two lookups share a mark.
    assert_eq!(t.lookup_batch(&keys, &mut out, &mut hashes), again);
}

#[test]
fn insert_new_tracks_a_flow_whose_keys_the_caller_checked() {
    let mut t = FlowTable::new(16, Timeouts::default(), 0);
    let f = new_flow(3, L4Proto::Udp);
    let orig = FlowKey::between(f.client, f.vip, L4Proto::Udp);
    let reply = FlowKey::between(f.backend, f.snat, L4Proto::Udp);
    assert_eq!(t.lookup(&orig), None);
    assert_eq!(t.lookup(&reply), None);
    let hashes = [t.key_hash(&orig), t.key_hash(&reply)];
    let id = t
        .insert_new(&f, hashes, Packet::default(), 0, &mut ())
        .unwrap();
    assert_eq!(t.lookup(&orig), Some((id, Direction::Original)));
    assert_eq!(t.lookup(&reply), Some((id, Direction::Reply)));
    t.check_invariants().unwrap();
}

#[test]
fn a_flow_keeps_its_forwarding_plan_tag() {
    let mut t = FlowTable::new(16, Timeouts::default(), 0);
    let mut f = new_flow(4, L4Proto::Tcp);
    f.plan = 3;
    let id = t.insert(&f, syn(), 0, &mut ()).unwrap();
    let g = new_flow(5, L4Proto::Tcp);
    let other = t.insert(&g, syn(), 0, &mut ()).unwrap();
    assert_eq!(t.flow(id).plan(), 3);
    assert_eq!(t.flow(other).plan(), 0);
    // The tag is not part of the key: lookups find the flow whatever it is.
    let orig = FlowKey::between(f.client, f.vip, L4Proto::Tcp);
    assert_eq!(t.lookup(&orig), Some((id, Direction::Original)));
}

#[test]
fn tcp_lifecycle_reports_active_and_inactive() {
    let mut t = FlowTable::new(16, Timeouts::default(), 0);
    let mut c = Counts::default();
    let f = new_flow(1, L4Proto::Tcp);
    let id = t.insert(&f, syn(), 0, &mut c).unwrap();
    assert_eq!(t.flow(id).state(), FlowState::SynRecv);
    assert_eq!(c.conns[&1], (0, 1), "a new flow is inactive");
    t.on_packet(id, Direction::Reply, flags(SYN | ACK), 1, &mut c);
    assert_eq!(
        t.on_packet(id, Direction::Original, flags(ACK), 1, &mut c)
            .1,
        FlowState::Established
    );
    assert_eq!(c.conns[&1], (1, 0), "ESTABLISHED is active");
    assert_eq!(
        t.on_packet(id, Direction::Original, flags(FIN | ACK), 2, &mut c),
        (FlowState::Established, FlowState::CloseWait)
    );
    assert_eq!(c.conns[&1], (0, 1));
    t.on_packet(id, Direction::Reply, flags(FIN | ACK), 2, &mut c);
    assert_eq!(t.flow(id).state(), FlowState::TimeWait);
    assert_eq!(t.flow(id).packets(), [3, 2]);
    assert_eq!(t.flow(id).bytes(), [60 + 52 + 52, 52 + 52]);
    t.check_invariants().unwrap();
    t.advance(2 + 120, 1_000, &mut c);
    assert!(t.is_empty());
    assert_eq!(c.conns[&1], (0, 0));
    assert_eq!(c.removed, vec![(f.client, Removal::Expired)]);
}

/// Drives a new TCP flow at time 0 into `state` with the given packets.
fn flow_in_state(t: &mut FlowTable, pkts: &[(Direction, u8)], state: FlowState) -> FlowKey {
    let f = new_flow(9, L4Proto::Tcp);
    let id = t.insert(&f, syn(), 0, &mut ()).unwrap();
    for &(dir, fl) in pkts {
        t.on_packet(id, dir, flags(fl), 0, &mut ());
    }
    assert_eq!(t.flow(id).state(), state);
    FlowKey::between(f.client, f.vip, L4Proto::Tcp)
}

#[test]
fn every_reachable_state_expires_after_its_timeout() {
    use Direction::{Original as In, Reply as Out};
    // Distinct timeouts, so an entry filed under the wrong one is caught.
    let t = Timeouts {
        established: 11,
        syn_sent: 12,
        syn_recv: 13,
        fin_wait: 14,
        time_wait: 15,
        close: 16,
        close_wait: 17,
        last_ack: 18,
        synack: 19,
        udp: 20,
        icmp: 21,
        syn_recv_pressure: 22,
    };
    type Case = (&'static [(Direction, u8)], FlowState, u32);
    let cases: &[Case] = &[
        (&[], FlowState::SynRecv, 13),
        (&[(In, ACK)], FlowState::Established, 11),
        (&[(In, ACK), (Out, FIN)], FlowState::FinWait, 14),
        (&[(In, ACK), (Out, FIN), (Out, SYN)], FlowState::SynSent, 12),
        (&[(In, ACK), (In, FIN)], FlowState::CloseWait, 17),
        (&[(In, ACK), (In, FIN), (Out, FIN)], FlowState::TimeWait, 15),
        (&[(In, ACK), (In, RST)], FlowState::Close, 16),
        // A RST does not move SYN_RECV (IPVS).
        (&[(In, RST)], FlowState::SynRecv, 13),
    ];
    for &(pkts, state, secs) in cases {
        let mut table = FlowTable::new(8, t, 0);
        let key = flow_in_state(&mut table, pkts, state);
        table.advance(secs - 1, u32::MAX, &mut ());
        assert!(table.lookup(&key).is_some(), "{state:?} expired early");
        table.advance(secs, u32::MAX, &mut ());
        assert!(
            table.lookup(&key).is_none(),
            "{state:?} did not expire at {secs}"
        );
        assert_eq!(table.stats().expire, 1);
    }
    // UDP and ICMP.
    for (proto, secs) in [(L4Proto::Udp, 20), (L4Proto::Icmp, 21)] {
        let mut table = FlowTable::new(8, t, 0);
        let f = new_flow(3, proto);
        table.insert(&f, Packet::default(), 0, &mut ()).unwrap();
        table.advance(secs - 1, u32::MAX, &mut ());
        assert_eq!(table.len(), 1);
        table.advance(secs, u32::MAX, &mut ());
        assert_eq!(table.len(), 0, "{proto:?}");
    }
}

#[test]
fn packets_refresh_and_state_changes_refile() {
    let mut t = FlowTable::new(8, Timeouts::default(), 0);
    let f = new_flow(1, L4Proto::Tcp);
    let id = t.insert(&f, syn(), 0, &mut ()).unwrap();
    t.on_packet(id, Direction::Original, flags(ACK), 0, &mut ());
    // A packet at 800 moves the deadline to 1700 (900 s ESTABLISHED).
    t.on_packet(id, Direction::Original, flags(ACK), 800, &mut ());
    t.advance(1699, u32::MAX, &mut ());
    assert_eq!(t.len(), 1);
    // A RST at 1699 makes it CLOSE: 10 s, not the 900 s it was filed for.
    t.on_packet(id, Direction::Reply, flags(RST), 1699, &mut ());
    t.advance(1708, u32::MAX, &mut ());
    assert_eq!(t.len(), 1);
    t.advance(1709, u32::MAX, &mut ());
    assert_eq!(t.len(), 0);
    t.check_invariants().unwrap();
}

#[test]
fn advance_does_bounded_work() {
    let mut t = FlowTable::new(1000, Timeouts::default(), 0);
    for n in 0..1000 {
        t.insert(&new_flow(n, L4Proto::Udp), Packet::default(), 0, &mut ())
            .unwrap();
    }
    // All 1000 expire at 300; with a budget of 64 it takes many calls.
    let mut calls = 0;
    loop {
        calls += 1;
        let a = t.advance(300, 64, &mut ());
        assert!(a.expired <= 64);
        t.check_invariants().unwrap();
        if a.done {
            break;
        }
    }
    assert!(t.is_empty());
    assert!(calls >= 1000 / 64, "{calls} calls");
}

#[test]
fn full_table_early_drops_the_oldest_non_established() {
    let mut t = FlowTable::new(4, Timeouts::default(), 0);
    let mut c = Counts::default();
    let ids: Vec<_> = (0..4)
        .map(|n| {
            t.insert(&new_flow(n, L4Proto::Tcp), syn(), n, &mut c)
                .unwrap()
        })
        .collect();
    // Flow 0 becomes ESTABLISHED: it is never a victim.
    t.on_packet(ids[0], Direction::Original, flags(ACK), 4, &mut c);
    // Flow 2 goes ESTABLISHED then back: it is now the newest non-ESTABLISHED.
    t.on_packet(ids[2], Direction::Original, flags(ACK), 4, &mut c);
    t.on_packet(ids[2], Direction::Original, flags(FIN), 5, &mut c);
    // Victims in order: 1, 3, 2.
    for (n, victim) in [(10, 1), (11, 3), (12, 2)] {
        t.insert(&new_flow(n, L4Proto::Tcp), syn(), 6, &mut c)
            .unwrap();
        assert_eq!(
            c.removed.last(),
            Some(&(new_flow(victim, L4Proto::Tcp).client, Removal::EarlyDropped))
        );
        t.check_invariants().unwrap();
    }
    // Now 0 (ESTABLISHED) and 10, 11, 12 (SYN_RECV): 10 goes next.
    t.insert(&new_flow(13, L4Proto::Tcp), syn(), 7, &mut c)
        .unwrap();
    assert_eq!(
        c.removed.last().unwrap().0,
        new_flow(10, L4Proto::Tcp).client
    );
    let s = t.stats();
    assert_eq!((s.early_drop, s.table_full, s.drop), (4, 4, 0));
}

#[test]
fn full_table_of_established_flows_refuses_and_counts() {
    let mut t = FlowTable::new(3, Timeouts::default(), 0);
    for n in 0..3 {
        let id = t
            .insert(&new_flow(n, L4Proto::Tcp), syn(), 0, &mut ())
            .unwrap();
        t.on_packet(id, Direction::Original, flags(ACK), 0, &mut ());
    }
    for n in 3..10 {
        assert_eq!(
            t.insert(&new_flow(n, L4Proto::Tcp), syn(), 1, &mut ()),
            Err(InsertError::TableFull)
        );
    }
    let s = t.stats();
    assert_eq!((s.insert, s.table_full, s.drop, s.early_drop), (3, 7, 7, 0));
    assert_eq!(t.len(), 3);
    t.check_invariants().unwrap();
}

#[test]
fn persistence_templates() {
    let mut t = FlowTable::new(8, Timeouts::default(), 0);
    let vip = ep([198, 19, 0, 1], 443);
    let net = Ipv4Addr::new(198, 18, 0, 0);
    let key = FlowTable::template_key(net, vip, L4Proto::Tcp);
    assert_eq!(t.template_lookup(&key, 0), None);
    let b = ep([198, 18, 1, 2], 8443);
    t.template_set(&key, 7, 2, b, 300, 0, &mut ()).unwrap();
    assert_eq!(t.template_lookup(&key, 299), Some((2, b)));
    // A new connection at 200 refreshes it to 500.
    t.template_set(&key, 7, 2, b, 300, 200, &mut ()).unwrap();
    t.advance(499, u32::MAX, &mut ());
    assert_eq!(t.template_lookup(&key, 499), Some((2, b)));
    // A real flow with client port 0 is not the template.
    assert_eq!(t.lookup(&key), None);
    t.advance(500, u32::MAX, &mut ());
    assert_eq!(t.template_lookup(&key, 500), None);
    assert!(t.is_empty());
    assert_eq!(t.stats().expire, 1);
    t.check_invariants().unwrap();
}

#[test]
fn templates_are_not_early_dropped_nor_counted_as_connections() {
    let mut t = FlowTable::new(2, Timeouts::default(), 0);
    let mut c = Counts::default();
    let key = FlowTable::template_key(
        Ipv4Addr::new(198, 18, 0, 0),
        ep([198, 19, 0, 1], 80),
        L4Proto::Tcp,
    );
    t.template_set(&key, 1, 5, ep([198, 18, 1, 5], 80), 300, 0, &mut c)
        .unwrap();
    t.insert(&new_flow(1, L4Proto::Tcp), syn(), 0, &mut c)
        .unwrap();
    t.insert(&new_flow(2, L4Proto::Tcp), syn(), 0, &mut c)
        .unwrap();
    assert!(
        t.template_lookup(&key, 1).is_some(),
        "the flow was dropped, not the template"
    );
    assert!(!c.conns.contains_key(&5));
    t.check_invariants().unwrap();
}

/// A table for 100 flows holding flows 0 to 59 ([`new_flow`]), each
/// after its SYN.
fn sixty_handshakes() -> FlowTable {
    let mut t = FlowTable::new(100, Timeouts::default(), 0);
    for n in 0..60 {
        t.insert(&new_flow(n, L4Proto::Tcp), syn(), 0, &mut ())
            .unwrap();
    }
    t
}

#[test]
fn dump_and_delete_in_chunks_with_filters() {
    let mut t = FlowTable::new(100, Timeouts::default(), 0);
    for n in 0..60 {
        let id = t
            .insert(&new_flow(n, L4Proto::Tcp), syn(), 0, &mut ())
            .unwrap();
        if n % 2 == 0 {
            t.on_packet(id, Direction::Original, flags(ACK), 0, &mut ());
        }
    }
    let backend1 = Filter {
        backend: Some(Ipv4Addr::new(198, 18, 1, 2)),
        ..Filter::default()
    };
    let mut out = Vec::new();
    let mut cursor = Some(0);
    let mut chunks = 0;
    while let Some(c) = cursor {
        cursor = t.dump(&backend1, c, 7, 10, &mut out);
        chunks += 1;
    }
    assert_eq!(chunks, 100usize.div_ceil(7));
    assert_eq!(out.len(), 20);
    assert!(out
        .iter()
        .all(|f| f.backend.addr == Ipv4Addr::new(198, 18, 1, 2)));
    let established = Filter {
        state: Some(FlowState::Established),
        ..Filter::default()
    };
    let mut est = Vec::new();
    t.dump(&established, 0, 1000, 10, &mut est);
    assert_eq!(est.len(), 30);
    assert_eq!(est[0].expires_in, 890);

    // conntrack -D with a filter, chunked; then a flush.
    let (mut deleted, mut cursor) = (0, Some(0));
    while let Some(c) = cursor {
        let (d, next) = t.delete_matching(&backend1, c, 9, &mut ());
        deleted += d;
        cursor = next;
    }
    assert_eq!((deleted, t.len()), (20, 40));
    let (flushed, _) = t.delete_matching(
        &Filter {
            templates: true,
            ..Filter::default()
        },
        0,
        1000,
        &mut (),
    );
    assert_eq!((flushed, t.len()), (40, 0));
    assert_eq!(t.stats().delete, 60);
    t.check_invariants().unwrap();
}

/// Each end's port and the SNAT address select on their own, as
/// conntrack(8)'s `--sport`, `--reply-port-src`, `-q` and
/// `--reply-port-dst` do: a delete by one of them takes exactly the flows
/// a dump by it lists, not every flow the other fields match.
#[test]
fn ports_and_the_snat_address_select_flows_for_dump_and_delete() {
    let mut t = sixty_handshakes();
    let listed = |t: &FlowTable, f: &Filter| {
        let mut out = Vec::new();
        t.dump(f, 0, 1000, 0, &mut out);
        out
    };
    // Flow 7: client port 7, SNAT port 1031.
    let client_port = Filter {
        client_port: Some(7),
        ..Filter::default()
    };
    let snat_port = Filter {
        snat_port: Some(1031),
        ..Filter::default()
    };
    for f in [&client_port, &snat_port] {
        let got = listed(&t, f);
        assert_eq!(got.len(), 1, "{f:?}");
        assert_eq!((got[0].client.port, got[0].snat.port), (7, 1031));
    }
    let other_snat = Filter {
        snat: Some(Ipv4Addr::new(198, 18, 9, 1)),
        ..Filter::default()
    };
    assert!(listed(&t, &other_snat).is_empty());
    let backend_port = Filter {
        backend_port: Some(8080),
        ..Filter::default()
    };
    assert_eq!(listed(&t, &backend_port).len(), 60);
    assert!(listed(
        &t,
        &Filter {
            backend_port: Some(80),
            ..Filter::default()
        }
    )
    .is_empty());
    let (deleted, _) = t.delete_matching(&client_port, 0, 1000, &mut ());
    assert_eq!((deleted, t.len()), (1, 59));
    assert!(listed(&t, &snat_port).is_empty());
    t.check_invariants().unwrap();
}

/// A filter naming a flow's whole original tuple (`conntrack -D -s -d -p
/// --sport --dport`) selects that flow alone, by lookup: one call, which
/// ends the walk, at any budget; its other fields still select; the
/// tuple of a flow's reply direction, or templates included, select as a
/// walk does; and the lookup is not a packet's (not counted as found).
#[test]
fn a_whole_tuple_selects_its_flow_by_lookup() {
    let mut t = sixty_handshakes();
    let f = new_flow(7, L4Proto::Tcp);
    let whole = Filter {
        client: Some(f.client.addr),
        client_port: Some(f.client.port),
        vip: Some(f.vip.addr),
        vip_port: Some(f.vip.port),
        proto: Some(L4Proto::Tcp),
        ..Filter::default()
    };
    let found = t.stats().found;
    let mut out = Vec::new();
    // A budget of one slot: a walk would not reach slot 7.
    assert_eq!(t.dump(&whole, 0, 1, 0, &mut out), None);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].client, out[0].snat), (f.client, f.snat));
    let other_state = Filter {
        state: Some(FlowState::Established),
        ..whole
    };
    let udp = Filter {
        proto: Some(L4Proto::Udp),
        ..whole
    };
    for f in [&other_state, &udp] {
        assert_eq!(t.delete_matching(f, 0, 1, &mut ()), (0, None), "{f:?}");
    }
    // The reply direction's tuple names no flow's original one.
    let reply = Filter {
        client: Some(f.backend.addr),
        client_port: Some(f.backend.port),
        vip: Some(f.snat.addr),
        vip_port: Some(f.snat.port),
        ..whole
    };
    let mut none = Vec::new();
    assert_eq!(t.dump(&reply, 0, 1000, 0, &mut none), None);
    assert!(none.is_empty());
    assert_eq!(t.stats().found, found);
    assert_eq!(t.delete_matching(&whole, 0, 1, &mut ()), (1, None));
    assert_eq!(t.len(), 59);
    assert_eq!(t.delete_matching(&whole, 0, 1, &mut ()), (0, None));
    // With templates included, a walk: chunked by the budget.
    let (mut deleted, mut cursor) = (0, Some(0));
    let f8 = new_flow(8, L4Proto::Tcp);
    let walked = Filter {
        client: Some(f8.client.addr),
        client_port: Some(f8.client.port),
        templates: true,
        ..whole
    };
    let mut calls = 0;
    while let Some(c) = cursor {
        let (d, next) = t.delete_matching(&walked, c, 10, &mut ());
        (deleted, cursor, calls) = (deleted + d, next, calls + 1);
    }
    assert_eq!((deleted, calls, t.len()), (1, 10, 58));
    t.check_invariants().unwrap();
}

/// A million flows through open → established → close → expiry on a
/// virtual clock, with exact counter totals at the end.
#[test]
fn a_million_flows_open_establish_close_expire() {
    const N: u32 = 1_000_000;
    let mut t = FlowTable::new(N, Timeouts::default(), 0);
    let mut c = Counts::default();
    let mut now = 0u32;
    // 10,000 new flows per second for 100 seconds; each closes 5 s later.
    let mut open: std::collections::VecDeque<(u32, NewFlow)> = Default::default();
    let (mut expired, mut lookups) = (0u64, 0u64);
    for n in 0..N {
        if n % 10_000 == 0 {
            now += 1;
            expired += u64::from(t.advance(now, u32::MAX, &mut c).expired);
        }
        let f = new_flow(n, L4Proto::Tcp);
        let id = t.insert(&f, syn(), now, &mut c).unwrap();
        let reply = FlowKey::between(f.backend, f.snat, L4Proto::Tcp);
        let (rid, dir) = t.lookup(&reply).unwrap();
        lookups += 1;
        assert_eq!((rid, dir), (id, Direction::Reply));
        t.on_packet(id, Direction::Reply, flags(SYN | ACK), now, &mut c);
        t.on_packet(id, Direction::Original, flags(ACK), now, &mut c);
        open.push_back((now, f));
        while let Some(&(at, g)) = open.front() {
            if at + 5 > now {
                break;
            }
            open.pop_front();
            let key = FlowKey::between(g.client, g.vip, L4Proto::Tcp);
            let (id, _) = t.lookup(&key).unwrap();
            lookups += 1;
            t.on_packet(id, Direction::Original, flags(FIN | ACK), now, &mut c);
            t.on_packet(id, Direction::Reply, flags(FIN | ACK), now, &mut c);
            t.on_packet(id, Direction::Original, flags(ACK), now, &mut c);
            assert_eq!(t.flow(id).state(), FlowState::TimeWait);
        }
    }
    // Close the rest, then let TIME_WAIT (120 s) run out.
    for (_, g) in open.drain(..) {
        let (id, _) = t
            .lookup(&FlowKey::between(g.client, g.vip, L4Proto::Tcp))
            .unwrap();
        lookups += 1;
        t.on_packet(id, Direction::Original, flags(FIN | ACK), now, &mut c);
        t.on_packet(id, Direction::Reply, flags(FIN | ACK), now, &mut c);
    }
    assert_eq!(t.states()[FlowState::TimeWait.index()], N);
    now += 121;
    expired += u64::from(t.advance(now, u32::MAX, &mut c).expired);
    assert_eq!(expired, u64::from(N));
    assert!(t.is_empty());
    assert_eq!(
        t.stats(),
        Stats {
            found: lookups,
            insert: u64::from(N),
            expire: u64::from(N),
            ..Stats::default()
        }
    );
    assert!(c.conns.values().all(|&v| v == (0, 0)), "{:?}", c.conns);
    t.check_invariants().unwrap();
}

/// Memory per flow, index and wheel included, at the sizes the benches
/// use: at most 128 bytes.
#[test]
fn memory_per_flow_is_at_most_128_bytes() {
    for capacity in [1_000_000u32, 10_000_000, 917_504, 917_505] {
        let t: FlowTable = FlowTable::new(capacity, Timeouts::default(), 0);
        let per_flow = t.memory_bytes() as f64 / f64::from(capacity);
        println!("capacity {capacity}: {per_flow:.1} bytes per flow all-in");
        assert!(per_flow <= 128.0, "{per_flow} bytes per flow at {capacity}");
    }
}

/// The footprint said before building is what the built table holds.
#[test]
fn footprint_before_building_is_the_built_tables() {
    for capacity in [1u32, 3, 4, 7, 100, 1_000, 65_536, 917_505, 1_000_000] {
        let t: FlowTable = FlowTable::new(capacity, Timeouts::default(), 0);
        assert_eq!(
            <FlowTable>::footprint(capacity),
            t.memory_bytes() as u64,
            "capacity {capacity}"
        );
    }
}

/// The table is generic over the address family: an IPv6 flow is tracked,
/// found both ways, listed and deleted by filter exactly as an IPv4 one.
#[test]
fn ipv6_flows_are_tracked_like_ipv4_ones() {
    use std::net::Ipv6Addr;
    use xvs_conntrack::Filter;
    let v6 = |last: u16, port: u16| Endpoint {
        addr: Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, last),
        port,
    };
    let mut t: FlowTable<Ipv6Addr> = FlowTable::new(16, Timeouts::default(), 0);
    let f = NewFlow {
        client: v6(0x10, 40_000),
        vip: v6(0x1, 80),
        backend: v6(0x20, 8080),
        snat: v6(0xfe, 1024),
        proto: L4Proto::Tcp,
        service: 1,
        backend_id: 0,
        client_mac: [2, 0, 0, 0, 0, 1],
        plan: 0,
        one_way: false,
    };
    let id = t.insert(&f, syn(), 0, &mut ()).unwrap();
    let orig = FlowKey::between(f.client, f.vip, L4Proto::Tcp);
    assert_eq!(t.lookup(&orig), Some((id, Direction::Original)));
    assert_eq!(t.lookup(&orig.reversed()), None);
    let reply = FlowKey::between(f.backend, f.snat, L4Proto::Tcp);
    let mut out = [None; 2];
    t.lookup_batch(&[reply, orig], &mut out, &mut [0; 2]);
    assert_eq!(
        out,
        [
            Some((id, Direction::Reply)),
            Some((id, Direction::Original))
        ]
    );
    assert_eq!(t.flow(id).backend(), f.backend);
    let mut listed = Vec::new();
    let by_vip = Filter {
        vip: Some(f.vip.addr),
        ..Filter::default()
    };
    assert_eq!(t.dump(&by_vip, 0, 16, 0, &mut listed), None);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].client, f.client);
    assert_eq!(t.delete_matching(&by_vip, 0, 16, &mut ()), (1, None));
    assert!(t.is_empty());
    // Nine clients: the whole tuple of the last one is found by lookup,
    // with a one-slot budget that a walk from slot 0 could not spend on
    // it, and deleted the same way.
    let more = |n: u16| NewFlow {
        client: v6(0x100 + n, 40_000 + n),
        snat: v6(0xfe, 1025 + n),
        ..f
    };
    for n in 0..9 {
        t.insert(&more(n), syn(), 0, &mut ()).unwrap();
    }
    let last = more(8);
    let whole = Filter {
        client: Some(last.client.addr),
        client_port: Some(last.client.port),
        vip: Some(last.vip.addr),
        vip_port: Some(last.vip.port),
        proto: Some(L4Proto::Tcp),
        ..Filter::default()
    };
    let mut one = Vec::new();
    assert_eq!(t.dump(&whole, 0, 1, 0, &mut one), None);
    assert_eq!(one.len(), 1);
    assert_eq!((one[0].client, one[0].snat), (last.client, last.snat));
    assert_eq!(t.delete_matching(&whole, 0, 1, &mut ()), (1, None));
    assert_eq!(t.delete_matching(&whole, 0, 1, &mut ()), (0, None));
    t.check_invariants().unwrap();
}

/// A one-way flow (direct routing, tunnels) indexes only the client's
/// key: its backend and SNAT ends (here the client itself, as the data
/// plane records them) name no reply, so another flow may use them; TCP
/// follows the client's segments alone and removal leaves nothing behind.
#[test]
fn a_one_way_flow_indexes_only_its_original_key() {
    let mut t = FlowTable::new(16, Timeouts::default(), 0);
    let mut f = new_flow(4, L4Proto::Tcp);
    f.one_way = true;
    f.backend.port = f.vip.port;
    f.snat = f.client;
    let id = t.insert(&f, syn(), 0, &mut ()).unwrap();
    assert!(t.flow(id).is_one_way());
    let orig = FlowKey::between(f.client, f.vip, L4Proto::Tcp);
    let reply = FlowKey::between(f.backend, f.snat, L4Proto::Tcp);
    assert_eq!(t.lookup(&orig), Some((id, Direction::Original)));
    assert_eq!(t.lookup(&reply), None);
    assert_eq!(t.flow(id).state(), FlowState::SynRecv);
    t.on_packet(id, Direction::Original, flags(ACK), 1, &mut ());
    assert_eq!(t.flow(id).state(), FlowState::Established);
    t.on_packet(id, Direction::Original, flags(FIN | ACK), 2, &mut ());
    assert_eq!(t.flow(id).state(), FlowState::FinWait);
    t.check_invariants().unwrap();
    // A two-way flow whose reply key is that unindexed key goes in.
    let mut g = new_flow(5, L4Proto::Tcp);
    g.backend = f.backend;
    g.snat = f.snat;
    let gid = t.insert(&g, syn(), 2, &mut ()).unwrap();
    assert_eq!(t.lookup(&reply), Some((gid, Direction::Reply)));
    t.remove(id, &mut ());
    assert_eq!(t.lookup(&orig), None);
    assert_eq!(t.lookup(&reply), Some((gid, Direction::Reply)));
    t.check_invariants().unwrap();
}

#[test]
fn a_synced_flow_is_installed_moved_and_replaced() {
    let mut t = FlowTable::new(16, Timeouts::default(), 0);
    let mut c = Counts::default();
    let f = new_flow(1, L4Proto::Tcp);
    // Installed straight into ESTABLISHED: active, on its timeout.
    let id = t.install(&f, FlowState::Established, 5, &mut c).unwrap();
    assert_eq!(t.flow(id).state(), FlowState::Established);
    assert_eq!(t.flow(id).deadline(), 5 + Timeouts::default().established);
    assert_eq!(c.conns[&1], (1, 0));
    let reply = FlowKey::between(f.backend, f.snat, f.proto);
    assert_eq!(t.lookup(&reply), Some((id, Direction::Reply)));
    // The same flow again, closing: moved, not duplicated.
    assert_eq!(t.install(&f, FlowState::FinWait, 6, &mut c), Ok(id));
    assert_eq!((t.len(), t.flow(id).state()), (1, FlowState::FinWait));
    assert_eq!(c.conns[&1], (0, 1));
    // The peer chose another backend for this client: the peer's wins.
    let mut other = f;
    other.backend = ep([198, 18, 1, 9], 8080);
    other.backend_id = 2;
    let id2 = t
        .install(&other, FlowState::Established, 7, &mut c)
        .unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t.flow(id2).backend(), other.backend);
    assert_eq!(t.lookup(&reply), None, "the old reply key went with it");
    assert_eq!(c.conns[&1], (0, 0));
    assert_eq!(c.conns[&2], (1, 0));
    assert_eq!(c.removed, vec![(f.client, Removal::Rescheduled)]);
    // Nothing to install for a template or no state.
    assert_eq!(
        t.install(&new_flow(2, L4Proto::Tcp), FlowState::Template, 7, &mut c),
        Err(InsertError::Exists)
    );
    // A flow of this gateway's own is never replaced by a peer's.
    let local = new_flow(4, L4Proto::Tcp);
    let mine = t.insert(&local, syn(), 7, &mut c).unwrap();
    assert!(!t.flow(mine).is_peer() && t.flow(id2).is_peer());
    let mut theirs = local;
    theirs.snat = ep([198, 18, 9, 1], 2000);
    assert_eq!(
        t.install(&theirs, FlowState::Established, 8, &mut c),
        Err(InsertError::Exists)
    );
    assert_eq!(t.flow(mine).snat(), local.snat);
    // UDP keeps its one state.
    let u = t
        .install(&new_flow(3, L4Proto::Udp), FlowState::Udp, 8, &mut c)
        .unwrap();
    assert_eq!(t.flow(u).state(), FlowState::Udp);
    t.check_invariants().unwrap();
    let s = t.stats();
    assert_eq!(s.insert - s.reschedule, u64::from(t.len()));
}

/// Live flows per SNAT address: counted at insert, at every way out
/// (retire, expiry) and when asked for after the fact, never for
/// templates, and the full invariant check agrees.
#[test]
fn flows_are_tallied_per_snat_address() {
    let mut t: FlowTable = FlowTable::new(1024, Timeouts::default(), 0);
    let (a, b) = (Ipv4Addr::new(198, 18, 2, 1), Ipv4Addr::new(198, 18, 3, 1));
    t.count_snat(&[a, b]);
    let mut ids = Vec::new();
    for n in (0..50).chain(60_000..60_030) {
        ids.push(
            t.insert(&new_flow(n, L4Proto::Udp), syn(), 0, &mut ())
                .unwrap(),
        );
    }
    assert_eq!(t.snat_flows(), [50, 30]);
    t.retire(ids[0], Removal::Deleted, &mut ());
    t.retire(ids[79], Removal::Deleted, &mut ());
    assert_eq!(t.snat_flows(), [49, 29]);
    t.check_invariants().unwrap();
    // A table told later counts what it holds.
    t.count_snat(&[b]);
    assert_eq!(t.snat_flows(), [29]);
    // Every UDP flow expires (300 s).
    t.advance(400, u32::MAX, &mut ());
    assert_eq!(t.snat_flows(), [0]);
    t.check_invariants().unwrap();
}
