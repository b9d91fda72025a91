//! Flow states and their transitions, with IPVS's semantics
//! (`net/netfilter/ipvs/ip_vs_proto_tcp.c`, the normal — not secure_tcp —
//! state table, directions INPUT and OUTPUT; full NAT always sees both).
//!
//! Invariants: a TCP transition is a pure function of (state, direction,
//! flags); the event a segment stands for is chosen as IPVS does — RST,
//! else SYN, else FIN, else ACK — and a segment with none of them moves
//! the flow to CLOSE. "Active" (for lc/wlc/sed/nq) means ESTABLISHED and
//! nothing else; UDP, ICMP and persistence templates are never active.

use crate::Timeouts;

/// Which way a packet travels relative to the flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client → VIP (IPVS "input").
    Original = 0,
    /// Backend → SNAT address (IPVS "output").
    Reply = 1,
}

/// State of a tracked flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum FlowState {
    /// TCP, before any transition (never stored: a new flow transitions
    /// at once).
    None = 0,
    /// TCP ESTABLISHED.
    Established,
    /// TCP SYN_SENT.
    SynSent,
    /// TCP SYN_RECV.
    SynRecv,
    /// TCP FIN_WAIT.
    FinWait,
    /// TCP TIME_WAIT.
    TimeWait,
    /// TCP CLOSE.
    Close,
    /// TCP CLOSE_WAIT.
    CloseWait,
    /// TCP LAST_ACK.
    LastAck,
    /// TCP LISTEN.
    Listen,
    /// TCP SYNACK.
    SynAck,
    /// UDP pseudo-state.
    Udp,
    /// ICMP pseudo-state.
    Icmp,
    /// A persistence template (client network → backend).
    Template,
}

impl FlowState {
    /// Every state, in `repr` order.
    pub const ALL: [FlowState; 14] = [
        FlowState::None,
        FlowState::Established,
        FlowState::SynSent,
        FlowState::SynRecv,
        FlowState::FinWait,
        FlowState::TimeWait,
        FlowState::Close,
        FlowState::CloseWait,
        FlowState::LastAck,
        FlowState::Listen,
        FlowState::SynAck,
        FlowState::Udp,
        FlowState::Icmp,
        FlowState::Template,
    ];
    /// Number of states.
    pub const COUNT: usize = Self::ALL.len();

    /// The name `ipvsadm -Lnc` prints.
    pub const fn name(self) -> &'static str {
        match self {
            FlowState::None | FlowState::Template => "NONE",
            FlowState::Established => "ESTABLISHED",
            FlowState::SynSent => "SYN_SENT",
            FlowState::SynRecv => "SYN_RECV",
            FlowState::FinWait => "FIN_WAIT",
            FlowState::TimeWait => "TIME_WAIT",
            FlowState::Close => "CLOSE",
            FlowState::CloseWait => "CLOSE_WAIT",
            FlowState::LastAck => "LAST_ACK",
            FlowState::Listen => "LISTEN",
            FlowState::SynAck => "SYNACK",
            FlowState::Udp => "UDP",
            FlowState::Icmp => "ICMP",
        }
    }

    /// Dense index, `0..COUNT`.
    pub const fn index(self) -> usize {
        self as usize
    }

    #[inline]
    pub(crate) fn from_index(i: u8) -> FlowState {
        // A stored index is always in range; the modulo only keeps a
        // damaged one (a state file's) from panicking, off the common
        // path.
        match FlowState::ALL.get(usize::from(i)) {
            Some(&s) => s,
            None => FlowState::ALL[usize::from(i) % Self::COUNT],
        }
    }

    /// Whether a flow in this state may be ended to give its SNAT port to
    /// a new flow: a handshake that has not completed or a connection
    /// already closed (SYN_RECV, SYN_SENT, SYNACK, TIME_WAIT, CLOSE, and
    /// the pre-state NONE). Never ESTABLISHED, never a connection still
    /// closing with data possibly in flight, never UDP or ICMP.
    pub const fn is_reclaimable(self) -> bool {
        matches!(
            self,
            FlowState::None
                | FlowState::SynRecv
                | FlowState::SynSent
                | FlowState::SynAck
                | FlowState::TimeWait
                | FlowState::Close
        )
    }

    /// Whether a flow in this state counts as an active connection.
    pub const fn is_active(self) -> bool {
        matches!(self, FlowState::Established)
    }

    /// Seconds a flow in this state lives without packets. NONE and LISTEN
    /// are not configurable (IPVS: 2 s and 120 s); a template's timeout is
    /// its service's and is not looked up here (0).
    pub const fn timeout(self, t: &Timeouts) -> u32 {
        match self {
            FlowState::None => 2,
            FlowState::Established => t.established,
            FlowState::SynSent => t.syn_sent,
            FlowState::SynRecv => t.syn_recv,
            FlowState::FinWait => t.fin_wait,
            FlowState::TimeWait => t.time_wait,
            FlowState::Close => t.close,
            FlowState::CloseWait => t.close_wait,
            FlowState::LastAck => t.last_ack,
            FlowState::Listen => 120,
            FlowState::SynAck => t.synack,
            FlowState::Udp => t.udp,
            FlowState::Icmp => t.icmp,
            FlowState::Template => 0,
        }
    }
}

