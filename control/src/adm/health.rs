//! `xvsadm health`: the real servers' health checks, one line each
//! (service, backend, kind and port, state, consecutive results, probes,
//! the last failure), as keepalived's checkers would report them.

use std::io::Write;

use clap::{ArgAction, Parser};
use hyper::Method;

use super::client::{request, Endpoint};
use crate::health::CheckView;

#[derive(Debug, Parser)]
#[command(name = "xvsadm health", about = "The real servers' health checks")]
struct Args {
    /// Print the API's JSON.
    #[arg(long, action = ArgAction::SetTrue)]
    json: bool,
}

/// Runs `xvsadm health ARGS` (`argv` without `xvsadm`).
pub fn main(argv: &[String], to: &Endpoint, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let a = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => return super::cli::clap_exit(e, out, err),
    };
    let body = match request(to, Method::GET, "/v1/health", None).and_then(|r| r.ok()) {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            return 2;
        }
    };
    if a.json {
        let _ = out.write_all(body.as_bytes());
        return 0;
    }
    match serde_json::from_str::<Vec<CheckView>>(&body) {
        Ok(checks) => {
            let _ = out.write_all(table(&checks).as_bytes());
            0
        }
        Err(e) => {
            let _ = writeln!(err, "unreadable answer: {e}");
            2
        }
    }
}

/// The listing.
pub fn table(checks: &[CheckView]) -> String {
    let mut s = format!(
        "{:<28} {:<28} {:<10} {:<5} {:>4} {:>4} {:>8}  {}\n",
        "Service", "RemoteAddress:Port", "Check", "State", "Ok", "Fail", "Probes", "LastError"
    );
    for c in checks {
        s.push_str(&format!(
            "{:<28} {:<28} {:<10} {:<5} {:>4} {:>4} {:>8}  {}\n",
            c.service,
            c.backend,
            format!("{}:{}", c.kind, c.port),
            c.state,
            c.successes,
            c.failures,
            c.probes,
            c.last_error.as_deref().unwrap_or("-")
        ));
    }
    s
}

/// The subcommand's clap definition, as `xvsadm health` reads it (for the
/// man page and the shell completions).
pub fn command() -> clap::Command {
    <Args as clap::CommandFactory>::command().name("health")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_check_with_its_state_and_last_error() {
        let c = |backend: &str, state: &str, err: Option<&str>| CheckView {
            service: "TCP 198.19.0.1:80".into(),
            backend: backend.into(),
            kind: "http".into(),
            port: 8080,
            state: state.into(),
            successes: u32::from(err.is_none()) * 5,
            failures: u32::from(err.is_some()) * 3,
            probes: 12,
            last_error: err.map(str::to_owned),
        };
        let t = table(&[
            c("198.18.1.10:8080", "up", None),
            c(
                "198.18.1.11:8080",
                "down",
                Some("GET /: status 503, expected 200"),
            ),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("Service"));
        assert!(
            lines[1].contains("198.18.1.10:8080")
                && lines[1].contains(" up ")
                && lines[1].ends_with("  -")
        );
        assert!(
            lines[2].contains(" down ") && lines[2].ends_with("GET /: status 503, expected 200")
        );
    }
}
