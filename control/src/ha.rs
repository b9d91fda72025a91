//! More than one gateway, as operators drive it: the sync state
//! (`GET /v1/sync`, `xvsadm --list-daemon`), the takeover a keepalived
//! notify script, a BGP speaker or an operator asks for (`POST
//! /v1/sync/takeover`, `xvsadm --takeover [NODE]`), the built-in liveness
//! check (`peer_timeout`), and the sync metrics.
//!
//! Invariants: a takeover happens once per peer from the liveness check
//! (a peer heard again and silent again is taken over again only if it
//! announced new addresses: taking over is idempotent in the data plane);
//! the check reads state through the engine like every other caller.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use xvs_dataplane::runtime::SyncState;

use crate::api::{bad, internal, ApiError, Shared};

/// How often the liveness check looks at the peers.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// `POST /v1/sync/takeover`'s body.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TakeoverRequest {
    /// The peer whose addresses to take (every peer heard when absent).
    pub node: Option<u32>,
}

/// What a takeover did.
#[derive(Debug, Serialize, Deserialize)]
pub struct TakeoverDone {
    /// Addresses this gateway serves now that it did not before.
    pub taken: Vec<IpAddr>,
    /// Milliseconds the data plane took.
    pub took_ms: f64,
}

/// `GET /v1/sync`: the state, or `null` when sync is not configured.
pub async fn sync_view(State(st): State<Arc<Shared>>) -> Result<Json<Option<SyncState>>, ApiError> {
    let s = st
        .engine
        .call(|e| e.dataplane().sync_state())
        .await
        .map_err(internal)?;
    Ok(Json(s))
}

/// `POST /v1/sync/takeover`.
pub async fn takeover(
    State(st): State<Arc<Shared>>,
    body: Option<Json<TakeoverRequest>>,
) -> Result<Json<TakeoverDone>, ApiError> {
    let node = body.and_then(|b| b.0.node);
    #[allow(clippy::disallowed_types)] // the time a takeover takes is wall-clock time
    let start = std::time::Instant::now();
    let r = st
        .engine
        .call(move |e| e.take_over(node))
        .await
        .map_err(internal)?;
    let taken = r.map_err(bad)?;
    Ok(Json(TakeoverDone {
        taken,
        took_ms: start.elapsed().as_secs_f64() * 1000.0,
    }))
}

/// The built-in liveness check: every peer silent for `timeout_ms` is
/// taken over, once.
pub async fn watch_peers(engine: crate::engine::EngineHandle, timeout_ms: u32) {
    let mut taken: BTreeSet<u32> = BTreeSet::new();
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let Ok(Some(state)) = engine.call(|e| e.dataplane().sync_state()).await else {
            continue;
        };
        for p in state.heard {
            if p.silent_ms < u64::from(timeout_ms) {
                taken.remove(&p.node);
                continue;
            }
            if !taken.insert(p.node) {
                continue;
            }
            let node = p.node;
            match engine.call(move |e| e.take_over(Some(node))).await {
                Ok(Ok(addrs)) => tracing::warn!(
                    node,
                    silent_ms = p.silent_ms,
                    addresses = ?addrs,
                    "peer silent: took over"
                ),
                Ok(Err(e)) => tracing::error!(node, "peer silent: takeover failed: {e}"),
                Err(e) => tracing::error!(node, "peer silent: {e}"),
            }
        }
    }
}

/// The sync metrics (written only when sync is configured).
pub(crate) fn encode(
    enc: &mut prometheus_client::encoding::DescriptorEncoder,
    s: &SyncState,
) -> std::fmt::Result {
    use crate::metrics::{family, single, Value};
    use prometheus_client::metrics::MetricType::{Counter, Gauge};
    let c = &s.counters;
    let rows: [(&str, &str, u64); 8] = [
        (
            "xvs_sync_sent_datagrams_total",
            "Sync datagrams sent (flows and hellos), per peer.",
            c.sent_datagrams,
        ),
        (
            "xvs_sync_sent_records_total",
            "Flow records sent to the peers.",
            c.sent_records,
        ),
        (
            "xvs_sync_send_errors_total",
            "Sync datagrams the socket refused (their records lost).",
            c.send_errors,
        ),
        (
            "xvs_sync_received_datagrams_total",
            "Sync datagrams received and applied.",
            c.received_datagrams,
        ),
        (
            "xvs_sync_received_records_total",
            "Flow records received from the peers.",
            c.received_records,
        ),
        (
            "xvs_sync_lagging_records_total",
            "Records that waited more than a second before they were sent (here or at a peer).",
            c.lagging,
        ),
        (
            "xvs_sync_lost_datagrams_total",
            "Peers' sync datagrams never received (sequence gaps).",
            c.lost,
        ),
        (
            "xvs_sync_overflow_records_total",
            "Flow records the workers' sync queues had no room for.",
            c.overflow,
        ),
    ];
    for (name, help, v) in rows {
        single(enc, name, help, Counter, Value::Int(v))?;
    }
    let help = "Received sync datagrams dropped, by reason.";
    let mut f = family(enc, "xvs_sync_dropped_datagrams_total", help, Counter)?;
    for (reason, v) in &c.dropped {
        f.sample(&vec![("reason", reason.clone())], Value::Int(*v))?;
    }
    let help = "Seconds since a peer was last heard.";
    let mut f = family(enc, "xvs_sync_peer_silent_seconds", help, Gauge)?;
    for p in &s.heard {
        let silent = Value::Float(p.silent_ms as f64 / 1000.0);
        f.sample(&vec![("node", p.node.to_string())], silent)?;
    }
    single(
        enc,
        "xvs_sync_standby",
        "Whether this gateway is a backup that has not taken over.",
        Gauge,
        Value::Int(u64::from(s.role == "backup")),
    )
}
