//! The backend's decapsulator for direct server return (the logic of the `lb-decap` program; its
//! maps are that binary's): Ethernet (one optional 802.1Q tag) → outer IPv4 or IPv6 → IP in IP
//! (protocol 4 or 41, in either outer family) or GUE variant 1 (UDP to the GUE port, an IP packet
//! right after the UDP header; formats in `lb_common::encap`) → sent to one of this host's
//! addresses, or strict destination off → the outer headers stripped, the link header kept, the
//! inner packet passed to the stack. Everything else is passed untouched: traffic that is not
//! encapsulated costs one parse and a compare (the IP protocol; for UDP, the port too).
//!
//! Each step returns `Continue` with what it found, or `Break` with the packet's verdict; every
//! packet ends in exactly one verdict counter (`lb_common::decap_counter`).

mod ecn;
mod inner;
mod outer;
mod strip;

use core::ops::ControlFlow::{self, Break, Continue};

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use lb_common::{Addr6, DecapParams, decap_counter};

use crate::ptr::read_at;

/// What the program needs of its maps; the `lb-decap` binary implements it over them.
pub trait Host {
    /// The parameters `lb decap` wrote last.
    fn params(&self) -> DecapParams;
    /// Whether `addr` (network byte order) is one of this host's IPv4 addresses.
    fn is_local4(&self, addr: u32) -> bool;
    /// Whether `addr` is one of this host's IPv6 addresses.
    fn is_local6(&self, addr: &Addr6) -> bool;
    /// Counts one packet in the informational counter `counter`.
    fn count(&self, counter: u32);
}

/// An XDP action and the verdict counter of the packet.
pub type Verdict = (u32, u32);

/// Untouched, on to the stack.
#[inline(always)]
fn pass(counter: u32) -> Verdict {
    (xdp_action::XDP_PASS, counter)
}

#[inline(always)]
fn drop(counter: u32) -> Verdict {
    (xdp_action::XDP_DROP, counter)
}

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;

/// The frame's verdict; a decapsulated frame starts later (its outer headers are gone).
#[inline(always)]
pub fn handle<H: Host>(ctx: &XdpContext, host: &H) -> Verdict {
    match decapsulate(ctx, host) {
        Continue(counter) => pass(counter),
        Break(verdict) => verdict,
    }
}

#[inline(always)]
fn decapsulate<H: Host>(ctx: &XdpContext, host: &H) -> ControlFlow<Verdict, u32> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let (ether_type, l3) = link(data, data_end)?;
    let found = match ether_type {
        ETH_P_IP => outer::ipv4(data, data_end, l3, host)?,
        ETH_P_IPV6 => outer::ipv6(data, data_end, l3, host)?,
        _ => return Break(pass(decap_counter::PASS_NOT_ENCAP)),
    };
    let inner = inner::check(data, data_end, &found)?;
    ecn::propagate(data, data_end, found.ecn, &inner, host)?;
    strip::strip(ctx, l3, inner.off, inner.version)?;
    if l3 != ETH_HLEN {
        host.count(decap_counter::VLAN);
    }
    Continue(found.counter)
}

/// The EtherType past one optional 802.1Q tag, and where the IP header starts.
#[inline(always)]
fn link(data: usize, data_end: usize) -> ControlFlow<Verdict, (u16, usize)> {
    let Some(ether_type) = read_at::<[u8; 2]>(data, data_end, ETH_HLEN - 2) else {
        return Break(pass(decap_counter::PASS_MALFORMED));
    };
    let ether_type = u16::from_be_bytes(ether_type);
    if ether_type != ETH_P_8021Q {
        return Continue((ether_type, ETH_HLEN));
    }
    let l3 = ETH_HLEN + VLAN_HLEN;
    match read_at::<[u8; 2]>(data, data_end, l3 - 2) {
        Some(inner) => Continue((u16::from_be_bytes(inner), l3)),
        None => Break(pass(decap_counter::PASS_MALFORMED)),
    }
}
