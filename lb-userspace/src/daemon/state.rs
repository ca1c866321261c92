//! The running daemon's state and every change to it: health verdicts, operator actions and
//! config reloads. One lock holds config, datapath, balancer and checker together, so a reader
//! (the API) never sees them disagree; every change is an event.

use std::{
    collections::{BTreeSet, HashMap},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::sync::watch;
use tracing::{info, warn};

use super::signal::AnnounceSignal;
use crate::{
    announce::{Announcer, HostMode},
    api::RequestError,
    balancer::{Admin, Balancer, Ids},
    config::Config,
    dataplane::Dataplane,
    events::EventLog,
    health::{
        checker::{Checker, ProbeKey, Verdict},
        outcome::ProbeResult,
        passive::Ejector,
        window::{Counters, HealthState},
    },
    model::{Event, ProbeCounters},
    trace,
};

/// How the daemon should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Running,
    /// Exit; a pinned datapath keeps forwarding for the next `lb run` (SIGTERM, SIGINT).
    Exit,
    /// Exit and remove the datapath, pinned or not (`lb stop`).
    Remove,
}

pub struct Shared {
    pub(super) inner: Mutex<Inner>,
    /// Asks the health writer to write the VIPs' routes (route health injection).
    pub(super) announce: Arc<AnnounceSignal>,
    /// Where the host's announcing state is kept next to a pinned datapath (None: not pinned).
    pub(super) host_file: Option<PathBuf>,
    pub events: EventLog,
    /// The daemon's own resources and shortages (outside the lock: counted from anywhere).
    pub resources: crate::resources::Resources,
    /// The datapath trace (`lb trace`): its sessions and the names of the ids it shows.
    pub trace: Arc<trace::Hub>,
    /// The configuration's file, version and changes.
    pub(super) config: super::running::ConfigState,
    /// Where the ids of a pinned datapath are saved (None: not pinned).
    ids_file: Option<PathBuf>,
    stop: watch::Sender<Stop>,
}

pub(super) struct Inner {
    pub config: Config,
    pub dataplane: Dataplane,
    pub balancer: Balancer,
    pub checker: Checker,
    /// The (service, backend) pairs each probe stands for.
    pub members: HashMap<ProbeKey, Vec<(usize, usize)>>,
    /// When each backend's admin setting last changed (its state's age while drained/disabled).
    pub admin_since: HashMap<(String, SocketAddr), Instant>,
    /// Passive checks' ejections, on the daemon's clock (`started`).
    pub passive: Ejector,
    pub started: Instant,
    /// Per backend id: its packet counter when last read and when it last moved (traffic-
    /// triggered probing).
    pub traffic: HashMap<u32, (u64, Option<Instant>)>,
    /// Route health injection (None without `[lb.announce]`).
    pub announcer: Option<Announcer>,
    /// The services with `syn_proxy = "auto"`, by name: when their proxy engages.
    pub syn_auto: HashMap<String, crate::synproxy_auto::Auto>,
}

/// What a backend shows: health state (with admin and weight folded in), counters, latency,
/// time in state.
pub struct BackendView {
    pub state: HealthState,
    pub admin: Admin,
    pub counters: Counters,
    pub last_latency: Option<Duration>,
    /// Why its last failed probe failed.
    pub last_failure: Option<String>,
    pub since: Instant,
}

/// Who the trace's ids are (services, backends, how each service forwards).
pub(super) fn names(config: &Config, balancer: &Balancer) -> trace::Names {
    let ids = balancer.ids();
    trace::Names {
        services: ids
            .services
            .iter()
            .map(|s| (s.id, s.name.clone()))
            .collect(),
        backends: ids
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(|&(address, id, _)| (id, address)))
            .collect(),
        dsr: ids
            .services
            .iter()
            .filter_map(|s| {
                let c = config.services.iter().find(|c| c.name == s.name)?;
                c.forwarding
                    .is_dsr()
                    .then_some((s.id, c.forwarding.as_str()))
            })
            .collect(),
    }
}

pub(super) fn members(config: &Config) -> HashMap<ProbeKey, Vec<(usize, usize)>> {
    crate::health::checker::plan(config).into_iter().collect()
}

