//! The control API's connections, bounded: nothing a client does may take descriptors or memory
//! the health checks need.
//!
//! - At most [`MAX_API_CONNECTIONS`] at once. A new connection beyond that closes the oldest idle
//!   one (open, but no request in progress, as nginx reuses idle keep-alive connections), so a
//!   crowd of idle connections cannot lock an operator out; with none idle, the new one is
//!   closed at once. Either way it is counted.
//! - A connection must send a request's whole head within [`HEADER_TIMEOUT`] of connecting or of
//!   its previous answer: idle keep-alive and slow-header (slowloris) connections are closed.
//! - A connection whose client takes none of its answer for [`SEND_TIMEOUT`] is closed: one that
//!   stops reading would otherwise hold the answer (31 MB of metrics at 20,000 backends) and
//!   its place among the connections (busy, so never evicted) for ever.
//! - An accept that fails for lack of descriptors or buffers is counted, logged and evented, and
//!   the loop waits a little instead of spinning on the connection still queued.
//! - A handler that panics answers 500 and is logged; the connection and the daemon go on.
//! - On shutdown, requests in progress get [`SHUTDOWN_GRACE`] to finish.

use std::{
    convert::Infallible,
    future::Future as _,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{Router, body::Body, extract::Request, middleware::Next, response::Response};
use futures_util::FutureExt as _;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::watch,
    task::JoinSet,
};

use super::Control;
use crate::resources::{MAX_API_CONNECTIONS, Resources, is_local_shortage};

/// Longest wait for a request's head: from the connection's start or its previous answer.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the client to take more of an answer (as nginx's `send_timeout`: between
/// two writes, not for the whole answer; an event stream waiting for events writes nothing).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
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
    let stream = SendTimeout::new(stream, SEND_TIMEOUT);
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

/// A stream whose writes fail when none makes progress for `limit`: the client stopped
/// reading.
struct SendTimeout<S> {
    inner: S,
    limit: Duration,
    /// Armed by a write that could not go on; disarmed by one that did.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> SendTimeout<S> {
    fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// `poll`, a write's outcome, unless the writes have waited `limit` since the first that
    /// could not go on (the timer wakes the connection's task then).
    fn guard<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took none of the answer for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.guard(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.guard(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
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

    /// A connected pair on loopback: the server's end wrapped with `limit`, the client's end.
    async fn pair(limit: Duration) -> (SendTimeout<tokio::net::TcpStream>, tokio::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        (
            SendTimeout::new(accepted.unwrap().0, limit),
            client.unwrap(),
        )
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_given_up_after_the_limit() {
        use tokio::io::AsyncWriteExt as _;
        let limit = Duration::from_millis(300);
        let (mut server, _client) = pair(limit).await;
        let chunk = vec![0u8; 64 * 1024];
        let started = Instant::now();
        let mut sent = 0usize;
        let error = loop {
            match server.write_all(&chunk).await {
                Ok(()) => sent += chunk.len(),
                Err(e) => break e,
            }
            // The client's buffers take a few MB at most.
            assert!(
                sent < 256 << 20,
                "{sent} bytes taken by a client that reads none"
            );
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        let took = started.elapsed();
        assert!(took >= limit, "given up after {took:?}");
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_is_not_cut() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        // Slower than the socket's buffers can hide (32 MB through a reader of at most 64 KB
        // per 5 ms: 2.5 s or more), each pause well under the limit, which the whole transfer
        // outlasts: only a limit counted from the last progress lets it through.
        let limit = Duration::from_millis(500);
        let (mut server, mut client) = pair(limit).await;
        let total = 32 << 20;
        let started = Instant::now();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = 0;
            loop {
                match client.read(&mut buf).await.unwrap() {
                    0 => return got,
                    n => got += n,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        server.write_all(&vec![7u8; total]).await.unwrap();
        server.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap(), total);
        assert!(started.elapsed() > limit, "took {:?}", started.elapsed());
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