/// TCP flag bits as on the wire.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

use FlowState as S;

/// IPVS `tcp_states[]`: `[direction][event][state]`, events syn, fin, ack,
/// rst; states in `FlowState` order sNO..sSA. Directions: INPUT (client to
/// server), OUTPUT (server to client) and INPUT-ONLY (client to server on
/// a flow whose other direction never passes the gateway: IPVS's
/// `IP_VS_CONN_F_NOOUTPUT`, set for direct routing and tunnels).
const TCP_STATES: [[[FlowState; 11]; 4]; 3] = {
    // sNO and sSA are never a next state in the normal table.
    let (es, ss, sr, fw, tw) = (
        S::Established,
        S::SynSent,
        S::SynRecv,
        S::FinWait,
        S::TimeWait,
    );
    let (cl, cw, la, li) = (S::Close, S::CloseWait, S::LastAck, S::Listen);
    [
        // INPUT (client -> server)
        [
            /* syn */ [sr, es, es, sr, sr, sr, sr, sr, sr, sr, sr],
            /* fin */ [cl, cw, ss, tw, tw, tw, cl, cw, la, li, tw],
            /* ack */ [cl, es, ss, es, fw, tw, cl, cw, cl, li, es],
            /* rst */ [cl, cl, cl, sr, cl, cl, cl, cl, la, li, sr],
        ],
        // OUTPUT (server -> client)
        [
            /* syn */ [ss, es, ss, sr, ss, ss, ss, ss, ss, li, sr],
            /* fin */ [tw, fw, ss, tw, fw, tw, cl, tw, la, li, tw],
            /* ack */ [es, es, ss, es, fw, tw, cl, cw, la, es, es],
            /* rst */ [cl, cl, ss, cl, cl, tw, cl, cl, cl, cl, cl],
        ],
        // INPUT-ONLY (client -> server, no output seen)
        [
            /* syn */ [sr, es, es, sr, sr, sr, sr, sr, sr, sr, sr],
            /* fin */ [cl, fw, ss, tw, fw, tw, cl, cw, la, li, tw],
            /* ack */ [cl, es, ss, es, fw, tw, cl, cw, cl, li, es],
            /* rst */ [cl, cl, cl, sr, cl, cl, cl, cl, la, li, cl],
        ],
    ]
};

/// The TCP state after a segment with `flags` travelling `dir`, by the
/// INPUT-ONLY table when `one_way` (see `TCP_STATES`). Non-TCP states
/// are returned unchanged.
///
/// Inline, the two answers most packets get: a non-TCP state stays, and
/// so does an established flow on a plain ACK (no SYN, FIN or RST) in
/// every table. The rest reads the table, out of line
/// (`the_inline_answers_are_the_table_s` checks every state, flag set,
/// direction and table against it).
#[inline(always)]
pub fn tcp_next(state: FlowState, dir: Direction, flags: u8, one_way: bool) -> FlowState {
    let events = tcp_flags::SYN | tcp_flags::FIN | tcp_flags::RST | tcp_flags::ACK;
    if state.index() > S::SynAck.index()
        || (state == S::Established && flags & events == tcp_flags::ACK)
    {
        return state;
    }
    tcp_next_in_table(state, dir, flags, one_way)
}

