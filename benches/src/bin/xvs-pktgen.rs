//! xvs-pktgen: the AF_XDP packet generator and sink, from the command line.
//! Run it inside the namespace (or on the host) whose interface it uses:
//!
//! ```text
//! xvs-pktgen send --ifname c0 --dst-mac 02:..:01 --src 198.18.0.2 \
//!     --dst 198.19.0.1:80 --proto udp --flows new --rate max --seconds 5
//! xvs-pktgen sink --ifname b0 --addr 198.18.1.10 --seconds 10 [--reflect]
//! ```
//!
//! Both print one `key=value` line when done.

#![allow(clippy::print_stdout)]

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use xvs_benches::frames::{ep_any, L4Kind};
use xvs_benches::pktgen::{generate, Flows, GenSpec, Sink, SinkSpec};

#[derive(Parser)]
#[command(version, about = "AF_XDP packet generator and sink")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Proto {
    /// UDP datagrams.
    Udp,
    /// TCP SYNs.
    Syn,
}

#[derive(Subcommand)]
enum Cmd {
    /// Send frames; prints sent and received counts and rates.
    Send {
        /// Interface to send on.
        #[arg(long)]
        ifname: String,
        /// Queues to send on (one thread each).
        #[arg(long, value_delimiter = ',', default_value = "0")]
        queues: Vec<u32>,
        /// CPUs to pin the sending threads to, by position.
        #[arg(long, value_delimiter = ',')]
        cores: Vec<usize>,
        /// Destination MAC (the next hop's).
        #[arg(long, value_parser = parse_mac)]
        dst_mac: [u8; 6],
        /// First source address.
        #[arg(long)]
        src: IpAddr,
        /// Source addresses from --src on.
        #[arg(long, default_value_t = 1)]
        src_count: u32,
        /// Destination address:port.
        #[arg(long)]
        dst: SocketAddr,
        /// UDP or TCP SYN.
        #[arg(long, value_enum, default_value = "udp")]
        proto: Proto,
        /// `new` (every packet a new flow) or a number of fixed flows.
        #[arg(long, default_value = "new", value_parser = parse_flows)]
        flows: Flows,
        /// Packets per second, or `max`.
        #[arg(long, default_value = "max", value_parser = parse_rate)]
        rate: Rate,
        /// UDP payload bytes.
        #[arg(long, default_value_t = 18)]
        payload: usize,
        /// Seconds to send (at most 600).
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Count replies (answers ARP for the source addresses).
        #[arg(long)]
        receive: bool,
    },
    /// Count (and optionally reflect) frames to some addresses.
    Sink {
        /// Interface.
        #[arg(long)]
        ifname: String,
        /// Queues (one thread each).
        #[arg(long, value_delimiter = ',', default_value = "0")]
        queues: Vec<u32>,
        /// Addresses owned (repeatable).
        #[arg(long = "addr", required = true)]
        addrs: Vec<IpAddr>,
        /// Seconds to run (at most 600).
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Send every frame back to its sender.
        #[arg(long)]
        reflect: bool,
    },
}

#[derive(Clone, Copy)]
struct Rate(Option<u64>);

fn parse_rate(s: &str) -> Result<Rate, String> {
    if s == "max" {
        return Ok(Rate(None));
    }
    s.parse::<u64>()
        .ok()
        .filter(|&r| r > 0)
        .map(|r| Rate(Some(r)))
        .ok_or_else(|| format!("`{s}`: expected packets per second (> 0) or `max`"))
}

fn parse_flows(s: &str) -> Result<Flows, String> {
    if s == "new" {
        return Ok(Flows::New);
    }
    s.parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .map(Flows::Fixed)
        .ok_or_else(|| format!("`{s}`: expected `new` or a number of fixed flows (> 0)"))
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let bytes: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("`{s}`: expected a MAC address like 02:00:00:00:00:01"))?;
    bytes
        .try_into()
        .map_err(|_| format!("`{s}`: expected six bytes"))
}

fn bounded(seconds: f64) -> Result<Duration, String> {
    if seconds > 0.0 && seconds <= 600.0 {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(format!("--seconds {seconds}: expected 0 < seconds <= 600"))
    }
}

fn interface_mac(ifname: &str) -> Result<[u8; 6], String> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address"))
        .map_err(|e| format!("{ifname}: {e}"))?;
    parse_mac(text.trim())
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Send {
            ifname,
            queues,
            cores,
            dst_mac,
            src,
            src_count,
            dst,
            proto,
            flows,
            rate,
            payload,
            seconds,
            receive,
        } => {
            let spec = GenSpec {
                src_mac: interface_mac(&ifname)?,
                ifname,
                queues,
                cores,
                dst_mac,
                src_base: src,
                src_count,
                dst: ep_any(dst.ip(), dst.port()),
                l4: match proto {
                    Proto::Udp => L4Kind::Udp { payload },
                    Proto::Syn => L4Kind::Tcp { flags: 0x02 },
                },
                flows,
                first: 0,
                rate: rate.0,
                duration: bounded(seconds)?,
                receive,
            };
            let r = generate(&spec, &AtomicBool::new(false))?;
            println!(
                "sent={} received={} seconds={:.3} sent_pps={:.0} received_pps={:.0}",
                r.sent,
                r.received,
                r.seconds,
                r.sent_pps(),
                r.received_pps()
            );
        }
        Cmd::Sink {
            ifname,
            queues,
            addrs,
            seconds,
            reflect,
        } => {
            let duration = bounded(seconds)?;
            let sink = Sink::start(&SinkSpec {
                mac: interface_mac(&ifname)?,
                ifname,
                queues,
                addrs,
                reflect,
            })?;
            std::thread::sleep(duration);
            let (received, reflected) = sink.stop()?;
            println!(
                "received={received} reflected={reflected} seconds={seconds:.3} pps={:.0}",
                received as f64 / seconds
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xvs-pktgen: {e}");
            ExitCode::from(2)
        }
    }
}
