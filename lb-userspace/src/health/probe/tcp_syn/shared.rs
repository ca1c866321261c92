//! What the prober's probes and tasks share, and a probe's course through it: where its SYN
//! leaves from, its registration, what its answer means (with one resend of a SYN that could not
//! be sent), and the hand-over of its result.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::OwnedFd,
    sync::{Mutex, MutexGuard, PoisonError, atomic::AtomicU64},
    time::{Duration, Instant},
};

use tokio::{
    io::unix::AsyncFd,
    sync::{Notify, oneshot},
};

use super::pending::{Answer, Ended, Key, Pending, Registry, Waiter};
use super::socket::{Routes, reserve_port};
use super::targets::{Home, Path, Pool, Target, Targets};
use super::wire::{RST_LEN, SYN_LEN, Segment, Verdict, initial_sequence, rst_segment, syn_segment};
use crate::health::outcome::{Reason, from_io};
use crate::health::probe::link::{Link, Links};
use crate::health::probe::sys::default_ttl;
use crate::health::probe::{ProbeResult, Via};

/// What the probes and the reader and sender tasks share.
pub(super) struct Shared {
    /// The raw socket IPv4 SYNs take the kernel's path through (it receives nothing: IPv4
    /// replies come through the reader's ring).
    pub(super) socket: AsyncFd<OwnedFd>,
    /// The TTL of the IPv4 headers built for that socket.
    pub(super) ttl: u8,
    /// The raw socket of IPv6 probes; None on a host without IPv6 (its IPv6 probes then fail
    /// as local failures).
    pub(super) socket6: Option<AsyncFd<OwnedFd>>,
    state: Mutex<State>,
    /// Tells the reader that a probe's deadline is earlier than its timer.
    pub(super) rearm: Notify,
    /// SYNs waiting for the sender task, and the signal that the first one arrived.
    pub(super) outbox: Mutex<Vec<Queued>>,
    pub(super) flush: Notify,
    /// The pooled source ports.
    pool: Pool,
    /// Looks up source addresses.
    routes: Routes,
    /// The link-layer path for targets that answered (see [`crate::health::probe::link`]);
    /// None if its sockets could not be opened (then every SYN takes the kernel's path).
    pub(super) links: Option<Links>,
    pub(super) wakeups: AtomicU64,
    /// SYNs sent through the link-layer path, and through the raw socket.
    pub(super) sent_link: AtomicU64,
    pub(super) sent_kernel: AtomicU64,
    /// Results of the probes of `start_many`, and the signal that some are there.
    finished: Mutex<Vec<(u64, ProbeResult)>>,
    pub(super) finished_ready: Notify,
}

/// Everything behind the one lock.
pub(super) struct State {
    pub(super) pending: Registry,
    pub(super) targets: Targets,
    /// The reader has stopped: no answer can come any more.
    closed: bool,
}

/// Where a probe's SYN leaves from (see [`Shared::place`]).
struct Placed {
    local: SocketAddr,
    /// The link-layer path, if the SYN takes it.
    link: Option<Link>,
    /// A port reserved for this probe alone, if the pool had none free towards the target.
    own_port: Option<OwnedFd>,
}

/// A SYN waiting for the sender task (or the reset of a probe through the tunnel).
pub(super) struct Queued {
    pub(super) key: Key,
    pub(super) id: u64,
    /// The TCP segment, its first `len` bytes.
    pub(super) segment: [u8; SYN_LEN],
    pub(super) len: usize,
    /// The link-layer path to send it on, if still current when it is sent.
    pub(super) link: Option<Link>,
    /// The socket mark it leaves with (0: none; a probe through the tunnel's otherwise).
    pub(super) mark: u32,
    /// A reset after the probe's answer: sent whatever became of the probe, never resent.
    pub(super) reset: bool,
}

