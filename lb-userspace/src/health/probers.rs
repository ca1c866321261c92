//! The probe machinery the scheduler starts probes with: the shared probers (raw sockets opened
//! when a check first needs them, TLS configs), the probe of each kind, latency histograms.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use super::{
    outcome::Reason,
    probe::{ProbeResult, Via, http, icmp::IcmpProber, quic, tcp_connect, tcp_syn::SynProber, udp},
    target::ProbeKey,
};
use crate::config::{Check, CheckKind, HttpMethod};

/// Upper bounds of the probe latency histogram, seconds.
pub const LATENCY_BOUNDS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Successful probe latencies of one check kind (cumulative buckets are computed on read).
#[derive(Default)]
pub(super) struct Histogram {
    pub(super) buckets: [AtomicU64; LATENCY_BOUNDS_S.len() + 1],
    pub(super) sum_us: AtomicU64,
}

impl Histogram {
    /// Counts a latency. One writer only (the scheduler task): a load and a store, not a
    /// locked add, which would wait for every store before it (a third of `finish` in a
    /// profile at 50,000 targets); readers see each count rise, never fall.
    pub(super) fn observe(&self, latency: Duration) {
        let s = latency.as_secs_f64();
        let i = LATENCY_BOUNDS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BOUNDS_S.len());
        let add = |counter: &AtomicU64, n: u64| {
            counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        };
        add(&self.buckets[i], 1);
        add(&self.sum_us, latency.as_micros() as u64);
    }
}

/// Shared probe machinery: one raw socket for half-open probes, one for ICMP echo (icmp and udp
/// checks), opened when a check first needs them; one set of TLS configs.
pub(super) struct Probers {
    pub(super) syn: OnceLock<SynProber>,
    pub(super) icmp: OnceLock<IcmpProber>,
    tls: http::TlsConfigs,
    /// Probes started so far.
    pub(super) sent: AtomicU64,
    pub(super) latency: [Histogram; CheckKind::ALL.len()],
}

impl Probers {
    pub(super) fn new() -> Self {
        Self {
            syn: OnceLock::new(),
            icmp: OnceLock::new(),
            tls: http::TlsConfigs::new(),
            sent: AtomicU64::new(0),
            latency: Default::default(),
        }
    }
}

/// A probe on its way.
pub(super) type Probe = Pin<Box<dyn Future<Output = ProbeResult> + Send>>;

/// One probe of `key` with the shared probers, through the tunnel when `via` says so (the
/// kinds that can: tcp, tcp-connect, http, https). Each kind boxes its own future, so a
/// half-open probe allocates what it needs, not room for an HTTPS exchange. HTTP(S) probes run
/// as tasks of their own: TLS and parsing take CPU that any worker can give.
pub(super) fn probe(
    probers: &Arc<Probers>,
    key: &Arc<ProbeKey>,
    http: Option<&Arc<http::HttpCheck>>,
    via: Option<Via>,
) -> Probe {
    probers.sent.fetch_add(1, Ordering::Relaxed);
    let (p, k) = (probers.clone(), key.clone());
    let target = key.target;
    let timeout = key.check.window.timeout;
    match key.check.kind {
        CheckKind::Tcp => Box::pin(async move {
            match p.syn.get() {
                Some(syn) => syn.probe_via(target, via, timeout).await,
                None => ProbeResult::Local(Reason::NoProber),
            }
        }),
        CheckKind::TcpConnect => Box::pin(async move {
            let check = &k.check;
            tcp_connect::probe_via(
                target,
                via,
                check.send.as_deref(),
                check.expect.as_ref(),
                timeout,
            )
            .await
        }),
        CheckKind::Http | CheckKind::Https => {
            let Some(http) = http.cloned() else {
                return Box::pin(std::future::ready(ProbeResult::Local(Reason::Internal)));
            };
            let task =
                tokio::spawn(
                    async move { http::probe_via(&http, &p.tls, target, via, timeout).await },
                );
            Box::pin(async move {
                task.await.unwrap_or_else(|e| {
                    tracing::error!(error = %e, "http health probe task");
                    ProbeResult::Local(Reason::Internal)
                })
            })
        }
        CheckKind::Icmp => Box::pin(async move {
            match p.icmp.get() {
                Some(icmp) => icmp.probe(target.ip(), timeout).await,
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
                        check.expect.as_ref(),
                        timeout,
                    )
                    .await
                }
                None => ProbeResult::Local(Reason::NoProber),
            }
        }),
        CheckKind::Quic => Box::pin(async move {
            udp::exchange(target, &quic::DATAGRAM, Some(&quic::EXPECT), timeout).await
        }),
        // Checks of kind none are not scheduled.
        CheckKind::None => Box::pin(std::future::ready(ProbeResult::Local(Reason::Internal))),
    }
}

/// The probe request of an http or https check.
pub(super) fn http_check(check: &Check) -> Option<http::HttpCheck> {
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
        unhealthy: o.unhealthy_status.clone(),
        tls: (check.kind == CheckKind::Https).then(|| http::TlsCheck {
            verify: o.verify_tls,
            server_name: o.host.clone(),
        }),
    })
}
