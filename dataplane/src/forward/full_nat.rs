//! Full NAT (IPVS's Masq as xvs does it, with a SNAT endpoint): the
//! original direction goes from the flow's SNAT endpoint to its backend,
//! the reply direction from the VIP back to the client, to the Ethernet
//! address the client's first packet came from. The rewrite itself is
//! [`crate::wire::nat::forward`].

use xvs_config::Address;
use xvs_conntrack::{Direction, FlowRef};

use super::{NextHop, Rewrite, Route};
use crate::pipeline::Side;
use crate::wire::Nat;

/// What a packet of `f` in direction `dir` becomes.
#[inline]
pub fn route<A: Address>(f: &FlowRef<'_, A>, dir: Direction) -> Route<A> {
    let (nat, side) = mapping(f, dir);
    Route {
        rewrite: Rewrite::Nat(nat),
        side,
        next_hop: match dir {
            Direction::Original => NextHop::Neighbour(f.backend().addr),
            Direction::Reply => NextHop::Mac(f.client_mac()),
        },
    }
}

/// The rewrite of a packet of `f` in direction `dir` and the side it
/// leaves on ([`route`]'s, for a caller that has the next hop already).
#[inline]
pub fn mapping<A: Address>(f: &FlowRef<'_, A>, dir: Direction) -> (Nat<A>, Side) {
    match dir {
        Direction::Original => (
            Nat {
                src: f.snat(),
                dst: f.backend(),
            },
            Side::Backend,
        ),
        Direction::Reply => (
            Nat {
                src: f.vip(),
                dst: f.client(),
            },
            Side::Client,
        ),
    }
}
