//! What outlives an `xvs run` process: the per-interface lock, the guard
//! that ends the hold window when no successor comes, and releasing what a
//! stopped instance left (the steering program and the flow state files).
//!
//! Invariants: one `xvs run` at a time per interface and state directory
//! (an exclusive `flock` on `<state_dir>/<ifname>.lock`, held for the
//! process's life and dropped by the kernel when it dies, however it
//! dies). The guard is a separate process started before the data plane
//! opens anything, so it holds no socket or program of it; it waits for
//! the instance to exit, then for the hold window, and releases only when
//! it can take every lock itself and finds its own instance's pid stamped
//! in it, that is when no successor runs or ran (a successor that ended
//! inside the window leaves the release to its own guard). A
//! successor that starts while a guard releases waits for the lock rather
//! than failing.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a start waits for a lock a releasing guard holds: tries, a
/// pause apart (3 s).
const LOCK_TRIES: u32 = 150;
const LOCK_PAUSE: Duration = Duration::from_millis(20);

/// The locks of one instance's interfaces.
#[derive(Debug)]
pub struct InstanceLock {
    _files: Vec<File>,
}

/// Path of `ifname`'s lock in `state_dir`.
pub fn lock_path(state_dir: &Path, ifname: &str) -> PathBuf {
    state_dir.join(format!("{ifname}.lock"))
}

