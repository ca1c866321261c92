//! The one definition of everything the XDP program and userspace share: map names and sizes,
//! map key/value layouts and counter indices. Both sides use these types; nothing is re-declared.
//!
//! Layout rules for map types: `#[repr(C)]`, explicit padding fields, only integers (no `bool`,
//! enum or `Option`), so that the bytes the kernel stores are fully defined on both sides.
#![no_std]

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// Names of the maps declared in lb-ebpf (`#[map(name = ...)]`), as userspace looks them up.
pub mod map_name {
    /// `HashMap<ServiceKey, ServiceInfo>`: the virtual services.
    pub const SERVICES: &str = "LB_SERVICES";
    /// `HashMap<u32, u32>`: every VIP address (network byte order) → number of services on it.
    /// Consulted only for fragments and malformed packets, to decide pass or drop.
    pub const VIP_ADDRS: &str = "LB_VIP_ADDRS";
    /// `PerCpuArray<u64>` indexed by [`crate::counter`]: packets by verdict reason.
    pub const STATS: &str = "LB_STATS";
    /// `PerCpuArray<ServiceStats>` indexed by [`crate::ServiceInfo::id`].
    pub const SERVICE_STATS: &str = "LB_SERVICE_STATS";
}

/// Name of the XDP program in the object file.
pub const PROGRAM_NAME: &str = "lb_xdp";
/// A program that only returns XDP_PASS: the baseline for benchmarks, and the peer program that
/// native XDP on veth needs to receive XDP_TX / redirected frames.
pub const PASS_PROGRAM_NAME: &str = "lb_pass";

/// Upper bound of service ids, and so the size of the per-service maps.
pub const MAX_SERVICES: u32 = 1024;
/// Upper bound of distinct VIP addresses.
pub const MAX_VIP_ADDRS: u32 = MAX_SERVICES;

/// Key of the service map. `addr` and `port` are in network byte order, exactly as read from the
/// packet, so the datapath compares without conversion.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    pub addr: u32,
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}

impl ServiceKey {
    /// `addr` as octets (a.b.c.d), `port` in host byte order.
    pub const fn new(addr: [u8; 4], port: u16, proto: u8) -> Self {
        Self {
            addr: u32::from_ne_bytes(addr),
            port: port.to_be(),
            proto,
            _pad: 0,
        }
    }
}

/// Value of the service map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Index into the per-service maps, `< MAX_SERVICES`.
    pub id: u32,
}

/// Per-service traffic, one slot per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub packets: u64,
    pub bytes: u64,
}

/// Indices into the `STATS` per-CPU array. Every packet increments exactly one verdict counter
/// (the ones below [`counter::VERDICTS`]); the informational counters after it are extra.
pub mod counter {
    /// Not IPv4 (ARP, IPv6, a second VLAN tag, ...): passed.
    pub const PASS_NOT_IPV4: u32 = 0;
    /// IPv4 not addressed to a service (other address, port or protocol): passed.
    pub const PASS_NOT_VIP: u32 = 1;
    /// Addressed to a service.
    pub const VIP_HIT: u32 = 2;
    /// Could not be parsed (truncated, bad version, IHL or lengths), not for a VIP address:
    /// passed, the kernel validates and drops it itself.
    pub const PASS_MALFORMED: u32 = 3;
    /// Could not be parsed and addressed to a VIP address: dropped.
    pub const DROP_MALFORMED: u32 = 4;
    /// An IPv4 fragment not for a VIP address: passed.
    pub const PASS_FRAGMENT: u32 = 5;
    /// An IPv4 fragment for a VIP address: dropped (fragments carry no ports to balance on).
    pub const DROP_FRAGMENT: u32 = 6;
    /// Number of verdict counters: each packet counts in exactly one of `0..VERDICTS`.
    pub const VERDICTS: u32 = 7;
    /// Informational: IPv4 header with options (IHL > 5); parsed past them, verdict as usual.
    pub const IP_OPTIONS: u32 = 7;
    /// Informational: frame with one 802.1Q tag; parsed past it, verdict as usual.
    pub const VLAN: u32 = 8;
    /// Size of the `STATS` array.
    pub const COUNT: u32 = 9;

    /// Stable names, indexed like the constants (used in status output and metrics).
    pub const NAMES: [&str; COUNT as usize] = [
        "pass_not_ipv4",
        "pass_not_vip",
        "vip_hit",
        "pass_malformed",
        "drop_malformed",
        "pass_fragment",
        "drop_fragment",
        "ip_options",
        "vlan",
    ];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are #[repr(C)] plain integers with explicit padding, valid for any bit pattern.
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceInfo {}
    unsafe impl aya::Pod for super::ServiceStats {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<ServiceKey>(), 8);
        assert_eq!(core::mem::size_of::<ServiceInfo>(), 4);
        assert_eq!(core::mem::size_of::<ServiceStats>(), 16);
    }

    #[test]
    fn service_key_is_in_network_order() {
        let k = ServiceKey::new([10, 0, 0, 1], 80, PROTO_TCP);
        assert_eq!(k.addr.to_ne_bytes(), [10, 0, 0, 1]);
        assert_eq!(k.port.to_ne_bytes(), [0, 80]);
    }
}
