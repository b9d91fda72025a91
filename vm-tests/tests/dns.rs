//! A DNS service the way a cluster runs its resolver: dnsmasq real
//! servers behind one VIP on UDP and TCP port 53, and `dig` as the client.
//! Each server answers `who.test` with its own address, so an answer
//! names the backend that gave it. Queries from fresh ports spread over
//! the backends; a resolver that keeps one source port stays on its
//! backend (one UDP flow) until that backend is removed, and then its
//! very next query is answered by another backend, not lost: the flow
//! ends at its next packet (IPVS's `expire_nodest_conn`, which kube-proxy
//! sets) and that packet is scheduled afresh, where kube-proxy's iptables
//! mode needs its stale-UDP conntrack flush (which `xvsadm conntrack -D`
//! does as conntrack(8) does, shown too). The port's flow also survives
//! a `kill -9` of xvs and the start after it. A server that stops is
//! heard at once: its kernel's port unreachable reaches dig as the VIP's.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::time::Duration;

use xvs_vm_tests::daemon::{self, Daemon};
use xvs_vm_tests::netns::Netns;
use xvs_vm_tests::privileged;
use xvs_vm_tests::procs::Spawned;
use xvs_vm_tests::topology::{backend_addr, one_arm_head, Spec, Topology, CLIENT_ADDR};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";

/// dnsmasq in `ns` on `addr`:53 (UDP and TCP), answering `who.test` with
/// `addr`, no upstream; ready once it answers a query from its own
/// namespace. Killed (by its PID) when the guard drops.
fn nameserver(ns: &Netns, addr: std::net::Ipv4Addr) -> Spawned {
    let mut cmd = ns.command("dnsmasq");
    cmd.args([
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--user=root",
        "--group=root",
        "--bind-interfaces",
        "--pid-file=",
        "--log-facility=-",
        "--port=53",
    ])
    .arg(format!("--listen-address={addr}"))
    .arg(format!("--address=/who.test/{addr}"));
    let at = format!("@{addr}");
    Spawned::start_until(cmd, "dnsmasq", Duration::from_secs(10), || {
        ns.exec("dig", &[&at, "who.test", "+short", "+time=1", "+tries=1"])
            .is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
    })
    .unwrap()
}

/// One `dig` from the client to the VIP (`extra`: more options, such as
/// `+tcp` or `-b ADDR#PORT`), one try of one second: the address in the
/// answer, or what dig said.
fn ask(t: &Topology, extra: &[&str]) -> Result<String, String> {
    let at = format!("@{VIP}");
    let mut args = vec![at.as_str(), "who.test", "+short", "+time=1", "+tries=1"];
    args.extend_from_slice(extra);
    // A failed dig (no answer in time: exit 9) is an error of `exec`.
    let out = t
        .client
        .ns
        .exec("dig", &args)
        .map_err(|e| format!("{e:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match text.is_empty() || text.starts_with(";;") {
        true => Err(format!("dig answered nothing: {text:?}")),
        false => Ok(text),
    }
}

/// Answers per backend address of `n` queries with options `extra`.
fn spread(t: &Topology, n: usize, extra: &[&str]) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for _ in 0..n {
        let who = ask(t, extra).unwrap_or_else(|e| panic!("dig {extra:?}: {e}"));
        *by.entry(who).or_default() += 1;
    }
    by
}

