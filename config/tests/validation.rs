//! Every validation rule of the config file, fed a bad file, with the exact
//! message and position it must produce.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use xvs_config::{parse_str, Encap, ForwardMethod};

/// Four lines every test document starts with: the two required sections.
const BASE: &str = "[interfaces]\nclient = \"eth0\"\n[snat]\naddresses = [\"198.18.2.1\"]\n";

/// The diagnostics of an invalid document, rendered.
fn errors(text: &str) -> Vec<String> {
    match parse_str("xvs.toml", text) {
        Ok(c) => panic!("expected an invalid config, got {c:?}"),
        Err(e) => e.diagnostics.iter().map(ToString::to_string).collect(),
    }
}

/// The single diagnostic of `BASE` followed by `rest`.
fn error(rest: &str) -> String {
    let all = errors(&format!("{BASE}{rest}"));
    assert_eq!(all.len(), 1, "expected one diagnostic, got {all:#?}");
    all.into_iter().next().unwrap()
}

/// `BASE` followed by `rest`.
fn with_base(rest: &str) -> String {
    format!("{BASE}{rest}")
}

fn with_interfaces(interfaces: &str, rest: &str) -> String {
    let all = errors(&format!(
        "[interfaces]\n{interfaces}\n[snat]\naddresses = [\"198.18.2.1\"]\n{rest}"
    ));
    assert_eq!(all.len(), 1, "expected one diagnostic, got {all:#?}");
    all.into_iter().next().unwrap()
}

// ---- shape: syntax, unknown keys, types, keywords, required fields ----

#[test]
fn syntax_error_is_located() {
    assert_eq!(
        errors("[[services]\nvip = 1\n"),
        ["xvs.toml:1:12: unclosed array table, expected `]`"]
    );
    assert_eq!(
        errors(&format!("{BASE}[admin]\nsocket = /run/x\n")),
        ["xvs.toml:6:10: string values must be quoted, expected literal string"]
    );
}

#[test]
fn duplicate_key_is_a_syntax_error() {
    assert_eq!(
        errors("[interfaces]\nclient = \"a\"\nclient = \"b\"\n"),
        ["xvs.toml:3:1: duplicate key"]
    );
}

#[test]
fn unknown_top_level_section() {
    assert_eq!(
        error("[service]\nvip = \"198.19.0.1\"\n"),
        "xvs.toml:5:2: service: unknown field \"service\" (expected one of interfaces, snat, conntrack, vips, admin, kubernetes, restart, tunnel, cluster, services)"
    );
}

#[test]
fn restart_takes_a_duration_with_a_unit_and_an_absolute_state_dir() {
    assert_eq!(
        error("[restart]\nhold = \"5\"\n"),
        "xvs.toml:6:8: restart.hold: \"5\" is not a duration of 0 to 300s (e.g. \"5s\", \"1500ms\"; \"0s\" turns restart survival off)"
    );
    assert_eq!(
        error("[restart]\nhold = \"10min\"\n"),
        "xvs.toml:6:8: restart.hold: \"10min\" is not a duration of 0 to 300s (e.g. \"5s\", \"1500ms\"; \"0s\" turns restart survival off)"
    );
    assert_eq!(
        error("[restart]\nstate_dir = \"run/xvs\"\n"),
        "xvs.toml:6:13: restart.state_dir: \"run/xvs\" is not an absolute path"
    );
    let c = parse_str("xvs.toml", &format!("{BASE}[restart]\nhold = \"1500ms\"\n")).unwrap();
    assert_eq!(c.restart.hold_ms, 1500);
    assert_eq!(c.restart.state_dir, std::path::Path::new("/run/xvs"));
    let c = parse_str("xvs.toml", BASE).unwrap();
    assert_eq!(c.restart.hold_ms, 5000);
}

#[test]
fn unknown_key_in_a_service() {
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = 80\nschedular = \"rr\"\n"),
        "xvs.toml:8:1: services[0].schedular: unknown field \"schedular\" (expected one of name, vip, protocol, port, scheduler, flags, persistence, source_ranges, maglev_table_size, backends)"
    );
}

#[test]
fn missing_required_field() {
    assert_eq!(
        error("[[services]]\nport = 80\n"),
        "xvs.toml:5:1: services[0].vip: required field is missing"
    );
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = 80\nbackends = [{ port = 80 }]\n"),
        "xvs.toml:8:13: services[0].backends[0].address: required field is missing"
    );
}

#[test]
fn wrong_type() {
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = \"80\"\n"),
        "xvs.toml:7:8: services[0].port: expected an integer, found string \"80\""
    );
    assert_eq!(
        error("[kubernetes]\nenabled = \"yes\"\n"),
        "xvs.toml:6:11: kubernetes.enabled: expected true or false, found string \"yes\""
    );
}

