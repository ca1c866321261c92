//! The CLI's client of the control API: one HTTP/1.1 request per connection over hyper (already
//! linked for the API's server), so framing, chunking and headers are a maintained parser's job.
//! Bodies are read as bytes and decoded as UTF-8 only once complete (a body, or a line of the
//! event stream), so a chunk boundary inside a multi-byte character is harmless.

use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, anyhow};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, body::Incoming, client::conn::http1};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The daemon could not be reached at all (as opposed to answering with an error).
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot reach the lb control API at {addr}: {error} (is `lb run` running, and is --api right?)"
)]
pub struct Unreachable {
    pub addr: SocketAddr,
    /// Shown in the message, not chained as a source: `{:#}` would print it twice.
    pub error: std::io::Error,
}

/// The CLI's User-Agent: the daemon's events say "cli" for changes it makes.
pub const USER_AGENT: &str = concat!("lb-cli/", env!("CARGO_PKG_VERSION"));

/// Longest wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for a whole (non-streaming) answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest body or stream line accepted: the status of thousands of backends fits many times.
const MAX_BODY: usize = 256 << 20;

/// GETs `path` and returns (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    request(addr, "GET", path, None).await
}

/// Sends `method path` (no body) and returns (status, body).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    request_within(addr, method, path, token, ANSWER_TIMEOUT).await
}

/// What a request carries besides its method and path: headers and a JSON body.
#[derive(Debug, Default, Clone)]
pub struct Extra {
    pub headers: Vec<(&'static str, String)>,
    /// Sent as `application/json`.
    pub json: Option<Vec<u8>>,
}

/// Sends `method path` with `extra` and returns (status, body).
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &Extra,
) -> anyhow::Result<(u16, String)> {
    let limit = ANSWER_TIMEOUT;
    tokio::time::timeout(limit, async {
        read_all(send_with(addr, method, path, token, extra).await?).await
    })
    .await
    .map_err(|_| no_answer(limit))?
}

/// [`request`] with the answer, head and body, due within `limit`: a daemon that accepted the
/// connection but cannot answer (stuck, or out of descriptors with the connection still in
/// the kernel's queue) must not hang the CLI.
async fn request_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    limit: Duration,
) -> anyhow::Result<(u16, String)> {
    tokio::time::timeout(limit, async {
        read_all(send(addr, method, path, token).await?).await
    })
    .await
    .map_err(|_| no_answer(limit))?
}

fn no_answer(limit: Duration) -> anyhow::Error {
    anyhow!("control API did not answer in {:?}", limit)
}

/// GETs a streaming `path` and calls `line` with each line of the body as it arrives, until
/// the daemon ends the stream. A non-200 answer is returned as (status, body) instead.
pub async fn stream_lines(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    line: impl FnMut(&str) -> anyhow::Result<()>,
) -> anyhow::Result<Option<(u16, String)>> {
    stream_lines_within(addr, "GET", path, token, line, ANSWER_TIMEOUT).await
}

/// [`stream_lines`] of a POST (a stream that changes something while it lasts: the trace).
pub async fn post_stream_lines(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    line: impl FnMut(&str) -> anyhow::Result<()>,
) -> anyhow::Result<Option<(u16, String)>> {
    stream_lines_within(addr, "POST", path, token, line, ANSWER_TIMEOUT).await
}

/// [`stream_lines`] with the answer's head (or a whole error answer) due within `limit`; the
/// stream itself may then stay quiet as long as the daemon has nothing to tell.
async fn stream_lines_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    mut line: impl FnMut(&str) -> anyhow::Result<()>,
    limit: Duration,
) -> anyhow::Result<Option<(u16, String)>> {
    let mut response = tokio::time::timeout(limit, send(addr, method, path, token))
        .await
        .map_err(|_| no_answer(limit))??;
    if response.status() != 200 {
        return tokio::time::timeout(limit, read_all(response))
            .await
            .map_err(|_| no_answer(limit))?
            .map(Some);
    }
    let mut lines = Lines::default();
    while let Some(frame) = response.body_mut().frame().await {
        let frame = frame.context("reading the event stream")?;
        if let Some(data) = frame.data_ref() {
            lines.push(data, &mut line)?;
        }
    }
    Ok(None)
}

/// Splits a byte stream into lines, decoding each whole line.
#[derive(Default)]
struct Lines {
    pending: Vec<u8>,
}

