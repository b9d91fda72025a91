//! Service and backend statistics as ipvsadm shows them: cumulative
//! counters read from the data plane's per-worker rows, and rates from an
//! estimator like IPVS's (`ip_vs_est.c`): a sample every 2 seconds, each
//! rate an exponentially weighted moving average with weight 1/4.

use std::collections::HashMap;

use xvs_config::{Persistence, SchedulerFlag, ServiceKey};
use xvs_dataplane::services::AnyService;
use xvs_dataplane::traffic::TrafficTotals;

use crate::engine::Engine;
use crate::view::{BackendView, Listing, PersistView, Rates, ServiceView, Stats};

/// Seconds between two estimator samples (IPVS's).
pub const SAMPLE_SECONDS: f64 = 2.0;

/// What one backend looked like at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSample {
    /// Address.
    pub address: std::net::IpAddr,
    /// Port.
    pub port: u16,
    /// Weight.
    pub weight: u32,
    /// Forwarding method and encapsulation.
    pub forward: (xvs_config::ForwardMethod, xvs_config::Encap),
    /// Its health check's verdict (`Some(true)`: up; none: not checked).
    pub up: Option<bool>,
    /// Active flows.
    pub active: u64,
    /// Inactive flows.
    pub inactive: u64,
    /// Counters.
    pub totals: TrafficTotals,
}

/// What one service looked like at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSample {
    /// Key.
    pub key: ServiceKey,
    /// Scheduler name.
    pub scheduler: String,
    /// Scheduler flags (`fallback`, `port`).
    pub flags: Vec<String>,
    /// Persistence.
    pub persistence: Option<Persistence>,
    /// Backends, in the service's order.
    pub backends: Vec<BackendSample>,
    /// The service's counters: its backends' and those of backends it
    /// had before (IPVS keeps a service's own counters, which never go
    /// back when a destination leaves).
    pub totals: TrafficTotals,
}

/// The backends a health check watches.
type Checked = std::collections::BTreeSet<(ServiceKey, std::net::IpAddr, u16)>;

fn checked(e: &Engine) -> Checked {
    e.config()
        .checks
        .iter()
        .map(|c| (c.service, c.address, c.port))
        .collect()
}

/// A backend as its listing shows it: its health (only where a check
/// watches it: up, or down) and its weight (0 while found down).
fn listed(
    e: &Engine,
    checked: &Checked,
    key: ServiceKey,
    b: &xvs_config::Backend,
) -> (Option<bool>, u32) {
    let down = e.is_down(&key, b.address, b.port);
    let up = checked.contains(&(key, b.address, b.port)).then_some(!down);
    (up, if down { 0 } else { b.weight })
}

/// What `xvs status` counts of the services in force: the services, and
/// their backends as the listing shows them (down where a check found
/// them down, else quiesced at weight 0, else healthy), without building
/// the listing: at 100,000 services that took a third of a second on the
/// engine's thread, which every edit waited behind.
pub fn tally(e: &Engine) -> crate::status::ServicesView {
    let checked = checked(e);
    let mut t = crate::status::ServicesView {
        services: e.applied().len(),
        from_kubernetes: e.kube_services().len(),
        ..Default::default()
    };
    for s in e.applied().values() {
        for b in &s.backends {
            t.backends += 1;
            match listed(e, &checked, s.key, b) {
                (Some(false), _) => t.down += 1,
                (_, 0) => t.quiesced += 1,
                _ => t.healthy += 1,
            }
        }
    }
    t
}

