//! The admin API client: one HTTP/1.1 request per call over the unix
//! socket (hyper's connection API on a tokio `UnixStream`), or over TCP
//! with a bearer token.

use std::path::PathBuf;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

/// Where the daemon listens.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// The unix socket.
    Unix(PathBuf),
    /// `host:port` and the bearer token.
    Tcp(String, String),
}

/// An answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Body text.
    pub body: String,
}

impl Answer {
    /// The body when the status is 2xx, else the API's error message.
    pub fn ok(self) -> Result<String, String> {
        if (200..300).contains(&self.status) {
            return Ok(self.body);
        }
        let msg = serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| self.body.trim().to_owned());
        Err(msg)
    }
}

/// GETs `path` and hands each chunk of the body to `each` as it arrives
/// (a streaming answer: `observe --follow`), until the server ends it.
pub fn stream(to: &Endpoint, path: &str, mut each: impl FnMut(&str)) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut res = connect_and_send(to, build(to, Method::GET, path, None)?).await?;
        if !res.status().is_success() {
            return Err(format!("xvs answered {}", res.status()));
        }
        while let Some(frame) = res.body_mut().frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            if let Some(data) = frame.data_ref() {
                each(&String::from_utf8_lossy(data));
            }
        }
        Ok(())
    })
}

async fn open<S>(
    io: S,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// Connects to `to` and sends `req`.
async fn connect_and_send(
    to: &Endpoint,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    match to {
        Endpoint::Unix(p) => {
            let s = tokio::net::UnixStream::connect(p).await.map_err(|e| {
                format!("cannot reach xvs at {}: {e} (is it running?)", p.display())
            })?;
            open(s, req).await
        }
        Endpoint::Tcp(addr, _) => {
            let s = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("cannot reach xvs at {addr}: {e}"))?;
            open(s, req).await
        }
    }
}

/// A request to `to` (with its bearer token over TCP).
fn build(
    to: &Endpoint,
    method: Method,
    path: &str,
    body: Option<String>,
) -> Result<Request<Full<Bytes>>, String> {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "xvs");
    if body.is_some() {
        req = req.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    if let Endpoint::Tcp(_, token) = to {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    req.body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())
}

/// How long one request may take, connecting included: longer than any
/// answer the daemon takes to give (a dump of millions of flows takes a
/// few seconds), short enough that a stuck daemon is said to be stuck.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Sends one request and waits for the whole answer, at most
/// [`REQUEST_TIMEOUT`].
pub fn request(
    to: &Endpoint,
    method: Method,
    path: &str,
    body: Option<String>,
) -> Result<Answer, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let res = connect_and_send(to, build(to, method, path, body)?).await?;
        let status = res.status().as_u16();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    rt.block_on(async {
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "xvs at {} did not answer within {} s (overloaded or stuck?)",
                    to.describe(),
                    REQUEST_TIMEOUT.as_secs()
                ))
            })
    })
}

impl Endpoint {
    /// Where it is, for messages.
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Tcp(a, _) => a.clone(),
        }
    }
}
