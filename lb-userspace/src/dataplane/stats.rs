//! Reading the per-CPU counters and summing them.

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use lb_common::{MAX_SERVICES, ServiceStats, counter, map_name};
use serde::Serialize;

/// Datapath counters summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Indexed like [`lb_common::counter`]; named by [`counter::NAMES`].
    pub counters: Vec<u64>,
    /// Indexed by service id.
    pub services: Vec<ServiceCounters>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ServiceCounters {
    pub packets: u64,
    pub bytes: u64,
}

impl Stats {
    pub fn counter(&self, index: u32) -> u64 {
        self.counters[index as usize]
    }
}

/// Reads the global counters and those of the first `services` service ids.
pub fn read(ebpf: &Ebpf, services: u32) -> anyhow::Result<Stats> {
    let stats: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map(map_name::STATS).context("stats map missing")?)?;
    let counters = (0..counter::COUNT)
        .map(|i| Ok(stats.get(&i, 0)?.iter().sum()))
        .collect::<anyhow::Result<_>>()?;
    let per_service: PerCpuArray<&MapData, ServiceStats> = PerCpuArray::try_from(
        ebpf.map(map_name::SERVICE_STATS)
            .context("service stats map missing")?,
    )?;
    let services = (0..services.min(MAX_SERVICES))
        .map(|i| {
            let values = per_service.get(&i, 0)?;
            Ok(values
                .iter()
                .fold(ServiceCounters::default(), |acc, v| ServiceCounters {
                    packets: acc.packets + v.packets,
                    bytes: acc.bytes + v.bytes,
                }))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Stats { counters, services })
}
