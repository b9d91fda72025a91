//! Fuzzes the admin API's JSON bodies as the API takes them: any input is
//! refused by serde or becomes a service or a list of problems (each one
//! `FIELD: MESSAGE`), and a service then gets the file's rules; never a
//! panic. Timeouts bodies go through the same names and ranges as the
//! file's `[conntrack.timeouts]`; batches of edits through the same
//! bodies.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use xvs_config::api::{BackendSpec, EditSpec, ServiceSpec};

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = serde_json::from_slice::<ServiceSpec>(data) {
        match spec.to_service() {
            Ok(svc) => {
                // A gateway of both families, so services of either get
                // every rule (and the narrowing a data plane does).
                let host = [
                    std::net::IpAddr::from([198, 18, 0, 1]),
                    std::net::IpAddr::from([0x2001, 2, 0, 1, 0, 0, 0, 1u16]),
                ];
                // And a link prefix, so direct-routing backends meet
                // that rule too.
                let connected: [ipnet::IpNet; 1] = [ipnet::IpNet::V4(ipnet::Ipv4Net::new_assert(
                    [198, 18, 0, 0].into(),
                    16,
                ))];
                let gateway = xvs_config::Gateway {
                    snat: &host,
                    host: &host,
                    connected: &connected,
                };
                let violations = svc.check_in(&gateway);
                if violations.is_empty() {
                    let one = svc.narrow::<std::net::Ipv4Addr>().is_some()
                        || svc.narrow::<std::net::Ipv6Addr>().is_some();
                    assert!(one, "a valid service is of one family: {svc:?}");
                }
                for v in svc.check_in(&gateway) {
                    assert!(!v.to_string().is_empty());
                }
            }
            Err(problems) => {
                assert!(!problems.is_empty());
                assert!(problems.iter().all(|p| p.contains(": ")), "{problems:?}");
            }
        }
    }
    if let Ok(b) = serde_json::from_slice::<BackendSpec>(data) {
        let key = xvs_config::ServiceKey {
            vip: std::net::Ipv4Addr::new(198, 19, 0, 1).into(),
            protocol: xvs_config::Protocol::Tcp,
            port: 80,
        };
        let _ = b.to_backend(&key);
    }
    // `/v1/batch` (xvsadm -R): a list of edits, each its own body.
    if let Ok(edits) = serde_json::from_slice::<Vec<EditSpec>>(data) {
        for e in &edits {
            match e {
                EditSpec::AddService { service } | EditSpec::EditService { service } => {
                    let _ = service.to_service();
                    let _ = service.unknown_scheduler();
                }
                EditSpec::DeleteService { service } | EditSpec::DeleteBackend { service, .. } => {
                    let _ = service.key();
                }
                EditSpec::AddBackend { service, backend }
                | EditSpec::EditBackend { service, backend } => {
                    if let Ok(k) = service.key() {
                        let _ = backend.to_backend(&k);
                    }
                }
                EditSpec::Clear => {}
            }
        }
    }
    if let Ok(states) = serde_json::from_slice::<BTreeMap<String, u64>>(data) {
        let mut t = xvs_config::Timeouts::default();
        for (name, secs) in &states {
            if t.set(name, *secs).is_ok() {
                assert!((1..=u64::from(xvs_config::MAX_TIMEOUT_SECS)).contains(secs));
            }
        }
    }
});
