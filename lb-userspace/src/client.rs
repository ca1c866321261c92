//! A minimal HTTP/1.1 client for the control API (JSON bodies, and the line-by-line event
//! stream): the CLI needs nothing more, and it keeps TLS and connection pools out of the binary.

use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

/// The daemon could not be reached at all (as opposed to answering with an error).
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot reach the lb control API at {addr}: {source} (is `lb run` running, and is --api right?)"
)]
pub struct Unreachable {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// GETs `path` and returns (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    request(addr, "GET", path, None).await
}

async fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    Ok(
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| Unreachable {
                addr,
                source: std::io::ErrorKind::TimedOut.into(),
            })?
            .map_err(|source| Unreachable { addr, source })?,
    )
}

fn head(method: &str, path: &str, addr: SocketAddr, token: Option<&str>) -> String {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
}

/// Sends `method path` (no body) and returns (status, body).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut stream = connect(addr).await?;
    stream
        .write_all(head(method, path, addr, token).as_bytes())
        .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .context("control API did not answer in 30 s")??;
    parse_response(&raw)
}

/// GETs a streaming `path` and calls `line` with each line of the body as it arrives, until
/// the daemon ends the stream. A non-200 answer is returned as (status, body) instead.
pub async fn stream_lines(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    mut line: impl FnMut(&str) -> anyhow::Result<()>,
) -> anyhow::Result<Option<(u16, String)>> {
    use tokio::io::AsyncBufReadExt as _;
    let mut stream = tokio::io::BufReader::new(connect(addr).await?);
    stream
        .get_mut()
        .write_all(head("GET", path, addr, token).as_bytes())
        .await?;
    let mut headers = String::new();
    loop {
        let mut l = String::new();
        if stream.read_line(&mut l).await? == 0 || l == "\r\n" {
            break;
        }
        headers.push_str(&l);
    }
    let status: u16 = headers
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("malformed HTTP status line"))?;
    let mut rest = Vec::new();
    if status != 200 {
        stream.read_to_end(&mut rest).await?;
        let raw = [headers.as_bytes(), b"\r\n", &rest].concat();
        return parse_response(&raw).map(Some);
    }
    // Chunked: a size line, then that many bytes; lines of the body may span chunks.
    let mut pending = String::new();
    loop {
        let mut size = String::new();
        if stream.read_line(&mut size).await? == 0 {
            return Ok(None);
        }
        let size = usize::from_str_radix(size.trim(), 16).context("chunk size")?;
        if size == 0 {
            return Ok(None);
        }
        let mut chunk = vec![0u8; size + 2];
        stream.read_exact(&mut chunk).await?;
        pending.push_str(std::str::from_utf8(&chunk[..size]).context("stream is not UTF-8")?);
        while let Some((l, tail)) = pending.split_once('\n') {
            line(l)?;
            pending = tail.to_owned();
        }
    }
}

fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, String)> {
    let text = std::str::from_utf8(raw).context("response is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP response"))?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("malformed HTTP status line"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .ok_or_else(|| anyhow!("malformed chunk"))?;
        let size = usize::from_str_radix(size.trim(), 16).context("chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size {
            bail!("truncated chunk");
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_bodies() {
        let (s, b) = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((s, b.as_str()), (200, "{}"));
        let raw = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let (s, b) = parse_response(raw).unwrap();
        assert_eq!((s, b.as_str()), (404, "abcde"));
        assert!(parse_response(b"garbage").is_err());
    }
}
