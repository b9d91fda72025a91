//! Runs an ipvsadm command line ([`Command`]) against the
//! admin API, with ipvsadm's outputs, messages and exit statuses:
//! 255 when the table refuses (`Service already exists`, `No such
//! service`, `Service not defined`, `Destination already exists`, `No
//! such destination`, `Scheduler or persistence engine not found`), 1
//! for `-L` of a missing service, 2 when xvs cannot be reached.
//!
//! `-R` reads ipvsadm rules (what `-S` prints, or a file written by
//! ipvsadm, names included) and applies them as one batch: every line is
//! checked first, then the whole file is applied or none of it, and a
//! refusal names its line.

use std::io::BufRead;
use std::net::{IpAddr, Ipv4Addr};

use hyper::Method;
use xvs_config::api::{BackendSpec, EditSpec, ServiceRef, ServiceSpec};
use xvs_config::{Encap, ForwardMethod};

use super::client::{request, Endpoint};
use super::format::{connections, list, list_service, save, timeout};
use super::ipvs_opts::{
    optc, parse, unsupported, Cmd, Command, Exit, Fwd, Invocation, Service, SCHED1, SCHED2, SCHED3,
    TUN_NAMES,
};
use super::names::{Names, Numeric, System};
use crate::api::ConnPage;
use crate::view::{Listing, TimeoutView};

/// What a command prints on stdout, or how it fails.
pub type Outcome = Result<String, Exit>;

/// Exit status of a refusal by the table (ipvsadm returns -1).
pub const EXIT_TABLE: u8 = 255;
/// Exit status of `-L` for a service that does not exist.
pub const EXIT_NO_LISTED_SERVICE: u8 = 1;
/// Exit status when the daemon cannot be reached or answers nonsense.
pub const EXIT_UNREACHABLE: u8 = 2;

fn unreachable(message: String) -> Exit {
    Exit {
        status: EXIT_UNREACHABLE,
        message,
    }
}

/// A refused call: the API's `kind` and message.
struct Refusal {
    kind: String,
    message: String,
    edit: Option<usize>,
}

/// Calls the API: the body on success; a refusal, or an `Exit` when xvs
/// cannot be reached.
fn call(
    to: &Endpoint,
    m: Method,
    path: &str,
    body: Option<String>,
) -> Result<Result<String, Refusal>, Exit> {
    let a = request(to, m, path, body).map_err(unreachable)?;
    if (200..300).contains(&a.status) {
        return Ok(Ok(a.body));
    }
    let v: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_default();
    Ok(Err(Refusal {
        kind: v["kind"].as_str().unwrap_or("invalid").to_owned(),
        message: v["error"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| a.body.trim().to_owned()),
        edit: v["edit"].as_u64().map(|i| i as usize),
    }))
}

/// ipvsadm's `ipvs_strerror` for what the table said to command `cmd`;
/// xvs's own refusals (rules IPVS does not have) keep xvs's words.
fn strerror(cmd: Cmd, r: &Refusal) -> String {
    let dest_cmd = matches!(cmd, Cmd::AddDest | Cmd::EditDest | Cmd::DelDest);
    match r.kind.as_str() {
        "service_exists" => "Service already exists".into(),
        "no_scheduler" => "Scheduler or persistence engine not found".into(),
        "no_service" if dest_cmd => "Service not defined".into(),
        "no_service" => "No such service".into(),
        "destination_exists" => "Destination already exists".into(),
        "no_destination" => "No such destination".into(),
        _ => r.message.clone(),
    }
}

fn table(cmd: Cmd, r: &Refusal) -> Exit {
    Exit {
        status: EXIT_TABLE,
        message: strerror(cmd, r),
    }
}

fn get<T: serde::de::DeserializeOwned>(to: &Endpoint, path: &str) -> Result<(T, String), Exit> {
    let body = call(to, Method::GET, path, None)?.map_err(|r| unreachable(r.message))?;
    let v = serde_json::from_str(&body).map_err(|e| unreachable(format!("{path}: {e}")))?;
    Ok((v, body))
}

