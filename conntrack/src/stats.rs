//! Counters of a flow table: what `conntrack -S` shows, and more.
//!
//! Invariant (checked by the property tests): entries in the table =
//! `insert - delete - expire - early_drop - reschedule - nodest - reclaim`;
//! every refused new flow is in `drop` (table full) or `insert_failed` (a
//! key already tracked).

/// Event counters of one table (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups that found an entry.
    pub found: u64,
    /// Lookups that found nothing.
    pub miss: u64,
    /// Entries inserted (flows and persistence templates).
    pub insert: u64,
    /// Inserts refused because a key was already tracked.
    pub insert_failed: u64,
    /// Packets the caller could not track (e.g. a TCP segment without SYN
    /// for an unknown flow).
    pub invalid: u64,
    /// New flows refused because the table was full and nothing could be
    /// early-dropped.
    pub drop: u64,
    /// Non-ESTABLISHED entries evicted to make room.
    pub early_drop: u64,
    /// Entries deleted on request (delete, flush, filters).
    pub delete: u64,
    /// Entries that timed out.
    pub expire: u64,
    /// Inserts that found the table full (whether or not an early drop
    /// then made room).
    pub table_full: u64,
    /// Flows ended because a new connection reused their client port
    /// (a SYN on a TIME_WAIT/CLOSE flow, or on a flow to a quiesced
    /// backend): IPVS's `conn_reuse_mode`.
    pub reschedule: u64,
    /// Flows ended at their next packet because their backend (or their
    /// service) was removed: IPVS's `expire_nodest_conn`.
    pub nodest: u64,
    /// Non-ESTABLISHED flows ended to free their SNAT port for a new flow
    /// (SYN flood and port-shortage defence).
    pub reclaim: u64,
}

/// Why an entry left the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its timeout passed.
    Expired,
    /// Deleted on request.
    Deleted,
    /// Evicted to make room for a new flow.
    EarlyDropped,
    /// Ended because a new connection reused its client port.
    Rescheduled,
    /// Ended because its backend or service was removed.
    NoDest,
    /// Ended to free its SNAT port for a new flow.
    Reclaimed,
}
