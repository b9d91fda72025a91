//! `xvs`: the xvs daemon and its offline commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// xvs: an AF_XDP userspace L4 load balancer (IPVS-compatible schedulers,
/// full NAT, Maglev) for dedicated gateway nodes.
#[derive(Debug, Parser)]
#[command(name = "xvs", version)]
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
    /// counter line per worker on stop; the XDP program is detached on
    /// every exit. Under systemd: Type=notify (READY, RELOADING,
    /// STOPPING, WATCHDOG).
    Run {
        /// Config file.
        #[arg(long, short, value_name = "FILE", default_value = xvs_config::DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
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
    }
}
