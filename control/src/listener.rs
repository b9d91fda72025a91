//! The admin API's listeners, bounded so that no client can exhaust the
//! daemon: each listener serves at most a fixed number of connections at
//! once and closes the excess at once (the unix socket has a budget of its
//! own, so the operator's `xvsadm` gets in whatever happens on TCP); a
//! client that does not send a whole request head within
//! [`HEADER_TIMEOUT`] (counted again while a kept-alive connection waits
//! for its next request) is disconnected. The bearer token is checked
//! before anything reads a request body (`api::with_token` runs before the
//! handlers' extractors).
//!
//! Written on hyper's connection API because `axum::serve` has neither a
//! connection limit nor a header timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Semaphore};

/// Connections the unix socket serves at once.
pub const UNIX_CONNECTIONS: usize = 64;
/// Connections the TCP listener serves at once.
pub const TCP_CONNECTIONS: usize = 256;
/// Longest wait for a whole request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// A listener the admin API serves.
pub enum Listener {
    /// The unix socket.
    Unix(tokio::net::UnixListener),
    /// The TCP listener.
    Tcp(tokio::net::TcpListener),
}

/// Connections a listener closed because it was at its limit.
#[derive(Debug, Default)]
pub struct Refused(AtomicU64);

impl Refused {
    /// How many so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Serves `app` on `listener`, at most `limit` connections at once, until
/// `stop` turns true; then stops accepting and gives the connections in
/// progress a second to finish.
pub async fn serve(
    listener: Listener,
    app: Router,
    limit: usize,
    refused: Arc<Refused>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limit));
    loop {
        let accepted = tokio::select! {
            a = accept(&listener) => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Ok(conn) = accepted else {
            // Out of file descriptors, or the like: breathe, then go on.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            let n = refused.0.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    limit,
                    refused = n,
                    "admin API: too many connections; closing new ones"
                );
            }
            drop(conn);
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            match conn {
                Conn::Unix(s) => serve_connection(s, app).await,
                Conn::Tcp(s) => serve_connection(s, app).await,
            }
            drop(permit);
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), slots.acquire_many(limit as u32)).await;
}

enum Conn {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

async fn accept(l: &Listener) -> std::io::Result<Conn> {
    match l {
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            Conn::Tcp(s)
        }),
    }
}

async fn serve_connection<S>(io: S, app: Router)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), service)
        .await;
}
