//! `tcp-connect`: a full TCP handshake (for hosts where raw sockets are not allowed), optionally
//! sending `send` and expecting the reply to start with `expect`.

use std::{net::SocketAddrV4, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::Instant,
};

use super::ProbeResult;

/// Longest `expect` compared, so a misconfigured check cannot make a probe read without bound.
pub const MAX_EXPECT: usize = 4096;

pub async fn probe(
    target: SocketAddrV4,
    send: Option<&[u8]>,
    expect: Option<&[u8]>,
    timeout: Duration,
) -> ProbeResult {
    let start = Instant::now();
    match tokio::time::timeout(timeout, exchange(target, send, expect)).await {
        Err(_) => ProbeResult::Timeout,
        Ok(Err(Failure::Connect)) => ProbeResult::TcpFailure,
        Ok(Err(Failure::Payload)) => ProbeResult::HttpFailure,
        Ok(Ok(())) => ProbeResult::Success {
            latency: start.elapsed(),
        },
    }
}

enum Failure {
    /// Refused, reset or unreachable: the transport failed.
    Connect,
    /// Connected, but the answer was not the expected one.
    Payload,
}

async fn exchange(
    target: SocketAddrV4,
    send: Option<&[u8]>,
    expect: Option<&[u8]>,
) -> Result<(), Failure> {
    let mut stream = TcpStream::connect(target)
        .await
        .map_err(|_| Failure::Connect)?;
    if let Some(send) = send {
        stream.write_all(send).await.map_err(|_| Failure::Connect)?;
    }
    let Some(expect) = expect.map(|e| &e[..e.len().min(MAX_EXPECT)]) else {
        return Ok(());
    };
    let mut got = vec![0u8; expect.len()];
    let mut filled = 0;
    while filled < got.len() {
        match stream.read(&mut got[filled..]).await {
            Ok(0) | Err(_) => return Err(Failure::Payload),
            Ok(n) => filled += n,
        }
        if got[..filled] != expect[..filled] {
            return Err(Failure::Payload);
        }
    }
    Ok(())
}