impl Shared {
    pub(super) fn new(
        config: super::running::ConfigState,
        ids_file: Option<PathBuf>,
        host_file: Option<PathBuf>,
        inner: Inner,
        stop: watch::Sender<Stop>,
        trace: Arc<trace::Hub>,
    ) -> Self {
        trace.set_names(names(&inner.config, &inner.balancer));
        let shared = Self {
            inner: Mutex::new(inner),
            announce: Arc::default(),
            host_file,
            events: EventLog::new(crate::events::CAPACITY),
            resources: Default::default(),
            trace,
            config,
            ids_file,
            stop,
        };
        shared.save_ids();
        shared.save_host_state();
        shared
    }

    /// The daemon's state; `host`: how the host announces at first (drained if it was before
    /// a restart).
    pub(super) fn inner(
        config: Config,
        dataplane: Dataplane,
        balancer: Balancer,
        checker: Checker,
        host: HostMode,
    ) -> Inner {
        Inner {
            announcer: config
                .lb
                .announce
                .as_ref()
                .map(|a| Announcer::new(a.table, host)),
            members: members(&config),
            config,
            dataplane,
            balancer,
            checker,
            admin_since: HashMap::new(),
            passive: Ejector::default(),
            started: Instant::now(),
            traffic: HashMap::new(),
            syn_auto: HashMap::new(),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::lock(&self.inner)
    }

    /// This host ran short of something (descriptors, buffers) at `place`: logged loudly and an
    /// event, once per [`crate::resources::REPORT_EVERY`] per place.
    pub fn local_shortage(&self, place: &'static str, what: &str) {
        if !self.resources.should_report(place, Instant::now()) {
            return;
        }
        let limit = self
            .resources
            .fd_limit
            .load(std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            place,
            what,
            fd_limit = limit,
            "local resource shortage: this host, not a backend, is failing"
        );
        self.events
            .push(Event::daemon(format!("local: {place}"), what.to_owned()));
    }

    /// Asks the daemon to end.
    pub fn request_stop(&self, how: Stop) {
        self.stop.send_replace(how);
    }

    /// Writes verdicts into the datapath for every (service, backend) their probes stand for,
    /// flags first, then rings, and records the events. The verdicts the writer found waiting
    /// together (a burst: backends failing at once) are written together: every flag, then
    /// each changed service's ring once. One at a time, each verdict waited for the ring
    /// rewrites of all before it (milliseconds each), seconds for a rack of backends.
    pub fn apply_verdicts(&self, verdicts: Vec<Verdict>) {
        let mut moved = Vec::new();
        for v in verdicts {
            if let ProbeResult::Local(_) = v.result {
                crate::resources::Resources::count(&self.resources.probe_local_failures);
                let text = v.result.failure(v.probe.check.window.timeout);
                self.local_shortage(
                    "health probes",
                    &format!(
                        "{} probe of {}: {} (no verdict against the backend)",
                        v.probe.check.label(),
                        v.probe.target,
                        text.unwrap_or_default()
                    ),
                );
                continue;
            }
            self.passive_probe(&v);
            if let Some(t) = v.transition {
                moved.push((v, t));
            }
        }
        if moved.is_empty() {
            return;
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut changed_services = BTreeSet::new();
        // Each verdict's events go out with its flags (stamped as they are written, before
        // the lock is let go: a status that shows the move finds its event); the same events
        // are logged after the rings, with their rewrite's time. What they name is read now,
        // while the config is the one the pairs index.
        let mut written = Vec::with_capacity(moved.len());
        for (v, t) in moved {
            // A verdict of a probe that a reload removed: nobody to apply it to.
            let Some(pairs) = inner.members.get(&v.probe).cloned() else {
                continue;
            };
            let up = t.to.is_available();
            let mut flag_us = None;
            for &(sid, bid) in &pairs {
                // Compared with what is written, not with the old state: an adopted datapath
                // may hold a flag from before the restart that this first verdict must
                // correct. The figure is the write itself (the syscall), not the wait for the
                // lock.
                let writing = Instant::now();
                match inner
                    .balancer
                    .write_up_flag(sid, bid, up, &mut inner.dataplane)
                {
                    Ok(true) => {
                        flag_us.get_or_insert(writing.elapsed().as_micros() as u64);
                        changed_services.insert(sid);
                    }
                    Ok(false) => {}
                    Err(e) => warn!(error = %format!("{e:#}"), "writing a health flag failed"),
                }
            }
            let reason = v.result.failure(v.probe.check.window.timeout);
            for &(sid, bid) in &pairs {
                let service = &inner.config.services[sid];
                let event = Event {
                    seq: 0,
                    time: 0.0,
                    service: service.name.clone(),
                    backend: service.backends[bid].address.to_string(),
                    from: t.from.as_str().to_owned(),
                    to: t.to.as_str().to_owned(),
                    source: service.check.label(),
                    counters: counters(t.counters),
                    healthy_threshold: service.check.window.healthy_threshold,
                    unhealthy_threshold: service.check.window.unhealthy_threshold,
                    flag_write_us: flag_us,
                    reason: reason.clone(),
                    vip: None,
                };
                self.events.push(event.clone());
                written.push(event);
            }
        }
        drop(guard);
        // Then the rings, each on its own: a backend shared by many services changes them all
        // (500 services: 2–3 s of rewrites in a release build). Each ring is computed outside
        // the lock (its Maglev population is milliseconds) and only written under it, so the
        // API and the other writers wait for a write, not a computation. A reload meanwhile
        // has rewritten every ring itself: the ring is then computed again under the lock,
        // which changes nothing.
        let writing = Instant::now();
        let mut ring_us = None;
        for sid in changed_services {
            let plan = self.lock().balancer.ring_plan(sid);
            let Some(plan) = plan else { continue };
            let ring = plan.compute();
            let mut guard = self.lock();
            let inner = &mut *guard;
            if let Err(e) = inner.balancer.write_ring(ring, &mut inner.dataplane) {
                warn!(error = %format!("{e:#}"), "rewriting a ring failed");
            }
            ring_us = Some(writing.elapsed().as_micros() as u64);
        }
        for e in written {
            let c = e.counters;
            info!(
                service = %e.service,
                backend = %e.backend,
                from = e.from,
                to = e.to,
                source = e.source,
                reason = e.reason.as_deref(),
                success = c.success,
                tcp_failure = c.tcp_failure,
                tls_failure = c.tls_failure,
                http_failure = c.http_failure,
                payload_failure = c.payload_failure,
                timeout_failure = c.timeout_failure,
                healthy_threshold = e.healthy_threshold,
                unhealthy_threshold = e.unhealthy_threshold,
                flag_write_us = e.flag_write_us,
                ring_write_us = ring_us,
                "health state changed"
            );
        }
    }

    /// `lb backend drain|enable|disable SERVICE ADDRESS`.
    pub fn set_admin(
        &self,
        service: &str,
        address: &str,
        admin: Admin,
    ) -> Result<BackendView, RequestError> {
        let address: SocketAddr = address.parse().map_err(|_| {
            RequestError::Invalid(vec![format!(
                "backend address: expected IPv4:PORT or [IPv6]:PORT, got {address:?}"
            )])
        })?;
        let mut guard = self.lock();
        let inner = &mut *guard;
        let sid = inner
            .balancer
            .service_index(service)
            .ok_or_else(|| RequestError::NotFound(format!("no service {service:?}")))?;
        let bid = inner.balancer.backend_index(sid, address).ok_or_else(|| {
            RequestError::NotFound(format!("service {service:?} has no backend {address}"))
        })?;
        let before = inner.view(sid, bid);
        let changed = inner
            .balancer
            .set_admin(sid, bid, admin, &mut inner.dataplane)
            .map_err(RequestError::Failed)?;
        if changed {
            inner
                .admin_since
                .insert((service.to_owned(), address), Instant::now());
        }
        let after = inner.view(sid, bid);
        let check = inner.config.services[sid].check.clone();
        drop(guard);
        if changed {
            info!(service, backend = %address, admin = admin.as_str(), "admin setting changed");
            self.events.push(Event {
                seq: 0,
                time: 0.0,
                service: service.to_owned(),
                backend: address.to_string(),
                from: before.state.as_str().to_owned(),
                to: after.state.as_str().to_owned(),
                source: format!("admin: {}", admin.as_str()),
                counters: counters(after.counters),
                healthy_threshold: check.window.healthy_threshold,
                unhealthy_threshold: check.window.unhealthy_threshold,
                flag_write_us: None,
                reason: None,
                vip: None,
            });
            self.save_ids();
            // A drained or disabled backend may take its VIP's route with it.
            self.announce.request();
        }
        Ok(after)
    }

    /// Saves the balancer's ids next to a pinned datapath (atomically: write, then rename).
    pub(super) fn save_ids(&self) {
        let Some(path) = &self.ids_file else { return };
        let ids = self.lock().balancer.ids();
        if let Err(e) = write_ids(path, &ids) {
            warn!(path = %path.display(), error = %format!("{e:#}"), "saving the datapath ids failed: a restart could not adopt the datapath");
        }
    }
}

impl Inner {
    /// Probes that feed passive checks report every result.
    pub fn set_reporting(&self) {
        self.checker
            .set_reporting(|key| self.probe_feeds_passive(key));
    }

    /// What backend `bid` of service `sid` shows.
    pub fn view(&self, sid: usize, bid: usize) -> BackendView {
        let service = &self.config.services[sid];
        let backend = &service.backends[bid];
        let admin = self.balancer.admin(sid, bid).unwrap_or_default();
        let admin_since = self
            .admin_since
            .get(&(service.name.clone(), backend.address))
            .copied();
        let probe = ProbeKey::of(&self.config.lb, service, backend.address)
            .and_then(|k| self.checker.status(&k));
        let last_failure = probe
            .and_then(|p| p.last_failure)
            .and_then(|r| r.failure(service.check.window.timeout));
        let (state, counters, last_latency, since) = match probe {
            Some(p) => (p.state, p.counters, p.last_latency, p.since),
            None => (
                HealthState::Disabled,
                Counters::default(),
                None,
                admin_since.unwrap_or_else(Instant::now),
            ),
        };
        let overridden = match admin {
            Admin::Disabled => Some(HealthState::Disabled),
            // Weight 0 is the config's way to drain (docs/configuration.md).
            Admin::Drained => Some(HealthState::Drained),
            Admin::Enabled if backend.weight == 0 => Some(HealthState::Drained),
            Admin::Enabled => None,
        };
        match overridden {
            Some(state) => BackendView {
                state,
                admin,
                counters,
                last_latency,
                last_failure,
                since: admin_since.unwrap_or(since),
            },
            None => BackendView {
                state,
                admin,
                counters,
                last_latency,
                last_failure,
                since: match admin_since {
                    Some(a) if a > since => a,
                    _ => since,
                },
            },
        }
    }

    pub(super) fn all_views(&self) -> Vec<(String, SocketAddr, HealthState)> {
        self.config
            .services
            .iter()
            .enumerate()
            .flat_map(|(sid, s)| {
                s.backends
                    .iter()
                    .enumerate()
                    .map(move |(bid, b)| (sid, bid, s.name.clone(), b.address))
            })
            .map(|(sid, bid, name, addr)| (name, addr, self.view(sid, bid).state))
            .collect()
    }
}

pub(super) fn counters(c: Counters) -> ProbeCounters {
    ProbeCounters {
        success: c.success,
        tcp_failure: c.tcp_failure,
        tls_failure: c.tls_failure,
        http_failure: c.http_failure,
        payload_failure: c.payload_failure,
        timeout_failure: c.timeout_failure,
    }
}

/// Where the ids of the datapath pinned at `pin_path` are saved: /run/lb/<pin dir name>.json
/// (tmpfs, like bpffs: both go at reboot).
pub fn ids_file(pin_path: &Path) -> PathBuf {
    let name = pin_path
        .strip_prefix("/sys/fs/bpf")
        .unwrap_or(pin_path)
        .to_string_lossy()
        .trim_matches('/')
        .replace('/', "_");
    PathBuf::from("/run/lb").join(format!("{name}.json"))
}

pub fn write_ids(path: &Path, ids: &Ids) -> anyhow::Result<()> {
    let dir = path.parent().context("ids file has no directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(ids)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

pub fn read_ids(path: &Path) -> anyhow::Result<Ids> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}
