//! Passive checks (SPEC §3, seed 000): failures seen in real traffic eject a backend.
//!
//! `failures` failures within `window`, counted from the first failure of the run, eject the
//! scope for `ejection`; afterwards it returns by itself, and if it is still broken traffic trips
//! the rule again (each ejection is an event). Successes are not counted. With active checks on,
//! `healthy_threshold` consecutive probe successes after a host's ejection end it early; a
//! service-scope ejection ends only when its time is up (seed 000: probes act on the
//! address-level state only), since a passing SYN says nothing about what ejected it there (no
//! data back, say). Failing probes keep the backend out past the ejection time through the
//! active verdict itself (the datapath needs both to let flows in).
//!
//! Two scopes: a host (backend IP: connection failures of every service and probe failures) and
//! a service's backend (VIP:port → backend ip:port: all its failures). Either scope ejected means
//! no new flows for that service's backend. Time is passed in: the machine is pure.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

pub use crate::config::PassiveSettings;

/// What is ejected.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Host(IpAddr),
    Service {
        service: String,
        backend: SocketAddr,
    },
}

/// A failure signal from the datapath (or a probe, at host scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// The backend answered a client's SYN with RST.
    Refused,
    /// A client retransmitted its SYN: the backend did not answer (connect timeout).
    ConnectTimeout,
    /// ICMP destination unreachable from the backend's side about a flow.
    Unreachable,
    /// A connection whose client sent data got none back within `no_data_timeout` (service
    /// scope only: seed 000 counts connection failures in both scopes, "no data" in the
    /// service's).
    NoData,
    /// An active probe failed (host scope only).
    Probe,
}

impl Signal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::ConnectTimeout => "connect_timeout",
            Self::Unreachable => "unreachable",
            Self::NoData => "no_data",
            Self::Probe => "probe",
        }
    }
}

/// An ejection or a return: every one is an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Ejected {
        scope: Scope,
        signal: Signal,
        failures: u32,
        until: Duration,
    },
    Returned {
        scope: Scope,
        /// "timeout" or "probes".
        how: &'static str,
    },
}

#[derive(Debug, Clone, Default)]
struct Entry {
    /// Start of the current run of failures and how many so far.
    first: Duration,
    count: u32,
    ejected_until: Option<Duration>,
    /// The signal that caused the ejection.
    signal: Option<Signal>,
    /// Consecutive probe successes since the ejection.
    successes: u32,
}

/// The passive state of every scope.
#[derive(Debug, Default)]
pub struct Ejector {
    entries: HashMap<Scope, Entry>,
}

impl Ejector {
    /// Records a failure of `scope` under `settings`; returns the ejection it caused.
    pub fn failure(
        &mut self,
        scope: Scope,
        signal: Signal,
        settings: &PassiveSettings,
        now: Duration,
    ) -> Option<Change> {
        let e = self.entries.entry(scope.clone()).or_default();
        if e.ejected_until.is_some() {
            return None; // already out: nothing more to decide
        }
        if e.count == 0 || now.saturating_sub(e.first) > settings.window {
            e.first = now;
            e.count = 0;
        }
        e.count += 1;
        if e.count < settings.failures.max(1) {
            return None;
        }
        let failures = e.count;
        let until = now + settings.ejection;
        *e = Entry {
            ejected_until: Some(until),
            signal: Some(signal),
            ..Entry::default()
        };
        Some(Change::Ejected {
            scope,
            signal,
            failures,
            until,
        })
    }

    /// A probe of `scope` succeeded; after `healthy_threshold` in a row a host's ejection ends
    /// early. A service scope's does not (see the module's docs).
    pub fn probe_success(
        &mut self,
        scope: &Scope,
        healthy_threshold: u32,
        now: Duration,
    ) -> Option<Change> {
        let _ = now;
        if let Scope::Service { .. } = scope {
            return None;
        }
        let e = self.entries.get_mut(scope)?;
        e.ejected_until?;
        e.successes += 1;
        if e.successes < healthy_threshold.max(1) {
            return None;
        }
        self.entries.remove(scope);
        Some(Change::Returned {
            scope: scope.clone(),
            how: "probes",
        })
    }

    /// A probe of `scope` failed: an ejected scope's run of successes starts over.
    pub fn probe_failure(&mut self, scope: &Scope) {
        if let Some(e) = self.entries.get_mut(scope) {
            e.successes = 0;
        }
    }

    /// Ends the ejections whose time is up; call regularly.
    pub fn tick(&mut self, now: Duration) -> Vec<Change> {
        let mut returned: Vec<Scope> = self
            .entries
            .iter()
            .filter(|(_, e)| e.ejected_until.is_some_and(|u| u <= now))
            .map(|(s, _)| s.clone())
            .collect();
        returned.sort();
        for s in &returned {
            self.entries.remove(s);
        }
        returned
            .into_iter()
            .map(|scope| Change::Returned {
                scope,
                how: "timeout",
            })
            .collect()
    }

