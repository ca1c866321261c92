//! The control API's connections, bounded: nothing a client does may take descriptors or memory
//! the health checks need.
//!
//! - At most [`MAX_API_CONNECTIONS`] at once. A new connection beyond that closes the oldest idle
//!   one (open, but no request in progress, as nginx reuses idle keep-alive connections), so a
//!   crowd of idle connections cannot lock an operator out; with none idle, the new one is
//!   closed at once. Either way it is counted.
//! - A connection must send a request's whole head within [`HEADER_TIMEOUT`] of connecting or of
//!   its previous answer: idle keep-alive and slow-header (slowloris) connections are closed.
//! - An accept that fails for lack of descriptors or buffers is counted, logged and evented, and
//!   the loop waits a little instead of spinning on the connection still queued.
//! - A handler that panics answers 500 and is logged; the connection and the daemon go on.
//! - On shutdown, requests in progress get [`SHUTDOWN_GRACE`] to finish.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, body::Body, extract::Request, middleware::Next, response::Response};
use futures_util::FutureExt as _;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch, task::JoinSet};

use super::Control;
use crate::resources::{MAX_API_CONNECTIONS, Resources, is_local_shortage};

/// Longest wait for a request's head: from the connection's start or its previous answer.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long requests in progress may take to finish when the daemon stops.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Pause after an accept that failed for lack of resources.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The open connections, oldest first: whether each is in a request, and the handle that closes
/// it (dropping the sender ends its task's wait).
#[derive(Default)]
pub(crate) struct Conns {
    next: u64,
    open: Vec<Open>,
}

struct Open {
    id: u64,
    /// Requests in progress (a response counts until its body is sent).
    busy: usize,
    _close: tokio::sync::oneshot::Sender<()>,
}

/// What admitting a connection did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Under the cap.
    Room(u64),
    /// At the cap: the oldest idle connection (this id) was closed for the new one.
    Evicted { id: u64, closed: u64 },
    /// At the cap and none idle: the new connection is refused.
    Full,
}

impl Conns {
    pub(crate) fn admit(
        &mut self,
        max: usize,
        close: tokio::sync::oneshot::Sender<()>,
    ) -> Admitted {
        let mut closed = None;
        if self.open.len() >= max {
            match self.open.iter().position(|c| c.busy == 0) {
                Some(i) => closed = Some(self.open.remove(i).id),
                None => return Admitted::Full,
            }
        }
        let id = self.next;
        self.next += 1;
        self.open.push(Open {
            id,
            busy: 0,
            _close: close,
        });
        match closed {
            Some(closed) => Admitted::Evicted { id, closed },
            None => Admitted::Room(id),
        }
    }

    fn set_busy(&mut self, id: u64, delta: isize) {
        if let Some(c) = self.open.iter_mut().find(|c| c.id == id) {
            c.busy = c.busy.saturating_add_signed(delta);
        }
    }

    fn remove(&mut self, id: u64) {
        self.open.retain(|c| c.id != id);
    }

    fn len(&self) -> usize {
        self.open.len()
    }
}

/// Marks a connection's request in progress until dropped (with the response body).
struct Busy {
    conns: Arc<Mutex<Conns>>,
    id: u64,
}

impl Busy {
    fn new(conns: &Arc<Mutex<Conns>>, id: u64) -> Self {
        crate::lock(conns).set_busy(id, 1);
        Self {
            conns: conns.clone(),
            id,
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        crate::lock(&self.conns).set_busy(self.id, -1);
    }
}

/// Serves `app` on `listener` until `shutdown` turns true.
pub async fn run(
    listener: TcpListener,
    app: Router,
    control: Arc<dyn Control>,
    mut shutdown: watch::Receiver<bool>,
) {
    let conns = Arc::new(Mutex::new(Conns::default()));
    let resources: &Resources = control.resources();
    let mut tasks = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
            // Reap finished connection tasks as they end.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if is_local_shortage(&e) => {
                Resources::count(&resources.accept_errors);
                control.local_shortage(
                    "control API",
                    &format!("accept: {}", crate::resources::os_error_text(&e)),
                );
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "control API accept");
                continue;
            }
        };
        let (close, closed) = tokio::sync::oneshot::channel();
        let admitted = crate::lock(&conns).admit(MAX_API_CONNECTIONS, close);
        let id = match admitted {
            Admitted::Room(id) => id,
            Admitted::Evicted { id, .. } => {
                Resources::count(&resources.api_evicted);
                if resources.should_report("control API connections", Instant::now()) {
                    tracing::warn!(
                        max = MAX_API_CONNECTIONS,
                        "control API at its connection cap: closing the oldest idle connection for each new one"
                    );
                }
                id
            }
            Admitted::Full => {
                Resources::count(&resources.api_refused);
                if resources.should_report("control API connections", Instant::now()) {
                    tracing::warn!(
                        max = MAX_API_CONNECTIONS,
                        "control API at its connection cap with every connection busy: refusing new ones"
                    );
                }
                drop(stream);
                continue;
            }
        };
        set_open(resources, &conns);
        let (app, conns, mut shutdown) = (app.clone(), conns.clone(), shutdown.clone());
        let control = control.clone();
        tasks.spawn(async move {
            serve_one(stream, app, &conns, id, closed, &mut shutdown).await;
            crate::lock(&conns).remove(id);
            set_open(control.resources(), &conns);
        });
    }
    // Requests in progress finish (each connection task shuts down gracefully); past the grace
    // period the rest are cut, so every handle on the daemon's state is gone when this returns.
    if tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tasks.shutdown().await;
    }
}

