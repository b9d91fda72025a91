//! xvs-benches: criterion micro-benchmarks, the AF_XDP packet generator and
//! the end-to-end comparison against kube-proxy's iptables and nftables
//! modes.

pub mod e2e;
pub mod frames;
pub mod pktgen;
pub mod raw;
pub mod report;
pub mod rulesets;
