//! The admin API (axum): JSON for services, stats, rates, connections and
//! edits; Prometheus text at `/metrics`; `/healthz` and `/readyz`. Served
//! on a unix socket (mode 0600) and, when configured, on TCP where every
//! request must carry the bearer token.
//!
//! Every edit is applied before the answer: the engine sends it and waits
//! until every worker has it, so a 200 means "in force".

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
pub use xvs_config::api::{BackendSpec, EditSpec, ServiceRef, ServiceSpec};
use xvs_config::{Backend, Family, Protocol, Service, ServiceKey, UnknownName};
use xvs_conntrack::{Filter, FlowState, L4Proto};

use crate::engine::{Applied, Edit, EngineHandle, Refused};
use crate::events::EventFilter;
use crate::kube::source::KubeStatus;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{self, Histograms};
use crate::stats::{listing, sample, Estimator, ServiceSample};
use crate::view::{ConnView, Listing, TimeoutView};

/// Shared by every handler.
pub struct Shared {
    /// The engine.
    pub engine: EngineHandle,
    /// Rates.
    pub estimator: Mutex<Estimator>,
    /// The control plane's histograms (update latency, Kubernetes delay).
    pub histograms: Histograms,
    /// Flow events.
    pub events: Arc<crate::events::Collector>,
    /// Health checks' states.
    pub health: Arc<crate::health::Checks>,
    /// The Kubernetes source's state, when it is on.
    pub kube: Option<Arc<crate::kube::source::KubeStatus>>,
    /// Connections the unix socket closed at its limit.
    pub refused_unix: Arc<crate::listener::Refused>,
    /// Connections the TCP listener closed at its limit.
    pub refused_tcp: Arc<crate::listener::Refused>,
    /// A minute of counter readings (`xvs status`'s rates and drops).
    pub history: Mutex<crate::status::History>,
    /// When the daemon started.
    #[allow(clippy::disallowed_types)] // uptime is wall-clock time
    pub started: std::time::Instant,
}

/// An error answer: `{"error": "...", "kind": "..."}` with a status
/// (`kind` is [`Refused::kind`] for a refused edit, else `invalid` or
/// `unavailable`; a refused batch also says which edit, from 0, in
/// `edit`).
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    edit: Option<usize>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({ "error": self.message, "kind": self.kind });
        if let Some(i) = self.edit {
            body["edit"] = i.into();
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> Self {
        let (edit, inner) = match &r {
            Refused::InBatch(i, inner) => (Some(*i), inner.as_ref()),
            r => (None, r),
        };
        let status = match inner {
            Refused::Invalid(_) | Refused::InBatch(..) => StatusCode::BAD_REQUEST,
            Refused::NoService(_) | Refused::NoDestination(_) => StatusCode::NOT_FOUND,
            Refused::ServiceExists(_) | Refused::DestinationExists(_) => StatusCode::CONFLICT,
        };
        ApiError {
            status,
            message: inner.to_string(),
            kind: r.kind(),
            edit,
        }
    }
}

pub(crate) fn internal(e: impl ToString) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: e.to_string(),
        kind: "unavailable",
        edit: None,
    }
}

pub(crate) fn bad(e: impl ToString) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        message: e.to_string(),
        kind: "invalid",
        edit: None,
    }
}

fn protocol(p: &str) -> Result<Protocol, ApiError> {
    p.to_ascii_lowercase()
        .parse()
        .map_err(|e: UnknownName| bad(e))
}

fn key(proto: &str, vip: IpAddr, port: u16) -> Result<ServiceKey, ApiError> {
    Ok(ServiceKey {
        vip,
        protocol: protocol(proto)?,
        port,
    })
}

/// The service a body describes, or a 400 with every problem of the body
/// (kind `no_scheduler` when the scheduler is not one xvs has).
fn to_service(s: &ServiceSpec) -> Result<Service, ApiError> {
    s.to_service().map_err(|problems| {
        let mut e = bad(problems.join("\n"));
        if s.unknown_scheduler() {
            e.kind = "no_scheduler";
        }
        e
    })
}

