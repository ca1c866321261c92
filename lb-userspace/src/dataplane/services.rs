//! Config services → service map entries (pure), and writing them so the maps hold exactly that.

use std::collections::HashMap;

use anyhow::Context as _;
use aya::{Ebpf, Pod, maps::HashMap as BpfHashMap};
use lb_common::{ServiceInfo, ServiceKey, map_name};

use crate::config::Service;

/// What the service maps must contain.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ServiceEntries {
    pub services: Vec<(ServiceKey, ServiceInfo)>,
    /// VIP address (network order) → number of services on it.
    pub vip_addrs: HashMap<u32, u32>,
}

pub fn service_entries(services: &[Service]) -> ServiceEntries {
    let mut out = ServiceEntries::default();
    for (id, s) in services.iter().enumerate() {
        let key = ServiceKey::new(s.vip.ip().octets(), s.vip.port(), s.protocol.number());
        out.services.push((key, ServiceInfo { id: id as u32 }));
        *out.vip_addrs.entry(key.addr).or_default() += 1;
    }
    out
}

/// Makes both service maps hold exactly `want`.
pub fn sync(ebpf: &mut Ebpf, want: &ServiceEntries) -> anyhow::Result<()> {
    sync_map::<ServiceKey, ServiceInfo>(ebpf, map_name::SERVICES, want.services.iter().copied())?;
    sync_map::<u32, u32>(
        ebpf,
        map_name::VIP_ADDRS,
        want.vip_addrs.iter().map(|(k, v)| (*k, *v)),
    )
}

/// Inserts every wanted entry, then removes the ones no longer wanted, so a packet never sees a
/// service missing that exists in both the old and the new set.
fn sync_map<K: Pod + PartialEq, V: Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    want: impl Iterator<Item = (K, V)>,
) -> anyhow::Result<()> {
    let mut map: BpfHashMap<_, K, V> = BpfHashMap::try_from(
        ebpf.map_mut(name)
            .with_context(|| format!("map {name} missing"))?,
    )?;
    let want: Vec<(K, V)> = want.collect();
    for (k, v) in &want {
        map.insert(k, v, 0)
            .with_context(|| format!("writing map {name}"))?;
    }
    let stale: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !want.iter().any(|(w, _)| w == k))
        .collect();
    for k in stale {
        map.remove(&k)
            .with_context(|| format!("pruning map {name}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Backend, Protocol};

    fn service(name: &str, vip: &str, protocol: Protocol) -> Service {
        Service {
            name: name.into(),
            vip: vip.parse().unwrap(),
            protocol,
            backends: vec![Backend {
                address: "10.0.2.2:80".parse().unwrap(),
                weight: 1,
            }],
        }
    }

    #[test]
    fn entries_use_positions_as_ids_and_count_vip_addresses() {
        let e = service_entries(&[
            service("a", "10.100.0.1:80", Protocol::Tcp),
            service("b", "10.100.0.1:53", Protocol::Udp),
            service("c", "10.100.0.2:80", Protocol::Tcp),
        ]);
        assert_eq!(e.services.len(), 3);
        assert_eq!(e.services[1].0, ServiceKey::new([10, 100, 0, 1], 53, 17));
        assert_eq!(e.services[2].1.id, 2);
        assert_eq!(e.vip_addrs[&u32::from_ne_bytes([10, 100, 0, 1])], 2);
        assert_eq!(e.vip_addrs[&u32::from_ne_bytes([10, 100, 0, 2])], 1);
    }
}
