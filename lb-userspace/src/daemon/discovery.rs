//! Backends from DNS, the I/O: each service's name resolved with hickory (the resolvers the
//! service names, or /etc/resolv.conf's), when its last answer's TTL runs out (daemon/dns.rs
//! decides when and what an answer does), and the result handed to the daemon, which applies
//! a changed set as a reload of that service would be.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use hickory_resolver::{
    ResolveError, TokioResolver,
    config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts},
    name_server::TokioConnectionProvider,
    proto::{
        ProtoErrorKind,
        op::ResponseCode,
        rr::{RData, RecordType},
        xfer::Protocol,
    },
};
use tokio::sync::{Notify, watch};
use tracing::debug;

use super::{
    dns::{DnsState, Outcome},
    state::Shared,
};
use crate::config::{
    Backend, Config, MAX_WEIGHT,
    discovery::{Discovery, Record},
};

/// A resolver for `spec`: its servers (UDP, then TCP for truncated answers) or the system's,
/// no cache (the TTL is honoured here), one attempt per server within the spec's timeout.
fn resolver(spec: &Discovery) -> Result<TokioResolver, String> {
    let mut opts = ResolverOpts::default();
    opts.timeout = spec.timeout;
    opts.attempts = 1;
    opts.cache_size = 0;
    opts.use_hosts_file = ResolveHosts::Never;
    opts.ndots = 0;
    let builder = if spec.resolvers.is_empty() {
        TokioResolver::builder_tokio().map_err(|e| format!("reading /etc/resolv.conf: {e}"))?
    } else {
        let mut config = ResolverConfig::new();
        for &server in &spec.resolvers {
            config.add_name_server(NameServerConfig::new(server, Protocol::Udp));
            config.add_name_server(NameServerConfig::new(server, Protocol::Tcp));
        }
        TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
    };
    Ok(builder.with_options(opts).build())
}

/// An error's meaning: no such name or no record of the type is an empty answer; anything
/// else (SERVFAIL, REFUSED, a timeout, no server reachable) is a failure.
fn failure(name: &str, e: &ResolveError) -> Option<String> {
    if let Some(ProtoErrorKind::NoRecordsFound { response_code, .. }) = e.proto().map(|p| p.kind())
        && matches!(
            response_code,
            ResponseCode::NXDomain | ResponseCode::NoError
        )
    {
        return None;
    }
    Some(format!("resolving {name}: {e}"))
}

/// The name as an absolute one: no search domain is appended.
fn absolute(name: &str) -> String {
    if name.ends_with('.') {
        name.to_owned()
    } else {
        format!("{name}.")
    }
}

/// The addresses of `name` of the VIP's family, with their smallest TTL.
async fn addresses(
    r: &TokioResolver,
    name: &str,
    v6: bool,
) -> Result<Option<(Vec<IpAddr>, Duration)>, String> {
    let kind = if v6 { RecordType::AAAA } else { RecordType::A };
    match r.lookup(name, kind).await {
        Ok(lookup) => {
            let mut ttl = u32::MAX;
            let mut ips = Vec::new();
            for record in lookup.record_iter() {
                let ip = match record.data() {
                    RData::A(a) if !v6 => IpAddr::V4(a.0),
                    RData::AAAA(a) if v6 => IpAddr::V6(a.0),
                    _ => continue,
                };
                ttl = ttl.min(record.ttl());
                ips.push(ip);
            }
            ips.sort();
            ips.dedup();
            Ok((!ips.is_empty()).then(|| (ips, Duration::from_secs(u64::from(ttl)))))
        }
        Err(e) => match failure(name, &e) {
            Some(why) => Err(why),
            None => Ok(None),
        },
    }
}

