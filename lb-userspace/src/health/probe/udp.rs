//! UDP probes (SPEC §2 `udp`), from a connected UDP socket (a fresh one per probe, of the
//! target's family: IPv4 or IPv6).
//!
//! **With a payload** (`send`): the datagram goes to `ip:port`; a reply starting with `expect`
//! (any reply when there is no `expect`) within the timeout is a success, a reply that does not
//! is an `HttpFailure`, an ICMP port (or host) unreachable — reported by the connected socket as
//! `ECONNREFUSED` (`EHOSTUNREACH`, …) — is a `TcpFailure`, silence is a `Timeout`. For an IPv6
//! target the error is an ICMPv6 destination unreachable (port unreachable: type 1 code 4),
//! which the kernel reports to a connected socket the same way.
//!
//! **Without a payload**: an ICMP echo request (ICMPv6 for an IPv6 target) to the host, through
//! the shared [`IcmpProber`], and an empty datagram to `ip:port`, both waited for until the
//! timeout. An ICMP unreachable for the datagram is a `TcpFailure`; no echo reply is a failure
//! (`Timeout`, or `TcpFailure` if the host is reported unreachable); otherwise the probe
//! succeeds, with the echo's round trip as its latency. Since only the absence of an error says
//! the port is open, such a probe takes the whole timeout (unless the service answers the empty
//! datagram, which ends the wait at once).
//!
//! **Limitation:** Linux rate-limits the ICMP errors it sends (`net.ipv4.icmp_ratelimit` and
//! `icmp_msgs_per_sec`: a burst of about 6 per peer, then one per second; 20 rapid probes of a
//! closed port here got 9 refusals and 11 silences; ICMPv6 errors likewise, under
//! `net.ipv6.icmp.ratelimit`: 10 refusals and 10 silences of 20 here). A backend probed often, or by many checkers at once, may not
//! answer some datagrams to a closed port at all, and such a probe succeeds: without a payload,
//! success means "the host answers pings and did not refuse this datagram", not proof that
//! anything listens. Consecutive-failure thresholds still catch a closed port (most probes of it
//! fail), but configure `send`/`expect` wherever the service can answer.

use std::{io, net::SocketAddr, time::Duration};

use tokio::{net::UdpSocket, time::Instant};

use super::{ProbeResult, icmp::IcmpProber};
use crate::{
    config::Expect,
    health::outcome::{Reason, from_io},
};

/// Most of a reply kept (offset and expected bytes), so a probe cannot allocate without bound.
pub const MAX_EXPECT: usize = 8192;

/// Probes `target` (see the module documentation for the verdicts).
pub async fn probe(
    icmp: &IcmpProber,
    target: SocketAddr,
    send: Option<&[u8]>,
    expect: Option<&Expect>,
    timeout: Duration,
) -> ProbeResult {
    match send {
        Some(payload) => exchange(target, payload, expect, timeout).await,
        None => unanswered(icmp, target, timeout).await,
    }
}

/// A datagram with `payload`, and the first reply.
pub async fn exchange(
    target: SocketAddr,
    payload: &[u8],
    expect: Option<&Expect>,
    timeout: Duration,
) -> ProbeResult {
    let start = Instant::now();
    let result = tokio::time::timeout(timeout, async {
        let socket = connected(target).await?;
        socket.send(payload).await?;
        // A datagram arrives whole: the bytes up to the last one compared are all it needs.
        let mut buf = vec![0u8; expect.map_or(1, |e| e.needed().clamp(1, MAX_EXPECT))];
        let n = socket.recv(&mut buf).await?;
        io::Result::Ok(expect.is_none_or(|e| e.matches(&buf[..n])))
    })
    .await;
    match result {
        Err(_elapsed) => ProbeResult::Timeout,
        Ok(Err(e)) => failed(target, &e),
        Ok(Ok(false)) => ProbeResult::PayloadFailure(Reason::Mismatch),
        Ok(Ok(true)) => ProbeResult::Success {
            latency: start.elapsed(),
        },
    }
}

/// An ICMP echo to the host and an empty datagram to the port, both until the timeout.
async fn unanswered(icmp: &IcmpProber, target: SocketAddr, timeout: Duration) -> ProbeResult {
    let datagram = async {
        let socket = connected(target).await?;
        socket.send(&[]).await?;
        let mut buf = [0u8; 1];
        // An ICMP error for the datagram fails the recv; a reply ends the wait early; silence
        // until the timeout is success for this half.
        match tokio::time::timeout(timeout, socket.recv(&mut buf)).await {
            Ok(Err(e)) => Err(e),
            Ok(Ok(_)) | Err(_) => Ok(()),
        }
    };
    let (echo, datagram) = tokio::join!(icmp.probe(target.ip(), timeout), datagram);
    match datagram {
        Err(e) => failed(target, &e),
        Ok(()) => echo,
    }
}

/// A UDP socket connected to `target`, so that ICMP errors about its datagrams are reported to
/// it.
async fn connected(target: SocketAddr) -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind(super::wildcard(target.ip())).await?;
    socket.connect(target).await?;
    Ok(socket)
}

/// Refused (ICMP port unreachable) or unreachable from the network or locally (no route): a
/// transport failure; a local shortage (no socket, no buffer) is the host's, not the target's.
fn failed(target: SocketAddr, e: &io::Error) -> ProbeResult {
    if e.kind() != io::ErrorKind::ConnectionRefused {
        tracing::debug!(%target, "udp probe: {e}");
    }
    match from_io(e) {
        // A connected UDP socket reports an ICMP port unreachable (ICMPv6 type 1 code 4 for an
        // IPv6 one) as ECONNREFUSED.
        ProbeResult::TcpFailure(Reason::Refused) => ProbeResult::TcpFailure(match target {
            SocketAddr::V4(_) => Reason::Unreachable(ICMP_PORT_UNREACHABLE),
            SocketAddr::V6(_) => Reason::Unreachable6(ICMPV6_PORT_UNREACHABLE),
        }),
        other => other,
    }
}

const ICMP_PORT_UNREACHABLE: u8 = 3;
const ICMPV6_PORT_UNREACHABLE: u8 = 4;