/// The example of the issue that defined the format, to the column.
#[test]
fn unknown_scheduler_example() {
    let text = format!(
        "{BASE}{}{}[[services]]\nvip = \"198.19.0.3\"\nport = 80\nscheduler = \"lcx\"\n",
        "[[services]]\nvip = \"198.19.0.1\"\nport = 80\n",
        "[[services]]\nvip = \"198.19.0.2\"\nport = 80\n",
    );
    assert_eq!(
        errors(&text),
        ["xvs.toml:14:13: services[2].scheduler: unknown scheduler \"lcx\" (expected one of rr, wrr, lc, wlc, sed, nq, dh, sh, mh, random, twos, lblc, lblcr, fo, ovf)"]
    );
}

#[test]
fn unknown_keywords_list_what_is_allowed() {
    let cases = [
        ("mode = \"three-arm\"", "xvs.toml:3:8: interfaces.mode: unknown interface mode \"three-arm\" (expected one of one-arm, two-arm)"),
        ("poll = \"spin\"", "xvs.toml:3:8: interfaces.poll: unknown poll mode \"spin\" (expected one of busy, adaptive)"),
        ("steering = \"some\"", "xvs.toml:3:12: interfaces.steering: unknown steering \"some\" (expected one of vip, all)"),
        ("xdp_mode = \"skb\"", "xvs.toml:3:12: interfaces.xdp_mode: unknown XDP attach mode \"skb\" (expected one of native, generic, auto)"),
        ("zero_copy = \"yes\"", "xvs.toml:3:13: interfaces.zero_copy: unknown zero-copy mode \"yes\" (expected one of auto, on, off)"),
    ];
    for (line, want) in cases {
        assert_eq!(
            with_interfaces(&format!("client = \"eth0\"\n{line}"), ""),
            want
        );
    }
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = 80\nprotocol = \"sctp\"\n"),
        "xvs.toml:8:12: services[0].protocol: unknown protocol \"sctp\" (expected one of tcp, udp)"
    );
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = 80\nscheduler = \"sh\"\nflags = [\"port\", \"sticky\"]\n"),
        "xvs.toml:9:9: services[0].flags[1]: unknown scheduler flag \"sticky\" (expected one of fallback, port)"
    );
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\nforward = \"nat\"\n"),
        "xvs.toml:10:11: services[0].backends[0].forward: unknown forward method \"nat\" (expected one of masq, route, tunnel)"
    );
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\nforward = \"tunnel\"\nencap = \"gre\"\n"),
        "xvs.toml:11:9: services[0].backends[0].encap: unknown encapsulation \"gre\" (expected one of ipip, gue)"
    );
}

// ---- direct routing, tunnels, health checks ----

#[test]
fn route_and_tunnel_backends_cannot_translate_ports() {
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0.1\"\nport = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\nport = 8080\nforward = \"route\"\n"),
        "xvs.toml:10:8: services[0].backends[0].port: route cannot translate ports (the packet reaches the backend as the client sent it): omit port or give the service's port 80"
    );
    let c = xvs_config::parse_str(
        "xvs.toml",
        &with_base("[[services]]\nvip = \"198.19.0.1\"\nport = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\nforward = \"tunnel\"\nencap = \"gue\"\n[[services.backends]]\naddress = \"198.18.1.2\"\nport = 8080\n"),
    )
    .unwrap();
    let b = &c.services[0].backends;
    assert_eq!(
        (b[0].forward, b[0].encap, b[0].port),
        (ForwardMethod::Tunnel, Encap::Gue, 80)
    );
    assert_eq!((b[1].forward, b[1].port), (ForwardMethod::Masq, 8080));
}

#[test]
fn a_route_backend_must_be_on_a_connected_segment() {
    let connected: Vec<ipnet::IpNet> = vec!["198.18.1.0/24".parse().unwrap()];
    let host = xvs_config::Host {
        connected: &connected,
        ..Default::default()
    };
    let text = with_base("[[services]]\nvip = \"198.19.0.1\"\nport = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\nforward = \"route\"\n[[services.backends]]\naddress = \"198.18.9.1\"\nforward = \"route\"\n[[services.backends]]\naddress = \"198.18.9.2\"\nforward = \"tunnel\"\n");
    let e = xvs_config::parse_str_on("xvs.toml", &text, &host).unwrap_err();
    assert_eq!(
        e.to_string().trim(),
        "xvs.toml:12:11: services[0].backends[1].address: 198.18.9.1 is not on a directly connected segment of this gateway (198.18.1.0/24): direct routing rewrites only the Ethernet destination, so the backend must share a link with the gateway (use tunnel for a routed backend)"
    );
}

