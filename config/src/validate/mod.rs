//! Validation: the raw file ([`crate::raw`]) becomes a [`Config`], or every
//! problem found becomes a located [`Diagnostic`].
//!
//! Invariants: a syntax or shape error (bad TOML, unknown key, wrong type,
//! unknown keyword, missing required key) stops at the first one, as serde
//! does; once the shape is right, every semantic rule is checked and every
//! violation reported, sorted by position. Rules of a single service are
//! [`Service::check`]'s (shared with runtime edits and Kubernetes); rules
//! that span sections (duplicate services, SNAT against VIPs, workers
//! against ports and capacity) live here.

mod sections;
mod services;
mod shape;

use std::net::IpAddr;
use std::ops::Range;
use std::path::PathBuf;

use crate::error::{Diagnostic, Invalid, Locator};
use crate::raw::{RawFile, Sp};
use crate::service::{is_unicast_any, not_unicast_any, MAX_TIMEOUT_SECS};
use crate::settings::{Config, Vips};
use shape::read_raw;

/// Largest RX queue index accepted.
pub(crate) const MAX_QUEUE: i64 = 65_535;
/// Largest CPU core index accepted (glibc's CPU_SETSIZE is 1024).
pub(crate) const MAX_CORE: i64 = 1_023;
/// Longest interface name (IFNAMSIZ - 1).
pub(crate) const MAX_IFNAME: usize = 15;

/// Parses and validates `text`, read from `file`, for `host`.
pub(crate) fn parse(file: &str, text: &str, host: &Host<'_>) -> Result<Config, Invalid> {
    let mut c = Checker {
        file,
        locator: Locator::new(text),
        out: Vec::new(),
        host,
        checks: Vec::new(),
    };
    let raw = match read_raw(text) {
        Ok(raw) => raw,
        Err((span, field, message)) => {
            c.report(&span, field, message);
            return Err(c.finish_err());
        }
    };
    let config = c.config(raw);
    match config {
        Some(config) if c.out.is_empty() => Ok(config),
        _ => Err(c.finish_err()),
    }
}

struct Checker<'a> {
    file: &'a str,
    locator: Locator<'a>,
    out: Vec<Diagnostic>,
    host: &'a Host<'a>,
    /// Health checks of the backends validated so far.
    checks: Vec<crate::health::BackendCheck>,
}

/// What the machine a file is checked on has, for the rules that depend on
/// it (the caller reads it: this crate does no I/O). The default knows
/// nothing, and those rules are skipped.
#[derive(Default)]
pub struct Host<'a> {
    /// The host's own addresses: no VIP or backend may be one.
    pub addresses: &'a [IpAddr],
    /// The prefixes of the host's links: a direct-routing backend must be
    /// in one (empty: unknown, not checked).
    pub connected: &'a [ipnet::IpNet],
    /// The memory the host can give, to check the conntrack capacity.
    pub memory: Option<Memory<'a>>,
}

/// Memory the host can give, and what a configuration needs of it.
pub struct Memory<'a> {
    /// Bytes available (`MemAvailable`).
    pub available: u64,
    /// Bytes of `available` the data plane needs for `capacity` flows
    /// over `workers` workers, with an IPv6 table or not (the caller's
    /// formula: the flow tables' footprint, and the packet buffers not
    /// on reserved huge pages).
    pub needed: Box<dyn Fn(u32, usize, bool) -> u64 + 'a>,
}

impl std::fmt::Debug for Host<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("addresses", &self.addresses)
            .field("connected", &self.connected)
            .field("memory", &self.memory.as_ref().map(|m| m.available))
            .finish()
    }
}

