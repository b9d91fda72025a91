//! Direct routing and tunnels (IPVS's Route and Tunnel): the backend
//! answers the client itself, so a flow is one-way and every packet of it
//! (and every ICMP error about it, which IPVS also passes on to the real
//! server) goes to the backend as the client sent it: only its next hop
//! (direct routing) or an outer header (a tunnel) is added. The rewrite
//! itself is [`crate::wire::nat::route`] / [`crate::wire::encap`].

use xvs_config::Address;
use xvs_conntrack::FlowRef;

use super::{NextHop, Rewrite, Route};
use crate::pipeline::Side;

/// What a packet of the one-way flow `f` becomes with `rewrite`.
#[inline]
pub fn route<A: Address>(f: &FlowRef<'_, A>, rewrite: Rewrite<A>) -> Route<A> {
    Route {
        rewrite,
        side: Side::Backend,
        next_hop: NextHop::Neighbour(f.backend().addr),
    }
}
