//! `syn_proxy = "auto"`: when a service's proxy engages and releases. Pure: the daemon feeds it
//! the service's counts of new connections (SYNs) and of completed handshakes about once a
//! second and writes what it decides into the datapath.
//!
//! Two measures, either of which engages it:
//! - the service's new connections a second, proxied or not: while the proxy is off each SYN
//!   makes a flow (`new_flows`); while it is on, the SYNs it answers count the same way (the
//!   datapath counts them for the service), so a flood keeps the proxy engaged for as long as it
//!   lasts;
//! - its half-open connections: SYNs of the last SYN timeout (`conntrack.tcp_syn_timeout`, how
//!   long the table keeps a half-open flow) whose handshake did not complete (the datapath counts
//!   a handshake when the client's ACK completes one, or a cookie returns valid). A slow flood
//!   that no rate threshold sees fills the connection table over that timeout; a busy service's
//!   real clients complete their handshakes and leave it near zero.
//!
//! It engages in the first second above either engage threshold, and releases once both have
//! stayed below their release thresholds for `release_after` (hysteresis: a flood that pauses
//! for a moment does not turn it off and on again).

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

/// The thresholds (`[lb] syn_proxy_engage_rate`, `syn_proxy_release_rate`,
/// `syn_proxy_engage_half_open`, `syn_proxy_release_half_open`, `syn_proxy_release_after`) and
/// how long a SYN counts as half-open (`conntrack.tcp_syn_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// New connections a second above which the proxy engages.
    pub engage_rate: u64,
    /// New connections a second below which, for `release_after`, it releases.
    pub release_rate: u64,
    /// Half-open connections above which the proxy engages.
    pub engage_half_open: u64,
    /// Half-open connections below which, for `release_after`, it releases.
    pub release_half_open: u64,
    pub release_after: Duration,
    /// How long a SYN without a completed handshake counts as half-open.
    pub half_open_window: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            engage_rate: 20_000,
            release_rate: 5_000,
            engage_half_open: 10_000,
            release_half_open: 2_500,
            release_after: Duration::from_secs(30),
            half_open_window: Duration::from_secs(30),
        }
    }
}

/// What made a change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// New connections a second.
    pub rate: f64,
    /// Half-open connections.
    pub half_open: u64,
}

/// A change the daemon writes and reports, with the measures that made it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    Engaged(Measure),
    Released(Measure),
}

/// One service's automatic proxy.
#[derive(Debug, Clone, Default)]
pub struct Auto {
    engaged: bool,
    /// The counts (new connections, handshakes) and when they were read last.
    last: Option<(u64, u64, Instant)>,
    /// Since when both measures have been below their release thresholds while engaged.
    quiet_since: Option<Instant>,
    /// The last rate measured, new connections a second.
    rate: f64,
    /// Each reading's new connections less its handshakes, within the half-open window: their
    /// sum is the half-open estimate.
    unanswered: VecDeque<(Instant, u64)>,
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

    /// The half-open connections: SYNs within the window whose handshake did not complete.
    pub fn half_open(&self) -> u64 {
        self.unanswered.iter().map(|&(_, n)| n).sum()
    }

