//! The desired datapath state and how it changes: services, backends, their flags and Maglev
//! rings, written through a [`MapWriter`]. Pure: the real maps and an in-memory fake implement
//! the writer, so every rule here is tested without a kernel.
//!
//! A health or drain change writes the backend's flag first (the datapath skips an unavailable
//! backend for new flows at once), then only the ring slots that changed.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddrV4},
};

use anyhow::{Context as _, bail};
use lb_common::{
    BackendInfo, NO_BACKEND, ServiceInfo, ServiceKey, addr_flags, backend_flags, service_flags,
};

use crate::{
    config::{AllUnhealthy, Config, ExistingFlows},
    maglev::{self, Member},
};

/// Where the desired state goes: the BPF maps, or memory in tests.
pub trait MapWriter {
    fn set_addr(&mut self, addr: Ipv4Addr, flags: u32) -> anyhow::Result<()>;
    fn set_service(&mut self, key: ServiceKey, info: ServiceInfo) -> anyhow::Result<()>;
    fn set_backend(&mut self, id: u32, info: BackendInfo) -> anyhow::Result<()>;
    /// Writes `(slot, backend id)` pairs of one service's ring.
    fn set_ring_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> anyhow::Result<()>;
    /// Removes an address (no longer a VIP nor a SNAT address): its packets go to the kernel.
    fn remove_addr(&mut self, addr: Ipv4Addr) -> anyhow::Result<()>;
    /// Removes a service: packets to it are no longer balanced.
    fn remove_service(&mut self, key: ServiceKey) -> anyhow::Result<()>;
}

pub struct Balancer {
    ring_size: u32,
    services: Vec<ServiceState>,
}

struct ServiceState {
    name: String,
    key: ServiceKey,
    info: ServiceInfo,
    keep_flows: bool,
    on_all_unhealthy: AllUnhealthy,
    backends: Vec<BackendState>,
    /// Indices into `backends` of the ring members (weight > 0), and their plain Maglev ring.
    members: Vec<usize>,
    base: Vec<u32>,
    /// Backend ids, one per slot, as written to the map.
    ring: Vec<u32>,
}

struct BackendState {
    id: u32,
    address: SocketAddrV4,
    key: Vec<u8>,
    weight: u32,
    info: BackendInfo,
}

impl BackendState {
    fn up(&self) -> bool {
        self.info.flags & backend_flags::UP != 0
    }

    fn takes_new_flows(&self) -> bool {
        self.info.flags & (backend_flags::UP | backend_flags::DRAINED) == backend_flags::UP
    }
}

