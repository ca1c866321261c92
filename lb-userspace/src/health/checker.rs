//! Runs the active checks: one task per distinct probe (address and check; services sharing a
//! backend and a check share it), probing at the window's per-state interval after a fixed
//! per-target phase offset, with random jitter (so targets do not probe in lockstep), feeding
//! each result to the target's [`Window`] and sending every state change as a [`Verdict`]. A
//! config reload adds and removes tasks; the tasks of unchanged probes keep their window.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddrV4,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    probe::{ProbeResult, http, icmp::IcmpProber, tcp_connect, tcp_syn::SynProber, udp},
    window::{Counters, HealthState, Transition, Window},
};
use crate::{
    api::model::LatencyHistogram,
    config::{Check, CheckKind, Config, HttpMethod, Service},
};

/// What a probe task stands for: its address and its check. Services whose backends share
/// both share the probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProbeKey {
    pub target: SocketAddrV4,
    pub check: Check,
}

impl ProbeKey {
    /// The probe of a service's backend; None when the service's checks are off.
    pub fn of(service: &Service, backend: SocketAddrV4) -> Option<Self> {
        (service.check.kind != CheckKind::None).then(|| Self {
            target: SocketAddrV4::new(*backend.ip(), service.check.port.unwrap_or(backend.port())),
            check: service.check.clone(),
        })
    }
}

/// A probe result: every state change, and every result of the probes asked to report all
/// (those passive checks follow, see [`Checker::set_reporting`]).
#[derive(Debug, Clone)]
pub struct Verdict {
    pub probe: Arc<ProbeKey>,
    pub result: ProbeResult,
    pub transition: Option<Transition>,
}

/// The latest of one probe target, for status pages.
#[derive(Debug, Clone, Copy)]
pub struct TargetStatus {
    pub state: HealthState,
    pub counters: Counters,
    pub last_latency: Option<Duration>,
    /// When the current state was entered.
    pub since: Instant,
}

/// Upper bounds of the probe latency histogram, seconds.
pub const LATENCY_BOUNDS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Successful probe latencies of one check kind (cumulative buckets are computed on read).
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS_S.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, latency: Duration) {
        let s = latency.as_secs_f64();
        let i = LATENCY_BOUNDS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BOUNDS_S.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
    }
}

/// Shared probe machinery: one raw socket for half-open probes, one for ICMP echo (icmp and udp
/// checks), opened when a check first needs them; one set of TLS configs.
struct Probers {
    syn: OnceLock<SynProber>,
    icmp: OnceLock<IcmpProber>,
    tls: http::TlsConfigs,
    /// Bounds the probes in flight (sockets, memory) however many targets there are.
    in_flight: tokio::sync::Semaphore,
    /// Probes started so far.
    sent: AtomicU64,
    latency: [Histogram; CheckKind::ALL.len()],
}

struct Task {
    handle: JoinHandle<()>,
    stop: watch::Sender<bool>,
    status: Arc<Mutex<TargetStatus>>,
    /// Send every result, not only state changes.
    report: Arc<AtomicBool>,
    /// Probe at all (traffic-triggered probing pauses idle targets).
    active: Arc<AtomicBool>,
}

/// The running checks: one task per distinct probe, added and removed as the config changes.
pub struct Checker {
    tasks: HashMap<Arc<ProbeKey>, Task>,
    probers: Arc<Probers>,
    verdicts: mpsc::UnboundedSender<Verdict>,
    stop: watch::Receiver<bool>,
    epoch: Instant,
}

/// Probes in flight at most; a probe beyond waits for a slot (its window sees a later result,
/// never a wrong one).
pub const MAX_PROBES_IN_FLIGHT: usize = 4096;

