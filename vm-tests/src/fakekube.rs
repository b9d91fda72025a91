//! A fake Kubernetes API server for tests: list and watch of v1 Services
//! and discovery.k8s.io/v1 EndpointSlices over HTTP, enough for kube-rs's
//! watcher.
//!
//! - list: `{kind}List` with `metadata.resourceVersion`, label selectors
//!   (`k=v`, `k!=v`, `k`, `!k`, comma = and);
//! - watch (`?watch=true&resourceVersion=R`): chunked newline-delimited
//!   JSON events (ADDED, MODIFIED, DELETED, BOOKMARK when asked for,
//!   ERROR) after R; an object that stops or starts matching the selector
//!   is DELETED or ADDED, as the real server does; a watch from a
//!   resourceVersion older than the last [`FakeKube::compact`] gets an
//!   ERROR event with a 410 Expired status;
//! - [`FakeKube::set_down`] makes it answer 500 and end every open watch
//!   (kube-rs retries 503s itself; a 500 surfaces as a watch error);
//!   [`FakeKube::drop_watches`] ends the open watches only.
//!
//! Objects are kept as JSON; every change bumps one resourceVersion
//! counter shared by both resources. Invariant: events are kept in order
//! of resourceVersion, and a watch sends each at most once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::watch;

/// The two kinds served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// v1 Service.
    Service,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
}

impl Kind {
    fn list_kind(self) -> &'static str {
        match self {
            Kind::Service => "ServiceList",
            Kind::EndpointSlice => "EndpointSliceList",
        }
    }

    /// Its API group and resource, as RBAC rules name them.
    fn group_resource(self) -> (&'static str, &'static str) {
        match self {
            Kind::Service => ("", "services"),
            Kind::EndpointSlice => ("discovery.k8s.io", "endpointslices"),
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::Service => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
        }
    }
}

#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    kind: Kind,
    /// The object after the change (before, for a delete).
    object: Value,
    deleted: bool,
}

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<(Kind, String, String), Value>,
    events: Vec<Event>,
    /// Watches from a resourceVersion below this get 410.
    compacted: u64,
    down: bool,
    /// Bumped to end every open watch.
    generation: u64,
}

struct Shared {
    store: Mutex<Store>,
    changed: watch::Sender<u64>,
    /// Who may ask what, when the server checks it.
    access: Option<Access>,
    /// Requests refused by that check (`401 ...`, `403 verb group/resource`).
    refused: Mutex<Vec<String>>,
}

/// One rule of a ClusterRole: these verbs on these resources of these API
/// groups (`*` matches any).
#[derive(Debug, Clone)]
pub struct Rule {
    /// API groups (`""` is the core group).
    pub api_groups: Vec<String>,
    /// Resources (`services`, `endpointslices`).
    pub resources: Vec<String>,
    /// Verbs (`list`, `watch`).
    pub verbs: Vec<String>,
}

/// What the server requires: a bearer token, and a role granting each
/// request (its verb is `watch` with `?watch=true`, else `list`), as the
/// API server's RBAC authorizer decides.
#[derive(Debug, Clone)]
pub struct Access {
    /// The token every request must carry (`Authorization: Bearer ...`).
    pub token: String,
    /// The role's rules.
    pub rules: Vec<Rule>,
}

impl Access {
    fn allows(&self, verb: &str, group: &str, resource: &str) -> bool {
        let any = |list: &[String], x: &str| list.iter().any(|v| v == x || v == "*");
        self.rules.iter().any(|r| {
            any(&r.api_groups, group) && any(&r.resources, resource) && any(&r.verbs, verb)
        })
    }
}

/// A running fake API server; stops when dropped.
pub struct FakeKube {
    shared: Arc<Shared>,
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

fn labels_match(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &obj["metadata"]["labels"];
    sel.split(',').all(|term| {
        let term = term.trim();
        if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k.trim().trim_end_matches('=')].as_str() == Some(v.trim())
        } else if let Some(k) = term.strip_prefix('!') {
            labels[k.trim()].is_null()
        } else {
            !labels[term].is_null()
        }
    })
}

