//! The Kubernetes source: Services and EndpointSlices translated with
//! kube-proxy's semantics ([`translate`]).

pub mod translate;
