//! wrk, the HTTP load generator, as the tests drive it: a bounded run
//! from a namespace, and what it printed read back (requests, socket
//! errors, non-2xx answers).

use std::thread::JoinHandle;

use crate::netns::Netns;

/// What wrk printed.
#[derive(Debug, Default)]
pub struct Wrk {
    /// Requests completed.
    pub requests: u64,
    /// Socket errors (connect, read, write, timeout) together.
    pub errors: u64,
    /// Answers other than 2xx or 3xx.
    pub non_2xx: u64,
    /// All of it.
    pub text: String,
}

impl Wrk {
    /// Reads wrk's summary.
    pub fn parse(text: &str) -> Wrk {
        let mut w = Wrk {
            text: text.to_owned(),
            ..Wrk::default()
        };
        for line in text.lines().map(str::trim) {
            if let Some(n) = line
                .split(" requests in ")
                .next()
                .filter(|_| line.contains(" requests in "))
            {
                w.requests = n.trim().parse().unwrap_or(0);
            }
            if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
                w.non_2xx = n.trim().parse().unwrap_or(0);
            }
            if let Some(rest) = line.strip_prefix("Socket errors:") {
                w.errors = rest
                    .split(',')
                    .filter_map(|kv| kv.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum();
            }
        }
        w
    }

    /// wrk from `ns` against `url` for `seconds` (16 connections; with
    /// `close`, every request on a new connection, as `Connection: close`
    /// loads do), in a thread: its summary when joined.
    pub fn start(ns: &Netns, url: &str, seconds: u32, close: bool) -> JoinHandle<Wrk> {
        let mut cmd = ns.command("wrk");
        cmd.args(["-t1", "-c16", &format!("-d{seconds}s"), "--timeout", "2s"]);
        if close {
            cmd.args(["-H", "Connection: close"]);
        }
        cmd.arg(url);
        std::thread::spawn(move || match cmd.output() {
            Ok(out) => Wrk::parse(&String::from_utf8_lossy(&out.stdout)),
            Err(e) => Wrk {
                text: format!("wrk did not run: {e}"),
                ..Wrk::default()
            },
        })
    }
}