fn with_rv(mut obj: Value, rv: u64) -> Value {
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    obj
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params {
    label_selector: Option<String>,
    resource_version: Option<String>,
    watch: Option<String>,
    allow_watch_bookmarks: Option<String>,
    timeout_seconds: Option<u64>,
}

/// The request's `Authorization` header.
fn bearer(h: &HeaderMap) -> Option<String> {
    h.get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn truthy(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("true") | Some("1"))
}

async fn serve_kind(
    shared: Arc<Shared>,
    kind: Kind,
    ns: Option<String>,
    p: Params,
    auth: Option<String>,
) -> Response {
    if let Some(access) = &shared.access {
        let verb = if truthy(&p.watch) { "watch" } else { "list" };
        let (group, resource) = kind.group_resource();
        let refusal = if auth.as_deref() != Some(&format!("Bearer {}", access.token)) {
            Some((
                StatusCode::UNAUTHORIZED,
                format!("401 {verb} {group}/{resource}"),
            ))
        } else if !access.allows(verb, group, resource) {
            Some((
                StatusCode::FORBIDDEN,
                format!("403 {verb} {group}/{resource}"),
            ))
        } else {
            None
        };
        if let Some((status, what)) = refusal {
            match shared.refused.lock() {
                Ok(mut r) => r.push(what.clone()),
                Err(e) => e.into_inner().push(what.clone()),
            }
            let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": what, "code": status.as_u16()});
            return (status, axum::Json(body)).into_response();
        }
    }
    let (down, generation) = {
        let s = match shared.store.lock() {
            Ok(s) => s,
            Err(e) => e.into_inner(),
        };
        (s.down, s.generation)
    };
    if down {
        return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
    }
    let selector = p.label_selector.clone();
    let in_ns = move |o: &Value| {
        ns.as_deref()
            .is_none_or(|n| o["metadata"]["namespace"] == n)
    };
    if !truthy(&p.watch) {
        let s = match shared.store.lock() {
            Ok(s) => s,
            Err(e) => e.into_inner(),
        };
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|((k, _, _), o)| *k == kind && in_ns(o) && labels_match(o, selector.as_deref()))
            .map(|(_, o)| o.clone())
            .collect();
        let body = json!({
            "apiVersion": kind.api_version(),
            "kind": kind.list_kind(),
            "metadata": {"resourceVersion": s.rv.to_string()},
            "items": items,
        });
        return axum::Json(body).into_response();
    }
    let from: u64 = p
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let bookmarks = truthy(&p.allow_watch_bookmarks);
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(290).min(290));
    let stream = async_stream(
        shared.clone(),
        kind,
        from,
        selector,
        in_ns,
        bookmarks,
        generation,
    );
    let body = axum::body::Body::from_stream(tokio_stream_timeout(stream, timeout));
    Response::builder()
        .header("content-type", "application/json")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

type Chunk = Result<axum::body::Bytes, std::convert::Infallible>;

fn line(v: &Value) -> Chunk {
    let mut s = v.to_string();
    s.push('\n');
    Ok(axum::body::Bytes::from(s))
}

/// A watch in progress.
struct Watching<F> {
    shared: Arc<Shared>,
    rx: watch::Receiver<u64>,
    kind: Kind,
    selector: Option<String>,
    in_ns: F,
    bookmarks: bool,
    generation: u64,
    /// Events up to this resourceVersion were sent.
    at: u64,
    queue: std::collections::VecDeque<Chunk>,
    done: bool,
}

impl<F: Fn(&Value) -> bool> Watching<F> {
    fn visible(&self, o: &Value, deleted: bool) -> bool {
        !deleted && (self.in_ns)(o) && labels_match(o, self.selector.as_deref())
    }

