//! The control API (SPEC §4): status as JSON (`/v1/healthcheck`), as an HTML page (same URLs
//! with `Accept: text/html`, and `/`), Prometheus metrics (`/metrics`), the event log and its
//! live stream (`/v1/events`), datapath counters (`/v1/stats`, the status as JSON), and the admin endpoints: drain /
//! enable / disable a backend, drain / undrain the host (its VIPs' routes), reload, stop, and
//! the datapath trace (`POST /v1/trace`, streamed; `GET /v1/trace`, its state). Admin endpoints need no token on a loopback
//! listener; on any other address they need `Authorization: Bearer <lb.api_token>`; with a token
//! configured they always need it.

mod config;
pub mod html;
pub mod metrics;
mod serve;
pub use config::ChangeRequest;
pub use serve::SEND_TIMEOUT;

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

use crate::{
    events::EventLog,
    model::{
        Admin, AdminReply, ErrorReply, Event, HostReply, ReloadReply, Status, StopReply, TraceLine,
        TraceState,
    },
    resources::Resources,
    trace,
};

/// What the API asks of the daemon: `daemon::Shared` implements it (a fake does in the router's
/// tests). The API knows nothing else of the daemon.
pub trait Control: Send + Sync + 'static {
    /// Every service, or only `only`.
    fn status(&self, only: Option<&str>) -> Result<Status, RequestError>;
    fn events(&self) -> &EventLog;
    /// An operator's setting for a backend (`backend`: "IP:PORT" as given).
    fn set_admin(
        &self,
        service: &str,
        backend: &str,
        admin: Admin,
    ) -> Result<AdminReply, RequestError>;
    /// Reads the config file again and moves to it (blocks: run it off the async workers).
    fn reload(&self, via: &str) -> Result<ReloadReply, RequestError>;
    /// The daemon exits and removes its datapath (withdrawing its VIPs first, if it announces
    /// them).
    fn stop(&self) -> StopReply;
    /// `drain`: every VIP withdrawn, forwarding goes on (`lb drain-host`); otherwise announced
    /// again as their services want (`lb undrain-host`). Blocks until the routes are written.
    fn host(&self, drain: bool) -> Result<HostReply, RequestError>;
    /// The daemon's resources: the API counts its connections there.
    fn resources(&self) -> &Resources;
    /// Reports a shortage of the host's (logged and evented, rate-limited).
    fn local_shortage(&self, place: &'static str, what: &str);
    /// Opens a session of the datapath trace: `service` (a name) and `client` (ADDR or
    /// ADDR/PREFIX) filter it, for `duration` at most [`trace::MAX_DURATION`].
    fn trace(
        &self,
        service: Option<&str>,
        client: Option<&str>,
        duration: std::time::Duration,
    ) -> Result<trace::Session, RequestError>;
    /// Whether the datapath traces now, and what it could not show.
    fn trace_state(&self) -> Result<TraceState, RequestError>;
    /// The configuration running: its version, its file and the file's text at that version.
    fn config(&self) -> Result<(crate::source::Version, String, Arc<str>), RequestError>;
    /// A change of the configuration, or its dry run (blocks: run it off the async workers).
    fn change(&self, req: ChangeRequest) -> Result<crate::model::ChangeReply, RequestError>;
}

/// A failed operator request: what the API answers (status code by kind).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    NotFound(String),
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
    /// The configuration changed under the request (a file edited by hand): 409.
    #[error("{0}")]
    Conflict(String),
    /// The request's precondition (If-Match, create only) does not hold: 412.
    #[error("{0}")]
    Precondition(String),
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// What the API serves from.
#[derive(Clone)]
pub struct ApiState {
    control: Arc<dyn Control>,
    /// Required bearer token of the admin endpoints (None: none configured).
    token: Option<Arc<str>>,
    /// Ends long-lived responses (the event stream) when the daemon stops.
    stop: watch::Receiver<bool>,
}

