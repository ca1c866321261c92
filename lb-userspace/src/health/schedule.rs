//! The probe scheduler: one task runs every active check of the daemon. Targets wait in a
//! timing wheel (`Wheel`) under the slot they are due in; the task wakes at most once per
//! [`SLOT`], starts every probe due by then and polls the probes in flight itself, so a probe
//! costs no task, timer or wake-up of its own (issue 4: 10,000 targets probed every second must
//! stay cheap). A probe starts up to one slot after it is due; probes due in the same slot leave
//! together, which also lets the half-open prober send their SYNs in one `sendmmsg`.
//!
//! The task owns each target's [`Window`]; what other parts of the daemon read or set (status,
//! reporting, pausing) is shared per target through `TargetShared`.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures_util::{FutureExt as _, StreamExt as _, stream::FuturesUnordered};
use tokio::sync::{mpsc, watch};

use crate::config::{CheckKind, WindowSettings};

use super::{
    prefetch,
    probe::{ProbeResult, Via, http::HttpCheck},
    probers::{Probe, Probers, probe},
    target::{ProbeKey, TargetShared, Verdict},
    wheel::Wheel,
    window::{HealthState, Window},
};

/// The scheduler's granularity: it wakes at most once per slot.
pub const SLOT: Duration = Duration::from_millis(10);

use crate::resources::MAX_PROBES_IN_FLIGHT;

/// The longest pause the wheel must hold: the longest interval (300 s) with its jitter, or a
/// phase. Sizes the wheel (32,768 slots).
const MAX_PAUSE: Duration = Duration::from_secs(320);

/// How often a paused target (traffic-triggered probing, no traffic) looks again whether it
/// should probe, at most.
const PAUSED_RECHECK: Duration = Duration::from_secs(1);

/// Changes to the set of targets, from [`super::checker::Checker::update`].
pub(super) enum Command {
    Add {
        key: Arc<ProbeKey>,
        /// `Initializing`, or `Unhealthy` for a verdict kept from before a restart.
        state: HealthState,
        shared: Arc<TargetShared>,
        /// The request of http and https checks, built once.
        http: Option<Arc<HttpCheck>>,
        /// Through the tunnel: the probes' mark and source.
        via: Option<Via>,
    },
    Remove(Arc<ProbeKey>),
}

/// A target the scheduler runs: what a half-open probe's start and result read, in two cache
/// lines (with 50,000 targets a target is seldom in the CPU's cache when its probe starts or
/// ends, and each line more is a miss more); the rest is in `cold`.
#[repr(align(64))]
struct Target {
    /// Unique per scheduler: tells this target from a later one in the same place (until 2^32
    /// targets were added).
    id: u32,
    addr: SocketAddr,
    kind: CheckKind,
    /// Probes go through the tunnel (`cold.via`).
    tunnel: bool,
    shared: Arc<TargetShared>,
    window: Window,
    cold: Box<Cold>,
}

/// What a target's probes seldom read.
struct Cold {
    key: Arc<ProbeKey>,
    http: Option<Arc<HttpCheck>>,
    via: Option<Via>,
}

impl Target {
    fn via(&self) -> Option<Via> {
        if self.tunnel { self.cold.via } else { None }
    }
}

/// A probe in flight and the target it is for.
struct Tagged {
    place: usize,
    id: u32,
    probe: Probe,
}

impl Future for Tagged {
    type Output = (usize, u32, ProbeResult);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (place, id) = (self.place, self.id);
        self.probe
            .as_mut()
            .poll(cx)
            .map(|result| (place, id, result))
    }
}

pub(super) struct Scheduler {
    probers: Arc<Probers>,
    verdicts: mpsc::UnboundedSender<Verdict>,
    epoch: Instant,
    targets: Vec<Option<Target>>,
    free: Vec<usize>,
    index: HashMap<Arc<ProbeKey>, usize>,
    next_id: u32,
    /// One copy of each check's window settings, shared by its targets' windows.
    settings: HashSet<Arc<WindowSettings>>,
    /// `(place, target id)` filed by the slot they are due in; entries of removed targets are
    /// skipped.
    wheel: Wheel<(usize, u32)>,
    /// Taken from the wheel, waiting for a place in flight.
    due: VecDeque<(usize, u32)>,
    /// Scratch space for taking from the wheel.
    taken: Vec<(usize, u32)>,
    in_flight: FuturesUnordered<Tagged>,
    /// Half-open probes go to the prober in one batch per turn, without a future each
    /// ([`super::probe::tcp_syn::SynProber::start_many`]): the batch being gathered, the
    /// results taken, and how many are out.
    syn_batch: Vec<(u64, SocketAddr, Duration, Option<Via>)>,
    syn_done: Vec<(u64, ProbeResult)>,
    syn_in_flight: usize,
    /// xorshift state for the jitter.
    random: u64,
}

