//! `tcp-connect`: a full TCP handshake (for hosts where raw sockets are not allowed), optionally
//! sending `send` and expecting the reply to start with `expect`. IPv4 or IPv6: the socket is of
//! the target's family.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    time::Instant,
};

use super::{ProbeResult, Via};
use crate::{
    config::Expect,
    health::outcome::{Reason, from_io},
};

/// Most of a reply read (offset and expected bytes), so a probe cannot read without bound.
pub const MAX_EXPECT: usize = 8192;

pub async fn probe(
    target: SocketAddr,
    send: Option<&[u8]>,
    expect: Option<&Expect>,
    timeout: Duration,
) -> ProbeResult {
    probe_via(target, None, send, expect, timeout).await
}

/// [`probe`], through the tunnel when `via` says so (see [`super::tunnel`]).
pub async fn probe_via(
    target: SocketAddr,
    via: Option<Via>,
    send: Option<&[u8]>,
    expect: Option<&Expect>,
    timeout: Duration,
) -> ProbeResult {
    let start = Instant::now();
    match tokio::time::timeout(timeout, exchange(target, via, send, expect)).await {
        Err(_) => ProbeResult::Timeout,
        Ok(Err(result)) => result,
        Ok(Ok(())) => ProbeResult::Success {
            latency: start.elapsed(),
        },
    }
}

/// The exchange; a failure is the probe's result (the socket's error, or a reply that is not
/// the expected one).
async fn exchange(
    target: SocketAddr,
    via: Option<Via>,
    send: Option<&[u8]>,
    expect: Option<&Expect>,
) -> Result<(), ProbeResult> {
    let mut stream = super::tunnel::connect(target, via)
        .await
        .map_err(|e| from_io(&e))?;
    if let Some(send) = send {
        stream.write_all(send).await.map_err(|e| from_io(&e))?;
    }
    let Some(expect) = expect else {
        return Ok(());
    };
    // The reply up to the last byte compared (bounded: the config caps offset and length).
    let mut got = vec![0u8; expect.needed().min(MAX_EXPECT)];
    let mut filled = 0;
    while filled < got.len() {
        match stream.read(&mut got[filled..]).await {
            Ok(0) => return Err(ProbeResult::PayloadFailure(Reason::Closed)),
            // A reset or an error after the connection worked: the answer was not the one.
            Err(_) => return Err(ProbeResult::PayloadFailure(Reason::Mismatch)),
            Ok(n) => filled += n,
        }
        if !expect.may_match(&got[..filled]) {
            return Err(ProbeResult::PayloadFailure(Reason::Mismatch));
        }
    }
    Ok(())
}
