//! Health probes through the tunnel (`check.through_tunnel`): the paths (backend, VIP,
//! encapsulation) a config probes that way, and the slot of the datapath's tunnel table each
//! has, whose mark the probes' sockets carry (see lb-common's `tunnel` module). Pure: planned
//! with the rest of the desired state by the balancer and written through its `MapWriter`. A
//! path keeps its slot while the config has it, so a probe that uses it never changes mark.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
};

use anyhow::bail;
use lb_common::{TUNNEL_SLOTS, tunnel_mark};

use crate::{
    config::{Config, Forwarding, Lb, Service},
    entries::AnyTunnel,
};

/// How a service's probes go through its tunnel: to its VIP, in its encapsulation, from the
/// source its encapsulated traffic has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tunnel {
    pub vip: IpAddr,
    pub forwarding: Forwarding,
    /// The service's (or `[lb]`'s) SNAT address, if configured: the outer source of its traffic,
    /// which lb's address table holds. None: the kernel's choice towards the backend, which is
    /// what the traffic's outer source is then too.
    pub source: Option<IpAddr>,
}

impl Tunnel {
    /// The tunnel of `service`'s probes, when its check goes through it.
    pub fn of(lb: &Lb, service: &Service) -> Option<Self> {
        (service.check.through_tunnel && service.forwarding.is_dsr()).then(|| Self {
            vip: service.vip.ip(),
            forwarding: service.forwarding,
            source: service
                .snat_address
                .or(lb.snat_address.for_family_of(service.vip.ip())),
        })
    }

    /// The path of its probes to `backend`.
    pub fn path(&self, backend: IpAddr) -> TunnelPath {
        TunnelPath {
            backend,
            vip: self.vip,
            forwarding: self.forwarding,
        }
    }
}

/// What the TC program needs of one tunnel slot: probes marked with it that leave for `backend`
/// go to `vip` there, encapsulated as `forwarding` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TunnelPath {
    pub backend: IpAddr,
    pub vip: IpAddr,
    pub forwarding: Forwarding,
}

impl TunnelPath {
    fn entry(&self) -> anyhow::Result<AnyTunnel> {
        AnyTunnel::new(self.backend, self.vip, self.forwarding.backend_flag())
    }
}

/// The tunnel table as planned: each path's slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tunnels {
    slots: HashMap<TunnelPath, (u32, AnyTunnel)>,
    /// Paths gone from the config and the slot each had: one wanted again gets that slot back
    /// while no other path took it. So a reload rolled back (the checker could not start its
    /// probes) leaves the probes that kept running with the marks they have.
    freed: HashMap<TunnelPath, u32>,
}

/// The tunnel table for a new config, and the slot writes that get the datapath there.
#[derive(Debug)]
pub struct Plan {
    pub next: Tunnels,
    /// In order: freed slots first, then new ones (a slot freed and taken again in one plan is
    /// written twice, ending with its new path).
    pub writes: Vec<(u32, AnyTunnel)>,
}

impl Tunnels {
    /// The paths `config` probes through the tunnel, each once (services sharing a VIP and a
    /// backend share the path).
    pub fn wanted(config: &Config) -> BTreeSet<TunnelPath> {
        config
            .services
            .iter()
            .filter_map(|s| Some((s, Tunnel::of(&config.lb, s)?)))
            .flat_map(|(s, t)| s.backends.iter().map(move |b| t.path(b.address.ip())))
            .collect()
    }

