//! One set of rules for every source: a table of service definitions, each
//! run through the config file (`xvs check-config`, then a reload of the
//! running daemon), the admin API (one POST of the whole service),
//! `xvsadm` (`-A`, `-a`) and the Kubernetes source (a Service and its
//! EndpointSlice on the in-repo API server). An invalid definition is
//! refused by every source that can express it, with the same words
//! (`FIELD: MESSAGE`), and changes nothing; a valid one is accepted by
//! all of them.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // waits for the daemon in real time

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xvs_config::{Backend, ForwardMethod, Persistence, Protocol, Scheduler, Service, ServiceKey};
use xvs_vm_tests::daemon::{dir_of, Daemon};
use xvs_vm_tests::fakekube::{FakeKube, Kind};
use xvs_vm_tests::netns::Netns;
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{backend_addr, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");

fn bins() -> PathBuf {
    xvs_vm_tests::daemon::bins(TESTNET)
}

/// One definition and what every source must say of it.
struct Case {
    what: &'static str,
    svc: Service,
    /// `FIELD: MESSAGE` every source reports; empty for a valid one.
    expect: String,
    /// Whether xvsadm (ipvsadm's options) can express it.
    adm: bool,
    /// What xvsadm says instead, when ipvsadm's own checks refuse the
    /// command line first (with ipvsadm's words and status 2).
    adm_says: Option<&'static str>,
    /// Whether a Kubernetes Service and EndpointSlice can express it.
    kube: bool,
}

fn base(n: u8) -> Service {
    let mut s = Service::new(ServiceKey {
        vip: Ipv4Addr::new(198, 19, 1, n),
        protocol: Protocol::Tcp,
        port: 80,
    });
    s.scheduler = Scheduler::Rr;
    s.backends = (0..2)
        .map(|i| Backend {
            address: backend_addr(i),
            port: 8080,
            weight: 1,
            forward: ForwardMethod::Masq,
            encap: Default::default(),
        })
        .collect();
    s.into()
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut n = 0u8;
    let mut case =
        |what: &'static str, expect: &str, adm: bool, kube: bool, change: &dyn Fn(&mut Service)| {
            n += 1;
            let mut svc = base(n);
            change(&mut svc);
            let expect = expect.replace("{vip}", &svc.key.vip.to_string());
            out.push(Case {
                what,
                svc,
                expect,
                adm,
                adm_says: None,
                kube,
            });
        };
    let not_unicast = |a: &str| {
        format!("{a} is not a unicast address (not 0.0.0.0/8, loopback, multicast, 240.0.0.0/4 or broadcast)")
    };
    for vip in [
        "0.0.0.0",
        "0.1.2.3",
        "0.255.1.1",
        "127.0.0.1",
        "127.255.255.254",
        "224.0.0.1",
        "230.1.1.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
    ] {
        let e = format!("vip: {}", not_unicast(vip));
        let vip: Ipv4Addr = vip.parse().unwrap();
        case("vip not unicast", &e, true, true, &move |s| {
            s.key.vip = vip.into()
        });
    }
    case(
        "vip is the SNAT address",
        "vip: 198.18.1.2 is a SNAT address of this gateway (a VIP must not be one)",
        true,
        true,
        &|s| s.key.vip = Ipv4Addr::new(198, 18, 1, 2).into(),
    );
    for host in ["198.18.0.1", "198.18.1.1"] {
        let e = format!("vip: {host} is an address of this host: its own traffic to it would go to xvs (give the service an address of its own)");
        let a: Ipv4Addr = host.parse().unwrap();
        case("vip is the gateway's own", &e, true, true, &move |s| {
            s.key.vip = a.into()
        });
    }
    case(
        "port 0 without persistence",
        "port: port 0 (all ports) is allowed only on a persistent service",
        true,
        false,
        &|s| {
            s.key.port = 0;
            for b in &mut s.backends {
                b.port = 0;
            }
        },
    );
    for sched in [Scheduler::Rr, Scheduler::Wlc] {
        let e = format!(
            "flags: scheduler {sched} takes no flags (fallback and port apply to dh, sh and mh)"
        );
        case("flags on a scheduler without", &e, true, true, &move |s| {
            s.scheduler = sched;
            s.flags.set(xvs_config::SchedulerFlag::Fallback);
        });
    }
    for (t, e) in [
        (
            0,
            "persistence.timeout: 0 is out of range (expected 1..=2147483 seconds)",
        ),
        (
            2_147_484,
            "persistence.timeout: 2147484 is out of range (expected 1..=2147483 seconds)",
        ),
    ] {
        case("persistence timeout", e, t > 0, true, &move |s| {
            s.persistence = Some(Persistence {
                timeout_secs: t,
                netmask: Ipv4Addr::BROADCAST.into(),
            })
        });
    }
    for m in ["255.0.255.0", "0.255.255.255"] {
        let e =
            format!("persistence.netmask: {m} is not a contiguous netmask (e.g. 255.255.255.0)");
        let mask: Ipv4Addr = m.parse().unwrap();
        case("persistence netmask", &e, true, false, &move |s| {
            s.persistence = Some(Persistence {
                timeout_secs: 300,
                netmask: mask.into(),
            })
        });
    }
    case(
        "maglev size on another scheduler",
        "maglev_table_size: only the mh scheduler uses a Maglev table (scheduler is rr)",
        false,
        true,
        &|s| s.maglev_table_size = Some(16381),
    );
    for (size, e) in [
        (
            65_536,
            "maglev_table_size: 65536 is not prime (nearest primes: 65521 and 65537)",
        ),
        (
            1,
            "maglev_table_size: 1 is out of range (expected a prime up to 131071)",
        ),
        (
            131_072,
            "maglev_table_size: 131072 is out of range (expected a prime up to 131071)",
        ),
        (
            2,
            "maglev_table_size: 2 must be larger than the number of backends (2)",
        ),
    ] {
        case("maglev size", e, false, true, &move |s| {
            s.scheduler = Scheduler::Mh;
            s.maglev_table_size = Some(size);
        });
    }
    for a in [
        "0.0.0.0",
        "0.0.0.5",
        "127.0.0.1",
        "224.0.0.5",
        "239.1.1.1",
        "240.1.1.1",
        "255.255.255.255",
    ] {
        let e = format!("backends[0].address: {}", not_unicast(a));
        let addr: Ipv4Addr = a.parse().unwrap();
        case("backend not unicast", &e, true, true, &move |s| {
            s.backends[0].address = addr.into()
        });
    }
    case(
        "backend is the VIP",
        "backends[0].address: {vip} is the service's VIP (a backend must be another address)",
        true,
        true,
        &|s| s.backends[0].address = s.key.vip,
    );
    case(
        "backend is the SNAT address",
        "backends[0].address: 198.18.1.2 is a SNAT address of this gateway (a backend must be another host)",
        true,
        true,
        &|s| s.backends[0].address = Ipv4Addr::new(198, 18, 1, 2).into(),
    );
    for host in ["198.18.0.1", "198.18.1.1"] {
        let e = format!(
            "backends[0].address: {host} is an address of this host (a backend must be another host)"
        );
        let a: Ipv4Addr = host.parse().unwrap();
        case("backend is the gateway's own", &e, true, true, &move |s| {
            s.backends[0].address = a.into()
        });
    }
    // (xvsadm adds backends one by one: a second -a of the same one is
    // ipvsadm's "destination already exists", another operation.)
    case(
        "duplicate backend",
        "backends[1].address: duplicate backend 198.18.1.10:8080 (first in backends[0])",
        false,
        false,
        &|s| s.backends[1] = s.backends[0],
    );
    case(
        "weight out of range",
        "backends[0].weight: 65536 is out of range (expected 0..=65535)",
        true,
        false,
        &|s| s.backends[0].weight = 65_536,
    );
    case(
        "backend port 0 on a port-80 service",
        "backends[0].port: port 0 is allowed only on a port-0 service",
        false,
        false,
        &|s| s.backends[0].port = 0,
    );
    case(
        "backend port on a port-0 service",
        "backends[0].port: must be omitted on a port-0 service (each flow keeps the port the client asked for)",
        false,
        false,
        &|s| {
            s.key.port = 0;
            s.persistence = Some(Persistence::default());
            s.backends[1].port = 0;
        },
    );
    // Valid definitions: every source takes them.
    case("valid rr", "", true, true, &|_| {});
    case("valid mh", "", false, true, &|s| {
        s.scheduler = Scheduler::Mh;
        s.maglev_table_size = Some(16381);
    });
    case("valid persistent /24", "", true, false, &|s| {
        s.persistence = Some(Persistence {
            timeout_secs: 600,
            netmask: Ipv4Addr::new(255, 255, 255, 0).into(),
        })
    });
    case("valid sh with flags", "", true, true, &|s| {
        s.scheduler = Scheduler::Sh;
        s.flags.set(xvs_config::SchedulerFlag::Port);
    });
    // ipvsadm's own checks come first on xvsadm's command line.
    for c in out.iter_mut() {
        c.adm_says = match c.what {
            "port 0 without persistence" => Some("Zero port specified for non-persistent service"),
            "weight out of range" => Some("illegal weight specified"),
            _ => None,
        };
    }
    out
}