/// Reads every service's counts and counters (on the engine thread).
pub fn sample(e: &Engine) -> Vec<ServiceSample> {
    let compiled: HashMap<ServiceKey, _> = e.dataplane().services().map(|c| (c.key(), c)).collect();
    let checked = checked(e);
    e.applied()
        .values()
        .map(|s| {
            let c = compiled.get(&s.key);
            ServiceSample {
                key: s.key,
                scheduler: s.scheduler.name().to_owned(),
                flags: [
                    (s.flags.fallback, SchedulerFlag::Fallback),
                    (s.flags.port, SchedulerFlag::Port),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, f)| f.name().to_owned())
                .collect(),
                persistence: s.persistence,
                backends: s
                    .backends
                    .iter()
                    .map(|b| {
                        // Counts and counters are by the backend's stable id.
                        let id = c.and_then(|c| Some((c, c.backend_id(b.address, b.port)?)));
                        let (up, weight) = listed(e, &checked, s.key, b);
                        BackendSample {
                            address: b.address,
                            port: b.port,
                            weight,
                            forward: (b.forward, b.encap),
                            up,
                            active: id.map_or(0, |(c, id)| u64::from(c.counts().active(id))),
                            inactive: id.map_or(0, |(c, id)| u64::from(c.counts().inactive(id))),
                            totals: id.map_or_else(TrafficTotals::default, |(c, id)| {
                                c.stats().backend(id)
                            }),
                        }
                    })
                    .collect(),
                totals: c.map_or_else(TrafficTotals::default, |c| c.totals()),
            }
        })
        .collect()
}

/// The services as the workers have them, shared (a handle each: the
/// counters they point to stay live and are read without the engine).
pub fn compiled_services(e: &Engine) -> Vec<AnyService> {
    e.dataplane().services().cloned().collect()
}

/// A backend as the estimator tracks it: its service, address and port.
pub type RateKey = (ServiceKey, std::net::IpAddr, u16);

/// Calls `f` with every backend's counters, read from the services as
/// the workers have them: what the estimator samples every 2 seconds.
/// The same backends and totals as [`sample`]'s, without the rest of a
/// listing (names, weights, health, counts) or a lookup per service: at
/// 100,000 services x 3 the estimator's sample was most of an idle
/// daemon's control-plane CPU (`xvs-control-bench --services 100000`).
///
/// Each service's reads chase pointers (the service, then its backend
/// list and counter cells, each a cache miss at that count), so they are
/// fetched in two passes ahead of it: the service 16 places
/// before, what it points to 8 places before.
///
/// `services` is [`compiled_services`]'s snapshot: the visit reads only
/// the shared counters, so it runs off the engine's thread (at 100,000
/// services it takes a tenth of a second or more, which on the engine's
/// thread every edit waited behind).
pub fn visit_totals(services: &[AnyService], f: &mut dyn FnMut(RateKey, TrafficTotals)) {
    const AHEAD: usize = 8;
    for (i, c) in services.iter().enumerate() {
        if let Some(s) = services.get(i + 2 * AHEAD) {
            s.prefetch();
        }
        if let Some(s) = services.get(i + AHEAD) {
            s.prefetch_backends();
        }
        let (key, stats) = (c.key(), c.stats());
        c.for_each_backend(|addr, port, id| f((key, addr, port), stats.backend(id)));
    }
}

/// Smoothed rates per backend, in the estimator's fixed point (values
/// scaled by 2^10 as IPVS keeps them, so small rates do not round to 0).
///
/// Invariant: a backend is tracked exactly while the last sample had it
/// (its `round` is the estimator's), and a service exactly while it has a
/// backend tracked; one pass to forget the rest: linear in the backends.
/// Grouped by service, as a sample visits them: a service's backends
/// are one lookup in the large map (a cache miss at 100,000 services)
/// and then lookups in a small one whose lines that first one fetched.
#[derive(Debug, Default)]
pub struct Estimator {
    /// By service, then by backend address and port (a fast hash: the
    /// keys come from the configuration, not from packets).
    tracked: hashbrown::HashMap<ServiceKey, hashbrown::HashMap<(std::net::IpAddr, u16), Tracked>>,
    round: u32,
}

/// One backend's last totals and smoothed rates.
#[derive(Debug)]
struct Tracked {
    last: TrafficTotals,
    /// None until a second sample gives a rate.
    avg: Option<[i64; 5]>,
    /// The sample that last had it.
    round: u32,
}

const SCALE: i64 = 1 << 10;

fn rates_of(avg: &[i64; 5]) -> Rates {
    let v = |i: usize| (avg[i].max(0) + SCALE / 2) as u64 / SCALE as u64;
    Rates {
        cps: v(0),
        inpps: v(1),
        outpps: v(2),
        inbps: v(3),
        outbps: v(4),
    }
}

