//! The sender and reader tasks: the sender sends the queued SYNs in batches, through the
//! link-layer path or the raw socket of their family; the reader reads the replies (IPv4 ones
//! from the ring, IPv6 ones from the IPv6 raw socket) in batches and expires the late probes.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr},
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::{Arc, PoisonError, atomic::Ordering},
    time::{Duration, Instant},
};

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use super::filter::REPLY_BYTES;
use super::pending::{Answer, Ended};
use super::ring::{Frames, ReplyRing};
use super::shared::{Closing, Queued, Shared};
use super::wire::{SYN_LEN, Segment};
use crate::health::probe::link::{Frame, Link};
use crate::health::probe::sys::{
    Addresses6, MAX_BATCH, Outgoing, ipv4_header, recv_many6, send_many,
};

/// Under load, the reader's pause between two reads of the socket. It pauses only when replies
/// come fast (several in one read, or a read less than this long after the previous one), so a
/// lone reply is read at once.
pub const COALESCE: Duration = Duration::from_millis(1);

/// How long the reader waits before looking again at deadlines held back by replies in the
/// ring's open block, should the kernel's handover of the block not wake it first (it comes
/// within about 2.5 ms here, one timer tick on a kernel at HZ=250: see
/// [`super::ring::RETIRE_MS`]).
const HOLD: Duration = Duration::from_millis(5);

/// An IPv4 header without options, as the IPv4 socket is handed it.
const IPV4_HEADER: usize = 20;

/// The sender task: sends the SYNs queued since it last ran together (one `sendmmsg` rather than
/// a `sendmsg` each).
pub(super) async fn send_queued(shared: Arc<Shared>) {
    let mut batch = Vec::new();
    loop {
        // No yield before sending: the checker queues a whole slot's SYNs at once, and a yield
        // here woke the runtime's other worker (to steal this task) every time.
        shared.flush.notified().await;
        loop {
            std::mem::swap(
                &mut batch,
                &mut *shared.outbox.lock().unwrap_or_else(PoisonError::into_inner),
            );
            if batch.is_empty() {
                break;
            }
            send_batch(&shared, &mut batch).await;
        }
    }
}

/// Sends `batch` (emptied), [`MAX_BATCH`] SYNs per `sendmmsg`, skipping the probes that
/// ended meanwhile: on their link-layer path those whose link is still current (after
/// reading the change notifications), the others through the raw socket of their family. A SYN
/// that cannot be sent ends its probe with [`Answer::Unsent`].
async fn send_batch(shared: &Shared, batch: &mut Vec<Queued>) {
    if let Some(links) = &shared.links {
        links.watch();
    }
    let mut answers = Vec::new();
    let mut rest = &batch[..];
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_BATCH));
        rest = after;
        // Stamp the probes still waiting; the others need no SYN.
        let (mut framed, mut plain4, mut plain6) = (Vec::new(), Vec::new(), Vec::new());
        {
            let now = Instant::now();
            let mut state = shared.state();
            for q in chunk {
                // A reset goes out whatever became of its probe; a SYN only while its probe
                // waits.
                if !q.reset {
                    match state.pending.get_mut(&q.key, q.id) {
                        Some(p) => p.sent = Some(now),
                        None => continue,
                    }
                }
                match link_of(shared, q) {
                    Some(link) => framed.push((q, link)),
                    None if q.key.remote.is_ipv4() => plain4.push(q),
                    None => plain6.push(q),
                }
            }
        }
        if let Some(links) = &shared.links
            && !framed.is_empty()
        {
            let frames: Vec<Frame<'_>> = framed
                .iter()
                .map(|&(q, (link, source, destination))| Frame {
                    link,
                    source,
                    destination,
                    protocol: libc::IPPROTO_TCP as u8,
                    payload: &q.segment[..q.len],
                })
                .collect();
            let mut i = 0;
            while i < frames.len() {
                let sent = links.send_many(&frames[i..]);
                if let Ok(n) = sent {
                    shared.sent_link.fetch_add(n as u64, Ordering::Relaxed);
                }
                i += sent_or_unsent(shared, framed[i].0, sent, &mut answers);
            }
        }
        send_plain(shared, Some(&shared.socket), &plain4, &mut answers).await;
        send_plain(shared, shared.socket6.as_ref(), &plain6, &mut answers).await;
    }
    batch.clear();
    shared.deliver(&mut answers);
}

