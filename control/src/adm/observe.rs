//! `xvsadm observe`: flow events (new, closed, dropped with reason), like
//! `hubble observe`.

use std::io::Write;

use clap::{ArgAction, Parser};
use hyper::Method;

use super::client::{request, stream, Endpoint};

#[derive(Debug, Parser)]
#[command(
    name = "xvsadm observe",
    about = "Flow events (new, closed, dropped with reason), like hubble observe"
)]
struct Args {
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
}

/// Runs `xvsadm observe ARGS` (`argv` without `xvsadm`).
pub fn main(argv: &[String], to: &Endpoint, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let o = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => return super::cli::clap_exit(e, out, err),
    };
    match run(&o, to, out) {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            2
        }
    }
}

fn run(o: &Args, to: &Endpoint, out: &mut dyn Write) -> Result<(), String> {
    let mut q = vec![format!("last={}", o.last)];
    if let Some(v) = &o.verdict {
        q.push(format!("verdict={v}"));
    }
    if let Some(s) = &o.service {
        // An IPv6 service is `[addr]:port`: brackets are not allowed
        // bare in a query.
        q.push(format!(
            "service={}",
            s.replace('[', "%5B").replace(']', "%5D")
        ));
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
        stream(to, &path, |c| print(c, out))?;
    } else {
        let body = request(to, Method::GET, &path, None)?.ok()?;
        print(&body, out);
    }
    failed.map_or(Ok(()), Err)
}

/// The subcommand's clap definition, as `xvsadm observe` reads it (for the
/// man page and the shell completions).
pub fn command() -> clap::Command {
    <Args as clap::CommandFactory>::command().name("observe")
}
