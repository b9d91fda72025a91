//! Kubernetes end to end: the fake API server in the gateway's namespace,
//! `xvs run` watching it, real backends: creating a Service and its
//! EndpointSlice makes the VIP serve traffic; scaling the slice changes
//! the backends; deleting the Service stops it. Also measures the time
//! from a change on the API server to the data plane having it.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![allow(clippy::disallowed_types)] // the latency is wall-clock time

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{json, Value};
use xvs_control::adm::client::{request, Endpoint};
use xvs_control::view::Listing;
use xvs_vm_tests::fakekube::{Access, FakeKube, Kind, Rule};
use xvs_vm_tests::netns::Netns;
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, backend_addr6, Spec, Topology, SNAT_ADDR6};

const XVS: &str = env!("CARGO_BIN_EXE_xvs");

fn testnet() -> PathBuf {
    let p = PathBuf::from(XVS).with_file_name("xvs-testnet");
    assert!(
        p.exists(),
        "{} missing: cargo build --workspace first",
        p.display()
    );
    p
}

fn service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "shop", "namespace": "web",
                     "labels": {"service.kubernetes.io/service-proxy-name": "xvs"}},
        "spec": {"clusterIP": "198.19.0.1", "clusterIPs": ["198.19.0.1"],
                 "externalIPs": ["198.19.0.9"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"},
                           {"name": "alt", "port": 81, "protocol": "TCP"}]},
    })
}

fn slice(backends: &[usize]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "shop-1", "namespace": "web",
                     "labels": {"kubernetes.io/service-name": "shop"}},
        "addressType": "IPv4",
        "endpoints": backends.iter().map(|&i| json!({
            "addresses": [backend_addr(i).to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false}
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                  {"name": "alt", "port": 8080, "protocol": "TCP"}],
    })
}

fn load(t: &Topology, n: usize) -> String {
    t.tcp_load(testnet().to_str().unwrap(), "198.19.0.1:80", n, 500)
}

/// The backends xvs has for 198.19.0.1:80 (None: no such service).
fn backends(to: &Endpoint) -> Option<Vec<String>> {
    let body = request(to, Method::GET, "/v1/services", None)
        .ok()?
        .ok()
        .ok()?;
    let l: Listing = serde_json::from_str(&body).ok()?;
    l.services
        .iter()
        .find(|s| s.vip.to_string() == "198.19.0.1" && s.port == 80)
        .map(|s| s.backends.iter().map(|b| b.address.to_string()).collect())
}

