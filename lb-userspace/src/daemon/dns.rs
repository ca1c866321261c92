//! Backends from DNS, the pure part: what each service's name resolved to, and what an answer
//! (or a failure) does to that: keep the last good set on a failure or (by default) an empty
//! answer, when to ask again (the TTL, bounded; a backoff after failures). The queries
//! themselves are daemon/discovery.rs's.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::config::{
    Backend,
    discovery::{Discovery, OnEmpty, Refresh},
};

/// What one resolution gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Addresses, and how long the answer may be kept (its smallest TTL).
    Found {
        backends: Vec<Backend>,
        ttl: Duration,
    },
    /// No address: NXDOMAIN, or no record of the type.
    Empty,
    /// No answer: a timeout, SERVFAIL, REFUSED, a resolver unreachable.
    Failed(String),
}

/// One service's name: the spec it was resolved with and what it gave.
#[derive(Debug, Clone)]
pub struct DnsState {
    pub spec: Discovery,
    /// The addresses in use: the last good answer's.
    pub backends: Vec<Backend>,
    /// Whether an answer has been applied yet.
    pub resolved: bool,
    /// Addresses of the last answer refused as backends, and why (the VIP's own, this host's,
    /// another family...).
    pub rejected: Vec<(SocketAddr, String)>,
    /// Unix time of the last good answer, and of the last attempt.
    pub resolved_at: Option<f64>,
    pub attempted_at: Option<f64>,
    /// The last answer's TTL.
    pub ttl: Option<Duration>,
    /// Why the last attempt gave nothing usable (a failure, or an empty answer kept).
    pub error: Option<String>,
    /// Failures in a row (the backoff).
    pub failures: u32,
    /// When to ask again.
    pub next: Instant,
    pub counts: Counts,
}

/// Resolutions so far, by result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub ok: u64,
    pub empty: u64,
    pub failed: u64,
}

/// Longest wait between attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl DnsState {
    /// A name not resolved yet: due now.
    pub fn new(spec: Discovery, now: Instant) -> Self {
        Self {
            spec,
            backends: Vec::new(),
            resolved: false,
            rejected: Vec::new(),
            resolved_at: None,
            attempted_at: None,
            ttl: None,
            error: None,
            failures: 0,
            next: now,
            counts: Counts::default(),
        }
    }

    /// Takes `outcome` (at `now`, Unix time `unix`); returns whether the addresses in use
    /// changed (and so must be applied).
    pub fn observe(&mut self, outcome: Outcome, now: Instant, unix: f64) -> bool {
        self.attempted_at = Some(unix);
        let refresh = |ttl: Option<Duration>| match self.spec.refresh {
            Refresh::Ttl { min, max } => ttl.unwrap_or(min).clamp(min, max),
            Refresh::Every(d) => d,
        };
        match outcome {
            Outcome::Found { backends, ttl } => {
                self.counts.ok += 1;
                self.failures = 0;
                self.error = None;
                self.resolved_at = Some(unix);
                self.ttl = Some(ttl);
                self.next = now + refresh(Some(ttl));
                let changed = !self.resolved || !same_set(&self.backends, &backends);
                self.backends = backends;
                self.resolved = true;
                changed
            }
            Outcome::Empty => {
                self.counts.empty += 1;
                self.failures = 0;
                self.next = now + refresh(None);
                match self.spec.on_empty {
                    OnEmpty::Apply => {
                        self.error = None;
                        self.resolved_at = Some(unix);
                        let changed = !self.resolved || !self.backends.is_empty();
                        self.backends.clear();
                        self.resolved = true;
                        changed
                    }
                    OnEmpty::KeepLast => {
                        self.error = Some(format!(
                            "no address for {} ({} record): the last {} kept (on_empty = \
                             \"keep_last\")",
                            self.spec.name,
                            self.spec.record.as_str(),
                            self.backends.len()
                        ));
                        false
                    }
                }
            }
            Outcome::Failed(why) => {
                self.counts.failed += 1;
                self.failures += 1;
                self.error = Some(why);
                // 1, 2, 4 ... s, at most 30 s (and no later than a good answer would be asked
                // again).
                let backoff = Duration::from_secs(1 << self.failures.min(5).saturating_sub(1))
                    .min(MAX_BACKOFF)
                    .min(refresh(self.ttl).max(Duration::from_secs(1)));
                self.next = now + backoff;
                false
            }
        }
    }

    /// Whether its addresses are a failed or empty attempt's leftovers.
    pub fn stale(&self) -> bool {
        self.error.is_some()
    }
}

