//! The admin API's JSON bodies for services and backends, and how they
//! become the service model: the one place the API (and `xvsadm`, which
//! speaks it) turns its input into a [`Service`], with the config file's
//! words for every problem. Unknown fields are refused, as the file refuses
//! unknown keys; every problem is reported, one per line.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::names::{Encap, ForwardMethod, Protocol, Scheduler};
use crate::service::{
    full_mask, parse_netmask, parse_source_range, Backend, Persistence, Service, ServiceKey,
};

/// A service as the API takes it (`-A` / `-E`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// `tcp` or `udp`.
    pub protocol: String,
    /// VIP (either family).
    pub vip: IpAddr,
    /// Port.
    pub port: u16,
    /// Scheduler (default wlc).
    #[serde(default)]
    pub scheduler: Option<String>,
    /// Persistence timeout in seconds.
    #[serde(default)]
    pub persistence: Option<u32>,
    /// Persistence netmask (IPv4: a mask; IPv6: a prefix length or a
    /// mask).
    #[serde(default)]
    pub netmask: Option<String>,
    /// Scheduler flags (`fallback`, `port`).
    #[serde(default)]
    pub flags: Vec<String>,
    /// Allowed client ranges (CIDRs; empty = all).
    #[serde(default)]
    pub source_ranges: Vec<String>,
    /// Maglev table size (mh only).
    #[serde(default)]
    pub maglev_table_size: Option<u32>,
    /// Operator-facing name.
    #[serde(default)]
    pub name: Option<String>,
    /// Backends, when a service is created whole (POST); an edit (PUT)
    /// keeps the service's backends, which have their own paths.
    #[serde(default)]
    pub backends: Vec<BackendSpec>,
}

/// A backend as the API takes it (`-a` / `-e`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    /// Address (taken from the path when editing).
    #[serde(default)]
    pub address: Option<IpAddr>,
    /// Port (the service's when absent).
    #[serde(default)]
    pub port: Option<u16>,
    /// Weight (1 when absent).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Forwarding method (`masq` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward: Option<ForwardMethod>,
    /// Encapsulation of a tunnel backend (`ipip` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<Encap>,
}

impl ServiceSpec {
    /// The service this body describes, or every problem of the body, one
    /// per entry (`FIELD: MESSAGE`). The service's own rules
    /// ([`Service::check_in`]) are checked by whoever applies it, as for
    /// every source.
    pub fn to_service(&self) -> Result<Service, Vec<String>> {
        let mut problems = Vec::new();
        let proto = self.protocol.to_ascii_lowercase().parse::<Protocol>();
        let mut svc = Service::new(ServiceKey {
            vip: self.vip,
            protocol: *proto.as_ref().unwrap_or(&Protocol::Tcp),
            port: self.port,
        });
        if let Err(e) = proto {
            problems.push(format!("protocol: {e}"));
        }
        if let Some(name) = &self.scheduler {
            match name.parse::<Scheduler>() {
                Ok(k) => svc.scheduler = k,
                Err(e) => problems.push(format!("scheduler: {e}")),
            }
        }
        if self.persistence.is_some() || self.netmask.is_some() {
            let d = Persistence::<IpAddr>::default();
            let netmask = match &self.netmask {
                None => full_mask(self.vip),
                Some(m) => parse_netmask(m, self.vip).unwrap_or_else(|e| {
                    problems.push(format!("netmask: {e}"));
                    full_mask(self.vip)
                }),
            };
            svc.persistence = Some(Persistence {
                timeout_secs: self.persistence.unwrap_or(d.timeout_secs),
                netmask,
            });
        }
        for (i, f) in self.flags.iter().enumerate() {
            match f.parse() {
                Ok(flag) => {
                    if svc.flags.set(flag) {
                        problems.push(format!("flags[{i}]: flag {f} listed twice"));
                    }
                }
                Err(e) => problems.push(format!("flags[{i}]: {e}")),
            }
        }
        for (i, r) in self.source_ranges.iter().enumerate() {
            match parse_source_range(r) {
                Ok(net) => svc.source_ranges.push(net),
                Err(e) => problems.push(format!("source_ranges[{i}]: {e}")),
            }
        }
        svc.maglev_table_size = self.maglev_table_size;
        svc.name = self.name.clone();
        for (i, b) in self.backends.iter().enumerate() {
            match b.to_backend(&svc.key) {
                Ok(b) => svc.backends.push(b),
                Err(e) => problems.push(format!("backends[{i}].{e}")),
            }
        }
        if problems.is_empty() {
            Ok(svc)
        } else {
            Err(problems)
        }
    }
}

impl BackendSpec {
    /// The backend of service `key` this body describes (`FIELD: MESSAGE`
    /// when it cannot be one).
    pub fn to_backend(&self, key: &ServiceKey) -> Result<Backend, String> {
        Ok(Backend {
            address: self.address.ok_or("address: missing")?,
            port: self.port.unwrap_or(key.port),
            weight: self.weight.unwrap_or(1),
            forward: self.forward.unwrap_or(ForwardMethod::Masq),
            encap: self.encap.unwrap_or_default(),
        })
    }
}

/// Which service an edit is about.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceRef {
    /// `tcp` or `udp`.
    pub protocol: String,
    /// VIP.
    pub vip: IpAddr,
    /// Port.
    pub port: u16,
}

/// One edit of a batch (`POST /v1/batch`, what `xvsadm -R` sends): the
/// same edits as the single-edit paths, applied in order, all or none.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum EditSpec {
    /// `-A`.
    AddService {
        /// The service.
        service: ServiceSpec,
    },
    /// `-E`.
    EditService {
        /// The service (its backends are kept).
        service: ServiceSpec,
    },
    /// `-D`.
    DeleteService {
        /// The service.
        service: ServiceRef,
    },
    /// `-a`.
    AddBackend {
        /// The service.
        service: ServiceRef,
        /// The backend.
        backend: BackendSpec,
    },
    /// `-e`.
    EditBackend {
        /// The service.
        service: ServiceRef,
        /// The backend.
        backend: BackendSpec,
    },
    /// `-d`.
    DeleteBackend {
        /// The service.
        service: ServiceRef,
        /// Backend address.
        address: IpAddr,
        /// Backend port.
        port: u16,
    },
    /// `-C`.
    Clear,
}

impl ServiceRef {
    /// The key, or the protocol's problem.
    pub fn key(&self) -> Result<ServiceKey, String> {
        let protocol = self
            .protocol
            .to_ascii_lowercase()
            .parse::<Protocol>()
            .map_err(|e| format!("protocol: {e}"))?;
        Ok(ServiceKey {
            vip: self.vip,
            protocol,
            port: self.port,
        })
    }
}

impl ServiceSpec {
    /// Whether the body names a scheduler xvs does not have (IPVS's
    /// "Scheduler or persistence engine not found").
    pub fn unknown_scheduler(&self) -> bool {
        self.scheduler
            .as_deref()
            .is_some_and(|s| s.parse::<Scheduler>().is_err())
    }
}