/// The addresses the steering program hands to xvs, read back from its
/// map through `/v1/status`.
fn steered(to: &Endpoint) -> Vec<String> {
    let body = request(to, Method::GET, "/v1/status", None)
        .unwrap()
        .ok()
        .unwrap();
    let status: Value = serde_json::from_str(&body).unwrap();
    status["steered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["address"].as_str().unwrap().to_owned())
        .collect()
}

/// The tests of this file one at a time: each starts xvs and times
/// loads with short timeouts, which a second daemon starting beside it
/// (its flow tables being written) would disturb on a 2-CPU machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Waits (up to 10 s, polling) until `done` holds; the assertion after
/// it says what was wanted.
fn until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A test's scratch folder, removed when the test ends (also when it
/// fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fake API server in the gateway namespace of `t`, and `xvs run`
/// watching it with `snat` addresses and the file's `services`: (fake,
/// xvs, admin socket, config path, scratch folder).
fn start_with_kube(
    t: &Topology,
    snat: &str,
    services: &str,
) -> (FakeKube, Spawned, Endpoint, PathBuf, Scratch) {
    start_with_kube_as(t, snat, services, None, FakeKube::kubeconfig)
}

/// [`start_with_kube`] with the API server requiring `access`, and xvs's
/// kubeconfig written by `kubeconfig`.
fn start_with_kube_as(
    t: &Topology,
    snat: &str,
    services: &str,
    access: Option<Access>,
    kubeconfig: impl Fn(&FakeKube) -> String,
) -> (FakeKube, Spawned, Endpoint, PathBuf, Scratch) {
    // The API server listens on the gateway namespace's loopback.
    let gw = t.gateway.name().to_owned();
    let fake = std::thread::spawn(move || {
        Netns::existing(&gw).enter_current_thread().unwrap();
        FakeKube::start_with(access).unwrap()
    })
    .join()
    .unwrap();
    let dir = std::env::temp_dir().join(format!("xvs-kube-e2e-{}", t.tag));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig_path = dir.join("kubeconfig");
    std::fs::write(&kubeconfig_path, kubeconfig(&fake)).unwrap();
    let kubeconfig = kubeconfig_path;
    let socket = dir.join("xvs.sock");
    let cfg = dir.join("xvs.toml");
    std::fs::write(
        &cfg,
        format!(
            "[interfaces]\nmode = \"one-arm\"\nclient = \"{}\"\nqueues = [0]\ncores = [0]\npoll = \"adaptive\"\nzero_copy = \"off\"\n\n\
             [snat]\naddresses = [{snat}]\n\n[admin]\nsocket = \"{}\"\n\n\
             [kubernetes]\nenabled = true\nkubeconfig = \"{}\"\n\n\
             [restart]\nhold = \"300ms\"\nstate_dir = \"{}\"\n\n{services}",
            t.gateway_client_if,
            socket.display(),
            kubeconfig.display(),
            dir.join("state").display(),
        ),
    )
    .unwrap();
    let mut cmd = t.gateway.command(XVS);
    cmd.args(["run", "--config", cfg.to_str().unwrap()]);
    let (xvs, _) = Spawned::start(cmd, "xvs", Duration::from_secs(20)).unwrap();
    (fake, xvs, Endpoint::Unix(socket), cfg, Scratch(dir))
}

/// The ClusterRole of `packaging/kubernetes/rbac.yaml`, as the fake API
/// server's authorizer.
fn packaged_role(token: &str) -> Access {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/kubernetes/rbac.yaml"
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let rules = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Rule {
            api_groups: strings(&r["apiGroups"]),
            resources: strings(&r["resources"]),
            verbs: strings(&r["verbs"]),
        })
        .collect();
    // The binding gives the role to the ServiceAccount the token is of.
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let account = docs.iter().find(|d| d["kind"] == "ServiceAccount").unwrap();
    assert_eq!(binding["subjects"][0]["name"], account["metadata"]["name"]);
    Access {
        token: token.to_owned(),
        rules,
    }
}

