//! Forwarding plans: how a flow's packets leave the gateway.
//!
//! A plan is chosen per backend (from its configured [`ForwardMethod`])
//! when a service is compiled, recorded in each flow it creates (the
//! conntrack entry keeps its [`Plan::tag`]), and consumed by
//! [`crate::pipeline::Pipeline`] for every packet of the flow: the plan
//! says what the packet becomes ([`Route`]) and the pipeline resolves the
//! next hop and transmits. Each plan lives in its own module, as Katran
//! keeps each encapsulation in its own function (`pckt_encap.h`).
//!
//! Invariants:
//! - A flow keeps the plan it was created with, whatever later edits do
//!   to its backend (a packet never meets a rewrite its flow's reply key
//!   was not set up for).
//! - [`Plan::takes_snat`] says whether a new flow needs a SNAT endpoint
//!   (its replies come back to the gateway at that endpoint).
//!
//! - An ICMP error about a flow travels the route of the direction it
//!   goes in, and the packet it quotes is mapped the other way (so errors
//!   follow whatever plan the flow has).
//!
//! - A plan that bypasses replies (direct routing, tunnels: [`one_way`])
//!   takes no SNAT endpoint and its flows are one-way
//!   ([`Plan::is_one_way`]): the backend answers the client itself, so
//!   the packet keeps both its ends and only its way there changes.
//!
//! A new forwarding mode is a new variant, a module beside [`full_nat`]
//! and [`one_way`], and an arm in [`Plan::route`].

pub mod full_nat;
pub mod one_way;

use xvs_config::{Address, Encap, ForwardMethod};
use xvs_conntrack::{Direction, FlowRef};

use crate::pipeline::Side;
use crate::wire::Nat;

/// How a backend's flows are forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Plan {
    /// Full NAT (ipvsadm's `-m`, Masq): client → SNAT endpoint, VIP →
    /// backend, and back.
    #[default]
    FullNat = 0,
    /// Direct routing (ipvsadm's `-g`, Route): the Ethernet destination
    /// only.
    Route = 1,
    /// IP-in-IP tunnel (ipvsadm's `-i`, Tunnel).
    Ipip = 2,
    /// GUE tunnel (ipvsadm's `-i --tun-type gue`).
    Gue = 3,
}

impl Plan {
    /// The plan of a configured forwarding method (and encapsulation, for
    /// a tunnel).
    pub fn of(method: ForwardMethod, encap: Encap) -> Plan {
        match (method, encap) {
            (ForwardMethod::Masq, _) => Plan::FullNat,
            (ForwardMethod::Route, _) => Plan::Route,
            (ForwardMethod::Tunnel, Encap::Ipip) => Plan::Ipip,
            (ForwardMethod::Tunnel, Encap::Gue) => Plan::Gue,
        }
    }

    /// The tag a flow records.
    pub fn tag(self) -> u8 {
        self as u8
    }

    /// The plan a flow's tag stands for (tags are written only by
    /// [`Plan::tag`]; an unknown one, which cannot occur, reads as the
    /// default plan).
    pub fn from_tag(tag: u8) -> Plan {
        match tag {
            1 => Plan::Route,
            2 => Plan::Ipip,
            3 => Plan::Gue,
            _ => Plan::FullNat,
        }
    }

    /// Whether a new flow of this plan takes a SNAT endpoint.
    pub fn takes_snat(self) -> bool {
        self == Plan::FullNat
    }

    /// Whether its flows are one-way (the backend answers the client
    /// itself).
    pub fn is_one_way(self) -> bool {
        self != Plan::FullNat
    }

    /// What a packet of flow `f` in direction `dir` becomes.
    #[inline]
    pub fn route<A: Address>(self, f: &FlowRef<'_, A>, dir: Direction) -> Route<A> {
        match self {
            Plan::FullNat => full_nat::route(f, dir),
            Plan::Route => one_way::route(f, Rewrite::Route),
            Plan::Ipip => one_way::route(f, Rewrite::Tunnel(Encap::Ipip)),
            Plan::Gue => one_way::route(f, Rewrite::Tunnel(Encap::Gue)),
        }
    }
}

/// What is done to the packet itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite<A: Address = std::net::Ipv4Addr> {
    /// Full NAT: both ends rewritten.
    Nat(Nat<A>),
    /// Direct routing: nothing but the hop limit (and the MACs).
    Route,
    /// Encapsulated to the flow's backend.
    Tunnel(Encap),
}

/// Where the next hop's Ethernet address comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextHop<A: Address = std::net::Ipv4Addr> {
    /// The neighbour table's entry for this address (resolved first if
    /// missing).
    Neighbour(A),
    /// This address, known from the flow.
    Mac([u8; 6]),
}

/// What one packet of a flow becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<A: Address = std::net::Ipv4Addr> {
    /// What is done to the packet.
    pub rewrite: Rewrite<A>,
    /// The side it leaves on.
    pub side: Side,
    /// Its next hop.
    pub next_hop: NextHop<A>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xvs_conntrack::{Endpoint, FlowTable, L4Proto, NewFlow, Packet, Timeouts};

    fn ep(a: [u8; 4], port: u16) -> Endpoint {
        Endpoint {
            addr: Ipv4Addr::from(a),
            port,
        }
    }

    #[test]
    fn tags_round_trip_and_masq_is_full_nat() {
        assert_eq!(Plan::of(ForwardMethod::Masq, Encap::Gue), Plan::FullNat);
        assert_eq!(Plan::of(ForwardMethod::Route, Encap::Ipip), Plan::Route);
        assert_eq!(Plan::of(ForwardMethod::Tunnel, Encap::Ipip), Plan::Ipip);
        assert_eq!(Plan::of(ForwardMethod::Tunnel, Encap::Gue), Plan::Gue);
        for p in [Plan::FullNat, Plan::Route, Plan::Ipip, Plan::Gue] {
            assert_eq!(Plan::from_tag(p.tag()), p);
            assert_eq!(p.takes_snat(), p == Plan::FullNat);
            assert_eq!(p.is_one_way(), p != Plan::FullNat);
        }
    }

    #[test]
    fn full_nat_goes_snat_to_backend_and_vip_back_to_the_client() {
        let mut t = FlowTable::new(16, Timeouts::default(), 0);
        let new = NewFlow {
            client: ep([198, 18, 0, 10], 40000),
            vip: ep([198, 19, 0, 1], 80),
            backend: ep([198, 18, 1, 2], 8080),
            snat: ep([198, 18, 1, 254], 1024),
            proto: L4Proto::Tcp,
            service: 1,
            backend_id: 0,
            client_mac: [2, 0, 0, 0, 0, 9],
            plan: Plan::FullNat.tag(),
            one_way: false,
        };
        let id = t.insert(&new, Packet::default(), 0, &mut ()).unwrap();
        let f = t.flow(id);
        let plan = Plan::from_tag(f.plan());
        let out = plan.route(&f, Direction::Original);
        let Rewrite::Nat(nat) = out.rewrite else {
            panic!("{out:?}")
        };
        assert_eq!(nat.src, new.snat);
        assert_eq!(nat.dst, new.backend);
        assert_eq!(out.side, Side::Backend);
        assert_eq!(out.next_hop, NextHop::Neighbour(new.backend.addr));
        let back = plan.route(&f, Direction::Reply);
        assert_eq!(
            back.rewrite,
            Rewrite::Nat(Nat {
                src: new.vip,
                dst: new.client
            })
        );
        assert_eq!(back.side, Side::Client);
        assert_eq!(back.next_hop, NextHop::Mac(new.client_mac));
    }
}
