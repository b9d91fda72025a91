//! Real-server health checks (keepalived's job for IPVS): one task per
//! checked backend of the config file's services, on the control plane's
//! runtime (never a worker's core), probing every `interval` with a
//! `timeout`; `fall` consecutive failures take the backend out of
//! rotation (the engine sends it with weight 0: its flows finish, no new
//! ones), `rise` consecutive successes bring it back. Each change is
//! logged, counted, and published as a flow event (`BACKEND_DOWN`,
//! `BACKEND_UP`); the states are in `/v1/health`, `xvsadm health`, the
//! services listing and `/metrics`.
//!
//! Invariants: a backend starts up (as keepalived and HAProxy start real
//! servers), so a new configuration serves at once; the set of checks
//! follows the configuration in force (a supervisor compares it every
//! [`FOLLOW`]): a check that goes away releases its backend; a probe
//! never outlives its timeout. Kubernetes backends are not checked here:
//! their readiness comes from EndpointSlices.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use xvs_config::{BackendCheck, CheckKind, ServiceKey};

use crate::engine::{key_name, EngineHandle};
use crate::events::{Collector, EventView};

/// How often the supervisor compares the running checks with the
/// configuration's.
pub const FOLLOW: Duration = Duration::from_millis(500);

/// Which backend of which service.
pub type Key = (ServiceKey, IpAddr, u16);

/// One check's state, as `/v1/health` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckView {
    /// The service (`TCP 198.19.0.1:80`).
    pub service: String,
    /// The backend (`addr:port`).
    pub backend: String,
    /// `tcp` or `http`.
    pub kind: String,
    /// The port probed.
    pub port: u16,
    /// `up` or `down`.
    pub state: String,
    /// Consecutive successes so far.
    pub successes: u32,
    /// Consecutive failures so far.
    pub failures: u32,
    /// Probes run.
    pub probes: u64,
    /// Why the last probe failed, if it did.
    pub last_error: Option<String>,
}

/// Every check's state, shared with the API.
#[derive(Debug, Default)]
pub struct Checks {
    states: Mutex<BTreeMap<Key, CheckView>>,
}

impl Checks {
    /// Every check, by service and backend.
    pub fn list(&self) -> Vec<CheckView> {
        self.lock().values().cloned().collect()
    }

    /// Probes run and backends down, for `/metrics`.
    pub fn totals(&self) -> (u64, usize) {
        let s = self.lock();
        (
            s.values().map(|c| c.probes).sum(),
            s.values().filter(|c| c.state == "down").count(),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, CheckView>> {
        match self.states.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        }
    }
}

/// One probe: `Ok` when the backend passed it, else why not.
pub async fn probe(check: &BackendCheck) -> Result<(), String> {
    let to = SocketAddr::new(check.address, check.probe_port);
    let c = &check.check;
    let run = async {
        let stream = TcpStream::connect(to)
            .await
            .map_err(|e| format!("connect {to}: {e}"))?;
        match c.kind {
            CheckKind::Off | CheckKind::Tcp => Ok(()),
            CheckKind::Http => http_status(stream, to, &c.http_path)
                .await
                .and_then(|status| {
                    if status == c.expect_status {
                        Ok(())
                    } else {
                        Err(format!(
                            "GET {}: status {status}, expected {}",
                            c.http_path, c.expect_status
                        ))
                    }
                }),
        }
    };
    match tokio::time::timeout(Duration::from_millis(u64::from(c.timeout_ms)), run).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", c.timeout_ms)),
    }
}

/// The status of `GET path` on a connected `stream` (HTTP/1.1, hyper's
/// client connection).
async fn http_status(stream: TcpStream, to: SocketAddr, path: &str) -> Result<u16, String> {
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP to {to}: {e}"))?;
    let driver = tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, to.to_string())
        .header(hyper::header::USER_AGENT, "xvs-health-check")
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let res = send
        .send_request(req)
        .await
        .map_err(|e| format!("GET {path} on {to}: {e}"));
    driver.abort();
    Ok(res?.status().as_u16())
}

