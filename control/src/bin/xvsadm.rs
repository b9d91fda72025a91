//! `xvsadm`: administer a running xvs with ipvsadm's commands and output
//! formats, over the admin API's unix socket.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Like every Unix tool: a reader that goes away (`xvsadm -Lnc | head`)
    // ends it quietly, not with "Broken pipe".
    // SAFETY: restores the default action of SIGPIPE before any other
    // thread exists; no handler is installed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args: Vec<String> = std::env::args().collect();
    let status = xvs_control::adm::cli::main_with(
        &args,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(status)
}