/// [`tcp_next`] by the table alone.
#[inline(never)]
fn tcp_next_in_table(state: FlowState, dir: Direction, flags: u8, one_way: bool) -> FlowState {
    let row = state.index();
    if row > S::SynAck.index() {
        return state;
    }
    let event = if flags & tcp_flags::RST != 0 {
        3
    } else if flags & tcp_flags::SYN != 0 {
        0
    } else if flags & tcp_flags::FIN != 0 {
        1
    } else if flags & tcp_flags::ACK != 0 {
        2
    } else {
        return S::Close;
    };
    let table = match (one_way, dir) {
        (true, _) => 2,
        (false, d) => d as usize,
    };
    TCP_STATES[table][event][row]
}

#[cfg(test)]
mod tests {
    use super::tcp_flags::*;
    use super::*;
    use Direction::{Original as In, Reply as Out};

    /// The states IPVS's table has a column for (sNO..sSA), in order.
    fn tcp_rows() -> &'static [FlowState] {
        &FlowState::ALL[..=S::SynAck.index()]
    }

    #[test]
    fn the_inline_answers_are_the_table_s() {
        for state in FlowState::ALL {
            for dir in [In, Out] {
                for one_way in [false, true] {
                    for flags in 0..=u8::MAX {
                        assert_eq!(
                            tcp_next(state, dir, flags, one_way),
                            tcp_next_in_table(state, dir, flags, one_way),
                            "{state:?} {dir:?} {flags:#04x} one way: {one_way}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn handshake_data_and_close_from_the_client() {
        let mut s = S::None;
        for (dir, flags, want) in [
            (In, SYN, S::SynRecv),
            (Out, SYN | ACK, S::SynRecv),
            (In, ACK, S::Established),
            (In, ACK, S::Established),
            (Out, ACK, S::Established),
            (In, FIN | ACK, S::CloseWait),
            (Out, ACK, S::CloseWait),
            (Out, FIN | ACK, S::TimeWait),
            (In, ACK, S::TimeWait),
        ] {
            s = tcp_next(s, dir, flags, false);
            assert_eq!(s, want, "after {dir:?} {flags:#04x}");
        }
    }

    #[test]
    fn close_from_the_server() {
        let mut s = S::Established;
        for (dir, flags, want) in [
            (Out, FIN | ACK, S::FinWait),
            (In, ACK, S::FinWait),
            (In, FIN | ACK, S::TimeWait),
            (Out, ACK, S::TimeWait),
        ] {
            s = tcp_next(s, dir, flags, false);
            assert_eq!(s, want);
        }
    }

    #[test]
    fn event_priority_is_rst_syn_fin_ack() {
        assert_eq!(
            tcp_next(S::Established, In, RST | SYN | FIN | ACK, false),
            S::Close
        );
        assert_eq!(
            tcp_next(S::Established, In, SYN | FIN | ACK, false),
            S::Established
        );
        assert_eq!(tcp_next(S::Established, In, FIN | ACK, false), S::CloseWait);
        // No flag at all closes the flow, as IPVS does.
        assert_eq!(tcp_next(S::Established, In, 0, false), S::Close);
        assert_eq!(
            tcp_next(S::Established, In, 0x08 /* PSH */, false),
            S::Close
        );
    }

    /// The whole IPVS table, cell by cell: every (direction, event, state).
    #[test]
    fn every_transition_matches_ipvs() {
        use S::*;
        let states = tcp_rows();
        // Rows copied from ip_vs_proto_tcp.c (sNO..sSA), INPUT then OUTPUT.
        let want: [[[FlowState; 11]; 4]; 2] = [
            [
                [
                    SynRecv,
                    Established,
                    Established,
                    SynRecv,
                    SynRecv,
                    SynRecv,
                    SynRecv,
                    SynRecv,
                    SynRecv,
                    SynRecv,
                    SynRecv,
                ],
                [
                    Close, CloseWait, SynSent, TimeWait, TimeWait, TimeWait, Close, CloseWait,
                    LastAck, Listen, TimeWait,
                ],
                [
                    Close,
                    Established,
                    SynSent,
                    Established,
                    FinWait,
                    TimeWait,
                    Close,
                    CloseWait,
                    Close,
                    Listen,
                    Established,
                ],
                [
                    Close, Close, Close, SynRecv, Close, Close, Close, Close, LastAck, Listen,
                    SynRecv,
                ],
            ],
            [
                [
                    SynSent,
                    Established,
                    SynSent,
                    SynRecv,
                    SynSent,
                    SynSent,
                    SynSent,
                    SynSent,
                    SynSent,
                    Listen,
                    SynRecv,
                ],
                [
                    TimeWait, FinWait, SynSent, TimeWait, FinWait, TimeWait, Close, TimeWait,
                    LastAck, Listen, TimeWait,
                ],
                [
                    Established,
                    Established,
                    SynSent,
                    Established,
                    FinWait,
                    TimeWait,
                    Close,
                    CloseWait,
                    LastAck,
                    Established,
                    Established,
                ],
                [
                    Close, Close, SynSent, Close, Close, TimeWait, Close, Close, Close, Close,
                    Close,
                ],
            ],
        ];
        let events = [SYN, FIN, ACK, RST];
        for (d, dir) in [In, Out].into_iter().enumerate() {
            for (e, flags) in events.into_iter().enumerate() {
                for (i, s) in states.iter().copied().enumerate() {
                    assert_eq!(
                        tcp_next(s, dir, flags, false),
                        want[d][e][i],
                        "{dir:?} {flags:#04x} from {s:?}"
                    );
                }
            }
        }
    }

    /// The INPUT-ONLY rows, cell by cell, as ip_vs_proto_tcp.c has them
    /// (sNO..sSA); either direction of a one-way flow reads them.
    #[test]
    fn one_way_flows_follow_the_input_only_table() {
        use S::*;
        let states = tcp_rows();
        let (es, ss, sr, fw, tw) = (Established, SynSent, SynRecv, FinWait, TimeWait);
        let (cl, cw, la, li) = (Close, CloseWait, LastAck, Listen);
        let want = [
            [sr, es, es, sr, sr, sr, sr, sr, sr, sr, sr],
            [cl, fw, ss, tw, fw, tw, cl, cw, la, li, tw],
            [cl, es, ss, es, fw, tw, cl, cw, cl, li, es],
            [cl, cl, cl, sr, cl, cl, cl, cl, la, li, cl],
        ];
        for (e, flags) in [SYN, FIN, ACK, RST].into_iter().enumerate() {
            for (i, s) in states.iter().copied().enumerate() {
                for dir in [In, Out] {
                    assert_eq!(
                        tcp_next(s, dir, flags, true),
                        want[e][i],
                        "{flags:#04x} {s:?}"
                    );
                }
            }
        }
        // A client that closes first leaves the flow in FIN_WAIT (its
        // timeout), where INPUT would have gone to CLOSE_WAIT.
        let mut s = S::None;
        for flags in [SYN, ACK, ACK, FIN | ACK, ACK] {
            s = tcp_next(s, In, flags, true);
        }
        assert_eq!(s, FinWait);
    }

    #[test]
    fn only_established_is_active() {
        for s in FlowState::ALL {
            assert_eq!(s.is_active(), s == S::Established);
        }
    }

    #[test]
    fn every_timeout_is_the_configured_one() {
        let t = Timeouts::default();
        let want = [
            (S::Established, 900),
            (S::SynSent, 120),
            (S::SynRecv, 60),
            (S::FinWait, 120),
            (S::TimeWait, 120),
            (S::Close, 10),
            (S::CloseWait, 60),
            (S::LastAck, 30),
            (S::SynAck, 120),
            (S::Udp, 300),
            (S::Icmp, 60),
            (S::None, 2),
            (S::Listen, 120),
        ];
        for (s, secs) in want {
            assert_eq!(s.timeout(&t), secs, "{s:?}");
        }
        let custom = Timeouts {
            established: 7,
            close: 3,
            ..t
        };
        assert_eq!(S::Established.timeout(&custom), 7);
        assert_eq!(S::Close.timeout(&custom), 3);
    }

    #[test]
    fn non_tcp_states_do_not_move() {
        for s in [S::Udp, S::Icmp, S::Template] {
            assert_eq!(tcp_next(s, In, RST, false), s);
        }
    }

    #[test]
    fn names_are_ipvsadm_s() {
        assert_eq!(S::SynRecv.name(), "SYN_RECV");
        assert_eq!(S::Udp.name(), "UDP");
        for (i, s) in FlowState::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
            assert_eq!(FlowState::from_index(i as u8), *s);
        }
    }
}
