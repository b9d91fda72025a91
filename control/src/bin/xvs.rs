//! `xvs`: the xvs daemon and its offline commands.

use std::process::ExitCode;

use clap::Parser;
use xvs_control::cli::{Cli, Command};

/// The config at `path`, or its errors printed and `xvs check-config`'s
/// exit status for an invalid file.
fn load(path: &std::path::Path) -> Result<xvs_config::Config, ExitCode> {
    xvs_config::load(path).map_err(|e| {
        eprintln!("{e}");
        ExitCode::from(2)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { files } => {
            let status = xvs_control::check_config::run(
                &files,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr().lock(),
            );
            ExitCode::from(status)
        }
        Command::Status(a) => ExitCode::from(xvs_control::status::main(
            &a,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        )),
        Command::Run { config } => ExitCode::from(xvs_control::run::run(&config)),
        Command::Release { config } => {
            let cfg = match load(&config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match xvs_control::restart::Leftovers::of(&cfg).release() {
                Ok(lines) if lines.is_empty() => {
                    println!("nothing to release");
                    ExitCode::SUCCESS
                }
                Ok(lines) => {
                    for l in lines {
                        println!("{l}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::PrepareState { config } => {
            let cfg = match load(&config) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if cfg.restart.hold_ms == 0 {
                println!("restart survival is off (hold = \"0s\"): nothing to prepare");
                return ExitCode::SUCCESS;
            }
            match xvs_control::restart::prepare_state(&cfg) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Guard {
            pid,
            hold_ms,
            state_dir,
            interfaces,
        } => ExitCode::from(xvs_control::restart::guard(
            pid,
            std::time::Duration::from_millis(hold_ms),
            &xvs_control::restart::Leftovers {
                state_dir,
                interfaces,
            },
        )),
    }
}
