//! `xvs`: the xvs daemon and its offline commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The version `--version` prints (a build with the `second-build`
/// feature says so, so the upgrade test can tell the two apart).
const VERSION: &str = if cfg!(feature = "second-build") {
    concat!(env!("CARGO_PKG_VERSION"), " (second build)")
} else {
    env!("CARGO_PKG_VERSION")
};

/// xvs: an AF_XDP userspace L4 load balancer (IPVS-compatible schedulers,
/// full NAT, Maglev) for dedicated gateway nodes.
#[derive(Debug, Parser)]
#[command(name = "xvs", version = VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate config files: prints one summary line per valid file and
    /// every error (FILE:LINE:COLUMN: FIELD: MESSAGE) of an invalid one.
    /// Exit status 0 when all are valid, 2 otherwise.
    CheckConfig {
        /// Config files to check (e.g. /etc/xvs/xvs.toml).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Run the daemon: the data plane from a config file, the admin API
    /// (xvsadm) on its unix socket, the Kubernetes source when enabled.
    /// SIGHUP reloads the file (an invalid one changes nothing);
    /// SIGINT/SIGTERM stop it. Prints a `ready` line once serving and a
    /// counter line per worker on stop. The XDP program and the flow
    /// state outlive the process for `[restart] hold` (a restart adopts
    /// them); a guard process releases them when no restart comes. Under
    /// systemd: Type=notify (READY, RELOADING, STOPPING, WATCHDOG).
    Run {
        /// Config file.
        #[arg(long, short, value_name = "FILE", default_value = xvs_config::DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Remove what a stopped xvs left for a successor: detach its XDP
    /// program from the interfaces of the config and delete the flow
    /// state files. Refused while an instance runs on them.
    Release {
        /// Config file.
        #[arg(long, short, value_name = "FILE", default_value = xvs_config::DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Make the flow state folder (`[restart] state_dir`/flows) and mount
    /// its huge-page tmpfs, in this mount namespace. `xvs run` does it
    /// too; the systemd unit runs it first with full privileges (`+`), so
    /// the mount is the host's and outlives the service's namespace.
    PrepareState {
        /// Config file.
        #[arg(long, short, value_name = "FILE", default_value = xvs_config::DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// (Started by `xvs run`.) Wait for the instance `pid` to exit and
    /// release what it left when no successor started within the hold
    /// window.
    #[command(hide = true)]
    Guard {
        #[arg(long)]
        pid: u32,
        #[arg(long)]
        hold_ms: u64,
        #[arg(long)]
        state_dir: PathBuf,
        #[arg(long = "interface", required = true)]
        interfaces: Vec<String>,
    },
}

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
