//! The flow state an instance leaves for its successor: one file per
//! worker in `<[restart] state_dir>/flows`, named after the client
//! interface and the worker, holding that worker's flow table (see
//! `xvs_conntrack::FlowTable::open_state`), and what a start made of it.
//!
//! The `flows` folder is a tmpfs of its own mounted with `huge=within_size`
//! (source name `xvs-flows`): a table read at random costs a TLB miss per
//! packet in 4 KiB pages (the pipeline bench: ~35% slower at 1M flows), and
//! `/run`'s tmpfs gives shared memory no huge pages unless the host's
//! `shmem_enabled` says so. It is mounted in the caller's mount namespace
//! (the host's: under systemd by the unit's `ExecStartPre=+xvs
//! prepare-state`, since the service's own namespace ends with the
//! process). A process in a mount namespace of its own (one its parent is
//! not in: a systemd sandbox, `ip netns exec`) never mounts it itself: the
//! mount would end with the process, and the state with it. Without the
//! mount the files live in plain pages, said in the log and `/v1/status`.
//!
//! Invariants: a worker's file is adopted only by the same worker index of
//! an instance with the same worker count, capacity and SNAT addresses and
//! port slice (a flow's SNAT port must stay in the slice of the worker
//! that replies reach); anything else starts that worker empty and says
//! why. With restart survival off (`hold = "0s"`) no file is used and any
//! left over is removed.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use xvs_config::Config;
use xvs_conntrack::{Adopted, FlowTable, Opened, StateIdentity};

/// The source name of the tmpfs xvs mounts for the state files.
pub const MOUNT_SOURCE: &str = "xvs-flows";

/// The folder of the state files in `state_dir`.
pub fn flows_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("flows")
}

/// The mount at exactly `path`, if any: (source, filesystem type).
fn mount_at(path: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy();
    // Fields: id parent major:minor root mount-point options... - type source super.
    info.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split(' ').nth(4)?;
        if point != want {
            return None;
        }
        let mut r = right.split(' ');
        let fstype = r.next()?.to_owned();
        let source = r.next()?.to_owned();
        Some((source, fstype))
    })
}

/// Makes `<state_dir>/flows` and, unless something is mounted there
/// already, mounts a tmpfs with huge pages on it. Returns the folder and,
/// if it stays in plain pages, why.
pub fn prepare_dir(state_dir: &Path) -> std::io::Result<(PathBuf, Option<String>)> {
    let dir = flows_dir(state_dir);
    std::fs::create_dir_all(&dir)?;
    if mount_at(&dir).is_some() {
        return Ok((dir, None));
    }
    let ns = |p: &str| std::fs::read_link(p).ok();
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    if ns("/proc/self/ns/mnt") != ns(&format!("/proc/{parent}/ns/mnt")) {
        return Ok((
            dir,
            Some(
                "this process runs in a private mount namespace (a systemd sandbox, ip netns exec), \
                 where a tmpfs would end with it; run `xvs prepare-state` in the host's namespace \
                 first (the systemd unit does)"
                    .into(),
            ),
        ));
    }
    let c = |s: &str| std::ffi::CString::new(s).map_err(|_| std::io::ErrorKind::InvalidInput);
    let (src, target, fstype, opts) = (
        c(MOUNT_SOURCE)?,
        c(&dir.to_string_lossy())?,
        c("tmpfs")?,
        c("huge=within_size,mode=0700")?,
    );
    // SAFETY: every argument is a valid NUL-terminated string that lives
    // for the call.
    let ret = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            opts.as_ptr().cast(),
        )
    };
    if ret != 0 {
        let e = std::io::Error::last_os_error();
        return Ok((
            dir,
            Some(format!("cannot mount a huge-page tmpfs there: {e}")),
        ));
    }
    Ok((dir, None))
}

/// Unmounts `<state_dir>/flows` if it is xvs's tmpfs and holds no state
/// file any more, and removes the folder; whether it did.
pub fn unmount_dir(state_dir: &Path) -> bool {
    let dir = flows_dir(state_dir);
    let empty = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
    if !empty {
        return false;
    }
    if mount_at(&dir).is_some_and(|(src, _)| src == MOUNT_SOURCE) {
        let Ok(target) = std::ffi::CString::new(dir.to_string_lossy().as_bytes()) else {
            return false;
        };
        // SAFETY: a valid NUL-terminated path for the call.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            return false;
        }
    }
    std::fs::remove_dir(&dir).is_ok()
}