/// Resolves `spec` for a service whose VIP is of family `v6`.
pub async fn resolve(spec: &Discovery, v6: bool) -> Outcome {
    let r = match resolver(spec) {
        Ok(r) => r,
        Err(why) => return Outcome::Failed(why),
    };
    let name = absolute(&spec.name);
    let found = match spec.record {
        Record::A | Record::Aaaa => {
            let port = spec.port.unwrap_or_default();
            addresses(&r, &name, spec.record == Record::Aaaa)
                .await
                .map(|found| {
                    found.map(|(ips, ttl)| {
                        let backends = ips
                            .into_iter()
                            .map(|ip| Backend {
                                address: SocketAddr::new(ip, port),
                                weight: spec.weight,
                                server_id: None,
                            })
                            .collect();
                        (backends, ttl)
                    })
                })
        }
        Record::Srv => srv(&r, &name, v6).await,
    };
    match found {
        Ok(Some((backends, ttl))) => Outcome::Found { backends, ttl },
        Ok(None) => Outcome::Empty,
        Err(why) => Outcome::Failed(why),
    }
}

/// SRV: the records of the lowest priority (the others are for when those are gone, which
/// health checking handles here), each target resolved in the VIP's family; the weight as
/// the record gives it (0, "rarely", as 1: lb's 0 drains), at most lb's largest.
async fn srv(
    r: &TokioResolver,
    name: &str,
    v6: bool,
) -> Result<Option<(Vec<Backend>, Duration)>, String> {
    let lookup = match r.lookup(name, RecordType::SRV).await {
        Ok(l) => l,
        Err(e) => {
            return match failure(name, &e) {
                Some(why) => Err(why),
                None => Ok(None),
            };
        }
    };
    let mut ttl = u32::MAX;
    let mut records = Vec::new();
    for record in lookup.record_iter() {
        if let RData::SRV(srv) = record.data() {
            ttl = ttl.min(record.ttl());
            records.push(srv.clone());
        }
    }
    let Some(top) = records.iter().map(|s| s.priority()).min() else {
        return Ok(None);
    };
    let mut backends: Vec<Backend> = Vec::new();
    let mut ttl = Duration::from_secs(u64::from(ttl));
    for s in records.iter().filter(|s| s.priority() == top) {
        let target = s.target().to_ascii();
        // A target with no address of the family (or whose query failed) gives no backend;
        // the others still do.
        match addresses(r, &target, v6).await {
            Ok(Some((ips, t))) => {
                ttl = ttl.min(t);
                for ip in ips {
                    let address = SocketAddr::new(ip, s.port());
                    if !backends.iter().any(|b| b.address == address) {
                        backends.push(Backend {
                            address,
                            weight: u32::from(s.weight()).clamp(1, MAX_WEIGHT),
                            server_id: None,
                        });
                    }
                }
            }
            Ok(None) => debug!(%target, "SRV target without an address"),
            Err(why) => return Err(why),
        }
    }
    Ok((!backends.is_empty()).then_some((backends, ttl)))
}

/// Each service's name resolved once (at start, before anything is loaded: the first datapath
/// has their backends); a name that does not answer starts with none and is asked again soon.
pub async fn initial(config: &Config) -> BTreeMap<String, DnsState> {
    let now = Instant::now();
    let unix = super::running::now();
    let queries = config.services.iter().filter_map(|s| {
        let spec = s.discovery.clone()?;
        let (name, v6) = (s.name.clone(), s.vip.is_ipv6());
        Some(async move {
            let outcome = resolve(&spec, v6).await;
            let mut state = DnsState::new(spec, now);
            if let Outcome::Failed(why) = &outcome {
                tracing::warn!(service = %name, name = %state.spec.name, error = %why, "DNS: no backends from it yet");
            }
            state.observe(outcome, now, unix);
            (name, state)
        })
    });
    futures_util::future::join_all(queries)
        .await
        .into_iter()
        .collect()
}

/// Resolves what is due until the daemon stops; `wake` is notified when the configuration
/// changed (a name added, removed or changed is due at once).
pub async fn run(shared: Arc<Shared>, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    loop {
        let (due, next) = shared.dns_due(Instant::now());
        if !due.is_empty() {
            let queries = due.into_iter().map(|(service, spec, v6)| async move {
                let outcome = resolve(&spec, v6).await;
                (service, spec, outcome)
            });
            let results = futures_util::future::join_all(queries).await;
            let shared = shared.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || shared.dns_results(results)).await {
                tracing::error!(error = %e, "applying DNS answers");
            }
            continue;
        }
        let sleep = next.map_or(Duration::from_secs(3600), |n| {
            n.saturating_duration_since(Instant::now())
        });
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = wake.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
