//! `xvsadm`: the ipvsadm-style administration CLI of xvs.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

/// xvsadm: inspect and edit the virtual services of a running xvs, with
/// ipvsadm's options and output formats.
#[derive(Debug, Parser)]
#[command(name = "xvsadm", version, about, long_about = None)]
struct Cli {}

fn main() -> ExitCode {
    Cli::parse();
    let _ = Cli::command().print_help();
    eprintln!("xvsadm: no command given");
    ExitCode::from(2)
}
