//! `xvsadm`'s command line: ipvsadm's commands and options (`-A/-E/-D`,
//! `-a/-e/-d`, `-C`, `-L`/`-l` with `-n`, `-c`, `--stats`, `--rate`,
//! `--exact`, `--timeout`), plus `--reload`, `--json` and the
//! `conntrack` subcommand shaped like conntrack(8). Errors are one line on
//! stderr and exit status 2, as ipvsadm's.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::{ArgAction, Parser};
use hyper::Method;

use super::client::{request, stream, Endpoint};
use super::format::{connections, list, timeout, Format};
use crate::api::ConnPage;
use crate::engine::Applied;
use crate::metrics::WorkerConntrack;
use crate::view::{Listing, TimeoutView};

/// Exit status of every error.
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "xvsadm",
    version,
    about = "Administer xvs virtual services with ipvsadm's commands and output",
    after_help = "Also: `xvsadm conntrack -L|-D|-S [filters]` (like conntrack(8)) and `xvsadm observe [--verdict DROPPED] [--service VIP:PORT] [--last N] [--follow]` (like hubble observe); each has --help."
)]
struct Adm {
    /// Add a virtual service (-t|-u VIP:PORT, -s, -p, -M, -b).
    #[arg(short = 'A', long = "add-service", action = ArgAction::SetTrue)]
    add_service: bool,
    /// Edit a virtual service's scheduler, persistence and flags.
    #[arg(short = 'E', long = "edit-service", action = ArgAction::SetTrue)]
    edit_service: bool,
    /// Delete a virtual service.
    #[arg(short = 'D', long = "delete-service", action = ArgAction::SetTrue)]
    delete_service: bool,
    /// Clear the whole table.
    #[arg(short = 'C', long = "clear", action = ArgAction::SetTrue)]
    clear: bool,
    /// Add a real server (-t|-u VIP:PORT -r RIP[:PORT] [-m] [-w WEIGHT]).
    #[arg(short = 'a', long = "add-server", action = ArgAction::SetTrue)]
    add_server: bool,
    /// Edit a real server's weight.
    #[arg(short = 'e', long = "edit-server", action = ArgAction::SetTrue)]
    edit_server: bool,
    /// Delete a real server.
    #[arg(short = 'd', long = "delete-server", action = ArgAction::SetTrue)]
    delete_server: bool,
    /// List the table (-n is implied: output is always numeric).
    #[arg(short = 'L', long = "list", visible_short_alias = 'l', action = ArgAction::SetTrue)]
    list: bool,
    /// Re-read the config file (like SIGHUP); an invalid file changes nothing.
    #[arg(long, action = ArgAction::SetTrue)]
    reload: bool,
    /// Set the timeouts (tcp tcpfin udp, seconds; 0 leaves one unchanged).
    #[arg(long, num_args = 3, value_names = ["TCP", "TCPFIN", "UDP"])]
    set: Option<Vec<u32>>,
    /// Set one state's timeout, by its [conntrack.timeouts] name
    /// (established, syn_sent, syn_recv, fin_wait, time_wait, close,
    /// close_wait, last_ack, synack, udp, icmp, syn_recv_pressure).
    #[arg(long, num_args = 2, value_names = ["STATE", "SECONDS"])]
    set_timeout: Option<Vec<String>>,
    /// TCP service VIP[:PORT].
    #[arg(short = 't', long = "tcp-service", value_name = "SERVICE-ADDRESS")]
    tcp: Option<String>,
    /// UDP service VIP[:PORT].
    #[arg(short = 'u', long = "udp-service", value_name = "SERVICE-ADDRESS")]
    udp: Option<String>,
    /// Scheduler: rr, wrr, lc, wlc, sed, nq, dh, sh, mh, random, twos.
    #[arg(short = 's', long)]
    scheduler: Option<String>,
    /// Persistent service, with a timeout in seconds (300 if omitted).
    #[arg(short = 'p', long = "persistent", num_args = 0..=1, default_missing_value = "300")]
    persistent: Option<u32>,
    /// Persistence granularity mask.
    #[arg(short = 'M', long)]
    netmask: Option<Ipv4Addr>,
    /// Scheduler flags (sh-fallback, sh-port, mh-fallback, mh-port; or fallback, port).
    #[arg(short = 'b', long = "sched-flags")]
    sched_flags: Option<String>,
    /// Real server RIP[:PORT].
    #[arg(short = 'r', long = "real-server", value_name = "SERVER-ADDRESS")]
    real: Option<String>,
    /// Masquerading (full NAT, the only method).
    #[arg(short = 'm', long = "masquerading", action = ArgAction::SetTrue)]
    masq: bool,
    /// Direct routing (not supported).
    #[arg(short = 'g', long = "gatewaying", action = ArgAction::SetTrue)]
    gatewaying: bool,
    /// IPIP tunnelling (not supported).
    #[arg(short = 'i', long = "ipip", action = ArgAction::SetTrue)]
    ipip: bool,
    /// Weight of the real server.
    #[arg(short = 'w', long)]
    weight: Option<u32>,
    /// Numeric output (always on).
    #[arg(short = 'n', long, action = ArgAction::SetTrue)]
    numeric: bool,
    /// List connections.
    #[arg(short = 'c', long = "connection", action = ArgAction::SetTrue)]
    connection: bool,
    /// Show the timeouts (tcp tcpfin udp).
    #[arg(long, action = ArgAction::SetTrue)]
    timeout: bool,
    /// Show counters.
    #[arg(long, action = ArgAction::SetTrue)]
    stats: bool,
    /// Show rates.
    #[arg(long, action = ArgAction::SetTrue)]
    rate: bool,
    /// Exact numbers (no K/M/G/T).
    #[arg(long, action = ArgAction::SetTrue)]
    exact: bool,
    /// Print the API's JSON instead of the table.
    #[arg(long, action = ArgAction::SetTrue)]
    json: bool,
    #[command(flatten)]
    to: To,
}

