//! `lb run`: load the config, load (or adopt a pinned) datapath and fill it, attach, run the
//! checks, serve the API, keep the backends' neighbour entries resolved, announce the VIPs
//! (route health injection); reload on SIGHUP; on SIGINT or SIGTERM exit leaving a pinned
//! datapath forwarding and its VIPs announced; on `lb stop` withdraw the VIPs, forward for the
//! grace period, then remove everything.

mod announce;
mod config;
mod control;
mod discovery;
mod dns;
mod etcd_watch;
mod notify;
mod passive;
mod running;
mod signal;
mod state;
mod status;
mod synproxy;
mod writer;

pub use crate::api::RequestError;
pub use announce::{HostState, host_file, read_host_state, withdraw_left_over};
pub use state::{Shared, Stop, ids_file};

use std::{
    collections::{BTreeSet, HashSet},
    net::{IpAddr, SocketAddr, UdpSocket},
    path::Path,
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use lb_common::counter;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, watch},
};
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use crate::{api, balancer::Balancer, config::Config, dataplane::Dataplane, health};

/// How often lb re-announces itself to the backends' neighbour entries.
const NEIGHBOUR_REFRESH: Duration = Duration::from_secs(10);

/// Loads the datapath for `config` and writes its whole state; attaches nothing, so the program
/// never sees a half-written state. Runs in the network namespace of the interfaces.
pub fn prepare(config: &Config) -> anyhow::Result<(Dataplane, Balancer)> {
    crate::dataplane::check_ipv6_forwarding(config)?;
    let mut dataplane = Dataplane::load(&config.lb, None)?;
    let balancer = Balancer::new(
        config,
        |sid, backend| snat_address(config, sid, backend),
        &mut dataplane,
    )?;
    dataplane.set_counts(balancer.service_slots(), balancer.backend_count());
    Ok((dataplane, balancer))
}

/// Loads (or, pinned, adopts) the datapath and writes `config` into it. An adopted datapath
/// keeps its connection table, ids and flags: a backend that was unavailable stays so, and its
/// probe starts `unhealthy` (the verdict kept from before the restart) rather than
/// `initializing`, which counts as available. Returns those probes too.
fn load(
    config: &Config,
    pin: Option<&Path>,
) -> anyhow::Result<(Dataplane, Balancer, HashSet<health::checker::ProbeKey>)> {
    crate::dataplane::check_ipv6_forwarding(config)?;
    let mut dataplane = Dataplane::load(&config.lb, pin)?;
    let ids = match pin.filter(|_| dataplane.adopted()) {
        Some(dir) => {
            let file = state::ids_file(dir);
            let ids = state::read_ids(&file).with_context(|| {
                format!(
                    "a datapath is pinned at {} but its ids cannot be read; `lb stop` removes it",
                    dir.display()
                )
            })?;
            info!(pin = %dir.display(), "adopting the pinned datapath");
            Some(ids)
        }
        None => None,
    };
    // The availability each adopted backend had: kept until its first verdict.
    let mut flags = std::collections::HashMap::new();
    for s in ids.iter().flat_map(|i| i.services.iter()) {
        for &(address, id, _) in &s.backends {
            let flags_now = dataplane.backend_flags(id, address.is_ipv6())?;
            flags.insert(id, flags_now & lb_common::backend_flags::UP != 0);
        }
    }
    let mut balancer = Balancer::with_ids(config, ids);
    if dataplane.adopted() {
        // Kept addresses stay in their slots; what this config no longer has is cleared.
        balancer.set_written_addrs(dataplane.addr_table()?, dataplane.addr_table6()?);
    }
    balancer.apply(
        config,
        |sid, backend| snat_address(config, sid, backend),
        // Unchecked backends get no verdict that would correct a flag: they start available.
        |sid, _, id| {
            config.services[sid].check.kind == crate::config::CheckKind::None
                || id.and_then(|id| flags.get(&id).copied()).unwrap_or(true)
        },
        &mut dataplane,
    )?;
    dataplane.set_counts(balancer.service_slots(), balancer.backend_count());
    let mut down = HashSet::new();
    for (sid, s) in config.services.iter().enumerate() {
        for (bid, b) in s.backends.iter().enumerate() {
            let was_down = balancer
                .backend_id(sid, bid)
                .and_then(|id| flags.get(&id))
                .is_some_and(|up| !up);
            if let Some(key) =
                health::checker::ProbeKey::of(&config.lb, s, b.address).filter(|_| was_down)
            {
                info!(
                    service = %s.name,
                    backend = %b.address,
                    "unavailable before the restart: starts unhealthy until its probes pass"
                );
                down.insert(key);
            }
        }
    }
    Ok((dataplane, balancer, down))
}

