//! The failure-window state machine of one health-check target (SPEC §2; seeds 001, 002, 003).
//!
//! Each probe result updates four counters (seed 002): `success`, `tcp_failure`, `http_failure`,
//! `timeout_failure`. A success zeroes the three failure counters and a failure zeroes `success`,
//! so the counters always describe the current run of consecutive results. A failure bumps only
//! its own kind, yet the streak that moves the state is the *sum* of the three: every failure
//! since the last success, whatever its kind. One threshold for all kinds keeps the failure
//! window formula true when a dying backend first refuses and then stops answering. Optional
//! per-kind thresholds (APISIX's `tcp_failures`, `timeouts`, `http_failures`) bound their own
//! counter; the sum then needs the largest of them.
//!
//! `healthy_threshold` consecutive successes make a target `healthy`, `unhealthy_threshold`
//! consecutive failures make it `unhealthy`; a result against the current verdict below the
//! threshold gives the `mostly_*` state, which keeps the verdict's availability. A new target is
//! `initializing` until its first verdict (seed 001's 初始化中), which needs the full threshold
//! either way, so one early blip neither ejects nor confirms it. Time is passed in, so the
//! machine is pure and the timing bounds are tested in simulated time below.

use std::{sync::Arc, time::Duration};

use serde::Serialize;

pub use super::outcome::ProbeResult;
pub use crate::config::{FailureKind, WindowSettings};
pub use crate::model::HealthState;

/// Consecutive results of one target (seed 002, `GET /v1/healthcheck` `counter`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub success: u32,
    pub tcp_failure: u32,
    /// TLS handshakes that failed (https), apart from TCP failures.
    pub tls_failure: u32,
    pub http_failure: u32,
    /// Replies to `send` that were not the expected ones (tcp-connect, udp).
    pub payload_failure: u32,
    pub timeout_failure: u32,
}

impl Counters {
    /// Failures of any kind since the last success: what `unhealthy_threshold` is compared with.
    pub fn failure_streak(&self) -> u32 {
        self.tcp_failure
            .saturating_add(self.tls_failure)
            .saturating_add(self.http_failure)
            .saturating_add(self.payload_failure)
            .saturating_add(self.timeout_failure)
    }

    /// Whether the failures since the last success make the target unhealthy: a kind at its
    /// own threshold, or all kinds together at the largest (see
    /// [`WindowSettings::mixed_threshold`]).
    pub fn reached(&self, s: &WindowSettings) -> bool {
        self.tcp_failure.saturating_add(self.tls_failure) >= s.threshold(FailureKind::Tcp)
            || self.timeout_failure >= s.threshold(FailureKind::Timeout)
            || self.http_failure >= s.threshold(FailureKind::Http)
            || self.payload_failure >= s.unhealthy_threshold.max(1)
            || self.failure_streak() >= s.mixed_threshold()
    }

    fn record(&mut self, result: ProbeResult) {
        let failures = match result {
            ProbeResult::Success { .. } => {
                *self = Self {
                    success: self.success.saturating_add(1),
                    ..Self::default()
                };
                return;
            }
            ProbeResult::TcpFailure(_) => &mut self.tcp_failure,
            ProbeResult::TlsFailure(_) => &mut self.tls_failure,
            ProbeResult::HttpFailure(_) => &mut self.http_failure,
            ProbeResult::PayloadFailure(_) => &mut self.payload_failure,
            ProbeResult::Timeout => &mut self.timeout_failure,
            // No verdict (see `Window::observe`).
            ProbeResult::Local(_) | ProbeResult::Neutral(_) => return,
        };
        *failures = failures.saturating_add(1);
        self.success = 0;
    }
}

/// A state change: every one is an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: HealthState,
    pub to: HealthState,
    /// The `now` of the call that caused it.
    pub at: Duration,
    /// Counters right after the result that caused it.
    pub counters: Counters,
    /// `Some(new availability)` when availability flipped, so the caller knows to update the
    /// datapath flag; `None` when it did not (e.g. healthy → mostly_healthy).
    pub became_available: Option<bool>,
}

