//! The desired datapath state and how it changes: services, backends, their flags and Maglev
//! rings, written through a [`MapWriter`]. Pure: the real maps and an in-memory fake implement
//! the writer, so every rule here is tested without a kernel.
//!
//! A health or drain change writes the backend's flag first (the datapath skips an unavailable
//! backend for new flows at once), then only the ring slots that changed.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use anyhow::{Context as _, bail};
use lb_common::{
    AddrSet, AddrSet6, NO_BACKEND, QuicServerKey, ServiceInfo, addr_flags, backend_flags,
    service_flags,
};

pub use crate::model::Admin;
use crate::{
    addr_table::{AddrTable, AddrTable6},
    config::{AllUnhealthy, Config, ExistingFlows, Forwarding, SynProxy},
    entries::{AnyBackend, AnyServiceKey, AnyTunnel},
    maglev::{self, Member},
    quic_table::{QuicService, QuicTable, QuicWrite},
    tunnels::Tunnels,
};

/// Where the desired state goes: the BPF maps, or memory in tests.
pub trait MapWriter {
    /// Writes set `index` of the IPv4 address table (see [`crate::addr_table`]).
    fn set_addr_set(&mut self, index: u32, set: &AddrSet) -> anyhow::Result<()>;
    /// Writes set `index` of the IPv6 address table.
    fn set_addr_set6(&mut self, index: u32, set: &AddrSet6) -> anyhow::Result<()>;
    fn set_service(&mut self, key: AnyServiceKey, info: ServiceInfo) -> anyhow::Result<()>;
    /// Writes backend `id` into its family's map.
    fn set_backend(&mut self, id: u32, info: AnyBackend) -> anyhow::Result<()>;
    /// Writes `(slot, backend id)` pairs of one service's ring.
    fn set_ring_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> anyhow::Result<()>;
    /// Removes a service: packets to it are no longer balanced.
    fn remove_service(&mut self, key: AnyServiceKey) -> anyhow::Result<()>;
    /// Writes slot `slot` of its family's tunnel table (health probes through the tunnel).
    fn set_tunnel(&mut self, slot: u32, entry: AnyTunnel) -> anyhow::Result<()>;
    /// Writes service `service_id`'s QUIC layout word (0: not QUIC).
    fn set_quic_layout(&mut self, service_id: u32, word: u32) -> anyhow::Result<()>;
    /// Writes backend `backend_id`'s QUIC server ID (None: it has none).
    fn set_quic_id(&mut self, backend_id: u32, server_id: Option<u64>) -> anyhow::Result<()>;
    /// Points (service, server ID) at a backend id, or removes it (None).
    fn set_quic_server(
        &mut self,
        key: QuicServerKey,
        backend_id: Option<u32>,
    ) -> anyhow::Result<()>;
}

/// Ids handed out so far: what a restarted daemon needs to adopt a pinned datapath whose
/// connection table refers to backends by id. Saved by the daemon, given back to
/// [`Balancer::with_ids`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ids {
    pub services: Vec<ServiceIds>,
    /// Backends removed by a reload: their ids stay reserved until `until_unix_s`, so a flow
    /// still in the connection table never lands on a newcomer that reused the id.
    pub retired: Vec<(u32, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServiceIds {
    pub name: String,
    pub id: u32,
    /// (address, id, admin setting)
    pub backends: Vec<(SocketAddr, u32, Admin)>,
}

/// What a config change did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub services_added: Vec<String>,
    pub services_removed: Vec<String>,
    pub services_changed: Vec<String>,
    pub backends_added: Vec<(String, SocketAddr)>,
    pub backends_removed: Vec<(String, SocketAddr)>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

pub struct Balancer {
    ring_size: u32,
    max_services: u32,
    max_backends: u32,
    services: Vec<ServiceState>,
    /// (service, backend) positions by backend id: the datapath's passive signals name the
    /// backend by id, one per refused or timed-out connection, and a scan of every backend
    /// per signal took 46 µs at 50,000 backends (67 ns by this map), under the daemon's lock.
    by_id: HashMap<u32, (usize, usize)>,
    /// (backend id, reserved until unix seconds), see [`Ids::retired`].
    retired: Vec<(u32, u64)>,
    /// The address tables as written to the maps.
    addrs: AddrTable,
    addrs6: AddrTable6,
    /// The tunnel table of health probes through the tunnel, as written to the maps.
    tunnels: Tunnels,
    /// The QUIC routing's maps as written.
    quic: QuicTable,
    /// Ids and admin settings of a previous run, used for the first config applied.
    adopted: Option<Ids>,
    /// Moves whenever anything a ring is computed from changes (a backend's flags, a
    /// reload): a [`RingPlan`] taken before is then stale.
    epoch: u64,
}

/// A service's ring inputs, taken under the daemon's lock ([`Balancer::ring_plan`]) so that
/// the Maglev work runs outside it: a ring with an unavailable member is a population of the
/// others (3 ms in a release build, 30 in a debug one), and one backend shared by 500 services
/// changes 500 rings.
pub struct RingPlan {
    sid: usize,
    epoch: u64,
    keys: Vec<Vec<u8>>,
    weights: Vec<u32>,
    ids: Vec<u32>,
    available: Vec<bool>,
    base: Arc<[u32]>,
    ring_size: u32,
    on_all_unhealthy: AllUnhealthy,
}

/// A service's ring as backend ids, and the service flag that goes with it.
pub struct ComputedRing {
    sid: usize,
    epoch: u64,
    ids: Vec<u32>,
    mode: u32,
}

impl RingPlan {
    /// The ring: the base with the unavailable members' slots handed to the others, or the
    /// policy's when none is available.
    pub fn compute(self) -> ComputedRing {
        let size = self.ring_size;
        let members: Vec<Member> = self
            .keys
            .iter()
            .zip(&self.weights)
            .map(|(key, &weight)| Member { key, weight })
            .collect();
        let overlay = if members.is_empty() {
            None
        } else {
            maglev::overlay_with_base(&self.base, &members, &self.available, size)
        };
        // (ring owners as member indices, extra service flag)
        let (owners, mode) = match (overlay, self.on_all_unhealthy) {
            (Some(ring), _) => (Some(ring), 0),
            (None, _) if members.is_empty() => (None, service_flags::DROP),
            // Nobody available: never cut traffic unless told to.
            (None, AllUnhealthy::UseAll) => {
                (Some(self.base.to_vec()), service_flags::USE_UNAVAILABLE)
            }
            (None, AllUnhealthy::First) => {
                (Some(vec![0; size as usize]), service_flags::USE_UNAVAILABLE)
            }
            (None, AllUnhealthy::Drop) => (None, service_flags::DROP),
        };
        let ids = match owners {
            Some(owners) => owners.iter().map(|&m| self.ids[m as usize]).collect(),
            None => vec![NO_BACKEND; size as usize],
        };
        ComputedRing {
            sid: self.sid,
            epoch: self.epoch,
            ids,
            mode,
        }
    }
}

#[derive(Clone)]
struct ServiceState {
    name: String,
    key: AnyServiceKey,
    info: ServiceInfo,
    keep_flows: bool,
    /// Its new connections go through the SYN proxy now (`syn_proxy = "on"`, or `"auto"`
    /// engaged).
    syn_proxy: bool,
    on_all_unhealthy: AllUnhealthy,
    forwarding: Forwarding,
    /// Its VIP answers pings (`answer_ping`).
    answer_ping: bool,
    backends: Vec<BackendState>,
    /// Indices into `backends` of the ring members (weight > 0), and their plain Maglev ring.
    members: Vec<usize>,
    base: Arc<[u32]>,
    /// Backend ids, one per slot, as written to the map (empty: nothing written yet).
    ring: Vec<u32>,
    /// The service entry must be written (new key or new service).
    dirty: bool,
}

impl ServiceState {
    /// Its ring members as Maglev sees them.
    fn member_list(&self) -> Vec<Member<'_>> {
        self.members
            .iter()
            .map(|&i| Member {
                key: &self.backends[i].key,
                weight: self.backends[i].weight,
            })
            .collect()
    }

    /// What its ring is computed from besides its members' keys and weights (which make
    /// `base`): each member's id and whether it takes new flows.
    fn ring_inputs(&self) -> Vec<(u32, bool)> {
        self.members
            .iter()
            .map(|&i| (self.backends[i].id, self.backends[i].takes_new_flows()))
            .collect()
    }

    /// Whether its ring is the one `old` has: the same base, members and policy.
    fn same_ring_as(&self, old: &ServiceState) -> bool {
        Arc::ptr_eq(&self.base, &old.base)
            && self.on_all_unhealthy == old.on_all_unhealthy
            && self.keep_flows == old.keep_flows
            && self.syn_proxy == old.syn_proxy
            && !self.dirty
            && self.ring_inputs() == old.ring_inputs()
    }
}

/// Whether a service with `setting` is proxied now: an automatic proxy keeps what it was across
/// a reload (`old`: the service before it).
fn syn_proxy_now(setting: SynProxy, old: Option<&ServiceState>) -> bool {
    match setting {
        SynProxy::Off => false,
        SynProxy::On => true,
        SynProxy::Auto => old.is_some_and(|o| o.syn_proxy),
    }
}