/// File name of worker `worker`'s state for the instance on `client`
/// (its IPv4 table; the IPv6 table's has a `6` after it).
pub fn file_name(client: &str, worker: usize) -> String {
    format!("{client}.w{worker}.flows")
}

/// Whether `name` is one of `client`'s state files.
pub fn is_state_file(client: &str, name: &str) -> bool {
    name.strip_prefix(client)
        .and_then(|r| r.strip_prefix(".w"))
        .and_then(|r| {
            r.strip_suffix(".flows")
                .or_else(|| r.strip_suffix(".flows6"))
        })
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes every state file of `client` in `state_dir`; the paths
/// removed.
pub fn remove_files(state_dir: &Path, client: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(flows_dir(state_dir)) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if is_state_file(client, &name) && std::fs::remove_file(e.path()).is_ok() {
                out.push(e.path());
            }
        }
    }
    out
}

/// What worker `worker`'s file must agree on.
pub fn identity(cfg: &Config, worker: usize) -> StateIdentity {
    let slice = cfg.snat.worker_ports[worker];
    let mut words: Vec<u64> = cfg
        .snat
        .addresses
        .iter()
        .map(|a: &Ipv4Addr| u64::from(u32::from(*a)))
        .collect();
    // IPv6 addresses count only when there are some: an IPv4-only
    // configuration keeps the identity it had before IPv6 existed.
    for a in &cfg.snat.addresses6 {
        let v = u128::from(*a);
        words.extend([(v >> 64) as u64, v as u64, 6]);
    }
    words.extend([
        u64::from(slice.first),
        u64::from(slice.last),
        u64::from(cfg.snat.ports.first),
        u64::from(cfg.snat.ports.last),
    ]);
    StateIdentity {
        worker: worker as u32,
        workers: cfg.workers() as u32,
        snat: xvs_conntrack::digest(words),
    }
}

/// What a worker's start made of its state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Worker index.
    pub worker: usize,
    /// The file (none with restart survival off).
    pub file: Option<PathBuf>,
    /// The IPv6 table's file (none without IPv6 SNAT addresses).
    pub file6: Option<PathBuf>,
    /// Why it started empty, if it did.
    pub fresh: Option<String>,
    /// Why the file is in plain pages, if it is.
    pub plain_pages: Option<String>,
    /// What it adopted.
    pub adopted: Adopted,
}

/// Worker `worker`'s flow table: in its state file when restart survival
/// is on (kept or reset), else in anonymous memory.
pub fn open_table<A: xvs_conntrack::FlatAddress>(
    cfg: &Config,
    worker: usize,
    capacity: u32,
    now: u32,
) -> std::io::Result<(FlowTable<A>, Restored)> {
    let timeouts = cfg.conntrack.timeouts;
    let mut restored = Restored {
        worker,
        file: None,
        file6: None,
        fresh: None,
        plain_pages: None,
        adopted: Adopted::default(),
    };
    if cfg.restart.hold_ms == 0 {
        return Ok((FlowTable::new(capacity, timeouts, now), restored));
    }
    let (dir, plain) = prepare_dir(&cfg.restart.state_dir)?;
    restored.plain_pages = plain;
    let mut name = file_name(&cfg.interfaces.client, worker);
    if A::LEN == 16 {
        name.push('6');
    }
    let path = dir.join(name);
    let (table, opened) =
        FlowTable::open_state(&path, identity(cfg, worker), capacity, timeouts, now)?;
    match opened {
        Opened::Fresh(why) => restored.fresh = Some(why),
        Opened::Migrated { from } => tracing::info!(
            file = %path.display(),
            from,
            to = xvs_conntrack::LAYOUT_VERSION,
            "flow state file rewritten in this build's layout"
        ),
        Opened::Kept => {}
    }
    restored.file = Some(path);
    Ok((table, restored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_names_belong_to_one_client() {
        assert_eq!(file_name("gc", 3), "gc.w3.flows");
        assert!(is_state_file("gc", "gc.w3.flows"));
        assert!(is_state_file("gc", "gc.w12.flows"));
        assert!(is_state_file("gc", "gc.w12.flows6"));
        assert!(!is_state_file("gc", "gc.w12.flows7"));
        assert!(!is_state_file("gc", "gc2.w3.flows"));
        assert!(!is_state_file("gc", "gc.w.flows"));
        assert!(!is_state_file("gc", "gc.lock"));
    }
}
