//! `xvsadm`: ipvsadm's command line against the admin API.

pub mod cli;
pub mod client;
pub mod format;
pub mod ipvs_opts;
