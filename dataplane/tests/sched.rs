//! Every scheduler through the common interface: quiesced backends are
//! never chosen, no eligible backend is a typed outcome, persistence comes
//! before the scheduler, and the memory each carries.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::Ipv4Addr;

use xvs_config::{Scheduler as Kind, SchedulerFlags, DEFAULT_MAGLEV_TABLE_SIZE};
use xvs_conntrack::{Endpoint, FlowTable, L4Proto, Timeouts};
use xvs_dataplane::sched::{
    pick_persistent, ConnCounts, MaglevParams, NoBackend, Persist, Request, SchedBackend,
    Scheduler, DEFAULT_SEED,
};

const MAGLEV: MaglevParams = MaglevParams {
    size: DEFAULT_MAGLEV_TABLE_SIZE,
    seed: DEFAULT_SEED,
};

fn backends(weights: &[u32]) -> Vec<SchedBackend> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| SchedBackend {
            id: i as u32,
            endpoint: Endpoint {
                addr: Ipv4Addr::from(0xc612_0101 + i as u32),
                port: 8080,
            },
            weight: w,
            plan: Default::default(),
        })
        .collect()
}

fn req(n: u32) -> Request {
    Request {
        client: Endpoint {
            addr: Ipv4Addr::from(0xc612_0000 | (n & 0xffff)),
            port: (n >> 4) as u16 | 1024,
        },
        vip: Endpoint {
            addr: Ipv4Addr::new(198, 19, 0, 1),
            port: 80,
        },
    }
}

fn all_kinds() -> impl Iterator<Item = (Kind, SchedulerFlags)> {
    Kind::ALL.iter().map(|&k| {
        let flags = SchedulerFlags {
            fallback: k.takes_hash_flags(),
            port: k.takes_hash_flags(),
        };
        (k, flags)
    })
}

#[test]
fn quiesced_backends_are_never_chosen() {
    let b = backends(&[3, 0, 1, 0, 2]);
    let counts = ConnCounts::new(2, b.len());
    for (kind, flags) in all_kinds() {
        let mut s = Scheduler::new(kind, flags, &b, MAGLEV, 1);
        for n in 0..2_000 {
            let Ok(i) = s.pick(&b, &req(n), &counts, n) else {
                // ovf runs out: every backend has more active flows than
                // its weight.
                assert_eq!(kind, Kind::Ovf, "{kind} found no backend");
                break;
            };
            assert!(b[i].weight > 0, "{kind} chose quiesced backend {i}");
            counts.add(0, b[i].id, 1, 0);
        }
    }
}

#[test]
fn no_eligible_backend_is_a_typed_outcome() {
    let counts = ConnCounts::new(1, 3);
    for (kind, flags) in all_kinds() {
        let quiesced = backends(&[0, 0, 0]);
        let mut s = Scheduler::new(kind, flags, &quiesced, MAGLEV, 1);
        assert_eq!(
            s.pick(&quiesced, &req(1), &counts, 0),
            Err(NoBackend),
            "{kind}"
        );
        let mut s = Scheduler::new::<Ipv4Addr>(kind, flags, &[], MAGLEV, 1);
        assert_eq!(s.pick(&[], &req(1), &counts, 0), Err(NoBackend), "{kind}");
    }
}

#[test]
fn hashing_schedulers_are_sticky_per_client() {
    let b = backends(&[1, 1, 1, 1]);
    let counts = ConnCounts::new(1, 4);
    for kind in [Kind::Sh, Kind::Mh] {
        let mut s = Scheduler::new(kind, SchedulerFlags::default(), &b, MAGLEV, 1);
        for n in 0..100 {
            let mut r = req(n);
            let first = s.pick(&b, &r, &counts, 0).unwrap();
            r.client.port = r.client.port.wrapping_add(1);
            assert_eq!(s.pick(&b, &r, &counts, 0).unwrap(), first, "{kind}");
        }
    }
}

