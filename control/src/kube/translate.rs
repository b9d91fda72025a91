//! Kubernetes Services and EndpointSlices → xvs services, with
//! kube-proxy's semantics (pkg/proxy/servicechangetracker.go,
//! endpointslicecache.go, topology.go):
//!
//! - only Services labelled `service.kubernetes.io/service-proxy-name=<ours>`;
//!   headless (`clusterIP: None`) and `ExternalName` Services are skipped;
//! - VIPs: `spec.clusterIPs` (or `clusterIP`: both families of a
//!   dual-stack Service, as `ipFamilies` lists them), `spec.externalIPs`,
//!   `status.loadBalancer.ingress[].ip`; one xvs service per (VIP,
//!   protocol, port); SCTP ports are skipped;
//! - backends: every EndpointSlice of the Service of the VIP's family
//!   (`addressType` IPv4 or IPv6: kube-proxy's one proxier per family,
//!   never NAT64; FQDN slices are skipped), the slice port
//!   matched by name (and protocol), duplicates removed; ready endpoints
//!   (a missing condition counts as ready); if none is ready, the serving
//!   and terminating ones (kube-proxy's fallback); when some are ready, the
//!   terminating-but-serving ones stay with weight 0 so their flows finish;
//!   no endpoint at all leaves the service without backends, which xvs
//!   rejects (TCP RST / ICMP port unreachable) like kube-proxy;
//! - `sessionAffinity: ClientIP` → persistence for `timeoutSeconds`
//!   (default 10800) over the whole client address (/32, /128);
//! - `loadBalancerSourceRanges` → the source ACL of the load-balancer VIPs
//!   (each VIP takes the ranges of its family);
//! - annotations `xvs.io/scheduler`, `xvs.io/scheduler-flags`,
//!   `xvs.io/maglev-table-size`; a value that is not a scheduler, flag or
//!   number is reported as a warning (for the Service's log line and
//!   metrics) and the default used; a value the rules refuse (say a table
//!   size that is not prime) is not replaced here: the engine checks every
//!   translated service with the file's rules and refuses it, reported as
//!   the file and the API would report it.
//!
//! Pure functions of the objects: the watcher feeds them, tests call them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use xvs_config::{
    full_mask, Address, Backend, Family, ForwardMethod, Persistence, Protocol, Scheduler,
    SchedulerFlag, Service, ServiceKey,
};

/// The label that assigns a Service to a proxy.
pub const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Annotation: scheduler.
pub const ANN_SCHEDULER: &str = "xvs.io/scheduler";
/// Annotation: scheduler flags (comma-separated).
pub const ANN_FLAGS: &str = "xvs.io/scheduler-flags";
/// Annotation: Maglev table size.
pub const ANN_MAGLEV: &str = "xvs.io/maglev-table-size";
/// kube-proxy's default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10_800;

/// What one Service became.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Translated {
    /// xvs services, one per (VIP, protocol, port).
    pub services: Vec<Service>,
    /// Problems with the Service's values (the defaults were used).
    pub warnings: Vec<String>,
}

/// `namespace/name` of an object.
pub fn full_name(ns: Option<&str>, name: Option<&str>) -> String {
    format!("{}/{}", ns.unwrap_or("default"), name.unwrap_or(""))
}

/// Whether the Service is ours to serve.
pub fn selected(svc: &KubeService, proxy_name: &str) -> bool {
    svc.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PROXY_NAME_LABEL))
        .is_some_and(|v| v == proxy_name)
}

/// The Service an EndpointSlice belongs to (`namespace/name`).
pub fn slice_owner(s: &EndpointSlice) -> Option<String> {
    let name = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(full_name(s.metadata.namespace.as_deref(), Some(name)))
}

fn protocol(p: Option<&str>) -> Option<Protocol> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        _ => None,
    }
}

fn ip(s: &str) -> Option<IpAddr> {
    s.trim().parse().ok()
}

/// An EndpointSlice's `addressType` for a family.
fn address_type(f: Family) -> &'static str {
    match f {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// One endpoint address of a port, with its conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    addr: IpAddr,
    port: u16,
    ready: bool,
    serving: bool,
    terminating: bool,
}