impl Checker<'_> {
    fn report(
        &mut self,
        span: &Range<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        let (line, column) = self.locator.position(span);
        self.out.push(Diagnostic {
            file: self.file.to_owned(),
            line,
            column,
            field: field.into(),
            message: message.into(),
        });
    }

    fn finish_err(mut self) -> Invalid {
        self.out.sort_by_key(|d| (d.line, d.column));
        Invalid {
            diagnostics: self.out,
        }
    }

    fn config(&mut self, raw: RawFile) -> Option<Config> {
        let interfaces = match raw.interfaces {
            Some(i) => self.interfaces(i),
            None => {
                self.report(
                    &(0..0),
                    "interfaces",
                    "required section is missing (e.g. [interfaces] client = \"eth0\")",
                );
                None
            }
        };
        let workers = interfaces.as_ref().map(|i| i.queues.len());
        let snat = match raw.snat {
            Some(s) => self.snat(s, workers),
            None => {
                self.report(
                    &(0..0),
                    "snat",
                    "required section is missing (full NAT needs a source address, e.g. [snat] addresses = [\"198.18.2.1\"])",
                );
                None
            }
        };
        let ipv6 = snat.as_ref().is_some_and(|s| !s.0.addresses6.is_empty());
        let conntrack = self.conntrack(raw.conntrack, workers, ipv6);
        let vips = Vips {
            unknown_port: raw.vips.unknown_port.unwrap_or_default(),
        };
        let admin = self.admin(raw.admin);
        let kubernetes = self.kubernetes(raw.kubernetes);
        let restart = self.restart(raw.restart);
        let tunnel = self.tunnel(raw.tunnel);
        let cluster = self.cluster(raw.cluster);
        let snat_addrs: Vec<IpAddr> = snat
            .as_ref()
            .map(|s| s.0.all_addresses())
            .unwrap_or_default();
        let services = self.services(raw.services, &snat_addrs);
        let checks = std::mem::take(&mut self.checks);
        Some(Config {
            interfaces: interfaces?,
            snat: snat?.0,
            conntrack: conntrack?,
            vips,
            admin: admin?,
            kubernetes: kubernetes?,
            restart: restart?,
            tunnel: tunnel?,
            cluster: cluster?,
            services: services?.into_iter().map(|(s, _)| s).collect(),
            checks,
        })
    }

    /// An integer in `range`, else a report saying what is allowed.
    fn int_in<T: TryFrom<i64>>(
        &mut self,
        v: &Sp<i64>,
        field: &str,
        range: Range<i64>,
        allowed: &str,
    ) -> Option<T> {
        let value = *v.get_ref();
        if range.contains(&value) {
            T::try_from(value).ok()
        } else {
            self.report(
                &v.span(),
                field,
                format!("{value} is out of range (expected {allowed})"),
            );
            None
        }
    }

    fn ip(&mut self, v: &Sp<String>, field: &str) -> Option<IpAddr> {
        match v.get_ref().parse::<IpAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.report(
                    &v.span(),
                    field,
                    format!("\"{}\" is not an IPv4 or IPv6 address", v.get_ref()),
                );
                None
            }
        }
    }

    fn unicast_any(&mut self, v: &Sp<String>, field: &str) -> Option<IpAddr> {
        let a = self.ip(v, field)?;
        if is_unicast_any(a) {
            Some(a)
        } else {
            self.report(&v.span(), field, not_unicast_any(a));
            None
        }
    }

    fn timeout_secs(&mut self, v: &Sp<i64>, field: &str) -> Option<u32> {
        self.int_in(
            v,
            field,
            1..i64::from(MAX_TIMEOUT_SECS) + 1,
            &format!("1..={MAX_TIMEOUT_SECS} seconds"),
        )
    }

    fn absolute_path(&mut self, v: &Sp<String>, field: &str) -> Option<PathBuf> {
        let path = PathBuf::from(v.get_ref());
        if path.is_absolute() {
            Some(path)
        } else {
            self.report(
                &v.span(),
                field,
                format!("\"{}\" is not an absolute path", v.get_ref()),
            );
            None
        }
    }
}

/// Runs `check` on every item (all of them, so every problem is reported)
/// and returns the results only if each one succeeded.
fn every<T>(items: impl Iterator<Item = Option<T>>) -> Option<Vec<T>> {
    let all: Vec<Option<T>> = items.collect();
    all.into_iter().collect()
}
