//! Half-open TCP probes (SPEC §2 `tcp`): send a SYN to `ip:port`; a SYN+ACK within the timeout
//! is a success, a RST is a `TcpFailure`, silence is a `Timeout`. The connection is never
//! completed: the local kernel answers the backend's SYN+ACK with a RST by itself, because no
//! local socket owns the connection, so the backend does not keep a half-open entry.
//!
//! One raw `IPPROTO_TCP` socket serves every probe of the daemon. A probe registers itself in a
//! map keyed by the connection and queues its SYN; a sender task sends the queued SYNs, and a
//! reader task receives the replies, completes the matching probes and also ends the probes
//! whose deadline has passed. The checker starts probes with [`SynProber::start_many`] and takes
//! their results from [`SynProber::finished`]; [`SynProber::probe`] starts one the same way and
//! has its result come to the future instead. A raw TCP socket receives a copy of *every* TCP
//! segment that reaches this host, so a classic BPF filter in the kernel passes only segments
//! with SYN+ACK or RST set: the reader does not wake for the host's ordinary TCP traffic.
//!
//! What a probe costs (issue 4: 10,000 targets a second must stay cheap): its share of a
//! `sendmmsg` and of a `recvmmsg` and a few short lock sections. Everything else is shared or
//! amortised:
//! - source ports come from a pool reserved once (see below), not a socket per probe;
//! - the source address is looked up per target at most every [`ROUTE_TTL`] (and again after a
//!   timeout or a failed send), not per probe;
//! - the checker starts a slot's probes together ([`SynProber::start_many`]: no future, task or
//!   channel per probe; results come back in batches through [`SynProber::finished`]), and the
//!   sender task sends the SYNs queued since it last ran with one `sendmmsg` (up to 64 a call);
//! - deadlines live in one ordered map watched by the reader's single timer, not a timer per
//!   probe, and a batch shares one entry; the entry goes when its last probe is answered, so the
//!   timer only fires for real timeouts;
//! - the reader takes up to 64 replies per `recvmmsg`, and when replies come faster
//!   than one per [`COALESCE`] it pauses that long between reads, so it wakes at most about once
//!   per `COALESCE` under load rather than once per reply;
//! - the SYNs carry DF, like a Linux TCP SYN, which also spares the kernel a hashed IP ID each;
//! - a target whose last probe was answered gets its SYNs through a packet socket on the
//!   link layer (see [`super::link`]): the kernel's IP output path was the largest single cost
//!   of a probe. Its first probe, and every probe after a timeout or a failed send, take the
//!   kernel's path through the raw socket, so the kernel resolves the next hop, and a failure
//!   (unless it is the first timeout) is always seen through the kernel's own routing. On that
//!   path a SYN skips netfilter's OUTPUT and POSTROUTING hooks and IPsec policies (README,
//!   limitations); the answers come back through the raw socket either way.
//!
//! Timing: the timeout runs from the call to [`SynProber::start_many`] (or
//! [`SynProber::probe`]). The reader reads the socket before it expires deadlines, so a SYN+ACK
//! or RST that arrived before the deadline always counts. One that arrives a little after it
//! (before the reader's next pass, which tokio's 1 ms timer and the [`COALESCE`] pause can delay
//! by a couple of milliseconds) may count too, as with a per-probe timer. The latency runs from
//! just before the `sendmmsg` that carried the SYN to when the reader read the reply: under load
//! it may include up to one `COALESCE` pause.
//!
//! Source address and port:
//! - the address is the kernel's own choice towards the target (a connected UDP socket's local
//!   address), cached per target for [`ROUTE_TTL`] so it follows route changes within that time;
//!   a timeout or a failed send drops the cached address, so the next probe looks it up again.
//!   The SYN is sent with that source (`IP_PKTINFO`): the checksum covers it, so it must be the
//!   address in the IP header, and a source that is no longer local makes the send fail (then
//!   the probe looks the route up again and resends once);
//! - the port comes from a pool of [`POOL_PORTS`] ports, each reserved for the prober's lifetime
//!   by a TCP socket bound to `0.0.0.0:port` that never listens nor connects: no other local
//!   socket can take the port meanwhile (an ephemeral `connect` or `bind` skips it, whatever the
//!   address), and since that socket is not listening the kernel still resets the backend's
//!   SYN+ACK. A pooled port serves many targets at once (the reply is matched by both ends);
//!   each target walks through the pool in turn, so it reuses a port only every `POOL_PORTS`
//!   probes, long after its backend forgot the previous half-open connection even if our RST
//!   was lost. When every pooled port is busy towards one target, a probe reserves a port of its
//!   own for its lifetime (a socket bound to `(source, 0)`).
//!
//! ICMP errors (e.g. a firewall's port-unreachable) are not matched to probes: an unconnected
//! raw socket only hears of them with IP_RECVERR, through its error queue, which this prober does
//! not read. Such a target times out, which is a failure all the same.
//!
//! Sockets are created in the network namespace of the calling thread: [`SynProber::new`] and
//! the calls that start probes must run in the same one (the daemon runs in a single
//! namespace).

mod filter;
mod pending;
mod socket;
mod targets;
mod wire;

pub use targets::{POOL_PORTS, ROUTE_TTL};

