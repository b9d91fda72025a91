//! The packet core: per-packet logic as pure functions over Ethernet frames
//! in `&mut [u8]` — classification, NAT rewrite with incremental checksums,
//! ICMP error translation, and the answers xvs builds itself (ARP and
//! neighbour discovery, echo reply, REJECT), for IPv4 and IPv6. No I/O, no clock, no allocation.
//!
//! Header access goes through `smoltcp::wire` packet types after explicit
//! length checks; every function documents its no-panic contract, and every
//! refusal is a [`DropReason`].

pub mod answer;
pub mod answer6;
pub mod arp;
pub mod checksum;
pub mod classify;
mod drop_reason;
pub mod encap;
pub mod field;
pub mod icmp_error;
pub mod ipv6;
pub mod nat;
pub mod nat6;
pub mod ndp;

pub use arp::{Arp, ArpOp};
pub use classify::{
    classify, classify_into, Fragment, Frame, IcmpError, Inner, Ipv4, TcpFlags, L4,
};
pub use drop_reason::{DropReason, Drops};
pub use icmp_error::IcmpErrorNat;
pub use ipv6::Ipv6;
pub use nat::{Endpoint, Nat};
pub use ndp::Ndp;