    /// Moves to the paths of `config`: kept paths keep their slot, new ones take the slot they
    /// had last if it is free, else the lowest free one; gone ones free theirs. Fails, changing
    /// nothing, beyond [`TUNNEL_SLOTS`].
    pub fn plan(&self, config: &Config) -> anyhow::Result<Plan> {
        let wanted = Self::wanted(config);
        if wanted.len() > TUNNEL_SLOTS as usize {
            bail!(
                "{} distinct (backend, VIP, forwarding) paths checked through the tunnel, more \
                 than the {TUNNEL_SLOTS} lb's tunnel table takes",
                wanted.len()
            );
        }
        let mut writes = Vec::new();
        let mut next = Tunnels::default();
        let mut freed = self.freed.clone();
        for (path, &(slot, entry)) in &self.slots {
            if wanted.contains(path) {
                next.slots.insert(*path, (slot, entry));
            } else {
                writes.push((slot, entry.cleared()));
                freed.insert(*path, slot);
            }
        }
        writes.sort_by_key(|&(slot, _)| slot);
        let mut used: BTreeSet<u32> = next.slots.values().map(|&(slot, _)| slot).collect();
        // Paths back in the config whose last slot is free take it; the others the lowest
        // free ones.
        let mut placed = Vec::new();
        let mut rest = Vec::new();
        for path in wanted.into_iter().filter(|p| !next.slots.contains_key(p)) {
            match freed.get(&path) {
                Some(&slot) if used.insert(slot) => placed.push((path, slot)),
                _ => rest.push(path),
            }
        }
        let free: Vec<u32> = (0..TUNNEL_SLOTS)
            .filter(|s| !used.contains(s))
            .take(rest.len())
            .collect();
        placed.extend(rest.into_iter().zip(free));
        placed.sort_by_key(|&(_, slot)| slot);
        for (path, slot) in placed {
            let entry = path.entry()?;
            next.slots.insert(path, (slot, entry));
            writes.push((slot, entry));
        }
        // Remembered while their slot stays free.
        let taken: BTreeSet<u32> = next.slots.values().map(|&(slot, _)| slot).collect();
        freed.retain(|path, slot| !next.slots.contains_key(path) && !taken.contains(slot));
        next.freed = freed;
        Ok(Plan { next, writes })
    }

    /// The socket mark of probes on `path`, if it has a slot.
    pub fn mark(&self, path: &TunnelPath) -> Option<u32> {
        self.slots.get(path).map(|&(slot, _)| tunnel_mark(slot))
    }

    /// Paths with a slot.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use lb_common::{TunnelProbe, backend_flags};

    use super::*;

    fn config(services: &str) -> Config {
        crate::config::parse(&format!("[lb]\ninterfaces = [\"eth1\"]\n{services}")).unwrap()
    }

    fn service(
        name: &str,
        vip: &str,
        forwarding: &str,
        backends: &[&str],
        through: bool,
    ) -> String {
        let list: Vec<String> = backends
            .iter()
            .map(|b| format!("{{ address = \"{b}\" }}"))
            .collect();
        format!(
            "[[service]]\nname = \"{name}\"\nvip = \"{vip}\"\nforwarding = \"{forwarding}\"\n\
             backends = [{}]\n[service.check]\nkind = \"tcp\"\nthrough_tunnel = {through}\n",
            list.join(", ")
        )
    }

    fn v4(backend: [u8; 4], vip: [u8; 4], flags: u32) -> AnyTunnel {
        AnyTunnel::V4(TunnelProbe {
            backend: u32::from_ne_bytes(backend),
            vip: u32::from_ne_bytes(vip),
            flags,
        })
    }

    #[test]
    fn paths_get_slots_and_keep_them() {
        let a = service(
            "a",
            "10.100.0.1:80",
            "ipip",
            &["10.0.2.2:80", "10.0.2.3:80"],
            true,
        );
        // Another port of the same VIP and backends: the same paths.
        let b = service("b", "10.100.0.1:443", "ipip", &["10.0.2.2:443"], true);
        let plain = service("c", "10.100.0.2:80", "gue", &["10.0.2.2:80"], false);
        let c1 = config(&format!("{a}{b}{plain}"));
        let plan = Tunnels::default().plan(&c1).unwrap();
        let ipip = backend_flags::ENCAP_IPIP;
        assert_eq!(
            plan.writes,
            [
                (0, v4([10, 0, 2, 2], [10, 100, 0, 1], ipip)),
                (1, v4([10, 0, 2, 3], [10, 100, 0, 1], ipip)),
            ]
        );
        let t1 = plan.next;
        let path = |b: [u8; 4], vip: [u8; 4], forwarding| TunnelPath {
            backend: IpAddr::from(b),
            vip: IpAddr::from(vip),
            forwarding,
        };
        assert_eq!(
            t1.mark(&path([10, 0, 2, 3], [10, 100, 0, 1], Forwarding::Ipip)),
            Some(0x4c42_0001)
        );
        assert_eq!(
            t1.mark(&path([10, 0, 2, 2], [10, 100, 0, 2], Forwarding::Gue)),
            None,
            "not through the tunnel"
        );
        // The first backend leaves, the plain service's check goes through the tunnel: its
        // path takes the freed slot, the other path keeps its own.
        let a2 = service("a", "10.100.0.1:80", "ipip", &["10.0.2.3:80"], true);
        let gue = service("c", "10.100.0.2:80", "gue", &["10.0.2.2:80"], true);
        let plan = t1.plan(&config(&format!("{a2}{gue}"))).unwrap();
        let gue_flag = backend_flags::ENCAP_GUE;
        assert_eq!(
            plan.writes,
            [
                (0, AnyTunnel::V4(TunnelProbe::default())),
                (0, v4([10, 0, 2, 2], [10, 100, 0, 2], gue_flag)),
            ]
        );
        let t2 = plan.next;
        assert_eq!(t2.len(), 2);
        assert_eq!(
            t2.mark(&path([10, 0, 2, 3], [10, 100, 0, 1], Forwarding::Ipip)),
            Some(0x4c42_0001)
        );
        // The same config again: nothing to write.
        let again = t2.plan(&config(&format!("{a2}{gue}"))).unwrap();
        assert!(again.writes.is_empty());
        assert_eq!(again.next, t2);
    }

