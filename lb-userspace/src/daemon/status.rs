//! The daemon's state as the API's [`Status`] model.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use lb_common::counter;

use super::state::{Inner, Shared};
use crate::{
    api::RequestError,
    config::{AnnounceMode, CheckKind},
    dataplane::TrafficCounters,
    health::passive::Signal,
    model::{
        AnnounceStatus, BackendStatus, DiscoveryStatus, NamedCounter, ServiceState, ServiceStatus,
        Status, VipStatus,
    },
};

impl Shared {
    /// Every service, or only `only`.
    pub fn status(&self, only: Option<&str>) -> Result<Status, RequestError> {
        let inner = self.lock();
        if let Some(name) = only
            && inner.balancer.service_index(name).is_none()
        {
            return Err(RequestError::NotFound(format!("no service {name:?}")));
        }
        let mut status = build(&inner).map_err(RequestError::Failed)?;
        drop(inner);
        status.events_total = self.events.total();
        status.resources = self.resources.status();
        status.config = Some(self.config.status());
        self.discovery_status(&mut status);
        if let Some(name) = only {
            status.services.retain(|s| s.name == name);
        }
        Ok(status)
    }
}

impl Shared {
    /// Each DNS-discovered service's name and answer, and which backends came from it.
    fn discovery_status(&self, status: &mut Status) {
        let dns = crate::lock(&self.config.dns);
        for service in &mut status.services {
            let Some(d) = dns.get(&service.name) else {
                continue;
            };
            for b in &mut service.backends {
                b.discovered = d
                    .backends
                    .iter()
                    .any(|x| x.address.to_string() == b.address);
            }
            service.discovery = Some(DiscoveryStatus {
                name: d.spec.name.clone(),
                record: d.spec.record.as_str().to_owned(),
                resolvers: d.spec.resolvers.iter().map(ToString::to_string).collect(),
                addresses: d.backends.iter().map(|b| b.address.to_string()).collect(),
                resolved_at: d.resolved_at,
                attempted_at: d.attempted_at,
                ttl_s: d.ttl.map(|t| t.as_secs_f64()),
                stale: d.stale(),
                error: d.error.clone(),
                rejected: d
                    .rejected
                    .iter()
                    .map(|(a, why)| format!("{a}: {why}"))
                    .collect(),
                resolutions_ok: d.counts.ok,
                resolutions_empty: d.counts.empty,
                resolutions_failed: d.counts.failed,
            });
        }
    }
}

impl Shared {
    /// One line for systemd's STATUS=: how many services can be served and how many backends
    /// take new flows. Cheap (no counters read): the health writer asks every second.
    pub fn summary(&self) -> String {
        let inner = self.lock();
        let (mut services, mut unserved, mut available, mut backends) = (0, 0, 0, 0);
        for (sid, s) in inner.config.services.iter().enumerate() {
            let up = (0..s.backends.len())
                .filter(|&bid| inner.balancer.takes_new_flows(sid, bid).unwrap_or(false))
                .count();
            services += 1;
            unserved += usize::from(up == 0);
            available += up;
            backends += s.backends.len();
        }
        let plural = if services == 1 { "" } else { "s" };
        // Route health injection: what the routers are told.
        let announcing = inner
            .announcer
            .as_ref()
            .map_or(String::new(), |a| match a.host() {
                crate::announce::HostMode::Announcing => {
                    format!("; {} VIPs announced", a.announced_count())
                }
                other => format!("; host {}", other.as_str()),
            });
        format!(
            "{services} service{plural} ({unserved} without an available backend), {available} of {backends} backends available{announcing}"
        )
    }
}