impl Scheduler {
    pub(super) fn new(
        probers: Arc<Probers>,
        verdicts: mpsc::UnboundedSender<Verdict>,
        epoch: Instant,
    ) -> Self {
        use std::hash::{BuildHasher as _, RandomState};
        Self {
            probers,
            verdicts,
            epoch,
            targets: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            next_id: 0,
            settings: HashSet::new(),
            wheel: Wheel::new((MAX_PAUSE.as_millis() / SLOT.as_millis()) as usize),
            due: VecDeque::new(),
            taken: Vec::new(),
            in_flight: FuturesUnordered::new(),
            syn_batch: Vec::new(),
            syn_done: Vec::new(),
            syn_in_flight: 0,
            // Seeded from the OS (std's hasher keys); never zero.
            random: RandomState::new().hash_one(epoch) | 1,
        }
    }

    /// Runs until `stop` turns true, the command channel closes or the daemon stops taking
    /// verdicts.
    pub(super) async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut stop: watch::Receiver<bool>,
    ) {
        // Far enough never to fire, near enough not to overflow tokio's clock.
        let never = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
        let timer = tokio::time::sleep_until(never());
        tokio::pin!(timer);
        let mut armed: Option<Instant> = None;
        let probers = self.probers.clone();
        loop {
            self.start_due(self.now());
            // While the in-flight bound is reached, a completion wakes the task.
            let wake = (self.out() < MAX_PROBES_IN_FLIGHT)
                .then(|| self.wheel.next())
                .flatten()
                .map(|slot| self.slot_time(slot));
            if wake != armed {
                timer
                    .as_mut()
                    .reset(wake.map_or_else(never, tokio::time::Instant::from_std));
                armed = wake;
            }
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                command = commands.recv() => match command {
                    Some(command) => {
                        self.command(command);
                        // Every command queued in one turn: a config of 50,000 targets comes
                        // as 50,000 commands, and a turn also starts the probes due.
                        while let Ok(command) = commands.try_recv() {
                            self.command(command);
                        }
                    }
                    None => return,
                },
                Some(first) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    // Take every probe that has finished, not one per turn of the loop.
                    let now = self.now();
                    let mut done = Some(first);
                    while let Some((place, id, result)) = done {
                        if !self.finish(place, id, result, now) {
                            return; // the daemon is shutting down
                        }
                        done = self.in_flight.next().now_or_never().flatten();
                    }
                }
                () = syn_finished(&probers, &mut self.syn_done), if self.syn_in_flight > 0 => {
                    let mut done = std::mem::take(&mut self.syn_done);
                    self.syn_in_flight -= done.len();
                    self.prefetch(done.iter().map(|&(token, _)| (token >> 32) as usize));
                    // One clock read for the batch: the results came in together.
                    let now = self.now();
                    for (token, result) in done.drain(..) {
                        if !self.finish_token(token, result, now) {
                            return;
                        }
                    }
                    self.syn_done = done; // keeps its allocation
                }
                _ = &mut timer, if armed.is_some() => armed = None,
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Add {
                key,
                state,
                shared,
                http,
                via,
            } => {
                if self.index.contains_key(&key) {
                    return;
                }
                let id = self.next_id;
                self.next_id = self.next_id.wrapping_add(1);
                let settings = self.settings(key.check.window);
                let window = match state {
                    HealthState::Unhealthy => Window::restored_unhealthy(settings),
                    _ => Window::new(settings),
                };
                // A fixed phase per target spreads the probes over the interval.
                let now = self.now();
                let due = now.elapsed + phase(key.target, key.check.window.interval);
                let target = Target {
                    id,
                    addr: key.target,
                    kind: key.check.kind,
                    tunnel: via.is_some(),
                    shared,
                    window,
                    cold: Box::new(Cold {
                        key: key.clone(),
                        http,
                        via,
                    }),
                };
                let place = match self.free.pop() {
                    Some(place) => {
                        self.targets[place] = Some(target);
                        place
                    }
                    None => {
                        self.targets.push(Some(target));
                        self.targets.len() - 1
                    }
                };
                self.index.insert(key, place);
                self.file(due, place, id, now);
            }
            Command::Remove(key) => {
                if let Some(place) = self.index.remove(&key) {
                    // Its queue entry and a probe in flight are ignored when they come up.
                    self.targets[place] = None;
                    self.free.push(place);
                    // Settings no window uses any more.
                    self.settings.retain(|s| Arc::strong_count(s) > 1);
                }
            }
        }
    }

    /// Starts the probes due by `now` (as many as the in-flight bound allows).
    fn start_due(&mut self, now: Now) {
        self.advance(now);
        // The slot's targets lie scattered in memory: ask for all of them (and what they point
        // to) before using any, so their cache misses overlap instead of coming one by one.
        // Only those that start now: while the in-flight bound holds the rest back, `due` may
        // be long, and this runs on every turn of the task.
        let room = MAX_PROBES_IN_FLIGHT.saturating_sub(self.out() + self.syn_batch.len());
        self.prefetch(self.due.iter().take(room).map(|&(place, _)| place));
        let probers = self.probers.clone();
        let syn = probers.syn.get();
        while self.out() + self.syn_batch.len() < MAX_PROBES_IN_FLIGHT {
            let Some((place, id)) = self.due.pop_front() else {
                break;
            };
            let Some(target) = self.targets[place].as_ref().filter(|t| t.id == id) else {
                continue; // removed
            };
            if !target.shared.active.load(Ordering::Relaxed) {
                // Paused: look again a little later, probe nothing.
                let again = target.window.settings().interval.min(PAUSED_RECHECK);
                self.file(now.elapsed + again, place, id, now);
                continue;
            }
            if target.kind == CheckKind::Tcp && syn.is_some() {
                // The place and the low half of the id: an id repeats in a place only after
                // 2^32 targets were added.
                let token = (place as u64) << 32 | u64::from(id);
                let timeout = target.window.settings().timeout;
                self.syn_batch
                    .push((token, target.addr, timeout, target.via()));
                continue;
            }
            let cold = &target.cold;
            let probe = probe(&self.probers, &cold.key, cold.http.as_ref(), cold.via);
            self.in_flight.push(Tagged { place, id, probe });
        }
        if let Some(syn) = syn
            && !self.syn_batch.is_empty()
        {
            syn.start_many(&self.syn_batch);
            let n = self.syn_batch.len();
            self.probers.sent.fetch_add(n as u64, Ordering::Relaxed);
            self.syn_in_flight += n;
            self.syn_batch.clear();
        }
    }

    /// Asks the CPU to load the targets at `places`, and their shared parts (status, flags),
    /// ahead of their use: a batch's targets lie scattered in memory, and asking for all of
    /// them before using any lets their cache misses overlap instead of coming one by one.
    /// Whole: a probe's start and result touch most of a target (both start at a cache line).
    fn prefetch(&self, places: impl Iterator<Item = usize> + Clone) {
        for place in places.clone() {
            if let Some(slot) = self.targets.get(place) {
                prefetch(slot, size_of::<Option<Target>>().div_ceil(64));
            }
        }
        // Then what they point to (reading the pointers waits for the lines asked for above).
        for place in places {
            if let Some(Some(t)) = self.targets.get(place) {
                prefetch(&*t.shared, size_of::<TargetShared>().div_ceil(64));
            }
        }
    }

    /// Probes out: futures in flight and half-open probes started.
    fn out(&self) -> usize {
        self.in_flight.len() + self.syn_in_flight
    }

    /// A half-open probe's result, by its token.
    fn finish_token(&mut self, token: u64, result: ProbeResult, now: Now) -> bool {
        self.finish((token >> 32) as usize, token as u32, result, now)
    }

    /// The shared copy of `settings`.
    fn settings(&mut self, settings: WindowSettings) -> Arc<WindowSettings> {
        if let Some(shared) = self.settings.get(&settings) {
            return shared.clone();
        }
        let shared = Arc::new(settings);
        self.settings.insert(shared.clone());
        shared
    }

    /// The present, read once for many probes.
    fn now(&self) -> Now {
        let instant = Instant::now();
        Now {
            instant,
            elapsed: instant.saturating_duration_since(self.epoch),
        }
    }

    /// Moves the targets due by `now` from the wheel to the `due` queue.
    fn advance(&mut self, now: Now) {
        let slot = nanos(now.elapsed) / nanos(SLOT);
        self.wheel.take_until(slot, &mut self.taken);
        self.due.extend(self.taken.drain(..));
    }

    /// Files target `(place, id)` to probe at the first slot boundary from `at` (time since the
    /// epoch); `now` is the present (read by the caller, once for many).
    fn file(&mut self, at: Duration, place: usize, id: u32, now: Now) {
        // Keeps the wheel's horizon counted from now, however long the task slept.
        self.advance(now);
        self.wheel
            .insert(nanos(at).div_ceil(nanos(SLOT)), (place, id));
    }

    /// When slot `slot` begins.
    fn slot_time(&self, slot: u64) -> Instant {
        self.epoch + Duration::from_nanos(slot * SLOT.as_nanos() as u64)
    }

    /// Feeds a probe's result, come in at `now`, to its target's window; sends the verdict if
    /// there is one to send and queues the next probe. False if the daemon no longer takes
    /// verdicts.
    fn finish(&mut self, place: usize, id: u32, result: ProbeResult, now: Now) -> bool {
        let Some(target) = self
            .targets
            .get_mut(place)
            .and_then(Option::as_mut)
            .filter(|t| t.id == id)
        else {
            return true; // removed while in flight
        };
        if let ProbeResult::Success { latency } = result {
            self.probers.latency[target.kind as usize].observe(latency);
        }
        let transition = target.window.observe(result, now.elapsed);
        let local = matches!(result, ProbeResult::Local(_));
        {
            let mut status = crate::lock(&target.shared.status);
            status.state = target.window.state();
            status.counters = target.window.counters();
            status.last_latency = target.window.last_latency();
            if !local
                && !matches!(
                    result,
                    ProbeResult::Success { .. } | ProbeResult::Neutral(_)
                )
            {
                status.last_failure = Some(result);
            }
            if transition.is_some() {
                status.since = now.instant;
            }
        }
        // A local failure moves no state, but the daemon reports it (log, metric, event).
        if transition.is_some() || local || target.shared.report.load(Ordering::Relaxed) {
            let verdict = Verdict {
                probe: target.cold.key.clone(),
                result,
                transition,
            };
            if self.verdicts.send(verdict).is_err() {
                return false;
            }
        }
        let pause = jitter(target.window.next_interval(), xorshift(&mut self.random));
        self.file(now.elapsed + pause, place, id, now);
        true
    }
}