/// The "no data back" timeout of a service's backends in the datapath's ticks (2^20 ns); 0 off.
fn no_data_ticks(passive: &crate::config::Passive) -> u16 {
    match passive.no_data_timeout {
        Some(t) if passive.enabled => {
            let ticks = (t.as_nanos() >> lb_common::DATA_TICK_SHIFT).max(1);
            u16::try_from(ticks).unwrap_or(u16::MAX)
        }
        _ => 0,
    }
}

#[derive(Clone)]
struct BackendState {
    id: u32,
    address: SocketAddr,
    key: Vec<u8>,
    weight: u32,
    /// Health verdict: may take flows.
    healthy: bool,
    /// Ejected by passive checks (either scope).
    ejected: bool,
    admin: Admin,
    /// Its service's forwarding mode as the datapath's flag (0: full NAT).
    encap: u32,
    info: AnyBackend,
}

impl BackendState {
    fn flags(&self) -> u32 {
        let up = self.healthy && !self.ejected && self.admin != Admin::Disabled;
        let drained = self.weight == 0 || self.admin == Admin::Drained;
        (if up { backend_flags::UP } else { 0 })
            | (if drained { backend_flags::DRAINED } else { 0 })
            | self.encap
    }

    fn takes_new_flows(&self) -> bool {
        self.info.flags() & (backend_flags::UP | backend_flags::DRAINED) == backend_flags::UP
    }
}

/// lb's addresses by family, with their [`addr_flags`].
#[derive(Default)]
struct Addresses {
    v4: BTreeMap<Ipv4Addr, u32>,
    v6: BTreeMap<Ipv6Addr, u32>,
}

