//! More than one gateway: the sync thread's wiring to the workers, the
//! standby of a backup, and taking a peer's addresses over.
//!
//! A backup (`role = "backup"`) runs its workers and holds its peers'
//! flows, but its VIPs and SNAT addresses are not in the steering
//! program's map: their packets and ARP stay with the kernel, which does
//! not have them, so the active gateway is the only one that answers.
//! Taking over puts them (and the SNAT addresses the peer announced in its
//! hellos, for active/active) in the map, makes the workers answer for
//! the peer's addresses, and announces each address with a gratuitous ARP
//! or an unsolicited neighbour advertisement, three times a second apart
//! (as keepalived repeats them), so that neighbours and switches move
//! their entries at once.
//!
//! Invariants: a record from a peer reaches the worker that owns its flow
//! (by its SNAT port's slice, as replies are handed over); messages from
//! here are not among those the engine waits to see applied.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use xvs_config::PortRange;

use super::{Dataplane, Mailbox, StartError, WorkerHandle};
use crate::steer::SteerError;
use crate::sync::daemon::{PeerView, SyncDaemon, SyncReading};
use crate::sync::wire::Role;
use crate::sync::{SyncQueue, SyncRecord};
use crate::worker::Control;

/// Announcements of each taken address.
const ANNOUNCE_ROUNDS: u32 = 3;

/// Starts the sync thread over the workers' `queues`, delivering records
/// to the workers of `handles` by the SNAT port slices `slices`.
pub(super) fn start_sync(
    cfg: &xvs_config::Sync,
    queues: Vec<Arc<SyncQueue>>,
    handles: &[WorkerHandle],
    slices: &[PortRange],
) -> Result<SyncDaemon, StartError> {
    let secret = match &cfg.key_file {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            StartError::Unsupported(format!(
                "cluster.sync.key_file: cannot read {}: {e}",
                path.display()
            ))
        })?),
        None => None,
    };
    if secret.as_ref().is_some_and(|s| s.len() < 16) {
        return Err(StartError::Unsupported(
            "cluster.sync.key_file: the key is shorter than 16 bytes".into(),
        ));
    }
    // A worker too busy to take records within a second drops them (the
    // peer's next refresh brings them again); they are not among the
    // messages the engine waits to see applied.
    let boxes: Vec<Mailbox> = handles.iter().map(|h| h.mailbox.clone()).collect();
    let slices = slices.to_vec();
    let deliver = Box::new(move |records: Vec<SyncRecord>| {
        if boxes.len() == 1 {
            boxes[0].post(Control::Sync(records));
            return;
        }
        let mut by_worker: Vec<Vec<SyncRecord>> = vec![Vec::new(); boxes.len()];
        for r in records {
            let port = r.snat.port;
            let w = slices
                .iter()
                .position(|s| s.first <= port && port <= s.last)
                .unwrap_or(0);
            by_worker[w].push(r);
        }
        for (w, records) in by_worker.into_iter().enumerate() {
            if !records.is_empty() {
                boxes[w].post(Control::Sync(records));
            }
        }
    });
    SyncDaemon::start(cfg, secret.as_deref(), queues, deliver).map_err(|e| {
        StartError::Unsupported(format!(
            "cluster.sync: cannot listen on {}: {e}",
            cfg.listen
        ))
    })
}

/// What a gateway's synchronisation looks like now.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SyncState {
    /// `active` or `backup` (a backup that took over is active).
    pub role: String,
    /// The configured role.
    pub configured_role: String,
    /// This gateway's node id.
    pub node: u32,
    /// Sync id.
    pub sync_id: u8,
    /// Where it listens.
    pub listen: String,
    /// Where it sends.
    pub peers: Vec<String>,
    /// Whether datagrams are authenticated.
    pub authenticated: bool,
    /// The built-in liveness check's timeout, if on.
    pub peer_timeout_ms: Option<u32>,
    /// Peers heard.
    pub heard: Vec<PeerView>,
    /// Addresses taken over from peers.
    pub taken: Vec<IpAddr>,
    /// Counters.
    pub counters: SyncReading,
}