/// The service reference of a command (`-t`/`-u`).
fn service_ref(c: &Command) -> Option<ServiceRef> {
    match c.service? {
        Service::Addr(p, a, port) => Some(ServiceRef {
            protocol: p.name().to_owned(),
            vip: a,
            port,
        }),
        Service::Fwmark(_) => None,
    }
}

fn path_of(r: &ServiceRef) -> String {
    format!("/v1/services/{}/{}/{}", r.protocol, r.vip, r.port)
}

/// `-b`'s bits as the config file names them.
fn flags(c: &Command) -> Result<Vec<String>, Exit> {
    if c.sched_flags & SCHED3 != 0 {
        return Err(Exit {
            status: 2,
            message: "-b flag-3: not supported by xvs: no scheduler uses it".into(),
        });
    }
    let mut out = Vec::new();
    if c.sched_flags & SCHED1 != 0 {
        out.push("fallback".to_owned());
    }
    if c.sched_flags & SCHED2 != 0 {
        out.push("port".to_owned());
    }
    Ok(out)
}

/// The edit a table-changing command stands for.
fn edit_of(c: &Command) -> Result<EditSpec, Exit> {
    let svc = service_ref(c);
    let need = || {
        svc.clone().ok_or_else(|| Exit {
            status: 2,
            message: "a service address (-t or -u) is needed".into(),
        })
    };
    let spec = |s: ServiceRef| -> Result<ServiceSpec, Exit> {
        Ok(ServiceSpec {
            protocol: s.protocol,
            vip: s.vip,
            port: s.port,
            scheduler: c.scheduler.clone(),
            persistence: c.persistent,
            // ipvsadm keeps -M for a non-persistent service, where it
            // means nothing: only a persistent one carries it.
            netmask: c.persistent.map(|_| match (s.vip, c.netmask) {
                // -M not given (or given before -t): the family's default.
                (IpAddr::V6(_), IpAddr::V4(_)) => "128".to_owned(),
                (_, m) => m.to_string(),
            }),
            flags: flags(c)?,
            source_ranges: Vec::new(),
            maglev_table_size: None,
            name: None,
            backends: Vec::new(),
        })
    };
    let backend = || {
        let (a, port) = c.dest.unwrap_or((IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
        BackendSpec {
            address: Some(a),
            port: Some(port),
            weight: Some(c.weight),
            forward: Some(match c.fwd {
                Fwd::Masq => ForwardMethod::Masq,
                Fwd::Droute => ForwardMethod::Route,
                Fwd::Tunnel => ForwardMethod::Tunnel,
            }),
            encap: (c.fwd == Fwd::Tunnel).then(|| {
                if TUN_NAMES[c.tun_type] == "gue" {
                    Encap::Gue
                } else {
                    Encap::Ipip
                }
            }),
        }
    };
    Ok(match c.cmd {
        Cmd::Add => EditSpec::AddService {
            service: spec(need()?)?,
        },
        Cmd::Edit => EditSpec::EditService {
            service: spec(need()?)?,
        },
        Cmd::Del => EditSpec::DeleteService { service: need()? },
        Cmd::Flush => EditSpec::Clear,
        Cmd::AddDest => EditSpec::AddBackend {
            service: need()?,
            backend: backend(),
        },
        Cmd::EditDest => EditSpec::EditBackend {
            service: need()?,
            backend: backend(),
        },
        Cmd::DelDest => {
            let b = backend();
            EditSpec::DeleteBackend {
                service: need()?,
                address: b.address.unwrap_or(Ipv4Addr::UNSPECIFIED.into()),
                port: b.port.unwrap_or(0),
            }
        }
        other => {
            return Err(Exit {
                status: 2,
                message: format!(
                    "--{}: only table edits (-A -E -D -C -a -e -d) are restored",
                    other.name()
                ),
            })
        }
    })
}

/// Sends one table edit through its own path (as the single-edit API has
/// it), so a refusal is the one IPVS would give for that command.
fn send_edit(to: &Endpoint, c: &Command, e: EditSpec, json: bool) -> Outcome {
    fn body(v: &impl serde::Serialize) -> Option<String> {
        serde_json::to_string(v).ok()
    }
    let (m, path, b) = match &e {
        EditSpec::AddService { service } => {
            (Method::POST, "/v1/services".to_owned(), body(service))
        }
        EditSpec::EditService { service } => {
            let r = ServiceRef {
                protocol: service.protocol.clone(),
                vip: service.vip,
                port: service.port,
            };
            (Method::PUT, path_of(&r), body(service))
        }
        EditSpec::DeleteService { service } => (Method::DELETE, path_of(service), None),
        EditSpec::Clear => (Method::DELETE, "/v1/services".to_owned(), None),
        EditSpec::AddBackend { service, backend } => (
            Method::POST,
            format!("{}/backends", path_of(service)),
            body(backend),
        ),
        EditSpec::EditBackend { service, backend } => (
            Method::PUT,
            format!(
                "{}/backends/{}/{}",
                path_of(service),
                backend.address.unwrap_or(Ipv4Addr::UNSPECIFIED.into()),
                backend.port.unwrap_or(0)
            ),
            body(backend),
        ),
        EditSpec::DeleteBackend {
            service,
            address,
            port,
        } => (
            Method::DELETE,
            format!("{}/backends/{address}/{port}", path_of(service)),
            None,
        ),
    };
    let answer = call(to, m, &path, b)?.map_err(|r| table(c.cmd, &r))?;
    Ok(if json { answer } else { String::new() })
}

/// Runs `c`. `input` is `-R`'s standard input; `program` is `argv[0]`
/// (for the messages that name it).
pub fn run(
    to: &Endpoint,
    c: &Command,
    json: bool,
    input: &mut dyn BufRead,
    program: &str,
) -> Outcome {
    if let Some(e) = unsupported(c) {
        return Err(e);
    }
    let names: &dyn Names = if c.format.numeric { &Numeric } else { &System };
    match c.cmd {
        Cmd::List => list_cmd(to, c, json, names),
        Cmd::Save => {
            let (l, body): (Listing, String) = get(to, "/v1/services")?;
            Ok(if json {
                body
            } else {
                save(&l, c.format, names)
            })
        }
        Cmd::Restore => restore(to, input, json, program),
        Cmd::Zero => {
            let path = match service_ref(c) {
                Some(r) => format!("{}/zero", path_of(&r)),
                None => "/v1/zero".to_owned(),
            };
            let body = call(to, Method::POST, &path, None)?.map_err(|r| table(c.cmd, &r))?;
            Ok(if json { body } else { String::new() })
        }
        Cmd::Timeout => {
            let [tcp, tcpfin, udp] = c.timeouts.unwrap_or_default();
            let b = serde_json::json!({ "tcp": tcp, "tcpfin": tcpfin, "udp": udp });
            let body = call(to, Method::PUT, "/v1/timeouts", Some(b.to_string()))?
                .map_err(|r| table(c.cmd, &r))?;
            Ok(if json { body } else { String::new() })
        }
        Cmd::SetTimeout => {
            let (state, secs) = c.set_timeout.clone().unwrap_or_default();
            let secs: u32 = secs.parse().map_err(|_| Exit {
                status: 2,
                message: format!("--set-timeout {state} {secs}: seconds must be a number"),
            })?;
            let b = serde_json::json!({ state: secs });
            let body = call(to, Method::PUT, "/v1/timeouts/states", Some(b.to_string()))?
                .map_err(|r| table(c.cmd, &r))?;
            Ok(if json { body } else { String::new() })
        }
        Cmd::Reload => {
            let body = call(to, Method::POST, "/v1/reload", None)?.map_err(|r| table(c.cmd, &r))?;
            if json {
                return Ok(body);
            }
            let a: crate::engine::Applied =
                serde_json::from_str(&body).map_err(|e| unreachable(e.to_string()))?;
            Ok(format!(
                "applied: {} added, {} changed, {} removed, {} unchanged\n",
                a.added, a.changed, a.removed, a.unchanged
            ))
        }
        Cmd::StartDaemon | Cmd::StopDaemon => Err(unsupported(c).unwrap_or(Exit {
            status: 2,
            message: "no sync daemon".into(),
        })),
        _ => {
            let e = edit_of(c)?;
            send_edit(to, c, e, json)
        }
    }
}

fn list_cmd(to: &Endpoint, c: &Command, json: bool, names: &dyn Names) -> Outcome {
    if c.has(optc::CONNECTION) {
        // The templates too: ipvsadm reads the kernel's whole connection
        // table, where a persistent service's templates sit beside its
        // connections (state NONE, client port 0).
        let (p, body): (ConnPage, String) = get(to, "/v1/connections?size=1000000&templates=true")?;
        return Ok(if json {
            body
        } else {
            connections(&p.connections, names)
        });
    }
    if c.has(optc::TIMEOUT) {
        let (t, body): (TimeoutView, String) = get(to, "/v1/timeouts")?;
        return Ok(if json { body } else { timeout(&t) });
    }
    if c.has(optc::DAEMON) {
        // Without [cluster.sync] the answer is null and, as ipvsadm
        // without a daemon, nothing is printed.
        let (s, body): (Option<xvs_dataplane::runtime::SyncState>, String) = get(to, "/v1/sync")?;
        return Ok(if json {
            body
        } else {
            super::sync::daemon(s.as_ref())
        });
    }
    let (mut l, body): (Listing, String) = get(to, "/v1/services")?;
    if let Some(r) = service_ref(c) {
        let found = l
            .services
            .iter()
            .find(|s| s.vip == r.vip && s.port == r.port && s.protocol == r.protocol);
        let Some(s) = found else {
            return Err(Exit {
                status: EXIT_NO_LISTED_SERVICE,
                message: "No such service".into(),
            });
        };
        if json {
            let s = s.clone();
            l.services = vec![s];
            return Ok(serde_json::to_string_pretty(&l).unwrap_or_default() + "\n");
        }
        return Ok(list_service(s, c.format, names));
    }
    Ok(if json {
        body
    } else {
        list(&l, c.format, names)
    })
}

/// ipvsadm's `config_stream_read`: the words of each line, without the
/// word `ipvsadm` (nor `xvsadm`); lines without words are skipped. A line
/// whose first word starts with `#` is a comment (ipvsadm 1.31 would try
/// to run it).
fn restore_lines(input: &mut dyn BufRead) -> Result<Vec<(usize, Vec<String>)>, Exit> {
    let mut out = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| Exit {
            status: 2,
            message: format!("standard input: {e}"),
        })?;
        let words: Vec<String> = line
            .split([' ', '\t', '\r'])
            .filter(|w| !w.is_empty() && *w != "ipvsadm" && *w != "xvsadm")
            .map(str::to_owned)
            .collect();
        if words.is_empty() || words[0].starts_with('#') {
            continue;
        }
        out.push((i + 1, words));
    }
    Ok(out)
}

