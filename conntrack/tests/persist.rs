//! A flow table in a state file, as a restarted process finds it: the
//! same flows (keys, ends, state, counters, deadlines) adopted with new
//! service and backend ids; a file that does not fit reset with the
//! reason; what a crash mid-update leaves dropped, never trusted.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use xvs_conntrack::tcp_flags::{ACK, SYN};
use xvs_conntrack::{
    Direction, Endpoint, FlowKey, FlowState, FlowTable, L4Proto, NewFlow, Observer, Opened, Packet,
    StateIdentity, Timeouts,
};

#[derive(Default)]
struct Counts(HashMap<(u32, u32), (i64, i64)>);

impl Observer for Counts {
    fn conn_counts(&mut self, service: u32, backend: u32, a: i32, i: i32) {
        let c = self.0.entry((service, backend)).or_default();
        c.0 += i64::from(a);
        c.1 += i64::from(i);
    }
}

/// A state file of the test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(
            std::env::temp_dir().join(format!("xvs-persist-{name}-{}.flows", std::process::id())),
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const ID: StateIdentity = StateIdentity {
    worker: 0,
    workers: 1,
    snat: 42,
};

fn ep(a: [u8; 4], port: u16) -> Endpoint {
    Endpoint {
        addr: Ipv4Addr::from(a),
        port,
    }
}

fn flow(n: u16) -> NewFlow {
    NewFlow {
        client: ep([198, 18, 0, 10], 40_000 + n),
        vip: ep([198, 19, 0, 1], 80),
        backend: ep([198, 18, 1, 1 + (n % 3) as u8], 8080),
        snat: ep([198, 18, 2, 1], 2000 + n),
        proto: L4Proto::Tcp,
        service: 7,
        backend_id: u32::from(n % 3),
        client_mac: [2, 0, 0, 0, 0, 1],
        plan: 0,
        one_way: false,
    }
}

fn pkt(flags: u8) -> Packet {
    Packet {
        tcp_flags: flags,
        len: 60,
    }
}

/// The new process's ids: service 70 for the VIP, backend 100 + last
/// octet (not the old ids: adoption must go by identity).
fn resolve(f: xvs_conntrack::FlowRef<'_>) -> Option<(u32, u32)> {
    (f.vip() == ep([198, 19, 0, 1], 80))
        .then(|| (70, 100 + u32::from(f.backend().addr.octets()[3])))
}

