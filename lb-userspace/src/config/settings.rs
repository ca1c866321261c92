//! The settings of a service's checks that the health machines run on: the active checks'
//! failure window and the passive checks' rule. Defined here, with the rest of the config, so the
//! config depends on nothing of `health` (which imports them).

use std::time::Duration;

/// Timing and thresholds of one service's checks. Ranges are validated by the config reader;
/// a threshold of 0 is treated as 1 so nothing here can misbehave on unchecked input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowSettings {
    /// How long a probe waits for an answer.
    pub timeout: Duration,
    /// Pause between the end of one probe and the start of the next while the target is available.
    pub interval: Duration,
    /// The same pause while the target is not available (seed 002's per-state intervals).
    pub unhealthy_interval: Duration,
    /// Consecutive successes that make a target healthy (1–10).
    pub healthy_threshold: u32,
    /// Consecutive failures that make a target unhealthy (1–10).
    pub unhealthy_threshold: u32,
    /// Per-kind bounds (seed 002, APISIX's `unhealthy.tcp_failures`, `timeouts`,
    /// `http_failures`; 1–254): consecutive failures of that kind that make a target unhealthy.
    /// `None`: `unhealthy_threshold`. TLS failures count with `tcp_failures`.
    pub tcp_failures: Option<u32>,
    pub timeouts: Option<u32>,
    pub http_failures: Option<u32>,
}

/// The kinds of failure that have a threshold of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Refused, reset, unreachable, TLS.
    Tcp,
    Timeout,
    /// A wrong status or answer.
    Http,
}

impl Default for WindowSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
            interval: Duration::from_secs(2),
            unhealthy_interval: Duration::from_secs(2),
            healthy_threshold: 3,
            unhealthy_threshold: 3,
            tcp_failures: None,
            timeouts: None,
            http_failures: None,
        }
    }
}

impl WindowSettings {
    /// Consecutive failures of `kind` that make a target unhealthy.
    pub fn threshold(&self, kind: FailureKind) -> u32 {
        let own = match kind {
            FailureKind::Tcp => self.tcp_failures,
            FailureKind::Timeout => self.timeouts,
            FailureKind::Http => self.http_failures,
        };
        own.unwrap_or(self.unhealthy_threshold).max(1)
    }

    /// Failures of mixed kinds that make a target unhealthy when no kind reached its own
    /// threshold: the largest of them, so a backend that alternates between refusing and
    /// hanging is still ejected within the slowest kind's window. Without per-kind thresholds
    /// this is `unhealthy_threshold`, the seeds' single streak.
    pub fn mixed_threshold(&self) -> u32 {
        [FailureKind::Tcp, FailureKind::Timeout, FailureKind::Http]
            .map(|k| self.threshold(k))
            .into_iter()
            .max()
            .unwrap_or(1)
    }

    /// Longest time a dead (silent) target keeps its traffic, counted from the first probe that
    /// finds it dead: `timeout × n + interval × (n − 1)` with n the timeouts' threshold
    /// (seed 001's formula; `unhealthy_threshold` unless `timeouts` is set). Counted from the
    /// moment it died, add up to one `interval` of phase.
    pub fn failure_window(&self) -> Duration {
        let n = self.threshold(FailureKind::Timeout);
        let pauses = self.interval.saturating_mul(n - 1);
        self.timeout.saturating_mul(n).saturating_add(pauses)
    }

    /// Time a recovered target waits for traffic when probes take `response_time`:
    /// `response_time × healthy_threshold + interval × (healthy_threshold − 1)`, SPEC's formula,
    /// shown to operators as is. The seeds know a single interval; with seed 002's per-state
    /// intervals the pauses of a recovery run at `unhealthy_interval` (the target is not
    /// available until the verdict), so the real bound uses that interval in its place. The two
    /// agree with the default `unhealthy_interval = interval`.
    pub fn success_window(&self, response_time: Duration) -> Duration {
        let n = self.healthy_threshold.max(1);
        let pauses = self.interval.saturating_mul(n - 1);
        response_time.saturating_mul(n).saturating_add(pauses)
    }
}

/// `[service.passive]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PassiveSettings {
    pub failures: u32,
    pub window: Duration,
    pub ejection: Duration,
}

impl Default for PassiveSettings {
    fn default() -> Self {
        Self {
            failures: 10,
            window: Duration::from_secs(120),
            ejection: Duration::from_secs(60),
        }
    }
}