impl ApiState {
    pub fn new(control: Arc<dyn Control>, token: Option<String>) -> Self {
        Self {
            control,
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
        .route("/v1/host/{action}", post(host_action))
        .route("/v1/reload", post(reload))
        .route("/v1/stop", post(stop))
        // Admin: it costs the datapath, and shows clients' addresses.
        .route("/v1/trace", post(trace_stream))
        .merge(config::routes())
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
        .route("/v1/trace", get(trace_state))
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

/// Binds the control API's listener: connections queue from here on, so the daemon can say it
/// is ready before the accept loop runs.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the control API to {addr}"))
}

/// Serves until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    mut state: ApiState,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let addr = listener.local_addr().context("the control API's address")?;
    let loopback = addr.ip().is_loopback();
    if !loopback && state.token.is_none() {
        tracing::warn!(%addr, "the control API listens beyond loopback without lb.api_token (or LB_API_TOKEN): its admin endpoints answer 401");
    }
    tracing::info!(
        %addr,
        max_connections = crate::resources::MAX_API_CONNECTIONS,
        header_timeout_s = serve::HEADER_TIMEOUT.as_secs(),
        send_timeout_s = serve::SEND_TIMEOUT.as_secs(),
        "control API listening"
    );
    state.stop = shutdown.clone();
    let control = state.control.clone();
    serve::run(listener, router(state, loopback), control, shutdown).await;
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
            Json(ErrorReply {
                error: problems.join("; "),
                problems,
            }),
        )
            .into_response(),
        RequestError::Conflict(m) => error(StatusCode::CONFLICT, &m),
        RequestError::Precondition(m) => error(StatusCode::PRECONDITION_FAILED, &m),
        RequestError::Failed(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    }
}

fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

/// Runs `f` on the blocking pool: the daemon's calls take its lock, which a map write may hold
/// for milliseconds, and no async worker should wait on it.
async fn blocking<T: Send + 'static>(
    state: &ApiState,
    f: impl FnOnce(&dyn Control) -> Result<T, RequestError> + Send + 'static,
) -> Result<T, RequestError> {
    let control = state.control.clone();
    tokio::task::spawn_blocking(move || f(&*control))
        .await
        .unwrap_or_else(|e| Err(RequestError::Failed(anyhow::anyhow!("request task: {e}"))))
}

async fn status_reply(state: &ApiState, headers: &HeaderMap, only: Option<String>) -> Response {
    let html = wants_html(headers);
    // Rendered off the async workers, which run the probes: 20,000 backends make 7.9 MB of
    // JSON.
    let rendered = blocking(state, move |c| {
        let status = c.status(only.as_deref())?;
        if html {
            // The whole log (1024 events at most): the page draws its timelines from it.
            let events = c.events().after(0, crate::events::CAPACITY);
            let page = html::page(&status, &events.events, PAGE_REFRESH_S);
            let kind = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
            return Ok((kind, page).into_response());
        }
        Ok(Json(status).into_response())
    });
    rendered.await.unwrap_or_else(request_error)
}

async fn healthcheck_all(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    status_reply(&state, &headers, None).await
}

async fn healthcheck_one(
    State(state): State<ApiState>,
    Path(service): Path<String>,
    headers: HeaderMap,
) -> Response {
    status_reply(&state, &headers, Some(service)).await
}

async fn metrics(State(state): State<ApiState>) -> Response {
    // Rendered off the async workers too, which run the probes: 20,000 backends make 31 MB
    // of text (`curl /metrics` took 1.1 s here).
    match blocking(&state, |c| c.status(None).map(|s| metrics::render(&s))).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
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
        return Json(state.control.events().after(q.after, q.limit)).into_response();
    }
    let (backlog, live) = state.control.events().follow(q.after);
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

fn line(event: &Event) -> String {
    let mut s = serde_json::to_string(event).expect("events serialize");
    s.push('\n');
    s
}

#[derive(Debug, Deserialize)]
struct TraceQuery {
    /// Only this service's packets (by name).
    service: Option<String>,
    /// Only this client's (ADDR, or ADDR/PREFIX).
    client: Option<String>,
    /// How long, 1 to the maximum (the default).
    seconds: Option<u64>,
}

