//! `xvs check-config`, run as operators run it: the real binary, real files.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

fn xvs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xvs"))
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config/examples")
        .join(name)
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("xvs-check-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn valid_files_print_one_summary_line_each() {
    let out = xvs()
        .arg("check-config")
        .arg(example("one-arm.toml"))
        .arg(example("kubernetes.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].ends_with(
            "one-arm.toml: ok: one-arm on eth0, 2 workers [q0@cpu2 q1@cpu3], poll adaptive, steering vip, 1 SNAT address, 3 services (2 tcp, 1 udp), 9 backends, kubernetes off"
        ),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("kubernetes.toml: ok: "), "{}", lines[1]);
    assert!(lines[1].ends_with("kubernetes on (xvs)"), "{}", lines[1]);
    assert!(out.stderr.is_empty());
}

#[test]
fn invalid_file_exits_2_with_located_errors() {
    let dir = TempDir::new("invalid");
    let bad = dir.0.join("xvs.toml");
    std::fs::write(
        &bad,
        "[interfaces]\nclient = \"eth0\"\n[snat]\naddresses = [\"198.18.2.1\"]\n[[services]]\nvip = \"198.19.0.1\"\nport = 80\nscheduler = \"lcx\"\n",
    )
    .unwrap();
    let out = xvs()
        .arg("check-config")
        .arg(example("one-arm.toml"))
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr,
        format!(
            "{}:8:13: services[0].scheduler: unknown scheduler \"lcx\" (expected one of rr, wrr, lc, wlc, sed, nq, dh, sh, mh, random, twos, lblc, lblcr, fo, ovf)\n",
            bad.display()
        )
    );
    // The valid file is still summarised.
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 1);
}

#[test]
fn unreadable_file_exits_2() {
    let dir = TempDir::new("missing");
    let missing = dir.0.join("nope.toml");
    let out = xvs().arg("check-config").arg(&missing).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with(&format!("{}: cannot read: ", missing.display())),
        "{stderr}"
    );
}

#[test]
fn no_file_is_a_usage_error() {
    let out = xvs().arg("check-config").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr).unwrap().contains("<FILE>"));
}

#[test]
fn version_and_help() {
    let out = xvs().arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("xvs {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = xvs().arg("--help").output().unwrap();
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("check-config"));
}