/// `lb run`: until SIGINT/SIGTERM (the datapath stays, pinned, for the next `lb run`) or
/// `lb stop` (everything removed). `pin = false` (`--no-pin`): nothing outlives the daemon.
pub async fn run(
    store: crate::source::Store,
    snapshot: crate::source::Snapshot,
    config: Config,
    pin: bool,
) -> anyhow::Result<()> {
    // Probes and API connections each need a descriptor: a budget the API cannot exhaust.
    let (fd_limit, short) = crate::resources::raise_fd_limit();
    match short {
        Some(warning) => warn!(fd_limit, "{warning}"),
        None => info!(fd_limit, "open-file limit"),
    }
    // Names resolved before anything is loaded: the first datapath has their backends.
    let mut dns = discovery::initial(&config).await;
    let config = store
        .compose(&snapshot.text)
        .and_then(|text| config::effective(&text, &mut dns))
        .map_err(|e| anyhow::anyhow!("the configuration with its DNS backends: {e}"))?;
    store.remember(&snapshot);
    let etcd = match &store {
        crate::source::Store::Etcd(e) => Some(e.source.clone()),
        crate::source::Store::File(_) => None,
    };
    let pin_dir = pin.then(|| config.lb.pin_path.clone());
    let _lock = match &pin_dir {
        Some(dir) => Some(lock_pin(dir)?),
        None => None,
    };
    let (host, table) = announcing(&config, pin_dir.as_deref())?;
    let (mut dataplane, balancer, down) = load(&config, pin_dir.as_deref())?;
    let backends: BTreeSet<IpAddr> = balancer
        .backend_addresses()
        .iter()
        .map(|a| a.ip())
        .collect();
    resolve_neighbours(&backends);
    warn_port_overlap(&config.lb.snat_ports);
    for iface in &config.lb.interfaces {
        dataplane.attach(iface, config.lb.xdp_mode)?;
    }
    // Probes through the tunnel need the TC egress program on every interface.
    dataplane.check_tunnel(&config)?;
    // An adopted datapath may still sit on interfaces this config no longer names.
    for iface in dataplane.detach_unused_links()? {
        info!(%iface, "detached from an interface the config no longer names");
    }
    info!(
        config = %store.describe().1,
        version = %snapshot.version,
        services = config.services.len(),
        interfaces = ?config.lb.interfaces,
        pinned = ?pin_dir,
        "lb running"
    );

    let (stop_tx, mut stop_rx) = watch::channel(Stop::Running);
    let (tasks_stop_tx, tasks_stop) = watch::channel(false);
    let (verdict_tx, verdict_rx) = mpsc::unbounded_channel();
    let checker = health::checker::spawn(
        &config,
        &down,
        balancer.tunnels(),
        verdict_tx,
        tasks_stop.clone(),
    )?;
    let api_addr = config.lb.api;
    let token = std::env::var("LB_API_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| config.lb.api_token.clone());
    // The passive signals are read as they come, without the daemon's lock.
    let ring = writer::watch(dataplane.signal_ring()?)?;
    // So are the datapath trace's records; its switches go with the trace's sessions.
    let trace_hub = crate::trace::Hub::new();
    let (trace_maps, trace_log) = dataplane.take_trace(trace_hub.sink())?;
    trace_hub.set_maps(trace_maps);
    let shared = Arc::new(Shared::new(
        running::ConfigState::new(store, snapshot, dns),
        pin_dir.as_deref().map(state::ids_file),
        pin_dir.as_deref().map(announce::host_file),
        Shared::inner(config, dataplane, balancer, checker, host),
        stop_tx,
        trace_hub.clone(),
    ));
    let (work_tx, work_rx) = mpsc::unbounded_channel();
    let (next_end_tx, next_end_rx) = watch::channel(None);
    let mut notifier = notify::Notifier::from_env();
    let tick = notifier
        .ping_every()
        .map_or(writer::TRAFFIC_EVERY, |p| p.min(writer::TRAFFIC_EVERY));
    let listener = api::bind(api_addr).await?;
    notifier.ready(shared.summary());
    let writer = writer::spawn(shared.clone(), work_rx, next_end_tx, notifier, table)
        .context("starting the health writer thread")?;
    let mut api = tokio::spawn(
        api::serve(
            listener,
            api::ApiState::new(shared.clone(), token),
            tasks_stop.clone(),
        )
        .instrument(info_span!("api")),
    );
    shared
        .resources
        .fd_limit
        .store(fd_limit, std::sync::atomic::Ordering::Relaxed);
    shared.lock().set_reporting();
    let feeder = tokio::spawn(
        writer::feed(
            ring,
            verdict_rx,
            work_tx,
            next_end_rx,
            tasks_stop.clone(),
            tick,
            shared.announce.clone(),
        )
        .instrument(info_span!("health")),
    );
    let tracer = tokio::spawn(
        crate::trace::read(trace_hub, trace_log, tasks_stop.clone())
            .instrument(info_span!("trace")),
    );
    let resolver = tokio::spawn(
        discovery::run(
            shared.clone(),
            shared.config.dns_wake.clone(),
            tasks_stop.clone(),
        )
        .instrument(info_span!("dns")),
    );
    let watcher = etcd.map(|source| {
        tokio::spawn(
            etcd_watch::run(shared.clone(), source, tasks_stop.clone())
                .instrument(info_span!("etcd")),
        )
    });
    let neighbours = tokio::spawn(
        keep_neighbours(shared.clone(), tasks_stop.clone()).instrument(info_span!("neighbours")),
    );

    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let (how, result) = loop {
        tokio::select! {
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break (Stop::Exit, Ok(())) }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break (Stop::Exit, Ok(())) }
            _ = sighup.recv() => {
                info!("SIGHUP: reloading the config");
                // Reading the file and resolving SNAT addresses block; a rejection is logged
                // and evented by reload itself.
                let shared = shared.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || shared.reload("SIGHUP")).await {
                    error!(error = %e, "reload task");
                }
            }
            how = stop_rx.wait_for(|s| *s != Stop::Running) => {
                let how = how.map_or(Stop::Exit, |h| *h);
                info!("stop requested through the API");
                break (how, Ok(()));
            }
            // The API only ends early on error (e.g. its address is taken): stop everything.
            res = &mut api => break (Stop::Exit, match res {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::Error::new(e).context("control API task")),
            }),
        }
    };
    notify::stopping();
    // The datapath goes (`lb stop`, or not pinned): the VIPs first, while it still forwards.
    if how == Stop::Remove || pin_dir.is_none() {
        withdraw_before_stopping(&shared, &mut sigterm, &mut sigint).await;
    }
    // Receivers may already be gone when a task ended; nothing else listens.
    tasks_stop_tx.send_replace(true);
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
    if let Err(e) = resolver.await {
        error!(error = %e, "DNS task");
    }
    if let Some(Err(e)) = match watcher {
        Some(w) => Some(w.await),
        None => None,
    } {
        error!(error = %e, "etcd task");
    }
    if let Err(e) = tracer.await {
        error!(error = %e, "trace reader task");
    }
    if let Err(e) = feeder.await {
        error!(error = %e, "health feeder task");
    }
    // The feeder held the last sender: the writer ends once its queue is done.
    match tokio::task::spawn_blocking(move || writer.join()).await {
        Ok(Ok(())) => {}
        _ => error!("the health writer thread panicked"),
    }
    // Every task holding the state has ended above (an API request handler that still runs
    // would hold it: the server's graceful shutdown waited for those).
    let Ok(shared) = Arc::try_unwrap(shared) else {
        anyhow::bail!("daemon state still referenced at shutdown");
    };
    let inner = shared
        .inner
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    inner.checker.join().await;
    let config_announces = inner.config.lb.announce.is_some();
    let mut dataplane = inner.dataplane;
    if let Ok(stats) = dataplane.stats() {
        info!(
            forwarded = stats.counter(counter::FWD_TX) + stats.counter(counter::FWD_REDIRECT),
            new_flows = stats.counter(counter::CT_NEW),
            passed = stats.counter(counter::PASS_NOT_VIP),
            "final counters"
        );
    }
    match (how, &pin_dir) {
        (Stop::Exit, Some(dir)) => {
            dataplane.release();
            info!(pin = %dir.display(), "the datapath keeps forwarding (pinned); the next `lb run` adopts it, `lb stop` removes it");
        }
        (_, dir) => {
            dataplane.detach_all();
            if let Some(dir) = dir {
                // A run before this one announced in a table this config does not name: its
                // routes go with the datapath.
                if config_announces {
                    let _ = std::fs::remove_file(announce::host_file(dir));
                } else {
                    match announce::withdraw_left_over(&announce::host_file(dir)) {
                        Ok(vips) if !vips.is_empty() => {
                            info!(?vips, "removed the routes a previous run announced");
                        }
                        Ok(_) => {}
                        Err(e) => {
                            error!(error = %format!("{e:#}"), "removing the routes a previous run announced")
                        }
                    }
                }
                // Everything goes: the ids and the lock beside them (they may not exist).
                let ids = state::ids_file(dir);
                let _ = std::fs::remove_file(ids.with_extension("lock"));
                let _ = std::fs::remove_file(ids);
            }
        }
    }
    result
}