/// What a probe's result does to a backend that is `up` after
/// `successes`/`failures` in a row: the new counts, and the new state.
pub fn next(
    check: &xvs_config::HealthCheck,
    up: bool,
    passed: bool,
    counts: (u32, u32),
) -> (bool, (u32, u32)) {
    let (s, f) = if passed {
        (counts.0.saturating_add(1), 0)
    } else {
        (0, counts.1.saturating_add(1))
    };
    let up = if up { f < check.fall } else { s >= check.rise };
    (up, (s, f))
}

/// Runs the checks of the configuration in force until the task is
/// dropped.
pub async fn run(engine: EngineHandle, checks: Arc<Checks>, events: Arc<Collector>) {
    let mut running: BTreeMap<Key, (BackendCheck, JoinHandle<()>)> = BTreeMap::new();
    let mut tick = tokio::time::interval(FOLLOW);
    loop {
        tick.tick().await;
        let Ok(wanted) = engine.call(|e| e.config().checks.clone()).await else {
            break;
        };
        let wanted: BTreeMap<Key, BackendCheck> = wanted
            .into_iter()
            .map(|c| ((c.service, c.address, c.port), c))
            .collect();
        let gone: Vec<Key> = running
            .iter()
            .filter(|(k, (c, _))| wanted.get(k) != Some(c))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            if let Some((_, task)) = running.remove(&k) {
                task.abort();
            }
            checks.lock().remove(&k);
            let (key, addr, port) = k;
            let _ = engine
                .call(move |e| e.set_health(key, addr, port, true))
                .await;
        }
        for (k, c) in wanted {
            if running.contains_key(&k) {
                continue;
            }
            let task = tokio::spawn(check_loop(
                c.clone(),
                engine.clone(),
                checks.clone(),
                events.clone(),
            ));
            running.insert(k, (c, task));
        }
    }
    for (_, (_, task)) in running {
        task.abort();
    }
}

/// One backend's checks, forever.
async fn check_loop(
    c: BackendCheck,
    engine: EngineHandle,
    checks: Arc<Checks>,
    events: Arc<Collector>,
) {
    let key: Key = (c.service, c.address, c.port);
    let backend = SocketAddr::new(c.address, c.port).to_string();
    let service = key_name(&c.service);
    checks.lock().insert(
        key,
        CheckView {
            service: service.clone(),
            backend: backend.clone(),
            kind: c.check.kind.name().to_owned(),
            port: c.probe_port,
            state: "up".into(),
            successes: 0,
            failures: 0,
            probes: 0,
            last_error: None,
        },
    );
    let mut up = true;
    let mut counts = (0, 0);
    let mut tick = tokio::time::interval(Duration::from_millis(u64::from(c.check.interval_ms)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = probe(&c).await;
        let was = up;
        (up, counts) = next(&c.check, up, result.is_ok(), counts);
        if let Some(v) = checks.lock().get_mut(&key) {
            v.probes += 1;
            (v.successes, v.failures) = counts;
            v.last_error = result.as_ref().err().cloned();
            v.state = if up { "up" } else { "down" }.into();
        }
        if up == was {
            continue;
        }
        let (k, a, p) = key;
        let _ = engine.call(move |e| e.set_health(k, a, p, up)).await;
        match &result {
            Err(why) => tracing::warn!(
                service = %service, backend = %backend, fall = c.check.fall,
                "backend down, out of rotation: {why}"
            ),
            Ok(()) => tracing::info!(
                service = %service, backend = %backend, rise = c.check.rise,
                "backend up, back in rotation"
            ),
        }
        events.record(EventView::health(&c, up, result.err()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fall_failures_take_a_backend_out_and_rise_successes_bring_it_back() {
        let c = xvs_config::HealthCheck {
            rise: 2,
            fall: 3,
            ..Default::default()
        };
        let mut up = true;
        let mut counts = (0, 0);
        let mut trace = Vec::new();
        for passed in [
            false, false, true, false, false, false, true, false, true, true, true,
        ] {
            (up, counts) = next(&c, up, passed, counts);
            trace.push(up);
        }
        // Two failures and a success: still up; three in a row: down;
        // a success then a failure: still down; two in a row: up.
        assert_eq!(
            trace,
            [true, true, true, true, true, false, false, false, false, true, true]
        );
    }
}