/// Where the daemon is.
#[derive(Debug, clap::Args)]
struct To {
    /// The admin socket.
    #[arg(long, global = true, default_value = xvs_config::DEFAULT_ADMIN_SOCKET)]
    socket: PathBuf,
    /// The admin API over TCP (`HOST:PORT`), with --token-file.
    #[arg(long, global = true, requires = "token_file")]
    server: Option<String>,
    /// File holding the bearer token for --server.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
}

#[derive(Debug, Parser)]
#[command(
    name = "xvsadm conntrack",
    about = "The flow table, like conntrack(8): -L lists, -D deletes, -F flushes, -S shows statistics"
)]
struct Conntrack {
    /// List flows.
    #[arg(short = 'L', long = "dump", action = ArgAction::SetTrue)]
    list: bool,
    /// Delete the matching flows.
    #[arg(short = 'D', long = "delete", action = ArgAction::SetTrue)]
    delete: bool,
    /// Show per-worker statistics.
    #[arg(short = 'S', long = "stats", action = ArgAction::SetTrue)]
    stats: bool,
    /// Flush the whole flow table.
    #[arg(short = 'F', long = "flush", action = ArgAction::SetTrue)]
    flush: bool,
    /// Protocol: tcp or udp.
    #[arg(short = 'p', long = "proto")]
    proto: Option<String>,
    /// Client address (original source).
    #[arg(short = 's', long = "src")]
    src: Option<Ipv4Addr>,
    /// VIP (original destination).
    #[arg(short = 'd', long = "dst")]
    dst: Option<Ipv4Addr>,
    /// VIP port.
    #[arg(long = "dport")]
    dport: Option<u16>,
    /// Backend address (reply source).
    #[arg(short = 'r', long = "reply-src")]
    reply_src: Option<Ipv4Addr>,
    /// IPVS state (ESTABLISHED, SYN_RECV, ..., UDP).
    #[arg(long)]
    state: Option<String>,
    /// Print the API's JSON.
    #[arg(long, action = ArgAction::SetTrue)]
    json: bool,
    #[command(flatten)]
    to: To,
}