/// Sends `plain` (SYNs of one family) through `socket`, the raw socket of that family; without
/// one (never: an IPv6 probe does not start without the IPv6 socket) they are unsent. The IPv4
/// socket sends whole datagrams (it receives nothing: see [`super::socket::open_raw_socket`]),
/// so each IPv4 segment goes behind an IP header built here; the IPv6 socket builds its own.
async fn send_plain(
    shared: &Shared,
    socket: Option<&AsyncFd<OwnedFd>>,
    plain: &[&Queued],
    answers: &mut Vec<Ended>,
) {
    let datagrams: Vec<([u8; IPV4_HEADER + SYN_LEN], usize)> = plain
        .iter()
        .map(|q| {
            let mut d = [0; IPV4_HEADER + SYN_LEN];
            let segment = &q.segment[..q.len];
            match (q.key.local, q.key.remote) {
                (SocketAddr::V4(local), SocketAddr::V4(remote)) => {
                    let (source, target) = (*local.ip(), *remote.ip());
                    let protocol = libc::IPPROTO_TCP as u8;
                    let header = ipv4_header(source, target, protocol, q.len, shared.ttl);
                    d[..IPV4_HEADER].copy_from_slice(&header);
                    d[IPV4_HEADER..][..q.len].copy_from_slice(segment);
                    (d, IPV4_HEADER + q.len)
                }
                _ => {
                    d[..q.len].copy_from_slice(segment);
                    (d, q.len)
                }
            }
        })
        .collect();
    let mut i = 0;
    while i < plain.len() {
        let Some(socket) = socket else {
            let unsent = Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
            i += sent_or_unsent(shared, plain[i], unsent, answers);
            continue;
        };
        let outgoing: Vec<Outgoing<'_>> = plain[i..]
            .iter()
            .zip(&datagrams[i..])
            .map(|(q, (d, len))| Outgoing {
                source: q.key.local.ip(),
                target: q.key.remote,
                bytes: &d[..*len],
                mark: q.mark,
            })
            .collect();
        let sent = socket
            .async_io(tokio::io::Interest::WRITABLE, |fd| {
                send_many(fd.as_fd(), &outgoing)
            })
            .await;
        if let Ok(n) = sent {
            // SYNs: the resets of probes through the tunnel are not probes.
            let syns = plain[i..].iter().take(n).filter(|q| !q.reset).count();
            shared.sent_kernel.fetch_add(syns as u64, Ordering::Relaxed);
        }
        i += sent_or_unsent(shared, plain[i], sent, answers);
    }
}

/// The link-layer path of a queued SYN, if it has one that is still current, with the SYN's
/// IPv4 source and destination (a link is only ever looked up for an IPv4 target, and never
/// for a marked one: its frames would carry no mark).
fn link_of<'q>(shared: &Shared, q: &'q Queued) -> Option<(&'q Link, Ipv4Addr, Ipv4Addr)> {
    if q.mark != 0 {
        return None;
    }
    let links = shared.links.as_ref()?;
    let link = q.link.as_ref().filter(|link| links.current(link))?;
    match (q.key.local, q.key.remote) {
        (SocketAddr::V4(local), SocketAddr::V4(remote)) => Some((link, *local.ip(), *remote.ip())),
        _ => None,
    }
}