#[test]
fn health_checks_are_read_with_their_defaults_and_checked() {
    let c = xvs_config::parse_str(
        "xvs.toml",
        &with_base("[[services]]\nvip = \"198.19.0.1\"\nport = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\ncheck = { kind = \"http\", interval = \"500ms\", timeout = \"200ms\", rise = 1, fall = 2, http_path = \"/health\", expect_status = 204 }\n[[services.backends]]\naddress = \"198.18.1.2\"\ncheck = { kind = \"tcp\", port = 8081 }\n[[services.backends]]\naddress = \"198.18.1.3\"\ncheck = { kind = \"none\" }\n[[services.backends]]\naddress = \"198.18.1.4\"\n"),
    )
    .unwrap();
    assert_eq!(c.checks.len(), 2);
    let http = &c.checks[0];
    assert_eq!(
        (http.address, http.port, http.probe_port),
        ("198.18.1.1".parse().unwrap(), 80, 80)
    );
    // A check's own port is probed; the backend stays the service's.
    assert_eq!((c.checks[1].port, c.checks[1].probe_port), (80, 8081));
    assert_eq!(
        http.check,
        xvs_config::HealthCheck {
            kind: xvs_config::CheckKind::Http,
            interval_ms: 500,
            timeout_ms: 200,
            rise: 1,
            fall: 2,
            http_path: "/health".into(),
            expect_status: 204,
        }
    );
    assert_eq!(c.checks[1].check, xvs_config::HealthCheck::default());
    for (check, want) in [
        ("{ interval = \"1s\", timeout = \"2s\" }", "services[0].backends[0].check.timeout: 2000ms is longer than the interval (1000ms): a check would overlap the next"),
        ("{ rise = 0 }", "services[0].backends[0].check.rise: 0 is out of range (expected 1..=100)"),
        ("{ kind = \"tcp\", http_path = \"/\" }", "services[0].backends[0].check: http_path and expect_status apply to kind = \"http\" only (this check is \"tcp\")"),
        ("{ kind = \"http\", http_path = \"health\" }", "services[0].backends[0].check.http_path: \"health\" is not an HTTP path (it starts with / and has no spaces)"),
        ("{ interval = \"often\" }", "services[0].backends[0].check.interval: \"often\" is not a duration of 100ms to 3600s (e.g. \"2s\", \"500ms\")"),
    ] {
        let e = error(&format!("[[services]]\nvip = \"198.19.0.1\"\nport = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\ncheck = {check}\n"));
        assert!(e.ends_with(want), "{check}: {e}");
    }
}

// ---- required sections ----

#[test]
fn interfaces_and_snat_are_required() {
    assert_eq!(
        errors("[snat]\naddresses = [\"198.18.2.1\"]\n"),
        ["xvs.toml:1:1: interfaces: required section is missing (e.g. [interfaces] client = \"eth0\")"]
    );
    assert_eq!(
        errors("[interfaces]\nclient = \"eth0\"\n"),
        ["xvs.toml:1:1: snat: required section is missing (full NAT needs a source address, e.g. [snat] addresses = [\"198.18.2.1\"])"]
    );
}

// ---- interfaces ----

#[test]
fn interface_names() {
    assert_eq!(
        with_interfaces("client = \"\"", ""),
        "xvs.toml:2:10: interfaces.client: \"\" is not an interface name (1 to 15 characters, no '/', ':' or spaces)"
    );
    assert_eq!(
        with_interfaces("client = \"a-very-long-interface\"", ""),
        "xvs.toml:2:10: interfaces.client: \"a-very-long-interface\" is not an interface name (1 to 15 characters, no '/', ':' or spaces)"
    );
    assert_eq!(
        with_interfaces("client = \"eth 0\"", ""),
        "xvs.toml:2:10: interfaces.client: \"eth 0\" is not an interface name (1 to 15 characters, no '/', ':' or spaces)"
    );
}

#[test]
fn arm_modes() {
    assert_eq!(
        with_interfaces("mode = \"two-arm\"\nclient = \"eth0\"", ""),
        "xvs.toml:1:1: interfaces.backend: required in two-arm mode (the backend-facing interface)"
    );
    assert_eq!(
        with_interfaces("client = \"eth0\"\nbackend = \"eth1\"", ""),
        "xvs.toml:3:11: interfaces.backend: only allowed in two-arm mode (interfaces.mode is one-arm)"
    );
    assert_eq!(
        with_interfaces(
            "mode = \"two-arm\"\nclient = \"eth0\"\nbackend = \"eth0\"",
            ""
        ),
        "xvs.toml:4:11: interfaces.backend: must differ from interfaces.client (both are \"eth0\")"
    );
}

