//! `xvs run --config FILE`: the daemon. Starts the data plane from the
//! file, then serves the admin API (unix socket, optional TCP with a
//! bearer token), samples rates every 2 seconds, reloads on SIGHUP and
//! stops on SIGINT/SIGTERM, telling systemd each step (READY, RELOADING,
//! STOPPING, WATCHDOG) when started by it.
//!
//! Prints one `ready` line once every worker runs (tests and scripts wait
//! for it), and on stop one summary line per worker with its counters;
//! the steering program is detached before the process exits, on a signal
//! or on an error. Graceful stop: the API stops first, then the workers
//! (no new flows), then the programs are detached.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};
use xvs_dataplane::runtime::Dataplane;
use xvs_dataplane::worker::Snapshot;

use crate::api::{router, with_token, Shared};
use crate::engine::{Engine, EngineHandle};
use crate::stats::{compiled_services, visit_totals, Estimator, SAMPLE_SECONDS};

/// Exit status for an invalid configuration.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status when the data plane or the API cannot start.
pub const EXIT_START: u8 = 1;

/// One line of counters for a worker's snapshot: `key=value` for every
/// counter of the tables (pipeline, loop, AF_XDP sockets, conntrack), then
/// the frame accounting and the drops by reason.
pub fn summary(s: &Snapshot) -> String {
    use std::fmt::Write;
    let c = &s.counters;
    let mut out = format!("worker {}:", s.worker);
    let fields = c
        .named()
        .chain([("dropped", c.dropped())])
        .chain(s.tallies.named())
        .chain(s.rings.named())
        .chain(s.conntrack.named())
        .chain([
            ("flows", u64::from(s.flows)),
            ("handoff_left", s.handoff_left),
        ]);
    for (k, v) in fields {
        let _ = write!(out, " {k}={v}");
    }
    let drops: Vec<String> = c
        .drops
        .iter()
        .filter(|&(_, n)| n > 0)
        .map(|(r, n)| format!("{r}={n}"))
        .collect();
    let _ = write!(
        out,
        " frames_accounted={} drops=[{}]",
        s.frames_accounted,
        drops.join(",")
    );
    out
}

