//! xvs-control: the control plane of xvs and the commands of its two
//! binaries, `xvs` (the daemon) and `xvsadm` (the ipvsadm-style CLI).
//!
//! The control plane never touches packets; it hands service state to the
//! data plane: [`engine`] reconciles and owns the data plane (through
//! the [`plane::Plane`] trait, which an in-memory recorder also implements), [`api`]
//! serves it over HTTP, [`stats`] and [`metrics`] read it, [`adm`] is the
//! client side (ipvsadm's options and output formats).

pub mod adm;
pub mod api;
pub mod check_config;
pub mod cli;
pub mod docs;
pub mod engine;
pub mod events;
pub mod ha;
pub mod health;
pub mod kube;
pub mod listener;
pub mod machine;
pub mod metrics;
pub mod plane;
pub mod restart;
pub mod run;
pub mod stats;
pub mod status;
pub mod view;
pub mod web;