/// The backends of one Service port from its slices of `family`,
/// kube-proxy's way.
fn backends(
    slices: &[&EndpointSlice],
    port_name: Option<&str>,
    proto: Protocol,
    family: Family,
) -> Vec<Backend> {
    let mut found: BTreeMap<(IpAddr, u16), Candidate> = BTreeMap::new();
    let wanted = port_name.unwrap_or("");
    let of_family = |s: &&&EndpointSlice| s.address_type == address_type(family);
    for s in slices.iter().filter(of_family) {
        let Some(port) = s.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == wanted
                && protocol(p.protocol.as_deref()) == Some(proto)
        }) else {
            continue;
        };
        let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for e in s.endpoints.iter().flatten() {
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            let mine = e.addresses.iter().filter_map(|a| ip(a));
            for a in mine.filter(|a| a.family() == family) {
                let cand = Candidate {
                    addr: a,
                    port,
                    ready,
                    serving,
                    terminating,
                };
                // A duplicate (the same address in two slices) keeps its
                // best state.
                found
                    .entry((a, port))
                    .and_modify(|old| {
                        if cand.ready && !old.ready {
                            *old = cand;
                        }
                    })
                    .or_insert(cand);
            }
        }
    }
    let any_ready = found.values().any(|c| c.ready);
    found
        .values()
        .filter_map(|c| {
            let weight = if any_ready {
                if c.ready {
                    1
                } else if c.serving && c.terminating {
                    0 // finishing its flows, no new ones
                } else {
                    return None;
                }
            } else if c.serving && c.terminating {
                1 // the fallback
            } else {
                return None;
            };
            Some(Backend {
                address: c.addr,
                port: c.port,
                weight,
                forward: ForwardMethod::Masq,
                encap: Default::default(),
            })
        })
        .collect()
}

