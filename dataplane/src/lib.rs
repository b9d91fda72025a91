//! xvs-dataplane: the AF_XDP poll-mode data plane — packet parsing and NAT
//! rewrite ([`wire`]), schedulers ([`sched`]), the service table, per-queue
//! workers.
//!
//! It consumes the shared service model of [`xvs_config`] and never depends
//! on tokio, kube or a serde format.

pub mod counters;
pub mod eventfd;
pub mod events;
pub mod family;
pub mod forward;
pub mod host;
pub mod io;
pub mod line;
pub mod neighbours;
pub mod pipeline;
pub mod runtime;
pub mod sched;
pub mod services;
pub mod snat;
pub mod state;
pub mod steer;
pub mod sync;
pub mod traffic;
pub mod wire;
pub mod worker;
pub mod xsk;

pub use xvs_config::{Backend, Service, ServiceKey};