impl Dataplane {
    /// The synchronisation's state (none: not configured).
    pub fn sync_state(&self) -> Option<SyncState> {
        let d = self.sync.as_ref()?;
        let s = d.settings();
        Some(SyncState {
            role: if self.standby { "backup" } else { "active" }.to_owned(),
            configured_role: s.role.to_string(),
            node: s.node,
            sync_id: s.id,
            listen: s.listen.to_string(),
            peers: s.peers.iter().map(ToString::to_string).collect(),
            authenticated: s.key_file.is_some(),
            peer_timeout_ms: s.peer_timeout_ms,
            heard: d.peers(),
            taken: self.taken.clone(),
            counters: d.reading(),
        })
    }

    /// Whether this gateway is a backup that has not taken over.
    pub fn standby(&self) -> bool {
        self.standby
    }

    /// Tells the peers which addresses this gateway serves (its SNAT
    /// addresses and VIPs), in its hellos.
    pub(super) fn announce_addresses(&self) {
        let Some(d) = &self.sync else { return };
        let mut a: Vec<(IpAddr, Role)> = self.snat_all.iter().map(|&x| (x, Role::Snat)).collect();
        let mut vips: Vec<IpAddr> = self.compiled.keys().map(|k| k.vip).collect();
        vips.sort();
        vips.dedup();
        a.extend(vips.into_iter().map(|v| (v, Role::Vip)));
        d.set_announced(a);
    }

    /// Takes over: a backup starts serving its own addresses, and the
    /// SNAT addresses that `node` (every peer heard, when `None`)
    /// announced become this gateway's too; each is announced. Returns
    /// the addresses it now serves that it did not before.
    pub fn take_over(&mut self, node: Option<u32>) -> Result<Vec<IpAddr>, SteerError> {
        let mut new: Vec<IpAddr> = Vec::new();
        if self.standby {
            new.extend(self.snat_all.iter().copied());
            new.extend(self.compiled.keys().map(|k| k.vip));
        }
        if let Some(d) = &self.sync {
            for p in d.peers() {
                if node.is_none_or(|n| n == p.node) {
                    new.extend(p.snat);
                }
            }
        }
        new.sort();
        new.dedup();
        let mine =
            |a: &IpAddr| self.snat_all.contains(a) || self.compiled.keys().any(|k| k.vip == *a);
        new.retain(|a| (self.standby && mine(a)) || (!mine(a) && !self.taken.contains(a)));
        for a in &new {
            for st in &self.steerings {
                match a {
                    IpAddr::V4(v4) if self.shared.contains(v4) => st.share_address(*v4)?,
                    _ => st.add_address(*a)?,
                }
            }
            if !mine(a) {
                for w in &self.handle.workers {
                    self.handle.send_to(w, Control::Own(*a));
                }
                self.taken.push(*a);
            }
        }
        if self.standby {
            for w in &self.handle.workers {
                self.handle
                    .send_to(w, Control::Standby(false, self.shared.clone()));
            }
        }
        self.standby = false;
        if let Some(first) = self.handle.workers.first() {
            let b = first.mailbox.clone();
            let addrs = new.clone();
            // Repeated a second apart, off the caller's thread.
            let _ = std::thread::Builder::new()
                .name("xvs-announce".into())
                .spawn(move || {
                    for round in 0..ANNOUNCE_ROUNDS {
                        if round > 0 {
                            std::thread::sleep(Duration::from_secs(1));
                        }
                        for a in &addrs {
                            b.post(Control::Announce(*a));
                        }
                    }
                });
        }
        tracing::info!(addresses = ?new, "took over");
        Ok(new)
    }

    /// Stops the sync thread (before the workers it delivers to).
    pub(super) fn stop_sync(&mut self) {
        if let Some(d) = self.sync.take() {
            d.stop();
        }
    }
}