#[test]
fn a_reopened_table_adopts_every_flow_with_new_ids() {
    let file = Scratch::new("adopt");
    let t0 = Timeouts::default();
    // Each flow's counters and deadline as the first process leaves them
    // (the byte counters' high bits and the timeout live apart from the
    // rest of the entry, and must come back with it).
    let mut kept = HashMap::new();
    {
        let (mut t, opened) = FlowTable::<Ipv4Addr>::open_state(&file.0, ID, 64, t0, 1000).unwrap();
        assert_eq!(opened, Opened::Fresh("no state file".into()));
        assert_eq!(t.adopt(1000, resolve, &mut ()).flows, 0);
        for n in 0..10 {
            let id = t.insert(&flow(n), pkt(SYN), 1000, &mut ()).unwrap();
            // Half of them established.
            if n % 2 == 0 {
                let reply = FlowKey::between(flow(n).backend, flow(n).snat, L4Proto::Tcp);
                let (rid, dir) = t.lookup(&reply).unwrap();
                assert_eq!((rid, dir), (id, Direction::Reply));
                t.on_packet(id, Direction::Reply, pkt(SYN | ACK), 1001, &mut ());
                t.on_packet(id, Direction::Original, pkt(ACK), 1001, &mut ());
            }
            if n == 4 {
                // Past 4 GiB in both directions.
                for dir in [Direction::Original, Direction::Reply] {
                    let big = Packet {
                        tcp_flags: ACK,
                        len: u32::MAX,
                    };
                    t.on_packet(id, dir, big, 1001, &mut ());
                    t.on_packet(id, dir, big, 1001, &mut ());
                }
                assert!(t.flow(id).bytes().iter().all(|&b| b > 1 << 33));
            }
            let f = t.flow(id);
            kept.insert(n, (f.packets(), f.bytes(), f.deadline()));
        }
        let key = FlowTable::<Ipv4Addr>::template_key(
            Ipv4Addr::new(198, 18, 0, 0),
            ep([198, 19, 0, 1], 80),
            L4Proto::Tcp,
        );
        t.template_set(&key, 7, 1, ep([198, 18, 1, 2], 8080), 300, 1001, &mut ())
            .unwrap();
        // A one-way (direct routing) flow: one key.
        let mut one = flow(20);
        one.one_way = true;
        one.snat = one.client;
        t.insert(&one, pkt(SYN), 1001, &mut ()).unwrap();
        t.check_invariants().unwrap();
        // The process ends here: nothing is written at the end.
    }
    let (mut t, opened) = FlowTable::<Ipv4Addr>::open_state(&file.0, ID, 64, t0, 1010).unwrap();
    assert_eq!(opened, Opened::Kept);
    let mut counts = Counts::default();
    let adopted = t.adopt(1010, resolve, &mut counts);
    assert_eq!(
        (adopted.flows, adopted.templates, adopted.dropped),
        (11, 1, 0)
    );
    t.check_invariants().unwrap();
    assert_eq!(t.len(), 12);
    let one = flow(20);
    let (id, _) = t
        .lookup(&FlowKey::between(one.client, one.vip, L4Proto::Tcp))
        .unwrap();
    assert!(t.flow(id).is_one_way());
    for n in 0..10 {
        let f = flow(n);
        let orig = FlowKey::between(f.client, f.vip, L4Proto::Tcp);
        let reply = FlowKey::between(f.backend, f.snat, L4Proto::Tcp);
        let (id, dir) = t.lookup(&orig).unwrap();
        assert_eq!(dir, Direction::Original);
        assert_eq!(t.lookup(&reply), Some((id, Direction::Reply)));
        let e = t.flow(id);
        assert_eq!((e.backend(), e.snat()), (f.backend, f.snat));
        assert_eq!(e.service(), 70);
        assert_eq!(e.backend_id(), 100 + u32::from(f.backend.addr.octets()[3]));
        let want = if n % 2 == 0 {
            FlowState::Established
        } else {
            FlowState::SynRecv
        };
        assert_eq!(e.state(), want, "flow {n}");
        assert_eq!(e.last_seen(), if n % 2 == 0 { 1001 } else { 1000 });
        assert_eq!(kept[&n], (e.packets(), e.bytes(), e.deadline()), "flow {n}");
    }
    // The connection counts the schedulers start from, by new id.
    let total: (i64, i64) = counts
        .0
        .values()
        .fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
    assert_eq!(total, (5, 6));
    let key = FlowTable::<Ipv4Addr>::template_key(
        Ipv4Addr::new(198, 18, 0, 0),
        ep([198, 19, 0, 1], 80),
        L4Proto::Tcp,
    );
    assert_eq!(
        t.template_lookup(&key, 1010),
        Some((102, ep([198, 18, 1, 2], 8080)))
    );
    // Deadlines carried over: the SYN_RECV flows (60 s from 1000) expire
    // at 1060, not 60 s after the adoption.
    t.advance(1059, u32::MAX, &mut ());
    assert_eq!(t.len(), 12);
    t.advance(1061, u32::MAX, &mut ());
    assert_eq!(t.len(), 6);
    t.check_invariants().unwrap();
    // New flows go on working beside the adopted ones.
    t.insert(&flow(20), pkt(SYN), 1061, &mut ()).unwrap();
    t.check_invariants().unwrap();
}