use std::{
    io,
    net::SocketAddrV4,
    os::fd::{AsFd, OwnedFd},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{
    io::unix::AsyncFd,
    sync::{Notify, oneshot},
    task::JoinHandle,
};

use super::ProbeResult;
use super::link::{Frame, Link, Links};
use super::sys::{MAX_BATCH, Outgoing, recv_many, register, send_many};
use crate::health::outcome::{Reason, from_io};
use pending::{Answer, Ended, Key, Pending, Registry, Waiter};
use socket::{Routes, open_raw_socket, reserve_port};
use targets::{Home, Path, Pool, Target, Targets};
use wire::{SYN_LEN, Segment, Verdict, initial_sequence, syn_segment};

/// Under load, the reader's pause between two reads of the socket. It pauses only when replies
/// come fast (several in one read, or a read less than this long after the previous one), so a
/// lone reply is read at once.
pub const COALESCE: Duration = Duration::from_millis(1);

/// Bytes kept of each reply: an IP header with options (60 bytes) and a TCP header (20) are all
/// a reply needs; recv discards the rest of a longer datagram.
const REPLY_BYTES: usize = 128;

/// One raw socket serving every half-open probe of the daemon.
pub struct SynProber {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    sender: JoinHandle<()>,
}

/// What the probes and the reader and sender tasks share.
struct Shared {
    socket: AsyncFd<OwnedFd>,
    state: Mutex<State>,
    /// Tells the reader that a probe's deadline is earlier than its timer.
    rearm: Notify,
    /// SYNs waiting for the sender task, and the signal that the first one arrived.
    outbox: Mutex<Vec<Queued>>,
    flush: Notify,
    /// The pooled source ports.
    pool: Pool,
    /// Looks up source addresses.
    routes: Routes,
    /// The link-layer path for targets that answered (see [`super::link`]); None if its
    /// sockets could not be opened (then every SYN takes the kernel's path).
    links: Option<Links>,
    wakeups: AtomicU64,
    /// SYNs sent through the link-layer path, and through the raw socket.
    sent_link: AtomicU64,
    sent_kernel: AtomicU64,
    /// Results of the probes of `start_many`, and the signal that some are there.
    finished: Mutex<Vec<(u64, ProbeResult)>>,
    finished_ready: Notify,
}

/// Everything behind the one lock.
struct State {
    pending: Registry,
    targets: Targets,
    /// The reader has stopped: no answer can come any more.
    closed: bool,
}

/// Where a probe's SYN leaves from (see [`Shared::place`]).
struct Placed {
    local: SocketAddrV4,
    /// The link-layer path, if the SYN takes it.
    link: Option<Link>,
    /// A port reserved for this probe alone, if the pool had none free towards the target.
    own_port: Option<OwnedFd>,
}

/// A SYN waiting for the sender task.
struct Queued {
    key: Key,
    id: u64,
    syn: [u8; SYN_LEN],
    /// The link-layer path to send it on, if still current when it is sent.
    link: Option<Link>,
}

impl SynProber {
    /// Opens the raw socket (needs CAP_NET_RAW; the error says so), reserves the pooled source
    /// ports and starts the reader and sender tasks on the current tokio runtime (which must
    /// have IO and time enabled).
    pub fn new() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let socket = register(open_raw_socket()?)?;
        let pool = Pool::reserve();
        let links = Links::open()
            .inspect_err(|e| {
                tracing::warn!(
                    "half-open probes: no link-layer path ({e}); every SYN takes the kernel's path"
                );
            })
            .ok();
        let shared = Arc::new(Shared::new(socket, pool, links)?);
        let reader = runtime.spawn(read_replies(Arc::clone(&shared)));
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
    pub async fn probe(&self, target: SocketAddrV4, timeout: Duration) -> ProbeResult {
        let now = Instant::now();
        let (mut waiting, syn) = self.shared.start_waiting(target, now + timeout, now);
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

    /// Starts a half-open probe of each `(token, target, timeout)` without a future of its own:
    /// the SYNs leave together, and each result comes out of [`SynProber::finished`] under its
    /// token, with the same meaning as [`SynProber::probe`]'s. For one consumer (the checker's
    /// scheduler): tokens are not told apart by caller. The high half of a token is the
    /// caller's place for the target, a small index it keeps dense and gives to one target at
    /// a time: the prober keeps the target's state in a table under it (a target at a place
    /// that held another one starts afresh).
    pub fn start_many(&self, probes: &[(u64, SocketAddrV4, Duration)]) {
        let now = Instant::now();
        let mut queued = Vec::with_capacity(probes.len());
        {
            // The targets' states lie scattered in memory: ask for all of them before using
            // any, so their cache misses overlap instead of coming one by one.
            let state = self.shared.state();
            for &(token, _, _) in probes {
                state.targets.prefetch((token >> 32) as usize);
            }
        }
        for &(token, target, timeout) in probes {
            let deadline = now + timeout;
            queued.extend(
                self.shared
                    .start(Waiter::Token(token), target, deadline, None, now),
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
                    out.append(&mut done);
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

impl Shared {
    fn new(socket: AsyncFd<OwnedFd>, pool: Pool, links: Option<Links>) -> io::Result<Self> {
        Ok(Self {
            socket,
            state: Mutex::new(State {
                pending: Registry::default(),
                targets: Targets::default(),
                closed: false,
            }),
            rearm: Notify::new(),
            outbox: Mutex::new(Vec::new()),
            flush: Notify::new(),
            pool,
            routes: Routes::new()?,
            links,
            wakeups: AtomicU64::new(0),
            sent_link: AtomicU64::new(0),
            sent_kernel: AtomicU64::new(0),
            finished: Mutex::new(Vec::new()),
            finished_ready: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a probe of `target` for `waiter`: registers it and gives its SYN to queue. A
    /// probe that cannot start gets its failure at once (None). `resend_of`: the id of the probe
    /// whose SYN could not be sent, if this is its resend.
    fn start(
        &self,
        waiter: Waiter,
        target: SocketAddrV4,
        deadline: Instant,
        resend_of: Option<u64>,
        now: Instant,
    ) -> Option<Queued> {
        let seq = initial_sequence();
        let home = waiter.home();
        let (mut state, placed) = match self.place(home, target, now) {
            Ok(placed) => placed,
            Err(e) => {
                let failure = self.local_failure(home, target, &e);
                self.finish(waiter, failure);
                return None;
            }
        };
        // A resend whose `probe` future was dropped meanwhile: nobody waits for it. Checked
        // under the lock that the future's withdrawal takes, so one of the two sees the other.
        if waiter.abandoned() {
            return None;
        }
        let key = Key {
            local: placed.local,
            remote: target,
        };
        let id = resend_of.unwrap_or_else(|| state.pending.new_id());
        let probe = Pending {
            id,
            seq,
            deadline,
            sent: None,
            via_link: placed.link.is_some(),
            resend: resend_of.is_none(),
            waiter,
            _own_port: placed.own_port,
        };
        if state.pending.insert(key, probe) {
            self.rearm.notify_one();
        }
        drop(state);
        Some(Queued {
            key,
            id,
            syn: syn_segment(key.local, target, seq),
            link: placed.link,
        })
    }

    /// Starts a probe for a `probe` future: its hold on the result, and its SYN to queue.
    fn start_waiting(
        &self,
        target: SocketAddrV4,
        deadline: Instant,
        now: Instant,
    ) -> (Waiting<'_>, Option<Queued>) {
        let (done, result) = oneshot::channel();
        let syn = self.start(Waiter::Future(done), target, deadline, None, now);
        let waiting = Waiting {
            shared: self,
            probe: syn.as_ref().map(|q| (q.id, deadline)),
            result,
        };
        (waiting, syn)
    }

    /// Where a probe of `target` sends from: its source address (cached, or looked up now) and
    /// a source port free towards `target`. Returns with the state locked, so that the port
    /// stays free until the probe is registered.
    ///
    /// The SYN takes the link-layer path when the target's last probe was answered and a
    /// current link to it is known (looked up now if not, at most once per [`ROUTE_TTL`] when
    /// there is none); the kernel's path otherwise.
    fn place(
        &self,
        home: Home,
        target: SocketAddrV4,
        mut now: Instant,
    ) -> io::Result<(MutexGuard<'_, State>, Placed)> {
        let mut own: Option<(OwnedFd, SocketAddrV4)> = None;
        let mut again = false;
        loop {
            // Another turn follows a lookup or a reservation, which took time.
            if again {
                now = Instant::now();
            }
            again = true;
            let mut guard = self.state();
            let state = &mut *guard;
            if state.closed {
                return Err(io::Error::other("the reply reader has stopped"));
            }
            state.targets.sweep(now);
            let entry = state
                .targets
                .entry(home, target, || Target::new(target, &self.pool, now));
            entry.used = now;
            let path = self
                .links
                .as_ref()
                .map(|links| (links, entry.path(links, now)));
            let link = match path {
                Some((_, Path::Link(link))) => Some(link),
                Some((links, Path::LookUp)) => {
                    drop(guard);
                    let found = links.lookup(*target.ip()).unwrap_or_else(|e| {
                        tracing::debug!(%target, "link-layer path lookup failed: {e}");
                        None
                    });
                    let at = Instant::now();
                    if let Some(t) = self.state().targets.get_mut(home, target) {
                        t.learn_link(found, at);
                    }
                    continue;
                }
                Some((_, Path::Kernel)) | None => None,
            };
            let source = match (&link, entry.source(now)) {
                (Some(link), _) => link.source,
                (None, Some(source)) => source,
                (None, None) => {
                    drop(guard);
                    let source = self.routes.source_towards(target)?;
                    if let Some(t) = self.state().targets.get_mut(home, target) {
                        t.source = Some((source, Instant::now()));
                    }
                    continue;
                }
            };
            let local = match &own {
                Some((_, addr)) if addr.ip() == &source => Some(*addr),
                _ => self.pool.take(&mut entry.next_port, source, |local| {
                    state.pending.contains(&Key {
                        local,
                        remote: target,
                    })
                }),
            };
            let Some(local) = local else {
                // Every pooled port is busy towards this target: reserve one for this probe.
                drop(guard);
                own = Some(reserve_port(source)?);
                continue;
            };
            let own_port = own.map(|(fd, _)| fd);
            return Ok((
                guard,
                Placed {
                    local,
                    link,
                    own_port,
                },
            ));
        }
    }

    /// Hands a SYN to the sender task, waking it if the outbox was empty.
    fn enqueue(&self, syn: Queued) {
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        outbox.push(syn);
        if outbox.len() == 1 {
            self.flush.notify_one();
        }
    }

    /// Hands SYNs to the sender task, waking it if the outbox was empty.
    fn enqueue_many(&self, mut syns: Vec<Queued>) {
        if syns.is_empty() {
            return;
        }
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        let first = outbox.is_empty();
        outbox.append(&mut syns);
        if first {
            self.flush.notify_one();
        }
    }

    /// Hands one probe's `result` to its waiter.
    fn finish(&self, waiter: Waiter, result: ProbeResult) {
        if let Some(done) = waiter.finish(result) {
            self.finished_queue().push(done);
            self.finished_ready.notify_one();
        }
    }

    /// Adds results of `start_many` probes to the finished queue and signals them.
    fn finish_tokens(&self, mut tokens: Vec<(u64, ProbeResult)>) {
        if !tokens.is_empty() {
            self.finished_queue().append(&mut tokens);
            self.finished_ready.notify_one();
        }
    }

    /// What an answer means for a probe of `target`; `Err(errno)` when its SYN could not be sent
    /// (the caller may resend once).
    fn result_of(
        &self,
        home: Home,
        target: SocketAddrV4,
        answer: Answer,
    ) -> Result<ProbeResult, i32> {
        match answer {
            Answer::Reply {
                verdict: Verdict::Accepted,
                latency,
            } => Ok(ProbeResult::Success { latency }),
            Answer::Reply {
                verdict: Verdict::Refused,
                ..
            } => Ok(ProbeResult::TcpFailure(Reason::Refused)),
            Answer::Expired => {
                // The route may have changed under a cached source: look it up next time.
                self.forget_route(home, target);
                Ok(ProbeResult::Timeout)
            }
            Answer::Unsent(errno) => Err(errno),
        }
    }

    /// A probe that failed here: no route or the send refused by a local firewall is a
    /// `TcpFailure` (the target cannot be reached either way); no port, descriptor or buffer
    /// left is the host's shortage, a `Local` result that counts against nobody.
    fn local_failure(&self, home: Home, target: SocketAddrV4, e: &io::Error) -> ProbeResult {
        tracing::warn!(%target, "half-open probe failed locally: {e}");
        self.forget_route(home, target);
        from_io(e)
    }

    fn finished_queue(&self) -> MutexGuard<'_, Vec<(u64, ProbeResult)>> {
        self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns ended probes into results and hands them to their waiters (`ended` is emptied);
    /// a probe whose SYN could not be sent is sent once more first. Call without the state lock.
    fn deliver(&self, ended: &mut Vec<Ended>) {
        let mut results = Vec::new();
        let mut again = Vec::new();
        for probe in ended.drain(..) {
            let (home, target) = (probe.waiter.home(), probe.key.remote);
            let result = match self.result_of(home, target, probe.answer) {
                Ok(result) => result,
                // A cached source may have gone (address removed), or the link-layer path
                // failed: look the route up again and send once more, on the kernel's path.
                Err(_) if probe.resend => {
                    self.forget_route(home, target);
                    let (waiter, deadline) = (probe.waiter, probe.deadline);
                    let resend = Some(probe.id);
                    again.extend(self.start(waiter, target, deadline, resend, Instant::now()));
                    continue;
                }
                Err(errno) => {
                    self.local_failure(home, target, &io::Error::from_raw_os_error(errno))
                }
            };
            results.extend(probe.waiter.finish(result));
        }
        self.enqueue_many(again);
        self.finish_tokens(results);
    }

    /// Sends `batch` (emptied), [`MAX_BATCH`] SYNs per `sendmmsg`, skipping the probes that
    /// ended meanwhile: on their link-layer path those whose link is still current (after
    /// reading the change notifications), the others through the raw socket. A SYN that cannot
    /// be sent ends its probe with [`Answer::Unsent`].
    async fn send_batch(&self, batch: &mut Vec<Queued>) {
        if let Some(links) = &self.links {
            links.watch();
        }
        let mut answers = Vec::new();
        let mut rest = &batch[..];
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(rest.len().min(MAX_BATCH));
            rest = after;
            // Stamp the probes still waiting; the others need no SYN.
            let (mut framed, mut plain) = (Vec::new(), Vec::new());
            {
                let now = Instant::now();
                let mut state = self.state();
                for q in chunk {
                    match state.pending.get_mut(&q.key, q.id) {
                        Some(p) => p.sent = Some(now),
                        None => continue,
                    }
                    match self.link_of(q) {
                        Some(link) => framed.push((q, link)),
                        None => plain.push(q),
                    }
                }
            }
            if let Some(links) = &self.links
                && !framed.is_empty()
            {
                let frames: Vec<Frame<'_>> = framed
                    .iter()
                    .map(|&(q, link)| Frame {
                        link,
                        source: *q.key.local.ip(),
                        destination: *q.key.remote.ip(),
                        protocol: libc::IPPROTO_TCP as u8,
                        payload: &q.syn,
                    })
                    .collect();
                let mut i = 0;
                while i < frames.len() {
                    let sent = links.send_many(&frames[i..]);
                    if let Ok(n) = sent {
                        self.sent_link.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    i += self.sent_or_unsent(framed[i].0, sent, &mut answers);
                }
            }
            let mut i = 0;
            while i < plain.len() {
                let datagrams: Vec<Outgoing<'_>> = plain[i..]
                    .iter()
                    .map(|q| Outgoing {
                        source: *q.key.local.ip(),
                        target: *q.key.remote.ip(),
                        bytes: &q.syn,
                    })
                    .collect();
                let sent = self
                    .socket
                    .async_io(tokio::io::Interest::WRITABLE, |fd| {
                        send_many(fd.as_fd(), &datagrams)
                    })
                    .await;
                if let Ok(n) = sent {
                    self.sent_kernel.fetch_add(n as u64, Ordering::Relaxed);
                }
                i += self.sent_or_unsent(plain[i], sent, &mut answers);
            }
        }
        batch.clear();
        self.deliver(&mut answers);
    }

    /// The link-layer path of a queued SYN, if it has one that is still current.
    fn link_of<'q>(&self, q: &'q Queued) -> Option<&'q Link> {
        let links = self.links.as_ref()?;
        q.link.as_ref().filter(|link| links.current(link))
    }

    /// After a `sendmmsg` of SYNs starting with `q`: how many it took. When it took none, `q`
    /// could not be sent: its probe ends with [`Answer::Unsent`] (added to `answers`) and counts
    /// as taken, so the caller goes on with the next.
    fn sent_or_unsent(
        &self,
        q: &Queued,
        sent: io::Result<usize>,
        answers: &mut Vec<Ended>,
    ) -> usize {
        let errno = match sent {
            Ok(n) if n > 0 => return n,
            Ok(_) => libc::EIO,
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
        };
        let mut state = self.state();
        if let Some(probe) = state.pending.remove(&q.key, q.id) {
            answers.push(probe.end(q.key, Answer::Unsent(errno)));
        }
        1
    }

    /// Drops the cached source and link of `target`: its next probe looks the route up again
    /// and takes the kernel's path until it is answered.
    fn forget_route(&self, home: Home, target: SocketAddrV4) {
        if let Some(t) = self.state().targets.get_mut(home, target) {
            t.forget_route();
        }
    }

    /// Completes the probes that `packets` answer, if any, with replies read at `at`. `answers`
    /// is scratch space (empty on return): the answers are delivered after the lock is released.
    fn dispatch<'p>(
        &self,
        packets: impl IntoIterator<Item = &'p [u8]>,
        at: Instant,
        answers: &mut Vec<Ended>,
    ) {
        {
            let mut guard = self.state();
            let state = &mut *guard;
            for packet in packets {
                let Some(segment) = Segment::parse(packet) else {
                    continue;
                };
                let key = Key {
                    local: segment.destination,
                    remote: segment.source,
                };
                let Some((id, verdict)) = state
                    .pending
                    .get(&key)
                    .and_then(|p| Some((p.id, segment.verdict(p.seq)?)))
                else {
                    continue;
                };
                if let Some(probe) = state.pending.remove(&key, id) {
                    if !probe.via_link
                        && let Some(target) = state.targets.get_mut(probe.waiter.home(), key.remote)
                    {
                        target.answered = true;
                    }
                    let latency = probe
                        .sent
                        .map_or(Duration::ZERO, |sent| at.saturating_duration_since(sent));
                    answers.push(probe.end(key, Answer::Reply { verdict, latency }));
                }
            }
        }
        self.deliver(answers);
    }

    /// Ends the probes whose deadline is not after `now` (see [`Registry::expire`]).
    fn expire(&self, now: Instant, answers: &mut Vec<Ended>) {
        self.state().pending.expire(now, answers);
        self.deliver(answers);
    }
}

/// A `probe` future's hold on its probe: the channel its result comes through. Dropped before
/// the result came, it withdraws the probe (and releases a port of its own, if it had one).
struct Waiting<'a> {
    shared: &'a Shared,
    /// The probe's id and deadline while it may still be pending.
    probe: Option<(u64, Instant)>,
    result: oneshot::Receiver<ProbeResult>,
}

impl Waiting<'_> {
    async fn result(&mut self) -> ProbeResult {
        let result = (&mut self.result).await;
        self.probe = None;
        // Only a prober gone with its tasks drops a probe's channel unsent.
        result.unwrap_or(ProbeResult::Local(Reason::Internal))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some((id, deadline)) = self.probe {
            // Closed first: a resend started after the withdrawal sees it and is not registered.
            self.result.close();
            self.shared.state().pending.withdraw(id, deadline);
        }
    }
}

/// When the reader stops (socket error, panic or abort), ends the probes still waiting (as
/// local failures) and refuses new ones, so none waits forever.
struct Closing<'a>(&'a Shared);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        let mut tokens = Vec::new();
        {
            let mut state = self.0.state();
            state.closed = true;
            let failure = ProbeResult::Local(Reason::Internal);
            tokens.extend(
                state
                    .pending
                    .drain()
                    .filter_map(|p| p.waiter.finish(failure)),
            );
        }
        self.0.finish_tokens(tokens);
    }
}

/// The sender task: sends the SYNs queued since it last ran together (one `sendmmsg` rather than
/// a `sendmsg` each).
async fn send_queued(shared: Arc<Shared>) {
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
            shared.send_batch(&mut batch).await;
        }
    }
}

