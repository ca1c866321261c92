//! Reading the per-CPU counters and summing them.

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use lb_common::{TrafficStats, counter, map_name};
use serde::Serialize;

/// Datapath counters summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Indexed like [`lb_common::counter`]; named by [`counter::NAMES`].
    pub counters: Vec<u64>,
    /// Indexed by service id.
    pub services: Vec<TrafficCounters>,
    /// Indexed by backend id.
    pub backends: Vec<TrafficCounters>,
}

/// Client → backend traffic of a service or backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TrafficCounters {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    /// TCP flows past their handshake (lb_common's `TrafficStats::handshakes`).
    pub handshakes: u64,
}

impl Stats {
    pub fn counter(&self, index: u32) -> u64 {
        self.counters[index as usize]
    }
}

/// Reads the global counters and those of the first `services` / `backends` ids.
pub fn read(ebpf: &Ebpf, services: u32, backends: u32) -> anyhow::Result<Stats> {
    let stats: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map(map_name::STATS).context("stats map missing")?)?;
    let counters = (0..counter::COUNT)
        .map(|i| Ok(stats.get(&i, 0)?.iter().sum()))
        .collect::<anyhow::Result<_>>()?;
    Ok(Stats {
        counters,
        services: traffic(ebpf, map_name::SERVICE_STATS, services)?,
        backends: traffic(ebpf, map_name::BACKEND_STATS, backends)?,
    })
}

fn traffic(ebpf: &Ebpf, name: &str, n: u32) -> anyhow::Result<Vec<TrafficCounters>> {
    let map: PerCpuArray<&MapData, TrafficStats> = PerCpuArray::try_from(
        ebpf.map(name)
            .with_context(|| format!("map {name} missing"))?,
    )?;
    (0..n)
        .map(|i| {
            Ok(map
                .get(&i, 0)?
                .iter()
                .fold(TrafficCounters::default(), |a, v| TrafficCounters {
                    packets: a.packets + v.packets,
                    bytes: a.bytes + v.bytes,
                    new_flows: a.new_flows + v.new_flows,
                    handshakes: a.handshakes + v.handshakes,
                }))
        })
        .collect()
}
