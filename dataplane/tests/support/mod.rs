//! What the pipeline tests share: their worker's settings, their
//! services, and running one frame through a pipeline.

// Each test file uses what it needs of this module.
#![allow(dead_code)]

use smoltcp::wire::EthernetAddress;
use xvs_config::{
    Address, Backend, ConnRules, ForwardMethod, PortRange, Protocol, Scheduler, Service,
    ServiceKey, Timeouts, UnknownPort,
};
use xvs_dataplane::pipeline::{Lookup, Pipeline, PipelineConfig, Prepared, Verdict};

/// The gateway's Ethernet address in every fixture.
pub(crate) const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// Worker 0's settings in the tests: the gateway's address on both
/// sides, SNAT ports 1024-1100, 1024 flows, the default timeouts and
/// rules, unknown ports dropped, and no SNAT address (each test names
/// its own).
pub(crate) fn config() -> PipelineConfig {
    PipelineConfig {
        worker: 0,
        mac: EthernetAddress(GW_MAC),
        backend_mac: EthernetAddress(GW_MAC),
        snat_addrs: Vec::new(),
        snat_addrs6: Vec::new(),
        snat_ports: PortRange {
            first: 1024,
            last: 1100,
        },
        capacity: 1024,
        timeouts: Timeouts::default(),
        rules: ConnRules::default(),
        unknown_port: UnknownPort::Drop,
        tunnel: Default::default(),
        backend_mtu: 1500,
    }
}

/// An rr service `vip`:`port` over `backends` (address, port, weight),
/// full NAT, of either family.
pub(crate) fn rr_service<A: Address>(
    vip: A,
    protocol: Protocol,
    port: u16,
    backends: &[(A, u16, u32)],
) -> Service<A> {
    let mut s = Service::new(ServiceKey {
        vip,
        protocol,
        port,
    });
    s.scheduler = Scheduler::Rr;
    s.backends = backends
        .iter()
        .map(|&(address, port, weight)| Backend {
            address,
            port,
            weight,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        })
        .collect();
    s
}

/// Runs `frame` through `p` (received on the client side) at `now`; the
/// verdict and the frame as it would be sent (empty when dropped or
/// consumed). Checks after every frame that the counters add up.
pub(crate) fn run(p: &mut Pipeline, frame: &[u8], now: u32) -> (Verdict, Vec<u8>) {
    let mut buf = vec![0u8; 2048];
    buf[..frame.len()].copy_from_slice(frame);
    let v = p.process(&mut buf, frame.len(), now);
    let len = match v {
        Verdict::Forward { len: n, .. } | Verdict::Answer(n) => n,
        _ => 0,
    };
    buf.truncate(len);
    let c = p.counters();
    assert_eq!(
        c.rx,
        c.forwarded + c.answered + c.consumed + c.dropped(),
        "{c:?}"
    );
    (v, buf)
}

/// `frames` classified and looked up as one batch, the worker's way.
pub(crate) fn looked_up<F: AsRef<[u8]>>(
    p: &mut Pipeline,
    frames: &[F],
) -> (Vec<Prepared>, Vec<Lookup>) {
    let prepared: Vec<Prepared> = frames.iter().map(|f| Prepared::of(f.as_ref())).collect();
    let mut looked = vec![Lookup::NotYet; prepared.len()];
    p.lookup_prepared(&prepared, &mut looked);
    (prepared, looked)
}
