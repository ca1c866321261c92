//! `lb run`: load the config, load and fill the datapath, attach, serve the API, keep the
//! backends' neighbour entries resolved, and on SIGINT or SIGTERM detach and exit.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use lb_common::counter;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
};
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use crate::{
    api::{self, ApiState},
    balancer::Balancer,
    config::{CheckKind, Config},
    dataplane::Dataplane,
    health::{self, checker::Verdict, window::HealthState},
};

/// Health state per service, per backend (as in the config).
pub type HealthStates = Vec<Vec<HealthState>>;

fn initial_states(config: &Config) -> HealthStates {
    config
        .services
        .iter()
        .map(|s| {
            let state = match s.check.kind {
                CheckKind::None => HealthState::Disabled,
                _ => HealthState::Initializing,
            };
            vec![state; s.backends.len()]
        })
        .collect()
}

/// Writes each verdict's availability into the datapath (flag first, then the ring) and logs it
/// as an event with how long the write took.
async fn apply_verdicts(
    mut verdicts: mpsc::UnboundedReceiver<Verdict>,
    config: Arc<Config>,
    dataplane: Arc<Mutex<Dataplane>>,
    balancer: Arc<Mutex<Balancer>>,
    health: Arc<Mutex<HealthStates>>,
) {
    while let Some(v) = verdicts.recv().await {
        let service = &config.services[v.service];
        let backend = service.backends[v.backend].address;
        let t = &v.transition;
        let started = std::time::Instant::now();
        // Flag first (the datapath honours it at once), then the ring.
        let (mut flag_us, mut ring_us) = (None, None);
        if let Some(up) = t.became_available {
            let mut dp = dataplane.lock().expect("dataplane lock");
            let mut b = balancer.lock().expect("balancer lock");
            let written = b
                .write_up_flag(v.service, v.backend, up, &mut *dp)
                .and_then(|changed| {
                    flag_us = Some(started.elapsed().as_micros() as u64);
                    if changed {
                        b.sync_service(v.service, &mut *dp)?;
                    }
                    ring_us = Some(started.elapsed().as_micros() as u64);
                    Ok(())
                });
            if let Err(e) = written {
                warn!(service = %service.name, %backend, error = %format!("{e:#}"), "writing the health verdict failed");
            }
        }
        health.lock().expect("health lock")[v.service][v.backend] = t.to;
        info!(
            service = %service.name,
            %backend,
            from = t.from.as_str(),
            to = t.to.as_str(),
            source = v.kind.as_str(),
            success = t.counters.success,
            tcp_failure = t.counters.tcp_failure,
            http_failure = t.counters.http_failure,
            timeout_failure = t.counters.timeout_failure,
            healthy_threshold = v.healthy_threshold,
            unhealthy_threshold = v.unhealthy_threshold,
            flag_write_us = flag_us,
            ring_write_us = ring_us,
            "health state changed"
        );
    }
}

/// How often lb re-announces itself to the backends' neighbour entries.
const NEIGHBOUR_REFRESH: Duration = Duration::from_secs(10);

/// Loads the datapath for `config` and writes its whole state; attaches nothing, so the program
/// never sees a half-written state. Runs in the network namespace of the interfaces.
pub fn prepare(config: &Config) -> anyhow::Result<(Dataplane, Balancer)> {
    let mut dataplane = Dataplane::load(&config.lb)?;
    let balancer = Balancer::new(
        config,
        |sid, backend| snat_address(config, sid, backend),
        &mut dataplane,
    )?;
    dataplane.set_counts(config.services.len() as u32, balancer.backend_count());
    Ok((dataplane, balancer))
}