impl Estimator {
    /// [`Estimator::update_from`] over a listing's samples (the tests'
    /// way; the daemon visits the compiled services, [`visit_totals`]).
    #[cfg(test)]
    pub fn update(&mut self, samples: &[ServiceSample], seconds: f64) {
        self.update_from(seconds, |observe| {
            for s in samples {
                for b in &s.backends {
                    observe((s.key, b.address, b.port), b.totals);
                }
            }
        });
    }

    /// Takes one sample, `seconds` after the previous one: every backend
    /// `visit` hands the observer it is given, once ([`visit_totals`]).
    /// Linear in the backends (dropping the ones no longer sampled by
    /// searching a list made each update quadratic: 0.9 s of CPU every
    /// 2 s at 10,000 services x 3).
    pub fn update_from(
        &mut self,
        seconds: f64,
        visit: impl FnOnce(&mut dyn FnMut(RateKey, TrafficTotals)),
    ) {
        self.round = self.round.wrapping_add(1);
        let round = self.round;
        let per_sec = |now: u64, then: u64| {
            (now.saturating_sub(then) as f64 / seconds.max(1e-3) * SCALE as f64) as i64
        };
        let tracked = &mut self.tracked;
        visit(&mut |(service, addr, port), t| {
            let entry = tracked.entry(service).or_default().entry((addr, port));
            let hashbrown::hash_map::Entry::Occupied(mut o) = entry else {
                entry.insert(Tracked {
                    last: t,
                    avg: None,
                    round,
                });
                return;
            };
            let k = o.get_mut();
            let prev = std::mem::replace(&mut k.last, t);
            k.round = round;
            let rate = [
                per_sec(t.conns, prev.conns),
                per_sec(t.pkts[0], prev.pkts[0]),
                per_sec(t.pkts[1], prev.pkts[1]),
                per_sec(t.bytes[0], prev.bytes[0]),
                per_sec(t.bytes[1], prev.bytes[1]),
            ];
            let avg = k.avg.get_or_insert(rate);
            for (a, r) in avg.iter_mut().zip(rate) {
                *a += (r - *a) >> 2;
            }
        });
        self.tracked.retain(|_, backends| {
            backends.retain(|_, k| k.round == round);
            !backends.is_empty()
        });
    }

    /// The rates of one backend.
    pub fn rates(&self, key: &ServiceKey, addr: std::net::IpAddr, port: u16) -> Rates {
        self.tracked
            .get(key)
            .and_then(|backends| backends.get(&(addr, port))?.avg.as_ref())
            .map(rates_of)
            .unwrap_or_default()
    }

    /// `-Z`: the rates of `key` (every service when `None`) start again
    /// from 0, as IPVS's `ip_vs_zero_estimator` does; the next sample
    /// measures from the current counters.
    pub fn zero(&mut self, key: Option<&ServiceKey>) {
        for (_, backends) in self
            .tracked
            .iter_mut()
            .filter(|(k, _)| key.is_none_or(|key| *k == key))
        {
            for t in backends.values_mut() {
                if let Some(avg) = &mut t.avg {
                    *avg = [0; 5];
                }
            }
        }
    }
}

/// The counters `-Z` set back to 0: the totals at the time, which the
/// ipvsadm listing subtracts (`--stats` counts from the zeroing). The
/// data plane's counters and the Prometheus ones stay monotonic.
///
/// Invariant: only services and backends still served have a base (the
/// engine forgets a removed service's, and a removed backend's), so a
/// re-created one counts from its own start.
#[derive(Debug, Clone, Default)]
pub struct Zeroed {
    base: HashMap<ServiceKey, ZeroBase>,
}

#[derive(Debug, Clone, Default)]
struct ZeroBase {
    service: TrafficTotals,
    backends: HashMap<(std::net::IpAddr, u16), TrafficTotals>,
}

fn minus(t: &TrafficTotals, base: &TrafficTotals) -> TrafficTotals {
    TrafficTotals {
        conns: t.conns.saturating_sub(base.conns),
        pkts: [
            t.pkts[0].saturating_sub(base.pkts[0]),
            t.pkts[1].saturating_sub(base.pkts[1]),
        ],
        bytes: [
            t.bytes[0].saturating_sub(base.bytes[0]),
            t.bytes[1].saturating_sub(base.bytes[1]),
        ],
    }
}

