//! The Kubernetes source: kube-rs watchers on the Services labelled for
//! this proxy and on every EndpointSlice, a local copy of both, and after
//! every change the whole desired service set handed to a callback (the
//! engine applies only its difference).
//!
//! Fail static: a watch error or a vanished API server changes nothing;
//! the last good state stays, the watchers retry with backoff, and
//! [`KubeStatus`] says whether the copy is in sync and how old the last
//! sync is. A re-list (after a 410 Expired, or a restart of the server)
//! rebuilds the copy and hands over the full set again, which the engine
//! diffs against what it has: no flapping of the data plane.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use xvs_config::{Service, ServiceKey};

use super::translate::{full_name, selected, slice_owner, translate, PROXY_NAME_LABEL};

/// Whether the copy is in sync, and since when.
#[derive(Debug, Default)]
pub struct KubeStatus {
    listed_services: AtomicBool,
    listed_slices: AtomicBool,
    /// Milliseconds since the UNIX epoch of the last event (the API server
    /// answered).
    last_ok_ms: AtomicU64,
    /// Milliseconds since the UNIX epoch of the last watch error.
    last_error_ms: AtomicU64,
    /// Watch errors seen.
    pub errors: AtomicU64,
    /// Invalid values in the latest set (each reported in the log with
    /// its Service; the defaults were used).
    pub warnings: AtomicU64,
}

/// The source's state at one moment (`/metrics`, `xvs status`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KubeReading {
    /// The copy is in sync with the API server ([`KubeStatus::synced`]).
    pub synced: bool,
    /// Seconds since the last event (none yet: `None`).
    pub last_event_age: Option<f64>,
    /// Watch errors since start.
    pub errors: u64,
    /// Invalid values in the latest set (defaults used).
    #[serde(default)]
    pub invalid_values: u64,
}

impl KubeStatus {
    /// Its state now.
    pub fn reading(&self) -> KubeReading {
        KubeReading {
            synced: self.synced(),
            last_event_age: self.last_sync_age(),
            errors: self.errors.load(Ordering::Relaxed),
            invalid_values: self.warnings.load(Ordering::Relaxed),
        }
    }

    /// Both kinds were listed, and the API server answered after the last
    /// error (a resumed watch sends nothing until something changes, so
    /// an error stays visible until then).
    pub fn synced(&self) -> bool {
        self.listed()
            && self.last_ok_ms.load(Ordering::Relaxed) >= self.last_error_ms.load(Ordering::Relaxed)
    }

    /// Both kinds were listed at least once (the copy is whole).
    pub fn listed(&self) -> bool {
        self.listed_services.load(Ordering::Relaxed) && self.listed_slices.load(Ordering::Relaxed)
    }

    /// Seconds since the last event from the API server (None before the
    /// first).
    pub fn last_sync_age(&self) -> Option<f64> {
        let at = self.last_ok_ms.load(Ordering::Relaxed);
        (at > 0).then(|| (now_ms().saturating_sub(at)) as f64 / 1e3)
    }

    fn ok(&self) {
        self.last_ok_ms.store(now_ms(), Ordering::Relaxed);
    }

    fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.last_error_ms.store(now_ms(), Ordering::Relaxed);
    }
}

