//! Rules of the services list: each service through [`Service::check`],
//! located in the file, and duplicates across services.

use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::Range;

use super::{every, Checker};
use crate::health::{BackendCheck, HealthCheck};
use crate::names::{CheckKind, ForwardMethod, Protocol, Scheduler};
use crate::raw::{RawBackend, RawCheck, RawService, Sp};
use crate::service::{
    full_mask, parse_netmask, parse_source_range, Backend, BackendField, Persistence,
    SchedulerFlags, Service, ServiceField, ServiceKey, DEFAULT_WEIGHT, MAX_MAGLEV_TABLE_SIZE,
    MAX_WEIGHT,
};

impl Checker<'_> {
    pub(super) fn services(
        &mut self,
        raw: Vec<Sp<RawService>>,
        snat: &[IpAddr],
    ) -> Option<Vec<(Service, Range<usize>)>> {
        let mut first: HashMap<ServiceKey, (usize, Range<usize>)> = HashMap::new();
        every(raw.iter().enumerate().map(|(i, s)| {
            let service = self.service(i, s, snat)?;
            if let Some((j, at)) = first.get(&service.key) {
                let (line, _) = self.locator.position(at);
                self.report(
                    &s.span(),
                    format!("services[{i}]"),
                    format!(
                        "duplicate service {} (first defined by services[{j}] at line {line})",
                        service.key
                    ),
                );
                return None;
            }
            first.insert(service.key, (i, s.span()));
            Some((service, s.span()))
        }))
    }

    fn service(&mut self, i: usize, raw: &Sp<RawService>, snat: &[IpAddr]) -> Option<Service> {
        let header = raw.span();
        let r = raw.get_ref();
        let at = format!("services[{i}]");
        // Any address parses; Service::check says what it may not be.
        let vip = self.ip(&r.vip, &format!("{at}.vip"));
        let port: Option<u16> = self.int_in(&r.port, &format!("{at}.port"), 0..65_536, "0..=65535");
        let persistence = match &r.persistence {
            None => Some(None),
            Some(p) => {
                let p = p.get_ref();
                let mut out = Persistence::default();
                let timeout = match &p.timeout {
                    None => Some(out.timeout_secs),
                    Some(t) => self.timeout_secs(t, &format!("{at}.persistence.timeout")),
                };
                let netmask = match (&p.netmask, vip) {
                    (None, Some(v)) => Some(full_mask(v)),
                    (None, None) => None,
                    (Some(m), None) => self.ip(m, &format!("{at}.persistence.netmask")),
                    (Some(m), Some(v)) => match parse_netmask(m.get_ref(), v) {
                        Ok(mask) => Some(mask),
                        Err(e) => {
                            self.report(&m.span(), format!("{at}.persistence.netmask"), e);
                            None
                        }
                    },
                };
                out.timeout_secs = timeout?;
                out.netmask = netmask?;
                Some(Some(out))
            }
        };
        let mut flags = SchedulerFlags::default();
        let mut flags_ok = true;
        if let Some(list) = &r.flags {
            for (k, f) in list.get_ref().iter().enumerate() {
                if flags.set(*f.get_ref()) {
                    self.report(
                        &f.span(),
                        format!("{at}.flags[{k}]"),
                        format!("flag {} listed twice", f.get_ref()),
                    );
                    flags_ok = false;
                }
            }
        }
        let source_ranges = every(r.source_ranges.iter().enumerate().map(|(k, cidr)| {
            let net = parse_source_range(cidr.get_ref());
            if let Err(message) = &net {
                self.report(
                    &cidr.span(),
                    format!("{at}.source_ranges[{k}]"),
                    message.clone(),
                );
            }
            net.ok()
        }));
        let maglev_table_size = match &r.maglev_table_size {
            None => Some(None),
            Some(m) => self
                .int_in(
                    m,
                    &format!("{at}.maglev_table_size"),
                    2..i64::from(MAX_MAGLEV_TABLE_SIZE) + 1,
                    &format!("a prime up to {MAX_MAGLEV_TABLE_SIZE}"),
                )
                .map(Some),
        };
        let backends = every(
            r.backends
                .iter()
                .enumerate()
                .map(|(k, b)| self.backend(&format!("{at}.backends[{k}]"), b.get_ref(), port)),
        );
        let checks = every(r.backends.iter().enumerate().map(|(k, b)| {
            match &b.get_ref().check {
                None => Some(None),
                Some(c) => self
                    .check(&format!("{at}.backends[{k}].check"), c)
                    .map(Some),
            }
        }));

        let service = Service {
            key: ServiceKey {
                vip: vip?,
                protocol: r.protocol.unwrap_or(Protocol::Tcp),
                port: port?,
            },
            name: r.name.clone(),
            scheduler: r
                .scheduler
                .as_ref()
                .map_or(Scheduler::DEFAULT, |s| *s.get_ref()),
            flags,
            persistence: persistence?,
            source_ranges: source_ranges?,
            maglev_table_size: maglev_table_size?,
            backends: backends?,
        };
        if !flags_ok {
            return None;
        }
        let gateway = crate::service::Gateway {
            snat,
            host: self.host.addresses,
            connected: self.host.connected,
        };
        let violations = service.check_in(&gateway);
        for v in &violations {
            let span = service_field_span(r, &header, v.field);
            self.report(&span, format!("{at}.{}", v.field), v.message.clone());
        }
        let checks = checks?;
        if !violations.is_empty() {
            return None;
        }
        let mut ok = true;
        let mut found = Vec::new();
        for (k, (b, c)) in service.backends.iter().zip(checks).enumerate() {
            let Some((check, port)) = c else { continue };
            if check.kind == CheckKind::Off {
                continue;
            }
            if port.unwrap_or(b.port) == 0 {
                let span = r.backends[k].span();
                self.report(
                    &span,
                    format!("{at}.backends[{k}].check.port"),
                    "a backend of a port-0 service has no port to check: give check.port",
                );
                ok = false;
                continue;
            }
            found.push(BackendCheck {
                service: service.key,
                address: b.address,
                port: b.port,
                probe_port: port.unwrap_or(b.port),
                check,
            });
        }
        self.checks.extend(found);
        ok.then_some(service)
    }

    /// A backend's `check` table.
    fn check(&mut self, at: &str, raw: &Sp<RawCheck>) -> Option<(HealthCheck, Option<u16>)> {
        let r = raw.get_ref();
        let mut c = HealthCheck {
            kind: r.kind.unwrap_or(CheckKind::Tcp),
            ..HealthCheck::default()
        };
        let mut ok = true;
        let ms = |me: &mut Self, v: &Option<Sp<String>>, field: &str, default: u32| match v {
            None => Some(default),
            Some(t) => {
                match super::sections::parse_duration_ms(t.get_ref()) {
                    Some(ms) if (100..=3_600_000).contains(&ms) => Some(ms as u32),
                    _ => {
                        me.report(
                        &t.span(),
                        format!("{at}.{field}"),
                        format!("\"{}\" is not a duration of 100ms to 3600s (e.g. \"2s\", \"500ms\")", t.get_ref()),
                    );
                        None
                    }
                }
            }
        };
        let interval = ms(self, &r.interval, "interval", c.interval_ms);
        let timeout = ms(self, &r.timeout, "timeout", c.timeout_ms);
        match (interval, timeout) {
            (Some(i), Some(t)) if t <= i => (c.interval_ms, c.timeout_ms) = (i, t),
            (Some(i), Some(t)) => {
                let span = r.timeout.as_ref().map_or(raw.span(), |t| t.span());
                self.report(
                    &span,
                    format!("{at}.timeout"),
                    format!(
                        "{t}ms is longer than the interval ({i}ms): a check would overlap the next"
                    ),
                );
                ok = false;
            }
            _ => ok = false,
        }
        let count = |me: &mut Self, v: &Option<Sp<i64>>, field: &str, default: u32| match v {
            None => Some(default),
            Some(n) => me.int_in(n, &format!("{at}.{field}"), 1..101, "1..=100"),
        };
        match (
            count(self, &r.rise, "rise", c.rise),
            count(self, &r.fall, "fall", c.fall),
        ) {
            (Some(rise), Some(fall)) => (c.rise, c.fall) = (rise, fall),
            _ => ok = false,
        }
        if let Some(p) = &r.http_path {
            if p.get_ref().starts_with('/') && !p.get_ref().contains(char::is_whitespace) {
                c.http_path = p.get_ref().clone();
            } else {
                self.report(
                    &p.span(),
                    format!("{at}.http_path"),
                    format!(
                        "\"{}\" is not an HTTP path (it starts with / and has no spaces)",
                        p.get_ref()
                    ),
                );
                ok = false;
            }
        }
        if let Some(st) = &r.expect_status {
            match self.int_in(st, &format!("{at}.expect_status"), 100..600, "100..=599") {
                Some(v) => c.expect_status = v,
                None => ok = false,
            }
        }
        if c.kind != CheckKind::Http && (r.http_path.is_some() || r.expect_status.is_some()) {
            self.report(&raw.span(), at.to_string(), format!("http_path and expect_status apply to kind = \"http\" only (this check is \"{}\")", c.kind));
            ok = false;
        }
        let port = match &r.port {
            None => None,
            Some(p) => match self.int_in(p, &format!("{at}.port"), 1..65_536, "1..=65535") {
                Some(v) => Some(v),
                None => {
                    ok = false;
                    None
                }
            },
        };
        ok.then_some((c, port))
    }

    fn backend(
        &mut self,
        at: &str,
        raw: &RawBackend,
        service_port: Option<u16>,
    ) -> Option<Backend> {
        let address = self.ip(&raw.address, &format!("{at}.address"));
        let port = match &raw.port {
            None => service_port,
            Some(p) => self.int_in(p, &format!("{at}.port"), 0..65_536, "0..=65535"),
        };
        let weight = match &raw.weight {
            None => Some(DEFAULT_WEIGHT),
            Some(w) => self.int_in(
                w,
                &format!("{at}.weight"),
                0..i64::from(MAX_WEIGHT) + 1,
                &format!("0..={MAX_WEIGHT}"),
            ),
        };
        Some(Backend {
            address: address?,
            port: port?,
            weight: weight?,
            forward: raw.forward.unwrap_or(ForwardMethod::Masq),
            encap: raw.encap.unwrap_or_default(),
        })
    }
}