impl Zeroed {
    /// Zeroes the counters of `key` (every service when `None`) as they
    /// are in `samples`.
    pub fn zero(&mut self, samples: &[ServiceSample], key: Option<&ServiceKey>) {
        for s in samples.iter().filter(|s| key.is_none_or(|k| s.key == *k)) {
            self.base.insert(
                s.key,
                ZeroBase {
                    service: s.totals,
                    backends: s
                        .backends
                        .iter()
                        .map(|b| ((b.address, b.port), b.totals))
                        .collect(),
                },
            );
        }
    }

    /// The service `key` is gone.
    pub fn forget(&mut self, key: &ServiceKey) {
        self.base.remove(key);
    }

    /// The service `svc` is served as it is now: bases of backends it no
    /// longer has are dropped.
    pub fn keep_backends(&mut self, svc: &xvs_config::Service) {
        if let Some(b) = self.base.get_mut(&svc.key) {
            b.backends
                .retain(|(a, p), _| svc.backends.iter().any(|x| x.address == *a && x.port == *p));
        }
    }

    /// `samples` as counted since the zeroing.
    pub fn apply(&self, samples: &mut [ServiceSample]) {
        for s in samples {
            let Some(base) = self.base.get(&s.key) else {
                continue;
            };
            s.totals = minus(&s.totals, &base.service);
            for b in &mut s.backends {
                if let Some(bb) = base.backends.get(&(b.address, b.port)) {
                    b.totals = minus(&b.totals, bb);
                }
            }
        }
    }
}

fn stats_of(t: &TrafficTotals) -> Stats {
    Stats {
        conns: t.conns,
        inpkts: t.pkts[0],
        outpkts: t.pkts[1],
        inbytes: t.bytes[0],
        outbytes: t.bytes[1],
    }
}

fn add_rates(a: &mut Rates, b: &Rates) {
    a.cps += b.cps;
    a.inpps += b.inpps;
    a.outpps += b.outpps;
    a.inbps += b.inbps;
    a.outbps += b.outbps;
}