#[test]
fn queues() {
    assert_eq!(
        with_interfaces("client = \"eth0\"\nqueues = []", ""),
        "xvs.toml:3:10: interfaces.queues: must list at least one queue"
    );
    assert_eq!(
        with_interfaces(
            "client = \"eth0\"\nqueues = [0, 1, 1]\ncores = [0, 1, 2]",
            ""
        ),
        "xvs.toml:3:17: interfaces.queues[2]: queue 1 listed twice"
    );
    assert_eq!(
        with_interfaces("client = \"eth0\"\nqueues = [-1]", ""),
        "xvs.toml:3:11: interfaces.queues[0]: -1 is out of range (expected 0..=65535)"
    );
}

#[test]
fn as_many_cores_as_queues() {
    assert_eq!(
        with_interfaces("client = \"eth0\"\nqueues = [0, 1]\ncores = [2]", ""),
        "xvs.toml:4:9: interfaces.cores: 1 cores for 2 queues (one core per queue, in the same order)"
    );
    assert_eq!(
        with_interfaces("client = \"eth0\"\nqueues = [0, 1]\ncores = [2, 2]", ""),
        "xvs.toml:4:13: interfaces.cores[1]: core 2 listed twice (each worker needs a core of its own)"
    );
    assert_eq!(
        with_interfaces("client = \"eth0\"\ncores = [1024]", ""),
        "xvs.toml:3:10: interfaces.cores[0]: 1024 is out of range (expected 0..=1023)"
    );
}

// ---- snat ----

fn with_snat(snat: &str, rest: &str) -> Vec<String> {
    errors(&format!(
        "[interfaces]\nclient = \"eth0\"\nqueues = [0, 1]\n[snat]\n{snat}\n{rest}"
    ))
}

#[test]
fn snat_addresses() {
    assert_eq!(
        with_snat("addresses = []", ""),
        ["xvs.toml:5:13: snat.addresses: must list at least one address"]
    );
    assert_eq!(
        with_snat("addresses = [\"198.18.2.300\"]", ""),
        ["xvs.toml:5:14: snat.addresses[0]: \"198.18.2.300\" is not an IPv4 or IPv6 address"]
    );
    assert_eq!(
        with_snat("addresses = [\"127.0.0.1\"]", ""),
        ["xvs.toml:5:14: snat.addresses[0]: 127.0.0.1 is not a unicast address (not 0.0.0.0/8, loopback, multicast, 240.0.0.0/4 or broadcast)"]
    );
    assert_eq!(
        with_snat("addresses = [\"198.18.2.1\", \"198.18.2.1\"]", ""),
        ["xvs.toml:5:28: snat.addresses[1]: 198.18.2.1 listed twice"]
    );
}

#[test]
fn snat_address_must_not_be_a_vip() {
    assert_eq!(
        with_snat(
            "addresses = [\"198.19.0.1\"]",
            "[[services]]\nvip = \"198.19.0.1\"\nport = 80\n"
        ),
        ["xvs.toml:7:7: services[0].vip: 198.19.0.1 is a SNAT address of this gateway (a VIP must not be one)"]
    );
}

#[test]
fn snat_port_range() {
    let a = "addresses = [\"198.18.2.1\"]\n";
    assert_eq!(
        with_snat(&format!("{a}ports = \"1024:2048\""), ""),
        ["xvs.toml:6:9: snat.ports: \"1024:2048\" is not a port range (expected \"FIRST-LAST\", e.g. \"1024-65535\")"]
    );
    assert_eq!(
        with_snat(&format!("{a}ports = \"0-2048\""), ""),
        ["xvs.toml:6:9: snat.ports: \"0-2048\": port 0 cannot be allocated (ports start at 1)"]
    );
    assert_eq!(
        with_snat(&format!("{a}ports = \"5000-4000\""), ""),
        ["xvs.toml:6:9: snat.ports: \"5000-4000\": first port 5000 is above last port 4000"]
    );
    assert_eq!(
        with_snat(&format!("{a}ports = \"5000-5000\""), ""),
        ["xvs.toml:6:9: snat.ports: 5000-5000 has 1 ports for 2 workers (each worker needs a slice of its own)"]
    );
}

#[test]
fn snat_worker_slices_do_not_overlap() {
    let a = "addresses = [\"198.18.2.1\"]\nports = \"1024-4095\"\n";
    assert_eq!(
        with_snat(&format!("{a}worker_ports = [\"1024-2047\"]"), ""),
        ["xvs.toml:7:16: snat.worker_ports: 1 slices for 2 workers (one slice per queue, in the same order)"]
    );
    assert_eq!(
        with_snat(&format!("{a}worker_ports = [\"1024-2047\", \"2000-4095\"]"), ""),
        ["xvs.toml:7:30: snat.worker_ports[1]: 2000-4095 overlaps snat.worker_ports[0] (1024-2047): each worker needs ports of its own"]
    );
    assert_eq!(
        with_snat(
            &format!("{a}worker_ports = [\"1024-2047\", \"2048-5000\"]"),
            ""
        ),
        ["xvs.toml:7:30: snat.worker_ports[1]: 2048-5000 is outside snat.ports (1024-4095)"]
    );
    let ok = parse_str(
        "xvs.toml",
        &format!("[interfaces]\nclient = \"eth0\"\nqueues = [0, 1]\n[snat]\n{a}worker_ports = [\"3000-4095\", \"1024-2999\"]\n"),
    )
    .unwrap();
    assert_eq!(ok.snat.worker_ports[0].first, 3000);
    assert_eq!(ok.snat.worker_ports[1].last, 2999);
}

