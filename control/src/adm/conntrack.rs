//! `xvsadm conntrack`: the flow table with conntrack(8)'s commands,
//! filters and formats (conntrack-tools 1.4 and libnetfilter_conntrack's
//! `snprintf_default`), so scripts that parse `conntrack -L` read xvs's
//! flows.
//!
//! - `-L`: `tcp      6 TIMEOUT STATE src= dst= sport= dport= [UNREPLIED]
//!   src= dst= sport= dport= [ASSURED] mark=0 use=1`, the original tuple
//!   client → VIP, the reply tuple backend → SNAT address; the summary
//!   `... N flow entries have been shown.` on stderr, as conntrack's.
//!   `-o extended` prefixes `ipv4     2 `. States are IPVS's names (what
//!   `ipvsadm -Lnc` shows), since xvs tracks IPVS's state machine.
//!   `[UNREPLIED]`: no packet from the backend yet; `[ASSURED]`: TCP that
//!   reached ESTABLISHED, UDP with a packet after the first reply.
//! - `-S`: conntrack's per-CPU line, one per worker, its fields first
//!   (found, invalid, insert, insert_failed, drop, early_drop, error,
//!   search_restart, clash_resolve, chaintoolong), then xvs's own.
//! - `-C`: the number of flows. `-E`: flow events as conntrack's event
//!   lines (`[NEW]`, and `[UPDATE]` when a flow closes); xvs has no event
//!   for an entry that expires, so there is no `[DESTROY]`. `-e` keeps
//!   the kinds its mask names (`ALL`, `NEW`, `UPDATES`, `DESTROY`,
//!   comma-separated, as conntrack's); `-o timestamp` prefixes each line
//!   with the time it arrived (`[seconds.micros]` and a tab, as
//!   conntrack's; `-L` ignores it, as conntrack's dump does).
//! - `-D`, `-F` as conntrack's, with its "have been deleted" line.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use clap::{ArgAction, Parser};
use hyper::Method;

use super::client::{request, stream, Endpoint};
use crate::api::ConnPage;
use crate::events::{EventView, LostEvents, LostLine};
use crate::metrics::WorkerConntrack;
use crate::view::ConnView;

/// The version conntrack-tools prints; xvs's own in its place.
const PROGNAME: &str = "xvsadm conntrack";

#[derive(Debug, Parser)]
#[command(
    name = "xvsadm conntrack",
    about = "The flow table, like conntrack(8): -L lists, -D deletes, -F flushes, -S shows statistics, -C counts, -E follows events"
)]
struct Args {
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
    /// Show the number of flows.
    #[arg(short = 'C', long = "count", action = ArgAction::SetTrue)]
    count: bool,
    /// Show flow events as they happen (until interrupted).
    #[arg(short = 'E', long = "event", action = ArgAction::SetTrue)]
    event: bool,
    /// Protocol: tcp or udp.
    #[arg(short = 'p', long = "proto")]
    proto: Option<String>,
    /// Client address (original source).
    #[arg(short = 's', long = "src", visible_alias = "orig-src")]
    src: Option<IpAddr>,
    /// VIP (original destination).
    #[arg(short = 'd', long = "dst", visible_alias = "orig-dst")]
    dst: Option<IpAddr>,
    /// Client port.
    #[arg(long = "sport", visible_alias = "orig-port-src")]
    sport: Option<u16>,
    /// VIP port.
    #[arg(long = "dport", visible_alias = "orig-port-dst")]
    dport: Option<u16>,
    /// Backend address (reply source).
    #[arg(short = 'r', long = "reply-src")]
    reply_src: Option<IpAddr>,
    /// SNAT address (reply destination).
    #[arg(short = 'q', long = "reply-dst")]
    reply_dst: Option<IpAddr>,
    /// Backend port.
    #[arg(long = "reply-port-src")]
    reply_sport: Option<u16>,
    /// SNAT port.
    #[arg(long = "reply-port-dst")]
    reply_dport: Option<u16>,
    /// IPVS state (ESTABLISHED, SYN_RECV, ..., UDP).
    #[arg(long)]
    state: Option<String>,
    /// Mark (xvs sets none: 0 matches every flow, others none).
    #[arg(short = 'm', long = "mark")]
    mark: Option<u32>,
    /// Layer 3 family: ipv4 or ipv6 (both when not given, as conntrack
    /// 1.4.6 and later list).
    #[arg(short = 'f', long = "family")]
    family: Option<String>,
    /// Output format: extended, timestamp (comma-separated).
    #[arg(short = 'o', long = "output")]
    output: Option<String>,
    /// With -E, the events to show: ALL, NEW, UPDATES, DESTROY
    /// (comma-separated; xvs reports no DESTROY).
    #[arg(short = 'e', long = "event-mask")]
    event_mask: Option<String>,
    /// Print the API's JSON.
    #[arg(long, action = ArgAction::SetTrue)]
    json: bool,
}

