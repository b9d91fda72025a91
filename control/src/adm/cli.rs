//! `xvsadm`'s command line: ipvsadm's (parsed and checked as ipvsadm
//! 1.31 does, [`super::ipvs_opts`]; run by [`super::ipvsadm`]), plus the
//! `conntrack`, `observe` and `health` subcommands, and xvs's own `--reload`,
//! `--set-timeout` and `--json`.
//!
//! The options saying where the daemon is (`--socket`, `--server`,
//! `--token-file`) and `--json` may stand anywhere on the line, before or
//! after a subcommand; they are taken out before the rest is read.
//! `xvsadm` alone lists the table, as `ipvsadm` alone does. Errors are one
//! line on stderr with ipvsadm's status (2 for an option, 255 from the
//! table, 1 for `-L` of a missing service).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use super::client::Endpoint;
use super::ipvs_opts::{parse, Invocation};
use super::ipvsadm;
use super::names::System;

/// Where the daemon is, and `--json`: the options taken from anywhere.
#[derive(Debug, Clone)]
struct Globals {
    socket: PathBuf,
    server: Option<String>,
    token_file: Option<PathBuf>,
    json: bool,
}

/// Takes the global options out of `args` (program name first); the
/// rest, in order. A global option without its value is an error.
fn globals(args: &[String]) -> Result<(Globals, Vec<String>), String> {
    let mut g = Globals {
        socket: PathBuf::from(xvs_config::DEFAULT_ADMIN_SOCKET),
        server: None,
        token_file: None,
        json: false,
    };
    let mut rest = Vec::new();
    let mut it = args.iter();
    if let Some(p) = it.next() {
        rest.push(p.clone());
    }
    while let Some(a) = it.next() {
        if a == "--" {
            rest.push(a.clone());
            rest.extend(it.cloned());
            break;
        }
        if a == "--json" {
            g.json = true;
            continue;
        }
        let mut take = |name: &str| -> Result<Option<String>, String> {
            if let Some(v) = a.strip_prefix(&format!("--{name}=")) {
                return Ok(Some(v.to_owned()));
            }
            if a == &format!("--{name}") {
                return it
                    .next()
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| format!("--{name}: missing argument"));
            }
            Ok(None)
        };
        if let Some(v) = take("socket")? {
            g.socket = v.into();
        } else if let Some(v) = take("server")? {
            g.server = Some(v);
        } else if let Some(v) = take("token-file")? {
            g.token_file = Some(v.into());
        } else {
            rest.push(a.clone());
        }
    }
    Ok((g, rest))
}

fn endpoint(g: &Globals) -> Result<Endpoint, String> {
    match (&g.server, &g.token_file) {
        (Some(s), Some(f)) => {
            let token = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            Ok(Endpoint::Tcp(s.clone(), token.trim().to_owned()))
        }
        (Some(_), None) => Err("--server needs --token-file".into()),
        _ => Ok(Endpoint::Unix(g.socket.clone())),
    }
}

