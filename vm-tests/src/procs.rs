//! Processes a test starts inside namespaces: killed and reaped when the
//! guard drops, also when the test panics. Only processes started here are
//! ever signalled, by their own PID.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running process, killed on drop.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    what: String,
}

impl Spawned {
    /// Starts `cmd`, then waits (at most `ready_within`) for its first line
    /// on stdout, which tells that it is ready; returns that line too.
    pub fn start(
        mut cmd: Command,
        what: &str,
        ready_within: Duration,
    ) -> std::io::Result<(Spawned, String)> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let guard = Spawned {
            child,
            what: what.to_owned(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let mut reader = BufReader::new(stdout);
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the process never blocks on a full pipe.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        match rx.recv_timeout(ready_within) {
            Ok(line) if !line.is_empty() => Ok((guard, line.trim().to_owned())),
            _ => Err(std::io::Error::other(format!(
                "{what} did not become ready"
            ))),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = &self.what;
    }
}