pub async fn run(config_path: &Path, config: Config) -> anyhow::Result<()> {
    let (mut dataplane, balancer) = prepare(&config)?;
    let backends: BTreeSet<Ipv4Addr> = balancer
        .backend_addresses()
        .iter()
        .map(|a| *a.ip())
        .collect();
    resolve_neighbours(&backends);
    for iface in &config.lb.interfaces {
        dataplane.attach(iface, config.lb.xdp_mode)?;
    }
    info!(
        config = %config_path.display(),
        services = config.services.len(),
        interfaces = ?config.lb.interfaces,
        "lb running"
    );

    let dataplane = Arc::new(Mutex::new(dataplane));
    let balancer = Arc::new(Mutex::new(balancer));
    let health = Arc::new(Mutex::new(initial_states(&config)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (verdict_tx, verdict_rx) = mpsc::unbounded_channel();
    let checks = health::checker::spawn(&config, verdict_tx, stop_rx.clone())?;
    let applier = tokio::spawn(
        apply_verdicts(
            verdict_rx,
            Arc::new(config.clone()),
            dataplane.clone(),
            balancer.clone(),
            health.clone(),
        )
        .instrument(info_span!("health")),
    );
    let state = ApiState {
        config: Arc::new(config.clone()),
        dataplane: dataplane.clone(),
        balancer,
        health,
    };
    let mut api = tokio::spawn(
        api::serve(config.lb.api, state, stop_rx.clone()).instrument(info_span!("api")),
    );
    let neighbours =
        tokio::spawn(keep_neighbours(backends, stop_rx).instrument(info_span!("neighbours")));

    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let result = tokio::select! {
        _ = sigterm.recv() => { info!("SIGTERM: shutting down"); Ok(()) }
        _ = sigint.recv() => { info!("SIGINT: shutting down"); Ok(()) }
        // The API only ends early on error (e.g. its address is taken): stop everything.
        res = &mut api => match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(anyhow::Error::new(e).context("control API task")),
        },
    };
    // Receivers may already be gone when a task ended; nothing else listens.
    stop_tx.send_replace(true);
    if !api.is_finished() {
        match api.await {
            Ok(Err(e)) => error!(error = %format!("{e:#}"), "control API"),
            Err(e) => error!(error = %e, "control API task"),
            Ok(Ok(())) => {}
        }
    }
    if let Err(e) = neighbours.await {
        error!(error = %e, "neighbour task");
    }
    checks.join().await;
    if let Err(e) = applier.await {
        error!(error = %e, "health verdict task");
    }

    let mut dataplane = dataplane.lock().expect("dataplane lock");
    if let Ok(stats) = dataplane.stats() {
        info!(
            forwarded = stats.counter(counter::FWD_TX) + stats.counter(counter::FWD_REDIRECT),
            new_flows = stats.counter(counter::CT_NEW),
            passed = stats.counter(counter::PASS_NOT_VIP),
            "final counters"
        );
    }
    dataplane.detach_all();
    result
}

/// A backend's SNAT address: the service's, else `lb.snat_address`, else the source address the
/// kernel uses towards the backend (its egress interface's address).
pub fn snat_address(
    config: &Config,
    sid: usize,
    backend: SocketAddrV4,
) -> anyhow::Result<Ipv4Addr> {
    if let Some(a) = config.services[sid].snat_address.or(config.lb.snat_address) {
        return Ok(a);
    }
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket
        .connect(SocketAddrV4::new(*backend.ip(), 9))
        .with_context(|| format!("no route to backend {}", backend.ip()))?;
    match socket.local_addr()?.ip() {
        std::net::IpAddr::V4(a) => Ok(a),
        std::net::IpAddr::V6(_) => anyhow::bail!("IPv6 source towards {}", backend.ip()),
    }
}

/// The datapath needs each backend's MAC in the kernel's neighbour table (bpf_fib_lookup reads
/// it but cannot resolve it). An empty datagram to the discard port makes the kernel resolve
/// and refresh the entry; whatever the backend answers (ICMP port unreachable) is ignored.
pub fn resolve_neighbours(backends: &BTreeSet<Ipv4Addr>) {
    let socket = match UdpSocket::bind("0.0.0.0:0") {
        Ok(s) => s,
        Err(e) => return debug!(error = %e, "neighbour refresh socket"),
    };
    for ip in backends {
        if let Err(e) = socket.send_to(&[], SocketAddrV4::new(*ip, 9)) {
            debug!(%ip, error = %e, "neighbour refresh");
        }
    }
}

async fn keep_neighbours(backends: BTreeSet<Ipv4Addr>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(NEIGHBOUR_REFRESH) => resolve_neighbours(&backends),
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