/// libnetfilter_conntrack's default line for a flow (no trailing space).
pub fn line(c: &ConnView, extended: bool) -> String {
    let (name, num) = match c.protocol.as_str() {
        "UDP" => ("udp", 17),
        "ICMP" => ("icmp", 1),
        _ => ("tcp", 6),
    };
    let mut s = String::new();
    if extended {
        s.push_str(&l3(c.client.ip()));
    }
    s.push_str(&format!("{name:<8} {num} {} ", c.expires));
    if num == 6 {
        s.push_str(&format!("{} ", c.state));
    }
    let tuple = |a: SocketAddr, b: SocketAddr| {
        format!(
            "src={} dst={} sport={} dport={} ",
            a.ip(),
            b.ip(),
            a.port(),
            b.port()
        )
    };
    s.push_str(&tuple(c.client, c.vip));
    let replied = c.packets[1] > 0;
    if !replied {
        s.push_str("[UNREPLIED] ");
    }
    s.push_str(&tuple(c.backend, c.snat));
    if assured(c) {
        s.push_str("[ASSURED] ");
    }
    s.push_str("mark=0 use=1");
    s
}

/// The extended output's layer 3 columns (`ipv4     2 `, `ipv6     10 `).
fn l3(a: IpAddr) -> String {
    match a {
        IpAddr::V4(_) => format!("{:<8} {} ", "ipv4", 2),
        IpAddr::V6(_) => format!("{:<8} {} ", "ipv6", 10),
    }
}

/// conntrack's ASSURED: TCP past the handshake, UDP with traffic after
/// the first reply.
fn assured(c: &ConnView) -> bool {
    if c.packets[1] == 0 {
        return false;
    }
    match c.protocol.as_str() {
        "TCP" => matches!(
            c.state.as_str(),
            "ESTABLISHED" | "FIN_WAIT" | "CLOSE_WAIT" | "LAST_ACK" | "TIME_WAIT"
        ),
        _ => c.packets[0] + c.packets[1] >= 3,
    }
}

/// conntrack's per-CPU statistics line (its fields, in its order), then
/// xvs's own counters: the table's other counters, the AF_XDP sockets'
/// and TX ring losses.
pub fn stats_line(x: &WorkerConntrack) -> String {
    use std::fmt::Write;
    const CONNTRACK: [&str; 8] = [
        "found",
        "invalid",
        "insert",
        "insert_failed",
        "drop",
        "early_drop",
        "expire",
        "delete",
    ];
    let t = &x.stats;
    let mut out = format!(
        "cpu={:<4}\tfound={} invalid={} insert={} insert_failed={} drop={} early_drop={} error=0 search_restart=0 clash_resolve=0 chaintoolong=0 entries={} expire={} delete={}",
        x.worker, t.found, t.invalid, t.insert, t.insert_failed, t.drop, t.early_drop,
        x.entries, t.expire, t.delete,
    );
    let own = t
        .named()
        .filter(|(k, _)| !CONNTRACK.contains(k))
        .chain(x.rings.named().filter(|&(k, _)| k != "xsk_tx_ring_empty"))
        .chain([("tx_ring_full", x.tx_ring_full)]);
    for (k, v) in own {
        let _ = write!(out, " {k}={v}");
    }
    out.push_str(" \n");
    out
}

