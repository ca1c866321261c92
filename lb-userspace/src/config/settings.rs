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
}

impl Default for WindowSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
            interval: Duration::from_secs(2),
            unhealthy_interval: Duration::from_secs(2),
            healthy_threshold: 3,
            unhealthy_threshold: 3,
        }
    }
}

impl WindowSettings {
    /// Longest time a dead target keeps its traffic, counted from the first probe that finds it
    /// dead: `timeout × unhealthy_threshold + interval × (unhealthy_threshold − 1)` (seed 001).
    /// Counted from the moment it died, add up to one `interval` of phase.
    pub fn failure_window(&self) -> Duration {
        let n = self.unhealthy_threshold.max(1);
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
