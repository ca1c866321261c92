//! Health probes through the tunnel (`check.through_tunnel`): a probe of a direct-server-return
//! service's backend travels as the service's traffic does, encapsulated and addressed to the VIP
//! on the backend, so a backend whose decapsulation or VIP binding is broken fails its check.
//!
//! The probe's socket connects to the backend's own address (normal routing and neighbours) with
//! a mark of the [`TUNNEL_MARK`] range, whose low bits name a slot of the tunnel table
//! ([`map_name::TUNNEL_PROBES`](crate::map_name::TUNNEL_PROBES)). lb's TC egress program finds the
//! slot, rewrites the inner destination from the backend to the slot's VIP, adds the outer
//! header exactly as the XDP program does for traffic (the [`crate::encap`](crate::PROTO_IPIP)
//! formats; outer source = the probe's own source, outer destination = the backend) and records
//! the reply's key ([`map_name::PROBE_REPLIES`](crate::map_name::PROBE_REPLIES)). The backend
//! answers from the VIP, not encapsulated; lb's XDP program turns that reply's source back into
//! the backend's address, so the kernel hands it to the probe's socket.

use crate::Addr6;

/// The marks of through-tunnel probes: `TUNNEL_MARK | slot`, slot < [`TUNNEL_SLOTS`]. A range
/// of its own, so the TC program tells a probe from the host's traffic with one mask and
/// compare: bits 31-12 are "LB" and a nibble (0x4c42_0), bits 11-0 the slot. Chosen clear of
/// the marks common on hosts: kube-proxy's 0x4000 and 0x8000 and Tailscale's 0x40000/0x80000 are
/// never set together with this pattern, Cilium's and Istio's values are below 0x10000.
/// Firewall or routing rules of the host that match these bits apply to the probes too.
pub const TUNNEL_MARK: u32 = 0x4c42_0000;
/// The bits of a mark that say it is a through-tunnel probe's.
pub const TUNNEL_MARK_MASK: u32 = 0xffff_f000;
/// Slots of the tunnel table: distinct (backend, VIP, encapsulation) paths probed through the
/// tunnel at once.
pub const TUNNEL_SLOTS: u32 = 1 << 12;
/// Entries of the reply table per family (an LRU map: a probe's connection needs its entry for
/// the probe's length only).
pub const PROBE_REPLIES_SIZE: u32 = 1 << 14;

/// The slot of a probe's `mark`, if it is one of [`TUNNEL_MARK`]'s range.
#[inline(always)]
pub const fn tunnel_slot(mark: u32) -> Option<u32> {
    if mark & TUNNEL_MARK_MASK == TUNNEL_MARK {
        Some(mark & !TUNNEL_MARK_MASK)
    } else {
        None
    }
}

/// The mark of a probe through tunnel slot `slot` (< [`TUNNEL_SLOTS`]).
#[inline(always)]
pub const fn tunnel_mark(slot: u32) -> u32 {
    TUNNEL_MARK | (slot & !TUNNEL_MARK_MASK)
}

/// A slot of the tunnel table, one per family: probes marked with it that leave for `backend`
/// go to `vip` on that backend, encapsulated as `flags` say
/// ([`backend_flags::ENCAP_IPIP`](crate::backend_flags::ENCAP_IPIP) or `ENCAP_GUE`). A free slot
/// has flags 0: its probes are dropped, never sent unencapsulated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelProbeOf<A> {
    pub backend: A,
    pub vip: A,
    pub flags: u32,
}

pub type TunnelProbe = TunnelProbeOf<u32>;
pub type TunnelProbe6 = TunnelProbeOf<Addr6>;

/// The reply table's value, keyed by the reply's [`FlowKeyOf`](crate::FlowKeyOf) (VIP:port →
/// lb's address:port): the backend the reply's source becomes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeReplyOf<A> {
    pub backend: A,
}

pub type ProbeReply = ProbeReplyOf<u32>;
pub type ProbeReply6 = ProbeReplyOf<Addr6>;

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<TunnelProbe>() == 12);
    assert!(size_of::<TunnelProbe6>() == 36);
    assert!(size_of::<ProbeReply>() == 4);
    assert!(size_of::<ProbeReply6>() == 16);
    assert!(TUNNEL_SLOTS - 1 == !TUNNEL_MARK_MASK);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::TunnelProbe {}
    unsafe impl aya::Pod for super::TunnelProbe6 {}
    unsafe impl aya::Pod for super::ProbeReply {}
    unsafe impl aya::Pod for super::ProbeReply6 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_and_slots() {
        assert_eq!(tunnel_mark(0), 0x4c42_0000);
        assert_eq!(tunnel_mark(TUNNEL_SLOTS - 1), 0x4c42_0fff);
        for slot in [0, 1, 77, TUNNEL_SLOTS - 1] {
            assert_eq!(tunnel_slot(tunnel_mark(slot)), Some(slot));
        }
        for other in [
            0,
            1,
            0x4000,
            0x8000,
            0x4_0000,
            0x4c42_1000,
            0x4c43_0000,
            u32::MAX,
        ] {
            assert_eq!(tunnel_slot(other), None, "{other:#x}");
        }
    }
}
