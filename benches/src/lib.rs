//! xvs-benches: criterion micro-benchmarks, the AF_XDP packet generator and
//! the end-to-end comparison against kube-proxy's iptables and nftables
//! modes.

pub mod drain;
pub mod e2e;
pub mod frames;
pub mod pktgen;
pub mod procstat;
pub mod raw;
pub mod report;
pub mod rulesets;

/// The glibc tunable that backs malloc's heap with transparent huge pages
/// (glibc 2.35 and later; ignored elsewhere), as `packaging/xvs.service`
/// runs the daemon.
pub const HUGE_PAGE_HEAP: &str = "glibc.malloc.hugetlb=1";

/// Runs the calling program again, same arguments, with
/// [`HUGE_PAGE_HEAP`] added to `GLIBC_TUNABLES`, unless it is there
/// already: glibc reads tunables only at start. A bench of the packet path
/// then measures the heap the daemon runs with (its per-service state is
/// read at random, and with 4 KiB pages nearly every such read also
/// misses the TLB). Returns only when it cannot (the bench goes on as
/// it is, saying so).
pub fn exec_with_huge_page_heap() {
    use std::os::unix::process::CommandExt;
    let current = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if current.split(':').any(|t| t == HUGE_PAGE_HEAP) {
        return;
    }
    let value = if current.is_empty() {
        HUGE_PAGE_HEAP.to_owned()
    } else {
        format!("{current}:{HUGE_PAGE_HEAP}")
    };
    let err = match std::env::current_exe() {
        Ok(exe) => std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("GLIBC_TUNABLES", value)
            .exec(),
        Err(e) => e,
    };
    eprintln!("running without {HUGE_PAGE_HEAP}: {err}");
}
