//! The sync datagram, version 1 (documented in `docs/sync.md`): a header,
//! records of one kind, and an HMAC-SHA256 of both when the cluster has a
//! key. All integers big-endian.
//!
//! ```text
//! header (24 bytes)
//!   0  magic    "XVSS"
//!   4  version  1
//!   5  sync_id  the cluster's id (ipvsadm --syncid): others are dropped
//!   6  kind     1 flows | 2 hello
//!   7  flags    bit 0: a 32-byte HMAC-SHA256 of header and body follows
//!   8  node     the sender's node id
//!  12  epoch    the sender's start (a restarted sender begins a new one)
//!  16  seq      datagram number within the epoch (from 1, +1 each)
//!  20  count    records
//!  22  length   body bytes
//! flow record (40 bytes IPv4, 88 IPv6)
//!   0  op       1 update | 2 delete
//!   1  family   4 | 6
//!   2  proto    6 TCP | 17 UDP | 1 ICMP
//!   3  state    conntrack state (ESTABLISHED 1, ... TEMPLATE 13)
//!   4  flags    bit 0 one-way (route/tunnel), bit 1 persistence template
//!   5  lag      seconds the record waited at the sender (capped at 255)
//!   6  client MAC (6 bytes)
//!  12  timeout  seconds left (templates), else the state's at the sender
//!  16  client, vip, backend, snat: address (4 or 16 bytes), port (2)
//! hello record (4 + 4 or 16 bytes): an address the sender serves
//!   0  family   4 | 6
//!   1  role     1 SNAT address | 2 VIP
//!   2  reserved (2 bytes, 0)
//!   4  address
//! ```
//!
//! Invariants: [`parse`] accepts a datagram only whole: the header, the
//! authentication (checked before anything else is read when a key is
//! set: a datagram without a valid HMAC is never looked into) and every
//! record must be valid, else it is refused with one [`SyncDrop`] reason
//! and nothing of it is used. Encoding never writes past
//! [`MAX_DATAGRAM`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ring::hmac;
use xvs_conntrack::{Endpoint, FlowState, L4Proto};

/// Largest datagram (a 1500-byte MTU less IPv4 and UDP headers).
pub const MAX_DATAGRAM: usize = 1472;
/// Header bytes.
pub const HEADER: usize = 24;
/// HMAC-SHA256 trailer bytes.
pub const MAC: usize = 32;
/// The magic.
pub const MAGIC: [u8; 4] = *b"XVSS";
/// The format's version.
pub const VERSION: u8 = 1;

/// What a datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Flow records.
    Flows = 1,
    /// The sender's addresses (also its heartbeat).
    Hello = 2,
}

/// What a flow record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The flow exists, in this state.
    Update = 1,
    /// The flow ended.
    Delete = 2,
}

/// One flow (or persistence template) as the gateways tell each other.
/// Services and backends are named by their endpoints, never by ids
/// (each gateway numbers its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncRecord {
    /// Update or delete.
    pub op: Op,
    /// Protocol.
    pub proto: L4Proto,
    /// State (`Template` for a template).
    pub state: FlowState,
    /// Only the client's direction passes the gateway.
    pub one_way: bool,
    /// Seconds the record waited at the sender before it was sent.
    pub lag: u8,
    /// The client side's next hop (the first packet's source MAC).
    pub client_mac: [u8; 6],
    /// Seconds left (templates); the state's timeout otherwise.
    pub timeout: u32,
    /// Client (a template: the client network, port 0).
    pub client: Endpoint<IpAddr>,
    /// VIP and port.
    pub vip: Endpoint<IpAddr>,
    /// Backend.
    pub backend: Endpoint<IpAddr>,
    /// SNAT end (unspecified for one-way flows and templates).
    pub snat: Endpoint<IpAddr>,
}

/// Why an address is announced in a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// One of the sender's SNAT addresses.
    Snat = 1,
    /// A VIP the sender serves.
    Vip = 2,
}

/// A datagram's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Sync id.
    pub sync_id: u8,
    /// Kind.
    pub kind: Kind,
    /// Sender.
    pub node: u32,
    /// Sender's epoch.
    pub epoch: u32,
    /// Sequence number.
    pub seq: u32,
    /// Records.
    pub count: u16,
}

/// A datagram's body, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Flow records.
    Flows(Vec<SyncRecord>),
    /// Announced addresses.
    Hello(Vec<(IpAddr, Role)>),
}