    /// Queues what happened after `at`; false when the watch must end.
    fn poll(&mut self) -> bool {
        let shared = self.shared.clone();
        let s = match shared.store.lock() {
            Ok(s) => s,
            Err(e) => e.into_inner(),
        };
        if s.down || s.generation != self.generation {
            return false;
        }
        if self.at < s.compacted {
            self.done = true;
            self.queue.push_back(line(&json!({
                "type": "ERROR",
                "object": {
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "message": format!("too old resource version: {} ({})", self.at, s.compacted),
                    "reason": "Expired", "code": 410,
                }
            })));
            return true;
        }
        let mut sent = false;
        for (i, e) in s.events.iter().enumerate() {
            if e.rv <= self.at || e.kind != self.kind {
                continue;
            }
            let now = self.visible(&e.object, e.deleted);
            // Whether the object was visible before this change.
            let before = s.events[..i]
                .iter()
                .rev()
                .find(|p| p.kind == self.kind && same_object(&p.object, &e.object))
                .is_some_and(|p| self.visible(&p.object, p.deleted));
            let ty = match (before, now) {
                (false, true) => "ADDED",
                (true, true) => "MODIFIED",
                (true, false) => "DELETED",
                (false, false) => continue,
            };
            self.queue.push_back(line(
                &json!({"type": ty, "object": with_rv(e.object.clone(), e.rv)}),
            ));
            sent = true;
        }
        let newest = s.rv;
        if !sent && self.bookmarks && newest > self.at {
            self.queue.push_back(line(&json!({
                "type": "BOOKMARK",
                "object": {"apiVersion": self.kind.api_version(), "kind": self.kind.kind(),
                           "metadata": {"resourceVersion": newest.to_string()}}
            })));
        }
        self.at = self.at.max(newest);
        true
    }
}

/// The watch's event stream: the events after `from`, then new ones as
/// they come, until the server goes down or drops its watches.
fn async_stream(
    shared: Arc<Shared>,
    kind: Kind,
    from: u64,
    selector: Option<String>,
    in_ns: impl Fn(&Value) -> bool + Send + 'static,
    bookmarks: bool,
    generation: u64,
) -> impl futures_util::Stream<Item = Chunk> + Send {
    let w = Watching {
        rx: shared.changed.subscribe(),
        shared,
        kind,
        selector,
        in_ns,
        bookmarks,
        generation,
        at: from,
        queue: std::collections::VecDeque::new(),
        done: false,
    };
    futures_util::stream::unfold(w, |mut w| async move {
        loop {
            if let Some(c) = w.queue.pop_front() {
                return Some((c, w));
            }
            if w.done || !w.poll() {
                return None;
            }
            if w.queue.is_empty() {
                // Wait for a change; look again at least every 200 ms so a
                // dropped watch ends promptly.
                let _ = tokio::time::timeout(Duration::from_millis(200), w.rx.changed()).await;
            }
        }
    })
}

fn same_object(a: &Value, b: &Value) -> bool {
    a["metadata"]["namespace"] == b["metadata"]["namespace"]
        && a["metadata"]["name"] == b["metadata"]["name"]
}

fn tokio_stream_timeout(
    s: impl futures_util::Stream<Item = Chunk> + Send + 'static,
    after: Duration,
) -> impl futures_util::Stream<Item = Chunk> + Send + 'static {
    use futures_util::StreamExt;
    let deadline = tokio::time::sleep(after);
    futures_util::stream::unfold(
        (Box::pin(s), Box::pin(deadline)),
        |(mut s, mut d)| async move {
            tokio::select! {
                item = s.next() => item.map(|i| (i, (s, d))),
                _ = &mut d => None,
            }
        },
    )
}

impl FakeKube {
    /// Starts on 127.0.0.1, a free port, answering anyone.
    pub fn start() -> std::io::Result<FakeKube> {
        FakeKube::start_with(None)
    }