impl Addresses {
    fn add(&mut self, ip: IpAddr, flags: u32) {
        match ip {
            IpAddr::V4(ip) => *self.v4.entry(ip).or_default() |= flags,
            IpAddr::V6(ip) => *self.v6.entry(ip).or_default() |= flags,
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Balancer {
    /// Builds the state for `config` (every backend healthy) and writes all of it. `snat(service,
    /// backend)` gives each backend's SNAT address.
    pub fn new(
        config: &Config,
        snat: impl Fn(usize, SocketAddr) -> anyhow::Result<IpAddr>,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<Self> {
        let mut b = Self::with_ids(config, None);
        b.apply(config, snat, |_, _, _| true, writer)?;
        Ok(b)
    }

    /// An empty balancer sized for `config.lb`; the first [`Balancer::apply`] reuses the ids and
    /// admin settings of `ids` (a previous run's) for the services and backends it still has.
    pub fn with_ids(config: &Config, ids: Option<Ids>) -> Self {
        Self {
            ring_size: config.lb.ring_size,
            max_services: config.lb.max_services,
            max_backends: config.lb.max_backends,
            services: Vec::new(),
            by_id: HashMap::new(),
            retired: ids.as_ref().map(|i| i.retired.clone()).unwrap_or_default(),
            addrs: AddrTable::default(),
            addrs6: AddrTable6::default(),
            tunnels: Tunnels::default(),
            quic: QuicTable::default(),
            adopted: ids,
            epoch: 0,
        }
    }

    /// The address table an adopted map holds (a new map is empty): the next
    /// [`Balancer::apply`] keeps its addresses in their slots and clears what it no longer has.
    pub fn set_written_addrs(&mut self, table: AddrTable, table6: AddrTable6) {
        self.addrs = table;
        self.addrs6 = table6;
    }

    /// Ids and admin settings to save for a restart.
    pub fn ids(&self) -> Ids {
        Ids {
            services: self
                .services
                .iter()
                .map(|s| ServiceIds {
                    name: s.name.clone(),
                    id: s.info.id,
                    backends: s
                        .backends
                        .iter()
                        .map(|b| (b.address, b.id, b.admin))
                        .collect(),
                })
                .collect(),
            retired: self.retired.clone(),
        }
    }

    /// Moves to `config`: services and backends are matched by name and address and keep their
    /// ids, health and admin settings (so established flows and rings stay where they are); new
    /// ones get free ids, with `healthy(service, backend, adopted id)` as their first verdict
    /// (the id is given for a backend adopted from [`Ids`] of a previous run). Everything is
    /// planned (ids, SNAT addresses, rings, the address table) before the first write: a config
    /// that does not fit (too many services, backends or addresses) fails with nothing written.
    /// The map sizes and ring size (`[lb]`) are fixed at load time; the caller refuses changes to
    /// them.
    pub fn apply(
        &mut self,
        config: &Config,
        snat: impl Fn(usize, SocketAddr) -> anyhow::Result<IpAddr>,
        healthy: impl Fn(usize, SocketAddr, Option<u32>) -> bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<Changes> {
        let now = unix_now();
        let quarantine = config.lb.conntrack.tcp_established_timeout.as_secs().max(1);
        let mut changes = Changes::default();
        // The previous state: this run's, or the adopted ids of a previous run (kept until a
        // change is planned: a refused one must not lose them).
        let adopted = self.adopted.clone();
        let old: HashMap<&str, &ServiceState> =
            self.services.iter().map(|s| (s.name.as_str(), s)).collect();
        let old_ids: HashMap<&str, &ServiceIds> = adopted
            .iter()
            .flat_map(|i| i.services.iter())
            .map(|s| (s.name.as_str(), s))
            .collect();

        // Service ids: kept by name, new ones take the lowest free id.
        let mut service_ids: Vec<Option<u32>> = config
            .services
            .iter()
            .map(|s| {
                old.get(s.name.as_str())
                    .map(|o| o.info.id)
                    .or_else(|| old_ids.get(s.name.as_str()).map(|o| o.id))
            })
            .collect();
        let mut used: HashSet<u32> = service_ids.iter().flatten().copied().collect();
        for (i, id) in service_ids.iter_mut().enumerate() {
            if id.is_none() {
                let free = (0..self.max_services).find(|n| !used.contains(n)).with_context(|| {
                    format!(
                        "service {}: no free service slot (lb.max_services = {}; it is fixed until a restart)",
                        config.services[i].name, self.max_services
                    )
                })?;
                used.insert(free);
                *id = Some(free);
            }
        }

        // Backend ids: kept by (service, address); ids of removed backends are retired.
        let mut retired: Vec<(u32, u64)> = self
            .retired
            .iter()
            .copied()
            .filter(|&(_, until)| until > now)
            .collect();
        let wanted: HashSet<(&str, SocketAddr)> = config
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(move |b| (s.name.as_str(), b.address)))
            .collect();
        let mut removed_backends: Vec<BackendState> = Vec::new();
        for s in &self.services {
            for b in &s.backends {
                if !wanted.contains(&(s.name.as_str(), b.address)) {
                    retired.push((b.id, now + quarantine));
                    removed_backends.push(b.clone());
                    changes.backends_removed.push((s.name.clone(), b.address));
                }
            }
        }
        // Every backend of the config is looked up in the previous state: by hash, not by a
        // search of its service (20,000 backends in one service took 4 s, the daemon locked).
        let mut old_backends: HashMap<(&str, SocketAddr), &BackendState> = HashMap::new();
        for s in &self.services {
            for b in &s.backends {
                old_backends
                    .entry((s.name.as_str(), b.address))
                    .or_insert(b);
            }
        }
        let mut old_backend_ids: HashMap<(&str, SocketAddr), (u32, Admin)> = HashMap::new();
        for s in adopted.iter().flat_map(|i| i.services.iter()) {
            for &(address, id, admin) in &s.backends {
                old_backend_ids
                    .entry((s.name.as_str(), address))
                    .or_insert((id, admin));
            }
        }
        let previous =
            |name: &str, address: SocketAddr| -> Option<(u32, Admin, Option<&BackendState>)> {
                if let Some(b) = old_backends.get(&(name, address)) {
                    return Some((b.id, b.admin, Some(*b)));
                }
                old_backend_ids
                    .get(&(name, address))
                    .map(|&(id, admin)| (id, admin, None))
            };
        let mut used: HashSet<u32> = retired.iter().map(|r| r.0).collect();
        for s in &config.services {
            for b in &s.backends {
                if let Some((id, _, _)) = previous(&s.name, b.address) {
                    used.insert(id);
                }
            }
        }
        let mut next_free = 0u32;
        let mut services = Vec::with_capacity(config.services.len());
        // For each service (None: new) whether a setting other than its members changed.
        let mut settings_changed = Vec::with_capacity(config.services.len());
        for (sid, s) in config.services.iter().enumerate() {
            let old_service = old.get(s.name.as_str());
            let mut backends = Vec::with_capacity(s.backends.len());
            for b in &s.backends {
                let snat_addr = snat(sid, b.address)
                    .with_context(|| format!("SNAT address for {} of {}", b.address, s.name))?;
                let prev = previous(&s.name, b.address);
                let (id, admin, healthy_now) = match prev {
                    Some((id, admin, Some(state))) => (id, admin, state.healthy),
                    Some((id, admin, None)) => (id, admin, healthy(sid, b.address, Some(id))),
                    None => {
                        while used.contains(&next_free) {
                            next_free += 1;
                        }
                        if next_free >= self.max_backends {
                            bail!(
                                "backend {} of {}: no free backend slot (lb.max_backends = {}, {} held by removed backends until their flows expire; it is fixed until a restart)",
                                b.address,
                                s.name,
                                self.max_backends,
                                retired.len()
                            );
                        }
                        used.insert(next_free);
                        changes.backends_added.push((s.name.clone(), b.address));
                        (next_free, Admin::Enabled, healthy(sid, b.address, None))
                    }
                };
                let mut state = BackendState {
                    id,
                    address: b.address,
                    key: b.address.to_string().into_bytes(),
                    weight: b.weight,
                    healthy: healthy_now,
                    ejected: prev.and_then(|p| p.2).is_some_and(|b| b.ejected),
                    admin,
                    encap: s.forwarding.backend_flag(),
                    info: AnyBackend::new(b.address, snat_addr, no_data_ticks(&s.passive))
                        .with_context(|| format!("backend {} of {}", b.address, s.name))?,
                };
                state.info.set_flags(state.flags());
                backends.push(state);
            }
            let members: Vec<usize> = (0..backends.len())
                .filter(|&i| backends[i].weight > 0)
                .collect();
            let key = AnyServiceKey::new(s.vip, s.protocol.number());
            // The ring as written moves over below (not copied: 256 KiB a service).
            let (dirty, flags) = match old_service {
                Some(o) => (o.key != key, o.info.flags),
                None => (true, 0),
            };
            settings_changed.push(old_service.map(|o| {
                o.key != key
                    || o.keep_flows != (s.existing_flows == ExistingFlows::Keep)
                    || o.syn_proxy != syn_proxy_now(s.syn_proxy, Some(*o))
                    || o.on_all_unhealthy != s.on_all_unhealthy
                    || o.forwarding != s.forwarding
            }));
            services.push(ServiceState {
                name: s.name.clone(),
                key,
                info: ServiceInfo {
                    id: service_ids[sid].expect("assigned above"),
                    flags,
                },
                keep_flows: s.existing_flows == ExistingFlows::Keep,
                syn_proxy: syn_proxy_now(s.syn_proxy, old_service.copied()),
                on_all_unhealthy: s.on_all_unhealthy,
                forwarding: s.forwarding,
                answer_ping: s.answer_ping,
                backends,
                members,
                base: Arc::from([]), // set below
                ring: Vec::new(),
                dirty,
            });
        }
        // The same members (keys and weights, in order) make the same ring: a reload keeps it
        // rather than populating every service's again (milliseconds each, under the daemon's
        // lock: 500 unchanged services took 2.5 s). The others are populated together, once
        // per distinct member list: services over the same members (one pool of hosts serving
        // many ports) share one population and one base ring.
        // Each service's base ring as kept (Ok), or the member list to populate (Err).
        let (sources, populated) = {
            let mut lists: Vec<Vec<Member>> = Vec::new();
            let mut index: HashMap<Vec<Member>, usize> = HashMap::new();
            let sources: Vec<Result<Arc<[u32]>, usize>> = services
                .iter()
                .map(|s| {
                    let list = s.member_list();
                    match old.get(s.name.as_str()) {
                        _ if list.is_empty() => Ok(Arc::from([])),
                        Some(o) if o.member_list() == list => Ok(o.base.clone()),
                        _ => Err(*index.entry(list.clone()).or_insert_with(|| {
                            lists.push(list);
                            lists.len() - 1
                        })),
                    }
                })
                .collect();
            (sources, maglev::populate_all(&lists, self.ring_size))
        };
        let populated: Vec<Arc<[u32]>> = populated.into_iter().map(Arc::from).collect();
        for (s, source) in services.iter_mut().zip(sources) {
            s.base = source.unwrap_or_else(|i| populated[i].clone());
        }
        // Rings whose inputs did not change are kept as written: a change of one service of
        // 500 computed every ring again (140 ms a change, measured in a release build).
        let ring_kept: Vec<bool> = services
            .iter()
            .map(|s| old.get(s.name.as_str()).is_some_and(|o| s.same_ring_as(o)))
            .collect();
        for (s, settings) in services.iter().zip(settings_changed) {
            let members_changed = || old.get(s.name.as_str()).is_some_and(|o| o.base != s.base);
            match settings {
                None => changes.services_added.push(s.name.clone()),
                Some(true) => changes.services_changed.push(s.name.clone()),
                Some(false) if members_changed() => changes.services_changed.push(s.name.clone()),
                Some(false) => {}
            }
        }
        let mut wanted = Addresses::default();
        for (s, c) in services.iter().zip(&config.services) {
            // Services sharing a VIP agree on answer_ping (the config reader checks it).
            let ping = if s.answer_ping { addr_flags::PING } else { 0 };
            let quic = if c.quic.is_some() {
                addr_flags::QUIC
            } else {
                0
            };
            wanted.add(c.vip.ip(), addr_flags::VIP | ping | quic);
            for b in &s.backends {
                wanted.add(b.info.snat_ip(), addr_flags::SNAT);
            }
        }
        // Removed backends' flows drain: no new flows, established ones continue (their SNAT
        // address stays an address of ours while they are retired).
        for b in &removed_backends {
            wanted.add(b.info.snat_ip(), addr_flags::SNAT);
        }
        let (addrs, addrs6) = (wanted.v4, wanted.v6);
        let addr_table = self.addrs.plan(&addrs)?;
        let addr_table6 = self.addrs6.plan(&addrs6)?;
        let tunnels = self.tunnels.plan(config)?;
        self.adopted = None;
        let kept: HashSet<&str> = services.iter().map(|s| s.name.as_str()).collect();
        let removed_services: Vec<&ServiceState> = self
            .services
            .iter()
            .filter(|s| !kept.contains(s.name.as_str()))
            .collect();
        changes.services_removed = removed_services.iter().map(|s| s.name.clone()).collect();

        // Writes: stop traffic to what goes, then backends, rings and services, then the new
        // addresses (a new VIP gets traffic once its ring is complete).
        let cleared = self.addrs.retain(|a| addrs.contains_key(&a));
        for (index, set) in cleared.changes_from(&self.addrs) {
            writer.set_addr_set(index, &set)?;
        }
        let cleared6 = self.addrs6.retain(|a| addrs6.contains_key(&a));
        for (index, set) in cleared6.changes_from(&self.addrs6) {
            writer.set_addr_set6(index, &set)?;
        }
        for s in &removed_services {
            writer.remove_service(s.key)?;
        }
        for s in &services {
            if let Some(o) = old.get(s.name.as_str()).filter(|o| o.key != s.key) {
                writer.remove_service(o.key)?;
            }
        }
        for b in &mut removed_backends {
            b.info.set_flags(b.info.flags() | backend_flags::DRAINED);
            writer.set_backend(b.id, b.info)?;
        }
        let before: HashMap<u32, AnyBackend> = self
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| (b.id, b.info)))
            .collect();
        for s in &services {
            for b in &s.backends {
                if before.get(&b.id) != Some(&b.info) {
                    writer.set_backend(b.id, b.info)?;
                }
            }
        }
        let mut written: HashMap<String, Vec<u32>> = self
            .services
            .iter_mut()
            .map(|o| (o.name.clone(), std::mem::take(&mut o.ring)))
            .collect();
        for s in &mut services {
            s.ring = written.remove(&s.name).unwrap_or_default();
        }
        self.services = services;
        self.by_id = self
            .services
            .iter()
            .enumerate()
            .flat_map(|(sid, s)| {
                s.backends
                    .iter()
                    .enumerate()
                    .map(move |(bid, b)| (b.id, (sid, bid)))
            })
            .collect();
        self.epoch += 1;
        self.retired = retired;
        for (sid, kept) in ring_kept.into_iter().enumerate() {
            if !kept {
                self.sync_ring(sid, writer)?;
            }
        }
        // The QUIC routing before the addresses: a new QUIC VIP is read for connection IDs once
        // its services' layouts and server IDs are there.
        let quic = QuicTable::plan(config.services.iter().zip(&self.services).filter_map(
            |(c, s)| {
                let q = c.quic?;
                let backends = c
                    .backends
                    .iter()
                    .zip(&s.backends)
                    .filter_map(|(b, state)| Some((state.id, b.server_id?)))
                    .collect();
                Some(QuicService {
                    id: s.info.id,
                    word: q.word(),
                    backends,
                })
            },
        ));
        for w in quic.changes_from(&self.quic) {
            match w {
                QuicWrite::Layout(id, word) => writer.set_quic_layout(id, word)?,
                QuicWrite::Id(id, server) => writer.set_quic_id(id, server)?,
                QuicWrite::Server(key, backend) => writer.set_quic_server(key, backend)?,
            }
        }
        self.quic = quic;
        for (index, set) in addr_table.changes_from(&cleared) {
            writer.set_addr_set(index, &set)?;
        }
        for (index, set) in addr_table6.changes_from(&cleared6) {
            writer.set_addr_set6(index, &set)?;
        }
        self.addrs = addr_table;
        self.addrs6 = addr_table6;
        // The probes' slots last: the checker starts a new slot's probes after this returns,
        // and stops a freed slot's before the next change (its packets in flight are dropped).
        for (slot, entry) in tunnels.writes {
            writer.set_tunnel(slot, entry)?;
        }
        self.tunnels = tunnels.next;
        Ok(changes)
    }

    /// The tunnel table's slots (health probes through the tunnel), as written.
    pub fn tunnels(&self) -> &Tunnels {
        &self.tunnels
    }

    /// Marks a backend up or down (health) and rebuilds its ring. Returns whether anything
    /// changed.
    pub fn set_up(
        &mut self,
        service: usize,
        backend: usize,
        up: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        let changed = self.write_up_flag(service, backend, up, writer)?;
        if changed {
            self.sync_ring(service, writer)?;
        }
        Ok(changed)
    }

    /// Drains a backend (no new flows, existing ones continue) or undrains it.
    pub fn set_drained(
        &mut self,
        service: usize,
        backend: usize,
        drained: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        let admin = if drained {
            Admin::Drained
        } else {
            Admin::Enabled
        };
        self.set_admin(service, backend, admin, writer)
    }

    /// An operator's setting; writes the flag, then the ring. Returns whether anything changed.
    pub fn set_admin(
        &mut self,
        service: usize,
        backend: usize,
        admin: Admin,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        let changed = self.update(service, backend, writer, |b| {
            std::mem::replace(&mut b.admin, admin) != admin
        })?;
        if changed {
            self.sync_ring(service, writer)?;
        }
        Ok(changed)
    }

    /// The first half of [`Balancer::set_up`]: only the flag, which the datapath honours at
    /// once. [`Balancer::sync_service`] must follow to rebuild the ring. Returns whether the
    /// health verdict changed.
    pub fn write_up_flag(
        &mut self,
        service: usize,
        backend: usize,
        up: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        self.update(service, backend, writer, |b| {
            std::mem::replace(&mut b.healthy, up) != up
        })
    }

    /// Like [`Balancer::write_up_flag`] for the passive checks' ejection. Returns whether it
    /// changed; [`Balancer::sync_service`] must follow.
    pub fn write_ejected_flag(
        &mut self,
        service: usize,
        backend: usize,
        ejected: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        self.update(service, backend, writer, |b| {
            std::mem::replace(&mut b.ejected, ejected) != ejected
        })
    }

    /// Whether service `sid`'s new connections go through the SYN proxy now.
    pub fn syn_proxy(&self, sid: usize) -> bool {
        self.services.get(sid).is_some_and(|s| s.syn_proxy)
    }

    /// Engages or releases service `sid`'s SYN proxy (`syn_proxy = "auto"`): writes its flags.
    /// Returns whether it changed.
    pub fn set_syn_proxy(
        &mut self,
        sid: usize,
        on: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        self.epoch += 1;
        let s = self.services.get_mut(sid).context("no such service")?;
        if std::mem::replace(&mut s.syn_proxy, on) == on {
            return Ok(false);
        }
        s.dirty = true;
        self.sync_ring(sid, writer)?;
        Ok(true)
    }

    /// (service, backend) positions of a backend id.
    pub fn backend_by_id(&self, id: u32) -> Option<(usize, usize)> {
        self.by_id.get(&id).copied()
    }

    /// Whether a backend is ejected by passive checks.
    pub fn is_ejected(&self, service: usize, backend: usize) -> Option<bool> {
        Some(self.services.get(service)?.backends.get(backend)?.ejected)
    }

    /// Rebuilds a service's ring and flags from its backends' flags; writes what changed.
    pub fn sync_service(
        &mut self,
        service: usize,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<()> {
        if service >= self.services.len() {
            bail!("no service {service}");
        }
        self.sync_ring(service, writer)
    }

    fn backend_mut(&mut self, service: usize, backend: usize) -> anyhow::Result<&mut BackendState> {
        self.services
            .get_mut(service)
            .and_then(|s| s.backends.get_mut(backend))
            .with_context(|| format!("no backend {backend} in service {service}"))
    }

    /// Applies `change` to a backend (it returns whether it changed anything) and writes the
    /// backend's flags if they moved.
    fn update(
        &mut self,
        service: usize,
        backend: usize,
        writer: &mut dyn MapWriter,
        change: impl FnOnce(&mut BackendState) -> bool,
    ) -> anyhow::Result<bool> {
        // Moved by every attempt: a plan taken before is at worst computed again.
        self.epoch += 1;
        let b = self.backend_mut(service, backend)?;
        if !change(b) {
            return Ok(false);
        }
        let flags = b.flags();
        if flags != b.info.flags() {
            b.info.set_flags(flags);
            writer.set_backend(b.id, b.info)?;
        }
        Ok(true)
    }

    /// Recomputes a service's ring and flags and writes what changed.
    fn sync_ring(&mut self, sid: usize, writer: &mut dyn MapWriter) -> anyhow::Result<()> {
        let ring = self.ring_plan(sid).context("no such service")?.compute();
        self.write_computed(ring, writer)
    }

    /// What service `sid`'s ring is computed from, to compute it without `&self` (outside
    /// the daemon's lock) and write it with [`Balancer::write_ring`].
    pub fn ring_plan(&self, sid: usize) -> Option<RingPlan> {
        let s = self.services.get(sid)?;
        let member = |i: &usize| &s.backends[*i];
        Some(RingPlan {
            sid,
            epoch: self.epoch,
            keys: s.members.iter().map(|i| member(i).key.clone()).collect(),
            weights: s.members.iter().map(|i| member(i).weight).collect(),
            ids: s.members.iter().map(|i| member(i).id).collect(),
            available: s
                .members
                .iter()
                .map(|i| member(i).takes_new_flows())
                .collect(),
            base: s.base.clone(),
            ring_size: self.ring_size,
            on_all_unhealthy: s.on_all_unhealthy,
        })
    }

    /// Writes a ring computed from [`Balancer::ring_plan`]. If anything changed since the
    /// plan was taken, the ring is computed again here; a service gone since is skipped.
    pub fn write_ring(
        &mut self,
        ring: ComputedRing,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<()> {
        if ring.sid >= self.services.len() {
            return Ok(());
        }
        if ring.epoch != self.epoch {
            return self.sync_ring(ring.sid, writer);
        }
        self.write_computed(ring, writer)
    }

    fn write_computed(
        &mut self,
        ring: ComputedRing,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<()> {
        let s = &mut self.services[ring.sid];
        let changed = maglev::changed_slots(&s.ring, &ring.ids);
        if !changed.is_empty() {
            writer.set_ring_slots(s.info.id, &changed)?;
        }
        s.ring = ring.ids;
        let flags = if s.keep_flows {
            service_flags::KEEP_FLOWS
        } else {
            0
        } | if s.syn_proxy {
            service_flags::SYN_PROXY
        } else {
            0
        } | ring.mode;
        if flags != s.info.flags || s.dirty {
            s.info.flags = flags;
            writer.set_service(s.key, s.info)?;
            s.dirty = false;
        }
        Ok(())
    }

    /// Position of a service by name.
    pub fn service_index(&self, name: &str) -> Option<usize> {
        self.services.iter().position(|s| s.name == name)
    }

    /// Position of a backend of a service by address.
    pub fn backend_index(&self, service: usize, address: SocketAddr) -> Option<usize> {
        self.services
            .get(service)?
            .backends
            .iter()
            .position(|b| b.address == address)
    }

    /// Service id (index of the per-service maps and rings) of a service.
    pub fn service_id(&self, service: usize) -> Option<u32> {
        Some(self.services.get(service)?.info.id)
    }

    /// Service ids in use (the per-service maps must be read up to this).
    pub fn service_slots(&self) -> u32 {
        self.services
            .iter()
            .map(|s| s.info.id + 1)
            .max()
            .unwrap_or(0)
    }

    /// Backend id (index of the per-backend maps) of a service's backend.
    pub fn backend_id(&self, service: usize, backend: usize) -> Option<u32> {
        Some(self.services.get(service)?.backends.get(backend)?.id)
    }

    /// Whether a backend's health verdict lets it take flows, as last set.
    pub fn is_up(&self, service: usize, backend: usize) -> Option<bool> {
        Some(self.services.get(service)?.backends.get(backend)?.healthy)
    }

    /// A backend's admin setting.
    pub fn admin(&self, service: usize, backend: usize) -> Option<Admin> {
        Some(self.services.get(service)?.backends.get(backend)?.admin)
    }

    /// Whether a backend takes new flows now (health, admin and weight).
    pub fn takes_new_flows(&self, service: usize, backend: usize) -> Option<bool> {
        Some(
            self.services
                .get(service)?
                .backends
                .get(backend)?
                .takes_new_flows(),
        )
    }

    /// A service's ring as written (backend ids).
    pub fn ring(&self, service: usize) -> &[u32] {
        &self.services[service].ring
    }

    /// Every backend address, for neighbour upkeep.
    pub fn backend_addresses(&self) -> Vec<SocketAddr> {
        self.services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.address))
            .collect()
    }

    /// Backend ids in use (the per-backend maps must be read up to this).
    pub fn backend_count(&self) -> u32 {
        self.services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.id + 1))
            .chain(self.retired.iter().map(|r| r.0 + 1))
            .max()
            .unwrap_or(0)
    }
}

/// An in-memory [`MapWriter`] for tests.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MemoryMaps {
    pub addr_sets: BTreeMap<u32, AddrSet>,
    pub addr_sets6: BTreeMap<u32, AddrSet6>,
    pub services: HashMap<AnyServiceKey, ServiceInfo>,
    pub backends: HashMap<u32, AnyBackend>,
    pub rings: HashMap<u32, HashMap<u32, u32>>,
    /// Ring slot writes so far.
    pub slot_writes: usize,
    /// The service id of each ring write so far.
    pub ring_writes: Vec<u32>,
    pub tunnels: BTreeMap<u32, AnyTunnel>,
    pub quic_layouts: BTreeMap<u32, u32>,
    pub quic_ids: BTreeMap<u32, u64>,
    pub quic_servers: BTreeMap<(u32, u64), u32>,
}