/// `POST /v1/trace?service=S&client=ADDR&seconds=N`: the datapath traces while this response
/// streams (one JSON [`TraceLine`] per line), until its time is up, its client goes or the
/// daemon stops.
async fn trace_stream(
    State(state): State<ApiState>,
    query: Result<Query<TraceQuery>, QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.body_text()),
    };
    let max = trace::MAX_DURATION.as_secs();
    let seconds = q.seconds.unwrap_or(max);
    if !(1..=max).contains(&seconds) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("seconds must be 1-{max}, got {seconds}"),
        );
    }
    let duration = std::time::Duration::from_secs(seconds);
    let session = match blocking(&state, move |c| {
        c.trace(q.service.as_deref(), q.client.as_deref(), duration)
    })
    .await
    {
        Ok(s) => s,
        Err(e) => return request_error(e),
    };
    let stream = futures_util::stream::unfold(
        (session, state.stop.clone()),
        |(mut session, mut stop)| async move {
            let line = tokio::select! {
                line = session.next() => line?,
                // (A closed channel, with no daemon behind the router, stops nothing.)
                Ok(_) = stop.wait_for(|s| *s) => return None,
            };
            Some((Ok::<_, std::io::Error>(trace_line(&line)), (session, stop)))
        },
    );
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

fn trace_line(line: &TraceLine) -> String {
    let mut s = serde_json::to_string(line).expect("trace lines serialize");
    s.push('\n');
    s
}

/// `GET /v1/trace`.
async fn trace_state(State(state): State<ApiState>) -> Response {
    match blocking(&state, |c| c.trace_state()).await {
        Ok(s) => Json(s).into_response(),
        Err(e) => request_error(e),
    }
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
    match blocking(&state, move |c| c.set_admin(&service, &backend, admin)).await {
        Ok(reply) => Json(reply).into_response(),
        Err(e) => request_error(e),
    }
}

/// `POST /v1/host/{drain|undrain}`.
async fn host_action(State(state): State<ApiState>, Path(action): Path<String>) -> Response {
    let drain = match action.as_str() {
        "drain" => true,
        "undrain" => false,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("unknown action {other:?}: expected drain or undrain"),
            );
        }
    };
    // It waits for the health writer to write the routes.
    match blocking(&state, move |c| c.host(drain)).await {
        Ok(reply) => Json(reply).into_response(),
        Err(e) => request_error(e),
    }
}

/// `POST /v1/reload`: the config file is read again (as SIGHUP does).
async fn reload(State(state): State<ApiState>) -> Response {
    // Reading the file and resolving SNAT addresses block too.
    match blocking(&state, |c| c.reload("API")).await {
        Ok(changes) => Json(changes).into_response(),
        Err(e) => request_error(e),
    }
}

/// `POST /v1/stop`: the daemon exits and removes the datapath, pinned or not (withdrawing its
/// VIPs and forwarding for the grace period first, when it announces them).
async fn stop(State(state): State<ApiState>) -> Response {
    let reply = state.control.stop();
    (StatusCode::ACCEPTED, Json(reply)).into_response()
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    let reply = ErrorReply {
        error: message.to_owned(),
        problems: Vec::new(),
    };
    (status, Json(reply)).into_response()
}