#[derive(Debug, Parser)]
#[command(
    name = "xvsadm observe",
    about = "Flow events (new, closed, dropped with reason), like hubble observe"
)]
struct Observe {
    /// Only this verdict: NEW, CLOSED or DROPPED.
    #[arg(long)]
    verdict: Option<String>,
    /// Only flows to this VIP:PORT.
    #[arg(long)]
    service: Option<String>,
    /// How many past events to show first.
    #[arg(long, default_value_t = 20)]
    last: usize,
    /// Keep printing new events (until interrupted).
    #[arg(short = 'f', long, action = ArgAction::SetTrue)]
    follow: bool,
    /// Print the events as JSON lines.
    #[arg(long, action = ArgAction::SetTrue)]
    json: bool,
    #[command(flatten)]
    to: To,
}

fn run_observe(o: &Observe, out: &mut dyn Write) -> Result<(), String> {
    let to = endpoint(&o.to)?;
    let mut q = vec![format!("last={}", o.last)];
    if let Some(v) = &o.verdict {
        q.push(format!("verdict={v}"));
    }
    if let Some(s) = &o.service {
        q.push(format!("service={s}"));
    }
    if o.follow {
        q.push("follow=true".into());
    }
    let path = format!("/v1/events?{}", q.join("&"));
    let mut pending = String::new();
    let mut failed: Option<String> = None;
    let mut print = |chunk: &str, out: &mut dyn Write| {
        pending.push_str(chunk);
        while let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            let text = if o.json {
                line
            } else {
                match serde_json::from_str::<crate::events::EventView>(line.trim()) {
                    Ok(e) => e.line() + "\n",
                    Err(e) => {
                        failed = Some(e.to_string());
                        continue;
                    }
                }
            };
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    };
    if o.follow {
        stream(&to, &path, |c| print(c, out))?;
    } else {
        let body = call(&to, Method::GET, &path, None)?;
        print(&body, out);
    }
    failed.map_or(Ok(()), Err)
}

fn endpoint(to: &To) -> Result<Endpoint, String> {
    match (&to.server, &to.token_file) {
        (Some(s), Some(f)) => {
            let token = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            Ok(Endpoint::Tcp(s.clone(), token.trim().to_owned()))
        }
        _ => Ok(Endpoint::Unix(to.socket.clone())),
    }
}

/// `VIP[:PORT]` (port 0 when absent).
fn addr_port(s: &str, what: &str) -> Result<(Ipv4Addr, Option<u16>), String> {
    let (a, p) = match s.rsplit_once(':') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let addr = a
        .parse()
        .map_err(|_| format!("illegal {what} address: {s}"))?;
    let port = match p {
        Some(p) => Some(p.parse().map_err(|_| format!("illegal {what} port: {s}"))?),
        None => None,
    };
    Ok((addr, port))
}

struct Svc {
    proto: &'static str,
    vip: Ipv4Addr,
    port: u16,
}

impl Svc {
    fn path(&self) -> String {
        format!("/v1/services/{}/{}/{}", self.proto, self.vip, self.port)
    }
}

fn service(a: &Adm) -> Result<Option<Svc>, String> {
    let (proto, s) = match (&a.tcp, &a.udp) {
        (Some(_), Some(_)) => return Err("multiple service options specified".into()),
        (Some(s), None) => ("tcp", s),
        (None, Some(s)) => ("udp", s),
        (None, None) => return Ok(None),
    };
    let (vip, port) = addr_port(s, "service")?;
    Ok(Some(Svc {
        proto,
        vip,
        port: port.unwrap_or(0),
    }))
}

fn need_service(a: &Adm) -> Result<Svc, String> {
    service(a)?.ok_or_else(|| "service address not specified (-t or -u)".into())
}

fn flags(b: &Option<String>) -> Vec<String> {
    b.iter()
        .flat_map(|s| s.split(','))
        .map(|f| {
            f.trim()
                .trim_start_matches("sh-")
                .trim_start_matches("mh-")
                .to_owned()
        })
        .filter(|f| !f.is_empty())
        .collect()
}

