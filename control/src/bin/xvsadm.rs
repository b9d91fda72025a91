//! `xvsadm`: the ipvsadm-style administration CLI of xvs.

use clap::Parser;

/// xvsadm: inspect and edit the virtual services of a running xvs, with
/// ipvsadm's options and output formats.
#[derive(Debug, Parser)]
#[command(name = "xvsadm", version, about, long_about = None)]
struct Cli {}

fn main() {
    Cli::parse();
}
