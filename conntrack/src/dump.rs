//! Listing and deleting entries by filter (`conntrack -L`, `-D -d ADDR`,
//! `ipvsadm -Lnc`), in resumable chunks so a worker is never stopped for
//! long: each call walks at most a budget of slab slots from a cursor and
//! returns the cursor to continue from (`None` when the walk is complete).
//!
//! A walk is not a snapshot: entries created or removed between chunks may
//! or may not be seen, as with `conntrack -L` on a live table.
//!
//! A filter that names a flow's whole original tuple (client and VIP
//! address and port, protocol; templates excluded) selects at most one
//! flow: that one is found by a lookup instead of a walk, in the first
//! call, which also ends it (`conntrack -D` and `-G` with a whole tuple
//! find their entry by hash the same way). Such a delete costs the same
//! whatever the table's size.

use std::net::Ipv4Addr;

use xvs_config::Address;

use crate::key::{Endpoint, FlowKey, L4Proto};
use crate::slab::{Entry, FLAG_QUIESCED};
use crate::state::FlowState;
use crate::table::{FlowId, FlowRef, FlowTable, Observer};

/// Which entries a dump or delete selects; `None` fields match anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter<A: Address = Ipv4Addr> {
    /// VIP (original destination).
    pub vip: Option<A>,
    /// VIP port.
    pub vip_port: Option<u16>,
    /// Backend address (reply source).
    pub backend: Option<A>,
    /// Client address (original source).
    pub client: Option<A>,
    /// Client port (original source port).
    pub client_port: Option<u16>,
    /// Backend port (reply source port).
    pub backend_port: Option<u16>,
    /// SNAT address (reply destination).
    pub snat: Option<A>,
    /// SNAT port (reply destination port).
    pub snat_port: Option<u16>,
    /// State.
    pub state: Option<FlowState>,
    /// Protocol.
    pub proto: Option<L4Proto>,
    /// Whether persistence templates are included.
    pub templates: bool,
}

/// Matches every flow, no template (`A: Default` does not hold for
/// addresses, so not derived).
impl<A: Address> Default for Filter<A> {
    fn default() -> Self {
        Filter {
            vip: None,
            vip_port: None,
            backend: None,
            client: None,
            client_port: None,
            backend_port: None,
            snat: None,
            snat_port: None,
            state: None,
            proto: None,
            templates: false,
        }
    }
}

impl Filter<std::net::IpAddr> {
    /// The filter for family `A`'s table, or `None` when an address it
    /// names is of the other family (that table has no match).
    pub fn narrow<A: Address>(&self) -> Option<Filter<A>> {
        let n = |a: Option<std::net::IpAddr>| match a {
            None => Some(None),
            Some(a) => A::from_ip(a).map(Some),
        };
        Some(Filter {
            vip: n(self.vip)?,
            vip_port: self.vip_port,
            backend: n(self.backend)?,
            client: n(self.client)?,
            client_port: self.client_port,
            backend_port: self.backend_port,
            snat: n(self.snat)?,
            snat_port: self.snat_port,
            state: self.state,
            proto: self.proto,
            templates: self.templates,
        })
    }
}

impl<A: Address> Filter<A> {
    /// The original-direction key of the one flow this filter can select,
    /// if it names one whole (see the module docs).
    fn exact(&self) -> Option<FlowKey<A>> {
        if self.templates {
            return None;
        }
        let client = Endpoint {
            addr: self.client?,
            port: self.client_port?,
        };
        let vip = Endpoint {
            addr: self.vip?,
            port: self.vip_port?,
        };
        Some(FlowKey::between(client, vip, self.proto?))
    }

    fn matches(&self, e: &Entry<A>) -> bool {
        e.is_live()
            && (self.templates || !e.is_template())
            && self.vip.is_none_or(|a| e.vip().addr == a)
            && self.vip_port.is_none_or(|p| e.vip().port == p)
            && self.backend.is_none_or(|a| e.backend().addr == a)
            && self.client.is_none_or(|a| e.client().addr == a)
            && self.client_port.is_none_or(|p| e.client().port == p)
            && self.backend_port.is_none_or(|p| e.backend().port == p)
            && self.snat.is_none_or(|a| e.snat().addr == a)
            && self.snat_port.is_none_or(|p| e.snat().port == p)
            && self.state.is_none_or(|s| e.state() == s)
            && self.proto.is_none_or(|p| e.proto == p)
    }
}

