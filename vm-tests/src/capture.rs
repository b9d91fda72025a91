//! A packet capture on the client's interface of a topology, for tests
//! that must show that no client saw a TCP reset (a restart, a
//! failover). `tcpdump` writes to a file in the test's folder; stopping
//! the capture reads the resets back.
//!
//! Invariant: the `tcpdump` process is the test's own and is stopped (by
//! its PID) when the capture is read or dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::procs::Spawned;
use crate::topology::Topology;

/// A running capture of the client's TCP traffic.
pub struct Capture {
    tcpdump: Option<Spawned>,
    file: PathBuf,
}

impl Capture {
    /// Starts capturing TCP on `t`'s client interface into `dir`.
    pub fn start(t: &Topology, dir: &Path) -> Capture {
        let file = dir.join("client.pcap");
        let mut cmd = t.client.ns.command("tcpdump");
        cmd.args(["-i", &t.client.ifname, "-nn", "-U", "-w"])
            .arg(&file)
            .args(["tcp"]);
        let pcap = file.clone();
        let tcpdump = Spawned::start_until(cmd, "tcpdump", Duration::from_secs(10), || {
            pcap.metadata().is_ok_and(|m| m.len() > 0)
        })
        .unwrap_or_else(|e| panic!("tcpdump: {e}"));
        Capture {
            tcpdump: Some(tcpdump),
            file,
        }
    }

    /// Stops the capture; the resets it saw, one line each, each followed
    /// by the last segments of its connection (indented), which tell a
    /// reset of a connection the client had closed from one it needed.
    pub fn resets(mut self) -> Vec<String> {
        if let Some(t) = self.tcpdump.take() {
            t.stop(libc::SIGINT, Duration::from_secs(5));
        }
        let read = |filter: &str| {
            Command::new("tcpdump")
                .args(["-nn", "-tttt", "-r"])
                .arg(&self.file)
                .arg(filter)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| format!("tcpdump -r: {e}"))
        };
        let mut seen = Vec::new();
        for line in read("tcp[tcpflags] & tcp-rst != 0").lines() {
            seen.push(line.to_owned());
            let Some((a, b)) = endpoints(line) else {
                continue;
            };
            let history = read(&format!(
                "tcp and host {} and port {} and host {} and port {}",
                a.0, a.1, b.0, b.1
            ));
            let lines: Vec<&str> = history.lines().collect();
            let tail = &lines[lines.len().saturating_sub(HISTORY)..];
            seen.extend(tail.iter().map(|l| format!("    {l}")));
        }
        seen
    }
}

/// How many segments of a reset connection [`Capture::resets`] shows.
const HISTORY: usize = 24;

/// The two endpoints (address, port) of a `tcpdump -nn` line
/// (`... IP 198.19.0.1.80 > 198.18.0.2.45986: Flags [R] ...`).
fn endpoints(line: &str) -> Option<((String, String), (String, String))> {
    let split = |s: &str| {
        let (addr, port) = s.trim_end_matches(':').rsplit_once('.')?;
        Some((addr.to_owned(), port.to_owned()))
    };
    let mut words = line
        .split_whitespace()
        .skip_while(|w| *w != "IP" && *w != "IP6");
    words.next()?;
    let src = split(words.next()?)?;
    words.next().filter(|w| *w == ">")?;
    let dst = split(words.next()?)?;
    Some((src, dst))
}

#[cfg(test)]
mod tests {
    use super::endpoints;

    #[test]
    fn a_reset_line_names_its_connection() {
        let line = "2026-12-03 20:01:02.123456 IP 198.19.0.1.80 > 198.18.0.2.45986: Flags [R], seq 1, win 0, length 0";
        let ((a, p), (b, q)) = endpoints(line).unwrap();
        assert_eq!((a.as_str(), p.as_str()), ("198.19.0.1", "80"));
        assert_eq!((b.as_str(), q.as_str()), ("198.18.0.2", "45986"));
        let v6 = "2026-12-03 20:01:02.1 IP6 2001:2::1.443 > 2001:2::2.5000: Flags [R.], seq 1";
        assert_eq!(endpoints(v6).unwrap().1 .1, "5000");
        assert!(endpoints("reading from file x.pcap").is_none());
    }
}
