//! Passive checks in the daemon: datapath signals and probe results go through the pure
//! ejection rule ([`crate::health::passive`]); ejections and returns are written as the
//! backend's ejected flag (the datapath needs health and no ejection to send new flows) and
//! recorded as events.
//!
//! How active and passive verdicts combine: a backend takes new flows when its active verdict
//! is available AND neither its service scope nor its host scope is ejected. So a backend whose
//! probes pass while real connections fail is ejected by traffic (and returns early once
//! `healthy_threshold` probes pass after the ejection, or when the ejection time is up; if
//! traffic still fails it is ejected again); a backend whose probes fail is out whatever traffic
//! says, and stays out past its ejection time until probes pass.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use lb_common::PassiveSignal;

use tracing::{info, warn};

use super::state::{Inner, Shared};
use crate::{
    health::{
        checker::{ProbeKey, Verdict},
        passive::{Change, Scope, Signal},
        probe::ProbeResult,
    },
    model::{Event, ProbeCounters},
};

impl Inner {
    /// Whether any service using probe `key` has passive checks on (its results then feed the
    /// host scope and end ejections early).
    pub fn probe_feeds_passive(&self, key: &ProbeKey) -> bool {
        self.members.get(key).is_some_and(|pairs| {
            pairs
                .iter()
                .any(|&(sid, _)| self.config.services[sid].passive.enabled)
        })
    }

    /// Passive time: monotonic, from the daemon's start.
    fn passive_now(&self) -> Duration {
        self.started.elapsed()
    }

    fn service_scope(&self, sid: usize, bid: usize) -> Scope {
        let s = &self.config.services[sid];
        Scope::Service {
            service: s.name.clone(),
            backend: s.backends[bid].address,
        }
    }

    /// Why a backend is ejected, if it is: "service: refused" / "host: connect_timeout", with
    /// the seconds left.
    pub fn ejection(&self, sid: usize, bid: usize) -> Option<(String, f64)> {
        let now = self.passive_now();
        let host = Scope::Host(self.config.services[sid].backends[bid].address.ip());
        [("service", self.service_scope(sid, bid)), ("host", host)]
            .into_iter()
            .find_map(|(name, scope)| {
                let (until, signal) = self.passive.ejection(&scope)?;
                Some((
                    format!("{name}: {}", signal.as_str()),
                    until.saturating_sub(now).as_secs_f64(),
                ))
            })
    }

    /// The (service, backend) pairs a scope covers, among services with passive checks on.
    fn pairs_of(&self, scope: &Scope) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (sid, s) in self.config.services.iter().enumerate() {
            if !s.passive.enabled {
                continue;
            }
            for (bid, b) in s.backends.iter().enumerate() {
                let hit = match scope {
                    Scope::Host(ip) => b.address.ip() == *ip,
                    Scope::Service { service, backend } => {
                        *service == s.name && *backend == b.address
                    }
                };
                if hit {
                    out.push((sid, bid));
                }
            }
        }
        out
    }
}

impl Shared {
    /// Traffic-triggered probing: a probe runs while any service it serves probes always, or
    /// while one of its traffic-triggered backends had packets within `traffic_idle`. Reads the
    /// per-backend packet counters; call about once a second.
    pub(super) fn traffic_poll(&self) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner
            .config
            .services
            .iter()
            .any(|s| s.passive.traffic_triggered)
        {
            return;
        }
        let stats = match inner.dataplane.stats() {
            Ok(s) => s,
            Err(e) => return warn!(error = %format!("{e:#}"), "reading traffic counters failed"),
        };
        let now = Instant::now();
        for (id, t) in stats.backends.iter().enumerate() {
            let entry = inner.traffic.entry(id as u32).or_insert((t.packets, None));
            if t.packets != entry.0 {
                *entry = (t.packets, Some(now));
            }
        }
        let inner = &*inner;
        inner.checker.set_active(|key| {
            inner.members.get(key).is_none_or(|pairs| {
                pairs.iter().any(|&(sid, bid)| {
                    let passive = &inner.config.services[sid].passive;
                    !passive.traffic_triggered
                        || inner
                            .balancer
                            .backend_id(sid, bid)
                            .and_then(|id| inner.traffic.get(&id))
                            .and_then(|t| t.1)
                            .is_some_and(|last| now.duration_since(last) < passive.traffic_idle)
                })
            })
        });
    }

    /// Applies the datapath's signals and the ejections that ended; writes what changed.
    pub(super) fn passive_apply(&self, signals: Vec<PassiveSignal>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let now = inner.passive_now();
        let mut changes = Vec::new();
        for s in signals {
            let Some(signal) = signal_of(s.kind) else {
                continue;
            };
            let Some((sid, bid)) = inner.balancer.backend_by_id(s.backend_id) else {
                continue; // a backend removed since
            };
            let service = &inner.config.services[sid];
            if !service.passive.enabled {
                continue;
            }
            let settings = service.passive.settings;
            let address = service.backends[bid].address;
            let scope = inner.service_scope(sid, bid);
            changes.extend(inner.passive.failure(scope, signal, &settings, now));
            // "No data back" says nothing of the host: another service on it may be fine.
            if signal != Signal::NoData {
                changes.extend(inner.passive.failure(
                    Scope::Host(address.ip()),
                    signal,
                    &settings,
                    now,
                ));
            }
        }
        changes.extend(inner.passive.tick(now));
        let events = apply(inner, changes);
        drop(guard);
        for e in events {
            self.events.push(e);
        }
    }

    /// When the first ejection in force ends by itself: when [`Shared::passive_apply`] has work
    /// without a signal.
    pub(super) fn passive_deadline(&self) -> Option<Instant> {
        let inner = self.lock();
        inner.passive.next_end().map(|end| inner.started + end)
    }

    /// A probe result of a probe that feeds passive checks.
    pub(super) fn passive_probe(&self, v: &Verdict) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.probe_feeds_passive(&v.probe) {
            return;
        }
        let now = inner.passive_now();
        let pairs = inner.members.get(&v.probe).cloned().unwrap_or_default();
        let host = Scope::Host(v.probe.target.ip());
        let threshold = v.probe.check.window.healthy_threshold;
        let mut changes = Vec::new();
        match v.result {
            // Probes end host-scope ejections only (seed 000); service scopes end by time.
            ProbeResult::Success { .. } => {
                changes.extend(inner.passive.probe_success(&host, threshold, now));
            }
            // Neither: the answer was in neither status set.
            ProbeResult::Neutral(_) => {}
            _ => {
                inner.passive.probe_failure(&host);
                // Probe failures count at host scope, under the first passive service's rule.
                if let Some(&(sid, _)) = pairs
                    .iter()
                    .find(|&&(sid, _)| inner.config.services[sid].passive.enabled)
                {
                    let settings = inner.config.services[sid].passive.settings;
                    changes.extend(inner.passive.failure(host, Signal::Probe, &settings, now));
                }
            }
        }
        let events = apply(inner, changes);
        drop(guard);
        for e in events {
            self.events.push(e);
        }
    }
}