/// Starts the checks of `config`. Call inside the tokio runtime, in the balancer's network
/// namespace.
pub fn spawn(
    config: &Config,
    verdicts: mpsc::UnboundedSender<Verdict>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Checker> {
    let mut checker = Checker {
        tasks: HashMap::new(),
        probers: Arc::new(Probers {
            syn: OnceLock::new(),
            icmp: OnceLock::new(),
            tls: http::TlsConfigs::new(),
            in_flight: tokio::sync::Semaphore::new(MAX_PROBES_IN_FLIGHT),
            sent: AtomicU64::new(0),
            latency: Default::default(),
        }),
        verdicts,
        stop,
        epoch: Instant::now(),
    };
    checker.update(config)?;
    Ok(checker)
}

impl Checker {
    /// Moves to the probes of `config`: probes that stay keep their task, window and state;
    /// new ones start at `initializing`; gone ones stop. Fails (changing nothing) when a raw
    /// socket a new check kind needs cannot be opened.
    pub fn update(&mut self, config: &Config) -> anyhow::Result<()> {
        let wanted: HashSet<ProbeKey> = plan(config).into_iter().map(|(k, _)| k).collect();
        let kinds: HashSet<CheckKind> = wanted.iter().map(|k| k.check.kind).collect();
        if kinds.contains(&CheckKind::Tcp) && self.probers.syn.get().is_none() {
            let syn = SynProber::new().map_err(|e| {
                anyhow::anyhow!("half-open TCP checks need a raw socket (CAP_NET_RAW): {e}; use kind = \"tcp-connect\" otherwise")
            })?;
            let _ = self.probers.syn.set(syn); // only this method sets it
        }
        if (kinds.contains(&CheckKind::Icmp) || kinds.contains(&CheckKind::Udp))
            && self.probers.icmp.get().is_none()
        {
            let icmp = IcmpProber::new().map_err(|e| {
                anyhow::anyhow!("icmp and udp checks need a raw ICMP socket (CAP_NET_RAW): {e}")
            })?;
            let _ = self.probers.icmp.set(icmp);
        }
        self.tasks.retain(|key, task| {
            let keep = wanted.contains(key.as_ref());
            if !keep {
                task.stop.send_replace(true);
            }
            keep
        });
        for key in wanted {
            if self.tasks.contains_key(&key) {
                continue;
            }
            let key = Arc::new(key);
            let status = Arc::new(Mutex::new(TargetStatus {
                state: HealthState::Initializing,
                counters: Counters::default(),
                last_latency: None,
                since: Instant::now(),
            }));
            let (stop_tx, stop_rx) = watch::channel(false);
            let report = Arc::new(AtomicBool::new(false));
            let active = Arc::new(AtomicBool::new(true));
            let job = Job {
                report: report.clone(),
                active: active.clone(),
                http: http_check(&key.check),
                key: key.clone(),
                probers: self.probers.clone(),
                verdicts: self.verdicts.clone(),
                status: status.clone(),
                epoch: self.epoch,
            };
            let handle = tokio::spawn(job.run(self.stop.clone(), stop_rx));
            self.tasks.insert(
                key,
                Task {
                    handle,
                    stop: stop_tx,
                    status,
                    report,
                    active,
                },
            );
        }
        Ok(())
    }

    /// Which probes send every result (`report(key)`), not only their state changes.
    pub fn set_reporting(&self, report: impl Fn(&ProbeKey) -> bool) {
        for (key, task) in &self.tasks {
            task.report.store(report(key), Ordering::Relaxed);
        }
    }

    /// Which probes run (`active(key)`); the others pause, keeping their state, until active
    /// again (traffic-triggered probing).
    pub fn set_active(&self, active: impl Fn(&ProbeKey) -> bool) {
        for (key, task) in &self.tasks {
            task.active.store(active(key), Ordering::Relaxed);
        }
    }

    /// The latest of a probe, None if no such probe runs.
    pub fn status(&self, key: &ProbeKey) -> Option<TargetStatus> {
        self.tasks
            .get(key)
            .map(|t| *t.status.lock().expect("status lock"))
    }

    /// Probe targets running.
    pub fn targets(&self) -> usize {
        self.tasks.len()
    }

    /// Probes started so far (for benchmarks and diagnostics).
    pub fn probes(&self) -> u64 {
        self.probers.sent.load(Ordering::Relaxed)
    }

    /// Latency histograms of successful probes, per check kind that has any.
    pub fn latency_histograms(&self) -> Vec<LatencyHistogram> {
        CheckKind::ALL
            .iter()
            .zip(&self.probers.latency)
            .filter_map(|(kind, h)| {
                let raw: Vec<u64> = h
                    .buckets
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect();
                let count: u64 = raw.iter().sum();
                (count > 0).then(|| LatencyHistogram {
                    kind: kind.as_str().to_owned(),
                    bounds_s: LATENCY_BOUNDS_S.to_vec(),
                    counts: raw[..LATENCY_BOUNDS_S.len()]
                        .iter()
                        .scan(0, |acc, n| {
                            *acc += n;
                            Some(*acc)
                        })
                        .collect(),
                    count,
                    sum_s: h.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
                })
            })
            .collect()
    }

    /// Waits for every task to end (after the stop signal).
    pub async fn join(self) {
        for (_, task) in self.tasks {
            if let Err(e) = task.handle.await {
                tracing::error!(error = %e, "health check task");
            }
        }
    }
}

/// The distinct probes of a config and the (service, backend) pairs each stands for.
/// Identical probes (same address and check) are run once for every service using them: the
/// result feeds one window, whose verdicts go to each pair.
pub fn plan(config: &Config) -> Vec<(ProbeKey, Vec<(usize, usize)>)> {
    let mut index: HashMap<ProbeKey, usize> = HashMap::new();
    let mut out: Vec<(ProbeKey, Vec<(usize, usize)>)> = Vec::new();
    for (sid, s) in config.services.iter().enumerate() {
        for (bid, b) in s.backends.iter().enumerate() {
            let Some(key) = ProbeKey::of(s, b.address) else {
                continue;
            };
            let i = *index.entry(key.clone()).or_insert_with(|| {
                out.push((key, Vec::new()));
                out.len() - 1
            });
            out[i].1.push((sid, bid));
        }
    }
    out
}

struct Job {
    key: Arc<ProbeKey>,
    /// The request of http and https checks, built once.
    http: Option<http::HttpCheck>,
    probers: Arc<Probers>,
    verdicts: mpsc::UnboundedSender<Verdict>,
    status: Arc<Mutex<TargetStatus>>,
    report: Arc<AtomicBool>,
    active: Arc<AtomicBool>,
    epoch: Instant,
}

impl Job {
    async fn run(self, mut stop: watch::Receiver<bool>, mut removed: watch::Receiver<bool>) {
        let check = &self.key.check;
        let mut window = Window::new(check.window);
        // A fixed phase per target spreads probes over the interval; each later pause gets up
        // to 5% of random jitter so targets that started together drift apart.
        let phase = phase(self.key.target, check.window.interval);
        let mut pause = phase;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|s| *s) => return,
                _ = removed.wait_for(|s| *s) => return,
            }
            if !self.active.load(Ordering::Relaxed) {
                // Paused (no traffic): look again a little later, probe nothing.
                pause = check.window.interval.min(Duration::from_secs(1));
                continue;
            }
            let result = self.probe().await;
            if let ProbeResult::Success { latency } = result {
                self.probers.latency[check.kind as usize].observe(latency);
            }
            let transition = window.observe(result, self.epoch.elapsed());
            {
                let mut status = self.status.lock().expect("status lock");
                status.state = window.state();
                status.counters = window.counters();
                status.last_latency = window.last_latency();
                if transition.is_some() {
                    status.since = Instant::now();
                }
            }
            if transition.is_some() || self.report.load(Ordering::Relaxed) {
                let verdict = Verdict {
                    probe: self.key.clone(),
                    result,
                    transition,
                };
                if self.verdicts.send(verdict).is_err() {
                    return; // the daemon is shutting down
                }
            }
            pause = jitter(window.next_interval());
        }
    }

    async fn probe(&self) -> ProbeResult {
        // The semaphore is never closed, so acquiring only waits.
        let Ok(_slot) = self.probers.in_flight.acquire().await else {
            return ProbeResult::Timeout;
        };
        self.probers.sent.fetch_add(1, Ordering::Relaxed);
        let check = &self.key.check;
        let target = self.key.target;
        let timeout = check.window.timeout;
        match check.kind {
            CheckKind::Tcp => match self.probers.syn.get() {
                Some(syn) => syn.probe(target, timeout).await,
                None => ProbeResult::TcpFailure,
            },
            CheckKind::TcpConnect => {
                tcp_connect::probe(
                    target,
                    check.send.as_deref(),
                    check.expect.as_deref(),
                    timeout,
                )
                .await
            }
            CheckKind::Http | CheckKind::Https => match &self.http {
                Some(http_check) => {
                    http::probe(http_check, &self.probers.tls, target, timeout).await
                }
                None => ProbeResult::HttpFailure,
            },
            CheckKind::Icmp => match self.probers.icmp.get() {
                Some(icmp) => icmp.probe(*target.ip(), timeout).await,
                None => ProbeResult::TcpFailure,
            },
            CheckKind::Udp => match self.probers.icmp.get() {
                Some(icmp) => {
                    udp::probe(
                        icmp,
                        target,
                        check.send.as_deref(),
                        check.expect.as_deref(),
                        timeout,
                    )
                    .await
                }
                None => ProbeResult::TcpFailure,
            },
            // Checks of kind none have no task.
            CheckKind::None => ProbeResult::TcpFailure,
        }
    }
}