fn build(inner: &Inner) -> anyhow::Result<Status> {
    let stats = inner.dataplane.stats()?;
    let now = Instant::now();
    let counters = counter::NAMES
        .iter()
        .zip(&stats.counters)
        .map(|(name, value)| NamedCounter {
            name: (*name).to_owned(),
            value: *value,
        })
        .collect();
    let services = inner
        .config
        .services
        .iter()
        .enumerate()
        .map(|(sid, s)| {
            let traffic = |id: Option<u32>, all: &[TrafficCounters]| {
                id.and_then(|id| all.get(id as usize).copied())
                    .unwrap_or_default()
            };
            let c = traffic(inner.balancer.service_id(sid), &stats.services);
            let backends: Vec<BackendStatus> = s
                .backends
                .iter()
                .enumerate()
                .map(|(bid, b)| {
                    let t = traffic(inner.balancer.backend_id(sid, bid), &stats.backends);
                    let view = inner.view(sid, bid);
                    let ejection = inner.ejection(sid, bid);
                    BackendStatus {
                        address: b.address.to_string(),
                        ip: b.address.ip().to_string(),
                        port: b.address.port(),
                        weight: b.weight,
                        state: view.state,
                        admin: view.admin,
                        available: inner.balancer.takes_new_flows(sid, bid).unwrap_or(false),
                        ejected: ejection.as_ref().map(|e| e.0.clone()),
                        ejected_for_s: ejection.map(|e| e.1),
                        state_for_s: now.saturating_duration_since(view.since).as_secs_f64(),
                        counters: super::state::counters(view.counters),
                        last_probe_latency_ms: view.last_latency.map(|d| d.as_secs_f64() * 1e3),
                        last_failure: view.last_failure.clone(),
                        discovered: false,
                        packets: t.packets,
                        bytes: t.bytes,
                        new_flows: t.new_flows,
                    }
                })
                .collect();
            let windows = s.check.windows();
            let state = ServiceState::of(s.check.kind != CheckKind::None, &backends);
            ServiceStatus {
                name: s.name.clone(),
                vip: s.vip.to_string(),
                protocol: s.protocol.as_str().to_owned(),
                forwarding: s.forwarding.as_str().to_owned(),
                syn_proxy: s.syn_proxy.as_str().to_owned(),
                syn_proxy_engaged: inner.balancer.syn_proxy(sid),
                syn_proxy_rate: inner.syn_auto.get(&s.name).map(|a| a.rate()),
                syn_proxy_half_open: inner.syn_auto.get(&s.name).map(|a| a.half_open()),
                passive_signals: passive_signals(s)
                    .iter()
                    .map(|s| s.as_str().to_owned())
                    .collect(),
                check: s.check.kind.as_str().to_owned(),
                through_tunnel: s.check.through_tunnel,
                failure_window_s: windows.map(|w| w.0),
                success_window_s: windows.map(|w| w.1),
                healthy_threshold: s.check.window.healthy_threshold,
                unhealthy_threshold: s.check.window.unhealthy_threshold,
                failure_thresholds: Some((&s.check.window).into()),
                packets: c.packets,
                bytes: c.bytes,
                new_flows: c.new_flows,
                available_backends: backends.iter().filter(|b| b.available).count() as u32,
                state,
                policy_in_force: (state == ServiceState::Down)
                    .then(|| s.on_all_unhealthy.as_str().to_owned()),
                announce: s.announce.map(|a| a.mode.as_str().to_owned()),
                announce_min_available: s
                    .announce
                    .filter(|a| a.mode == AnnounceMode::Healthy)
                    .map(|a| a.min_available),
                vip_announced: inner.announcer.as_ref().map(|a| a.is_announced(s.vip.ip())),
                discovery: None,
                backends,
            }
        })
        .collect();
    Ok(Status {
        time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        services,
        counters,
        probe_latency: inner.checker.latency_histograms(),
        half_open_syns: inner.checker.half_open_syns(),
        events_total: 0,
        resources: Default::default(),
        config: None,
        announce: inner.announcer.as_ref().map(|a| AnnounceStatus {
            state: a.host().as_str().to_owned(),
            table: a.table(),
            protocol: crate::announce::ROUTE_PROTOCOL,
            grace_s: inner
                .config
                .lb
                .announce
                .as_ref()
                .map_or(0.0, |c| c.grace.as_secs_f64()),
            last_change: a.last_change(),
            vips: a
                .vips()
                .into_iter()
                .map(|v| VipStatus {
                    vip: v.vip.to_string(),
                    announced: v.announced,
                    wanted: v.wanted,
                    reason: v.reason,
                    services: v.services,
                    since: v.since,
                    error: v.error,
                })
                .collect(),
        }),
    })
}

/// The failures the datapath can report for service `s` while its passive checks are on. With
/// direct server return the backend's replies go to the client without lb, so of a TCP
/// connection lb sees only the client's side: a retransmitted SYN (connect timeout); no RST,
/// no unreachable, no data back. UDP has only the backend's ICMP unreachable, which under
/// direct server return goes to the client too.
pub fn passive_signals(s: &crate::config::Service) -> Vec<Signal> {
    use crate::config::Protocol;
    if !s.passive.enabled {
        return Vec::new();
    }
    match (s.protocol, s.forwarding.is_dsr()) {
        (Protocol::Tcp, true) => vec![Signal::ConnectTimeout],
        (Protocol::Udp, true) => Vec::new(),
        (Protocol::Udp, false) => vec![Signal::Unreachable],
        (Protocol::Tcp, false) => {
            let mut v = vec![Signal::Refused, Signal::ConnectTimeout, Signal::Unreachable];
            if s.passive.no_data_timeout.is_some() {
                v.push(Signal::NoData);
            }
            v
        }
    }
}