/// Whether two answers hold the same backends (order aside).
fn same_set(a: &[Backend], b: &[Backend]) -> bool {
    let key = |list: &[Backend]| {
        let mut v: Vec<(SocketAddr, u32)> = list.iter().map(|b| (b.address, b.weight)).collect();
        v.sort();
        v
    };
    key(a) == key(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::discovery::Record;

    fn spec(on_empty: OnEmpty) -> Discovery {
        Discovery {
            name: "web.test".into(),
            record: Record::A,
            port: Some(8080),
            resolvers: Vec::new(),
            refresh: Refresh::Ttl {
                min: Duration::from_secs(1),
                max: Duration::from_secs(60),
            },
            weight: 1,
            on_empty,
            timeout: Duration::from_secs(2),
        }
    }

    fn found(addrs: &[&str], ttl: u64) -> Outcome {
        Outcome::Found {
            backends: addrs
                .iter()
                .map(|a| Backend {
                    address: a.parse().unwrap(),
                    weight: 1,
                    server_id: None,
                })
                .collect(),
            ttl: Duration::from_secs(ttl),
        }
    }

    #[test]
    fn answers_change_the_set_failures_keep_it() {
        let t0 = Instant::now();
        let mut s = DnsState::new(spec(OnEmpty::KeepLast), t0);
        assert!(s.observe(found(&["10.0.2.1:8080"], 5), t0, 1.0));
        assert_eq!(s.next, t0 + Duration::from_secs(5));
        // The same answer again, in another order: nothing to apply.
        assert!(!s.observe(found(&["10.0.2.1:8080"], 5), t0, 2.0));
        assert!(s.observe(found(&["10.0.2.2:8080", "10.0.2.1:8080"], 500), t0, 3.0));
        assert_eq!(
            s.next,
            t0 + Duration::from_secs(60),
            "the TTL bounded by max_ttl"
        );
        // A failure keeps the set, is stale, backs off 1, 2, 4 s.
        for (i, backoff) in [1, 2, 4].into_iter().enumerate() {
            assert!(!s.observe(Outcome::Failed("SERVFAIL".into()), t0, 4.0 + i as f64));
            assert_eq!(s.next, t0 + Duration::from_secs(backoff));
        }
        assert!(s.stale());
        assert_eq!(s.backends.len(), 2);
        // An empty answer is kept too (by default).
        assert!(!s.observe(Outcome::Empty, t0, 8.0));
        assert_eq!(s.backends.len(), 2);
        assert!(s.error.as_deref().unwrap().contains("the last 2 kept"));
        assert!(s.observe(found(&["10.0.2.3:8080"], 0), t0, 9.0));
        assert!(!s.stale());
        assert_eq!(
            s.next,
            t0 + Duration::from_secs(1),
            "the TTL bounded by min_ttl"
        );
        assert_eq!(
            s.counts,
            Counts {
                ok: 4,
                empty: 1,
                failed: 3
            }
        );
    }

    #[test]
    fn an_empty_answer_applies_when_told_to() {
        let t0 = Instant::now();
        let mut s = DnsState::new(spec(OnEmpty::Apply), t0);
        assert!(s.observe(found(&["10.0.2.1:8080"], 5), t0, 1.0));
        assert!(s.observe(Outcome::Empty, t0, 2.0));
        assert!(s.backends.is_empty() && !s.stale());
        assert!(!s.observe(Outcome::Empty, t0, 3.0));
    }
}
