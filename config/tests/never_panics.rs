//! The parser never panics: arbitrary strings, and strings built from the
//! schema's own keys and values (which reach far deeper into validation
//! than random bytes do), yield a config or located diagnostics.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use proptest::prelude::*;
use xvs_config::parse_str;

fn check(text: &str) {
    if let Err(invalid) = parse_str("fuzz.toml", text) {
        assert!(!invalid.diagnostics.is_empty());
        let lines = text.split('\n').count();
        for d in &invalid.diagnostics {
            assert!(
                (1..=lines).contains(&d.line),
                "{d} (text has {lines} lines)"
            );
            assert!(d.column >= 1, "{d}");
        }
    }
}

/// A line of a plausible xvs.toml: a header or a `key = value` pair drawn
/// from the schema, with values both valid and not.
fn schema_line() -> impl Strategy<Value = String> {
    let headers = prop::sample::select(vec![
        "[interfaces]",
        "[snat]",
        "[conntrack]",
        "[conntrack.timeouts]",
        "[admin]",
        "[kubernetes]",
        "[[services]]",
        "[[services.backends]]",
        "[services.persistence]",
    ]);
    let keys = prop::sample::select(vec![
        "mode",
        "client",
        "backend",
        "queues",
        "cores",
        "poll",
        "steering",
        "xdp_mode",
        "zero_copy",
        "addresses",
        "ports",
        "worker_ports",
        "capacity",
        "established",
        "udp",
        "socket",
        "tcp",
        "token_file",
        "enabled",
        "kubeconfig",
        "service_proxy_name",
        "name",
        "vip",
        "protocol",
        "port",
        "scheduler",
        "flags",
        "persistence",
        "source_ranges",
        "maglev_table_size",
        "backends",
        "address",
        "weight",
        "forward",
        "timeout",
        "netmask",
    ]);
    let values = prop::sample::select(vec![
        "\"eth0\"",
        "\"two-arm\"",
        "\"one-arm\"",
        "[0, 1]",
        "[0, 0]",
        "[]",
        "[2]",
        "\"busy\"",
        "[\"198.18.2.1\"]",
        "\"1024-65535\"",
        "\"5-4\"",
        "[\"1-10\", \"5-20\"]",
        "0",
        "1",
        "-1",
        "65536",
        "16381",
        "65536",
        "\"198.19.0.1\"",
        "\"198.18.1.1\"",
        "\"tcp\"",
        "\"udp\"",
        "\"mh\"",
        "\"sh\"",
        "\"lcx\"",
        "[\"port\", \"port\"]",
        "{}",
        "{ timeout = 0 }",
        "[{ address = \"198.18.1.1\" }, { address = \"198.18.1.1\" }]",
        "\"/run/x.sock\"",
        "\"127.0.0.1:1\"",
        "true",
        "\"255.0.255.0\"",
        "[\"198.18.0.0/33\"]",
        "\"é\"",
    ]);
    prop_oneof![
        headers.prop_map(str::to_owned),
        (keys, values).prop_map(|(k, v)| format!("{k} = {v}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_strings_never_panic(text in "\\PC*") {
        check(&text);
    }

    #[test]
    fn arbitrary_toml_like_lines_never_panic(text in "([a-z_\\[\\]\"=0-9., {}-]{0,30}\n){0,20}") {
        check(&text);
    }

    #[test]
    fn schema_shaped_files_never_panic(lines in prop::collection::vec(schema_line(), 0..40)) {
        let mut text = String::from("[interfaces]\nclient = \"eth0\"\n[snat]\naddresses = [\"198.18.2.1\"]\n");
        text.push_str(&lines.join("\n"));
        check(&text);
    }
}
