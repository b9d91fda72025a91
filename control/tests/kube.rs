//! The Kubernetes source against the in-repo fake API server: one test
//! per kube-proxy behaviour, through kube-rs's real watchers over HTTP
//! (list, chunked watch, 410 Expired, the server going away).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // tests bound their waits in real time

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xvs_config::{Protocol, Service, ServiceKey};
use xvs_control::kube::source::{client, run, KubeStatus};
use xvs_vm_tests::fakekube::{FakeKube, Kind};

type Set = BTreeMap<ServiceKey, Service>;

struct Harness {
    fake: FakeKube,
    rx: mpsc::Receiver<Set>,
    status: Arc<KubeStatus>,
    last: Set,
    _rt: tokio::runtime::Runtime,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn svc(name: &str, proxy: Option<&str>, spec: Value) -> Value {
    let mut labels = serde_json::Map::new();
    if let Some(p) = proxy {
        labels.insert("service.kubernetes.io/service-proxy-name".into(), json!(p));
    }
    let mut spec = spec;
    if spec.get("clusterIP").is_none() {
        spec["clusterIP"] = json!("198.19.0.10");
        spec["clusterIPs"] = json!(["198.19.0.10"]);
    }
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "web", "labels": labels},
        "spec": spec,
    })
}

/// `web/shop`, ours, TCP port 80 on 198.19.0.10.
fn shop80() -> Value {
    svc(
        "shop",
        Some("xvs"),
        json!({"ports": ports(&[("", 80, "TCP")])}),
    )
}

fn ports(list: &[(&str, i64, &str)]) -> Value {
    json!(list
        .iter()
        .map(|(n, p, proto)| {
            let mut v = json!({"port": p, "protocol": proto});
            if !n.is_empty() {
                v["name"] = json!(n);
            }
            v
        })
        .collect::<Vec<_>>())
}

/// An endpoint: address, ready, serving, terminating.
fn ep(addr: &str, ready: bool, serving: bool, terminating: bool) -> Value {
    json!({"addresses": [addr], "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
}

fn slice(name: &str, service: &str, ports: &[(&str, i64)], endpoints: Vec<Value>) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "web",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports.iter().map(|(n, p)| {
            let mut v = json!({"port": p, "protocol": "TCP"});
            if !n.is_empty() { v["name"] = json!(n); }
            v
        }).collect::<Vec<_>>(),
    })
}

fn key(vip: [u8; 4], proto: Protocol, port: u16) -> ServiceKey {
    ServiceKey {
        vip: Ipv4Addr::from(vip).into(),
        protocol: proto,
        port,
    }
}

fn backends(s: &Service) -> Vec<(String, u16, u32)> {
    s.backends
        .iter()
        .map(|b| (b.address.to_string(), b.port, b.weight))
        .collect()
}

impl Harness {
    fn start() -> Harness {
        let fake = FakeKube::start().unwrap();
        let dir = std::env::temp_dir().join(format!(
            "xvs-kube-{}-{}",
            std::process::id(),
            fake.url().rsplit(':').next().unwrap()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let kc = dir.join("kubeconfig");
        std::fs::write(&kc, fake.kubeconfig()).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(KubeStatus::default());
        let st = status.clone();
        rt.spawn(async move {
            let c = client(Some(&kc)).await.unwrap();
            run(c, "xvs".into(), st, move |set, _| {
                let _ = tx.send(set);
            })
            .await;
        });
        Harness {
            fake,
            rx,
            status,
            last: Set::new(),
            _rt: rt,
            _dir: TempDir(dir),
        }
    }

    /// Service `web/shop` on 198.19.0.10:80 with one ready endpoint, and
    /// waits until the source hands it over.
    fn shop_with_one_backend(&mut self) {
        self.fake.apply(Kind::Service, shop80());
        self.fake.apply(
            Kind::EndpointSlice,
            slice(
                "s",
                "shop",
                &[("", 8080)],
                vec![ep("198.18.1.10", true, true, false)],
            ),
        );
        self.wait_tcp80("up", 1);
    }

    /// Waits until 198.19.0.10:80 has `n` backends; returns them.
    fn wait_tcp80(&mut self, what: &str, n: usize) -> Vec<(String, u16, u32)> {
        let set = self.wait(what, |s| {
            s.get(&TCP80()).is_some_and(|s| s.backends.len() == n)
        });
        backends(&set[&TCP80()])
    }

    /// Waits (at most 10 s) for a desired set that passes `ok`.
    fn wait(&mut self, what: &str, ok: impl Fn(&Set) -> bool) -> Set {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ok(&self.last) {
                return self.last.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(s) => self.last = s,
                Err(_) => panic!("{what}: not seen within 10 s; last set: {:#?}", self.last),
            }
        }
    }
}

const TCP80: fn() -> ServiceKey = || key([198, 19, 0, 10], Protocol::Tcp, 80);

#[test]
fn basic_endpoint() {
    let mut h = Harness::start();
    h.fake.apply(Kind::Service, shop80());
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "shop-1",
            "shop",
            &[("", 8080)],
            vec![ep("198.18.1.10", true, true, false)],
        ),
    );
    let set = h.wait("one backend", |s| {
        s.get(&TCP80()).is_some_and(|s| !s.backends.is_empty())
    });
    assert_eq!(backends(&set[&TCP80()]), [("198.18.1.10".into(), 8080, 1)]);
    assert_eq!(set.len(), 1);
    assert!(h.status.synced());
}

