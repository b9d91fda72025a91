//! `xvs run` as the tests start it: the real daemon in the gateway
//! namespace, on a config file written to a folder of its own (with its
//! own admin socket), and `xvsadm` against that socket.
//!
//! Invariant: the daemon is stopped (SIGTERM, by its own PID) and its
//! folder removed when the guard drops, also when a test panics.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::procs::Spawned;
use crate::topology::Topology;

/// A folder of a test's own, removed when dropped (also on a panic).
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates [`dir_of`]`(t, kind)`.
    pub fn new(t: &Topology, kind: &str) -> std::io::Result<ScratchDir> {
        let d = dir_of(t, kind);
        std::fs::create_dir_all(&d)?;
        Ok(ScratchDir(d))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        unmount_under(&self.0);
        remove_folder(&self.0);
    }
}

/// Removes `dir` and everything in it. A stopped daemon's guard may
/// still create its lock file in a state directory there (at the end of
/// its hold window), between the removal's listing of that directory and
/// its `rmdir`, which then fails: the removal is tried again, a little
/// later, a few times (each try sees the guard's file; once the folder is
/// gone, the guard's next open fails and it creates nothing more).
pub fn remove_folder(dir: &Path) {
    for _ in 0..20 {
        let _ = std::fs::remove_dir_all(dir);
        if !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the guard of the instance with process id `pid` (`xvs guard
/// --pid PID ...`, see `xvs_control::restart`) still runs.
pub fn guard_runs(pid: u32) -> bool {
    let pid = pid.to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        let args = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = args.split(|&b| b == 0).collect();
        args.windows(3)
            .any(|w| w[0] == b"guard" && w[1] == b"--pid" && w[2] == pid.as_bytes())
    })
}

/// Detaches every mount under `dir` (the flow state tmpfs `xvs run`
/// mounts in a test's state directory), so the folder can go.
pub fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.to_string_lossy().into_owned();
    for line in info.lines() {
        let Some(point) = line.split(' ').nth(4) else {
            continue;
        };
        if point.starts_with(&prefix) {
            if let Ok(c) = std::ffi::CString::new(point) {
                // SAFETY: a valid NUL-terminated path for the call.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// The hold window of the tests' daemons unless a test sets its own.
pub const TEST_HOLD: &str = "300ms";

/// Waits (at most 5 s) until no XDP program is attached to `ifname` in
/// `ns`: how long after a stop the guard takes to release it at the end of
/// the hold window. Whether it got there.
pub fn detached(ns: &crate::netns::Netns, ifname: &str) -> bool {
    for _ in 0..250 {
        let link = ns
            .ip(&["-d", "link", "show", ifname])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if !link.contains("prog/xdp") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A running `xvs run`.
#[derive(Debug)]
pub struct Daemon {
    xvs: Option<Spawned>,
    bins: PathBuf,
    /// Its folder.
    pub dir: PathBuf,
    /// The admin socket.
    pub socket: PathBuf,
    /// The config file.
    pub cfg: PathBuf,
    /// Whether its state directory is in its folder ([`complete`] put it
    /// there, with the tests' short hold window).
    state_inside: bool,
    /// Its process id once stopped by a SIGTERM (by [`Daemon::stop`] or
    /// when dropped), for the wait for its guard.
    stopped: Option<u32>,
}

/// The folder of the earlier release's `xvs` that an upgrade test starts
/// from (`XVS_UPGRADE_FROM`, as `make layout-upgrade-test` builds it), or
/// `None`, said on stderr, when it is not set (the test then skips).
pub fn upgrade_from() -> Option<PathBuf> {
    let from = std::env::var_os("XVS_UPGRADE_FROM").map(PathBuf::from);
    if from.is_none() {
        eprintln!("skipping: no earlier release (XVS_UPGRADE_FROM unset)");
    }
    from
}

/// Where a test finds `xvs`, `xvsadm` and `xvs-pktgen`: beside its own
/// binaries (`testnet` is the path of one of them), or in `XVS_BIN_DIR`
/// (an absolute path: e.g. the release build, to measure it, or another
/// build, to run today's tests against it).
///
/// Beside the tests, the daemon must be at least as new as every source
/// file it is built from, or this panics saying which is newer:
/// `cargo test -p xvs-vm-tests` builds the tests' own binaries, not the
/// daemon's, and a test run against an older daemon passes or fails for
/// that build's reasons (`cargo build --workspace --bins` first, as
/// `make test` does).
pub fn bins(testnet: &str) -> PathBuf {
    match std::env::var_os("XVS_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let dir = Path::new(testnet)
                .parent()
                .map(Path::to_owned)
                .unwrap_or_default();
            static FRESH: std::sync::Once = std::sync::Once::new();
            FRESH.call_once(|| {
                let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
                if let Err(e) = fresh(&dir.join("xvs"), &root, &DAEMON_SOURCES) {
                    panic!("{e}: run `cargo build --workspace --bins` first");
                }
            });
            dir
        }
    }
}

/// The source folders of the crates `xvs` is built from, under the
/// workspace root.
const DAEMON_SOURCES: [&str; 4] = [
    "control/src",
    "dataplane/src",
    "conntrack/src",
    "config/src",
];

/// Whether the binary `bin` is at least as new as every file under
/// `root`'s `sources`; else which file is newer.
fn fresh(bin: &Path, root: &Path, sources: &[&str]) -> Result<(), String> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = modified(bin) else {
        return Err(format!("no daemon at {}", bin.display()));
    };
    let mut dirs: Vec<PathBuf> = sources.iter().map(|s| root.join(s)).collect();
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
            } else if modified(&p).is_some_and(|m| m > built) {
                return Err(format!("{} is older than {}", bin.display(), p.display()));
            }
        }
    }
    Ok(())
}

