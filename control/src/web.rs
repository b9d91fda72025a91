//! The web view: a page served by the admin API at `/ui` that draws the
//! API's own JSON (`/v1/overview`, `/v1/services`, `/v1/events`): the
//! gateway's state as `xvs status` shows it, services and backends with
//! their live rates, drop reasons over time, and the flow events filtered
//! by verdict and service (Hubble UI's flow table is the model).
//!
//! Invariant: the assets are compiled into the binary (`include_str!`),
//! plain HTML, CSS and JavaScript with no library and no build step, and
//! hold no data: on the TCP listener they are served without the token,
//! and the page's API calls carry it (`Authorization: Bearer`).

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("web/index.html");
const APP_JS: &str = include_str!("web/app.js");
const APP_CSS: &str = include_str!("web/app.css");

/// The web view's routes (merged beside the API after its token layer:
/// see the module's invariant).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let page = || async { asset("text/html; charset=utf-8", INDEX) };
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
}

fn asset(kind: &'static str, body: &'static str) -> axum::response::Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            // Nothing from elsewhere: no CDN, no inline script.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; style-src 'self'; script-src 'self'",
            ),
        ],
        body,
    )
        .into_response()
}