/// One edit of a batch as the engine takes it.
fn to_edit(e: &EditSpec) -> Result<Edit, ApiError> {
    let key = |r: &ServiceRef| r.key().map_err(bad);
    Ok(match e {
        EditSpec::AddService { service } => Edit::AddService(to_service(service)?),
        EditSpec::EditService { service } => {
            if !service.backends.is_empty() {
                return Err(bad("backends: an edit keeps the service's backends"));
            }
            Edit::EditService(to_service(service)?)
        }
        EditSpec::DeleteService { service } => Edit::DeleteService(key(service)?),
        EditSpec::AddBackend { service, backend } => {
            let k = key(service)?;
            Edit::AddBackend(k, to_backend(&k, backend)?)
        }
        EditSpec::EditBackend { service, backend } => {
            let k = key(service)?;
            Edit::EditBackend(k, to_backend(&k, backend)?)
        }
        EditSpec::DeleteBackend {
            service,
            address,
            port,
        } => Edit::DeleteBackend(key(service)?, *address, *port),
        EditSpec::Clear => Edit::Clear,
    })
}

fn to_backend(k: &ServiceKey, b: &BackendSpec) -> Result<Backend, ApiError> {
    b.to_backend(k).map_err(bad)
}

/// After a successful change: waits until every worker has it, records
/// the time in the answer and the latency histogram.
#[allow(clippy::result_large_err)]
pub fn applied(
    eng: &mut crate::engine::Engine,
    mut r: Result<Applied, Refused>,
    latency: &Histogram,
) -> Result<Applied, Refused> {
    if let Ok(a) = &mut r {
        a.applied_seconds = eng.wait_applied();
        if let Some(s) = a.applied_seconds {
            latency.observe(s);
        }
    }
    r
}

async fn edit(st: &Shared, e: Edit) -> Result<Json<Applied>, ApiError> {
    let latency = st.histograms.update_latency.clone();
    let r = st
        .engine
        .call(move |eng| {
            let r = eng.edit(e);
            applied(eng, r, &latency)
        })
        .await
        .map_err(internal)?;
    Ok(Json(r?))
}

/// Runs `build` on the blocking pool, one build at a time: a large text
/// (a scrape, a listing; at 100,000 services seconds of CPU and 300 MB)
/// built there instead of on the control plane's one async thread, where
/// every edit, watch and probe waited for it. One at a time, as they
/// were there, so concurrent clients queue instead of each building at
/// once.
async fn build_large<T: Send + 'static>(
    build: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    static BUILDING: Mutex<()> = Mutex::new(());
    tokio::task::spawn_blocking(move || {
        let _one = BUILDING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        build()
    })
    .await
    .map_err(|e| internal(e.to_string()))?
}

/// The listing of `samples` with the estimator's rates.
fn rated(st: &Shared, size: u32, samples: &[ServiceSample]) -> Result<Listing, ApiError> {
    let est = st.estimator.lock().map_err(|e| internal(e.to_string()))?;
    Ok(listing(size, samples, &est))
}

