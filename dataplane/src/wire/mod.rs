//! The packet core: per-packet logic as pure functions over Ethernet frames
//! in `&mut [u8]` — classification, NAT rewrite with incremental checksums,
//! ICMP error translation, and the answers xvs builds itself (ARP, echo
//! reply, REJECT). No I/O, no clock, no allocation.
//!
//! Header access goes through `smoltcp::wire` packet types after explicit
//! length checks; every function documents its no-panic contract, and every
//! refusal is a [`DropReason`].

pub mod answer;
pub mod arp;
pub mod checksum;
pub mod classify;
mod drop_reason;
pub mod field;
pub mod icmp_error;
pub mod nat;

pub use arp::{Arp, ArpOp};
pub use classify::{classify, Fragment, Frame, IcmpError, Inner, Ipv4, TcpFlags, L4};
pub use drop_reason::{DropReason, Drops};
pub use icmp_error::IcmpErrorNat;
pub use nat::{Endpoint, Nat};
