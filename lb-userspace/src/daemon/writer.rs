//! Health into the datapath, off the async workers. One thread applies what the checks find:
//! the active checks' verdicts, the datapath's passive signals, ejections that end, traffic for
//! traffic-triggered probing; and after each, the VIPs' routes that availability changes
//! (route health injection). Each takes the daemon's lock and writes maps and routes
//! (syscalls) here, never on the tokio workers that run the probes and serve the API. An async
//! feeder gathers the work: verdicts from the checker, signals from the ring buffer as soon as
//! its descriptor is readable (no polling), the next ejection end from the writer, requests to
//! write the routes (admin actions, reloads, drain-host, stop).

use std::{
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_common::PassiveSignal;
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::{mpsc, watch},
};
use tracing::warn;

use super::{Shared, announce::REREAD_EVERY, notify::Notifier, signal::AnnounceSignal};
use crate::{announce::KernelTable, dataplane::SignalRing, health::checker::Verdict};

/// How often traffic counters are read for traffic-triggered probing (and, at the least, how
/// often the writer tells systemd's watchdog it is alive).
pub const TRAFFIC_EVERY: Duration = Duration::from_secs(1);

/// Test hook: after this many milliseconds the writer stops taking work, as a wedged verdict
/// loop would, so a test can see systemd's watchdog pings stop.
const STALL_ENV: &str = "LB_TEST_STALL_WRITER_AFTER_MS";

/// Most pieces of work taken in one turn of the writer: a turn's flags and rings are written,
/// and the routes brought up to date, before more is taken.
const MAX_TURN: usize = 1024;

pub enum Work {
    Verdict(Verdict),
    /// Signals from the ring (none: only ejections that ended).
    Signals(Vec<PassiveSignal>),
    Traffic,
    /// Bring the VIPs' routes up to date (the state changed elsewhere).
    Announce,
}

/// Starts the writer thread; it ends when every sender of `work` is gone. It publishes in
/// `next_end` when the first ejection in force ends by itself, and pings systemd through
/// `notifier` on each traffic tick: the pings stop when this loop does. With `table` (route
/// health injection) it first makes the table match what the state wants (keeping what a
/// previous run announced that is still wanted), then brings it up to date after each piece
/// of work, and reads it again every [`REREAD_EVERY`].
pub fn spawn(
    shared: Arc<Shared>,
    mut work: mpsc::UnboundedReceiver<Work>,
    next_end: watch::Sender<Option<Instant>>,
    mut notifier: Notifier,
    mut table: Option<KernelTable>,
) -> std::io::Result<JoinHandle<()>> {
    let stall_at = std::env::var(STALL_ENV)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    std::thread::Builder::new()
        .name("lb-health-writer".into())
        .spawn(move || {
            let mut read_at = Instant::now();
            if let Some(table) = table.as_mut() {
                shared.announce_sync(table, true, Some("start"));
            }
            while let Some(first) = work.blocking_recv() {
                if stall_at.is_some_and(|at| Instant::now() >= at) {
                    warn!("{STALL_ENV}: the health writer stalls for good (test hook)");
                    loop {
                        std::thread::park();
                    }
                }
                // What else is waiting goes in the same turn: consecutive verdicts are written
                // together (see `apply_verdicts`); other work keeps its place among them.
                let mut turn = vec![first];
                while turn.len() < MAX_TURN
                    && let Ok(w) = work.try_recv()
                {
                    turn.push(w);
                }
                let (mut reread, mut ejections) = (false, false);
                let mut verdicts = Vec::new();
                for w in turn {
                    if let Work::Verdict(v) = w {
                        verdicts.push(v);
                        ejections = true;
                        continue;
                    }
                    if !verdicts.is_empty() {
                        shared.apply_verdicts(std::mem::take(&mut verdicts));
                    }
                    match w {
                        Work::Signals(s) => {
                            shared.passive_apply(s);
                            ejections = true;
                        }
                        Work::Traffic => {
                            shared.traffic_poll();
                            shared.syn_proxy_poll();
                            notifier.alive(|| shared.summary());
                            reread |= read_at.elapsed() >= REREAD_EVERY;
                        }
                        Work::Verdict(_) | Work::Announce => {}
                    }
                }
                if !verdicts.is_empty() {
                    shared.apply_verdicts(verdicts);
                }
                // Right after the turn's verdicts (or the action) that changed availability;
                // nothing is written when nothing changed. Each tick also retries what failed.
                if let Some(table) = table.as_mut() {
                    shared.announce_sync(table, reread, None);
                    if reread {
                        read_at = Instant::now();
                    }
                }
                if ejections {
                    // A verdict may have ejected (probes feed the host scope), signals too:
                    // the feeder's timer follows.
                    let end = shared.passive_deadline();
                    next_end.send_if_modified(|e| std::mem::replace(e, end) != end);
                }
            }
        })
}

/// The ring's descriptor in tokio's reactor (call in the runtime).
pub fn watch(ring: SignalRing) -> anyhow::Result<AsyncFd<SignalRing>> {
    // SAFETY: the descriptor is the ring map's own, which `ring` owns: open and the same for as
    // long as the AsyncFd (which owns `ring`) lives.
    unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| anyhow::Error::new(e.into_parts().1))
        .context("watching the passive signal ring buffer")
}

/// Gathers the writer's work until `stop`.
pub async fn feed(
    ring: AsyncFd<SignalRing>,
    mut verdicts: mpsc::UnboundedReceiver<Verdict>,
    work: mpsc::UnboundedSender<Work>,
    mut next_end: watch::Receiver<Option<Instant>>,
    mut stop: watch::Receiver<bool>,
    tick: Duration,
    announce: Arc<AnnounceSignal>,
) {
    let mut ring = ring;
    let mut traffic = tokio::time::interval(tick);
    traffic.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut end = *next_end.borrow_and_update();
    let send = |w: Work| {
        // The writer only ends after this task (it holds the last sender).
        let _ = work.send(w);
    };
    loop {
        let ended = async {
            match end {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(v) = verdicts.recv() => send(Work::Verdict(v)),
            readable = ring.readable_mut() => {
                let mut guard = match readable {
                    Ok(g) => g,
                    Err(e) => {
                        warn!(error = %e, "waiting on the passive signal ring failed: passive checks stop");
                        return;
                    }
                };
                let signals = guard.get_inner_mut().take();
                // Readiness is cleared only once the ring is empty: the kernel wakes a reader
                // again only when it has caught up, so a partial read must read again.
                if signals.len() < crate::dataplane::MAX_SIGNALS_PER_TAKE {
                    guard.clear_ready();
                }
                if !signals.is_empty() {
                    send(Work::Signals(signals));
                }
            }
            () = ended => {
                // Until the writer says when the next one ends.
                end = None;
                send(Work::Signals(Vec::new()));
            }
            Ok(()) = next_end.changed() => end = *next_end.borrow_and_update(),
            _ = traffic.tick() => send(Work::Traffic),
            () = announce.requested() => send(Work::Announce),
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
