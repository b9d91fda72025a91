//! xvs-control: the control plane of xvs and the commands of its two
//! binaries, `xvs` (the daemon) and `xvsadm` (the ipvsadm-style CLI).
//!
//! The control plane never touches packets; it hands service state to the
//! data plane.

pub mod check_config;
pub mod run;
