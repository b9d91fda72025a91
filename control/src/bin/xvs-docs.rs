//! `xvs-docs DIR`: writes the man pages and shell completions of `xvs`
//! and `xvsadm` under DIR (`man/man5`, `man/man8`, `completions/`), as
//! `make deb` packages them.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: xvs-docs DIR");
        return ExitCode::from(2);
    };
    match xvs_control::docs::write_all(std::path::Path::new(&out)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xvs-docs: {e}");
            ExitCode::from(1)
        }
    }
}