async fn list_services(State(st): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let (size, samples) = st
        .engine
        .call(|e| {
            let mut samples = sample(e);
            e.zeroed().apply(&mut samples);
            (e.config().conntrack.capacity, samples)
        })
        .await
        .map_err(internal)?;
    // Tens of MB of JSON at 100,000 services.
    let body = build_large(move || {
        serde_json::to_vec(&rated(&st, size, &samples)?).map_err(|e| internal(e.to_string()))
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn add_service(
    State(st): State<Arc<Shared>>,
    Json(spec): Json<ServiceSpec>,
) -> Result<Json<Applied>, ApiError> {
    // IPVS answers "exists" before it looks at the scheduler.
    if let Ok(k) = key(&spec.protocol, spec.vip, spec.port) {
        if exists(&st, k).await? {
            return Err(Refused::ServiceExists(format!(
                "{}: service already exists",
                crate::engine::key_name(&k)
            ))
            .into());
        }
    }
    edit(&st, Edit::AddService(to_service(&spec)?)).await
}

/// Whether service `k` is served.
async fn exists(st: &Shared, k: ServiceKey) -> Result<bool, ApiError> {
    st.engine
        .call(move |e| e.applied().contains_key(&k))
        .await
        .map_err(internal)
}

/// `POST /v1/batch`: every edit, in order, all or none (`xvsadm -R`).
async fn batch(
    State(st): State<Arc<Shared>>,
    Json(edits): Json<Vec<EditSpec>>,
) -> Result<Json<Applied>, ApiError> {
    let edits = edits
        .iter()
        .enumerate()
        .map(|(i, e)| {
            to_edit(e).map_err(|mut err| {
                err.edit = Some(i);
                err
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    edit(&st, Edit::Batch(edits)).await
}

/// `-Z`: zeroes the listing's counters and rates of one service or all.
async fn zero(st: &Shared, k: Option<ServiceKey>) -> Result<Json<serde_json::Value>, ApiError> {
    st.engine
        .call(move |e| e.zero(k))
        .await
        .map_err(internal)??;
    st.estimator
        .lock()
        .map_err(|e| internal(e.to_string()))?
        .zero(k.as_ref());
    Ok(Json(serde_json::json!({ "zeroed": true })))
}

async fn zero_all(State(st): State<Arc<Shared>>) -> Result<Json<serde_json::Value>, ApiError> {
    zero(&st, None).await
}

async fn zero_service(
    State(st): State<Arc<Shared>>,
    Path((proto, vip, port)): Path<(String, IpAddr, u16)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    zero(&st, Some(key(&proto, vip, port)?)).await
}

async fn edit_service(
    State(st): State<Arc<Shared>>,
    Path((proto, vip, port)): Path<(String, IpAddr, u16)>,
    Json(spec): Json<ServiceSpec>,
) -> Result<Json<Applied>, ApiError> {
    if !spec.backends.is_empty() {
        return Err(bad(
            "backends: an edit keeps the service's backends; change them at .../backends",
        ));
    }
    let k = key(&proto, vip, port)?;
    // IPVS answers "no such service" before it looks at the scheduler.
    if !exists(&st, k).await? {
        return Err(Refused::NoService(format!(
            "{}: no such service",
            crate::engine::key_name(&k)
        ))
        .into());
    }
    let mut s = to_service(&spec)?;
    s.key = k;
    edit(&st, Edit::EditService(s)).await
}

async fn delete_service(
    State(st): State<Arc<Shared>>,
    Path((proto, vip, port)): Path<(String, IpAddr, u16)>,
) -> Result<Json<Applied>, ApiError> {
    edit(&st, Edit::DeleteService(key(&proto, vip, port)?)).await
}

async fn clear(State(st): State<Arc<Shared>>) -> Result<Json<Applied>, ApiError> {
    edit(&st, Edit::Clear).await
}

async fn add_backend(
    State(st): State<Arc<Shared>>,
    Path((proto, vip, port)): Path<(String, IpAddr, u16)>,
    Json(b): Json<BackendSpec>,
) -> Result<Json<Applied>, ApiError> {
    let k = key(&proto, vip, port)?;
    edit(&st, Edit::AddBackend(k, to_backend(&k, &b)?)).await
}

async fn edit_backend(
    State(st): State<Arc<Shared>>,
    Path((proto, vip, port, addr, bport)): Path<(String, IpAddr, u16, IpAddr, u16)>,
    Json(b): Json<BackendSpec>,
) -> Result<Json<Applied>, ApiError> {
    let k = key(&proto, vip, port)?;
    let b = BackendSpec {
        address: Some(addr),
        port: Some(bport),
        ..b
    };
    edit(&st, Edit::EditBackend(k, to_backend(&k, &b)?)).await
}

async fn delete_backend(
    State(st): State<Arc<Shared>>,
    Path((proto, vip, port, addr, bport)): Path<(String, IpAddr, u16, IpAddr, u16)>,
) -> Result<Json<Applied>, ApiError> {
    edit(
        &st,
        Edit::DeleteBackend(key(&proto, vip, port)?, addr, bport),
    )
    .await
}

async fn reload(State(st): State<Arc<Shared>>) -> Result<Json<Applied>, ApiError> {
    let latency = st.histograms.update_latency.clone();
    let r = st
        .engine
        .call(move |e| {
            let r = e.reload();
            applied(e, r, &latency)
        })
        .await
        .map_err(internal)?;
    Ok(Json(r?))
}

/// `/v1/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    /// Config file.
    pub config: String,
    /// Successful reloads.
    pub reloads: u64,
    /// The last refused reload or edit, if the latest one was refused.
    pub last_error: Option<String>,
    /// Services in force.
    pub services: usize,
    /// Services from Kubernetes among them.
    pub kube_services: usize,
    /// Keys both sources wanted (kept by their first owner).
    pub conflicts: Vec<String>,
    /// Whether the Kubernetes copy is in sync (absent: source off).
    pub kube_synced: Option<bool>,
    /// The addresses the steering program hands to xvs, read back from
    /// its map (VIPs and SNAT addresses; a VIP no service uses any more
    /// is not here).
    #[serde(default)]
    pub steered: Vec<SteeredView>,
    /// What this start took over from the instance before it.
    #[serde(default)]
    pub restart: RestartView,
}

/// What a start took over from the instance before it (`/v1/status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartView {
    /// The hold window in force (milliseconds; 0: restart survival off).
    pub hold_ms: u32,
    /// Flows adopted from the state files.
    pub adopted_flows: u64,
    /// Persistence templates adopted.
    pub adopted_templates: u64,
    /// Entries of the state files dropped (insane, duplicate, or of a
    /// service or backend no longer configured).
    pub adopted_dropped: u64,
    /// Workers that started empty, with why (`worker 0: capacity
    /// changed (state file 1000, now 2000)`).
    pub started_empty: Vec<String>,
    /// The state files in use.
    pub state_files: Vec<String>,
    /// Why they are in plain pages, if they are (else huge pages).
    pub plain_pages: Option<String>,
    /// Ids of the earlier xvs programs this start replaced.
    pub replaced_programs: Vec<u32>,
    /// VIP packets those programs held (dropped) while no worker served.
    pub held_packets: u64,
    /// Ids of the steering programs attached now.
    pub programs: Vec<u32>,
}

/// One address of the steering map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteeredView {
    /// Address.
    pub address: IpAddr,
    /// Shared with the host (only its SNAT ports go to xvs).
    pub shared: bool,
}

/// What the start took over, with the hold window in force.
fn restart_view(e: &crate::engine::Engine) -> RestartView {
    RestartView {
        hold_ms: e.config().restart.hold_ms,
        ..e.dataplane().restart()
    }
}

/// `/v1/overview`: what `xvs status` shows, built on the engine's thread
/// from its config and counters (nothing copied out first).
async fn overview(
    State(st): State<Arc<Shared>>,
) -> Result<Json<crate::status::Overview>, ApiError> {
    let shared = st.clone();
    let o = st
        .engine
        .call(move |e| {
            let history = shared.history.lock().map_err(|e| e.to_string())?;
            let inputs = crate::status::Inputs {
                config: e.config(),
                file: (
                    e.path().display().to_string(),
                    e.reloads(),
                    e.last_error().map(str::to_owned),
                ),
                layout: e.dataplane().layout(),
                now: e.dataplane().counters(),
                uptime: shared.started.elapsed().as_secs_f64(),
                services: crate::stats::tally(e),
                kubernetes: shared.kube.as_deref().map(KubeStatus::reading),
                restart: restart_view(e),
            };
            Ok::<_, String>(crate::status::overview(inputs, &history))
        })
        .await
        .map_err(internal)?
        .map_err(internal)?;
    Ok(Json(o))
}

async fn status(State(st): State<Arc<Shared>>) -> Result<Json<Status>, ApiError> {
    let kube_synced = st.kube.as_ref().map(|k| k.synced());
    let s = st
        .engine
        .call(move |e| Status {
            config: e.path().display().to_string(),
            reloads: e.reloads(),
            last_error: e.last_error().map(str::to_owned),
            services: e.applied().len(),
            kube_services: e.kube_services().len(),
            conflicts: e.conflicts().to_vec(),
            kube_synced,
            steered: e
                .dataplane()
                .steered()
                .unwrap_or_default()
                .into_iter()
                .map(|(address, shared)| SteeredView { address, shared })
                .collect(),
            restart: restart_view(e),
        })
        .await
        .map_err(internal)?;
    Ok(Json(s))
}

/// Connection filters (`-Lnc`, `conntrack -L/-D`); unknown ones refused.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConnQuery {
    /// VIP.
    pub vip: Option<IpAddr>,
    /// VIP port.
    pub vport: Option<u16>,
    /// Backend address.
    pub backend: Option<IpAddr>,
    /// Client address.
    pub client: Option<IpAddr>,
    /// Client port.
    pub cport: Option<u16>,
    /// Backend port.
    pub bport: Option<u16>,
    /// SNAT address (the reply's destination).
    pub snat: Option<IpAddr>,
    /// SNAT port.
    pub snat_port: Option<u16>,
    /// IPVS state name.
    pub state: Option<String>,
    /// `tcp` or `udp`.
    pub proto: Option<String>,
    /// `ipv4` or `ipv6` (conntrack's `-f`): only that family's flows.
    pub family: Option<String>,
    /// Page number (from 0).
    pub page: Option<usize>,
    /// Page size (default 1000).
    pub size: Option<usize>,
    /// Whether persistence templates are listed too (ipvsadm's `-Lc`
    /// shows them, state `NONE`, as the kernel's connection table
    /// holds them; conntrack(8)'s listing does not). Default false.
    pub templates: Option<bool>,
}

/// The address family a query asks for, if any.
fn family(q: &ConnQuery) -> Result<Option<Family>, ApiError> {
    match q.family.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => Ok(None),
        Some("ipv4" | "inet" | "4") => Ok(Some(Family::V4)),
        Some("ipv6" | "inet6" | "6") => Ok(Some(Family::V6)),
        Some(f) => Err(bad(format!("family \"{f}\": expected ipv4 or ipv6"))),
    }
}

fn filter(q: &ConnQuery) -> Result<Filter<IpAddr>, ApiError> {
    let state = match &q.state {
        None => None,
        Some(s) => Some(
            FlowState::ALL
                .iter()
                .copied()
                .find(|f| f.name().eq_ignore_ascii_case(s))
                .ok_or_else(|| bad(format!("state \"{s}\": not an IPVS state")))?,
        ),
    };
    let proto = match q.proto.as_deref() {
        None => None,
        Some(p) => Some(match protocol(p)? {
            Protocol::Tcp => L4Proto::Tcp,
            Protocol::Udp => L4Proto::Udp,
        }),
    };
    Ok(Filter {
        vip: q.vip,
        vip_port: q.vport,
        backend: q.backend,
        client: q.client,
        client_port: q.cport,
        backend_port: q.bport,
        snat: q.snat,
        snat_port: q.snat_port,
        state,
        proto,
        templates: q.templates.unwrap_or(false),
    })
}

/// A page of connections.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConnPage {
    /// Connections on this page.
    pub connections: Vec<ConnView>,
    /// Matching connections in all.
    pub total: usize,
}

async fn connections(
    State(st): State<Arc<Shared>>,
    Query(q): Query<ConnQuery>,
) -> Result<Json<ConnPage>, ApiError> {
    let (f, fam) = (filter(&q)?, family(&q)?);
    let flows = st
        .engine
        .call(move |e| e.dataplane().dump(f, fam))
        .await
        .map_err(internal)?;
    let size = q.size.unwrap_or(1000).max(1);
    let page = q.page.unwrap_or(0);
    let total = flows.len();
    let connections = flows
        .iter()
        .skip(page.saturating_mul(size))
        .take(size)
        .map(|f| ConnView {
            protocol: match f.proto {
                L4Proto::Tcp => "TCP",
                L4Proto::Udp => "UDP",
                L4Proto::Icmp => "ICMP",
            }
            .into(),
            expires: f.expires_in,
            state: f.state.name().into(),
            client: std::net::SocketAddr::new(f.client.addr, f.client.port),
            vip: std::net::SocketAddr::new(f.vip.addr, f.vip.port),
            backend: std::net::SocketAddr::new(f.backend.addr, f.backend.port),
            snat: std::net::SocketAddr::new(f.snat.addr, f.snat.port),
            packets: f.packets,
            template: f.template,
        })
        .collect();
    Ok(Json(ConnPage { connections, total }))
}

async fn delete_connections(
    State(st): State<Arc<Shared>>,
    Query(q): Query<ConnQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (f, fam) = (filter(&q)?, family(&q)?);
    let n = st
        .engine
        .call(move |e| e.dataplane().delete(f, fam))
        .await
        .map_err(internal)?;
    Ok(Json(serde_json::json!({ "deleted": n })))
}

async fn flush(State(st): State<Arc<Shared>>) -> Result<Json<serde_json::Value>, ApiError> {
    let n = st
        .engine
        .call(|e| e.dataplane().flush())
        .await
        .map_err(internal)?;
    Ok(Json(serde_json::json!({ "deleted": n })))
}

async fn health(State(st): State<Arc<Shared>>) -> Json<Vec<crate::health::CheckView>> {
    Json(st.health.list())
}

async fn conntrack_stats(
    State(st): State<Arc<Shared>>,
) -> Result<Json<Vec<metrics::WorkerConntrack>>, ApiError> {
    let snaps = st
        .engine
        .call(|e| e.dataplane().snapshots())
        .await
        .map_err(internal)?;
    Ok(Json(
        snaps.iter().map(metrics::WorkerConntrack::of).collect(),
    ))
}

async fn timeouts(State(st): State<Arc<Shared>>) -> Result<Json<TimeoutView>, ApiError> {
    let t = st
        .engine
        .call(|e| e.config().conntrack.timeouts)
        .await
        .map_err(internal)?;
    Ok(Json(TimeoutView {
        tcp: t.established,
        tcpfin: t.fin_wait,
        udp: t.udp,
    }))
}

async fn set_timeouts(
    State(st): State<Arc<Shared>>,
    Json(t): Json<TimeoutView>,
) -> Result<Json<TimeoutView>, ApiError> {
    let t = st
        .engine
        .call(move |e| {
            let t = e.set_timeouts(t.tcp, t.tcpfin, t.udp);
            e.wait_applied();
            t
        })
        .await
        .map_err(internal)??;
    Ok(Json(TimeoutView {
        tcp: t.established,
        tcpfin: t.fin_wait,
        udp: t.udp,
    }))
}

/// Every state's timeout, by its `[conntrack.timeouts]` name.
async fn state_timeouts(
    State(st): State<Arc<Shared>>,
) -> Result<Json<std::collections::BTreeMap<String, u32>>, ApiError> {
    let t = st
        .engine
        .call(|e| e.config().conntrack.timeouts)
        .await
        .map_err(internal)?;
    Ok(Json(
        t.named()
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v))
            .collect(),
    ))
}

