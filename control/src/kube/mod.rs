//! The Kubernetes source: Services and EndpointSlices translated with
//! kube-proxy's semantics ([`translate`]), watched with kube-rs
//! ([`source`]).

pub mod source;
pub mod translate;