fn signal_of(kind: u32) -> Option<Signal> {
    use lb_common::signal_kind as signal;
    match kind {
        signal::REFUSED => Some(Signal::Refused),
        signal::CONNECT_TIMEOUT => Some(Signal::ConnectTimeout),
        signal::UNREACHABLE => Some(Signal::Unreachable),
        signal::NO_DATA => Some(Signal::NoData),
        _ => None,
    }
}

/// Writes the ejected flag of every pair the changes touch and returns their events.
fn apply(inner: &mut Inner, changes: Vec<Change>) -> Vec<Event> {
    let mut events = Vec::new();
    for change in changes {
        let (scope, label) = match &change {
            Change::Ejected {
                scope,
                signal,
                failures,
                until,
            } => {
                let left = until.saturating_sub(inner.passive_now()).as_secs();
                (
                    scope.clone(),
                    format!(
                        "passive: {} ejected ({} × {}; {left}s)",
                        scope_name(scope),
                        failures,
                        signal.as_str()
                    ),
                )
            }
            Change::Returned { scope, how } => (
                scope.clone(),
                format!("passive: {} returned ({how})", scope_name(scope)),
            ),
        };
        for (sid, bid) in inner.pairs_of(&scope) {
            let address: SocketAddr = inner.config.services[sid].backends[bid].address;
            let ejected = inner.passive.is_ejected(&inner.service_scope(sid, bid))
                || inner.passive.is_ejected(&Scope::Host(address.ip()));
            let before = inner.view(sid, bid).state;
            let was = inner.balancer.is_ejected(sid, bid).unwrap_or(false);
            let writing = Instant::now();
            let written = inner
                .balancer
                .write_ejected_flag(sid, bid, ejected, &mut inner.dataplane)
                .and_then(|changed| {
                    if changed {
                        inner.balancer.sync_service(sid, &mut inner.dataplane)?;
                    }
                    Ok(changed)
                });
            let flag_us = match written {
                Ok(true) => Some(writing.elapsed().as_micros() as u64),
                Ok(false) => None,
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "writing a passive ejection failed");
                    None
                }
            };
            let service = &inner.config.services[sid];
            info!(
                service = %service.name,
                backend = %address,
                source = %label,
                ejected,
                flag_write_us = flag_us,
                "passive check"
            );
            let state = before.as_str().to_owned();
            let show = |e: bool| {
                if e {
                    "ejected".to_owned()
                } else {
                    state.clone()
                }
            };
            events.push(Event {
                seq: 0,
                time: 0.0,
                service: service.name.clone(),
                backend: address.to_string(),
                from: show(was),
                to: show(ejected),
                source: label.clone(),
                counters: ProbeCounters::default(),
                healthy_threshold: service.check.window.healthy_threshold,
                unhealthy_threshold: service.passive.settings.failures,
                flag_write_us: flag_us,
                reason: None,
                vip: None,
            });
        }
    }
    events
}

fn scope_name(scope: &Scope) -> &'static str {
    match scope {
        Scope::Host(_) => "host",
        Scope::Service { .. } => "service",
    }
}