#[test]
fn persistence_comes_before_the_scheduler() {
    let mut b = backends(&[1, 1, 1]);
    let counts = ConnCounts::new(1, 3);
    let mut table = FlowTable::new(64, Timeouts::default(), 0);
    let persist = Persist {
        service: 1,
        proto: L4Proto::Tcp,
        timeout: 300,
        netmask: Ipv4Addr::new(255, 255, 255, 0),
    };
    let mut rr = Scheduler::new(Kind::Rr, SchedulerFlags::default(), &b, MAGLEV, 1);
    let client = |last: u8, port: u16| Request {
        client: Endpoint {
            addr: Ipv4Addr::new(198, 18, 0, last),
            port,
        },
        vip: Endpoint {
            addr: Ipv4Addr::new(198, 19, 0, 1),
            port: 443,
        },
    };
    let first = pick_persistent(
        &mut rr,
        &b,
        &client(1, 1000),
        &counts,
        &persist,
        true,
        &mut table,
        0,
        &mut (),
    )
    .unwrap();
    // Same /24, other hosts and ports: same backend though rr would move on.
    for (last, port) in [(1, 1001), (2, 5), (200, 9)] {
        let i = pick_persistent(
            &mut rr,
            &b,
            &client(last, port),
            &counts,
            &persist,
            true,
            &mut table,
            10,
            &mut (),
        )
        .unwrap();
        assert_eq!(i, first);
    }
    // Another /24 is scheduled.
    let other = Request {
        client: Endpoint {
            addr: Ipv4Addr::new(198, 18, 7, 1),
            port: 1,
        },
        ..client(1, 1)
    };
    let j = pick_persistent(
        &mut rr,
        &b,
        &other,
        &counts,
        &persist,
        true,
        &mut table,
        10,
        &mut (),
    )
    .unwrap();
    assert_ne!(j, first);
    // Quiesced: with expire_quiescent_template off (IPVS's default), the
    // template still holds the client ...
    b[first].weight = 0;
    let mut rr = Scheduler::new(Kind::Rr, SchedulerFlags::default(), &b, MAGLEV, 1);
    let kept = pick_persistent(
        &mut rr,
        &b,
        &client(3, 3),
        &counts,
        &persist,
        false,
        &mut table,
        20,
        &mut (),
    )
    .unwrap();
    assert_eq!(kept, first);
    // ... with it on (kube-proxy's setting), new connections go elsewhere.
    let k = pick_persistent(
        &mut rr,
        &b,
        &client(3, 3),
        &counts,
        &persist,
        true,
        &mut table,
        20,
        &mut (),
    )
    .unwrap();
    assert_ne!(k, first);
    // ... and the template now says so.
    let again = pick_persistent(
        &mut rr,
        &b,
        &client(4, 4),
        &counts,
        &persist,
        true,
        &mut table,
        21,
        &mut (),
    )
    .unwrap();
    assert_eq!(again, k);
    // Templates live 300 s after the last new connection they placed.
    let key = FlowTable::template_key(Ipv4Addr::new(198, 18, 0, 0), client(1, 1).vip, L4Proto::Tcp);
    table.advance(21 + 299, u32::MAX, &mut ());
    assert_eq!(
        table.template_lookup(&key, 21 + 299).map(|(id, _)| id),
        Some(b[k].id)
    );
    table.advance(21 + 300, u32::MAX, &mut ());
    assert_eq!(table.template_lookup(&key, 21 + 300), None);
    assert!(table.is_empty());
}

#[test]
fn memory_footprint_per_service() {
    let b = backends(&vec![1; 1000]);
    for (kind, flags) in all_kinds() {
        let s = Scheduler::new(kind, flags, &b, MAGLEV, 1);
        let bytes = s.memory_bytes();
        match kind {
            Kind::Mh => assert_eq!(bytes, DEFAULT_MAGLEV_TABLE_SIZE as usize * 2),
            Kind::Dh | Kind::Sh => assert_eq!(bytes, 512),
            Kind::Random | Kind::Twos | Kind::Lblc | Kind::Lblcr => {
                assert_eq!(bytes, 8 * 1000, "{kind}")
            }
            _ => assert_eq!(bytes, 0, "{kind}"),
        }
    }
    // 100,000 services at the default table size would need 3.1 GiB; the
    // table is carried only by mh services, sized per service.
    let big = Scheduler::new(
        Kind::Mh,
        SchedulerFlags::default(),
        &b,
        MaglevParams {
            size: 65_537,
            seed: 1,
        },
        1,
    );
    assert_eq!(big.memory_bytes(), 65_537 * 2);
}

/// Conntrack transitions on two workers feed the global counts that wlc
/// reads: established flows on one backend send new ones to the other.
#[test]
fn counts_follow_conntrack_transitions_across_workers() {
    use xvs_conntrack::{tcp_flags, Direction, NewFlow, Packet};
    use xvs_dataplane::sched::CountsObserver;

    let b = backends(&[1, 1]);
    let counts = ConnCounts::new(2, 2);
    let mut tables = [
        FlowTable::new(64, Timeouts::default(), 0),
        FlowTable::new(64, Timeouts::default(), 0),
    ];
    let mut wlc = Scheduler::new(Kind::Wlc, SchedulerFlags::default(), &b, MAGLEV, 1);
    // Three flows to backend 0, established, spread over both workers.
    for n in 0..3u16 {
        let w = usize::from(n % 2);
        let mut obs = CountsObserver {
            worker: w,
            counts: &counts,
        };
        let f = NewFlow {
            client: Endpoint {
                addr: Ipv4Addr::new(198, 18, 0, 1),
                port: 1000 + n,
            },
            vip: Endpoint {
                addr: Ipv4Addr::new(198, 19, 0, 1),
                port: 80,
            },
            backend: b[0].endpoint,
            snat: Endpoint {
                addr: Ipv4Addr::new(198, 18, 2, 1),
                port: 2000 + n,
            },
            proto: L4Proto::Tcp,
            service: 1,
            backend_id: b[0].id,
            client_mac: [2, 0, 0, 0, 0, 1],
            plan: 0,
            one_way: false,
        };
        let id = tables[w]
            .insert(
                &f,
                Packet {
                    tcp_flags: tcp_flags::SYN,
                    len: 60,
                },
                0,
                &mut obs,
            )
            .unwrap();
        tables[w].on_packet(
            id,
            Direction::Original,
            Packet {
                tcp_flags: tcp_flags::ACK,
                len: 52,
            },
            0,
            &mut obs,
        );
    }
    assert_eq!((counts.active(0), counts.inactive(0)), (3, 0));
    assert_eq!(wlc.pick(&b, &req(1), &counts, 0), Ok(1));
    // They close and expire: the counts drain back to zero.
    for (w, t) in tables.iter_mut().enumerate() {
        let mut obs = CountsObserver {
            worker: w,
            counts: &counts,
        };
        t.advance(10_000, u32::MAX, &mut obs);
    }
    assert_eq!((counts.active(0), counts.inactive(0)), (0, 0));
}
