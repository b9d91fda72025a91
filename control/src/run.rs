//! `xvs run --config FILE`: the data plane from a static configuration,
//! until SIGINT or SIGTERM.
//!
//! Prints one `ready` line once every worker runs (tests and scripts wait
//! for it), and on stop one summary line per worker with its counters;
//! the steering program is detached before the process exits, on a signal
//! or on an error.

use std::io::Write;
use std::path::Path;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use xvs_dataplane::runtime::Dataplane;
use xvs_dataplane::worker::Snapshot;

/// Exit status for an invalid configuration.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status when the data plane cannot start.
pub const EXIT_START: u8 = 1;

/// One line of counters for a worker's snapshot.
pub fn summary(s: &Snapshot) -> String {
    let c = &s.counters;
    let drops: Vec<String> = xvs_dataplane::wire::DropReason::ALL
        .iter()
        .filter(|r| c.drops[r.index()] > 0)
        .map(|r| format!("{}={}", r.name(), c.drops[r.index()]))
        .collect();
    format!(
        "worker {}: rx={} forwarded={} answered={} consumed={} dropped={} tx={} new_flows={} flows={} frames_accounted={} busy={} idle={} handed_off={} handed_in={} handoff_full={} handoff_left={} drops=[{}]",
        s.worker,
        c.rx,
        c.forwarded,
        c.answered,
        c.consumed,
        c.dropped(),
        s.tx,
        c.new_flows,
        s.flows,
        s.frames_accounted,
        s.busy,
        s.idle,
        s.handed_off,
        s.handed_in,
        s.handoff_full,
        s.handoff_left,
        drops.join(",")
    )
}

/// Runs the data plane; returns the process exit status.
pub fn run(config: &Path) -> u8 {
    let cfg = match xvs_config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return EXIT_CONFIG;
        }
    };
    // The worker clock: seconds since start, the one place that reads the
    // wall clock for the data plane.
    #[allow(clippy::disallowed_types)]
    let start = std::time::Instant::now();
    let clock = move || start.elapsed().as_secs() as u32;
    let mut signals = match Signals::new([SIGINT, SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xvs: cannot handle signals: {e}");
            return EXIT_START;
        }
    };
    let dp = match Dataplane::start(&cfg, clock) {
        Ok(dp) => dp,
        Err(e) => {
            eprintln!("xvs: cannot start the data plane: {e}");
            return EXIT_START;
        }
    };
    println!(
        "ready: {} services on {}, {} worker(s)",
        cfg.services.len(),
        dp.interface(),
        cfg.workers()
    );
    let _ = std::io::stdout().flush();
    if let Some(sig) = signals.forever().next() {
        eprintln!("xvs: signal {sig}: stopping");
    }
    let snapshots = dp.stop();
    let mut out = std::io::stdout().lock();
    for s in &snapshots {
        let _ = writeln!(out, "{}", summary(s));
    }
    0
}
