//! The packet buffers on reserved 2 MiB pages across a crash, as an
//! operator who sizes `vm.nr_hugepages` to the workers (the README's 8
//! pages a worker) meets it: `xvs run` killed with SIGKILL and started
//! again at once, as systemd's `Restart=` does, gets its pages back:
//! nothing the dead instance leaves for its successor (its guard process,
//! its state files, its steering program, attached through the hold
//! window) keeps them. The kernel frees a dead socket's UMEM in deferred
//! work after the process is gone, and a worker whose pages are not free
//! yet waits for them (up to 250 ms); here the start itself takes longer
//! than that work (the test passes with the wait removed too), so the
//! wait is shown by `steering.rs`, which opens a port right after closing
//! one.
//!
//! A test binary of its own: cargo runs test binaries one at a time, so no
//! other test's port takes the pages this one counts.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;

use xvs_dataplane::host::{huge_pages_free, UMEM_HUGE_PAGES};
use xvs_vm_tests::daemon::{Daemon, ScratchDir};
use xvs_vm_tests::pages::{has_huge_mapping, Reserved};
use xvs_vm_tests::privileged;
use xvs_vm_tests::topology::{backend_addr, one_arm_head, Spec, Topology};

const TESTNET: &str = env!("CARGO_BIN_EXE_xvs-testnet");
const VIP: &str = "198.19.0.1";

fn bins() -> PathBuf {
    xvs_vm_tests::daemon::bins(TESTNET)
}

/// What `xvs status --json` says of worker 0's pages, and whether the
/// daemon has a hugetlb mapping by the kernel's account.
fn pages(gw: &Daemon) -> (bool, bool) {
    let json: serde_json::Value = serde_json::from_str(&gw.status(&["--json"])).unwrap();
    let huge = json["workers"][0]["huge_pages"].as_bool().unwrap();
    let pid = json["pid"].as_u64().unwrap() as u32;
    assert_eq!(pid, gw.pid(), "{json}");
    (huge, has_huge_mapping(pid))
}

#[test]
fn a_daemon_killed_and_started_again_gets_its_huge_pages_back() {
    if !privileged("a_daemon_killed_and_started_again_gets_its_huge_pages_back") {
        return;
    }
    let _reserved = Reserved::exactly_free(UMEM_HUGE_PAGES);
    let t = Topology::build(Spec::one_arm(2)).unwrap();
    let _servers = t.echo_servers(TESTNET, "b", 8080, None).unwrap();
    let state = ScratchDir::new(&t, "hp-state").unwrap();
    let backends: Vec<String> = (0..t.backends.len())
        .map(|i| format!("{{ address = \"{}\", port = 8080 }}", backend_addr(i)))
        .collect();
    let cfg = format!(
        "{}\n[restart]\nhold = \"5s\"\nstate_dir = \"{}\"\n\n\
         [[services]]\nvip = \"{VIP}\"\nport = 80\nscheduler = \"rr\"\nbackends = [{}]\n",
        one_arm_head(&t, 1),
        state.path().display(),
        backends.join(", ")
    );
    let (gw, _) = Daemon::start(&t, "hp", &bins(), &cfg, &[]).unwrap();
    assert_eq!(pages(&gw), (true, true), "the first instance's pages");
    assert_eq!(huge_pages_free(), 0, "its UMEM took all eight");
    let load = t.tcp_load(TESTNET, &format!("{VIP}:80"), 20, 5000);
    assert!(load.starts_with("ok=20 failed=0"), "{load}");
    let (status, _) = gw.kill(libc::SIGKILL);
    assert!(status.is_some(), "not killed");
    // At once: the dead process's pages are not all free yet.
    let (gw, _) = Daemon::start(&t, "hp", &bins(), &cfg, &[]).unwrap();
    assert_eq!(
        pages(&gw),
        (true, true),
        "the instance started after the kill fell back to 4 KiB pages"
    );
    assert_eq!(huge_pages_free(), 0);
    let load = t.tcp_load(TESTNET, &format!("{VIP}:80"), 20, 5000);
    assert!(load.starts_with("ok=20 failed=0"), "{load}");
}