#[test]
fn flows_of_services_or_backends_that_are_gone_are_dropped_and_counted() {
    let file = Scratch::new("gone");
    {
        let (mut t, _) =
            FlowTable::<Ipv4Addr>::open_state(&file.0, ID, 16, Timeouts::default(), 5).unwrap();
        t.adopt(5, resolve, &mut ());
        for n in 0..6 {
            t.insert(&flow(n), pkt(SYN), 5, &mut ()).unwrap();
        }
    }
    let (mut t, opened) =
        FlowTable::<Ipv4Addr>::open_state(&file.0, ID, 16, Timeouts::default(), 6).unwrap();
    assert_eq!(opened, Opened::Kept);
    // Backend .1 is gone from the new configuration.
    let adopted = t.adopt(
        6,
        |f| resolve(f).filter(|_| f.backend().addr.octets()[3] != 1),
        &mut (),
    );
    assert_eq!((adopted.flows, adopted.dropped), (4, 2));
    assert_eq!(t.len(), 4);
    t.check_invariants().unwrap();
}

#[test]
fn a_file_that_does_not_fit_starts_empty_and_says_why() {
    let file = Scratch::new("fit");
    {
        let (mut t, _) =
            FlowTable::<Ipv4Addr>::open_state(&file.0, ID, 16, Timeouts::default(), 5).unwrap();
        t.adopt(5, resolve, &mut ());
        t.insert(&flow(1), pkt(SYN), 5, &mut ()).unwrap();
    }
    let other = StateIdentity { workers: 2, ..ID };
    let (mut t, opened) =
        FlowTable::<Ipv4Addr>::open_state(&file.0, other, 16, Timeouts::default(), 6).unwrap();
    assert_eq!(
        opened,
        Opened::Fresh("workers changed (state file 1, now 2)".into())
    );
    assert_eq!(t.adopt(6, resolve, &mut ()).flows, 0);
    assert!(t.is_empty());
    t.check_invariants().unwrap();
    drop(t);
    // A capacity change changes the file's size.
    let (t, opened) =
        FlowTable::<Ipv4Addr>::open_state(&file.0, other, 32, Timeouts::default(), 6).unwrap();
    assert!(matches!(opened, Opened::Fresh(_)), "{opened:?}");
    assert!(t.is_empty());
}

#[test]
fn what_a_crash_mid_update_leaves_is_dropped_not_trusted() {
    use std::io::{Seek, SeekFrom, Write};
    let file = Scratch::new("crash");
    {
        let (mut t, _) =
            FlowTable::<Ipv4Addr>::open_state(&file.0, ID, 16, Timeouts::default(), 5).unwrap();
        t.adopt(5, resolve, &mut ());
        for n in 0..4 {
            t.insert(&flow(n), pkt(SYN), 5, &mut ()).unwrap();
        }
    }
    // Scribble over the entries: slot 0's protocol byte becomes one no
    // entry has, and slot 1 becomes a copy of slot 2 (a duplicate key),
    // and slot 9 (free) is marked live with nothing in it.
    let entry = 64u64; // an IPv4 entry
    let mut bytes = std::fs::read(&file.0).unwrap();
    let at = |slot: u64| 4096 + slot * entry;
    let proto_offset = 4 * 4 + 4 * 2 + 2;
    bytes[(at(0) + proto_offset) as usize] = 0x7f;
    let copy: Vec<u8> = bytes[at(2) as usize..(at(2) + entry) as usize].to_vec();
    bytes[at(1) as usize..(at(1) + entry) as usize].copy_from_slice(&copy);
    let flags_offset = proto_offset + 2;
    bytes[(at(9) + flags_offset) as usize] = 0x80;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&file.0)
        .unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&bytes).unwrap();
    drop(f);
    let (mut t, opened) =
        FlowTable::<Ipv4Addr>::open_state(&file.0, ID, 16, Timeouts::default(), 6).unwrap();
    assert_eq!(opened, Opened::Kept);
    let adopted = t.adopt(6, resolve, &mut ());
    // Slot 3 and one of the two copies of slot 2 survive; the insane
    // slot, the other copy and the empty live slot (no service) go.
    assert_eq!((adopted.flows, adopted.dropped), (2, 3));
    t.check_invariants().unwrap();
    for n in [2, 3] {
        let f = flow(n);
        assert!(t
            .lookup(&FlowKey::between(f.client, f.vip, L4Proto::Tcp))
            .is_some());
    }
}
