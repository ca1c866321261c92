//! The active checks of the daemon: which probes the config asks for (one per distinct address
//! and check: services sharing a backend and a check share it), the probe of each kind, and the
//! [`Checker`] the daemon holds. The probes run in the [`super::schedule`] task, at the window's
//! per-state interval after a fixed per-target phase, with random jitter; every state change
//! goes out as a [`Verdict`]. A config reload adds and removes targets; unchanged probes keep
//! their window.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use anyhow::Context as _;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

pub use super::target::{ProbeKey, TargetStatus, Verdict};
use super::{
    probe::{Via, icmp::IcmpProber, tcp_syn::SynProber},
    probers::{LATENCY_BOUNDS_S, Probers, http_check},
    schedule::{Command, Scheduler},
    target::TargetShared,
    window::{Counters, HealthState},
};
use crate::{
    config::{CheckKind, Config},
    model::LatencyHistogram,
    tunnels::Tunnels,
};

/// The running checks: the scheduler task and what it shares per target; targets are added
/// and removed as the config changes.
pub struct Checker {
    targets: HashMap<Arc<ProbeKey>, Arc<TargetShared>>,
    probers: Arc<Probers>,
    commands: mpsc::UnboundedSender<Command>,
    scheduler: JoinHandle<()>,
}

/// Starts the checks of `config`; the probes in `down` start `unhealthy` (a verdict kept from
/// before a restart), the others `initializing`; probes through the tunnel take their mark
/// from `tunnels` (the balancer's plan, already written to the datapath). Call inside the tokio
/// runtime, in the balancer's network namespace.
pub fn spawn(
    config: &Config,
    down: &HashSet<ProbeKey>,
    tunnels: &Tunnels,
    verdicts: mpsc::UnboundedSender<Verdict>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Checker> {
    let probers = Arc::new(Probers::new());
    let (commands, commands_rx) = mpsc::unbounded_channel();
    let scheduler = Scheduler::new(probers.clone(), verdicts, Instant::now());
    let mut checker = Checker {
        targets: HashMap::new(),
        probers,
        commands,
        scheduler: tokio::spawn(scheduler.run(commands_rx, stop)),
    };
    checker.apply(config, down, tunnels)?;
    Ok(checker)
}

/// What [`Checker::update`] did: probes started (new targets, or a changed check, which starts
/// over at `initializing`) and stopped; the others kept their state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeChanges {
    pub started: usize,
    pub stopped: usize,
}

impl Checker {
    /// Moves to the probes of `config`: probes that stay keep their window and state; new ones
    /// start at `initializing`; gone ones stop. Fails (changing nothing) when a raw socket a new
    /// check kind needs cannot be opened, or a probe through the tunnel has no slot in
    /// `tunnels`.
    pub fn update(&mut self, config: &Config, tunnels: &Tunnels) -> anyhow::Result<ProbeChanges> {
        self.apply(config, &HashSet::new(), tunnels)
    }

    /// As [`Checker::update`]; new probes in `down` start `unhealthy`.
    fn apply(
        &mut self,
        config: &Config,
        down: &HashSet<ProbeKey>,
        tunnels: &Tunnels,
    ) -> anyhow::Result<ProbeChanges> {
        let wanted: HashSet<ProbeKey> = plan(config).into_iter().map(|(k, _)| k).collect();
        // Each new probe through the tunnel and its way there, before anything changes.
        let mut vias = HashMap::new();
        for key in wanted.iter().filter(|k| !self.targets.contains_key(*k)) {
            if let Some(t) = &key.tunnel {
                let mark = tunnels.mark(&t.path(key.target.ip())).with_context(|| {
                    format!(
                        "no tunnel slot for the probe of {} through {}",
                        key.target, t.vip
                    )
                })?;
                let source = t.source;
                vias.insert(key.clone(), Via { mark, source });
            }
        }
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
                via: vias.get(key.as_ref()).copied(),
            });
            self.targets.insert(key, shared);
        }
        let mut changes = ProbeChanges::default();
        for command in commands {
            match &command {
                Command::Add { .. } => changes.started += 1,
                Command::Remove(_) => changes.stopped += 1,
            }
            if self.commands.send(command).is_err() {
                tracing::error!("the health check scheduler has stopped");
                break;
            }
        }
        Ok(changes)
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
    pub fn half_open_syns(&self) -> Option<crate::model::SynPaths> {
        self.probers.syn.get().map(|syn| {
            let (link, kernel) = syn.syns_sent();
            crate::model::SynPaths { link, kernel }
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
            let Some(key) = ProbeKey::of(&config.lb, s, b.address) else {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    #[test]
    fn probes_through_the_tunnel_are_targets_of_their_own() {
        // Each on the VIP's port, one health port for all.
        let service = |name: &str, vip: &str, port: u16, through: bool| {
            format!(
                "[[service]]\nname = \"{name}\"\nvip = \"{vip}:{port}\"\nforwarding = \"ipip\"\n\
                 backends = [{{ address = \"10.0.2.2:{port}\" }}]\n[service.check]\nkind = \"tcp\"\n\
                 port = 8080\nthrough_tunnel = {through}\n"
            )
        };
        let config = crate::config::parse(&format!(
            "[lb]\ninterfaces = [\"eth1\"]\n{}{}{}{}",
            service("through", "10.100.0.1", 80, true),
            service("plain", "10.100.0.1", 81, false),
            service("other-vip", "10.100.0.2", 80, true),
            service("same", "10.100.0.1", 82, true),
        ))
        .unwrap();
        let plan = plan(&config);
        let members: Vec<Vec<(usize, usize)>> = plan.iter().map(|p| p.1.clone()).collect();
        // One backend address and check: through the tunnel or not, and to which VIP, are
        // probes apart; another service through the same tunnel shares its probe.
        assert_eq!(members, [vec![(0, 0), (3, 0)], vec![(1, 0)], vec![(2, 0)]]);
        assert!(plan.iter().all(|(k, _)| k.target.port() == 8080));
        let vip = |i: usize| plan[i].0.tunnel.map(|t| t.vip.to_string());
        assert_eq!(vip(0).as_deref(), Some("10.100.0.1"));
        assert_eq!(vip(1), None);
        assert_eq!(vip(2).as_deref(), Some("10.100.0.2"));
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
                b.address = *addr;
            }
            c
        };
        let both = config(&[up, closed]);
        let key_of = |addr: std::net::SocketAddr| ProbeKey {
            target: addr,
            check: both.services[0].check.clone(),
            tunnel: None,
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        let no_tunnels = Tunnels::default();
        let mut checker = spawn(&both, &HashSet::new(), &no_tunnels, tx, stop).unwrap();
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
        let changes = checker.update(&config(&[up]), &no_tunnels).unwrap();
        assert_eq!(
            changes,
            ProbeChanges {
                started: 0,
                stopped: 1
            }
        );
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
