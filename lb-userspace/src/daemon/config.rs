//! Changes of the configuration: a reload of the file (SIGHUP, `lb reload`) and a change made
//! through the API, which is edited into the file (comments and layout kept), written there
//! and then applied as a reload applies it. One lock orders them, so that they never
//! interleave; the file stays the one source of truth: a change the file does not hold is
//! never applied, and a file changed by hand is never overwritten.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::{IpAddr, SocketAddr},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use tracing::{error, info};

use super::{
    dns::{DnsState, Outcome},
    running::now,
    state::{Inner, Shared},
};
use crate::{
    api::{ChangeRequest, RequestError},
    balancer::Changes,
    config::{
        self, Backend, Config, ConfigErrors, Diff, Discovery,
        edit::{self, EditError},
    },
    health::{
        checker::{ProbeChanges, ProbeKey},
        passive::Scope,
        window::HealthState,
    },
    model::{ChangeReply, ChangeTiming, Event, LastChange, ProbeCounters},
    source::{Snapshot, Version, WriteError},
};

/// The configuration `text` makes with each service's backends from DNS (`dns`) merged in,
/// validated for this host as a whole. An address from DNS that could not be a backend (the
/// VIP's own, this host's, another family, a port DSR cannot use...) is left out and recorded
/// in its service's state with the reason; a problem of the file itself is the error.
pub(super) fn effective(
    text: &str,
    dns: &mut BTreeMap<String, DnsState>,
) -> Result<Config, ConfigErrors> {
    let mut found: Vec<(String, Vec<Backend>)> = dns
        .iter_mut()
        .map(|(service, state)| {
            state.rejected.clear();
            (service.clone(), state.backends.clone())
        })
        .collect();
    loop {
        let (merged, appended) = edit::with_discovered(text, &found)?;
        let errors = match config::parse_for_host(&merged) {
            Ok(config) => return Ok(config),
            Err(errors) => errors,
        };
        let mut left_out = 0;
        for problem in &errors.0 {
            let Some(a) =
                backend_at(&problem.path).and_then(|at| appended.iter().find(|a| a.at == at))
            else {
                continue;
            };
            if let Some((_, list)) = found.iter_mut().find(|(s, _)| *s == a.service) {
                list.retain(|b| b.address != a.address);
            }
            if let Some(state) = dns.get_mut(&a.service) {
                state.rejected.push((a.address, problem.message.clone()));
            }
            left_out += 1;
        }
        if left_out == 0 {
            return Err(errors);
        }
    }
}

/// `(service, backend)` indices of a problem's path `service[I].backends[J]...`.
fn backend_at(path: &str) -> Option<(usize, usize)> {
    let rest = path.strip_prefix("service[")?;
    let (i, rest) = rest.split_once(']')?;
    let rest = rest.strip_prefix(".backends[")?;
    let (j, _) = rest.split_once(']')?;
    Some((i.parse().ok()?, j.parse().ok()?))
}

fn invalid(errors: ConfigErrors) -> RequestError {
    RequestError::Invalid(errors.0.iter().map(ToString::to_string).collect())
}

/// Runs `f`, a panic in it turned into a failed request: no request takes the daemon down.
fn unless_panic<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, RequestError>,
) -> Result<T, RequestError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        Err(RequestError::Failed(anyhow::anyhow!(
            "internal error while {what} ({why}); the running state is kept"
        )))
    })
}