/// The health of one target: settings, counters and state.
#[derive(Debug, Clone)]
pub struct Window {
    /// Shared by the targets of a check: a probe's window then fits in fewer cache lines.
    settings: Arc<WindowSettings>,
    state: HealthState,
    counters: Counters,
    disabled: bool,
    unused: bool,
    last_latency: Option<Duration>,
    since: Duration,
}

impl Window {
    /// A target with checks on and no verdict yet.
    pub fn new(settings: impl Into<Arc<WindowSettings>>) -> Self {
        Self {
            settings: settings.into(),
            state: HealthState::Initializing,
            counters: Counters::default(),
            disabled: false,
            unused: false,
            last_latency: None,
            since: Duration::ZERO,
        }
    }

    /// A target found unavailable before a restart (its datapath flag was down): `Unhealthy`
    /// until `healthy_threshold` successes, as it would have been without the restart.
    pub fn restored_unhealthy(settings: impl Into<Arc<WindowSettings>>) -> Self {
        Self {
            state: HealthState::Unhealthy,
            ..Self::new(settings)
        }
    }

    pub fn settings(&self) -> &WindowSettings {
        &self.settings
    }
    pub fn state(&self) -> HealthState {
        self.state
    }
    pub fn counters(&self) -> Counters {
        self.counters
    }
    /// Latency of the last probe if it succeeded; `None` after a failure, so a dead target does
    /// not show a stale figure.
    pub fn last_latency(&self) -> Option<Duration> {
        self.last_latency
    }
    /// When the current state was entered (the `now` of that call).
    pub fn since(&self) -> Duration {
        self.since
    }

    /// Pause before the next probe: seed 002's per-state intervals.
    pub fn next_interval(&self) -> Duration {
        if self.state.is_available() {
            self.settings.interval
        } else {
            self.settings.unhealthy_interval
        }
    }

    /// Feeds one probe result. A result that arrives while `Disabled` or `Unused` was in flight
    /// when the target left the checks, and is dropped. A local failure (this host out of
    /// descriptors or buffers) says nothing about the target, nor does an answer in neither
    /// status set: they change nothing.
    pub fn observe(&mut self, result: ProbeResult, now: Duration) -> Option<Transition> {
        use HealthState::*;
        if matches!(self.state, Disabled | Unused)
            || matches!(result, ProbeResult::Local(_) | ProbeResult::Neutral(_))
        {
            return None;
        }
        self.counters.record(result);
        self.last_latency = match result {
            ProbeResult::Success { latency } => Some(latency),
            _ => None,
        };
        let to = if let ProbeResult::Success { .. } = result {
            let enough = self.counters.success >= self.settings.healthy_threshold.max(1);
            match self.state {
                MostlyHealthy => Healthy,
                Initializing | MostlyUnhealthy | Unhealthy if enough => Healthy,
                Unhealthy => MostlyUnhealthy,
                same => same,
            }
        } else {
            let enough = self.counters.reached(&self.settings);
            match self.state {
                MostlyUnhealthy => Unhealthy,
                Initializing | Healthy | MostlyHealthy if enough => Unhealthy,
                Healthy => MostlyHealthy,
                same => same,
            }
        };
        self.change(to, now)
    }

    /// Checks off (`true`: `Disabled`, available, unless `Unused`) or back on (`false`: the
    /// target starts over at `Initializing`).
    pub fn set_disabled(&mut self, disabled: bool, now: Duration) -> Option<Transition> {
        self.disabled = disabled;
        self.apply_flags(now)
    }

    /// Weight 0 / drained / unreferenced (`true`) or back in use (`false`). `Unused` wins over
    /// `Disabled`: a drained target takes no new flows whether or not it is checked.
    pub fn set_unused(&mut self, unused: bool, now: Duration) -> Option<Transition> {
        self.unused = unused;
        self.apply_flags(now)
    }