    #[test]
    fn a_path_back_in_the_config_gets_its_slot_back_while_it_is_free() {
        let backends = ["10.0.2.2:80", "10.0.2.3:80", "10.0.2.4:80"];
        let c = |which: &[usize], vip: &str| {
            let list: Vec<&str> = which.iter().map(|&i| backends[i]).collect();
            config(&service("a", vip, "ipip", &list, true))
        };
        let path = |b: usize, vip: &str| TunnelPath {
            backend: backends[b].parse::<std::net::SocketAddr>().unwrap().ip(),
            vip: vip.parse::<std::net::SocketAddr>().unwrap().ip(),
            forwarding: Forwarding::Ipip,
        };
        let vip = "10.100.0.1:80";
        let all = Tunnels::default().plan(&c(&[0, 1, 2], vip)).unwrap().next;
        // A reload drops backend 1 and brings another VIP's path, which takes the lowest free
        // slot, backend 1's. Rolled back (the checker failed): that path goes again, freeing
        // the slot, and backend 1's path gets it back, as its probes that kept running expect.
        let reload = c(&[0, 2], vip);
        let mut other = reload.clone();
        other
            .services
            .extend(c(&[1], "10.100.0.9:80").services.into_iter().map(|mut s| {
                s.name = "b".into();
                s
            }));
        let t = all.plan(&other).unwrap().next;
        assert_eq!(t.mark(&path(1, "10.100.0.9:80")), Some(tunnel_mark(1)));
        let back = t.plan(&c(&[0, 1, 2], vip)).unwrap().next;
        for b in 0..3 {
            assert_eq!(
                back.mark(&path(b, vip)),
                all.mark(&path(b, vip)),
                "backend {b}"
            );
        }
        // Dropped and back without anything in between: the same slot, not the lowest free.
        let two = all.plan(&c(&[2], vip)).unwrap().next;
        let one = two.plan(&c(&[1, 2], vip)).unwrap();
        assert_eq!(one.next.mark(&path(1, vip)), Some(tunnel_mark(1)));
        assert_eq!(one.writes.len(), 1);
    }

    #[test]
    fn ipv6_paths_and_sources() {
        let c = crate::config::parse(
            "[lb]\ninterfaces = [\"eth1\"]\nsnat_address = [\"10.0.2.1\", \"2001:db8:2::1\"]\n\
             [[service]]\nname = \"six\"\nvip = \"[2001:db8:100::1]:80\"\nforwarding = \"gue\"\n\
             backends = [{ address = \"[2001:db8:2::2]:80\" }]\n\
             [service.check]\nkind = \"http\"\nport = 8080\nthrough_tunnel = true\n\
             [[service]]\nname = \"own\"\nvip = \"[2001:db8:100::2]:80\"\nforwarding = \"ipip\"\n\
             snat_address = \"2001:db8:2::9\"\nbackends = [{ address = \"[2001:db8:2::2]:80\" }]\n\
             [service.check]\nkind = \"tcp-connect\"\nthrough_tunnel = true\n",
        )
        .unwrap();
        let source = |i: usize| Tunnel::of(&c.lb, &c.services[i]).unwrap().source;
        assert_eq!(source(0), Some("2001:db8:2::1".parse().unwrap()), "[lb]'s");
        assert_eq!(
            source(1),
            Some("2001:db8:2::9".parse().unwrap()),
            "the service's"
        );
        let plan = Tunnels::default().plan(&c).unwrap();
        assert!(matches!(
            plan.writes[..],
            [(0, AnyTunnel::V6(_)), (1, AnyTunnel::V6(_))]
        ));
    }
}