impl Shared {
    /// Reads the config file again and moves to it in place: services, backends, weights,
    /// rings and checks change; the connection table and the health of unchanged probes stay.
    /// An invalid file (or one that changes what only a restart can) changes nothing; a rejected
    /// reload is logged and is an event, whichever way it came (`via`: "SIGHUP", "API"). Never
    /// panics: a bug on the way is a failed reload, not a dead daemon.
    pub fn reload(&self, via: &str) -> Result<(Changes, ProbeChanges), RequestError> {
        let result = unless_panic("reloading", || self.try_reload());
        if let Err(e) = &result {
            let problems: Vec<String> = match e {
                RequestError::Invalid(p) => p.clone(),
                other => vec![other.to_string()],
            };
            tracing::error!(
                via,
                config = %self.config.place(),
                problems = %problems.join("; "),
                "reload rejected; the running state is unchanged"
            );
            let reason = match problems.as_slice() {
                [one] => one.clone(),
                [first, rest @ ..] => format!("{first} (and {} more)", rest.len()),
                [] => "rejected".to_owned(),
            };
            self.events
                .push(Event::daemon(format!("reload rejected ({via})"), reason));
        }
        result
    }

    fn try_reload(&self) -> Result<(Changes, ProbeChanges), RequestError> {
        let _writing = crate::lock(&self.config.writing);
        let snapshot = self.config.store.read().map_err(invalid)?;
        let new = self.effective(&snapshot.text).map_err(invalid)?;
        let applied = self.apply_config(new, "reload")?;
        self.config.store.remember(&snapshot);
        self.config.set_applied(snapshot, None);
        // Names may have come, gone or changed.
        self.config.dns_wake.notify_one();
        Ok(applied)
    }

    /// A change through the API: edited into the file, validated as `lb check-config` does,
    /// written (atomically, the previous version kept as FILE.bak), then applied; or, with
    /// `dry_run`, only validated and diffed. Refused, it changes neither the file nor the
    /// running state.
    pub fn change_config(&self, req: ChangeRequest) -> Result<ChangeReply, RequestError> {
        let result = unless_panic("changing the configuration", || self.try_change(&req));
        let counter = match &result {
            Ok(_) => &self.config.writes.applied,
            Err(RequestError::Failed(_)) => &self.config.writes.failed,
            Err(_) => &self.config.writes.refused,
        };
        if !req.dry_run || result.is_err() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = &result {
            info!(who = %req.who, error = %e, "configuration change refused");
        }
        result
    }

    fn try_change(&self, req: &ChangeRequest) -> Result<ChangeReply, RequestError> {
        let _writing = crate::lock(&self.config.writing);
        let started = Instant::now();
        let mut timing = ChangeTiming::default();
        let ms = |since: Instant| since.elapsed().as_secs_f64() * 1000.0;
        let running = self.config.version();
        if let Some(tag) = &req.if_match
            && !running.matches(tag)
        {
            return Err(RequestError::Precondition(format!(
                "If-Match {tag}: the configuration is at version {running}; read it again \
                 (GET /v1/config) and make the change to that"
            )));
        }
        let snapshot = self.config.store.read().map_err(|e| {
            RequestError::Failed(anyhow::anyhow!("reading the configuration file: {e}"))
        })?;
        if snapshot.version != running {
            return Err(RequestError::Conflict(format!(
                "{} was changed since lb applied it (running version {running}, the file is \
                 now {}), by hand or by another program: lb does not overwrite it. Apply it \
                 with `lb reload` (which shows what is wrong with it, if anything), then make \
                 the change again",
                self.config.place(),
                snapshot.version
            )));
        }
        let text = edit::edited(&snapshot.text, &req.changes).map_err(|e| match e {
            EditError::NotFound(m) => RequestError::NotFound(m),
            EditError::Exists(m) => RequestError::Precondition(m),
            EditError::Invalid(problems) => {
                RequestError::Invalid(problems.iter().map(ToString::to_string).collect())
            }
        })?;
        let new = self.effective(&text).map_err(invalid)?;
        let diff = {
            let inner = self.lock();
            Diff::between(&inner.config, &new)
        };
        let version = Version::of(text.as_bytes());
        let reply = |applied: bool, version: Version, timing: ChangeTiming| ChangeReply {
            dry_run: req.dry_run,
            applied,
            previous_version: running.0.clone(),
            version: version.0,
            diff: diff.clone(),
            timing,
            written_to: self.config.place(),
        };
        self.check_applicable(&new)?;
        timing.validate_ms = ms(started);
        if req.dry_run {
            return Ok(reply(false, version, timing));
        }
        if text == snapshot.text {
            // Already so (a PUT repeated): nothing to write or apply.
            return Ok(reply(false, running.clone(), timing));
        }
        let writing = Instant::now();
        let written = self
            .config
            .store
            .replace(&running, &text)
            .map_err(|e| match e {
                WriteError::Conflict { .. } => RequestError::Conflict(format!(
                    "{e}: the file was changed meanwhile; `lb reload` applies it"
                )),
                WriteError::Failed(e) => RequestError::Failed(
                    e.context("writing the configuration file failed; nothing was applied"),
                ),
            })?;
        timing.write_ms = ms(writing);
        let applying = Instant::now();
        let source = format!("config ({})", req.who);
        if let Err(e) = self.apply_config(new, &source) {
            // The file goes back to what runs.
            if let Err(undo) = self.config.store.replace(&written, &snapshot.text) {
                error!(error = %undo, "restoring the configuration file after a failed apply");
            }
            return Err(e);
        }
        timing.apply_ms = ms(applying);
        self.config.dns_wake.notify_one();
        let change = LastChange {
            time: now(),
            who: req.who.clone(),
            version: written.0.clone(),
            summary: diff.summary(),
        };
        let snapshot = Snapshot {
            text,
            version: written.clone(),
        };
        self.config.store.remember(&snapshot);
        self.config.set_applied(snapshot, Some(change));
        info!(who = %req.who, version = %written, changes = %diff.summary(), "configuration changed");
        self.events.push(Event::daemon(
            format!("configuration changed ({}): version {written}", req.who),
            diff.summary(),
        ));
        Ok(reply(true, written, timing))
    }