/// How the host announces at first, and the table it announces in (None without
/// `[lb.announce]`). A host drained before a restart of its pinned datapath stays drained.
fn announcing(
    config: &Config,
    pin: Option<&Path>,
) -> anyhow::Result<(
    crate::announce::HostMode,
    Option<crate::announce::KernelTable>,
)> {
    use crate::announce::HostMode;
    let Some(a) = &config.lb.announce else {
        if let Some(Ok(Some(before))) =
            pin.map(|dir| announce::read_host_state(&announce::host_file(dir)))
        {
            warn!(
                table = before.table,
                "a previous run announced VIPs in this table and this config has no [lb.announce]: its routes stay until `lb stop`"
            );
        }
        return Ok((HostMode::Announcing, None));
    };
    let table = crate::announce::KernelTable::open(a.table)
        .context("opening a route netlink socket for [lb.announce]")?;
    let before = match pin {
        Some(dir) => announce::read_host_state(&announce::host_file(dir)).unwrap_or_else(|e| {
            warn!(error = %format!("{e:#}"), "the host's announcing state from before cannot be read: announcing");
            None
        }),
        None => None,
    };
    let host = match before {
        Some(b) if b.drained => {
            info!(
                "the host was drained before this restart: its VIPs stay withdrawn until `lb undrain-host`"
            );
            HostMode::Drained
        }
        _ => HostMode::Announcing,
    };
    if let Some(b) = before.filter(|b| b.table != a.table) {
        warn!(
            before = b.table,
            now = a.table,
            "the announce table changed across the restart: lb's routes in the old table stay (`ip route flush table {} proto {}` removes them)",
            b.table,
            crate::announce::ROUTE_PROTOCOL
        );
    }
    if pin.is_none() {
        warn!(
            "announcing without pinning (--no-pin): SIGINT and SIGTERM withdraw the VIPs before the datapath goes, but after kill -9 their routes stay and lead nowhere until lb runs again"
        );
    }
    info!(table = a.table, grace = %crate::config::show_duration(a.grace), host = host.as_str(), "announcing VIPs (route health injection)");
    Ok((host, Some(table)))
}