/// An event as conntrack -E prints it (`None`: not a conntrack event).
pub fn event_line(e: &EventView, extended: bool) -> Option<String> {
    let tag = match kind(e) {
        NEW => "[NEW]",
        UPDATES => "[UPDATE]",
        _ => return None,
    };
    let (name, num) = match e.protocol.as_str() {
        "UDP" => ("udp", 17),
        "TCP" => ("tcp", 6),
        _ => return None,
    };
    let ep = |s: &str| s.parse::<SocketAddr>().ok();
    let (src, dst) = (ep(&e.src)?, ep(&e.dst)?);
    let backend = e.backend.as_deref().and_then(ep)?;
    let snat = e
        .snat
        .as_deref()
        .and_then(ep)
        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
    let mut s = format!("{tag:>9} ");
    if extended {
        s.push_str(&l3(src.ip()));
    }
    s.push_str(&format!("{name:<8} {num} "));
    let tuple = |a: SocketAddr, b: SocketAddr| {
        format!(
            "src={} dst={} sport={} dport={}",
            a.ip(),
            b.ip(),
            a.port(),
            b.port()
        )
    };
    if tag == "[NEW]" {
        s.push_str(&format!(
            "{} [UNREPLIED] {}",
            tuple(src, dst),
            tuple(backend, snat)
        ));
    } else {
        s.push_str(&format!("{} {}", tuple(src, dst), tuple(backend, snat)));
    }
    Some(s)
}

fn call(to: &Endpoint, m: Method, path: &str) -> Result<String, String> {
    request(to, m, path, None)?.ok()
}

impl Args {
    /// Whether `--mark` names a mark no flow has (a flow's mark is 0):
    /// then nothing matches, whatever the other selectors say. Every
    /// other selector is the server's to apply ([`Args::query`]).
    fn no_flow_marked(&self) -> bool {
        self.mark.is_some_and(|m| m != 0)
    }

    /// The API query of every selector given. Every one goes to the
    /// server, so that -D deletes exactly what -L lists (a selector left
    /// to the client side would make a delete take every flow the others
    /// match).
    fn query(&self) -> Vec<String> {
        let addr = |v: Option<IpAddr>| v.map(|a| a.to_string());
        let port = |v: Option<u16>| v.map(|p| p.to_string());
        [
            ("proto", self.proto.clone()),
            ("client", addr(self.src)),
            ("vip", addr(self.dst)),
            ("vport", port(self.dport)),
            ("backend", addr(self.reply_src)),
            ("cport", port(self.sport)),
            ("bport", port(self.reply_sport)),
            ("snat", addr(self.reply_dst)),
            ("snat_port", port(self.reply_dport)),
            ("state", self.state.clone()),
            ("family", self.family.clone()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some(format!("{k}={}", v?)))
        .collect()
    }

    /// The flows that match.
    fn flows(&self, to: &Endpoint) -> Result<Vec<ConnView>, String> {
        if self.no_flow_marked() {
            return Ok(Vec::new());
        }
        let mut q = self.query();
        q.push("size=1000000".into());
        let body = call(to, Method::GET, &format!("/v1/connections?{}", q.join("&")))?;
        let p: ConnPage = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        Ok(p.connections)
    }
}

/// Runs `xvsadm conntrack ARGS` (`argv` without `xvsadm`).
pub fn main(argv: &[String], to: &Endpoint, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => return super::cli::clap_exit(e, out, err),
    };
    // conntrack's exit statuses: 2 for a parameter problem, 1 for others.
    let shown = match check(&args) {
        Ok(x) => x,
        Err(e) => {
            let _ = writeln!(err, "{PROGNAME}: {e}");
            return 2;
        }
    };
    match run(&args, shown, to, out, err) {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "{PROGNAME}: {e}");
            1
        }
    }
}

/// What the parameters ask of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shown {
    /// `-o extended`: the layer 3 columns.
    extended: bool,
    /// `-o timestamp`: each event line prefixed with the event's time.
    timestamp: bool,
    /// `-e`: the event kinds -E keeps ([`NEW`], [`UPDATES`],
    /// [`DESTROY`] bits).
    events: u8,
}

/// conntrack's event kinds, as `-e` names them.
const NEW: u8 = 1;
const UPDATES: u8 = 2;
const DESTROY: u8 = 4;

/// The event kind `e` is as conntrack's ([`NEW`] or [`UPDATES`]); 0 for
/// an event conntrack has no line for (a drop).
fn kind(e: &EventView) -> u8 {
    match e.verdict.as_str() {
        "NEW" => NEW,
        "CLOSED" => UPDATES,
        _ => 0,
    }
}