/// After a `sendmmsg` of SYNs starting with `q`: how many it took. When it took none, `q`
/// could not be sent: its probe ends with [`Answer::Unsent`] (added to `answers`) and counts
/// as taken, so the caller goes on with the next.
fn sent_or_unsent(
    shared: &Shared,
    q: &Queued,
    sent: io::Result<usize>,
    answers: &mut Vec<Ended>,
) -> usize {
    let errno = match sent {
        Ok(n) if n > 0 => return n,
        Ok(_) => libc::EIO,
        Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
    };
    let mut state = shared.state();
    if let Some(probe) = state.pending.remove(&q.key, q.id) {
        answers.push(probe.end(q.key, Answer::Unsent(errno)));
    }
    1
}

/// Where the reader reads replies into.
struct Inbox {
    /// The IPv4 replies taken from the ring and when they arrived, until they are dispatched.
    segments: Vec<(Segment, Instant)>,
    /// The IPv6 socket's replies (TCP headers: 20 bytes, options up to 60).
    bufs: [[u8; REPLY_BYTES as usize]; MAX_BATCH],
    lens: [usize; MAX_BATCH],
    /// Their addresses (they come without their IPv6 header).
    addrs: [Addresses6; MAX_BATCH],
}

impl Inbox {
    fn new() -> Box<Self> {
        let none = Addresses6 {
            source: std::net::Ipv6Addr::UNSPECIFIED,
            destination: std::net::Ipv6Addr::UNSPECIFIED,
        };
        Box::new(Self {
            // A block's worth: up to 113 of the smallest replies (a bare RST).
            segments: Vec::with_capacity(2 * MAX_BATCH),
            bufs: [[0; REPLY_BYTES as usize]; MAX_BATCH],
            lens: [0; MAX_BATCH],
            addrs: [none; MAX_BATCH],
        })
    }
}

/// The reader task: wakes when the ring or the IPv6 socket has replies, or when the earliest
/// deadline passes; reads the replies (in batches), completes probes, expires the late ones.
pub(super) async fn read_replies(shared: Arc<Shared>, mut ring: ReplyRing) {
    let _closing = Closing(&shared);
    let ReplyRing { socket, frames } = &mut ring;
    let mut inbox = Inbox::new();
    let mut answers = Vec::with_capacity(MAX_BATCH);
    // Far enough never to fire, near enough not to overflow tokio's clock.
    let never = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let timer = tokio::time::sleep_until(never());
    tokio::pin!(timer);
    let mut timer_at: Option<Instant> = None;
    let mut last_read: Option<Instant> = None;
    // While replies wait in the ring's open block, deadlines past what was read wait for the
    // kernel to hand the block over (which wakes the reader); the timer then only looks again
    // at this instant, in case no wake comes.
    let mut held: Option<Instant> = None;
    loop {
        let armed = shared
            .state()
            .pending
            .armed()
            .map(|at| held.map_or(at, |held| at.max(held)));
        if armed != timer_at {
            timer
                .as_mut()
                .reset(armed.map_or_else(never, tokio::time::Instant::from_std));
            timer_at = armed;
        }
        let mut burst = None;
        tokio::select! {
            biased;
            ready = socket.readable() => {
                let Ok(ready) = ready.inspect_err(|e| {
                    tracing::error!("half-open probe reader stopped: {e}");
                }) else {
                    return;
                };
                read_ring(&shared, ready, frames, &mut inbox, &mut answers);
            }
            ready = readable6(&shared) => {
                let Ok(ready) = ready.inspect_err(|e| {
                    tracing::error!("half-open probe reader stopped (IPv6 socket): {e}");
                }) else {
                    return;
                };
                burst = Some(read_ready6(&shared, ready, &mut inbox, &mut answers));
            }
            () = &mut timer => {
                timer_at = None;
                // Replies that arrived before the deadline count: read them first (without
                // touching the reactor's readiness, which the next turn consumes).
                drain(&shared, frames, &mut inbox, &mut answers);
            }
            () = shared.rearm.notified() => {}
        }
        let now = Instant::now();
        let until = frames.read_until(now);
        shared.expire(until, &mut answers);
        held = (until < now).then(|| now + HOLD);
        if let Some(read) = burst {
            // IPv6 replies are coming fast: let a few more queue up before the next read (the
            // ring batches IPv4 replies by itself).
            if read > 1 || last_read.is_some_and(|t| now.saturating_duration_since(t) < COALESCE) {
                tokio::time::sleep(COALESCE).await;
            }
            last_read = Some(now);
        }
    }
}