impl MemoryMaps {
    /// The addresses in the address table, with their flags.
    pub fn addrs(&self) -> BTreeMap<Ipv4Addr, u32> {
        AddrTable::from_sets(self.addr_sets.iter().map(|(&i, &s)| (i, s))).addrs()
    }

    /// The addresses in the IPv6 address table, with their flags.
    pub fn addrs6(&self) -> BTreeMap<Ipv6Addr, u32> {
        AddrTable6::from_sets(self.addr_sets6.iter().map(|(&i, &s)| (i, s))).addrs()
    }
}

impl MapWriter for MemoryMaps {
    fn set_addr_set(&mut self, index: u32, set: &AddrSet) -> anyhow::Result<()> {
        self.addr_sets.insert(index, *set);
        Ok(())
    }

    fn set_addr_set6(&mut self, index: u32, set: &AddrSet6) -> anyhow::Result<()> {
        self.addr_sets6.insert(index, *set);
        Ok(())
    }

    fn set_service(&mut self, key: AnyServiceKey, info: ServiceInfo) -> anyhow::Result<()> {
        self.services.insert(key, info);
        Ok(())
    }

    fn set_backend(&mut self, id: u32, info: AnyBackend) -> anyhow::Result<()> {
        self.backends.insert(id, info);
        Ok(())
    }