fn now_ms() -> u64 {
    // Wall clock: the age is shown to operators.
    #[allow(clippy::disallowed_types)]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The local copy of the cluster's objects.
#[derive(Debug, Default)]
pub struct Copy {
    services: HashMap<String, KubeService>,
    slices: HashMap<String, EndpointSlice>,
}

/// The whole desired set from a copy, with the warnings of every Service.
pub fn desired(c: &Copy, proxy_name: &str) -> (BTreeMap<ServiceKey, Service>, Vec<String>) {
    let mut by_owner: HashMap<String, Vec<&EndpointSlice>> = HashMap::new();
    for s in c.slices.values() {
        if let Some(owner) = slice_owner(s) {
            by_owner.entry(owner).or_default().push(s);
        }
    }
    let mut out = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut names: Vec<&String> = c.services.keys().collect();
    names.sort();
    for name in names {
        let svc = &c.services[name];
        if !selected(svc, proxy_name) {
            continue;
        }
        let slices = by_owner.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let t = translate(svc, slices);
        warnings.extend(t.warnings);
        for s in t.services {
            if out.contains_key(&s.key) {
                warnings.push(format!(
                    "{name}: {} is already served by another Service; kept the first",
                    crate::engine::key_name(&s.key)
                ));
                continue;
            }
            out.insert(s.key, s);
        }
    }
    (out, warnings)
}

fn key_of(ns: Option<&str>, name: Option<&str>) -> String {
    full_name(ns, name)
}

/// Applies one watcher event to a map; `staging` collects a re-list.
/// Returns whether the copy changed (a re-list counts at its end).
fn apply<K: kube::Resource>(
    map: &mut HashMap<String, K>,
    staging: &mut Option<HashMap<String, K>>,
    ev: Event<K>,
) -> bool {
    let key = |o: &K| key_of(o.meta().namespace.as_deref(), o.meta().name.as_deref());
    match ev {
        Event::Apply(o) => {
            map.insert(key(&o), o);
            true
        }
        Event::Delete(o) => {
            map.remove(&key(&o));
            true
        }
        Event::Init => {
            *staging = Some(HashMap::new());
            false
        }
        Event::InitApply(o) => {
            staging.get_or_insert_with(HashMap::new).insert(key(&o), o);
            false
        }
        Event::InitDone => {
            *map = staging.take().unwrap_or_default();
            true
        }
    }
}

/// Watches until the task is dropped; calls `on_change` with the whole
/// desired set (and the warnings) after every change of the copy.
pub async fn run(
    client: Client,
    proxy_name: String,
    status: Arc<KubeStatus>,
    mut on_change: impl FnMut(BTreeMap<ServiceKey, Service>, Vec<String>) + Send,
) {
    let services: Api<KubeService> = Api::all(client.clone());
    let probe_api = services.clone();
    let slices: Api<EndpointSlice> = Api::all(client);
    let svc_cfg = watcher::Config::default().labels(&format!("{PROXY_NAME_LABEL}={proxy_name}"));
    let svc_stream = watcher::watcher(services, svc_cfg)
        .default_backoff()
        .map(Either::Svc);
    let slice_stream = watcher::watcher(slices, watcher::Config::default())
        .default_backoff()
        .map(Either::Slice);
    let mut events = std::pin::pin!(futures_util::stream::select(svc_stream, slice_stream));
    let mut copy = Copy::default();
    let (mut svc_staging, mut slice_staging) = (None, None);
    // After an error, a watch that resumes quietly sends nothing: a cheap
    // list (one item) every second tells whether the server answers again.
    let mut probe = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        let ev = tokio::select! {
            ev = events.next() => match ev {
                Some(ev) => ev,
                None => break,
            },
            _ = probe.tick() => {
                if status.listed() && !status.synced()
                    && probe_api.list(&kube::api::ListParams::default().limit(1)).await.is_ok()
                {
                    status.ok();
                }
                continue;
            }
        };
        let changed = match ev {
            Either::Svc(Ok(e)) => {
                if matches!(e, Event::InitDone) {
                    status.listed_services.store(true, Ordering::Relaxed);
                }
                status.ok();
                apply(&mut copy.services, &mut svc_staging, e)
            }
            Either::Slice(Ok(e)) => {
                if matches!(e, Event::InitDone) {
                    status.listed_slices.store(true, Ordering::Relaxed);
                }
                status.ok();
                apply(&mut copy.slices, &mut slice_staging, e)
            }
            Either::Svc(Err(e)) => {
                status.error();
                tracing::warn!("kubernetes: Services watch: {e}; keeping the last state, retrying");
                false
            }
            Either::Slice(Err(e)) => {
                status.error();
                tracing::warn!(
                    "kubernetes: EndpointSlices watch: {e}; keeping the last state, retrying"
                );
                false
            }
        };
        // Hand over only once both have listed: a half-listed copy would
        // remove the other half's services.
        if changed && status.listed() {
            let (set, warnings) = desired(&copy, &proxy_name);
            status
                .warnings
                .store(warnings.len() as u64, Ordering::Relaxed);
            on_change(set, warnings);
        }
    }
}

// One event at a time flows through; the size difference is irrelevant.
#[allow(clippy::large_enum_variant)]
enum Either {
    Svc(Result<Event<KubeService>, watcher::Error>),
    Slice(Result<Event<EndpointSlice>, watcher::Error>),
}

/// Why no Kubernetes client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file cannot be read or parsed.
    #[error("{}: {source}", path.display())]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// What kube said.
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig file does not give a usable configuration.
    #[error("{}: {source}", path.display())]
    Config {
        /// The file.
        path: std::path::PathBuf,
        /// What kube said.
        source: kube::config::KubeconfigError,
    },
    /// Not running in a cluster (no service account), and no kubeconfig.
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    /// The client cannot be built from the configuration.
    #[error("{0}")]
    Client(#[from] kube::Error),
}

/// A client from a kubeconfig file, or the in-cluster configuration.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, ClientError> {
    // TLS to the API server uses rustls with ring; installing the
    // process-wide provider a second time is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).map_err(|source| {
                ClientError::Kubeconfig {
                    path: p.to_owned(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Config {
                    path: p.to_owned(),
                    source,
                })?
        }
        None => kube::Config::incluster()?,
    };
    Ok(Client::try_from(config)?)
}
