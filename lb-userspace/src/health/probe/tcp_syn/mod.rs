//! Half-open TCP probes (SPEC §2 `tcp`): send a SYN to `ip:port`; a SYN+ACK within the timeout
//! is a success, a RST is a `TcpFailure`, silence is a `Timeout`. The connection is never
//! completed: the local kernel answers the backend's SYN+ACK with a RST by itself, because no
//! local socket owns the connection, so the backend does not keep a half-open entry. Targets
//! are IPv4 or IPv6 (`SocketAddr`), and the same holds for both.
//!
//! Three sockets serve every probe of the daemon. IPv4: a raw `IPPROTO_RAW` socket sends the
//! SYNs that take the kernel's path (whole datagrams, the IP header built here; it receives
//! nothing), and a packet socket bound to IPv4 on every device reads the replies from a ring
//! it shares with the kernel ([`ring`]). IPv6: a raw `IPPROTO_TCP` socket does both (left out,
//! with a warning, on a host without IPv6; its IPv6 probes are then `Local` failures). A probe
//! registers itself in one map keyed by the connection, whatever its family, and queues its
//! SYN; a sender task sends the queued SYNs on the socket of their family, and a reader task
//! takes the replies of the ring and the IPv6 socket, completes the matching probes and also
//! ends the probes whose deadline has passed. The checker starts probes with
//! [`SynProber::start_many`] and takes their results from [`SynProber::finished`];
//! [`SynProber::probe`] starts one the same way and has its result come to the future instead.
//! Both receiving sockets see far more than replies (the ring every IPv4 packet the host
//! receives, the IPv6 raw socket every TCP segment of its family), so a classic BPF filter in
//! the kernel passes only segments with SYN+ACK or RST set: the reader does not wake for the
//! host's ordinary traffic. They see different bytes, hence two filters: the ring's gets each
//! packet from its IP header (the flags sit behind the header's variable length), the IPv6
//! socket's from its TCP header (the kernel has pulled the IPv6 header and any extension
//! headers; the addresses come with `recvmsg`: the source as the sender's address, the
//! destination from `IPV6_PKTINFO`).
//!
//! What a probe costs (issue 4: 10,000 targets a second must stay cheap): its share of a
//! `sendmmsg`, the kernel's copy of its reply into the ring, and a few short lock sections.
//! Everything else is shared or amortised:
//! - source ports come from a pool reserved once (see below), not a socket per probe;
//! - the source address is looked up per target at most every [`ROUTE_TTL`] (and again after a
//!   timeout or a failed send), not per probe;
//! - the checker starts a slot's probes together ([`SynProber::start_many`]: no future, task or
//!   channel per probe; results come back in batches through [`SynProber::finished`]), and the
//!   sender task sends the SYNs queued since it last ran with one `sendmmsg` (up to 64 a call);
//! - deadlines live in one ordered map watched by the reader's single timer, not a timer per
//!   probe, and a batch shares one entry; the entry goes when its last probe is answered, so the
//!   timer only fires for real timeouts;
//! - IPv4 replies reach the reader a block of the ring at a time: the kernel wakes it once per
//!   block (full, or when the kernel's 1 ms block timer finds it holding replies; see
//!   [`ring`]), not per reply.
//!   IPv6 replies: up to 64 per `recvmmsg`, and when they come faster than one per
//!   [`COALESCE`] the reader pauses that long between reads;
//! - the IPv4 SYNs carry DF, like a Linux TCP SYN, which also spares the kernel a hashed IP ID
//!   each (IPv6 has no fragmentation on the way);
//! - an IPv4 target whose last probe was answered gets its SYNs through a packet socket on the
//!   link layer (see [`super::link`]): the kernel's IP output path was the largest single cost
//!   of a probe. That path builds IPv4 headers only: IPv6 targets always take the kernel's path
//!   through the raw socket (docs/limitations.md). Its first probe, and every probe after a timeout or a failed send, take the
//!   kernel's path through the raw socket, so the kernel resolves the next hop, and a failure
//!   (unless it is the first timeout) is always seen through the kernel's own routing. On that
//!   path a SYN skips netfilter's OUTPUT and POSTROUTING hooks and IPsec policies
//!   (docs/limitations.md); the answers come back through the ring either way. The ring sees them as they
//!   come off the device, before netfilter's PREROUTING and INPUT hooks and IPsec's policy
//!   checks: a reply the host's firewall drops still counts (the backend answered), and replies
//!   of transport-mode IPsec, decrypted past every packet socket, are not seen
//!   (docs/limitations.md).
//!
//! Timing: the timeout runs from the call to [`SynProber::start_many`] (or
//! [`SynProber::probe`]). A reply that arrived before the deadline always counts: the reader
//! reads the ring and the socket before it expires deadlines, and while replies still wait in
//! the ring's open block it expires no deadline later than the last moment up to which it has
//! read everything ([`ring::Frames::read_until`]); those probes end when the kernel hands the
//! block over, a millisecond or two later. A reply that arrives a little after the deadline
//! (before the reader's next pass) may count too, as with a per-probe timer. The latency runs
//! from just before the `sendmmsg` that carried the SYN to when the reply arrived: the kernel's
//! timestamp of an IPv4 reply, the read of an IPv6 one (which may include a `COALESCE` pause
//! under load).
//!
//! Source address and port:
//! - the address is the kernel's own choice towards the target (a connected UDP socket's local
//!   address), cached per target for [`ROUTE_TTL`] so it follows route changes within that time;
//!   a timeout or a failed send drops the cached address, so the next probe looks it up again.
//!   The SYN is sent with that source (in the IPv4 header built here, and `IP_PKTINFO` for the
//!   route; `IPV6_PKTINFO`): the checksum covers it,
//!   so it must be the address in the IP header, and a source that is no longer local makes the
//!   send fail (then the probe looks the route up again and resends once). An IPv4 SYN's
//!   checksum is computed here; an IPv6 one's by the kernel (`IPV6_CHECKSUM`), over the
//!   pseudo-header of the addresses it sends with;
//! - the port comes from a pool of [`POOL_PORTS`] ports shared by both families, each reserved
//!   for the prober's lifetime by a dual-stack TCP socket bound to `[::]:port` (`IPV6_V6ONLY`
//!   off; `0.0.0.0:port` on a host without IPv6) that never listens nor connects: no other local
//!   socket of either family can take the port meanwhile (an ephemeral `connect` or `bind`
//!   skips it, whatever the address, `IPV6_V6ONLY` sockets included), and since that socket is
//!   not listening the kernel still resets the backend's SYN+ACK, over IPv4 and IPv6 alike. A pooled port serves many targets at once (the reply is matched by both ends);
//!   each target walks through the pool in turn, so it reuses a port only every `POOL_PORTS`
//!   probes, long after its backend forgot the previous half-open connection even if our RST
//!   was lost. When every pooled port is busy towards one target, a probe reserves a port of its
//!   own for its lifetime (a socket bound to `(source, 0)`).
//!
//! ICMP and ICMPv6 errors (e.g. a firewall's port-unreachable) are not matched to probes: the
//! ring's filter passes TCP only, and an unconnected raw socket only hears of them with
//! IPV6_RECVERR, through its error queue, which this prober does not read. Such a target times out, which is a failure all the same.
//!
//! Sockets are created in the network namespace of the calling thread: [`SynProber::new`] and
//! the calls that start probes must run in the same one (the daemon runs in a single
//! namespace).

