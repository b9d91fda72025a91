//! The express lane: an established full-NAT packet, the common case of a
//! gateway's traffic, decided in one pass over what it reads anyway (its
//! flow entry and its backend's counter line), without the general
//! path's questions whose answers it already knows.
//!
//! A packet takes it only if the general path would reach the same
//! verdict with no side effect but the ones done here; otherwise the
//! lane declines before it changes anything and the general path
//! ([`Half::verdict`]) runs as if the lane did not exist. It declines:
//! - a flow looked up at an older epoch of its table (the entry may have
//!   changed owner: the general path checks the key again);
//! - anything but TCP without SYN, or UDP (a SYN may end or reschedule
//!   its flow: IPVS's `conn_reuse_mode`, and `expire_nodest_conn` for a
//!   quiesced backend);
//! - a hop limit that a forward would exhaust (answered, not forwarded);
//! - a plan other than full NAT (routing and tunnels have their own
//!   next hops and rewrites);
//! - a service beyond the dense counter array, or a backend without a
//!   counter line;
//! - a packet that IPVS's rules end its flow at (without a SYN, only a
//!   backend removed from its service under `expire_nodest_conn`;
//!   debug builds check that against `removal`, the rule the general
//!   path asks);
//! - to the backend: no next hop cached in its counter line for the
//!   neighbour table's current generation (the general path resolves
//!   and caches it);
//! - from the backend: a source other than the backend, or a source MAC
//!   other than the one cached (the general path learns it).
//!
//! Invariant: the lane's verdict, frame bytes, flow state, counters,
//! events and sync records equal the general path's for every packet it
//! takes (`tests/express.rs` runs both on the same traffic).

use smoltcp::wire::{EthernetAddress, EthernetFrame};
use xvs_conntrack::{tcp_flags, Direction, FlowId, Packet};

use super::{removal, sent, Core, Half, Verdict};
use crate::family::{Family, IpPacket};
use crate::forward::{full_nat, Plan};
use crate::traffic::DestState;
use crate::wire::L4;

impl<A: Family> Half<A> {
    /// The verdict on `ip`, a packet of flow `id` in direction `dir`
    /// found at the table's current epoch, if the express lane takes it
    /// (see the module docs); `None`, with nothing changed, if not.
    #[inline(always)]
    pub(super) fn express(
        &mut self,
        core: &mut Core,
        buf: &mut [u8],
        ip: &A::Ip,
        (id, dir): (FlowId, Direction),
        now: u32,
    ) -> Option<Verdict> {
        let flags = match ip.l4() {
            L4::Tcp { flags, .. } if flags.0 & tcp_flags::SYN == 0 => flags.0,
            L4::Udp { .. } => 0,
            _ => return None,
        };
        if ip.hop_limit() <= 1 {
            return None;
        }
        let worker = core.cfg.worker;
        let f = self.table.flow(id);
        if Plan::from_tag(f.plan()) != Plan::FullNat {
            return None;
        }
        let line = self
            .services
            .traffic(f.service())?
            .line(worker, f.backend_id())?;
        // For a packet without SYN, IPVS's rules (`removal`) end a flow
        // only when its backend was removed under `expire_nodest_conn`:
        // that one test here (the whole rule cost 31 instructions a
        // packet), checked against the rule in debug builds, the tests'.
        let dest = line.state();
        let ends = core.cfg.rules.expire_nodest_conn && dest == DestState::Removed;
        debug_assert_eq!(
            ends,
            removal(core.cfg.rules, &f, dir, flags, dest).is_some()
        );
        if ends {
            return None;
        }
        let generation = self.neighbours.generation();
        let next = match dir {
            Direction::Original => line.next_hop(generation)?,
            Direction::Reply => {
                let src_mac = EthernetFrame::new_unchecked(&*buf).src_addr().0;
                if f.backend().addr != ip.src() || line.next_hop(generation) != Some(src_mac) {
                    return None;
                }
                f.client_mac()
            }
        };
        let (nat, side) = full_nat::mapping(&f, dir);
        // Taken: from here on the packet is the lane's.
        let len = ip.total_len();
        line.packet(usize::from(dir == Direction::Reply), u64::from(len));
        let pkt = Packet {
            tcp_flags: flags,
            len,
        };
        self.track(core, (id, dir), pkt, now, ip.protocol());
        let rewritten = ip.forward(buf, &nat, core.mac(side), EthernetAddress(next));
        let verdict = sent(rewritten, ip, side);
        core.counters.express += u64::from(matches!(verdict, Verdict::Forward { .. }));
        Some(verdict)
    }
}
