//! Real-server health checks (keepalived's job for IPVS): how one backend
//! of a config-file service is checked, as the validator builds it.
//!
//! Invariants: `interval_ms` and `timeout_ms` are at least 100 ms and the
//! timeout is at most the interval (a check never overlaps the next);
//! `rise` and `fall` are 1..=100; an HTTP check has a path starting with
//! `/` and an expected status in 100..=599.

use std::net::IpAddr;

use crate::names::CheckKind;
use crate::service::ServiceKey;

/// Default milliseconds between checks.
pub const DEFAULT_CHECK_INTERVAL_MS: u32 = 2_000;
/// Default check timeout.
pub const DEFAULT_CHECK_TIMEOUT_MS: u32 = 1_000;
/// Default consecutive successes that bring a failed backend back (as
/// HAProxy's `rise`).
pub const DEFAULT_RISE: u32 = 2;
/// Default consecutive failures that take a backend out (as HAProxy's
/// `fall`).
pub const DEFAULT_FALL: u32 = 3;

/// How one backend is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// What is done.
    pub kind: CheckKind,
    /// Milliseconds from one check to the next.
    pub interval_ms: u32,
    /// Milliseconds a check may take before it counts as failed.
    pub timeout_ms: u32,
    /// Consecutive successes that bring a failed backend back.
    pub rise: u32,
    /// Consecutive failures that take a backend out.
    pub fall: u32,
    /// Path an HTTP check asks for.
    pub http_path: String,
    /// Status an HTTP check expects.
    pub expect_status: u16,
}

impl Default for HealthCheck {
    fn default() -> HealthCheck {
        HealthCheck {
            kind: CheckKind::Tcp,
            interval_ms: DEFAULT_CHECK_INTERVAL_MS,
            timeout_ms: DEFAULT_CHECK_TIMEOUT_MS,
            rise: DEFAULT_RISE,
            fall: DEFAULT_FALL,
            http_path: "/".into(),
            expect_status: 200,
        }
    }
}

/// The check of one backend of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendCheck {
    /// The service.
    pub service: ServiceKey,
    /// The backend's address.
    pub address: IpAddr,
    /// The backend's port (what identifies it in its service).
    pub port: u16,
    /// The port probed: the check's own `port`, else the backend's (a
    /// backend of a port-0 service has none: its check must give one).
    pub probe_port: u16,
    /// How.
    pub check: HealthCheck,
}