fn toml(s: &Service) -> String {
    let backends: Vec<String> = s
        .backends
        .iter()
        .map(|b| {
            format!(
                "{{ address = \"{}\", port = {}, weight = {} }}",
                b.address, b.port, b.weight
            )
        })
        .collect();
    let mut t = format!(
        "[[services]]\nvip = \"{}\"\nport = {}\nscheduler = \"{}\"\nbackends = [{}]\n",
        s.key.vip,
        s.key.port,
        s.scheduler,
        backends.join(", ")
    );
    if !s.flags.is_empty() {
        t.push_str(&format!(
            "flags = [{}]\n",
            flag_names(s)
                .iter()
                .map(|f| format!("\"{f}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some(p) = s.persistence {
        t.push_str(&format!(
            "persistence = {{ timeout = {}, netmask = \"{}\" }}\n",
            p.timeout_secs, p.netmask
        ));
    }
    if let Some(m) = s.maglev_table_size {
        t.push_str(&format!("maglev_table_size = {m}\n"));
    }
    t
}

/// The flags as ipvsadm names them for the service's scheduler.
fn adm_flag_names(s: &Service) -> Vec<&'static str> {
    let (fallback, port) = match s.scheduler {
        Scheduler::Sh => ("sh-fallback", "sh-port"),
        Scheduler::Mh => ("mh-fallback", "mh-port"),
        _ => ("flag-1", "flag-2"),
    };
    let mut v = Vec::new();
    if s.flags.fallback {
        v.push(fallback);
    }
    if s.flags.port {
        v.push(port);
    }
    v
}

fn flag_names(s: &Service) -> Vec<&'static str> {
    let mut v = Vec::new();
    if s.flags.fallback {
        v.push("fallback");
    }
    if s.flags.port {
        v.push("port");
    }
    v
}

fn api_body(s: &Service) -> Value {
    json!({
        "protocol": "tcp", "vip": s.key.vip, "port": s.key.port,
        "scheduler": s.scheduler.name(),
        "persistence": s.persistence.map(|p| p.timeout_secs),
        "netmask": s.persistence.map(|p| p.netmask),
        "flags": flag_names(s),
        "maglev_table_size": s.maglev_table_size,
        "backends": s.backends.iter().map(|b| json!({
            "address": b.address, "port": b.port, "weight": b.weight,
        })).collect::<Vec<_>>(),
    })
}

/// xvsadm's commands for the service: `-A`, then one `-a` per backend.
fn adm_commands(s: &Service) -> Vec<Vec<String>> {
    let t = format!("{}:{}", s.key.vip, s.key.port);
    let mut add = vec![
        "-A".into(),
        "-t".into(),
        t.clone(),
        "-s".into(),
        s.scheduler.name().into(),
    ];
    if let Some(p) = s.persistence {
        add.extend([
            "-p".into(),
            p.timeout_secs.to_string(),
            "-M".into(),
            p.netmask.to_string(),
        ]);
    }
    let flags = adm_flag_names(s);
    if !flags.is_empty() {
        add.extend(["-b".into(), flags.join(",")]);
    }
    let mut out = vec![add];
    for b in &s.backends {
        out.push(vec![
            "-a".into(),
            "-t".into(),
            t.clone(),
            "-r".into(),
            format!("{}:{}", b.address, b.port),
            "-m".into(),
            "-w".into(),
            b.weight.to_string(),
        ]);
    }
    out
}

fn kube_objects(s: &Service, n: usize) -> (Value, Value) {
    let name = format!("case{n}");
    let mut ann = serde_json::Map::new();
    ann.insert("xvs.io/scheduler".into(), json!(s.scheduler.name()));
    if !s.flags.is_empty() {
        ann.insert(
            "xvs.io/scheduler-flags".into(),
            json!(flag_names(s).join(",")),
        );
    }
    if let Some(m) = s.maglev_table_size {
        ann.insert("xvs.io/maglev-table-size".into(), json!(m.to_string()));
    }
    let mut spec = json!({
        "clusterIP": s.key.vip.to_string(), "clusterIPs": [s.key.vip.to_string()],
        "ports": [{"name": "http", "port": s.key.port, "protocol": "TCP"}],
    });
    if let Some(p) = s.persistence {
        spec["sessionAffinity"] = json!("ClientIP");
        spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": p.timeout_secs}});
    }
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "parity", "annotations": ann,
                     "labels": {"service.kubernetes.io/service-proxy-name": "xvs"}},
        "spec": spec,
    });
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-1"), "namespace": "parity",
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": s.backends.iter().map(|b| json!({
            "addresses": [b.address.to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false}
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": s.backends[0].port, "protocol": "TCP"}],
    });
    (svc, slice)
}

