//! Taking the outer headers off: the link header (and its VLAN tag) is copied forward over
//! them, the frame then starts there (bpf_xdp_adjust_head), and its EtherType names the inner
//! packet's family. The MAC addresses stay those of the outer frame (the balancer's towards this
//! host), which is what the stack checks.

use core::ops::ControlFlow::{self, Break, Continue};

use aya_ebpf::{helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::decap_counter::DROP_MALFORMED;

use super::{ETH_HLEN, Verdict, drop};
use crate::ptr::{ptr_at_mut, read_at};

/// Removes the bytes between the link header (`l3` bytes) and the inner packet at `inner`,
/// whose IP version is `version`.
#[inline(always)]
pub fn strip(ctx: &XdpContext, l3: usize, inner: usize, version: u8) -> ControlFlow<Verdict> {
    // Two lengths of link header, each with its own constant size for the verifier.
    if l3 == ETH_HLEN {
        strip_after::<ETH_HLEN>(ctx, inner, version)
    } else {
        strip_after::<{ ETH_HLEN + 4 }>(ctx, inner, version)
    }
}

#[inline(always)]
fn strip_after<const L: usize>(
    ctx: &XdpContext,
    inner: usize,
    version: u8,
) -> ControlFlow<Verdict> {
    // Not reached, any of the failures below: the checks before made sure of what they need
    // (a link header, an inner IP header after the outer one). A frame left half-rewritten must
    // not go on, hence the drop.
    let broken = Break(drop(DROP_MALFORMED));
    let Some(link) = read_at::<[u8; L]>(ctx.data(), ctx.data_end(), 0) else {
        return broken;
    };
    let Some(outer) = inner.checked_sub(L) else {
        return broken;
    };
    // Kept aside on the stack: once the frame starts later, the bytes before it are out of
    // reach of packet pointers.
    // SAFETY: a helper call on this program's own context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, outer as i32) } != 0 {
        return broken;
    }
    let Some(p) = ptr_at_mut::<[u8; L]>(ctx.data(), ctx.data_end(), 0) else {
        return broken;
    };
    let mut link = link;
    let ether_type: u16 = if version == 4 { 0x0800 } else { 0x86dd };
    link[L - 2..].copy_from_slice(&ether_type.to_be_bytes());
    // SAFETY: bounds-checked, in the frame this program owns.
    unsafe { core::ptr::write_unaligned(p, link) };
    Continue(())
}