/// Translates one selected Service with the EndpointSlices that name it.
pub fn translate(svc: &KubeService, slices: &[&EndpointSlice]) -> Translated {
    let mut out = Translated::default();
    let name = full_name(
        svc.metadata.namespace.as_deref(),
        svc.metadata.name.as_deref(),
    );
    let Some(spec) = &svc.spec else {
        return out;
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return out;
    }
    if spec.cluster_ip.as_deref() == Some("None") {
        return out; // headless
    }
    let annotations = svc.metadata.annotations.clone().unwrap_or_default();
    let mut scheduler = Scheduler::Rr; // kube-proxy's IPVS default
    if let Some(v) = annotations.get(ANN_SCHEDULER) {
        match v.parse::<Scheduler>() {
            Ok(s) => scheduler = s,
            Err(_) => out.warnings.push(format!(
                "{name}: annotation {ANN_SCHEDULER}=\"{v}\" is not a scheduler; using rr"
            )),
        }
    }
    let mut flags = xvs_config::SchedulerFlags::default();
    if let Some(v) = annotations.get(ANN_FLAGS) {
        for f in v.split(',').map(str::trim).filter(|f| !f.is_empty()) {
            match f.trim_start_matches("sh-").trim_start_matches("mh-").parse::<SchedulerFlag>() {
                Ok(flag) => {
                    flags.set(flag);
                }
                Err(_) => out.warnings.push(format!(
                    "{name}: annotation {ANN_FLAGS}: \"{f}\" is not a flag (fallback, port); ignored"
                )),
            }
        }
    }
    let mut maglev = None;
    if let Some(v) = annotations.get(ANN_MAGLEV) {
        match v.parse::<u32>() {
            Ok(n) => maglev = Some(n),
            Err(_) => out.warnings.push(format!(
                "{name}: annotation {ANN_MAGLEV}=\"{v}\" is not a number; using the default"
            )),
        }
    }
    // ClientIP affinity's timeout (the mask is per VIP below: the whole
    // address of the VIP's family).
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_SECONDS)
    });
    let mut source_ranges: Vec<IpNet> = Vec::new();
    for r in spec.load_balancer_source_ranges.iter().flatten() {
        match r.trim().parse::<IpNet>() {
            Ok(n) => source_ranges.push(n.trunc()),
            Err(_) => out.warnings.push(format!(
                "{name}: loadBalancerSourceRanges \"{r}\" is not a CIDR; ignored"
            )),
        }
    }
    // VIPs, with whether each is a load-balancer address (the source
    // ranges apply to those only, as in kube-proxy).
    let mut vips: Vec<(IpAddr, bool)> = Vec::new();
    let cluster: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.iter().map(String::as_str).collect(),
    };
    for ip in cluster
        .into_iter()
        .chain(spec.external_ips.iter().flatten().map(String::as_str))
    {
        if let Some(a) = self::ip(ip) {
            vips.push((a, false));
        }
    }
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref());
    for i in ingress.iter().copied().flatten() {
        if let Some(a) = i.ip.as_deref().and_then(ip) {
            vips.push((a, true));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    vips.retain(|v| seen.insert(v.0));
    for p in spec.ports.iter().flatten() {
        let Some(proto) = protocol(p.protocol.as_deref()) else {
            continue; // SCTP
        };
        let Ok(port) = u16::try_from(p.port) else {
            continue;
        };
        let mut by_family = BTreeMap::new();
        for &(vip, lb) in &vips {
            let family = vip.family();
            let backends = by_family
                .entry(family)
                .or_insert_with(|| backends(slices, p.name.as_deref(), proto, family));
            let mut s = Service::new(ServiceKey {
                vip,
                protocol: proto,
                port,
            });
            s.name = Some(match &p.name {
                Some(n) if !n.is_empty() => format!("{name}:{n}"),
                _ => name.clone(),
            });
            s.scheduler = scheduler;
            s.flags = flags;
            s.persistence = affinity.map(|timeout_secs| Persistence {
                timeout_secs,
                netmask: full_mask(vip),
            });
            s.maglev_table_size = maglev;
            if lb {
                s.source_ranges = source_ranges
                    .iter()
                    .filter(|n| n.addr().family() == family)
                    .copied()
                    .collect();
            }
            s.backends = backends.clone();
            out.services.push(s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec,
        ServiceStatus, SessionAffinityConfig,
    };
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::net::Ipv4Addr;

    fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("web".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    fn port(name: &str, p: i32, proto: &str) -> ServicePort {
        ServicePort {
            name: (!name.is_empty()).then(|| name.into()),
            port: p,
            protocol: Some(proto.into()),
            ..ServicePort::default()
        }
    }

    fn service(ports: Vec<ServicePort>) -> KubeService {
        KubeService {
            metadata: meta("shop", &[(PROXY_NAME_LABEL, "xvs")]),
            spec: Some(ServiceSpec {
                cluster_ip: Some("198.19.0.10".into()),
                cluster_ips: Some(vec!["198.19.0.10".into()]),
                ports: Some(ports),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    fn ep(
        addr: &str,
        ready: Option<bool>,
        serving: Option<bool>,
        terminating: Option<bool>,
    ) -> Endpoint {
        Endpoint {
            addresses: vec![addr.into()],
            conditions: Some(EndpointConditions {
                ready,
                serving,
                terminating,
            }),
            ..Endpoint::default()
        }
    }

    fn slice(name: &str, ports: &[(&str, i32)], endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            metadata: meta(name, &[(SERVICE_NAME_LABEL, "shop")]),
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: (!n.is_empty()).then(|| n.to_string()),
                        port: Some(*p),
                        protocol: Some("TCP".into()),
                        ..EndpointPort::default()
                    })
                    .collect(),
            ),
        }
    }

    fn addrs(s: &Service) -> Vec<(String, u16, u32)> {
        s.backends
            .iter()
            .map(|b| (b.address.to_string(), b.port, b.weight))
            .collect()
    }

    #[test]
    fn basic_endpoint() {
        let svc = service(vec![port("", 80, "TCP")]);
        let sl = slice(
            "shop-1",
            &[("", 8080)],
            vec![ep("198.18.1.10", Some(true), None, None)],
        );
        let t = translate(&svc, &[&sl]);
        assert_eq!(t.services.len(), 1);
        let s = &t.services[0];
        assert_eq!(s.key.vip, Ipv4Addr::new(198, 19, 0, 10));
        assert_eq!((s.key.protocol, s.key.port), (Protocol::Tcp, 80));
        assert_eq!(s.scheduler, Scheduler::Rr);
        assert_eq!(addrs(s), [("198.18.1.10".into(), 8080, 1)]);
        assert_eq!(s.name.as_deref(), Some("web/shop"));
        assert!(t.warnings.is_empty());
    }

    #[test]
    fn multiport_and_named_ports_match_by_name() {
        let svc = service(vec![
            port("http", 80, "TCP"),
            port("metrics", 9100, "TCP"),
            port("dns", 53, "UDP"),
        ]);
        // Two slices: ports named, in another order, one duplicate address.
        let a = slice(
            "shop-a",
            &[("metrics", 9101), ("http", 8080)],
            vec![
                ep("198.18.1.10", None, None, None),
                ep("198.18.1.11", Some(true), None, None),
            ],
        );
        let b = slice(
            "shop-b",
            &[("http", 8080)],
            vec![ep("198.18.1.11", Some(true), None, None)],
        );
        let t = translate(&svc, &[&a, &b]);
        let by_port: BTreeMap<u16, &Service> = t.services.iter().map(|s| (s.key.port, s)).collect();
        assert_eq!(
            addrs(by_port[&80]),
            [
                ("198.18.1.10".into(), 8080, 1),
                ("198.18.1.11".into(), 8080, 1)
            ],
            "duplicates removed, a missing condition counts as ready"
        );
        assert_eq!(
            addrs(by_port[&9100]),
            [
                ("198.18.1.10".into(), 9101, 1),
                ("198.18.1.11".into(), 9101, 1)
            ]
        );
        // No slice port named dns (UDP): no endpoints, rejected by xvs.
        assert_eq!(by_port[&53].key.protocol, Protocol::Udp);
        assert!(by_port[&53].backends.is_empty());
        assert_eq!(by_port[&80].name.as_deref(), Some("web/shop:http"));
    }

    #[test]
    fn session_affinity_and_its_timeout() {
        let mut svc = service(vec![port("", 80, "TCP")]);
        let spec = svc.spec.as_mut().unwrap();
        spec.session_affinity = Some("ClientIP".into());
        let t = translate(&svc, &[]);
        assert_eq!(
            t.services[0].persistence,
            Some(Persistence {
                timeout_secs: DEFAULT_AFFINITY_SECONDS,
                netmask: Ipv4Addr::BROADCAST.into()
            })
        );
        svc.spec.as_mut().unwrap().session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(60),
            }),
        });
        assert_eq!(
            translate(&svc, &[]).services[0]
                .persistence
                .unwrap()
                .timeout_secs,
            60
        );
        // Switching it off removes it.
        svc.spec.as_mut().unwrap().session_affinity = Some("None".into());
        assert_eq!(translate(&svc, &[]).services[0].persistence, None);
    }

    #[test]
    fn proxy_name_selects_and_headless_or_external_name_is_skipped() {
        let mut svc = service(vec![port("", 80, "TCP")]);
        assert!(selected(&svc, "xvs"));
        assert!(!selected(&svc, "other"));
        svc.metadata.labels = None;
        assert!(
            !selected(&svc, "xvs"),
            "unlabelled Services are kube-proxy's"
        );
        let mut headless = service(vec![port("", 80, "TCP")]);
        headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        assert!(translate(&headless, &[]).services.is_empty());
        let mut ext = service(vec![port("", 80, "TCP")]);
        ext.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        assert!(translate(&ext, &[]).services.is_empty());
    }

    #[test]
    fn terminating_fallback_and_draining() {
        let svc = service(vec![port("", 80, "TCP")]);
        // Only terminating-but-serving endpoints: they are used.
        let only = slice(
            "s",
            &[("", 8080)],
            vec![
                ep("198.18.1.10", Some(false), Some(true), Some(true)),
                ep("198.18.1.11", Some(false), Some(false), Some(true)),
            ],
        );
        assert_eq!(
            addrs(&translate(&svc, &[&only]).services[0]),
            [("198.18.1.10".into(), 8080, 1)]
        );
        // With a ready one, the terminating one stays with weight 0.
        let mixed = slice(
            "s",
            &[("", 8080)],
            vec![
                ep("198.18.1.10", Some(false), Some(true), Some(true)),
                ep("198.18.1.12", Some(true), Some(true), Some(false)),
                ep("198.18.1.13", Some(false), Some(false), Some(false)),
            ],
        );
        assert_eq!(
            addrs(&translate(&svc, &[&mixed]).services[0]),
            [
                ("198.18.1.10".into(), 8080, 0),
                ("198.18.1.12".into(), 8080, 1)
            ]
        );
    }

    #[test]
    fn vips_from_cluster_external_and_load_balancer_with_source_ranges() {
        let mut svc = service(vec![port("", 443, "TCP")]);
        let spec = svc.spec.as_mut().unwrap();
        spec.external_ips = Some(vec!["198.19.1.1".into(), "2001:db8::1".into()]);
        spec.load_balancer_source_ranges = Some(vec![
            "198.18.0.0/24".into(),
            "2001:2::/48".into(),
            "bogus".into(),
        ]);
        svc.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some("198.19.2.2".into()),
                    ..LoadBalancerIngress::default()
                }]),
            }),
            ..ServiceStatus::default()
        });
        let t = translate(&svc, &[]);
        let vips: Vec<(String, usize)> = t
            .services
            .iter()
            .map(|s| (s.key.vip.to_string(), s.source_ranges.len()))
            .collect();
        // Each load-balancer VIP takes the source ranges of its family.
        assert_eq!(
            vips,
            [
                ("198.19.0.10".into(), 0),
                ("198.19.1.1".into(), 0),
                ("2001:db8::1".into(), 0),
                ("198.19.2.2".into(), 1)
            ]
        );
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(t.warnings[0].contains("bogus"));
    }

    #[test]
    fn a_dual_stack_service_is_one_service_per_family_with_that_familys_endpoints() {
        let mut svc = service(vec![port("http", 80, "TCP")]);
        let spec = svc.spec.as_mut().unwrap();
        spec.cluster_ips = Some(vec!["198.19.0.10".into(), "2001:2:ff::10".into()]);
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        spec.ip_family_policy = Some("RequireDualStack".into());
        spec.session_affinity = Some("ClientIP".into());
        let v4 = slice(
            "shop-a",
            &[("http", 8080)],
            vec![ep("198.18.1.10", None, None, None)],
        );
        let mut v6 = slice(
            "shop-b",
            &[("http", 8080)],
            vec![
                ep("2001:2:0:1::10", None, None, None),
                ep("2001:2:0:1::11", Some(false), None, None),
            ],
        );
        v6.address_type = "IPv6".into();
        // An FQDN slice is no family's.
        let mut fqdn = slice(
            "shop-c",
            &[("http", 8080)],
            vec![ep("a.example", None, None, None)],
        );
        fqdn.address_type = "FQDN".into();
        let t = translate(&svc, &[&v4, &v6, &fqdn]);
        assert_eq!(t.services.len(), 2, "{:?}", t.services);
        assert_eq!(t.services[0].key.vip.to_string(), "198.19.0.10");
        assert_eq!(addrs(&t.services[0]), [("198.18.1.10".into(), 8080, 1)]);
        assert_eq!(t.services[1].key.vip.to_string(), "2001:2:ff::10");
        assert_eq!(addrs(&t.services[1]), [("2001:2:0:1::10".into(), 8080, 1)]);
        // Affinity over the whole client address of each family.
        let masks: Vec<String> = t
            .services
            .iter()
            .map(|s| s.persistence.unwrap().netmask.to_string())
            .collect();
        assert_eq!(
            masks,
            ["255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]
        );
        for s in &t.services {
            assert!(s.check().is_empty(), "{:?}", s.check());
        }
        // Single-stack IPv6.
        let spec = svc.spec.as_mut().unwrap();
        spec.cluster_ip = Some("2001:2:ff::10".into());
        spec.cluster_ips = Some(vec!["2001:2:ff::10".into()]);
        spec.ip_families = Some(vec!["IPv6".into()]);
        let t = translate(&svc, &[&v4, &v6]);
        assert_eq!(t.services.len(), 1);
        assert_eq!(addrs(&t.services[0]), [("2001:2:0:1::10".into(), 8080, 1)]);
    }

    #[test]
    fn annotations_and_their_invalid_values() {
        let mut svc = service(vec![port("", 80, "TCP")]);
        let ann = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        svc.metadata.annotations = ann(&[
            (ANN_SCHEDULER, "mh"),
            (ANN_FLAGS, "mh-fallback,mh-port"),
            (ANN_MAGLEV, "65537"),
        ]);
        let t = translate(&svc, &[]);
        let s = &t.services[0];
        assert_eq!(s.scheduler, Scheduler::Mh);
        assert!(s.flags.fallback && s.flags.port);
        assert_eq!(s.maglev_table_size, Some(65537));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        svc.metadata.annotations = ann(&[(ANN_SCHEDULER, "fastest"), (ANN_MAGLEV, "lots")]);
        let t = translate(&svc, &[]);
        assert_eq!(t.services[0].scheduler, Scheduler::Rr);
        assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
        // A table size the rules refuse (not prime): kept, for the rules
        // to refuse the service as every source's would.
        svc.metadata.annotations = ann(&[(ANN_SCHEDULER, "mh"), (ANN_MAGLEV, "65536")]);
        let t = translate(&svc, &[]);
        assert_eq!(t.services[0].maglev_table_size, Some(65536));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        assert!(t.services[0].check().iter().any(|v| v
            .to_string()
            .starts_with("maglev_table_size: 65536 is not prime")));
        // Every IPVS scheduler, the locality and failover ones included.
        for name in ["lblc", "lblcr", "fo", "ovf"] {
            svc.metadata.annotations = ann(&[(ANN_SCHEDULER, name)]);
            let t = translate(&svc, &[]);
            assert_eq!(t.services[0].scheduler.name(), name);
            assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        }
    }
}