fn call(
    to: &Endpoint,
    m: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<String, String> {
    request(to, m, path, body.map(|b| b.to_string()))?.ok()
}

fn applied_line(body: &str) -> String {
    match serde_json::from_str::<Applied>(body) {
        Ok(a) => format!(
            "applied: {} added, {} changed, {} removed, {} unchanged",
            a.added, a.changed, a.removed, a.unchanged
        ),
        Err(_) => body.trim().to_owned(),
    }
}

fn run_adm(a: &Adm, out: &mut dyn Write) -> Result<(), String> {
    let to = endpoint(&a.to)?;
    if a.gatewaying || a.ipip {
        return Err("only masquerading (-m, full NAT) is supported".into());
    }
    let commands = [
        a.add_service,
        a.edit_service,
        a.delete_service,
        a.clear,
        a.add_server,
        a.edit_server,
        a.delete_server,
        a.list || a.timeout,
        a.reload,
        a.set.is_some(),
        a.set_timeout.is_some(),
    ];
    match commands.iter().filter(|c| **c).count() {
        0 => return Err("no command specified (try -L, -A, -a, ...; --help)".into()),
        1 => {}
        _ => return Err("multiple commands specified".into()),
    }
    let w = |out: &mut dyn Write, s: String| out.write_all(s.as_bytes()).map_err(|e| e.to_string());
    if let Some(t) = &a.set {
        let body = serde_json::json!({ "tcp": t[0], "tcpfin": t[1], "udp": t[2] });
        let body = call(&to, Method::PUT, "/v1/timeouts", Some(body))?;
        return if a.json { w(out, body) } else { Ok(()) };
    }
    if let Some([state, secs]) = a.set_timeout.as_deref() {
        let secs: u32 = secs
            .parse()
            .map_err(|_| format!("--set-timeout {state} {secs}: seconds must be a number"))?;
        let body = serde_json::json!({ state: secs });
        let body = call(&to, Method::PUT, "/v1/timeouts/states", Some(body))?;
        return if a.json { w(out, body) } else { Ok(()) };
    }
    if a.reload {
        let body = call(&to, Method::POST, "/v1/reload", None)?;
        return w(
            out,
            if a.json {
                body
            } else {
                format!("{}\n", applied_line(&body))
            },
        );
    }
    if a.timeout && !a.list {
        let body = call(&to, Method::GET, "/v1/timeouts", None)?;
        if a.json {
            return w(out, body);
        }
        let t: TimeoutView = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        return w(out, timeout(&t));
    }
    if a.list {
        if a.timeout {
            let body = call(&to, Method::GET, "/v1/timeouts", None)?;
            let t: TimeoutView = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            return w(out, if a.json { body } else { timeout(&t) });
        }
        if a.connection {
            let body = call(&to, Method::GET, "/v1/connections?size=1000000", None)?;
            if a.json {
                return w(out, body);
            }
            let p: ConnPage = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            return w(out, connections(&p.connections));
        }
        let body = call(&to, Method::GET, "/v1/services", None)?;
        let mut l: Listing = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        if let Some(s) = service(a)? {
            l.services
                .retain(|v| v.vip == s.vip && v.port == s.port && v.protocol == s.proto);
            if l.services.is_empty() {
                return Err("No such service".into());
            }
        }
        if a.json {
            return w(
                out,
                serde_json::to_string_pretty(&l).map_err(|e| e.to_string())? + "\n",
            );
        }
        let f = Format {
            stats: a.stats,
            rate: a.rate,
            exact: a.exact,
        };
        return w(out, list(&l, f));
    }
    let body = if a.clear {
        call(&to, Method::DELETE, "/v1/services", None)?
    } else if a.add_service || a.edit_service {
        let s = need_service(a)?;
        let spec = serde_json::json!({
            "protocol": s.proto, "vip": s.vip, "port": s.port,
            "scheduler": a.scheduler, "persistence": a.persistent, "netmask": a.netmask,
            "flags": flags(&a.sched_flags),
        });
        if a.add_service {
            call(&to, Method::POST, "/v1/services", Some(spec))?
        } else {
            call(&to, Method::PUT, &s.path(), Some(spec))?
        }
    } else if a.delete_service {
        let s = need_service(a)?;
        call(&to, Method::DELETE, &s.path(), None)?
    } else {
        let s = need_service(a)?;
        let real = a
            .real
            .as_deref()
            .ok_or("real server address not specified (-r)")?;
        let (addr, port) = addr_port(real, "real server")?;
        let port = port.unwrap_or(s.port);
        if a.add_server {
            let b = serde_json::json!({ "address": addr, "port": port, "weight": a.weight });
            call(
                &to,
                Method::POST,
                &format!("{}/backends", s.path()),
                Some(b),
            )?
        } else if a.edit_server {
            let b = serde_json::json!({ "address": addr, "port": port, "weight": a.weight });
            call(
                &to,
                Method::PUT,
                &format!("{}/backends/{addr}/{port}", s.path()),
                Some(b),
            )?
        } else {
            call(
                &to,
                Method::DELETE,
                &format!("{}/backends/{addr}/{port}", s.path()),
                None,
            )?
        }
    };
    if a.json {
        w(out, body)
    } else {
        Ok(())
    }
}

fn conntrack_line(c: &crate::view::ConnView) -> String {
    let (name, num) = match c.protocol.as_str() {
        "UDP" => ("udp", 17),
        "ICMP" => ("icmp", 1),
        _ => ("tcp", 6),
    };
    let state = if num == 6 {
        format!(" {}", c.state)
    } else {
        String::new()
    };
    format!(
        "{name:<8} {num} {}{state} src={} dst={} sport={} dport={} src={} dst={} sport={} dport={}\n",
        c.expires,
        c.client.ip(),
        c.vip.ip(),
        c.client.port(),
        c.vip.port(),
        c.backend.ip(),
        c.snat.ip(),
        c.backend.port(),
        c.snat.port()
    )
}

fn run_conntrack(c: &Conntrack, out: &mut dyn Write) -> Result<(), String> {
    let to = endpoint(&c.to)?;
    let w = |out: &mut dyn Write, s: String| out.write_all(s.as_bytes()).map_err(|e| e.to_string());
    if [c.list, c.delete, c.stats, c.flush]
        .iter()
        .filter(|x| **x)
        .count()
        != 1
    {
        return Err("exactly one of -L, -D, -S, -F".into());
    }
    if c.flush {
        let body = call(&to, Method::POST, "/v1/flush", None)?;
        return w(out, deleted_line(&body, c.json));
    }
    if c.stats {
        let body = call(&to, Method::GET, "/v1/conntrack/stats", None)?;
        if c.json {
            return w(out, body);
        }
        let stats: Vec<WorkerConntrack> = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let mut s = String::new();
        for x in stats {
            // conntrack(8)'s fields first, then xvs's own: why flows
            // ended, and what the kernel dropped at the AF_XDP sockets.
            let r = &x.rings;
            s.push_str(&format!(
                "cpu={:<8}\tentries={} found={} invalid={} insert={} insert_failed={} drop={} early_drop={} error=0 search_restart=0 expire={} delete={} reschedule={} nodest={} reclaim={} xsk_rx_dropped={} xsk_rx_ring_full={} xsk_rx_invalid={} xsk_fill_empty={} xsk_tx_invalid={} tx_ring_full={}\n",
                x.worker, x.entries, x.found, x.invalid, x.insert, x.insert_failed, x.drop, x.early_drop, x.expire, x.delete,
                x.reschedule, x.nodest, x.reclaim, r.rx_dropped, r.rx_ring_full, r.rx_invalid_descs, r.rx_fill_ring_empty, r.tx_invalid_descs, x.tx_ring_full
            ));
        }
        return w(out, s);
    }
    let mut q = Vec::new();
    if let Some(p) = &c.proto {
        q.push(format!("proto={p}"));
    }
    if let Some(s) = c.src {
        q.push(format!("client={s}"));
    }
    if let Some(d) = c.dst {
        q.push(format!("vip={d}"));
    }
    if let Some(p) = c.dport {
        q.push(format!("vport={p}"));
    }
    if let Some(r) = c.reply_src {
        q.push(format!("backend={r}"));
    }
    if let Some(s) = &c.state {
        q.push(format!("state={s}"));
    }
    if c.list {
        q.push("size=1000000".into());
        let body = call(
            &to,
            Method::GET,
            &format!("/v1/connections?{}", q.join("&")),
            None,
        )?;
        if c.json {
            return w(out, body);
        }
        let p: ConnPage = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let mut s: String = p.connections.iter().map(conntrack_line).collect();
        s.push_str(&format!(
            "xvsadm conntrack: {} flow entries have been shown.\n",
            p.connections.len()
        ));
        return w(out, s);
    }
    let body = call(
        &to,
        Method::DELETE,
        &format!("/v1/connections?{}", q.join("&")),
        None,
    )?;
    w(out, deleted_line(&body, c.json))
}

/// conntrack(8)'s line for a delete or flush answer (or the JSON).
fn deleted_line(body: &str, json: bool) -> String {
    if json {
        return body.to_owned();
    }
    let n = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["deleted"].as_u64())
        .unwrap_or(0);
    format!("xvsadm conntrack: {n} flow entries have been deleted.\n")
}