    fn apply_flags(&mut self, now: Duration) -> Option<Transition> {
        let to = match (self.unused, self.disabled, self.state) {
            (true, _, _) => HealthState::Unused,
            (false, true, _) => HealthState::Disabled,
            // Back from a pause: nothing was observed meanwhile, so the old verdict and
            // counters are stale; start over like a fresh target.
            (false, false, HealthState::Disabled | HealthState::Unused) => {
                HealthState::Initializing
            }
            (false, false, same) => same,
        };
        if to != self.state && matches!(to, HealthState::Disabled | HealthState::Unused) {
            self.counters = Counters::default();
        }
        self.change(to, now)
    }

    fn change(&mut self, to: HealthState, now: Duration) -> Option<Transition> {
        let from = self.state;
        if from == to {
            return None;
        }
        self.state = to;
        self.since = now;
        let flipped = from.is_available() != to.is_available();
        Some(Transition {
            from,
            to,
            at: now,
            counters: self.counters,
            became_available: flipped.then_some(to.is_available()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{HealthState::*, *};
    use crate::health::outcome::Reason;

    const T: Duration = Duration::ZERO;
    const OK: ProbeResult = ProbeResult::Success {
        latency: Duration::from_millis(5),
    };
    const F: ProbeResult = ProbeResult::Timeout;
    const QUICK: Duration = Duration::from_millis(10);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Settings from (timeout, interval, unhealthy_interval) in seconds and the thresholds.
    fn settings(t: u64, i: u64, ui: u64, h: u32, u: u32) -> WindowSettings {
        let (timeout, interval, unhealthy_interval) = (secs(t), secs(i), secs(ui));
        let (healthy_threshold, unhealthy_threshold) = (h, u);
        WindowSettings {
            timeout,
            interval,
            unhealthy_interval,
            healthy_threshold,
            unhealthy_threshold,
            tcp_failures: None,
            timeouts: None,
            http_failures: None,
        }
    }

    /// (from, to, became_available) of a transition.
    type Step = Option<(HealthState, HealthState, Option<bool>)>;

    /// Feeds the results and checks each transition (or the lack of one).
    fn expect(w: &mut Window, steps: &[(ProbeResult, Step)]) {
        for (n, (r, want)) in steps.iter().enumerate() {
            let got = w.observe(*r, T).map(|t| (t.from, t.to, t.became_available));
            assert_eq!(got, *want, "step {n}: {r:?}");
        }
    }

    #[test]
    fn counter_reset_rules() {
        let mut w = Window::new(WindowSettings::default());
        let mut feed = |r| {
            w.observe(r, T);
            let c = w.counters();
            (
                (c.success, c.tcp_failure, c.http_failure, c.timeout_failure),
                w.last_latency(),
                w.state(),
            )
        };
        let ms5 = Some(Duration::from_millis(5));
        assert_eq!(feed(OK), ((1, 0, 0, 0), ms5, Initializing));
        assert_eq!(feed(OK), ((2, 0, 0, 0), ms5, Initializing));
        assert_eq!(
            feed(ProbeResult::TcpFailure(Reason::Refused)),
            ((0, 1, 0, 0), None, Initializing)
        );
        assert_eq!(feed(F), ((0, 1, 0, 1), None, Initializing));
        // Three failures of three kinds are a streak of three: the target is ejected.
        assert_eq!(
            feed(ProbeResult::HttpFailure(Reason::Status(500))),
            ((0, 1, 1, 1), None, Unhealthy)
        );
        assert_eq!(feed(F), ((0, 1, 1, 2), None, Unhealthy));
        assert_eq!(feed(OK), ((1, 0, 0, 0), ms5, MostlyUnhealthy));
        let streak = |tcp_failure, http_failure, timeout_failure| {
            let c = Counters {
                tcp_failure,
                http_failure,
                timeout_failure,
                ..Counters::default()
            };
            c.failure_streak()
        };
        assert_eq!(
            (streak(1, 1, 2), streak(0, 0, 3), streak(u32::MAX, 1, 0)),
            (4, 3, u32::MAX)
        );
    }

    #[test]
    fn local_failures_move_nothing_and_tls_failures_count_apart() {
        let mut w = Window::new(settings(1, 1, 1, 2, 2));
        expect(
            &mut w,
            &[(OK, None), (OK, Some((Initializing, Healthy, None)))],
        );
        let local = ProbeResult::Local(Reason::Os(libc::EMFILE));
        let neutral = ProbeResult::Neutral(Reason::Status(403));
        for _ in 0..10 {
            assert_eq!(w.observe(local, T), None);
            assert_eq!(w.observe(neutral, T), None);
        }
        assert_eq!((w.state(), w.counters().success), (Healthy, 2), "unchanged");
        let tls = ProbeResult::TlsFailure(Reason::Tls(crate::health::outcome::Tls::Expired));
        expect(
            &mut w,
            &[
                (tls, Some((Healthy, MostlyHealthy, None))),
                (F, Some((MostlyHealthy, Unhealthy, Some(false)))),
            ],
        );
        let c = w.counters();
        assert_eq!((c.tls_failure, c.timeout_failure, c.tcp_failure), (1, 1, 0));
        // A restored target starts where it was before the restart.
        let mut r = Window::restored_unhealthy(settings(1, 1, 1, 2, 2));
        assert!(!r.state().is_available());
        expect(
            &mut r,
            &[
                (OK, Some((Unhealthy, MostlyUnhealthy, None))),
                (OK, Some((MostlyUnhealthy, Healthy, Some(true)))),
            ],
        );
    }

    #[test]
    fn state_sequence_3_3() {
        let mut w = Window::new(WindowSettings::default());
        expect(
            &mut w,
            &[
                (OK, None),
                (OK, None),
                (OK, Some((Initializing, Healthy, None))),
                (OK, None),
                (F, Some((Healthy, MostlyHealthy, None))),
                (OK, Some((MostlyHealthy, Healthy, None))),
                (F, Some((Healthy, MostlyHealthy, None))),
                (ProbeResult::TcpFailure(Reason::Refused), None),
                (F, Some((MostlyHealthy, Unhealthy, Some(false)))),
                (F, None),
                (OK, Some((Unhealthy, MostlyUnhealthy, None))),
                (F, Some((MostlyUnhealthy, Unhealthy, None))),
                (OK, Some((Unhealthy, MostlyUnhealthy, None))),
                (OK, None),
                (OK, Some((MostlyUnhealthy, Healthy, Some(true)))),
            ],
        );
    }

    /// Seed 002's per-kind thresholds (APISIX: tcp_failures 2, timeouts 3, http_failures 5):
    /// each kind ejects at its own count; a mix needs the largest; a success resets them all.
    #[test]
    fn per_kind_thresholds_bound_their_own_counters() {
        let refused = ProbeResult::TcpFailure(Reason::Refused);
        let status = ProbeResult::HttpFailure(Reason::Status(503));
        let s = WindowSettings {
            tcp_failures: Some(2),
            timeouts: Some(3),
            http_failures: Some(5),
            ..settings(1, 1, 1, 1, 3)
        };
        assert_eq!(s.mixed_threshold(), 5);
        let healthy = || {
            let mut w = Window::new(s);
            w.observe(OK, T);
            w
        };
        let mut w = healthy();
        expect(
            &mut w,
            &[
                (refused, Some((Healthy, MostlyHealthy, None))),
                (refused, Some((MostlyHealthy, Unhealthy, Some(false)))),
            ],
        );
        let mut w = healthy();
        expect(
            &mut w,
            &[
                (F, Some((Healthy, MostlyHealthy, None))),
                (F, None),
                (F, Some((MostlyHealthy, Unhealthy, Some(false)))),
            ],
        );
        // Four HTTP failures stay below 5, though above unhealthy_threshold (3).
        let mut w = healthy();
        for _ in 0..4 {
            w.observe(status, T);
        }
        assert_eq!(w.state(), MostlyHealthy);
        w.observe(status, T);
        assert_eq!(w.state(), Unhealthy);
        // A mix where no kind reaches its own: ejected at the fifth failure.
        let mut w = healthy();
        for r in [refused, F, status, F] {
            w.observe(r, T);
            assert_eq!(w.state(), MostlyHealthy, "{r:?}");
        }
        w.observe(status, T);
        assert_eq!(w.state(), Unhealthy);
        // A success in between starts every count over.
        let mut w = healthy();
        for r in [refused, OK, refused, OK, refused] {
            w.observe(r, T);
        }
        assert_ne!(w.state(), Unhealthy);
        // The shown failure window is the silent case: the timeouts' threshold.
        assert_eq!(s.failure_window(), secs(3 + 2));
    }

    /// Without per-kind thresholds the single streak decides, whatever the mix (the seeds).
    #[test]
    fn without_per_kind_thresholds_the_sum_decides() {
        let refused = ProbeResult::TcpFailure(Reason::Refused);
        let s = settings(1, 1, 1, 1, 3);
        assert_eq!(s.mixed_threshold(), 3);
        let mut w = Window::new(s);
        w.observe(OK, T);
        w.observe(refused, T);
        w.observe(F, T);
        assert_eq!(w.state(), HealthState::MostlyHealthy);
        w.observe(refused, T);
        assert_eq!(w.state(), HealthState::Unhealthy);
    }

    #[test]
    fn threshold_one_flips_on_every_result() {
        let mut w = Window::new(settings(1, 1, 1, 1, 1));
        expect(
            &mut w,
            &[
                (
                    ProbeResult::HttpFailure(Reason::Status(500)),
                    Some((Initializing, Unhealthy, Some(false))),
                ),
                (OK, Some((Unhealthy, Healthy, Some(true)))),
                (OK, None),
                (F, Some((Healthy, Unhealthy, Some(false)))),
                (ProbeResult::TcpFailure(Reason::Refused), None),
            ],
        );
        expect(
            &mut Window::new(settings(1, 1, 1, 1, 1)),
            &[(OK, Some((Initializing, Healthy, None)))],
        );
    }

    /// A scheduler in simulated time: pause `next_interval()`, probe; a target alive when the
    /// probe starts answers after `rt`, a dead one lets it time out. Returns when `target` is
    /// entered.
    fn run_until(
        w: &mut Window,
        mut now: Duration,
        alive: impl Fn(Duration) -> bool,
        rt: Duration,
        target: HealthState,
    ) -> Duration {
        for _ in 0..1000 {
            now += w.next_interval();
            let result = if alive(now) {
                now += rt;
                ProbeResult::Success { latency: rt }
            } else {
                now += w.settings().timeout;
                F
            };
            if w.observe(result, now).is_some_and(|t| t.to == target) {
                return now;
            }
        }
        panic!("{target:?} never reached");
    }

    #[test]
    fn windows_hold_in_simulated_time() {
        // SPEC / seed 001 example, and seed 003's (timeout 3 s, interval 3 s).
        assert_eq!(settings(5, 2, 2, 3, 3).failure_window(), secs(19));
        assert_eq!(settings(5, 2, 2, 3, 3).success_window(secs(1)), secs(7));
        assert_eq!(settings(3, 3, 3, 3, 3).failure_window(), secs(15));
        assert_eq!(settings(3, 3, 3, 3, 3).success_window(secs(1)), secs(9));
        let phases = |d: Duration| [Duration::ZERO, d / 2, d - QUICK];
        for s in [
            settings(5, 2, 2, 3, 3),
            settings(2, 2, 2, 3, 3),
            settings(1, 3, 1, 2, 5),
            settings(1, 1, 4, 1, 1),
            settings(3, 3, 3, 10, 10),
        ] {
            let mut healthy = Window::new(s);
            let healthy_at = run_until(&mut healthy, T, |_| true, QUICK, Healthy);
            // The target dies somewhere in the pause after a successful probe. The first probe
            // to find it dead starts `interval` after that success, and the verdict comes one
            // failure window later: from the death, failure_window + at most one interval.
            for phase in phases(s.interval) {
                let (mut w, dead_at) = (healthy.clone(), healthy_at + phase);
                let ejected = run_until(&mut w, healthy_at, |t| t < dead_at, QUICK, Unhealthy);
                assert_eq!(
                    ejected - (healthy_at + s.interval),
                    s.failure_window(),
                    "{s:?}"
                );
                assert!(
                    ejected - dead_at <= s.failure_window() + s.interval,
                    "{s:?}"
                );
                // Recovery likewise, with responses taking `rt`; the pauses are now
                // unhealthy_interval (the target is unavailable until the verdict), which is
                // `success_window` with that interval (the same one with the defaults).
                let ui = s.unhealthy_interval;
                let recovery_window = |rt| WindowSettings { interval: ui, ..s }.success_window(rt);
                for (up_phase, rt) in
                    phases(s.unhealthy_interval)
                        .into_iter()
                        .zip([QUICK, secs(1), QUICK])
                {
                    let up_at = ejected + up_phase;
                    let back = run_until(&mut w.clone(), ejected, |t| t >= up_at, rt, Healthy);
                    assert_eq!(
                        back - (ejected + s.unhealthy_interval),
                        recovery_window(rt),
                        "{s:?}"
                    );
                    assert!(
                        back - up_at <= recovery_window(rt) + s.unhealthy_interval,
                        "{s:?}"
                    );
                    if s.unhealthy_interval == s.interval {
                        assert_eq!(recovery_window(rt), s.success_window(rt));
                    }
                }
            }
        }
    }

    #[test]
    fn next_interval_follows_availability() {
        let mut w = Window::new(settings(1, 2, 7, 1, 2));
        assert_eq!((w.state(), w.next_interval()), (Initializing, secs(2)));
        for (r, state, interval) in [
            (OK, Healthy, 2),
            (F, MostlyHealthy, 2),
            (F, Unhealthy, 7),
            (OK, Healthy, 2),
        ] {
            w.observe(r, T);
            assert_eq!((w.state(), w.next_interval()), (state, secs(interval)));
        }
        w.set_disabled(true, T);
        assert_eq!(w.next_interval(), secs(2));
        w.set_unused(true, T);
        assert_eq!(w.next_interval(), secs(7));
    }

    #[test]
    fn disable_unused_and_availability() {
        let names = [
            "initializing",
            "healthy",
            "mostly_healthy",
            "mostly_unhealthy",
            "unhealthy",
            "disabled",
            "drained",
            "unused",
        ];
        let avail = [true, true, true, false, false, true, false, false];
        for ((s, name), a) in HealthState::ALL.into_iter().zip(names).zip(avail) {
            assert_eq!((s.as_str(), s.is_available()), (name, a));
            assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{name}\"")));
        }
        let mut w = Window::new(settings(1, 1, 1, 1, 1));
        let short = |t: Option<Transition>| t.map(|t| (t.from, t.to, t.became_available));
        w.observe(OK, T);
        let t = w.set_unused(true, secs(9));
        assert_eq!(short(t), Some((Healthy, Unused, Some(false))));
        assert_eq!((t.map(|t| t.at), w.since()), (Some(secs(9)), secs(9)));
        // A result in flight when the target was drained is dropped.
        assert_eq!(
            (w.observe(OK, T), w.counters()),
            (None, Counters::default())
        );
        // Unused wins over Disabled.
        assert_eq!(
            (w.set_unused(true, T), w.set_disabled(true, T)),
            (None, None)
        );
        assert_eq!(
            short(w.set_unused(false, T)),
            Some((Unused, Disabled, Some(true)))
        );
        assert_eq!(
            short(w.set_disabled(false, T)),
            Some((Disabled, Initializing, None))
        );
        expect(&mut w, &[(F, Some((Initializing, Unhealthy, Some(false))))]);
        assert_eq!(
            short(w.set_disabled(true, T)),
            Some((Unhealthy, Disabled, Some(true)))
        );
        assert_eq!(w.set_unused(false, T), None);
    }
}