/// The help text: ipvsadm's usage, what xvs adds, and what it does not do.
fn usage(program: &str) -> String {
    format!(
        "xvsadm {version}: ipvsadm's command line for xvs
Usage:
  {p} -A|E virtual-service [-s scheduler] [-p [timeout]] [-M netmask] [-b sched-flags]
  {p} -D virtual-service
  {p} -C
  {p} -R
  {p} -S [-n]
  {p} -a|e virtual-service -r server-address -m [-w weight]
  {p} -d virtual-service -r server-address
  {p} -L|l [virtual-service] [options]
  {p} -Z [virtual-service]
  {p} --set tcp tcpfin udp
  {p} --set-timeout state seconds
  {p} --reload
  {p} --takeover [node]                          (serve a failed peer's addresses; see -L --daemon)
  {p} conntrack -L|-D|-F|-S|-C|-E [filters]     (like conntrack(8); --help)
  {p} observe [filters] [--follow]              (like hubble observe; --help)
  {p} health                                     (the real servers' health checks)
  {p} -h

Commands:
  --add-service     -A        add virtual service with options
  --edit-service    -E        edit virtual service with options
  --delete-service  -D        delete virtual service
  --clear           -C        clear the whole table
  --restore         -R        restore rules from stdin (all lines or none)
  --save            -S        save rules to stdout
  --add-server      -a        add real server with options
  --edit-server     -e        edit real server with options
  --delete-server   -d        delete real server
  --list            -L|-l     list the table
  --zero            -Z        zero counters in a service or all services
  --set tcp tcpfin udp        set connection timeout values (0 = unchanged)
  --set-timeout state seconds set one state's timeout by its [conntrack.timeouts] name
  --reload                    re-read the config file (an invalid file changes nothing)
  --help            -h        display this help message

virtual-service:
  --tcp-service|-t  service-address   service-address is host[:port]
  --udp-service|-u  service-address   service-address is host[:port]

Options:
  --scheduler    -s scheduler         one of rr|wrr|lc|wlc|lblc|lblcr|dh|sh|sed|nq|fo|ovf|mh,
                                      or xvs's random|twos; the default scheduler is wlc.
  --persistent   -p [timeout]         persistent service (360 seconds without a value, as
                                      ipvsadm 1.31's code does; its man page says 300)
  --netmask      -M netmask           persistent granularity mask
  --real-server  -r server-address    server-address is host (and port)
  --gatewaying   -g                   gatewaying (direct routing: the default; the real
                                      server shares a link and holds the VIP, no port)
  --ipip         -i                   ipip encapsulation (tunneling; replies bypass xvs)
  --masquerading -m                   masquerading (full NAT through a SNAT address)
  --tun-type     type                 ipip (default) or gue (to port 6080, no checksum)
  --tun-port     port                 the GUE port (6080: tunnel.gue_port)
  --tun-nocsum                        GUE without a UDP checksum (what xvs sends)
  --weight       -w weight            capacity of real server
  --connection   -c                   output of current connections
  --timeout                           output of timeout (tcp tcpfin udp)
  --daemon                            output of the flow sync's state ([cluster.sync]:
                                      the role, each peer heard, the counters)
  --stats                             output of statistics information
  --rate                              output of rate information
  --exact                             expand numbers (display exact values)
  --thresholds                        output of thresholds information (always 0)
  --tun-info                          output of tunnel information
  --nosort                            disable sorting output of service/server entries
  --sort                              does nothing, for backwards compatibility
  --numeric      -n                   numeric output of addresses and ports
  --sched-flags  -b flags             scheduler flags (comma-separated): sh-fallback,
                                      sh-port, mh-fallback, mh-port, flag-1, flag-2

xvs:
  --json                              the admin API's JSON instead of the table
  --socket PATH                       the admin socket (default {socket})
  --server HOST:PORT --token-file F   the admin API over TCP
  (these four may stand anywhere on the line, also after a subcommand)

Not supported by xvs (refused with the reason): -f/--fwmark-service, -6
(IPv6 addresses are given in brackets: -t [2001:db8::1]:80),
--sctp-service, -x, -y,
-o/--ops, --pe, --persistent-conn, --start-daemon, --stop-daemon and the
sync daemon's options (flow sync is configured in [cluster.sync]), -b flag-3.
",
        version = env!("CARGO_PKG_VERSION"),
        p = program,
        socket = xvs_config::DEFAULT_ADMIN_SOCKET,
    )
}

/// Runs `xvsadm` with `args` (argv, program name first) and `input` as
/// `-R`'s standard input; returns the exit status.
pub fn main_with(
    args: &[String],
    input: &mut dyn BufRead,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let (g, rest) = match globals(args) {
        Ok(x) => x,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return 255;
        }
    };
    let to = match endpoint(&g) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return 2;
        }
    };
    let program = rest.first().cloned().unwrap_or_else(|| "xvsadm".into());
    match rest.get(1).map(String::as_str) {
        Some("conntrack") | Some("observe") | Some("health") => {
            let sub = &rest[1];
            let mut argv = vec![format!("xvsadm {sub}")];
            argv.extend(rest[2..].iter().cloned());
            if g.json {
                argv.push("--json".into());
            }
            return match sub.as_str() {
                "conntrack" => super::conntrack::main(&argv, &to, out, err),
                "observe" => super::observe::main(&argv, &to, out, err),
                _ => super::health::main(&argv, &to, out, err),
            };
        }
        Some("--takeover") => return super::sync::takeover(&rest[2..], &to, g.json, out, err),
        _ => {}
    }
    // `ipvsadm` alone lists the table (with names).
    let line = if rest.len() == 1 {
        vec![program.clone(), "-L".into()]
    } else {
        rest
    };
    let c = match parse(&line, false, &System) {
        Ok(Invocation::Run(c)) => c,
        Ok(Invocation::Help) => {
            let _ = out.write_all(usage(&program).as_bytes());
            return 0;
        }
        Ok(Invocation::Version) => {
            let _ = writeln!(
                out,
                "xvsadm {} (ipvsadm v1.31 command line, IPVS v1.2.1 listing)",
                env!("CARGO_PKG_VERSION")
            );
            return 0;
        }
        Err(e) => {
            let _ = writeln!(err, "{}", e.message);
            return e.status;
        }
    };
    match ipvsadm::run(&to, &c, g.json, input, &program) {
        Ok(text) => {
            let _ = out.write_all(text.as_bytes());
            0
        }
        Err(e) => {
            let _ = writeln!(err, "{}", e.message);
            e.status
        }
    }
}

