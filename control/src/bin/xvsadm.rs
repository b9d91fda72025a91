//! `xvsadm`: administer a running xvs with ipvsadm's commands and output
//! formats, over the admin API's unix socket.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let status = xvs_control::adm::cli::main_with(
        &args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(status)
}