/// The folder a test's daemon uses (`kind` tells tests apart).
pub fn dir_of(t: &Topology, kind: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xvs-{kind}-{}", t.tag))
}

/// `config` with what [`Daemon::start`] adds: the admin socket when it
/// has no `[admin]` table, and, when it has no `[restart]` table, a state
/// directory in the daemon's folder (interface names repeat across the
/// tests' namespaces) and a short hold window ([`TEST_HOLD`]), so that the
/// guard has released everything soon after a stop.
fn complete(config: &str, socket: &Path, dir: &Path) -> String {
    complete_with(config, socket, dir).0
}

/// [`complete`], and whether it put the state directory in `dir`.
fn complete_with(config: &str, socket: &Path, dir: &Path) -> (String, bool) {
    let mut text = if config.contains("[admin]") {
        config.to_owned()
    } else {
        format!("{config}\n[admin]\nsocket = \"{}\"\n", socket.display())
    };
    let state_inside = !text.contains("[restart]");
    if state_inside {
        text.push_str(&format!(
            "\n[restart]\nhold = \"{TEST_HOLD}\"\nstate_dir = \"{}\"\n",
            dir.join("state").display()
        ));
    }
    (text, state_inside)
}

impl Daemon {
    /// Rewrites its config file with `config`, completed as at start (for
    /// a reload).
    pub fn rewrite(&self, config: &str) {
        let text = complete(config, &self.socket, &self.dir);
        std::fs::write(&self.cfg, text).unwrap_or_else(|e| panic!("{}: {e}", self.cfg.display()));
    }

    /// Writes `config` (without an `[admin]` socket: one is added, unless
    /// `config` has an `[admin]` table, which must then name
    /// [`dir_of`]`/xvs.sock`; without a `[restart]` table, one with a
    /// state directory in that folder) and starts `bins/xvs run` on it in the
    /// gateway namespace with `env`; waits for its ready line, which is
    /// returned.
    pub fn start(
        t: &Topology,
        kind: &str,
        bins: &Path,
        config: &str,
        env: &[(&str, &Path)],
    ) -> Result<(Daemon, String), String> {
        Daemon::start_in(&t.gateway, &dir_of(t, kind), bins, config, env)
    }

    /// As [`Daemon::start`], in namespace `ns` (another gateway of the
    /// topology) with its folder at `dir`.
    pub fn start_in(
        ns: &crate::netns::Netns,
        dir: &Path,
        bins: &Path,
        config: &str,
        env: &[(&str, &Path)],
    ) -> Result<(Daemon, String), String> {
        let dir = dir.to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let socket = dir.join("xvs.sock");
        let cfg = dir.join("xvs.toml");
        let (text, state_inside) = complete_with(config, &socket, &dir);
        std::fs::write(&cfg, text).map_err(|e| e.to_string())?;
        let mut cmd = ns.command(&bins.join("xvs").display().to_string());
        cmd.args(["run", "--config"]).arg(&cfg);
        for (k, v) in env {
            cmd.env(k, v);
        }
        // The guard exists before the process, so its folder goes on error.
        let mut d = Daemon {
            xvs: None,
            bins: bins.to_owned(),
            dir,
            socket,
            cfg,
            state_inside,
            stopped: None,
        };
        let (xvs, ready) =
            Spawned::start(cmd, "xvs", Duration::from_secs(20)).map_err(|e| e.to_string())?;
        d.xvs = Some(xvs);
        Ok((d, ready))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.xvs.as_ref().map_or(0, Spawned::pid)
    }

