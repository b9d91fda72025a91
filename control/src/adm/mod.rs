//! `xvsadm`: ipvsadm's command line against the admin API.

pub mod cli;
pub mod client;
pub mod conntrack;
pub mod format;
pub mod health;
pub mod ipvs_opts;
pub mod ipvsadm;
pub mod names;
pub mod observe;
pub mod sync;
