//! Gateways of one cluster choose alike: two instances compiled from
//! their own config files (services in another order, another worker
//! count, Maglev backends listed in another order) with the same
//! `[cluster] hash_seed` choose the same backend for every one of 100,000
//! random flows, under mh, sh and dh; another seed gives other Maglev
//! choices; and removing a backend moves only its own flows (Maglev's
//! minimal disruption, within 1% for M = 65537).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::net::Ipv4Addr;

use xvs_config::Config;
use xvs_conntrack::Endpoint;
use xvs_dataplane::sched::Request;
use xvs_dataplane::services::{AnyService, CompiledService};

const FLOWS: u32 = 100_000;

/// A config with `services` (TOML), `queues` workers and `seed`.
fn config(services: &str, queues: usize, seed: Option<u64>) -> Config {
    let queues: Vec<String> = (0..queues).map(|q| q.to_string()).collect();
    let cluster = seed.map_or(String::new(), |s| format!("[cluster]\nhash_seed = {s}\n\n"));
    let text = format!(
        "[interfaces]\nclient = \"xvs0\"\nqueues = [{q}]\ncores = [{q}]\n\n\
         [snat]\naddresses = [\"198.18.1.2\"]\n\n{cluster}{services}",
        q = queues.join(", "),
    );
    xvs_config::parse_str("xvs.toml", &text).unwrap()
}

/// A service on port `port` with `scheduler` and `backends` (last
/// octets of 198.18.2.x), in that order.
fn service(port: u16, scheduler: &str, backends: &[u8]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ address = \"198.18.2.{b}\", port = 8080 }}"))
        .collect();
    let flags = if scheduler == "mh" {
        ""
    } else {
        "flags = [\"port\"]\n"
    };
    format!(
        "[[services]]\nvip = \"198.19.0.1\"\nport = {port}\nscheduler = \"{scheduler}\"\n{flags}backends = [{}]\n\n",
        list.join(", ")
    )
}

/// The services of `cfg`, compiled as a started data plane compiles them
/// (ids in file order), by port.
fn compile(cfg: &Config) -> HashMap<u16, std::sync::Arc<CompiledService<Ipv4Addr>>> {
    cfg.services
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let c = AnyService::compile(
                n as u32 + 1,
                s,
                None,
                (cfg.workers(), true),
                cfg.cluster.hash_seed,
            )
            .unwrap();
            let AnyService::V4(c) = c else { panic!() };
            (s.key.port, c)
        })
        .collect()
}

/// Flow `n` of a fixed pseudo-random sequence (xorshift: the same on
/// every run).
fn flow(n: u32, port: u16) -> Request {
    let mut x = (n as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    Request {
        client: Endpoint {
            // Clients anywhere in 198.18.0.0/15.
            addr: Ipv4Addr::from(0xc612_0000 | (x as u32 & 0x1_ffff)),
            port: (x >> 40) as u16 | 1024,
        },
        vip: Endpoint {
            addr: Ipv4Addr::new(198, 19, 0, 1),
            port,
        },
    }
}

/// The backend `svc` chooses for `req`.
fn choose(svc: &CompiledService<Ipv4Addr>, req: &Request) -> Endpoint<Ipv4Addr> {
    let mut sched = svc.scheduler.clone();
    let i = sched.pick(&svc.backends, req, &svc.counts, 0).unwrap();
    svc.backends[i].endpoint
}

#[test]
fn two_gateways_with_one_seed_choose_the_same_backend_for_every_flow() {
    let backends: Vec<u8> = (10..40).collect();
    let mut shuffled = backends.clone();
    shuffled.reverse();
    shuffled.rotate_left(11);
    // Gateway A: mh, sh, dh in this order, one worker. Gateway B: the
    // other order (other service ids), four workers, and its Maglev
    // backends listed in another order (as another watcher may list
    // them). sh and dh fill their buckets in list order, as IPVS does:
    // both gateways list those alike.
    let a = config(
        &[
            service(80, "mh", &backends),
            service(81, "sh", &backends),
            service(82, "dh", &backends),
        ]
        .concat(),
        1,
        Some(42),
    );
    let b = config(
        &[
            service(82, "dh", &backends),
            service(81, "sh", &backends),
            service(80, "mh", &shuffled),
        ]
        .concat(),
        4,
        Some(42),
    );
    let (a, b) = (compile(&a), compile(&b));
    for port in [80, 81, 82] {
        let same = (0..FLOWS)
            .filter(|&n| {
                let req = flow(n, port);
                choose(&a[&port], &req) == choose(&b[&port], &req)
            })
            .count();
        println!("port {port}: {same} of {FLOWS} flows to the same backend");
        assert_eq!(same, FLOWS as usize, "port {port}");
    }
    // Another seed is other Maglev choices: the seed is what they share.
    let c = compile(&config(&service(80, "mh", &backends), 1, Some(43)));
    let same = (0..FLOWS)
        .filter(|&n| {
            let req = flow(n, 80);
            choose(&a[&80], &req) == choose(&c[&80], &req)
        })
        .count();
    assert!(same < FLOWS as usize / 2, "{same} alike under another seed");
}

#[test]
fn the_seed_defaults_and_is_validated() {
    let cfg = config(&service(80, "mh", &[10, 11]), 1, None);
    assert_eq!(cfg.cluster.hash_seed, xvs_config::DEFAULT_HASH_SEED);
    assert_eq!(
        config(&service(80, "mh", &[10, 11]), 1, Some(7))
            .cluster
            .hash_seed,
        7
    );
    let bad = "[interfaces]\nclient = \"xvs0\"\n\n[snat]\naddresses = [\"198.18.1.2\"]\n\n[cluster]\nhash_seed = -1\n";
    let err = xvs_config::parse_str("xvs.toml", bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cluster.hash_seed"), "{err}");
}

#[test]
fn removing_a_backend_moves_only_its_own_flows() {
    let backends: Vec<u8> = (10..110).collect();
    // M = 65537, the paper's figure.
    let m = |s: String| s.replace("\"mh\"\n", "\"mh\"\nmaglev_table_size = 65537\n");
    let before = config(&m(service(80, "mh", &backends)), 1, Some(42));
    let gone = 57u8;
    let rest: Vec<u8> = backends.iter().copied().filter(|&b| b != gone).collect();
    let after = config(&m(service(80, "mh", &rest)), 1, Some(42));
    let v1 = compile(&before)[&80].clone();
    assert_eq!(v1.scheduler.memory_bytes(), 65_537 * 2, "M = 65537");
    // The next version of the service, as a runtime edit makes it.
    let svc = after.services[0].narrow().unwrap();
    let v2 = CompiledService::update(&v1, &svc, true, Some(after.cluster.hash_seed));
    let gone = Endpoint {
        addr: Ipv4Addr::new(198, 18, 2, gone),
        port: 8080,
    };
    let (mut own, mut others, mut moved) = (0, 0, 0);
    for n in 0..FLOWS {
        let req = flow(n, 80);
        let was = choose(&v1, &req);
        if was == gone {
            own += 1;
            continue;
        }
        others += 1;
        if choose(&v2, &req) != was {
            moved += 1;
        }
    }
    let share = moved as f64 / others as f64;
    println!(
        "removing 1 of 100: its {own} flows moved; {moved} of the other {others} ({:.3}%)",
        share * 100.0
    );
    assert!(own > 0);
    assert!(share <= 0.01, "{moved} of {others} other flows moved");
}