#[test]
fn multiport() {
    let mut h = Harness::start();
    h.fake.apply(
        Kind::Service,
        svc(
            "shop",
            Some("xvs"),
            json!({"ports": ports(&[("http", 80, "TCP"), ("https", 443, "TCP")])}),
        ),
    );
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "shop-1",
            "shop",
            &[("http", 8080), ("https", 8443)],
            vec![ep("198.18.1.10", true, true, false)],
        ),
    );
    let set = h.wait("two ports", |s| {
        s.len() == 2 && s.values().all(|v| !v.backends.is_empty())
    });
    assert_eq!(
        backends(&set[&key([198, 19, 0, 10], Protocol::Tcp, 443)]),
        [("198.18.1.10".into(), 8443, 1)]
    );
}

#[test]
fn named_ports() {
    let mut h = Harness::start();
    h.fake.apply(
        Kind::Service,
        svc(
            "shop",
            Some("xvs"),
            json!({"ports": ports(&[("web", 80, "TCP")])}),
        ),
    );
    // Two slices: the port named "web" differs per slice; "other" is ignored.
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "a",
            "shop",
            &[("other", 9999), ("web", 8080)],
            vec![ep("198.18.1.10", true, true, false)],
        ),
    );
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "b",
            "shop",
            &[("web", 8081)],
            vec![ep("198.18.1.11", true, true, false)],
        ),
    );
    assert_eq!(
        h.wait_tcp80("two backends", 2),
        [
            ("198.18.1.10".into(), 8080, 1),
            ("198.18.1.11".into(), 8081, 1)
        ]
    );
}

#[test]
fn session_affinity_timeout_and_switching_it_off() {
    let mut h = Harness::start();
    let spec = json!({"ports": ports(&[("", 80, "TCP")]), "sessionAffinity": "ClientIP",
                      "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}});
    h.fake.apply(Kind::Service, svc("shop", Some("xvs"), spec));
    let set = h.wait("affinity", |s| {
        s.get(&TCP80()).is_some_and(|s| s.persistence.is_some())
    });
    assert_eq!(set[&TCP80()].persistence.unwrap().timeout_secs, 600);
    h.fake.apply(
        Kind::Service,
        svc(
            "shop",
            Some("xvs"),
            json!({"ports": ports(&[("", 80, "TCP")]), "sessionAffinity": "None"}),
        ),
    );
    h.wait("affinity off", |s| {
        s.get(&TCP80()).is_some_and(|s| s.persistence.is_none())
    });
}

#[test]
fn service_proxy_name_selects() {
    let mut h = Harness::start();
    h.fake.apply(
        Kind::Service,
        svc(
            "kube-proxys",
            None,
            json!({"clusterIP": "198.19.0.20", "ports": ports(&[("", 80, "TCP")])}),
        ),
    );
    h.fake.apply(
        Kind::Service,
        svc(
            "others",
            Some("other-proxy"),
            json!({"clusterIP": "198.19.0.21", "ports": ports(&[("", 80, "TCP")])}),
        ),
    );
    h.fake.apply(
        Kind::Service,
        svc(
            "ours",
            Some("xvs"),
            json!({"ports": ports(&[("", 80, "TCP")])}),
        ),
    );
    let set = h.wait("ours only", |s| s.contains_key(&TCP80()));
    assert_eq!(set.keys().collect::<Vec<_>>(), [&TCP80()]);
    // Relabelling it away removes it.
    h.fake.apply(
        Kind::Service,
        svc(
            "ours",
            Some("other-proxy"),
            json!({"ports": ports(&[("", 80, "TCP")])}),
        ),
    );
    h.wait("relabelled away", |s| s.is_empty());
}

#[test]
fn headless_is_skipped() {
    let mut h = Harness::start();
    h.fake.apply(
        Kind::Service,
        svc(
            "headless",
            Some("xvs"),
            json!({"clusterIP": "None", "ports": ports(&[("", 80, "TCP")])}),
        ),
    );
    h.fake.apply(
        Kind::Service,
        svc(
            "shop",
            Some("xvs"),
            json!({"ports": ports(&[("", 81, "TCP")])}),
        ),
    );
    let set = h.wait("shop", |s| !s.is_empty());
    assert_eq!(set.keys().map(|k| k.port).collect::<Vec<_>>(), [81]);
}

#[test]
fn no_endpoints_leaves_no_backends_to_reject() {
    let mut h = Harness::start();
    h.fake.apply(Kind::Service, shop80());
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "s",
            "shop",
            &[("", 8080)],
            vec![ep("198.18.1.10", false, false, false)],
        ),
    );
    let set = h.wait("service", |s| s.contains_key(&TCP80()));
    assert!(
        set[&TCP80()].backends.is_empty(),
        "no ready endpoint: xvs rejects (RST)"
    );
}