/// `-R`: every line checked, then all applied as one batch, or none.
fn restore(to: &Endpoint, input: &mut dyn BufRead, json: bool, program: &str) -> Outcome {
    let mut edits = Vec::new();
    let mut cmds = Vec::new();
    for (n, words) in restore_lines(input)? {
        let at = |e: Exit| Exit {
            status: e.status,
            message: format!("line {n}: {}", e.message),
        };
        let argv: Vec<String> = std::iter::once(program.to_owned()).chain(words).collect();
        let c = match parse(&argv, true, &System).map_err(at)? {
            Invocation::Run(c) => c,
            Invocation::Help | Invocation::Version => {
                return Err(at(Exit {
                    status: 2,
                    message: "-h and -v are not table edits".into(),
                }))
            }
        };
        if let Some(e) = unsupported(&c) {
            return Err(at(e));
        }
        edits.push(edit_of(&c).map_err(at)?);
        cmds.push((n, c.cmd));
    }
    let body = serde_json::to_string(&edits).map_err(|e| unreachable(e.to_string()))?;
    match call(to, Method::POST, "/v1/batch", Some(body))? {
        Ok(body) => Ok(if json { body } else { String::new() }),
        Err(r) => {
            let (n, cmd) = r
                .edit
                .and_then(|i| cmds.get(i).copied())
                .unwrap_or((0, Cmd::Restore));
            Err(Exit {
                status: EXIT_TABLE,
                message: format!("line {n}: {}; nothing was restored", strerror(cmd, &r)),
            })
        }
    }
}