/// The service table view from a sample and the estimator.
pub fn listing(size: u32, samples: &[ServiceSample], est: &Estimator) -> Listing {
    let services = samples
        .iter()
        .map(|s| {
            let mut rates = Rates::default();
            let backends = s
                .backends
                .iter()
                .map(|b| {
                    let r = est.rates(&s.key, b.address, b.port);
                    add_rates(&mut rates, &r);
                    BackendView {
                        address: b.address,
                        port: b.port,
                        weight: b.weight,
                        forward: b.forward.0,
                        encap: (b.forward.0 == xvs_config::ForwardMethod::Tunnel)
                            .then_some(b.forward.1),
                        health: b.up.map(|up| if up { "up" } else { "down" }.to_owned()),
                        active: b.active,
                        inactive: b.inactive,
                        stats: stats_of(&b.totals),
                        rates: r,
                    }
                })
                .collect();
            ServiceView {
                protocol: s.key.protocol.name().to_owned(),
                vip: s.key.vip,
                port: s.key.port,
                scheduler: s.scheduler.clone(),
                flags: s.flags.clone(),
                persistence: s.persistence.map(|p| PersistView {
                    timeout: p.timeout_secs,
                    netmask: p.netmask,
                }),
                stats: stats_of(&s.totals),
                rates,
                backends,
            }
        })
        .collect();
    Listing { size, services }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xvs_config::Protocol;

    fn sample_with(conns: u64, pkts: u64) -> Vec<ServiceSample> {
        let totals = TrafficTotals {
            conns,
            pkts: [pkts, pkts],
            bytes: [pkts * 100, pkts * 100],
        };
        vec![ServiceSample {
            totals,
            key: ServiceKey {
                vip: Ipv4Addr::new(198, 19, 0, 1).into(),
                protocol: Protocol::Tcp,
                port: 80,
            },
            scheduler: "rr".into(),
            flags: Vec::new(),
            persistence: None,
            backends: vec![BackendSample {
                address: Ipv4Addr::new(198, 18, 1, 10).into(),
                port: 80,
                weight: 1,
                forward: Default::default(),
                up: None,
                active: 0,
                inactive: 0,
                totals,
            }],
        }]
    }

    #[test]
    fn the_estimator_converges_like_ipvs() {
        let mut e = Estimator::default();
        e.update(&sample_with(0, 0), SAMPLE_SECONDS);
        // A steady 100 conn/s and 1000 pkt/s.
        let mut conns = 0;
        let mut pkts = 0;
        for _ in 0..40 {
            conns += 200;
            pkts += 2000;
            e.update(&sample_with(conns, pkts), SAMPLE_SECONDS);
        }
        let l = listing(4096, &sample_with(conns, pkts), &e);
        let r = l.services[0].backends[0].rates;
        assert_eq!(
            (r.cps, r.inpps, r.outpps, r.inbps),
            (100, 1000, 1000, 100_000)
        );
        assert_eq!(l.services[0].rates, r, "the service sums its backends");
        assert_eq!(l.services[0].stats.conns, conns);
        // Traffic stops: the averages decay by 3/4 per sample.
        e.update(&sample_with(conns, pkts), SAMPLE_SECONDS);
        let r = listing(4096, &sample_with(conns, pkts), &e).services[0].backends[0].rates;
        assert_eq!(r.cps, 75);
    }

    /// `-Z` on one service restarts its rates only; on every service, all
    /// of them; a service none of whose backends was sampled is
    /// forgotten with them.
    #[test]
    fn zero_restarts_one_service_s_rates_or_all_and_an_empty_service_is_forgotten() {
        let both = |conns: u64, with_81: bool| {
            let mut s = sample_with(conns, conns);
            if with_81 {
                let mut t = s[0].clone();
                t.key.port = 81;
                s.push(t);
            }
            s
        };
        let (k80, mut k81) = (both(0, false)[0].key, both(0, false)[0].key);
        k81.port = 81;
        let b: std::net::IpAddr = Ipv4Addr::new(198, 18, 1, 10).into();
        let mut e = Estimator::default();
        e.update(&both(0, true), SAMPLE_SECONDS);
        e.update(&both(200, true), SAMPLE_SECONDS);
        assert_eq!(
            (e.rates(&k80, b, 80).cps, e.rates(&k81, b, 80).cps),
            (100, 100)
        );
        e.zero(Some(&k81));
        assert_eq!(
            (e.rates(&k80, b, 80).cps, e.rates(&k81, b, 80).cps),
            (100, 0)
        );
        e.zero(None);
        assert_eq!(e.rates(&k80, b, 80), Rates::default());
        e.update(&both(400, true), SAMPLE_SECONDS);
        assert_eq!(e.rates(&k81, b, 80).cps, 25, "from 0, a quarter of 100");
        e.update(&both(600, false), SAMPLE_SECONDS);
        assert!(!e.tracked.contains_key(&k81), "forgotten with its backend");
        assert!(e.tracked.contains_key(&k80));
    }

    /// A backend left out of a sample is forgotten: its rate is gone, and
    /// when it comes back its counters are a new start, not a jump.
    #[test]
    fn a_backend_no_longer_sampled_is_forgotten() {
        let two = |conns: u64, second: Option<u64>| {
            let mut s = sample_with(conns, conns);
            if let Some(c) = second {
                let mut b = s[0].backends[0].clone();
                b.address = Ipv4Addr::new(198, 18, 1, 11).into();
                b.totals.conns = c;
                s[0].backends.push(b);
            }
            s
        };
        let key = two(0, None)[0].key;
        let b2: std::net::IpAddr = Ipv4Addr::new(198, 18, 1, 11).into();
        let mut e = Estimator::default();
        e.update(&two(0, Some(0)), SAMPLE_SECONDS);
        e.update(&two(200, Some(200)), SAMPLE_SECONDS);
        assert_eq!(e.rates(&key, b2, 80).cps, 100, "its first rate");
        e.update(&two(400, None), SAMPLE_SECONDS);
        assert_eq!(e.rates(&key, b2, 80), Rates::default(), "forgotten");
        assert_eq!(
            e.rates(&key, Ipv4Addr::new(198, 18, 1, 10).into(), 80).cps,
            100
        );
        e.update(&two(600, Some(1_000_000)), SAMPLE_SECONDS);
        assert_eq!(
            e.rates(&key, b2, 80),
            Rates::default(),
            "back: its first sample is a start"
        );
        e.update(&two(800, Some(1_000_200)), SAMPLE_SECONDS);
        assert_eq!(e.rates(&key, b2, 80).cps, 100, "measured from its return");
    }
}