/// Before the datapath goes: every VIP withdrawn (written by the health writer, which still
/// runs), then `grace` of forwarding while the routers move the flows away. A second SIGTERM
/// or SIGINT ends the grace early.
async fn withdraw_before_stopping(
    shared: &Arc<Shared>,
    sigterm: &mut tokio::signal::unix::Signal,
    sigint: &mut tokio::signal::unix::Signal,
) {
    let Some((generation, grace)) = shared.stop_announcing() else {
        return;
    };
    let waiting = shared.clone();
    let (written, still) = tokio::task::spawn_blocking(move || {
        let written = waiting.announce.wait(generation, announce::WRITE_WAIT);
        let still = waiting
            .lock()
            .announcer
            .as_ref()
            .map_or(0, |a| a.announced_count());
        (written, still)
    })
    .await
    .unwrap_or((false, 0));
    if !written || still > 0 {
        error!(
            still_announced = still,
            "not every VIP could be withdrawn before stopping"
        );
    }
    info!(
        grace = %crate::config::show_duration(grace),
        "every VIP withdrawn; forwarding for the grace period before stopping"
    );
    tokio::select! {
        () = tokio::time::sleep(grace) => {}
        _ = sigterm.recv() => info!("SIGTERM: the grace period ends early"),
        _ = sigint.recv() => info!("SIGINT: the grace period ends early"),
    }
}