/// The present as an instant and as the time since the scheduler's epoch, which the wheel and
/// the windows count in: read once for a batch of probes, not per probe (a subtraction of
/// instants and 128-bit divisions per probe showed in the checker's profile at 50,000 targets).
#[derive(Clone, Copy)]
struct Now {
    instant: Instant,
    elapsed: Duration,
}

/// Whole nanoseconds, as the wheel counts (u64: 584 years).
fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Waits for half-open probe results (forever if no half-open prober runs).
async fn syn_finished(probers: &Probers, out: &mut Vec<(u64, ProbeResult)>) {
    match probers.syn.get() {
        Some(syn) => syn.finished(out).await,
        None => std::future::pending().await,
    }
}

/// `pause` plus up to 5% more, by `random`: targets that started together drift apart.
fn jitter(pause: Duration, random: u64) -> Duration {
    pause + pause.mul_f64((random % 1000) as f64 / 20_000.0)
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// A deterministic offset in [0, interval) from the target's address.
fn phase(target: SocketAddr, interval: Duration) -> Duration {
    let h = lb_common::fmix64(super::address_key(target));
    let millis = interval.as_millis().max(1) as u64;
    Duration::from_millis(h % millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_fits_in_two_cache_lines() {
        assert_eq!(size_of::<Option<Target>>(), 128);
        assert_eq!(size_of::<TargetShared>(), 128);
    }

    #[test]
    fn jitter_adds_up_to_five_percent() {
        let mut random = 7;
        let pause = Duration::from_secs(1);
        let pauses: Vec<Duration> = (0..1000)
            .map(|_| jitter(pause, xorshift(&mut random)))
            .collect();
        assert!(pauses.iter().all(|p| *p >= pause && *p < pause * 105 / 100));
        let spread =
            pauses.iter().max().unwrap().as_secs_f64() - pauses.iter().min().unwrap().as_secs_f64();
        assert!(spread > 0.04, "jitter barely varies: {spread}");
    }
}