#[test]
fn dig_through_xvs_and_a_resolver_s_port_moves_when_its_backend_is_removed() {
    if !privileged("dig_through_xvs_and_a_resolver_s_port_moves_when_its_backend_is_removed") {
        return;
    }
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let mut servers: Vec<Option<Spawned>> = (0..2)
        .map(|i| Some(nameserver(&t.backends[i].ns, backend_addr(i))))
        .collect();
    let backends = format!(
        "[{{ address = \"{}\", port = 53 }}, {{ address = \"{}\", port = 53 }}]",
        backend_addr(0),
        backend_addr(1)
    );
    // The flow state outlives each instance's own folder.
    let state = daemon::ScratchDir::new(&t, "dns-state").unwrap();
    let text = format!(
        "{}\n[restart]\nhold = \"5s\"\nstate_dir = \"{}\"\n\n\
         [[services]]\nvip = \"{VIP}\"\nprotocol = \"udp\"\nport = 53\nscheduler = \"rr\"\nbackends = {backends}\n\n\
         [[services]]\nvip = \"{VIP}\"\nport = 53\nscheduler = \"rr\"\nbackends = {backends}\n",
        one_arm_head(&t, 1),
        state.path().display()
    );
    let (xvs, ready) = Daemon::start(&t, "dns", &daemon::bins(TESTNET), &text, &[]).unwrap();
    assert!(ready.starts_with("ready: 2 services on g0"), "{ready}");
    let (b0, b1) = (backend_addr(0).to_string(), backend_addr(1).to_string());

    // dig takes a fresh port per query: one new flow each, in turn.
    let udp = spread(&t, 20, &[]);
    assert_eq!(udp, BTreeMap::from([(b0.clone(), 10), (b1.clone(), 10)]));
    let tcp = spread(&t, 4, &["+tcp"]);
    assert_eq!(tcp, BTreeMap::from([(b0.clone(), 2), (b1.clone(), 2)]));

    // A resolver with one source port: one flow, one backend.
    let fixed = format!("{CLIENT_ADDR}#5300");
    let pinned = spread(&t, 5, &["-b", &fixed]);
    assert_eq!(pinned.len(), 1, "one port, one backend: {pinned:?}");

    // The iptables-mode remedy, by hand: the flow deleted as conntrack
    // deletes it, named by its whole tuple (found by a lookup, not a
    // walk: listed first, then deleted, as `conntrack -G` and `-D`); the
    // port's next query is scheduled afresh (rr: the other backend) and
    // stays there.
    let client = CLIENT_ADDR.to_string();
    let tuple = [
        "-p", "udp", "-s", &client, "-d", VIP, "--sport", "5300", "--dport", "53",
    ];
    let (code, listed, said) = xvs.adm(&[&["conntrack", "-L"], &tuple[..]].concat());
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(" 1 flow entries have been shown."), "{said}");
    assert!(
        listed.contains(&format!("src={client} dst={VIP} sport=5300 dport=53 ")),
        "{listed}"
    );
    let (code, _, said) = xvs.adm(&[&["conntrack", "-D"], &tuple[..]].concat());
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains(" 1 flow entries have been deleted."),
        "{said}"
    );
    let repinned = spread(&t, 5, &["-b", &fixed]);
    assert_eq!(repinned.len(), 1, "one port, one backend: {repinned:?}");
    assert_ne!(repinned, pinned, "rescheduled to the other backend");

    // xvs killed (kill -9) and started again, as an upgrade gone wrong:
    // the next instance adopts the UDP flows, and the port stays put.
    let (status, _) = xvs.kill(libc::SIGKILL);
    assert!(status.is_some());
    let (xvs, _) = Daemon::start(&t, "dns", &daemon::bins(TESTNET), &text, &[]).unwrap();
    let status: serde_json::Value = serde_json::from_str(&xvs.get("/v1/status")).unwrap();
    assert!(
        status["restart"]["adopted_flows"].as_u64().unwrap_or(0) >= 1,
        "{status}"
    );
    assert_eq!(
        spread(&t, 5, &["-b", &fixed]),
        repinned,
        "after the restart"
    );
    let (gone, stays) = match repinned.contains_key(&b0) {
        true => (b0, b1),
        false => (b1, b0),
    };
    let conns = xvs.adm_ok(&["-Lnc"]);
    assert!(
        conns.contains(&format!("{CLIENT_ADDR}:5300")) && conns.contains("UDP"),
        "{conns}"
    );

    // Its backend goes (as an EndpointSlice update does): the next query
    // from that same port is answered, by the other backend, first try.
    xvs.adm_ok(&[
        "-d",
        "-u",
        &format!("{VIP}:53"),
        "-r",
        &format!("{gone}:53"),
    ]);
    let moved = spread(&t, 5, &["-b", &fixed]);
    assert_eq!(moved, BTreeMap::from([(stays.clone(), 5)]));

    // The server left stops: its kernel's port unreachable comes back
    // through xvs as the VIP's, and dig hears "connection refused" at
    // once instead of waiting out its timeout.
    let last = usize::from(stays != backend_addr(0).to_string());
    servers[last] = None;
    let out = t
        .client
        .ns
        .command("dig")
        .args([
            &format!("@{VIP}"),
            "who.test",
            "+short",
            "+time=2",
            "+tries=1",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("connection refused"), "{said}");
    let line = xvs.stop_accounted();
    assert_eq!(daemon::drops(&line, "no_backend"), 0, "{line}");
}