impl Lines {
    fn push(
        &mut self,
        data: &[u8],
        line: &mut impl FnMut(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(n) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let text = std::str::from_utf8(&self.pending[start..start + n])
                .context("the event stream is not UTF-8")?;
            line(text)?;
            start += n + 1;
        }
        self.pending.drain(..start);
        if self.pending.len() > MAX_BODY {
            anyhow::bail!("a line of the event stream is longer than {MAX_BODY} bytes");
        }
        Ok(())
    }
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<hyper::Response<Incoming>> {
    send_with(addr, method, path, token, &Extra::default()).await
}

async fn send_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &Extra,
) -> anyhow::Result<hyper::Response<Incoming>> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| Unreachable {
            addr,
            error: std::io::ErrorKind::TimedOut.into(),
        })?
        .map_err(|error| Unreachable { addr, error })?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .context("control API handshake")?;
    // Drives the connection; it ends with the response (Connection: close) or on error.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "control API connection");
        }
    });
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONNECTION, "close");
    let given = |name: &str| {
        extra
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    if !given("accept") {
        request = request.header(hyper::header::ACCEPT, "application/json");
    }
    if !given("user-agent") {
        // The daemon names the CLI as who made a change.
        request = request.header(hyper::header::USER_AGENT, USER_AGENT);
    }
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    for (name, value) in &extra.headers {
        request = request.header(*name, value);
    }
    let body = match &extra.json {
        Some(json) => {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
            Bytes::from(json.clone())
        }
        None => Bytes::new(),
    };
    let request = request
        .body(Full::new(body))
        .context("building the request")?;
    sender
        .send_request(request)
        .await
        .context("control API request")
}

async fn read_all(response: hyper::Response<Incoming>) -> anyhow::Result<(u16, String)> {
    let status = response.status().as_u16();
    let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| anyhow!("reading the control API's answer: {e}"))?
        .to_bytes();
    let body = String::from_utf8(body.to_vec()).context("the answer is not UTF-8")?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A server that answers one request with `raw` (bytes as written, chunk framing included).
    async fn serve_once(raw: Vec<Vec<u8>>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            for part in raw {
                conn.write_all(&part).await.unwrap();
                conn.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_chunk_boundary_inside_a_character_is_harmless() {
        // "é" is C3 A9: the first chunk ends after C3.
        let raw = vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            b"3\r\n{\"\xc3\r\n".to_vec(),
            b"3;ext=1\r\n\xa9\"}\r\n0\r\n\r\n".to_vec(),
        ];
        let addr = serve_once(raw).await;
        let (status, body) = request(addr, "GET", "/", None).await.unwrap();
        assert_eq!((status, body.as_str()), (200, "{\"é\"}"));
    }

    #[tokio::test]
    async fn stream_lines_span_chunks_and_characters() {
        let raw = vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            b"3\r\nab\xc3\r\n".to_vec(),
            b"4\r\n\xa9\ncd\r\n".to_vec(),
            b"1\r\n\n\r\n0\r\n\r\n".to_vec(),
        ];
        let addr = serve_once(raw).await;
        let mut got = Vec::new();
        let ended = stream_lines(addr, "/", None, |l| {
            got.push(l.to_owned());
            Ok(())
        })
        .await
        .unwrap();
        assert!(ended.is_none());
        assert_eq!(got, ["abé", "cd"]);
    }

    #[tokio::test]
    async fn errors_and_plain_bodies() {
        let addr = serve_once(vec![
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 15\r\n\r\n{\"error\":\"no\"}\n".to_vec(),
        ])
        .await;
        let (status, body) = request(addr, "GET", "/x", None).await.unwrap();
        assert_eq!((status, body.as_str()), (404, "{\"error\":\"no\"}\n"));
        let addr = serve_once(vec![b"garbage\r\n\r\n".to_vec()]).await;
        assert!(request(addr, "GET", "/", None).await.is_err());
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = request(closed, "GET", "/", None).await.unwrap_err();
        assert!(e.is::<Unreachable>(), "{e:#}");
    }

    /// A daemon that takes the connection (here: the kernel's queue, never accepted) but never
    /// answers: every call gives up with a clear error instead of waiting for ever.
    #[tokio::test]
    async fn a_daemon_that_never_answers_is_given_up_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let limit = Duration::from_millis(300);
        let e = request_within(addr, "GET", "/v1/status", None, limit)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("did not answer"), "{e:#}");
        let e = stream_lines_within(addr, "GET", "/v1/events/stream", None, |_| Ok(()), limit)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("did not answer"), "{e:#}");
        drop(listener);
    }
}