mod filter;
mod pending;
mod ring;
mod shared;
mod socket;
mod targets;
mod tasks;
mod wire;

pub use targets::{POOL_PORTS, ROUTE_TTL};
pub use tasks::COALESCE;

use std::{
    io,
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tokio::task::JoinHandle;

use super::link::Links;
use super::sys::register;
use super::{ProbeResult, Via};
use pending::Waiter;
use ring::ReplyRing;
use shared::Shared;
use socket::{open_raw_socket, open_raw_socket6};
use targets::Pool;
use tasks::{read_replies, send_queued};

/// The sockets (see the module's doc) serving every half-open probe of the daemon.
pub struct SynProber {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    sender: JoinHandle<()>,
}

impl SynProber {
    /// Opens the sockets (needs CAP_NET_RAW; the error says so), reserves the pooled source
    /// ports and starts the reader and sender tasks on the current tokio runtime (which must
    /// have IO and time enabled). The IPv6 socket is left out, with a warning, where the host
    /// has no IPv6: its IPv6 probes are then local failures.
    pub fn new() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let socket = register(open_raw_socket()?)?;
        let socket6 = match open_raw_socket6() {
            Ok(fd) => Some(register(fd)?),
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
                tracing::warn!("half-open probes: no IPv6 on this host ({e}); IPv4 targets only");
                None
            }
            Err(e) => return Err(e),
        };
        let ring = ReplyRing::open()?;
        let pool = Pool::reserve();
        let links = Links::open()
            .inspect_err(|e| {
                tracing::warn!(
                    "half-open probes: no link-layer path ({e}); every SYN takes the kernel's path"
                );
            })
            .ok();
        let shared = Arc::new(Shared::new(socket, socket6, pool, links)?);
        let reader = runtime.spawn(read_replies(Arc::clone(&shared), ring));
        let sender = runtime.spawn(send_queued(Arc::clone(&shared)));
        Ok(Self {
            shared,
            reader,
            sender,
        })
    }

    /// Sends a SYN to `target` and waits up to `timeout`: one probe of
    /// [`SynProber::start_many`] whose result comes to this future instead of the finished
    /// queue. Dropping the future withdraws the probe.
    ///
    /// Local errors are logged; no route or a firewall refusing the send count as `TcpFailure`
    /// (the target cannot be reached either way), a shortage here (ports, descriptors,
    /// buffers) as `Local`.
    pub async fn probe(&self, target: SocketAddr, timeout: Duration) -> ProbeResult {
        self.probe_via(target, None, timeout).await
    }

    /// [`SynProber::probe`], through the tunnel when `via` says so (see
    /// [`super::tunnel`]): the SYN leaves through the raw socket with the tunnel's mark and
    /// source, never on the link-layer path; a SYN+ACK is reset through the tunnel too.
    pub async fn probe_via(
        &self,
        target: SocketAddr,
        via: Option<Via>,
        timeout: Duration,
    ) -> ProbeResult {
        let now = Instant::now();
        let (mut waiting, syn) = self
            .shared
            .start_waiting_via(target, via, now + timeout, now);
        if let Some(syn) = syn {
            self.shared.enqueue(syn);
        }
        waiting.result().await
    }

    /// Diagnostic: how many times the reader task has woken up to read the socket. With the
    /// kernel filter in place this follows the probe replies, not the host's TCP traffic.
    pub fn wakeups(&self) -> u64 {
        self.shared.wakeups.load(Ordering::Relaxed)
    }

    /// SYNs sent so far: through the link-layer path, and through the kernel's (raw socket).
    pub fn syns_sent(&self) -> (u64, u64) {
        let shared = &self.shared;
        (
            shared.sent_link.load(Ordering::Relaxed),
            shared.sent_kernel.load(Ordering::Relaxed),
        )
    }

    /// Starts a half-open probe of each `(token, target, timeout, via)` without a future of its
    /// own (`via`: through the tunnel, see [`SynProber::probe_via`]):
    /// the SYNs leave together, and each result comes out of [`SynProber::finished`] under its
    /// token, with the same meaning as [`SynProber::probe`]'s. For one consumer (the checker's
    /// scheduler): tokens are not told apart by caller. The high half of a token is the
    /// caller's place for the target, a small index it keeps dense and gives to one target at
    /// a time: the prober keeps the target's state in a table under it (a target at a place
    /// that held another one starts afresh).
    pub fn start_many(&self, probes: &[(u64, SocketAddr, Duration, Option<Via>)]) {
        let now = Instant::now();
        let mut queued = Vec::with_capacity(probes.len());
        {
            // The targets' states lie scattered in memory: ask for all of them before using
            // any, so their cache misses overlap instead of coming one by one.
            let state = self.shared.state();
            for &(token, ..) in probes {
                state.targets.prefetch((token >> 32) as usize);
            }
        }
        for &(token, target, timeout, via) in probes {
            let deadline = now + timeout;
            let waiter = Waiter::Token(token);
            queued.extend(
                self.shared
                    .start_via(waiter, target, via, deadline, None, now),
            );
        }
        self.shared.enqueue_many(queued);
    }

    /// Waits until probes of `start_many` have finished and moves their results to `out`.
    /// Cancel-safe: nothing is taken unless it returns.
    pub async fn finished(&self, out: &mut Vec<(u64, ProbeResult)>) {
        loop {
            let ready = self.shared.finished_ready.notified();
            {
                let mut done = self.shared.finished_queue();
                if !done.is_empty() {
                    if out.is_empty() {
                        std::mem::swap(out, &mut *done);
                    } else {
                        out.append(&mut done);
                    }
                    return;
                }
            }
            ready.await;
        }
    }
}

impl Drop for SynProber {
    fn drop(&mut self) {
        // The tasks hold the other references to the socket: it closes when they end.
        self.reader.abort();
        self.sender.abort();
    }
}
