//! A packet's verdict (the XDP action and the counter that counts it) and the way a rewritten
//! frame leaves: shared by the balancer's directions, the encapsulation and the ICMP handlers.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use lb_common::counter;

use crate::{
    family::Family,
    maps::{PROXY_PROGS, TX_PORTS},
};

/// (XDP action, verdict counter).
pub type Verdict = (u32, u32);

/// Sends the (rewritten) frame out of `ifindex`: XDP_TX when that is where it came in,
/// XDP_REDIRECT through the devmap otherwise.
#[inline(always)]
pub fn send_out(ctx: &XdpContext, ifindex: u32) -> Verdict {
    if ifindex == ctx.ingress_ifindex() as u32 {
        return (xdp_action::XDP_TX, counter::FWD_TX);
    }
    match TX_PORTS.redirect(ifindex, 0) {
        Ok(action) => (action, counter::FWD_REDIRECT),
        Err(_) => (xdp_action::XDP_DROP, counter::DROP_NO_ROUTE),
    }
}

/// Hands the packet to stage `stage` of family `F`'s SYN proxy (see synproxy.rs) by a tail call;
/// the verdict when the slot is empty (a moment while lb loads).
#[inline(always)]
pub fn to_proxy<F: Family>(ctx: &XdpContext, stage: u32) -> Verdict {
    // SAFETY: the program array holds XDP programs of this object.
    #[allow(clippy::let_unit_value)]
    let _ = unsafe { PROXY_PROGS.tail_call(ctx, F::PROXY_SLOT + stage) };
    (xdp_action::XDP_DROP, counter::DROP_SYN_PROXY_INVALID)
}
