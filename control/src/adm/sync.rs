//! `xvsadm -L --daemon` (ipvsadm's sync daemon line, then one line per
//! peer heard and the counters) and `xvsadm --takeover [NODE]` (what a
//! keepalived notify script or an operator runs to make this gateway
//! serve a failed peer's addresses).

use std::io::Write;

use hyper::Method;
use xvs_dataplane::runtime::SyncState;

use super::client::{request, Endpoint};
use crate::ha::TakeoverDone;

/// The `--daemon` listing: nothing when sync is not configured, as
/// ipvsadm prints nothing without a daemon.
pub fn daemon(s: Option<&SyncState>) -> String {
    let Some(s) = s else {
        return String::new();
    };
    let role = if s.role == "backup" {
        "backup"
    } else {
        "master"
    };
    let mut out = format!(
        "{role} sync daemon (listen={}, syncid={}, maxlen={}, peers={}, auth={})\n",
        s.listen,
        s.sync_id,
        xvs_dataplane::sync::wire::MAX_DATAGRAM,
        s.peers.join(","),
        if s.authenticated {
            "hmac-sha256"
        } else {
            "none"
        },
    );
    for p in &s.heard {
        let list = |v: &[std::net::IpAddr]| {
            let t: Vec<String> = v.iter().map(ToString::to_string).collect();
            if t.is_empty() {
                "-".to_owned()
            } else {
                t.join(",")
            }
        };
        out.push_str(&format!(
            "  peer {} at {}: heard {:.1}s ago, seq {}, lost {}, snat {}, vips {}\n",
            p.node,
            p.from,
            p.silent_ms as f64 / 1000.0,
            p.seq,
            p.lost,
            list(&p.snat),
            list(&p.vips),
        ));
    }
    if !s.taken.is_empty() {
        let t: Vec<String> = s.taken.iter().map(ToString::to_string).collect();
        out.push_str(&format!("  taken over: {}\n", t.join(",")));
    }
    let c = &s.counters;
    let dropped: u64 = c.dropped.iter().map(|(_, n)| n).sum();
    out.push_str(&format!(
        "  sent {} datagrams ({} records), received {} ({} records), dropped {dropped}, lost {}, lagging {}, overflow {}\n",
        c.sent_datagrams, c.sent_records, c.received_datagrams, c.received_records, c.lost, c.lagging, c.overflow
    ));
    out
}

/// Runs `xvsadm --takeover [NODE]`; the exit status.
pub fn takeover(
    args: &[String],
    to: &Endpoint,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let node = match args {
        [] => None,
        [n] => match n.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => {
                let _ = writeln!(err, "--takeover: \"{n}\" is not a node id");
                return 2;
            }
        },
        _ => {
            let _ = writeln!(err, "--takeover takes at most one node id");
            return 2;
        }
    };
    let body = serde_json::json!({ "node": node }).to_string();
    let answer = match request(to, Method::POST, "/v1/sync/takeover", Some(body)) {
        Ok(a) => a,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return 2;
        }
    };
    let body = match answer.ok() {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return 255;
        }
    };
    if json {
        let _ = out.write_all(body.as_bytes());
        return 0;
    }
    match serde_json::from_str::<TakeoverDone>(&body) {
        Ok(d) => {
            let t: Vec<String> = d.taken.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "took over {} address(es) in {:.1} ms: {}",
                t.len(),
                d.took_ms,
                if t.is_empty() {
                    "-".into()
                } else {
                    t.join(" ")
                }
            );
            0
        }
        Err(e) => {
            let _ = writeln!(err, "unreadable answer: {e}");
            2
        }
    }
}