/// Tells systemd (when it started us; a no-op otherwise).
fn notify(state: &[sd_notify::NotifyState<'_>]) {
    let _ = sd_notify::notify(false, state);
}

/// Why serving could not start (after the data plane did).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file or directory the admin socket needs could not be made.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Something other than a socket is where the admin socket goes.
    #[error("{}: exists and is not a socket; refusing to replace it (admin.socket must name a socket path)", .0.display())]
    NotASocket(PathBuf),
    /// Another process answers on the admin socket.
    #[error("{}: another process answers on this socket (is xvs already running?)", .0.display())]
    InUse(PathBuf),
    /// The admin API's TCP address cannot be bound.
    #[error("{address}: {source}")]
    Tcp {
        /// The address.
        address: std::net::SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// The Kubernetes client cannot be made.
    #[error(transparent)]
    Kube(#[from] crate::kube::source::ClientError),
    /// The engine stopped answering.
    #[error(transparent)]
    Engine(#[from] crate::engine::CallError),
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_owned(),
        source,
    }
}

fn bind_unix(path: &Path) -> Result<UnixListener, StartError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
    }
    // A socket left by a previous run (nothing listens on it any more) is
    // replaced; anything else there is the operator's and is kept.
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(StartError::NotASocket(path.to_owned()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(StartError::InUse(path.to_owned()));
        }
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(io_at(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_at(path))?;
    Ok(l)
}

/// Runs the daemon; returns the process exit status.
pub fn run(config: &Path) -> u8 {
    init_logs();
    let machine = crate::machine::Machine::read();
    let cfg = match xvs_config::load_on(config, &machine.host()) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            return EXIT_CONFIG;
        }
    };
    let token = match &cfg.admin.tcp {
        Some(t) => match std::fs::read_to_string(&t.token_file) {
            Ok(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            Ok(_) => {
                error!(token_file = %t.token_file.display(), "the admin token is empty");
                return EXIT_CONFIG;
            }
            Err(e) => {
                error!(token_file = %t.token_file.display(), "cannot read the admin token: {e}");
                return EXIT_CONFIG;
            }
        },
        None => None,
    };
    // One instance per interface; the guard ends the hold window if this
    // process stops (or dies) and no successor comes.
    let left = crate::restart::Leftovers::of(&cfg);
    let names: Vec<&str> = left.interfaces.iter().map(String::as_str).collect();
    let _lock = match crate::restart::InstanceLock::acquire(&left.state_dir, &names, "run") {
        Ok(l) => l,
        Err(e) => {
            error!("{e}");
            return EXIT_START;
        }
    };
    let mut guard = match crate::restart::spawn_guard(&cfg) {
        Ok(g) => Some(g),
        Err(e) => {
            warn!(
                "cannot start the guard ({e}): if xvs stops, `xvs release` removes what it leaves"
            );
            None
        }
    };
    // The control plane keeps off the workers' cores: its threads (and
    // the engine's) run on the others, when there are others.
    let control_cores: Vec<core_affinity::CoreId> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !cfg.interfaces.cores.contains(&c.id))
        .collect();
    let pin = {
        let cores = control_cores.clone();
        move || pin_to(&cores)
    };
    pin_to(&control_cores);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("xvs-control")
        .on_thread_start(pin)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("cannot start the control plane: {e}");
            return EXIT_START;
        }
    };
    // Signals are installed before the data plane starts, so none is lost.
    let signals = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::hangup())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    });
    let (mut hup, mut term, mut int) = match signals {
        Ok(s) => s,
        Err(e) => {
            error!("cannot handle signals: {e}");
            return EXIT_START;
        }
    };
    let path = config.to_owned();
    let start_cfg = cfg.clone();
    let spawned = EngineHandle::spawn(move || {
        // The worker clock: seconds of CLOCK_MONOTONIC, the one place
        // that reads time for the data plane. The same in every process
        // of a boot, so the deadlines of adopted flows carry over.
        let clock = xvs_dataplane::steer::monotonic_secs;
        // With Kubernetes, the flows an earlier instance left are adopted
        // once its services are in (see `start_kube`), or when half the
        // hold window has passed without them.
        let dp = if start_cfg.kubernetes.enabled {
            Dataplane::start_deferred(&start_cfg, clock)
        } else {
            Dataplane::start(&start_cfg, clock)
        }
        .map_err(|e| format!("cannot start the data plane: {e}"))?;
        Ok(Engine::new(Box::new(dp), &path, start_cfg))
    });
    let (engine, thread) = match spawned {
        Ok(x) => x,
        Err(e) => {
            error!("{e}");
            return EXIT_START;
        }
    };
    // Uptime (`xvs status`) is wall-clock time.
    #[allow(clippy::disallowed_types)]
    let started = std::time::Instant::now();
    let served = rt.block_on(async {
        let shared = Arc::new(Shared {
            engine: engine.clone(),
            estimator: Mutex::new(Estimator::default()),
            histograms: crate::metrics::Histograms::default(),
            events: crate::events::Collector::new(),
            health: Arc::default(),
            kube: cfg
                .kubernetes
                .enabled
                .then(|| Arc::new(crate::kube::source::KubeStatus::default())),
            refused_unix: Arc::default(),
            refused_tcp: Arc::default(),
            history: Mutex::default(),
            started,
        });
        let kube_task = match &shared.kube {
            Some(status) => {
                let tasks = start_kube(&cfg, status.clone(), shared.clone()).await?;
                let engine = engine.clone();
                let wait = Duration::from_millis(u64::from(cfg.restart.hold_ms / 2).max(1000));
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let _ = engine.call(|e| e.adopt()).await;
                });
                Some(tasks)
            }
            None => None,
        };
        let queues = engine.call(|e| e.dataplane().events()).await?;
        let collector = tokio::spawn(shared.events.clone().run(queues));
        let checker = tokio::spawn(crate::health::run(
            engine.clone(),
            shared.health.clone(),
            shared.events.clone(),
        ));
        // The built-in liveness check of the sync peers, when configured.
        let liveness = cfg
            .cluster
            .sync
            .as_ref()
            .and_then(|s| s.peer_timeout_ms)
            .map(|ms| tokio::spawn(crate::ha::watch_peers(engine.clone(), ms)));
        let unix = bind_unix(&cfg.admin.socket)?;
        let app = router(shared.clone());
        // The web view's assets hold no data: served beside the API, outside
        // its token (the page's own API calls carry it).
        let web = crate::web::routes();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut servers = Vec::new();
        servers.push(tokio::spawn(crate::listener::serve(
            crate::listener::Listener::Unix(unix),
            app.clone().merge(web.clone()),
            crate::listener::UNIX_CONNECTIONS,
            shared.refused_unix.clone(),
            stop_rx.clone(),
        )));
        if let (Some(t), Some(token)) = (&cfg.admin.tcp, token) {
            let tcp = TcpListener::bind(t.address)
                .await
                .map_err(|source| StartError::Tcp {
                    address: t.address,
                    source,
                })?;
            servers.push(tokio::spawn(crate::listener::serve(
                crate::listener::Listener::Tcp(tcp),
                with_token(app, token).merge(web),
                crate::listener::TCP_CONNECTIONS,
                shared.refused_tcp.clone(),
                stop_rx.clone(),
            )));
        }
        // The rate estimator: one sample every 2 seconds.
        let est = {
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(SAMPLE_SECONDS));
                loop {
                    tick.tick().await;
                    // The services' handles taken on the engine's thread,
                    // their counters read on the blocking pool straight
                    // into the estimator (no copy of 300,000 backends'
                    // totals; the engine free for edits meanwhile).
                    let Ok((services, counters)) = shared
                        .engine
                        .call(|e| (compiled_services(e), e.dataplane().counters()))
                        .await
                    else {
                        break;
                    };
                    let sh = shared.clone();
                    let visit = tokio::task::spawn_blocking(move || {
                        if let Ok(mut est) = sh.estimator.lock() {
                            est.update_from(SAMPLE_SECONDS, |observe| {
                                visit_totals(&services, observe)
                            });
                        }
                    });
                    if visit.await.is_err() {
                        break;
                    }
                    if let Ok(mut h) = shared.history.lock() {
                        h.push(shared.started.elapsed().as_secs_f64(), counters);
                    }
                }
            })
        };
        // The systemd watchdog: ping while the engine answers.
        let mut usec = 0u64;
        let watchdog = sd_notify::watchdog_enabled(false, &mut usec).then(|| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_micros(usec / 2));
                loop {
                    tick.tick().await;
                    if engine.call(|_| ()).await.is_ok() {
                        notify(&[sd_notify::NotifyState::Watchdog]);
                    }
                }
            })
        });
        let services = engine
            .call(|e| (e.applied().len(), e.dataplane().interface()))
            .await?;
        let restart = engine.call(|e| e.dataplane().restart()).await?;
        if let Some(g) = guard.as_mut() {
            g.attached(&restart.programs.iter().copied().map(Some).collect::<Vec<_>>());
        }
        if !restart.replaced_programs.is_empty() {
            info!(
                programs = ?restart.replaced_programs, held_packets = restart.held_packets,
                "took over the steering program of an earlier xvs"
            );
        }
        crate::engine::log_adopted(&restart);
        for why in &restart.started_empty {
            warn!("flow state started empty: {why}");
        }
        if let Some(why) = &restart.plain_pages {
            warn!("flow state in 4 KiB pages (slower lookups): {why}");
        }
        println!(
            "ready: {} services on {}, {} worker(s), admin API on {}",
            services.0,
            services.1,
            cfg.workers(),
            cfg.admin.socket.display()
        );
        let _ = std::io::stdout().flush();
        info!(
            services = services.0, interface = %services.1, workers = cfg.workers(),
            socket = %cfg.admin.socket.display(), "serving"
        );
        notify(&[sd_notify::NotifyState::Ready]);
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    notify(&[sd_notify::NotifyState::Reloading]);
                    match engine.call(|e| { let r = e.reload(); (r, e.wait_applied()) }).await {
                        Ok((Ok(a), applied)) => info!(
                            config = %config.display(), added = a.added, changed = a.changed,
                            removed = a.removed, unchanged = a.unchanged,
                            applied_ms = applied.map(|s| s * 1e3), "reloaded"
                        ),
                        Ok((Err(e), _)) => warn!(config = %config.display(), "reload refused, nothing changed: {e}"),
                        Err(e) => error!("reload: {e}"),
                    }
                    notify(&[sd_notify::NotifyState::Ready]);
                }
                _ = term.recv() => { info!("SIGTERM: stopping"); break; }
                _ = int.recv() => { info!("SIGINT: stopping"); break; }
            }
        }
        notify(&[sd_notify::NotifyState::Stopping]);
        let _ = stop_tx.send(true);
        for s in servers {
            let _ = s.await;
        }
        est.abort();
        collector.abort();
        checker.abort();
        if let Some(l) = liveness {
            l.abort();
        }
        if let Some(k) = kube_task {
            for t in k {
                t.abort();
            }
        }
        if let Some(w) = watchdog {
            w.abort();
        }
        let _ = std::fs::remove_file(&cfg.admin.socket);
        Ok::<(), StartError>(())
    });
    // Every handle is gone once the runtime is: the engine thread stops the
    // workers and detaches the programs.
    drop(rt);
    drop(engine);
    let snapshots = thread.join();
    let mut out = std::io::stdout().lock();
    for s in &snapshots {
        let _ = writeln!(out, "{}", summary(s));
    }
    match served {
        Ok(()) => 0,
        Err(e) => {
            error!("{e}");
            EXIT_START
        }
    }
}