fn curl(gw: &Daemon, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-s", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(&gw.socket)
        .args(["-X", method]);
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "-d", &b.to_string()]);
    }
    let out = cmd.arg(format!("http://xvs{path}")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// The service table, as `-Ln --json` shows it (to compare).
fn table(gw: &Daemon) -> Value {
    let mut v: Value = serde_json::from_str(&gw.adm_ok(&["-Ln", "--json"])).unwrap();
    // Counters move with traffic; the table is the services and backends.
    for s in v["services"].as_array_mut().unwrap() {
        for k in ["stats", "rates"] {
            s[k] = Value::Null;
        }
        for b in s["backends"].as_array_mut().unwrap() {
            for k in ["stats", "rates", "active", "inactive"] {
                b[k] = Value::Null;
            }
        }
    }
    v
}

/// `backends[N]` without its index: Kubernetes orders endpoints its own
/// way (the translation sorts them), so only the words are compared.
fn without_index(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("backends[") {
        out.push_str(&rest[..i + 9]);
        rest = &rest[i + 9..];
        rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

fn conflicts(gw: &Daemon) -> Vec<String> {
    let (_, status) = curl(gw, "GET", "/v1/status", None);
    status["conflicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_source_refuses_the_same_services_with_the_same_words() {
    if !privileged("every_source_refuses_the_same_services_with_the_same_words") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let gw_ns = t.gateway.name().to_owned();
    let fake = std::thread::spawn(move || {
        Netns::existing(&gw_ns).enter_current_thread().unwrap();
        FakeKube::start().unwrap()
    })
    .join()
    .unwrap();
    let dir = dir_of(&t, "parity");
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).unwrap();
    let head = format!(
        "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\nzero_copy = \"off\"\n\n\
         [snat]\naddresses = [\"198.18.1.2\"]\n\n[admin]\nsocket = \"{}\"\n\n\
         [kubernetes]\nenabled = true\nkubeconfig = \"{}\"\n\n",
        t.gateway_client_if,
        dir.join("xvs.sock").display(),
        kubeconfig.display()
    );
    let good = format!("{head}{}", toml(&base(200)));
    let (gw, _) = Daemon::start(&t, "parity", &bins(), &good, &[]).unwrap();
    let before = table(&gw);
    let cases = cases();
    let invalid = cases.iter().filter(|c| !c.expect.is_empty()).count();
    assert!(invalid >= 40, "{invalid} invalid cases");
    let check_file = dir.join("case.toml");
    let mut kube_cases = 0;
    for (n, c) in cases.iter().enumerate() {
        let key = format!("TCP {}:{}", c.svc.key.vip, c.svc.key.port);
        let ctx = format!("case {n} ({}): {}", c.what, c.expect);
        let text = format!("{head}{}{}", toml(&base(200)), toml(&c.svc));
        // The file: check-config, then a reload of the running daemon.
        std::fs::write(&check_file, &text).unwrap();
        let out = t
            .gateway
            .command(bins().join("xvs").to_str().unwrap())
            .arg("check-config")
            .arg(&check_file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        gw.rewrite(&text);
        let (status, _, reload_err) = gw.adm(&["--reload"]);
        if c.expect.is_empty() {
            assert!(out.status.success(), "{ctx}: check-config: {err}");
            assert_eq!(status, 0, "{ctx}: reload: {reload_err}");
            assert!(
                table(&gw).to_string().contains(&c.svc.key.vip.to_string()),
                "{ctx}"
            );
            gw.rewrite(&good);
            gw.adm_ok(&["--reload"]);
        } else {
            assert!(
                err.contains(&format!("services[1].{}", c.expect)),
                "{ctx}: check-config said {err}"
            );
            assert_eq!(
                status, 255,
                "{ctx}: a refused reload is the daemon's refusal"
            );
            assert!(
                reload_err.contains(&format!("services[1].{}", c.expect)),
                "{ctx}: reload said {reload_err}"
            );
            gw.rewrite(&good);
        }
        assert_eq!(table(&gw), before, "{ctx}: the file left a change");

        // The API: the whole service in one POST.
        let (code, answer) = curl(&gw, "POST", "/v1/services", Some(&api_body(&c.svc)));
        if c.expect.is_empty() {
            assert_eq!(code, 200, "{ctx}: {answer}");
            let path = format!("/v1/services/tcp/{}/{}", c.svc.key.vip, c.svc.key.port);
            assert_eq!(curl(&gw, "DELETE", &path, None).0, 200, "{ctx}");
        } else {
            let msg = answer["error"].as_str().unwrap_or_default();
            assert_eq!(code, 400, "{ctx}: {answer}");
            assert!(
                msg.contains(&format!("{key}: {}", c.expect)),
                "{ctx}: API said {msg}"
            );
        }
        assert_eq!(table(&gw), before, "{ctx}: the API left a change");

        // xvsadm: -A, then -a per backend; the refused command changes
        // nothing, and what the others added is removed after.
        if c.adm {
            let mut refused = None;
            for cmd in adm_commands(&c.svc) {
                let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
                let was = table(&gw);
                let (status, _, err) = gw.adm(&args);
                if status != 0 {
                    assert_eq!(table(&gw), was, "{ctx}: a refused {args:?} left a change");
                    refused = Some(err);
                    break;
                }
            }
            match (&refused, c.expect.is_empty(), c.adm_says) {
                (None, true, _) => {}
                (Some(err), false, Some(says)) => {
                    assert_eq!(err, &format!("{says}\n"), "{ctx}: xvsadm")
                }
                (Some(err), false, None) => assert!(
                    err.contains(&format!("{key}: {}", c.expect)),
                    "{ctx}: xvsadm said {err}"
                ),
                _ => panic!("{ctx}: xvsadm: {refused:?}"),
            }
            let _ = gw.adm(&["-D", "-t", &format!("{}:{}", c.svc.key.vip, c.svc.key.port)]);
            assert_eq!(table(&gw), before, "{ctx}: xvsadm left a change");
        }

        // Kubernetes: refused services are reported in /v1/status.
        if c.kube {
            kube_cases += 1;
            let (svc, slice) = kube_objects(&c.svc, n);
            fake.apply(Kind::Service, svc);
            fake.apply(Kind::EndpointSlice, slice);
            let want = without_index(&format!("{key}: {}; not applied", c.expect));
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let done = if c.expect.is_empty() {
                    table(&gw)
                        .to_string()
                        .contains(&format!("\"vip\":\"{}\"", c.svc.key.vip))
                } else {
                    conflicts(&gw).iter().any(|c| without_index(c) == want)
                };
                if done {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{ctx}: Kubernetes: conflicts {:?}",
                    conflicts(&gw)
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            if !c.expect.is_empty() {
                assert_eq!(table(&gw), before, "{ctx}: Kubernetes left a change");
            }
            fake.delete(Kind::EndpointSlice, "parity", &format!("case{n}-1"));
            fake.delete(Kind::Service, "parity", &format!("case{n}"));
            let deadline = Instant::now() + Duration::from_secs(5);
            while table(&gw) != before {
                assert!(Instant::now() < deadline, "{ctx}: not removed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    eprintln!(
        "{} definitions ({invalid} invalid): file and API all, xvsadm {}, Kubernetes {kube_cases}",
        cases.len(),
        cases.iter().filter(|c| c.adm).count()
    );
    gw.stop();
    drop(fake);
}