/// Sets some states' timeouts (`{"time_wait": 30, ...}`), all or none.
async fn set_state_timeouts(
    State(st): State<Arc<Shared>>,
    Json(changes): Json<std::collections::BTreeMap<String, u32>>,
) -> Result<Json<std::collections::BTreeMap<String, u32>>, ApiError> {
    let t = st
        .engine
        .call(move |e| {
            let pairs: Vec<(&str, u32)> = changes.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let t = e.set_named_timeouts(&pairs);
            e.wait_applied();
            t
        })
        .await
        .map_err(internal)??;
    Ok(Json(
        t.named()
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v))
            .collect(),
    ))
}

async fn prometheus(State(st): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let (size, samples, counters, overflow, snat_addresses) = st
        .engine
        .call(|e| {
            let overflow: Vec<u64> = e
                .dataplane()
                .events()
                .iter()
                .map(|q| q.overflow())
                .collect();
            (
                e.config().conntrack.capacity,
                sample(e),
                e.dataplane().counters(),
                overflow,
                crate::status::snat_addresses(e.config()),
            )
        })
        .await
        .map_err(internal)?;
    let sync = st
        .engine
        .call(|e| e.dataplane().sync_state())
        .await
        .map_err(internal)?;
    let text = build_large(move || {
        let scrape = metrics::Scrape {
            listing: rated(&st, size, &samples)?,
            workers: counters,
            overflow,
            kube: st.kube.as_deref().map(KubeStatus::reading),
            sync,
            admin_refused: (st.refused_unix.get(), st.refused_tcp.get()),
            snat_addresses,
        };
        Ok(metrics::render(scrape, &st.histograms))
    })
    .await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        text,
    )
        .into_response())
}