    /// Starts on 127.0.0.1, a free port; with `access`, every request
    /// needs its token and a rule granting it (else 401 or 403, recorded:
    /// [`FakeKube::refused`]).
    pub fn start_with(access: Option<Access>) -> std::io::Result<FakeKube> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (tx, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            changed: tx,
            access,
            refused: Mutex::new(Vec::new()),
        });
        let app = {
            let s1 = shared.clone();
            let s2 = shared.clone();
            let s3 = shared.clone();
            let s4 = shared.clone();
            Router::new()
                .route(
                    "/api/v1/services",
                    get(move |h: HeaderMap, Query(p): Query<Params>| {
                        serve_kind(s1.clone(), Kind::Service, None, p, bearer(&h))
                    }),
                )
                .route(
                    "/api/v1/namespaces/{ns}/services",
                    get(
                        move |h: HeaderMap, Path(ns): Path<String>, Query(p): Query<Params>| {
                            serve_kind(s2.clone(), Kind::Service, Some(ns), p, bearer(&h))
                        },
                    ),
                )
                .route(
                    "/apis/discovery.k8s.io/v1/endpointslices",
                    get(move |h: HeaderMap, Query(p): Query<Params>| {
                        serve_kind(s3.clone(), Kind::EndpointSlice, None, p, bearer(&h))
                    }),
                )
                .route(
                    "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                    get(
                        move |h: HeaderMap, Path(ns): Path<String>, Query(p): Query<Params>| {
                            serve_kind(s4.clone(), Kind::EndpointSlice, Some(ns), p, bearer(&h))
                        },
                    ),
                )
                .with_state(())
        };
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        rt.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeKube {
            shared,
            addr,
            rt: Some(rt),
        })
    }

    /// The requests refused for want of a token or a rule.
    pub fn refused(&self) -> Vec<String> {
        match self.shared.refused.lock() {
            Ok(r) => r.clone(),
            Err(e) => e.into_inner().clone(),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig file's text pointing at this server.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        )
    }

    fn change(&self, kind: Kind, object: Value, deleted: bool) -> u64 {
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let rv = {
            let mut s = match self.shared.store.lock() {
                Ok(s) => s,
                Err(e) => e.into_inner(),
            };
            s.rv += 1;
            let rv = s.rv;
            let key = (kind, ns, name);
            let object = if deleted {
                s.objects.remove(&key).unwrap_or(object)
            } else {
                let o = with_rv(object, rv);
                s.objects.insert(key, o.clone());
                o
            };
            s.events.push(Event {
                rv,
                kind,
                object,
                deleted,
            });
            rv
        };
        let _ = self.shared.changed.send(rv);
        rv
    }

    /// Creates or replaces an object (JSON of a Service or EndpointSlice).
    pub fn apply(&self, kind: Kind, object: Value) -> u64 {
        self.change(kind, object, false)
    }

    /// Deletes an object by namespace and name.
    pub fn delete(&self, kind: Kind, ns: &str, name: &str) -> u64 {
        self.change(
            kind,
            json!({"metadata": {"namespace": ns, "name": name}}),
            true,
        )
    }

    /// Forgets the event history: watches from older versions get 410.
    pub fn compact(&self) {
        let mut s = match self.shared.store.lock() {
            Ok(s) => s,
            Err(e) => e.into_inner(),
        };
        s.compacted = s.rv;
        s.events.clear();
        s.generation += 1;
        drop(s);
        let _ = self.shared.changed.send(u64::MAX);
    }

    /// Stops answering (503) and ends open watches, or answers again.
    pub fn set_down(&self, down: bool) {
        let mut s = match self.shared.store.lock() {
            Ok(s) => s,
            Err(e) => e.into_inner(),
        };
        s.down = down;
        s.generation += 1;
        drop(s);
        let _ = self.shared.changed.send(u64::MAX);
    }

    /// Ends every open watch (clients reconnect).
    pub fn drop_watches(&self) {
        let mut s = match self.shared.store.lock() {
            Ok(s) => s,
            Err(e) => e.into_inner(),
        };
        s.generation += 1;
        drop(s);
        let _ = self.shared.changed.send(u64::MAX);
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
