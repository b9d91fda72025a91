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
    match dir {
        Direction::Original => Route {
            rewrite: Rewrite::Nat(Nat {
                src: f.snat(),
                dst: f.backend(),
            }),
            side: Side::Backend,
            next_hop: NextHop::Neighbour(f.backend().addr),
        },
        Direction::Reply => Route {
            rewrite: Rewrite::Nat(Nat {
                src: f.vip(),
                dst: f.client(),
            }),
            side: Side::Client,
            next_hop: NextHop::Mac(f.client_mac()),
        },
    }
}
