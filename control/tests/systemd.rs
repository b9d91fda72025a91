//! The systemd unit passes `systemd-analyze verify` (with its install
//! paths pointed at the binaries of this build, which must exist for the
//! check to pass).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Command;

#[test]
fn the_unit_verifies() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/xvs.service"
    ))
    .unwrap();
    for needed in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "WatchdogSec=",
        "CAP_NET_ADMIN",
        "CAP_BPF",
        "CAP_IPC_LOCK",
        "LimitMEMLOCK=",
        "RuntimeDirectory=xvs",
        "Environment=GLIBC_TUNABLES=glibc.malloc.hugetlb=1",
    ] {
        assert!(unit.contains(needed), "{needed}");
    }
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        // `make deps` installs systemd; outside it, say why this is skipped.
        assert!(
            std::env::var_os("XVS_REQUIRE_PRIVILEGED").is_none(),
            "systemd-analyze is missing (make deps installs it)"
        );
        eprintln!("skipping: systemd-analyze not installed");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_xvs");
    let dir = std::env::temp_dir().join(format!("xvs-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("xvs.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/xvs", bin)).unwrap();
    // The ipvsadm.rules bridge, verified beside the unit it belongs to.
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/ipvsadm-rules/xvs-ipvsadm-rules.service"
    ))
    .unwrap();
    let adm = env!("CARGO_BIN_EXE_xvsadm");
    let rules_path = dir.join("xvs-ipvsadm-rules.service");
    std::fs::write(&rules_path, rules.replace("/usr/local/bin/xvsadm", adm)).unwrap();
    let out = Command::new("systemd-analyze")
        .args([
            "verify",
            path.to_str().unwrap(),
            rules_path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.trim().is_empty(), "{err}");
}