#[test]
fn terminating_fallback() {
    let mut h = Harness::start();
    h.fake.apply(Kind::Service, shop80());
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "s",
            "shop",
            &[("", 8080)],
            vec![
                ep("198.18.1.10", false, true, true),
                ep("198.18.1.11", false, false, true),
            ],
        ),
    );
    let set = h.wait("fallback", |s| {
        s.get(&TCP80()).is_some_and(|s| !s.backends.is_empty())
    });
    assert_eq!(backends(&set[&TCP80()]), [("198.18.1.10".into(), 8080, 1)]);
    // A ready endpoint appears: the terminating one drains at weight 0.
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "s",
            "shop",
            &[("", 8080)],
            vec![
                ep("198.18.1.10", false, true, true),
                ep("198.18.1.12", true, true, false),
            ],
        ),
    );
    assert_eq!(
        h.wait_tcp80("draining", 2),
        [
            ("198.18.1.10".into(), 8080, 0),
            ("198.18.1.12".into(), 8080, 1)
        ]
    );
}

#[test]
fn source_ranges_apply_to_the_load_balancer_address() {
    let mut h = Harness::start();
    let mut s = svc(
        "shop",
        Some("xvs"),
        json!({"type": "LoadBalancer", "ports": ports(&[("", 80, "TCP")]),
                                                "loadBalancerSourceRanges": ["198.18.0.0/24"]}),
    );
    s["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.19.5.5"}]}});
    h.fake.apply(Kind::Service, s);
    let set = h.wait("two VIPs", |s| s.len() == 2);
    let lb = &set[&key([198, 19, 5, 5], Protocol::Tcp, 80)];
    assert_eq!(lb.source_ranges, ["198.18.0.0/24".parse().unwrap()]);
    assert!(
        set[&TCP80()].source_ranges.is_empty(),
        "the cluster IP has no ACL"
    );
}

#[test]
fn service_update_and_delete() {
    let mut h = Harness::start();
    h.fake.apply(Kind::Service, shop80());
    h.wait("created", |s| s.contains_key(&TCP80()));
    h.fake.apply(
        Kind::Service,
        svc(
            "shop",
            Some("xvs"),
            json!({"ports": ports(&[("", 8000, "UDP")])}),
        ),
    );
    let set = h.wait("port changed", |s| {
        s.contains_key(&key([198, 19, 0, 10], Protocol::Udp, 8000))
    });
    assert_eq!(set.len(), 1, "the old port is gone");
    h.fake.delete(Kind::Service, "web", "shop");
    h.wait("deleted", |s| s.is_empty());
}

#[test]
fn api_server_restart_keeps_the_last_state_then_catches_up() {
    let mut h = Harness::start();
    h.shop_with_one_backend();
    h.fake.set_down(true);
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.status.synced() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !h.status.synced(),
        "the source notices the server is gone (errors {})",
        h.status.errors.load(std::sync::atomic::Ordering::Relaxed)
    );
    // Fail static: nothing is handed over while the server is away.
    assert!(h.rx.recv_timeout(Duration::from_millis(500)).is_err());
    // Changes while it was away arrive once it is back.
    h.fake.apply(
        Kind::EndpointSlice,
        slice(
            "s",
            "shop",
            &[("", 8080)],
            vec![
                ep("198.18.1.10", true, true, false),
                ep("198.18.1.11", true, true, false),
            ],
        ),
    );
    h.fake.set_down(false);
    h.wait_tcp80("caught up", 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.status.synced() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(h.status.synced());
}

#[test]
fn expired_watch_relists() {
    let mut h = Harness::start();
    h.shop_with_one_backend();
    // The history the watchers would resume from is gone: 410, re-list.
    h.fake.set_down(true);
    h.fake.apply(Kind::Service, svc("second", Some("xvs"), json!({"clusterIP": "198.19.0.11", "clusterIPs": ["198.19.0.11"], "ports": ports(&[("", 80, "TCP")])})));
    h.fake.compact();
    h.fake.set_down(false);
    let set = h.wait("re-listed", |s| s.len() == 2);
    // The first service came through the re-list unchanged.
    assert_eq!(backends(&set[&TCP80()]), [("198.18.1.10".into(), 8080, 1)]);
}
