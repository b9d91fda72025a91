//! Random operation sequences keep the flow table's invariants: both
//! indexes agree with the slab, wheel and age lists are whole, counters add
//! up, no slot leaks, and the per-backend connection counts reported to the
//! observer always equal a recount of the table.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::net::Ipv4Addr;

use proptest::prelude::*;
use xvs_conntrack::{
    Direction, Endpoint, Filter, FlowKey, FlowTable, L4Proto, NewFlow, Observer, Packet, Timeouts,
};

#[derive(Default)]
struct Counts(HashMap<u32, (i64, i64)>);

impl Observer for Counts {
    fn conn_counts(&mut self, _s: u32, backend: u32, a: i32, i: i32) {
        let c = self.0.entry(backend).or_default();
        c.0 += i64::from(a);
        c.1 += i64::from(i);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert {
        client: u8,
        backend: u8,
        udp: bool,
        flags: u8,
    },
    Packet {
        which: prop::sample::Index,
        reply: bool,
        flags: u8,
        dt: u32,
    },
    Lookup {
        client: u8,
    },
    Remove {
        which: prop::sample::Index,
    },
    Advance {
        dt: u32,
        budget: u32,
    },
    Template {
        net: u8,
        backend: u8,
        timeout: u32,
    },
    TemplateLookup {
        net: u8,
    },
    Delete {
        backend: u8,
        cursor: u32,
        budget: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let flags = prop::sample::select(vec![0x02u8, 0x12, 0x10, 0x11, 0x04, 0x01, 0x00, 0x18]);
    prop_oneof![
        4 => (0u8..24, 0u8..3, any::<bool>(), flags.clone())
            .prop_map(|(client, backend, udp, flags)| Op::Insert { client, backend, udp, flags }),
        4 => (any::<prop::sample::Index>(), any::<bool>(), flags, 0u32..30)
            .prop_map(|(which, reply, flags, dt)| Op::Packet { which, reply, flags, dt }),
        1 => (0u8..24).prop_map(|client| Op::Lookup { client }),
        1 => any::<prop::sample::Index>().prop_map(|which| Op::Remove { which }),
        2 => (0u32..400, 1u32..40).prop_map(|(dt, budget)| Op::Advance { dt, budget }),
        1 => (0u8..4, 0u8..3, 1u32..500).prop_map(|(net, backend, timeout)| Op::Template { net, backend, timeout }),
        1 => (0u8..4).prop_map(|net| Op::TemplateLookup { net }),
        1 => (0u8..3, 0u32..10, 1u32..10).prop_map(|(backend, cursor, budget)| Op::Delete { backend, cursor, budget }),
    ]
}

fn flow(client: u8, backend: u8, udp: bool) -> NewFlow {
    NewFlow {
        client: Endpoint {
            addr: Ipv4Addr::new(198, 18, 0, client),
            port: 40_000,
        },
        vip: Endpoint {
            addr: Ipv4Addr::new(198, 19, 0, 1),
            port: 80,
        },
        backend: Endpoint {
            addr: Ipv4Addr::new(198, 18, 1, backend),
            port: 8080,
        },
        snat: Endpoint {
            addr: Ipv4Addr::new(198, 18, 2, 1),
            port: 1024 + u16::from(client),
        },
        proto: if udp { L4Proto::Udp } else { L4Proto::Tcp },
        service: 1,
        backend_id: u32::from(backend),
        client_mac: [2, 0, 0, 0, 0, 1],
        plan: 0,
        one_way: false,
    }
}

fn recount(t: &FlowTable) -> HashMap<u32, (i64, i64)> {
    let mut m: HashMap<u32, (i64, i64)> = HashMap::new();
    for f in t.iter().filter(|f| !f.is_template()) {
        let c = m.entry(f.backend_id()).or_default();
        if f.state().is_active() {
            c.0 += 1;
        } else {
            c.1 += 1;
        }
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn invariants_hold_under_any_operations(
        capacity in 1u32..12,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let timeouts = Timeouts { established: 50, syn_recv: 20, close: 5, time_wait: 15, udp: 30, ..Timeouts::default() };
        let mut t = FlowTable::new(capacity, timeouts, 1_000);
        let mut c = Counts::default();
        let mut now = 1_000u32;
        let mut keys: Vec<FlowKey> = Vec::new();
        for op in ops {
            match op {
                Op::Insert { client, backend, udp, flags } => {
                    let f = flow(client, backend, udp);
                    if t.insert(&f, Packet { tcp_flags: flags, len: 40 }, now, &mut c).is_ok() {
                        keys.push(FlowKey::between(f.client, f.vip, f.proto));
                        keys.push(FlowKey::between(f.backend, f.snat, f.proto));
                    }
                }
                Op::Packet { which, reply, flags, dt } if !keys.is_empty() => {
                    now += dt;
                    let mut key = keys[which.index(keys.len())];
                    if reply { key = key.reversed(); }
                    if let Some((id, dir)) = t.lookup(&key) {
                        t.on_packet(id, dir, Packet { tcp_flags: flags, len: 40 }, now, &mut c);
                        prop_assert_eq!(t.flow(id).key(dir), key);
                        prop_assert_eq!(t.flow(id).last_seen(), now);
                    }
                }
                Op::Packet { .. } => {}
                Op::Lookup { client } => {
                    for backend in 0..3 {
                        let f = flow(client, backend, false);
                        if let Some((id, dir)) = t.lookup(&FlowKey::between(f.client, f.vip, f.proto)) {
                            prop_assert_eq!(dir, Direction::Original);
                            prop_assert_eq!(t.flow(id).client(), f.client);
                        }
                    }
                }
                Op::Remove { which } if !keys.is_empty() => {
                    if let Some((id, _)) = t.lookup(&keys[which.index(keys.len())]) {
                        t.remove(id, &mut c);
                    }
                }
                Op::Remove { .. } => {}
                Op::Advance { dt, budget } => {
                    now += dt;
                    let before = t.len();
                    let a = t.advance(now, budget, &mut c);
                    prop_assert!(a.expired <= budget);
                    prop_assert_eq!(t.len(), before - a.expired);
                    // Nothing live is past its deadline once the wheel has caught up.
                    if a.done {
                        prop_assert!(t.iter().all(|f| f.deadline() > now), "a live entry is past its deadline");
                    }
                }
                Op::Template { net, backend, timeout } => {
                    let key = FlowTable::template_key(Ipv4Addr::new(198, 18, net, 0), Endpoint { addr: Ipv4Addr::new(198, 19, 0, 1), port: 80 }, L4Proto::Tcp);
                    let b = Endpoint { addr: Ipv4Addr::new(198, 18, 1, backend), port: 8080 };
                    if t.template_set(&key, 1, u32::from(backend), b, timeout, now, &mut c).is_ok() {
                        prop_assert_eq!(t.template_lookup(&key, now), Some((u32::from(backend), b)));
                    }
                }
                Op::TemplateLookup { net } => {
                    let key = FlowTable::template_key(Ipv4Addr::new(198, 18, net, 0), Endpoint { addr: Ipv4Addr::new(198, 19, 0, 1), port: 80 }, L4Proto::Tcp);
                    let _ = t.template_lookup(&key, now);
                }
                Op::Delete { backend, cursor, budget } => {
                    let filter = Filter { backend: Some(Ipv4Addr::new(198, 18, 1, backend)), ..Filter::default() };
                    t.delete_matching(&filter, cursor, budget, &mut c);
                }
            }
            if let Err(e) = t.check_invariants() {
                prop_assert!(false, "{}", e);
            }
            let mut want = recount(&t);
            let mut got = c.0.clone();
            want.retain(|_, v| *v != (0, 0));
            got.retain(|_, v| *v != (0, 0));
            prop_assert_eq!(got, want);
            let s = t.stats();
            prop_assert_eq!(s.table_full, s.early_drop + s.drop);
        }
    }
}