/// A gateway outside the cluster, as the packaging describes it: the
/// kubeconfig example (a bearer token) filled in, an API server that
/// authorizes with the packaged ClusterRole. The Services serve, and the
/// server refused nothing; without the token it refuses (so the check is
/// live).
#[test]
fn the_packaged_rbac_role_and_kubeconfig_example_are_all_xvs_needs() {
    if !privileged("the_packaged_rbac_role_and_kubeconfig_example_are_all_xvs_needs") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let _servers = t
        .echo_servers(testnet().to_str().unwrap(), "b", 8080, None)
        .unwrap();
    let token = "xvs-test-token-7f3a";
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/kubernetes/kubeconfig.example.yaml"
    ))
    .unwrap();
    let fill = |fake: &FakeKube| {
        example
            .lines()
            // The fake server speaks plain HTTP: no CA.
            .filter(|l| !l.contains("certificate-authority-data"))
            .map(|l| {
                l.replace("https://198.18.0.10:6443", &fake.url())
                    .replace("<the xvs-token Secret's token>", token)
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (fake, xvs, to, _cfg, _dir) =
        start_with_kube_as(&t, "\"198.18.1.2\"", "", Some(packaged_role(token)), fill);
    fake.apply(Kind::Service, service());
    fake.apply(Kind::EndpointSlice, slice(&[0, 1]));
    until(|| backends(&to).map(|b| b.len()) == Some(2));
    assert_eq!(load(&t, 20), "ok=20 failed=0 by=b0:10,b1:10");
    assert_eq!(fake.refused(), Vec::<String>::new());
    // The event-to-dataplane delay was observed; an invalid annotation is
    // counted (its default used).
    let mut bad = service();
    bad["metadata"]["annotations"] = json!({"xvs.io/scheduler": "bogus"});
    fake.apply(Kind::Service, bad);
    let metric = |name: &str| -> Option<f64> {
        let text = request(&to, Method::GET, "/metrics", None)
            .ok()?
            .ok()
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    };
    until(|| metric("xvs_kube_invalid_values") == Some(1.0));
    assert_eq!(metric("xvs_kube_invalid_values"), Some(1.0));
    let delays = metric("xvs_kube_event_to_dataplane_seconds_count").unwrap();
    assert!(delays >= 1.0, "{delays}");
    // Without the token, the same server refuses.
    let out = t
        .gateway
        .command("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("{}/api/v1/services", fake.url()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "401");
    assert_eq!(fake.refused(), ["401 list /services"]);
    drop(xvs);
}

#[test]
fn services_from_the_api_server_serve_scale_and_go() {
    if !privileged("services_from_the_api_server_serve_scale_and_go") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let _servers = t
        .echo_servers(testnet().to_str().unwrap(), "b", 8080, None)
        .unwrap();
    let file_service = format!(
        "[[services]]\nvip = \"198.19.0.1\"\nport = 81\nscheduler = \"rr\"\nbackends = [{{ address = \"{}\", port = 8080 }}]\n",
        backend_addr(2)
    );
    let (fake, xvs, to, cfg, dir) = start_with_kube(&t, "\"198.18.1.2\"", &file_service);

    // Created: the VIP serves.
    fake.apply(Kind::Service, service());
    fake.apply(Kind::EndpointSlice, slice(&[0, 1]));
    until(|| backends(&to).map(|b| b.len()) == Some(2));
    assert_eq!(load(&t, 40), "ok=40 failed=0 by=b0:20,b1:20");
    // Its external IP is steered to xvs beside the file's VIP.
    assert_eq!(steered(&to), ["198.18.1.2", "198.19.0.1", "198.19.0.9"]);
    // Port 81 is the file's (first owner): Kubernetes' copy is refused and
    // reported.
    let status: Value = serde_json::from_str(
        &request(&to, Method::GET, "/v1/status", None)
            .unwrap()
            .ok()
            .unwrap(),
    )
    .unwrap();
    assert!(
        status["conflicts"]
            .to_string()
            .contains("TCP 198.19.0.1:81"),
        "{status}"
    );
    let on81 = t.tcp_load(testnet().to_str().unwrap(), "198.19.0.1:81", 6, 5000);
    assert_eq!(on81, "ok=6 failed=0 by=b2:6");

    // Scaled: the third backend takes its share. Each change is timed
    // from the API server's event to xvs having it in force (the admin
    // API answers from what the workers were sent and have applied).
    let mut took = Vec::new();
    for i in 0..40 {
        let want: &[usize] = if i % 2 == 0 { &[0, 1, 2] } else { &[0, 1] };
        let start = Instant::now();
        fake.apply(Kind::EndpointSlice, slice(want));
        loop {
            if backends(&to).map(|b| b.len()) == Some(want.len()) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "change {i} not applied"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        took.push(start.elapsed().as_secs_f64());
    }
    fake.apply(Kind::EndpointSlice, slice(&[0, 1, 2]));
    until(|| backends(&to).map(|b| b.len()) == Some(3));
    assert_eq!(load(&t, 30), "ok=30 failed=0 by=b0:10,b1:10,b2:10");
    took.sort_by(f64::total_cmp);
    eprintln!(
        "watch event -> data plane: median {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} changes",
        percentile(&took, 0.5) * 1e3,
        percentile(&took, 0.99) * 1e3,
        percentile(&took, 1.0) * 1e3,
        took.len()
    );

    // A re-list (the API server back after its history was compacted:
    // 410 Expired) sends the data plane nothing: no update is timed.
    let updates = |to: &Endpoint| -> u64 {
        let m = request(to, Method::GET, "/metrics", None)
            .unwrap()
            .ok()
            .unwrap();
        m.lines()
            .find_map(|l| l.strip_prefix("xvs_update_latency_seconds_count "))
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = updates(&to);
    fake.set_down(true);
    // Changes nobody here watches for move the resourceVersion on, then
    // the history goes: the watchers' versions are too old (410).
    let mut other = slice(&[0]);
    other["metadata"]["name"] = json!("other-1");
    other["metadata"]["labels"]["kubernetes.io/service-name"] = json!("other");
    fake.apply(Kind::EndpointSlice, other);
    let mut theirs = service();
    theirs["metadata"]["name"] = json!("kube-proxys");
    theirs["metadata"]["labels"] = json!({});
    fake.apply(Kind::Service, theirs);
    std::thread::sleep(Duration::from_millis(300));
    fake.compact();
    fake.set_down(false);
    let deadline = Instant::now() + Duration::from_secs(15);
    let synced = |to: &Endpoint| {
        request(to, Method::GET, "/metrics", None)
            .unwrap()
            .ok()
            .unwrap()
            .contains("\nxvs_kube_synced 1\n")
    };
    while !synced(&to) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(synced(&to), "back in sync after the re-list");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        updates(&to),
        before,
        "the re-list changed nothing in the data plane"
    );
    assert_eq!(load(&t, 30), "ok=30 failed=0 by=b0:10,b1:10,b2:10");

    // Deleted: the VIP stops serving.
    fake.delete(Kind::Service, "web", "shop");
    until(|| backends(&to).is_none());
    assert_eq!(backends(&to), None);
    let after = load(&t, 3);
    assert_eq!(after, "ok=0 failed=3 by=");
    // Its external IP is released; the file's port 81 keeps 198.19.0.1.
    assert_eq!(steered(&to), ["198.18.1.2", "198.19.0.1"]);
    let status = request(&to, Method::GET, "/v1/status", None)
        .unwrap()
        .ok()
        .unwrap();
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["kube_synced"], true);

    // Back, and the file gives port 81 up: Kubernetes' port 81, refused
    // while the file had it, is served from the reload on (the API server
    // sends nothing new).
    fake.apply(Kind::Service, service());
    fake.apply(Kind::EndpointSlice, slice(&[0, 1]));
    until(|| backends(&to).map(|b| b.len()) == Some(2));
    let conflicts = |to: &Endpoint| -> String {
        let body = request(to, Method::GET, "/v1/status", None)
            .unwrap()
            .ok()
            .unwrap();
        serde_json::from_str::<Value>(&body).unwrap()["conflicts"].to_string()
    };
    assert!(conflicts(&to).contains("TCP 198.19.0.1:81"));
    let text = std::fs::read_to_string(&cfg).unwrap();
    let without = &text[..text.find("[[services]]").unwrap()];
    std::fs::write(&cfg, without).unwrap();
    request(&to, Method::POST, "/v1/reload", None)
        .unwrap()
        .ok()
        .unwrap();
    assert!(
        !conflicts(&to).contains("198.19.0.1:81"),
        "{}",
        conflicts(&to)
    );
    let on81 = t.tcp_load(testnet().to_str().unwrap(), "198.19.0.1:81", 6, 5000);
    assert!(
        on81.starts_with("ok=6 failed=0 by=") && !on81.contains("b2"),
        "port 81 should be Kubernetes' (b0, b1): {on81}"
    );

    let (_, printed) = xvs.stop(libc::SIGTERM, Duration::from_secs(10));
    assert!(printed.contains("worker 0:"));
    drop(fake);
    drop(dir);
}

/// A dual-stack Service (clusterIPs of both families, `ipFamilies`
/// IPv4 and IPv6) with an EndpointSlice per family: each VIP serves from
/// its own family's endpoints; losing the IPv6 slice leaves the IPv6 VIP
/// without backends (REJECT) and IPv4 untouched; a single-stack IPv6
/// Service serves as well.
#[test]
fn a_dual_stack_service_serves_each_family_from_its_own_endpoints() {
    if !privileged("a_dual_stack_service_serves_each_family_from_its_own_endpoints") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let net = testnet();
    let net = net.to_str().unwrap();
    let _v4 = t.echo_servers(net, "b", 8080, None).unwrap();
    let _v6: Vec<Spawned> = t
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut cmd = b.ns.command(net);
            cmd.args(["serve", "--name", &format!("s{i}"), "--tcp"])
                .arg(format!("[{}]:8080", b.addr6));
            Spawned::start(cmd, "echo server", Duration::from_secs(5))
                .unwrap()
                .0
        })
        .collect();
    let snat = format!("\"198.18.1.2\", \"{SNAT_ADDR6}\"");
    let (fake, xvs, to, _cfg, dir) = start_with_kube(&t, &snat, "[conntrack]\ncapacity = 65536\n");
    let vip6 = "2001:2:ff::1";
    fake.apply(
        Kind::Service,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "shop", "namespace": "web",
                         "labels": {"service.kubernetes.io/service-proxy-name": "xvs"}},
            "spec": {"clusterIP": "198.19.0.1", "clusterIPs": ["198.19.0.1", vip6],
                     "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        }),
    );
    fake.apply(Kind::EndpointSlice, slice(&[0, 1]));
    let mut v6 = slice(&[0, 1]);
    v6["metadata"]["name"] = json!("shop-v6");
    v6["addressType"] = json!("IPv6");
    v6["endpoints"] = json!((0..2)
        .map(
            |i| json!({"addresses": [backend_addr6(i).to_string()], "conditions": {"ready": true}})
        )
        .collect::<Vec<_>>());
    fake.apply(Kind::EndpointSlice, v6);
    let count = |vip: &str| -> usize {
        let Some(Ok(body)) = request(&to, Method::GET, "/v1/services", None)
            .ok()
            .map(|r| r.ok())
        else {
            return 0;
        };
        let l: Listing = serde_json::from_str(&body).unwrap();
        l.services
            .iter()
            .find(|s| s.vip.to_string() == vip && s.port == 80)
            .map_or(0, |s| s.backends.len())
    };
    until(|| (count("198.19.0.1"), count(vip6)) == (2, 2));
    let v4 = t.tcp_load(net, "198.19.0.1:80", 20, 2000);
    let v6 = t.tcp_load(net, &format!("[{vip6}]:80"), 20, 2000);
    assert_eq!(v4, "ok=20 failed=0 by=b0:10,b1:10");
    assert_eq!(v6, "ok=20 failed=0 by=s0:10,s1:10");
    assert!(
        steered(&to).contains(&vip6.to_owned()),
        "{:?}",
        steered(&to)
    );

    // The IPv6 slice goes: the IPv6 VIP has no backend, IPv4 serves on.
    fake.delete(Kind::EndpointSlice, "web", "shop-v6");
    until(|| count(vip6) == 0);
    assert_eq!(count(vip6), 0);
    let v6 = t.tcp_load(net, &format!("[{vip6}]:80"), 3, 2000);
    assert_eq!(v6, "ok=0 failed=3 by=");
    assert_eq!(
        t.tcp_load(net, "198.19.0.1:80", 4, 2000),
        "ok=4 failed=0 by=b0:2,b1:2"
    );

    let (_, printed) = xvs.stop(libc::SIGTERM, Duration::from_secs(10));
    assert!(printed.contains("worker 0:"));
    drop(fake);
    drop(dir);
}
