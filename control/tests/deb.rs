//! The Debian package, as an operator meets it: built by
//! `packaging/deb/build.sh` from this build's binaries, unpacked into a
//! scratch root (`dpkg -x`), then: the installed binaries run, the shipped
//! config is valid, the config file is a conffile, `man xvsadm` and
//! `man 5 xvs.toml` render from the installed pages, the installed unit
//! passes `systemd-analyze verify` (its paths pointed into the scratch
//! root, its `man:` links found there), the completions load into bash,
//! and lintian finds no error.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).unwrap()
}

/// Whether `tool` runs here; under `make test` (root) it must.
fn have(tool: &str) -> bool {
    let ok = Command::new(tool).arg("--version").output().is_ok();
    if !ok {
        assert!(
            std::env::var_os("XVS_REQUIRE_PRIVILEGED").is_none(),
            "{tool} is missing (make deps installs it)"
        );
        eprintln!("skipping: {tool} not installed");
    }
    ok
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_package_installs_and_what_it_installs_works() {
    if !have("dpkg-deb") || !have("systemd-analyze") || !have("man") {
        return;
    }
    let scratch = Scratch(std::env::temp_dir().join(format!("xvs-deb-{}", std::process::id())));
    let bin = Path::new(env!("CARGO_BIN_EXE_xvs")).parent().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/deb/build.sh");
    let deb = stdout(Command::new(script).arg(bin).arg(scratch.0.join("out")));
    let deb = deb.trim();
    assert!(deb.ends_with(".deb"), "{deb}");

    // The package's fields and its conffile.
    let info = stdout(Command::new("dpkg-deb").args(["--info", deb]));
    for field in ["Package: xvs", "Section: net", "Depends: libc6"] {
        assert!(info.contains(field), "{field} not in\n{info}");
    }
    let conffiles = stdout(Command::new("dpkg-deb").args(["--info", deb, "conffiles"]));
    assert_eq!(conffiles.trim(), "/etc/xvs/xvs.toml");
    let postinst = stdout(Command::new("dpkg-deb").args(["--info", deb, "postinst"]));
    // The operator decides when it runs: no command of the script
    // enables or starts anything.
    let commands = postinst
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'));
    for l in commands {
        assert!(
            !l.contains("enable") && !l.contains(" start") && !l.contains("restart"),
            "{l}"
        );
    }

    let root = scratch.0.join("root");
    run(Command::new("dpkg").arg("-x").arg(deb).arg(&root));

    // The installed binaries run, and the shipped config passes their check.
    let xvs = root.join("usr/sbin/xvs");
    let version = stdout(Command::new(&xvs).arg("--version"));
    assert!(version.starts_with("xvs "), "{version}");
    let adm = stdout(Command::new(root.join("usr/sbin/xvsadm")).arg("--version"));
    assert!(adm.starts_with("xvsadm "), "{adm}");
    let check = stdout(
        Command::new(&xvs)
            .arg("check-config")
            .arg(root.join("etc/xvs/xvs.toml")),
    );
    assert!(check.contains(": ok:"), "{check}");
    assert!(root.join("usr/lib/tmpfiles.d/xvs.conf").exists());
    assert!(root.join("usr/share/doc/xvs/README.md").exists());

    // The man pages render from where the package put them.
    let manpath = root.join("usr/share/man");
    let man = |args: &[&str]| {
        stdout(
            Command::new("man")
                .args(args)
                .env("MANPATH", &manpath)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "80"),
        )
    };
    let page = man(&["xvsadm"]);
    assert!(
        page.contains("NAME") && page.contains("--add-service"),
        "{page}"
    );
    let page = man(&["5", "xvs.toml"]);
    assert!(page.contains("[CONNTRACK.TIMEOUTS]") && page.contains("syn_recv_pressure"));
    let page = man(&["xvs"]);
    assert!(page.contains("check-config"), "{page}");
    let page = stdout(
        Command::new("man")
            .arg("-l")
            .arg(manpath.join("man8/xvsadm-conntrack.8.gz"))
            .env("MANPAGER", "cat"),
    );
    assert!(page.contains("--dump"), "{page}");

    // The installed unit verifies (its binaries and man pages found in the
    // scratch root).
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/xvs.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/sbin/xvs run --config /etc/xvs/xvs.toml"));
    let local = scratch.0.join("xvs.service");
    let sbin = root.join("usr/sbin");
    std::fs::write(
        &local,
        unit.replace("/usr/sbin/", &format!("{}/", sbin.display())),
    )
    .unwrap();
    let out = run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(&local)
        .env("MANPATH", &manpath));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.trim().is_empty(), "{err}");

    // The bash completions load and complete the subcommands.
    let completion = root.join("usr/share/bash-completion/completions/xvsadm");
    let script = format!(
        "source {}; complete -p xvsadm; COMP_WORDS=(xvsadm con); COMP_CWORD=1; \
         COMP_LINE='xvsadm con'; COMP_POINT=10; _xvsadm xvsadm con xvsadm; echo \"${{COMPREPLY[@]}}\"",
        completion.display()
    );
    let words = stdout(Command::new("bash").arg("-c").arg(&script));
    assert!(words.contains("conntrack"), "{words}");

    if have("lintian") {
        let out = Command::new("lintian")
            .args(["--tag-display-limit", "0", deb])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("E:")).collect();
        assert!(errors.is_empty(), "lintian errors:\n{text}");
    }
}