/// Holds a lock on the pin directory's ids file for the daemon's lifetime, so that two daemons
/// never drive one pinned datapath.
fn lock_pin(dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = state::ids_file(dir).with_extension("lock");
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match crate::dataplane::patiently(|| file.try_lock()) {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another `lb run` drives the datapath pinned at {} (lock {} is held)",
            dir.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Warns when SNAT ports overlap this namespace's ephemeral ports: a connection of the host's
/// own (a tcp-connect or http probe, say) could then share a SNAT flow's addresses and ports
/// towards a backend, and its replies would go to the client.
fn warn_port_overlap(snat: &std::ops::RangeInclusive<u16>) {
    const PATH: &str = "/proc/sys/net/ipv4/ip_local_port_range";
    let local = std::fs::read_to_string(PATH)
        .ok()
        .and_then(|text| parse_port_range(&text));
    if let Some(both) = local.and_then(|local| overlap(snat, &local)) {
        warn!(
            "snat_ports {}-{} overlap the host's ephemeral ports ({PATH}: {}-{}); narrow \
             snat_ports or reserve them with net.ipv4.ip_local_reserved_ports",
            snat.start(),
            snat.end(),
            both.start(),
            both.end()
        );
    }
}

/// `ip_local_port_range`'s "FIRST<tab>LAST".
fn parse_port_range(text: &str) -> Option<std::ops::RangeInclusive<u16>> {
    let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
    let (first, last) = (parts.next()??, parts.next()??);
    Some(first..=last)
}

/// The ports two ranges share, if any.
fn overlap(
    a: &std::ops::RangeInclusive<u16>,
    b: &std::ops::RangeInclusive<u16>,
) -> Option<std::ops::RangeInclusive<u16>> {
    let (first, last) = (*a.start().max(b.start()), *a.end().min(b.end()));
    (first <= last).then_some(first..=last)
}

/// A backend's SNAT address: the service's, else `lb.snat_address` of the backend's family,
/// else the source address the kernel uses towards the backend (its egress interface's).
pub fn snat_address(config: &Config, sid: usize, backend: SocketAddr) -> anyhow::Result<IpAddr> {
    let configured = config.services[sid]
        .snat_address
        .or(config.lb.snat_address.for_family_of(backend.ip()));
    if let Some(a) = configured {
        return Ok(a);
    }
    let socket = UdpSocket::bind(crate::health::probe::wildcard(backend.ip()))?;
    socket
        .connect(SocketAddr::new(backend.ip(), 9))
        .with_context(|| format!("no route to backend {}", backend.ip()))?;
    Ok(socket.local_addr()?.ip())
}

/// The datapath needs each backend's MAC in the kernel's neighbour table (bpf_fib_lookup reads
/// it but cannot resolve it). An empty datagram to the discard port makes the kernel resolve
/// and refresh the entry; whatever the backend answers (ICMP port unreachable) is ignored.
///
/// Never blocks: a datagram to a neighbour being resolved waits in the kernel, counted
/// against the socket's send buffer, until the neighbour answers or its probes give up (3 s
/// and more). Thousands of backends that do not answer filled it, and a reload of 500 services
/// waited 20 s in `sendto` (measured). What does not fit now goes in a later round.
pub fn resolve_neighbours(backends: &BTreeSet<IpAddr>) {
    let ips: Vec<IpAddr> = backends.iter().copied().collect();
    refresh_neighbours(&ips, 0);
}

/// Sends the datagrams of [`resolve_neighbours`] to `ips` from index `from` on, wrapping
/// around, until every one is sent or the send buffer is full; returns where to start next.
fn refresh_neighbours(ips: &[IpAddr], from: usize) -> usize {
    if ips.is_empty() {
        return 0;
    }
    // One socket per family in use (an IPv4 socket cannot send to IPv6, and the host may have
    // no IPv6 at all).
    let mut sockets: [Option<UdpSocket>; 2] = [None, None];
    for n in 0..ips.len() {
        let at = (from + n) % ips.len();
        let ip = ips[at];
        let socket = &mut sockets[usize::from(ip.is_ipv6())];
        if socket.is_none() {
            match UdpSocket::bind(crate::health::probe::wildcard(ip))
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
            {
                Ok(s) => *socket = Some(s),
                Err(e) => {
                    debug!(error = %e, "neighbour refresh socket");
                    continue;
                }
            }
        }
        let Some(socket) = socket else { continue };
        match socket.send_to(&[], SocketAddr::new(ip, 9)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                debug!(
                    sent = n,
                    of = ips.len(),
                    "neighbour refresh: send buffer full, the rest later"
                );
                return at;
            }
            Err(e) => debug!(%ip, error = %e, "neighbour refresh"),
        }
    }
    from
}

async fn keep_neighbours(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut next = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(NEIGHBOUR_REFRESH) => {
                let backends: Vec<IpAddr> = shared
                    .lock()
                    .balancer
                    .backend_addresses()
                    .iter()
                    .map(|a| a.ip())
                    .collect::<BTreeSet<IpAddr>>()
                    .into_iter()
                    .collect();
                next = refresh_neighbours(&backends, next);
            }
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snat_ports_against_the_ephemeral_range() {
        let linux = parse_port_range("32768\t60999\n").unwrap();
        assert_eq!(linux, 32768..=60999);
        assert_eq!(overlap(&(1024..=32767), &linux), None, "the defaults");
        assert_eq!(overlap(&(30000..=40000), &linux), Some(32768..=40000));
        assert_eq!(overlap(&(1024..=65535), &linux), Some(32768..=60999));
        assert_eq!(parse_port_range("oops"), None);
    }
}
