//! The control API (SPEC §4): status as JSON (`/v1/healthcheck`), as an HTML page (same URLs
//! with `Accept: text/html`, and `/`), Prometheus metrics (`/metrics`), the event log and its
//! live stream (`/v1/events`), datapath counters (`/v1/stats`, the status as JSON), and the admin endpoints: drain /
//! enable / disable a backend, reload, stop. Admin endpoints need no token on a loopback
//! listener; on any other address they need `Authorization: Bearer <lb.api_token>`; with a token
//! configured they always need it.

pub mod html;
pub mod metrics;
pub mod model;
mod serve;

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context as _;
use axum::{
    Json, Router,
    body::Body,
    extract::{Path, Query, Request, State, rejection::QueryRejection},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
};
use serde::Deserialize;
use tokio::sync::{broadcast, watch};

pub use model::NamedCounter;

use crate::{
    balancer::Admin,
    daemon::{RequestError, Shared, Stop},
};

/// What the API serves from.
#[derive(Clone)]
pub struct ApiState {
    shared: Arc<Shared>,
    /// Required bearer token of the admin endpoints (None: none configured).
    token: Option<Arc<str>>,
    /// Ends long-lived responses (the event stream) when the daemon stops.
    stop: watch::Receiver<bool>,
}

impl ApiState {
    pub fn new(shared: Arc<Shared>, token: Option<String>) -> Self {
        Self {
            shared,
            token: token.map(Into::into),
            stop: watch::channel(false).1,
        }
    }
}

/// Seconds between refreshes of the status page.
pub const PAGE_REFRESH_S: u32 = 2;

pub fn router(state: ApiState, loopback: bool) -> Router {
    let admin = Router::new()
        .route(
            "/v1/services/{service}/backends/{backend}/{action}",
            post(backend_action),
        )
        .route("/v1/reload", post(reload))
        .route("/v1/stop", post(stop))
        .route_layer(middleware::from_fn_with_state(
            (state.token.clone(), loopback),
            authorize,
        ));
    Router::new()
        .route("/", get(|| async { Redirect::to("/v1/healthcheck") }))
        .route("/v1/healthcheck", get(healthcheck_all))
        .route("/v1/healthcheck/{service}", get(healthcheck_one))
        .route("/metrics", get(metrics))
        .route("/v1/events", get(events))
        // The datapath counters are part of the status; kept for `lb stats` of older builds.
        .route("/v1/stats", get(healthcheck_all))
        .merge(admin)
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here")
        })
        .layer(middleware::from_fn(serve::catch_panic))
        .with_state(state)
}

/// Serves until `shutdown` turns true.
pub async fn serve(
    addr: SocketAddr,
    mut state: ApiState,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the control API to {addr}"))?;
    let loopback = addr.ip().is_loopback();
    if !loopback && state.token.is_none() {
        tracing::warn!(%addr, "the control API listens beyond loopback without lb.api_token (or LB_API_TOKEN): its admin endpoints answer 401");
    }
    tracing::info!(
        %addr,
        max_connections = crate::resources::MAX_API_CONNECTIONS,
        header_timeout_s = serve::HEADER_TIMEOUT.as_secs(),
        "control API listening"
    );
    state.stop = shutdown.clone();
    let shared = state.shared.clone();
    serve::run(listener, router(state, loopback), shared, shutdown).await;
    Ok(())
}

async fn authorize(
    State((token, loopback)): State<(Option<Arc<str>>, bool)>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let allowed = match (&token, given) {
        (Some(want), Some(got)) => constant_time_eq(want.as_bytes(), got.as_bytes()),
        (Some(_), None) => false,
        (None, _) => loopback,
    };
    if allowed {
        return next.run(request).await;
    }
    let message = match token {
        Some(_) => "admin endpoints need `Authorization: Bearer <lb.api_token>`",
        None => {
            "admin endpoints are only open on a loopback listener; set lb.api_token (or LB_API_TOKEN) to use them here"
        }
    };
    let mut response = error(StatusCode::UNAUTHORIZED, message);
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        "Bearer".parse().expect("static header"),
    );
    response
}

/// Compares without an early exit, so timing does not reveal a token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn request_error(e: RequestError) -> Response {
    match e {
        RequestError::NotFound(m) => error(StatusCode::NOT_FOUND, &m),
        RequestError::Invalid(problems) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": problems.join("; "), "problems": problems })),
        )
            .into_response(),
        RequestError::Failed(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    }
}

fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

fn status_reply(state: &ApiState, headers: &HeaderMap, only: Option<&str>) -> Response {
    match state.shared.status(only) {
        Ok(status) if wants_html(headers) => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html::page(&status, PAGE_REFRESH_S),
        )
            .into_response(),
        Ok(status) => Json(status).into_response(),
        Err(e) => request_error(e),
    }
}

async fn healthcheck_all(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    status_reply(&state, &headers, None)
}

async fn healthcheck_one(
    State(state): State<ApiState>,
    Path(service): Path<String>,
    headers: HeaderMap,
) -> Response {
    status_reply(&state, &headers, Some(&service))
}

async fn metrics(State(state): State<ApiState>) -> Response {
    match state.shared.status(None) {
        Ok(status) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            metrics::render(&status),
        )
            .into_response(),
        Err(e) => request_error(e),
    }
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    /// Only events with a larger `seq`.
    #[serde(default)]
    after: u64,
    /// At most this many (the most recent).
    #[serde(default = "default_limit")]
    limit: usize,
    /// Keep the response open and stream events as they happen (one JSON object per line).
    #[serde(default)]
    follow: bool,
}

fn default_limit() -> usize {
    crate::events::CAPACITY
}

async fn events(
    State(state): State<ApiState>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.body_text()),
    };
    if !q.follow {
        return Json(state.shared.events.after(q.after, q.limit)).into_response();
    }
    let (backlog, live) = state.shared.events.follow(q.after);
    let stream = futures_util::stream::unfold(
        (backlog.into_iter(), live, state.stop.clone()),
        |(mut backlog, mut live, mut stop)| async move {
            if let Some(e) = backlog.next() {
                return Some((Ok::<_, std::io::Error>(line(&e)), (backlog, live, stop)));
            }
            loop {
                let received = tokio::select! {
                    received = live.recv() => received,
                    _ = stop.wait_for(|s| *s) => return None,
                };
                match received {
                    Ok(e) => return Some((Ok(line(&e)), (backlog, live, stop))),
                    // The follower fell behind: it sees the gap in `seq`.
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        },
    );
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

fn line(event: &model::Event) -> String {
    let mut s = serde_json::to_string(event).expect("events serialize");
    s.push('\n');
    s
}

/// `POST /v1/services/{service}/backends/{ip:port}/{drain|enable|disable}`.
async fn backend_action(
    State(state): State<ApiState>,
    Path((service, backend, action)): Path<(String, String, String)>,
) -> Response {
    let admin = match action.as_str() {
        "drain" => Admin::Drained,
        "enable" => Admin::Enabled,
        "disable" => Admin::Disabled,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("unknown action {other:?}: expected drain, enable or disable"),
            );
        }
    };
    match state.shared.set_admin(&service, &backend, admin) {
        Ok(view) => Json(serde_json::json!({
            "service": service,
            "backend": backend,
            "admin": view.admin.as_str(),
            "state": view.state.as_str(),
        }))
        .into_response(),
        Err(e) => request_error(e),
    }
}

/// `POST /v1/reload`: the config file is read again (as SIGHUP does).
async fn reload(State(state): State<ApiState>) -> Response {
    let shared = state.shared.clone();
    // Reading the file and resolving SNAT addresses block briefly.
    match tokio::task::spawn_blocking(move || shared.reload("API")).await {
        Ok(Ok(changes)) => Json(serde_json::json!({
            "services_added": changes.services_added,
            "services_removed": changes.services_removed,
            "services_changed": changes.services_changed,
            "backends_added": changes.backends_added.iter().map(|(s, b)| format!("{s} {b}")).collect::<Vec<_>>(),
            "backends_removed": changes.backends_removed.iter().map(|(s, b)| format!("{s} {b}")).collect::<Vec<_>>(),
        }))
        .into_response(),
        Ok(Err(e)) => request_error(e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `POST /v1/stop`: the daemon exits and removes the datapath, pinned or not.
async fn stop(State(state): State<ApiState>) -> Response {
    state.shared.request_stop(Stop::Remove);
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "stopping": true })),
    )
        .into_response()
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}
