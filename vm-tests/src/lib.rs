//! xvs-vm-tests: end-to-end tests of xvs on network-namespace topologies
//! (addresses only from 198.18.0.0/15), the programs they run in the
//! namespaces (`xvs-testnet`: echo servers and a connection load client),
//! and the VM recipes.
//!
//! Privileged tests call [`privileged`] first: without root they skip with
//! a printed reason, unless `XVS_REQUIRE_PRIVILEGED` is set (as `make test`
//! does for root), in which case they fail instead of skipping.

pub mod capture;
pub mod daemon;
pub mod fakekube;
pub mod netns;
pub mod nginx;
pub mod pages;
pub mod procs;
pub mod prom;
pub mod topology;
pub mod wrk;

/// Whether privileged tests can run here. Without root: prints why and
/// returns `false`, or panics when `XVS_REQUIRE_PRIVILEGED` is set.
pub fn privileged(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if std::env::var_os("XVS_REQUIRE_PRIVILEGED").is_some() {
        panic!("{test}: needs root (network namespaces), and XVS_REQUIRE_PRIVILEGED is set");
    }
    eprintln!("skipping {test}: needs root (network namespaces)");
    false
}