    /// When the first ejection in force ends by itself (when [`Ejector::tick`] has work).
    pub fn next_end(&self) -> Option<Duration> {
        self.entries.values().filter_map(|e| e.ejected_until).min()
    }

    pub fn is_ejected(&self, scope: &Scope) -> bool {
        self.entries
            .get(scope)
            .is_some_and(|e| e.ejected_until.is_some())
    }

    /// When the ejection of `scope` ends and the signal that caused it, if ejected.
    pub fn ejection(&self, scope: &Scope) -> Option<(Duration, Signal)> {
        let e = self.entries.get(scope)?;
        Some((e.ejected_until?, e.signal?))
    }

    /// Forgets scopes for which `keep` is false (removed by a reload).
    pub fn retain(&mut self, keep: impl Fn(&Scope) -> bool) {
        self.entries.retain(|s, _| keep(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: PassiveSettings = PassiveSettings {
        failures: 3,
        window: Duration::from_secs(10),
        ejection: Duration::from_secs(5),
    };

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn host() -> Scope {
        Scope::Host(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 2, 10)))
    }

    #[test]
    fn n_failures_within_the_window_eject_for_the_ejection_time() {
        let mut e = Ejector::default();
        assert_eq!(e.failure(host(), Signal::Refused, &S, secs(0.0)), None);
        assert_eq!(e.failure(host(), Signal::Refused, &S, secs(4.0)), None);
        let change = e.failure(host(), Signal::ConnectTimeout, &S, secs(9.0));
        assert_eq!(
            change,
            Some(Change::Ejected {
                scope: host(),
                signal: Signal::ConnectTimeout,
                failures: 3,
                until: secs(14.0)
            })
        );
        assert!(e.is_ejected(&host()));
        assert_eq!(e.failure(host(), Signal::Refused, &S, secs(10.0)), None);
        assert!(e.tick(secs(13.9)).is_empty());
        assert_eq!(
            e.tick(secs(14.0)),
            [Change::Returned {
                scope: host(),
                how: "timeout"
            }]
        );
        assert!(!e.is_ejected(&host()));
        // Still broken: traffic trips it again, counting from zero.
        e.failure(host(), Signal::Refused, &S, secs(15.0));
        e.failure(host(), Signal::Refused, &S, secs(15.1));
        assert!(e.failure(host(), Signal::Refused, &S, secs(15.2)).is_some());
    }

    #[test]
    fn the_window_counts_from_the_first_failure() {
        let mut e = Ejector::default();
        e.failure(host(), Signal::Refused, &S, secs(0.0));
        e.failure(host(), Signal::Refused, &S, secs(9.0));
        // 10.5 s after the first: a new run starts here.
        assert_eq!(e.failure(host(), Signal::Refused, &S, secs(10.5)), None);
        assert_eq!(e.failure(host(), Signal::Refused, &S, secs(11.0)), None);
        assert!(e.failure(host(), Signal::Refused, &S, secs(12.0)).is_some());
    }

    /// Seed 000: probes end a host's ejection early, never a service scope's, which ends by time.
    #[test]
    fn probes_end_a_host_ejection_early_and_a_service_one_only_by_time() {
        let mut e = Ejector::default();
        let scope = Scope::Service {
            service: "web".into(),
            backend: "10.0.2.10:80".parse().unwrap(),
        };
        for t in 0..3 {
            e.failure(host(), Signal::Refused, &S, secs(f64::from(t)));
            e.failure(scope.clone(), Signal::Refused, &S, secs(f64::from(t)));
        }
        assert!(e.is_ejected(&host()) && e.is_ejected(&scope));
        assert_eq!(e.probe_success(&host(), 2, secs(3.0)), None);
        e.probe_failure(&host());
        assert_eq!(e.probe_success(&host(), 2, secs(3.5)), None);
        assert_eq!(
            e.probe_success(&host(), 2, secs(4.0)),
            Some(Change::Returned {
                scope: host(),
                how: "probes"
            })
        );
        assert!(!e.is_ejected(&host()));
        for t in 0..5 {
            assert_eq!(e.probe_success(&scope, 1, secs(4.0 + f64::from(t))), None);
        }
        assert!(
            e.is_ejected(&scope),
            "probes do not end a service-scope ejection"
        );
        let ended = e.tick(secs(100.0));
        assert_eq!(
            ended,
            [Change::Returned {
                scope: scope.clone(),
                how: "timeout"
            }]
        );
        // Successes of a scope that is not ejected do nothing.
        assert_eq!(e.probe_success(&host(), 1, secs(101.0)), None);
    }

    #[test]
    fn scopes_are_independent() {
        let mut e = Ejector::default();
        let svc = Scope::Service {
            service: "web".into(),
            backend: "10.0.2.10:80".parse().unwrap(),
        };
        for t in 0..3 {
            e.failure(host(), Signal::Unreachable, &S, secs(f64::from(t)));
        }
        assert!(e.is_ejected(&host()));
        assert!(!e.is_ejected(&svc));
        e.retain(|s| *s != host());
        assert!(!e.is_ejected(&host()));
    }
}