/// The span that best locates a rule violation of a service: the field
/// itself when written, else the table that would hold it.
fn service_field_span(r: &RawService, header: &Range<usize>, field: ServiceField) -> Range<usize> {
    let or_header = |s: Option<Range<usize>>| s.unwrap_or_else(|| header.clone());
    match field {
        ServiceField::Vip => r.vip.span(),
        ServiceField::Port => r.port.span(),
        ServiceField::Scheduler => or_header(r.scheduler.as_ref().map(|s| s.span())),
        ServiceField::Flags => or_header(r.flags.as_ref().map(|s| s.span())),
        ServiceField::PersistenceTimeout | ServiceField::PersistenceNetmask => {
            let p = r.persistence.as_ref();
            let inner = p.and_then(|p| {
                let p = p.get_ref();
                match field {
                    ServiceField::PersistenceTimeout => p.timeout.as_ref().map(|t| t.span()),
                    _ => p.netmask.as_ref().map(|t| t.span()),
                }
            });
            or_header(inner.or_else(|| p.map(|p| p.span())))
        }
        ServiceField::SourceRange(i) => or_header(r.source_ranges.get(i).map(|c| c.span())),
        ServiceField::MaglevTableSize => or_header(
            r.maglev_table_size
                .as_ref()
                .map(|m| m.span())
                .or_else(|| r.scheduler.as_ref().map(|s| s.span())),
        ),
        ServiceField::Backend { index, field } => match r.backends.get(index) {
            None => header.clone(),
            Some(b) => {
                let raw = b.get_ref();
                let inner = match field {
                    BackendField::Address => Some(raw.address.span()),
                    BackendField::Port => raw.port.as_ref().map(|p| p.span()),
                    BackendField::Weight => raw.weight.as_ref().map(|w| w.span()),
                };
                inner.unwrap_or_else(|| b.span())
            }
        },
    }
}
