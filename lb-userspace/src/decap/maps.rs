//! The decapsulator's maps, the same whether they are reached through a loaded object (set-up,
//! tests) or opened from their pins (`--stats` loads no program).

use std::{
    borrow::{Borrow, BorrowMut},
    net::IpAddr,
    path::Path,
};

use anyhow::{Context as _, bail};
use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
};
use lb_common::{Addr6, DecapParams, addr6, addr6_octets, decap_counter, decap_map_name};
use tracing::info;

use super::addrs;

/// Addresses taken out of the maps and put in by a write.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changed {
    pub removed: Vec<IpAddr>,
    pub added: Vec<IpAddr>,
}

/// The maps, each as `T` (`MapData`, or a borrow of a loaded object's).
pub struct Maps<T> {
    params: Array<T, DecapParams>,
    v4: HashMap<T, u32, u32>,
    v6: HashMap<T, Addr6, u32>,
    stats: PerCpuArray<T, u64>,
}

impl<'a> Maps<&'a mut MapData> {
    /// The maps of a loaded object (pinned or not).
    pub fn of(ebpf: &'a mut Ebpf) -> anyhow::Result<Self> {
        let (mut params, mut v4, mut v6, mut stats) = (None, None, None, None);
        for (name, map) in ebpf.maps_mut() {
            match name {
                decap_map_name::PARAMS => params = Some(map),
                decap_map_name::ADDRS => v4 = Some(map),
                decap_map_name::ADDRS6 => v6 = Some(map),
                decap_map_name::STATS => stats = Some(map),
                _ => {}
            }
        }
        let (Some(params), Some(v4), Some(v6), Some(stats)) = (params, v4, v6, stats) else {
            bail!("a map of the decapsulator is missing from its XDP object");
        };
        Ok(Self {
            params: params.try_into()?,
            v4: v4.try_into()?,
            v6: v6.try_into()?,
            stats: stats.try_into()?,
        })
    }
}

impl Maps<MapData> {
    /// The maps pinned in `dir`.
    pub fn pinned(dir: &Path) -> anyhow::Result<Self> {
        let open = |name: &str| -> anyhow::Result<Map> {
            let path = dir.join(name);
            let data = MapData::from_pin(&path)
                .with_context(|| format!("opening the pinned map {}", path.display()))?;
            Map::from_map_data(data).with_context(|| format!("{}", path.display()))
        };
        Ok(Self {
            params: open(decap_map_name::PARAMS)?.try_into()?,
            v4: open(decap_map_name::ADDRS)?.try_into()?,
            v6: open(decap_map_name::ADDRS6)?.try_into()?,
            stats: open(decap_map_name::STATS)?.try_into()?,
        })
    }
}

impl<T: Borrow<MapData>> Maps<T> {
    pub fn params(&self) -> anyhow::Result<DecapParams> {
        self.params.get(&0, 0).context("reading the parameters")
    }

    /// The addresses of strict destination, IPv4 first, each family sorted.
    pub fn addresses(&self) -> anyhow::Result<Vec<IpAddr>> {
        let mut v4: Vec<IpAddr> = self
            .v4
            .keys()
            .map(|k| k.map(|a| IpAddr::from(a.to_ne_bytes())))
            .collect::<Result<_, _>>()
            .context("reading the IPv4 addresses")?;
        let mut v6: Vec<IpAddr> = self
            .v6
            .keys()
            .map(|k| k.map(|a| IpAddr::from(addr6_octets(a))))
            .collect::<Result<_, _>>()
            .context("reading the IPv6 addresses")?;
        v4.sort();
        v6.sort();
        v4.extend(v6);
        Ok(v4)
    }

    /// Every counter summed over CPUs, indexed like [`decap_counter`].
    pub fn counters(&self) -> anyhow::Result<Vec<u64>> {
        counters(&self.stats)
    }
}

impl<T: BorrowMut<MapData>> Maps<T> {
    /// Writes the parameters and makes the address maps hold exactly `wanted`, touching only
    /// the addresses that change.
    pub fn write(&mut self, params: &DecapParams, wanted: &[IpAddr]) -> anyhow::Result<Changed> {
        self.params
            .set(0, params, 0)
            .context("writing the decapsulator's parameters")?;
        let (removed, added) = addrs::plan(&self.addresses()?, wanted);
        // Removals first: the maps never need room for both sets.
        for ip in &removed {
            match ip {
                IpAddr::V4(a) => self.v4.remove(&u32::from_ne_bytes(a.octets())),
                IpAddr::V6(a) => self.v6.remove(&addr6(a.octets())),
            }
            .with_context(|| format!("removing {ip} from the decapsulator's addresses"))?;
        }
        for ip in &added {
            match ip {
                IpAddr::V4(a) => self.v4.insert(&u32::from_ne_bytes(a.octets()), &1, 0),
                IpAddr::V6(a) => self.v6.insert(&addr6(a.octets()), &1, 0),
            }
            .with_context(|| format!("adding {ip} to the decapsulator's addresses"))?;
        }
        info!(
            gue_port = u16::from_be(params.gue_port),
            flags = params.flags,
            removed = ?removed,
            added = ?added,
            "decapsulator parameters and addresses written"
        );
        Ok(Changed { removed, added })
    }
}

/// The counters of `stats` summed over CPUs, indexed like [`decap_counter`].
pub fn counters<T: Borrow<MapData>>(stats: &PerCpuArray<T, u64>) -> anyhow::Result<Vec<u64>> {
    (0..decap_counter::COUNT)
        .map(|i| {
            let per_cpu = stats
                .get(&i, 0)
                .with_context(|| format!("reading counter {i}"))?;
            Ok(per_cpu.iter().sum())
        })
        .collect()
}