    /// The service's counts of new connections (`syns`) and of completed handshakes
    /// (`handshakes`) read at `now`: what changes, if anything. Counts lower than the last (the
    /// datapath's counters started again) restart the measures.
    pub fn observe(
        &mut self,
        t: &Thresholds,
        syns: u64,
        handshakes: u64,
        now: Instant,
    ) -> Option<Change> {
        let last = self.last.replace((syns, handshakes, now));
        let (syns_before, handshakes_before, at) = last?;
        let elapsed = now.saturating_duration_since(at).as_secs_f64();
        if syns < syns_before || handshakes < handshakes_before || elapsed <= 0.0 {
            self.unanswered.clear();
            return None;
        }
        let new = syns - syns_before;
        self.rate = new as f64 / elapsed;
        // A handshake completes after its SYN, sometimes in the next reading: more handshakes
        // than SYNs in one reading pay back the earlier readings' unanswered ones.
        let mut answered = handshakes - handshakes_before;
        let unanswered = new.saturating_sub(answered);
        answered = answered.saturating_sub(new);
        for (_, n) in self.unanswered.iter_mut().rev() {
            let paid = answered.min(*n);
            *n -= paid;
            answered -= paid;
        }
        while self
            .unanswered
            .front()
            .is_some_and(|&(when, _)| now.saturating_duration_since(when) >= t.half_open_window)
        {
            self.unanswered.pop_front();
        }
        if unanswered > 0 {
            self.unanswered.push_back((now, unanswered));
        }
        let m = Measure {
            rate: self.rate,
            half_open: self.half_open(),
        };
        if !self.engaged {
            if m.rate > t.engage_rate as f64 || m.half_open > t.engage_half_open {
                self.engaged = true;
                self.quiet_since = None;
                return Some(Change::Engaged(m));
            }
            return None;
        }
        if m.rate >= t.release_rate as f64 || m.half_open >= t.release_half_open {
            self.quiet_since = None;
            return None;
        }
        let since = *self.quiet_since.get_or_insert(at);
        if now.saturating_duration_since(since) >= t.release_after {
            self.engaged = false;
            self.quiet_since = None;
            return Some(Change::Released(m));
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
        engage_half_open: 5000,
        release_half_open: 500,
        release_after: Duration::from_secs(10),
        half_open_window: Duration::from_secs(30),
    };

    #[test]
    fn engages_above_the_rate_and_releases_after_a_quiet_spell() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut a = Auto::new(false);
        assert_eq!(
            a.observe(&T, 0, 0, at(0)),
            None,
            "the first reading measures nothing"
        );
        // Every connection completes its handshake: only the rate counts.
        assert_eq!(
            a.observe(&T, 900, 900, at(1)),
            None,
            "900/s is within the rate"
        );
        assert_eq!(
            a.observe(&T, 3900, 3900, at(2)),
            Some(Change::Engaged(Measure {
                rate: 3000.0,
                half_open: 0
            }))
        );
        assert!(a.engaged());
        // Still flooded: stays on; a dip below the release rate that does not last, too.
        assert_eq!(a.observe(&T, 9900, 9900, at(3)), None);
        assert_eq!(a.observe(&T, 9950, 9950, at(4)), None);
        assert_eq!(a.observe(&T, 15000, 15000, at(5)), None);
        // Quiet from 5 s on: released once 10 s of it have passed.
        for s in 6..15 {
            assert_eq!(a.observe(&T, 15000 + s, 15000 + s, at(s)), None, "at {s} s");
        }
        assert_eq!(
            a.observe(&T, 15015, 15015, at(15)),
            Some(Change::Released(Measure {
                rate: 1.0,
                half_open: 0
            }))
        );
        assert!(!a.engaged());
    }

    /// A flood too slow for the rate threshold: its SYNs never complete, and over the SYN
    /// timeout they add up past the half-open threshold. Released once they have aged out of the
    /// window and stayed below the release threshold.
    #[test]
    fn a_slow_flood_engages_it_by_its_half_open_connections() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut a = Auto::new(false);
        a.observe(&T, 0, 0, at(0));
        // 600 SYNs a second (below the 1000/s rate), of which 100 from real clients complete.
        let mut engaged_at = None;
        for s in 1..=20 {
            if let Some(Change::Engaged(m)) = a.observe(&T, 600 * s, 100 * s, at(s)) {
                assert!(m.rate < 1000.0 && m.half_open > 5000, "{m:?}");
                engaged_at = Some(s);
                break;
            }
        }
        assert_eq!(
            engaged_at,
            Some(11),
            "500 half-open a second pass 5000 in the 11th"
        );
        assert_eq!(a.half_open(), 5500);
        // The flood ends at 11 s; its SYNs count until the window (30 s) passed them, then the
        // quiet spell (10 s) runs.
        let (syns, hs) = (6600, 1100);
        let mut released_at = None;
        for s in 12..=60 {
            if let Some(Change::Released(m)) = a.observe(&T, syns + 10 * s, hs + 10 * s, at(s)) {
                assert!(m.half_open < 500, "{m:?}");
                released_at = Some(s);
                break;
            }
        }
        // Below 500 half-open once the flood's last second left the window (at 41 s: 30 s
        // after it), released 10 s after the reading before (40 s).
        assert_eq!(released_at, Some(50));
    }

    /// Handshakes completing in a later reading than their SYNs are not half-open.
    #[test]
    fn late_handshakes_pay_back_earlier_syns() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut a = Auto::new(false);
        a.observe(&T, 0, 0, at(0));
        a.observe(&T, 4000, 0, at(1));
        assert_eq!(a.half_open(), 4000);
        a.observe(&T, 4000, 4000, at(2));
        assert_eq!(a.half_open(), 0);
    }

    #[test]
    fn counters_that_start_again_restart_the_measure() {
        let t0 = Instant::now();
        let mut a = Auto::new(true);
        a.observe(&T, 1_000_000, 0, t0);
        assert_eq!(a.observe(&T, 5, 0, t0 + Duration::from_secs(1)), None);
        assert!(a.engaged());
        assert_eq!(a.half_open(), 0);
        assert_eq!(a.observe(&T, 10, 0, t0 + Duration::from_secs(2)), None);
        assert_eq!(a.half_open(), 5);
    }
}