// ---- conntrack ----

#[test]
fn conntrack_capacity() {
    assert_eq!(
        error("[conntrack]\ncapacity = 0\n"),
        "xvs.toml:6:12: conntrack.capacity: 0 is out of range (expected 1..=268435456 flows)"
    );
    assert_eq!(
        with_snat(
            "addresses = [\"198.18.2.1\"]",
            "[conntrack]\ncapacity = 1\n"
        ),
        ["xvs.toml:7:12: conntrack.capacity: 1 is below one flow per worker (2 workers)"]
    );
}

#[test]
fn every_timeout_is_range_checked() {
    let names = [
        "established",
        "syn_sent",
        "syn_recv",
        "fin_wait",
        "time_wait",
        "close",
        "close_wait",
        "last_ack",
        "synack",
        "udp",
        "icmp",
    ];
    for name in names {
        let pad = name.len() + 4;
        assert_eq!(
            error(&format!("[conntrack.timeouts]\n{name} = 0\n")),
            format!("xvs.toml:6:{pad}: conntrack.timeouts.{name}: 0 is out of range (expected 1..=2147483 seconds)")
        );
    }
    assert_eq!(
        error("[conntrack.timeouts]\nestablished = 2147484\n"),
        "xvs.toml:6:15: conntrack.timeouts.established: 2147484 is out of range (expected 1..=2147483 seconds)"
    );
}

// ---- admin and kubernetes ----

#[test]
fn admin_api() {
    assert_eq!(
        error("[admin]\nsocket = \"xvs.sock\"\n"),
        "xvs.toml:6:10: admin.socket: \"xvs.sock\" is not an absolute path"
    );
    assert_eq!(
        error("[admin]\ntcp = \"localhost\"\ntoken_file = \"/etc/xvs/token\"\n"),
        "xvs.toml:6:7: admin.tcp: \"localhost\" is not an address:port (e.g. \"127.0.0.1:9180\")"
    );
    assert_eq!(
        error("[admin]\ntcp = \"127.0.0.1:9180\"\n"),
        "xvs.toml:6:7: admin.token_file: required when admin.tcp is set (the API never listens on TCP without a bearer token)"
    );
    assert_eq!(
        error("[admin]\ntcp = \"127.0.0.1:9180\"\ntoken_file = \"token\"\n"),
        "xvs.toml:7:14: admin.token_file: \"token\" is not an absolute path"
    );
}

#[test]
fn kubernetes_source() {
    assert_eq!(
        error("[kubernetes]\nservice_proxy_name = \"-xvs\"\n"),
        "xvs.toml:6:22: kubernetes.service_proxy_name: \"-xvs\" is not a label value (1 to 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)"
    );
    assert_eq!(
        error("[kubernetes]\nkubeconfig = \"\"\n"),
        "xvs.toml:6:14: kubernetes.kubeconfig: must not be empty (omit it for in-cluster configuration)"
    );
}

// ---- services ----

fn service(body: &str) -> String {
    error(&format!("[[services]]\nvip = \"198.19.0.1\"\n{body}\n"))
}

#[test]
fn vip() {
    assert_eq!(
        error("[[services]]\nvip = \"198.19.0\"\nport = 80\n"),
        "xvs.toml:6:7: services[0].vip: \"198.19.0\" is not an IPv4 or IPv6 address"
    );
    assert_eq!(
        error("[[services]]\nvip = \"224.0.0.1\"\nport = 80\n"),
        "xvs.toml:6:7: services[0].vip: 224.0.0.1 is not a unicast address (not 0.0.0.0/8, loopback, multicast, 240.0.0.0/4 or broadcast)"
    );
}

#[test]
fn service_port() {
    assert_eq!(
        service("port = 65536"),
        "xvs.toml:7:8: services[0].port: 65536 is out of range (expected 0..=65535)"
    );
    assert_eq!(
        service("port = 0"),
        "xvs.toml:7:8: services[0].port: port 0 (all ports) is allowed only on a persistent service"
    );
    parse_str(
        "xvs.toml",
        &format!("{BASE}[[services]]\nvip = \"198.19.0.1\"\nport = 0\npersistence = {{}}\n"),
    )
    .unwrap();
}