impl Balancer {
    /// Builds the state for `config` (every backend up) and writes all of it. `snat(service,
    /// backend)` gives each backend's SNAT address.
    pub fn new(
        config: &Config,
        snat: impl Fn(usize, SocketAddrV4) -> anyhow::Result<Ipv4Addr>,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<Self> {
        let ring_size = config.lb.ring_size;
        let mut addrs: HashMap<Ipv4Addr, u32> = HashMap::new();
        let mut services = Vec::new();
        let mut next_backend = 0u32;
        for (sid, s) in config.services.iter().enumerate() {
            *addrs.entry(*s.vip.ip()).or_default() |= addr_flags::VIP;
            let mut backends = Vec::new();
            for b in &s.backends {
                let snat_addr = snat(sid, b.address)
                    .with_context(|| format!("SNAT address for {} of {}", b.address, s.name))?;
                *addrs.entry(snat_addr).or_default() |= addr_flags::SNAT;
                let flags = backend_flags::UP
                    | if b.weight == 0 {
                        backend_flags::DRAINED
                    } else {
                        0
                    };
                backends.push(BackendState {
                    id: next_backend,
                    address: b.address,
                    key: b.address.to_string().into_bytes(),
                    weight: b.weight,
                    info: BackendInfo {
                        addr: u32::from_ne_bytes(b.address.ip().octets()),
                        snat_addr: u32::from_ne_bytes(snat_addr.octets()),
                        port: b.address.port().to_be(),
                        _pad: 0,
                        flags,
                    },
                });
                next_backend += 1;
            }
            let members: Vec<usize> = (0..backends.len())
                .filter(|&i| backends[i].weight > 0)
                .collect();
            let member_list: Vec<Member> = members
                .iter()
                .map(|&i| Member {
                    key: &backends[i].key,
                    weight: backends[i].weight,
                })
                .collect();
            let base = if member_list.is_empty() {
                Vec::new()
            } else {
                maglev::populate(&member_list, ring_size)
            };
            services.push(ServiceState {
                name: s.name.clone(),
                key: ServiceKey::new(s.vip.ip().octets(), s.vip.port(), s.protocol.number()),
                info: ServiceInfo {
                    id: sid as u32,
                    flags: 0,
                },
                keep_flows: s.existing_flows == ExistingFlows::Keep,
                on_all_unhealthy: s.on_all_unhealthy,
                backends,
                members,
                base,
                ring: Vec::new(),
            });
        }
        let mut balancer = Self {
            ring_size,
            services,
        };
        let mut addrs: Vec<_> = addrs.into_iter().collect();
        addrs.sort();
        for (addr, flags) in addrs {
            writer.set_addr(addr, flags)?;
        }
        for sid in 0..balancer.services.len() {
            for b in &balancer.services[sid].backends {
                writer.set_backend(b.id, b.info)?;
            }
            balancer.sync_ring(sid, writer)?;
        }
        Ok(balancer)
    }

    /// Marks a backend up or down (health). Returns whether anything changed.
    pub fn set_up(
        &mut self,
        service: usize,
        backend: usize,
        up: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        self.set_flag(service, backend, backend_flags::UP, up, writer)
    }

    /// Drains a backend (no new flows, existing ones continue) or undrains it.
    pub fn set_drained(
        &mut self,
        service: usize,
        backend: usize,
        drained: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        self.set_flag(service, backend, backend_flags::DRAINED, drained, writer)
    }

    /// The first half of [`Balancer::set_up`]: only the flag, which the datapath honours at
    /// once. [`Balancer::sync_service`] must follow to rebuild the ring.
    pub fn write_up_flag(
        &mut self,
        service: usize,
        backend: usize,
        up: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        self.write_flag(service, backend, backend_flags::UP, up, writer)
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

    fn set_flag(
        &mut self,
        service: usize,
        backend: usize,
        flag: u32,
        on: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        let changed = self.write_flag(service, backend, flag, on, writer)?;
        if changed {
            self.sync_ring(service, writer)?;
        }
        Ok(changed)
    }

    fn write_flag(
        &mut self,
        service: usize,
        backend: usize,
        flag: u32,
        on: bool,
        writer: &mut dyn MapWriter,
    ) -> anyhow::Result<bool> {
        let Some(b) = self
            .services
            .get_mut(service)
            .and_then(|s| s.backends.get_mut(backend))
        else {
            bail!("no backend {backend} in service {service}");
        };
        let flags = if on {
            b.info.flags | flag
        } else {
            b.info.flags & !flag
        };
        if flags == b.info.flags {
            return Ok(false);
        }
        b.info.flags = flags;
        writer.set_backend(b.id, b.info)?;
        Ok(true)
    }

    /// Recomputes a service's ring and flags and writes what changed.
    fn sync_ring(&mut self, sid: usize, writer: &mut dyn MapWriter) -> anyhow::Result<()> {
        let ring_size = self.ring_size;
        let s = &mut self.services[sid];
        let members: Vec<Member> = s
            .members
            .iter()
            .map(|&i| Member {
                key: &s.backends[i].key,
                weight: s.backends[i].weight,
            })
            .collect();
        let available: Vec<bool> = s
            .members
            .iter()
            .map(|&i| s.backends[i].takes_new_flows())
            .collect();
        let overlay = if members.is_empty() {
            None
        } else {
            maglev::overlay_with_base(&s.base, &members, &available, ring_size)
        };
        // (ring owners as member indices, extra service flag)
        let (owners, mode) = match (overlay, s.on_all_unhealthy) {
            (Some(ring), _) => (Some(ring), 0),
            (None, _) if members.is_empty() => (None, service_flags::DROP),
            // Nobody available: never cut traffic unless told to.
            (None, AllUnhealthy::UseAll) => (Some(s.base.clone()), service_flags::USE_UNAVAILABLE),
            (None, AllUnhealthy::First) => (
                Some(vec![0; ring_size as usize]),
                service_flags::USE_UNAVAILABLE,
            ),
            (None, AllUnhealthy::Drop) => (None, service_flags::DROP),
        };
        let ring: Vec<u32> = match owners {
            Some(owners) => owners
                .iter()
                .map(|&m| s.backends[s.members[m as usize]].id)
                .collect(),
            None => vec![NO_BACKEND; ring_size as usize],
        };
        let changed = maglev::changed_slots(&s.ring, &ring);
        if !changed.is_empty() {
            writer.set_ring_slots(s.info.id, &changed)?;
        }
        s.ring = ring;
        let flags = if s.keep_flows {
            service_flags::KEEP_FLOWS
        } else {
            0
        } | mode;
        if flags != s.info.flags || changed.len() == ring_size as usize {
            s.info.flags = flags;
            writer.set_service(s.key, s.info)?;
        }
        Ok(())
    }

    /// Position of a service by name.
    pub fn service_index(&self, name: &str) -> Option<usize> {
        self.services.iter().position(|s| s.name == name)
    }

    /// Position of a backend of a service by address.
    pub fn backend_index(&self, service: usize, address: SocketAddrV4) -> Option<usize> {
        self.services
            .get(service)?
            .backends
            .iter()
            .position(|b| b.address == address)
    }

    /// Backend id (index of the per-backend maps) of a service's backend.
    pub fn backend_id(&self, service: usize, backend: usize) -> Option<u32> {
        Some(self.services.get(service)?.backends.get(backend)?.id)
    }

    /// Whether a backend is up (health), as last set.
    pub fn is_up(&self, service: usize, backend: usize) -> Option<bool> {
        Some(self.services.get(service)?.backends.get(backend)?.up())
    }

    /// A service's ring as written (backend ids).
    pub fn ring(&self, service: usize) -> &[u32] {
        &self.services[service].ring
    }

    /// Every backend address, for neighbour upkeep.
    pub fn backend_addresses(&self) -> Vec<SocketAddrV4> {
        self.services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.address))
            .collect()
    }