/// The reader task: wakes when the filtered socket has replies, or when the earliest deadline
/// passes; reads the replies (in batches), completes probes, expires the late ones.
async fn read_replies(shared: Arc<Shared>) {
    let _closing = Closing(&shared);
    let mut bufs = [[0u8; REPLY_BYTES]; MAX_BATCH];
    let mut lens = [0usize; MAX_BATCH];
    let mut answers = Vec::with_capacity(MAX_BATCH);
    // Far enough never to fire, near enough not to overflow tokio's clock.
    let never = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let timer = tokio::time::sleep_until(never());
    tokio::pin!(timer);
    let mut timer_at: Option<Instant> = None;
    let mut last_read: Option<Instant> = None;
    loop {
        let armed = shared.state().pending.armed();
        if armed != timer_at {
            timer
                .as_mut()
                .reset(armed.map_or_else(never, tokio::time::Instant::from_std));
            timer_at = armed;
        }
        let mut burst = None;
        tokio::select! {
            biased;
            ready = shared.socket.readable() => {
                let mut ready = match ready {
                    Ok(ready) => ready,
                    Err(e) => {
                        tracing::error!("half-open probe reader stopped: {e}");
                        return;
                    }
                };
                shared.wakeups.fetch_add(1, Ordering::Relaxed);
                let mut total = 0;
                loop {
                    match ready.try_io(|fd| recv_many(fd.as_fd(), &mut bufs, &mut lens)) {
                        Ok(Ok(n)) => {
                            total += n;
                            let packets = bufs.iter().zip(&lens).take(n).map(|(b, &l)| &b[..l]);
                            shared.dispatch(packets, Instant::now(), &mut answers);
                            if n < MAX_BATCH {
                                // Drained. Clearing is a no-op if the reactor saw new data since.
                                ready.clear_ready();
                                break;
                            }
                        }
                        // Not expected on an unconnected raw socket without IP_RECVERR (ICMP
                        // errors are not reported to it). Readiness stays set: read again.
                        Ok(Err(e)) => {
                            tracing::warn!("half-open probe socket: {e}");
                            break;
                        }
                        Err(_would_block) => break,
                    }
                }
                burst = Some(total);
            }
            () = &mut timer => {
                timer_at = None;
                // Replies that arrived before the deadline count: read them first (without
                // touching the reactor's readiness, which the next turn consumes).
                drain(&shared, &mut bufs, &mut lens, &mut answers);
            }
            () = shared.rearm.notified() => {}
        }
        let now = Instant::now();
        shared.expire(now, &mut answers);
        if let Some(read) = burst {
            // Replies are coming fast: let a few more queue up before the next read.
            if read > 1 || last_read.is_some_and(|t| now.saturating_duration_since(t) < COALESCE) {
                tokio::time::sleep(COALESCE).await;
            }
            last_read = Some(now);
        }
    }
}