/// Starts the Kubernetes watchers and the task that hands their desired
/// set to the engine (the latest set wins when the engine is busy). The
/// time from the first event not yet applied to every worker having
/// applied the set is observed in the `xvs_kube_event_to_dataplane_seconds`
/// histogram.
#[allow(clippy::disallowed_types)] // the event -> data plane delay is wall-clock time
async fn start_kube(
    cfg: &xvs_config::Config,
    status: Arc<crate::kube::source::KubeStatus>,
    shared: Arc<Shared>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, StartError> {
    let client = crate::kube::source::client(cfg.kubernetes.kubeconfig.as_deref()).await?;
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    let name = cfg.kubernetes.service_proxy_name.clone();
    // When the oldest change not yet applied arrived.
    let pending: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
    let arrived = pending.clone();
    let watch = tokio::spawn(crate::kube::source::run(
        client,
        name,
        status,
        move |set, warnings| {
            for w in &warnings {
                warn!("kubernetes: {w}");
            }
            if let Ok(mut p) = arrived.lock() {
                p.get_or_insert_with(std::time::Instant::now);
            }
            let _ = tx.send(Some(set));
        },
    ));
    let apply = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let Some(set) = rx.borrow_and_update().clone() else {
                continue;
            };
            let latency = shared.histograms.update_latency.clone();
            let delay = shared.histograms.kube_delay.clone();
            let since = pending.lock().ok().and_then(|mut p| p.take());
            let applied = shared
                .engine
                .call(move |e| {
                    let r = e.set_kube(set);
                    // The first whole copy is in: the flows of its
                    // services can be adopted.
                    e.adopt();
                    crate::api::applied(e, r, &latency)
                })
                .await;
            match applied {
                Ok(Ok(a)) if a.added + a.changed + a.removed > 0 => {
                    if let Some(t) = since {
                        delay.observe(t.elapsed().as_secs_f64());
                    }
                    info!(
                        added = a.added,
                        changed = a.changed,
                        removed = a.removed,
                        applied_ms = a.applied_seconds.map(|s| s * 1e3),
                        "kubernetes: applied"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => warn!("kubernetes: {e}"),
                Err(e) => error!("kubernetes: {e}"),
            }
        }
    });
    Ok(vec![watch, apply])
}

/// Pins the calling thread to one of `cores` (the first; a no-op when
/// there is none to spare).
fn pin_to(cores: &[core_affinity::CoreId]) {
    if let Some(c) = cores.first() {
        core_affinity::set_for_current(*c);
    }
}

/// Logs to stderr for journald: no colours and no timestamps when
/// journald is the reader (it stamps lines itself), `RUST_LOG`-style
/// filtering (default `info`).
pub fn init_logs() {
    use std::io::IsTerminal;
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !journald)
        .with_target(false);
    let _ = if journald {
        fmt.without_time().try_init()
    } else {
        fmt.try_init()
    };
}