    pub fn backend_count(&self) -> u32 {
        self.services.iter().map(|s| s.backends.len() as u32).sum()
    }
}

/// An in-memory [`MapWriter`] for tests.
#[derive(Debug, Default)]
pub struct MemoryMaps {
    pub addrs: HashMap<Ipv4Addr, u32>,
    pub services: HashMap<ServiceKey, ServiceInfo>,
    pub backends: HashMap<u32, BackendInfo>,
    pub rings: HashMap<u32, HashMap<u32, u32>>,
    /// Ring slot writes so far.
    pub slot_writes: usize,
}

impl MapWriter for MemoryMaps {
    fn set_addr(&mut self, addr: Ipv4Addr, flags: u32) -> anyhow::Result<()> {
        self.addrs.insert(addr, flags);
        Ok(())
    }

    fn set_service(&mut self, key: ServiceKey, info: ServiceInfo) -> anyhow::Result<()> {
        self.services.insert(key, info);
        Ok(())
    }

    fn set_backend(&mut self, id: u32, info: BackendInfo) -> anyhow::Result<()> {
        self.backends.insert(id, info);
        Ok(())
    }

    fn set_ring_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> anyhow::Result<()> {
        let ring = self.rings.entry(service_id).or_default();
        for &(slot, id) in slots {
            ring.insert(slot, id);
        }
        self.slot_writes += slots.len();
        Ok(())
    }

    fn remove_addr(&mut self, addr: Ipv4Addr) -> anyhow::Result<()> {
        self.addrs.remove(&addr);
        Ok(())
    }

    fn remove_service(&mut self, key: ServiceKey) -> anyhow::Result<()> {
        self.services.remove(&key);
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
        let b = Balancer::new(c, |_, _| Ok(Ipv4Addr::new(10, 0, 2, 1)), &mut maps).unwrap();
        (b, maps)
    }

    fn share(maps: &MemoryMaps, id: u32) -> usize {
        maps.rings[&0].values().filter(|&&b| b == id).count()
    }

    #[test]
    fn initial_state_is_written_whole() {
        let (b, maps) = build(&config("", 3));
        assert_eq!(maps.addrs[&Ipv4Addr::new(10, 100, 0, 1)], addr_flags::VIP);
        assert_eq!(maps.addrs[&Ipv4Addr::new(10, 0, 2, 1)], addr_flags::SNAT);
        assert_eq!(maps.rings[&0].len(), 1009);
        assert_eq!(maps.backends.len(), 3);
        assert!(maps.backends.values().all(|b| b.flags == backend_flags::UP));
        assert_eq!(maps.backends[&1].port, 8080u16.to_be());
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
        assert_eq!(maps.backends[&1].flags, 0, "flag written");
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

    #[test]
    fn the_flag_can_be_written_before_the_ring() {
        let (mut b, mut maps) = build(&config("", 3));
        let slots = maps.slot_writes;
        assert!(b.write_up_flag(0, 2, false, &mut maps).unwrap());
        assert_eq!(maps.backends[&2].flags, 0, "flag written");
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
            maps.backends[&2].flags,
            backend_flags::UP | backend_flags::DRAINED
        );
        let c = config::parse(
            "[lb]\ninterfaces = [\"eth1\"]\nring_size = 1009\n[[service]]\nname = \"w\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:80\", weight = 0 }, { address = \"10.0.2.3:80\" }]\n",
        )
        .unwrap();
        let (_, maps) = build(&c);
        assert_eq!(share(&maps, 0), 0, "weight 0 is drained from the start");
        assert_eq!(
            maps.backends[&0].flags,
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
}