/// `observe`'s page of events (its filters are [`EventFilter`]).
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct EventQuery {
    /// How many past events first (default 20).
    pub last: Option<usize>,
    /// Keep streaming new events.
    pub follow: Option<bool>,
}

/// `GET /v1/events`: the query names the page (`last`, `follow`) and the
/// filters ([`EventFilter`]'s fields), each read from the whole query.
async fn events(
    State(st): State<Arc<Shared>>,
    Query(q): Query<EventQuery>,
    Query(filter): Query<EventFilter>,
) -> Response {
    if let Err(e) = filter.check() {
        return bad(e).into_response();
    }
    let past = st.events.last(q.last.unwrap_or(20), &filter);
    let mut text = String::new();
    for e in &past {
        if let Ok(j) = serde_json::to_string(e) {
            text.push_str(&j);
            text.push('\n');
        }
    }
    if !q.follow.unwrap_or(false) {
        return ([(header::CONTENT_TYPE, "application/x-ndjson")], text).into_response();
    }
    // Newline-delimited JSON, one event per line, until the client goes.
    let rx = st.events.follow();
    let first = futures_util::stream::once(async move {
        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(text))
    });
    let live = futures_util::stream::unfold((rx, filter), |(mut rx, q)| async move {
        let line = crate::events::next_line(&mut rx, &q).await?;
        Some((
            Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line)),
            (rx, q),
        ))
    });
    use futures_util::StreamExt;
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(first.chain(live)),
    )
        .into_response()
}

