//! xvs configuration: the schema of `/etc/xvs/xvs.toml`, its defaults and
//! validation, and the model types the control and data planes share.
//!
//! The only ways to a [`Config`] are [`parse_str`] and [`load`]: both either
//! return a configuration that passed every rule or every problem found, each
//! located as `FILE:LINE:COLUMN: FIELD: MESSAGE`. Nothing here does I/O but
//! [`load`]'s one read of the file.

pub mod api;
mod error;
pub mod family;
mod health;
mod names;
mod raw;
pub mod schema;
mod service;
mod settings;
mod validate;

use std::path::Path;

pub use error::{Diagnostic, Invalid, LoadError};
pub use family::{Address, Family, HostPort};
pub use health::{
    BackendCheck, HealthCheck, DEFAULT_CHECK_INTERVAL_MS, DEFAULT_CHECK_TIMEOUT_MS, DEFAULT_FALL,
    DEFAULT_RISE,
};
pub use names::{
    ArmMode, CheckKind, Encap, ForwardMethod, PollMode, Protocol, Scheduler, SchedulerFlag,
    Steering, SyncRole, UnknownName, UnknownPort, XdpAttachMode, ZeroCopy,
};
pub use service::{
    full_mask, is_contiguous, is_prime, is_unicast, is_unicast6, is_unicast_any, not_unicast,
    not_unicast_any, parse_netmask, parse_source_range, parse_source_range4, prefix_len,
    prefix_mask6, Backend, BackendField, Gateway, Persistence, RuleViolation, SchedulerFlags,
    Service, ServiceField, ServiceKey, DEFAULT_MAGLEV_TABLE_SIZE, DEFAULT_PERSISTENCE_TIMEOUT,
    DEFAULT_WEIGHT, MAX_MAGLEV_TABLE_SIZE, MAX_TIMEOUT_SECS, MAX_WEIGHT,
};
pub use settings::{
    Admin, AdminTcp, Cluster, Config, ConnRules, Conntrack, Interfaces, Kubernetes, PortRange,
    Restart, Snat, SnatPortSlice, Sync, Timeouts, Tunnel, Vips, DEFAULT_ADMIN_SOCKET,
    DEFAULT_CONFIG_PATH, DEFAULT_CONNTRACK_CAPACITY, DEFAULT_GUE_PORT, DEFAULT_HASH_SEED,
    DEFAULT_HOLD_MS, DEFAULT_SERVICE_PROXY_NAME, DEFAULT_SNAT_PORTS, DEFAULT_STATE_DIR,
    DEFAULT_SYNC_PORT, MAX_CONNTRACK_CAPACITY, MAX_HOLD_MS, MAX_PEER_TIMEOUT_MS,
    MIN_PEER_TIMEOUT_MS,
};
pub use validate::{Host, Memory};

/// Parses and validates a configuration; `file` names it in diagnostics.
/// The rules that depend on the machine are skipped (see
/// [`parse_str_on`]).
pub fn parse_str(file: &str, text: &str) -> Result<Config, Invalid> {
    validate::parse(file, text, &Host::default())
}

/// Parses and validates a configuration for the machine `host` describes:
/// no VIP or backend may be one of its addresses, and the conntrack
/// capacity must fit in its memory.
pub fn parse_str_on(file: &str, text: &str, host: &Host<'_>) -> Result<Config, Invalid> {
    validate::parse(file, text, host)
}

/// Reads and validates the configuration file at `path` (machine rules
/// skipped).
pub fn load(path: &Path) -> Result<Config, LoadError> {
    load_on(path, &Host::default())
}

/// Reads and validates the configuration file at `path` for `host`.
pub fn load_on(path: &Path, host: &Host<'_>) -> Result<Config, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(parse_str_on(&path.display().to_string(), &text, host)?)
}

impl Config {
    /// A one-line summary for operators: topology, workers, services.
    pub fn summary(&self) -> String {
        let i = &self.interfaces;
        let arms = match &i.backend {
            Some(b) => format!("two-arm {} -> {}", i.client, b),
            None => format!("one-arm on {}", i.client),
        };
        let workers: Vec<String> = i
            .queues
            .iter()
            .zip(&i.cores)
            .map(|(q, c)| format!("q{q}@cpu{c}"))
            .collect();
        let tcp = self
            .services
            .iter()
            .filter(|s| s.key.protocol == Protocol::Tcp)
            .count();
        let backends: usize = self.services.iter().map(|s| s.backends.len()).sum();
        let kube = if self.kubernetes.enabled {
            format!("kubernetes on ({})", self.kubernetes.service_proxy_name)
        } else {
            "kubernetes off".to_owned()
        };
        format!(
            "{arms}, {} worker{} [{}], poll {}, steering {}, {} SNAT address{}, {} services ({tcp} tcp, {} udp), {backends} backends, {kube}",
            workers.len(),
            if workers.len() == 1 { "" } else { "s" },
            workers.join(" "),
            i.poll,
            i.steering,
            self.snat.addresses.len(),
            if self.snat.addresses.len() == 1 { "" } else { "es" },
            self.services.len(),
            self.services.len() - tcp,
        )
    }
}
