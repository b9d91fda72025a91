//! `xvs check-config FILE...`: validates config files without starting
//! anything.
//!
//! Each valid file gets one summary line on stdout; each invalid one gets
//! every diagnostic on stderr (`FILE:LINE:COLUMN: FIELD: MESSAGE`). The exit
//! status is 0 when every file is valid, 2 otherwise. Files are checked
//! for the machine this runs on (its addresses, its memory), as `xvs run`
//! would check them there.

use std::io::Write;
use std::path::PathBuf;

/// Exit status when at least one file is invalid or unreadable.
pub const EXIT_INVALID: u8 = 2;

/// Checks every file, writing summaries to `out` and diagnostics to `err`;
/// returns the exit status.
pub fn run(files: &[PathBuf], out: &mut impl Write, err: &mut impl Write) -> u8 {
    let mut status = 0;
    let machine = crate::machine::Machine::read();
    for path in files {
        // Writes to a closed pipe are not worth failing the check over.
        match xvs_config::load_on(path, &machine.host()) {
            Ok(config) => {
                // SNAT addresses that are this host's must leave the
                // kernel its ports (as xvs run checks at start).
                match xvs_dataplane::host::check_snat(&config.snat.addresses, config.snat.ports) {
                    Ok(_) => {
                        let _ = writeln!(out, "{}: ok: {}", path.display(), config.summary());
                    }
                    Err(e) => {
                        let _ = writeln!(err, "{}: {e}", path.display());
                        status = EXIT_INVALID;
                    }
                }
            }
            Err(e) => {
                let _ = writeln!(err, "{e}");
                status = EXIT_INVALID;
            }
        }
    }
    status
}