/// Waits until the IPv6 socket is readable; forever without one.
async fn readable6(shared: &Shared) -> io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match &shared.socket6 {
        Some(socket) => socket.readable().await,
        None => std::future::pending().await,
    }
}

/// Reads the ring the reactor found readable until it is empty.
fn read_ring(
    shared: &Shared,
    mut ready: AsyncFdReadyGuard<'_, OwnedFd>,
    frames: &mut Frames,
    inbox: &mut Inbox,
    answers: &mut Vec<Ended>,
) {
    shared.wakeups.fetch_add(1, Ordering::Relaxed);
    read_frames(shared, frames, inbox, answers);
    // Emptied. Clearing is a no-op if the reactor saw new data since.
    ready.clear_ready();
    if let Some(dropped) = frames.dropped(ready.get_inner().as_fd()) {
        tracing::warn!(
            dropped,
            "half-open probes: replies dropped, the receive ring was full (their probes time out)"
        );
    }
}

/// Takes the ring's replies a block at a time (one lock a block) until it is empty.
fn read_frames(shared: &Shared, frames: &mut Frames, inbox: &mut Inbox, answers: &mut Vec<Ended>) {
    let segments = &mut inbox.segments;
    while frames
        .read_block(|packet, at| segments.extend(Segment::parse(packet).map(|s| (s, at))))
        .is_some()
    {
        if !segments.is_empty() {
            shared.dispatch_segments(segments.drain(..), answers);
        }
    }
}

/// Reads the IPv6 socket the reactor found readable until it is drained or a batch came short;
/// how many replies it read.
fn read_ready6(
    shared: &Shared,
    mut ready: AsyncFdReadyGuard<'_, OwnedFd>,
    inbox: &mut Inbox,
    answers: &mut Vec<Ended>,
) -> usize {
    shared.wakeups.fetch_add(1, Ordering::Relaxed);
    let mut total = 0;
    loop {
        match ready.try_io(|fd| read_batch6(shared, fd.as_fd(), inbox, answers)) {
            Ok(Ok(n)) => {
                total += n;
                if n < MAX_BATCH {
                    // Drained. Clearing is a no-op if the reactor saw new data since.
                    ready.clear_ready();
                    break;
                }
            }
            // Not expected on an unconnected raw socket without IPV6_RECVERR (ICMPv6 errors
            // are not reported to it). Readiness stays set: read again.
            Ok(Err(e)) => {
                tracing::warn!("half-open probe socket: {e}");
                break;
            }
            Err(_would_block) => break,
        }
    }
    total
}

/// One `recvmmsg` on `fd`, the IPv6 raw socket, and the probes its replies complete; how many
/// replies it read.
fn read_batch6(
    shared: &Shared,
    fd: BorrowedFd<'_>,
    inbox: &mut Inbox,
    answers: &mut Vec<Ended>,
) -> io::Result<usize> {
    let Inbox {
        bufs, lens, addrs, ..
    } = inbox;
    let n = recv_many6(fd, bufs, lens, addrs)?;
    let now = Instant::now();
    let segments = (0..n).filter_map(|i| {
        Segment::parse6(&bufs[i][..lens[i]], addrs[i].source, addrs[i].destination)
            .map(|s| (s, now))
    });
    shared.dispatch_segments(segments, answers);
    Ok(n)
}

/// Reads what the ring and the IPv6 socket hold now, without waiting nor going through the
/// reactor.
fn drain(shared: &Shared, frames: &mut Frames, inbox: &mut Inbox, answers: &mut Vec<Ended>) {
    read_frames(shared, frames, inbox, answers);
    if let Some(socket) = &shared.socket6 {
        while let Ok(n) = read_batch6(shared, socket.get_ref().as_fd(), inbox, answers) {
            if n < MAX_BATCH {
                break;
            }
        }
    }
}