    /// The whole configuration `document` makes (with the local `[lb]` when the services are
    /// etcd's), [`effective`] with the DNS answers in use.
    fn effective(&self, document: &str) -> Result<Config, ConfigErrors> {
        let text = self.config.store.compose(document)?;
        effective(&text, &mut crate::lock(&self.config.dns))
    }

    /// The services whose names are due for resolution at `now` (name, spec, IPv6 VIP), and
    /// when the next one is. Services with names new or changed since the last call are due.
    pub(super) fn dns_due(
        &self,
        now: Instant,
    ) -> (Vec<(String, Discovery, bool)>, Option<Instant>) {
        let specs: Vec<(String, Discovery, bool)> = {
            let inner = self.lock();
            inner
                .config
                .services
                .iter()
                .filter_map(|s| {
                    let d = s.discovery.clone()?;
                    Some((s.name.clone(), d, s.vip.is_ipv6()))
                })
                .collect()
        };
        let mut dns = crate::lock(&self.config.dns);
        dns.retain(|name, _| specs.iter().any(|(n, _, _)| n == name));
        let (mut due, mut next) = (Vec::new(), None::<Instant>);
        for (name, spec, v6) in specs {
            let state = dns
                .entry(name.clone())
                .or_insert_with(|| DnsState::new(spec.clone(), now));
            if state.spec != spec {
                *state = DnsState::new(spec.clone(), now);
            }
            if state.next <= now {
                // Not due again while this query runs (its answer sets the next time).
                state.next = now + Duration::from_secs(3600);
                due.push((name, spec, v6));
            } else {
                next = Some(next.map_or(state.next, |n| n.min(state.next)));
            }
        }
        (due, next)
    }

