//! `xvsadm observe`: flow events (new, closed, dropped with reason), like
//! `hubble observe`, with its filters: `--verdict`, `--ip`, `--from-ip`,
//! `--to-ip`, `--port`, `--from-port`, `--to-port`, `--protocol` (and
//! xvs's `--service`), applied by the server so that `--last N` counts
//! the events that pass; `-o json` as its `--json`.

use std::io::Write;

use clap::{ArgAction, Parser};
use hyper::Method;

use super::client::{request, stream, Endpoint};
use crate::events::EventFilter;

#[derive(Debug, Parser)]
#[command(
    name = "xvsadm observe",
    about = "Flow events (new, closed, dropped with reason), like hubble observe"
)]
struct Args {
    #[command(flatten)]
    filter: EventFilter,
    /// How many past events to show first.
    #[arg(long, default_value_t = 20)]
    last: usize,
    /// Keep printing new events (until interrupted). Events that could
    /// not be delivered are counted in `EVENTS LOST:` lines, as hubble's:
    /// WORKER_QUEUE (a worker's event queue was full) or FOLLOWER_QUEUE
    /// (this reader fell behind).
    #[arg(short = 'f', long, action = ArgAction::SetTrue)]
    follow: bool,
    /// Print the events as JSON lines.
    #[arg(long, action = ArgAction::SetTrue)]
    json: bool,
    /// Output format, as hubble's: compact (one line an event, the
    /// default) or json (as --json).
    #[arg(short = 'o', long = "output", value_parser = ["compact", "json"])]
    output: Option<String>,
}

impl Args {
    /// Whether the events are printed as JSON lines.
    fn json(&self) -> bool {
        self.json || self.output.as_deref() == Some("json")
    }
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
    // What the server would refuse, refused here with the same words.
    o.filter.check()?;
    let mut q = vec![format!("last={}", o.last)];
    let filters = serde_urlencoded::to_string(&o.filter).map_err(|e| e.to_string())?;
    if !filters.is_empty() {
        q.push(filters);
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
            let text = if o.json() {
                line
            } else {
                match compact(&line) {
                    Ok(text) => text,
                    Err(e) => {
                        failed = Some(e);
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

/// One line of the stream as hubble's compact output shows it: an event,
/// or `EVENTS LOST: ...` for events the server could not deliver.
fn compact(line: &str) -> Result<String, String> {
    let line = line.trim();
    match serde_json::from_str::<crate::events::EventView>(line) {
        Ok(e) => Ok(e.line() + "\n"),
        Err(e) => match serde_json::from_str::<crate::events::LostLine>(line) {
            Ok(l) => Ok(l.lost_events.line() + "\n"),
            Err(_) => Err(e.to_string()),
        },
    }
}

/// The subcommand's clap definition, as `xvsadm observe` reads it (for the
/// man page and the shell completions).
pub fn command() -> clap::Command {
    <Args as clap::CommandFactory>::command().name("observe")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hubble's `-o json` is `--json`; `-o compact` and no flag are the
    /// line format; another format is refused.
    #[test]
    fn output_formats_are_hubble_s() {
        let json =
            |argv: &[&str]| Args::try_parse_from([&["observe"], argv].concat()).map(|a| a.json());
        let formats: [&[&str]; 5] = [
            &[],
            &["-o", "compact"],
            &["-o", "json"],
            &["--output", "json"],
            &["--json"],
        ];
        assert_eq!(
            formats.map(|f| json(f).unwrap()),
            [false, false, true, true, true]
        );
        assert!(json(&["-o", "table"]).is_err());
    }

    /// Lost events show as hubble's `EVENTS LOST:` line between the
    /// events; a line that is neither is an error.
    #[test]
    fn lost_events_are_shown_in_the_stream() {
        let lost = r#"{"lost_events":{"source":"WORKER_QUEUE","num_events_lost":12,"worker":1}}"#;
        assert_eq!(
            compact(lost).unwrap(),
            "EVENTS LOST: WORKER_QUEUE worker(1) 12\n"
        );
        let e = crate::events::EventView::sample("NEW");
        let line = serde_json::to_string(&e).unwrap() + "\n";
        assert_eq!(compact(&line).unwrap(), e.line() + "\n");
        assert!(compact(r#"{"lost":1}"#).is_err());
    }
}
