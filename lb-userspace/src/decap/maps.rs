//! The decapsulator's maps: written through a loaded object (whose maps are the pinned ones),
//! read straight from their pins (`--stats` loads no program).

use std::{borrow::Borrow, net::IpAddr, path::Path};

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
};
use lb_common::{Addr6, DecapParams, addr6, addr6_octets, decap_counter, decap_map_name};
use tracing::info;

use super::addrs;
use crate::model::NamedCounter;

/// Addresses taken out of the maps and put in by a write.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changed {
    pub removed: Vec<IpAddr>,
    pub added: Vec<IpAddr>,
}

/// Writes the parameters and makes the address maps hold exactly `wanted`, touching only the
/// addresses that change.
pub fn write(ebpf: &mut Ebpf, params: &DecapParams, wanted: &[IpAddr]) -> anyhow::Result<Changed> {
    Array::<_, DecapParams>::try_from(map(ebpf, decap_map_name::PARAMS)?)?
        .set(0, params, 0)
        .context("writing the decapsulator's parameters")?;
    // Taken out of the object (two at once): the program holds its own references to them.
    let mut v4 = HashMap::<_, u32, u32>::try_from(take(ebpf, decap_map_name::ADDRS)?)?;
    let mut v6 = HashMap::<_, Addr6, u32>::try_from(take(ebpf, decap_map_name::ADDRS6)?)?;
    let current = addresses(&v4, &v6)?;
    let (removed, added) = addrs::plan(&current, wanted);
    // Removals first: the maps never need room for both sets.
    for ip in &removed {
        match ip {
            IpAddr::V4(a) => v4.remove(&u32::from_ne_bytes(a.octets())),
            IpAddr::V6(a) => v6.remove(&addr6(a.octets())),
        }
        .with_context(|| format!("removing {ip} from the decapsulator's addresses"))?;
    }
    for ip in &added {
        match ip {
            IpAddr::V4(a) => v4.insert(&u32::from_ne_bytes(a.octets()), &1, 0),
            IpAddr::V6(a) => v6.insert(&addr6(a.octets()), &1, 0),
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

/// The addresses in the maps, IPv4 first, each family sorted.
fn addresses<T: Borrow<MapData>>(
    v4: &HashMap<T, u32, u32>,
    v6: &HashMap<T, Addr6, u32>,
) -> anyhow::Result<Vec<IpAddr>> {
    let mut v4: Vec<IpAddr> = v4
        .keys()
        .map(|k| k.map(|a| IpAddr::from(a.to_ne_bytes())))
        .collect::<Result<_, _>>()
        .context("reading the IPv4 addresses")?;
    let mut v6: Vec<IpAddr> = v6
        .keys()
        .map(|k| k.map(|a| IpAddr::from(addr6_octets(a))))
        .collect::<Result<_, _>>()
        .context("reading the IPv6 addresses")?;
    v4.sort();
    v6.sort();
    v4.extend(v6);
    Ok(v4)
}

fn map<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("map {name} missing from the XDP object"))
}

fn take(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<Map> {
    ebpf.take_map(name)
        .with_context(|| format!("map {name} missing from the XDP object"))
}

/// The maps pinned in a directory, opened for reading.
pub struct Pinned {
    params: Array<MapData, DecapParams>,
    v4: HashMap<MapData, u32, u32>,
    v6: HashMap<MapData, Addr6, u32>,
    stats: PerCpuArray<MapData, u64>,
}

impl Pinned {
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
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

    pub fn params(&self) -> anyhow::Result<DecapParams> {
        self.params.get(&0, 0).context("reading the parameters")
    }

    /// The addresses of strict destination, IPv4 first, each family sorted.
    pub fn addresses(&self) -> anyhow::Result<Vec<IpAddr>> {
        addresses(&self.v4, &self.v6)
    }

    /// Every counter, summed over CPUs, in [`decap_counter::NAMES`] order.
    pub fn counters(&self) -> anyhow::Result<Vec<NamedCounter>> {
        (0..decap_counter::COUNT)
            .map(|i| {
                let per_cpu = self
                    .stats
                    .get(&i, 0)
                    .with_context(|| format!("reading counter {i}"))?;
                Ok(NamedCounter {
                    name: decap_counter::NAMES[i as usize].to_owned(),
                    value: per_cpu.iter().sum(),
                })
            })
            .collect()
    }
}