fn set_open(resources: &Resources, conns: &Mutex<Conns>) {
    let n = crate::lock(conns).len() as u64;
    resources
        .api_connections
        .store(n, std::sync::atomic::Ordering::Relaxed);
}

async fn serve_one(
    stream: tokio::net::TcpStream,
    app: Router,
    conns: &Arc<Mutex<Conns>>,
    id: u64,
    closed: tokio::sync::oneshot::Receiver<()>,
    shutdown: &mut watch::Receiver<bool>,
) {
    let service = {
        let conns = conns.clone();
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let busy = Busy::new(&conns, id);
            let response = tower_call(app.clone(), request.map(Body::new));
            async move {
                let response = response.await;
                // The request lasts until its body is sent (the event stream: until it ends).
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _ = &busy;
                        frame
                    }))
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let stopping = tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "control API connection");
            }
            false
        }
        // Evicted while idle: dropping the connection closes it.
        _ = closed => false,
        _ = shutdown.wait_for(|s| *s) => true,
    };
    if stopping {
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
    }
}

/// One request through the router (it is always ready).
async fn tower_call(app: Router, request: Request) -> Response {
    use tower_service::Service as _;
    let mut app = app;
    match app.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// Middleware: a handler that panics answers 500; the panic is logged, nothing else ends.
pub(crate) async fn catch_panic(request: Request, next: Next) -> Response {
    let what = format!("{} {}", request.method(), request.uri().path());
    match std::panic::AssertUnwindSafe(next.run(request))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(_) => {
            tracing::error!(request = %what, "a control API request panicked (a bug); answered 500, the daemon goes on");
            super::error(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal error (logged)",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender() -> tokio::sync::oneshot::Sender<()> {
        tokio::sync::oneshot::channel().0
    }

    #[test]
    fn the_oldest_idle_connection_makes_room() {
        let mut c = Conns::default();
        assert_eq!(c.admit(2, sender()), Admitted::Room(0));
        assert_eq!(c.admit(2, sender()), Admitted::Room(1));
        c.set_busy(0, 1);
        // 0 is in a request: 1 goes.
        assert_eq!(c.admit(2, sender()), Admitted::Evicted { id: 2, closed: 1 });
        c.set_busy(2, 1);
        assert_eq!(c.admit(2, sender()), Admitted::Full);
        c.set_busy(0, -1);
        assert_eq!(c.admit(2, sender()), Admitted::Evicted { id: 3, closed: 0 });
        c.remove(2);
        assert_eq!(c.len(), 1);
        assert_eq!(c.admit(2, sender()), Admitted::Room(4));
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_leaves_its_lock_usable() {
        use axum::routing::get;
        let state = Arc::new(Mutex::new(0u32));
        let (a, b) = (state.clone(), state.clone());
        let app = Router::new()
            .route(
                "/boom",
                get(move || {
                    let a = a.clone();
                    async move {
                        if let Ok(_held) = a.lock() {
                            panic!("a bug while holding the lock");
                        }
                        "not reached"
                    }
                }),
            )
            .route(
                "/ok",
                get(move || async move { crate::lock(&b).to_string() }),
            )
            .layer(axum::middleware::from_fn(catch_panic));
        let call = |path: &str| {
            tower_call(
                app.clone(),
                Request::builder().uri(path).body(Body::empty()).unwrap(),
            )
        };
        assert_eq!(call("/boom").await.status(), 500);
        assert!(state.is_poisoned());
        assert_eq!(call("/ok").await.status(), 200);
    }

    #[tokio::test]
    async fn closing_an_admitted_connection_wakes_its_task() {
        let mut c = Conns::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert_eq!(c.admit(1, tx), Admitted::Room(0));
        assert_eq!(c.admit(1, sender()), Admitted::Evicted { id: 1, closed: 0 });
        // The evicted connection's sender was dropped.
        assert!(rx.await.is_err());
    }
}
