//! `xvs`'s command line: the daemon and its offline commands (parsed by
//! the `xvs` binary; the man page and the shell completions are made
//! from the same definition).

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

/// The version `--version` prints (a build with the `second-build`
/// feature says so, so the upgrade test can tell the two apart).
pub const VERSION: &str = if cfg!(feature = "second-build") {
    concat!(env!("CARGO_PKG_VERSION"), " (second build)")
} else {
    env!("CARGO_PKG_VERSION")
};

/// xvs: an AF_XDP userspace L4 load balancer (IPVS-compatible schedulers,
/// full NAT, Maglev) for dedicated gateway nodes.
#[derive(Debug, Parser)]
#[command(name = "xvs", version = VERSION)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `xvs`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
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
    /// One screen about the running xvs (over its admin socket): version
    /// and uptime, interfaces and their XDP mode, workers with core,
    /// socket mode, rx/tx rates and busy ratio, flows against capacity,
    /// SNAT, services and backends by state, the Kubernetes source, what
    /// the start adopted, the top drop reasons of the last minute.
    Status(crate::status::StatusArgs),
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
        /// The instance to wait for.
        #[arg(long)]
        pid: u32,
        /// How long a successor has to start (milliseconds).
        #[arg(long)]
        hold_ms: u64,
        /// The flow state folder to delete.
        #[arg(long)]
        state_dir: PathBuf,
        /// The interfaces to detach the XDP program from.
        #[arg(long = "interface", required = true)]
        interfaces: Vec<String>,
    },
}

/// `xvs`'s clap definition.
pub fn command() -> clap::Command {
    Cli::command()
}