macro_rules! sync_drops {
    ($($(#[$m:meta])* $v:ident = $n:literal,)*) => {
        /// Why a received sync datagram was dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum SyncDrop { $($(#[$m])* $v,)* }

        impl SyncDrop {
            /// Every reason, in index order.
            pub const ALL: &'static [SyncDrop] = &[$(SyncDrop::$v,)*];
            /// How many there are.
            pub const COUNT: usize = Self::ALL.len();
            /// Its name (the `reason` label).
            pub const fn name(self) -> &'static str {
                match self { $(SyncDrop::$v => $n,)* }
            }
            /// Dense index.
            pub const fn index(self) -> usize {
                self as usize
            }
        }
    };
}

sync_drops! {
    /// Shorter than its header says.
    Truncated = "truncated",
    /// Not an xvs sync datagram.
    BadMagic = "bad_magic",
    /// A version this build does not read.
    BadVersion = "bad_version",
    /// Another cluster's sync id.
    OtherSyncId = "other_sync_id",
    /// No HMAC while this gateway has a key (or one it has no key for).
    Unauthenticated = "unauthenticated",
    /// The HMAC does not verify.
    BadMac = "bad_mac",
    /// A header or record field out of range.
    Malformed = "malformed",
    /// Sent by this gateway (multicast loops back).
    FromSelf = "from_self",
    /// A sequence number seen already in the sender's epoch.
    Replayed = "replayed",
    /// From a node that is not a configured peer.
    UnknownPeer = "unknown_peer",
}

/// Builds datagrams of one kind, record after record.
pub struct Builder {
    buf: [u8; MAX_DATAGRAM],
    len: usize,
    count: u16,
    kind: Kind,
}

impl Builder {
    /// An empty datagram of `kind`.
    pub fn new(kind: Kind) -> Builder {
        Builder {
            buf: [0; MAX_DATAGRAM],
            len: HEADER,
            count: 0,
            kind,
        }
    }

    /// What it carries.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Records so far.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Starts over, empty.
    pub fn clear(&mut self) {
        self.len = HEADER;
        self.count = 0;
    }

    /// Appends a flow record; false (nothing written) when it does not fit
    /// with room for the HMAC.
    pub fn push(&mut self, r: &SyncRecord) -> bool {
        let size = record_size(r.client.addr);
        if self.kind != Kind::Flows || self.len + size + MAC > MAX_DATAGRAM {
            return false;
        }
        let b = &mut self.buf[self.len..self.len + size];
        b[0] = r.op as u8;
        b[1] = family(r.client.addr);
        b[2] = r.proto.number();
        b[3] = r.state.index() as u8;
        b[4] = u8::from(r.one_way) | (u8::from(r.state == FlowState::Template) << 1);
        b[5] = r.lag;
        b[6..12].copy_from_slice(&r.client_mac);
        b[12..16].copy_from_slice(&r.timeout.to_be_bytes());
        let mut at = 16;
        for e in [r.client, r.vip, r.backend, r.snat] {
            at += put_endpoint(&mut b[at..], e, r.client.addr.is_ipv6());
        }
        self.len += size;
        self.count += 1;
        true
    }

    /// Appends an announced address; false when it does not fit.
    pub fn push_address(&mut self, addr: IpAddr, role: Role) -> bool {
        let size = 4 + addr_len(addr.is_ipv6());
        if self.kind != Kind::Hello || self.len + size + MAC > MAX_DATAGRAM {
            return false;
        }
        let b = &mut self.buf[self.len..self.len + size];
        b[0] = family(addr);
        b[1] = role as u8;
        b[2..4].fill(0);
        put_addr(&mut b[4..], addr);
        self.len += size;
        self.count += 1;
        true
    }

    /// The finished datagram: header filled, HMAC appended with `key`.
    pub fn finish(
        &mut self,
        sync_id: u8,
        node: u32,
        epoch: u32,
        seq: u32,
        key: Option<&hmac::Key>,
    ) -> &[u8] {
        let body = (self.len - HEADER) as u16;
        let h = &mut self.buf[..HEADER];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = sync_id;
        h[6] = self.kind as u8;
        h[7] = u8::from(key.is_some());
        h[8..12].copy_from_slice(&node.to_be_bytes());
        h[12..16].copy_from_slice(&epoch.to_be_bytes());
        h[16..20].copy_from_slice(&seq.to_be_bytes());
        h[20..22].copy_from_slice(&self.count.to_be_bytes());
        h[22..24].copy_from_slice(&body.to_be_bytes());
        let mut end = self.len;
        if let Some(k) = key {
            let tag = hmac::sign(k, &self.buf[..end]);
            self.buf[end..end + MAC].copy_from_slice(tag.as_ref());
            end += MAC;
        }
        &self.buf[..end]
    }
}

/// Checks a received datagram whole (see the module's invariants): the
/// header, then with `key` its HMAC, then every record.
pub fn parse(buf: &[u8], sync_id: u8, key: Option<&hmac::Key>) -> Result<(Header, Body), SyncDrop> {
    if buf.len() < HEADER {
        return Err(SyncDrop::Truncated);
    }
    if buf[0..4] != MAGIC {
        return Err(SyncDrop::BadMagic);
    }
    if buf[4] != VERSION {
        return Err(SyncDrop::BadVersion);
    }
    let be16 = |at: usize| u16::from_be_bytes([buf[at], buf[at + 1]]);
    let be32 = |at: usize| u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    let (flags, count, length) = (buf[7], be16(20), usize::from(be16(22)));
    let signed = flags & 1 != 0;
    let end = HEADER + length;
    let total = end + if signed { MAC } else { 0 };
    if buf.len() < total {
        return Err(SyncDrop::Truncated);
    }
    if buf.len() > total || flags & !1 != 0 {
        return Err(SyncDrop::Malformed);
    }
    // Authentication before anything else is believed: the sync id too.
    match (key, signed) {
        (Some(k), true) => {
            hmac::verify(k, &buf[..end], &buf[end..total]).map_err(|_| SyncDrop::BadMac)?
        }
        (None, false) => {}
        _ => return Err(SyncDrop::Unauthenticated),
    }
    if buf[5] != sync_id {
        return Err(SyncDrop::OtherSyncId);
    }
    let kind = match buf[6] {
        1 => Kind::Flows,
        2 => Kind::Hello,
        _ => return Err(SyncDrop::Malformed),
    };
    let header = Header {
        sync_id,
        kind,
        node: be32(8),
        epoch: be32(12),
        seq: be32(16),
        count,
    };
    let mut body = &buf[HEADER..end];
    let out = match kind {
        Kind::Flows => {
            let mut v = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let (r, n) = record(body).ok_or(SyncDrop::Malformed)?;
                v.push(r);
                body = &body[n..];
            }
            Body::Flows(v)
        }
        Kind::Hello => {
            let mut v = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let (a, n) = address(body).ok_or(SyncDrop::Malformed)?;
                v.push(a);
                body = &body[n..];
            }
            Body::Hello(v)
        }
    };
    if !body.is_empty() {
        return Err(SyncDrop::Malformed);
    }
    Ok((header, out))
}

