//! The sync thread over real UDP on loopback: two gateways' daemons
//! exchange a worker's records and their hellos; datagrams that fail
//! authentication, come from elsewhere, are truncated, replayed or carry
//! nonsense are counted by reason and never delivered.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // waits are wall-clock time

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use xvs_config::{Sync, SyncRole};
use xvs_conntrack::{Endpoint, FlowState, L4Proto};
use xvs_dataplane::sync::daemon::SyncDaemon;
use xvs_dataplane::sync::wire::{Builder, Kind, Role};
use xvs_dataplane::sync::{Op, SyncQueue, SyncRecord};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn settings(node: u32, me: u16, peer: u16) -> Sync {
    Sync {
        node,
        id: 7,
        listen: SocketAddr::from(([127, 0, 0, 1], me)),
        peers: vec![SocketAddr::from(([127, 0, 0, 1], peer))],
        key_file: None,
        role: SyncRole::Active,
        peer_timeout_ms: None,
    }
}

fn record(n: u16) -> SyncRecord {
    let ep = |a: &str, port| Endpoint {
        addr: a.parse::<IpAddr>().unwrap(),
        port,
    };
    SyncRecord {
        op: Op::Update,
        proto: L4Proto::Tcp,
        state: FlowState::Established,
        one_way: false,
        lag: 0,
        client_mac: [2, 0, 0, 0, 0, 1],
        timeout: 900,
        client: ep("198.18.0.10", 30_000 + n),
        vip: ep("198.19.0.1", 80),
        backend: ep("198.18.2.10", 8080),
        snat: ep("198.18.1.2", 1024 + n),
    }
}

/// Waits up to 5 s for `f` to hold.
fn until(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn two_daemons_exchange_records_and_hellos_and_count_what_is_bad() {
    let (pa, pb) = (free_port(), free_port());
    let key = std::env::temp_dir().join(format!("xvs-sync-key-{}", std::process::id()));
    std::fs::write(&key, b"0123456789abcdef-shared").unwrap();
    let secret = std::fs::read(&key).unwrap();
    std::fs::remove_file(&key).unwrap();
    let qa = Arc::new(SyncQueue::new(1024));
    let (tx, rx) = mpsc::channel();
    let a = SyncDaemon::start(
        &settings(1, pa, pb),
        Some(&secret),
        vec![qa.clone()],
        Box::new(|_| {}),
    )
    .unwrap();
    let b = SyncDaemon::start(
        &settings(2, pb, pa),
        Some(&secret),
        vec![Arc::new(SyncQueue::new(16))],
        Box::new(move |r| tx.send(r).unwrap()),
    )
    .unwrap();
    a.set_announced(vec![
        ("198.18.1.2".parse().unwrap(), Role::Snat),
        ("198.19.0.1".parse().unwrap(), Role::Vip),
    ]);
    // More records than one datagram holds: all arrive, in order.
    let n = 100u16;
    // Stamped with the workers' clock, as a worker does each loop.
    qa.tick(xvs_dataplane::steer::monotonic_secs());
    for i in 0..n {
        qa.push(record(i));
    }
    let mut got = Vec::new();
    while got.len() < usize::from(n) {
        got.extend(rx.recv_timeout(Duration::from_secs(5)).unwrap());
    }
    // A record's lag is whole seconds on the workers' clock since it was
    // queued: 0, or 1 when a second began between the queueing and the
    // send. Everything else arrives as sent, in order.
    assert!(got.iter().all(|r| r.lag <= 1), "{got:?}");
    let got: Vec<SyncRecord> = got
        .into_iter()
        .map(|r| SyncRecord { lag: 0, ..r })
        .collect();
    let want: Vec<SyncRecord> = (0..n).map(record).collect();
    assert!(
        got == want,
        "{} records, first {:?}",
        got.len(),
        got.first()
    );
    // B heard A, with what A announced.
    assert!(until(|| b.peers().first().is_some_and(|p| p.node == 1
        && p.snat.len() == 1
        && p.vips.len() == 1)));
    assert_eq!(a.reading().sent_records, u64::from(n));
    assert!(a.reading().sent_datagrams >= 2, "{:?}", a.reading());
    // Bad datagrams, sent to B from A's peer address (127.0.0.1).
    let evil = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = SocketAddr::from(([127, 0, 0, 1], pb));
    let mut builder = Builder::new(Kind::Flows);
    builder.push(&record(999));
    let unsigned = builder.finish(7, 3, u32::MAX, 1, None).to_vec();
    let wrong_key = xvs_dataplane::sync::wire::key(b"not the cluster's key");
    let forged = builder.finish(7, 3, u32::MAX, 2, Some(&wrong_key)).to_vec();
    let good_key = xvs_dataplane::sync::wire::key(&secret);
    let genuine = builder.finish(7, 3, u32::MAX, 3, Some(&good_key)).to_vec();
    let other_id = builder.finish(8, 3, u32::MAX, 4, Some(&good_key)).to_vec();
    for d in [
        &unsigned[..],
        &forged[..],
        &genuine[..10],
        &genuine[..genuine.len() - 1],
        &other_id[..],
        b"GET /index.html HTTP/1.0\r\nHost: gw\r\n\r\n",
    ] {
        evil.send_to(d, to).unwrap();
    }
    // Then a genuine one (from a third node), and again (a replay).
    evil.send_to(&genuine, to).unwrap();
    evil.send_to(&genuine, to).unwrap();
    let want = [
        ("unauthenticated", 1),
        ("bad_mac", 1),
        ("truncated", 2),
        ("other_sync_id", 1),
        ("bad_magic", 1),
        ("replayed", 1),
    ];
    let dropped = |d: &SyncDaemon, name: &str| {
        d.reading()
            .dropped
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    };
    assert!(
        until(|| want.iter().all(|&(r, n)| dropped(&b, r) == n)),
        "{:?}",
        b.reading()
    );
    // Only the genuine record was delivered.
    let late: Vec<SyncRecord> = rx.try_iter().flatten().collect();
    assert_eq!(late, [record(999)]);
    a.stop();
    b.stop();
}

/// A live peer that sends no records is never seen silent for as long as
/// the shortest `peer_timeout`: its hellos come often enough (with a
/// hello a second, a one-second timeout took live peers over).
#[test]
fn an_idle_live_peer_is_never_silent_for_the_shortest_peer_timeout() {
    let (pa, pb) = (free_port(), free_port());
    let a = SyncDaemon::start(&settings(1, pa, pb), None, vec![], Box::new(|_| {})).unwrap();
    let b = SyncDaemon::start(&settings(2, pb, pa), None, vec![], Box::new(|_| {})).unwrap();
    assert!(until(|| b.peers().iter().any(|p| p.node == 1)));
    let (mut longest, end) = (0, Instant::now() + Duration::from_secs(3));
    while Instant::now() < end {
        for p in b.peers().iter().filter(|p| p.node == 1) {
            longest = longest.max(p.silent_ms);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        longest < xvs_config::MIN_PEER_TIMEOUT_MS / 2,
        "node 1 looked silent for {longest} ms"
    );
    drop(a);
}