/// conntrack's `-o timestamp` prefix for an event at `time_ms`
/// (`[%-.8ld.%-.6ld]` and a tab: seconds, then microseconds).
fn stamp(time_ms: u64) -> String {
    format!("[{:08}.{:06}]\t", time_ms / 1000, time_ms % 1000 * 1000)
}

/// The parameter checks; what the output is to show.
fn check(a: &Args) -> Result<Shown, String> {
    let commands = [a.list, a.delete, a.stats, a.flush, a.count, a.event];
    if commands.iter().filter(|x| **x).count() != 1 {
        return Err("exactly one of -L, -D, -F, -S, -C, -E".into());
    }
    if let Some(f) = a.family.as_deref() {
        if f != "ipv4" && f != "ipv6" {
            return Err(format!("`{f}' is not a family: ipv4 or ipv6"));
        }
    }
    let mut shown = Shown {
        extended: false,
        timestamp: false,
        events: NEW | UPDATES | DESTROY,
    };
    for f in a.output.iter().flat_map(|o| o.split(',')) {
        match f {
            "extended" => shown.extended = true,
            "timestamp" => shown.timestamp = true,
            _ => {
                return Err(format!(
                    "-o {f}: not supported by xvs: only `extended' and `timestamp'"
                ))
            }
        }
    }
    if let Some(m) = a.event_mask.as_deref() {
        if !a.event {
            return Err("-e: only with -E".into());
        }
        shown.events = 0;
        for k in m.split(',') {
            shown.events |= match k.to_ascii_uppercase().as_str() {
                "ALL" => NEW | UPDATES | DESTROY,
                "NEW" => NEW,
                "UPDATES" => UPDATES,
                "DESTROY" => DESTROY,
                _ => {
                    return Err(format!(
                        "-e {k}: not an event kind: ALL, NEW, UPDATES or DESTROY"
                    ))
                }
            };
        }
    }
    Ok(shown)
}