#[test]
fn duplicate_service() {
    let text = format!(
        "{BASE}[[services]]\nvip = \"198.19.0.1\"\nport = 80\n\n[[services]]\nvip = \"198.19.0.1\"\nport = 80\nprotocol = \"tcp\"\n"
    );
    assert_eq!(
        errors(&text),
        ["xvs.toml:9:1: services[1]: duplicate service tcp 198.19.0.1:80 (first defined by services[0] at line 5)"]
    );
    // The same address and port over UDP is another service.
    let text = text.replace("protocol = \"tcp\"", "protocol = \"udp\"");
    assert_eq!(parse_str("xvs.toml", &text).unwrap().services.len(), 2);
}

#[test]
fn scheduler_flags() {
    assert_eq!(
        service("port = 80\nscheduler = \"rr\"\nflags = [\"port\"]"),
        "xvs.toml:9:9: services[0].flags: scheduler rr takes no flags (fallback and port apply to dh, sh and mh)"
    );
    assert_eq!(
        service("port = 80\nflags = [\"port\"]"),
        "xvs.toml:8:9: services[0].flags: scheduler wlc takes no flags (fallback and port apply to dh, sh and mh)"
    );
    assert_eq!(
        service("port = 80\nscheduler = \"sh\"\nflags = [\"port\", \"port\"]"),
        "xvs.toml:9:18: services[0].flags[1]: flag port listed twice"
    );
}

#[test]
fn persistence() {
    assert_eq!(
        service("port = 80\npersistence = { timeout = 0 }"),
        "xvs.toml:8:27: services[0].persistence.timeout: 0 is out of range (expected 1..=2147483 seconds)"
    );
    assert_eq!(
        service("port = 80\npersistence = { netmask = \"255.0.255.0\" }"),
        "xvs.toml:8:27: services[0].persistence.netmask: 255.0.255.0 is not a contiguous netmask (e.g. 255.255.255.0)"
    );
    assert_eq!(
        service("port = 80\npersistence = { netmask = \"/33\" }"),
        "xvs.toml:8:27: services[0].persistence.netmask: prefix length 33 is out of range for 198.19.0.1"
    );
    assert_eq!(
        service("port = 80\npersistence = { timeout = 300, affinity = 1 }"),
        "xvs.toml:8:32: services[0].persistence.affinity: unknown field \"affinity\" (expected timeout or netmask)"
    );
}

#[test]
fn source_ranges() {
    assert_eq!(
        service("port = 80\nsource_ranges = [\"198.18.0.0/24\", \"198.18.0.0/33\"]"),
        "xvs.toml:8:35: services[0].source_ranges[1]: \"198.18.0.0/33\" is not a CIDR (e.g. \"198.18.0.0/24\" or \"2001:2::/64\")"
    );
}

#[test]
fn maglev_table_size() {
    assert_eq!(
        service("port = 80\nscheduler = \"wlc\"\nmaglev_table_size = 16381"),
        "xvs.toml:9:21: services[0].maglev_table_size: only the mh scheduler uses a Maglev table (scheduler is wlc)"
    );
    assert_eq!(
        service("port = 80\nscheduler = \"mh\"\nmaglev_table_size = 65536"),
        "xvs.toml:9:21: services[0].maglev_table_size: 65536 is not prime (nearest primes: 65521 and 65537)"
    );
    assert_eq!(
        service("port = 80\nscheduler = \"mh\"\nmaglev_table_size = 131072"),
        "xvs.toml:9:21: services[0].maglev_table_size: 131072 is out of range (expected a prime up to 131071)"
    );
    assert_eq!(
        service(
            "port = 80\nscheduler = \"mh\"\nmaglev_table_size = 3\nbackends = [\n{ address = \"198.18.1.1\" },\n{ address = \"198.18.1.2\" },\n{ address = \"198.18.1.3\" }]"
        ),
        "xvs.toml:9:21: services[0].maglev_table_size: 3 must be larger than the number of backends (3)"
    );
}

#[test]
fn backend_address() {
    assert_eq!(
        service("port = 80\nbackends = [{ address = \"198.18.1\" }]"),
        "xvs.toml:8:25: services[0].backends[0].address: \"198.18.1\" is not an IPv4 or IPv6 address"
    );
    assert_eq!(
        service("port = 80\nbackends = [{ address = \"0.1.2.3\" }]"),
        "xvs.toml:8:25: services[0].backends[0].address: 0.1.2.3 is not a unicast address (not 0.0.0.0/8, loopback, multicast, 240.0.0.0/4 or broadcast)"
    );
    assert_eq!(
        service("port = 80\nbackends = [\n{ address = \"198.18.1.1\", port = 8080 },\n{ address = \"198.18.1.1\", port = 8080 }]"),
        "xvs.toml:10:13: services[0].backends[1].address: duplicate backend 198.18.1.1:8080 (first in backends[0])"
    );
}

