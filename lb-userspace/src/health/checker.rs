//! Runs the active checks: one task per distinct probe (address and check; services sharing a
//! backend and a check share it), probing at the window's per-state
//! interval with a fixed per-target phase offset (so targets do not probe in lockstep), feeding
//! each result to the target's [`Window`] and sending every state change as a [`Verdict`].

use std::{
    collections::HashMap,
    net::SocketAddrV4,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    probe::{ProbeResult, http, icmp::IcmpProber, tcp_connect, tcp_syn::SynProber, udp},
    window::{Transition, Window},
};
use crate::config::{Check, CheckKind, Config, HttpMethod};

/// A state change of one target.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub service: usize,
    pub backend: usize,
    pub kind: CheckKind,
    pub transition: Transition,
    pub unhealthy_threshold: u32,
    pub healthy_threshold: u32,
}

/// Shared probe machinery: one raw socket for half-open probes, one for ICMP echo (icmp and udp
/// checks), one set of TLS configs.
struct Probers {
    syn: Option<SynProber>,
    icmp: Option<IcmpProber>,
    tls: http::TlsConfigs,
    /// Bounds the probes in flight (sockets, memory) however many targets there are.
    in_flight: tokio::sync::Semaphore,
    /// Probes started so far.
    sent: std::sync::atomic::AtomicU64,
}

/// The running checks.
pub struct Checker {
    tasks: Vec<JoinHandle<()>>,
    probers: Arc<Probers>,
}

impl Checker {
    /// Probes started so far (for benchmarks and diagnostics).
    pub fn probes(&self) -> u64 {
        self.probers.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for every task to end (after the stop signal).
    pub async fn join(self) {
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "health check task");
            }
        }
    }
}

/// Probes in flight at most; a probe beyond waits for a slot (its window sees a later result,
/// never a wrong one).
pub const MAX_PROBES_IN_FLIGHT: usize = 4096;

/// Starts a task per target of every service whose check is not `none`. Call inside the tokio
/// runtime, in the balancer's network namespace.
pub fn spawn(
    config: &Config,
    verdicts: mpsc::UnboundedSender<Verdict>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Checker> {
    let needs_syn = config
        .services
        .iter()
        .any(|s| s.check.kind == CheckKind::Tcp);
    let syn = match needs_syn {
        true => Some(SynProber::new().map_err(|e| {
            anyhow::anyhow!("half-open TCP checks need a raw socket (CAP_NET_RAW): {e}; use kind = \"tcp-connect\" otherwise")
        })?),
        false => None,
    };
    let needs_icmp = config
        .services
        .iter()
        .any(|s| matches!(s.check.kind, CheckKind::Icmp | CheckKind::Udp));
    let icmp = match needs_icmp {
        true => Some(IcmpProber::new().map_err(|e| {
            anyhow::anyhow!("icmp and udp checks need a raw ICMP socket (CAP_NET_RAW): {e}")
        })?),
        false => None,
    };
    let probers = Arc::new(Probers {
        syn,
        icmp,
        tls: http::TlsConfigs::new(),
        in_flight: tokio::sync::Semaphore::new(MAX_PROBES_IN_FLIGHT),
        sent: std::sync::atomic::AtomicU64::new(0),
    });
    let epoch = Instant::now();
    let tasks = plan(config)
        .into_iter()
        .map(|(target, check, members)| {
            let job = Job {
                members,
                target,
                http: http_check(&check),
                check,
                probers: probers.clone(),
                verdicts: verdicts.clone(),
                epoch,
            };
            tokio::spawn(job.run(stop.clone()))
        })
        .collect();
    Ok(Checker { tasks, probers })
}

/// A distinct probe: its address, its check, and the (service, backend) pairs it stands for.
pub type PlannedProbe = (SocketAddrV4, Check, Vec<(usize, usize)>);

/// The distinct probes of a config.
/// Identical probes (same address and check) are run once for every service using them: the
/// result feeds one window, whose verdicts go to each pair.
pub fn plan(config: &Config) -> Vec<PlannedProbe> {
    let mut index: HashMap<(SocketAddrV4, &Check), usize> = HashMap::new();
    let mut out: Vec<PlannedProbe> = Vec::new();
    for (sid, s) in config.services.iter().enumerate() {
        if s.check.kind == CheckKind::None {
            continue;
        }
        for (bid, b) in s.backends.iter().enumerate() {
            let target =
                SocketAddrV4::new(*b.address.ip(), s.check.port.unwrap_or(b.address.port()));
            let i = *index.entry((target, &s.check)).or_insert_with(|| {
                out.push((target, s.check.clone(), Vec::new()));
                out.len() - 1
            });
            out[i].2.push((sid, bid));
        }
    }
    out
}
struct Job {
    /// The (service, backend) pairs this probe stands for.
    members: Vec<(usize, usize)>,
    target: SocketAddrV4,
    /// The request of http and https checks, built once.
    http: Option<http::HttpCheck>,
    check: Check,
    probers: Arc<Probers>,
    verdicts: mpsc::UnboundedSender<Verdict>,
    epoch: Instant,
}

impl Job {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut window = Window::new(self.check.window);
        // A fixed phase per target spreads probes over the interval.
        let phase = phase(self.target, self.check.window.interval);
        tokio::select! {
            _ = tokio::time::sleep(phase) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        loop {
            let result = self.probe().await;
            if let Some(transition) = window.observe(result, self.epoch.elapsed()) {
                for &(service, backend) in &self.members {
                    let verdict = Verdict {
                        service,
                        backend,
                        kind: self.check.kind,
                        transition,
                        unhealthy_threshold: self.check.window.unhealthy_threshold,
                        healthy_threshold: self.check.window.healthy_threshold,
                    };
                    if self.verdicts.send(verdict).is_err() {
                        return; // the daemon is shutting down
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(window.next_interval()) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    async fn probe(&self) -> ProbeResult {
        // The semaphore is never closed, so acquiring only waits.
        let Ok(_slot) = self.probers.in_flight.acquire().await else {
            return ProbeResult::Timeout;
        };
        self.probers
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let timeout = self.check.window.timeout;
        match self.check.kind {
            CheckKind::Tcp => match &self.probers.syn {
                Some(syn) => syn.probe(self.target, timeout).await,
                None => ProbeResult::TcpFailure,
            },
            CheckKind::TcpConnect => {
                tcp_connect::probe(
                    self.target,
                    self.check.send.as_deref(),
                    self.check.expect.as_deref(),
                    timeout,
                )
                .await
            }
            CheckKind::Http | CheckKind::Https => match &self.http {
                Some(check) => http::probe(check, &self.probers.tls, self.target, timeout).await,
                None => ProbeResult::HttpFailure,
            },
            CheckKind::Icmp => match &self.probers.icmp {
                Some(icmp) => icmp.probe(*self.target.ip(), timeout).await,
                None => ProbeResult::TcpFailure,
            },
            CheckKind::Udp => match &self.probers.icmp {
                Some(icmp) => {
                    udp::probe(
                        icmp,
                        self.target,
                        self.check.send.as_deref(),
                        self.check.expect.as_deref(),
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
        let members: Vec<Vec<(usize, usize)>> = plan.iter().map(|p| p.2.clone()).collect();
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
        assert_eq!(plan[2].1.kind, CheckKind::TcpConnect);
        assert_eq!(plan[3].1.kind, CheckKind::Udp);
    }
}