/// A subcommand's help and version go to stdout with status 0; its parse
/// errors are one line with status 2.
pub fn clap_exit(e: clap::Error, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = write!(out, "{}", e.render());
            0
        }
        _ => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let _ = writeln!(err, "{}", first.trim_start_matches("error: "));
            2
        }
    }
}

/// `xvsadm`'s command line as a clap definition, for the man page and
/// the shell completions only: the line is parsed by
/// [`super::ipvs_opts`] (ipvsadm's popt table, which this is made from)
/// and the subcommands by their own parsers.
pub fn command() -> clap::Command {
    use super::ipvs_opts::{options, Arg as Takes};
    use clap::{Arg, ArgAction};
    let mut cmd = clap::Command::new("xvsadm")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Administer a running xvs with ipvsadm's command line and output formats")
        .long_about(
            "xvsadm administers a running xvs over its admin API with \
             ipvsadm(8)'s commands, options, exit statuses and output formats, \
             plus conntrack(8)-style flow table commands, a hubble-observe-style \
             flow event stream and the real servers' health checks. \
             xvsadm alone lists the table, as ipvsadm alone does.",
        )
        .disable_help_flag(true)
        .disable_version_flag(true)
        .after_long_help(usage("xvsadm"));
    for o in options() {
        let mut arg = Arg::new(o.long).long(o.long).help(o.help);
        if let Some((&first, more)) = o.short.split_first() {
            arg = arg.short(first).short_aliases(more.iter().copied());
        }
        arg = match o.takes {
            Takes::None => arg.action(ArgAction::SetTrue),
            Takes::Required => arg.num_args(1).value_name(value_name(o.long)),
            Takes::Optional => arg.num_args(0..=1).value_name(value_name(o.long)),
        };
        cmd = cmd.arg(arg);
    }
    let global = |name: &'static str, value: Option<&'static str>, help: String| {
        let a = Arg::new(name).long(name).help(help).global(true);
        match value {
            Some(v) => a.num_args(1).value_name(v),
            None => a.action(ArgAction::SetTrue),
        }
    };
    cmd.arg(global(
        "json",
        None,
        "print the admin API's JSON instead of the table".into(),
    ))
    .arg(global(
        "socket",
        Some("PATH"),
        format!(
            "the admin socket (default {})",
            xvs_config::DEFAULT_ADMIN_SOCKET
        ),
    ))
    .arg(global(
        "server",
        Some("HOST:PORT"),
        "the admin API over TCP (with --token-file)".into(),
    ))
    .arg(global(
        "token-file",
        Some("FILE"),
        "the bearer token of the TCP admin API".into(),
    ))
    .subcommand(super::conntrack::command())
    .subcommand(super::observe::command())
    .subcommand(super::health::command())
}

