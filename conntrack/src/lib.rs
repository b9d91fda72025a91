//! xvs-conntrack: the per-queue connection tracking table (sans-IO: `now` is
//! an argument, one table per worker, no locks).
//!
//! The timeouts it applies are [`xvs_config::Timeouts`] (IPVS's defaults).

mod key;

pub use key::{FlowKey, L4Proto};
pub use xvs_config::Timeouts;
