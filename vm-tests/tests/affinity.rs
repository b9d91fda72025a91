//! Client affinity and client ranges with the operators' own tools, as a
//! Service's `sessionAffinity: ClientIP` and `loadBalancerSourceRanges`
//! become: nginx real servers, curl from two client addresses and wrk
//! with `Connection: close` (a fresh port per request). The judge of
//! where requests went is each nginx's own request counter.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;

use xvs_vm_tests::daemon::{self, drops, Daemon};
use xvs_vm_tests::nginx::Nginx;
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{
    backend_addr, backend_addr6, one_arm_head, one_arm_head_dual, Spec, Topology, CLIENT_ADDR,
    CLIENT_ADDR6, VIP6,
};
use xvs_vm_tests::wrk::Wrk;

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";
/// The client's second address (on the same interface).
const OTHER: &str = "198.18.0.3";

/// One curl from the client's address `from` to `url`, two seconds at
/// most: the backend's name, or curl's error.
fn curl(t: &Topology, from: &str, url: &str) -> Result<String, String> {
    // A failed curl is an error of `exec`, which says why.
    t.client
        .ns
        .exec("curl", &["-sS", "-m", "2", "--interface", from, url])
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .map_err(|e| format!("{e:?}"))
}

/// The URL of the IPv4 VIP's `port`.
fn url(port: u16) -> String {
    format!("http://{VIP}:{port}/")
}

/// `n` curls from `from` to `url`: answers per backend name.
fn spread(t: &Topology, from: &str, url: &str, n: usize) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for _ in 0..n {
        let who = curl(t, from, url).unwrap_or_else(|e| panic!("curl from {from}: {e}"));
        *by.entry(who).or_default() += 1;
    }
    by
}

/// The address and port of the nginx named `name` (`b0`, `b1`, ...).
fn backend_of(name: &str) -> String {
    let i = name.strip_prefix('b').and_then(|n| n.parse().ok()).unwrap();
    format!("{}:8080", backend_addr(i))
}

/// The one backend of a spread that went to one backend only.
fn only(by: &BTreeMap<String, usize>) -> String {
    assert_eq!(by.len(), 1, "one client, one backend: {by:?}");
    by.keys().next().unwrap().clone()
}