/// The value an option of the table takes, as its help names it.
fn value_name(long: &str) -> &'static str {
    match long {
        "tcp-service" | "udp-service" | "sctp-service" => "service-address",
        "real-server" => "server-address",
        "fwmark-service" => "fwmark",
        "scheduler" => "scheduler",
        "persistent" => "timeout",
        "netmask" => "netmask",
        "weight" => "weight",
        "sched-flags" => "flags",
        "tun-type" => "type",
        "tun-port" | "mcast-port" => "port",
        "mcast-interface" => "interface",
        "mcast-group" => "address",
        "start-daemon" | "stop-daemon" => "state",
        _ => "n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> (u8, String, String) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = main_with(&args, &mut std::io::empty(), &mut out, &mut err);
        (
            status,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn errors_are_one_line_with_ipvsadm_s_status() {
        let (s, _, e) = run(&["xvsadm", "-A", "-a", "-t", "198.19.0.1:80"]);
        assert_eq!((s, e.as_str()), (2, "invalid option `-a'\n"));
        let (s, _, e) = run(&["xvsadm", "-A", "-s", "rr"]);
        assert_eq!(
            (s, e.as_str()),
            (
                2,
                "You need to supply the 'service-address' option for the 'add-service' command\n"
            )
        );
        let (s, _, e) = run(&["xvsadm", "-A", "-t", "198.19.0.300:80"]);
        assert_eq!(
            (s, e.as_str()),
            (2, "illegal virtual server address[:port] specified\n")
        );
        let (s, _, e) = run(&["xvsadm", "--bogus"]);
        assert_eq!(
            (s, e.as_str()),
            (
                255,
                "Try `xvsadm -h' or 'xvsadm --help' for more information.\n"
            )
        );
        let (s, _, e) = run(&[
            "xvsadm",
            "-a",
            "-t",
            "198.19.0.1:80",
            "-r",
            "198.18.1.10",
            "-i",
            "--tun-type",
            "gre",
        ]);
        assert_eq!(
            (s, e.as_str()),
            (
                2,
                "--tun-type gre: xvs tunnels with ipip or gue (GRE is not done)\n"
            )
        );
        // No daemon at this socket: a clear one-line error, status 2.
        let (s, _, e) = run(&["xvsadm", "-Ln", "--socket", "/nonexistent/xvs.sock"]);
        assert_eq!(s, 2);
        assert!(
            e.starts_with("cannot reach xvs at /nonexistent/xvs.sock"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
        // Globals anywhere, also before a subcommand.
        let (s, _, e) = run(&[
            "xvsadm",
            "--socket",
            "/nonexistent/xvs.sock",
            "conntrack",
            "-L",
        ]);
        assert_eq!(s, 1);
        assert!(
            e.contains("cannot reach xvs at /nonexistent/xvs.sock"),
            "{e}"
        );
        let (s, _, e) = run(&["xvsadm", "-Ln", "--socket"]);
        assert_eq!((s, e.as_str()), (255, "--socket: missing argument\n"));
    }

    #[test]
    fn help_and_version_succeed() {
        let (s, out, _) = run(&["xvsadm", "--help"]);
        assert_eq!(s, 0);
        for opt in [
            "--add-service",
            "--real-server",
            "--stats",
            "--rate",
            "--exact",
            "--json",
            "--zero",
            "--restore",
            "360 seconds",
        ] {
            assert!(out.contains(opt), "{opt}");
        }
        let (s, out, _) = run(&["xvsadm", "-v"]);
        assert_eq!(s, 0);
        assert!(out.starts_with("xvsadm "));
        let (s, out, _) = run(&["xvsadm", "conntrack", "--help"]);
        assert_eq!(s, 0);
        assert!(out.contains("--reply-src"));
    }

    #[test]
    fn globals_come_out_from_anywhere() {
        let args: Vec<String> = [
            "xvsadm",
            "-L",
            "--socket=/a",
            "-n",
            "--json",
            "--server",
            "h:1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (g, rest) = globals(&args).unwrap();
        assert_eq!(rest, ["xvsadm", "-L", "-n"]);
        assert_eq!(g.socket, PathBuf::from("/a"));
        assert_eq!(g.server.as_deref(), Some("h:1"));
        assert!(g.json);
    }
}
