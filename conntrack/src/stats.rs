//! Counters of a flow table: what `conntrack -S` shows, and more.
//!
//! Invariant (checked by the property tests): entries in the table =
//! `insert + adopt - delete - expire - early_drop - reschedule - nodest - reclaim`;
//! every refused new flow is in `drop` (table full) or `insert_failed` (a
//! key already tracked).

crate::counter_table! {
    /// Event counters of one table (monotonic).
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(default)]
    pub struct Stats {
        /// Lookups that found an entry.
        found => "",
        /// Lookups that found nothing.
        miss => "",
        /// Entries inserted (flows and persistence templates).
        insert => "",
        /// Entries adopted from the state file an earlier process left
        /// (a restart, a crash, an upgrade).
        adopt => "",
        /// Entries of that state file dropped instead: insane, duplicate,
        /// or of a service or backend this process does not have.
        adopt_dropped => "",
        /// Inserts refused because a key was already tracked.
        insert_failed => "",
        /// Packets the caller could not track (e.g. a TCP segment without SYN
        /// for an unknown flow).
        invalid => "",
        /// New flows refused because the table was full and nothing could be
        /// early-dropped.
        drop => "",
        /// Non-ESTABLISHED entries evicted to make room.
        early_drop => "",
        /// Entries deleted on request (delete, flush, filters).
        delete => "",
        /// Entries that timed out.
        expire => "",
        /// Inserts that found the table full (whether or not an early drop
        /// then made room).
        table_full => "",
        /// Flows ended because a new connection reused their client port
        /// (a SYN on a TIME_WAIT/CLOSE flow, or on a flow to a quiesced
        /// backend): IPVS's `conn_reuse_mode`.
        reschedule => "",
        /// Flows ended at their next packet because their backend (or their
        /// service) was removed: IPVS's `expire_nodest_conn`.
        nodest => "",
        /// Non-ESTABLISHED flows ended to free their SNAT port for a new flow
        /// (SYN flood and port-shortage defence).
        reclaim => "",
    }
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