impl Shared {
    pub(super) fn new(
        socket: AsyncFd<OwnedFd>,
        socket6: Option<AsyncFd<OwnedFd>>,
        pool: Pool,
        links: Option<Links>,
    ) -> io::Result<Self> {
        Ok(Self {
            socket,
            ttl: default_ttl(),
            socket6,
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

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a probe of `target` for `waiter`: registers it and gives its SYN to queue. A
    /// probe that cannot start gets its failure at once (None). `resend_of`: the id of the probe
    /// whose SYN could not be sent, if this is its resend.
    #[cfg(test)]
    pub(super) fn start(
        &self,
        waiter: Waiter,
        target: SocketAddr,
        deadline: Instant,
        resend_of: Option<u64>,
        now: Instant,
    ) -> Option<Queued> {
        self.start_via(waiter, target, None, deadline, resend_of, now)
    }

    /// [`Shared::start`], through the tunnel when `via` says so: the SYN takes the kernel's
    /// path with the tunnel's mark, from the tunnel's source.
    pub(super) fn start_via(
        &self,
        waiter: Waiter,
        target: SocketAddr,
        via: Option<Via>,
        deadline: Instant,
        resend_of: Option<u64>,
        now: Instant,
    ) -> Option<Queued> {
        if target.is_ipv6() && self.socket6.is_none() {
            self.finish(waiter, ProbeResult::Local(Reason::NoProber));
            return None;
        }
        let seq = initial_sequence();
        let home = waiter.home();
        let (mut state, placed) = match self.place(home, target, via, now) {
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
            via,
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
            segment: syn_segment(key.local, target, seq),
            len: SYN_LEN,
            link: placed.link,
            mark: via.map_or(0, |v| v.mark),
            reset: false,
        })
    }

    /// Starts a probe for a `probe` future: its hold on the result, and its SYN to queue.
    #[cfg(test)]
    pub(super) fn start_waiting(
        &self,
        target: SocketAddr,
        deadline: Instant,
        now: Instant,
    ) -> (Waiting<'_>, Option<Queued>) {
        self.start_waiting_via(target, None, deadline, now)
    }

    /// [`Shared::start_waiting`], through the tunnel when `via` says so.
    pub(super) fn start_waiting_via(
        &self,
        target: SocketAddr,
        via: Option<Via>,
        deadline: Instant,
        now: Instant,
    ) -> (Waiting<'_>, Option<Queued>) {
        let (done, result) = oneshot::channel();
        let syn = self.start_via(Waiter::Future(done), target, via, deadline, None, now);
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
    /// current link to it is known (looked up now if not, at most once per `ROUTE_TTL` when
    /// there is none); the kernel's path otherwise, always for an IPv6 target (the link-layer
    /// path builds IPv4 headers only), and always through the tunnel (`via`: the TC program
    /// must see the SYN, and the link-layer path's frames carry no mark). Through the tunnel
    /// the source is the tunnel's, when it names one.
    fn place(
        &self,
        home: Home,
        target: SocketAddr,
        via: Option<Via>,
        mut now: Instant,
    ) -> io::Result<(MutexGuard<'_, State>, Placed)> {
        let mut own: Option<(OwnedFd, SocketAddr)> = None;
        let target_v4 = match target {
            SocketAddr::V4(v4) if via.is_none() => Some(v4),
            _ => None,
        };
        let fixed_source = via.and_then(|v| v.source);
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
                .zip(target_v4)
                .map(|(links, v4)| (links, v4, entry.path(links, now)));
            let link = match path {
                Some((_, _, Path::Link(link))) => Some(link),
                Some((links, v4, Path::LookUp)) => {
                    drop(guard);
                    let found = links.lookup(*v4.ip()).unwrap_or_else(|e| {
                        tracing::debug!(%target, "link-layer path lookup failed: {e}");
                        None
                    });
                    let at = Instant::now();
                    if let Some(t) = self.state().targets.get_mut(home, target) {
                        t.learn_link(found, at);
                    }
                    continue;
                }
                Some((_, _, Path::Kernel)) | None => None,
            };
            let source = match (&link, fixed_source.or_else(|| entry.source(now))) {
                (Some(link), _) => IpAddr::V4(link.source),
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
                Some((_, addr)) if addr.ip() == source => Some(*addr),
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
    pub(super) fn enqueue(&self, syn: Queued) {
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        outbox.push(syn);
        if outbox.len() == 1 {
            self.flush.notify_one();
        }
    }

    /// Hands SYNs to the sender task, waking it if the outbox was empty.
    pub(super) fn enqueue_many(&self, mut syns: Vec<Queued>) {
        if syns.is_empty() {
            return;
        }
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        let first = outbox.is_empty();
        if first {
            // Taken whole rather than copied: a slot's batch is some 500 SYNs of ~160 bytes.
            std::mem::swap(&mut *outbox, &mut syns);
            self.flush.notify_one();
        } else {
            outbox.append(&mut syns);
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
            let mut done = self.finished_queue();
            if done.is_empty() {
                std::mem::swap(&mut *done, &mut tokens);
            } else {
                done.append(&mut tokens);
            }
            self.finished_ready.notify_one();
        }
    }

    /// What an answer means for a probe of `target`; `Err(errno)` when its SYN could not be sent
    /// (the caller may resend once).
    fn result_of(
        &self,
        home: Home,
        target: SocketAddr,
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
    fn local_failure(&self, home: Home, target: SocketAddr, e: &io::Error) -> ProbeResult {
        tracing::warn!(%target, "half-open probe failed locally: {e}");
        self.forget_route(home, target);
        from_io(e)
    }

    pub(super) fn finished_queue(&self) -> MutexGuard<'_, Vec<(u64, ProbeResult)>> {
        self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns ended probes into results and hands them to their waiters (`ended` is emptied);
    /// a probe whose SYN could not be sent is sent once more first. Call without the state lock.
    pub(super) fn deliver(&self, ended: &mut Vec<Ended>) {
        let mut results = Vec::with_capacity(ended.len());
        let mut again = Vec::new();
        for probe in ended.drain(..) {
            let (home, target) = (probe.waiter.home(), probe.key.remote);
            let result = match self.result_of(home, target, probe.answer) {
                Ok(result) => result,
                // A cached source may have gone (address removed), or the link-layer path
                // failed: look the route up again and send once more, on the kernel's path.
                Err(_) if probe.resend => {
                    self.forget_route(home, target);
                    let (waiter, deadline, via) = (probe.waiter, probe.deadline, probe.via);
                    let resend = Some(probe.id);
                    let now = Instant::now();
                    again.extend(self.start_via(waiter, target, via, deadline, resend, now));
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

    /// Drops the cached source and link of `target`: its next probe looks the route up again
    /// and takes the kernel's path until it is answered.
    fn forget_route(&self, home: Home, target: SocketAddr) {
        if let Some(t) = self.state().targets.get_mut(home, target) {
            t.forget_route();
        }
    }

    /// Completes the probes that IPv4 `packets` (from their IP header) answer, if any, with
    /// replies read at `at` (see [`Shared::dispatch_segments`]).
    #[cfg(test)]
    pub(super) fn dispatch<'p>(
        &self,
        packets: impl IntoIterator<Item = &'p [u8]>,
        at: Instant,
        answers: &mut Vec<Ended>,
    ) {
        let segments = packets
            .into_iter()
            .filter_map(|p| Some((Segment::parse(p)?, at)));
        self.dispatch_segments(segments, answers);
    }

    /// Completes the probes that `segments` (of either family, each with when it arrived)
    /// answer, if any. `answers` is scratch space (empty on return): the answers are delivered
    /// after the lock is released.
    pub(super) fn dispatch_segments(
        &self,
        segments: impl IntoIterator<Item = (Segment, Instant)>,
        answers: &mut Vec<Ended>,
    ) {
        let mut resets = Vec::new();
        {
            let mut guard = self.state();
            let state = &mut *guard;
            for (segment, at) in segments {
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
                    // Through the tunnel the kernel's own reset of the SYN+ACK goes to the
                    // backend's address unencapsulated (it carries no mark), which leaves the
                    // half-open connection on the VIP: reset that one through the tunnel.
                    if let (Some(via), Verdict::Accepted) = (probe.via, verdict) {
                        resets.push(Queued {
                            key,
                            id,
                            segment: rst_segment(key.local, key.remote, probe.seq.wrapping_add(1)),
                            len: RST_LEN,
                            link: None,
                            mark: via.mark,
                            reset: true,
                        });
                    }
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
        self.enqueue_many(resets);
        self.deliver(answers);
    }

    /// Ends the probes whose deadline is not after `now` (see [`Registry::expire`]).
    pub(super) fn expire(&self, now: Instant, answers: &mut Vec<Ended>) {
        self.state().pending.expire(now, answers);
        self.deliver(answers);
    }
}

/// A `probe` future's hold on its probe: the channel its result comes through. Dropped before
/// the result came, it withdraws the probe (and releases a port of its own, if it had one).
pub(super) struct Waiting<'a> {
    shared: &'a Shared,
    /// The probe's id and deadline while it may still be pending.
    probe: Option<(u64, Instant)>,
    result: oneshot::Receiver<ProbeResult>,
}

impl Waiting<'_> {
    pub(super) async fn result(&mut self) -> ProbeResult {
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
pub(super) struct Closing<'a>(pub(super) &'a Shared);

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

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, os::unix::net::UnixDatagram};

    use futures_util::FutureExt as _;

    use super::super::wire::sample::{LOCAL, LOCAL6, REMOTE, REMOTE6, reply, reply6};
    use super::super::wire::{ACK, RST, SYN};
    use super::*;
    use crate::health::probe::sys::register;

    /// A socket nothing arrives on, standing in for a raw one.
    fn unrelated_socket() -> AsyncFd<OwnedFd> {
        let (a, b) = UnixDatagram::pair().unwrap();
        drop(b);
        register(OwnedFd::from(a)).unwrap()
    }

    /// A prober state on unrelated sockets (nothing arrives on them), with `ports` as its pool,
    /// and `targets` reachable without a route lookup: the IPv4 ones from `source`, the IPv6
    /// ones from LOCAL6's address.
    fn shared_with(ports: Vec<u16>, source: Ipv4Addr, targets: &[SocketAddr]) -> Shared {
        let shared = Shared::new(
            unrelated_socket(),
            Some(unrelated_socket()),
            Pool::new(ports, Vec::new()),
            None,
        )
        .unwrap();
        // Each target known both by address (for `probe`) and at its index as the place (for
        // `start`: tokens `place << 32 | n`).
        for (place, &target) in targets.iter().enumerate() {
            let source = match target {
                SocketAddr::V4(_) => IpAddr::V4(source),
                SocketAddr::V6(_) => IpAddr::V6(*LOCAL6.ip()),
            };
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

    /// LOCAL's address.
    fn local_ip() -> Ipv4Addr {
        match LOCAL {
            SocketAddr::V4(local) => *local.ip(),
            SocketAddr::V6(_) => unreachable!("an IPv4 sample"),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A probe of `target` as `SynProber::probe` starts it (its SYN is not sent): its hold on
    /// the result, and its connection.
    fn probe(shared: &Shared, target: SocketAddr, deadline: Instant) -> (Waiting<'_>, Key) {
        let (waiting, syn) = shared.start_waiting(target, deadline, Instant::now());
        (waiting, syn.expect("started").key)
    }

    /// A probe's result, if it has one.
    fn result_of(waiting: &mut Waiting<'_>) -> Option<ProbeResult> {
        waiting.result().now_or_never()
    }

    /// A probe of `start_many` (its SYN is not sent): its connection.
    fn start(shared: &Shared, token: u64, target: SocketAddr, deadline: Instant) -> Key {
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
        let other = SocketAddr::new(REMOTE.ip(), 81);
        let third = SocketAddr::new(REMOTE.ip(), 82);
        let shared = shared_with(vec![LOCAL.port()], local_ip(), &[REMOTE, other, third]);
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
        let shared = shared_with(vec![40000, 40001, 40002], local_ip(), &[REMOTE]);
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
        let shared = shared_with(vec![LOCAL.port()], local_ip(), &[REMOTE]);
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
        let other = SocketAddr::new(REMOTE.ip(), 81);
        let shared = shared_with(vec![LOCAL.port()], local_ip(), &[REMOTE, other]);
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
            SocketAddr::from((Ipv4Addr::new(10, 0, 9, 2), 80)),
            SocketAddr::from((Ipv4Addr::new(10, 0, 9, 3), 80)),
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
        let target = SocketAddr::from((Ipv4Addr::new(10, 0, 9, 2), 80));
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
        let shared = shared_with(vec![LOCAL.port()], local_ip(), &[REMOTE]);
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
        let target = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 2), 80));
        let shared = shared_with(vec![LOCAL.port()], local_ip(), &[target]);
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
            again.key.local.ip(),
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

    /// IPv6 and IPv4 probes side by side: each matched by its own connection, on one pool of
    /// ports (a pooled port serves both families at once).
    #[test]
    fn ipv6_and_ipv4_probes_share_the_pool_and_get_their_own_answers() {
        let rt = runtime();
        let _rt = rt.enter();
        let remote6 = SocketAddr::V6(REMOTE6);
        let shared = shared_with(vec![LOCAL.port()], local_ip(), &[REMOTE, remote6]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut v4, key4) = probe(&shared, REMOTE, deadline);
        let (mut v6, key6) = probe(&shared, remote6, deadline);
        assert_eq!(
            key6,
            Key {
                local: SocketAddr::V6(LOCAL6),
                remote: remote6
            }
        );
        assert_eq!(
            key4.local.port(),
            key6.local.port(),
            "one pooled port, both families"
        );
        let (seq4, seq6) = (seq(&shared, key4), seq(&shared, key6));
        let mut scratch = Vec::new();
        let now = Instant::now();
        let segment6 =
            |flags, ack| Segment::parse6(&reply6(flags, ack), *REMOTE6.ip(), *LOCAL6.ip()).unwrap();
        // The IPv4 probe's ack on the IPv6 connection, and an answer from another address (the
        // IPv4 one's segment with the IPv6 probe's ack): nothing.
        shared.dispatch_segments(
            [(segment6(SYN | ACK, seq4.wrapping_add(1)), now)],
            &mut scratch,
        );
        shared.dispatch(
            [&reply(SYN | ACK, seq6.wrapping_add(1), 0)[..]],
            now,
            &mut scratch,
        );
        assert_eq!(result_of(&mut v4), None);
        assert_eq!(result_of(&mut v6), None);
        shared.dispatch_segments(
            [(segment6(RST | ACK, seq6.wrapping_add(1)), now)],
            &mut scratch,
        );
        assert_eq!(
            result_of(&mut v6),
            Some(ProbeResult::TcpFailure(Reason::Refused))
        );
        assert_eq!(result_of(&mut v4), None);
        shared.dispatch(
            [&reply(SYN | ACK, seq4.wrapping_add(1), 0)[..]],
            now,
            &mut scratch,
        );
        assert!(matches!(
            result_of(&mut v4),
            Some(ProbeResult::Success { .. })
        ));
        assert!(is_empty(&shared));
    }

    /// Without an IPv6 socket (a host without IPv6), an IPv6 probe fails at once as a local
    /// failure; IPv4 probes are not affected.
    #[test]
    fn without_an_ipv6_socket_ipv6_probes_are_local_failures() {
        let rt = runtime();
        let _rt = rt.enter();
        let shared = Shared::new(
            unrelated_socket(),
            None,
            Pool::new(vec![LOCAL.port()], Vec::new()),
            None,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut waiting, syn) =
            shared.start_waiting(SocketAddr::V6(REMOTE6), deadline, Instant::now());
        assert!(syn.is_none());
        assert_eq!(
            result_of(&mut waiting),
            Some(ProbeResult::Local(Reason::NoProber))
        );
        let now = Instant::now();
        assert!(
            shared
                .start(
                    Waiter::Token(3),
                    SocketAddr::V6(REMOTE6),
                    deadline,
                    None,
                    now
                )
                .is_none()
        );
        assert_eq!(
            finished(&shared),
            [(3, ProbeResult::Local(Reason::NoProber))]
        );
        assert!(is_empty(&shared));
    }
}
