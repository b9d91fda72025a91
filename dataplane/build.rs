//! Compiles the XDP steering program (`bpf/steer.bpf.c`) with clang into
//! `$OUT_DIR/steer.bpf.o`, which the crate embeds. clang, libbpf-dev (BPF
//! headers) and linux-libc-dev are installed by `make deps`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/steer.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("steer.bpf.o");
    let arch_include = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into())
    );
    let status = Command::new(env::var("CLANG").unwrap_or_else(|_| "clang".into()))
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{arch_include}"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("clang failed to compile {src} ({s}); run `make deps`"),
        Err(e) => panic!("cannot run clang to compile {src}: {e}; run `make deps`"),
    }
}
