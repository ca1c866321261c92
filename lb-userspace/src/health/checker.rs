//! The active checks of the daemon: which probes the config asks for (one per distinct address
//! and check: services sharing a backend and a check share it), the probe of each kind, and the
//! [`Checker`] the daemon holds. The probes run in the [`super::schedule`] task, at the window's
//! per-state interval after a fixed per-target phase, with random jitter; every state change
//! goes out as a [`Verdict`]. A config reload adds and removes targets; unchanged probes keep
//! their window.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    net::SocketAddrV4,
    pin::Pin,
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
    outcome::Reason,
    probe::{ProbeResult, http, icmp::IcmpProber, tcp_connect, tcp_syn::SynProber, udp},
    schedule::{Command, Scheduler, TargetShared},
    window::{Counters, HealthState, Transition},
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
    /// The last failed probe's result (its reason), local failures aside.
    pub last_failure: Option<ProbeResult>,
    /// When the current state was entered.
    pub since: Instant,
}

/// Upper bounds of the probe latency histogram, seconds.
pub const LATENCY_BOUNDS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Successful probe latencies of one check kind (cumulative buckets are computed on read).
#[derive(Default)]
pub(super) struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS_S.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub(super) fn observe(&self, latency: Duration) {
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
pub(super) struct Probers {
    pub(super) syn: OnceLock<SynProber>,
    icmp: OnceLock<IcmpProber>,
    tls: http::TlsConfigs,
    /// Probes started so far.
    pub(super) sent: AtomicU64,
    pub(super) latency: [Histogram; CheckKind::ALL.len()],
}

/// The running checks: the scheduler task and what it shares per target; targets are added
/// and removed as the config changes.
pub struct Checker {
    targets: HashMap<Arc<ProbeKey>, Arc<TargetShared>>,
    probers: Arc<Probers>,
    commands: mpsc::UnboundedSender<Command>,
    scheduler: JoinHandle<()>,
}

/// Starts the checks of `config`; the probes in `down` start `unhealthy` (a verdict kept from
/// before a restart), the others `initializing`. Call inside the tokio runtime, in the
/// balancer's network namespace.
pub fn spawn(
    config: &Config,
    down: &HashSet<ProbeKey>,
    verdicts: mpsc::UnboundedSender<Verdict>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Checker> {
    let probers = Arc::new(Probers {
        syn: OnceLock::new(),
        icmp: OnceLock::new(),
        tls: http::TlsConfigs::new(),
        sent: AtomicU64::new(0),
        latency: Default::default(),
    });
    let (commands, commands_rx) = mpsc::unbounded_channel();
    let scheduler = Scheduler::new(probers.clone(), verdicts, Instant::now());
    let mut checker = Checker {
        targets: HashMap::new(),
        probers,
        commands,
        scheduler: tokio::spawn(scheduler.run(commands_rx, stop)),
    };
    checker.apply(config, down)?;
    Ok(checker)
}

impl Checker {
    /// Moves to the probes of `config`: probes that stay keep their window and state; new ones
    /// start at `initializing`; gone ones stop. Fails (changing nothing) when a raw socket a new
    /// check kind needs cannot be opened.
    pub fn update(&mut self, config: &Config) -> anyhow::Result<()> {
        self.apply(config, &HashSet::new())
    }

    /// As [`Checker::update`]; new probes in `down` start `unhealthy`.
    fn apply(&mut self, config: &Config, down: &HashSet<ProbeKey>) -> anyhow::Result<()> {
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
        let mut commands = Vec::new();
        self.targets.retain(|key, _| {
            let keep = wanted.contains(key.as_ref());
            if !keep {
                commands.push(Command::Remove(key.clone()));
            }
            keep
        });
        for key in wanted {
            if self.targets.contains_key(&key) {
                continue;
            }
            let state = if down.contains(&key) {
                HealthState::Unhealthy
            } else {
                HealthState::Initializing
            };
            let key = Arc::new(key);
            let shared = Arc::new(TargetShared {
                status: Mutex::new(TargetStatus {
                    state,
                    counters: Counters::default(),
                    last_latency: None,
                    last_failure: None,
                    since: Instant::now(),
                }),
                report: AtomicBool::new(false),
                active: AtomicBool::new(true),
            });
            commands.push(Command::Add {
                key: key.clone(),
                state,
                shared: shared.clone(),
                http: http_check(&key.check).map(Arc::new),
            });
            self.targets.insert(key, shared);
        }
        for command in commands {
            if self.commands.send(command).is_err() {
                tracing::error!("the health check scheduler has stopped");
                break;
            }
        }
        Ok(())
    }

    /// Which probes send every result (`report(key)`), not only their state changes.
    pub fn set_reporting(&self, report: impl Fn(&ProbeKey) -> bool) {
        for (key, target) in &self.targets {
            target.report.store(report(key), Ordering::Relaxed);
        }
    }

    /// Which probes run (`active(key)`); the others pause, keeping their state, until active
    /// again (traffic-triggered probing).
    pub fn set_active(&self, active: impl Fn(&ProbeKey) -> bool) {
        for (key, target) in &self.targets {
            target.active.store(active(key), Ordering::Relaxed);
        }
    }

    /// The latest of a probe, None if no such probe runs.
    pub fn status(&self, key: &ProbeKey) -> Option<TargetStatus> {
        self.targets.get(key).map(|t| *crate::lock(&t.status))
    }

    /// Probe targets running.
    pub fn targets(&self) -> usize {
        self.targets.len()
    }

    /// Probes started so far (for benchmarks and diagnostics).
    pub fn probes(&self) -> u64 {
        self.probers.sent.load(Ordering::Relaxed)
    }

    /// Half-open SYNs sent so far by path; None while no half-open check runs.
    pub fn half_open_syns(&self) -> Option<crate::api::model::SynPaths> {
        self.probers.syn.get().map(|syn| {
            let (link, kernel) = syn.syns_sent();
            crate::api::model::SynPaths { link, kernel }
        })
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

    /// Waits for the scheduler to end (after the stop signal).
    pub async fn join(self) {
        if let Err(e) = self.scheduler.await {
            tracing::error!(error = %e, "health check scheduler");
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

/// A probe on its way.
pub(super) type Probe = Pin<Box<dyn Future<Output = ProbeResult> + Send>>;

/// One probe of `key` with the shared probers. Each kind boxes its own future, so a half-open
/// probe allocates what it needs, not room for an HTTPS exchange. HTTP(S) probes run as tasks
/// of their own: TLS and parsing take CPU that any worker can give.
pub(super) fn probe(
    probers: &Arc<Probers>,
    key: &Arc<ProbeKey>,
    http: Option<&Arc<http::HttpCheck>>,
) -> Probe {
    probers.sent.fetch_add(1, Ordering::Relaxed);
    let (p, k) = (probers.clone(), key.clone());
    let target = key.target;
    let timeout = key.check.window.timeout;
    match key.check.kind {
        CheckKind::Tcp => Box::pin(async move {
            match p.syn.get() {
                Some(syn) => syn.probe(target, timeout).await,
                None => ProbeResult::Local(Reason::NoProber),
            }
        }),
        CheckKind::TcpConnect => Box::pin(async move {
            let check = &k.check;
            tcp_connect::probe(
                target,
                check.send.as_deref(),
                check.expect.as_deref(),
                timeout,
            )
            .await
        }),
        CheckKind::Http | CheckKind::Https => {
            let Some(http) = http.cloned() else {
                return Box::pin(std::future::ready(ProbeResult::Local(Reason::Internal)));
            };
            let task =
                tokio::spawn(async move { http::probe(&http, &p.tls, target, timeout).await });
            Box::pin(async move {
                task.await.unwrap_or_else(|e| {
                    tracing::error!(error = %e, "http health probe task");
                    ProbeResult::Local(Reason::Internal)
                })
            })
        }
        CheckKind::Icmp => Box::pin(async move {
            match p.icmp.get() {
                Some(icmp) => icmp.probe(*target.ip(), timeout).await,
                None => ProbeResult::Local(Reason::NoProber),
            }
        }),
        CheckKind::Udp => Box::pin(async move {
            let check = &k.check;
            match p.icmp.get() {
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
                None => ProbeResult::Local(Reason::NoProber),
            }
        }),
        // Checks of kind none are not scheduled.
        CheckKind::None => Box::pin(std::future::ready(ProbeResult::Local(Reason::Internal))),
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

/// A deterministic offset in [0, interval) from the target's address.
pub(super) fn phase(target: SocketAddrV4, interval: Duration) -> Duration {
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

    /// The scheduler end to end on loopback (tcp-connect needs no privileges): verdicts for a
    /// listening and a closed port, and a reload that removes a target stops its probes.
    #[tokio::test]
    async fn probes_follow_the_config() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                drop(conn);
            }
        });
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // The config refuses loopback backends (the datapath cannot reach them); the checker
        // probes whatever it is given, so the test puts its loopback servers in afterwards.
        let config = |backends: &[std::net::SocketAddr]| {
            let list: Vec<String> = (0..backends.len())
                .map(|i| format!("{{ address = \"10.0.2.{}:80\" }}", i + 2))
                .collect();
            let mut c = crate::config::parse(&format!(
                "[lb]\ninterfaces = [\"eth1\"]\n[[service]]\nname = \"a\"\nvip = \"10.100.0.1:80\"\n\
                 backends = [{}]\n[service.check]\nkind = \"tcp-connect\"\ntimeout = \"500ms\"\n\
                 interval = \"1s\"\nhealthy_threshold = 1\nunhealthy_threshold = 1\n",
                list.join(", ")
            ))
            .unwrap();
            for (b, addr) in c.services[0].backends.iter_mut().zip(backends) {
                let std::net::SocketAddr::V4(addr) = addr else {
                    unreachable!("IPv4 loopback")
                };
                b.address = *addr;
            }
            c
        };
        let both = config(&[up, closed]);
        let key_of = |addr: std::net::SocketAddr| ProbeKey {
            target: match addr {
                std::net::SocketAddr::V4(a) => a,
                _ => unreachable!(),
            },
            check: both.services[0].check.clone(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        let mut checker = spawn(&both, &HashSet::new(), tx, stop).unwrap();
        assert_eq!(checker.targets(), 2);
        assert_eq!(
            checker.status(&key_of(up)).unwrap().state,
            HealthState::Initializing
        );
        // Each target probes once within its first interval (its phase), then reports.
        let mut states = HashMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while states.len() < 2 {
            let v = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .expect("verdicts within 3 s")
                .unwrap();
            if let Some(t) = v.transition {
                states.insert(v.probe.target, t.to);
            }
        }
        assert_eq!(states[&key_of(up).target], HealthState::Healthy);
        assert_eq!(states[&key_of(closed).target], HealthState::Unhealthy);
        assert_eq!(
            checker.status(&key_of(closed)).unwrap().state,
            HealthState::Unhealthy
        );
        // Reporting every result: the healthy target's next probe is sent although its state
        // stays.
        checker.set_reporting(|_| true);
        let v = tokio::time::timeout(Duration::from_secs(3), rx.recv())
            .await
            .expect("a reported result")
            .unwrap();
        assert!(v.transition.is_none());
        checker.set_reporting(|_| false);
        // The closed port leaves the config: its probes stop, the other keeps its state.
        checker.update(&config(&[up])).unwrap();
        assert_eq!(checker.targets(), 1);
        assert!(checker.status(&key_of(closed)).is_none());
        let probes = checker.probes();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let sent = checker.probes() - probes;
        assert!(
            (2..=3).contains(&sent),
            "{sent} probes in 2.5 s for one target at 1 s"
        );
        while let Ok(v) = rx.try_recv() {
            assert_ne!(
                v.probe.target,
                key_of(closed).target,
                "removed target probed"
            );
        }
        assert_eq!(
            checker.status(&key_of(up)).unwrap().state,
            HealthState::Healthy
        );
        stop_tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(2), checker.join())
            .await
            .expect("the scheduler stops");
    }
}
