//! What the datapath balances onto: services, their backends and the next hops towards them.

/// Ring slot value meaning "no backend".
pub const NO_BACKEND: u32 = u32::MAX;
/// Ring slots tried for a new flow whose slot's backend cannot take it (its flag was written
/// before the ring is rebuilt). With one of three backends out, all 16 miss with p = 2e-8.
pub const SELECT_TRIES: u32 = 16;

use crate::{Addr6, addr6};

/// Key of the service maps (one per family).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceKeyOf<A> {
    pub addr: A,
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}

pub type ServiceKey = ServiceKeyOf<u32>;
pub type ServiceKey6 = ServiceKeyOf<Addr6>;

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

impl ServiceKey6 {
    /// `addr` as its 16 octets, `port` in host byte order.
    pub const fn new(addr: [u8; 16], port: u16, proto: u8) -> Self {
        Self {
            addr: addr6(addr),
            port: port.to_be(),
            proto,
            _pad: 0,
        }
    }
}

/// Flag bits of [`ServiceInfo::flags`].
pub mod service_flags {
    /// Existing flows stay on a backend that became unavailable (`existing_flows = "keep"`).
    pub const KEEP_FLOWS: u32 = 1;
    /// No backend may take new flows and the policy says drop.
    pub const DROP: u32 = 2;
    /// No backend may take new flows and the policy says use them anyway (`use-all`, `first`):
    /// the ring holds unavailable backends on purpose, take its pick as it is.
    pub const USE_UNAVAILABLE: u32 = 4;
    /// New TCP connections are answered by lb's SYN proxy (SYN cookies) before any state is
    /// taken: the balancer hands every packet of such a service without a flow, and every
    /// packet of its proxied flows, to the proxy program (`syn_proxy = "on"`).
    pub const SYN_PROXY: u32 = 8;
}

/// Value of the service map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Index into the ring and per-service maps, `< max_services`.
    pub id: u32,
    pub flags: u32,
}

/// Flag bits of [`BackendInfo::flags`].
pub mod backend_flags {
    /// Health says available: takes new flows (unless drained) and keeps its flows.
    pub const UP: u32 = 1;
    /// Weight 0 / drained: no new flows, existing flows continue.
    pub const DRAINED: u32 = 2;
    /// Direct server return (the service's `forwarding`): the client's packet goes to the
    /// backend unchanged inside an outer IP header (`ipip`) ...
    pub const ENCAP_IPIP: u32 = 4;
    /// ... or an outer IP and UDP header (`gue`); see [`crate::encap`](crate::PROTO_IPIP).
    pub const ENCAP_GUE: u32 = 8;
    /// Either of the two: no NAT, no return path.
    pub const ENCAP: u32 = ENCAP_IPIP | ENCAP_GUE;
}

/// A backend of one service (a host:port used by two services is two backends), of the
/// service's family. Backend ids are one space for both families: an id indexes the per-backend
/// maps (counters, next hops) whichever family's backend map holds the backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendInfoOf<A> {
    pub addr: A,
    /// Source address of forwarded flows (its replies come back here); with direct server
    /// return, the outer source of the encapsulated packets.
    pub snat_addr: A,
    pub port: u16,
    /// "No data back" passive check of its service: a TCP connection whose client sent data and
    /// got none back for this long is a failure; in units of
    /// [`DATA_TICK_SHIFT`](crate::DATA_TICK_SHIFT) (2^20 ns, about a millisecond); 0: off.
    pub no_data_ticks: u16,
    pub flags: u32,
}

pub type BackendInfo = BackendInfoOf<u32>;
pub type BackendInfo6 = BackendInfoOf<Addr6>;

/// The next hop towards a backend, cached per CPU so packets need no route lookup: refreshed
/// from the kernel's tables (bpf_fib_lookup) when older than a second.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextHop {
    /// When it was looked up, coarse monotonic nanoseconds; 0 = never.
    pub updated: u64,
    pub ifindex: u32,
    /// The path's MTU towards the backend (the route's, or its interface's): the largest IP
    /// packet lb may send there, encapsulation included.
    pub mtu: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    /// The unfolded checksum sum of the backend's address and its SNAT address (the outer
    /// addresses of direct server return), computed with the lookup rather than per packet.
    pub addr_sum: u32,
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<ServiceKey>() == 8);
    assert!(size_of::<ServiceInfo>() == 8);
    assert!(size_of::<BackendInfo>() == 16);
    assert!(size_of::<ServiceKey6>() == 20);
    assert!(size_of::<BackendInfo6>() == 40);
    assert!(size_of::<NextHop>() == 32);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceInfo {}
    unsafe impl aya::Pod for super::BackendInfo {}
    unsafe impl aya::Pod for super::ServiceKey6 {}
    unsafe impl aya::Pod for super::BackendInfo6 {}
    unsafe impl aya::Pod for super::NextHop {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PROTO_TCP;

    #[test]
    fn service_key_is_in_network_order() {
        let k = ServiceKey::new([10, 0, 0, 1], 80, PROTO_TCP);
        assert_eq!(k.addr.to_ne_bytes(), [10, 0, 0, 1]);
        assert_eq!(k.port.to_ne_bytes(), [0, 80]);
    }
}
