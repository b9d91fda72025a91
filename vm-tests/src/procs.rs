//! Processes a test starts inside namespaces: killed and reaped when the
//! guard drops, also when the test panics. Only processes started here are
//! ever signalled, by their own PID.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long `xvs-testnet streams` may take to say it is ready: it says so
/// once every stream is up or has failed, and a stream fails after at
/// most 5 s to connect and 30 s for the banner (its default
/// `--timeout-ms`). Waiting less would end a test on one slow stream
/// without the stream's own error (a slow one is named on stderr).
pub const STREAMS_READY: Duration = Duration::from_secs(40);

/// A running process, killed on drop.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    what: String,
    output: Arc<Mutex<String>>,
}

impl Spawned {
    /// Starts `cmd`, then waits (at most `ready_within`) for its first line
    /// on stdout, which tells that it is ready; returns that line too.
    pub fn start(
        cmd: Command,
        what: &str,
        ready_within: Duration,
    ) -> std::io::Result<(Spawned, String)> {
        let (guard, first) = Self::spawn(cmd, what, false)?;
        match first.recv_timeout(ready_within) {
            Ok(line) if !line.is_empty() => Ok((guard, line.trim().to_owned())),
            _ => Err(std::io::Error::other(format!(
                "{what} did not become ready"
            ))),
        }
    }

    /// Starts `cmd` (a program that prints nothing when ready, such as a
    /// server), then polls `ready` every 20 ms, at most `ready_within`.
    pub fn start_until(
        cmd: Command,
        what: &str,
        ready_within: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> std::io::Result<Spawned> {
        // No ready line: its first line is output like the rest.
        let (mut guard, _) = Self::spawn(cmd, what, true)?;
        let step = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        while !ready() {
            if waited >= ready_within || !matches!(guard.child.try_wait(), Ok(None)) {
                return Err(std::io::Error::other(format!(
                    "{what} did not become ready"
                )));
            }
            std::thread::sleep(step);
            waited += step;
        }
        Ok(guard)
    }

    /// Spawns `cmd` with its stdout read (and kept) by a thread; the
    /// receiver gets its first line (kept too with `keep_first`).
    fn spawn(
        mut cmd: Command,
        what: &str,
        keep_first: bool,
    ) -> std::io::Result<(Spawned, std::sync::mpsc::Receiver<String>)> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let output = Arc::new(Mutex::new(String::new()));
        let guard = Spawned {
            child,
            what: what.to_owned(),
            output: output.clone(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let mut reader = BufReader::new(stdout);
            let _ = reader.read_line(&mut line);
            if keep_first {
                output
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&line);
            }
            let _ = tx.send(line);
            // Keep reading (and keeping) what it prints, so it never
            // blocks on a full pipe.
            let mut rest = String::new();
            while reader.read_line(&mut rest).is_ok_and(|n| n > 0) {
                output
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&rest);
                rest.clear();
            }
        });
        Ok((guard, rx))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit by itself (at most `within`, then
    /// kills it); its exit status and what it printed after the ready
    /// line.
    pub fn wait(self, within: Duration) -> (Option<ExitStatus>, String) {
        self.stop(0, within)
    }

    /// Sends `signal` to the process (ours, by its PID; 0 sends none),
    /// waits for it to exit (at most `within`, then kills it), and returns its exit status
    /// and what it printed after the ready line.
    pub fn stop(mut self, signal: i32, within: Duration) -> (Option<ExitStatus>, String) {
        if signal != 0 {
            // SAFETY: signals only the child this guard started.
            unsafe { libc::kill(self.child.id() as i32, signal) };
        }
        let step = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if waited < within => {
                    std::thread::sleep(step);
                    waited += step;
                }
                _ => break None,
            }
        };
        // Let the reader thread take the last lines.
        std::thread::sleep(Duration::from_millis(100));
        let out = self
            .output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (status, out)
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