/// The router against a fake daemon: no socket, no root.
#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::body::to_bytes;
    use tower::ServiceExt as _;

    use super::*;
    use crate::model::HealthState;

    struct Fake {
        events: EventLog,
        resources: Resources,
        stopped: AtomicBool,
        trace: Arc<trace::Hub>,
        /// The configuration file's text: changes are made to it as the daemon makes them.
        config: std::sync::Mutex<String>,
    }

    const CONFIG: &str = "[lb]\ninterfaces = [\"eth0\"]\napi_token = \"0123456789abcdef0\"   # secret\n\n\
                          [[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\n\
                          backends = [{ address = \"10.0.2.1:80\" }]\n";

    fn fake() -> Arc<Fake> {
        Arc::new(Fake {
            events: EventLog::new(8),
            resources: Resources::default(),
            stopped: AtomicBool::new(false),
            trace: trace::Hub::new(),
            config: std::sync::Mutex::new(CONFIG.to_owned()),
        })
    }

    fn empty_status() -> Status {
        Status {
            time: 1.0,
            services: Vec::new(),
            counters: Vec::new(),
            probe_latency: Vec::new(),
            half_open_syns: None,
            events_total: 0,
            resources: Default::default(),
            announce: None,
            config: None,
        }
    }

    impl Control for Fake {
        fn status(&self, only: Option<&str>) -> Result<Status, RequestError> {
            match only {
                None | Some("web") => Ok(empty_status()),
                Some(other) => Err(RequestError::NotFound(format!("no service {other:?}"))),
            }
        }
        fn events(&self) -> &EventLog {
            &self.events
        }
        fn set_admin(
            &self,
            service: &str,
            backend: &str,
            admin: Admin,
        ) -> Result<AdminReply, RequestError> {
            if service != "web" {
                return Err(RequestError::NotFound(format!("no service {service:?}")));
            }
            Ok(AdminReply {
                service: service.to_owned(),
                backend: backend.to_owned(),
                admin,
                state: HealthState::Healthy,
            })
        }
        fn reload(&self, via: &str) -> Result<ReloadReply, RequestError> {
            assert_eq!(via, "API");
            Err(RequestError::Invalid(vec![
                "lb.api: expected IP:PORT".to_owned(),
                "service.web.vip: required".to_owned(),
            ]))
        }
        fn stop(&self) -> StopReply {
            self.stopped.store(true, Ordering::Relaxed);
            StopReply {
                stopping: true,
                grace_s: Some(5.0),
            }
        }
        fn host(&self, drain: bool) -> Result<HostReply, RequestError> {
            Ok(HostReply {
                state: Some(if drain { "drained" } else { "announcing" }.to_owned()),
                announced: Vec::new(),
                message: String::new(),
            })
        }
        fn resources(&self) -> &Resources {
            &self.resources
        }
        fn local_shortage(&self, _: &'static str, _: &str) {}
        fn trace(
            &self,
            service: Option<&str>,
            _client: Option<&str>,
            duration: std::time::Duration,
        ) -> Result<trace::Session, RequestError> {
            if service.is_some_and(|s| s != "web") {
                return Err(RequestError::NotFound("no service \"other\"".to_owned()));
            }
            self.trace
                .open(trace::Filter::default(), duration, "everything")
                .map_err(RequestError::Failed)
        }
        fn trace_state(&self) -> Result<TraceState, RequestError> {
            self.trace.status().map_err(RequestError::Failed)
        }
        fn config(&self) -> Result<(crate::source::Version, String, Arc<str>), RequestError> {
            let text = self.config.lock().unwrap().clone();
            Ok((
                crate::source::Version::of(text.as_bytes()),
                "/etc/lb/lb.toml".to_owned(),
                text.into(),
            ))
        }
        fn change(&self, req: ChangeRequest) -> Result<crate::model::ChangeReply, RequestError> {
            use crate::config::edit::{EditError, edited};
            let mut text = self.config.lock().unwrap();
            let version = crate::source::Version::of(text.as_bytes());
            if req.if_match.as_ref().is_some_and(|t| !version.matches(t)) {
                return Err(RequestError::Precondition("If-Match".to_owned()));
            }
            let new = edited(&text, &req.changes).map_err(|e| match e {
                EditError::NotFound(m) => RequestError::NotFound(m),
                EditError::Exists(m) => RequestError::Precondition(m),
                EditError::Invalid(p) => {
                    RequestError::Invalid(p.iter().map(ToString::to_string).collect())
                }
            })?;
            let old_config = crate::config::parse(&text).unwrap();
            let new_config = crate::config::parse(&new).map_err(|e| {
                RequestError::Invalid(e.0.iter().map(ToString::to_string).collect())
            })?;
            let reply = crate::model::ChangeReply {
                dry_run: req.dry_run,
                applied: !req.dry_run,
                previous_version: version.0,
                version: crate::source::Version::of(new.as_bytes()).0,
                diff: crate::config::Diff::between(&old_config, &new_config),
                timing: Default::default(),
                written_to: "/etc/lb/lb.toml".to_owned(),
            };
            if !req.dry_run {
                *text = new;
            }
            Ok(reply)
        }
    }

    /// One request through the router: (status, headers, body).
    async fn call(
        fake: &Arc<Fake>,
        token: Option<&str>,
        loopback: bool,
        request: Request,
    ) -> (StatusCode, HeaderMap, String) {
        let control: Arc<dyn Control> = fake.clone();
        let app = router(ApiState::new(control, token.map(Into::into)), loopback);
        let response = app.oneshot(request).await.expect("infallible");
        let (parts, body) = response.into_parts();
        let body = to_bytes(body, 1 << 20).await.expect("a body");
        (
            parts.status,
            parts.headers,
            String::from_utf8(body.to_vec()).expect("UTF-8"),
        )
    }

    fn req(method: &str, uri: &str) -> axum::http::request::Builder {
        Request::builder().method(method).uri(uri)
    }

    fn error_of(body: &str) -> ErrorReply {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    #[tokio::test]
    async fn reads_are_open_and_typed() {
        let fake = fake();
        let (status, headers, body) = call(
            &fake,
            None,
            false,
            req("GET", "/v1/healthcheck").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        let parsed: Status = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed, empty_status());

        let (status, headers, body) = call(
            &fake,
            None,
            false,
            req("GET", "/v1/healthcheck/web")
                .header(header::ACCEPT, "text/html")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        assert!(body.contains("<html"), "{body}");

        let (status, _, body) = call(
            &fake,
            None,
            false,
            req("GET", "/v1/events?after=2")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let events: crate::model::Events = serde_json::from_str(&body).unwrap();
        assert!(events.events.is_empty());
    }

    #[tokio::test]
    async fn bad_requests_get_their_status_and_an_error_body() {
        let fake = fake();
        let cases = [
            (
                "GET",
                "/v1/healthcheck/nope",
                StatusCode::NOT_FOUND,
                "no service \"nope\"",
            ),
            ("GET", "/nope", StatusCode::NOT_FOUND, "no such endpoint"),
            (
                "GET",
                "/v1/reload",
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed",
            ),
            (
                "DELETE",
                "/v1/healthcheck",
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed",
            ),
            (
                "GET",
                "/v1/events?after=minus",
                StatusCode::BAD_REQUEST,
                "after",
            ),
            (
                "POST",
                "/v1/services/web/backends/10.0.0.1:80/explode",
                StatusCode::BAD_REQUEST,
                "unknown action \"explode\"",
            ),
            (
                "POST",
                "/v1/services/other/backends/10.0.0.1:80/drain",
                StatusCode::NOT_FOUND,
                "no service \"other\"",
            ),
            (
                "POST",
                "/v1/host/explode",
                StatusCode::BAD_REQUEST,
                "unknown action \"explode\": expected drain or undrain",
            ),
            (
                "GET",
                "/v1/host/drain",
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed",
            ),
        ];
        for (method, uri, want, text) in cases {
            let (status, _, body) = call(
                &fake,
                None,
                true,
                req(method, uri).body(Body::empty()).unwrap(),
            )
            .await;
            assert_eq!(status, want, "{method} {uri}: {body}");
            let e = error_of(&body);
            assert!(e.error.contains(text), "{method} {uri}: {body}");
        }
        // A rejected reload: 400 with each problem.
        let (status, _, body) = call(
            &fake,
            None,
            true,
            req("POST", "/v1/reload").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error_of(&body).problems.len(), 2, "{body}");
    }

    #[tokio::test]
    async fn admin_endpoints_need_loopback_or_the_token() {
        let fake = fake();
        let drain = || req("POST", "/v1/services/web/backends/10.0.0.1:80/drain");
        // No token configured: open on loopback only.
        let (status, _, body) = call(&fake, None, true, drain().body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let reply: AdminReply = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (reply.admin, reply.state),
            (Admin::Drained, HealthState::Healthy)
        );
        let (status, headers, body) =
            call(&fake, None, false, drain().body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
        assert!(error_of(&body).error.contains("loopback"), "{body}");
        // A token configured: needed everywhere, loopback too, and compared whole.
        for (given, want) in [
            (None, StatusCode::UNAUTHORIZED),
            (Some("Bearer secret"), StatusCode::OK),
            (Some("Bearer secre"), StatusCode::UNAUTHORIZED),
            (Some("Bearer secrets"), StatusCode::UNAUTHORIZED),
            (Some("secret"), StatusCode::UNAUTHORIZED),
        ] {
            for loopback in [true, false] {
                let mut r = drain();
                if let Some(g) = given {
                    r = r.header(header::AUTHORIZATION, g);
                }
                let (status, _, body) = call(
                    &fake,
                    Some("secret"),
                    loopback,
                    r.body(Body::empty()).unwrap(),
                )
                .await;
                assert_eq!(status, want, "{given:?} loopback {loopback}: {body}");
            }
        }
        // Draining the host is an admin action too.
        for (token, want) in [
            (None, StatusCode::UNAUTHORIZED),
            (Some("Bearer secret"), StatusCode::OK),
        ] {
            let mut r = req("POST", "/v1/host/drain");
            if let Some(t) = token {
                r = r.header(header::AUTHORIZATION, t);
            }
            let (status, _, body) =
                call(&fake, Some("secret"), false, r.body(Body::empty()).unwrap()).await;
            assert_eq!(status, want, "{body}");
            if want == StatusCode::OK {
                let reply: HostReply = serde_json::from_str(&body).unwrap();
                assert_eq!(reply.state.as_deref(), Some("drained"));
            }
        }
        // Reads never need it.
        let (status, _, _) = call(
            &fake,
            Some("secret"),
            false,
            req("GET", "/metrics").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        // Stop: 202, and the daemon was asked.
        assert!(!fake.stopped.load(Ordering::Relaxed));
        let (status, _, body) = call(
            &fake,
            Some("secret"),
            false,
            req("POST", "/v1/stop")
                .header(header::AUTHORIZATION, "Bearer secret")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED);
        assert_eq!(
            serde_json::from_str::<StopReply>(&body).unwrap(),
            StopReply {
                stopping: true,
                grace_s: Some(5.0)
            }
        );
        assert!(fake.stopped.load(Ordering::Relaxed));
    }

    /// The trace streams one JSON line per record to an authorized client, and says how it
    /// is; opening one is an admin action, reading its state is not.
    #[tokio::test]
    async fn the_trace_is_an_admin_stream() {
        let fake = fake();
        let (status, _, body) = call(
            &fake,
            None,
            false,
            req("POST", "/v1/trace").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let (status, _, body) = call(
            &fake,
            None,
            false,
            req("GET", "/v1/trace").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let state: TraceState = serde_json::from_str(&body).unwrap();
        assert_eq!((state.on, state.sessions), (false, 0));
        for (uri, want) in [
            ("/v1/trace?seconds=0", StatusCode::BAD_REQUEST),
            ("/v1/trace?seconds=601", StatusCode::BAD_REQUEST),
            ("/v1/trace?seconds=x", StatusCode::BAD_REQUEST),
            ("/v1/trace?service=other", StatusCode::NOT_FOUND),
        ] {
            let (status, _, body) = call(
                &fake,
                None,
                true,
                req("POST", uri).body(Body::empty()).unwrap(),
            )
            .await;
            assert_eq!(status, want, "{uri}: {body}");
        }
        // A one-second trace: its first line, then its last, then the end of the stream.
        let (status, headers, body) = call(
            &fake,
            None,
            true,
            req("POST", "/v1/trace?service=web&seconds=1")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/x-ndjson");
        let lines: Vec<TraceLine> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{body}");
        assert!(lines[0].text.starts_with("tracing"), "{body}");
        assert_eq!(lines[1].text, "trace ended: its time is up");
        assert_eq!(fake.trace.status().unwrap().sessions, 0);
    }

    fn body_req(method: &str, uri: &str, headers: &[(&str, &str)], body: &str) -> Request {
        let mut r = req(method, uri);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.body(Body::from(body.to_owned())).unwrap()
    }

    #[tokio::test]
    async fn the_configuration_is_read_and_changed_through_the_api() {
        let fake = fake();
        // JSON, the token never shown; the file's own text with its comments.
        let (status, headers, body) =
            call(&fake, None, true, body_req("GET", "/v1/config", &[], "")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let reply: crate::model::ConfigReply = serde_json::from_str(&body).unwrap();
        assert_eq!(reply.config["lb"]["api_token"], "<redacted>");
        assert_eq!(reply.config["service"][0]["name"], "web");
        assert_eq!(headers[header::ETAG], format!("\"{}\"", reply.version));
        let (_, _, text) = call(
            &fake,
            None,
            true,
            body_req("GET", "/v1/config", &[("accept", "application/toml")], ""),
        )
        .await;
        assert_eq!(
            text,
            CONFIG.replace("\"0123456789abcdef0\"", "\"<redacted>\"")
        );
        let v1 = reply.version;

        // A backend added against the version read; then the same write again is refused.
        let if_match = format!("\"{v1}\"");
        let put = |h: Vec<(&'static str, String)>, uri: &'static str, body: &'static str| {
            let h: Vec<(&str, String)> = h;
            let mut r = req("PUT", uri);
            for (k, v) in h {
                r = r.header(k, v);
            }
            r.body(Body::from(body)).unwrap()
        };
        let (status, headers, body) = call(
            &fake,
            None,
            true,
            put(
                vec![("if-match", if_match.clone())],
                "/v1/services/web/backends/10.0.2.2:80",
                r#"{"weight": 2}"#,
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let reply: crate::model::ChangeReply = serde_json::from_str(&body).unwrap();
        assert!(reply.applied);
        assert_eq!(headers[header::ETAG], format!("\"{}\"", reply.version));
        assert_eq!(reply.diff.services_changed[0].backends_added[0].weight, 2);
        let (status, _, _) = call(
            &fake,
            None,
            true,
            put(
                vec![("if-match", if_match)],
                "/v1/services/web/backends/10.0.2.3:80",
                "",
            ),
        )
        .await;
        assert_eq!(status, StatusCode::PRECONDITION_FAILED);

        // Refusals, each with its status; none changes the file.
        let before = fake.config.lock().unwrap().clone();
        for (request, want) in [
            (
                body_req("PUT", "/v1/services/web", &[], "{not json"),
                StatusCode::BAD_REQUEST,
            ),
            (
                body_req(
                    "PUT",
                    "/v1/services/web",
                    &[("if-none-match", "*")],
                    r#"{"vip": "10.100.0.1:80"}"#,
                ),
                StatusCode::PRECONDITION_FAILED,
            ),
            (
                body_req(
                    "PUT",
                    "/v1/services/x",
                    &[],
                    r#"{"vip": "10.100.0.1:80", "backends": []}"#,
                ),
                StatusCode::BAD_REQUEST,
            ),
            (
                body_req("DELETE", "/v1/services/nope", &[], ""),
                StatusCode::NOT_FOUND,
            ),
            (
                body_req("DELETE", "/v1/services/web/backends/10.0.2.9:80", &[], ""),
                StatusCode::NOT_FOUND,
            ),
            (
                body_req("POST", "/v1/config/changes", &[], r#"{"changes": []}"#),
                StatusCode::BAD_REQUEST,
            ),
            (
                body_req(
                    "POST",
                    "/v1/config/changes",
                    &[],
                    r#"{"changes": [{"op": "delete_backend", "service": "web", "backend": "10.0.2.2:80"},
                                    {"op": "delete_service", "service": "nope"}]}"#,
                ),
                StatusCode::NOT_FOUND,
            ),
            (
                body_req("PUT", "/v1/services/web?dry_run=maybe", &[], "{}"),
                StatusCode::BAD_REQUEST,
            ),
        ] {
            let uri = request.uri().to_string();
            let (status, _, body) = call(&fake, None, true, request).await;
            assert_eq!(status, want, "{uri}: {body}");
        }
        assert_eq!(*fake.config.lock().unwrap(), before);

        // A dry run changes nothing; a batch is applied whole.
        let (status, _, body) = call(
            &fake,
            None,
            true,
            body_req(
                "DELETE",
                "/v1/services/web/backends/10.0.2.2:80?dry_run=true",
                &[],
                "",
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(*fake.config.lock().unwrap(), before);
        let (status, _, body) = call(
            &fake,
            None,
            true,
            body_req(
                "POST",
                "/v1/config/changes",
                &[],
                r#"{"changes": [{"op": "delete_backend", "service": "web", "backend": "10.0.2.2:80"},
                                {"op": "put_service", "service": "dns",
                                 "body": {"vip": "10.100.0.1:53", "protocol": "udp",
                                          "backends": [{"address": "10.0.2.1:53"}]}}]}"#,
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let reply: crate::model::ChangeReply = serde_json::from_str(&body).unwrap();
        assert_eq!(reply.diff.services_added, ["dns"]);

        // Beyond loopback, without the token: 401 for reading and writing alike.
        for request in [
            body_req("GET", "/v1/config", &[], ""),
            body_req("DELETE", "/v1/services/web", &[], ""),
        ] {
            let (status, _, _) = call(&fake, Some("0123456789abcdef0"), false, request).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
        }
    }
}