    fn set_ring_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> anyhow::Result<()> {
        let ring = self.rings.entry(service_id).or_default();
        for &(slot, id) in slots {
            ring.insert(slot, id);
        }
        self.slot_writes += slots.len();
        self.ring_writes.push(service_id);
        Ok(())
    }

    fn remove_service(&mut self, key: AnyServiceKey) -> anyhow::Result<()> {
        self.services.remove(&key);
        Ok(())
    }

    fn set_tunnel(&mut self, slot: u32, entry: AnyTunnel) -> anyhow::Result<()> {
        self.tunnels.insert(slot, entry);
        Ok(())
    }

    fn set_quic_layout(&mut self, service_id: u32, word: u32) -> anyhow::Result<()> {
        match word {
            0 => self.quic_layouts.remove(&service_id),
            w => self.quic_layouts.insert(service_id, w),
        };
        Ok(())
    }

    fn set_quic_id(&mut self, backend_id: u32, server_id: Option<u64>) -> anyhow::Result<()> {
        match server_id {
            None => self.quic_ids.remove(&backend_id),
            Some(id) => self.quic_ids.insert(backend_id, id),
        };
        Ok(())
    }

    fn set_quic_server(
        &mut self,
        key: QuicServerKey,
        backend_id: Option<u32>,
    ) -> anyhow::Result<()> {
        let k = (key.service_id, key.server_id);
        match backend_id {
            None => self.quic_servers.remove(&k),
            Some(id) => self.quic_servers.insert(k, id),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    fn config(extra: &str, backends: usize) -> Config {
        let list: Vec<String> = (0..backends)
            .map(|i| format!("{{ address = \"10.0.2.{}:8080\" }}", i + 2))
            .collect();
        config::parse(&format!(
            "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\n{extra}\nbackends = [{}]\n",
            list.join(", ")
        ))
        .unwrap()
    }

    fn build(c: &Config) -> (Balancer, MemoryMaps) {
        let mut maps = MemoryMaps::default();
        let b = Balancer::new(c, snat, &mut maps).unwrap();
        (b, maps)
    }

    fn share(maps: &MemoryMaps, id: u32) -> usize {
        maps.rings[&0].values().filter(|&&b| b == id).count()
    }

    #[test]
    fn quic_services_get_their_layout_server_ids_and_vip_flag() {
        let udp = |ids: &str| {
            config::parse(&format!(
                "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n\
                 [[service]]\nname = \"h3\"\nvip = \"10.100.0.1:443\"\nprotocol = \"udp\"\n\
                 quic = {{ server_id_bytes = 2, config_id = 1 }}\nbackends = [{ids}]\n\
                 [[service]]\nname = \"dns\"\nvip = \"10.100.0.2:53\"\nprotocol = \"udp\"\n\
                 backends = [{{ address = \"10.0.2.2:53\" }}]\n"
            ))
            .unwrap()
        };
        let c = udp(
            "{ address = \"10.0.2.2:443\", server_id = 7 }, { address = \"10.0.2.3:443\", server_id = 8 }, { address = \"10.0.2.4:443\" }",
        );
        let (mut b, mut maps) = build(&c);
        let (h3, dns) = (b.service_id(0).unwrap(), b.service_id(1).unwrap());
        let id = |b: &Balancer, i| b.backend_id(0, i).unwrap();
        assert_eq!(
            maps.quic_layouts,
            [(h3, lb_common::quic_layout_word(2, 1, Some(1)))].into()
        );
        assert_eq!(maps.quic_ids, [(id(&b, 0), 7), (id(&b, 1), 8)].into());
        assert_eq!(
            maps.quic_servers,
            [((h3, 7), id(&b, 0)), ((h3, 8), id(&b, 1))].into()
        );
        assert!(!maps.quic_layouts.contains_key(&dns));
        assert_eq!(
            maps.addrs()[&Ipv4Addr::new(10, 100, 0, 1)],
            addr_flags::VIP | addr_flags::PING | addr_flags::QUIC
        );
        assert_eq!(
            maps.addrs()[&Ipv4Addr::new(10, 100, 0, 2)],
            addr_flags::VIP | addr_flags::PING,
            "no QUIC service there"
        );

        // A backend leaves, another changes its server ID: their entries follow.
        let c =
            udp("{ address = \"10.0.2.3:443\", server_id = 9 }, { address = \"10.0.2.4:443\" }");
        b.apply(&c, snat, |_, _, _| true, &mut maps).unwrap();
        assert_eq!(maps.quic_ids, [(id(&b, 0), 9)].into());
        assert_eq!(maps.quic_servers, [((h3, 9), id(&b, 0))].into());

        // No longer QUIC: all of it goes, the VIP's flag too.
        let plain = c.clone();
        let mut plain = plain;
        plain.services[0].quic = None;
        for backend in &mut plain.services[0].backends {
            backend.server_id = None;
        }
        b.apply(&plain, snat, |_, _, _| true, &mut maps).unwrap();
        assert!(maps.quic_layouts.is_empty() && maps.quic_ids.is_empty());
        assert!(maps.quic_servers.is_empty());
        assert_eq!(
            maps.addrs()[&Ipv4Addr::new(10, 100, 0, 1)] & addr_flags::QUIC,
            0
        );
    }

    #[test]
    fn initial_state_is_written_whole() {
        let (b, maps) = build(&config("", 3));
        assert_eq!(
            maps.addrs()[&Ipv4Addr::new(10, 100, 0, 1)],
            addr_flags::VIP | addr_flags::PING,
            "answer_ping is on by default"
        );
        assert_eq!(maps.addrs()[&Ipv4Addr::new(10, 0, 2, 1)], addr_flags::SNAT);
        assert_eq!(maps.rings[&0].len(), 1009);
        assert_eq!(maps.backends.len(), 3);
        assert!(
            maps.backends
                .values()
                .all(|b| b.flags() == backend_flags::UP)
        );
        let AnyBackend::V4(one) = maps.backends[&1] else {
            panic!("an IPv4 backend")
        };
        assert_eq!(one.port, 8080u16.to_be());
        assert_eq!(maps.services.values().next().unwrap().flags, 0);
        for id in 0..3 {
            assert!(
                (320..=353).contains(&share(&maps, id)),
                "{}",
                share(&maps, id)
            );
        }
        assert_eq!(b.ring(0).len(), 1009);
    }

    #[test]
    fn a_down_backend_loses_only_its_slots_and_gets_exactly_them_back() {
        let (mut b, mut maps) = build(&config("", 3));
        let before = b.ring(0).to_vec();
        let writes = maps.slot_writes;
        assert!(b.set_up(0, 1, false, &mut maps).unwrap());
        assert_eq!(maps.backends[&1].flags(), 0, "flag written");
        assert_eq!(share(&maps, 1), 0);
        let moved = maps.slot_writes - writes;
        assert_eq!(
            moved,
            before.iter().filter(|&&id| id == 1).count(),
            "only its slots were written"
        );
        assert!(
            !b.set_up(0, 1, false, &mut maps).unwrap(),
            "no change, no write"
        );
        b.set_up(0, 1, true, &mut maps).unwrap();
        assert_eq!(b.ring(0), &before[..]);
        let map_ring: Vec<u32> = (0..1009).map(|s| maps.rings[&0][&s]).collect();
        assert_eq!(map_ring, before);
    }

    /// The writer computes a ring outside the daemon's lock and writes it under the lock: a
    /// ring computed from state that changed meanwhile is computed again, not written.
    #[test]
    fn a_ring_computed_apart_is_written_unless_its_inputs_moved() {
        let (mut b, mut maps) = build(&config("", 3));
        let before = b.ring(0).to_vec();
        b.write_up_flag(0, 1, false, &mut maps).unwrap();
        let ring = b.ring_plan(0).unwrap().compute();
        b.write_ring(ring, &mut maps).unwrap();
        assert_eq!(share(&maps, 1), 0, "written without backend 1");
        let without_1 = b.ring(0).to_vec();

        // Computed while backend 1 was down, written after it came back and 2 went down.
        let stale = b.ring_plan(0).unwrap().compute();
        b.write_up_flag(0, 1, true, &mut maps).unwrap();
        b.write_up_flag(0, 2, false, &mut maps).unwrap();
        b.write_ring(stale, &mut maps).unwrap();
        assert!(share(&maps, 1) > 0 && share(&maps, 2) == 0);
        assert_ne!(b.ring(0), &without_1[..]);
        let (mut fresh, mut fresh_maps) = build(&config("", 3));
        fresh.set_up(0, 2, false, &mut fresh_maps).unwrap();
        assert_eq!(
            b.ring(0),
            fresh.ring(0),
            "the ring of the state it was written in"
        );

        assert_ne!(b.ring(0), &before[..]);

        // A service a reload removed meanwhile is skipped.
        let gone = b.ring_plan(0).unwrap().compute();
        let empty = config::parse("[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n").unwrap();
        b.apply(&empty, snat, |_, _, _| true, &mut maps).unwrap();
        let writes = maps.slot_writes;
        b.write_ring(gone, &mut maps).unwrap();
        assert_eq!(maps.slot_writes, writes);
    }

    #[test]
    fn the_flag_can_be_written_before_the_ring() {
        let (mut b, mut maps) = build(&config("", 3));
        let slots = maps.slot_writes;
        assert!(b.write_up_flag(0, 2, false, &mut maps).unwrap());
        assert_eq!(maps.backends[&2].flags(), 0, "flag written");
        assert_eq!(maps.slot_writes, slots, "ring not touched yet");
        assert!(share(&maps, 2) > 0);
        b.sync_service(0, &mut maps).unwrap();
        assert_eq!(share(&maps, 2), 0, "ring rebuilt without it");
        assert!(b.sync_service(7, &mut maps).is_err());
    }

    #[test]
    fn drained_backends_take_no_new_flows_but_stay_up() {
        let (mut b, mut maps) = build(&config("", 3));
        b.set_drained(0, 2, true, &mut maps).unwrap();
        assert_eq!(share(&maps, 2), 0);
        assert_eq!(
            maps.backends[&2].flags(),
            backend_flags::UP | backend_flags::DRAINED
        );
        let c = config::parse(
            "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n[[service]]\nname = \"w\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:80\", weight = 0 }, { address = \"10.0.2.3:80\" }]\n",
        )
        .unwrap();
        let (_, maps) = build(&c);
        assert_eq!(share(&maps, 0), 0, "weight 0 is drained from the start");
        assert_eq!(
            maps.backends[&0].flags(),
            backend_flags::UP | backend_flags::DRAINED
        );
    }

    #[test]
    fn all_unhealthy_policies() {
        for (policy, expect) in [("use-all", "spread"), ("first", "first"), ("drop", "drop")] {
            let (mut b, mut maps) = build(&config(&format!("on_all_unhealthy = \"{policy}\""), 3));
            for i in 0..3 {
                b.set_up(0, i, false, &mut maps).unwrap();
            }
            let svc = *maps.services.values().next().unwrap();
            match expect {
                "spread" => {
                    assert!((0..3).all(|id| share(&maps, id) > 300), "{policy}");
                    assert_eq!(svc.flags, service_flags::USE_UNAVAILABLE);
                }
                "first" => {
                    assert_eq!(share(&maps, 0), 1009, "{policy}");
                    assert_eq!(svc.flags, service_flags::USE_UNAVAILABLE);
                }
                _ => {
                    assert_eq!(svc.flags & service_flags::DROP, service_flags::DROP);
                    assert!(maps.rings[&0].values().all(|&id| id == NO_BACKEND));
                }
            }
            b.set_up(0, 1, true, &mut maps).unwrap();
            assert_eq!(
                share(&maps, 1),
                1009,
                "{policy}: the one available backend takes all"
            );
            assert_eq!(
                maps.services.values().next().unwrap().flags,
                0,
                "{policy}: back to normal"
            );
        }
    }

    #[test]
    fn keep_policy_sets_the_service_flag() {
        let (_, maps) = build(&config("existing_flows = \"keep\"", 2));
        assert_eq!(
            maps.services.values().next().unwrap().flags,
            service_flags::KEEP_FLOWS
        );
    }

    #[test]
    fn weights_shape_the_ring() {
        let c = config::parse(
            "[lb]\ninterfaces = [\"eth1\"]\n[[service]]\nname = \"w\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:80\", weight = 1 }, { address = \"10.0.2.3:80\", weight = 2 }, { address = \"10.0.2.4:80\", weight = 3 }]\n",
        )
        .unwrap();
        let (_, maps) = build(&c);
        let total = 65537.0;
        for (id, want) in [(0, 1.0 / 6.0), (1, 2.0 / 6.0), (2, 3.0 / 6.0)] {
            let got = share(&maps, id) as f64 / total;
            assert!((got - want).abs() < 0.01, "backend {id}: {got}");
        }
    }

    fn two_services(backends_a: &[&str], extra: &str) -> Config {
        let list = |l: &[&str]| {
            l.iter()
                .map(|a| format!("{{ address = \"{a}\" }}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        config::parse(&format!(
            "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\nmax_services = 3\nmax_backends = 8\n\
             [[service]]\nname = \"a\"\nvip = \"10.100.0.1:80\"\nbackends = [{}]\n\
             [[service]]\nname = \"b\"\nvip = \"10.100.0.2:80\"\nbackends = [{{ address = \"10.0.2.9:80\" }}]\n{extra}",
            list(backends_a)
        ))
        .unwrap()
    }

    /// Services over the same members share one base ring (one population), and the others
    /// keep their own.
    #[test]
    fn services_with_the_same_members_share_one_base_ring() {
        let text = |third: &str| {
            format!(
                "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n\
                 [[service]]\nname = \"a\"\nvip = \"10.100.0.1:80\"\nbackends = [{{ address = \"10.0.2.2:80\" }}, {{ address = \"10.0.2.3:80\" }}]\n\
                 [[service]]\nname = \"b\"\nvip = \"10.100.0.1:443\"\nbackends = [{{ address = \"10.0.2.2:80\" }}, {{ address = \"10.0.2.3:80\" }}]\n\
                 [[service]]\nname = \"c\"\nvip = \"10.100.0.2:80\"\nbackends = [{third}]\n"
            )
        };
        let same = "{ address = \"10.0.2.2:80\" }, { address = \"10.0.2.3:80\" }";
        let weighted = "{ address = \"10.0.2.2:80\", weight = 2 }, { address = \"10.0.2.3:80\" }";
        let (b, _) = build(&config::parse(&text(same)).unwrap());
        let base = |i: usize| &b.services[i].base;
        assert!(Arc::ptr_eq(base(0), base(1)) && Arc::ptr_eq(base(0), base(2)));
        let (b, _) = build(&config::parse(&text(weighted)).unwrap());
        let base = |i: usize| &b.services[i].base;
        assert!(Arc::ptr_eq(base(0), base(1)) && !Arc::ptr_eq(base(0), base(2)));
        assert_ne!(base(0)[..], base(2)[..]);
        let alone = maglev::populate(
            &[
                Member {
                    key: b"10.0.2.2:80",
                    weight: 2,
                },
                Member {
                    key: b"10.0.2.3:80",
                    weight: 1,
                },
            ],
            1009,
        );
        assert_eq!(base(2)[..], alone[..]);
    }

    /// A change computes again only the rings whose inputs changed: the others keep the very
    /// ring they had (moved, not copied or recomputed), and their slots are not written.
    #[test]
    fn a_change_of_one_service_leaves_the_other_rings_alone() {
        let text = |extra: &str| {
            let mut t = "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n".to_owned();
            for i in 0..3 {
                t += &format!(
                    "[[service]]\nname = \"s{i}\"\nvip = \"10.100.0.{}:80\"\nbackends = \
                     [{{ address = \"10.0.{i}.2:80\" }}, {{ address = \"10.0.{i}.3:80\" }}{}]\n",
                    i + 1,
                    if i == 0 { extra } else { "" }
                );
            }
            config::parse(&t).unwrap()
        };
        let (mut b, mut maps) = build(&text(""));
        let ring_at = |b: &Balancer, i: usize| b.services[i].ring.as_ptr();
        let before: Vec<_> = (0..3).map(|i| ring_at(&b, i)).collect();
        maps.ring_writes.clear();
        b.apply(
            &text(", { address = \"10.0.0.4:80\" }"),
            snat,
            |_, _, _| true,
            &mut maps,
        )
        .unwrap();
        assert_ne!(
            ring_at(&b, 0),
            before[0],
            "the changed service's ring is new"
        );
        assert_eq!(ring_at(&b, 1), before[1]);
        assert_eq!(ring_at(&b, 2), before[2]);
        let written: std::collections::BTreeSet<u32> = maps.ring_writes.iter().copied().collect();
        assert_eq!(written, [b.services[0].info.id].into());
        // A backend of another service down: that ring moves, and only that one.
        let before: Vec<_> = (0..3).map(|i| ring_at(&b, i)).collect();
        b.set_up(2, 0, false, &mut maps).unwrap();
        assert_eq!((ring_at(&b, 0), ring_at(&b, 1)), (before[0], before[1]));
    }

    /// A reload looks each backend up in the previous state by hash: applying a config again
    /// costs in proportion to its backends, not to their square (a search of the service per
    /// backend took 4 s for 20,000 backends in one service, the daemon's state locked). The
    /// backends have weight 0, which keeps the Maglev population (the same at any size here)
    /// out of the figure; each size's time is the least of 5 applies.
    #[test]
    fn applying_again_grows_linearly_with_the_backends() {
        let time = |n: usize| {
            let list: Vec<String> = (0..n)
                .map(|i| {
                    format!(
                        "{{ address = \"10.1.{}.{}:8080\", weight = 0 }}",
                        i / 250,
                        1 + i % 250
                    )
                })
                .collect();
            let c = config::parse(&format!(
                "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\nmax_backends = {n}\n\
                 [[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{}]\n",
                list.join(", ")
            ))
            .unwrap();
            let (mut b, mut maps) = build(&c);
            (0..5)
                .map(|_| {
                    let start = std::time::Instant::now();
                    b.apply(&c, snat, |_, _, _| true, &mut maps).unwrap();
                    start.elapsed()
                })
                .min()
                .unwrap()
        };
        let (small, large) = (time(1_000), time(8_000));
        let ratio = large.as_secs_f64() / small.as_secs_f64();
        // 8× the backends: about 8× the time if linear, 64× if quadratic (a search per
        // backend: 33–38× in a debug build here, with the fixed costs; now 8.3–8.4×).
        assert!(
            ratio < 20.0,
            "8,000 backends took {large:?} to apply again, 1,000 took {small:?}: {ratio:.1}×"
        );
    }

    /// A reload keeps the Maglev ring of a service whose members did not change instead of
    /// populating it again (milliseconds a service, under the daemon's lock: 500 unchanged
    /// services took 2.5 s). Applying the same config again must cost under a third of applying
    /// one that changes a weight in every service, which does populate them all (debug build
    /// here: 39 ms against 255; populating them again, 169 against 244).
    #[test]
    fn applying_again_keeps_the_rings_of_unchanged_services() {
        let config = |first_weight: u32| {
            let services: Vec<String> = (0..10)
                .map(|i| {
                    format!(
                        "[[service]]\nname = \"s{i}\"\nvip = \"10.100.0.{}:80\"\nbackends = [\
                         {{ address = \"10.0.2.2:8080\", weight = {first_weight} }}, \
                         {{ address = \"10.0.2.3:8080\" }}, {{ address = \"10.0.2.4:8080\" }}]\n",
                        i + 1
                    )
                })
                .collect();
            config::parse(&format!(
                "[lb]\ninterfaces = [\"eth1\"]\n{}",
                services.concat()
            ))
            .unwrap()
        };
        let (same, changed) = (config(1), config(2));
        let (mut b, mut maps) = build(&same);
        let mut apply = |c: &Config| {
            let start = std::time::Instant::now();
            b.apply(c, snat, |_, _, _| true, &mut maps).unwrap();
            start.elapsed()
        };
        let (mut unchanged, mut repopulated) = (std::time::Duration::MAX, std::time::Duration::MAX);
        for _ in 0..3 {
            unchanged = unchanged.min(apply(&same));
            repopulated = repopulated.min(apply(&changed));
            apply(&same);
        }
        assert!(
            unchanged * 3 < repopulated,
            "applying the same config again took {unchanged:?}, one changing every service \
             {repopulated:?}"
        );
        // Kept, the rings are still right: the first backend's share follows its weight.
        b.apply(&changed, snat, |_, _, _| true, &mut maps).unwrap();
        let doubled = share(&maps, 0);
        b.apply(&same, snat, |_, _, _| true, &mut maps).unwrap();
        assert!(
            share(&maps, 0) < doubled,
            "the ring follows the weight back"
        );
    }

    fn snat(_: usize, backend: SocketAddr) -> anyhow::Result<IpAddr> {
        Ok(match backend {
            SocketAddr::V4(_) => Ipv4Addr::new(10, 0, 2, 1).into(),
            SocketAddr::V6(_) => "2001:db8:2::1".parse::<Ipv6Addr>()?.into(),
        })
    }

    #[test]
    fn backends_are_found_by_id_after_a_reload_moves_them() {
        let c1 = two_services(&["10.0.2.2:80", "10.0.2.3:80", "10.0.2.4:80"], "");
        let (mut b, mut maps) = build(&c1);
        let ids: Vec<u32> = (0..3).map(|i| b.backend_id(0, i).unwrap()).collect();
        let other = b.backend_id(1, 0).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(b.backend_by_id(id), Some((0, i)));
        }
        assert_eq!(b.backend_by_id(other), Some((1, 0)));
        // The first backend goes: the others move up a place and keep their ids.
        let c2 = two_services(&["10.0.2.3:80", "10.0.2.4:80"], "");
        b.apply(&c2, snat, |_, _, _| true, &mut maps).unwrap();
        assert_eq!(b.backend_by_id(ids[0]), None);
        assert_eq!(b.backend_by_id(ids[1]), Some((0, 0)));
        assert_eq!(b.backend_by_id(ids[2]), Some((0, 1)));
        assert_eq!(b.backend_by_id(other), Some((1, 0)));
    }

    #[test]
    fn reload_keeps_ids_health_and_admin_and_writes_only_changes() {
        let c1 = two_services(&["10.0.2.2:80", "10.0.2.3:80", "10.0.2.4:80"], "");
        let (mut b, mut maps) = build(&c1);
        b.set_up(0, 0, false, &mut maps).unwrap();
        b.set_drained(0, 1, true, &mut maps).unwrap();
        let ring_b = b.ring(1).to_vec();
        // Same config: nothing to write.
        let writes = maps.slot_writes;
        let before = maps.clone();
        let changes = b.apply(&c1, snat, |_, _, _| true, &mut maps).unwrap();
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(maps, before);
        // .3 leaves, .5 arrives: the others keep id, health and admin.
        let c2 = two_services(&["10.0.2.2:80", "10.0.2.4:80", "10.0.2.5:80"], "");
        let changes = b.apply(&c2, snat, |_, _, _| false, &mut maps).unwrap();
        assert_eq!(
            changes.backends_removed,
            [("a".into(), "10.0.2.3:80".parse().unwrap())]
        );
        assert_eq!(
            changes.backends_added,
            [("a".into(), "10.0.2.5:80".parse().unwrap())]
        );
        assert_eq!(b.backend_id(0, 0), Some(0));
        assert_eq!(b.backend_id(0, 1), Some(2));
        assert_eq!(b.is_up(0, 0), Some(false), "health kept");
        assert_eq!(
            b.is_up(0, 2),
            Some(false),
            "a new backend takes the given verdict"
        );
        assert_eq!(b.backend_id(1, 0), Some(3), "the other service untouched");
        assert_eq!(b.ring(1), &ring_b[..]);
        let new_id = b.backend_id(0, 2).unwrap();
        assert_eq!(
            new_id, 4,
            "the removed backend's id 1 is retired, not reused"
        );
        assert_eq!(
            maps.backends[&1].flags() & backend_flags::DRAINED,
            backend_flags::DRAINED,
            "removed: drained, its flows continue"
        );
        // Only .4 takes new flows now (.2 down, .5 down).
        assert!(maps.rings[&0].values().all(|&id| id == 2));
        assert_eq!(maps.slot_writes, writes, "the ring had only .4 before too");
        // Admin settings survive a reload that keeps the backend.
        let c3 = two_services(&["10.0.2.2:80", "10.0.2.3:80"], "");
        b.apply(&c3, snat, |_, _, _| true, &mut maps).unwrap();
        assert_eq!(b.admin(0, 1), Some(Admin::Enabled), ".3 is new again");
        assert_ne!(b.backend_id(0, 1), Some(1), "its old id is still retired");
    }

    #[test]
    fn reload_adds_and_removes_services_and_addresses() {
        let c1 = two_services(&["10.0.2.2:80"], "");
        let (mut b, mut maps) = build(&c1);
        let c2 = config::parse(
            "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\nmax_services = 3\nmax_backends = 8\n\
             [[service]]\nname = \"b\"\nvip = \"10.100.0.2:80\"\nbackends = [{ address = \"10.0.2.9:80\" }]\n\
             [[service]]\nname = \"c\"\nvip = \"10.100.0.3:53\"\nprotocol = \"udp\"\nbackends = [{ address = \"10.0.2.9:53\" }]\n",
        )
        .unwrap();
        let changes = b.apply(&c2, snat, |_, _, _| true, &mut maps).unwrap();
        assert_eq!(changes.services_removed, ["a"]);
        assert_eq!(changes.services_added, ["c"]);
        assert!(
            !maps.addrs().contains_key(&Ipv4Addr::new(10, 100, 0, 1)),
            "old VIP gone"
        );
        assert_eq!(
            maps.addrs()[&Ipv4Addr::new(10, 100, 0, 3)],
            addr_flags::VIP | addr_flags::PING
        );
        assert_eq!(maps.services.len(), 2);
        let c =
            maps.services[&AnyServiceKey::V4(lb_common::ServiceKey::new([10, 100, 0, 3], 53, 17))];
        assert_eq!(c.id, 0, "c reuses a's service slot");
        assert_eq!(b.service_index("b"), Some(0));
        assert!(
            maps.rings[&0]
                .values()
                .all(|&id| Some(id) == b.backend_id(1, 0)),
            "the reused slot's ring is c's, whole"
        );
    }

    #[test]
    fn a_config_that_does_not_fit_changes_nothing() {
        let c1 = two_services(&["10.0.2.2:80"], "");
        let (mut b, mut maps) = build(&c1);
        let before = maps.clone();
        // 7 new backends + b's + a's removed one (retired) = 9 ids > 8.
        let many: Vec<String> = (2..9).map(|i| format!("10.0.3.{i}:80")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let err = b
            .apply(&two_services(&refs, ""), snat, |_, _, _| true, &mut maps)
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("lb.max_backends = 8"),
            "{err:#}"
        );
        let err = b
            .apply(
                &c1,
                |_, _| anyhow::bail!("no route"),
                |_, _, _| true,
                &mut maps,
            )
            .unwrap_err();
        assert!(format!("{err:#}").contains("no route"), "{err:#}");
        assert_eq!(maps, before);
        assert_eq!(b.backend_count(), 2);
    }

    #[test]
    fn saved_ids_are_adopted() {
        let c1 = two_services(&["10.0.2.2:80", "10.0.2.3:80"], "");
        let (mut b, mut maps) = build(&c1);
        b.set_drained(0, 1, true, &mut maps).unwrap();
        let c2 = two_services(&["10.0.2.3:80"], "");
        b.apply(&c2, snat, |_, _, _| true, &mut maps).unwrap();
        let ids = b.ids();
        // A new daemon with the saved ids and a config in another order. A change refused
        // while it is planned (here: no SNAT address) keeps them for the next one.
        let mut fresh = MemoryMaps::default();
        let mut b2 = Balancer::with_ids(&c2, Some(ids.clone()));
        b2.apply(
            &c2,
            |_, _| anyhow::bail!("no route"),
            |_, _, _| true,
            &mut fresh,
        )
        .unwrap_err();
        b2.apply(&c2, snat, |_, _, id| id.is_none(), &mut fresh)
            .unwrap();
        assert_eq!(b2.ids(), ids);
        assert_eq!(b2.admin(0, 0), Some(Admin::Drained));
        assert_eq!(
            b2.is_up(0, 0),
            Some(false),
            "adopted verdict from the closure"
        );
        assert_eq!(b2.backend_count(), b.backend_count());
    }

    #[test]
    fn direct_server_return_marks_the_backends_and_survives_verdicts_and_reloads() {
        let list = "{ address = \"10.0.2.2:80\" }, { address = \"10.0.2.3:80\" }";
        let c = |mode: &str| {
            config::parse(&format!(
                "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n[[service]]\nname = \"web\"\n\
                 vip = \"10.100.0.1:80\"\nforwarding = \"{mode}\"\nbackends = [{list}]\n"
            ))
            .unwrap()
        };
        let (mut b, mut maps) = build(&c("ipip"));
        for id in 0..2 {
            assert_eq!(
                maps.backends[&id].flags(),
                backend_flags::UP | backend_flags::ENCAP_IPIP
            );
        }
        // The outer source is an address of lb's, as a SNAT address is.
        assert_eq!(maps.addrs()[&Ipv4Addr::new(10, 0, 2, 1)], addr_flags::SNAT);
        b.set_up(0, 1, false, &mut maps).unwrap();
        assert_eq!(maps.backends[&1].flags(), backend_flags::ENCAP_IPIP);
        b.set_drained(0, 0, true, &mut maps).unwrap();
        assert_eq!(
            maps.backends[&0].flags(),
            backend_flags::UP | backend_flags::DRAINED | backend_flags::ENCAP_IPIP
        );
        let changes = b.apply(&c("gue"), snat, |_, _, _| true, &mut maps).unwrap();
        assert_eq!(changes.services_changed, ["web"]);
        assert_eq!(
            maps.backends[&1].flags() & backend_flags::ENCAP,
            backend_flags::ENCAP_GUE
        );
        let changes = b.apply(&c("nat"), snat, |_, _, _| true, &mut maps).unwrap();
        assert_eq!(changes.services_changed, ["web"]);
        assert_eq!(maps.backends[&1].flags() & backend_flags::ENCAP, 0);
    }

    #[test]
    fn tunnel_slots_follow_the_checks_through_the_tunnel() {
        let c = |through: bool, backends: &str| {
            config::parse(&format!(
                "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n[[service]]\nname = \"web\"\n\
                 vip = \"10.100.0.1:80\"\nforwarding = \"gue\"\nbackends = [{backends}]\n\
                 [service.check]\nkind = \"tcp\"\nthrough_tunnel = {through}\n"
            ))
            .unwrap()
        };
        let two = "{ address = \"10.0.2.2:80\" }, { address = \"10.0.2.3:80\" }";
        let entry = |backend: [u8; 4]| {
            AnyTunnel::new(
                Ipv4Addr::from(backend).into(),
                Ipv4Addr::new(10, 100, 0, 1).into(),
                backend_flags::ENCAP_GUE,
            )
            .unwrap()
        };
        let (mut b, mut maps) = build(&c(true, two));
        assert_eq!(
            maps.tunnels,
            BTreeMap::from([(0, entry([10, 0, 2, 2])), (1, entry([10, 0, 2, 3]))])
        );
        assert_eq!(b.tunnels().len(), 2);
        // A backend leaves: its slot is cleared; the other keeps its own.
        let one = "{ address = \"10.0.2.3:80\" }";
        b.apply(&c(true, one), snat, |_, _, _| true, &mut maps)
            .unwrap();
        assert_eq!(maps.tunnels[&0], entry([10, 0, 2, 2]).cleared());
        assert_eq!(maps.tunnels[&1], entry([10, 0, 2, 3]));
        // The check no longer goes through the tunnel: every slot is free.
        b.apply(&c(false, one), snat, |_, _, _| true, &mut maps)
            .unwrap();
        assert!(b.tunnels().is_empty());
        assert_eq!(maps.tunnels[&1], entry([10, 0, 2, 3]).cleared());
    }

    #[test]
    fn ejection_and_health_both_gate_new_flows() {
        let (mut b, mut maps) = build(&config("", 2));
        assert!(b.write_ejected_flag(0, 1, true, &mut maps).unwrap());
        b.sync_service(0, &mut maps).unwrap();
        assert_eq!(maps.backends[&1].flags() & backend_flags::UP, 0);
        assert_eq!(share(&maps, 1), 0);
        assert_eq!(b.backend_by_id(1), Some((0, 1)));
        // Healthy again by probes: still out while ejected.
        b.set_up(0, 1, true, &mut maps).unwrap();
        assert_eq!(share(&maps, 1), 0);
        b.write_ejected_flag(0, 1, false, &mut maps).unwrap();
        b.sync_service(0, &mut maps).unwrap();
        assert!(share(&maps, 1) > 400);
    }

    #[test]
    fn an_ipv6_service_has_its_own_entries_and_addresses() {
        let c = config::parse(
            "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n\
             [[service]]\nname = \"web6\"\nvip = \"[2001:db8:100::1]:80\"\n\
             backends = [{ address = \"[2001:db8:2::2]:8080\" }, { address = \"[2001:db8:2::3]:8080\" }]\n\
             [[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:8080\" }]\n",
        )
        .unwrap();
        let (b, maps) = build(&c);
        let vip6: Ipv6Addr = "2001:db8:100::1".parse().unwrap();
        let snat6: Ipv6Addr = "2001:db8:2::1".parse().unwrap();
        assert_eq!(
            maps.addrs6(),
            [
                (vip6, addr_flags::VIP | addr_flags::PING),
                (snat6, addr_flags::SNAT)
            ]
            .into_iter()
            .collect()
        );
        assert_eq!(
            maps.addrs().len(),
            2,
            "the IPv4 service's VIP and SNAT address"
        );
        let key6 = AnyServiceKey::new("[2001:db8:100::1]:80".parse().unwrap(), 6);
        assert!(matches!(key6, AnyServiceKey::V6(_)));
        assert_eq!(maps.services[&key6].id, 0);
        for bid in 0..2 {
            let id = b.backend_id(0, bid).unwrap();
            assert!(matches!(maps.backends[&id], AnyBackend::V6(_)), "{id}");
        }
        // One id space: the IPv4 backend has the next id, and every ring slot is filled.
        assert_eq!(b.backend_id(1, 0), Some(2));
        assert_eq!(maps.rings[&0].len(), 1009);
        assert!(maps.rings[&0].values().all(|&id| id < 2));
    }
}