/// The HMAC key of `secret` (the file's bytes).
pub fn key(secret: &[u8]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, secret)
}

fn family(a: IpAddr) -> u8 {
    if a.is_ipv6() {
        6
    } else {
        4
    }
}

fn addr_len(v6: bool) -> usize {
    if v6 {
        16
    } else {
        4
    }
}

/// Bytes of a flow record of `addr`'s family.
pub fn record_size(addr: IpAddr) -> usize {
    16 + 4 * (addr_len(addr.is_ipv6()) + 2)
}

fn put_addr(b: &mut [u8], a: IpAddr) -> usize {
    match a {
        IpAddr::V4(a) => {
            b[..4].copy_from_slice(&a.octets());
            4
        }
        IpAddr::V6(a) => {
            b[..16].copy_from_slice(&a.octets());
            16
        }
    }
}

/// Writes `e` in the record's family (an address of the other family,
/// never produced, is written as the family's unspecified one).
fn put_endpoint(b: &mut [u8], e: Endpoint<IpAddr>, v6: bool) -> usize {
    let addr = match (e.addr, v6) {
        (IpAddr::V4(_), false) | (IpAddr::V6(_), true) => e.addr,
        (_, false) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (_, true) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let n = put_addr(b, addr);
    b[n..n + 2].copy_from_slice(&e.port.to_be_bytes());
    n + 2
}

fn get_addr(b: &[u8], v6: bool) -> Option<IpAddr> {
    Some(if v6 {
        let o: [u8; 16] = b.get(..16)?.try_into().ok()?;
        IpAddr::V6(Ipv6Addr::from(o))
    } else {
        let o: [u8; 4] = b.get(..4)?.try_into().ok()?;
        IpAddr::V4(Ipv4Addr::from(o))
    })
}

fn get_endpoint(b: &[u8], v6: bool) -> Option<Endpoint<IpAddr>> {
    let n = addr_len(v6);
    let addr = get_addr(b, v6)?;
    let p = b.get(n..n + 2)?;
    Some(Endpoint {
        addr,
        port: u16::from_be_bytes([p[0], p[1]]),
    })
}

/// One flow record at the start of `b`, checked, and its size.
fn record(b: &[u8]) -> Option<(SyncRecord, usize)> {
    let head = b.get(..16)?;
    let op = match head[0] {
        1 => Op::Update,
        2 => Op::Delete,
        _ => return None,
    };
    let v6 = match head[1] {
        4 => false,
        6 => true,
        _ => return None,
    };
    let proto = match head[2] {
        6 => L4Proto::Tcp,
        17 => L4Proto::Udp,
        1 => L4Proto::Icmp,
        _ => return None,
    };
    let state = *FlowState::ALL.get(usize::from(head[3]))?;
    let flags = head[4];
    if flags & !3 != 0 {
        return None;
    }
    let (one_way, template) = (flags & 1 != 0, flags & 2 != 0);
    // A template is in the template state and nothing else is; a flow's
    // state is its protocol's.
    let fits = match (template, proto, state) {
        (true, _, FlowState::Template) => !one_way,
        (true, _, _) | (false, _, FlowState::Template | FlowState::None) => false,
        (false, L4Proto::Udp, s) => s == FlowState::Udp,
        (false, L4Proto::Icmp, s) => s == FlowState::Icmp,
        (false, L4Proto::Tcp, s) => !matches!(s, FlowState::Udp | FlowState::Icmp),
    };
    if !fits {
        return None;
    }
    let mut client_mac = [0u8; 6];
    client_mac.copy_from_slice(&head[6..12]);
    let timeout = u32::from_be_bytes([head[12], head[13], head[14], head[15]]);
    let step = addr_len(v6) + 2;
    let mut ends = [Endpoint {
        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        port: 0,
    }; 4];
    for (i, e) in ends.iter_mut().enumerate() {
        *e = get_endpoint(b.get(16 + i * step..)?, v6)?;
    }
    let [client, vip, backend, snat] = ends;
    Some((
        SyncRecord {
            op,
            proto,
            state,
            one_way,
            lag: head[5],
            client_mac,
            timeout,
            client,
            vip,
            backend,
            snat,
        },
        16 + 4 * step,
    ))
}

/// One hello address at the start of `b`, checked, and its size.
fn address(b: &[u8]) -> Option<((IpAddr, Role), usize)> {
    let head = b.get(..4)?;
    let v6 = match head[0] {
        4 => false,
        6 => true,
        _ => return None,
    };
    let role = match head[1] {
        1 => Role::Snat,
        2 => Role::Vip,
        _ => return None,
    };
    if head[2] != 0 || head[3] != 0 {
        return None;
    }
    let addr = get_addr(&b[4..], v6)?;
    Some(((addr, role), 4 + addr_len(v6)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ep(a: &str, port: u16) -> Endpoint<IpAddr> {
        Endpoint {
            addr: a.parse().unwrap(),
            port,
        }
    }

    fn rec(n: u16) -> SyncRecord {
        SyncRecord {
            op: Op::Update,
            proto: L4Proto::Tcp,
            state: FlowState::Established,
            one_way: false,
            lag: 0,
            client_mac: [2, 0, 0, 0, 0, 1],
            timeout: 900,
            client: ep("198.18.0.10", 40_000 + n),
            vip: ep("198.19.0.1", 80),
            backend: ep("198.18.2.10", 8080),
            snat: ep("198.18.1.2", 1024 + n),
        }
    }

    #[test]
    fn records_round_trip_signed_and_not() {
        let k = key(b"secret");
        for key in [None, Some(&k)] {
            let mut b = Builder::new(Kind::Flows);
            let mut six = rec(1);
            six.client = ep("2001:2::10", 5);
            six.vip = ep("2001:2::1", 80);
            six.backend = ep("2001:2:0:2::10", 8080);
            six.snat = ep("2001:2:0:1::2", 1024);
            let mut tmpl = rec(2);
            tmpl.state = FlowState::Template;
            tmpl.snat = ep("0.0.0.0", 0);
            let all = [rec(0), six, tmpl];
            for r in &all {
                assert!(b.push(r));
            }
            let d = b.finish(7, 1, 99, 5, key).to_vec();
            let (h, body) = parse(&d, 7, key).unwrap();
            assert_eq!(
                (h.node, h.epoch, h.seq, h.count, h.kind),
                (1, 99, 5, 3, Kind::Flows)
            );
            assert_eq!(body, Body::Flows(all.to_vec()));
        }
    }

    #[test]
    fn a_datagram_fills_to_its_limit_and_no_further() {
        let mut b = Builder::new(Kind::Flows);
        let mut n = 0;
        while b.push(&rec(n)) {
            n += 1;
        }
        assert_eq!(usize::from(n), (MAX_DATAGRAM - HEADER - MAC) / 40);
        let k = key(b"k");
        assert!(b.finish(1, 1, 1, 1, Some(&k)).len() <= MAX_DATAGRAM);
    }

    #[test]
    fn bad_datagrams_are_refused_with_their_reason() {
        let k = key(b"secret");
        let mut b = Builder::new(Kind::Flows);
        b.push(&rec(0));
        let good = b.finish(7, 1, 1, 1, Some(&k)).to_vec();
        assert!(parse(&good, 7, Some(&k)).is_ok());
        let flip = |at: usize| {
            let mut d = good.clone();
            d[at] ^= 0x40;
            d
        };
        assert_eq!(parse(&good[..10], 7, Some(&k)), Err(SyncDrop::Truncated));
        assert_eq!(
            parse(&good[..good.len() - 1], 7, Some(&k)),
            Err(SyncDrop::Truncated)
        );
        assert_eq!(parse(&flip(0), 7, Some(&k)), Err(SyncDrop::BadMagic));
        assert_eq!(parse(&flip(4), 7, Some(&k)), Err(SyncDrop::BadVersion));
        // Any other byte changed: the HMAC fails before it is read.
        for at in [5, 6, 9, 17, HEADER, HEADER + 3, good.len() - 1] {
            assert_eq!(
                parse(&flip(at), 7, Some(&k)),
                Err(SyncDrop::BadMac),
                "byte {at}"
            );
        }
        assert_eq!(parse(&good, 7, Some(&key(b"other"))), Err(SyncDrop::BadMac));
        assert_eq!(parse(&good, 7, None), Err(SyncDrop::Unauthenticated));
        assert_eq!(parse(&good, 8, Some(&k)), Err(SyncDrop::OtherSyncId));
        let mut b = Builder::new(Kind::Flows);
        b.push(&rec(0));
        let plain = b.finish(7, 1, 1, 1, None).to_vec();
        assert_eq!(parse(&plain, 7, Some(&k)), Err(SyncDrop::Unauthenticated));
        // Nonsense in a record, without a key: refused whole.
        for (at, v) in [
            (HEADER, 9),
            (HEADER + 1, 5),
            (HEADER + 2, 47),
            (HEADER + 3, 200),
            (HEADER + 4, 4),
        ] {
            let mut d = plain.clone();
            d[at] = v;
            assert_eq!(
                parse(&d, 7, None),
                Err(SyncDrop::Malformed),
                "byte {at} = {v}"
            );
        }
        // A UDP flow in a TCP state.
        let mut d = plain.clone();
        d[HEADER + 2] = 17;
        assert_eq!(parse(&d, 7, None), Err(SyncDrop::Malformed));
        // More records announced than there are.
        let mut d = plain.clone();
        d[21] = 2;
        assert_eq!(parse(&d, 7, None), Err(SyncDrop::Malformed));
        // Trailing bytes.
        let mut d = plain.clone();
        d.push(0);
        assert_eq!(parse(&d, 7, None), Err(SyncDrop::Malformed));
    }

    #[test]
    fn hellos_carry_addresses() {
        let mut b = Builder::new(Kind::Hello);
        assert!(!b.push(&rec(0)), "no flows in a hello");
        b.push_address("198.18.1.2".parse().unwrap(), Role::Snat);
        b.push_address("2001:2::1".parse().unwrap(), Role::Vip);
        let d = b.finish(0, 3, 4, 5, None).to_vec();
        let (h, body) = parse(&d, 0, None).unwrap();
        assert_eq!(h.kind, Kind::Hello);
        assert_eq!(
            body,
            Body::Hello(vec![
                ("198.18.1.2".parse().unwrap(), Role::Snat),
                ("2001:2::1".parse().unwrap(), Role::Vip)
            ])
        );
    }
}