#[test]
fn persistence_holds_each_client_to_one_nginx_and_source_ranges_turn_others_away() {
    if !privileged("persistence_holds_each_client_to_one_nginx_and_source_ranges_turn_others_away")
    {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    t.client
        .ns
        .ip(&[
            "addr",
            "add",
            &format!("{OTHER}/24"),
            "dev",
            &t.client.ifname,
        ])
        .unwrap();
    let nginx: Vec<Nginx> = t.nginx_on_backends(false, 8080).unwrap();
    let backends = (0..3)
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "{}\n[[services]]\nvip = \"{VIP}\"\nport = 80\nscheduler = \"rr\"\n\
         persistence = {{ timeout = 60 }}\nbackends = [{backends}]\n\n\
         [[services]]\nvip = \"{VIP}\"\nport = 81\nscheduler = \"rr\"\n\
         source_ranges = [\"{CLIENT_ADDR}/32\"]\nbackends = [{backends}]\n",
        one_arm_head(&t, 1)
    );
    let (xvs, ready) = Daemon::start(&t, "affinity", &daemon::bins(TESTNET), &text, &[]).unwrap();
    assert!(ready.starts_with("ready: 2 services on g0"), "{ready}");
    let me = CLIENT_ADDR.to_string();

    // Each client stays on the backend its first connection got, and the
    // templates are listed as ipvsadm lists them.
    let first = only(&spread(&t, &me, &url(80), 12));
    let other = only(&spread(&t, OTHER, &url(80), 12));
    assert_ne!(
        first, other,
        "rr gives the second client's template the next backend"
    );
    let conns = xvs.adm_ok(&["-Lnc"]);
    for client in [me.as_str(), OTHER] {
        assert!(
            conns
                .lines()
                .any(|l| l.contains("NONE") && l.contains(&format!(" {client}:0 "))),
            "no template of {client}: {conns}"
        );
    }

    // As IPVS counts: a template is neither a connection (`--stats`
    // Conns) nor an inactive one (`-Ln` InActConn holds the 12 closed
    // connections of each client's backend).
    let stats = xvs.adm_ok(&["-Ln", "--stats"]);
    assert!(
        stats
            .lines()
            .any(|l| l.starts_with(&format!("TCP  {VIP}:80 "))
                && l.split_whitespace().nth(2) == Some("24")),
        "{stats}"
    );
    let list = xvs.adm_ok(&["-Ln"]);
    for (name, want) in [(first.as_str(), "12"), (other.as_str(), "12")] {
        let at = backend_of(name);
        let line = list
            .lines()
            .find(|l| l.contains(&at) && l.contains("Masq"))
            .unwrap();
        assert_eq!(line.split_whitespace().nth(5), Some(want), "{list}");
    }

    // wrk with a new connection (and client port) per request: every one
    // on the client's backend, by the backends' own counts.
    let before: Vec<u64> = nginx.iter().map(|n| n.status().unwrap().requests).collect();
    let w = Wrk::start(&t.client.ns, &format!("http://{VIP}:80/"), 3, true)
        .join()
        .unwrap();
    assert!(w.requests > 100, "{}", w.text);
    assert_eq!((w.errors, w.non_2xx), (0, 0), "{}", w.text);
    for (n, was) in nginx.iter().zip(before) {
        // Each status read is one request of its own.
        let served = n.status().unwrap().requests - was - 1;
        match n.name == first {
            true => assert!(
                served >= w.requests,
                "{}: {served} of {}",
                n.name,
                w.requests
            ),
            false => assert_eq!(served, 0, "{} served wrk's requests", n.name),
        }
    }

    // The client's backend quiesced (weight 0, as a terminating endpoint
    // is): its template ends (`expire_quiescent_template`) and the client
    // sticks to a new backend; the other client is left where it was.
    let svc = format!("{VIP}:80");
    let at = backend_of(&first);
    xvs.adm_ok(&["-e", "-t", &svc, "-r", &at, "-m", "-w", "0"]);
    let next = only(&spread(&t, &me, &url(80), 12));
    assert_ne!(next, first);
    assert_eq!(only(&spread(&t, OTHER, &url(80), 6)), other);

    // The other client's backend deleted (a pod gone from its
    // EndpointSlice): a template to it is passed over at its next use,
    // so both clients stick to the one backend neither quiesced nor
    // deleted, each from its first request on.
    xvs.adm_ok(&["-d", "-t", &svc, "-r", &backend_of(&other)]);
    for client in [OTHER, me.as_str()] {
        let now = only(&spread(&t, client, &url(80), 6));
        assert!(now != first && now != other, "{client} on {now}");
    }

    // Client ranges: the listed client is served, the other one is not
    // answered at all and its SYNs are counted as denied.
    assert_eq!(spread(&t, &me, &url(81), 3).values().sum::<usize>(), 3);
    let denied = curl(&t, OTHER, &url(81));
    assert!(denied.is_err(), "{denied:?}");
    // And the operator sees why, as hubble observe shows a policy drop.
    let seen = xvs.adm_ok(&[
        "observe",
        "--verdict",
        "DROPPED",
        "--service",
        &format!("{VIP}:81"),
    ]);
    assert!(
        seen.lines().any(|l| l.contains(&format!(": {OTHER}:"))
            && l.contains(&format!(" -> {VIP}:81 DROPPED (TCP) source_denied"))),
        "{seen}"
    );
    // hubble's own filters find it too: by the client's address (its
    // drops, and not the listed client's), and by the port it was sent
    // to with the protocol; the listed client was never dropped.
    let observe = |filters: &[&str]| {
        let mut args = vec!["observe", "--verdict", "DROPPED", "--last", "100"];
        args.extend_from_slice(filters);
        xvs.adm_ok(&args)
    };
    let by_client = observe(&["--from-ip", OTHER]);
    assert!(!by_client.is_empty(), "no drop from {OTHER}");
    assert!(
        by_client
            .lines()
            .all(|l| l.contains(&format!(": {OTHER}:")) && l.ends_with(" source_denied")),
        "{by_client}"
    );
    // hubble's `-o json`: the same drops as the API's JSON, a line each.
    let json = observe(&["--from-ip", OTHER, "-o", "json"]);
    assert_eq!(json.lines().count(), by_client.lines().count(), "{json}");
    for l in json.lines() {
        let e: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(e["reason"], "source_denied", "{l}");
    }
    let by_port = observe(&["--to-port", "81", "--protocol", "tcp"]);
    assert_eq!(by_port, by_client, "every drop to port 81 is from {OTHER}");
    assert_eq!(observe(&["--from-ip", &me]), "", "the listed client");
    assert_eq!(observe(&["--ip", &me, "--to-port", "81"]), "");
    // Its flows were forwarded (hubble's verdict: xvs's new and closed
    // events); a verdict no event has is refused, not shown as nothing.
    let port81 = ["--from-ip", me.as_str(), "--to-port", "81", "--last", "100"];
    let forwarded = xvs.adm_ok(&[&["observe", "--verdict", "FORWARDED"][..], &port81[..]].concat());
    assert!(
        forwarded.lines().count() >= 3
            && forwarded
                .lines()
                .all(|l| l.contains(" NEW (TCP)") || l.contains(" CLOSED (TCP)")),
        "{forwarded}"
    );
    let (status, _, err) = xvs.adm(&["observe", "--verdict", "REDIRECTED"]);
    assert_eq!(status, 2, "{err}");
    assert!(
        err.starts_with("verdict `REDIRECTED': one of NEW, CLOSED"),
        "{err}"
    );
    // The API itself refuses it too (a script's GET, not xvsadm's).
    let body = xvs.get("/v1/events?verdict=REDIRECTED");
    assert!(
        body.contains(r#""kind":"invalid""#) && body.contains("REDIRECTED"),
        "{body}"
    );
    let line = xvs.stop_accounted();
    assert!(drops(&line, "source_denied") >= 1, "{line}");
}

/// Persistence over an IPv6 /64 (ipvsadm's `-M 64`, a `netmask = "64"`):
/// two client addresses of one /64 share one template, listed with the
/// masked network, and so one nginx.
#[test]
fn two_clients_of_one_ipv6_64_share_a_template_and_a_backend() {
    if !privileged("two_clients_of_one_ipv6_64_share_a_template_and_a_backend") {
        return;
    }
    let t = Topology::build(Spec::one_arm(3)).unwrap();
    let neighbour = "2001:2::3";
    t.client
        .ns
        .ip(&[
            "-6",
            "addr",
            "add",
            &format!("{neighbour}/64"),
            "dev",
            &t.client.ifname,
            "nodad",
        ])
        .unwrap();
    let _nginx: Vec<Nginx> = t.nginx_on_backends(true, 8080).unwrap();
    let backends = (0..3)
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr6(i)))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "{}\n[[services]]\nvip = \"{VIP6}\"\nport = 80\nscheduler = \"rr\"\n\
         persistence = {{ timeout = 60, netmask = \"64\" }}\nbackends = [{backends}]\n",
        one_arm_head_dual(&t, 1)
    );
    let (xvs, _) = Daemon::start(&t, "affinity6", &daemon::bins(TESTNET), &text, &[]).unwrap();
    let url = format!("http://[{VIP6}]:80/");
    let me = CLIENT_ADDR6.to_string();
    let mine = only(&spread(&t, &me, &url, 8));
    assert_eq!(only(&spread(&t, neighbour, &url, 8)), mine);
    let conns = xvs.adm_ok(&["-Lnc"]);
    let templates: Vec<&str> = conns.lines().filter(|l| l.contains("NONE")).collect();
    assert_eq!(templates.len(), 1, "{conns}");
    assert!(templates[0].contains(" [2001:2::]:0 "), "{conns}");
    xvs.stop_accounted();
}