fn try_lock(path: &Path) -> std::io::Result<Option<File>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let ret = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if ret == 0 {
        return Ok(Some(file));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// Writes who holds a lock file (`ROLE pid N`), for the message of a
/// start that finds it taken.
fn stamp(mut file: &File, role: &str) {
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = writeln!(file, "{role} pid {}", std::process::id());
}

/// The pid a lock file's stamp names ([`stamp`], read by [`holder`]),
/// if it has one.
fn stamped_pid(path: &Path) -> Option<u32> {
    let text = holder(path);
    let mut words = text.split_whitespace().skip_while(|w| *w != "pid");
    words.nth(1)?.parse().ok()
}

fn holder(path: &Path) -> String {
    let mut text = String::new();
    let _ = File::open(path).and_then(|mut f| f.read_to_string(&mut text));
    text.trim().to_owned()
}

impl InstanceLock {
    /// Takes the lock of every interface in `ifnames` (waiting a little
    /// for a guard that is releasing), writing `role` and this pid into
    /// each; an error says who holds it.
    pub fn acquire(state_dir: &Path, ifnames: &[&str], role: &str) -> Result<InstanceLock, String> {
        std::fs::create_dir_all(state_dir)
            .map_err(|e| format!("cannot create {}: {e}", state_dir.display()))?;
        let mut names: Vec<&str> = ifnames.to_vec();
        names.sort_unstable();
        names.dedup();
        let mut files = Vec::new();
        for name in names {
            let path = lock_path(state_dir, name);
            let mut tries = 0;
            let file = loop {
                match try_lock(&path) {
                    Ok(Some(f)) => break f,
                    Ok(None) => {
                        let who = holder(&path);
                        tries += 1;
                        if !who.starts_with("guard") || tries > LOCK_TRIES {
                            return Err(format!(
                                "another xvs already runs on interface {name} ({who}; lock {}): \
                                 stop it first (`systemctl stop xvs`, or kill that pid), or give \
                                 this instance other interfaces or another restart.state_dir",
                                path.display()
                            ));
                        }
                        std::thread::sleep(LOCK_PAUSE);
                    }
                    Err(e) => return Err(format!("cannot lock {}: {e}", path.display())),
                }
            };
            stamp(&file, role);
            files.push(file);
        }
        Ok(InstanceLock { _files: files })
    }
}

/// Everything an instance leaves for its successor.
#[derive(Debug, Clone)]
pub struct Leftovers {
    /// State directory.
    pub state_dir: PathBuf,
    /// Interfaces with a steering program (client first).
    pub interfaces: Vec<String>,
}

impl Leftovers {
    /// From a configuration.
    pub fn of(cfg: &xvs_config::Config) -> Leftovers {
        let i = &cfg.interfaces;
        let mut interfaces = vec![i.client.clone()];
        if let (xvs_config::ArmMode::TwoArm, Some(b)) = (i.mode, &i.backend) {
            interfaces.push(b.clone());
        }
        Leftovers {
            state_dir: cfg.restart.state_dir.clone(),
            interfaces,
        }
    }

    /// Detaches xvs's programs and removes the flow state files; a line
    /// per thing removed. Refuses while an instance runs.
    pub fn release(&self) -> Result<Vec<String>, String> {
        let names: Vec<&str> = self.interfaces.iter().map(String::as_str).collect();
        let _lock = InstanceLock::acquire(&self.state_dir, &names, "release")?;
        Ok(self.release_locked(None))
    }

    /// Detaches the programs and removes the state. `own`: the ids of the
    /// programs the guard's instance attached, one per interface; only
    /// those are detached, and only while still attached (a successor may
    /// have replaced them). `None`: any xvs program (the operator's
    /// `xvs release`).
    fn release_locked(&self, own: Option<&[Option<u32>]>) -> Vec<String> {
        let mut done = Vec::new();
        for (k, ifname) in self.interfaces.iter().enumerate() {
            let id = match own {
                None => None,
                Some(ids) => match ids.get(k).copied().flatten() {
                    Some(id) => Some(id),
                    None => continue,
                },
            };
            match xvs_dataplane::steer::release(ifname, id) {
                Ok(Some(id)) => done.push(format!("detached program {id} from {ifname}")),
                // Gone with its program (a deleted namespace or link).
                Ok(None) | Err(xvs_dataplane::steer::SteerError::NoInterface(_)) => {}
                Err(e) => done.push(format!("{ifname}: {e}")),
            }
        }
        if let Some(client) = self.interfaces.first() {
            for path in xvs_dataplane::state::remove_files(&self.state_dir, client) {
                done.push(format!("removed {}", path.display()));
            }
        }
        if xvs_dataplane::state::unmount_dir(&self.state_dir) {
            done.push(format!(
                "removed {}",
                xvs_dataplane::state::flows_dir(&self.state_dir).display()
            ));
        }
        done
    }
}

/// `xvs prepare-state`: the state folder, with its huge-page tmpfs
/// mounted in this mount namespace (the unit runs it with `+`, in the
/// host's, so the mount outlives the service's namespace).
pub fn prepare_state(cfg: &xvs_config::Config) -> Result<String, String> {
    let dir = &cfg.restart.state_dir;
    match xvs_dataplane::state::prepare_dir(dir) {
        Ok((flows, None)) => Ok(format!("{} ready (huge pages)", flows.display())),
        Ok((flows, Some(why))) => Ok(format!("{} ready in plain pages: {why}", flows.display())),
        Err(e) => Err(format!("cannot prepare {}: {e}", dir.display())),
    }
}

/// The running instance's end of its guard's stdin: it tells the guard
/// which programs it attached ([`GuardLink::attached`]).
#[derive(Debug)]
pub struct GuardLink(std::process::ChildStdin);

impl GuardLink {
    /// Tells the guard the ids of the programs this instance attached,
    /// one per interface in [`Leftovers::of`]'s order: the only ones it
    /// will ever detach.
    pub fn attached(&mut self, ids: &[Option<u32>]) {
        let words: Vec<String> = ids
            .iter()
            .map(|i| i.map_or_else(|| "-".to_owned(), |i| i.to_string()))
            .collect();
        let _ = writeln!(self.0, "{}", words.join(" "));
        let _ = self.0.flush();
    }
}

/// Starts the guard of this process: `xvs guard` re-executed from this
/// binary, in its own session (a signal to the instance's process group
/// does not reach it), with no descriptor of ours but its stdin (a pipe
/// from us) and stderr when that is not a pipe a test reads to its end.
pub fn spawn_guard(cfg: &xvs_config::Config) -> std::io::Result<GuardLink> {
    use std::os::unix::process::CommandExt;
    let left = Leftovers::of(cfg);
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg("guard")
        .arg("--pid")
        .arg(std::process::id().to_string())
        .arg("--hold-ms")
        .arg(cfg.restart.hold_ms.to_string())
        .arg("--state-dir")
        .arg(&left.state_dir);
    for i in &left.interfaces {
        cmd.arg("--interface").arg(i);
    }
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    if stderr_is_pipe() {
        cmd.stderr(std::process::Stdio::null());
    }
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    child
        .stdin
        .take()
        .map(GuardLink)
        .ok_or_else(|| std::io::Error::other("the guard has no stdin"))
}

fn stderr_is_pipe() -> bool {
    // SAFETY: fstat writes only into `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; fd 2 may be closed, which fstat reports.
    let ret = unsafe { libc::fstat(2, &mut st) };
    ret == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO
}

/// The guard's work (`xvs guard`): learns from stdin which programs its
/// instance attached (nothing, if the instance ends first), waits for
/// `pid` to exit, then for the hold window, then releases unless a
/// successor holds the lock or held it since (a successor killed inside
/// the window has a guard of its own, whose window is still open: the
/// state it left is for the next start).
pub fn guard(pid: u32, hold: Duration, left: &Leftovers) -> u8 {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let own: Vec<Option<u32>> = line.split_whitespace().map(|w| w.parse().ok()).collect();
    wait_exit(pid);
    std::thread::sleep(hold);
    let names: Vec<&str> = left.interfaces.iter().map(String::as_str).collect();
    let mut locks = Vec::new();
    for name in names {
        let path = lock_path(&left.state_dir, name);
        match try_lock(&path) {
            // A successor started inside the window and has ended since
            // (it stamped the lock with its pid): what is left is its, and
            // its own guard's window, begun when it ended, decides.
            Ok(Some(_)) if stamped_pid(&path).is_some_and(|p| p != pid) => return 0,
            Ok(Some(f)) => {
                stamp(&f, "guard");
                locks.push(f);
            }
            // The state directory is gone: no successor can hold a lock
            // in it, and no state is left in it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // A successor runs (or another guard releases): its business.
            Ok(None) | Err(_) => return 0,
        }
    }
    for line in left.release_locked(Some(&own)) {
        eprintln!("xvs guard: no restart within the hold window: {line}");
    }
    0
}

/// Blocks until process `pid` has exited (a pidfd poll; a pid that is
/// already gone returns at once).
fn wait_exit(pid: u32) {
    // SAFETY: pidfd_open takes a pid and flags; no memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
    if fd < 0 {
        return;
    }
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, -1) };
        if n > 0
            || (n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted)
        {
            break;
        }
    }
    // SAFETY: closes the pidfd opened above, once.
    unsafe { libc::close(fd) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`stamp`] writes, [`stamped_pid`] reads back; a lock file
    /// never stamped (just created) names nobody.
    #[test]
    fn a_lock_s_stamp_names_its_pid() {
        let dir = std::env::temp_dir().join(format!("xvs-stamp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = lock_path(&dir, "g0");
        let f = try_lock(&path).unwrap().unwrap();
        assert_eq!(stamped_pid(&path), None);
        stamp(&f, "run");
        assert_eq!(stamped_pid(&path), Some(std::process::id()));
        assert_eq!(holder(&path), format!("run pid {}", std::process::id()));
        drop(f);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