#[test]
fn backend_port() {
    assert_eq!(
        service("port = 80\nbackends = [{ address = \"198.18.1.1\", port = 70000 }]"),
        "xvs.toml:8:46: services[0].backends[0].port: 70000 is out of range (expected 0..=65535)"
    );
    assert_eq!(
        service("port = 80\nbackends = [{ address = \"198.18.1.1\", port = 0 }]"),
        "xvs.toml:8:46: services[0].backends[0].port: port 0 is allowed only on a port-0 service"
    );
    assert_eq!(
        service("port = 0\npersistence = {}\nbackends = [{ address = \"198.18.1.1\", port = 80 }]"),
        "xvs.toml:9:46: services[0].backends[0].port: must be omitted on a port-0 service (each flow keeps the port the client asked for)"
    );
}

#[test]
fn backend_weight() {
    assert_eq!(
        service("port = 80\nbackends = [{ address = \"198.18.1.1\", weight = 65536 }]"),
        "xvs.toml:8:48: services[0].backends[0].weight: 65536 is out of range (expected 0..=65535)"
    );
    assert_eq!(
        service("port = 80\n[[services.backends]]\naddress = \"198.18.1.1\"\nweight = -1"),
        "xvs.toml:10:10: services[0].backends[0].weight: -1 is out of range (expected 0..=65535)"
    );
}

// ---- reporting ----

#[test]
fn every_semantic_problem_is_reported_in_file_order() {
    let text = "[interfaces]\nclient = \"eth0\"\nqueues = [0, 0]\n[snat]\naddresses = [\"255.255.255.255\"]\n[admin]\nsocket = \"rel\"\n[[services]]\nvip = \"198.19.0.1\"\nport = 0\n";
    assert_eq!(
        errors(text),
        [
            "xvs.toml:3:14: interfaces.queues[1]: queue 0 listed twice",
            "xvs.toml:5:14: snat.addresses[0]: 255.255.255.255 is not a unicast address (not 0.0.0.0/8, loopback, multicast, 240.0.0.0/4 or broadcast)",
            "xvs.toml:7:10: admin.socket: \"rel\" is not an absolute path",
            "xvs.toml:10:8: services[0].port: port 0 (all ports) is allowed only on a persistent service",
        ]
    );
}