/// A copy of one entry, for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowInfo<A: Address = Ipv4Addr> {
    /// Client.
    pub client: Endpoint<A>,
    /// VIP.
    pub vip: Endpoint<A>,
    /// Backend.
    pub backend: Endpoint<A>,
    /// SNAT address and port (unspecified for templates).
    pub snat: Endpoint<A>,
    /// Protocol.
    pub proto: L4Proto,
    /// State.
    pub state: FlowState,
    /// Seconds until it expires unless a packet comes.
    pub expires_in: u32,
    /// Packets `[original, reply]`.
    pub packets: [u32; 2],
    /// Bytes `[original, reply]`.
    pub bytes: [u64; 2],
    /// Service id.
    pub service: u32,
    /// Backend id.
    pub backend_id: u32,
    /// Whether this is a persistence template.
    pub template: bool,
    /// Whether its backend was quiesced while it lived.
    pub quiesced: bool,
}

impl<A: Address> FlowInfo<A> {
    /// The same flow with addresses of either family (for listings of
    /// both tables together).
    pub fn wide(&self) -> FlowInfo<std::net::IpAddr> {
        let w = |e: Endpoint<A>| Endpoint {
            addr: e.addr.ip(),
            port: e.port,
        };
        FlowInfo {
            client: w(self.client),
            vip: w(self.vip),
            backend: w(self.backend),
            snat: w(self.snat),
            proto: self.proto,
            state: self.state,
            expires_in: self.expires_in,
            packets: self.packets,
            bytes: self.bytes,
            service: self.service,
            backend_id: self.backend_id,
            template: self.template,
            quiesced: self.quiesced,
        }
    }

    fn of(f: FlowRef<'_, A>, now: u32) -> FlowInfo<A> {
        let e = f.0;
        FlowInfo {
            client: e.client(),
            vip: e.vip(),
            backend: e.backend(),
            snat: e.snat(),
            proto: e.proto,
            state: e.state(),
            expires_in: f.deadline().saturating_sub(now),
            packets: e.packets,
            bytes: f.bytes(),
            service: e.service,
            backend_id: e.backend_id,
            template: e.is_template(),
            quiesced: e.flags & FLAG_QUIESCED != 0,
        }
    }
}

impl<A: Address> FlowTable<A> {
    /// Appends the entries matching `filter` among at most `budget` slots
    /// from `cursor`; returns where to continue, or `None` when done.
    pub fn dump(
        &self,
        filter: &Filter<A>,
        cursor: u32,
        budget: u32,
        now: u32,
        out: &mut Vec<FlowInfo<A>>,
    ) -> Option<u32> {
        if let Some(key) = filter.exact() {
            if let Some(id) = self.selected(filter, &key, cursor) {
                out.push(FlowInfo::of(self.slab.flow(id.0), now));
            }
            return None;
        }
        let entries = &self.slab.entries;
        let end = (cursor as usize)
            .saturating_add(budget as usize)
            .min(entries.len());
        for slot in (cursor as usize).min(end)..end {
            if filter.matches(&entries[slot]) {
                out.push(FlowInfo::of(self.slab.flow(slot as u32), now));
            }
        }
        (end < entries.len()).then_some(end as u32)
    }

    /// Deletes the entries matching `filter` among at most `budget` slots
    /// from `cursor` (counted in `delete`); returns how many and where to
    /// continue, or `None` when done. A flush is the default filter with
    /// templates included.
    pub fn delete_matching(
        &mut self,
        filter: &Filter<A>,
        cursor: u32,
        budget: u32,
        obs: &mut impl Observer<A>,
    ) -> (u32, Option<u32>) {
        if let Some(key) = filter.exact() {
            let Some(id) = self.selected(filter, &key, cursor) else {
                return (0, None);
            };
            self.remove(id, obs);
            return (1, None);
        }
        let len = self.slab.entries.len();
        let end = (cursor as usize).saturating_add(budget as usize).min(len);
        let mut deleted = 0;
        for slot in cursor as usize..end {
            if filter.matches(&self.slab.entries[slot]) {
                self.remove(FlowId(slot as u32), obs);
                deleted += 1;
            }
        }
        (deleted, (end < len).then_some(end as u32))
    }

    /// The flow whose original key is `key` if `filter` (which names that
    /// key whole) selects it, in a walk's first call (`cursor` 0): found
    /// by a lookup that is not counted as a packet's.
    fn selected(&self, filter: &Filter<A>, key: &FlowKey<A>, cursor: u32) -> Option<FlowId> {
        if cursor != 0 {
            return None;
        }
        let (id, dir) = self.peek(key)?;
        (dir == crate::state::Direction::Original
            && filter.matches(&self.slab.entries[id.0 as usize]))
        .then_some(id)
    }

    /// Every live entry, for tests and small tables (not chunked).
    pub fn iter(&self) -> impl Iterator<Item = FlowRef<'_, A>> {
        (0..self.slab.capacity())
            .map(|slot| self.slab.flow(slot))
            .filter(|f| f.0.is_live())
    }
}