    /// Takes the answers of [`Shared::dns_due`]'s names; applies the services whose backends
    /// changed (as a reload of them would), and tells of failures as they start and end.
    pub(super) fn dns_results(&self, results: Vec<(String, Discovery, Outcome)>) {
        let (now, unix) = (Instant::now(), now());
        let mut changed = Vec::new();
        {
            let mut dns = crate::lock(&self.config.dns);
            for (service, spec, outcome) in results {
                let Some(state) = dns.get_mut(&service).filter(|s| s.spec == spec) else {
                    continue; // its name changed meanwhile: asked again anew
                };
                let before = state.error.clone();
                let count = state.backends.len();
                if state.observe(outcome, now, unix) {
                    changed.push(format!(
                        "{service}: {} now {} addresses (was {count})",
                        spec.name,
                        state.backends.len()
                    ));
                }
                match (&before, &state.error) {
                    (None, Some(why)) => {
                        tracing::warn!(%service, name = %spec.name, error = %why, "DNS: the last addresses kept");
                        self.events.push(Event::daemon(
                            format!("dns {} ({service})", spec.name),
                            format!("{why}; {} addresses kept", state.backends.len()),
                        ));
                    }
                    (Some(_), None) => {
                        info!(%service, name = %spec.name, "DNS answers again");
                        self.events.push(Event::daemon(
                            format!("dns {} ({service})", spec.name),
                            "answers again".to_owned(),
                        ));
                    }
                    _ => {}
                }
            }
        }
        if changed.is_empty() {
            return;
        }
        let _writing = crate::lock(&self.config.writing);
        let (_, text) = self.config.running();
        let applied = self
            .effective(&text)
            .map_err(invalid)
            .and_then(|new| self.apply_config(new, "dns"));
        match applied {
            Ok(_) => {
                info!(changes = %changed.join("; "), "DNS answers applied");
                self.events
                    .push(Event::daemon("dns".to_owned(), changed.join("; ")));
            }
            Err(e) => {
                tracing::error!(error = %e, "DNS answers could not be applied; the running state is kept");
                self.events
                    .push(Event::daemon("dns rejected".to_owned(), e.to_string()));
            }
        }
        for state in crate::lock(&self.config.dns).values() {
            for (address, why) in &state.rejected {
                tracing::warn!(name = %state.spec.name, %address, why, "DNS address left out");
            }
        }
    }

