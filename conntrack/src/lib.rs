//! xvs-conntrack: the per-queue connection tracking table (sans-IO: `now` is
//! an argument, one table per worker, no locks).
//!
//! - [`FlowTable`]: both directions of every flow indexed to one entry of a
//!   preallocated slab; IPVS's TCP states and timeouts ([`FlowState`]); a
//!   timer wheel advanced with bounded work; oldest-non-ESTABLISHED early
//!   drop; persistence templates; chunked dump and delete by filter.
//! - [`Observer`]: how the table reports per-backend active/inactive
//!   changes (for the schedulers) and removals (for flow events).

mod batch;
mod check;
mod counter_table;
mod dump;
mod fresh;
mod huge;
mod index;
mod key;
mod keyed;
mod migrate;
mod persist;
mod region;
mod slab;
mod state;
mod stats;
mod table;

pub use batch::{prefetch, prefetch_bytes, prefetch_lines, BATCH, CACHE_RESIDENT_FLOWS};
pub use dump::{Filter, FlowInfo};
pub use key::{Endpoint, FlowKey, L4Proto};
pub use keyed::Keyed;
pub use persist::{
    digest, layout_signature, Adopted, FlatAddress, Opened, StateIdentity, IDENTITY_SCHEME,
    LAYOUT_VERSION,
};
pub use slab::{FLAG_QUIESCED, FLAG_TEMPLATE};
pub use state::{tcp_flags, tcp_next, Direction, FlowState};
pub use stats::{Removal, Stats};
pub use table::{
    Advance, FlowId, FlowRef, FlowTable, InsertError, NewFlow, Observer, Packet, MAX_CAPACITY,
};
pub use xvs_config::Timeouts;