/// Reads what the socket holds now, without waiting nor going through the reactor.
fn drain(
    shared: &Shared,
    bufs: &mut [[u8; REPLY_BYTES]; MAX_BATCH],
    lens: &mut [usize; MAX_BATCH],
    answers: &mut Vec<Ended>,
) {
    while let Ok(n) = recv_many(shared.socket.get_ref().as_fd(), bufs, lens) {
        let packets = bufs.iter().zip(lens.iter()).take(n).map(|(b, &l)| &b[..l]);
        shared.dispatch(packets, Instant::now(), answers);
        if n < MAX_BATCH {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, os::unix::net::UnixDatagram};

    use futures_util::FutureExt as _;

    use super::wire::sample::{LOCAL, REMOTE, reply};
    use super::wire::{ACK, RST, SYN};
    use super::*;

    /// A prober state on an unrelated socket (nothing arrives on it), with `ports` as its pool,
    /// and `target` reachable from `source` without a route lookup.
    fn shared_with(ports: Vec<u16>, source: Ipv4Addr, targets: &[SocketAddrV4]) -> Shared {
        let (a, b) = UnixDatagram::pair().unwrap();
        drop(b);
        let shared = Shared::new(
            register(OwnedFd::from(a)).unwrap(),
            Pool::new(ports, Vec::new()),
            None,
        )
        .unwrap();
        // Each target known both by address (for `probe`) and at its index as the place (for
        // `start`: tokens `place << 32 | n`).
        for (place, &target) in targets.iter().enumerate() {
            let known = || Target {
                source: Some((source, Instant::now())),
                answered: false,
                link: None,
                link_at: None,
                next_port: 0,
                used: Instant::now(),
            };
            let mut state = shared.state();
            state.targets.entry(Home::Map, target, known);
            state.targets.entry(Home::Place(place), target, known);
        }
        shared
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A probe of `target` as `SynProber::probe` starts it (its SYN is not sent): its hold on
    /// the result, and its connection.
    fn probe(shared: &Shared, target: SocketAddrV4, deadline: Instant) -> (Waiting<'_>, Key) {
        let (waiting, syn) = shared.start_waiting(target, deadline, Instant::now());
        (waiting, syn.expect("started").key)
    }

    /// A probe's result, if it has one.
    fn result_of(waiting: &mut Waiting<'_>) -> Option<ProbeResult> {
        waiting.result().now_or_never()
    }

    /// A probe of `start_many` (its SYN is not sent): its connection.
    fn start(shared: &Shared, token: u64, target: SocketAddrV4, deadline: Instant) -> Key {
        let now = Instant::now();
        let syn = shared.start(Waiter::Token(token), target, deadline, None, now);
        syn.expect("started").key
    }

    /// Whether a probe holds a port of its own.
    fn owns_port(shared: &Shared, key: Key) -> bool {
        shared
            .state()
            .pending
            .get(&key)
            .unwrap()
            ._own_port
            .is_some()
    }

    fn seq(shared: &Shared, key: Key) -> u32 {
        shared.state().pending.get(&key).unwrap().seq
    }

    fn finished(shared: &Shared) -> Vec<(u64, ProbeResult)> {
        std::mem::take(&mut *shared.finished_queue())
    }

    fn is_empty(shared: &Shared) -> bool {
        shared.state().pending.is_empty()
    }

    /// Probes of `start_many`: results by token, with the meaning of `probe`'s; a stopped
    /// reader fails the ones waiting rather than leaving them forever.
    #[test]
    fn started_probes_finish_under_their_token() {
        let rt = runtime();
        let _rt = rt.enter();
        let other = SocketAddrV4::new(*REMOTE.ip(), 81);
        let third = SocketAddrV4::new(*REMOTE.ip(), 82);
        let shared = shared_with(vec![LOCAL.port()], *LOCAL.ip(), &[REMOTE, other, third]);
        let t0 = Instant::now();
        let first = start(&shared, 7, REMOTE, t0 + Duration::from_secs(10));
        // Tokens: the target's place (its index in `shared_with`) in the high half.
        let (eight, nine) = (1 << 32 | 8, 2 << 32 | 9);
        start(&shared, eight, other, t0 + Duration::from_secs(5));
        let third_key = start(&shared, nine, third, t0 + Duration::from_secs(60));
        assert_eq!(shared.state().pending.len(), 3);
        let mut scratch = Vec::new();
        shared.dispatch(
            [&reply(SYN | ACK, seq(&shared, first).wrapping_add(1), 0)[..]],
            t0,
            &mut scratch,
        );
        assert!(matches!(
            finished(&shared)[..],
            [(7, ProbeResult::Success { .. })]
        ));
        shared.expire(t0 + Duration::from_secs(5), &mut scratch);
        assert_eq!(finished(&shared), [(eight, ProbeResult::Timeout)]);
        assert!(shared.state().pending.contains(&third_key));
        drop(Closing(&shared));
        assert_eq!(
            finished(&shared),
            [(nine, ProbeResult::Local(Reason::Internal))]
        );
        // Once stopped, a new probe fails at once.
        let now = Instant::now();
        let deadline = t0 + Duration::from_secs(10);
        assert!(
            shared
                .start(Waiter::Token(10), REMOTE, deadline, None, now)
                .is_none()
        );
        assert_eq!(
            finished(&shared),
            [(10, ProbeResult::Local(Reason::Internal))]
        );
    }

    #[test]
    fn probes_due_together_share_one_deadline_entry() {
        let rt = runtime();
        let _rt = rt.enter();
        let shared = shared_with(vec![40000, 40001, 40002], *LOCAL.ip(), &[REMOTE]);
        let deadline = Instant::now() + Duration::from_secs(60);
        // Tokens of place 0 (REMOTE's).
        let probes: Vec<Key> = (0..3)
            .map(|token| start(&shared, token, REMOTE, deadline))
            .collect();
        assert_eq!(shared.state().pending.deadlines(), 1);
        let answer = |key: Key| {
            let mut r = reply(SYN | ACK, seq(&shared, key).wrapping_add(1), 0);
            r[22..24].copy_from_slice(&key.local.port().to_be_bytes());
            r
        };
        let (a, b) = (answer(probes[0]), answer(probes[1]));
        let mut scratch = Vec::new();
        shared.dispatch([&a[..], &b[..]], Instant::now(), &mut scratch);
        assert_eq!(shared.state().pending.live_at(deadline), 1);
        // The last one expires alone; the answered ones are not ended twice.
        shared.expire(deadline, &mut scratch);
        assert!(is_empty(&shared));
        // Never sent: no send time, no latency.
        let accepted = ProbeResult::Success {
            latency: Duration::ZERO,
        };
        assert_eq!(
            finished(&shared),
            [(0, accepted), (1, accepted), (2, ProbeResult::Timeout)]
        );
        // Answering every probe of a deadline removes its entry at once. (A `probe` future's:
        // the timeout above made place 0 forget REMOTE's source.)
        let later = deadline + Duration::from_secs(1);
        let (_waiting, key) = probe(&shared, REMOTE, later);
        let c = answer(key);
        shared.dispatch([&c[..]], Instant::now(), &mut scratch);
        assert!(is_empty(&shared));
    }

    #[test]
    fn dispatch_completes_only_the_matching_probe() {
        let rt = runtime();
        let _rt = rt.enter();
        let shared = shared_with(vec![LOCAL.port()], *LOCAL.ip(), &[REMOTE]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut waiting, key) = probe(&shared, REMOTE, deadline);
        assert_eq!(
            key,
            Key {
                local: LOCAL,
                remote: REMOTE
            }
        );
        assert!(
            shared.state().pending.get(&key).unwrap().resend,
            "a first SYN may be resent"
        );
        let seq = seq(&shared, key);
        let mut scratch = Vec::new();
        let now = Instant::now();
        let wrong_ack = reply(SYN | ACK, seq, 0);
        let mut other_port = reply(SYN | ACK, seq.wrapping_add(1), 0);
        other_port[22..24].copy_from_slice(&40001u16.to_be_bytes());
        shared.dispatch([&wrong_ack[..], &other_port[..]], now, &mut scratch);
        assert_eq!(result_of(&mut waiting), None, "nothing matched yet");
        shared.dispatch(
            [&reply(RST | ACK, seq.wrapping_add(1), 0)[..]],
            now,
            &mut scratch,
        );
        assert_eq!(
            result_of(&mut waiting),
            Some(ProbeResult::TcpFailure(Reason::Refused))
        );
        assert!(is_empty(&shared), "answered probes leave the map");
        drop(waiting);
        drop(probe(&shared, REMOTE, deadline));
        assert!(is_empty(&shared), "a dropped probe leaves the map");
    }

    #[test]
    fn expired_probes_end_and_the_timer_follows_the_earliest_deadline() {
        let rt = runtime();
        let _rt = rt.enter();
        let other = SocketAddrV4::new(*REMOTE.ip(), 81);
        let shared = shared_with(vec![LOCAL.port()], *LOCAL.ip(), &[REMOTE, other]);
        let t0 = Instant::now();
        let (d1, d2) = (t0 + Duration::from_secs(10), t0 + Duration::from_secs(20));
        let (mut late, late_key) = probe(&shared, other, d2);
        assert_eq!(shared.state().pending.armed(), Some(d2));
        let (mut early, _) = probe(&shared, REMOTE, d1);
        assert_eq!(
            shared.state().pending.armed(),
            Some(d1),
            "an earlier deadline moves the timer"
        );
        let mut scratch = Vec::new();
        shared.expire(d1 - Duration::from_millis(1), &mut scratch);
        assert_eq!(result_of(&mut early), None);
        shared.expire(d1, &mut scratch);
        assert_eq!(result_of(&mut early), Some(ProbeResult::Timeout));
        assert_eq!(result_of(&mut late), None);
        assert_eq!(
            shared.state().pending.armed(),
            Some(d2),
            "set for the next deadline"
        );
        // An answered probe leaves its deadline: the timer, once run out, sleeps.
        let ack = seq(&shared, late_key).wrapping_add(1);
        let mut answer = reply(SYN | ACK, ack, 0);
        answer[20..22].copy_from_slice(&81u16.to_be_bytes());
        shared.dispatch([&answer[..]], t0, &mut scratch);
        assert!(matches!(
            result_of(&mut late),
            Some(ProbeResult::Success { .. })
        ));
        shared.expire(d2, &mut scratch);
        assert_eq!(shared.state().pending.armed(), None);
        drop((early, late));
        assert!(is_empty(&shared));
    }

    #[test]
    fn targets_walk_the_pool_and_share_its_ports() {
        let rt = runtime();
        let _rt = rt.enter();
        let local = Ipv4Addr::LOCALHOST;
        let (a, b) = (
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 80),
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 3), 80),
        );
        let shared = shared_with(vec![41000, 41001, 41002], local, &[a, b]);
        let deadline = Instant::now() + Duration::from_secs(60);
        // One after the other, a target takes the next port each time.
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (_, key) = probe(&shared, a, deadline);
            seen.push(key.local.port());
        }
        assert_eq!(seen, [41000, 41001, 41002, 41000]);
        // At once: distinct ports towards one target; another target may use the same ones.
        let held: Vec<_> = (0..3).map(|_| probe(&shared, a, deadline)).collect();
        let mut ports: Vec<u16> = held.iter().map(|(_, key)| key.local.port()).collect();
        ports.sort_unstable();
        assert_eq!(ports, [41000, 41001, 41002]);
        let to_b = probe(&shared, b, deadline);
        assert_eq!(to_b.1.local.port(), 41000);
        // The pool is busy towards `a`: the next probe reserves a port of its own.
        let extra = probe(&shared, a, deadline);
        assert!(!(41000..=41002).contains(&extra.1.local.port()));
        assert!(owns_port(&shared, extra.1));
        assert_eq!(shared.state().pending.len(), 5);
        drop((held, to_b, extra));
        assert!(is_empty(&shared));
    }

    #[test]
    fn without_a_pool_each_probe_reserves_its_port() {
        let rt = runtime();
        let _rt = rt.enter();
        let target = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 80);
        let shared = shared_with(Vec::new(), Ipv4Addr::LOCALHOST, &[target]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let a = probe(&shared, target, deadline);
        let b = probe(&shared, target, deadline);
        assert!(owns_port(&shared, a.1) && owns_port(&shared, b.1));
        assert_ne!(a.1.local.port(), b.1.local.port());
        drop((a, b));
        assert!(is_empty(&shared));
    }

    #[test]
    fn a_stopped_reader_fails_waiting_and_new_probes() {
        let rt = runtime();
        let _rt = rt.enter();
        let shared = shared_with(vec![LOCAL.port()], *LOCAL.ip(), &[REMOTE]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut waiting, _) = probe(&shared, REMOTE, deadline);
        drop(Closing(&shared));
        let failed = Some(ProbeResult::Local(Reason::Internal));
        assert_eq!(result_of(&mut waiting), failed);
        let (mut late, syn) = shared.start_waiting(REMOTE, deadline, Instant::now());
        assert!(syn.is_none());
        assert_eq!(result_of(&mut late), failed);
    }

    /// A SYN that cannot be sent is sent once more after a fresh route lookup, under the same
    /// probe; if that one cannot be sent either, the probe fails. The same for both waiters.
    #[test]
    fn an_unsent_syn_is_sent_once_more() {
        let rt = runtime();
        let _rt = rt.enter();
        // On loopback, so that the route lookup of the resend finds a source without privileges.
        let target = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 80);
        let shared = shared_with(vec![LOCAL.port()], *LOCAL.ip(), &[target]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let unsent = |key: Key| {
            let id = shared.state().pending.get(&key).unwrap().id;
            let probe = shared.state().pending.remove(&key, id).unwrap();
            shared.deliver(&mut vec![
                probe.end(key, Answer::Unsent(libc::EADDRNOTAVAIL)),
            ]);
            id
        };
        let resent = || {
            let mut outbox = shared.outbox.lock().unwrap();
            assert_eq!(outbox.len(), 1, "queued again");
            outbox.pop().unwrap()
        };
        let failure = from_io(&io::Error::from_raw_os_error(libc::EADDRNOTAVAIL));

        let key = start(&shared, 7, target, deadline);
        let id = unsent(key);
        let again = resent();
        assert_eq!(again.id, id, "the same probe");
        assert_eq!(
            *again.key.local.ip(),
            Ipv4Addr::LOCALHOST,
            "from a fresh lookup"
        );
        assert!(!shared.state().pending.get(&again.key).unwrap().resend);
        assert!(finished(&shared).is_empty());
        unsent(again.key);
        assert_eq!(finished(&shared), [(7, failure)]);
        assert!(is_empty(&shared));

        let (mut waiting, key) = probe(&shared, target, deadline);
        unsent(key);
        let again = resent();
        assert_eq!(result_of(&mut waiting), None);
        unsent(again.key);
        assert_eq!(result_of(&mut waiting), Some(failure));
        // A `probe` future dropped before its resend: nothing is sent, nothing stays.
        let (waiting, key) = probe(&shared, target, deadline);
        let id = shared.state().pending.get(&key).unwrap().id;
        let probe = shared.state().pending.remove(&key, id).unwrap();
        drop(waiting);
        shared.deliver(&mut vec![
            probe.end(key, Answer::Unsent(libc::EADDRNOTAVAIL)),
        ]);
        assert!(shared.outbox.lock().unwrap().is_empty());
        assert!(is_empty(&shared));
    }
}
