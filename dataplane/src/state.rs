//! The flow state an instance leaves for its successor: one file per
//! worker in `[restart] state_dir`, named after the client interface and
//! the worker, holding that worker's flow table (see
//! `xvs_conntrack::FlowTable::open_state`), and what a start made of it.
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

/// File name of worker `worker`'s state for the instance on `client`.
pub fn file_name(client: &str, worker: usize) -> String {
    format!("{client}.w{worker}.flows")
}

/// Whether `name` is one of `client`'s state files.
pub fn is_state_file(client: &str, name: &str) -> bool {
    name.strip_prefix(client)
        .and_then(|r| r.strip_prefix(".w"))
        .and_then(|r| r.strip_suffix(".flows"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes every state file of `client` in `dir`; the paths removed.
pub fn remove_files(dir: &Path, client: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
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
    words.extend([
        u64::from(slice.first),
        u64::from(slice.last),
        u64::from(cfg.snat.ports.first),
        u64::from(cfg.snat.ports.last),
    ]);
    StateIdentity {
        worker: worker as u32,
        workers: cfg.workers() as u32,
        snat: words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &w| {
            (h ^ w).wrapping_mul(0x100_0000_01b3)
        }),
    }
}

/// What a worker's start made of its state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Worker index.
    pub worker: usize,
    /// The file (none with restart survival off).
    pub file: Option<PathBuf>,
    /// Why it started empty, if it did.
    pub fresh: Option<String>,
    /// What it adopted.
    pub adopted: Adopted,
}

/// Worker `worker`'s flow table: in its state file when restart survival
/// is on (kept or reset), else in anonymous memory.
pub fn open_table(
    cfg: &Config,
    worker: usize,
    capacity: u32,
    now: u32,
) -> std::io::Result<(FlowTable, Restored)> {
    let timeouts = cfg.conntrack.timeouts;
    let mut restored = Restored {
        worker,
        file: None,
        fresh: None,
        adopted: Adopted::default(),
    };
    if cfg.restart.hold_ms == 0 {
        return Ok((FlowTable::new(capacity, timeouts, now), restored));
    }
    let dir = &cfg.restart.state_dir;
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file_name(&cfg.interfaces.client, worker));
    let (table, opened) =
        FlowTable::open_state(&path, identity(cfg, worker), capacity, timeouts, now)?;
    if let Opened::Fresh(why) = opened {
        restored.fresh = Some(why);
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
        assert!(!is_state_file("gc", "gc2.w3.flows"));
        assert!(!is_state_file("gc", "gc.w.flows"));
        assert!(!is_state_file("gc", "gc.lock"));
    }
}