async fn readyz(State(st): State<Arc<Shared>>) -> Response {
    match st.engine.call(|e| e.applied().len()).await {
        Ok(_) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

/// The routes.
pub fn router(shared: Arc<Shared>) -> Router {
    let svc = "/v1/services/{proto}/{vip}/{port}";
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(prometheus))
        .route("/v1/status", get(status))
        .route("/v1/overview", get(overview))
        .route("/v1/reload", post(reload))
        .route(
            "/v1/services",
            get(list_services).post(add_service).delete(clear),
        )
        .route(svc, put(edit_service).delete(delete_service))
        .route(&format!("{svc}/zero"), post(zero_service))
        .route("/v1/zero", post(zero_all))
        .route("/v1/batch", post(batch))
        .route(&format!("{svc}/backends"), post(add_backend))
        .route(
            &format!("{svc}/backends/{{addr}}/{{bport}}"),
            put(edit_backend).delete(delete_backend),
        )
        .route(
            "/v1/connections",
            get(connections).delete(delete_connections),
        )
        .route("/v1/flush", post(flush))
        .route("/v1/conntrack/stats", get(conntrack_stats))
        .route("/v1/timeouts", get(timeouts).put(set_timeouts))
        .route(
            "/v1/timeouts/states",
            get(state_timeouts).put(set_state_timeouts),
        )
        .route("/v1/events", get(events))
        .route("/v1/health", get(health))
        .route("/v1/sync", get(crate::ha::sync_view))
        .route("/v1/sync/takeover", post(crate::ha::takeover))
        .with_state(shared)
}

/// Requires `Authorization: Bearer <token>` (the TCP listener).
pub fn with_token(router: Router, token: String) -> Router {
    let token = Arc::new(token);
    router.layer(axum::middleware::from_fn(
        move |headers: HeaderMap, req: axum::extract::Request, next: axum::middleware::Next| {
            let token = token.clone();
            async move {
                let ok = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .is_some_and(|t| constant_time_eq(t.as_bytes(), token.as_bytes()));
                if ok {
                    next.run(req).await
                } else {
                    ApiError {
                        status: StatusCode::UNAUTHORIZED,
                        message: "missing or wrong bearer token".into(),
                        kind: "unauthorized",
                        edit: None,
                    }
                    .into_response()
                }
            }
        },
    ))
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