/// The probe request of an http or https check.
fn http_check(check: &Check) -> Option<http::HttpCheck> {
    let o = check.http.as_ref()?;
    Some(http::HttpCheck {
        method: match o.method {
            HttpMethod::Get => http::Method::Get,
            HttpMethod::Head => http::Method::Head,
        },
        path: o.path.clone(),
        host: o.host.clone(),
        headers: o.headers.clone(),
        healthy: o.status.clone(),
        tls: (check.kind == CheckKind::Https).then(|| http::TlsCheck {
            verify: o.verify_tls,
            server_name: o.host.clone(),
        }),
    })
}

/// `pause` plus up to 5% more, at random.
fn jitter(pause: Duration) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    // RandomState is randomly seeded per instance: enough randomness for spreading timers.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    pause + pause.mul_f64((r % 1000) as f64 / 20_000.0)
}

/// A deterministic offset in [0, interval) from the target's address.
fn phase(target: SocketAddrV4, interval: Duration) -> Duration {
    let key = (u64::from(u32::from(*target.ip())) << 16) | u64::from(target.port());
    let h = lb_common::fmix64(key);
    let millis = interval.as_millis().max(1) as u64;
    Duration::from_millis(h % millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_probes_are_planned_once() {
        let config = crate::config::parse(
            "[lb]\ninterfaces = [\"eth1\"]\n\
             [[service]]\nname = \"a\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:80\" }, { address = \"10.0.2.3:80\" }]\n\
             [[service]]\nname = \"b\"\nvip = \"10.100.0.2:80\"\nbackends = [{ address = \"10.0.2.3:80\" }]\n\
             [[service]]\nname = \"c\"\nvip = \"10.100.0.3:80\"\nbackends = [{ address = \"10.0.2.3:80\" }]\n\
             [service.check]\nkind = \"tcp-connect\"\n\
             [[service]]\nname = \"d\"\nvip = \"10.100.0.4:53\"\nprotocol = \"udp\"\nbackends = [{ address = \"10.0.2.3:53\" }]\n",
        )
        .unwrap();
        let plan = plan(&config);
        let members: Vec<Vec<(usize, usize)>> = plan.iter().map(|p| p.1.clone()).collect();
        // 10.0.2.3:80 with the default check serves a and b; c checks it differently; d is UDP.
        assert_eq!(
            members,
            [
                vec![(0, 0)],
                vec![(0, 1), (1, 0)],
                vec![(2, 0)],
                vec![(3, 0)]
            ]
        );
        assert_eq!(plan[2].0.check.kind, CheckKind::TcpConnect);
        assert_eq!(plan[3].0.check.kind, CheckKind::Udp);
    }
}
