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
    /// Bytes read (answers, headers included), as wrk rounds them.
    pub bytes: f64,
    /// All of it.
    pub text: String,
}

/// wrk's byte figure (`48.84MB`, `1.02GB`, `512.00KB`, `100B`) in bytes.
fn bytes_of(text: &str) -> Option<f64> {
    let t = text.trim();
    let (n, scale) = [
        ("GB", 1u64 << 30),
        ("MB", 1 << 20),
        ("KB", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(unit, scale)| t.strip_suffix(unit).map(|n| (n, *scale)))?;
    Some(n.parse::<f64>().ok()? * scale as f64)
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
                w.bytes = line
                    .rsplit(", ")
                    .next()
                    .and_then(|r| r.strip_suffix(" read"))
                    .and_then(bytes_of)
                    .unwrap_or(0.0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_wrk_s_summary() {
        let w = Wrk::parse(
            "Running 5s test @ http://198.19.0.1/\n  1 threads and 16 connections\n  \
             12000 requests in 5.00s, 117.19MB read\n  Socket errors: connect 0, read 2, write 0, timeout 1\n  \
             Non-2xx or 3xx responses: 3\nRequests/sec:   2400.00\n",
        );
        assert_eq!((w.requests, w.errors, w.non_2xx), (12000, 3, 3));
        assert!((w.bytes - 117.19 * 1048576.0).abs() < 1.0);
        assert_eq!(bytes_of("512.00KB"), Some(512.0 * 1024.0));
        assert_eq!(bytes_of("100B"), Some(100.0));
        assert_eq!(bytes_of("lots"), None);
    }
}