/// Runs `xvsadm` with `args` (argv, program name first); returns the exit
/// status. Errors go to `err` as one line.
pub fn main_with(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let r = if args.get(1).map(String::as_str) == Some("observe") {
        let name = "xvsadm observe".to_owned();
        let rest: Vec<&String> = std::iter::once(&name).chain(&args[2..]).collect();
        match Observe::try_parse_from(rest) {
            Ok(o) => run_observe(&o, out),
            Err(e) => return clap_exit(e, out, err),
        }
    } else if args.get(1).map(String::as_str) == Some("conntrack") {
        let name = "xvsadm conntrack".to_owned();
        let rest: Vec<&String> = std::iter::once(&name).chain(&args[2..]).collect();
        match Conntrack::try_parse_from(rest) {
            Ok(c) => run_conntrack(&c, out),
            Err(e) => return clap_exit(e, out, err),
        }
    } else {
        match Adm::try_parse_from(args) {
            Ok(a) => run_adm(&a, out),
            Err(e) => return clap_exit(e, out, err),
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            EXIT_ERROR
        }
    }
}

/// Help and version go to stdout with status 0; parse errors are one line.
fn clap_exit(e: clap::Error, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
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
            EXIT_ERROR
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> (u8, String, String) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = main_with(&args, &mut out, &mut err);
        (
            status,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn errors_are_one_line_with_status_2() {
        let (s, _, e) = run(&["xvsadm"]);
        assert_eq!((s, e.lines().count()), (2, 1), "{e}");
        let (s, _, e) = run(&["xvsadm", "-A", "-a", "-t", "198.19.0.1:80"]);
        assert_eq!((s, e.as_str()), (2, "multiple commands specified\n"));
        let (s, _, e) = run(&["xvsadm", "-A", "-s", "rr"]);
        assert_eq!(
            (s, e.as_str()),
            (2, "service address not specified (-t or -u)\n")
        );
        let (s, _, e) = run(&["xvsadm", "-A", "-t", "198.19.0.300:80"]);
        assert_eq!(
            (s, e.as_str()),
            (2, "illegal service address: 198.19.0.300:80\n")
        );
        let (s, _, e) = run(&["xvsadm", "--bogus"]);
        assert_eq!((s, e.lines().count()), (2, 1), "{e}");
        let (s, _, e) = run(&[
            "xvsadm",
            "-a",
            "-t",
            "198.19.0.1:80",
            "-r",
            "198.18.1.10",
            "-g",
        ]);
        assert_eq!(
            (s, e.as_str()),
            (2, "only masquerading (-m, full NAT) is supported\n")
        );
        // No daemon at this socket: a clear one-line error.
        let (s, _, e) = run(&["xvsadm", "-Ln", "--socket", "/nonexistent/xvs.sock"]);
        assert_eq!(s, 2);
        assert!(
            e.starts_with("cannot reach xvs at /nonexistent/xvs.sock"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
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
        ] {
            assert!(out.contains(opt), "{opt}");
        }
        let (s, out, _) = run(&["xvsadm", "--version"]);
        assert_eq!(s, 0);
        assert!(out.starts_with("xvsadm "));
        let (s, out, _) = run(&["xvsadm", "conntrack", "--help"]);
        assert_eq!(s, 0);
        assert!(out.contains("--reply-src"));
    }

    #[test]
    fn ipvsadm_style_addresses_parse() {
        assert_eq!(
            addr_port("198.19.0.1:80", "service").unwrap(),
            (Ipv4Addr::new(198, 19, 0, 1), Some(80))
        );
        assert_eq!(
            addr_port("198.18.1.10", "real server").unwrap(),
            (Ipv4Addr::new(198, 18, 1, 10), None)
        );
        assert_eq!(
            flags(&Some("sh-fallback,sh-port".into())),
            ["fallback", "port"]
        );
    }
}
