//! `syn_proxy = "auto"`: when a service's proxy engages and releases. Pure: the daemon feeds it
//! the service's count of new connections (SYNs) about once a second and writes what it
//! decides into the datapath.
//!
//! The measure is the service's new connections a second, proxied or not: while the proxy is
//! off each SYN makes a flow (`new_flows`); while it is on, the SYNs it answers count the same
//! way (the datapath counts them for the service), so a flood keeps the proxy engaged for as
//! long as it lasts. It engages in the first second above `engage_rate`, and releases once the
//! rate has stayed below `release_rate` for `release_after` (hysteresis: a flood that pauses
//! for a moment does not turn it off and on again).

use std::time::{Duration, Instant};

/// The thresholds (`[lb] syn_proxy_engage_rate`, `syn_proxy_release_rate`,
/// `syn_proxy_release_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// New connections a second above which the proxy engages.
    pub engage_rate: u64,
    /// New connections a second below which, for `release_after`, it releases.
    pub release_rate: u64,
    pub release_after: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            engage_rate: 20_000,
            release_rate: 5_000,
            release_after: Duration::from_secs(30),
        }
    }
}

/// A change the daemon writes and reports, with the rate that made it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    Engaged { rate: f64 },
    Released { rate: f64 },
}

/// One service's automatic proxy.
#[derive(Debug, Clone, Default)]
pub struct Auto {
    engaged: bool,
    /// The count and when it was read last.
    last: Option<(u64, Instant)>,
    /// Since when the rate has been below `release_rate` while engaged.
    quiet_since: Option<Instant>,
    /// The last rate measured, new connections a second.
    rate: f64,
}

impl Auto {
    /// A service's state, engaged or not (a reload keeps what it was).
    pub fn new(engaged: bool) -> Self {
        Self {
            engaged,
            ..Self::default()
        }
    }

    pub fn engaged(&self) -> bool {
        self.engaged
    }

    /// The last rate measured, new connections a second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The service's count of new connections `count` read at `now`: what changes, if anything.
    /// A count lower than the last (the datapath's counters started again) restarts the
    /// measure.
    pub fn observe(&mut self, t: &Thresholds, count: u64, now: Instant) -> Option<Change> {
        let last = self.last.replace((count, now));
        let (before, at) = last?;
        let elapsed = now.saturating_duration_since(at).as_secs_f64();
        if count < before || elapsed <= 0.0 {
            return None;
        }
        self.rate = (count - before) as f64 / elapsed;
        if !self.engaged {
            if self.rate > t.engage_rate as f64 {
                self.engaged = true;
                self.quiet_since = None;
                return Some(Change::Engaged { rate: self.rate });
            }
            return None;
        }
        if self.rate >= t.release_rate as f64 {
            self.quiet_since = None;
            return None;
        }
        let since = *self.quiet_since.get_or_insert(at);
        if now.saturating_duration_since(since) >= t.release_after {
            self.engaged = false;
            self.quiet_since = None;
            return Some(Change::Released { rate: self.rate });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        engage_rate: 1000,
        release_rate: 100,
        release_after: Duration::from_secs(10),
    };

    #[test]
    fn engages_above_the_rate_and_releases_after_a_quiet_spell() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut a = Auto::new(false);
        assert_eq!(
            a.observe(&T, 0, at(0)),
            None,
            "the first reading measures nothing"
        );
        assert_eq!(a.observe(&T, 900, at(1)), None, "900/s is within the rate");
        assert_eq!(
            a.observe(&T, 3900, at(2)),
            Some(Change::Engaged { rate: 3000.0 })
        );
        assert!(a.engaged());
        // Still flooded: stays on; a dip below the release rate that does not last, too.
        assert_eq!(a.observe(&T, 9900, at(3)), None);
        assert_eq!(a.observe(&T, 9950, at(4)), None);
        assert_eq!(a.observe(&T, 15000, at(5)), None);
        // Quiet from 5 s on: released once 10 s of it have passed.
        for s in 6..15 {
            assert_eq!(a.observe(&T, 15000 + s, at(s)), None, "at {s} s");
        }
        assert_eq!(
            a.observe(&T, 15015, at(15)),
            Some(Change::Released { rate: 1.0 })
        );
        assert!(!a.engaged());
    }

    #[test]
    fn counters_that_start_again_restart_the_measure() {
        let t0 = Instant::now();
        let mut a = Auto::new(true);
        a.observe(&T, 1_000_000, t0);
        assert_eq!(a.observe(&T, 5, t0 + Duration::from_secs(1)), None);
        assert!(a.engaged());
        assert_eq!(a.observe(&T, 10, t0 + Duration::from_secs(2)), None);
    }
}
