//! `syn_proxy = "auto"` in the daemon: once a second, each such service's count of new
//! connections goes to its [`Auto`]; what engages or releases is written into the datapath and
//! reported as an event.

use std::time::Instant;

use tracing::{info, warn};

use super::state::Shared;
use crate::{
    config::SynProxy,
    model::Event,
    synproxy_auto::{Auto, Change},
};

impl Shared {
    /// Reads the services' counters and moves their automatic proxies; call about once a second.
    pub(super) fn syn_proxy_poll(&self) {
        let mut events = Vec::new();
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            let auto_services = || {
                inner
                    .config
                    .services
                    .iter()
                    .any(|s| s.syn_proxy == SynProxy::Auto)
            };
            if !auto_services() {
                inner.syn_auto.clear();
                return;
            }
            let stats = match inner.dataplane.stats() {
                Ok(s) => s,
                Err(e) => {
                    return warn!(error = %format!("{e:#}"), "reading service counters failed");
                }
            };
            let now = Instant::now();
            let thresholds = inner.config.lb.syn_proxy_auto;
            let (config, balancer, dataplane, autos) = (
                &inner.config,
                &mut inner.balancer,
                &mut inner.dataplane,
                &mut inner.syn_auto,
            );
            autos.retain(|name, _| {
                config
                    .services
                    .iter()
                    .any(|s| &s.name == name && s.syn_proxy == SynProxy::Auto)
            });
            for (sid, s) in config.services.iter().enumerate() {
                if s.syn_proxy != SynProxy::Auto {
                    continue;
                }
                let Some(id) = balancer.service_id(sid) else {
                    continue;
                };
                let (syns, handshakes) = stats
                    .services
                    .get(id as usize)
                    .map_or((0, 0), |c| (c.new_flows, c.handshakes));
                let auto = autos
                    .entry(s.name.clone())
                    .or_insert_with(|| Auto::new(balancer.syn_proxy(sid)));
                let Some(change) = auto.observe(&thresholds, syns, handshakes, now) else {
                    continue;
                };
                let t = &thresholds;
                let (on, m, reason) = match change {
                    Change::Engaged(m) if m.rate > t.engage_rate as f64 => (
                        true,
                        m,
                        format!(
                            "{:.0} new connections a second, above syn_proxy_engage_rate {}",
                            m.rate, t.engage_rate
                        ),
                    ),
                    Change::Engaged(m) => (
                        true,
                        m,
                        format!(
                            "{} half-open connections, above syn_proxy_engage_half_open {}",
                            m.half_open, t.engage_half_open
                        ),
                    ),
                    Change::Released(m) => (
                        false,
                        m,
                        format!(
                            "{:.0} new connections a second and {} half-open, below syn_proxy_release_rate {} and syn_proxy_release_half_open {} for {:?}",
                            m.rate,
                            m.half_open,
                            t.release_rate,
                            t.release_half_open,
                            t.release_after
                        ),
                    ),
                };
                let (rate, half_open) = (m.rate, m.half_open);
                match balancer.set_syn_proxy(sid, on, dataplane) {
                    Ok(_) => {
                        info!(service = %s.name, engaged = on, rate, half_open, "SYN proxy {}", if on { "engaged" } else { "released" });
                        events.push(Event {
                            service: s.name.clone(),
                            from: if on { "off" } else { "on" }.to_owned(),
                            to: if on { "on" } else { "off" }.to_owned(),
                            ..Event::daemon("syn_proxy".to_owned(), reason)
                        });
                    }
                    // Not engaged: the next second tries again.
                    Err(e) => {
                        *auto = Auto::new(!on);
                        warn!(service = %s.name, error = %format!("{e:#}"), "writing the SYN proxy's flag failed");
                    }
                }
            }
        }
        for e in events {
            self.events.push(e);
        }
    }
}