fn run(
    a: &Args,
    shown: Shown,
    to: &Endpoint,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), String> {
    let w = |out: &mut dyn Write, s: &str| out.write_all(s.as_bytes()).map_err(|e| e.to_string());
    if a.flush {
        let body = call(to, Method::POST, "/v1/flush")?;
        return w(out, &deleted(&body, a.json, err));
    }
    if a.stats {
        let body = call(to, Method::GET, "/v1/conntrack/stats")?;
        if a.json {
            return w(out, &body);
        }
        let stats: Vec<WorkerConntrack> = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        return w(out, &stats.iter().map(stats_line).collect::<String>());
    }
    if a.count {
        let n = a.flows(to)?.len();
        return w(out, &format!("{n}\n"));
    }
    if a.event {
        if shown.events & (NEW | UPDATES) == 0 {
            let _ = writeln!(
                err,
                "{PROGNAME}: xvs reports no DESTROY events (an entry that expires is not an event; a flow's close is an [UPDATE])"
            );
        }
        let mut pending = String::new();
        let follow = "/v1/events?last=0&follow=true";
        return stream(to, follow, |chunk| {
            pending.push_str(chunk);
            while let Some(i) = pending.find('\n') {
                let text: String = pending.drain(..=i).collect();
                let Ok(e) = serde_json::from_str::<EventView>(text.trim()) else {
                    if let Ok(l) = serde_json::from_str::<LostLine>(text.trim()) {
                        let _ = write!(err, "{}", enobufs(&l.lost_events));
                    }
                    continue;
                };
                // The mask passes over the kinds it leaves out; events
                // conntrack has no kind for go on to --json.
                let k = kind(&e);
                if !event_matches(a, &e) || (k != 0 && k & shown.events == 0) {
                    continue;
                }
                let line = if a.json {
                    Some(text.trim().to_owned())
                } else {
                    event_line(&e, shown.extended).map(|l| match shown.timestamp {
                        true => stamp(e.time_ms) + &l,
                        false => l,
                    })
                };
                if let Some(l) = line {
                    let _ = writeln!(out, "{l}");
                    let _ = out.flush();
                }
            }
        });
    }
    if a.list {
        let flows = a.flows(to)?;
        if a.json {
            return w(
                out,
                &(serde_json::to_string_pretty(&flows).map_err(|e| e.to_string())? + "\n"),
            );
        }
        let mut s = String::new();
        for c in &flows {
            s.push_str(&line(c, shown.extended));
            s.push('\n');
        }
        w(out, &s)?;
        let _ = writeln!(
            err,
            "{PROGNAME} v{} (xvs): {} flow entries have been shown.",
            env!("CARGO_PKG_VERSION"),
            flows.len()
        );
        return Ok(());
    }
    // -D: what -L would list, and nothing under another mark.
    if a.no_flow_marked() {
        return w(out, &deleted(r#"{"deleted":0}"#, a.json, err));
    }
    let q = a.query();
    let body = call(
        to,
        Method::DELETE,
        &format!("/v1/connections?{}", q.join("&")),
    )?;
    w(out, &deleted(&body, a.json, err))
}

/// What conntrack(8) -E prints on stderr when the kernel drops events
/// (ENOBUFS on its netlink socket), then what xvs lost and where.
fn enobufs(l: &LostEvents) -> String {
    let at = match l.worker {
        Some(w) => format!("worker {w}'s event queue was full"),
        None => "this reader fell behind".into(),
    };
    format!(
        "WARNING: We have hit ENOBUFS! We are losing events.\n{PROGNAME} (xvs): {} events lost: {at}.\n",
        l.num_events_lost
    )
}

fn event_matches(a: &Args, e: &EventView) -> bool {
    let ep = |s: &str| s.parse::<SocketAddr>().ok();
    let (src, dst) = (ep(&e.src), ep(&e.dst));
    let backend = e.backend.as_deref().and_then(ep);
    let snat = e.snat.as_deref().and_then(ep);
    // Each selector as the server applies it to -L's flows (events
    // come unfiltered from the stream).
    let addr = |want: Option<IpAddr>, at: Option<SocketAddr>| {
        want.is_none_or(|w| at.is_some_and(|x| x.ip() == w))
    };
    let port = |want: Option<u16>, at: Option<SocketAddr>| {
        want.is_none_or(|w| at.is_some_and(|x| x.port() == w))
    };
    a.proto
        .as_deref()
        .is_none_or(|p| p.eq_ignore_ascii_case(&e.protocol))
        && addr(a.src, src)
        && addr(a.dst, dst)
        && port(a.sport, src)
        && port(a.dport, dst)
        && addr(a.reply_src, backend)
        && addr(a.reply_dst, snat)
        && port(a.reply_sport, backend)
        && port(a.reply_dport, snat)
        && !a.no_flow_marked()
        // `check` let only `ipv4` and `ipv6` through.
        && a.family
            .as_deref()
            .is_none_or(|f| src.is_some_and(|x| x.is_ipv6() == (f == "ipv6")))
}

/// conntrack's line for a delete or flush (on stderr, as conntrack's), or
/// the JSON on stdout; returns what goes to stdout.
fn deleted(body: &str, json: bool, err: &mut dyn Write) -> String {
    if json {
        return body.to_owned();
    }
    let n = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["deleted"].as_u64())
        .unwrap_or(0);
    let _ = writeln!(
        err,
        "{PROGNAME} v{} (xvs): {n} flow entries have been deleted.",
        env!("CARGO_PKG_VERSION")
    );
    String::new()
}

/// The subcommand's clap definition, as `xvsadm conntrack` reads it (for the
/// man page and the shell completions).
pub fn command() -> clap::Command {
    <Args as clap::CommandFactory>::command().name("conntrack")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(state: &str, packets: [u32; 2]) -> ConnView {
        ConnView {
            protocol: "TCP".into(),
            expires: 899,
            state: state.into(),
            client: "198.18.0.2:40000".parse().unwrap(),
            vip: "198.19.0.1:80".parse().unwrap(),
            backend: "198.18.1.10:8080".parse().unwrap(),
            snat: "198.18.1.2:1024".parse().unwrap(),
            packets,
            template: false,
        }
    }

    /// Every selector of conntrack's goes into the API's query (the one
    /// -D sends), so that a delete takes exactly what -L lists.
    /// `-e` and `-o` as conntrack parses them: masks by name in any case,
    /// comma-separated; `-e` only with `-E`; a bad name refused.
    #[test]
    fn event_masks_and_output_flags_parse_as_conntrack_s() {
        let shown = |argv: &[&str]| {
            let a = Args::try_parse_from([&["conntrack"], argv].concat()).unwrap();
            check(&a)
        };
        let all = NEW | UPDATES | DESTROY;
        let plain = Shown {
            extended: false,
            timestamp: false,
            events: all,
        };
        assert_eq!(shown(&["-E"]), Ok(plain));
        assert_eq!(
            shown(&["-E", "-e", "new"]),
            Ok(Shown {
                events: NEW,
                ..plain
            })
        );
        assert_eq!(
            shown(&["-E", "-e", "NEW,DESTROY"]),
            Ok(Shown {
                events: NEW | DESTROY,
                ..plain
            })
        );
        assert_eq!(shown(&["-E", "--event-mask", "ALL"]), Ok(plain));
        assert_eq!(
            shown(&["-E", "-o", "timestamp,extended"]),
            Ok(Shown {
                extended: true,
                timestamp: true,
                ..plain
            })
        );
        assert_eq!(shown(&["-L", "-e", "NEW"]), Err("-e: only with -E".into()));
        assert!(shown(&["-E", "-e", "NEW,BOGUS"])
            .unwrap_err()
            .contains("BOGUS"));
        assert!(shown(&["-E", "-o", "xml"]).unwrap_err().contains("xml"));
    }

    /// conntrack's event timestamp: seconds, a dot, six digits of
    /// microseconds, a tab; and the kinds `-e` selects by.
    #[test]
    fn event_stamps_and_kinds_are_conntrack_s() {
        assert_eq!(stamp(1_733_356_800_042), "[1733356800.042000]\t");
        assert_eq!(stamp(5), "[00000000.005000]\t");
        let e = EventView::sample;
        assert_eq!(
            [kind(&e("NEW")), kind(&e("CLOSED")), kind(&e("DROPPED"))],
            [NEW, UPDATES, 0]
        );
    }

    #[test]
    fn every_selector_reaches_the_query() {
        let argv = [
            "conntrack",
            "-D",
            "-p",
            "udp",
            "-s",
            "198.18.0.2",
            "-d",
            "198.19.0.1",
            "--sport",
            "5300",
            "--dport",
            "53",
            "-r",
            "198.18.1.10",
            "-q",
            "198.18.1.2",
            "--reply-port-src",
            "53",
            "--reply-port-dst",
            "1024",
            "--state",
            "UDP",
            "-f",
            "ipv4",
        ];
        let a = Args::try_parse_from(argv).unwrap();
        assert_eq!(
            a.query().join("&"),
            "proto=udp&client=198.18.0.2&vip=198.19.0.1&vport=53&backend=198.18.1.10&\
             cport=5300&bport=53&snat=198.18.1.2&snat_port=1024&state=UDP&family=ipv4"
        );
    }

    #[test]
    fn list_lines_are_libnetfilter_conntrack_s() {
        assert_eq!(
            line(&flow("ESTABLISHED", [5, 4]), false),
            "tcp      6 899 ESTABLISHED src=198.18.0.2 dst=198.19.0.1 sport=40000 dport=80 src=198.18.1.10 dst=198.18.1.2 sport=8080 dport=1024 [ASSURED] mark=0 use=1"
        );
        assert_eq!(
            line(&flow("SYN_RECV", [1, 0]), true),
            "ipv4     2 tcp      6 899 SYN_RECV src=198.18.0.2 dst=198.19.0.1 sport=40000 dport=80 [UNREPLIED] src=198.18.1.10 dst=198.18.1.2 sport=8080 dport=1024 mark=0 use=1"
        );
        let mut udp = flow("UDP", [1, 1]);
        udp.protocol = "UDP".into();
        udp.expires = 29;
        assert_eq!(
            line(&udp, false),
            "udp      17 29 src=198.18.0.2 dst=198.19.0.1 sport=40000 dport=80 src=198.18.1.10 dst=198.18.1.2 sport=8080 dport=1024 mark=0 use=1"
        );
        udp.packets = [2, 1];
        assert!(line(&udp, false).ends_with("[ASSURED] mark=0 use=1"));
    }

    /// Lost events get conntrack(8)'s ENOBUFS warning (on stderr), with
    /// how many and where.
    #[test]
    fn lost_events_get_conntrack_s_enobufs_warning() {
        let queue = LostEvents {
            source: "WORKER_QUEUE".into(),
            num_events_lost: 40,
            worker: Some(1),
        };
        assert_eq!(
            enobufs(&queue),
            "WARNING: We have hit ENOBUFS! We are losing events.\n\
             xvsadm conntrack (xvs): 40 events lost: worker 1's event queue was full.\n"
        );
        assert!(
            enobufs(&LostEvents::behind(3)).ends_with("3 events lost: this reader fell behind.\n")
        );
    }

    #[test]
    fn events_are_conntrack_s() {
        let e = EventView::sample("NEW");
        assert_eq!(
            event_line(&e, false).unwrap(),
            "    [NEW] tcp      6 src=198.18.0.2 dst=198.19.0.1 sport=40000 dport=80 [UNREPLIED] src=198.18.1.10 dst=198.18.1.2 sport=8080 dport=1024"
        );
        let closed = EventView {
            verdict: "CLOSED".into(),
            ..e.clone()
        };
        assert_eq!(
            event_line(&closed, false).unwrap(),
            " [UPDATE] tcp      6 src=198.18.0.2 dst=198.19.0.1 sport=40000 dport=80 src=198.18.1.10 dst=198.18.1.2 sport=8080 dport=1024"
        );
        let dropped = EventView {
            verdict: "DROPPED".into(),
            ..e
        };
        assert_eq!(event_line(&dropped, false), None);
    }

    /// -E's selectors as -L's: the family by the flow's addresses (IPv6
    /// events for `-f ipv6`), each end's port and the reply's ends.
    #[test]
    fn events_are_selected_as_flows_are() {
        let v4 = EventView {
            protocol: "UDP".into(),
            src: "198.18.0.2:5300".into(),
            dst: "198.19.0.1:53".into(),
            backend: Some("198.18.1.10:53".into()),
            ..EventView::sample("NEW")
        };
        let v6 = EventView {
            src: "[2001:2::2]:5300".into(),
            dst: "[2001:2:ff::1]:53".into(),
            backend: Some("[2001:2:0:1::10]:53".into()),
            snat: Some("[2001:2:0:1::100]:1024".into()),
            ..v4.clone()
        };
        let picks = |args: &[&str]| {
            let a = Args::try_parse_from([&["conntrack", "-E"], args].concat()).unwrap();
            [event_matches(&a, &v4), event_matches(&a, &v6)]
        };
        assert_eq!(picks(&[]), [true, true]);
        assert_eq!(picks(&["-f", "ipv6"]), [false, true]);
        assert_eq!(picks(&["-f", "ipv4"]), [true, false]);
        assert_eq!(picks(&["--sport", "5300"]), [true, true]);
        assert_eq!(picks(&["--sport", "5301"]), [false, false]);
        assert_eq!(picks(&["-q", "198.18.1.2"]), [true, false]);
        assert_eq!(
            picks(&["--reply-port-dst", "1024", "-p", "udp"]),
            [true, true]
        );
        assert_eq!(picks(&["--mark", "1"]), [false, false]);
    }

    #[test]
    fn stats_start_with_conntrack_s_fields() {
        let x = WorkerConntrack {
            worker: 1,
            entries: 2,
            stats: xvs_conntrack::Stats {
                found: 3,
                insert: 4,
                insert_failed: 5,
                invalid: 6,
                drop: 7,
                early_drop: 8,
                delete: 9,
                expire: 10,
                reclaim: 11,
                ..Default::default()
            },
            rings: Default::default(),
            tx_ring_full: 12,
        };
        assert!(stats_line(&x).starts_with(
            "cpu=1   \tfound=3 invalid=6 insert=4 insert_failed=5 drop=7 early_drop=8 error=0 search_restart=0 clash_resolve=0 chaintoolong=0 entries=2 expire=10 delete=9 "
        ));
        let line = stats_line(&x);
        assert!(line.contains(" reclaim=11 "), "{line}");
        assert!(line.contains(" xsk_rx_dropped=0 "), "{line}");
        assert!(line.ends_with(" tx_ring_full=12 \n"), "{line}");
    }
}