#[test]
fn load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("xvs-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[interfaces]\nclient = 1\n").unwrap();
    let err = xvs_config::load(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}:2:10: interfaces.client: expected a string, found integer 1",
            path.display()
        )
    );
    let missing = dir.join("missing.toml");
    let err = xvs_config::load(&missing).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("{}: cannot read: ", missing.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- IPv6 and dual-stack ----

const BASE6: &str =
    "[interfaces]\nclient = \"eth0\"\n[snat]\naddresses = [\"198.18.2.1\", \"2001:2:0:2::1\"]\n";

#[test]
fn a_dual_stack_file_is_one_service_per_family() {
    let text = format!(
        "{BASE6}[[services]]\nvip = \"198.19.0.1\"\nport = 80\nbackends = [{{ address = \"198.18.1.10\" }}]\n\
         [[services]]\nvip = \"2001:2:ff::1\"\nport = 80\npersistence = {{ netmask = \"64\" }}\n\
         source_ranges = [\"2001:2::/48\"]\nbackends = [{{ address = \"2001:2:0:1::10\" }}]\n"
    );
    let c = parse_str("xvs.toml", &text).unwrap();
    assert_eq!(c.snat.addresses.len(), 1);
    assert_eq!(
        c.snat.addresses6,
        ["2001:2:0:2::1".parse::<std::net::Ipv6Addr>().unwrap()]
    );
    assert_eq!(c.services.len(), 2);
    let v6 = &c.services[1];
    assert_eq!(v6.key.to_string(), "tcp [2001:2:ff::1]:80");
    assert_eq!(
        v6.persistence.unwrap().netmask.to_string(),
        "ffff:ffff:ffff:ffff::",
        "a prefix length, as ipvsadm's -M takes for IPv6"
    );
    assert!(v6.narrow::<std::net::Ipv6Addr>().is_some());
    assert!(v6.narrow::<std::net::Ipv4Addr>().is_none());
}

#[test]
fn a_service_of_mixed_families_is_refused_at_its_backend() {
    let all = errors(&format!(
        "{BASE6}[[services]]\nvip = \"2001:2:ff::1\"\nport = 80\nbackends = [{{ address = \"198.18.1.10\" }}]\n"
    ));
    assert_eq!(
        all,
        ["xvs.toml:8:25: services[0].backends[0].address: 198.18.1.10 is not of the VIP's family (2001:2:ff::1): a service's backends are of its VIP's family (NAT64 is not done; a dual-stack service is one service per family)"]
    );
    let all = errors(&format!(
        "{BASE6}[[services]]\nvip = \"2001:2:ff::1\"\nport = 80\nsource_ranges = [\"198.18.0.0/24\"]\n"
    ));
    assert_eq!(
        all,
        ["xvs.toml:8:18: services[0].source_ranges[0]: 198.18.0.0/24 is not of the VIP's family (2001:2:ff::1)"]
    );
}

#[test]
fn an_ipv6_service_needs_an_ipv6_snat_address_and_unicast_addresses() {
    assert_eq!(
        error("[[services]]\nvip = \"2001:2:ff::1\"\nport = 80\n"),
        "xvs.toml:6:7: services[0].vip: 2001:2:ff::1 needs a SNAT address of its family in snat.addresses (full NAT sources its backends' flows from one)"
    );
    let all = errors(&format!(
        "{BASE6}[[services]]\nvip = \"fe80::1\"\nport = 80\n"
    ));
    assert_eq!(
        all,
        ["xvs.toml:6:7: services[0].vip: fe80::1 is not a unicast address (not ::, loopback, multicast, link-local fe80::/10 or IPv4-mapped)"]
    );
    let all = errors(&format!(
        "{BASE6}[[services]]\nvip = \"2001:2:ff::1\"\nport = 80\npersistence = {{ netmask = \"129\" }}\n"
    ));
    assert_eq!(
        all,
        ["xvs.toml:8:27: services[0].persistence.netmask: prefix length 129 is out of range for 2001:2:ff::1"]
    );
}

// ---- [cluster.sync] ----

#[test]
fn sync_takes_a_node_an_own_address_and_peers() {
    let c = parse_str(
        "xvs.toml",
        &with_base(
            "[cluster.sync]\nnode = 2\nid = 7\nlisten = \"198.18.9.2:8848\"\npeers = [\"198.18.9.1:8848\"]\nkey_file = \"/etc/xvs/sync.key\"\nrole = \"backup\"\npeer_timeout = \"3s\"\n",
        ),
    )
    .unwrap();
    let s = c.cluster.sync.unwrap();
    assert_eq!((s.node, s.id, s.role), (2, 7, xvs_config::SyncRole::Backup));
    assert_eq!(s.peers, ["198.18.9.1:8848".parse().unwrap()]);
    assert_eq!(s.peer_timeout_ms, Some(3000));
    assert!(!s.multicast());
    let m = parse_str(
        "xvs.toml",
        &with_base("[cluster.sync]\nnode = 1\nlisten = \"198.18.9.1:8848\"\npeers = [\"239.0.0.81:8848\"]\n"),
    )
    .unwrap();
    let m = m.cluster.sync.unwrap();
    assert!(m.multicast());
    assert_eq!(
        (m.id, m.role, m.key_file),
        (0, xvs_config::SyncRole::Active, None)
    );
}

#[test]
fn sync_mistakes_are_located() {
    let sync = |body: &str| error(&format!("[cluster.sync]\n{body}"));
    let peers = "peers = [\"198.18.9.1:8848\"]\n";
    assert_eq!(
        sync(&format!("node = 0\nlisten = \"198.18.9.2:8848\"\n{peers}")),
        "xvs.toml:6:8: cluster.sync.node: 0 is out of range (expected 1..=4294967295)"
    );
    assert!(sync(&format!("node = 1\nlisten = \"198.18.9.2\"\n{peers}"))
        .contains("cluster.sync.listen: \"198.18.9.2\" is not an address and port"));
    assert!(
        sync(&format!("node = 1\nlisten = \"239.0.0.81:8848\"\n{peers}"))
            .contains("cluster.sync.listen: must be this gateway's own address")
    );
    assert!(sync("node = 1\nlisten = \"198.18.9.2:8848\"\npeers = []\n")
        .contains("cluster.sync.peers: needs at least one peer"));
    assert!(sync("node = 1\nlisten = \"198.18.9.2:8848\"\npeers = [\"239.0.0.81:8848\", \"198.18.9.1:8848\"]\n")
        .contains("a multicast group is the only entry"));
    assert!(
        sync("node = 1\nlisten = \"198.18.9.2:8848\"\npeers = [\"[2001:2::1]:8848\"]\n")
            .contains("must be of listen's address family")
    );
    assert!(sync(&format!(
        "node = 1\nlisten = \"198.18.9.2:8848\"\n{peers}peer_timeout = \"10ms\"\n"
    ))
    .contains("cluster.sync.peer_timeout: \"10ms\" is not a duration of 500ms to 600s"));
    assert!(sync(&format!(
        "node = 1\nlisten = \"198.18.9.2:8848\"\n{peers}key_file = \"sync.key\"\n"
    ))
    .contains("cluster.sync.key_file"));
    assert!(sync(&format!(
        "node = 1\nlisten = \"198.18.9.2:8848\"\n{peers}role = \"master\"\n"
    ))
    .contains("unknown sync role \"master\" (expected one of active, backup)"));
}
