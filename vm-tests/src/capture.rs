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

    /// Stops the capture; the resets it saw, one line each.
    pub fn resets(mut self) -> Vec<String> {
        if let Some(t) = self.tcpdump.take() {
            t.stop(libc::SIGINT, Duration::from_secs(5));
        }
        let out = Command::new("tcpdump")
            .args(["-nn", "-r"])
            .arg(&self.file)
            .arg("tcp[tcpflags] & tcp-rst != 0")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("tcpdump -r: {e}"));
        out.lines().map(str::to_owned).collect()
    }
}