    /// GETs `path` of its admin API over the unix socket (curl); the body.
    pub fn get(&self, path: &str) -> String {
        let out = Command::new("curl")
            .args(["-s", "--unix-socket"])
            .arg(&self.socket)
            .arg(format!("http://xvs{path}"))
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The samples of its `/metrics` that are not zero (see
    /// [`nonzero_samples`]): what a failing test shows of its counters.
    pub fn nonzero_metrics(&self, prefixes: &[&str]) -> String {
        nonzero_samples(&self.get("/metrics"), prefixes)
    }

    /// The addresses the steering program hands to xvs, read back from
    /// its map (`/v1/status`'s `steered`), sorted.
    pub fn steered(&self) -> Vec<String> {
        let status: serde_json::Value =
            serde_json::from_str(&self.get("/v1/status")).unwrap_or_default();
        status["steered"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["address"].as_str().map(str::to_owned))
            .collect()
    }

    /// Runs xvsadm against it; returns (status, stdout, stderr).
    pub fn adm(&self, args: &[&str]) -> (i32, String, String) {
        self.adm_input(args, "")
    }

    /// `xvs status --socket SOCKET ARGS` against it: what it printed, or
    /// a panic with its error.
    pub fn status(&self, args: &[&str]) -> String {
        let out = Command::new(self.bins.join("xvs"))
            .arg("status")
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("xvs status: {e}"));
        assert!(
            out.status.success(),
            "xvs status {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// [`Daemon::adm`] with `input` on its standard input (`-R`).
    pub fn adm_input(&self, args: &[&str], input: &str) -> (i32, String, String) {
        use std::io::Write;
        let child = Command::new(self.bins.join("xvsadm"))
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let out = child.and_then(|mut c| {
            if let Some(mut stdin) = c.stdin.take() {
                stdin.write_all(input.as_bytes())?;
            }
            c.wait_with_output()
        });
        match out {
            Ok(o) => (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ),
            Err(e) => (-1, String::new(), e.to_string()),
        }
    }

    /// Runs xvsadm; panics with its error unless it exits 0.
    pub fn adm_ok(&self, args: &[&str]) -> String {
        let (status, out, err) = self.adm(args);
        assert_eq!(status, 0, "xvsadm {args:?}: {err}");
        out
    }

    /// Stops it (SIGTERM); returns its exit status and what it printed
    /// after the ready line (the workers' counter lines).
    pub fn stop(mut self) -> (Option<ExitStatus>, String) {
        match self.xvs.take() {
            Some(x) => {
                self.stopped = Some(x.pid());
                x.stop(libc::SIGTERM, Duration::from_secs(10))
            }
            None => (None, String::new()),
        }
    }

    /// Stops it (SIGTERM); returns worker 0's counter line (what a test
    /// reads with [`field`] and [`drops`]), or panics with what it
    /// printed.
    pub fn stop_counters(self) -> String {
        let (_, printed) = self.stop();
        match printed.lines().find(|l| l.starts_with("worker 0:")) {
            Some(line) => line.to_owned(),
            None => panic!("xvs printed no counter line:\n{printed}"),
        }
    }

    /// Stops it (SIGTERM) and checks what it printed: a clean exit, and
    /// worker 0's frames all accounted for (`rx = forwarded + answered +
    /// consumed + dropped`, `frames_accounted=true`); returns that line.
    pub fn stop_accounted(self) -> String {
        let (status, printed) = self.stop();
        assert!(
            status.is_some_and(|s| s.success()),
            "xvs exit {status:?}: {printed}"
        );
        let Some(line) = printed.lines().find(|l| l.starts_with("worker 0:")) else {
            panic!("xvs printed no counter line:\n{printed}")
        };
        let get = |k| field(line, k).unwrap_or_else(|| panic!("{k} not in {line}"));
        let sum = get("forwarded") + get("answered") + get("consumed") + get("dropped");
        assert_eq!(get("rx"), sum, "{line}");
        assert!(line.contains("frames_accounted=true"), "{line}");
        line.to_owned()
    }

    /// Kills it with `signal` (e.g. SIGKILL) and waits for it.
    pub fn kill(mut self, signal: i32) -> (Option<ExitStatus>, String) {
        match self.xvs.take() {
            Some(x) => x.stop(signal, Duration::from_secs(10)),
            None => (None, String::new()),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(x) = self.xvs.take() {
            self.stopped = Some(x.pid());
            x.stop(libc::SIGTERM, Duration::from_secs(10));
        }
        // With its state in this folder (the tests' short hold window),
        // its guard releases at the end of the window and exits: the
        // folder goes after it, so that nothing creates files in it while
        // it is removed. A test with a window of its own keeps its state
        // elsewhere and is not waited for.
        if let (Some(pid), true) = (self.stopped, self.state_inside) {
            // At most 3 s.
            for _ in 0..150 {
                if !guard_runs(pid) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        unmount_under(&self.dir);
        remove_folder(&self.dir);
    }
}

/// The samples of Prometheus text `text` that are not zero, of the
/// families whose names start with one of `prefixes` (all, if none), one
/// line each.
pub fn nonzero_samples(text: &str, prefixes: &[&str]) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| prefixes.is_empty() || prefixes.iter().any(|p| l.starts_with(p)))
        .filter(|l| {
            l.rsplit_once(' ')
                .and_then(|(_, v)| v.parse::<f64>().ok())
                .is_some_and(|v| v != 0.0)
        })
        .collect();
    lines.join("\n")
}

/// The sum of the samples of family `name` in Prometheus text `text`
/// (every label set; 0 if it has none).
pub fn sample_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// `key=value` of a summary line (the daemon's worker lines, the load
/// clients' summaries).
pub fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.trim_end_matches(',').parse().ok())
}

/// [`field`], which must be there.
pub fn field_of(line: &str, key: &str) -> u64 {
    field(line, key).unwrap_or_else(|| panic!("{key} not in {line}"))
}

/// How many frames a worker line's `drops=[...]` says were dropped for
/// `reason` (0 when the reason is not listed).
pub fn drops(line: &str, reason: &str) -> u64 {
    line.split("drops=[")
        .nth(1)
        .and_then(|l| l.split(']').next())
        .into_iter()
        .flat_map(|l| l.split(','))
        .find_map(|kv| kv.strip_prefix(&format!("{reason}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_older_than_a_source_file_is_named_stale() {
        let root = std::env::temp_dir().join(format!("xvs-fresh-{}", std::process::id()));
        let src = root.join("crate/src/deep");
        std::fs::create_dir_all(&src).unwrap();
        let file = src.join("lib.rs");
        std::fs::write(&file, "// source").unwrap();
        let bin = root.join("xvs");
        assert!(
            fresh(&bin, &root, &["crate/src"])
                .unwrap_err()
                .contains("no daemon"),
            "no binary yet"
        );
        std::fs::write(&bin, "binary").unwrap();
        let now = std::fs::metadata(&bin).unwrap().modified().unwrap();
        let set = |p: &Path, t| {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(t).unwrap();
        };
        set(&file, now - Duration::from_secs(60));
        set(&bin, now);
        assert_eq!(fresh(&bin, &root, &["crate/src"]), Ok(()));
        set(&file, now + Duration::from_secs(60));
        let e = fresh(&bin, &root, &["crate/src"]).unwrap_err();
        assert!(e.contains("deep/lib.rs"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn fields_and_drops_of_a_worker_line() {
        let line = "worker 0: rx=10 forwarded=7 dropped=3 drops=[tcp_no_flow=2,reply_no_flow=1]";
        assert_eq!(field(line, "rx"), Some(10));
        assert_eq!(field(line, "nodest"), None);
        assert_eq!(drops(line, "reply_no_flow"), 1);
        assert_eq!(drops(line, "tcp_no_flow"), 2);
        assert_eq!(drops(line, "no_flow"), 0);
        assert_eq!(drops("worker 0: drops=[]", "x"), 0);
    }

    #[test]
    fn a_family_sums_over_its_label_sets_and_no_other_family() {
        let text = "# TYPE xvs_rx_frames_total counter\n\
                    xvs_rx_frames_total{worker=\"0\"} 5\n\
                    xvs_rx_frames_total{worker=\"1\"} 7\n\
                    xvs_rx_frames_total_extra{worker=\"0\"} 100\n\
                    xvs_flows 3\n";
        assert_eq!(sample_sum(text, "xvs_rx_frames_total"), 12.0);
        assert_eq!(sample_sum(text, "xvs_flows"), 3.0);
        assert_eq!(sample_sum(text, "xvs_absent"), 0.0);
    }

    #[test]
    fn only_the_samples_that_moved_of_the_families_asked() {
        let text = "# HELP xvs_drops_total Frames dropped.\n\
                    xvs_drops_total{worker=\"0\",reason=\"no_service\"} 0\n\
                    xvs_drops_total{worker=\"0\",reason=\"tcp_no_flow\"} 10\n\
                    xvs_rejected_total{worker=\"0\"} 0.0\n\
                    xvs_flows{worker=\"0\"} 3\n";
        assert_eq!(
            nonzero_samples(text, &["xvs_drops_total", "xvs_rejected_total"]),
            "xvs_drops_total{worker=\"0\",reason=\"tcp_no_flow\"} 10"
        );
        assert_eq!(
            nonzero_samples(text, &[]),
            "xvs_drops_total{worker=\"0\",reason=\"tcp_no_flow\"} 10\nxvs_flows{worker=\"0\"} 3"
        );
    }
}
