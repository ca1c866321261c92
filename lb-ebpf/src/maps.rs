//! The program's maps. Names, key and value types come from lb-common; userspace sizes and fills
//! them.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use lb_common::{MAX_SERVICES, MAX_VIP_ADDRS, ServiceInfo, ServiceKey, ServiceStats, counter};

/// (VIP, port, protocol) → service. Written by userspace on start and on config changes.
#[map(name = "LB_SERVICES")]
pub static SERVICES: HashMap<ServiceKey, ServiceInfo> = HashMap::with_max_entries(MAX_SERVICES, 0);

/// VIP address → number of services on it; decides pass or drop for odd packets.
#[map(name = "LB_VIP_ADDRS")]
pub static VIP_ADDRS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_VIP_ADDRS, 0);

/// Packets by verdict reason, per CPU (no atomics on the hot path).
#[map(name = "LB_STATS")]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Packets and bytes per service id, per CPU.
#[map(name = "LB_SERVICE_STATS")]
pub static SERVICE_STATS: PerCpuArray<ServiceStats> =
    PerCpuArray::with_max_entries(MAX_SERVICES, 0);