    /// A revision the etcd watch saw: applied, unless it is the one running (this host's own
    /// write) or an older one; refused when invalid (every host refuses it alike), the running
    /// configuration kept, an event and the status saying which revision and why.
    pub(super) fn apply_revision(&self, snapshot: Snapshot) {
        let _writing = crate::lock(&self.config.writing);
        let running = self.config.version();
        let number = |v: &Version| v.0.parse::<i64>().unwrap_or(0);
        let refused_before = crate::lock(&self.config.refused)
            .as_ref()
            .is_some_and(|(v, _)| *v == snapshot.version.0);
        if number(&snapshot.version) <= number(&running) || refused_before {
            return;
        }
        let source = format!("etcd revision {}", snapshot.version);
        let result = unless_panic("applying an etcd revision", || {
            let new = self.effective(&snapshot.text).map_err(invalid)?;
            self.apply_config(new, &source)
        });
        match result {
            Ok(_) => {
                info!(revision = %snapshot.version, "etcd revision applied");
                self.config.store.remember(&snapshot);
                self.config.set_applied(snapshot, None);
                self.config.dns_wake.notify_one();
            }
            Err(e) => {
                let why = match &e {
                    RequestError::Invalid(problems) => problems.join("; "),
                    other => other.to_string(),
                };
                tracing::error!(revision = %snapshot.version, %why, "etcd revision refused; the running configuration is kept");
                self.events
                    .push(Event::daemon(format!("{source} refused"), why.clone()));
                *crate::lock(&self.config.refused) = Some((snapshot.version.0, why));
                self.config.refused_total.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// etcd answers (again).
    pub(super) fn etcd_reachable(&self) {
        if crate::lock(&self.config.store_error).take().is_some() {
            info!("etcd reachable again");
            self.events.push(Event::daemon(
                "etcd".to_owned(),
                "reachable again".to_owned(),
            ));
        }
    }

    /// etcd cannot be reached: what runs stays.
    pub(super) fn etcd_unreachable(&self, why: String) {
        let mut error = crate::lock(&self.config.store_error);
        if error.is_none() {
            self.events.push(Event::daemon(
                "etcd".to_owned(),
                format!(
                    "unreachable ({why}); running on revision {}",
                    self.config.version()
                ),
            ));
        }
        *error = Some(why);
    }

    /// Whether `new` can be applied to the running daemon: what only a restart can change,
    /// IPv6 forwarding for IPv6 services, the tunnel's programs for probes through it.
    fn check_applicable(&self, new: &Config) -> Result<(), RequestError> {
        crate::dataplane::check_ipv6_forwarding(new)
            .map_err(|e| RequestError::Invalid(vec![format!("{e:#}")]))?;
        let inner = self.lock();
        applicable(&inner, new)
    }

    /// Moves the running state to `new` (valid, and validated for this host): balancer, maps,
    /// checks, passive checks, events (`source` names what moved it).
    fn apply_config(
        &self,
        new: Config,
        source: &str,
    ) -> Result<(Changes, ProbeChanges), RequestError> {
        crate::dataplane::check_ipv6_forwarding(&new)
            .map_err(|e| RequestError::Invalid(vec![format!("{e:#}")]))?;
        // Read before anything changes: a key file that cannot be read fails the change. It is
        // read at every change, so writing a new key into it and reloading rotates the key.
        let cookie_key = new
            .lb
            .syn_cookie_key_file
            .as_deref()
            .map(|file| crate::dataplane::cookie::key(Some(file)))
            .transpose()
            .map_err(|e| RequestError::Invalid(vec![format!("lb.syn_cookie_key_file: {e:#}")]))?;
        let mut guard = self.lock();
        let inner = &mut *guard;
        applicable(inner, &new)?;
        let old_states: Vec<(String, SocketAddr, HealthState)> = inner.all_views();
        let checker = &inner.checker;
        // A backend this host has no route to (no SNAT address) is the change's fault, not lb's.
        let unroutable = std::cell::Cell::new(false);
        let changes = inner
            .balancer
            .apply(
                &new,
                |sid, backend| {
                    super::snat_address(&new, sid, backend).inspect_err(|_| unroutable.set(true))
                },
                |sid, backend, _| {
                    // A backend joining a probe that already runs takes its verdict.
                    ProbeKey::of(&new.lb, &new.services[sid], backend)
                        .and_then(|k| checker.status(&k))
                        .is_none_or(|s| s.state.is_available())
                },
                &mut inner.dataplane,
            )
            .map_err(|e| {
                if unroutable.get() {
                    RequestError::Invalid(vec![format!("{e:#}")])
                } else {
                    RequestError::Failed(e)
                }
            })?;
        let probes = match inner.checker.update(&new, inner.balancer.tunnels()) {
            Ok(probes) => probes,
            Err(e) => {
                // Only opening a raw socket for a new check kind (or a probe through the tunnel
                // without a slot, a bug) can fail here: go back.
                let old = inner.config.clone();
                let _ = inner.balancer.apply(
                    &old,
                    |sid, backend| super::snat_address(&old, sid, backend),
                    |_, _, _| true,
                    &mut inner.dataplane,
                );
                return Err(RequestError::Failed(e));
            }
        };
        if let Some(key) = cookie_key {
            match inner.dataplane.rotate_cookie_key(key) {
                Ok(true) => {
                    info!("SYN cookie key rotated; the previous one stays valid for its cookies");
                    self.events.push(Event::daemon(
                        "syn_cookie_key".to_owned(),
                        format!(
                            "rotated from {}: the previous key still validates its cookies",
                            source
                        ),
                    ));
                }
                Ok(false) => {}
                // The maps are written; a key write failing is a bug, not a reason to undo.
                Err(e) => error!(error = %format!("{e:#}"), "rotating the SYN cookie key failed"),
            }
        }
        inner.members = super::state::members(&new);
        inner.config = new;
        inner.set_reporting();
        self.trace
            .set_names(super::state::names(&inner.config, &inner.balancer));
        // Ejections of what is gone are forgotten; the rest keep running.
        let watched: HashSet<(&str, SocketAddr)> = inner
            .config
            .services
            .iter()
            .filter(|s| s.passive.enabled)
            .flat_map(|s| s.backends.iter().map(move |b| (s.name.as_str(), b.address)))
            .collect();
        // Admin changes of what is gone too: a backend added back starts afresh.
        let present: HashSet<(&str, SocketAddr)> = inner
            .config
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(move |b| (s.name.as_str(), b.address)))
            .collect();
        inner
            .admin_since
            .retain(|(service, backend), _| present.contains(&(service.as_str(), *backend)));
        let hosts: HashSet<IpAddr> = watched.iter().map(|(_, b)| b.ip()).collect();
        inner.passive.retain(|scope| match scope {
            Scope::Host(ip) => hosts.contains(ip),
            Scope::Service { service, backend } => watched.contains(&(service.as_str(), *backend)),
        });
        let slots = (
            inner.balancer.service_slots(),
            inner.balancer.backend_count(),
        );
        inner.dataplane.set_counts(slots.0, slots.1);
        let new_states = inner.all_views();
        drop(guard);
        // The new backends' neighbours now; the others are kept fresh every 10 s.
        let added: BTreeSet<IpAddr> = changes.backends_added.iter().map(|(_, b)| b.ip()).collect();
        super::resolve_neighbours(&added);
        // Added and removed backends are events too (by hash: a reload of 20,000 backends
        // compared each with every other).
        fn known(states: &[(String, SocketAddr, HealthState)]) -> HashSet<(&str, SocketAddr)> {
            states.iter().map(|(s, b, _)| (s.as_str(), *b)).collect()
        }
        let (before, after) = (known(&old_states), known(&new_states));
        for (service, backend, state) in &new_states {
            if !before.contains(&(service.as_str(), *backend)) {
                self.membership_event(service, *backend, HealthState::Unused, *state, source);
            }
        }
        for (service, backend, state) in &old_states {
            if !after.contains(&(service.as_str(), *backend)) {
                self.membership_event(service, *backend, *state, HealthState::Unused, source);
            }
        }
        self.save_ids();
        // New, removed and changed services' VIPs and settings.
        self.announce.request();
        info!(
            source,
            added = ?changes.services_added,
            removed = ?changes.services_removed,
            changed = ?changes.services_changed,
            backends_added = changes.backends_added.len(),
            backends_removed = changes.backends_removed.len(),
            probes_started = probes.started,
            probes_stopped = probes.stopped,
            "config applied"
        );
        Ok((changes, probes))
    }

    /// A backend added to or removed from a service.
    fn membership_event(
        &self,
        service: &str,
        backend: SocketAddr,
        from: HealthState,
        to: HealthState,
        source: &str,
    ) {
        self.events.push(Event {
            seq: 0,
            time: 0.0,
            service: service.to_owned(),
            backend: backend.to_string(),
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
            source: source.to_owned(),
            counters: ProbeCounters::default(),
            healthy_threshold: 0,
            unhealthy_threshold: 0,
            flag_write_us: None,
            reason: None,
            vip: None,
        });
    }
}

/// What only a restart changes, and the tunnel's programs for probes through it.
fn applicable(inner: &Inner, new: &Config) -> Result<(), RequestError> {
    let fixed = inner.config.lb.fixed_differences(&new.lb);
    if !fixed.is_empty() {
        return Err(RequestError::Invalid(
            fixed
                .iter()
                .map(|k| format!("lb.{k}: cannot change while running (restart lb to change it)"))
                .collect(),
        ));
    }
    inner
        .dataplane
        .check_tunnel(new)
        .map_err(|e| RequestError::Invalid(vec![format!("{e:#}")]))
}
